//! Window state and dedup ids beyond `state.memory_budget` live in RocksDB
//! (docs/DESIGN.md §7.7, docs/operations/memory.md): a run that spills nearly every
//! window and id produces the same bytes as one that keeps everything in memory.

use std::time::Duration;

use crate::common::*;

/// Copies of every 40th event, 3 minutes older under a new id: late, but within
/// the 10-minute allowed lateness, so they fold into fired — often evicted — windows.
fn with_late_copies(lines: &str) -> String {
    let mut out = String::new();
    for (i, line) in lines.lines().enumerate() {
        out.push_str(line);
        out.push('\n');
        let Ok(mut v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if i % 40 != 0 || v.get("completed_ts").is_none() {
            continue;
        }
        v["request_id"] = format!("{}-late", v["request_id"].as_str().unwrap_or("x")).into();
        for f in ["started_ts", "completed_ts"] {
            if let Some(ts) = v[f].as_i64() {
                v[f] = (ts - 180_000).into();
            }
        }
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

#[test]
fn a_tight_memory_budget_spills_windows_and_changes_no_byte_of_output() {
    let dir = TempDir::new("budget");
    let d = dir.path().display();
    let cfg = dir.path().join("file.toml");
    std::fs::write(
        &cfg,
        format!(
            "[window]\nallowed_lateness = \"10m\"\n[checkpoint]\ndir = \"{d}/checkpoints\"\ninterval = \"1h\"\n\
             [state]\ndir = \"{d}/state\"\n{PRICES}"
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let generated = dir.path().join("gen.jsonl");
    generate(
        &cfg,
        dir.path(),
        "gen",
        &[
            "--count",
            "30000",
            "--tenants",
            "300",
            "--skew",
            "0.5",
            "--partitions",
            "1",
            "--step",
            "20ms",
            "--duplicate-fraction",
            "0.02",
            "--malformed-fraction",
            "0.01",
            "--late-fraction",
            "0.01",
            "--output-file",
            generated.to_str().unwrap(),
        ],
    );
    let input = dir.path().join("input.jsonl");
    std::fs::write(
        &input,
        with_late_copies(&std::fs::read_to_string(&generated).unwrap()),
    )
    .unwrap();
    let run = |name: &str, budget: &str| {
        let out = dir.path().join(format!("{name}.jsonl"));
        let o = tally_ok(
            &[
                "run",
                "--config",
                c,
                "--input-file",
                input.to_str().unwrap(),
                "--output-file",
                out.to_str().unwrap(),
            ],
            &[("TALLY_STATE__MEMORY_BUDGET", budget)],
            Duration::from_secs(300),
        );
        let read = |suffix: &str| std::fs::read(format!("{}{suffix}", out.display())).unwrap();
        (
            [read(""), read(".late.jsonl"), read(".dlq.jsonl")],
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (plain, plain_log) = run("plain", "off");
    // 16 KiB is about a hundred windows; the run holds thousands.
    let (spilled, spilled_log) = run("spilled", "16KiB");
    assert!(plain_log.contains("windows_evicted=0"), "{plain_log}");
    let evicted: u64 = spilled_log
        .split("windows_evicted=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the run reports its evictions");
    assert!(
        evicted > 1_000,
        "only {evicted} windows evicted:\n{spilled_log}"
    );
    let moved: u64 = spilled_log
        .split("dedup_ids_moved_out=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the run reports its dedup ids moved out");
    assert!(
        moved > 10_000,
        "only {moved} dedup ids moved out:\n{spilled_log}"
    );
    assert!(!plain[0].is_empty() && !plain[1].is_empty() && !plain[2].is_empty());
    for (a, b) in plain.iter().zip(&spilled) {
        assert!(a == b, "spilling changed the output");
    }
}
