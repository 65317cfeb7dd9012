//! `tally-dev bench-kafka`: tally draining a preloaded input topic vs a raw rdkafka
//! consumer that only reads and parses the same topic, on the same broker, in one run.
//!
//! Both sides are child processes measured the same way (`wait4`): wall time, CPU
//! seconds (user + system, all threads) and peak RSS. Both subscribe in a fresh
//! consumer group with tally's consumer defaults, so both pay the same group join;
//! tally runs `tally run --until-end` with checkpoints on at the configured interval
//! and fresh state, checkpoint and group each round. The broker is a separate
//! process (`tally dev-broker`), shared by both sides.
//!
//! It also reports the on-time pane latency of each tally round (the watermark
//! passing a window end → the pane acknowledged by Kafka), from the worker's report.

#![allow(unsafe_code)] // FFI: wait4 for a child's rusage.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;

use crate::config::Config;
use crate::kafka::consumer_config;

#[derive(Args, Debug)]
pub struct BenchKafkaArgs {
    #[command(flatten)]
    pub config: crate::cli::ConfigArg,
    /// Alternate baseline and tally runs this many times; report the best of each.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Scratch directory for the tally runs' state and checkpoints.
    #[arg(long, default_value = "/tmp/tally-bench-kafka")]
    pub dir: PathBuf,
    /// Internal: be the raw consumer baseline (read and parse the input topic to
    /// its end in group GROUP, print the record count).
    #[arg(long, value_name = "GROUP", hide = true)]
    pub raw_consumer: Option<String>,
}

/// What one child process cost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cost {
    pub(crate) wall_s: f64,
    pub(crate) cpu_s: f64,
    pub(crate) peak_rss_kib: i64,
}

pub(crate) fn measured(cmd: &mut Command) -> anyhow::Result<Cost> {
    let started = Instant::now();
    let child = cmd.spawn().context("spawning a benchmark child")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child; pointers are valid for the call.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let wall_s = started.elapsed().as_secs_f64();
    ensure!(pid > 0, "wait4 failed: {}", std::io::Error::last_os_error());
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "benchmark child {cmd:?} failed (status {status})"
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Cost {
        wall_s,
        cpu_s: secs(ru.ru_utime) + secs(ru.ru_stime),
        peak_rss_kib: ru.ru_maxrss,
    })
}

/// The records in the input topic now (sum of log-end minus log-start).
fn topic_records(cfg: &Config) -> anyhow::Result<(i64, usize)> {
    let consumer: BaseConsumer = consumer_config(&cfg.kafka).create()?;
    let topic = &cfg.topics.input;
    let parts = crate::kafka::partition_count(&consumer, topic)?;
    ensure!(parts > 0, "input topic {topic} has no partitions");
    let mut total = 0;
    for p in 0..parts as i32 {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        ensure!(
            low == 0,
            "{topic}/{p} starts at offset {low}: the dev broker dropped records (it keeps \
             5 MiB per partition); preload fewer events or use more partitions"
        );
        total += high;
    }
    Ok((total, parts))
}

/// The baseline: subscribe, read every record to the log end, parse each payload.
fn raw_consume(cfg: &Config, group: &str) -> anyhow::Result<()> {
    let (total, _) = topic_records(cfg)?;
    let mut c = consumer_config(&cfg.kafka);
    c.set("group.id", group);
    // tally's consumers refuse a position outside the log (`error`) and start a new
    // group at the earliest offset themselves; a raw loop lets librdkafka do that.
    c.set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = c.create()?;
    consumer.subscribe(&[&cfg.topics.input])?;
    let mapping = cfg.input_mapping()?;
    let (mut n, mut valid) = (0i64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(600);
    while n < total {
        ensure!(
            Instant::now() < deadline,
            "raw consumer: read {n} of {total}"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m?;
            valid += u64::from(mapping.parse(m.payload().unwrap_or_default()).is_ok());
            n += 1;
        }
    }
    std::hint::black_box(valid);
    println!("{n}");
    Ok(())
}

pub fn run(a: BenchKafkaArgs) -> anyhow::Result<()> {
    let cfg = a.config.load()?;
    if let Some(group) = &a.raw_consumer {
        return raw_consume(&cfg, group);
    }
    let config_path = a
        .config
        .config
        .clone()
        .context("--config is required (the broker and topics to measure)")?;
    let (records, partitions) = topic_records(&cfg)?;
    ensure!(
        records > 0,
        "the input topic is empty: preload it with `tally gen`"
    );
    let exe = std::env::current_exe()?;
    let tally_bin = super::support::tally_beside_me()?;
    let (mut base, mut tally): (Option<Cost>, Option<Cost>) = (None, None);
    let mut latency = Vec::new();
    let best = |slot: &mut Option<Cost>, c: Cost| {
        if slot.is_none_or(|b| c.wall_s < b.wall_s) {
            *slot = Some(c);
        }
    };
    for round in 0..a.rounds.max(1) {
        let tag = format!("{}-{round}", std::process::id());
        let c = measured(
            Command::new(&exe)
                .args(["bench-kafka", "--config"])
                .arg(&config_path)
                .args(["--raw-consumer", &format!("bench-raw-{tag}")])
                .stdout(std::process::Stdio::null()),
        )?;
        best(&mut base, c);
        let dir = a.dir.join(&tag);
        let c = measured(
            Command::new(&tally_bin)
                .args(["run", "--until-end", "--config"])
                .arg(&config_path)
                .env("TALLY_KAFKA__GROUP_ID", format!("bench-tally-{tag}"))
                .env("TALLY_STATE__DIR", dir.join("state"))
                .env("TALLY_CHECKPOINT__DIR", dir.join("checkpoints")),
        )?;
        best(&mut tally, c);
        let report = crate::worker::report::read(&dir.join("state")).map_err(anyhow::Error::msg)?;
        let consumed: u64 = report.partitions.iter().map(|p| p.counters.consumed).sum();
        ensure!(
            consumed == records as u64,
            "tally consumed {consumed} of {records} records"
        );
        latency.push(report.pane_ack_us);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (base, tally) = (base.expect("one round"), tally.expect("one round"));
    let rate = |c: Cost| records as f64 / c.wall_s;
    let per_m = |c: Cost| c.cpu_s / (records as f64 / 1e6);
    println!(
        "| run ({records} records, {partitions} partitions) | best seconds | events/s | ratio | CPU s per M events | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, c) in [
        ("raw rdkafka consume + parse", base),
        ("tally run --until-end (checkpoints on)", tally),
    ] {
        println!(
            "| {name} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} |",
            c.wall_s,
            rate(c),
            rate(c) / rate(base),
            per_m(c),
            c.peak_rss_kib as f64 / 1024.0
        );
    }
    println!();
    println!("| round | on-time panes acknowledged | latency p50 | p99 | p99.9 |");
    println!("|---:|---:|---:|---:|---:|");
    let ms = |h: &crate::base::histogram::Histogram, q| {
        h.quantile(q)
            .map_or("-".into(), |us| format!("{:.1} ms", us as f64 / 1000.0))
    };
    for (i, h) in latency.iter().enumerate() {
        println!(
            "| {i} | {} | {} | {} | {} |",
            h.count(),
            ms(h, 500),
            ms(h, 990),
            ms(h, 999)
        );
    }
    Ok(())
}
