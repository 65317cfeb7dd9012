//! HTTPS for the usage API (`[api.tls]`): the acceptor from its PEM files,
//! replaced on SIGHUP so certificates can rotate without a restart.
//!
//! Invariants: a reload that fails keeps the acceptor in use (logged); a
//! connection that fails its handshake (plain HTTP, an untrusted or missing
//! client certificate, a timeout) is closed and logged with its reason, before
//! a byte of HTTP is read from it.

use std::sync::{Arc, RwLock};

use openssl::ssl::SslAcceptor;
use tracing::{error, info};

use crate::base::tls::{self, Keys, TlsFiles};
use crate::config::{ApiTlsConfig, ConfigError};

const KEYS: Keys = Keys {
    cert: "api.tls.cert",
    key: "api.tls.key",
    client_ca: "api.tls.client_ca",
};

pub(crate) struct Tls {
    files: TlsFiles,
    acceptor: RwLock<Arc<SslAcceptor>>,
}

impl Tls {
    pub(crate) fn from_config(cfg: &ApiTlsConfig) -> Result<Tls, ConfigError> {
        let files = TlsFiles {
            cert: cfg.cert.clone(),
            key: cfg.key.clone(),
            client_ca: cfg.client_ca.clone(),
        };
        let acceptor = tls::acceptor(&files, &KEYS).map_err(|msg| ConfigError::Invalid {
            key: "api.tls".into(),
            msg,
        })?;
        info!(
            client_certificates = files.client_ca.is_some(),
            "usage API: TLS on (api.tls): HTTPS only"
        );
        Ok(Tls {
            files,
            acceptor: RwLock::new(Arc::new(acceptor)),
        })
    }

    /// Reads the certificate, key and CA files again; on an error the acceptor
    /// in use stays.
    pub(crate) fn reload(&self) {
        match tls::acceptor(&self.files, &KEYS) {
            Ok(a) => {
                if let Ok(mut slot) = self.acceptor.write() {
                    *slot = Arc::new(a);
                }
                info!("usage API: TLS certificate reloaded (SIGHUP)");
            }
            Err(e) => {
                error!(error = %e, "usage API: SIGHUP: the TLS files could not be reloaded; the certificate in use stays")
            }
        }
    }

    /// The handshake of one connection, under the acceptor of now.
    pub(crate) async fn accept(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> Result<tokio_openssl::SslStream<tokio::net::TcpStream>, String> {
        let acceptor = self
            .acceptor
            .read()
            .map(|a| a.clone())
            .map_err(|_| "the TLS acceptor's lock is poisoned".to_string())?;
        tls::handshake(&acceptor, tcp).await
    }
}
