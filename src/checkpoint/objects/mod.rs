//! Where checkpoints live: a flat namespace of immutable objects behind one narrow
//! trait, with a local-directory implementation (`local`) and an object-storage one
//! (`remote`: S3 and S3-compatible stores, GCS, Azure, through `object_store`).
//!
//! ## Contract (every implementation)
//! - Keys are `/`-separated relative names (`chk-…/MANIFEST`); the store is rooted
//!   at one prefix (`<checkpoint.dir>/<group_id>`) and never reads or writes outside it.
//! - `put_new` creates an object whole or not at all, and **never replaces** one:
//!   a second writer of the same key gets `ObjectError::Exists` (local: a hard link
//!   of a fully written, fsynced temporary file; object storage: a conditional
//!   `PutMode::Create`, `If-None-Match: *`). A zombie worker therefore cannot
//!   overwrite what a live one wrote, and a checkpoint's manifest — written last —
//!   is its commit point on stores that have no rename.
//! - `get` refuses, before allocating, an object larger than the caller's limit,
//!   and (local) anything that is not a regular file — found without blocking: a
//!   FIFO or a device in place of an object is opened non-blocking and refused.
//! - Failures say what they are, because a restore acts on the difference:
//!   `Refused` and `NotFound` are about the object (damage: fall back to an older
//!   checkpoint); `Io` is the local directory failing (disk full, read-only:
//!   exit 1); `Unavailable` is the object store failing after its own retries
//!   (exit 4, a restart may succeed); `Interrupted` is a stop request (SIGTERM)
//!   ending a call that was waiting on the store. None of the last three is ever
//!   taken for damage or for "no checkpoint".
//! - `list` returns every object under the root, temporary leftovers included, so
//!   retention can see and delete them.

pub(crate) mod local;
pub mod remote;

/// One object as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Last modification, ms since the epoch.
    pub modified_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("{location}: already exists (another writer created it first)")]
    Exists { location: String },
    #[error("{location}: not found")]
    NotFound { location: String },
    /// Not something a checkpoint holds: too large, or not a regular file.
    #[error("{location}: {msg}")]
    Refused { location: String, msg: String },
    /// The local directory failed (disk full, read-only, permissions).
    #[error("{location}: {msg}")]
    Io { location: String, msg: String },
    /// The object store could not be reached or answered with an error, after
    /// its own retries (`remote`).
    #[error("{location}: the object store is unavailable: {msg}")]
    Unavailable { location: String, msg: String },
    /// A stop request (SIGTERM, SIGINT) ended a call waiting on the store.
    #[error("{location}: interrupted by a stop request")]
    Interrupted { location: String },
}

impl crate::base::error::Classify for ObjectError {
    fn class(&self) -> crate::base::error::ErrorClass {
        use crate::base::error::ErrorClass;
        match self {
            // The object store could not be reached or failed: a restart may help.
            ObjectError::Unavailable { .. } => ErrorClass::Unavailable,
            // A stop request: the loops treat it as a stop before it reaches a
            // boundary (`CheckpointError::is_interrupted`).
            ObjectError::Interrupted { .. } => ErrorClass::Internal,
            // Local I/O, or damage of an object (a restore falls back from it).
            ObjectError::Io { .. }
            | ObjectError::Exists { .. }
            | ObjectError::NotFound { .. }
            | ObjectError::Refused { .. } => ErrorClass::Internal,
        }
    }
}

impl ObjectError {
    /// Whether the error says the object itself is wrong (damage), rather than
    /// that the store could not be read.
    pub(crate) fn is_damage(&self) -> bool {
        matches!(
            self,
            ObjectError::Refused { .. } | ObjectError::NotFound { .. }
        )
    }
}

/// A checkpoint store's objects (see the module header for the contract).
pub trait Objects: Send + Sync {
    /// Where `key` lives, for people: a path or a URL (never credentials).
    fn location(&self, key: &str) -> String;
    /// Creates `key` holding `bytes`; `Exists` if it is already there.
    fn put_new(&self, key: &str, bytes: &[u8]) -> Result<(), ObjectError>;
    /// Reads `key` whole; `Refused` if it is larger than `limit` bytes.
    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>, ObjectError>;
    /// Every object under the root, in no particular order.
    fn list(&self) -> Result<Vec<ObjectInfo>, ObjectError>;
    /// Deletes `key`; deleting what is not there is not an error.
    fn delete(&self, key: &str) -> Result<(), ObjectError>;
    /// From now on, reads and listings waiting on the store give up with
    /// `Interrupted` once `stop` returns true (`None`: never). A restore sets it
    /// for its duration; writes are never interrupted (the final checkpoint of a
    /// stop is written after the stop request). Local reads never wait.
    fn interrupt_when(&self, _stop: Option<fn() -> bool>) {}
}

/// A key is a relative `/`-separated name of plain segments: nothing that could
/// leave the root (`..`, an absolute path, an empty segment).
pub(crate) fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && !key.contains('\0')
        && !key.contains('\\')
        && key
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cannot_leave_the_root() {
        assert!(valid_key("chk-1-w/MANIFEST"));
        for bad in ["", "/abs", "a//b", "../x", "a/./b", "a/..", "a\0b", "a\\b"] {
            assert!(!valid_key(bad), "{bad:?}");
        }
    }
}
