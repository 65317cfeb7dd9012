//! Test harness: real services only. Each test gets its own `tally dev-broker`
//! process (with its own topics) and its own database in the PostgreSQL cluster that
//! `scripts/test.sh` started (`TALLY_TEST_PG_URL`). A service that cannot start
//! fails the test; nothing is skipped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tally::config::KafkaConfig;
use tally::devtools::support;

pub use tally::devtools::support::{signal, DevBroker as Broker, InvoiceLine, TempDir};

pub fn tally_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tally")
}

pub fn tally_dev_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tally-dev")
}

/// A `tally dev-broker` child process (see `tally::devtools::support::DevBroker`).
pub struct DevBroker(Broker);

impl DevBroker {
    pub fn start(topics: &[(&str, i32)]) -> Self {
        DevBroker(Broker::start(Path::new(tally_bin()), topics).expect("tally dev-broker"))
    }

    pub fn kafka(&self) -> KafkaConfig {
        self.0.kafka()
    }

    /// Kills the broker process (SIGKILL) as a crash or a lost host would: every
    /// client's connection drops and nothing answers at its address afterwards.
    /// Returns once nothing listens there any more.
    pub fn kill(&self) {
        signal(self.pid(), libc::SIGKILL);
        wait_until(
            &format!("the broker at {} gone", self.bootstrap),
            Duration::from_secs(10),
            || {
                std::net::TcpStream::connect(("127.0.0.1", self.port()))
                    .is_err()
                    .then_some(())
            },
        );
    }

    /// Stops the broker process (SIGSTOP): connections stay open and nothing
    /// answers on them, as a broker that hangs or a network that drops every
    /// packet — until `resume`, with every record it had.
    pub fn freeze(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    /// Lets a frozen broker run again (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    fn port(&self) -> u16 {
        self.bootstrap
            .split(',')
            .next()
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in the bootstrap {}", self.bootstrap))
    }

    /// The broker's process id: the child of this process listening at its address.
    pub fn pid(&self) -> u32 {
        listener_pid(self.port())
            .unwrap_or_else(|| panic!("no child process listens at {}", self.bootstrap))
    }
}

/// The pid of this process's child that listens on TCP `port` (from /proc: the
/// socket's inode in /proc/net/tcp*, then the child holding it).
fn listener_pid(port: u16) -> Option<u32> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            text.lines().skip(1).find_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let local = u16::from_str_radix(cols.get(1)?.rsplit(':').next()?, 16).ok()?;
                // 0A: LISTEN.
                (local == port && cols.get(3) == Some(&"0A"))
                    .then(|| cols.get(9).map(|i| i.to_string()))?
            })
        })?;
    let socket = format!("socket:[{inode}]");
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The parent pid is the second field after the parenthesised command name.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            if ppid != me {
                return None;
            }
            let mut fds = std::fs::read_dir(entry.path().join("fd")).ok()?.flatten();
            fds.any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_str() == Some(&socket)))
                .then_some(pid)
        })
}

impl std::ops::Deref for DevBroker {
    type Target = Broker;
    fn deref(&self) -> &Broker {
        &self.0
    }
}

/// A fresh database in the test PostgreSQL cluster; returns its URL.
pub fn fresh_database(tag: &str) -> String {
    let admin = std::env::var("TALLY_TEST_PG_URL").expect(
        "TALLY_TEST_PG_URL is not set: run the suite with scripts/test.sh, which starts PostgreSQL",
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let name = format!("t_{tag}_{}_{nanos}", std::process::id());
    support::create_database(&admin, &name).expect("CREATE DATABASE in the test PostgreSQL")
}

/// Runs a query and returns rows as strings (every column cast to text by the caller).
pub fn query(url: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    support::query(url, sql).unwrap_or_else(|e| panic!("{sql}: {e:#}"))
}

/// `query`, or `None` while it fails (the sink has not migrated yet).
pub fn try_query(url: &str, sql: &str) -> Option<Vec<Vec<Option<String>>>> {
    support::query(url, sql).ok()
}

pub fn execute(url: &str, sql: &str) {
    support::execute(url, sql).unwrap_or_else(|e| panic!("{sql}: {e:#}"))
}

pub const PRICES: &str = r#"
[prices.small]
input_per_1k = "0.00015"
output_per_1k = "0.0006"
[prices.medium]
input_per_1k = "0.003"
output_per_1k = "0.015"
[prices.large]
input_per_1k = "0.05"
output_per_1k = "0.10"
"#;

/// Writes a config file for a job on `broker` with state under `dir`; `extra` is
/// appended verbatim (later keys in other sections).
pub fn write_config(dir: &Path, broker: &DevBroker, group: &str, sections: &str) -> PathBuf {
    let text = format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
"session.timeout.ms" = "6000"
[checkpoint]
dir = "{dir}/checkpoints"
interval = "1s"
[state]
dir = "{dir}/state-{group}"
{sections}
{PRICES}
"#,
        bootstrap = broker.bootstrap,
        dir = dir.display(),
    );
    let path = dir.join(format!("{group}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `tally <args>` to completion (bounded by `timeout`), returning its output.
/// Output pipes are drained while it runs, so a chatty child never blocks.
pub fn tally(args: &[&str], envs: &[(&str, &str)], timeout: Duration) -> Output {
    run_to_end(tally_bin(), args, envs, timeout)
}

/// Runs `bin <args>` to completion (bounded by `timeout`), returning its output.
pub fn run_to_end(bin: &str, args: &[&str], envs: &[(&str, &str)], timeout: Duration) -> Output {
    use std::io::Read;
    let mut child = Command::new(bin)
        .args(args)
        .env("TALLY_LOG", "info")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tally");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.join().unwrap();
            panic!(
                "tally {args:?} did not finish within {timeout:?}\nstderr:\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Like `tally`, but panics with the output unless it exits 0.
pub fn tally_ok(args: &[&str], envs: &[(&str, &str)], timeout: Duration) -> Output {
    let out = tally(args, envs, timeout);
    assert!(
        out.status.success(),
        "tally {args:?} failed ({})\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Produces `payloads` to `topic`/`partition` with `key`, and waits for the acks.
pub fn produce(broker: &DevBroker, topic: &str, partition: i32, key: &str, payloads: &[String]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer =
        tally::kafka::client_config(&broker.kafka(), tally::kafka::PRODUCER_DEFAULTS)
            .create()
            .unwrap();
    for payload in payloads {
        p.send(
            BaseRecord::to(topic)
                .partition(partition)
                .key(key)
                .payload(payload),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// Produces `(partition, payload)` records to `requests`, each partition's in order.
pub fn produce_to_partitions(broker: &DevBroker, records: &[(i32, String)]) {
    let mut parts: std::collections::BTreeMap<i32, Vec<String>> = Default::default();
    for (p, r) in records {
        parts.entry(*p).or_default().push(r.clone());
    }
    for (p, part) in parts {
        produce(broker, "requests", p, "k", &part);
    }
}

/// The next offsets a worker's `report.json` in `state` shows, summed over its
/// partitions (-1 before it writes one).
pub fn reported_offsets(state: &Path) -> i64 {
    std::fs::read_to_string(state.join("report.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v["partitions"]
                .as_array()
                .map(|ps| ps.iter().filter_map(|p| p["next_offset"].as_i64()).sum())
        })
        .unwrap_or(-1)
}

/// Produces events `from..from + n` of tenant-a to `requests`/0, uncompressed (so
/// they fill the log: the dev broker keeps the newest 5 MiB of a partition, and
/// enough of them move its log start), event `i` at `base_ts + 100 ms · i`.
pub fn produce_filling(broker: &DevBroker, from: i64, n: i64, base_ts: i64) {
    produce_at(broker, from..from + n, |i| base_ts + i * 100);
}

/// `produce_filling` with event `i` at `ts(i)`.
pub fn produce_at(broker: &DevBroker, seqs: std::ops::Range<i64>, ts: impl Fn(i64) -> i64) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer =
        tally::kafka::client_config(&broker.kafka(), tally::kafka::PRODUCER_DEFAULTS)
            .set("compression.type", "none")
            .create()
            .unwrap();
    for i in seqs {
        let payload = event(&format!("req-{i:09}"), "tenant-a", "small", ts(i));
        let mut record = BaseRecord::to("requests")
            .partition(0)
            .key("tenant-a")
            .payload(&payload);
        while let Err((_, r)) = p.send(record) {
            p.poll(Duration::from_millis(10));
            record = r;
        }
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

/// Every window result on `topic`, in partition then offset order (progress
/// records left out).
pub fn results(broker: &DevBroker, topic: &str) -> Vec<tally::engine::ResultRecord> {
    window_payloads(broker, topic)
        .iter()
        .map(|p| serde_json::from_slice(p).unwrap())
        .collect()
}

/// The payloads of the window results on `topic`, in partition then offset order
/// (progress records and `reprocess-late`'s adjustments left out).
pub fn window_payloads(broker: &DevBroker, topic: &str) -> Vec<Vec<u8>> {
    tally::kafka::read::read_topic(&broker.kafka(), topic)
        .unwrap()
        .into_iter()
        .filter(|r| !is_progress(&r.payload) && !r.payload.starts_with(br#"{"kind":"adjustment""#))
        .map(|r| r.payload)
        .collect()
}

/// The final payload of every window result on `topic` (its highest version), by
/// key and source partition: the invoice as a deduplicating sink keeps it.
pub fn final_payloads(
    broker: &DevBroker,
    topic: &str,
) -> std::collections::BTreeMap<(String, i32), (u64, Vec<u8>)> {
    let mut out: std::collections::BTreeMap<(String, i32), (u64, Vec<u8>)> =
        std::collections::BTreeMap::new();
    for payload in window_payloads(broker, topic) {
        let rec: tally::engine::ResultRecord = serde_json::from_slice(&payload).unwrap();
        let k = (rec.key(), rec.source_partition);
        if out.get(&k).is_none_or(|(v, _)| rec.version > *v) {
            out.insert(k, (rec.version, payload));
        }
    }
    out
}

/// Whether a results-topic payload is a progress record (finality).
pub fn is_progress(payload: &[u8]) -> bool {
    payload.starts_with(br#"{"kind":"progress""#)
}

/// The generator's expected invoice lines, in the view's order.
pub fn expected_rows(e: &tally::gen::Expected) -> Vec<InvoiceLine> {
    support::expected_invoice(e)
}

/// The invoice view, ordered by tenant and window end.
pub fn view_rows(db: &str) -> Vec<InvoiceLine> {
    support::invoice(db).expect("reading the invoice view")
}

/// A valid input record.
pub fn event(id: &str, tenant: &str, model: &str, ts: i64) -> String {
    format!(
        r#"{{"request_id":"{id}","tenant_id":"{tenant}","model":"{model}","prompt_tokens":1000,"completion_tokens":500,"completed_ts":{ts}}}"#
    )
}

/// The generator's dirty-input mix used across the suite.
pub const DIRTY: &[&str] = &[
    "--late-fraction",
    "0.01",
    "--duplicate-fraction",
    "0.02",
    "--malformed-fraction",
    "0.01",
];

/// The first CPU this process may run on (`Cpus_allowed_list` of /proc/self/status):
/// `taskset -c` with it runs a child on one CPU, where tally's record paths run
/// step 1 inline (issue 38).
pub fn first_allowed_cpu() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status");
    list.trim().split([',', '-']).next().unwrap().to_owned()
}

/// Runs `tally gen --config <cfg> <args> --expected-file <dir>/<name>.json` and returns
/// the exact expectation it wrote.
pub fn generate(cfg: &Path, dir: &Path, name: &str, args: &[&str]) -> tally::gen::Expected {
    let expected = dir.join(format!("{name}.json"));
    let mut all = vec!["gen", "--config", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend(["--expected-file", expected.to_str().unwrap()]);
    tally_ok(&all, &[], Duration::from_secs(300));
    serde_json::from_slice(&std::fs::read(&expected).unwrap()).unwrap()
}

/// A throw-away PostgreSQL cluster of its own (`scripts/pg.sh`), stopped on drop:
/// for tests that restart it or need its TLS mode (`envs`: `PG_TLS_DIR`,
/// `PG_PASSWORD`). `url` has no password.
pub struct ScratchPostgres {
    dir: PathBuf,
    pub url: String,
}

impl ScratchPostgres {
    pub fn start(dir: &Path, envs: &[(&str, &str)]) -> Self {
        let dir = dir.join("pg");
        let status = Command::new(pg_script())
            .arg("start")
            .arg(&dir)
            .envs(envs.iter().copied())
            .status()
            .expect("scripts/pg.sh start");
        assert!(status.success(), "scripts/pg.sh could not start PostgreSQL");
        let url = std::fs::read_to_string(dir.join("url")).unwrap();
        ScratchPostgres {
            url: url.trim().to_string(),
            dir,
        }
    }

    /// `pg_ctl restart`: every client loses its connection.
    pub fn restart(&self) {
        let status = Command::new(pg_script())
            .arg("restart")
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(status.success(), "scripts/pg.sh restart failed");
    }
}

impl Drop for ScratchPostgres {
    fn drop(&mut self) {
        let _ = Command::new(pg_script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

fn pg_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pg.sh")
}

/// Where a tally process listens that was given `127.0.0.1:0` (the kernel picks
/// the port as it binds, so no other test can take it between choosing and
/// binding): the `addr=` of the first line in its log `log` (text format, at
/// least `info`) that contains `what`.
pub fn bound_addr(log: &Path, what: &str) -> String {
    wait_until(
        &format!("\"{what}\" in {}", log.display()),
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(log).ok()?;
            let line = text.lines().find(|l| l.contains(what))?;
            let at = line.find(" addr=")? + " addr=".len();
            line[at..].split_whitespace().next().map(str::to_string)
        },
    )
}

/// The log line of the metrics endpoints (`run`, `sink`, `reprocess-late`).
pub const METRICS_SERVING: &str = "serving /metrics, /healthz and /readyz";

/// `GET path` on `addr` over a fresh connection: (status, body); `None` while
/// nothing listens there.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http_get_with(addr, path, "")
}

/// `http_get` with the usage API's `Authorization: Bearer <key>`.
pub fn api_get(addr: &str, key: &str, path: &str) -> Option<(u16, String)> {
    http_get_with(addr, path, &format!("Authorization: Bearer {key}\r\n"))
}

/// `http_get` with extra header lines (each ending in CRLF).
pub fn http_get_with(addr: &str, path: &str, headers: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: tally\r\n{headers}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// The S3-compatible server `scripts/test.sh` started (`scripts/s3.sh`):
/// `TALLY_TEST_S3_ENDPOINT`. The standard `AWS_*` credentials (any value: the
/// test server accepts them) are set for this process and every tally it spawns.
pub fn s3_endpoint() -> String {
    static CREDENTIALS: std::sync::Once = std::sync::Once::new();
    CREDENTIALS.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", "tally-test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "tally-test-secret-key");
        std::env::set_var("AWS_REGION", "us-east-1");
    });
    std::env::var("TALLY_TEST_S3_ENDPOINT").expect(
        "TALLY_TEST_S3_ENDPOINT is not set: run the suite with scripts/test.sh, which starts \
         an S3-compatible server (scripts/s3.sh)",
    )
}

/// The `[checkpoint]` settings of a store at `s3://tally/<prefix>` on the test
/// server, as TOML lines for a `[checkpoint]` section (`interval` is the caller's).
pub fn s3_checkpoint(prefix: &str) -> String {
    let endpoint = s3_endpoint();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "dir = \"s3://tally/{prefix}-{}-{nanos}\"\nobject_store = {{ aws_endpoint = \"{endpoint}\", \
         aws_allow_http = \"true\", aws_region = \"us-east-1\" }}",
        std::process::id()
    )
}

/// Rewrites a config written by `write_config` to keep its checkpoints on the test
/// S3 server (a prefix of its own).
pub fn use_s3(cfg: &Path, prefix: &str) {
    let text = std::fs::read_to_string(cfg).unwrap();
    let start = text
        .find("[checkpoint]\ndir = ")
        .expect("a [checkpoint] dir");
    let line_end =
        start + "[checkpoint]\n".len() + text[start + "[checkpoint]\n".len()..].find('\n').unwrap();
    let text = format!(
        "{}[checkpoint]\n{}{}",
        &text[..start],
        s3_checkpoint(prefix),
        &text[line_end..]
    );
    std::fs::write(cfg, text).unwrap();
}

/// A long-running tally process (`run`, `sink`, `api`), stderr in `log`; killed
/// when dropped.
pub struct Service {
    child: std::process::Child,
    pub log: PathBuf,
}

impl Service {
    pub fn start(args: &[&str], envs: &[(&str, &str)], log: PathBuf) -> Self {
        let child = Command::new(tally_bin())
            .args(args)
            .envs(envs.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Service { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits for the exit, at most `within` (then kills it and panics with its log).
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "tally did not exit within {within:?}; its log:\n{}",
                    tail(&self.log_text(), 60)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The last `n` lines of `text` (a long log in a failure message).
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 100 ms until it gives `Some`, for at most `within`; panics
/// naming `what` otherwise.
pub fn wait_until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
