//! The input consumer's side of a rebalance and of the log: the facts a restore
//! decides on, gathered from the consumer (`gather_facts`: each partition's log
//! range and the group's committed offsets, `LogFacts`), the checkpoint's offsets
//! committed to the group (`GroupCommitter`), and the log range librdkafka last saw
//! (`cached_*`). The rebalance callback that hands the facts to the worker is
//! `worker::rebalance`.

#![allow(unsafe_code)] // FFI: librdkafka's cached watermarks.

use std::ffi::CString;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tracing::warn;

use crate::checkpoint::coordinator::OffsetCommitter;
use crate::checkpoint::restore::LogFacts;
use crate::checkpoint::CheckpointId;
use crate::model::NextOffset;
use crate::model::Partition;

/// Options for partitions without any checkpoint: the restore decision's own
/// (`checkpoint::restore`), named here too for the commands that pass them in.
pub(crate) use crate::checkpoint::restore::StartPolicy;

/// A checkpoint's offsets to the consumer group, with `tally-checkpoint=<id>` as
/// commit metadata. A failed commit (e.g. during a rebalance) is logged and loses
/// nothing: restores read offsets from the checkpoint store.
pub(crate) struct GroupCommitter<'a, C: ConsumerContext> {
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
pub(crate) fn gather_facts<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: &[Partition],
) -> Result<Vec<LogFacts>, super::KafkaIoError> {
    let timeout = Duration::from_secs(10);
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, p.0);
    }
    let committed =
        consumer
            .committed_offsets(tpl, timeout)
            .map_err(super::KafkaIoError::client(format!(
                "reading the committed offsets of {topic}"
            )))?;
    partitions
        .iter()
        .map(|p| {
            let (log_start, log_end) = crate::kafka::watermarks(consumer, topic, p.0, timeout)
                .map_err(super::KafkaIoError::client(format!(
                    "reading the log range of {topic}/{p}"
                )))?;
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

/// The log start of `topic`/`partition` as librdkafka last saw it in a fetch
/// response (no network round trip); `None` before the first fetch.
pub(crate) fn cached_log_start<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: Partition,
) -> Option<i64> {
    cached_watermarks(consumer, topic, partition).0
}

/// The log end (high watermark) of `topic`/`partition` as librdkafka last saw it
/// in a fetch response (no network round trip); `None` before the first fetch.
pub(crate) fn cached_log_end<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: Partition,
) -> Option<i64> {
    cached_watermarks(consumer, topic, partition).1
}

/// The log start and end of `topic`/`partition` from librdkafka's cache (the
/// last fetch response), for any consumer.
pub(crate) fn cached_watermarks<C: ConsumerContext>(
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
