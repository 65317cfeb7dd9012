//! Reading a whole topic up to its current end: the demo, tests and tools use it
//! to look at what tally produced.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::config::KafkaConfig;
use super::{client_config, KafkaIoError};

/// One record as stored on a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl StoredRecord {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every record of `topic` from the log start to the end offsets seen now, in
/// partition then offset order.
pub fn read_topic(kafka: &KafkaConfig, topic: &str) -> Result<Vec<StoredRecord>, KafkaIoError> {
    let mut c = client_config(kafka, &[("enable.auto.commit", "false")]);
    c.set("group.id", "tally-reader");
    let consumer: BaseConsumer<super::logging::Logged> = c
        .create_with_context(super::logging::Logged)
        .map_err(KafkaIoError::client("creating a reader"))?;
    let partitions = super::partition_count(&consumer, topic)? as i32;
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0i64;
    let mut ends = Vec::new();
    for p in 0..partitions {
        let (low, high) = crate::kafka::watermarks(&consumer, topic, p, Duration::from_secs(10))
            .map_err(KafkaIoError::client(format!("log range of {topic}/{p}")))?;
        remaining += high - low;
        ends.push(high);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(KafkaIoError::client("assignment"))?;
    }
    consumer
        .assign(&tpl)
        .map_err(KafkaIoError::client("assigning"))?;
    let mut out = Vec::with_capacity(remaining.max(0) as usize);
    let deadline = Instant::now() + Duration::from_secs(120);
    while remaining > 0 {
        if Instant::now() > deadline {
            return Err(KafkaIoError::Fatal(format!(
                "timed out reading {topic}: {remaining} records missing"
            )));
        }
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = msg.map_err(KafkaIoError::client(format!("reading {topic}")))?;
        if m.offset() >= ends[m.partition() as usize] {
            continue;
        }
        remaining -= 1;
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| {
                        (
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(StoredRecord {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().unwrap_or_default().to_vec(),
            headers,
        });
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}
