//! What differs between two rate books, for the evolution rule (docs/DESIGN.md
//! §7.4.1): each difference is named by the config key it comes from and dated by
//! the first event time whose price it can change.
//!
//! Invariants:
//! - Entries are compared by name, never by `QuantityId`: declaring a quantity
//!   renumbers those after it, and that alone changes no price.
//! - A dated entry (a model's price, a plan's version, a tenant's assignment) that
//!   is added, removed or changed is a change from its `effective_from`. A quantity
//!   or the variant attribute that is added, removed or changed is a change from the
//!   earlier of its two `effective_from`s (`i64::MIN` when either side reads it
//!   always). Adding a value to the variant attribute, nothing else changed, is no
//!   change: a record of that value was a dead letter, and stays one unless a dated
//!   entry that prices it (itself a change) says otherwise.
//! - The rule is the caller's: compatible when every change's `effective_from_ms`
//!   is strictly after the partition's high-water time.
//! - Pure: no I/O.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::rates::{ModelRates, PriceSet, RateSet};
use super::{PlanVersion, QuantitySet, RateBook};

/// One difference: its config key, what happened, and from when it prices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Change {
    pub key: String,
    pub what: What,
    pub effective_from_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum What {
    Added,
    Removed,
    Changed,
}

/// Every difference from `old` to `new`, sorted.
pub fn changes(old: &RateBook, new: &RateBook) -> Vec<Change> {
    let mut out = Vec::new();
    quantities(old.quantities(), new.quantities(), &mut out);
    variant(old, new, &mut out);
    let canon = |b: &RateBook| -> Vec<(String, i64, String)> {
        b.list_entries()
            .map(|(m, at, r)| (format!("prices.models.{m}"), at, model(b.quantities(), r)))
            .collect()
    };
    dated(canon(old), canon(new), &mut out);
    let plans = |b: &RateBook| -> Vec<(String, i64, String)> {
        b.plans()
            .iter()
            .flat_map(|p| {
                p.versions.iter().map(move |v| {
                    (
                        format!("prices.plans.{}", p.name),
                        v.effective_from_ms,
                        plan(b, v),
                    )
                })
            })
            .collect()
    };
    dated(plans(old), plans(new), &mut out);
    let assigned = |b: &RateBook| -> Vec<(String, i64, String)> {
        b.assignments()
            .map(|(t, at, p)| {
                (
                    format!("prices.assignments (tenant {t:?})"),
                    at,
                    format!("{p:?}"),
                )
            })
            .collect()
    };
    dated(assigned(old), assigned(new), &mut out);
    out.sort();
    out
}

/// The canonical text of the entry `(key, at)` of a side.
fn find<'a>(side: &'a [(String, i64, String)], k: &str, at: i64) -> Option<&'a String> {
    side.iter()
        .find(|(k2, at2, _)| k2 == k && *at2 == at)
        .map(|(_, _, c)| c)
}

/// Dated entries `(key, from, canonical text)` compared by `(key, from)`.
fn dated(old: Vec<(String, i64, String)>, new: Vec<(String, i64, String)>, out: &mut Vec<Change>) {
    let keys: BTreeSet<(&String, i64)> =
        old.iter().chain(&new).map(|(k, at, _)| (k, *at)).collect();
    for (k, at) in keys {
        let what = match (find(&old, k, at), find(&new, k, at)) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(_), Some(_)) => What::Changed,
            (None, _) => What::Added,
            (_, None) => What::Removed,
        };
        out.push(Change {
            key: k.clone(),
            what,
            effective_from_ms: at,
        });
    }
}

fn quantities(old: &QuantitySet, new: &QuantitySet, out: &mut Vec<Change>) {
    let describe = |s: &QuantitySet, name: &str| {
        let q = s.id(name)?;
        let whole = s.whole_of(q).map(|w| s.name(w).to_string());
        Some((whole, s.effective_from(q)))
    };
    let names: BTreeSet<&str> = old
        .ids()
        .map(|q| &**old.name(q))
        .chain(new.ids().map(|q| &**new.name(q)))
        .collect();
    for name in names {
        let (a, b) = (describe(old, name), describe(new, name));
        let (what, from) = match (&a, &b) {
            (Some(x), Some(y)) if x == y => continue,
            (Some(x), Some(y)) => (What::Changed, x.1.min(y.1)),
            (None, Some(y)) => (What::Added, y.1),
            (Some(x), None) => (What::Removed, x.1),
            (None, None) => continue,
        };
        out.push(Change {
            key: format!("input.quantities.{name}"),
            what,
            effective_from_ms: from,
        });
    }
}

fn variant(old: &RateBook, new: &RateBook, out: &mut Vec<Change>) {
    let (what, from) = match (old.variant_attribute(), new.variant_attribute()) {
        (None, None) => return,
        (None, Some(b)) => (What::Added, b.effective_from_ms),
        (Some(a), None) => (What::Removed, a.effective_from_ms),
        (Some(a), Some(b)) => {
            let same = a.name == b.name
                && a.default == b.default
                && a.effective_from_ms == b.effective_from_ms;
            if same && a.values.iter().all(|v| b.values.contains(v)) {
                return;
            }
            (What::Changed, a.effective_from_ms.min(b.effective_from_ms))
        }
    };
    out.push(Change {
        key: "input.variant".into(),
        what,
        effective_from_ms: from,
    });
}

/// A model's rates as text, quantities by name (sorted), so books that number
/// them differently compare equal.
fn model(q: &QuantitySet, m: &ModelRates) -> String {
    let mut s = format!("own {}", price_set(q, &m.own));
    for (v, p) in &m.variants {
        let _ = write!(s, "; {v}: {}", price_set(q, p));
    }
    s
}

fn price_set(q: &QuantitySet, p: &PriceSet) -> String {
    let mut s = rate_set(q, &p.base);
    let mut tiers: Vec<String> = p
        .tiers
        .iter()
        .map(|t| {
            let mut on: Vec<&str> = t.on.iter().map(|&i| &**q.name(i)).collect();
            on.sort();
            format!("{on:?} > {}: {}", t.above, rate_set(q, &t.set))
        })
        .collect();
    tiers.sort();
    for t in tiers {
        let _ = write!(s, " | {t}");
    }
    s
}

fn rate_set(q: &QuantitySet, r: &RateSet) -> String {
    let mut rates: Vec<String> = r
        .rates()
        .iter()
        .map(|(i, rate)| format!("{}={}/{:?}", q.name(*i), rate.pico_per_unit, rate.unit))
        .collect();
    rates.sort();
    format!("{{{} fee={:?}}}", rates.join(","), r.fee.map(|f| f.0))
}

fn plan(b: &RateBook, v: &PlanVersion) -> String {
    let mut s = format!("discount {} ppm", v.discount_ppm);
    for (m, r) in &v.models {
        let _ = write!(s, "; {m}: {}", model(b.quantities(), r));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rating::{Rate, VariantAttribute};

    fn book(extra: &[(&str, Option<&str>)], cached: Option<u64>) -> RateBook {
        let q = QuantitySet::new(extra).unwrap();
        let mut rates = vec![(q.id("prompt_tokens").unwrap(), Rate::per_1k(2))];
        if let Some(c) = cached {
            rates.push((q.id("cached_tokens").unwrap(), Rate::per_1k(c)));
        }
        let set = RateSet::new(rates, None);
        let mut b = RateBook::new(q, None);
        b.insert_price(
            "m",
            i64::MIN,
            ModelRates::new(PriceSet::new(set, Vec::new()), Vec::new()),
        );
        b
    }

    #[test]
    fn an_equal_book_has_no_change_whatever_its_numbering() {
        let cached = [("cached_tokens", Some("prompt_tokens"))];
        assert_eq!(
            changes(&book(&cached, Some(1)), &book(&cached, Some(1))),
            []
        );
        // A quantity that sorts first renumbers the others: only it is a change.
        let more = [
            ("audio_tokens", None),
            ("cached_tokens", Some("prompt_tokens")),
        ];
        let mut new = book(&more, Some(1));
        let mut q = new.quantities().clone();
        q.set_effective_from(q.id("audio_tokens").unwrap(), 500);
        let mut renumbered = RateBook::new(q, None);
        for (m, at, r) in new.list_entries() {
            renumbered.insert_price(m, at, r.clone());
        }
        new = renumbered;
        let c = changes(&book(&cached, Some(1)), &new);
        assert_eq!(
            c,
            [Change {
                key: "input.quantities.audio_tokens".into(),
                what: What::Added,
                effective_from_ms: 500
            }]
        );
    }

    #[test]
    fn dated_entries_change_from_their_time() {
        let old = book(&[], None);
        let mut new = old.clone();
        new.insert_price("m", 1_000, ModelRates::default());
        new.insert_plan("gold", PlanVersion::new(2_000, 10, Vec::new()));
        new.assign("acme", 3_000, Some("gold"));
        let c: Vec<(String, What, i64)> = changes(&old, &new)
            .into_iter()
            .map(|c| (c.key, c.what, c.effective_from_ms))
            .collect();
        assert_eq!(
            c,
            [
                (
                    "prices.assignments (tenant \"acme\")".into(),
                    What::Added,
                    3_000
                ),
                ("prices.models.m".into(), What::Added, 1_000),
                ("prices.plans.gold".into(), What::Added, 2_000),
            ]
        );
        // A changed rate is a change from its entry's time (here: always).
        let c = changes(
            &book(&[("cached_tokens", None)], Some(1)),
            &book(&[("cached_tokens", None)], Some(2)),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].what, c[0].effective_from_ms),
            (What::Changed, i64::MIN)
        );
    }

    #[test]
    fn a_variant_value_added_is_no_change_one_removed_is() {
        let attr = |values: &[&str]| VariantAttribute {
            name: "service_tier".into(),
            values: values.iter().map(|v| (*v).into()).collect(),
            default: "default".into(),
            effective_from_ms: 7,
        };
        let with = |values: &[&str]| RateBook::new(QuantitySet::default(), Some(attr(values)));
        assert_eq!(
            changes(&with(&["default"]), &with(&["batch", "default"])),
            []
        );
        let c = changes(&with(&["batch", "default"]), &with(&["default"]));
        assert_eq!(
            (c[0].key.as_str(), c[0].effective_from_ms),
            ("input.variant", 7)
        );
        let c = changes(&RateBook::default(), &with(&["default"]));
        assert_eq!((c[0].what, c[0].effective_from_ms), (What::Added, 7));
    }
}
