//! Rates: what one request of a model costs, per quantity and per request.
//!
//! Invariants:
//! - One exact integer per rate: **pico-USD per unit of the quantity**. A rate
//!   written per 1,000 (`"0.002"` USD per 1,000 tokens, at most 9 decimals) is nano-USD
//!   per 1,000, which is the same integer (1 nano-USD / 1,000 = 1 pico-USD): today's
//!   `NanoPer1k` unchanged. A rate written per unit (`"0.01"` USD per call, at most 12
//!   decimals) is pico-USD per unit. So a line costs `count × rate` pico-USD, exactly,
//!   and never overflows (`u64 × u64 < 2^128`); `Unit` only says how it was written.
//! - A fee is pico-USD per request (a `u64`, at most 12 decimals of USD).
//! - A `RateSet` holds the rates it names, sorted by quantity, each at most once; a
//!   quantity it does not name has no rate (a non-zero net count of it is
//!   `unpriced_quantity`, never billed at zero). A set may be partial: a plan's set
//!   overrides a list set quantity by quantity (`plans`).
//! - A `PriceSet` is a base `RateSet` and request-size tiers. A tier applies when the
//!   sum of the request's **gross** counts of its quantities (`on`) is strictly
//!   greater than `above`; of the tiers that apply, the one with the greatest `above`
//!   prices the whole request alone (its own rates and fee, nothing from the base).
//!   The sum is taken in `u128`, so it cannot overflow.
//! - Pure: no I/O.

use std::sync::Arc;

use super::quantities::QuantityId;
use crate::model::Pico;

/// How a rate was written (display only: the integer is always pico-USD per unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unit {
    /// USD per 1,000 of the quantity, at most 9 decimals.
    Per1k,
    /// USD per one of the quantity, at most 12 decimals.
    PerUnit,
}

/// A price per unit of a quantity, in pico-USD (module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rate {
    pub pico_per_unit: u64,
    pub unit: Unit,
}

impl Rate {
    pub const fn per_1k(nano_per_1k: u64) -> Rate {
        Rate {
            pico_per_unit: nano_per_1k,
            unit: Unit::Per1k,
        }
    }

    pub const fn per_unit(pico: u64) -> Rate {
        Rate {
            pico_per_unit: pico,
            unit: Unit::PerUnit,
        }
    }

    /// `count × rate` pico-USD: exact, cannot overflow.
    pub fn cost(self, count: u64) -> Pico {
        Pico(u128::from(count) * u128::from(self.pico_per_unit))
    }
}

/// Rates of some quantities and, perhaps, a fee per request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateSet {
    rates: Vec<(QuantityId, Rate)>,
    /// `None`: no fee (or, in a plan's set, the list's fee).
    pub fee: Option<Pico>,
}

impl RateSet {
    pub fn new(rates: impl IntoIterator<Item = (QuantityId, Rate)>, fee: Option<Pico>) -> Self {
        let mut s = RateSet {
            rates: Vec::new(),
            fee,
        };
        for (q, r) in rates {
            s.set(q, r);
        }
        s
    }

    /// Sets (or replaces) the rate of `q`.
    pub fn set(&mut self, q: QuantityId, rate: Rate) {
        match self.rates.binary_search_by_key(&q, |(k, _)| *k) {
            Ok(i) => self.rates[i].1 = rate,
            Err(i) => self.rates.insert(i, (q, rate)),
        }
    }

    pub fn get(&self, q: QuantityId) -> Option<Rate> {
        self.rates.iter().find(|(k, _)| *k == q).map(|(_, r)| *r)
    }

    pub fn rates(&self) -> &[(QuantityId, Rate)] {
        &self.rates
    }
}

/// A request-size tier: when `sum(gross counts of on) > above`, `set` prices the
/// request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    /// Sorted, unique.
    pub on: Vec<QuantityId>,
    pub above: u64,
    pub set: RateSet,
}

impl Tier {
    pub fn new(mut on: Vec<QuantityId>, above: u64, set: RateSet) -> Self {
        on.sort();
        on.dedup();
        Tier { on, above, set }
    }

    /// The request's size as this tier measures it (gross counts; `u128`: no overflow).
    pub fn measure(&self, counts: &[u64]) -> u128 {
        self.on
            .iter()
            .map(|q| u128::from(counts.get(q.index()).copied().unwrap_or(0)))
            .sum()
    }

    pub fn applies(&self, counts: &[u64]) -> bool {
        self.measure(counts) > u128::from(self.above)
    }

    /// Whether `other` is the same slot (a plan's tier overrides the list's).
    pub fn same_slot(&self, other: &Tier) -> bool {
        self.above == other.above && self.on == other.on
    }
}

/// A base rate set and its tiers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceSet {
    pub base: RateSet,
    /// Sorted by `above` (ties keep their order; the config refuses them).
    pub tiers: Vec<Tier>,
}

impl PriceSet {
    pub fn new(base: RateSet, mut tiers: Vec<Tier>) -> Self {
        tiers.sort_by_key(|t| t.above);
        PriceSet { base, tiers }
    }

    /// The tier that prices a request of `counts`, if any (module header).
    pub fn tier(&self, counts: &[u64]) -> Option<&Tier> {
        self.tiers.iter().rev().find(|t| t.applies(counts))
    }
}

/// A model's prices (one effective-dated entry of the list, or a plan's override):
/// its own, and per variant value its own again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelRates {
    pub own: PriceSet,
    /// Sorted by value, unique.
    pub variants: Vec<(Arc<str>, PriceSet)>,
}

impl ModelRates {
    pub fn new(own: PriceSet, mut variants: Vec<(Arc<str>, PriceSet)>) -> Self {
        variants.sort_by(|a, b| a.0.cmp(&b.0));
        variants.dedup_by(|a, b| a.0 == b.0);
        ModelRates { own, variants }
    }

    /// The set of a variant value (`None`: the default value, the model's own).
    pub fn variant(&self, value: Option<&str>) -> Option<&PriceSet> {
        match value {
            None => Some(&self.own),
            Some(v) => self
                .variants
                .iter()
                .find(|(k, _)| &**k == v)
                .map(|(_, s)| s),
        }
    }
}

/// The declared variant attribute: a record's value of it picks the rates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantAttribute {
    /// The attribute's name (`service_tier`), for messages.
    pub name: Arc<str>,
    /// The declared values, sorted; `default` among them.
    pub values: Vec<Arc<str>>,
    /// The value of a record without the attribute; its rates are a model's own.
    pub default: Arc<str>,
    /// From when records' values are read (`i64::MIN`: always); before, every
    /// record is of the default value, as under a config without the attribute.
    pub effective_from_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: QuantityId = QuantityId::PROMPT_TOKENS;
    const C: QuantityId = QuantityId::COMPLETION_TOKENS;

    #[test]
    fn per_1k_and_per_unit_are_one_integer() {
        // $0.002 per 1k tokens = 2,000,000 nano per 1k = 2,000,000 pico per token.
        assert_eq!(Rate::per_1k(2_000_000).cost(2_000), Pico(4_000_000_000));
        // $0.01 per call = 10^10 pico per call.
        assert_eq!(Rate::per_unit(10_000_000_000).cost(3), Pico(30_000_000_000));
        let max = Rate::per_unit(u64::MAX).cost(u64::MAX);
        assert_eq!(max.0, u128::from(u64::MAX) * u128::from(u64::MAX));
    }

    #[test]
    fn the_greatest_applying_tier_wins() {
        let set = |n| RateSet::new([(P, Rate::per_1k(n))], None);
        let s = PriceSet::new(
            set(1),
            vec![
                Tier::new(vec![P, C], 200, set(3)),
                Tier::new(vec![P], 100, set(2)),
            ],
        );
        assert_eq!(s.tier(&[100, 0]), None);
        assert_eq!(s.tier(&[101, 0]).map(|t| t.above), Some(100));
        assert_eq!(s.tier(&[150, 51]).map(|t| t.above), Some(200));
        assert_eq!(s.tier(&[u64::MAX, u64::MAX]).map(|t| t.above), Some(200));
    }

    #[test]
    fn a_rate_set_keeps_one_rate_per_quantity() {
        let mut s = RateSet::new([(C, Rate::per_1k(2)), (P, Rate::per_1k(1))], None);
        s.set(C, Rate::per_1k(5));
        assert_eq!(s.rates(), &[(P, Rate::per_1k(1)), (C, Rate::per_1k(5))]);
        assert_eq!(s.get(QuantityId(7)), None);
    }
}
