//! `tally dev-broker`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;

use super::ConfigArg;
use crate::base::shutdown;
use crate::kafka::broker;
use crate::kafka::tls_listener::TlsFiles;

#[derive(Args, Debug)]
pub struct BrokerArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Brokers in the cluster (ids 1 to N); every topic has a replica on each,
    /// so `leader` control commands can move any partition.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=8))]
    pub brokers: i32,
    /// Partitions of each topic created from the config's [topics].
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Extra topics as NAME or NAME:PARTITIONS (repeatable).
    #[arg(long = "topic", value_name = "NAME[:N]")]
    pub topics: Vec<String>,
    /// Write the bootstrap address here once the topics exist.
    #[arg(long, value_name = "FILE", default_value = ".tally/bootstrap")]
    pub address_file: PathBuf,
    /// Do not create the config's topics, only --topic ones.
    #[arg(long)]
    pub no_default_topics: bool,
    /// The groups' initial rebalance delay (Kafka's group.initial.rebalance.delay.ms).
    #[arg(long, default_value = "100ms")]
    pub initial_rebalance_delay: String,
    /// Session timeout of KIP-848 groups (`group.protocol = "consumer"`), which the
    /// broker owns: how long a dead member, or a static member that left, keeps
    /// its partitions.
    #[arg(long, default_value = "6s")]
    pub group_session_timeout: String,
    /// Heartbeat interval of KIP-848 groups: how fast members see a new assignment.
    #[arg(long, default_value = "500ms")]
    pub group_heartbeat_interval: String,
    /// TLS mode: the broker's certificate chain (PEM). Clients then connect with
    /// `security.protocol = "SSL"` and `ssl.ca.location`; plaintext is refused.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS mode: the private key of --tls-cert (PEM, unencrypted).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Fault injection (the chaos run): a file polled every 100 ms; each time it
    /// appears, its lines are applied in order and it is removed — `down [ID]`
    /// (the broker drops every connection and refuses new ones; its data stays),
    /// `up [ID]`, `rtt MS [ID]` (every response delayed by MS), without ID every
    /// broker; `leader TOPIC PARTITION ID` (the partition's leadership moves to
    /// broker ID).
    #[arg(long, value_name = "FILE")]
    pub control_file: Option<PathBuf>,
    /// mTLS: require client certificates signed by this CA (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

pub fn run(a: BrokerArgs) -> anyhow::Result<()> {
    let mut topics = Vec::new();
    if !a.no_default_topics {
        let cfg = a.config.load()?;
        for t in [
            &cfg.topics.input,
            &cfg.topics.results,
            &cfg.topics.late,
            &cfg.topics.dead_letter,
        ] {
            topics.push((t.clone(), a.partitions));
        }
    }
    for spec in &a.topics {
        topics.push(broker::parse_topic_spec(spec, a.partitions).map_err(|e| anyhow!(e))?);
    }
    if let Some(dir) = a
        .address_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)?;
    }
    let duration = |flag: &str, v: &str| {
        crate::base::duration::Millis::parse(v)
            .map(|m| Duration::from_millis(m.0 as u64))
            .map_err(|e| anyhow!("--{flag}: {e}"))
    };
    let timings = broker::GroupTimings {
        initial_rebalance_delay: duration("initial-rebalance-delay", &a.initial_rebalance_delay)?,
        consumer_session_timeout: duration("group-session-timeout", &a.group_session_timeout)?,
        consumer_heartbeat_interval: duration(
            "group-heartbeat-interval",
            &a.group_heartbeat_interval,
        )?,
    };
    // clap makes --tls-cert and --tls-key go together.
    let tls = a.tls_cert.zip(a.tls_key).map(|(cert, key)| TlsFiles {
        cert,
        key,
        client_ca: a.tls_client_ca,
    });
    let cluster = broker::start(
        (&topics, a.brokers),
        Some(&a.address_file),
        timings,
        tls.as_ref(),
    )?;
    println!("{}", cluster.bootstrap_servers());
    tracing::info!(bootstrap = %cluster.bootstrap_servers(), topics = %crate::logfmt::pairs(topics.iter().map(|(t, n)| (t, n))), file = %a.address_file.display(),
        "dev broker ready (in-memory; keeps the newest 5 MiB per partition)");
    while !shutdown::requested() {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(file) = &a.control_file {
            control(&cluster, file);
        }
    }
    tracing::info!("dev broker stopping");
    Ok(())
}

/// Applies and removes the control file, if it is there (written whole, by a
/// rename, by whoever controls the broker).
fn control(cluster: &broker::DevBroker, file: &std::path::Path) {
    let Ok(text) = std::fs::read_to_string(file) else {
        return;
    };
    let _ = std::fs::remove_file(file);
    for command in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match cluster.control(command) {
            Ok(()) => tracing::info!(command, "dev broker control"),
            Err(e) => tracing::warn!(error = %e, "dev broker control refused"),
        }
    }
}
