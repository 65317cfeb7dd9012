//! A batch's window results (panes) applied as multi-row statements: a partial,
//! its lines and its quantity rows per pane, a statement for many panes.
//!
//! Invariants:
//! - The effect and the counts are exactly those of applying the panes one by one
//!   in batch order: the panes are split into rounds, round k holding each key's
//!   k-th pane of the batch, and the rounds run in order. No statement then touches
//!   a row twice (which PostgreSQL refuses), and a key's panes apply in their order.
//! - The version rule of `apply`: a partial is replaced only by a greater
//!   `(generation, version)`, and a pane's lines and quantity rows are written only
//!   when its partial was (the rows `p` returns), with its `(generation, version)`.
//! - A pane without lines (a tally before line items) gets one line of model `''`;
//!   a pane's lines of one model (its variants and plans) are one line (`per_model`).

use std::collections::HashMap;

use tokio_postgres::{Statement, Transaction};

use super::SinkError;
use crate::engine::{LineItem, PaneKind, ResultRecord};
use crate::model::Pico;

/// Panes `$1`–`$12` (a partial per element), their lines `$13`–`$23` and their
/// quantity rows `$24`–`$35`; answers the partials replaced.
pub(super) const UPSERT_PANES: &str = "
WITH p AS (
INSERT INTO tenant_cost_partial AS t
    (tenant_id, window_end, source_partition, window_start, cost_pico, requests,
     prompt_tokens, completion_tokens, version, generation, pane, pane_index)
SELECT * FROM unnest($1::TEXT[], $2::INT8[], $3::INT4[], $4::INT8[], $5::TEXT[]::NUMERIC[],
    $6::INT8[], $7::TEXT[]::NUMERIC[], $8::TEXT[]::NUMERIC[], $9::INT8[], $10::INT8[],
    $11::TEXT[], $12::INT4[])
ON CONFLICT (tenant_id, window_end, source_partition) DO UPDATE SET
    window_start = EXCLUDED.window_start, cost_pico = EXCLUDED.cost_pico,
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens, version = EXCLUDED.version,
    generation = EXCLUDED.generation, pane = EXCLUDED.pane, pane_index = EXCLUDED.pane_index,
    updated_at = now()
WHERE (t.generation, t.version) < (EXCLUDED.generation, EXCLUDED.version)
RETURNING t.tenant_id, t.window_end, t.source_partition
), l AS (
INSERT INTO tenant_cost_line_partial AS t
    (tenant_id, window_end, source_partition, model, window_start, cost_pico, requests,
     prompt_tokens, completion_tokens, version, generation)
SELECT l.tenant_id, l.window_end, l.source_partition, l.model, l.window_start,
       l.cost::NUMERIC, l.requests, l.prompt::NUMERIC, l.completion::NUMERIC, l.version,
       l.generation
FROM unnest($13::TEXT[], $14::INT8[], $15::INT4[], $16::TEXT[], $17::INT8[], $18::TEXT[],
    $19::INT8[], $20::TEXT[], $21::TEXT[], $22::INT8[], $23::INT8[])
     AS l(tenant_id, window_end, source_partition, model, window_start, cost, requests,
          prompt, completion, version, generation)
JOIN p USING (tenant_id, window_end, source_partition)
ON CONFLICT (tenant_id, window_end, source_partition, model) DO UPDATE SET
    window_start = EXCLUDED.window_start, cost_pico = EXCLUDED.cost_pico,
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens, version = EXCLUDED.version,
    generation = EXCLUDED.generation
WHERE (t.generation, t.version) < (EXCLUDED.generation, EXCLUDED.version)
), q AS (
INSERT INTO tenant_cost_quantity_partial AS t
    (tenant_id, window_end, source_partition, model, variant, plan, quantity, window_start,
     count, cost_pico, version, generation)
SELECT q.tenant_id, q.window_end, q.source_partition, q.model, q.variant, q.plan,
       q.quantity, q.window_start, q.count::NUMERIC, q.cost::NUMERIC, q.version, q.generation
FROM unnest($24::TEXT[], $25::INT8[], $26::INT4[], $27::TEXT[], $28::TEXT[], $29::TEXT[],
    $30::TEXT[], $31::INT8[], $32::TEXT[], $33::TEXT[], $34::INT8[], $35::INT8[])
     AS q(tenant_id, window_end, source_partition, model, variant, plan, quantity,
          window_start, count, cost, version, generation)
JOIN p USING (tenant_id, window_end, source_partition)
ON CONFLICT (tenant_id, window_end, source_partition, model, variant, plan, quantity)
DO UPDATE SET
    window_start = EXCLUDED.window_start, count = EXCLUDED.count,
    cost_pico = EXCLUDED.cost_pico, version = EXCLUDED.version,
    generation = EXCLUDED.generation
WHERE (t.generation, t.version) < (EXCLUDED.generation, EXCLUDED.version)
)
SELECT count(*) FROM p";

pub(super) fn to_i64(v: u64, what: &str) -> Result<i64, SinkError> {
    i64::try_from(v).map_err(|_| SinkError::Other(format!("{what} {v} does not fit in BIGINT")))
}

/// The lines as `tenant_cost_line_partial` keys them, one per model: a rating's
/// lines of one model (its variants and plans, adjacent since lines are sorted)
/// summed; their quantities go to `tenant_cost_quantity_partial` (`quantities`). No
/// sum can overflow: each is at most the pane's total.
pub(super) fn per_model(lines: &[LineItem]) -> Vec<LineItem> {
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

/// The key and version columns every row of a pane repeats.
#[derive(Default)]
struct Keys {
    tenant: Vec<String>,
    end: Vec<i64>,
    source: Vec<i32>,
    start: Vec<i64>,
    version: Vec<i64>,
    generation: Vec<i64>,
}

impl Keys {
    fn push(&mut self, r: &ResultRecord, (version, generation): (i64, i64)) {
        self.tenant.push(r.tenant_id.clone());
        self.end.push(r.window_end);
        self.source.push(r.source_partition);
        self.start.push(r.window_start);
        self.version.push(version);
        self.generation.push(generation);
    }
}

/// The columns of one statement: partials, lines, quantity rows.
#[derive(Default)]
struct Columns {
    p: Keys,
    p_cost: Vec<String>,
    p_requests: Vec<i64>,
    p_prompt: Vec<String>,
    p_completion: Vec<String>,
    p_pane: Vec<&'static str>,
    p_index: Vec<i32>,
    l: Keys,
    l_model: Vec<String>,
    l_cost: Vec<String>,
    l_requests: Vec<i64>,
    l_prompt: Vec<String>,
    l_completion: Vec<String>,
    q: Keys,
    q_model: Vec<String>,
    q_variant: Vec<String>,
    q_plan: Vec<String>,
    q_quantity: Vec<String>,
    q_count: Vec<String>,
    q_cost: Vec<String>,
}

impl Columns {
    fn push(&mut self, r: &ResultRecord) -> Result<(), SinkError> {
        let v = (
            to_i64(r.version, "version")?,
            to_i64(r.generation, "generation")?,
        );
        self.p.push(r, v);
        self.p_cost.push(r.cost_pico.to_string());
        self.p_requests.push(to_i64(r.requests, "requests")?);
        self.p_prompt.push(r.prompt_tokens.to_string());
        self.p_completion.push(r.completion_tokens.to_string());
        self.p_pane.push(match r.pane {
            PaneKind::OnTime => "on_time",
            PaneKind::Late => "late",
        });
        self.p_index.push(i32::try_from(r.pane_index).map_err(|_| {
            SinkError::Other(format!(
                "pane_index {} does not fit in INTEGER",
                r.pane_index
            ))
        })?);
        for l in pane_lines(r) {
            self.l.push(r, v);
            self.l_model.push(l.model.to_string());
            self.l_cost.push(l.cost_pico.to_string());
            self.l_requests.push(to_i64(l.requests, "requests")?);
            self.l_prompt.push(l.prompt_tokens.to_string());
            self.l_completion.push(l.completion_tokens.to_string());
        }
        let q = super::quantities::pane_rows(r);
        for i in 0..q.model.len() {
            self.q.push(r, v);
            self.q_model.push(q.model[i].to_string());
            self.q_variant.push(q.variant[i].to_string());
            self.q_plan.push(q.plan[i].to_string());
            self.q_quantity.push(q.quantity[i].to_string());
            self.q_count.push(q.count[i].clone());
            self.q_cost.push(q.cost[i].clone());
        }
        Ok(())
    }

    /// `UPSERT_PANES` of these columns: the partials replaced.
    async fn upsert(&self, tx: &Transaction<'_>, st: &Statement) -> Result<u64, SinkError> {
        let (p, l, q) = (&self.p, &self.l, &self.q);
        let row = tx
            .query_one(
                st,
                &[
                    &p.tenant,
                    &p.end,
                    &p.source,
                    &p.start,
                    &self.p_cost,
                    &self.p_requests,
                    &self.p_prompt,
                    &self.p_completion,
                    &p.version,
                    &p.generation,
                    &self.p_pane,
                    &self.p_index,
                    &l.tenant,
                    &l.end,
                    &l.source,
                    &self.l_model,
                    &l.start,
                    &self.l_cost,
                    &self.l_requests,
                    &self.l_prompt,
                    &self.l_completion,
                    &l.version,
                    &l.generation,
                    &q.tenant,
                    &q.end,
                    &q.source,
                    &self.q_model,
                    &self.q_variant,
                    &self.q_plan,
                    &self.q_quantity,
                    &q.start,
                    &self.q_count,
                    &self.q_cost,
                    &q.version,
                    &q.generation,
                ],
            )
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }
}

/// The lines of a pane as `tenant_cost_line_partial` keys them: one per model, or
/// for a pane without lines one line of model `''`.
fn pane_lines(r: &ResultRecord) -> Vec<LineItem> {
    if r.lines.is_empty() {
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
    }
}

/// The panes in rounds: round k holds each key's k-th pane, in batch order.
fn rounds<'a>(panes: &[&'a ResultRecord]) -> Vec<Vec<&'a ResultRecord>> {
    let mut seen: HashMap<(&str, i64, i32), usize> = HashMap::with_capacity(panes.len());
    let mut rounds: Vec<Vec<&ResultRecord>> = Vec::new();
    for r in panes {
        let k = seen
            .entry((r.tenant_id.as_str(), r.window_end, r.source_partition))
            .or_insert(0);
        if rounds.len() <= *k {
            rounds.push(Vec::new());
        }
        rounds[*k].push(r);
        *k += 1;
    }
    rounds
}

/// Applies `panes` (in batch order) inside `tx`; `st` prepares `UPSERT_PANES`.
/// Returns the partials replaced and the panes found stale.
pub(super) async fn apply(
    tx: &Transaction<'_>,
    st: &Statement,
    panes: &[&ResultRecord],
) -> Result<(u64, u64), SinkError> {
    let (mut changed, mut stale) = (0, 0);
    for round in rounds(panes) {
        let mut columns = Columns::default();
        for r in &round {
            columns.push(r)?;
        }
        let n = columns.upsert(tx, st).await?;
        changed += n;
        stale += round.len() as u64 - n;
    }
    Ok((changed, stale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_panes_go_to_successive_rounds_in_batch_order() {
        let pane = |tenant: &str, end: i64, version: u64| ResultRecord {
            kind: crate::engine::ResultKind::Window,
            tenant_id: tenant.into(),
            window_start: end - 60_000,
            window_end: end,
            cost_pico: crate::model::Pico(0),
            usd: "0.000000000000".into(),
            requests: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            source_partition: 0,
            version,
            pane: PaneKind::OnTime,
            pane_index: 0,
            generation: 1,
            lines: Vec::new(),
        };
        let (a2, b1, a1, a3) = (
            pane("a", 60_000, 2),
            pane("b", 60_000, 1),
            pane("a", 60_000, 1),
            pane("a", 60_000, 3),
        );
        let got: Vec<Vec<(String, u64)>> = rounds(&[&a2, &b1, &a1, &a3])
            .iter()
            .map(|r| r.iter().map(|p| (p.tenant_id.clone(), p.version)).collect())
            .collect();
        let want = [
            vec![("a".to_string(), 2), ("b".to_string(), 1)],
            vec![("a".to_string(), 1)],
            vec![("a".to_string(), 3)],
        ];
        assert_eq!(got, want);
    }

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
