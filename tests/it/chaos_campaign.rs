//! The chaos campaign (`tally-dev chaos-campaign`): its plans are drawn from the
//! seed alone and cover every dimension, and a one-run campaign on the real
//! services is exact and writes its JSON report and Markdown summary.

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
        assert!(
            p.faults.crash_point + p.faults.zombie + p.faults.sink + p.faults.pg_restart < 1000
        );
        let local = Plan::draw(*s, false, false);
        assert_eq!(
            (local.store.as_str(), local.faults.pg_restart),
            ("local", 0)
        );
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
}

/// One run of a campaign, on the real services: exact, kills recovered, and
/// both reports written with the run's seed and its replay command.
#[test]
fn a_one_run_campaign_is_exact_and_writes_its_reports() {
    let db = std::env::var("TALLY_TEST_PG_URL").expect("TALLY_TEST_PG_URL: run scripts/test.sh");
    let dir = TempDir::new("chaos-campaign");
    let out = dir.path().to_str().unwrap();
    let run = run_to_end(
        tally_dev_bin(),
        &[
            "chaos-campaign",
            "--database-url",
            &db,
            "--s3-endpoint",
            &s3_endpoint(),
            "--seed",
            "3",
            "--runs",
            "1",
            "--out",
            out,
        ],
        &[("TALLY_LOG", "warn")],
        Duration::from_secs(600),
    );
    println!("{}", String::from_utf8_lossy(&run.stdout));
    let r: CampaignReport =
        serde_json::from_slice(&std::fs::read(dir.path().join("campaign.json")).unwrap()).unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!((r.totals.runs, r.totals.passed), (1, 1), "{:?}", r.totals);
    let seed = run_seeds(3).next().unwrap();
    assert_eq!(r.runs[0].plan, Plan::draw(seed, true, false));
    assert_eq!(
        r.runs[0].replay,
        format!("CHAOS_PG_RESTARTS=0 scripts/chaos.sh --replay {seed}")
    );
    assert!(
        r.totals.kills > 0 && r.totals.exact_runs == 1,
        "{:?}",
        r.totals
    );
    assert_eq!(
        (
            r.totals.lost_windows,
            r.totals.double_counted_windows,
            r.totals.extra_windows
        ),
        (0, 0, 0)
    );
    let md = std::fs::read_to_string(dir.path().join("campaign.md")).unwrap();
    assert!(
        md.contains("Chaos campaign, master seed 3") && md.contains("p99"),
        "{md}"
    );
}
