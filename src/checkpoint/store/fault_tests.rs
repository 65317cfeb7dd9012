//! The checkpoint store under faults of issue 33: ledgers that cannot balance,
//! a store that cannot be read, FIFOs in place of objects, and the memory a
//! restore holds.

use super::tests::Fixture;
use super::*;
use crate::checkpoint::names::MANIFEST;
use crate::checkpoint::objects::ObjectError;
use crate::checkpoint::PartRef;

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
    store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap()
        .unwrap();
    assert_eq!(
        fresh.load(Partition(0)).unwrap().unwrap().0.open.len(),
        300_000
    );
    assert_eq!(load::PEAK_HELD.with(|p| p.get()), largest);
}

/// Issue 33: a checkpoint resuming at `next_offset = i64::MAX` (its ledger made
/// to fit) is damage when the partition's log ends below it: the restore of an
/// assignment falls back to the older good checkpoint instead of restoring it
/// and refusing with "Refusing to guess"; with none left it refuses naming the
/// way out.
#[test]
fn a_checkpoint_past_the_log_end_falls_back_to_an_older_one() {
    let f = Fixture::new("pastend", 100);
    let good = f.checkpoint(1, &[0], 10, 2);
    let part = first_part(&f, 1);
    let mut max = good.clone();
    max.partitions[0].next_offset = NextOffset(i64::MAX);
    max.partitions[0].offsets = OffsetLedger::without_gaps(0, NextOffset(i64::MAX));
    let name = write_edited(&f, 2, &max, &part);
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    let policy = StartPolicy::default();
    let restored = f
        .store
        .restore_many(&[(Partition(0), Some(100))], &opaque(), policy, &fresh)
        .unwrap();
    let r = restored.into_iter().next().unwrap().unwrap().unwrap();
    assert_eq!(r.checkpoint, checkpoint_name(CheckpointId(1), "w"));
    assert_eq!((r.next_offset, r.skipped), (NextOffset(10), 1));
    // The log ends below both: a refusal naming each and the way out.
    let restored = f
        .store
        .restore_many(&[(Partition(0), Some(5))], &opaque(), policy, &fresh)
        .unwrap();
    let e = restored
        .into_iter()
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&name)
            && e.contains("past the log end 5")
            && e.contains("--reset-state earliest"),
        "{e}"
    );
}

/// Issue 33: an unknown key inside a part (under a valid checksum) is damage of
/// that part: the restore falls back, and a refusal with nothing older names the
/// part's object and the key, never raw bytes alone.
#[test]
fn an_unknown_key_in_a_part_is_damage_naming_the_part() {
    use crate::checkpoint::part::{parse_part, PartWriter};
    use sha2::{Digest, Sha256};
    let f = Fixture::new("unknown-key", 100);
    let good = f.checkpoint(1, &[0], 10, 2);
    let mut w = PartWriter::new(Partition(0));
    for (k, v) in parse_part(&first_part(&f, 1), Partition(0), 0).unwrap() {
        assert!(w.entry(k, v).is_none());
    }
    assert!(w.entry(b"Z\x80\x00\x00\x00\xff", b"x").is_none());
    let crafted = w.finish();
    let mut bad = good.clone();
    bad.partitions[0].segments[0].parts = vec![PartRef {
        bytes: crafted.len() as u64,
        sha256: Sha256::digest(&crafted).into(),
    }];
    let name = write_edited(&f, 2, &bad, &crafted);
    let fresh = StateStore::open_fresh(&f.dir.join("fresh")).unwrap();
    let r = f
        .store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap()
        .unwrap();
    assert_eq!(r.checkpoint, checkpoint_name(CheckpointId(1), "w"));
    assert_eq!(r.skipped, 1);
    std::fs::remove_dir_all(f.dir.join("g").join(checkpoint_name(CheckpointId(1), "w"))).unwrap();
    let e = f
        .store
        .restore_partition(Partition(0), &opaque(), &fresh)
        .unwrap_err()
        .to_string();
    let part = f
        .store
        .objects()
        .location(&part_key(&name, Partition(0), 0));
    assert!(
        e.contains(&part) && e.contains("an unknown key in the state of partition 0"),
        "{e}"
    );
}
