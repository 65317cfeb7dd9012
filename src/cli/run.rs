//! `tally run`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::{ConfigArg, Interrupted};
use crate::kafka::source::StartPolicy;
use crate::worker::{file, kafka};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Read JSON lines from this file instead of Kafka (needs --output-file). A FIFO or
    /// /dev/stdin works too. SIGTERM/SIGINT stop it at the last line read, checkpointed,
    /// with exit status 143/130.
    #[arg(long, value_name = "FILE", requires = "output_file")]
    pub input_file: Option<PathBuf>,
    /// Write one result payload per line here (with --input-file), too-late records
    /// to FILE.late.jsonl and dead letters to FILE.dlq.jsonl. None may be the input.
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
    /// 0, or while running behind the log start — every such gap, for as long as the
    /// flag is given. Without it tally refuses, naming the partition and the
    /// offsets. Accepted gaps are never billed; they are logged (ACCEPTED GAP),
    /// counted in tally_offsets_gap_total and recorded in the checkpoint.
    #[arg(long)]
    pub allow_truncated_log: bool,
    /// Start each partition that has no checkpoint yet (a new consumer group) at its
    /// log start when the log no longer begins at 0: a one-time choice. The records
    /// deleted before it are not billed; the gap is logged (STARTED AT LOG START),
    /// counted in tally_offsets_gap_total and recorded in the checkpoint. A
    /// partition with a checkpoint ignores the flag, and any later gap is refused
    /// unless --allow-truncated-log.
    #[arg(long)]
    pub start_at_log_start: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum ResetState {
    Earliest,
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let cfg = a.config.load()?;
    if let (Some(input), Some(output)) = (&a.input_file, &a.output_file) {
        let r = file::run(&cfg, input, output)
            .with_context(|| format!("processing {}", input.display()))?;
        let c = &r.counters;
        eprintln!(
            "consumed {} | folded {} | too late {} | dead letters {} | duplicates {} | panes {}",
            c.consumed, c.folded, c.too_late, c.dead_letter, c.duplicate, c.panes
        );
        return match r.interrupted {
            None => Ok(()),
            Some(signal) => Err(Interrupted {
                signal,
                lines: r.lines,
                input: input.clone(),
            }
            .into()),
        };
    }
    let opts = kafka::RunOptions {
        until_end: a.until_end,
        config_path: a.config.config.clone(),
        policy: StartPolicy {
            reset_state_earliest: matches!(a.reset_state, Some(ResetState::Earliest)),
            allow_truncated_log: a.allow_truncated_log,
            start_at_log_start: a.start_at_log_start,
        },
    };
    kafka::run(&cfg, opts)?;
    Ok(())
}
