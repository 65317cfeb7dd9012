//! `tally dev-broker`: librdkafka's mock cluster hosted as a long-lived process.
//!
//! Why not a real broker: see docs/DESIGN.md §10. The mock speaks the Kafka protocol
//! (produce with idempotence, fetch, headers, consumer groups, offset commit,
//! ListOffsets earliest/latest) but not CreateTopics, so topics are created here,
//! through the mock API, before the bootstrap address is published. It keeps only
//! the newest 5 MiB of batches per partition.
//!
//! The cluster is owned by a client handle created with `test.mock.num.brokers`
//! (the documented way to get a mock cluster); the few mock calls rdkafka's safe
//! wrapper lacks (group timings) go through the C API here.
//!
//! Both group protocols work: classic (eager or cooperative-sticky) and KIP-848
//! (`group.protocol=consumer`), which the mock also implements with static
//! membership — a static member that leaves keeps its partitions for the group
//! session timeout and gets them back when it rejoins under the same
//! `group.instance.id`.

#![allow(unsafe_code)] // FFI: librdkafka's mock-cluster C API.

use std::ffi::{CStr, CString};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;

use super::tls_listener::{self, TlsFiles};
use super::KafkaIoError;

/// A running mock cluster; it serves until dropped.
pub(crate) struct DevBroker {
    handle: BaseProducer,
    bootstrap: String,
    /// Broker ids are 1 to `brokers`.
    brokers: i32,
}

impl DevBroker {
    pub(crate) fn bootstrap_servers(&self) -> String {
        self.bootstrap.clone()
    }

    fn mock(&self) -> *mut rd::rd_kafka_mock_cluster_t {
        // SAFETY: the handle was created with test.mock.num.brokers and lives as long as self.
        unsafe { rd::rd_kafka_handle_mock_cluster(self.handle.client().native_ptr()) }
    }

    /// Puts a TLS listener in front of each mock broker and advertises it
    /// instead of the plaintext one; returns the new bootstrap list.
    fn behind_tls(&self, files: &TlsFiles) -> Result<String, KafkaIoError> {
        let mut listeners = Vec::new();
        // The mock lists its brokers in id order, 1 to N.
        for (id, plain) in (1..).zip(self.bootstrap.split(',')) {
            let plain: SocketAddr = plain
                .parse()
                .map_err(|e| KafkaIoError::Fatal(format!("mock broker {plain:?}: {e}")))?;
            let host = plain.ip().to_string();
            let port = tls_listener::start(files, &host, plain).map_err(KafkaIoError::Fatal)?;
            let c_host = CString::new(host.clone()).expect("an IP address has no NUL");
            // SAFETY: valid mock pointer, NUL-terminated host, an existing broker id.
            unsafe {
                rd::rd_kafka_mock_broker_set_host_port(
                    self.mock(),
                    id,
                    c_host.as_ptr(),
                    port.into(),
                )
            };
            listeners.push(format!("{host}:{port}"));
        }
        Ok(listeners.join(","))
    }

    /// Applies one control command (`tally dev-broker --control-file`): `down
    /// [ID]` (the broker closes its connections and refuses new ones; its logs,
    /// offsets and groups stay), `up [ID]`, `rtt MS [ID]` (every response delayed
    /// by MS) — without ID, every broker — and `leader TOPIC PARTITION ID` (the
    /// partition's leadership moves to broker ID; its log stays).
    pub(crate) fn control(&self, command: &str) -> Result<(), String> {
        let words: Vec<&str> = command.split_whitespace().collect();
        let id = |w: &str| -> Result<i32, String> {
            w.parse::<i32>()
                .ok()
                .filter(|id| (1..=self.brokers).contains(id))
                .ok_or_else(|| {
                    format!(
                        "{command:?}: {w:?} is not a broker id (1 to {})",
                        self.brokers
                    )
                })
        };
        let every = || (1..=self.brokers).collect::<Vec<i32>>();
        let ids = |rest: &[&str]| match rest {
            [] => Ok(every()),
            [w] => id(w).map(|i| vec![i]),
            _ => Err(format!("{command:?}: too many words")),
        };
        let mock = self.mock();
        // SAFETY (every call below): a valid mock pointer and existing broker ids.
        let errs: Vec<rd::rd_kafka_resp_err_t> = match words.as_slice() {
            ["down", rest @ ..] => ids(rest)?
                .into_iter()
                .map(|b| unsafe { rd::rd_kafka_mock_broker_set_down(mock, b) })
                .collect(),
            ["up", rest @ ..] => ids(rest)?
                .into_iter()
                .map(|b| unsafe { rd::rd_kafka_mock_broker_set_up(mock, b) })
                .collect(),
            ["rtt", ms, rest @ ..] => {
                let ms: i32 = ms.parse().map_err(|_| format!("rtt {ms:?}: not ms"))?;
                ids(rest)?
                    .into_iter()
                    .map(|b| unsafe { rd::rd_kafka_mock_broker_set_rtt(mock, b, ms) })
                    .collect()
            }
            ["leader", topic, partition, b] => {
                let p: i32 = partition
                    .parse()
                    .map_err(|_| format!("leader: partition {partition:?} is not a number"))?;
                let b = id(b)?;
                let t = CString::new(*topic).map_err(|_| "leader: NUL in the topic".to_string())?;
                vec![unsafe { rd::rd_kafka_mock_partition_set_leader(mock, t.as_ptr(), p, b) }]
            }
            _ => {
                return Err(format!(
                    "unknown command {command:?} (down [ID], up [ID], rtt MS [ID], leader TOPIC PARTITION ID)"
                ))
            }
        };
        match errs
            .into_iter()
            .find(|e| *e != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
        {
            Some(err) => Err(format!("{command}: {err:?}")),
            None => Ok(()),
        }
    }

    pub(crate) fn create_topic(&self, name: &str, partitions: i32) -> Result<(), KafkaIoError> {
        let c = CString::new(name)
            .map_err(|_| KafkaIoError::Fatal(format!("topic name {name:?} contains NUL")))?;
        // SAFETY: valid mock pointer and NUL-terminated name.
        // Every broker holds a replica, so any of them can lead any partition.
        let err = unsafe {
            rd::rd_kafka_mock_topic_create(self.mock(), c.as_ptr(), partitions, self.brokers)
        };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(KafkaIoError::Fatal(format!(
                "creating topic {name}: {err:?}"
            )));
        }
        Ok(())
    }
}

/// Group timings the broker owns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupTimings {
    /// Classic groups' `group.initial.rebalance.delay.ms` (3 s in the mock by
    /// default; short for development and tests).
    pub initial_rebalance_delay: Duration,
    /// KIP-848 (`group.protocol=consumer`) groups' session timeout: how long a
    /// silent member — or a static member that left — keeps its partitions.
    pub consumer_session_timeout: Duration,
    /// KIP-848 groups' heartbeat interval: how fast members learn a new assignment.
    pub consumer_heartbeat_interval: Duration,
}

impl Default for GroupTimings {
    fn default() -> Self {
        Self {
            initial_rebalance_delay: Duration::from_millis(100),
            consumer_session_timeout: Duration::from_secs(6),
            consumer_heartbeat_interval: Duration::from_millis(500),
        }
    }
}

/// Starts the mock cluster of `brokers` brokers, creates `topics` (name,
/// partitions; a replica on every broker), writes the bootstrap address to
/// `address_file` (atomically) and returns the cluster. With `tls`, clients
/// reach it only through TLS listeners (`tls_listener`).
pub(crate) fn start(
    (topics, brokers): (&[(String, i32)], i32),
    address_file: Option<&Path>,
    timings: GroupTimings,
    tls: Option<&TlsFiles>,
) -> Result<DevBroker, KafkaIoError> {
    let handle: BaseProducer = ClientConfig::new()
        .set("test.mock.num.brokers", brokers.to_string())
        .create()
        .map_err(KafkaIoError::client("starting the mock cluster"))?;
    // SAFETY: see DevBroker::mock; the bootstrap string is owned by the cluster.
    let bootstrap = unsafe {
        let mock = rd::rd_kafka_handle_mock_cluster(handle.client().native_ptr());
        if mock.is_null() {
            return Err(KafkaIoError::Fatal(
                "librdkafka did not create a mock cluster".into(),
            ));
        }
        rd::rd_kafka_mock_group_initial_rebalance_delay_ms(
            mock,
            timings.initial_rebalance_delay.as_millis() as i32,
        );
        rd::rd_kafka_mock_set_group_consumer_session_timeout_ms(
            mock,
            timings.consumer_session_timeout.as_millis() as i32,
        );
        rd::rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(
            mock,
            timings.consumer_heartbeat_interval.as_millis() as i32,
        );
        CStr::from_ptr(rd::rd_kafka_mock_cluster_bootstraps(mock))
            .to_string_lossy()
            .into_owned()
    };
    let mut broker = DevBroker {
        handle,
        bootstrap,
        brokers,
    };
    if let Some(files) = tls {
        broker.bootstrap = broker.behind_tls(files)?;
    }
    for (name, partitions) in topics {
        broker.create_topic(name, *partitions)?;
    }
    if let Some(path) = address_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{}\n", broker.bootstrap))
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| KafkaIoError::Fatal(format!("writing {}: {e}", path.display())))?;
    }
    Ok(broker)
}

/// Parses `name:partitions` (partitions default to `default_partitions`).
pub(crate) fn parse_topic_spec(
    spec: &str,
    default_partitions: i32,
) -> Result<(String, i32), String> {
    match spec.split_once(':') {
        None if !spec.is_empty() => Ok((spec.to_string(), default_partitions)),
        Some((name, n)) if !name.is_empty() => n
            .parse::<i32>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| (name.to_string(), n))
            .ok_or_else(|| format!("topic spec {spec:?}: partitions must be a positive integer")),
        _ => Err(format!(
            "topic spec {spec:?} is not NAME or NAME:PARTITIONS"
        )),
    }
}
