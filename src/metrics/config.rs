//! `[metrics]`: where the worker's endpoints listen
//! (docs/reference/configuration.md). The section is this module's; the config
//! tree (`config`) holds it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve `/metrics`, `/healthz` and `/readyz` at `http://<listen>/` (e.g.
    /// "127.0.0.1:9464"; `crate::service`);
    /// absent = off. A JSON report is always written to `<state.dir>/report.json`.
    pub listen: Option<String>,
}
