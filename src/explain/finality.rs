//! An explanation's `finality`: whether the windows asked are final as the
//! sink's database holds it (`tally_progress`, `tally_final`; DESIGN §6.1), per
//! input partition its stored watermark and progress and whether it holds the
//! windows back, and the lateness still to run — the usage API's `/status.json`
//! figures (`service::stored_progress`, `status_api::held_back_by`), applied to
//! one window end.
//!
//! Pure. Invariants: `is_final` is `tally_final.final_through >= window_end`;
//! `held_back_by` is `None` exactly when final, and otherwise names a partition
//! with `holds_back` (the one `/status.json` names). The records a partition
//! holds (its lead rule) and its idleness are not in the database: they are on
//! the workers' `/status.json` (`tally explain --finality --from`).

use serde::{Deserialize, Serialize};

use crate::service::status_api::held_back_by;
use crate::service::stored_progress::Stored;

/// Where the figures come from, and what they leave out (in every answer).
pub const SOURCE: &str = "the sink's tally_progress, a batch behind the workers; the records \
a partition holds (lead rule) and its idleness are on the workers' /status.json \
(`tally explain --finality --from`)";

/// One input partition's stored progress, against the window end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionProgress {
    pub partition: i32,
    /// The lowest stored watermark over the results partitions it reported to
    /// (`None`: no progress stored yet).
    pub watermark: Option<i64>,
    /// The lowest stored `final_through` (every window ending at or before it
    /// is purged there).
    pub final_through: Option<i64>,
    /// Results partitions it reported to, of `results_partitions`.
    pub reported: i64,
    pub results_partitions: i64,
    /// Whether it keeps the window from being final (not past its end, or not
    /// reported to every results partition).
    pub holds_back: bool,
    /// The event time its watermark must still advance by:
    /// `window_end − 1 + allowed_lateness − watermark` (0 when past; `None`: no
    /// watermark stored).
    pub lateness_to_run_ms: Option<i64>,
}

/// The windows' finality as the database holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFinality {
    /// Whether only a `reprocess-late` adjustment can still change the windows.
    pub is_final: bool,
    /// `tally_final.final_through`.
    pub final_through: Option<i64>,
    /// The watermark each partition needs: `window_end − 1 + allowed_lateness`.
    pub needs_watermark: i64,
    pub allowed_lateness_ms: i64,
    /// The partition holding the windows back (`/status.json`'s `held_back_by`);
    /// `None` when final.
    pub held_back_by: Option<i32>,
    /// The most any partition's watermark must still advance (0 when final;
    /// `None`: a partition has stored no watermark yet).
    pub lateness_to_run_ms: Option<i64>,
    pub partitions: Vec<PartitionProgress>,
    /// `SOURCE`.
    pub source: String,
}

/// The finality of the windows ending at `window_end` from `stored`.
pub fn stored_finality(
    stored: &Stored,
    window_end: i64,
    allowed_lateness_ms: i64,
) -> StoredFinality {
    let needs = window_end
        .saturating_sub(1)
        .saturating_add(allowed_lateness_ms);
    let is_final = stored.final_through.is_some_and(|f| f >= window_end);
    let known = stored.source_partitions.clamp(0, i64::from(i32::MAX)) as i32;
    let named = stored.progress.iter().map(|p| p.source_partition);
    let last = named.max().map_or(known, |m| known.max(m + 1));
    let partitions: Vec<PartitionProgress> = (0..last)
        .map(
            |n| match stored.progress.iter().find(|p| p.source_partition == n) {
                None => PartitionProgress {
                    partition: n,
                    watermark: None,
                    final_through: None,
                    reported: 0,
                    results_partitions: 0,
                    holds_back: true,
                    lateness_to_run_ms: None,
                },
                Some(p) => {
                    let passed =
                        p.reported >= p.results_partitions && p.final_through >= window_end;
                    PartitionProgress {
                        partition: n,
                        watermark: Some(p.watermark),
                        final_through: Some(p.final_through),
                        reported: p.reported,
                        results_partitions: p.results_partitions,
                        holds_back: !passed,
                        lateness_to_run_ms: Some(if passed {
                            0
                        } else {
                            needs.saturating_sub(p.watermark).max(0)
                        }),
                    }
                }
            },
        )
        .collect();
    let lateness_to_run_ms = if is_final {
        Some(0)
    } else {
        partitions
            .iter()
            .map(|p| p.lateness_to_run_ms)
            .try_fold(0, |m, l| l.map(|l| m.max(l)))
    };
    StoredFinality {
        is_final,
        final_through: stored.final_through,
        needs_watermark: needs,
        allowed_lateness_ms,
        held_back_by: (!is_final)
            .then(|| held_back_by(stored.source_partitions, &stored.progress))
            .flatten(),
        lateness_to_run_ms,
        partitions,
        source: SOURCE.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::status_api::SourceProgress;

    fn stored(rows: &[(i32, i64, i64)], final_through: Option<i64>) -> Stored {
        Stored {
            progress: rows
                .iter()
                .map(|&(p, f, reported)| SourceProgress {
                    source_partition: p,
                    final_through: f,
                    watermark: f + 5_000,
                    reported,
                    results_partitions: 2,
                    updated_ms: 0,
                })
                .collect(),
            final_through,
            source_partitions: 3,
        }
    }

    #[test]
    fn a_final_window_names_no_partition_and_a_later_one_names_the_lowest() {
        let s = stored(
            &[(0, 180_000, 2), (1, 120_000, 2), (2, 240_000, 2)],
            Some(120_000),
        );
        let f = stored_finality(&s, 120_000, 0);
        assert!(f.is_final);
        assert_eq!((f.held_back_by, f.lateness_to_run_ms), (None, Some(0)));
        assert!(f.partitions.iter().all(|p| !p.holds_back));
        let f = stored_finality(&s, 180_000, 10_000);
        assert!(!f.is_final);
        assert_eq!(f.held_back_by, Some(1));
        // Partition 1's watermark is 125 000; it needs 189 999.
        assert_eq!(f.lateness_to_run_ms, Some(64_999));
        let holding: Vec<i32> = f
            .partitions
            .iter()
            .filter(|p| p.holds_back)
            .map(|p| p.partition)
            .collect();
        assert_eq!(holding, [1]);
        assert_eq!(f.held_back_by, held_back_by(3, &s.progress));
    }

    #[test]
    fn a_partition_without_progress_holds_every_window_back() {
        let s = stored(&[(0, 180_000, 2), (2, 240_000, 1)], None);
        let f = stored_finality(&s, 60_000, 0);
        assert!(!f.is_final);
        assert_eq!(f.held_back_by, Some(1));
        assert_eq!(f.lateness_to_run_ms, None);
        let p = &f.partitions[1];
        assert!(p.holds_back && p.watermark.is_none());
        // Reported to one results partition of two: held back though past.
        assert!(f.partitions[2].holds_back);
    }
}
