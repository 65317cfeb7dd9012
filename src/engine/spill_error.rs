//! The failure of the store behind the engine's spill ports (`spill::SpillStore`,
//! `cold::DedupStore`), returned by every task call that may read or move
//! through them, with the output it voids.

/// The store behind the spill ports failed (an evicted window or a cold dedup id
/// not read back, ids not moved out): the partition's output since the last
/// checkpoint is void, and the worker stops (a local I/O failure: restart).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("state store: {doing}: {msg}")]
pub struct SpillError {
    pub doing: String,
    pub msg: String,
}
