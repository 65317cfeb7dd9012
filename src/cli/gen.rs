//! `tally gen`.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::ConfigArg;
use crate::config::{Config, Millis};
use crate::gen::{Expected, GenOptions, Generator};
use crate::kafka::outputs::{send, DeliveryTracker, UNTIMED};
use crate::kafka::{client_config, PRODUCER_DEFAULTS};
use crate::time::utc::parse_utc_ms;

#[derive(Args, Debug)]
pub struct GenArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Number of records.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 50)]
    pub tenants: u32,
    /// Zipf exponent of tenant popularity (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    pub skew: f64,
    /// Partitions of the input topic (default: read from the broker).
    #[arg(long)]
    pub partitions: Option<i32>,
    /// Event time of the first record (UTC).
    #[arg(long, default_value = "2026-01-01T10:00:00Z")]
    pub start: String,
    /// Event-time distance between records.
    #[arg(long, default_value = "10ms")]
    pub step: String,
    /// Out-of-orderness of normal records (default: the watermark bound minus 1 s).
    #[arg(long)]
    pub jitter: Option<String>,
    /// Fraction of too-late records.
    #[arg(long, default_value_t = 0.0)]
    pub late_fraction: f64,
    #[arg(long, default_value_t = 0.0)]
    pub duplicate_fraction: f64,
    #[arg(long, default_value_t = 0.0)]
    pub malformed_fraction: f64,
    /// Records per second of wall clock (0 = as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Write the exact expected totals (JSON) here.
    #[arg(long, value_name = "FILE")]
    pub expected_file: Option<PathBuf>,
    /// Write JSON lines here instead of producing to Kafka.
    ///
    /// Records are written the way the config's `[input]` reads them (its
    /// pointers, timestamp formats, CloudEvents).
    #[arg(long, value_name = "FILE")]
    pub output_file: Option<PathBuf>,
    /// Write every generated record here, one JSON line each: its partition,
    /// its sequence number there, key, payload, and the route the rules must
    /// give it (`normal`, `too_late`, `duplicate`, `dead_letter` with its code).
    #[arg(long, value_name = "FILE")]
    pub records_file: Option<PathBuf>,
}

/// `--records-file`: one `GeneratedRecord` per line, numbered per partition.
struct RecordsFile {
    out: Option<std::io::BufWriter<std::fs::File>>,
    seq: std::collections::BTreeMap<i32, u64>,
}

impl RecordsFile {
    fn open(path: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let out = path
            .map(|p| std::fs::File::create(p).with_context(|| p.display().to_string()))
            .transpose()?
            .map(std::io::BufWriter::new);
        Ok(Self {
            out,
            seq: Default::default(),
        })
    }

    fn write(&mut self, r: &crate::gen::GenRecord) -> anyhow::Result<()> {
        if let Some(out) = &mut self.out {
            let seq = self.seq.entry(r.partition).or_default();
            writeln!(out, "{}", serde_json::to_string(&r.describe(*seq))?)?;
            *seq += 1;
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        if let Some(mut out) = self.out {
            out.flush()?;
        }
        Ok(())
    }
}

fn per_million(f: f64, name: &str) -> anyhow::Result<u32> {
    anyhow::ensure!((0.0..=1.0).contains(&f), "--{name} must be between 0 and 1");
    Ok((f * 1e6).round() as u32)
}

pub fn options(a: &GenArgs, cfg: &Config, partitions: i32) -> anyhow::Result<GenOptions> {
    let bound = cfg.watermark.max_out_of_orderness.0;
    let jitter = match &a.jitter {
        Some(j) => Millis::parse(j).map_err(anyhow::Error::msg)?.0,
        None => (bound - 1_000).max(0),
    };
    anyhow::ensure!(
        jitter < bound.max(1),
        "--jitter must be below watermark.max_out_of_orderness ({bound} ms)"
    );
    Ok(GenOptions {
        seed: a.seed,
        count: a.count,
        tenants: a.tenants,
        skew_milli: (a.skew * 1000.0).round() as u32,
        partitions,
        start_ms: parse_utc_ms(&a.start).map_err(anyhow::Error::msg)?,
        step_ms: Millis::parse(&a.step).map_err(anyhow::Error::msg)?.0,
        jitter_ms: jitter,
        late_per_million: per_million(a.late_fraction, "late-fraction")?,
        duplicate_per_million: per_million(a.duplicate_fraction, "duplicate-fraction")?,
        malformed_per_million: per_million(a.malformed_fraction, "malformed-fraction")?,
    })
}

pub fn run(a: GenArgs) -> anyhow::Result<()> {
    let cfg = a.config.load()?;
    if cfg.rating.is_some() {
        let opts = options(&a, &cfg, a.partitions.unwrap_or(1))?;
        let n = super::gen_rated::run(
            &cfg,
            &opts,
            a.output_file.as_deref(),
            a.expected_file.as_deref(),
        )?;
        eprintln!("generated {n} rated records");
        return Ok(());
    }
    let prices = cfg.price_table()?;
    let engine = cfg.engine()?;
    let expected = if let Some(path) = &a.output_file {
        let opts = options(&a, &cfg, a.partitions.unwrap_or(1))?;
        let mut gen = Generator::new(
            opts,
            &prices,
            engine.window,
            engine.allowed_lateness_ms,
            engine.max_out_of_orderness_ms,
        )
        .with_max_lead(engine.max_lead_ms)
        .with_input(engine.input.clone());
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| path.display().to_string())?,
        );
        let mut records = RecordsFile::open(a.records_file.as_deref())?;
        for r in gen.by_ref() {
            records.write(&r)?;
            if crate::base::shutdown::requested() {
                out.flush()?;
                anyhow::bail!(
                    "interrupted by a signal: {} holds a prefix of the run; the expected file is not written",
                    path.display()
                );
            }
            writeln!(out, "{}", r.payload)?;
        }
        out.flush()?;
        records.finish()?;
        gen.expected()
    } else {
        produce(&a, &cfg, &prices, &engine)?
    };
    if let Some(path) = &a.expected_file {
        std::fs::write(path, serde_json::to_vec_pretty(&expected)?)
            .with_context(|| path.display().to_string())?;
    }
    eprintln!(
        "generated {} records: {} windows, {} too late, {} duplicates, {} dead letters",
        expected.records,
        expected.windows.len(),
        expected.too_late.len(),
        expected.duplicates,
        expected.dead_letters.values().sum::<u64>()
    );
    Ok(())
}

fn produce(
    a: &GenArgs,
    cfg: &Config,
    prices: &crate::model::PriceTable,
    engine: &crate::engine::EngineConfig,
) -> anyhow::Result<Expected> {
    let producer: BaseProducer<DeliveryTracker> = client_config(&cfg.kafka, PRODUCER_DEFAULTS)
        .create_with_context(DeliveryTracker::default())?;
    let topic = &cfg.topics.input;
    let partitions = match a.partitions {
        Some(p) => p,
        None => {
            let md = producer
                .client()
                .fetch_metadata(Some(topic), Duration::from_secs(10))?;
            let n = md
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .map_or(0, |t| t.partitions().len());
            anyhow::ensure!(
                n > 0,
                "input topic {topic} has no partitions (does it exist?)"
            );
            n as i32
        }
    };
    let opts = options(a, cfg, partitions)?;
    let mut gen = Generator::new(
        opts,
        prices,
        engine.window,
        engine.allowed_lateness_ms,
        engine.max_out_of_orderness_ms,
    )
    .with_max_lead(engine.max_lead_ms)
    .with_input(engine.input.clone());
    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut records = RecordsFile::open(a.records_file.as_deref())?;
    for r in gen.by_ref() {
        records.write(&r)?;
        if crate::base::shutdown::requested() {
            producer
                .flush(Duration::from_secs(60))
                .context("flushing generated records")?;
            producer.context().take_failures()?;
            anyhow::bail!(
                "interrupted by a signal after {sent} records, all of them acknowledged; the expected \
                 file is not written (it describes the whole run)"
            );
        }
        let record = BaseRecord::with_opaque_to(topic, UNTIMED)
            .partition(r.partition)
            .key(r.key.as_bytes())
            .payload(r.payload.as_bytes());
        send(&producer, record).context("producing generated records")?;
        sent += 1;
        producer.poll(Duration::ZERO);
        if let Some(due_us) = (sent * 1_000_000).checked_div(a.rate) {
            let due = Duration::from_micros(due_us);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        if sent.is_multiple_of(100_000) {
            tracing::info!(sent, "generating");
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .context("flushing generated records")?;
    producer.context().take_failures()?;
    records.finish()?;
    Ok(gen.expected())
}
