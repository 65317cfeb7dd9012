//! `bench-memory`: a worker's peak RSS against `state.memory_budget`, one case
//! per child process (so each peak, `VmHWM`, is its own), each through the real
//! tasks, coordinator, working copy and checkpoint store (`devtools::rig`):
//!
//! - `windows`: a million open windows (a tenant each) under 64 MiB, with
//!   checkpoints (and their exports) on the way and at the end;
//! - `long-ids`: tenant ids of the id rule's limit (256 bytes) under 1 MiB;
//! - `lateness`: one hour of allowed lateness over 100,000 tenants under 64 MiB;
//! - `dedup`: tens of millions of live dedup ids under 256 MiB;
//! - `restore`: one partition of ten million windows (and as many dedup ids)
//!   checkpointed (`build`, its own process), then restored under 64 MiB in a
//!   fresh process, as a worker does on assignment, and fed one request per
//!   thousand of its windows;
//! - `kafka`: a real `tally run` worker against a `tally dev-broker` under 16 MiB
//!   (`bench_memory_kafka`): 100,000 tenants for 6 minutes, every window end
//!   firing and purged, a checkpoint a second; the worker's own peak RSS.
//!
//! `--scale` multiplies every case's size (windows, ids, tenants), for a quick
//! look; the recorded figures are at scale 1. A benchmark, not a test: it
//! prints figures and checks only that each case did its work.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use super::bench_state::{budget_of, mib, peak_rss, rig};
use crate::checkpoint::evolution::Rules;
use crate::checkpoint::store::CheckpointStore;
use crate::devtools::rig::T0;
use crate::model::Partition;
use crate::state::bounded::restore_task;
use crate::state::StateStore;

#[derive(Args, Debug)]
pub struct MemoryArgs {
    /// The cases to run, in order (comma-separated).
    #[arg(long, default_value = "windows,long-ids,lateness,dedup,restore,kafka")]
    pub cases: String,
    /// Multiplies every case's size.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Live dedup ids of the `dedup` case (at scale 1).
    #[arg(long, default_value_t = 50_000_000)]
    pub ids: u64,
    /// A budget for every case instead of its own (e.g. to check the overhead
    /// from 64 MiB to 2 GiB).
    #[arg(long)]
    pub budget: Option<String>,
    /// Internal: run one case (or the restore's `build`) and print its figures.
    #[arg(long, hide = true)]
    pub only: Option<String>,
    #[arg(long, default_value = "/tmp/tally-bench-memory")]
    pub dir: PathBuf,
}

/// One case: its name, budget and what it holds.
struct Case {
    name: &'static str,
    budget: String,
    what: String,
}

fn cases(a: &MemoryArgs) -> Vec<Case> {
    let n = |x: f64| ((x * a.scale) as u64).max(1);
    vec![
        Case {
            name: "windows",
            budget: a.budget.clone().unwrap_or_else(|| "64MiB".into()),
            what: format!("{} open windows", n(1e6)),
        },
        Case {
            name: "long-ids",
            budget: a.budget.clone().unwrap_or_else(|| "1MiB".into()),
            what: format!("{} windows of 256-byte tenant ids", n(2e5)),
        },
        Case {
            name: "lateness",
            budget: a.budget.clone().unwrap_or_else(|| "64MiB".into()),
            what: format!("{} tenants × 60 min lateness, 70 min", n(1e5)),
        },
        Case {
            name: "dedup",
            budget: a.budget.clone().unwrap_or_else(|| "256MiB".into()),
            what: format!("{} live dedup ids", n(a.ids as f64)),
        },
        Case {
            name: "build",
            budget: a.budget.clone().unwrap_or_else(|| "64MiB".into()),
            what: format!("{} windows of one partition, checkpointed", n(1e7)),
        },
        Case {
            name: "restore",
            budget: a.budget.clone().unwrap_or_else(|| "64MiB".into()),
            what: format!("restore of {} windows of one partition", n(1e7)),
        },
        Case {
            name: "kafka",
            budget: a.budget.clone().unwrap_or_else(|| "16MiB".into()),
            what: format!("a Kafka worker: {} tenants × 6 min, 2 min lateness", n(1e5)),
        },
    ]
}

pub fn run(a: MemoryArgs) -> anyhow::Result<()> {
    if let Some(case) = &a.only {
        return one_case(&a, case);
    }
    println!("| case | what | budget | peak RSS | peak − budget | seconds |");
    println!("|---|---|---:|---:|---:|---:|");
    let wanted: Vec<&str> = a.cases.split(',').map(str::trim).collect();
    for c in cases(&a) {
        let asked = wanted.contains(&c.name) || (c.name == "build" && wanted.contains(&"restore"));
        if !asked {
            continue;
        }
        let started = Instant::now();
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(["bench-memory", "--only", c.name])
            .args(["--scale", &a.scale.to_string(), "--ids", &a.ids.to_string()])
            .args(a.budget.iter().flat_map(|b| ["--budget", b.as_str()]))
            .arg("--dir")
            .arg(&a.dir)
            .stderr(std::process::Stdio::inherit())
            .output()?;
        anyhow::ensure!(out.status.success(), "the {} case failed", c.name);
        let text = String::from_utf8_lossy(&out.stdout);
        let rss: u64 = text
            .lines()
            .rfind(|l| l.starts_with("RESULT "))
            .and_then(|l| l[7..].trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("the {} case printed no result", c.name))?;
        let budget = budget_of(&c.budget)?.unwrap_or(0) as u64;
        println!(
            "| {} | {} | {} | {:.0} MiB | {:+.0} MiB | {:.0} |",
            c.name,
            c.what,
            c.budget,
            mib(rss),
            mib(rss) - mib(budget),
            started.elapsed().as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&a.dir);
    Ok(())
}

fn one_case(a: &MemoryArgs, name: &str) -> anyhow::Result<()> {
    let case = cases(a)
        .into_iter()
        .find(|c| c.name == name)
        .ok_or_else(|| anyhow::anyhow!("no case {name}"))?;
    let budget = budget_of(&case.budget)?.unwrap_or(usize::MAX);
    let n = |x: f64| ((x * a.scale) as usize).max(1);
    let dir = a.dir.join(name);
    if name == "kafka" {
        // The worker's peak, not this process's (which only produces).
        let m = super::bench_memory_kafka::run(&dir, &case.budget, n(1e5), 6)?;
        eprintln!(
            "kafka: {} windows evicted at the most, {} checkpoints",
            m.spilled, m.checkpoints
        );
        anyhow::ensure!(m.spilled > 0, "the worker evicted no window");
        println!("RESULT {}", m.peak);
        return Ok(());
    }
    match name {
        "windows" => windows(&dir, budget, n(1e6), 16, 4),
        "long-ids" => windows(&dir, budget, n(2e5), 256, 4),
        "lateness" => lateness(&dir, budget, n(1e5), 60, 70),
        "dedup" => dedup(&dir, budget, n(a.ids as f64)),
        "build" => windows(&a.dir.join("restore"), budget, n(1e7), 16, 1),
        "restore" => restore(&a.dir.join("restore"), budget, n(1e7)),
        _ => unreachable!("every case is matched"),
    }?;
    println!("RESULT {}", peak_rss());
    Ok(())
}

/// With `TALLY_BENCH_TRACE` set: the process's RSS and peak now, and what the
/// budget counts (stderr).
fn trace(rig: &crate::devtools::rig::Rig, at: &str) {
    if std::env::var_os("TALLY_BENCH_TRACE").is_none() {
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .map_or("?".to_string(), |l| l[name.len()..].trim().to_string())
    };
    let windows: usize = rig.tasks.iter().map(|t| t.memory_bytes()).sum();
    let ids: usize = rig.tasks.iter().map(|t| t.dedup_bytes()).sum();
    eprintln!(
        "{at}: rss {} peak {} windows {:.1} MiB ids {:.1} MiB",
        field("VmRSS:"),
        field("VmHWM:"),
        mib(windows as u64),
        mib(ids as u64)
    );
}

/// A tenant id of `len` bytes (at least the digits of `t`).
fn tenant(t: usize, len: usize) -> String {
    format!("{t:0>len$}")
}

/// `count` windows, one request per tenant, one millisecond apart, 3 h of
/// lateness (none fires or is purged); a checkpoint every quarter and at the end.
fn windows(
    dir: &Path,
    budget: usize,
    count: usize,
    id_len: usize,
    partitions: i32,
) -> anyhow::Result<()> {
    let mut rig = rig(dir, partitions, 3 * 3_600_000)?.with_budget(budget);
    for t in 0..count {
        let p = t % partitions as usize;
        rig.feed_one(p, &format!("r{t}"), &tenant(t, id_len), T0 + t as i64)?;
        if t % (count / 4).max(1) == 0 {
            trace(&rig, "before a checkpoint");
            rig.checkpoint()?;
            trace(&rig, "after it");
        }
    }
    rig.checkpoint()?;
    let open: usize = rig.tasks.iter().map(|t| t.open_windows()).sum();
    anyhow::ensure!(open == count, "{open} windows open, {count} fed");
    Ok(())
}

/// One request per tenant per minute for `minutes`, a checkpoint after each.
fn lateness(
    dir: &Path,
    budget: usize,
    tenants: usize,
    lateness_min: i64,
    minutes: i64,
) -> anyhow::Result<()> {
    let mut rig = rig(dir, 4, lateness_min * 60_000)?.with_budget(budget);
    for m in 0..minutes {
        for t in 0..tenants {
            let ts = T0 + m * 60_000 + (t as i64 * 60_000 / tenants as i64);
            rig.feed_one(t % 4, &format!("m{m}-t{t}"), &format!("tenant-{t}"), ts)?;
        }
        rig.checkpoint()?;
    }
    Ok(())
}

/// `ids` distinct requests of 1,000 tenants over 50 minutes (all live at the
/// end), one partition, a commit every million.
fn dedup(dir: &Path, budget: usize, ids: usize) -> anyhow::Result<()> {
    let mut rig = rig(dir, 1, 0)?.with_budget(budget);
    let span = 50 * 60_000i64;
    for i in 0..ids {
        let ts = T0 + (i as i64 * span / ids as i64);
        rig.feed_one(0, &format!("req-{i}"), &format!("tenant-{}", i % 1000), ts)?;
        if i % 1_000_000 == 999_999 {
            rig.commit()?;
        }
    }
    rig.commit()?;
    Ok(())
}

/// Restores the partition `build` checkpointed under `dir` into a fresh working
/// copy, as a worker does on assignment, then feeds it one request per
/// thousand windows (each reads its window back if it is not in memory).
fn restore(dir: &Path, budget: usize, count: usize) -> anyhow::Result<()> {
    let cfg = crate::config::CheckpointConfig {
        dir: dir.join("checkpoints"),
        retain: 3,
        ..Default::default()
    };
    let checkpoints = CheckpointStore::open(&cfg, "bench", "restorer")?;
    let state = std::sync::Arc::new(StateStore::open_fresh(&dir.join("state-restored"))?);
    let engine = crate::devtools::support::one_price_engine(3 * 3_600_000);
    let started = Instant::now();
    let p = Partition(0);
    checkpoints
        .restore_partition(p, &Rules::opaque("f"), &state)?
        .ok_or_else(|| anyhow::anyhow!("partition 0 missing after restore"))?;
    // As `worker::kafka::restore` does on assignment: the task within its share.
    let (mut task, _) = restore_task(&state, p, engine, Some(budget))?
        .ok_or_else(|| anyhow::anyhow!("partition 0 has no state after restore"))?;
    eprintln!(
        "restored {} windows ({} in memory) in {:.1} s",
        task.open_windows(),
        task.windows_in_memory(),
        started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        task.open_windows() == count,
        "{} windows restored",
        task.open_windows()
    );
    let mut out = Vec::new();
    for t in (0..count).step_by(1000) {
        let rec = format!(
            r#"{{"request_id":"again-{t}","tenant_id":"{}","model":"m","prompt_tokens":1,"completion_tokens":1,"completed_ts":{}}}"#,
            tenant(t, 16),
            T0 + t as i64
        );
        task.process(
            crate::engine::RecordIn {
                payload: rec.as_bytes(),
                kafka_ts: None,
                now_ms: 0,
            },
            &mut out,
        )?;
    }
    Ok(())
}
