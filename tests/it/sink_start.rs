//! A starting sink whose PostgreSQL connection closes mid-start — a restart
//! between its connect and its migrations — reconnects within
//! `sink.retry_budget` and starts, where it used to exit 4. The order is fixed,
//! not raced: a proxy in front of PostgreSQL closes the first connection at the
//! first statement the sink sends on it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;

/// The PostgreSQL wire protocol's SSLRequest code.
const SSL_REQUEST: [u8; 4] = [0x04, 0xD2, 0x16, 0x2F];

/// Reads one untyped message (a length that counts itself, then the body).
fn untyped(c: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    c.read_exact(&mut len)?;
    let mut msg = len.to_vec();
    msg.resize(u32::from_be_bytes(len) as usize, 0);
    c.read_exact(&mut msg[4..])?;
    Ok(msg)
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
}

/// Forwards every connection to `upstream`, but closes the first one when its
/// client sends its first statement (after the startup, and the SSLRequest the
/// client may send before it); returns the proxy's port and the connections seen.
fn closing_first_statement(upstream: String) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for mut client in listener.incoming().flatten() {
            let n = count.fetch_add(1, Ordering::SeqCst);
            let mut server = TcpStream::connect(&upstream).unwrap();
            let back = (server.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || pump(back.0, back.1));
            if n > 0 {
                let fwd = (client, server);
                std::thread::spawn(move || pump(fwd.0, fwd.1));
                continue;
            }
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut msg = untyped(&mut client)?;
                if msg.len() == 8 && msg[4..8] == SSL_REQUEST {
                    server.write_all(&msg)?;
                    msg = untyped(&mut client)?;
                }
                server.write_all(&msg)?;
                // The first typed message is the first statement: drop the
                // connection under it, as a restart would.
                let mut kind = [0u8; 1];
                client.read_exact(&mut kind)?;
                client.shutdown(Shutdown::Both)?;
                server.shutdown(Shutdown::Both)
            });
        }
    });
    (port, seen)
}

#[test]
fn a_sink_whose_connection_closes_while_it_starts_reconnects_and_starts() {
    let dir = TempDir::new("sink-start");
    let url = fresh_database("sinkstart");
    let (host_port, rest) = url
        .trim_start_matches("postgres://")
        .split_once('@')
        .map(|(user, r)| (r.split_once('/').unwrap(), user))
        .map(|((hp, db), user)| (hp.to_string(), format!("{user}@{{}}/{db}")))
        .unwrap();
    let (port, seen) = closing_first_statement(host_port);
    let proxied = format!(
        "postgres://{}",
        rest.replace("{}", &format!("127.0.0.1:{port}"))
    );
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(dir.path(), &broker, "sink-start", "");
    let out = tally(
        &["sink", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[
            ("TALLY_SINK__DATABASE_URL", proxied.as_str()),
            ("TALLY_LOG", "info"),
        ],
        Duration::from_secs(120),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{err}", out.status);
    assert!(err.contains("PostgreSQL lost while starting"), "{err}");
    assert!(seen.load(Ordering::SeqCst) >= 2, "{err}");
    // The second connection migrated the schema.
    assert_eq!(
        query(&url, "SELECT count(*)::text FROM sink_offsets"),
        vec![vec![Some("0".to_string())]]
    );
}
