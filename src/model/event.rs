//! The input event (a completed API request) and its dead-letter reasons
//! (docs/DESIGN.md §3); `model::input` parses records into it.
//!
//! Invariants:
//! - Parsing never panics and never allocates for well-formed records whose strings
//!   need no unescaping (fields borrow from the input bytes).
//! - A record is either a valid `Event` or a `DeadLetterReason` that names the
//!   offending field; the reason codes are stable (they travel in Kafka headers).
//! - Unknown fields are ignored; `null` counts as absent.

use std::borrow::Cow;
use std::fmt;

use std::sync::Arc;

/// The UTF-8 byte-order mark. JSON text must not begin with one (RFC 8259 §8.1).
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Event times before this are taken to be seconds, not milliseconds (before 1973 in ms).
pub const MIN_MILLIS_TS: i64 = 100_000_000_000;

/// A validated completed request. Times are ms since the Unix epoch, UTC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    pub request_id: Cow<'a, str>,
    pub tenant_id: Cow<'a, str>,
    pub model: Cow<'a, str>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub started_ts: Option<i64>,
    pub completed_ts: i64,
    /// What the rating reads beyond the contract of §3 (`input::extra`).
    pub extra: Extra<'a>,
}

/// The declared usage quantities' gross counts, in declaration order (empty when
/// none is declared), and the variant attribute's value (`None`: absent, or none
/// declared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra<'a> {
    pub counts: Vec<u64>,
    pub variant: Option<Cow<'a, str>>,
}

/// A field a reason names: its name, and the JSON Pointer it was read from when
/// the input mapping moved it (`None`: at `/<name>`, the default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub pointer: Option<Arc<str>>,
}

impl Field {
    /// A field at its default place.
    pub const fn named(name: &'static str) -> Self {
        Self {
            name,
            pointer: None,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pointer {
            None => write!(f, "`{}`", self.name),
            Some(p) => write!(f, "`{}` (JSON Pointer `{p}`)", self.name),
        }
    }
}

/// Why a record went to the dead-letter topic. `code()` is the stable header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterReason {
    MalformedJson(String),
    MissingField(Field),
    InvalidField(Field),
    /// An id outside the id rule (`model::id`): code `invalid_field`.
    InvalidId(Field, super::id::IdProblem),
    NegativeTokens(Field),
    UnknownModel(String),
    /// The model is known but has no price in effect at the event time.
    NoPriceInEffect(String),
    NotMilliseconds(i64),
    TooFarInFuture {
        ts: i64,
        now: i64,
    },
    Oversized {
        bytes: usize,
        limit: usize,
    },
    /// A cost or token sum would overflow.
    Overflow,
    /// The configured time source gave no timestamp (e.g. no Kafka timestamp).
    NoTimestamp,
    /// The event time's window does not fit in `i64` milliseconds.
    WindowOutOfRange(i64),
    /// A quantity's parts add up to more than it (`model::rating`). Boxed, like the
    /// two below: a reason on the hot path stays small.
    PartExceedsWhole(Box<PartExceedsWhole>),
    /// A variant value that is not declared, or that the model has no price for.
    UnknownVariant(Box<UnknownVariant>),
    /// A non-zero quantity the chosen rates do not price.
    UnpricedQuantity(Box<UnpricedQuantity>),
}

/// `DeadLetterReason::PartExceedsWhole`: the whole, its count, the first part that
/// did not fit and the sum of the whole's direct parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartExceedsWhole {
    pub whole: Arc<str>,
    pub whole_count: u64,
    pub part: Arc<str>,
    pub parts_count: u128,
}

/// `DeadLetterReason::UnknownVariant`; `declared`: the value is declared, but the
/// model has no price for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVariant {
    pub model: String,
    pub attribute: Arc<str>,
    pub value: String,
    pub declared: bool,
}

/// `DeadLetterReason::UnpricedQuantity`: the net count the model's rates miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpricedQuantity {
    pub model: String,
    pub quantity: Arc<str>,
    pub count: u64,
}

impl DeadLetterReason {
    pub fn code(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "malformed_json",
            Self::MissingField(_) => "missing_field",
            Self::InvalidField(_) | Self::InvalidId(..) => "invalid_field",
            Self::NegativeTokens(_) => "negative_tokens",
            Self::UnknownModel(_) => "unknown_model",
            Self::NoPriceInEffect(_) => "no_price_in_effect",
            Self::NotMilliseconds(_) => "timestamp_not_millis",
            Self::TooFarInFuture { .. } => "timestamp_in_future",
            Self::Oversized { .. } => "oversized_record",
            Self::Overflow => "overflow",
            Self::NoTimestamp => "no_timestamp",
            Self::WindowOutOfRange(_) => "window_out_of_range",
            Self::PartExceedsWhole(_) => "part_exceeds_whole",
            Self::UnknownVariant(_) => "unknown_variant",
            Self::UnpricedQuantity(_) => "unpriced_quantity",
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MalformedJson(e) => write!(f, "malformed JSON: {e}"),
            Self::MissingField(k) => write!(f, "missing required field {k}"),
            Self::InvalidField(k) => {
                write!(f, "field {k} has the wrong type or an invalid value")
            }
            Self::InvalidId(k, why) => write!(f, "field {k} is not a valid id: it {why}"),
            Self::NegativeTokens(k) => write!(f, "field {k} is negative"),
            Self::UnknownModel(m) => write!(f, "model {m:?} is not in the price table"),
            Self::NoPriceInEffect(m) => {
                write!(f, "model {m:?} has no price in effect at the event time")
            }
            Self::NotMilliseconds(ts) => {
                write!(f, "timestamp {ts} is not in milliseconds (before 1973)")
            }
            Self::TooFarInFuture { ts, now } => {
                write!(
                    f,
                    "timestamp {ts} is {} ms ahead of the wall clock",
                    ts - now
                )
            }
            Self::Oversized { bytes, limit } => write!(f, "record is {bytes} bytes, limit {limit}"),
            Self::Overflow => write!(f, "cost or token sum overflows"),
            Self::NoTimestamp => write!(f, "the configured time source gave no timestamp"),
            Self::WindowOutOfRange(ts) => write!(
                f,
                "timestamp {ts} is so close to the end of the 64-bit millisecond range that its window cannot be represented"
            ),
            Self::PartExceedsWhole(p) => write!(
                f,
                "quantity `{}` ({}) is less than its parts ({}, `{}` among them); a part is \
                 counted within its whole",
                p.whole, p.whole_count, p.parts_count, p.part
            ),
            Self::UnknownVariant(v) if v.declared => write!(
                f,
                "model {:?} has no price for {} = {:?}",
                v.model, v.attribute, v.value
            ),
            Self::UnknownVariant(v) => write!(
                f,
                "{} = {:?} is not a declared value (model {:?})",
                v.attribute, v.value, v.model
            ),
            Self::UnpricedQuantity(u) => write!(
                f,
                "model {:?} has no rate for quantity `{}` in effect at the event time, and the \
                 record has {} of it (never billed at zero)",
                u.model, u.quantity, u.count
            ),
        }
    }
}

/// Parses and validates one input record under the default mapping (§3).
#[cfg(test)]
pub fn parse(bytes: &[u8]) -> Result<Event<'_>, DeadLetterReason> {
    super::input::default_mapping().parse(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"request_id":"r-103","tenant_id":"acme","model":"small","prompt_tokens":1200,
 "completion_tokens":350,"started_ts":1767261640000,"completed_ts":1767261644000,"extra":[1,2]}"#;

    #[test]
    fn parses_the_documented_record_borrowing_strings() {
        let e = parse(GOOD.as_bytes()).unwrap();
        assert_eq!(e.request_id, "r-103");
        assert!(matches!(e.tenant_id, Cow::Borrowed(_)));
        assert_eq!(e.prompt_tokens, 1200);
        assert_eq!(e.completed_ts, 1_767_261_644_000);
        assert_eq!(e.started_ts, Some(1_767_261_640_000));
    }

    fn reason(s: &str) -> DeadLetterReason {
        parse(s.as_bytes()).unwrap_err()
    }

    #[test]
    fn names_what_is_wrong() {
        assert_eq!(reason("{not json").code(), "malformed_json");
        assert_eq!(reason("[1,2]").code(), "malformed_json");
        let base = |k: &str, v: &str| {
            GOOD.replacen(
                &format!("\"{k}\":"),
                &format!("\"{k}\":{v},\"_old_{k}\":"),
                1,
            )
        };
        assert_eq!(
            reason(&base("prompt_tokens", "-5")),
            DeadLetterReason::NegativeTokens(Field::named("prompt_tokens"))
        );
        assert_eq!(
            reason(&base("completion_tokens", "1.5")),
            DeadLetterReason::InvalidField(Field::named("completion_tokens"))
        );
        assert_eq!(
            reason(&base("tenant_id", "7")),
            DeadLetterReason::InvalidField(Field::named("tenant_id"))
        );
        assert_eq!(
            reason(&base("tenant_id", "\"\"")),
            DeadLetterReason::InvalidField(Field::named("tenant_id"))
        );
        assert_eq!(
            reason(&base("completed_ts", "\"soon\"")),
            DeadLetterReason::InvalidField(Field::named("completed_ts"))
        );
        assert_eq!(
            reason(&base("model", "null")),
            DeadLetterReason::MissingField(Field::named("model"))
        );
        assert_eq!(
            reason(r#"{"request_id":"x","tenant_id":"a","model":"m","prompt_tokens":1}"#),
            DeadLetterReason::MissingField(Field::named("completion_tokens"))
        );
    }

    #[test]
    fn a_byte_order_mark_is_named() {
        let with_bom = [BOM, GOOD.as_bytes()].concat();
        let e = parse(&with_bom).unwrap_err();
        assert_eq!(e.code(), "malformed_json");
        assert!(
            e.to_string().contains("byte-order mark (bytes EF BB BF)"),
            "{e}"
        );
        // Inside a string it is a character like any other.
        let inside = GOOD.replace("\"acme\"", "\"\u{feff}acme\"");
        assert_eq!(parse(inside.as_bytes()).unwrap().tenant_id, "\u{feff}acme");
    }

    #[test]
    fn escaped_strings_are_unescaped() {
        let escaped = GOOD.replace("\"acme\"", "\"ac\\u006de\"");
        let e = parse(escaped.as_bytes()).unwrap();
        assert_eq!(e.tenant_id, "acme");
    }
}
