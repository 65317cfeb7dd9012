//! Every parser of untrusted bytes, fed arbitrary and mutated input (issue 19):
//! the input record parser (and the engine's validation), the config loader, the
//! manifest decoder and the partition-file decoder. Each must return a value or
//! a reason — never panic, abort or allocate without bound.
//!
//! Mutations start from valid encodings (a record, the example config, a
//! manifest, a snapshot), so they reach the fields behind the first byte that
//! random input almost never gets past. Longer runs:
//! `PROPTEST_CASES=100000 cargo test --lib untrusted`. Inputs that once broke a
//! parser are kept in `CORPUS` and run on every test run.

use std::path::Path;

use proptest::collection::vec;
use proptest::prelude::*;

use crate::checkpoint::file::{parse_snapshot, SnapshotWriter};
use crate::checkpoint::store::decode_manifest;
use crate::checkpoint::{CheckpointId, Manifest, OffsetLedger, PartitionEntry, MANIFEST_FORMAT};
use crate::config::Config;
use crate::engine::{validate, Counters, RecordIn};
use crate::model::{event, Partition};
use crate::state::{decode_partition, NextOffset};

const RECORD: &str = r#"{"request_id":"r-1","tenant_id":"acme","model":"small","prompt_tokens":1000,"completion_tokens":500,"completed_ts":1767261600000}"#;
const EXAMPLE: &str = include_str!("../tally.example.toml");

/// Inputs that broke a parser once (or were built to), run every time.
const CORPUS: &[&[u8]] = &[
    // A manifest body claiming a 2^62-byte worker name (aborted with an
    // allocation failure before the decoder had a limit).
    &[2, 7, 0xFD, 0, 0, 0, 0, 0, 0, 0, 0x40],
    // A BOM before a record.
    b"\xEF\xBB\xBF{\"request_id\":\"r\"}",
    // Numbers at and past the edges of i64/u64.
    br#"{"request_id":"r","tenant_id":"t","model":"small","prompt_tokens":18446744073709551615,"completion_tokens":18446744073709551616,"completed_ts":9223372036854775807}"#,
    br#"{"request_id":"r","tenant_id":"t","model":"small","prompt_tokens":1,"completion_tokens":1,"completed_ts":-9223372036854775808}"#,
    // Deep nesting.
    b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
];

fn engine() -> std::sync::Arc<crate::engine::EngineConfig> {
    Config::from_toml_with_env(EXAMPLE, std::iter::empty())
        .and_then(|c| c.engine())
        .unwrap()
}

fn all_parsers(bytes: &[u8]) {
    let _ = event::parse(bytes);
    let _ = validate(
        &engine(),
        RecordIn {
            payload: bytes,
            kafka_ts: Some(0),
            now_ms: 1_767_261_600_000,
        },
    );
    let _ = Config::from_toml_with_env(&String::from_utf8_lossy(bytes), std::iter::empty());
    let _ = decode_manifest(bytes);
    snapshot(bytes);
}

fn snapshot(bytes: &[u8]) {
    if let Ok(entries) = parse_snapshot(bytes, Partition(0), Path::new("fuzz")) {
        let _ = decode_partition(Partition(0), entries.iter().copied());
    }
}

fn manifest_body() -> Vec<u8> {
    let m = Manifest {
        format: MANIFEST_FORMAT,
        id: CheckpointId(3),
        worker: "w1".into(),
        created_at_ms: 5,
        group: "g".into(),
        topic: "requests".into(),
        fingerprint: "ab".repeat(32),
        partitions: vec![PartitionEntry {
            partition: Partition(0),
            next_offset: NextOffset(10),
            watermark: Some(crate::time::EventTime(7)),
            counters: Counters {
                consumed: 10,
                folded: 10,
                ..Counters::default()
            },
            file: "p-000000.state".into(),
            bytes: 100,
            sha256: "cd".repeat(32),
            offsets: OffsetLedger::default(),
        }],
    };
    bincode::serde::encode_to_vec(&m, bincode::config::standard()).unwrap()
}

fn snapshot_bytes() -> Vec<u8> {
    // One directory per call: tests run in parallel and each removes its own.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tally-fuzz-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("p-000000.state");
    let mut w = SnapshotWriter::create(&path, Partition(0)).unwrap();
    let mut meta = vec![b'M'];
    meta.extend_from_slice(&0x8000_0000u32.to_be_bytes());
    w.entry(&meta, &[10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    let mut win = vec![b'W'];
    win.extend_from_slice(&0x8000_0000u32.to_be_bytes());
    win.extend_from_slice(&(1_767_261_660_000u64 ^ (1 << 63)).to_be_bytes());
    win.extend_from_slice(b"acme");
    w.entry(&win, &[1, 2, 3, 4, 5, 6, 1]).unwrap();
    w.finish(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// `base` with bytes overwritten, inserted or removed at the given places.
fn mutate(base: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut v = base.to_vec();
    for (at, kind, byte) in edits {
        let at = if v.is_empty() { 0 } else { at % (v.len() + 1) };
        match kind % 4 {
            0 if at < v.len() => v[at] = *byte,
            1 => v.insert(at, *byte),
            2 if at < v.len() => {
                v.remove(at);
            }
            // A varint length prefix of a huge value.
            _ => {
                let at = at.min(v.len());
                v.splice(
                    at..at,
                    [0xFD, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, *byte],
                );
            }
        }
    }
    v
}

#[test]
fn the_corpus_of_crashers_is_handled() {
    for bytes in CORPUS {
        all_parsers(bytes);
    }
    assert!(decode_manifest(CORPUS[0]).is_err());
}

#[test]
fn the_valid_encodings_decode() {
    assert!(event::parse(RECORD.as_bytes()).is_ok());
    assert!(decode_manifest(&manifest_body()).is_ok());
    let snap = snapshot_bytes();
    let entries = parse_snapshot(&snap, Partition(0), Path::new("fuzz")).unwrap();
    assert_eq!(entries.len(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_break_a_parser(bytes in vec(any::<u8>(), 0..600)) {
        all_parsers(&bytes);
    }

    #[test]
    fn mutated_records_never_break_the_record_parser(edits in vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..12)) {
        let bytes = mutate(RECORD.as_bytes(), &edits);
        let _ = event::parse(&bytes);
        let _ = validate(&engine(), RecordIn { payload: &bytes, kafka_ts: None, now_ms: 1_767_261_600_000 });
    }

    #[test]
    fn mutated_configs_never_break_the_loader(edits in vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)) {
        let text = String::from_utf8_lossy(&mutate(EXAMPLE.as_bytes(), &edits)).into_owned();
        if let Ok(cfg) = Config::from_toml_with_env(&text, std::iter::empty()) {
            let _ = cfg.engine();
        }
    }

    #[test]
    fn mutated_manifests_never_break_the_decoder(edits in vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)) {
        let _ = decode_manifest(&mutate(&manifest_body(), &edits));
    }

    #[test]
    fn mutated_snapshots_never_break_the_decoder(edits in vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)) {
        snapshot(&mutate(&snapshot_bytes(), &edits));
    }
}
