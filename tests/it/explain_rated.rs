//! `tally explain --tenant` under a rating (issue 40): a generated rated stream
//! (parts, fees, a long-context tier, a batch variant, a plan from the start and
//! one from mid-stream, duplicates, too-late records reprocessed) through a
//! worker and the sink; then for several (tenant, window) pairs every billed
//! request shows its quantities, price entry, variant and plan, and the
//! explanation's totals equal the sink's line, line items and quantity line
//! items — and the generator's bill; and `GET /v1/explain` shows each billed
//! request's variant, plan, tier and quantities as the CLI does, JSON and CSV.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use crate::rating_stream::{config, RATING, T0, TOPICS};
use tally::explain::{Billed, Explanation, Quantity, Routed};
use tally::gen::rated::{rated_stream, LineKey, RatedOptions};

const MIN: i64 = 60_000;

fn explain(cfg: &str, tenant: &str, window_start: i64, db: &str) -> Explanation {
    let start = window_start.to_string();
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
            db,
            "--json",
        ],
        &[],
        Duration::from_secs(120),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The sink's quantity line items of one window, straight from the view.
fn sink_quantities(db: &str, tenant: &str, start: i64) -> BTreeMap<LineKey, (u64, u128)> {
    let sql = format!(
        "SELECT model, variant, plan, quantity, count::TEXT, cost_pico::TEXT \
         FROM tenant_cost_minute_quantity WHERE tenant_id = '{tenant}' AND window_start = {start}"
    );
    query(db, &sql)
        .into_iter()
        .map(|r| {
            let v = |i: usize| r[i].clone().unwrap();
            (
                (v(0), v(1), v(2), v(3)),
                (v(4).parse().unwrap(), v(5).parse().unwrap()),
            )
        })
        .collect()
}

/// The sink's line items (model → cost, requests) of one window.
fn sink_lines(db: &str, tenant: &str, start: i64) -> BTreeMap<String, (u128, u64)> {
    let sql = format!(
        "SELECT model, cost_pico::TEXT, requests::TEXT FROM tenant_cost_minute_line \
         WHERE tenant_id = '{tenant}' AND window_start = {start}"
    );
    query(db, &sql)
        .into_iter()
        .map(|r| {
            let v = |i: usize| r[i].clone().unwrap();
            (v(0), (v(1).parse().unwrap(), v(2).parse().unwrap()))
        })
        .collect()
}

fn check_pair(x: &Explanation, db: &str, want: &tally::gen::rated::RatedWindow) {
    let (tenant, start) = (x.tenant_id.as_str(), x.window_start);
    assert_eq!(x.agrees, Some(true), "{tenant} {start}: {:?}", x.notes);
    assert!(x.exact);
    for b in &x.billed {
        // A request without usage bills no quantity.
        assert!(
            !b.quantities.is_empty() || b.cost_pico == "0",
            "{b:?}: no quantities"
        );
        // The rating's list prices have no `effective_from`: in effect since
        // always, `i64::MIN` as for a price table's entry without one.
        assert_eq!(
            b.price_effective_from,
            Some(i64::MIN),
            "{b:?}: no price entry"
        );
        let plan = match tenant {
            "acme" => Some("enterprise"),
            "initech" if b.completed_ts >= T0 + 4 * MIN => Some("startup"),
            _ => None,
        };
        assert_eq!(b.plan.as_deref(), plan, "{b:?}");
        assert!(
            matches!(b.variant.as_deref(), None | Some("batch")),
            "{b:?}"
        );
        let sum: u128 = b
            .quantities
            .iter()
            .map(|q| q.cost_pico.parse::<u128>().unwrap())
            .sum();
        assert_eq!(
            sum.to_string(),
            b.cost_pico,
            "{b:?}: quantities do not sum to the cost"
        );
        // The list fee; the long-context tier charges none.
        if b.model == "c-sonnet" && b.tier_above.is_none() {
            assert!(
                b.quantities.iter().any(|q| q.quantity == "fee"),
                "{b:?}: no fee"
            );
        }
    }
    // The totals against the sink's quantity line items and the generator's.
    let totals: BTreeMap<LineKey, (u64, u128)> = x
        .totals
        .quantities
        .iter()
        .map(|q| {
            let key = (
                q.model.clone(),
                q.variant.clone(),
                q.plan.clone(),
                q.quantity.clone(),
            );
            (key, (q.count, q.cost_pico.parse().unwrap()))
        })
        .collect();
    assert_eq!(
        totals,
        sink_quantities(db, tenant, start),
        "{tenant} {start}"
    );
    assert_eq!(totals, want.lines, "{tenant} {start}: the generator's bill");
    let lines: BTreeMap<String, (u128, u64)> = x
        .totals
        .lines
        .iter()
        .map(|l| (l.model.clone(), (l.cost_pico.parse().unwrap(), l.requests)))
        .collect();
    let mut lines = lines;
    for a in x.sink.as_ref().unwrap().adjustments.iter() {
        let l = lines.entry(a.model.clone()).or_default();
        l.0 += a.cost_pico.parse::<u128>().unwrap();
        l.1 += 1;
    }
    assert_eq!(lines, sink_lines(db, tenant, start), "{tenant} {start}");
    assert_eq!(x.totals.expected_line_cost_pico, want.cost.to_string());
    assert_eq!(
        x.totals.requests + x.totals.adjusted_requests,
        want.requests
    );
}

/// `tally api` on the stream's config (plus an `[api]` section) and the sink's
/// database, and an admin key's bearer.
fn start_api(dir: &std::path::Path, cfg: &str, db: &str) -> (Service, String, String) {
    let keys = dir.join("keys");
    let api_cfg = dir.join("api.toml");
    let text = std::fs::read_to_string(cfg).unwrap()
        + &format!(
            "\n[api]\nlisten = \"127.0.0.1:0\"\nkeys = \"{}\"\n",
            keys.display()
        );
    std::fs::write(&api_cfg, text).unwrap();
    let api_cfg = api_cfg.to_str().unwrap();
    let key = crate::usage_api::mint(api_cfg, keys.to_str().unwrap(), "ops", "admin");
    let api = Service::start(
        &["api", "--config", api_cfg],
        &[("TALLY_SINK__DATABASE_URL", db), ("TALLY_LOG", "info")],
        dir.join("api.log"),
    );
    let addr = bound_addr(&api.log, "usage API: serving");
    wait_until("the API listens", Duration::from_secs(30), || {
        http_get(&addr, "/healthz")
    });
    (api, addr, format!("Bearer {key}"))
}

/// A billed request's pricing facts: request id, variant, plan, tier, quantities.
type Facts = (
    String,
    Option<String>,
    Option<String>,
    Option<u64>,
    Vec<Quantity>,
);

fn cli_facts(x: &Explanation) -> Vec<Facts> {
    let mut v: Vec<Facts> = x
        .billed
        .iter()
        .map(|b: &Billed| {
            let f = (b.variant.clone(), b.plan.clone(), b.tier_above);
            (b.request_id.clone(), f.0, f.1, f.2, b.quantities.clone())
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The API's rows of `x`'s tenant and window, JSON and CSV, against the CLI's
/// billed requests on id, variant, plan, tier and quantities.
fn check_api(addr: &str, bearer: &str, x: &Explanation) {
    let utc = tally::time::utc::format_utc_ms;
    let path = format!(
        "/v1/explain/{}?window_start={}",
        x.tenant_id,
        utc(x.window_start)
    );
    let get = |accept| crate::api_http::api_request(addr, &path, Some(bearer), accept);
    let want = cli_facts(x);
    let r = get("application/json");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert!(v["next_page"].is_null(), "one page: {v}");
    let rows: Vec<tally::explain::rows::Row> = serde_json::from_value(v["data"].clone()).unwrap();
    let mut got: Vec<Facts> = rows
        .into_iter()
        .filter(|r| r.route == "billed")
        .map(|r| {
            let id = r.request_id.unwrap();
            (
                id,
                r.variant,
                r.plan,
                r.tier_above,
                r.quantities.unwrap_or_default(),
            )
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, want, "{} {}: JSON rows", x.tenant_id, x.window_start);
    // CSV: the same facts, the quantities one cell `name=count:cost;…`.
    let r = get("text/csv");
    assert_eq!(r.status, 200, "{}", r.body);
    let mut lines = r.body.split("\r\n").filter(|l| !l.is_empty());
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name| header.iter().position(|h| *h == name).unwrap();
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let mut got: Vec<Facts> = lines
        .map(|l| {
            assert!(!l.contains('"'), "{l}");
            l.split(',').collect::<Vec<_>>()
        })
        .filter(|c| c[col("route")] == "billed")
        .map(|c| {
            let quantities = c[col("quantities")]
                .split(';')
                .filter(|q| !q.is_empty())
                .map(|q| {
                    let (name, rest) = q.split_once('=').unwrap();
                    let (count, cost) = rest.split_once(':').unwrap();
                    Quantity {
                        quantity: name.into(),
                        count: count.parse().unwrap(),
                        cost_pico: cost.into(),
                    }
                })
                .collect();
            let tier = opt(c[col("tier_above")]).map(|t| t.parse().unwrap());
            let (variant, plan) = (opt(c[col("variant")]), opt(c[col("plan")]));
            (
                c[col("request_id")].to_string(),
                variant,
                plan,
                tier,
                quantities,
            )
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, want, "{} {}: CSV rows", x.tenant_id, x.window_start);
}

/// The explanation's `finality` against `tally_progress` itself: a window is
/// final exactly when every input partition's stored `final_through` reached its
/// end; a non-final one names the partition with the lowest progress.
fn check_finality(x: &Explanation, db: &str) {
    let f = x.finality.as_ref().expect("a sink was given: finality");
    let rows = query(
        db,
        "SELECT source_partition::TEXT, min(final_through)::TEXT, min(watermark)::TEXT \
         FROM tally_progress GROUP BY source_partition ORDER BY source_partition",
    );
    let stored: Vec<(i32, i64, i64)> = rows
        .iter()
        .map(|r| {
            let v = |i: usize| r[i].clone().unwrap();
            (
                v(0).parse().unwrap(),
                v(1).parse().unwrap(),
                v(2).parse().unwrap(),
            )
        })
        .collect();
    // A partition with no progress row holds every window back, and is named first.
    let missing = (0..4).find(|n| !stored.iter().any(|s| s.0 == *n));
    let lowest = stored.iter().min_by_key(|(p, ft, _)| (*ft, *p)).unwrap();
    let held = missing.unwrap_or(lowest.0);
    assert_eq!(
        f.is_final,
        missing.is_none() && lowest.1 >= x.window_end,
        "{f:?}"
    );
    assert_eq!(f.partitions.len(), 4);
    for p in &f.partitions {
        match stored.iter().find(|s| s.0 == p.partition) {
            Some((_, ft, wm)) => {
                assert_eq!((p.final_through, p.watermark), (Some(*ft), Some(*wm)));
                assert_eq!(p.holds_back, *ft < x.window_end, "{p:?}");
            }
            None => assert!(p.holds_back && p.watermark.is_none(), "{p:?}"),
        }
    }
    if f.is_final {
        assert_eq!(
            (f.held_back_by, f.lateness_to_run_ms),
            (None, Some(0)),
            "{f:?}"
        );
    } else {
        assert_eq!(f.held_back_by, Some(held), "{f:?}");
        assert!(f.partitions[held as usize].holds_back);
        assert!(f.source.contains("--finality --from"));
    }
}

#[test]
fn explain_under_a_rating_shows_each_requests_pricing_and_the_sinks_quantity_lines() {
    let dir = TempDir::new("explain-rated");
    let broker = DevBroker::start(TOPICS);
    let cfg = config(dir.path(), &broker);
    let book = tally::config::rating::from_toml(RATING).unwrap().book;
    let mut tenants: Vec<String> = ["acme", "initech", "globex"].map(String::from).to_vec();
    tenants.extend((0..7).map(|i| format!("t{i}")));
    let opts = RatedOptions {
        seed: 40,
        count: 2_000,
        tenants,
        partitions: 4,
        start_ms: T0,
        step_ms: 200,
        max_jitter_ms: 4_000,
        duplicates_ppm: 30_000,
        late: 12,
    };
    let stream = rated_stream(&book, tally::time::WindowSpec::new(MIN, 0), &opts);
    produce_to_partitions(&broker, &stream.records);
    let cfg_s = cfg.to_str().unwrap();
    let run = || {
        tally_ok(
            &["run", "--config", cfg_s, "--until-end"],
            &[],
            Duration::from_secs(300),
        )
    };
    run();
    produce_to_partitions(&broker, &stream.late);
    run();
    tally_ok(
        &["reprocess-late", "--config", cfg_s, "--from", "earliest"],
        &[],
        Duration::from_secs(120),
    );
    let db = fresh_database("explain_rated");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    tally_ok(
        &["sink", "--config", cfg_s, "--until-end"],
        &env,
        Duration::from_secs(300),
    );

    // acme (a plan from the start), initech before and after its plan, globex
    // (list prices), and the windows the too-late records were adjusted into.
    let mut pairs: Vec<(String, i64)> = vec![
        ("acme".into(), T0 + 2 * MIN),
        ("initech".into(), T0 + 2 * MIN),
        ("initech".into(), T0 + 5 * MIN),
        ("globex".into(), T0 + 3 * MIN),
    ];
    for (_, payload) in stream.late.iter().take(2) {
        let j: serde_json::Value = serde_json::from_str(payload).unwrap();
        let ts = j["completed_ts"].as_i64().unwrap();
        let pair = (
            j["tenant_id"].as_str().unwrap().to_string(),
            ts.div_euclid(MIN) * MIN,
        );
        if !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    let (_api, addr, bearer) = start_api(dir.path(), cfg_s, &db);
    let (mut tiers, mut batch, mut too_late) = (0, 0, 0);
    for (tenant, start) in &pairs {
        let want = &stream.expected[&(tenant.clone(), *start)];
        let x = explain(cfg_s, tenant, *start, &db);
        check_pair(&x, &db, want);
        check_api(&addr, &bearer, &x);
        tiers += x.billed.iter().filter(|b| b.tier_above.is_some()).count();
        batch += x.billed.iter().filter(|b| b.variant.is_some()).count();
        too_late += x
            .elsewhere
            .iter()
            .filter(|e| {
                matches!(
                    e.route,
                    Routed::TooLate {
                        adjustment: Some(true),
                        ..
                    }
                )
            })
            .count();
    }
    // The last window of the stream is not final (no later event passed it);
    // the early ones are.
    let last = stream.expected.keys().max_by_key(|k| k.1).unwrap().clone();
    let x = explain(cfg_s, &last.0, last.1, &db);
    check_finality(&x, &db);
    assert!(!x.finality.as_ref().unwrap().is_final, "{:?}", x.finality);
    assert!(x.finality.as_ref().unwrap().held_back_by.is_some());
    let x = explain(cfg_s, "acme", T0 + 2 * MIN, &db);
    check_finality(&x, &db);
    assert!(x.finality.as_ref().unwrap().is_final, "{:?}", x.finality);
    assert!(batch > 0, "no batch variant among the pairs");
    assert!(too_late > 0, "no adjusted too-late record among the pairs");
    eprintln!(
        "pairs {}, tiered requests {tiers}, batch {batch}, adjusted {too_late}",
        pairs.len()
    );
}
