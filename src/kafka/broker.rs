//! `tally dev-broker`: librdkafka's mock cluster hosted as a long-lived process.
//!
//! Why not a real broker: see DESIGN §10. The mock speaks the Kafka protocol
//! (produce with idempotence, fetch, headers, consumer groups, offset commit,
//! ListOffsets earliest/latest) but not CreateTopics, so topics are created here,
//! through the mock API, before the bootstrap address is published. It keeps only
//! the newest 5 MiB of batches per partition.

use std::path::Path;

use rdkafka::mocking::MockCluster;

use super::KafkaIoError;

/// Starts the mock cluster, creates `topics` (name, partitions), writes the
/// bootstrap address to `address_file` (atomically) and returns the cluster; it
/// serves until dropped.
pub fn start(
    topics: &[(String, i32)],
    address_file: Option<&Path>,
) -> Result<MockCluster<'static, rdkafka::producer::DefaultProducerContext>, KafkaIoError> {
    let cluster = MockCluster::new(1).map_err(KafkaIoError::client("starting the mock cluster"))?;
    for (name, partitions) in topics {
        cluster
            .create_topic(name, *partitions, 1)
            .map_err(KafkaIoError::client(format!("creating topic {name}")))?;
    }
    let bootstrap = cluster.bootstrap_servers();
    if let Some(path) = address_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{bootstrap}\n"))
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| KafkaIoError::Fatal(format!("writing {}: {e}", path.display())))?;
    }
    Ok(cluster)
}

/// Parses `name:partitions` (partitions default to `default_partitions`).
pub fn parse_topic_spec(spec: &str, default_partitions: i32) -> Result<(String, i32), String> {
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
