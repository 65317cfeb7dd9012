//! The object-storage checkpoint store against a real S3-compatible server
//! (`scripts/s3.sh`): conditional writes, bounded reads, listing, and retention
//! over 100 checkpoints, through the same code a worker runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tally::checkpoint::objects::remote::RemoteObjects;
use tally::checkpoint::objects::{ObjectError, Objects};
use tally::checkpoint::store::{referenced, CheckpointStore};
use tally::checkpoint::CheckpointId;
use tally::devtools::support::write_checkpoint;
use tally::model::Partition;
use tally::state::{NextOffset, StateStore};

use crate::common::*;

fn remote(prefix: &str) -> RemoteObjects {
    remote_at(prefix, &s3_endpoint())
}

fn remote_at(prefix: &str, endpoint: &str) -> RemoteObjects {
    let mut options = BTreeMap::new();
    options.insert("aws_endpoint".to_string(), endpoint.to_string());
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

/// A create whose answer is lost (the object made, the connection dropped before
/// the client heard) is this writer's write, not another's: `put_new` succeeds,
/// once; another writer's bytes under the key are still `Exists`.
#[test]
fn a_create_whose_answer_was_lost_is_not_taken_for_another_writer() {
    let proxy = crate::s3_proxy::FaultyS3::start(&s3_endpoint(), false);
    let s = remote_at("lost-answer", &proxy.endpoint);
    proxy.lose_put_answers.store(1, Ordering::SeqCst);
    s.put_new("chk-1-w/MANIFEST", b"mine").unwrap();
    assert_eq!(
        proxy.lose_put_answers.load(Ordering::SeqCst),
        0,
        "no answer was lost"
    );
    assert_eq!(s.get("chk-1-w/MANIFEST", 100).unwrap(), b"mine");
    let other = s.put_new("chk-1-w/MANIFEST", b"theirs");
    assert!(
        matches!(other, Err(ObjectError::Exists { .. })),
        "{other:?}"
    );
    assert_eq!(s.get("chk-1-w/MANIFEST", 100).unwrap(), b"mine");
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
    let referenced: BTreeSet<String> = listed
        .iter()
        .flat_map(|l| referenced(&l.name, l.manifest.as_ref().unwrap().as_ref().unwrap()))
        .collect();
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
            .restore_partition(
                Partition(p),
                &tally::checkpoint::evolution::Rules::opaque("f"),
                &fresh,
            )
            .unwrap()
            .unwrap();
        assert_eq!(r.next_offset, NextOffset(next), "partition {p}");
    }
}

/// Incremental checkpoints on S3: 100 checkpoints of 1% changes each, with
/// `retain = 3` — the store holds about one snapshot plus the kept deltas, nothing
/// that no kept manifest references, and the newest chains restore to exactly
/// what the tasks hold.
#[test]
fn s3_chains_of_deltas_stay_bounded_and_restore_exactly_over_100_checkpoints() {
    use tally::devtools::rig::{Rig, T0};
    let dir = TempDir::new("s3chain");
    let store = Arc::new(CheckpointStore::with_objects(
        Box::new(remote("chain")),
        "w",
        3,
    ));
    let engine = tally::devtools::support::one_price_engine(0);
    let mut rig = Rig::new(&dir.path().join("state"), store.clone(), "w", 2, engine).unwrap();
    let tenants = 2_000;
    for p in 0..2 {
        rig.feed(p, 0..tenants, T0 + 1_000, 0);
    }
    let mut deltas = 0;
    for round in 1..=100usize {
        for p in 0..2 {
            let from = (round * 20) % tenants;
            rig.feed(p, from..from + 20, T0 + 1_000, round);
        }
        let m = rig.checkpoint().unwrap().manifest;
        deltas += m.partitions.iter().filter(|e| e.segments.len() > 1).count();
        let full: u64 = m.partitions.iter().map(|e| e.segments[0].bytes()).sum();
        let stored: u64 = store.objects().list().unwrap().iter().map(|o| o.size).sum();
        assert!(
            stored <= 3 * full,
            "round {round}: {stored} bytes stored for {full}"
        );
    }
    assert!(deltas > 150, "{deltas} chains with deltas");
    // Complete: 3; the other directories hold only parts the kept chains build on.
    let listed = store.list().unwrap();
    let complete: Vec<_> = listed
        .iter()
        .filter_map(|l| Some((&l.name, l.manifest.as_ref()?.as_ref().ok()?)))
        .collect();
    assert_eq!(complete.len(), 3, "retain = 3");
    let referenced: BTreeSet<String> = complete
        .iter()
        .flat_map(|(name, m)| referenced(name, m))
        .collect();
    let keys: BTreeSet<String> = store
        .objects()
        .list()
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, referenced);
    assert!(store.verify().unwrap().is_empty());
    let fresh = StateStore::open_fresh(&dir.path().join("fresh")).unwrap();
    for t in &rig.tasks {
        store
            .restore_partition(
                t.partition(),
                &tally::checkpoint::evolution::Rules::opaque("f"),
                &fresh,
            )
            .unwrap()
            .unwrap();
        let restored = fresh.load(t.partition()).unwrap().unwrap().0;
        assert_eq!(restored, t.snapshot(), "{}", t.partition());
    }
}

/// Credentials from the standard environment never reach a log line, an error or
/// stdout — not even at trace level, where the HTTP client logs its requests (the
/// session token travels in a header of every one).
#[test]
fn s3_credentials_never_reach_the_output() {
    let dir = TempDir::new("s3canary");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\ngroup_id = \"canary\"\n[checkpoint]\n{}\n[state]\ndir = \"{}/state\"\n",
            s3_checkpoint("canary"),
            dir.path().display()
        ),
    )
    .unwrap();
    // One checkpoint to list and verify.
    let c = tally::config::Config::load(Some(&cfg)).unwrap();
    let store = Arc::new(CheckpointStore::open(&c.checkpoint, "canary", "w").unwrap());
    let state = Arc::new(StateStore::open_fresh(&dir.path().join("rocksdb")).unwrap());
    write_checkpoint(&store, &state, 1, &[0], 5, 3).unwrap();
    let secret = "S3-CANARY-secret-access-key-0123456789";
    let token = "S3-CANARY-session-token-0123456789";
    let envs = [
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_SESSION_TOKEN", token),
        ("TALLY_LOG", "trace"),
    ];
    let c = cfg.to_str().unwrap();
    let commands: [&[&str]; 3] = [
        &["checkpoints", "list", "--config", c],
        &["checkpoints", "verify", "--config", c],
        &["config", "--config", c],
    ];
    for args in commands {
        let out = tally(args, &envs, std::time::Duration::from_secs(60));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            !text.contains("S3-CANARY"),
            "{args:?} printed a credential: {text}"
        );
        if args[0] == "checkpoints" {
            // The HTTP client's own trace lines are there: the test sees what it logs.
            assert!(
                text.contains("TRACE") && text.contains("127.0.0.1"),
                "{args:?}: {text}"
            );
        }
        if args[1] == "list" {
            assert!(text.contains("s3://tally/canary-"), "{args:?}: {text}");
        }
    }
    // An error path: a bucket that does not exist. The store answers, so the
    // status is "unavailable" (4), and the error names the store, not a credential.
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("s3://tally/", "s3://no-such-bucket/");
    std::fs::write(&cfg, text).unwrap();
    let out = tally(
        &["checkpoints", "list", "--config", c],
        &envs,
        std::time::Duration::from_secs(120),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("s3://no-such-bucket/") && err.contains("NoSuchBucket"),
        "{err}"
    );
    assert!(!err.contains("S3-CANARY"), "{err}");
}
