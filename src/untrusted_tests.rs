//! Every parser of untrusted bytes, fed arbitrary and mutated input (issue 19):
//! the input record parser (and the engine's validation), the config loader, the
//! manifest decoder, the partition-file decoder, and the sink's decoding and check
//! of results records (issue 33). Each must return a value or
//! a reason — never panic, abort or allocate without bound.
//!
//! Mutations start from valid encodings (a record, the example config, a
//! manifest, a snapshot), so they reach the fields behind the first byte that
//! random input almost never gets past. Longer runs: `scripts/fuzz.sh` (a million
//! cases each, with the round trips of `checkpoint::format` and `checkpoint::part`
//! and the scanner against its reference). Inputs that once broke a parser are
//! kept in `CORPUS` and run on every test run.

use proptest::collection::vec;
use proptest::prelude::*;

use crate::checkpoint::format::{decode_manifest, encode_manifest, seal, unseal, VERSION};
use crate::checkpoint::part::{parse_part, PartWriter};
use crate::checkpoint::{
    CheckpointId, Manifest, OffsetLedger, PartRef, PartitionEntry, Segment, SegmentKind,
};
use crate::config::Config;
use crate::engine::{validate, Counters, RecordIn};
use crate::model::NextOffset;
use crate::model::{event, Partition};
use crate::state::decode_partition;

const RECORD: &str = r#"{"request_id":"r-1","tenant_id":"acme","model":"small","prompt_tokens":1000,"completion_tokens":500,"completed_ts":1767261600000}"#;
const EXAMPLE: &str = include_str!("../tally.example.toml");

/// Inputs that broke a parser once (or were built to), run every time.
const CORPUS: &[&[u8]] = &[
    // A format-2 manifest body claiming a 2^62-byte worker name (aborted with an
    // allocation failure before the decoder had a limit).
    &[2, 7, 0xFD, 0, 0, 0, 0, 0, 0, 0, 0x40],
    // The same length in a format-3 manifest (checksum not valid).
    b"TALLYMAN\0\x03\x07\x80\x80\x80\x80\x80\x80\x80\x80\x40",
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
    sink(bytes);
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
    // The body decoder behind the checksum too.
    let _ = decode_manifest(&seal(bytes));
    snapshot(bytes);
}

/// The results records of the current formats, one of each kind, as the worker and
/// `reprocess-late` write them.
const RESULTS: &[&str] = &[
    r#"{"kind":"window","tenant_id":"acme","window_start":1767261600000,"window_end":1767261660000,"cost_pico":"400000000000","usd":"0.400000000000","requests":4,"prompt_tokens":4000,"completion_tokens":2000,"source_partition":0,"version":4,"pane":"late","pane_index":2,"generation":1,"lines":[{"model":"large","requests":3,"prompt_tokens":3000,"completion_tokens":1500,"cost_pico":"300000000000"},{"model":"small","requests":1,"prompt_tokens":1000,"completion_tokens":500,"cost_pico":"100000000000"}]}"#,
    r#"{"kind":"adjustment","request_id":"r-103","tenant_id":"acme","model":"large","window_start":1767261600000,"window_end":1767261660000,"cost_pico":"100000000000","usd":"0.100000000000","prompt_tokens":1000,"completion_tokens":500,"generation":1,"source":"requests/0/3"}"#,
    r#"{"kind":"progress","source_partition":0,"source_partitions":4,"results_partitions":4,"final_through":1767261660000,"watermark":1767261695000,"generation":1}"#,
];

/// The sink's decoding and check: never a panic; and what it accepts fits the
/// columns it is bound to (the conversions `apply` makes cannot fail).
fn sink(bytes: &[u8]) {
    use crate::engine::SinkRecord;
    let Ok(r) = SinkRecord::parse(bytes) else {
        return;
    };
    if crate::sink::check::storable(&r, &crate::sink::check::Topology::ANY).is_err() {
        return;
    }
    let fits = |v: u64| i64::try_from(v).is_ok();
    let no_nul = |s: &str| !s.contains('\0') && s.len() <= 520;
    match &r {
        SinkRecord::Window(w) => {
            assert!(
                fits(w.version) && fits(w.requests) && fits(w.generation),
                "{w:?}"
            );
            assert!(i32::try_from(w.pane_index).is_ok() && w.window_start < w.window_end);
            assert!(
                no_nul(&w.tenant_id)
                    && w.lines.iter().all(|l| no_nul(&l.model) && fits(l.requests))
            );
            assert_eq!(w.usd, w.cost_pico.usd_string());
        }
        SinkRecord::Adjustment(a) => {
            assert!(fits(a.generation) && no_nul(&a.request_id) && no_nul(&a.tenant_id));
            assert!(no_nul(&a.model) && no_nul(&a.source) && a.window_start < a.window_end);
        }
        SinkRecord::Progress(p) => {
            assert!(fits(p.generation) && (0..p.source_partitions).contains(&p.source_partition));
            assert!(p.final_through <= p.watermark.saturating_add(1));
        }
    }
}

fn snapshot(bytes: &[u8]) {
    if let Ok(entries) = parse_part(bytes, Partition(0), 0) {
        let _ = decode_partition(Partition(0), entries.iter().copied());
    }
}

fn manifest_body() -> Vec<u8> {
    let m = Manifest {
        format: VERSION,
        id: CheckpointId(3),
        worker: "w1".into(),
        created_at_ms: 5,
        group: "g".into(),
        topic: "requests".into(),
        fingerprint: "ab".repeat(32),
        semantics: None,
        partitions: vec![PartitionEntry {
            partition: Partition(0),
            next_offset: NextOffset(10),
            watermark: Some(crate::time::EventTime(7)),
            high_water: Some(7),
            counters: Counters {
                consumed: 10,
                folded: 10,
                ..Counters::default()
            },
            offsets: OffsetLedger::default(),
            segments: vec![Segment {
                checkpoint: "chk-00000000000000000001-w".into(),
                kind: SegmentKind::Base,
                parts: vec![PartRef {
                    bytes: 100,
                    sha256: [0xcd; 32],
                }],
            }],
        }],
    };
    unseal(&encode_manifest(&m)).to_vec()
}

fn snapshot_bytes() -> Vec<u8> {
    use crate::state::stored::{encode, StoredCounters, StoredMeta, StoredWindow};
    let mut w = PartWriter::new(Partition(0));
    let mut meta = vec![b'M'];
    meta.extend_from_slice(&0x8000_0000u32.to_be_bytes());
    let counters = StoredCounters::from(Counters::default());
    let m = StoredMeta {
        next_offset: 10,
        bound_ms: 0,
        max_ts: Some(7),
        forced: None,
        counters,
    };
    w.entry(&meta, &encode(&m));
    let mut win = vec![b'W'];
    win.extend_from_slice(&0x8000_0000u32.to_be_bytes());
    win.extend_from_slice(&(1_767_261_660_000u64 ^ (1 << 63)).to_be_bytes());
    win.extend_from_slice(b"acme");
    let stored = StoredWindow {
        cost_pico: 1,
        prompt_tokens: 2,
        completion_tokens: 3,
        version: 4,
        panes: 5,
        open: true,
        first_model: "small".into(),
        others: vec![],
        rated: vec![],
    };
    w.entry(&win, &encode(&stored));
    w.finish()
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
    for r in RESULTS {
        let rec = crate::engine::SinkRecord::parse(r.as_bytes()).unwrap();
        assert_eq!(
            crate::sink::check::storable(&rec, &crate::sink::check::Topology::ANY),
            Ok(()),
            "{r}"
        );
    }
    assert!(decode_manifest(&seal(&manifest_body())).is_ok());
    let snap = snapshot_bytes();
    let entries = parse_part(&snap, Partition(0), 0).unwrap();
    assert_eq!(entries.len(), 2);
    let (s, next) = decode_partition(Partition(0), entries.iter().copied())
        .unwrap()
        .unwrap();
    assert_eq!((next, s.open.len()), (NextOffset(10), 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::base::proptest_cases(256)))]

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
        let _ = decode_manifest(&seal(&mutate(&manifest_body(), &edits)));
    }

    #[test]
    fn mutated_results_never_break_the_sink(which in 0..RESULTS.len(), edits in vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)) {
        sink(&mutate(RESULTS[which].as_bytes(), &edits));
    }

    /// Numbers and strings swapped in whole: integers at and past every edge, ids
    /// with NUL and control characters, long ids.
    #[test]
    fn results_with_edge_values_never_break_the_sink(
        which in 0..RESULTS.len(),
        field in 0usize..24,
        value in prop_oneof![
            Just("18446744073709551615".to_string()),
            Just("9223372036854775808".to_string()),
            Just("9223372036854775807".to_string()),
            Just("4294967295".to_string()),
            Just("-1".to_string()),
            Just("340282366920938463463374607431768211456".to_string()),
            Just("\"\\u0000\"".to_string()),
            Just("\"a\\nb\"".to_string()),
            Just("\"\"".to_string()),
            Just("null".to_string()),
            (0usize..3000).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
            any::<i64>().prop_map(|n| n.to_string()),
        ],
    ) {
        // Replace the `field`-th value (after a colon) of the record.
        let text = RESULTS[which];
        let colons: Vec<usize> = text.match_indices(':').map(|(i, _)| i + 1).collect();
        let at = colons[field % colons.len()];
        let end = text[at..].find([',', '}']).map_or(text.len(), |e| at + e);
        let edited = format!("{}{}{}", &text[..at], value, &text[end..]);
        sink(edited.as_bytes());
    }

    #[test]
    fn mutated_snapshots_never_break_the_decoder(edits in vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)) {
        snapshot(&mutate(&snapshot_bytes(), &edits));
    }
}
