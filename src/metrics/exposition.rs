//! Prometheus exposition of what a process reports, through the
//! `prometheus-client` encoder (text format 0.0.4). Pure: a snapshot in, text out.
//!
//! Conventions (Prometheus's): base units — seconds, bytes; a timestamp is
//! `_timestamp_seconds` since the Unix epoch; counters end in `_total` (the
//! encoder appends it); distributions are histograms with fixed bounds
//! (`BOUNDS_MS`), so they can be summed across workers, not per-process
//! quantiles. Every family is in `EXPORTED`; docs/reference/metrics.md explains
//! each and lists the names they replace.
//!
//! Each family has one home: the worker's report renders everything but the
//! consumer lag, which `consumer_lag` renders alone when `/metrics` is scraped
//! (`worker::lag`), after the report's text.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::{PartitionReport, WorkerReport};
use crate::base::histogram::Histogram;
use crate::model::Partition;

/// Every metric family tally exports, as Prometheus shows it.
pub const EXPORTED: &[&str] = &[
    "tally_build_info",
    // worker
    "tally_partition_watermark_timestamp_seconds",
    "tally_partition_watermark_lag_seconds",
    "tally_job_watermark_timestamp_seconds",
    "tally_job_watermark_lag_seconds",
    "tally_job_watermark_partition",
    "tally_watermark_bound_seconds",
    "tally_allowed_lateness_seconds",
    "tally_records_total",
    "tally_panes_total",
    "tally_open_windows",
    "tally_spilled_windows",
    "tally_dedup_ids",
    "tally_dedup_cold_ids_total",
    "tally_dedup_cold_reads_total",
    "tally_idle_advances_total",
    "tally_watermark_held_total",
    "tally_offsets_gap_total",
    "tally_offsets_empty_total",
    "tally_event_delay_seconds",
    "tally_event_disorder_seconds",
    "tally_pane_ack_latency_seconds",
    "tally_audit_balanced",
    "tally_consumer_lag_records",
    "tally_finality_lag_seconds",
    "tally_checkpoints_total",
    "tally_checkpoint_last_success_timestamp_seconds",
    "tally_checkpoint_last_duration_seconds",
    "tally_checkpoint_last_bytes",
    "tally_checkpoint_state_bytes",
    "tally_checkpoint_interval_seconds",
    // sink
    "tally_sink_applied_records_total",
    "tally_sink_rows_changed_total",
    "tally_sink_rejected_records_total",
    "tally_sink_lag_records",
    "tally_sink_last_apply_timestamp_seconds",
    // reprocess-late --follow
    "tally_reprocess_backlog_records",
    "tally_reprocess_records_total",
];

/// Upper bounds of the delay, disorder and latency histograms, ms.
pub(crate) const BOUNDS_MS: [u64; 16] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000,
    3_600_000,
];

/// The Prometheus text of a worker's report.
pub(crate) fn worker(report: &WorkerReport) -> String {
    render(Box::new(Worker(report.clone())))
}

/// The consumer lag family alone (no `tally_build_info`): each owned input
/// partition's log end minus the worker's position, in records, as
/// `worker::lag` computes it when scraped.
pub(crate) fn consumer_lag(lags: &[(Partition, i64)]) -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(ConsumerLag(lags.to_vec())));
    encode(&reg)
}

/// What the sink reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct SinkFigures {
    pub applied_records: u64,
    pub rows_changed: u64,
    /// Result records rejected (not storable; kept in `sink_rejected`).
    pub rejected: u64,
    /// (partition, results-topic log end minus the sink's next offset)
    pub lag: Vec<(i32, i64)>,
    pub last_apply_ms: Option<i64>,
}

/// The Prometheus text of the sink's figures.
pub(crate) fn sink(figures: &SinkFigures) -> String {
    render(Box::new(Sink(figures.clone())))
}

/// What `reprocess-late --follow` reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReprocessFigures {
    /// (partition, late-topic log end minus the next offset to reprocess): late
    /// records not billed yet.
    pub backlog: Vec<(i32, i64)>,
    pub adjusted: u64,
    pub duplicates: u64,
    pub dead_letters: u64,
}

/// The Prometheus text of the reprocessing's figures.
pub(crate) fn reprocess(figures: &ReprocessFigures) -> String {
    render(Box::new(Reprocess(figures.clone())))
}

/// Only `tally_build_info` (processes with nothing else to report yet).
pub(crate) fn build_info_only() -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(BuildInfo));
    encode(&reg)
}

fn render(collector: Box<dyn Collector>) -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(BuildInfo));
    reg.register_collector(collector);
    encode(&reg)
}

fn encode(reg: &Registry) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut s, reg);
    s
}

type Labels = Vec<(&'static str, String)>;

fn partition(p: &PartitionReport) -> Labels {
    vec![("partition", p.partition.to_string())]
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (Labels, f64)>,
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in samples {
        m.encode_family(&labels)?.encode_gauge(&v)?;
    }
    Ok(())
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: f64,
) -> fmt::Result {
    e.encode_descriptor(name, help, unit, MetricType::Gauge)?
        .encode_gauge(&v)
}

fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in samples {
        m.encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, f64>(&v, None)?;
    }
    Ok(())
}

/// `h` (values in ms, or µs with `per_ms` = 1000) as a histogram in seconds.
fn histograms<'a>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    per_ms: u64,
    samples: impl IntoIterator<Item = (Labels, &'a Histogram)>,
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    let bounds: Vec<u64> = BOUNDS_MS.iter().map(|b| b * per_ms).collect();
    for (labels, h) in samples {
        let buckets: Vec<(f64, u64)> = h
            .counts_by_bound(&bounds)
            .into_iter()
            .zip(BOUNDS_MS)
            .map(|(n, b)| (secs(b as i64), n))
            .collect();
        let sum = h.sum() as f64 / (1000 * per_ms) as f64;
        m.encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(sum, h.count(), &buckets, None)?;
    }
    Ok(())
}

#[derive(Debug)]
struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let labels: Labels = vec![
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("librdkafka", rdkafka::util::get_rdkafka_version().1),
            ("rocksdb", crate::state::ROCKSDB_VERSION.to_string()),
        ];
        gauges(
            &mut e,
            "tally_build_info",
            "The build: tally, librdkafka and RocksDB versions.",
            None,
            [(labels, 1.0)],
        )
    }
}

#[derive(Debug)]
struct Worker(WorkerReport);

impl Collector for Worker {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let r = &self.0;
        watermarks(&mut e, r)?;
        records(&mut e, r)?;
        state(&mut e, r)?;
        checkpoints(&mut e, r)
    }
}

/// The watermarks and their bounds.
fn watermarks(e: &mut DescriptorEncoder, r: &WorkerReport) -> fmt::Result {
    let ps = &r.partitions;
    let with_wm = || ps.iter().filter_map(|p| p.watermark.map(|w| (p, w.0)));
    gauges(
        e,
        "tally_partition_watermark_timestamp",
        "Partition watermark (event time).",
        Some(&Unit::Seconds),
        with_wm().map(|(p, w)| (partition(p), secs(w))),
    )?;
    gauges(
        e,
        "tally_partition_watermark_lag",
        "Wall clock minus the partition watermark.",
        Some(&Unit::Seconds),
        with_wm().map(|(p, w)| (partition(p), secs(r.at_ms - w))),
    )?;
    if let Some((w, p)) = r.job_watermark() {
        gauge(
            e,
            "tally_job_watermark_timestamp",
            "Minimum watermark over active partitions.",
            Some(&Unit::Seconds),
            secs(w.0),
        )?;
        gauge(
            e,
            "tally_job_watermark_lag",
            "Wall clock minus the job watermark.",
            Some(&Unit::Seconds),
            secs(r.at_ms - w.0),
        )?;
        gauge(
            e,
            "tally_job_watermark_partition",
            "Partition holding the job watermark.",
            None,
            f64::from(p.0),
        )?;
    }
    gauge(
        e,
        "tally_watermark_bound",
        "watermark.max_out_of_orderness.",
        Some(&Unit::Seconds),
        secs(r.bound_ms),
    )?;
    gauge(
        e,
        "tally_allowed_lateness",
        "window.allowed_lateness.",
        Some(&Unit::Seconds),
        secs(r.allowed_lateness_ms),
    )?;
    Ok(())
}

/// Records by route, panes, and the per-partition counters.
fn records(e: &mut DescriptorEncoder, r: &WorkerReport) -> fmt::Result {
    let ps = &r.partitions;
    counters(
        e,
        "tally_records",
        "Input records by route (consumed = folded + too_late + dead_letter + duplicate).",
        ps.iter().flat_map(|p| {
            let c = &p.counters;
            [
                ("consumed", c.consumed),
                ("folded", c.folded),
                ("too_late", c.too_late),
                ("dead_letter", c.dead_letter),
                ("duplicate", c.duplicate),
            ]
            .map(|(route, n)| {
                let mut l = partition(p);
                l.push(("route", route.to_string()));
                (l, n)
            })
        }),
    )?;
    let per = |f: fn(&PartitionReport) -> u64| ps.iter().map(move |p| (partition(p), f(p)));
    counters(
        e,
        "tally_panes",
        "Result panes emitted.",
        per(|p| p.counters.panes),
    )?;
    counters(
        e,
        "tally_idle_advances",
        "Watermark advances forced by idleness.",
        per(|p| p.idle_advances),
    )?;
    counters(
        e,
        "tally_watermark_held",
        "Records further ahead of their partition than watermark.max_lead: billed, but they did not move the watermark.",
        per(|p| p.held),
    )?;
    counters(
        e,
        "tally_dedup_cold_ids",
        "Dedup ids moved out of memory to the state store under state.memory_budget.",
        per(|p| p.dedup_cold_ids),
    )?;
    counters(
        e,
        "tally_dedup_cold_reads",
        "State-store reads for dedup ids out of memory (their filter said maybe).",
        per(|p| p.dedup_cold_reads),
    )?;
    counters(
        e,
        "tally_offsets_gap",
        "Offsets deleted before tally read them, accepted with --allow-truncated-log or --start-at-log-start (never billed).",
        per(|p| p.offsets.gap_offsets),
    )?;
    counters(
        e,
        "tally_offsets_empty",
        "Offsets without a record: transaction markers, aborted or compacted records.",
        per(|p| p.offsets.empty_offsets),
    )?;
    Ok(())
}

/// What each partition holds, the delays and the audit.
fn state(e: &mut DescriptorEncoder, r: &WorkerReport) -> fmt::Result {
    let ps = &r.partitions;
    let as_f = |f: fn(&PartitionReport) -> u64| ps.iter().map(move |p| (partition(p), f(p) as f64));
    gauges(
        e,
        "tally_open_windows",
        "Windows held in state.",
        None,
        as_f(|p| p.open_windows as u64),
    )?;
    gauges(
        e,
        "tally_spilled_windows",
        "Of the open windows, those held only in RocksDB (memory budget).",
        None,
        as_f(|p| p.spilled_windows as u64),
    )?;
    gauges(
        e,
        "tally_dedup_ids",
        "Request ids remembered for dedup.",
        None,
        as_f(|p| p.dedup_ids as u64),
    )?;
    gauges(
        e,
        "tally_finality_lag",
        "Wall clock minus the end of the partition's last final window (its progress, DESIGN §6.1).",
        Some(&Unit::Seconds),
        ps.iter().filter_map(|p| {
            p.final_through
                .map(|f| (partition(p), (r.at_ms - f).max(0) as f64 / 1000.0))
        }),
    )?;
    histograms(
        e,
        "tally_event_delay",
        "Wall clock at ingest minus event time.",
        1,
        ps.iter().map(|p| (partition(p), &p.delay)),
    )?;
    histograms(
        e,
        "tally_event_disorder",
        "Partition max event time minus event time.",
        1,
        ps.iter().map(|p| (partition(p), &p.disorder)),
    )?;
    histograms(
        e,
        "tally_pane_ack_latency",
        "On-time pane: the watermark passing the window end to the pane acknowledged by Kafka.",
        1000,
        [(Labels::new(), &r.pane_ack_us)],
    )?;
    gauge(
        e,
        "tally_audit_balanced",
        "1 when every record and offset is accounted for.",
        None,
        f64::from(u8::from(r.balanced())),
    )?;
    Ok(())
}

/// The checkpoints.
fn checkpoints(e: &mut DescriptorEncoder, r: &WorkerReport) -> fmt::Result {
    let c = &r.checkpoint;
    counters(
        e,
        "tally_checkpoints",
        "Checkpoints completed by this process.",
        [(Labels::new(), c.completed)],
    )?;
    if let Some(at) = c.last_success_ms {
        gauge(
            e,
            "tally_checkpoint_last_success_timestamp",
            "When the last checkpoint completed (wall clock).",
            Some(&Unit::Seconds),
            secs(at),
        )?;
        gauge(
            e,
            "tally_checkpoint_last_duration",
            "Barrier to manifest of the last checkpoint.",
            Some(&Unit::Seconds),
            secs(c.last_duration_ms),
        )?;
        gauge(
            e,
            "tally_checkpoint_last",
            "Bytes the last checkpoint wrote (its new base or delta segments).",
            Some(&Unit::Bytes),
            c.last_bytes as f64,
        )?;
        gauge(
            e,
            "tally_checkpoint_state",
            "Bytes of the state the last checkpoint references: its bases and deltas.",
            Some(&Unit::Bytes),
            c.state_bytes as f64,
        )?;
    }
    gauge(
        e,
        "tally_checkpoint_interval",
        "checkpoint.interval.",
        Some(&Unit::Seconds),
        secs(r.checkpoint_interval_ms),
    )
}

#[derive(Debug)]
struct ConsumerLag(Vec<(Partition, i64)>);

impl Collector for ConsumerLag {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        gauges(
            &mut e,
            "tally_consumer_lag",
            "Input log end (librdkafka's last fetch, or the assignment) minus this worker's position, when scraped.",
            Some(&Unit::Other("records".into())),
            self.0
                .iter()
                .map(|(p, n)| (vec![("partition", p.to_string())], *n as f64)),
        )
    }
}

#[derive(Debug)]
struct Reprocess(ReprocessFigures);

impl Collector for Reprocess {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let r = &self.0;
        gauges(
            &mut e,
            "tally_reprocess_backlog",
            "Late records not reprocessed yet: late-topic log end minus reprocess-late's position.",
            Some(&Unit::Other("records".into())),
            r.backlog
                .iter()
                .map(|(p, n)| (vec![("partition", p.to_string())], *n as f64)),
        )?;
        counters(
            &mut e,
            "tally_reprocess_records",
            "Late records reprocessed, by outcome.",
            [
                ("adjusted", r.adjusted),
                ("duplicate", r.duplicates),
                ("dead_letter", r.dead_letters),
            ]
            .map(|(o, n)| (vec![("outcome", o.to_string())], n)),
        )
    }
}

#[derive(Debug)]
struct Sink(SinkFigures);

impl Collector for Sink {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        counters(
            &mut e,
            "tally_sink_applied_records",
            "Result records applied to PostgreSQL.",
            [(Labels::new(), s.applied_records)],
        )?;
        counters(
            &mut e,
            "tally_sink_rows_changed",
            "Rows inserted or updated (a redelivery changes none).",
            [(Labels::new(), s.rows_changed)],
        )?;
        counters(
            &mut e,
            "tally_sink_rejected_records",
            "Result records the sink rejected (kept in sink_rejected, not applied).",
            [(Labels::new(), s.rejected)],
        )?;
        gauges(
            &mut e,
            "tally_sink_lag",
            "Results topic log end minus the sink's next offset.",
            Some(&Unit::Other("records".into())),
            s.lag
                .iter()
                .map(|(p, n)| (vec![("partition", p.to_string())], *n as f64)),
        )?;
        if let Some(at) = s.last_apply_ms {
            gauge(
                &mut e,
                "tally_sink_last_apply_timestamp",
                "When the sink last committed a batch (wall clock).",
                Some(&Unit::Seconds),
                secs(at),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
