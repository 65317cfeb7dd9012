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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use super::support::{self, signal, tally_beside_me};
use crate::base::duration::Millis;
use crate::gen::{Expected, Rng};
use crate::kafka::headers;
use crate::kafka::read::read_topic;
use crate::metrics::WorkerReport;

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
}

struct Worker {
    child: Option<Child>,
    state: PathBuf,
    peak_rss_kb: u64,
}

fn dur(s: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_millis(
        Millis::parse(s).map_err(anyhow::Error::msg)?.0 as u64,
    ))
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn report(state: &Path) -> Option<WorkerReport> {
    crate::worker::report::read(state).ok()
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

fn pct(v: &[f64], q: usize) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len().saturating_sub(1) * q / 100)
        .copied()
        .unwrap_or(0.0)
}

pub fn run(a: ChaosArgs) -> anyhow::Result<()> {
    let duration = dur(&a.duration)?;
    let (kill_min, kill_max) = (dur(&a.kill_min)?, dur(&a.kill_max)?);
    let (restart_min, restart_max) = (dur(&a.restart_min)?, dur(&a.restart_max)?);
    anyhow::ensure!(
        kill_min <= kill_max && restart_min <= restart_max,
        "min must not exceed max"
    );
    let dir = std::env::temp_dir().join(format!("tally-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let exe = tally_beside_me()?;
    let mut rng = Rng::new(a.seed);

    // Broker.
    let broker = support::DevBroker::start(
        &exe,
        &[
            ("requests", a.partitions),
            ("tenant-cost", 4),
            ("requests.late", 4),
            ("requests.dlq", 4),
        ],
    )?;
    let bootstrap = broker.bootstrap.clone();
    let db = support::create_database(&a.database_url, &format!("chaos_{}", std::process::id()))?;
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
    let cfg_s = cfg.to_str().context("config path")?.to_string();
    let count = a.rate * duration.as_secs().max(1);
    let gen_args: Vec<String> = [
        "gen",
        "--config",
        &cfg_s,
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
    .collect();
    let expected_path = dir.join("expected.json");
    run_ok(
        Command::new(&exe)
            .args(&gen_args)
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

    // Kill loop.
    let mut kills = 0usize;
    let mut recoveries: Vec<f64> = Vec::new();
    let mut pending: Vec<(Instant, BTreeMap<i32, i64>)> = Vec::new();
    let mut restarts: Vec<(Instant, usize)> = Vec::new();
    let mut next_kill = Instant::now()
        + kill_min
        + Duration::from_millis(rng.below((kill_max - kill_min).as_millis() as u64 + 1));
    let mut gen_done = false;
    while !gen_done || !pending.is_empty() || !restarts.is_empty() {
        std::thread::sleep(Duration::from_millis(100));
        gen_done = gen_done || gen.try_wait()?.is_some();
        for w in workers.iter_mut() {
            if let Some(c) = &w.child {
                w.peak_rss_kb = w.peak_rss_kb.max(rss_kb(c.id()));
            }
        }
        // Restarts due.
        let now = Instant::now();
        for (_, i) in restarts.iter().filter(|(at, _)| *at <= now) {
            workers[*i].child = Some(spawn_worker(&workers[*i].state)?);
        }
        restarts.retain(|(at, _)| *at > now);
        // Recovery: every orphaned partition is owned again and has moved past where it was.
        let live: Vec<WorkerReport> = workers
            .iter()
            .filter(|w| w.child.is_some())
            .filter_map(|w| report(&w.state))
            .collect();
        pending.retain(|(at, orphans)| {
            let recovered = orphans.iter().all(|(p, o)| {
                live.iter().any(|r| {
                    r.at_ms > 0
                        && r.partitions
                            .iter()
                            .any(|x| x.partition.0 == *p && x.next_offset.0 > *o)
                })
            });
            if recovered {
                recoveries.push(at.elapsed().as_secs_f64());
                println!(
                    "           recovered {:?} after {:.1} s",
                    orphans.keys().collect::<Vec<_>>(),
                    at.elapsed().as_secs_f64()
                );
            }
            !recovered && at.elapsed() < Duration::from_secs(120)
        });
        if !gen_done && now >= next_kill {
            let alive: Vec<usize> = (0..workers.len())
                .filter(|i| workers[*i].child.is_some())
                .collect();
            let n = if alive.len() > 1 && rng.chance(200_000) {
                2
            } else {
                1
            };
            for k in 0..n.min(alive.len()) {
                let i = alive[(rng.below(alive.len() as u64) as usize + k) % alive.len()];
                let Some(mut c) = workers[i].child.take() else {
                    continue;
                };
                let owned: BTreeMap<i32, i64> = report(&workers[i].state)
                    .map(|r| {
                        r.partitions
                            .iter()
                            .map(|p| (p.partition.0, p.next_offset.0))
                            .collect()
                    })
                    .unwrap_or_default();
                c.kill()?;
                c.wait()?;
                kills += 1;
                println!(
                    "  {:>6.1} s  killed worker {i} (owned {:?})",
                    started.elapsed().as_secs_f64(),
                    owned.keys().collect::<Vec<_>>()
                );
                if !owned.is_empty() {
                    pending.push((Instant::now(), owned));
                }
                let span = (restart_max - restart_min).as_millis() as u64;
                restarts.push((
                    Instant::now() + restart_min + Duration::from_millis(rng.below(span + 1)),
                    i,
                ));
            }
            next_kill = now
                + kill_min
                + Duration::from_millis(rng.below((kill_max - kill_min).as_millis() as u64 + 1));
        }
    }
    let lost_recoveries = pending.len();
    let produce_secs = started.elapsed().as_secs_f64();

    // Drain: wait until the live workers have consumed everything, then stop them.
    let kafka = crate::config::KafkaConfig {
        bootstrap_servers: bootstrap.clone(),
        ..Default::default()
    };
    let ends = support::log_ends(&kafka, "requests", a.partitions)?;
    let drain_deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let reports: Vec<WorkerReport> = workers.iter().filter_map(|w| report(&w.state)).collect();
        let done = ends.iter().all(|(p, end)| {
            reports.iter().any(|r| {
                r.partitions
                    .iter()
                    .any(|x| x.partition.0 == *p && x.next_offset.0 >= *end)
            })
        });
        if done || Instant::now() > drain_deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let drained_secs = started.elapsed().as_secs_f64();
    for w in workers.iter_mut() {
        if let Some(c) = &w.child {
            w.peak_rss_kb = w.peak_rss_kb.max(rss_kb(c.id()));
            signal(c.id(), libc::SIGTERM);
        }
        if let Some(mut c) = w.child.take() {
            // Bounded: a worker that does not stop is killed (its checkpoint is
            // complete before it leaves the group), and the run goes on.
            let deadline = Instant::now() + Duration::from_secs(60);
            while c.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    println!(
                        "  worker {} did not stop 60 s after SIGTERM; killed",
                        c.id()
                    );
                    c.kill()?;
                    c.wait()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // The tail: one bounded run closes the last windows (end of input).
    let final_state = dir.join("state-final");
    run_ok(
        Command::new(&exe)
            .args(["run", "--config", &cfg_s, "--until-end"])
            .env("TALLY_STATE__DIR", &final_state),
        "the final drain",
    )?;
    signal(sink.id(), libc::SIGTERM);
    sink.wait()?;
    run_ok(
        Command::new(&exe).args(["sink", "--config", &cfg_s, "--until-end"]),
        "the final sink run",
    )?;

    // Compare.
    let view: BTreeMap<(String, i64), u128> = support::invoice(&db)?
        .into_iter()
        .map(|l| Ok(((l.tenant_id, l.window_end), l.cost_pico.parse()?)))
        .collect::<anyhow::Result<_>>()?;
    let mut lost = 0;
    let mut doubled = 0;
    for w in &expected.windows {
        let want: u128 = w.cost_pico.parse()?;
        match view.get(&(w.tenant_id.clone(), w.window_end)) {
            Some(got) if *got == want => {}
            Some(got) if *got > want => doubled += 1,
            _ => lost += 1,
        }
    }
    let extra = view.len().saturating_sub(expected.windows.len());
    let final_report = report(&final_state).context("the final run wrote no report")?;
    let mut c = crate::engine::Counters::default();
    for p in &final_report.partitions {
        c.add(&p.counters);
    }
    let late: BTreeSet<String> = read_topic(&kafka, "requests.late")?
        .iter()
        .filter_map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.payload).ok()?["request_id"]
                .as_str()
                .map(String::from)
        })
        .collect();
    let dlq_sources: BTreeSet<String> = read_topic(&kafka, "requests.dlq")?
        .iter()
        .filter_map(|r| r.header(headers::SOURCE).map(String::from))
        .collect();
    let want_late: BTreeSet<String> = expected
        .too_late
        .iter()
        .map(|l| l.request_id.clone())
        .collect();
    let dead: u64 = expected.dead_letters.values().sum();
    let rss: Vec<String> = workers
        .iter()
        .map(|w| format!("{} MiB", w.peak_rss_kb / 1024))
        .collect();

    println!("\n== chaos report ==========================================================");
    println!("records generated        {count} in {produce_secs:.0} s; drained after {drained_secs:.0} s ({:.0} records/s overall)", count as f64 / drained_secs);
    println!(
        "workers / partitions     {} / {} (group protocol {})",
        a.workers, a.partitions, a.group_protocol
    );
    println!("kills (SIGKILL)          {kills}");
    println!(
        "windows compared         {} (extra in view: {extra})",
        expected.windows.len()
    );
    println!("lost windows             {lost}");
    println!("double-counted windows   {doubled}");
    println!(
        "records consumed         {} (expected {})",
        c.consumed, expected.records
    );
    println!(
        "too late                 {} (injected {}; distinct on late topic {})",
        c.too_late,
        expected.too_late.len(),
        late.len()
    );
    println!(
        "dead letters             {} (injected {dead}; distinct sources on DLQ {})",
        c.dead_letter,
        dlq_sources.len()
    );
    println!(
        "duplicates               {} (injected {})",
        c.duplicate, expected.duplicates
    );
    println!(
        "recovery after kill      p50 {:.1} s, p99 {:.1} s, max {:.1} s over {} kills with owned partitions ({lost_recoveries} never observed)",
        pct(&recoveries, 50),
        pct(&recoveries, 99),
        recoveries.iter().copied().fold(0.0, f64::max),
        recoveries.len()
    );
    println!("peak RSS per worker      {}", rss.join(", "));
    let audit_balanced = c.balanced() && final_report.balanced();
    println!("audit balanced           {audit_balanced}");

    drop(broker);
    if !a.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let exact = lost == 0
        && doubled == 0
        && extra == 0
        && c.consumed == expected.records
        && c.too_late == expected.too_late.len() as u64
        && c.dead_letter == dead
        && c.duplicate == expected.duplicates
        && late == want_late
        && dlq_sources.len() as u64 == dead
        && audit_balanced;
    if let Some(path) = &a.json {
        let report = ChaosReport {
            records_generated: count,
            workers: a.workers,
            partitions: a.partitions,
            group_protocol: a.group_protocol.clone(),
            kills,
            windows_compared: expected.windows.len(),
            extra_windows: extra,
            lost_windows: lost,
            double_counted_windows: doubled,
            records_consumed: c.consumed,
            records_expected: expected.records,
            too_late: c.too_late,
            too_late_injected: expected.too_late.len() as u64,
            too_late_distinct_on_topic: late.len() as u64,
            dead_letters: c.dead_letter,
            dead_letters_injected: dead,
            dead_letter_sources_on_topic: dlq_sources.len() as u64,
            duplicates: c.duplicate,
            duplicates_injected: expected.duplicates,
            recovery_p50_s: pct(&recoveries, 50),
            recovery_p99_s: pct(&recoveries, 99),
            recovery_max_s: recoveries.iter().copied().fold(0.0, f64::max),
            recoveries_observed: recoveries.len(),
            recoveries_never_observed: lost_recoveries,
            peak_rss_mib: workers.iter().map(|w| w.peak_rss_kb / 1024).collect(),
            audit_balanced,
            exact,
        };
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    anyhow::ensure!(exact, "chaos run NOT exact (see the report above)");
    anyhow::ensure!(
        kills >= a.min_kills,
        "only {kills} kills (wanted at least {})",
        a.min_kills
    );
    println!("result                   EXACT");
    Ok(())
}
