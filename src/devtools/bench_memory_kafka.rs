//! `bench-memory`'s `kafka` case: a real `tally run` worker against a `tally
//! dev-broker`, under a small `state.memory_budget`, and its peak RSS — the one
//! case that holds what the rig leaves out: librdkafka's queues (prefetched input,
//! results waiting for delivery), the poll thread's chunks, the outputs, and the
//! Kafka worker's checkpoint exports running beside the records (a delta in
//! flight while the windows grow back).
//!
//! The input: `tenants` tenants, one request each per minute of event time for
//! `minutes` minutes, spread over the minute in tenant order, on 4 partitions;
//! two minutes of allowed lateness, so every window end fires (reading its evicted
//! windows back) and is purged later; a checkpoint a second. The dev broker keeps
//! only the newest 5 MiB per partition, so the records go in rounds: a round is
//! produced only while the worker is at most one round behind (its
//! `report.json`). Once every record is consumed, the worker is stopped (SIGTERM:
//! its final checkpoint) and its peak RSS is the larger of the `VmHWM` sampled
//! while it ran and its `ru_maxrss` at exit.

#![allow(unsafe_code)] // wait4: the worker's rusage at exit.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::support::{signal, tally_beside_me, DevBroker};
use crate::kafka::outputs::{send, DeliveryTracker, UNTIMED};
use crate::kafka::{client_config, PRODUCER_DEFAULTS};

const PARTITIONS: i32 = 4;
/// Records produced between two looks at the worker's progress (about 1 MiB a
/// partition: two rounds stay far below the broker's 5 MiB).
const ROUND: usize = 20_000;

/// What the case measured.
pub struct KafkaPeak {
    /// Bytes: the worker's peak RSS over its whole life.
    pub peak: u64,
    /// Windows evicted to the working copy at the most, and checkpoints completed.
    pub spilled: usize,
    pub checkpoints: u64,
}

/// Runs the case under `dir` with `budget` (e.g. `"16MiB"`).
pub fn run(dir: &Path, budget: &str, tenants: usize, minutes: i64) -> anyhow::Result<KafkaPeak> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let tally = tally_beside_me()?;
    let broker = DevBroker::start(
        &tally,
        &[
            ("requests", PARTITIONS),
            ("tenant-cost", PARTITIONS),
            ("requests.late", 1),
            ("requests.dlq", 1),
        ],
    )?;
    let state = dir.join("state");
    let cfg = dir.join("worker.toml");
    std::fs::write(&cfg, config(&broker.bootstrap, dir, budget))?;
    let log = std::fs::File::create(dir.join("worker.log"))?;
    let mut worker = Command::new(&tally)
        .args(["run", "--config"])
        .arg(&cfg)
        .env("TALLY_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("spawning the worker")?;
    let fed = feed(&broker, &state, worker.id(), tenants, minutes);
    let sampled = status_kib(worker.id(), "VmHWM:").unwrap_or(0) * 1024;
    if fed.is_err() {
        let _ = worker.kill();
        let _ = worker.wait();
    }
    let see = || format!("see {}", dir.join("worker.log").display());
    let (spilled, checkpoints) = fed.with_context(see)?;
    signal(worker.id(), libc::SIGTERM);
    let at_exit = wait_peak(&worker).with_context(see)?;
    Ok(KafkaPeak {
        peak: sampled.max(at_exit),
        spilled,
        checkpoints,
    })
}

fn config(bootstrap: &str, dir: &Path, budget: &str) -> String {
    let d = dir.display();
    format!(
        r#"[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "bench-memory"
[window]
allowed_lateness = "2m"
[checkpoint]
dir = "{d}/checkpoints"
interval = "1s"
[state]
dir = "{d}/state"
memory_budget = "{budget}"
[prices.m]
input_per_1k = "0.00015"
output_per_1k = "0.0006"
"#
    )
}

/// Produces the input in rounds, paced by the worker's report, until the worker
/// has consumed all of it; returns the most windows it held evicted and the
/// checkpoints it completed. Stops early if the worker exits.
fn feed(
    broker: &DevBroker,
    state: &Path,
    worker: u32,
    tenants: usize,
    minutes: i64,
) -> anyhow::Result<(usize, u64)> {
    let producer: BaseProducer<DeliveryTracker> = client_config(&broker.kafka(), PRODUCER_DEFAULTS)
        .create_with_context(DeliveryTracker::default())?;
    let total = tenants * minutes as usize;
    let mut progress = Progress::default();
    let mut sent = 0;
    while sent < total {
        let round_end = (sent + ROUND).min(total);
        for i in sent..round_end {
            let (m, t) = ((i / tenants) as i64, i % tenants);
            let ts = super::rig::T0 + m * 60_000 + (t as i64 * 60_000 / tenants as i64);
            let payload = format!(
                r#"{{"request_id":"m{m}-t{t}","tenant_id":"tenant-{t}","model":"m","prompt_tokens":100,"completion_tokens":10,"completed_ts":{ts}}}"#
            );
            let record = BaseRecord::with_opaque_to("requests", UNTIMED)
                .partition((t % PARTITIONS as usize) as i32)
                .payload(payload.as_bytes());
            send(&producer, record)?;
            producer.poll(Duration::ZERO);
        }
        producer.flush(Duration::from_secs(60))?;
        producer.context().take_failures()?;
        sent = round_end;
        // At most one round unconsumed before the next is produced.
        progress.wait_for(state, worker, sent.saturating_sub(ROUND))?;
    }
    progress.wait_for(state, worker, total)?;
    // One more checkpoint past the last record (its export, with the delta of
    // the last windows, is part of the measure).
    let seen = progress.checkpoints;
    progress.until(state, worker, |p| p.checkpoints > seen)?;
    Ok((progress.spilled, progress.checkpoints))
}

/// What the worker's report said so far.
#[derive(Default)]
struct Progress {
    consumed: u64,
    spilled: usize,
    checkpoints: u64,
}

impl Progress {
    fn wait_for(&mut self, state: &Path, worker: u32, records: usize) -> anyhow::Result<()> {
        self.until(state, worker, |p| p.consumed >= records as u64)
    }

    /// Reads the report every 100 ms until `done` (10 minutes at most).
    fn until(
        &mut self,
        state: &Path,
        worker: u32,
        done: impl Fn(&Progress) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        while !done(self) {
            // Not reaped here: `wait_peak` reads its rusage.
            ensure!(running(worker), "the worker exited");
            ensure!(
                Instant::now() < deadline,
                "the worker consumed {} records in 10 minutes",
                self.consumed
            );
            std::thread::sleep(Duration::from_millis(100));
            if let Ok(r) = crate::worker::report::read(state) {
                self.consumed = r.partitions.iter().map(|p| p.counters.consumed).sum();
                let spilled = r.partitions.iter().map(|p| p.spilled_windows).sum();
                self.spilled = self.spilled.max(spilled);
                self.checkpoints = r.checkpoint.completed;
            }
            if std::env::var_os("TALLY_BENCH_TRACE").is_some() {
                eprintln!(
                    "kafka: consumed {} spilled {} checkpoints {} rss {} KiB peak {} KiB",
                    self.consumed,
                    self.spilled,
                    self.checkpoints,
                    status_kib(worker, "VmRSS:").unwrap_or(0),
                    status_kib(worker, "VmHWM:").unwrap_or(0)
                );
            }
        }
        Ok(())
    }
}

/// Whether process `pid` is alive (not exited, whether or not reaped).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("State:"))
            .is_some_and(|l| !l[6..].trim_start().starts_with('Z'))
    })
}

/// A field of `/proc/<pid>/status`, KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Waits for the worker (2 minutes at most, then kills it); its peak RSS, bytes.
fn wait_peak(worker: &Child) -> anyhow::Result<u64> {
    let pid = worker.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child, without blocking; pointers valid.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        ensure!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            signal(pid as u32, libc::SIGKILL);
            anyhow::bail!("the worker did not stop within 2 minutes of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the worker failed (status {status})"
    );
    Ok(ru.ru_maxrss as u64 * 1024)
}
