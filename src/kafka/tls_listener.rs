//! The dev broker's TLS mode (`tally dev-broker --tls-cert … --tls-key …`): a
//! TLS-terminating listener in front of the mock cluster's plaintext one, and the
//! mock's advertised listener moved to it, so that every connection a client
//! makes — bootstrap and the broker address in Metadata — is TLS.
//!
//! With `--tls-client-ca`, a client must present a certificate that CA signed
//! (mTLS). A handshake that fails is logged with its reason and the connection
//! closed; nothing reaches the mock unencrypted from outside.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openssl::ssl::SslAcceptor;
use tracing::{debug, info};

pub(crate) use crate::base::tls::TlsFiles;
use crate::base::tls::{self, Keys};

const FLAGS: Keys = Keys {
    cert: "--tls-cert",
    key: "--tls-key",
    client_ca: "--tls-client-ca",
};

/// Binds a TLS listener on `host`'s loopback port and relays its connections to
/// `backend` on a thread of its own. Returns the listener's port.
pub(crate) fn start(files: &TlsFiles, host: &str, backend: SocketAddr) -> Result<u16, String> {
    let acceptor = Arc::new(tls::acceptor(files, &FLAGS)?);
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
    let mut tls = tls::handshake(acceptor, tcp).await?;
    let mut up = tokio::net::TcpStream::connect(backend)
        .await
        .map_err(|e| format!("connecting to the mock broker {backend}: {e}"))?;
    // A client closing its side ends the relay; errors after the handshake are
    // ordinary disconnects.
    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
    Ok(())
}
