//! `tally gen` under a rating (docs/reference/rating.md): records of the config's
//! rate book (`gen::rated`), every quantity at `/usage/<name>` and the variant at
//! `/<attribute>`, written to a file, and their bill per window and line item.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::config::Config;
use crate::gen::rated::{rated_stream, RatedOptions};
use crate::gen::GenOptions;

/// One window of the expected bill, as `--expected-file` writes it.
#[derive(Serialize)]
struct Window<'a> {
    tenant_id: &'a str,
    window_start: i64,
    cost_pico: String,
    requests: u64,
    lines: Vec<Line<'a>>,
}

#[derive(Serialize)]
struct Line<'a> {
    model: &'a str,
    variant: &'a str,
    plan: &'a str,
    quantity: &'a str,
    count: u64,
    cost_pico: String,
}

/// Writes the rated records of `opts` to `output` (the Kafka path produces today's
/// shape), their bill to `expected` if given, and returns how many records.
pub(super) fn run(
    cfg: &Config,
    opts: &GenOptions,
    output: Option<&Path>,
    expected: Option<&Path>,
) -> anyhow::Result<usize> {
    let Some(path) = output else {
        anyhow::bail!(
            "under a rating, `tally gen` writes --output-file (records with every declared \
             quantity at /usage/<name>); produce them with any Kafka client"
        );
    };
    let rating = cfg.rating.as_ref().context("no rating in the config")?;
    let engine = cfg.engine()?;
    let stream = rated_stream(
        &rating.book,
        engine.window,
        &RatedOptions {
            seed: opts.seed,
            count: usize::try_from(opts.count)?,
            tenants: (0..opts.tenants).map(|i| format!("tenant-{i}")).collect(),
            partitions: opts.partitions,
            start_ms: opts.start_ms,
            step_ms: opts.step_ms,
            max_jitter_ms: opts.jitter_ms,
            duplicates_ppm: opts.duplicate_per_million,
            late: 0,
        },
    );
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| path.display().to_string())?,
    );
    for (_, payload) in &stream.records {
        writeln!(out, "{payload}")?;
    }
    out.flush()?;
    if let Some(path) = expected {
        let windows: Vec<Window<'_>> = stream
            .expected
            .iter()
            .map(|((tenant, start), w)| Window {
                tenant_id: tenant,
                window_start: *start,
                cost_pico: w.cost.to_string(),
                requests: w.requests,
                lines: w
                    .lines
                    .iter()
                    .map(|((model, variant, plan, quantity), (count, cost))| Line {
                        model,
                        variant,
                        plan,
                        quantity,
                        count: *count,
                        cost_pico: cost.to_string(),
                    })
                    .collect(),
            })
            .collect();
        std::fs::write(path, serde_json::to_vec_pretty(&windows)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(stream.records.len())
}
