//! One record must never stop billing (issue 33): ids outside the id rule are dead
//! letters at the worker; a results record the sink cannot store is rejected into
//! `sink_rejected` while every other record is applied; sums at the engine's maxima
//! hold in the views, the rollup and the usage API.

use std::time::Duration;

use crate::common::*;
use tally::engine::{LineItem, PaneKind, ResultKind, ResultRecord};
use tally::kafka::headers;
use tally::model::Pico;

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const MIN: i64 = 60_000;

fn pane(tenant: &str, end: i64, source_partition: i32, tokens: u64, cost: u128) -> ResultRecord {
    ResultRecord {
        kind: ResultKind::Window,
        tenant_id: tenant.into(),
        window_start: end - MIN,
        window_end: end,
        cost_pico: Pico(cost),
        usd: Pico(cost).usd_string(),
        requests: 1,
        prompt_tokens: tokens,
        completion_tokens: tokens,
        source_partition,
        version: 1,
        pane: PaneKind::OnTime,
        pane_index: 0,
        generation: 1,
        lines: vec![LineItem {
            model: "large".into(),
            requests: 1,
            prompt_tokens: tokens,
            completion_tokens: tokens,
            cost_pico: Pico(cost),
            ..LineItem::default()
        }],
    }
}

/// `n × v` in decimal digits (past u128).
fn times(n: u32, v: u128) -> String {
    let mut digits = Vec::new();
    let mut carry = 0u32;
    for d in v.to_string().bytes().rev() {
        let x = u32::from(d - b'0') * n + carry;
        digits.push(char::from(b'0' + (x % 10) as u8));
        carry = x / 10;
    }
    digits.extend(carry.to_string().chars().rev().filter(|_| carry > 0));
    digits.iter().rev().collect()
}

/// Pico-USD digits in USD with 12 places.
fn usd(pico: &str) -> String {
    let padded = format!("{pico:0>13}");
    let (whole, frac) = padded.split_at(padded.len() - 12);
    format!("{whole}.{frac}")
}

/// `tally sink --until-end` into `db`; its log.
fn sink_to_end(cfg: &str, db: &str) -> String {
    let sink = tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &[("TALLY_SINK__DATABASE_URL", db)],
        Duration::from_secs(120),
    );
    String::from_utf8_lossy(&sink.stderr).into_owned()
}

fn json(r: &ResultRecord) -> String {
    String::from_utf8(r.to_json()).unwrap()
}

#[test]
fn ids_outside_the_id_rule_are_dead_letters_and_the_sink_bills_everyone_else() {
    let dir = TempDir::new("poison-ids");
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(dir.path(), &broker, "poison-ids", "");
    let cfg = cfg.to_str().unwrap();
    let long = "t".repeat(10_000);
    let records = vec![
        event("r-1", "acme", "large", T10 + 1_000),
        // A NUL, escaped in JSON: valid JSON and valid UTF-8.
        event("r-2", "evil\\u0000tenant", "large", T10 + 2_000),
        event("r-3", &long, "large", T10 + 3_000),
        event("r-4", "acme", "lar\\u0000ge", T10 + 4_000),
        event("r-5\\n", "acme", "large", T10 + 5_000),
        event("r-6", "acme", "large", T10 + 6_000),
        event("r-7", "acme", "large", T10 + 2 * MIN),
    ];
    produce(&broker, "requests", 0, "acme", &records);
    let run = tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(
        log.contains("consumed=7 folded=3"),
        "four dead letters expected:\n{log}"
    );
    let dlq = tally::kafka::read::read_topic(&broker.kafka(), "requests.dlq").unwrap();
    let details: Vec<(String, String)> = dlq
        .iter()
        .map(|d| {
            (
                d.header(headers::ERROR).unwrap().to_string(),
                d.header(headers::ERROR_DETAIL).unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        details,
        vec![
            (
                "invalid_field".into(),
                "field `tenant_id` is not a valid id: it holds the control character U+0000 at byte 4"
                    .into()
            ),
            (
                "invalid_field".into(),
                "field `tenant_id` is not a valid id: it is 10000 bytes long, at most 256".into()
            ),
            (
                "invalid_field".into(),
                "field `model` is not a valid id: it holds the control character U+0000 at byte 3"
                    .into()
            ),
            (
                "invalid_field".into(),
                "field `request_id` is not a valid id: it holds the control character U+000A at byte 3"
                    .into()
            ),
        ]
    );

    let db = fresh_database("poison_ids");
    assert!(sink_to_end(cfg, &db).contains("rejected: 0"));
    assert_eq!(
        query(
            &db,
            "SELECT tenant_id, window_end::TEXT, requests::TEXT FROM tenant_cost_minute ORDER BY 2"
        ),
        vec![
            vec![
                Some("acme".into()),
                Some((T10 + MIN).to_string()),
                Some("2".into())
            ],
            vec![
                Some("acme".into()),
                Some((T10 + 3 * MIN).to_string()),
                Some("1".into())
            ],
        ]
    );
}

#[test]
fn the_sink_rejects_what_it_cannot_store_and_applies_every_other_record() {
    let dir = TempDir::new("poison-sink");
    let broker = DevBroker::start(&[("tenant-cost", 2)]);
    let cfg = write_config(dir.path(), &broker, "poison-sink", "");
    let cfg = cfg.to_str().unwrap();
    let good = |tenant: &str, end: i64| json(&pane(tenant, end, 0, 10, 500));
    let nul = pane("evil\0tenant", T10 + MIN, 0, 10, 500);
    let mut version = pane("acme", T10 + 2 * MIN, 0, 10, 500);
    version.version = u64::MAX;
    let mut requests = pane("acme", T10 + 3 * MIN, 0, 10, 500);
    requests.requests = 1 << 63;
    requests.lines[0].requests = 1 << 63;
    let mut usd = pane("acme", T10 + 4 * MIN, 0, 10, 500);
    usd.usd = "9.000000000000".into();
    let mut twice = pane("acme", T10 + 5 * MIN, 0, 10, 500);
    twice.lines.push(twice.lines[0].clone());
    let long = pane(&"t".repeat(10_000), T10 + MIN, 0, 10, 500);
    let adjustment = format!(
        r#"{{"kind":"adjustment","request_id":"r-9","tenant_id":"acme","model":"large","window_start":{},"window_end":{},"cost_pico":"5","usd":"0.000000000005","prompt_tokens":1,"completion_tokens":1,"generation":{},"source":"requests/0/9"}}"#,
        T10,
        T10 + MIN,
        u64::MAX
    );
    let poison = vec![
        json(&nul),
        json(&version),
        json(&requests),
        json(&usd),
        json(&twice),
        json(&long),
        adjustment,
        "not json at all".to_string(),
        // Progress naming 2^31 - 1 partitions: finality would wait for them forever,
        // and the pair count overflowed INTEGER in tally_final.
        format!(
            r#"{{"kind":"progress","source_partition":0,"source_partitions":{m},"results_partitions":{m},"final_through":0,"watermark":0,"generation":1}}"#,
            m = i32::MAX
        ),
        "{\"kind\":\"window\",\"tenant_id\":\"raw\0nul\"}".to_string(),
    ];
    let mut p0 = vec![good("acme", T10 + MIN)];
    p0.extend(poison.iter().cloned());
    p0.push(good("acme", T10 + 6 * MIN));
    produce(&broker, "tenant-cost", 0, "k", &p0);
    produce(&broker, "tenant-cost", 1, "k", &[good("globex", T10 + MIN)]);

    let db = fresh_database("poison_sink");
    let log = sink_to_end(cfg, &db);
    assert!(log.contains("rejected: 10"), "{log}");
    assert!(
        log.contains("source=tenant-cost/0/1") && log.contains("result record rejected"),
        "{log}"
    );
    // Every other record is applied.
    assert_eq!(
        query(
            &db,
            "SELECT tenant_id, window_end::TEXT FROM tenant_cost_minute ORDER BY 1, 2"
        ),
        vec![
            vec![Some("acme".into()), Some((T10 + MIN).to_string())],
            vec![Some("acme".into()), Some((T10 + 6 * MIN).to_string())],
            vec![Some("globex".into()), Some((T10 + MIN).to_string())],
        ]
    );
    assert_eq!(
        query(&db, "SELECT count(*)::TEXT FROM tenant_cost_adjustment"),
        vec![vec![Some("0".into())]]
    );
    // Each rejected record is kept with its offset, its reason and its bytes.
    let rows = query(
        &db,
        "SELECT partition::TEXT, record_offset::TEXT, reason, encode(payload, 'hex') \
         FROM sink_rejected r ORDER BY r.partition, r.record_offset",
    );
    assert_eq!(rows.len(), poison.len());
    let reasons: Vec<&str> = rows.iter().map(|r| r[2].as_deref().unwrap()).collect();
    for (i, (row, payload)) in rows.iter().zip(&poison).enumerate() {
        assert_eq!(row[0].as_deref(), Some("0"));
        assert_eq!(row[1], Some((i + 1).to_string()));
        let hex: String = payload.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(row[3].as_deref(), Some(hex.as_str()), "payload {i}");
    }
    for (i, want) in [
        "tenant_id is not a valid id: it holds the control character U+0000 at byte 4",
        "version 18446744073709551615 does not fit in BIGINT",
        "requests 9223372036854775808 does not fit in BIGINT",
        "usd \"9.000000000000\" contradicts cost_pico 500",
        "the lines are not sorted by model, each once",
        "tenant_id is not a valid id: it is 10000 bytes long, at most 256",
        "generation 18446744073709551615 does not fit in BIGINT",
        "not a result record",
        "results_partitions 2147483647 is more than the 2 partitions",
        "not a result record",
    ]
    .iter()
    .enumerate()
    {
        assert!(reasons[i].contains(want), "{i}: {:?}", reasons[i]);
    }
    assert_eq!(
        query(
            &db,
            "SELECT partition::TEXT, next_offset::TEXT FROM sink_offsets ORDER BY 1"
        ),
        vec![
            vec![Some("0".into()), Some((poison.len() + 2).to_string())],
            vec![Some("1".into()), Some("1".into())],
        ]
    );
    // A restart resumes after them: nothing is read, rejected or changed again.
    let log = sink_to_end(cfg, &db);
    assert!(
        log.contains("records: 0") && log.contains("rejected: 0"),
        "{log}"
    );
}

/// PostgreSQL's own refusal of one record's data (here a NUL the check would have
/// caught, handed to `apply_batch` directly) rejects that record only.
#[test]
fn a_record_postgresql_refuses_is_isolated_and_the_batch_commits() {
    use std::collections::BTreeMap;
    use tally::engine::SinkRecord;
    use tally::model::Partition;
    use tally::sink::apply::{apply_batch, Batch, Delivered};
    use tally::state::NextOffset;

    let db = fresh_database("poison_apply");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let delivered = |offset: i64, r: ResultRecord| Delivered {
        payload: r.to_json(),
        record: SinkRecord::Window(r),
        results_partition: 0,
        offset,
    };
    let batch = Batch {
        topic: "tenant-cost".into(),
        records: vec![
            delivered(0, pane("acme", T10 + MIN, 0, 10, 500)),
            delivered(1, pane("evil\0tenant", T10 + MIN, 0, 10, 500)),
            delivered(2, pane("globex", T10 + MIN, 0, 10, 500)),
        ],
        rejected: vec![],
        offsets: BTreeMap::from([(("tenant-cost".to_string(), Partition(0)), NextOffset(3))]),
    };
    let applied = rt
        .block_on(async {
            let mut client = tally::sink::connect(&db).await?;
            tally::sink::migrate::run(&mut client).await?;
            apply_batch(&mut client, &batch).await
        })
        .unwrap();
    assert_eq!(applied.rows_changed, 2);
    assert_eq!(applied.rejected.len(), 1);
    assert_eq!(applied.rejected[0].offset, 1);
    assert!(
        applied.rejected[0].reason.starts_with(
            "PostgreSQL refused it: invalid byte sequence for encoding \"UTF8\": 0x00"
        ),
        "{:?}",
        applied.rejected[0].reason
    );
    assert_eq!(
        query(&db, "SELECT tenant_id FROM tenant_cost_minute ORDER BY 1"),
        vec![vec![Some("acme".into())], vec![Some("globex".into())]]
    );
    assert_eq!(
        query(&db, "SELECT record_offset::TEXT FROM sink_rejected"),
        vec![vec![Some("1".into())]]
    );
    assert_eq!(
        query(&db, "SELECT next_offset::TEXT FROM sink_offsets"),
        vec![vec![Some("3".into())]]
    );
}

/// Sums at the engine's maxima: six windows in one hour, each with 2^64 - 1 tokens
/// on six source partitions, at a cost near 2^128 each, overflow every fixed width
/// the views and the rollup had (a minute passes NUMERIC(20,0) and NUMERIC(39,0)); the views, the rollup and the usage API answer exactly, and
/// another tenant's answer is unaffected.
#[test]
fn the_views_and_the_usage_api_hold_the_engine_maxima() {
    let dir = TempDir::new("poison-max");
    let broker = DevBroker::start(&[("tenant-cost", 1)]);
    let cfg = write_config(dir.path(), &broker, "poison-max", "");
    let cfg = cfg.to_str().unwrap();
    let cost = u128::MAX - 1;
    let mut records = Vec::new();
    for m in 1..=6 {
        for p in 0..6 {
            records.push(json(&pane("huge", T10 + m * MIN, p, u64::MAX, cost)));
        }
    }
    records.push(json(&pane("small", T10 + MIN, 0, 10, 500)));
    produce(&broker, "tenant-cost", 0, "k", &records);
    let db = fresh_database("poison_max");
    assert!(sink_to_end(cfg, &db).contains("rejected: 0"));
    // One minute of `huge` sums six partitions, the hour 36 panes: past u64 tokens
    // and u128 pico-USD, and past the old views' NUMERIC(20,0) and NUMERIC(39,0).
    assert_eq!(
        query(
            &db,
            "SELECT prompt_tokens::TEXT, cost_pico::TEXT, usd::TEXT FROM tenant_cost_minute \
             WHERE tenant_id = 'huge' ORDER BY window_end LIMIT 1"
        ),
        vec![vec![
            Some(times(6, u128::from(u64::MAX))),
            Some(times(6, cost)),
            Some(usd(&times(6, cost))),
        ]]
    );
    let (tokens36, cost36) = (times(36, u128::from(u64::MAX)), times(36, cost));
    let (_api, addr, key) = crate::usage_api::start_api(dir.path(), cfg, &db, "api");
    let (status, body) = api_get(
        &addr,
        &key,
        "/v1/usage?from=2026-01-01T10:00:00Z&to=2026-01-01T11:00:00Z&window=hour",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = v["data"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{body}");
    assert!(
        body.contains(&format!("\"prompt_tokens\":{tokens36}")),
        "{body}"
    );
    assert!(
        body.contains(&format!("\"cost_pico\":\"{cost36}\"")),
        "{body}"
    );
    assert!(
        body.contains(&format!("\"usd\":\"{}\"", usd(&cost36))),
        "{body}"
    );
    assert_eq!(rows[1]["tenant_id"], "small");
    assert_eq!(rows[1]["cost_pico"], "500");
    let (status, body) = api_get(&addr, &key, "/v1/invoices/huge?period=2026-01").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("\"cost_pico\":\"{cost36}\"")),
        "{body}"
    );
    let (status, body) = api_get(&addr, &key, "/v1/invoices/small?period=2026-01").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"usd\":\"0.000000000500\""), "{body}");
    // A stored progress row naming 2^31 - 1 partitions (a sink before the check)
    // holds finality back but fails no query: the pair count is a BIGINT.
    execute(
        &db,
        "INSERT INTO tally_progress (source_partition, results_partition, final_through, watermark, \
         source_partitions, results_partitions, generation) VALUES (0, 0, 0, 0, 2147483647, 2147483647, 1)",
    );
    assert_eq!(
        query(
            &db,
            "SELECT count(*)::TEXT, bool_or(final)::TEXT FROM tenant_cost_minute"
        ),
        vec![vec![Some("7".into()), Some("false".into())]]
    );
    let (status, body) = api_get(&addr, &key, "/v1/invoices/small?period=2026-01").unwrap();
    assert_eq!(status, 200, "{body}");
}
