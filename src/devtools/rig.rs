//! A checkpointing rig without Kafka: partition tasks fed synthetic requests,
//! checkpointed through the real coordinator into a real state store and
//! checkpoint store. The checkpoint benchmark and the chain tests drive it.

use std::sync::Arc;

use crate::checkpoint::coordinator::{Completed, Coordinator, Cut, Ports};
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::store::CheckpointStore;
use crate::checkpoint::{CheckpointError, CheckpointId, OffsetLedger};
use crate::engine::{EngineConfig, PartitionTask, RecordIn};
use crate::model::Partition;
use crate::state::{NextOffset, StateStore};

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
            fingerprint: "f".into(),
        };
        Ok(Self {
            coord: Coordinator::new(state.clone(), checkpoints, job)?,
            state,
            tasks: (0..partitions)
                .map(|p| PartitionTask::new(Partition(p), engine.clone()))
                .collect(),
            offsets: vec![0; partitions as usize],
        })
    }

    /// One request per tenant in `tenants` to partition `p`, completed at `ts`
    /// (request ids unique per `round`): each opens or updates one window.
    pub fn feed(&mut self, p: usize, tenants: std::ops::Range<usize>, ts: i64, round: usize) {
        let mut out = Vec::new();
        let task = &mut self.tasks[p];
        for t in tenants {
            let rec = format!(
                r#"{{"request_id":"r{round}-{p}-{t}","tenant_id":"tenant-{t}","model":"m","prompt_tokens":100,"completion_tokens":10,"completed_ts":{ts}}}"#
            );
            task.process(
                RecordIn {
                    payload: rec.as_bytes(),
                    kafka_ts: None,
                    now_ms: 0,
                },
                &mut out,
            );
            self.offsets[p] += 1;
        }
    }

    /// A checkpoint of every partition, waited for.
    pub fn checkpoint(&mut self) -> Result<Completed, CheckpointError> {
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
        done.into_iter()
            .last()
            .ok_or_else(|| CheckpointError::Refused("the checkpoint did not complete".into()))
    }
}
