//! librdkafka's log lines as tracing events (target `librdkafka`), with one
//! correction: librdkafka warns about every consumer property given to a
//! producer and the other way round. tally passes the `[kafka]` properties to
//! every client it creates, on purpose (one place to configure security), so
//! those warnings say nothing to act on and are logged at debug.

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;

/// Logs one librdkafka line (see the module header).
pub fn log(level: RDKafkaLogLevel, fac: &str, msg: &str) {
    let expected = fac == "CONFWARN" && msg.contains("will be ignored by this");
    match level {
        _ if expected => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {msg}"),
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {msg}")
        }
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {msg}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", "librdkafka: {fac} {msg}")
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {msg}"),
    }
}

/// The context of clients that need nothing but the log routing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Logged;

impl ClientContext for Logged {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, msg: &str) {
        log(level, fac, msg);
    }
}

impl ConsumerContext for Logged {}
