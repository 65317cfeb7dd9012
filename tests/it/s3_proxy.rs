//! A faulty front for the test S3 server: a real TCP listener that forwards each
//! HTTP request to `scripts/s3.sh`'s server — or, while `failing`, answers the
//! GET of an object (not a listing) with `500 Internal Server Error`, as an S3
//! that has trouble for a while does; or, while `hanging`, holds such a GET
//! unanswered (a store that stopped responding); or, while `lose_put_answers` is
//! above 0, forwards an object PUT and drops its answer (the object created, the
//! client told nothing: a connection lost at the worst moment). One request per connection
//! (`Connection: close` both ways), so every request is seen and decided alone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub struct FaultyS3 {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// While set, object GETs are answered with 500.
    pub failing: Arc<AtomicBool>,
    /// The 500s answered so far.
    pub failed: Arc<AtomicU64>,
    /// While set, object GETs get no answer (until it is cleared).
    pub hanging: Arc<AtomicBool>,
    /// The GETs held so far.
    pub held: Arc<AtomicU64>,
    /// The next this many object PUTs reach the server, and their answers are
    /// dropped.
    pub lose_put_answers: Arc<AtomicU64>,
}

/// What the proxy does to object GETs.
#[derive(Clone)]
struct Faults {
    failing: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    hanging: Arc<AtomicBool>,
    held: Arc<AtomicU64>,
    lose_put_answers: Arc<AtomicU64>,
}

impl FaultyS3 {
    /// A proxy in front of `upstream` (`http://host:port`), failing from the start
    /// when `failing`.
    pub fn start(upstream: &str, failing: bool) -> Self {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let faults = Faults {
            failing: Arc::new(AtomicBool::new(failing)),
            failed: Arc::new(AtomicU64::new(0)),
            hanging: Arc::new(AtomicBool::new(false)),
            held: Arc::new(AtomicU64::new(0)),
            lose_put_answers: Arc::new(AtomicU64::new(0)),
        };
        let f = faults.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (f, up) = (f.clone(), upstream.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &up, &f);
                });
            }
        });
        FaultyS3 {
            endpoint,
            failing: faults.failing,
            failed: faults.failed,
            hanging: faults.hanging,
            held: faults.held,
            lose_put_answers: faults.lose_put_answers,
        }
    }
}

/// The head of an HTTP message without its `Connection` header, with
/// `Connection: close` added.
fn closing(head: &[String]) -> String {
    let mut out = String::new();
    for line in head {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

fn serve(conn: TcpStream, upstream: &str, faults: &Faults) -> std::io::Result<()> {
    let mut client = BufReader::new(conn.try_clone()?);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if client.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let length: usize = head
        .iter()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    client.read_exact(&mut body)?;
    let request_line = head.first().cloned().unwrap_or_default();
    let mut out = conn;
    let object_get = request_line.starts_with("GET ") && !request_line.contains("list-type");
    if object_get && faults.hanging.load(Ordering::SeqCst) {
        faults.held.fetch_add(1, Ordering::SeqCst);
        while faults.hanging.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        return Ok(());
    }
    if object_get && faults.failing.load(Ordering::SeqCst) {
        faults.failed.fetch_add(1, Ordering::SeqCst);
        let body = "<Error><Code>InternalError</Code><Message>injected</Message></Error>";
        write!(
            out,
            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return out.flush();
    }
    let mut up = TcpStream::connect(upstream)?;
    up.write_all(closing(&head).as_bytes())?;
    up.write_all(&body)?;
    up.flush()?;
    let mut response = Vec::new();
    up.read_to_end(&mut response)?;
    let lose = request_line.starts_with("PUT ")
        && faults
            .lose_put_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    if lose {
        // The object exists now; the client only sees its connection close.
        return out.shutdown(std::net::Shutdown::Both);
    }
    // The response's head, rewritten to close this connection too.
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(response.len(), |i| i + 4);
    let head: Vec<String> = String::from_utf8_lossy(&response[..split])
        .split("\r\n")
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    out.write_all(closing(&head).as_bytes())?;
    out.write_all(&response[split..])?;
    out.flush()
}
