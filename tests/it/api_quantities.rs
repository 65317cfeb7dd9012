//! The usage API over a rating's line items (issue 36 step 6, issue 37 step 5), on
//! real PostgreSQL over a real socket: `group_by` quantity, variant and plan (with
//! tenant and model), filters by them, a tenant key's scope, paging, CSV, and the
//! invoice's lines per (model, variant, plan, quantity) with the worked example's
//! pico figures. The rows are the ones the sink stores for the issue's
//! OpenAI-style records (`rating::the_sink_stores_each_quantity_and_the_quantity_
//! view_sums_to_the_minute` stores the same from the pipeline), beside a window
//! priced by a price table, which has no quantity rows.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::api_http::api_request;
use crate::common::*;
use crate::usage_api::mint;

/// 2026-01-15T10:00Z, 10:05Z, 2026-01-16T10:00Z and 2026-02-01T00:00Z (one-minute
/// windows):
/// - globex 10:00 (partition 0): the worked example `r-1` at list prices (12 USD
///   milli: 4 + 4 + 2.4 + 1.6 billion pico), `r-2` with `service_tier = batch` (half),
///   `r-3` with 3 web-search calls (30 billion); 10:05 (partition 1): 1,000 prompt
///   tokens and a per-request fee of 1 billion, plus a stale version of its
///   quantities that the view leaves out;
/// - acme 10:00: a reprocessed late record on plan `enterprise` (1,000 prompt tokens
///   at 0.0015/1k); 2026-02-01: the worked example on plan `enterprise` (11 billion);
/// - initech 10:00: a window of a price table (no quantity rows);
/// - `@evil` on 2026-01-16: ids that would start spreadsheet formulas.
pub(crate) const DATA: &str = "
INSERT INTO tenant_cost_partial VALUES ('globex', 1768471260000, 0, 1768471200000, 48000000000, 3, 20000, 1000, 3, 1, 'on_time', 0);
INSERT INTO tenant_cost_line_partial VALUES ('globex', 1768471260000, 0, 'o-large', 1768471200000, 48000000000, 3, 20000, 1000, 3, 1);
INSERT INTO tenant_cost_quantity_partial VALUES
  ('globex', 1768471260000, 0, 'o-large', '', '', 'prompt_tokens', 1768471200000, 2000, 4000000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', '', '', 'cached_tokens', 1768471200000, 8000, 4000000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', '', '', 'completion_tokens', 1768471200000, 300, 2400000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', '', '', 'reasoning_tokens', 1768471200000, 200, 1600000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', '', '', 'web_search_calls', 1768471200000, 3, 30000000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', 'batch', '', 'prompt_tokens', 1768471200000, 2000, 2000000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', 'batch', '', 'cached_tokens', 1768471200000, 8000, 2000000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', 'batch', '', 'completion_tokens', 1768471200000, 300, 1200000000, 3, 1),
  ('globex', 1768471260000, 0, 'o-large', 'batch', '', 'reasoning_tokens', 1768471200000, 200, 800000000, 3, 1);
INSERT INTO tenant_cost_partial VALUES ('globex', 1768471560000, 1, 1768471500000, 3000000000, 1, 1000, 0, 1, 1, 'on_time', 0);
INSERT INTO tenant_cost_line_partial VALUES ('globex', 1768471560000, 1, 'o-large', 1768471500000, 3000000000, 1, 1000, 0, 1, 1);
INSERT INTO tenant_cost_quantity_partial VALUES
  ('globex', 1768471560000, 1, 'o-large', '', '', 'prompt_tokens', 1768471500000, 1000, 2000000000, 1, 1),
  ('globex', 1768471560000, 1, 'o-large', '', '', 'fee', 1768471500000, 1, 1000000000, 1, 1),
  ('globex', 1768471560000, 1, 'o-large', '', '', 'stale', 1768471500000, 9, 9, 0, 1);
INSERT INTO tenant_cost_adjustment VALUES ('late-1', 'acme', 1768471200000, 1768471260000, 1500000000, 1000, 0, 1, 'requests.late/0/9', now(), 'o-large', '', 'enterprise');
INSERT INTO tenant_cost_adjustment_quantity VALUES ('late-1', 'prompt_tokens', 1000, 1500000000, 1);
INSERT INTO tenant_cost_partial VALUES ('acme', 1769904060000, 0, 1769904000000, 11000000000, 1, 10000, 500, 1, 1, 'on_time', 0);
INSERT INTO tenant_cost_line_partial VALUES ('acme', 1769904060000, 0, 'o-large', 1769904000000, 11000000000, 1, 10000, 500, 1, 1);
INSERT INTO tenant_cost_quantity_partial VALUES
  ('acme', 1769904060000, 0, 'o-large', '', 'enterprise', 'prompt_tokens', 1769904000000, 2000, 3000000000, 1, 1),
  ('acme', 1769904060000, 0, 'o-large', '', 'enterprise', 'cached_tokens', 1769904000000, 8000, 4000000000, 1, 1),
  ('acme', 1769904060000, 0, 'o-large', '', 'enterprise', 'completion_tokens', 1769904000000, 300, 2400000000, 1, 1),
  ('acme', 1769904060000, 0, 'o-large', '', 'enterprise', 'reasoning_tokens', 1769904000000, 200, 1600000000, 1, 1);
INSERT INTO tenant_cost_partial VALUES ('initech', 1768471260000, 0, 1768471200000, 7000000000, 1, 1000, 100, 1, 1, 'on_time', 0);
INSERT INTO tenant_cost_line_partial VALUES ('initech', 1768471260000, 0, 'small', 1768471200000, 7000000000, 1, 1000, 100, 1, 1);
INSERT INTO tenant_cost_partial VALUES ('@evil', 1768557660000, 0, 1768557600000, 5, 1, 1, 0, 1, 1, 'on_time', 0);
INSERT INTO tenant_cost_line_partial VALUES ('@evil', 1768557660000, 0, '=cmd', 1768557600000, 5, 1, 1, 0, 1, 1);
INSERT INTO tenant_cost_quantity_partial VALUES ('@evil', 1768557660000, 0, '=cmd', '+v', '-p', '=q,1', 1768557600000, 1, 5, 1, 1);";

/// 2026-01-15, the day of every rated window but acme's of February.
const DAY: &str = "/v1/usage?from=2026-01-15T00:00:00Z&to=2026-01-16T00:00:00Z";

fn get(addr: &str, key: &str, path: &str, accept: &str) -> (u16, String) {
    let r = api_request(addr, path, Some(&format!("Bearer {key}")), accept);
    (r.status, r.body)
}

fn json(addr: &str, key: &str, path: &str) -> Value {
    let (status, body) = get(addr, key, path, "application/json");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// The rows of a usage answer as `dimension/…=count:cost` (the dimensions the row
/// has, in the order of the columns; `count` `-` when absent); checks that no
/// quantity row carries a window's fields.
fn rows(addr: &str, key: &str, query: &str) -> Vec<String> {
    let v = json(addr, key, &format!("{DAY}{query}"));
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            for absent in ["requests", "prompt_tokens", "completion_tokens"] {
                assert!(r.get(absent).is_none(), "{query}: {r}");
            }
            let dims: Vec<&str> = ["tenant_id", "model", "variant", "plan", "quantity"]
                .iter()
                .filter_map(|d| r.get(*d).map(|v| v.as_str().unwrap()))
                .collect();
            let count = r.get("count").map_or("-".to_string(), Value::to_string);
            format!(
                "{}={count}:{}",
                dims.join("/"),
                r["cost_pico"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn quantities_variants_and_plans_group_filter_page_and_invoice() {
    let dir = TempDir::new("api-quantities");
    let cfg = dir.path().join("api.toml");
    std::fs::write(&cfg, format!("{PRICES}\n[api]\nrate_limit = 0\n")).unwrap();
    let cfg = cfg.to_str().unwrap();
    let db = fresh_database("apiquantities");
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(60),
    );
    execute(&db, DATA);
    let (api, addr, admin) = crate::usage_api::start_api(dir.path(), cfg, &db, "api");
    let keys = dir.path().join("api.keys");
    let keys = keys.to_str().unwrap();
    let acme = mint(cfg, keys, "acme", "tenant:acme");
    signal(api.id(), libc::SIGHUP);
    wait_until("the key is taken", Duration::from_secs(10), || {
        (get(&addr, &acme, "/v1/tenants", "*/*").0 == 200).then_some(())
    });
    let day = "&window=day";

    // group_by=quantity: every tenant's rated lines per quantity (initech's price
    // table has none; the stale version is left out).
    assert_eq!(
        rows(&addr, &admin, &format!("{day}&group_by=quantity")),
        [
            "cached_tokens=16000:6000000000",
            "completion_tokens=600:3600000000",
            "fee=1:1000000000",
            "prompt_tokens=6000:9500000000",
            "reasoning_tokens=400:2400000000",
            "web_search_calls=3:30000000000",
        ]
    );
    // With the tenant, the model and the plan; a plan alone carries no count.
    assert_eq!(
        rows(
            &addr,
            &admin,
            &format!("{day}&group_by=tenant&group_by=model&group_by=plan&group_by=quantity&quantity=prompt_tokens&quantity=fee")
        ),
        [
            "acme/o-large/enterprise/prompt_tokens=1000:1500000000",
            "globex/o-large//fee=1:1000000000",
            "globex/o-large//prompt_tokens=5000:8000000000",
        ]
    );
    assert_eq!(
        rows(&addr, &admin, &format!("{day}&group_by=plan")),
        ["=-:51000000000", "enterprise=-:1500000000"]
    );
    assert_eq!(
        rows(
            &addr,
            &admin,
            &format!("{day}&group_by=model&group_by=variant")
        ),
        ["o-large/=-:46500000000", "o-large/batch=-:6000000000"]
    );
    // Filters by variant, plan and quantity, with and without their dimension.
    assert_eq!(
        rows(
            &addr,
            &admin,
            &format!("{day}&variant=batch&group_by=quantity")
        ),
        [
            "cached_tokens=8000:2000000000",
            "completion_tokens=300:1200000000",
            "prompt_tokens=2000:2000000000",
            "reasoning_tokens=200:800000000",
        ]
    );
    assert_eq!(
        rows(&addr, &admin, &format!("{day}&plan=enterprise")),
        ["acme=-:1500000000"]
    );
    assert_eq!(
        rows(
            &addr,
            &admin,
            &format!("{day}&quantity=cached_tokens&quantity=prompt_tokens&model=o-large")
        ),
        ["acme=-:1500000000", "globex=-:14000000000"]
    );
    assert_eq!(
        rows(
            &addr,
            &admin,
            &format!("{day}&model=small&group_by=quantity")
        ),
        Vec::<String>::new()
    );

    // Per bucket (minute) and tenant, the quantity rows sum to the windows' rows
    // for every window a rating billed; the price table's window has none.
    let plain = json(&addr, &admin, DAY);
    let per_quantity = json(
        &addr,
        &admin,
        &format!("{DAY}&group_by=tenant&group_by=quantity"),
    );
    let mut sums: BTreeMap<(String, String), u128> = BTreeMap::new();
    for r in per_quantity["data"].as_array().unwrap() {
        let key = (r["tenant_id"].to_string(), r["window_start"].to_string());
        *sums.entry(key).or_default() += r["cost_pico"].as_str().unwrap().parse::<u128>().unwrap();
    }
    let mut windows: BTreeMap<(String, String), u128> = BTreeMap::new();
    for r in plain["data"].as_array().unwrap() {
        if r["tenant_id"] != "initech" {
            let key = (r["tenant_id"].to_string(), r["window_start"].to_string());
            windows.insert(key, r["cost_pico"].as_str().unwrap().parse().unwrap());
        }
    }
    assert_eq!(sums.len(), 3, "{sums:?}");
    assert_eq!(sums, windows);

    // Pages of one row through every dimension: complete, in order, each once.
    let all = format!(
        "{DAY}&group_by=tenant&group_by=model&group_by=variant&group_by=plan&group_by=quantity"
    );
    let whole = json(&addr, &admin, &all)["data"].clone();
    assert_eq!(whole.as_array().unwrap().len(), 12);
    let mut paged = vec![];
    let mut page = String::new();
    loop {
        let v = json(&addr, &admin, &format!("{all}&limit=1{page}"));
        paged.push(v["data"][0].clone());
        match v["next_page"].as_str() {
            Some(t) => page = format!("&page={t}"),
            None => break,
        }
    }
    assert_eq!(Value::Array(paged), whole);
    // A token of another filter is refused, naming `page`.
    let first = json(&addr, &admin, &format!("{all}&limit=1"));
    let token = first["next_page"].as_str().unwrap();
    let (status, body) = get(
        &addr,
        &admin,
        &format!("{all}&plan=enterprise&page={token}"),
        "application/json",
    );
    assert_eq!(status, 400, "{body}");

    // A tenant key reads its own quantities; another tenant, whatever the
    // dimensions and filters, answers 404 as unknown, in JSON and CSV.
    assert_eq!(
        rows(&addr, &acme, &format!("{day}&group_by=quantity")),
        ["prompt_tokens=1000:1500000000"]
    );
    assert_eq!(
        rows(&addr, &acme, &format!("{day}&variant=batch")),
        Vec::<String>::new()
    );
    for query in [
        "&tenant_id=globex&group_by=quantity",
        "&tenant_id=acme&tenant_id=globex&plan=enterprise",
        "&tenant_id=initech&variant=batch&group_by=variant",
    ] {
        for accept in ["application/json", "text/csv"] {
            let (status, body) = get(&addr, &acme, &format!("{DAY}{query}"), accept);
            assert_eq!(status, 404, "{query} {accept}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["parameter"], "tenant_id");
            assert!(!body.contains("000000"), "{body}");
        }
    }

    // CSV: the columns of the dimensions asked for, `count` with the quantity, no
    // token fields; ids that would start a formula neutralised and quoted.
    let (status, csv) = get(
        &addr,
        &admin,
        &format!("{DAY}{day}&group_by=plan&group_by=quantity&variant=batch"),
        "text/csv",
    );
    assert_eq!(status, 200, "{csv}");
    assert_eq!(
        csv,
        "window_start,window_end,plan,quantity,count,cost_pico,usd,final\r\n\
         2026-01-15T00:00:00Z,2026-01-16T00:00:00Z,,cached_tokens,8000,2000000000,0.002000000000,false\r\n\
         2026-01-15T00:00:00Z,2026-01-16T00:00:00Z,,completion_tokens,300,1200000000,0.001200000000,false\r\n\
         2026-01-15T00:00:00Z,2026-01-16T00:00:00Z,,prompt_tokens,2000,2000000000,0.002000000000,false\r\n\
         2026-01-15T00:00:00Z,2026-01-16T00:00:00Z,,reasoning_tokens,200,800000000,0.000800000000,false\r\n"
    );
    let (status, csv) = get(
        &addr,
        &admin,
        "/v1/usage?from=2026-01-16T00:00:00Z&to=2026-01-17T00:00:00Z&window=day&group_by=tenant&group_by=model&group_by=variant&group_by=plan&group_by=quantity",
        "text/csv",
    );
    assert_eq!(status, 200, "{csv}");
    assert_eq!(
        csv,
        "tenant_id,window_start,window_end,model,variant,plan,quantity,count,cost_pico,usd,final\r\n\
         \"'@evil\",2026-01-16T00:00:00Z,2026-01-17T00:00:00Z,\"'=cmd\",\"'+v\",\"'-p\",\"'=q,1\",1,5,0.000000000005,false\r\n"
    );
    let (_, csv) = get(
        &addr,
        &acme,
        &format!("{DAY}{day}&plan=enterprise"),
        "text/csv",
    );
    assert_eq!(
        csv,
        "tenant_id,window_start,window_end,cost_pico,usd,final\r\n\
         acme,2026-01-15T00:00:00Z,2026-01-16T00:00:00Z,1500000000,0.001500000000,false\r\n"
    );

    // The invoice: a line per (model, variant, plan, quantity), with the worked
    // example's figures, summing to the month's total; the lines per model kept.
    let inv = json(&addr, &admin, "/v1/invoices/globex?period=2026-01");
    let line = |l: &Value| {
        format!(
            "{}|{}|{}|{}|{}|{}",
            l["description"].as_str().unwrap(),
            l.get("variant").map_or("-", |v| v.as_str().unwrap()),
            l.get("plan").map_or("-", |v| v.as_str().unwrap()),
            l["quantity"].as_str().unwrap(),
            l["count"],
            l["cost_pico"].as_str().unwrap(),
        )
    };
    let lines: Vec<String> = inv["quantity_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(line)
        .collect();
    assert_eq!(
        lines,
        [
            "o-large — cached_tokens|-|-|cached_tokens|8000|4000000000",
            "o-large — completion_tokens|-|-|completion_tokens|300|2400000000",
            "o-large — fee|-|-|fee|1|1000000000",
            "o-large — prompt_tokens|-|-|prompt_tokens|3000|6000000000",
            "o-large — reasoning_tokens|-|-|reasoning_tokens|200|1600000000",
            "o-large — web_search_calls|-|-|web_search_calls|3|30000000000",
            "o-large (batch) — cached_tokens|batch|-|cached_tokens|8000|2000000000",
            "o-large (batch) — completion_tokens|batch|-|completion_tokens|300|1200000000",
            "o-large (batch) — prompt_tokens|batch|-|prompt_tokens|2000|2000000000",
            "o-large (batch) — reasoning_tokens|batch|-|reasoning_tokens|200|800000000",
        ]
    );
    assert_eq!(inv["total"]["cost_pico"], "51000000000");
    assert_eq!(inv["lines"][0]["model"], "o-large");
    assert_eq!(inv["lines"][0]["requests"], 4);
    let sum: u128 = inv["quantity_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["cost_pico"].as_str().unwrap().parse::<u128>().unwrap())
        .sum();
    assert_eq!(sum, 51_000_000_000);
    // acme's February on plan enterprise: 0.011 USD, read by its own key.
    let inv = json(&addr, &acme, "/v1/invoices/acme?period=2026-02");
    let lines: Vec<String> = inv["quantity_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(line)
        .collect();
    assert_eq!(
        lines,
        [
            "o-large (plan enterprise) — cached_tokens|-|enterprise|cached_tokens|8000|4000000000",
            "o-large (plan enterprise) — completion_tokens|-|enterprise|completion_tokens|300|2400000000",
            "o-large (plan enterprise) — prompt_tokens|-|enterprise|prompt_tokens|2000|3000000000",
            "o-large (plan enterprise) — reasoning_tokens|-|enterprise|reasoning_tokens|200|1600000000",
        ]
    );
    assert_eq!(
        (
            inv["total"]["cost_pico"].as_str(),
            inv["total"]["usd"].as_str()
        ),
        (Some("11000000000"), Some("0.011000000000"))
    );
    // A month of a price table: its lines per model, no quantity line.
    let inv = json(&addr, &admin, "/v1/invoices/initech?period=2026-01");
    assert_eq!(inv["quantity_lines"], serde_json::json!([]));
    assert_eq!(inv["total"]["cost_pico"], "7000000000");
    let (status, _) = get(
        &addr,
        &acme,
        "/v1/invoices/globex?period=2026-01",
        "application/json",
    );
    assert_eq!(status, 404);
}
