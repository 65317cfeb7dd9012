//! The checkpoint's durable format: the framing every object starts with, and the
//! manifest as stored.
//!
//! ## Framing
//! ```text
//! magic      8 bytes   "TALLYMAN" (manifest) or "TALLYPRT" (partition part)
//! version    u16 BE    the checkpoint format, read before anything else
//! body       …         per kind and version
//! ```
//! A manifest ends with the sha256 of everything before it (magic included); a
//! part's sha256 is recorded in its manifest. A reader checks the magic and the
//! version first, so an old or a future format is reported as such — with the
//! version and the way out — never as "corrupt".
//!
//! ## Manifest body (format 5, postcard)
//! `ManifestBody`: id, worker, created_at_ms, group, topic, fingerprint, the
//! semantic configuration (`evolution::Semantics`), then one `PartitionBody` per
//! partition: partition, next_offset, watermark, high-water `completed_ts`, the audit
//! counters (`state::stored::StoredCounters`), the offset ledger, and its chain of
//! segments (`SegmentBody`: the checkpoint holding it, base or delta with its two
//! range-delete bounds, its parts as (bytes, sha256) in key order). A part's key
//! is derived from the segment's checkpoint name, the partition and the part's
//! index (`part_key`): a manifest names no path, and a segment's checkpoint must
//! be a plain `chk-<id>-<worker>` name.
//!
//! ## Compatibility
//! - Format 8 appends a rated window's lines to its value (issue 36,
//!   `state::stored::StoredRatedLine`), only when it has any, and the rating's
//!   tables as canonical TOML (`Semantics::rating`, a postcard string, `""` without
//!   a rating) after the manifest's input mapping. Format 7 is still read, with no
//!   rating: its parts are format-8 parts without rated windows.
//! - Format 7 appends the input mapping (`Semantics::input`, a postcard string,
//!   `""` for the default mapping) after the body; its parts are format 6's.
//!   Formats 5 and 6 are still read, with the default mapping (they had no other).
//! - Format 6 appended line items per model to the window values
//!   (`state::stored::StoredWindow`); its manifest is format 5's. Format 5 is still
//!   read: its parts are format-6 parts with window values of `StoredWindowV5`.
//! - Format 5 added the semantic configuration to the manifest, the high-water
//!   time to each partition, and the key `T p` to parts (`state::stored::StoredTime`).
//!   Format 4 is still read (`older::ManifestBodyV4`): no semantics, no high-water time;
//!   its parts are format-5 parts without `T` keys.
//! - Format 4 added the segment chain (incremental checkpoints). Format 3 (one
//!   run of parts per partition) is still read, as a chain of one base in its own
//!   checkpoint; its parts are format-4 parts with another version number.
//! - Formats 1 and 2 (a bincode manifest without magic, `TALLYPS1`/`TALLYPS2`
//!   partition files) are recognised and refused by name, with the way out
//!   (`legacy_way_out`, its text built from `OLDEST_READ` and `VERSION`): this
//!   tally does not convert them.
//! - Any change to a stored struct here or in `state::stored` is a new format:
//!   bump `VERSION`, keep decoding the previous version (add its structs under a
//!   versioned name and upgrade them in memory, as `older::ManifestBodyV3`) or refuse it
//!   by version with the way out.
//! - Writers only ever write `VERSION`; a newer version is refused ("written by a
//!   newer tally").
//! - Sizes are bounded before decoding: a manifest `MAX_MANIFEST_BYTES`, a part
//!   `MAX_PART_BYTES`, a value `state::stored::MAX_VALUE_BYTES`; postcard reads at
//!   most the bytes it is given, so a crafted length allocates nothing.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::evolution::Semantics;
use super::ledger::{Gap, OffsetLedger};
use super::{CheckpointId, Manifest, PartRef, PartitionEntry, Segment, SegmentKind};
use crate::model::NextOffset;
use crate::model::Partition;
use crate::state::stored::StoredCounters;
use crate::time::EventTime;

/// The checkpoint format this tally writes.
pub(crate) const VERSION: u16 = 8;
/// The oldest format it reads.
pub(crate) const OLDEST_READ: u16 = 3;

pub(crate) const MANIFEST_MAGIC: &[u8; 8] = b"TALLYMAN";
pub(crate) const PART_MAGIC: &[u8; 8] = b"TALLYPRT";
const HEADER: usize = 10;

/// The largest manifest read (about 150 bytes a partition: far above any real one).
pub(crate) const MAX_MANIFEST_BYTES: u64 = 16 << 20;
/// The largest part read: parts close at `part::PART_TARGET` (8 MiB) plus one entry.
pub const MAX_PART_BYTES: u64 = 256 << 20;

/// What to do with a checkpoint of a format older than `OLDEST_READ`.
pub(crate) fn legacy_way_out() -> String {
    format!(
        "this tally reads formats {OLDEST_READ} to {VERSION} and does not convert older ones. Either \
         keep running the tally that wrote them until a re-bill, or start this one from the log with \
         `tally run --reset-state earliest` (the topic must still hold every record), or point \
         `checkpoint.dir` at an empty store with a new `kafka.group_id`"
    )
}

/// The framing header of `magic`.
pub(crate) fn header(magic: &[u8; 8]) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(magic);
    h[8..].copy_from_slice(&VERSION.to_be_bytes());
    h
}

/// Why an object of the store could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// Another checkpoint format, older or newer: refused by name, with the way out.
    OtherFormat(String),
    /// Damage: a checksum, a length or a field out of range, an I/O failure.
    Damaged(String),
}

impl Unreadable {
    /// The same reason, said of `what` (the object's location).
    pub(crate) fn of(self, what: &str) -> Self {
        match self {
            Unreadable::OtherFormat(m) => Unreadable::OtherFormat(format!("{what}: {m}")),
            Unreadable::Damaged(m) => Unreadable::Damaged(format!("{what}: {m}")),
        }
    }
}

impl From<String> for Unreadable {
    fn from(msg: String) -> Self {
        Unreadable::Damaged(msg)
    }
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::OtherFormat(m) | Unreadable::Damaged(m) => f.write_str(m),
        }
    }
}

/// Checks the framing of `buf` (kind `magic`, called `what`), returning the body.
/// A foreign, old or future format is named.
pub(crate) fn body<'b>(buf: &'b [u8], magic: &[u8; 8], what: &str) -> Result<&'b [u8], Unreadable> {
    versioned_body(buf, magic, what).map(|(_, b)| b)
}

/// `body`, with the format version it was written in.
fn versioned_body<'b>(
    buf: &'b [u8],
    magic: &[u8; 8],
    what: &str,
) -> Result<(u16, &'b [u8]), Unreadable> {
    if buf.len() >= 8 && (&buf[..8] == b"TALLYPS1" || &buf[..8] == b"TALLYPS2") {
        return Err(Unreadable::OtherFormat(format!(
            "a partition file of checkpoint format {} (before object storage); {}",
            if buf[7] == b'1' { 1 } else { 2 },
            legacy_way_out()
        )));
    }
    if buf.len() < HEADER || &buf[..8] != magic {
        return Err(Unreadable::Damaged(format!(
            "not a tally {what} (no {:?} magic)",
            String::from_utf8_lossy(magic)
        )));
    }
    let version = u16::from_be_bytes([buf[8], buf[9]]);
    match version {
        OLDEST_READ..=VERSION => Ok((version, &buf[HEADER..])),
        v if v < OLDEST_READ => Err(Unreadable::OtherFormat(format!(
            "{what} of checkpoint format {v}, written by an older tally; {}",
            legacy_way_out()
        ))),
        v => Err(Unreadable::OtherFormat(format!(
            "{what} of checkpoint format {v}, written by a newer tally (this one reads format \
             {VERSION}): run that version, or a newer one than this"
        ))),
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct ManifestBody {
    id: u64,
    worker: String,
    created_at_ms: i64,
    group: String,
    topic: String,
    fingerprint: String,
    semantics: Option<Semantics>,
    partitions: Vec<PartitionBody>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PartitionBody {
    partition: i32,
    next_offset: i64,
    watermark: Option<i64>,
    high_water: Option<i64>,
    counters: StoredCounters,
    ledger: LedgerBody,
    segments: Vec<SegmentBody>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SegmentBody {
    checkpoint: String,
    kind: KindBody,
    parts: Vec<PartBody>,
}

#[derive(Debug, Serialize, Deserialize)]
enum KindBody {
    Base,
    Delta {
        windows_through: Option<i64>,
        dedup_through: Option<i64>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct LedgerBody {
    empty_offsets: u64,
    gap_offsets: u64,
    /// `(from, to, at_ms)`.
    gaps: Vec<(i64, i64, i64)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PartBody {
    bytes: u64,
    sha256: [u8; 32],
}

/// The manifest object: framing, postcard body, sha256 of both.
pub fn encode_manifest(m: &Manifest) -> Vec<u8> {
    let body = ManifestBody {
        id: m.id.0,
        worker: m.worker.clone(),
        created_at_ms: m.created_at_ms,
        group: m.group.clone(),
        topic: m.topic.clone(),
        fingerprint: m.fingerprint.clone(),
        semantics: m.semantics.clone(),
        partitions: m
            .partitions
            .iter()
            .map(|e| PartitionBody {
                partition: e.partition.0,
                next_offset: e.next_offset.0,
                watermark: e.watermark.map(|w| w.0),
                high_water: e.high_water,
                counters: e.counters.into(),
                ledger: LedgerBody {
                    empty_offsets: e.offsets.empty_offsets,
                    gap_offsets: e.offsets.gap_offsets,
                    gaps: e
                        .offsets
                        .gaps
                        .iter()
                        .map(|g| (g.from, g.to, g.at_ms))
                        .collect(),
                },
                segments: e
                    .segments
                    .iter()
                    .map(|g| SegmentBody {
                        checkpoint: g.checkpoint.clone(),
                        kind: match g.kind {
                            SegmentKind::Base => KindBody::Base,
                            SegmentKind::Delta {
                                windows_through,
                                dedup_through,
                            } => KindBody::Delta {
                                windows_through,
                                dedup_through,
                            },
                        },
                        parts: g
                            .parts
                            .iter()
                            .map(|p| PartBody {
                                bytes: p.bytes,
                                sha256: p.sha256,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
    };
    let mut bytes = crate::state::stored::encode(&body);
    let input = m.semantics.as_ref().map_or("", |s| s.input.as_str());
    bytes.extend_from_slice(&crate::state::stored::encode(&input));
    let rating = m.semantics.as_ref().map_or("", |s| s.rating.as_str());
    bytes.extend_from_slice(&crate::state::stored::encode(&rating));
    seal(&bytes)
}

/// A manifest's body by its format (the header's compatibility notes): the input
/// mapping follows it from format 7 on, the rating from format 8 on.
fn body_of(version: u16, body: &[u8]) -> Result<ManifestBody, postcard::Error> {
    match version {
        3 => postcard::from_bytes::<older::ManifestBodyV3>(body).map(|b| b.upgrade().upgrade()),
        4 => {
            postcard::from_bytes::<older::ManifestBodyV4>(body).map(older::ManifestBodyV4::upgrade)
        }
        5 | 6 => postcard::from_bytes::<ManifestBody>(body),
        7 => postcard::take_from_bytes::<ManifestBody>(body).and_then(|(mut b, rest)| {
            let input: String = postcard::from_bytes(rest)?;
            if let Some(s) = &mut b.semantics {
                s.input = input;
            }
            Ok(b)
        }),
        _ => postcard::take_from_bytes::<ManifestBody>(body).and_then(|(mut b, rest)| {
            let (input, rest) = postcard::take_from_bytes::<String>(rest)?;
            let rating: String = postcard::from_bytes(rest)?;
            if let Some(s) = &mut b.semantics {
                s.input = input;
                s.rating = rating;
            }
            Ok(b)
        }),
    }
}

/// A manifest object around an encoded body: framing, body, sha256 of both.
pub(crate) fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = header(MANIFEST_MAGIC).to_vec();
    out.extend_from_slice(body);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

#[cfg(test)]
/// The body of a sealed manifest (no checks: for tests that mutate it).
pub(crate) fn unseal(m: &[u8]) -> &[u8] {
    &m[HEADER..m.len().saturating_sub(32).max(HEADER)]
}

/// Decodes a manifest object (pure: any bytes in, a manifest or the reason out;
/// no panic, no allocation beyond the input).
pub fn decode_manifest(buf: &[u8]) -> Result<Manifest, Unreadable> {
    if buf.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(format!("{} bytes, more than a manifest can be", buf.len()).into());
    }
    if !buf.starts_with(MANIFEST_MAGIC) && matches!(buf.first(), Some(1 | 2)) {
        return Err(Unreadable::OtherFormat(format!(
            "a manifest of checkpoint format {} (bincode, before object storage); {}",
            buf[0],
            legacy_way_out()
        )));
    }
    let (version, _) = versioned_body(buf, MANIFEST_MAGIC, "manifest")?;
    if buf.len() < HEADER + 32 {
        return Err(String::from("truncated manifest").into());
    }
    let (framed, sum) = buf.split_at(buf.len() - 32);
    if Sha256::digest(framed).as_slice() != sum {
        return Err(String::from("manifest checksum mismatch").into());
    }
    let b = body_of(version, &framed[HEADER..]).map_err(|e| e.to_string())?;
    let m = Manifest {
        format: version,
        id: CheckpointId(b.id),
        worker: b.worker,
        created_at_ms: b.created_at_ms,
        group: b.group,
        topic: b.topic,
        fingerprint: b.fingerprint,
        semantics: b.semantics,
        partitions: b
            .partitions
            .into_iter()
            .map(|p| PartitionEntry {
                partition: Partition(p.partition),
                next_offset: NextOffset(p.next_offset),
                watermark: p.watermark.map(EventTime),
                high_water: p.high_water,
                counters: p.counters.into(),
                offsets: OffsetLedger {
                    empty_offsets: p.ledger.empty_offsets,
                    gap_offsets: p.ledger.gap_offsets,
                    gaps: p
                        .ledger
                        .gaps
                        .into_iter()
                        .map(|(from, to, at_ms)| Gap { from, to, at_ms })
                        .collect(),
                },
                segments: p
                    .segments
                    .into_iter()
                    .map(|g| Segment {
                        checkpoint: g.checkpoint,
                        kind: match g.kind {
                            KindBody::Base => SegmentKind::Base,
                            KindBody::Delta {
                                windows_through,
                                dedup_through,
                            } => SegmentKind::Delta {
                                windows_through,
                                dedup_through,
                            },
                        },
                        parts: g
                            .parts
                            .into_iter()
                            .map(|x| PartRef {
                                bytes: x.bytes,
                                sha256: x.sha256,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
    };
    check_manifest(&m)?;
    Ok(m)
}

/// What a checksum cannot vouch for (the writer may have been wrong, or the
/// object crafted): every partition and position is in range.
fn check_manifest(m: &Manifest) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for e in &m.partitions {
        let p = e.partition;
        if p.0 < 0 {
            return Err(format!("partition {p}: a negative partition number"));
        }
        if !seen.insert(p) {
            return Err(format!("partition {p} is listed twice"));
        }
        if e.next_offset.0 < 0 {
            return Err(format!(
                "partition {p}: field `next_offset` is {}, below 0",
                e.next_offset.0
            ));
        }
        check_ledger(p, e)?;
        check_chain(p, &e.segments)?;
    }
    Ok(())
}

/// The offset ledger can balance for some count of records consumed: its empty
/// and deleted offsets fit below `next_offset` (checked sums: `u64::MAX` twice
/// must not wrap to a small number), and so does every gap it keeps. Whether it
/// balances with the restored counters is checked when the parts are loaded.
fn check_ledger(p: Partition, e: &PartitionEntry) -> Result<(), String> {
    let o = &e.offsets;
    let next = e.next_offset.0;
    let skipped = o.empty_offsets.checked_add(o.gap_offsets);
    if skipped.is_none_or(|s| s > next as u64) {
        return Err(format!(
            "partition {p}: its offset ledger cannot balance: empty_offsets {} + gap_offsets {} is \
             more than next_offset {next}",
            o.empty_offsets, o.gap_offsets
        ));
    }
    if let Some(g) = o
        .gaps
        .iter()
        .find(|g| g.from < 0 || g.from > g.to || g.to > next)
    {
        return Err(format!(
            "partition {p}: its offset ledger keeps a gap {}..{} outside 0..{next}",
            g.from, g.to
        ));
    }
    if o.gaps.len() > super::ledger::MAX_GAPS {
        return Err(format!(
            "partition {p}: its offset ledger keeps {} gaps, more than {}",
            o.gaps.len(),
            super::ledger::MAX_GAPS
        ));
    }
    Ok(())
}

/// A chain is one base, then deltas, each of plain checkpoint names and at least
/// one part of a readable size, at most `MAX_CHAIN` long.
fn check_chain(p: Partition, segments: &[Segment]) -> Result<(), String> {
    match segments.first() {
        None => {
            return Err(format!(
                "partition {p}: no segments (every snapshot has one)"
            ))
        }
        Some(s) if s.kind != SegmentKind::Base => {
            return Err(format!(
                "partition {p}: its chain does not start with a base"
            ))
        }
        Some(_) => {}
    }
    if segments.len() > MAX_CHAIN {
        return Err(format!(
            "partition {p}: a chain of {} segments, more than {MAX_CHAIN}",
            segments.len()
        ));
    }
    for (i, s) in segments.iter().enumerate() {
        if i > 0 && s.kind == SegmentKind::Base {
            return Err(format!("partition {p}: segment {i} is a second base"));
        }
        if !super::names::is_checkpoint_name(&s.checkpoint) {
            return Err(format!(
                "partition {p}: segment {i} names {:?}, not a checkpoint",
                s.checkpoint
            ));
        }
        if s.parts.is_empty() {
            return Err(format!("partition {p}: segment {i} has no parts"));
        }
        if let Some(x) = s.parts.iter().find(|x| x.bytes > MAX_PART_BYTES) {
            return Err(format!(
                "partition {p}: a part of {} bytes, more than a part can be",
                x.bytes
            ));
        }
    }
    Ok(())
}

/// The longest chain read: a base and more deltas than any writer makes
/// (`export::MAX_DELTAS`).
pub(crate) const MAX_CHAIN: usize = 64;

mod older;

#[cfg(test)]
mod roundtrip_tests;
#[cfg(test)]
mod tests;
