//! What the working copy wrote since each partition's changes were last taken:
//! the keys put, and the two range-delete bounds — what an incremental checkpoint
//! (a delta segment, `checkpoint::SegmentKind::Delta`) needs to read back.
//!
//! Invariants:
//! - For a partition whose changes are `Known`, the store now holds exactly: what
//!   it held when they were last taken, minus every window ending at or below
//!   `windows_through` and every dedup chunk expiring at or below `dedup_through`,
//!   with every key in `keys` that still exists written over. (Commits put only
//!   keys above the range deletes made before them: a purged window and a dead
//!   chunk are never written again.)
//! - Anything that rewrites a partition other than a commit (a restore, a drop)
//!   makes it `Unknown`, and so does a total of keys held past `limit` bytes (all
//!   partitions at once): memory stays bounded, and the next checkpoint of an
//!   `Unknown` partition is a base.
//! - A partition never seen is `Unknown`; one taken starts again from `Known`
//!   and empty (the checkpoint that took it copies or records everything before).

use std::collections::HashMap;

/// A partition's changes since they were last taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changes {
    /// Not known: the next checkpoint must copy the whole partition.
    Unknown,
    Known(KnownChanges),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KnownChanges {
    /// Keys put, sorted, each once.
    pub keys: Vec<Vec<u8>>,
    pub windows_through: Option<i64>,
    pub dedup_through: Option<i64>,
}

#[derive(Debug, Default)]
struct Track {
    unknown: bool,
    keys: Vec<Vec<u8>>,
    windows_through: Option<i64>,
    dedup_through: Option<i64>,
}

/// Per-partition change tracking, bounded by `limit` bytes of keys.
#[derive(Debug)]
pub(crate) struct Tracker {
    parts: HashMap<i32, Track>,
    bytes: usize,
    limit: usize,
}

/// Memory a tracked key costs besides its bytes (the `Vec`'s header).
const PER_KEY: usize = 24;

fn max(a: Option<i64>, b: i64) -> Option<i64> {
    Some(a.map_or(b, |a| a.max(b)))
}

impl Tracker {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            parts: HashMap::new(),
            bytes: 0,
            limit,
        }
    }

    fn track(&mut self, p: i32) -> &mut Track {
        self.parts.entry(p).or_default()
    }

    /// A commit put `key` in partition `p`.
    pub(crate) fn put(&mut self, p: i32, key: &[u8]) {
        let t = self.parts.entry(p).or_default();
        if t.unknown {
            return;
        }
        t.keys.push(key.to_vec());
        self.bytes += key.len() + PER_KEY;
        if self.bytes >= self.limit {
            self.forget_all();
        }
    }

    /// A commit deleted every window of `p` ending at or below `through`.
    pub(crate) fn purge_windows(&mut self, p: i32, through: i64) {
        let t = self.track(p);
        t.windows_through = max(t.windows_through, through);
    }

    /// A commit deleted every dedup chunk of `p` expiring at or below `through`.
    pub(crate) fn purge_dedup(&mut self, p: i32, through: i64) {
        let t = self.track(p);
        t.dedup_through = max(t.dedup_through, through);
    }

    /// `p` was rewritten otherwise than by a commit.
    pub(crate) fn forget(&mut self, p: i32) {
        let t = self.parts.entry(p).or_default();
        self.bytes -= t.keys.iter().map(|k| k.len() + PER_KEY).sum::<usize>();
        *t = Track {
            unknown: true,
            ..Track::default()
        };
    }

    fn forget_all(&mut self) {
        for t in self.parts.values_mut() {
            *t = Track {
                unknown: true,
                ..Track::default()
            };
        }
        self.bytes = 0;
    }

    /// `p`'s changes since the last `take` (then it starts again from none).
    pub(crate) fn take(&mut self, p: i32) -> Changes {
        let Some(t) = self.parts.get_mut(&p) else {
            return Changes::Unknown; // never seen
        };
        let t = std::mem::take(t);
        self.bytes -= t.keys.iter().map(|k| k.len() + PER_KEY).sum::<usize>();
        if t.unknown {
            return Changes::Unknown;
        }
        let mut keys = t.keys;
        keys.sort_unstable();
        keys.dedup();
        Changes::Known(KnownChanges {
            keys,
            windows_through: t.windows_through,
            dedup_through: t.dedup_through,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_sorted_once_and_bounds_keep_their_maximum() {
        let mut t = Tracker::new(1 << 20);
        assert_eq!(t.take(0), Changes::Unknown, "never seen");
        t.put(0, b"b");
        t.put(0, b"a");
        t.put(0, b"b");
        t.purge_windows(0, 5);
        t.purge_windows(0, 3);
        t.purge_dedup(0, -1);
        t.put(1, b"z");
        assert_eq!(
            t.take(0),
            Changes::Known(KnownChanges {
                keys: vec![b"a".to_vec(), b"b".to_vec()],
                windows_through: Some(5),
                dedup_through: Some(-1),
            })
        );
        // Taken: the next take holds only what came after.
        t.put(0, b"c");
        assert_eq!(
            t.take(0),
            Changes::Known(KnownChanges {
                keys: vec![b"c".to_vec()],
                ..Default::default()
            })
        );
        t.forget(1);
        assert_eq!(t.take(1), Changes::Unknown);
        assert_eq!(t.bytes, 0);
    }

    #[test]
    fn past_the_limit_every_partition_is_unknown_once() {
        let mut t = Tracker::new(3 * (PER_KEY + 1));
        t.put(0, b"a");
        t.put(1, b"b");
        t.put(2, b"c");
        assert_eq!(t.take(0), Changes::Unknown);
        assert_eq!(t.take(1), Changes::Unknown);
        // Tracking starts again.
        t.put(1, b"d");
        assert_eq!(
            t.take(1),
            Changes::Known(KnownChanges {
                keys: vec![b"d".to_vec()],
                ..Default::default()
            })
        );
    }
}
