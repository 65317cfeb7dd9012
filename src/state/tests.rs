use std::sync::Arc;

use super::*;
use crate::engine::{EngineConfig, PartitionTask, RecordIn, TimeSource};
use crate::model::{NanoPer1k, Partition, PriceEntry, PriceTable};
use crate::time::WindowSpec;

fn cfg() -> Arc<EngineConfig> {
    let mut prices = PriceTable::default();
    prices.insert(
        "m",
        PriceEntry {
            effective_from_ms: i64::MIN,
            input: NanoPer1k(7),
            output: NanoPer1k(11),
        },
    );
    Arc::new(EngineConfig {
        window: WindowSpec::new(60_000, 0),
        allowed_lateness_ms: 30_000,
        max_out_of_orderness_ms: 5_000,
        max_future_ms: None,
        time_source: TimeSource::CompletedTs,
        max_lead_ms: None,
        dedup_extra_ms: 3_600_000,
        max_record_bytes: 1 << 20,
        generation: 1,
        prices,
        rating: None,
        rating_source: String::new(),
        input: Default::default(),
    })
}

fn feed(task: &mut PartitionTask, from: usize, to: usize) {
    let mut out = Vec::new();
    for i in from..to {
        let ts = 1_767_261_600_000 + (i as i64) * 7_919 % 400_000 - 2_000 * (i as i64 % 3);
        let rec = format!(
            r#"{{"request_id":"r{i}","tenant_id":"t{}","model":"m","prompt_tokens":{i},"completion_tokens":3,"completed_ts":{ts}}}"#,
            i % 5
        );
        task.process(
            RecordIn {
                payload: rec.as_bytes(),
                kafka_ts: None,
                now_ms: 0,
            },
            &mut out,
        )
        .unwrap();
    }
}

#[test]
fn incremental_commits_reload_to_the_same_task() {
    let dir = std::env::temp_dir().join(format!("tally-state-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = StateStore::open(&dir).unwrap();
    assert!(store.load(Partition(2)).unwrap().is_none());
    let mut task = PartitionTask::new(Partition(2), cfg());
    for (i, chunk) in [(0, 40), (40, 41), (41, 200)].into_iter().enumerate() {
        feed(&mut task, chunk.0, chunk.1);
        let delta = task.drain_changes();
        store
            .commit(vec![PartitionCommit {
                partition: Partition(2),
                next_offset: NextOffset(i as i64 * 10),
                delta,
            }])
            .unwrap();
    }
    let (snap, next) = store.load(Partition(2)).unwrap().unwrap();
    assert_eq!(next, NextOffset(20));
    assert_eq!(snap, task.snapshot());
    assert!(!snap.dedup.is_empty() && !snap.open.is_empty());
    // Negative partitions and window ends keep their order in the key space.
    assert!(key(b'W', -1, &[&end_bytes(-5)]) < key(b'W', 0, &[&end_bytes(-6)]));
    assert!(end_bytes(-1) < end_bytes(0) && end_from(&end_bytes(-77)) == -77);
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn keys_are_described_for_people_not_as_bytes() {
    let mut k = vec![b'D'];
    k.extend_from_slice(&((3u32) ^ 0x8000_0000).to_be_bytes());
    k.extend_from_slice(&((1_000i64 as u64) ^ 0x8000_0000_0000_0000).to_be_bytes());
    k.extend_from_slice(&7u64.to_be_bytes());
    assert_eq!(
        super::describe_key(&k),
        "dedup chunk of partition 3 expiring at 1000"
    );
    let z = super::describe_key(b"Z\x80\0\0\0\xff");
    assert!(
        z.starts_with("unrecognised key of 6 bytes (5a 80 00 00 00 ff;"),
        "{z}"
    );
}

/// Issue 33: an unknown key in a partition's state (a crafted or damaged
/// checkpoint part) is refused at the import, named as a person reads it — its
/// bytes in hex, never raw — and so is a key of another partition.
#[test]
fn an_unknown_key_is_refused_at_the_import_and_named() {
    let dir = std::env::temp_dir().join(format!("tally-state-unknown-{}", std::process::id()));
    let store = StateStore::open_fresh(&dir).unwrap();
    let mut unknown = b"Z".to_vec();
    unknown.extend_from_slice(&0x8000_0000u32.to_be_bytes());
    unknown.extend_from_slice(b"\xff\xfe junk");
    let e = store
        .import_partition(Partition(0), [(&unknown[..], &b"v"[..])])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown key in the state of partition 0") && e.contains("5a 80 00 00 00 ff fe"),
        "{e}"
    );
    assert!(!e.contains('\u{fffd}'), "raw bytes printed: {e}");
    let mut other = b"M".to_vec();
    other.extend_from_slice(&(1u32 ^ 0x8000_0000).to_be_bytes());
    let e = store
        .import_partition(Partition(0), [(&other[..], &b"v"[..])])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("partition meta of partition 1") && e.contains("another partition"),
        "{e}"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rocksdb_version_is_the_bundled_one() {
    let lock = include_str!("../../Cargo.lock");
    let at = lock
        .find("name = \"librocksdb-sys\"")
        .expect("librocksdb-sys in Cargo.lock");
    let version = lock[at..].lines().nth(1).unwrap();
    assert!(
        version.ends_with(&format!("+{ROCKSDB_VERSION}\"")),
        "{version} vs {ROCKSDB_VERSION}"
    );
}

/// The cold dedup index: runs ingested as SST files, later runs win, a drop
/// forgets it, and compaction drops the ids dead at the partition's last dedup
/// range delete — never another partition's.
#[test]
fn cold_ids_are_ingested_replaced_dropped_and_compacted_away_when_dead() {
    use crate::engine::cold::DedupStore;
    use crate::engine::dedup::Fingerprint;
    use crate::engine::{DedupDelta, StateDelta};
    let dir = std::env::temp_dir().join(format!("tally-state-cold-{}", std::process::id()));
    let store = StateStore::open_fresh(&dir).unwrap();
    let fp = |i: u32| Fingerprint::of(&format!("id-{i}"));
    let mut run: Vec<(Fingerprint, i64)> = (0..1000).map(|i| (fp(i), 100 + i as i64)).collect();
    run.sort_unstable();
    for p in [0, 1] {
        store.put_cold(Partition(p), &run).unwrap();
    }
    assert_eq!(store.cold_expiry(Partition(0), fp(7)).unwrap(), Some(107));
    assert_eq!(store.cold_expiry(Partition(0), fp(5000)).unwrap(), None);
    // A later run wins (an id moved out again after a re-insert).
    store.put_cold(Partition(0), &[(fp(7), 9_000)]).unwrap();
    assert_eq!(store.cold_expiry(Partition(0), fp(7)).unwrap(), Some(9_000));
    // Not exported: the chunks are the durable form.
    let mut exported = 0;
    store
        .export_partition(Partition(0), |k, _| {
            assert_ne!(k[0], b'F');
            exported += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!(exported, 0);
    // Partition 0's dedup range delete through 600: its ids expiring at or
    // below are dead, and compaction drops them.
    let commit = |p: i32, dead_through: i64| PartitionCommit {
        partition: Partition(p),
        next_offset: NextOffset(1),
        delta: StateDelta {
            changed: vec![],
            purged_through: None,
            dedup: DedupDelta {
                chunks: vec![],
                dead_through,
            },
            watermark: crate::time::Watermark::new(0, None),
            high_water: None,
            counters: Default::default(),
        },
    };
    store
        .commit(vec![commit(0, 600), commit(1, i64::MIN)])
        .unwrap();
    store.db.compact_range::<&[u8], &[u8]>(None, None);
    assert_eq!(
        store.cold_expiry(Partition(0), fp(3)).unwrap(),
        None,
        "dead, compacted away"
    );
    assert_eq!(
        store.cold_expiry(Partition(0), fp(900)).unwrap(),
        Some(1000)
    );
    assert_eq!(store.cold_expiry(Partition(0), fp(7)).unwrap(), Some(9_000));
    assert_eq!(
        store.cold_expiry(Partition(1), fp(3)).unwrap(),
        Some(103),
        "another partition"
    );
    store.drop_partition(Partition(1)).unwrap();
    assert_eq!(store.cold_expiry(Partition(1), fp(900)).unwrap(), None);
    assert!(
        std::fs::read_dir(&dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("cold-")),
        "ingested files are moved into the store"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 33: a working copy that cannot be created is a sentence naming
/// `state.dir`, the path and the OS's reason — not RocksDB's `Os { code: … }`.
#[test]
fn a_working_copy_that_cannot_be_created_is_named_in_a_sentence() {
    let dir = std::env::temp_dir().join(format!("tally-state-blocked-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for path in [file.join("rocksdb"), file.clone()] {
        let e = StateStore::open_fresh(&path)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.starts_with("state.dir: cannot create the working copy")
                && e.contains(&path.display().to_string())
                && (e.contains("Not a directory") || e.contains("File exists")),
            "{e}"
        );
        assert!(!e.contains("Os {"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
