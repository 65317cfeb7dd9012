//! The Prometheus alert rules and the Grafana dashboard (docs/operations/alerting.md):
//! promtool accepts the rules and their unit tests pass, and every metric they name is
//! one that tally exports. No services needed; promtool comes from scripts/bootstrap.sh.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn operations(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/operations")
        .join(file)
}

/// Runs `promtool <args> <file>` and fails with its output unless it succeeds. A missing
/// promtool is a failure, not a skip.
fn promtool(args: &[&str], file: &Path) {
    let command = format!("promtool {} {}", args.join(" "), file.display());
    let out = match Command::new("promtool")
        .args(args)
        .arg(file)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{command}: promtool is not installed: run scripts/bootstrap.sh \
             (it installs Debian's prometheus package, which ships promtool)"
        ),
        Err(e) => panic!("{command}: {e}"),
    };
    assert!(
        out.status.success(),
        "{command} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_the_alert_rules_and_their_unit_tests_pass() {
    promtool(&["check", "rules"], &operations("alerts.yml"));
    promtool(&["test", "rules"], &operations("alerts.test.yml"));
}

/// Every `tally_[a-z0-9_]+` in `text` that does not continue a longer word (so
/// `job:tally_x:sum` counts, `mytally_x` does not), with a histogram's `_bucket`,
/// `_sum` or `_count` suffix stripped.
fn metric_families(text: &str) -> BTreeSet<String> {
    const PREFIX: &str = "tally_";
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(PREFIX) {
        let start = from + found;
        let mut end = start + PREFIX.len();
        while end < bytes.len() && matches!(bytes[end], b'a'..=b'z' | b'0'..=b'9' | b'_') {
            end += 1;
        }
        let continues_a_word =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if !continues_a_word && end > start + PREFIX.len() {
            let name = &text[start..end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            names.insert(family.to_string());
        }
        from = end;
    }
    names
}

#[test]
fn the_alerts_and_the_dashboard_name_only_exported_metrics() {
    let mut unknown = Vec::new();
    for file in ["alerts.yml", "dashboard.json"] {
        let path = operations(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let names = metric_families(&text);
        assert!(!names.is_empty(), "{file} names no tally_ metric");
        for name in names {
            if !tally::metrics::EXPORTED.contains(&name.as_str()) {
                unknown.push(format!("{file}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics that tally does not export (tally::metrics::EXPORTED):\n  {}\nexported:\n  {}",
        unknown.join("\n  "),
        tally::metrics::EXPORTED.join("\n  ")
    );
}
