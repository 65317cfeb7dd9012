//! A chaos campaign's report: every run (seed, plan, faults and their times,
//! figures, replay command), the totals, and the recovery time distribution per
//! group protocol and checkpoint store (and membership), as JSON
//! (`campaign.json`) and as a Markdown summary (`campaign.md`).
//!
//! Invariant: the totals and the distributions are computed from the runs alone,
//! after every run, so the two files always agree with the runs they list.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::outcome::{pct, ChaosReport};
use super::plan::Plan;

/// One run of a campaign.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunEntry {
    pub plan: Plan,
    pub seconds: f64,
    /// Exact, every kill recovered, no process exited unexpectedly.
    pub passed: bool,
    /// Why the run could not be carried out, if it could not.
    pub error: Option<String>,
    pub report: Option<ChaosReport>,
    /// The one command that replays this run.
    pub replay: String,
}

impl RunEntry {
    pub fn new(
        plan: Plan,
        outcome: anyhow::Result<ChaosReport>,
        took: Duration,
        replay: String,
    ) -> Self {
        let (report, error) = match outcome {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        let passed = report.as_ref().is_some_and(|r| {
            r.exact && r.faults.never_recovered == 0 && r.faults.unexpected_exits == 0
        });
        RunEntry {
            plan,
            seconds: took.as_secs_f64(),
            passed,
            error,
            report,
            replay,
        }
    }

    /// Kills of workers, of the sink and of `reprocess-late --follow`.
    pub fn kills(&self) -> usize {
        self.report
            .as_ref()
            .map(|r| r.kills + r.faults.sink_kills + r.faults.reprocess_kills)
            .unwrap_or(0)
    }

    /// One line for the console.
    pub fn line(&self, k: usize) -> String {
        let p = &self.plan;
        let what = match (&self.report, &self.error) {
            (Some(r), _) => format!(
                "{} kills ({} at crash points, {} sink, {} reprocess-late), {} zombies, {} pg restarts, \
                 {} S3 outages, broker {} down {} slow, {} leader changes, recovery p99 {:.1} s, faults done {:.0} s, \
                 drained {:.0} s, {}",
                self.kills(),
                r.faults.crash_point_kills,
                r.faults.sink_kills,
                r.faults.reprocess_kills,
                r.faults.zombies,
                r.faults.pg_restarts,
                r.faults.s3_outages,
                r.faults.broker_downs,
                r.faults.broker_slows,
                r.faults.leader_changes,
                r.recovery_p99_s,
                r.phases_s[0],
                r.phases_s[1],
                if self.passed { "exact" } else { "FAILED" }
            ),
            (None, Some(e)) => format!("ERROR {e}"),
            (None, None) => "no outcome".into(),
        };
        format!(
            "run {k:>3} seed {:>9}: {:>2} partitions, {} workers, {} {}, {}: {what} ({:.0} s)",
            p.seed,
            p.partitions,
            p.workers,
            p.group_protocol,
            if p.static_membership {
                "static"
            } else {
                "dynamic"
            },
            p.store,
            self.seconds
        )
    }
}

/// The campaign's totals.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Totals {
    pub runs: usize,
    pub passed: usize,
    pub failed: usize,
    /// Worker, sink and `reprocess-late --follow` kills.
    pub kills: usize,
    pub worker_sigkills: usize,
    pub crash_point_kills: usize,
    pub sink_kills: usize,
    pub zombies: usize,
    pub pg_restarts: usize,
    #[serde(default)]
    pub reprocess_kills: usize,
    #[serde(default)]
    pub s3_outages: usize,
    /// Workers that exited 4 (checkpoint store unavailable) in an S3 outage.
    #[serde(default)]
    pub s3_exits: usize,
    #[serde(default)]
    pub broker_downs: usize,
    #[serde(default)]
    pub broker_slows: usize,
    #[serde(default)]
    pub leader_changes: usize,
    /// Runs that ran `reprocess-late --follow` (their late sets billed once).
    #[serde(default)]
    pub reprocess_runs: usize,
    pub unexpected_exits: usize,
    #[serde(default)]
    pub hung_at_stop: usize,
    /// Runs whose workers had not drained the input 300 s after the faults.
    #[serde(default)]
    pub drain_timeouts: usize,
    pub lost_windows: usize,
    pub double_counted_windows: usize,
    pub extra_windows: usize,
    pub windows_compared: usize,
    pub records_generated: u64,
    pub audits_balanced: usize,
    pub exact_runs: usize,
    pub never_recovered: usize,
    /// Worker deaths whose partitions a later death orphaned again before they
    /// moved on (timed with the later one).
    #[serde(default)]
    pub superseded: usize,
    pub elapsed_s: f64,
    pub kills_per_minute: f64,
}

/// The recovery times of one class of runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recovery {
    pub class: String,
    pub recoveries: usize,
    pub p50_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    /// Session timeout + 5 s.
    pub target_s: f64,
    pub within_target: bool,
    /// Of the same recoveries timed from the first death they cover.
    #[serde(default)]
    pub stall_p99_s: f64,
    #[serde(default)]
    pub stall_max_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CampaignReport {
    pub master_seed: u64,
    pub s3: bool,
    pub pg_restarts: bool,
    pub totals: Totals,
    /// Per protocol (the target is per protocol).
    #[serde(default)]
    pub recovery_by_protocol: Vec<Recovery>,
    /// Per protocol and store.
    pub recovery: Vec<Recovery>,
    /// Per protocol, store and membership.
    pub recovery_by_membership: Vec<Recovery>,
    /// Per protocol and store, of the isolated kills only (no other fault between
    /// the death and the recovery).
    #[serde(default)]
    pub recovery_isolated: Vec<Recovery>,
    pub runs: Vec<RunEntry>,
}

impl CampaignReport {
    pub fn new(master_seed: u64, s3: bool, pg_restarts: bool) -> Self {
        CampaignReport {
            master_seed,
            s3,
            pg_restarts,
            totals: Totals::default(),
            recovery_by_protocol: Vec::new(),
            recovery: Vec::new(),
            recovery_by_membership: Vec::new(),
            recovery_isolated: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// Adds a run and recomputes the totals and distributions.
    pub fn push(&mut self, run: RunEntry, elapsed: Duration) {
        self.runs.push(run);
        let mut t = Totals {
            runs: self.runs.len(),
            elapsed_s: elapsed.as_secs_f64(),
            ..Totals::default()
        };
        for run in &self.runs {
            t.passed += usize::from(run.passed);
            t.kills += run.kills();
            let Some(r) = &run.report else { continue };
            let f = &r.faults;
            t.worker_sigkills += f.kills;
            t.crash_point_kills += f.crash_point_kills;
            t.sink_kills += f.sink_kills;
            t.zombies += f.zombies;
            t.pg_restarts += f.pg_restarts;
            t.reprocess_kills += f.reprocess_kills;
            t.s3_outages += f.s3_outages;
            t.s3_exits += f.s3_exits;
            t.broker_downs += f.broker_downs;
            t.broker_slows += f.broker_slows;
            t.leader_changes += f.leader_changes;
            t.reprocess_runs += usize::from(r.adjustments.is_some());
            t.unexpected_exits += f.unexpected_exits;
            t.hung_at_stop += f.hung_at_stop;
            t.drain_timeouts += usize::from(!f.undrained_partitions.is_empty());
            t.never_recovered += f.never_recovered;
            t.superseded += f.superseded;
            t.lost_windows += r.lost_windows;
            t.double_counted_windows += r.double_counted_windows;
            t.extra_windows += r.extra_windows;
            t.windows_compared += r.windows_compared;
            t.records_generated += r.records_generated;
            t.audits_balanced += usize::from(r.audit_balanced);
            t.exact_runs += usize::from(r.exact);
        }
        t.failed = t.runs - t.passed;
        t.kills_per_minute = t.kills as f64 / (t.elapsed_s / 60.0).max(1e-9);
        self.totals = t;
        let by_store = |p: &Plan| format!("{} / {}", p.group_protocol, p.store);
        self.recovery_by_protocol = self.recovery_by(|p| p.group_protocol.clone(), false);
        self.recovery = self.recovery_by(by_store, false);
        self.recovery_by_membership = self.recovery_by(Plan::class, false);
        self.recovery_isolated = self.recovery_by(by_store, true);
    }

    fn recovery_by(&self, class: impl Fn(&Plan) -> String, isolated: bool) -> Vec<Recovery> {
        let mut by: BTreeMap<String, (Vec<f64>, Vec<f64>, f64)> = BTreeMap::new();
        for run in &self.runs {
            let Some(r) = &run.report else { continue };
            let e = by.entry(class(&run.plan)).or_insert((
                Vec::new(),
                Vec::new(),
                run.plan.recovery_target_s(),
            ));
            let f = &r.faults;
            let (times, stalls) = if isolated {
                (&f.isolated_recoveries, &f.isolated_recoveries)
            } else {
                (&f.recoveries, &f.stalls)
            };
            e.0.extend(times);
            e.1.extend(stalls);
            e.2 = e.2.min(run.plan.recovery_target_s());
        }
        by.into_iter()
            .map(|(class, (v, stalls, target_s))| {
                let p99_s = pct(&v, 99);
                Recovery {
                    class,
                    recoveries: v.len(),
                    p50_s: pct(&v, 50),
                    p99_s,
                    max_s: v.iter().copied().fold(0.0, f64::max),
                    target_s,
                    within_target: !v.is_empty() && p99_s <= target_s,
                    stall_p99_s: pct(&stalls, 99),
                    stall_max_s: stalls.iter().copied().fold(0.0, f64::max),
                }
            })
            .collect()
    }

    /// Writes `campaign.json` and `campaign.md` into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::write(dir.join("campaign.json"), serde_json::to_vec_pretty(self)?)?;
        std::fs::write(dir.join("campaign.md"), self.markdown())?;
        Ok(())
    }

    /// The Markdown summary.
    pub fn markdown(&self) -> String {
        let t = &self.totals;
        let mut s = format!(
            "### Chaos campaign, master seed {}\n\n\
             {} runs in {:.1} min ({} passed, {} failed); **{} kills** ({} worker SIGKILLs, \
             {} workers dead at a crash point, {} sink kills, {} `reprocess-late --follow` kills \
             in {} runs that ran it), {:.1} kills/min; {} zombies \
             (SIGSTOP past the session timeout), {} PostgreSQL restarts, {} S3 outages ({} workers \
             exited 4 in them, as documented, and were restarted), the dev broker {} times down \
             and {} times slow, {} partition leaderships moved; {} unexpected exits; \
             {} workers not stopped 60 s after the final SIGTERM; {} runs not drained by the \
             workers 300 s after the faults.\n\n\
             | check | result |\n|---|---|\n\
             | lost windows | {} |\n| double-counted windows | {} |\n| extra windows | {} |\n\
             | windows compared (sink view vs generator) | {} |\n| records generated | {} |\n\
             | exact runs (view, counters, late and dead-letter sets) | {} / {} |\n\
             | audits balanced | {} / {} |\n| kills never recovered | {} |\n\
             | kills whose partitions a later death orphaned again (timed with it) | {} |\n\n",
            self.master_seed,
            t.runs,
            t.elapsed_s / 60.0,
            t.passed,
            t.failed,
            t.kills,
            t.worker_sigkills,
            t.crash_point_kills,
            t.sink_kills,
            t.reprocess_kills,
            t.reprocess_runs,
            t.kills_per_minute,
            t.zombies,
            t.pg_restarts,
            t.s3_outages,
            t.s3_exits,
            t.broker_downs,
            t.broker_slows,
            t.leader_changes,
            t.unexpected_exits,
            t.hung_at_stop,
            t.drain_timeouts,
            t.lost_windows,
            t.double_counted_windows,
            t.extra_windows,
            t.windows_compared,
            t.records_generated,
            t.exact_runs,
            t.runs,
            t.audits_balanced,
            t.runs,
            t.never_recovered,
            t.superseded,
        );
        s += &recovery_table("protocol", &self.recovery_by_protocol);
        s += &recovery_table("protocol / store", &self.recovery);
        s += &recovery_table(
            "protocol / store / membership",
            &self.recovery_by_membership,
        );
        s += &recovery_table(
            "isolated kills (no other fault until recovered): protocol / store",
            &self.recovery_isolated,
        );
        let failed: Vec<&RunEntry> = self.runs.iter().filter(|r| !r.passed).collect();
        if !failed.is_empty() {
            s += "Failed runs:\n\n";
            for r in failed {
                s += &format!(
                    "- seed {}: {} — replay: `{}`\n",
                    r.plan.seed,
                    r.error.as_deref().unwrap_or("not exact or not recovered"),
                    r.replay
                );
            }
            s += "\n";
        }
        s
    }
}

fn recovery_table(title: &str, rows: &[Recovery]) -> String {
    let mut s = format!(
        "| {title} | recoveries | p50 | p99 | max | target (session + 5 s) | from the first death: p99, max |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {:.1} s | {:.1} s | {:.1} s | {:.0} s {} | {:.1} s, {:.1} s |\n",
            r.class,
            r.recoveries,
            r.p50_s,
            r.p99_s,
            r.max_s,
            r.target_s,
            match (r.recoveries, r.within_target) {
                (0, _) => "(none)",
                (_, true) => "met",
                _ => "**missed**",
            },
            r.stall_p99_s,
            r.stall_max_s,
        );
    }
    s + "\n"
}
