//! `tally demo`: the seed's retry-burst story, end to end, on embedded defaults.
//!
//! An in-process mock Kafka cluster, RocksDB in a temp dir, and — when a database
//! URL is given (`--database-url` or `TALLY_DEMO_DATABASE_URL`; `scripts/demo.sh`
//! starts a throw-away PostgreSQL) — the sink and the invoice view.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::config::{Config, Millis, PriceConfig};
use crate::engine::{PaneKind, ResultRecord, SinkRecord};
use crate::gen::{GenOptions, Generator};
use crate::kafka::outputs::{send, DeliveryTracker, UNTIMED};
use crate::kafka::read::read_topic;
use crate::kafka::{broker, client_config, headers, PRODUCER_DEFAULTS};
use crate::model::input::render::Fields;
use crate::model::input::{InputFormat, InputMapping};
use crate::time::utc::format_utc_ms;
use crate::worker::kafka::{run as run_worker, RunOptions};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// PostgreSQL to write the invoice view to (optional).
    #[arg(long, env = "TALLY_DEMO_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Keep the demo's state directory instead of deleting it.
    #[arg(long)]
    pub keep: bool,
    /// Send the traffic as CloudEvents 1.0 (structured JSON) and read it with
    /// `[input] format = "cloudevents"`.
    #[arg(long)]
    pub cloudevents: bool,
}

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const S: i64 = 1_000;

/// The seed's story, in delivery order: r-103/r-104 completed 10:00:40–59 but a
/// broker hiccup held them until after r-105 (10:01:09). Each request costs $0.10.
const STORY: &[(&str, i64)] = &[
    ("r-101", 5),
    ("r-102", 20),
    ("r-105", 69),
    ("r-103", 44),
    ("r-104", 52),
    ("r-106", 90),
    ("r-107", 130),
];

fn story_record(input: &InputMapping, id: &str, at_s: i64) -> String {
    let ts = T10 + at_s * S;
    input.render(&Fields {
        request_id: id,
        tenant_id: Some("acme"),
        model: "large",
        prompt_tokens: 1000,
        completion_tokens: 500,
        started_ts: ts - 2_000,
        completed_ts: ts,
        completed_raw: None,
    })
}

fn hhmmss(ms: i64) -> String {
    format_utc_ms(ms)[11..19].to_string()
}

fn demo_config(bootstrap: &str, dir: &std::path::Path) -> Config {
    let mut cfg = Config::default();
    cfg.kafka.bootstrap_servers = bootstrap.to_string();
    cfg.kafka
        .properties
        .insert("session.timeout.ms".into(), "6000".into());
    cfg.state.dir = dir.join("state");
    cfg.checkpoint.dir = dir.join("checkpoints");
    cfg.checkpoint.interval = Millis(1_000);
    let price = |i: &str, o: &str| PriceConfig {
        input_per_1k: i.into(),
        output_per_1k: o.into(),
        effective_from: None,
        schedule: vec![],
    };
    cfg.prices.insert("large".into(), price("0.05", "0.10"));
    cfg.prices
        .insert("small".into(), price("0.00015", "0.0006"));
    cfg.watermark.max_future = crate::config::OptMillis(None); // the story is in 2026-01-01
                                                               // The story is seven records over two minutes on a partition of its own: under
                                                               // the default lead limit they would not start the partition (it needs eight,
                                                               // and each record leads the last by more than the lateness), and every minute
                                                               // would close at end of input (docs/DESIGN.md §4.4). Every record moves the
                                                               // watermark here, as in the seed.
    cfg.watermark.max_lead = crate::config::MaxLead::Off;
    cfg
}

pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    // Not read through the config loader: its secrets are registered here.
    if let Some(url) = &a.database_url {
        crate::secrets::register_dsn(url);
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("tally-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let partitions = 4;
    let topics: Vec<(String, i32)> = [
        "requests",
        "tenant-cost",
        "tenant-cost.strict",
        "requests.late",
        "requests.dlq",
    ]
    .iter()
    .map(|t| (t.to_string(), partitions))
    .collect();
    let cluster = broker::start((&topics, 1), None, broker::GroupTimings::default(), None)?;
    let bootstrap = cluster.bootstrap_servers();
    let mut cfg = demo_config(&bootstrap, &dir);
    if a.cloudevents {
        cfg.input.format = InputFormat::Cloudevents;
    }
    println!("== tally demo ==================================================================");
    println!(
        "broker: librdkafka mock cluster at {bootstrap} (in process); state: {}",
        dir.display()
    );
    println!(
        "prices: large = $0.05 in / $0.10 out per 1k tokens (1000 in + 500 out = $0.10 a request)"
    );
    println!(
        "window: 1m, watermark bound 5s, allowed lateness 30s, max_lead off (every record moves the watermark, as in the seed)\n"
    );

    produce(&cfg)?;
    lenient(&cfg)?;
    strict(&cfg, &dir)?;

    // 4. PostgreSQL, when available.
    match &a.database_url {
        Some(url) => sink_and_show(&cfg, url)?,
        None => println!(
            "\n(no database: run scripts/demo.sh, or pass --database-url, to see the sink and the invoice view)"
        ),
    }
    drop(cluster);
    if !a.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
/// 1. Traffic: the story on partition 0, three more tenants on partitions 1-3.
fn produce(cfg: &Config) -> anyhow::Result<()> {
    let producer: BaseProducer<DeliveryTracker> = client_config(&cfg.kafka, PRODUCER_DEFAULTS)
        .create_with_context(DeliveryTracker::default())?;
    let input = cfg.input_mapping()?;
    for (id, at) in STORY {
        let payload = story_record(&input, id, *at);
        send(
            &producer,
            BaseRecord::with_opaque_to("requests", UNTIMED)
                .partition(0)
                .key("acme".as_bytes())
                .payload(payload.as_bytes()),
        )?;
    }
    let prices = cfg.price_table()?;
    let engine = cfg.engine()?;
    let opts = GenOptions {
        seed: 42,
        count: 3_000,
        tenants: 3,
        skew_milli: 1000,
        partitions: 3,
        start_ms: T10 + 5 * S,
        step_ms: 60,
        jitter_ms: 4_000,
        late_per_million: 0,
        duplicate_per_million: 10_000,
        malformed_per_million: 3_000,
    };
    let mut gen = Generator::new(
        opts,
        &prices,
        engine.window,
        engine.allowed_lateness_ms,
        engine.max_out_of_orderness_ms,
    )
    .with_max_lead(engine.max_lead_ms)
    .with_input(input.clone());
    for r in gen.by_ref() {
        let rec = BaseRecord::with_opaque_to("requests", UNTIMED)
            .partition(r.partition + 1)
            .key(r.key.as_bytes())
            .payload(r.payload.as_bytes());
        send(&producer, rec)?;
        producer.poll(std::time::Duration::ZERO);
    }
    producer.flush(std::time::Duration::from_secs(30))?;
    producer.context().take_failures()?;
    let expected = gen.expected();
    println!(
        "produced {} story records for acme + {} generated records for 3 tenants ({} duplicates, {} malformed)\n",
        STORY.len(),
        expected.records,
        expected.duplicates,
        expected.dead_letters.values().sum::<u64>()
    );
    Ok(())
}

/// 2. The job with allowed lateness 30 s.
fn lenient(cfg: &Config) -> anyhow::Result<()> {
    let counters = run_worker(
        cfg,
        RunOptions {
            until_end: true,
            ..Default::default()
        },
    )?;
    println!(
        "worker: consumed {} | folded {} | too late {} | dead letters {} | duplicates {} | panes {}",
        counters.consumed, counters.folded, counters.too_late, counters.dead_letter, counters.duplicate, counters.panes
    );
    let results = parse_results(&read_topic(&cfg.kafka, "tenant-cost")?)?;
    println!(
        "\nacme's panes on tenant-cost (event time decides the minute; the burst lands in 10:00):"
    );
    for r in results.iter().filter(|r| r.tenant_id == "acme") {
        println!(
            "  {}–{}  ${}  pane={:<7} index={} version={}",
            hhmmss(r.window_start),
            hhmmss(r.window_end),
            trim_usd(&r.usd),
            pane(r.pane),
            r.pane_index,
            r.version
        );
    }
    print_invoice(
        "invoice from the results topic (newest version per window and partition):",
        &results,
    );
    Ok(())
}

/// 3. The same input, allowed lateness 0: the burst is too late (requests.late).
fn strict(cfg: &Config, dir: &std::path::Path) -> anyhow::Result<()> {
    let mut strict = cfg.clone();
    strict.kafka.group_id = "tally-strict".into();
    strict.topics.results = "tenant-cost.strict".into();
    strict.window.allowed_lateness = Millis(0);
    strict.state.dir = dir.join("state-strict");
    run_worker(
        &strict,
        RunOptions {
            until_end: true,
            ..Default::default()
        },
    )?;
    let strict_results = parse_results(&read_topic(&cfg.kafka, "tenant-cost.strict")?)?;
    println!(
        "\nwith allowed_lateness = 0, acme's 10:00 window fires once and the burst is too late:"
    );
    for r in strict_results.iter().filter(|r| r.tenant_id == "acme") {
        println!(
            "  {}–{}  ${}  pane={}",
            hhmmss(r.window_start),
            hhmmss(r.window_end),
            trim_usd(&r.usd),
            pane(r.pane)
        );
    }
    println!("  on requests.late (original bytes, reason and coordinates in headers):");
    for l in read_topic(&cfg.kafka, "requests.late")? {
        println!(
            "    {}  reason={} window_end={} watermark={} source={}",
            String::from_utf8_lossy(&l.payload)
                .split(',')
                .next()
                .unwrap_or_default(),
            l.header(headers::REASON).unwrap_or("?"),
            l.header(headers::WINDOW_END)
                .map_or("?".into(), |v| v.parse().map_or(v.to_string(), hhmmss)),
            l.header(headers::WATERMARK)
                .map_or("?".into(), |v| v.parse().map_or(v.to_string(), hhmmss)),
            l.header(headers::SOURCE).unwrap_or("?"),
        );
    }
    let dlq = read_topic(&cfg.kafka, "requests.dlq")?;
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    for d in &dlq {
        *reasons
            .entry(d.header(headers::ERROR).unwrap_or("?").to_string())
            .or_default() += 1;
    }
    println!("\ndead letters on requests.dlq (both jobs): {reasons:?}");
    Ok(())
}

fn sink_and_show(cfg: &Config, url: &str) -> anyhow::Result<()> {
    let mut cfg = cfg.clone();
    cfg.sink.database_url = url.to_string();
    let summary = crate::sink::run::run(&cfg, crate::sink::run::SinkOptions { until_end: true })
        .context("sink")?;
    println!("\nsink: applied {} result records to PostgreSQL ({} rows changed, {} stale versions ignored)",
        summary.records, summary.rows_changed, summary.stale_ignored);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rows = rt.block_on(async {
        let client = crate::sink::connect(url).await?;
        let rows = client
            .query(
                "SELECT tenant_id, window_end, usd::TEXT, requests::TEXT FROM tenant_cost_minute \
                 ORDER BY tenant_id, window_end",
                &[],
            )
            .await?;
        Ok::<_, crate::sink::SinkError>(rows)
    })?;
    println!("SELECT * FROM tenant_cost_minute:");
    println!(
        "  {:<12} {:<8} {:>14} {:>8}",
        "tenant", "minute", "usd", "requests"
    );
    for r in rows {
        let (t, end, usd, n): (String, i64, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        println!(
            "  {t:<12} {:<8} {:>14} {n:>8}",
            hhmmss(end - 60_000),
            trim_usd(&usd)
        );
    }
    show_usage_api(&rt, url)
}

/// Ends the demo with the usage API (`tally api`) on a free port, asked with keys
/// as a client must: an hourly rollup in Berlin time, per model, with an admin
/// key; acme's invoice for January with a key of acme's alone.
fn show_usage_api(rt: &tokio::runtime::Runtime, url: &str) -> anyhow::Result<()> {
    use crate::api::keys::{self, Keys, Scope};
    let acme = Scope::parse("tenant:acme").map_err(anyhow::Error::msg)?;
    let (admin_key, admin_line) = keys::mint("demo-admin", &Scope::Admin, keys::random_bytes()?)
        .map_err(anyhow::Error::msg)?;
    let (acme_key, acme_line) =
        keys::mint("demo-acme", &acme, keys::random_bytes()?).map_err(anyhow::Error::msg)?;
    let keys = Keys::parse(&format!("{admin_line}\n{acme_line}\n")).map_err(anyhow::Error::msg)?;
    let addr = crate::api::spawn_local(url, crate::api::access::Access::with_keys(keys))?;
    let client = reqwest::Client::new();
    let get = |path: String, key: &str| {
        rt.block_on(async {
            let r = client
                .get(format!("http://{addr}{path}"))
                .bearer_auth(key)
                .send()
                .await?;
            let status = r.status();
            let text = r.text().await?;
            anyhow::ensure!(status.is_success(), "GET {path}: {status} {text}");
            let v: serde_json::Value = serde_json::from_str(&text)?;
            Ok::<_, anyhow::Error>((path, v, text))
        })
    };
    let (path, usage, _) = get(
        "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&window=hour&tz=Europe/Berlin&group_by=tenant&group_by=model"
            .into(),
        &admin_key,
    )?;
    println!(
        "
the usage API (tally api, every route but /healthz and /readyz needs a key), GET {path}
with an admin key:"
    );
    println!(
        "  {:<12} {:<26} {:<8} {:>14} {:>8} {:<5}",
        "tenant", "hour from (UTC)", "model", "usd", "requests", "final"
    );
    for r in usage["data"].as_array().into_iter().flatten() {
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        println!(
            "  {:<12} {:<26} {:<8} {:>14} {:>8} {:<5}",
            s("tenant_id"),
            s("window_start"),
            s("model"),
            trim_usd(&s("usd")),
            r["requests"],
            r["final"]
        );
    }
    println!(
        "  (final=false: a bounded run (--until-end) never declares a minute final; a live \
         worker does within watermark.idle_timeout (1m) of its partitions going quiet, \
         docs/DESIGN.md §6.1)"
    );
    let (path, invoice, _) = get(
        "/v1/invoices/acme?period=2026-01&tz=Europe/Berlin".into(),
        &acme_key,
    )?;
    println!(
        "
GET {path}, with a key scoped to tenant acme (any other tenant answers 404):
{}",
        serde_json::to_string_pretty(&invoice).unwrap_or_default()
    );
    Ok(())
}

fn parse_results(
    records: &[crate::kafka::read::StoredRecord],
) -> anyhow::Result<Vec<ResultRecord>> {
    let mut out = Vec::new();
    for r in records {
        // Progress records (finality) are for the sink.
        if let SinkRecord::Window(w) = SinkRecord::parse(&r.payload).context("parsing a result")? {
            out.push(w);
        }
    }
    out.sort_by(|a, b| {
        (a.window_end, &a.tenant_id, a.version).cmp(&(b.window_end, &b.tenant_id, b.version))
    });
    Ok(out)
}

/// Newest version per (tenant, window, partition), summed over partitions.
fn print_invoice(title: &str, results: &[ResultRecord]) {
    let mut newest: BTreeMap<(&str, i64, i32), &ResultRecord> = BTreeMap::new();
    for r in results {
        let e = newest
            .entry((&r.tenant_id, r.window_end, r.source_partition))
            .or_insert(r);
        if (r.generation, r.version) > (e.generation, e.version) {
            *e = r;
        }
    }
    let mut lines: BTreeMap<(&str, i64), (u128, u64)> = BTreeMap::new();
    for ((t, end, _), r) in newest {
        let l = lines.entry((t, end)).or_default();
        l.0 += r.cost_pico.0;
        l.1 += r.requests;
    }
    println!("\n{title}");
    println!(
        "  {:<12} {:<8} {:>14} {:>8}",
        "tenant", "minute", "usd", "requests"
    );
    for ((t, end), (pico, n)) in lines {
        println!(
            "  {t:<12} {:<8} {:>14} {n:>8}",
            hhmmss(end - 60_000),
            trim_usd(&crate::model::Pico(pico).usd_string())
        );
    }
}

fn trim_usd(s: &str) -> String {
    match s.split_once('.') {
        Some((i, f)) => format!("{i}.{}", &f[..f.len().min(6)]),
        None => s.to_string(),
    }
}

fn pane(p: PaneKind) -> &'static str {
    match p {
        PaneKind::OnTime => "on_time",
        PaneKind::Late => "late",
    }
}
