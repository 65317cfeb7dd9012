//! What the topics add to a replay: only records of the tenant's windows, only
//! from offsets the replay did not read and below the log end, each once.

use super::*;
use crate::explain::replay::tests::{cfg, ev, log, MIN, S, T10};
use crate::explain::replay::{replay, Replayed};

fn topic_record(source: &str, payload: &str, extra: &[(&str, &str)]) -> StoredRecord {
    let mut headers = vec![(headers::SOURCE.to_string(), source.to_string())];
    headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    StoredRecord {
        partition: 0,
        offset: 0,
        key: Some(b"acme".to_vec()),
        payload: payload.as_bytes().to_vec(),
        headers,
    }
}

/// A replay of partition 3 that stopped at offset 3 of 6, as if resumed at 1.
fn stopped() -> Replayed {
    let records = [
        ev("a", "acme", "large", T10 + 10 * S),
        ev("b", "acme", "large", T10 + 30 * MIN),
        ev("c", "acme", "large", T10 + 2 * 60 * MIN),
        ev("z", "acme", "large", T10 + 20 * S),
        ev("y", "acme", "large", T10 + 20 * S),
        ev("x", "acme", "large", T10 + 20 * S),
    ];
    let mut r = replay(&cfg(), "acme", (T10, T10 + MIN), &log(&records), T10).unwrap();
    assert_eq!(r.range.to_offset, 3);
    r.range.from_offset = 1;
    r
}

#[test]
fn records_the_replay_did_not_read_come_from_the_topics_once() {
    let mut r = stopped();
    let wm = (T10 + 2 * 60 * MIN - 5 * S).to_string();
    let late_of = |id: &str, source: &str| {
        let payload = ev(id, "acme", "large", T10 + 20 * S);
        topic_record(source, &payload, &[(headers::WATERMARK, &wm)])
    };
    let late = [
        late_of("z", "requests/3/3"),
        late_of("z", "requests/3/3"), // written twice: taken once
        late_of("y", "requests/3/2"), // read by the replay
        late_of("w", "requests/3/6"), // past the log end read
        late_of("v", "requests/4/4"), // another partition
        late_of("u", "other/3/4"),    // another topic
        topic_record(
            "requests/3/5",
            &ev("t", "other", "large", T10 + 20 * S),
            &[(headers::WATERMARK, &wm)],
        ),
    ];
    let dead_of = |source: &str, payload: &str| {
        topic_record(source, payload, &[(headers::ERROR, "unknown_model")])
    };
    let dead = [
        dead_of("requests/3/0", &ev("d0", "acme", "nope", T10 + 5 * S)), // before the start
        dead_of("requests/3/4", &ev("d4", "acme", "nope", T10 + 5 * S)), // after the stop
        dead_of("requests/3/1", &ev("d1", "acme", "nope", T10 + 5 * S)), // read by the replay
        dead_of("requests/3/5", &ev("d5", "acme", "nope", T10 + 90 * S)), // another window
        dead_of("requests/3/5", "{\"tenant_id\":\"acme\""),              // unreadable: counted
    ];
    add_outside(
        &cfg(),
        ("acme", (T10, T10 + MIN)),
        "requests",
        &mut r,
        (&late, &dead),
        T10,
    );
    let got: Vec<_> = r
        .elsewhere
        .iter()
        .map(|e| (e.offset, e.request_id.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        got,
        [(0, "d0".into()), (3, "z".into()), (4, "d4".into())],
        "{:?}",
        r.elsewhere
    );
    assert!(matches!(
        &r.elsewhere[1].route,
        Routed::TooLate { on_late_topic: true, watermark, cost_pico, .. }
            if watermark.to_string() == wm && cost_pico == "100000000000"
    ));
    assert!(matches!(
        &r.elsewhere[0].route,
        Routed::DeadLetter { code, on_dead_letter_topic: true, .. } if code == "unknown_model"
    ));
    assert_eq!(r.range.unreadable_dead_letters, 1);
}

/// A replay that read to the log end takes nothing after it from the topics.
#[test]
fn a_replay_read_to_the_end_takes_no_later_record() {
    let records = [ev("a", "acme", "large", T10 + 10 * S)];
    let mut r = replay(&cfg(), "acme", (T10, T10 + MIN), &log(&records), T10).unwrap();
    let late = [topic_record(
        "requests/3/0",
        &ev("a", "acme", "large", T10 + 10 * S),
        &[(headers::WATERMARK, "1")],
    )];
    add_outside(
        &cfg(),
        ("acme", (T10, T10 + MIN)),
        "requests",
        &mut r,
        (&late, &[]),
        T10,
    );
    assert!(r.elsewhere.is_empty());
}
