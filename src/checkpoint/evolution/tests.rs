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
        rating: String::new(),
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
    let e = compare(&old, &new, None, None).unwrap_err();
    assert!(
        e.starts_with("`input` changed (the default mapping → Cloudevents"),
        "{e}"
    );
}

#[test]
fn prices_after_the_high_water_time_are_compatible() {
    let old = semantics(vec![price("small", i64::MIN, 150_000)]);
    let hw = Some(T0 + 10 * MIN);
    assert_eq!(compare(&old, &old, hw, None), Ok(Vec::new()));
    // A new model and a new schedule entry, both effective after the high water.
    let new = semantics(vec![
        price("small", i64::MIN, 150_000),
        price("small", T0 + 11 * MIN, 100_000),
        price("newmodel", T0 + 365 * 24 * 60 * MIN, 1),
    ]);
    assert_ne!(old.fingerprint(), new.fingerprint());
    let changes = compare(&old, &new, hw, None).unwrap();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(changes
        .iter()
        .any(|c| c.contains("`prices.newmodel`") && c.ends_with("added")));
    // Changing or removing that future entry again is just as compatible.
    assert!(compare(&new, &old, hw, None)
        .unwrap()
        .iter()
        .all(|c| c.ends_with("removed")));
    // A partition that priced nothing takes any price change.
    let retro = semantics(vec![price("small", i64::MIN, 1)]);
    assert_eq!(compare(&old, &retro, None, None).unwrap().len(), 1);
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
        let e = compare(&old, &semantics(new), hw, None).unwrap_err();
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
        None,
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
        let e = compare(&old, &new, None, None).unwrap_err();
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

/// Ratings are compared entry by entry: a future plan assignment and a new quantity
/// from a future time restore; the same after the high-water time, or a
/// retroactive one, is refused naming its key; a switch to or from today's table is
/// refused.
#[test]
fn a_rating_changes_compatibly_only_after_the_high_water_time() {
    let base = include_str!("../../config/rating/openai.toml");
    let with = |rating: String| Semantics {
        rating,
        ..semantics(Vec::new())
    };
    let old = with(base.to_string());
    let future = format!(
        "{base}\n[[prices.assignments]]\ntenant = \"umbrella\"\nplan = \"enterprise\"\n\
         effective_from = \"2027-06-01T00:00:00Z\"\n"
    )
    .replace(
        "[input.quantities.web_search_calls]",
        "[input.quantities.image_count]\neffective_from = \"2027-06-01T00:00:00Z\"\n\n\
         [input.quantities.web_search_calls]",
    )
        + "[[prices.models.o-large.schedule]]\neffective_from = \"2027-06-01T00:00:00Z\"\n\
       rates = { prompt_tokens = \"0.002\", cached_tokens = \"0.0005\", completion_tokens = \
       \"0.008\", reasoning_tokens = \"0.008\", web_search_calls = { per_unit = \"0.01\" }, \
       image_count = { per_unit = \"0.02\" } }\n";
    let parse = Some(crate::config::rating::from_source as RatingParser);
    let early = Some(T0);
    let changes = compare(&old, &with(future.clone()), early, parse).unwrap();
    assert!(
        changes.iter().any(|c| c.contains("umbrella"))
            && changes.iter().any(|c| c.contains("image_count")),
        "{changes:?}"
    );
    let late = Some(crate::time::utc::parse_utc_ms("2027-07-01T00:00:00Z").unwrap());
    let e = compare(&old, &with(future), late, parse).unwrap_err();
    assert!(e.contains("image_count") || e.contains("umbrella"), "{e}");
    let retro = format!(
        "{base}\n[[prices.assignments]]\ntenant = \"umbrella\"\nplan = \"startup\"\n\
         effective_from = \"2026-01-01T00:00:00Z\"\n"
    );
    let e = compare(&old, &with(retro), early, parse).unwrap_err();
    assert!(
        e.contains("prices.assignments (tenant \"umbrella\")"),
        "{e}"
    );
    let e = compare(&old, &with(String::new()), early, parse).unwrap_err();
    assert!(
        e.contains("between a price table and the rating schema"),
        "{e}"
    );
    // Without a parser a changed rating cannot be judged: refused.
    assert!(compare(&old, &with(format!("{base}\n")), early, None).is_err());
}
