//! The fields the rating reads besides the event contract (issue 36; DESIGN §3.1):
//! the declared usage quantities and the variant attribute.
//!
//! Invariants:
//! - Without declarations nothing more is read and `Extra` is empty: the default
//!   mapping parses exactly as before (one pass, no allocation).
//! - The extras are read after the event's own fields, by the same two parsers, in
//!   groups of at most `MAX_FIELDS` (one more pass of the fast parser each), and
//!   checked by the same `check`: so every reason of the event's own fields comes
//!   first, then the extras' in declaration order (quantities, then the variant),
//!   each kind of reason in the order of the module header of `input`.
//! - A quantity is a non-negative JSON integer within u64 (`negative_tokens`,
//!   `invalid_field` naming it); absent or `null` it is 0 unless declared required
//!   (`missing_field`). The variant is a string within the id rule; absent, the rate
//!   book takes the declared default.
//! - A pointer may not reach into another field's value, the event's own ones
//!   included (refused when the mapping compiles, naming the key).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};

use super::MAX_FIELDS;
use super::{absent, check, fast, pointer, reference, FieldSpec, InputFormat, Kind, Val};
use crate::model::event::{DeadLetterReason, Extra, Field};

/// A declared field: its name, configured pointer (`None`: `/<name>`, CloudEvents
/// `/data/<name>`) and whether a record must have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraDecl {
    pub name: String,
    pub pointer: Option<String>,
    pub required: bool,
}

/// The compiled extras: the quantities' fields, then the variant's, in groups.
#[derive(Debug, Clone, Default)]
pub(super) struct ExtraMapping {
    groups: Vec<Group>,
    quantities: usize,
    variant: bool,
}

#[derive(Debug, Clone)]
struct Group {
    fields: Vec<FieldSpec>,
    plan: fast::Plan,
}

/// A name the reasons can hold (`Field::name` is `&'static str`): each distinct
/// name is leaked once, so reloads do not leak again.
fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

impl ExtraMapping {
    /// Compiles the declarations; `own` are the event's own fields (for the overlap
    /// rule). An error is `(config key, message)`.
    pub(super) fn new(
        format: InputFormat,
        own: &[FieldSpec],
        quantities: &[ExtraDecl],
        variant: Option<&ExtraDecl>,
    ) -> Result<Self, (String, String)> {
        let mut specs: Vec<(String, FieldSpec)> = Vec::new();
        let decls = quantities
            .iter()
            .map(|d| (format!("input.quantities.{}", d.name), d, Kind::Tokens))
            .chain(variant.map(|d| {
                (
                    "input.variant".to_string(),
                    d,
                    Kind::Str { non_empty: false },
                )
            }));
        for (key, d, kind) in decls {
            let default = match format {
                InputFormat::Json => format!("/{}", d.name),
                InputFormat::Cloudevents => format!("/data/{}", d.name),
            };
            let pointer = d.pointer.clone().unwrap_or(default);
            let key = format!("{key}.pointer");
            let tokens = pointer::parse(&pointer).map_err(|m| (key.clone(), m))?;
            if tokens.is_empty() {
                return Err((key, "is \"\", the whole record; point at a member".into()));
            }
            let name = intern(&d.name);
            let plain = pointer == format!("/{name}");
            let spec = FieldSpec {
                name,
                field: Field {
                    name,
                    pointer: (!plain).then(|| Arc::from(pointer.as_str())),
                },
                pointer,
                tokens,
                kind,
                required: d.required,
            };
            let others = own.iter().chain(specs.iter().map(|(_, s)| s));
            if let Some(o) = others.into_iter().find(|o| overlaps(o, &spec)) {
                return Err((
                    key,
                    format!(
                        "{:?} overlaps the field {} ({:?}): one field's value cannot be inside \
                         another's",
                        spec.pointer, o.name, o.pointer
                    ),
                ));
            }
            specs.push((key, spec));
        }
        let mut groups = Vec::new();
        for chunk in specs.chunks(MAX_FIELDS) {
            let fields: Vec<FieldSpec> = chunk.iter().map(|(_, s)| s.clone()).collect();
            let plan = fast::Plan::new(&fields).ok_or_else(|| {
                (
                    chunk[0].0.clone(),
                    format!(
                        "the pointers pass through more than {} objects in all; point at fewer \
                         nested members",
                        fast::MAX_NODES
                    ),
                )
            })?;
            groups.push(Group { fields, plan });
        }
        Ok(Self {
            groups,
            quantities: quantities.len(),
            variant: variant.is_some(),
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The extras of a record whose own fields parsed (so it is a JSON object), by
    /// the fast parser or (`reference`) the reference one alone.
    pub(super) fn parse<'a>(
        &self,
        bytes: &'a [u8],
        reference: bool,
    ) -> Result<Extra<'a>, DeadLetterReason> {
        let mut found: Vec<Val<'a>> = Vec::with_capacity(self.quantities + 1);
        for g in &self.groups {
            let mut vals = absent();
            let repeated = if !reference && fast::extract(&g.plan, bytes, &mut vals) {
                None
            } else {
                let (v, repeated) = reference::extract(&g.fields, bytes)?;
                vals = v;
                repeated
            };
            check(&g.fields, &mut vals, repeated)?;
            found.extend(vals.into_iter().take(g.fields.len()));
        }
        let variant = match self.variant.then(|| found.pop()).flatten() {
            Some(Val::Str(s)) => Some(s),
            _ => None,
        };
        let counts = found
            .iter()
            .map(|v| match v {
                Val::U64(n) => *n,
                _ => 0,
            })
            .collect();
        Ok(Extra { counts, variant })
    }
}

/// Whether one field's pointer is a prefix of the other's.
fn overlaps(a: &FieldSpec, b: &FieldSpec) -> bool {
    let (short, long) = if a.tokens.len() <= b.tokens.len() {
        (a, b)
    } else {
        (b, a)
    };
    long.tokens.starts_with(&short.tokens)
}
