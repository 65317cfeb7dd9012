//! `[window]`, `[watermark]`, `[dedup]` and `[limits]`: the engine's sections of
//! the config file (docs/reference/configuration.md). The engine owns them and
//! checks them; the config tree (`config`) holds them and builds an
//! `EngineConfig` from them.

use serde::{Deserialize, Serialize};

use super::TimeSource;
use crate::base::duration::{self, MaxLead, Millis, OptMillis};
use crate::base::InvalidKey;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WindowConfig {
    /// Tumbling window size.
    pub size: Millis,
    /// Shift of window boundaries from the epoch (e.g. for days in a time zone).
    pub offset: Millis,
    /// How long after its on-time pane a window still accepts late events.
    pub allowed_lateness: Millis,
}

impl Default for WindowConfig {
    fn default() -> Self {
        Self {
            size: Millis(60_000),
            offset: Millis(0),
            allowed_lateness: Millis(30_000),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatermarkConfig {
    /// The bound of bounded out-of-orderness; "0" is the monotonous strategy.
    pub max_out_of_orderness: Millis,
    /// Silence after which a caught-up partition's watermark follows the wall
    /// clock and its latest records (the liveness rule; "off").
    pub idle_timeout: OptMillis,
    /// Events this far ahead of the wall clock are dead letters ("off" disables).
    pub max_future: OptMillis,
    /// completed_ts (default) | started_ts | kafka_timestamp | processing_time.
    pub time_source: TimeSource,
    /// Event times this far ahead of the partition move its watermark only once
    /// most of its recent records share the lead ("auto": the allowed lateness;
    /// "off": every record does).
    pub max_lead: MaxLead,
}

impl Default for WatermarkConfig {
    fn default() -> Self {
        Self {
            max_out_of_orderness: Millis(5_000),
            idle_timeout: OptMillis(Some(Millis(60_000))),
            max_future: OptMillis(Some(Millis(3_600_000))),
            time_source: TimeSource::CompletedTs,
            max_lead: MaxLead::Auto,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DedupConfig {
    /// How long request ids are remembered after their window is purged.
    pub extra_horizon: Millis,
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            extra_horizon: Millis(3_600_000),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Larger input records are dead letters.
    #[serde(deserialize_with = "duration::de_u64")]
    pub max_record_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_record_bytes: 1 << 20,
        }
    }
}

impl WindowConfig {
    /// The section's own checks; each error names the key.
    pub(crate) fn validate(&self) -> Result<(), InvalidKey> {
        if self.size.0 <= 0 {
            return Err(InvalidKey::new("window.size", "must be greater than 0"));
        }
        Ok(())
    }
}
