//! A live pipeline changed without a rebuild (issue 16): compatible price changes
//! at a restart, and a watermark one producer's bad clock cannot hijack — end to
//! end on the dev broker.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use tally::kafka::read::read_topic;

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const MIN: i64 = 60_000;

fn topics(extra: &[&'static str]) -> Vec<(&'static str, i32)> {
    let mut t = vec![
        ("requests", 2),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ];
    t.extend(extra.iter().map(|n| (*n, 2)));
    t
}

/// `write_config`, with `prices` appended after the suite's price table.
fn config_with(dir: &Path, broker: &DevBroker, group: &str, name: &str, prices: &str) -> String {
    let base = write_config(dir, broker, group, "");
    let path = dir.join(format!("{name}.toml"));
    let text = std::fs::read_to_string(base).unwrap() + prices;
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn event_at(i: usize, model: &str, ts: i64) -> (i32, String) {
    let tenant = format!("t{}", i % 10);
    ((i % 2) as i32, event(&format!("r-{i}"), &tenant, model, ts))
}

/// Adding a model and a schedule entry effective after everything already billed
/// restores without a refusal, and the results equal, byte for byte, a replay from
/// the log start under the new table; an entry before that is refused by name.
#[test]
fn a_future_price_change_restores_and_equals_a_replay_under_the_new_table() {
    let dir = TempDir::new("evolve");
    let broker = DevBroker::start(&topics(&["replay-cost", "replay-late", "replay-dlq"]));
    let old = config_with(dir.path(), &broker, "evolve", "old", "");
    let future = "[[prices.small.schedule]]\neffective_from = \"2026-01-01T00:15:00Z\"\n\
                  input_per_1k = \"0.0003\"\noutput_per_1k = \"0.0012\"\n\
         [prices.newmodel]\neffective_from = \"2026-01-01T01:12:00+01:00\"\n\
         input_per_1k = \"0.001\"\noutput_per_1k = \"0.002\"\n";
    let new = config_with(dir.path(), &broker, "evolve", "new", future);
    let retro = config_with(
        dir.path(),
        &broker,
        "evolve",
        "retro",
        "[[prices.small.schedule]]\neffective_from = \"2026-01-01T00:05:00Z\"\n\
         input_per_1k = \"0.0003\"\noutput_per_1k = \"0.0012\"\n",
    );
    // The oracle: the new table, by completed_ts (1000 prompt, 500 completion tokens).
    let cost = |model: &str, ts: i64| -> u128 {
        match model {
            "small" if ts >= T0 + 15 * MIN => 1000 * 300_000 + 500 * 1_200_000,
            "small" => 1000 * 150_000 + 500 * 600_000,
            "medium" => 1000 * 3_000_000 + 500 * 15_000_000,
            "newmodel" => 1000 * 1_000_000 + 500 * 2_000_000,
            m => panic!("{m}"),
        }
    };
    let mut all: Vec<(String, i64)> = Vec::new();
    let mut first = Vec::new();
    for i in 0..4_000 {
        let ts = T0 + i as i64 * 150; // the first ten minutes
        let model = if i % 3 == 0 { "medium" } else { "small" };
        first.push(event_at(i, model, ts));
        all.push((model.into(), ts));
    }
    produce_to_partitions(&broker, &first);
    tally_ok(
        &["run", "--config", &old, "--until-end"],
        &[],
        Duration::from_secs(300),
    );

    // A price from 00:05 would re-price records already billed: refused, by key.
    let refused = tally(
        &["run", "--config", &retro, "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(
        refused.status.code() == Some(3)
            && log.contains("`prices.small` effective_from 2026-01-01T00:05:00.000Z was added")
            && log.contains("already priced records up to 2026-01-01T00:09:59"),
        "{log}"
    );

    // `config check` says so before a restart, the same way.
    let check = tally(
        &["config", "check", "--config", &new],
        &[],
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success()
            && text.contains("partition 0: restores from chk-")
            && text.contains("compatible change: `prices.newmodel` effective_from 2026-01-01T00:12:00.000Z added"),
        "{text}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let check = tally(
        &["config", "check", "--config", &retro],
        &[],
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.code() == Some(3)
            && text.contains("REFUSED")
            && text.contains("`prices.small`"),
        "{text}"
    );

    let mut second = Vec::new();
    for i in 4_000..8_000 {
        let ts = T0 + i as i64 * 150; // 00:10 to 00:20
        let model = match i % 3 {
            0 if ts >= T0 + 12 * MIN => "newmodel",
            0 => "medium",
            _ => "small",
        };
        second.push(event_at(i, model, ts));
        all.push((model.into(), ts));
    }
    produce_to_partitions(&broker, &second);
    let out = tally_ok(
        &["run", "--config", &new, "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("restoring across a compatible config change")
            && log.contains("`prices.newmodel` effective_from 2026-01-01T00:12:00.000Z added"),
        "{log}"
    );

    // The same records, replayed from the log start under the new table alone.
    let state = dir.path().join("state-replay");
    let checkpoints = dir.path().join("checkpoints-replay");
    tally_ok(
        &["run", "--config", &new, "--until-end"],
        &[
            ("TALLY_KAFKA__GROUP_ID", "replay"),
            ("TALLY_TOPICS__RESULTS", "replay-cost"),
            ("TALLY_TOPICS__LATE", "replay-late"),
            ("TALLY_TOPICS__DEAD_LETTER", "replay-dlq"),
            ("TALLY_STATE__DIR", state.to_str().unwrap()),
            ("TALLY_CHECKPOINT__DIR", checkpoints.to_str().unwrap()),
        ],
        Duration::from_secs(300),
    );
    // Going back to the old table now would un-price billed newmodel records.
    let check = tally(
        &["config", "check", "--config", &old],
        &[],
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.code() == Some(3)
            && text
                .contains("`prices.newmodel` effective_from 2026-01-01T00:12:00.000Z was removed"),
        "{text}"
    );

    let live = final_payloads(&broker, "tenant-cost");
    let replay = final_payloads(&broker, "replay-cost");
    assert!(live.len() >= 20 * 10, "{} windows", live.len());
    assert!(live == replay, "the live results differ from the replay");
    let billed: u128 = live
        .values()
        .map(|(_, p)| {
            let r: tally::engine::ResultRecord = serde_json::from_slice(p).unwrap();
            r.cost_pico.0
        })
        .sum();
    let oracle: u128 = all.iter().map(|(m, ts)| cost(m, *ts)).sum();
    assert_eq!(billed, oracle, "totals exact against the new schedule");
    assert!(read_topic(&broker.kafka(), "requests.dlq")
        .unwrap()
        .is_empty());
}

/// One partition: 95 % of the records from producers whose clocks agree within
/// the bound, 5 % from one whose clock leads by `lead`.
fn skewed(lead: i64, micros_at: Option<usize>) -> (Vec<String>, u128) {
    let mut records = Vec::new();
    let mut total = 0u128;
    let mut jitter = tally::gen::Rng::new(7);
    for i in 0..20_000usize {
        let mut ts = T0 + i as i64 * 100 + (jitter.below(4_000) as i64 - 2_000);
        if i % 20 == 7 {
            ts += lead;
        }
        if Some(i) == micros_at {
            ts *= 1_000;
        }
        let model = if i % 2 == 0 { "small" } else { "medium" };
        total += if i % 2 == 0 {
            450_000_000
        } else {
            10_500_000_000
        };
        records.push(event(&format!("r-{i}"), &format!("t{}", i % 7), model, ts));
    }
    (records, total)
}

fn held(dir: &Path, group: &str) -> u64 {
    let text = std::fs::read_to_string(dir.join(format!("state-{group}/report.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["held"].as_u64().unwrap())
        .sum()
}

/// The skewed-clock partition: with the default lead limit no record of the
/// agreeing producers is late, every window bills exactly and each leading record
/// is billed once (and counted as held); without the limit the same input makes
/// the agreeing producers late. A record in microseconds with `max_future = "off"`
/// does not make the partition late either.
#[test]
fn one_producer_with_a_fast_clock_cannot_make_the_others_late() {
    for (lead, limit, micros) in [
        (10 * MIN, true, None),
        (45 * MIN, true, None),
        (10 * MIN, false, None),
        (0, true, Some(9_001)),
    ] {
        let dir = TempDir::new("skew");
        let broker = DevBroker::start(&[
            ("requests", 1),
            ("tenant-cost", 1),
            ("requests.late", 1),
            ("requests.dlq", 1),
        ]);
        let lead_key = if limit { "" } else { "max_lead = \"off\"\n" };
        let cfg = write_config(
            dir.path(),
            &broker,
            "skew",
            &format!(
                "[window]\nallowed_lateness = \"30s\"\n[watermark]\nmax_future = \"off\"\n{lead_key}"
            ),
        );
        let (records, total) = skewed(lead, micros);
        produce(&broker, "requests", 0, "k", &records);
        tally_ok(
            &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
            &[],
            Duration::from_secs(300),
        );
        let late = read_topic(&broker.kafka(), "requests.late").unwrap().len();
        let what = format!("lead {lead} ms, limit {limit}, micros {micros:?}");
        if !limit {
            assert!(late > 1_000, "{what}: the control is hijacked: {late} late");
            continue;
        }
        assert_eq!(late, 0, "{what}");
        assert!(read_topic(&broker.kafka(), "requests.dlq")
            .unwrap()
            .is_empty());
        let finals = final_payloads(&broker, "tenant-cost");
        let (requests, billed) = finals.values().fold((0u64, 0u128), |(n, c), (_, p)| {
            let r: tally::engine::ResultRecord = serde_json::from_slice(p).unwrap();
            (n + r.requests, c + r.cost_pico.0)
        });
        assert_eq!((requests, billed), (20_000, total), "{what}");
        let want = if micros.is_some() { 1 } else { 1_000 };
        assert_eq!(held(dir.path(), "skew"), want, "{what}");
    }
}

/// The next offset `report.json` of the worker in `state` shows for partition 0.
fn next_offset(state: &Path) -> i64 {
    std::fs::read_to_string(state.join("report.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["partitions"][0]["next_offset"].as_i64())
        .unwrap_or(-1)
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGHUP reloads the price table of a running worker while records flow: a
/// schedule entry effective after what it has priced applies from its time on,
/// and the bill is exact against the schedule; an entry in the past is refused
/// and changes nothing.
#[test]
fn sighup_reloads_the_price_table_under_load() {
    let dir = TempDir::new("hup");
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(dir.path(), &broker, "hup", "");
    let state = dir.path().join("state-hup");
    let records = |from: usize, n: usize| -> Vec<String> {
        (from..from + n)
            .map(|i| {
                event(
                    &format!("r-{i}"),
                    &format!("t{}", i % 5),
                    "small",
                    T0 + i as i64 * 10,
                )
            })
            .collect()
    };
    produce(&broker, "requests", 0, "k", &records(0, 3_000));
    let mut worker =
        tally::devtools::support::spawn_worker(Path::new(tally_bin()), &cfg, &state, &[]).unwrap();
    wait_until("the first records", || next_offset(&state) == 3_000);
    let log = || std::fs::read_to_string(state.with_extension("log")).unwrap_or_default();
    let base = std::fs::read_to_string(&cfg).unwrap();
    let entry = |from: &str| {
        format!(
            "{base}[[prices.small.schedule]]\neffective_from = \"{from}\"\n\
             input_per_1k = \"0.0003\"\noutput_per_1k = \"0.0012\"\n"
        )
    };
    // In the past (00:00:10, the worker priced up to 00:00:29.99): refused.
    std::fs::write(&cfg, entry("2026-01-01T00:00:10Z")).unwrap();
    signal(worker.id(), libc::SIGHUP);
    wait_until("the refusal", || log().contains("PRICE RELOAD REFUSED"));
    // Under load: records flow (00:00:30 on, 100 per 100 ms) while the worker
    // reloads an entry effective at 00:01:15.
    let producer = {
        let bootstrap = broker.kafka();
        let batch2 = records(3_000, 9_000);
        std::thread::spawn(move || {
            use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
            let p: BaseProducer =
                tally::kafka::client_config(&bootstrap, tally::kafka::PRODUCER_DEFAULTS)
                    .create()
                    .unwrap();
            for chunk in batch2.chunks(100) {
                for r in chunk {
                    p.send(BaseRecord::to("requests").partition(0).key("k").payload(r))
                        .unwrap();
                }
                p.flush(Duration::from_secs(30)).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    wait_until("records flowing", || next_offset(&state) >= 4_000);
    std::fs::write(&cfg, entry("2026-01-01T00:01:15Z")).unwrap();
    signal(worker.id(), libc::SIGHUP);
    wait_until("the reload", || {
        log().contains("price table reloaded (SIGHUP)")
    });
    assert!(
        next_offset(&state) < 3_000 + 4_500,
        "the reload came after 00:01:15 was reached; the test cannot tell anything"
    );
    producer.join().unwrap();
    wait_until("every record", || next_offset(&state) == 12_000);
    signal(worker.id(), libc::SIGTERM);
    assert!(worker.wait().unwrap().success(), "{}", log());
    // The windows still open: the same worker state, to the end of input.
    tally_ok(
        &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[("TALLY_STATE__DIR", state.to_str().unwrap())],
        Duration::from_secs(300),
    );
    let billed: u128 = final_payloads(&broker, "tenant-cost")
        .values()
        .map(|(_, p)| {
            let r: tally::engine::ResultRecord = serde_json::from_slice(p).unwrap();
            r.cost_pico.0
        })
        .sum();
    let at = T0 + 75_000;
    let oracle: u128 = (0..12_000i64)
        .map(|i| match T0 + i * 10 >= at {
            true => 1000 * 300_000 + 500 * 1_200_000,
            false => 1000 * 150_000 + 500 * 600_000,
        })
        .sum();
    assert_eq!(billed, oracle, "exact against the schedule");
}
