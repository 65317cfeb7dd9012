//! The checkpoint exporter: writes one checkpoint from the state store on a
//! background thread, so the barrier pause is only flush + one batch write.
//!
//! Invariant: the state store is not written while an export runs (the worker
//! joins the previous export before its next barrier or restore), so the exporter
//! reads the exact cut taken at the barrier.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::file::SnapshotWriter;
use super::store::write_manifest;
use super::{
    io_err, CheckpointError, CheckpointId, Manifest, OffsetLedger, PartitionEntry, MANIFEST_FORMAT,
};
use crate::engine::Counters;
use crate::model::Partition;
use crate::state::{NextOffset, StateStore};
use crate::time::EventTime;

/// One partition as the barrier cut it.
pub struct ExportPartition {
    pub partition: Partition,
    pub next_offset: NextOffset,
    pub watermark: Option<EventTime>,
    pub counters: Counters,
    pub offsets: OffsetLedger,
}

/// Who writes checkpoints, and under which rules: the manifest's identity.
#[derive(Debug, Clone)]
pub struct JobIdentity {
    /// This process's name in checkpoint directory names.
    pub worker: String,
    pub group: String,
    pub topic: String,
    /// `checkpoint::fingerprint` of the running configuration.
    pub fingerprint: String,
}

/// What the barrier hands to the exporter.
pub struct ExportJob {
    pub id: CheckpointId,
    pub dir: PathBuf,
    pub job: JobIdentity,
    pub created_at_ms: i64,
    pub partitions: Vec<ExportPartition>,
    pub store: Arc<StateStore>,
}

/// A checkpoint whose files are being written on the exporter thread.
pub struct PendingExport {
    pub id: CheckpointId,
    /// When its barrier began (the pause and the duration are measured from here).
    pub started: Instant,
    handle: JoinHandle<Result<Manifest, CheckpointError>>,
}

impl PendingExport {
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the export; its manifest is then durable.
    pub fn wait(self) -> Result<Manifest, CheckpointError> {
        self.handle.join().map_err(|_| {
            CheckpointError::Refused(format!("checkpoint {} thread panicked", self.id.0))
        })?
    }
}

/// Starts writing `job` on its own thread; `started` is its barrier's start.
pub fn spawn(job: ExportJob, started: Instant) -> std::io::Result<PendingExport> {
    let id = job.id;
    let handle = std::thread::Builder::new()
        .name(format!("checkpoint-{}", id.0))
        .spawn(move || run(job))?;
    Ok(PendingExport {
        id,
        started,
        handle,
    })
}

fn run(job: ExportJob) -> Result<Manifest, CheckpointError> {
    std::fs::create_dir_all(&job.dir).map_err(io_err(&job.dir))?;
    let mut entries = Vec::with_capacity(job.partitions.len());
    for (i, cut) in job.partitions.into_iter().enumerate() {
        let p = cut.partition;
        let file = super::store::partition_file(p);
        let path = job.dir.join(&file);
        let mut w = SnapshotWriter::create(&path, p)?;
        job.store.export_partition(p, |k, v| w.entry(k, v))?;
        let (bytes, sha256) = w.finish(&path)?;
        entries.push(PartitionEntry {
            partition: p,
            next_offset: cut.next_offset,
            watermark: cut.watermark,
            counters: cut.counters,
            file,
            bytes,
            sha256,
            offsets: cut.offsets,
        });
        if i == 0 {
            crate::failpoint::hit("mid_state_write");
        }
    }
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        id: job.id,
        worker: job.job.worker,
        created_at_ms: job.created_at_ms,
        group: job.job.group,
        topic: job.job.topic,
        fingerprint: job.job.fingerprint,
        partitions: entries,
    };
    write_manifest(&job.dir, &manifest)?;
    Ok(manifest)
}
