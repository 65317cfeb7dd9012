//! Property tests of the engine's invariants (STYLE.md "Tests").

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::spill::WINDOW_BYTES;
use super::*;
use crate::model::{NanoPer1k, Partition, PriceEntry, PriceTable};
use crate::time::WindowSpec;

const T0: i64 = 1_767_261_600_000;
const BOUND: i64 = 5_000;

fn cfg(lateness: i64) -> Arc<EngineConfig> {
    let mut prices = PriceTable::default();
    prices.insert(
        "a",
        PriceEntry {
            effective_from_ms: i64::MIN,
            input: NanoPer1k(150_000),
            output: NanoPer1k(600_000),
        },
    );
    prices.insert(
        "b",
        PriceEntry {
            effective_from_ms: i64::MIN,
            input: NanoPer1k(3_000_000),
            output: NanoPer1k(15_000_000),
        },
    );
    prices.insert(
        "b",
        PriceEntry {
            effective_from_ms: T0 + 90_000,
            input: NanoPer1k(2_000_000),
            output: NanoPer1k(9_000_000),
        },
    );
    Arc::new(EngineConfig {
        window: WindowSpec::new(60_000, 0),
        allowed_lateness_ms: lateness,
        max_out_of_orderness_ms: BOUND,
        max_future_ms: None,
        time_source: TimeSource::CompletedTs,
        max_lead_ms: None,
        dedup_extra_ms: 3_600_000,
        max_record_bytes: 1 << 16,
        generation: 1,
        prices,
        rating: None,
        rating_source: String::new(),
        input: Default::default(),
    })
}

#[derive(Debug, Clone)]
struct Ev {
    id: u32,
    tenant: u8,
    model: &'static str,
    prompt: u64,
    completion: u64,
    ts: i64,
}

impl Ev {
    fn json(&self) -> String {
        format!(
            r#"{{"request_id":"r{}","tenant_id":"t{}","model":"{}","prompt_tokens":{},"completion_tokens":{},"completed_ts":{}}}"#,
            self.id, self.tenant, self.model, self.prompt, self.completion, self.ts
        )
    }
}

/// Arbitrary records: mostly valid events at arbitrary (possibly late) times, some
/// repeats of earlier ids, some garbage.
fn records() -> impl Strategy<Value = Vec<String>> {
    let ev = (
        0u32..400,
        0u8..4,
        prop::bool::ANY,
        0u64..5_000,
        0u64..2_000,
        0i64..400_000,
    )
        .prop_map(|(id, tenant, b, prompt, completion, dt)| {
            Ev {
                id,
                tenant,
                model: if b { "b" } else { "a" },
                prompt,
                completion,
                ts: T0 + dt,
            }
            .json()
        });
    let garbage = prop_oneof![
        Just("{".to_string()),
        Just(r#"{"request_id":"g","tenant_id":"t","model":"zzz","prompt_tokens":1,"completion_tokens":1,"completed_ts":1767261600000}"#.to_string()),
        Just(r#"{"request_id":"s","tenant_id":"t","model":"a","prompt_tokens":1,"completion_tokens":1,"completed_ts":1767261600}"#.to_string()),
    ];
    prop::collection::vec(prop_oneof![9 => ev, 1 => garbage], 0..300)
}

fn run(task: &mut PartitionTask, recs: &[String]) -> (Vec<Route>, Vec<ResultRecord>) {
    let mut out = Vec::new();
    let routes = recs
        .iter()
        .map(|r| {
            task.process(
                RecordIn {
                    payload: r.as_bytes(),
                    kafka_ts: None,
                    now_ms: T0,
                },
                &mut out,
            )
            .expect("no spill store")
        })
        .collect();
    (routes, out)
}

/// Newest pane per (tenant, window): what a sink converges to.
fn finals(panes: &[ResultRecord]) -> BTreeMap<(String, i64), ResultRecord> {
    let mut m: BTreeMap<(String, i64), ResultRecord> = BTreeMap::new();
    for p in panes {
        let e = m
            .entry((p.tenant_id.clone(), p.window_end))
            .or_insert_with(|| p.clone());
        if p.version > e.version {
            *e = p.clone();
        }
    }
    m
}

/// What the state store does with a task's windows, in memory: applies each
/// drained delta (changed windows, range purge), serves evicted windows back.
#[derive(Default)]
struct MirrorStore(
    std::sync::Mutex<BTreeMap<(i64, Box<str>), WindowAcc>>,
    std::sync::Mutex<BTreeMap<crate::engine::fpset::Fp, i64>>,
);

impl MirrorStore {
    fn commit(&self, delta: StateDelta) {
        let mut m = self.0.lock().unwrap();
        if let Some(through) = delta.purged_through {
            m.retain(|(end, _), _| *end > through);
        }
        for ((end, tenant), acc, _) in delta.changed {
            m.insert((end, tenant), acc);
        }
    }
}

impl crate::engine::cold::DedupStore for MirrorStore {
    fn cold_expiry(
        &self,
        _: Partition,
        fp: crate::engine::fpset::Fp,
    ) -> Result<Option<i64>, String> {
        Ok(self.1.lock().unwrap().get(&fp).copied())
    }
    fn put_cold(
        &self,
        _: Partition,
        entries: &[(crate::engine::fpset::Fp, i64)],
    ) -> Result<(), String> {
        assert!(
            entries.windows(2).all(|w| w[0].0 < w[1].0),
            "sorted, each once"
        );
        self.1.lock().unwrap().extend(entries.iter().copied());
        Ok(())
    }
}

impl spill::SpillStore for MirrorStore {
    fn window(&self, _: Partition, end: i64, tenant: &str) -> Result<Option<WindowAcc>, String> {
        Ok(self.0.lock().unwrap().get(&(end, tenant.into())).cloned())
    }
    fn windows_ending(&self, _: Partition, end: i64) -> Result<Vec<(Box<str>, WindowAcc)>, String> {
        let m = self.0.lock().unwrap();
        Ok(m.iter()
            .filter(|((e, _), _)| *e == end)
            .map(|((_, t), a)| (t.clone(), a.clone()))
            .collect())
    }
    fn windows_ending_after(
        &self,
        _: Partition,
        end: i64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Box<str>, WindowAcc)>, String> {
        let m = self.0.lock().unwrap();
        Ok(m.iter()
            .filter(|((e, t), _)| *e == end && after.is_none_or(|a| &**t > a))
            .take(limit)
            .map(|((_, t), a)| (t.clone(), a.clone()))
            .collect())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Every record takes exactly one route, and the audit balances after each.
    #[test]
    fn one_route_per_record_and_the_audit_balances(recs in records(), lateness in prop::sample::select(vec![0i64, 30_000])) {
        let mut task = PartitionTask::new(Partition(0), cfg(lateness));
        let mut out = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            task.process(RecordIn { payload: r.as_bytes(), kafka_ts: None, now_ms: T0 }, &mut out).unwrap();
            let c = task.counters();
            prop_assert!(c.balanced());
            prop_assert_eq!(c.consumed, i as u64 + 1);
        }
    }

    /// The watermark never decreases, and no pane is emitted twice with one version.
    #[test]
    fn watermark_is_monotone_and_versions_grow(recs in records()) {
        let mut task = PartitionTask::new(Partition(0), cfg(30_000));
        let mut out = Vec::new();
        let mut last = task.watermark();
        for r in &recs {
            task.process(RecordIn { payload: r.as_bytes(), kafka_ts: None, now_ms: T0 }, &mut out).unwrap();
            prop_assert!(task.watermark() >= last);
            last = task.watermark();
        }
        let mut seen: BTreeMap<(String, i64), u64> = BTreeMap::new();
        for p in &out {
            // What the engine emits, the sink stores (docs/DESIGN.md §6).
            prop_assert_eq!(crate::sink::check::storable(&crate::engine::SinkRecord::Window(p.clone()), &crate::sink::check::Topology::ANY), Ok(()));
            let v = seen.entry((p.tenant_id.clone(), p.window_end)).or_insert(0);
            prop_assert!(p.version > *v, "version did not grow: {:?}", p);
            *v = p.version;
        }
    }

    /// Final panes plus too-late events account for every valid, de-duplicated event.
    #[test]
    fn money_is_conserved(recs in records(), lateness in prop::sample::select(vec![0i64, 30_000])) {
        let c = cfg(lateness);
        let mut task = PartitionTask::new(Partition(0), c.clone());
        let (routes, mut panes) = run(&mut task, &recs);
        task.end_of_input(&mut panes).unwrap();
        let billed: u128 = finals(&panes).values().map(|p| p.cost_pico.0).sum();
        let mut late = 0u128;
        let mut all = 0u128;
        let mut seen = std::collections::BTreeSet::new();
        for (r, route) in recs.iter().zip(&routes) {
            let Ok(ev) = crate::model::event::parse(r.as_bytes()) else { continue };
            let Ok(cost) = c.prices.cost(&ev.model, ev.prompt_tokens, ev.completion_tokens, ev.completed_ts) else { continue };
            if ev.completed_ts < crate::model::event::MIN_MILLIS_TS || !seen.insert(ev.request_id.to_string()) {
                continue;
            }
            all += cost.0;
            if matches!(route, Route::TooLate { .. }) {
                late += cost.0;
            }
        }
        prop_assert_eq!(billed + late, all);
    }

    /// Step 1 done ahead (`Prepared`, as the file mode's reading thread does it) and
    /// the rest applied in batches of any size: the same routes, panes and state as
    /// one record at a time; with ids and tenants that JSON escapes (owned strings).
    #[test]
    fn prepared_batches_decide_as_one_record_at_a_time(
        recs in records(),
        sizes in prop::collection::vec(1usize..70, 1..8),
        escape in prop::collection::vec(prop::bool::ANY, 300),
    ) {
        let recs: Vec<String> = recs
            .into_iter()
            .zip(&escape)
            .map(|(r, &e)| if e { r.replacen(":\"t", ":\"\\u0074", 1).replacen(":\"r", ":\"\\u0072", 1) } else { r })
            .collect();
        let mut one = PartitionTask::new(Partition(0), cfg(30_000));
        let (routes, panes) = run(&mut one, &recs);
        let config = cfg(30_000);
        let mut batched = PartitionTask::new(Partition(0), config.clone());
        let (mut got_routes, mut got_panes) = (Vec::new(), Vec::new());
        let mut prepared = Prepared::default();
        let mut rest = &recs[..];
        for size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (now, later) = rest.split_at((*size).min(rest.len()));
            prepared.clear();
            for r in now {
                prepared.push(&config, RecordIn { payload: r.as_bytes(), kafka_ts: None, now_ms: T0 });
            }
            prop_assert_eq!(prepared.len(), now.len());
            batched.process_prepared(&prepared, 0..prepared.len(), T0, &mut got_panes, &mut got_routes).unwrap();
            rest = later;
        }
        prop_assert_eq!(got_routes, routes);
        prop_assert_eq!(got_panes, panes);
        prop_assert_eq!(batched.snapshot(), one.snapshot());
        prop_assert_eq!(batched.counters(), one.counters());
    }

    /// Snapshot anywhere and resume: the same outputs as one uninterrupted run.
    #[test]
    fn snapshot_and_resume_is_invisible(recs in records(), split in 0usize..300) {
        let split = split.min(recs.len());
        let mut whole = PartitionTask::new(Partition(0), cfg(30_000));
        let (routes, panes) = run(&mut whole, &recs);
        let mut first = PartitionTask::new(Partition(0), cfg(30_000));
        let (mut r1, mut p1) = run(&mut first, &recs[..split]);
        let mut second = PartitionTask::restore(Partition(0), cfg(30_000), first.snapshot());
        let (r2, p2) = run(&mut second, &recs[split..]);
        r1.extend(r2);
        p1.extend(p2);
        prop_assert_eq!(r1, routes);
        prop_assert_eq!(p1, panes);
        prop_assert_eq!(second.snapshot(), whole.snapshot());
    }

    /// Evicting windows to the store (as a tight memory budget does after every
    /// commit) changes no route, no pane and no pane order.
    #[test]
    fn spilling_windows_changes_nothing(
        recs in records(),
        lateness in prop::sample::select(vec![0i64, 30_000, 120_000]),
        every in 1usize..20,
        keep in 0usize..3,
    ) {
        let mut plain = PartitionTask::new(Partition(0), cfg(lateness));
        let (want_routes, mut want) = run(&mut plain, &recs);
        plain.end_of_input(&mut want).unwrap();

        let store = Arc::new(MirrorStore::default());
        let mut t = PartitionTask::new(Partition(0), cfg(lateness));
        t.attach_spill(store.clone());
        let (mut routes, mut panes) = (Vec::new(), Vec::new());
        for chunk in recs.chunks(every) {
            let (r, p) = run(&mut t, chunk);
            routes.extend(r);
            panes.extend(p);
            store.commit(t.drain_changes());
            prop_assert!(t.evict(keep * WINDOW_BYTES).is_ok());
            prop_assert!(t.memory_bytes() <= keep * WINDOW_BYTES);
            prop_assert_eq!(t.memory_bytes(), t.recount_bytes());
        }
        t.end_of_input(&mut panes).unwrap();
        prop_assert_eq!(routes, want_routes);
        prop_assert_eq!(panes, want);
        prop_assert_eq!(t.counters(), plain.counters());
    }

    /// Reordering events within the watermark bound changes no final pane.
    #[test]
    fn reordering_within_the_bound_changes_no_final_pane(
        n in 1usize..200,
        seed in any::<u64>(),
        block in 2usize..8,
    ) {
        let mut rng = crate::gen::Rng::new(seed);
        // Events 400 ms apart: a block of up to 8 spans < 3.2 s < BOUND.
        let evs: Vec<String> = (0..n)
            .map(|i| Ev { id: i as u32, tenant: (rng.below(3)) as u8, model: "b", prompt: rng.below(3000), completion: rng.below(900), ts: T0 + i as i64 * 400 }.json())
            .collect();
        let mut shuffled = evs.clone();
        for chunk in shuffled.chunks_mut(block) {
            for i in (1..chunk.len()).rev() {
                chunk.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let finals_of = |recs: &[String]| {
            let mut t = PartitionTask::new(Partition(0), cfg(0));
            let (routes, mut panes) = run(&mut t, recs);
            t.end_of_input(&mut panes).unwrap();
            assert!(routes.iter().all(|r| *r == Route::Window));
            finals(&panes)
        };
        prop_assert_eq!(finals_of(&evs), finals_of(&shuffled));
    }
}

/// Issue 19, defect 9: the memory budget is bytes, so the longest tenant ids (256
/// bytes, the id rule's limit) get about 2,300 windows into 1 MiB, not the 6,500 a
/// window count would allow; longer ones are dead letters (issue 33).
#[test]
fn the_memory_budget_holds_for_long_tenant_ids() {
    let budget = 1 << 20;
    let store = Arc::new(MirrorStore::default());
    let mut t = PartitionTask::new(Partition(0), cfg(60_000));
    t.attach_spill(store.clone());
    let record = |i: usize, len: usize| {
        format!(
            r#"{{"request_id":"r{i}","tenant_id":"{i:05}{}","model":"a","prompt_tokens":1,"completion_tokens":1,"completed_ts":{T0}}}"#,
            "t".repeat(len - 5)
        )
    };
    let (routes, _) = run(&mut t, &[record(0, 257), record(1, 10_000)]);
    assert!(routes.iter().all(|r| matches!(r, Route::DeadLetter(_))));
    let recs: Vec<String> = (0..5_000).map(|i| record(i, 256)).collect();
    for chunk in recs.chunks(500) {
        let (routes, _) = run(&mut t, chunk);
        assert!(routes.iter().all(|r| *r == Route::Window));
        store.commit(t.drain_changes());
        t.evict(budget).unwrap();
        assert!(
            t.memory_bytes() <= budget,
            "{} bytes held",
            t.memory_bytes()
        );
        assert_eq!(t.memory_bytes(), t.recount_bytes());
    }
    assert!(t.windows_in_memory() <= budget / 256);
    assert!(t.windows_in_memory() < 5_000, "nothing was evicted");
    assert_eq!(t.open_windows(), 5_000, "evicted windows are still held");
}

/// Routes `recs` through `t` as a driver under a budget does: a record at a
/// time (`process_step`) or in prepared batches of `batch`, and every end that
/// fires in steps resumed with a spill (`commit`, then `evict` to `keep`
/// bytes) between steps; a spill after every `every` records too. Returns the
/// routes, the panes and how many firing steps were resumed.
fn rec(r: &str) -> RecordIn<'_> {
    RecordIn {
        payload: r.as_bytes(),
        kafka_ts: None,
        now_ms: T0,
    }
}

fn run_stepped(
    t: &mut PartitionTask,
    store: &MirrorStore,
    recs: &[String],
    (batch, every, keep): (Option<usize>, usize, usize),
) -> (Vec<Route>, Vec<ResultRecord>, usize) {
    let (mut routes, mut panes, mut steps) = (Vec::new(), Vec::new(), 0);
    let spill = |t: &mut PartitionTask| {
        store.commit(t.drain_changes());
        t.evict(keep).unwrap();
        assert_eq!(t.memory_bytes(), t.recount_bytes());
    };
    let config = t.config().clone();
    let mut prepared = Prepared::default();
    for (i, chunk) in recs.chunks(batch.unwrap_or(1)).enumerate() {
        let mut done = 0;
        while done < chunk.len() {
            if batch.is_some() {
                prepared.clear();
                for r in &chunk[done..] {
                    prepared.push(&config, rec(r));
                }
                done += t
                    .process_prepared(&prepared, 0..prepared.len(), T0, &mut panes, &mut routes)
                    .unwrap();
            } else {
                routes.push(t.process_step(rec(&chunk[0]), &mut panes).unwrap());
                done += 1;
            }
            while t.firing() {
                spill(t);
                steps += 1;
                t.resume_firing(&mut panes).unwrap();
            }
        }
        if i % every == 0 {
            spill(t);
        }
    }
    t.end_of_input(&mut panes).unwrap();
    (routes, panes, steps)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Ends with more evicted windows than a firing run fire in steps, with
    /// spills (and evictions of the fired windows) between the steps: the same
    /// routes, panes and pane order as without a budget.
    #[test]
    fn firing_in_steps_changes_nothing(
        recs in records(),
        lateness in prop::sample::select(vec![0i64, 30_000, 120_000]),
        every in 1usize..10,
        keep in 0usize..3,
        fire_run in 1usize..3,
        batch in prop::option::of(1usize..40),
    ) {
        let mut plain = PartitionTask::new(Partition(0), cfg(lateness));
        let (want_routes, mut want) = run(&mut plain, &recs);
        plain.end_of_input(&mut want).unwrap();

        let store = Arc::new(MirrorStore::default());
        let mut t = PartitionTask::new(Partition(0), cfg(lateness));
        t.attach_spill(store.clone());
        t.set_fire_run(fire_run);
        let (routes, panes, _) = run_stepped(&mut t, &store, &recs, (batch, every, keep * WINDOW_BYTES));
        prop_assert_eq!(routes, want_routes);
        prop_assert_eq!(panes, want);
        prop_assert_eq!(t.counters(), plain.counters());
    }
}

/// One end of 200 tenants, all evicted, fires in steps of 16: each step emits
/// at most its run of stored windows, and the panes are those of no budget.
#[test]
fn a_large_end_fires_in_steps() {
    let record = |i: usize, tenant: usize, ts: i64| {
        format!(
            r#"{{"request_id":"r{i}","tenant_id":"t{tenant:03}","model":"a","prompt_tokens":1,"completion_tokens":1,"completed_ts":{ts}}}"#
        )
    };
    let mut recs: Vec<String> = (0..200).map(|i| record(i, (i * 7) % 200, T0)).collect();
    recs.push(record(1000, 0, T0 + 400_000));
    let mut plain = PartitionTask::new(Partition(0), cfg(30_000));
    let (want_routes, mut want) = run(&mut plain, &recs);
    plain.end_of_input(&mut want).unwrap();

    let store = Arc::new(MirrorStore::default());
    let mut t = PartitionTask::new(Partition(0), cfg(30_000));
    t.attach_spill(store.clone());
    t.set_fire_run(16);
    let (routes, panes, steps) = run_stepped(&mut t, &store, &recs, (None, 50, 0));
    assert!(steps >= 200 / 16, "{steps} steps");
    assert_eq!(routes, want_routes);
    assert_eq!(panes, want);
    assert_eq!(t.counters(), plain.counters());
}

mod end_of_input;
