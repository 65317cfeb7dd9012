//! The state store's values as stored — in RocksDB and, byte for byte, in the
//! checkpoint parts (`checkpoint::part`) — separate from the engine's in-memory
//! structs, so the engine can change without changing a durable byte.
//!
//! Codec: postcard 1.x (its wire format is specified and stable across 1.x:
//! varint integers, length-prefixed strings and sequences, fields in declaration
//! order, no field names). A decoder reads at most the bytes it is given; values
//! larger than `MAX_VALUE_BYTES` are refused before decoding.
//!
//! ## Compatibility
//! These structs are part of the checkpoint formats (`checkpoint::format`). Format 8
//! appends `rated` (a sequence of `StoredRatedLine`) to a window's value when the
//! window has rated lines, and only then: a value decodes as a rated window first
//! (it must be consumed exactly), else as format 6's, else as format 5's. Format 6
//! appended `first_model` and `others` to `StoredWindow`; a value that is exactly
//! a format-5 `StoredWindowV5` (no lines) is read as one, unambiguously: a format-6
//! value is longer by at least their two length bytes, and a format-5 one ends
//! before them. Its first model is `""`: one line holding its totals (folded
//! before line items), so totals stay the sums of their lines. Changing a
//! field's type, order or meaning, or adding one, is a new checkpoint format: bump
//! `checkpoint::format::VERSION`, keep a reader for the old structs (or refuse them
//! by version, naming the way out), and say so in docs/DESIGN.md §7.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::{Counters, Line, QuantityLine, RatedLine, WindowAcc, WindowPhase};
use crate::model::money::Pico;
use crate::model::rating::QuantityId;
use crate::time::Watermark;

use crate::model::NextOffset;

/// No value of the store is near this; a larger one is damage, not decoded.
pub(crate) const MAX_VALUE_BYTES: usize = 1 << 20;

/// The audit counters (`engine::Counters`), as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredCounters {
    pub consumed: u64,
    pub folded: u64,
    pub too_late: u64,
    pub dead_letter: u64,
    pub duplicate: u64,
    pub panes: u64,
    pub idle_advances: u64,
}

impl From<Counters> for StoredCounters {
    fn from(c: Counters) -> Self {
        Self {
            consumed: c.consumed,
            folded: c.folded,
            too_late: c.too_late,
            dead_letter: c.dead_letter,
            duplicate: c.duplicate,
            panes: c.panes,
            idle_advances: c.idle_advances,
        }
    }
}

impl From<StoredCounters> for Counters {
    fn from(c: StoredCounters) -> Self {
        Self {
            consumed: c.consumed,
            folded: c.folded,
            too_late: c.too_late,
            dead_letter: c.dead_letter,
            duplicate: c.duplicate,
            panes: c.panes,
            idle_advances: c.idle_advances,
        }
    }
}

/// Key `M p`: a partition's next offset, watermark and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredMeta {
    pub next_offset: i64,
    pub bound_ms: i64,
    pub max_ts: Option<i64>,
    pub forced: Option<i64>,
    pub counters: StoredCounters,
}

/// Key `T p` (format 5): the partition's event-time facts beyond the watermark —
/// the greatest `completed_ts` it has priced (what a price change must come after,
/// `checkpoint::evolution`) and the lead limit's state (`time::watermark`). A part
/// of format 4 has none: see `PartitionMeta::from_stored`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredTime {
    pub high_water: Option<i64>,
    /// The last observed event times, oldest first (empty without a lead limit).
    pub recent: Vec<i64>,
    pub held: u64,
}

/// Key `W p end tenant`: one window's accumulator, whether its on-time pane
/// fired, and its line items (format 6) in the engine's compact form
/// (`engine::acc`): the first record's model, whose line is the totals minus the
/// others, and the other lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredWindow {
    pub cost_pico: u128,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub version: u64,
    pub panes: u32,
    pub open: bool,
    pub first_model: String,
    /// In the order their models first came.
    pub others: Vec<StoredLine>,
    /// A rated window's lines (format 8, `StoredRatedLine`): appended after the
    /// fields above only when there are any, so a window priced by today's table
    /// keeps format 6's bytes.
    #[serde(skip)]
    pub rated: Vec<StoredRatedLine>,
}

/// One `(model, variant, plan)` line of a rated window (`engine::RatedLine`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredRatedLine {
    pub model: String,
    pub variant: Option<String>,
    pub plan: Option<String>,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub fee_pico: u128,
    pub fee_requests: u64,
    pub cost_pico: u128,
    /// By quantity id.
    pub items: Vec<StoredQuantityLine>,
}

/// One quantity of a rated line: its id in the rate book, name, net count, cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredQuantityLine {
    pub quantity: u16,
    pub name: String,
    pub count: u64,
    pub cost_pico: u128,
}

/// One model's line of a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredLine {
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_pico: u128,
}

/// `StoredWindow` of formats 3 to 5: no line items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredWindowV5 {
    pub cost_pico: u128,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub version: u64,
    pub panes: u32,
    pub open: bool,
}

/// `StoredWindow`, borrowing the engine's accumulator: the same bytes, without
/// copying a name (`encode_window`, at every commit of every changed window).
#[derive(Serialize)]
struct WindowOut<'a> {
    cost_pico: u128,
    prompt_tokens: u64,
    completion_tokens: u64,
    version: u64,
    panes: u32,
    open: bool,
    first_model: &'a str,
    others: OthersOut<'a>,
}

struct OthersOut<'a>(&'a [Line]);

#[derive(Serialize)]
struct LineOut<'a> {
    model: &'a str,
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    cost_pico: u128,
}

impl Serialize for OthersOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|l| LineOut {
            model: &l.model,
            requests: l.requests,
            prompt_tokens: l.prompt_tokens,
            completion_tokens: l.completion_tokens,
            cost_pico: l.cost.0,
        }))
    }
}

/// The stored value of a window: `encode(&StoredWindow)` of it, byte for byte,
/// then its rated lines if it has any.
pub(crate) fn encode_window(acc: &WindowAcc, phase: WindowPhase) -> Vec<u8> {
    let mut out = encode(&WindowOut {
        cost_pico: acc.cost.0,
        prompt_tokens: acc.prompt_tokens,
        completion_tokens: acc.completion_tokens,
        version: acc.version,
        panes: acc.panes,
        open: phase == WindowPhase::Open,
        first_model: &acc.first_model,
        others: OthersOut(&acc.others),
    });
    if let Some(lines) = acc.rated.as_deref().filter(|l| !l.is_empty()) {
        let stored: Vec<StoredRatedLine> = lines.iter().map(StoredRatedLine::of).collect();
        out.extend(encode(&stored));
    }
    out
}

impl StoredRatedLine {
    fn of(l: &RatedLine) -> Self {
        Self {
            model: l.model.to_string(),
            variant: l.variant.as_deref().map(Into::into),
            plan: l.plan.as_deref().map(Into::into),
            requests: l.requests,
            prompt_tokens: l.prompt_tokens,
            completion_tokens: l.completion_tokens,
            fee_pico: l.fee.0,
            fee_requests: l.fee_requests,
            cost_pico: l.cost.0,
            items: l
                .items
                .iter()
                .map(|q| StoredQuantityLine {
                    quantity: q.quantity.0,
                    name: q.name.to_string(),
                    count: q.count,
                    cost_pico: q.cost.0,
                })
                .collect(),
        }
    }

    fn line(&self, names: &mut Models) -> RatedLine {
        RatedLine {
            model: names.get(&self.model),
            variant: self.variant.as_deref().map(|v| names.get(v)),
            plan: self.plan.as_deref().map(|p| names.get(p)),
            requests: self.requests,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            fee: Pico(self.fee_pico),
            fee_requests: self.fee_requests,
            cost: Pico(self.cost_pico),
            items: self
                .items
                .iter()
                .map(|q| QuantityLine {
                    quantity: QuantityId(q.quantity),
                    name: names.get(&q.name),
                    count: q.count,
                    cost: Pico(q.cost_pico),
                })
                .collect(),
        }
    }
}

/// Model names shared among the windows decoded together (a handful of models
/// across many windows).
#[derive(Default)]
pub(crate) struct Models(Vec<Arc<str>>);

impl Models {
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(m) = self.0.iter().find(|m| ***m == *name) {
            return m.clone();
        }
        let m: Arc<str> = Arc::from(name);
        self.0.push(m.clone());
        m
    }
}

impl StoredWindow {
    /// A stored window of format 6 (with rated lines: 8), or exactly one of format
    /// 5 (see the header).
    pub(crate) fn decode(v: &[u8]) -> Result<Self, String> {
        if let Ok((mut w, rated)) = decode::<(StoredWindow, Vec<StoredRatedLine>)>(v) {
            w.rated = rated;
            return Ok(w);
        }
        decode::<StoredWindow>(v).or_else(|e| match decode::<StoredWindowV5>(v) {
            Ok(old) => Ok(Self {
                cost_pico: old.cost_pico,
                prompt_tokens: old.prompt_tokens,
                completion_tokens: old.completion_tokens,
                version: old.version,
                panes: old.panes,
                open: old.open,
                first_model: String::new(),
                others: Vec::new(),
                rated: Vec::new(),
            }),
            Err(_) => Err(e),
        })
    }

    pub(crate) fn acc(&self, models: &mut Models) -> WindowAcc {
        WindowAcc {
            cost: Pico(self.cost_pico),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            version: self.version,
            panes: self.panes,
            dirty: false,
            first_model: models.get(&self.first_model),
            others: self
                .others
                .iter()
                .map(|l| Line {
                    model: models.get(&l.model),
                    requests: l.requests,
                    prompt_tokens: l.prompt_tokens,
                    completion_tokens: l.completion_tokens,
                    cost: Pico(l.cost_pico),
                })
                .collect(),
            rated: (!self.rated.is_empty())
                .then(|| Box::new(self.rated.iter().map(|l| l.line(models)).collect())),
        }
    }

    pub(crate) fn phase(&self) -> WindowPhase {
        if self.open {
            WindowPhase::Open
        } else {
            WindowPhase::Fired
        }
    }
}

/// The partition meta, as the engine uses it: keys `M p` and `T p`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMeta {
    pub next_offset: NextOffset,
    /// With its lead state (`Watermark::lead_parts`); the limit itself is config.
    pub watermark: Watermark,
    pub counters: Counters,
    /// The greatest `completed_ts` priced; the outer `None`: not stored (format 4).
    pub high_water: Option<Option<i64>>,
}

impl PartitionMeta {
    /// The values of keys `M p` and `T p`.
    pub(crate) fn stored(&self) -> (StoredMeta, StoredTime) {
        let (bound_ms, max_ts, forced) = self.watermark.parts();
        let (recent, held) = self.watermark.lead_parts();
        let meta = StoredMeta {
            next_offset: self.next_offset.0,
            bound_ms,
            max_ts,
            forced,
            counters: self.counters.into(),
        };
        let time = StoredTime {
            high_water: self.high_water.flatten(),
            recent,
            held,
        };
        (meta, time)
    }

    /// The meta from its stored values; `t` is `None` for a part of format 4
    /// (`high_water` then `None`: not stored, see `PartitionTask::restore`).
    pub(crate) fn from_stored(m: StoredMeta, t: Option<StoredTime>) -> Self {
        let wm = Watermark::from_parts(m.bound_ms, m.max_ts, m.forced);
        let (watermark, high_water) = match t {
            Some(t) => (wm.with_lead_state(t.recent, t.held), Some(t.high_water)),
            None => (wm, None),
        };
        Self {
            next_offset: NextOffset(m.next_offset),
            watermark,
            counters: m.counters.into(),
            high_water,
        }
    }
}

/// Encodes a stored value (plain structs into a Vec: cannot fail).
pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).unwrap_or_default()
}

/// Decodes a stored value; the whole input must be the value.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(v: &[u8]) -> Result<T, String> {
    if v.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_VALUE_BYTES} a value can be",
            v.len()
        ));
    }
    match postcard::take_from_bytes::<T>(v) {
        Ok((t, [])) => Ok(t),
        Ok((_, rest)) => Err(format!("{} trailing bytes", rest.len())),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rated window's lines come back whole, after format 6's bytes (which a
    /// window without them keeps exactly); names are shared among the windows.
    #[test]
    fn rated_lines_round_trip_after_format_6s_bytes() {
        let line = |model: &str, plan: Option<&str>, q: u16| RatedLine {
            model: model.into(),
            variant: Some("batch".into()),
            plan: plan.map(Into::into),
            requests: 3,
            prompt_tokens: 10,
            completion_tokens: u64::MAX,
            fee: Pico(7),
            fee_requests: 2,
            cost: Pico(u128::MAX),
            items: vec![QuantityLine {
                quantity: QuantityId(q),
                name: format!("q{q}").into(),
                count: 5,
                cost: Pico(u128::MAX - 7),
            }],
        };
        let mut acc = WindowAcc {
            cost: Pico(u128::MAX),
            version: 6,
            rated: Some(Box::new(vec![line("a", None, 2), line("b", Some("p"), 0)])),
            ..WindowAcc::default()
        };
        let bytes = encode_window(&acc, WindowPhase::Fired);
        let w = StoredWindow::decode(&bytes).unwrap();
        assert_eq!(w.rated.len(), 2);
        let back = w.acc(&mut Models::default());
        acc.dirty = false;
        assert_eq!(back, acc);
        // Without rated lines the value is format 6's, byte for byte.
        acc.rated = None;
        let plain = encode_window(&acc, WindowPhase::Fired);
        assert!(bytes.starts_with(&plain) && bytes.len() > plain.len());
        assert_eq!(StoredWindow::decode(&plain).unwrap().rated, vec![]);
        // A cut rated value is an error, never a window without its lines.
        assert!(StoredWindow::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn values_round_trip_and_garbage_is_an_error() {
        let acc = WindowAcc {
            cost: Pico(u128::MAX),
            prompt_tokens: 1,
            completion_tokens: u64::MAX,
            version: 7,
            panes: 2,
            dirty: true,
            first_model: Arc::from("small"),
            others: vec![Line {
                model: Arc::from("large"),
                requests: 2,
                prompt_tokens: 1,
                completion_tokens: 5,
                cost: Pico(u128::MAX - 1),
            }],
            rated: None,
        };
        // The borrowing encoder writes what the owned struct would.
        let bytes = encode_window(&acc, WindowPhase::Open);
        let w = StoredWindow::decode(&bytes).unwrap();
        assert_eq!(encode(&w), bytes);
        assert_eq!(
            (w.first_model.as_str(), w.others.len(), w.open),
            ("small", 1, true)
        );
        let mut models = Models::default();
        let restored = w.acc(&mut models);
        assert_eq!(restored.lines(), acc.lines());
        assert_eq!((restored.cost, restored.version), (acc.cost, acc.version));
        assert!(!restored.dirty);
        assert_eq!(w.phase(), WindowPhase::Open);
        // Two windows decoded together share their model names.
        let again = w.acc(&mut models);
        assert!(Arc::ptr_eq(&restored.first_model, &again.first_model));
        // A format-5 window reads with one line of model "" holding its totals.
        let v5 = StoredWindowV5 {
            cost_pico: 9,
            prompt_tokens: 2,
            completion_tokens: 3,
            version: 4,
            panes: 1,
            open: false,
        };
        let old = StoredWindow::decode(&encode(&v5)).unwrap();
        assert_eq!(old.phase(), WindowPhase::Fired);
        let lines = old.acc(&mut models).lines();
        assert_eq!(lines.len(), 1);
        assert_eq!(
            (
                &*lines[0].model,
                lines[0].requests,
                lines[0].cost,
                lines[0].completion_tokens
            ),
            ("", 4, Pico(9), 3)
        );
        // A format-6 value with no other lines is not mistaken for a format-5 one.
        let one = StoredWindow {
            others: vec![],
            ..w.clone()
        };
        assert_eq!(StoredWindow::decode(&encode(&one)).unwrap(), one);
        assert!(StoredWindow::decode(&encode(&one)[..10]).is_err());
        let mut wm = Watermark::new(5_000, Some(60_000));
        wm.observe(10_000);
        wm.force(7_000);
        wm.observe(11_000);
        wm.observe(12_000);
        wm.observe(10_000_000);
        assert_eq!(wm.held(), 1);
        let meta = PartitionMeta {
            next_offset: NextOffset(42),
            watermark: wm.with_max_lead(None),
            counters: Counters {
                consumed: 3,
                ..Counters::default()
            },
            high_water: Some(Some(12_000)),
        };
        let (stored, time) = meta.stored();
        let back: StoredMeta = decode(&encode(&stored)).unwrap();
        let back_time: StoredTime = decode(&encode(&time)).unwrap();
        assert_eq!(PartitionMeta::from_stored(back, Some(back_time)), meta);
        // Format 4 had no `T` key: no lead state, the high water not stored.
        let old = PartitionMeta::from_stored(back, None);
        assert_eq!((old.high_water, old.watermark.held()), (None, 0));
        // Truncated, trailing bytes, a crafted huge value.
        let bytes = encode(&stored);
        assert!(decode::<StoredMeta>(&bytes[..bytes.len() - 1]).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode::<StoredMeta>(&long)
            .unwrap_err()
            .contains("trailing"));
        assert!(decode::<StoredMeta>(&vec![0xFF; MAX_VALUE_BYTES + 1]).is_err());
    }
}
