//! Line items, calendar rollups and the usage API (docs/API.md) end to end:
//! generated traffic over three models and four days (a daylight-saving change in
//! Berlin, a month end), the real sink, `tally api`, and an HTTP client.
//!
//! The oracle is independent of PostgreSQL's time zones: the zones' offsets are
//! written out here (UTC; Asia/Kolkata +05:30; Europe/Berlin by the EU rule,
//! summer time from 2026-03-29T01:00Z), and buckets are computed from the minute
//! rows of the view.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use tally::model::Pico;
use tally::time::utc::parse_utc_ms;

const BERLIN_SUMMER: (i64, i64) = (1_774_746_000_000, 1_792_890_000_000);
const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

fn offset(tz: &str, t: i64) -> i64 {
    match tz {
        "UTC" => 0,
        "Asia/Kolkata" => 5 * HOUR + HOUR / 2,
        "Europe/Berlin" if (BERLIN_SUMMER.0..BERLIN_SUMMER.1).contains(&t) => 2 * HOUR,
        "Europe/Berlin" => HOUR,
        other => panic!("no offsets for {other}"),
    }
}

/// The UTC instant of a local time (unique at the bucket bounds used here).
fn utc_of(tz: &str, local: i64) -> i64 {
    [0, HOUR, 2 * HOUR, 5 * HOUR + HOUR / 2]
        .into_iter()
        .map(|o| local - o)
        .find(|&u| offset(tz, u) == local - u)
        .unwrap()
}

/// The bucket of `unit` in `tz` holding the instant `t`.
fn bucket(unit: &str, tz: &str, t: i64) -> (i64, i64) {
    use chrono::{Datelike, NaiveDate};
    let local = t + offset(tz, t);
    // Minutes and hours are fixed lengths (an hour's end may be a local time that
    // does not exist, like 02:00 on the spring-forward day); days and months end
    // at the next local midnight.
    let fixed = |size: i64| {
        let start = utc_of(tz, local - local.rem_euclid(size));
        (start, start + size)
    };
    match unit {
        "minute" => fixed(60_000),
        "hour" => fixed(HOUR),
        "day" => {
            let ls = local - local.rem_euclid(DAY);
            (utc_of(tz, ls), utc_of(tz, ls + DAY))
        }
        "month" => {
            let date = chrono::DateTime::from_timestamp_millis(local)
                .unwrap()
                .date_naive();
            let first = NaiveDate::from_ymd_opt(date.year(), date.month(), 1).unwrap();
            let next = first + chrono::Months::new(1);
            let ms = |d: NaiveDate| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp_millis();
            (utc_of(tz, ms(first)), utc_of(tz, ms(next)))
        }
        other => panic!("{other}"),
    }
}

/// One minute row of the view: `(tenant, start, end, model)` → sums.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Sums {
    cost: u128,
    requests: u64,
    prompt: u64,
    completion: u64,
}

type Minutes = Vec<(String, i64, i64, Option<String>, Sums, bool)>;

fn minutes(db: &str, by_model: bool) -> Minutes {
    let (model, view) = if by_model {
        ("model", "tenant_cost_minute_line")
    } else {
        ("NULL", "tenant_cost_minute")
    };
    query(
        db,
        &format!("SELECT tenant_id, window_start::TEXT, window_end::TEXT, {model}, cost_pico::TEXT, requests::TEXT, prompt_tokens::TEXT, completion_tokens::TEXT, final::TEXT FROM {view}"),
    )
    .into_iter()
    .map(|r| {
        let s = |i: usize| r[i].clone().unwrap();
        (
            s(0),
            s(1).parse().unwrap(),
            s(2).parse().unwrap(),
            r[3].clone(),
            Sums {
                cost: s(4).parse().unwrap(),
                requests: s(5).parse().unwrap(),
                prompt: s(6).parse().unwrap(),
                completion: s(7).parse().unwrap(),
            },
            s(8) == "true",
        )
    })
    .collect()
}

/// A usage row as compared: `(start, tenant, model)` → `(end, sums, usd, final)`.
type Rows = Vec<((i64, String, Option<String>), (i64, Sums, String, bool))>;

#[allow(clippy::too_many_arguments)]
fn oracle(
    m: &Minutes,
    unit: &str,
    tz: &str,
    tenant: Option<&str>,
    from: i64,
    to: i64,
    final_through: Option<i64>,
) -> Rows {
    let mut out: BTreeMap<(i64, String, Option<String>), (i64, Sums)> = BTreeMap::new();
    for (t, start, end, model, sums, _) in m {
        if *start < from || *start >= to || tenant.is_some_and(|x| x != t) {
            continue;
        }
        let (bs, be) = bucket(unit, tz, *start);
        assert!(*end <= be, "a minute crosses a {unit} in {tz}");
        let e = out
            .entry((bs.max(from), t.clone(), model.clone()))
            .or_insert((be.min(to), Sums::default()));
        e.1.cost += sums.cost;
        e.1.requests += sums.requests;
        e.1.prompt += sums.prompt;
        e.1.completion += sums.completion;
    }
    // Tenant ids and models by their bytes, like the API.
    out.into_iter()
        .map(|(k, (end, s))| {
            let usd = Pico(s.cost).usd_string();
            let fin = final_through.is_some_and(|f| end <= f);
            (k, (end, s, usd, fin))
        })
        .collect()
}

fn parse_rows(v: &serde_json::Value, by_model: bool) -> Rows {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let t = |k: &str| parse_utc_ms(r[k].as_str().unwrap()).unwrap();
            let n = |k: &str| r[k].as_u64().unwrap();
            let model = r.get("model").map(|m| m.as_str().unwrap().to_string());
            assert_eq!(model.is_some(), by_model, "{r}");
            let cost = r["cost_pico"].as_str().unwrap();
            assert!(cost.bytes().all(|b| b.is_ascii_digit()), "{r}");
            (
                (
                    t("window_start"),
                    r["tenant_id"].as_str().unwrap().to_string(),
                    model,
                ),
                (
                    t("window_end"),
                    Sums {
                        cost: cost.parse().unwrap(),
                        requests: n("requests"),
                        prompt: n("prompt_tokens"),
                        completion: n("completion_tokens"),
                    },
                    r["usd"].as_str().unwrap().to_string(),
                    r["final"].as_bool().unwrap(),
                ),
            )
        })
        .collect()
}

fn parse_csv(text: &str, by_model: bool) -> Rows {
    let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
    let header = lines.next().unwrap();
    let want = if by_model {
        "tenant_id,window_start,window_end,model,cost_pico,usd,requests,prompt_tokens,completion_tokens,final"
    } else {
        "tenant_id,window_start,window_end,cost_pico,usd,requests,prompt_tokens,completion_tokens,final"
    };
    assert_eq!(header, want);
    lines
        .map(|l| {
            let mut f: Vec<&str> = l.split(',').collect();
            let model = by_model.then(|| f.remove(3).to_string());
            let n = |i: usize| f[i].parse::<u64>().unwrap();
            (
                (parse_utc_ms(f[1]).unwrap(), f[0].to_string(), model),
                (
                    parse_utc_ms(f[2]).unwrap(),
                    Sums {
                        cost: f[3].parse().unwrap(),
                        requests: n(5),
                        prompt: n(6),
                        completion: n(7),
                    },
                    f[4].to_string(),
                    f[8] == "true",
                ),
            )
        })
        .collect()
}

/// A real HTTP client (reqwest) on a runtime of its own.
struct Client {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    fn new(addr: &str, key: &str) -> Self {
        Client {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
            key: key.to_string(),
        }
    }

    fn get(&self, path: &str, accept: &str) -> (u16, String) {
        self.rt.block_on(async {
            let r = self
                .http
                .get(format!("{}{path}", self.base))
                .bearer_auth(&self.key)
                .header("accept", accept)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        })
    }

    fn json(&self, path: &str) -> (u16, serde_json::Value) {
        let (s, body) = self.get(path, "application/json");
        (
            s,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
        )
    }

    /// Every page of a usage query, following `next_page`; checks each page's size.
    fn all_pages(&self, query: &str, limit: usize, by_model: bool) -> Rows {
        let mut rows = Rows::new();
        let mut page: Option<String> = None;
        loop {
            let path = match &page {
                None => format!("/v1/usage?{query}&limit={limit}"),
                Some(p) => format!("/v1/usage?{query}&limit={limit}&page={p}"),
            };
            let (status, v) = self.json(&path);
            assert_eq!(status, 200, "{path}: {v}");
            let data = parse_rows(&v["data"], by_model);
            assert!(data.len() <= limit);
            rows.extend(data);
            match v["next_page"].as_str() {
                Some(p) => page = Some(p.to_string()),
                None => return rows,
            }
        }
    }
}

/// Starts `tally api` with an admin key minted for it (`tally api-key create`):
/// the service, its address and the key.
pub(crate) fn start_api(dir: &Path, cfg: &str, db: &str, name: &str) -> (Service, String, String) {
    let keys = dir.join(format!("{name}.keys"));
    let keys = keys.to_str().unwrap();
    let key = mint(cfg, keys, &format!("{name}-admin"), "admin");
    let svc = Service::start(
        &["api", "--config", cfg],
        &[
            ("TALLY_SINK__DATABASE_URL", db),
            ("TALLY_API__LISTEN", "127.0.0.1:0"),
            ("TALLY_API__KEYS", keys),
            ("TALLY_LOG", "info"),
        ],
        dir.join(format!("{name}.log")),
    );
    let addr = bound_addr(&svc.log, "usage API: serving");
    wait_until("the API listens", Duration::from_secs(30), || {
        http_get(&addr, "/healthz")
    });
    (svc, addr, key)
}

/// A key minted by `tally api-key create` into `keys`: its clear text.
pub(crate) fn mint(cfg: &str, keys: &str, id: &str, scope: &str) -> String {
    let out = tally_ok(
        &[
            "api-key", "create", "--config", cfg, "--id", id, "--scope", scope,
        ],
        &[("TALLY_API__KEYS", keys)],
        Duration::from_secs(30),
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("tally_") && key.len() == 70, "{key}");
    key
}

const FROM: &str = "2026-03-28T00:00:00Z";
const TO: &str = "2026-04-02T00:00:00Z";

#[test]
fn line_items_rollups_and_the_usage_api_match_an_independent_oracle() {
    let dir = TempDir::new("usage");
    let broker = DevBroker::start(&[
        ("requests", 4),
        ("tenant-cost", 2),
        ("requests.late", 2),
        ("requests.dlq", 2),
        ("replay-cost", 2),
        ("replay-late", 2),
        ("replay-dlq", 2),
    ]);
    // Sparse traffic (a record every 23 s over 4 partitions) leaves gaps longer
    // than the lead limit's 5 min, which the generator's model of the watermark
    // does not know: off here (the limit has tests of its own).
    let cfg = write_config(
        dir.path(),
        &broker,
        "usage",
        "[watermark]\nmax_lead = \"off\"\n",
    );
    let cfg = cfg.to_str().unwrap();
    // 12,000 records every 23 s: 2026-03-28T22:00Z to 2026-04-01T02:40Z.
    let mut args = vec!["--count", "12000", "--tenants", "12", "--seed", "17"];
    args.extend(["--start", "2026-03-28T22:00:00Z", "--step", "23s"]);
    args.extend(DIRTY);
    let expected = generate(Path::new(cfg), dir.path(), "expected", &args);
    let run = |envs: &[(&str, &str)]| {
        tally_ok(
            &["run", "--config", cfg, "--until-end"],
            envs,
            Duration::from_secs(300),
        );
    };
    run(&[]);
    let replay_state = dir.path().join("state-replay");
    let replay_checkpoints = dir.path().join("checkpoints-replay");
    run(&[
        ("TALLY_KAFKA__GROUP_ID", "replay"),
        ("TALLY_TOPICS__RESULTS", "replay-cost"),
        ("TALLY_TOPICS__LATE", "replay-late"),
        ("TALLY_TOPICS__DEAD_LETTER", "replay-dlq"),
        ("TALLY_STATE__DIR", replay_state.to_str().unwrap()),
        (
            "TALLY_CHECKPOINT__DIR",
            replay_checkpoints.to_str().unwrap(),
        ),
    ]);
    let db = fresh_database("usage");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(300),
    );

    // Line items: every (tenant, window, model) line is the generator's, and the
    // lines sum to their window; a replay gives the same payloads, byte for byte.
    let lines = minutes(&db, true);
    let by_line: BTreeMap<(String, i64, String), Sums> = lines
        .iter()
        .map(|(t, _, end, m, s, _)| ((t.clone(), *end, m.clone().unwrap()), s.clone()))
        .collect();
    let want: BTreeMap<(String, i64, String), Sums> = expected
        .lines
        .iter()
        .map(|l| {
            let s = Sums {
                cost: l.cost_pico.parse().unwrap(),
                requests: l.requests,
                prompt: l.prompt_tokens,
                completion: l.completion_tokens,
            };
            ((l.tenant_id.clone(), l.window_end, l.model.clone()), s)
        })
        .collect();
    let extra: Vec<_> = by_line
        .iter()
        .filter(|(k, v)| want.get(*k) != Some(v))
        .take(5)
        .collect();
    let missing: Vec<_> = want
        .iter()
        .filter(|(k, v)| by_line.get(*k) != Some(v))
        .take(5)
        .collect();
    assert_eq!(
        by_line.len(),
        want.len(),
        "extra {extra:?} missing {missing:?}"
    );
    assert!(
        by_line == want,
        "the invoice lines differ from the generator's"
    );
    let models: BTreeSet<&str> = want.keys().map(|k| k.2.as_str()).collect();
    assert_eq!(models.len(), 3, "{models:?}");
    let totals = minutes(&db, false);
    for (t, _, end, _, s, _) in &totals {
        let sum =
            lines
                .iter()
                .filter(|l| (&l.0, l.2) == (t, *end))
                .fold(Sums::default(), |mut a, l| {
                    a.cost += l.4.cost;
                    a.requests += l.4.requests;
                    a.prompt += l.4.prompt;
                    a.completion += l.4.completion;
                    a
                });
        assert_eq!(&sum, s, "{t} {end}");
    }
    let live = final_payloads(&broker, "tenant-cost");
    assert!(
        live == final_payloads(&broker, "replay-cost"),
        "the replay differs"
    );
    assert!(live
        .values()
        .all(|(_, p)| String::from_utf8_lossy(p).contains(r#""lines":[{"model":""#)));

    // Finality after the bounded run: a prefix of the windows is final.
    let final_through: Option<i64> = query(&db, "SELECT final_through::TEXT FROM tally_final")[0]
        [0]
    .as_ref()
    .map(|v| v.parse().unwrap());
    let f = final_through.expect("every partition reported its progress");
    assert!(totals.iter().all(|m| m.5 == (m.2 <= f)));
    assert!(totals.iter().any(|m| m.5) && totals.iter().any(|m| !m.5));

    let (_api, addr, key) = start_api(dir.path(), cfg, &db, "api");
    let api = Client::new(&addr, &key);
    assert_eq!(api.get("/readyz", "text/plain").0, 200);
    let (from, to) = (parse_utc_ms(FROM).unwrap(), parse_utc_ms(TO).unwrap());
    let tenant = totals.iter().map(|m| m.0.clone()).min().unwrap();
    let mut checked = 0;
    for by_model in [false, true] {
        let m = if by_model { &lines } else { &totals };
        for unit in ["minute", "hour", "day", "month"] {
            for tz in ["UTC", "Europe/Berlin", "Asia/Kolkata"] {
                for who in [None, Some(tenant.as_str()), Some("no-such-tenant")] {
                    let mut q = format!("from={FROM}&to={TO}&window={unit}&tz={tz}");
                    if by_model {
                        q += "&group_by=tenant&group_by=model";
                    }
                    if let Some(t) = who {
                        q += &format!("&tenant_id={t}");
                    }
                    let got = api.all_pages(&q, 1_000, by_model);
                    let want = oracle(m, unit, tz, who, from, to, final_through);
                    assert_eq!(got.len(), want.len(), "{q}");
                    assert!(got == want, "{q}: the API differs from the oracle");
                    if who == Some("no-such-tenant") {
                        assert!(got.is_empty());
                    }
                    if who.is_none() {
                        let (status, csv) = api.get(&format!("/v1/usage?{q}"), "text/csv");
                        assert_eq!(status, 200, "{q}");
                        assert!(
                            parse_csv(&csv, by_model) == got,
                            "{q}: CSV differs from JSON"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 72);

    // Pages of 7: complete, in order, without duplicates.
    let q =
        format!("from={FROM}&to={TO}&window=hour&tz=Asia/Kolkata&group_by=tenant&group_by=model");
    let small = api.all_pages(&q, 7, true);
    let whole = api.all_pages(&q, 100_000, true);
    assert!(small.len() > 70 && small == whole);
    let keys: BTreeSet<_> = small.iter().map(|r| &r.0).collect();
    assert_eq!(keys.len(), small.len());
    // Bounds that are not bucket bounds clip the first and last bucket.
    let q = "from=2026-03-29T12:34:00%2B05:30&to=2026-03-31T00:00:00%2B02:00&window=day&tz=Asia/Kolkata";
    let (f2, t2) = (
        parse_utc_ms("2026-03-29T12:34:00+05:30").unwrap(),
        parse_utc_ms("2026-03-31T00:00:00+02:00").unwrap(),
    );
    assert!(
        api.all_pages(q, 1_000, false)
            == oracle(&totals, "day", "Asia/Kolkata", None, f2, t2, final_through)
    );

    // Invoices: the month in the zone, per model, against the oracle.
    for tz in ["UTC", "Europe/Berlin", "Asia/Kolkata"] {
        for period in ["2026-03", "2026-04"] {
            for who in [tenant.as_str(), "no-such-tenant"] {
                let (status, v) = api.json(&format!("/v1/invoices/{who}?period={period}&tz={tz}"));
                assert_eq!(status, 200, "{v}");
                let (y, mo) = (
                    period[..4].parse::<i32>().unwrap(),
                    period[5..].parse::<u32>().unwrap(),
                );
                let local = chrono::NaiveDate::from_ymd_opt(y, mo, 1)
                    .unwrap()
                    .and_hms_opt(12, 0, 0)
                    .unwrap();
                let (ms, me) = bucket("month", tz, utc_of(tz, local.and_utc().timestamp_millis()));
                let rows = oracle(&lines, "month", tz, Some(who), ms, me, final_through);
                let want: Vec<(String, u64, u64, u64, String, String)> = rows
                    .iter()
                    .map(|((_, _, m), (_, s, usd, _))| {
                        (
                            m.clone().unwrap(),
                            s.requests,
                            s.prompt,
                            s.completion,
                            s.cost.to_string(),
                            usd.clone(),
                        )
                    })
                    .collect();
                let got: Vec<(String, u64, u64, u64, String, String)> = v["lines"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| {
                        (
                            l["model"].as_str().unwrap().into(),
                            l["requests"].as_u64().unwrap(),
                            l["prompt_tokens"].as_u64().unwrap(),
                            l["completion_tokens"].as_u64().unwrap(),
                            l["cost_pico"].as_str().unwrap().into(),
                            l["usd"].as_str().unwrap().into(),
                        )
                    })
                    .collect();
                assert_eq!(got, want, "{who} {period} {tz}");
                let total: u128 = rows.iter().map(|r| r.1 .1.cost).sum();
                assert_eq!(v["total"]["cost_pico"], total.to_string());
                assert_eq!(v["total"]["usd"], Pico(total).usd_string());
                assert_eq!(
                    v["total"]["requests"],
                    rows.iter().map(|r| r.1 .1.requests).sum::<u64>()
                );
                assert_eq!(
                    (&v["tenant_id"], &v["period"], &v["tz"]),
                    (
                        &serde_json::json!(who),
                        &serde_json::json!(period),
                        &serde_json::json!(tz)
                    )
                );
                assert_eq!(
                    v["final"],
                    final_through.is_some_and(|f| me <= f),
                    "{who} {period} {tz}"
                );
                if period == "2026-04" {
                    assert_eq!(v["final"], false);
                } else {
                    assert_eq!(v["final"], true, "March is over in every zone");
                    if who == tenant {
                        assert!(!got.is_empty());
                    }
                }
            }
        }
    }

    // Bad parameters: 400, naming the parameter.
    let q = format!("from={FROM}&to={TO}");
    for (path, parameter) in [
        (format!("/v1/usage?to={TO}"), "from"),
        (format!("/v1/usage?{q}&window=week"), "window"),
        (format!("/v1/usage?{q}&tz=Mars/Olympus"), "tz"),
        (format!("/v1/usage?{q}&limit=0"), "limit"),
        (format!("/v1/usage?{q}&group_by=week"), "group_by"),
        (format!("/v1/usage?{q}&colour=red"), "colour"),
        (format!("/v1/usage?{q}&page=not-a-token"), "page"),
        (format!("/v1/usage?from={TO}&to={FROM}"), "to"),
        ("/v1/invoices/acme?period=2026-13".to_string(), "period"),
        (
            "/v1/invoices/acme?period=2026-03&tz=Nowhere".to_string(),
            "tz",
        ),
    ] {
        let (status, v) = api.json(&path);
        assert_eq!(
            (status, v["error"]["parameter"].as_str()),
            (400, Some(parameter)),
            "{path}: {v}"
        );
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // A page token of another query.
    let (_, v) = api.json(&format!("/v1/usage?{q}&limit=1"));
    let token = v["next_page"].as_str().unwrap();
    let (status, v) = api.json(&format!("/v1/usage?{q}&window=hour&page={token}"));
    assert_eq!(
        (status, v["error"]["parameter"].as_str()),
        (400, Some("page"))
    );
}

/// The window size must divide the bucket in the zone's offsets; the database
/// gone is 503 and `/readyz` says so.
#[test]
fn an_unaligned_rollup_is_refused_and_a_lost_database_is_503() {
    let dir = TempDir::new("usage-503");
    let pg = ScratchPostgres::start(dir.path(), &[]);
    let cfg = dir.path().join("api.toml");
    std::fs::write(&cfg, PRICES).unwrap();
    let cfg = cfg.to_str().unwrap();
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &pg.url)],
        Duration::from_secs(60),
    );
    // A one-hour window of a job with `window.size = "1h"`, 10:00–11:00 UTC.
    execute(
        &pg.url,
        "INSERT INTO tenant_cost_partial VALUES ('acme', 1767265200000, 0, 1767261600000, 5, 1, 1, 1, 1, 1, 'on_time', 0);
         INSERT INTO tenant_cost_line_partial VALUES ('acme', 1767265200000, 0, 'small', 1767261600000, 5, 1, 1, 1, 1, 1);",
    );
    let (_api, addr, key) = start_api(dir.path(), cfg, &pg.url, "api");
    let api = Client::new(&addr, &key);
    assert_eq!(api.get("/readyz", "text/plain").0, 200);
    let q = "from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z";
    let (status, v) = api.json(&format!("/v1/usage?{q}&window=hour"));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"][0]["cost_pico"], "5");
    for (path, accept) in [
        (
            format!("/v1/usage?{q}&window=hour&tz=Asia/Kolkata"),
            "application/json",
        ),
        (format!("/v1/usage?{q}&window=minute"), "application/json"),
        (
            format!("/v1/usage?{q}&window=hour&tz=Asia/Kolkata"),
            "text/csv",
        ),
    ] {
        let (status, body) = api.get(&path, accept);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (status, v["error"]["parameter"].as_str()),
            (400, Some("window")),
            "{path}: {v}"
        );
    }
    drop(pg);
    let (status, v) = api.json(&format!("/v1/usage?{q}"));
    assert_eq!(status, 503, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("database"),
        "{v}"
    );
    let (status, body) = api.get("/readyz", "text/plain");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not ready"), "{body}");
    let (status, _) = api.json("/v1/invoices/acme?period=2026-01");
    assert_eq!(status, 503);
}
