//! The worker's partitions and the checkpoint protocol (docs/DESIGN.md §7), shared between
//! the poll loop and the rebalance callback (both on the poll thread, one at a time).
//!
//! Checkpoint N:
//! 1. barrier: the loop is between record batches (`before_barrier`); the previous
//!    export is finished and its offsets committed first;
//! 2. flush the producer: every result, late and dead-letter record before the
//!    barrier is acknowledged, or the checkpoint fails (`after_flush`);
//! 3. write each partition's delta into the state store (one batch), then export
//!    the store to the checkpoint store on a background thread — the parts
//!    (`mid_upload` after the first, `before_manifest` after the last), then the
//!    `MANIFEST`, each created once, never replaced; processing resumes;
//! 4. when the export completes (`after_manifest`), commit its offsets to the group
//!    with `tally-checkpoint=N` as metadata (`after_offset_commit`);
//! 5. apply retention.
//!
//! A crash anywhere replays from the newest complete checkpoint; replayed outputs
//! are byte-identical to the originals (same versions), so the sink ignores them.
//!
//! Between checkpoints, when the windows in memory pass the memory budget by a
//! quarter, the worker *spills*: step 3's write without the export, then evicts
//! windows down to the budget. Nothing is flushed or committed; a crash after a
//! spill restores from the checkpoint files as usual (the store is a working copy).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, RebalanceProtocol};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use super::clock;
use super::report::Publisher;
use super::WorkerError;
use crate::checkpoint::export::{self, ExportJob, ExportPartition, JobIdentity, PendingExport};
use crate::checkpoint::ledger::{self, Gap};
use crate::checkpoint::store::CheckpointStore;
use crate::checkpoint::store::Restored;
use crate::checkpoint::OffsetLedger;
use crate::checkpoint::{CheckpointError, CheckpointId};
use crate::engine::{
    Counters, EngineConfig, PartitionTask, RecordIn, ResultRecord, Route, TaskSnapshot,
};
use crate::failpoint;
use crate::kafka::outputs::{source_coords, Outputs};
use crate::kafka::source::{
    cached_log_end, cached_log_start, RebalanceHandler, Source, StartPolicy,
};
use crate::kafka::{now_ms, KafkaIoError};
use crate::metrics::{CheckpointStats, PartitionReport, WorkerReport};
use crate::model::Partition;
use crate::state::{NextOffset, PartitionCommit, StateStore};
use crate::time::EventTime;

pub struct Slot {
    pub task: PartitionTask,
    pub next: NextOffset,
    /// Log end when the partition was assigned (for `until_end`).
    pub end: i64,
    /// `clock::mono_ms()` of this partition's last record.
    pub last_record: i64,
    /// Where the offsets before `next` went (checkpointed with the state).
    pub offsets: OffsetLedger,
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
        return Err(WorkerError::Refused(format!(
            "partition {topic}/{p}: {gap} were deleted by the broker (retention.ms, retention.bytes or \
             DeleteRecords) before tally read them: {how}. None of them is billed, and the last checkpoint \
             is intact, so a plain restart refuses again. Either bring the records back (restore the topic \
             from a backup, then restart), or accept the gap: restart with `--allow-truncated-log` — it \
             is logged, counted in tally_offsets_gap_total and recorded in the checkpoint. Then find out why \
             tally fell behind and raise the topic's retention."
        )));
    }
    error!(
        partition = p.0,
        from = gap.from,
        to = gap.to,
        records = gap.len(),
        how,
        "ACCEPTED GAP (--allow-truncated-log): records deleted before tally read them are not billed"
    );
    ledger.accept_gap(gap);
    Ok(())
}

pub struct Core {
    pub engine: Arc<EngineConfig>,
    /// Worker name, group, input topic and config fingerprint.
    pub job: JobIdentity,
    pub store: Arc<StateStore>,
    pub checkpoints: Arc<CheckpointStore>,
    pub outputs: Outputs,
    pub slots: BTreeMap<Partition, Slot>,
    pub panes: Vec<ResultRecord>,
    pub policy: StartPolicy,
    pub assigned_once: bool,
    /// `watermark.idle_timeout`, ms.
    pub idle_ms: Option<i64>,
    pub publisher: Publisher,
    pub next_id: CheckpointId,
    pub exporting: Option<PendingExport>,
    /// Barrier pauses so far, ms (for the shutdown summary and benchmarks).
    pub pauses_ms: Vec<u64>,
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
}

const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

impl Core {
    /// Routes a batch of polled records (any partitions, poll order) and produces
    /// what they caused: the same outcome as `process` on each, faster (see
    /// `PartitionTask::process_batch`). Per partition, records keep their order;
    /// results, late events and dead letters go to different topics, so their
    /// relative order across topics is not part of the contract.
    pub fn process_batch(
        &mut self,
        consumer: &Source,
        msgs: &[BorrowedMessage<'_>],
    ) -> Result<(), WorkerError> {
        let mut start = 0;
        while start < msgs.len() {
            let p = msgs[start].partition();
            let run = msgs[start..]
                .iter()
                .take_while(|m| m.partition() == p)
                .count();
            self.process_run(consumer, Partition(p), &msgs[start..start + run])?;
            start += run;
        }
        Ok(())
    }

    /// Consecutive records of partition `p`.
    fn process_run(
        &mut self,
        consumer: &Source,
        p: Partition,
        msgs: &[BorrowedMessage<'_>],
    ) -> Result<(), WorkerError> {
        let Some(slot) = self.slots.get_mut(&p) else {
            warn!(
                partition = p.0,
                records = msgs.len(),
                "records from an unassigned partition; skipped"
            );
            return Ok(());
        };
        // Already applied (a fetch racing a seek), or past a bounded run's end.
        let end = if self.bounded { slot.end } else { i64::MAX };
        let msgs: Vec<&BorrowedMessage<'_>> = msgs
            .iter()
            .filter(|m| m.offset() >= slot.next.0 && m.offset() < end)
            .collect();
        let Some(last) = msgs.last() else {
            return Ok(());
        };
        // Offsets the records skip (see `checkpoint::ledger`): empty ones in the
        // retained log, or — below the log start — deleted ones.
        let mut expected = slot.next.0;
        for m in &msgs {
            if m.offset() > expected {
                let low = cached_log_start(consumer, &self.job.topic, p);
                let skip = ledger::classify(expected, m.offset(), low, now_ms());
                if let Some(gap) = skip.deleted {
                    let how = "the records after them arrived without them";
                    accept_gap(self.policy, &self.job.topic, p, gap, &mut slot.offsets, how)?;
                }
                slot.offsets.empty(skip.empty);
            }
            expected = m.offset() + 1;
        }
        let now = clock::wall_ms();
        let recs: Vec<RecordIn<'_>> = msgs
            .iter()
            .map(|m| RecordIn {
                payload: m.payload().unwrap_or_default(),
                kafka_ts: m.timestamp().to_millis(),
                now_ms: now,
            })
            .collect();
        let mut routes = Vec::with_capacity(recs.len());
        let mut dead_letters = slot.task.counters().dead_letter;
        slot.task.process_batch(&recs, &mut self.panes, &mut routes);
        if let Some(e) = slot.task.take_spill_error() {
            return Err(WorkerError::Refused(e));
        }
        slot.next = NextOffset(last.offset() + 1);
        slot.last_record = clock::mono_ms();
        let burst = self.panes.len() > 1;
        for (i, pane) in self.panes.drain(..).enumerate() {
            if burst && i == 1 {
                failpoint::hit("mid_pane_burst");
            }
            self.outputs.result(&pane)?;
        }
        self.since_memory_check += msgs.len() as u32 - 1;
        self.check_memory();
        for (m, route) in msgs.iter().zip(routes) {
            let payload = m.payload().unwrap_or_default();
            match route {
                Route::Window | Route::Duplicate => {}
                Route::TooLate {
                    window_end,
                    watermark,
                } => {
                    let src = source_coords(&self.job.topic, p, m.offset());
                    self.outputs
                        .late(m.key(), payload, window_end, watermark, &src)?;
                }
                Route::DeadLetter(reason) => {
                    let src = source_coords(&self.job.topic, p, m.offset());
                    dead_letters += 1;
                    // The first dead letters of a partition are logged one by one,
                    // then every 1000th: a flood of poison must not flood the log.
                    let n = dead_letters;
                    if n <= 10 || n % 1000 == 0 {
                        warn!(source = %src, reason = %reason, dead_letters = n, "dead letter");
                    }
                    self.outputs.dead_letter(m.key(), payload, &reason, &src)?;
                }
            }
        }
        Ok(())
    }

    /// Idleness (docs/DESIGN.md §4): after `idle_timeout` of silence, a partition's
    /// watermark follows the wall clock from where its data left it
    /// (`max_ts - bound + silence`). Forced only when that fires or purges
    /// something; the forced value is part of the checkpointed watermark.
    pub fn advance_idle(&mut self) -> Result<(), WorkerError> {
        let Some(idle) = self.idle_ms else {
            return Ok(());
        };
        let now = clock::mono_ms();
        for slot in self.slots.values_mut() {
            let silence = now - slot.last_record;
            let (Some(max_ts), Some(deadline)) = (slot.task.max_ts(), slot.task.next_deadline())
            else {
                continue;
            };
            let forced = EventTime(max_ts.0 - self.engine.max_out_of_orderness_ms + silence);
            if silence >= idle && forced >= deadline {
                slot.task.force_watermark(forced, &mut self.panes);
                if let Some(e) = slot.task.take_spill_error() {
                    return Err(WorkerError::Refused(e));
                }
                info!(
                    partition = slot.task.partition().0,
                    silence_ms = silence,
                    watermark = forced.0,
                    "idle partition: watermark advanced by wall clock"
                );
            }
        }
        for pane in self.panes.drain(..) {
            self.outputs.result(&pane)?;
        }
        Ok(())
    }

    /// A bounded run is done when it owns every partition of the input topic
    /// (`topic_partitions`) and has read each to the log end seen at assignment.
    /// Owning all of them matters under incremental assignment (cooperative,
    /// KIP-848): a first, partial assignment drained is not the end of the input.
    pub fn drained(&self, topic_partitions: usize) -> bool {
        self.assigned_once
            && self.slots.len() >= topic_partitions
            && self.slots.values().all(|s| s.next.0 >= s.end)
    }

    /// Takes checkpoint N (steps 1–3); with `wait`, also completes it (4–5).
    pub fn checkpoint(&mut self, consumer: &Source, wait: bool) -> Result<(), WorkerError> {
        // The pause runs from here: waiting for a previous export is part of it.
        let started = Instant::now();
        self.finish_export(consumer)?;
        if self.slots.is_empty() {
            return Ok(());
        }
        failpoint::hit("before_barrier");
        self.outputs.flush(FLUSH_TIMEOUT)?;
        failpoint::hit("after_flush");
        let mut parts = Vec::with_capacity(self.slots.len());
        let mut listed = Vec::with_capacity(self.slots.len());
        for (p, s) in self.slots.iter_mut() {
            parts.push(PartitionCommit {
                partition: *p,
                next_offset: s.next,
                delta: s.task.drain_changes(),
            });
            listed.push(ExportPartition {
                partition: *p,
                next_offset: s.next,
                watermark: s.task.max_ts().map(|_| s.task.watermark()),
                counters: s.task.counters(),
                offsets: s.offsets.clone(),
            });
        }
        self.store.commit(parts)?;
        self.evict_to_budget();
        let id = self.next_id;
        self.next_id = CheckpointId(id.0.saturating_add(1));
        let job = ExportJob {
            id,
            job: self.job.clone(),
            created_at_ms: now_ms(),
            partitions: listed,
            store: self.store.clone(),
            checkpoints: self.checkpoints.clone(),
        };
        let pending = export::spawn(job, started).map_err(|source| WorkerError::Io {
            path: "checkpoint thread".into(),
            source,
        })?;
        self.exporting = Some(pending);
        self.pauses_ms.push(started.elapsed().as_millis() as u64);
        if wait {
            self.finish_export(consumer)?;
        }
        Ok(())
    }

    /// Completes a finished (or, blocking, the pending) export: offsets, retention.
    pub fn finish_export(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let Some(pending) = self.exporting.take() else {
            return Ok(());
        };
        let (id, started) = (pending.id, pending.started);
        let manifest = pending.wait()?;
        failpoint::hit("after_manifest");
        let mut tpl = TopicPartitionList::new();
        for e in &manifest.partitions {
            tpl.add_partition_offset(
                &self.job.topic,
                e.partition.0,
                Offset::Offset(e.next_offset.0),
            )
            .map_err(KafkaIoError::client("building the offset list"))?;
        }
        for mut elem in tpl.elements_for_topic(&self.job.topic) {
            elem.set_metadata(format!("tally-checkpoint={}", id.0));
        }
        // Offsets in the group mirror the checkpoint. A failed commit (e.g. during a
        // rebalance) loses nothing: restores read offsets from the checkpoint store.
        if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
            warn!(checkpoint = id.0, error = %e, "offset commit failed; the checkpoint is complete");
        }
        failpoint::hit("after_offset_commit");
        self.checkpoints.retain(id)?;
        let total = self.audit();
        self.checkpoint_stats = CheckpointStats {
            completed: self.checkpoint_stats.completed + 1,
            last_success_ms: Some(now_ms()),
            last_duration_ms: started.elapsed().as_millis() as i64,
            last_bytes: manifest.partitions.iter().map(|e| e.bytes()).sum(),
        };
        let report = self.report_with(consumer);
        self.publisher.publish(&report);
        info!(
            checkpoint = id.0,
            pause_ms = self.pauses_ms.last().copied().unwrap_or(0),
            duration_ms = started.elapsed().as_millis() as u64,
            bytes = manifest.partitions.iter().map(|e| e.bytes()).sum::<u64>(),
            offsets = %crate::logfmt::pairs(manifest.partitions.iter().map(|e| (e.partition.0, e.next_offset.0))),
            gap_offsets = manifest.partitions.iter().map(|e| e.offsets.gap_offsets).sum::<u64>(),
            consumed = total.consumed, folded = total.folded, too_late = total.too_late,
            dead_letter = total.dead_letter, duplicate = total.duplicate, panes = total.panes,
            audit_balanced = self.balanced(),
            "checkpoint complete"
        );
        Ok(())
    }

    /// Completes the pending export if its thread is done (non-blocking).
    pub fn poll_export(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        if self
            .exporting
            .as_ref()
            .is_some_and(PendingExport::is_finished)
        {
            self.finish_export(consumer)?;
        }
        Ok(())
    }

    /// Restores `partitions` from the checkpoint store (in parallel).
    fn restore_all(
        &self,
        partitions: &[Partition],
    ) -> Vec<Result<Option<Restored>, CheckpointError>> {
        if self.policy.reset_state_earliest {
            return partitions.iter().map(|_| Ok(None)).collect();
        }
        self.checkpoints
            .restore_many(partitions, &self.job.fingerprint, &self.store)
    }

    fn restore(
        &mut self,
        consumer: &Source,
        p: Partition,
        restored: Result<Option<Restored>, CheckpointError>,
    ) -> Result<NextOffset, WorkerError> {
        let timeout = Duration::from_secs(10);
        let (low, high) = consumer
            .fetch_watermarks(&self.job.topic, p.0, timeout)
            .map_err(KafkaIoError::client(format!(
                "reading the log range of {}/{p}",
                self.job.topic
            )))?;
        let topic = &self.job.topic;
        let restored = restored.map_err(|e| match e {
            CheckpointError::Refused(m) => WorkerError::Refused(m),
            other => WorkerError::Checkpoint(other),
        })?;
        let mut snapshot = TaskSnapshot::default();
        let fresh = restored.is_none();
        let (start, mut offsets) = match restored {
            Some(r) => {
                snapshot = r.snapshot;
                (r.next_offset.0, r.offsets)
            }
            None => {
                self.store.drop_partition(p)?;
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(topic, p.0);
                let committed = consumer
                    .committed_offsets(tpl, timeout)
                    .map_err(KafkaIoError::client("reading committed offsets"))?;
                let group_offset = committed.find_partition(topic, p.0).map(|e| e.offset());
                if let Some(Offset::Offset(o)) = group_offset {
                    if !self.policy.reset_state_earliest {
                        return Err(WorkerError::Refused(format!(
                            "partition {topic}/{p} has committed offset {o} in consumer group {} but no checkpoint \
                             in {}. Starting from empty state would under-bill (the windows before offset {o} \
                             are lost). Restore the checkpoint directory, or rebuild this partition from the log \
                             start with `tally run --reset-state earliest`.",
                            self.job.group,
                            self.checkpoints.location()
                        )));
                    }
                    warn!(
                        partition = p.0,
                        committed = o,
                        "rebuilding from the log start as requested (--reset-state earliest)"
                    );
                }
                (0, OffsetLedger::default())
            }
        };
        if start > high {
            return Err(WorkerError::Refused(format!(
                "partition {topic}/{p}: the checkpoint resumes at offset {start} but the log ends at {high}: the \
                 topic was recreated or the broker lost data. Refusing to guess."
            )));
        }
        if start < low {
            let how = if fresh {
                format!(
                    "the partition has no checkpoint in {} and its log starts at offset {low}, not 0, so a \
                     replay would bill a partial history (if it had checkpoints, restore that directory)",
                    self.checkpoints.location()
                )
            } else {
                format!("the checkpoint resumes at offset {start} but the log now starts at {low}")
            };
            let gap = Gap {
                from: start,
                to: low,
                at_ms: now_ms(),
            };
            accept_gap(self.policy, topic, p, gap, &mut offsets, &how)?;
        }
        let mut task = PartitionTask::restore(p, self.engine.clone(), snapshot);
        // The store holds exactly this state now (imported or empty).
        task.attach_spill(self.store.clone());
        self.slots.insert(
            p,
            Slot {
                task,
                next: NextOffset(start.max(low)),
                end: high,
                last_record: clock::mono_ms(),
                offsets,
            },
        );
        Ok(NextOffset(start.max(low)))
    }

    /// Memory pressure between checkpoints: writes the changed windows to the
    /// working store (after any running export, which must read an unchanged
    /// store) and evicts down to the budget. Not a checkpoint: nothing is flushed,
    /// exported or committed to Kafka — the store is a working copy, and a restore
    /// reads the checkpoint files, never it.
    pub fn spill(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        self.finish_export(consumer)?;
        let parts = self
            .slots
            .iter_mut()
            .map(|(p, s)| PartitionCommit {
                partition: *p,
                next_offset: s.next,
                delta: s.task.drain_changes(),
            })
            .collect();
        self.store.commit(parts)?;
        self.evict_to_budget();
        Ok(())
    }

    /// Evicts windows beyond the memory budget (all are clean right after a commit).
    pub fn evict_to_budget(&mut self) {
        self.spill_due = false;
        let Some(budget) = self.memory_budget else {
            return;
        };
        let keep = budget / self.slots.len().max(1);
        let evicted: usize = self.slots.values_mut().map(|s| s.task.evict(keep)).sum();
        if evicted > 0 {
            debug!(
                evicted,
                keep_per_partition = keep,
                "windows evicted to the state store"
            );
        }
    }

    /// Every 4096 records: are the windows in memory a quarter over the budget?
    /// Then the next loop turn spills.
    fn check_memory(&mut self) {
        self.since_memory_check += 1;
        if self.since_memory_check < 4096 {
            return;
        }
        self.since_memory_check = 0;
        if let Some(budget) = self.memory_budget {
            let held: usize = self.slots.values().map(|s| s.task.memory_bytes()).sum();
            self.spill_due |= held > budget + budget / 4;
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
                    counters: s.task.counters(),
                    open_windows: s.task.open_windows(),
                    spilled_windows: s.task.open_windows() - s.task.windows_in_memory(),
                    dedup_ids: s.task.dedup_ids(),
                    delay: s.task.delay().clone(),
                    disorder: s.task.disorder().clone(),
                    log_end: None,
                })
                .collect(),
            pane_ack_us: self.outputs.pane_ack_latency_us(),
        }
    }

    /// `report`, with each partition's log end as librdkafka last fetched it.
    pub fn report_with(&self, consumer: &Source) -> WorkerReport {
        let mut r = self.report();
        for p in &mut r.partitions {
            p.log_end = cached_log_end(consumer, &self.job.topic, p.partition);
        }
        r
    }
}

impl RebalanceHandler for Core {
    fn on_assign(
        &mut self,
        consumer: &Source,
        partitions: &[Partition],
    ) -> Result<Vec<(Partition, NextOffset)>, String> {
        // The store must not be written while an export reads it.
        self.finish_export(consumer).map_err(|e| e.to_string())?;
        self.assigned_once = true;
        self.publisher
            .service()
            .set_not_ready(format!("restoring {} partition(s)", partitions.len()));
        let restored = self.restore_all(partitions);
        let starts: Result<Vec<_>, String> = partitions
            .iter()
            .zip(restored)
            .map(|(p, r)| {
                self.restore(consumer, *p, r)
                    .map(|s| (*p, s))
                    .map_err(|e| e.to_string())
            })
            .collect();
        self.evict_to_budget();
        if starts.is_ok() {
            // Joined, and every assigned partition restored.
            self.publisher.service().set_ready();
        }
        starts
    }

    fn on_revoke(&mut self, consumer: &Source, partitions: &[Partition]) -> Result<(), String> {
        // Hand over cleanly: checkpoint (and commit) before Kafka moves them.
        if !self.closed {
            self.checkpoint(consumer, true).map_err(|e| e.to_string())?;
        }
        for p in partitions {
            self.slots.remove(p);
            self.store.drop_partition(*p).map_err(|e| e.to_string())?;
        }
        if self.slots.is_empty() {
            self.publisher
                .service()
                .set_not_ready("rebalancing: partitions revoked, waiting for an assignment");
        }
        Ok(())
    }
}
