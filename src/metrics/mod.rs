//! Observability of time and of the audit: what a worker reports, and how it is
//! rendered (Prometheus text, the `tally delays` table). Pure; the worker does the I/O.
//!
//! Metric names (stable; documented in docs/reference/metrics.md):
//! - `tally_partition_watermark_ms{partition}` — partition watermark (event time, ms)
//! - `tally_partition_watermark_lag_ms{partition}` — wall clock minus watermark
//! - `tally_job_watermark_ms`, `tally_job_watermark_partition` — min over active partitions
//! - `tally_records_total{partition,route}` — consumed, folded, too_late, dead_letter, duplicate
//! - `tally_panes_total{partition}`, `tally_open_windows{partition}`, `tally_dedup_ids{partition}`
//! - `tally_spilled_windows{partition}` — windows evicted to RocksDB (memory budget)
//! - `tally_idle_advances_total{partition}`
//! - `tally_offsets_gap_total{partition}` — offsets deleted before tally read them,
//!   accepted with `--allow-truncated-log` (never billed)
//! - `tally_offsets_empty_total{partition}` — offsets without a record (transaction
//!   markers, aborted or compacted records)
//! - `tally_event_delay_ms{partition,quantile}` — wall clock at ingest minus event time
//! - `tally_event_disorder_ms{partition,quantile}` — partition max event time minus event time
//! - `tally_pane_ack_latency_us{quantile}` — on-time pane: the watermark passing the
//!   window end → the pane acknowledged by Kafka (this worker process, µs)
//! - `tally_audit_balanced` — 1 when consumed = folded + too_late + dead_letter + duplicate
//!   and consumed + empty + gap offsets = next offset, everywhere

pub mod histogram;

use std::fmt::Write;

use serde::{Deserialize, Serialize};

pub use histogram::Histogram;

use crate::checkpoint::OffsetLedger;
use crate::engine::Counters;
use crate::model::Partition;
use crate::state::NextOffset;
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
    pub counters: Counters,
    /// Where the offsets before `next_offset` went (`checkpoint::ledger`).
    #[serde(default)]
    pub offsets: OffsetLedger,
    pub open_windows: usize,
    /// Of `open_windows`, those evicted to RocksDB under the memory budget.
    #[serde(default)]
    pub spilled_windows: usize,
    pub dedup_ids: usize,
    pub delay: Histogram,
    pub disorder: Histogram,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerReport {
    pub at_ms: i64,
    pub topic: String,
    pub group: String,
    pub bound_ms: i64,
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
    pub fn job_watermark(&self) -> Option<(EventTime, Partition)> {
        self.active()
            .filter_map(|p| p.watermark.map(|w| (w, p.partition)))
            .min()
    }

    pub fn merged(&self, f: impl Fn(&PartitionReport) -> &Histogram) -> Histogram {
        let mut h = Histogram::default();
        for p in &self.partitions {
            h.merge(f(p));
        }
        h
    }

    /// A `max_out_of_orderness` covering p99 of the observed disorder, rounded up to
    /// a whole second (what the bounded-out-of-orderness heuristic needs to cover).
    pub fn recommended_bound_ms(&self) -> Option<i64> {
        let p99 = self.merged(|p| &p.disorder).quantile(990)? as i64;
        Some(((p99 / 1000) + 1) * 1000)
    }

    pub fn balanced(&self) -> bool {
        self.partitions.iter().all(|p| {
            p.counters.balanced() && p.offsets.balanced(p.counters.consumed, p.next_offset)
        })
    }

    pub fn render_prometheus(&self) -> String {
        let mut s = String::new();
        let g = |s: &mut String, name: &str, help: &str| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
        };
        g(
            &mut s,
            "tally_partition_watermark_ms",
            "Partition watermark, event time ms.",
        );
        for p in &self.partitions {
            if let Some(w) = p.watermark {
                let _ = writeln!(
                    s,
                    "tally_partition_watermark_ms{{partition=\"{}\"}} {w}",
                    p.partition
                );
            }
        }
        g(
            &mut s,
            "tally_partition_watermark_lag_ms",
            "Wall clock minus partition watermark.",
        );
        for p in &self.partitions {
            if let Some(w) = p.watermark {
                let _ = writeln!(
                    s,
                    "tally_partition_watermark_lag_ms{{partition=\"{}\"}} {}",
                    p.partition,
                    self.at_ms - w.0
                );
            }
        }
        if let Some((w, p)) = self.job_watermark() {
            g(
                &mut s,
                "tally_job_watermark_ms",
                "Minimum watermark over active partitions.",
            );
            let _ = writeln!(s, "tally_job_watermark_ms {w}");
            g(
                &mut s,
                "tally_job_watermark_partition",
                "Partition holding the job watermark.",
            );
            let _ = writeln!(s, "tally_job_watermark_partition {p}");
        }
        let _ = writeln!(s, "# HELP tally_records_total Input records by route.\n# TYPE tally_records_total counter");
        for p in &self.partitions {
            let c = &p.counters;
            for (route, n) in [
                ("consumed", c.consumed),
                ("folded", c.folded),
                ("too_late", c.too_late),
                ("dead_letter", c.dead_letter),
                ("duplicate", c.duplicate),
            ] {
                let _ = writeln!(
                    s,
                    "tally_records_total{{partition=\"{}\",route=\"{route}\"}} {n}",
                    p.partition
                );
            }
        }
        for (name, help, f) in [
            (
                "tally_panes_total",
                "Result panes emitted.",
                (|p: &PartitionReport| p.counters.panes) as fn(&PartitionReport) -> u64,
            ),
            ("tally_open_windows", "Windows held in state.", |p| {
                p.open_windows as u64
            }),
            (
                "tally_spilled_windows",
                "Windows held only in RocksDB (memory budget).",
                |p| p.spilled_windows as u64,
            ),
            (
                "tally_dedup_ids",
                "Request ids remembered for dedup.",
                |p| p.dedup_ids as u64,
            ),
            (
                "tally_idle_advances_total",
                "Watermark advances forced by idleness.",
                |p| p.idle_advances,
            ),
            (
                "tally_offsets_gap_total",
                "Offsets deleted before tally read them, accepted with --allow-truncated-log (not billed).",
                |p| p.offsets.gap_offsets,
            ),
            (
                "tally_offsets_empty_total",
                "Offsets without a record: transaction markers, aborted or compacted records.",
                |p| p.offsets.empty_offsets,
            ),
        ] {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for p in &self.partitions {
                let _ = writeln!(s, "{name}{{partition=\"{}\"}} {}", p.partition, f(p));
            }
        }
        for (name, help, f) in [
            (
                "tally_event_delay_ms",
                "Wall clock at ingest minus event time.",
                (|p: &PartitionReport| &p.delay) as fn(&PartitionReport) -> &Histogram,
            ),
            (
                "tally_event_disorder_ms",
                "Partition max event time minus event time.",
                |p| &p.disorder,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} summary");
            for p in &self.partitions {
                for (q, label) in QUANTILES {
                    if let Some(v) = f(p).quantile(q) {
                        let _ = writeln!(
                            s,
                            "{name}{{partition=\"{}\",quantile=\"{label}\"}} {v}",
                            p.partition
                        );
                    }
                }
                let _ = writeln!(
                    s,
                    "{name}_count{{partition=\"{}\"}} {}",
                    p.partition,
                    f(p).count()
                );
            }
        }
        let name = "tally_pane_ack_latency_us";
        let _ = writeln!(
            s,
            "# HELP {name} On-time pane: watermark past the window end to Kafka ack.\n# TYPE {name} summary"
        );
        for (q, label) in QUANTILES {
            if let Some(v) = self.pane_ack_us.quantile(q) {
                let _ = writeln!(s, "{name}{{quantile=\"{label}\"}} {v}");
            }
        }
        let _ = writeln!(s, "{name}_count {}", self.pane_ack_us.count());
        g(
            &mut s,
            "tally_audit_balanced",
            "1 when every record is accounted for.",
        );
        let _ = writeln!(s, "tally_audit_balanced {}", u8::from(self.balanced()));
        s
    }

    /// The `tally delays` table.
    pub fn render_table(&self) -> String {
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
            "{:>4} {:>24} {:>12} {:>9}  {:<28} {:<28}",
            "part",
            "watermark",
            "lag ms",
            "records",
            "delay p50/p95/p99/p99.9 ms",
            "disorder p50/p95/p99/p99.9 ms"
        );
        for p in &self.partitions {
            let wm = p
                .watermark
                .map_or("-".into(), |w| crate::config::duration::format_utc_ms(w.0));
            let lag = p
                .watermark
                .map_or("-".into(), |w| (self.at_ms - w.0).to_string());
            let _ = writeln!(
                s,
                "{:>4} {:>24} {:>12} {:>9}  {:<28} {:<28}",
                p.partition,
                wm,
                lag,
                p.counters.consumed,
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
        if let Some((w, p)) = self.job_watermark() {
            let _ = writeln!(
                s,
                "job watermark {} held by partition {p}",
                crate::config::duration::format_utc_ms(w.0)
            );
        }
        match self.recommended_bound_ms() {
            Some(b) => {
                let _ = writeln!(s, "recommended watermark.max_out_of_orderness = \"{}\" (p99 of observed disorder, rounded up; current {} ms)", crate::config::Millis(b), self.bound_ms);
            }
            None => {
                let _ = writeln!(s, "no events observed yet: no recommendation");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(p: i32, w: Option<i64>, idle_ms: u64, disorder: &[i64]) -> PartitionReport {
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
            counters: Counters {
                consumed: 3,
                folded: 3,
                ..Default::default()
            },
            offsets: OffsetLedger::default(),
            open_windows: 1,
            spilled_windows: 0,
            dedup_ids: 3,
            delay: Histogram::default(),
            disorder: h,
        }
    }

    #[test]
    fn job_watermark_skips_idle_and_empty_partitions() {
        let r = WorkerReport {
            at_ms: 10_000,
            topic: "requests".into(),
            group: "g".into(),
            bound_ms: 5_000,
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
        assert!(text.contains("tally_job_watermark_partition 3"));
        assert!(text.contains("tally_partition_watermark_lag_ms{partition=\"1\"} 8000"));
        assert!(text.contains("tally_audit_balanced 1"));
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
            idle_ms: None,
            partitions: vec![part(0, Some(0), 0, &disorder)],
            pane_ack_us: Histogram::default(),
        };
        assert_eq!(r.recommended_bound_ms(), Some(7_000));
        assert!(r.render_table().contains("max_out_of_orderness = \"7s\""));
    }
}
