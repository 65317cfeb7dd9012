//! Applying a run: the offsets it skips through the ledger, its records through the
//! engine, its routes to the outputs. And the other moves of a next offset: past
//! offsets with no record (`pass`), and over deleted ones (`fall_behind`).

use std::sync::Arc;

use tracing::{error, info, warn};

use super::{clock, within, Outputs, Partitions, Run, Slot};
use crate::checkpoint::ledger::{self, Gap};
use crate::checkpoint::restore;
use crate::checkpoint::OffsetLedger;
use crate::engine::Route;
use crate::engine::{EngineConfig, Progress, ProgressRecord, RecordIn, ResultKind, ResultRecord};
use crate::failpoint;
use crate::kafka::now_ms;
use crate::kafka::source::StartPolicy;
use crate::model::Partition;
use crate::state::NextOffset;
use crate::worker::WorkerError;

/// A gap of deleted offsets: refused, or with `--allow-truncated-log` accepted
/// into `ledger` (logged). `how` says how it was found.
fn accept_gap(
    policy: StartPolicy,
    topic: &str,
    p: Partition,
    gap: Gap,
    ledger: &mut OffsetLedger,
    how: &str,
) -> Result<(), WorkerError> {
    if gap.is_empty() {
        return Ok(());
    }
    if !policy.allow_truncated_log {
        return Err(WorkerError::Refused(restore::gap_refusal(
            topic, p, &gap, how, policy,
        )));
    }
    log_accepted_gap(p, &gap, how);
    ledger.accept_gap(gap);
    Ok(())
}

pub(crate) fn log_accepted_gap(p: Partition, gap: &Gap, how: &str) {
    error!(
        partition = p.0,
        from = gap.from,
        to = gap.to,
        records = gap.len(),
        how,
        "ACCEPTED GAP (--allow-truncated-log): records deleted before tally read them are not billed"
    );
}

/// The offsets `from..to` carry no record: empty ones at or above the log start
/// `low`, deleted ones below it (a gap: refused or accepted, `how` says how they
/// were found).
fn skip(
    policy: StartPolicy,
    topic: &str,
    p: Partition,
    slot: &mut Slot,
    (from, to, low): (i64, i64, Option<i64>),
    how: &str,
) -> Result<(), WorkerError> {
    let skip = ledger::classify(from, to, low, now_ms());
    if let Some(gap) = skip.deleted {
        accept_gap(policy, topic, p, gap, &mut slot.offsets, how)?;
    }
    slot.offsets.empty(skip.empty);
    Ok(())
}

/// Panes whose buffer (`Partitions::panes`) stays allocated between runs.
pub(super) const PANES_KEPT: usize = 4096;

/// Sends the panes `slot`'s task appended to `panes`, with its progress records
/// where its watermark purged a new window end (`PartitionTask::take_progress`).
pub(super) fn send_panes<O: Outputs>(
    outputs: &mut O,
    slot: &mut Slot,
    panes: &mut Vec<ResultRecord>,
    to: Option<(i32, i32)>,
    generation: u64,
) -> Result<(), WorkerError> {
    let marks = slot.task.take_progress();
    let mut marks = marks.iter().peekable();
    let source_partition = slot.task.partition().0;
    let progress = |outputs: &mut O, p: &Progress| -> Result<(), WorkerError> {
        let Some((source_partitions, results_partitions)) = to else {
            return Ok(());
        };
        outputs.progress(&ProgressRecord {
            kind: ResultKind::Progress,
            source_partition,
            source_partitions,
            results_partitions,
            final_through: p.final_through,
            watermark: p.watermark,
            generation,
        })
    };
    let burst = panes.len() > 1;
    for (i, pane) in panes.drain(..).enumerate() {
        while let Some(p) = marks.next_if(|p| p.at <= i) {
            progress(outputs, p)?;
        }
        if burst && i == 1 {
            failpoint::hit("mid_pane_burst");
        }
        outputs.result(&pane)?;
    }
    for p in marks {
        progress(outputs, p)?;
    }
    Ok(())
}

impl<O: Outputs> Partitions<O> {
    /// Applies a run read under `cfg` and ingested at `now_ms` (see the module
    /// header for which records are applied). Per partition, records keep their
    /// order; results, late records and dead letters go to different outputs, so
    /// their relative order across outputs is not part of the contract.
    ///
    /// Returns whether the run is done. A record that leaves a window end firing
    /// in steps (`PartitionTask::firing`) stops it there: its panes so far are
    /// sent and the memory checked; the driver spills if due and calls again with
    /// the same run, which resumes the firing a step at a time, then the records
    /// after it.
    pub(crate) fn apply(
        &mut self,
        run: &impl Run,
        cfg: &Arc<EngineConfig>,
        now_ms: i64,
    ) -> Result<bool, WorkerError> {
        let p = run.partition();
        if run.is_empty() {
            return Ok(true);
        }
        let slot = match self.slots.get_mut(&p) {
            Some(slot) if run.epoch() >= slot.assigned_at => slot,
            // Read before the partition was revoked (and maybe assigned again):
            // its owner now reads these records from the checkpoint.
            _ => {
                info!(
                    partition = p.0,
                    records = run.len(),
                    from_offset = run.offset(0),
                    "records polled before a rebalance are left to the partition's owner"
                );
                return Ok(true);
            }
        };
        if slot.task.firing() {
            let generation = self.settings.engine.generation;
            let done = slot.task.resume_firing(&mut self.panes)?;
            send_panes(
                &mut self.outputs,
                slot,
                &mut self.panes,
                self.progress_to,
                generation,
            )?;
            self.panes.shrink_to(PANES_KEPT);
            self.count_for_memory(0, true);
            if !done {
                return Ok(false);
            }
        }
        self.apply_records(run, cfg, now_ms)
    }

    /// `apply` of the run's records from the partition's next offset on (its
    /// slot is assigned under the run's epoch, and nothing is firing).
    fn apply_records(
        &mut self,
        run: &impl Run,
        cfg: &Arc<EngineConfig>,
        now_ms: i64,
    ) -> Result<bool, WorkerError> {
        let p = run.partition();
        let (policy, bounded) = (self.settings.policy, self.settings.bounded);
        let slot = self.slots.get_mut(&p).expect("an assigned partition");
        // Already applied (a fetch racing a seek), or past a bounded run's end.
        let end = if bounded { slot.end } else { i64::MAX };
        let range = within(run, slot.next.0, end);
        if range.is_empty() {
            return Ok(true);
        }
        // Offsets the records skip (see `checkpoint::ledger`): empty ones in the
        // retained log, or — below the log start — deleted ones. Offsets increase,
        // so a run from the next offset that spans its length skips none.
        let (first, last) = (run.offset(range.start), run.offset(range.end - 1));
        if first != slot.next.0 || last - first != range.len() as i64 - 1 {
            let mut expected = slot.next.0;
            for offset in range.clone().map(|i| run.offset(i)) {
                if offset > expected && offset > slot.skips_through {
                    let how = "the records after them arrived without them";
                    let at = (expected, offset, run.log_start());
                    skip(policy, &self.settings.topic, p, slot, at, how)?;
                }
                expected = offset + 1;
            }
            slot.skips_through = last;
        }
        let mut routes = std::mem::take(&mut self.routes);
        routes.clear();
        let before = slot.task.counters();
        let routed = if Arc::ptr_eq(cfg, slot.task.config()) {
            let (prepared, panes) = (run.prepared(), &mut self.panes);
            slot.task
                .process_prepared(prepared, range.clone(), now_ms, panes, &mut routes)?
        } else {
            // Prepared under a configuration a price reload has replaced since.
            let recs: Vec<RecordIn<'_>> = range.clone().map(|i| run.record_in(i, now_ms)).collect();
            slot.task
                .process_batch(&recs, &mut self.panes, &mut routes)?
        };
        // Up to the record that left a window end firing, if one did.
        let range = range.start..range.start + routed;
        let done = !slot.task.firing();
        slot.next = NextOffset(run.offset(range.end - 1) + 1);
        slot.last_record = clock::mono_ms();
        let generation = self.settings.engine.generation;
        let to = self.progress_to;
        send_panes(&mut self.outputs, slot, &mut self.panes, to, generation)?;
        // A window end that fired many windows leaves a long buffer behind: it
        // must not stay allocated, outside the budget, for the rest of the run.
        self.panes.shrink_to(PANES_KEPT);
        // Only too-late records and dead letters go anywhere of their own: a run
        // that counted none (nearly every one) has nothing to dispatch.
        let after = slot.task.counters();
        let routed = after.too_late != before.too_late || after.dead_letter != before.dead_letter;
        self.count_for_memory(range.len(), after.panes != before.panes);
        if routed {
            self.dispatch(run, range.zip(routes.drain(..)), before.dead_letter)?;
        }
        self.routes = routes;
        Ok(done)
    }

    /// Each record's route to its output; `dead_letters`: the partition's before.
    fn dispatch(
        &mut self,
        run: &impl Run,
        routes: impl Iterator<Item = (usize, Route)>,
        mut dead_letters: u64,
    ) -> Result<(), WorkerError> {
        for (i, route) in routes {
            match route {
                Route::Window | Route::Duplicate => {}
                Route::TooLate {
                    window_end,
                    watermark,
                } => self.outputs.late(&run.record(i), window_end, watermark)?,
                Route::DeadLetter(reason) => {
                    dead_letters += 1;
                    let r = run.record(i);
                    self.outputs.dead_letter(&r, &reason, dead_letters)?;
                }
            }
        }
        Ok(())
    }

    /// Moves `p`'s next offset to `position` where the offsets between carry no
    /// record (a log ending in a transaction marker, empty lines ending a file):
    /// only under the assignment `epoch` the position was read in, never past a
    /// bounded run's end. `low`: the log start seen with the position.
    pub(crate) fn pass(
        &mut self,
        p: Partition,
        epoch: u64,
        position: i64,
        low: Option<i64>,
    ) -> Result<(), WorkerError> {
        let (policy, bounded) = (self.settings.policy, self.settings.bounded);
        let Some(slot) = self.slots.get_mut(&p) else {
            return Ok(());
        };
        if epoch < slot.assigned_at {
            return Ok(());
        }
        let end = bounded.then_some(slot.end);
        let Some(to) = ledger::passed(slot.next.0, position, end) else {
            return Ok(());
        };
        let how = "the consumer's position passed them with no record";
        skip(
            policy,
            &self.settings.topic,
            p,
            slot,
            (slot.next.0, to, low),
            how,
        )?;
        slot.next = NextOffset(to);
        Ok(())
    }

    /// `p`'s next offset is below the log start `low` (the records were deleted
    /// while this worker ran): the gap is refused, or accepted and `p` goes on from
    /// `low`. Whether it moved.
    pub(crate) fn fall_behind(&mut self, p: Partition, low: i64) -> Result<bool, WorkerError> {
        let policy = self.settings.policy;
        let Some(slot) = self.slots.get_mut(&p) else {
            return Ok(false);
        };
        if slot.next.0 >= low {
            return Ok(false);
        }
        let gap = Gap {
            from: slot.next.0,
            to: low,
            at_ms: now_ms(),
        };
        let how = "this worker fell behind the log start while running";
        accept_gap(policy, &self.settings.topic, p, gap, &mut slot.offsets, how)?;
        slot.next = NextOffset(low);
        Ok(true)
    }
}

/// Logs a partition's first start at its log start (`--start-at-log-start`).
pub(crate) fn log_onboarded(p: Partition, gap: &Gap) {
    warn!(
        partition = p.0,
        from = gap.from,
        to = gap.to,
        records = gap.len(),
        "STARTED AT LOG START (--start-at-log-start): the partition's first start; records deleted before \
         it are not billed, and any later gap is refused"
    );
}
