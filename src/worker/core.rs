//! The worker's partitions, shared between the loop (main thread) and the
//! rebalance callback (poll thread), one at a time behind one lock. A chunk the
//! poll thread prepared is applied run by run; a run is applied only while its
//! partition is assigned under the epoch it was polled in or an earlier one
//! (`kafka::poller`), and only from the partition's next offset on (a gap before
//! it goes through the offset ledger). Checkpoints go through the
//! one checkpoint coordinator (`checkpoint::coordinator`, docs/DESIGN.md §7.2);
//! restores follow `checkpoint::restore`'s decision over the facts the Kafka
//! adapter gathered (`kafka::source`), so nothing here calls the consumer from
//! inside a rebalance callback.
//!
//! A crash anywhere replays from the newest complete checkpoint; replayed outputs
//! are byte-identical to the originals (same versions), so the sink ignores them.
//!
//! Between checkpoints, when the windows in memory pass the memory budget, the
//! worker *spills*: the coordinator's state write without the export, then
//! evicts windows down to three quarters of it (`spill::keep_of`). Nothing is flushed or committed; a crash
//! after a spill restores from the checkpoint store as usual (the store is a
//! working copy).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{Consumer, RebalanceProtocol};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use super::clock;
use super::kafka::outputs::KafkaOutputs;
use super::kafka::poller::{Polled, Run};
use super::lag;
use super::partitions::{OutputPorts, Outputs, Record};
use super::report::Publisher;
use super::WorkerError;
use crate::checkpoint::coordinator::{Completed, Coordinator, Cut, OffsetCommitter};
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::ledger::{self, Gap};
use crate::checkpoint::restore::{self, LogFacts, Names};
use crate::checkpoint::CheckpointError;
use crate::checkpoint::OffsetLedger;
use crate::engine::{
    Counters, EngineConfig, PartitionTask, Progress, ProgressRecord, RecordIn, ResultKind,
    ResultRecord, Route,
};
use crate::failpoint;
use crate::kafka::source::{
    cached_log_end, cached_log_start, GroupCommitter, RebalanceHandler, Source, StartPolicy,
};
use crate::kafka::{now_ms, KafkaIoError};
use crate::metrics::{CheckpointStats, PartitionReport, WorkerReport};
use crate::model::Partition;
use crate::state::{bounded, NextOffset, PartitionCommit, StateStore};
use crate::time::liveness::{self, Quiet};
use crate::time::EventTime;

mod positions;

pub struct Slot {
    pub task: PartitionTask,
    pub next: NextOffset,
    /// Log end when the partition was assigned (for `until_end`).
    pub end: i64,
    /// `clock::mono_ms()` of this partition's last record.
    pub last_record: i64,
    /// `clock::mono_ms()` when the liveness rule last looked at it.
    pub checked_at: i64,
    /// Where the offsets before `next` went (checkpointed with the state).
    pub offsets: OffsetLedger,
    /// The assignment epoch (`Core::epoch`) that assigned the partition.
    pub assigned_at: u64,
}

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

fn log_accepted_gap(p: Partition, gap: &Gap, how: &str) {
    error!(
        partition = p.0,
        from = gap.from,
        to = gap.to,
        records = gap.len(),
        how,
        "ACCEPTED GAP (--allow-truncated-log): records deleted before tally read them are not billed"
    );
}

fn log_onboarded(p: Partition, gap: &Gap) {
    warn!(
        partition = p.0,
        from = gap.from,
        to = gap.to,
        records = gap.len(),
        "STARTED AT LOG START (--start-at-log-start): the partition's first start; records deleted before \
         it are not billed, and any later gap is refused"
    );
}

pub struct Core {
    pub engine: Arc<EngineConfig>,
    /// `engine`, as the poll thread reads it for step 1 (`kafka::poller`).
    pub shared_engine: Arc<Mutex<Arc<EngineConfig>>>,
    /// Raised by every assignment, read by the poll thread after each poll: the
    /// runs polled before a partition was assigned again are not applied.
    pub epoch: Arc<AtomicU64>,
    /// Worker name, group, input topic and config fingerprint.
    pub job: JobIdentity,
    pub store: Arc<StateStore>,
    /// The checkpoint protocol (and the checkpoint store).
    pub coord: Coordinator,
    pub outputs: KafkaOutputs,
    pub slots: BTreeMap<Partition, Slot>,
    pub panes: Vec<ResultRecord>,
    pub policy: StartPolicy,
    pub assigned_once: bool,
    /// `watermark.idle_timeout`, ms.
    pub idle_ms: Option<i64>,
    pub publisher: Publisher,
    /// Set after the final checkpoint: nothing more is checkpointed (in particular
    /// not the end-of-input panes of a bounded run).
    pub closed: bool,
    /// A bounded run (`--until-end`): records at or past a partition's log end as
    /// seen at assignment are not processed.
    pub bounded: bool,
    /// Bytes of windows this worker may hold in memory (`state.memory_budget`).
    pub memory_budget: Option<usize>,
    /// Records since the last memory check.
    pub since_memory_check: u32,
    /// Set when the windows in memory exceed the budget: spill now.
    pub spill_due: bool,
    /// `checkpoint.interval`, ms (reported).
    pub checkpoint_interval_ms: i64,
    /// This process's checkpoints (reported).
    pub checkpoint_stats: CheckpointStats,
    /// Partitions of the input and of the results topic, for progress records
    /// (finality); `None`: not known, no progress records.
    pub progress_to: Option<(i32, i32)>,
    /// Each owned partition's position, for the consumer lag computed when
    /// `/metrics` is scraped (`worker::lag`): published whenever a `next`
    /// moves or the assignment changes.
    pub applied: Arc<lag::Applied>,
}

/// Sends the panes `slot`'s task appended to `panes`, with its progress records
/// where its watermark purged a new window end (`PartitionTask::take_progress`).
fn send_panes(
    outputs: &mut KafkaOutputs,
    slot: &mut Slot,
    panes: &mut Vec<ResultRecord>,
    to: Option<(i32, i32)>,
    generation: u64,
) -> Result<(), WorkerError> {
    let marks = slot.task.take_progress();
    let mut marks = marks.iter().peekable();
    let progress = |outputs: &mut KafkaOutputs, p: &Progress| -> Result<(), WorkerError> {
        let Some((source_partitions, results_partitions)) = to else {
            return Ok(());
        };
        outputs.progress(&ProgressRecord {
            kind: ResultKind::Progress,
            source_partition: slot.task.partition().0,
            source_partitions,
            results_partitions,
            final_through: p.final_through,
            watermark: p.watermark,
            generation,
        })?;
        Ok(())
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

impl Core {
    /// Routes a chunk of polled records (any partitions, poll order) and produces
    /// what they caused: the same outcome as `process` on each, faster (see
    /// `PartitionTask::process_prepared`). Per partition, records keep their order;
    /// results, late events and dead letters go to different topics, so their
    /// relative order across topics is not part of the contract.
    pub fn process_polled(
        &mut self,
        consumer: &Source,
        polled: &Polled,
    ) -> Result<(), WorkerError> {
        for run in &polled.runs {
            self.process_run(consumer, polled, run)?;
        }
        if let Some(positions) = &polled.positions {
            self.pass_positions(consumer, positions)?;
        }
        self.publish_positions();
        Ok(())
    }

    /// Publishes each owned partition's position for the consumer lag.
    pub fn publish_positions(&self) {
        self.applied.publish(lag::positions(&self.slots));
    }

    /// Consecutive records of one partition (see `kafka::poller` for which runs
    /// are applied).
    fn process_run(
        &mut self,
        consumer: &Source,
        polled: &Polled,
        run: &Run,
    ) -> Result<(), WorkerError> {
        let p = run.partition;
        let slot = match self.slots.get_mut(&p) {
            Some(slot) if run.epoch >= slot.assigned_at => slot,
            // Polled before the partition was revoked (and maybe assigned again):
            // its owner now reads these records from the checkpoint.
            _ => {
                info!(
                    partition = p.0,
                    records = run.len(),
                    from_offset = run.offset(0),
                    "records polled before a rebalance are left to the partition's owner"
                );
                return Ok(());
            }
        };
        // Already applied (a fetch racing a seek), or past a bounded run's end.
        let end = if self.bounded { slot.end } else { i64::MAX };
        let range = run.within(slot.next.0, end);
        if range.is_empty() {
            return Ok(());
        }
        // Offsets the records skip (see `checkpoint::ledger`): empty ones in the
        // retained log, or — below the log start — deleted ones.
        let mut expected = slot.next.0;
        for offset in range.clone().map(|i| run.offset(i)) {
            if offset > expected {
                let low = cached_log_start(consumer, &self.job.topic, p);
                let skip = ledger::classify(expected, offset, low, now_ms());
                if let Some(gap) = skip.deleted {
                    let how = "the records after them arrived without them";
                    accept_gap(self.policy, &self.job.topic, p, gap, &mut slot.offsets, how)?;
                }
                slot.offsets.empty(skip.empty);
            }
            expected = offset + 1;
        }
        let now = polled.now_ms;
        let mut routes = Vec::with_capacity(range.len());
        let mut dead_letters = slot.task.counters().dead_letter;
        if Arc::ptr_eq(&polled.cfg, slot.task.config()) {
            let panes = &mut self.panes;
            slot.task
                .process_prepared(&run.prepared, range.clone(), now, panes, &mut routes);
        } else {
            // Prepared under a configuration a price reload has replaced since.
            let recs: Vec<RecordIn<'_>> = range.clone().map(|i| run.record_in(i, now)).collect();
            slot.task.process_batch(&recs, &mut self.panes, &mut routes);
        }
        if let Some(e) = slot.task.take_spill_error() {
            return Err(WorkerError::Refused(e));
        }
        slot.next = NextOffset(run.offset(range.end - 1) + 1);
        slot.last_record = clock::mono_ms();
        send_panes(
            &mut self.outputs,
            slot,
            &mut self.panes,
            self.progress_to,
            self.engine.generation,
        )?;
        self.since_memory_check += range.len() as u32 - 1;
        self.check_memory();
        for (i, route) in range.zip(routes) {
            let record = Record {
                partition: p,
                offset: run.offset(i),
                key: run.key(i),
                payload: run.payload(i),
                kafka_ts: run.kafka_ts(i),
                true_len: None,
            };
            match route {
                Route::Window | Route::Duplicate => {}
                Route::TooLate {
                    window_end,
                    watermark,
                } => self.outputs.late(&record, window_end, watermark)?,
                Route::DeadLetter(reason) => {
                    dead_letters += 1;
                    self.outputs.dead_letter(&record, &reason, dead_letters)?;
                }
            }
        }
        Ok(())
    }

    /// The liveness rule (docs/DESIGN.md §4.3, `time::liveness`): a caught-up
    /// partition silent for `idle_timeout` follows the wall clock. Forced only
    /// when that fires or purges something, or moves the partition's progress
    /// (finality, DESIGN §6.1); the forced value is part of the checkpointed
    /// watermark.
    pub fn advance_idle(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let Some(idle) = self.idle_ms else {
            return Ok(());
        };
        let now = clock::mono_ms();
        // A partition is looked at when it had records since the last look (held
        // ones may be trusted now) or has been silent for `idle`.
        let due = |s: &Slot| s.last_record >= s.checked_at || now - s.last_record >= idle;
        if !self.slots.values().any(due) {
            return Ok(());
        }
        let wall = clock::wall_ms();
        for (p, slot) in self.slots.iter_mut() {
            if !due(slot) {
                continue;
            }
            slot.checked_at = now;
            let silence = now - slot.last_record;
            // `next` passes offsets without a record (a trailing transaction
            // marker) once a poll comes back empty (`core::positions`).
            let caught_up =
                cached_log_end(consumer, &self.job.topic, *p).is_some_and(|end| slot.next.0 >= end);
            if !caught_up {
                continue;
            }
            let state = slot.task.watermark_state();
            let quiet = Quiet {
                caught_up,
                silence_ms: silence,
                max_ts: state.max_ts(),
                latest: state.latest(),
            };
            let bound = self.engine.max_out_of_orderness_ms;
            let Some(forced) = liveness::forced(quiet, idle, wall, bound).map(EventTime) else {
                continue;
            };
            let fires = slot.task.next_deadline().is_some_and(|d| forced >= d);
            // Finality: a silent partition's progress follows the clock too.
            let progresses = self.progress_to.is_some() && slot.task.progress_at(forced);
            if !(fires || progresses) {
                continue;
            }
            slot.task.force_watermark(forced, &mut self.panes);
            if let Some(e) = slot.task.take_spill_error() {
                return Err(WorkerError::Refused(e));
            }
            send_panes(
                &mut self.outputs,
                slot,
                &mut self.panes,
                self.progress_to,
                self.engine.generation,
            )?;
            let why = if silence >= idle {
                "quiet partition: watermark advanced by wall clock"
            } else {
                "caught-up partition: held event times trusted up to the wall clock"
            };
            if fires {
                info!(
                    partition = p.0,
                    silence_ms = silence,
                    watermark = forced.0,
                    "{why}"
                );
            } else {
                debug!(
                    partition = p.0,
                    silence_ms = silence,
                    watermark = forced.0,
                    "{why} (finality)"
                );
            }
        }
        Ok(())
    }

    /// A bounded run is done when it owns every partition of the input topic
    /// (`topic_partitions`) and has read each to the log end seen at assignment
    /// (`ledger::drained`; a log that ends in a transaction marker is read to its
    /// end by the consumer's position, `pass_positions`).
    /// Owning all of them matters under incremental assignment (cooperative,
    /// KIP-848): a first, partial assignment drained is not the end of the input.
    pub fn drained(&self, topic_partitions: usize) -> bool {
        self.assigned_once
            && self.slots.len() >= topic_partitions
            && self.slots.values().all(|s| ledger::drained(s.next, s.end))
    }

    /// Takes checkpoint N through the coordinator (steps 1–3); with `wait`, also
    /// completes it (4–5).
    pub fn checkpoint(&mut self, consumer: &Source, wait: bool) -> Result<(), WorkerError> {
        let topic = self.job.topic.clone();
        let mut committer = GroupCommitter::new(consumer, &topic);
        self.checkpoint_with(&mut committer, wait, Some(consumer))
    }

    /// `checkpoint` with the offsets committed through `committer`; `consumer`
    /// (outside a rebalance callback) adds the log ends to the published report.
    fn checkpoint_with(
        &mut self,
        committer: &mut dyn OffsetCommitter,
        wait: bool,
        consumer: Option<&Source>,
    ) -> Result<(), WorkerError> {
        let mut ports = OutputPorts::new(&mut self.outputs, committer);
        let done = if self.slots.is_empty() {
            self.coord.finish(&mut ports, true)?.into_iter().collect()
        } else {
            let slots = &mut self.slots;
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
            self.coord.checkpoint(&mut ports, cut, wait)?
        };
        if self.coord.settled() {
            self.evict_to_budget();
        }
        for c in done {
            self.completed(c, consumer);
        }
        Ok(())
    }

    /// A checkpoint completed (offsets committed, retention run): stats, report, log.
    fn completed(&mut self, c: Completed, consumer: Option<&Source>) {
        let manifest = &c.manifest;
        let total = self.audit();
        let (bytes, state_bytes) = (manifest.written_bytes(), manifest.state_bytes());
        self.checkpoint_stats = CheckpointStats {
            completed: self.checkpoint_stats.completed + 1,
            last_success_ms: Some(now_ms()),
            last_duration_ms: c.duration_ms as i64,
            last_bytes: bytes,
            state_bytes,
        };
        let report = match consumer {
            Some(consumer) => self.report_with(consumer),
            None => self.report(),
        };
        self.publisher.publish(&report);
        info!(
            checkpoint = manifest.id.0,
            pause_ms = self.coord.pauses_us.last().map_or(0, |us| us / 1000),
            duration_ms = c.duration_ms,
            bytes,
            state_bytes,
            offsets = %crate::logfmt::pairs(manifest.partitions.iter().map(|e| (e.partition.0, e.next_offset.0))),
            gap_offsets = manifest.partitions.iter().map(|e| e.offsets.gap_offsets).sum::<u64>(),
            consumed = total.consumed, folded = total.folded, too_late = total.too_late,
            dead_letter = total.dead_letter, duplicate = total.duplicate, panes = total.panes,
            audit_balanced = self.balanced(),
            "checkpoint complete"
        );
    }

    /// Completes the pending export if its thread is done (non-blocking).
    pub fn poll_export(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let mut committer = GroupCommitter::new(consumer, &self.job.topic);
        let mut ports = OutputPorts::new(&mut self.outputs, &mut committer);
        if let Some(c) = self.coord.finish(&mut ports, false)? {
            // The barrier's deltas are in the store now: windows may go.
            self.evict_to_budget();
            self.completed(c, Some(consumer));
        }
        Ok(())
    }

    /// Restores the partitions of an assignment from the facts the Kafka adapter
    /// gathered (log ranges, committed offsets): the checkpoint store is read in
    /// parallel, then `restore::decide` says where each starts, or refuses.
    fn restore_all(
        &mut self,
        facts: &[LogFacts],
    ) -> Result<Vec<(Partition, NextOffset)>, WorkerError> {
        let partitions: Vec<(Partition, Option<i64>)> = facts
            .iter()
            .map(|f| (f.partition, Some(f.log_end)))
            .collect();
        let restored = self.coord.checkpoints().restore_many(
            &partitions,
            &self.job.rules,
            self.policy,
            &self.store,
        )?;
        let location = self.coord.checkpoints().location();
        let names = Names {
            topic: &self.job.topic,
            group: &self.job.group,
            store: &location,
        };
        let mut starts = Vec::with_capacity(facts.len());
        for (f, r) in facts.iter().zip(restored) {
            let p = f.partition;
            let r = r.map_err(|e| match e {
                CheckpointError::Refused(m) => WorkerError::Refused(m),
                other => WorkerError::Checkpoint(other),
            })?;
            let fresh = r.is_none();
            if fresh {
                self.store.drop_partition(p)?;
            }
            let at = r.map(|r| (r.next_offset, r.offsets));
            let start = restore::decide(&names, f, at, self.policy, now_ms())
                .map_err(WorkerError::Refused)?;
            if let Some(o) = start.rebuilt_over {
                warn!(
                    partition = p.0,
                    committed = o,
                    "rebuilding from the log start as requested (--reset-state earliest)"
                );
            }
            match &start.accepted_gap {
                Some((gap, _)) if start.onboarded => log_onboarded(p, gap),
                Some((gap, how)) => log_accepted_gap(p, gap, how),
                None if self.policy.start_at_log_start && !fresh => info!(
                    partition = p.0,
                    "--start-at-log-start does not apply: the partition restores from a checkpoint"
                ),
                None => {}
            }
            // The store holds exactly this state now (imported or empty): the
            // task is built from it within the partition's share of the budget.
            let share = self
                .memory_budget
                .map(|b| b / (self.slots.len() + facts.len()).max(1));
            let restored = bounded::restore_task(&self.store, p, self.engine.clone(), share)?;
            let mut task = match restored {
                Some((task, _)) => task,
                None => {
                    let mut task = PartitionTask::new(p, self.engine.clone());
                    task.attach_spill(self.store.clone());
                    task
                }
            };
            task.track_progress();
            self.slots.insert(
                p,
                Slot {
                    task,
                    next: start.next,
                    end: f.log_end,
                    last_record: clock::mono_ms(),
                    checked_at: i64::MIN,
                    offsets: start.offsets,
                    assigned_at: self.epoch.load(Ordering::Acquire),
                },
            );
            starts.push((p, start.next));
        }
        Ok(starts)
    }

    /// Memory pressure between checkpoints: writes the changed windows to the
    /// working store through the coordinator (after any running export, which
    /// must read an unchanged store) and evicts down to the budget. Not a
    /// checkpoint: nothing is flushed, exported or committed to Kafka.
    pub fn spill(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let parts = self
            .slots
            .iter_mut()
            .map(|(p, s)| PartitionCommit {
                partition: *p,
                next_offset: s.next,
                delta: s.task.drain_changes(),
            })
            .collect();
        let mut committer = GroupCommitter::new(consumer, &self.job.topic);
        let mut ports = OutputPorts::new(&mut self.outputs, &mut committer);
        let done = self.coord.spill(&mut ports, parts)?;
        if let Some(c) = done {
            self.completed(c, Some(consumer));
        }
        self.evict_to_budget();
        Ok(())
    }

    /// Evicts windows beyond the memory budget (all are clean right after a commit).
    pub fn evict_to_budget(&mut self) {
        self.spill_due = false;
        let Some(budget) = self.memory_budget else {
            return;
        };
        let keep = crate::engine::spill::keep_of(budget) / self.slots.len().max(1);
        let evicted: usize = self.slots.values_mut().map(|s| s.task.evict(keep)).sum();
        if evicted > 0 {
            debug!(
                evicted,
                keep_per_partition = keep,
                "windows evicted to the state store"
            );
        }
    }

    /// Every 4096 records: are the windows and ids in memory over the budget?
    /// Then the next loop turn spills.
    fn check_memory(&mut self) {
        self.since_memory_check += 1;
        if self.since_memory_check < 4096 {
            return;
        }
        self.since_memory_check = 0;
        if let Some(budget) = self.memory_budget {
            let held: usize = self.slots.values().map(|s| s.task.budgeted_bytes()).sum();
            self.spill_due |= held > budget;
        }
    }

    /// Sums the audit counters; an imbalance is a bug and is reported loudly.
    pub fn audit(&self) -> Counters {
        let mut total = Counters::default();
        for (p, s) in &self.slots {
            let c = s.task.counters();
            if !c.balanced() {
                error!(partition = p.0, consumed = c.consumed, folded = c.folded, too_late = c.too_late,
                    dead_letter = c.dead_letter, duplicate = c.duplicate, "CONSERVATION AUDIT FAILED: consumed != folded + too_late + dead_letter + duplicate");
            }
            if !s.offsets.balanced(c.consumed, s.next) {
                error!(
                    partition = p.0,
                    consumed = c.consumed,
                    next_offset = s.next.0,
                    empty_offsets = s.offsets.empty_offsets,
                    gap_offsets = s.offsets.gap_offsets,
                    "OFFSET AUDIT FAILED: consumed + empty_offsets + gap_offsets != next_offset"
                );
            }
            total.add(&c);
        }
        total
    }

    /// Both audits hold on every partition: each record consumed has one route,
    /// and each offset advanced over is a record, an empty offset or an accepted gap.
    pub fn balanced(&self) -> bool {
        self.slots.values().all(|s| {
            let c = s.task.counters();
            c.balanced() && s.offsets.balanced(c.consumed, s.next)
        })
    }

    /// Librdkafka reported a fetch position out of range (`auto.offset.reset` is
    /// `error`, so it stops that partition instead of jumping). Each owned
    /// partition's next offset is checked against the broker's log: below the log
    /// start is a gap — refused, or accepted and fetched on from the log start;
    /// past the log end is refused. The report does not say which partition, so
    /// all are checked; a partition whose next offset is below the log start has a
    /// gap whether or not librdkafka still held some of it in its fetch queue: the
    /// broker no longer has those records, so no checkpoint could replay them.
    pub fn out_of_range(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let timeout = Duration::from_secs(10);
        let mut moved = false;
        for (p, slot) in self.slots.iter_mut() {
            let (low, high) = consumer
                .fetch_watermarks(&self.job.topic, p.0, timeout)
                .map_err(KafkaIoError::client(format!(
                    "reading the log range of {}/{p}",
                    self.job.topic
                )))?;
            let next = slot.next.0;
            if next > high {
                return Err(WorkerError::Refused(format!(
                    "partition {}/{p}: tally reads on at offset {next} but the log ends at {high}: the topic \
                     was recreated or the broker lost data. Refusing to guess; if the topic was recreated on \
                     purpose, start a new consumer group (or `--reset-state earliest`).",
                    self.job.topic
                )));
            }
            if next < low {
                let gap = Gap {
                    from: next,
                    to: low,
                    at_ms: now_ms(),
                };
                let how = "this worker fell behind the log start while running";
                accept_gap(
                    self.policy,
                    &self.job.topic,
                    *p,
                    gap,
                    &mut slot.offsets,
                    how,
                )?;
                slot.next = NextOffset(low);
                moved = true;
            }
        }
        if !moved {
            warn!("librdkafka reported an offset out of range, but every partition's next offset is inside its log; fetching on from each");
        }
        // Restarts the stopped fetch (and drops anything fetched before the gap).
        // A seek is refused on a partition librdkafka stopped, so the owned
        // partitions are assigned again, each at its next offset.
        let mut tpl = TopicPartitionList::new();
        for (p, slot) in &self.slots {
            tpl.add_partition_offset(&self.job.topic, p.0, Offset::Offset(slot.next.0))
                .map_err(KafkaIoError::client("building the assignment"))?;
        }
        let reassigned = if matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        ) {
            consumer
                .incremental_unassign(&tpl)
                .and_then(|_| consumer.incremental_assign(&tpl))
        } else {
            consumer.assign(&tpl)
        };
        reassigned.map_err(KafkaIoError::client(
            "fetching on after an offset out of range",
        ))?;
        self.publish_positions();
        info!(partitions = %crate::logfmt::pairs(self.slots.iter().map(|(p, s)| (p.0, s.next.0))), "fetching on");
        Ok(())
    }

    pub fn report(&self) -> WorkerReport {
        WorkerReport {
            at_ms: now_ms(),
            topic: self.job.topic.clone(),
            group: self.job.group.clone(),
            bound_ms: self.engine.max_out_of_orderness_ms,
            allowed_lateness_ms: self.engine.allowed_lateness_ms,
            checkpoint_interval_ms: self.checkpoint_interval_ms,
            checkpoint: self.checkpoint_stats.clone(),
            idle_ms: self.idle_ms,
            partitions: self
                .slots
                .iter()
                .map(|(p, s)| PartitionReport {
                    partition: *p,
                    watermark: s.task.max_ts().map(|_| s.task.watermark()),
                    max_ts: s.task.max_ts(),
                    next_offset: s.next,
                    offsets: s.offsets.clone(),
                    idle_ms: (clock::mono_ms() - s.last_record).max(0) as u64,
                    idle_advances: s.task.counters().idle_advances,
                    held: s.task.held(),
                    counters: s.task.counters(),
                    open_windows: s.task.open_windows(),
                    spilled_windows: s.task.open_windows() - s.task.windows_in_memory(),
                    dedup_ids: s.task.dedup_ids(),
                    dedup_cold_ids: s.task.dedup_cold_stats().0,
                    dedup_cold_reads: s.task.dedup_cold_stats().1,
                    delay: s.task.delay().clone(),
                    disorder: s.task.disorder().clone(),
                    // The log end seen at assignment until a fetch says more.
                    log_end: Some(s.end),
                    final_through: s.task.final_through(),
                })
                .collect(),
            pane_ack_us: self.outputs.producer().pane_ack_latency_us(),
        }
    }

    /// `report`, with each partition's log end as librdkafka last fetched it.
    pub fn report_with(&self, consumer: &Source) -> WorkerReport {
        let mut r = self.report();
        for p in &mut r.partitions {
            p.log_end = cached_log_end(consumer, &self.job.topic, p.partition).or(p.log_end);
        }
        r
    }
}

impl RebalanceHandler for Core {
    fn on_assign(
        &mut self,
        committer: &mut dyn OffsetCommitter,
        facts: &[LogFacts],
    ) -> Result<Vec<(Partition, NextOffset)>, WorkerError> {
        // The store must not be written while an export reads it.
        let mut ports = OutputPorts::new(&mut self.outputs, committer);
        let done = self.coord.finish(&mut ports, true)?;
        if let Some(c) = done {
            self.completed(c, None);
        }
        self.assigned_once = true;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.publisher
            .service()
            .set_not_ready(format!("restoring {} partition(s)", facts.len()));
        let starts = self.restore_all(facts)?;
        self.publish_positions();
        self.evict_to_budget();
        // Joined, and every assigned partition restored: the report shows the
        // restored positions and the backlog as of the assignment's log ends
        // before the service says ready.
        let report = self.report();
        self.publisher.publish_quiet(&report);
        self.publisher.service().set_ready();
        Ok(starts)
    }

    fn on_revoke(
        &mut self,
        committer: &mut dyn OffsetCommitter,
        partitions: &[Partition],
    ) -> Result<(), WorkerError> {
        // Hand over cleanly: checkpoint (and commit) before Kafka moves them.
        if !self.closed {
            self.checkpoint_with(committer, true, None)?;
        }
        for p in partitions {
            self.slots.remove(p);
            self.store.drop_partition(*p)?;
        }
        self.publish_positions();
        if self.slots.is_empty() {
            self.publisher
                .service()
                .set_not_ready("rebalancing: partitions revoked, waiting for an assignment");
        }
        Ok(())
    }
}
