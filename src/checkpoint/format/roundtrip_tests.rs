//! The manifest and part formats against themselves: any manifest a writer can
//! make decodes to itself (`decode(encode(m)) == m`), and any entries a part
//! writer takes parse back in order. Mutated and arbitrary bytes are the other
//! half (`untrusted_tests`). `scripts/fuzz.sh` runs these for a million cases.

use proptest::collection::vec;
use proptest::prelude::*;

use super::{decode_manifest, encode_manifest, VERSION};
use crate::checkpoint::evolution::{Semantics, StoredPrice};
use crate::checkpoint::ledger::Gap;
use crate::checkpoint::part::{entries, PartWriter};
use crate::checkpoint::{
    CheckpointId, Manifest, OffsetLedger, PartRef, PartitionEntry, Segment, SegmentKind,
};
use crate::engine::Counters;
use crate::model::{NextOffset, Partition};
use crate::time::EventTime;

/// Any string, names included: the format stores bytes, not identifiers.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,24}", "[a-z0-9._-]{1,16}"]
}

fn semantics() -> impl Strategy<Value = Semantics> {
    let prices = vec(
        (text(), any::<i64>(), any::<u64>(), any::<u64>()).prop_map(|(model, from, i, o)| {
            StoredPrice {
                model,
                effective_from_ms: from,
                input: i,
                output: o,
            }
        }),
        0..4,
    );
    let times = (
        any::<Option<i64>>(),
        any::<i64>(),
        any::<i64>(),
        any::<i64>(),
        any::<i64>(),
        any::<Option<i64>>(),
        any::<Option<i64>>(),
    );
    (
        text(),
        times,
        text(),
        any::<(i64, u64, u64)>(),
        prices,
        text(),
        text(),
    )
        .prop_map(
            |(
                topic,
                t,
                time_source,
                (dedup_extra_ms, max_record_bytes, generation),
                prices,
                input,
                rating,
            )| {
                Semantics {
                    topic,
                    idle_timeout_ms: t.0,
                    window_size_ms: t.1,
                    window_offset_ms: t.2,
                    allowed_lateness_ms: t.3,
                    max_out_of_orderness_ms: t.4,
                    max_future_ms: t.5,
                    time_source,
                    dedup_extra_ms,
                    max_record_bytes,
                    generation,
                    max_lead_ms: t.6,
                    prices,
                    input,
                    rating,
                }
            },
        )
}

fn segment(kind: SegmentKind) -> impl Strategy<Value = Segment> {
    let parts = vec(
        (
            0..=crate::checkpoint::format::MAX_PART_BYTES,
            any::<[u8; 32]>(),
        )
            .prop_map(|(bytes, sha256)| PartRef { bytes, sha256 }),
        1..4,
    );
    (any::<u64>(), "[a-z0-9]{1,8}", parts).prop_map(move |(id, worker, parts)| Segment {
        checkpoint: format!("chk-{id:020}-{worker}"),
        kind,
        parts,
    })
}

fn delta() -> impl Strategy<Value = SegmentKind> {
    any::<(Option<i64>, Option<i64>)>().prop_map(|(w, d)| SegmentKind::Delta {
        windows_through: w,
        dedup_through: d,
    })
}

/// A partition whose ledger fits below its next offset and whose chain is a base
/// and deltas, as `check_manifest` requires of every manifest it reads.
fn partition(p: i32) -> impl Strategy<Value = PartitionEntry> {
    let counts = any::<[u32; 5]>();
    let chain = (segment(SegmentKind::Base), vec(delta(), 0..4)).prop_flat_map(|(base, kinds)| {
        let deltas: Vec<_> = kinds.into_iter().map(segment).collect();
        (Just(base), deltas)
    });
    let gaps = vec((0u32..1000, 0u32..1000, any::<i64>()), 0..3);
    (
        counts,
        0u32..1_000_000,
        gaps,
        any::<Option<i64>>(),
        any::<Option<i64>>(),
        chain,
    )
        .prop_map(
            move |(c, empty, gaps, watermark, high_water, (base, deltas))| {
                let counters = Counters {
                    consumed: c[..4].iter().map(|&n| u64::from(n)).sum(),
                    folded: c[0].into(),
                    too_late: c[1].into(),
                    dead_letter: c[2].into(),
                    duplicate: c[3].into(),
                    panes: c[4].into(),
                    idle_advances: u64::from(c[4] % 7),
                };
                let mut next = counters.consumed + u64::from(empty);
                let mut offsets =
                    OffsetLedger::without_gaps(counters.consumed, NextOffset(next as i64));
                for (from, len, at_ms) in gaps {
                    let from = next as i64 + i64::from(from);
                    let to = from + i64::from(len) + 1;
                    next = to as u64;
                    offsets.accept_gap(Gap { from, to, at_ms });
                }
                PartitionEntry {
                    partition: Partition(p),
                    next_offset: NextOffset(next as i64),
                    watermark: watermark.map(EventTime),
                    high_water,
                    counters,
                    offsets,
                    segments: std::iter::once(base).chain(deltas).collect(),
                }
            },
        )
}

fn manifest() -> impl Strategy<Value = Manifest> {
    let partitions = vec(0i32..64, 0..5).prop_flat_map(|mut ps| {
        ps.sort_unstable();
        ps.dedup();
        ps.into_iter().map(partition).collect::<Vec<_>>()
    });
    (
        any::<u64>(),
        (text(), text(), text(), text()),
        any::<i64>(),
        proptest::option::of(semantics()),
        partitions,
    )
        .prop_map(
            |(id, (worker, group, topic, fingerprint), created_at_ms, semantics, partitions)| {
                Manifest {
                    format: VERSION,
                    id: CheckpointId(id),
                    worker,
                    created_at_ms,
                    group,
                    topic,
                    fingerprint,
                    semantics,
                    partitions,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::base::proptest_cases(256)))]

    #[test]
    fn every_manifest_decodes_to_itself(m in manifest()) {
        match decode_manifest(&encode_manifest(&m)) {
            Ok(decoded) => prop_assert_eq!(decoded, m),
            Err(e) => prop_assert!(false, "refused its own encoding: {e:?}"),
        }
    }

    #[test]
    fn a_part_parses_back_to_its_entries(
        p in 0i32..1000,
        kvs in vec((vec(any::<u8>(), 0..48), vec(any::<u8>(), 0..300)), 0..40),
    ) {
        let mut w = PartWriter::new(Partition(p));
        for (k, v) in &kvs {
            prop_assert!(w.entry(k, v).is_none(), "a part this small is never cut");
        }
        let part = w.finish();
        let back: Vec<(Vec<u8>, Vec<u8>)> = entries(&part, Partition(p), 0)
            .map_err(TestCaseError::fail)?
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        prop_assert_eq!(back, kvs);
    }

    #[test]
    fn mutated_parts_are_refused_or_walk_inside_their_bytes(
        edits in vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        let mut w = PartWriter::new(Partition(2));
        for i in 0u8..8 {
            w.entry(&[b'k', i], &vec![i; usize::from(i) * 9]);
        }
        let mut part = w.finish();
        for &(at, xor, set) in &edits {
            let i = at % part.len();
            part[i] = if xor % 2 == 0 { part[i] ^ xor } else { set };
        }
        if let Ok(walk) = entries(&part, Partition(2), 0) {
            let held: usize = walk.map(|(k, v)| k.len() + v.len()).sum();
            prop_assert!(held <= part.len());
        }
    }
}
