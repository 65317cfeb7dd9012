//! Checkpoints: durable, checksummed, per-partition snapshots tied to Kafka offsets
//! (docs/DESIGN.md §7).
//!
//! ## Layout of the checkpoint store (`checkpoint.dir`)
//!
//! ```text
//! <dir>/<group_id>/chk-<id:020>-<worker>/
//!     p-<partition:06>.state   one file per partition (format in `file.rs`)
//!     MANIFEST                 bincode(Manifest) ++ sha256(bincode bytes); written last
//! ```
//!
//! ## Rules
//! - A checkpoint is complete iff its `MANIFEST` exists and its own checksum holds.
//!   The manifest is written to `MANIFEST.tmp`, fsynced, renamed, and the directory
//!   fsynced; partition files are fsynced before that. Only then are the manifest's
//!   offsets committed to the consumer group (with `tally-checkpoint=<id>` as
//!   commit metadata).
//! - A partition is restored from the complete checkpoint holding it with the
//!   greatest `next_offset` (ties: the greater id) whose file checksum matches.
//!   A mismatch falls back to the next candidate, loudly. Because a partition's
//!   snapshot at offset `o` is a pure function of the records before `o`, any
//!   worker's snapshot of `p` at `o` is *the* state of `p` at `o` — so selecting by
//!   offset is safe across workers, and a zombie's older checkpoint never wins.
//! - A checkpoint whose config fingerprint differs from the running config is never
//!   restored silently: the worker refuses and says how to proceed.
//! - Retention: a complete checkpoint is deleted only when every partition in it is
//!   held by at least `retain` newer complete checkpoints. Incomplete directories are
//!   deleted when their writer is this process and a newer one completed, or when
//!   they are older than an hour.

pub mod export;
pub mod file;
pub mod ledger;
pub mod store;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::{Counters, EngineConfig};
use crate::model::Partition;
use crate::state::NextOffset;
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
    /// A refusal to restore, with the way out.
    #[error("{0}")]
    Refused(String),
}

pub fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A worker-local, increasing checkpoint number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CheckpointId(pub u64);

/// Format 2 added `PartitionEntry::offsets` (the offset ledger); format 1 is
/// still read (see `ledger`).
pub const MANIFEST_FORMAT: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub id: CheckpointId,
    pub worker: String,
    pub created_at_ms: i64,
    pub group: String,
    pub topic: String,
    /// sha256 (hex) of the semantic configuration.
    pub fingerprint: String,
    pub partitions: Vec<PartitionEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionEntry {
    pub partition: Partition,
    pub next_offset: NextOffset,
    pub watermark: Option<EventTime>,
    pub counters: Counters,
    pub file: String,
    pub bytes: u64,
    /// sha256 (hex) of the file.
    pub sha256: String,
    /// Where the offsets before `next_offset` went (see `ledger`).
    pub offsets: OffsetLedger,
}

impl Manifest {
    pub fn entry(&self, p: Partition) -> Option<&PartitionEntry> {
        self.partitions.iter().find(|e| e.partition == p)
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of everything that decides what tally emits: a checkpoint written under
/// another fingerprint holds state computed by other rules.
pub fn fingerprint(topic: &str, e: &EngineConfig, idle_timeout_ms: Option<i64>) -> String {
    let mut prices: Vec<String> = e
        .prices
        .entries()
        .map(|(m, p)| format!("{m}@{}:{}/{}", p.effective_from_ms, p.input.0, p.output.0))
        .collect();
    prices.sort();
    let text = format!(
        "tally-fingerprint-v1|topic={topic}|idle={idle_timeout_ms:?}|size={}|offset={}|lateness={}|bound={}|future={:?}|time={:?}|dedup={}|max_bytes={}|generation={}|prices={}",
        e.window.size_ms,
        e.window.offset_ms,
        e.allowed_lateness_ms,
        e.max_out_of_orderness_ms,
        e.max_future_ms,
        e.time_source,
        e.dedup_extra_ms,
        e.max_record_bytes,
        e.generation,
        prices.join(",")
    );
    hex(&Sha256::digest(text.as_bytes()))
}
