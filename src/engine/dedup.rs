//! Per-partition deduplication of `request_id`s over an event-time horizon.
//!
//! Invariants: an id stays known until the partition watermark reaches its expiry
//! (`window_end - 1 + allowed_lateness + extra horizon`), so a copy arriving after
//! its window was purged is still recognised (DESIGN §5). Expiry is driven by the
//! watermark only, never the wall clock, so replays decide identically.
//! `drain_changes` hands the inserts and expiries since the last call to the state
//! store, in order.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
pub struct Dedup {
    seen: HashMap<Box<str>, i64>,
    by_expiry: BTreeMap<i64, Vec<Box<str>>>,
    changes: Vec<DedupChange>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupChange {
    Insert { id: Box<str>, expires_at: i64 },
    Remove { id: Box<str> },
}

impl Dedup {
    /// Records `id`; returns `true` if it was already known (a duplicate).
    pub fn check_and_insert(&mut self, id: &str, expires_at: i64) -> bool {
        if self.seen.contains_key(id) {
            return true;
        }
        let id: Box<str> = id.into();
        self.seen.insert(id.clone(), expires_at);
        self.by_expiry
            .entry(expires_at)
            .or_default()
            .push(id.clone());
        self.changes.push(DedupChange::Insert { id, expires_at });
        false
    }

    /// Forgets every id whose expiry is `<= watermark`.
    pub fn expire(&mut self, watermark: i64) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if *entry.key() > watermark {
                break;
            }
            for id in entry.remove() {
                self.seen.remove(&id);
                self.changes.push(DedupChange::Remove { id });
            }
        }
    }

    /// Every remembered id with its expiry, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (Box<str>, i64)> + '_ {
        self.seen.iter().map(|(id, e)| (id.clone(), *e))
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    pub fn drain_changes(&mut self) -> Vec<DedupChange> {
        std::mem::take(&mut self.changes)
    }

    /// Rebuilds the set from persisted entries (no changes are recorded).
    pub fn restore(entries: impl IntoIterator<Item = (Box<str>, i64)>) -> Self {
        let mut d = Dedup::default();
        for (id, expires_at) in entries {
            d.by_expiry.entry(expires_at).or_default().push(id.clone());
            d.seen.insert(id, expires_at);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_the_watermark_passes_expiry() {
        let mut d = Dedup::default();
        assert!(!d.check_and_insert("a", 100));
        assert!(d.check_and_insert("a", 100));
        d.expire(99);
        assert!(d.check_and_insert("a", 100));
        d.expire(100);
        assert!(d.is_empty());
        assert!(!d.check_and_insert("a", 200));
        let changes = d.drain_changes();
        assert_eq!(changes.len(), 3);
        assert_eq!(changes[1], DedupChange::Remove { id: "a".into() });
        assert!(d.drain_changes().is_empty());
    }

    #[test]
    fn restore_rebuilds_expiry_order() {
        let mut d = Dedup::restore([("x".into(), 5), ("y".into(), 3)]);
        assert!(d.check_and_insert("x", 9));
        d.expire(4);
        assert!(!d.check_and_insert("y", 9));
        assert_eq!(d.len(), 2);
    }
}
