//! librdkafka's log lines as tracing events (target `librdkafka`), with one
//! correction: librdkafka warns about every consumer property given to a
//! producer and the other way round. tally passes the `[kafka]` properties to
//! every client it creates, on purpose (one place to configure security), so
//! those warnings say nothing to act on and are logged at debug.
//!
//! The last error librdkafka reported (its error callback and its `FAIL` log
//! lines: a failed TLS handshake, an authentication failure, a broker that
//! refuses or drops the connection)
//! is kept, so that a command that gives up waiting for the cluster can say why
//! (`super::await_cluster`).

use std::sync::Mutex;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;

static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Logs an error librdkafka reported and keeps it as the last one — unless it
/// is only the summary "all brokers are down", which would hide the reason.
pub(crate) fn error(error: &KafkaError, reason: &str) {
    tracing::error!(target: "librdkafka", "librdkafka: {error}: {reason}");
    let summary =
        error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown);
    if summary && last_error().is_some() {
        return;
    }
    keep(&format!("{error}: {reason}"));
}

fn keep(reason: &str) {
    if let Ok(mut last) = LAST_ERROR.lock() {
        *last = Some(reason.to_string());
    }
}

/// The last error librdkafka reported in this process, if any.
pub(crate) fn last_error() -> Option<String> {
    LAST_ERROR.lock().ok().and_then(|l| l.clone())
}

/// Logs one librdkafka line (see the module header).
pub(crate) fn log(level: RDKafkaLogLevel, fac: &str, msg: &str) {
    // A broker connection that failed, with its reason (logged at info by librdkafka).
    if fac == "FAIL" {
        keep(msg);
    }
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
pub(crate) struct Logged;

impl ClientContext for Logged {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, msg: &str) {
        log(level, fac, msg);
    }
    fn error(&self, e: KafkaError, reason: &str) {
        error(&e, reason);
    }
}

impl ConsumerContext for Logged {}
