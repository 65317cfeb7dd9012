//! The input source: a consumer-group member whose rebalance callback hands the
//! assignment to the worker, so restores and hand-over checkpoints happen *inside*
//! the rebalance — before Kafka gives the partitions to anyone else.
//!
//! This adapter is the only code that talks to the consumer during a rebalance:
//! for an assignment it first gathers the facts a restore decides on — each
//! partition's log range and the group's committed offsets (`LogFacts`) — then
//! hands them to `RebalanceHandler::on_assign` (restore, or refuse), which returns
//! each partition's start offset. Revoked partitions are checkpointed through
//! `on_revoke`; both get a `GroupCommitter` for the checkpoint's offsets. Refusals
//! and failures are recorded as a fatal error, with its class (`WorkerError`: a
//! refusal exits 3, an unavailable checkpoint store 4), that the worker loop
//! returns.

#![allow(unsafe_code)] // FFI: librdkafka's cached watermarks.

use std::ffi::CString;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tracing::{error, info, warn};

use crate::checkpoint::coordinator::OffsetCommitter;
use crate::checkpoint::restore::LogFacts;
use crate::checkpoint::CheckpointId;
use crate::model::Partition;
use crate::state::NextOffset;
use crate::worker::WorkerError;

/// Options for partitions without any checkpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartPolicy {
    /// Ignore checkpoints and committed offsets of assigned partitions and rebuild
    /// them from the log start.
    pub reset_state_earliest: bool,
    /// Accept offsets deleted by retention before tally read them (a log start
    /// above a partition's next offset): skip them, log, count and checkpoint the
    /// gap (see `checkpoint::ledger`). Without it such a gap is refused.
    pub allow_truncated_log: bool,
    /// Start a partition that has no checkpoint at its log start when the log no
    /// longer begins at 0: the one-time choice of a new consumer group, recorded
    /// as the gap `0..log start` in the checkpoint. It accepts no later gap.
    pub start_at_log_start: bool,
}

/// The worker side of a rebalance: it never sees the consumer.
pub trait RebalanceHandler: Send {
    /// Restores the assigned partitions (`facts`, one each) and returns each one's
    /// start offset; `Err` refuses or fails.
    fn on_assign(
        &mut self,
        committer: &mut dyn OffsetCommitter,
        facts: &[LogFacts],
    ) -> Result<Vec<(Partition, NextOffset)>, WorkerError>;
    /// Checkpoints and releases `partitions`.
    fn on_revoke(
        &mut self,
        committer: &mut dyn OffsetCommitter,
        partitions: &[Partition],
    ) -> Result<(), WorkerError>;
}

/// A checkpoint's offsets to the consumer group, with `tally-checkpoint=<id>` as
/// commit metadata. A failed commit (e.g. during a rebalance) is logged and loses
/// nothing: restores read offsets from the checkpoint store.
pub struct GroupCommitter<'a, C: ConsumerContext> {
    consumer: &'a BaseConsumer<C>,
    topic: &'a str,
}

impl<'a, C: ConsumerContext> GroupCommitter<'a, C> {
    pub fn new(consumer: &'a BaseConsumer<C>, topic: &'a str) -> Self {
        Self { consumer, topic }
    }
}

impl<C: ConsumerContext> OffsetCommitter for GroupCommitter<'_, C> {
    fn commit(&mut self, id: CheckpointId, offsets: &[(Partition, NextOffset)]) {
        let mut tpl = TopicPartitionList::new();
        for (p, next) in offsets {
            if let Err(e) = tpl.add_partition_offset(self.topic, p.0, Offset::Offset(next.0)) {
                warn!(checkpoint = id.0, error = %e, "offset commit failed; the checkpoint is complete");
                return;
            }
        }
        for mut elem in tpl.elements_for_topic(self.topic) {
            elem.set_metadata(format!("tally-checkpoint={}", id.0));
        }
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
            warn!(checkpoint = id.0, error = %e, "offset commit failed; the checkpoint is complete");
        }
    }
}

/// The facts of an assignment: each partition's log range and committed offset.
fn gather_facts<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: &[Partition],
) -> Result<Vec<LogFacts>, String> {
    let timeout = Duration::from_secs(10);
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, p.0);
    }
    let committed = consumer
        .committed_offsets(tpl, timeout)
        .map_err(|e| format!("reading the committed offsets of {topic}: {e}"))?;
    partitions
        .iter()
        .map(|p| {
            let (log_start, log_end) = consumer
                .fetch_watermarks(topic, p.0, timeout)
                .map_err(|e| format!("reading the log range of {topic}/{p}: {e}"))?;
            let committed = match committed.find_partition(topic, p.0).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            };
            Ok(LogFacts {
                partition: *p,
                log_start,
                log_end,
                committed,
            })
        })
        .collect()
}

pub struct SourceContext {
    handler: Arc<Mutex<dyn RebalanceHandler>>,
    fatal: Mutex<Option<WorkerError>>,
}

pub type Source = BaseConsumer<SourceContext>;

impl SourceContext {
    pub fn new(handler: Arc<Mutex<dyn RebalanceHandler>>) -> Self {
        Self {
            handler,
            fatal: Mutex::new(None),
        }
    }

    pub fn take_fatal(&self) -> Option<WorkerError> {
        self.fatal.lock().ok().and_then(|mut f| f.take())
    }

    fn fail(&self, e: WorkerError) {
        error!("{e}");
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(e);
        }
    }
}

impl ClientContext for SourceContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        super::logging::log(level, fac, msg);
    }
    fn error(&self, e: rdkafka::error::KafkaError, reason: &str) {
        super::logging::error(&e, reason);
    }
}

impl ConsumerContext for SourceContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let partitions: Vec<Partition> = tpl
            .elements()
            .iter()
            .map(|e| Partition(e.partition()))
            .collect();
        let topic = tpl
            .elements()
            .first()
            .map(|e| e.topic().to_string())
            .unwrap_or_default();
        let Ok(mut handler) = self.handler.lock() else {
            self.fail(WorkerError::Refused("worker state lock poisoned".into()));
            return;
        };
        let result: KafkaResult<()> = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut committer = GroupCommitter::new(consumer, &topic);
                let assigned = gather_facts(consumer, &topic, &partitions)
                    .map_err(WorkerError::Refused)
                    .and_then(|facts| handler.on_assign(&mut committer, &facts));
                match assigned {
                    Ok(starts) => {
                        for (p, start) in &starts {
                            let _ = tpl.set_partition_offset(&topic, p.0, Offset::Offset(start.0));
                        }
                        let at = crate::logfmt::pairs(starts.iter().map(|(p, o)| (p.0, o.0)));
                        info!(partitions = %at, "assigned");
                        if cooperative {
                            consumer.incremental_assign(tpl)
                        } else {
                            consumer.assign(tpl)
                        }
                    }
                    Err(e) => {
                        self.fail(e);
                        Ok(())
                    }
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let at: Vec<i32> = partitions.iter().map(|p| p.0).collect();
                info!(partitions = %crate::logfmt::list(&at), "revoked");
                let mut committer = GroupCommitter::new(consumer, &topic);
                if let Err(e) = handler.on_revoke(&mut committer, &partitions) {
                    self.fail(e);
                }
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                warn!(error = %rdkafka::types::RDKafkaErrorCode::from(other), "rebalance error");
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            self.fail(WorkerError::Refused(format!(
                "applying the assignment: {e}"
            )));
        }
    }
}

/// The log start of `topic`/`partition` as librdkafka last saw it in a fetch
/// response (no network round trip); `None` before the first fetch.
pub fn cached_log_start(consumer: &Source, topic: &str, partition: Partition) -> Option<i64> {
    cached_watermarks(consumer, topic, partition).0
}

/// The log end (high watermark) of `topic`/`partition` as librdkafka last saw it
/// in a fetch response (no network round trip); `None` before the first fetch.
pub fn cached_log_end(consumer: &Source, topic: &str, partition: Partition) -> Option<i64> {
    cached_watermarks(consumer, topic, partition).1
}

/// The log start and end of `topic`/`partition` from librdkafka's cache (the
/// last fetch response), for any consumer.
pub fn cached_watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: Partition,
) -> (Option<i64>, Option<i64>) {
    let Ok(topic) = CString::new(topic) else {
        return (None, None);
    };
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: a live client handle, a NUL-terminated topic name, and two valid
    // out-pointers; the call only reads librdkafka's cached partition state.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition.0,
            &mut low,
            &mut high,
        )
    };
    if err != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return (None, None);
    }
    ((low >= 0).then_some(low), (high >= 0).then_some(high))
}
