//! TLS server side, through the system OpenSSL that librdkafka and the
//! PostgreSQL connector already link: the acceptor from PEM files (optionally
//! requiring client certificates a CA signed), and the handshake of one
//! connection, bounded in time.
//!
//! Used by the dev broker's TLS listener (`kafka::tls_listener`) and the usage
//! API (`api.tls`). Errors name the file and the key (`Keys`) it came from.

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod, SslVerifyMode};

/// The files of a TLS listener (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA.
    pub client_ca: Option<PathBuf>,
}

/// How errors name the three files: `--tls-cert` or `api.tls.cert`, …
pub struct Keys {
    pub cert: &'static str,
    pub key: &'static str,
    pub client_ca: &'static str,
}

/// How long a client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The acceptor for `files` (Mozilla's intermediate profile: TLS 1.2 and 1.3).
pub fn acceptor(files: &TlsFiles, keys: &Keys) -> Result<SslAcceptor, String> {
    let named = |what: &str, path: &PathBuf| {
        let path = path.display().to_string();
        let what = what.to_string();
        move |e: openssl::error::ErrorStack| format!("{what} {path}: {e}")
    };
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
        .map_err(|e| format!("TLS: {e}"))?;
    b.set_certificate_chain_file(&files.cert)
        .map_err(named(keys.cert, &files.cert))?;
    b.set_private_key_file(&files.key, SslFiletype::PEM)
        .map_err(named(keys.key, &files.key))?;
    b.check_private_key().map_err(named(keys.key, &files.key))?;
    if let Some(ca) = &files.client_ca {
        b.set_ca_file(ca).map_err(named(keys.client_ca, ca))?;
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    Ok(b.build())
}

/// The server side of one connection's handshake, at most `HANDSHAKE_TIMEOUT`.
pub async fn handshake(
    acceptor: &SslAcceptor,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_openssl::SslStream<tokio::net::TcpStream>, String> {
    let ssl = Ssl::new(acceptor.context()).map_err(|e| e.to_string())?;
    let mut tls = tokio_openssl::SslStream::new(ssl, tcp).map_err(|e| e.to_string())?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, Pin::new(&mut tls).accept()).await {
        Err(_) => Err("TLS handshake timed out".into()),
        Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
        Ok(Ok(())) => Ok(tls),
    }
}
