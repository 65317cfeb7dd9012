//! Facts about the code base that no other test sees (docs/DEVELOPING.md#conventions):
//! `rust-version` in Cargo.toml is the true minimum of the locked crates. No services
//! needed; it asks `cargo metadata` offline, so it runs after any build.

use std::path::Path;
use std::process::Command;

/// A `rust-version` as numbers, so that 1.9 < 1.10 and 1.88 = 1.88.0.
fn version(text: &str) -> Vec<u64> {
    let mut v: Vec<u64> = text
        .trim()
        .split('.')
        .map(|n| {
            n.parse()
                .unwrap_or_else(|_| panic!("rust-version {text:?}: not numbers"))
        })
        .collect();
    v.resize(3, 0);
    v
}

/// The host's target triple, from `rustc -vV` (the crates the build really compiles).
fn host() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host")
}

/// Cargo.toml's `rust-version` is the highest one any locked dependency declares (for
/// the host's target): not lower — the build would fail on it — and not higher — it
/// would claim a need nothing has. Bumping a crate that needs a newer rustc fails here
/// until Cargo.toml says so. Clippy's `incompatible_msrv` lint (on in CI's `-D
/// warnings`) holds tally's own code to the same version.
#[test]
fn rust_version_is_the_locked_crates_highest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml parses");
    let declared = manifest["package"]["rust-version"]
        .as_str()
        .expect("Cargo.toml declares package.rust-version");

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(root)
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let ours: Vec<&serde_json::Value> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .collect();
    let highest = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| !ours.contains(&&p["id"]))
        .filter_map(|p| {
            let v = p["rust_version"].as_str()?;
            Some((version(v), format!("{} {} ({v})", p["name"], p["version"])))
        })
        .max()
        .expect("some locked crate declares a rust-version");
    assert_eq!(
        version(declared),
        highest.0,
        "Cargo.toml says rust-version = {declared:?}; the locked crate needing the newest \
         rustc is {}",
        highest.1
    );
}
