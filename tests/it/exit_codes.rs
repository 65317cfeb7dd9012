//! The exit-code table (docs/reference/exit-codes.md), row by row, on the real
//! services: each test runs a command into the situation a row names and asserts
//! the status the table promises — and the `tally: error:` line that says why.
//!
//! Rows proven elsewhere, not repeated here:
//! - `0`, a graceful stop on SIGTERM: the Kafka worker,
//!   `pipeline::bad_records_go_to_the_dead_letter_topic_and_the_worker_keeps_running`;
//!   `reprocess-late --follow`,
//!   `late::the_late_backlog_metric_drains_to_zero_as_the_service_catches_up`; the
//!   sink, `service::the_sink_survives_a_postgres_restart_with_exact_totals`; a
//!   restore waiting on the object store,
//!   `store_faults::on_s3_answering_500_a_restore_exits_4_and_the_run_is_exact_after`.
//! - `130`, `143`: `file_mode::dev_zero_is_read_in_bounded_memory_and_sigint_stops_it`,
//!   `file_mode::sigterm_stops_a_run_blocked_on_a_fifo_promptly_with_its_outputs_and_checkpoint`.
//! - `1`, a local `checkpoint.dir` that cannot be written:
//!   `store_faults::a_local_checkpoint_dir_that_cannot_be_written_exits_1`; damage
//!   found by `checkpoints verify`:
//!   `store_faults::fifos_in_the_store_are_damage_found_without_blocking`.
//! - `2`, an unknown key, a wrong `TALLY_*` variable, a database that does not
//!   exist: `service::exit_statuses_by_class`; a missing `sslrootcert`:
//!   `tls::postgres_over_tls_with_verify_full_and_clear_refusals`.
//! - `4`, PostgreSQL unreachable: `service::exit_statuses_by_class`; the object
//!   store failing during a rebalance restore (every restore of the Kafka worker
//!   runs in the rebalance callback):
//!   `store_faults::on_s3_answering_500_a_restore_exits_4_and_the_run_is_exact_after`;
//!   a TLS handshake that fails (`tally run`):
//!   `tls::a_wrong_ca_a_missing_client_certificate_and_plaintext_fail_naming_why`.
//!
//! Kafka failing mid-run (row `4`) is in `midrun`; the faults use the
//! fault-injection points (docs/DEVELOPING.md#crash-points-fault-injection) and
//! `DevBroker::kill`/`freeze`.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::*;
use tally::base::error::ErrorClass;

mod midrun;

const TOPICS: &[(&str, i32)] = &[
    ("requests", 1),
    ("tenant-cost", 1),
    ("requests.late", 1),
    ("requests.dlq", 1),
];

/// 2026-01-01T10:00:00Z.
const T10: i64 = 1_767_261_600_000;

/// The statuses the code defines (`ErrorClass::ALL`, `cli::Interrupted`), each
/// in the table once; the table lists no other.
#[test]
fn every_status_in_the_table_is_one_the_code_defines() {
    let doc = include_str!("../../docs/reference/exit-codes.md");
    let rows: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| status") && !l.starts_with("|---"))
        .collect();
    let mut documented: Vec<u8> = Vec::new();
    let mut other = Vec::new();
    for row in &rows {
        let cell = row.split('|').nth(1).unwrap().trim();
        let codes: Vec<u8> = cell
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|c| c.parse().unwrap_or_else(|_| panic!("{c:?} in {row}")))
            .collect();
        if codes.is_empty() {
            other.push(cell);
        }
        documented.extend(codes);
    }
    assert_eq!(other, ["killed by a signal"], "rows without a status");
    let interrupted = |signal| {
        tally::cli::Interrupted {
            signal,
            lines: 0,
            input: PathBuf::new(),
        }
        .exit_status()
    };
    let mut defined: Vec<u8> = ErrorClass::ALL.map(ErrorClass::exit_status).to_vec();
    defined.extend([0, interrupted(libc::SIGINT), interrupted(libc::SIGTERM)]);
    documented.sort_unstable();
    defined.sort_unstable();
    assert_eq!(documented, defined, "the table's statuses vs the code's");
    // What a supervisor must not restart on is the configuration and the refusals.
    let prevent = format!(
        "RestartPreventExitStatus={} {}",
        ErrorClass::Config.exit_status(),
        ErrorClass::Refused.exit_status()
    );
    assert!(
        doc.contains(&prevent),
        "{prevent} not in the table's advice"
    );
}

/// Row `0`: `--help` and `--version`, of the command and of a subcommand.
#[test]
fn help_and_version_exit_0() {
    for args in [&["--help"][..], &["--version"], &["run", "--help"]] {
        let out = tally(args, &[], Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(!out.stdout.is_empty(), "{args:?} printed nothing");
    }
}

/// Row `2`: a command line clap cannot parse, a `[kafka]` property librdkafka
/// refuses (found before Kafka is needed: nothing listens at the bootstrap). An
/// unknown key and a wrong `TALLY_*` variable: `service::exit_statuses_by_class`.
#[test]
fn usage_and_configuration_errors_exit_2() {
    let dir = TempDir::new("exit-config");
    let d = dir.path();
    let plain = offline_config(d, "flag", "", "");
    let property = offline_config(d, "prop", "\"no.such.property\" = \"1\"\n", "");
    for (cfg, extra, named) in [
        (&plain, Some("--no-such-flag"), "--no-such-flag"),
        (&property, None, "no.such.property"),
    ] {
        let mut args = vec!["run", "--config", cfg.to_str().unwrap()];
        args.extend(extra);
        let out = tally(&args, &[], Duration::from_secs(30));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{named}:\n{err}");
        assert!(
            err.contains(named),
            "the message does not name {named}:\n{err}"
        );
    }
}

/// Row `3`: refusals an operator must act on — a `state.dir` that is a file (the
/// Kafka worker: found before Kafka is needed), an output that is the input (a
/// file run).
#[test]
fn refusals_exit_3() {
    let dir = TempDir::new("exit-refused");
    let d = dir.path();
    let cfg = offline_config(d, "statefile", "", "");
    std::fs::write(d.join("state-statefile"), b"not a directory").unwrap();
    let out = tally(
        &["run", "--config", cfg.to_str().unwrap()],
        &[],
        Duration::from_secs(30),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("exists and is not a directory"), "{err}");

    let input = d.join("in.jsonl");
    std::fs::write(&input, event("r1", "acme", "small", T10) + "\n").unwrap();
    let out = tally(
        &[
            "run",
            "--config",
            offline_config(d, "same", "", "").to_str().unwrap(),
            "--input-file",
            input.to_str().unwrap(),
            "--output-file",
            input.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(30),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("is the input file"), "{err}");
}

/// Row `4`: nothing answers at the bootstrap address; the worker gives up after
/// `kafka.connect_timeout` (2 s here), naming the wait and the last error.
#[test]
fn kafka_unreachable_at_start_exits_4() {
    let dir = TempDir::new("exit-unreachable");
    let cfg = offline_config(dir.path(), "nobody", "", "");
    let started = Instant::now();
    let out = tally(
        &["run", "--config", cfg.to_str().unwrap()],
        &[],
        Duration::from_secs(60),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let last = error_line(&err);
    assert!(
        last.contains("no answer from 127.0.0.1:1 within 2 s (kafka.connect_timeout)"),
        "{last}"
    );
}

/// Row `4`, "a TLS handshake … failure names itself", for the other commands that
/// wait for the cluster: `tally run` says `certificate verify failed` for a broker
/// whose certificate a wrong CA does not verify (`tls`); `sink` and
/// `reprocess-late` must say so too, not only librdkafka's summary.
#[test]
fn a_wrong_kafka_ca_exits_4_naming_the_certificate_from_every_command() {
    let dir = TempDir::new("exit-ca");
    let d = dir.path();
    let certs = crate::tls::certs(d);
    let broker = crate::tls::tls_broker(&certs, false);
    let cfg = crate::tls::config(
        d,
        "wrong-ca",
        &broker.bootstrap,
        &crate::tls::tls_properties(&certs, "other-ca.pem", false),
    );
    let db = fresh_database("exitca");
    let mut failures = Vec::new();
    for args in [
        &["sink", "--config", &cfg][..],
        &["reprocess-late", "--config", &cfg],
    ] {
        let started = Instant::now();
        let out = tally(
            args,
            &[("TALLY_SINK__DATABASE_URL", &db)],
            Duration::from_secs(90),
        );
        let err = stderr(&out);
        let last = error_line(&err);
        eprintln!(
            "{}: {} after {:?}: {last}",
            args[0],
            out.status,
            started.elapsed()
        );
        if out.status.code() != Some(4) || !last.contains("certificate verify failed") {
            failures.push(format!("{}: {} — {last}", args[0], out.status));
        }
    }
    assert!(
        failures.is_empty(),
        "expected exit 4 naming `certificate verify failed`:\n{}",
        failures.join("\n")
    );
}

/// Row `1`: a panic (a bug) in any thread exits 1 — the worker loop (applying a
/// record that fires several panes, `mid_pane_burst`; a timed checkpoint's
/// barrier, `before_barrier`) — promptly, never a hang.
#[test]
fn a_panic_in_the_worker_loop_exits_1() {
    panics_exit_1(&["mid_pane_burst", "before_barrier"]);
}

/// Row `1`: a panic in the checkpoint's export thread (`mid_upload`).
#[test]
fn a_panic_in_the_export_thread_exits_1() {
    panics_exit_1(&["mid_upload"]);
}

/// Row `1`: a panic in the poll thread, inside the rebalance callback
/// (`rebalance_assign`, `rebalance_revoke` when leaving at SIGTERM).
#[test]
fn a_panic_in_the_rebalance_callback_exits_1() {
    panics_exit_1(&["rebalance_assign", "rebalance_revoke"]);
}

/// For each point: a worker over three tenants' records in the 10:00 window and
/// one at 10:05 that fires their three panes, `TALLY_PANIC_AT=<point>`; it must
/// exit 1 within 20 s, its log naming the panic. (`rebalance_revoke` is reached
/// when the worker leaves the group: a SIGTERM after its first checkpoint.)
fn panics_exit_1(points: &[&str]) {
    let mut failures = Vec::new();
    for point in points {
        let dir = TempDir::new(&format!("exit-panic-{point}"));
        let broker = DevBroker::start(TOPICS);
        let mut events: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|t| event(&format!("r-{t}"), t, "small", T10 + 1_000))
            .collect();
        events.push(event("r-late", "a", "small", T10 + 5 * 60_000));
        produce(&broker, "requests", 0, "k", &events);
        let cfg = job_config(dir.path(), &broker, "panic", "6000", "", "500ms");
        let text = std::fs::read_to_string(&cfg).unwrap() + "[watermark]\nmax_lead = \"off\"\n";
        std::fs::write(&cfg, text).unwrap();
        let mut w = worker(dir.path(), &cfg, &[("TALLY_PANIC_AT", point)]);
        let started = Instant::now();
        if *point == "rebalance_revoke" {
            wait_log(&mut w, &["checkpoint complete", "offsets=0:"]);
            signal(w.id(), libc::SIGTERM);
        }
        // Exiting takes a second or two; 20 s is a hang.
        let deadline = started + Duration::from_secs(20);
        let status = loop {
            match w.exited() {
                Some(status) => break Some(status),
                None if Instant::now() > deadline => break None,
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let log = w.log_text();
        let panicked = log.contains(&format!("panic point {point} reached"));
        let seen = status.map_or("no exit within 20 s (a hang)".to_string(), |s| {
            s.to_string()
        });
        eprintln!(
            "{point}: {seen} after {:?}; panicked: {panicked}; last error: {}",
            started.elapsed(),
            error_line(&log)
        );
        if status.and_then(|s| s.code()) != Some(1) || !panicked {
            failures.push(format!(
                "{point}: {seen} (panicked: {panicked})\n{}",
                tail(&log, 8)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "expected exit 1 after the panic:\n{}",
        failures.join("\n")
    );
}

/// A config whose bootstrap has nothing listening (`127.0.0.1:1`) and a 2 s
/// connect timeout, state and checkpoints under `dir`; `kafka` lines added to
/// `[kafka]`, `sections` after.
fn offline_config(dir: &Path, name: &str, kafka: &str, sections: &str) -> PathBuf {
    let d = dir.display();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\ngroup_id = \"{name}\"\n\
             connect_timeout = \"2s\"\n{kafka}[checkpoint]\ndir = \"{d}/checkpoints\"\n\
             [state]\ndir = \"{d}/state-{name}\"\n{sections}{PRICES}"
        ),
    )
    .unwrap();
    path
}

/// `write_config` for `broker` with the session timeout `session` ms, `kafka`
/// lines added to `[kafka]` and the checkpoint interval `interval`.
fn job_config(
    dir: &Path,
    broker: &DevBroker,
    group: &str,
    session: &str,
    kafka: &str,
    interval: &str,
) -> PathBuf {
    let cfg = write_config(dir, broker, group, "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replacen(
            "\"session.timeout.ms\" = \"6000\"\n",
            &format!("\"session.timeout.ms\" = \"{session}\"\n{kafka}"),
            1,
        )
        .replacen(
            "interval = \"1s\"",
            &format!("interval = \"{interval}\""),
            1,
        );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// `tally run --config cfg` with `envs`, logging at info to `<dir>/worker.log`.
fn worker(dir: &Path, cfg: &Path, envs: &[(&str, &str)]) -> Service {
    let mut all = vec![("TALLY_LOG", "info")];
    all.extend_from_slice(envs);
    Service::start(
        &["run", "--config", cfg.to_str().unwrap()],
        &all,
        dir.join("worker.log"),
    )
}

/// Waits (60 s at most) for a log line holding every one of `needles`; panics if
/// the process exits first.
fn wait_log(w: &mut Service, needles: &[&str]) {
    wait_until(
        &format!("{needles:?} in the log"),
        Duration::from_secs(60),
        || {
            if let Some(status) = w.exited() {
                panic!(
                    "exited ({status}) before {needles:?}:\n{}",
                    tail(&w.log_text(), 30)
                );
            }
            let log = w.log_text();
            log.lines()
                .any(|l| needles.iter().all(|n| l.contains(n)))
                .then_some(())
        },
    );
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `tally: error:` line of a log (the last one), or "" if there is none.
fn error_line(log: &str) -> String {
    log.lines()
        .rfind(|l| l.starts_with("tally: error:"))
        .unwrap_or_default()
        .to_string()
}
