//! The producers of a worker: results, late events and dead letters.
//!
//! Invariants: one idempotent producer (acks=all) for all three topics; a record
//! is only considered written when its delivery report succeeded. `flush` is the
//! barrier step of a commit: it waits for every report and fails if any delivery
//! since the previous flush failed — the caller must then not commit state or
//! offsets (the records will be produced again after restart, identically).

#![allow(unsafe_code)] // FFI: librdkafka's rd_kafka_flush and queue wake-ups; a pipe.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use super::config::{KafkaConfig, TopicsConfig};
use super::{client_config, headers, KafkaIoError, PRODUCER_DEFAULTS};
use crate::base::histogram::Histogram;
use crate::engine::{PaneKind, ResultRecord};
use crate::model::{DeadLetterReason, Partition};

/// Counts failed deliveries and keeps the first error; times acknowledgements of
/// the records sent with a `sent_at` opaque (0 = untimed).
pub(crate) struct DeliveryTracker {
    failed: AtomicU64,
    delivered: AtomicU64,
    first_error: Mutex<Option<String>>,
    epoch: Instant,
    /// Send → acknowledgement, in microseconds, of timed records.
    ack_us: Mutex<Histogram>,
}

impl Default for DeliveryTracker {
    fn default() -> Self {
        Self {
            failed: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            first_error: Mutex::new(None),
            epoch: Instant::now(),
            ack_us: Mutex::new(Histogram::default()),
        }
    }
}

/// The delivery opaque of a record that is not timed.
pub(crate) const UNTIMED: usize = 0;

impl DeliveryTracker {
    /// The delivery opaque that times a record sent now.
    pub(crate) fn sent_now(&self) -> usize {
        self.epoch.elapsed().as_micros() as usize + 1
    }

    /// Send → acknowledgement times (µs) of the timed records so far.
    pub(crate) fn ack_latency_us(&self) -> Histogram {
        self.ack_us.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// Failures since the last call, as an error naming the first one.
    pub(crate) fn take_failures(&self) -> Result<(), KafkaIoError> {
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

impl ClientContext for DeliveryTracker {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        super::logging::log(level, fac, msg);
    }
    fn error(&self, e: rdkafka::error::KafkaError, reason: &str) {
        super::logging::error(&e, reason);
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = usize;
    fn delivery(&self, result: &DeliveryResult<'_>, sent_at: usize) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                if sent_at != UNTIMED {
                    let us = self.epoch.elapsed().as_micros() as i64 - (sent_at as i64 - 1);
                    if let Ok(mut h) = self.ack_us.lock() {
                        h.record(us);
                    }
                }
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

/// The worker's producer. Delivery reports are served on a polling thread of its
/// own as they arrive (ack latencies are measured when they happen, and the record
/// loop never polls the producer). Not rdkafka's `ThreadedProducer`: its `flush`
/// polls in 100 ms steps while that thread takes the reports (a checkpoint pause
/// of up to 100 ms for nothing), and dropping it waits for a 100 ms poll to end.
pub struct Outputs {
    producer: Arc<BaseProducer<DeliveryTracker>>,
    /// Stops and joins the polling thread when the outputs are dropped.
    _poller: Poller,
    /// Whether on-time panes are timed (off for end-of-input panes).
    time_panes: std::cell::Cell<bool>,
    /// The key and payload of the result being sent (librdkafka copies them), reused.
    scratch: std::cell::RefCell<(String, Vec<u8>)>,
    results: String,
    late: String,
    dead_letter: String,
}

/// Where a record came from: `topic/partition/offset`.
pub(crate) fn source_coords(topic: &str, partition: Partition, offset: i64) -> String {
    format!("{topic}/{partition}/{offset}")
}

impl Outputs {
    pub fn new(kafka: &KafkaConfig, topics: &TopicsConfig) -> Result<Self, KafkaIoError> {
        let producer: Arc<BaseProducer<DeliveryTracker>> = Arc::new(
            client_config(kafka, PRODUCER_DEFAULTS)
                .create_with_context(DeliveryTracker::default())
                .map_err(KafkaIoError::client("creating the producer"))?,
        );
        Ok(Self {
            _poller: Poller::start(producer.clone()).map_err(|e| {
                KafkaIoError::Fatal(format!("starting the producer's polling thread: {e}"))
            })?,
            producer,
            time_panes: std::cell::Cell::new(true),
            scratch: Default::default(),
            results: topics.results.clone(),
            late: topics.late.clone(),
            dead_letter: topics.dead_letter.clone(),
        })
    }

    /// Sends a result; on-time panes are timed from here (the watermark passed
    /// their window end while processing the record just before) to their ack.
    pub fn result(&self, r: &ResultRecord) -> Result<(), KafkaIoError> {
        let mut scratch = self.scratch.borrow_mut();
        let (key, payload) = &mut *scratch;
        r.write_key(key);
        r.write_json(payload);
        let opaque = match r.pane {
            PaneKind::OnTime if self.time_panes.get() => self.producer.context().sent_now(),
            _ => UNTIMED,
        };
        self.send(
            BaseRecord::with_opaque_to(&self.results, opaque)
                .key(key.as_bytes())
                .payload(payload),
        )
    }

    /// Stops timing on-time panes: the ones that follow are not watermark-driven
    /// (end of input).
    pub(crate) fn stop_timing_panes(&self) {
        self.time_panes.set(false);
    }

    /// On-time pane latency (µs): watermark past the window end → acknowledged.
    pub(crate) fn pane_ack_latency_us(&self) -> Histogram {
        self.producer.context().ack_latency_us()
    }

    /// The partitions of the results topic, from the broker's metadata (0 if it
    /// does not exist).
    pub(crate) fn results_partitions(&self) -> Result<i32, KafkaIoError> {
        let md = self
            .producer
            .client()
            .fetch_metadata(Some(&self.results), Duration::from_secs(10))
            .map_err(KafkaIoError::client(format!(
                "metadata of {}",
                self.results
            )))?;
        Ok(md
            .topics()
            .iter()
            .find(|t| t.name() == self.results)
            .map_or(0, |t| t.partitions().len() as i32))
    }

    /// A progress record, to every partition of the results topic (after the
    /// panes it covers, which this producer sent before: order holds per partition).
    pub(crate) fn progress(&self, r: &crate::engine::ProgressRecord) -> Result<(), KafkaIoError> {
        let (key, payload) = (r.key(), r.to_json());
        for partition in 0..r.results_partitions {
            self.send(
                BaseRecord::with_opaque_to(&self.results, UNTIMED)
                    .partition(partition)
                    .key(key.as_bytes())
                    .payload(&payload),
            )?;
        }
        Ok(())
    }

    /// An adjustment from `reprocess-late`, keyed by its request id.
    pub(crate) fn adjustment(
        &self,
        a: &crate::engine::AdjustmentRecord,
    ) -> Result<(), KafkaIoError> {
        let payload = a.to_json();
        self.send(
            BaseRecord::with_opaque_to(&self.results, UNTIMED)
                .key(a.request_id.as_bytes())
                .payload(&payload),
        )
    }

    pub(crate) fn late(
        &self,
        key: Option<&[u8]>,
        payload: &[u8],
        window_end: i64,
        watermark: i64,
        source: &str,
        kafka_ts: Option<i64>,
    ) -> Result<(), KafkaIoError> {
        let (we, wm) = (window_end.to_string(), watermark.to_string());
        let ts = kafka_ts.map(|t| t.to_string());
        let mut h = OwnedHeaders::new()
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
        if let Some(ts) = &ts {
            h = h.insert(Header {
                key: headers::KAFKA_TIMESTAMP,
                value: Some(ts),
            });
        }
        self.send(with_key(
            BaseRecord::with_opaque_to(&self.late, UNTIMED)
                .payload(payload)
                .headers(h),
            key,
        ))
    }

    pub(crate) fn dead_letter(
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
            BaseRecord::with_opaque_to(&self.dead_letter, UNTIMED)
                .payload(payload)
                .headers(h),
            key,
        ))
    }

    /// Sends one record, waiting while the local queue is full (the polling thread
    /// drains it).
    // The closure's error is rdkafka's `(KafkaError, BaseRecord)`: its API, not ours.
    #[allow(clippy::result_large_err)]
    fn send(&self, record: Record<'_>) -> Result<(), KafkaIoError> {
        send_retrying(
            record,
            |r| self.producer.send(r),
            || std::thread::sleep(Duration::from_millis(5)),
        )
    }

    /// Waits until every record sent so far is acknowledged; fails if any was not.
    /// librdkafka's own flush: with delivery reports as events (rdkafka's mode) it
    /// waits on a condition variable until the polling thread has handled the last
    /// report, so it returns as soon as the records are acknowledged.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaIoError> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the client pointer is valid while `self.producer` lives; flush is
        // thread-safe in librdkafka.
        let err = unsafe { rd::rd_kafka_flush(self.producer.client().native_ptr(), ms) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(KafkaIoError::Client {
                context: "flushing the producer".into(),
                source: KafkaError::Flush(err.into()),
            });
        }
        self.producer.context().take_failures()
    }

    pub fn delivered(&self) -> u64 {
        self.producer.context().delivered.load(Ordering::Relaxed)
    }
}

/// Serves the producer's delivery reports until dropped, without spinning.
///
/// rdkafka's `poll(timeout)` hands librdkafka the time left in whole milliseconds,
/// so the last millisecond of every timeout is polled with 0, over and over: with
/// 10 ms polls this thread spun a tenth of its time (7 % of a Kafka run's CPU). It
/// now sleeps on a pipe librdkafka writes to when the main queue (delivery reports,
/// errors, logs) turns non-empty, and polls without waiting until the queue is empty.
struct Poller {
    stop: Arc<AtomicBool>,
    wake: std::os::fd::OwnedFd,
    handle: Option<JoinHandle<()>>,
}

/// A reference to the producer's main queue, owned by the poller thread.
struct MainQueue(*mut rd::rd_kafka_queue_t);

// SAFETY: librdkafka queues are thread-safe; the reference is used by one thread.
unsafe impl Send for MainQueue {}

impl MainQueue {
    fn len(&self) -> usize {
        // SAFETY: a live queue reference (destroyed only in drop).
        unsafe { rd::rd_kafka_queue_length(self.0) }
    }
}

impl Drop for MainQueue {
    fn drop(&mut self) {
        // SAFETY: stop writing to the pipe before it closes, then release our reference.
        unsafe {
            rd::rd_kafka_queue_io_event_enable(self.0, -1, std::ptr::null(), 0);
            rd::rd_kafka_queue_destroy(self.0);
        }
    }
}

impl Poller {
    /// The longest sleep between two looks at the queue (a safety net: the pipe
    /// wakes the thread when reports arrive).
    const NAP_MS: i32 = 10;

    fn start(producer: Arc<BaseProducer<DeliveryTracker>>) -> std::io::Result<Self> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: two fresh descriptors we own from here on.
        let (read, wake) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: a new reference to the client's main queue (released by `MainQueue`);
        // librdkafka writes one byte to `wake` when the queue turns non-empty.
        let queue = unsafe {
            let q = rd::rd_kafka_queue_get_main(producer.client().native_ptr());
            rd::rd_kafka_queue_io_event_enable(q, wake.as_raw_fd(), b"q".as_ptr().cast(), 1);
            MainQueue(q)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let handle = std::thread::Builder::new()
            .name("producer-poll".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    let mut buf = [0u8; 64];
                    while !stop.load(Ordering::Relaxed) {
                        while queue.len() > 0 {
                            producer.poll(Duration::ZERO);
                        }
                        let mut fd = libc::pollfd {
                            fd: read.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        };
                        // SAFETY: one valid pollfd; then draining our own non-blocking pipe.
                        unsafe {
                            libc::poll(&mut fd, 1, Self::NAP_MS);
                            while libc::read(read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                                > 0
                            {}
                        }
                    }
                    drop(queue);
                }
            })?;
        Ok(Self {
            stop,
            wake,
            handle: Some(handle),
        })
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        self.stop.store(true, Ordering::Relaxed);
        // SAFETY: one byte to our own pipe wakes the thread (a full pipe is awake anyway).
        unsafe {
            libc::write(self.wake.as_raw_fd(), b"s".as_ptr().cast(), 1);
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Sends one record, waiting (serving delivery reports) while the local queue is full.
#[allow(clippy::result_large_err)] // rdkafka's `(KafkaError, BaseRecord)` error
pub(crate) fn send<C: ProducerContext<DeliveryOpaque = usize>>(
    producer: &BaseProducer<C>,
    record: Record<'_>,
) -> Result<(), KafkaIoError> {
    send_retrying(
        record,
        |r| producer.send(r),
        || producer.poll(Duration::from_millis(20)),
    )
}

/// `try_send` until the local queue accepts the record, calling `wait` while it is full.
fn send_retrying<'a>(
    mut record: Record<'a>,
    try_send: impl Fn(Record<'a>) -> Result<(), (KafkaError, Record<'a>)>,
    wait: impl Fn(),
) -> Result<(), KafkaIoError> {
    loop {
        match try_send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                wait();
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

/// A record as the producers here send it: the opaque is a `sent_at` or `UNTIMED`.
pub(crate) type Record<'a> = BaseRecord<'a, [u8], [u8], usize>;

fn with_key<'a>(r: Record<'a>, key: Option<&'a [u8]>) -> Record<'a> {
    match key {
        Some(k) => r.key(k),
        None => r,
    }
}
