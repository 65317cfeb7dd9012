//! The producers of a worker: results, late events and dead letters.
//!
//! Invariants: one idempotent producer (acks=all) for all three topics; a record
//! is only considered written when its delivery report succeeded. `flush` is the
//! barrier step of a commit: it waits for every report and fails if any delivery
//! since the previous flush failed — the caller must then not commit state or
//! offsets (the records will be produced again after restart, identically).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use super::{client_config, headers, KafkaIoError, PRODUCER_DEFAULTS};
use crate::config::{KafkaConfig, TopicsConfig};
use crate::engine::ResultRecord;
use crate::model::DeadLetterReason;

/// Counts failed deliveries and keeps the first error.
#[derive(Default)]
pub struct DeliveryTracker {
    failed: AtomicU64,
    delivered: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl DeliveryTracker {
    /// Failures since the last call, as an error naming the first one.
    pub fn take_failures(&self) -> Result<(), KafkaIoError> {
        let failed = self.failed.swap(0, Ordering::Relaxed);
        if failed > 0 {
            let first = self
                .first_error
                .lock()
                .ok()
                .and_then(|mut f| f.take())
                .unwrap_or_default();
            return Err(KafkaIoError::Fatal(format!(
                "{failed} record(s) were not delivered; first error: {first}"
            )));
        }
        Ok(())
    }
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
}

pub struct Outputs {
    producer: BaseProducer<DeliveryTracker>,
    results: String,
    late: String,
    dead_letter: String,
}

/// Where a record came from: `topic/partition/offset`.
pub fn source_coords(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}/{partition}/{offset}")
}

impl Outputs {
    pub fn new(kafka: &KafkaConfig, topics: &TopicsConfig) -> Result<Self, KafkaIoError> {
        let producer = client_config(kafka, PRODUCER_DEFAULTS)
            .create_with_context(DeliveryTracker::default())
            .map_err(KafkaIoError::client("creating the producer"))?;
        Ok(Self {
            producer,
            results: topics.results.clone(),
            late: topics.late.clone(),
            dead_letter: topics.dead_letter.clone(),
        })
    }

    pub fn result(&self, r: &ResultRecord) -> Result<(), KafkaIoError> {
        let key = r.key();
        let payload = r.to_json();
        self.send(
            BaseRecord::to(&self.results)
                .key(key.as_bytes())
                .payload(&payload),
        )
    }

    /// An adjustment from `reprocess-late`, keyed by its request id.
    pub fn adjustment(&self, a: &crate::engine::AdjustmentRecord) -> Result<(), KafkaIoError> {
        let payload = a.to_json();
        self.send(
            BaseRecord::to(&self.results)
                .key(a.request_id.as_bytes())
                .payload(&payload),
        )
    }

    pub fn late(
        &self,
        key: Option<&[u8]>,
        payload: &[u8],
        window_end: i64,
        watermark: i64,
        source: &str,
    ) -> Result<(), KafkaIoError> {
        let (we, wm) = (window_end.to_string(), watermark.to_string());
        let h = OwnedHeaders::new()
            .insert(Header {
                key: headers::REASON,
                value: Some("too_late"),
            })
            .insert(Header {
                key: headers::WINDOW_END,
                value: Some(&we),
            })
            .insert(Header {
                key: headers::WATERMARK,
                value: Some(&wm),
            })
            .insert(Header {
                key: headers::SOURCE,
                value: Some(source),
            });
        self.send(with_key(
            BaseRecord::to(&self.late).payload(payload).headers(h),
            key,
        ))
    }

    pub fn dead_letter(
        &self,
        key: Option<&[u8]>,
        payload: &[u8],
        reason: &DeadLetterReason,
        source: &str,
    ) -> Result<(), KafkaIoError> {
        let detail = reason.to_string();
        let h = OwnedHeaders::new()
            .insert(Header {
                key: headers::ERROR,
                value: Some(reason.code()),
            })
            .insert(Header {
                key: headers::ERROR_DETAIL,
                value: Some(&detail),
            })
            .insert(Header {
                key: headers::SOURCE,
                value: Some(source),
            });
        self.send(with_key(
            BaseRecord::to(&self.dead_letter)
                .payload(payload)
                .headers(h),
            key,
        ))
    }

    fn send(&self, record: BaseRecord<'_, [u8], [u8]>) -> Result<(), KafkaIoError> {
        send(&self.producer, record)
    }

    /// Serves delivery reports without blocking.
    pub fn poll(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Waits until every record sent so far is acknowledged; fails if any was not.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaIoError> {
        self.producer
            .flush(timeout)
            .map_err(KafkaIoError::client("flushing the producer"))?;
        self.producer.context().take_failures()
    }

    pub fn delivered(&self) -> u64 {
        self.producer.context().delivered.load(Ordering::Relaxed)
    }
}

/// Sends one record, waiting (serving delivery reports) while the local queue is full.
pub fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) -> Result<(), KafkaIoError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(20));
            }
            Err((e, r)) => {
                return Err(KafkaIoError::Client {
                    context: format!("producing to {}", r.topic),
                    source: e,
                })
            }
        }
    }
}

fn with_key<'a>(
    r: BaseRecord<'a, [u8], [u8]>,
    key: Option<&'a [u8]>,
) -> BaseRecord<'a, [u8], [u8]> {
    match key {
        Some(k) => r.key(k),
        None => r,
    }
}
