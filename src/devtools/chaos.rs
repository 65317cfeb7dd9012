//! `tally-dev chaos`: the scale-out acceptance run. A dev broker, N workers in one
//! consumer group over a 12-partition topic, the sink, and the generator at a steady
//! rate with late, duplicate and malformed records; a random worker (sometimes two)
//! is SIGKILLed every few seconds and restarted after a random delay. At the end the
//! tail is drained and the PostgreSQL view is compared with the generator's exact
//! expectation. Prints one report (and writes it as JSON with `--json`); exits
//! non-zero unless every figure is exact.
//!
//! All parts are separate `tally` processes (the binary beside this one), as in
//! production. A run follows a `Plan` (from the flags, or drawn from a seed with
//! `--replay`); `run_plan` is the one run code, which the campaign
//! (`tally-dev chaos-campaign`, `campaign`) calls once per run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

pub mod campaign;
pub mod campaign_report;
mod fault_log;
mod faults;
mod kills;
mod outcome;
pub mod plan;
mod s3_proxy;
mod spawn;

pub use faults::{Event, FaultLog};
use faults::{Faults, Outside};
use kills::{stop_workers, Worker};
pub use outcome::ChaosReport;
use outcome::{compare, print_report};
use plan::{FaultMix, Plan};
use s3_proxy::S3Proxy;
use spawn::Spawner;

use super::support::{self, signal, tally_beside_me};
use crate::base::duration::Millis;
use crate::gen::Expected;

#[derive(Args, Debug)]
pub struct ChaosArgs {
    /// PostgreSQL for the sink (a fresh database is created in it).
    #[arg(long, env = "TALLY_CHAOS_DATABASE_URL")]
    pub database_url: String,
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    #[arg(long, default_value_t = 12)]
    pub partitions: i32,
    /// How long the generator produces.
    #[arg(long, default_value = "10m")]
    pub duration: String,
    /// Generated records per second.
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,
    /// Shortest and longest time between kills.
    #[arg(long, default_value = "15s")]
    pub kill_min: String,
    #[arg(long, default_value = "30s")]
    pub kill_max: String,
    /// Shortest and longest delay before a killed worker is restarted. The default
    /// waits out the session timeout (6 s), so survivors take over the orphans
    /// first; shorter delays exercise restarts racing the takeover.
    #[arg(long, default_value = "7s")]
    pub restart_min: String,
    #[arg(long, default_value = "12s")]
    pub restart_max: String,
    /// Fail unless at least this many kills happened.
    #[arg(long, default_value_t = 20)]
    pub min_kills: usize,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Kafka group protocol of the workers: `consumer` (KIP-848: the broker assigns
    /// incrementally; session timeout 6 s, set on the dev broker) or `classic`
    /// (JoinGroup/SyncGroup, eager assignment, 6 s session timeout; the dev broker's
    /// classic rebalance waits up to a further session timeout after an eviction,
    /// so recovery takes about twice as long).
    /// `cooperative-sticky` is the classic protocol with incremental assignment.
    #[arg(long, default_value = "consumer", value_parser = plan::PROTOCOLS)]
    pub group_protocol: String,
    /// Static membership: worker i runs with `group.instance.id = chaos-w<i>`, so
    /// a restarted worker gets its own partitions back without a rebalance.
    #[arg(long)]
    pub static_membership: bool,
    /// The group session timeout (classic: `session.timeout.ms`; KIP-848: the
    /// dev broker's `--group-session-timeout`).
    #[arg(long, default_value = "6s")]
    pub session_timeout: String,
    /// Replay one campaign run: draw the whole plan (layout, workers, store,
    /// protocol, membership, timings, faults) from this seed, as the campaign
    /// did; the flags above that the plan sets are then ignored.
    #[arg(long, value_name = "SEED")]
    pub replay: Option<u64>,
    /// The PostgreSQL cluster's `scripts/pg.sh` directory: lets a replayed plan
    /// restart PostgreSQL (`scripts/pg.sh restart DIR`, run from the repository).
    #[arg(long, env = "TALLY_CHAOS_PG_DIR", value_name = "DIR")]
    pub pg_dir: Option<PathBuf>,
    /// Keep the checkpoints in this S3-compatible server (bucket `tally`, a prefix
    /// of this run) instead of a local directory; credentials from `AWS_*`.
    #[arg(long, env = "TALLY_CHAOS_S3_ENDPOINT", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// Keep the working directory.
    #[arg(long)]
    pub keep: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

fn dur(s: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_millis(
        Millis::parse(s).map_err(anyhow::Error::msg)?.0 as u64,
    ))
}

fn run_ok(cmd: &mut Command, what: &str) -> anyhow::Result<std::process::Output> {
    let out = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| what.to_string())?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// The services a run uses, and how it reports.
pub struct Services {
    /// PostgreSQL admin URL (each run creates, and unless `keep` drops, a database).
    pub database_url: String,
    pub s3_endpoint: Option<String>,
    /// `scripts/pg.sh` directory, for PostgreSQL restarts.
    pub pg_dir: Option<PathBuf>,
    pub keep: bool,
    /// Print each fault and the full report.
    pub verbose: bool,
}

/// The plan of the flags (or, with `--replay`, of the seed).
fn plan_of(a: &ChaosArgs) -> anyhow::Result<Plan> {
    if let Some(seed) = a.replay {
        return Ok(Plan::draw(
            seed,
            a.s3_endpoint.is_some(),
            a.pg_dir.is_some(),
        ));
    }
    let ms = |s: &str| dur(s).map(|d| d.as_millis() as u64);
    let plan = Plan {
        seed: a.seed,
        workers: a.workers,
        partitions: a.partitions,
        duration_ms: ms(&a.duration)?,
        rate: a.rate,
        kill_min_ms: ms(&a.kill_min)?,
        kill_max_ms: ms(&a.kill_max)?,
        restart_min_ms: ms(&a.restart_min)?,
        restart_max_ms: ms(&a.restart_max)?,
        group_protocol: a.group_protocol.clone(),
        static_membership: a.static_membership,
        store: if a.s3_endpoint.is_some() {
            "s3"
        } else {
            "local"
        }
        .into(),
        session_timeout_ms: ms(&a.session_timeout)?,
        faults: FaultMix::default(),
        reprocess_late: false,
    };
    anyhow::ensure!(
        plan.kill_min_ms <= plan.kill_max_ms && plan.restart_min_ms <= plan.restart_max_ms,
        "min must not exceed max"
    );
    Ok(plan)
}

pub fn run(a: ChaosArgs) -> anyhow::Result<()> {
    let plan = plan_of(&a)?;
    let services = Services {
        database_url: a.database_url.clone(),
        s3_endpoint: a.s3_endpoint.clone(),
        pg_dir: a.pg_dir.clone(),
        keep: a.keep,
        verbose: true,
    };
    let report = run_plan(&plan, &services)?;
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    anyhow::ensure!(report.exact, "chaos run NOT exact (see the report above)");
    anyhow::ensure!(
        a.replay.is_some() || report.kills >= a.min_kills,
        "only {} kills (wanted at least {})",
        report.kills,
        a.min_kills
    );
    println!("result                   EXACT");
    Ok(())
}

/// Campaign runs at once share the PostgreSQL cluster: a run's restart of it
/// (a fault) waits for the others' one-shot statements (create, compare, drop),
/// which hold this for reading; the sinks' reconnects are what the fault tests.
static PG_RESTARTS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Holds PostgreSQL up (no fault restarts it) while the guard lives.
fn pg_steady() -> std::sync::RwLockReadGuard<'static, ()> {
    PG_RESTARTS.read().unwrap_or_else(|p| p.into_inner())
}

/// Holds off the other runs' one-shot statements while PostgreSQL restarts.
pub(super) fn pg_restarting() -> std::sync::RwLockWriteGuard<'static, ()> {
    PG_RESTARTS.write().unwrap_or_else(|p| p.into_inner())
}

/// One chaos run of `plan`: services up, faults until the generator is done,
/// the drain, the tail, the comparison. Returns the report (exact or not); an
/// error is a run that could not be carried out.
pub fn run_plan(plan: &Plan, sv: &Services) -> anyhow::Result<ChaosReport> {
    let tag = format!("{}-{}", std::process::id(), plan.seed);
    let dir = std::env::temp_dir().join(format!("tally-chaos-{tag}"));
    std::fs::create_dir_all(&dir)?;
    let exe = tally_beside_me()?;
    let broker_ctl = dir.join("broker.ctl");
    let broker = start_broker(&exe, plan, &broker_ctl)?;
    let bootstrap = broker.bootstrap.clone();
    let (db_name, db) = run_database(plan, sv)?;
    // Checkpoints on S3 go through the run's proxy, which the faults take down.
    let proxy = match (&sv.s3_endpoint, plan.store.as_str()) {
        (Some(endpoint), "s3") => Some(S3Proxy::start(endpoint)?),
        _ => None,
    };
    let endpoint = proxy.as_ref().map(S3Proxy::endpoint);
    let cfg = write_config(plan, endpoint.as_deref(), &dir, &bootstrap, &db)?;
    let cfg_s = cfg.to_str().context("config path")?.to_string();
    let count = plan.rate * (plan.duration_ms / 1000).max(1);
    let gen_args = gen_args(plan, &cfg_s, count);
    let expected = expectation(&exe, &gen_args, &dir)?;

    let spawn = Spawner {
        exe: exe.clone(),
        cfg: cfg.clone(),
        static_membership: plan.static_membership,
    };
    let workers = start_workers(plan, &spawn, &dir)?;
    let sink = spawn.sink(None)?;
    let reprocess = plan
        .reprocess_late
        .then(|| spawn.reprocess("earliest"))
        .transpose()?;
    let started = Instant::now();
    let mut gen = Command::new(&exe)
        .args(&gen_args)
        .args(["--rate", &plan.rate.to_string()])
        .env("TALLY_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    if sv.verbose {
        println!("chaos: {}", plan.describe(count));
    }
    let kafka = crate::config::KafkaConfig {
        bootstrap_servers: bootstrap.clone(),
        ..Default::default()
    };
    let outside = Outside {
        pg_dir: sv.pg_dir.as_deref(),
        s3: proxy.as_ref(),
        broker_ctl: Some(&broker_ctl),
        kafka: Some(&kafka),
    };
    let mut faults = Faults::new(
        plan,
        &spawn,
        outside,
        workers,
        (sink, reprocess),
        sv.verbose,
    );
    let (produced, undrained) = faults_then_drain(&mut faults, &mut gen, &kafka, plan.partitions)?;
    let produce_secs = (produced - started).as_secs_f64();
    let Faults {
        mut workers,
        sink,
        reprocess,
        log,
        ..
    } = faults;
    let drained_secs = started.elapsed().as_secs_f64();
    let hung = stop_workers(&mut workers)?;
    let final_state = dir.join("state-final");
    // The tail and the comparison read PostgreSQL once: no restart meanwhile.
    let pg = pg_steady();
    tail(
        &exe,
        &cfg_s,
        &final_state,
        sink,
        (plan.reprocess_late, reprocess),
    )?;

    let f = compare(&db, &expected, &final_state, &kafka, plan.reprocess_late)?;
    drop(pg);
    let mut report = ChaosReport::new(plan, count, &expected, log, &f, &workers);
    report.phases_s = [produce_secs, drained_secs, started.elapsed().as_secs_f64()];
    report.faults.hung_at_stop = hung;
    report.faults.undrained_partitions = undrained;
    if sv.verbose {
        print_report(&report, produce_secs, drained_secs);
    }
    drop(broker);
    clean_up(&report, sv, &dir, &db_name);
    Ok(report)
}

/// A fresh database for the run's sink: its name and URL.
fn run_database(plan: &Plan, sv: &Services) -> anyhow::Result<(String, String)> {
    let name = format!(
        "chaos_{}_{}_{}",
        std::process::id(),
        plan.seed,
        crate::base::clock::now_ms()
    );
    let _pg = pg_steady();
    let url = support::create_database(&sv.database_url, &name)?;
    Ok((name, url))
}

/// Removes a run's directory and database — unless `--keep`, or the run did not
/// pass: its logs are what tell why.
fn clean_up(report: &ChaosReport, sv: &Services, dir: &Path, db_name: &str) {
    let passed =
        report.exact && report.faults.unexpected_exits == 0 && report.faults.never_recovered == 0;
    if !passed {
        println!("  run kept in {}", dir.display());
    }
    if !sv.keep && passed {
        let _ = std::fs::remove_dir_all(dir);
        let _pg = pg_steady();
        let _ = support::execute(&sv.database_url, &format!("DROP DATABASE {db_name}"));
    }
}

/// The faults until the generator is done and everything settled, then the
/// drain (the live workers consume everything); returns when the faults ended
/// and the partitions left undrained. A run that cannot go on kills what it
/// started.
fn faults_then_drain(
    faults: &mut Faults,
    gen: &mut Child,
    kafka: &crate::config::KafkaConfig,
    partitions: i32,
) -> anyhow::Result<(Instant, Vec<i32>)> {
    let ran = faults.run(gen, (kafka, partitions));
    let produced = Instant::now();
    match ran.and_then(|()| faults.drain(kafka, partitions)) {
        Ok(undrained) => Ok((produced, undrained)),
        Err(e) => {
            faults.kill_all();
            let _ = gen.kill();
            Err(e)
        }
    }
}

/// The run's workers, each with its own state directory in `dir`.
fn start_workers(plan: &Plan, spawn: &Spawner, dir: &Path) -> anyhow::Result<Vec<Worker>> {
    (0..plan.workers)
        .map(|i| {
            let state = dir.join(format!("state-{i}"));
            Ok(Worker {
                child: Some(spawn.worker(i, &state, None)?),
                state,
                peak_rss_kb: 0,
                stopped: false,
                armed: None,
            })
        })
        .collect()
}

/// The dev broker's brokers in a chaos run: leader changes move partitions
/// among them.
pub const BROKERS: i32 = 3;

/// Partitions of the run's results topic.
pub const RESULTS_PARTITIONS: i32 = 4;

/// The dev broker with the run's topics (and, for KIP-848 groups, its session
/// timeout).
fn start_broker(exe: &Path, plan: &Plan, ctl: &Path) -> anyhow::Result<support::DevBroker> {
    let timeout = format!("{}ms", plan.session_timeout_ms);
    support::DevBroker::start_with(
        exe,
        &[
            ("requests", plan.partitions),
            ("tenant-cost", RESULTS_PARTITIONS),
            ("requests.late", 4),
            ("requests.dlq", 4),
        ],
        &[
            "--group-session-timeout".as_ref(),
            timeout.as_ref(),
            "--control-file".as_ref(),
            ctl.as_os_str(),
            "--brokers".as_ref(),
            BROKERS.to_string().as_ref(),
        ],
    )
}

/// The tail: `reprocess-late --follow` stops (recording its position); one
/// bounded run closes the last windows (end of input); a bounded
/// `reprocess-late --from group` bills what is left of the late topic; then the
/// sink stops and one bounded sink run applies everything.
fn tail(
    exe: &Path,
    cfg: &str,
    final_state: &Path,
    sink: Option<Child>,
    (reprocess_late, follower): (bool, Option<Child>),
) -> anyhow::Result<()> {
    if let Some(mut r) = follower {
        signal(r.id(), libc::SIGTERM);
        r.wait()?;
    }
    run_ok(
        Command::new(exe)
            .args(["run", "--config", cfg, "--until-end"])
            .env("TALLY_STATE__DIR", final_state),
        "the final drain",
    )?;
    if reprocess_late {
        run_ok(
            Command::new(exe).args(["reprocess-late", "--config", cfg, "--from", "group"]),
            "the final reprocess-late run",
        )?;
    }
    if let Some(mut sink) = sink {
        signal(sink.id(), libc::SIGTERM);
        sink.wait()?;
    }
    run_ok(
        Command::new(exe).args(["sink", "--config", cfg, "--until-end"]),
        "the final sink run",
    )?;
    Ok(())
}

/// Writes the run's config into `dir` and returns its path.
fn write_config(
    plan: &Plan,
    s3_endpoint: Option<&str>,
    dir: &Path,
    bootstrap: &str,
    db: &str,
) -> anyhow::Result<PathBuf> {
    let cfg = dir.join("chaos.toml");
    let checkpoints = match (s3_endpoint, plan.store.as_str()) {
        (Some(endpoint), "s3") => format!(
            "dir = \"s3://tally/chaos-{}-{}-{}\"\nobject_store = {{ aws_endpoint = \"{endpoint}\", \
             aws_allow_http = \"true\" }}",
            std::process::id(),
            plan.seed,
            crate::base::clock::now_ms()
        ),
        (None, "s3") => bail!("the plan keeps checkpoints on S3: give --s3-endpoint"),
        _ => format!("dir = \"{}/checkpoints\"", dir.display()),
    };
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\nbootstrap_servers = \"{bootstrap}\"\ngroup_id = \"chaos\"\n{group}\
             [checkpoint]\n{checkpoints}\ninterval = \"1s\"\n[state]\ndir = \"{d}/state\"\n\
             [window]\nallowed_lateness = \"10s\"\n[sink]\ndatabase_url = \"{db}\"\n\
             [prices.small]\ninput_per_1k = \"0.00015\"\noutput_per_1k = \"0.0006\"\n\
             [prices.medium]\ninput_per_1k = \"0.003\"\noutput_per_1k = \"0.015\"\n\
             [prices.large]\ninput_per_1k = \"0.05\"\noutput_per_1k = \"0.10\"\n",
            d = dir.display(),
            group = plan.kafka_properties(),
        ),
    )?;
    Ok(cfg)
}

/// The arguments of `tally gen` for this run (the offline expectation and the
/// live generator share them).
fn gen_args(plan: &Plan, cfg: &str, count: u64) -> Vec<String> {
    [
        "gen",
        "--config",
        cfg,
        "--count",
        &count.to_string(),
        "--tenants",
        "60",
        "--seed",
        &plan.seed.to_string(),
        "--late-fraction",
        "0.01",
        "--duplicate-fraction",
        "0.02",
        "--malformed-fraction",
        "0.005",
        "--partitions",
        &plan.partitions.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The generator's expectation for `gen_args`, computed offline.
fn expectation(exe: &Path, gen_args: &[String], dir: &Path) -> anyhow::Result<Expected> {
    let expected_path = dir.join("expected.json");
    run_ok(
        Command::new(exe)
            .args(gen_args)
            .args([
                "--output-file",
                dir.join("offline.jsonl").to_str().unwrap_or_default(),
                "--expected-file",
            ])
            .arg(&expected_path),
        "computing the expected totals",
    )?;
    let expected: Expected = serde_json::from_slice(&std::fs::read(&expected_path)?)?;
    let _ = std::fs::remove_file(dir.join("offline.jsonl"));
    Ok(expected)
}
