//! Anchors: the checkpoints retention keeps beyond the `retain` newest, so that
//! a window older than those can still be explained from a snapshot taken
//! before it (docs/DESIGN.md §6.2, §7.2; `tally explain` restores the newest
//! checkpoint whose high-water time is before the window).
//!
//! Rule (pure): with periods of `every` ms by the manifests' `created_at_ms`
//! (the writer's clock; a period is `created_at_ms.div_euclid(every)`), a
//! complete checkpoint is an anchor when, for some partition it holds, it is
//! the oldest — by `(created_at_ms, id)` — complete checkpoint holding that
//! partition in its period, and that period is one of the newest `kept`
//! periods in which the partition has a complete checkpoint.
//!
//! Invariants: the choice depends only on the complete manifests listed, so
//! every worker running retention over the same listing keeps the same anchors;
//! a checkpoint completing later with an earlier time can only take an anchor's
//! place in its own period (that period still has one). Anchors change nothing
//! a worker restores: a restore picks the greatest offset, never an older one
//! while a newer one checks out.

use std::collections::{BTreeMap, BTreeSet};

use super::{CheckpointId, Manifest};
use crate::model::Partition;

/// How anchors are kept: one per partition per `every_ms`, for the newest
/// `kept` periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AnchorRule {
    pub every_ms: i64,
    pub kept: usize,
}

/// The names of the anchors among `complete` (name, manifest) under `rule`.
pub(crate) fn anchors<'a>(
    complete: &[(&'a str, &Manifest)],
    rule: AnchorRule,
) -> BTreeSet<&'a str> {
    type Oldest<'a> = ((i64, CheckpointId), &'a str);
    let mut oldest: BTreeMap<(Partition, i64), Oldest<'a>> = BTreeMap::new();
    for (name, m) in complete {
        let period = m.created_at_ms.div_euclid(rule.every_ms.max(1));
        let candidate = ((m.created_at_ms, m.id), *name);
        for e in &m.partitions {
            oldest
                .entry((e.partition, period))
                .and_modify(|o| {
                    if candidate.0 < o.0 {
                        *o = candidate;
                    }
                })
                .or_insert(candidate);
        }
    }
    let mut by_partition: BTreeMap<Partition, Vec<&'a str>> = BTreeMap::new();
    // Keys come in (partition, period) order: each list is oldest period first.
    for ((p, _), (_, name)) in oldest {
        by_partition.entry(p).or_default().push(name);
    }
    by_partition
        .values()
        .flat_map(|names| names.iter().rev().take(rule.kept).copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::PartitionEntry;

    const DAY: i64 = 86_400_000;

    fn manifest(id: u64, created_at_ms: i64, ps: &[i32]) -> Manifest {
        Manifest {
            format: 8,
            id: CheckpointId(id),
            worker: "w".into(),
            created_at_ms,
            group: "g".into(),
            topic: "t".into(),
            fingerprint: "f".into(),
            semantics: None,
            partitions: ps
                .iter()
                .map(|&p| PartitionEntry {
                    partition: Partition(p),
                    next_offset: crate::model::NextOffset(id as i64),
                    watermark: None,
                    high_water: None,
                    counters: Default::default(),
                    offsets: Default::default(),
                    segments: Vec::new(),
                })
                .collect(),
        }
    }

    fn chosen(ms: &[(String, Manifest)], kept: usize) -> Vec<String> {
        let complete: Vec<(&str, &Manifest)> = ms.iter().map(|(n, m)| (n.as_str(), m)).collect();
        let rule = AnchorRule {
            every_ms: DAY,
            kept,
        };
        anchors(&complete, rule)
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// A checkpoint every 6 hours for 10 days: the first of each of the newest
    /// `kept` days.
    #[test]
    fn the_oldest_checkpoint_of_each_of_the_newest_periods() {
        let ms: Vec<(String, Manifest)> = (0..40u64)
            .map(|i| {
                (
                    format!("c{i:02}"),
                    manifest(i + 1, i as i64 * DAY / 4 + 1, &[0, 1]),
                )
            })
            .collect();
        let want: Vec<String> = (2..10).map(|d| format!("c{:02}", d * 4)).collect();
        assert_eq!(chosen(&ms, 8), want);
        assert_eq!(chosen(&ms, 1), ["c36"]);
    }

    /// Per partition: a partition that moved to another worker keeps the
    /// oldest checkpoint holding it in each period, whoever wrote it; ties in
    /// time go to the lower id.
    #[test]
    fn per_partition_and_by_time_then_id() {
        let ms = vec![
            ("a".to_string(), manifest(5, 10, &[0])),
            ("b".to_string(), manifest(3, 10, &[0])),
            ("c".to_string(), manifest(1, 20, &[1])),
            ("d".to_string(), manifest(2, DAY + 5, &[0, 1])),
            ("e".to_string(), manifest(9, DAY + 1, &[1])),
        ];
        assert_eq!(chosen(&ms, 8), ["b", "c", "d", "e"]);
        assert_eq!(chosen(&ms, 1), ["d", "e"]);
    }
}
