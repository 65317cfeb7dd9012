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
//!
//! CPU-honest (issue 38): each `--cores` setting pins both children to that many
//! cores (`sched_setaffinity` before exec), and the raw baseline then runs as many
//! threads as tally's record path does (one core: one thread that polls and
//! parses; two: a thread that polls and hands the payloads over, in batches, to one
//! that parses, as tally's poll thread hands prepared records to its loop). The
//! table reports each side's best wall time and its least CPU per million events,
//! and tally's CPU over the baseline's.

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
    /// The cores both sides are pinned to, one setting after another (each a count:
    /// cores 0..N).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub cores: Vec<usize>,
    /// Internal: be the raw consumer baseline (read and parse the input topic to
    /// its end in group GROUP, print the record count).
    #[arg(long, value_name = "GROUP", hide = true)]
    pub raw_consumer: Option<String>,
    /// Internal: the raw baseline's threads (1: poll and parse; 2: poll, parse).
    #[arg(long, default_value_t = 1, hide = true)]
    pub raw_threads: usize,
}

/// What one child process cost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cost {
    pub(crate) wall_s: f64,
    pub(crate) cpu_s: f64,
    pub(crate) peak_rss_kib: i64,
}

/// Pins the command's process to cores `0..n` (before it execs).
fn pinned(cmd: &mut Command, n: usize) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only async-signal-safe calls: building a
    // cpu_set_t on the stack and sched_setaffinity.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for c in 0..n {
                libc::CPU_SET(c, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
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

/// The baseline: subscribe, read every record to the log end, parse each payload
/// (on this thread, or with `threads` 2 on a second one, handed over in batches).
fn raw_consume(cfg: &Config, group: &str, threads: usize) -> anyhow::Result<()> {
    let (total, _) = topic_records(cfg)?;
    let mut c = consumer_config(&cfg.kafka);
    c.set("group.id", group);
    // tally's consumers refuse a position outside the log (`error`) and start a new
    // group at the earliest offset themselves; a raw loop lets librdkafka do that.
    c.set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = c.create()?;
    consumer.subscribe(&[&cfg.topics.input])?;
    let mapping = cfg.input_mapping()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let poll = |each: &mut dyn FnMut(&[u8])| -> anyhow::Result<i64> {
        let mut n = 0i64;
        while n < total {
            ensure!(
                Instant::now() < deadline,
                "raw consumer: read {n} of {total}"
            );
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                each(m?.payload().unwrap_or_default());
                n += 1;
            }
        }
        Ok(n)
    };
    let (n, valid) = if threads < 2 {
        let mut valid = 0u64;
        let n = poll(&mut |p| valid += u64::from(mapping.parse(p).is_ok()))?;
        (n, valid)
    } else {
        const BATCH: usize = 1024;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Vec<u8>>>(4);
        let parser = std::thread::spawn(move || {
            let mut valid = 0u64;
            for batch in rx {
                for p in &batch {
                    valid += u64::from(mapping.parse(p).is_ok());
                }
            }
            valid
        });
        let mut batch = Vec::with_capacity(BATCH);
        let n = poll(&mut |p| {
            batch.push(p.to_vec());
            if batch.len() == BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                let _ = tx.send(full);
            }
        })?;
        let _ = tx.send(batch);
        drop(tx);
        let valid = parser
            .join()
            .map_err(|_| anyhow::anyhow!("the parser thread panicked"))?;
        (n, valid)
    };
    std::hint::black_box(valid);
    println!("{n}");
    Ok(())
}

pub fn run(a: BenchKafkaArgs) -> anyhow::Result<()> {
    let cfg = a.config.load()?;
    if let Some(group) = &a.raw_consumer {
        return raw_consume(&cfg, group, a.raw_threads);
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
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = Vec::new();
    let mut latency = Vec::new();
    for &cores in &a.cores {
        ensure!(
            (1..=available).contains(&cores),
            "--cores {cores}: this machine has {available}"
        );
        let side = Sides::measure(&a, &config_path, records, cores, &mut latency)?;
        rows.push((cores, side));
    }
    print_tables(records, partitions, &rows, &latency);
    Ok(())
}

/// A side's run of the best wall time, and its least CPU seconds over the rounds.
type Best = (Cost, f64);

/// Both sides' figures over the rounds of one `--cores` setting.
struct Sides {
    raw: Best,
    tally: Best,
}

impl Sides {
    fn measure(
        a: &BenchKafkaArgs,
        config_path: &std::path::Path,
        records: i64,
        cores: usize,
        latency: &mut Vec<crate::base::histogram::Histogram>,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let tally_bin = super::support::tally_beside_me()?;
        let (mut raw, mut tally): (Option<Best>, Option<Best>) = (None, None);
        let keep = |slot: &mut Option<Best>, c: Cost| {
            let (best, cpu) = slot.map_or((c, c.cpu_s), |(b, cpu)| {
                (if c.wall_s < b.wall_s { c } else { b }, cpu.min(c.cpu_s))
            });
            *slot = Some((best, cpu));
        };
        for round in 0..a.rounds.max(1) {
            let tag = format!("{}-{cores}-{round}", std::process::id());
            let c = measured(
                pinned(&mut Command::new(&exe), cores)
                    .args(["bench-kafka", "--config"])
                    .arg(config_path)
                    .args(["--raw-consumer", &format!("bench-raw-{tag}")])
                    .args(["--raw-threads", &cores.min(2).to_string()])
                    .stdout(std::process::Stdio::null()),
            )?;
            keep(&mut raw, c);
            let dir = a.dir.join(&tag);
            let c = measured(
                pinned(&mut Command::new(&tally_bin), cores)
                    .args(["run", "--until-end", "--config"])
                    .arg(config_path)
                    .env("TALLY_KAFKA__GROUP_ID", format!("bench-tally-{tag}"))
                    .env("TALLY_STATE__DIR", dir.join("state"))
                    .env("TALLY_CHECKPOINT__DIR", dir.join("checkpoints")),
            )?;
            keep(&mut tally, c);
            let report =
                crate::worker::report::read(&dir.join("state")).map_err(anyhow::Error::msg)?;
            let consumed: u64 = report.partitions.iter().map(|p| p.counters.consumed).sum();
            ensure!(
                consumed == records as u64,
                "tally consumed {consumed} of {records} records"
            );
            latency.push(report.pane_ack_us);
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(Self {
            raw: raw.expect("one round"),
            tally: tally.expect("one round"),
        })
    }
}

fn print_tables(
    records: i64,
    partitions: usize,
    rows: &[(usize, Sides)],
    latency: &[crate::base::histogram::Histogram],
) {
    let rate = |c: Cost| records as f64 / c.wall_s;
    let per_m = |cpu: f64| cpu / (records as f64 / 1e6);
    println!(
        "| run ({records} records, {partitions} partitions) | cores | best seconds | events/s | wall ratio | CPU s per M events | CPU / raw's | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (cores, s) in rows {
        let threads = if *cores < 2 {
            "one thread"
        } else {
            "two threads"
        };
        for (name, (c, cpu)) in [
            (format!("raw rdkafka consume + parse, {threads}"), s.raw),
            (
                "tally run --until-end (checkpoints on)".to_string(),
                s.tally,
            ),
        ] {
            println!(
                "| {name} | {cores} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} |",
                c.wall_s,
                rate(c),
                rate(c) / rate(s.raw.0),
                per_m(cpu),
                cpu / s.raw.1,
                c.peak_rss_kib as f64 / 1024.0
            );
        }
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
}
