//! The rebalance callback: the input consumer's context, which hands each
//! assignment to the worker, so restores and hand-over checkpoints happen *inside*
//! the rebalance — before Kafka gives the partitions to anyone else.
//!
//! It is the only code that talks to the consumer during a rebalance: for an
//! assignment it first gathers the facts a restore decides on
//! (`kafka::source::gather_facts`), then hands them to `RebalanceHandler::on_assign`
//! (restore, or refuse), which returns each partition's start offset. Revoked
//! partitions are checkpointed through `on_revoke`; both get a `GroupCommitter` for
//! the checkpoint's offsets. Refusals and failures are recorded as a fatal error,
//! typed with its class (`WorkerError`: a refusal exits 3; Kafka or the checkpoint
//! store unavailable 4; a poisoned lock 1), that the worker loop returns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tracing::{error, info, warn};

use super::WorkerError;
use crate::base::error::Bug;
use crate::checkpoint::coordinator::OffsetCommitter;
use crate::checkpoint::restore::LogFacts;
use crate::kafka::source::{gather_facts, GroupCommitter};
use crate::kafka::KafkaIoError;
use crate::model::NextOffset;
use crate::model::Partition;

/// The worker side of a rebalance: it never sees the consumer.
pub(crate) trait RebalanceHandler: Send {
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

/// `f`, with a panic turned into a `Bug`: the callback runs inside librdkafka's
/// poll (an `extern "C"` frame), where a panic would abort the process, skipping
/// the exit status of a bug (1) and the flush of the logs.
fn caught<T>(doing: &str, f: impl FnOnce() -> Result<T, WorkerError>) -> Result<T, WorkerError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(Bug(format!("a panic while handling {doing}")).into()))
}

pub(crate) struct SourceContext {
    handler: Arc<Mutex<dyn RebalanceHandler>>,
    fatal: Mutex<Option<WorkerError>>,
    /// Whether `fatal` holds one: read after every poll (one load, no lock).
    failed: AtomicBool,
}

pub(crate) type Source = BaseConsumer<SourceContext>;

impl SourceContext {
    pub(crate) fn new(handler: Arc<Mutex<dyn RebalanceHandler>>) -> Self {
        Self {
            handler,
            fatal: Mutex::new(None),
            failed: AtomicBool::new(false),
        }
    }

    pub(crate) fn take_fatal(&self) -> Option<WorkerError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.fatal.lock().ok().and_then(|mut f| f.take())
    }

    fn fail(&self, e: WorkerError) {
        error!("{e}");
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(e);
        }
        self.failed.store(true, Ordering::Release);
    }
}

impl ClientContext for SourceContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        crate::kafka::logging::log(level, fac, msg);
    }
    fn error(&self, e: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::logging::error(&e, reason);
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
            self.fail(Bug::poisoned("worker state").into());
            // Nothing is restored or checkpointed without the worker; revoked
            // partitions are still let go, or the consumer's close waits for ever.
            if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS {
                let _ = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
            }
            return;
        };
        let result: KafkaResult<()> = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut committer = GroupCommitter::new(consumer, &topic);
                let assigned = caught("an assignment", || {
                    crate::failpoint::hit("rebalance_assign");
                    let facts = gather_facts(consumer, &topic, &partitions)?;
                    handler.on_assign(&mut committer, &facts)
                });
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
                if let Err(e) = caught("a revocation", || {
                    crate::failpoint::hit("rebalance_revoke");
                    handler.on_revoke(&mut committer, &partitions)
                }) {
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
            self.fail(KafkaIoError::client("applying the assignment")(e).into());
        }
    }
}
