//! The sink's consume loop.
//!
//! The sink assigns itself every partition of the results topic (one sink per
//! results topic) and starts each at the offset stored in `sink_offsets`, which is
//! written in the same transaction as the rows — so a crash between insert and
//! commit replays exactly the uncommitted batch. The consumer group's offsets are
//! not used for resuming.
//!
//! A record that is not a valid result, or that the sink cannot store (`check`, or
//! PostgreSQL refusing its data), is rejected: logged with its coordinates and
//! reason, counted in `rejected`, kept in `sink_rejected` with its bytes, and its
//! offset is committed with the batch (a poison record must not stop billing).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tracing::{error, info, warn};

use super::apply::{applied_offsets, apply_batch, Batch, Delivered, Rejected};
use super::{check, connect, migrate, SinkError};
use crate::base::clock::now_ms;
use crate::base::error::{Refusal, RefusalKind};
use crate::base::shutdown;
use crate::config::Config;
use crate::engine::SinkRecord;
use crate::kafka::logging::Logged;
use crate::kafka::source::cached_watermarks;
use crate::kafka::{client_config, KafkaIoError};
use crate::metrics::exposition::{self, SinkFigures};
use crate::model::NextOffset;
use crate::model::Partition;
use crate::service::State;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SinkOptions {
    /// Exit once every partition reached the log end seen at start.
    pub until_end: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SinkSummary {
    pub records: u64,
    pub rows_changed: u64,
    pub stale_ignored: u64,
    pub rejected: u64,
}

impl std::fmt::Display for SinkSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "records: {}, rows_changed: {}, stale_ignored: {}, rejected: {}",
            self.records, self.rows_changed, self.stale_ignored, self.rejected
        )
    }
}

const MAX_BATCH: usize = 2_000;

/// Connects and applies the migrations (also `tally migrate`).
pub(crate) fn migrate_only(cfg: &Config) -> Result<usize, SinkError> {
    runtime()?.block_on(async {
        let mut client = connect(&cfg.sink.database_url).await?;
        migrate::run(&mut client).await
    })
}

pub fn run(cfg: &Config, opts: SinkOptions) -> Result<SinkSummary, SinkError> {
    runtime()?.block_on(run_async(cfg, opts))
}

fn runtime() -> Result<tokio::runtime::Runtime, SinkError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SinkError::Other(format!("starting the async runtime: {e}")))
}

async fn run_async(cfg: &Config, opts: SinkOptions) -> Result<SinkSummary, SinkError> {
    let topic = cfg.topics.results.as_str();
    let service = Arc::new(State::new(now_ms()));
    if let Some(addr) = &cfg.metrics.listen {
        crate::service::http::serve(addr, service.clone())
            .map_err(|e| SinkError::Other(format!("metrics.listen {addr}: {e}")))?;
    }
    service.set_not_ready("connecting to PostgreSQL");
    let budget = Duration::from_millis(cfg.sink.retry_budget.0.max(0) as u64);
    let (mut client, stored) =
        start_database(&cfg.sink.database_url, topic, budget, &service).await?;
    let consumer = results_consumer(cfg)?;
    let partitions = wait_for_partitions(&consumer, topic)?;
    let mut topology = check::Topology {
        results: partitions,
        input: input_partitions(&consumer, &cfg.topics.input),
    };
    let (tpl, mut next, ends) = assignment(&consumer, topic, partitions, &stored)?;
    consumer
        .assign(&tpl)
        .map_err(KafkaIoError::client("assigning the results topic"))?;
    // Bare numbers in the log (the newtypes' Debug would say `Partition(0)`).
    let resume: BTreeMap<i32, i64> = stored.iter().map(|(p, o)| (p.0, o.0)).collect();
    info!(topic, partitions, resume = %crate::logfmt::pairs(&resume), "sink started");
    service.set_ready();
    let mut summary = SinkSummary::default();
    let mut last_log = Instant::now();
    let mut last_publish = Instant::now();
    let mut last_apply_ms = None;
    loop {
        service.beat(now_ms());
        if last_publish.elapsed() >= Duration::from_millis(500) {
            service.set_metrics(exposition::sink(&SinkFigures {
                applied_records: summary.records,
                rows_changed: summary.rows_changed,
                rejected: summary.rejected,
                lag: next
                    .iter()
                    .filter_map(|(p, n)| {
                        let end = cached_watermarks(&consumer, topic, Partition(*p)).1?;
                        Some((*p, (end - n).max(0)))
                    })
                    .collect(),
                last_apply_ms,
            }));
            last_publish = Instant::now();
        }
        if shutdown::requested() || (opts.until_end && next.iter().all(|(p, n)| *n >= ends[p])) {
            break;
        }
        let batch = poll_batch(
            &consumer,
            topic,
            &mut topology,
            &cfg.topics.input,
            &mut summary,
            &mut next,
        );
        if batch.offsets.is_empty() {
            continue;
        }
        let a = apply_retrying(
            &mut client,
            &batch,
            budget,
            &cfg.sink.database_url,
            &service,
        )
        .await?;
        log_rejected(
            topic,
            batch.rejected.iter().chain(&a.rejected),
            &mut summary,
        );
        last_apply_ms = Some(now_ms());
        summary.rows_changed += a.rows_changed;
        summary.stale_ignored += a.stale_ignored;
        if last_log.elapsed() >= Duration::from_secs(5) {
            summary.log("sink progress");
            last_log = Instant::now();
        }
    }
    summary.log("sink stopped");
    Ok(summary)
}

/// The consumer of the results topic, in the sink's group, once the cluster answers.
fn results_consumer(cfg: &Config) -> Result<BaseConsumer<Logged>, SinkError> {
    let mut ccfg = client_config(
        &cfg.kafka,
        &[
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
            // Offsets come from sink_offsets; an out-of-range one is an error, never a jump.
            ("auto.offset.reset", "error"),
        ],
    );
    ccfg.set("group.id", &cfg.sink.group_id);
    let consumer: BaseConsumer<Logged> = ccfg
        .create_with_context(Logged)
        .map_err(KafkaIoError::client("creating the sink consumer"))?;
    crate::kafka::await_cluster(&consumer, &cfg.kafka, cfg.topics.results.as_str())?;
    Ok(consumer)
}

/// Every partition of the results topic from its `sink_offsets` row (or the log
/// start), refusing a row outside the log; with each partition's next offset and
/// the log end now.
#[allow(clippy::type_complexity)]
fn assignment(
    consumer: &BaseConsumer<Logged>,
    topic: &str,
    partitions: i32,
    stored: &BTreeMap<Partition, NextOffset>,
) -> Result<(TopicPartitionList, BTreeMap<i32, i64>, BTreeMap<i32, i64>), SinkError> {
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for p in 0..partitions {
        let start = stored.get(&Partition(p)).map(|o| o.0);
        tpl.add_partition_offset(topic, p, start.map_or(Offset::Beginning, Offset::Offset))
            .map_err(KafkaIoError::client("building the assignment"))?;
        let (low, high) = crate::kafka::watermarks(consumer, topic, p, Duration::from_secs(10))
            .map_err(KafkaIoError::client(format!(
                "reading the log range of {topic}/{p}"
            )))?;
        if let Some(s) = start {
            if s < low || s > high {
                return Err(SinkError::Refused(Refusal::new(RefusalKind::SinkOffsets, format!(
                    "sink_offsets says {topic}/{p} resumes at {s}, but the log holds offsets {low}..{high}: \
                     results were deleted before they were applied, or the topic was recreated. Refusing \
                     to skip silently; after checking, delete that row from sink_offsets to start over."
                ))));
            }
        }
        next.insert(p, start.unwrap_or(low));
        ends.insert(p, high);
    }
    Ok((tpl, next, ends))
}

/// Connects, migrates the schema and reads the applied offsets. PostgreSQL lost
/// meanwhile (a restart) is reconnected to and the steps run again, within
/// `budget` (`sink.retry_budget`), as a batch's apply is: migrations are
/// transactional and idempotent, and the offsets are read again.
async fn start_database(
    url: &str,
    topic: &str,
    budget: Duration,
    service: &State,
) -> Result<(tokio_postgres::Client, BTreeMap<Partition, NextOffset>), SinkError> {
    let until = Instant::now() + budget;
    loop {
        let mut client = reconnect(url, until, service).await?;
        let started = match migrate::run(&mut client).await {
            Ok(_) => applied_offsets(&client, topic).await,
            Err(e) => Err(e),
        };
        match started {
            Ok(stored) => return Ok((client, stored)),
            Err(SinkError::Postgres(e)) if transient(&e) && Instant::now() < until => {
                warn!(error = %e, "PostgreSQL lost while starting; reconnecting");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Applies `batch`, reconnecting and applying it again while PostgreSQL is lost,
/// within one `budget` for the batch, however often the reconnect succeeds and
/// the apply fails again.
async fn apply_retrying(
    client: &mut tokio_postgres::Client,
    batch: &Batch,
    budget: Duration,
    url: &str,
    service: &State,
) -> Result<super::apply::Applied, SinkError> {
    let mut deadline = None;
    loop {
        match apply_batch(client, batch).await {
            Ok(a) => return Ok(a),
            Err(SinkError::Postgres(e)) if transient(&e) => {
                warn!(error = %e, "PostgreSQL lost; reconnecting to apply the batch again");
                service.set_not_ready("reconnecting to PostgreSQL");
                let until = *deadline.get_or_insert_with(|| Instant::now() + budget);
                if Instant::now() >= until {
                    return Err(SinkError::Postgres(e));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                *client = reconnect(url, until, service).await?;
                info!(
                    records = batch.records.len(),
                    "reconnected to PostgreSQL; applying the batch again"
                );
                service.set_ready();
            }
            Err(e) => return Err(e),
        }
    }
}

/// Counts the rejected records, logging the first ten and then every 1000th: a
/// flood of bad records must not flood the log (each is in sink_rejected, and
/// counted).
fn log_rejected<'a>(
    topic: &str,
    rejected: impl Iterator<Item = &'a Rejected>,
    summary: &mut SinkSummary,
) {
    for r in rejected {
        summary.rejected += 1;
        if summary.rejected <= 10 || summary.rejected.is_multiple_of(1000) {
            error!(source = %format!("{topic}/{}/{}", r.partition, r.offset), reason = %r.reason,
                rejected = summary.rejected, "result record rejected: kept in sink_rejected, not applied");
        }
    }
}

/// The input topic's partition count, as a bound on progress records (`None`
/// when the sink cannot read its metadata: no bound, logged).
fn input_partitions(consumer: &BaseConsumer<Logged>, input: &str) -> Option<i32> {
    match crate::kafka::partition_count(consumer, input) {
        Ok(n) if n > 0 => i32::try_from(n).ok(),
        other => {
            warn!(topic = input, result = ?other.map_err(|e| e.to_string()),
                "cannot read the input topic's partition count; progress records are not checked against it");
            None
        }
    }
}

/// Polls up to `MAX_BATCH` records (waiting 100 ms for the first), checking each:
/// what the sink can store is to be applied, the rest rejected; every offset read
/// moves `next`. A progress record naming more input partitions than known reads
/// the count again first (partitions may have been added).
fn poll_batch(
    consumer: &BaseConsumer<Logged>,
    topic: &str,
    topology: &mut check::Topology,
    input: &str,
    summary: &mut SinkSummary,
    next: &mut BTreeMap<i32, i64>,
) -> Batch {
    let mut batch = Batch {
        topic: topic.to_string(),
        records: Vec::new(),
        rejected: Vec::new(),
        offsets: BTreeMap::new(),
    };
    let mut timeout = Duration::from_millis(100);
    while batch.records.len() + batch.rejected.len() < MAX_BATCH {
        let Some(msg) = consumer.poll(timeout) else {
            break;
        };
        timeout = Duration::ZERO;
        let m = match msg {
            Ok(m) => m,
            Err(e) => {
                error!(error = %e, "results consumer error");
                continue;
            }
        };
        summary.records += 1;
        let (p, o) = (m.partition(), m.offset());
        let payload = m.payload().unwrap_or_default();
        let parsed = SinkRecord::parse(payload).map_err(|e| format!("not a result record: {e}"));
        if let Ok(SinkRecord::Progress(pr)) = &parsed {
            if topology.input.is_some_and(|n| pr.source_partitions > n) {
                topology.input = input_partitions(consumer, input);
            }
        }
        let checked = parsed.and_then(|r| check::storable(&r, topology).map(|()| r));
        match checked {
            Ok(record) => batch.records.push(Delivered {
                record,
                results_partition: p,
                offset: o,
                payload: payload.to_vec(),
            }),
            Err(why) => batch
                .rejected
                .push(Rejected::new(p, o, &why, payload.to_vec())),
        }
        batch
            .offsets
            .insert((topic.to_string(), Partition(p)), NextOffset(o + 1));
        next.insert(p, o + 1);
    }
    batch
}

impl SinkSummary {
    fn log(&self, what: &str) {
        info!(
            records = self.records,
            rows_changed = self.rows_changed,
            stale_ignored = self.stale_ignored,
            rejected = self.rejected,
            "{what}"
        );
    }
}

/// A failure that a reconnect may cure: the connection closed or an I/O error
/// (refused, reset), or the server going away or not yet accepting (class 08,
/// 57P01–57P03). A TLS verification failure, a type error or any other SQLSTATE
/// is not: retrying would only delay the error.
fn transient(e: &tokio_postgres::Error) -> bool {
    if let Some(c) = e.code() {
        let c = c.code();
        return c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03");
    }
    e.is_closed()
        || std::error::Error::source(e)
            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
}

/// Connects, retrying transient failures with backoff (0.5 s doubling to 10 s)
/// until `deadline`; then the last error (exit 4). Beats `service` meanwhile: a
/// sink waiting for its database is alive.
async fn reconnect(
    url: &str,
    deadline: Instant,
    service: &State,
) -> Result<tokio_postgres::Client, SinkError> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(500);
    let mut attempts = 0u32;
    loop {
        service.beat(now_ms());
        match connect(url).await {
            Ok(client) => {
                if attempts > 0 {
                    info!(
                        attempts,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "reconnected to PostgreSQL"
                    );
                }
                return Ok(client);
            }
            Err(SinkError::Postgres(e))
                if transient(&e) && Instant::now() < deadline && !shutdown::requested() =>
            {
                attempts += 1;
                warn!(attempt = attempts, retry_in_ms = backoff.as_millis() as u64, error = %e, "PostgreSQL unavailable");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e),
        }
    }
}

fn wait_for_partitions(consumer: &BaseConsumer<Logged>, topic: &str) -> Result<i32, SinkError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = crate::kafka::partition_count(consumer, topic)?;
        if n > 0 {
            return Ok(n as i32);
        }
        if Instant::now() > deadline || shutdown::requested() {
            return Err(SinkError::Other(format!(
                "results topic {topic} does not exist (waited 60 s)"
            )));
        }
        info!(topic, "waiting for the results topic to exist");
        std::thread::sleep(Duration::from_secs(1));
    }
}
