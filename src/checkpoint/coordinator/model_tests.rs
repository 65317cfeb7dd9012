//! A model test of the checkpoint protocol against fakes behind its ports: an
//! in-memory object store that can fail a write part-way through an upload,
//! outputs that are lost unless flushed, and crash points that stop the protocol
//! at any step. Random sequences of records, barriers, crashes at any step,
//! restores and rebalances between two workers sharing one store give outputs
//! identical to an uninterrupted run: the same final bill, every result version
//! byte-identical to the reference's, the exact late and dead-letter sets.
//!
//! Checkpoints are incremental (a base, then deltas): after every checkpoint
//! that completes, each partition restored from the store into a scratch copy
//! must equal the task's own snapshot — whatever mix of bases, deltas, spills,
//! purges and expiries led there — and restores from chains with deltas must
//! have happened.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::checkpoint::objects::{ObjectError, ObjectInfo, Objects};
use crate::engine::{EngineConfig, PartitionTask, RecordIn, ResultRecord, Route};
use crate::gen::Rng;

const PARTITIONS: i32 = 3;

/// The fake object store: a map, and a budget of writes after which every write
/// fails (an upload cut short); negative: unlimited.
#[derive(Default)]
struct Mem {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    puts_left: AtomicI64,
}

struct MemObjects(Arc<Mem>);

impl Objects for MemObjects {
    fn location(&self, key: &str) -> String {
        format!("mem://{key}")
    }
    fn put_new(&self, key: &str, bytes: &[u8]) -> Result<(), ObjectError> {
        if self.0.puts_left.fetch_sub(1, Ordering::SeqCst) == 0 {
            self.0.puts_left.store(0, Ordering::SeqCst);
            return Err(ObjectError::Io {
                location: self.location(key),
                msg: "crashed mid-upload".into(),
            });
        }
        let mut m = self.0.objects.lock().unwrap();
        if m.contains_key(key) {
            return Err(ObjectError::Exists {
                location: self.location(key),
            });
        }
        m.insert(key.into(), bytes.to_vec());
        Ok(())
    }
    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>, ObjectError> {
        let m = self.0.objects.lock().unwrap();
        match m.get(key) {
            Some(b) if b.len() as u64 <= limit => Ok(b.clone()),
            Some(_) => Err(ObjectError::Refused {
                location: self.location(key),
                msg: "too large".into(),
            }),
            None => Err(ObjectError::NotFound {
                location: self.location(key),
            }),
        }
    }
    fn list(&self) -> Result<Vec<ObjectInfo>, ObjectError> {
        let m = self.0.objects.lock().unwrap();
        Ok(m.iter()
            .map(|(k, v)| ObjectInfo {
                key: k.clone(),
                size: v.len() as u64,
                modified_ms: crate::base::clock::now_ms(),
            })
            .collect())
    }
    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.0.objects.lock().unwrap().remove(key);
        Ok(())
    }
}

/// What left a worker: a result (as JSON), or a record index routed late or dead.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Out {
    Result(String),
    Late(i32, usize),
    Dead(i32, usize),
}

/// What the world received (flushed outputs only).
#[derive(Default)]
struct World {
    results: Vec<ResultRecord>,
    late: BTreeSet<(i32, usize)>,
    dead: BTreeSet<(i32, usize)>,
}

impl World {
    fn take(&mut self, outs: Vec<Out>) {
        for o in outs {
            match o {
                Out::Result(json) => self.results.push(serde_json::from_str(&json).unwrap()),
                Out::Late(p, i) => {
                    self.late.insert((p, i));
                }
                Out::Dead(p, i) => {
                    self.dead.insert((p, i));
                }
            }
        }
    }
}

struct ModelPorts<'a> {
    pending: &'a mut Vec<Out>,
    world: &'a mut World,
    crash_at: Option<Step>,
}

impl Ports for ModelPorts<'_> {
    fn flush_outputs(&mut self) -> Result<(), CheckpointError> {
        self.world.take(std::mem::take(self.pending));
        Ok(())
    }
    fn commit_offsets(&mut self, _: CheckpointId, _: &[(Partition, NextOffset)]) {}
    fn reached(&mut self, step: Step) -> Result<(), CheckpointError> {
        match self.crash_at {
            Some(s) if s == step => Err(CheckpointError::Bug(crate::base::error::Bug(format!(
                "crash at {}",
                s.name()
            )))),
            _ => Ok(()),
        }
    }
}

fn engine() -> Arc<EngineConfig> {
    crate::devtools::support::one_price_engine(10_000)
}

/// Records of one partition: disorder, duplicates, very late and malformed ones.
fn records(rng: &mut Rng, p: i32, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(n);
    for i in 0..n {
        let ts = 1_767_261_600_000 + i as i64 * 1_500 + rng.below(8_000) as i64;
        let r = match rng.below(20) {
            0 => "{\"request_id\": broken".to_string(),
            1 if i > 5 => out[i - 1 - rng.below(5) as usize].clone(),
            2 => format!(
                r#"{{"request_id":"p{p}-{i}","tenant_id":"p{p}t{}","model":"m","prompt_tokens":100,"completion_tokens":7,"completed_ts":{}}}"#,
                rng.below(4),
                ts - 200_000
            ),
            _ => format!(
                r#"{{"request_id":"p{p}-{i}","tenant_id":"p{p}t{}","model":"m","prompt_tokens":{},"completion_tokens":{},"completed_ts":{ts}}}"#,
                rng.below(4),
                1 + rng.below(2000),
                rng.below(500)
            ),
        };
        out.push(r);
    }
    out
}

/// Applies records `from..to` of partition `p` to `task`.
fn apply(
    task: &mut PartitionTask,
    p: i32,
    input: &[String],
    from: usize,
    to: usize,
    out: &mut Vec<Out>,
) {
    let mut panes = Vec::new();
    for (i, rec) in input.iter().enumerate().take(to).skip(from) {
        let route = task
            .process(
                RecordIn {
                    payload: rec.as_bytes(),
                    kafka_ts: None,
                    now_ms: 0,
                },
                &mut panes,
            )
            .expect("no spill store");
        for pane in panes.drain(..) {
            out.push(Out::Result(serde_json::to_string(&pane).unwrap()));
        }
        match route {
            Route::TooLate { .. } => out.push(Out::Late(p, i)),
            Route::DeadLetter(_) => out.push(Out::Dead(p, i)),
            Route::Window | Route::Duplicate => {}
        }
    }
}

struct Worker {
    coord: Coordinator,
    state: Arc<StateStore>,
    tasks: BTreeMap<i32, (PartitionTask, usize)>,
    pending: Vec<Out>,
}

struct Model {
    dir: std::path::PathBuf,
    mem: Arc<Mem>,
    input: Vec<Vec<String>>,
    world: World,
    incarnations: u64,
    /// Restores whose chain held at least one delta.
    delta_restores: usize,
    /// Scratch restores so far (each into its own directory).
    shadows: usize,
}

impl Model {
    /// A fresh worker process owning nothing yet.
    fn spawn(&mut self) -> Worker {
        self.incarnations += 1;
        let n = self.incarnations;
        let state = Arc::new(StateStore::open_fresh(&self.dir.join(format!("state-{n}"))).unwrap());
        let store = CheckpointStore::with_objects(
            Box::new(MemObjects(self.mem.clone())),
            &format!("w{n}"),
            2,
        );
        let job = JobIdentity {
            worker: format!("w{n}"),
            group: "g".into(),
            topic: "t".into(),
            rules: std::sync::Arc::new(crate::checkpoint::evolution::Rules::opaque("f")),
        };
        Worker {
            coord: Coordinator::new(state.clone(), Arc::new(store), job).unwrap(),
            state,
            tasks: BTreeMap::new(),
            pending: Vec::new(),
        }
    }

    /// `w` is assigned `p`: restored from the store (the pending export first).
    fn assign(&mut self, w: &mut Worker, p: i32) -> Result<(), CheckpointError> {
        let mut ports = ModelPorts {
            pending: &mut w.pending,
            world: &mut self.world,
            crash_at: None,
        };
        w.coord.finish(&mut ports, true)?;
        let restored = w.coord.checkpoints().restore_partition(
            Partition(p),
            &crate::checkpoint::evolution::Rules::opaque("f"),
            &w.state,
        )?;
        if let Some(r) = &restored {
            self.delta_restores += usize::from(chain_len(&w.coord, &r.checkpoint, p) > 1);
        }
        let (task, next) = match restored {
            Some(r) => (
                PartitionTask::restore(Partition(p), engine(), loaded(&w.state, p)),
                r.next_offset.0 as usize,
            ),
            None => {
                w.state.drop_partition(Partition(p))?;
                (PartitionTask::new(Partition(p), engine()), 0)
            }
        };
        w.tasks.insert(p, (task, next));
        Ok(())
    }

    fn checkpoint(
        &mut self,
        w: &mut Worker,
        crash_at: Option<Step>,
        wait: bool,
    ) -> Result<(), CheckpointError> {
        let mut ports = ModelPorts {
            pending: &mut w.pending,
            world: &mut self.world,
            crash_at,
        };
        let tasks = &mut w.tasks;
        let cut = || {
            tasks
                .iter_mut()
                .map(|(p, (t, next))| Cut {
                    partition: Partition(*p),
                    next_offset: NextOffset(*next as i64),
                    watermark: t.max_ts().map(|_| t.watermark()),
                    counters: t.counters(),
                    offsets: OffsetLedger::without_gaps(
                        t.counters().consumed,
                        NextOffset(*next as i64),
                    ),
                    delta: t.drain_changes(),
                })
                .collect()
        };
        let done = w.coord.checkpoint(&mut ports, cut, wait)?;
        if wait && crash_at.is_none() {
            self.check_restores(w);
        }
        drop(done);
        Ok(())
    }

    /// Every partition of `w`, restored from the store as it is now into a
    /// scratch state store, equals its task's snapshot (`w` just completed a
    /// checkpoint and processed nothing since).
    fn check_restores(&mut self, w: &Worker) {
        self.shadows += 1;
        let dir = self.dir.join(format!("shadow-{}", self.shadows));
        let scratch = StateStore::open_fresh(&dir).unwrap();
        for (p, (task, next)) in &w.tasks {
            let r = w
                .coord
                .checkpoints()
                .restore_partition(
                    Partition(*p),
                    &crate::checkpoint::evolution::Rules::opaque("f"),
                    &scratch,
                )
                .unwrap()
                .expect("a checkpointed partition");
            assert_eq!(r.next_offset, NextOffset(*next as i64), "partition {p}");
            assert_eq!(
                loaded(&scratch, *p),
                task.snapshot(),
                "partition {p} from {}",
                r.checkpoint
            );
        }
        drop(scratch);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Records up to `n` more of each of `w`'s partitions.
    fn process(&mut self, w: &mut Worker, n: usize) {
        for (p, (task, next)) in w.tasks.iter_mut() {
            let input = &self.input[*p as usize];
            let to = (*next + n).min(input.len());
            apply(task, *p, input, *next, to, &mut w.pending);
            *next = to;
        }
    }
}

/// The length of partition `p`'s chain in checkpoint `name`.
fn chain_len(coord: &Coordinator, name: &str, p: i32) -> usize {
    let listed = coord.checkpoints().list().unwrap();
    let l = listed.iter().find(|l| l.name == name).unwrap();
    let m = l.manifest.as_ref().unwrap().as_ref().unwrap();
    m.entry(Partition(p)).unwrap().segments.len()
}

/// The uninterrupted run: each partition through one task, then end of input.
fn reference(input: &[Vec<String>]) -> World {
    let mut w = World::default();
    for (p, recs) in input.iter().enumerate() {
        let mut task = PartitionTask::new(Partition(p as i32), engine());
        let mut out = Vec::new();
        apply(&mut task, p as i32, recs, 0, recs.len(), &mut out);
        let mut panes = Vec::new();
        task.end_of_input(&mut panes).unwrap();
        out.extend(
            panes
                .iter()
                .map(|r| Out::Result(serde_json::to_string(r).unwrap())),
        );
        w.take(out);
    }
    w
}

/// The bill (highest version per key) and every version by `(key, version)`.
fn bill(results: &[ResultRecord]) -> (BTreeMap<String, String>, BTreeMap<(String, u64), String>) {
    let mut last: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut versions = BTreeMap::new();
    for r in results {
        let json = serde_json::to_string(r).unwrap();
        let prev = versions.insert((r.key(), r.version), json.clone());
        assert!(
            prev.is_none_or(|p| p == json),
            "two different results for {} v{}",
            r.key(),
            r.version
        );
        if last.get(&r.key()).is_none_or(|(v, _)| r.version > *v) {
            last.insert(r.key(), (r.version, json));
        }
    }
    (
        last.into_iter().map(|(k, (_, j))| (k, j)).collect(),
        versions,
    )
}

/// Runs one seed; returns how many restores read a chain with deltas.
fn run_model(seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let dir = std::env::temp_dir().join(format!("tally-model-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let input: Vec<Vec<String>> = (0..PARTITIONS)
        .map(|p| {
            let n = 150 + rng.below(100) as usize;
            records(&mut rng, p, n)
        })
        .collect();
    let mut m = Model {
        dir: dir.clone(),
        mem: Arc::new(Mem {
            puts_left: AtomicI64::new(-1),
            ..Mem::default()
        }),
        input,
        world: World::default(),
        incarnations: 0,
        delta_restores: 0,
        shadows: 0,
    };
    // Two workers; partition p starts on worker p % 2. `owner` is the group's
    // assignment: a crashed worker's replacement is assigned what it owned.
    let mut workers = [m.spawn(), m.spawn()];
    let mut owner: BTreeMap<i32, usize> = (0..PARTITIONS).map(|p| (p, (p % 2) as usize)).collect();
    for (&p, &w) in &owner {
        m.assign(&mut workers[w], p).unwrap();
    }
    let steps = [
        Step::BeforeBarrier,
        Step::AfterFlush,
        Step::AfterManifest,
        Step::AfterOffsetCommit,
    ];
    for _ in 0..60 {
        let i = rng.below(2) as usize;
        // Which worker, if any, the operation crashed. Any error is a crash: the
        // process exits and its replacement restores.
        let crashed: Option<usize> = match rng.below(10) {
            0..=3 => {
                let n = 1 + rng.below(30) as usize;
                m.process(&mut workers[i], n);
                None
            }
            4 | 5 => {
                let wait = rng.below(2) == 0;
                m.checkpoint(&mut workers[i], None, wait).err().map(|_| i)
            }
            // A crash at one of the protocol's steps …
            6 => {
                let at = steps[rng.below(4) as usize];
                m.checkpoint(&mut workers[i], Some(at), true)
                    .err()
                    .map(|_| i)
            }
            // … inside the upload, after some of the checkpoint's objects (the
            // other worker's export, if one is running, may be the one cut short:
            // it fails when that worker next completes a checkpoint) …
            7 => {
                m.mem.puts_left.store(rng.below(3) as i64, Ordering::SeqCst);
                let failed = m.checkpoint(&mut workers[i], None, true).is_err();
                m.mem.puts_left.store(-1, Ordering::SeqCst);
                failed.then_some(i)
            }
            // … between two operations (unflushed outputs lost) …
            8 => Some(i),
            // … or a rebalance: a partition moves to the other worker, handed over
            // with a checkpoint.
            _ => {
                let Some(&p) = workers[i].tasks.keys().nth(rng.below(3) as usize) else {
                    continue;
                };
                if m.checkpoint(&mut workers[i], None, true).is_err() {
                    Some(i)
                } else {
                    workers[i].tasks.remove(&p);
                    workers[i].state.drop_partition(Partition(p)).unwrap();
                    owner.insert(p, 1 - i);
                    m.assign(&mut workers[1 - i], p).err().map(|_| 1 - i)
                }
            }
        };
        if let Some(c) = crashed {
            // The process dies: what it did not flush is lost; a new one restores
            // its partitions from the store.
            let dead = std::mem::replace(&mut workers[c], m.spawn());
            drop(dead);
            for (&p, _) in owner.iter().filter(|(_, w)| **w == c) {
                m.assign(&mut workers[c], p).unwrap();
            }
        }
    }
    // To the end: everything processed, end of input, flushed.
    for w in workers.iter_mut() {
        m.process(w, usize::MAX / 2);
        for (_, (task, _)) in w.tasks.iter_mut() {
            let mut panes = Vec::new();
            task.end_of_input(&mut panes).unwrap();
            w.pending.extend(
                panes
                    .iter()
                    .map(|r| Out::Result(serde_json::to_string(r).unwrap())),
            );
        }
        m.world.take(std::mem::take(&mut w.pending));
    }
    let want = reference(&m.input);
    let (got_bill, got_versions) = bill(&m.world.results);
    let (want_bill, want_versions) = bill(&want.results);
    let differ: Vec<&String> = want_bill
        .keys()
        .chain(got_bill.keys())
        .filter(|k| got_bill.get(*k) != want_bill.get(*k))
        .collect();
    assert!(
        differ.is_empty(),
        "seed {seed}: the bill differs at {differ:?}"
    );
    for (k, json) in &got_versions {
        assert_eq!(
            Some(json),
            want_versions.get(k),
            "seed {seed}: {k:?} differs from the reference"
        );
    }
    assert_eq!(m.world.late, want.late, "seed {seed}: late set");
    assert_eq!(m.world.dead, want.dead, "seed {seed}: dead-letter set");
    assert!(
        !want.late.is_empty() && !want.dead.is_empty(),
        "seed {seed}: the input exercises both"
    );
    drop(workers);
    let _ = std::fs::remove_dir_all(&dir);
    m.delta_restores
}

#[test]
fn random_records_barriers_crashes_restores_and_rebalances_match_an_uninterrupted_run() {
    // More: TALLY_MODEL_SEEDS=500 cargo test --lib model_tests
    let seeds: u64 = std::env::var("TALLY_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let delta_restores: usize = (1..=seeds).map(run_model).sum();
    assert!(
        delta_restores > 0,
        "no restore read a delta in {seeds} seeds: the model does not exercise increments"
    );
}

/// Partition `p` as the store holds it, whole.
fn loaded(state: &StateStore, p: i32) -> crate::engine::TaskSnapshot {
    state
        .load(Partition(p))
        .unwrap()
        .expect("a restored partition")
        .0
}
