//! The input source: a consumer-group member whose partitions start where the
//! worker's state says, never where the group's committed offsets say.
//!
//! Rules applied when Kafka assigns a partition (inside the rebalance callback):
//! - state has the partition → start at its `next_offset` (the state and the
//!   outputs up to there are consistent; offsets in the group are only a mirror);
//! - no state, and the group has a committed offset → refuse (a fresh start would
//!   double-bill or under-bill), unless the operator passed `--reset-state earliest`;
//! - no state → start at the log start, and refuse if the log start is not 0 (the
//!   broker deleted records: a replay would bill a partial history), unless allowed.
//!
//! Refusals are recorded as a fatal error that the worker loop reports and exits on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tracing::{error, info, warn};

use crate::state::StateStore;

/// What happened to the assignment, for the worker loop to act on after `poll`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    /// Partitions with the offset they start at and the log end seen at assignment.
    Assigned(Vec<(i32, i64, i64)>),
    Revoked(Vec<i32>),
}

/// Options for partitions without state.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartPolicy {
    /// Ignore committed offsets of partitions that have no state and rebuild them
    /// from the log start.
    pub reset_state_earliest: bool,
    /// Accept a log start above 0 (records deleted by retention).
    pub allow_truncated_log: bool,
}

pub struct SourceContext {
    store: Arc<StateStore>,
    policy: StartPolicy,
    events: Mutex<Vec<RebalanceEvent>>,
    fatal: Mutex<Option<String>>,
}

pub type Source = BaseConsumer<SourceContext>;

impl SourceContext {
    pub fn new(store: Arc<StateStore>, policy: StartPolicy) -> Self {
        Self {
            store,
            policy,
            events: Mutex::new(Vec::new()),
            fatal: Mutex::new(None),
        }
    }

    pub fn take_events(&self) -> Vec<RebalanceEvent> {
        self.events
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }

    pub fn take_fatal(&self) -> Option<String> {
        self.fatal.lock().ok().and_then(|mut f| f.take())
    }

    fn push(&self, e: RebalanceEvent) {
        if let Ok(mut events) = self.events.lock() {
            events.push(e);
        }
    }

    fn fail(&self, msg: String) {
        error!("{msg}");
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(msg);
        }
    }

    /// Decides the start offset of every assigned partition; `Err` is a refusal.
    fn start_offsets(
        &self,
        consumer: &Source,
        tpl: &mut TopicPartitionList,
    ) -> Result<Vec<(i32, i64, i64)>, String> {
        let timeout = Duration::from_secs(10);
        let committed = consumer
            .committed_offsets(tpl.clone(), timeout)
            .map_err(|e| format!("reading committed offsets: {e}"))?;
        let mut starts = Vec::new();
        let assigned: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect();
        for (topic, p) in assigned {
            let (low, high) = consumer
                .fetch_watermarks(&topic, p, timeout)
                .map_err(|e| format!("reading the log range of {topic}/{p}: {e}"))?;
            let meta = self.store.meta(p).map_err(|e| e.to_string())?;
            let start = match meta {
                Some(m) => m.next_offset.0,
                None => {
                    let group_offset = committed.find_partition(&topic, p).map(|e| e.offset());
                    if let Some(Offset::Offset(o)) = group_offset {
                        if !self.policy.reset_state_earliest {
                            return Err(format!(
                                "partition {topic}/{p} has committed offset {o} in the consumer group but no \
                                 state in the state directory. Starting from empty state would under-bill \
                                 (and restarting from offset 0 without it would double-bill a sink without \
                                 version checks). Restore the state directory, or rebuild this partition \
                                 from the log start with `tally run --reset-state earliest`."
                            ));
                        }
                        warn!(
                            partition = p,
                            committed = o,
                            "no state; rebuilding from the log start as requested"
                        );
                    }
                    if low > 0 && !self.policy.allow_truncated_log {
                        return Err(format!(
                            "partition {topic}/{p} has no state and its log starts at offset {low}, not 0: \
                             the broker already deleted records, so a replay would bill a partial history. \
                             Restore the state directory, or accept the gap with `--allow-truncated-log`."
                        ));
                    }
                    low
                }
            };
            if start > high {
                return Err(format!(
                    "partition {topic}/{p}: state resumes at offset {start} but the log ends at {high}: \
                     the topic was recreated or the broker lost data. Refusing to guess; point state.dir \
                     at a fresh directory to rebuild from this topic, or restore the topic."
                ));
            }
            if start < low {
                return Err(format!(
                    "partition {topic}/{p}: state resumes at offset {start} but the log now starts at {low}; \
                     records in between were deleted by the broker before tally read them"
                ));
            }
            tpl.set_partition_offset(&topic, p, Offset::Offset(start))
                .map_err(|e| e.to_string())?;
            starts.push((p, start, high));
        }
        Ok(starts)
    }
}

impl ClientContext for SourceContext {}

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
        let result: KafkaResult<()> = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                match self.start_offsets(consumer, tpl) {
                    Ok(starts) => {
                        info!(partitions = ?starts.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(), "assigned");
                        self.push(RebalanceEvent::Assigned(starts));
                        if cooperative {
                            consumer.incremental_assign(tpl)
                        } else {
                            consumer.assign(tpl)
                        }
                    }
                    Err(msg) => {
                        self.fail(msg);
                        Ok(())
                    }
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let revoked: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                info!(partitions = ?revoked, "revoked");
                self.push(RebalanceEvent::Revoked(revoked));
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                warn!(error = ?other, "rebalance error");
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            self.fail(format!("applying the assignment: {e}"));
        }
    }
}
