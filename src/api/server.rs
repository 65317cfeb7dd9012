//! The usage API's server: the listener (plain or TLS), one HTTP/1 connection
//! per task with bounded heads and header time, the reload on SIGHUP (keys and
//! certificates), and a stop that lets the requests in flight finish.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tracing::{debug, info, warn};

use super::{access, route, tls, Api, RequestLabels};
use crate::config::Config;

/// The most bytes of a request's head (request line and headers).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a stop waits for the requests in flight.
const DRAIN: Duration = Duration::from_secs(10);
/// Serves the API on `cfg.api.listen` until SIGTERM or SIGINT.
pub fn run(cfg: &Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve(cfg))
}

async fn serve(cfg: &Config) -> anyhow::Result<()> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(&cfg.api.listen)
        .await
        .with_context(|| format!("api.listen: cannot listen on {}", cfg.api.listen))?;
    let access = access::Access::from_config(&cfg.api)?;
    let tls = cfg
        .api
        .tls
        .as_ref()
        .map(tls::Tls::from_config)
        .transpose()?;
    let api = Arc::new(Api::new(&cfg.api, &cfg.sink.database_url, access, tls).with_explainer(cfg));
    if api.access.reloads() || api.tls.is_some() {
        crate::base::shutdown::install_reload();
        let api = api.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if crate::base::shutdown::take_reload() {
                    api.access.reload();
                    if let Some(t) = &api.tls {
                        t.reload();
                    }
                }
            }
        });
    }
    info!(addr = %listener.local_addr()?, "usage API: serving /v1/usage, /v1/invoices, /v1/explain, /healthz, /readyz, /metrics");
    match api.ready().await {
        Ok(()) => info!("usage API: the database is ready"),
        Err(why) => warn!(%why, "usage API: not ready yet (answering 503 until it is)"),
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    accept_loop(listener, api.clone(), stop).await;
    // No new connection is accepted; the requests in flight finish first.
    let n = api.limits.in_flight();
    info!(
        in_flight = n,
        "usage API: shutting down after the requests in flight (at most {DRAIN:?})"
    );
    if tokio::time::timeout(DRAIN, api.limits.drained())
        .await
        .is_err()
    {
        warn!(
            in_flight = api.limits.in_flight(),
            "usage API: requests still in flight after {DRAIN:?}; stopping anyway"
        );
    }
    Ok(())
}

/// Serves the API over `database_url` on a free loopback port, on a thread of
/// its own, for the life of the process (the demo); returns the address.
pub(crate) fn spawn_local(
    database_url: &str,
    access: access::Access,
) -> anyhow::Result<std::net::SocketAddr> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let defaults = crate::config::ApiConfig::default();
    let api = Arc::new(Api::new(&defaults, database_url, access, None));
    std::thread::Builder::new()
        .name("usage-api".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => accept_loop(l, api, std::future::pending()).await,
                    Err(e) => warn!(error = %e, "usage API: cannot listen"),
                }
            })
        })?;
    Ok(addr)
}

/// Serves connections until `stop` completes.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    api: Arc<Api>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    debug!(error = %e, "usage API: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => return,
        };
        let api = api.clone();
        tokio::spawn(async move {
            let Some(tls) = &api.tls else {
                return serve_connection(api, stream, peer).await;
            };
            match tls.accept(stream).await {
                Ok(s) => serve_connection(api.clone(), s, peer).await,
                Err(why) => info!(%peer, reason = %why, "usage API: TLS connection refused"),
            }
        });
    }
}

/// Serves HTTP/1 on one connection (plain or TLS) until it closes.
async fn serve_connection<S>(api: Arc<Api>, stream: S, peer: std::net::SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let api = api.clone();
        async move {
            let started = Instant::now();
            let (route, resp) = route(&api, req).await;
            let status = resp.status().as_u16();
            api.requests
                .get_or_create(&RequestLabels { route, status })
                .inc();
            debug!(
                route,
                status,
                ms = started.elapsed().as_millis() as u64,
                "usage API request"
            );
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(crate::service::http::HEADER_TIMEOUT)
        // A request line and headers of at most 16 KiB, 64 headers: more is refused
        // (431) before any of it is routed.
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(64)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = conn.await {
        debug!(%peer, error = %e, "usage API: connection error");
    }
}
