//! The input file, line by line, in memory bounded by `limits.max_record_bytes`.
//!
//! A *record* is a line without its `\n` and trailing `\r`s, and, on line 1, without a
//! UTF-8 byte-order mark (the file's encoding mark, docs/DESIGN.md §11.1).
//!
//! Invariants:
//! - Reads go through one large buffer (1 MiB): a read syscall per buffer, never per
//!   line; a line is found with the standard library's `memchr`, as `read_until` does.
//! - Of a record longer than the limit, at most the first `limit + 1` bytes are kept
//!   (`limit + 4` on line 1, whose mark is not yet stripped): the rest is skipped in
//!   the buffer, never copied. Its true length is counted, so the dead letter can say
//!   it. `limit + 1` bytes are enough for the engine to judge the record oversized.
//! - Line numbers count every line, empty ones included, from 1.

use std::io::{self, BufRead, BufReader, Read};

use crate::model::event::BOM;

/// What `Lines::next_into` put into the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// The whole record (at most `limit` bytes; maybe empty).
    Record,
    /// A record longer than the limit: the buffer holds its first `limit + 1` bytes or
    /// more (never more than `limit + 4`); `bytes` is its true length.
    Oversized { bytes: u64 },
}

pub(crate) struct Lines<R> {
    inner: BufReader<R>,
    limit: usize,
    line_no: u64,
    skipped_bom: bool,
}

impl<R: Read> Lines<R> {
    pub(crate) fn new(inner: R, limit: usize) -> Self {
        Self::with_capacity(inner, limit, 1 << 20)
    }

    pub(crate) fn with_capacity(inner: R, limit: usize, capacity: usize) -> Self {
        Self {
            inner: BufReader::with_capacity(capacity, inner),
            limit,
            line_no: 0,
            skipped_bom: false,
        }
    }

    /// The number of the line last read (0 before the first).
    pub(crate) fn line_no(&self) -> u64 {
        self.line_no
    }

    /// Whether input is buffered: if not, the next line needs a read, which may wait
    /// (on a FIFO, for the writer).
    pub(crate) fn buffered(&self) -> bool {
        !self.inner.buffer().is_empty()
    }

    /// Whether line 1 began with a byte-order mark (which was skipped).
    pub(crate) fn skipped_bom(&self) -> bool {
        self.skipped_bom
    }

    /// Reads the next line's record into `buf` (cleared first); `None` at end of input.
    /// An error leaves the line unread (its number is not counted).
    #[cfg(test)]
    pub(crate) fn next_into(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<Line>> {
        buf.clear();
        self.append_next(buf)
    }

    /// Appends the next line's record to `buf`, as `next_into` reads it; on `None`
    /// or an error `buf` is as it was.
    pub(crate) fn append_next(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<Line>> {
        let start = buf.len();
        let first = self.line_no == 0;
        let slack = if first { BOM.len() as u64 } else { 0 };
        let cap = (self.limit as u64).saturating_add(1 + slack);
        let read = (&mut self.inner).take(cap).read_until(b'\n', buf);
        let n = match read {
            Ok(n) => n as u64,
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        };
        if n == 0 {
            return Ok(None);
        }
        let complete = buf.last() == Some(&b'\n') || n < cap;
        let mut len = if complete {
            if buf.last() == Some(&b'\n') {
                buf.pop();
            }
            let crs = trailing_cr(&buf[start..]);
            buf.truncate(buf.len() - crs);
            (buf.len() - start) as u64
        } else {
            // `cap` bytes and no end of line yet: skip the rest, counting it.
            match self.skip_rest(trailing_cr(&buf[start..]) as u64) {
                Ok((rest, crs)) => n + rest - crs,
                Err(e) => {
                    buf.truncate(start);
                    return Err(e);
                }
            }
        };
        self.line_no += 1;
        if first && buf[start..].starts_with(BOM) {
            buf.drain(start..start + BOM.len());
            len -= BOM.len() as u64;
            self.skipped_bom = true;
        }
        // Trailing `\r`s read before the skip are not part of the record.
        buf.truncate(start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)));
        if len <= self.limit as u64 {
            Ok(Some(Line::Record))
        } else {
            Ok(Some(Line::Oversized { bytes: len }))
        }
    }

    /// Skips to the end of the line without keeping it; returns the bytes skipped
    /// before the `\n` and the length of the line's run of trailing `\r`s, given the
    /// run `crs` at the end of what was read before.
    fn skip_rest(&mut self, mut crs: u64) -> io::Result<(u64, u64)> {
        let mut rest = 0u64;
        loop {
            let available = self.inner.fill_buf()?;
            if available.is_empty() {
                return Ok((rest, crs));
            }
            let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..i], true),
                None => (available, false),
            };
            let tail = trailing_cr(chunk);
            crs = if tail == chunk.len() {
                crs + tail as u64
            } else {
                tail as u64
            };
            rest += chunk.len() as u64;
            let used = chunk.len() + usize::from(found);
            self.inner.consume(used);
            if found {
                return Ok((rest, crs));
            }
        }
    }
}

fn trailing_cr(bytes: &[u8]) -> usize {
    bytes.iter().rev().take_while(|&&b| b == b'\r').count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Yields one byte per read, to put every boundary in every place.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.is_empty()) {
                (Some((b, rest)), false) => {
                    buf[0] = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    fn all(mut lines: Lines<impl Read>) -> Vec<(u64, Vec<u8>, Line)> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(kind) = lines.next_into(&mut buf).unwrap() {
            out.push((lines.line_no(), buf.clone(), kind));
        }
        out
    }

    fn read(input: &[u8], limit: usize) -> Vec<(u64, Vec<u8>, Line)> {
        all(Lines::new(input, limit))
    }

    #[test]
    fn lines_are_records_without_their_line_ends() {
        let got = read(b"a\r\nbb\n\n\r\r\nc", 10);
        let records: Vec<&[u8]> = got.iter().map(|(_, b, _)| b.as_slice()).collect();
        assert_eq!(records, [&b"a"[..], b"bb", b"", b"", b"c"]);
        assert_eq!(got.iter().map(|l| l.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        assert!(got.iter().all(|l| l.2 == Line::Record));
    }

    #[test]
    fn an_oversized_line_keeps_a_prefix_and_its_true_length_and_the_next_line_follows() {
        let big = vec![b'x'; 100_000];
        let input = [&b"ok\n"[..], &big, b"\r\nafter\n"].concat();
        let mut lines = Lines::with_capacity(&input[..], 64, 4096);
        let mut buf = Vec::new();
        assert_eq!(lines.next_into(&mut buf).unwrap(), Some(Line::Record));
        assert_eq!(
            lines.next_into(&mut buf).unwrap(),
            Some(Line::Oversized { bytes: 100_000 })
        );
        assert_eq!(buf, vec![b'x'; 65]);
        assert!(buf.capacity() <= 4 * 65, "bounded: {}", buf.capacity());
        assert_eq!(lines.next_into(&mut buf).unwrap(), Some(Line::Record));
        assert_eq!((lines.line_no(), &buf[..]), (3, &b"after"[..]));
        assert_eq!(lines.next_into(&mut buf).unwrap(), None);
    }

    #[test]
    fn the_limit_is_on_the_record_not_on_its_line_end() {
        // Exactly the limit, with a long CR LF tail: a record.
        let got = read(b"abcd\r\r\r\r\r\nabcde\nabcd", 4);
        assert_eq!(got[0], (1, b"abcd".to_vec(), Line::Record));
        assert_eq!(got[1], (2, b"abcde".to_vec(), Line::Oversized { bytes: 5 }));
        assert_eq!(got[2], (3, b"abcd".to_vec(), Line::Record));
        // `\r`s inside the record count; only the trailing run is dropped. (Line 2:
        // line 1 keeps 3 bytes more, for a byte-order mark.)
        let got = read(b"\nab\r\rcdef\r\r\n", 4);
        assert_eq!(got[1].2, Line::Oversized { bytes: 8 });
        assert_eq!(got[1].1, b"ab\r\rc");
    }

    #[test]
    fn a_byte_order_mark_opening_the_file_is_skipped_and_counts_nowhere() {
        let mut lines = Lines::new(&b"\xEF\xBB\xBFabcd\n\xEF\xBB\xBFx\n"[..], 4);
        let mut buf = Vec::new();
        assert_eq!(lines.next_into(&mut buf).unwrap(), Some(Line::Record));
        assert_eq!(buf, b"abcd");
        assert!(lines.skipped_bom());
        lines.next_into(&mut buf).unwrap();
        assert_eq!(buf, b"\xEF\xBB\xBFx");
        // On an oversized line 1 too.
        let got = read(b"\xEF\xBB\xBFabcdefgh\n", 4);
        assert_eq!(got[0], (1, b"abcde".to_vec(), Line::Oversized { bytes: 8 }));
    }

    /// The definition, on whole lines in memory.
    fn reference(input: &[u8], limit: usize) -> Vec<(u64, Vec<u8>, Line)> {
        let mut parts: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
        if parts.last().is_some_and(|p| p.is_empty()) {
            parts.pop();
        }
        let mut out = Vec::new();
        for (i, mut p) in parts.into_iter().enumerate() {
            if i == 0 && p.starts_with(BOM) {
                p = &p[BOM.len()..];
            }
            let p = &p[..p.len() - trailing_cr(p)];
            let kind = if p.len() > limit {
                Line::Oversized {
                    bytes: p.len() as u64,
                }
            } else {
                Line::Record
            };
            out.push((i as u64 + 1, p.to_vec(), kind));
        }
        out
    }

    /// Short inputs of the bytes that matter: line ends, `\r`, a byte-order mark's.
    fn input() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![
                Just(b'a'),
                Just(b'\r'),
                Just(b'\n'),
                Just(0xEF),
                Just(0xBB),
                Just(0xBF)
            ],
            0..80,
        )
    }

    proptest! {
        /// `append_next` into one buffer yields the records `next_into` yields, back
        /// to back, and leaves the buffer as it was at the end of input.
        #[test]
        fn appending_gives_the_same_records_back_to_back(
            input in input(),
            limit in 0usize..12,
            capacity in 1usize..9,
        ) {
            let want = all(Lines::with_capacity(Trickle(&input), limit, capacity));
            let mut lines = Lines::with_capacity(Trickle(&input), limit, capacity);
            let mut buf = b"head".to_vec();
            let mut got = Vec::new();
            loop {
                let start = buf.len();
                match lines.append_next(&mut buf).unwrap() {
                    Some(kind) => got.push((lines.line_no(), buf[start..].to_vec(), kind)),
                    None => {
                        prop_assert_eq!(buf.len(), start);
                        break;
                    }
                }
            }
            prop_assert!(buf.starts_with(b"head"));
            prop_assert_eq!(got, want);
        }

        #[test]
        fn reads_every_line_as_the_definition_says(
            input in input(),
            limit in 0usize..12,
            capacity in 1usize..9,
        ) {
            let got = all(Lines::with_capacity(Trickle(&input), limit, capacity));
            let want = reference(&input, limit);
            prop_assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                prop_assert_eq!((g.0, g.2), (w.0, w.2));
                match g.2 {
                    Line::Record => prop_assert_eq!(&g.1, &w.1),
                    // A prefix of the record, of at least limit + 1 bytes.
                    Line::Oversized { .. } => {
                        prop_assert!(w.1.starts_with(&g.1) && g.1.len() > limit);
                        prop_assert!(g.1.len() <= limit + 1 + BOM.len());
                    }
                }
            }
        }
    }
}
