//! Rating (issue 36): what one request costs, from any number of usage quantities,
//! rates per quantity, request-size tiers, variants and tenant plans — exact,
//! effective-dated, replayable. Pure: no I/O, no clock, no float.
//!
//! `RateBook::rate` maps `(tenant, event time, model, variant value, quantities)` to
//! `Rated` line items or a `Rejection`. Invariants:
//! - Every amount is an integer of pico-USD (`Pico`, `u128`); a line costs
//!   `net count × pico per unit` (`rates`), a plan's discount is rounded in one place
//!   (`plans::discount`), and `sum(line costs) + fee == total`, exactly. A sum that
//!   leaves `u128` is `Rejection::Overflow`, never a wrap or a saturation.
//! - Everything is chosen at the event time: the list price of the model in effect
//!   then, the tenant's plan assignment in effect then, that plan's version in effect
//!   then. Nothing depends on the wall clock or on other requests, so a replay rates
//!   identically.
//! - Rejections are checked in this order, the first one found reported: a part
//!   larger than its whole; an unknown model, or one with no price in effect; a variant
//!   value that is not declared or that the model does not price; a non-zero net count
//!   the chosen rate set has no rate for (`unpriced_quantity`, never billed at zero);
//!   overflow. Each maps onto a dead-letter reason (`From<Rejection>`).
//! - With the default quantities, no variant, no plan and no tier (today's price
//!   table, `RateBook::from_price_table`), the total is today's
//!   `prompt × input + completion × output`.

mod book;
pub(crate) mod changes;
pub(crate) mod plans;
pub(crate) mod quantities;
pub(crate) mod rates;

#[cfg(test)]
mod examples;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod reference;

use std::fmt;
use std::sync::Arc;

use super::{DeadLetterReason, Pico};

pub use book::{RateBook, Request};
pub use changes::{changes, Change, What};
pub use plans::{discount, Plan, PlanVersion, PPM};
pub use quantities::{QuantityError, QuantityId, QuantitySet, MAX_QUANTITIES};
pub use rates::{ModelRates, PriceSet, Rate, RateSet, Tier, Unit, VariantAttribute};

/// One quantity's share of a rated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineItem {
    pub quantity: QuantityId,
    /// The quantity's name (shared with the `QuantitySet`).
    pub name: Arc<str>,
    /// The net count billed (module `quantities`).
    pub count: u64,
    /// After the plan's discount, if any.
    pub cost: Pico,
}

/// A rated request: its line items (each non-zero net count, in quantity order),
/// its fee and their total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rated {
    pub model: Arc<str>,
    /// The variant value priced (`None`: the default value, or no attribute declared).
    pub variant: Option<Arc<str>>,
    /// The tenant's plan, when one of its versions was in effect.
    pub plan: Option<Arc<str>>,
    /// The `above` of the tier that priced the request, if one did.
    pub tier_above: Option<u64>,
    pub lines: Vec<LineItem>,
    /// The fee per request, after the plan's discount (zero when none).
    pub fee: Pico,
    /// `sum(lines.cost) + fee`.
    pub total: Pico,
}

/// Why a request cannot be rated (module header: the order they are checked in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The direct parts of `whole` add up to more than it (`part` is the first that
    /// does not fit).
    PartExceedsWhole {
        whole: Arc<str>,
        whole_count: u64,
        part: Arc<str>,
        parts_count: u128,
    },
    UnknownModel(String),
    /// The model is known but has no price in effect at the event time.
    NoPriceInEffect(String),
    /// `declared`: whether the value is one of the attribute's declared values (then
    /// the model has no price for it).
    UnknownVariant {
        model: String,
        attribute: Arc<str>,
        value: String,
        declared: bool,
    },
    UnpricedQuantity {
        model: String,
        quantity: Arc<str>,
        count: u64,
    },
    Overflow,
}

impl Rejection {
    /// The dead-letter code (`DeadLetterReason::code`).
    pub fn code(&self) -> &'static str {
        DeadLetterReason::from(self.clone()).code()
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        DeadLetterReason::from(self.clone()).fmt(f)
    }
}

impl From<Rejection> for DeadLetterReason {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::PartExceedsWhole {
                whole,
                whole_count,
                part,
                parts_count,
            } => DeadLetterReason::PartExceedsWhole(Box::new(super::event::PartExceedsWhole {
                whole,
                whole_count,
                part,
                parts_count,
            })),
            Rejection::UnknownModel(m) => DeadLetterReason::UnknownModel(m),
            Rejection::NoPriceInEffect(m) => DeadLetterReason::NoPriceInEffect(m),
            Rejection::UnknownVariant {
                model,
                attribute,
                value,
                declared,
            } => DeadLetterReason::UnknownVariant(Box::new(super::event::UnknownVariant {
                model,
                attribute,
                value,
                declared,
            })),
            Rejection::UnpricedQuantity {
                model,
                quantity,
                count,
            } => DeadLetterReason::UnpricedQuantity(Box::new(super::event::UnpricedQuantity {
                model,
                quantity,
                count,
            })),
            Rejection::Overflow => DeadLetterReason::Overflow,
        }
    }
}
