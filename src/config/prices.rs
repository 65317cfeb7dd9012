//! The `[prices]` section: per model, prices as exact decimal strings, each from
//! an `effective_from` (docs/DESIGN.md §3 "Price table").
//!
//! Invariants:
//! - A record's `model` is matched to a model name by exact bytes (`PriceTable`):
//!   `Small` in a record is not `small`.
//! - Model names that differ only by case (`Small`, `small`) are refused, naming
//!   both keys: records could tell them apart, but an environment variable
//!   (`TALLY_PRICES__SMALL__…`, matched without regard to case, `env`) could not.
//! - Two prices of one model from the same instant are refused, naming both.
//! - A model name outside the id rule (`model::id`: at most 256 bytes, no control
//!   character) is refused: no record could name it.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use super::{invalid, Config, ConfigError};
use crate::model::{NanoPer1k, PriceEntry, PriceTable};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    pub input_per_1k: String,
    pub output_per_1k: String,
    /// When this price starts to apply (UTC, e.g. "2026-01-01T00:00:00Z", or
    /// integer ms since the epoch); absent = always.
    #[serde(default)]
    pub effective_from: Option<UtcTime>,
    /// Earlier or later prices of the same model.
    #[serde(default)]
    pub schedule: Vec<ScheduledPrice>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledPrice {
    pub effective_from: UtcTime,
    pub input_per_1k: String,
    pub output_per_1k: String,
}

/// A UTC time as the config writes it: `"2026-01-01T00:00:00Z"` (a string, or a
/// TOML date-time, kept as its text), or integer milliseconds since the epoch (a
/// TOML integer, or a string of digits). Anything else (a float, a table) is an
/// error saying what is accepted; the key is named by the deserializer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum UtcTime {
    Ms(i64),
    Text(String),
}

impl UtcTime {
    pub(crate) fn to_ms(&self) -> Result<i64, String> {
        match self {
            UtcTime::Ms(ms) => Ok(*ms),
            UtcTime::Text(s) => crate::time::utc::parse_utc_ms(s),
        }
    }
}

impl std::fmt::Display for UtcTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UtcTime::Ms(ms) => write!(f, "{ms}"),
            UtcTime::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// What `effective_from` accepts, for the messages.
const ACCEPTED: &str = "a time in RFC 3339 with an offset (\"2026-01-01T00:00:00Z\", \
     \"2026-01-01T01:00:00+01:00\") or integer milliseconds since the epoch (1767225600000)";

impl<'de> Deserialize<'de> for UtcTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Time;
        impl<'de> Visitor<'de> for Time {
            type Value = UtcTime;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(ACCEPTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<UtcTime, E> {
                Ok(UtcTime::Ms(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<UtcTime, E> {
                i64::try_from(v)
                    .map(UtcTime::Ms)
                    .map_err(|_| E::custom(format!("{v} ms is beyond the year 292 million")))
            }
            // Refused with a message: no float becomes a time (nor a price).
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<UtcTime, E> {
                Err(E::custom(format!(
                    "is the number {v}, which has a fraction or an exponent; write {ACCEPTED}"
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<UtcTime, E> {
                Ok(UtcTime::Text(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<UtcTime, E> {
                Err(E::custom(format!("is the boolean {v}; write {ACCEPTED}")))
            }
            // A TOML date-time arrives as a one-key map (toml's private key).
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<UtcTime, A::Error> {
                match map.next_entry::<String, toml::Value>()? {
                    Some((k, toml::Value::String(text)))
                        if k.starts_with("$__toml_private")
                            && map.next_key::<String>()?.is_none() =>
                    {
                        Ok(UtcTime::Text(text))
                    }
                    _ => Err(de::Error::custom(format!("is a table; write {ACCEPTED}"))),
                }
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<UtcTime, A::Error> {
                Err(de::Error::custom(format!("is an array; write {ACCEPTED}")))
            }
        }
        d.deserialize_any(Time)
    }
}
/// Model names outside the id rule (a record could never name them), and names
/// that differ only by case, refused naming the key (see the header).
fn refuse_case_variants(prices: &BTreeMap<String, PriceConfig>) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for model in prices.keys() {
        if let Err(why) = crate::model::id::check(model, crate::model::id::MAX_ID_BYTES) {
            return Err(invalid(
                format!("prices.{}", model.escape_debug()),
                format!(
                    "is not a valid model name: it {why}; a record's model follows the id rule \
                     (docs/DESIGN.md §3), so no record could be billed at this price"
                ),
            ));
        }
        if let Some(other) = seen.insert(model.to_lowercase(), model) {
            return Err(invalid(
                format!("prices.{model}"),
                format!(
                    "differs only by case from `prices.{other}`. A record's model must match a \
                     name exactly, so they would be two models, but a TALLY_PRICES__<MODEL>__… \
                     variable could not tell them apart. Give one of them another name (or \
                     merge them)"
                ),
            ));
        }
    }
    Ok(())
}

impl Config {
    /// The price table, parsed exactly.
    pub(crate) fn price_table(&self) -> Result<PriceTable, ConfigError> {
        if self.prices.is_empty() {
            return Err(invalid(
                "prices",
                "no model has a price; add e.g. [prices.small] input_per_1k = \"0.00015\"",
            ));
        }
        refuse_case_variants(&self.prices)?;
        let mut table = PriceTable::default();
        for (model, p) in &self.prices {
            let key = |k: &str| format!("prices.{model}.{k}");
            let price = |k: &str, v: &str| NanoPer1k::parse_usd(v).map_err(|m| invalid(key(k), m));
            let from = |k: &str, v: Option<&UtcTime>| match v {
                None => Ok(i64::MIN),
                Some(t) => t.to_ms().map_err(|m| invalid(key(k), m)),
            };
            // Two prices of one model from the same instant: which applies would
            // depend on the order of the file. Refused, naming both.
            let mut seen: Vec<(i64, String)> = Vec::with_capacity(1 + p.schedule.len());
            let mut add = |k: String, entry: PriceEntry| {
                if let Some((_, other)) = seen.iter().find(|(t, _)| *t == entry.effective_from_ms) {
                    return Err(invalid(
                        key(&k),
                        format!(
                            "takes effect at the same instant as prices.{model}.{other}; each price \
                             of a model needs its own effective_from (remove one, or move it)"
                        ),
                    ));
                }
                seen.push((entry.effective_from_ms, k));
                table.insert(model, entry);
                Ok(())
            };
            add(
                "effective_from".into(),
                PriceEntry {
                    effective_from_ms: from("effective_from", p.effective_from.as_ref())?,
                    input: price("input_per_1k", &p.input_per_1k)?,
                    output: price("output_per_1k", &p.output_per_1k)?,
                },
            )?;
            for (i, s) in p.schedule.iter().enumerate() {
                let k = |f: &str| format!("schedule[{i}].{f}");
                add(
                    k("effective_from"),
                    PriceEntry {
                        effective_from_ms: from(&k("effective_from"), Some(&s.effective_from))?,
                        input: price(&k("input_per_1k"), &s.input_per_1k)?,
                        output: price(&k("output_per_1k"), &s.output_per_1k)?,
                    },
                )?;
            }
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(
            text,
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    fn model(name: &str, input: &str) -> String {
        format!("[prices.\"{name}\"]\ninput_per_1k = \"{input}\"\noutput_per_1k = \"0.2\"\n")
    }

    /// Issue 33, item 3: `Small` and `small` are refused, naming both keys, with
    /// or without a variable that would have repriced one of them silently.
    #[test]
    fn model_names_that_differ_only_by_case_are_refused() {
        let both = model("Small", "0.1") + &model("small", "0.1");
        for env in [&[][..], &[("TALLY_PRICES__SMALL__INPUT_PER_1K", "0.2")][..]] {
            let e = load(&both, env).unwrap_err();
            let text = e.to_string();
            assert!(matches!(
                e,
                ConfigError::Invalid { .. } | ConfigError::Env { .. }
            ));
            assert!(
                text.contains("prices.Small") && text.contains("prices.small"),
                "{text}"
            );
        }
        // Unicode case too; names that differ by more than case are two models.
        let e = load(&(model("Ärger", "0.1") + &model("äRGER", "0.1")), &[]);
        assert!(e.unwrap_err().to_string().contains("differs only by case"));
        // A name no record could carry (the id rule) is refused, escaped.
        let e = load(&model("sm\\u0000all", "0.1"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("prices.sm\\0all") && e.contains("U+0000"), "{e}");
        let long = "m".repeat(257);
        assert!(load(&model(&long, "0.1"), &[])
            .unwrap_err()
            .to_string()
            .contains("at most 256"));
        let two = load(&(model("small", "0.1") + &model("small-2", "0.1")), &[]).unwrap();
        let t = two.price_table().unwrap();
        // Matching is by exact bytes.
        assert!(t.cost("small", 1000, 0, 0).is_ok());
        assert!(t.cost("Small", 1000, 0, 0).is_err());
        // One model in any case is addressed by a variable in upper case.
        let one = load(
            &model("Small", "0.1"),
            &[("TALLY_PRICES__SMALL__INPUT_PER_1K", "0.3")],
        )
        .unwrap();
        assert_eq!(one.prices["Small"].input_per_1k, "0.3");
        assert_eq!(one.prices.len(), 1);
    }

    /// A float (or any other type) in `effective_from` names the key and says what
    /// is accepted; a TOML date-time is accepted like its text.
    #[test]
    fn effective_from_of_the_wrong_type_names_the_key() {
        for (value, key) in [
            (
                "effective_from = 1767225600000.5",
                "prices.small.effective_from",
            ),
            ("effective_from = 1.5e12", "prices.small.effective_from"),
            ("effective_from = true", "prices.small.effective_from"),
            ("effective_from = [1]", "prices.small.effective_from"),
            ("effective_from = { at = 1 }", "prices.small.effective_from"),
        ] {
            let text = model("small", "0.1") + value + "\n";
            let e = load(&text, &[]).unwrap_err().to_string();
            assert!(
                e.contains(key) && e.contains("RFC 3339") && e.contains("milliseconds"),
                "{value}: {e}"
            );
        }
        let sched = model("small", "0.1")
            + "[[prices.small.schedule]]\neffective_from = 2.5\ninput_per_1k = \"0.1\"\n\
               output_per_1k = \"0.2\"\n";
        let e = load(&sched, &[]).unwrap_err().to_string();
        assert!(
            e.contains("schedule") && e.contains("effective_from"),
            "{e}"
        );
        let datetime = model("small", "0.1") + "effective_from = 2026-01-01T00:00:00Z\n";
        let t = load(&datetime, &[]).unwrap().price_table().unwrap();
        assert!(t.cost("small", 1000, 0, 1_767_225_599_999).is_err());
        assert!(t.cost("small", 1000, 0, 1_767_225_600_000).is_ok());
        let local = model("small", "0.1") + "effective_from = 2026-01-01T00:00:00\n";
        let e = load(&local, &[]).unwrap_err().to_string();
        assert!(e.contains("prices.small.effective_from"), "{e}");
    }
}
