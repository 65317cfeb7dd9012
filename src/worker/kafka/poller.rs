//! The Kafka worker's poll thread: it polls the input consumer, copies each chunk
//! of records out of librdkafka and puts it through step 1 of the rules
//! (`engine::Prepared`: parse, validate, price, fingerprint) while the worker loop
//! applies the chunk before it. On two cores the consume and the parse run beside
//! the windows and the producers, as in the file mode (`worker::file::reader`).
//!
//! Invariants:
//! - This thread is the only one that polls the consumer while it runs, so the
//!   rebalance callback runs here, between two polls, and never while a chunk is
//!   half built. The callback locks the worker's state (`kafka::worker::Worker`), as the loop does
//!   to apply a chunk: a revoke's checkpoint sees exactly the chunks applied
//!   before it. Chunks still queued then are not in that checkpoint; their
//!   records are read again by whoever owns the partition next.
//! - A chunk holds runs: records of one partition in increasing offsets, polled
//!   under one assignment epoch (`Shared::epoch`, raised by every assignment). The
//!   loop applies a run only if its partition is still assigned under the epoch
//!   it was polled in or an earlier one (`worker::partitions`): a run polled
//!   before a partition was revoked and assigned again is dropped, because the
//!   new assignment fetches from the checkpoint, and applying the old run after
//!   it could make a false gap in the offsets.
//! - Chunks arrive in poll order, at most `QUEUE` waiting: memory stays bounded
//!   whatever the relative speeds.
//! - A fetch position outside the log (`auto.offset.reset=error`) ends a chunk,
//!   which says so (`out_of_range`), after the records polled before it.
//! - A poll that finds nothing ends a chunk with the consumer's positions
//!   (`Positions`) when they moved since last sent: read after the poll, they are
//!   past every record this thread has put in a chunk — and past the transaction
//!   markers librdkafka consumed without handing them over, which no record shows
//!   (`Partitions::pass`).
//! - Each run carries its partition's log start, and each `Positions` the log
//!   starts of its partitions, as librdkafka's cache held them after the poll
//!   (`cached_log_start`, no round trip): the offsets a run skips are classified
//!   against them (`checkpoint::ledger::classify`), so applying a run makes no
//!   call into librdkafka.
//! - Step 1 runs under the engine configuration current when the chunk was
//!   polled (`Polled::cfg`); the loop applies a chunk prepared under another one
//!   (a price reload came between) by running step 1 again itself.
//! - The thread ends when asked (`Poller::stop`, which joins it) or when the loop
//!   stops receiving.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::Offset;
use tracing::warn;

use crate::base::clock;
use crate::engine::{EngineConfig, Prepared, RecordIn};
use crate::kafka::source::cached_log_start;
use crate::model::Partition;
use crate::worker::rebalance::Source;
use crate::worker::WorkerError;

/// Records per chunk: one hand-over per chunk, small enough to stay in cache.
const CHUNK: usize = 512;

/// Chunks polled ahead of the loop.
const QUEUE: usize = 2;

/// How long one poll waits for the first record of a chunk: also how long a stop
/// request can wait for the thread (rdkafka's poll cannot be interrupted).
const POLL_WAIT: Duration = Duration::from_millis(10);

/// One record's place in a run: its offset, Kafka timestamp, and where its key
/// and payload are in `Run::bytes`.
#[derive(Debug, Clone)]
struct Meta {
    offset: i64,
    kafka_ts: Option<i64>,
    key: Option<Range<usize>>,
    payload: Range<usize>,
}

/// Consecutive records of one partition, in increasing offsets, polled under one
/// assignment epoch, and through step 1.
#[derive(Debug)]
pub(crate) struct Run {
    pub partition: Partition,
    /// The assignment epoch (`Shared::epoch`) when the records were polled.
    pub epoch: u64,
    /// The partition's log start as librdkafka had seen it when the run was
    /// polled (read on this thread: applying the run makes no call into it).
    pub log_start: Option<i64>,
    bytes: Vec<u8>,
    records: Vec<Meta>,
    pub prepared: Prepared,
}

impl Run {
    fn new(partition: Partition, epoch: u64) -> Self {
        Self {
            partition,
            epoch,
            log_start: None,
            bytes: Vec::new(),
            records: Vec::new(),
            prepared: Prepared::default(),
        }
    }

    /// Whether a record at `offset` of `partition` continues this run (same
    /// partition and epoch, a later offset).
    fn continues(&self, partition: Partition, offset: i64, epoch: u64) -> bool {
        self.partition == partition
            && self.epoch == epoch
            && self.records.last().is_some_and(|r| r.offset < offset)
    }

    fn push(&mut self, r: Polled1<'_>) {
        let mut keep = |b: &[u8]| {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(b);
            start..self.bytes.len()
        };
        let key = r.key.map(&mut keep);
        let payload = keep(r.payload);
        self.records.push(Meta {
            offset: r.offset,
            kafka_ts: r.kafka_ts,
            key,
            payload,
        });
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn offset(&self, i: usize) -> i64 {
        self.records[i].offset
    }

    pub(crate) fn kafka_ts(&self, i: usize) -> Option<i64> {
        self.records[i].kafka_ts
    }

    pub fn key(&self, i: usize) -> Option<&[u8]> {
        self.records[i].key.clone().map(|k| &self.bytes[k])
    }

    pub(crate) fn payload(&self, i: usize) -> &[u8] {
        &self.bytes[self.records[i].payload.clone()]
    }

    /// The `i`-th record as the engine reads it, ingested at `now_ms`.
    pub(crate) fn record_in(&self, i: usize, now_ms: i64) -> RecordIn<'_> {
        RecordIn {
            payload: self.payload(i),
            kafka_ts: self.kafka_ts(i),
            now_ms,
        }
    }

    #[cfg(test)]
    /// The records with offsets in `[from, to)`: a range, offsets being increasing.
    pub(crate) fn within(&self, from: i64, to: i64) -> Range<usize> {
        crate::worker::partitions::within(self, from, to)
    }
}

impl crate::worker::partitions::Run for Run {
    fn partition(&self) -> Partition {
        self.partition
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn log_start(&self) -> Option<i64> {
        self.log_start
    }

    fn len(&self) -> usize {
        self.records.len()
    }

    fn offset(&self, i: usize) -> i64 {
        self.records[i].offset
    }

    fn prepared(&self) -> &Prepared {
        &self.prepared
    }

    fn record_in(&self, i: usize, now_ms: i64) -> RecordIn<'_> {
        Run::record_in(self, i, now_ms)
    }

    fn record(&self, i: usize) -> crate::worker::partitions::Record<'_> {
        crate::worker::partitions::Record {
            partition: self.partition,
            offset: self.offset(i),
            key: self.key(i),
            payload: self.payload(i),
            kafka_ts: self.kafka_ts(i),
            true_len: None,
        }
    }
}

/// One polled record, as the chunk copies it.
#[derive(Debug, Clone, Copy)]
struct Polled1<'a> {
    partition: Partition,
    offset: i64,
    kafka_ts: Option<i64>,
    key: Option<&'a [u8]>,
    payload: &'a [u8],
}

impl<'a> Polled1<'a> {
    fn of(m: &'a BorrowedMessage<'_>) -> Self {
        Self {
            partition: Partition(m.partition()),
            offset: m.offset(),
            kafka_ts: m.timestamp().to_millis(),
            key: m.key(),
            payload: m.payload().unwrap_or_default(),
        }
    }
}

/// Appends `r`, polled under `epoch`, to the last run or a new one.
fn append(runs: &mut Vec<Run>, r: Polled1<'_>, epoch: u64) {
    match runs.last_mut() {
        Some(run) if run.continues(r.partition, r.offset, epoch) => run.push(r),
        _ => {
            let mut run = Run::new(r.partition, epoch);
            run.push(r);
            runs.push(run);
        }
    }
}

/// Step 1 of every record of `runs`, ingested at `now_ms`, under `cfg`.
fn prepare(runs: &mut [Run], cfg: &EngineConfig, now_ms: i64) {
    for run in runs {
        let mut prepared = std::mem::take(&mut run.prepared);
        for i in 0..run.len() {
            prepared.push(cfg, run.record_in(i, now_ms));
        }
        run.prepared = prepared;
    }
}

/// One chunk of polled records.
#[derive(Debug)]
pub(crate) struct Polled {
    pub runs: Vec<Run>,
    /// Wall clock when the chunk was polled: every record's ingest time.
    pub now_ms: i64,
    /// The engine configuration step 1 ran under.
    pub cfg: Arc<EngineConfig>,
    /// librdkafka reported a fetch position outside the log after these records.
    pub out_of_range: bool,
    /// The consumer's positions after these records, when it had nothing more to
    /// hand over and they moved since the last chunk that carried them.
    pub positions: Option<Positions>,
    /// A rebalance callback inside the last poll failed (typed, with its class):
    /// the worker stops on it at once (nothing after the last checkpoint is
    /// committed; a restart replays it). The poll thread ends after handing it
    /// over.
    pub fatal: Option<WorkerError>,
}

/// The consumer's positions (librdkafka's: the offset after the last record or
/// control record it consumed, per assigned partition), read after a poll that
/// found nothing: every record before them is in this chunk or an earlier one.
#[derive(Debug, Clone)]
pub(crate) struct Positions {
    /// The assignment epoch (`Shared::epoch`) when they were read.
    pub epoch: u64,
    pub at: Vec<(Partition, i64)>,
    /// Each partition's log start as librdkafka had seen it then (as `at`).
    pub log_starts: Vec<Option<i64>>,
}

impl Positions {
    /// The same positions under the same epoch (the log starts aside).
    fn same(&self, other: &Self) -> bool {
        self.epoch == other.epoch && self.at == other.at
    }
}

/// The positions of the assigned partitions that librdkafka knows.
fn positions(consumer: &Source, topic: &str, epoch: u64) -> Option<Positions> {
    let tpl = consumer.position().ok()?;
    let at: Vec<(Partition, i64)> = tpl
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((Partition(e.partition()), o)),
            _ => None,
        })
        .collect();
    let log_starts = at
        .iter()
        .map(|(p, _)| cached_log_start(consumer, topic, *p))
        .collect();
    Some(Positions {
        epoch,
        at,
        log_starts,
    })
}

/// What the loop shares with the poll thread.
#[derive(Clone)]
pub(crate) struct Shared {
    pub consumer: Arc<Source>,
    /// The input topic.
    pub topic: String,
    /// The engine configuration step 1 runs under (replaced by a price reload).
    pub engine: Arc<Mutex<Arc<EngineConfig>>>,
    /// Raised by every assignment (`kafka::worker`), read after each poll.
    pub epoch: Arc<AtomicU64>,
}

/// The poll thread, seen from the loop.
pub(crate) struct Poller {
    rx: Option<Receiver<Polled>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The poll thread ended on its own (it panicked).
#[derive(Debug)]
pub(crate) struct Gone;

impl Poller {
    pub(crate) fn start(shared: Shared) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("poll".into())
            .spawn(move || poll_loop(&shared, &tx, &stopping))?;
        Ok(Self {
            rx: Some(rx),
            stop,
            thread: Some(thread),
        })
    }

    /// The next chunk, or `None` if none came within `wait` (the input is quiet).
    pub(crate) fn next(&self, wait: Duration) -> Result<Option<Polled>, Gone> {
        let Some(rx) = &self.rx else {
            return Err(Gone);
        };
        match rx.recv_timeout(wait) {
            Ok(p) => Ok(Some(p)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(Gone),
        }
    }

    /// Stops the thread and waits for it: no poll (and no rebalance callback)
    /// runs after this returns. Chunks not yet received are dropped.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A thread waiting for room in the queue wakes with an error.
        self.rx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop();
    }
}

fn poll_loop(shared: &Shared, tx: &SyncSender<Polled>, stop: &AtomicBool) {
    let consumer = &*shared.consumer;
    let mut sent_positions: Option<Positions> = None;
    while !stop.load(Ordering::Relaxed) {
        let mut runs: Vec<Run> = Vec::new();
        let (mut n, mut wait, mut out_of_range, mut idle) = (0, POLL_WAIT, false, false);
        let mut fatal = None;
        while n < CHUNK {
            let event = consumer.poll(wait);
            // A rebalance callback runs inside poll; a failure it recorded goes
            // down the channel in order with the records.
            fatal = consumer.context().take_fatal();
            if fatal.is_some() {
                break;
            }
            match event {
                Some(Ok(m)) => {
                    // Read after the poll: a rebalance callback runs inside poll.
                    let epoch = shared.epoch.load(Ordering::Acquire);
                    append(&mut runs, Polled1::of(&m), epoch);
                    n += 1;
                }
                Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                    out_of_range = true;
                    break;
                }
                Some(Err(e)) => {
                    warn!(error = %e, "consumer error");
                    break;
                }
                None => {
                    idle = true;
                    break;
                }
            }
            wait = Duration::ZERO;
        }
        let positions = idle
            .then(|| {
                positions(
                    consumer,
                    &shared.topic,
                    shared.epoch.load(Ordering::Acquire),
                )
            })
            .flatten()
            .filter(|p| !sent_positions.as_ref().is_some_and(|s| s.same(p)));
        if runs.is_empty() && !out_of_range && positions.is_none() && fatal.is_none() {
            continue;
        }
        if positions.is_some() {
            sent_positions.clone_from(&positions);
        }
        let cfg = match shared.engine.lock() {
            Ok(cfg) => cfg.clone(),
            Err(_) => return,
        };
        let now_ms = clock::wall_ms();
        for run in &mut runs {
            run.log_start = cached_log_start(consumer, &shared.topic, run.partition);
        }
        prepare(&mut runs, &cfg, now_ms);
        let polled = Polled {
            runs,
            now_ms,
            cfg,
            out_of_range,
            positions,
            fatal,
        };
        let last = polled.fatal.is_some();
        if tx.send(polled).is_err() || last {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
