//! The chaos campaign (`tally-dev chaos-campaign`): its plans are drawn from the
//! seed alone and cover every dimension and fault, and the CI slice — a campaign
//! of fixed run seeds on the real services — is exact in every run and writes
//! its JSON report and Markdown summary.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::*;
use tally::devtools::chaos::campaign::run_seeds;
use tally::devtools::chaos::campaign_report::CampaignReport;
use tally::devtools::chaos::plan::{Plan, PROTOCOLS};

/// The same seed draws the same plan (the replay command rests on it); seeds
/// apart draw every layout, worker count, protocol, store and membership; no
/// plan keeps checkpoints on S3 or restarts PostgreSQL without the service.
#[test]
fn campaign_plans_are_drawn_from_the_seed_and_cover_every_dimension() {
    let seeds: Vec<u64> = run_seeds(7).take(400).collect();
    assert_eq!(seeds, run_seeds(7).take(400).collect::<Vec<_>>());
    assert_ne!(seeds[..10], run_seeds(8).take(10).collect::<Vec<_>>()[..]);
    let plans: Vec<Plan> = seeds.iter().map(|s| Plan::draw(*s, true, true)).collect();
    for (s, p) in seeds.iter().zip(&plans) {
        assert_eq!(&Plan::draw(*s, true, true), p);
        assert_eq!(p.seed, *s);
        assert!(
            (1..=16).contains(&p.partitions) && (1..=4).contains(&p.workers),
            "{p:?}"
        );
        assert!(p.kill_min_ms <= p.kill_max_ms && p.restart_min_ms <= p.restart_max_ms);
        assert!(p.faults.total() < 1000, "{p:?}");
        assert!(p.faults.crash_point > 0 && p.faults.zombie > 0 && p.faults.sink > 0);
        assert!(p.faults.pg_restart > 0);
        // The broker down is built but not drawn (docs/operations/scale-out.md).
        assert!(p.faults.broker_down == 0 && p.faults.broker_slow > 0);
        assert!(p.faults.leader_change > 0);
        // The new faults only where their process or service is there.
        assert_eq!(p.faults.reprocess_kill > 0, p.reprocess_late, "{p:?}");
        assert_eq!(p.faults.s3_outage > 0, p.store == "s3", "{p:?}");
        let local = Plan::draw(*s, false, false);
        assert_eq!(
            (
                local.store.as_str(),
                local.faults.pg_restart,
                local.faults.s3_outage
            ),
            ("local", 0, 0)
        );
        assert_eq!((local.workers, local.partitions), (p.workers, p.partitions));
    }
    let seen = |f: &dyn Fn(&Plan) -> String| plans.iter().map(f).collect::<BTreeSet<_>>();
    assert_eq!(seen(&|p| p.partitions.to_string()).len(), 16);
    assert_eq!(seen(&|p| p.workers.to_string()).len(), 4);
    assert_eq!(
        seen(&|p| p.group_protocol.clone()),
        PROTOCOLS.iter().map(|p| p.to_string()).collect()
    );
    assert_eq!(seen(&|p| p.store.clone()).len(), 2);
    assert_eq!(seen(&|p| p.static_membership.to_string()).len(), 2);
    assert_eq!(seen(&|p| p.reprocess_late.to_string()).len(), 2);
}

/// The CI slice: a campaign of fixed run seeds, chosen (by their plans and the
/// first three faults of their schedules, which happen whatever the timing) to
/// cover the three group protocols, both stores, both memberships, 1–4 workers,
/// crash points, a zombie, sink kills, `reprocess-late --follow` (in four runs)
/// and its kills, an S3 outage, the dev broker slow and a leader change. Every
/// run must be exact, every kill recovered, and both reports written with each
/// run's replay (kept in `target/test-artifacts/chaos-slice/`).
const SLICE: [u64; 5] = [20, 204, 242, 1553, 57];

#[test]
fn the_ci_slice_of_the_campaign_is_exact() {
    let db = std::env::var("TALLY_TEST_PG_URL").expect("TALLY_TEST_PG_URL: run scripts/test.sh");
    // Kept after the test (campaign.json has every run's faults and times).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-artifacts/chaos-slice");
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().unwrap();
    let seeds = SLICE.map(|s| s.to_string()).join(",");
    let run = run_to_end(
        tally_dev_bin(),
        &[
            "chaos-campaign",
            "--database-url",
            &db,
            "--s3-endpoint",
            &s3_endpoint(),
            "--run-seeds",
            &seeds,
            // One at a time: the suite's other tests share the two cores.
            "--parallel",
            "1",
            "--out",
            out,
        ],
        &[("TALLY_LOG", "warn")],
        Duration::from_secs(1200),
    );
    println!("{}", String::from_utf8_lossy(&run.stdout));
    let r: CampaignReport =
        serde_json::from_slice(&std::fs::read(dir.join("campaign.json")).unwrap()).unwrap();
    let t = &r.totals;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        (t.runs, t.passed, t.exact_runs, t.audits_balanced),
        (5, 5, 5, 5),
        "{t:?}"
    );
    assert_eq!(
        (t.lost_windows, t.double_counted_windows, t.extra_windows),
        (0, 0, 0)
    );
    assert_eq!((t.never_recovered, t.unexpected_exits), (0, 0), "{t:?}");
    for (run, seed) in r.runs.iter().zip(SLICE) {
        assert_eq!(run.plan, Plan::draw(seed, true, false));
        assert_eq!(
            run.replay,
            format!("CHAOS_PG_RESTARTS=0 scripts/chaos.sh --replay {seed}")
        );
    }
    // What the seeds were chosen for.
    let seen =
        |f: &dyn Fn(&Plan) -> String| r.runs.iter().map(|x| f(&x.plan)).collect::<BTreeSet<_>>();
    assert_eq!(seen(&|p| p.group_protocol.clone()).len(), 3);
    assert_eq!(seen(&|p| p.store.clone()).len(), 2);
    assert_eq!(seen(&|p| p.workers.to_string()).len(), 4);
    assert_eq!(seen(&|p| p.static_membership.to_string()).len(), 2);
    assert_eq!(t.reprocess_runs, 4, "{t:?}");
    let armed = r
        .runs
        .iter()
        .flat_map(|x| &x.report.as_ref().unwrap().faults.events)
        .filter(|e| e.what.contains("restart armed at"))
        .count();
    assert!(
        armed > 0
            && t.zombies > 0
            && t.sink_kills > 0
            && t.reprocess_kills > 0
            && t.s3_outages > 0
            && t.broker_slows > 0
            && t.leader_changes > 0,
        "{armed} armed restarts; {t:?}"
    );
    let md = std::fs::read_to_string(dir.join("campaign.md")).unwrap();
    assert!(
        md.contains("| lost windows | 0 |") && md.contains("p99"),
        "{md}"
    );
}
