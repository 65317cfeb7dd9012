//! The reference parser: the record checked as JSON as a whole, then each pointer
//! resolved by parsing the objects on its path one at a time (every member,
//! repeated ones too, in order: `Members`). Slow and plain on purpose: it decides every record the fast parser gives up on, and it is
//! what the fast parser is tested against.
//!
//! Invariants:
//! - Resolution follows RFC 6901: a token selects the object member of that name
//!   (the last one when a name is repeated, as JSON parsers commonly do) or the
//!   array element of that index; a pointer through a scalar, `null` or a missing
//!   member resolves to nothing (the field is absent).
//! - A name met more than once in an object on a field's path is reported (after
//!   type errors, before missing fields: `decide`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::fast::{Key, ValVisitor};
use super::{decide, FieldSpec, InputMapping, Val, Vals};
use crate::model::event::{DeadLetterReason, Event, BOM};

/// An object's members, repeated ones too, in order; values unparsed. Like the
/// fast parser, only what a pointer reaches is decoded: anything else needs only
/// to be well-formed JSON (a lone surrogate or `1e400` off the mapped paths is
/// not a reason).
type Members<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

/// What a token reaches: an object, an array, or a scalar that stops the path.
enum Step<'a> {
    Obj(Members<'a>),
    Arr(Vec<&'a RawValue>),
    Scalar,
}

fn step<'a>(raw: &'a RawValue) -> Result<Step<'a>, serde_json::Error> {
    Ok(match raw.get().as_bytes()[0] {
        b'{' => Step::Obj(members(raw.get())?),
        b'[' => Step::Arr(serde_json::from_str(raw.get())?),
        _ => Step::Scalar,
    })
}

fn members(text: &str) -> Result<Members<'_>, serde_json::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Members<'de>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
            let mut members = Vec::new();
            while let Some(k) = map.next_key::<Key<'de>>()? {
                members.push((k.0, map.next_value()?));
            }
            Ok(members)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let m = de.deserialize_map(V)?;
    de.end()?;
    Ok(m)
}

fn malformed(e: serde_json::Error) -> DeadLetterReason {
    DeadLetterReason::MalformedJson(e.to_string())
}

pub fn parse<'a>(m: &InputMapping, bytes: &'a [u8]) -> Result<Event<'a>, DeadLetterReason> {
    let (mut vals, repeated) = extract(&m.fields, bytes)?;
    decide(m, &mut vals, repeated)
}

/// Every field's value, and the first key repeated on a mapped path (if any), or
/// the reason the record is not a JSON object.
pub(super) fn extract<'a>(
    fields: &[FieldSpec],
    bytes: &'a [u8],
) -> Result<(Vals<'a>, Option<String>), DeadLetterReason> {
    if bytes.starts_with(BOM) {
        // serde_json would say "expected value at line 1 column 1".
        return Err(DeadLetterReason::MalformedJson(
            "the record starts with a UTF-8 byte-order mark (bytes EF BB BF), which is not \
             JSON: remove it where the record is written (typically a file saved as \"UTF-8 \
             with BOM\", or concatenated after one)"
                .into(),
        ));
    }
    let root: &'a RawValue = serde_json::from_slice(bytes).map_err(malformed)?;
    let Step::Obj(root) = step(root).map_err(malformed)? else {
        return Err(DeadLetterReason::MalformedJson("not a JSON object".into()));
    };
    let mut vals: Vals<'a> = super::absent();
    let mut repeated = None;
    for (slot, f) in fields.iter().enumerate() {
        let mut at: Option<&'a RawValue> = None;
        let mut here = Step::Obj(root.clone());
        for (depth, t) in f.tokens.iter().enumerate() {
            if depth > 0 {
                here = match at {
                    Some(raw) => step(raw).map_err(malformed)?,
                    None => Step::Scalar,
                };
            }
            at = match &here {
                Step::Obj(members) => {
                    let mut hits = members.iter().filter(|(k, _)| **k == *t.name);
                    let last = hits.next_back();
                    if repeated.is_none() && hits.next().is_some() {
                        repeated = Some(match &f.field.pointer {
                            None => format!("duplicate field `{}`", f.name),
                            Some(p) => format!(
                                "duplicate key `{}` on the path of `{}` (JSON Pointer `{p}`)",
                                t.name, f.name
                            ),
                        });
                    }
                    last.map(|(_, v)| *v)
                }
                Step::Arr(items) => t.index.and_then(|i| items.get(i).copied()),
                Step::Scalar => None,
            };
        }
        vals[slot] = match at {
            None => Val::Absent,
            Some(raw) => {
                let mut de = serde_json::Deserializer::from_str(raw.get());
                de.deserialize_any(ValVisitor).map_err(malformed)?
            }
        };
    }
    Ok((vals, repeated))
}
