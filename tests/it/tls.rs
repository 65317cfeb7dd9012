//! Issue 13: Kafka over TLS and mTLS (the dev broker's TLS mode: a TLS listener in
//! front of the mock cluster, its advertised listener moved there) and
//! PostgreSQL over TLS (a throw-away server with `ssl=on` that admits only
//! `hostssl` with scram-sha-256), with certificates generated for each test.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

const TOPICS: &[(&str, i32)] = &[
    ("requests", 4),
    ("tenant-cost", 2),
    ("requests.late", 1),
    ("requests.dlq", 1),
];
pub(crate) const KEY_PASSWORD: &str = "CANARY-tls-keypw-31";

/// `tally-dev certs` into `<dir>/certs`: ca, server (localhost/127.0.0.1), client
/// (key encrypted with KEY_PASSWORD), other-ca.
pub(crate) fn certs(dir: &Path) -> PathBuf {
    let out = dir.join("certs");
    let status = Command::new(tally_dev_bin())
        .args([OsStr::new("certs"), OsStr::new("--out"), out.as_os_str()])
        .args(["--client-key-password", KEY_PASSWORD])
        .status()
        .expect("tally-dev certs");
    assert!(status.success());
    out
}

pub(crate) fn tls_broker(certs: &Path, mtls: bool) -> Broker {
    let (cert, key, ca) = (
        certs.join("server.pem"),
        certs.join("server.key"),
        certs.join("ca.pem"),
    );
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("--tls-cert"),
        cert.as_os_str(),
        OsStr::new("--tls-key"),
        key.as_os_str(),
    ];
    if mtls {
        args.extend([OsStr::new("--tls-client-ca"), ca.as_os_str()]);
    }
    Broker::start_with(Path::new(tally_bin()), TOPICS, &args).expect("tally dev-broker --tls-*")
}

/// A job config whose `[kafka]` section is `kafka` (librdkafka's own names).
pub(crate) fn config(dir: &Path, name: &str, bootstrap: &str, kafka: &str) -> String {
    let text = format!(
        "[kafka]\nbootstrap_servers = \"{bootstrap}\"\ngroup_id = \"{name}\"\nconnect_timeout = \"5s\"\n{kafka}\n\
         [checkpoint]\ndir = \"{d}/checkpoints-{name}\"\ninterval = \"1s\"\n[state]\ndir = \"{d}/state-{name}\"\n{PRICES}",
        d = dir.display()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

pub(crate) fn tls_properties(certs: &Path, ca: &str, client_cert: bool) -> String {
    let mut p = format!(
        "\"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = \"{}\"\n",
        certs.join(ca).display()
    );
    if client_cert {
        p.push_str(&format!(
            "\"ssl.certificate.location\" = \"{}\"\n\"ssl.key.location\" = \"{}\"\n\"ssl.key.password\" = \"{KEY_PASSWORD}\"\n",
            certs.join("client.pem").display(),
            certs.join("client.key").display()
        ));
    }
    p
}

/// gen → run → sink over `cfg`, then the invoice view equals the generator's expectation.
fn exact_totals(dir: &Path, name: &str, cfg: &str, db: &str) -> String {
    let expected = generate(
        Path::new(cfg),
        dir,
        &format!("expected-{name}"),
        &["--count", "3000", "--tenants", "12", "--seed", "5"],
    );
    let run = tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    let env = [("TALLY_SINK__DATABASE_URL", db)];
    let sink = tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(300),
    );
    assert_eq!(view_rows(db), expected_rows(&expected));
    format!(
        "{}{}",
        String::from_utf8_lossy(&run.stderr),
        String::from_utf8_lossy(&sink.stderr)
    )
}

#[test]
fn a_worker_and_the_sink_over_tls_and_mtls_reach_exact_totals() {
    let dir = TempDir::new("kafka-tls");
    let certs = certs(dir.path());
    for mtls in [false, true] {
        let broker = tls_broker(&certs, mtls);
        let name = if mtls { "mtls" } else { "tls" };
        let cfg = config(
            dir.path(),
            name,
            &broker.bootstrap,
            &tls_properties(&certs, "ca.pem", mtls),
        );
        let log = exact_totals(dir.path(), name, &cfg, &fresh_database(name));
        assert!(
            !log.contains(KEY_PASSWORD),
            "ssl.key.password leaked:\n{log}"
        );
    }
}

/// Runs `tally run` against `broker` with `kafka` properties; it must give up
/// within its connect timeout (5 s) plus slack, exit 4, and say why.
fn refused(dir: &Path, name: &str, bootstrap: &str, kafka: &str) -> String {
    let cfg = config(dir, name, bootstrap, kafka);
    let started = Instant::now();
    let out = tally(&["run", "--config", &cfg], &[], Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(4), "{name}:\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "{name}: took {:?}",
        started.elapsed()
    );
    let last = stderr.lines().last().unwrap_or_default().to_string();
    assert!(
        last.contains("within 5 s (kafka.connect_timeout)"),
        "{name}: {last}"
    );
    last
}

#[test]
fn a_wrong_ca_a_missing_client_certificate_and_plaintext_fail_naming_why() {
    let dir = TempDir::new("kafka-tls-bad");
    let d = dir.path();
    let certs = certs(d);
    let tls = tls_broker(&certs, false);
    let wrong_ca = refused(
        d,
        "wrong-ca",
        &tls.bootstrap,
        &tls_properties(&certs, "other-ca.pem", false),
    );
    assert!(wrong_ca.contains("certificate verify failed"), "{wrong_ca}");
    let plain = refused(d, "plaintext", &tls.bootstrap, "");
    assert!(plain.contains("security.protocol"), "{plain}");
    let mtls = tls_broker(&certs, true);
    let no_cert = refused(
        d,
        "no-client-cert",
        &mtls.bootstrap,
        &tls_properties(&certs, "ca.pem", false),
    );
    assert!(no_cert.contains("alert certificate required"), "{no_cert}");
}

#[test]
fn postgres_over_tls_with_verify_full_and_clear_refusals() {
    let dir = TempDir::new("pg-tls");
    let d = dir.path();
    let certs = certs(d);
    let password = "CANARY-pg-tls-77";
    let pg = ScratchPostgres::start(
        d,
        &[
            ("PG_TLS_DIR", certs.to_str().unwrap()),
            ("PG_PASSWORD", password),
        ],
    );
    let url = pg
        .url
        .replacen("postgres@", &format!("postgres:{password}@"), 1);
    let ca = certs.join("ca.pem");
    let with = |params: &str| format!("{url}?{params}");
    let migrate = |url: &str| {
        tally(
            &["migrate"],
            &[("TALLY_SINK__DATABASE_URL", url)],
            Duration::from_secs(60),
        )
    };

    // End to end over verify-full: the sink writes, the view is read back over TLS.
    let broker = DevBroker::start(TOPICS);
    let cfg = config(d, "pg-tls", &broker.bootstrap, "");
    let good = with(&format!("sslmode=verify-full&sslrootcert={}", ca.display()));
    let log = exact_totals(d, "pg-tls", &cfg, &good);
    assert!(
        !log.contains(password),
        "the database password leaked:\n{log}"
    );

    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let wrong = migrate(&with(&format!(
        "sslmode=verify-full&sslrootcert={}",
        certs.join("other-ca.pem").display()
    )));
    assert!(!wrong.status.success());
    assert!(
        stderr(&wrong).contains("certificate verify failed"),
        "{}",
        stderr(&wrong)
    );

    // sslrootcert is the only trust: a CA the system store trusts (SSL_CERT_FILE)
    // does not make a server certificate from it acceptable.
    let other_root = with(&format!(
        "sslmode=verify-ca&sslrootcert={}",
        certs.join("other-ca.pem").display()
    ));
    let system_trusts = tally(
        &["migrate"],
        &[
            ("TALLY_SINK__DATABASE_URL", other_root.as_str()),
            ("SSL_CERT_FILE", ca.to_str().unwrap()),
        ],
        Duration::from_secs(60),
    );
    assert!(
        !system_trusts.status.success(),
        "{}",
        stderr(&system_trusts)
    );
    assert!(stderr(&system_trusts).contains("certificate verify failed"));

    // verify-full checks the host name; verify-ca does not.
    let port = pg
        .url
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let elsewhere = |mode: &str| {
        format!(
            "postgres://postgres:{password}@db.elsewhere.test:{port}/postgres?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}",
            ca.display()
        )
    };
    let full = migrate(&elsewhere("verify-full"));
    assert!(!full.status.success(), "{}", stderr(&full));
    assert!(
        stderr(&full).contains("certificate verify failed"),
        "{}",
        stderr(&full)
    );
    let ca_only = migrate(&elsewhere("verify-ca"));
    assert!(ca_only.status.success(), "{}", stderr(&ca_only));

    let disabled = migrate(&with("sslmode=disable"));
    assert!(!disabled.status.success());
    let e = stderr(&disabled);
    assert!(
        e.contains("pg_hba.conf") && e.contains("no encryption"),
        "{e}"
    );

    let no_root = migrate(&with("sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem"));
    assert_eq!(no_root.status.code(), Some(2), "{}", stderr(&no_root));
    assert!(stderr(&no_root).contains("sslrootcert /nonexistent/ca.pem"));
    for o in [&wrong, &system_trusts, &full, &disabled, &no_root] {
        assert!(!stderr(o).contains(password), "{}", stderr(o));
    }
}
