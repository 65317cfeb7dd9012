//! A partition's task rebuilt from the working copy within a memory budget,
//! streamed: after a restore has imported a checkpoint's chain (or at any cut
//! the store holds), `restore_task` builds the partition's `PartitionTask`
//! without ever holding the whole partition in memory.
//!
//! - Without a budget, the task is the whole partition (`StateStore::load`).
//! - Under a share of `keep` bytes: one scan of the partition's windows keeps
//!   open windows in memory, earliest end first (they fire first), while their
//!   `window_bytes` fit in half of `keep`; every other window (fired ones, and
//!   open ones beyond) stays in the store and is counted per end, exactly as an
//!   eviction would have left it (`engine::spill`). Then one scan of the dedup
//!   chunks moves the live ids to the cold tier (`engine::cold`) in sorted runs
//!   of at most `ID_RUN` ids — a run is held at once, never the partition's ids.
//! - Invariant, as after an eviction: every window is in memory or counted as
//!   stored, never both, and the store holds each one as the task has it (a
//!   restore or a commit just wrote it). Results are the same as from a whole
//!   load: where a window lives does not change what it holds.

use std::sync::Arc;

use super::stored::Models;
use super::{decode_window, end_from, NextOffset, StateError, StateStore};
use crate::engine::dedup::{unpack, Fingerprint};
use crate::engine::{window_bytes, EngineConfig, PartitionTask, WindowPhase, LINE_BYTES};
use crate::model::Partition;

/// Dedup ids held at once while a restore moves them to the cold tier
/// (24 bytes each in the run: 6 MiB).
pub(crate) const ID_RUN: usize = crate::engine::cold::MOVE_RUN;

/// Partition `p`'s task from the store, or `None` if it has no state there.
/// `keep`: the partition's share of `state.memory_budget` (`None`: no budget).
pub(crate) fn restore_task(
    store: &Arc<StateStore>,
    p: Partition,
    cfg: Arc<EngineConfig>,
    keep: Option<usize>,
) -> Result<Option<(PartitionTask, NextOffset)>, StateError> {
    let Some(keep) = keep else {
        return Ok(store.load(p)?.map(|(snap, next)| {
            let mut task = PartitionTask::restore(p, cfg, snap);
            task.attach_spill(store.clone());
            (task, next)
        }));
    };
    let Some(meta) = store.meta(p)? else {
        return Ok(None);
    };
    let mut snap = crate::engine::TaskSnapshot {
        watermark: Some(meta.watermark.clone()),
        counters: meta.counters,
        high_water: meta.high_water,
        ..Default::default()
    };
    let mut stored: Vec<(WindowPhase, i64, u64)> = Vec::new();
    let mut held = 0usize;
    let mut models = Models::default();
    store.scan(b'W', p.0, |rest, v, k| {
        let end = end_from(rest);
        let w = decode_window(k, v)?;
        let phase = w.phase();
        let tenant = std::str::from_utf8(&rest[8..]).map_err(|e| StateError::Corrupt {
            key: super::describe_key(k),
            msg: e.to_string(),
        })?;
        // Ends come in order: once one window does not fit, none later is kept.
        if phase == WindowPhase::Open && held < keep / 2 {
            let acc = w.acc(&mut models);
            let bytes = window_bytes(tenant) + acc.others.len() * LINE_BYTES;
            if held + bytes <= keep / 2 {
                held += bytes;
                snap.open.push(((end, tenant.into()), acc));
                return Ok(());
            }
            held = keep;
        }
        match stored.last_mut() {
            Some((ph, e, n)) if *ph == phase && *e == end => *n += 1,
            _ => stored.push((phase, end, 1)),
        }
        Ok(())
    })?;
    let watermark = meta.watermark.current();
    let mut task = PartitionTask::restore_stored(p, cfg, snap, &stored, store.clone());
    let mut run: Vec<(Fingerprint, i64)> = Vec::new();
    let mut moved = Ok(());
    let mut flush = |run: &mut Vec<(Fingerprint, i64)>, task: &mut PartitionTask| {
        // One expiry per id in a run (the largest: chunks may repeat an id);
        // a later run's expiries are larger (chunks come in expiry order).
        run.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        run.dedup_by(|later, first| later.0 == first.0);
        if moved.is_ok() {
            moved = task.restore_cold_ids(std::mem::take(run), keep);
        }
        run.clear();
    };
    store.scan(b'D', p.0, |rest, v, k| {
        let expiry = end_from(rest);
        if expiry <= watermark {
            return Ok(());
        }
        let ids = unpack(v).ok_or_else(|| StateError::Corrupt {
            key: super::describe_key(k),
            msg: "malformed dedup chunk".into(),
        })?;
        for id in ids {
            run.push((Fingerprint::of(id), expiry));
            if run.len() >= ID_RUN {
                flush(&mut run, &mut task);
            }
        }
        Ok(())
    })?;
    flush(&mut run, &mut task);
    moved.map_err(|msg| StateError::Corrupt {
        key: format!("dedup ids of partition {}", p.0),
        msg,
    })?;
    Ok(Some((task, meta.next_offset)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devtools::support::one_price_engine;
    use crate::engine::{RecordIn, Route};
    use crate::state::PartitionCommit;

    fn feed(task: &mut PartitionTask, id: &str, tenant: usize, ts: i64) -> (Route, String) {
        let rec = format!(
            r#"{{"request_id":"{id}","tenant_id":"tenant-{tenant}","model":"m","prompt_tokens":3,"completion_tokens":1,"completed_ts":{ts}}}"#
        );
        let mut out = Vec::new();
        let route = task
            .process(
                RecordIn {
                    payload: rec.as_bytes(),
                    kafka_ts: None,
                    now_ms: 0,
                },
                &mut out,
            )
            .expect("the state store reads back");
        (route, format!("{out:?}"))
    }

    /// A task restored within a small share holds few windows and no ids in
    /// memory, and decides and emits exactly what the whole task does.
    #[test]
    fn a_task_restored_within_its_share_decides_as_a_whole_one() {
        const T0: i64 = 1_767_261_600_000;
        let dir = std::env::temp_dir().join(format!("tally-bounded-{}", std::process::id()));
        let store = Arc::new(StateStore::open_fresh(&dir).unwrap());
        let cfg = one_price_engine(5 * 60_000);
        let p = Partition(3);
        let mut first = PartitionTask::new(p, cfg.clone());
        // 400 tenants over four minutes: the first minutes fire, none purges.
        for i in 0..1_600 {
            feed(&mut first, &format!("r{i}"), i % 400, T0 + i as i64 * 150);
        }
        let delta = first.drain_changes();
        store
            .commit(vec![PartitionCommit {
                partition: p,
                next_offset: NextOffset(1_600),
                delta,
            }])
            .unwrap();
        let (mut whole, at) = restore_task(&store, p, cfg.clone(), None).unwrap().unwrap();
        let (mut bounded, _) = restore_task(&store, p, cfg, Some(16 << 10))
            .unwrap()
            .unwrap();
        assert_eq!(at, NextOffset(1_600));
        assert_eq!(bounded.open_windows(), whole.open_windows());
        assert!(bounded.windows_in_memory() * 4 < whole.windows_in_memory());
        assert!(bounded.memory_bytes() <= 8 << 10);
        assert_eq!(bounded.dedup_ids(), 0, "every id moved out");
        assert_eq!(bounded.dedup_cold_stats().0, 1_600);
        // Duplicates, late events for fired windows, events for stored and
        // in-memory open windows, then a watermark that fires everything.
        for i in 0..2_400 {
            let (id, ts) = match i % 3 {
                0 => (format!("r{}", i % 1_600), T0 + (i % 1_600) as i64 * 150),
                1 => (format!("late{i}"), T0 + (i % 240) as i64 * 1_000),
                _ => (format!("new{i}"), T0 + 240_000 + i as i64 * 10),
            };
            let a = feed(&mut whole, &id, i % 500, ts);
            let b = feed(&mut bounded, &id, i % 500, ts);
            assert_eq!(a, b, "record {i}");
        }
        assert_eq!(
            feed(&mut whole, "end", 1, T0 + 3_600_000),
            feed(&mut bounded, "end", 1, T0 + 3_600_000)
        );
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
