//! Environment overrides, `TALLY_<SECTION>__<KEY>` (nested with more `__`), applied
//! to the file's table before it is deserialized
//! (docs/reference/configuration.md#environment-overrides).
//!
//! Invariants — a variable sets exactly one key, or the configuration is refused
//! naming the variable (never a silent choice, never silently ignored):
//! - Its path is lower-cased and matched to the file's keys without regard to case
//!   (`TALLY_PRICES__GPT4O__…` sets `[prices.GPT4o]`); a name that matches two keys of
//!   one table (models `Small` and `small`) is refused, naming both.
//! - Two variables that set one key (`…__SMALL__…` and `…__small__…`, or a variable
//!   and its `_FILE` form) are refused, naming both.
//! - A path through a key that holds a value, not a table, is refused.
//! - Under `[kafka]`, a key that is not one of tally's own is a librdkafka property
//!   written with `_` for `.` (`TALLY_KAFKA__SESSION_TIMEOUT_MS` →
//!   `session.timeout.ms`).

use std::path::Path;

use super::{read_secret_file, ConfigError, KafkaConfig};

/// One override applied: the variable, the dotted key it set, its value.
#[derive(Debug, Clone)]
pub(super) struct Override {
    pub var: String,
    pub key: String,
    pub value: String,
    /// The lower-cased path, from the variable's name.
    path: Vec<String>,
}

/// Applies every `TALLY_X__Y` variable of `env` to `root`.
pub(super) fn apply(
    root: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<Override>, ConfigError> {
    let mut applied: Vec<Override> = Vec::new();
    for (name, value) in env {
        let Some(path) = name.strip_prefix("TALLY_") else {
            continue;
        };
        // TALLY_X__Y_FILE=/path: the value of TALLY_X__Y, read from a file.
        let (var, path, value) = match path.strip_suffix("_FILE").filter(|p| p.contains("__")) {
            Some(base) => {
                let read = read_secret_file(Path::new(&value)).map_err(|msg| ConfigError::Env {
                    var: name.clone(),
                    key: base.to_ascii_lowercase().replace("__", "."),
                    msg,
                })?;
                (name.clone(), base.to_string(), read)
            }
            None => (name.clone(), path.to_string(), value),
        };
        let path: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
        if path.len() < 2 || path.iter().any(String::is_empty) {
            continue;
        }
        let mut one = Override {
            var,
            key: String::new(),
            value,
            path,
        };
        one.key =
            set(root, &one.path, one.value.clone()).map_err(|(key, msg)| ConfigError::Env {
                var: one.var.clone(),
                key,
                msg,
            })?;
        if let Some(first) = applied.iter().find(|o| o.key == one.key) {
            return Err(ConfigError::Env {
                var: one.var,
                key: one.key,
                msg: format!(
                    "{} sets the same key: which value applies would depend on the order of \
                     the environment. Unset one of them",
                    first.var
                ),
            });
        }
        applied.push(one);
    }
    Ok(applied)
}

/// Applies `o` alone to `table` (to find which override a table fails on).
pub(super) fn reapply(table: &mut toml::Table, o: &Override) {
    let _ = set(table, &o.path, o.value.clone());
}

/// The key of `t` that `name` (lower-cased) addresses: the file's own spelling,
/// or `name` when the file has none; an error naming both when two match.
fn in_file(
    t: &toml::Table,
    name: &str,
    dotted: &[String],
    path: &[String],
) -> Result<String, (String, String)> {
    let mut found = t.keys().filter(|k| k.eq_ignore_ascii_case(name));
    let Some(first) = found.next() else {
        return Ok(name.to_string());
    };
    match found.next() {
        None => Ok(first.clone()),
        Some(second) => {
            let at = |k: &str| {
                let mut p = dotted.to_vec();
                p.push(k.to_string());
                p.join(".")
            };
            Err((
                path.join("."),
                format!(
                    "matches both `{}` and `{}` of the file, which differ only by case; a \
                     variable's name cannot tell them apart. Rename one of them in the file",
                    at(first),
                    at(second)
                ),
            ))
        }
    }
}

/// Sets `path` to `value`; returns the dotted key it set, or (key, why) when the
/// path cannot name one key.
fn set(
    table: &mut toml::Table,
    path: &[String],
    value: String,
) -> Result<String, (String, String)> {
    let Some((last, parents)) = path.split_last() else {
        return Err((String::new(), "names no key".into()));
    };
    let mut t = table;
    let mut dotted: Vec<String> = Vec::with_capacity(path.len());
    for p in parents {
        let name = in_file(t, p, &dotted, path)?;
        dotted.push(name.clone());
        let entry = t
            .entry(name)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(next) = entry else {
            return Err((
                dotted.join("."),
                format!(
                    "is a {}, not a table, so it has no key `{}`",
                    entry.type_str(),
                    path[dotted.len()..].join(".")
                ),
            ));
        };
        t = next;
    }
    let mut key = last.clone();
    if parents.len() == 1 && parents[0] == "kafka" && !KafkaConfig::OWN_KEYS.contains(&key.as_str())
    {
        key = key.replace('_', ".");
    }
    let key = in_file(t, &key, &dotted, path)?;
    dotted.push(key.clone());
    t.insert(key, toml::Value::String(value));
    Ok(dotted.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_variable_sets_one_key_or_is_refused() {
        let mut t: toml::Table = "[prices.GPT4o]\ninput_per_1k = \"0.1\"\n".parse().unwrap();
        let o = apply(&mut t, env(&[("TALLY_PRICES__GPT4O__INPUT_PER_1K", "0.3")])).unwrap();
        assert_eq!(o[0].key, "prices.GPT4o.input_per_1k");
        assert_eq!(t["prices"]["GPT4o"]["input_per_1k"].as_str(), Some("0.3"));

        let mut two: toml::Table = "[prices.Small]\na = 1\n[prices.small]\na = 2\n"
            .parse()
            .unwrap();
        let e = apply(&mut two, env(&[("TALLY_PRICES__SMALL__A", "3")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TALLY_PRICES__SMALL__A")
                && e.contains("prices.Small")
                && e.contains("prices.small"),
            "{e}"
        );

        let mut t = toml::Table::new();
        let e = apply(
            &mut t,
            env(&[
                ("TALLY_PRICES__SMALL__INPUT_PER_1K", "0.1"),
                ("TALLY_PRICES__small__INPUT_PER_1K", "0.2"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("TALLY_PRICES__SMALL__INPUT_PER_1K")
                && e.contains("TALLY_PRICES__small__INPUT_PER_1K"),
            "{e}"
        );

        let mut t: toml::Table = "[sink]\ndatabase_url = \"x\"\n".parse().unwrap();
        let e = apply(&mut t, env(&[("TALLY_SINK__DATABASE_URL__HOST", "h")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TALLY_SINK__DATABASE_URL__HOST") && e.contains("sink.database_url"),
            "{e}"
        );
    }
}
