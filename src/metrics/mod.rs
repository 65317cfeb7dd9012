//! Observability of time and of the audit: what a worker reports, and how it is
//! rendered (Prometheus text, the `tally delays` table). Pure; the worker does the I/O.
//!
//! The Prometheus names and their units are in `exposition` (the list:
//! `exposition::EXPORTED`; the meanings: docs/reference/metrics.md).

pub mod config;
pub(crate) mod exposition;
pub mod finality;

use std::fmt::Write;

use serde::{Deserialize, Serialize};

pub use exposition::EXPORTED;

use crate::base::histogram::Histogram;
use crate::checkpoint::OffsetLedger;
use crate::engine::Counters;
use crate::model::NextOffset;
use crate::model::Partition;
use crate::time::EventTime;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionReport {
    pub partition: Partition,
    pub watermark: Option<EventTime>,
    pub max_ts: Option<EventTime>,
    pub next_offset: NextOffset,
    /// Wall-clock ms since this partition's last record.
    pub idle_ms: u64,
    pub idle_advances: u64,
    /// Records held by the watermark's lead limit (`time::watermark`): billed,
    /// but too far ahead of the partition to move its watermark.
    #[serde(default)]
    pub held: u64,
    pub counters: Counters,
    /// Where the offsets before `next_offset` went (`checkpoint::ledger`).
    #[serde(default)]
    pub offsets: OffsetLedger,
    pub open_windows: usize,
    /// Of `open_windows`, those evicted to RocksDB under the memory budget.
    #[serde(default)]
    pub spilled_windows: usize,
    pub dedup_ids: usize,
    /// Dedup ids moved out of memory so far (`engine::cold`), and the store
    /// reads for them.
    #[serde(default)]
    pub dedup_cold_ids: u64,
    #[serde(default)]
    pub dedup_cold_reads: u64,
    pub delay: Histogram,
    pub disorder: Histogram,
    /// The input log end as of librdkafka's last fetch (or the assignment), for
    /// report.json; the consumer lag metric is computed when scraped
    /// (`worker::lag`).
    #[serde(default)]
    pub log_end: Option<i64>,
    /// The end of the partition's last final window (its progress, DESIGN §6.1).
    #[serde(default)]
    pub final_through: Option<i64>,
}

/// The checkpoints of this worker process.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointStats {
    pub completed: u64,
    /// Wall clock, ms, when the last one completed.
    pub last_success_ms: Option<i64>,
    /// Barrier to manifest, ms.
    pub last_duration_ms: i64,
    /// Bytes it wrote (its new segments).
    pub last_bytes: u64,
    /// Bytes of every segment it references (what a restore reads).
    #[serde(default)]
    pub state_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerReport {
    pub at_ms: i64,
    pub topic: String,
    pub group: String,
    pub bound_ms: i64,
    /// `window.allowed_lateness`, ms.
    #[serde(default)]
    pub allowed_lateness_ms: i64,
    /// `window.size` and `window.offset`, ms (0: a report written before they
    /// were reported).
    #[serde(default)]
    pub window_size_ms: i64,
    #[serde(default)]
    pub window_offset_ms: i64,
    /// `checkpoint.interval`, ms.
    #[serde(default)]
    pub checkpoint_interval_ms: i64,
    #[serde(default)]
    pub checkpoint: CheckpointStats,
    /// A partition silent this long is not "active" for the job watermark.
    pub idle_ms: Option<i64>,
    pub partitions: Vec<PartitionReport>,
    /// On-time pane latency of this worker process (µs), watermark → Kafka ack.
    #[serde(default)]
    pub pane_ack_us: Histogram,
}

const QUANTILES: [(u64, &str); 4] = [(500, "0.5"), (950, "0.95"), (990, "0.99"), (999, "0.999")];

impl WorkerReport {
    fn active(&self) -> impl Iterator<Item = &PartitionReport> {
        self.partitions.iter().filter(move |p| {
            p.watermark.is_some() && self.idle_ms.is_none_or(|idle| (p.idle_ms as i64) < idle)
        })
    }

    /// The minimum watermark over active partitions, and the partition holding it.
    pub(crate) fn job_watermark(&self) -> Option<(EventTime, Partition)> {
        self.active()
            .filter_map(|p| p.watermark.map(|w| (w, p.partition)))
            .min()
    }

    pub(crate) fn merged(&self, f: impl Fn(&PartitionReport) -> &Histogram) -> Histogram {
        let mut h = Histogram::default();
        for p in &self.partitions {
            h.merge(f(p));
        }
        h
    }

    /// A `max_out_of_orderness` covering p99 of the observed disorder, rounded up to
    /// a whole second (what the bounded-out-of-orderness heuristic needs to cover).
    pub(crate) fn recommended_bound_ms(&self) -> Option<i64> {
        let p99 = self.merged(|p| &p.disorder).quantile(990)? as i64;
        Some(((p99 / 1000) + 1) * 1000)
    }

    pub fn balanced(&self) -> bool {
        self.partitions.iter().all(|p| {
            p.counters.balanced() && p.offsets.balanced(p.counters.consumed, p.next_offset)
        })
    }

    /// The Prometheus text of this report (`exposition`).
    pub(crate) fn render_prometheus(&self) -> String {
        exposition::worker(self)
    }

    /// The `tally delays` table.
    pub(crate) fn render_table(&self) -> String {
        let fmt_q = |h: &Histogram| {
            QUANTILES
                .iter()
                .map(|(q, _)| h.quantile(*q).map_or("-".into(), |v| v.to_string()))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let mut s = String::new();
        let _ = writeln!(
            s,
            "topic {} group {} — watermark bound {} ms",
            self.topic, self.group, self.bound_ms
        );
        let _ = writeln!(
            s,
            "{:>4} {:>24} {:>12} {:>9} {:>7}  {:<28} {:<28}",
            "part",
            "watermark",
            "lag ms",
            "records",
            "ahead",
            "delay p50/p95/p99/p99.9 ms",
            "disorder p50/p95/p99/p99.9 ms"
        );
        for p in &self.partitions {
            let wm = p
                .watermark
                .map_or("-".into(), |w| crate::time::utc::format_utc_ms(w.0));
            let lag = p
                .watermark
                .map_or("-".into(), |w| (self.at_ms - w.0).to_string());
            let _ = writeln!(
                s,
                "{:>4} {:>24} {:>12} {:>9} {:>7}  {:<28} {:<28}",
                p.partition,
                wm,
                lag,
                p.counters.consumed,
                p.held,
                fmt_q(&p.delay),
                fmt_q(&p.disorder)
            );
        }
        let _ = writeln!(
            s,
            "all: delay {} | disorder {}",
            fmt_q(&self.merged(|p| &p.delay)),
            fmt_q(&self.merged(|p| &p.disorder))
        );
        let ahead: u64 = self.partitions.iter().map(|p| p.held).sum();
        if ahead > 0 {
            let _ = writeln!(
                s,
                "ahead: {ahead} records led their partition by more than watermark.max_lead; \
                 billed, but they did not move the watermark (a producer's clock runs ahead?)"
            );
        }
        if let Some((w, p)) = self.job_watermark() {
            let _ = writeln!(
                s,
                "job watermark {} held by partition {p}",
                crate::time::utc::format_utc_ms(w.0)
            );
        }
        match self.recommended_bound_ms() {
            Some(b) => {
                let _ = writeln!(s, "recommended watermark.max_out_of_orderness = \"{}\" (p99 of observed disorder, rounded up; current {} ms)", crate::base::duration::Millis(b), self.bound_ms);
            }
            None => {
                let _ = writeln!(s, "no events observed yet: no recommendation");
            }
        }
        s
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn part(p: i32, w: Option<i64>, idle_ms: u64, disorder: &[i64]) -> PartitionReport {
        let mut h = Histogram::default();
        for d in disorder {
            h.record(*d);
        }
        PartitionReport {
            partition: Partition(p),
            watermark: w.map(EventTime),
            max_ts: w.map(EventTime),
            next_offset: NextOffset(3),
            idle_ms,
            idle_advances: 0,
            held: 0,
            counters: Counters {
                consumed: 3,
                folded: 3,
                ..Default::default()
            },
            offsets: OffsetLedger::default(),
            open_windows: 1,
            spilled_windows: 0,
            dedup_ids: 3,
            dedup_cold_ids: 0,
            dedup_cold_reads: 0,
            delay: Histogram::default(),
            disorder: h,
            log_end: Some(10),
            final_through: None,
        }
    }

    #[test]
    fn job_watermark_skips_idle_and_empty_partitions() {
        let r = WorkerReport {
            at_ms: 10_000,
            topic: "requests".into(),
            group: "g".into(),
            bound_ms: 5_000,
            allowed_lateness_ms: 30_000,
            window_size_ms: 60_000,
            window_offset_ms: 0,
            checkpoint_interval_ms: 1_000,
            checkpoint: CheckpointStats::default(),
            idle_ms: Some(30_000),
            partitions: vec![
                part(0, Some(900), 60_000, &[]),
                part(1, Some(2_000), 10, &[]),
                part(2, None, 0, &[]),
                part(3, Some(1_500), 0, &[]),
            ],
            pane_ack_us: Histogram::default(),
        };
        assert_eq!(r.job_watermark(), Some((EventTime(1_500), Partition(3))));
        let text = r.render_prometheus();
        assert!(text.contains("tally_job_watermark_partition 3.0"), "{text}");
        assert!(
            text.contains("tally_partition_watermark_lag_seconds{partition=\"1\"} 8.0"),
            "{text}"
        );
        assert!(text.contains("tally_audit_balanced 1.0"), "{text}");
    }

    #[test]
    fn recommends_a_bound_covering_p99_disorder() {
        let disorder: Vec<i64> = (0..1000)
            .map(|i| if i < 985 { 100 } else { 6_400 })
            .collect();
        let r = WorkerReport {
            at_ms: 0,
            topic: "t".into(),
            group: "g".into(),
            bound_ms: 5_000,
            allowed_lateness_ms: 30_000,
            window_size_ms: 60_000,
            window_offset_ms: 0,
            checkpoint_interval_ms: 1_000,
            checkpoint: CheckpointStats::default(),
            idle_ms: None,
            partitions: vec![part(0, Some(0), 0, &disorder)],
            pane_ack_us: Histogram::default(),
        };
        assert_eq!(r.recommended_bound_ms(), Some(7_000));
        assert!(r.render_table().contains("max_out_of_orderness = \"7s\""));
    }
}
