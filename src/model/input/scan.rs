//! The fast parser's first tier: a hand-written scanner over the record's bytes for
//! the records seen most (members without escapes, integer fields), in one pass with
//! no serde machinery. Measured: serde_json's walk was half of the file mode's CPU
//! (BENCHMARKS.md §1.1).
//!
//! Invariants:
//! - It accepts a record only if serde_json accepts it, and then extracts exactly
//!   the values the serde walk (`fast::walk`) extracts. Anything else it gives up
//!   (`false`), and the serde walk reads the record: a key or a string on a mapped
//!   path with an escape, a number on a mapped path that is not an integer within
//!   `i64`/`u64` (`-0`, a fraction, an exponent, an overflow: serde_json reads those
//!   as floats, or refuses them), nesting deeper than `MAX_DEPTH` (serde_json
//!   stops at 128), any syntax error.
//! - Values no pointer reaches are checked as serde_json skips them: the grammar
//!   only (any `\uXXXX` escape, numbers of any size).
//! - The caller has checked that the record is UTF-8 (`text`), so a string's
//!   contents are `&str` slices of it, cut at ASCII quotes.

use std::borrow::Cow;

use super::fast::{Child, Next, Node, Plan};
use super::{Val, Vals};
use crate::model::same;

/// Nesting at which the scanner gives up (serde_json's limit is 128).
const MAX_DEPTH: u32 = 64;

/// `Err(GiveUp)`: the serde walk decides.
struct GiveUp;

type R<T> = Result<T, GiveUp>;

/// Extracts every field's value into `vals` (all `Absent` before); `false`: gave
/// up, and `vals` is to be reset before another parser fills it.
#[inline]
pub fn extract<'a>(plan: &Plan, text: &'a str, vals: &mut Vals<'a>) -> bool {
    let mut s = Scan {
        text,
        b: text.as_bytes(),
        i: 0,
        seen: 0,
    };
    let done = (|| {
        s.ws();
        if s.peek()? != b'{' {
            return Err(GiveUp);
        }
        s.object(&plan.root, vals, 1)?;
        s.ws();
        if s.i == s.b.len() {
            Ok(())
        } else {
            Err(GiveUp)
        }
    })();
    done.is_ok()
}

/// The index of the first byte from `i` on that ends or interrupts a string's
/// plain run (`"`, `\\`, or a control character), or the length: eight bytes at
/// a time, as serde_json's own string reader does.
#[inline(always)]
fn special(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(word) = b.get(i..i + 8) {
        let x = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        let quote = x ^ (ONES * u64::from(b'"'));
        let slash = x ^ (ONES * u64::from(b'\\'));
        // A byte's high bit is set where it is zero (or below 0x20): the lowest
        // one found is exact, later ones may be borrows (the first is all we use).
        let found = (quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (x.wrapping_sub(ONES * 0x20) & !x);
        let found = found & HIGH;
        if found != 0 {
            return i + (found.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return i;
        }
        i += 1;
    }
    i
}

/// Whether the eight bytes of `w` (little-endian) are all ASCII digits.
#[inline(always)]
fn eight_digits(w: u64) -> bool {
    const F0: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    (w & F0) | (((w.wrapping_add(0x0606_0606_0606_0606)) & F0) >> 4) == 0x3333_3333_3333_3333
}

/// The value of eight ASCII digits (first digit in the lowest byte): three
/// multiplies instead of eight dependent steps.
#[inline(always)]
fn eight_digits_value(w: u64) -> u64 {
    const MASK: u64 = 0x0000_00FF_0000_00FF;
    const MUL1: u64 = 100 + (1_000_000 << 32);
    const MUL2: u64 = 1 + (10_000 << 32);
    let w = w - 0x3030_3030_3030_3030;
    let w = w * 10 + (w >> 8);
    ((w & MASK).wrapping_mul(MUL1) + ((w >> 16) & MASK).wrapping_mul(MUL2)) >> 32
}

struct Scan<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
    /// Bit `slot` or node id: already met (as `fast::Walk::seen`).
    seen: u64,
}

impl<'a> Scan<'a> {
    #[inline(always)]
    fn ws(&mut self) {
        let mut i = self.i;
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(i) {
            i += 1;
        }
        self.i = i;
    }

    #[inline(always)]
    fn peek(&self) -> R<u8> {
        self.b.get(self.i).copied().ok_or(GiveUp)
    }

    #[inline(always)]
    fn eat(&mut self, c: u8) -> R<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    /// A string without escapes, from its opening quote: its contents.
    #[inline(always)]
    fn plain_str(&mut self) -> R<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let end = special(self.b, start);
        if self.b.get(end) != Some(&b'"') {
            return Err(GiveUp);
        }
        self.i = end + 1;
        self.text.get(start..end).ok_or(GiveUp)
    }

    /// Any string, from its opening quote, checked as serde_json skips one.
    fn skip_str(&mut self) -> R<()> {
        self.eat(b'"')?;
        loop {
            self.i = special(self.b, self.i);
            let c = self.peek()?;
            self.i += 1;
            match c {
                b'"' => return Ok(()),
                b'\\' => match self.peek()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                    b'u' => {
                        let hex = self.b.get(self.i + 1..self.i + 5).ok_or(GiveUp)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return Err(GiveUp);
                        }
                        self.i += 5;
                    }
                    _ => return Err(GiveUp),
                },
                _ => return Err(GiveUp),
            }
        }
    }

    // The loops below count in a local: `self.i` in memory made each step wait on
    // the store of the one before.
    #[inline(always)]
    fn digits(&mut self) -> usize {
        let (start, mut i) = (self.i, self.i);
        while self.b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        self.i = i;
        i - start
    }

    /// A number by the grammar of RFC 8259 §6, of any size.
    fn skip_number(&mut self) -> R<()> {
        if self.peek()? == b'-' {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return Err(GiveUp),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(GiveUp);
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(GiveUp);
            }
        }
        // A digit right after a lone leading zero ("01") is no number.
        if self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
            return Err(GiveUp);
        }
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    /// Any value, checked as serde_json skips one.
    fn skip_value(&mut self, depth: u32) -> R<()> {
        match self.peek()? {
            b'"' => self.skip_str(),
            b'{' | b'[' => self.skip_container(depth + 1),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.skip_number(),
            _ => Err(GiveUp),
        }
    }

    /// An object or an array no pointer reaches.
    fn skip_container(&mut self, depth: u32) -> R<()> {
        let open = self.peek()?;
        let close = if open == b'{' { b'}' } else { b']' };
        if self.open(open, close, depth)? {
            return Ok(());
        }
        loop {
            if close == b'}' {
                self.skip_str()?;
                self.ws();
                self.eat(b':')?;
                self.ws();
            }
            self.skip_value(depth)?;
            if self.closes(close)? {
                return Ok(());
            }
        }
    }

    /// Opens a container at its `open` byte; `true` if it is empty (and closed).
    fn open(&mut self, open: u8, close: u8, depth: u32) -> R<bool> {
        if depth > MAX_DEPTH {
            return Err(GiveUp);
        }
        self.eat(open)?;
        self.ws();
        if self.peek()? == close {
            self.i += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// After a member or an element: `false` past the `,` before another,
    /// `true` past the container's `close`.
    fn closes(&mut self, close: u8) -> R<bool> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.i += 1;
                self.ws();
                Ok(false)
            }
            c if c == close => {
                self.i += 1;
                Ok(true)
            }
            _ => Err(GiveUp),
        }
    }

    /// An integer on a mapped path, as serde_json's `deserialize_any` gives it.
    fn integer(&mut self) -> R<Val<'a>> {
        let negative = self.peek()? == b'-';
        if negative {
            self.i += 1;
        }
        let start = self.i;
        // Eight digits at a time while there are (a millisecond timestamp has 13).
        let mut v = 0u64;
        while let Some(w) = self.b.get(self.i..self.i + 8) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            if !eight_digits(w) || self.i - start > 8 {
                break;
            }
            v = v * 100_000_000 + eight_digits_value(w);
            self.i += 8;
        }
        let done = self.i;
        let n = self.digits() + (done - start);
        let digits = &self.b[done..self.i];
        // Nineteen digits cannot overflow a u64 (no check per digit: a dependent
        // checked multiply per digit was most of a record's integers' cost).
        let (head, tail) = digits.split_at(digits.len().min(19 - (done - start)));
        v = head.iter().fold(v, |v, &c| v * 10 + u64::from(c - b'0'));
        for &c in tail {
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(c - b'0')))
                .ok_or(GiveUp)?;
        }
        let leading_zero = n > 1 && self.b[start] == b'0';
        if n == 0 || leading_zero || matches!(self.b.get(self.i), Some(b'.' | b'e' | b'E')) {
            return Err(GiveUp);
        }
        match negative {
            false => Ok(Val::U64(v)),
            // serde_json reads `-0`, and anything below i64::MIN, as a float.
            true if v == 0 || v > 1 << 63 => Err(GiveUp),
            true => Ok(Val::I64((v as i64).wrapping_neg())),
        }
    }

    /// A mapped field's value (a scalar, or a container as `Other`).
    fn leaf(&mut self, depth: u32) -> R<Val<'a>> {
        Ok(match self.peek()? {
            b'"' => Val::Str(Cow::Borrowed(self.plain_str()?)),
            b'-' | b'0'..=b'9' => self.integer()?,
            b'{' | b'[' => {
                self.skip_container(depth + 1)?;
                Val::Other
            }
            b't' => {
                self.literal(b"true")?;
                Val::Other
            }
            b'f' => {
                self.literal(b"false")?;
                Val::Other
            }
            b'n' => {
                self.literal(b"null")?;
                Val::Null
            }
            _ => return Err(GiveUp),
        })
    }

    /// The members of an object on a mapped path (from its `{`).
    fn object(&mut self, node: &Node, vals: &mut Vals<'a>, depth: u32) -> R<()> {
        if self.open(b'{', b'}', depth)? {
            return Ok(());
        }
        // Producers write their members in one order: the child after the last one
        // met is tried first, as `"name":` in one compare (no colon-side spaces).
        let mut guess = 0;
        loop {
            let expected = node.children.get(guess).and_then(|c| c.quoted.as_deref());
            let found = match expected {
                Some(q)
                    if self
                        .b
                        .get(self.i..self.i + q.len())
                        .is_some_and(|b| same(b, q)) =>
                {
                    self.i += q.len();
                    Some(guess)
                }
                _ => {
                    let key = self.plain_str()?;
                    self.ws();
                    self.eat(b':')?;
                    let is = |c: &Child| same(c.name.as_bytes(), key.as_bytes());
                    node.children.iter().position(is)
                }
            };
            self.ws();
            match found {
                None => self.skip_value(depth)?,
                Some(k) => {
                    guess = k + 1;
                    self.member(&node.children[k].next, vals, depth)?;
                }
            }
            if self.closes(b'}')? {
                return Ok(());
            }
        }
    }

    /// The elements of an array on a mapped path (from its `[`): element `i` is
    /// the child whose index is `i`.
    fn array(&mut self, node: &Node, vals: &mut Vals<'a>, depth: u32) -> R<()> {
        if self.open(b'[', b']', depth)? {
            return Ok(());
        }
        let mut i = 0usize;
        loop {
            match node.children.iter().find(|c| c.index == Some(i)) {
                None => self.skip_value(depth)?,
                Some(child) => self.member(&child.next, vals, depth)?,
            }
            if self.closes(b']')? {
                return Ok(());
            }
            i += 1;
        }
    }

    /// A member on a mapped path: a field's value, or a node's.
    fn member(&mut self, next: &Next, vals: &mut Vals<'a>, depth: u32) -> R<()> {
        let bit = match next {
            Next::Leaf(slot) => *slot,
            Next::Node(n) => n.id,
        };
        let mask = 1u64 << bit;
        if self.seen & mask != 0 {
            return Err(GiveUp); // a repeated key: the reference names it
        }
        self.seen |= mask;
        match next {
            Next::Leaf(slot) => vals[*slot] = self.leaf(depth)?,
            Next::Node(n) => match self.peek()? {
                b'{' => self.object(n, vals, depth + 1)?,
                b'[' => self.array(n, vals, depth + 1)?,
                // A scalar where the mapping expects a container: read as the
                // serde walk reads it, and the fields below are absent.
                _ => {
                    self.leaf(depth)?;
                }
            },
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{absent, InputConfig, InputFormat, InputMapping};
    use super::*;

    fn scan<'a>(m: &InputMapping, text: &'a str) -> Option<Vals<'a>> {
        let mut vals = absent();
        extract(&m.plan, text, &mut vals).then_some(vals)
    }

    fn s(v: &str) -> Val<'_> {
        Val::Str(Cow::Borrowed(v))
    }

    /// The shapes `tally gen` writes, as users' gateways write them: the scanner
    /// reads them itself (the serde walk is the slow tier).
    #[test]
    fn the_usual_records_are_read_by_the_scanner() {
        let m = InputMapping::default();
        let v = scan(&m, r#"{"request_id":"r-1","tenant_id":"acme","model":"large","prompt_tokens":1000,"completion_tokens":500,"started_ts":1767261643000,"completed_ts":1767261644000}"#).unwrap();
        assert_eq!(v[0], s("r-1"));
        assert_eq!(v[1], s("acme"));
        assert_eq!(v[3], Val::U64(1000));
        assert_eq!(v[6], Val::U64(1767261644000));
        // Spaces around a colon, and members in another order: read all the same.
        let v = scan(
            &m,
            r#"{ "tenant_id" : "acme" , "request_idx":1, "request_id":"r-2" }"#,
        )
        .unwrap();
        assert_eq!((&v[0], &v[1]), (&s("r-2"), &s("acme")));
        let nested: InputConfig = toml::from_str(
            "tenant_id = \"/customer/id\"\nstarted_ts = \"/spans/1/at\"\ncompleted_ts = \"/time\"\ncompleted_ts_format = \"rfc3339\"",
        )
        .unwrap();
        let m = InputMapping::new(&nested).unwrap();
        let v = scan(&m, " {\"customer\": {\"id\": \"acme\", \"tier\": [1, 2.5e3, null]},\n \"spans\": [{\"at\": -7}, {\"at\": 12}], \"time\": \"2026-01-01T10:00:44Z\", \"x\": {\"y\": \"\\u00e9\\n\"}} ").unwrap();
        assert_eq!(v[1], s("acme"));
        assert_eq!(v[5], Val::U64(12));
        assert_eq!(v[6], s("2026-01-01T10:00:44Z"));
        // The nested shape of `tally gen` (BENCHMARKS.md §1.2).
        let gen: InputConfig = toml::from_str(
            "request_id = \"/meta/request/id\"\ntenant_id = \"/customer/id\"\nmodel = \"/usage/model\"\nprompt_tokens = \"/usage/input_tokens\"\ncompletion_tokens = \"/usage/output_tokens\"\ncompleted_ts = \"/time\"\nstarted_ts = \"/spans/0/start\"\ncompleted_ts_format = \"rfc3339\"\nstarted_ts_format = \"epoch_us\"",
        )
        .unwrap();
        let m = InputMapping::new(&gen).unwrap();
        let v = scan(&m, r#"{"meta":{"request":{"id":"req-1-000000000"}},"customer":{"id":"tenant-010"},"usage":{"model":"small","input_tokens":3885,"output_tokens":889},"spans":[{"start":1767261594990000}],"time":"2026-01-01T09:59:56.490Z"}"#).unwrap();
        assert_eq!(
            (&v[0], &v[1], &v[2]),
            (&s("req-1-000000000"), &s("tenant-010"), &s("small"))
        );
        assert_eq!(
            (&v[3], &v[4], &v[5]),
            (&Val::U64(3885), &Val::U64(889), &Val::U64(1767261594990000))
        );
        let ce = InputMapping::new(&InputConfig {
            format: InputFormat::Cloudevents,
            ..Default::default()
        })
        .unwrap();
        let v = scan(&ce, r#"{"specversion":"1.0","id":"e-1","source":"/gw","type":"usage","subject":"acme","time":"2026-01-01T10:00:44Z","data":{"model":"small","prompt_tokens":1,"completion_tokens":0}}"#).unwrap();
        assert_eq!((&v[7], &v[8], &v[4]), (&s("/gw"), &s("1.0"), &Val::U64(0)));
    }

    proptest::proptest! {
        /// `special` finds what a byte-by-byte search finds, wherever the word
        /// boundaries fall.
        #[test]
        fn special_finds_the_first_quote_backslash_or_control_byte(
            bytes in proptest::collection::vec(proptest::sample::select(
                vec![b'a', b'"', b'\\', 0x1f, 0x20, 0x00, 0x7f, 0x80, 0xe9, 0xff, 0x21, 0x5b, 0x5d],
            ), 0..40),
            from in 0usize..40,
        ) {
            let from = from.min(bytes.len());
            let naive = bytes[from..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                .map_or(bytes.len(), |p| from + p);
            proptest::prop_assert_eq!(special(&bytes, from), naive);
        }
    }

    proptest::proptest! {
        /// Integers of every length, eight digits at a time or one by one, read as
        /// serde_json reads them — and read by the scanner whenever they fit.
        #[test]
        fn integers_read_as_serde_json_reads_them(
            negative in proptest::bool::ANY,
            digits in proptest::collection::vec(0u8..10, 0..25),
            tail in proptest::sample::select(vec!["", " ", ".5", "e1", "x"]),
        ) {
            let digits: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
            let number = format!("{}{digits}", if negative { "-" } else { "" });
            let text = format!("{{\"prompt_tokens\":{number}{tail}}}");
            let m = InputMapping::default();
            let mut by_scan = absent();
            let accepted = extract(&m.plan, &text, &mut by_scan);
            if accepted {
                let mut by_walk = absent();
                let mut de = serde_json::Deserializer::from_str(&text);
                let walked = super::super::fast::walk(&m.plan, &mut de, &mut by_walk).is_ok()
                    && de.end().is_ok();
                proptest::prop_assert!(walked);
                proptest::prop_assert_eq!(&by_scan, &by_walk);
            }
            let json_integer = !digits.is_empty() && (digits == "0" || !digits.starts_with('0'));
            let fits = match number.parse::<i128>() {
                Ok(v) if negative => v < 0 && v >= i128::from(i64::MIN),
                Ok(v) => v <= i128::from(u64::MAX),
                Err(_) => false,
            };
            if json_integer && fits && matches!(tail, "" | " ") {
                proptest::prop_assert!(accepted, "{}", text);
                let want = match number.parse::<i128>().unwrap() {
                    v if v < 0 => Val::I64(v as i64),
                    v => Val::U64(v as u64),
                };
                proptest::prop_assert_eq!(&by_scan[3], &want);
            }
        }
    }

    #[test]
    fn eight_digits_at_once() {
        let w = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap());
        assert!(eight_digits(w(b"12345678")) && eight_digits(w(b"00000000")));
        assert!(!eight_digits(w(b"1234567/")) && !eight_digits(w(b"1234:678")));
        assert!(!eight_digits(w(b"\xfa2345678"[..8].try_into().unwrap())));
        assert_eq!(eight_digits_value(w(b"12345678")), 12_345_678);
        assert_eq!(eight_digits_value(w(b"99999999")), 99_999_999);
        assert_eq!(eight_digits_value(w(b"00000001")), 1);
    }

    /// What the scanner leaves to the serde walk, on a mapped path and off it.
    #[test]
    fn the_scanner_gives_up_where_serde_json_reads_floats_or_refuses() {
        let m = InputMapping::default();
        for text in [
            r#"{"tenant_id":"a\u0063me"}"#,
            r#"{"tenant\u005fid":"acme"}"#,
            r#"{"prompt_tokens":-0}"#,
            r#"{"prompt_tokens":1.0}"#,
            r#"{"prompt_tokens":1e3}"#,
            r#"{"prompt_tokens":18446744073709551616}"#,
            r#"{"prompt_tokens":-9223372036854775809}"#,
            r#"{"prompt_tokens":01}"#,
            r#"{"tenant_id":"a","tenant_id":"b"}"#,
            r#"{"other":"\x"}"#,
            "{\"other\":\"\t\"}",
            r#"{"other":[1,]}"#,
            r#"{"other":tru}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
            r#"["a"]"#,
            r#"{"a":1"#,
        ] {
            assert!(scan(&m, text).is_none(), "{text}");
        }
        let deep = format!("{{\"other\":{}{}}}", "[".repeat(70), "]".repeat(70));
        assert!(scan(&m, &deep).is_none());
        // Off a mapped path, what serde_json skips: any \u escape, any number.
        let v = scan(&m, r#"{"o":"\ud800","n":-1.5E+400,"tenant_id":"acme","big":123456789012345678901234567890}"#).unwrap();
        assert_eq!(v[1], s("acme"));
        assert_eq!(
            scan(&m, r#"{"prompt_tokens":-9223372036854775808}"#).unwrap()[3],
            Val::I64(i64::MIN)
        );
    }
}
