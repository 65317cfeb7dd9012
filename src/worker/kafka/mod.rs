//! The Kafka worker loop: chunks from the poll thread (`poller`: consume, step 1)
//! → the partitions (`worker::partitions`) → producers (`outputs`), with a
//! checkpoint every `checkpoint.interval`, on revoke (inside the rebalance
//! callback, on the poll thread) and on shutdown, through the coordinator.
//!
//! The loop and the rebalance callback take turns on the worker's state (`worker`,
//! behind one lock); what only a consumer group meets — restores, a fetch position
//! outside the log — is in `restore`. Before the final checkpoint the poll thread
//! is stopped and joined: from then on nothing polls but the loop's own leaving of
//! the group.

pub mod outputs;
pub mod poller;
mod reload;
mod restore;
pub mod worker;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use tracing::{info, warn};

use self::outputs::KafkaOutputs;
use self::poller::{Poller, Shared};
use self::worker::Worker;

use super::lag;
use super::partitions::{Outputs, Partitions, Settings};
use super::report::Publisher;
use super::WorkerError;
use crate::base::error::{Bug, Refusal};
use crate::base::shutdown;
use crate::checkpoint::coordinator::Coordinator;
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::store::CheckpointStore;
use crate::config::Config;
use crate::engine::Counters;
use crate::kafka::source::StartPolicy;
use crate::kafka::{consumer_config, now_ms, KafkaIoError};
use crate::state::StateStore;
use crate::worker::rebalance::{Source, SourceContext};

#[derive(Debug, Clone, Default)]
pub(crate) struct RunOptions {
    /// Stop at the log ends seen at assignment; flush all open windows as end of input.
    pub until_end: bool,
    pub policy: StartPolicy,
    /// The config file SIGHUP reloads the price table from (`Worker::reload_prices`).
    pub config_path: Option<std::path::PathBuf>,
}

/// How often the report (report.json, /metrics) is refreshed between checkpoints.
const REPORT_EVERY: Duration = Duration::from_millis(500);

/// How long the loop waits for a chunk before its housekeeping runs anyway.
const QUIET: Duration = Duration::from_millis(100);

fn lock(core: &Mutex<Worker>) -> Result<MutexGuard<'_, Worker>, WorkerError> {
    core.lock()
        .map_err(|_| Bug::poisoned("worker state").into())
}

/// Runs one worker until shutdown (or, with `until_end`, until its partitions are drained).
pub(crate) fn run(cfg: &Config, opts: RunOptions) -> Result<Counters, WorkerError> {
    let mut driver = Driver::open(cfg, opts)?;
    let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
        if let Next::Stop = driver.step()? {
            return Ok(());
        }
    }));
    match stepped {
        Ok(Ok(())) => driver.close(cfg),
        Ok(Err(e)) => {
            driver.abandon();
            Err(e)
        }
        Err(panic) => {
            driver.abandon();
            std::panic::resume_unwind(panic)
        }
    }
}

/// The worker's state, as the loop and the rebalance callback share it: the
/// partitions over the producer, the coordinator, the job.
fn worker(cfg: &Config, opts: &RunOptions) -> Result<Worker, WorkerError> {
    let engine = cfg.engine()?;
    super::create_state_dir(&cfg.state.dir)?;
    let store = Arc::new(StateStore::open_fresh(&cfg.state.dir.join("rocksdb"))?);
    let worker = format!("w{}x{}", std::process::id(), now_ms() % 1_000_000_000);
    let checkpoints = Arc::new(CheckpointStore::open(
        &cfg.checkpoint,
        &cfg.kafka.group_id,
        &worker,
    )?);
    let job = JobIdentity {
        rules: Arc::new(crate::checkpoint::rules(
            &cfg.topics.input,
            &engine,
            cfg.watermark.idle_timeout.0.map(|m| m.0),
            crate::config::rating::from_source,
        )),
        topic: cfg.topics.input.clone(),
        group: cfg.kafka.group_id.clone(),
        worker,
    };
    let coord = Coordinator::new(store.clone(), checkpoints, job.clone())?;
    let settings = Settings {
        engine: engine.clone(),
        topic: cfg.topics.input.clone(),
        policy: opts.policy,
        bounded: opts.until_end,
        idle_ms: cfg.watermark.idle_timeout.0.map(|m| m.0),
        memory_budget: cfg.state.memory_budget_bytes(),
    };
    let outputs = KafkaOutputs::new(&cfg.kafka, &cfg.topics)?;
    let publisher =
        Publisher::new(&cfg.state.dir, cfg.metrics.listen.as_deref()).map_err(|source| {
            WorkerError::Io {
                path: cfg.state.dir.display().to_string(),
                source,
            }
        })?;
    Ok(Worker {
        parts: Partitions::new(settings, outputs),
        job,
        shared_engine: Arc::new(Mutex::new(engine)),
        epoch: Arc::new(AtomicU64::new(0)),
        store,
        coord,
        publisher,
        assigned_once: false,
        closed: false,
        checkpoint_interval_ms: cfg.checkpoint.interval.0,
        checkpoint_stats: Default::default(),
        applied: Default::default(),
    })
}

/// Whether the loop goes on.
enum Next {
    More,
    Stop,
}

/// The Kafka loop around the worker: the consumer, its poll thread, the timers.
struct Driver {
    core: Arc<Mutex<Worker>>,
    consumer: Arc<Source>,
    poller: Poller,
    /// Removed before the consumer goes (`worker::lag`).
    lag_hook: lag::Hook,
    opts: RunOptions,
    /// With `until_end`: the input topic's partitions, all to be drained.
    topic_partitions: usize,
    interval: Duration,
    last_checkpoint: Instant,
    last_report: Instant,
    last_waiting_log: Instant,
}

impl Driver {
    /// Builds the worker, joins the group and starts the poll thread.
    fn open(cfg: &Config, opts: RunOptions) -> Result<Self, WorkerError> {
        shutdown::install_reload();
        let worker = worker(cfg, &opts)?;
        let checkpoints_at = worker.coord.checkpoints().location();
        let shared = (worker.shared_engine.clone(), worker.epoch.clone());
        let core = Arc::new(Mutex::new(worker));
        let consumer: Arc<Source> = Arc::new(
            consumer_config(&cfg.kafka)
                .create_with_context(SourceContext::new(core.clone()))
                .map_err(KafkaIoError::client("creating the consumer"))?,
        );
        // The consumer lag is computed when scraped (`worker::lag`); the hook goes
        // before the consumer does.
        let lag_hook = {
            let c = lock(&core)?;
            let (service, applied) = (c.publisher.service_handle(), c.applied.clone());
            lag::Hook::install(service, applied, &consumer, &cfg.topics.input)
        };
        let topic = &cfg.topics.input;
        crate::kafka::await_cluster(&consumer, &cfg.kafka, topic)?;
        consumer
            .subscribe(&[topic])
            .map_err(KafkaIoError::client(format!("subscribing to {topic}")))?;
        lock(&core)?
            .publisher
            .service()
            .set_not_ready("joining the consumer group");
        info!(topic = %cfg.topics.input, group = %cfg.kafka.group_id, checkpoints = %checkpoints_at, "worker started");
        let topic_partitions = if opts.until_end {
            input_partitions(&consumer, topic)?
        } else {
            0
        };
        progress_targets(&consumer, &core, &cfg.topics)?;
        let poller = Poller::start(Shared {
            consumer: consumer.clone(),
            topic: topic.clone(),
            engine: shared.0,
            epoch: shared.1,
        })
        .map_err(|e| WorkerError::Io {
            path: "poll thread".into(),
            source: e,
        })?;
        Ok(Self {
            core,
            consumer,
            poller,
            lag_hook,
            opts,
            topic_partitions,
            interval: Duration::from_millis(cfg.checkpoint.interval.0 as u64),
            last_checkpoint: Instant::now(),
            last_report: Instant::now(),
            last_waiting_log: Instant::now(),
        })
    }

    /// One turn: the next chunk (if one comes within `QUIET`) applied, then the
    /// housekeeping — spill, idleness, exports, report, checkpoint.
    fn step(&mut self) -> Result<Next, WorkerError> {
        if shutdown::requested() {
            info!("shutdown requested");
            return Ok(Next::Stop);
        }
        let mut polled = self.poller.next(QUIET).map_err(|_| {
            WorkerError::Bug(Bug("the poll thread ended unexpectedly (a panic)".into()))
        })?;
        if let Some(fatal) = polled.as_mut().and_then(|p| p.fatal.take()) {
            // A stop request ended a restore waiting on the store: a stop, not a failure.
            if matches!(&fatal, WorkerError::Checkpoint(e) if e.is_interrupted()) {
                info!("shutdown requested during a restore");
                return Ok(Next::Stop);
            }
            return Err(fatal);
        }
        let core = self.core.clone();
        let mut c = lock(&core)?;
        if let Some(polled) = &polled {
            crate::failpoint::pause("apply_chunk");
            c.process_polled(polled, &self.consumer)?;
            // A fetch position outside the log: handled after the records polled before it.
            if polled.out_of_range {
                c.out_of_range(&self.consumer)?;
            }
        }
        drop(polled);
        if c.parts.spill_due() {
            c.spill(&self.consumer)?;
        }
        if self.opts.until_end && c.drained(self.topic_partitions) {
            info!("reached the log end of every assigned partition");
            return Ok(Next::Stop);
        }
        self.housekeeping(&mut c)?;
        Ok(Next::More)
    }

    fn housekeeping(&mut self, c: &mut Worker) -> Result<(), WorkerError> {
        let consumer = &*self.consumer;
        c.publisher.service().beat(crate::kafka::now_ms());
        if shutdown::take_reload() {
            c.reload_prices(self.opts.config_path.as_deref());
        }
        if !self.opts.until_end {
            c.advance_idle(consumer)?;
        }
        c.poll_export(consumer)?;
        if self.last_report.elapsed() >= REPORT_EVERY {
            let report = c.report_with(consumer);
            c.publisher.publish_quiet(&report);
            self.last_report = Instant::now();
        }
        // One export at a time, and the loop never waits for one here: a slow
        // store spaces checkpoints out instead of pausing the records.
        if self.last_checkpoint.elapsed() >= self.interval && c.coord.settled() {
            c.checkpoint(consumer, false)?;
            self.last_checkpoint = Instant::now();
        }
        let topic_partitions = self.topic_partitions;
        if self.opts.until_end
            && c.assigned_once
            && c.parts.len() < topic_partitions
            && self.last_waiting_log.elapsed() >= Duration::from_secs(5)
        {
            let owned: Vec<i32> = c.parts.owned().map(|p| p.0).collect();
            warn!(owned = %crate::logfmt::list(&owned), topic_partitions, "bounded run: waiting to own every partition of the input topic (another member holds the rest)");
            self.last_waiting_log = Instant::now();
        }
        Ok(())
    }

    /// The final checkpoint (and a bounded run's end-of-input panes), the stop
    /// report, and leaving the group.
    /// After a failure (an error or a panic): nothing more is checkpointed — a
    /// revoke would checkpoint past outputs that were never delivered — and the
    /// consumer is not closed: leaving the group runs a revoke inside librdkafka
    /// and waits on a broker that may not answer. The group notices this member
    /// gone at its session timeout, as after a crash; the next start restores
    /// the last complete checkpoint.
    fn abandon(mut self) {
        match self.core.lock() {
            Ok(mut c) => c.closed = true,
            Err(poisoned) => poisoned.into_inner().closed = true,
        }
        self.poller.stop();
        std::mem::forget(self);
    }

    fn close(mut self, cfg: &Config) -> Result<Counters, WorkerError> {
        // No poll (nor rebalance callback) from here on but the loop's own.
        self.poller.stop();
        let mut c = lock(&self.core)?;
        c.checkpoint(&self.consumer, true)?;
        c.closed = true;
        if self.opts.until_end {
            // End of input: emit every open window. Not checkpointed (see PartitionTask::end_of_input).
            c.parts.outputs().producer().stop_timing_panes();
            c.parts.end_of_input()?;
            c.parts.outputs_mut().flush()?;
        }
        let total = c.parts.audit();
        log_stopped(&c, &total);
        // The stop report carries the whole run's figures (benchmarks read it).
        c.publisher.publish_quiet(&c.report_with(&self.consumer));
        drop(c);
        // Leaving the group. A dynamic member unsubscribes first and polls until its
        // assignment is gone: the revoke callback (nothing left to checkpoint) then runs
        // inside an ordinary poll, not inside the close — librdkafka can block for ever
        // in the unassign of a revoke that runs while it closes (seen under
        // group.protocol=consumer; librdkafka#4527). A static member
        // (group.instance.id) does not unsubscribe: it must leave as itself so its
        // partitions wait for it instead of moving. Either way the close is bounded:
        // everything is checkpointed and committed by now, so a close that hangs is cut
        // short, and the group notices the member gone at its session timeout.
        if !cfg.kafka.properties.contains_key("group.instance.id") {
            leave_assignment(&self.consumer);
            // The poll thread is gone: a revoke that failed in these polls is
            // taken here.
            if let Some(fatal) = self.consumer.context().take_fatal() {
                return Err(fatal);
            }
        }
        std::thread::Builder::new()
            .name("close-watchdog".into())
            .spawn(|| {
                std::thread::sleep(CLOSE_TIMEOUT);
                warn!(
                    timeout_s = CLOSE_TIMEOUT.as_secs(),
                    "leaving the consumer group did not finish; exiting (the last checkpoint is complete)"
                );
                crate::base::shutdown::exit_now(0);
            })
            .map_err(|e| WorkerError::Io {
                path: "close-watchdog thread".into(),
                source: e,
            })?;
        let Self {
            core,
            consumer,
            poller,
            lag_hook,
            ..
        } = self;
        drop(poller);
        drop(lag_hook);
        drop(core);
        drop(consumer);
        Ok(total)
    }
}

/// The run's totals, checkpoint pauses and pane latencies, logged at the stop.
fn log_stopped(c: &Worker, total: &Counters) {
    let mut pauses: Vec<u64> = c.coord.pauses_us.iter().map(|us| us / 1000).collect();
    pauses.sort_unstable();
    let pct = |q: usize| {
        pauses
            .get((pauses.len().saturating_sub(1)) * q / 100)
            .copied()
            .unwrap_or(0)
    };
    let ack = c.parts.outputs().producer().pane_ack_latency_us();
    info!(
        consumed = total.consumed,
        folded = total.folded,
        too_late = total.too_late,
        dead_letter = total.dead_letter,
        duplicate = total.duplicate,
        panes = total.panes,
        idle_advances = total.idle_advances,
        checkpoints = pauses.len(),
        pause_p50_ms = pct(50),
        pause_p99_ms = pct(99),
        on_time_panes_acked = ack.count(),
        pane_ack_p50_us = ack.quantile(500),
        pane_ack_p99_us = ack.quantile(990),
        "worker stopped"
    );
}

/// Unsubscribes and polls until the assignment is empty (at most
/// `CLOSE_TIMEOUT`); records polled meanwhile are not processed — the last
/// checkpoint is complete, and the partitions' next owner reads them.
fn leave_assignment(consumer: &Source) {
    consumer.unsubscribe();
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    while Instant::now() < deadline {
        let _ = consumer.poll(Duration::from_millis(100));
        if consumer.assignment().is_ok_and(|a| a.count() == 0) {
            return;
        }
    }
    warn!(
        timeout_s = CLOSE_TIMEOUT.as_secs(),
        "the assignment was not released after unsubscribing; closing anyway"
    );
}

/// How long leaving the consumer group may take at shutdown.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);

/// The number of partitions of `topic`; a missing topic is refused.
/// Where progress records go (finality, docs/DESIGN.md §6): the partition counts of
/// the input and results topics, read once at start.
fn progress_targets(
    consumer: &Source,
    core: &Mutex<Worker>,
    topics: &crate::config::TopicsConfig,
) -> Result<(), WorkerError> {
    let source = crate::kafka::partition_count(consumer, &topics.input)? as i32;
    let results = lock(core)?
        .parts
        .outputs()
        .producer()
        .results_partitions()?;
    if source == 0 || results == 0 {
        warn!(input = %topics.input, results = %topics.results, "an input or results topic has no partitions yet: no progress records, so the sink marks nothing final until a restart");
        return Ok(());
    }
    lock(core)?.parts.send_progress_to((source, results));
    Ok(())
}

fn input_partitions(consumer: &Source, topic: &str) -> Result<usize, WorkerError> {
    let n = crate::kafka::partition_count(consumer, topic)?;
    if n == 0 {
        return Err(WorkerError::Refused(Refusal::setup(format!(
            "input topic {topic} has no partitions (does it exist?)"
        ))));
    }
    Ok(n)
}
