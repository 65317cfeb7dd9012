//! The HTTP server of the service endpoints: hyper's HTTP/1 server on a
//! current-thread tokio runtime of its own thread, so it never runs on (or
//! waits for) the process loop.
//!
//! Each connection is its own task: a client that connects and sends nothing
//! holds only its own task, until `HEADER_TIMEOUT` closes it; a connection lives
//! at most `CONNECTION_TIMEOUT` (a slow reader cannot keep it longer) and
//! serves one request (no keep-alive).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tracing::{debug, info};

use super::State;

pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Binds `addr` and serves `state` on a thread of its own; returns the bound
/// address (port 0 picks a free one).
pub(crate) fn serve(addr: &str, state: Arc<State>) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("service-http".into())
        .spawn(move || runtime.block_on(accept_loop(listener, state)))?;
    info!(addr = %local, "serving /metrics, /healthz and /readyz");
    Ok(local)
}

async fn accept_loop(listener: std::net::TcpListener, state: Arc<State>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "service endpoints: cannot listen"),
    };
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                debug!(error = %e, "service endpoints: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let reply = state.respond(
                    req.method().as_str(),
                    req.uri().path(),
                    crate::base::clock::now_ms(),
                );
                async move {
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(reply.status)
                            .header("content-type", reply.content_type)
                            .body(Full::new(Bytes::from(reply.body)))
                            .expect("a valid status and header"),
                    )
                }
            });
            // One request per connection: the time limit never cuts a second
            // scrape short on a kept-alive connection.
            let conn = http1::Builder::new()
                .keep_alive(false)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                Ok(Err(e)) => debug!(%peer, error = %e, "service endpoints: connection error"),
                Err(_) => debug!(%peer, "service endpoints: connection closed at its time limit"),
                Ok(Ok(())) => {}
            }
        });
    }
}
