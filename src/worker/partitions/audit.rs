//! The audits (docs/DESIGN.md §1.4, §7.5) and each partition's part of the report.

use tracing::error;

use super::{clock, Outputs, Partitions};
use crate::engine::Counters;
use crate::metrics::PartitionReport;
use crate::model::Partition;

impl<O: Outputs> Partitions<O> {
    /// Sums the audit counters; an imbalance is a bug and is reported loudly.
    pub(crate) fn audit(&self) -> Counters {
        let mut total = Counters::default();
        for (p, s) in &self.slots {
            let c = s.task.counters();
            if !c.balanced() {
                error!(partition = p.0, consumed = c.consumed, folded = c.folded, too_late = c.too_late,
                    dead_letter = c.dead_letter, duplicate = c.duplicate, "CONSERVATION AUDIT FAILED: consumed != folded + too_late + dead_letter + duplicate");
            }
            if !s.offsets.balanced(c.consumed, s.next) {
                error!(
                    partition = p.0,
                    consumed = c.consumed,
                    next_offset = s.next.0,
                    empty_offsets = s.offsets.empty_offsets,
                    gap_offsets = s.offsets.gap_offsets,
                    "OFFSET AUDIT FAILED: consumed + empty_offsets + gap_offsets != next_offset"
                );
            }
            total.add(&c);
        }
        total
    }

    /// Both audits hold on every partition: each record consumed has one route,
    /// and each offset advanced over is a record, an empty offset or an accepted gap.
    pub fn balanced(&self) -> bool {
        self.slots.values().all(|s| {
            let c = s.task.counters();
            c.balanced() && s.offsets.balanced(c.consumed, s.next)
        })
    }

    /// Each partition's report; `log_end`: its log end as the reader last saw it
    /// (`None`: the one seen at assignment).
    pub(crate) fn reports(
        &self,
        log_end: impl Fn(Partition) -> Option<i64>,
    ) -> Vec<PartitionReport> {
        self.slots
            .iter()
            .map(|(p, s)| PartitionReport {
                partition: *p,
                watermark: s.task.max_ts().map(|_| s.task.watermark()),
                max_ts: s.task.max_ts(),
                next_offset: s.next,
                offsets: s.offsets.clone(),
                idle_ms: (clock::mono_ms() - s.last_record).max(0) as u64,
                idle_advances: s.task.counters().idle_advances,
                held: s.task.held(),
                counters: s.task.counters(),
                open_windows: s.task.open_windows(),
                spilled_windows: s.task.open_windows() - s.task.windows_in_memory(),
                dedup_ids: s.task.dedup_ids(),
                dedup_cold_ids: s.task.dedup_cold_stats().0,
                dedup_cold_reads: s.task.dedup_cold_stats().1,
                delay: s.task.delay().clone(),
                disorder: s.task.disorder().clone(),
                log_end: log_end(*p).or(Some(s.end)),
                final_through: s.task.final_through(),
            })
            .collect()
    }
}
