//! Kafka I/O: client settings, the dev broker, the input source and the producers.
//!
//! Only standard Kafka APIs are used (consumer groups, idempotent producer, offset
//! commit), so the same code runs against Apache Kafka, Redpanda, a managed Kafka
//! or the dev broker.

pub(crate) mod broker;
pub(crate) mod config;
pub mod headers;
pub(crate) mod logging;
pub mod outputs;
pub mod read;
pub(crate) mod source;
pub(crate) mod tls_listener;

use rdkafka::ClientConfig;

use config::KafkaConfig;

/// Kept for the worker's files while the partitions unit rewrites them (issue 35,
/// step 1); the clock lives in `base::clock`.
pub(crate) use crate::base::clock::now_ms;

#[derive(Debug, thiserror::Error)]
pub enum KafkaIoError {
    #[error("kafka: {context}: {source}")]
    Client {
        context: String,
        source: rdkafka::error::KafkaError,
    },
    #[error("kafka: {0}")]
    Fatal(String),
    /// The cluster did not answer within `kafka.connect_timeout`.
    #[error(
        "kafka: no answer from {bootstrap} within {waited_s} s (kafka.connect_timeout); last error: {last}"
    )]
    Unreachable {
        bootstrap: String,
        waited_s: u64,
        last: String,
    },
}

impl crate::base::error::Classify for KafkaIoError {
    fn class(&self) -> crate::base::error::ErrorClass {
        match self {
            KafkaIoError::Client { source, .. } => client_class(source),
            KafkaIoError::Fatal(_) | KafkaIoError::Unreachable { .. } => {
                crate::base::error::ErrorClass::Unavailable
            }
        }
    }
}

/// The class of one of librdkafka's errors: a refused property is a
/// configuration error, anything else the cluster failing.
pub(crate) fn client_class(e: &rdkafka::error::KafkaError) -> crate::base::error::ErrorClass {
    use crate::base::error::ErrorClass;
    use rdkafka::error::KafkaError;
    match e {
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => ErrorClass::Config,
        _ => ErrorClass::Unavailable,
    }
}

impl KafkaIoError {
    pub(crate) fn client(
        context: impl Into<String>,
    ) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaIoError {
        let context = context.into();
        move |source| KafkaIoError::Client { context, source }
    }
}

/// A client config with our defaults, then the user's librdkafka properties on top.
pub fn client_config(k: &KafkaConfig, defaults: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &k.bootstrap_servers);
    for (key, v) in defaults {
        c.set(*key, *v);
    }
    for (key, v) in &k.properties {
        c.set(key, v);
    }
    c
}

/// Producer defaults: idempotent, acks=all, lz4 (the dev broker keeps only 5 MiB per
/// partition, so compression matters there too).
pub const PRODUCER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("compression.type", "lz4"),
    ("linger.ms", "5"),
    ("message.timeout.ms", "30000"),
    ("queue.buffering.max.messages", "500000"),
    // The local queue's bytes are part of a worker's fixed memory overhead
    // (docs/operations/memory.md); librdkafka's default is 1 GiB. A full queue
    // makes `send` wait for delivery reports, never drop a record.
    ("queue.buffering.max.kbytes", "32768"),
];

/// Consumer defaults (the user's `[kafka]` properties go on top), besides the
/// properties tally owns (`OWNED_CONSUMER_PROPERTIES`).
pub(crate) const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    ("session.timeout.ms", "6000"),
    ("heartbeat.interval.ms", "1000"),
    ("enable.partition.eof", "false"),
    // librdkafka pauses a partition's fetching for this long whenever its local
    // queue is over the prefetch thresholds; the default (1 s) left a worker that
    // drains a backlog idle most of the time (4x slower on a preloaded topic).
    ("fetch.queue.backoff.ms", "50"),
    // Prefetched records are part of a worker's fixed memory overhead
    // (docs/operations/memory.md); librdkafka's default is 64 MiB.
    ("queued.max.messages.kbytes", "16384"),
    // Eager rebalancing is the default: against the dev broker, cooperative-sticky
    // needs two rebalance rounds per membership change and recovered slower in the
    // chaos run. Both work (the revoke callback handles incremental revokes); set
    // "partition.assignment.strategy" = "cooperative-sticky" under [kafka] to choose it.
    // A worker that does not poll for this long is stuck; it also bounds how long a
    // rebalance waits for a member that died mid-join.
    ("max.poll.interval.ms", "60000"),
];

/// A librdkafka property of the input consumer that tally sets itself, because a
/// guarantee rests on it: the config refuses it under `[kafka]`, and `tally
/// config` prints it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owned {
    pub key: &'static str,
    pub value: &'static str,
    /// Why tally owns it (the refusal says this).
    pub why: &'static str,
}

const OFFSETS_OWNED: &str = "offsets are committed only with checkpoints, and a position outside \
     the log is refused or, with `--allow-truncated-log`, accounted for — never reset silently";

/// Offsets are committed by tally only after a state commit. Every start offset is
/// decided by tally at assignment (checkpoint, or log start), so
/// `auto.offset.reset` only ever acts when a position falls out of the log —
/// records deleted before tally read them; `error` makes that a consumer error
/// tally refuses or accounts for (`checkpoint::ledger`), never a silent jump.
/// `read_committed`: records of aborted transactions are never handed over (never
/// billed), a bounded run's log end is the last stable offset, and transaction
/// markers are empty offsets (docs/DESIGN.md §7.5).
pub(crate) const OWNED_CONSUMER_PROPERTIES: &[Owned] = &[
    Owned {
        key: "enable.auto.commit",
        value: "false",
        why: OFFSETS_OWNED,
    },
    Owned {
        key: "enable.auto.offset.store",
        value: "false",
        why: OFFSETS_OWNED,
    },
    Owned {
        key: "auto.offset.reset",
        value: "error",
        why: OFFSETS_OWNED,
    },
    Owned {
        key: "isolation.level",
        value: "read_committed",
        why: "records of aborted transactions must never be billed, nor records of transactions \
              still open",
    },
];

/// Consumer defaults that only the classic group protocol accepts; under
/// `group.protocol = "consumer"` (KIP-848) the broker owns them.
const CLASSIC_ONLY: &[&str] = &["session.timeout.ms", "heartbeat.interval.ms"];

/// The input consumer's config: `CONSUMER_DEFAULTS` (minus the classic-only ones
/// when the user chose the KIP-848 protocol), the user's properties, the
/// properties tally owns, the group id.
pub fn consumer_config(k: &KafkaConfig) -> ClientConfig {
    let kip848 = k
        .properties
        .get("group.protocol")
        .is_some_and(|p| p.eq_ignore_ascii_case("consumer"));
    let defaults: Vec<(&str, &str)> = CONSUMER_DEFAULTS
        .iter()
        .copied()
        .filter(|(key, _)| !(kip848 && CLASSIC_ONLY.contains(key)))
        .collect();
    let mut c = client_config(k, &defaults);
    for owned in OWNED_CONSUMER_PROPERTIES {
        c.set(owned.key, owned.value);
    }
    c.set("group.id", &k.group_id);
    c
}

/// The number of partitions of `topic` from the broker's metadata (0 if the topic
/// does not exist).
pub(crate) fn partition_count<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
) -> Result<usize, KafkaIoError> {
    use rdkafka::consumer::Consumer;
    let md = consumer
        .fetch_metadata(Some(topic), std::time::Duration::from_secs(10))
        .map_err(KafkaIoError::client(format!("metadata of {topic}")))?;
    Ok(md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len()))
}

/// The log start and end of `topic`/`partition` (librdkafka's
/// `fetch_watermarks`), through a leader change: while the partition moves
/// between brokers the old leader answers `NOT_LEADER_FOR_PARTITION` (or there
/// is no leader yet), librdkafka refreshes its metadata, and the question is
/// asked again, 100 ms apart, for at most `timeout`. Any other error is the
/// caller's at once.
pub fn watermarks<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
    partition: i32,
    timeout: std::time::Duration,
) -> rdkafka::error::KafkaResult<(i64, i64)> {
    use rdkafka::consumer::Consumer;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as Code};
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match consumer.fetch_watermarks(topic, partition, left) {
            Err(KafkaError::MetadataFetch(
                Code::NotLeaderForPartition | Code::LeaderNotAvailable,
            )) if left > std::time::Duration::from_millis(100) => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            done => return done,
        }
    }
}

/// Waits until the cluster answers a metadata request for `topic`, for at most
/// `k.connect_timeout`; then fails with the last error librdkafka reported (a
/// TLS or SASL failure names itself there). Stops early on shutdown. Call it
/// before the consumer subscribes or is assigned (it polls the consumer's events).
pub(crate) fn await_cluster<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    k: &KafkaConfig,
    topic: &str,
) -> Result<(), KafkaIoError> {
    use rdkafka::consumer::Consumer;
    use std::time::{Duration, Instant};
    let timeout = Duration::from_millis(k.connect_timeout.0.max(0) as u64);
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = left
            .min(Duration::from_secs(2))
            .max(Duration::from_millis(100));
        let err = match consumer.fetch_metadata(Some(topic), attempt) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        // Serve the client's queued events: its log lines (`FAIL`) carry why a
        // connection failed (a TLS handshake, SASL), and a consumer nobody polls
        // yet (the sink's, before its assignment) would keep them queued, leaving
        // only "BrokerTransportFailure". Not subscribed or assigned yet, a poll
        // returns no message; its errors are that summary without the reason.
        while consumer.poll(Duration::ZERO).is_some() {}
        if Instant::now() >= deadline || crate::base::shutdown::requested() {
            let mut last = logging::last_error().unwrap_or_else(|| err.to_string());
            if last.contains("state APIVERSION_QUERY") && !last.contains("SSL routines") {
                last.push_str(
                    " (the broker closed the connection at the first request: does its listener \
                     expect TLS or SASL? see security.protocol)",
                );
            }
            return Err(KafkaIoError::Unreachable {
                bootstrap: k.bootstrap_servers.clone(),
                waited_s: timeout.as_secs(),
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a consumer error is about reaching the brokers (librdkafka retries
/// those itself), not about the data.
pub(crate) fn is_broker_transient(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::Resolve
                | C::OperationTimedOut
                | C::RequestTimedOut
                | C::NetworkException
                | C::NotCoordinator
                | C::CoordinatorNotAvailable
                | C::CoordinatorLoadInProgress
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
        )
    )
}

#[cfg(test)]
mod tests {
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::producer::BaseProducer;

    use super::*;
    use crate::config::Config;

    /// Every `toml` block of docs/operations/security.md is a `[kafka]` section that
    /// loads and that librdkafka accepts as a consumer and a producer: each property
    /// is known and each mechanism (TLS, SCRAM, OAUTHBEARER/OIDC) is compiled in.
    /// librdkafka reads certificate files when the client is created, so the
    /// examples' paths are pointed at generated ones.
    #[test]
    fn docs_security_examples_are_accepted_by_librdkafka() {
        let dir = std::env::temp_dir().join(format!("tally-docs-tls-{}", std::process::id()));
        crate::devtools::certs::generate(&dir, None).unwrap();
        let doc = include_str!("../../docs/operations/security.md");
        let blocks: Vec<&str> = doc
            .split("```toml\n")
            .skip(1)
            .map(|b| b.split("```").next().unwrap())
            .collect();
        assert!(blocks.len() >= 5, "examples missing");
        let mut mechanisms = Vec::new();
        for block in blocks {
            let mut cfg = Config::from_toml_with_env(block, std::iter::empty())
                .unwrap_or_else(|e| panic!("{e}\n{block}"));
            for (key, file) in [
                ("ssl.ca.location", "ca.pem"),
                ("ssl.certificate.location", "client.pem"),
                ("ssl.key.location", "client.key"),
            ] {
                if let Some(v) = cfg.kafka.properties.get_mut(key) {
                    *v = dir.join(file).display().to_string();
                }
            }
            let _: BaseConsumer = consumer_config(&cfg.kafka)
                .create()
                .unwrap_or_else(|e| panic!("consumer: {e}\n{block}"));
            let _: BaseProducer = client_config(&cfg.kafka, PRODUCER_DEFAULTS)
                .create()
                .unwrap_or_else(|e| panic!("producer: {e}\n{block}"));
            mechanisms.extend(cfg.kafka.properties.get("sasl.mechanism").cloned());
        }
        let _ = std::fs::remove_dir_all(&dir);
        for m in ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"] {
            assert!(mechanisms.iter().any(|x| x == m), "no {m} example");
        }
    }

    /// A producer with these librdkafka properties can be created.
    fn accepted(properties: &[(&str, &str)]) -> Result<(), rdkafka::error::KafkaError> {
        let mut k = KafkaConfig::default();
        for (key, v) in properties {
            k.properties.insert(key.to_string(), v.to_string());
        }
        client_config(&k, &[]).create::<BaseProducer>().map(drop)
    }

    /// Only with `--features gssapi` (libsasl2): Kerberos is accepted.
    #[cfg(feature = "gssapi")]
    #[test]
    fn gssapi_is_compiled_in_with_the_feature() {
        accepted(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "GSSAPI"),
            ("sasl.kerberos.service.name", "kafka"),
            ("sasl.kerberos.kinit.cmd", "true"),
        ])
        .expect("GSSAPI");
    }

    #[test]
    fn scram_256_and_zstd_are_compiled_in() {
        accepted(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
            ("compression.type", "zstd"),
        ])
        .expect("SCRAM-SHA-256 + zstd");
    }
}
