//! The fault loop of a chaos run: every few seconds (the plan's kill interval)
//! one fault from the plan's mix — a worker SIGKILLed and restarted, a worker
//! SIGKILLed and restarted armed at a crash point (`TALLY_CRASH_AT`) where it then
//! dies by itself, a worker SIGSTOPped past the session timeout and SIGCONTed (a
//! zombie), the sink SIGKILLed (and sometimes restarted armed at its crash point),
//! PostgreSQL restarted, `reprocess-late --follow` SIGKILLed and restarted from
//! its group's position, the S3 endpoint down for 1–4 s, the dev broker down
//! for 1–3 s or slow for 2–5 s. Every death of a worker that owned partitions is timed
//! until those partitions move on (`kills::recovered`).
//!
//! Invariants: the schedule is drawn from the plan's seed alone — fault n from
//! its own stream, seeded by the plan's seed and n, so the same seed draws the
//! same kinds, targets and delays in the same order whatever the processes do
//! between (only how many faults fit in the run depends on them); the loop ends only when the generator is done, every restart and
//! SIGCONT is done, the S3 endpoint and the broker are back and every kill is recovered (or given
//! up on after 120 s).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

pub use super::fault_log::{Event, FaultLog};
use super::kills::{behind, kill, recovered, rss_kb, Pending, Worker};
use super::plan::{FaultKind, Plan, SINK_CRASH_POINT, WORKER_CRASH_POINTS};
use super::s3_proxy::S3Proxy;

mod services;
use super::spawn::Spawner;
use crate::devtools::support::{self, signal};
use crate::gen::Rng;
use services::control_broker;

/// The exit status of a process whose service (here: the checkpoint store) is
/// unavailable (docs/reference/exit-codes.md).
const EXIT_UNAVAILABLE: i32 = 4;

enum Target {
    Worker(usize),
    Sink,
    Reprocess,
}

/// The services outside the processes that faults may hit.
pub(super) struct Outside<'a> {
    /// `scripts/pg.sh` directory, for PostgreSQL restarts.
    pub(super) pg_dir: Option<&'a Path>,
    /// The run's S3 endpoint, for outages.
    pub(super) s3: Option<&'a S3Proxy>,
    /// The dev broker's control file (`tally dev-broker --control-file`).
    pub(super) broker_ctl: Option<&'a Path>,
    /// The dev broker, for its metadata (a partition's leader).
    pub(super) kafka: Option<&'a crate::config::KafkaConfig>,
}

/// What seeds fault `n`'s stream, xored with the plan's seed.
pub fn fault_stream(n: u64) -> u64 {
    (n + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The loop's state.
pub(super) struct Faults<'a> {
    plan: &'a Plan,
    spawn: &'a Spawner,
    outside: Outside<'a>,
    rng: Rng,
    pub(super) workers: Vec<Worker>,
    pub(super) sink: Option<Child>,
    sink_armed: bool,
    /// `reprocess-late --follow`, in plans that run it.
    pub(super) reprocess: Option<Child>,
    /// When the S3 endpoint comes back from an outage.
    s3_back: Option<Instant>,
    /// When the dev broker's fault ends, and the command that ends it.
    broker_back: Option<(Instant, &'static str)>,
    /// When it last came back.
    s3_was_back: Option<Instant>,
    pending: Vec<Pending>,
    /// Faults so far (kills, crash deaths, zombies, sink kills, restarts of
    /// PostgreSQL).
    faults: usize,
    /// Faults drawn so far (each from its own stream).
    drawn: u64,
    restarts: Vec<(Instant, Target, Option<String>)>,
    conts: Vec<(Instant, usize)>,
    started: Instant,
    verbose: bool,
    pub(super) log: FaultLog,
}

impl<'a> Faults<'a> {
    pub(super) fn new(
        plan: &'a Plan,
        spawn: &'a Spawner,
        outside: Outside<'a>,
        workers: Vec<Worker>,
        (sink, reprocess): (Child, Option<Child>),
        verbose: bool,
    ) -> Self {
        Faults {
            plan,
            spawn,
            outside,
            rng: Rng::new(plan.seed),
            workers,
            sink: Some(sink),
            sink_armed: false,
            reprocess,
            s3_back: None,
            broker_back: None,
            s3_was_back: None,
            pending: Vec::new(),
            faults: 0,
            drawn: 0,
            restarts: Vec::new(),
            conts: Vec::new(),
            started: Instant::now(),
            verbose,
            log: FaultLog::default(),
        }
    }

    fn event(&mut self, what: String) {
        let at_s = self.started.elapsed().as_secs_f64();
        if self.verbose {
            println!("  {at_s:>6.1} s  {what}");
        }
        self.log.events.push(Event { at_s, what });
    }

    /// Runs faults until the generator `gen` is done and everything settled.
    /// Once it is done, the input's log ends (on `kafka`) are final, and an
    /// orphan consumed to its end counts as moved on.
    pub(super) fn run(
        &mut self,
        gen: &mut Child,
        (kafka, partitions): (&crate::config::KafkaConfig, i32),
    ) -> anyhow::Result<()> {
        self.started = Instant::now();
        let mut next = self.next_fault(Instant::now());
        let mut gen_done = false;
        let mut ends = None;
        while !gen_done
            || !self.pending.is_empty()
            || !self.restarts.is_empty()
            || !self.conts.is_empty()
            || self.s3_back.is_some()
            || self.broker_back.is_some()
        {
            std::thread::sleep(Duration::from_millis(100));
            gen_done = gen_done || gen.try_wait()?.is_some();
            // Not while the broker is down or slow; a failed fetch is tried again.
            if gen_done && ends.is_none() && self.broker_back.is_none() {
                ends = support::log_ends(kafka, "requests", partitions).ok();
            }
            for w in self.workers.iter_mut() {
                if let Some(c) = &w.child {
                    w.peak_rss_kb = w.peak_rss_kb.max(rss_kb(c.id()));
                }
            }
            self.reap()?;
            self.due(Instant::now())?;
            let (done, given_up) = recovered(
                &self.workers,
                &mut self.pending,
                self.faults,
                ends.as_ref().unwrap_or(&BTreeMap::new()),
            );
            self.log.never_recovered += given_up;
            if given_up > 0 {
                self.event(format!("{given_up} kills not recovered after 120 s"));
            }
            for (secs, stall, isolated) in done {
                self.log.recoveries.push(secs);
                self.log.stalls.push(stall);
                if isolated {
                    self.log.isolated_recoveries.push(secs);
                }
                let alone = if isolated { " (isolated)" } else { "" };
                self.event(format!("recovered after {secs:.1} s{alone}"));
            }
            // A worker fault waits until every earlier worker death has
            // recovered, every killed worker is restarted and every zombie
            // SIGCONTed: each kill's recovery is then its own, not the group's
            // settling from a storm of faults (crash-point deaths, S3 exits and
            // the other kinds still overlap).
            let settling = !self.pending.is_empty()
                || !self.conts.is_empty()
                || self
                    .restarts
                    .iter()
                    .any(|(_, t, _)| matches!(t, Target::Worker(_)));
            let held = settling && self.next_kind().hits_a_worker();
            if !gen_done && Instant::now() >= next && !held {
                self.fault()?;
                next = self.next_fault(Instant::now());
            }
        }
        self.log.never_recovered += self.pending.len();
        Ok(())
    }

    /// After the faults: waits (up to 300 s) until the workers have consumed the
    /// whole input, still restarting any worker that dies (one armed at a crash
    /// point may reach it only now); returns the partitions not drained by then.
    pub(super) fn drain(
        &mut self,
        kafka: &crate::config::KafkaConfig,
        partitions: i32,
    ) -> anyhow::Result<Vec<i32>> {
        // The broker may be just back from a fault: try for 30 s.
        let mut tries = 0;
        let ends = loop {
            match support::log_ends(kafka, "requests", partitions) {
                Ok(ends) => break ends,
                Err(e) if tries >= 30 => return Err(e),
                Err(_) => tries += 1,
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            self.reap()?;
            self.due(Instant::now())?;
            let behind = behind(&ends, &self.workers);
            if behind.is_empty() || Instant::now() > deadline {
                return Ok(behind);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// SIGKILLs every process the loop holds (a run that cannot go on must not
    /// leave them running).
    pub(super) fn kill_all(&mut self) {
        let children = self.workers.iter_mut().filter_map(|w| w.child.take());
        let others = [self.sink.take(), self.reprocess.take()];
        for mut c in children.chain(others.into_iter().flatten()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn between_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.rng.below(hi.saturating_sub(lo) + 1))
    }

    fn next_fault(&mut self, now: Instant) -> Instant {
        now + self.between_ms(self.plan.kill_min_ms, self.plan.kill_max_ms)
    }

    fn restart_at(&mut self) -> Instant {
        Instant::now() + self.between_ms(self.plan.restart_min_ms, self.plan.restart_max_ms)
    }

    /// The next fault, drawn from its own stream: fault n's kind, target and
    /// delays depend on (seed, n) alone, so what one fault finds (a worker
    /// already dead, the sink restarting) never shifts what the next one draws.
    fn fault(&mut self) -> anyhow::Result<()> {
        let stream = Rng::new(self.plan.seed ^ fault_stream(self.drawn));
        let main = std::mem::replace(&mut self.rng, stream);
        self.drawn += 1;
        let done = self.draw_fault();
        self.rng = main;
        done
    }

    /// The kind of the next fault (the first draw of its stream).
    fn next_kind(&self) -> FaultKind {
        let x = Rng::new(self.plan.seed ^ fault_stream(self.drawn)).below(1000) as u32;
        self.plan.faults.kind(x, self.outside.pg_dir.is_some())
    }

    /// One fault drawn from the plan's mix.
    fn draw_fault(&mut self) -> anyhow::Result<()> {
        self.faults += 1;
        let x = self.rng.below(1000) as u32;
        let kind = self.plan.faults.kind(x, self.outside.pg_dir.is_some());
        match kind {
            FaultKind::PgRestart => return self.pg_restart(),
            FaultKind::SinkKill => return self.kill_sink(),
            FaultKind::ReprocessKill => return self.kill_reprocess(),
            FaultKind::S3Outage => return self.s3_outage(),
            FaultKind::BrokerDown => return self.broker_fault(false),
            FaultKind::BrokerSlow => return self.broker_fault(true),
            FaultKind::LeaderChange => return self.leader_change(),
            FaultKind::Zombie | FaultKind::CrashPoint | FaultKind::Kill => {}
        }
        let alive: Vec<usize> = (0..self.workers.len())
            .filter(|i| self.workers[*i].child.is_some() && !self.workers[*i].stopped)
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        let i = alive[self.rng.below(alive.len() as u64) as usize];
        if kind == FaultKind::Zombie {
            return self.zombie(i);
        }
        let crash = (kind == FaultKind::CrashPoint).then(|| {
            let p = WORKER_CRASH_POINTS[self.rng.below(WORKER_CRASH_POINTS.len() as u64) as usize];
            format!("{p}:{}", 1 + self.rng.below(3))
        });
        self.kill_worker(i, crash)
    }

    /// SIGKILLs worker `i` and schedules its restart (armed at `crash`).
    fn kill_worker(&mut self, i: usize, crash: Option<String>) -> anyhow::Result<()> {
        let at = self.restart_at();
        let Some(owned) = kill(&mut self.workers[i])? else {
            return Ok(());
        };
        self.log.kills += 1;
        let armed = crash
            .as_deref()
            .map(|c| format!("; restart armed at {c}"))
            .unwrap_or_default();
        self.event(format!(
            "killed worker {i} (owned {:?}){armed}",
            owned.keys().collect::<Vec<_>>()
        ));
        self.orphaned(owned);
        self.restarts.push((at, Target::Worker(i), crash));
        Ok(())
    }

    /// Starts timing the recovery of a death that left `owned` orphaned.
    /// Starts timing the recovery of a worker death. Earlier deaths still
    /// recovering are superseded: their orphans join this death's, and the
    /// recovery is timed from this death (each time is from the last death
    /// before it); how long since the first of them goes to the stalls.
    fn orphaned(&mut self, owned: BTreeMap<i32, i64>) {
        let mut orphans = owned;
        let mut first = Instant::now();
        for p in self.pending.drain(..) {
            self.log.superseded += 1;
            first = first.min(p.first);
            for (part, o) in p.orphans {
                orphans.entry(part).or_insert(o);
            }
        }
        if !orphans.is_empty() {
            self.pending.push(Pending {
                at: Instant::now(),
                first,
                orphans,
                faults: self.faults,
            });
        }
    }

    fn zombie(&mut self, i: usize) -> anyhow::Result<()> {
        let Some(c) = &self.workers[i].child else {
            return Ok(());
        };
        signal(c.id(), libc::SIGSTOP);
        self.workers[i].stopped = true;
        let pause =
            Duration::from_millis(self.plan.session_timeout_ms) + self.between_ms(1000, 3000);
        self.conts.push((Instant::now() + pause, i));
        self.log.zombies += 1;
        self.event(format!(
            "SIGSTOP worker {i} for {:.1} s (a zombie)",
            pause.as_secs_f64()
        ));
        Ok(())
    }

    fn kill_sink(&mut self) -> anyhow::Result<()> {
        let crash = (self.rng.below(2) == 0)
            .then(|| format!("{SINK_CRASH_POINT}:{}", 1 + self.rng.below(3)));
        let at = self.restart_at();
        let Some(mut c) = self.sink.take() else {
            return Ok(());
        };
        c.kill()?;
        c.wait()?;
        self.log.sink_kills += 1;
        let armed = crash
            .as_deref()
            .map(|c| format!("; restart armed at {c}"))
            .unwrap_or_default();
        self.event(format!("killed the sink{armed}"));
        self.restarts.push((at, Target::Sink, crash));
        Ok(())
    }

    /// SIGKILLs `reprocess-late --follow` and schedules its restart from its
    /// group's position.
    fn kill_reprocess(&mut self) -> anyhow::Result<()> {
        let at = self.restart_at();
        let Some(mut c) = self.reprocess.take() else {
            return Ok(());
        };
        c.kill()?;
        c.wait()?;
        self.log.reprocess_kills += 1;
        self.event("killed reprocess-late --follow".into());
        self.restarts.push((at, Target::Reprocess, None));
        Ok(())
    }

    /// Restarts and SIGCONTs that are due.
    fn due(&mut self, now: Instant) -> anyhow::Result<()> {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.restarts)
            .into_iter()
            .partition(|(at, _, _)| *at <= now);
        self.restarts = later;
        for (_, target, crash) in due {
            match target {
                Target::Worker(i) => {
                    let w = &mut self.workers[i];
                    w.child = Some(self.spawn.worker(i, &w.state, crash.as_deref())?);
                    w.armed = crash;
                }
                Target::Sink => {
                    self.sink = Some(self.spawn.sink(crash.as_deref())?);
                    self.sink_armed = crash.is_some();
                }
                Target::Reprocess => self.reprocess = Some(self.spawn.reprocess("group")?),
            }
        }
        if let (Some((at, back)), Some(ctl)) = (self.broker_back, self.outside.broker_ctl) {
            if at <= now {
                control_broker(ctl, back)?;
                self.broker_back = None;
                self.event(format!("dev broker {back}"));
            }
        }
        if let (Some(at), Some(proxy)) = (self.s3_back, self.outside.s3) {
            if at <= now {
                proxy.up();
                self.s3_back = None;
                self.s3_was_back = Some(now);
                self.event("S3 endpoint back".into());
            }
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.conts)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.conts = later;
        for (_, i) in due {
            if let Some(c) = &self.workers[i].child {
                signal(c.id(), libc::SIGCONT);
            }
            self.workers[i].stopped = false;
            self.event(format!("SIGCONT worker {i}"));
        }
        Ok(())
    }

    /// A `reprocess-late --follow` that exited by itself: unexpected; restarted.
    fn reap_reprocess(&mut self) -> anyhow::Result<()> {
        let Some(status) = exited(&mut self.reprocess)? else {
            return Ok(());
        };
        self.reprocess = None;
        self.log.unexpected_exits += 1;
        self.event(format!("reprocess-late exited by itself ({status})"));
        let at = self.restart_at();
        self.restarts.push((at, Target::Reprocess, None));
        Ok(())
    }

    /// Workers and the sink that exited by themselves: at their crash point, or
    /// unexpectedly. Either way they are restarted (unarmed).
    fn reap(&mut self) -> anyhow::Result<()> {
        self.reap_reprocess()?;
        for i in 0..self.workers.len() {
            let Some(status) = exited(&mut self.workers[i].child)? else {
                continue;
            };
            let w = &mut self.workers[i];
            w.child = None;
            let armed = w.armed.take();
            let owned = super::kills::owned(&w.state);
            if armed.is_some() && status.signal() == Some(libc::SIGKILL) {
                self.log.crash_point_kills += 1;
                self.event(format!(
                    "worker {i} died at its crash point {}",
                    armed.unwrap_or_default()
                ));
            } else if status.code() == Some(EXIT_UNAVAILABLE) && self.s3_recently_down() {
                // Documented: a store it cannot reach stops a worker with exit 4,
                // to be restarted (docs/operations/checkpoints.md).
                self.log.s3_exits += 1;
                self.event(format!(
                    "worker {i} exited 4 (checkpoint store unavailable) in an S3 outage"
                ));
            } else {
                self.log.unexpected_exits += 1;
                let why = last_error(&self.workers[i].state.with_extension("log"));
                self.event(format!("worker {i} exited by itself ({status}){why}"));
            }
            self.faults += 1;
            self.orphaned(owned);
            let at = self.restart_at();
            self.restarts.push((at, Target::Worker(i), None));
        }
        let Some(status) = exited(&mut self.sink)? else {
            return Ok(());
        };
        self.sink = None;
        if std::mem::take(&mut self.sink_armed) && status.signal() == Some(libc::SIGKILL) {
            self.log.sink_kills += 1;
            self.event("the sink died at its crash point".into());
        } else {
            self.log.unexpected_exits += 1;
            self.event(format!("the sink exited by itself ({status})"));
        }
        let at = self.restart_at();
        self.restarts.push((at, Target::Sink, None));
        Ok(())
    }
}

/// `: <line>` — the last line of the log at `log` that says `error`, if any
/// (what made a process exit by itself, in the campaign's report).
fn last_error(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|text| {
            text.lines()
                .rev()
                .find(|l| l.contains("error"))
                .map(|l| format!(": {}", l.trim()))
        })
        .unwrap_or_default()
}

/// How `child` exited, if it is there and has exited.
fn exited(child: &mut Option<Child>) -> std::io::Result<Option<std::process::ExitStatus>> {
    Ok(child.as_mut().map(Child::try_wait).transpose()?.flatten())
}
