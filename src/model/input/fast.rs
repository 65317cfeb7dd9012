//! The fast parser: one pass over the record, descending only into the members on
//! a mapped path (a trie of the pointers) and skipping everything else without
//! building it. Two tiers: the hand-written `scan`, and where it gives up, a walk
//! with serde_json's borrowing deserializer.
//!
//! Invariants:
//! - Extracts exactly the `Val` that `reference` finds for every field, or gives up
//!   (`None`): on any syntax error, a root that is not an object, or a key met
//!   twice on a mapped path (the reference then decides, and names the reason).
//! - Strings borrow from the input unless they had escapes.
//! - The whole record must be UTF-8, members no pointer reaches too (as for the
//!   reference, which reads the record as one `str`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{FieldSpec, Val, Vals, MAX_FIELDS};
use crate::model::same;

/// The pointers as a trie; the root is the record's object.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub(super) root: Node,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Node {
    pub(super) children: Vec<Child>,
    /// Slot of the bit in `Walk::seen` for this node (the root has none).
    pub(super) id: usize,
}

#[derive(Debug, Clone)]
pub(super) struct Child {
    pub(super) name: Box<str>,
    pub(super) index: Option<usize>,
    pub(super) next: Next,
    /// `"name":` as a producer writes it, for `scan` to match in one compare;
    /// `None` if the name needs escapes in JSON.
    pub(super) quoted: Option<Box<[u8]>>,
}

#[derive(Debug, Clone)]
pub(super) enum Next {
    Leaf(usize),
    Node(Node),
}

/// Nested objects a mapping's pointers may pass through in all (their bits in
/// `Walk::seen` follow the fields').
pub const MAX_NODES: usize = 64 - MAX_FIELDS - 1;

impl Plan {
    /// The trie of `fields`' pointers; `None` if it needs more than `MAX_NODES`.
    pub fn new(fields: &[FieldSpec]) -> Option<Self> {
        let mut root = Node::default();
        let mut ids = MAX_FIELDS;
        for (slot, f) in fields.iter().enumerate() {
            let mut node = &mut root;
            for (depth, t) in f.tokens.iter().enumerate() {
                let last = depth + 1 == f.tokens.len();
                let pos = match node.children.iter().position(|c| c.name == t.name) {
                    Some(p) => p,
                    None => {
                        let next = if last {
                            Next::Leaf(slot)
                        } else {
                            ids += 1;
                            if ids >= 64 {
                                return None;
                            }
                            Next::Node(Node {
                                children: Vec::new(),
                                id: ids,
                            })
                        };
                        let plain = !t.name.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20);
                        node.children.push(Child {
                            name: t.name.clone(),
                            index: t.index,
                            next,
                            quoted: plain.then(|| format!("\"{}\":", t.name).into_bytes().into()),
                        });
                        node.children.len() - 1
                    }
                };
                match &mut node.children[pos].next {
                    Next::Node(n) => node = n,
                    // Overlapping pointers are refused when the mapping compiles.
                    Next::Leaf(_) => break,
                }
            }
        }
        Some(Self { root })
    }
}

/// One record's walk: the values found and the members already met.
struct Walk<'v, 'a> {
    vals: &'v mut Vals<'a>,
    /// Bit `slot` or node id: already met (a second time is a repeated key).
    seen: u64,
}

impl Walk<'_, '_> {
    fn first(&mut self, bit: usize) -> bool {
        let mask = 1u64 << bit;
        let first = self.seen & mask == 0;
        self.seen |= mask;
        first
    }
}

#[derive(Debug)]
struct GiveUp;

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("repeated key")
    }
}

/// Extracts every field's value into `vals` (all `Absent` before), or `false`
/// (module header).
#[inline]
pub fn extract<'a>(plan: &Plan, bytes: &'a [u8], vals: &mut Vals<'a>) -> bool {
    // One UTF-8 check of the whole record (RFC 8259 §8.1: JSON text is UTF-8,
    // skipped members too), then serde_json's `str` reader, which checks no
    // string again: faster than its `slice` reader (BENCHMARKS.md §1.1).
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    // The hand-written scanner first; where it gives up, serde_json's walk.
    if super::scan::extract(plan, text, vals) {
        return true;
    }
    *vals = super::absent();
    let mut de = serde_json::Deserializer::from_str(text);
    walk(plan, &mut de, vals).is_ok() && de.end().is_ok()
}

/// The walk over any serde `Deserializer` (the parsers compared in
/// `benches/parsers` drive this same code); the caller checks the end of input.
#[inline]
pub fn walk<'de, D: Deserializer<'de>>(
    plan: &Plan,
    d: D,
    vals: &mut Vals<'de>,
) -> Result<(), D::Error> {
    let mut walk = Walk { vals, seen: 0 };
    d.deserialize_map(NodeSeed {
        node: &plan.root,
        walk: &mut walk,
    })
}

struct NodeSeed<'p, 'w, 'v, 'a> {
    node: &'p Node,
    walk: &'w mut Walk<'v, 'a>,
}

impl<'a> NodeSeed<'_, '_, '_, 'a> {
    fn member<E: serde::de::Error>(
        &mut self,
        child: &Child,
        value: impl FnOnce(&mut Walk<'_, 'a>, &Next) -> Result<(), E>,
    ) -> Result<(), E> {
        let bit = match &child.next {
            Next::Leaf(slot) => *slot,
            Next::Node(n) => n.id,
        };
        if !self.walk.first(bit) {
            return Err(E::custom(GiveUp));
        }
        value(self.walk, &child.next)
    }
}

impl<'de: 'a, 'a> DeserializeSeed<'de> for NodeSeed<'_, '_, '_, 'a> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for NodeSeed<'_, '_, '_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let Some(child) = self
                .node
                .children
                .iter()
                .find(|c| same(c.name.as_bytes(), key.0.as_bytes()))
            else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            self.member(child, |walk, next| match next {
                Next::Leaf(slot) => map.next_value_seed(LeafSeed(&mut walk.vals[*slot])),
                Next::Node(node) => map.next_value_seed(NodeSeed { node, walk }),
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        loop {
            let child = self.node.children.iter().find(|c| c.index == Some(i));
            let more = match child {
                None => seq.next_element::<IgnoredAny>()?.is_some(),
                Some(child) => {
                    let mut more = false;
                    self.member(child, |walk, next| {
                        more = match next {
                            Next::Leaf(slot) => {
                                seq.next_element_seed(LeafSeed(&mut walk.vals[*slot]))?
                            }
                            Next::Node(node) => seq.next_element_seed(NodeSeed { node, walk })?,
                        }
                        .is_some();
                        Ok(())
                    })?;
                    more
                }
            };
            if !more {
                return Ok(());
            }
            i += 1;
        }
    }

    // A scalar where the mapping expects a container: the fields below are absent.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A member name, borrowed unless it had escapes.
pub struct Key<'a>(pub Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// One field's value into its slot.
struct LeafSeed<'s, 'a>(&'s mut Val<'a>);

impl<'de: 'a, 's, 'a> DeserializeSeed<'de> for LeafSeed<'s, 'a> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        *self.0 = d.deserialize_any(ValVisitor)?;
        Ok(())
    }
}

/// A JSON value as a `Val` (containers skipped, not built).
pub struct ValVisitor;

impl<'de> Visitor<'de> for ValVisitor {
    type Value = Val<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Val<'de>, E> {
        Ok(Val::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Val<'de>, E> {
        Ok(Val::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Val<'de>, E> {
        Ok(Val::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Val<'de>, E> {
        Ok(if v >= 0 {
            Val::U64(v as u64)
        } else {
            Val::I64(v)
        })
    }
    fn visit_f64<E>(self, _: f64) -> Result<Val<'de>, E> {
        Ok(Val::Other)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Val<'de>, E> {
        Ok(Val::Other)
    }
    fn visit_unit<E>(self) -> Result<Val<'de>, E> {
        Ok(Val::Null)
    }
    fn visit_none<E>(self) -> Result<Val<'de>, E> {
        Ok(Val::Null)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Val<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Val::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Val<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Val::Other)
    }
}
