//! The queries dashboards make (issue 37, step 5), on real PostgreSQL over a real
//! socket: several tenants in one request, a filter by model, `group_by` on the
//! tenant and model dimensions (repeated), and the tenants listing — each under
//! a key's scope, where any tenant outside it answers 404 as unknown.

use std::time::Duration;

use serde_json::Value;

use crate::api_http::api_request;
use crate::common::*;
use crate::usage_api::mint;

/// Rows of two tenants in two models, one-minute windows (as the sink stores them).
pub(crate) const DATA: &str = "
INSERT INTO tenant_cost_partial VALUES ('acme', 1767261660000, 0, 1767261600000, 5, 1, 1, 1, 1, 1, 'on_time', 0);
INSERT INTO tenant_cost_line_partial VALUES ('acme', 1767261660000, 0, 'small', 1767261600000, 5, 1, 1, 1, 1, 1);
INSERT INTO tenant_cost_partial VALUES ('globex', 1767261660000, 0, 1767261600000, 7, 2, 1, 1, 1, 1, 'on_time', 0);
INSERT INTO tenant_cost_line_partial VALUES ('globex', 1767261660000, 0, 'small', 1767261600000, 3, 1, 1, 1, 1, 1);
INSERT INTO tenant_cost_line_partial VALUES ('globex', 1767261660000, 0, 'large', 1767261600000, 4, 1, 0, 0, 1, 1);";

const Q: &str = "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&window=hour";

fn get(addr: &str, key: &str, path: &str, accept: &str) -> (u16, String) {
    let r = api_request(addr, path, Some(&format!("Bearer {key}")), accept);
    (r.status, r.body)
}

/// The rows of a usage answer as `tenant/model=cost` (a dimension left out
/// shows as `-`), in the order served; every row of the same hour.
fn rows(addr: &str, key: &str, query: &str) -> Vec<String> {
    let (status, body) = get(addr, key, &format!("{Q}{query}"), "application/json");
    assert_eq!(status, 200, "{query}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["window_start"], "2026-01-01T10:00:00Z", "{r}");
            let s = |k: &str| r.get(k).map_or("-", |v| v.as_str().unwrap()).to_string();
            format!("{}/{}={}", s("tenant_id"), s("model"), s("cost_pico"))
        })
        .collect()
}

fn listing(addr: &str, key: &str, query: &str) -> (Vec<String>, Option<String>) {
    let (status, body) = get(
        addr,
        key,
        &format!("/v1/tenants{query}"),
        "application/json",
    );
    assert_eq!(status, 200, "{query}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let ids = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant_id"].as_str().unwrap().to_string())
        .collect();
    (ids, v["next_page"].as_str().map(str::to_string))
}

#[test]
fn several_tenants_models_dimensions_and_the_tenants_listing() {
    let dir = TempDir::new("api-queries");
    let cfg = dir.path().join("api.toml");
    std::fs::write(&cfg, format!("{PRICES}\n[api]\nrate_limit = 0\n")).unwrap();
    let cfg = cfg.to_str().unwrap();
    let db = fresh_database("apiqueries");
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(60),
    );
    // acme: small 5; globex: small 3 + large 4; initech: only an adjustment (large 2).
    execute(&db, DATA);
    execute(
        &db,
        "INSERT INTO tenant_cost_adjustment VALUES ('late-1', 'initech', 1767261600000, 1767261660000, 2, 1, 1, 0, 'requests.late/0/9', now(), 'large');",
    );
    let (api, addr, admin) = crate::usage_api::start_api(dir.path(), cfg, &db, "api");
    let keys = dir.path().join("api.keys");
    let keys = keys.to_str().unwrap();
    let acme = mint(cfg, keys, "acme", "tenant:acme");
    let partner = mint(cfg, keys, "partner", "tenant:acme,initech,umbrella");
    signal(api.id(), libc::SIGHUP);
    wait_until("the keys are taken", Duration::from_secs(10), || {
        (get(&addr, &partner, "/v1/tenants", "*/*").0 == 200).then_some(())
    });

    // Dimensions: tenant by default; model alone sums the tenants; both.
    assert_eq!(
        rows(&addr, &admin, ""),
        ["acme/-=5", "globex/-=7", "initech/-=2"]
    );
    assert_eq!(
        rows(&addr, &admin, "&group_by=tenant"),
        rows(&addr, &admin, "")
    );
    assert_eq!(
        rows(&addr, &admin, "&group_by=model"),
        ["-/large=6", "-/small=8"]
    );
    let both = [
        "acme/small=5",
        "globex/large=4",
        "globex/small=3",
        "initech/large=2",
    ];
    assert_eq!(rows(&addr, &admin, "&group_by=tenant&group_by=model"), both);
    assert_eq!(
        rows(
            &addr,
            &admin,
            "&group_by=model&group_by=tenant&group_by=model"
        ),
        both
    );
    // Several tenants; a filter by model, with and without its dimension.
    assert_eq!(
        rows(&addr, &admin, "&tenant_id=globex&tenant_id=acme"),
        ["acme/-=5", "globex/-=7"]
    );
    assert_eq!(
        rows(
            &addr,
            &admin,
            "&tenant_id=globex&tenant_id=initech&group_by=model"
        ),
        ["-/large=6", "-/small=3"]
    );
    assert_eq!(
        rows(&addr, &admin, "&model=large"),
        ["globex/-=4", "initech/-=2"]
    );
    assert_eq!(
        rows(&addr, &admin, "&model=large&model=small&group_by=model"),
        ["-/large=6", "-/small=8"]
    );
    assert_eq!(rows(&addr, &admin, "&model=nothing"), Vec::<String>::new());
    // Pages of one row through two dimensions: complete, in order.
    let mut paged = vec![];
    let mut page = String::new();
    loop {
        let (status, body) = get(
            &addr,
            &admin,
            &format!("{Q}&group_by=tenant&group_by=model&limit=1{page}"),
            "*/*",
        );
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let r = &v["data"][0];
        paged.push(format!(
            "{}/{}={}",
            r["tenant_id"].as_str().unwrap(),
            r["model"].as_str().unwrap(),
            r["cost_pico"].as_str().unwrap()
        ));
        match v["next_page"].as_str() {
            Some(t) => page = format!("&page={t}"),
            None => break,
        }
    }
    assert_eq!(paged, both);
    // CSV: the columns of the dimensions asked for.
    let (status, csv) = get(&addr, &admin, &format!("{Q}&group_by=model"), "text/csv");
    assert_eq!(status, 200, "{csv}");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("window_start,window_end,model,cost_pico,usd,requests,prompt_tokens,completion_tokens,final")
    );
    assert_eq!(
        lines
            .map(|l| l.split(',').nth(2).unwrap())
            .collect::<Vec<_>>(),
        ["large", "small"]
    );

    // A tenant key reads its scope; a tenant outside it, alone or among others,
    // in JSON or CSV, answers 404 naming it — whether or not it exists.
    assert_eq!(rows(&addr, &acme, ""), ["acme/-=5"]);
    assert_eq!(rows(&addr, &acme, "&group_by=model"), ["-/small=5"]);
    assert_eq!(rows(&addr, &partner, ""), ["acme/-=5", "initech/-=2"]);
    assert_eq!(
        rows(&addr, &partner, "&group_by=model"),
        ["-/large=2", "-/small=5"]
    );
    assert_eq!(
        rows(&addr, &partner, "&tenant_id=umbrella"),
        Vec::<String>::new()
    );
    for (key, query, outside) in [
        (&acme, "&tenant_id=globex", "globex"),
        (&acme, "&tenant_id=acme&tenant_id=globex", "globex"),
        (
            &acme,
            "&tenant_id=acme&tenant_id=nobody&group_by=model",
            "nobody",
        ),
        (&partner, "&tenant_id=initech&tenant_id=globex", "globex"),
    ] {
        for accept in ["application/json", "text/csv"] {
            let (status, body) = get(&addr, key, &format!("{Q}{query}"), accept);
            assert_eq!(status, 404, "{query} {accept}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["parameter"], "tenant_id");
            assert_eq!(v["detail"], format!("unknown tenant \"{outside}\""));
            assert!(!body.contains('7') && !body.contains("large"), "{body}");
        }
    }

    // The tenants listing: every tenant with data to an admin key (paged); a
    // tenant key's own, known ones.
    assert_eq!(listing(&addr, &admin, "").0, ["acme", "globex", "initech"]);
    let (first, next) = listing(&addr, &admin, "?limit=2");
    assert_eq!(first, ["acme", "globex"]);
    let (rest, end) = listing(&addr, &admin, &format!("?limit=2&page={}", next.unwrap()));
    assert_eq!((rest, end), (vec!["initech".to_string()], None));
    assert_eq!(listing(&addr, &acme, "").0, ["acme"]);
    assert_eq!(listing(&addr, &partner, "").0, ["acme", "initech"]);
}
