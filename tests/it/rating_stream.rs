//! A generated stream under a rating (issue 36), end to end on the dev broker and
//! PostgreSQL: OpenAI-style and Anthropic-style records (parts, a per-call fee and a
//! per-request fee, a long-context tier, a batch variant), a plan from the start and
//! a discount plan from mid-stream, duplicates, a worker killed and recovered, and
//! too-late records reprocessed — billed exactly against the generator's bill per
//! window and per line item, and byte-identical to a replay from the log start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use tally::gen::rated::{rated_stream, LineKey, RatedOptions, RatedWindow};
use tally::kafka::read::read_topic;

pub(crate) const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

pub(crate) const RATING: &str = r#"
[input]
prompt_tokens = "/usage/prompt_tokens"
completion_tokens = "/usage/completion_tokens"

[input.quantities.cached_tokens]
pointer = "/usage/cached_tokens"
part_of = "prompt_tokens"

[input.quantities.reasoning_tokens]
pointer = "/usage/reasoning_tokens"
part_of = "completion_tokens"

[input.quantities.web_search_calls]
pointer = "/usage/web_search_calls"

[input.quantities.cache_read_input_tokens]
pointer = "/usage/cache_read_input_tokens"

[input.quantities.cache_creation_input_tokens]
pointer = "/usage/cache_creation_input_tokens"

[input.variant]
name = "service_tier"
values = ["default", "batch"]
default = "default"

[prices.models.o-large.rates]
prompt_tokens = "0.002"
cached_tokens = "0.0005"
completion_tokens = "0.008"
reasoning_tokens = "0.008"
web_search_calls = { per_unit = "0.01" }

[prices.models.o-large.variants.batch.rates]
prompt_tokens = "0.001"
cached_tokens = "0.00025"
completion_tokens = "0.004"
reasoning_tokens = "0.004"
web_search_calls = { per_1k = "5" }

[prices.models.c-sonnet]
fee = "0.0001"

[prices.models.c-sonnet.rates]
prompt_tokens = "0.003"
cache_read_input_tokens = "0.0003"
cache_creation_input_tokens = "0.00375"
completion_tokens = "0.015"

[[prices.models.c-sonnet.tiers]]
above = 200000
on = ["prompt_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]
rates = { prompt_tokens = "0.006", cache_read_input_tokens = "0.0006", cache_creation_input_tokens = "0.0075", completion_tokens = "0.0225" }

[prices.plans.enterprise.models.o-large.rates]
prompt_tokens = "0.0015"

[prices.plans.startup]
discount_percent = "12.5"

[[prices.assignments]]
tenant = "acme"
plan = "enterprise"

[[prices.assignments]]
tenant = "initech"
plan = "startup"
effective_from = "2026-01-01T00:04:00Z"
"#;

pub(crate) const TOPICS: &[(&str, i32)] = &[
    ("requests", 4),
    ("tenant-cost", 2),
    ("requests.late", 2),
    ("requests.dlq", 1),
    ("replay-cost", 2),
    ("replay-late", 2),
    ("replay-dlq", 1),
];

pub(crate) fn config(dir: &Path, broker: &DevBroker) -> PathBuf {
    let d = dir.display();
    let path = dir.join("stream.toml");
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\ngroup_id = \"stream\"\n\"session.timeout.ms\" = \
         \"6000\"\n[checkpoint]\ndir = \"{d}/checkpoints\"\ninterval = \"1s\"\n[state]\ndir = \
         \"{d}/state\"\n{RATING}",
        broker.bootstrap
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The sink's invoice per window and line item, in the generator's shape.
fn invoice(db: &str) -> BTreeMap<(String, i64), RatedWindow> {
    let mut out: BTreeMap<(String, i64), RatedWindow> = BTreeMap::new();
    for r in query(
        db,
        "SELECT tenant_id, window_start::TEXT, cost_pico::TEXT, requests::TEXT FROM tenant_cost_minute",
    ) {
        let v = |i: usize| r[i].clone().unwrap();
        let w = out.entry((v(0), v(1).parse().unwrap())).or_default();
        w.cost = v(2).parse().unwrap();
        w.requests = v(3).parse().unwrap();
    }
    for r in query(
        db,
        "SELECT tenant_id, window_start::TEXT, model, variant, plan, quantity, count::TEXT, \
         cost_pico::TEXT FROM tenant_cost_minute_quantity",
    ) {
        let v = |i: usize| r[i].clone().unwrap();
        let key: LineKey = (v(2), v(3), v(4), v(5));
        let w = out.entry((v(0), v(1).parse().unwrap())).or_default();
        w.lines
            .insert(key, (v(6).parse().unwrap(), v(7).parse().unwrap()));
    }
    out
}

#[test]
fn a_generated_rated_stream_bills_exactly_through_a_kill_and_reprocessing() {
    let dir = TempDir::new("rating-stream");
    let broker = DevBroker::start(TOPICS);
    let cfg = config(dir.path(), &broker);
    let book = tally::config::rating::from_toml(RATING).unwrap().book;
    let mut tenants: Vec<String> = ["acme", "initech", "globex"].map(String::from).to_vec();
    tenants.extend((0..7).map(|i| format!("t{i}")));
    let opts = RatedOptions {
        seed: 36,
        count: 6_000,
        tenants,
        partitions: 4,
        start_ms: T0,
        step_ms: 100,
        max_jitter_ms: 4_000,
        duplicates_ppm: 30_000,
        late: 20,
    };
    let window = tally::time::WindowSpec::new(60_000, 0);
    let stream = rated_stream(&book, window, &opts);
    let plans: std::collections::BTreeSet<&str> = stream
        .expected
        .values()
        .flat_map(|w| w.lines.keys().map(|k| k.2.as_str()))
        .collect();
    assert_eq!(
        plans.into_iter().collect::<Vec<_>>(),
        ["", "enterprise", "startup"]
    );
    produce_to_partitions(&broker, &stream.records);

    // A worker killed midway (SIGKILL in the middle of a burst of panes), then
    // recovered to the end of input.
    let cfg_s = cfg.to_str().unwrap();
    let killed = tally(
        &["run", "--config", cfg_s, "--until-end"],
        &[("TALLY_CRASH_AT", "mid_pane_burst:6")],
        Duration::from_secs(300),
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(killed.status.signal(), Some(9), "the worker did not crash");
    tally_ok(
        &["run", "--config", cfg_s, "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    // Records of the first minutes, long purged: too late, then reprocessed.
    produce_to_partitions(&broker, &stream.late);
    tally_ok(
        &["run", "--config", cfg_s, "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    assert!(read_topic(&broker.kafka(), "requests.dlq")
        .unwrap()
        .is_empty());
    assert!(stream.late.len() > 10);
    assert_eq!(
        read_topic(&broker.kafka(), "requests.late").unwrap().len(),
        stream.late.len()
    );
    tally_ok(
        &["reprocess-late", "--config", cfg_s, "--from", "earliest"],
        &[],
        Duration::from_secs(120),
    );
    let db = fresh_database("rating_stream");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    tally_ok(
        &["sink", "--config", cfg_s, "--until-end"],
        &env,
        Duration::from_secs(300),
    );
    let got = invoice(&db);
    assert_eq!(got.len(), stream.expected.len(), "windows");
    for (k, want) in &stream.expected {
        assert_eq!(got.get(k), Some(want), "window {k:?}");
    }

    // The same log replayed from its start under the same config: the same panes.
    let replay_state = dir.path().join("state-replay");
    let replay_checkpoints = dir.path().join("checkpoints-replay");
    tally_ok(
        &["run", "--config", cfg_s, "--until-end"],
        &[
            ("TALLY_KAFKA__GROUP_ID", "replay"),
            ("TALLY_TOPICS__RESULTS", "replay-cost"),
            ("TALLY_TOPICS__LATE", "replay-late"),
            ("TALLY_TOPICS__DEAD_LETTER", "replay-dlq"),
            ("TALLY_STATE__DIR", replay_state.to_str().unwrap()),
            (
                "TALLY_CHECKPOINT__DIR",
                replay_checkpoints.to_str().unwrap(),
            ),
        ],
        Duration::from_secs(300),
    );
    let live = final_payloads(&broker, "tenant-cost");
    let replay = final_payloads(&broker, "replay-cost");
    assert!(live == replay, "the live results differ from the replay");
}
