//! The rating schema as written (issue 36): the `[input.quantities]` and
//! `[input.variant]` declarations and the `[prices]` table with `models`, `plans` and
//! `assignments`. Plain serde structs, unknown keys refused; `super` checks and
//! converts them, naming the key of what it refuses.
//!
//! One body (`ModelConfig`) serves a model's price, a schedule entry, a variant and
//! a plan's override; which of its keys a context allows is checked in `super`
//! (`effective_from` only where a price is dated, `schedule` only at the top).

use std::collections::BTreeMap;
use std::fmt;

use serde::{de, Deserialize, Serialize};

use crate::config::UtcTime;

/// `[input.quantities.<name>]`: a usage quantity beyond `prompt_tokens` and
/// `completion_tokens` (whose pointers stay `input.prompt_tokens`/`completion_tokens`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuantityConfig {
    /// Where a record has it (a JSON Pointer); absent: `/<name>` (CloudEvents
    /// `/data/<name>`).
    pub pointer: Option<String>,
    /// A record without it is a dead letter (`missing_field`); otherwise it is 0.
    pub required: bool,
    /// The quantity this one is counted within (`cached_tokens` part of
    /// `prompt_tokens`): the whole is billed net of its parts.
    pub part_of: Option<String>,
    /// From when records are read for it (absent = always); before, it is 0, as
    /// under a config without it (so adding one from a future time is compatible).
    pub effective_from: Option<UtcTime>,
}

/// `[input.variant]`: the record attribute whose value picks a model's rates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantConfig {
    /// The attribute's name, e.g. `service_tier`.
    pub name: String,
    /// Where a record has it (a JSON Pointer); absent: `/<name>`.
    #[serde(default)]
    pub pointer: Option<String>,
    /// Every value a record may carry; another is a dead letter (`unknown_variant`).
    pub values: Vec<String>,
    /// The value of a record without the attribute: a model's own rates price it.
    pub default: String,
    /// From when records' values are read (absent = always); before, every record
    /// is of the default value.
    #[serde(default)]
    pub effective_from: Option<UtcTime>,
}

/// The `[input]` keys of the rating schema (the rest of `[input]` is `InputConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InputRatingConfig {
    pub quantities: BTreeMap<String, QuantityConfig>,
    pub variant: Option<VariantConfig>,
}

/// `[prices]` in the rating schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricesConfig {
    /// The list prices, per model.
    pub models: BTreeMap<String, ModelConfig>,
    #[serde(default)]
    pub plans: BTreeMap<String, PlanConfig>,
    #[serde(default)]
    pub assignments: Vec<AssignmentConfig>,
}

/// A model's price (or a schedule entry, a variant's rates, a plan's override).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// When this price starts to apply; absent = always.
    pub effective_from: Option<UtcTime>,
    /// Shorthand for `rates.prompt_tokens` (USD per 1,000).
    pub input_per_1k: Option<String>,
    /// Shorthand for `rates.completion_tokens` (USD per 1,000).
    pub output_per_1k: Option<String>,
    /// USD per request, at most 12 decimals.
    pub fee: Option<String>,
    /// Per quantity: USD per 1,000 (`"0.002"`), or `{ per_1k = "…" }`, or
    /// `{ per_unit = "…" }` (at most 12 decimals).
    pub rates: BTreeMap<String, RateConfig>,
    /// Request-size tiers: above a size, the request is priced by the tier alone.
    pub tiers: Vec<TierConfig>,
    /// Per declared variant value (not the default): its own rates.
    pub variants: BTreeMap<String, ModelConfig>,
    /// Earlier or later prices of the model, each complete.
    pub schedule: Vec<ModelConfig>,
}

/// A rate as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum RateConfig {
    /// USD per 1,000.
    Per1k(String),
    Unit(RateUnitConfig),
}

/// `{ per_1k = "…" }` or `{ per_unit = "…" }`: exactly one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateUnitConfig {
    pub per_1k: Option<String>,
    pub per_unit: Option<String>,
}

/// `[[…tiers]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// The tier applies when the request's size is strictly greater.
    pub above: u64,
    /// The quantity, or the quantities summed, that measure the request (gross).
    pub on: OneOrMany,
    #[serde(default)]
    pub input_per_1k: Option<String>,
    #[serde(default)]
    pub output_per_1k: Option<String>,
    #[serde(default)]
    pub fee: Option<String>,
    #[serde(default)]
    pub rates: BTreeMap<String, RateConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn names(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(s) => vec![s.as_str()],
            OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// `[prices.plans.<name>]`: a version of a plan (and its schedule of others).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanConfig {
    /// When this version starts to apply; absent = always.
    pub effective_from: Option<UtcTime>,
    /// A discount on every line and fee, in percent with at most 4 decimals.
    pub discount_percent: Option<String>,
    /// Per model, what the plan overrides (any subset of the list's rates).
    pub models: BTreeMap<String, ModelConfig>,
    /// Earlier or later versions of the plan, each complete.
    pub schedule: Vec<PlanConfig>,
}

/// `[[prices.assignments]]`: from `effective_from`, `tenant` is on `plan` (`"list"`:
/// back on list prices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignmentConfig {
    pub tenant: String,
    pub plan: String,
    #[serde(default)]
    pub effective_from: Option<UtcTime>,
}

const RATE: &str = "a decimal string of USD per 1,000 (\"0.002\"), { per_1k = \"…\" } or \
     { per_unit = \"…\" }";

impl<'de> Deserialize<'de> for RateConfig {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = RateConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(RATE)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RateConfig, E> {
                Ok(RateConfig::Per1k(v.into()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RateConfig, A::Error> {
                RateUnitConfig::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RateConfig::Unit)
            }
            // No float (nor integer) becomes a price: say what is accepted.
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RateConfig, E> {
                Err(E::custom(format!("is the number {v}; write {RATE}")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RateConfig, E> {
                Err(E::custom(format!("is the number {v}; write {RATE}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RateConfig, E> {
                Err(E::custom(format!("is the number {v}; write {RATE}")))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a quantity's name or a list of them")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany::One(v.into()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<OneOrMany, A::Error> {
                Vec::<String>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(OneOrMany::Many)
            }
        }
        d.deserialize_any(V)
    }
}
