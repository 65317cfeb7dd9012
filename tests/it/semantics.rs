//! Event-time semantics end to end: allowed lateness, replay determinism, dirty
//! input accounting, idle partitions, re-billing under a higher generation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use tally::engine::{Counters, PaneKind, ResultRecord};
use tally::kafka::headers;
use tally::kafka::read::read_topic;

const T10: i64 = 1_767_261_600_000;
const MIN: i64 = 60_000;

fn large(id: &str, tenant: &str, ts: i64) -> String {
    event(id, tenant, "large", ts)
}

fn totals(state_dir: &Path) -> Counters {
    let report = tally::worker::report::read(state_dir).unwrap();
    let mut c = Counters::default();
    for p in &report.partitions {
        c.add(&p.counters);
    }
    c
}

#[test]
fn seed_burst_with_thirty_seconds_of_lateness_is_billed_to_ten_oclock() {
    let dir = TempDir::new("lateness");
    let broker = DevBroker::start(&[
        ("requests", 2),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(
        dir.path(),
        &broker,
        "late30",
        // The seed's rule: every record moves the watermark (the lead limit off,
        // DESIGN §4.4; seven records would not start the partition under it).
        "[window]\nallowed_lateness = \"30s\"\n[watermark]\nmax_future = \"off\"\nmax_lead = \"off\"\n",
    );
    let story: Vec<String> = [
        ("r-101", 5),
        ("r-102", 20),
        ("r-105", 69),
        ("r-103", 44),
        ("r-104", 52),
        ("r-106", 90),
        ("r-107", 130),
    ]
    .iter()
    .map(|(id, s)| large(id, "acme", T10 + s * 1_000))
    .collect();
    produce(&broker, "requests", 0, "acme", &story);
    tally_ok(
        &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let panes: Vec<_> = results(&broker, "tenant-cost")
        .into_iter()
        .map(|r| (r.window_end, r.usd, r.pane, r.pane_index, r.version))
        .collect();
    let usd = |s: &str| s.to_string();
    assert_eq!(
        panes,
        vec![
            (T10 + MIN, usd("0.200000000000"), PaneKind::OnTime, 0, 2),
            (T10 + MIN, usd("0.300000000000"), PaneKind::Late, 1, 3),
            (T10 + MIN, usd("0.400000000000"), PaneKind::Late, 2, 4),
            (T10 + 2 * MIN, usd("0.200000000000"), PaneKind::OnTime, 0, 2),
            (T10 + 3 * MIN, usd("0.100000000000"), PaneKind::OnTime, 0, 1),
        ]
    );
    assert!(read_topic(&broker.kafka(), "requests.late")
        .unwrap()
        .is_empty());
}

/// Two runs over the same topic from the earliest offset, fresh state, different
/// groups: byte-identical results per source partition — the second under a
/// memory budget so tight that its windows and dedup ids live in RocksDB. The first
/// run's accounting must match what the generator injected, and its totals reach
/// PostgreSQL exactly.
#[test]
fn replays_are_byte_identical_and_dirty_input_is_accounted_exactly() {
    let dir = TempDir::new("replay");
    let broker = DevBroker::start(&[
        ("requests", 4),
        ("results.a", 1),
        ("results.b", 1),
        ("late.a", 1),
        ("late.b", 1),
        ("dlq.a", 1),
        ("dlq.b", 1),
    ]);
    let job = |name: &str| {
        write_config(
            dir.path(),
            &broker,
            name,
            &format!(
                "[topics]\nresults = \"results.{name}\"\nlate = \"late.{name}\"\ndead_letter = \"dlq.{name}\"\n\
                 [window]\nallowed_lateness = \"10s\"\n"
            ),
        )
    };
    let (cfg_a, cfg_b) = (job("a"), job("b"));
    let base = [
        "--count",
        "40000",
        "--tenants",
        "40",
        "--seed",
        "5",
        "--partitions",
        "4",
    ];
    let args: Vec<&str> = base.iter().chain(DIRTY).copied().collect();
    let expected = generate(&cfg_a, dir.path(), "expected", &args);
    for (cfg, budget) in [(&cfg_a, "off"), (&cfg_b, "16KiB")] {
        tally_ok(
            &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
            &[("TALLY_STATE__MEMORY_BUDGET", budget)],
            Duration::from_secs(300),
        );
    }
    let report_b = tally::worker::report::read(&dir.path().join("state-b")).unwrap();
    let cold: u64 = report_b.partitions.iter().map(|p| p.dedup_cold_ids).sum();
    let reads: u64 = report_b.partitions.iter().map(|p| p.dedup_cold_reads).sum();
    assert!(
        cold > 10_000 && reads > 100,
        "run b moved {cold} dedup ids out of memory and read {reads} back"
    );
    assert_eq!(
        totals(&dir.path().join("state-b")),
        totals(&dir.path().join("state-a"))
    );
    let by_partition = |topic: &str| {
        let mut m: BTreeMap<i64, Vec<Vec<u8>>> = BTreeMap::new();
        for r in read_topic(&broker.kafka(), topic).unwrap() {
            let v: serde_json::Value = serde_json::from_slice(&r.payload).unwrap();
            m.entry(v["source_partition"].as_i64().unwrap())
                .or_default()
                .push(r.payload);
        }
        m
    };
    let (a, b) = (by_partition("results.a"), by_partition("results.b"));
    assert_eq!(a.len(), 4);
    for (p, pa) in &a {
        let pb = &b[p];
        let at = pa.iter().zip(pb).position(|(x, y)| x != y);
        let show = |v: Option<&Vec<u8>>| v.map(|v| String::from_utf8_lossy(v).into_owned());
        assert!(
            at.is_none() && pa.len() == pb.len(),
            "partition {p}: results differ between replays at {at:?} ({} vs {} records): {:?} vs {:?}",
            pa.len(),
            pb.len(),
            show(at.and_then(|i| pa.get(i))),
            show(at.and_then(|i| pb.get(i))),
        );
    }
    // Side outputs interleave partitions on their topic; per source partition they are identical too.
    let late = |t: &str| {
        let mut m: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
        for r in read_topic(&broker.kafka(), t).unwrap() {
            let source = r.header(headers::SOURCE).unwrap();
            m.entry(source.rsplit_once('/').unwrap().0.to_string())
                .or_default()
                .push(r.payload);
        }
        m
    };
    assert_eq!(late("late.a"), late("late.b"));

    // Accounting of the first run against what the generator injected.
    let c = totals(&dir.path().join("state-a"));
    let dead: u64 = expected.dead_letters.values().sum();
    assert_eq!(c.consumed, expected.records);
    assert_eq!(c.too_late, expected.too_late.len() as u64);
    assert_eq!(c.duplicate, expected.duplicates);
    assert_eq!(c.dead_letter, dead);
    assert!(c.balanced());
    assert!(expected.too_late.len() > 100 && expected.duplicates > 300 && dead > 100);
    let late_ids: BTreeSet<String> = read_topic(&broker.kafka(), "late.a")
        .unwrap()
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.payload).unwrap()["request_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let want_ids: BTreeSet<String> = expected
        .too_late
        .iter()
        .map(|l| l.request_id.clone())
        .collect();
    assert_eq!(late_ids, want_ids);
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    for d in read_topic(&broker.kafka(), "dlq.a").unwrap() {
        *reasons
            .entry(d.header(headers::ERROR).unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(reasons, expected.dead_letters);

    // Totals in PostgreSQL.
    let db = fresh_database("replay");
    tally_ok(
        &["sink", "--config", cfg_a.to_str().unwrap(), "--until-end"],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(300),
    );
    let view = view_rows(&db);
    let want = expected_rows(&expected);
    assert_eq!(view, want);

    // Re-bill under generation 2 with a corrected price: the view follows the new table.
    let fixed = dir.path().join("gen2.toml");
    let text = std::fs::read_to_string(&cfg_a)
        .unwrap()
        .replace("input_per_1k = \"0.003\"", "input_per_1k = \"0.0025\"");
    std::fs::write(
        &fixed,
        format!(
            "{}\n[job]\ngeneration = 2\n",
            text.replace("group_id = \"a\"", "group_id = \"a2\"")
                .replace("state-a", "state-a2")
        ),
    )
    .unwrap();
    let unused = dir.path().join("unused.jsonl");
    let mut offline = args.clone();
    offline.extend(["--output-file", unused.to_str().unwrap()]);
    let expected2 = generate(&fixed, dir.path(), "expected2", &offline);
    assert_ne!(
        expected2.windows, expected.windows,
        "the price fix must change some totals"
    );
    // Generation 2 writes to the same results topic the sink reads (results.a).
    tally_ok(
        &["run", "--config", fixed.to_str().unwrap(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    tally_ok(
        &["sink", "--config", cfg_a.to_str().unwrap(), "--until-end"],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(300),
    );
    let view2 = view_rows(&db);
    let want2 = expected_rows(&expected2);
    assert_eq!(view2, want2);
    let gens = query(
        &db,
        "SELECT DISTINCT generation::TEXT FROM tenant_cost_partial",
    );
    assert_eq!(gens, vec![vec![Some("2".to_string())]]);
}

/// Partition 0 sees one event at 10:00:30 and then nothing; partition 1 flows for
/// five minutes of event time. Partition 1's windows close on time regardless; with
/// idleness on, partition 0's window closes after its silence.
#[test]
fn a_silent_partition_never_holds_back_another_and_idleness_closes_its_windows() {
    let dir = TempDir::new("idle");
    let broker = DevBroker::start(&[
        ("requests", 2),
        ("results.off", 1),
        ("results.on", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    produce(
        &broker,
        "requests",
        0,
        "quiet",
        &[large("q-1", "quiet", T10 + 30_000)],
    );
    let flow: Vec<String> = (0..300)
        .map(|i| large(&format!("b-{i}"), "busy", T10 + i * 1_000))
        .collect();
    produce(&broker, "requests", 1, "busy", &flow);

    let wait_for =
        |topic: &str, what: &dyn Fn(&[ResultRecord]) -> bool, worker: &mut std::process::Child| {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let r = results(&broker, topic);
                if what(&r) {
                    return r;
                }
                assert!(worker.try_wait().unwrap().is_none(), "worker exited");
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting on {topic}: {r:?}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        };
    let spawn = |name: &str, idle: &str| {
        let cfg = write_config(
            dir.path(),
            &broker,
            name,
            &format!("[topics]\nresults = \"results.{name}\"\n[watermark]\nidle_timeout = \"{idle}\"\nmax_future = \"off\"\n"),
        );
        std::process::Command::new(tally_bin())
            .args(["run", "--config", cfg.to_str().unwrap()])
            .env("TALLY_LOG", "warn")
            .spawn()
            .unwrap()
    };

    // Idleness off: busy's four complete minutes close; quiet's window stays open.
    let mut off = spawn("off", "off");
    let r = wait_for(
        "results.off",
        &|r| r.iter().filter(|p| p.tenant_id == "busy").count() >= 4,
        &mut off,
    );
    std::thread::sleep(Duration::from_secs(2));
    let r2 = results(&broker, "results.off");
    assert!(
        r2.iter()
            .all(|p| p.tenant_id == "busy" && p.source_partition == 1),
        "{r2:?}"
    );
    assert!(r.iter().all(|p| p.pane == PaneKind::OnTime));
    signal(off.id(), libc::SIGTERM);
    assert!(off.wait().unwrap().success());

    // Idleness 1 s: quiet's window closes after its silence, as an on-time pane.
    let mut on = spawn("on", "1s");
    let r = wait_for(
        "results.on",
        &|r| r.iter().any(|p| p.tenant_id == "quiet"),
        &mut on,
    );
    let quiet: Vec<_> = r.iter().filter(|p| p.tenant_id == "quiet").collect();
    assert_eq!(
        (quiet[0].window_end, quiet[0].requests, quiet[0].pane),
        (T10 + MIN, 1, PaneKind::OnTime)
    );
    signal(on.id(), libc::SIGTERM);
    assert!(on.wait().unwrap().success());
    let report = tally::worker::report::read(&dir.path().join("state-on")).unwrap();
    let p0 = report
        .partitions
        .iter()
        .find(|p| p.partition.0 == 0)
        .unwrap();
    assert!(
        p0.idle_advances >= 1,
        "the forced advance is recorded: {p0:?}"
    );
    let delays = tally_ok(
        &[
            "delays",
            "--config",
            dir.path().join("on.toml").to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(30),
    );
    let table = String::from_utf8_lossy(&delays.stdout);
    assert!(
        table.contains("recommended watermark.max_out_of_orderness"),
        "{table}"
    );
}
