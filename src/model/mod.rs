//! Domain types: events, prices, money, partitions and offsets, and the input mapping that
//! reads events. Pure; no I/O.

pub(crate) mod event;
pub(crate) mod id;
pub(crate) mod input;
pub(crate) mod money;
pub(crate) mod partition;
pub(crate) mod price;
/// Rating by usage quantities, tiers, variants and plans (issue 36): pure, not yet wired
/// into the engine; public for the tests of the wiring increment.
pub mod rating;

pub use event::{DeadLetterReason, Event};
pub use money::{NanoPer1k, Pico};
pub use partition::{NextOffset, Partition};
pub use price::{PriceEntry, PriceError, PriceTable};

/// Whether two short byte strings (member names, model names) are equal: inline,
/// by 8- or 4-byte words (the last one overlapping), since a libc `memcmp` call per
/// key showed in the profile.
#[inline(always)]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        if n < 4 {
            return a.iter().zip(b).all(|(x, y)| x == y);
        }
        let word =
            |s: &[u8], i: usize| u32::from_ne_bytes(s[i..i + 4].try_into().expect("4 bytes"));
        return word(a, 0) == word(b, 0) && word(a, n - 4) == word(b, n - 4);
    }
    let word = |s: &[u8], i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    let mut i = 0;
    while i + 8 < n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    word(a, n - 8) == word(b, n - 8)
}
