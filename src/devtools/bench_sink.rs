//! `tally-dev bench-sink`: `tally sink` applying a results topic to PostgreSQL vs a
//! plain batched upsert loop writing the same rows, in one run.
//!
//! The records are window results made here (valid by the sink's check: sorted
//! lines summing to the totals, `usd` agreeing with `cost_pico`), one per tenant
//! and minute, each with one to three line items, produced once onto a dev broker
//! (`tally dev-broker`, zstd batches so the mock's 5 MiB per partition holds them).
//! Each round, alternating, into a fresh database of the cluster given:
//! - the baseline: this process, one connection, the migrated schema, per 2,000
//!   records (the sink's batch) one transaction of two multi-row
//!   `INSERT … ON CONFLICT DO UPDATE` (partials, then lines) under the same
//!   version rule; the rows come from memory, no Kafka, no parsing;
//! - `tally sink --until-end`, a child process measured with `wait4` (wall, CPU).
//!
//! After each side the database must hold exactly the rows expected (counts and
//! the sum of `cost_pico`); the figures are the best round of each side and their
//! ratio, plus each round's ratio (the range over rounds).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::bench_kafka::{measured, Cost};
use super::support::{self, DevBroker};
use crate::engine::{LineItem, PaneKind, ResultKind, ResultRecord};
use crate::model::Pico;

#[derive(Args, Debug)]
pub struct BenchSinkArgs {
    /// A PostgreSQL cluster's URL (a database a role that may CREATE DATABASE
    /// connects to); each round writes into a database of its own there.
    #[arg(long, env = "TALLY_BENCH_PG_URL")]
    pub database_url: String,
    /// Result records (one per tenant and minute).
    #[arg(long, default_value_t = 1_000_000)]
    pub records: usize,
    #[arg(long, default_value_t = 10_000)]
    pub tenants: usize,
    /// Partitions of the results topic.
    #[arg(long, default_value_t = 32)]
    pub partitions: i32,
    /// Alternate baseline and sink runs this many times.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Scratch directory (the sink's config file).
    #[arg(long, default_value = "/tmp/tally-bench-sink")]
    pub dir: PathBuf,
}

const TOPIC: &str = "tenant-cost";
const MODELS: [&str; 3] = ["large", "medium", "small"];
/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;

/// Record `i`: tenant `i % tenants`, minute `i / tenants`, 1–3 lines.
fn record(i: usize, tenants: usize) -> ResultRecord {
    let (t, m) = (i % tenants, i / tenants);
    let start = T0 + m as i64 * 60_000;
    let first = (t + m) % 3;
    let n = 1 + (t * 7 + m) % 3;
    let lines: Vec<LineItem> = (first..(first + n).min(3))
        .map(|k| {
            let requests = 1 + ((t * 31 + m * 17 + k) % 20) as u64;
            let (prompt, completion) = (requests * 480, requests * 120);
            LineItem {
                model: MODELS[k].into(),
                requests,
                prompt_tokens: prompt,
                completion_tokens: completion,
                cost_pico: Pico(u128::from(prompt * 150_000 + completion * 600_000)),
                ..LineItem::default()
            }
        })
        .collect();
    let cost = Pico(lines.iter().map(|l| l.cost_pico.0).sum());
    ResultRecord {
        kind: ResultKind::Window,
        tenant_id: format!("tenant-{t:05}"),
        window_start: start,
        window_end: start + 60_000,
        usd: cost.usd_string(),
        cost_pico: cost,
        requests: lines.iter().map(|l| l.requests).sum(),
        prompt_tokens: lines.iter().map(|l| l.prompt_tokens).sum(),
        completion_tokens: lines.iter().map(|l| l.completion_tokens).sum(),
        source_partition: (t % 8) as i32,
        version: lines.iter().map(|l| l.requests).sum(),
        pane: PaneKind::OnTime,
        pane_index: 0,
        generation: 1,
        lines,
    }
}

/// What the database must hold after either side: partials, lines, cost.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expect {
    partials: i64,
    lines: i64,
    cost: String,
}

fn expected(a: &BenchSinkArgs) -> Expect {
    let (mut lines, mut cost) = (0, 0u128);
    for i in 0..a.records {
        let r = record(i, a.tenants);
        lines += r.lines.len() as i64;
        cost += r.cost_pico.0;
    }
    Expect {
        partials: a.records as i64,
        lines,
        cost: cost.to_string(),
    }
}

fn stored(url: &str) -> anyhow::Result<Expect> {
    let rows = support::query(
        url,
        "SELECT (SELECT count(*) FROM tenant_cost_partial)::TEXT,
                (SELECT count(*) FROM tenant_cost_line_partial)::TEXT,
                (SELECT coalesce(sum(cost_pico), 0) FROM tenant_cost_partial)::TEXT",
    )?;
    let text = |i: usize| rows[0][i].clone().unwrap_or_default();
    Ok(Expect {
        partials: text(0).parse()?,
        lines: text(1).parse()?,
        cost: text(2),
    })
}

/// Produces every record (keyed as the worker keys them) to `TOPIC`, tenant `t`
/// to partition `t % partitions`, and checks the broker kept them all.
fn produce(broker: &DevBroker, a: &BenchSinkArgs) -> anyhow::Result<()> {
    use crate::kafka::outputs::{send, DeliveryTracker, UNTIMED};
    let kafka = broker.kafka();
    let settings = [
        ("compression.type", "zstd"),
        ("linger.ms", "200"),
        ("batch.num.messages", "20000"),
        ("batch.size", "4000000"),
        ("queue.buffering.max.kbytes", "262144"),
    ];
    let mut config = crate::kafka::client_config(&kafka, crate::kafka::PRODUCER_DEFAULTS);
    for (k, v) in settings {
        config.set(k, v);
    }
    let producer: BaseProducer<DeliveryTracker> =
        config.create_with_context(DeliveryTracker::default())?;
    let mut buf = Vec::new();
    let partitions = a.partitions;
    for i in 0..a.records {
        let r = record(i, a.tenants);
        r.write_json(&mut buf);
        let key = r.key();
        let partition = (i % partitions as usize) as i32;
        let record = BaseRecord::with_opaque_to(TOPIC, UNTIMED)
            .partition(partition)
            .key(key.as_bytes())
            .payload(buf.as_slice());
        send(&producer, record).context("producing result records")?;
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(120))?;
    producer.context().take_failures()?;
    let consumer: BaseConsumer = crate::kafka::client_config(&kafka, &[]).create()?;
    let mut total = 0;
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(TOPIC, p, Duration::from_secs(10))?;
        ensure!(
            low == 0,
            "{TOPIC}/{p} starts at {low}: the dev broker dropped records; use more partitions"
        );
        total += high;
    }
    ensure!(
        total == a.records as i64,
        "the topic holds {total} of {} records",
        a.records
    );
    Ok(())
}

const BASE_PARTIALS: &str = "
INSERT INTO tenant_cost_partial AS t
    (tenant_id, window_end, source_partition, window_start, cost_pico, requests,
     prompt_tokens, completion_tokens, version, generation, pane, pane_index)
SELECT * FROM unnest($1::TEXT[], $2::INT8[], $3::INT4[], $4::INT8[], $5::TEXT[]::NUMERIC[],
    $6::INT8[], $7::TEXT[]::NUMERIC[], $8::TEXT[]::NUMERIC[], $9::INT8[], $10::INT8[],
    $11::TEXT[], $12::INT4[])
ON CONFLICT (tenant_id, window_end, source_partition) DO UPDATE SET
    window_start = EXCLUDED.window_start, cost_pico = EXCLUDED.cost_pico,
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens, version = EXCLUDED.version,
    generation = EXCLUDED.generation, pane = EXCLUDED.pane, pane_index = EXCLUDED.pane_index,
    updated_at = now()
WHERE (t.generation, t.version) < (EXCLUDED.generation, EXCLUDED.version)";

const BASE_LINES: &str = "
INSERT INTO tenant_cost_line_partial AS t
    (tenant_id, window_end, source_partition, model, window_start, cost_pico, requests,
     prompt_tokens, completion_tokens, version, generation)
SELECT * FROM unnest($1::TEXT[], $2::INT8[], $3::INT4[], $4::TEXT[], $5::INT8[],
    $6::TEXT[]::NUMERIC[], $7::INT8[], $8::TEXT[]::NUMERIC[], $9::TEXT[]::NUMERIC[],
    $10::INT8[], $11::INT8[])
ON CONFLICT (tenant_id, window_end, source_partition, model) DO UPDATE SET
    window_start = EXCLUDED.window_start, cost_pico = EXCLUDED.cost_pico,
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens, version = EXCLUDED.version,
    generation = EXCLUDED.generation
WHERE (t.generation, t.version) < (EXCLUDED.generation, EXCLUDED.version)";

/// The columns of one batch's partials and lines.
#[derive(Default)]
struct Columns {
    tenant: Vec<String>,
    end: Vec<i64>,
    source: Vec<i32>,
    start: Vec<i64>,
    cost: Vec<String>,
    requests: Vec<i64>,
    prompt: Vec<String>,
    completion: Vec<String>,
    version: Vec<i64>,
    generation: Vec<i64>,
    /// The partials' pane and pane index; the lines' model.
    pane: Vec<String>,
    pane_index: Vec<i32>,
}

impl Columns {
    fn push(&mut self, r: &ResultRecord, l: Option<&LineItem>) {
        let (cost, requests, prompt, completion) = match l {
            Some(l) => (
                l.cost_pico,
                l.requests,
                l.prompt_tokens,
                l.completion_tokens,
            ),
            None => (
                r.cost_pico,
                r.requests,
                r.prompt_tokens,
                r.completion_tokens,
            ),
        };
        self.tenant.push(r.tenant_id.clone());
        self.end.push(r.window_end);
        self.source.push(r.source_partition);
        self.start.push(r.window_start);
        self.cost.push(cost.to_string());
        self.requests.push(requests as i64);
        self.prompt.push(prompt.to_string());
        self.completion.push(completion.to_string());
        self.version.push(r.version as i64);
        self.generation.push(r.generation as i64);
        self.pane
            .push(l.map_or_else(|| "on_time".to_string(), |l| l.model.to_string()));
        self.pane_index.push(r.pane_index as i32);
    }
}

/// The baseline: every record's rows, 2,000 records a transaction, two upserts each.
async fn baseline_async(url: &str, a: &BenchSinkArgs) -> anyhow::Result<f64> {
    let mut client = crate::sink::connect(url).await?;
    crate::sink::migrate::run(&mut client).await?;
    let started = Instant::now();
    let (partials_sql, lines_sql) = (
        client.prepare(BASE_PARTIALS).await?,
        client.prepare(BASE_LINES).await?,
    );
    let mut i = 0;
    while i < a.records {
        let (mut p, mut l) = (Columns::default(), Columns::default());
        for j in i..(i + 2_000).min(a.records) {
            let r = record(j, a.tenants);
            p.push(&r, None);
            for line in &r.lines {
                l.push(&r, Some(line));
            }
        }
        i += 2_000;
        let tx = client.transaction().await?;
        tx.execute(
            &partials_sql,
            &[
                &p.tenant,
                &p.end,
                &p.source,
                &p.start,
                &p.cost,
                &p.requests,
                &p.prompt,
                &p.completion,
                &p.version,
                &p.generation,
                &p.pane,
                &p.pane_index,
            ],
        )
        .await?;
        tx.execute(
            &lines_sql,
            &[
                &l.tenant,
                &l.end,
                &l.source,
                &l.pane,
                &l.start,
                &l.cost,
                &l.requests,
                &l.prompt,
                &l.completion,
                &l.version,
                &l.generation,
            ],
        )
        .await?;
        tx.commit().await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

fn baseline(url: &str, a: &BenchSinkArgs) -> anyhow::Result<f64> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(baseline_async(url, a))
}

/// `tally sink --until-end` into `url`, measured.
fn sink(a: &BenchSinkArgs, broker: &DevBroker, url: &str, tag: &str) -> anyhow::Result<Cost> {
    let config = a.dir.join(format!("{tag}.toml"));
    std::fs::write(
        &config,
        format!(
            "[kafka]\nbootstrap_servers = \"{}\"\n[topics]\nresults = \"{TOPIC}\"\n\
             [sink]\ndatabase_url = \"{url}\"\ngroup_id = \"{tag}\"\n",
            broker.bootstrap
        ),
    )?;
    measured(
        Command::new(support::tally_beside_me()?)
            .args(["sink", "--until-end", "--config"])
            .arg(&config)
            .env("TALLY_LOG", "warn"),
    )
}

pub fn run(a: BenchSinkArgs) -> anyhow::Result<()> {
    let tally = support::tally_beside_me()?;
    std::fs::create_dir_all(&a.dir)?;
    let want = expected(&a);
    let broker = DevBroker::start(&tally, &[(TOPIC, a.partitions), ("requests", 1)])?;
    let started = Instant::now();
    produce(&broker, &a)?;
    eprintln!(
        "produced {} result records ({} lines) in {:.1} s",
        a.records,
        want.lines,
        started.elapsed().as_secs_f64()
    );
    let (mut base, mut sunk, mut ratios) = (Vec::new(), Vec::<Cost>::new(), Vec::new());
    for round in 0..a.rounds.max(1) {
        let tag = format!("bench_sink_{}_{round}", std::process::id());
        let url = support::create_database(&a.database_url, &format!("{tag}_base"))?;
        let b = baseline(&url, &a)?;
        ensure!(
            stored(&url)? == want,
            "the baseline stored {:?}, not {want:?}",
            stored(&url)?
        );
        support::execute(&a.database_url, &format!("DROP DATABASE {tag}_base"))?;
        let url = support::create_database(&a.database_url, &format!("{tag}_sink"))?;
        let c = sink(&a, &broker, &url, &tag)?;
        ensure!(
            stored(&url)? == want,
            "the sink stored {:?}, not {want:?}",
            stored(&url)?
        );
        support::execute(&a.database_url, &format!("DROP DATABASE {tag}_sink"))?;
        eprintln!("round {round}: baseline {b:.2} s, sink {:.2} s", c.wall_s);
        ratios.push(b / c.wall_s);
        base.push(b);
        sunk.push(c);
    }
    let best_base = base.iter().copied().fold(f64::INFINITY, f64::min);
    let best_sink = sunk
        .iter()
        .copied()
        .min_by(|x, y| x.wall_s.total_cmp(&y.wall_s))
        .context("one round")?;
    let rate = |s: f64| a.records as f64 / s;
    let rows = (want.partials + want.lines) as f64;
    println!(
        "| run ({} result records, {} tenants, {} line rows; best of {}) | best seconds | records/s | rows/s | ratio | CPU s (sink process) |",
        a.records, a.tenants, want.lines, a.rounds.max(1)
    );
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| plain batched upsert loop (2,000 records a transaction) | {best_base:.2} | {:.0} | {:.0} | 1.00 | - |",
        rate(best_base),
        rows / best_base
    );
    println!(
        "| tally sink --until-end (Kafka → PostgreSQL) | {:.2} | {:.0} | {:.0} | {:.2} | {:.2} |",
        best_sink.wall_s,
        rate(best_sink.wall_s),
        rows / best_sink.wall_s,
        best_base / best_sink.wall_s,
        best_sink.cpu_s
    );
    let (lo, hi) = ratios.iter().fold((f64::INFINITY, 0f64), |(lo, hi), r| {
        (lo.min(*r), hi.max(*r))
    });
    println!();
    println!("Ratio per round (sink / baseline of the same round): {lo:.2}–{hi:.2}");
    Ok(())
}
