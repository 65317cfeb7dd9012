//! The kill loop of `tally-dev chaos`: workers killed at random and restarted,
//! each kill timed until its partitions move on elsewhere; then the drain and the
//! stop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use super::{dur, ChaosArgs};
use crate::devtools::support::{self, signal};
use crate::gen::Rng;
use crate::metrics::WorkerReport;

pub(super) struct Worker {
    pub(super) child: Option<Child>,
    pub(super) state: PathBuf,
    pub(super) peak_rss_kb: u64,
}

pub(super) fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

pub(super) fn report(state: &Path) -> Option<WorkerReport> {
    crate::worker::report::read(state).ok()
}

/// The run's timings, parsed from the arguments.
pub(super) struct Timing {
    pub(super) duration: Duration,
    pub(super) kill_min: Duration,
    pub(super) kill_max: Duration,
    pub(super) restart_min: Duration,
    pub(super) restart_max: Duration,
}

impl Timing {
    pub(super) fn parse(a: &ChaosArgs) -> anyhow::Result<Self> {
        let t = Timing {
            duration: dur(&a.duration)?,
            kill_min: dur(&a.kill_min)?,
            kill_max: dur(&a.kill_max)?,
            restart_min: dur(&a.restart_min)?,
            restart_max: dur(&a.restart_max)?,
        };
        anyhow::ensure!(
            t.kill_min <= t.kill_max && t.restart_min <= t.restart_max,
            "min must not exceed max"
        );
        Ok(t)
    }

    /// When the next kill is due, from `now`.
    pub(super) fn next_kill(&self, now: Instant, rng: &mut Rng) -> Instant {
        now + self.kill_min
            + Duration::from_millis(
                rng.below((self.kill_max - self.kill_min).as_millis() as u64 + 1),
            )
    }
}

/// What the kill loop saw.
pub(super) struct Kills {
    pub(super) kills: usize,
    /// Seconds from a kill until its partitions moved on elsewhere.
    pub(super) recoveries: Vec<f64>,
    /// Kills whose partitions were not seen recovered within 120 s.
    pub(super) never_recovered: usize,
}

/// Kills a random worker (sometimes two) every few seconds and restarts it after
/// a random delay, until the generator is done and every kill is recovered.
pub(super) fn kill_loop(
    timing: &Timing,
    rng: &mut Rng,
    workers: &mut [Worker],
    spawn_worker: &dyn Fn(&Path) -> anyhow::Result<Child>,
    gen: &mut Child,
    started: Instant,
) -> anyhow::Result<Kills> {
    let mut kills = 0usize;
    let mut recoveries: Vec<f64> = Vec::new();
    let mut pending: Vec<(Instant, BTreeMap<i32, i64>)> = Vec::new();
    let mut restarts: Vec<(Instant, usize)> = Vec::new();
    let mut next_kill = timing.next_kill(Instant::now(), rng);
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
        recovered(workers, &mut pending, &mut recoveries);
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
                let Some(owned) = kill(&mut workers[i], i, started)? else {
                    continue;
                };
                kills += 1;
                if !owned.is_empty() {
                    pending.push((Instant::now(), owned));
                }
                let span = (timing.restart_max - timing.restart_min).as_millis() as u64;
                restarts.push((
                    Instant::now()
                        + timing.restart_min
                        + Duration::from_millis(rng.below(span + 1)),
                    i,
                ));
            }
            next_kill = timing.next_kill(now, rng);
        }
    }
    Ok(Kills {
        kills,
        recoveries,
        never_recovered: pending.len(),
    })
}

/// SIGKILLs worker `i`, if it runs, and returns the partitions it owned (and their
/// next offsets).
pub(super) fn kill(
    w: &mut Worker,
    i: usize,
    started: Instant,
) -> anyhow::Result<Option<BTreeMap<i32, i64>>> {
    let Some(mut c) = w.child.take() else {
        return Ok(None);
    };
    let owned: BTreeMap<i32, i64> = report(&w.state)
        .map(|r| {
            r.partitions
                .iter()
                .map(|p| (p.partition.0, p.next_offset.0))
                .collect()
        })
        .unwrap_or_default();
    c.kill()?;
    c.wait()?;
    println!(
        "  {:>6.1} s  killed worker {i} (owned {:?})",
        started.elapsed().as_secs_f64(),
        owned.keys().collect::<Vec<_>>()
    );
    Ok(Some(owned))
}

/// Recovery: every orphaned partition is owned again and has moved past where it
/// was. Drops the recovered (and those given up on after 120 s) from `pending`.
pub(super) fn recovered(
    workers: &[Worker],
    pending: &mut Vec<(Instant, BTreeMap<i32, i64>)>,
    recoveries: &mut Vec<f64>,
) {
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
}

/// Waits (up to 300 s) until the workers have consumed the whole input topic.
pub(super) fn drain(
    kafka: &crate::config::KafkaConfig,
    partitions: i32,
    workers: &[Worker],
) -> anyhow::Result<()> {
    let ends = support::log_ends(kafka, "requests", partitions)?;
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
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// SIGTERMs every live worker and waits for it to stop.
pub(super) fn stop_workers(workers: &mut [Worker]) -> anyhow::Result<()> {
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
    Ok(())
}
