//! JSON parsers compared on tally's field extraction (docs/BENCHMARKS.md §1.1).
//! `fast`, `scan` and `pointer` are tally's own `src/model/input/{fast,scan,pointer}.rs`;
//! every serde parser drives the same `fast::walk`. `Val`, `Vals`, `MAX_FIELDS`,
//! `absent`, `FieldSpec` and `model::same` below stand in for tally's.

use std::borrow::Cow;

use serde::Deserialize;

#[path = "../../../src/model/input/fast.rs"]
pub mod fast;
#[path = "../../../src/model/input/pointer.rs"]
pub mod pointer;
#[path = "../../../src/model/input/scan.rs"]
pub mod scan;

pub mod model {
    /// Stands in for tally's inline short compare (`src/model/mod.rs`).
    #[inline]
    pub fn same(a: &[u8], b: &[u8]) -> bool {
        a == b
    }
}

// ---- stand-ins copied from /work/main/src/model/input/mod.rs ----

pub const MAX_FIELDS: usize = 9;

/// One mapped field (only `tokens` is used by `Plan::new`).
#[derive(Debug, Clone)]
pub struct FieldSpec {
    pub tokens: Vec<pointer::Token>,
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
}

pub type Vals<'a> = [Val<'a>; MAX_FIELDS];

pub fn absent<'a>() -> Vals<'a> {
    Vals::default()
}

// ---- shapes ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Default,
    CloudEvents,
    Nested,
}

impl Shape {
    pub fn pointers(self) -> &'static [&'static str] {
        match self {
            Shape::Default => &[
                "/request_id",
                "/tenant_id",
                "/model",
                "/prompt_tokens",
                "/completion_tokens",
                "/started_ts",
                "/completed_ts",
            ],
            Shape::CloudEvents => &[
                "/id",
                "/subject",
                "/data/model",
                "/data/prompt_tokens",
                "/data/completion_tokens",
                "/data/started_ts",
                "/time",
                "/source",
                "/specversion",
            ],
            Shape::Nested => &[
                "/req",
                "/customer/id",
                "/usage/model",
                "/usage/input_tokens",
                "/usage/output_tokens",
                "/started",
                "/time",
            ],
        }
    }

    pub fn fields(self) -> Vec<FieldSpec> {
        self.pointers()
            .iter()
            .map(|p| FieldSpec {
                tokens: pointer::parse(p).unwrap(),
            })
            .collect()
    }

    pub fn plan(self) -> fast::Plan {
        fast::Plan::new(&self.fields()).expect("the shapes fit the walk")
    }

    pub fn tree(self) -> sonic_rs::PointerTree {
        let mut t = sonic_rs::PointerTree::new();
        for f in self.fields() {
            let names: Vec<&str> = f.tokens.iter().map(|t| &*t.name).collect();
            t.add_path(names);
        }
        t
    }
}

/// Valid = all required fields present with the right types (tally's `decide`,
/// minus reasons; RFC 3339 is not parsed here). Returns a checksum of the values
/// so the work can't be optimized away and parsers can be compared.
#[inline]
pub fn summarize(shape: Shape, v: &Vals<'_>) -> Option<u64> {
    let ne_str = |v: &Val| matches!(v, Val::Str(s) if !s.is_empty());
    let is_str = |v: &Val| matches!(v, Val::Str(_));
    let tokens = |v: &Val| matches!(v, Val::U64(_));
    let ts = |v: &Val| match v {
        Val::U64(n) => *n <= i64::MAX as u64,
        Val::I64(_) => true,
        _ => false,
    };
    let opt_ts = |v: &Val| matches!(v, Val::Absent | Val::Null) || ts(v);
    let ok = ne_str(&v[0])
        && ne_str(&v[1])
        && is_str(&v[2])
        && tokens(&v[3])
        && tokens(&v[4])
        && opt_ts(&v[5])
        && match shape {
            Shape::CloudEvents => {
                is_str(&v[6])
                    && ne_str(&v[7])
                    && matches!(&v[8], Val::Str(s) if s == "1.0")
            }
            _ => ts(&v[6]),
        };
    if !ok {
        return None;
    }
    let mut h = 0u64;
    for x in v.iter() {
        let c = match x {
            Val::Absent => 1,
            Val::Null => 2,
            Val::Str(s) => {
                let b = s.as_bytes();
                (b.len() as u64) << 32 | *b.last().unwrap_or(&0) as u64
            }
            Val::U64(n) => *n,
            Val::I64(n) => *n as u64,
            Val::Other => 3,
        };
        h = h.wrapping_mul(0x100000001b3).wrapping_add(c);
    }
    Some(h)
}

// ---- the parsers ----

/// (a) serde_json::Deserializer::from_slice + the seed walk.
#[inline]
pub fn a_serde_slice<'a>(plan: &fast::Plan, b: &'a [u8]) -> Option<Vals<'a>> {
    let mut de = serde_json::Deserializer::from_slice(b);
    let v = walk_vals(plan, &mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// (b) from_utf8 then serde_json::Deserializer::from_str (fast.rs's second tier).
#[inline]
pub fn b_serde_str<'a>(plan: &fast::Plan, b: &'a [u8]) -> Option<Vals<'a>> {
    let text = std::str::from_utf8(b).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let v = walk_vals(plan, &mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// (g) what tally does now: from_utf8, the hand-written scanner, and (b) where it
/// gives up (`fast::extract`).
#[inline]
pub fn g_scan<'a>(plan: &fast::Plan, b: &'a [u8]) -> Option<Vals<'a>> {
    let mut v = Vals::default();
    fast::extract(plan, b, &mut v).then_some(v)
}

/// `fast::walk` into fresh values (every parser here pays the same move).
#[inline]
pub fn walk_vals<'de, D: serde::Deserializer<'de>>(
    plan: &fast::Plan,
    d: D,
) -> Result<Vals<'de>, D::Error> {
    let mut v = Vals::default();
    fast::walk(plan, d, &mut v)?;
    Ok(v)
}

/// (c) sonic_rs::Deserializer::from_slice + the seed walk.
#[inline]
pub fn c_sonic_slice<'a>(plan: &fast::Plan, b: &'a [u8]) -> Option<Vals<'a>> {
    let mut de = sonic_rs::Deserializer::from_slice(b);
    let v = walk_vals(plan, &mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// (c2) from_utf8 then sonic_rs::Deserializer::from_str (keeps fast.rs's
/// whole-record UTF-8 invariant; sonic's from_slice does not enforce it for
/// skipped members through the serde API).
#[inline]
pub fn c2_sonic_str<'a>(plan: &fast::Plan, b: &'a [u8]) -> Option<Vals<'a>> {
    let text = std::str::from_utf8(b).ok()?;
    let mut de = sonic_rs::Deserializer::from_str(text);
    let v = walk_vals(plan, &mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// (d) simd-json's serde deserializer over a mutable copy (copy in `buf`, reused).
#[inline]
pub fn d_simd<'a>(
    plan: &fast::Plan,
    buf: &'a mut Vec<u8>,
    buffers: &mut simd_json::Buffers,
    b: &[u8],
) -> Option<Vals<'a>> {
    buf.clear();
    buf.extend_from_slice(b);
    let mut de = simd_json::Deserializer::from_slice_with_buffers(buf, buffers).ok()?;
    walk_vals(plan, &mut de).ok()
}

/// (e) the old derive-based path (HEAD~2:src/model/event.rs `Str` + `Wire`).
struct Str<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    request_id: Option<Str<'a>>,
    #[serde(borrow, default)]
    tenant_id: Option<Str<'a>>,
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    started_ts: Option<i64>,
    #[serde(default)]
    completed_ts: Option<i64>,
}

/// (e) only for the default shape.
#[inline]
pub fn e_wire<'a>(b: &'a [u8]) -> Option<Vals<'a>> {
    let w: Wire<'a> = serde_json::from_slice(b).ok()?;
    fn s(x: Option<Str<'_>>) -> Val<'_> {
        x.map_or(Val::Absent, |s| Val::Str(s.0))
    }
    let u = |x: Option<u64>| x.map_or(Val::Absent, Val::U64);
    let i = |x: Option<i64>| {
        x.map_or(Val::Absent, |n| if n >= 0 { Val::U64(n as u64) } else { Val::I64(n) })
    };
    Some([
        s(w.request_id),
        s(w.tenant_id),
        s(w.model),
        u(w.prompt_tokens),
        u(w.completion_tokens),
        i(w.started_ts),
        i(w.completed_ts),
        Val::Absent,
        Val::Absent,
    ])
}

/// (f) sonic_rs::get_many (lazy values; the skipped members are validated by
/// sonic's skipper, UTF-8 up to the last byte it read). Calls `k` with the values.
#[inline]
pub fn f_sonic_get_many<R>(
    tree: &sonic_rs::PointerTree,
    n: usize,
    b: &[u8],
    k: impl FnOnce(&Vals<'_>) -> R,
) -> Option<R> {
    use sonic_rs::{JsonNumberTrait, JsonType, JsonValueTrait};
    let lazies = sonic_rs::get_many(b, tree).ok()?;
    let mut vals: Vals<'_> = Default::default();
    for (slot, lv) in lazies.iter().enumerate().take(n) {
        let Some(lv) = lv else { continue };
        vals[slot] = match lv.get_type() {
            JsonType::String => Val::Str(Cow::Borrowed(lv.as_str()?)),
            JsonType::Number => {
                let num = lv.as_number()?;
                if let Some(u) = num.as_u64() {
                    Val::U64(u)
                } else if let Some(i) = num.as_i64() {
                    Val::I64(i)
                } else {
                    Val::Other
                }
            }
            JsonType::Null => Val::Null,
            _ => Val::Other,
        };
    }
    Some(k(&vals))
}
