//! SIGHUP never stops a tally process (docs/operations/running.md#signals): the
//! Kafka worker reloads its prices on it (`evolution`), every other long-running
//! command logs that it ignores it and runs on — a file run to the exact end of its
//! input.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;

const IGNORED: &str = "SIGHUP received: this command has nothing to reload";

/// A tally child with its stderr in a file; killed when dropped.
struct Proc {
    child: std::process::Child,
    log: PathBuf,
}

impl Proc {
    fn start(args: &[&str], log: PathBuf) -> Self {
        let child = std::process::Command::new(tally_bin())
            .args(args)
            .env("TALLY_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits until the process catches SIGHUP (its `SigCgt` mask in /proc), so a
    /// signal sent next cannot hit it before its handlers are installed.
    fn wait_catching_sighup(&mut self, what: &str) {
        let pid = self.child.id();
        wait_until(
            &format!("{what} catches SIGHUP"),
            Duration::from_secs(30),
            || {
                assert!(self.alive(), "{what} exited:\n{}", self.log());
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                let mask = u64::from_str_radix(mask.trim(), 16).ok()?;
                (mask & (1 << (libc::SIGHUP - 1)) != 0).then_some(())
            },
        );
    }

    fn wait(&mut self, within: Duration) -> std::process::ExitStatus {
        wait_until("the exit", within, || self.child.try_wait().unwrap())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGHUP, then: the log line, and the process still running a while later.
fn hangup_is_ignored(p: &mut Proc, what: &str) {
    p.wait_catching_sighup(what);
    signal(p.child.id(), libc::SIGHUP);
    wait_until(
        &format!("{what} logs the SIGHUP"),
        Duration::from_secs(10),
        || {
            assert!(p.alive(), "{what} died of SIGHUP:\n{}", p.log());
            p.log().contains(IGNORED).then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(p.alive(), "{what} stopped after SIGHUP:\n{}", p.log());
}

fn file_config(dir: &Path) -> PathBuf {
    let d = dir.display();
    let path = dir.join("file.toml");
    std::fs::write(
        &path,
        format!("[checkpoint]\ndir = \"{d}/checkpoints\"\n[state]\ndir = \"{d}/state\"\n{PRICES}"),
    )
    .unwrap();
    path
}

/// Issue 33, item 9: SIGHUP to a file run in progress (its input a FIFO whose
/// writer stays open) is logged and ignored; the run finishes at the end of its
/// input, exit 0, with exactly the outputs of a run without the signal.
#[test]
fn sighup_never_stops_a_file_run_and_it_finishes_exactly() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = TempDir::new("sighup-file");
    let cfg = file_config(dir.path());
    let t = 1_767_261_600_000i64;
    let lines: Vec<String> = (0..6)
        .map(|i| event(&format!("r-{i}"), "acme", "small", t + i * 40_000) + "\n")
        .collect();
    let plain = dir.path().join("plain.jsonl");
    std::fs::write(&plain, lines.concat()).unwrap();
    let expected = dir.path().join("expected.jsonl");
    let out = tally(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--input-file",
            plain.to_str().unwrap(),
            "--output-file",
            expected.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let fifo = dir.path().join("in.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let output = dir.path().join("out.jsonl");
    let mut run = Proc::start(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--input-file",
            fifo.to_str().unwrap(),
            "--output-file",
            output.to_str().unwrap(),
        ],
        dir.path().join("run.log"),
    );
    wait_until("reading input", Duration::from_secs(30), || {
        run.log().contains("reading input").then_some(())
    });
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    writer.write_all(lines[..3].concat().as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    hangup_is_ignored(&mut run, "a file run");
    writer.write_all(lines[3..].concat().as_bytes()).unwrap();
    drop(writer);
    let status = run.wait(Duration::from_secs(30));
    let log = run.log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("consumed 6 | folded 6 |"), "{log}");
    assert_eq!(
        std::fs::read(&output).unwrap(),
        std::fs::read(&expected).unwrap()
    );
}

/// Issue 33, item 9, beyond the file mode: `dev-broker`, `sink`, `api`,
/// `reprocess-late --follow` and `gen --rate` log a SIGHUP and keep running.
#[test]
fn sighup_is_logged_and_ignored_by_every_long_running_command() {
    let dir = TempDir::new("sighup-services");
    let d = dir.path();
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    // Nothing listens on port 1: the sink keeps retrying PostgreSQL meanwhile.
    let cfg = write_config(
        d,
        &broker,
        "hup",
        "[sink]\ndatabase_url = \"postgres://tally@127.0.0.1:1/tally?connect_timeout=1\"\n\
         [api]\nlisten = \"127.0.0.1:0\"\nallow_unauthenticated = true\n",
    );
    let c = cfg.to_str().unwrap();
    let address = d.join("address");
    let commands: [(&str, Vec<&str>); 5] = [
        (
            "dev-broker",
            vec!["dev-broker", "--address-file", address.to_str().unwrap()],
        ),
        ("sink", vec!["sink", "--config", c]),
        ("api", vec!["api", "--config", c]),
        (
            "reprocess-late --follow",
            vec!["reprocess-late", "--config", c, "--follow"],
        ),
        (
            "gen --rate",
            vec!["gen", "--config", c, "--count", "1000000", "--rate", "50"],
        ),
    ];
    for (i, (what, args)) in commands.iter().enumerate() {
        let mut p = Proc::start(args, d.join(format!("{i}.log")));
        hangup_is_ignored(&mut p, what);
    }
}
