//! The service endpoints of the long-running commands (`run`, `sink`,
//! `reprocess-late --follow`), served on `metrics.listen` (`http`):
//!
//! - `/metrics` — the Prometheus text the process last published, followed by
//!   the families computed when scraped (`LiveFamilies`: the worker's consumer
//!   lag, `worker::lag`), so those are true while the process loop is busy;
//! - `/healthz` — 200 while the process loop is alive: it beat within
//!   `STALL_MS` (a loop stuck that long is restarted by a liveness probe);
//! - `/readyz` — 200 once the process can do its work (a worker has joined its
//!   group and restored every assigned partition; the sink has connected,
//!   migrated and taken its assignment), 503 with the reason before that and
//!   while a rebalance moves partitions;
//! - `/status` — the status page for the people on call (`status_page`: HTML,
//!   no script, no external asset), and `/status.json`, its figures (what
//!   `tally explain --finality` reads): the worker's last report, the consumer
//!   lag computed when asked (`LiveLags`), readiness, and the last warning and
//!   error logged (`logged`, masked);
//! - anything else — 404.
//!
//! `State` is shared between the process loop (which publishes, beats, sets
//! readiness and installs the live families) and the server thread (which only
//! reads, and runs the live families). `respond` is pure but for those. This
//! module knows no Kafka type: a live family is a closure that renders text.

pub(crate) mod http;
pub(crate) mod logged;
pub mod status_api;
pub mod status_page;
pub mod stored_progress;

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use crate::metrics::WorkerReport;
use crate::model::Partition;
use status_page::{PartitionLag, StatusView};

/// How long the loop may go without a beat before `/healthz` fails, ms. Longer
/// than anything the loop blocks on by design (a checkpoint barrier, a restore,
/// `max.poll.interval.ms`).
pub(crate) const STALL_MS: i64 = 120_000;

/// Renders metric families when `/metrics` is scraped (Prometheus text, whole
/// families: `# HELP`, `# TYPE` and samples), on the server thread. It must not
/// wait for the process loop.
pub(crate) type LiveFamilies = Box<dyn Fn() -> String + Send + Sync>;

/// Each owned partition's consumer lag, computed when `/status` is asked for
/// (`worker::lag`), on the server thread; like `LiveFamilies`, it must not
/// wait for the process loop.
pub(crate) type LiveLags = Box<dyn Fn() -> Vec<(Partition, i64)> + Send + Sync>;

/// The installed `LiveFamilies`, if any.
#[derive(Default)]
struct Live(Option<LiveFamilies>);

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Live(set)"
        } else {
            "Live(none)"
        })
    }
}

/// The installed `LiveLags`, if any.
struct Lags(Option<LiveLags>);

impl fmt::Debug for Lags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Lags(set)"
        } else {
            "Lags(none)"
        })
    }
}

#[derive(Debug)]
pub struct State {
    metrics: Mutex<String>,
    /// Held while the families render: `set_live_metrics` returns only once no
    /// scrape runs the old closure.
    live: Mutex<Live>,
    /// The worker's last published report, for `/status`.
    report: Mutex<Option<WorkerReport>>,
    lags: Mutex<Lags>,
    /// `None` when ready, else why not.
    not_ready: Mutex<Option<String>>,
    beat_ms: AtomicI64,
}

/// An HTTP answer: status, content type, body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

const TEXT: &str = "text/plain; charset=utf-8";
pub(crate) const HTML: &str = "text/html; charset=utf-8";
pub(crate) const JSON: &str = "application/json";
/// Prometheus text exposition format 0.0.4.
pub(crate) const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

impl State {
    /// Not ready ("starting"), beating now.
    pub fn new(now_ms: i64) -> Self {
        Self {
            metrics: Mutex::new(crate::metrics::exposition::build_info_only()),
            live: Mutex::new(Live::default()),
            report: Mutex::new(None),
            lags: Mutex::new(Lags(None)),
            not_ready: Mutex::new(Some("starting".into())),
            beat_ms: AtomicI64::new(now_ms),
        }
    }

    pub(crate) fn set_metrics(&self, text: String) {
        if let Ok(mut m) = self.metrics.lock() {
            *m = text;
        }
    }

    /// Installs (`Some`) or removes (`None`) the families rendered at each
    /// scrape; returns once no scrape runs the ones it replaced.
    pub(crate) fn set_live_metrics(&self, families: Option<LiveFamilies>) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.0 = families;
    }

    /// The published text, then the live families.
    fn metrics_text(&self) -> String {
        let mut text = self.metrics.lock().map(|m| m.clone()).unwrap_or_default();
        if let Ok(live) = self.live.lock() {
            if let Some(render) = &live.0 {
                text.push_str(&render());
            }
        }
        text
    }

    /// The worker's report, shown by `/status` until the next.
    pub(crate) fn set_report(&self, report: WorkerReport) {
        if let Ok(mut r) = self.report.lock() {
            *r = Some(report);
        }
    }

    /// Installs (`Some`) or removes (`None`) the consumer lag of `/status`.
    pub(crate) fn set_live_lags(&self, lags: Option<LiveLags>) {
        let mut l = self.lags.lock().unwrap_or_else(|e| e.into_inner());
        l.0 = lags;
    }

    /// What `/status` shows at `now_ms`.
    pub(crate) fn status(&self, now_ms: i64) -> StatusView {
        let lags = match self.lags.lock() {
            Ok(l) => l.0.as_ref().map(|f| f()).unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        StatusView {
            at_ms: now_ms,
            not_ready: self
                .not_ready
                .lock()
                .map(|r| r.clone())
                .unwrap_or_else(|_| Some("state lock poisoned".into())),
            report: self.report.lock().ok().and_then(|r| r.clone()),
            lags: lags
                .into_iter()
                .map(|(partition, records)| PartitionLag { partition, records })
                .collect(),
            last_warning: logged::last_warning(),
            last_error: logged::last_error(),
        }
    }

    pub(crate) fn beat(&self, now_ms: i64) {
        self.beat_ms.store(now_ms, Ordering::Relaxed);
    }

    pub(crate) fn set_ready(&self) {
        if let Ok(mut r) = self.not_ready.lock() {
            *r = None;
        }
    }

    pub(crate) fn set_not_ready(&self, why: impl Into<String>) {
        if let Ok(mut r) = self.not_ready.lock() {
            *r = Some(why.into());
        }
    }

    /// The answer to `GET path` at `now_ms`.
    pub(crate) fn respond(&self, method: &str, path: &str, now_ms: i64) -> Reply {
        let reply = |status, content_type, body: String| Reply {
            status,
            content_type,
            body,
        };
        if method != "GET" && method != "HEAD" {
            return reply(405, TEXT, "only GET\n".into());
        }
        match path {
            "/metrics" => reply(200, PROMETHEUS, self.metrics_text()),
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
            "/status" => reply(200, HTML, status_page::render(&self.status(now_ms))),
            "/status.json" => reply(
                200,
                JSON,
                serde_json::to_string(&self.status(now_ms)).unwrap_or_default(),
            ),
            _ => reply(
                404,
                TEXT,
                "not found: /metrics, /healthz, /readyz, /status, /status.json\n".into(),
            ),
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

    #[test]
    fn status_shows_the_published_report_and_the_lag_computed_when_asked() {
        use std::sync::atomic::AtomicI64;
        use std::sync::Arc;
        let s = State::new(0);
        let page = s.respond("GET", "/status", 0);
        assert_eq!((page.status, page.content_type), (200, HTML));
        assert!(page.body.contains("id=\"no-report\""), "{}", page.body);
        let mut p = crate::metrics::tests::part(0, Some(5_000), 0, &[]);
        p.final_through = Some(0);
        let report = WorkerReport {
            at_ms: 9_000,
            topic: "requests".into(),
            group: "g".into(),
            bound_ms: 5_000,
            allowed_lateness_ms: 30_000,
            window_size_ms: 60_000,
            window_offset_ms: 0,
            checkpoint_interval_ms: 1_000,
            checkpoint: Default::default(),
            idle_ms: None,
            partitions: vec![p],
            pane_ack_us: Default::default(),
        };
        s.set_report(report);
        let lag = Arc::new(AtomicI64::new(4));
        let l = lag.clone();
        s.set_live_lags(Some(Box::new(move || {
            vec![(Partition(0), l.load(Ordering::Relaxed))]
        })));
        let page = s.respond("GET", "/status", 10_000).body;
        assert!(
            page.contains("id=\"p0-watermark\" data-value=\"5000\""),
            "{page}"
        );
        assert!(
            page.contains("id=\"p0-consumer-lag\" data-value=\"4\""),
            "{page}"
        );
        lag.store(0, Ordering::Relaxed);
        let json = s.respond("GET", "/status.json", 10_000);
        assert_eq!(json.content_type, JSON);
        let v: StatusView = serde_json::from_str(&json.body).unwrap();
        assert_eq!(
            v.lags,
            vec![PartitionLag {
                partition: Partition(0),
                records: 0
            }]
        );
        assert_eq!(v.report.unwrap().partitions[0].final_through, Some(0));
        s.set_live_lags(None);
        assert!(s.status(0).lags.is_empty());
    }

    #[test]
    fn live_families_follow_the_published_text_at_each_scrape() {
        use std::sync::atomic::AtomicU64;
        use std::sync::Arc;
        let s = State::new(0);
        s.set_metrics("x 1\n".into());
        let n = Arc::new(AtomicU64::new(7));
        let m = n.clone();
        s.set_live_metrics(Some(Box::new(move || {
            format!("y {}\n", m.load(Ordering::Relaxed))
        })));
        assert_eq!(s.respond("GET", "/metrics", 0).body, "x 1\ny 7\n");
        // Computed when scraped, not when published.
        n.store(9, Ordering::Relaxed);
        assert_eq!(s.respond("GET", "/metrics", 0).body, "x 1\ny 9\n");
        s.set_live_metrics(None);
        assert_eq!(s.respond("GET", "/metrics", 0).body, "x 1\n");
    }
}
