//! The join: the partitions' replays, the late and dead-letter topics and the
//! sink's rows for one (tenant, window) made into one `Explanation`, with
//! the totals compared to the sink's line and every difference named.
//!
//! Pure. The late and dead-letter topics are matched to the replay by their
//! records' `tally.source` (`topic/partition/offset`), adjustments by request
//! id. Invariant: `agrees` is `Some(true)` only when the sink's line and every
//! line item equal the totals; whenever it is not, or the replay was not exact,
//! `notes` says why.

use std::collections::{BTreeMap, BTreeSet};

use super::replay::Replayed;
use super::{Explanation, QuantityLine, Routed, SinkLine, SinkRows, Totals};
use crate::kafka::headers;
use crate::kafka::read::StoredRecord;

/// What the join reads besides the replays.
pub struct Sides<'a> {
    pub input_topic: &'a str,
    pub late: &'a [StoredRecord],
    pub dead_letters: &'a [StoredRecord],
    pub sink: Option<SinkRows>,
}

fn pico(s: &str) -> u128 {
    s.parse().unwrap_or(0)
}

/// One explanation of `tenant`'s windows in `[window_start, window_end)`.
pub fn join(
    tenant: &str,
    (window_start, window_end): (i64, i64),
    replays: Vec<Replayed>,
    sides: Sides<'_>,
) -> Explanation {
    let sources = |recs: &[StoredRecord]| -> BTreeSet<String> {
        recs.iter()
            .filter_map(|r| r.header(headers::SOURCE).map(str::to_string))
            .collect()
    };
    let (late, dead) = (sources(sides.late), sources(sides.dead_letters));
    let coords = |p: i32, o: i64| format!("{}/{p}/{o}", sides.input_topic);
    let adjusted: BTreeMap<&str, &str> = sides
        .sink
        .iter()
        .flat_map(|s| &s.adjustments)
        .map(|a| (a.request_id.as_str(), a.cost_pico.as_str()))
        .collect();
    let mut x = Explanation {
        tenant_id: tenant.to_string(),
        window_start,
        window_end,
        partitions: Vec::new(),
        billed: Vec::new(),
        elsewhere: Vec::new(),
        totals: Totals::default(),
        sink: None,
        exact: true,
        agrees: None,
        notes: Vec::new(),
        finality: None,
    };
    for r in replays {
        x.partitions.push(r.range);
        x.billed.extend(r.billed);
        x.elsewhere.extend(r.elsewhere);
    }
    for e in &mut x.elsewhere {
        let here = coords(e.partition, e.offset);
        match &mut e.route {
            Routed::TooLate {
                on_late_topic,
                adjustment,
                ..
            } => {
                *on_late_topic = late.contains(&here);
                if sides.sink.is_some() {
                    let id = e.request_id.as_deref().unwrap_or_default();
                    *adjustment = Some(adjusted.contains_key(id));
                }
            }
            Routed::DeadLetter {
                on_dead_letter_topic,
                ..
            } => *on_dead_letter_topic = dead.contains(&here),
            Routed::Duplicate { .. } => {}
        }
    }
    for b in &x.billed {
        let here = coords(b.partition, b.offset);
        if late.contains(&here) || dead.contains(&here) {
            x.notes.push(format!(
                "{here} (request {}) is billed by the replay but the live run routed it to the \
                 late or dead-letter topic (a watermark forced by idleness, or a wall-clock guard)",
                b.request_id
            ));
        }
    }
    x.totals = totals(&x, &adjusted);
    x.totals.quantities = quantity_totals(&x, sides.sink.as_ref());
    compare(&mut x, sides.sink);
    x
}

fn totals(x: &Explanation, adjusted: &BTreeMap<&str, &str>) -> Totals {
    let mut t = Totals::default();
    let mut cost = 0u128;
    let mut lines: BTreeMap<String, (u128, u64)> = BTreeMap::new();
    for b in &x.billed {
        t.requests += 1;
        t.prompt_tokens += b.prompt_tokens;
        t.completion_tokens += b.completion_tokens;
        cost += pico(&b.cost_pico);
        let l = lines.entry(b.model.clone()).or_default();
        l.0 += pico(&b.cost_pico);
        l.1 += 1;
    }
    let mut adj = 0u128;
    for (_, c) in adjusted.iter() {
        t.adjusted_requests += 1;
        adj += pico(c);
    }
    t.cost_pico = cost.to_string();
    t.adjusted_cost_pico = adj.to_string();
    t.expected_line_cost_pico = (cost + adj).to_string();
    t.lines = lines
        .into_iter()
        .map(|(model, (c, n))| SinkLine {
            model,
            cost_pico: c.to_string(),
            requests: n,
        })
        .collect();
    t
}

/// A `(model, variant, plan, quantity)` key, `""` for none.
type QuantityKey = (String, String, String, String);

/// Per quantity line item: the billed requests' quantities and the sink's
/// adjustments' (as `totals` counts the adjustments' cost from the sink).
fn quantity_totals(x: &Explanation, sink: Option<&SinkRows>) -> Vec<QuantityLine> {
    let mut sums: BTreeMap<QuantityKey, (u64, u128)> = BTreeMap::new();
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    let billed = x.billed.iter().map(|b| {
        let key = (b.model.clone(), text(&b.variant), text(&b.plan));
        (key, &b.quantities)
    });
    let adjusted = sink.iter().flat_map(|s| &s.adjustments).map(|a| {
        let key = (a.model.clone(), a.variant.clone(), a.plan.clone());
        (key, &a.quantities)
    });
    for ((model, variant, plan), qs) in billed.chain(adjusted) {
        for q in qs {
            let k = (
                model.clone(),
                variant.clone(),
                plan.clone(),
                q.quantity.clone(),
            );
            let s = sums.entry(k).or_default();
            s.0 += q.count;
            s.1 += pico(&q.cost_pico);
        }
    }
    sums.into_iter()
        .map(
            |((model, variant, plan, quantity), (count, cost))| QuantityLine {
                model,
                variant,
                plan,
                quantity,
                count,
                cost_pico: cost.to_string(),
            },
        )
        .collect()
}

/// Compares the totals with the sink's rows and names every difference.
fn compare(x: &mut Explanation, sink: Option<SinkRows>) {
    for p in &x.partitions {
        match &p.checkpoint {
            None if p.from_offset > 0 => {
                x.exact = false;
                x.notes.push(format!(
                    "records before offset {} of partition {} were deleted by retention; the \
                     totals may differ by what they held (their requests, and the watermark and \
                     duplicates they set up)",
                    p.from_offset, p.partition
                ));
            }
            None => {}
            Some(c) => x.notes.push(format!(
                "partition {} was replayed from checkpoint {} (offset {}): no record before it \
                 is of the window(s) (the partition's greatest completed_ts there is {}); its \
                 dead letters before it are taken from the dead-letter topic",
                p.partition,
                c.name,
                c.next_offset,
                c.high_water.map_or("none".into(), |h| h.to_string())
            )),
        }
        if p.stopped_early {
            x.notes.push(format!(
                "partition {}: read up to offset {} of {}, where its watermark left the \
                 window(s)' dedup horizon; its later records of them are taken from the late \
                 and dead-letter topics",
                p.partition, p.to_offset, p.log_end
            ));
        }
        if !p.final_here {
            x.notes.push(format!(
                "partition {} has not purged the window(s) yet (watermark {}): records still \
                 to come may be billed into them",
                p.partition,
                p.watermark.map_or("none".into(), |w| w.to_string())
            ));
        }
    }
    let unbilled: Vec<_> = x
        .elsewhere
        .iter()
        .filter(|e| {
            matches!(
                e.route,
                Routed::TooLate {
                    adjustment: Some(false),
                    ..
                }
            )
        })
        .collect();
    if !unbilled.is_empty() {
        let cost: u128 = unbilled
            .iter()
            .map(|e| match &e.route {
                Routed::TooLate { cost_pico, .. } => pico(cost_pico),
                _ => 0,
            })
            .sum();
        x.notes.push(format!(
            "{} too-late request(s) costing {cost} pico-USD have no adjustment in the sink yet \
             (run `tally reprocess-late`, then the sink)",
            unbilled.len()
        ));
    }
    let Some(sink) = sink else {
        x.notes
            .push("no sink given (--sink-url): the totals are not compared".into());
        return;
    };
    let differs = sink_differences(x, &sink);
    x.agrees = Some(differs.is_empty());
    x.notes.extend(differs);
    x.sink = Some(sink);
}

/// What differs between the sink's rows and the totals, each named.
fn sink_differences(x: &Explanation, sink: &SinkRows) -> Vec<String> {
    let mut notes = Vec::new();
    let t = &x.totals;
    let want_requests = t.requests + t.adjusted_requests;
    let have = sink.cost_pico.as_deref().map_or(0, pico);
    if have != pico(&t.expected_line_cost_pico) || sink.requests != want_requests {
        notes.push(format!(
            "the sink's line is {have} pico-USD for {} requests; the replay and the sink's \
             adjustments make {} for {want_requests}",
            sink.requests, t.expected_line_cost_pico
        ));
    }
    // Per source partition: the stored partial against the replay's share.
    let mut share: BTreeMap<i32, (u128, u64)> = BTreeMap::new();
    for b in &x.billed {
        let s = share.entry(b.partition).or_default();
        s.0 += pico(&b.cost_pico);
        s.1 += 1;
    }
    for (p, (cost, n)) in &share {
        let stored = sink.partials.iter().find(|s| s.source_partition == *p);
        match stored {
            None => notes.push(format!(
                "partition {p}: the sink holds no partial yet; the replay bills {n} requests \
                 ({cost} pico-USD) there (panes not yet applied by the sink)"
            )),
            Some(s) if s.requests != *n || pico(&s.cost_pico) != *cost => notes.push(format!(
                "partition {p}: the sink holds version {} ({} requests, {} pico-USD); the replay \
                 bills {n} ({cost}): {}",
                s.version,
                s.requests,
                s.cost_pico,
                if s.requests < *n {
                    "later panes not yet applied by the sink"
                } else {
                    "the sink holds more than the log explains"
                }
            )),
            Some(_) => {}
        }
    }
    for s in &sink.partials {
        if !share.contains_key(&s.source_partition) {
            notes.push(format!(
                "partition {}: the sink holds a partial ({} requests) the replay does not explain",
                s.source_partition, s.requests
            ));
        }
    }
    let explained: BTreeSet<&str> = x
        .elsewhere
        .iter()
        .filter_map(|e| e.request_id.as_deref())
        .collect();
    for a in &sink.adjustments {
        if !explained.contains(a.request_id.as_str()) {
            notes.push(format!(
                "the sink's adjustment for request {} (from {}) matches no too-late record \
                 the replay read",
                a.request_id, a.source
            ));
        }
    }
    let mut want: BTreeMap<&str, (u128, u64)> = BTreeMap::new();
    for l in &t.lines {
        want.insert(&l.model, (pico(&l.cost_pico), l.requests));
    }
    for a in &sink.adjustments {
        let w = want.entry(&a.model).or_default();
        w.0 += pico(&a.cost_pico);
        w.1 += 1;
    }
    let have: BTreeMap<&str, (u128, u64)> = sink
        .lines
        .iter()
        .map(|l| (l.model.as_str(), (pico(&l.cost_pico), l.requests)))
        .collect();
    if have != want {
        notes.push(format!(
            "the sink's line items {have:?} differ from the replay's {want:?}"
        ));
    }
    if sink.quantities != t.quantities {
        let (mut want, mut have) = (t.quantities.clone(), sink.quantities.clone());
        want.retain(|q| !sink.quantities.contains(q));
        have.retain(|q| !t.quantities.contains(q));
        notes.push(format!(
            "the sink's quantity line items {have:?} differ from the replay's {want:?}"
        ));
    }
    notes
}

#[cfg(test)]
#[path = "join_tests.rs"]
mod tests;
