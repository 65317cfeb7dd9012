//! Real services as child processes, for `tally-dev` and the integration tests:
//! a `tally dev-broker` process, a database in a PostgreSQL cluster, workers that
//! log to a file, signals, the invoice view, a checkpoint written as a worker
//! writes one. Each exists once, here.
//!
//! Nothing here fakes a service: a broker that does not publish its address, or a
//! database that cannot be created, is an error.

#![allow(unsafe_code)] // `signal`: libc::kill on a child's pid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::KafkaConfig;

/// The `tally` binary beside the running executable (`tally-dev` and `tally` are
/// built into the same target directory).
pub fn tally_beside_me() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating the running binary")?;
    let tally = me.with_file_name("tally");
    anyhow::ensure!(
        tally.exists(),
        "{} not found: build both binaries (`cargo build --bins`)",
        tally.display()
    );
    Ok(tally)
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!("tally-{tag}-{}-{nanos}", std::process::id()));
        let _ = std::fs::create_dir_all(&p);
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `tally dev-broker` child process, killed on drop.
pub struct DevBroker {
    child: Child,
    pub bootstrap: String,
    _dir: TempDir,
}

impl DevBroker {
    /// Starts a broker with exactly `topics` (name, partitions) and waits (30 s at
    /// most) until it publishes its address.
    pub fn start(tally: &Path, topics: &[(&str, i32)]) -> anyhow::Result<Self> {
        Self::start_with(tally, topics, &[])
    }

    /// Like `start`, with more `tally dev-broker` arguments (the TLS mode's).
    pub fn start_with(
        tally: &Path,
        topics: &[(&str, i32)],
        extra: &[&std::ffi::OsStr],
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new("broker");
        let file = dir.path().join("bootstrap");
        let mut cmd = Command::new(tally);
        cmd.args(["dev-broker", "--no-default-topics", "--address-file"])
            .arg(&file);
        for (t, n) in topics {
            cmd.arg("--topic").arg(format!("{t}:{n}"));
        }
        cmd.args(extra);
        let mut child = cmd
            .env("TALLY_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {} dev-broker", tally.display()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = std::fs::read_to_string(&file) {
                if !s.trim().is_empty() {
                    return Ok(DevBroker {
                        child,
                        bootstrap: s.trim().to_string(),
                        _dir: dir,
                    });
                }
            }
            if let Some(status) = child.try_wait()? {
                bail!("tally dev-broker exited with {status} before publishing its address");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("tally dev-broker did not start within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kafka(&self) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: self.bootstrap.clone(),
            ..KafkaConfig::default()
        }
    }
}

impl Drop for DevBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Creates database `name` in the cluster of `admin_url`; returns its URL.
pub fn create_database(admin_url: &str, name: &str) -> anyhow::Result<String> {
    execute(admin_url, &format!("CREATE DATABASE {name}"))?;
    let (base, _) = admin_url
        .rsplit_once('/')
        .context("the database URL has no database part")?;
    Ok(format!("{base}/{name}"))
}

/// Runs `sql` and returns its rows, every column read as text (cast in the SQL).
pub fn query(url: &str, sql: &str) -> anyhow::Result<Vec<Vec<Option<String>>>> {
    runtime()?.block_on(async {
        let client = crate::sink::connect(url).await?;
        let rows = client
            .query(sql, &[])
            .await
            .with_context(|| sql.to_string())?;
        Ok(rows
            .iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| r.get::<_, Option<String>>(i))
                    .collect()
            })
            .collect())
    })
}

pub fn execute(url: &str, sql: &str) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = crate::sink::connect(url).await?;
        client
            .batch_execute(sql)
            .await
            .with_context(|| sql.to_string())
    })
}

/// One invoice line of the `tenant_cost_minute` view.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InvoiceLine {
    pub tenant_id: String,
    pub window_end: i64,
    /// Decimal picodollars, as the view gives them.
    pub cost_pico: String,
}

/// The invoice view, ordered by tenant and window end.
pub fn invoice(db: &str) -> anyhow::Result<Vec<InvoiceLine>> {
    let mut lines = query(
        db,
        "SELECT tenant_id, window_end::TEXT, cost_pico::TEXT FROM tenant_cost_minute",
    )?
    .into_iter()
    .map(|row| match row.as_slice() {
        [Some(t), Some(end), Some(cost)] => Ok(InvoiceLine {
            tenant_id: t.clone(),
            window_end: end.parse()?,
            cost_pico: cost.clone(),
        }),
        other => bail!("unexpected invoice row {other:?}"),
    })
    .collect::<anyhow::Result<Vec<_>>>()?;
    lines.sort();
    Ok(lines)
}

/// The generator's expectation as invoice lines, in the view's order.
pub fn expected_invoice(e: &crate::gen::Expected) -> Vec<InvoiceLine> {
    let mut lines: Vec<InvoiceLine> = e
        .windows
        .iter()
        .map(|w| InvoiceLine {
            tenant_id: w.tenant_id.clone(),
            window_end: w.window_end,
            cost_pico: w.cost_pico.clone(),
        })
        .collect();
    lines.sort();
    lines
}

/// `tally run --config <cfg>` with `TALLY_STATE__DIR=<state>`, logging (appended
/// across restarts) to `<state>.log` at `TALLY_LOG=info`.
pub fn spawn_worker(
    tally: &Path,
    cfg: &Path,
    state: &Path,
    envs: &[(&str, &str)],
) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.with_extension("log"))
        .with_context(|| format!("opening {}.log", state.display()))?;
    Ok(Command::new(tally)
        .args(["run", "--config"])
        .arg(cfg)
        .env("TALLY_STATE__DIR", state)
        .envs(envs.iter().copied())
        .env("TALLY_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?)
}

/// Sends `sig` (e.g. `libc::SIGSTOP`) to process `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers; a stale pid at worst signals nothing.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The log end of each of `partitions` partitions of `topic`.
pub fn log_ends(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<std::collections::BTreeMap<i32, i64>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = crate::kafka::client_config(kafka, &[]).create()?;
    (0..partitions)
        .map(|p| {
            Ok((
                p,
                consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(10))?
                    .1,
            ))
        })
        .collect()
}

/// The broker that leads `topic`'s `partition`, by the cluster's metadata.
pub fn leader(kafka: &KafkaConfig, topic: &str, partition: i32) -> anyhow::Result<i32> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = crate::kafka::client_config(kafka, &[]).create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(2))?;
    md.topics()
        .iter()
        .flat_map(|t| t.partitions())
        .find(|p| p.id() == partition)
        .map(|p| p.leader())
        .ok_or_else(|| anyhow::anyhow!("no metadata for {topic}/{partition}"))
}

/// Commits `windows` fresh windows (`t<id>-<i>`) to each of `partitions` at next
/// offset `next`, then writes checkpoint `id` of them through the real exporter
/// and waits for it: a checkpoint as a worker writes one, for tests of the store.
pub fn write_checkpoint(
    checkpoints: &std::sync::Arc<crate::checkpoint::store::CheckpointStore>,
    state: &std::sync::Arc<crate::state::StateStore>,
    id: u64,
    partitions: &[i32],
    next: i64,
    windows: usize,
) -> anyhow::Result<crate::checkpoint::Manifest> {
    use crate::checkpoint::export::{self, ExportJob, ExportPartition, JobIdentity};
    use crate::checkpoint::{CheckpointId, OffsetLedger};
    use crate::engine::{Counters, StateDelta, WindowAcc, WindowPhase};
    use crate::model::Partition;
    use crate::state::{NextOffset, PartitionCommit};
    let window = |i: usize| {
        let acc = WindowAcc {
            version: 1,
            ..WindowAcc::default()
        };
        (
            (60_000, format!("t{id}-{i}").into()),
            acc,
            WindowPhase::Open,
        )
    };
    let commits = partitions
        .iter()
        .map(|&p| PartitionCommit {
            partition: Partition(p),
            next_offset: NextOffset(next),
            delta: StateDelta {
                changed: (0..windows).map(window).collect(),
                purged_through: None,
                dedup: Default::default(),
                watermark: crate::time::Watermark::new(0, None),
                counters: Counters::default(),
                high_water: None,
            },
        })
        .collect();
    let job = ExportJob {
        id: CheckpointId(id),
        job: JobIdentity {
            worker: "w".into(),
            group: "g".into(),
            topic: "t".into(),
            rules: std::sync::Arc::new(crate::checkpoint::evolution::Rules::opaque("f")),
        },
        created_at_ms: 0,
        partitions: partitions
            .iter()
            .map(|&p| ExportPartition {
                high_water: None,
                partition: Partition(p),
                next_offset: NextOffset(next),
                watermark: None,
                counters: Counters::default(),
                offsets: OffsetLedger::without_gaps(0, NextOffset(next)),
                chain: None,
            })
            .collect(),
        commits,
        store: state.clone(),
        checkpoints: checkpoints.clone(),
    };
    Ok(export::spawn(job, Instant::now())?.wait()?)
}

/// An engine configuration with one model (`m`: $0.15 input, $0.60 output per
/// 1k tokens), 1-minute windows, a 5 s bound and `allowed_lateness_ms`: the
/// benchmarks' and the protocol model test's.
pub fn one_price_engine(allowed_lateness_ms: i64) -> std::sync::Arc<crate::engine::EngineConfig> {
    use crate::model::{NanoPer1k, PriceEntry, PriceTable};
    let mut prices = PriceTable::default();
    prices.insert(
        "m",
        PriceEntry {
            effective_from_ms: i64::MIN,
            input: NanoPer1k(150_000),
            output: NanoPer1k(600_000),
        },
    );
    std::sync::Arc::new(crate::engine::EngineConfig {
        window: crate::time::WindowSpec::new(60_000, 0),
        allowed_lateness_ms,
        max_out_of_orderness_ms: 5_000,
        max_future_ms: None,
        time_source: crate::engine::TimeSource::CompletedTs,
        max_lead_ms: None,
        dedup_extra_ms: 3_600_000,
        max_record_bytes: 1 << 20,
        generation: 1,
        prices,
        rating: None,
        rating_source: String::new(),
        input: Default::default(),
    })
}
