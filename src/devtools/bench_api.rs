//! `tally-dev bench-api`: the usage API's latency per query, and PostgreSQL's plan
//! of every statement each query runs, at several tenant counts.
//!
//! Per tenant count, a fresh database of the cluster given, migrated by the sink's
//! migrations and seeded in SQL (`SEED`): one tenant (`tenant-000000`) with every
//! minute of January 2026, and every tenant with a window an hour on 15 January and
//! a window a day on the other days of January, each with one line item. Then
//! `tally api` (the release binary, a child process, an admin key minted by `tally
//! api-key create`, no rate limit) answers each query `--requests` times in a row
//! after `WARMUP` answers, over one kept-alive connection; every answer must be 200.
//! Reported: p50, p99 and max of the request latencies, and the answer's size.
//!
//! The plans: the same queries through the API's own code (`api::usage`) on a
//! connection with `auto_explain` (every statement, `ANALYZE`, `BUFFERS`, as
//! notices), written to `--plans`; the table says whether any statement of a
//! one-tenant query scanned `tenant_cost_partial` sequentially.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Args;

use super::support;

#[derive(Args, Debug)]
pub struct BenchApiArgs {
    /// A PostgreSQL cluster's URL (a superuser: `CREATE DATABASE`, `LOAD
    /// 'auto_explain'`); each tenant count gets a database of its own there.
    #[arg(long, env = "TALLY_BENCH_PG_URL")]
    pub database_url: String,
    /// The tenant counts to measure, each seeded afresh.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    pub tenants: Vec<u32>,
    /// Timed requests per query (at most).
    #[arg(long, default_value_t = 100)]
    pub requests: usize,
    /// Seconds of timed requests per query, after which a query stops at its 10th
    /// request or later (a slow query then reports fewer).
    #[arg(long, default_value_t = 60)]
    pub budget_secs: u64,
    /// Scratch directory (config, keys, the API's log).
    #[arg(long, default_value = "/tmp/tally-bench-api")]
    pub dir: PathBuf,
    /// Where to write the plans (Markdown).
    #[arg(long, default_value = "/tmp/tally-bench-api/plans.md")]
    pub plans: PathBuf,
}

const WARMUP: usize = 3;

/// January 2026 (ms): its start, 15 January, 1 February.
const JAN: i64 = 1_767_225_600_000;
const JAN_15: i64 = JAN + 14 * 86_400_000;
const FEB: i64 = JAN + 31 * 86_400_000;

/// `$TENANTS` tenants' windows, then their lines (statistics after: `seeded`).
const SEED: &str = "
INSERT INTO tenant_cost_partial (tenant_id, window_end, source_partition, window_start,
    cost_pico, requests, prompt_tokens, completion_tokens, version, generation, pane, pane_index)
SELECT 'tenant-000000', s + 60000, 0, s, 1500000000, 3, 1500, 300, 3, 1, 'on_time', 0
FROM generate_series($JAN::INT8, $FEB::INT8 - 60000, 60000) s;
INSERT INTO tenant_cost_partial (tenant_id, window_end, source_partition, window_start,
    cost_pico, requests, prompt_tokens, completion_tokens, version, generation, pane, pane_index)
SELECT 'tenant-' || lpad(t::TEXT, 6, '0'), x.s + 60000, t % 8, x.s,
       (1 + t % 7)::NUMERIC * 500000000, 1 + t % 7, (1 + t % 7) * 500, (1 + t % 7) * 100, 1 + t % 7,
       1, 'on_time', 0
FROM generate_series(1, $TENANTS - 1) t,
     LATERAL (SELECT $JAN_15::INT8 + h * 3600000 + (t % 60) * 60000 AS s
              FROM generate_series(0, 23) h
              UNION ALL
              SELECT $JAN::INT8 + d::INT8 * 86400000 + 43200000 + (t % 60) * 60000
              FROM generate_series(0, 30) d WHERE d <> 14) x;
INSERT INTO tenant_cost_line_partial
SELECT tenant_id, window_end, source_partition,
       CASE WHEN (window_start / 60000) % 2 = 0 THEN 'large' ELSE 'small' END,
       window_start, cost_pico, requests, prompt_tokens, completion_tokens, version, generation
FROM tenant_cost_partial;";

/// The queries: a name, the path, and whether it reads one tenant.
fn queries() -> Vec<(&'static str, String, bool)> {
    let month = "from=2026-01-01T00:00:00Z&to=2026-02-01T00:00:00Z";
    vec![
        (
            "usage: one tenant, a month of minutes (all 44,640 in one page)",
            format!("/v1/usage?tenant_id=tenant-000000&{month}&window=minute&limit=100000"),
            true,
        ),
        (
            "usage: one tenant, a month by day",
            format!("/v1/usage?tenant_id=tenant-000000&{month}&window=day"),
            true,
        ),
        (
            "usage: all tenants, a day by hour (first page, 1,000 rows)",
            "/v1/usage?from=2026-01-15T00:00:00Z&to=2026-01-16T00:00:00Z&window=hour".into(),
            false,
        ),
        (
            "invoice: the tenant with every minute",
            "/v1/invoices/tenant-000000?period=2026-01".into(),
            true,
        ),
        (
            "invoice: a tenant with 54 windows",
            "/v1/invoices/tenant-000123?period=2026-01".into(),
            true,
        ),
    ]
}

/// A database of `tenants` tenants, seeded; its URL.
fn seeded(a: &BenchApiArgs, tenants: u32) -> anyhow::Result<String> {
    let name = format!("bench_api_{tenants}_{}", std::process::id());
    let url = support::create_database(&a.database_url, &name)?;
    let started = Instant::now();
    rt()?.block_on(async {
        let mut client = crate::sink::connect(&url).await?;
        crate::sink::migrate::run(&mut client).await?;
        let sql = SEED
            .replace("$TENANTS", &tenants.to_string())
            .replace("$JAN_15", &JAN_15.to_string())
            .replace("$JAN", &JAN.to_string())
            .replace("$FEB", &FEB.to_string());
        client.batch_execute(&sql).await?;
        client.batch_execute("VACUUM ANALYZE").await?;
        anyhow::Ok(())
    })?;
    let rows = support::query(&url, "SELECT count(*)::TEXT FROM tenant_cost_partial")?;
    eprintln!(
        "seeded {tenants} tenants: {} partials (and as many lines) in {:.0} s",
        rows[0][0].as_deref().unwrap_or("?"),
        started.elapsed().as_secs_f64()
    );
    Ok(url)
}

fn rt() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `tally api` on a free port with an admin key: the child, its address, the key.
fn start_api(a: &BenchApiArgs, url: &str, tag: &str) -> anyhow::Result<(Child, String, String)> {
    let tally = support::tally_beside_me()?;
    let (cfg, keys, log) = (
        a.dir.join(format!("{tag}.toml")),
        a.dir.join(format!("{tag}.keys")),
        a.dir.join(format!("{tag}.log")),
    );
    let _ = std::fs::remove_file(&keys);
    std::fs::write(
        &cfg,
        format!(
            "[sink]\ndatabase_url = \"{url}\"\n[api]\nlisten = \"127.0.0.1:0\"\nkeys = \"{}\"\n\
             rate_limit = 0\nquery_timeout = \"120s\"\n",
            keys.display()
        ),
    )?;
    let out = Command::new(&tally)
        .args([
            "api-key", "create", "--id", "bench", "--scope", "admin", "--config",
        ])
        .arg(&cfg)
        .output()?;
    ensure!(out.status.success(), "tally api-key create: {out:?}");
    let key = String::from_utf8(out.stdout)?.trim().to_string();
    let child = Command::new(&tally)
        .args(["api", "--config"])
        .arg(&cfg)
        .env("TALLY_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("usage API: serving")) {
            let addr = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("addr="))
                .context("the API's log names no address")?;
            return Ok((child, addr.to_string(), key));
        }
        if Instant::now() > deadline {
            bail!("tally api did not start within 30 s: {text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Latencies of `n` answers to `path` (after the warm-up), and the answer's bytes.
async fn timed(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    path: &str,
    (n, budget): (usize, Duration),
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let (mut times, mut bytes) = (Vec::with_capacity(n), 0);
    let began = Instant::now();
    for i in 0..WARMUP + n {
        if times.len() >= 10 && began.elapsed() > budget {
            break;
        }
        let started = Instant::now();
        let r = http
            .get(format!("{base}{path}"))
            .bearer_auth(key)
            .send()
            .await?;
        let status = r.status();
        let body = r.bytes().await?;
        let took = started.elapsed();
        ensure!(status.is_success(), "{path}: {status}: {body:?}");
        bytes = body.len();
        if i >= WARMUP {
            times.push(took);
        }
    }
    times.sort();
    Ok((times, bytes))
}

/// The `q`-th quantile (per mille) of sorted `times`, in milliseconds.
fn ms(times: &[Duration], per_mille: usize) -> f64 {
    let i = ((times.len() * per_mille).div_ceil(1000)).clamp(1, times.len()) - 1;
    times[i].as_secs_f64() * 1e3
}

/// One tenant count: seed, serve, time every query, capture their plans.
fn one_scale(a: &BenchApiArgs, tenants: u32, plans: &mut String) -> anyhow::Result<()> {
    let url = seeded(a, tenants)?;
    let tag = format!("api-{tenants}");
    let (mut child, addr, key) = start_api(a, &url, &tag)?;
    let base = format!("http://{addr}");
    let result = rt()?.block_on(async {
        let http = reqwest::Client::new();
        let mut out = Vec::new();
        for (name, path, one) in queries() {
            let limit = (a.requests, Duration::from_secs(a.budget_secs));
            let (times, bytes) = timed(&http, &base, &key, &path, limit).await?;
            let explained = super::bench_api_plans::explain(&url, &path).await?;
            let seq = explained.contains("Seq Scan on tenant_cost_partial");
            plans.push_str(&format!(
                "\n### {name}, {tenants} tenants\n\n`GET {path}`\n\n```\n{}\n```\n",
                explained.trim_end()
            ));
            out.push((name, times, bytes, one, seq));
        }
        anyhow::Ok(out)
    });
    let _ = child.kill();
    let _ = child.wait();
    let rows = result?;
    for (name, times, bytes, one, seq) in rows {
        let scan = match (one, seq) {
            (_, false) => "no",
            (true, true) => "**yes** (one tenant)",
            (false, true) => "yes",
        };
        println!(
            "| {name} | {tenants} | {} | {:.1} | {:.1} | {:.1} | {} | {scan} |",
            times.len(),
            ms(&times, 500),
            ms(&times, 990),
            times.last().map_or(0.0, |t| t.as_secs_f64() * 1e3),
            bytes
        );
    }
    support::execute(
        &a.database_url,
        &format!("DROP DATABASE bench_api_{tenants}_{}", std::process::id()),
    )?;
    Ok(())
}

pub fn run(a: BenchApiArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir)?;
    println!(
        "| query (one connection, after {WARMUP} untimed) | tenants | requests | p50 ms | p99 ms | max ms | answer bytes | seq scan of tenant_cost_partial |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let mut plans = String::from(
        "<!-- Written by `tally-dev bench-api` (auto_explain: ANALYZE, BUFFERS, every statement). -->\n",
    );
    for &t in &a.tenants {
        one_scale(&a, t, &mut plans)?;
    }
    std::fs::write(&a.plans, plans).with_context(|| a.plans.display().to_string())?;
    eprintln!("plans written to {}", a.plans.display());
    Ok(())
}
