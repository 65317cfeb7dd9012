//! `tally checkpoints list|verify`.

use clap::{Args, Subcommand};

use super::ConfigArg;
use crate::base::clock::now_ms;
use crate::checkpoint::store::CheckpointStore;
use crate::time::utc::format_utc_ms;

#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Subcommand, Debug)]
pub enum Action {
    /// Every checkpoint of the job's group: id, time, partitions, offsets, size, age.
    List(ConfigArg),
    /// Re-hash every file against its manifest; exit non-zero on any damage.
    Verify(ConfigArg),
}

fn open(c: &ConfigArg) -> anyhow::Result<CheckpointStore> {
    let cfg = c.load()?;
    Ok(CheckpointStore::open_existing(
        &cfg.checkpoint,
        &cfg.kafka.group_id,
    )?)
}

pub fn run(a: CheckpointsArgs) -> anyhow::Result<()> {
    match a.action {
        Action::List(c) => {
            let store = open(&c)?;
            println!("checkpoints of {}", store.location());
            println!(
                "{:<40} {:<24} {:>10} {:>10} {:>10} {:>5} {:>9}  offsets",
                "checkpoint", "created", "partitions", "written", "state", "chain", "age"
            );
            for l in store.list()? {
                let name = &l.name;
                match l.manifest {
                    None => println!("{name:<40} (incomplete: no MANIFEST)"),
                    Some(Err(e)) => println!("{name:<40} (unreadable: {e})"),
                    Some(Ok(m)) => {
                        // What this checkpoint wrote, what its chains reference
                        // (a restore reads that), and the longest chain.
                        let (written, state) = (m.written_bytes(), m.state_bytes());
                        let chain = m.partitions.iter().map(|e| e.segments.len()).max();
                        let offsets: Vec<String> = m
                            .partitions
                            .iter()
                            .map(|e| match e.offsets.gap_offsets {
                                0 => format!("{}:{}", e.partition, e.next_offset.0),
                                gap => format!("{}:{}(gap {gap})", e.partition, e.next_offset.0),
                            })
                            .collect();
                        let age = (now_ms() - m.created_at_ms).max(0) / 1000;
                        println!(
                            "{name:<40} {:<24} {:>10} {written:>10} {state:>10} {:>5} {:>8}s  {}",
                            format_utc_ms(m.created_at_ms),
                            m.partitions.len(),
                            chain.unwrap_or(0),
                            age,
                            offsets.join(" ")
                        );
                    }
                }
            }
            Ok(())
        }
        Action::Verify(c) => {
            let store = open(&c)?;
            let problems = store.verify()?;
            let n = store.list()?.len();
            if problems.is_empty() {
                println!("{n} checkpoint(s) verified: every file matches its manifest");
                Ok(())
            } else {
                for p in &problems {
                    println!("DAMAGED: {p}");
                }
                anyhow::bail!("{} problem(s) in {n} checkpoint(s)", problems.len())
            }
        }
    }
}
