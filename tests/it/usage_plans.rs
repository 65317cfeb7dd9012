//! The usage functions' range reaches the tables (migration 5): `tally_usage` and
//! `tally_usage_quantity` filter views whose `window_start` is an aggregate, so only a
//! bound on `window_end` (a grouping column) can be pushed under them. A one-tenant
//! query then reads the primary key's range `(tenant_id, window_end > from)`, never a
//! sequential scan of the partials, and an all-tenant query aggregates only the
//! windows ending after `from`. The plans come from PostgreSQL itself (EXPLAIN).

use crate::common::*;

const JAN: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const DAY: i64 = 86_400_000;

/// The plan of `sql` with sequential scans made dear (the tables here are small:
/// the question is what the range lets the planner use, not what it prefers).
fn plan(db: &str, sql: &str) -> String {
    let rows = query(db, &format!("SELECT tally_plan($q${sql}$q$)"));
    rows.into_iter()
        .filter_map(|r| r[0].clone())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a line of `plan` is an index condition holding every one of `terms`.
fn index_cond(plan: &str, terms: &[&str]) -> bool {
    plan.lines()
        .any(|l| l.contains("Index Cond") && terms.iter().all(|t| l.contains(t)))
}

fn migrate(db: &str) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut client = tally::sink::connect(db).await?;
            tally::sink::migrate::run(&mut client).await
        })
        .unwrap();
}

#[test]
fn a_usage_querys_range_reaches_the_partials_primary_key() {
    let db = fresh_database("usage_plans");
    migrate(&db);
    execute(
        &db,
        &format!(
            "INSERT INTO tenant_cost_partial SELECT 'tenant-' || t, {JAN} + d::INT8 * {DAY} + 60000, 0,
                 {JAN} + d::INT8 * {DAY}, 100, 1, 10, 1, 1, 1, 'on_time', 0, now()
             FROM generate_series(1, 50) t, generate_series(0, 30) d;
             INSERT INTO tenant_cost_line_partial SELECT tenant_id, window_end, source_partition,
                 'small', window_start, cost_pico, requests, prompt_tokens, completion_tokens,
                 version, generation FROM tenant_cost_partial;
             ANALYZE;
             CREATE FUNCTION tally_plan(q TEXT) RETURNS SETOF TEXT LANGUAGE plpgsql AS $f$
             DECLARE r RECORD;
             BEGIN
                 PERFORM set_config('enable_seqscan', 'off', true);
                 FOR r IN EXECUTE 'EXPLAIN ' || q LOOP RETURN NEXT r.\"QUERY PLAN\"; END LOOP;
             END $f$;"
        ),
    );
    let (from, to) = (JAN + 14 * DAY, JAN + 15 * DAY);
    for by_model in [true, false] {
        let one = plan(
            &db,
            &format!(
                "SELECT * FROM tally_usage('hour', 'UTC', {from}, {to}, {by_model}, 'tenant-7')"
            ),
        );
        assert!(!one.contains("Seq Scan on tenant_cost_partial"), "{one}");
        assert!(
            index_cond(
                &one,
                &["tenant_id = 'tenant-7'", &format!("window_end > '{from}'")]
            ),
            "the range does not reach the primary key:\n{one}"
        );
        let all = plan(
            &db,
            &format!("SELECT * FROM tally_usage('hour', 'UTC', {from}, {to}, {by_model}, NULL)"),
        );
        assert!(all.contains(&format!("window_end > '{from}'")), "{all}");
    }
    let quantities = plan(
        &db,
        &format!("SELECT * FROM tally_usage_quantity('hour', 'UTC', {from}, {to}, 'tenant-7')"),
    );
    assert!(
        quantities.contains(&format!("window_end > '{from}'")),
        "{quantities}"
    );
    // The same answer as the views read whole.
    let sums = |sql: &str| query(&db, sql);
    assert_eq!(
        sums(&format!(
            "SELECT tenant_id, sum(cost_pico)::TEXT FROM tally_usage('day', 'UTC', {from}, {to}, false, NULL) GROUP BY 1 ORDER BY 1"
        )),
        sums(&format!(
            "SELECT tenant_id, sum(cost_pico)::TEXT FROM tenant_cost_minute WHERE window_start >= {from} AND window_start < {to} GROUP BY 1 ORDER BY 1"
        ))
    );
}
