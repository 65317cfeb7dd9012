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

use super::SinkError;
use crate::engine::{LineItem, SinkRecord};
use crate::model::NextOffset;
use crate::model::Partition;
use crate::model::Pico;

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

const INSERT_REJECTED: &str = "
INSERT INTO sink_rejected (topic, partition, record_offset, reason, payload)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (topic, partition, record_offset) DO NOTHING";

fn to_i64(v: u64, what: &str) -> Result<i64, SinkError> {
    i64::try_from(v).map_err(|_| SinkError::Other(format!("{what} {v} does not fit in BIGINT")))
}

/// The lines as `tenant_cost_line_partial` keys them, one per model: a rating's
/// lines of one model (its variants and plans, adjacent since lines are sorted)
/// summed; their quantities go to `tenant_cost_quantity_partial` (`quantities`). No
/// sum can overflow: each is at most the pane's total.
fn per_model(lines: &[LineItem]) -> Vec<LineItem> {
    let mut out: Vec<LineItem> = Vec::with_capacity(lines.len());
    for l in lines {
        match out.last_mut() {
            Some(m) if m.model == l.model => {
                m.requests = m.requests.saturating_add(l.requests);
                m.prompt_tokens = m.prompt_tokens.saturating_add(l.prompt_tokens);
                m.completion_tokens = m.completion_tokens.saturating_add(l.completion_tokens);
                m.cost_pico = Pico(m.cost_pico.0.saturating_add(l.cost_pico.0));
            }
            _ => out.push(LineItem {
                model: l.model.clone(),
                requests: l.requests,
                prompt_tokens: l.prompt_tokens,
                completion_tokens: l.completion_tokens,
                cost_pico: l.cost_pico,
                ..LineItem::default()
            }),
        }
    }
    out
}

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
    partial: tokio_postgres::Statement,
    lines: tokio_postgres::Statement,
    quantities: tokio_postgres::Statement,
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
        partial: tx.prepare(UPSERT_PARTIAL).await?,
        lines: tx.prepare(UPSERT_LINES).await?,
        quantities: tx.prepare(super::quantities::UPSERT_QUANTITIES).await?,
        adjustment: tx.prepare(INSERT_ADJUSTMENT).await?,
        progress: tx.prepare(UPSERT_PROGRESS).await?,
    };
    let mut applied = Applied::default();
    for d in &batch.records {
        if !isolate {
            apply_one(&tx, &st, d, &mut applied).await?;
            continue;
        }
        let sp = tx.savepoint("record").await?;
        let mut counts = Applied::default();
        match apply_one(&sp, &st, d, &mut counts).await {
            Ok(()) => {
                sp.commit().await?;
                applied.rows_changed += counts.rows_changed;
                applied.stale_ignored += counts.stale_ignored;
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

/// Applies one record inside `tx`, adding to `applied`'s counts.
async fn apply_one(
    tx: &tokio_postgres::Transaction<'_>,
    st: &Statements,
    d: &Delivered,
    applied: &mut Applied,
) -> Result<(), SinkError> {
    let n = match &d.record {
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
            n
        }
        SinkRecord::Window(r) => window(tx, st, r).await?,
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
            return Ok(());
        }
    };
    if n == 0 {
        applied.stale_ignored += 1;
    } else {
        applied.rows_changed += n;
    }
    Ok(())
}

/// Upserts a pane and, when it replaced the stored one, its lines. Returns the rows
/// the partial changed (0: stale).
async fn window(
    tx: &tokio_postgres::Transaction<'_>,
    st: &Statements,
    r: &crate::engine::ResultRecord,
) -> Result<u64, SinkError> {
    let pane = match r.pane {
        crate::engine::PaneKind::OnTime => "on_time",
        crate::engine::PaneKind::Late => "late",
    };
    let pane_index = i32::try_from(r.pane_index).map_err(|_| {
        SinkError::Other(format!(
            "pane_index {} does not fit in INTEGER",
            r.pane_index
        ))
    })?;
    let n = tx
        .execute(
            &st.partial,
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
                &pane_index,
            ],
        )
        .await?;
    if n == 0 {
        return Ok(0);
    }
    let lines = if r.lines.is_empty() {
        vec![LineItem {
            model: "".into(),
            requests: r.requests,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cost_pico: r.cost_pico,
            ..LineItem::default()
        }]
    } else {
        per_model(&r.lines)
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
        &st.lines,
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
    let version = (
        to_i64(r.version, "version")?,
        to_i64(r.generation, "generation")?,
    );
    super::quantities::window(tx, &st.quantities, r, version).await?;
    Ok(n)
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

#[cfg(test)]
mod per_model_tests {
    use super::*;

    #[test]
    fn a_models_lines_of_several_plans_become_one_line() {
        let line = |model: &str, plan: Option<&str>, n: u64| LineItem {
            model: model.into(),
            plan: plan.map(Into::into),
            requests: n,
            prompt_tokens: 10 * n,
            completion_tokens: n,
            cost_pico: Pico(u128::from(100 * n)),
            ..LineItem::default()
        };
        let merged = per_model(&[
            line("a", None, 1),
            line("a", Some("p"), 2),
            line("b", None, 4),
        ]);
        let got: Vec<_> = merged
            .iter()
            .map(|l| (&*l.model, l.requests, l.prompt_tokens, l.cost_pico.0))
            .collect();
        assert_eq!(got, [("a", 3, 30, 300), ("b", 4, 40, 400)]);
    }
}
