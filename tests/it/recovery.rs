//! Checkpoints and recovery on the real services: a SIGKILL at every named crash
//! point, random kills during a continuous run, damaged checkpoints, and the
//! refusals that keep a worker from guessing.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use tally::gen::Expected;
use tally::kafka::read::read_topic;

const TOPICS: &[(&str, i32)] = &[
    ("requests", 4),
    ("tenant-cost", 2),
    ("requests.late", 2),
    ("requests.dlq", 2),
];

pub(crate) struct Job {
    pub(crate) dir: TempDir,
    pub(crate) broker: DevBroker,
    pub(crate) cfg: PathBuf,
}

impl Job {
    pub(crate) fn new(tag: &str) -> Job {
        let dir = TempDir::new(tag);
        let broker = DevBroker::start(TOPICS);
        let cfg = write_config(
            dir.path(),
            &broker,
            "job",
            "[window]\nallowed_lateness = \"10s\"\n",
        );
        // A short interval so crash points are reached many times within the run.
        // A short session timeout so a killed member leaves the group quickly.
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("interval = \"1s\"", "interval = \"100ms\"")
            .replace(
                "\"session.timeout.ms\" = \"6000\"",
                "\"session.timeout.ms\" = \"3000\"\n\"heartbeat.interval.ms\" = \"500\"",
            );
        std::fs::write(&cfg, text).unwrap();
        Job { dir, broker, cfg }
    }

    /// `new`, with the checkpoints on the test S3 server.
    pub(crate) fn on_s3(tag: &str) -> Job {
        let job = Job::new(tag);
        use_s3(&job.cfg, tag);
        job
    }

    fn checkpoint_store(&self) -> tally::checkpoint::store::CheckpointStore {
        let cfg = tally::config::Config::load(Some(&self.cfg)).unwrap();
        tally::checkpoint::store::CheckpointStore::open_existing(&cfg.checkpoint, "job").unwrap()
    }

    pub(crate) fn cfg(&self) -> &str {
        self.cfg.to_str().unwrap()
    }

    pub(crate) fn generate(&self, count: u32, rate: Option<u32>) -> (Expected, Option<Child>) {
        let expected = self.dir.path().join("expected.json");
        let args: Vec<String> = [
            "gen",
            "--config",
            self.cfg(),
            "--count",
            &count.to_string(),
            "--tenants",
            "30",
            "--seed",
            "3",
            "--late-fraction",
            "0.01",
            "--duplicate-fraction",
            "0.02",
            "--malformed-fraction",
            "0.01",
            "--partitions",
            "4",
            "--expected-file",
            expected.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(r) = rate {
            // The expected totals do not depend on the rate: compute them offline,
            // and produce in the background at the given rate.
            let mut live: Vec<String> = args[..args.len() - 2].to_vec();
            live.extend(["--rate".to_string(), r.to_string()]);
            let child = Command::new(tally_bin())
                .args(&live)
                .env("TALLY_LOG", "warn")
                .spawn()
                .unwrap();
            let offline = self.dir.path().join("offline.jsonl");
            let mut off = args.clone();
            off.extend([
                "--output-file".to_string(),
                offline.to_str().unwrap().to_string(),
            ]);
            let off_refs: Vec<&str> = off.iter().map(String::as_str).collect();
            tally_ok(&off_refs, &[], Duration::from_secs(120));
            let e: Expected = serde_json::from_slice(&std::fs::read(&expected).unwrap()).unwrap();
            return (e, Some(child));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        tally_ok(&refs, &[], Duration::from_secs(300));
        (
            serde_json::from_slice(&std::fs::read(&expected).unwrap()).unwrap(),
            None,
        )
    }

    pub(crate) fn spawn_worker(&self, envs: &[(&str, &str)]) -> Child {
        Command::new(tally_bin())
            .args(["run", "--config", self.cfg()])
            .envs(envs.iter().copied())
            .env("TALLY_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Runs to the end without faults, applies the results to a fresh database and
    /// checks everything against the generator's expectation.
    pub(crate) fn finish_and_check(&self, expected: &Expected) {
        tally_ok(
            &["run", "--config", self.cfg(), "--until-end"],
            &[],
            Duration::from_secs(300),
        );
        let db = fresh_database("rec");
        tally_ok(
            &["sink", "--config", self.cfg(), "--until-end"],
            &[("TALLY_SINK__DATABASE_URL", &db)],
            Duration::from_secs(300),
        );
        self.check_db(&db, expected);
    }

    /// Sinks the results topic into a fresh database and checks it against
    /// `expected`.
    pub(crate) fn sink_and_check(&self, tag: &str, expected: &Expected) {
        let db = fresh_database(tag);
        tally_ok(
            &["sink", "--config", self.cfg(), "--until-end"],
            &[("TALLY_SINK__DATABASE_URL", &db)],
            Duration::from_secs(300),
        );
        self.check_db(&db, expected);
    }

    pub(crate) fn check_db(&self, db: &str, expected: &Expected) {
        let view = view_rows(db);
        let want = expected_rows(expected);
        assert_eq!(view.len(), want.len());
        assert_eq!(view, want, "invoice lines differ from the expected totals");
        // Every too-late event is on the late topic (duplicates allowed after a crash).
        let late: BTreeSet<String> = read_topic(&self.broker.kafka(), "requests.late")
            .unwrap()
            .iter()
            .map(|r| {
                serde_json::from_slice::<serde_json::Value>(&r.payload).unwrap()["request_id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let want_late: BTreeSet<String> = expected
            .too_late
            .iter()
            .map(|l| l.request_id.clone())
            .collect();
        assert_eq!(late, want_late);
        // Every dead letter is on the DLQ topic, each source record once or more
        // (copies after a crash), none missing, none extra: the set of sources has
        // exactly as many members as the generator injected, per reason.
        let mut dead: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for r in read_topic(&self.broker.kafka(), "requests.dlq").unwrap() {
            let reason = r.header(tally::kafka::headers::ERROR).unwrap().to_string();
            let source = r.header(tally::kafka::headers::SOURCE).unwrap().to_string();
            dead.entry(reason).or_default().insert(source);
        }
        let dead: BTreeMap<String, u64> =
            dead.into_iter().map(|(k, v)| (k, v.len() as u64)).collect();
        assert_eq!(dead, expected.dead_letters, "the dead-letter set");
        // The audit balances and counts every record exactly once, across the crash.
        let report = tally::worker::report::read(&self.dir.path().join("state-job")).unwrap();
        let mut c = tally::engine::Counters::default();
        for p in &report.partitions {
            assert!(p.counters.balanced(), "{p:?}");
            c.add(&p.counters);
        }
        assert_eq!(c.consumed, expected.records);
        assert_eq!(
            (c.too_late, c.duplicate),
            (expected.too_late.len() as u64, expected.duplicates)
        );
        assert_eq!(c.dead_letter, expected.dead_letters.values().sum::<u64>());
    }
}

pub(crate) fn wait_killed(child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(
                status.signal(),
                Some(9),
                "{what}: expected a SIGKILL at the crash point, got {status}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the crash point was never reached"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// On the S3 store, one job killed at every crash point of the checkpoint in
/// turn — inside the upload too (after the first data object, after every part
/// before the manifest, after the manifest before the offset commit) — then run
/// to the end: exact totals, exact late and dead-letter sets.
#[test]
fn on_s3_a_kill_at_every_crash_point_loses_and_doubles_nothing() {
    let job = Job::on_s3("s3crash");
    let (expected, _) = job.generate(60_000, None);
    for point in [
        "before_barrier",
        "after_flush",
        "mid_upload",
        "before_manifest",
        "after_manifest",
        "after_offset_commit",
        "mid_pane_burst",
    ] {
        let spec = format!("{point}:2");
        let mut w = job.spawn_worker(&[("TALLY_CRASH_AT", spec.as_str())]);
        wait_killed(&mut w, point);
    }
    let store = job.checkpoint_store();
    assert!(
        store.location().starts_with("s3://tally/s3crash"),
        "{}",
        store.location()
    );
    assert!(store.verify().unwrap().is_empty());
    job.finish_and_check(&expected);
}

/// A part on S3 replaced from outside: `checkpoints verify` names it, and the
/// next run restores from the checkpoint before it — the totals stay exact.
#[test]
fn on_s3_a_damaged_object_is_reported_and_fallen_back_from() {
    let job = Job::on_s3("s3damage");
    let (expected, _) = job.generate(20_000, None);
    let mut w = job.spawn_worker(&[("TALLY_CRASH_AT", "after_offset_commit:4")]);
    wait_killed(&mut w, "after_offset_commit");
    let store = job.checkpoint_store();
    let newest = store
        .list()
        .unwrap()
        .into_iter()
        .rfind(|l| matches!(l.manifest, Some(Ok(_))))
        .expect("a complete checkpoint");
    // A part of a delta: the newest checkpoint builds on earlier ones.
    let manifest = newest.manifest.as_ref().unwrap().as_ref().unwrap();
    let delta = manifest
        .partitions
        .iter()
        .find(|e| {
            e.segments.len() > 1
                && matches!(
                    e.segments.last().unwrap().kind,
                    tally::checkpoint::SegmentKind::Delta { .. }
                )
        })
        .expect("the fourth checkpoint of a run holds a delta");
    let key = tally::checkpoint::names::part_key(&newest.name, delta.partition, 0);
    let part = newest.objects.iter().find(|o| o.key == key).unwrap();
    // Replaced from outside (as a bucket admin or a bad lifecycle tool could).
    store.objects().delete(&part.key).unwrap();
    store
        .objects()
        .put_new(&part.key, b"TALLYPRT\0\x03damaged")
        .unwrap();
    let verify = tally(
        &["checkpoints", "verify", "--config", job.cfg()],
        &[],
        Duration::from_secs(60),
    );
    let report = String::from_utf8_lossy(&verify.stdout);
    assert!(
        !verify.status.success(),
        "verify must fail on damage: {report}"
    );
    assert!(
        report.contains("DAMAGED") && report.contains(&part.key),
        "{report}"
    );
    let run = tally_ok(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    assert!(String::from_utf8_lossy(&run.stderr).contains("RESTORED FROM AN OLDER CHECKPOINT"));
    job.sink_and_check("s3damage", &expected);
}

fn crash_at(point: &str) {
    let job = Job::new(point);
    let (expected, _) = job.generate(60_000, None);
    let spec = format!("{point}:3");
    let mut w = job.spawn_worker(&[("TALLY_CRASH_AT", spec.as_str())]);
    wait_killed(&mut w, point);
    job.finish_and_check(&expected);
}

#[test]
fn crash_before_the_barrier() {
    crash_at("before_barrier");
}

#[test]
fn crash_after_the_producer_flush() {
    crash_at("after_flush");
}

#[test]
fn crash_after_the_first_data_object_of_the_upload() {
    crash_at("mid_upload");
}

#[test]
fn crash_after_every_part_before_the_manifest() {
    crash_at("before_manifest");
}

#[test]
fn crash_after_the_manifest_before_the_offset_commit() {
    crash_at("after_manifest");
}

#[test]
fn crash_after_the_offset_commit() {
    crash_at("after_offset_commit");
}

#[test]
fn crash_in_the_middle_of_a_burst_of_panes() {
    crash_at("mid_pane_burst");
}

#[test]
fn crash_in_the_sink_between_insert_and_commit() {
    let job = Job::new("sink-crash");
    let (expected, _) = job.generate(30_000, None);
    tally_ok(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    let db = fresh_database("sinkcrash");
    let env = [
        ("TALLY_SINK__DATABASE_URL", db.as_str()),
        ("TALLY_CRASH_AT", "sink_before_commit:1"),
    ];
    let out = tally(
        &["sink", "--config", job.cfg(), "--until-end"],
        &env,
        Duration::from_secs(300),
    );
    assert_eq!(
        out.status.signal(),
        Some(9),
        "the sink did not crash at its crash point"
    );
    tally_ok(
        &["sink", "--config", job.cfg(), "--until-end"],
        &env[..1],
        Duration::from_secs(300),
    );
    job.check_db(&db, &expected);
}

/// One worker, SIGKILLed at least 10 times at random moments while traffic flows.
#[test]
fn ten_random_kills_during_a_continuous_run_lose_and_double_nothing() {
    let job = Job::new("random-kill");
    let (expected, gen) = job.generate(40_000, Some(4_000));
    let mut gen = gen.unwrap();
    let mut rng = tally::gen::Rng::new(0xC0FFEE);
    let mut kills = 0;
    let report = job.dir.path().join("state-job").join("report.json");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    while kills < 10 {
        let before = mtime(&report);
        let mut w = job.spawn_worker(&[]);
        // Kill while it works: after it owns partitions and completed a checkpoint.
        let deadline = Instant::now() + Duration::from_secs(60);
        while mtime(&report) == before {
            assert!(
                Instant::now() < deadline,
                "the worker never completed a checkpoint"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(rng.below(1_000)));
        if let Some(status) = w.try_wait().unwrap() {
            panic!("worker exited on its own: {status}");
        }
        w.kill().unwrap();
        w.wait().unwrap();
        kills += 1;
    }
    assert!(gen.wait().unwrap().success());
    job.finish_and_check(&expected);
}

fn newest_checkpoint(root: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("job"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("MANIFEST").exists())
        .collect();
    dirs.sort();
    dirs.pop().expect("no complete checkpoint")
}

#[test]
fn a_damaged_checkpoint_falls_back_to_the_previous_one_and_verify_reports_it() {
    let job = Job::new("corrupt");
    let (expected, _) = job.generate(20_000, None);
    // Crash mid-run so the newest checkpoint is not the end of the data.
    let mut w = job.spawn_worker(&[("TALLY_CRASH_AT", "after_offset_commit:4")]);
    wait_killed(&mut w, "after_offset_commit");
    let root = job.dir.path().join("checkpoints");
    tally_ok(
        &["checkpoints", "verify", "--config", job.cfg()],
        &[],
        Duration::from_secs(60),
    );
    let newest = newest_checkpoint(&root);
    for f in std::fs::read_dir(&newest)
        .unwrap()
        .map(|e| e.unwrap().path())
    {
        if f.file_name().is_some_and(|n| n != "MANIFEST") {
            let mut bytes = std::fs::read(&f).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xFF;
            std::fs::write(&f, bytes).unwrap();
        }
    }
    let verify = tally(
        &["checkpoints", "verify", "--config", job.cfg()],
        &[],
        Duration::from_secs(60),
    );
    assert!(!verify.status.success(), "verify must fail on damage");
    let report = String::from_utf8_lossy(&verify.stdout);
    assert!(
        report.contains("DAMAGED")
            && report.contains(newest.file_name().unwrap().to_str().unwrap()),
        "{report}"
    );
    let list = tally_ok(
        &["checkpoints", "list", "--config", job.cfg()],
        &[],
        Duration::from_secs(60),
    );
    assert!(
        String::from_utf8_lossy(&list.stdout)
            .matches("chk-")
            .count()
            >= 2
    );

    let run = tally_ok(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    assert!(String::from_utf8_lossy(&run.stderr).contains("RESTORED FROM AN OLDER CHECKPOINT"));
    job.sink_and_check("corrupt", &expected);
}

#[test]
fn missing_checkpoints_or_a_changed_config_are_refused_with_a_way_out() {
    let job = Job::new("refuse");
    let (expected, _) = job.generate(10_000, None);
    tally_ok(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );

    // A changed price table: the checkpoint was computed under other rules.
    let changed = tally(
        &["run", "--config", job.cfg(), "--until-end"],
        &[("TALLY_PRICES__SMALL__INPUT_PER_1K", "0.0002")],
        Duration::from_secs(120),
    );
    let log = String::from_utf8_lossy(&changed.stderr);
    assert!(
        changed.status.code() == Some(3) && log.contains("another configuration"),
        "a refusal exits 3: {log}"
    );

    // Checkpoints gone while the group has committed offsets.
    std::fs::remove_dir_all(job.dir.path().join("checkpoints")).unwrap();
    let gone = tally(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let log = String::from_utf8_lossy(&gone.stderr);
    assert!(
        gone.status.code() == Some(3)
            && log.contains("no checkpoint")
            && log.contains("--reset-state earliest"),
        "{log}"
    );

    // The documented way out rebuilds from the log start; the totals are still exact.
    tally_ok(
        &[
            "run",
            "--config",
            job.cfg(),
            "--until-end",
            "--reset-state",
            "earliest",
        ],
        &[],
        Duration::from_secs(300),
    );
    job.sink_and_check("refuse", &expected);
}

/// A worker on one partition, a topic the dev broker truncates (it keeps the newest
/// 5 MiB of each partition, like `retention.bytes`).
struct Retention {
    dir: TempDir,
    broker: DevBroker,
    cfg: PathBuf,
    produced: i64,
}

impl Retention {
    fn new() -> Self {
        let dir = TempDir::new("retention");
        let broker = DevBroker::start(&[
            ("requests", 1),
            ("tenant-cost", 1),
            ("requests.late", 1),
            ("requests.dlq", 1),
        ]);
        let cfg = write_config(dir.path(), &broker, "ret", "");
        // A long session timeout: the pause below must not cost the assignment, so
        // the worker meets the gap while running, not at a restore.
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("\"6000\"", "\"30000\"");
        std::fs::write(&cfg, text).unwrap();
        Retention {
            dir,
            broker,
            cfg,
            produced: 0,
        }
    }

    pub(crate) fn cfg(&self) -> &str {
        self.cfg.to_str().unwrap()
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state-ret")
    }

    /// `n` valid, distinct, in-order events, uncompressed (so they fill the log).
    fn produce(&mut self, n: i64) {
        produce_filling(&self.broker, self.produced, n, 1_767_225_600_000);
        self.produced += n;
    }

    /// The broker's `(log start, log end)` of the input partition.
    fn log_range(&self) -> (i64, i64) {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = tally::kafka::client_config(&self.broker.kafka(), &[])
            .create()
            .unwrap();
        c.fetch_watermarks("requests", 0, Duration::from_secs(10))
            .unwrap()
    }

    /// The newest complete checkpoint's entry for partition 0.
    fn checkpointed(&self) -> Option<tally::checkpoint::PartitionEntry> {
        let cfg = tally::config::CheckpointConfig {
            dir: self.dir.path().join("checkpoints"),
            ..Default::default()
        };
        let store = tally::checkpoint::store::CheckpointStore::open_existing(&cfg, "ret").ok()?;
        store
            .list()
            .ok()?
            .into_iter()
            .filter_map(|l| l.manifest.and_then(Result::ok))
            .filter_map(|m| m.entry(tally::model::Partition(0)).cloned())
            .max_by_key(|e| e.next_offset)
    }

    /// A worker in the background; the previous run's report is removed first, so
    /// a report seen later is this worker's.
    fn spawn(&self, log: &str, extra: &[&str]) -> Child {
        let _ = std::fs::remove_file(self.state().join(tally::worker::report::REPORT_FILE));
        let log = std::fs::File::create(self.dir.path().join(log)).unwrap();
        Command::new(tally_bin())
            .args(["run", "--config", self.cfg()])
            .args(extra)
            .env("TALLY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap()
    }

    /// Lets `worker` read the log to its end and checkpoint there, then freezes it
    /// while `n` more records push the oldest out of the log; returns the new log
    /// start, after waking the worker.
    fn pause_past_retention(&mut self, worker: &Child, n: i64) -> i64 {
        let end = self.produced;
        wait_until(
            "the worker to own the partition and reach the log end",
            || {
                tally::worker::report::read(&self.state())
                    .is_ok_and(|r| r.partitions.first().is_some_and(|p| p.next_offset.0 == end))
            },
        );
        wait_until("a checkpoint at the log end", || {
            self.checkpointed().is_some_and(|e| e.next_offset.0 == end)
        });
        signal(worker.id(), libc::SIGSTOP);
        self.produce(n);
        let (low, high) = self.log_range();
        assert_eq!(high, self.produced);
        assert!(low > end, "retention deleted nothing: log starts at {low}");
        signal(worker.id(), libc::SIGCONT);
        low
    }
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "{what} did not exit");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 19, defect 0: a worker that falls behind retention must never skip the
/// deleted records silently. It refuses, naming the partition and the offsets;
/// `--allow-truncated-log` accepts the gap, which the report, the checkpoint and
/// the offset audit account for exactly — while running and at a restore.
#[test]
fn records_deleted_before_tally_read_them_are_refused_or_accepted_as_a_counted_gap() {
    let mut job = Retention::new();
    job.produce(1_000);

    // Running: the worker wakes up behind the log start and refuses.
    let mut worker = job.spawn("w1.log", &[]);
    let low = job.pause_past_retention(&worker, 120_000);
    let status = wait_exit(&mut worker, "the lagging worker");
    let log = job.log("w1.log");
    assert_eq!(status.code(), Some(3), "a refusal exits 3: {log}");
    assert!(
        log.contains("partition requests/0: offsets ")
            && log.contains(&format!("..{low} ("))
            && log.contains("fell behind the log start while running")
            && log.contains("--allow-truncated-log"),
        "{log}"
    );
    // Nothing was skipped: the newest checkpoint still resumes before the gap.
    assert_eq!(job.checkpointed().unwrap().next_offset.0, 1_000);

    // A plain restart refuses again, at the restore.
    let again = tally(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "partition requests/0: offsets 1000..{low} ({} records) were deleted",
            low - 1_000
        )) && log.contains(&format!(
            "the checkpoint resumes at offset 1000 but the log now starts at {low}"
        )),
        "{log}"
    );

    // Accepted at the restore: exact counts, in the report and in the checkpoint.
    tally_ok(
        &[
            "run",
            "--config",
            job.cfg(),
            "--until-end",
            "--allow-truncated-log",
        ],
        &[],
        Duration::from_secs(300),
    );
    let gap1 = (low - 1_000) as u64;
    let report = tally::worker::report::read(&job.state()).unwrap();
    let p = &report.partitions[0];
    assert_eq!(p.next_offset.0, 121_000);
    assert_eq!(p.offsets.gap_offsets, gap1);
    assert_eq!(p.offsets.empty_offsets, 0);
    assert_eq!(p.counters.consumed, 121_000 - gap1);
    assert_eq!(p.counters.folded, p.counters.consumed);
    assert!(report.balanced());
    let entry = job.checkpointed().unwrap();
    assert_eq!(entry.next_offset.0, 121_000);
    assert_eq!(entry.offsets.gap_offsets, gap1);
    assert_eq!(
        entry
            .offsets
            .gaps
            .iter()
            .map(|g| (g.from, g.to))
            .collect::<Vec<_>>(),
        vec![(1_000, low)]
    );
    // Billed: exactly the records the broker still had, plus the first 1,000.
    let mut latest = std::collections::BTreeMap::new();
    for r in results(&job.broker, "tenant-cost") {
        let e = latest
            .entry((r.tenant_id.clone(), r.window_end))
            .or_insert(r.clone());
        if r.version > e.version {
            *e = r;
        }
    }
    let billed: u64 = latest.values().map(|r| r.requests).sum();
    assert_eq!(billed, 121_000 - gap1);

    // Accepted while running: the worker jumps the gap, says so, and goes on.
    let mut worker = job.spawn("w2.log", &["--allow-truncated-log"]);
    let low2 = job.pause_past_retention(&worker, 120_000);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !tally::worker::report::read(&job.state())
        .is_ok_and(|r| r.partitions[0].next_offset.0 == 241_000)
    {
        let log = job.log("w2.log");
        assert!(
            Instant::now() < deadline,
            "the worker did not read to the log end:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(worker.id(), libc::SIGTERM);
    assert!(wait_exit(&mut worker, "the worker").success());
    let log = job.log("w2.log");
    assert!(
        log.contains("ACCEPTED GAP")
            && log.contains(&format!("to={low2}"))
            && log.contains("fell behind the log start while running"),
        "{log}"
    );
    let report = tally::worker::report::read(&job.state()).unwrap();
    let p = &report.partitions[0];
    let gaps = &p.offsets.gaps;
    assert_eq!(gaps.len(), 2, "{gaps:?}");
    assert!(gaps[1].from >= 121_000 && gaps[1].to == low2, "{gaps:?}");
    assert_eq!(p.offsets.gap_offsets, gap1 + gaps[1].len());
    assert_eq!(p.counters.consumed + p.offsets.gap_offsets, 241_000);
    assert!(report.balanced());
    assert_eq!(job.checkpointed().unwrap().offsets, p.offsets);
}
