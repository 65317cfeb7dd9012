//! `[prices]` of the rating schema into the book: list prices per model (and their
//! schedules), plans (and theirs), assignments. Each check names its key (the
//! invariants are in `super`'s header).

use std::collections::BTreeMap;

use super::{fee, invalid, rate, time, ConfigError, ModelConfig, PlanConfig, PricesConfig, LIST};
use crate::model::rating::{
    ModelRates, PlanVersion, PriceSet, QuantityId, RateBook, RateSet, Tier, PPM,
};

/// Where a body stands, and so which of its keys it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A model's price at the top of `models`: everything.
    List,
    /// An entry of a schedule: dated, no schedule of its own.
    Scheduled,
    /// A plan's override: not dated (the plan's version is).
    Plan,
    /// A variant's rates: neither dated nor with variants.
    Variant,
}

fn refuse_keys(key: &str, m: &ModelConfig, place: Place) -> Result<(), ConfigError> {
    let why = match place {
        Place::List => None,
        Place::Scheduled if !m.schedule.is_empty() => Some("schedule"),
        Place::Scheduled if m.effective_from.is_none() => {
            return Err(invalid(
                format!("{key}.effective_from"),
                "is missing: a schedule entry is dated",
            ))
        }
        Place::Plan | Place::Variant if m.effective_from.is_some() => Some("effective_from"),
        Place::Plan | Place::Variant if !m.schedule.is_empty() => Some("schedule"),
        Place::Variant if !m.variants.is_empty() => Some("variants"),
        _ => None,
    };
    match why {
        None => Ok(()),
        Some(k) => Err(invalid(
            format!("{key}.{k}"),
            match place {
                Place::Plan => "is not allowed in a plan's model: date the plan's version instead",
                _ => "is not allowed here",
            },
        )),
    }
}

/// Model names outside the id rule, and names that differ only by case (as today).
fn check_models<'a>(
    prefix: &str,
    names: impl Iterator<Item = &'a String>,
) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for model in names {
        if let Err(why) = crate::model::id::check(model, crate::model::id::MAX_ID_BYTES) {
            return Err(invalid(
                format!("{prefix}.{}", model.escape_debug()),
                format!("is not a valid model name: it {why}; no record could name it"),
            ));
        }
        if let Some(other) = seen.insert(model.to_lowercase(), model) {
            return Err(invalid(
                format!("{prefix}.{model}"),
                format!("differs only by case from `{prefix}.{other}`; give one another name"),
            ));
        }
    }
    Ok(())
}

/// The rates a set names: `rates.*` and the two shorthands.
fn rate_set(
    q: &crate::model::rating::QuantitySet,
    key: &str,
    rates: &BTreeMap<String, super::RateConfig>,
    shorthand: [&Option<String>; 2],
    fee_text: &Option<String>,
) -> Result<RateSet, ConfigError> {
    let mut set = RateSet::new([], fee(key, fee_text)?);
    for (name, r) in rates {
        let k = format!("{key}.rates.{name}");
        let id = q.id(name).ok_or_else(|| {
            invalid(
                &k,
                format!(
                    "{name:?} is not a declared quantity (declare it under [input.quantities])"
                ),
            )
        })?;
        set.set(id, rate(&k, r)?);
    }
    let pairs = [
        ("input_per_1k", QuantityId::PROMPT_TOKENS),
        ("output_per_1k", QuantityId::COMPLETION_TOKENS),
    ];
    for ((short, id), value) in pairs.into_iter().zip(shorthand) {
        let Some(v) = value else { continue };
        let k = format!("{key}.{short}");
        if set.get(id).is_some() {
            let long = q.name(id);
            return Err(invalid(
                k,
                format!("and {key}.rates.{long} both price {long}; keep one"),
            ));
        }
        set.set(id, rate(&k, &super::RateConfig::Per1k(v.clone()))?);
    }
    Ok(set)
}

fn price_set(
    q: &crate::model::rating::QuantitySet,
    key: &str,
    m: &ModelConfig,
) -> Result<PriceSet, ConfigError> {
    let base = rate_set(
        q,
        key,
        &m.rates,
        [&m.input_per_1k, &m.output_per_1k],
        &m.fee,
    )?;
    let mut tiers: Vec<Tier> = Vec::new();
    for (i, t) in m.tiers.iter().enumerate() {
        let k = format!("{key}.tiers[{i}]");
        let mut on = Vec::new();
        for name in t.on.names() {
            let id = q.id(name).ok_or_else(|| {
                invalid(
                    format!("{k}.on"),
                    format!("{name:?} is not a declared quantity"),
                )
            })?;
            if let Some(&o) = on.iter().find(|&&o| q.overlap(o, id)) {
                return Err(invalid(
                    format!("{k}.on"),
                    format!(
                        "counts {name:?} and {:?}, one within the other: tokens would count twice",
                        q.name(o)
                    ),
                ));
            }
            on.push(id);
        }
        if on.is_empty() {
            return Err(invalid(format!("{k}.on"), "names no quantity"));
        }
        if let Some(j) = m.tiers[..i].iter().position(|o| o.above == t.above) {
            return Err(invalid(
                format!("{k}.above"),
                format!("is {} like {key}.tiers[{j}].above: which tier prices a request must not depend on order", t.above),
            ));
        }
        let set = rate_set(q, &k, &t.rates, [&t.input_per_1k, &t.output_per_1k], &t.fee)?;
        tiers.push(Tier::new(on, t.above, set));
    }
    Ok(PriceSet::new(base, tiers))
}

fn model_rates(
    book: &RateBook,
    key: &str,
    m: &ModelConfig,
    place: Place,
) -> Result<ModelRates, ConfigError> {
    refuse_keys(key, m, place)?;
    let q = book.quantities();
    let own = price_set(q, key, m)?;
    let mut variants = Vec::new();
    for (value, body) in &m.variants {
        let k = format!("{key}.variants.{value}");
        let Some(attr) = book.variant_attribute() else {
            return Err(invalid(
                k,
                "prices a variant, but no attribute is declared ([input.variant])",
            ));
        };
        if *attr.default == **value {
            return Err(invalid(
                k,
                format!(
                    "is the default value of {}: its rates are the model's own",
                    attr.name
                ),
            ));
        }
        if !attr.values.iter().any(|v| **v == **value) {
            return Err(invalid(
                k,
                format!("{value:?} is not one of input.variant.values"),
            ));
        }
        refuse_keys(&k, body, Place::Variant)?;
        variants.push((value.as_str().into(), price_set(q, &k, body)?));
    }
    Ok(ModelRates::new(own, variants))
}

/// Refuses a second entry from one instant, naming both keys.
fn once(
    seen: &mut Vec<(i64, String)>,
    at: i64,
    key: String,
    what: &str,
) -> Result<(), ConfigError> {
    if let Some((_, other)) = seen.iter().find(|(t, _)| *t == at) {
        return Err(invalid(
            format!("{key}.effective_from"),
            format!("takes effect at the same instant as {other}; each {what} needs its own effective_from"),
        ));
    }
    seen.push((at, key));
    Ok(())
}

pub(super) fn list_prices(book: &mut RateBook, p: &PricesConfig) -> Result<(), ConfigError> {
    if p.models.is_empty() {
        return Err(invalid("prices.models", "no model has a price"));
    }
    check_models("prices.models", p.models.keys())?;
    for (model, m) in &p.models {
        let key = format!("prices.models.{model}");
        let mut seen = Vec::new();
        let entries = std::iter::once((key.clone(), m, Place::List)).chain(
            m.schedule
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("{key}.schedule[{i}]"), s, Place::Scheduled)),
        );
        for (k, body, place) in entries {
            let at = time(&k, &body.effective_from)?;
            let rates = model_rates(book, &k, body, place)?;
            once(&mut seen, at, k, "price of a model")?;
            book.insert_price(model, at, rates);
        }
    }
    Ok(())
}

/// A discount in percent (at most 4 decimals, at most 100) in parts per million.
fn discount_ppm(key: &str, d: &Option<String>) -> Result<u32, ConfigError> {
    let Some(s) = d else { return Ok(0) };
    let k = format!("{key}.discount_percent");
    let v = super::usd(&k, s, 4)?;
    u32::try_from(v)
        .ok()
        .filter(|v| *v <= PPM)
        .ok_or_else(|| invalid(k, format!("{s:?} is more than 100 percent")))
}

pub(super) fn plans(book: &mut RateBook, p: &PricesConfig) -> Result<(), ConfigError> {
    for (name, plan) in &p.plans {
        let key = format!("prices.plans.{name}");
        if name == LIST {
            return Err(invalid(
                key,
                "is reserved: an assignment to \"list\" means list prices",
            ));
        }
        crate::model::id::check(name, crate::model::id::MAX_ID_BYTES)
            .map_err(|why| invalid(&key, format!("is not a valid plan name: it {why}")))?;
        let mut seen = Vec::new();
        let versions = std::iter::once((key.clone(), plan, false)).chain(
            plan.schedule
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("{key}.schedule[{i}]"), s, true)),
        );
        for (k, v, scheduled) in versions {
            plan_version(book, name, &k, v, scheduled, &mut seen)?;
        }
    }
    assignments(book, p)
}

fn plan_version(
    book: &mut RateBook,
    name: &str,
    key: &str,
    v: &PlanConfig,
    scheduled: bool,
    seen: &mut Vec<(i64, String)>,
) -> Result<(), ConfigError> {
    if scheduled && !v.schedule.is_empty() {
        return Err(invalid(format!("{key}.schedule"), "is not allowed here"));
    }
    if scheduled && v.effective_from.is_none() {
        return Err(invalid(
            format!("{key}.effective_from"),
            "is missing: a schedule entry is dated",
        ));
    }
    let at = time(key, &v.effective_from)?;
    check_models(&format!("{key}.models"), v.models.keys())?;
    let mut models = Vec::new();
    for (model, m) in &v.models {
        let k = format!("{key}.models.{model}");
        models.push((
            model.as_str().into(),
            model_rates(book, &k, m, Place::Plan)?,
        ));
    }
    let ppm = discount_ppm(key, &v.discount_percent)?;
    once(seen, at, key.to_string(), "version of a plan")?;
    book.insert_plan(name, PlanVersion::new(at, ppm, models));
    Ok(())
}

fn assignments(book: &mut RateBook, p: &PricesConfig) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<&str, Vec<(i64, String)>> = BTreeMap::new();
    for (i, a) in p.assignments.iter().enumerate() {
        let key = format!("prices.assignments[{i}]");
        if a.tenant.is_empty() {
            return Err(invalid(
                format!("{key}.tenant"),
                "is empty, not a valid tenant id",
            ));
        }
        crate::model::id::check(&a.tenant, crate::model::id::MAX_ID_BYTES).map_err(|why| {
            invalid(
                format!("{key}.tenant"),
                format!("is not a valid tenant id: it {why}"),
            )
        })?;
        if a.plan != LIST && !p.plans.contains_key(&a.plan) {
            return Err(invalid(
                format!("{key}.plan"),
                format!(
                    "{:?} is not a plan under [prices.plans] (nor \"list\")",
                    a.plan
                ),
            ));
        }
        let at = time(&key, &a.effective_from)?;
        once(
            seen.entry(&a.tenant).or_default(),
            at,
            key,
            "assignment of a tenant",
        )?;
        book.assign(&a.tenant, at, (a.plan != LIST).then_some(a.plan.as_str()));
    }
    Ok(())
}
