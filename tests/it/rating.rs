//! Rating (issue 36) through the file mode: the example configs of
//! `src/config/rating/` bill the worked examples of the issue to the pico-USD,
//! per window and per line item, and what they cannot rate goes to the dead letters
//! with its code. Under a memory budget that evicts every window (so each goes
//! through the state store's encoding and back) the results are byte-identical.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tally::engine::{ResultKind, ResultRecord};

use crate::common::*;

const PICO: u128 = 1_000_000_000_000;

/// `example` (a config of `src/config/rating/`) for a file-mode run under `dir`.
fn config(dir: &Path, example: &str, extra: &str) -> PathBuf {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/config/rating")
            .join(example),
    )
    .unwrap();
    let d = dir.display();
    let path = dir.join("rating.toml");
    std::fs::write(
        &path,
        format!("[checkpoint]\ndir = \"{d}/checkpoints\"\n[state]\ndir = \"{d}/state\"\n{extra}\n{text}"),
    )
    .unwrap();
    path
}

type Windows = BTreeMap<(String, i64), ResultRecord>;

/// The windows (by tenant and start), the dead-letter codes, the results' bytes and
/// the log of a file-mode run.
fn run(cfg: &Path, dir: &Path, lines: &[String]) -> (Windows, Vec<String>, Vec<u8>, String) {
    let input = dir.join("in.jsonl");
    let output = dir.join("out.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = tally_ok(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--input-file",
            input.to_str().unwrap(),
            "--output-file",
            output.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    let bytes = std::fs::read(&output).unwrap();
    let mut windows = BTreeMap::new();
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let r: ResultRecord = serde_json::from_slice(line).unwrap();
        if r.kind == ResultKind::Window {
            windows.insert((r.tenant_id.clone(), r.window_start), r);
        }
    }
    let dlq = std::fs::read_to_string(dir.join("out.jsonl.dlq.jsonl")).unwrap_or_default();
    let codes = dlq
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["error"]
                .as_str()
                .or(v["reason"].as_str())
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    (
        windows,
        codes,
        bytes,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ms(t: &str) -> i64 {
    tally::time::utc::parse_utc_ms(t).unwrap()
}

/// `(quantity, count, cost in pico)` of a window's only line.
fn items(r: &ResultRecord) -> Vec<(String, u64, u128)> {
    assert_eq!(r.lines.len(), 1, "{r:?}");
    r.lines[0]
        .quantities
        .iter()
        .map(|q| (q.quantity.to_string(), q.count, q.cost_pico.0))
        .collect()
}

fn openai(id: &str, tenant: &str, at: &str, tier: Option<&str>, usage: &str) -> String {
    let tier = tier.map_or(String::new(), |t| format!(r#","service_tier":"{t}""#));
    format!(
        r#"{{"request_id":"{id}","tenant_id":"{tenant}","model":"o-large","completed_ts":{}{tier},"usage":{usage}}}"#,
        ms(at)
    )
}

const OPENAI_USAGE: &str = r#"{"prompt_tokens":10000,"prompt_tokens_details":{"cached_tokens":8000},"completion_tokens":500,"completion_tokens_details":{"reasoning_tokens":200}}"#;

#[test]
fn openai_style_records_bill_the_worked_examples() {
    let dir = TempDir::new("rating-openai");
    let lines = vec![
        openai("r-1", "globex", "2026-01-15T10:00:00Z", None, OPENAI_USAGE),
        openai(
            "r-2",
            "globex",
            "2026-01-15T10:01:00Z",
            Some("batch"),
            OPENAI_USAGE,
        ),
        openai(
            "r-3",
            "globex",
            "2026-01-15T10:02:00Z",
            None,
            r#"{"prompt_tokens":0,"completion_tokens":0,"web_search_calls":3}"#,
        ),
        openai(
            "r-4",
            "acme",
            "2026-01-31T23:59:59.999Z",
            None,
            OPENAI_USAGE,
        ),
        openai("r-5", "acme", "2026-02-01T00:00:00Z", None, OPENAI_USAGE),
        // Cached tokens above the prompt tokens; a tier nobody declared; a quantity
        // o-small has no rate for.
        openai(
            "d-1",
            "globex",
            "2026-01-15T10:03:00Z",
            None,
            r#"{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":11},"completion_tokens":0}"#,
        ),
        openai(
            "d-2",
            "globex",
            "2026-01-15T10:03:00Z",
            Some("turbo"),
            OPENAI_USAGE,
        ),
        openai(
            "d-3",
            "globex",
            "2026-01-15T10:03:00Z",
            None,
            r#"{"prompt_tokens":1,"completion_tokens":1,"web_search_calls":1}"#,
        )
        .replace("o-large", "o-small"),
    ];
    let cfg = config(dir.path(), "openai.toml", "");
    let (w, codes, _, _) = run(&cfg, dir.path(), &lines);
    let at = |t: &str, s: &str| &w[&(t.to_string(), ms(s))];
    // (10,000 − 8,000) × 0.002/1000 + 8,000 × 0.0005/1000 + 300 × 0.008/1000
    // + 200 × 0.008/1000 (reasoning, within the completion tokens) = 0.012 USD.
    let first = at("globex", "2026-01-15T10:00:00Z");
    assert_eq!(first.cost_pico.0, 12 * PICO / 1000);
    let want: Vec<(String, u64, u128)> = vec![
        ("prompt_tokens".into(), 2_000, 4_000_000_000),
        ("completion_tokens".into(), 300, 2_400_000_000),
        ("cached_tokens".into(), 8_000, 4_000_000_000),
        ("reasoning_tokens".into(), 200, 1_600_000_000),
    ];
    let mut got = items(first);
    got.sort_by_key(|(q, ..)| match q.as_str() {
        "prompt_tokens" => 0,
        "completion_tokens" => 1,
        "cached_tokens" => 2,
        _ => 3,
    });
    assert_eq!(got, want);
    assert_eq!(
        (first.prompt_tokens, first.completion_tokens),
        (10_000, 500)
    );
    let batch = at("globex", "2026-01-15T10:01:00Z");
    assert_eq!(batch.cost_pico.0, 6 * PICO / 1000);
    assert_eq!(batch.lines[0].variant.as_deref(), Some("batch"));
    assert_eq!(
        at("globex", "2026-01-15T10:02:00Z").cost_pico.0,
        3 * PICO / 100
    );
    // acme's plan starts at 2026-02-01T00:00:00Z: input at 0.0015.
    let before = at("acme", "2026-01-31T23:59:00Z");
    assert_eq!(
        (before.cost_pico.0, before.lines[0].plan.as_deref()),
        (12 * PICO / 1000, None)
    );
    let on_plan = at("acme", "2026-02-01T00:00:00Z");
    assert_eq!(on_plan.cost_pico.0, 11 * PICO / 1000);
    assert_eq!(on_plan.lines[0].plan.as_deref(), Some("enterprise"));
    // Every line: its quantities' costs plus its fee are its cost; the lines sum to the total.
    for r in w.values() {
        let lines: u128 = r.lines.iter().map(|l| l.cost_pico.0).sum();
        assert_eq!(lines, r.cost_pico.0);
        for l in &r.lines {
            let q: u128 = l.quantities.iter().map(|q| q.cost_pico.0).sum();
            assert_eq!(q + l.fee_pico.0, l.cost_pico.0, "{l:?}");
        }
    }
    assert_eq!(w.len(), 5, "{:?}", w.keys());
    let mut codes = codes;
    codes.sort();
    assert_eq!(
        codes,
        ["part_exceeds_whole", "unknown_variant", "unpriced_quantity"]
    );
}

/// Rated windows evicted to the state store (and so encoded and read back) give
/// the bytes of a run that keeps them all in memory.
#[test]
fn rated_windows_evicted_and_read_back_give_the_same_bytes() {
    let tiers = [None, Some("batch"), Some("default")];
    let lines: Vec<String> = (0..3000)
        .map(|i| {
            let at = tally::time::utc::format_utc_ms(ms("2026-01-15T10:00:00Z") + i * 2_000);
            let (id, tenant) = (format!("r-{i}"), format!("t{}", i % 500));
            openai(&id, &tenant, &at, tiers[i as usize % 3], OPENAI_USAGE)
        })
        .collect();
    let mut outputs = Vec::new();
    for budget in ["off", "1KiB"] {
        let dir = TempDir::new("rating-budget");
        let extra = format!("memory_budget = \"{budget}\"\n[window]\nallowed_lateness = \"1h\"");
        let cfg = config(dir.path(), "openai.toml", &extra);
        let (w, codes, bytes, log) = run(&cfg, dir.path(), &lines);
        assert!(codes.is_empty() && w.len() == 3000, "{codes:?}");
        outputs.push((bytes, log));
    }
    assert!(
        !outputs[1].1.contains("windows_evicted=0"),
        "{}",
        outputs[1].1
    );
    assert!(
        outputs[0].0 == outputs[1].0,
        "the results differ under a budget"
    );
}

fn anthropic(id: &str, at: &str, input: u64, read: u64, write: u64, output: u64) -> String {
    format!(
        r#"{{"request_id":"{id}","tenant_id":"globex","model":"c-sonnet","completed_ts":{},"usage":{{"input_tokens":{input},"cache_read_input_tokens":{read},"cache_creation_input_tokens":{write},"output_tokens":{output}}}}}"#,
        ms(at)
    )
}

#[test]
fn anthropic_style_records_bill_the_worked_examples_with_long_context_tiers() {
    let dir = TempDir::new("rating-anthropic");
    let lines = vec![
        anthropic("a-1", "2026-01-10T08:00:00Z", 3_000, 20_000, 5_000, 1_000),
        anthropic("a-2", "2026-01-10T08:01:00Z", 3_000, 150_000, 5_000, 1_000),
        anthropic("a-3", "2026-01-10T08:02:00Z", 3_000, 250_000, 5_000, 1_000),
    ];
    let cfg = config(dir.path(), "anthropic.toml", "");
    let (w, codes, _, _) = run(&cfg, dir.path(), &lines);
    assert!(codes.is_empty(), "{codes:?}");
    let cost = |s: &str| w[&("globex".to_string(), ms(s))].cost_pico.0;
    // 0.009 + 0.006 + 0.01875 + 0.015; 0.009 + 0.045 + 0.01875 + 0.015; and above
    // 200,000 input tokens every rate of the request is the tier's:
    // 0.018 + 0.15 + 0.0375 + 0.0225.
    assert_eq!(cost("2026-01-10T08:00:00Z"), 4_875 * PICO / 100_000);
    assert_eq!(cost("2026-01-10T08:01:00Z"), 8_775 * PICO / 100_000);
    assert_eq!(cost("2026-01-10T08:02:00Z"), 228 * PICO / 1000);
    let tiered = items(&w[&("globex".to_string(), ms("2026-01-10T08:02:00Z"))]);
    assert!(
        tiered.contains(&("cache_read_input_tokens".into(), 250_000, 150 * PICO / 1000)),
        "{tiered:?}"
    );
}

/// On the dev broker: the worker bills the OpenAI-style records, the sink stores
/// their quantities, and the invoice per quantity reads the worked example and sums
/// to each minute's total.
#[test]
fn the_sink_stores_each_quantity_and_the_quantity_view_sums_to_the_minute() {
    let dir = TempDir::new("rating-sink");
    let broker = DevBroker::start(&[
        ("requests", 2),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config/rating/openai.toml"),
    )
    .unwrap();
    let d = dir.path().display();
    let cfg = dir.path().join("rating.toml");
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\nbootstrap_servers = \"{}\"\ngroup_id = \"rating\"\n[checkpoint]\ndir = \
             \"{d}/checkpoints\"\n[state]\ndir = \"{d}/state\"\n{example}",
            broker.bootstrap
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let records = [
        openai("r-1", "globex", "2026-01-15T10:00:00Z", None, OPENAI_USAGE),
        openai(
            "r-2",
            "globex",
            "2026-01-15T10:00:30Z",
            Some("batch"),
            OPENAI_USAGE,
        ),
        openai(
            "r-3",
            "globex",
            "2026-01-15T10:00:40Z",
            None,
            r#"{"prompt_tokens":0,"completion_tokens":0,"web_search_calls":3}"#,
        ),
        openai("r-4", "acme", "2026-02-01T00:00:00Z", None, OPENAI_USAGE),
    ];
    produce(&broker, "requests", 0, "globex", &records[..3]);
    produce(&broker, "requests", 1, "acme", &records[3..]);
    tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let db = fresh_database("rating");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(120),
    );
    let rows = query(
        &db,
        "SELECT tenant_id, model, variant, plan, quantity, count::TEXT, cost_pico::TEXT \
         FROM tenant_cost_minute_quantity ORDER BY 1, 2, 3, 4, 5",
    );
    let row = |t: &str, v: &str, p: &str, q: &str, n: u64, c: u128| {
        [t, "o-large", v, p, q, &n.to_string(), &c.to_string()]
            .map(|s| Some(s.to_string()))
            .to_vec()
    };
    let want = vec![
        row(
            "acme",
            "",
            "enterprise",
            "cached_tokens",
            8_000,
            4_000_000_000,
        ),
        row(
            "acme",
            "",
            "enterprise",
            "completion_tokens",
            300,
            2_400_000_000,
        ),
        row(
            "acme",
            "",
            "enterprise",
            "prompt_tokens",
            2_000,
            3_000_000_000,
        ),
        row(
            "acme",
            "",
            "enterprise",
            "reasoning_tokens",
            200,
            1_600_000_000,
        ),
        row("globex", "", "", "cached_tokens", 8_000, 4_000_000_000),
        row("globex", "", "", "completion_tokens", 300, 2_400_000_000),
        row("globex", "", "", "prompt_tokens", 2_000, 4_000_000_000),
        row("globex", "", "", "reasoning_tokens", 200, 1_600_000_000),
        row("globex", "", "", "web_search_calls", 3, 30_000_000_000),
        row("globex", "batch", "", "cached_tokens", 8_000, 2_000_000_000),
        row(
            "globex",
            "batch",
            "",
            "completion_tokens",
            300,
            1_200_000_000,
        ),
        row("globex", "batch", "", "prompt_tokens", 2_000, 2_000_000_000),
        row("globex", "batch", "", "reasoning_tokens", 200, 800_000_000),
    ];
    assert_eq!(rows, want);
    // Per minute, the quantities (and fees) sum to the minute's total.
    let mismatched = query(
        &db,
        "SELECT m.tenant_id, m.window_end FROM tenant_cost_minute m \
         LEFT JOIN (SELECT tenant_id, window_end, sum(cost_pico) AS c \
                    FROM tenant_cost_minute_quantity GROUP BY 1, 2) q USING (tenant_id, window_end) \
         WHERE q.c IS DISTINCT FROM m.cost_pico",
    );
    assert!(mismatched.is_empty(), "{mismatched:?}");
    let totals = query(&db, "SELECT sum(cost_pico)::TEXT FROM tenant_cost_minute");
    assert_eq!(totals[0][0].as_deref(), Some("59000000000"));

    // And the usage API reads them: globex's January invoice per quantity.
    let (_api, addr, key) = crate::usage_api::start_api(dir.path(), cfg, &db, "rating-api");
    let (status, body) = api_get(&addr, &key, "/v1/invoices/globex?period=2026-01").unwrap();
    assert_eq!(status, 200, "{body}");
    let inv: serde_json::Value = serde_json::from_str(&body).unwrap();
    let lines = inv["quantity_lines"].as_array().unwrap();
    let cost = |d: &str| {
        let l = lines.iter().find(|l| l["description"] == d);
        l.map(|l| l["cost_pico"].as_str().unwrap().to_string())
    };
    assert_eq!(
        cost("o-large (batch) — cached_tokens").as_deref(),
        Some("2000000000")
    );
    assert_eq!(
        cost("o-large — web_search_calls").as_deref(),
        Some("30000000000")
    );
    let sum: u128 = lines
        .iter()
        .map(|l| l["cost_pico"].as_str().unwrap().parse::<u128>().unwrap())
        .sum();
    assert_eq!(sum, 48_000_000_000);
    assert_eq!(inv["total"]["cost_pico"], "48000000000");
}

/// `tally gen` under a rating writes records of the config's book and their bill;
/// the file mode bills them to the same windows and pico-USD.
#[test]
fn tally_gen_under_a_rating_writes_records_the_file_mode_bills_as_expected() {
    let dir = TempDir::new("rating-gen");
    let d = dir.path().display();
    let cfg = dir.path().join("gen.toml");
    std::fs::write(
        &cfg,
        format!(
            "[checkpoint]\ndir = \"{d}/checkpoints\"\n[state]\ndir = \"{d}/state\"\n[input]\n\
             prompt_tokens = \"/usage/prompt_tokens\"\ncompletion_tokens = \"/usage/completion_tokens\"\n\
             [input.quantities.cached_tokens]\npointer = \"/usage/cached_tokens\"\npart_of = \"prompt_tokens\"\n\
             [prices.models.o-large]\nfee = \"0.000001\"\n[prices.models.o-large.rates]\n\
             prompt_tokens = \"0.002\"\ncached_tokens = \"0.0005\"\ncompletion_tokens = \"0.008\"\n"
        ),
    )
    .unwrap();
    let (input, expected) = (
        dir.path().join("in.jsonl"),
        dir.path().join("expected.json"),
    );
    let cfg = cfg.to_str().unwrap();
    tally_ok(
        &[
            "gen",
            "--config",
            cfg,
            "--count",
            "3000",
            "--tenants",
            "7",
            "--duplicate-fraction",
            "0.02",
            "--output-file",
            input.to_str().unwrap(),
            "--expected-file",
            expected.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    let lines: Vec<String> = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 3000);
    let (w, codes, _, _) = run(Path::new(cfg), dir.path(), &lines);
    assert!(codes.is_empty(), "{codes:?}");
    let want: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&expected).unwrap()).unwrap();
    assert_eq!(want.len(), w.len());
    for e in &want {
        let got = &w[&(
            e["tenant_id"].as_str().unwrap().to_string(),
            e["window_start"].as_i64().unwrap(),
        )];
        assert_eq!(
            got.cost_pico.0.to_string(),
            e["cost_pico"].as_str().unwrap()
        );
        assert_eq!(got.requests, e["requests"].as_u64().unwrap());
        let items: u128 = got
            .lines
            .iter()
            .flat_map(|l| &l.quantities)
            .map(|q| q.cost_pico.0)
            .sum();
        let fees: u128 = got.lines.iter().map(|l| l.fee_pico.0).sum();
        assert_eq!(items + fees, got.cost_pico.0);
    }
}
