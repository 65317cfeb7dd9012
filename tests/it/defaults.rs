//! Issue 34: guarantees under the shipped defaults (no watermark or idleness key
//! set). Producers whose clocks lead make no agreeing record late (DESIGN §4.4),
//! and minutes become final with a silent and a sparse partition (§4.3, §6.1).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::*;
use tally::kafka::read::read_topic;

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const S: i64 = 1_000;
const MIN: i64 = 60 * S;
const DAY: i64 = 24 * 60 * MIN;
/// 1,000 prompt + 500 completion tokens of `small` at the suite's prices, pico-USD.
const SMALL: u128 = 450_000_000;
/// Agreeing records per partition: a record every 100 ms for 5 minutes.
const AGREEING: i64 = 3_000;

/// The input of partition `p`: agreeing producers (disorder inside the 5 s
/// bound) and a leading minority, as `(event time, leads)`.
fn stream(p: i32) -> Vec<(i64, bool)> {
    let agreeing = |i: i64| T10 + i * 100 - (i * 7_919) % 4_000;
    let mut out = Vec::new();
    if p == 3 {
        // A wild first record: a day ahead.
        out.push((T10 + DAY, true));
    }
    for i in 0..AGREEING {
        if p == 2 && i == 1_000 {
            // A burst of 1,000 consecutive records from a host 30 minutes ahead.
            out.extend((0..1_000).map(|k| (T10 + i * 100 + 30 * MIN + k, true)));
        }
        out.push((agreeing(i), false));
        // 5 % interleaved: partition 0 a minute ahead, 1 two and four, 3 a day.
        if i % 20 == 7 {
            let lead = match p {
                0 => Some(MIN),
                1 if i % 40 == 7 => Some(2 * MIN),
                1 => Some(4 * MIN),
                3 => Some(DAY),
                _ => None,
            };
            if let Some(lead) = lead {
                out.push((T10 + i * 100 + lead, true));
            }
        }
    }
    out
}

/// Produces every partition's stream; returns how many records it produced.
fn produce_streams(broker: &DevBroker) -> usize {
    let mut n = 0;
    for p in 0..4 {
        let payloads: Vec<String> = stream(p)
            .iter()
            .enumerate()
            .map(|(k, (ts, _))| event(&format!("p{p}-{k}"), &format!("t{p}"), "small", *ts))
            .collect();
        n += payloads.len();
        produce(broker, "requests", p, &format!("t{p}"), &payloads);
    }
    n
}

/// Requests and cost over the highest version of every window on `topic`.
fn billed(broker: &DevBroker, topic: &str) -> (u64, u128) {
    let mut requests = 0;
    let mut cost = 0;
    for (_, payload) in final_payloads(broker, topic).values() {
        let r: tally::engine::ResultRecord = serde_json::from_slice(payload).unwrap();
        requests += r.requests;
        cost += r.cost_pico.0;
    }
    (requests, cost)
}

/// Leads of 1, 2 and 4 minutes interleaved (5 %), a burst of 1,000 records 30
/// minutes ahead and a wild first record a day ahead followed by 5 % a day ahead:
/// under the defaults no record goes to the late topic and the bill is exact.
/// The same streams under the former default (`max_lead = "5m"`) make hundreds of
/// agreeing records late: the test can fail.
#[test]
fn leading_clocks_make_no_agreeing_record_late_under_the_defaults() {
    let dir = TempDir::new("defaults-lead");
    let d = dir.path();
    let broker = DevBroker::start(&[
        ("requests", 4),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
        ("old-cost", 2),
        ("old.late", 1),
        ("old.dlq", 1),
    ]);
    let n = produce_streams(&broker);
    let cfg = write_config(d, &broker, "lead", "");
    let out = tally_ok(
        &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    let late = read_topic(&broker.kafka(), "requests.late").unwrap();
    let dead = read_topic(&broker.kafka(), "requests.dlq").unwrap();
    assert_eq!(
        (late.len(), dead.len()),
        (0, 0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        billed(&broker, "tenant-cost"),
        (n as u64, n as u128 * SMALL)
    );

    let old = write_config(
        d,
        &broker,
        "old",
        "[topics]\nresults = \"old-cost\"\nlate = \"old.late\"\ndead_letter = \"old.dlq\"\n\
         [watermark]\nmax_lead = \"5m\"\n",
    );
    tally_ok(
        &["run", "--config", old.to_str().unwrap(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    let late = read_topic(&broker.kafka(), "old.late").unwrap().len();
    assert!(
        late > 100,
        "the former default made only {late} records late"
    );
    eprintln!("the former default (max_lead = 5m) made {late} agreeing records late");
}

/// A broker with the default topics, the input in four partitions.
fn four_partitions() -> DevBroker {
    DevBroker::start(&[
        ("requests", 4),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ])
}

/// A live sink and worker under the defaults (group `group`), on a fresh
/// database: `(config, database, sink, worker)`.
fn live(
    d: &std::path::Path,
    broker: &DevBroker,
    group: &str,
) -> (String, String, Service, Service) {
    let cfg = write_config(d, broker, group, "");
    let cfg = cfg.to_str().unwrap().to_string();
    let db = fresh_database(&format!("defaults_{group}"));
    let env = [
        ("TALLY_SINK__DATABASE_URL", db.as_str()),
        ("TALLY_LOG", "info"),
    ];
    let sink = Service::start(
        &["sink", "--config", &cfg],
        &env,
        d.join(format!("{group}-sink.log")),
    );
    let worker = Service::start(
        &["run", "--config", &cfg],
        &env,
        d.join(format!("{group}-worker.log")),
    );
    (cfg, db, sink, worker)
}

/// The minute rows of the invoice view: `(tenant, window_end) → (requests, final)`.
fn minutes(db: &str) -> BTreeMap<(String, i64), (String, String)> {
    try_query(
        db,
        "SELECT tenant_id, window_end::TEXT, requests::TEXT, final::TEXT FROM tenant_cost_minute",
    )
    .unwrap_or_default()
    .into_iter()
    .map(|r| {
        let mut r = r.into_iter().map(Option::unwrap);
        let key = (r.next().unwrap(), r.next().unwrap().parse().unwrap());
        (key, (r.next().unwrap(), r.next().unwrap()))
    })
    .collect()
}

/// Four partitions under the defaults: two dense, one sparse (a record every 6
/// minutes of event time, each leading the last by more than `max_lead`), one
/// silent. Every minute becomes final within the liveness bound (DESIGN §6.1:
/// `idle_timeout` after the partitions go quiet, plus a loop and a sink batch), in
/// the view and in `GET /v1/usage`; a record for a final minute then goes to the
/// late topic and the minute does not change.
#[test]
fn minutes_become_final_under_the_defaults_with_a_silent_and_a_sparse_partition() {
    let dir = TempDir::new("defaults-final");
    let d = dir.path();
    let broker = four_partitions();
    let mut expected: BTreeMap<(String, i64), u64> = BTreeMap::new();
    let mut count = |tenant: &str, ts: i64| {
        *expected
            .entry((tenant.to_string(), (ts.div_euclid(MIN) + 1) * MIN))
            .or_default() += 1;
    };
    for p in 0..2 {
        let payloads: Vec<String> = (0..600)
            .map(|i| {
                let ts = T10 + i * S;
                count("dense", ts);
                event(&format!("d{p}-{i}"), "dense", "small", ts)
            })
            .collect();
        produce(&broker, "requests", p, "dense", &payloads);
    }
    let sparse: Vec<String> = (0..11)
        .map(|i| {
            let ts = T10 + i * 6 * MIN + 7 * S;
            count("sparse", ts);
            event(&format!("s-{i}"), "sparse", "small", ts)
        })
        .collect();
    produce(&broker, "requests", 2, "sparse", &sparse);
    let last_end = *expected.keys().map(|(_, end)| end).max().unwrap();

    let started = Instant::now();
    let (cfg, db, _sink, worker) = live(d, &broker, "fin");
    let cfg = cfg.as_str();
    // The bound: a minute away from the partitions going quiet (they are as soon as
    // the worker has read them), plus the group join, a loop and a sink batch.
    let final_through = wait_until("every minute final", Duration::from_secs(150), || {
        try_query(&db, "SELECT final_through::TEXT FROM tally_final")?
            .first()
            .and_then(|r| r[0].as_ref())
            .map(|v| v.parse::<i64>().unwrap())
            .filter(|f| *f >= last_end)
    });
    let took = started.elapsed();
    assert!(final_through >= last_end);
    let rows = wait_until("every row final", Duration::from_secs(10), || {
        let rows = minutes(&db);
        (rows.len() == expected.len() && rows.values().all(|(_, f)| f == "true")).then_some(rows)
    });
    for (key, (requests, _)) in &rows {
        assert_eq!(requests.parse::<u64>().unwrap(), expected[key], "{key:?}");
    }
    assert!(
        worker
            .log_text()
            .contains("quiet partition: watermark advanced by wall clock"),
        "{}",
        worker.log_text()
    );
    eprintln!("every minute final {took:?} after the worker started");

    // The usage API says so too.
    let (api, addr, key) = crate::usage_api::start_api(d, cfg, &db, "api");
    let (status, body) = api_get(
        &addr,
        &key,
        "/v1/usage?from=2026-01-01T10:00:00Z&to=2026-01-01T11:10:00Z&window=minute&limit=1000",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}\n{}", api.log_text());
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), expected.len(), "{body}");
    assert!(data.iter().all(|r| r["final"] == true), "{body}");

    // A record for a final minute is too late; the minute does not change.
    produce(
        &broker,
        "requests",
        0,
        "dense",
        &[event("after", "dense", "small", T10 + 30 * S)],
    );
    wait_until(
        "the record on the late topic",
        Duration::from_secs(30),
        || {
            let late = read_topic(&broker.kafka(), "requests.late").unwrap();
            late.iter()
                .any(|r| String::from_utf8_lossy(&r.payload).contains("\"after\""))
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(minutes(&db), rows);
}

/// The measured case of issue 34: four partitions of traffic, then one record
/// per partition three days later (a quiet weekend ends). Each closing record
/// leads by far more than `max_lead` and is held; nothing follows it. Under the
/// defaults the minutes before the gap close as soon as the worker has read the
/// closing records (caught up: held times count up to the wall clock), well
/// before `idle_timeout` — in the view, with exact totals.
#[test]
fn the_minutes_before_a_weekend_gap_close_when_the_first_record_after_it_is_read() {
    let dir = TempDir::new("defaults-gap");
    let d = dir.path();
    let broker = four_partitions();
    let mut expected: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for p in 0..4 {
        let tenant = format!("t{p}");
        let payloads: Vec<String> = (0..400)
            .map(|i| {
                let ts = T10 + i * 300;
                *expected
                    .entry((tenant.clone(), (ts.div_euclid(MIN) + 1) * MIN))
                    .or_default() += 1;
                event(&format!("g{p}-{i}"), &tenant, "small", ts)
            })
            .collect();
        produce(&broker, "requests", p, &tenant, &payloads);
    }
    let (_cfg, db, _sink, worker) = live(d, &broker, "gap");
    // The traffic's first minutes close by data; then the weekend ends.
    wait_until("the first minute", Duration::from_secs(60), || {
        minutes(&db)
            .contains_key(&("t0".to_string(), T10 + MIN))
            .then_some(())
    });
    for p in 0..4 {
        let ts = T10 + 3 * DAY;
        produce(
            &broker,
            "requests",
            p,
            &format!("t{p}"),
            &[event(&format!("monday-{p}"), &format!("t{p}"), "small", ts)],
        );
    }
    let read = Instant::now();
    let rows = wait_until(
        "every minute before the gap",
        Duration::from_secs(45),
        || {
            let rows = minutes(&db);
            expected
                .keys()
                .all(|k| rows.contains_key(k))
                .then_some(rows)
        },
    );
    let took = read.elapsed();
    assert!(
        took < Duration::from_secs(50),
        "closed after {took:?}, not by the caught-up rule:\n{}",
        worker.log_text()
    );
    for (key, n) in &expected {
        assert_eq!(rows[key].0.parse::<u64>().unwrap(), *n, "{key:?}");
    }
    assert!(read_topic(&broker.kafka(), "requests.late")
        .unwrap()
        .is_empty());
    eprintln!("the minutes before the gap closed {took:?} after the first records after it");
}
