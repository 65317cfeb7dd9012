//! Compatible config evolution: whether a checkpoint written under one
//! configuration may be restored under another (docs/DESIGN.md §7.4).
//!
//! Invariants:
//! - `Semantics` is everything that decides what tally emits for a record; its
//!   sha256 is the config fingerprint. Equal fingerprints restore, as always.
//! - A change is **compatible** when it cannot change any output already produced:
//!   prices only, and every price entry added, removed or changed (a model's price
//!   from one `effective_from` on) takes effect strictly after the partition's
//!   high-water time — the greatest `completed_ts` it has priced, stored in the
//!   checkpoint. Every record the partition has priced was priced at or before that
//!   time, where both tables agree; every record after it is priced by the new
//!   table, exactly as a replay under the new table from the log start would. A new
//!   model is a new entry: it needs an `effective_from` after the high-water time.
//! - Anything else that differs is refused, naming the config key and the way out.
//!   Settings outside `Semantics` (connections, paths, budgets, intervals) never
//!   reach the fingerprint and are free to change.
//! - Pure: no I/O; the caller logs the changes a compatible restore names.
//!
//! ## Compatibility
//! `Semantics` is stored in manifests from checkpoint format 5 on (postcard, fields
//! in this order; adding a field is a new format). Its `input` (the input
//! mapping) is stored after the manifest body from format 7 on; a format 5 or 6
//! manifest has the default mapping, which adds nothing to the fingerprint. A manifest of format 4 has none:
//! it restores only under an equal fingerprint — or, when the running config
//! differs from it only by `watermark.max_lead` (which format 4 did not have), the
//! refusal names that key.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::EngineConfig;
use crate::model::rating::{changes, RateBook};
use crate::time::utc::format_utc_ms;

/// Everything that decides what tally emits (the fingerprint's input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Semantics {
    pub topic: String,
    pub idle_timeout_ms: Option<i64>,
    pub window_size_ms: i64,
    pub window_offset_ms: i64,
    pub allowed_lateness_ms: i64,
    pub max_out_of_orderness_ms: i64,
    pub max_future_ms: Option<i64>,
    /// `TimeSource` as its `Debug` form (`CompletedTs`).
    pub time_source: String,
    pub dedup_extra_ms: i64,
    pub max_record_bytes: u64,
    pub generation: u64,
    pub max_lead_ms: Option<i64>,
    /// Sorted by model, then `effective_from_ms`.
    pub prices: Vec<StoredPrice>,
    /// The input mapping (`InputMapping::describe`), `""` for the default. Stored
    /// after the manifest body (format 7), not in this struct's postcard layout.
    #[serde(skip)]
    pub input: String,
    /// The rating's tables as canonical TOML (`EngineConfig::rating_source`), `""`
    /// without one. Stored after the input mapping (format 8).
    #[serde(skip)]
    pub rating: String,
}

/// Reads a rating's tables (`Semantics::rating`) into its book: the config layer's
/// parser, handed down so that this layer reads no TOML.
pub type RatingParser = fn(&str) -> Result<RateBook, String>;

/// One model's price from `effective_from_ms` on, in nano-USD per 1k tokens.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StoredPrice {
    pub model: String,
    pub effective_from_ms: i64,
    pub input: u64,
    pub output: u64,
}

/// The running configuration's rules: its fingerprint and, when known, its
/// semantics (tests may use an opaque fingerprint).
#[derive(Debug, Clone)]
pub struct Rules {
    pub fingerprint: String,
    pub semantics: Option<Semantics>,
    /// How to compare two ratings entry by entry (`compare`); without it a rating
    /// that changed at all is refused.
    pub parse_rating: Option<RatingParser>,
}

impl Rules {
    pub(crate) fn of(s: Semantics) -> Self {
        Self {
            fingerprint: s.fingerprint(),
            semantics: Some(s),
            parse_rating: None,
        }
    }

    /// The same rules, comparing ratings with `parse`.
    pub(crate) fn with_rating_parser(self, parse: RatingParser) -> Self {
        Self {
            parse_rating: Some(parse),
            ..self
        }
    }

    /// Rules known only by a fingerprint: restores only under an equal one.
    pub fn opaque(fingerprint: &str) -> Self {
        Self {
            fingerprint: fingerprint.into(),
            semantics: None,
            parse_rating: None,
        }
    }
}

impl Semantics {
    pub(crate) fn of(topic: &str, e: &EngineConfig, idle_timeout_ms: Option<i64>) -> Self {
        let mut prices: Vec<StoredPrice> = e
            .prices
            .entries()
            .map(|(m, p)| StoredPrice {
                model: m.into(),
                effective_from_ms: p.effective_from_ms,
                input: p.input.0,
                output: p.output.0,
            })
            .collect();
        prices.sort();
        Self {
            topic: topic.into(),
            idle_timeout_ms,
            window_size_ms: e.window.size_ms,
            window_offset_ms: e.window.offset_ms,
            allowed_lateness_ms: e.allowed_lateness_ms,
            max_out_of_orderness_ms: e.max_out_of_orderness_ms,
            max_future_ms: e.max_future_ms,
            time_source: format!("{:?}", e.time_source),
            dedup_extra_ms: e.dedup_extra_ms,
            max_record_bytes: e.max_record_bytes as u64,
            generation: e.generation,
            max_lead_ms: e.max_lead_ms,
            prices,
            input: e.input.describe(),
            rating: e.rating_source.clone(),
        }
    }

    /// sha256 (hex) of the semantics. The text is format 4's for every field it
    /// had; `max_lead` is appended only when set, so a format-4 checkpoint keeps
    /// its fingerprint under `watermark.max_lead = "off"`.
    pub(crate) fn fingerprint(&self) -> String {
        let mut prices: Vec<String> = self
            .prices
            .iter()
            .map(|p| {
                format!(
                    "{}@{}:{}/{}",
                    p.model, p.effective_from_ms, p.input, p.output
                )
            })
            .collect();
        prices.sort();
        let mut text = format!(
            "tally-fingerprint-v1|topic={}|idle={:?}|size={}|offset={}|lateness={}|bound={}|future={:?}|time={}|dedup={}|max_bytes={}|generation={}|prices={}",
            self.topic,
            self.idle_timeout_ms,
            self.window_size_ms,
            self.window_offset_ms,
            self.allowed_lateness_ms,
            self.max_out_of_orderness_ms,
            self.max_future_ms,
            self.time_source,
            self.dedup_extra_ms,
            self.max_record_bytes,
            self.generation,
            prices.join(",")
        );
        if let Some(lead) = self.max_lead_ms {
            text.push_str(&format!("|lead={lead}"));
        }
        // Likewise the input mapping, only when it is not the default, and a rating.
        if !self.input.is_empty() {
            text.push_str(&format!("|input={}", self.input));
        }
        if !self.rating.is_empty() {
            let digest = super::hex(&Sha256::digest(self.rating.as_bytes()));
            text.push_str(&format!("|rating={digest}"));
        }
        super::hex(&Sha256::digest(text.as_bytes()))
    }

    /// The non-price settings, by config key, as text.
    fn settings(&self) -> [(&'static str, String); 13] {
        let ms = |v: Option<i64>| v.map_or("off".into(), |v| format!("{v} ms"));
        [
            ("topics.input", self.topic.clone()),
            ("watermark.idle_timeout", ms(self.idle_timeout_ms)),
            ("window.size", format!("{} ms", self.window_size_ms)),
            ("window.offset", format!("{} ms", self.window_offset_ms)),
            (
                "window.allowed_lateness",
                format!("{} ms", self.allowed_lateness_ms),
            ),
            (
                "watermark.max_out_of_orderness",
                format!("{} ms", self.max_out_of_orderness_ms),
            ),
            ("watermark.max_future", ms(self.max_future_ms)),
            ("watermark.time_source", self.time_source.clone()),
            ("dedup.extra_horizon", format!("{} ms", self.dedup_extra_ms)),
            ("limits.max_record_bytes", self.max_record_bytes.to_string()),
            ("job.generation", self.generation.to_string()),
            ("watermark.max_lead", ms(self.max_lead_ms)),
            (
                "input",
                match self.input.as_str() {
                    "" => "the default mapping".into(),
                    m => m.into(),
                },
            ),
        ]
    }
}

/// Whether a partition checkpointed under `old` may restore under `new`, given its
/// high-water time: the changes to log, or the refusal (naming the key). Equal
/// semantics are compatible with no change.
pub(crate) fn compare(
    old: &Semantics,
    new: &Semantics,
    high_water: Option<i64>,
    parse_rating: Option<RatingParser>,
) -> Result<Vec<String>, String> {
    for ((key, was), (_, now)) in old.settings().into_iter().zip(new.settings()) {
        if was != now {
            return Err(format!(
                "`{key}` changed ({was} → {now}); it decides how every record is billed, so \
                 restoring state computed under the old value would mix two sets of rules"
            ));
        }
    }
    let mut changes = Vec::new();
    fn at(p: &StoredPrice) -> (&str, i64) {
        (p.model.as_str(), p.effective_from_ms)
    }
    let show = |ms: i64| match ms {
        i64::MIN => "always (no effective_from)".to_string(),
        ms => format_utc_ms(ms),
    };
    let mut check = |p: &StoredPrice, what: &str| -> Result<(), String> {
        let after = high_water.is_none_or(|h| p.effective_from_ms > h);
        let entry = format!(
            "`prices.{}` effective_from {}",
            p.model,
            show(p.effective_from_ms)
        );
        if !after {
            let hw = high_water.map_or("-".into(), |h| match h {
                i64::MAX => "unknown (checkpoint of format 4, time source not completed_ts)".into(),
                h => format_utc_ms(h),
            });
            return Err(format!(
                "{entry} was {what}, but the partition has already priced records up to {hw}: \
                 a price change must take effect after every record already billed"
            ));
        }
        changes.push(format!("{entry} {what}"));
        Ok(())
    };
    for p in &new.prices {
        match old.prices.iter().find(|o| at(o) == at(p)) {
            None => check(p, "added")?,
            Some(o) if o != p => check(p, "changed")?,
            Some(_) => {}
        }
    }
    for o in &old.prices {
        if !new.prices.iter().any(|p| at(p) == at(o)) {
            check(o, "removed")?;
        }
    }
    if old.rating != new.rating {
        changes.extend(compare_ratings(old, new, high_water, parse_rating)?);
    }
    Ok(changes)
}

/// The rule above for two ratings (docs/DESIGN.md §3.2): every entry that differs
/// (`model::rating::changes`, named by its config key) takes effect after the
/// high-water time. Switching between today's table and a rating is refused.
fn compare_ratings(
    old: &Semantics,
    new: &Semantics,
    high_water: Option<i64>,
    parse: Option<RatingParser>,
) -> Result<Vec<String>, String> {
    if old.rating.is_empty() || new.rating.is_empty() {
        return Err(
            "`prices` changed between a price table and the rating schema (or \
                    `input.quantities`/`input.variant` came or went); restoring state computed \
                    under the other would mix two sets of rules: re-bill under a new \
                    `job.generation` from the log start instead"
                .into(),
        );
    }
    let parse = parse.ok_or("the rating changed, and these rules cannot compare ratings")?;
    let (was, now) = (parse(&old.rating)?, parse(&new.rating)?);
    let mut out = Vec::new();
    for c in changes(&was, &now) {
        let what = format!("{:?}", c.what).to_lowercase();
        let from = match c.effective_from_ms {
            i64::MIN => "always (no effective_from)".to_string(),
            ms => format_utc_ms(ms),
        };
        let entry = format!("`{}` effective_from {from}", c.key);
        if high_water.is_some_and(|h| c.effective_from_ms <= h) {
            let hw = high_water.map_or("-".into(), format_utc_ms);
            return Err(format!(
                "{entry} was {what}, but the partition has already priced records up to {hw}: \
                 a rating change must take effect after every record already billed"
            ));
        }
        out.push(format!("{entry} {what}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
