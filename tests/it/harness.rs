//! The suite's own services: throw-away PostgreSQL clusters (`scripts/pg.sh`)
//! started by tests running side by side. A port is claimed before it is used,
//! so concurrent starts (and a sibling's `restart`, which frees its port for a
//! moment) never hand one port to two clusters.

use std::collections::BTreeSet;
use std::thread;

use crate::common::*;

/// Four clusters started at once get four ports and answer; one restarts while
/// two more start, and keeps its port.
#[test]
fn concurrent_scratch_clusters_get_ports_of_their_own() {
    let dirs: Vec<TempDir> = (0..6)
        .map(|i| TempDir::new(&format!("harness-pg{i}")))
        .collect();
    let start_all = |dirs: &[TempDir]| -> Vec<ScratchPostgres> {
        thread::scope(|s| {
            let started: Vec<_> = dirs
                .iter()
                .map(|d| s.spawn(|| ScratchPostgres::start(d.path(), &[])))
                .collect();
            started.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let first = start_all(&dirs[..4]);
    let urls: BTreeSet<&str> = first.iter().map(|pg| pg.url.as_str()).collect();
    assert_eq!(urls.len(), 4, "{urls:?}");
    for pg in &first {
        execute(&pg.url, "CREATE TABLE here (x int)");
    }
    let more = thread::scope(|s| {
        let more = s.spawn(|| start_all(&dirs[4..]));
        first[0].restart();
        more.join().unwrap()
    });
    let all: BTreeSet<&str> = first
        .iter()
        .chain(&more)
        .map(|pg| pg.url.as_str())
        .collect();
    assert_eq!(all.len(), 6, "{all:?}");
    // The restarted cluster is the same one, on the same port.
    assert_eq!(
        query(&first[0].url, "SELECT count(*)::text FROM here").len(),
        1
    );
}
