//! "Why is this window not final?" (`tally explain --finality`, the status
//! page): given the workers' reports and a window, each input partition's part
//! in the window's finality (DESIGN §6.1) — its watermark and progress, the
//! records its lead rule holds (§4.4), its idleness (§4.3), the lateness still
//! to run — and which partition holds the window back. Pure: the caller reads
//! the reports (a worker's `/status.json`, a `report.json`).
//!
//! Invariants:
//! - A partition has passed the window exactly when its progress
//!   (`final_through`) is at or past the window's end; the window is final for
//!   the partitions seen exactly when every one of them has. The sink stores
//!   that progress a batch later (`tally_final`), so the database may say "not
//!   final" a moment after this says final, never the other way round.
//! - A partition that has not passed the window has at least one reason, and
//!   `held_back_by` is one of those partitions: the furthest behind (no
//!   watermark first, then the lowest watermark, then the lowest number).
//! - Only the partitions in the reports are judged: a group's other workers'
//!   partitions need their own reports (`merge`).

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::{PartitionReport, WorkerReport};
use crate::model::Partition;
use crate::time::utc::format_utc_ms;

/// A partition without a record for this long (wall clock, ms) is called silent.
pub const SILENT_MS: u64 = 1_000;

/// A window named by one of its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowRef {
    /// The window starting at this instant (ms).
    Start(i64),
    /// The window ending at this instant (ms, exclusive).
    End(i64),
}

/// Why a partition has not passed a window yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// It has no watermark: fewer than 8 records so far, and the liveness rule
    /// has not started it (§4.4, "The start").
    NoWatermark,
    /// Its watermark must still move this far (ms of event time) for the
    /// window's allowed lateness to run out here.
    LatenessToRun { ms: i64 },
    /// Records held by the lead rule: billed, but they do not move the watermark.
    HeldRecords { count: u64 },
    /// Records in its log not read yet.
    Backlog { records: i64 },
    /// Silent (no record for this long) and `watermark.idle_timeout` is off:
    /// only new records can move it.
    SilentIdlenessOff { silent_ms: u64 },
    /// Its watermark is there; the worker's next loop records the progress.
    ProgressPending,
    /// Silent; the liveness rule moves it once it has been quiet for
    /// `idle_timeout` (this much more) and the wall clock is past the lateness.
    IdleTimeoutToRun { ms: i64 },
}

/// "record" or "records", for `n` of them.
fn records(n: i128) -> &'static str {
    if n == 1 {
        "record"
    } else {
        "records"
    }
}

impl Reason {
    pub fn text(&self) -> String {
        match self {
            Reason::NoWatermark => "no watermark yet (fewer than 8 records)".into(),
            Reason::LatenessToRun { ms } => format!("watermark {} ms short", ms),
            Reason::HeldRecords { count } => {
                format!(
                    "{count} {} held by the lead rule",
                    records(i128::from(*count))
                )
            }
            Reason::Backlog { records } => {
                format!(
                    "{records} {} not read yet",
                    self::records(i128::from(*records))
                )
            }
            Reason::SilentIdlenessOff { silent_ms } => format!(
                "silent for {} s and idleness off: only new records move it",
                silent_ms / 1000
            ),
            Reason::ProgressPending => "at the line: the next loop records the progress".into(),
            Reason::IdleTimeoutToRun { ms } => {
                format!(
                    "idle; the liveness rule moves it in {} s",
                    (ms + 999) / 1000
                )
            }
        }
    }
}

/// One partition's part in a window's finality.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionFinality {
    pub partition: Partition,
    pub watermark: Option<i64>,
    /// Its progress: every window ending at or before it is final here.
    pub final_through: Option<i64>,
    pub passed: bool,
    /// Records its lead rule holds (all of them, not only this window's).
    pub held: u64,
    /// Wall-clock ms since its last record.
    pub idle_ms: u64,
    /// Log end minus position, as of the report (`None`: no log end known).
    pub backlog: Option<i64>,
    /// How far its watermark must still move (ms of event time), 0 once there.
    pub lateness_to_run_ms: i64,
    /// Empty exactly when `passed`.
    pub reasons: Vec<Reason>,
}

/// A window's finality over the partitions of the reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finality {
    pub window_start: i64,
    pub window_end: i64,
    /// The watermark each partition needs: `window_end − 1 + allowed_lateness`.
    pub needs_watermark: i64,
    pub allowed_lateness_ms: i64,
    /// `watermark.idle_timeout`, ms; `None`: off.
    pub idle_timeout_ms: Option<i64>,
    pub is_final: bool,
    /// The partition furthest behind among those that have not passed.
    pub held_back_by: Option<Partition>,
    pub partitions: Vec<PartitionFinality>,
}

/// The window `w` names, on the report's grid.
pub fn resolve(report: &WorkerReport, w: WindowRef) -> Result<(i64, i64), String> {
    let size = report.window_size_ms;
    if size <= 0 {
        return Err(
            "the report does not say the window size (a worker older than \
                    `tally explain`): cannot place the window"
                .into(),
        );
    }
    let (start, end) = match w {
        WindowRef::Start(s) => (s, s.saturating_add(size)),
        WindowRef::End(e) => (e.saturating_sub(size), e),
    };
    if (start - report.window_offset_ms).rem_euclid(size) != 0 {
        return Err(format!(
            "{} is not a window boundary (windows of {size} ms, offset {} ms)",
            format_utc_ms(match w {
                WindowRef::Start(s) | WindowRef::End(s) => s,
            }),
            report.window_offset_ms
        ));
    }
    Ok((start, end))
}

/// The reports of a group's workers as one: their partitions (a partition in
/// two, mid-rebalance, from the one further along), the settings of the first.
pub fn merge(reports: Vec<WorkerReport>) -> Result<WorkerReport, String> {
    let mut it = reports.into_iter();
    let mut all = it.next().ok_or("no report")?;
    for r in it {
        if (r.topic.as_str(), r.group.as_str()) != (all.topic.as_str(), all.group.as_str()) {
            return Err(format!(
                "reports of different jobs: topic {} group {} and topic {} group {}",
                all.topic, all.group, r.topic, r.group
            ));
        }
        for p in r.partitions {
            match all
                .partitions
                .iter_mut()
                .find(|q| q.partition == p.partition)
            {
                Some(q) if q.next_offset.0 < p.next_offset.0 => *q = p,
                Some(_) => {}
                None => all.partitions.push(p),
            }
        }
    }
    all.partitions.sort_by_key(|p| p.partition);
    Ok(all)
}

/// Why a partition whose watermark is short of the line (or absent) is there.
fn short_reasons(
    report: &WorkerReport,
    p: &PartitionReport,
    no_watermark: bool,
    to_run_ms: i64,
    backlog: Option<i64>,
) -> Vec<Reason> {
    let mut reasons = vec![if no_watermark {
        Reason::NoWatermark
    } else {
        Reason::LatenessToRun { ms: to_run_ms }
    }];
    if p.held > 0 {
        reasons.push(Reason::HeldRecords { count: p.held });
    }
    match backlog {
        Some(n) if n > 0 => reasons.push(Reason::Backlog { records: n }),
        _ => match report.idle_ms {
            None if p.idle_ms >= SILENT_MS => reasons.push(Reason::SilentIdlenessOff {
                silent_ms: p.idle_ms,
            }),
            Some(t) if (p.idle_ms as i64) < t => reasons.push(Reason::IdleTimeoutToRun {
                ms: t - p.idle_ms as i64,
            }),
            _ => {}
        },
    }
    reasons
}

fn partition(
    report: &WorkerReport,
    p: &PartitionReport,
    end: i64,
    needs: i64,
) -> PartitionFinality {
    let watermark = p.watermark.map(|w| w.0);
    let passed = p.final_through.is_some_and(|f| f >= end);
    let backlog = p.log_end.map(|e| (e - p.next_offset.0).max(0));
    let lateness_to_run_ms = if passed {
        0
    } else {
        watermark.map_or(0, |w| needs.saturating_sub(w).max(0))
    };
    let reasons = if passed {
        Vec::new()
    } else if watermark.is_some() && lateness_to_run_ms == 0 {
        // At the line: the next loop records the progress.
        vec![Reason::ProgressPending]
    } else {
        short_reasons(report, p, watermark.is_none(), lateness_to_run_ms, backlog)
    };
    PartitionFinality {
        partition: p.partition,
        watermark,
        final_through: p.final_through,
        passed,
        held: p.held,
        idle_ms: p.idle_ms,
        backlog,
        lateness_to_run_ms,
        reasons,
    }
}

/// The finality of `window` over `report`'s partitions.
pub fn explain(report: &WorkerReport, window: WindowRef) -> Result<Finality, String> {
    let (start, end) = resolve(report, window)?;
    let needs = end
        .saturating_sub(1)
        .saturating_add(report.allowed_lateness_ms);
    let partitions: Vec<PartitionFinality> = report
        .partitions
        .iter()
        .map(|p| partition(report, p, end, needs))
        .collect();
    let held_back_by = partitions
        .iter()
        .filter(|p| !p.passed)
        .min_by_key(|p| (p.watermark.is_some(), p.watermark, p.partition))
        .map(|p| p.partition);
    Ok(Finality {
        window_start: start,
        window_end: end,
        needs_watermark: needs,
        allowed_lateness_ms: report.allowed_lateness_ms,
        idle_timeout_ms: report.idle_ms,
        is_final: !partitions.is_empty() && held_back_by.is_none(),
        held_back_by,
        partitions,
    })
}

impl Finality {
    /// The terminal table of `tally explain --finality`.
    pub fn render_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "window [{}, {}) — each partition's watermark must reach {} (end − 1 ms + lateness {} ms); idleness {}",
            format_utc_ms(self.window_start),
            format_utc_ms(self.window_end),
            format_utc_ms(self.needs_watermark),
            self.allowed_lateness_ms,
            self.idle_timeout_ms
                .map_or("off".to_string(), |t| format!("{t} ms")),
        );
        let _ = writeln!(
            s,
            "{:>4}  {:<24}  {:<24}  {:<6}  {:>6}  {:>9}  why not",
            "part", "watermark", "final through", "passed", "held", "idle s"
        );
        let time = |t: Option<i64>| t.map_or("-".to_string(), format_utc_ms);
        for p in &self.partitions {
            let why: Vec<String> = p.reasons.iter().map(Reason::text).collect();
            let _ = writeln!(
                s,
                "{:>4}  {:<24}  {:<24}  {:<6}  {:>6}  {:>9}  {}",
                p.partition,
                time(p.watermark),
                time(p.final_through),
                if p.passed { "yes" } else { "no" },
                p.held,
                p.idle_ms / 1000,
                if why.is_empty() {
                    "-".into()
                } else {
                    why.join("; ")
                }
            );
        }
        let seen: Vec<String> = self
            .partitions
            .iter()
            .map(|p| p.partition.to_string())
            .collect();
        let _ = writeln!(
            s,
            "partitions judged: {} (those of the reports given; each worker of a group has its own)",
            if seen.is_empty() { "none".into() } else { seen.join(", ") }
        );
        match (self.is_final, self.held_back_by) {
            (true, _) => {
                let _ = writeln!(s, "final: every partition's progress passed its end");
            }
            (false, Some(p)) => {
                let _ = writeln!(s, "not final: held back by partition {p}");
            }
            (false, None) => {
                let _ = writeln!(s, "not final: the reports hold no partition");
            }
        }
        s
    }
}

#[cfg(test)]
#[path = "finality_tests.rs"]
mod tests;
