//! The object-storage checkpoint store against a real S3-compatible server
//! (`scripts/s3.sh`): conditional writes, bounded reads, listing, and retention
//! over 100 checkpoints, through the same code a worker runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tally::checkpoint::objects::remote::RemoteObjects;
use tally::checkpoint::objects::{ObjectError, Objects};
use tally::checkpoint::store::{manifest_key, part_key, CheckpointStore};
use tally::checkpoint::CheckpointId;
use tally::devtools::support::write_checkpoint;
use tally::model::Partition;
use tally::state::{NextOffset, StateStore};

use crate::common::*;

fn remote(prefix: &str) -> RemoteObjects {
    let mut options = BTreeMap::new();
    options.insert("aws_endpoint".to_string(), s3_endpoint());
    options.insert("aws_allow_http".to_string(), "true".to_string());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    RemoteObjects::open(&format!("s3://tally/{prefix}-{nanos}"), &options, "g").unwrap()
}

#[test]
fn s3_objects_are_created_once_never_replaced_and_read_within_bounds() {
    let s = remote("objects");
    s.put_new("chk-1-w/MANIFEST", b"first").unwrap();
    let again = s.put_new("chk-1-w/MANIFEST", b"second");
    assert!(
        matches!(again, Err(ObjectError::Exists { .. })),
        "{again:?}"
    );
    assert_eq!(s.get("chk-1-w/MANIFEST", 100).unwrap(), b"first");
    let big = s.get("chk-1-w/MANIFEST", 3);
    assert!(matches!(big, Err(ObjectError::Refused { .. })), "{big:?}");
    assert!(matches!(
        s.get("chk-1-w/none", 10),
        Err(ObjectError::NotFound { .. })
    ));
    let listed: Vec<(String, u64)> = s
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key, o.size))
        .collect();
    assert_eq!(listed, [("chk-1-w/MANIFEST".to_string(), 5)]);
    assert!(s
        .location("chk-1-w/MANIFEST")
        .starts_with("s3://tally/objects-"));
    s.delete("chk-1-w/MANIFEST").unwrap();
    s.delete("chk-1-w/MANIFEST").unwrap();
    assert!(s.list().unwrap().is_empty());
}

/// 100 checkpoints with partitions moving between them, retention after each:
/// what is left is exactly what the retained manifests reference, and each
/// partition is still held by `retain` complete checkpoints that restore.
#[test]
fn s3_retention_leaves_no_unreferenced_object_after_100_checkpoints() {
    let dir = TempDir::new("s3retain");
    let state = Arc::new(StateStore::open_fresh(&dir.path().join("rocksdb")).unwrap());
    let store = Arc::new(CheckpointStore::with_objects(
        Box::new(remote("retain")),
        "w",
        3,
    ));
    for id in 1..=100u64 {
        // Partitions move: 0 and 1 alternate between checkpoints; 2 is always there.
        let ps: &[i32] = if id % 2 == 0 { &[0, 2] } else { &[1, 2] };
        write_checkpoint(&store, &state, id, ps, id as i64, 1).unwrap();
        store.retain(CheckpointId(id)).unwrap();
    }
    let listed = store.list().unwrap();
    let mut referenced = BTreeSet::new();
    for l in &listed {
        let m = l.manifest.as_ref().unwrap().as_ref().unwrap();
        referenced.insert(manifest_key(&l.name));
        for e in &m.partitions {
            referenced.extend((0..e.parts.len()).map(|i| part_key(&l.name, e.partition, i)));
        }
    }
    let keys: BTreeSet<String> = store
        .objects()
        .list()
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, referenced);
    assert!(listed.len() <= 6, "{} checkpoints kept", listed.len());
    assert!(store.verify().unwrap().is_empty());
    let fresh = StateStore::open_fresh(&dir.path().join("fresh")).unwrap();
    for (p, next) in [(0, 100), (1, 99), (2, 100)] {
        let r = store
            .restore_partition(Partition(p), "f", &fresh)
            .unwrap()
            .unwrap();
        assert_eq!(r.next_offset, NextOffset(next), "partition {p}");
    }
}
