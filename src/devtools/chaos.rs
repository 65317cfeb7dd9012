//! `tally-dev chaos`: the scale-out acceptance run. A dev broker, N workers in one
//! consumer group over a 12-partition topic, the sink, and the generator at a steady
//! rate with late, duplicate and malformed records; a random worker (sometimes two)
//! is SIGKILLed every few seconds and restarted after a random delay. At the end the
//! tail is drained and the PostgreSQL view is compared with the generator's exact
//! expectation. Prints one report (and writes it as JSON with `--json`); exits
//! non-zero unless every figure is exact.
//!
//! All parts are separate `tally` processes (the binary beside this one), as in
//! production.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

mod kills;
mod outcome;

use kills::{drain, kill_loop, stop_workers, Timing, Worker};
pub use outcome::ChaosReport;
use outcome::{compare, print_report};

use super::support::{self, signal, tally_beside_me};
use crate::base::duration::Millis;
use crate::gen::{Expected, Rng};

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
    #[arg(long, default_value = "consumer", value_parser = ["classic", "consumer"])]
    pub group_protocol: String,
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

pub fn run(a: ChaosArgs) -> anyhow::Result<()> {
    let timing = Timing::parse(&a)?;
    let dir = std::env::temp_dir().join(format!("tally-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let exe = tally_beside_me()?;
    let mut rng = Rng::new(a.seed);

    let broker = start_broker(&exe, a.partitions)?;
    let bootstrap = broker.bootstrap.clone();
    let db = support::create_database(&a.database_url, &format!("chaos_{}", std::process::id()))?;
    let cfg = write_config(&a, &dir, &bootstrap, &db)?;
    let cfg_s = cfg.to_str().context("config path")?.to_string();
    let count = a.rate * timing.duration.as_secs().max(1);
    let gen_args = gen_args(&a, &cfg_s, count);
    let expected = expectation(&exe, &gen_args, &dir)?;

    // Each worker logs to <state>.log (appended across restarts; kept with --keep).
    let spawn_worker = |state: &Path| support::spawn_worker(&exe, &cfg, state, &[]);
    let mut workers: Vec<Worker> = (0..a.workers)
        .map(|i| {
            let state = dir.join(format!("state-{i}"));
            Ok(Worker {
                child: Some(spawn_worker(&state)?),
                state,
                peak_rss_kb: 0,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let mut sink = Command::new(&exe)
        .args(["sink", "--config", &cfg_s])
        .env("TALLY_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let started = Instant::now();
    let mut gen = Command::new(&exe)
        .args(&gen_args)
        .args(["--rate", &a.rate.to_string()])
        .env("TALLY_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    println!(
        "chaos: {} workers, {} partitions, {count} records at {}/s, kills every {}–{}",
        a.workers, a.partitions, a.rate, a.kill_min, a.kill_max
    );

    let kills = kill_loop(
        &timing,
        &mut rng,
        &mut workers,
        &spawn_worker,
        &mut gen,
        started,
    )?;
    let produce_secs = started.elapsed().as_secs_f64();

    // Drain: wait until the live workers have consumed everything, then stop them.
    let kafka = crate::config::KafkaConfig {
        bootstrap_servers: bootstrap.clone(),
        ..Default::default()
    };
    drain(&kafka, a.partitions, &workers)?;
    let drained_secs = started.elapsed().as_secs_f64();
    stop_workers(&mut workers)?;
    let final_state = dir.join("state-final");
    tail(&exe, &cfg_s, &final_state, &mut sink)?;

    let f = compare(&db, &expected, &final_state, &kafka)?;
    let report = ChaosReport::new(&a, count, &expected, &kills, &f, &workers);
    print_report(&report, produce_secs, drained_secs);

    drop(broker);
    if !a.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    anyhow::ensure!(report.exact, "chaos run NOT exact (see the report above)");
    anyhow::ensure!(
        report.kills >= a.min_kills,
        "only {} kills (wanted at least {})",
        report.kills,
        a.min_kills
    );
    println!("result                   EXACT");
    Ok(())
}

/// The dev broker with the run's topics.
fn start_broker(exe: &Path, partitions: i32) -> anyhow::Result<support::DevBroker> {
    support::DevBroker::start(
        exe,
        &[
            ("requests", partitions),
            ("tenant-cost", 4),
            ("requests.late", 4),
            ("requests.dlq", 4),
        ],
    )
}

/// The tail: one bounded run closes the last windows (end of input); then the sink
/// stops and one bounded sink run applies everything.
fn tail(exe: &Path, cfg: &str, final_state: &Path, sink: &mut Child) -> anyhow::Result<()> {
    run_ok(
        Command::new(exe)
            .args(["run", "--config", cfg, "--until-end"])
            .env("TALLY_STATE__DIR", final_state),
        "the final drain",
    )?;
    signal(sink.id(), libc::SIGTERM);
    sink.wait()?;
    run_ok(
        Command::new(exe).args(["sink", "--config", cfg, "--until-end"]),
        "the final sink run",
    )?;
    Ok(())
}

/// Writes the run's config into `dir` and returns its path.
fn write_config(a: &ChaosArgs, dir: &Path, bootstrap: &str, db: &str) -> anyhow::Result<PathBuf> {
    let cfg = dir.join("chaos.toml");
    let checkpoints = match &a.s3_endpoint {
        Some(endpoint) => format!(
            "dir = \"s3://tally/chaos-{}-{}\"\nobject_store = {{ aws_endpoint = \"{endpoint}\", \
             aws_allow_http = \"true\" }}",
            std::process::id(),
            crate::base::clock::now_ms()
        ),
        None => format!("dir = \"{}/checkpoints\"", dir.display()),
    };
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\nbootstrap_servers = \"{bootstrap}\"\ngroup_id = \"chaos\"\n{group}\n\
             [checkpoint]\n{checkpoints}\ninterval = \"1s\"\n[state]\ndir = \"{d}/state\"\n\
             [window]\nallowed_lateness = \"10s\"\n[sink]\ndatabase_url = \"{db}\"\n\
             [prices.small]\ninput_per_1k = \"0.00015\"\noutput_per_1k = \"0.0006\"\n\
             [prices.medium]\ninput_per_1k = \"0.003\"\noutput_per_1k = \"0.015\"\n\
             [prices.large]\ninput_per_1k = \"0.05\"\noutput_per_1k = \"0.10\"\n",
            d = dir.display(),
            group = if a.group_protocol == "consumer" {
                "\"group.protocol\" = \"consumer\""
            } else {
                "\"session.timeout.ms\" = \"6000\""
            },
        ),
    )?;
    Ok(cfg)
}

/// The arguments of `tally gen` for this run (the offline expectation and the
/// live generator share them).
fn gen_args(a: &ChaosArgs, cfg: &str, count: u64) -> Vec<String> {
    [
        "gen",
        "--config",
        cfg,
        "--count",
        &count.to_string(),
        "--tenants",
        "60",
        "--seed",
        &a.seed.to_string(),
        "--late-fraction",
        "0.01",
        "--duplicate-fraction",
        "0.02",
        "--malformed-fraction",
        "0.005",
        "--partitions",
        &a.partitions.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The generator's exact expectation for `gen_args`, computed offline.
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
