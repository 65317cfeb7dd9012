//! A checkpointing rig without Kafka: partition tasks fed synthetic requests,
//! checkpointed through the real coordinator into a real state store and
//! checkpoint store. The checkpoint benchmark and the chain tests drive it.

use std::sync::Arc;

use crate::base::error::Bug;

use crate::checkpoint::coordinator::{Completed, Coordinator, Cut, Ports};
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::store::CheckpointStore;
use crate::checkpoint::{CheckpointError, CheckpointId, OffsetLedger};
use crate::engine::{EngineConfig, PartitionTask, RecordIn};
use crate::model::NextOffset;
use crate::model::Partition;
use crate::state::StateStore;
use crate::worker::WorkerError;

/// No outputs to flush, no group to commit to.
pub struct NoPorts;

impl Ports for NoPorts {
    fn flush_outputs(&mut self) -> Result<(), CheckpointError> {
        Ok(())
    }

    fn commit_offsets(&mut self, _: CheckpointId, _: &[(Partition, NextOffset)]) {}
}

/// 2026-01-01T10:00:00Z: the first window of every rig.
pub const T0: i64 = 1_767_261_600_000;

pub struct Rig {
    pub state: Arc<StateStore>,
    pub coord: Coordinator,
    pub tasks: Vec<PartitionTask>,
    /// Records fed to each partition so far (its next offset).
    pub offsets: Vec<i64>,
    /// `state.memory_budget` of the rig (all partitions), if any.
    pub budget: Option<usize>,
    /// Records since the last memory check.
    since_check: usize,
}

impl Rig {
    /// `partitions` empty tasks checkpointing as `worker` into `checkpoints`,
    /// with a fresh working copy at `state_dir`.
    pub fn new(
        state_dir: &std::path::Path,
        checkpoints: Arc<CheckpointStore>,
        worker: &str,
        partitions: i32,
        engine: Arc<EngineConfig>,
    ) -> Result<Self, CheckpointError> {
        let state = Arc::new(StateStore::open_fresh(state_dir)?);
        let job = JobIdentity {
            worker: worker.into(),
            group: "g".into(),
            topic: "requests".into(),
            rules: std::sync::Arc::new(crate::checkpoint::evolution::Rules::opaque("f")),
        };
        Ok(Self {
            coord: Coordinator::new(state.clone(), checkpoints, job)?,
            state,
            tasks: (0..partitions)
                .map(|p| PartitionTask::new(Partition(p), engine.clone()))
                .collect(),
            offsets: vec![0; partitions as usize],
            budget: None,
            since_check: 0,
        })
    }

    /// Lets the rig evict windows and move dedup ids out under `budget` bytes,
    /// as a worker does (after each commit; a spill when over it).
    pub fn with_budget(mut self, budget: usize) -> Self {
        for t in &mut self.tasks {
            t.attach_spill(self.state.clone());
        }
        self.budget = Some(budget);
        self
    }

    /// Bytes the tasks hold that the budget bounds.
    pub fn held_bytes(&self) -> usize {
        self.tasks.iter().map(|t| t.budgeted_bytes()).sum()
    }

    fn evict(&mut self) -> Result<(), WorkerError> {
        if let (Some(budget), true) = (self.budget, self.coord.settled()) {
            let keep = crate::engine::spill::keep_of(budget) / self.tasks.len().max(1);
            for t in &mut self.tasks {
                t.evict(keep)?;
            }
        }
        Ok(())
    }

    /// The worker's memory check (every 4096 records, and after a record that
    /// emitted panes, as `worker::partitions` checks after such a run): over the
    /// budget, the changes go to the store and the tasks shrink (`spill::keep_of`).
    fn check_memory(&mut self, paned: bool) -> Result<(), WorkerError> {
        self.since_check += 1;
        if self.since_check < 4096 && !paned {
            return Ok(());
        }
        self.since_check = 0;
        let Some(budget) = self.budget else {
            return Ok(());
        };
        if self.held_bytes() + self.coord.in_flight_bytes() <= budget {
            return Ok(());
        }
        self.commit()
    }

    /// A spill: every task's changes to the working copy (no checkpoint), then,
    /// under a budget, evictions.
    pub fn commit(&mut self) -> Result<(), WorkerError> {
        let commits = self
            .tasks
            .iter_mut()
            .zip(&self.offsets)
            .map(|(t, &next)| crate::state::PartitionCommit {
                partition: t.partition(),
                next_offset: NextOffset(next),
                delta: t.drain_changes(),
            })
            .collect();
        self.coord.spill(&mut NoPorts, commits)?;
        self.evict()
    }

    /// One request per tenant in `tenants` to partition `p`, completed at `ts`
    /// (request ids unique per `round`): each opens or updates one window.
    pub fn feed(&mut self, p: usize, tenants: std::ops::Range<usize>, ts: i64, round: usize) {
        for t in tenants {
            let id = format!("r{round}-{p}-{t}");
            self.feed_one(p, &id, &format!("tenant-{t}"), ts)
                .expect("the rig's state store works");
        }
    }

    /// One request `id` of `tenant` to partition `p`, completed at `ts`; under a
    /// budget, the memory check after it (which may spill).
    pub fn feed_one(
        &mut self,
        p: usize,
        id: &str,
        tenant: &str,
        ts: i64,
    ) -> Result<crate::engine::Route, WorkerError> {
        let rec = format!(
            r#"{{"request_id":"{id}","tenant_id":"{tenant}","model":"m","prompt_tokens":100,"completion_tokens":10,"completed_ts":{ts}}}"#
        );
        let mut out = Vec::new();
        let route = self.tasks[p].process_step(
            RecordIn {
                payload: rec.as_bytes(),
                kafka_ts: None,
                now_ms: 0,
            },
            &mut out,
        )?;
        self.offsets[p] += 1;
        self.check_memory(!out.is_empty())?;
        // A window end firing in steps: the memory check after each.
        while self.tasks[p].firing() {
            out.clear();
            self.tasks[p].resume_firing(&mut out)?;
            self.check_memory(true)?;
        }
        Ok(route)
    }

    /// A checkpoint of every partition, waited for.
    pub fn checkpoint(&mut self) -> Result<Completed, WorkerError> {
        let (tasks, offsets) = (&mut self.tasks, &self.offsets);
        let cut = || {
            tasks
                .iter_mut()
                .zip(offsets)
                .map(|(t, &next)| Cut {
                    partition: t.partition(),
                    next_offset: NextOffset(next),
                    watermark: Some(t.watermark()),
                    counters: t.counters(),
                    offsets: OffsetLedger::without_gaps(t.counters().consumed, NextOffset(next)),
                    delta: t.drain_changes(),
                })
                .collect()
        };
        let done = self.coord.checkpoint(&mut NoPorts, cut, true)?;
        self.evict()?;
        done.into_iter()
            .last()
            .ok_or_else(|| Bug("the rig's checkpoint did not complete".into()).into())
    }
}
