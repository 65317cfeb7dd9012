//! Applying a batch of result records to PostgreSQL.
//!
//! Invariants:
//! - Partials are keyed `(tenant_id, window_end, source_partition)` and replaced only
//!   when `(generation, version)` is greater than the stored one — redelivery is a
//!   no-op and a stale or zombie write never overwrites newer data.
//! - A partial's line items (`tenant_cost_line_partial`) are written exactly when
//!   the partial is, with its `(generation, version)`; the line view reads only the
//!   lines of the partial's current version, so a line a newer version lacks drops
//!   out. A pane without lines (a tally before line items) gets one line of model `''`.
//! - Progress records raise `tally_progress` (`GREATEST`): redelivery and replays
//!   never move finality back.
//! - The rows, the rejected records (`sink_rejected`) and the `sink_offsets` they
//!   came from commit in one transaction, so the database is exactly-once even
//!   without the version rule, and every offset is either applied or rejected.
//! - A record PostgreSQL refuses (`data_error`) never stops the sink: the batch is
//!   applied again one record at a time under savepoints, and the refused records
//!   are rejected. Any other error (a lost connection, a missing table) stops it.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use super::panes::to_i64;
use super::SinkError;
use crate::engine::SinkRecord;
use crate::model::NextOffset;
use crate::model::Partition;

const UPSERT_PROGRESS: &str = "
INSERT INTO tally_progress AS t
    (source_partition, results_partition, final_through, watermark, source_partitions,
     results_partitions, generation)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (source_partition, results_partition) DO UPDATE SET
    final_through = GREATEST(t.final_through, EXCLUDED.final_through),
    watermark = GREATEST(t.watermark, EXCLUDED.watermark),
    source_partitions = EXCLUDED.source_partitions,
    results_partitions = EXCLUDED.results_partitions,
    generation = GREATEST(t.generation, EXCLUDED.generation),
    updated_at = now()";

const INSERT_ADJUSTMENT: &str = "
INSERT INTO tenant_cost_adjustment
    (request_id, tenant_id, window_start, window_end, cost_pico, prompt_tokens, completion_tokens, generation, source, model)
VALUES ($1, $2, $3, $4, $5::TEXT::NUMERIC, $6::TEXT::NUMERIC, $7::TEXT::NUMERIC, $8, $9, $10)
ON CONFLICT (request_id) DO UPDATE SET
    tenant_id = EXCLUDED.tenant_id, model = EXCLUDED.model, window_start = EXCLUDED.window_start,
    window_end = EXCLUDED.window_end, cost_pico = EXCLUDED.cost_pico,
    prompt_tokens = EXCLUDED.prompt_tokens, completion_tokens = EXCLUDED.completion_tokens,
    generation = EXCLUDED.generation, source = EXCLUDED.source, applied_at = now()
WHERE tenant_cost_adjustment.generation < EXCLUDED.generation";

const UPSERT_OFFSET: &str = "
INSERT INTO sink_offsets (topic, partition, next_offset) VALUES ($1, $2, $3)
ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset";

const INSERT_REJECTED: &str = "
INSERT INTO sink_rejected (topic, partition, record_offset, reason, payload)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (topic, partition, record_offset) DO NOTHING";

/// Outcome counts of one batch.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub rows_changed: u64,
    pub stale_ignored: u64,
    /// Records PostgreSQL refused (a data error only one record causes), moved to
    /// `sink_rejected` by the isolating retry.
    pub rejected: Vec<Rejected>,
}

/// A record read from the results topic, with where it came from.
pub struct Delivered {
    pub record: SinkRecord,
    pub results_partition: i32,
    pub offset: i64,
    /// The original bytes, kept for `sink_rejected` should PostgreSQL refuse it.
    pub payload: Vec<u8>,
}

/// A record the sink will not store, with why (`sink_rejected`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub partition: i32,
    pub offset: i64,
    pub reason: String,
    pub payload: Vec<u8>,
}

impl Rejected {
    /// The reason is kept short and free of NUL, whatever the record held.
    pub fn new(partition: i32, offset: i64, reason: &str, payload: Vec<u8>) -> Self {
        const MAX: usize = 1000;
        let mut end = reason.len().min(MAX);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let clipped = end < reason.len();
        let mut reason = reason[..end].replace('\0', "\\0");
        if clipped {
            reason.push('…');
        }
        Self {
            partition,
            offset,
            reason,
            payload,
        }
    }
}

/// One batch: the records to apply, the records rejected before applying, and the
/// next offset per `(topic, partition)`, all committed in one transaction.
pub struct Batch {
    pub topic: String,
    pub records: Vec<Delivered>,
    pub rejected: Vec<Rejected>,
    pub offsets: BTreeMap<(String, Partition), NextOffset>,
}

/// A PostgreSQL error that one record's data causes, so applying the batch again
/// without it succeeds: a data exception (class 22: a NUL byte, a number out of
/// range), an integrity violation (23), a cardinality violation (21: an upsert
/// touching one row twice) or a program limit (54: an index row too large).
pub(crate) fn data_error(e: &tokio_postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| matches!(&c.code()[..2], "21" | "22" | "23" | "54"))
}

struct Statements {
    panes: tokio_postgres::Statement,
    adjustment: tokio_postgres::Statement,
    progress: tokio_postgres::Statement,
}

/// Applies `batch` atomically. When PostgreSQL refuses a record's data, the batch
/// is applied again with each record under a savepoint, and the records it still
/// refuses are rejected (`Applied::rejected`) instead of stopping the sink.
pub async fn apply_batch(client: &mut Client, batch: &Batch) -> Result<Applied, SinkError> {
    match apply(client, batch, false).await {
        Err(SinkError::Postgres(e)) if data_error(&e) => {
            tracing::warn!(error = %e, records = batch.records.len(),
                "PostgreSQL refused a record of the batch; applying it again one record at a time");
            apply(client, batch, true).await
        }
        other => other,
    }
}

async fn apply(client: &mut Client, batch: &Batch, isolate: bool) -> Result<Applied, SinkError> {
    let mut tx = client.transaction().await?;
    let st = Statements {
        panes: tx.prepare(super::panes::UPSERT_PANES).await?,
        adjustment: tx.prepare(INSERT_ADJUSTMENT).await?,
        progress: tx.prepare(UPSERT_PROGRESS).await?,
    };
    let mut applied = Applied::default();
    if !isolate {
        // The panes in a few multi-row statements (`panes`: the effect and counts
        // of applying them one by one), then the other records one by one (they
        // touch other tables).
        let panes: Vec<_> = batch
            .records
            .iter()
            .filter_map(|d| match &d.record {
                SinkRecord::Window(r) => Some(r),
                _ => None,
            })
            .collect();
        let (changed, stale) = super::panes::apply(&tx, &st.panes, &panes).await?;
        applied.rows_changed += changed;
        applied.stale_ignored += stale;
        for d in &batch.records {
            if !matches!(d.record, SinkRecord::Window(_)) {
                applied.count(apply_one(&tx, &st, d).await?);
            }
        }
    }
    for d in batch.records.iter().filter(|_| isolate) {
        let sp = tx.savepoint("record").await?;
        match apply_one(&sp, &st, d).await {
            Ok(n) => {
                sp.commit().await?;
                applied.count(n);
            }
            Err(SinkError::Postgres(e)) if data_error(&e) => {
                sp.rollback().await?;
                let why = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_string());
                applied.rejected.push(Rejected::new(
                    d.results_partition,
                    d.offset,
                    &format!("PostgreSQL refused it: {why}"),
                    d.payload.clone(),
                ));
            }
            Err(e) => return Err(e),
        }
    }
    for r in batch.rejected.iter().chain(&applied.rejected) {
        tx.execute(
            INSERT_REJECTED,
            &[&batch.topic, &r.partition, &r.offset, &r.reason, &r.payload],
        )
        .await?;
    }
    for ((topic, p), next) in &batch.offsets {
        tx.execute(UPSERT_OFFSET, &[topic, &p.0, &next.0]).await?;
    }
    crate::failpoint::hit("sink_before_commit");
    tx.commit().await?;
    Ok(applied)
}

impl Applied {
    /// Counts a record's changed rows (`None`: a progress record, not counted).
    fn count(&mut self, changed: Option<u64>) {
        match changed {
            None => {}
            Some(0) => self.stale_ignored += 1,
            Some(n) => self.rows_changed += n,
        }
    }
}

/// Applies one record inside `tx`: the rows it changed (0: stale), `None` for a
/// progress record.
async fn apply_one(
    tx: &tokio_postgres::Transaction<'_>,
    st: &Statements,
    d: &Delivered,
) -> Result<Option<u64>, SinkError> {
    match &d.record {
        SinkRecord::Adjustment(a) => {
            let generation = to_i64(a.generation, "generation")?;
            let n = tx
                .execute(
                    &st.adjustment,
                    &[
                        &a.request_id,
                        &a.tenant_id,
                        &a.window_start,
                        &a.window_end,
                        &a.cost_pico.to_string(),
                        &a.prompt_tokens.to_string(),
                        &a.completion_tokens.to_string(),
                        &generation,
                        &a.source,
                        &a.model,
                    ],
                )
                .await?;
            if n > 0 {
                super::quantities::adjustment(tx, a, generation).await?;
            }
            Ok(Some(n))
        }
        SinkRecord::Window(r) => Ok(Some(super::panes::apply(tx, &st.panes, &[r]).await?.0)),
        SinkRecord::Progress(p) => {
            tx.execute(
                &st.progress,
                &[
                    &p.source_partition,
                    &d.results_partition,
                    &p.final_through,
                    &p.watermark,
                    &p.source_partitions,
                    &p.results_partitions,
                    &to_i64(p.generation, "generation")?,
                ],
            )
            .await?;
            Ok(None)
        }
    }
}

/// The next offset to read, per partition of `topic`, as the sink last applied it.
pub(crate) async fn applied_offsets(
    client: &Client,
    topic: &str,
) -> Result<BTreeMap<Partition, NextOffset>, SinkError> {
    let rows = client
        .query(
            "SELECT partition, next_offset FROM sink_offsets WHERE topic = $1",
            &[&topic],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                Partition(r.get::<_, i32>(0)),
                NextOffset(r.get::<_, i64>(1)),
            )
        })
        .collect())
}
