//! What the sink stores (docs/DESIGN.md §6): a result record is applied only when
//! PostgreSQL can hold it and it agrees with itself; anything else is rejected by
//! the sink's loop (counted, logged, kept in `sink_rejected`), never retried.
//!
//! Invariants:
//! - Ids follow the engine's id rule (`model::id`): whatever the worker bills passes,
//!   so only a record no tally wrote (or a tally before the rule) is rejected here.
//! - Integers fit their columns (`BIGINT`, `INTEGER`): no silent wrap, no SQL error.
//! - A record's derived fields agree with its totals: `usd` is `cost_pico` in USD, a
//!   window ends after it starts, the lines are sorted by model, each model once, and
//!   sum to the totals. The invoice (lines) and usage (totals) cannot then disagree.
//! - A progress record names no more partitions than the topics have (`Topology`)
//!   and is final no further than its watermark: one record cannot hold finality
//!   back for every window.
//! - Pure: no I/O.

use crate::engine::{AdjustmentRecord, ProgressRecord, ResultRecord, SinkRecord};
use crate::model::id::{self, MAX_ID_BYTES, MAX_KEY_BYTES};
use crate::model::Pico;

/// Why a record cannot be stored: a sentence naming the field.
pub(crate) type Rejection = String;

/// The partition counts the sink sees, which a progress record's counts must not
/// exceed: `tally_final` waits for every pair they name, so one record naming more
/// partitions than exist would keep every window from being final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Topology {
    /// Partitions of the results topic (the sink reads them all).
    pub results: i32,
    /// Partitions of the input topic, when the sink could read its metadata.
    pub input: Option<i32>,
}

impl Topology {
    /// No bound (what the engine's own tests check against).
    #[cfg(test)]
    pub(crate) const ANY: Topology = Topology {
        results: i32::MAX,
        input: None,
    };
}

/// Checks `r` before it is applied.
pub(crate) fn storable(r: &SinkRecord, topology: &Topology) -> Result<(), Rejection> {
    match r {
        SinkRecord::Window(w) => window(w),
        SinkRecord::Adjustment(a) => adjustment(a),
        SinkRecord::Progress(p) => progress(p, topology),
    }
}

fn ident(field: &str, s: &str, max: usize, non_empty: bool) -> Result<(), Rejection> {
    if non_empty && s.is_empty() {
        return Err(format!("{field} is empty"));
    }
    id::check(s, max).map_err(|why| format!("{field} is not a valid id: it {why}"))
}

fn bigint(field: &str, v: u64) -> Result<(), Rejection> {
    match i64::try_from(v) {
        Ok(_) => Ok(()),
        Err(_) => Err(format!("{field} {v} does not fit in BIGINT")),
    }
}

fn bounds(start: i64, end: i64) -> Result<(), Rejection> {
    if start < end {
        Ok(())
    } else {
        Err(format!(
            "window_start {start} is not before window_end {end}"
        ))
    }
}

fn usd(cost: Pico, usd: &str) -> Result<(), Rejection> {
    let want = cost.usd_string();
    if usd == want {
        Ok(())
    } else {
        Err(format!(
            "usd {usd:?} contradicts cost_pico {cost} (which is {want} USD)"
        ))
    }
}

fn window(w: &ResultRecord) -> Result<(), Rejection> {
    ident("tenant_id", &w.tenant_id, MAX_ID_BYTES, true)?;
    bounds(w.window_start, w.window_end)?;
    usd(w.cost_pico, &w.usd)?;
    bigint("requests", w.requests)?;
    bigint("version", w.version)?;
    bigint("generation", w.generation)?;
    if w.source_partition < 0 {
        return Err(format!(
            "source_partition {} is negative",
            w.source_partition
        ));
    }
    if i32::try_from(w.pane_index).is_err() {
        return Err(format!(
            "pane_index {} does not fit in INTEGER",
            w.pane_index
        ));
    }
    lines(w)
}

/// The lines: sorted by model (then variant and plan, docs/DESIGN.md §3.2), each
/// once, summing to the totals (none: a tally before line items; the sink stores one
/// line of model `""`); a line with quantities costs their sum plus its fee.
fn lines(w: &ResultRecord) -> Result<(), Rejection> {
    if w.lines.is_empty() {
        return Ok(());
    }
    let (mut requests, mut prompt, mut completion, mut cost) = (0u64, 0u64, 0u64, 0u128);
    type Key<'a> = (&'a str, Option<&'a str>, Option<&'a str>);
    let mut prev: Option<Key<'_>> = None;
    for l in &w.lines {
        ident("a line's model", &l.model, MAX_ID_BYTES, false)?;
        for (what, v) in [("a line's variant", &l.variant), ("a line's plan", &l.plan)] {
            if let Some(v) = v {
                ident(what, v, MAX_ID_BYTES, false)?;
            }
        }
        let key = (&*l.model, l.variant.as_deref(), l.plan.as_deref());
        if prev.is_some_and(|p| p >= key) {
            return Err(format!(
                "the lines are not sorted by model, each once (then by variant and plan: {key:?} \
                 after {:?})",
                prev.unwrap_or_default()
            ));
        }
        prev = Some(key);
        line_quantities(l)?;
        bigint("a line's requests", l.requests)?;
        let overflow = || "the lines' sums overflow".to_string();
        requests = requests.checked_add(l.requests).ok_or_else(overflow)?;
        prompt = prompt.checked_add(l.prompt_tokens).ok_or_else(overflow)?;
        completion = completion
            .checked_add(l.completion_tokens)
            .ok_or_else(overflow)?;
        cost = cost.checked_add(l.cost_pico.0).ok_or_else(overflow)?;
    }
    let totals = (
        w.requests,
        w.prompt_tokens,
        w.completion_tokens,
        w.cost_pico,
    );
    let summed = (requests, prompt, completion, Pico(cost));
    if totals != summed {
        return Err(format!(
            "the lines sum to requests {}, prompt_tokens {}, completion_tokens {}, cost_pico {}, \
             but the totals say {}, {}, {}, {}",
            summed.0, summed.1, summed.2, summed.3, totals.0, totals.1, totals.2, totals.3
        ));
    }
    Ok(())
}

/// A rated line's quantities and fee add up to its cost.
fn line_quantities(l: &crate::engine::LineItem) -> Result<(), Rejection> {
    quantities(&l.model, &l.quantities, l.fee_pico, l.cost_pico)
}

/// Quantities (and a fee) that add up to `cost`, each quantity named once, never
/// `fee` (the view's name for the fees, docs/DESIGN.md §6).
fn quantities(
    model: &str,
    items: &[crate::engine::QuantityItem],
    fee: Pico,
    cost: Pico,
) -> Result<(), Rejection> {
    if items.is_empty() {
        return Ok(());
    }
    let mut sum = fee.0;
    for (i, q) in items.iter().enumerate() {
        if &*q.quantity == "fee" || items[..i].iter().any(|o| o.quantity == q.quantity) {
            return Err(format!(
                "the quantity {:?} is named twice, or is `fee`",
                &*q.quantity
            ));
        }
        ident("a quantity's name", &q.quantity, MAX_ID_BYTES, true)?;
        sum = sum
            .checked_add(q.cost_pico.0)
            .ok_or_else(|| "a line's quantities overflow".to_string())?;
    }
    if sum != cost.0 {
        return Err(format!(
            "the quantities and fee of the line of {model:?} sum to cost_pico {sum}, but the \
             line says {cost}"
        ));
    }
    Ok(())
}

fn adjustment(a: &AdjustmentRecord) -> Result<(), Rejection> {
    ident("request_id", &a.request_id, MAX_KEY_BYTES, true)?;
    ident("tenant_id", &a.tenant_id, MAX_ID_BYTES, true)?;
    ident("model", &a.model, MAX_ID_BYTES, false)?;
    for (what, v) in [("variant", &a.variant), ("plan", &a.plan)] {
        if let Some(v) = v {
            ident(what, v, MAX_ID_BYTES, false)?;
        }
    }
    quantities(&a.model, &a.quantities, a.fee_pico, a.cost_pico)?;
    ident("source", &a.source, MAX_KEY_BYTES, false)?;
    bounds(a.window_start, a.window_end)?;
    usd(a.cost_pico, &a.usd)?;
    bigint("generation", a.generation)
}

fn progress(p: &ProgressRecord, topology: &Topology) -> Result<(), Rejection> {
    if p.source_partitions < 1 || p.results_partitions < 1 {
        return Err(format!(
            "source_partitions {} and results_partitions {} must be at least 1",
            p.source_partitions, p.results_partitions
        ));
    }
    if !(0..p.source_partitions).contains(&p.source_partition) {
        return Err(format!(
            "source_partition {} is not one of the {} source partitions",
            p.source_partition, p.source_partitions
        ));
    }
    if p.results_partitions > topology.results {
        return Err(format!(
            "results_partitions {} is more than the {} partitions of the results topic this sink \
             reads (after adding partitions, restart the sink)",
            p.results_partitions, topology.results
        ));
    }
    if let Some(input) = topology.input.filter(|n| p.source_partitions > *n) {
        return Err(format!(
            "source_partitions {} is more than the {input} partitions of the input topic",
            p.source_partitions
        ));
    }
    // final_through − 1 + allowed_lateness ≤ watermark, and lateness ≥ 0.
    if p.final_through > p.watermark.saturating_add(1) {
        return Err(format!(
            "final_through {} is past its watermark {}",
            p.final_through, p.watermark
        ));
    }
    bigint("generation", p.generation)
}

#[cfg(test)]
mod tests;
