//! Where each partition's replay starts (docs/DESIGN.md §6.2): the newest
//! complete checkpoint of the config's consumer group whose snapshot of the
//! partition was taken before any record of the windows, restored as a worker
//! restores it (`CheckpointStore::restore_where`, `state::bounded`); else a
//! fresh task at the log start. I/O: the checkpoint store, and a throw-away
//! RocksDB store the snapshots are imported into (`Scratch`, removed on drop).
//!
//! Invariant: a start never hides a record of the windows. A snapshot is taken
//! as a start only under `time_source = "completed_ts"` (the event time is the
//! `completed_ts`), when its format records the partition's high-water
//! `completed_ts` (5 on) and that is before the windows' start — so every valid
//! record before it belongs to an earlier window —, and when it resumes at or
//! above the log start and at or below the log end. Dead letters before it are
//! on the dead-letter topic (`outside`). A store or a checkpoint that cannot be
//! read or restored under the config (damage, another configuration) is no
//! start: its reason becomes a note, and the partition is replayed from its log
//! start.

use std::path::PathBuf;
use std::sync::Arc;

use super::CheckpointStart;
use crate::checkpoint::store::CheckpointStore;
use crate::config::Config;
use crate::engine::{EngineConfig, PartitionTask, TimeSource};
use crate::model::Partition;
use crate::state::StateStore;

/// The throw-away store the snapshots are imported into; removed on drop (after
/// the tasks that spill to it).
pub struct Scratch {
    store: Arc<StateStore>,
    dir: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A partition's restored task and the checkpoint it came from.
pub type Resumed = (PartitionTask, CheckpointStart);

/// Per partition (by index, `bounds` its `(log_start, log_end)`), the restored
/// task to start its replay from, if any; the scratch store they live in; and a
/// note for every start that could not be made.
pub fn starts(
    cfg: &Config,
    engine: &Arc<EngineConfig>,
    window_start: i64,
    bounds: &[(i64, i64)],
) -> (Vec<Option<Resumed>>, Option<Scratch>, Vec<String>) {
    let none = || bounds.iter().map(|_| None).collect();
    if engine.time_source != TimeSource::CompletedTs {
        return (none(), None, Vec::new());
    }
    let store = match CheckpointStore::open_existing(&cfg.checkpoint, &cfg.kafka.group_id) {
        Ok(s) => s,
        Err(e) => {
            let note =
                format!("no checkpoint read ({e}): every partition is replayed from its log start");
            return (none(), None, vec![note]);
        }
    };
    let dir = std::env::temp_dir().join(format!(
        "tally-explain-{}-{}",
        std::process::id(),
        crate::base::clock::now_ms()
    ));
    let scratch = match StateStore::open_fresh(&dir) {
        Ok(s) => Scratch {
            store: Arc::new(s),
            dir,
        },
        Err(e) => {
            let note =
                format!("no scratch store for checkpoints ({e}): replayed from the log start");
            return (none(), None, vec![note]);
        }
    };
    let rules = crate::checkpoint::rules(
        &cfg.topics.input,
        engine,
        cfg.watermark.idle_timeout.0.map(|m| m.0),
        crate::config::rating::from_source,
    );
    let listed = match store.list() {
        Ok(l) => l,
        Err(e) => {
            let note = format!(
                "checkpoints not listed ({e}): every partition is replayed from its log start"
            );
            return (none(), None, vec![note]);
        }
    };
    let mut notes = Vec::new();
    let mut out = Vec::with_capacity(bounds.len());
    for (p, &(log_start, log_end)) in bounds.iter().enumerate() {
        let p = Partition(p as i32);
        let usable = |format: u16, e: &crate::checkpoint::PartitionEntry| {
            format >= 5
                && (log_start..=log_end).contains(&e.next_offset.0)
                && e.high_water.is_none_or(|h| h < window_start)
        };
        let resumed = store
            .restore_where((p, log_end), &listed, usable, &rules, &scratch.store)
            .map_err(|e| e.to_string())
            .and_then(|r| {
                let Some(r) = r else { return Ok(None) };
                let task =
                    crate::state::bounded::restore_task(&scratch.store, p, engine.clone(), None)
                        .map_err(|e| e.to_string())?
                        .map(|(task, _)| task)
                        .ok_or_else(|| {
                            format!(
                                "checkpoint {} holds no state of the partition",
                                r.checkpoint
                            )
                        })?;
                let start = CheckpointStart {
                    name: r.checkpoint,
                    next_offset: r.next_offset.0,
                    high_water: r.meta.high_water.flatten(),
                };
                Ok(Some((task, start)))
            });
        match resumed {
            Ok(r) => out.push(r),
            Err(e) => {
                notes.push(format!(
                    "partition {p}: no checkpoint to start from ({e}); replayed from its log start"
                ));
                out.push(None);
            }
        }
    }
    (out, Some(scratch), notes)
}
