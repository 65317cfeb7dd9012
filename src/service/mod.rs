//! The service endpoints of the long-running commands (`run`, `sink`,
//! `reprocess-late --follow`), served on `metrics.listen` (`http`):
//!
//! - `/metrics` — the Prometheus text the process last published;
//! - `/healthz` — 200 while the process loop is alive: it beat within
//!   `STALL_MS` (a loop stuck that long is restarted by a liveness probe);
//! - `/readyz` — 200 once the process can do its work (a worker has joined its
//!   group and restored every assigned partition; the sink has connected,
//!   migrated and taken its assignment), 503 with the reason before that and
//!   while a rebalance moves partitions;
//! - anything else — 404.
//!
//! `State` is shared between the process loop (which publishes, beats and sets
//! readiness) and the server thread (which only reads). `respond` is pure.

pub mod http;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

/// How long the loop may go without a beat before `/healthz` fails, ms. Longer
/// than anything the loop blocks on by design (a checkpoint barrier, a restore,
/// `max.poll.interval.ms`).
pub const STALL_MS: i64 = 120_000;

#[derive(Debug)]
pub struct State {
    metrics: Mutex<String>,
    /// `None` when ready, else why not.
    not_ready: Mutex<Option<String>>,
    beat_ms: AtomicI64,
}

/// An HTTP answer: status, content type, body.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

const TEXT: &str = "text/plain; charset=utf-8";
/// Prometheus text exposition format 0.0.4.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

impl State {
    /// Not ready ("starting"), beating now.
    pub fn new(now_ms: i64) -> Self {
        Self {
            metrics: Mutex::new(crate::metrics::exposition::build_info_only()),
            not_ready: Mutex::new(Some("starting".into())),
            beat_ms: AtomicI64::new(now_ms),
        }
    }

    pub fn set_metrics(&self, text: String) {
        if let Ok(mut m) = self.metrics.lock() {
            *m = text;
        }
    }

    pub fn beat(&self, now_ms: i64) {
        self.beat_ms.store(now_ms, Ordering::Relaxed);
    }

    pub fn set_ready(&self) {
        if let Ok(mut r) = self.not_ready.lock() {
            *r = None;
        }
    }

    pub fn set_not_ready(&self, why: impl Into<String>) {
        if let Ok(mut r) = self.not_ready.lock() {
            *r = Some(why.into());
        }
    }

    pub fn is_ready(&self) -> bool {
        self.not_ready.lock().map(|r| r.is_none()).unwrap_or(false)
    }

    /// The answer to `GET path` at `now_ms`.
    pub fn respond(&self, method: &str, path: &str, now_ms: i64) -> Reply {
        let reply = |status, content_type, body: String| Reply {
            status,
            content_type,
            body,
        };
        if method != "GET" && method != "HEAD" {
            return reply(405, TEXT, "only GET\n".into());
        }
        match path {
            "/metrics" => reply(
                200,
                PROMETHEUS,
                self.metrics.lock().map(|m| m.clone()).unwrap_or_default(),
            ),
            "/healthz" => {
                let since = now_ms - self.beat_ms.load(Ordering::Relaxed);
                if since <= STALL_MS {
                    reply(200, TEXT, "ok\n".into())
                } else {
                    reply(
                        503,
                        TEXT,
                        format!(
                            "stalled: the process loop has not run for {} s\n",
                            since / 1000
                        ),
                    )
                }
            }
            "/readyz" => match self.not_ready.lock().map(|r| r.clone()) {
                Ok(None) => reply(200, TEXT, "ready\n".into()),
                Ok(Some(why)) => reply(503, TEXT, format!("not ready: {why}\n")),
                Err(_) => reply(503, TEXT, "not ready: state lock poisoned\n".into()),
            },
            _ => reply(404, TEXT, "not found: /metrics, /healthz, /readyz\n".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_health_and_readiness() {
        let s = State::new(1_000);
        assert_eq!(s.respond("GET", "/readyz", 1_000).status, 503);
        assert!(s.respond("GET", "/readyz", 1_000).body.contains("starting"));
        s.set_ready();
        assert_eq!(s.respond("GET", "/readyz", 1_000).status, 200);
        s.set_not_ready("rebalancing");
        assert_eq!(
            s.respond("GET", "/readyz", 1_000).body,
            "not ready: rebalancing\n"
        );
        assert_eq!(s.respond("GET", "/healthz", 1_000 + STALL_MS).status, 200);
        assert_eq!(s.respond("GET", "/healthz", 2_000 + STALL_MS).status, 503);
        s.beat(5_000 + STALL_MS);
        assert_eq!(s.respond("GET", "/healthz", 5_000 + STALL_MS).status, 200);
        assert_eq!(s.respond("GET", "/nope", 0).status, 404);
        assert_eq!(s.respond("POST", "/metrics", 0).status, 405);
        let m = s.respond("GET", "/metrics", 0);
        assert_eq!((m.status, m.content_type), (200, PROMETHEUS));
        assert!(m.body.contains("tally_build_info"));
        s.set_metrics("x 1\n".into());
        assert_eq!(s.respond("GET", "/metrics", 0).body, "x 1\n");
    }
}
