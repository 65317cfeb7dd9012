//! The end of a bounded run (`PartitionTask::end_of_input_step`) under a
//! budget: byte-identical to no budget, a run of stored windows a step.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The end of a bounded run fires every open end a step at a time: an end
    /// with more evicted windows than a run reads them back a run at a time, and
    /// each step emits at most a run of stored windows besides the windows in
    /// memory — the same panes, in the same order, as without a budget.
    #[test]
    fn the_end_of_input_in_steps_changes_nothing(
        recs in records(),
        lateness in prop::sample::select(vec![0i64, 30_000, 120_000]),
        every in 1usize..10,
        keep in 0usize..3,
        fire_run in 1usize..3,
    ) {
        let mut plain = PartitionTask::new(Partition(0), cfg(lateness));
        let (_, mut want) = run(&mut plain, &recs);
        let from = want.len();
        plain.end_of_input(&mut want).unwrap();

        let store = Arc::new(MirrorStore::default());
        let mut t = PartitionTask::new(Partition(0), cfg(lateness));
        t.attach_spill(store.clone());
        t.set_fire_run(fire_run);
        let mut panes = run_to_the_end(&mut t, &store, &recs, every, keep * WINDOW_BYTES);
        let in_memory = t.windows_in_memory();
        let mut steps = 0;
        loop {
            let before = panes.len();
            let done = t.end_of_input_step(&mut panes).unwrap();
            let emitted = panes.len() - before;
            prop_assert!(emitted <= fire_run + in_memory, "a step emitted {}", emitted);
            steps += 1;
            if done {
                break;
            }
        }
        prop_assert!(steps >= (want.len() - from).div_ceil(fire_run + in_memory.max(1)));
        prop_assert_eq!(&panes, &want);
        prop_assert_eq!(t.counters(), plain.counters());
        prop_assert_eq!(t.windows_in_memory(), 0);
        prop_assert_eq!(t.memory_bytes(), t.recount_bytes());
    }
}

/// One open end of 200 tenants, all evicted, at the end of input: it is read
/// back in steps of 16 stored windows, and the panes are those of no budget.
#[test]
fn the_end_of_input_reads_a_large_end_in_steps() {
    let record = |i: usize| {
        format!(
            r#"{{"request_id":"r{i}","tenant_id":"t{:03}","model":"a","prompt_tokens":1,"completion_tokens":1,"completed_ts":{T0}}}"#,
            (i * 7) % 200
        )
    };
    let recs: Vec<String> = (0..200).map(record).collect();
    let mut plain = PartitionTask::new(Partition(0), cfg(30_000));
    let (_, mut want) = run(&mut plain, &recs);
    plain.end_of_input(&mut want).unwrap();
    assert_eq!(want.len(), 200);

    let store = Arc::new(MirrorStore::default());
    let mut t = PartitionTask::new(Partition(0), cfg(30_000));
    t.attach_spill(store.clone());
    t.set_fire_run(16);
    let mut panes = run_to_the_end(&mut t, &store, &recs, 50, 0);
    assert_eq!(t.windows_in_memory(), 0);
    let mut steps = 0;
    while !t.end_of_input_step(&mut panes).unwrap() {
        steps += 1;
    }
    assert!(steps >= 200 / 16, "{steps} steps");
    assert_eq!(panes, want);
    assert_eq!(t.counters(), plain.counters());
}

/// Routes `recs` a record at a time under a budget (a spill — `commit`, then
/// `evict` to `keep` bytes — every `every` records, between firing steps and
/// at the end), up to the end of input (not included); returns the panes.
fn run_to_the_end(
    t: &mut PartitionTask,
    store: &MirrorStore,
    recs: &[String],
    every: usize,
    keep: usize,
) -> Vec<ResultRecord> {
    let mut panes = Vec::new();
    let spill = |t: &mut PartitionTask| {
        store.commit(t.drain_changes());
        t.evict(keep).unwrap();
    };
    for (i, r) in recs.iter().enumerate() {
        t.process_step(rec(r), &mut panes).unwrap();
        while t.firing() {
            spill(t);
            t.resume_firing(&mut panes).unwrap();
        }
        if i % every == 0 {
            spill(t);
        }
    }
    spill(t);
    panes
}
