//! A seeded stream of records for a rating (issue 36), and the bill it implies per
//! window and per `(model, variant, plan, quantity)` line item.
//!
//! Construction: record `i` completes at `start + i · step` minus a jitter below
//! `max_jitter_ms` (so none is late under a watermark bound above it); each tenant
//! sends to one partition (`fnv1a(tenant) % partitions`); its usage has every
//! quantity of the book at `/usage/<name>` and the variant at `/<attribute>`. A
//! draw the book refuses (a part above its whole, a value or a quantity the model
//! does not price) is redrawn without it, so every record bills. A duplicate
//! re-sends a recent record of its partition, and a late record is one more of an
//! early minute (`late`, sent after everything else).
//!
//! The expected bill rates each distinct record with `RateBook::rate`, whose
//! arithmetic `model::rating`'s property tests hold to a reference model; what a
//! run checks against it is everything around the rating (routes, windows, dedup,
//! state, recovery, the sink). Pure: no I/O.

use std::collections::BTreeMap;

use super::{fnv1a, Rng};
use crate::model::rating::{RateBook, Rated, Rejection, Request};
use crate::time::WindowSpec;

/// `(model, variant, plan, quantity)`, `""` for no variant or plan; a line's fees
/// are the quantity `fee`, counting the requests charged one (as the sink's view
/// has them).
pub type LineKey = (String, String, String, String);

/// One window's expected bill.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RatedWindow {
    pub cost: u128,
    pub requests: u64,
    pub lines: BTreeMap<LineKey, (u64, u128)>,
}

/// What `rated_stream` makes.
#[derive(Debug, Clone, Default)]
pub struct RatedStream {
    /// `(partition, payload)` in sending order, duplicates included.
    pub records: Vec<(i32, String)>,
    /// Records of early minutes, to send after `records` (too late for their windows).
    pub late: Vec<(i32, String)>,
    /// By `(tenant, window_start)`: on-time and late records alike.
    pub expected: BTreeMap<(String, i64), RatedWindow>,
}

/// The stream's shape.
#[derive(Debug, Clone)]
pub struct RatedOptions {
    pub seed: u64,
    pub count: usize,
    pub tenants: Vec<String>,
    pub partitions: i32,
    pub start_ms: i64,
    pub step_ms: i64,
    pub max_jitter_ms: i64,
    /// Per million records, a duplicate.
    pub duplicates_ppm: u32,
    pub late: usize,
}

/// The stream of `opts` for `book` in `window`s (module header).
pub fn rated_stream(book: &RateBook, window: WindowSpec, opts: &RatedOptions) -> RatedStream {
    let mut rng = Rng::new(opts.seed);
    let models: Vec<String> = {
        let mut m: Vec<String> = book.list_entries().map(|(m, ..)| m.to_string()).collect();
        m.dedup();
        m
    };
    let mut out = RatedStream::default();
    let mut recent: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let mut late_from: Vec<(i64, String)> = Vec::new();
    for i in 0..opts.count {
        let tenant = &opts.tenants[rng.below(opts.tenants.len() as u64) as usize];
        let partition = (fnv1a(tenant) % opts.partitions as u64) as i32;
        let jitter = rng.below(opts.max_jitter_ms.max(1) as u64) as i64;
        let at = opts.start_ms + i as i64 * opts.step_ms - jitter;
        let pool = recent.entry(partition).or_default();
        if !pool.is_empty() && rng.chance(opts.duplicates_ppm) {
            let again = pool[rng.below(pool.len() as u64) as usize].clone();
            out.records.push((partition, again));
            continue;
        }
        let model = &models[rng.below(models.len() as u64) as usize];
        let id = format!("q-{}-{i}", opts.seed);
        let (payload, rated) = draw(book, &mut rng, (&id, tenant, model, at));
        add(&mut out, window, tenant, at, &rated);
        pool.push(payload.clone());
        if pool.len() > 64 {
            pool.remove(0);
        }
        out.records.push((partition, payload));
        if i < opts.late {
            late_from.push((at, tenant.clone()));
        }
    }
    for (j, (at, tenant)) in late_from.into_iter().enumerate() {
        let partition = (fnv1a(&tenant) % opts.partitions as u64) as i32;
        let model = &models[rng.below(models.len() as u64) as usize];
        let id = format!("late-{}-{j}", opts.seed);
        let (payload, rated) = draw(book, &mut rng, (&id, &tenant, model, at));
        add(&mut out, window, &tenant, at, &rated);
        out.late.push((partition, payload));
    }
    out
}

/// One record that the book rates, and its rating.
fn draw(
    book: &RateBook,
    rng: &mut Rng,
    (id, tenant, model, at): (&str, &str, &str, i64),
) -> (String, Rated) {
    let q = book.quantities();
    let names: Vec<&str> = q.ids().map(|id| &**q.name(id)).collect();
    let mut counts: Vec<u64> = names
        .iter()
        .map(|_| match rng.below(4) {
            0 => 0,
            1 => rng.below(1_000),
            2 => rng.below(50_000),
            _ => rng.below(400_000),
        })
        .collect();
    let values: Vec<String> = book
        .variant_attribute()
        .map(|v| v.values.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default();
    let mut variant = (!values.is_empty() && rng.below(3) > 0)
        .then(|| values[rng.below(values.len() as u64) as usize].clone());
    loop {
        let r = book.rate(&Request {
            tenant,
            at_ms: at,
            model,
            variant: variant.as_deref(),
            counts: &counts,
        });
        match r {
            Ok(rated) => {
                return (
                    payload(book, id, tenant, model, at, &names, &counts, &variant),
                    rated,
                )
            }
            Err(Rejection::PartExceedsWhole { part, .. }) => zero(&mut counts, &names, &part),
            Err(Rejection::UnpricedQuantity { quantity, .. }) => {
                zero(&mut counts, &names, &quantity)
            }
            Err(Rejection::UnknownVariant { .. }) => variant = None,
            Err(Rejection::Overflow) => counts.iter_mut().for_each(|c| *c /= 2),
            Err(e) => panic!("the book cannot rate {model} at {at}: {e}"),
        }
    }
}

fn zero(counts: &mut [u64], names: &[&str], name: &str) {
    if let Some(i) = names.iter().position(|n| *n == name) {
        counts[i] = 0;
    }
}

#[allow(clippy::too_many_arguments)]
fn payload(
    book: &RateBook,
    id: &str,
    tenant: &str,
    model: &str,
    at: i64,
    names: &[&str],
    counts: &[u64],
    variant: &Option<String>,
) -> String {
    let usage: Vec<String> = names
        .iter()
        .zip(counts)
        .map(|(n, c)| format!("\"{n}\":{c}"))
        .collect();
    let variant = match (book.variant_attribute(), variant) {
        (Some(a), Some(v)) => format!(",\"{}\":\"{v}\"", a.name),
        _ => String::new(),
    };
    format!(
        "{{\"request_id\":\"{id}\",\"tenant_id\":\"{tenant}\",\"model\":\"{model}\",\
         \"completed_ts\":{at}{variant},\"usage\":{{{}}}}}",
        usage.join(",")
    )
}

fn add(out: &mut RatedStream, window: WindowSpec, tenant: &str, at: i64, r: &Rated) {
    let w = window.assign(at).expect("generated times are in range");
    let e = out
        .expected
        .entry((tenant.to_string(), w.start))
        .or_default();
    e.cost += r.total.0;
    e.requests += 1;
    let key = |q: &str| {
        (
            r.model.to_string(),
            r.variant.as_deref().unwrap_or("").to_string(),
            r.plan.as_deref().unwrap_or("").to_string(),
            q.to_string(),
        )
    };
    for l in &r.lines {
        let v = e.lines.entry(key(&l.name)).or_default();
        v.0 += l.count;
        v.1 += l.cost.0;
    }
    if !r.fee.is_zero() {
        let v = e.lines.entry(key("fee")).or_default();
        v.0 += 1;
        v.1 += r.fee.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded, and every distinct record is in the bill once: the windows' requests
    /// count the records less the duplicates, and their costs sum their lines.
    #[test]
    fn seeded_and_every_record_billed_once() {
        let book = crate::config::rating::from_toml(include_str!("../config/rating/openai.toml"))
            .unwrap()
            .book;
        let opts = RatedOptions {
            seed: 7,
            count: 2_000,
            tenants: vec!["acme".into(), "globex".into(), "initech".into()],
            partitions: 3,
            start_ms: 1_767_225_600_000,
            step_ms: 100,
            max_jitter_ms: 4_000,
            duplicates_ppm: 100_000,
            late: 10,
        };
        let window = WindowSpec::new(60_000, 0);
        let a = rated_stream(&book, window, &opts);
        let b = rated_stream(&book, window, &opts);
        assert_eq!(a.records, b.records);
        assert_eq!(a.expected, b.expected);
        let distinct: std::collections::BTreeSet<&str> =
            a.records.iter().map(|(_, r)| r.as_str()).collect();
        assert!(distinct.len() < a.records.len(), "some duplicates");
        let requests: u64 = a.expected.values().map(|w| w.requests).sum();
        assert_eq!(requests as usize, distinct.len() + a.late.len());
        for w in a.expected.values() {
            assert_eq!(w.cost, w.lines.values().map(|l| l.1).sum::<u128>());
        }
    }
}
