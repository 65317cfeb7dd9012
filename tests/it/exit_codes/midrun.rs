//! Row `4`'s "… or any of them failed mid-run", for Kafka: the broker goes away
//! inside a rebalance restore, under a timed checkpoint, under a revoke's
//! hand-over checkpoint — and what a failed checkpoint leaves in the store.
//!
//! A producer flush fails only when something is in flight: so the worker is slowed
//! (`TALLY_PAUSE_AT=apply_chunk:100`, ~5,000 records/s) over a backlog of records
//! that each make a dead letter, the broker goes while the backlog is prefetched,
//! and the dead letters of the records applied after that wait in the producer
//! until `message.timeout.ms` (3 s here).

use std::time::{Duration, Instant};

use super::*;

/// Kafka goes away while the worker is in the rebalance callback, before it reads
/// the assigned partitions' log ranges and committed offsets (`rebalance_assign`).
/// Those reads fail: a dependency is unavailable (4, restart me), not a refusal
/// (3, an operator must act).
#[test]
fn kafka_lost_during_a_rebalance_restore_exits_4() {
    let dir = TempDir::new("exit-assign");
    let broker = DevBroker::start(TOPICS);
    let cfg = job_config(dir.path(), &broker, "assign", SESSION, "", "1s");
    let mut w = worker(
        dir.path(),
        &cfg,
        &[("TALLY_PAUSE_AT", "rebalance_assign:2000")],
    );
    wait_log(&mut w, &["pause point: sleeping", "rebalance_assign"]);
    broker.kill();
    let killed = Instant::now();
    let status = w.wait_exit(Duration::from_secs(90));
    let log = w.log_text();
    eprintln!("exit {status} {:?} after the kill", killed.elapsed());
    let last = error_line(&log);
    assert_eq!(status.code(), Some(4), "{last}\n{}", tail(&log, 20));
    assert!(
        last.contains("committed offsets") || last.contains("log range"),
        "{last}"
    );
}

/// The producer cannot deliver what a timed checkpoint must flush (step 2): the
/// broker is gone; the checkpoint fails, and the worker exits 4. The session
/// timeout is 30 s, so no revoke (and no hand-over checkpoint) can come first.
#[test]
fn a_failed_flush_at_a_timed_checkpoint_exits_4() {
    let mut r = backlog_worker("timed", "500ms", "30000", Fault::Kill);
    let status = r.w.wait_exit(Duration::from_secs(90));
    eprintln!("exit {status} {:?} after the kill", r.at.elapsed());
    let log = r.w.log_text();
    let last = error_line(&log);
    assert_eq!(status.code(), Some(4), "{last}\n{}", tail(&log, 20));
    assert!(
        last.contains("flushing the outputs at the checkpoint barrier")
            && last.contains("not delivered"),
        "{last}"
    );
}

/// The hand-over checkpoint of a revoke cannot flush: the broker is gone, the
/// session times out (6 s), librdkafka revokes the partitions (lost), and the
/// revoke's checkpoint finds the dead letters applied since the kill undelivered.
/// No timed checkpoint comes first (the interval is 1 h). (A SIGTERM would not do:
/// it takes its final checkpoint outside the callback, and the revoke when leaving
/// the group has nothing left to checkpoint.)
#[test]
fn a_failed_flush_at_a_revoke_checkpoint_exits_4() {
    let mut r = backlog_worker("revoke", "1h", "6000", Fault::Kill);
    let status = r.w.wait_exit(Duration::from_secs(90));
    eprintln!("exit {status} {:?} after the kill", r.at.elapsed());
    let log = r.w.log_text();
    let last = error_line(&log);
    assert_eq!(status.code(), Some(4), "{last}\n{}", tail(&log, 20));
    assert!(
        last.contains("flushing the outputs at the checkpoint barrier")
            && last.contains("not delivered"),
        "{last}"
    );
    assert!(
        log.contains("Consumer group session timed out") && log.contains(" revoked"),
        "no revoke:\n{}",
        tail(&log, 20)
    );
}

/// "A worker that exits 1 or 4 in the middle of a run loses nothing", with a
/// broker that stops answering (frozen: SIGSTOP) rather than refusing: a timed
/// checkpoint's flush fails, and
/// - the worker exits 4 while the broker is still frozen (within 30 s), not
///   waiting for it for ever;
/// - no checkpoint covers a record whose output was not delivered — the next start
///   would resume after it, and its dead letter would be lost. Once the worker is
///   gone the broker runs again (SIGCONT) and is read: every record before the
///   newest checkpoint's offset must have its dead letter on the DLQ topic.
#[test]
fn after_a_failed_flush_no_checkpoint_covers_an_undelivered_output() {
    let mut r = backlog_worker("frozen", "500ms", "30000", Fault::Freeze);
    let frozen = wait_until("the exit or 30 s", Duration::from_secs(31), || {
        let gone = r.w.exited().is_some() || r.at.elapsed() > Duration::from_secs(30);
        gone.then_some(r.w.exited())
    });
    r.broker.resume();
    let status = r.w.wait_exit(Duration::from_secs(60));
    let log = r.w.log_text();
    let last = error_line(&log);
    eprintln!(
        "exit {status} {:?} after the freeze; exited while frozen: {}",
        r.at.elapsed(),
        frozen.is_some()
    );
    let cfg = tally::config::Config::load(Some(&r.cfg)).unwrap();
    let store = tally::checkpoint::store::CheckpointStore::open_existing(&cfg.checkpoint, "frozen")
        .unwrap();
    let newest = store
        .list()
        .unwrap()
        .into_iter()
        .filter_map(|l| l.manifest.and_then(Result::ok))
        .max_by_key(|m| m.id.0)
        .expect("a complete checkpoint");
    let covered = newest.partitions[0].next_offset.0;
    let delivered: std::collections::BTreeSet<i64> =
        tally::kafka::read::read_topic(&r.broker.kafka(), "requests.dlq")
            .unwrap()
            .iter()
            .map(|rec| {
                let source = rec.header(tally::kafka::headers::SOURCE).unwrap();
                source.rsplit('/').next().unwrap().parse().unwrap()
            })
            .collect();
    let lost: Vec<i64> = (0..covered).filter(|o| !delivered.contains(o)).collect();
    eprintln!(
        "newest checkpoint {}: offset {covered}; dead letters delivered: {}; covered but lost: {}",
        newest.id.0,
        delivered.len(),
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "checkpoint {} covers offsets up to {covered}, but {} of their dead letters were \
         never delivered (first {:?}); {last}\n{}",
        newest.id.0,
        lost.len(),
        &lost[..lost.len().min(5)],
        tail(&log, 12)
    );
    assert_eq!(
        frozen.and_then(|s| s.code()),
        Some(4),
        "{last}\n{}",
        tail(&log, 20)
    );
}

/// The session timeout of the assign test (`write_config`'s).
const SESSION: &str = "6000";

enum Fault {
    Kill,
    Freeze,
}

/// A worker whose broker went, the broker, the worker's config, and when.
struct Running {
    w: Service,
    broker: DevBroker,
    cfg: std::path::PathBuf,
    at: Instant,
    _dir: TempDir,
}

/// A worker (group `tag`) over 30,000 records that are each a dead letter, slowed
/// to ~5,000 records/s, its checkpoint interval `interval`, its session timeout
/// `session` ms; the broker is killed or frozen once it is a second into the
/// backlog (after its first checkpoint with the partition when the interval is
/// short).
fn backlog_worker(tag: &str, interval: &str, session: &str, fault: Fault) -> Running {
    let dir = TempDir::new(&format!("exit-flush-{tag}"));
    let broker = DevBroker::start(TOPICS);
    let poison: Vec<String> = (0..30_000).map(|i| format!("not json {i}")).collect();
    produce(&broker, "requests", 0, "t", &poison);
    let mut kafka = String::from("\"message.timeout.ms\" = \"3000\"\n");
    if let Fault::Freeze = fault {
        // Nothing answers a frozen broker: requests in flight time out too.
        kafka.push_str("\"socket.timeout.ms\" = \"3000\"\n\"request.timeout.ms\" = \"3000\"\n");
    }
    let cfg = job_config(dir.path(), &broker, tag, session, &kafka, interval);
    let mut w = worker(dir.path(), &cfg, &[("TALLY_PAUSE_AT", "apply_chunk:100")]);
    wait_log(&mut w, &["assigned"]);
    if interval == "1h" {
        std::thread::sleep(Duration::from_millis(1000));
    } else {
        wait_log(&mut w, &["checkpoint complete", "offsets=0:"]);
    }
    assert!(
        !w.log_text().contains("reached the log end"),
        "the backlog was done before the fault"
    );
    match fault {
        Fault::Kill => broker.kill(),
        Fault::Freeze => broker.freeze(),
    }
    Running {
        w,
        broker,
        cfg,
        at: Instant::now(),
        _dir: dir,
    }
}
