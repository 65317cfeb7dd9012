//! Crafted checkpoint stores (issue 19, defects 3 and 8), read by the real binary
//! under a small address-space limit (`ulimit -v`): an extreme length, a device
//! where a file belongs, a name out of the store. Each is reported as damage;
//! nothing aborts, hangs or allocates without bound.

use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tally::checkpoint::format::{decode_manifest, encode_manifest};

use crate::common::*;

/// `tally <args>` under `ulimit -v` of 1 GiB.
fn limited(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let mut all = vec!["-c", "ulimit -v 1048576; exec \"$0\" \"$@\"", tally_bin()];
    all.extend_from_slice(args);
    run_to_end("sh", &all, envs, Duration::from_secs(60))
}

/// A format-3 manifest (magic, version) around `body`, under a valid checksum.
fn write_manifest_body(dir: &Path, body: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut bytes = b"TALLYMAN\0\x03".to_vec();
    bytes.extend_from_slice(body);
    let sum = Sha256::digest(&bytes);
    bytes.extend_from_slice(&sum);
    std::fs::write(dir.join("MANIFEST"), bytes).unwrap();
}

#[test]
fn crafted_checkpoints_are_damage_under_a_small_address_space() {
    let dir = TempDir::new("crafted");
    let d = dir.path();
    let cfg = d.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\ngroup_id = \"file-in\"\n[checkpoint]\ndir = \"{0}/checkpoints\"\n[state]\ndir = \"{0}/state\"\n{PRICES}",
            d.display()
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    // A good checkpoint, written by a file-mode run.
    let input = d.join("in.jsonl");
    let lines: Vec<String> = (0..50)
        .map(|i| {
            event(
                &format!("r{i}"),
                "acme",
                "small",
                1_767_261_600_000 + i * 1000,
            )
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = d.join("out.jsonl");
    tally_ok(
        &[
            "run",
            "--config",
            c,
            "--input-file",
            input.to_str().unwrap(),
            "--output-file",
            out.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    let store = d.join("checkpoints").join("file-in");
    let good = limited(&["checkpoints", "verify", "--config", c], &[]);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );

    // 1. A 2^62-byte string length (postcard varint) under a valid checksum.
    write_manifest_body(
        &store.join("chk-00000000000000000900-x"),
        &[7, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40],
    );
    // 2. A MANIFEST that is /dev/zero.
    let z = store.join("chk-00000000000000000901-x");
    std::fs::create_dir_all(&z).unwrap();
    std::os::unix::fs::symlink("/dev/zero", z.join("MANIFEST")).unwrap();
    // 3. A good checkpoint's manifest, renamed as checkpoint 902 of worker `x`
    // (its segment moved along), whose partition file is /dev/zero.
    let copy = store.join("chk-00000000000000000902-x");
    let original = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("MANIFEST").is_file() && p.join("p-000000-0000").is_file())
        .expect("the file run wrote a checkpoint");
    let mut m = decode_manifest(&std::fs::read(original.join("MANIFEST")).unwrap()).unwrap();
    (m.id, m.worker) = (tally::checkpoint::CheckpointId(902), "x".into());
    m.partitions[0].segments.truncate(1);
    m.partitions[0].segments[0].checkpoint = "chk-00000000000000000902-x".into();
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::write(copy.join("MANIFEST"), encode_manifest(&m)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", copy.join("p-000000-0000")).unwrap();
    // 4. A manifest copied under another name: damage, not a second checkpoint.
    let moved = store.join("chk-00000000000000000903-x");
    std::fs::create_dir_all(&moved).unwrap();
    std::fs::copy(original.join("MANIFEST"), moved.join("MANIFEST")).unwrap();

    for args in [["checkpoints", "verify"], ["checkpoints", "list"]] {
        let mut all = args.to_vec();
        all.extend(["--config", c]);
        let out = limited(&all, &[]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.code().is_some(), "killed by a signal: {text}");
        assert!(text.contains("chk-00000000000000000900-x"), "{text}");
        assert!(text.contains("not a regular file"), "{text}");
        if args[1] == "verify" {
            assert_eq!(out.status.code(), Some(1), "{text}");
            assert!(
                text.contains("chk-00000000000000000902-x/p-000000-0000"),
                "{text}"
            );
            assert!(
                text.contains("chk-00000000000000000903-x/MANIFEST: the manifest is checkpoint"),
                "{text}"
            );
        }
    }
    // A group id that would leave the store.
    let out = limited(
        &["checkpoints", "list", "--config", c],
        &[("TALLY_KAFKA__GROUP_ID", "../x")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("kafka.group_id"),
        "{err}"
    );
}
