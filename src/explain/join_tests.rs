//! The join's pure rules: routes matched to the side topics by source, the
//! totals against the sink's rows, and every difference named.

use super::*;
use crate::explain::{
    Billed, CheckpointStart, Elsewhere, PartitionRange, SinkAdjustment, SinkPartial,
};

fn billed(id: &str, offset: i64, cost: u128) -> Billed {
    Billed {
        request_id: id.into(),
        window_end: 60_000,
        partition: 0,
        offset,
        model: "small".into(),
        prompt_tokens: 1,
        completion_tokens: 2,
        completed_ts: 0,
        price_effective_from: Some(0),
        plan: None,
        variant: None,
        tier_above: None,
        quantities: vec![],
        cost_pico: cost.to_string(),
        pane: "on_time".into(),
        watermark: None,
    }
}

fn replayed(from: i64, late_cost: u128) -> Replayed {
    Replayed {
        billed: vec![billed("a", 0, 10), billed("b", 1, 20)],
        elsewhere: vec![
            Elsewhere {
                request_id: Some("a".into()),
                window_end: 60_000,
                partition: 0,
                offset: 2,
                route: Routed::Duplicate {
                    of_offset: Some(0),
                    before_offset: None,
                },
            },
            Elsewhere {
                request_id: Some("c".into()),
                window_end: 60_000,
                partition: 0,
                offset: 3,
                route: Routed::TooLate {
                    watermark: 99,
                    cost_pico: late_cost.to_string(),
                    on_late_topic: false,
                    adjustment: None,
                },
            },
        ],
        range: PartitionRange {
            partition: 0,
            from_offset: from,
            to_offset: 4,
            log_start: from,
            log_end: 4,
            checkpoint: None,
            stopped_early: false,
            watermark: Some(99),
            final_here: true,
            unreadable_dead_letters: 0,
        },
    }
}

fn late_record(offset: i64) -> StoredRecord {
    StoredRecord {
        partition: 0,
        offset: 0,
        key: None,
        payload: vec![],
        headers: vec![(headers::SOURCE.into(), format!("requests/0/{offset}"))],
    }
}

fn sink(adjusted: bool, partial_requests: u64) -> SinkRows {
    let adj = 5 * u128::from(adjusted);
    SinkRows {
        cost_pico: Some((30 + adj).to_string()),
        requests: 2 + u64::from(adjusted),
        lines: vec![SinkLine {
            model: "small".into(),
            cost_pico: (30 + adj).to_string(),
            requests: 2 + u64::from(adjusted),
        }],
        partials: vec![SinkPartial {
            source_partition: 0,
            cost_pico: if partial_requests == 2 { "30" } else { "10" }.into(),
            requests: partial_requests,
            version: partial_requests,
        }],
        adjustments: if adjusted {
            vec![SinkAdjustment {
                request_id: "c".into(),
                model: "small".into(),
                cost_pico: "5".into(),
                source: "requests/0/3".into(),
                variant: String::new(),
                plan: String::new(),
                quantities: vec![],
            }]
        } else {
            vec![]
        },
        quantities: vec![],
    }
}

fn explain(from: i64, sink: Option<SinkRows>) -> Explanation {
    let late = [late_record(3)];
    join(
        "t",
        (0, 60_000),
        vec![replayed(from, 5)],
        Sides {
            input_topic: "requests",
            late: &late,
            dead_letters: &[],
            sink,
        },
    )
}

#[test]
fn a_sink_holding_the_folds_and_the_adjustment_agrees() {
    let x = explain(0, Some(sink(true, 2)));
    assert_eq!(x.agrees, Some(true), "{:?}", x.notes);
    assert!(x.exact);
    assert!(x.notes.is_empty(), "{:?}", x.notes);
    assert_eq!(x.totals.cost_pico, "30");
    assert_eq!(x.totals.expected_line_cost_pico, "35");
    let Routed::TooLate {
        on_late_topic,
        adjustment,
        ..
    } = &x.elsewhere[1].route
    else {
        panic!("too late");
    };
    assert!(*on_late_topic);
    assert_eq!(*adjustment, Some(true));
}

#[test]
fn a_missing_adjustment_and_a_lagging_sink_are_named() {
    let x = explain(0, Some(sink(false, 1)));
    assert_eq!(x.agrees, Some(false));
    let all = x.notes.join("\n");
    assert!(all.contains("1 too-late request(s) costing 5"), "{all}");
    assert!(
        all.contains("partition 0: the sink holds version 1"),
        "{all}"
    );
    assert!(all.contains("later panes not yet applied"), "{all}");
}

#[test]
fn a_log_deleted_in_part_is_never_exact() {
    let x = explain(2, Some(sink(true, 2)));
    assert!(!x.exact);
    assert!(x.notes[0].contains("records before offset 2 of partition 0 were deleted"));
    assert!(x.render_table().contains("NOT EXACT"));
}

/// A replay started from a checkpoint above a deleted log start is exact: the
/// snapshot stands for the records before it. Stopping early is said too.
#[test]
fn a_replay_from_a_checkpoint_past_the_deleted_offsets_is_exact() {
    let mut r = replayed(0, 5);
    r.range.log_start = 1;
    r.range.stopped_early = true;
    r.range.checkpoint = Some(CheckpointStart {
        name: "chk-00000000000000000007-w1".into(),
        next_offset: 0,
        high_water: Some(-5),
    });
    let late = [late_record(3)];
    let sides = Sides {
        input_topic: "requests",
        late: &late,
        dead_letters: &[],
        sink: Some(sink(true, 2)),
    };
    let x = join("t", (0, 60_000), vec![r], sides);
    assert!(x.exact, "{:?}", x.notes);
    assert_eq!(x.agrees, Some(true), "{:?}", x.notes);
    assert!(x.notes[0].contains("replayed from checkpoint chk-00000000000000000007-w1"));
    assert!(x.notes[1].contains("read up to offset 4 of 4"));
    assert!(!x.render_table().contains("NOT EXACT"));
    // Without the checkpoint, the same log start is a deletion.
    let mut r = replayed(1, 5);
    r.range.log_start = 1;
    let x = join(
        "t",
        (0, 60_000),
        vec![r],
        Sides {
            late: &late,
            ..sides_of(None)
        },
    );
    assert!(!x.exact);
}

fn sides_of(sink: Option<SinkRows>) -> Sides<'static> {
    Sides {
        input_topic: "requests",
        late: &[],
        dead_letters: &[],
        sink,
    }
}

#[test]
fn without_a_sink_nothing_is_compared() {
    let x = explain(0, None);
    assert_eq!(x.agrees, None);
    let Routed::TooLate { adjustment, .. } = &x.elsewhere[1].route else {
        panic!("too late");
    };
    assert_eq!(*adjustment, None);
}

#[test]
fn rows_follow_the_offsets_and_csv_quotes_text() {
    let x = explain(0, Some(sink(true, 2)));
    let rows = x.rows();
    let order: Vec<_> = rows.iter().map(|r| (r.offset, r.route.as_str())).collect();
    assert_eq!(
        order,
        [
            (0, "billed"),
            (1, "billed"),
            (2, "duplicate"),
            (3, "too_late")
        ]
    );
    assert_eq!(rows[2].duplicate_of_offset, Some(0));
    assert_eq!(rows[3].adjusted, Some(true));
    // A price table's request bills no quantity: null, an empty CSV cell.
    assert_eq!(
        (rows[0].quantities.as_ref(), rows[0].tier_above),
        (None, None)
    );
    assert_eq!(rows[0].quantities_cell(), None);
    let quote = |s: &str| format!("<{s}>");
    assert_eq!(
        rows[3].csv_line(quote),
        "0,3,60000,<c>,too_late,,,,5,,,,,,,99,,true,\r\n"
    );
    assert_eq!(
        crate::explain::rows::CSV_HEADER.split(',').count(),
        rows[0].csv_line(quote).split(',').count()
    );
    let table = x.render_table();
    assert!(table.contains("duplicate of offset 0"), "{table}");
    assert!(table.contains("too late at watermark 99"), "{table}");
    assert!(table.contains("AGREES with the sink"), "{table}");
}
