//! The names of a checkpoint's objects, in one place: the layout of the module
//! header of `checkpoint` (`<group_id>/chk-<id:020>-<worker>/`, its parts
//! `p-<partition:06>-<part:04>` and its `MANIFEST`). Every reader and writer of
//! the store builds and parses keys here.

use std::path::Path;

use super::CheckpointId;
use crate::model::Partition;

/// The object that makes a checkpoint complete (written last).
pub(crate) const MANIFEST: &str = "MANIFEST";

/// What every checkpoint's name starts with; objects under other names are not ours.
pub(crate) const PREFIX: &str = "chk-";

/// A checkpoint's name: `chk-<id:020>-<worker>` (20 digits: `u64::MAX`'s width).
pub(crate) fn checkpoint_name(id: CheckpointId, worker: &str) -> String {
    format!("{PREFIX}{:020}-{worker}", id.0)
}

/// The key of part `index` of partition `p` in checkpoint `name`.
pub fn part_key(name: &str, p: Partition, index: usize) -> String {
    format!("{name}/p-{p:06}-{index:04}")
}

pub(crate) fn manifest_key(name: &str) -> String {
    format!("{name}/{MANIFEST}")
}

/// The id in a checkpoint name `chk-<id>-<worker>`: the digits up to the first
/// `-`, however many.
pub(crate) fn parse_id(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.split('-').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `name` is one plain directory name (no separator, not `.` or `..`).
pub(crate) fn is_one_dir_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) && !name.contains('\0')
        && !name.contains('/')
}

/// Whether `name` can be a checkpoint's name, as a manifest's segment names one.
pub(crate) fn is_checkpoint_name(name: &str) -> bool {
    name.starts_with(PREFIX) && is_one_dir_name(name)
}
