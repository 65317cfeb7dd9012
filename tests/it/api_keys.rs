//! The usage API's keys (issue 37, step 1), on real PostgreSQL over real
//! sockets: every route but the probes needs a key; a tenant key reads its
//! tenants and nothing else (any other answers as unknown); a revoked key is
//! refused after SIGHUP; a key's clear text reaches no output.

use std::time::Duration;

use crate::api_http::api_request;
use crate::common::*;
use crate::usage_api::mint;

/// `GET path` with `key` (if any): status, `WWW-Authenticate`, body.
fn get(addr: &str, path: &str, key: Option<&str>, accept: &str) -> (u16, String, String) {
    let r = api_request(addr, path, key, accept);
    let challenge = r.header("www-authenticate");
    (r.status, challenge, r.body)
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// Two tenants' hours (acme 5 pico, globex 7), as the sink stores them.
fn database(dir: &std::path::Path, cfg: &str) -> String {
    let db = fresh_database("apikeys");
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(60),
    );
    let _ = dir;
    execute(
        &db,
        "INSERT INTO tenant_cost_partial VALUES ('acme', 1767265200000, 0, 1767261600000, 5, 1, 1, 1, 1, 1, 'on_time', 0);
         INSERT INTO tenant_cost_line_partial VALUES ('acme', 1767265200000, 0, 'small', 1767261600000, 5, 1, 1, 1, 1, 1);
         INSERT INTO tenant_cost_partial VALUES ('globex', 1767265200000, 0, 1767261600000, 7, 1, 1, 1, 1, 1, 'on_time', 0);
         INSERT INTO tenant_cost_line_partial VALUES ('globex', 1767265200000, 0, 'small', 1767261600000, 7, 1, 1, 1, 1, 1);",
    );
    db
}

const Q: &str = "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&window=hour";

fn tenants_in(body: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_tenant_key_reads_its_tenants_only_and_a_revoked_key_is_refused_after_sighup() {
    let dir = TempDir::new("api-keys");
    let d = dir.path();
    let cfg = d.join("api.toml");
    let keys = d.join("keys");
    std::fs::write(
        &cfg,
        format!(
            "{PRICES}\n[window]\nsize = \"1h\"\n[api]\nlisten = \"127.0.0.1:0\"\nkeys = \"{}\"\n",
            keys.display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let db = database(d, cfg);
    let keys = keys.to_str().unwrap();
    let admin = mint(cfg, keys, "ops", "admin");
    let acme = mint(cfg, keys, "acme-dash", "tenant:acme");
    let two = mint(cfg, keys, "partner", "tenant:acme,initech");
    let mut api = Service::start(
        &["api", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &db), ("TALLY_LOG", "info")],
        d.join("api.log"),
    );
    let addr = bound_addr(&api.log, "usage API: serving");
    wait_until("the API listens", Duration::from_secs(30), || {
        http_get(&addr, "/healthz")
    });
    let json = "application/json";

    // The probes need no key; everything else does.
    assert_eq!(get(&addr, "/readyz", None, "text/plain").0, 200);
    let wrong = format!("tally_{}", "0".repeat(64));
    for (path, key, challenge) in [
        (Q.to_string(), None, r#"Bearer realm="tally""#),
        ("/metrics".to_string(), None, r#"Bearer realm="tally""#),
        (
            "/v1/invoices/acme?period=2026-01".to_string(),
            None,
            r#"Bearer realm="tally""#,
        ),
        (
            Q.to_string(),
            Some("Basic b3BzOnB3".to_string()),
            "invalid_request",
        ),
        (
            Q.to_string(),
            Some(format!("Bearer {}", &acme[..40])),
            "invalid_request",
        ),
        (Q.to_string(), Some(bearer(&wrong)), "invalid_token"),
    ] {
        let (status, www, body) = get(&addr, &path, key.as_deref(), json);
        assert_eq!(status, 401, "{path} {key:?}: {body}");
        assert!(www.contains(challenge), "{path} {key:?}: {www}");
    }

    // Admin reads every tenant; a one-tenant key reads its own without naming it.
    let (status, _, body) = get(&addr, Q, Some(&bearer(&admin)), json);
    assert_eq!(
        (status, tenants_in(&body)),
        (200, vec!["acme".into(), "globex".into()])
    );
    let (status, _, body) = get(&addr, Q, Some(&bearer(&acme)), json);
    assert_eq!((status, tenants_in(&body)), (200, vec!["acme".to_string()]));
    // Another tenant answers as unknown, by parameter or path, JSON or CSV —
    // whether or not it exists.
    for key in [&acme, &two] {
        for path in [
            format!("{Q}&tenant_id=globex"),
            format!("{Q}&tenant_id=nobody"),
            "/v1/invoices/globex?period=2026-01".to_string(),
            "/v1/invoices/nobody?period=2026-01".to_string(),
        ] {
            for accept in [json, "text/csv"] {
                let (status, _, body) = get(&addr, &path, Some(&bearer(key)), accept);
                // An invoice has no CSV: 406 before the tenant is looked at.
                let csv_invoice = path.starts_with("/v1/invoices") && accept == "text/csv";
                assert_eq!(
                    status,
                    if csv_invoice { 406 } else { 404 },
                    "{path} {accept}: {body}"
                );
                assert!(!body.contains('7'), "{path}: globex's cost leaked: {body}");
            }
        }
    }
    let (status, _, body) = get(
        &addr,
        "/v1/invoices/acme?period=2026-01",
        Some(&bearer(&acme)),
        json,
    );
    assert_eq!(status, 200, "{body}");
    // A key of several tenants that names none reads them all (initech has no data).
    let (status, _, body) = get(&addr, Q, Some(&bearer(&two)), json);
    assert_eq!((status, tenants_in(&body)), (200, vec!["acme".to_string()]));
    let (status, _, body) = get(
        &addr,
        &format!("{Q}&tenant_id=acme"),
        Some(&bearer(&two)),
        json,
    );
    assert_eq!((status, tenants_in(&body)), (200, vec!["acme".to_string()]));

    // Revoked, then SIGHUP: refused; the others still read.
    tally_ok(
        &["api-key", "revoke", "--config", cfg, "--id", "acme-dash"],
        &[],
        Duration::from_secs(30),
    );
    signal(api.id(), libc::SIGHUP);
    wait_until(
        "the revoked key is refused",
        Duration::from_secs(10),
        || (get(&addr, Q, Some(&bearer(&acme)), json).0 == 401).then_some(()),
    );
    assert_eq!(get(&addr, Q, Some(&bearer(&admin)), json).0, 200);

    // Failures are counted by reason; no key's clear text is in any output.
    let (status, _, metrics) = get(&addr, "/metrics", Some(&bearer(&admin)), "text/plain");
    assert_eq!(status, 200);
    for reason in ["missing", "malformed", "unknown"] {
        assert!(
            metrics.contains(&format!(
                "tally_api_auth_failures_total{{reason=\"{reason}\"}}"
            )),
            "{metrics}"
        );
    }
    signal(api.id(), libc::SIGTERM);
    api.wait_exit(Duration::from_secs(30));
    let log = api.log_text();
    let files = std::fs::read_to_string(keys).unwrap();
    for key in [&admin, &acme, &two] {
        let secret = &key["tally_".len()..];
        for (what, text) in [("log", &log), ("metrics", &metrics), ("keys file", &files)] {
            assert!(!text.contains(secret), "a key's clear text in the {what}");
        }
    }
}

/// Without `api.keys`, the API starts only when `api.allow_unauthenticated`
/// says so, and then warns; otherwise it exits 2 naming the key.
#[test]
fn without_keys_the_api_refuses_to_start_unless_told_to_serve_everyone() {
    let dir = TempDir::new("api-nokeys");
    let cfg = dir.path().join("api.toml");
    std::fs::write(&cfg, format!("{PRICES}\n[api]\nlisten = \"127.0.0.1:0\"\n")).unwrap();
    let cfg = cfg.to_str().unwrap();
    let out = tally(&["api", "--config", cfg], &[], Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("api.keys") && err.contains("tally api-key create"),
        "{err}"
    );
    let mut open = Service::start(
        &["api", "--config", cfg],
        &[("TALLY_API__ALLOW_UNAUTHENTICATED", "true")],
        dir.path().join("open.log"),
    );
    let addr = bound_addr(&open.log, "usage API: serving");
    assert!(
        open.log_text().contains("allow_unauthenticated"),
        "{}",
        open.log_text()
    );
    assert_eq!(http_get(&addr, "/metrics").map(|r| r.0), Some(200));
    assert!(open.exited().is_none());
}

/// `GET https://addr/healthz` trusting `ca` only (and presenting `identity`):
/// the status, or the error's text.
fn https_get(
    addr: &str,
    ca: &std::path::Path,
    identity: Option<reqwest::Identity>,
) -> Result<u16, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let mut b = reqwest::Client::builder()
        .tls_certs_only([ca])
        .timeout(Duration::from_secs(10));
    if let Some(id) = identity {
        b = b.identity(id);
    }
    let client = b.build().unwrap();
    rt.block_on(async {
        match client.get(format!("https://{addr}/healthz")).send().await {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) => Err(format!("{e:?}")),
        }
    })
}

/// The test client's certificate with its key decrypted (reqwest takes PKCS#8).
fn client_identity(certs: &std::path::Path) -> reqwest::Identity {
    let key = std::fs::read(certs.join("client.key")).unwrap();
    let key = openssl::pkey::PKey::private_key_from_pem_passphrase(
        &key,
        crate::tls::KEY_PASSWORD.as_bytes(),
    )
    .unwrap();
    let cert = std::fs::read(certs.join("client.pem")).unwrap();
    reqwest::Identity::from_pkcs8_pem(&cert, &key.private_key_to_pem_pkcs8().unwrap()).unwrap()
}

/// `api.tls`: a client trusting the test CA is served over HTTPS; a plaintext
/// client and one trusting another CA are not; with `client_ca`, neither is a
/// client without a certificate, and one with the CA's certificate is.
#[test]
fn the_api_serves_https_and_with_client_ca_only_to_certified_clients() {
    let dir = TempDir::new("api-tls");
    let d = dir.path();
    let certs = crate::tls::certs(d);
    for mtls in [false, true] {
        let cfg = d.join(format!("api-{mtls}.toml"));
        let client_ca = if mtls {
            format!("client_ca = \"{}\"\n", certs.join("ca.pem").display())
        } else {
            String::new()
        };
        // The server's files, its own copy (rotated below).
        let (cert, key) = (
            d.join(format!("server-{mtls}.pem")),
            d.join(format!("server-{mtls}.key")),
        );
        std::fs::copy(certs.join("server.pem"), &cert).unwrap();
        std::fs::copy(certs.join("server.key"), &key).unwrap();
        std::fs::write(
            &cfg,
            format!(
                "{PRICES}\n[api]\nlisten = \"127.0.0.1:0\"\nallow_unauthenticated = true\n\
                 [api.tls]\ncert = \"{}\"\nkey = \"{}\"\n{client_ca}",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let api = Service::start(
            &["api", "--config", cfg.to_str().unwrap()],
            &[("TALLY_LOG", "info")],
            d.join(format!("api-{mtls}.log")),
        );
        let addr = bound_addr(&api.log, "usage API: serving");
        let ca = certs.join("ca.pem");
        let trusted = || https_get(&addr, &ca, None);
        if mtls {
            let refused = trusted().expect_err("a client without a certificate was served");
            assert!(!refused.is_empty());
            let with_cert = https_get(&addr, &ca, Some(client_identity(&certs)));
            assert_eq!(with_cert, Ok(200), "{}", api.log_text());
        } else {
            assert_eq!(
                wait_until("HTTPS answers", Duration::from_secs(20), || trusted().ok()),
                200
            );
            let other = https_get(&addr, &certs.join("other-ca.pem"), None);
            assert!(other.is_err(), "a client trusting another CA was served");
            assert_eq!(http_get(&addr, "/healthz"), None, "plain HTTP was served");
            // Rotation: a certificate of a new CA in the same files, then SIGHUP.
            let rotated = d.join("rotated");
            let status = std::process::Command::new(tally_dev_bin())
                .args(["certs", "--out", rotated.to_str().unwrap()])
                .args(["--client-key-password", crate::tls::KEY_PASSWORD])
                .status()
                .unwrap();
            assert!(status.success());
            std::fs::copy(rotated.join("server.pem"), &cert).unwrap();
            std::fs::copy(rotated.join("server.key"), &key).unwrap();
            signal(api.id(), libc::SIGHUP);
            let new_ca = rotated.join("ca.pem");
            wait_until(
                "the rotated certificate serves",
                Duration::from_secs(10),
                || https_get(&addr, &new_ca, None).ok(),
            );
            assert!(trusted().is_err(), "the old certificate still served");
        }
        assert!(
            api.log_text().contains("TLS connection refused"),
            "{}",
            api.log_text()
        );
    }
}
