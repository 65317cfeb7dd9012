//! State at billing scale, measured in one run each (`devtools::rig`: real
//! tasks, coordinator, working copy and checkpoint store; no Kafka):
//!
//! - `bench-lateness`: long allowed lateness over many tenants under a memory
//!   budget — open windows, peak RSS against the budget, and what each
//!   checkpoint writes against the state it references.
//! - `bench-dedup`: tens of millions of live dedup ids, with and without a
//!   budget, each in its own child process (so each peak RSS is its own) —
//!   peak RSS, the cold tier's reads, and the throughput ratio.

use std::time::Instant;

use clap::Args;

use crate::base::size::Budget;
use crate::checkpoint::store::CheckpointStore;
use crate::devtools::rig::{Rig, T0};
use crate::devtools::support::one_price_engine;

/// Peak resident memory of this process, bytes (`VmHWM`, Linux).
pub(crate) fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

pub(crate) fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

pub(crate) fn budget_of(s: &str) -> anyhow::Result<Option<usize>> {
    Ok(Budget::parse(s)
        .map_err(|e| anyhow::anyhow!("--budget: {e}"))?
        .0
        .map(|b| b as usize))
}

pub(crate) fn rig(dir: &std::path::Path, partitions: i32, lateness_ms: i64) -> anyhow::Result<Rig> {
    let _ = std::fs::remove_dir_all(dir);
    let cfg = crate::config::CheckpointConfig {
        dir: dir.join("checkpoints"),
        retain: 3,
        ..Default::default()
    };
    let checkpoints = std::sync::Arc::new(CheckpointStore::open(&cfg, "bench", "bench")?);
    Ok(Rig::new(
        &dir.join("state"),
        checkpoints,
        "bench",
        partitions,
        one_price_engine(lateness_ms),
    )?)
}

#[derive(Args, Debug)]
pub struct LatenessArgs {
    #[arg(long, default_value_t = 100_000)]
    pub tenants: usize,
    /// Allowed lateness, minutes (windows are one minute).
    #[arg(long, default_value_t = 60)]
    pub lateness_minutes: i64,
    /// Minutes of event time: one request per tenant per minute, a checkpoint
    /// after each minute.
    #[arg(long, default_value_t = 90)]
    pub minutes: i64,
    #[arg(long, default_value = "512MiB")]
    pub budget: String,
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    #[arg(long, default_value = "/tmp/tally-bench-lateness")]
    pub dir: std::path::PathBuf,
}

pub fn run_lateness(a: LatenessArgs) -> anyhow::Result<()> {
    let budget = budget_of(&a.budget)?;
    let mut rig = rig(&a.dir, a.partitions, a.lateness_minutes * 60_000)?;
    if let Some(b) = budget {
        rig = rig.with_budget(b);
    }
    let started = Instant::now();
    let (mut written, mut state, mut pauses) = (Vec::new(), 0u64, Vec::new());
    for m in 0..a.minutes {
        for t in 0..a.tenants {
            let ts = T0 + m * 60_000 + (t as i64 * 60_000 / a.tenants as i64);
            let p = t % a.partitions as usize;
            rig.feed_one(p, &format!("m{m}-t{t}"), &format!("tenant-{t}"), ts)?;
        }
        let c = rig.checkpoint()?;
        written.push(c.manifest.written_bytes());
        state = c.manifest.state_bytes();
        pauses.push(*rig.coord.pauses_us.last().unwrap_or(&0));
    }
    let secs = started.elapsed().as_secs_f64();
    let open: usize = rig.tasks.iter().map(|t| t.open_windows()).sum();
    let in_memory: usize = rig.tasks.iter().map(|t| t.windows_in_memory()).sum();
    let cold: u64 = rig.tasks.iter().map(|t| t.dedup_cold_stats().0).sum();
    // The steady state: checkpoints once the lateness is full.
    let steady = &mut written[(a.lateness_minutes as usize).min(a.minutes as usize - 1)..];
    steady.sort_unstable();
    pauses.sort_unstable();
    let p = |v: &[u64], q: usize| {
        v.get((v.len().saturating_sub(1)) * q / 100)
            .copied()
            .unwrap_or(0)
    };
    println!("| tenants | lateness | events | open windows (in memory) | budget | peak RSS | bytes written per checkpoint, steady p50 / max | state bytes referenced | written / state | pause p99 ms | dedup ids moved out | seconds |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} min | {} | {open} ({in_memory}) | {} | {:.0} MiB | {} / {} | {state} | {:.2}% | {:.1} | {cold} | {secs:.0} |",
        a.tenants,
        a.lateness_minutes,
        a.tenants as i64 * a.minutes,
        a.budget,
        mib(peak_rss()),
        p(steady, 50),
        steady.last().copied().unwrap_or(0),
        100.0 * p(steady, 50) as f64 / state.max(1) as f64,
        p(&pauses, 99) as f64 / 1e3,
    );
    drop(rig);
    let _ = std::fs::remove_dir_all(&a.dir);
    Ok(())
}

#[derive(Args, Debug)]
pub struct DedupArgs {
    /// Distinct request ids, all live at the end (spread over 50 minutes of
    /// event time; the dedup horizon is the default hour).
    #[arg(long, default_value_t = 50_000_000)]
    pub ids: u64,
    #[arg(long, default_value = "256MiB")]
    pub budget: String,
    /// Internal: run one side (a budget, or "off") and print its figures.
    #[arg(long, hide = true)]
    pub only: Option<String>,
    #[arg(long, default_value = "/tmp/tally-bench-dedup")]
    pub dir: std::path::PathBuf,
}

pub fn run_dedup(a: DedupArgs) -> anyhow::Result<()> {
    if let Some(side) = &a.only {
        return dedup_side(&a, side);
    }
    println!("| run | ids | events | duplicates | seconds | events/s | peak RSS | dedup ids moved out | cold reads | ratio to no budget |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for side in ["off", a.budget.as_str()] {
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(["bench-dedup", "--only", side, "--ids", &a.ids.to_string()])
            .arg("--dir")
            .arg(a.dir.join(side))
            .stderr(std::process::Stdio::inherit())
            .output()?;
        anyhow::ensure!(out.status.success(), "the {side} run failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .rfind(|l| l.starts_with("RESULT "))
            .ok_or_else(|| anyhow::anyhow!("the {side} run printed no result"))?;
        let f: Vec<f64> = line[7..]
            .split(' ')
            .filter_map(|x| x.parse().ok())
            .collect();
        anyhow::ensure!(f.len() == 6, "malformed result: {line}");
        rows.push((side.to_string(), f));
    }
    let base = rows[0].1[0] / rows[0].1[1];
    for (side, f) in &rows {
        let (events, secs, rss, moved, reads, dups) = (f[0], f[1], f[2], f[3], f[4], f[5]);
        let label = if side == "off" {
            "no budget".to_string()
        } else {
            format!("memory_budget {side}")
        };
        println!(
            "| {label} | {} | {events:.0} | {dups:.0} | {secs:.1} | {:.0} | {:.0} MiB | {moved:.0} | {reads:.0} | {:.2} |",
            a.ids,
            events / secs,
            rss / (1 << 20) as f64,
            (events / secs) / base
        );
    }
    Ok(())
}

/// One side of `bench-dedup`: prints `RESULT events secs rss moved reads dups`.
fn dedup_side(a: &DedupArgs, side: &str) -> anyhow::Result<()> {
    let budget = budget_of(side)?;
    let mut rig = rig(&a.dir, 1, 0)?;
    if let Some(b) = budget {
        rig = rig.with_budget(b);
    }
    let span = 50 * 60_000i64;
    let started = Instant::now();
    let (mut events, mut dups) = (0u64, 0u64);
    for i in 0..a.ids {
        let ts = T0 + (i as i64 * span / a.ids as i64);
        let tenant = format!("tenant-{}", i % 1000);
        rig.feed_one(0, &format!("req-{i}"), &tenant, ts)?;
        events += 1;
        // 2% copies: half of a recent id, half of one from the first half.
        let copy = match i % 100 {
            0 => Some(i.saturating_sub(1_000)),
            50 => Some(i / 2),
            _ => None,
        };
        if let Some(j) = copy {
            let route = rig.feed_one(0, &format!("req-{j}"), &tenant, ts)?;
            events += 1;
            dups += u64::from(route == crate::engine::Route::Duplicate);
        }
        if i % 1_000_000 == 999_999 {
            rig.commit()?;
        }
    }
    rig.commit()?;
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        dups == a.ids / 50,
        "{dups} duplicates found, {} sent",
        a.ids / 50
    );
    let (moved, reads) = rig.tasks[0].dedup_cold_stats();
    println!(
        "RESULT {events} {secs} {} {moved} {reads} {dups}",
        peak_rss()
    );
    drop(rig);
    let _ = std::fs::remove_dir_all(&a.dir);
    Ok(())
}
