//! `tally config [check]`: the effective configuration, and whether a restart
//! under it would restore from the checkpoint store or be refused, and why.
//!
//! The check is the checkpoint side of the restore decision (`restore::plan`, the
//! same code a worker runs): which checkpoint each partition would restore from,
//! across which compatible config changes, or the refusal. The broker side (log
//! ranges, committed offsets, `restore::decide`) needs the partitions' assignment
//! and is decided when the worker starts.

use std::collections::BTreeSet;

use clap::{Args, Subcommand};

use super::ConfigArg;
use crate::base::error::Refusal;
use crate::checkpoint::restore::{plan, Try};
use crate::checkpoint::store::{found, CheckpointStore};
use crate::checkpoint::CheckpointError;
use crate::model::Partition;

#[derive(Args, Debug)]
pub struct ConfigCmd {
    #[command(subcommand)]
    pub action: Option<ConfigAction>,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Subcommand, Debug)]
pub enum ConfigAction {
    /// Validate the configuration, print it (secrets as ***), and say for every
    /// partition in the checkpoint store whether a restart would restore it —
    /// across which compatible changes — or be refused, and why (exit 3).
    Check(ConfigArg),
}

/// The librdkafka properties tally sets on the input consumer itself, as TOML
/// comments (they cannot be set under `[kafka]`).
fn owned_properties() -> String {
    let mut out = String::from(
        "\n# set by tally on the input consumer (refused under [kafka]; docs/DESIGN.md §7.5):\n",
    );
    for owned in crate::kafka::OWNED_CONSUMER_PROPERTIES {
        out.push_str(&format!("# \"{}\" = \"{}\"\n", owned.key, owned.value));
    }
    out
}

pub fn run(c: ConfigCmd) -> anyhow::Result<()> {
    let Some(ConfigAction::Check(arg)) = c.action else {
        print!("{}", c.config.load()?.effective_toml()?);
        print!("{}", owned_properties());
        return Ok(());
    };
    let cfg = arg.load()?;
    let engine = cfg.engine()?;
    println!("# configuration: valid");
    print!("{}", cfg.effective_toml()?);
    print!("{}", owned_properties());
    let rules = crate::checkpoint::rules(
        &cfg.topics.input,
        &engine,
        cfg.watermark.idle_timeout.0.map(|m| m.0),
        crate::config::rating::from_source,
    );
    let store = CheckpointStore::open_existing(&cfg.checkpoint, &cfg.kafka.group_id)?;
    let listed = store.list()?;
    let found = found(&listed);
    let partitions: BTreeSet<Partition> = found
        .checkpoints
        .iter()
        .flat_map(|(_, m)| m.partitions.iter().map(|e| e.partition))
        .collect();
    println!();
    println!("# restart under this configuration ({})", store.location());
    if partitions.is_empty() && found.unreadable.is_empty() {
        println!(
            "no checkpoints: every partition starts from its committed offset or the log start"
        );
        return Ok(());
    }
    let mut refused = Vec::new();
    // A listing with only unreadable manifests still decides (another format refuses).
    let all: Vec<Partition> = if partitions.is_empty() {
        vec![Partition(0)]
    } else {
        partitions.into_iter().collect()
    };
    for p in all {
        // No log end here (no broker is asked): no candidate is skipped for it.
        match plan(p, &found, &rules, Default::default(), None)
            .into_iter()
            .next()
        {
            Some(Try::Load {
                name,
                entry,
                changes,
            }) => {
                println!(
                    "partition {p}: restores from {name} at offset {}",
                    entry.next_offset.0
                );
                for change in changes {
                    println!("  compatible change: {change}");
                }
            }
            Some(Try::Skip { why, .. }) => println!("partition {p}: DAMAGED — {why}"),
            Some(Try::Refuse(why)) => {
                println!("partition {p}: REFUSED — {why}");
                refused.push(why);
            }
            None => println!("partition {p}: no checkpoint holds it"),
        }
    }
    match refused.first() {
        None => Ok(()),
        Some(first) => Err(CheckpointError::Refused(Refusal::new(
            first.kind,
            format!(
                "{} partition(s) would be refused at a restart; the first: {first}",
                refused.len()
            ),
        ))
        .into()),
    }
}
