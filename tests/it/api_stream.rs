//! A CSV answer cut by its database (issue 37, step 4), on a PostgreSQL of its
//! own stopped with `pg_ctl stop -m immediate` mid-stream, read by a raw HTTP/1.1
//! client over a real socket: the complete answer ends with chunked encoding's
//! zero-length chunk; the cut one never does — the connection closes without it,
//! so a client tells it from a complete one (docs/API.md, CSV).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::*;

/// Minute windows stored, one a minute from 2026-01-01T00:00Z: about 30 MB of CSV,
/// more than the socket buffers between PostgreSQL and the client can hold.
const MINUTES: i64 = 400_000;

/// An answer's head and a reader of its chunked body.
struct Answer {
    head: String,
    body: BufReader<TcpStream>,
}

/// How a chunked body went on.
#[derive(Debug, PartialEq, Eq)]
enum Chunk {
    Data(Vec<u8>),
    /// The zero-length chunk: the sender says the answer is complete.
    Last,
    /// The connection ended, or broke, without it.
    Cut(String),
}

impl Answer {
    fn get(addr: &str, key: &str, path: &str) -> Answer {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: tally\r\nAuthorization: Bearer {key}\r\nAccept: text/csv\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut body = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            assert!(body.read_line(&mut line).unwrap() > 0, "no head: {head}");
            if line == "\r\n" {
                return Answer { head, body };
            }
            head += &line;
        }
    }

    fn next(&mut self) -> Chunk {
        let mut size = String::new();
        match self.body.read_line(&mut size) {
            Ok(0) => return Chunk::Cut("end of stream before a chunk".into()),
            Err(e) => return Chunk::Cut(e.to_string()),
            Ok(_) => {}
        }
        let Some(hex) = size.strip_suffix("\r\n") else {
            return Chunk::Cut(format!("a partial chunk-size line {size:?}"));
        };
        let Ok(n) = usize::from_str_radix(hex.split(';').next().unwrap_or(""), 16) else {
            return Chunk::Cut(format!("not a chunk size: {hex:?}"));
        };
        let mut data = vec![0; n + 2];
        if let Err(e) = self.body.read_exact(&mut data) {
            return Chunk::Cut(format!("inside a chunk: {e}"));
        }
        if !data.ends_with(b"\r\n") {
            return Chunk::Cut("a chunk without its CRLF".into());
        }
        data.truncate(n);
        if n == 0 {
            Chunk::Last
        } else {
            Chunk::Data(data)
        }
    }

    /// Reads on until the last chunk or the cut: the payload's bytes so far plus
    /// those, and how it ended.
    fn finish(&mut self, mut payload: Vec<u8>) -> (Vec<u8>, Chunk) {
        loop {
            match self.next() {
                Chunk::Data(d) => payload.extend(d),
                end => return (payload, end),
            }
        }
    }
}

#[test]
fn a_csv_stream_cut_by_a_postgresql_stop_is_told_from_a_complete_one() {
    let dir = TempDir::new("api-stream");
    let pg = ScratchPostgres::start(dir.path(), &[]);
    let cfg = dir.path().join("api.toml");
    std::fs::write(&cfg, PRICES).unwrap();
    let cfg = cfg.to_str().unwrap();
    tally_ok(
        &["migrate", "--config", cfg],
        &[("TALLY_SINK__DATABASE_URL", &pg.url)],
        Duration::from_secs(60),
    );
    execute(
        &pg.url,
        &format!(
            "INSERT INTO tenant_cost_partial
             SELECT 'acme', 1767225600000 + (m + 1) * 60000, 0, 1767225600000 + m * 60000,
                    5, 1, 1, 1, 1, 1, 'on_time', 0
             FROM generate_series(0::BIGINT, {}) m",
            MINUTES - 1
        ),
    );
    let (_api, addr, key) = crate::usage_api::start_api(dir.path(), cfg, &pg.url, "api");
    // 400,000 minutes: 2026-01-01 to 2026-10-06 (under api.max_range).
    let path = "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-11-01T00:00:00Z&window=minute";

    // Complete: every line, then the zero-length chunk.
    let mut whole = Answer::get(&addr, &key, path);
    assert!(whole.head.starts_with("HTTP/1.1 200"), "{}", whole.head);
    assert!(
        whole
            .head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{}",
        whole.head
    );
    let (payload, end) = whole.finish(Vec::new());
    assert_eq!(end, Chunk::Last);
    let text = String::from_utf8(payload).unwrap();
    assert_eq!(text.matches("\r\n").count() as i64, MINUTES + 1);
    assert!(
        text.ends_with(",5,0.000000000005,1,1,1,false\r\n"),
        "{}",
        &text[text.len() - 200..]
    );

    // Cut: the client reads a little, stops reading (the buffers on the way fill
    // and PostgreSQL waits to send), and the database stops at once.
    let mut cut = Answer::get(&addr, &key, path);
    assert!(cut.head.starts_with("HTTP/1.1 200"), "{}", cut.head);
    let mut payload = Vec::new();
    while payload.len() < 64 * 1024 {
        match cut.next() {
            Chunk::Data(d) => payload.extend(d),
            other => panic!("the stream ended before the stop: {other:?}"),
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    drop(pg); // scripts/pg.sh stop: pg_ctl stop -m immediate
    let (payload, end) = cut.finish(payload);
    assert!(matches!(end, Chunk::Cut(_)), "{end:?}");
    let lines = payload.split(|&b| b == b'\n').count() as i64 - 1;
    assert!(
        lines < MINUTES,
        "the whole answer arrived ({lines} lines): the stop came too late to cut it"
    );
    assert!(lines > 100, "{lines}");
    // The server goes on: the next request answers that the database is gone.
    let (status, body) = api_get(&addr, &key, path).unwrap();
    assert_eq!(status, 503, "{body}");
}
