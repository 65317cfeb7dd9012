//! Several workers in one consumer group (docs/DESIGN.md §9): the chaos run in short, and a
//! zombie that wakes up after its partitions moved.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::*;
use tally::devtools::chaos::ChaosReport;
use tally::gen::Expected;

/// The acceptance chaos run, short: 3 workers over 12 partitions, at least 5
/// SIGKILLs, checkpoints on the test S3 server.
#[test]
fn chaos_run_with_kills_is_exact() {
    let db = std::env::var("TALLY_TEST_PG_URL").expect("TALLY_TEST_PG_URL: run scripts/test.sh");
    let dir = TempDir::new("chaos-report");
    let json = dir.path().join("chaos.json");
    let out = run_to_end(
        tally_dev_bin(),
        &[
            "chaos",
            "--database-url",
            &db,
            "--duration",
            "80s",
            "--rate",
            "800",
            "--kill-min",
            "8s",
            "--kill-max",
            "12s",
            "--min-kills",
            "5",
            "--json",
            json.to_str().unwrap(),
            "--s3-endpoint",
            &s3_endpoint(),
        ],
        &[],
        Duration::from_secs(600),
    );
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let r: ChaosReport = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(out.status.success(), "{r:?}");
    assert_eq!(
        (r.lost_windows, r.double_counted_windows, r.extra_windows),
        (0, 0, 0),
        "{r:?}"
    );
    assert_eq!(r.records_consumed, r.records_expected);
    assert_eq!(r.too_late, r.too_late_injected);
    assert_eq!(r.dead_letters, r.dead_letters_injected);
    assert_eq!(r.duplicates, r.duplicates_injected);
    assert!(r.kills >= 5 && r.audit_balanced && r.exact, "{r:?}");
}

/// Workers join and leave while a backlog drains: each rebalance finds chunks the
/// poll thread prepared ahead of the loop, which must be neither lost nor applied
/// after the partitions' new owners read them again.
#[test]
fn rebalances_while_a_backlog_drains_lose_and_double_nothing() {
    let dir = TempDir::new("drain-rebalance");
    let broker = broker(32);
    let cfg = write_config(dir.path(), &broker, "drain", "");
    let c = cfg.to_str().unwrap();
    let expected = generate(
        &cfg,
        dir.path(),
        "expected",
        &[
            "--count",
            // ~12,500 records a partition: under the dev broker's 5 MiB each.
            "400000",
            "--tenants",
            "320",
            "--seed",
            "31",
            "--partitions",
            "32",
            "--duplicate-fraction",
            "0.01",
            "--malformed-fraction",
            "0.005",
        ],
    );
    let consumed = |state: &Path| -> u64 {
        tally::worker::report::read(state)
            .map(|r| r.partitions.iter().map(|p| p.counters.consumed).sum())
            .unwrap_or(0)
    };
    let states: Vec<_> = (0..3).map(|i| dir.path().join(format!("w{i}"))).collect();
    // The loop applies a chunk every 50 ms at most, so the poll thread is ahead of
    // it, its queue full, whenever a rebalance comes. (At 10 ms a debug build's
    // poll thread, which parses and prices each chunk, was about as slow as the
    // loop: one clean-clone run in three met no queued chunk.)
    let slow = [("TALLY_PAUSE_AT", "apply_chunk:50")];
    let mut workers = vec![spawn_worker_with(&cfg, &states[0], &slow)];
    wait_for("the first worker to be draining", &|| {
        consumed(&states[0]) > 0
    });
    workers.push(spawn_worker_with(&cfg, &states[1], &slow));
    wait_for("the second worker to own partitions", &|| {
        !owned(&states[1]).is_empty()
    });
    workers.push(spawn_worker_with(&cfg, &states[2], &slow));
    wait_for("the third worker to own partitions", &|| {
        !owned(&states[2]).is_empty()
    });
    signal(workers[1].id(), libc::SIGTERM);
    assert!(workers[1].wait().unwrap().success(), "graceful stop failed");
    std::thread::sleep(Duration::from_secs(3));
    for i in [0, 2] {
        signal(workers[i].id(), libc::SIGTERM);
        assert!(workers[i].wait().unwrap().success(), "graceful stop failed");
    }
    let logs: String = states
        .iter()
        .map(|s| std::fs::read_to_string(s.with_extension("log")).unwrap())
        .collect();
    assert!(
        logs.contains("records polled before a rebalance are left to the partition's owner"),
        "no rebalance met prepared chunks; the test did not exercise them:\n{logs}"
    );
    let report = finish_from_checkpoints(c, dir.path());
    let total = |f: fn(&tally::engine::Counters) -> u64| -> u64 {
        report.partitions.iter().map(|p| f(&p.counters)).sum()
    };
    assert_eq!(total(|c| c.consumed), expected.records);
    assert_eq!(total(|c| c.duplicate), expected.duplicates);
    assert_eq!(
        total(|c| c.dead_letter),
        expected.dead_letters.values().sum::<u64>()
    );
    let db = fresh_database("drain");
    tally_ok(
        &["sink", "--config", c, "--until-end"],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(300),
    );
    assert_eq!(view_rows(&db), expected_rows(&expected));
}

/// Whatever the workers left, a bounded run finishes from their checkpoints (in
/// `dir/final`); its report.
fn finish_from_checkpoints(cfg: &str, dir: &Path) -> tally::metrics::WorkerReport {
    let state = dir.join("final");
    tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[("TALLY_STATE__DIR", state.to_str().unwrap())],
        Duration::from_secs(300),
    );
    tally::worker::report::read(&state).unwrap()
}

/// A dev broker with `requests` input partitions and two of each output topic.
fn broker(requests: i32) -> DevBroker {
    DevBroker::start(&[
        ("requests", requests),
        ("tenant-cost", 2),
        ("requests.late", 2),
        ("requests.dlq", 2),
    ])
}

fn spawn_worker(cfg: &Path, state: &Path) -> Child {
    spawn_worker_with(cfg, state, &[])
}

fn spawn_worker_with(cfg: &Path, state: &Path, envs: &[(&str, &str)]) -> Child {
    tally::devtools::support::spawn_worker(Path::new(tally_bin()), cfg, state, envs)
        .expect("spawning a worker")
}

fn owned(state: &Path) -> Vec<i32> {
    tally::worker::report::read(state)
        .map(|r| r.partitions.iter().map(|p| p.partition.0).collect())
        .unwrap_or_default()
}

/// SIGSTOP a worker past its session timeout, let the others take over, SIGCONT it:
/// no stale data anywhere, totals exact — with the checkpoints on S3.
#[test]
fn a_zombie_worker_cannot_corrupt_anything() {
    let dir = TempDir::new("zombie");
    let broker = broker(6);
    let cfg = write_config(
        dir.path(),
        &broker,
        "zombie",
        "[window]\nallowed_lateness = \"10s\"\n",
    );
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"6000\"", "\"3000\"\n\"heartbeat.interval.ms\" = \"500\"");
    std::fs::write(&cfg, text).unwrap();
    // The zombie and the live workers share one S3 store: conditional writes keep
    // the zombie from replacing anything.
    use_s3(&cfg, "zombie");
    let c = cfg.to_str().unwrap();
    let expected_path = dir.path().join("expected.json");
    let gen_args = [
        "gen",
        "--config",
        c,
        "--count",
        "24000",
        "--tenants",
        "24",
        "--seed",
        "21",
        "--partitions",
        "6",
        "--late-fraction",
        "0.01",
        "--duplicate-fraction",
        "0.02",
        "--malformed-fraction",
        "0.01",
    ];
    let offline = dir.path().join("offline.jsonl");
    let mut args = gen_args.to_vec();
    args.extend([
        "--output-file",
        offline.to_str().unwrap(),
        "--expected-file",
        expected_path.to_str().unwrap(),
    ]);
    tally_ok(&args, &[], Duration::from_secs(120));
    let expected: Expected =
        serde_json::from_slice(&std::fs::read(&expected_path).unwrap()).unwrap();
    let mut gen = Command::new(tally_bin())
        .args(gen_args)
        .args(["--rate", "1500"])
        .env("TALLY_LOG", "warn")
        .spawn()
        .unwrap();

    let states: Vec<_> = (0..3).map(|i| dir.path().join(format!("w{i}"))).collect();
    let mut workers: Vec<Child> = states.iter().map(|s| spawn_worker(&cfg, s)).collect();
    wait_for("all three workers to own partitions", &|| {
        states.iter().all(|s| !owned(s).is_empty())
    });
    let zombie_parts = owned(&states[0]);
    signal(workers[0].id(), libc::SIGSTOP);
    // The survivors take over the frozen worker's partitions.
    wait_for("the survivors to take over", &|| {
        let held: Vec<i32> = owned(&states[1])
            .into_iter()
            .chain(owned(&states[2]))
            .collect();
        zombie_parts.iter().all(|p| held.contains(p))
    });
    signal(workers[0].id(), libc::SIGCONT);
    assert!(gen.wait().unwrap().success());
    std::thread::sleep(Duration::from_secs(5));
    for w in workers.iter_mut() {
        signal(w.id(), libc::SIGTERM);
        assert!(w.wait().unwrap().success(), "graceful stop failed");
    }
    // The zombie was fenced: its offset commits after waking were rejected, or it
    // found its partitions gone; either way it logged it.
    let zlog = std::fs::read_to_string(states[0].with_extension("log")).unwrap();
    assert!(
        zlog.contains("revoked") || zlog.contains("offset commit failed"),
        "{zlog}"
    );

    tally_ok(
        &["checkpoints", "verify", "--config", c],
        &[],
        Duration::from_secs(60),
    );
    let report = finish_from_checkpoints(c, dir.path());
    let db = fresh_database("zombie");
    tally_ok(
        &["sink", "--config", c, "--until-end"],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(300),
    );
    let view = view_rows(&db);
    let want = expected_rows(&expected);
    assert_eq!(view, want);
    let consumed: u64 = report.partitions.iter().map(|p| p.counters.consumed).sum();
    assert_eq!(consumed, expected.records);
}

fn wait_for(what: &str, cond: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Static membership under the KIP-848 group protocol: two workers restarted by a
/// supervisor (SIGTERM, start again under the same `group.instance.id`) get their
/// own partitions back, and the third worker's assignment never moves.
#[test]
fn static_members_regain_their_partitions_without_moving_the_others() {
    let dir = TempDir::new("static");
    let broker = broker(12);
    let cfg = write_config(dir.path(), &broker, "static", "");
    // Under KIP-848 the session timeout is the broker's (dev-broker: 6 s).
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "\"session.timeout.ms\" = \"6000\"",
        "\"group.protocol\" = \"consumer\"",
    );
    std::fs::write(&cfg, text).unwrap();
    let expected = generate(
        &cfg,
        dir.path(),
        "gen",
        &["--count", "12000", "--tenants", "12", "--partitions", "12"],
    );

    let states: Vec<_> = (0..3).map(|i| dir.path().join(format!("s{i}"))).collect();
    let ids = ["s0", "s1", "s2"];
    let start = |i: usize| {
        spawn_worker_with(
            &cfg,
            &states[i],
            &[("TALLY_KAFKA__GROUP_INSTANCE_ID", ids[i])],
        )
    };
    let mut workers: Vec<Child> = (0..3).map(start).collect();
    let settled = || {
        let mut all: Vec<i32> = states.iter().flat_map(|s| owned(s)).collect();
        all.sort_unstable();
        states.iter().all(|s| !owned(s).is_empty()) && all == (0..12).collect::<Vec<_>>()
    };
    wait_for("the three members to split the 12 partitions", &settled);
    std::thread::sleep(Duration::from_secs(3));
    assert!(settled(), "the assignment kept moving");
    let before: Vec<Vec<i32>> = states.iter().map(|s| owned(s)).collect();
    let third_log = states[2].with_extension("log");
    let third_log_len = std::fs::read_to_string(&third_log).unwrap().len();

    for w in workers.iter_mut().take(2) {
        signal(w.id(), libc::SIGTERM);
        assert!(w.wait().unwrap().success(), "graceful stop failed");
    }
    for s in &states[..2] {
        std::fs::remove_file(s.join("report.json")).unwrap();
    }
    workers[0] = start(0);
    workers[1] = start(1);
    wait_for("the restarted members to own partitions again", &|| {
        states[..2].iter().all(|s| !owned(s).is_empty())
    });
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<Vec<i32>> = states.iter().map(|s| owned(s)).collect();
    assert_eq!(
        after, before,
        "static members must regain exactly their partitions"
    );
    let third = std::fs::read_to_string(&third_log).unwrap();
    let since = &third[third_log_len..];
    assert!(
        !since.contains("revoked") && !since.contains("assigned"),
        "the third worker's assignment moved:\n{since}"
    );
    // Restored, not replayed: the audit counters over all partitions are exact.
    wait_for("every record consumed exactly once", &|| {
        let consumed: u64 = states
            .iter()
            .filter_map(|s| tally::worker::report::read(s).ok())
            .flat_map(|r| r.partitions)
            .map(|p| p.counters.consumed)
            .sum();
        consumed == expected.records
    });
    for w in workers.iter_mut() {
        signal(w.id(), libc::SIGTERM);
        assert!(w.wait().unwrap().success(), "graceful stop failed");
    }
}
