//! Loading one candidate's chain into the working state, streamed in waves.
//!
//! Invariants:
//! - A restore holds at most one wave of parts in memory, however long the chain
//!   and whatever sizes its manifest lists: a wave is up to `READ_THREADS`
//!   consecutive parts whose listed sizes fit its share of the store's read
//!   budget (`READ_BUDGET` in production, shared by the `RESTORERS` partitions
//!   restored at once: 8 MiB, one part, each), or a single part when one alone
//!   is larger (at most `format::MAX_PART_BYTES`, checked when the manifest was
//!   decoded).
//!   The wave's parts are read in parallel, each checked against the manifest
//!   (size, then sha256) and its framing (`part::entries`, which allocates
//!   nothing per entry), and written to the working state in chain order before
//!   the next wave is read.
//! - Writing part by part is writing segment by segment: a base first drops the
//!   partition, a delta first applies its two range deletes, and the rest of a
//!   segment's parts are plain writes after them.
//! - Damage anywhere — a part, the state it builds, an offset ledger that cannot
//!   balance with the restored counters — fails the candidate and leaves the
//!   partition empty; the caller falls back. A failure to read is returned as
//!   it is (`CheckpointError::is_damage` says which is which).

use std::ops::Range;

use sha2::{Digest, Sha256};

use super::CheckpointStore;
use crate::checkpoint::format::MAX_PART_BYTES;
use crate::checkpoint::names::{manifest_key, part_key};
use crate::checkpoint::objects::ObjectError;
use crate::checkpoint::part::entries;
use crate::checkpoint::{hex, CheckpointError, PartitionEntry, Segment, SegmentKind};
use crate::model::Partition;
use crate::state::{PartitionMeta, StateError, StateStore};

/// Parts a restore reads at once (object stores serve them in parallel).
const READ_THREADS: usize = 8;

/// The listed bytes of the parts the restores running at once hold (parts are
/// about 8 MiB: one each). Part of a worker's fixed memory overhead
/// (docs/DESIGN.md §7.7).
pub(crate) const READ_BUDGET: u64 = 32 << 20;

/// Partitions restored at once (`CheckpointStore::restore_many`); each holds
/// a wave of at most `READ_BUDGET / RESTORERS` listed bytes.
pub(crate) const RESTORERS: usize = 4;

/// The waves of a chain whose parts list `sizes`, in order: consecutive runs of
/// at most `threads` parts and `budget` listed bytes — or one part alone, when
/// it is larger than `budget` by itself.
pub(super) fn waves(sizes: &[u64], budget: u64, threads: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < sizes.len() {
        let mut end = start + 1;
        let mut held = sizes[start];
        while end < sizes.len() && end - start < threads.max(1) {
            match held.checked_add(sizes[end]) {
                Some(h) if h <= budget => held = h,
                _ => break,
            }
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
}

#[cfg(test)]
thread_local! {
    /// The most listed bytes one load held at once (tests read it).
    pub(super) static PEAK_HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

impl CheckpointStore {
    /// Reads and checks part `i` of segment `seg` of partition `p`; every failure
    /// says which object and what is wrong.
    pub(super) fn read_part(
        &self,
        seg: &Segment,
        p: Partition,
        i: usize,
    ) -> Result<Vec<u8>, CheckpointError> {
        let key = part_key(&seg.checkpoint, p, i);
        let want = seg.parts[i];
        let corrupt = |msg: String| CheckpointError::Corrupt {
            path: self.objects.location(&key),
            msg,
        };
        let buf = match self.objects.get(&key, want.bytes.min(MAX_PART_BYTES)) {
            Ok(b) => b,
            Err(ObjectError::Refused { msg, .. }) => return Err(corrupt(msg)),
            Err(e) => return Err(e.into()),
        };
        if buf.len() as u64 != want.bytes {
            return Err(corrupt(format!(
                "size mismatch: the manifest records {} bytes, the object has {}",
                want.bytes,
                buf.len()
            )));
        }
        let sha: [u8; 32] = Sha256::digest(&buf).into();
        if sha != want.sha256 {
            return Err(corrupt(format!(
                "checksum mismatch: the manifest records sha256 {}…, the object hashes to {}…",
                short(&hex(&want.sha256)),
                short(&hex(&sha))
            )));
        }
        Ok(buf)
    }

    /// Reads the parts `wave` of `all` (`(segment, part)` of `entry`'s chain) in
    /// parallel; returns them in order, or the first failure in chain order.
    fn read_wave(
        &self,
        entry: &PartitionEntry,
        all: &[(usize, usize)],
        wave: Range<usize>,
    ) -> Result<Vec<Vec<u8>>, CheckpointError> {
        let p = entry.partition;
        let read = |n: usize| {
            let (s, i) = all[n];
            self.read_part(&entry.segments[s], p, i)
        };
        if wave.len() == 1 {
            return Ok(vec![read(wave.start)?]);
        }
        std::thread::scope(|scope| {
            super::joined(wave.map(|n| scope.spawn(move || read(n))).collect())
                .into_iter()
                .collect()
        })
    }

    /// Reads, checks and imports partition `entry` of checkpoint `name`: its
    /// base, then each delta in order, a wave of parts at a time. Any failure
    /// leaves the partition empty in `state`.
    pub(super) fn load_snapshot(
        &self,
        name: &str,
        entry: &PartitionEntry,
        state: &StateStore,
    ) -> Result<PartitionMeta, CheckpointError> {
        let loaded = self.import_chain(entry, state).and_then(|()| {
            let p = entry.partition;
            let corrupt = |msg: String| CheckpointError::Corrupt {
                path: self.objects.location(&manifest_key(name)),
                msg: format!("partition {p}: {msg}"),
            };
            // The meta alone: the partition's windows and ids stay in the store
            // (`state::bounded` builds the task from there, within the budget).
            let meta = state
                .meta(p)
                .map_err(|e| corrupt(e.to_string()))?
                .ok_or_else(|| corrupt("no partition meta in its chain".into()))?;
            let (c, o) = (&meta.counters, &entry.offsets);
            if !o.balanced(c.consumed, entry.next_offset) {
                return Err(corrupt(format!(
                    "its offset ledger cannot balance: consumed {} + empty_offsets {} + gap_offsets {} \
                     ≠ next_offset {}",
                    c.consumed, o.empty_offsets, o.gap_offsets, entry.next_offset.0
                )));
            }
            if !c.balanced() {
                return Err(corrupt(format!(
                    "its audit counters cannot balance: consumed {} ≠ folded {} + too_late {} + \
                     dead_letter {} + duplicate {}",
                    c.consumed, c.folded, c.too_late, c.dead_letter, c.duplicate
                )));
            }
            Ok(meta)
        });
        if loaded.is_err() {
            // Best effort: the next candidate imports over it anyway.
            let _ = state.drop_partition(entry.partition);
        }
        loaded
    }

    /// Streams `entry`'s chain into `state`, a wave at a time (module header).
    fn import_chain(
        &self,
        entry: &PartitionEntry,
        state: &StateStore,
    ) -> Result<(), CheckpointError> {
        let p = entry.partition;
        let all: Vec<(usize, usize)> = entry
            .segments
            .iter()
            .enumerate()
            .flat_map(|(s, seg)| (0..seg.parts.len()).map(move |i| (s, i)))
            .collect();
        let sizes: Vec<u64> = all
            .iter()
            .map(|&(s, i)| entry.segments[s].parts[i].bytes)
            .collect();
        let budget = self.read_budget / RESTORERS as u64;
        for wave in waves(&sizes, budget, READ_THREADS) {
            #[cfg(test)]
            PEAK_HELD.with(|peak| peak.set(peak.get().max(sizes[wave.clone()].iter().sum())));
            let bufs = self.read_wave(entry, &all, wave.clone())?;
            for (&(s, i), buf) in all[wave].iter().zip(&bufs) {
                let seg = &entry.segments[s];
                let path = || self.objects.location(&part_key(&seg.checkpoint, p, i));
                let entries = entries(buf, p, i as u32)
                    .map_err(|msg| CheckpointError::Corrupt { path: path(), msg })?;
                // A key the state cannot hold is damage of this part: named, so the
                // restore falls back and the operator knows which object.
                let damage = |e: StateError| match e {
                    StateError::Corrupt { key, msg } => CheckpointError::Corrupt {
                        path: path(),
                        msg: format!("{msg} (key {key})"),
                    },
                    other => other.into(),
                };
                match (seg.kind, i) {
                    (SegmentKind::Base, 0) => state.import_partition(p, entries),
                    (
                        SegmentKind::Delta {
                            windows_through,
                            dedup_through,
                        },
                        0,
                    ) => state.apply_delta(p, windows_through, dedup_through, entries),
                    // The segment's deletes are behind it: the rest are writes.
                    _ => state.apply_delta(p, None, None, entries),
                }
                .map_err(damage)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_hold_at_most_the_budget_or_one_part() {
        let mib = 1u64 << 20;
        // Parts of a writer: 8 at a time within 64 MiB.
        let eight = vec![8 * mib; 20];
        assert_eq!(waves(&eight, 64 * mib, 8), [0..8, 8..16, 16..20]);
        // The crafted chain of issue 33: 12 parts of 256 MiB, one at a time.
        let big = vec![256 * mib; 12];
        let w = waves(&big, 64 * mib, 8);
        assert_eq!(w.len(), 12);
        assert!(w.iter().all(|r| r.len() == 1));
        // Sizes that would overflow a sum, and empty parts.
        assert_eq!(waves(&[u64::MAX, u64::MAX, 1], 64, 8), [0..1, 1..2, 2..3]);
        assert_eq!(waves(&[0, 0, 0], 0, 2), [0..2, 2..3]);
        assert!(waves(&[], 1, 8).is_empty());
        // Every part is in exactly one wave, in order.
        let mixed = [1, 70, 3, 3, 3, 200, 1, 1];
        let w = waves(&mixed, 64, 3);
        let flat: Vec<usize> = w.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(flat, (0..mixed.len()).collect::<Vec<_>>());
        for r in &w {
            let held: u64 = mixed[r.clone()].iter().sum();
            assert!(r.len() == 1 || (held <= 64 && r.len() <= 3), "{r:?}");
        }
    }
}
