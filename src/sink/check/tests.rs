use super::*;
use crate::engine::{LineItem, PaneKind, ResultKind};

fn line(model: &str, requests: u64, cost: u128) -> LineItem {
    LineItem {
        model: model.into(),
        requests,
        prompt_tokens: requests * 10,
        completion_tokens: requests * 5,
        cost_pico: Pico(cost),
        ..LineItem::default()
    }
}

fn pane() -> ResultRecord {
    let lines = vec![line("large", 1, 7), line("small", 2, 5)];
    ResultRecord {
        kind: ResultKind::Window,
        tenant_id: "acme".into(),
        window_start: 0,
        window_end: 60_000,
        cost_pico: Pico(12),
        usd: Pico(12).usd_string(),
        requests: 3,
        prompt_tokens: 30,
        completion_tokens: 15,
        source_partition: 0,
        version: 3,
        pane: PaneKind::OnTime,
        pane_index: 0,
        generation: 1,
        lines,
    }
}

fn adjustment() -> AdjustmentRecord {
    AdjustmentRecord {
        kind: ResultKind::Adjustment,
        request_id: "r-1".into(),
        tenant_id: "acme".into(),
        model: "small".into(),
        window_start: 0,
        window_end: 60_000,
        cost_pico: Pico(5),
        usd: Pico(5).usd_string(),
        prompt_tokens: 1,
        completion_tokens: 1,
        generation: 1,
        source: "requests/0/7".into(),
        variant: None,
        plan: None,
        fee_pico: Pico::ZERO,
        quantities: Vec::new(),
    }
}

fn storable_any(r: &SinkRecord) -> Result<(), Rejection> {
    storable(r, &Topology::ANY)
}

fn rejected(r: ResultRecord) -> String {
    storable_any(&SinkRecord::Window(r)).unwrap_err()
}

#[test]
fn what_the_engine_writes_is_stored() {
    assert_eq!(storable_any(&SinkRecord::Window(pane())), Ok(()));
    assert_eq!(storable_any(&SinkRecord::Adjustment(adjustment())), Ok(()));
    // A pane of a tally before line items.
    let mut old = pane();
    old.lines.clear();
    assert_eq!(storable_any(&SinkRecord::Window(old)), Ok(()));
}

#[test]
fn ids_postgresql_cannot_store_or_index_are_rejected() {
    let mut r = pane();
    r.tenant_id = "evil\0tenant".into();
    assert_eq!(
        rejected(r),
        "tenant_id is not a valid id: it holds the control character U+0000 at byte 4"
    );
    let mut r = pane();
    r.tenant_id = "t".repeat(10 << 20);
    assert!(rejected(r).contains("is 10485760 bytes long, at most 256"));
    let mut r = pane();
    r.lines[0].model = "lar\0ge".into();
    assert!(rejected(r).starts_with("a line's model is not a valid id"));
    let mut a = adjustment();
    a.request_id = "r\0".into();
    assert!(storable_any(&SinkRecord::Adjustment(a)).is_err());
    let mut a = adjustment();
    a.model = "m\0".into();
    assert!(storable_any(&SinkRecord::Adjustment(a)).is_err());
}

#[test]
fn integers_past_their_columns_are_rejected() {
    for set in [
        |r: &mut ResultRecord| r.version = u64::MAX,
        |r: &mut ResultRecord| r.generation = 1 << 63,
        |r: &mut ResultRecord| r.pane_index = u32::MAX,
        |r: &mut ResultRecord| r.source_partition = -1,
    ] {
        let mut r = pane();
        set(&mut r);
        assert!(
            storable_any(&SinkRecord::Window(r.clone())).is_err(),
            "{r:?}"
        );
    }
    let mut r = pane();
    r.requests = u64::MAX;
    r.lines = vec![LineItem {
        requests: u64::MAX,
        ..line("small", 3, 12)
    }];
    assert_eq!(
        rejected(r),
        format!("requests {} does not fit in BIGINT", u64::MAX)
    );
    let mut a = adjustment();
    a.generation = u64::MAX;
    assert!(storable_any(&SinkRecord::Adjustment(a)).is_err());
}

#[test]
fn records_that_contradict_their_totals_are_rejected() {
    let mut r = pane();
    r.usd = "1.000000000000".into();
    assert!(rejected(r).starts_with("usd \"1.000000000000\" contradicts cost_pico 12"));
    let mut r = pane();
    r.window_end = r.window_start;
    assert!(rejected(r).contains("is not before window_end"));
    let mut r = pane();
    r.lines[1].cost_pico = Pico(6);
    assert!(rejected(r).starts_with("the lines sum to"));
    let mut r = pane();
    r.lines.swap(0, 1);
    assert!(rejected(r).contains("not sorted by model"));
    // The same model twice would make the line upsert touch one row twice.
    let mut r = pane();
    r.lines[1].model = "large".into();
    assert!(rejected(r).contains("each once"));
    let mut r = pane();
    r.lines = vec![line("a", 1, u128::MAX), line("b", 2, 1)];
    assert_eq!(rejected(r), "the lines' sums overflow");
    let mut a = adjustment();
    a.usd = "0".into();
    assert!(storable_any(&SinkRecord::Adjustment(a)).is_err());
}

#[test]
fn progress_must_name_a_partition_it_counts() {
    let topology = Topology {
        results: 4,
        input: Some(8),
    };
    let p = |source_partition, source_partitions, results_partitions, final_through| {
        storable(
            &SinkRecord::Progress(ProgressRecord {
                kind: ResultKind::Progress,
                source_partition,
                source_partitions,
                results_partitions,
                final_through,
                watermark: 90_000,
                generation: 1,
            }),
            &topology,
        )
    };
    assert_eq!(p(3, 4, 1, 60_000), Ok(()));
    assert_eq!(p(7, 8, 4, 90_001), Ok(()));
    assert!(p(4, 4, 1, 60_000).is_err());
    assert!(p(-1, 4, 1, 60_000).is_err());
    assert!(p(0, 0, 1, 60_000).is_err());
    assert!(p(0, 1, 0, 60_000).is_err());
    // More partitions than the topics have would keep every window from being final.
    assert!(p(0, i32::MAX, 1, 60_000)
        .unwrap_err()
        .contains("input topic"));
    assert!(p(0, 4, i32::MAX, 60_000)
        .unwrap_err()
        .contains("restart the sink"));
    assert!(p(0, 4, 1, 90_002)
        .unwrap_err()
        .contains("past its watermark"));
    // Without the input topic's metadata, its count is not bounded.
    let any = |n| {
        storable(
            &SinkRecord::Progress(ProgressRecord {
                kind: ResultKind::Progress,
                source_partition: 0,
                source_partitions: n,
                results_partitions: 1,
                final_through: 0,
                watermark: 0,
                generation: 1,
            }),
            &Topology {
                results: 1,
                input: None,
            },
        )
    };
    assert_eq!(any(1 << 20), Ok(()));
}

/// A rating's lines: one model twice (two plans) in key order passes; out of
/// order, or with quantities that do not add up to the line, is refused.
#[test]
fn rated_lines_are_keyed_by_model_variant_and_plan_and_add_up() {
    use crate::engine::QuantityItem;
    let q = |name: &str, cost: u128| QuantityItem {
        quantity: name.into(),
        count: 1,
        cost_pico: Pico(cost),
    };
    let rated = |plan: Option<&str>, cost: u128| LineItem {
        plan: plan.map(Into::into),
        fee_pico: Pico(1),
        quantities: vec![q("prompt_tokens", cost - 3), q("cached_tokens", 2)],
        ..line("large", 1, cost)
    };
    let mut r = pane();
    r.lines = vec![rated(None, 7), rated(Some("enterprise"), 5)];
    r.requests = 2;
    r.prompt_tokens = 20;
    r.completion_tokens = 10;
    assert_eq!(storable_any(&SinkRecord::Window(r.clone())), Ok(()));
    let mut swapped = r.clone();
    swapped.lines.reverse();
    assert!(rejected(swapped).contains("not sorted by model, each once (then by variant and plan"));
    let mut off = r;
    off.lines[1].quantities[1].cost_pico = Pico(3);
    assert!(rejected(off).contains("sum to cost_pico 6, but the line says 5"));
}
