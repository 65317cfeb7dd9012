//! The usage API's representations (issue 37, step 4), on real PostgreSQL over a
//! real socket: `Accept` with q-values (`q=0` never selects), 406 when nothing
//! offered is acceptable, and CSV cells that would run as spreadsheet formulas
//! neutralised (OWASP).

use std::time::Duration;

use crate::api_http::api_request;
use crate::common::*;

fn get(addr: &str, key: &str, path: &str, accept: &str) -> (u16, String, String) {
    let r = api_request(addr, path, Some(&format!("Bearer {key}")), accept);
    let content_type = r.header("content-type");
    (r.status, content_type, r.body)
}

#[test]
fn q_values_406_and_formula_cells() {
    let dir = TempDir::new("api-csv");
    let cfg = dir.path().join("api.toml");
    std::fs::write(&cfg, format!("{PRICES}\n[window]\nsize = \"1h\"\n")).unwrap();
    let cfg = cfg.to_str().unwrap();
    let db = fresh_database("apicsv");
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(60),
    );
    // Tenant ids come from producers: one is a formula, one starts with '-'.
    execute(
        &db,
        "INSERT INTO tenant_cost_partial VALUES ('=HYPERLINK(\"http://x\",\"y\")', 1767265200000, 0, 1767261600000, 5, 1, 1, 1, 1, 1, 'on_time', 0);
         INSERT INTO tenant_cost_partial VALUES ('-2+3', 1767265200000, 0, 1767261600000, 7, 1, 1, 1, 1, 1, 'on_time', 0);",
    );
    let (_api, addr, key) = crate::usage_api::start_api(dir.path(), cfg, &db, "api");
    let q = "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&window=hour";

    let (status, ct, csv) = get(&addr, &key, q, "text/csv");
    assert_eq!(status, 200, "{csv}");
    assert!(ct.starts_with("text/csv"), "{ct}");
    let cells: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split_once(",2026-").map(|(t, _)| t).unwrap_or(l))
        .collect();
    assert_eq!(
        cells,
        [r#""'-2+3""#, r#""'=HYPERLINK(""http://x"",""y"")""#],
        "{csv}"
    );
    assert!(csv
        .lines()
        .skip(1)
        .all(|l| !l.starts_with(['=', '+', '-', '@'])));

    for (accept, want_status, want_type) in [
        ("text/csv;q=0", 406, "application/problem+json"),
        ("text/csv;q=0, */*", 200, "application/json"),
        ("text/*;q=0.9, application/json;q=0.5", 200, "text/csv"),
        (
            "application/json;q=0.9, text/csv;q=0.2",
            200,
            "application/json",
        ),
        ("image/png", 406, "application/problem+json"),
    ] {
        let (status, ct, body) = get(&addr, &key, q, accept);
        assert_eq!(
            (status, ct.split(';').next().unwrap()),
            (want_status, want_type),
            "{accept}: {body}"
        );
    }
    let (status, ct, body) = get(&addr, &key, "/v1/invoices/acme?period=2026-01", "text/csv");
    assert_eq!(
        (status, ct.as_str()),
        (406, "application/problem+json"),
        "{body}"
    );
    // RFC 9457 problem details, with the first version's fields inside.
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["status"].as_u64(), v["title"].as_str()),
        (Some(406), Some("Not Acceptable"))
    );
    assert_eq!(v["type"], "about:blank");
    assert_eq!(v["detail"], v["error"]["message"]);
    let (status, _, body) = get(&addr, &key, "/v1/usage?from=x&to=y", "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, v["parameter"].as_str()),
        (400, Some("from")),
        "{body}"
    );
    let (status, _, _) = get(&addr, &key, "/v1/invoices/acme?period=2026-01", "*/*");
    assert_eq!(status, 200);
}
