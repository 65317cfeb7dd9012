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
        dedup_extra_ms: 3_600_000,
        max_record_bytes: 1 << 20,
        generation: 1,
        prices,
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
        );
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
    assert_eq!(super::describe_key(b"Z"), "unrecognised key of 1 bytes");
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
