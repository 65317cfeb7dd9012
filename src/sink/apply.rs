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
//! - The rows and the `sink_offsets` they came from commit in one transaction, so
//!   the database is exactly-once even without the version rule.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use super::SinkError;
use crate::engine::{LineItem, SinkRecord};
use crate::model::Partition;
use crate::state::NextOffset;

const UPSERT_PARTIAL: &str = "
INSERT INTO tenant_cost_partial AS t
    (tenant_id, window_end, source_partition, window_start, cost_pico, requests,
     prompt_tokens, completion_tokens, version, generation, pane, pane_index)
VALUES ($1, $2, $3, $4, $5::TEXT::NUMERIC, $6, $7::TEXT::NUMERIC, $8::TEXT::NUMERIC, $9, $10, $11, $12)
ON CONFLICT (tenant_id, window_end, source_partition) DO UPDATE SET
    window_start = EXCLUDED.window_start, cost_pico = EXCLUDED.cost_pico,
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens, version = EXCLUDED.version,
    generation = EXCLUDED.generation, pane = EXCLUDED.pane, pane_index = EXCLUDED.pane_index,
    updated_at = now()
WHERE (t.generation, t.version) < (EXCLUDED.generation, EXCLUDED.version)";

const UPSERT_LINES: &str = "
INSERT INTO tenant_cost_line_partial AS t
    (tenant_id, window_end, source_partition, model, window_start, cost_pico, requests,
     prompt_tokens, completion_tokens, version, generation)
SELECT $1, $2, $3, l.model, $4, l.cost::NUMERIC, l.requests, l.prompt::NUMERIC, l.completion::NUMERIC, $5, $6
FROM unnest($7::TEXT[], $8::TEXT[], $9::INT8[], $10::TEXT[], $11::TEXT[])
     AS l(model, cost, requests, prompt, completion)
ON CONFLICT (tenant_id, window_end, source_partition, model) DO UPDATE SET
    window_start = EXCLUDED.window_start, cost_pico = EXCLUDED.cost_pico,
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens, version = EXCLUDED.version,
    generation = EXCLUDED.generation
WHERE (t.generation, t.version) < (EXCLUDED.generation, EXCLUDED.version)";

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

fn to_i64(v: u64, what: &str) -> Result<i64, SinkError> {
    i64::try_from(v).map_err(|_| SinkError::Other(format!("{what} {v} does not fit in BIGINT")))
}

/// Outcome counts of one batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub rows_changed: u64,
    pub stale_ignored: u64,
}

/// A record read from the results topic, with the partition it came from.
pub struct Delivered {
    pub record: SinkRecord,
    pub results_partition: i32,
}

/// Applies `records` and records `offsets` (topic and partition → the next offset to
/// read there) atomically.
pub async fn apply_batch(
    client: &mut Client,
    records: &[Delivered],
    offsets: &BTreeMap<(String, Partition), NextOffset>,
) -> Result<Applied, SinkError> {
    let tx = client.transaction().await?;
    let upsert = tx.prepare(UPSERT_PARTIAL).await?;
    let upsert_lines = tx.prepare(UPSERT_LINES).await?;
    let insert_adj = tx.prepare(INSERT_ADJUSTMENT).await?;
    let mut applied = Applied::default();
    let windows = records.iter().filter_map(|r| match &r.record {
        SinkRecord::Window(w) => Some(w),
        _ => None,
    });
    for a in records.iter().filter_map(|r| match &r.record {
        SinkRecord::Adjustment(a) => Some(a),
        _ => None,
    }) {
        let n = tx
            .execute(
                &insert_adj,
                &[
                    &a.request_id,
                    &a.tenant_id,
                    &a.window_start,
                    &a.window_end,
                    &a.cost_pico.to_string(),
                    &a.prompt_tokens.to_string(),
                    &a.completion_tokens.to_string(),
                    &to_i64(a.generation, "generation")?,
                    &a.source,
                    &a.model,
                ],
            )
            .await?;
        if n == 0 {
            applied.stale_ignored += 1;
        } else {
            applied.rows_changed += n;
        }
    }
    for r in windows {
        let pane = match r.pane {
            crate::engine::PaneKind::OnTime => "on_time",
            crate::engine::PaneKind::Late => "late",
        };
        let n = tx
            .execute(
                &upsert,
                &[
                    &r.tenant_id,
                    &r.window_end,
                    &r.source_partition,
                    &r.window_start,
                    &r.cost_pico.to_string(),
                    &to_i64(r.requests, "requests")?,
                    &r.prompt_tokens.to_string(),
                    &r.completion_tokens.to_string(),
                    &to_i64(r.version, "version")?,
                    &to_i64(r.generation, "generation")?,
                    &pane,
                    &(r.pane_index as i32),
                ],
            )
            .await?;
        if n == 0 {
            applied.stale_ignored += 1;
            continue;
        }
        applied.rows_changed += n;
        let fallback;
        let lines = if r.lines.is_empty() {
            fallback = [LineItem {
                model: "".into(),
                requests: r.requests,
                prompt_tokens: r.prompt_tokens,
                completion_tokens: r.completion_tokens,
                cost_pico: r.cost_pico,
            }];
            &fallback[..]
        } else {
            &r.lines[..]
        };
        let models: Vec<&str> = lines.iter().map(|l| &*l.model).collect();
        let costs: Vec<String> = lines.iter().map(|l| l.cost_pico.to_string()).collect();
        let requests = lines
            .iter()
            .map(|l| to_i64(l.requests, "requests"))
            .collect::<Result<Vec<i64>, _>>()?;
        let prompt: Vec<String> = lines.iter().map(|l| l.prompt_tokens.to_string()).collect();
        let completion: Vec<String> = lines
            .iter()
            .map(|l| l.completion_tokens.to_string())
            .collect();
        tx.execute(
            &upsert_lines,
            &[
                &r.tenant_id,
                &r.window_end,
                &r.source_partition,
                &r.window_start,
                &to_i64(r.version, "version")?,
                &to_i64(r.generation, "generation")?,
                &models,
                &costs,
                &requests,
                &prompt,
                &completion,
            ],
        )
        .await?;
    }
    for (p, results_partition) in records.iter().filter_map(|r| match &r.record {
        SinkRecord::Progress(p) => Some((p, r.results_partition)),
        _ => None,
    }) {
        tx.execute(
            UPSERT_PROGRESS,
            &[
                &p.source_partition,
                &results_partition,
                &p.final_through,
                &p.watermark,
                &p.source_partitions,
                &p.results_partitions,
                &to_i64(p.generation, "generation")?,
            ],
        )
        .await?;
    }
    for ((topic, p), next) in offsets {
        tx.execute(UPSERT_OFFSET, &[topic, &p.0, &next.0]).await?;
    }
    crate::failpoint::hit("sink_before_commit");
    tx.commit().await?;
    Ok(applied)
}

/// The next offset to read, per partition of `topic`, as the sink last applied it.
pub async fn applied_offsets(
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
