//! Cold dedup ids: the ids a partition moved out of memory under the memory
//! budget, kept in the state store (an index by fingerprint, `DedupStore`) behind
//! in-memory Bloom filters, one per bucket of expiries.
//!
//! - `Dedup` keeps its recent ids exactly (the hot `FpSet`); under the budget it
//!   moves them here (`Cold::take`): they are written to the store's index, then
//!   added to the filter of their expiry's bucket (`width` ms of expiries each).
//! - A lookup that misses the hot set asks the filters of the buckets that can
//!   still hold a live expiry; only on "maybe" does it read the store — one point
//!   read, whose stored expiry decides. A filter's false "maybe" costs a read,
//!   never a decision: which record is a duplicate is exactly as if every id were
//!   in memory.
//! - A bucket is dropped once the watermark passes its last expiry; the store's
//!   index forgets expired ids by itself (`state`'s compaction filter), and a
//!   stored expiry at or below the watermark is dead anyway.
//! - Buckets have a fixed size, chosen when they are made (`bloom_bytes`); at
//!   most `MAX_BUCKETS` exist: ids expiring beyond them stay hot (the far future
//!   is rare, and a bad clock must not allocate filters).
//! - Pure logic: every read and write goes through the `DedupStore` port. A
//!   failed read is remembered (`take_error`): the task's output since is void,
//!   and the worker stops.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::bloom::Bloom;
use super::fpset::Fp;
use super::spill_error::SpillError;
use crate::model::Partition;

/// The most buckets of filters a partition holds.
pub(crate) const MAX_BUCKETS: usize = 16;

/// The most ids a move writes at once (one sorted run, one file; 6 MiB as
/// `(Fp, i64)`): a move or a restore holds one run, not a copy of every id.
pub(crate) const MOVE_RUN: usize = 1 << 18;

/// Where a partition's cold ids live (the state store, in a worker).
pub(crate) trait DedupStore: Send + Sync {
    /// The expiry stored for `fp` in `partition`, if any.
    fn cold_expiry(&self, partition: Partition, fp: Fp) -> Result<Option<i64>, String>;
    /// Stores `entries` (sorted by fingerprint, each once) as cold ids of
    /// `partition`, replacing any stored expiry of the same fingerprint.
    fn put_cold(&self, partition: Partition, entries: &[(Fp, i64)]) -> Result<(), String>;
}

pub(crate) struct Cold {
    store: Arc<dyn DedupStore>,
    partition: Partition,
    /// Bucket `b` holds ids expiring in `[b * width, (b + 1) * width)`.
    buckets: BTreeMap<i64, Bloom>,
    width: i64,
    /// Ids moved here so far (some may have expired since).
    moved: u64,
    /// Store reads so far (filter "maybe"s).
    reads: u64,
    error: Option<SpillError>,
}

impl std::fmt::Debug for Cold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cold")
            .field("buckets", &self.buckets.len())
            .field("moved", &self.moved)
            .finish()
    }
}

impl Cold {
    pub(crate) fn new(store: Arc<dyn DedupStore>, partition: Partition, width: i64) -> Self {
        Self {
            store,
            partition,
            buckets: BTreeMap::new(),
            width: width.max(1),
            moved: 0,
            reads: 0,
            error: None,
        }
    }

    fn bucket(&self, expiry: i64) -> i64 {
        expiry.div_euclid(self.width)
    }

    /// Whether `fp` is a cold id live at `watermark` (expiring above it).
    pub(crate) fn is_live(&mut self, fp: Fp, watermark: i64) -> bool {
        // Nothing moved out (no budget, or not yet): no division on the hot path.
        if self.buckets.is_empty() {
            return false;
        }
        let first = self.bucket(watermark);
        if !self.buckets.range(first..).any(|(_, b)| b.maybe(fp)) {
            return false;
        }
        self.reads += 1;
        match self.store.cold_expiry(self.partition, fp) {
            Ok(e) => e.is_some_and(|e| e > watermark),
            Err(msg) => {
                self.error.get_or_insert(SpillError {
                    doing: "reading a cold dedup id".into(),
                    msg,
                });
                false
            }
        }
    }

    /// Moves `entries` (live at `watermark`) here: writes them to the store, then
    /// to the filters (new buckets of `bloom_bytes`). Returns the entries that
    /// stay hot (expiring beyond `MAX_BUCKETS` buckets). On a write failure
    /// nothing moves.
    pub(crate) fn take(
        &mut self,
        mut entries: Vec<(Fp, i64)>,
        watermark: i64,
        bloom_bytes: usize,
    ) -> Result<Vec<(Fp, i64)>, String> {
        self.expire(watermark);
        let mut hot = Vec::new();
        let mut allowed = self.buckets.len();
        let mut new_buckets = std::collections::BTreeSet::new();
        entries.retain(|&(fp, e)| {
            let b = self.bucket(e);
            if self.buckets.contains_key(&b) || new_buckets.contains(&b) {
                return true;
            }
            if allowed < MAX_BUCKETS {
                allowed += 1;
                new_buckets.insert(b);
                return true;
            }
            hot.push((fp, e));
            false
        });
        entries.sort_unstable();
        if let Err(e) = self.store.put_cold(self.partition, &entries) {
            self.error.get_or_insert(SpillError {
                doing: "moving dedup ids out of memory".into(),
                msg: e.clone(),
            });
            return Err(e);
        }
        for b in new_buckets {
            self.buckets.insert(b, Bloom::with_bytes(bloom_bytes));
        }
        for &(fp, e) in &entries {
            let b = self.bucket(e);
            if let Some(f) = self.buckets.get_mut(&b) {
                f.insert(fp);
            }
        }
        self.moved += entries.len() as u64;
        Ok(hot)
    }

    /// Drops the buckets whose every expiry is at or below `watermark`.
    pub(crate) fn expire(&mut self, watermark: i64) {
        let first = self.bucket(watermark);
        self.buckets = self.buckets.split_off(&first);
    }

    /// Memory the filters take.
    pub fn bytes(&self) -> usize {
        self.buckets.values().map(Bloom::bytes).sum()
    }

    pub(crate) fn moved(&self) -> u64 {
        self.moved
    }

    pub(crate) fn reads(&self) -> u64 {
        self.reads
    }

    pub(crate) fn take_error(&mut self) -> Option<SpillError> {
        self.error.take()
    }
}
