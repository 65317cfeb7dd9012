//! `tally explain --tenant` (issue 40, step 1; docs/DESIGN.md §6.2) end to end:
//! a generated stream with duplicates, late and too-late records and dead
//! letters, a worker killed midway and restarted, `reprocess-late` and the sink;
//! then, for 20 (tenant, window) pairs, the explanation lists exactly the
//! generator's records of the pair with their routes, and its totals equal the
//! sink's line. (What bounds the replay, and retention: `explain_bounds`.)

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use tally::explain::{Explanation, Routed};
use tally::gen::GeneratedRecord;

pub(crate) const MIN: i64 = 60_000;

/// (partition, offset, route) of one record.
type Entry = (i32, i64, String);

/// The generator's records by (tenant, window end), each with the route the
/// construction gives it; dead letters only where their tenant and window can
/// be read (the explanation counts the others per partition, `unreadable`).
struct Truth {
    pairs: BTreeMap<(String, i64), BTreeSet<Entry>>,
    unreadable: BTreeMap<String, u64>,
}

fn truth(path: &Path) -> Truth {
    let mut t = Truth {
        pairs: BTreeMap::new(),
        unreadable: BTreeMap::new(),
    };
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let r: GeneratedRecord = serde_json::from_str(line).unwrap();
        let json: Option<serde_json::Value> = serde_json::from_str(&r.payload).ok();
        let ts = json
            .as_ref()
            .and_then(|j| j.get("completed_ts"))
            .and_then(|v| v.as_i64());
        let Some(ts) = ts else {
            *t.unreadable.entry(r.key.clone()).or_default() += 1;
            continue;
        };
        let route = match (r.route.as_str(), &r.code) {
            ("normal", _) => "billed".to_string(),
            ("dead_letter", Some(code)) => format!("dead_letter:{code}"),
            (other, _) => other.to_string(),
        };
        // A duplicate re-sends a recent record of the partition, maybe another
        // tenant's, under its own key: the payload names the tenant.
        let tenant = json
            .as_ref()
            .and_then(|j| j.get("tenant_id"))
            .and_then(|v| v.as_str())
            .map_or(r.key, str::to_string);
        let end = ts.div_euclid(MIN) * MIN + MIN;
        t.pairs
            .entry((tenant, end))
            .or_default()
            .insert((r.partition, r.seq as i64, route));
    }
    t
}

/// What the explanation lists, in the same terms.
fn listed(x: &Explanation) -> BTreeSet<Entry> {
    let mut s: BTreeSet<Entry> = x
        .billed
        .iter()
        .map(|b| (b.partition, b.offset, "billed".to_string()))
        .collect();
    for e in &x.elsewhere {
        let route = match &e.route {
            Routed::Duplicate { .. } => "duplicate".to_string(),
            Routed::TooLate { .. } => "too_late".to_string(),
            Routed::DeadLetter { code, .. } => format!("dead_letter:{code}"),
        };
        s.insert((e.partition, e.offset, route));
    }
    s
}

pub(crate) fn explain(cfg: &str, tenant: &str, window_start: i64, db: Option<&str>) -> Explanation {
    let start = window_start.to_string();
    let mut args = vec![
        "explain",
        "--config",
        cfg,
        "--tenant",
        tenant,
        "--window-start",
        &start,
        "--json",
    ];
    if let Some(db) = db {
        args.extend(["--sink-url", db]);
    }
    let out = tally_ok(&args, &[], Duration::from_secs(120));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The sink's invoice line for the pair, straight from the view.
pub(crate) fn sink_line(db: &str, tenant: &str, end: i64) -> Option<String> {
    let rows = query(
        db,
        &format!(
            "SELECT cost_pico::TEXT FROM tenant_cost_minute WHERE tenant_id = '{tenant}' \
             AND window_end = {end}"
        ),
    );
    rows.first().and_then(|r| r[0].clone())
}

/// Two records per partition, after the generated ones, for the window ending
/// two minutes before the partition's newest event: its on-time pane fired (the
/// watermark is that event less a 5 s bound) and lateness (5 min) keeps it, so
/// they are late, billed by a late pane. Added to the truth; their pairs and
/// coordinates returned.
fn late_within_lateness(
    broker: &DevBroker,
    path: &Path,
    t: &mut Truth,
) -> BTreeMap<(String, i64), BTreeSet<(i32, i64)>> {
    // Per partition: the records sent, the newest event time, a tenant.
    let mut parts: BTreeMap<i32, (i64, i64, String)> = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let r: GeneratedRecord = serde_json::from_str(line).unwrap();
        let e = parts.entry(r.partition).or_insert((0, 0, r.key.clone()));
        e.0 += 1;
        if r.route == "normal" {
            let j: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
            e.1 = e.1.max(j["completed_ts"].as_i64().unwrap());
        }
    }
    let mut late = BTreeMap::new();
    for (p, (sent, newest, tenant)) in parts {
        let end = newest.div_euclid(MIN) * MIN - MIN;
        let payloads: Vec<String> = (0..2)
            .map(|i| event(&format!("late-{p}-{i}"), &tenant, "small", end - 30_000 + i))
            .collect();
        produce(broker, "requests", p, &tenant, &payloads);
        for i in 0..2 {
            let at = (p, sent + i);
            let key = (tenant.clone(), end);
            t.pairs
                .entry(key.clone())
                .or_default()
                .insert((at.0, at.1, "billed".into()));
            late.entry(key).or_insert_with(BTreeSet::new).insert(at);
        }
    }
    late
}

/// Up to 10 pairs with records routed elsewhere, the rest at random: 20 in all.
fn pick(t: &Truth, seed: u64) -> Vec<(String, i64)> {
    let mut rng = tally::gen::Rng::new(seed);
    let (mut odd, mut plain): (Vec<_>, Vec<_>) = t
        .pairs
        .iter()
        .filter(|((_, end), _)| *end > 1_000_000_000_000)
        .map(|(k, v)| (k.clone(), v.iter().any(|e| e.2 != "billed")))
        .partition(|(_, odd)| *odd);
    let mut out = Vec::new();
    while out.len() < 10 && !odd.is_empty() {
        let i = rng.below(odd.len() as u64) as usize;
        out.push(odd.swap_remove(i).0);
    }
    plain.append(&mut odd);
    while out.len() < 20 && !plain.is_empty() {
        let i = rng.below(plain.len() as u64) as usize;
        out.push(plain.swap_remove(i).0);
    }
    assert_eq!(out.len(), 20);
    out
}

fn check_pair(x: &Explanation, want: &BTreeSet<Entry>, db: &str, unreadable: u64) {
    let pair = format!("{} {}", x.tenant_id, x.window_end);
    assert_eq!(&listed(x), want, "{pair}: the records listed");
    assert!(x.exact, "{pair}: {:?}", x.notes);
    assert_eq!(x.agrees, Some(true), "{pair}: {:?}", x.notes);
    let line = sink_line(db, &x.tenant_id, x.window_end);
    assert_eq!(
        line.as_deref().unwrap_or("0"),
        x.totals.expected_line_cost_pico,
        "{pair}: the totals against the sink's line"
    );
    let firsts: BTreeSet<(i32, i64)> = x
        .billed
        .iter()
        .map(|b| (b.partition, b.offset))
        .chain(x.elsewhere.iter().filter_map(|e| match e.route {
            Routed::TooLate { .. } => Some((e.partition, e.offset)),
            _ => None,
        }))
        .collect();
    for e in &x.elsewhere {
        match &e.route {
            Routed::Duplicate { of_offset, .. } => {
                let o = of_offset.unwrap_or_else(|| panic!("{pair}: {e:?} names no original"));
                assert!(firsts.contains(&(e.partition, o)), "{pair}: {e:?}");
                assert!(o < e.offset);
            }
            Routed::TooLate {
                on_late_topic,
                adjustment,
                ..
            } => {
                assert!(*on_late_topic, "{pair}: {e:?}");
                assert_eq!(*adjustment, Some(true), "{pair}: {e:?}");
            }
            Routed::DeadLetter {
                on_dead_letter_topic,
                ..
            } => assert!(*on_dead_letter_topic, "{pair}: {e:?}"),
        }
    }
    let counted: u64 = x.partitions.iter().map(|p| p.unreadable_dead_letters).sum();
    assert_eq!(counted, unreadable, "{pair}: unreadable dead letters");
}

#[test]
fn explain_lists_each_generated_record_of_a_window_with_its_route_and_the_sinks_totals() {
    let dir = TempDir::new("explain");
    let broker = DevBroker::start(&[
        ("requests", 3),
        ("tenant-cost", 2),
        ("requests.late", 2),
        ("requests.dlq", 2),
    ]);
    // Five minutes of lateness: the window two minutes behind a partition's
    // newest event has fired and is not purged, so records for it are late.
    let cfg = write_config(
        dir.path(),
        &broker,
        "explain",
        "[window]\nallowed_lateness = \"5m\"\n",
    );
    let records = dir.path().join("records.jsonl");
    generate(
        &cfg,
        dir.path(),
        "expected",
        &[
            "--count",
            "6000",
            "--tenants",
            "6",
            "--seed",
            "40",
            "--partitions",
            "3",
            "--step",
            "100ms",
            "--late-fraction",
            "0.03",
            "--duplicate-fraction",
            "0.03",
            "--malformed-fraction",
            "0.03",
            "--records-file",
            records.to_str().unwrap(),
        ],
    );
    let mut t = truth(&records);
    let late = late_within_lateness(&broker, &records, &mut t);
    let cfg = cfg.to_str().unwrap();
    let killed = tally(
        &["run", "--config", cfg, "--until-end"],
        &[("TALLY_CRASH_AT", "mid_pane_burst:6")],
        Duration::from_secs(300),
    );
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "the worker did not crash: {}",
        String::from_utf8_lossy(&killed.stderr)
    );
    tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    let db = fresh_database("explain");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    let sink = || {
        tally_ok(
            &["sink", "--config", cfg, "--until-end"],
            &env,
            Duration::from_secs(300),
        )
    };
    sink();
    let pairs = pick(&t, 40);

    // Before reprocess-late: the line agrees with the engine's share, and the
    // too-late requests not billed yet are named.
    let (tenant, end) = &pairs[0];
    let before = explain(cfg, tenant, end - MIN, Some(&db));
    assert_eq!(before.agrees, Some(true), "{:?}", before.notes);
    if before
        .elsewhere
        .iter()
        .any(|e| matches!(e.route, Routed::TooLate { .. }))
    {
        assert!(
            before
                .notes
                .iter()
                .any(|n| n.contains("no adjustment in the sink yet")),
            "{:?}",
            before.notes
        );
    }

    tally_ok(
        &["reprocess-late", "--config", cfg, "--from", "earliest"],
        &[],
        Duration::from_secs(300),
    );
    sink();
    let mut routes = BTreeMap::<String, usize>::new();
    for (tenant, end) in &pairs {
        let x = explain(cfg, tenant, end - MIN, Some(&db));
        let unreadable = t.unreadable.get(tenant).copied().unwrap_or(0);
        check_pair(&x, &t.pairs[&(tenant.clone(), *end)], &db, unreadable);
        for e in listed(&x) {
            *routes
                .entry(e.2.split(':').next().unwrap().to_string())
                .or_default() += 1;
        }
    }
    for route in ["billed", "duplicate", "too_late", "dead_letter"] {
        assert!(
            routes.get(route).is_some_and(|n| *n > 0),
            "no {route} among {routes:?}"
        );
    }
    // The late records: billed by a late pane.
    for ((tenant, end), at) in &late {
        let x = explain(cfg, tenant, end - MIN, Some(&db));
        let unreadable = t.unreadable.get(tenant).copied().unwrap_or(0);
        check_pair(&x, &t.pairs[&(tenant.clone(), *end)], &db, unreadable);
        let mut seen = 0;
        for b in x
            .billed
            .iter()
            .filter(|b| at.contains(&(b.partition, b.offset)))
        {
            assert_eq!(b.pane, "late", "{b:?}");
            assert!(b.watermark.is_some_and(|w| w >= end - 1), "{b:?}");
            seen += 1;
        }
        assert_eq!(seen, at.len(), "{tenant} {end}");
    }

    // A calendar bucket (here five minutes, its bounds given with an offset as
    // a zone's would be): every window of it, totals against the sink's sum.
    let (tenant, end) = &pairs[2];
    let (from, to) = (end - MIN, end + 4 * MIN);
    let fmt = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .with_timezone(&chrono::FixedOffset::east_opt(3600).unwrap())
            .to_rfc3339()
    };
    let (s, e) = (fmt(from), fmt(to));
    let out = tally_ok(
        &[
            "explain",
            "--config",
            cfg,
            "--tenant",
            tenant,
            "--window-start",
            &s,
            "--window-end",
            &e,
            "--sink-url",
            &db,
            "--json",
        ],
        &[],
        Duration::from_secs(120),
    );
    let x: Explanation = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((x.window_start, x.window_end), (from, to));
    let want: BTreeSet<Entry> = t
        .pairs
        .range((tenant.clone(), from + MIN)..=(tenant.clone(), to))
        .flat_map(|(_, v)| v.iter().cloned())
        .collect();
    assert_eq!(listed(&x), want, "the bucket's records");
    assert_eq!(x.agrees, Some(true), "{:?}", x.notes);
    let sum = query(
        &db,
        &format!(
            "SELECT coalesce(sum(cost_pico), 0)::TEXT FROM tenant_cost_minute WHERE tenant_id = \
             '{tenant}' AND window_start >= {from} AND window_end <= {to}"
        ),
    );
    assert_eq!(
        sum[0][0].as_deref(),
        Some(x.totals.expected_line_cost_pico.as_str())
    );

    // The table says the same to a terminal.
    let (tenant, end) = &pairs[1];
    let start = (end - MIN).to_string();
    let out = tally_ok(
        &[
            "explain",
            "--config",
            cfg,
            "--tenant",
            tenant,
            "--window-start",
            &start,
            "--sink-url",
            &db,
        ],
        &[],
        Duration::from_secs(120),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("BILLED INTO THE WINDOW"), "{table}");
    assert!(table.contains("AGREES with the sink"), "{table}");

    // Over the API: the pair with the most records first (several pages).
    let mut by_size = pairs.clone();
    by_size.sort_by_key(|k| std::cmp::Reverse(t.pairs[k].len()));
    over_the_api(dir.path(), &broker, &db, &by_size, cfg);
}

/// `GET /v1/explain/{tenant}` answers what `tally explain` answers, paged and
/// as CSV, under the key's scope.
fn over_the_api(d: &Path, broker: &DevBroker, db: &str, pairs: &[(String, i64)], cli_cfg: &str) {
    let keys = d.join("keys");
    let section = format!(
        "[api]\nlisten = \"127.0.0.1:0\"\nkeys = \"{}\"\n[window]\nallowed_lateness = \"5m\"\n",
        keys.display()
    );
    let cfg = write_config(d, broker, "explain-api", &section);
    let cfg = cfg.to_str().unwrap();
    let keys = keys.to_str().unwrap();
    let (tenant, end) = &pairs[0];
    let own = crate::usage_api::mint(cfg, keys, "dash", &format!("tenant:{tenant}"));
    let api = Service::start(
        &["api", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", db), ("TALLY_LOG", "info")],
        d.join("api.log"),
    );
    let addr = bound_addr(&api.log, "usage API: serving");
    wait_until("the API listens", Duration::from_secs(30), || {
        http_get(&addr, "/healthz")
    });
    let bearer = format!("Bearer {own}");
    let get =
        |path: &str, accept: &str| crate::api_http::api_request(&addr, path, Some(&bearer), accept);
    let want = explain(cli_cfg, tenant, end - MIN, Some(db));
    let utc = tally::time::utc::format_utc_ms;
    let base = format!(
        "/v1/explain/{tenant}?window_start={}&limit=3",
        utc(end - MIN)
    );
    // Paged: the rows of every page are the explanation's, in order, once.
    let (mut rows, mut path) = (Vec::new(), base.clone());
    loop {
        let r = get(&path, "application/json");
        assert_eq!(r.status, 200, "{}", r.body);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["agrees"], true, "{v}");
        assert_eq!(v["totals"], serde_json::to_value(&want.totals).unwrap());
        assert_eq!(v["finality"], serde_json::to_value(&want.finality).unwrap());
        let page: Vec<tally::explain::rows::Row> =
            serde_json::from_value(v["data"].clone()).unwrap();
        assert!(page.len() <= 3);
        rows.extend(page);
        match v["next_page"].as_str() {
            Some(t) => path = format!("{base}&page={t}"),
            None => break,
        }
    }
    assert_eq!(rows, want.rows());
    assert!(rows.len() > 3, "more than one page: {}", rows.len());
    // CSV: a header and a line per request.
    let r = get(&base, "text/csv");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").starts_with("text/csv"));
    let lines: Vec<&str> = r.body.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[0], tally::explain::rows::CSV_HEADER);
    assert_eq!(lines.len(), 1 + want.rows().len());
    // Scoped: another tenant is unknown to this key; no key, 401; off the grid, 400.
    let other = pairs.iter().find(|(t, _)| t != tenant).unwrap();
    let r = get(
        &format!(
            "/v1/explain/{}?window_start={}",
            other.0,
            utc(other.1 - MIN)
        ),
        "application/json",
    );
    assert_eq!(r.status, 404, "{}", r.body);
    let r = crate::api_http::api_request(&addr, &base, None, "application/json");
    assert_eq!(r.status, 401);
    let r = get(
        &format!("/v1/explain/{tenant}?window_start={}", utc(end - MIN + 1)),
        "application/json",
    );
    assert_eq!(r.status, 400, "{}", r.body);
}
