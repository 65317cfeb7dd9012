//! Incremental checkpoints end to end on a real working copy and a local store:
//! chains restore what the tasks hold, cost what changed, fall back past damage,
//! never cross workers, and retention keeps the store bounded.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::names::{checkpoint_name, part_key};
use super::objects::local::LocalObjects;
use super::store::{referenced, CheckpointStore};
use super::{Manifest, SegmentKind};
use crate::devtools::rig::{Rig, T0};
use crate::devtools::support::one_price_engine;
use crate::model::Partition;
use crate::state::StateStore;

struct Dir(std::path::PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("tally-chain-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Self(d)
    }

    fn store(&self, worker: &str, retain: usize) -> Arc<CheckpointStore> {
        let objects = LocalObjects::create(&self.0.join("store")).unwrap();
        Arc::new(CheckpointStore::with_objects(
            Box::new(objects),
            worker,
            retain,
        ))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const TENANTS: usize = 2_000;

/// Round `round`'s changes: 1% of each partition's tenants, in the minute
/// that starts every fourth round (so windows fire, are retained, purge, and
/// dedup chunks expire along the way).
fn feed(rig: &mut Rig, round: usize) {
    let changed = TENANTS / 100;
    let ts = T0 + (round / 4) as i64 * 60_000 + 1_000;
    for p in 0..rig.tasks.len() {
        let from = (round * changed) % TENANTS;
        rig.feed(p, from..from + changed, ts, round);
    }
}

fn own_kind(m: &Manifest, name: &str, p: i32) -> SegmentKind {
    let e = m.entry(Partition(p)).unwrap();
    let s = e.segments.last().unwrap();
    assert_eq!(
        s.checkpoint, name,
        "the newest segment is this checkpoint's"
    );
    s.kind
}

/// Every partition restored into a scratch store equals its task's snapshot.
fn assert_restores(rig: &Rig, dir: &Dir, n: usize) {
    let scratch = StateStore::open_fresh(&dir.0.join(format!("scratch-{n}"))).unwrap();
    for t in &rig.tasks {
        rig.coord
            .checkpoints()
            .restore_partition(
                t.partition(),
                &crate::checkpoint::evolution::Rules::opaque("f"),
                &scratch,
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            scratch.load(t.partition()).unwrap().unwrap().0,
            t.snapshot(),
            "checkpoint {n}, {}",
            t.partition()
        );
    }
}

#[test]
fn chains_restore_what_the_tasks_hold_and_cost_what_changed() {
    let dir = Dir::new("restore");
    let store = dir.store("w", 2);
    let mut rig = Rig::new(
        &dir.0.join("state"),
        store,
        "w",
        2,
        one_price_engine(60_000),
    )
    .unwrap();
    for p in 0..2 {
        rig.feed(p, 0..TENANTS, T0 + 1_000, 0);
    }
    let (mut deltas, mut bases) = (0, 0);
    for round in 1..=40 {
        feed(&mut rig, round);
        let m = rig.checkpoint().unwrap().manifest;
        let name = checkpoint_name(m.id, "w");
        for p in 0..2 {
            let e = m.entry(Partition(p)).unwrap();
            match own_kind(&m, &name, p) {
                SegmentKind::Base => bases += 1,
                SegmentKind::Delta { .. } => {
                    deltas += 1;
                    // A quiet round (no window fired) writes about 1% of the state.
                    if round % 4 != 0 && round % 4 != 1 {
                        let (written, full) = (e.written_bytes(&name), e.segments[0].bytes());
                        assert!(
                            written * 20 < full,
                            "round {round}: a delta of {written} bytes against a base of {full}"
                        );
                    }
                }
            }
        }
        assert_restores(&rig, &dir, round);
    }
    assert!(deltas >= 40 && bases >= 4, "{deltas} deltas, {bases} bases");
}

#[test]
fn a_damaged_delta_falls_back_to_the_checkpoint_before_it() {
    let dir = Dir::new("damage");
    let store = dir.store("w", 3);
    let mut rig = Rig::new(
        &dir.0.join("state"),
        store.clone(),
        "w",
        1,
        one_price_engine(0),
    )
    .unwrap();
    rig.feed(0, 0..TENANTS, T0 + 1_000, 0);
    let mut manifests = Vec::new();
    for round in 1..=3 {
        feed(&mut rig, round);
        manifests.push(rig.checkpoint().unwrap().manifest);
    }
    let newest = manifests.last().unwrap();
    let name = checkpoint_name(newest.id, "w");
    assert!(matches!(
        own_kind(newest, &name, 0),
        SegmentKind::Delta { .. }
    ));
    // Flip one byte of the newest delta's part, in place.
    let key = part_key(&name, Partition(0), 0);
    let path = dir.0.join("store").join(&key);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let problems = store.verify().unwrap();
    assert!(
        problems.len() == 1 && problems[0].contains(&key) && problems[0].contains("checksum"),
        "{problems:?}"
    );
    let scratch = StateStore::open_fresh(&dir.0.join("scratch")).unwrap();
    let r = store
        .restore_partition(
            Partition(0),
            &crate::checkpoint::evolution::Rules::opaque("f"),
            &scratch,
        )
        .unwrap()
        .unwrap();
    let before = &manifests[1];
    assert_eq!(r.checkpoint, checkpoint_name(before.id, "w"));
    assert_eq!(
        (r.next_offset, r.skipped),
        (before.partitions[0].next_offset, 1)
    );
}

/// A worker restoring a partition starts its own chain: its first checkpoint
/// of it is a base in its own directory, so no worker depends on another's.
#[test]
fn a_restored_partition_starts_a_new_chain() {
    let dir = Dir::new("handover");
    let mut a = Rig::new(
        &dir.0.join("a"),
        dir.store("a", 2),
        "a",
        1,
        one_price_engine(0),
    )
    .unwrap();
    a.feed(0, 0..TENANTS, T0 + 1_000, 0);
    for round in 1..=3 {
        feed(&mut a, round);
        a.checkpoint().unwrap();
    }
    let mut b = Rig::new(
        &dir.0.join("b"),
        dir.store("b", 2),
        "b",
        0,
        one_price_engine(0),
    )
    .unwrap();
    let r = b
        .coord
        .checkpoints()
        .restore_partition(
            Partition(0),
            &crate::checkpoint::evolution::Rules::opaque("f"),
            &b.state,
        )
        .unwrap()
        .unwrap();
    b.tasks.push(crate::engine::PartitionTask::restore(
        Partition(0),
        one_price_engine(0),
        b.state.load(Partition(0)).unwrap().unwrap().0,
    ));
    b.offsets.push(r.next_offset.0);
    feed(&mut b, 4);
    let m = b.checkpoint().unwrap().manifest;
    let e = &m.partitions[0];
    assert_eq!(e.segments.len(), 1);
    assert_eq!(e.segments[0].kind, SegmentKind::Base);
    assert!(e.segments[0].checkpoint.ends_with("-b"));
    feed(&mut b, 5);
    let m = b.checkpoint().unwrap().manifest;
    assert!(m.partitions[0]
        .segments
        .iter()
        .all(|s| s.checkpoint.ends_with("-b")));
    assert_eq!(m.partitions[0].segments.len(), 2);
}

/// 100 checkpoints with `retain = 3`: the store stays bounded, and every
/// object a kept manifest references exists.
#[test]
fn retention_keeps_the_store_bounded_over_100_checkpoints() {
    let dir = Dir::new("retain");
    let store = dir.store("w", 3);
    let mut rig = Rig::new(
        &dir.0.join("state"),
        store.clone(),
        "w",
        2,
        one_price_engine(0),
    )
    .unwrap();
    for p in 0..2 {
        rig.feed(p, 0..TENANTS, T0 + 1_000, 0);
    }
    let mut sizes = Vec::new();
    for round in 1..=100 {
        // Steady: the same minute, 1% of the tenants each round.
        let changed = TENANTS / 100;
        for p in 0..2 {
            let from = (round * changed) % TENANTS;
            rig.feed(p, from..from + changed, T0 + 1_000, round);
        }
        let m = rig.checkpoint().unwrap().manifest;
        let listed = store.objects().list().unwrap();
        let keys: BTreeSet<String> = listed.iter().map(|o| o.key.clone()).collect();
        let total: u64 = listed.iter().map(|o| o.size).sum();
        let full: u64 = m.partitions.iter().map(|e| e.segments[0].bytes()).sum();
        sizes.push((total, full, keys.len()));
        for l in store.list().unwrap() {
            if let Some(Ok(m)) = &l.manifest {
                let missing: Vec<String> =
                    referenced(&l.name, m).difference(&keys).cloned().collect();
                assert!(
                    missing.is_empty(),
                    "round {round}: {} lacks {missing:?}",
                    l.name
                );
            }
        }
    }
    // At most the bases of the kept chains (two: a compaction can sit between
    // the kept manifests), their deltas (each chain's deltas weigh less than
    // its base) and the manifests.
    for (round, (total, full, objects)) in sizes.iter().enumerate() {
        assert!(
            *total <= 5 * full,
            "round {}: {total} bytes stored for a snapshot of {full}",
            round + 1
        );
        assert!(
            *objects <= 2 * 2 * (super::export::MAX_DELTAS + 2) + 8,
            "{objects} objects"
        );
    }
    let complete = store
        .list()
        .unwrap()
        .into_iter()
        .filter(|l| matches!(l.manifest, Some(Ok(_))))
        .count();
    assert_eq!(complete, 3, "retain = 3");
}
