//! The Kafka worker loop: poll → partition task → producers, with periodic commits.
//!
//! Commit protocol (the single-worker form of DESIGN §7):
//! 1. stop taking records (the loop is single-threaded: between two records);
//! 2. flush the producer — every result, late and dead-letter record produced so
//!    far is acknowledged, or the commit fails and the worker exits;
//! 3. write every partition's state delta and next offset in one synced RocksDB batch;
//! 4. only then commit the same offsets to the consumer group.
//!
//! A crash anywhere replays from the state's offsets; the replay re-produces the
//! same payloads (same versions), which the sink ignores.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::report::Publisher;
use super::{shutdown, WorkerError};
use crate::config::Config;
use crate::engine::{Counters, EngineConfig, PartitionTask, RecordIn, ResultRecord, Route};
use crate::kafka::outputs::{source_coords, Outputs};
use crate::kafka::source::{RebalanceEvent, Source, SourceContext, StartPolicy};
use crate::kafka::{client_config, now_ms, KafkaIoError, CONSUMER_DEFAULTS};
use crate::metrics::{PartitionReport, WorkerReport};
use crate::state::{NextOffset, PartitionCommit, StateStore};

#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Stop at the log ends seen at assignment; flush all open windows as end of input.
    pub until_end: bool,
    pub policy: StartPolicy,
}

struct Slot {
    task: PartitionTask,
    next: NextOffset,
    /// Log end when the partition was assigned (for `until_end`).
    end: i64,
    last_record: Instant,
}

struct Worker {
    engine: Arc<EngineConfig>,
    topic: String,
    store: Arc<StateStore>,
    outputs: Outputs,
    slots: BTreeMap<i32, Slot>,
    panes: Vec<ResultRecord>,
    assigned_once: bool,
    /// `watermark.idle_timeout`, ms.
    idle_ms: Option<i64>,
    group: String,
    publisher: Publisher,
}

/// Runs one worker until shutdown (or, with `until_end`, until its partitions are drained).
pub fn run(cfg: &Config, opts: RunOptions) -> Result<Counters, WorkerError> {
    let engine = cfg.engine()?;
    std::fs::create_dir_all(&cfg.state.dir).map_err(|source| WorkerError::Io {
        path: cfg.state.dir.display().to_string(),
        source,
    })?;
    let store = Arc::new(StateStore::open(&cfg.state.dir)?);
    let mut consumer_cfg = client_config(&cfg.kafka, CONSUMER_DEFAULTS);
    consumer_cfg.set("group.id", &cfg.kafka.group_id);
    let consumer: Source = consumer_cfg
        .create_with_context(SourceContext::new(store.clone(), opts.policy))
        .map_err(KafkaIoError::client("creating the consumer"))?;
    consumer
        .subscribe(&[&cfg.topics.input])
        .map_err(KafkaIoError::client(format!(
            "subscribing to {}",
            cfg.topics.input
        )))?;
    let mut w = Worker {
        engine,
        topic: cfg.topics.input.clone(),
        store,
        outputs: Outputs::new(&cfg.kafka, &cfg.topics)?,
        slots: BTreeMap::new(),
        panes: Vec::new(),
        assigned_once: false,
        idle_ms: cfg.watermark.idle_timeout.0.map(|m| m.0),
        group: cfg.kafka.group_id.clone(),
        publisher: Publisher::new(&cfg.state.dir, cfg.metrics.listen.as_deref()).map_err(
            |source| WorkerError::Io {
                path: format!("metrics listener {:?}", cfg.metrics.listen),
                source,
            },
        )?,
    };
    info!(topic = %w.topic, group = %cfg.kafka.group_id, state = %cfg.state.dir.display(), "worker started");
    let interval = Duration::from_millis(cfg.checkpoint.interval.0 as u64);
    let mut last_commit = Instant::now();
    loop {
        if shutdown::requested() {
            info!("shutdown requested");
            break;
        }
        let msg = consumer.poll(Duration::from_millis(100));
        if let Some(fatal) = consumer.context().take_fatal() {
            return Err(WorkerError::Refused(fatal));
        }
        w.apply_rebalance(&consumer)?;
        match msg {
            Some(Ok(m)) => w.process(&m)?,
            Some(Err(e)) => warn!(error = %e, "consumer error"),
            None => {}
        }
        w.outputs.poll();
        if !opts.until_end {
            w.advance_idle()?;
        }
        if last_commit.elapsed() >= interval {
            w.commit(&consumer)?;
            last_commit = Instant::now();
        }
        if opts.until_end && w.drained() {
            info!("reached the log end of every assigned partition");
            break;
        }
    }
    w.commit(&consumer)?;
    if opts.until_end {
        // End of input: emit every open window. Not persisted (see PartitionTask::end_of_input).
        for slot in w.slots.values_mut() {
            slot.task.end_of_input(&mut w.panes);
        }
        for pane in w.panes.drain(..) {
            w.outputs.result(&pane)?;
        }
        w.outputs.flush(Duration::from_secs(60))?;
    }
    let total = w.audit();
    info!(?total, "worker stopped");
    Ok(total)
}

impl Worker {
    fn apply_rebalance(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        for event in consumer.context().take_events() {
            match event {
                RebalanceEvent::Assigned(parts) => {
                    self.assigned_once = true;
                    for (p, start, end) in parts {
                        let (snap, next) = match self.store.load(p)? {
                            Some((snap, next)) => (snap, next),
                            None => (Default::default(), NextOffset(start)),
                        };
                        let task = PartitionTask::restore(p, self.engine.clone(), snap);
                        self.slots.insert(
                            p,
                            Slot {
                                task,
                                next,
                                end,
                                last_record: Instant::now(),
                            },
                        );
                    }
                }
                RebalanceEvent::Revoked(parts) => {
                    // Persist what we have for them, then let them go.
                    self.commit(consumer)?;
                    for p in parts {
                        self.slots.remove(&p);
                    }
                }
            }
        }
        Ok(())
    }

    fn process(&mut self, m: &rdkafka::message::BorrowedMessage<'_>) -> Result<(), WorkerError> {
        let p = m.partition();
        let Some(slot) = self.slots.get_mut(&p) else {
            warn!(
                partition = p,
                offset = m.offset(),
                "record from an unassigned partition; skipped"
            );
            return Ok(());
        };
        if m.offset() < slot.next.0 {
            return Ok(()); // already applied (a fetch racing a seek)
        }
        let payload = m.payload().unwrap_or_default();
        let rec = RecordIn {
            payload,
            kafka_ts: m.timestamp().to_millis(),
            now_ms: now_ms(),
        };
        let route = slot.task.process(rec, &mut self.panes);
        slot.next = NextOffset(m.offset() + 1);
        slot.last_record = Instant::now();
        for pane in self.panes.drain(..) {
            self.outputs.result(&pane)?;
        }
        match route {
            Route::Window | Route::Duplicate => {}
            Route::TooLate {
                window_end,
                watermark,
            } => {
                let src = source_coords(&self.topic, p, m.offset());
                self.outputs
                    .late(m.key(), payload, window_end, watermark, &src)?;
            }
            Route::DeadLetter(reason) => {
                let src = source_coords(&self.topic, p, m.offset());
                warn!(source = %src, reason = %reason, "dead letter");
                self.outputs.dead_letter(m.key(), payload, &reason, &src)?;
            }
        }
        Ok(())
    }

    /// Idleness (DESIGN §4): after `idle_timeout` of silence, a partition's
    /// watermark follows the wall clock from where its data left it
    /// (`max_ts - bound + silence`). Forced only when that fires or purges
    /// something; the forced value is part of the committed watermark state.
    fn advance_idle(&mut self) -> Result<(), WorkerError> {
        let Some(idle) = self.idle_ms else {
            return Ok(());
        };
        for slot in self.slots.values_mut() {
            let silence = slot.last_record.elapsed().as_millis() as i64;
            let (Some(max_ts), Some(deadline)) = (slot.task.max_ts(), slot.task.next_deadline())
            else {
                continue;
            };
            let forced = max_ts - self.engine.max_out_of_orderness_ms + silence;
            if silence >= idle && forced >= deadline {
                slot.task.force_watermark(forced, &mut self.panes);
                info!(
                    partition = slot.task.partition(),
                    silence_ms = silence,
                    watermark = forced,
                    "idle partition: watermark advanced by wall clock"
                );
            }
        }
        for pane in self.panes.drain(..) {
            self.outputs.result(&pane)?;
        }
        Ok(())
    }

    fn report(&self) -> WorkerReport {
        WorkerReport {
            at_ms: now_ms(),
            topic: self.topic.clone(),
            group: self.group.clone(),
            bound_ms: self.engine.max_out_of_orderness_ms,
            idle_ms: self.idle_ms,
            partitions: self
                .slots
                .iter()
                .map(|(p, s)| PartitionReport {
                    partition: *p,
                    watermark: s.task.max_ts().map(|_| s.task.watermark()),
                    max_ts: s.task.max_ts(),
                    next_offset: s.next.0,
                    idle_ms: s.last_record.elapsed().as_millis() as u64,
                    idle_advances: s.task.counters().idle_advances,
                    counters: s.task.counters(),
                    open_windows: s.task.open_windows(),
                    dedup_ids: s.task.dedup_ids(),
                    delay: s.task.delay().clone(),
                    disorder: s.task.disorder().clone(),
                })
                .collect(),
        }
    }

    fn drained(&self) -> bool {
        self.assigned_once && self.slots.values().all(|s| s.next.0 >= s.end)
    }

    /// Steps 2–4 of the commit protocol.
    fn commit(&mut self, consumer: &Source) -> Result<(), WorkerError> {
        if self.slots.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        self.outputs.flush(Duration::from_secs(60))?;
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
        let mut tpl = TopicPartitionList::new();
        for (p, s) in &self.slots {
            tpl.add_partition_offset(&self.topic, *p, Offset::Offset(s.next.0))
                .map_err(KafkaIoError::client("building the offset list"))?;
        }
        // The group's offsets mirror the state; failing to commit them (e.g. during a
        // rebalance) loses nothing, because restarts read offsets from the state.
        if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
            warn!(error = %e, "offset commit to the consumer group failed; state is committed");
        }
        let pause_ms = started.elapsed().as_millis() as u64;
        let total = self.audit();
        self.publisher.publish(&self.report());
        info!(
            pause_ms,
            offsets = ?self.slots.iter().map(|(p, s)| (*p, s.next.0)).collect::<Vec<_>>(),
            consumed = total.consumed, folded = total.folded, too_late = total.too_late,
            dead_letter = total.dead_letter, duplicate = total.duplicate, panes = total.panes,
            "committed"
        );
        Ok(())
    }

    /// Sums the audit counters; an imbalance is a bug and is reported loudly.
    fn audit(&self) -> Counters {
        let mut total = Counters::default();
        for (p, s) in &self.slots {
            let c = s.task.counters();
            if !c.balanced() {
                tracing::error!(partition = p, ?c, "CONSERVATION AUDIT FAILED: consumed != folded + too_late + dead_letter + duplicate");
            }
            total.add(&c);
        }
        total
    }
}
