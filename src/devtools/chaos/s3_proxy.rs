//! The S3 endpoint of a chaos run: a TCP proxy in front of the S3 server, which
//! the fault loop takes down and brings back. Down, it resets every open
//! connection (an upload in flight loses its connection mid-body) and stops
//! listening, so a new connection is refused — what the processes see when the
//! server is killed and restarted. The objects stay: the scripts' S3 server (moto)
//! keeps them in memory, so killing it for real would lose every checkpoint,
//! which no S3 outage does.
//!
//! Invariants: the proxy listens on one port for the whole run (the config names
//! it); while it is down no byte moves between a client and the server; dropping
//! the proxy stops its threads' forwarding.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

pub(super) struct S3Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    down: AtomicBool,
    stop: AtomicBool,
    /// Both ends of every open forwarded connection, to reset them when down.
    conns: Mutex<BTreeMap<u64, [TcpStream; 2]>>,
    next_id: AtomicU64,
}

impl Shared {
    fn conns(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, [TcpStream; 2]>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reset_all(&self) {
        for [a, b] in std::mem::take(&mut *self.conns()).into_values() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

impl S3Proxy {
    /// A proxy on a free loopback port in front of `upstream` (`http://host:port`).
    pub(super) fn start(upstream: &str) -> anyhow::Result<S3Proxy> {
        let target = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::Builder::new()
            .name("chaos-s3-proxy".into())
            .spawn(move || accept_loop(Some(listener), addr, &target, s))
            .context("starting the S3 proxy")?;
        Ok(S3Proxy { addr, shared })
    }

    /// The endpoint the run's config names.
    pub(super) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Down: every connection reset, new ones refused.
    pub(super) fn down(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.shared.reset_all();
    }

    /// Up again, on the same port.
    pub(super) fn up(&self) {
        self.shared.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.reset_all();
    }
}

/// Accepts and forwards until stopped; closes the listener while down and binds
/// the same address again when up.
fn accept_loop(mut listener: Option<TcpListener>, addr: SocketAddr, target: &str, s: Arc<Shared>) {
    let idle = Duration::from_millis(10);
    while !s.stop.load(Ordering::SeqCst) {
        if s.down.load(Ordering::SeqCst) {
            listener = None;
            std::thread::sleep(idle);
            continue;
        }
        let Some(l) = &listener else {
            // SO_REUSEADDR (std sets it) lets the port be bound again at once.
            listener = TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .ok();
            if listener.is_none() {
                std::thread::sleep(idle);
            }
            continue;
        };
        let _ = l.set_nonblocking(true);
        match l.accept() {
            Ok((client, _)) => {
                let _ = forward(client, target, &s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(idle),
            Err(_) => std::thread::sleep(idle),
        }
    }
}

/// Connects `client` to the server and copies both ways on two threads; the
/// connection is forgotten once both directions are over.
fn forward(client: TcpStream, target: &str, s: &Arc<Shared>) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect(target)?;
    let id = s.next_id.fetch_add(1, Ordering::SeqCst);
    s.conns()
        .insert(id, [client.try_clone()?, server.try_clone()?]);
    let over = Arc::new(AtomicU8::new(0));
    for (mut from, mut to) in [(client.try_clone()?, server.try_clone()?), (server, client)] {
        let (s, over) = (s.clone(), over.clone());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
            let _ = from.shutdown(Shutdown::Read);
            if over.fetch_add(1, Ordering::SeqCst) == 1 {
                s.conns().remove(&id);
            }
        });
    }
    Ok(())
}
