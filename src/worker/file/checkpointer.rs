//! The file run's checkpoints: the worker's coordinator, store format and
//! exporter, in a store of its own, `<checkpoint.dir>/file-<input stem>` (never a
//! Kafka job's store).
//!
//! Invariants: the working copy `<state.dir>/rocksdb` is wiped when it is opened (a
//! file run starts from empty state; its checkpoints are not restored); it is written
//! only through the coordinator, so never while an export reads it; a checkpoint's
//! offset is the number of lines read and applied; there is no consumer group, so
//! no offsets are committed anywhere.

use std::path::Path;
use std::sync::Arc;

use super::outputs::SideFiles;
use crate::checkpoint::coordinator::{Coordinator, Cut};
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::store::CheckpointStore;
use crate::checkpoint::OffsetLedger;
use crate::config::Config;
use crate::engine::PartitionTask;
use crate::model::Partition;
use crate::state::{NextOffset, PartitionCommit, StateStore};
use crate::worker::partitions::{NoGroup, OutputPorts};
use crate::worker::WorkerError;

/// The checkpoint store's group of a file run: `file-<input stem>`.
pub(super) fn group(input: &Path) -> String {
    let stem = input
        .file_stem()
        .map_or("input".into(), |s| s.to_string_lossy().into_owned());
    format!("file-{stem}")
}

/// The file run's checkpoints: the same coordinator as the worker's.
pub(super) struct Checkpointer {
    pub(super) store: Arc<StateStore>,
    coord: Coordinator,
    /// Bytes of windows kept in memory after a commit (`spill::keep_of` the
    /// budget).
    budget: Option<usize>,
    /// Checkpoints taken and windows evicted so far.
    pub(super) taken: u64,
    pub(super) evicted: u64,
}

fn cut(task: &mut PartitionTask, lines: u64) -> Cut {
    let next = NextOffset(lines as i64);
    Cut {
        partition: Partition(0),
        next_offset: next,
        watermark: task.max_ts().map(|_| task.watermark()),
        counters: task.counters(),
        offsets: OffsetLedger::without_gaps(task.counters().consumed, next),
        delta: task.drain_changes(),
    }
}

impl Checkpointer {
    pub(super) fn open(cfg: &Config, input: &Path) -> Result<Self, WorkerError> {
        let dir = cfg.state.dir.join("rocksdb");
        crate::worker::create_state_dir(&cfg.state.dir)?;
        let store = Arc::new(StateStore::open_fresh(&dir)?);
        let group = group(input);
        let worker = format!("f{}", std::process::id());
        let checkpoints = Arc::new(CheckpointStore::open(&cfg.checkpoint, &group, &worker)?);
        let engine = cfg.engine()?;
        let topic = format!("file:{}", input.display());
        let rules = Arc::new(crate::checkpoint::rules(&topic, &engine, None));
        let job = JobIdentity {
            worker,
            group,
            topic,
            rules,
        };
        Ok(Self {
            coord: Coordinator::new(store.clone(), checkpoints, job)?,
            store,
            budget: cfg
                .state
                .memory_budget_bytes()
                .map(crate::engine::spill::keep_of),
            taken: 0,
            evicted: 0,
        })
    }

    /// Waits for the pending export; retention runs.
    pub(super) fn finish(&mut self, outputs: &mut SideFiles) -> Result<(), WorkerError> {
        let mut group = NoGroup;
        let mut ports = OutputPorts::new(outputs, &mut group);
        self.coord
            .finish(&mut ports, true)
            .map_err(|e| ports.error(e))?;
        Ok(())
    }

    /// Memory pressure: the task's changes to the working store, then evict (see
    /// `Coordinator::spill`; no export).
    pub(super) fn spill(
        &mut self,
        task: &mut PartitionTask,
        lines: u64,
        outputs: &mut SideFiles,
    ) -> Result<(), WorkerError> {
        let c = cut(task, lines);
        let commit = PartitionCommit {
            partition: c.partition,
            next_offset: c.next_offset,
            delta: c.delta,
        };
        let mut group = NoGroup;
        let mut ports = OutputPorts::new(outputs, &mut group);
        self.coord
            .spill(&mut ports, vec![commit])
            .map_err(|e| ports.error(e))?;
        if let Some(keep) = self.budget {
            self.evicted += task.evict(keep) as u64;
        }
        Ok(())
    }

    /// A checkpoint through the coordinator; the output files are flushed at
    /// step 2, and a flush's error is the checkpoint's.
    pub(super) fn checkpoint(
        &mut self,
        task: &mut PartitionTask,
        lines: u64,
        outputs: &mut SideFiles,
    ) -> Result<(), WorkerError> {
        let mut group = NoGroup;
        let mut ports = OutputPorts::new(outputs, &mut group);
        self.coord
            .checkpoint(&mut ports, || vec![cut(task, lines)], false)
            .map_err(|e| ports.error(e))?;
        // Evicting waits for the export's commit (the next spill's, at the
        // latest): an evicted window must be in the store.
        if let (Some(keep), true) = (self.budget, self.coord.settled()) {
            self.evicted += task.evict(keep) as u64;
        }
        self.taken += 1;
        Ok(())
    }
}
