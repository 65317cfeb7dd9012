//! Checkpoints: durable, checksummed, per-partition snapshots tied to Kafka offsets
//! (docs/DESIGN.md §7).
//!
//! ## Layout of the checkpoint store (`checkpoint.dir`: a path, or a URL such as
//! `s3://bucket/prefix`; see `objects`)
//!
//! ```text
//! <dir>/<group_id>/chk-<id:020>-<worker>/
//!     p-<partition:06>-<part:04>   the partition's state in parts (`part`)
//!     MANIFEST                     the manifest (`format`); written last
//! ```
//!
//! Every key and name of that layout is built and parsed in `names`.
//!
//! ## Rules
//! - Every object is created once and never replaced (`objects`: a hard link of
//!   a synced file, or a conditional `PutMode::Create`). The manifest is written
//!   after every part of the checkpoint: a checkpoint is complete iff its
//!   `MANIFEST` exists and its checksum holds; its parts are trusted only when
//!   their size and sha256 match the manifest. Only then are the manifest's
//!   offsets committed to the consumer group (with `tally-checkpoint=<id>` as
//!   commit metadata).
//! - A partition is restored from the complete checkpoint holding it with the
//!   greatest `next_offset` (ties: the greater id) whose parts all check out. A
//!   mismatch falls back to the next candidate, loudly. Because a partition's
//!   snapshot at offset `o` is a pure function of the records before `o`, any
//!   worker's snapshot of `p` at `o` is *the* state of `p` at `o` — so selecting by
//!   offset is safe across workers, and a zombie's older checkpoint never wins.
//! - A checkpoint whose config fingerprint differs from the running config is
//!   restored only when the change is compatible (`evolution`: prices that take
//!   effect after everything the partition priced), and then the changes are
//!   logged; otherwise the worker refuses, naming the key and how to proceed. A
//!   checkpoint of another format is refused by name (`format`).
//! - Retention: a complete checkpoint is deleted — manifest first, so it stops
//!   being complete before any part goes — only when every partition in it is held
//!   by at least `retain` newer complete checkpoints. Objects of incomplete
//!   checkpoints are deleted when their writer is this process and a newer one
//!   completed, or when all are older than an hour (another writer may still be
//!   uploading). Nothing a retained manifest references is ever deleted — in
//!   whichever checkpoint's directory it lies — and this worker's newest complete
//!   checkpoint is kept (its chains are the parents of the next one).
//!   So are the anchors (`anchors`): per partition, the oldest checkpoint of
//!   each of the newest `checkpoint.anchors` periods of `checkpoint.anchor_every`.
//!
//! ## Incremental checkpoints
//! - A partition's state in a manifest is a chain of segments (`Segment`): one
//!   base (the whole state, as parts) and then deltas, each the entries written
//!   since the previous checkpoint plus two range deletes (`SegmentKind::Delta`).
//!   Segments are immutable objects in the directory of the checkpoint that wrote
//!   them; a later manifest references them by that checkpoint's name.
//! - A checkpoint writes a delta for a partition only on top of this worker's
//!   previous complete checkpoint of it, and only while the working copy knows
//!   every key written since (`state::Changes`). It writes a base instead after
//!   any restore or drop of the partition (a chain never crosses workers, so no
//!   worker depends on another's retention), after a failed export, when the
//!   changes were too many to track, when the chain holds `MAX_DELTAS` deltas, or
//!   when its deltas outweigh its base (compaction: restores read at most about
//!   twice a snapshot).
//! - Restoring reads every part of the chain in parallel, checks each against the
//!   manifest, then applies base and deltas in order; damage anywhere in the
//!   chain fails that candidate, and the restore falls back to the next one.

pub(crate) mod anchors;
pub(crate) mod config;
pub(crate) mod coordinator;
pub mod evolution;
pub(crate) mod export;
pub mod format;
pub(crate) mod ledger;
pub mod names;
pub mod objects;
pub(crate) mod part;
pub(crate) mod restore;
pub mod store;

#[cfg(test)]
mod chain_tests;

use serde::{Deserialize, Serialize};

use crate::base::error::{Bug, ClassifiedError, Classify, ErrorClass, Refusal};

use crate::engine::{Counters, EngineConfig};
use crate::model::NextOffset;
use crate::model::Partition;
use crate::time::EventTime;
pub use ledger::OffsetLedger;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint store {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("checkpoint {path}: {msg}")]
    Corrupt { path: String, msg: String },
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("checkpoint store: {0}")]
    Store(#[from] objects::ObjectError),
    /// The outputs could not be flushed at the barrier (step 2): the outputs'
    /// own error (the producer's, a file's), whose class it keeps.
    #[error("flushing the outputs at the checkpoint barrier: {0}")]
    Outputs(Box<dyn ClassifiedError>),
    /// A refusal to restore, with the way out.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A checkpoint's thread panicked.
    #[error(transparent)]
    Bug(#[from] Bug),
}

impl Classify for CheckpointError {
    fn class(&self) -> ErrorClass {
        match self {
            // A local directory that fails (disk full, read-only) is local I/O;
            // damage reaching the boundary (`checkpoints verify`) is not classified.
            CheckpointError::Io { .. } | CheckpointError::Corrupt { .. } => ErrorClass::Internal,
            CheckpointError::State(e) => e.class(),
            CheckpointError::Store(e) => e.class(),
            CheckpointError::Outputs(e) => e.class(),
            CheckpointError::Refused(e) => e.class(),
            CheckpointError::Bug(e) => e.class(),
        }
    }
}

impl CheckpointError {
    /// Whether this failure of a candidate's load is damage of the checkpoint
    /// (a restore falls back to an older one), rather than the store or the
    /// local state failing (a restore stops: falling back would hide an outage
    /// behind an older checkpoint, or end in "none usable").
    pub(crate) fn is_damage(&self) -> bool {
        match self {
            CheckpointError::Corrupt { .. } => true,
            CheckpointError::Store(e) => e.is_damage(),
            CheckpointError::State(e) => matches!(e, crate::state::StateError::Corrupt { .. }),
            _ => false,
        }
    }

    /// Whether a stop request ended it (a restore waiting on the object store):
    /// a stop, not a failure.
    pub(crate) fn is_interrupted(&self) -> bool {
        matches!(
            self,
            CheckpointError::Store(objects::ObjectError::Interrupted { .. })
        )
    }
}

/// A worker-local, increasing checkpoint number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CheckpointId(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The checkpoint format it was read in (`format::VERSION`).
    pub format: u16,
    pub id: CheckpointId,
    pub worker: String,
    pub created_at_ms: i64,
    pub group: String,
    pub topic: String,
    /// sha256 (hex) of the semantic configuration (`evolution::Semantics`).
    pub fingerprint: String,
    /// The semantic configuration itself (format 5 on; `None` for format 4).
    pub semantics: Option<evolution::Semantics>,
    pub partitions: Vec<PartitionEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionEntry {
    pub partition: Partition,
    pub next_offset: NextOffset,
    pub watermark: Option<EventTime>,
    /// The greatest `completed_ts` the partition had priced (format 5 on; `None`
    /// before, or when it priced nothing): what a price change must come after.
    pub high_water: Option<i64>,
    pub counters: Counters,
    /// Where the offsets before `next_offset` went (see `ledger`).
    pub offsets: OffsetLedger,
    /// The partition's state: a base, then the deltas written since, oldest first
    /// (never empty; see "Incremental checkpoints" above).
    pub segments: Vec<Segment>,
}

impl PartitionEntry {
    /// The bytes of every segment it references (a full snapshot's worth).
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(Segment::bytes).sum()
    }

    /// The bytes checkpoint `name` wrote for it (its own segment, if any).
    pub(crate) fn written_bytes(&self, name: &str) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.checkpoint == name)
            .map(Segment::bytes)
            .sum()
    }
}

/// A run of parts one checkpoint wrote for one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// The checkpoint whose objects hold the parts (`chk-<id>-<worker>`): this
    /// one, or an earlier one of the same worker.
    pub checkpoint: String,
    pub kind: SegmentKind,
    /// Its parts, in key order (`part`); at least one.
    pub parts: Vec<PartRef>,
}

impl Segment {
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }
}

/// What a segment's entries mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentKind {
    /// The partition's whole state.
    Base,
    /// Changes to the state before it: first every window ending at or below
    /// `windows_through` and every dedup chunk expiring at or below
    /// `dedup_through` are deleted, then its entries are written over.
    Delta {
        windows_through: Option<i64>,
        dedup_through: Option<i64>,
    },
}

/// One part as the manifest records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRef {
    pub bytes: u64,
    pub sha256: [u8; 32],
}

impl Manifest {
    pub fn entry(&self, p: Partition) -> Option<&PartitionEntry> {
        self.partitions.iter().find(|e| e.partition == p)
    }

    /// The bytes this checkpoint wrote: its own segments.
    pub(crate) fn written_bytes(&self) -> u64 {
        let name = names::checkpoint_name(self.id, &self.worker);
        self.partitions.iter().map(|e| e.written_bytes(&name)).sum()
    }

    /// The bytes its chains reference: what a restore of every partition reads.
    pub(crate) fn state_bytes(&self) -> u64 {
        self.partitions.iter().map(PartitionEntry::bytes).sum()
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The rules of a running configuration: everything that decides what tally
/// emits (`evolution::Semantics`) and its fingerprint. A checkpoint written under
/// other rules restores only when the change is compatible (`evolution::compare`).
/// `parse_rating` compares a rating entry by entry (`config::rating::from_source`).
pub(crate) fn rules(
    topic: &str,
    e: &EngineConfig,
    idle_timeout_ms: Option<i64>,
    parse_rating: evolution::RatingParser,
) -> evolution::Rules {
    evolution::Rules::of(evolution::Semantics::of(topic, e, idle_timeout_ms))
        .with_rating_parser(parse_rating)
}
