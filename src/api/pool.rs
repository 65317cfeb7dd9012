//! The usage API's PostgreSQL connections: at most `api.pool_size`, each lent to
//! one request at a time (a CSV stream keeps its connection until it ends), made
//! on demand and again after one broke.
//!
//! Invariants: a request that finds every connection lent waits at most
//! `WAIT`, then answers 503; every connection runs with `statement_timeout` set
//! to `api.query_timeout`, so PostgreSQL itself ends a query (a CSV stream a
//! client stopped reading included) and the connection comes back.

use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::Client;

/// How long a request waits for a free connection.
const WAIT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

struct Inner {
    url: String,
    idle: Mutex<Vec<Client>>,
    statement_timeout_ms: i64,
}

pub(crate) struct Pool {
    inner: Arc<Inner>,
    permits: Arc<Semaphore>,
    size: usize,
}

/// A connection lent to one request; back to the pool when dropped (unless broken).
pub(crate) struct Conn {
    client: Option<Client>,
    inner: Arc<Inner>,
    _permit: OwnedSemaphorePermit,
}

impl Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client
            .as_ref()
            .expect("a lent connection holds its client")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(c) = self.client.take().filter(|c| !c.is_closed()) {
            if let Ok(mut idle) = self.inner.idle.lock() {
                idle.push(c);
            }
        }
    }
}

impl Pool {
    pub(crate) fn new(url: &str, size: usize, statement_timeout: Duration) -> Pool {
        let size = size.max(1);
        Pool {
            inner: Arc::new(Inner {
                url: url.to_string(),
                idle: Mutex::new(Vec::new()),
                statement_timeout_ms: statement_timeout.as_millis() as i64,
            }),
            permits: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// A connection: an idle one, or a new one; `Err` names why not (every
    /// connection lent for `WAIT`, or the database not answering).
    pub(crate) async fn get(&self) -> Result<Conn, String> {
        let permit = tokio::time::timeout(WAIT, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                format!(
                    "all {} database connections are busy (api.pool_size) for {WAIT:?}",
                    self.size
                )
            })?
            .map_err(|_| "the connection pool is closed".to_string())?;
        let idle = {
            let mut idle = self.inner.idle.lock().map_err(|_| "pool lock poisoned")?;
            idle.retain(|c| !c.is_closed());
            idle.pop()
        };
        let client = match idle {
            Some(c) => c,
            None => self.connect().await?,
        };
        Ok(Conn {
            client: Some(client),
            inner: self.inner.clone(),
            _permit: permit,
        })
    }

    async fn connect(&self) -> Result<Client, String> {
        let c = tokio::time::timeout(CONNECT_TIMEOUT, crate::sink::connect(&self.inner.url))
            .await
            .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        let set = format!(
            "SET statement_timeout = {}",
            self.inner.statement_timeout_ms
        );
        c.batch_execute(&set)
            .await
            .map_err(|e| format!("setting statement_timeout: {e}"))?;
        Ok(c)
    }
}
