//! `tally-dev bench-checkpoint`: checkpoint pause, duration, size and restore time at
//! several numbers of open windows, measured on this machine in one run.
//!
//! Kafka is not involved (`rig`: real tasks, coordinator, working copy and
//! checkpoint store): the barrier pause measured here is the state part (drain
//! the engine's changes, one batch write, plan and spawn the exporter); the producer flush
//! that precedes it depends on the broker and is reported by the worker's own
//! `checkpoint complete` log lines.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;

use crate::checkpoint::store::CheckpointStore;
use crate::devtools::rig::{Rig, T0};
use crate::engine::EngineConfig;
use crate::model::Partition;
use crate::state::StateStore;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Open-window counts to measure (comma-separated).
    #[arg(long, default_value = "10000,100000,1000000", value_delimiter = ',')]
    pub windows: Vec<usize>,
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Steady-state checkpoints per size (1% of windows changed before each;
    /// past 16 the chains compact).
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    /// Scratch directory (deleted afterwards).
    #[arg(long, default_value = "/tmp/tally-bench-checkpoint")]
    pub dir: std::path::PathBuf,
    /// Also measure on this S3-compatible server (bucket `tally`, a prefix of this
    /// run; credentials from `AWS_*`), each size right after the local directory.
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
}

/// The checkpoint store of one measurement: under `dir`, or on S3.
fn store_config(a: &BenchArgs, n: usize, s3: Option<&str>) -> crate::config::CheckpointConfig {
    let mut cfg = crate::config::CheckpointConfig {
        dir: a.dir.join("checkpoints"),
        retain: 2,
        ..Default::default()
    };
    if let Some(endpoint) = s3 {
        cfg.dir = format!("s3://tally/bench-{}-{n}", std::process::id()).into();
        cfg.object_store
            .insert("aws_endpoint".into(), endpoint.to_string());
        cfg.object_store
            .insert("aws_allow_http".into(), "true".into());
    }
    cfg
}

fn engine() -> Arc<EngineConfig> {
    crate::devtools::support::one_price_engine(0)
}

fn pct(v: &mut [f64], q: usize) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get((v.len().saturating_sub(1)) * q / 100)
        .copied()
        .unwrap_or(0.0)
}

/// One row of the table: the figures of `n` open windows on one store.
struct Row {
    first_pause: f64,
    pause_p50: f64,
    pause_p99: f64,
    duration_p50: f64,
    /// A full snapshot (the chain's base), and what a steady checkpoint wrote (p50).
    full_bytes: u64,
    written_p50: f64,
    chain: usize,
    restore_one_ms: f64,
    restore_ms: f64,
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    println!("| store | open windows | first checkpoint pause ms | steady pause p50 / p99 ms | checkpoint duration ms (p50) | full snapshot bytes | bytes written per checkpoint (p50) | written / full | chain at restore | restore of one partition ms | restore of all {} ms |", a.partitions);
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let print = |kind: &str, n: usize, r: &Row| {
        println!(
            "| {kind} | {n} | {:.1} | {:.1} / {:.1} | {:.0} | {} | {:.0} | {:.2}% | {} | {:.0} | {:.0} |",
            r.first_pause,
            r.pause_p50,
            r.pause_p99,
            r.duration_p50,
            r.full_bytes,
            r.written_p50,
            100.0 * r.written_p50 / r.full_bytes as f64,
            r.chain,
            r.restore_one_ms,
            r.restore_ms
        )
    };
    for &n in &a.windows {
        // The local directory is the baseline of the same run.
        let local = measure(&a, n, None)?;
        print("local", n, &local);
        if let Some(endpoint) = &a.s3_endpoint {
            let s3 = measure(&a, n, Some(endpoint))?;
            print("S3", n, &s3);
            println!(
                "| S3 / local | {n} | {:.2} | {:.2} / {:.2} | {:.2} | | | | | {:.2} | {:.2} |",
                s3.first_pause / local.first_pause,
                s3.pause_p50 / local.pause_p50,
                s3.pause_p99 / local.pause_p99,
                s3.duration_p50 / local.duration_p50,
                s3.restore_one_ms / local.restore_one_ms,
                s3.restore_ms / local.restore_ms
            );
        }
    }
    let _ = std::fs::remove_dir_all(&a.dir);
    Ok(())
}

/// Checkpoints and restores of `n` open windows, on the local store or (`s3`) on
/// the S3-compatible server at that endpoint.
fn measure(a: &BenchArgs, n: usize, s3: Option<&str>) -> anyhow::Result<Row> {
    let _ = std::fs::remove_dir_all(&a.dir);
    let cfg = store_config(a, n, s3);
    let checkpoints = Arc::new(CheckpointStore::open(&cfg, "bench", "bench")?);
    let mut rig = Rig::new(
        &a.dir.join("state"),
        checkpoints.clone(),
        "bench",
        a.partitions,
        engine(),
    )?;
    let per = n / a.partitions as usize;
    // One window (10:00) per tenant: every event opens or updates a window.
    let ts = |round: usize| T0 + (round as i64 % 50);
    for p in 0..a.partitions as usize {
        rig.feed(p, p * per..(p + 1) * per, ts(0), 0);
    }
    let first = rig.checkpoint()?;
    let first_pause = *rig.coord.pauses_us.last().unwrap_or(&0) as f64 / 1e3;
    let _ = first;
    let mut pauses = Vec::new();
    let mut durations = Vec::new();
    let mut written = Vec::new();
    let mut last = None;
    for round in 1..=a.rounds {
        let changed = (per / 100).max(1);
        for p in 0..a.partitions as usize {
            let from = p * per + (round * changed) % per.max(1);
            rig.feed(
                p,
                from..(from + changed).min((p + 1) * per),
                ts(round),
                round,
            );
        }
        let c = rig.checkpoint()?;
        pauses.push(*rig.coord.pauses_us.last().unwrap_or(&0) as f64 / 1e3);
        durations.push(c.duration_ms as f64);
        written.push(c.manifest.written_bytes() as f64);
        last = Some(c.manifest);
    }
    let last = last.ok_or_else(|| anyhow::anyhow!("--rounds must be at least 1"))?;
    let full_bytes = last.partitions.iter().map(|e| e.segments[0].bytes()).sum();
    let chain = last.partitions[0].segments.len();
    drop(rig);
    // One partition, then every partition into a fresh store, as a worker does
    // on assignment.
    let one = StateStore::open_fresh(&a.dir.join("restore-one"))?;
    let started = Instant::now();
    checkpoints
        .restore_partition(
            Partition(0),
            &crate::checkpoint::evolution::Rules::opaque("f"),
            &one,
        )?
        .ok_or_else(|| anyhow::anyhow!("partition 0 missing after restore"))?;
    let restore_one_ms = started.elapsed().as_secs_f64() * 1e3;
    drop(one);
    let fresh = std::sync::Arc::new(StateStore::open_fresh(&a.dir.join("restore"))?);
    let started = Instant::now();
    let parts: Vec<(Partition, Option<i64>)> =
        (0..a.partitions).map(|p| (Partition(p), None)).collect();
    let mut restored = 0;
    for ((p, _), r) in parts.iter().zip(checkpoints.restore_many(
        &parts,
        &crate::checkpoint::evolution::Rules::opaque("f"),
        Default::default(),
        &fresh,
    )?) {
        r?.ok_or_else(|| anyhow::anyhow!("partition {p} missing after restore"))?;
        let (task, _) = crate::state::bounded::restore_task(&fresh, *p, engine(), None)?
            .ok_or_else(|| anyhow::anyhow!("partition {p} has no state after restore"))?;
        restored += task.open_windows();
    }
    let restore_ms = started.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(
        restored == per * a.partitions as usize,
        "restored {restored} windows, expected {}",
        per * a.partitions as usize
    );
    let _ = std::fs::remove_dir_all(&a.dir);
    Ok(Row {
        first_pause,
        pause_p50: pct(&mut pauses.clone(), 50),
        pause_p99: pct(&mut pauses, 99),
        duration_p50: pct(&mut durations, 50),
        full_bytes,
        written_p50: pct(&mut written, 50),
        chain,
        restore_one_ms,
        restore_ms,
    })
}

#[derive(Args, Debug)]
pub struct BenchEngineArgs {
    #[command(flatten)]
    pub config: crate::cli::ConfigArg,
    /// JSON lines to process (e.g. from `tally gen --output-file`).
    #[arg(long)]
    pub input_file: std::path::PathBuf,
    /// Alternate the baseline, step 1 and engine runs this many times; report the best of each.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// Engine from a file vs a parse-only baseline over the same file, in one process:
/// the parse is the floor of the work; everything else must cost less than it.
/// A third row runs step 1 of the rules alone (`Prepared`, as the file mode's
/// reading thread does) over the same loop, so the report splits the engine's
/// cost into step 1 and the rest (dedup, windows, output, checkpoints).
pub fn run_engine(a: BenchEngineArgs) -> anyhow::Result<()> {
    use std::io::BufRead;
    let cfg = a.config.load()?;
    let engine_cfg = cfg.engine()?;
    // The baseline parses with the engine's own parser under the same mapping: the
    // fastest available to these records (BENCHMARKS.md §3.2 says how it was chosen).
    let mapping = cfg.input_mapping()?;
    let out = std::env::temp_dir().join(format!("tally-bench-engine-{}.jsonl", std::process::id()));
    let mut best_base = f64::MAX;
    let mut best_step1 = f64::MAX;
    let mut best_engine = f64::MAX;
    let mut lines = 0u64;
    // Every line of the input through `each`, timed; returns the line count.
    let each_line = |each: &mut dyn FnMut(&[u8])| -> anyhow::Result<(u64, f64)> {
        let started = Instant::now();
        let mut r = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&a.input_file)?);
        let mut line = Vec::new();
        let mut n = 0u64;
        while r.read_until(b'\n', &mut line)? > 0 {
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            n += 1;
            each(&line);
            line.clear();
        }
        Ok((n, started.elapsed().as_secs_f64()))
    };
    let now_ms = crate::base::clock::now_ms();
    for _ in 0..a.rounds.max(1) {
        let mut valid = 0u64;
        let (n, secs) = each_line(&mut |line| valid += u64::from(mapping.parse(line).is_ok()))?;
        std::hint::black_box(valid);
        best_base = best_base.min(secs);
        lines = n;
        let mut batch = crate::engine::Prepared::default();
        let (_, secs) = each_line(&mut |line| {
            if batch.len() == 1024 {
                batch.clear();
            }
            let rec = crate::engine::RecordIn {
                payload: line,
                kafka_ts: None,
                now_ms,
            };
            batch.push(&engine_cfg, rec);
        })?;
        std::hint::black_box(batch.len());
        best_step1 = best_step1.min(secs);
        let started = Instant::now();
        let r = crate::worker::file::run(&cfg, &a.input_file, &out)?;
        anyhow::ensure!(
            r.interrupted.is_none(),
            "interrupted after line {}",
            r.lines
        );
        let c = r.counters;
        best_engine = best_engine.min(started.elapsed().as_secs_f64());
        anyhow::ensure!(
            c.consumed == n,
            "engine consumed {} of {n} lines",
            c.consumed
        );
    }
    for ext in ["", ".late.jsonl", ".dlq.jsonl"] {
        let _ = std::fs::remove_file(format!("{}{ext}", out.display()));
    }
    let rate = |secs: f64| lines as f64 / secs;
    let (base_rate, step1_rate, engine_rate) =
        (rate(best_base), rate(best_step1), rate(best_engine));
    println!("| run | events | best seconds | events/s | ratio to baseline |");
    println!("|---|---:|---:|---:|---:|");
    println!("| parse-only baseline | {lines} | {best_base:.2} | {base_rate:.0} | 1.00 |");
    println!(
        "| step 1 alone (parse, validate, price, fingerprint) | {lines} | {best_step1:.2} | {step1_rate:.0} | {:.2} |",
        step1_rate / base_rate
    );
    println!(
        "| tally run --input-file | {lines} | {best_engine:.2} | {engine_rate:.0} | {:.2} |",
        engine_rate / base_rate
    );
    let ns = |secs: f64| secs * 1e9 / lines as f64;
    println!();
    println!(
        "A record costs {:.0} ns in step 1 and {:.0} ns after it (the engine row less the \
         step-1 row: dedup, windows, panes, output, checkpoints, the hand-over).",
        ns(best_step1),
        ns(best_engine - best_step1)
    );
    Ok(())
}
