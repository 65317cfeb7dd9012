//! The Kafka worker's `Outputs`: the worker's producer (`kafka::outputs`) —
//! results and progress records to the results topic, too-late records and dead
//! letters to theirs, each carrying its source as `topic/partition/offset` — and
//! its flush, which waits for every delivery report (60 s at most).

use std::time::Duration;

use tracing::warn;

use crate::config::{KafkaConfig, TopicsConfig};
use crate::engine::{ProgressRecord, ResultRecord};
use crate::kafka::outputs::{source_coords, Outputs as Producer};
use crate::kafka::KafkaIoError;
use crate::model::DeadLetterReason;
use crate::worker::partitions::{Outputs, Record};
use crate::worker::WorkerError;

/// How long a flush waits for the delivery reports.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct KafkaOutputs {
    producer: Producer,
    /// The input topic, the `topic` of each record's source.
    topic: String,
}

impl KafkaOutputs {
    pub(crate) fn new(kafka: &KafkaConfig, topics: &TopicsConfig) -> Result<Self, KafkaIoError> {
        Ok(Self {
            producer: Producer::new(kafka, topics)?,
            topic: topics.input.clone(),
        })
    }

    pub(crate) fn producer(&self) -> &Producer {
        &self.producer
    }
}

impl Outputs for KafkaOutputs {
    fn result(&mut self, r: &ResultRecord) -> Result<(), WorkerError> {
        Ok(self.producer.result(r)?)
    }

    fn progress(&mut self, r: &ProgressRecord) -> Result<(), WorkerError> {
        Ok(self.producer.progress(r)?)
    }

    fn late(&mut self, r: &Record<'_>, window_end: i64, watermark: i64) -> Result<(), WorkerError> {
        let src = source_coords(&self.topic, r.partition, r.offset);
        let (key, payload, ts) = (r.key, r.payload, r.kafka_ts);
        Ok(self
            .producer
            .late(key, payload, window_end, watermark, &src, ts)?)
    }

    fn dead_letter(
        &mut self,
        r: &Record<'_>,
        reason: &DeadLetterReason,
        nth: u64,
    ) -> Result<(), WorkerError> {
        let src = source_coords(&self.topic, r.partition, r.offset);
        // The first dead letters of a partition are logged one by one, then every
        // 1000th: a flood of poison must not flood the log.
        if nth <= 10 || nth.is_multiple_of(1000) {
            warn!(source = %src, reason = %reason, dead_letters = nth, "dead letter");
        }
        Ok(self.producer.dead_letter(r.key, r.payload, reason, &src)?)
    }

    fn flush(&mut self) -> Result<(), WorkerError> {
        Ok(self.producer.flush(FLUSH_TIMEOUT)?)
    }
}
