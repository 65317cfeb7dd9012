//! docs/openapi.yaml against the real server (issue 37, step 6): `tally api` on
//! real PostgreSQL over a real socket. Every answer the test provokes is checked
//! against the spec — its status is documented for its route, its content type
//! too, its documented headers are there, and its body validates against the
//! documented schema (objects closed: no undocumented field); every documented
//! route, parameter and status is exercised and each documented status seen;
//! undocumented parameters, paths and methods are refused (400, 404, 405).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;
use crate::openapi_check::Spec;

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    }

    /// The `parameter` of a problem answer.
    fn parameter(&self) -> Option<String> {
        let v: Value = serde_json::from_str(&self.body).ok()?;
        v["parameter"].as_str().map(str::to_string)
    }
}

/// The server, the spec, and the (path, method, status) answers seen.
struct Probe {
    spec: Spec,
    base: String,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    seen: BTreeSet<(String, String, String)>,
}

impl Probe {
    fn request(&self, method: &str, path: &str, key: Option<&str>, accept: &str) -> Reply {
        self.rt.block_on(async {
            let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let mut req = self
                .http
                .request(method, format!("{}{path}", self.base))
                .header("accept", accept)
                .timeout(Duration::from_secs(30));
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            let r = req.send().await.unwrap();
            Reply {
                status: r.status().as_u16(),
                headers: r.headers().clone(),
                body: r.text().await.unwrap(),
            }
        })
    }

    /// `method path` (`template` is its path in the spec, `None` for a path the
    /// spec does not list), checked against the spec.
    fn call(
        &mut self,
        method: &str,
        template: Option<&str>,
        path: &str,
        key: Option<&str>,
        accept: &str,
    ) -> Reply {
        let r = self.request(method, path, key, accept);
        let what = format!("{method} {path} (Accept: {accept}) → {}", r.status);
        let op = template.and_then(|t| {
            let m = if method == "HEAD" {
                "get"
            } else {
                &method.to_lowercase()
            };
            self.spec.0["paths"][t].get(m).cloned()
        });
        let response = match (&op, template) {
            (Some(op), _) => {
                let status = r.status.to_string();
                let documented = op["responses"].get(&status);
                assert!(
                    documented.is_some(),
                    "{what}: status not documented: {}",
                    r.body
                );
                let t = template.unwrap();
                self.seen.insert((t.into(), method.into(), status));
                self.spec.deref(documented.unwrap()).clone()
            }
            (None, Some(_)) => {
                assert_eq!(r.status, 405, "{what}: an undocumented method served");
                self.spec.0["components"]["responses"]["MethodNotAllowed"].clone()
            }
            (None, None) => {
                assert_eq!(r.status, 404, "{what}: an undocumented path served");
                self.spec.0["components"]["responses"]["NotFound"].clone()
            }
        };
        self.conforms(&what, &r, &response, method == "HEAD");
        r
    }

    /// The answer against the documented response: headers, type, body.
    fn conforms(&self, what: &str, r: &Reply, response: &Value, head: bool) {
        for (name, h) in response["headers"].as_object().into_iter().flatten() {
            let value = r.header(name);
            let value = value.unwrap_or_else(|| panic!("{what}: no {name} header"));
            let schema = &self.spec.deref(h)["schema"];
            let v = match schema["type"].as_str() {
                Some("integer") => serde_json::from_str(&value)
                    .unwrap_or_else(|_| panic!("{what}: {name}: {value:?} is not an integer")),
                _ => Value::String(value),
            };
            let errors = self.spec.check(schema, &v, name);
            assert!(errors.is_empty(), "{what}: {errors:?}");
        }
        let Some(content) = response["content"].as_object() else {
            return assert!(r.body.is_empty(), "{what}: a body where none is documented");
        };
        let ct = r.header("content-type").unwrap_or_default();
        let squeeze = |s: &str| s.replace(' ', "").to_ascii_lowercase();
        let (_, media) = content
            .iter()
            .find(|(k, _)| squeeze(k) == squeeze(&ct))
            .unwrap_or_else(|| panic!("{what}: content type {ct:?} not documented"));
        if head {
            return assert!(r.body.is_empty(), "{what}: HEAD answered a body");
        }
        let schema = &media["schema"];
        if ct.starts_with("text/csv") {
            // The columns are the row's documented fields.
            let name = if what.contains("/v1/explain/") {
                "ExplainRow"
            } else {
                "UsageRow"
            };
            let row = self.spec.deref(&self.spec.0["components"]["schemas"][name]);
            let header = r.body.split("\r\n").next().unwrap();
            for column in header.split(',') {
                assert!(
                    row["properties"].get(column).is_some(),
                    "{what}: the CSV column {column:?} is not a documented field"
                );
            }
            return;
        }
        let body = if ct.starts_with("text/") {
            Value::String(r.body.clone())
        } else {
            serde_json::from_str(&r.body)
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", r.body))
        };
        let errors = self.spec.check(schema, &body, "body");
        assert!(errors.is_empty(), "{what}: {errors:?}\n{}", r.body);
    }
}

/// A valid value for a parameter the base query does not give.
fn sample(name: &str) -> &'static str {
    match name {
        "tenant_id" => "acme",
        "model" => "small",
        "variant" => "batch",
        "plan" => "enterprise",
        "quantity" => "prompt_tokens",
        "tz" => "Europe/Berlin",
        "limit" => "5",
        "window_end" => "2026-01-01T10:02:00Z",
        other => panic!("no sample value for {other}"),
    }
}

/// Every documented query parameter of `template`, through `path?base`: each
/// value its schema admits is served, each it refuses is 400 naming it, its
/// default is the answer without it, a required one is missing, a scalar one
/// repeated, an array one repeated; and an undocumented one is 400.
fn parameters(p: &mut Probe, key: &str, template: &str, path: &str, base: &str) {
    let json = "application/json";
    let op = p.spec.0["paths"][template]["get"].clone();
    let get = |p: &mut Probe, q: String| {
        let sep = if base.is_empty() || q.is_empty() {
            ""
        } else {
            "&"
        };
        p.call(
            "GET",
            Some(template),
            &format!("{path}?{base}{sep}{q}"),
            Some(key),
            json,
        )
    };
    let without = |name: &str| -> String {
        base.split('&')
            .filter(|kv| !kv.starts_with(&format!("{name}=")))
            .collect::<Vec<_>>()
            .join("&")
    };
    let refused = |r: &Reply, name: &str, case: &str| {
        assert_eq!(
            (r.status, r.parameter().as_deref()),
            (400, Some(name)),
            "{template} {name} {case}: {}",
            r.body
        );
    };
    let r = get(p, "zzz=1".into());
    refused(&r, "zzz", "undocumented");
    for param in op["parameters"].as_array().unwrap() {
        let param = p.spec.deref(param).clone();
        let name = param["name"].as_str().unwrap();
        if param["in"] != "query" {
            continue;
        }
        let schema = param["schema"].clone();
        let given = base
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")));
        if param["required"] == true {
            assert!(given.is_some(), "{template}: the base query lacks {name}");
            let q = without(name);
            let r = p.call(
                "GET",
                Some(template),
                &format!("{path}?{q}"),
                Some(key),
                json,
            );
            refused(&r, name, "missing");
        }
        let array = schema["type"] == "array";
        let items = if array {
            schema["items"].clone()
        } else {
            schema.clone()
        };
        let one = |v: &str| format!("{name}={v}");
        // Admitted values: the enum's, or a sample; each served.
        let values: Vec<String> = match items["enum"].as_array() {
            Some(e) => e.iter().map(|v| v.as_str().unwrap().to_string()).collect(),
            None => match given {
                Some(v) => vec![v.to_string()],
                None if name == "page" => vec![],
                None => vec![sample(name).to_string()],
            },
        };
        let rest = without(name);
        let with = |p: &mut Probe, q: String| {
            let sep = if rest.is_empty() { "" } else { "&" };
            p.call(
                "GET",
                Some(template),
                &format!("{path}?{rest}{sep}{q}"),
                Some(key),
                json,
            )
        };
        for v in &values {
            let r = with(p, one(v));
            assert_eq!(r.status, 200, "{template} {name}={v}: {}", r.body);
        }
        // Repeated: a list's values are served together; a scalar is refused.
        if let Some(v) = values.first() {
            let twice = format!("{}&{}", one(v), one(values.last().unwrap()));
            let r = with(p, twice);
            if array {
                assert_eq!(r.status, 200, "{template} {name} twice: {}", r.body);
            } else {
                refused(&r, name, "twice");
            }
        }
        // Refused values, from the schema's own bounds.
        let mut bad: Vec<String> = vec![];
        if items["enum"].is_array()
            || items["format"] == "date-time"
            || items["pattern"].is_string()
        {
            bad.push("zzz".into());
        }
        if items["minLength"].as_u64() == Some(1) {
            bad.push(String::new());
        }
        if let Some(max) = items["maxLength"].as_u64() {
            bad.push("A".repeat(max as usize + 1));
        }
        if let Some(min) = items["minimum"].as_i64() {
            bad.push((min - 1).to_string());
            let r = with(p, one(&min.to_string()));
            assert_eq!(r.status, 200, "{template} {name}={min}: {}", r.body);
        }
        if let Some(max) = items["maximum"].as_i64() {
            bad.push((max + 1).to_string());
        }
        if name == "page" {
            bad.push("not-a-token".into());
        }
        assert!(!bad.is_empty(), "{template}: no refused value for {name}");
        for v in bad {
            let r = with(p, one(&v));
            refused(&r, name, &format!("={v:?}"));
        }
        // The default is the answer without the parameter.
        if let Some(d) = schema.get("default") {
            let q = match d {
                Value::Array(vs) => vs
                    .iter()
                    .map(|v| one(v.as_str().unwrap()))
                    .collect::<Vec<_>>()
                    .join("&"),
                Value::Number(n) => one(&n.to_string()),
                v => one(v.as_str().unwrap()),
            };
            let explicit = with(p, q).body;
            let implicit = with(p, String::new()).body;
            assert_eq!(explicit, implicit, "{template}: {name}'s default");
        }
    }
}

const USAGE: &str = "from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&window=hour";

/// acme's window of `api_queries::DATA` billed by a rating, with a variant and a
/// plan: the quantity rows and the invoice's quantity lines have every field.
const RATED: &str = "INSERT INTO tenant_cost_quantity_partial VALUES
  ('acme', 1767261660000, 0, 'small', 'batch', 'enterprise', 'prompt_tokens', 1767261600000, 1, 4, 1, 1),
  ('acme', 1767261660000, 0, 'small', '', '', 'fee', 1767261600000, 1, 1, 1, 1);";

/// acme's requests on the input topic /v1/explain replays: r-1, its duplicate,
/// r-2, in the minute 10:00.
fn input() -> DevBroker {
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let t10 = 1_767_261_600_000;
    let records = [
        event("r-1", "acme", "small", t10 + 10_000),
        event("r-1", "acme", "small", t10 + 10_000),
        event("r-2", "acme", "small", t10 + 20_000),
    ];
    produce(&broker, "requests", 0, "acme", &records);
    broker
}

const EXPLAIN: &str = "window_start=2026-01-01T10:00:00Z";

#[test]
fn the_server_answers_as_docs_openapi_yaml_says() {
    let dir = TempDir::new("api-openapi");
    let cfg = dir.path().join("api.toml");
    let broker = input();
    // At most 4 input records explained: the 3 produced, then 5 (422).
    std::fs::write(
        &cfg,
        format!(
            "{PRICES}\n[kafka]\nbootstrap_servers = \"{}\"\n[api]\nmax_concurrent = 1\n\
             rate_limit = 0\nquery_timeout = \"4s\"\nexplain_max_records = 4\n",
            broker.bootstrap
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let db = fresh_database("apispec");
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(60),
    );
    execute(&db, crate::api_queries::DATA);
    // acme's window, as a rating bills it: its quantity rows (issue 36).
    execute(&db, RATED);
    let (api, addr, admin) = crate::usage_api::start_api(dir.path(), cfg, &db, "api");
    let keys = dir.path().join("api.keys");
    let acme = crate::usage_api::mint(cfg, keys.to_str().unwrap(), "acme", "tenant:acme");
    signal(api.id(), libc::SIGHUP);
    let spec = Spec::load();
    assert_eq!(
        spec.0["components"]["securitySchemes"]["apiKey"]["scheme"],
        "bearer"
    );
    let mut p = Probe {
        spec,
        base: format!("http://{addr}"),
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        http: reqwest::Client::new(),
        seen: BTreeSet::new(),
    };
    wait_until("the tenant key is taken", Duration::from_secs(10), || {
        (p.request("GET", "/v1/tenants", Some(&acme), "*/*").status == 200).then_some(())
    });
    let (json, any) = ("application/json", "*/*");
    let usage = Some("/v1/usage");
    let invoice = Some("/v1/invoices/{tenant_id}");
    let tenants = Some("/v1/tenants");
    let explain = Some("/v1/explain/{tenant_id}");

    // Every route, GET and HEAD; the probes without a key, the rest with one.
    let routes = [
        ("/v1/usage", format!("/v1/usage?{USAGE}")),
        (
            "/v1/invoices/{tenant_id}",
            "/v1/invoices/acme?period=2026-01".into(),
        ),
        ("/v1/tenants", "/v1/tenants".into()),
        (
            "/v1/explain/{tenant_id}",
            format!("/v1/explain/acme?{EXPLAIN}"),
        ),
        ("/healthz", "/healthz".into()),
        ("/readyz", "/readyz".into()),
        ("/metrics", "/metrics".into()),
        ("/status", "/status".into()),
        ("/status.json", "/status.json".into()),
    ];
    let documented: BTreeSet<&str> = p.spec.0["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        documented,
        routes.iter().map(|r| r.0).collect(),
        "a route without a check here"
    );
    for (template, path) in &routes {
        let open = p.spec.0["paths"][*template]["get"]["security"] == serde_json::json!([]);
        let key = if open { None } else { Some(admin.as_str()) };
        for method in ["GET", "HEAD"] {
            let r = p.call(method, Some(template), path, key, any);
            assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
        }
        if !open {
            assert_eq!(p.call("GET", Some(template), path, None, any).status, 401);
        }
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let r = p.call(method, Some(template), path, key, any);
            assert_eq!(r.header("allow").as_deref(), Some("GET, HEAD"));
        }
    }
    let r = p.call(
        "GET",
        usage,
        &format!("/v1/usage?{USAGE}"),
        Some(&admin),
        "text/csv",
    );
    assert!(r.body.starts_with("tenant_id,window_start"), "{}", r.body);
    let r = p.call(
        "GET",
        explain,
        &format!("/v1/explain/acme?{EXPLAIN}"),
        Some(&admin),
        "text/csv",
    );
    assert!(r.body.starts_with("partition,offset"), "{}", r.body);
    assert_eq!(r.body.matches("\r\n").count(), 4, "{}", r.body);
    // Quantity rows with every dimension and `count`, in JSON and CSV; the
    // invoice's quantity lines with a variant and a plan.
    let every = format!(
        "/v1/usage?{USAGE}&group_by=tenant&group_by=model&group_by=variant&group_by=plan&group_by=quantity"
    );
    for accept in [json, "text/csv"] {
        let r = p.call("GET", usage, &every, Some(&admin), accept);
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.body.contains("enterprise") && r.body.contains("fee"),
            "{}",
            r.body
        );
    }
    let r = p.call(
        "GET",
        invoice,
        "/v1/invoices/acme?period=2026-01",
        Some(&admin),
        json,
    );
    assert!(
        r.body
            .contains(r#""description":"small (batch; plan enterprise) — prompt_tokens""#),
        "{}",
        r.body
    );
    for path in [
        "/",
        "/v1",
        "/v1/usage/x",
        "/v1/invoices/a/b",
        "/v1/tenants/acme",
        "/v1/explain/acme/x",
        "/v2/usage",
    ] {
        p.call("GET", None, path, Some(&admin), any);
    }

    // Every parameter.
    let base = USAGE;
    parameters(&mut p, &admin, "/v1/usage", "/v1/usage", base);
    parameters(
        &mut p,
        &admin,
        "/v1/invoices/{tenant_id}",
        "/v1/invoices/acme",
        "period=2026-01",
    );
    parameters(&mut p, &admin, "/v1/tenants", "/v1/tenants", "");
    parameters(
        &mut p,
        &admin,
        "/v1/explain/{tenant_id}",
        "/v1/explain/acme",
        EXPLAIN,
    );
    // A path parameter that is empty; a page token followed.
    p.call(
        "GET",
        invoice,
        "/v1/invoices/?period=2026-01",
        Some(&admin),
        json,
    );
    for (template, first) in [
        (usage, format!("/v1/usage?{USAGE}&group_by=model&limit=1")),
        (tenants, "/v1/tenants?limit=1".into()),
        (explain, format!("/v1/explain/acme?{EXPLAIN}&limit=1")),
    ] {
        let r = p.call("GET", template, &first, Some(&admin), json);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        let next = v["next_page"].as_str().expect("a next page");
        let r = p.call(
            "GET",
            template,
            &format!("{first}&page={next}"),
            Some(&admin),
            json,
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }

    // 404 (a tenant outside the key's scope), 406.
    for path in [
        format!("/v1/usage?{USAGE}&tenant_id=globex"),
        format!("/v1/usage?{USAGE}&tenant_id=acme&tenant_id=globex"),
    ] {
        assert_eq!(p.call("GET", usage, &path, Some(&acme), json).status, 404);
    }
    assert_eq!(
        p.call(
            "GET",
            invoice,
            "/v1/invoices/globex?period=2026-01",
            Some(&acme),
            json
        )
        .status,
        404
    );
    assert_eq!(
        p.call(
            "GET",
            explain,
            &format!("/v1/explain/globex?{EXPLAIN}"),
            Some(&acme),
            json
        )
        .status,
        404
    );
    for (template, path) in &routes[..4] {
        p.call("GET", Some(template), path, Some(&admin), "image/png");
    }

    // 429 (one request in flight at most) and 503 (api.query_timeout), while a
    // lock holds every query.
    let lock = crate::api_limits::Lock::take(&db);
    let held = {
        let (addr, admin) = (addr.clone(), admin.clone());
        std::thread::spawn(move || {
            crate::api_http::api_request(
                &addr,
                &format!("/v1/usage?{USAGE}"),
                Some(&format!("Bearer {admin}")),
                "application/json",
            )
        })
    };
    lock.wait_for_waiters(1);
    for (template, path) in &routes[..4] {
        let r = p.call("GET", Some(template), path, Some(&acme), json);
        assert_eq!(r.status, 429, "{path}: {}", r.body);
    }
    let held = held.join().unwrap();
    assert_eq!(held.status, 503, "{}", held.body);
    for (template, path) in &routes[..3] {
        assert_eq!(
            p.call("GET", Some(template), path, Some(&admin), json)
                .status,
            503
        );
    }
    lock.release();

    // 500: values the schema should not hold (a negative cost), a column gone.
    execute(&db, "INSERT INTO tenant_cost_partial VALUES ('broken', 1767261660000, 0, 1767261600000, -5, 1, 1, 1, 1, 1, 'on_time', 0);
         INSERT INTO tenant_cost_line_partial VALUES ('broken', 1767261660000, 0, 'small', 1767261600000, -5, 1, 1, 1, 1, 1);");
    for (template, path) in [
        (usage, format!("/v1/usage?{USAGE}&tenant_id=broken")),
        (invoice, "/v1/invoices/broken?period=2026-01".into()),
    ] {
        let r = p.call("GET", template, &path, Some(&admin), json);
        assert_eq!(r.status, 500, "{path}: {}", r.body);
    }
    execute(
        &db,
        "ALTER TABLE tenant_cost_adjustment RENAME COLUMN tenant_id TO tenant",
    );
    let r = p.call("GET", tenants, "/v1/tenants", Some(&admin), json);
    assert_eq!(r.status, 500, "{}", r.body);
    // /readyz: a schema older than the queries need (the newest migration missing:
    // 5, the usage functions that read only the windows of their range).
    execute(&db, "DELETE FROM tally_migrations WHERE version = 5");
    assert_eq!(
        p.call("GET", Some("/readyz"), "/readyz", None, any).status,
        503
    );

    // /v1/explain: an input over api.explain_max_records is 422; a broker that
    // does not answer, 503.
    let t10 = 1_767_261_600_000;
    let more = [
        event("r-3", "acme", "small", t10 + 30_000),
        event("r-4", "acme", "small", t10 + 40_000),
    ];
    produce(&broker, "requests", 0, "acme", &more);
    let path = format!("/v1/explain/acme?{EXPLAIN}");
    let r = p.call("GET", explain, &path, Some(&admin), json);
    assert_eq!(r.status, 422, "{}", r.body);
    broker.kill();
    let r = p.call("GET", explain, &path, Some(&admin), json);
    assert_eq!(r.status, 503, "{}", r.body);

    // Every documented status was answered.
    let mut missing = vec![];
    for (template, item) in p.spec.0["paths"].as_object().unwrap() {
        for status in item["get"]["responses"].as_object().unwrap().keys() {
            if !p
                .seen
                .contains(&(template.clone(), "GET".into(), status.clone()))
            {
                missing.push(format!("GET {template} {status}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "documented but never answered: {missing:?}"
    );
}
