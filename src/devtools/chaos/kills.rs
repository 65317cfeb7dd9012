//! The workers of `tally-dev chaos`: a kill, the partitions a worker owned, the
//! recovery of a kill (its partitions owned again and moving on), the drain and
//! the stop. The fault loop (`faults`) drives them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::devtools::support::signal;
use crate::metrics::WorkerReport;

pub(super) struct Worker {
    pub(super) child: Option<Child>,
    pub(super) state: PathBuf,
    pub(super) peak_rss_kb: u64,
    /// SIGSTOPped (a zombie until its SIGCONT).
    pub(super) stopped: bool,
    /// The crash point (`<point>:<n>`) this run of the worker is armed at.
    pub(super) armed: Option<String>,
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

/// The partitions worker `state` owned by its last report (and their next
/// offsets).
pub(super) fn owned(state: &Path) -> BTreeMap<i32, i64> {
    report(state)
        .map(|r| {
            r.partitions
                .iter()
                .map(|p| (p.partition.0, p.next_offset.0))
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILLs a worker, if it runs, and returns the partitions it owned (and their
/// next offsets).
pub(super) fn kill(w: &mut Worker) -> anyhow::Result<Option<BTreeMap<i32, i64>>> {
    let Some(mut c) = w.child.take() else {
        return Ok(None);
    };
    let owned = owned(&w.state);
    if w.stopped {
        signal(c.id(), libc::SIGCONT);
        w.stopped = false;
    }
    c.kill()?;
    c.wait()?;
    w.armed = None;
    Ok(Some(owned))
}

/// A worker death whose partitions have not moved on yet.
pub(super) struct Pending {
    /// The last death.
    pub(super) at: Instant,
    /// The first of the deaths whose orphans these are.
    pub(super) first: Instant,
    /// The partitions the worker owned, and their next offsets.
    pub(super) orphans: BTreeMap<i32, i64>,
    /// The fault count just after this death: if it is still the count at the
    /// recovery, no other fault overlapped this one (an isolated recovery).
    pub(super) faults: usize,
}

/// Recovery: every orphaned partition is owned again and has moved past where it
/// was, or has reached its log end in `ends` (the input's final ends, once the
/// generator is done; empty before — an orphan already at its end cannot move
/// past it). Drops the recovered and those given up on after 120 s from `pending`;
/// returns the recovered ones' times from the last and from the first death,
/// each with whether it was isolated (`faults` is the fault count now), and how
/// many were given up on.
pub(super) fn recovered(
    workers: &[Worker],
    pending: &mut Vec<Pending>,
    faults: usize,
    ends: &BTreeMap<i32, i64>,
) -> (Vec<(f64, f64, bool)>, usize) {
    let live: Vec<WorkerReport> = workers
        .iter()
        .filter(|w| w.child.is_some())
        .filter_map(|w| report(&w.state))
        .collect();
    let mut done = Vec::new();
    let mut given_up = 0;
    pending.retain(|p| {
        let recovered = p.orphans.iter().all(|(part, o)| {
            live.iter().any(|r| {
                r.at_ms > 0
                    && r.partitions.iter().any(|x| {
                        x.partition.0 == *part
                            && (x.next_offset.0 > *o
                                || ends.get(part).is_some_and(|e| x.next_offset.0 >= *e))
                    })
            })
        });
        if recovered {
            done.push((
                p.at.elapsed().as_secs_f64(),
                p.first.elapsed().as_secs_f64(),
                p.faults == faults,
            ));
        }
        let waiting = !recovered && p.at.elapsed() < Duration::from_secs(120);
        given_up += usize::from(!recovered && !waiting);
        waiting
    });
    (done, given_up)
}

/// The partitions of `ends` (partition, log end) that no worker's report shows
/// consumed to the end.
pub(super) fn behind(ends: &BTreeMap<i32, i64>, workers: &[Worker]) -> Vec<i32> {
    let reports: Vec<WorkerReport> = workers.iter().filter_map(|w| report(&w.state)).collect();
    ends.iter()
        .filter(|(p, end)| {
            !reports.iter().any(|r| {
                r.partitions
                    .iter()
                    .any(|x| x.partition.0 == **p && x.next_offset.0 >= **end)
            })
        })
        .map(|(p, _)| *p)
        .collect()
}

/// SIGTERMs every live worker (all at once, so their leaves overlap) and waits
/// for each to stop; returns how many did not within 60 s (then SIGKILLed).
pub(super) fn stop_workers(workers: &mut [Worker]) -> anyhow::Result<usize> {
    let mut hung = 0;
    for w in workers.iter_mut() {
        if let Some(c) = &w.child {
            w.peak_rss_kb = w.peak_rss_kb.max(rss_kb(c.id()));
            signal(c.id(), libc::SIGTERM);
        }
    }
    // Bounded: a worker that does not stop is killed (its checkpoint is complete
    // before it leaves the group), and the run goes on.
    let deadline = Instant::now() + Duration::from_secs(60);
    for w in workers.iter_mut() {
        if let Some(mut c) = w.child.take() {
            while c.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    println!(
                        "  worker {} did not stop 60 s after SIGTERM; killed",
                        c.id()
                    );
                    c.kill()?;
                    c.wait()?;
                    hung += 1;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(hung)
}
