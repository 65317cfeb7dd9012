//! What an id may be (docs/DESIGN.md §3): the one rule, decided at the engine's input,
//! that makes everything the worker bills storable and queryable downstream.
//!
//! Invariants:
//! - An id (`request_id`, `tenant_id`, `model`, CloudEvents `source`) is at most
//!   [`MAX_ID_BYTES`] bytes of UTF-8 and holds no control character (Unicode category
//!   Cc: U+0000–U+001F, U+007F–U+009F). PostgreSQL refuses U+0000 in `TEXT`; a newline
//!   or an escape splits a log line, a CSV row or a terminal; a long id exceeds
//!   PostgreSQL's index row limit and the memory budget's per-window estimate.
//! - The sink applies the same rule (`src/sink/check.rs`) to what it reads, with
//!   [`MAX_KEY_BYTES`] for a dedup key (CloudEvents join `source` and `id`).
//! - Pure: no I/O. The check reads bytes, not chars, so a valid id costs one pass.

use std::fmt;

/// The longest id, in bytes of UTF-8.
pub const MAX_ID_BYTES: usize = 256;

/// The longest dedup key (an adjustment's `request_id`): a CloudEvents key is
/// `<len(source)>:<source>:<id>`, two ids and a few bytes.
pub const MAX_KEY_BYTES: usize = 2 * MAX_ID_BYTES + 8;

/// Why a string is not an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdProblem {
    /// Longer than allowed: `(bytes, limit)`.
    TooLong(usize, usize),
    /// A control character at a byte offset.
    Control { at: usize, ch: char },
}

impl fmt::Display for IdProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong(n, max) => write!(f, "is {n} bytes long, at most {max}"),
            Self::Control { at, ch } => write!(
                f,
                "holds the control character U+{:04X} at byte {at}",
                *ch as u32
            ),
        }
    }
}

/// Checks `s` against the id rule with a length limit of `max` bytes.
#[inline]
pub fn check(s: &str, max: usize) -> Result<(), IdProblem> {
    if s.len() > max {
        return Err(IdProblem::TooLong(s.len(), max));
    }
    let b = s.as_bytes();
    // The common case in one branch-free pass (no early exit, so it vectorizes): no
    // byte below 0x20, no DEL, no 0xC2 (the lead byte of U+0080–U+00BF).
    if !b.iter().fold(false, |bad, &c| {
        bad | (c < 0x20) | (c == 0x7F) | (c == 0xC2)
    }) {
        return Ok(());
    }
    // C0 and DEL are single bytes; C1 (U+0080–U+009F) is 0xC2 followed by 0x80–0x9F.
    match b.iter().enumerate().position(|(i, &c)| {
        c < 0x20 || c == 0x7F || (c == 0xC2 && b.get(i + 1).is_some_and(|n| *n < 0xA0))
    }) {
        None => Ok(()),
        Some(at) => Err(IdProblem::Control {
            at,
            ch: s[at..].chars().next().unwrap_or('\0'),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_at_and_past_the_limits() {
        assert_eq!(check(&"a".repeat(256), MAX_ID_BYTES), Ok(()));
        assert_eq!(
            check(&"a".repeat(257), MAX_ID_BYTES),
            Err(IdProblem::TooLong(257, 256))
        );
        // 128 two-byte characters are 256 bytes.
        assert_eq!(check(&"é".repeat(128), MAX_ID_BYTES), Ok(()));
        assert!(check(&"é".repeat(129), MAX_ID_BYTES).is_err());
        assert_eq!(
            check("evil\0tenant", MAX_ID_BYTES),
            Err(IdProblem::Control { at: 4, ch: '\0' })
        );
        assert_eq!(
            check("a\u{85}b", MAX_ID_BYTES).unwrap_err().to_string(),
            "holds the control character U+0085 at byte 1"
        );
        for ok in ["acme", "é€😀", "a b", "\u{a0}", "=HYPERLINK(1)", ""] {
            assert_eq!(check(ok, MAX_ID_BYTES), Ok(()), "{ok:?}");
        }
    }

    proptest! {
        /// The byte scan finds exactly what `char::is_control` finds.
        #[test]
        fn the_byte_scan_is_char_is_control(s in "\\PC{0,8}[\\x00-\\x{a0}]?\\PC{0,8}") {
            let want = s.char_indices().find(|(_, c)| c.is_control());
            let got = check(&s, usize::MAX).err();
            prop_assert_eq!(got, want.map(|(at, ch)| IdProblem::Control { at, ch }));
        }
    }
}
