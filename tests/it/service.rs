//! Behaving like a service (issue 13): librdkafka's own log lines reach tally's
//! log, filtered by `TALLY_LOG` under the target `librdkafka`.

use std::time::Duration;

use crate::common::*;

#[test]
fn librdkafka_logs_reach_the_log_and_kafka_debug_works() {
    let dir = TempDir::new("rdlog");
    let cfg = dir.path().join("c.toml");
    // Nothing listens on port 1: every connection attempt is refused.
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n\"message.timeout.ms\" = \"1500\"\n\"debug\" = \"broker\"\n{PRICES}"
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let args = ["gen", "--config", c, "--count", "1", "--partitions", "1"];
    let debug = tally(
        &args,
        &[("TALLY_LOG", "warn,librdkafka=debug")],
        Duration::from_secs(60),
    );
    let log = String::from_utf8_lossy(&debug.stderr);
    assert!(!debug.status.success(), "{log}");
    assert!(
        log.contains("librdkafka: BROKER"),
        "kafka.\"debug\" lines missing:\n{log}"
    );
    assert!(log.contains("Connection refused"), "{log}");
    // Without the debug filter, librdkafka's debug lines stay out.
    let quiet = tally(&args, &[("TALLY_LOG", "warn")], Duration::from_secs(60));
    let log = String::from_utf8_lossy(&quiet.stderr);
    assert!(!log.contains("librdkafka: BROKER"), "{log}");
}

/// Issue 13, item 3: secrets set in the config or the environment appear in no
/// log line, error or report — through a config error librdkafka words itself,
/// a connection failure, a TOML syntax error and a normal run, at debug level.
#[test]
fn secrets_never_reach_an_output() {
    let dir = TempDir::new("canary");
    let d = dir.path();
    // The SASL canary holds a quote: the JSON log escapes it, and that form
    // must be masked too.
    let canaries = ["CANARY-sa\"sl-7f3a", "CANARY-key-7f3a", "CANARY-db-7f3a"];
    let toml_str = |c: &str| c.replace('"', "\\\"");
    let base = format!(
        "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n\"sasl.username\" = \"billing\"\n\"sasl.password\" = \"{}\"\n\
         \"ssl.key.password\" = \"{}\"\n\"message.timeout.ms\" = \"1000\"\n[sink]\n\
         database_url = \"postgres://billing:{}@127.0.0.1:1/tally?connect_timeout=2\"\n\
         [state]\ndir = \"{}/state\"\n[checkpoint]\ndir = \"{}/checkpoints\"\n{PRICES}",
        toml_str(canaries[0]),
        canaries[1],
        canaries[2],
        d.display(),
        d.display()
    );
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    // SASL over TLS to a port where nothing listens.
    let tls = write(
        "tls.toml",
        &format!("{base}\n[kafka.x]\n")
            .replace(
                "[kafka]\n",
                "[kafka]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"PLAIN\"\n",
            )
            .replace("\n[kafka.x]\n", "\n"),
    );
    let plain = write("plain.toml", &base);
    let syntax = write(
        "syntax.toml",
        &format!("[kafka]\n\"sasl.password\" = \"{}\n", toml_str(canaries[0])),
    );
    let input = d.join("in.jsonl");
    std::fs::write(
        &input,
        event("r1", "acme", "small", 1_767_261_600_000) + "\n",
    )
    .unwrap();
    let out = d.join("out.jsonl");
    let debug = [("TALLY_LOG", "debug")];
    let runs = [
        tally(
            &["gen", "--config", &tls, "--count", "1"],
            &debug,
            Duration::from_secs(60),
        ),
        tally(
            &["gen", "--config", &plain, "--count", "1"],
            &debug,
            Duration::from_secs(60),
        ),
        tally(
            &["migrate", "--config", &plain],
            &debug,
            Duration::from_secs(60),
        ),
        tally(
            &["gen", "--config", &syntax, "--count", "1"],
            &debug,
            Duration::from_secs(60),
        ),
        tally(
            &[
                "run",
                "--config",
                &plain,
                "--input-file",
                input.to_str().unwrap(),
                "--output-file",
                out.to_str().unwrap(),
            ],
            &debug,
            Duration::from_secs(60),
        ),
        // The effective config, which holds every secret.
        tally(
            &["config", "--config", &plain],
            &debug,
            Duration::from_secs(60),
        ),
        // The log as JSON lines: a worker that cannot reach the cluster.
        tally(
            &["run", "--config", &plain],
            &[
                ("TALLY_LOG", "debug"),
                ("TALLY_LOG_FORMAT", "json"),
                ("TALLY_KAFKA__CONNECT_TIMEOUT", "2s"),
                ("TALLY_STATE__DIR", &format!("{}/state-json", d.display())),
            ],
            Duration::from_secs(60),
        ),
        // The same secret from the environment.
        tally(
            &["gen", "--config", &plain, "--count", "1"],
            &[
                ("TALLY_LOG", "debug"),
                ("TALLY_KAFKA__SASL_PASSWORD", "CANARY-env-7f3a"),
            ],
            Duration::from_secs(60),
        ),
    ];
    assert!(!runs[0].status.success() && !runs[2].status.success() && !runs[3].status.success());
    let effective = String::from_utf8_lossy(&runs[5].stdout);
    let json_log = String::from_utf8_lossy(&runs[6].stderr);
    let lines: Vec<&str> = json_log
        .lines()
        .filter(|l| !l.starts_with("tally: error"))
        .collect();
    assert!(lines.len() > 3, "{json_log}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{l}");
    }
    assert!(
        effective.contains("\"sasl.password\" = \"***\""),
        "{effective}"
    );
    assert!(
        runs[4].status.success(),
        "{}",
        String::from_utf8_lossy(&runs[4].stderr)
    );
    let mut seen = String::new();
    // The metrics of a worker waiting for its cluster.
    let waiting_log = d.join("waiting.log");
    let mut waiting = std::process::Command::new(tally_bin())
        .args(["run", "--config", &plain])
        .env("TALLY_METRICS__LISTEN", "127.0.0.1:0")
        .env("TALLY_LOG", "info")
        .env("TALLY_STATE__DIR", format!("{}/state-metrics", d.display()))
        .stderr(std::fs::File::create(&waiting_log).unwrap())
        .spawn()
        .unwrap();
    let listen = bound_addr(&waiting_log, METRICS_SERVING);
    let metrics = wait_until("a scrape", Duration::from_secs(10), || {
        http_get(&listen, "/metrics").map(|(_, body)| body)
    });
    let _ = waiting.kill();
    let _ = waiting.wait();
    // Its log is an output too.
    seen.push_str(&std::fs::read_to_string(&waiting_log).unwrap());
    assert!(
        metrics.contains("tally_build_info"),
        "no metrics scraped: {metrics}"
    );
    seen.push_str(&metrics);
    for r in &runs {
        seen.push_str(&String::from_utf8_lossy(&r.stdout));
        seen.push_str(&String::from_utf8_lossy(&r.stderr));
    }
    for f in ["state/report.json", "out.jsonl"] {
        seen.push_str(&std::fs::read_to_string(d.join(f)).unwrap_or_default());
    }
    assert!(
        seen.contains("***"),
        "nothing was masked: the test proves nothing\n{seen}"
    );
    for c in canaries.iter().chain(&["CANARY-env-7f3a"]) {
        assert!(!seen.contains(c), "{c} leaked:\n{seen}");
        let escaped = serde_json::to_string(c).unwrap();
        let escaped = escaped.trim_matches('"');
        assert!(!seen.contains(escaped), "{escaped} leaked:\n{seen}");
        assert!(
            !seen.contains("CANARY-sa"),
            "a part of the SASL canary leaked:\n{seen}"
        );
    }
}

/// Issue 13, item 8: the exit status says what to do — 2 a configuration error,
/// 4 a dependency that is not there (refusals exit 3: see the recovery tests).
#[test]
fn exit_statuses_by_class() {
    let dir = TempDir::new("exit");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[window]\nsise = \"1m\"\n").unwrap();
    let out = tally(
        &["run", "--config", bad.to_str().unwrap()],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = tally(
        &["migrate"],
        &[("TALLY_CHECKPOINT__RETAIN", "0")],
        Duration::from_secs(60),
    );
    assert_eq!(
        env.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&env.stderr)
    );
    let db = tally(
        &["migrate"],
        &[(
            "TALLY_SINK__DATABASE_URL",
            "postgres://postgres@127.0.0.1:1/x?connect_timeout=2",
        )],
        Duration::from_secs(60),
    );
    assert_eq!(
        db.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&db.stderr)
    );
    // A database that does not exist (SQLSTATE 3D000) is the URL's fault: 2, not 1.
    let admin = std::env::var("TALLY_TEST_PG_URL").expect("TALLY_TEST_PG_URL");
    let (base, _) = admin.rsplit_once('/').unwrap();
    let missing = tally(
        &["migrate"],
        &[(
            "TALLY_SINK__DATABASE_URL",
            &format!("{base}/no_such_database_{}", std::process::id()),
        )],
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{text}");
    assert!(text.contains("does not exist"), "{text}");
}

/// Issue 19, defect 4 beyond the file mode: `tally gen --rate` stops promptly on
/// SIGTERM, flushing what it sent, and says so.
#[test]
fn gen_stops_promptly_on_sigterm() {
    let broker = DevBroker::start(&[("requests", 1)]);
    let dir = TempDir::new("gen-stop");
    let cfg = write_config(dir.path(), &broker, "g", "");
    let mut child = std::process::Command::new(tally_bin())
        .args([
            "gen",
            "--config",
            cfg.to_str().unwrap(),
            "--count",
            "1000000",
            "--rate",
            "200",
            "--partitions",
            "1",
        ])
        .env("TALLY_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    signal(child.id(), libc::SIGTERM);
    let started = std::time::Instant::now();
    let out = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "gen ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("interrupted by a signal"),
        "{err}"
    );
}

/// Issue 13, item 8: the sink survives a PostgreSQL restart mid-run — it
/// reconnects within `sink.retry_budget`, applies the batch in flight again, and
/// the invoice is exact.
///
/// The order is fixed, not raced: the sink starts and connects, is stopped
/// (SIGSTOP) before the results topic holds anything, the worker produces every
/// result, PostgreSQL restarts under the stopped sink, and the sink resumes with
/// a dead connection and its whole first batch in flight.
#[test]
fn the_sink_survives_a_postgres_restart_with_exact_totals() {
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let dir = TempDir::new("pg-restart");
    let d = dir.path();
    let pg = ScratchPostgres::start(d, &[]);
    let url = pg.url.clone();
    let broker = DevBroker::start(&[
        ("requests", 4),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(d, &broker, "pgr", "");
    let cfg = cfg.to_str().unwrap();
    let expected = generate(
        Path::new(cfg),
        d,
        "expected",
        &["--count", "100000", "--tenants", "20", "--seed", "3"],
    );
    let spawn = |args: &[&str], log: &str| {
        Command::new(tally_bin())
            .args(args)
            .env("TALLY_SINK__DATABASE_URL", &url)
            .env("TALLY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join(log)).unwrap())
            .spawn()
            .unwrap()
    };
    let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
    let mut sink = spawn(&["sink", "--config", cfg], "sink.log");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !read("sink.log").contains("sink started") {
        assert!(sink.try_wait().unwrap().is_none(), "{}", read("sink.log"));
        assert!(
            Instant::now() < deadline,
            "the sink never started:\n{}",
            read("sink.log")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(sink.id(), libc::SIGSTOP);
    let worker = spawn(&["run", "--config", cfg, "--until-end"], "worker.log");
    assert!(
        worker.wait_with_output().unwrap().status.success(),
        "{}",
        read("worker.log")
    );
    assert!(
        support_invoice(&url).is_empty(),
        "the sink applied something before the restart: the test would prove less"
    );
    pg.restart();
    signal(sink.id(), libc::SIGCONT);
    let want = expected_rows(&expected);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if support_invoice(&url) == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the invoice never became exact:\n{}",
            read("sink.log")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    signal(sink.id(), libc::SIGTERM);
    assert!(sink.wait().unwrap().success(), "{}", read("sink.log"));
    let log = read("sink.log");
    assert!(log.contains("reconnected to PostgreSQL"), "{log}");
}

/// The invoice view, or nothing while PostgreSQL restarts.
fn support_invoice(url: &str) -> Vec<InvoiceLine> {
    tally::devtools::support::invoice(url).unwrap_or_default()
}

/// Issue 33, item 8: a connection string's secrets in every form libpq accepts —
/// key/value (spaces around `=`, quotes, escapes), a URI's query and a password
/// with an unencoded `@`, and one that cannot be read — never reach `tally config`
/// (from the file or the environment), nor an error that quotes the value, nor
/// the log of a command that uses it.
#[test]
fn connection_strings_in_every_libpq_form_are_masked() {
    let dir = TempDir::new("dsn-canary");
    let d = dir.path();
    // (the connection string, its canaries)
    let cases: [(&str, &[&str]); 6] = [
        (
            "host=127.0.0.1 port=1 user=u password=CANARY-kv-5e1 connect_timeout=1",
            &["CANARY-kv-5e1"],
        ),
        (
            "host=127.0.0.1 port=1 password = 'CANARY-q 5e1\\'x' connect_timeout=1",
            &["CANARY-q 5e1", "5e1\\'x", "5e1'x"],
        ),
        (
            "password=CANARY-es\\ 5e1 host=127.0.0.1 port=1",
            &["CANARY-es", "5e1 host"],
        ),
        (
            "postgres://u@127.0.0.1:1/db?connect_timeout=1&password=CANARY-uq-5e1",
            &["CANARY-uq-5e1"],
        ),
        ("postgres://u:CANARY-at@5e1@127.0.0.1:1/db", &["CANARY-at"]),
        (
            "host=127.0.0.1 password='CANARY-open-5e1",
            &["CANARY-open-5e1"],
        ),
    ];
    let toml_str = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut seen = String::new();
    let mut keep = |out: &std::process::Output| {
        seen.push_str(&String::from_utf8_lossy(&out.stdout));
        seen.push_str(&String::from_utf8_lossy(&out.stderr));
    };
    for (i, (dsn, _)) in cases.iter().enumerate() {
        let cfg = d.join(format!("{i}.toml"));
        std::fs::write(
            &cfg,
            format!("[sink]\ndatabase_url = \"{}\"\n", toml_str(dsn)),
        )
        .unwrap();
        let c = cfg.to_str().unwrap();
        let shown = tally(&["config", "--config", c], &[], Duration::from_secs(30));
        assert!(
            shown.status.success(),
            "{}",
            String::from_utf8_lossy(&shown.stderr)
        );
        let text = String::from_utf8_lossy(&shown.stdout).into_owned();
        assert!(text.contains("***"), "nothing masked for case {i}:\n{text}");
        keep(&shown);
        // From the environment.
        keep(&tally(
            &["config"],
            &[("TALLY_SINK__DATABASE_URL", dsn)],
            Duration::from_secs(30),
        ));
        // An error that quotes the value (a connection string in the wrong key).
        let wrong = tally(
            &["config", "--config", c],
            &[("TALLY_SINK__RETRY_BUDGET", dsn)],
            Duration::from_secs(30),
        );
        assert_eq!(
            wrong.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&wrong.stderr)
        );
        assert!(
            String::from_utf8_lossy(&wrong.stderr).contains("sink.retry_budget"),
            "{}",
            String::from_utf8_lossy(&wrong.stderr)
        );
        keep(&wrong);
        // A command that uses it and fails to connect.
        keep(&tally(
            &["migrate", "--config", c],
            &[("TALLY_LOG", "debug"), ("TALLY_SINK__RETRY_BUDGET", "1s")],
            Duration::from_secs(60),
        ));
    }
    for (_, canaries) in cases {
        for c in canaries {
            assert!(!seen.contains(c), "{c} leaked:\n{seen}");
        }
    }
}

/// Issue 33, item 3: models whose names differ only by case are refused, naming
/// both keys (exit 2) — also when a variable would have repriced one of them.
#[test]
fn case_variant_model_names_are_refused_with_exit_2() {
    let dir = TempDir::new("case-models");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[prices.Small]\ninput_per_1k = \"0.1\"\noutput_per_1k = \"0.2\"\n\
         [prices.small]\ninput_per_1k = \"0.1\"\noutput_per_1k = \"0.2\"\n",
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    for env in [&[][..], &[("TALLY_PRICES__SMALL__INPUT_PER_1K", "0.2")][..]] {
        let out = tally(&["config", "--config", c], env, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("prices.Small") && err.contains("prices.small"),
            "{err}"
        );
    }
}
