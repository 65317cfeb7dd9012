//! The sink's progress as the database holds it (`tally_progress` and
//! `tally_final`, DESIGN §6.1): read once here for the usage API's
//! `/status.json` and for an explanation's `finality` (§6.2), so the two say the
//! same thing. Reads only.
//!
//! Invariant: a source partition's row is the lowest `final_through` and
//! watermark over the results partitions it reported to; `held_back_by`
//! (`status_api`) is computed from these rows alone.

use super::status_api::SourceProgress;

const PROGRESS: &str = "SELECT source_partition, min(final_through), min(watermark), \
     count(*), max(results_partitions)::BIGINT, \
     (extract(epoch FROM max(updated_at)) * 1000)::BIGINT \
     FROM tally_progress GROUP BY source_partition ORDER BY source_partition";

/// What the database holds of the sink's progress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub progress: Vec<SourceProgress>,
    /// `tally_final.final_through`: every window ending at or before it is final.
    pub final_through: Option<i64>,
    /// The input partition count the progress rows name (0: none yet).
    pub source_partitions: i64,
}

/// Reads the progress rows, `tally_final` and the input partition count.
pub async fn read(c: &tokio_postgres::Client) -> Result<Stored, tokio_postgres::Error> {
    let progress = c
        .query(PROGRESS, &[])
        .await?
        .iter()
        .map(|r| SourceProgress {
            source_partition: r.get(0),
            final_through: r.get(1),
            watermark: r.get(2),
            reported: r.get(3),
            results_partitions: r.get(4),
            updated_ms: r.get(5),
        })
        .collect();
    let final_through: Option<i64> = c
        .query_one("SELECT final_through FROM tally_final", &[])
        .await?
        .get(0);
    let sources: Option<i32> = c
        .query_one("SELECT max(source_partitions) FROM tally_progress", &[])
        .await?
        .get(0);
    Ok(Stored {
        progress,
        final_through,
        source_partitions: i64::from(sources.unwrap_or(0)),
    })
}
