//! Checkpoint stores under faults (issue 33) on the real services: an S3 that
//! answers 500 or nothing for a while, and FIFOs in place of a checkpoint's files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::recovery::{wait_killed, Job};
use crate::s3_proxy::FaultyS3;

/// Issue 33, defect 6: S3 answers the GETs of objects with 500 for a while. A
/// worker restarted meanwhile exits 4 (unavailable: restart it) — not 3 with
/// `--reset-state earliest` advice, as when the failed manifest reads were
/// taken for "no checkpoint" — and once S3 answers again the run is exact.
#[test]
fn on_s3_answering_500_a_restore_exits_4_and_the_run_is_exact_after() {
    let job = Job::on_s3("s3flaky");
    let proxy = FaultyS3::start(&s3_endpoint(), false);
    let text = std::fs::read_to_string(&job.cfg).unwrap().replace(
        &format!("aws_endpoint = \"{}\"", s3_endpoint()),
        &format!("aws_endpoint = \"{}\"", proxy.endpoint),
    );
    assert!(text.contains(&proxy.endpoint));
    std::fs::write(&job.cfg, text).unwrap();
    let (expected, _) = job.generate(20_000, None);
    let mut w = job.spawn_worker(&[("TALLY_CRASH_AT", "after_offset_commit:4")]);
    wait_killed(&mut w, "after_offset_commit");
    proxy
        .failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let out = tally(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(600),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(proxy.failed.load(std::sync::atomic::Ordering::SeqCst) > 0);
    assert!(
        err.contains("object store is unavailable") && err.contains("500"),
        "{err}"
    );
    assert!(!err.contains("--reset-state"), "{err}");
    assert!(!err.contains("CHECKPOINT DAMAGED"), "{err}");
    // S3 stops answering at all: a worker waiting on it in its restore stops on
    // SIGTERM (object_store alone would wait up to 3 minutes per request).
    proxy
        .failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    proxy
        .hanging
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut w = job.spawn_worker(&[]);
    let since = Instant::now();
    while proxy.held.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "no GET reached the proxy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    signal(w.id(), libc::SIGTERM);
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = w.try_wait().unwrap() {
            break s;
        }
        if stopped.elapsed() > Duration::from_secs(30) {
            let _ = w.kill();
            panic!("the worker ignored SIGTERM while its restore waited on S3");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // A stop, not a failure: the partitions restored before it are checkpointed.
    assert_eq!(status.code(), Some(0), "{status:?}");
    proxy
        .hanging
        .store(false, std::sync::atomic::Ordering::SeqCst);
    job.finish_and_check(&expected);
}

/// Issue 33, defect 5: FIFOs in place of the newest checkpoint's part and of the
/// next one's `MANIFEST`. `checkpoints list` and `verify` and the worker's restore
/// return at once (each bounded here by a timeout): both are damage, named as not
/// regular files; the restore falls back to the checkpoint before them, and the
/// run is exact.
#[test]
fn fifos_in_the_store_are_damage_found_without_blocking() {
    let job = Job::new("fifo");
    let (expected, _) = job.generate(20_000, None);
    let mut w = job.spawn_worker(&[("TALLY_CRASH_AT", "after_offset_commit:5")]);
    wait_killed(&mut w, "after_offset_commit");
    let root = job.dir.path().join("checkpoints").join("job");
    let mut complete: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("MANIFEST").exists())
        .collect();
    complete.sort();
    assert!(complete.len() >= 3, "{complete:?}");
    let mkfifo = |path: &Path| {
        std::fs::remove_file(path).unwrap();
        assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
    };
    let newest = complete.pop().unwrap();
    let part = std::fs::read_dir(&newest)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("p-"))
        .unwrap();
    mkfifo(&part);
    let second = complete.pop().unwrap();
    mkfifo(&second.join("MANIFEST"));
    for action in ["list", "verify"] {
        let out = tally(
            &["checkpoints", action, "--config", job.cfg()],
            &[],
            Duration::from_secs(60),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("not a regular file"), "{action}: {text}");
        assert!(
            text.contains(second.file_name().unwrap().to_str().unwrap()),
            "{action}: {text}"
        );
        if action == "verify" {
            assert_eq!(out.status.code(), Some(1), "{text}");
            assert!(text.contains(part.to_str().unwrap()), "{text}");
        }
    }
    let run = tally_ok(
        &["run", "--config", job.cfg(), "--until-end"],
        &[],
        Duration::from_secs(300),
    );
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(log.contains("RESTORED FROM AN OLDER CHECKPOINT"), "{log}");
    assert!(log.contains("not a regular file"), "{log}");
    job.sink_and_check("fifo", &expected);
}

/// Issue 33: a local `checkpoint.dir` that cannot be written is local I/O —
/// exit 1 (restart me, after fixing the disk), not 4 (a dependency down). Here
/// it lies under a regular file (the process runs as root, so a read-only mode
/// would not stop it).
#[test]
fn a_local_checkpoint_dir_that_cannot_be_written_exits_1() {
    let dir = TempDir::new("ckptlocal");
    let d = dir.path();
    let blocker = d.join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let cfg = d.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\ngroup_id = \"file-in\"\n[checkpoint]\ndir = \"{}/checkpoints\"\n[state]\ndir = \"{}/state\"\n{PRICES}",
            blocker.display(),
            d.display()
        ),
    )
    .unwrap();
    let input = d.join("in.jsonl");
    std::fs::write(
        &input,
        event("r1", "acme", "small", 1_767_261_600_000) + "\n",
    )
    .unwrap();
    let out = tally(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--input-file",
            input.to_str().unwrap(),
            "--output-file",
            d.join("out.jsonl").to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not-a-dir/checkpoints"), "{err}");
}

/// Issue 33, defect 4, in its real shape: a newer checkpoint whose manifest (valid
/// checksum) lists 12 parts of 256 MiB, each within the per-part limit, with the
/// 12 files there (sparse: 3 GiB that take no disk). The restore held the whole
/// chain (3.2 GB, then `memory allocation … failed` under 2.5 GB of address space);
/// now it reads one part at a time, finds the first damaged, falls back to the
/// checkpoint before it under the same `ulimit -v`, and the run is exact.
#[test]
fn a_chain_of_twelve_256_mib_parts_is_fallen_back_from_under_ulimit_v() {
    use tally::checkpoint::format::{decode_manifest, encode_manifest, MAX_PART_BYTES};
    use tally::checkpoint::{PartRef, Segment, SegmentKind};
    let job = Job::new("bigchain");
    let (expected, _) = job.generate(20_000, None);
    let mut w = job.spawn_worker(&[("TALLY_CRASH_AT", "after_offset_commit:3")]);
    wait_killed(&mut w, "after_offset_commit");
    let root = job.dir.path().join("checkpoints").join("job");
    let newest = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("MANIFEST").exists())
        .max()
        .unwrap();
    let mut m = decode_manifest(&std::fs::read(newest.join("MANIFEST")).unwrap()).unwrap();
    // The same offsets under a greater id: tried first.
    m.id = tally::checkpoint::CheckpointId(m.id.0 + 1_000);
    let name = format!("chk-{:020}-{}", m.id.0, m.worker);
    let dir = root.join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let e = &mut m.partitions[0];
    for i in 0..12 {
        let part = dir.join(format!("p-{:06}-{i:04}", e.partition.0));
        std::fs::File::create(part)
            .unwrap()
            .set_len(MAX_PART_BYTES)
            .unwrap();
    }
    e.segments = vec![Segment {
        checkpoint: name.clone(),
        kind: SegmentKind::Base,
        parts: vec![
            PartRef {
                bytes: MAX_PART_BYTES,
                sha256: [1; 32],
            };
            12
        ],
    }];
    std::fs::write(dir.join("MANIFEST"), encode_manifest(&m)).unwrap();
    let out = run_to_end(
        "sh",
        &[
            "-c",
            "ulimit -v 2500000; exec \"$0\" \"$@\"",
            tally_bin(),
            "run",
            "--config",
            job.cfg(),
            "--until-end",
        ],
        &[],
        Duration::from_secs(600),
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{log}", out.status);
    assert!(log.contains("RESTORED FROM AN OLDER CHECKPOINT"), "{log}");
    assert!(log.contains(&name), "{log}");
    job.sink_and_check("bigchain", &expected);
}
