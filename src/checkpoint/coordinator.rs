//! The checkpoint protocol, in one place for every mode (docs/DESIGN.md §7.2): the
//! Kafka worker and the file run take the same checkpoints through it.
//!
//! Checkpoint N:
//! 1. barrier: the caller is between record batches; the previous checkpoint's
//!    export is awaited and completed first (`before_barrier` after that);
//! 2. flush the outputs: everything emitted before the barrier is acknowledged,
//!    or the checkpoint fails (`after_flush`);
//! 3. hand each partition's delta to a background thread and resume processing;
//!    there, the deltas are written into the state store (one batch), then each
//!    partition's segment is exported (`export::plan_segment`: a delta on top of the
//!    previous checkpoint's chain, or a new base), then the manifest
//!    (`checkpoint::export`). The pause is the flush and the drain alone;
//! 4. when the export is complete (`after_manifest`), commit its offsets
//!    (`after_offset_commit`); a failed commit loses nothing — restores read
//!    offsets from the checkpoint store;
//! 5. retention, every `RETAIN_EVERY` checkpoints.
//!
//! It talks to the world through narrow ports: `Ports` (flush the outputs, commit
//! offsets, crash points), the state store and the checkpoint store (whose
//! `Objects` can be any implementation), so the protocol runs against fakes in
//! the model test (`model_tests`).
//!
//! Invariants: the state store is written only when no export reads it (every
//! write here, and every restore by the caller, is preceded by `finish`); it
//! holds every drained change only when no export is pending (`settled`), so
//! the caller evicts windows only then — an evicted window must be readable
//! back from the store; ids
//! grow per worker; an export that fails fails the checkpoint, and nothing of it
//! is committed. A delta is planned only on top of the chain of this worker's
//! last *complete* checkpoint of the partition (`chains`, set in `finish`); an
//! export that fails forgets every chain, so the next checkpoint is all bases.

use std::sync::Arc;
use std::time::Instant;

use std::collections::BTreeMap;

use super::export::{self, ExportJob, ExportPartition, JobIdentity, PendingExport};
use super::store::CheckpointStore;
use super::{CheckpointError, CheckpointId, Manifest, OffsetLedger, Segment};
use crate::engine::{Counters, StateDelta};
use crate::model::NextOffset;
use crate::model::Partition;
use crate::state::{PartitionCommit, StateStore};
use crate::time::EventTime;

/// The named crash points of the protocol's own steps (the upload's are in
/// `export`: `mid_upload`, `before_manifest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    BeforeBarrier,
    AfterFlush,
    AfterManifest,
    AfterOffsetCommit,
}

impl Step {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Step::BeforeBarrier => "before_barrier",
            Step::AfterFlush => "after_flush",
            Step::AfterManifest => "after_manifest",
            Step::AfterOffsetCommit => "after_offset_commit",
        }
    }
}

/// What the protocol needs from the world besides the two stores.
pub(crate) trait Ports {
    /// Step 2: every output emitted before the barrier is acknowledged.
    fn flush_outputs(&mut self) -> Result<(), CheckpointError>;
    /// Step 4: the checkpoint's offsets to the consumer group (the file run has
    /// none). A failure is logged by the caller's port, never fatal.
    fn commit_offsets(&mut self, id: CheckpointId, offsets: &[(Partition, NextOffset)]);
    /// A crash point: in production `failpoint::hit`; a model test may stop here.
    fn reached(&mut self, step: Step) -> Result<(), CheckpointError> {
        crate::failpoint::hit(step.name());
        Ok(())
    }
}

/// Where a checkpoint's offsets go: the consumer group (`kafka::source::
/// GroupCommitter`), or nowhere (the file run). A failure is logged there and is
/// not fatal: restores read offsets from the checkpoint store.
pub(crate) trait OffsetCommitter {
    fn commit(&mut self, id: CheckpointId, offsets: &[(Partition, NextOffset)]);
}

/// One partition at the barrier: its position, audit and the changes since the
/// last commit.
pub(crate) struct Cut {
    pub partition: Partition,
    pub next_offset: NextOffset,
    pub watermark: Option<EventTime>,
    pub counters: Counters,
    pub offsets: OffsetLedger,
    pub delta: StateDelta,
}

/// A checkpoint whose offsets are committed and whose retention ran.
pub struct Completed {
    pub manifest: Manifest,
    /// From its barrier to now.
    pub duration_ms: u64,
}

/// Retention runs after every this many checkpoints (by id): it lists the whole
/// store, which on object storage costs with every object the kept chains hold.
pub(crate) const RETAIN_EVERY: u64 = 4;

pub struct Coordinator {
    state: Arc<StateStore>,
    checkpoints: Arc<CheckpointStore>,
    job: JobIdentity,
    next_id: CheckpointId,
    pending: Option<PendingExport>,
    /// Each partition's chain in this worker's last complete checkpoint.
    chains: BTreeMap<Partition, Vec<Segment>>,
    /// Barrier pauses so far, µs (the shutdown summary and benchmarks).
    pub pauses_us: Vec<u64>,
}

impl Coordinator {
    pub(crate) fn new(
        state: Arc<StateStore>,
        checkpoints: Arc<CheckpointStore>,
        job: JobIdentity,
    ) -> Result<Self, CheckpointError> {
        Ok(Self {
            next_id: checkpoints.next_id()?,
            state,
            checkpoints,
            job,
            pending: None,
            chains: BTreeMap::new(),
            pauses_us: Vec::new(),
        })
    }

    /// Whether the state store holds every change drained so far (no export is
    /// pending): only then may windows be evicted from memory.
    pub(crate) fn settled(&self) -> bool {
        self.pending.is_none()
    }

    /// The pending export's deltas not yet written to the state store, bytes:
    /// memory outside the tasks that the budget counts (`export`).
    pub(crate) fn in_flight_bytes(&self) -> usize {
        self.pending
            .as_ref()
            .map_or(0, PendingExport::in_flight_bytes)
    }

    /// A view of `in_flight_bytes` that stays valid while the export runs (0
    /// once its deltas are written), for a memory check without the coordinator.
    pub(crate) fn in_flight_gauge(&self) -> Option<Arc<std::sync::atomic::AtomicUsize>> {
        self.pending.as_ref().map(PendingExport::gauge)
    }

    /// Waits until the pending export has written its deltas (and freed them);
    /// the rest of the export goes on.
    pub(crate) fn wait_written(&self) {
        if let Some(p) = &self.pending {
            p.wait_written();
        }
    }

    /// The rules the next checkpoints are written under (a price reload).
    pub(crate) fn set_rules(&mut self, rules: std::sync::Arc<super::evolution::Rules>) {
        self.job.rules = rules;
    }

    pub(crate) fn checkpoints(&self) -> &Arc<CheckpointStore> {
        &self.checkpoints
    }

    /// Steps 1–3 of checkpoint N (and, with `wait`, 4–5). `cut` is called after
    /// the flush: it drains each partition's changes. Returns what completed —
    /// the previous checkpoint, this one, both or neither.
    pub(crate) fn checkpoint(
        &mut self,
        ports: &mut dyn Ports,
        cut: impl FnOnce() -> Vec<Cut>,
        wait: bool,
    ) -> Result<Vec<Completed>, CheckpointError> {
        // The pause runs from here: waiting for a previous export is part of it.
        let started = Instant::now();
        let mut done: Vec<Completed> = self.finish(ports, true)?.into_iter().collect();
        ports.reached(Step::BeforeBarrier)?;
        ports.flush_outputs()?;
        ports.reached(Step::AfterFlush)?;
        let cuts = cut();
        let mut commits = Vec::with_capacity(cuts.len());
        let mut listed = Vec::with_capacity(cuts.len());
        for c in cuts {
            listed.push(ExportPartition {
                partition: c.partition,
                next_offset: c.next_offset,
                watermark: c.watermark,
                high_water: c.delta.high_water,
                counters: c.counters,
                offsets: c.offsets,
                chain: self.chains.get(&c.partition).cloned(),
            });
            commits.push(PartitionCommit {
                partition: c.partition,
                next_offset: c.next_offset,
                delta: c.delta,
            });
        }
        let id = self.next_id;
        self.next_id = CheckpointId(id.0.saturating_add(1));
        let job = ExportJob {
            id,
            job: self.job.clone(),
            created_at_ms: crate::base::clock::now_ms(),
            partitions: listed,
            commits,
            store: self.state.clone(),
            checkpoints: self.checkpoints.clone(),
        };
        let pending = export::spawn(job, started).map_err(|source| CheckpointError::Io {
            path: "checkpoint thread".into(),
            source,
        })?;
        self.pending = Some(pending);
        self.pauses_us.push(started.elapsed().as_micros() as u64);
        if wait {
            done.extend(self.finish(ports, true)?);
        }
        Ok(done)
    }

    /// Steps 4–5 of the pending export: when it is done, or (`block`) waiting
    /// for it.
    pub(crate) fn finish(
        &mut self,
        ports: &mut dyn Ports,
        block: bool,
    ) -> Result<Option<Completed>, CheckpointError> {
        if !block
            && !self
                .pending
                .as_ref()
                .is_some_and(PendingExport::is_finished)
        {
            return Ok(None);
        }
        let Some(pending) = self.pending.take() else {
            return Ok(None);
        };
        let (id, started) = (pending.id, pending.started);
        let manifest = pending.wait().inspect_err(|_| self.chains.clear())?;
        self.chains = manifest
            .partitions
            .iter()
            .map(|e| (e.partition, e.segments.clone()))
            .collect();
        ports.reached(Step::AfterManifest)?;
        let offsets: Vec<(Partition, NextOffset)> = manifest
            .partitions
            .iter()
            .map(|e| (e.partition, e.next_offset))
            .collect();
        ports.commit_offsets(id, &offsets);
        ports.reached(Step::AfterOffsetCommit)?;
        if id.0 % RETAIN_EVERY == 0 {
            self.checkpoints.retain(id)?;
        }
        Ok(Some(Completed {
            manifest,
            duration_ms: started.elapsed().as_millis() as u64,
        }))
    }

    /// Memory pressure between checkpoints: writes `commits` to the working store
    /// once no export reads it. Not a checkpoint: nothing is flushed, exported or
    /// committed — the store is a working copy, restores read the checkpoint store.
    pub(crate) fn spill(
        &mut self,
        ports: &mut dyn Ports,
        commits: Vec<PartitionCommit>,
    ) -> Result<Option<Completed>, CheckpointError> {
        let done = self.finish(ports, true)?;
        self.state.commit(commits)?;
        Ok(done)
    }
}

#[cfg(test)]
mod model_tests;
