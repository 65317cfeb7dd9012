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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use super::fault_log::{Event, FaultLog};
use super::kills::{behind, kill, recovered, rss_kb, Pending, Worker};
use super::plan::{Plan, SINK_CRASH_POINT, WORKER_CRASH_POINTS};
use super::s3_proxy::S3Proxy;
use super::spawn::Spawner;
use crate::devtools::support::{self, signal};
use crate::gen::Rng;

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
}

/// What seeds fault `n`'s stream, xored with the plan's seed.
pub fn fault_stream(n: u64) -> u64 {
    (n + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Hands `command` to the dev broker: its control file, written whole.
fn control_broker(ctl: &Path, command: &str) -> anyhow::Result<()> {
    let tmp = ctl.with_extension("tmp");
    std::fs::write(&tmp, format!("{command}\n"))?;
    std::fs::rename(&tmp, ctl)?;
    Ok(())
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
            for (secs, isolated) in done {
                self.log.recoveries.push(secs);
                if isolated {
                    self.log.isolated_recoveries.push(secs);
                }
                let alone = if isolated { " (isolated)" } else { "" };
                self.event(format!("recovered after {secs:.1} s{alone}"));
            }
            if !gen_done && Instant::now() >= next {
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

    /// One fault drawn from the plan's mix.
    fn draw_fault(&mut self) -> anyhow::Result<()> {
        let f = self.plan.faults;
        self.faults += 1;
        let x = self.rng.below(1000) as u32;
        let pg = if self.outside.pg_dir.is_some() {
            f.pg_restart
        } else {
            0
        };
        if x < pg {
            return self.pg_restart();
        }
        if x < pg + f.sink {
            return self.kill_sink();
        }
        // Tested apart from the worker faults' ranges, so that a plan without
        // them draws the schedule earlier builds drew.
        let worker_faults = pg + f.sink + f.zombie + f.crash_point;
        if (worker_faults..worker_faults + f.reprocess_kill).contains(&x) {
            return self.kill_reprocess();
        }
        let s3 = worker_faults + f.reprocess_kill;
        if (s3..s3 + f.s3_outage).contains(&x) {
            return self.s3_outage();
        }
        let down = s3 + f.s3_outage;
        if (down..down + f.broker_down).contains(&x) {
            return self.broker_fault(false);
        }
        if (down + f.broker_down..down + f.broker_down + f.broker_slow).contains(&x) {
            return self.broker_fault(true);
        }
        let alive: Vec<usize> = (0..self.workers.len())
            .filter(|i| self.workers[*i].child.is_some() && !self.workers[*i].stopped)
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        let i = alive[self.rng.below(alive.len() as u64) as usize];
        if x < pg + f.sink + f.zombie {
            return self.zombie(i);
        }
        let crash = (x < pg + f.sink + f.zombie + f.crash_point).then(|| {
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
    fn orphaned(&mut self, owned: BTreeMap<i32, i64>) {
        if !owned.is_empty() {
            self.pending.push(Pending {
                at: Instant::now(),
                orphans: owned,
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

    /// The dev broker down for 1–3 s, or (`slow`) every response of it delayed
    /// by 200–800 ms for 2–5 s; one broker fault at a time.
    fn broker_fault(&mut self, slow: bool) -> anyhow::Result<()> {
        let (command, back, pause) = if slow {
            let rtt = self.between_ms(200, 800).as_millis();
            (format!("rtt {rtt}"), "rtt 0", self.between_ms(2000, 5000))
        } else {
            ("down".to_string(), "up", self.between_ms(1000, 3000))
        };
        let Some(ctl) = self.outside.broker_ctl else {
            return Ok(());
        };
        if self.broker_back.is_some() {
            return Ok(());
        }
        control_broker(ctl, &command)?;
        self.broker_back = Some((Instant::now() + pause, back));
        if slow {
            self.log.broker_slows += 1;
        } else {
            self.log.broker_downs += 1;
        }
        self.event(format!(
            "dev broker {command} for {:.1} s",
            pause.as_secs_f64()
        ));
        Ok(())
    }

    /// The S3 endpoint is down, or came back less than 10 s ago.
    fn s3_recently_down(&self) -> bool {
        self.s3_back.is_some()
            || self
                .s3_was_back
                .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
    }

    /// Takes the S3 endpoint down for 1–4 s (unless it is down already).
    fn s3_outage(&mut self) -> anyhow::Result<()> {
        let pause = self.between_ms(1000, 4000);
        let Some(proxy) = self.outside.s3 else {
            return Ok(());
        };
        if self.s3_back.is_some() {
            return Ok(());
        }
        proxy.down();
        self.s3_back = Some(Instant::now() + pause);
        self.log.s3_outages += 1;
        self.event(format!(
            "S3 endpoint down for {:.1} s (connections reset, new ones refused)",
            pause.as_secs_f64()
        ));
        Ok(())
    }

    fn pg_restart(&mut self) -> anyhow::Result<()> {
        let Some(dir) = self.outside.pg_dir else {
            return Ok(());
        };
        let out = Command::new("scripts/pg.sh")
            .arg("restart")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/pg.sh restart failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.log.pg_restarts += 1;
        self.event("restarted PostgreSQL".into());
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
                self.event(format!("worker {i} exited by itself ({status})"));
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

/// How `child` exited, if it is there and has exited.
fn exited(child: &mut Option<Child>) -> std::io::Result<Option<std::process::ExitStatus>> {
    Ok(child.as_mut().map(Child::try_wait).transpose()?.flatten())
}
