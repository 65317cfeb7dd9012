//! The file run's checkpoints: the worker's coordinator, store format and
//! exporter, in a store of its own, `<checkpoint.dir>/file-<input stem>` (never a
//! Kafka job's store).
//!
//! Invariants: the working copy `<state.dir>/rocksdb` is wiped when it is opened (a
//! file run starts from empty state; its checkpoints are not restored); it is written
//! only through the coordinator, so never while an export reads it; a checkpoint's
//! offset is the number of lines read and applied (the partition's next offset:
//! empty lines are empty offsets of its ledger); there is no consumer group, so
//! no offsets are committed anywhere.

use std::path::Path;
use std::sync::Arc;

use super::outputs::SideFiles;
use crate::checkpoint::coordinator::Coordinator;
use crate::checkpoint::export::JobIdentity;
use crate::checkpoint::store::CheckpointStore;
use crate::config::Config;
use crate::state::StateStore;
use crate::worker::partitions::{NoGroup, Partitions};
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
    /// Checkpoints taken so far.
    pub(super) taken: u64,
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
        let rules = Arc::new(crate::checkpoint::rules(
            &topic,
            &engine,
            None,
            crate::config::rating::from_source,
        ));
        let job = JobIdentity {
            worker,
            group,
            topic,
            rules,
        };
        Ok(Self {
            coord: Coordinator::new(store.clone(), checkpoints, job)?,
            store,
            taken: 0,
        })
    }

    /// Waits for the pending export; retention runs.
    pub(super) fn finish(&mut self, parts: &mut Partitions<SideFiles>) -> Result<(), WorkerError> {
        parts.finish(&mut self.coord, &mut NoGroup, true)?;
        Ok(())
    }

    /// Memory pressure: the changes to the working store, then evict (see
    /// `Partitions::spill`; no export).
    pub(super) fn spill(&mut self, parts: &mut Partitions<SideFiles>) -> Result<(), WorkerError> {
        parts.spill(&mut self.coord, &mut NoGroup)?;
        Ok(())
    }

    /// A checkpoint through the coordinator; the output files are flushed at
    /// step 2, and a flush's error is the checkpoint's. Evicting waits for the
    /// export's commit (the next spill's, at the latest): an evicted window must be
    /// in the store.
    pub(super) fn checkpoint(
        &mut self,
        parts: &mut Partitions<SideFiles>,
    ) -> Result<(), WorkerError> {
        parts.checkpoint(&mut self.coord, &mut NoGroup, false)?;
        self.taken += 1;
        Ok(())
    }
}
