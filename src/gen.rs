//! `tally gen`: a deterministic (seeded) traffic generator, and the exact totals it implies.
//!
//! Construction (so the expected totals follow from the rules, not from the engine):
//! - record `i` has base time `start + i * step`; normal events subtract a jitter
//!   strictly below the watermark bound, so they are never late;
//! - each tenant maps to one partition (`fnv1a(tenant) % partitions`), sent with an
//!   explicit partition, so per-partition order is the generation order;
//! - a too-late event lies `size + lateness + 1 min` behind its partition's
//!   watermark, as the engine computes it from the events it folds (the same
//!   `Watermark`, lead limit included): its window was purged whatever the
//!   arrival order; a partition without a watermark yet gets none;
//! - a duplicate re-sends a recent event of the same partition (within minutes of
//!   event time: well inside the dedup horizon);
//! - malformed records cycle through the dead-letter reasons.
//!
//! Everything is a function of the seed, the options and the watermark settings
//! (where a too-late event can be placed depends on the watermark).

use std::collections::BTreeMap;

pub mod rated;

use serde::{Deserialize, Serialize};

use crate::model::input::render::{Fields, GEN_SOURCE};
use crate::model::input::{InputMapping, TimestampFormat, COMPLETED_TS};
use crate::model::PriceTable;
use crate::time::{Watermark, WindowSpec};

/// SplitMix64: small, fast, and stable across platforms and versions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
    /// True with probability `per_million / 1e6`.
    pub(crate) fn chance(&mut self, per_million: u32) -> bool {
        self.below(1_000_000) < u64::from(per_million)
    }
}

pub(crate) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[derive(Debug, Clone)]
pub(crate) struct GenOptions {
    pub seed: u64,
    pub count: u64,
    pub tenants: u32,
    /// Zipf exponent of tenant popularity, in thousandths (1000 = classic Zipf; 0 = uniform).
    pub skew_milli: u32,
    pub partitions: i32,
    pub start_ms: i64,
    /// Event-time distance between consecutive records.
    pub step_ms: i64,
    /// Out-of-orderness of normal events; must be below the watermark bound.
    pub jitter_ms: i64,
    pub late_per_million: u32,
    pub duplicate_per_million: u32,
    pub malformed_per_million: u32,
}

/// What kind of record the generator made (and so where it must end up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Normal,
    TooLate,
    Duplicate,
    Malformed(&'static str),
}

#[derive(Debug, Clone)]
pub(crate) struct GenRecord {
    pub partition: i32,
    pub key: String,
    pub payload: String,
    /// What the record is meant to be: read by the generator's own model test
    /// and written to `--records-file`.
    pub kind: Kind,
}

/// One line of `tally gen --records-file`: a generated record and where the
/// rules must route it, so a test can check a per-record account
/// (`tally explain`) against the construction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedRecord {
    pub partition: i32,
    /// The how-manieth record this run sent to the partition (its offset when
    /// the partition was empty before the run).
    pub seq: u64,
    pub key: String,
    pub payload: String,
    /// `normal` (billed into its window), `too_late`, `duplicate` or
    /// `dead_letter`.
    pub route: String,
    /// A dead letter's code.
    pub code: Option<String>,
}

impl GenRecord {
    /// This record as a `GeneratedRecord`, the `seq`-th of its partition.
    pub(crate) fn describe(&self, seq: u64) -> GeneratedRecord {
        let (route, code) = match self.kind {
            Kind::Normal => ("normal", None),
            Kind::TooLate => ("too_late", None),
            Kind::Duplicate => ("duplicate", None),
            Kind::Malformed(c) => ("dead_letter", Some(c.to_string())),
        };
        GeneratedRecord {
            partition: self.partition,
            seq,
            key: self.key.clone(),
            payload: self.payload.clone(),
            route: route.into(),
            code,
        }
    }
}

/// One expected invoice line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedWindow {
    pub tenant_id: String,
    pub window_end: i64,
    pub cost_pico: String,
    pub requests: u64,
}

/// One (tenant, window, model) invoice line the generated stream implies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedLine {
    pub tenant_id: String,
    pub window_end: i64,
    pub model: String,
    pub cost_pico: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The exact outcome the generated stream implies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    pub records: u64,
    pub windows: Vec<ExpectedWindow>,
    /// Per model, in (tenant, window end, model) order.
    #[serde(default)]
    pub lines: Vec<ExpectedLine>,
    /// Request ids of too-late events, and what they would cost.
    pub too_late: Vec<ExpectedLate>,
    pub duplicates: u64,
    pub dead_letters: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedLate {
    pub request_id: String,
    pub tenant_id: String,
    pub window_end: i64,
    pub cost_pico: String,
}

/// (cost, requests, prompt tokens, completion tokens) of an expected line.
type LineSums = (u128, u64, u64, u64);

pub(crate) struct Generator<'a> {
    opts: GenOptions,
    prices: &'a PriceTable,
    models: Vec<String>,
    window: WindowSpec,
    lateness_ms: i64,
    bound_ms: i64,
    rng: Rng,
    cumulative: Vec<f64>,
    i: u64,
    /// Each partition's watermark as the engine computes it from the records it
    /// folds (`with_max_lead` gives it the lead limit).
    marks: BTreeMap<i32, Watermark>,
    max_lead_ms: Option<i64>,
    recent: BTreeMap<i32, Vec<(String, String)>>,
    totals: BTreeMap<(String, i64), (u128, u64)>,
    /// Per (tenant, window end, model).
    lines: BTreeMap<(String, i64, String), LineSums>,
    expected: Expected,
    /// How records are written (`[input]`): the default contract unless set.
    input: InputMapping,
}

const MALFORMED: [&str; 5] = [
    "malformed_json",
    "negative_tokens",
    "unknown_model",
    "timestamp_not_millis",
    "missing_field",
];

impl<'a> Generator<'a> {
    pub fn new(
        opts: GenOptions,
        prices: &'a PriceTable,
        window: WindowSpec,
        lateness_ms: i64,
        bound_ms: i64,
    ) -> Self {
        let s = f64::from(opts.skew_milli) / 1000.0;
        let mut acc = 0.0;
        let cumulative = (1..=opts.tenants.max(1))
            .map(|k| {
                acc += 1.0 / f64::from(k).powf(s);
                acc
            })
            .collect();
        Self {
            rng: Rng::new(opts.seed),
            models: prices.models().map(str::to_string).collect(),
            opts,
            prices,
            window,
            lateness_ms,
            bound_ms,
            cumulative,
            i: 0,
            marks: BTreeMap::new(),
            max_lead_ms: None,
            recent: BTreeMap::new(),
            totals: BTreeMap::new(),
            lines: BTreeMap::new(),
            expected: Expected::default(),
            input: InputMapping::default(),
        }
    }

    /// Models the watermark with the lead limit `max_lead_ms` (the engine's
    /// `EngineConfig::max_lead_ms`), so that too-late events are too late there.
    pub(crate) fn with_max_lead(mut self, max_lead_ms: Option<i64>) -> Self {
        self.max_lead_ms = max_lead_ms;
        self
    }

    /// Writes records the way `input` reads them (a custom mapping, CloudEvents).
    pub(crate) fn with_input(mut self, input: InputMapping) -> Self {
        self.input = input;
        self
    }

    fn tenant(&mut self) -> String {
        let total = *self.cumulative.last().unwrap_or(&1.0);
        let x = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let k = self.cumulative.partition_point(|c| *c <= x);
        format!("tenant-{:03}", k.min(self.cumulative.len() - 1))
    }

    fn event_json(
        &self,
        id: &str,
        tenant: &str,
        model: &str,
        prompt: u64,
        completion: u64,
        ts: i64,
    ) -> String {
        self.input.render(&Fields {
            request_id: id,
            tenant_id: Some(tenant),
            model,
            prompt_tokens: prompt as i64,
            completion_tokens: completion as i64,
            started_ts: ts - 1_500,
            completed_ts: ts,
            completed_raw: None,
        })
    }

    /// The expected outcome of everything generated so far.
    pub(crate) fn expected(&self) -> Expected {
        let mut e = self.expected.clone();
        e.windows = self
            .totals
            .iter()
            .map(|((t, end), (cost, n))| ExpectedWindow {
                tenant_id: t.clone(),
                window_end: *end,
                cost_pico: cost.to_string(),
                requests: *n,
            })
            .collect();
        e.lines = self
            .lines
            .iter()
            .map(|((t, end, m), (cost, n, p, c))| ExpectedLine {
                tenant_id: t.clone(),
                window_end: *end,
                model: m.clone(),
                cost_pico: cost.to_string(),
                requests: *n,
                prompt_tokens: *p,
                completion_tokens: *c,
            })
            .collect();
        e
    }

    /// A malformed record of a random kind (counted as that dead letter), and its
    /// reason.
    fn malformed(
        &mut self,
        id: &str,
        tenant: &str,
        model: &str,
        (prompt, completion): (u64, u64),
        base: i64,
    ) -> (String, &'static str) {
        let reason = MALFORMED[self.rng.below(MALFORMED.len() as u64) as usize];
        // A seconds value only where the format is milliseconds.
        let millis = self.input.ts_format(COMPLETED_TS) == TimestampFormat::EpochMs;
        let reason = match reason {
            "timestamp_not_millis" if !millis => "missing_field",
            r => r,
        };
        let f = Fields {
            request_id: id,
            tenant_id: Some(tenant),
            model,
            prompt_tokens: prompt as i64,
            completion_tokens: completion as i64,
            started_ts: base - 1_500,
            completed_ts: base,
            completed_raw: None,
        };
        let payload = match reason {
            "malformed_json" => {
                let good = self.input.render(&f);
                good[..good.len() / 2].to_string()
            }
            "negative_tokens" => self.input.render(&Fields {
                prompt_tokens: -7,
                ..f
            }),
            "unknown_model" => self.input.render(&Fields {
                model: "no-such-model",
                ..f
            }),
            "timestamp_not_millis" => self.input.render(&Fields {
                completed_raw: Some(base / 1000),
                ..f
            }),
            _ => self.input.render(&Fields {
                tenant_id: None,
                ..f
            }),
        };
        *self
            .expected
            .dead_letters
            .entry(reason.to_string())
            .or_default() += 1;
        (payload, reason)
    }

    fn next_record(&mut self) -> GenRecord {
        let i = self.i;
        self.i += 1;
        let base = self.opts.start_ms + i as i64 * self.opts.step_ms;
        let tenant = self.tenant();
        let partition = (fnv1a(&tenant) % self.opts.partitions.max(1) as u64) as i32;
        let model = self.models[self.rng.below(self.models.len() as u64) as usize].clone();
        let (prompt, completion) = (1 + self.rng.below(4_000), 1 + self.rng.below(2_000));
        let id = format!("req-{}-{i:09}", self.opts.seed);
        let record = |payload: String, kind| GenRecord {
            partition,
            key: tenant.clone(),
            payload,
            kind,
        };
        if self.rng.chance(self.opts.malformed_per_million) {
            let (payload, reason) =
                self.malformed(&id, &tenant, &model, (prompt, completion), base);
            return record(payload, Kind::Malformed(reason));
        }
        if self.rng.chance(self.opts.duplicate_per_million) {
            if let Some(recent) = self.recent.get(&partition).filter(|r| !r.is_empty()) {
                let (_, payload) = recent[self.rng.below(recent.len() as u64) as usize].clone();
                self.expected.duplicates += 1;
                return record(payload, Kind::Duplicate);
            }
        }
        let (bound, lead) = (self.bound_ms, self.max_lead_ms);
        let mark = self
            .marks
            .entry(partition)
            .or_insert_with(|| Watermark::new(bound, lead));
        let w = (mark.current() != i64::MIN).then(|| mark.current());
        let too_late = w.is_some() && self.rng.chance(self.opts.late_per_million);
        let ts = match (too_late, w) {
            (true, Some(w)) => w - (self.window.size_ms + self.lateness_ms + 60_000),
            _ => base - self.rng.below(self.opts.jitter_ms.max(0) as u64 + 1) as i64,
        };
        // The event time the record can carry (whole seconds for `epoch_s`).
        let ts = self.input.ts_format(COMPLETED_TS).quantize(ts);
        let payload = self.event_json(&id, &tenant, &model, prompt, completion, ts);
        // Pricing is by completed_ts, as in the engine.
        let cost = self
            .prices
            .cost(&model, prompt, completion, ts)
            .map(|p| p.0)
            .unwrap_or(0);
        // Generated times are within a few days of 2026: always representable.
        let end = self.window.assign(ts).map_or(i64::MAX, |w| w.end);
        let kind = if too_late {
            self.expected.too_late.push(ExpectedLate {
                request_id: self.input.dedup_key(&id, GEN_SOURCE),
                tenant_id: tenant.clone(),
                window_end: end,
                cost_pico: cost.to_string(),
            });
            Kind::TooLate
        } else {
            let t = self.totals.entry((tenant.clone(), end)).or_default();
            t.0 += cost;
            t.1 += 1;
            let l = self
                .lines
                .entry((tenant.clone(), end, model.clone()))
                .or_default();
            l.0 += cost;
            l.1 += 1;
            l.2 += prompt;
            l.3 += completion;
            if let Some(mark) = self.marks.get_mut(&partition) {
                mark.observe(ts);
            }
            Kind::Normal
        };
        let recent = self.recent.entry(partition).or_default();
        recent.push((id, payload.clone()));
        if recent.len() > 256 {
            recent.remove(0);
        }
        record(payload, kind)
    }
}

impl Iterator for Generator<'_> {
    type Item = GenRecord;
    fn next(&mut self) -> Option<GenRecord> {
        if self.i >= self.opts.count {
            return None;
        }
        let r = self.next_record();
        self.expected.records += 1;
        Some(r)
    }
}

#[cfg(test)]
mod tests;
