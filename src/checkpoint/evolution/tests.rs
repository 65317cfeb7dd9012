use super::*;

const MIN: i64 = 60_000;
const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

fn price(model: &str, from: i64, input: u64) -> StoredPrice {
    StoredPrice {
        model: model.into(),
        effective_from_ms: from,
        input,
        output: 2 * input,
    }
}

fn semantics(prices: Vec<StoredPrice>) -> Semantics {
    let mut prices = prices;
    prices.sort();
    Semantics {
        topic: "requests".into(),
        idle_timeout_ms: None,
        window_size_ms: MIN,
        window_offset_ms: 0,
        allowed_lateness_ms: 30_000,
        max_out_of_orderness_ms: 5_000,
        max_future_ms: Some(60 * MIN),
        time_source: "CompletedTs".into(),
        dedup_extra_ms: 60 * MIN,
        max_record_bytes: 1 << 20,
        generation: 1,
        max_lead_ms: Some(5 * MIN),
        prices,
        input: String::new(),
    }
}

#[test]
fn an_input_mapping_change_is_refused_by_key_and_the_default_adds_nothing() {
    let old = semantics(vec![price("small", i64::MIN, 150_000)]);
    let ce = crate::model::input::InputMapping::new(&crate::model::input::InputConfig {
        format: crate::model::input::InputFormat::Cloudevents,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(crate::model::input::InputMapping::default().describe(), "");
    let new = Semantics {
        input: ce.describe(),
        ..old.clone()
    };
    assert!(
        new.input.starts_with("Cloudevents: request_id=/id"),
        "{}",
        new.input
    );
    assert_ne!(old.fingerprint(), new.fingerprint());
    let e = compare(&old, &new, None).unwrap_err();
    assert!(
        e.starts_with("`input` changed (the default mapping → Cloudevents"),
        "{e}"
    );
}

#[test]
fn prices_after_the_high_water_time_are_compatible() {
    let old = semantics(vec![price("small", i64::MIN, 150_000)]);
    let hw = Some(T0 + 10 * MIN);
    assert_eq!(compare(&old, &old, hw), Ok(Vec::new()));
    // A new model and a new schedule entry, both effective after the high water.
    let new = semantics(vec![
        price("small", i64::MIN, 150_000),
        price("small", T0 + 11 * MIN, 100_000),
        price("newmodel", T0 + 365 * 24 * 60 * MIN, 1),
    ]);
    assert_ne!(old.fingerprint(), new.fingerprint());
    let changes = compare(&old, &new, hw).unwrap();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(changes
        .iter()
        .any(|c| c.contains("`prices.newmodel`") && c.ends_with("added")));
    // Changing or removing that future entry again is just as compatible.
    assert!(compare(&new, &old, hw)
        .unwrap()
        .iter()
        .all(|c| c.ends_with("removed")));
    // A partition that priced nothing takes any price change.
    let retro = semantics(vec![price("small", i64::MIN, 1)]);
    assert_eq!(compare(&old, &retro, None).unwrap().len(), 1);
}

#[test]
fn retroactive_price_changes_are_refused_naming_the_key() {
    let old = semantics(vec![price("small", i64::MIN, 150_000)]);
    let hw = Some(T0 + 10 * MIN);
    // An entry at exactly the high-water time would re-price a billed record.
    for (new, key) in [
        (
            vec![
                price("small", i64::MIN, 150_000),
                price("small", T0 + 10 * MIN, 1),
            ],
            "`prices.small` effective_from 2026-01-01T00:10:00.000Z was added",
        ),
        (
            vec![price("small", i64::MIN, 150_001)],
            "`prices.small` effective_from always",
        ),
        (
            vec![
                price("small", i64::MIN, 150_000),
                price("newmodel", i64::MIN, 1),
            ],
            "`prices.newmodel`",
        ),
        (
            vec![price("other", T0 + 20 * MIN, 1)],
            "`prices.small` effective_from always (no effective_from) was removed",
        ),
    ] {
        let e = compare(&old, &semantics(new), hw).unwrap_err();
        assert!(
            e.contains(key) && e.contains("2026-01-01T00:10:00.000Z"),
            "{e}"
        );
    }
    // Unknown high water (format 4 under another time source): nothing is after it.
    let e = compare(
        &old,
        &semantics(vec![
            price("small", i64::MIN, 150_000),
            price("x", T0 + 999 * MIN, 1),
        ]),
        Some(i64::MAX),
    )
    .unwrap_err();
    assert!(e.contains("unknown"), "{e}");
}

#[test]
fn other_semantic_changes_are_refused_naming_the_key() {
    let old = semantics(vec![price("small", i64::MIN, 1)]);
    let mut cases: Vec<(Semantics, &str)> = Vec::new();
    let mut s = old.clone();
    s.window_size_ms = 2 * MIN;
    cases.push((s, "`window.size` changed (60000 ms → 120000 ms)"));
    let mut s = old.clone();
    s.generation = 2;
    cases.push((s, "`job.generation` changed (1 → 2)"));
    let mut s = old.clone();
    s.max_lead_ms = None;
    cases.push((s, "`watermark.max_lead` changed (300000 ms → off)"));
    let mut s = old.clone();
    s.time_source = "KafkaTimestamp".into();
    cases.push((s, "`watermark.time_source`"));
    for (new, want) in cases {
        let e = compare(&old, &new, None).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}

/// The fingerprint text of format 4 is kept for every field it had, so a
/// checkpoint of format 4 restores under `max_lead = "off"`: this is the digest
/// format 4 computed for these settings.
#[test]
fn the_fingerprint_without_a_lead_limit_is_format_4s() {
    let mut s = semantics(vec![price("small", i64::MIN, 150_000)]);
    s.max_lead_ms = None;
    let text = "tally-fingerprint-v1|topic=requests|idle=None|size=60000|offset=0|lateness=30000|bound=5000|\
                future=Some(3600000)|time=CompletedTs|dedup=3600000|max_bytes=1048576|generation=1|\
                prices=small@-9223372036854775808:150000/300000";
    assert_eq!(
        s.fingerprint(),
        crate::checkpoint::hex(&Sha256::digest(text.as_bytes()))
    );
    let with = Semantics {
        max_lead_ms: Some(1),
        ..s.clone()
    };
    assert_ne!(with.fingerprint(), s.fingerprint());
}
