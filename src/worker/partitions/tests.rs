//! The partitions unit driven with a recording `Outputs`: random runs with skipped
//! offsets, gaps of deleted offsets, re-sent and stale runs, runs prepared under a
//! replaced configuration, positions passed, spills under a tight budget,
//! checkpoints and restores (revoke, then assign from the checkpoint). After every
//! step both audits balance; at the end every record's route, and every pane byte
//! for byte, equals a per-record reference: one task per partition that processes
//! each record once, in offset order, one at a time, and is never restored.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::checkpoint::coordinator::Coordinator;
use crate::checkpoint::evolution::Rules;
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::objects::local::LocalObjects;
use crate::checkpoint::store::CheckpointStore;
use crate::engine::{Counters, ProgressRecord, Route};
use crate::model::DeadLetterReason;
use crate::state::{bounded, StateStore};

const PARTITIONS: usize = 2;

/// What the unit handed to its outputs, by kind, in order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Recorded {
    /// Each pane's JSON, exactly as produced.
    results: Vec<Vec<u8>>,
    /// `(partition, offset, window end, watermark)`.
    late: Vec<(i32, i64, i64, i64)>,
    /// `(partition, offset, reason code, nth)`.
    dead: Vec<(i32, i64, &'static str, u64)>,
}

#[derive(Default)]
struct Recording {
    got: Recorded,
    flushes: usize,
}

impl Outputs for Recording {
    fn result(&mut self, r: &ResultRecord) -> Result<(), WorkerError> {
        let mut json = Vec::new();
        r.append_json(&mut json);
        self.got.results.push(json);
        Ok(())
    }

    fn progress(&mut self, _: &ProgressRecord) -> Result<(), WorkerError> {
        Ok(())
    }

    fn late(&mut self, r: &Record<'_>, window_end: i64, watermark: i64) -> Result<(), WorkerError> {
        let at = (r.partition.0, r.offset, window_end, watermark);
        self.got.late.push(at);
        Ok(())
    }

    fn dead_letter(
        &mut self,
        r: &Record<'_>,
        reason: &DeadLetterReason,
        nth: u64,
    ) -> Result<(), WorkerError> {
        let at = (r.partition.0, r.offset, reason.code(), nth);
        self.got.dead.push(at);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), WorkerError> {
        self.flushes += 1;
        Ok(())
    }
}

/// A run as a poller would hand it over.
struct TestRun {
    partition: Partition,
    epoch: u64,
    log_start: Option<i64>,
    offsets: Vec<i64>,
    payloads: Vec<String>,
    prepared: Prepared,
}

impl TestRun {
    fn new(
        p: Partition,
        epoch: u64,
        low: Option<i64>,
        recs: &[(i64, String)],
        cfg: &EngineConfig,
    ) -> Self {
        let mut prepared = Prepared::default();
        for (_, payload) in recs {
            prepared.push(
                cfg,
                RecordIn {
                    payload: payload.as_bytes(),
                    kafka_ts: None,
                    now_ms: 0,
                },
            );
        }
        Self {
            partition: p,
            epoch,
            log_start: low,
            offsets: recs.iter().map(|(o, _)| *o).collect(),
            payloads: recs.iter().map(|(_, r)| r.clone()).collect(),
            prepared,
        }
    }
}

impl Run for TestRun {
    fn partition(&self) -> Partition {
        self.partition
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn log_start(&self) -> Option<i64> {
        self.log_start
    }
    fn len(&self) -> usize {
        self.offsets.len()
    }
    fn offset(&self, i: usize) -> i64 {
        self.offsets[i]
    }
    fn prepared(&self) -> &Prepared {
        &self.prepared
    }
    fn record_in(&self, i: usize, now_ms: i64) -> RecordIn<'_> {
        RecordIn {
            payload: self.payloads[i].as_bytes(),
            kafka_ts: None,
            now_ms,
        }
    }
    fn record(&self, i: usize) -> Record<'_> {
        Record {
            partition: self.partition,
            offset: self.offsets[i],
            key: None,
            payload: self.payloads[i].as_bytes(),
            kafka_ts: None,
            true_len: None,
        }
    }
}

/// One record from its drawn parts: disorder, duplicates, very late and malformed ones.
fn record(
    p: usize,
    i: usize,
    (kind, tenant, jitter): (u8, u8, u32),
    prev: &[(i64, String)],
) -> String {
    let ts = 1_767_261_600_000 + i as i64 * 6_000 + i64::from(jitter);
    match kind {
        0 => "{\"request_id\": broken".to_string(),
        1 if i > 3 => prev[i - 1 - usize::from(tenant)].1.clone(),
        2 => format!(
            r#"{{"request_id":"p{p}-{i}","tenant_id":"t{tenant}","model":"m","prompt_tokens":100,"completion_tokens":7,"completed_ts":{}}}"#,
            ts - 200_000
        ),
        _ => format!(
            r#"{{"request_id":"p{p}-{i}","tenant_id":"t{tenant}","model":"m","prompt_tokens":{},"completion_tokens":3,"completed_ts":{ts}}}"#,
            1 + jitter % 2000
        ),
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Hands over the next `n` records of `p`, with the `back` before them again
    /// (already applied); `stale`: read under the epoch before `p`'s assignment;
    /// `replaced`: prepared under a configuration replaced since.
    Apply {
        p: usize,
        n: usize,
        back: usize,
        stale: bool,
        replaced: bool,
    },
    /// The consumer's position passes the offsets before `p`'s next record.
    Pass {
        p: usize,
    },
    /// The offsets before `p`'s next record were deleted: the next run's log start
    /// is that record's offset.
    Delete {
        p: usize,
    },
    Spill,
    Checkpoint,
    /// `p` is revoked and assigned again, restored from its checkpoint.
    Restore {
        p: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let p = 0..PARTITIONS;
    prop_oneof![
        6 => (p.clone(), 1..40usize, 0..4usize, prop::bool::weighted(0.1), prop::bool::weighted(0.2))
            .prop_map(|(p, n, back, stale, replaced)| Step::Apply { p, n, back, stale, replaced }),
        1 => p.clone().prop_map(|p| Step::Pass { p }),
        1 => p.clone().prop_map(|p| Step::Delete { p }),
        1 => Just(Step::Spill),
        1 => Just(Step::Checkpoint),
        1 => p.prop_map(|p| Step::Restore { p }),
    ]
}

/// A partition's log: records at increasing offsets, some offsets skipped.
fn log() -> impl Strategy<Value = Vec<(u8, u8, u8, u32)>> {
    prop::collection::vec(
        (
            0u8..20,
            0u8..4,
            prop_oneof![8 => Just(0u8), 1 => 1u8..4],
            0u32..8000,
        ),
        1..150,
    )
}

/// The test's side of one partition.
#[derive(Default)]
struct Feed {
    log: Vec<(i64, String)>,
    /// The first record not handed over yet.
    cursor: usize,
    /// The log start the next run carries.
    low: Option<i64>,
    epoch: u64,
}

struct Rig {
    parts: Partitions<Recording>,
    coord: Coordinator,
    store: Arc<StateStore>,
    engine: Arc<EngineConfig>,
    /// The same configuration, another value: a replaced one.
    other: Arc<EngineConfig>,
    feeds: Vec<Feed>,
    reference: Vec<PartitionTask>,
    expected: Recorded,
    epoch: u64,
    /// Firing steps the runs stopped at.
    steps: usize,
}

impl Rig {
    fn new(dir: &std::path::Path, logs: Vec<Vec<(u8, u8, u8, u32)>>) -> Self {
        let engine = crate::devtools::support::one_price_engine(10_000);
        let other = Arc::new((*engine).clone());
        let store = Arc::new(StateStore::open_fresh(&dir.join("state")).unwrap());
        let objects = LocalObjects::create(&dir.join("checkpoints")).unwrap();
        let checkpoints = CheckpointStore::with_objects(Box::new(objects), "w1", 2);
        let job = JobIdentity {
            worker: "w1".into(),
            group: "g".into(),
            topic: "t".into(),
            rules: Arc::new(Rules::opaque("f")),
        };
        let coord = Coordinator::new(store.clone(), Arc::new(checkpoints), job).unwrap();
        let settings = Settings {
            engine: engine.clone(),
            topic: "t".into(),
            policy: StartPolicy {
                allow_truncated_log: true,
                ..StartPolicy::default()
            },
            bounded: false,
            idle_ms: None,
            memory_budget: Some(4096),
        };
        let mut parts = Partitions::new(settings, Recording::default());
        let mut feeds = Vec::new();
        let mut reference = Vec::new();
        for (p, drawn) in logs.into_iter().enumerate() {
            let mut feed = Feed::default();
            let mut offset = 0i64;
            for (i, (kind, tenant, skip, jitter)) in drawn.into_iter().enumerate() {
                offset += i64::from(skip);
                let r = record(p, i, (kind, tenant, jitter), &feed.log);
                feed.log.push((offset, r));
                offset += 1;
            }
            feeds.push(feed);
            let partition = Partition(p as i32);
            let mut task = PartitionTask::new(partition, engine.clone());
            task.attach_spill(store.clone());
            // Ends with more than one evicted window fire in steps.
            task.set_fire_run(1);
            let start = Start {
                next: NextOffset(0),
                end: i64::MAX,
                offsets: OffsetLedger::default(),
                epoch: 0,
            };
            parts.assign(partition, task, start);
            reference.push(PartitionTask::new(partition, engine.clone()));
        }
        Self {
            parts,
            coord,
            store,
            engine,
            other,
            feeds,
            reference,
            expected: Recorded::default(),
            epoch: 0,
            steps: 0,
        }
    }

    fn apply(&mut self, p: usize, n: usize, back: usize, stale: bool, replaced: bool) {
        let feed = &mut self.feeds[p];
        let (from, to) = (
            feed.cursor.saturating_sub(back),
            (feed.cursor + n).min(feed.log.len()),
        );
        if from >= to {
            return;
        }
        let stale = stale && feed.epoch > 0;
        let epoch = if stale { feed.epoch - 1 } else { feed.epoch };
        let run = TestRun::new(
            Partition(p as i32),
            epoch,
            feed.low,
            &feed.log[from..to],
            &self.engine,
        );
        let cfg = if replaced {
            self.other.clone()
        } else {
            self.engine.clone()
        };
        // An end firing in steps stops the run: a spill between the steps (the
        // store then holds the end fired up to the cursor, open after it).
        while !self.parts.apply(&run, &cfg, 0).unwrap() {
            self.steps += 1;
            if self.steps.is_multiple_of(2) {
                self.parts.spill(&mut self.coord, &mut NoGroup).unwrap();
            }
        }
        if stale {
            return;
        }
        // The reference: each record not applied before, once, one at a time.
        let task = &mut self.reference[p];
        let (mut panes, mut late, mut dead) = (Vec::new(), Vec::new(), Vec::new());
        for (offset, payload) in &feed.log[feed.cursor..to] {
            let rec = RecordIn {
                payload: payload.as_bytes(),
                kafka_ts: None,
                now_ms: 0,
            };
            match task.process(rec, &mut panes).expect("reads back") {
                Route::TooLate {
                    window_end,
                    watermark,
                } => late.push((p as i32, *offset, window_end, watermark)),
                Route::DeadLetter(reason) => dead.push((
                    p as i32,
                    *offset,
                    reason.code(),
                    task.counters().dead_letter,
                )),
                Route::Window | Route::Duplicate => {}
            }
        }
        for pane in panes {
            let mut json = Vec::new();
            pane.append_json(&mut json);
            self.expected.results.push(json);
        }
        self.expected.late.extend(late);
        self.expected.dead.extend(dead);
        feed.cursor = to;
        feed.low = None;
    }

    /// The offset of `p`'s next record (its log end past the last).
    fn next_record(&self, p: usize) -> i64 {
        let feed = &self.feeds[p];
        feed.log
            .get(feed.cursor)
            .map_or_else(|| feed.log.last().map_or(0, |r| r.0 + 1), |r| r.0)
    }

    fn step(&mut self, s: &Step) {
        match *s {
            Step::Apply {
                p,
                n,
                back,
                stale,
                replaced,
            } => self.apply(p, n, back, stale, replaced),
            Step::Pass { p } => {
                let (to, epoch, low) =
                    (self.next_record(p), self.feeds[p].epoch, self.feeds[p].low);
                self.parts
                    .pass(Partition(p as i32), epoch, to, low)
                    .unwrap();
            }
            Step::Delete { p } => self.feeds[p].low = Some(self.next_record(p)),
            Step::Spill => {
                self.parts.spill(&mut self.coord, &mut NoGroup).unwrap();
            }
            Step::Checkpoint => {
                self.parts
                    .checkpoint(&mut self.coord, &mut NoGroup, true)
                    .unwrap();
            }
            Step::Restore { p } => self.restore(p),
        }
        assert!(
            self.parts.balanced(),
            "an audit does not balance after {s:?}"
        );
    }

    fn restore(&mut self, p: usize) {
        let partition = Partition(p as i32);
        self.parts
            .checkpoint(&mut self.coord, &mut NoGroup, true)
            .unwrap();
        self.parts.remove(partition);
        self.store.drop_partition(partition).unwrap();
        let restored =
            self.coord
                .checkpoints()
                .restore_partition(partition, &Rules::opaque("f"), &self.store);
        let r = restored.unwrap().expect("checkpointed just before");
        let share = self.parts.share_with(1);
        let (mut task, _) =
            bounded::restore_task(&self.store, partition, self.engine.clone(), share)
                .unwrap()
                .unwrap();
        task.set_fire_run(1);
        self.epoch += 1;
        self.feeds[p].epoch = self.epoch;
        let start = Start {
            next: r.next_offset,
            end: i64::MAX,
            offsets: r.offsets,
            epoch: self.epoch,
        };
        self.parts.assign(partition, task, start);
    }
}

fn counters(c: &Counters) -> [u64; 5] {
    [c.consumed, c.folded, c.too_late, c.dead_letter, c.duplicate]
}

proptest! {
    // Each case opens a RocksDB and writes checkpoints: `PROPTEST_CASES` for more.
    #![proptest_config(ProptestConfig { cases: crate::base::proptest_cases(48), ..ProptestConfig::default() })]

    #[test]
    fn every_record_takes_the_reference_route_and_the_audits_balance(
        logs in prop::collection::vec(log(), PARTITIONS),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let dir = std::env::temp_dir().join(format!(
            "tally-partitions-{}-{:?}", std::process::id(), std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut rig = Rig::new(&dir, logs);
        for s in &steps {
            rig.step(s);
        }
        prop_assert_eq!(&rig.parts.outputs().got, &rig.expected);
        let mut want = Counters::default();
        for t in &rig.reference {
            want.add(&t.counters());
        }
        prop_assert_eq!(counters(&rig.parts.audit()), counters(&want));
        drop(rig);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A unit over partition 0 alone, assigned from offset 0.
fn one_partition(
    engine: &Arc<EngineConfig>,
    allow_truncated_log: bool,
    memory_budget: Option<usize>,
) -> Partitions<Recording> {
    let settings = Settings {
        engine: engine.clone(),
        topic: "t".into(),
        policy: StartPolicy {
            allow_truncated_log,
            ..StartPolicy::default()
        },
        bounded: false,
        idle_ms: None,
        memory_budget,
    };
    let mut parts = Partitions::new(settings, Recording::default());
    let start = Start {
        next: NextOffset(0),
        end: i64::MAX,
        offsets: OffsetLedger::default(),
        epoch: 0,
    };
    let p = Partition(0);
    parts.assign(p, PartitionTask::new(p, engine.clone()), start);
    parts
}

/// Without `--allow-truncated-log`, a run whose records skip deleted offsets is
/// refused, naming them.
#[test]
fn a_gap_is_refused_without_the_flag() {
    let engine = crate::devtools::support::one_price_engine(10_000);
    let mut parts = one_partition(&engine, false, None);
    let p = Partition(0);
    let recs = [(5, "{}".to_string())];
    // Offsets 0..3 deleted, 3..5 empty.
    let run = TestRun::new(p, 0, Some(3), &recs, &engine);
    let e = parts.apply(&run, &engine, 0).unwrap_err().to_string();
    assert!(e.contains("0..3"), "{e}");
    // Accepted, the same run balances: 3 gap offsets, 2 empty, 1 record.
    let mut parts = one_partition(&engine, true, None);
    parts.apply(&run, &engine, 0).unwrap();
    assert!(parts.balanced());
    let report = &parts.reports(|_| None)[0];
    assert_eq!(
        (report.offsets.gap_offsets, report.offsets.empty_offsets),
        (3, 2)
    );
    assert_eq!(report.next_offset, NextOffset(6));
}

/// The budget is checked after a run that emitted panes (a window end that
/// fires brings its evicted windows back), not only every 4,096 records.
#[test]
fn a_run_that_fires_panes_checks_the_budget_at_once() {
    let engine = crate::devtools::support::one_price_engine(10_000);
    let mut parts = one_partition(&engine, false, Some(4096));
    let p = Partition(0);
    let t0 = 1_767_261_600_000i64;
    let rec = |i: i64, ts: i64| {
        let json = format!(
            r#"{{"request_id":"r{i}","tenant_id":"t{i}","model":"m","prompt_tokens":1,"completion_tokens":1,"completed_ts":{ts}}}"#
        );
        (i, json)
    };
    // 40 tenants in the first minute: over a 4 KiB budget, no pane yet.
    let first: Vec<_> = (0..40).map(|i| rec(i, t0 + i * 100)).collect();
    parts
        .apply(&TestRun::new(p, 0, None, &first, &engine), &engine, 0)
        .unwrap();
    assert!(
        !parts.spill_due(),
        "40 records and no pane: not checked yet"
    );
    // Then time moves on 5 s a record: the first minute fires.
    let next: Vec<_> = (40..70)
        .map(|i| rec(i, t0 + 4_000 + (i - 40) * 5_000))
        .collect();
    parts
        .apply(&TestRun::new(p, 0, None, &next, &engine), &engine, 0)
        .unwrap();
    assert!(
        !parts.outputs().got.results.is_empty(),
        "the first minute fired"
    );
    assert!(
        parts.spill_due(),
        "a run that fired panes checks the budget"
    );
}

/// The deltas of a checkpoint whose export has not written them yet are memory
/// too: the check counts them against the budget with the tasks' state.
#[test]
fn a_checkpoint_delta_in_flight_counts_against_the_budget() {
    let engine = crate::devtools::support::one_price_engine(10_000);
    let budget = 64 << 10;
    let t0 = 1_767_261_600_000i64;
    // Ten tenants in the first minute, then a record that fires it: a check,
    // with the tasks well within the budget.
    let recs: Vec<_> = (0..11i64)
        .map(|i| {
            let ts = if i < 10 { t0 + i * 100 } else { t0 + 70_000 };
            let json = format!(
                r#"{{"request_id":"r{i}","tenant_id":"t{i}","model":"m","prompt_tokens":1,"completion_tokens":1,"completed_ts":{ts}}}"#
            );
            (i, json)
        })
        .collect();
    for in_flight in [0, budget / 2, budget] {
        let mut parts = one_partition(&engine, false, Some(budget));
        let gauge = std::sync::atomic::AtomicUsize::new(in_flight);
        parts.memory.in_flight = Some(Arc::new(gauge));
        let run = TestRun::new(Partition(0), 0, None, &recs, &engine);
        parts.apply(&run, &engine, 0).unwrap();
        assert!(!parts.outputs().got.results.is_empty(), "the minute fired");
        assert_eq!(
            parts.spill_due(),
            in_flight == budget,
            "{in_flight} bytes in flight"
        );
        if !parts.spill_due() {
            continue;
        }
        // The tasks alone are within the budget: the spill waits for the deltas
        // to be written instead of writing and evicting windows.
        let dir = crate::devtools::support::TempDir::new("in-flight");
        let store = Arc::new(StateStore::open_fresh(&dir.path().join("state")).unwrap());
        let objects = LocalObjects::create(&dir.path().join("checkpoints")).unwrap();
        let checkpoints = CheckpointStore::with_objects(Box::new(objects), "w1", 2);
        let job = JobIdentity {
            worker: "w1".into(),
            group: "g".into(),
            topic: "t".into(),
            rules: Arc::new(Rules::opaque("f")),
        };
        let mut coord = Coordinator::new(store.clone(), Arc::new(checkpoints), job).unwrap();
        assert!(parts.spill(&mut coord, &mut NoGroup).unwrap().is_none());
        assert!(!parts.spill_due());
        let mut written = 0;
        store
            .export_partition(Partition(0), |_, _| {
                written += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(written, 0, "nothing was spilled");
    }
}

/// A window end that fires thousands of panes does not leave their buffer
/// allocated for the rest of the run (it is outside the budget).
#[test]
fn the_panes_buffer_of_a_large_end_is_given_back() {
    let engine = crate::devtools::support::one_price_engine(10_000);
    let mut parts = one_partition(&engine, false, None);
    let t0 = 1_767_261_600_000i64;
    let n = 6_000i64;
    let recs: Vec<_> = (0..=n)
        .map(|i| {
            let ts = if i < n { t0 + i * 5 } else { t0 + 70_000 };
            let json = format!(
                r#"{{"request_id":"r{i}","tenant_id":"t{i}","model":"m","prompt_tokens":1,"completion_tokens":1,"completed_ts":{ts}}}"#
            );
            (i, json)
        })
        .collect();
    let run = TestRun::new(Partition(0), 0, None, &recs, &engine);
    parts.apply(&run, &engine, 0).unwrap();
    assert_eq!(
        parts.outputs().got.results.len(),
        n as usize,
        "the minute fired"
    );
    assert!(parts.panes.capacity() <= 4096, "{}", parts.panes.capacity());
}
