use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::*;
use crate::checkpoint::ledger;
use crate::checkpoint::names::MANIFEST;
use crate::engine::Counters;
use crate::time::EventTime;

pub(super) struct Fixture {
    pub(super) dir: std::path::PathBuf,
    pub(super) store: Arc<CheckpointStore>,
    pub(super) state: Arc<StateStore>,
}

impl Fixture {
    pub(super) fn new(tag: &str, retain: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("tally-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let objects = LocalObjects::create(&dir.join("g")).unwrap();
        Self {
            store: Arc::new(CheckpointStore::with_objects(
                Box::new(objects),
                "w",
                retain,
            )),
            state: Arc::new(StateStore::open_fresh(&dir.join("rocksdb")).unwrap()),
            dir,
        }
    }

    /// Checkpoint `id` of partitions `ps`, each at `next` with `windows` windows.
    pub(super) fn checkpoint(&self, id: u64, ps: &[i32], next: i64, windows: usize) -> Manifest {
        crate::devtools::support::write_checkpoint(&self.store, &self.state, id, ps, next, windows)
            .unwrap()
    }

    fn keys(&self) -> BTreeSet<String> {
        self.store
            .objects()
            .list()
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Issue 19, defect 11: ids past 12 digits keep their order; the parser reads
/// what the writer writes, old names too.
#[test]
fn checkpoint_ids_do_not_roll_over() {
    let f = Fixture::new("ids", 1);
    for id in [999_999_999_999u64, 1_000_000_000_000, u64::MAX - 1] {
        let name = checkpoint_name(CheckpointId(id), "w");
        assert_eq!(parse_id(&name), Some(id), "{name}");
        f.store
            .objects()
            .put_new(&format!("{name}/x"), b"")
            .unwrap();
    }
    f.store
        .objects()
        .put_new("chk-000000000007-old/x", b"")
        .unwrap();
    assert_eq!(parse_id("chk--x"), None);
    assert_eq!(parse_id("chk-12a-x"), None);
    assert_eq!(f.store.next_id().unwrap(), CheckpointId(u64::MAX));
    let ids: Vec<u64> = f
        .store
        .list()
        .unwrap()
        .iter()
        .filter_map(|l| parse_id(&l.name))
        .collect();
    assert_eq!(ids, [7, 999_999_999_999, 1_000_000_000_000, u64::MAX - 1]);
}

#[test]
fn a_checkpoint_restores_what_was_written_across_parts() {
    let f = Fixture::new("parts", 3);
    // Enough windows for several parts (about 60 bytes each).
    let m = f.checkpoint(1, &[0, 1], 50, 300_000);
    assert!(
        m.partitions[0].segments[0].parts.len() >= 2,
        "{:?}",
        m.partitions[0].segments[0].parts
    );
    assert!(f.store.verify().unwrap().is_empty());
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    let r = f
        .store
        .restore_partition(
            Partition(1),
            &crate::checkpoint::evolution::Rules::opaque("f"),
            &fresh,
        )
        .unwrap()
        .unwrap();
    assert_eq!((r.next_offset, r.skipped), (NextOffset(50), 0));
    assert_eq!(
        fresh.load(Partition(1)).unwrap().unwrap().0.open.len(),
        300_000
    );
    assert!(f
        .store
        .restore_partition(
            Partition(2),
            &crate::checkpoint::evolution::Rules::opaque("f"),
            &fresh
        )
        .unwrap()
        .is_none());
    let e = f
        .store
        .restore_partition(
            Partition(0),
            &crate::checkpoint::evolution::Rules::opaque("other"),
            &fresh,
        )
        .unwrap_err();
    assert!(e.to_string().contains("another configuration"), "{e}");
}

/// A zombie (or any second writer) cannot replace an object of a checkpoint.
#[test]
fn no_object_is_ever_replaced() {
    let f = Fixture::new("zombie", 3);
    let m = f.checkpoint(1, &[0], 10, 2);
    let name = checkpoint_name(CheckpointId(1), "w");
    let e = f.store.write_manifest(&name, &m).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    let part = part_key(&name, Partition(0), 0);
    assert!(f.store.objects().put_new(&part, b"zombie").is_err());
    assert!(f.store.verify().unwrap().is_empty());
}

/// Damage of every kind — flipped bytes, a truncated part, a missing part, a
/// part that is a device — is reported by `verify` and restored around.
#[test]
fn damaged_parts_are_reported_and_fallen_back_from() {
    let f = Fixture::new("damage", 10);
    f.checkpoint(1, &[0], 10, 2);
    let root = f.dir.join("g");
    let damage: [&dyn Fn(&std::path::Path); 4] = [
        &|p| {
            let mut b = std::fs::read(p).unwrap();
            let mid = b.len() / 2;
            b[mid] ^= 0xFF;
            std::fs::write(p, b).unwrap();
        },
        &|p| {
            let b = std::fs::read(p).unwrap();
            std::fs::write(p, &b[..b.len() - 1]).unwrap();
        },
        &|p| std::fs::remove_file(p).unwrap(),
        &|p| {
            std::fs::remove_file(p).unwrap();
            std::os::unix::fs::symlink("/dev/zero", p).unwrap();
        },
    ];
    for (i, d) in damage.iter().enumerate() {
        let id = 2 + i as u64;
        f.checkpoint(id, &[0], 10 + id as i64, 2);
        let name = checkpoint_name(CheckpointId(id), "w");
        d(&root.join(part_key(&name, Partition(0), 0)));
        let problems = f.store.verify().unwrap();
        assert_eq!(problems.len(), i + 1, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains(&name)), "{problems:?}");
        let fresh = StateStore::open_fresh(&f.dir.join(format!("fresh{i}"))).unwrap();
        let r = f
            .store
            .restore_partition(
                Partition(0),
                &crate::checkpoint::evolution::Rules::opaque("f"),
                &fresh,
            )
            .unwrap()
            .unwrap();
        assert_eq!((r.next_offset, r.skipped), (NextOffset(10), i + 1));
    }
}

/// Retention after 100 checkpoints leaves exactly the retained checkpoints'
/// objects: nothing unreferenced, no manifest without its parts.
#[test]
fn retention_leaves_no_unreferenced_object_after_100_checkpoints() {
    let f = Fixture::new("retain", 3);
    for id in 1..=100u64 {
        // Partitions move: 0 and 1 alternate between checkpoints; 2 is always there.
        let ps: &[i32] = if id % 2 == 0 { &[0, 2] } else { &[1, 2] };
        f.checkpoint(id, ps, id as i64, 3);
        f.store.retain(CheckpointId(id)).unwrap();
    }
    let listed = f.store.list().unwrap();
    let referenced: BTreeSet<String> = listed
        .iter()
        .flat_map(|l| referenced(&l.name, l.manifest.as_ref().unwrap().as_ref().unwrap()))
        .collect();
    assert_eq!(f.keys(), referenced);
    assert!(
        f.store.verify().unwrap().is_empty(),
        "every referenced part is there"
    );
    // Each partition is still held by `retain` checkpoints.
    for p in [0, 1, 2] {
        let holding = listed
            .iter()
            .filter(|l| {
                l.manifest
                    .as_ref()
                    .unwrap()
                    .as_ref()
                    .unwrap()
                    .entry(Partition(p))
                    .is_some()
            })
            .count();
        assert!(holding >= 3, "partition {p}: {holding}");
    }
    assert!(listed.len() <= 6, "{}", listed.len());
}

/// 40 checkpoints into `store`, partitions 0 and 1 alternating beside 2, each
/// followed by retention; the ids left.
fn alternating(store: &Arc<CheckpointStore>, state: &Arc<StateStore>) -> Vec<u64> {
    for id in 1..=40u64 {
        let ps: &[i32] = if id % 2 == 0 { &[0, 2] } else { &[1, 2] };
        crate::devtools::support::write_checkpoint(store, state, id, ps, id as i64, 3).unwrap();
        store.retain(CheckpointId(id)).unwrap();
    }
    let listed = store.list().unwrap();
    listed.iter().filter_map(|l| parse_id(&l.name)).collect()
}

/// With anchors, retention also keeps the oldest checkpoint of each period
/// (here every checkpoint is of one period: the first), whole: it restores.
#[test]
fn retention_keeps_an_anchor_whole() {
    let f = Fixture::new("anchor", 3);
    let objects = LocalObjects::existing(&f.dir.join("g")).unwrap();
    let rule = super::AnchorRule {
        every_ms: 86_400_000,
        kept: 8,
    };
    let store =
        Arc::new(CheckpointStore::with_objects(Box::new(objects), "w", 3).with_anchors(Some(rule)));
    let ids = alternating(&store, &f.state);
    // Partition 1's anchor is checkpoint 1, partition 0's is 2; 2 holds 2 too.
    assert!(ids.starts_with(&[1, 2]) && ids.len() <= 8, "{ids:?}");
    assert!(store.verify().unwrap().is_empty());
    let rules = Rules::opaque("f");
    let at_one = |_: u16, e: &PartitionEntry| e.next_offset.0 == 1;
    let r = store
        .restore_where(
            (Partition(1), 100),
            &store.list().unwrap(),
            at_one,
            &rules,
            &f.state,
        )
        .unwrap()
        .expect("the anchor restores");
    assert_eq!(r.next_offset, NextOffset(1));
    // Without anchors the same run keeps neither.
    let g = Fixture::new("no-anchor", 3);
    let ids = alternating(&g.store, &g.state);
    assert!(!ids.contains(&1) && !ids.contains(&2), "{ids:?}");
}

/// An incomplete checkpoint of this writer goes once a newer one completes; one
/// of another writer is kept while it may still be uploading.
#[test]
fn incomplete_checkpoints_go_only_when_no_one_can_be_writing_them() {
    let f = Fixture::new("incomplete", 1);
    f.store
        .objects()
        .put_new("chk-00000000000000000001-w/p-000000-0000", b"x")
        .unwrap();
    f.store
        .objects()
        .put_new("chk-00000000000000000001-other/p-000000-0000", b"x")
        .unwrap();
    f.checkpoint(2, &[0], 5, 1);
    f.store.retain(CheckpointId(2)).unwrap();
    let keys = f.keys();
    assert!(
        !keys
            .iter()
            .any(|k| k.starts_with("chk-00000000000000000001-w/")),
        "{keys:?}"
    );
    assert!(
        keys.iter()
            .any(|k| k.starts_with("chk-00000000000000000001-other/")),
        "{keys:?}"
    );
}

/// Issue 19: every field of a manifest entry at its extremes is read, or is
/// damage — `verify` reports, a restore falls back or refuses — never a panic.
#[test]
fn every_field_at_its_extremes_is_read_or_damage() {
    let f = Fixture::new("extremes", 1_000);
    let good = f.checkpoint(1, &[0], 1, 1);
    let max = Counters {
        consumed: u64::MAX,
        folded: u64::MAX,
        too_late: u64::MAX,
        dead_letter: u64::MAX,
        duplicate: u64::MAX,
        panes: u64::MAX,
        idle_advances: u64::MAX,
    };
    type Edit = Box<dyn Fn(&mut Manifest)>;
    let edits: Vec<Edit> = vec![
        Box::new(|m| m.id = CheckpointId(u64::MAX)),
        Box::new(|m| m.created_at_ms = i64::MIN),
        Box::new(|m| m.partitions[0].next_offset = NextOffset(i64::MAX)),
        Box::new(|m| m.partitions[0].next_offset = NextOffset(0)),
        Box::new(|m| m.partitions[0].watermark = Some(EventTime(i64::MIN))),
        Box::new(|m| m.partitions[0].watermark = Some(EventTime(i64::MAX))),
        Box::new(move |m| m.partitions[0].counters = max),
        Box::new(|m| m.partitions[0].segments[0].parts[0].bytes = 0),
        Box::new(|m| m.partitions[0].segments[0].parts[0].bytes = u64::MAX),
        Box::new(|m| m.partitions[0].segments[0].parts[0].sha256 = [0; 32]),
        Box::new(|m| m.partitions[0].offsets.gap_offsets = u64::MAX),
        Box::new(|m| m.partitions[0].offsets.empty_offsets = u64::MAX),
        Box::new(|m| {
            m.partitions[0].offsets.gaps = vec![
                ledger::Gap {
                    from: i64::MIN,
                    to: i64::MAX,
                    at_ms: 0
                };
                1000
            ]
        }),
        Box::new(|m| m.partitions[0].partition = Partition(i32::MAX)),
        Box::new(|m| m.partitions[0].partition = Partition(-1)),
        Box::new(|m| m.partitions.clear()),
        Box::new(|m| m.fingerprint = "x".repeat(100_000)),
    ];
    let part = f
        .store
        .objects()
        .get(
            &part_key(&checkpoint_name(CheckpointId(1), "w"), Partition(0), 0),
            1 << 20,
        )
        .unwrap();
    for (i, e) in edits.iter().enumerate() {
        let name = checkpoint_name(CheckpointId(10 + i as u64), "w");
        let mut m = good.clone();
        e(&mut m);
        for entry in &m.partitions {
            let _ = f
                .store
                .objects()
                .put_new(&part_key(&name, entry.partition, 0), &part);
        }
        f.store.write_manifest(&name, &m).unwrap();
    }
    assert!(!f.store.verify().unwrap().is_empty());
    let _ = f.store.list().unwrap();
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    match f.store.restore_partition(
        Partition(0),
        &crate::checkpoint::evolution::Rules::opaque("f"),
        &fresh,
    ) {
        Ok(_) => {}
        Err(e) => assert!(e.to_string().contains("partition 0"), "{e}"),
    }
    let _ = f.store.restore_partition(
        Partition(i32::MAX),
        &crate::checkpoint::evolution::Rules::opaque("f"),
        &fresh,
    );
}

/// A store written by an older tally (format 2: bincode manifest, `TALLYPS2`
/// partition files) is refused by name, with the way out, not restored around.
#[test]
fn a_format_2_store_is_refused_by_name() {
    let f = Fixture::new("legacy", 3);
    let dir = f.dir.join("g").join("chk-000000000001-old");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("p-000000.state"),
        b"TALLYPS2\0\0\0\0\xFF\xFF\xFF\xFF",
    )
    .unwrap();
    let mut manifest = vec![2u8, 1, 1, b'w'];
    let sum = Sha256::digest(&manifest);
    manifest.extend_from_slice(&sum);
    std::fs::write(dir.join(MANIFEST), manifest).unwrap();
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    let e = f
        .store
        .restore_partition(
            Partition(0),
            &crate::checkpoint::evolution::Rules::opaque("f"),
            &fresh,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("checkpoint format 2") && e.contains("--reset-state earliest"),
        "{e}"
    );
    let problems = f.store.verify().unwrap();
    assert!(problems[0].contains("format 2"), "{problems:?}");
}
