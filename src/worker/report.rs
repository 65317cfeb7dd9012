//! Publishing the worker's report: `<state.dir>/report.json` (read by `tally
//! delays`), the service endpoints (`crate::service`: /metrics, /healthz,
//! /readyz on `metrics.listen`), and a log line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use crate::metrics::WorkerReport;
use crate::service::State;

pub(crate) struct Publisher {
    json_path: PathBuf,
    service: Arc<State>,
}

pub const REPORT_FILE: &str = "report.json";

impl Publisher {
    pub(crate) fn new(state_dir: &Path, listen: Option<&str>) -> std::io::Result<Self> {
        let service = Arc::new(State::new(crate::base::clock::now_ms()));
        if let Some(addr) = listen {
            crate::service::http::serve(addr, service.clone())?;
        }
        Ok(Self {
            json_path: state_dir.join(REPORT_FILE),
            service,
        })
    }

    /// Health and readiness of this worker (the loop beats, the rebalance
    /// callbacks set readiness).
    pub(crate) fn service(&self) -> &State {
        &self.service
    }

    /// The service endpoints' state, for a hook that outlives a borrow
    /// (`worker::lag::Hook`).
    pub(crate) fn service_handle(&self) -> Arc<State> {
        self.service.clone()
    }

    /// Publishes and logs the time line (at checkpoints).
    pub(crate) fn publish(&self, report: &WorkerReport) {
        self.publish_quiet(report);
        if let Some((w, p)) = report.job_watermark() {
            info!(
                job_watermark = %crate::time::utc::format_utc_ms(w.0),
                held_by = p.0,
                lag_ms = report.at_ms - w.0,
                recommended_bound_ms = report.recommended_bound_ms().unwrap_or(0),
                "time"
            );
        }
    }

    /// Publishes without logging (between checkpoints).
    pub(crate) fn publish_quiet(&self, report: &WorkerReport) {
        self.service.set_metrics(report.render_prometheus());
        self.service.set_report(report.clone());
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
