//! The file mode (`tally run --input-file IN --output-file OUT`, docs/operations/running.md#the-file-mode):
//! what it refuses before it writes anything, what its side files carry, how it bounds
//! a line and how it stops on a signal. No broker and no database.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;

/// A file-mode config under `dir` (state, checkpoints, prices); `extra` is appended.
fn file_config(dir: &Path, extra: &str) -> PathBuf {
    let d = dir.display();
    let path = dir.join("file.toml");
    std::fs::write(
        &path,
        format!(
            "[checkpoint]\ndir = \"{d}/checkpoints\"\n[state]\ndir = \"{d}/state\"\n{extra}\n{PRICES}"
        ),
    )
    .unwrap();
    path
}

fn run_file(cfg: &Path, input: &Path, output: &Path) -> std::process::Output {
    tally(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--input-file",
            input.to_str().unwrap(),
            "--output-file",
            output.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    )
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Four events of acme in the 10:00 minute (2026-01-01) and one at 10:05 that closes it.
fn events() -> String {
    let t = 1_767_261_600_000i64;
    let mut s = String::new();
    for i in 0..4 {
        s.push_str(&event(&format!("r-{i}"), "acme", "small", t + i * 1000));
        s.push('\n');
    }
    s.push_str(&event("r-9", "acme", "small", t + 300_000));
    s.push('\n');
    s
}

#[test]
fn an_output_that_is_the_input_is_refused_and_the_input_survives() {
    let dir = TempDir::new("file-same");
    let cfg = file_config(dir.path(), "");
    let input = dir.path().join("in.jsonl");
    let data = events();
    std::fs::write(&input, &data).unwrap();
    std::fs::hard_link(&input, dir.path().join("link.jsonl")).unwrap();
    // The same name; a hard link; the input as the dead-letter side file of OUT.
    let side_input = dir.path().join("out.jsonl.dlq.jsonl");
    std::fs::hard_link(&input, &side_input).unwrap();
    for (input_arg, output) in [
        (input.clone(), input.clone()),
        (input.clone(), dir.path().join("link.jsonl")),
        (side_input.clone(), dir.path().join("out.jsonl")),
    ] {
        let out = run_file(&cfg, &input_arg, &output);
        let err = stderr(&out);
        assert_eq!(
            out.status.code(),
            Some(3),
            "refused: {input_arg:?} -> {output:?}: {err}"
        );
        assert!(
            err.contains(&input_arg.display().to_string()) && err.contains("is the input file"),
            "the refusal names both paths: {err}"
        );
        assert!(!err.contains("consumed"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&input).unwrap(),
            data,
            "the input survives"
        );
        // Refused before anything was opened for writing or wiped.
        assert!(!dir.path().join("state").exists(), "{err}");
        assert!(!dir.path().join("out.jsonl").exists());
    }
    // Two outputs that are one file.
    std::fs::write(dir.path().join("r.jsonl"), "").unwrap();
    std::fs::hard_link(
        dir.path().join("r.jsonl"),
        dir.path().join("r.jsonl.late.jsonl"),
    )
    .unwrap();
    let out = run_file(&cfg, &input, &dir.path().join("r.jsonl"));
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stderr(&out).contains("are the same file"),
        "{}",
        stderr(&out)
    );
    // And a distinct output still works.
    let out = run_file(&cfg, &input, &dir.path().join("good.jsonl"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("consumed 5 |"), "{}", stderr(&out));
}

#[test]
fn the_kafka_timestamp_time_source_is_refused_at_start_naming_the_key() {
    let dir = TempDir::new("file-kts");
    let cfg = file_config(dir.path(), "[watermark]\ntime_source = \"kafka_timestamp\"");
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, events()).unwrap();
    let output = dir.path().join("out.jsonl");
    let out = run_file(&cfg, &input, &output);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "a configuration error: {err}");
    assert!(
        err.contains("watermark.time_source") && err.contains("kafka_timestamp"),
        "{err}"
    );
    assert!(!err.contains("consumed"), "{err}");
    assert!(!output.exists() && !dir.path().join("state").exists());
}

/// The original bytes of a side-file line: `record` as UTF-8, or `record_base64` decoded.
fn original(v: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    match (v.get("record"), v.get("record_base64")) {
        (Some(s), None) => s.as_str().unwrap().as_bytes().to_vec(),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b.as_str().unwrap())
            .unwrap(),
        other => panic!("exactly one of record, record_base64: {other:?}"),
    }
}

fn side_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn side_files_carry_the_original_bytes_exactly_and_a_leading_bom_is_skipped() {
    let dir = TempDir::new("file-bytes");
    // The lead limit off: six records, each moving the watermark (DESIGN §4.4).
    let cfg = file_config(
        dir.path(),
        "[window]\nallowed_lateness = \"0s\"\n[watermark]\nmax_lead = \"off\"",
    );
    let t = 1_767_261_600_000i64;
    let bom = b"\xEF\xBB\xBF";
    // Line 1 opens with the file's byte-order mark: skipped, the record is billed.
    let first = [&bom[..], event("r-0", "acme", "small", t).as_bytes()].concat();
    // Invalid UTF-8 at the start of request_id's string (`{"request_id":"` is 15 bytes).
    let invalid = event("r-1", "acme", "small", t + 1000).into_bytes();
    let invalid = [&invalid[..15], b"\xff\xfe", &invalid[15..]].concat();
    // A byte-order mark that does not open the file (files concatenated): named.
    let concatenated = [&bom[..], event("r-2", "acme", "small", t + 2000).as_bytes()].concat();
    let closing = event("r-9", "acme", "small", t + 300_000).into_bytes();
    // Too late, with an escaped string in a field tally ignores.
    let late = event("r-5", "acme", "small", t + 30_000).into_bytes();
    let late = [&b"{\"note\":\"\\u00e9\","[..], &late[1..]].concat();
    // Bytes that are not UTF-8 in a field tally ignores: the record is not JSON
    // (RFC 8259 §8.1, DESIGN §3), a dead letter with its bytes as they were.
    let ignored = event("r-6", "acme", "small", t + 301_000).into_bytes();
    let ignored = [&b"{\"note\":\"\xc3\x28\","[..], &ignored[1..]].concat();
    let input = dir.path().join("in.jsonl");
    let mut data = Vec::new();
    for l in [&first, &invalid, &concatenated, &closing, &late, &ignored] {
        data.extend_from_slice(l);
        data.push(b'\n');
    }
    std::fs::write(&input, &data).unwrap();
    let output = dir.path().join("out.jsonl");
    let out = run_file(&cfg, &input, &output);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("consumed 6 | folded 2 | too late 1 | dead letters 3 |"),
        "{err}"
    );
    let dlq = side_lines(&dir.path().join("out.jsonl.dlq.jsonl"));
    assert_eq!(dlq.len(), 3, "{dlq:?}");
    assert_eq!(original(&dlq[2]), ignored);
    assert!(dlq[2].get("record_base64").is_some(), "{:?}", dlq[2]);
    assert_eq!(dlq[2]["error"], "malformed_json");
    assert_eq!(original(&dlq[0]), invalid);
    assert!(dlq[0].get("record_base64").is_some(), "{:?}", dlq[0]);
    assert_eq!(dlq[0]["source"], format!("{}:2", input.display()));
    assert_eq!(original(&dlq[1]), concatenated);
    assert_eq!(dlq[1]["error"], "malformed_json");
    let detail = dlq[1]["detail"].as_str().unwrap();
    assert!(detail.contains("byte-order mark"), "{detail}");
    assert_eq!(dlq[1]["source"], format!("{}:3", input.display()));
    let late_lines = side_lines(&dir.path().join("out.jsonl.late.jsonl"));
    assert_eq!(late_lines.len(), 1);
    assert_eq!(original(&late_lines[0]), late);
    assert_eq!(late_lines[0]["source"], format!("{}:5", input.display()));
    // r-0 (after the skipped mark) is billed in the 10:00 window.
    let results = std::fs::read_to_string(&output).unwrap();
    let first: serde_json::Value = serde_json::from_str(results.lines().next().unwrap()).unwrap();
    assert_eq!(
        (first["window_end"].as_i64(), first["requests"].as_u64()),
        (Some(t + 60_000), Some(1))
    );
}

#[test]
fn an_oversized_line_is_a_dead_letter_with_its_prefix_and_true_length() {
    let dir = TempDir::new("file-big");
    let cfg = file_config(dir.path(), "[limits]\nmax_record_bytes = 1024");
    let t = 1_767_261_600_000i64;
    // 15 bytes, then 2-byte characters: the 1024-byte prefix ends inside one.
    let mut big = String::from("{\"request_id\":\"");
    while big.len() < 10_000_000 {
        big.push('é');
    }
    let big = big.into_bytes();
    let mut data = Vec::new();
    for line in [
        event("r-0", "acme", "small", t).as_bytes(),
        &big,
        event("r-1", "acme", "small", t + 1000).as_bytes(),
    ] {
        data.extend_from_slice(line);
        data.extend_from_slice(b"\r\n");
    }
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, &data).unwrap();
    let output = dir.path().join("out.jsonl");
    let out = run_file(&cfg, &input, &output);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("consumed 3 | folded 2 | too late 0 | dead letters 1 |"),
        "{err}"
    );
    let dlq = side_lines(&dir.path().join("out.jsonl.dlq.jsonl"));
    assert_eq!(dlq.len(), 1);
    let d = &dlq[0];
    assert_eq!(d["error"], "oversized_record");
    assert_eq!(
        d["detail"],
        format!("record is {} bytes, limit 1024", big.len())
    );
    assert_eq!(d["bytes"].as_u64(), Some(big.len() as u64));
    assert_eq!(d["truncated"], true);
    assert_eq!(d["source"], format!("{}:2", input.display()));
    assert_eq!(original(d), &big[..1024]);
    let results = std::fs::read_to_string(&output).unwrap();
    let pane: serde_json::Value = serde_json::from_str(results.lines().next().unwrap()).unwrap();
    assert_eq!(pane["requests"], 2, "{results}");
}

/// A `tally run --input-file` child whose stderr is read line by line as it runs.
struct Running {
    child: std::process::Child,
    stderr: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(cfg: &Path, input: &Path, output: &Path) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(tally_bin())
            .args(["run", "--config", cfg.to_str().unwrap()])
            .args(["--input-file", input.to_str().unwrap()])
            .args(["--output-file", output.to_str().unwrap()])
            .env("TALLY_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn tally");
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Running {
            child,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    fn wait_for(&mut self, needle: &str, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while !self.seen.iter().any(|l| l.contains(needle)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {needle:?} within {timeout:?}: {:#?}", self.seen),
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the exit (killing the child after `timeout`); returns it and stderr.
    fn wait(mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let deadline = std::time::Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("no exit within {timeout:?}: {:#?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.seen.extend(self.stderr.iter());
        (status, self.seen.join("\n"))
    }
}

#[test]
fn sigterm_stops_a_run_blocked_on_a_fifo_promptly_with_its_outputs_and_checkpoint() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = TempDir::new("file-fifo");
    // The lead limit off: five records, each moving the watermark (DESIGN §4.4).
    let cfg = file_config(dir.path(), "[watermark]\nmax_lead = \"off\"");
    let fifo = dir.path().join("in.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let output = dir.path().join("out.jsonl");
    let mut run = Running::start(&cfg, &fifo, &output);
    run.wait_for("reading input", Duration::from_secs(30));
    // The writer stays open: without a stop, the run would wait for more forever.
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    writer.write_all(events().as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let sent = std::time::Instant::now();
    signal(run.pid(), libc::SIGTERM);
    let (status, err) = run.wait(Duration::from_secs(10));
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(
        err.contains("interrupted by SIGTERM: stopped after line 5 of"),
        "{err}"
    );
    assert!(err.contains("consumed 5 | folded 5 |"), "{err}");
    // The outputs are flushed up to the stop: the 10:00 window closed by line 5.
    let results = std::fs::read_to_string(&output).unwrap();
    let pane: serde_json::Value = serde_json::from_str(results.lines().next().unwrap()).unwrap();
    assert_eq!(
        (pane["requests"].as_u64(), pane["pane"].as_str()),
        (Some(4), Some("on_time"))
    );
    assert_eq!(
        results.lines().count(),
        1,
        "the open 10:05 window is not emitted"
    );
    // And the state is checkpointed there.
    let store = dir.path().join("checkpoints/file-in");
    let complete = std::fs::read_dir(&store)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().join("MANIFEST").exists())
        .count();
    assert!(complete >= 1, "a complete checkpoint in {store:?}");
    drop(writer);
}

/// VmHWM (peak resident memory) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn dev_zero_is_read_in_bounded_memory_and_sigint_stops_it() {
    let dir = TempDir::new("file-zero");
    let cfg = file_config(dir.path(), "[limits]\nmax_record_bytes = 1024");
    let output = dir.path().join("out.jsonl");
    let mut run = Running::start(&cfg, Path::new("/dev/zero"), &output);
    run.wait_for("reading input", Duration::from_secs(30));
    // One endless line: the unbounded reader grew it by gigabytes a second.
    std::thread::sleep(Duration::from_secs(1));
    let peak = peak_rss_kib(run.pid());
    signal(run.pid(), libc::SIGINT);
    let (status, err) = run.wait(Duration::from_secs(10));
    assert!(peak < 256 * 1024, "peak RSS {peak} KiB");
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted by SIGINT: stopped after line 0 of /dev/zero"),
        "{err}"
    );
}

#[test]
fn stdin_through_a_pipe_is_read_to_its_end() {
    use std::io::Write;
    let dir = TempDir::new("file-stdin");
    let cfg = file_config(dir.path(), "");
    let output = dir.path().join("out.jsonl");
    let mut child = std::process::Command::new(tally_bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .args(["--input-file", "/dev/stdin", "--output-file"])
        .arg(&output)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(events().as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("consumed 5 | folded 5 |"), "{err}");
    assert_eq!(std::fs::read_to_string(&output).unwrap().lines().count(), 2);
}

#[test]
fn gzip_and_zstd_archives_bill_like_the_plain_file_and_progress_is_logged() {
    use std::io::Write;
    let dir = TempDir::new("file-archives");
    let cfg = file_config(dir.path(), "");
    let plain = dir.path().join("events.jsonl");
    let text = events();
    std::fs::write(&plain, &text).unwrap();
    // Two gzip members, as `cat a.gz b.gz` makes: the second holds the closer.
    let (head, tail) = text.split_at(text.rfind("{\"request_id\":\"r-9\"").unwrap());
    let gz = |part: &str| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(part.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let gz_path = dir.path().join("events.jsonl.gz");
    std::fs::write(&gz_path, [gz(head), gz(tail)].concat()).unwrap();
    let zst_path = dir.path().join("events.jsonl.zst");
    std::fs::write(&zst_path, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();

    // Issue 33: the suffix in upper case, and an archive under a name without one.
    let upper = dir.path().join("events.jsonl.GZ");
    std::fs::copy(&gz_path, &upper).unwrap();
    let unnamed = dir.path().join("events-zst.jsonl");
    std::fs::copy(&zst_path, &unnamed).unwrap();

    let mut outputs = Vec::new();
    let inputs = [&plain, &gz_path, &zst_path, &upper, &unnamed];
    for (i, input) in inputs.into_iter().enumerate() {
        let output = dir.path().join(format!("out-{i}.jsonl"));
        let out = run_file(&cfg, input, &output);
        let err = stderr(&out);
        assert!(out.status.success(), "{}: {err}", input.display());
        assert!(err.contains("consumed 5 | folded 5 |"), "{err}");
        // Not a terminal: the final progress as a log line, against the file's size.
        let size = std::fs::metadata(input).unwrap().len();
        let progress = err
            .lines()
            .find(|l| l.contains("input progress"))
            .unwrap_or_else(|| panic!("no progress line: {err}"));
        assert!(progress.contains("done=5"), "{progress}");
        assert!(progress.contains(&format!("bytes={size}")), "{progress}");
        assert!(
            progress.contains(&format!("total_bytes={size}")),
            "{progress}"
        );
        assert!(progress.contains("percent=100"), "{progress}");
        outputs.push(std::fs::read(&output).unwrap());
    }
    assert!(!outputs[0].is_empty());
    assert_eq!(outputs[1], outputs[0], ".gz");
    assert_eq!(outputs[2], outputs[0], ".zst");
    assert_eq!(outputs[3], outputs[0], ".GZ");
    assert_eq!(outputs[4], outputs[0], "zstd without a suffix");

    // A corrupt archive is an error naming it, not garbage records.
    let bad = dir.path().join("bad.jsonl.gz");
    std::fs::write(&bad, &text).unwrap();
    let out = run_file(&cfg, &bad, &dir.path().join("out-bad.jsonl"));
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("bad.jsonl.gz"), "{err}");
}

/// Issue 33: a full disk under the dead-letter side file is reported as what it
/// is — writing that side file, named — not as a checkpoint store (exit 1).
#[test]
fn a_full_disk_under_a_side_file_names_the_file_and_the_write() {
    let dir = TempDir::new("file-full");
    let cfg = file_config(dir.path(), "");
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, format!("{}not json\n", events())).unwrap();
    let output = dir.path().join("out.jsonl");
    let dlq = dir.path().join("out.jsonl.dlq.jsonl");
    // Every write to /dev/full fails with ENOSPC.
    std::os::unix::fs::symlink("/dev/full", &dlq).unwrap();
    let out = run_file(&cfg, &input, &output);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("tally: error"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.contains(&format!(
            "writing the dead-letter side file {}",
            dlq.display()
        )) && line.contains("No space left on device"),
        "{line}"
    );
    assert!(!line.contains("checkpoint store"), "{line}");
}

/// Issue 33: a working copy that cannot be created (here a file in its place; a
/// read-only file system says `Read-only file system`) is a sentence naming
/// `state.dir`, the path and the OS's reason — not Rust debug output (exit 1).
#[test]
fn an_unusable_state_dir_is_named_in_a_sentence() {
    let dir = TempDir::new("file-state-blocked");
    let cfg = file_config(dir.path(), "");
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, events()).unwrap();
    let blocker = dir.path().join("state/rocksdb");
    std::fs::create_dir_all(blocker.parent().unwrap()).unwrap();
    std::fs::write(&blocker, b"not a directory").unwrap();
    let out = run_file(&cfg, &input, &dir.path().join("out.jsonl"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "state.dir: cannot create the working copy {}: File exists",
            blocker.display()
        )),
        "{err}"
    );
    assert!(!err.contains("Os {"), "{err}");
}

/// Issue 38: on one CPU the file mode reads and prepares on its main thread (no
/// reading thread); on more, a reading thread does. Either way every output — the
/// results, the late and the dead-letter side files — is the same bytes, over an
/// input of many chunks with duplicates, late records and malformed lines.
#[test]
fn one_cpu_reads_inline_and_writes_the_same_bytes_as_two() {
    let dir = TempDir::new("file-one-cpu");
    let cfg = file_config(dir.path(), "");
    let input = dir.path().join("in.jsonl");
    let mut args = vec![
        "--count",
        "30000",
        "--tenants",
        "40",
        "--partitions",
        "1",
        "--output-file",
        input.to_str().unwrap(),
    ];
    args.extend_from_slice(DIRTY);
    generate(&cfg, dir.path(), "expected", &args);
    let cpu = first_allowed_cpu();
    let mut outputs = Vec::new();
    for pinned in [false, true] {
        let output = dir.path().join(format!("out-{pinned}.jsonl"));
        let _ = std::fs::remove_dir_all(dir.path().join("state"));
        let mut run = vec![
            tally_bin(),
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--input-file",
            input.to_str().unwrap(),
            "--output-file",
            output.to_str().unwrap(),
        ];
        if pinned {
            run.splice(0..0, ["-c", cpu.as_str()]);
        }
        let (bin, args) = if pinned {
            ("taskset", &run[..])
        } else {
            (run[0], &run[1..])
        };
        let out = run_to_end(bin, args, &[], Duration::from_secs(120));
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("consumed 30000 |"), "{err}");
        if pinned {
            assert!(err.contains("cpus=1 step1=\"inline\""), "{err}");
        } else if std::thread::available_parallelism().is_ok_and(|n| n.get() > 1) {
            assert!(err.contains("step1=\"threaded\""), "{err}");
        }
        let read = |ext: &str| std::fs::read(format!("{}{ext}", output.display())).unwrap();
        outputs.push([read(""), read(".late.jsonl"), read(".dlq.jsonl")]);
    }
    for (i, name) in ["results", "late", "dead letters"].iter().enumerate() {
        assert!(!outputs[0][i].is_empty(), "no {name}");
        assert!(outputs[0][i] == outputs[1][i], "{name} differ on one CPU");
    }
}
