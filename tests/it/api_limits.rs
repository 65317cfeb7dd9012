//! The usage API's limits (issue 37, step 3), on real PostgreSQL over real
//! sockets: a range over `api.max_range` is 400; a query over
//! `api.query_timeout` is 503 and its connection comes back; more requests in
//! flight than `api.max_concurrent`, or faster than `api.rate_limit`, are 429
//! with `Retry-After`; a thousand idle connections do not keep a client out.

use std::time::{Duration, Instant};

use crate::api_http::api_request;
use crate::common::*;

const Q: &str = "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&window=hour";

fn get(addr: &str, key: &str, path: &str) -> (u16, String, String) {
    let r = api_request(
        addr,
        path,
        Some(&format!("Bearer {key}")),
        "application/json",
    );
    let retry = r.header("retry-after");
    (r.status, retry, r.body)
}

/// A session holding an exclusive lock on the sink's table until dropped: every
/// usage query waits on it.
pub(crate) struct Lock {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Lock {
    pub(crate) fn take(db: &str) -> Lock {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
                .batch_execute("BEGIN; LOCK TABLE tenant_cost_partial IN ACCESS EXCLUSIVE MODE")
                .await
                .unwrap();
            client
        });
        Lock { rt, client }
    }

    /// Waits (up to 30 s) until `n` sessions of this test's database wait on a lock:
    /// the requests are in flight, whatever the machine's load (a fixed sleep raced
    /// them). Other tests share the cluster, so only this database counts.
    pub(crate) fn wait_for_waiters(&self, n: i64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = self.rt.block_on(async {
                self.client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                         AND datname = current_database()",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0)
            });
            if waiting >= n {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{waiting} of {n} requests wait on the lock"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn release(self) {
        self.rt
            .block_on(self.client.batch_execute("ROLLBACK"))
            .unwrap();
    }
}

#[test]
fn ranges_timeouts_concurrency_rates_and_idle_connections_are_bounded() {
    let dir = TempDir::new("api-limits");
    let cfg = dir.path().join("api.toml");
    std::fs::write(
        &cfg,
        format!(
            "{PRICES}\n[window]\nsize = \"1h\"\n[api]\nmax_range = \"31d\"\nquery_timeout = \"2s\"\n\
             max_concurrent = 2\nrate_limit = 1\npool_size = 1\n"
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let db = fresh_database("apilimits");
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &db)],
        Duration::from_secs(60),
    );
    let (api, addr, key) = crate::usage_api::start_api(dir.path(), cfg, &db, "api");
    let keys = dir.path().join("api.keys");
    let other = crate::usage_api::mint(cfg, keys.to_str().unwrap(), "other", "admin");
    signal(api.id(), libc::SIGHUP);
    wait_until("the second key is taken", Duration::from_secs(10), || {
        (get(&addr, &other, "/metrics").0 == 200).then_some(())
    });

    // A year is over 31 days: 400 naming `to`, before any query.
    let (status, _, body) = get(
        &addr,
        &key,
        "/v1/usage?from=2025-01-01T00:00:00Z&to=2026-01-01T00:00:00Z&window=day",
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("\"to\"") && body.contains("api.max_range"),
        "{body}"
    );

    // A query held by a lock runs into query_timeout: 503, and the pool's one
    // connection serves the next request once the lock is gone.
    let lock = Lock::take(&db);
    let started = Instant::now();
    let (status, _, body) = get(&addr, &key, Q);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("api.query_timeout"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    lock.release();
    let (status, _, body) = get(&addr, &other, Q);
    assert_eq!(status, 200, "{body}");

    // Two requests in flight (both waiting on a lock): a third is 429 at once.
    let lock = Lock::take(&db);
    let waiting: Vec<_> = [key.clone(), other.clone()]
        .into_iter()
        .map(|k| {
            let addr = addr.clone();
            std::thread::spawn(move || get(&addr, &k, Q).0)
        })
        .collect();
    // The pool has one connection: one request waits on the lock, the other for
    // the connection (in flight all the same).
    lock.wait_for_waiters(1);
    std::thread::sleep(Duration::from_millis(300));
    let third = crate::usage_api::mint(cfg, keys.to_str().unwrap(), "third", "admin");
    signal(api.id(), libc::SIGHUP);
    let (status, retry, body) = wait_until("a third key", Duration::from_secs(10), || {
        let r = get(&addr, &third, Q);
        (r.0 != 401).then_some(r)
    });
    assert_eq!((status, retry.as_str()), (429, "1"), "{body}");
    assert!(body.contains("api.max_concurrent"), "{body}");
    lock.release();
    for w in waiting {
        assert!(matches!(w.join().unwrap(), 200 | 503));
    }

    // Rate: 1 per second, bursts of 2, per key.
    let rate = crate::usage_api::mint(cfg, keys.to_str().unwrap(), "rate", "admin");
    signal(api.id(), libc::SIGHUP);
    wait_until("the rate key", Duration::from_secs(10), || {
        (get(&addr, &rate, "/metrics").0 == 200).then_some(())
    });
    let started = Instant::now();
    let statuses: Vec<(u16, String)> = (0..10)
        .map(|_| {
            let (s, retry, _) = get(&addr, &rate, "/v1/invoices/acme?period=2026-01");
            (s, retry)
        })
        .collect();
    // The burst, then one more per second at most.
    let elapsed_ms = started.elapsed().as_millis() as usize;
    let served = statuses.iter().filter(|(s, _)| *s == 200).count();
    assert!(statuses[..2].iter().all(|(s, _)| *s == 200), "{statuses:?}");
    assert!(
        served <= 2 + elapsed_ms / 1000 + 1,
        "{statuses:?} in {elapsed_ms} ms"
    );
    assert!(
        statuses.iter().any(|(s, r)| *s == 429 && r == "1"),
        "{statuses:?} in {elapsed_ms} ms"
    );
    assert!(
        statuses.iter().all(|(s, _)| matches!(s, 200 | 429)),
        "{statuses:?}"
    );
    assert_eq!(
        get(&addr, &key, "/v1/invoices/acme?period=2026-01").0,
        200,
        "another key"
    );

    // A thousand connections that send nothing: a client is still served.
    let idle: Vec<std::net::TcpStream> = (0..1000)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let started = Instant::now();
    assert_eq!(get(&addr, &key, "/v1/invoices/acme?period=2026-01").0, 200);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
}
