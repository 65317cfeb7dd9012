//! `tally reprocess-late`: the late-events topic → adjustments on the results topic.
//!
//! Reads every partition of the late topic from `--from` up to the end offsets
//! seen at start (or `--until` a time; `--follow` keeps going), adjusts each event
//! (`crate::reprocess`), produces adjustments keyed by `request_id` and dead letters
//! for what cannot be priced, then commits its position to its own consumer group
//! (`<kafka.group_id>-reprocess`) so `--from group` resumes there. Safe to kill and
//! rerun: adjustments are identical every time and the sink ignores copies.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::ConfigArg;
use crate::base::clock::now_ms;
use crate::base::error::{Refusal, RefusalKind};
use crate::base::shutdown;
use crate::engine::RecordIn;
use crate::kafka::logging::Logged;
use crate::kafka::outputs::{source_coords, Outputs};
use crate::kafka::{client_config, headers};
use crate::model::Partition;
use crate::progress::Progress;
use crate::reprocess::{Outcome, Reprocessor};
use crate::time::utc::parse_utc_ms;

#[derive(Args, Debug)]
pub struct ReprocessArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Where to start: `earliest`, `group` (this tool's committed position), or a
    /// UTC time (`2026-01-01T00:00:00Z`; needs a broker that resolves timestamps).
    #[arg(long, default_value = "earliest")]
    pub from: String,
    /// Where to stop: `end` (the end offsets seen at start) or a UTC time (by record timestamp).
    #[arg(long, default_value = "end")]
    pub until: String,
    /// Keep running after reaching the end.
    #[arg(long)]
    pub follow: bool,
}

#[derive(Debug, Default)]
struct Summary {
    read: u64,
    adjusted: u64,
    duplicates: u64,
    dead_letters: u64,
}

/// The value of the header `name` of `m`, if it has one.
fn header<'m>(
    m: &'m impl Message<Headers = rdkafka::message::BorrowedHeaders>,
    name: &str,
) -> Option<&'m [u8]> {
    m.headers()?.iter().find(|h| h.key == name)?.value
}

pub fn run(a: ReprocessArgs) -> anyhow::Result<()> {
    let cfg = a.config.load()?;
    let engine = cfg.engine()?;
    let topic = cfg.topics.late.clone();
    let group = format!("{}-reprocess", cfg.kafka.group_id);
    let consumer = late_consumer(&cfg.kafka, &group, &topic)?;
    let outputs = Outputs::new(&cfg.kafka, &cfg.topics)?;
    let partitions = crate::kafka::partition_count(&consumer, &topic)? as i32;
    anyhow::ensure!(partitions > 0, "late topic {topic} does not exist");
    let until_ms = match a.until.as_str() {
        "end" => None,
        t => Some(parse_utc_ms(t).map_err(|e| anyhow::anyhow!("--until: {e}"))?),
    };

    let (start, end) = offsets(&consumer, &topic, partitions, &a.from)?;
    let mut tpl = TopicPartitionList::new();
    for (p, o) in &start {
        tpl.add_partition_offset(&topic, *p, Offset::Offset(*o))?;
    }
    consumer.assign(&tpl)?;
    let service = serve(a.follow, &cfg.metrics)?;
    let total: i64 = end.iter().map(|(p, e)| (e - start[p]).max(0)).sum();
    let mut next = start.clone();
    let mut done: BTreeMap<i32, bool> = next.iter().map(|(p, n)| (*p, *n >= end[p])).collect();
    let mut summary = Summary::default();
    let mut reprocessor = Reprocessor::default();
    let progress = Progress::new("reprocess", u64::try_from(total).ok(), None);
    tracing::info!(topic, from = %a.from, records = total, "reprocessing late events");
    let retry_for = Duration::from_millis(cfg.kafka.connect_timeout.0.max(0) as u64);
    let mut failing_since: Option<Instant> = None;
    // --follow: the backlog metric, and the position committed as it goes (what a
    // restart with `--from group` resumes from), every FOLLOW_EVERY.
    let mut last_follow: Option<Instant> = None;
    while a.follow || !done.values().all(|d| *d) {
        if shutdown::requested() {
            break;
        }
        progress.show(summary.read, None, false);
        if a.follow && last_follow.is_none_or(|t| t.elapsed() >= FOLLOW_EVERY) {
            last_follow = Some(Instant::now());
            follow_round(&consumer, &outputs, &topic, &next, &summary, &service)?;
        }
        service.beat(crate::base::clock::now_ms());
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = match msg {
            Ok(m) => {
                failing_since = None;
                m
            }
            Err(e) => {
                consumer_error(e, &topic, &mut failing_since, retry_for, &cfg.kafka)?;
                continue;
            }
        };
        let (p, o) = (m.partition(), m.offset());
        if until_ms.is_some_and(|u| m.timestamp().to_millis().is_some_and(|t| t > u)) {
            done.insert(p, true);
            continue;
        }
        if !a.follow && o >= end[&p] {
            done.insert(p, true);
            continue;
        }
        summary.read += 1;
        crate::failpoint::hit("reprocess_record");
        apply(
            &m,
            &topic,
            &engine,
            &mut reprocessor,
            &outputs,
            &mut summary,
        )?;
        next.insert(p, o + 1);
        if !a.follow && o + 1 >= end[&p] {
            done.insert(p, true);
        }
    }
    finish(&consumer, &outputs, &topic, &group, &next)?;
    progress.show(summary.read, None, true);
    eprintln!(
        "reprocess-late: read {} | adjustments {} | duplicates skipped {} | dead letters {}",
        summary.read, summary.adjusted, summary.duplicates, summary.dead_letters
    );
    Ok(())
}

/// How often `--follow` publishes its backlog and commits its position.
const FOLLOW_EVERY: Duration = Duration::from_secs(5);

/// The consumer of the late topic, in this tool's own group, once the cluster
/// answers.
fn late_consumer(
    kafka: &crate::config::KafkaConfig,
    group: &str,
    topic: &str,
) -> anyhow::Result<BaseConsumer<Logged>> {
    let mut ccfg = client_config(
        kafka,
        &[
            ("enable.auto.commit", "false"),
            ("auto.offset.reset", "error"),
        ],
    );
    ccfg.set("group.id", group);
    let consumer: BaseConsumer<Logged> = ccfg
        .create_with_context(Logged)
        .context("creating the late-topic consumer")?;
    crate::kafka::await_cluster(&consumer, kafka, topic)?;
    Ok(consumer)
}

/// With `--follow`, a long-running service: the endpoints of `metrics.listen`.
fn serve(
    follow: bool,
    metrics: &crate::config::MetricsConfig,
) -> anyhow::Result<std::sync::Arc<crate::service::State>> {
    let service = std::sync::Arc::new(crate::service::State::new(crate::base::clock::now_ms()));
    if let (true, Some(addr)) = (follow, &metrics.listen) {
        crate::service::http::serve(addr, service.clone())
            .with_context(|| format!("metrics.listen {addr}"))?;
    }
    service.set_ready();
    Ok(service)
}

/// Each partition's start offset (by `--from`) and end offset (the log end now).
fn offsets(
    consumer: &BaseConsumer<Logged>,
    topic: &str,
    partitions: i32,
    from: &str,
) -> anyhow::Result<(BTreeMap<i32, i64>, BTreeMap<i32, i64>)> {
    let mut start: BTreeMap<i32, i64> = BTreeMap::new();
    let mut end: BTreeMap<i32, i64> = BTreeMap::new();
    let mut all = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) = crate::kafka::watermarks(consumer, topic, p, Duration::from_secs(10))?;
        start.insert(p, low);
        end.insert(p, high);
        all.add_partition(topic, p);
    }
    match from {
        "earliest" => {}
        "group" => {
            let committed = consumer.committed_offsets(all.clone(), Duration::from_secs(10))?;
            for e in committed.elements() {
                if let Offset::Offset(o) = e.offset() {
                    start.insert(e.partition(), o.max(start[&e.partition()]));
                }
            }
        }
        t => {
            let ms = parse_utc_ms(t).map_err(|e| anyhow::anyhow!("--from: {e}"))?;
            let mut q = TopicPartitionList::new();
            for p in 0..partitions {
                q.add_partition_offset(topic, p, Offset::Offset(ms))?;
            }
            let found = consumer.offsets_for_times(q, Duration::from_secs(10))?;
            // Brokers that cannot resolve timestamps (the dev broker) answer "end" for
            // every partition; so does a time after the last record. Either way there
            // is nothing to read, and committing the ends would make `--from group`
            // skip everything later: refuse instead.
            if found
                .elements()
                .iter()
                .all(|e| matches!(e.offset(), Offset::End | Offset::Invalid))
            {
                anyhow::bail!(
                    "no partition of {topic} has records at or after {t}, or the broker cannot resolve \
                     timestamps (the dev broker cannot); nothing was read or committed. Use --from earliest or group."
                );
            }
            for e in found.elements() {
                match e.offset() {
                    Offset::Offset(o) if o >= 0 => {
                        start.insert(e.partition(), o);
                    }
                    Offset::End => {
                        start.insert(e.partition(), end[&e.partition()]);
                    }
                    other => anyhow::bail!(
                        "the broker could not resolve {t} on {topic}/{} ({other:?}); use --from earliest or group \
                         (the dev broker does not support timestamp lookups)",
                        e.partition()
                    ),
                }
            }
        }
    }
    Ok((start, end))
}

/// A consumer error: a refusal, a failure, or (`Ok`) a broker error to retry.
fn consumer_error(
    e: KafkaError,
    topic: &str,
    failing_since: &mut Option<Instant>,
    retry_for: Duration,
    kafka: &crate::config::KafkaConfig,
) -> anyhow::Result<()> {
    match e {
        // A position outside the log (`auto.offset.reset=error`): late records
        // were deleted before they were billed. Never skip them silently.
        KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset) => {
            Err(crate::worker::WorkerError::Refused(Refusal::new(
                RefusalKind::LogTruncated,
                format!(
                    "a position on {topic} is outside the log: late records were deleted by \
                     retention before reprocess-late read them, and were not billed. Nothing past \
                     them was committed; after checking, --from earliest bills what remains"
                ),
            ))
            .into())
        }
        // Broker-level errors: librdkafka reconnects; give up after
        // kafka.connect_timeout of nothing but errors (exit 4). Any other
        // consumer error (a corrupt batch librdkafka skipped past) is fatal:
        // continuing would commit past late records never billed.
        e if crate::kafka::is_broker_transient(&e) => {
            let since = *failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= retry_for {
                return Err(crate::kafka::KafkaIoError::Unreachable {
                    bootstrap: kafka.bootstrap_servers.clone(),
                    waited_s: retry_for.as_secs(),
                    last: crate::kafka::logging::last_error().unwrap_or_else(|| e.to_string()),
                }
                .into());
            }
            tracing::warn!(error = %e, "late-topic consumer error; retrying");
            Ok(())
        }
        e => Err(anyhow::Error::new(e).context("reading the late topic")),
    }
}

/// One late record → an adjustment, a duplicate skipped, or a dead letter.
fn apply(
    m: &rdkafka::message::BorrowedMessage<'_>,
    topic: &str,
    engine: &crate::engine::EngineConfig,
    reprocessor: &mut Reprocessor,
    outputs: &Outputs,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let (p, o) = (m.partition(), m.offset());
    let payload = m.payload().unwrap_or_default();
    let late_coords = source_coords(topic, Partition(p), o);
    let source = header(m, headers::SOURCE).map_or_else(
        || late_coords.clone(),
        |v| String::from_utf8_lossy(v).into_owned(),
    );
    // The original record's timestamp, not the time tally routed it here.
    let original_ts = header(m, headers::KAFKA_TIMESTAMP)
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
    let rec = RecordIn {
        payload,
        kafka_ts: original_ts.or(m.timestamp().to_millis()),
        now_ms: now_ms(),
    };
    match reprocessor.process(engine, rec, &source) {
        Outcome::Adjusted(adj) => {
            summary.adjusted += 1;
            outputs.adjustment(&adj)?;
        }
        Outcome::Duplicate => summary.duplicates += 1,
        Outcome::DeadLetter(reason) => {
            summary.dead_letters += 1;
            outputs.dead_letter(m.key(), payload, &reason, &late_coords)?;
        }
    }
    Ok(())
}

/// Flushes the adjustments and then, only once every one is acknowledged, commits
/// how far the run got.
fn finish(
    consumer: &BaseConsumer<Logged>,
    outputs: &Outputs,
    topic: &str,
    group: &str,
    next: &BTreeMap<i32, i64>,
) -> anyhow::Result<()> {
    outputs
        .flush(Duration::from_secs(60))
        .context("flushing adjustments")?;
    // Only after every adjustment is acknowledged: remember how far we got.
    let mut pos = TopicPartitionList::new();
    for (p, n) in next {
        pos.add_partition_offset(topic, *p, Offset::Offset(*n))?;
    }
    if let Err(e) = consumer.commit(&pos, CommitMode::Sync) {
        tracing::warn!(error = %e, "could not record the position in group {group}");
    }
    Ok(())
}

/// One `--follow` round: every adjustment so far acknowledged, the position
/// committed, and the backlog (late-topic end − position) published.
fn follow_round(
    consumer: &BaseConsumer<Logged>,
    outputs: &Outputs,
    topic: &str,
    next: &BTreeMap<i32, i64>,
    summary: &Summary,
    service: &crate::service::State,
) -> anyhow::Result<()> {
    outputs
        .flush(Duration::from_secs(60))
        .context("flushing adjustments")?;
    let mut pos = TopicPartitionList::new();
    let mut backlog = Vec::with_capacity(next.len());
    for (p, n) in next {
        pos.add_partition_offset(topic, *p, Offset::Offset(*n))?;
        match crate::kafka::watermarks(consumer, topic, *p, Duration::from_secs(10)) {
            Ok((_, high)) => backlog.push((*p, (high - n).max(0))),
            Err(e) => tracing::warn!(error = %e, partition = p, "cannot read the late topic's end"),
        }
    }
    if let Err(e) = consumer.commit(&pos, CommitMode::Sync) {
        tracing::warn!(error = %e, "could not record the reprocess position");
    }
    service.set_metrics(crate::metrics::exposition::reprocess(
        &crate::metrics::exposition::ReprocessFigures {
            backlog,
            adjusted: summary.adjusted,
            duplicates: summary.duplicates,
            dead_letters: summary.dead_letters,
        },
    ));
    Ok(())
}
