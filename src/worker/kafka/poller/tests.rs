//! How the poll thread cuts polled records into runs, and what a run gives back.

use proptest::prelude::*;

use super::*;
use crate::config::Config;
use crate::engine::{PartitionTask, Route};

fn engine() -> Arc<EngineConfig> {
    let text = "[prices.small]\ninput_per_1k = \"0.00015\"\noutput_per_1k = \"0.0006\"\n";
    Config::from_toml_with_env(text, std::iter::empty())
        .and_then(|c| c.engine())
        .expect("a valid config")
}

fn rec(
    partition: i32,
    offset: i64,
    key: Option<&'static [u8]>,
    payload: &'static [u8],
) -> Polled1<'static> {
    Polled1 {
        partition: Partition(partition),
        offset,
        kafka_ts: Some(offset * 10),
        key,
        payload,
    }
}

#[test]
fn runs_split_on_partition_offset_and_epoch() {
    let mut runs = Vec::new();
    // p0: 5, 6; p1: 9; p0: 7; p0 again at 3 (a refetch after a reassignment);
    // p0: 4 under a new epoch.
    for (r, epoch) in [
        (rec(0, 5, None, b"a"), 1),
        (rec(0, 6, Some(b"k"), b"bb"), 1),
        (rec(1, 9, None, b"c"), 1),
        (rec(0, 7, None, b"d"), 1),
        (rec(0, 3, None, b"e"), 1),
        (rec(0, 4, None, b"f"), 2),
    ] {
        append(&mut runs, r, epoch);
    }
    let shape: Vec<(i32, u64, Vec<i64>)> = runs
        .iter()
        .map(|r| {
            (
                r.partition.0,
                r.epoch,
                (0..r.len()).map(|i| r.offset(i)).collect(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (0, 1, vec![5, 6]),
            (1, 1, vec![9]),
            (0, 1, vec![7]),
            (0, 1, vec![3]),
            (0, 2, vec![4]),
        ]
    );
    assert_eq!(runs[0].key(0), None);
    assert_eq!(runs[0].key(1), Some(&b"k"[..]));
    assert_eq!(runs[0].payload(1), b"bb");
    assert_eq!(runs[0].kafka_ts(1), Some(60));
}

proptest! {
    /// `within` is exactly the records whose offsets fall in `[from, to)`.
    #[test]
    fn within_is_the_offsets_in_range(
        gaps in prop::collection::vec(1i64..4, 0..40),
        from in 0i64..100,
        len in 0i64..100,
    ) {
        let mut run = Run::new(Partition(0), 1);
        let mut offset = 0;
        for g in gaps {
            offset += g;
            run.push(rec(0, offset, None, b"x"));
        }
        let to = from + len;
        let got: Vec<usize> = run.within(from, to).collect();
        let want: Vec<usize> = (0..run.len())
            .filter(|&i| (from..to).contains(&run.offset(i)))
            .collect();
        prop_assert_eq!(got, want);
    }
}

/// Prepared on the poll thread, a run routes as the same records through
/// `process_batch` do: the loop may apply either (the second when a price reload
/// replaced the configuration the run was prepared under).
#[test]
fn a_prepared_run_routes_as_its_records() {
    let cfg = engine();
    let t = 1_767_261_600_000i64;
    let payloads: Vec<String> = (0..50)
        .map(|i| match i % 7 {
            // Dead letters and a duplicate among the valid ones.
            3 => "{\"request_id\":1}".to_string(),
            5 => format!("{{\"request_id\":\"r-{}\",\"tenant_id\":\"t\",\"model\":\"small\",\"prompt_tokens\":1,\"completion_tokens\":2,\"completed_ts\":{}}}", i - 1, t + i * 1000),
            _ => format!("{{\"request_id\":\"r-{i}\",\"tenant_id\":\"t{}\",\"model\":\"small\",\"prompt_tokens\":{i},\"completion_tokens\":2,\"completed_ts\":{}}}", i % 3, t + i * 7000),
        })
        .collect();
    let leaked: Vec<&'static [u8]> = payloads
        .iter()
        .map(|p| &*Box::leak(p.clone().into_bytes().into_boxed_slice()))
        .collect();
    let mut runs = Vec::new();
    for (i, p) in leaked.iter().enumerate() {
        append(&mut runs, rec(0, i as i64, None, p), 1);
    }
    prepare(&mut runs, &cfg, t);
    let run = &runs[0];
    let range = run.within(10, 45);
    let (mut a, mut b) = (
        PartitionTask::new(Partition(0), cfg.clone()),
        PartitionTask::new(Partition(0), cfg.clone()),
    );
    let (mut panes_a, mut panes_b, mut routes_a, mut routes_b) = (
        Vec::new(),
        Vec::new(),
        Vec::<Route>::new(),
        Vec::<Route>::new(),
    );
    a.process_prepared(&run.prepared, range.clone(), t, &mut panes_a, &mut routes_a)
        .unwrap();
    let recs: Vec<_> = range.clone().map(|i| run.record_in(i, t)).collect();
    b.process_batch(&recs, &mut panes_b, &mut routes_b).unwrap();
    assert_eq!(routes_a.len(), 35);
    assert_eq!(format!("{routes_a:?}"), format!("{routes_b:?}"));
    assert_eq!(format!("{panes_a:?}"), format!("{panes_b:?}"));
    assert_eq!(a.counters(), b.counters());
    assert!(a.counters().dead_letter > 0 && a.counters().duplicate > 0);
}
