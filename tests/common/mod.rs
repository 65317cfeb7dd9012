//! Test harness: real services only. Each test gets its own `tally dev-broker`
//! process (with its own topics) and its own database in the PostgreSQL cluster that
//! `scripts/test.sh` started (`TALLY_TEST_PG_URL`). A service that cannot start
//! fails the test; nothing is skipped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tally::config::KafkaConfig;

pub fn tally_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tally")
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!("tally-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `tally dev-broker` child process.
pub struct DevBroker {
    child: Child,
    pub bootstrap: String,
    _dir: TempDir,
}

impl DevBroker {
    pub fn start(topics: &[(&str, i32)]) -> Self {
        let dir = TempDir::new("broker");
        let file = dir.path().join("bootstrap");
        let mut cmd = Command::new(tally_bin());
        cmd.args(["dev-broker", "--no-default-topics", "--address-file"])
            .arg(&file);
        for (t, n) in topics {
            cmd.arg("--topic").arg(format!("{t}:{n}"));
        }
        let mut child = cmd
            .env("TALLY_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cannot spawn tally dev-broker");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = std::fs::read_to_string(&file) {
                if !s.trim().is_empty() {
                    return DevBroker {
                        child,
                        bootstrap: s.trim().to_string(),
                        _dir: dir,
                    };
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("tally dev-broker exited with {status} before publishing its address");
            }
            assert!(
                Instant::now() < deadline,
                "tally dev-broker did not start within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kafka(&self) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: self.bootstrap.clone(),
            ..KafkaConfig::default()
        }
    }
}

impl Drop for DevBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = tally::sink::connect(&admin)
            .await
            .expect("cannot connect to the test PostgreSQL");
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("CREATE DATABASE");
    });
    match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("TALLY_TEST_PG_URL has no database part: {admin}"),
    }
}

/// Runs a query and returns rows as strings (every column cast to text by the caller).
pub fn query(url: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = tally::sink::connect(url).await.expect("connect");
        let rows = client
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| r.get::<_, Option<String>>(i))
                    .collect()
            })
            .collect()
    })
}

pub fn execute(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = tally::sink::connect(url).await.expect("connect");
        client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    });
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
    use std::io::Read;
    let mut child = Command::new(tally_bin())
        .args(args)
        .envs(envs.iter().copied())
        .env("TALLY_LOG", "info")
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

/// Every window result on `topic`, in partition then offset order.
pub fn results(broker: &DevBroker, topic: &str) -> Vec<tally::engine::ResultRecord> {
    tally::kafka::read::read_topic(&broker.kafka(), topic)
        .unwrap()
        .iter()
        .map(|r| serde_json::from_slice(&r.payload).unwrap())
        .collect()
}

/// The generator's expected invoice lines as `(tenant, window_end, cost_pico)` rows.
pub fn expected_rows(e: &tally::gen::Expected) -> Vec<Vec<Option<String>>> {
    e.windows
        .iter()
        .map(|w| {
            vec![
                Some(w.tenant_id.clone()),
                Some(w.window_end.to_string()),
                Some(w.cost_pico.clone()),
            ]
        })
        .collect()
}

/// The invoice view as `(tenant, window_end, cost_pico)` rows, in the same order.
pub fn view_rows(db: &str) -> Vec<Vec<Option<String>>> {
    query(
        db,
        "SELECT tenant_id, window_end::TEXT, cost_pico::TEXT FROM tenant_cost_minute ORDER BY 1, 2",
    )
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
