//! The Kafka worker's state: its partitions (`worker::partitions`, over the
//! producer, `KafkaOutputs`), the checkpoint coordinator, and what only a consumer
//! group has — the assignment epoch, the rebalance handler, the restores
//! (`restore`), a fetch position outside the log (`restore::out_of_range`), the
//! group's offsets and the published report.
//!
//! Shared between the loop (main thread) and the rebalance callback (poll thread),
//! one at a time behind one lock. Checkpoints go through the one checkpoint
//! coordinator (`checkpoint::coordinator`, docs/DESIGN.md §7.2); restores follow
//! `checkpoint::restore`'s decision over the facts the Kafka adapter gathered
//! (`kafka::source`), so nothing here calls the consumer from inside a rebalance
//! callback.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::info;

use super::outputs::KafkaOutputs;
use super::poller::Polled;
use crate::checkpoint::coordinator::{Completed, Coordinator, OffsetCommitter};
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::restore::LogFacts;
use crate::engine::EngineConfig;
use crate::kafka::now_ms;
use crate::kafka::source::{cached_log_end, GroupCommitter};
use crate::metrics::{CheckpointStats, WorkerReport};
use crate::model::Partition;
use crate::state::{NextOffset, StateStore};
use crate::worker::lag;
use crate::worker::partitions::Partitions;
use crate::worker::rebalance::{RebalanceHandler, Source};
use crate::worker::report::Publisher;
use crate::worker::WorkerError;

pub(crate) struct Worker {
    pub(super) parts: Partitions<KafkaOutputs>,
    /// The engine configuration as the poll thread reads it for step 1
    /// (`kafka::poller`), replaced by a price reload.
    pub(super) shared_engine: Arc<Mutex<Arc<EngineConfig>>>,
    /// Raised by every assignment, read by the poll thread after each poll: the
    /// runs polled before a partition was assigned again are not applied.
    pub(super) epoch: Arc<AtomicU64>,
    /// Worker name, group, input topic and config fingerprint.
    pub(super) job: JobIdentity,
    pub(super) store: Arc<StateStore>,
    /// The checkpoint protocol (and the checkpoint store).
    pub(super) coord: Coordinator,
    pub(super) publisher: Publisher,
    pub(super) assigned_once: bool,
    /// Set after the final checkpoint, or when the worker failed: nothing more is
    /// checkpointed (not the end-of-input panes of a bounded run; not a revoke
    /// after a failed flush, whose checkpoint would pass over undelivered outputs).
    pub(super) closed: bool,
    /// `checkpoint.interval`, ms (reported).
    pub(super) checkpoint_interval_ms: i64,
    /// This process's checkpoints (reported).
    pub(super) checkpoint_stats: CheckpointStats,
    /// Each owned partition's position, for the consumer lag computed when
    /// `/metrics` is scraped (`worker::lag`): published whenever a next offset
    /// moves or the assignment changes.
    pub(super) applied: Arc<lag::Applied>,
}

impl Worker {
    /// Applies a chunk of polled records (any partitions, poll order): each run,
    /// then the positions the chunk ends with.
    pub(crate) fn process_polled(
        &mut self,
        polled: &Polled,
        consumer: &Source,
    ) -> Result<(), WorkerError> {
        for run in &polled.runs {
            // A run that fired a window end brought its evicted windows back: over
            // the budget, they go before the next partition's run adds its own,
            // and between the steps of an end firing in steps (`apply` stops
            // there; the caller holds the worker lock, so no rebalance gets in).
            loop {
                let done = self.parts.apply(run, &polled.cfg, polled.now_ms)?;
                if self.parts.spill_due() {
                    self.spill(consumer)?;
                }
                if done {
                    break;
                }
            }
        }
        if let Some(positions) = &polled.positions {
            let at = positions.at.iter().zip(&positions.log_starts);
            for ((p, position), low) in at {
                self.parts.pass(*p, positions.epoch, *position, *low)?;
            }
        }
        self.publish_positions();
        Ok(())
    }

    /// Publishes each owned partition's position for the consumer lag.
    pub(crate) fn publish_positions(&self) {
        self.applied.publish(self.parts.lag_positions());
    }

    /// The liveness rule, with each partition's log end as librdkafka last saw it.
    pub(crate) fn advance_idle(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let topic = &self.job.topic;
        self.parts
            .advance_idle(|p| cached_log_end(consumer, topic, p))?;
        // An end firing in steps: spilling between them when due.
        while self.parts.firing() {
            if self.parts.spill_due() {
                self.spill(consumer)?;
            }
            self.parts.resume_firings()?;
        }
        if self.parts.spill_due() {
            self.spill(consumer)?;
        }
        Ok(())
    }

    /// A bounded run is done when it owns every partition of the input topic
    /// (`topic_partitions`) and has read each to the log end seen at assignment
    /// (`ledger::drained`; a log that ends in a transaction marker is read to its
    /// end by the consumer's position, `Partitions::pass`).
    /// Owning all of them matters under incremental assignment (cooperative,
    /// KIP-848): a first, partial assignment drained is not the end of the input.
    pub(crate) fn drained(&self, topic_partitions: usize) -> bool {
        self.assigned_once && self.parts.len() >= topic_partitions && self.parts.drained()
    }

    /// Takes checkpoint N through the coordinator (steps 1–3); with `wait`, also
    /// completes it (4–5).
    pub(crate) fn checkpoint(&mut self, consumer: &Source, wait: bool) -> Result<(), WorkerError> {
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
        let done = self.parts.checkpoint(&mut self.coord, committer, wait)?;
        for c in done {
            self.completed(c, consumer);
        }
        Ok(())
    }

    /// Memory pressure between checkpoints (`Partitions::spill`).
    pub(crate) fn spill(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let mut committer = GroupCommitter::new(consumer, &self.job.topic);
        if let Some(c) = self.parts.spill(&mut self.coord, &mut committer)? {
            self.completed(c, Some(consumer));
        }
        Ok(())
    }

    /// Completes the pending export if its thread is done (non-blocking).
    pub(crate) fn poll_export(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let mut committer = GroupCommitter::new(consumer, &self.job.topic);
        if let Some(c) = self.parts.finish(&mut self.coord, &mut committer, false)? {
            // The barrier's deltas are in the store now: windows may go.
            self.parts.evict_to_budget()?;
            self.completed(c, Some(consumer));
        }
        Ok(())
    }

    /// A checkpoint completed (offsets committed, retention run): stats, report, log.
    fn completed(&mut self, c: Completed, consumer: Option<&Source>) {
        let manifest = &c.manifest;
        let total = self.parts.audit();
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
            audit_balanced = self.parts.balanced(),
            "checkpoint complete"
        );
    }

    fn report_of(&self, log_end: impl Fn(Partition) -> Option<i64>) -> WorkerReport {
        let engine = self.parts.engine();
        WorkerReport {
            at_ms: now_ms(),
            topic: self.job.topic.clone(),
            group: self.job.group.clone(),
            bound_ms: engine.max_out_of_orderness_ms,
            allowed_lateness_ms: engine.allowed_lateness_ms,
            window_size_ms: engine.window.size_ms,
            window_offset_ms: engine.window.offset_ms,
            checkpoint_interval_ms: self.checkpoint_interval_ms,
            checkpoint: self.checkpoint_stats.clone(),
            idle_ms: self.parts.idle_ms(),
            // The log end seen at assignment until a fetch says more.
            partitions: self.parts.reports(log_end),
            pane_ack_us: self.parts.outputs().producer().pane_ack_latency_us(),
        }
    }

    /// The report, with each partition's log end as seen at its assignment.
    pub(crate) fn report(&self) -> WorkerReport {
        self.report_of(|_| None)
    }

    /// `report`, with each partition's log end as librdkafka last fetched it.
    pub(crate) fn report_with(&self, consumer: &Source) -> WorkerReport {
        let topic = &self.job.topic;
        self.report_of(|p| cached_log_end(consumer, topic, p))
    }
}

impl RebalanceHandler for Worker {
    fn on_assign(
        &mut self,
        committer: &mut dyn OffsetCommitter,
        facts: &[LogFacts],
    ) -> Result<Vec<(Partition, NextOffset)>, WorkerError> {
        // The store must not be written while an export reads it.
        if let Some(c) = self.parts.finish(&mut self.coord, committer, true)? {
            self.completed(c, None);
        }
        self.assigned_once = true;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.publisher
            .service()
            .set_not_ready(format!("restoring {} partition(s)", facts.len()));
        let starts = self.restore_all(facts)?;
        self.publish_positions();
        self.parts.evict_to_budget()?;
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
            self.parts.remove(*p);
            self.store.drop_partition(*p)?;
        }
        self.publish_positions();
        if self.parts.is_empty() {
            self.publisher
                .service()
                .set_not_ready("rebalancing: partitions revoked, waiting for an assignment");
        }
        Ok(())
    }
}
