//! The rating schema of issue 36 parsed into a `RateBook` (`model::rating`): usage
//! quantities and the variant attribute from `[input]`, list prices, plans and
//! assignments from `[prices]`. Not yet part of `Config` (the wiring increment).
//!
//! Invariants:
//! - **Today's `[prices]` parses unchanged** into the degenerate book: a `[prices]`
//!   table is the rating schema only when its `models` key is a table of tables
//!   (a model of today's shape named `models` holds strings, so it is never taken for
//!   one); otherwise it is today's map of models, read by today's parser
//!   (`Config::price_table`, same checks, same messages) and priced as
//!   `prompt_tokens × input + completion_tokens × output`.
//! - Every amount is an exact decimal string: a rate per 1,000 at most 9 decimals
//!   (nano-USD per 1,000 = pico-USD per unit), a rate per unit and a fee at most 12
//!   (pico-USD), a discount in percent at most 4 (parts per million). No float.
//! - Whatever is refused names its key (`prices.models.o-large.rates.cached_tokens`),
//!   and two keys that clash name both: two prices, plan versions or assignments
//!   from one instant; two tiers of one set above one size; model names that differ
//!   only by case.
//! - A rate, a tier's `on` or an override names a declared quantity; a variant a
//!   declared value other than the default; an assignment a plan (or `"list"`).

mod schema;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::Deserialize;

pub use schema::{
    AssignmentConfig, InputRatingConfig, ModelConfig, OneOrMany, PlanConfig, PricesConfig,
    QuantityConfig, RateConfig, RateUnitConfig, TierConfig, VariantConfig,
};

use super::{de_error, invalid, Config, ConfigError, PriceConfig, UtcTime};
use crate::model::rating::{
    ModelRates, PriceSet, QuantityError, QuantityId, QuantitySet, Rate, RateBook, RateSet,
    VariantAttribute,
};
use crate::model::{NanoPer1k, Pico};

/// A parsed rating: the book, and what the input mapping must read for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rating {
    pub book: RateBook,
    /// The declared quantities beyond the two defaults, in the book's id order.
    pub quantities: Vec<QuantityInput>,
    /// The variant attribute's name and configured pointer.
    pub variant: Option<(String, Option<String>)>,
}

/// Where the input mapping reads a declared quantity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityInput {
    pub name: String,
    /// `None`: the default place (`/<name>`, CloudEvents `/data/<name>`).
    pub pointer: Option<String>,
    pub required: bool,
}

/// The name of the plan that means "list prices" in an assignment.
pub const LIST: &str = "list";

/// The rating of a whole config file (its `[input]` and `[prices]`).
pub fn from_toml(text: &str) -> Result<Rating, ConfigError> {
    let file: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Parse(e.message().to_string()))?;
    let table = |k: &str| match file.get(k) {
        Some(toml::Value::Table(t)) => Ok(t.clone()),
        None => Ok(toml::Table::new()),
        Some(_) => Err(invalid(k, "is not a table")),
    };
    parse(&table("input")?, &table("prices")?)
}

/// The book of a rating's tables as `Config::rating_source` writes them (a checkpoint
/// keeps them: `checkpoint::evolution::RatingParser`).
pub(crate) fn from_source(text: &str) -> Result<RateBook, String> {
    let file: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| e.message().to_string())?;
    let table = |k: &str| match file.get(k) {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => toml::Table::new(),
    };
    parse(&table("input"), &table("prices"))
        .map(|r| r.book)
        .map_err(|e| e.to_string())
}

/// Sets the rating's tables apart from a config file's `root` (before `Config`
/// reads the rest): `[input.quantities]` and `[input.variant]`, and `[prices]` when
/// it is in the rating schema (module header). `None` when there are none; then
/// the file is priced as today. A file with declarations and today's `[prices]`
/// keeps them in `root` too (the book is made from them).
pub(crate) fn split(root: &mut toml::Table) -> Option<(toml::Table, toml::Table)> {
    let mut input = toml::Table::new();
    if let Some(toml::Value::Table(t)) = root.get_mut("input") {
        for k in ["quantities", "variant"] {
            if let Some(v) = t.remove(k) {
                input.insert(k.into(), v);
            }
        }
    }
    let prices = match root.get("prices") {
        Some(toml::Value::Table(p)) if is_rating_schema(p) => match root.remove("prices") {
            Some(toml::Value::Table(p)) => p,
            _ => unreachable!("matched above"),
        },
        _ if input.is_empty() => return None,
        Some(toml::Value::Table(p)) => p.clone(),
        _ => toml::Table::new(),
    };
    Some((input, prices))
}

/// `split`'s tables put back into a config's `root` (what `tally config` prints).
pub(crate) fn merge_back(root: &mut toml::Table, input: &toml::Table, prices: &toml::Table) {
    if !input.is_empty() {
        let t = root
            .entry("input")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(t) = t {
            t.extend(input.clone());
        }
    }
    if is_rating_schema(prices) {
        root.insert("prices".into(), toml::Value::Table(prices.clone()));
    }
}

/// Whether `[prices]` is in the rating schema: its `models` key is a table of
/// tables (a model of today's shape named `models` holds strings).
fn is_rating_schema(prices: &toml::Table) -> bool {
    matches!(prices.get("models"),
        Some(toml::Value::Table(t)) if t.values().all(toml::Value::is_table))
}

/// The rating of `[input]` (only its `quantities` and `variant` keys are read) and
/// `[prices]`.
pub fn parse(input: &toml::Table, prices: &toml::Table) -> Result<Rating, ConfigError> {
    let mut mine = toml::Table::new();
    for k in ["quantities", "variant"] {
        if let Some(v) = input.get(k) {
            mine.insert(k.into(), v.clone());
        }
    }
    let input: InputRatingConfig = deserialize("input", mine)?;
    let (quantities, inputs) = quantity_set(&input)?;
    let variant = input.variant.as_ref().map(variant_attribute).transpose()?;
    let mut book = RateBook::new(quantities, variant);
    if is_rating_schema(prices) {
        let p: PricesConfig = deserialize("prices", prices.clone())?;
        if p.models.is_empty() {
            return Err(invalid(
                "prices.models",
                "no model has a price; add e.g. [prices.models.small.rates] prompt_tokens =                  \"0.00015\"",
            ));
        }
        list_prices(&mut book, &p)?;
        plans(&mut book, &p)?;
    } else {
        let p: BTreeMap<String, PriceConfig> =
            deserialize("prices", prices.clone()).map_err(|e| hint_schema(e, prices))?;
        let table = Config {
            prices: p,
            ..Config::default()
        }
        .price_table()?;
        for (model, e) in table.entries() {
            let set = RateSet::new(
                [
                    (QuantityId::PROMPT_TOKENS, Rate::per_1k(e.input.0)),
                    (QuantityId::COMPLETION_TOKENS, Rate::per_1k(e.output.0)),
                ],
                None,
            );
            let rates = ModelRates::new(PriceSet::new(set, Vec::new()), Vec::new());
            book.insert_price(model, e.effective_from_ms, rates);
        }
    }
    Ok(Rating {
        book,
        quantities: inputs,
        variant: input.variant.map(|v| (v.name, v.pointer)),
    })
}

/// Deserializes a section, naming the key of what is wrong under `section`.
fn deserialize<T: for<'de> Deserialize<'de>>(
    section: &str,
    t: toml::Table,
) -> Result<T, ConfigError> {
    T::deserialize(toml::Value::Table(t)).map_err(|e| match de_error(&e) {
        (msg, Some(key)) => invalid(format!("{section}.{key}"), msg),
        (msg, None) => invalid(section, msg),
    })
}

/// A `[prices]` of today's shape that fails on a key of the rating schema says so.
fn hint_schema(e: ConfigError, prices: &toml::Table) -> ConfigError {
    let new = ["plans", "assignments", "models"];
    match e {
        ConfigError::Invalid { key, msg } if new.iter().any(|k| prices.contains_key(*k)) => {
            let msg = format!(
                "{msg}. (Prices with `plans` or `assignments` use the rating schema: every model \
                 under [prices.models.<name>])"
            );
            ConfigError::Invalid { key, msg }
        }
        e => e,
    }
}

/// A quantity's or an attribute's name: it appears in keys, results and columns.
fn check_name(key: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("{name:?} is not a name of lower-case letters, digits and `_` (at most 64)"),
    ))
}

fn check_pointer(key: &str, pointer: &Option<String>) -> Result<(), ConfigError> {
    let Some(p) = pointer else { return Ok(()) };
    let tokens = crate::model::input::pointer::parse(p).map_err(|m| invalid(key, m))?;
    if tokens.is_empty() {
        return Err(invalid(key, "is \"\", the whole record; point at a member"));
    }
    Ok(())
}

fn quantity_set(c: &InputRatingConfig) -> Result<(QuantitySet, Vec<QuantityInput>), ConfigError> {
    let mut decls = Vec::new();
    let mut inputs = Vec::new();
    for (name, q) in &c.quantities {
        let key = format!("input.quantities.{name}");
        check_name(&key, name)?;
        if name == "fee" {
            return Err(invalid(
                key,
                "`fee` names a line's fees per request in the results and the sink's views; \
                 give the quantity another name",
            ));
        }
        if matches!(name.as_str(), "prompt_tokens" | "completion_tokens") {
            return Err(invalid(
                key,
                format!("is a default quantity: its pointer is `input.{name}`, and it is required"),
            ));
        }
        check_pointer(&format!("{key}.pointer"), &q.pointer)?;
        decls.push((name.as_str(), q.part_of.as_deref()));
        inputs.push(QuantityInput {
            name: name.clone(),
            pointer: q.pointer.clone(),
            required: q.required,
        });
    }
    let mut set = QuantitySet::new(&decls).map_err(|e| match &e {
        QuantityError::UnknownWhole { part, .. } | QuantityError::Cycle(part, _) => {
            invalid(format!("input.quantities.{part}.part_of"), e.to_string())
        }
        QuantityError::Duplicate(_) | QuantityError::TooMany => {
            invalid("input.quantities", e.to_string())
        }
    })?;
    for (name, q) in &c.quantities {
        let at = time(&format!("input.quantities.{name}"), &q.effective_from)?;
        if let Some(id) = set.id(name) {
            set.set_effective_from(id, at);
        }
    }
    Ok((set, inputs))
}

fn variant_attribute(v: &VariantConfig) -> Result<VariantAttribute, ConfigError> {
    check_name("input.variant.name", &v.name)?;
    check_pointer("input.variant.pointer", &v.pointer)?;
    let mut values: Vec<&str> = Vec::new();
    for (i, value) in v.values.iter().enumerate() {
        let key = format!("input.variant.values[{i}]");
        crate::model::id::check(value, crate::model::id::MAX_ID_BYTES)
            .map_err(|why| invalid(&key, format!("{value:?} is not a valid value: it {why}")))?;
        if values.contains(&value.as_str()) {
            return Err(invalid(key, format!("{value:?} is listed twice")));
        }
        values.push(value);
    }
    if !values.contains(&v.default.as_str()) {
        return Err(invalid(
            "input.variant.default",
            format!("{:?} is not one of input.variant.values", v.default),
        ));
    }
    values.sort();
    Ok(VariantAttribute {
        name: v.name.as_str().into(),
        values: values.into_iter().map(Into::into).collect(),
        default: v.default.as_str().into(),
        effective_from_ms: time("input.variant", &v.effective_from)?,
    })
}

/// An exact decimal USD string with at most `places` decimals, in units of
/// 10^-places USD.
fn usd(key: &str, s: &str, places: usize) -> Result<u64, ConfigError> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) || (s.contains('.') && frac.is_empty()) {
        return Err(invalid(
            key,
            format!("{s:?} is not a plain decimal number like \"0.01\""),
        ));
    }
    if frac.len() > places {
        return Err(invalid(
            key,
            format!("{s:?} has more than {places} decimal places"),
        ));
    }
    let scale = 10u64.pow(places as u32);
    let frac: u64 = format!("{frac:0<places$}").parse().unwrap_or(0);
    int.parse::<u64>()
        .ok()
        .and_then(|i| i.checked_mul(scale))
        .and_then(|v| v.checked_add(frac))
        .ok_or_else(|| invalid(key, format!("{s:?} is too large")))
}

fn rate(key: &str, r: &RateConfig) -> Result<Rate, ConfigError> {
    let per_1k = |s: &str| NanoPer1k::parse_usd(s).map_err(|m| invalid(key, m));
    match r {
        RateConfig::Per1k(s) => Ok(Rate::per_1k(per_1k(s)?.0)),
        RateConfig::Unit(u) => match (&u.per_1k, &u.per_unit) {
            (Some(s), None) => Ok(Rate::per_1k(per_1k(s)?.0)),
            (None, Some(s)) => Ok(Rate::per_unit(usd(&format!("{key}.per_unit"), s, 12)?)),
            _ => Err(invalid(
                key,
                "gives both per_1k and per_unit, or neither; give one",
            )),
        },
    }
}

fn fee(key: &str, fee: &Option<String>) -> Result<Option<Pico>, ConfigError> {
    fee.as_deref()
        .map(|s| usd(&format!("{key}.fee"), s, 12).map(|p| Pico(u128::from(p))))
        .transpose()
}

fn time(key: &str, t: &Option<UtcTime>) -> Result<i64, ConfigError> {
    match t {
        None => Ok(i64::MIN),
        Some(t) => t
            .to_ms()
            .map_err(|m| invalid(format!("{key}.effective_from"), m)),
    }
}

mod prices;
use prices::{list_prices, plans};
