//! A partition's snapshot as parts: the partition's state-store entries in key
//! order, cut into objects of about `PART_TARGET` bytes (object stores take whole
//! objects; parts keep what the writer and a reader hold in memory bounded).
//!
//! ```text
//! "TALLYPRT" version u16 BE     framing (`format`)
//! partition i32 BE, index u32 BE
//! { key_len u32 BE, key, val_len u32 BE, val }*   entries, key order, never split
//! 0xFFFF_FFFF                   end marker
//! ```
//! A part's sha256 and size are in the manifest; a reader checks both before it
//! parses a byte, and every length against the bytes it holds.
//!
//! Compatibility: part of checkpoint format 3 (see `format`); the values are the
//! state store's (`state::stored`).

use super::format::{body, header, PART_MAGIC};
use crate::model::Partition;

/// A part closes after the entry that takes it past this size.
pub(crate) const PART_TARGET: usize = 8 << 20;
const END: u32 = u32::MAX;

/// One state-store entry, borrowed from a part: `(key, value)`.
pub(crate) type EntryRef<'b> = (&'b [u8], &'b [u8]);

/// Cuts a partition's entries into parts.
pub(crate) struct PartWriter {
    partition: Partition,
    index: u32,
    buf: Vec<u8>,
}

fn start(partition: Partition, index: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(PART_TARGET + (1 << 16));
    buf.extend_from_slice(&header(PART_MAGIC));
    buf.extend_from_slice(&partition.0.to_be_bytes());
    buf.extend_from_slice(&index.to_be_bytes());
    buf
}

impl PartWriter {
    pub(crate) fn new(partition: Partition) -> Self {
        Self {
            partition,
            index: 0,
            buf: start(partition, 0),
        }
    }

    /// Adds one entry; returns the part it completed, if it did. The next part's
    /// buffer is taken only by the next entry (or `finish`), so a caller that
    /// writes and drops a completed part first never holds two.
    pub fn entry(&mut self, k: &[u8], v: &[u8]) -> Option<Vec<u8>> {
        if self.buf.is_empty() {
            self.buf = start(self.partition, self.index);
        }
        self.buf.extend_from_slice(&(k.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(k);
        self.buf.extend_from_slice(&(v.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(v);
        if self.buf.len() < PART_TARGET {
            return None;
        }
        self.index += 1;
        let mut done = std::mem::take(&mut self.buf);
        done.extend_from_slice(&END.to_be_bytes());
        Some(done)
    }

    /// The last part (a partition has at least one, its meta in it).
    pub(crate) fn finish(mut self) -> Vec<u8> {
        if self.buf.is_empty() {
            self.buf = start(self.partition, self.index);
        }
        self.buf.extend_from_slice(&END.to_be_bytes());
        self.buf
    }
}

/// Parses part `index` of `partition` (the caller checked its size and checksum).
#[cfg(test)]
pub(crate) fn parse_part(
    buf: &[u8],
    partition: Partition,
    index: u32,
) -> Result<Vec<EntryRef<'_>>, String> {
    Ok(entries(buf, partition, index)?.collect())
}

/// The entries of part `index` of `partition`, checked whole first (framing,
/// lengths, the end marker) without allocating, then walked as they are
/// consumed: a reader holds no more than the part itself, however many entries
/// it lists (a crafted part of empty entries lists one per 8 bytes).
pub(crate) fn entries(buf: &[u8], partition: Partition, index: u32) -> Result<Entries<'_>, String> {
    let b = body(buf, PART_MAGIC, "partition part").map_err(|e| e.to_string())?;
    if b.len() < 8 {
        return Err("truncated".into());
    }
    if b[..4] != partition.0.to_be_bytes() {
        return Err("a part of another partition".into());
    }
    if b[4..8] != index.to_be_bytes() {
        return Err(format!("not part {index} of its partition"));
    }
    let mut walk = Entries { body: b, at: 8 };
    loop {
        match walk.step()? {
            Some(_) => {}
            None if walk.at == b.len() => return Ok(Entries { body: b, at: 8 }),
            None => return Err("bytes after the end marker".into()),
        }
    }
}

/// A checked part's entries, in order (`entries`).
pub(crate) struct Entries<'b> {
    body: &'b [u8],
    at: usize,
}

impl<'b> Entries<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], String> {
        let end = self.at.checked_add(n).ok_or("truncated")?;
        let s = self.body.get(self.at..end).ok_or("truncated")?;
        self.at = end;
        Ok(s)
    }

    fn len(&mut self) -> Result<u32, String> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// The next entry; `None` at the end marker.
    fn step(&mut self) -> Result<Option<EntryRef<'b>>, String> {
        let klen = self.len()?;
        if klen == END {
            return Ok(None);
        }
        let k = self.take(klen as usize)?;
        let vlen = self.len()?;
        Ok(Some((k, self.take(vlen as usize)?)))
    }
}

impl<'b> Iterator for Entries<'b> {
    type Item = EntryRef<'b>;

    fn next(&mut self) -> Option<EntryRef<'b>> {
        // Checked whole by `entries`: a walk again cannot fail.
        self.step().ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cut_at_entry_boundaries_and_parse_back() {
        let mut w = PartWriter::new(Partition(3));
        let big = vec![7u8; PART_TARGET / 2 + 1];
        assert!(w.entry(b"k1", &big).is_none());
        let first = w.entry(b"k2", &big).expect("past the target");
        assert!(w.entry(b"k3", b"").is_none());
        let last = w.finish();
        let a = parse_part(&first, Partition(3), 0).unwrap();
        assert_eq!(a.iter().map(|e| e.0).collect::<Vec<_>>(), [b"k1", b"k2"]);
        assert_eq!(
            parse_part(&last, Partition(3), 1).unwrap(),
            [(&b"k3"[..], &b""[..])]
        );
        assert!(parse_part(&last, Partition(4), 1)
            .unwrap_err()
            .contains("another partition"));
        assert!(parse_part(&last, Partition(3), 0)
            .unwrap_err()
            .contains("not part 0"));
    }

    /// A cut taken last still leaves a last part (empty, numbered after it).
    #[test]
    fn a_cut_then_finish_leaves_an_empty_last_part() {
        let mut w = PartWriter::new(Partition(1));
        let big = vec![1u8; PART_TARGET];
        let first = w.entry(b"k", &big).expect("past the target");
        let last = w.finish();
        assert_eq!(parse_part(&first, Partition(1), 0).unwrap().len(), 1);
        assert!(parse_part(&last, Partition(1), 1).unwrap().is_empty());
    }

    /// Lengths past the bytes held, a missing end, trailing bytes: errors, not
    /// panics or allocations.
    #[test]
    fn crafted_parts_are_errors() {
        let mut w = PartWriter::new(Partition(0));
        w.entry(b"k", b"v");
        let good = w.finish();
        let head = &good[..18];
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for tail in [
            &b"\xFF\xFF\xFF\xFEk"[..],
            b"\0\0\0\x01k\xFF\xFF\xFF\x00",
            b"",
            b"\0\0",
        ] {
            let mut c = head.to_vec();
            c.extend_from_slice(tail);
            cases.push(c);
        }
        let mut trailing = good.clone();
        trailing.push(0);
        cases.push(trailing);
        for c in &cases {
            assert!(parse_part(c, Partition(0), 0).is_err(), "{c:?}");
        }
        assert!(parse_part(&good, Partition(0), 0).is_ok());
    }
}
