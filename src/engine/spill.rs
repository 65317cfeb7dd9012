//! Window spill: the windows a task keeps only in the state store.
//!
//! A task holds its windows in memory; under a memory budget the worker asks it,
//! right after a checkpoint commit (when every window is clean, i.e. equal to its
//! stored copy), to `evict` windows beyond the budget — fired windows oldest end
//! first (they are only touched by late events and their purge), then open windows
//! latest end first (they fire last). An evicted window exists only in the store;
//! the task remembers how many it evicted per window end, separately for open and
//! fired ends, and reads them back through `SpillStore`:
//! - an event for `(end, tenant)` not in memory, where `end` has evicted windows,
//!   looks the window up (one point read; absent means a new window);
//! - an end that fires loads its stored windows, so its on-time panes are
//!   complete and in tenant order: all at once when it has at most a firing
//!   run of them (`firing::RUN`), else in steps of a run each, in tenant order
//!   after a cursor (`windows_ending_after`, `task::firing`);
//! - purging an end drops its counts; the store deletes the end's windows with
//!   one range delete at the next commit.
//!
//! Invariants: a window is in memory or counted here, never both; only clean
//! windows are evicted; a stored window whose end has no count is never read (it
//! is in memory, or purged and awaiting the range delete). Results do not depend on
//! what is in memory: spilling changes where a window lives, not what it holds.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::spill_error::SpillError;
use super::{WindowAcc, WindowPhase};
use crate::model::Partition;

/// Memory one clean window takes while in memory (hash-map slot with its tenant
/// key and 96-byte accumulator, at the map's load between 7/16 and 7/8; the
/// tenant string; the map's share of its window end), for turning a byte budget
/// into a window count. Measured with `tally-dev bench-memory` (BENCHMARKS.md
/// §4.2): about 310 bytes of RSS a window; it was 200 (160 measured before line
/// items, +40) until the RSS of a budgeted worker was measured against its
/// budget. A line beyond the first counts `LINE_BYTES` more.
pub(crate) const WINDOW_BYTES: usize = 320;

/// What a changed window costs besides itself until the state store has it:
/// its entry in the task's dirty list (a window key and its tenant string) and
/// its copy in the delta a commit writes (`StateDelta::changed`, 128 bytes an
/// element). Counted by `PartitionTask::budgeted_bytes`, so the windows and the
/// copy a checkpoint takes of them fit in the budget together.
pub(crate) const CHANGE_BYTES: usize = 176;

/// What a changed window costs until a commit (`CHANGE_BYTES`), with the bytes
/// of a tenant id beyond 16 (its dirty-list entry, then its copy in the delta,
/// hold one copy of the id each).
pub(crate) fn change_bytes(tenant: &str) -> usize {
    CHANGE_BYTES + tenant.len().saturating_sub(16)
}

impl super::StateDelta {
    /// Memory the delta holds until the state store has it, as the budget
    /// counts it: `CHANGE_BYTES` a changed window (its copy; the dirty-list
    /// entry is gone once drained), plus a tenant id beyond 16 bytes and the line
    /// items beyond the first, and the dedup chunks' packed ids. A checkpoint's
    /// delta is in flight for this long on the export thread
    /// (`checkpoint::export`), and the memory check counts it against the budget.
    pub fn bytes(&self) -> usize {
        let windows: usize = self
            .changed
            .iter()
            .map(|((_, tenant), acc, _)| change_bytes(tenant) + acc.lines_bytes())
            .sum();
        windows + super::dedup::chunk_bytes(&self.dedup.chunks)
    }
}

/// What eviction keeps of a budget (`state.memory_budget`, or a partition's
/// share): a quarter below it, so that the spill a memory check starts once the
/// budget is passed is not due again at once. Windows and ids in memory stay
/// within the budget, give or take one memory check's records.
pub(crate) fn keep_of(budget: usize) -> usize {
    budget - budget / 4
}

/// The size of each new Bloom filter of cold dedup ids, for an eviction to
/// `keep_bytes` (`keep_of` a share): a twentieth of the share itself
/// (a twentieth of what eviction keeps gave each id a quarter fewer bits, so
/// more false "maybe"s, each a read of the index).
pub(crate) fn filter_bytes(keep_bytes: usize) -> usize {
    (keep_bytes / 15).max(4096)
}

/// Read access to a partition's stored windows, and its cold dedup ids (the
/// state store, in a worker).
pub(crate) trait SpillStore: super::cold::DedupStore + Send + Sync {
    /// The stored accumulator of `(end, tenant)`, if any.
    fn window(
        &self,
        partition: Partition,
        end: i64,
        tenant: &str,
    ) -> Result<Option<WindowAcc>, String>;
    /// Every stored window ending at `end`, in tenant order.
    fn windows_ending(
        &self,
        partition: Partition,
        end: i64,
    ) -> Result<Vec<(Box<str>, WindowAcc)>, String>;
    /// The first `limit` stored windows ending at `end` whose tenant comes after
    /// `after` (all of them with `None`), in tenant order: one bounded scan.
    fn windows_ending_after(
        &self,
        partition: Partition,
        end: i64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Box<str>, WindowAcc)>, String>;
}

/// Counts of evicted windows per end, and where to read them back.
#[derive(Default)]
pub(crate) struct Spilled {
    store: Option<Arc<dyn SpillStore>>,
    pub(super) open: BTreeMap<i64, u64>,
    pub(super) fired: BTreeMap<i64, u64>,
    /// The first read failure; the worker must stop (its state is incomplete).
    error: Option<SpillError>,
}

impl Spilled {
    pub(crate) fn attach(&mut self, store: Arc<dyn SpillStore>) {
        self.store = Some(store);
    }

    pub(crate) fn can_evict(&self) -> bool {
        self.store.is_some()
    }

    pub(crate) fn total(&self) -> u64 {
        self.open.values().chain(self.fired.values()).sum()
    }

    pub(crate) fn take_error(&mut self) -> Option<SpillError> {
        self.error.take()
    }

    fn fail(&mut self, doing: String, msg: String) {
        self.error.get_or_insert(SpillError { doing, msg });
    }

    /// Reads back `(end, tenant)` if `end` has evicted windows (of the given
    /// status) and the store holds it.
    pub(crate) fn take_one(
        &mut self,
        partition: Partition,
        phase: WindowPhase,
        end: i64,
        tenant: &str,
    ) -> Option<WindowAcc> {
        let counts = match phase {
            WindowPhase::Fired => &mut self.fired,
            WindowPhase::Open => &mut self.open,
        };
        let n = counts.get_mut(&end)?;
        let store = self.store.as_ref()?;
        match store.window(partition, end, tenant) {
            Ok(Some(acc)) => {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&end);
                }
                Some(acc)
            }
            Ok(None) => None,
            Err(e) => {
                self.fail(format!("reading spilled window {end}/{tenant}"), e);
                None
            }
        }
    }

    /// Reads back every stored window of open end `end` (the caller keeps its
    /// in-memory copies, which are never older). Empty if `end` has none evicted.
    pub(crate) fn take_open_end(
        &mut self,
        partition: Partition,
        end: i64,
    ) -> Vec<(Box<str>, WindowAcc)> {
        if self.open.remove(&end).is_none() {
            return Vec::new();
        }
        let Some(store) = self.store.as_ref() else {
            return Vec::new();
        };
        match store.windows_ending(partition, end) {
            Ok(v) => v,
            Err(e) => {
                self.fail(format!("reading spilled windows ending {end}"), e);
                Vec::new()
            }
        }
    }

    /// Evicted windows of open end `end`.
    pub(crate) fn open_count(&self, end: i64) -> u64 {
        self.open.get(&end).copied().unwrap_or(0)
    }

    /// Up to `limit` stored windows of open end `end` after tenant `after`, in
    /// tenant order (a firing step: the caller counts the evicted ones among
    /// them with `took_open`; the others are stale copies of windows in memory).
    /// Empty on a read failure (remembered).
    pub(crate) fn open_after(
        &mut self,
        partition: Partition,
        end: i64,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<(Box<str>, WindowAcc)> {
        let Some(store) = self.store.as_ref() else {
            return Vec::new();
        };
        match store.windows_ending_after(partition, end, after, limit) {
            Ok(v) => v,
            Err(e) => {
                self.fail(format!("reading spilled windows ending {end}"), e);
                Vec::new()
            }
        }
    }

    /// One evicted window of open end `end` was read back; false once none is left.
    pub(crate) fn took_open(&mut self, end: i64) -> bool {
        let Some(n) = self.open.get_mut(&end) else {
            return false;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.open.remove(&end);
            return false;
        }
        true
    }

    /// Forgets the evicted windows of open end `end` (its firing read them all).
    pub(crate) fn clear_open(&mut self, end: i64) {
        self.open.remove(&end);
    }

    /// Drops the counts of fired ends at or below `through` (purged).
    pub(crate) fn purge_through(&mut self, through: i64) {
        self.fired = self.fired.split_off(&through.saturating_add(1));
    }

    pub fn add(&mut self, phase: WindowPhase, end: i64, n: u64) {
        if n > 0 {
            let counts = match phase {
                WindowPhase::Fired => &mut self.fired,
                WindowPhase::Open => &mut self.open,
            };
            *counts.entry(end).or_default() += n;
        }
    }
}
