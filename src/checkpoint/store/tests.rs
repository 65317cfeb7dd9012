use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::*;
use crate::checkpoint::objects::ObjectError;
use crate::checkpoint::{ledger, PartRef};
use crate::engine::Counters;
use crate::time::EventTime;

struct Fixture {
    dir: std::path::PathBuf,
    store: Arc<CheckpointStore>,
    state: Arc<StateStore>,
}

impl Fixture {
    fn new(tag: &str, retain: usize) -> Self {
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
    fn checkpoint(&self, id: u64, ps: &[i32], next: i64, windows: usize) -> Manifest {
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
    assert_eq!(r.snapshot.open.len(), 300_000);
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

fn opaque() -> crate::checkpoint::evolution::Rules {
    crate::checkpoint::evolution::Rules::opaque("f")
}

/// Writes `m` (edited from a checkpoint of this fixture) as checkpoint `id`,
/// with copies of `part` as each partition's only part.
fn write_edited(f: &Fixture, id: u64, m: &Manifest, part: &[u8]) -> String {
    let name = checkpoint_name(CheckpointId(id), "w");
    let mut m = m.clone();
    m.id = CheckpointId(id);
    for e in &mut m.partitions {
        e.segments.truncate(1);
        e.segments[0].checkpoint = name.clone();
        f.store
            .objects()
            .put_new(&part_key(&name, e.partition, 0), part)
            .unwrap();
    }
    f.store.write_manifest(&name, &m).unwrap();
    name
}

fn first_part(f: &Fixture, id: u64) -> Vec<u8> {
    let key = part_key(&checkpoint_name(CheckpointId(id), "w"), Partition(0), 0);
    f.store.objects().get(&key, 1 << 30).unwrap()
}

/// Issue 33, defect 7: a checkpoint whose offset ledger cannot balance — with
/// any count of records (`u64::MAX` twice), or with the counters its parts
/// restore — is damage: the restore falls back to the older good checkpoint,
/// never carries the ledger forward, and with no older one refuses naming the
/// way out.
#[test]
fn a_ledger_that_cannot_balance_is_fallen_back_from() {
    let f = Fixture::new("ledger", 100);
    let good = f.checkpoint(1, &[0], 10, 2);
    let part = first_part(&f, 1);
    let mut max = good.clone();
    max.partitions[0].next_offset = NextOffset(30);
    max.partitions[0].offsets.empty_offsets = u64::MAX;
    max.partitions[0].offsets.gap_offsets = u64::MAX;
    write_edited(&f, 2, &max, &part);
    // Decodes (the sum fits below next_offset) but does not balance with the
    // counters of its parts (0 records consumed).
    let mut off = good.clone();
    off.partitions[0].next_offset = NextOffset(20);
    off.partitions[0].offsets.empty_offsets = 19;
    let off_name = write_edited(&f, 3, &off, &part);
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    let r = f
        .store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap()
        .unwrap();
    assert_eq!(r.checkpoint, checkpoint_name(CheckpointId(1), "w"));
    assert_eq!((r.next_offset, r.skipped), (NextOffset(10), 1));
    assert_eq!(r.offsets, good.partitions[0].offsets);
    let problems = f.store.verify().unwrap();
    assert!(
        problems.iter().any(|p| p.contains("cannot balance")),
        "{problems:?}"
    );
    // No older good checkpoint: a refusal that names the checkpoint and the way out.
    std::fs::remove_dir_all(f.dir.join("g").join(checkpoint_name(CheckpointId(1), "w"))).unwrap();
    let e = f
        .store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap_err();
    assert!(matches!(e, CheckpointError::Refused(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains(&off_name)
            && e.contains("cannot balance")
            && e.contains("--reset-state earliest"),
        "{e}"
    );
}

/// Objects over a local directory whose reads fail as `fail` says.
struct Failing {
    inner: LocalObjects,
    fail: fn(&str) -> Option<ObjectError>,
}

impl Objects for Failing {
    fn location(&self, key: &str) -> String {
        self.inner.location(key)
    }
    fn put_new(&self, key: &str, bytes: &[u8]) -> Result<(), ObjectError> {
        self.inner.put_new(key, bytes)
    }
    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>, ObjectError> {
        match (self.fail)(key) {
            Some(e) => Err(e),
            None => self.inner.get(key, limit),
        }
    }
    fn list(&self) -> Result<Vec<ObjectInfo>, ObjectError> {
        self.inner.list()
    }
    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.inner.delete(key)
    }
}

/// Issue 33, defect 6: a store that answers reads with errors (S3's 500s after
/// the client's retries, a local EIO) is neither damage nor "no checkpoint":
/// the restore, the listing and `verify` fail with that error — no fallback to
/// an older checkpoint, no refusal advising `--reset-state earliest`.
#[test]
fn a_read_error_is_unavailable_never_damage_nor_absence() {
    let f = Fixture::new("unavailable", 100);
    f.checkpoint(1, &[0], 10, 2);
    f.checkpoint(2, &[0], 20, 2);
    let over = |fail: fn(&str) -> Option<ObjectError>| {
        CheckpointStore::with_objects(
            Box::new(Failing {
                inner: LocalObjects::existing(&f.dir.join("g")).unwrap(),
                fail,
            }),
            "w",
            100,
        )
    };
    fn s3_500(key: &str) -> ObjectError {
        ObjectError::Unavailable {
            location: format!("s3://b/g/{key}"),
            msg: "Server returned non-2xx status code: 500 Internal Server Error".into(),
        }
    }
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    // Every manifest read fails.
    let manifests = over(|k| k.ends_with(MANIFEST).then(|| s3_500(k)));
    let e = manifests
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap_err();
    assert!(
        matches!(e, CheckpointError::Store(ObjectError::Unavailable { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("500"), "{e}");
    assert!(manifests.list().is_err());
    assert!(manifests.verify().is_err());
    // The newest checkpoint's part fails (a local read error this time): no
    // fallback to checkpoint 1.
    let parts = over(|k| {
        (k.starts_with("chk-00000000000000000002-w/p-")).then(|| ObjectError::Io {
            location: format!("/ckpt/g/{k}"),
            msg: "Input/output error (os error 5)".into(),
        })
    });
    let e = parts
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap_err();
    assert!(
        matches!(e, CheckpointError::Store(ObjectError::Io { .. })),
        "{e:?}"
    );
    assert!(!e.is_damage());
    assert!(parts.verify().is_err(), "an unreadable store is not damage");
    // Reads answer again: the newest checkpoint restores.
    let r = f
        .store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap()
        .unwrap();
    assert_eq!((r.next_offset, r.skipped), (NextOffset(20), 0));
}

/// Issue 33, defect 5: a FIFO in place of a `MANIFEST` or of a part is damage,
/// named as not a regular file — found at once by `list`, `verify` and a
/// restore (which falls back), none of them waiting for a writer.
#[test]
fn a_fifo_as_manifest_or_part_is_damage_found_without_blocking() {
    let f = Fixture::new("fifo", 100);
    f.checkpoint(1, &[0], 10, 2);
    f.checkpoint(2, &[0], 20, 2);
    f.checkpoint(3, &[0], 30, 2);
    let root = f.dir.join("g");
    let mkfifo = |path: std::path::PathBuf| {
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success());
    };
    let part = checkpoint_name(CheckpointId(3), "w");
    mkfifo(root.join(part_key(&part, Partition(0), 0)));
    let manifest = checkpoint_name(CheckpointId(2), "w");
    mkfifo(root.join(manifest_key(&manifest)));
    let (tx, rx) = std::sync::mpsc::channel();
    let (store, dir) = (f.store.clone(), f.dir.clone());
    std::thread::spawn(move || {
        let listed = store.list().map(|l| l.len());
        let problems = store.verify();
        let fresh = StateStore::open_fresh(&dir.join("fresh")).unwrap();
        let r = store
            .restore_partition(Partition(0), &opaque(), &fresh)
            .map(|r| r.map(|r| (r.checkpoint, r.skipped)));
        let _ = tx.send((listed, problems, r));
    });
    let (listed, problems, r) = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("blocked on a FIFO");
    assert_eq!(listed.unwrap(), 3);
    let problems = problems.unwrap();
    assert_eq!(problems.len(), 2, "{problems:?}");
    for name in [&part, &manifest] {
        assert!(
            problems
                .iter()
                .any(|p| p.contains(name.as_str()) && p.contains("not a regular file")),
            "{name}: {problems:?}"
        );
    }
    assert_eq!(r.unwrap(), Some((checkpoint_name(CheckpointId(1), "w"), 1)));
}

/// Issue 33, defect 4: a restore holds one wave of parts at a time, not the
/// chain. A manifest listing 12 parts of 256 MiB (each within the per-part
/// limit, 3 GiB in all) is read one part at a time, found damaged at the first
/// and fallen back from; a real multi-part checkpoint restores exactly under a
/// budget of one part.
#[test]
fn a_restore_holds_one_wave_of_parts_not_the_chain() {
    let f = Fixture::new("waves", 100);
    let good = f.checkpoint(1, &[0], 10, 2);
    let mut big = good.clone();
    big.partitions[0].next_offset = NextOffset(20);
    big.partitions[0].offsets = OffsetLedger::without_gaps(0, NextOffset(20));
    let name = write_edited(&f, 2, &big, b"not 256 MiB");
    let mut m = big.clone();
    m.id = CheckpointId(3);
    let seg = &mut m.partitions[0].segments[0];
    seg.checkpoint = name.clone();
    seg.parts = vec![
        PartRef {
            bytes: crate::checkpoint::format::MAX_PART_BYTES,
            sha256: [1; 32],
        };
        12
    ];
    f.store
        .write_manifest(&checkpoint_name(CheckpointId(3), "w"), &m)
        .unwrap();
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    load::PEAK_HELD.with(|p| p.set(0));
    let r = f
        .store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap()
        .unwrap();
    assert_eq!(r.checkpoint, checkpoint_name(CheckpointId(1), "w"));
    assert_eq!(r.skipped, 2);
    let peak = load::PEAK_HELD.with(|p| p.get());
    assert_eq!(
        peak,
        crate::checkpoint::format::MAX_PART_BYTES,
        "one part at a time"
    );

    // Several parts, restored under a budget of one byte: one part per wave.
    let f = Fixture::new("waves2", 3);
    let m = f.checkpoint(1, &[0], 50, 300_000);
    let parts = &m.partitions[0].segments[0].parts;
    assert!(parts.len() >= 2, "{parts:?}");
    let largest = parts.iter().map(|p| p.bytes).max().unwrap();
    let store = CheckpointStore::with_objects(
        Box::new(LocalObjects::existing(&f.dir.join("g")).unwrap()),
        "w",
        3,
    )
    .with_read_budget(1);
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    load::PEAK_HELD.with(|p| p.set(0));
    let r = store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap()
        .unwrap();
    assert_eq!(r.snapshot.open.len(), 300_000);
    assert_eq!(load::PEAK_HELD.with(|p| p.get()), largest);
}
