//! The file run's checkpoints: the worker's store format and exporter, in a store of
//! its own, `<checkpoint.dir>/file-<input stem>` (never a Kafka job's store).
//!
//! Invariants: the working copy `<state.dir>/rocksdb` is wiped when it is opened (a
//! file run starts from empty state; its checkpoints are not restored); it is written
//! only once no export reads it (`commit` awaits the pending export first); a
//! checkpoint's offset is the number of lines read and applied.

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::export::{self, ExportJob, ExportPartition, JobIdentity, PendingExport};
use crate::checkpoint::store::CheckpointStore;
use crate::checkpoint::CheckpointId;
use crate::checkpoint::OffsetLedger;
use crate::config::Config;
use crate::engine::PartitionTask;
use crate::kafka::now_ms;
use crate::model::Partition;
use crate::state::{NextOffset, PartitionCommit, StateStore};
use crate::worker::WorkerError;

/// The checkpoint store's group of a file run: `file-<input stem>`.
pub(super) fn group(input: &Path) -> String {
    let stem = input
        .file_stem()
        .map_or("input".into(), |s| s.to_string_lossy().into_owned());
    format!("file-{stem}")
}

/// The file run's checkpoints: same store format and exporter as the worker's.
pub(super) struct Checkpointer {
    pub(super) store: Arc<StateStore>,
    checkpoints: Arc<CheckpointStore>,
    job: JobIdentity,
    next_id: CheckpointId,
    /// Bytes of windows kept in memory after a commit (`state.memory_budget`).
    budget: Option<usize>,
    /// Checkpoints taken and windows evicted so far.
    pub(super) taken: u64,
    pub(super) evicted: u64,
    pending: Option<PendingExport>,
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
        let fingerprint = crate::checkpoint::fingerprint(&topic, &engine, None);
        Ok(Self {
            store,
            next_id: checkpoints.next_id()?,
            checkpoints,
            job: JobIdentity {
                worker,
                group,
                topic,
                fingerprint,
            },
            budget: cfg.state.memory_budget_bytes(),
            taken: 0,
            evicted: 0,
            pending: None,
        })
    }

    /// Waits for the pending export and applies retention.
    pub(super) fn finish(&mut self) -> Result<(), WorkerError> {
        if let Some(pending) = self.pending.take() {
            let id = pending.id;
            pending.wait()?;
            self.checkpoints.retain(id)?;
        }
        Ok(())
    }

    /// Writes the task's changes to the working store, once no export reads it.
    fn commit(&mut self, task: &mut PartitionTask, lines: u64) -> Result<(), WorkerError> {
        self.finish()?;
        self.store.commit(vec![PartitionCommit {
            partition: Partition(0),
            next_offset: NextOffset(lines as i64),
            delta: task.drain_changes(),
        }])?;
        Ok(())
    }

    /// Memory pressure: commit the changes to the working store and evict (see
    /// `Core::spill`; no export).
    pub(super) fn spill(
        &mut self,
        task: &mut PartitionTask,
        lines: u64,
    ) -> Result<(), WorkerError> {
        self.commit(task, lines)?;
        if let Some(keep) = self.budget {
            self.evicted += task.evict(keep) as u64;
        }
        Ok(())
    }

    /// The barrier: (outputs already flushed) commit the task's changes, export.
    pub(super) fn checkpoint(
        &mut self,
        task: &mut PartitionTask,
        lines: u64,
    ) -> Result<(), WorkerError> {
        self.commit(task, lines)?;
        let id = self.next_id;
        self.next_id = CheckpointId(id.0.saturating_add(1));
        let wm = task.max_ts().map(|_| task.watermark());
        let pending = export::spawn(
            ExportJob {
                id,
                job: self.job.clone(),
                created_at_ms: now_ms(),
                partitions: vec![ExportPartition {
                    partition: Partition(0),
                    next_offset: NextOffset(lines as i64),
                    watermark: wm,
                    counters: task.counters(),
                    offsets: OffsetLedger::without_gaps(
                        task.counters().consumed,
                        NextOffset(lines as i64),
                    ),
                }],
                store: self.store.clone(),
                checkpoints: self.checkpoints.clone(),
            },
            std::time::Instant::now(),
        )
        .map_err(|source| WorkerError::Io {
            path: "checkpoint thread".into(),
            source,
        })?;
        self.pending = Some(pending);
        if let Some(keep) = self.budget {
            self.evicted += task.evict(keep) as u64;
        }
        self.taken += 1;
        Ok(())
    }
}
