//! Issue 40, steps 3 and 4: `tally explain --finality` names the partition that
//! holds a window back (a silent partition, idleness off) and nothing once the
//! window is final; the worker's `/status` page, rendered by headless Chromium
//! (installed by scripts/bootstrap.sh; missing, the test fails), shows the
//! figures `/metrics` shows, and a screenshot of it is kept as an artifact
//! (`target/test-artifacts/status.png`); the usage API's `/status` names the
//! input partition the stored progress waits for.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::common::*;

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const S: i64 = 1_000;
const CHROMIUM: &str = "/usr/bin/chromium";

fn explain(args: &[&str]) -> Output {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    tally(&all, &[], Duration::from_secs(60))
}

/// `tally explain --finality` of 10:00 from `source`, as JSON; `None` while
/// the worker has no report to give (exit 4).
fn finality_json(source: &[&str]) -> Option<serde_json::Value> {
    let mut args = vec![
        "--finality",
        "--window-start",
        "2026-01-01T10:00:00Z",
        "--json",
    ];
    args.extend_from_slice(source);
    let out = explain(&args);
    if out.status.code() == Some(4) {
        return None;
    }
    assert!(
        out.status.success(),
        "tally explain failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

fn partition(f: &serde_json::Value, n: i64) -> &serde_json::Value {
    f["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["partition"] == n)
        .unwrap_or_else(|| panic!("no partition {n} in {f}"))
}

fn three_records(prefix: &str) -> Vec<String> {
    [10, 70, 100]
        .iter()
        .map(|s| event(&format!("{prefix}{s}"), "acme", "small", T10 + s * S))
        .collect()
}

#[test]
fn explain_finality_names_the_silent_partition_until_it_has_data() {
    let dir = TempDir::new("explain-finality");
    let broker = DevBroker::start(&[
        ("requests", 2),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    // Partition 0: three records (the lead limit off, so they start it, DESIGN
    // §4.4), its watermark 10:01:35, past 10:00's line (10:01:29.999).
    produce(&broker, "requests", 0, "acme", &three_records("a"));
    let cfg = write_config(
        dir.path(),
        &broker,
        "explain",
        "[watermark]\nidle_timeout = \"off\"\nmax_lead = \"off\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
    );
    let cfg = cfg.to_str().unwrap();
    let worker = Service::start(
        &["run", "--config", cfg],
        &[],
        dir.path().join("worker.log"),
    );
    let addr = bound_addr(&worker.log, METRICS_SERVING);
    let from = ["--from", addr.as_str()];
    let f = wait_until("partition 0 past 10:00", Duration::from_secs(60), || {
        let f = finality_json(&from)?;
        let silent = partition(&f, 1)["reasons"]
            .as_array()?
            .iter()
            .any(|r| r["reason"] == "silent_idleness_off");
        (partition(&f, 0)["passed"] == true && silent).then_some(f)
    });
    assert_eq!(f["is_final"], false, "{f}");
    assert_eq!(f["held_back_by"], 1, "{f}");
    assert_eq!(f["window_end"], T10 + 60 * S);
    let p1 = partition(&f, 1);
    assert_eq!(p1["watermark"], serde_json::Value::Null, "{f}");
    assert_eq!(p1["reasons"][0]["reason"], "no_watermark", "{f}");
    assert!(partition(&f, 0)["reasons"].as_array().unwrap().is_empty());

    // The table says it too, and the report file gives the same answer.
    let out = explain(&[
        "--finality",
        "--window-end",
        "2026-01-01T10:01:00Z",
        "--from",
        &addr,
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    println!("{table}");
    assert!(
        table.contains("not final: held back by partition 1"),
        "{table}"
    );
    assert!(table.contains("idleness off"), "{table}");
    let report = dir.path().join("state-explain").join("report.json");
    let report = report.to_str().unwrap();
    wait_until(
        "report.json names partition 1",
        Duration::from_secs(30),
        || {
            let f = finality_json(&["--report", report])?;
            (f["held_back_by"] == 1 && partition(&f, 0)["passed"] == true).then_some(())
        },
    );

    // Usage errors exit 2 (no mode, --finality or --tenant, given), an address
    // that does not answer exits 4.
    let out = explain(&["--window-start", "2026-01-01T10:00:00Z", "--from", &addr]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--finality"));
    let out = explain(&[
        "--finality",
        "--window-start",
        "2026-01-01T10:00:01Z",
        "--from",
        &addr,
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = explain(&["--finality", "--window-start", "0", "--from", "127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");

    // Data on partition 1: 10:00 is final, and nobody holds it back.
    produce(&broker, "requests", 1, "acme", &three_records("b"));
    let f = wait_until("10:00 final", Duration::from_secs(60), || {
        let f = finality_json(&from)?;
        (f["is_final"] == true).then_some(f)
    });
    assert_eq!(f["held_back_by"], serde_json::Value::Null, "{f}");
    for p in f["partitions"].as_array().unwrap() {
        assert!(p["reasons"].as_array().unwrap().is_empty(), "{f}");
    }
    let out = explain(&[
        "--finality",
        "--window-start",
        "2026-01-01T10:00:00Z",
        "--from",
        &addr,
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("final: every partition"), "{table}");
    assert!(!table.contains("held back"), "{table}");
}

/// Headless Chromium's DOM of `url`, and a screenshot to `png` if given.
fn chromium(url: &str, png: Option<&Path>, profile: &Path) -> String {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: scripts/bootstrap.sh installs Debian's chromium package"
    );
    let mut args: Vec<String> = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--user-data-dir={}", profile.display()));
    match png {
        Some(png) => {
            args.push(format!("--screenshot={}", png.display()));
            args.push("--window-size=1280,900".into());
        }
        None => args.push("--dump-dom".into()),
    }
    args.push(url.into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_to_end(CHROMIUM, &args, &[], Duration::from_secs(120));
    assert!(
        out.status.success(),
        "chromium failed ({}): {}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stderr), 20)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `data-value` of the element with `id` in the rendered DOM.
fn dom_value(dom: &str, id: &str) -> Option<f64> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let tag = &dom[at..at + dom[at..].find('>')?];
    let v = tag.split("data-value=\"").nth(1)?;
    v[..v.find('"')?].parse().ok()
}

/// The sample of `name` whose labels include each of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (series, value) = rest.rsplit_once(' ')?;
        let exact = series.is_empty() || series.starts_with('{');
        (exact && labels.iter().all(|want| series.contains(want)))
            .then(|| value.parse().ok())
            .flatten()
    })
}

/// The figures that hold still while the worker is idle: (page id, metric,
/// labels, metric unit to ms factor).
fn still(p: i32) -> Vec<(String, &'static str, Vec<String>, f64)> {
    let part = format!("partition=\"{p}\"");
    vec![
        (
            format!("p{p}-watermark"),
            "tally_partition_watermark_timestamp_seconds",
            vec![part.clone()],
            1000.0,
        ),
        (
            format!("p{p}-consumer-lag"),
            "tally_consumer_lag_records",
            vec![part.clone()],
            1.0,
        ),
        (
            format!("p{p}-held"),
            "tally_watermark_held_total",
            vec![part.clone()],
            1.0,
        ),
        (
            format!("p{p}-records"),
            "tally_records_total",
            vec![part, "route=\"consumed\"".into()],
            1.0,
        ),
    ]
}

/// The figures that grow with the wall clock (the page's lies between two scrapes).
fn moving(p: i32) -> Vec<(String, &'static str, Vec<String>, f64)> {
    let part = format!("partition=\"{p}\"");
    vec![
        (
            format!("p{p}-watermark-lag"),
            "tally_partition_watermark_lag_seconds",
            vec![part.clone()],
            1000.0,
        ),
        (
            format!("p{p}-finality-lag"),
            "tally_finality_lag_seconds",
            vec![part],
            1000.0,
        ),
    ]
}

fn job() -> Vec<(String, &'static str, Vec<String>, f64)> {
    vec![
        (
            "job-watermark".into(),
            "tally_job_watermark_timestamp_seconds",
            vec![],
            1000.0,
        ),
        (
            "job-watermark-partition".into(),
            "tally_job_watermark_partition",
            vec![],
            1.0,
        ),
        (
            "checkpoints-completed".into(),
            "tally_checkpoints_total",
            vec![],
            1.0,
        ),
        (
            "checkpoint-last-success".into(),
            "tally_checkpoint_last_success_timestamp_seconds",
            vec![],
            1000.0,
        ),
    ]
}

fn value_of(text: &str, (_, name, labels, unit): &(String, &str, Vec<String>, f64)) -> f64 {
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let v = metric(text, name, &labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"));
    (v * unit).round()
}

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_status_page_in_headless_chromium_shows_what_metrics_shows() {
    let dir = TempDir::new("status-page");
    let broker = DevBroker::start(&[
        ("requests", 2),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    // Partition 0: twelve records and one an hour ahead (held by the lead rule);
    // partition 1: twelve.
    let mut p0: Vec<String> = (0..12)
        .map(|i| event(&format!("a{i}"), "acme", "small", T10 + i * 10 * S))
        .collect();
    p0.push(event("ahead", "acme", "small", T10 + 3_600 * S));
    produce(&broker, "requests", 0, "acme", &p0);
    let p1: Vec<String> = (0..12)
        .map(|i| event(&format!("b{i}"), "beta", "small", T10 + i * 7 * S))
        .collect();
    produce(&broker, "requests", 1, "beta", &p1);
    let cfg = write_config(
        dir.path(),
        &broker,
        "status",
        "[watermark]\nidle_timeout = \"off\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
    );
    // Checkpoints every 5 s (not the suite's 1 s): a page load (about a second)
    // mostly falls between two, so the checkpoint figures hold still across it.
    let worker = Service::start(
        &["run", "--config", cfg.to_str().unwrap()],
        &[("TALLY_CHECKPOINT__INTERVAL", "5s")],
        dir.path().join("worker.log"),
    );
    let addr = bound_addr(&worker.log, METRICS_SERVING);
    wait_until(
        "every record read and a checkpoint",
        Duration::from_secs(60),
        || {
            let (_, m) = http_get(&addr, "/metrics")?;
            let read: f64 = (0..2)
                .filter_map(|p| {
                    metric(
                        &m,
                        "tally_records_total",
                        &[&format!("partition=\"{p}\""), "route=\"consumed\""],
                    )
                })
                .sum();
            let lag: f64 = (0..2)
                .filter_map(|p| {
                    metric(
                        &m,
                        "tally_consumer_lag_records",
                        &[&format!("partition=\"{p}\"")],
                    )
                })
                .sum();
            (read == 25.0 && lag == 0.0 && metric(&m, "tally_checkpoints_total", &[])? >= 1.0)
                .then_some(())
        },
    );
    let url = format!("http://{addr}/status");
    let still_all: Vec<_> = still(0).into_iter().chain(still(1)).chain(job()).collect();
    // Scrape, render, scrape: retried until the still figures held still across it.
    let (before, dom, after) = (0..20)
        .find_map(|i| {
            let before = http_get(&addr, "/metrics").unwrap().1;
            let dom = chromium(&url, None, &dir.path().join(format!("profile-{i}")));
            let after = http_get(&addr, "/metrics").unwrap().1;
            let same = still_all
                .iter()
                .all(|f| value_of(&before, f) == value_of(&after, f));
            same.then_some((before, dom, after))
        })
        .expect("the worker's figures did not hold still across a page load");
    assert!(dom.contains("<h1>tally status</h1>"), "{dom}");
    assert_eq!(dom_value(&dom, "ready"), Some(1.0), "{dom}");
    for f in &still_all {
        let page =
            dom_value(&dom, &f.0).unwrap_or_else(|| panic!("no #{} on the page:\n{dom}", f.0));
        assert_eq!(page, value_of(&before, f), "#{} against {}", f.0, f.1);
    }
    for f in moving(0).iter().chain(moving(1).iter()) {
        let page =
            dom_value(&dom, &f.0).unwrap_or_else(|| panic!("no #{} on the page:\n{dom}", f.0));
        let (lo, hi) = (value_of(&before, f), value_of(&after, f));
        assert!(
            lo <= page && page <= hi,
            "#{} = {page}, {} from {lo} to {hi}",
            f.0,
            f.1
        );
    }
    assert!(
        dom_value(&dom, "p0-held").unwrap() >= 1.0,
        "the record an hour ahead is held"
    );
    // Idleness off and the lowest progress is partition 1's or 0's: someone holds
    // the next window back, with a reason.
    assert!(dom_value(&dom, "held-back-by").is_some(), "{dom}");
    assert!(dom.contains("id=\"why-p"), "{dom}");

    let png = artifacts().join("status.png");
    let _ = std::fs::remove_file(&png);
    chromium(&url, Some(&png), &dir.path().join("profile-shot"));
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "a screenshot of the page at {} ({size} bytes)",
        png.display()
    );
    println!("status page screenshot: {}", png.display());
}

/// The usage API's `/status`: the database's stored progress per input
/// partition, the one holding finality back there, and the last warning logged.
#[test]
fn the_api_status_names_the_partition_the_stored_progress_waits_for() {
    let dir = TempDir::new("api-status");
    let db = fresh_database("apistatus");
    let env = [
        ("TALLY_SINK__DATABASE_URL", db.as_str()),
        ("TALLY_API__ALLOW_UNAUTHENTICATED", "true"),
    ];
    let cfg = dir.path().join("api.toml");
    std::fs::write(&cfg, format!("{PRICES}\n[api]\nlisten = \"127.0.0.1:0\"\n")).unwrap();
    let cfg = cfg.to_str().unwrap();
    tally_ok(&["migrate", "--config", cfg], &env, Duration::from_secs(60));
    // Two input partitions, one results partition: partition 1 is behind.
    execute(
        &db,
        &format!(
            "INSERT INTO tally_progress (source_partition, results_partition, final_through, \
             watermark, source_partitions, results_partitions, generation) VALUES \
             (0, 0, {}, {}, 2, 1, 0), (1, 0, {T10}, {}, 2, 1, 0)",
            T10 + 120 * S,
            T10 + 150 * S,
            T10 + 35 * S
        ),
    );
    let api = Service::start(&["api", "--config", cfg], &env, dir.path().join("api.log"));
    let addr = bound_addr(&api.log, "usage API: serving");
    let (status, body) = http_get(&addr, "/status.json").unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["database_error"], serde_json::Value::Null, "{v}");
    assert_eq!(v["final_through"], T10, "{v}");
    assert_eq!(v["held_back_by"], 1, "{v}");
    assert_eq!(v["progress"][1]["watermark"], T10 + 35 * S, "{v}");
    // The warning it logged for serving without keys, on the page.
    let warning = v["last_warning"]["line"].as_str().unwrap_or_default();
    assert!(warning.contains("allow_unauthenticated"), "{v}");
    let (status, html) = http_get(&addr, "/status").unwrap();
    assert_eq!(status, 200);
    assert!(
        html.contains("id=\"held-back-by\" data-value=\"1\""),
        "{html}"
    );
    assert!(
        html.contains("id=\"database-reachable\" data-value=\"1\""),
        "{html}"
    );
    assert!(!html.to_lowercase().contains("<script"));
}
