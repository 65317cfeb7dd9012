//! Header names on the late-events and dead-letter topics (docs/DESIGN.md §3). Stable:
//! reprocessing and operators' tooling read them.

/// `too_late`.
pub const REASON: &str = "tally.reason";
/// Window end (ms) the late event belonged to.
pub const WINDOW_END: &str = "tally.window_end";
/// The partition watermark when the event arrived (ms).
pub const WATERMARK: &str = "tally.watermark";
/// `topic/partition/offset` of the original record.
pub const SOURCE: &str = "tally.source";
/// The original record's Kafka timestamp (ms), when it had one: reprocessing
/// under `time_source = "kafka_timestamp"` uses it, not the late record's own.
pub const KAFKA_TIMESTAMP: &str = "tally.kafka_timestamp";
/// Dead-letter error code (`malformed_json`, `unknown_model`, …).
pub const ERROR: &str = "tally.error";
/// Human-readable dead-letter detail.
pub const ERROR_DETAIL: &str = "tally.error_detail";
