//! The outcome of `tally-dev chaos`: the view, the counters and the late and
//! dead-letter topics compared with the generator's expectation, and the report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;

use super::faults::FaultLog;
use super::kills::{report, Worker};
use super::plan::Plan;
use crate::devtools::support;
use crate::gen::Expected;
use crate::kafka::headers;
use crate::kafka::read::read_topic;

/// The chaos report, as printed and as `--json` writes it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChaosReport {
    pub records_generated: u64,
    pub workers: usize,
    pub partitions: i32,
    pub group_protocol: String,
    pub kills: usize,
    pub windows_compared: usize,
    pub extra_windows: usize,
    pub lost_windows: usize,
    pub double_counted_windows: usize,
    pub records_consumed: u64,
    pub records_expected: u64,
    pub too_late: u64,
    pub too_late_injected: u64,
    pub too_late_distinct_on_topic: u64,
    pub dead_letters: u64,
    pub dead_letters_injected: u64,
    pub dead_letter_sources_on_topic: u64,
    /// Adjustment rows in the sink (one per too-late event), when the run ran
    /// `reprocess-late --follow`.
    #[serde(default)]
    pub adjustments: Option<u64>,
    pub duplicates: u64,
    pub duplicates_injected: u64,
    pub recovery_p50_s: f64,
    pub recovery_p99_s: f64,
    pub recovery_max_s: f64,
    pub recoveries_observed: usize,
    pub recoveries_never_observed: usize,
    pub peak_rss_mib: Vec<u64>,
    /// Both audits (records, offsets) of the final run.
    pub audit_balanced: bool,
    pub exact: bool,
    /// The run's plan (seed, layout, protocol, store, faults).
    #[serde(default)]
    pub plan: Option<Plan>,
    /// The faults as they happened, and every recovery time.
    #[serde(default)]
    pub faults: FaultLog,
    /// Seconds from the generator's start until it was done and every kill
    /// recovered, until the input was drained, and until the run was compared.
    #[serde(default)]
    pub phases_s: [f64; 3],
}

/// The `q`th percentile of `v` by nearest rank (the smallest value with at
/// least q % of `v` at or below it): with fewer than 100 values, p99 is the
/// maximum. 0 for no values.
pub fn pct(v: &[f64], q: usize) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = (v.len() * q).div_ceil(100).max(1);
    v.get(rank - 1).copied().unwrap_or(0.0)
}

impl ChaosReport {
    pub(super) fn new(
        plan: &Plan,
        count: u64,
        expected: &Expected,
        log: FaultLog,
        f: &Figures,
        workers: &[Worker],
    ) -> Self {
        let recoveries = &log.recoveries;
        ChaosReport {
            records_generated: count,
            workers: plan.workers,
            partitions: plan.partitions,
            group_protocol: plan.group_protocol.clone(),
            kills: log.kills + log.crash_point_kills,
            windows_compared: expected.windows.len(),
            extra_windows: f.extra,
            lost_windows: f.lost,
            double_counted_windows: f.doubled,
            records_consumed: f.c.consumed,
            records_expected: expected.records,
            too_late: f.c.too_late,
            too_late_injected: expected.too_late.len() as u64,
            too_late_distinct_on_topic: f.late_on_topic,
            dead_letters: f.c.dead_letter,
            dead_letters_injected: f.dead,
            dead_letter_sources_on_topic: f.dlq_sources,
            adjustments: f.adjustments,
            duplicates: f.c.duplicate,
            duplicates_injected: expected.duplicates,
            recovery_p50_s: pct(recoveries, 50),
            recovery_p99_s: pct(recoveries, 99),
            recovery_max_s: recoveries.iter().copied().fold(0.0, f64::max),
            recoveries_observed: recoveries.len(),
            recoveries_never_observed: log.never_recovered,
            peak_rss_mib: workers.iter().map(|w| w.peak_rss_kb / 1024).collect(),
            audit_balanced: f.audit_balanced,
            exact: f.exact,
            plan: Some(plan.clone()),
            faults: log,
            phases_s: [0.0; 3],
        }
    }
}

/// The outcome, compared with the expectation.
pub(super) struct Figures {
    pub(super) lost: usize,
    pub(super) doubled: usize,
    pub(super) extra: usize,
    /// The final run's counters, summed over partitions.
    pub(super) c: crate::engine::Counters,
    pub(super) late_on_topic: u64,
    pub(super) dead: u64,
    pub(super) dlq_sources: u64,
    /// Adjustment rows in the sink, when `reprocess-late` ran.
    pub(super) adjustments: Option<u64>,
    pub(super) audit_balanced: bool,
    pub(super) exact: bool,
}

/// What the invoice view must show per (tenant, window end): the windows, and
/// with `reprocess_late` the too-late events' adjustments too.
fn wanted(
    expected: &Expected,
    reprocess_late: bool,
) -> anyhow::Result<BTreeMap<(String, i64), u128>> {
    let mut want: BTreeMap<(String, i64), u128> = BTreeMap::new();
    for w in &expected.windows {
        *want.entry((w.tenant_id.clone(), w.window_end)).or_default() +=
            w.cost_pico.parse::<u128>()?;
    }
    if reprocess_late {
        for l in &expected.too_late {
            *want.entry((l.tenant_id.clone(), l.window_end)).or_default() +=
                l.cost_pico.parse::<u128>()?;
        }
    }
    Ok(want)
}

/// Compares the invoice view, the final run's counters and the late and
/// dead-letter topics with the expectation; with `reprocess_late`, also that
/// every too-late event has exactly one adjustment, billed once.
pub(super) fn compare(
    db: &str,
    expected: &Expected,
    final_state: &Path,
    kafka: &crate::config::KafkaConfig,
    reprocess_late: bool,
) -> anyhow::Result<Figures> {
    let view: BTreeMap<(String, i64), u128> = support::invoice(db)?
        .into_iter()
        .map(|l| Ok(((l.tenant_id, l.window_end), l.cost_pico.parse()?)))
        .collect::<anyhow::Result<_>>()?;
    let want = wanted(expected, reprocess_late)?;
    let mut lost = 0;
    let mut doubled = 0;
    for (key, want) in &want {
        match view.get(key) {
            Some(got) if got == want => {}
            Some(got) if got > want => doubled += 1,
            _ => lost += 1,
        }
    }
    let extra = view.keys().filter(|k| !want.contains_key(*k)).count();
    let final_report = report(final_state).context("the final run wrote no report")?;
    let mut c = crate::engine::Counters::default();
    for p in &final_report.partitions {
        c.add(&p.counters);
    }
    let late: BTreeSet<String> = read_topic(kafka, "requests.late")?
        .iter()
        .filter_map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.payload).ok()?["request_id"]
                .as_str()
                .map(String::from)
        })
        .collect();
    let dlq_sources: BTreeSet<String> = read_topic(kafka, "requests.dlq")?
        .iter()
        .filter_map(|r| r.header(headers::SOURCE).map(String::from))
        .collect();
    let want_late: BTreeSet<String> = expected
        .too_late
        .iter()
        .map(|l| l.request_id.clone())
        .collect();
    let dead: u64 = expected.dead_letters.values().sum();
    let adjusted = if reprocess_late {
        let rows = support::query(db, "SELECT request_id FROM tenant_cost_adjustment")?;
        let ids: BTreeSet<String> = rows.iter().filter_map(|r| r.first()?.clone()).collect();
        Some((rows.len() as u64, ids == want_late))
    } else {
        None
    };
    let audit_balanced = c.balanced() && final_report.balanced();
    let exact = lost == 0
        && doubled == 0
        && extra == 0
        && c.consumed == expected.records
        && c.too_late == expected.too_late.len() as u64
        && c.dead_letter == dead
        && c.duplicate == expected.duplicates
        && late == want_late
        && dlq_sources.len() as u64 == dead
        && adjusted.is_none_or(|(rows, same)| same && rows == want_late.len() as u64)
        && audit_balanced;
    Ok(Figures {
        lost,
        doubled,
        extra,
        c,
        late_on_topic: late.len() as u64,
        dead,
        dlq_sources: dlq_sources.len() as u64,
        adjustments: adjusted.map(|(rows, _)| rows),
        audit_balanced,
        exact,
    })
}

pub(super) fn print_report(r: &ChaosReport, produce_secs: f64, drained_secs: f64) {
    let count = r.records_generated;
    println!("\n== chaos report ==========================================================");
    println!("records generated        {count} in {produce_secs:.0} s; drained after {drained_secs:.0} s ({:.0} records/s overall)", count as f64 / drained_secs);
    println!(
        "workers / partitions     {} / {} (group protocol {})",
        r.workers, r.partitions, r.group_protocol
    );
    let l = &r.faults;
    println!(
        "kills                    {} ({} SIGKILL, {} at a crash point); sink kills {}; reprocess-late kills {}; zombies {}; PostgreSQL restarts {}; S3 outages {} (workers exited 4 in them: {}); broker down {}, slow {}; leader changes {}; unexpected exits {}",
        r.kills, l.kills, l.crash_point_kills, l.sink_kills, l.reprocess_kills, l.zombies, l.pg_restarts, l.s3_outages, l.s3_exits, l.broker_downs, l.broker_slows, l.leader_changes, l.unexpected_exits
    );
    println!(
        "windows compared         {} (extra in view: {})",
        r.windows_compared, r.extra_windows
    );
    println!("lost windows             {}", r.lost_windows);
    println!("double-counted windows   {}", r.double_counted_windows);
    println!(
        "records consumed         {} (expected {})",
        r.records_consumed, r.records_expected
    );
    println!(
        "too late                 {} (injected {}; distinct on late topic {})",
        r.too_late, r.too_late_injected, r.too_late_distinct_on_topic
    );
    println!(
        "dead letters             {} (injected {}; distinct sources on DLQ {})",
        r.dead_letters, r.dead_letters_injected, r.dead_letter_sources_on_topic
    );
    if let Some(a) = r.adjustments {
        println!(
            "adjustments              {a} (too-late events {}, each billed once)",
            r.too_late_injected
        );
    }
    println!(
        "duplicates               {} (injected {})",
        r.duplicates, r.duplicates_injected
    );
    println!(
        "recovery after kill      p50 {:.1} s, p99 {:.1} s, max {:.1} s over {} kills with owned partitions ({} never observed)",
        r.recovery_p50_s,
        r.recovery_p99_s,
        r.recovery_max_s,
        r.recoveries_observed,
        r.recoveries_never_observed
    );
    let rss: Vec<String> = r.peak_rss_mib.iter().map(|m| format!("{m} MiB")).collect();
    println!("peak RSS per worker      {}", rss.join(", "));
    println!("audit balanced           {}", r.audit_balanced);
}

#[cfg(test)]
mod tests {
    use super::pct;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v = [4.2, 1.0, 1.2, 1.6, 1.7, 1.3, 1.1];
        // Fewer than 100 values: p99 is the maximum, never below it.
        assert_eq!(pct(&v, 99), 4.2);
        assert_eq!(pct(&v, 50), 1.3);
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&hundred, 99), 99.0);
        assert_eq!(pct(&hundred, 50), 50.0);
        assert_eq!(pct(&[], 99), 0.0);
    }
}
