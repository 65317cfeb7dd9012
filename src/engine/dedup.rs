//! Per-partition deduplication of `request_id`s over an event-time horizon.
//!
//! Invariants: an id is a duplicate while the partition watermark is below its
//! expiry (`window_end - 1 + allowed_lateness + extra horizon`), so a copy arriving
//! after its window was purged is still recognised (docs/DESIGN.md §5). Expiry is judged
//! against the watermark only, never the wall clock, so replays decide identically.
//!
//! Expired entries are dropped lazily: a lookup treats an entry whose expiry is at
//! or below the current watermark as absent, and the table (`FpSet`) reuses such
//! slots in place; `drain_changes` compacts it when expired entries hold half of
//! it. The logical content (`entries`) is the same whenever that happens.
//!
//! In memory an id is a 96-bit fingerprint from SipHash-1-3 (fixed key, so replays
//! decide identically): 16 bytes per entry whatever the id's length, no allocation,
//! one cache line per lookup, which `PartitionTask::process_batch` prefetches. A
//! new id is taken for a duplicate only if its fingerprint equals a live one's:
//! with 10^7 live ids about 10^-22 per event, or 10^-9 over 10^13 events — far below
//! the hardware's own error rates. The persisted chunks keep the full ids.
//!
//! Persistence is by **expiry chunk**, not by id: every id of a window shares one
//! expiry, so the ids inserted since the last drain are appended to one packed
//! buffer per expiry (`u16` LE length + bytes), and `drain_changes` hands over those
//! chunks plus "everything expiring at or below W is dead". The state store writes
//! one value per chunk and one range delete — a checkpoint costs O(expiries), not
//! O(ids). An id may sit in two chunks (re-inserted after expiring); the larger
//! expiry wins on restore.
//!
//! Under a memory budget the recent ids stay exact in the table (the hot set)
//! and older ones move to the state store behind filters (`cold`): `spill_cold`
//! moves every live id out; `is_duplicate` asks the cold tier only when the hot
//! set has no live entry. An id is never both hot and live-cold (it is inserted
//! hot again only once its cold entry is dead), so the two tiers decide exactly
//! what one table would.

use std::hash::Hasher;
use std::sync::Arc;

use siphasher::sip128::{Hasher128, SipHasher13};

use super::cold::{Cold, DedupStore, MOVE_RUN};
use super::fpset::{Fp, FpSet, Slot};
use crate::model::Partition;

/// The fingerprint of a request id (see the module header).
pub(crate) type Fingerprint = Fp;

impl Fp {
    pub(crate) fn of(id: &str) -> Self {
        // A fixed key: fingerprints, and so decisions, are the same in every run.
        let mut h = SipHasher13::new_with_keys(0x7461_6c6c_7964_6564, 0x7570_5f69_6473_0001);
        h.write(id.as_bytes());
        let f = h.finish128();
        // All zero marks a free slot in the table.
        let b = (f.h2 as u32).max(u32::from(f.h1 == 0));
        Fp { a: f.h1, b }
    }
}

#[derive(Debug)]
pub(crate) struct Dedup {
    seen: FpSet,
    /// Ids inserted since the last drain, packed per expiry (few expiries, in
    /// no order; `last` is the one used last, nearly always the next one too).
    pending: Vec<(i64, Vec<u8>)>,
    last: usize,
    /// The watermark of the last lookup or sweep (entries at or below it are dead).
    watermark: i64,
    /// Ids moved out of memory (under a memory budget), if any.
    cold: Option<Cold>,
    /// The slot `is_duplicate` found for a new id at a watermark, for the
    /// `check_and_insert` that follows it (one probe per record, not two);
    /// cleared by anything else that changes the table.
    hint: Option<(Fp, i64, Slot)>,
}

impl Default for Dedup {
    fn default() -> Self {
        Self {
            seen: FpSet::default(),
            pending: Vec::new(),
            last: 0,
            watermark: i64::MIN,
            cold: None,
            hint: None,
        }
    }
}

/// What changed since the last drain, in the form the state store persists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DedupDelta {
    /// `(expiry, packed ids)`, expiries ascending, each above `dead_through`.
    pub chunks: Vec<(i64, Vec<u8>)>,
    /// Every entry expiring at or below this is dead (the watermark).
    pub dead_through: i64,
}

/// Memory packed chunks take (their buffers and their entries).
pub(crate) fn chunk_bytes(chunks: &[(i64, Vec<u8>)]) -> usize {
    let entry = std::mem::size_of::<(i64, Vec<u8>)>();
    chunks.iter().map(|(_, ids)| entry + ids.capacity()).sum()
}

/// Appends `id` to a packed chunk.
pub(crate) fn pack(buf: &mut Vec<u8>, id: &str) {
    let n = id.len().min(u16::MAX as usize);
    buf.extend_from_slice(&(n as u16).to_le_bytes());
    buf.extend_from_slice(&id.as_bytes()[..n]);
}

/// The ids of a packed chunk; `None` if it is malformed.
pub(crate) fn unpack(mut buf: &[u8]) -> Option<Vec<&str>> {
    let mut ids = Vec::new();
    while !buf.is_empty() {
        let n = u16::from_le_bytes([*buf.first()?, *buf.get(1)?]) as usize;
        ids.push(std::str::from_utf8(buf.get(2..2 + n)?).ok()?);
        buf = &buf[2 + n..];
    }
    Some(ids)
}

impl Dedup {
    /// Starts loading `fp`'s table slot (see `PartitionTask::process_batch`).
    pub(crate) fn prefetch(&self, fp: Fingerprint) {
        self.seen.prefetch(fp);
    }

    /// The line the lookups judge expiry against: the watermark, or, before the
    /// partition has one (`i64::MIN`, its first records under the lead limit's
    /// start rule, DESIGN §4.4), the least real time — for `FpSet` `i64::MIN`
    /// means "nothing is live", which would let a copy of a first record through.
    fn lookup_line(&self) -> i64 {
        self.watermark.max(i64::MIN + 1)
    }

    /// Whether `fp` is a live entry (a duplicate at `watermark`); changes nothing
    /// but the watermark. `check_and_insert` afterwards records it.
    pub(crate) fn is_duplicate(&mut self, fp: Fingerprint, watermark: i64) -> bool {
        self.watermark = self.watermark.max(watermark);
        let w = self.lookup_line();
        match self.seen.probe(fp, w) {
            Slot::Live(_) => return true,
            at => self.hint = Some((fp, w, at)),
        }
        match &mut self.cold {
            Some(cold) => cold.is_live(fp, self.watermark),
            None => false,
        }
    }

    /// Lets this set move ids to `store` (`spill_cold`), in buckets of `width` ms
    /// of expiries.
    pub(crate) fn attach_cold(
        &mut self,
        store: Arc<dyn DedupStore>,
        partition: Partition,
        width: i64,
    ) {
        self.cold = Some(Cold::new(store, partition, width));
    }

    /// Moves every live id out of memory to the cold tier (new filters of
    /// `bloom_bytes`), except those expiring too far ahead; returns how many
    /// moved. Only after a commit: the ids' chunks must be in the store already.
    /// The ids go in sorted runs of at most `cold::MOVE_RUN` (one file each), so
    /// a move holds one run besides the table, never a copy of it.
    pub(crate) fn spill_cold(&mut self, bloom_bytes: usize) -> Result<usize, String> {
        let Some(cold) = &mut self.cold else {
            return Ok(0);
        };
        let w = self.watermark;
        let (mut moved, mut stay) = (0, Vec::new());
        let mut run = Vec::with_capacity(MOVE_RUN.min(self.seen.len()));
        {
            let mut live = self.seen.iter().filter(|(_, e)| *e > w).peekable();
            while live.peek().is_some() {
                run.extend(live.by_ref().take(MOVE_RUN));
                let n = run.len();
                let hot = cold.take(std::mem::take(&mut run), w, bloom_bytes)?;
                moved += n - hot.len();
                stay.extend(hot);
            }
        }
        self.hint = None;
        self.seen = FpSet::default();
        for (fp, e) in stay {
            self.seen.insert_max(fp, e);
        }
        Ok(moved)
    }

    /// Restored ids (live, sorted, one per fingerprint) straight to the cold
    /// tier, or hot without one (or beyond its buckets).
    pub(crate) fn restore_cold(
        &mut self,
        ids: Vec<(Fp, i64)>,
        bloom_bytes: usize,
    ) -> Result<(), String> {
        let stay = match &mut self.cold {
            Some(cold) => cold.take(ids, self.watermark, bloom_bytes)?,
            None => ids,
        };
        self.hint = None;
        for (fp, e) in stay {
            self.seen.insert_max(fp, e);
        }
        Ok(())
    }

    /// Memory the hot table takes.
    pub(crate) fn hot_bytes(&self) -> usize {
        self.seen.bytes()
    }

    /// Memory the set takes: the hot table, the cold tier's filters, and the
    /// ids inserted since the last `drain_changes` (packed, for the next commit).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.seen.bytes() + self.cold.as_ref().map_or(0, Cold::bytes) + chunk_bytes(&self.pending)
    }

    /// Ids moved to the cold tier so far, and the store reads their filters caused.
    pub(crate) fn cold_stats(&self) -> (u64, u64) {
        self.cold
            .as_ref()
            .map_or((0, 0), |c| (c.moved(), c.reads()))
    }

    /// A failure to read the cold tier; the task's output since is void.
    pub(crate) fn take_error(&mut self) -> Option<super::spill_error::SpillError> {
        self.cold.as_mut().and_then(Cold::take_error)
    }

    /// Records `id` (whose fingerprint is `fp`); returns `true` if it is a live
    /// duplicate at `watermark`.
    pub(crate) fn check_and_insert(
        &mut self,
        fp: Fingerprint,
        id: &str,
        expires_at: i64,
        watermark: i64,
    ) -> bool {
        debug_assert_eq!(fp, Fingerprint::of(id));
        self.watermark = self.watermark.max(watermark);
        let w = self.lookup_line();
        // An entry expired but not swept yet is replaced: this is a new request.
        let at = match self.hint.take() {
            Some((f, hw, at)) if f == fp && hw == w => at,
            _ => self.seen.probe(fp, w),
        };
        if let Slot::Live(_) = at {
            return true;
        }
        self.seen.put(at, fp, expires_at, w);
        pack(self.pending_chunk(expires_at), id);
        false
    }

    fn pending_chunk(&mut self, expiry: i64) -> &mut Vec<u8> {
        if self
            .pending
            .get(self.last)
            .is_none_or(|(e, _)| *e != expiry)
        {
            self.last = match self.pending.iter().position(|(e, _)| *e == expiry) {
                Some(i) => i,
                None => {
                    self.pending.push((expiry, Vec::new()));
                    self.pending.len() - 1
                }
            };
        }
        &mut self.pending[self.last].1
    }

    /// Notes that the watermark reached `watermark` (entries at or below it expire).
    pub(crate) fn expire(&mut self, watermark: i64) {
        self.watermark = self.watermark.max(watermark);
        if let Some(cold) = &mut self.cold {
            cold.expire(self.watermark);
        }
    }

    /// Drops expired entries from memory if they are many (the table reuses them
    /// otherwise).
    fn sweep(&mut self) {
        self.hint = None;
        self.seen.compact(self.watermark);
    }

    /// Every live hot id's fingerprint with its expiry, in no particular order
    /// (cold ids are in the state store).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (Fingerprint, i64)> + '_ {
        let w = self.watermark;
        self.seen.iter().filter(move |(_, e)| *e > w)
    }

    /// Ids held in memory (live, or expired and not swept yet).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Sweeps, then hands over the changes since the last call. Chunks that are
    /// already dead are dropped, never written.
    pub(crate) fn drain_changes(&mut self) -> DedupDelta {
        self.sweep();
        let w = self.watermark;
        let mut chunks = std::mem::take(&mut self.pending);
        chunks.retain(|(exp, _)| *exp > w);
        chunks.sort_unstable_by_key(|(exp, _)| *exp);
        DedupDelta {
            chunks,
            dead_through: w,
        }
    }

    /// Rebuilds the set from persisted entries (no changes are recorded); for an
    /// id present more than once, the largest expiry wins.
    pub(crate) fn restore(
        entries: impl IntoIterator<Item = (Fingerprint, i64)>,
        watermark: i64,
    ) -> Self {
        let mut d = Dedup {
            watermark,
            ..Default::default()
        };
        for (id, expires_at) in entries {
            if expires_at > watermark {
                d.seen.insert_max(id, expires_at);
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_the_watermark_reaches_expiry() {
        let mut d = Dedup::default();
        assert!(!d.check_and_insert(Fingerprint::of("a"), "a", 100, 0));
        assert!(d.check_and_insert(Fingerprint::of("a"), "a", 100, 0));
        assert!(d.check_and_insert(Fingerprint::of("a"), "a", 100, 99));
        d.expire(100);
        assert_eq!(d.entries().count(), 0);
        assert!(
            !d.check_and_insert(Fingerprint::of("a"), "a", 200, 100),
            "expired: a new request"
        );
        assert!(!d.check_and_insert(Fingerprint::of("b"), "b", 200, 100));
        let delta = d.drain_changes();
        // The chunk of expiry 100 is dead at watermark 100: never written.
        let mut chunk = Vec::new();
        pack(&mut chunk, "a");
        pack(&mut chunk, "b");
        assert_eq!(
            delta,
            DedupDelta {
                chunks: vec![(200, chunk.clone())],
                dead_through: 100
            }
        );
        assert_eq!(unpack(&chunk), Some(vec!["a", "b"]));
        d.expire(300);
        let delta = d.drain_changes();
        assert!(delta.chunks.is_empty());
        assert_eq!(delta.dead_through, 300);
        assert!(d.is_empty(), "swept");
    }

    /// Before a partition has a watermark (`i64::MIN`: its first records, under
    /// the lead limit's start rule) a copy is still a duplicate.
    #[test]
    fn a_copy_before_the_partition_has_a_watermark_is_a_duplicate() {
        let mut d = Dedup::default();
        let fp = Fingerprint::of("a");
        assert!(!d.is_duplicate(fp, i64::MIN));
        assert!(!d.check_and_insert(fp, "a", 100, i64::MIN));
        assert!(d.is_duplicate(fp, i64::MIN));
        assert!(d.check_and_insert(fp, "a", 100, i64::MIN));
    }

    #[test]
    fn malformed_chunks_are_refused() {
        assert_eq!(unpack(&[5, 0, b'a']), None);
        assert_eq!(unpack(&[1]), None);
        assert_eq!(unpack(&[]), Some(vec![]));
    }

    /// The cold tier's store, in memory: the index the state store keeps.
    #[derive(Default)]
    struct MemCold(std::sync::Mutex<std::collections::BTreeMap<Fp, i64>>);

    impl DedupStore for MemCold {
        fn cold_expiry(&self, _: Partition, fp: Fp) -> Result<Option<i64>, String> {
            Ok(self.0.lock().unwrap().get(&fp).copied())
        }
        fn put_cold(&self, _: Partition, entries: &[(Fp, i64)]) -> Result<(), String> {
            assert!(
                entries.windows(2).all(|w| w[0].0 < w[1].0),
                "sorted, each once"
            );
            self.0.lock().unwrap().extend(entries.iter().copied());
            Ok(())
        }
    }

    /// Random inserts, lookups, watermark moves, moves to the cold tier and
    /// restores (from the live ids, as a restore from the chunks does) decide
    /// exactly as a map of every id to its latest expiry.
    #[test]
    fn spilled_and_restored_ids_decide_as_one_exact_map() {
        let mut reads = 0;
        for seed in 1..=40u64 {
            let mut rng = crate::gen::Rng::new(seed);
            let mut model: std::collections::HashMap<Fp, i64> = Default::default();
            let fresh = |w: i64| {
                let mut d = Dedup::restore([], w);
                d.attach_cold(Arc::new(MemCold::default()), Partition(0), 500);
                d
            };
            let mut d = fresh(i64::MIN);
            let mut w = 0i64;
            for step in 0..3_000 {
                match rng.below(100) {
                    // An event: its id from a small pool (duplicates, re-inserts
                    // after expiry), expiring up to 3 000 ms ahead, some far out.
                    0..=79 => {
                        let id = format!("id-{}", rng.below(400));
                        let fp = Fp::of(&id);
                        let expiry = if rng.below(50) == 0 {
                            w + 1_000_000
                        } else {
                            w + 1 + rng.below(3_000) as i64
                        };
                        let want = model.get(&fp).is_some_and(|e| *e > w);
                        assert_eq!(d.is_duplicate(fp, w), want, "seed {seed} step {step}: {id}");
                        if !want {
                            d.check_and_insert(fp, &id, expiry, w);
                            model.insert(fp, expiry);
                        }
                    }
                    80..=89 => {
                        w += rng.below(300) as i64;
                        d.expire(w);
                    }
                    90..=96 => {
                        d.drain_changes();
                        d.spill_cold(4096).unwrap();
                        assert!(d.len() <= model.len());
                    }
                    // A restore: the live ids come back into memory, hot.
                    _ => {
                        reads += d.cold_stats().1;
                        let live: Vec<(Fp, i64)> = model
                            .iter()
                            .filter(|(_, e)| **e > w)
                            .map(|(f, e)| (*f, *e))
                            .collect();
                        d = fresh(w);
                        d = Dedup {
                            cold: d.cold.take(),
                            ..Dedup::restore(live, w)
                        };
                    }
                }
                assert!(d.take_error().is_none());
            }
            reads += d.cold_stats().1;
        }
        assert!(
            reads > 100,
            "the cold tier was read {reads} times: not exercised"
        );
    }

    /// A move of more ids than a run writes them in runs (each sorted, at most
    /// `MOVE_RUN`), and every one of them stays a duplicate.
    #[test]
    fn a_large_move_goes_in_runs_and_keeps_every_id() {
        #[derive(Default)]
        struct Runs(std::sync::Mutex<Vec<usize>>, MemCold);
        impl DedupStore for Runs {
            fn cold_expiry(&self, p: Partition, fp: Fp) -> Result<Option<i64>, String> {
                self.1.cold_expiry(p, fp)
            }
            fn put_cold(&self, p: Partition, entries: &[(Fp, i64)]) -> Result<(), String> {
                self.0.lock().unwrap().push(entries.len());
                self.1.put_cold(p, entries)
            }
        }
        let store = Arc::new(Runs::default());
        let mut d = Dedup::restore([], 0);
        d.attach_cold(store.clone(), Partition(0), 1_000);
        let n = 2 * MOVE_RUN + 5;
        let id = |i: usize| Fingerprint::of(&format!("req-{i}"));
        for i in 0..n {
            let name = format!("req-{i}");
            assert!(!d.check_and_insert(id(i), &name, 10 + (i % 3_000) as i64, 0));
        }
        d.drain_changes();
        assert_eq!(d.spill_cold(4096), Ok(n));
        assert_eq!(d.len(), 0, "every id moved out");
        assert_eq!(*store.0.lock().unwrap(), [MOVE_RUN, MOVE_RUN, 5]);
        assert!((0..n).step_by(997).all(|i| d.is_duplicate(id(i), 0)));
        assert!(!d.is_duplicate(Fingerprint::of("never"), 0));
    }

    #[test]
    fn restore_keeps_expiries() {
        let f = Fingerprint::of;
        let mut d = Dedup::restore([(f("x"), 5), (f("y"), 3), (f("y"), 2)], 0);
        assert!(d.check_and_insert(Fingerprint::of("x"), "x", 9, 4));
        assert!(!d.check_and_insert(Fingerprint::of("y"), "y", 9, 4));
        assert_eq!(d.entries().count(), 2);
    }
}
