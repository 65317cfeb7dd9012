//! `tally run`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::ConfigArg;
use crate::kafka::source::StartPolicy;
use crate::worker::{file, kafka};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Read JSON lines from this file instead of Kafka (needs --output-file).
    #[arg(long, value_name = "FILE", requires = "output_file")]
    pub input_file: Option<PathBuf>,
    /// Write one result payload per line here (with --input-file).
    #[arg(long, value_name = "FILE", requires = "input_file")]
    pub output_file: Option<PathBuf>,
    /// Stop at the log ends seen when partitions were assigned, emitting every open
    /// window as end of input (backfills, tests). The state keeps the pre-end cut.
    /// A bounded run is one worker: it waits until it owns every input partition.
    #[arg(long)]
    pub until_end: bool,
    /// Ignore the checkpoint store (and any committed offsets) for every partition
    /// this run is assigned, and rebuild their state from the log start. The way out
    /// of a refusal (missing or damaged checkpoints, changed configuration); results
    /// re-emitted with unchanged content are ignored by the sink.
    #[arg(long, value_enum, value_name = "WHERE")]
    pub reset_state: Option<ResetState>,
    /// Accept records deleted by the broker (retention, DeleteRecords) before tally
    /// read them: at a restore, at a fresh start on a log that no longer begins at
    /// 0, or while running behind the log start. Without it tally refuses, naming
    /// the partition and the offsets. Accepted gaps are never billed; they are
    /// logged (ACCEPTED GAP), counted in tally_offsets_gap_total and recorded in
    /// the checkpoint.
    #[arg(long)]
    pub allow_truncated_log: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum ResetState {
    Earliest,
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let cfg = a.config.load()?;
    if let (Some(input), Some(output)) = (&a.input_file, &a.output_file) {
        let c = file::run(&cfg, input, output)
            .with_context(|| format!("processing {}", input.display()))?;
        eprintln!(
            "consumed {} | folded {} | too late {} | dead letters {} | duplicates {} | panes {}",
            c.consumed, c.folded, c.too_late, c.dead_letter, c.duplicate, c.panes
        );
        return Ok(());
    }
    let opts = kafka::RunOptions {
        until_end: a.until_end,
        policy: StartPolicy {
            reset_state_earliest: matches!(a.reset_state, Some(ResetState::Earliest)),
            allow_truncated_log: a.allow_truncated_log,
        },
    };
    kafka::run(&cfg, opts)?;
    Ok(())
}
