//! The sink writes a batch's panes in multi-row statements (`src/sink/panes.rs`):
//! one key's panes in one batch — out of order, stale, redelivered, a newer one with
//! fewer models — must have exactly the effect and the counts of applying them one
//! by one, and a stale pane's lines must never be written.

use std::collections::BTreeMap;

use crate::common::*;
use tally::engine::{LineItem, PaneKind, ResultKind, ResultRecord, SinkRecord};
use tally::model::{Partition, Pico};
use tally::sink::apply::{apply_batch, Applied, Batch, Delivered};
use tally::state::NextOffset;

const END: i64 = 1_767_261_660_000; // 2026-01-01T10:01:00Z

/// A pane of `tenant` at `version` with one line per model, each of `cost`.
fn pane(tenant: &str, version: u64, models: &[&str], cost: u128) -> ResultRecord {
    let lines: Vec<LineItem> = models
        .iter()
        .map(|m| LineItem {
            model: (*m).into(),
            requests: 1,
            prompt_tokens: 10,
            completion_tokens: 1,
            cost_pico: Pico(cost),
            ..LineItem::default()
        })
        .collect();
    let total = Pico(cost * models.len() as u128);
    ResultRecord {
        kind: ResultKind::Window,
        tenant_id: tenant.into(),
        window_start: END - 60_000,
        window_end: END,
        cost_pico: total,
        usd: total.usd_string(),
        requests: lines.len() as u64,
        prompt_tokens: 10 * lines.len() as u64,
        completion_tokens: lines.len() as u64,
        source_partition: 0,
        version,
        pane: PaneKind::OnTime,
        pane_index: 0,
        generation: 1,
        lines,
    }
}

fn batch(panes: Vec<ResultRecord>) -> Batch {
    let n = panes.len() as i64;
    Batch {
        topic: "tenant-cost".into(),
        records: panes
            .into_iter()
            .enumerate()
            .map(|(i, r)| Delivered {
                payload: r.to_json(),
                record: SinkRecord::Window(r),
                results_partition: 0,
                offset: i as i64,
            })
            .collect(),
        rejected: vec![],
        offsets: BTreeMap::from([(("tenant-cost".to_string(), Partition(0)), NextOffset(n))]),
    }
}

#[test]
fn one_keys_panes_in_one_batch_apply_as_if_one_by_one() {
    let db = fresh_database("sink_batch");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let panes = || {
        vec![
            pane("acme", 2, &["large", "small"], 100),
            pane("globex", 1, &["large"], 7),
            pane("acme", 1, &["medium"], 50),
            pane("acme", 3, &["small"], 300),
            pane("acme", 3, &["small"], 300),
        ]
    };
    let apply = |b: Batch| -> Applied {
        rt.block_on(async {
            let mut client = tally::sink::connect(&db).await?;
            tally::sink::migrate::run(&mut client).await?;
            apply_batch(&mut client, &b).await
        })
        .unwrap()
    };
    // One by one: acme v2 changes, globex v1 changes, acme v1 is stale, acme v3
    // changes, its redelivery is stale.
    let first = apply(batch(panes()));
    assert_eq!((first.rows_changed, first.stale_ignored), (3, 2));
    assert!(first.rejected.is_empty());
    let again = apply(batch(panes()));
    assert_eq!((again.rows_changed, again.stale_ignored), (0, 5));
    assert_eq!(
        query(
            &db,
            "SELECT tenant_id, version::TEXT, cost_pico::TEXT FROM tenant_cost_partial ORDER BY 1"
        ),
        vec![
            vec![Some("acme".into()), Some("3".into()), Some("300".into())],
            vec![Some("globex".into()), Some("1".into()), Some("7".into())],
        ]
    );
    // The stale v1's model never written; v2's `large` stays stored but out of the view.
    assert_eq!(
        query(
            &db,
            "SELECT model, version::TEXT FROM tenant_cost_line_partial WHERE tenant_id = 'acme' ORDER BY 1"
        ),
        vec![
            vec![Some("large".into()), Some("2".into())],
            vec![Some("small".into()), Some("3".into())],
        ]
    );
    assert_eq!(
        query(
            &db,
            "SELECT tenant_id, model, cost_pico::TEXT FROM tenant_cost_minute_line ORDER BY 1, 2"
        ),
        vec![
            vec![
                Some("acme".into()),
                Some("small".into()),
                Some("300".into())
            ],
            vec![
                Some("globex".into()),
                Some("large".into()),
                Some("7".into())
            ],
        ]
    );
}
