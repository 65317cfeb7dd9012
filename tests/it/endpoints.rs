//! Issue 13, item 6: the service endpoints of a worker on `metrics.listen` —
//! readiness follows the group join and the restore, an idle connection does not
//! hold up a scrape, unknown paths are 404, and the consumer lag is read off a
//! backlog the worker has not consumed yet. Issue 34, item 6: the lag is true
//! when scraped, also while the worker loop is held.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// The value of the sample `name{labels}` in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn readiness_idle_connections_404_and_consumer_lag() {
    const N: u64 = 40_000;
    let dir = TempDir::new("endpoints");
    let d = dir.path();
    // A 3 s initial rebalance delay keeps the worker "joining" long enough to see it.
    let broker = Broker::start_with(
        Path::new(tally_bin()),
        &[
            ("requests", 1),
            ("tenant-cost", 1),
            ("requests.late", 1),
            ("requests.dlq", 1),
        ],
        &["--initial-rebalance-delay".as_ref(), "3s".as_ref()],
    )
    .unwrap();
    // Small fetches: the backlog drains over seconds, not milliseconds.
    let cfg = d.join("w.toml");
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\nbootstrap_servers = \"{}\"\ngroup_id = \"ep\"\n\
             \"max.partition.fetch.bytes\" = \"20000\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n\
             [checkpoint]\ndir = \"{}/cp\"\ninterval = \"1s\"\n[state]\ndir = \"{}/state\"\n{PRICES}",
            broker.bootstrap,
            d.display(),
            d.display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    tally_ok(
        &[
            "gen",
            "--config",
            cfg,
            "--count",
            &N.to_string(),
            "--partitions",
            "1",
        ],
        &[],
        Duration::from_secs(300),
    );
    let mut worker = Command::new(tally_bin())
        .args(["run", "--config", cfg])
        .env("TALLY_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("worker.log")).unwrap())
        .spawn()
        .unwrap();
    let addr = bound_addr(&d.join("worker.log"), METRICS_SERVING);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut saw_503, mut ready_at) = (None, None);
    let lag = "tally_consumer_lag_records{partition=\"0\"}";
    let mut max_lag = 0.0f64;
    while ready_at.is_none() && Instant::now() < deadline {
        match http_get(&addr, "/readyz") {
            Some((503, body)) => saw_503 = Some(body),
            Some((200, _)) => ready_at = Some(Instant::now()),
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Ready means restored, and the report published with it carries the
    // backlog (the log end seen at assignment minus the restored position);
    // later ones follow the fetches.
    if let Some((200, text)) = http_get(&addr, "/metrics") {
        max_lag = max_lag.max(sample(&text, lag).unwrap_or(0.0));
    }
    let log = || std::fs::read_to_string(d.join("worker.log")).unwrap_or_default();
    let saw_503 = saw_503.unwrap_or_else(|| panic!("never 503 before ready:\n{}", log()));
    // The last answer before 200 is the join (3 s) or the restore, not "starting".
    assert!(
        saw_503 == "not ready: joining the consumer group\n"
            || saw_503.starts_with("not ready: restoring"),
        "{saw_503}"
    );
    assert!(ready_at.is_some(), "never ready:\n{}", log());
    // Ready once the assignment (and its restore) is done; its log line follows.
    let logged = Instant::now() + Duration::from_secs(5);
    while !log().contains("assigned") && Instant::now() < logged {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        log().contains("assigned"),
        "ready without an assignment:\n{}",
        log()
    );

    // An idle connection (connects, sends nothing) does not hold up other requests.
    let _idle = TcpStream::connect(&addr).unwrap();
    let t = Instant::now();
    assert_eq!(http_get(&addr, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(&addr, "/nope").map(|r| r.0), Some(404));
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "a scrape waited {:?}",
        t.elapsed()
    );

    // The lag is seen while the backlog drains, and is 0 once it is consumed.
    let mut consumed = 0.0;
    let done = "tally_records_total{partition=\"0\",route=\"consumed\"}";
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some((200, text)) = http_get(&addr, "/metrics") {
            max_lag = max_lag.max(sample(&text, lag).unwrap_or(0.0));
            consumed = sample(&text, done).unwrap_or(0.0);
            if consumed as u64 == N && sample(&text, lag) == Some(0.0) {
                last = text;
                break;
            }
            last = text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(consumed as u64, N, "{last}");
    assert_eq!(sample(&last, lag), Some(0.0), "{last}");
    assert!(
        max_lag > 0.0 && max_lag <= N as f64,
        "lag never seen: max {max_lag}\n{last}"
    );
    assert!(last.contains("tally_build_info{"), "{last}");

    signal(worker.id(), libc::SIGTERM);
    assert!(worker.wait().unwrap().success(), "{}", log());
}

/// Issue 34, item 6: `tally_consumer_lag_records` is computed when scraped (the
/// log end librdkafka last fetched minus the position the loop last applied), so
/// it is true while the loop is held. The loop is held by the pause point
/// `apply_chunk` (every chunk waits `PAUSE_MS` with the worker's state locked):
/// the first record arrives, the loop holds its chunk, the rest arrive; a scrape
/// then reads all `N`, with none consumed yet, and the lag drains to 0 after.
#[test]
fn consumer_lag_is_true_while_the_loop_is_held() {
    const N: usize = 25;
    const PAUSE_MS: u64 = 6_000;
    let dir = TempDir::new("lag-held");
    let d = dir.path();
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(d, &broker, "lag", "[metrics]\nlisten = \"127.0.0.1:0\"");
    let pause = format!("apply_chunk:{PAUSE_MS}");
    let worker = Service::start(
        &["run", "--config", cfg.to_str().unwrap()],
        &[("TALLY_LOG", "info"), ("TALLY_PAUSE_AT", &pause)],
        d.join("worker.log"),
    );
    let addr = bound_addr(&worker.log, METRICS_SERVING);
    let lag = "tally_consumer_lag_records{partition=\"0\"}";
    let consumed = "tally_records_total{partition=\"0\",route=\"consumed\"}";
    let scrape = || {
        let text = http_get(&addr, "/metrics").filter(|r| r.0 == 200)?.1;
        Some((sample(&text, lag), sample(&text, consumed), text))
    };
    // Caught up on the empty topic.
    wait_until("lag 0 on the empty topic", Duration::from_secs(60), || {
        scrape().filter(|(l, _, _)| *l == Some(0.0))
    });
    // Nothing held or queued: the pauses of the start (chunks that carry only
    // the consumer's positions) are over, and no new one came for a while.
    let pauses = |log: &str| {
        (
            log.matches("pause point: sleeping").count(),
            log.matches("pause point: resumed").count(),
        )
    };
    let mut seen = (usize::MAX, 0, Instant::now());
    wait_until(
        "the start's pauses to end",
        Duration::from_secs(120),
        || {
            let now = pauses(&worker.log_text());
            if (now.0, now.1) != (seen.0, seen.1) {
                seen = (now.0, now.1, Instant::now());
            }
            let quiet = Duration::from_millis(PAUSE_MS + 2_000);
            (now.0 == now.1 && seen.2.elapsed() >= quiet).then_some(())
        },
    );
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let records: Vec<String> = (0..N)
        .map(|i| event(&format!("r{i}"), "acme", "small", ts))
        .collect();
    // The first record: the loop takes its chunk and holds it.
    let before = pauses(&worker.log_text()).0;
    produce(&broker, "requests", 0, "acme", &records[..1]);
    wait_until("the loop to hold a chunk", Duration::from_secs(60), || {
        (pauses(&worker.log_text()).0 > before).then_some(())
    });
    // The rest, while it is held: a scrape reads all N, none consumed yet.
    produce(&broker, "requests", 0, "acme", &records[1..]);
    let mut read: Vec<(Option<f64>, Option<f64>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut held = false;
    while !held && Instant::now() < deadline {
        if let Some((l, c, _)) = scrape() {
            if read.last() != Some(&(l, c)) {
                read.push((l, c));
            }
            held = l == Some(N as f64) && c == Some(0.0);
            if c == Some(N as f64) && l == Some(0.0) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        held,
        "never read a lag of {N} while the loop held the records; (lag, consumed) read in turn: \
         {read:?}\n{}",
        worker.log_text()
    );
    println!("(lag, consumed) read while held: {read:?}");
    // Then the loop applies the chunks, and the lag drains to 0.
    let (_, _, text) = wait_until("the lag to drain", Duration::from_secs(180), || {
        scrape().filter(|(l, c, _)| *l == Some(0.0) && *c == Some(N as f64))
    });
    assert_eq!(
        text.matches("# TYPE tally_consumer_lag_records ").count(),
        1,
        "{text}"
    );
}
