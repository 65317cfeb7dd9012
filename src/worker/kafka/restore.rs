//! What only a consumer group meets: the restore of an assignment's partitions
//! (docs/DESIGN.md §7.3) from the facts the Kafka adapter gathered, and a fetch
//! position outside the log (§7.5) — the broker asked for the log range, the gap
//! decided by the partitions (`Partitions::fall_behind`), the fetch restarted.

use std::time::Duration;

use rdkafka::consumer::{Consumer, RebalanceProtocol};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::worker::Worker;
use crate::base::error::{Refusal, RefusalKind};
use crate::checkpoint::restore::{self, LogFacts, Names, Start as Decided};
use crate::checkpoint::CheckpointError;
use crate::engine::PartitionTask;
use crate::kafka::{now_ms, KafkaIoError};
use crate::model::Partition;
use crate::state::{bounded, NextOffset};
use crate::worker::partitions::{self, Start};
use crate::worker::rebalance::Source;
use crate::worker::WorkerError;

impl Worker {
    /// Restores the partitions of an assignment from the facts the Kafka adapter
    /// gathered (log ranges, committed offsets): the checkpoint store is read in
    /// parallel, then `restore::decide` says where each starts, or refuses.
    pub(super) fn restore_all(
        &mut self,
        facts: &[LogFacts],
    ) -> Result<Vec<(Partition, NextOffset)>, WorkerError> {
        let partitions: Vec<(Partition, Option<i64>)> = facts
            .iter()
            .map(|f| (f.partition, Some(f.log_end)))
            .collect();
        let policy = self.parts.policy();
        let restored = self.coord.checkpoints().restore_many(
            &partitions,
            &self.job.rules,
            policy,
            &self.store,
        )?;
        let location = self.coord.checkpoints().location();
        let (topic, group) = (self.job.topic.clone(), self.job.group.clone());
        let names = Names {
            topic: &topic,
            group: &group,
            store: &location,
        };
        let mut starts = Vec::with_capacity(facts.len());
        for (f, r) in facts.iter().zip(restored) {
            let p = f.partition;
            let r = r.map_err(|e| match e {
                CheckpointError::Refused(r) => WorkerError::Refused(r),
                other => WorkerError::Checkpoint(other),
            })?;
            let fresh = r.is_none();
            if fresh {
                self.store.drop_partition(p)?;
            }
            let at = r.map(|r| (r.next_offset, r.offsets));
            let start =
                restore::decide(&names, f, at, policy, now_ms()).map_err(WorkerError::Refused)?;
            log_start(p, &start, fresh, policy.start_at_log_start);
            starts.push((p, start.next));
            self.take_over(f, start, facts.len())?;
        }
        Ok(starts)
    }

    /// Builds `f`'s task from the store, which holds exactly its state now
    /// (imported or empty), within its share of the budget (`joining` partitions
    /// join at once), and hands it to the partitions.
    fn take_over(
        &mut self,
        f: &LogFacts,
        start: Decided,
        joining: usize,
    ) -> Result<(), WorkerError> {
        let p = f.partition;
        let engine = self.parts.engine().clone();
        let share = self.parts.share_with(joining);
        let restored = bounded::restore_task(&self.store, p, engine.clone(), share)?;
        let mut task = match restored {
            Some((task, _)) => task,
            None => {
                let mut task = PartitionTask::new(p, engine);
                task.attach_spill(self.store.clone());
                task
            }
        };
        task.track_progress();
        let start = Start {
            next: start.next,
            end: f.log_end,
            offsets: start.offsets,
            epoch: self.epoch.load(std::sync::atomic::Ordering::Acquire),
        };
        self.parts.assign(p, task, start);
        Ok(())
    }

    /// Librdkafka reported a fetch position out of range (`auto.offset.reset` is
    /// `error`, so it stops that partition instead of jumping). Each owned
    /// partition's next offset is checked against the broker's log: below the log
    /// start is a gap — refused, or accepted and fetched on from the log start;
    /// past the log end is refused. The report does not say which partition, so
    /// all are checked; a partition whose next offset is below the log start has a
    /// gap whether or not librdkafka still held some of it in its fetch queue: the
    /// broker no longer has those records, so no checkpoint could replay them.
    pub(crate) fn out_of_range(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        let timeout = Duration::from_secs(10);
        let topic = self.job.topic.clone();
        let mut moved = false;
        let owned: Vec<(Partition, NextOffset)> = self.parts.next_offsets().collect();
        for (p, next) in owned {
            let (low, high) = crate::kafka::watermarks(consumer, &topic, p.0, timeout).map_err(
                KafkaIoError::client(format!("reading the log range of {topic}/{p}")),
            )?;
            let next = next.0;
            if next > high {
                return Err(WorkerError::Refused(Refusal::new(RefusalKind::PastLogEnd, format!(
                    "partition {topic}/{p}: tally reads on at offset {next} but the log ends at {high}: the topic \
                     was recreated or the broker lost data. Refusing to guess; if the topic was recreated on \
                     purpose, start a new consumer group (or `--reset-state earliest`)."
                ))));
            }
            moved |= self.parts.fall_behind(p, low)?;
        }
        if !moved {
            warn!("librdkafka reported an offset out of range, but every partition's next offset is inside its log; fetching on from each");
        }
        // Restarts the stopped fetch (and drops anything fetched before the gap).
        // A seek is refused on a partition librdkafka stopped, so the owned
        // partitions are assigned again, each at its next offset.
        let mut tpl = TopicPartitionList::new();
        for (p, next) in self.parts.next_offsets() {
            tpl.add_partition_offset(&topic, p.0, Offset::Offset(next.0))
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
        info!(partitions = %crate::logfmt::pairs(self.parts.next_offsets().map(|(p, n)| (p.0, n.0))), "fetching on");
        Ok(())
    }
}

/// Logs how a restored partition starts: over a committed offset, after a gap.
fn log_start(p: Partition, start: &Decided, fresh: bool, start_at_log_start: bool) {
    if let Some(o) = start.rebuilt_over {
        warn!(
            partition = p.0,
            committed = o,
            "rebuilding from the log start as requested (--reset-state earliest)"
        );
    }
    match &start.accepted_gap {
        Some((gap, _)) if start.onboarded => partitions::log_onboarded(p, gap),
        Some((gap, how)) => partitions::log_accepted_gap(p, gap, how),
        None if start_at_log_start && !fresh => info!(
            partition = p.0,
            "--start-at-log-start does not apply: the partition restores from a checkpoint"
        ),
        None => {}
    }
}
