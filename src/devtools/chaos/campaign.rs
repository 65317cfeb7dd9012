//! `tally-dev chaos-campaign`: many short chaos runs back to back. Run k's seed
//! is drawn from the master seed; its plan (topic layout, workers, store,
//! protocol, membership, timings, fault mix) is drawn from its seed
//! (`Plan::draw`), and `run_plan` carries it out with the single run's code and
//! exact checks. After every run the campaign rewrites its JSON report and its
//! Markdown summary (`campaign_report`), so a campaign cut short still leaves
//! both; a failing run prints its seed and the one command that replays it.
//!
//! `--parallel` runs go on at once, each with services of its own (broker,
//! database, S3 prefix, directory); the report lists them as they end.
//!
//! Invariant: the run seeds (drawn from the master seed, or given with
//! `--run-seeds`), and so the plans and schedules, depend only on those seeds and
//! the services given (S3 endpoint, PostgreSQL directory), not on `--parallel`.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use super::campaign_report::{CampaignReport, RunEntry};
use super::plan::Plan;
use super::{dur, run_plan, Services};
use crate::gen::Rng;

#[derive(Args, Debug)]
pub struct CampaignArgs {
    /// PostgreSQL for the sinks (each run creates and drops a database in it).
    #[arg(long, env = "TALLY_CHAOS_DATABASE_URL")]
    pub database_url: String,
    /// An S3-compatible server: runs then draw their checkpoint store between a
    /// local directory and S3 (bucket `tally`); credentials from `AWS_*`.
    #[arg(long, env = "TALLY_CHAOS_S3_ENDPOINT", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The PostgreSQL cluster's `scripts/pg.sh` directory: runs then also restart
    /// PostgreSQL (`scripts/pg.sh restart DIR`, run from the repository).
    #[arg(long, env = "TALLY_CHAOS_PG_DIR", value_name = "DIR")]
    pub pg_dir: Option<PathBuf>,
    /// The master seed: it draws every run's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop once this many kills (workers and sink) happened.
    #[arg(long, default_value_t = 1000)]
    pub kills: usize,
    /// Start no run after this long.
    #[arg(long, default_value = "60m")]
    pub budget: String,
    /// At most this many runs.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Run exactly these run seeds, in order, instead of those the master seed
    /// draws (a fixed seed set, as the CI slice runs; each replays alone with
    /// `--replay`).
    #[arg(long, value_delimiter = ',', value_name = "SEED,...")]
    pub run_seeds: Vec<u64>,
    /// Runs at a time, each with its own dev broker, database, S3 prefix and
    /// processes: a run's processes use a fraction of a core, and its recoveries
    /// wait on session timeouts, not on the CPU.
    #[arg(long, default_value_t = 3)]
    pub parallel: usize,
    /// Where campaign.json and campaign.md go.
    #[arg(long, default_value = "target/chaos-campaign", value_name = "DIR")]
    pub out: PathBuf,
    /// The command a failing run's replay line starts with.
    #[arg(long, default_value = "scripts/chaos.sh")]
    pub replay_with: String,
}

/// The run seeds of master seed `seed`, in order.
pub fn run_seeds(seed: u64) -> impl Iterator<Item = u64> {
    let mut rng = Rng::new(seed);
    std::iter::repeat_with(move || 1 + rng.below(999_999_999))
}

/// The one command that replays run `seed` of a campaign with these services.
pub fn replay_command(a: &CampaignArgs, seed: u64) -> String {
    let mut env = String::new();
    if a.s3_endpoint.is_none() {
        env.push_str("CHAOS_STORE=local ");
    }
    if a.pg_dir.is_none() {
        env.push_str("CHAOS_PG_RESTARTS=0 ");
    }
    format!("{env}{} --replay {seed}", a.replay_with)
}

/// What the runs of a campaign share: the report, and the seeds not run yet.
struct Shared {
    report: CampaignReport,
    seeds: Box<dyn Iterator<Item = u64> + Send>,
    started: usize,
}

pub fn run(a: CampaignArgs) -> anyhow::Result<()> {
    let budget = dur(&a.budget)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let services = Services {
        database_url: a.database_url.clone(),
        s3_endpoint: a.s3_endpoint.clone(),
        pg_dir: a.pg_dir.clone(),
        keep: false,
        verbose: false,
    };
    let started = Instant::now();
    println!(
        "chaos campaign: master seed {}, until {} kills or {}, {} runs at a time (report in {})",
        a.seed,
        a.kills,
        a.budget,
        a.parallel,
        a.out.display()
    );
    let seeds: Box<dyn Iterator<Item = u64> + Send> = if a.run_seeds.is_empty() {
        Box::new(run_seeds(a.seed))
    } else {
        Box::new(a.run_seeds.clone().into_iter())
    };
    let shared = Mutex::new(Shared {
        report: CampaignReport::new(a.seed, a.s3_endpoint.is_some(), a.pg_dir.is_some()),
        seeds,
        started: 0,
    });
    // The next run to start, unless the campaign is over.
    let next = || -> Option<(usize, u64)> {
        let mut sh = shared.lock().unwrap_or_else(|p| p.into_inner());
        let over = sh.report.totals.kills >= a.kills
            || started.elapsed() >= budget
            || a.runs.is_some_and(|n| sh.started >= n)
            || crate::base::shutdown::requested();
        let seed = if over { None } else { sh.seeds.next() }?;
        sh.started += 1;
        Some((sh.started - 1, seed))
    };
    let lane = || -> anyhow::Result<()> {
        while let Some((k, seed)) = next() {
            let plan = Plan::draw(seed, a.s3_endpoint.is_some(), a.pg_dir.is_some());
            let t = Instant::now();
            let outcome = run_plan(&plan, &services);
            let entry = RunEntry::new(plan, outcome, t.elapsed(), replay_command(&a, seed));
            let mut sh = shared.lock().unwrap_or_else(|p| p.into_inner());
            println!("{}", entry.line(k));
            if !entry.passed {
                println!("  FAILED: seed {seed}; replay with: {}", entry.replay);
            }
            sh.report.push(entry, started.elapsed());
            sh.report.write(&a.out)?;
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let lanes: Vec<_> = (0..a.parallel.max(1)).map(|_| s.spawn(lane)).collect();
        lanes
            .into_iter()
            .try_for_each(|l| l.join().expect("a campaign lane panicked"))
    })?;
    let report = shared
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .report;
    println!("\n{}", report.markdown());
    let failed: Vec<&RunEntry> = report.runs.iter().filter(|r| !r.passed).collect();
    for r in &failed {
        println!(
            "failed run: seed {}; replay with: {}",
            r.plan.seed, r.replay
        );
    }
    anyhow::ensure!(
        failed.is_empty(),
        "{} of {} runs failed",
        failed.len(),
        report.runs.len()
    );
    Ok(())
}
