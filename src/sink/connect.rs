//! Opening PostgreSQL with libpq's TLS parameters (docs/reference/configuration.md,
//! `sink.database_url`).
//!
//! tokio-postgres knows `sslmode` = disable | prefer | require and nothing of
//! certificates, so the libpq parameters are taken out of the URL here
//! (`split_tls`, pure) and turned into an OpenSSL connector (`connector`). Their
//! meanings are libpq's:
//!
//! | sslmode       | TLS        | server certificate checked against | host name checked |
//! |---------------|------------|------------------------------------|-------------------|
//! | `disable`     | never      | –                                  | –                 |
//! | `allow`, `prefer` (default) | if the server offers it | not checked | no     |
//! | `require`     | always     | `sslrootcert` if there is one, else not checked | no   |
//! | `verify-ca`   | always     | `sslrootcert`                      | no                |
//! | `verify-full` | always     | `sslrootcert`                      | yes (DNS or IP SAN) |
//!
//! - `sslrootcert` is a PEM file of trusted CAs, or `system` for the system's
//!   trust store. As in libpq, it defaults to `~/.postgresql/root.crt`; verify-ca
//!   and verify-full without any root certificate are a configuration error.
//! - `sslrootcert=<file>` trusts that file only (not the system store);
//!   `sslrootcert=system` means `verify-full` and refuses weaker modes (libpq 16).
//! - `sslcert` / `sslkey`: the client certificate and key (PEM) for certificate
//!   authentication; default `~/.postgresql/postgresql.crt` / `.key` when present.
//!   An encrypted key needs `sslpassword` (a secret); there is never a prompt.
//! - `allow` is treated as `prefer` (TLS first): tokio-postgres cannot try
//!   plaintext first, and the stricter order loses nothing.
//! - Only the URL form (`postgres://…?sslmode=…`) carries these parameters; the
//!   rest of the URL is tokio-postgres's.

use std::path::{Path, PathBuf};

use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use postgres_openssl::MakeTlsConnector;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Where the server certificate's issuer must come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    File(PathBuf),
    System,
}

/// The TLS part of a database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsParams {
    pub mode: SslMode,
    pub root_cert: Option<RootCert>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// libpq's `sslpassword`: the passphrase of an encrypted `sslkey` (a secret).
    pub key_password: Option<String>,
}

/// Splits libpq's TLS parameters out of `url`: the URL tokio-postgres is given
/// (with `sslmode` mapped to one it knows), and the parameters. Errors name the
/// parameter.
pub(crate) fn split_tls(url: &str) -> Result<(String, TlsParams), String> {
    let mut params = TlsParams {
        mode: SslMode::Prefer,
        root_cert: None,
        cert: None,
        key: None,
        key_password: None,
    };
    let mut mode_given = false;
    let Some((base, query)) = url.split_once('?').filter(|_| url.contains("://")) else {
        return Ok((url.to_string(), params));
    };
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let value = crate::percent::decode_utf8(v)
            .ok_or_else(|| format!("database URL: `{k}` is not valid percent-encoding"))?;
        match k {
            "sslmode" => {
                mode_given = true;
                params.mode = match value.as_str() {
                    "disable" => SslMode::Disable,
                    "allow" | "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => {
                        return Err(format!(
                            "database URL: sslmode `{other}` is not one of disable, allow, prefer, require, verify-ca, verify-full"
                        ))
                    }
                }
            }
            "sslrootcert" if value == "system" => params.root_cert = Some(RootCert::System),
            "sslrootcert" => params.root_cert = Some(RootCert::File(value.into())),
            "sslcert" => params.cert = Some(value.into()),
            "sslkey" => params.key = Some(value.into()),
            "sslpassword" => params.key_password = Some(value),
            _ => kept.push(pair),
        }
    }
    // libpq 16: `sslrootcert=system` means verify-full, and refuses anything weaker
    // (the system store trusts every public CA: only the host name check protects).
    if params.root_cert == Some(RootCert::System) {
        if !mode_given {
            params.mode = SslMode::VerifyFull;
        } else if params.mode != SslMode::VerifyFull {
            return Err(
                "database URL: sslrootcert=system requires sslmode=verify-full (as in libpq)"
                    .into(),
            );
        }
    }
    kept.push(match params.mode {
        SslMode::Disable => "sslmode=disable",
        SslMode::Prefer => "sslmode=prefer",
        _ => "sslmode=require",
    });
    Ok((format!("{base}?{}", kept.join("&")), params))
}

/// The OpenSSL connector for `params`, with libpq's defaults under
/// `$HOME/.postgresql/`. Errors name the file and the parameter.
pub(crate) fn connector(params: &TlsParams) -> Result<MakeTlsConnector, String> {
    connector_in(
        params,
        std::env::var_os("HOME").map(PathBuf::from).as_deref(),
    )
}

fn connector_in(params: &TlsParams, home: Option<&Path>) -> Result<MakeTlsConnector, String> {
    let default_file = |name: &str| {
        let p = home?.join(".postgresql").join(name);
        p.exists().then_some(p)
    };
    let mut b = SslConnector::builder(SslMethod::tls_client())
        .map_err(|e| format!("cannot set up TLS for PostgreSQL: {e}"))?;
    let root = params
        .root_cert
        .clone()
        .or_else(|| default_file("root.crt").map(RootCert::File));
    let verify = match params.mode {
        SslMode::Disable | SslMode::Prefer => false,
        SslMode::Require => root.is_some(),
        SslMode::VerifyCa | SslMode::VerifyFull => true,
    };
    if verify {
        match &root {
            Some(RootCert::System) => b.set_default_verify_paths(),
            // Only this file, as in libpq: the builder starts with the system
            // store, which would let any public CA's certificate through.
            Some(RootCert::File(p)) => X509StoreBuilder::new()
                .map(|store| b.set_cert_store(store.build()))
                .and_then(|()| b.set_ca_file(p)),
            None => {
                return Err(format!(
                    "database URL: sslmode={} needs a root certificate: set sslrootcert=<file> (or sslrootcert=system); ~/.postgresql/root.crt does not exist",
                    if params.mode == SslMode::VerifyFull { "verify-full" } else { "verify-ca" }
                ))
            }
        }
        .map_err(|e| format!("database URL: sslrootcert {}: {e}", describe(root.as_ref())))?;
        b.set_verify(SslVerifyMode::PEER);
    } else {
        b.set_verify(SslVerifyMode::NONE);
    }
    let cert = params
        .cert
        .clone()
        .or_else(|| default_file("postgresql.crt"));
    let key = params
        .key
        .clone()
        .or_else(|| default_file("postgresql.key"));
    if let Some(cert) = &cert {
        b.set_certificate_chain_file(cert)
            .map_err(|e| format!("database URL: sslcert {}: {e}", cert.display()))?;
        let key = key.as_ref().ok_or_else(|| {
            format!(
                "database URL: sslcert {} is set but sslkey is not",
                cert.display()
            )
        })?;
        // Never OpenSSL's terminal prompt: the passphrase is sslpassword or none.
        let pem = std::fs::read(key)
            .map_err(|e| format!("database URL: sslkey {}: {e}", key.display()))?;
        let pkey = match &params.key_password {
            Some(pw) => PKey::private_key_from_pem_passphrase(&pem, pw.as_bytes()),
            None => PKey::private_key_from_pem_callback(&pem, |_| Ok(0)),
        }
        .map_err(|e| {
            format!(
                "database URL: sslkey {}: {e} (an encrypted key needs sslpassword)",
                key.display()
            )
        })?;
        b.set_private_key(&pkey)
            .map_err(|e| format!("database URL: sslkey {}: {e}", key.display()))?;
    }
    let mut tls = MakeTlsConnector::new(b.build());
    let full = params.mode == SslMode::VerifyFull;
    tls.set_callback(move |config, _domain| {
        config.set_verify_hostname(full);
        Ok(())
    });
    Ok(tls)
}

fn describe(root: Option<&RootCert>) -> String {
    match root {
        Some(RootCert::File(p)) => p.display().to_string(),
        Some(RootCert::System) => "system".into(),
        None => "(none)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_libpq_tls_parameters_out_of_the_url() {
        let (url, p) = split_tls(
            "postgres://u:pw@db.example:5432/billing?application_name=tally&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&sslcert=/c.pem&sslkey=/k.pem",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:pw@db.example:5432/billing?application_name=tally&sslmode=require"
        );
        assert_eq!(p.mode, SslMode::VerifyFull);
        assert_eq!(p.root_cert, Some(RootCert::File("/etc/ca.pem".into())));
        assert_eq!(p.cert.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(p.key.as_deref(), Some(Path::new("/k.pem")));
    }

    #[test]
    fn modes_map_to_what_tokio_postgres_knows() {
        for (given, mode, passed) in [
            ("disable", SslMode::Disable, "sslmode=disable"),
            ("allow", SslMode::Prefer, "sslmode=prefer"),
            ("prefer", SslMode::Prefer, "sslmode=prefer"),
            ("require", SslMode::Require, "sslmode=require"),
            ("verify-ca", SslMode::VerifyCa, "sslmode=require"),
        ] {
            let (url, p) = split_tls(&format!("postgres://h/db?sslmode={given}")).unwrap();
            assert_eq!(p.mode, mode, "{given}");
            assert!(url.ends_with(passed), "{given}: {url}");
        }
        let (url, p) = split_tls("postgres://h/db").unwrap();
        assert_eq!((url.as_str(), p.mode), ("postgres://h/db", SslMode::Prefer));
        let (url, p) = split_tls("postgres://h/db?sslrootcert=system").unwrap();
        assert_eq!(
            (p.root_cert, p.mode),
            (Some(RootCert::System), SslMode::VerifyFull)
        );
        assert!(url.ends_with("sslmode=require"), "{url}");
        let e = split_tls("postgres://h/db?sslrootcert=system&sslmode=verify-ca").unwrap_err();
        assert!(e.contains("requires sslmode=verify-full"), "{e}");
        let (_, p) = split_tls("postgres://h/db?sslkey=/a+b.key&sslpassword=pw%2B1").unwrap();
        assert_eq!(p.key.as_deref(), Some(Path::new("/a+b.key")));
        assert_eq!(p.key_password.as_deref(), Some("pw+1"));
    }

    #[test]
    fn unknown_sslmode_is_named() {
        let e = split_tls("postgres://h/db?sslmode=verify").unwrap_err();
        assert!(e.contains("sslmode `verify`"), "{e}");
        let e = split_tls("postgres://h/db?sslrootcert=%zz").unwrap_err();
        assert!(e.contains("sslrootcert"), "{e}");
    }

    #[test]
    fn verify_without_a_root_certificate_is_a_config_error() {
        let (_, p) = split_tls("postgres://h/db?sslmode=verify-full").unwrap();
        let e = connector_in(&p, None).err().unwrap();
        assert!(
            e.contains("sslmode=verify-full needs a root certificate"),
            "{e}"
        );
        let (_, p) =
            split_tls("postgres://h/db?sslmode=verify-ca&sslrootcert=/no/such.pem").unwrap();
        let e = connector_in(&p, None).err().unwrap();
        assert!(e.contains("sslrootcert /no/such.pem"), "{e}");
    }
}
