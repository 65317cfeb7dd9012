//! Issue 13, item 6: the service endpoints of a worker on `metrics.listen` —
//! readiness follows the group join and the restore, an idle connection does not
//! hold up a scrape, unknown paths are 404, and the consumer lag is read off a
//! backlog the worker has not consumed yet.

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
