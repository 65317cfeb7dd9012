//! Per-partition deduplication of `request_id`s over an event-time horizon.
//!
//! Invariants: an id is a duplicate while the partition watermark is below its
//! expiry (`window_end - 1 + allowed_lateness + extra horizon`), so a copy arriving
//! after its window was purged is still recognised (DESIGN §5). Expiry is judged
//! against the watermark only, never the wall clock, so replays decide identically.
//!
//! Expired entries are dropped lazily: a lookup treats an entry whose expiry is at
//! or below the current watermark as absent (and overwrites it), and `sweep`
//! removes them in one pass — when the change log is drained for a checkpoint, and
//! whenever the set has grown by half since the last sweep. So the per-event cost
//! is one hash lookup and one allocation for a new id, and the logical content
//! (`entries`) is the same whenever the sweeps happen. `drain_changes` hands the
//! inserts and removals since the last call to the state store, in order.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

/// One allocation per remembered id, shared by the set and the change log.
type Id = Arc<str>;

/// A fast keyed hash (randomly seeded per process, so request ids chosen by a
/// client cannot be aimed at collisions).
type Hasher = foldhash::fast::RandomState;

#[derive(Debug)]
pub struct Dedup {
    seen: HashMap<Id, i64, Hasher>,
    changes: Vec<DedupChange>,
    /// The watermark of the last lookup or sweep (entries at or below it are dead).
    watermark: i64,
    /// `seen.len()` after the last sweep.
    swept_len: usize,
}

impl Default for Dedup {
    fn default() -> Self {
        Self {
            seen: HashMap::default(),
            changes: Vec::new(),
            watermark: i64::MIN,
            swept_len: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupChange {
    Insert { id: Id, expires_at: i64 },
    Remove { id: Id },
}

impl Dedup {
    /// Records `id`; returns `true` if it is a live duplicate at `watermark`.
    pub fn check_and_insert(&mut self, id: &str, expires_at: i64, watermark: i64) -> bool {
        self.watermark = self.watermark.max(watermark);
        let id: Id = id.into();
        match self.seen.entry(id.clone()) {
            Entry::Occupied(mut o) => {
                if *o.get() > self.watermark {
                    return true;
                }
                // Expired but not swept yet: this is a new request.
                o.insert(expires_at);
            }
            Entry::Vacant(v) => {
                v.insert(expires_at);
            }
        }
        self.changes.push(DedupChange::Insert { id, expires_at });
        if self.seen.len() > 65_536 && self.seen.len() > self.swept_len + self.swept_len / 2 {
            self.sweep();
        }
        false
    }

    /// Notes that the watermark reached `watermark` (entries at or below it expire).
    pub fn expire(&mut self, watermark: i64) {
        self.watermark = self.watermark.max(watermark);
    }

    /// Removes every expired entry, logging the removals.
    fn sweep(&mut self) {
        let (w, changes) = (self.watermark, &mut self.changes);
        self.seen.retain(|id, exp| {
            let live = *exp > w;
            if !live {
                changes.push(DedupChange::Remove { id: id.clone() });
            }
            live
        });
        self.swept_len = self.seen.len();
    }

    /// Every live id with its expiry, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (Box<str>, i64)> + '_ {
        let w = self.watermark;
        self.seen
            .iter()
            .filter(move |(_, e)| **e > w)
            .map(|(id, e)| (Box::from(&**id), *e))
    }

    /// Ids held in memory (live, or expired and not swept yet).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Sweeps, then hands over the changes since the last call.
    pub fn drain_changes(&mut self) -> Vec<DedupChange> {
        self.sweep();
        std::mem::take(&mut self.changes)
    }

    /// Rebuilds the set from persisted entries (no changes are recorded).
    pub fn restore(entries: impl IntoIterator<Item = (Box<str>, i64)>, watermark: i64) -> Self {
        let mut d = Dedup {
            watermark,
            ..Default::default()
        };
        for (id, expires_at) in entries {
            d.seen.insert(id.into(), expires_at);
        }
        d.swept_len = d.seen.len();
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_the_watermark_reaches_expiry() {
        let mut d = Dedup::default();
        assert!(!d.check_and_insert("a", 100, 0));
        assert!(d.check_and_insert("a", 100, 0));
        assert!(d.check_and_insert("a", 100, 99));
        d.expire(100);
        assert_eq!(d.entries().count(), 0);
        assert!(!d.check_and_insert("a", 200, 100), "expired: a new request");
        let changes = d.drain_changes();
        assert_eq!(
            changes,
            vec![
                DedupChange::Insert {
                    id: "a".into(),
                    expires_at: 100
                },
                DedupChange::Insert {
                    id: "a".into(),
                    expires_at: 200
                },
            ]
        );
        d.expire(300);
        assert_eq!(
            d.drain_changes(),
            vec![DedupChange::Remove { id: "a".into() }]
        );
        assert!(d.drain_changes().is_empty());
    }

    #[test]
    fn restore_keeps_expiries() {
        let mut d = Dedup::restore([("x".into(), 5), ("y".into(), 3)], 0);
        assert!(d.check_and_insert("x", 9, 4));
        assert!(!d.check_and_insert("y", 9, 4));
        assert_eq!(d.entries().count(), 2);
    }
}
