//! The input mapping (docs/DESIGN.md §3.1): where each field of a record is (a JSON
//! Pointer), what its timestamps mean, and what the dedup key is — and the parser
//! that serves every mapping.
//!
//! Invariants:
//! - The default mapping is the event contract of §3 (`/request_id`, …, integer
//!   milliseconds): records, reasons and their messages are what they were before
//!   mappings existed.
//! - Two parsers, one meaning. `fast` walks the record once, looking only at the
//!   members on a mapped path (first with the hand-written `scan`, then, where that
//!   gives up, with serde_json); `reference` reads the whole record into a tree first.
//!   Both only *extract* a `Val` per field; `decide` turns the values into the event
//!   or the dead-letter reason, so the reasons cannot drift apart. Whenever `fast`
//!   cannot extract (malformed JSON, a key repeated on a mapped path, not an object)
//!   the record is parsed again by `reference`, whose reason is the one reported.
//!   `proptests` checks that both agree on random and hostile records.
//! - Reasons, in this order: malformed JSON (syntax, a byte-order mark, not an
//!   object); a field of the wrong type, in field order; a key repeated on a mapped
//!   path; a missing field (absent or `null`), an empty id or an id outside the id
//!   rule (`model::id`: length, control characters), in field order.
//! - No float on the money path: tokens must be non-negative JSON integers within
//!   u64, epoch timestamps integers within i64 (after scaling to ms); a number with a
//!   fraction or an exponent is the wrong type.
//! - Pure: no I/O.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::event::{DeadLetterReason, Event, Extra, Field};

pub use extra::ExtraDecl;

mod extra;
mod fast;
pub(crate) mod pointer;
mod reference;
pub(crate) mod render;
mod scan;

#[cfg(test)]
mod proptests;

/// `input.format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    /// A JSON object per record, the fields where the pointers say.
    #[default]
    Json,
    /// A structured-mode CloudEvents 1.0 JSON event per record.
    Cloudevents,
}

/// What an event-time field's value means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestampFormat {
    /// Integer milliseconds since the epoch (values before 1973 are refused as
    /// seconds, `timestamp_not_millis`).
    EpochMs,
    /// Integer seconds since the epoch.
    EpochS,
    /// Integer microseconds since the epoch, floored to the millisecond (values
    /// before 1973 are refused as milliseconds).
    EpochUs,
    /// An RFC 3339 string with an offset, floored to the millisecond.
    Rfc3339,
}

impl TimestampFormat {
    /// Whether a value is checked against the seconds-for-milliseconds mistake.
    pub fn guards_scale(self) -> bool {
        matches!(self, Self::EpochMs | Self::EpochUs)
    }
}

/// The `[input]` table, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InputConfig {
    pub format: InputFormat,
    pub request_id: Option<String>,
    pub tenant_id: Option<String>,
    pub model: Option<String>,
    pub prompt_tokens: Option<String>,
    pub completion_tokens: Option<String>,
    pub started_ts: Option<String>,
    pub completed_ts: Option<String>,
    /// Both timestamps' format, unless one of the two keys below says otherwise.
    pub timestamp_format: Option<TimestampFormat>,
    pub started_ts_format: Option<TimestampFormat>,
    pub completed_ts_format: Option<TimestampFormat>,
}

/// How a field's value is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string; `non_empty`: `""` is invalid.
    Str {
        non_empty: bool,
    },
    Tokens,
    Ts(TimestampFormat),
    /// CloudEvents `specversion`: the string `"1.0"`.
    SpecVersion,
}

/// Field slots, in the order reasons are looked for.
pub const REQUEST_ID: usize = 0;
pub const TENANT_ID: usize = 1;
pub const MODEL: usize = 2;
pub const PROMPT_TOKENS: usize = 3;
pub const COMPLETION_TOKENS: usize = 4;
pub const STARTED_TS: usize = 5;
pub const COMPLETED_TS: usize = 6;
/// CloudEvents only.
pub const SOURCE: usize = 7;
#[allow(dead_code)] // names the last slot, which the mapping fills by position
pub const SPECVERSION: usize = 8;
pub const MAX_FIELDS: usize = 9;

/// One mapped field.
#[derive(Debug, Clone)]
pub struct FieldSpec {
    pub name: &'static str,
    pub pointer: String,
    pub tokens: Vec<pointer::Token>,
    pub kind: Kind,
    pub required: bool,
    /// What a reason names: the field, and its pointer unless that is `/<name>`.
    pub field: Field,
}

/// A field's value as a parser found it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Val<'a> {
    #[default]
    Absent,
    Null,
    Str(Cow<'a, str>),
    U64(u64),
    /// A negative integer (non-negative ones are `U64`).
    I64(i64),
    /// A float, a boolean, an object or an array.
    Other,
    /// A timestamp field's value in ms (`decide` converts each once).
    Ms(i64),
}

pub type Vals<'a> = [Val<'a>; MAX_FIELDS];

/// Every field absent: where a parser starts.
#[inline(always)]
pub fn absent<'a>() -> Vals<'a> {
    [const { Val::Absent }; MAX_FIELDS]
}

/// A field's name, its configured pointer, its default pointers (JSON,
/// CloudEvents), its kind and whether it is required.
type Spec<'c> = (
    &'static str,
    &'c Option<String>,
    &'static str,
    &'static str,
    Kind,
    bool,
);

/// The compiled `[input]`: fixed for a job's lifetime.
#[derive(Debug, Clone)]
pub struct InputMapping {
    pub format: InputFormat,
    pub fields: Vec<FieldSpec>,
    plan: fast::Plan,
    /// The declared quantities and variant (`extra`); empty by default.
    extra: extra::ExtraMapping,
}

impl Default for InputMapping {
    fn default() -> Self {
        Self::new(&InputConfig::default()).expect("the default mapping compiles")
    }
}

/// The default mapping, shared (the contract of §3).
#[cfg(test)]
pub fn default_mapping() -> &'static InputMapping {
    static M: std::sync::OnceLock<InputMapping> = std::sync::OnceLock::new();
    M.get_or_init(InputMapping::default)
}

impl InputMapping {
    /// Compiles `[input]`; an error is `(config key, message)`.
    pub fn new(c: &InputConfig) -> Result<Self, (String, String)> {
        let ce = c.format == InputFormat::Cloudevents;
        let ts_default = c.timestamp_format.unwrap_or(if ce {
            TimestampFormat::Rfc3339
        } else {
            TimestampFormat::EpochMs
        });
        let s = |non_empty| Kind::Str { non_empty };
        #[rustfmt::skip]
        let mut specs: Vec<Spec<'_>> = vec![
            ("request_id", &c.request_id, "/request_id", "/id", s(true), true),
            ("tenant_id", &c.tenant_id, "/tenant_id", "/subject", s(true), true),
            ("model", &c.model, "/model", "/data/model", s(false), true),
            ("prompt_tokens", &c.prompt_tokens, "/prompt_tokens", "/data/prompt_tokens", Kind::Tokens, true),
            ("completion_tokens", &c.completion_tokens, "/completion_tokens", "/data/completion_tokens", Kind::Tokens, true),
            ("started_ts", &c.started_ts, "/started_ts", "/data/started_ts",
                Kind::Ts(c.started_ts_format.unwrap_or(ts_default)), false),
            ("completed_ts", &c.completed_ts, "/completed_ts", "/time",
                Kind::Ts(c.completed_ts_format.unwrap_or(ts_default)), true),
        ];
        const NONE: &Option<String> = &None;
        if ce {
            specs.push(("source", NONE, "", "/source", s(true), true));
            specs.push((
                "specversion",
                NONE,
                "",
                "/specversion",
                Kind::SpecVersion,
                true,
            ));
        }
        let mut fields = Vec::with_capacity(specs.len());
        for (name, set, json, cloud, kind, required) in specs {
            let pointer = set
                .clone()
                .unwrap_or_else(|| (if ce { cloud } else { json }).into());
            let tokens = pointer::parse(&pointer).map_err(|m| (format!("input.{name}"), m))?;
            if tokens.is_empty() {
                return Err((
                    format!("input.{name}"),
                    "is \"\", the whole record; point at a member (e.g. \"/customer/id\")".into(),
                ));
            }
            let plain = pointer == format!("/{name}");
            fields.push(FieldSpec {
                name,
                field: Field {
                    name,
                    pointer: (!plain).then(|| Arc::from(pointer.as_str())),
                },
                pointer,
                tokens,
                kind,
                required,
            });
        }
        for (i, a) in fields.iter().enumerate() {
            for b in &fields[..i] {
                let (short, long) = if a.tokens.len() <= b.tokens.len() {
                    (a, b)
                } else {
                    (b, a)
                };
                if long.tokens.starts_with(&short.tokens) {
                    return Err((
                        format!("input.{}", a.name),
                        format!(
                            "{:?} overlaps input.{} ({:?}): one field's value cannot be inside \
                             another's",
                            a.pointer, b.name, b.pointer
                        ),
                    ));
                }
            }
        }
        let plan = fast::Plan::new(&fields).ok_or_else(|| {
            (
                "input".to_string(),
                format!(
                    "the pointers pass through more than {} objects in all; point at fewer \
                     nested members",
                    fast::MAX_NODES
                ),
            )
        })?;
        Ok(Self {
            format: c.format,
            fields,
            plan,
            extra: extra::ExtraMapping::default(),
        })
    }

    /// The mapping that also reads the rating's declared quantities (their gross
    /// counts, in this order, into `Event::extra`) and variant attribute.
    pub fn with_extra(
        mut self,
        quantities: &[ExtraDecl],
        variant: Option<&ExtraDecl>,
    ) -> Result<Self, (String, String)> {
        self.extra = extra::ExtraMapping::new(self.format, &self.fields, quantities, variant)?;
        Ok(self)
    }

    /// The mapping as text, `""` for the default one: in the config fingerprint
    /// and in a refused restore's message (`checkpoint::evolution`).
    pub fn describe(&self) -> String {
        let plain = |f: &FieldSpec| {
            f.field.pointer.is_none()
                && !matches!(f.kind, Kind::Ts(t) if t != TimestampFormat::EpochMs)
        };
        if self.format == InputFormat::Json && self.fields.iter().all(plain) {
            return String::new();
        }
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|f| match f.kind {
                Kind::Ts(t) => format!("{}={} ({t:?})", f.name, f.pointer),
                _ => format!("{}={}", f.name, f.pointer),
            })
            .collect();
        format!("{:?}: {}", self.format, fields.join(", "))
    }

    /// The dedup key of a record with this `request_id` (and, for CloudEvents,
    /// `source`): what duplicates and adjustments are keyed by. CloudEvents'
    /// `source` + `id` is unique; the length first makes the pair unambiguous.
    pub fn dedup_key(&self, request_id: &str, source: &str) -> String {
        match self.format {
            InputFormat::Json => request_id.into(),
            InputFormat::Cloudevents => format!("{}:{source}:{request_id}", source.len()),
        }
    }

    /// The field in slot `i` (what a reason names).
    pub fn field(&self, i: usize) -> &Field {
        &self.fields[i].field
    }

    /// The timestamp format of slot `i` (`STARTED_TS` or `COMPLETED_TS`).
    pub fn ts_format(&self, i: usize) -> TimestampFormat {
        match self.fields[i].kind {
            Kind::Ts(f) => f,
            _ => unreachable!("slot {i} is not a timestamp"),
        }
    }

    /// Parses and validates one input record.
    #[inline]
    pub fn parse<'a>(&self, bytes: &'a [u8]) -> Result<Event<'a>, DeadLetterReason> {
        let mut vals = absent();
        let mut ev = if fast::extract(&self.plan, bytes, &mut vals) {
            decide(self, &mut vals, None)
        } else {
            reference::parse(self, bytes)
        }?;
        if !self.extra.is_empty() {
            ev.extra = self.extra.parse(bytes, false)?;
        }
        Ok(ev)
    }

    /// The reference parser alone (tests and benchmarks).
    pub fn parse_reference<'a>(&self, bytes: &'a [u8]) -> Result<Event<'a>, DeadLetterReason> {
        let mut ev = reference::parse(self, bytes)?;
        if !self.extra.is_empty() {
            ev.extra = self.extra.parse(bytes, true)?;
        }
        Ok(ev)
    }
}

/// The event the values make, or the first reason (module header), given the
/// first key repeated on a mapped path, if any.
fn decide<'a>(
    m: &InputMapping,
    vals: &mut Vals<'a>,
    repeated: Option<String>,
) -> Result<Event<'a>, DeadLetterReason> {
    check(&m.fields, vals, repeated)?;
    let take_str = |v: &mut Val<'a>| match std::mem::replace(v, Val::Absent) {
        Val::Str(s) => s,
        _ => unreachable!("checked above"),
    };
    let tokens = |v: &Val<'a>| match v {
        Val::U64(n) => *n,
        _ => unreachable!("checked above"),
    };
    let ms = |v: &Val<'a>| match v {
        Val::Ms(ms) => Some(*ms),
        _ => None,
    };
    let mut request_id = take_str(&mut vals[REQUEST_ID]);
    if m.format == InputFormat::Cloudevents {
        let source = take_str(&mut vals[SOURCE]);
        request_id = Cow::Owned(m.dedup_key(&request_id, &source));
    }
    Ok(Event {
        request_id,
        tenant_id: take_str(&mut vals[TENANT_ID]),
        model: take_str(&mut vals[MODEL]),
        prompt_tokens: tokens(&vals[PROMPT_TOKENS]),
        completion_tokens: tokens(&vals[COMPLETION_TOKENS]),
        started_ts: ms(&vals[STARTED_TS]),
        completed_ts: ms(&vals[COMPLETED_TS]).expect("checked above"),
        extra: Extra::default(),
    })
}

/// The checks of `decide` before the values make an event (module header: the
/// order of reasons): each value of its field's kind, no key repeated, every
/// required field present, every id within the id rule. Timestamps become `Ms`.
#[inline]
fn check<'a>(
    fields: &[FieldSpec],
    vals: &mut Vals<'a>,
    repeated: Option<String>,
) -> Result<(), DeadLetterReason> {
    let n = fields.len();
    for (f, v) in fields.iter().zip(&mut vals[..n]) {
        let bad = match (f.kind, &*v) {
            (_, Val::Absent | Val::Null) => false,
            (Kind::Str { .. }, Val::Str(_)) => false,
            (Kind::SpecVersion, Val::Str(s)) => s != "1.0",
            (Kind::Tokens, Val::U64(_)) => false,
            (Kind::Tokens, Val::I64(_)) => {
                return Err(DeadLetterReason::NegativeTokens(f.field.clone()))
            }
            (Kind::Ts(t), _) => match ts_ms(t, v) {
                Some(ms) => {
                    *v = Val::Ms(ms);
                    false
                }
                None => true,
            },
            _ => true,
        };
        if bad {
            return Err(DeadLetterReason::InvalidField(f.field.clone()));
        }
    }
    if let Some(msg) = repeated {
        return Err(DeadLetterReason::MalformedJson(msg));
    }
    for (f, v) in fields.iter().zip(&vals[..n]) {
        match v {
            Val::Absent | Val::Null if f.required => {
                return Err(DeadLetterReason::MissingField(f.field.clone()))
            }
            Val::Str(s) if s.is_empty() && matches!(f.kind, Kind::Str { non_empty: true }) => {
                return Err(DeadLetterReason::InvalidField(f.field.clone()))
            }
            Val::Str(s) if matches!(f.kind, Kind::Str { .. }) => {
                if let Err(why) = super::id::check(s, super::id::MAX_ID_BYTES) {
                    return Err(DeadLetterReason::InvalidId(f.field.clone(), why));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A timestamp value in ms, if it is one of its format.
fn ts_ms(t: TimestampFormat, v: &Val<'_>) -> Option<i64> {
    let int = match v {
        Val::U64(n) => i64::try_from(*n).ok(),
        Val::I64(n) => Some(*n),
        _ => None,
    };
    match t {
        TimestampFormat::EpochMs => int,
        TimestampFormat::EpochS => int?.checked_mul(1000),
        TimestampFormat::EpochUs => Some(int?.div_euclid(1000)),
        TimestampFormat::Rfc3339 => match v {
            Val::Str(s) => crate::time::utc::parse_event_rfc3339(s),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests;
