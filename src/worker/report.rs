//! Publishing the worker's report: `<state.dir>/report.json` (read by `tally
//! delays`), an optional Prometheus endpoint, and a log line.
//!
//! The HTTP endpoint is a minimal blocking server on its own thread: it answers
//! every request with the latest rendered text; it never touches worker state.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::metrics::WorkerReport;

pub struct Publisher {
    json_path: PathBuf,
    prometheus: Arc<Mutex<String>>,
}

pub const REPORT_FILE: &str = "report.json";

impl Publisher {
    pub fn new(state_dir: &Path, listen: Option<&str>) -> std::io::Result<Self> {
        let prometheus = Arc::new(Mutex::new(String::new()));
        if let Some(addr) = listen {
            let listener = TcpListener::bind(addr)?;
            info!(addr, "serving metrics at /metrics");
            let text = prometheus.clone();
            std::thread::Builder::new()
                .name("metrics-http".into())
                .spawn(move || serve(listener, text))?;
        }
        Ok(Self {
            json_path: state_dir.join(REPORT_FILE),
            prometheus,
        })
    }

    /// Publishes and logs the time line (at checkpoints).
    pub fn publish(&self, report: &WorkerReport) {
        self.publish_quiet(report);
        if let Some((w, p)) = report.job_watermark() {
            info!(
                job_watermark = %crate::config::duration::format_utc_ms(w.0),
                held_by = p.0,
                lag_ms = report.at_ms - w.0,
                recommended_bound_ms = report.recommended_bound_ms().unwrap_or(0),
                "time"
            );
        }
    }

    /// Publishes without logging (between checkpoints).
    pub fn publish_quiet(&self, report: &WorkerReport) {
        if let Ok(mut t) = self.prometheus.lock() {
            *t = report.render_prometheus();
        }
        let tmp = self.json_path.with_extension("json.tmp");
        let written = serde_json::to_vec(report)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|_| std::fs::rename(&tmp, &self.json_path));
        if let Err(e) = written {
            warn!(path = %self.json_path.display(), error = %e, "cannot write the worker report");
        }
    }
}

fn serve(listener: TcpListener, text: Arc<Mutex<String>>) {
    for stream in listener.incoming() {
        let Ok(mut s) = stream else { continue };
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let body = text.lock().map(|t| t.clone()).unwrap_or_default();
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

/// Reads the report a worker left in `state_dir`.
pub fn read(state_dir: &Path) -> Result<WorkerReport, String> {
    let path = state_dir.join(REPORT_FILE);
    let bytes = std::fs::read(&path).map_err(|e| {
        format!(
            "{}: {e} (has a worker run with this state.dir? it writes the report at every commit)",
            path.display()
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}
