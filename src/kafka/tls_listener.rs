//! The dev broker's TLS mode (`tally dev-broker --tls-cert … --tls-key …`): a
//! TLS-terminating listener in front of the mock cluster's plaintext one, and the
//! mock's advertised listener moved to it, so that every connection a client
//! makes — bootstrap and the broker address in Metadata — is TLS.
//!
//! With `--tls-client-ca`, a client must present a certificate that CA signed
//! (mTLS). A handshake that fails is logged with its reason and the connection
//! closed; nothing reaches the mock unencrypted from outside.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod, SslVerifyMode};
use tracing::{debug, info};

/// The files of the TLS listener (PEM).
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA.
    pub client_ca: Option<PathBuf>,
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn acceptor(files: &TlsFiles) -> Result<SslAcceptor, String> {
    let named = |what: &str, path: &PathBuf| {
        let path = path.display().to_string();
        let what = what.to_string();
        move |e: openssl::error::ErrorStack| format!("{what} {path}: {e}")
    };
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
        .map_err(|e| format!("TLS: {e}"))?;
    b.set_certificate_chain_file(&files.cert)
        .map_err(named("--tls-cert", &files.cert))?;
    b.set_private_key_file(&files.key, SslFiletype::PEM)
        .map_err(named("--tls-key", &files.key))?;
    b.check_private_key()
        .map_err(named("--tls-key", &files.key))?;
    if let Some(ca) = &files.client_ca {
        b.set_ca_file(ca).map_err(named("--tls-client-ca", ca))?;
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    Ok(b.build())
}

/// Binds a TLS listener on `host`'s loopback port and relays its connections to
/// `backend` on a thread of its own. Returns the listener's port.
pub(crate) fn start(files: &TlsFiles, host: &str, backend: SocketAddr) -> Result<u16, String> {
    let acceptor = Arc::new(acceptor(files)?);
    let listener = std::net::TcpListener::bind((host, 0))
        .and_then(|l| l.set_nonblocking(true).map(|_| l))
        .map_err(|e| format!("binding the TLS listener on {host}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("TLS listener runtime: {e}"))?;
    std::thread::Builder::new()
        .name("dev-broker-tls".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!(error = %e, "TLS listener"),
                };
                loop {
                    let Ok((tcp, peer)) = listener.accept().await else {
                        // Out of file descriptors, say: do not spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        match relay(tcp, backend, &acceptor).await {
                            Err(e) => info!(%peer, reason = %e, "TLS connection refused"),
                            Ok(()) => debug!(%peer, "TLS connection closed"),
                        }
                    });
                }
            })
        })
        .map_err(|e| format!("TLS listener thread: {e}"))?;
    Ok(port)
}

async fn relay(
    tcp: tokio::net::TcpStream,
    backend: SocketAddr,
    acceptor: &SslAcceptor,
) -> Result<(), String> {
    let ssl = Ssl::new(acceptor.context()).map_err(|e| e.to_string())?;
    let mut tls = tokio_openssl::SslStream::new(ssl, tcp).map_err(|e| e.to_string())?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, Pin::new(&mut tls).accept()).await {
        Err(_) => return Err("TLS handshake timed out".into()),
        Ok(Err(e)) => return Err(format!("TLS handshake failed: {e}")),
        Ok(Ok(())) => {}
    }
    let mut up = tokio::net::TcpStream::connect(backend)
        .await
        .map_err(|e| format!("connecting to the mock broker {backend}: {e}"))?;
    // A client closing its side ends the relay; errors after the handshake are
    // ordinary disconnects.
    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
    Ok(())
}
