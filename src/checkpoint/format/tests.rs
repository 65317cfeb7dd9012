use super::older::{ManifestBodyV3, ManifestBodyV4, PartitionBodyV3, PartitionBodyV4};
use super::*;
use crate::engine::Counters;

pub(crate) fn sample() -> Manifest {
    let mut offsets = OffsetLedger::without_gaps(90, NextOffset(100));
    offsets.accept_gap(Gap {
        from: 1,
        to: 5,
        at_ms: 9,
    });
    Manifest {
        format: VERSION,
        id: CheckpointId(u64::MAX),
        worker: "w1".into(),
        created_at_ms: i64::MIN,
        group: "g".into(),
        topic: "t".into(),
        fingerprint: "f".into(),
        semantics: Some(Semantics {
            topic: "t".into(),
            idle_timeout_ms: None,
            window_size_ms: 60_000,
            window_offset_ms: 0,
            allowed_lateness_ms: 0,
            max_out_of_orderness_ms: 5_000,
            max_future_ms: Some(1),
            time_source: "CompletedTs".into(),
            dedup_extra_ms: 0,
            max_record_bytes: 1,
            generation: 1,
            max_lead_ms: Some(300_000),
            input: "Json: tenant_id=/customer/id".into(),
            rating: "[prices.models.m.rates]\nprompt_tokens = \"1\"\n".into(),
            prices: vec![crate::checkpoint::evolution::StoredPrice {
                model: "m".into(),
                effective_from_ms: i64::MIN,
                input: 1,
                output: 2,
            }],
        }),
        partitions: vec![PartitionEntry {
            partition: Partition(3),
            next_offset: NextOffset(100),
            watermark: Some(EventTime(-5)),
            high_water: Some(-7),
            counters: Counters {
                consumed: 90,
                folded: 90,
                ..Counters::default()
            },
            offsets,
            segments: vec![
                Segment {
                    checkpoint: "chk-00000000000000000001-w1".into(),
                    kind: SegmentKind::Base,
                    parts: vec![PartRef {
                        bytes: 12,
                        sha256: [7; 32],
                    }],
                },
                Segment {
                    checkpoint: "chk-18446744073709551615-w1".into(),
                    kind: SegmentKind::Delta {
                        windows_through: Some(-7),
                        dedup_through: None,
                    },
                    parts: vec![PartRef {
                        bytes: 3,
                        sha256: [8; 32],
                    }],
                },
            ],
        }],
    }
}

#[test]
fn a_manifest_round_trips_and_every_header_is_named() {
    let m = sample();
    let bytes = encode_manifest(&m);
    assert_eq!(decode_manifest(&bytes).unwrap(), m);
    // Format 4: the same manifest without semantics and high-water times.
    let v4 = postcard::to_allocvec(&ManifestBodyV4 {
        id: m.id.0,
        worker: m.worker.clone(),
        created_at_ms: m.created_at_ms,
        group: m.group.clone(),
        topic: m.topic.clone(),
        fingerprint: m.fingerprint.clone(),
        partitions: postcard::from_bytes::<ManifestBody>(unseal(&bytes))
            .unwrap()
            .partitions
            .into_iter()
            .map(|p| PartitionBodyV4 {
                partition: p.partition,
                next_offset: p.next_offset,
                watermark: p.watermark,
                counters: p.counters,
                ledger: p.ledger,
                segments: p.segments,
            })
            .collect(),
    })
    .unwrap();
    let mut framed = header(MANIFEST_MAGIC).to_vec();
    framed[8..10].copy_from_slice(&4u16.to_be_bytes());
    framed.extend_from_slice(&v4);
    let sum = Sha256::digest(&framed);
    framed.extend_from_slice(&sum);
    let old = decode_manifest(&framed).unwrap();
    assert_eq!((old.format, &old.semantics), (4, &None));
    assert_eq!(old.partitions[0].high_water, None);
    assert_eq!(old.partitions[0].segments, m.partitions[0].segments);
    // A flipped body byte: the checksum.
    let mut bad = bytes.clone();
    bad[HEADER + 2] ^= 1;
    assert!(decode_manifest(&bad)
        .unwrap_err()
        .to_string()
        .contains("checksum"));
    // Another version, older and newer, read before the body.
    for (v, says) in [(2u16, "older tally"), (VERSION + 1, "newer tally")] {
        let mut other = bytes.clone();
        other[8..10].copy_from_slice(&v.to_be_bytes());
        let e = decode_manifest(&other).unwrap_err().to_string();
        assert!(
            e.contains(&format!("format {v}")) && e.contains(says),
            "{e}"
        );
    }
    // A format-1/2 manifest (bincode: the format number first), a part file of
    // format 2, and something else entirely.
    let e = decode_manifest(&[2, 7, 1, 1]).unwrap_err();
    assert!(matches!(e, Unreadable::OtherFormat(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("format 2") && e.contains("--reset-state earliest"),
        "{e}"
    );
    // The formats it reads, as this build reads them (issue 33: the text
    // said "3 to 5" after format 7 came).
    assert!(
        e.contains(&format!("reads formats {OLDEST_READ} to {VERSION} ")),
        "{e}"
    );
    let e = body(b"TALLYPS2\0\0\0\x01", PART_MAGIC, "part")
        .unwrap_err()
        .to_string();
    assert!(e.contains("format 2"), "{e}");
    assert!(decode_manifest(b"hello")
        .unwrap_err()
        .to_string()
        .contains("not a tally manifest"));
}

/// Issue 33, defect 7: a ledger that cannot balance for any count of records
/// (`empty_offsets = gap_offsets = u64::MAX`: the sum must not wrap), or that
/// keeps a gap outside the offsets it covers, is damage when decoded.
#[test]
fn a_ledger_that_cannot_balance_is_damage() {
    type Edit = fn(&mut OffsetLedger);
    let edits: [(Edit, &str); 5] = [
        (
            |o| (o.empty_offsets, o.gap_offsets) = (u64::MAX, u64::MAX),
            "cannot balance",
        ),
        (|o| o.empty_offsets = u64::MAX, "cannot balance"),
        (|o| o.empty_offsets = 97, "cannot balance"),
        (|o| o.gaps[0].to = 101, "outside 0..100"),
        (|o| o.gaps[0].from = -1, "outside 0..100"),
    ];
    for (edit, says) in edits {
        let mut m = sample();
        edit(&mut m.partitions[0].offsets);
        let e = decode_manifest(&encode_manifest(&m)).unwrap_err();
        assert!(matches!(e, Unreadable::Damaged(_)), "{e:?}");
        assert!(e.to_string().contains(says), "{e}");
    }
    // At the edge: every offset below next_offset empty or deleted.
    let mut m = sample();
    m.partitions[0].offsets.empty_offsets = 96;
    decode_manifest(&encode_manifest(&m)).unwrap();
}

/// A crafted body under a valid checksum: huge lengths allocate nothing,
/// out-of-range fields are refused by name.
#[test]
fn crafted_manifests_are_refused_without_allocating() {
    let frame = seal;
    // id 1, then a worker-name length of 2^62 (varint).
    let mut body = vec![1u8];
    body.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]);
    assert!(decode_manifest(&frame(&body)).is_err());
    let mut m = sample();
    m.partitions[0].next_offset = NextOffset(-3);
    let e = decode_manifest(&encode_manifest(&m))
        .unwrap_err()
        .to_string();
    assert!(e.contains("field `next_offset` is -3"), "{e}");
    let mut m = sample();
    m.partitions.push(m.partitions[0].clone());
    assert!(decode_manifest(&encode_manifest(&m))
        .unwrap_err()
        .to_string()
        .contains("twice"));
    let mut m = sample();
    m.partitions[0].partition = Partition(-1);
    assert!(decode_manifest(&encode_manifest(&m)).is_err());
    type Edit = Box<dyn Fn(&mut Vec<Segment>)>;
    let chains: Vec<(Edit, &str)> = vec![
        (
            Box::new(|s| s[0].parts[0].bytes = u64::MAX),
            "more than a part",
        ),
        (Box::new(|s| s[1].parts.clear()), "segment 1 has no parts"),
        (Box::new(|s| s.clear()), "no segments"),
        (Box::new(|s| s[1].kind = SegmentKind::Base), "second base"),
        (Box::new(|s| s.swap(0, 1)), "does not start with a base"),
        (
            Box::new(|s| s[1].checkpoint = "../x".into()),
            "not a checkpoint",
        ),
        (
            Box::new(|s| s[0].checkpoint = "chk-1/p".into()),
            "not a checkpoint",
        ),
        (
            Box::new(|s| {
                let d = s[1].clone();
                s.resize(MAX_CHAIN + 1, d)
            }),
            "more than 64",
        ),
    ];
    for (edit, says) in chains {
        let mut m = sample();
        edit(&mut m.partitions[0].segments);
        let e = decode_manifest(&encode_manifest(&m))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{e}");
    }
}

/// A format-3 manifest (one run of parts) reads as a chain of one base in
/// its own checkpoint.
#[test]
fn a_format_3_manifest_reads_as_one_base() {
    let m = sample();
    let e = &m.partitions[0];
    let v3 = ManifestBodyV3 {
        id: 7,
        worker: "w1".into(),
        created_at_ms: 1,
        group: "g".into(),
        topic: "t".into(),
        fingerprint: "f".into(),
        partitions: vec![PartitionBodyV3 {
            partition: 3,
            next_offset: 100,
            watermark: None,
            counters: e.counters.into(),
            ledger: LedgerBody {
                empty_offsets: 0,
                gap_offsets: 0,
                gaps: vec![],
            },
            parts: vec![PartBody {
                bytes: 12,
                sha256: [7; 32],
            }],
        }],
    };
    let mut bytes = header(MANIFEST_MAGIC).to_vec();
    bytes[8..10].copy_from_slice(&3u16.to_be_bytes());
    bytes.extend_from_slice(&crate::state::stored::encode(&v3));
    let sum = Sha256::digest(&bytes);
    bytes.extend_from_slice(&sum);
    let read = decode_manifest(&bytes).unwrap();
    assert_eq!(read.format, 3);
    assert_eq!(
        read.partitions[0].segments,
        [Segment {
            checkpoint: "chk-00000000000000000007-w1".into(),
            kind: SegmentKind::Base,
            parts: vec![PartRef {
                bytes: 12,
                sha256: [7; 32],
            }],
        }]
    );
}
