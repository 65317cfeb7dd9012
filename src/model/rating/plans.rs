//! Tenant plans: contract prices that override a subset of the list, and the
//! effective-dated assignment of tenants to them.
//!
//! Invariants:
//! - A plan is a list of versions, each from an `effective_from` (inclusive) until
//!   the next; the version in effect at the event time applies. A version overrides
//!   per model any subset of the list: a `ModelRates` whose sets are partial. It
//!   overrides the **slot** it names — a model's own set or a variant's, its base or
//!   a tier (same `on`, same `above`) — quantity by quantity and the fee; a slot the
//!   list lacks (a tier, a variant, a model) is added as the plan gives it.
//! - A tenant's assignments are effective-dated too: from each `effective_from` the
//!   tenant is on a plan, or back on the list (`None`). Before its first assignment,
//!   and while its plan has no version in effect, a tenant pays list prices.
//! - **The one rounding rule.** A version may give a discount, in parts per million
//!   (`"12.5"` percent = 125,000). It is applied in one place, `discount`, to each
//!   line item and to the fee after the rates are chosen: the amount charged is
//!   `cost × (1,000,000 − ppm) / 1,000,000` rounded to the nearest pico-USD, halves to
//!   even. Per line, because the line is what an invoice shows and then
//!   `sum(lines) + fee == total` holds with nothing to distribute; to nearest, half to
//!   even, because a pico-USD is 10^-12 USD and an unbiased rule leaves no drift in
//!   either party's favour over millions of lines. Never above the undiscounted cost.
//! - Pure: no I/O.

use std::sync::Arc;

use super::rates::ModelRates;
use crate::model::Pico;

/// Parts per million: the whole (a 100 % discount).
pub const PPM: u32 = 1_000_000;

/// One version of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanVersion {
    pub effective_from_ms: i64,
    /// At most `PPM`.
    pub discount_ppm: u32,
    /// Sorted by model, unique.
    pub models: Vec<(Arc<str>, ModelRates)>,
}

impl PlanVersion {
    pub fn new(
        effective_from_ms: i64,
        discount_ppm: u32,
        mut models: Vec<(Arc<str>, ModelRates)>,
    ) -> Self {
        models.sort_by(|a, b| a.0.cmp(&b.0));
        models.dedup_by(|a, b| a.0 == b.0);
        PlanVersion {
            effective_from_ms,
            discount_ppm: discount_ppm.min(PPM),
            models,
        }
    }

    pub fn model(&self, model: &str) -> Option<&ModelRates> {
        self.models
            .iter()
            .find(|(m, _)| crate::model::same(m.as_bytes(), model.as_bytes()))
            .map(|(_, r)| r)
    }
}

/// A named plan and its versions, sorted by `effective_from_ms`, unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub name: Arc<str>,
    pub versions: Vec<PlanVersion>,
}

impl Plan {
    /// Adds a version, replacing one from the same instant.
    pub fn insert(&mut self, v: PlanVersion) {
        self.versions
            .retain(|o| o.effective_from_ms != v.effective_from_ms);
        self.versions.push(v);
        self.versions.sort_by_key(|v| v.effective_from_ms);
    }

    pub fn at(&self, at_ms: i64) -> Option<&PlanVersion> {
        let i = self
            .versions
            .partition_point(|v| v.effective_from_ms <= at_ms);
        i.checked_sub(1).map(|i| &self.versions[i])
    }
}

/// The entry of a dated list in effect at `at_ms` (entries sorted by time).
pub fn in_effect<T>(entries: &[(i64, T)], at_ms: i64) -> Option<&T> {
    let i = entries.partition_point(|(from, _)| *from <= at_ms);
    i.checked_sub(1).map(|i| &entries[i].1)
}

/// The amount charged for `cost` under a discount of `ppm` (the rule in the
/// module header).
pub fn discount(cost: Pico, ppm: u32) -> Pico {
    if ppm == 0 {
        return cost;
    }
    let d = u128::from(PPM);
    let keep = d - u128::from(ppm.min(PPM));
    // cost × keep / d without overflow: (q·d + r)·keep / d = q·keep + r·keep / d.
    let (q, r) = (cost.0 / d, cost.0 % d);
    let whole = q * keep + r * keep / d;
    let rem = r * keep % d;
    let up = 2 * rem > d || (2 * rem == d && whole % 2 == 1);
    Pico(whole + u128::from(up))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discount_rounds_half_to_even_per_amount() {
        assert_eq!(discount(Pico(1_000), 0), Pico(1_000));
        assert_eq!(discount(Pico(1_000), 100_000), Pico(900));
        assert_eq!(discount(Pico(1_000), PPM), Pico(0));
        // 5 × 0.5 = 2.5 → 2; 7 × 0.5 = 3.5 → 4; 1 × 0.75 = 0.75 → 1; 1 × 0.25 → 0.
        assert_eq!(discount(Pico(5), 500_000), Pico(2));
        assert_eq!(discount(Pico(7), 500_000), Pico(4));
        assert_eq!(discount(Pico(1), 250_000), Pico(1));
        assert_eq!(discount(Pico(1), 750_000), Pico(0));
        // The largest amount does not overflow and is never raised.
        let max = discount(Pico(u128::MAX), 1);
        assert!(max < Pico(u128::MAX));
        assert_eq!(discount(Pico(u128::MAX), 0), Pico(u128::MAX));
    }

    #[test]
    fn versions_and_dated_entries_apply_from_their_instant() {
        let mut p = Plan {
            name: "e".into(),
            versions: Vec::new(),
        };
        p.insert(PlanVersion::new(10, 1, Vec::new()));
        p.insert(PlanVersion::new(0, 2, Vec::new()));
        p.insert(PlanVersion::new(10, 3, Vec::new()));
        assert_eq!(p.at(-1), None);
        assert_eq!(p.at(9).map(|v| v.discount_ppm), Some(2));
        assert_eq!(p.at(10).map(|v| v.discount_ppm), Some(3));
        let dated = [(0, 'a'), (5, 'b')];
        assert_eq!(in_effect(&dated, -1), None);
        assert_eq!(in_effect(&dated, 4), Some(&'a'));
        assert_eq!(in_effect(&dated, 5), Some(&'b'));
    }
}
