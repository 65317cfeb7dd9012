//! `tally explain --tz --bucket --at` and `GET /v1/explain?tz=…&bucket=…`
//! (issue 40): a calendar bucket of an IANA zone explained, its bounds the
//! database's — the day of the spring DST change in Europe/Berlin (23 hours)
//! explains exactly the windows the usage API's day bucket sums.

use std::time::Duration;

use crate::common::*;
use tally::explain::Explanation;

const MIN: i64 = 60_000;
/// 2026-03-28T23:00:00Z: 2026-03-29 00:00 in Berlin (CET, +01:00).
const DAY_START: i64 = 1_774_738_800_000;
/// 2026-03-29T22:00:00Z: 2026-03-30 00:00 in Berlin (CEST, +02:00).
const DAY_END: i64 = DAY_START + 23 * 60 * MIN;

fn explain_day(cfg: &str, db: Option<&str>, at: &str) -> std::process::Output {
    let mut args = vec![
        "explain",
        "--config",
        cfg,
        "--tenant",
        "acme",
        "--tz",
        "Europe/Berlin",
        "--bucket",
        "day",
        "--at",
        at,
        "--json",
    ];
    if let Some(db) = db {
        args.extend(["--sink-url", db]);
    }
    tally(&args, &[], Duration::from_secs(120))
}

#[test]
fn a_dst_day_in_berlin_explains_the_windows_the_usage_api_sums() {
    let dir = TempDir::new("explain-tz");
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    // Around both ends of the local day, an hour either side of each bound.
    let times: Vec<i64> = [DAY_START, DAY_END]
        .iter()
        .flat_map(|b| (-6..6).map(move |i| b + i * 10 * MIN + 7_000))
        .collect();
    let records: Vec<String> = times
        .iter()
        .enumerate()
        .map(|(i, t)| event(&format!("r-{i}"), "acme", "small", *t))
        .collect();
    produce(&broker, "requests", 0, "acme", &records);
    let cfg = write_config(dir.path(), &broker, "explain-tz", "");
    let cfg = cfg.to_str().unwrap();
    tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let db = fresh_database("explain_tz");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(120),
    );

    // Without the database: refused, naming the way out.
    let out = explain_day(cfg, None, "2026-03-29");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--sink-url") && err.contains("--window-start"),
        "{err}"
    );
    // An unknown zone's bucket: a usage error.
    let bad = tally(
        &[
            "explain",
            "--config",
            cfg,
            "--tenant",
            "acme",
            "--tz",
            "Europe/Nowhere",
            "--bucket",
            "day",
            "--at",
            "2026-03-29",
            "--sink-url",
            &db,
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(
        bad.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    let out = explain_day(cfg, Some(&db), "2026-03-29");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let x: Explanation = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((x.window_start, x.window_end), (DAY_START, DAY_END));
    let inside = times
        .iter()
        .filter(|t| (DAY_START..DAY_END).contains(*t))
        .count();
    assert_eq!(x.billed.len(), inside);
    assert!(x
        .billed
        .iter()
        .all(|b| (DAY_START..DAY_END).contains(&b.completed_ts)));
    assert_eq!(x.agrees, Some(true), "{:?}", x.notes);
    // The usage API's day bucket of the same zone: the same bounds, the same sum.
    let rows = query(
        &db,
        &format!(
            "SELECT window_start::TEXT, window_end::TEXT, cost_pico::TEXT, requests::TEXT \
             FROM tally_usage('day', 'Europe/Berlin', {}, {}, false, 'acme') \
             WHERE window_start <= {DAY_START} AND window_end > {DAY_START}",
            DAY_START - 2 * 60 * MIN,
            DAY_END + 2 * 60 * MIN
        ),
    );
    let v = |i: usize| rows[0][i].clone().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((v(0), v(1)), (DAY_START.to_string(), DAY_END.to_string()));
    assert_eq!(v(2), x.totals.cost_pico);
    assert_eq!(v(3), inside.to_string());

    // Over the API: the bucket of the zone holding `window_start`.
    let api_cfg = write_config(
        dir.path(),
        &broker,
        "explain-tz-api",
        "[api]\nlisten = \"127.0.0.1:0\"\n",
    );
    let api = Service::start(
        &["api", "--config", api_cfg.to_str().unwrap()],
        &[
            ("TALLY_SINK__DATABASE_URL", db.as_str()),
            ("TALLY_API__ALLOW_UNAUTHENTICATED", "true"),
        ],
        dir.path().join("api.log"),
    );
    let addr = bound_addr(&api.log, "usage API: serving");
    let path = "/v1/explain/acme?window_start=2026-03-29T12:00:00Z&tz=Europe/Berlin&bucket=day";
    let (status, body) = http_get(&addr, path).unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["window_start"].as_i64(), v["window_end"].as_i64()),
        (Some(DAY_START), Some(DAY_END))
    );
    assert_eq!(v["totals"], serde_json::to_value(&x.totals).unwrap());
    let (status, body) = http_get(&addr, &path.replace("Berlin", "Nowhere")).unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"tz\""), "{body}");
}
