//! The checkpoint exporter: on a background thread, writes the barrier's deltas
//! into the state store (one batch), then one checkpoint from it — so the
//! barrier pause is only the flush and the drain. Each
//! partition's segment — a base (the whole partition) or a delta (the keys its
//! changes name, `state::Changes`), as the coordinator planned — is uploaded part
//! by part, in order (`mid_upload` after the first data object), then — after
//! every part of every partition (`before_manifest`) — the manifest, whose chains
//! reference the new segments and the earlier ones they build on.
//!
//! Up to `UPLOADERS` partitions are written at a time: a part's write is mostly
//! waiting (an fsync, an HTTP round trip), and a partition's parts depend on no
//! other partition's. The manifest lists the partitions in the cut's order
//! whatever order they finished in; the first failure stops the others' next
//! partitions and fails the checkpoint.
//!
//! Until the batch is written, the exporter holds the barrier's deltas (the
//! changed windows' copies, the new dedup ids): `PendingExport::in_flight_bytes`
//! says how much (`StateDelta::bytes`), and falls to 0 once they are written and
//! freed, so the worker's memory check counts them against the budget.
//!
//! Invariant: nothing but the exporter writes the state store while an export
//! runs (the worker joins the previous export before its next barrier, spill or
//! restore, and evicts nothing until then), so the exporter reads the exact cut
//! taken at the barrier.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::evolution::Rules;
use super::format::VERSION;
use super::names::part_key;
use super::part::PartWriter;
use super::store::CheckpointStore;
use super::{
    CheckpointError, CheckpointId, Manifest, OffsetLedger, PartRef, PartitionEntry, Segment,
    SegmentKind,
};
use crate::base::error::Bug;
use crate::engine::Counters;
use crate::model::NextOffset;
use crate::model::Partition;
use crate::state::{Changes, KnownChanges, PartitionCommit, StateStore};
use crate::time::EventTime;

/// One partition as the barrier cut it.
pub(crate) struct ExportPartition {
    pub partition: Partition,
    pub next_offset: NextOffset,
    pub watermark: Option<EventTime>,
    /// The greatest `completed_ts` priced (`evolution`).
    pub high_water: Option<i64>,
    pub counters: Counters,
    pub offsets: OffsetLedger,
    /// Its chain in this worker's previous complete checkpoint, if any: the
    /// exporter plans a delta on it or a base (`plan_segment`),
    /// from the changes it takes from the store (off the barrier's pause).
    pub chain: Option<Vec<Segment>>,
}

/// The most deltas a chain holds before the next checkpoint writes a base.
pub(crate) const MAX_DELTAS: usize = 16;

/// What to write for a partition whose last complete chain is `chain` (if any)
/// and whose working copy knows `changes`: a delta while the chain is short and
/// its deltas weigh less than its base; a base otherwise (see `checkpoint`).
pub(crate) fn plan_segment(chain: Option<&[Segment]>, changes: Changes) -> SegmentPlan {
    let (Some(chain), Changes::Known(changes)) = (chain, changes) else {
        return SegmentPlan::Base;
    };
    let Some((base, deltas)) = chain.split_first() else {
        return SegmentPlan::Base;
    };
    let delta_bytes: u64 = deltas.iter().map(Segment::bytes).sum();
    if deltas.len() >= MAX_DELTAS || delta_bytes >= base.bytes() {
        return SegmentPlan::Base;
    }
    SegmentPlan::Delta {
        chain: chain.to_vec(),
        changes,
    }
}

/// What to write for one partition.
#[derive(Debug, Clone)]
pub(crate) enum SegmentPlan {
    /// The whole partition: a new chain.
    Base,
    /// Only `changes`, on top of `chain` (the previous checkpoint's).
    Delta {
        chain: Vec<Segment>,
        changes: KnownChanges,
    },
}

/// Who writes checkpoints, and under which rules: the manifest's identity.
#[derive(Debug, Clone)]
pub(crate) struct JobIdentity {
    /// This process's name in checkpoint names.
    pub worker: String,
    pub group: String,
    pub topic: String,
    /// The running configuration's rules (`evolution`): its fingerprint and
    /// semantics go into every manifest.
    pub rules: std::sync::Arc<Rules>,
}

/// What the barrier hands to the exporter.
pub(crate) struct ExportJob {
    pub id: CheckpointId,
    pub job: JobIdentity,
    pub created_at_ms: i64,
    pub partitions: Vec<ExportPartition>,
    /// The barrier's deltas, written into the store before anything is read.
    pub commits: Vec<PartitionCommit>,
    pub store: Arc<StateStore>,
    pub checkpoints: Arc<CheckpointStore>,
}

/// A checkpoint whose objects are being written on the exporter thread.
pub(crate) struct PendingExport {
    pub id: CheckpointId,
    /// When its barrier began (the pause and the duration are measured from here).
    pub started: Instant,
    handle: JoinHandle<Result<Manifest, CheckpointError>>,
    /// The deltas' bytes until they are written (then 0).
    in_flight: Arc<AtomicUsize>,
}

impl PendingExport {
    pub(crate) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The barrier's deltas the exporter still holds, bytes (0 once written).
    pub(crate) fn in_flight_bytes(&self) -> usize {
        if self.handle.is_finished() {
            return 0;
        }
        self.in_flight.load(Ordering::Acquire)
    }

    /// `in_flight_bytes` as a shared counter (0 once the deltas are written).
    pub(crate) fn gauge(&self) -> Arc<AtomicUsize> {
        self.in_flight.clone()
    }

    /// Waits until the deltas are written (not for the rest of the export).
    pub(crate) fn wait_written(&self) {
        while self.in_flight_bytes() > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Waits for the export; its manifest is then durable.
    pub(crate) fn wait(self) -> Result<Manifest, CheckpointError> {
        self.handle.join().map_err(|_| {
            CheckpointError::Bug(Bug(format!("checkpoint {} thread panicked", self.id.0)))
        })?
    }
}

/// Starts writing `job` on its own thread; `started` is its barrier's start.
pub(crate) fn spawn(job: ExportJob, started: Instant) -> std::io::Result<PendingExport> {
    let id = job.id;
    let bytes = job.commits.iter().map(|c| c.delta.bytes()).sum();
    let in_flight = Arc::new(AtomicUsize::new(bytes));
    let gauge = in_flight.clone();
    let handle = std::thread::Builder::new()
        .name(format!("checkpoint-{}", id.0))
        .spawn(move || run(job, &gauge))?;
    Ok(PendingExport {
        id,
        started,
        handle,
        in_flight,
    })
}

/// Partitions written at the same time.
const UPLOADERS: usize = 4;

/// Uploads one partition's parts, in order.
struct Uploader<'a> {
    checkpoints: &'a CheckpointStore,
    name: &'a str,
    partition: Partition,
    parts: Vec<PartRef>,
    /// Data objects written by this checkpoint so far (all partitions).
    written: &'a AtomicUsize,
}

impl Uploader<'_> {
    fn put(&mut self, bytes: Vec<u8>) -> Result<(), CheckpointError> {
        let key = part_key(self.name, self.partition, self.parts.len());
        self.checkpoints.objects().put_new(&key, &bytes)?;
        self.parts.push(PartRef {
            bytes: bytes.len() as u64,
            sha256: Sha256::digest(&bytes).into(),
        });
        if self.written.fetch_add(1, Ordering::Relaxed) == 0 {
            crate::failpoint::hit("mid_upload");
        }
        Ok(())
    }
}

fn run(mut job: ExportJob, in_flight: &AtomicUsize) -> Result<Manifest, CheckpointError> {
    let written = job.store.commit(std::mem::take(&mut job.commits));
    // The deltas are freed (the commit consumed them), written or not.
    in_flight.store(0, Ordering::Release);
    written?;
    let name = job.checkpoints.name_for(job.id);
    let written = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let cuts = std::mem::take(&mut job.partitions);
    let count = cuts.len();
    let todo = Mutex::new(cuts.into_iter().enumerate());
    let next = || todo.lock().ok().and_then(|mut t| t.next());
    let mut done: Vec<(usize, Result<PartitionEntry, CheckpointError>)> = std::thread::scope(|s| {
        let uploaders: Vec<_> = (0..UPLOADERS.min(count))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let Some((i, cut)) = next() else { break };
                        let entry = export_partition(&job, &name, cut, &written);
                        failed.fetch_or(entry.is_err(), Ordering::Relaxed);
                        mine.push((i, entry));
                    }
                    mine
                })
            })
            .collect();
        uploaders
            .into_iter()
            .flat_map(|u| u.join().unwrap_or_default())
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    if done.len() < count && !failed.load(Ordering::Relaxed) {
        return Err(CheckpointError::Bug(Bug(format!(
            "checkpoint {}: an upload thread panicked",
            job.id.0
        ))));
    }
    let entries = done
        .into_iter()
        .map(|(_, entry)| entry)
        .collect::<Result<Vec<_>, _>>()?;
    crate::failpoint::hit("before_manifest");
    let manifest = Manifest {
        format: VERSION,
        id: job.id,
        worker: job.job.worker,
        created_at_ms: job.created_at_ms,
        group: job.job.group,
        topic: job.job.topic,
        fingerprint: job.job.rules.fingerprint.clone(),
        semantics: job.job.rules.semantics.clone(),
        partitions: entries,
    };
    job.checkpoints.write_manifest(&name, &manifest)?;
    Ok(manifest)
}

/// Writes one partition's segment; returns its manifest entry.
fn export_partition(
    job: &ExportJob,
    name: &str,
    cut: ExportPartition,
    written: &AtomicUsize,
) -> Result<PartitionEntry, CheckpointError> {
    let p = cut.partition;
    let mut up = Uploader {
        checkpoints: &job.checkpoints,
        name,
        partition: p,
        parts: Vec::new(),
        written,
    };
    let mut w = PartWriter::new(p);
    let mut failed: Option<CheckpointError> = None;
    let mut visit = |k: &[u8], v: &[u8]| match w.entry(k, v) {
        Some(done) => up.put(done).map_err(|e| {
            let io = std::io::Error::other(e.to_string());
            failed = Some(e);
            io
        }),
        None => Ok(()),
    };
    let plan = plan_segment(cut.chain.as_deref(), job.store.take_changes(p));
    let (exported, mut segments, kind) = match &plan {
        SegmentPlan::Base => (
            job.store.export_partition(p, &mut visit),
            Vec::new(),
            SegmentKind::Base,
        ),
        SegmentPlan::Delta { chain, changes } => (
            job.store.export_changes(p, changes, &mut visit),
            chain.clone(),
            SegmentKind::Delta {
                windows_through: changes.windows_through,
                dedup_through: changes.dedup_through,
            },
        ),
    };
    if let Some(e) = failed {
        return Err(e);
    }
    exported?;
    up.put(w.finish())?;
    segments.push(Segment {
        checkpoint: name.to_string(),
        kind,
        parts: up.parts,
    });
    Ok(PartitionEntry {
        partition: p,
        next_offset: cut.next_offset,
        watermark: cut.watermark,
        high_water: cut.high_water,
        counters: cut.counters,
        offsets: cut.offsets,
        segments,
    })
}
