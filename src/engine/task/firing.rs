//! Firing window ends (step 4 of the rules), and an end with many evicted
//! windows fired in steps.
//!
//! An end whose evicted windows number at most a run (`RUN`) is read back whole
//! and fired at once. One with more fires through a cursor (`Firing`): each step
//! reads up to a run of the end's stored windows after the last tenant read
//! (`SpillStore::windows_ending_after`), merges them with the end's in-memory
//! tenants up to the last one read (memory copies win: a stored copy of a window
//! in memory is stale), emits their on-time panes in tenant order and retains
//! (dirty) or drops them. The rest of the watermark's move — later ends, purges,
//! dedup expiry, the progress mark — runs once the cursor is done.
//!
//! Invariants while a firing is pending (`PartitionTask::firing`):
//! - no record is routed (`process_step`, `process_prepared`, `process_batch`
//!   stop after the record that left it; the others finish it first) and no
//!   checkpoint cut is taken (drivers resume it to the end first);
//! - every tenant of the end up to the cursor is fired, every tenant after it is
//!   not: the store holds the end as fired up to the cursor (once a spill wrote
//!   them) and open after it, which is exactly what the cursor reads;
//! - `evict` leaves the end's open windows in memory (the cursor's memory list
//!   names them) but may evict its fired ones once clean;
//! - nothing of the end is purged before the cursor is done (a purge is a range
//!   delete at the next commit, and the cursor still reads the store).
//!
//! The end of a bounded run (`end_of_input_step`) fires every open end the same
//! way, a step at a time, with a closing cursor: its windows are dropped, not
//! purged (the task is not kept), and no watermark move follows.
//!
//! A merge in tenant order emits the same panes as sorting the union, so the
//! output does not depend on the run, the budget or where the windows live.

use std::collections::hash_map::Entry;

use super::{
    acc_bytes, change_bytes, PaneKind, PartitionTask, ResultRecord, SpillError, WindowAcc,
};

/// Stored windows a firing step reads at most; an end with more evicted windows
/// fires in steps (the driver may spill between them).
pub(crate) const RUN: usize = 4096;

/// The cursor of an end firing in steps.
pub(in crate::engine) struct Firing {
    end: i64,
    /// Whether the fired windows are kept for lateness (else dropped).
    retain: bool,
    /// The end of input (`end_of_input_step`): the windows are dropped and
    /// not purged, and no watermark move follows.
    closing: bool,
    /// The end's in-memory tenants when it started firing, sorted; those from
    /// `next` on are not fired yet.
    memory: Vec<Box<str>>,
    next: usize,
    /// The last stored tenant read (`None`: none yet).
    after: Option<Box<str>>,
    /// Every evicted window of the end has been read.
    stored_done: bool,
}

impl Firing {
    pub(in crate::engine) fn end(&self) -> i64 {
        self.end
    }
}

impl PartitionTask {
    /// Whether a window end is firing in steps (`resume_firing` goes on).
    pub(crate) fn firing(&self) -> bool {
        self.firing.is_some()
    }

    /// Sets the stored windows a firing step reads (tests use a few).
    #[cfg(test)]
    pub(crate) fn set_fire_run(&mut self, run: usize) {
        self.fire_run = run.max(1);
    }

    /// The next step of a pending firing, its panes appended to `out`; once the
    /// end is done, the rest of the watermark's move (which may start firing a
    /// later end). Returns whether nothing is left firing.
    pub(crate) fn resume_firing(
        &mut self,
        out: &mut Vec<ResultRecord>,
    ) -> Result<bool, SpillError> {
        if self.firing.is_some() && self.fire_step(out) && self.fire_due(out) {
            self.after_firing(out);
        }
        let done = self.firing.is_none();
        self.spill_result(done)
    }

    /// Resumes a pending firing to its end (a caller that does not step).
    pub(in crate::engine) fn finish_firing(&mut self, out: &mut Vec<ResultRecord>) {
        while self.firing.is_some() {
            if self.fire_step(out) && self.fire_due(out) {
                self.after_firing(out);
            }
        }
    }

    /// Fires the open ends the watermark reached, in order. Returns false when
    /// one is left firing in steps (the rest waits for it).
    pub(in crate::engine) fn fire_due(&mut self, out: &mut Vec<ResultRecord>) -> bool {
        let w = self.watermark.current();
        loop {
            let first = self.open.keys().next();
            let end = first
                .into_iter()
                .chain(self.spilled.open.keys().next())
                .min();
            let Some(end) = end.copied().filter(|e| e - 1 <= w) else {
                return true;
            };
            let retain = w < (end - 1).saturating_add(self.cfg.allowed_lateness_ms);
            if self.spilled.open_count(end) > self.fire_run as u64 {
                self.start_firing(end, retain, false);
                if !self.fire_step(out) {
                    return false;
                }
                continue;
            }
            if self.fire_whole(end, retain, out) && !retain {
                self.purge_through(end);
            }
        }
    }

    /// One step of the end of input (`end_of_input`): a pending firing's next
    /// step, else the next open end, its windows emitted and dropped — at once
    /// when it has at most a run of evicted windows, else through a cursor, a
    /// run at a time. Returns whether no open window is left.
    pub(crate) fn end_of_input_step(
        &mut self,
        out: &mut Vec<ResultRecord>,
    ) -> Result<bool, SpillError> {
        match self.firing.as_ref().map(|f| f.closing) {
            // A move of the watermark finishes first (drivers finish it before).
            Some(false) => {
                if self.fire_step(out) && self.fire_due(out) {
                    self.after_firing(out);
                }
                return self.spill_result(false);
            }
            Some(true) => {
                self.fire_step(out);
                return self.spill_result(false);
            }
            None => {}
        }
        let first = self.open.keys().next();
        let end = first
            .into_iter()
            .chain(self.spilled.open.keys().next())
            .min();
        let Some(&end) = end else {
            return self.spill_result(true);
        };
        if self.spilled.open_count(end) > self.fire_run as u64 {
            self.start_firing(end, false, true);
            self.fire_step(out);
        } else {
            self.fire_whole(end, false, out);
        }
        self.spill_result(false)
    }

    /// Starts firing end `end` in steps (`Firing`), from its first tenant.
    fn start_firing(&mut self, end: i64, retain: bool, closing: bool) {
        let mut memory: Vec<Box<str>> = self
            .open
            .get(&end)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        memory.sort_unstable();
        self.firing = Some(Box::new(Firing {
            end,
            retain,
            closing,
            memory,
            next: 0,
            after: None,
            stored_done: false,
        }));
    }

    /// Fires end `end` at once: its stored windows read back (memory copies
    /// win), then all in tenant order. Returns whether it had a window.
    fn fire_whole(&mut self, end: i64, retain: bool, out: &mut Vec<ResultRecord>) -> bool {
        let stored = self.spilled.take_open_end(self.partition, end);
        let tenants = self.open.entry(end).or_default();
        for (tenant, acc) in stored {
            if let Entry::Vacant(v) = tenants.entry(tenant) {
                self.held_bytes += acc_bytes(v.key(), &acc);
                v.insert(acc);
            }
        }
        let mut tenants: Vec<_> = self
            .open
            .remove(&end)
            .unwrap_or_default()
            .into_iter()
            .collect();
        tenants.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let fired = !tenants.is_empty();
        for (tenant, acc) in tenants {
            self.fire_one(end, tenant, acc, retain, out);
        }
        fired
    }

    /// One step of the pending firing; true when its end is done (cursor gone).
    fn fire_step(&mut self, out: &mut Vec<ResultRecord>) -> bool {
        let Some(mut f) = self.firing.take() else {
            return true;
        };
        let mut stored = Vec::new();
        if !f.stored_done {
            stored =
                self.spilled
                    .open_after(self.partition, f.end, f.after.as_deref(), self.fire_run);
            f.stored_done = stored.len() < self.fire_run;
            if let Some((t, _)) = stored.last() {
                f.after = Some(t.clone());
            }
        }
        // In-memory tenants up to the last stored one read (all, once none is left).
        let bound = (!f.stored_done).then_some(f.after.as_deref()).flatten();
        let upto = f.next + f.memory[f.next..].partition_point(|t| bound.is_none_or(|b| &**t <= b));
        let mut memory = f.memory[f.next..upto].iter().peekable();
        f.next = upto;
        let mut stored = stored.into_iter().peekable();
        loop {
            let from_memory = match (memory.peek(), stored.peek()) {
                (None, None) => break,
                (Some(m), Some((s, _))) => m <= &s,
                (m, _) => m.is_some(),
            };
            if from_memory {
                let tenant = memory.next().expect("peeked");
                if stored.peek().is_some_and(|(s, _)| s == tenant) {
                    stored.next(); // a stale copy
                }
                let tenants = self.open.get_mut(&f.end).expect("the end's windows");
                let (tenant, acc) = tenants.remove_entry(tenant).expect("listed");
                if tenants.is_empty() {
                    self.open.remove(&f.end);
                }
                self.fire_one(f.end, tenant, acc, f.retain, out);
            } else {
                let (tenant, acc) = stored.next().expect("peeked");
                if !self.spilled.took_open(f.end) {
                    f.stored_done = true; // the rest are stale copies
                }
                self.held_bytes += acc_bytes(&tenant, &acc);
                self.fire_one(f.end, tenant, acc, f.retain, out);
            }
        }
        if !f.stored_done || f.next < f.memory.len() {
            self.firing = Some(f);
            return false;
        }
        self.spilled.clear_open(f.end);
        if !f.retain && !f.closing {
            self.purge_through(f.end);
        }
        true
    }

    /// Emits the on-time pane of window `(end, tenant)` (counted in `held_bytes`)
    /// and keeps it as fired, or drops it.
    fn fire_one(
        &mut self,
        end: i64,
        tenant: Box<str>,
        mut acc: WindowAcc,
        retain: bool,
        out: &mut Vec<ResultRecord>,
    ) {
        let was_dirty = acc.dirty;
        let kind = PaneKind::OnTime;
        out.push(Self::pane(
            self.partition,
            &self.cfg,
            end,
            &tenant,
            &mut acc,
            kind,
        ));
        self.counters.panes += 1;
        if retain {
            if !was_dirty {
                self.dirty_bytes += change_bytes(&tenant);
                self.dirty.push((end, tenant.clone()));
            }
            self.fired.entry(end).or_default().insert(tenant, acc);
        } else {
            self.held_bytes -= acc_bytes(&tenant, &acc);
        }
    }
}
