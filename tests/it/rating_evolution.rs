//! A rating evolves by the rule of prices (docs/DESIGN.md §3.2, §7.4): a plan
//! assignment and a new quantity (with its rate) effective after everything billed
//! restore and reload on SIGHUP, and the results equal, byte for byte, a replay from
//! the log start under the new config; a retroactive assignment is refused naming
//! its key. On the dev broker, with the OpenAI-style example config.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use tally::devtools::support::signal;

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const MIN: i64 = 60_000;
const WAIT: Duration = Duration::from_secs(120);

/// The example config for `group` on `broker`, state under `dir`, with `extra`
/// appended (more rating entries).
fn rating_config(dir: &Path, broker: &DevBroker, group: &str, name: &str, extra: &str) -> PathBuf {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config/rating/openai.toml"),
    )
    .unwrap();
    let d = dir.display();
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\ngroup_id = \"{group}\"\n\"session.timeout.ms\" = \
         \"6000\"\n[checkpoint]\ndir = \"{d}/checkpoints\"\ninterval = \"1s\"\n[state]\ndir = \
         \"{d}/state-{group}\"\n{example}\n{extra}",
        broker.bootstrap
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// From 00:07 tenant t3 is on the enterprise plan; from 00:08 `image_count` is read
/// and priced (o-large's price from then on gives it a rate).
const FUTURE: &str = r#"
[[prices.assignments]]
tenant = "t3"
plan = "enterprise"
effective_from = "2026-01-01T00:07:00Z"

[input.quantities.image_count]
pointer = "/usage/image_count"
effective_from = "2026-01-01T00:08:00Z"

[[prices.models.o-large.schedule]]
effective_from = "2026-01-01T00:08:00Z"
rates = { prompt_tokens = "0.002", cached_tokens = "0.0005", completion_tokens = "0.008", reasoning_tokens = "0.008", web_search_calls = { per_unit = "0.01" }, image_count = { per_unit = "0.02" } }
"#;

const RETRO: &str = r#"
[[prices.assignments]]
tenant = "t3"
plan = "enterprise"
effective_from = "2026-01-01T00:01:00Z"
"#;

/// Records `from..to`, 150 ms apart from `T0 + from·150 ms`, over two partitions
/// and ten tenants; every one carries two images (read only once declared).
fn records(from: usize, to: usize) -> Vec<(i32, String)> {
    (from..to)
        .map(|i| {
            let payload = format!(
                r#"{{"request_id":"r-{i}","tenant_id":"t{}","model":"o-large","completed_ts":{},"usage":{{"prompt_tokens":1000,"prompt_tokens_details":{{"cached_tokens":{}}},"completion_tokens":100,"image_count":2}}}}"#,
                i % 10,
                T0 + i as i64 * 150,
                i % 700
            );
            ((i % 2) as i32, payload)
        })
        .collect()
}

const TOPICS: &[(&str, i32)] = &[
    ("requests", 2),
    ("tenant-cost", 2),
    ("requests.late", 1),
    ("requests.dlq", 1),
    ("replay-cost", 2),
    ("replay-late", 1),
    ("replay-dlq", 1),
];

/// Replays the whole log under `cfg` into `replay-cost` and says whether the live
/// results equal it byte for byte; also checks the future entries billed.
fn assert_equals_a_replay(broker: &DevBroker, dir: &Path, cfg: &Path) {
    let state = dir.join("state-replay");
    let checkpoints = dir.join("checkpoints-replay");
    tally_ok(
        &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[
            ("TALLY_KAFKA__GROUP_ID", "replay"),
            ("TALLY_TOPICS__RESULTS", "replay-cost"),
            ("TALLY_TOPICS__LATE", "replay-late"),
            ("TALLY_TOPICS__DEAD_LETTER", "replay-dlq"),
            ("TALLY_STATE__DIR", state.to_str().unwrap()),
            ("TALLY_CHECKPOINT__DIR", checkpoints.to_str().unwrap()),
        ],
        Duration::from_secs(300),
    );
    let live = final_payloads(broker, "tenant-cost");
    let replay = final_payloads(broker, "replay-cost");
    assert!(live.len() >= 10 * 10, "{} windows", live.len());
    assert!(live == replay, "the live results differ from the replay");
    // The future entries did bill: t3 on its plan from 00:07, images from 00:08.
    let mut planned = 0;
    let mut images = 0;
    for (_, payload) in live.values() {
        let r: tally::engine::ResultRecord = serde_json::from_slice(payload).unwrap();
        for l in &r.lines {
            assert_eq!(
                l.plan.is_some(),
                r.tenant_id == "t3" && r.window_start >= T0 + 7 * MIN,
                "{r:?}"
            );
            planned += usize::from(l.plan.is_some());
            let imaged = l.quantities.iter().any(|q| &*q.quantity == "image_count");
            assert_eq!(imaged, r.window_start >= T0 + 8 * MIN, "{r:?}");
            images += usize::from(imaged);
        }
    }
    assert!(planned > 0 && images > 0);
}

#[test]
fn a_future_assignment_and_quantity_restore_and_equal_a_replay_a_retroactive_one_is_refused() {
    let dir = TempDir::new("rating-evolve");
    let broker = DevBroker::start(TOPICS);
    let old = rating_config(dir.path(), &broker, "evolve", "old", "");
    let new = rating_config(dir.path(), &broker, "evolve", "new", FUTURE);
    let retro = rating_config(dir.path(), &broker, "evolve", "retro", RETRO);
    produce_to_partitions(&broker, &records(0, 2_000)); // 00:00 to 00:05
    let run = |cfg: &Path| {
        tally(
            &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
            &[],
            Duration::from_secs(300),
        )
    };
    assert!(run(&old).status.success());
    let refused = run(&retro);
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(
        refused.status.code() == Some(3)
            && log.contains("`prices.assignments (tenant \"t3\")` effective_from 2026-01-01T00:01:00.000Z was added")
            && log.contains("already priced records up to 2026-01-01T00:04:59"),
        "{log}"
    );
    produce_to_partitions(&broker, &records(2_000, 4_000)); // 00:05 to 00:10
    let out = run(&new);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && log.contains("restoring across a compatible config change")
            && log.contains("input.quantities.image_count"),
        "{log}"
    );
    assert_equals_a_replay(&broker, dir.path(), &new);
}

#[test]
fn sighup_reloads_a_future_assignment_and_quantity_and_equals_a_replay() {
    let dir = TempDir::new("rating-hup");
    let broker = DevBroker::start(TOPICS);
    let cfg = rating_config(dir.path(), &broker, "hup", "live", "");
    let new = rating_config(dir.path(), &broker, "hup", "new", FUTURE);
    let retro =
        std::fs::read_to_string(rating_config(dir.path(), &broker, "hup", "retro", RETRO)).unwrap();
    let state = dir.path().join("state-hup");
    produce_to_partitions(&broker, &records(0, 2_000));
    let mut worker =
        tally::devtools::support::spawn_worker(Path::new(tally_bin()), &cfg, &state, &[]).unwrap();
    let st = state.as_path();
    let at = |n: i64| move || (reported_offsets(st) == n).then_some(());
    wait_until("the first records", WAIT, at(2_000));
    let log = || std::fs::read_to_string(state.with_extension("log")).unwrap_or_default();
    std::fs::write(&cfg, retro).unwrap();
    signal(worker.id(), libc::SIGHUP);
    let logged = |what: &'static str| move || log().contains(what).then_some(());
    wait_until("the refusal", WAIT, logged("PRICE RELOAD REFUSED"));
    assert!(
        log().contains("prices.assignments (tenant"),
        "the refusal names the key: {}",
        log()
    );
    std::fs::write(&cfg, std::fs::read_to_string(&new).unwrap()).unwrap();
    signal(worker.id(), libc::SIGHUP);
    wait_until("the reload", WAIT, logged("price table reloaded (SIGHUP)"));
    produce_to_partitions(&broker, &records(2_000, 4_000));
    wait_until("every record", WAIT, at(4_000));
    signal(worker.id(), libc::SIGTERM);
    assert!(worker.wait().unwrap().success(), "{}", log());
    // The windows still open: the same worker state, to the end of input.
    tally_ok(
        &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[("TALLY_STATE__DIR", state.to_str().unwrap())],
        Duration::from_secs(300),
    );
    assert_equals_a_replay(&broker, dir.path(), &new);
}
