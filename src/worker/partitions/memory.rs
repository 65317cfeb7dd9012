//! The memory policy (docs/DESIGN.md §7.7) and what the checkpoint coordinator
//! takes from the partitions: the cut at a barrier, the commits of a spill.
//!
//! Every 4,096 records applied, and after every run that emitted panes (a window
//! end that fires brings its evicted windows back, with their panes and changed
//! copies, so the next partition's end must not add to them: a driver spills
//! before the next run when it is due), the state the tasks
//! hold in memory (windows, their changes, dedup ids) is compared with the budget —
//! a sum over the partitions, plus the last checkpoint's deltas while its export
//! thread still holds them (`Coordinator::in_flight_bytes`: the tasks keep the
//! budget minus them); over it, the driver spills: the
//! coordinator's state write without the export, then an eviction down to
//! `spill::keep_of` the budget, shared evenly by the partitions. Nothing is flushed
//! or committed by a spill. When the tasks alone are within the budget, the
//! deltas in flight were the excess: the driver waits for the export's batch
//! write, which frees them, instead of spilling.

use tracing::debug;

use super::{OutputPorts, Outputs, Partitions};
use crate::checkpoint::coordinator::{Completed, Coordinator, Cut, OffsetCommitter};
use crate::state::PartitionCommit;
use crate::worker::WorkerError;

/// Records between two checks of the budget.
const CHECK_EVERY: u32 = 4096;

impl<O: Outputs> Partitions<O> {
    /// Counts `n` records applied; every `CHECK_EVERY`, and after a run that
    /// emitted panes (`paned`), checks the budget.
    pub(super) fn count_for_memory(&mut self, n: usize, paned: bool) {
        let m = &mut self.memory;
        m.since_check = m.since_check.saturating_add(n as u32);
        if m.since_check < CHECK_EVERY && !paned {
            return;
        }
        m.since_check = 0;
        if let Some(budget) = self.settings.memory_budget {
            let in_flight = self.memory.in_flight.as_ref();
            let in_flight = in_flight.map_or(0, |g| g.load(std::sync::atomic::Ordering::Acquire));
            self.memory.spill_due |= self.held_bytes() + in_flight > budget;
        }
    }

    /// What the tasks hold that the budget bounds.
    fn held_bytes(&self) -> usize {
        self.slots.values().map(|s| s.task.budgeted_bytes()).sum()
    }

    /// The state in memory passed the budget: spill before the next run.
    pub(crate) fn spill_due(&self) -> bool {
        self.memory.spill_due
    }

    /// Windows evicted so far.
    pub(crate) fn evicted(&self) -> u64 {
        self.memory.evicted
    }

    /// Evicts windows beyond the memory budget (all are clean right after a commit).
    pub(crate) fn evict_to_budget(&mut self) -> Result<(), WorkerError> {
        self.memory.spill_due = false;
        let Some(budget) = self.settings.memory_budget else {
            return Ok(());
        };
        let keep = crate::engine::spill::keep_of(budget) / self.slots.len().max(1);
        let mut evicted = 0;
        for s in self.slots.values_mut() {
            evicted += s.task.evict(keep)?;
        }
        self.memory.evicted += evicted as u64;
        if evicted > 0 {
            debug!(
                evicted,
                keep_per_partition = keep,
                "windows evicted to the state store"
            );
        }
        Ok(())
    }

    /// Takes a checkpoint through `coord` (steps 1–3; with `wait`, also 4–5): the
    /// outputs flushed, then each partition's cut. Evicts once the store holds
    /// every window. Returns the checkpoints that completed.
    pub(crate) fn checkpoint(
        &mut self,
        coord: &mut Coordinator,
        committer: &mut dyn OffsetCommitter,
        wait: bool,
    ) -> Result<Vec<Completed>, WorkerError> {
        // A cut never sees a half-fired end (drivers finish firings first).
        while self.resume_firings()? {}
        let slots = &mut self.slots;
        let mut ports = OutputPorts::new(&mut self.outputs, committer);
        let done = if slots.is_empty() {
            let done = coord.finish(&mut ports, true);
            done.map_err(|e| ports.error(e))?.into_iter().collect()
        } else {
            let cut = || {
                slots
                    .iter_mut()
                    .map(|(p, s)| Cut {
                        partition: *p,
                        next_offset: s.next,
                        watermark: s.task.max_ts().map(|_| s.task.watermark()),
                        counters: s.task.counters(),
                        offsets: s.offsets.clone(),
                        delta: s.task.drain_changes(),
                    })
                    .collect()
            };
            let done = coord.checkpoint(&mut ports, cut, wait);
            done.map_err(|e| ports.error(e))?
        };
        self.memory.in_flight = coord.in_flight_gauge();
        if coord.settled() {
            self.evict_to_budget()?;
        }
        Ok(done)
    }

    /// Memory pressure between checkpoints: writes the changed windows to the
    /// working store through `coord` (after any running export, which must read an
    /// unchanged store) and evicts down to the budget. Not a checkpoint: nothing is
    /// flushed, exported or committed. When it is due (`spill_due`) with the
    /// tasks alone within the budget, it only waits for the export's batch write
    /// (the deltas in flight were the excess). Returns the export it waited for, if one completed.
    pub(crate) fn spill(
        &mut self,
        coord: &mut Coordinator,
        committer: &mut dyn OffsetCommitter,
    ) -> Result<Option<Completed>, WorkerError> {
        let within = |b| self.held_bytes() <= b;
        if self.memory.spill_due && self.settings.memory_budget.is_some_and(within) {
            // Due, with the tasks within the budget: the deltas in flight passed
            // it, and they go once written.
            coord.wait_written();
            self.memory.spill_due = false;
            return Ok(None);
        }
        let parts = self
            .slots
            .iter_mut()
            .map(|(p, s)| PartitionCommit {
                partition: *p,
                next_offset: s.next,
                delta: s.task.drain_changes(),
            })
            .collect();
        let mut ports = OutputPorts::new(&mut self.outputs, committer);
        let done = coord.spill(&mut ports, parts);
        let done = done.map_err(|e| ports.error(e))?;
        self.evict_to_budget()?;
        Ok(done)
    }

    /// Completes the pending export through `coord`: waits for it with `wait`,
    /// else only if its thread is done.
    pub(crate) fn finish(
        &mut self,
        coord: &mut Coordinator,
        committer: &mut dyn OffsetCommitter,
        wait: bool,
    ) -> Result<Option<Completed>, WorkerError> {
        let mut ports = OutputPorts::new(&mut self.outputs, committer);
        let done = coord.finish(&mut ports, wait);
        done.map_err(|e| ports.error(e))
    }
}
