//! The configuration file (docs/DESIGN.md §11): one typed tree, unknown keys rejected.
//!
//! Loading order: the TOML file (or the built-in defaults), then environment
//! overrides `TALLY_<SECTION>__<KEY>` (nested with more `__`), then `validate()`.
//! Under `[kafka]`, any key containing a dot is a librdkafka property passed
//! through verbatim; in an env override such a key is written with `_` for `.`
//! (`TALLY_KAFKA__SESSION_TIMEOUT_MS` → `session.timeout.ms`).
//!
//! Invariant: a `Config` that passed `validate()` yields an `EngineConfig` with a
//! positive window size, non-negative bounds and at least one priced model.

mod env;
mod prices;
/// The rating schema of issue 36 (quantities, rates, tiers, variants, plans): parsed and
/// checked, not yet part of `Config`.
pub mod rating;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub(crate) use crate::base::duration::{self, MaxLead, Millis, OptMillis};
pub use crate::base::size::{self, Budget};
/// Each subsystem owns its section and checks it (`validate`); the tree holds them.
pub use crate::checkpoint::config::CheckpointConfig;
pub(crate) use crate::engine::config::{DedupConfig, LimitsConfig, WatermarkConfig, WindowConfig};
pub use crate::kafka::config::{KafkaConfig, TopicsConfig};
pub(crate) use crate::metrics::config::MetricsConfig;
pub(crate) use crate::state::config::StateConfig;
pub use prices::{PriceConfig, ScheduledPrice, UtcTime};

use crate::base::InvalidKey;
use crate::engine::EngineConfig;
use crate::model::input::{ExtraDecl, InputConfig, InputMapping};
use crate::model::PriceTable;
use crate::time::WindowSpec;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config: {0}")]
    Parse(String),
    #[error("config key `{key}`: {msg}")]
    Invalid { key: String, msg: String },
    /// A value that came from the environment, not from the file.
    #[error("environment variable {var} (config key `{key}`): {msg}")]
    Env {
        var: String,
        key: String,
        msg: String,
    },
}

impl crate::base::error::Classify for ConfigError {
    fn class(&self) -> crate::base::error::ErrorClass {
        match self {
            ConfigError::Read { .. }
            | ConfigError::Parse(_)
            | ConfigError::Invalid { .. }
            | ConfigError::Env { .. } => crate::base::error::ErrorClass::Config,
        }
    }
}

impl From<InvalidKey> for ConfigError {
    fn from(e: InvalidKey) -> Self {
        ConfigError::Invalid {
            key: e.key,
            msg: e.msg,
        }
    }
}

fn invalid(key: impl Into<String>, msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        msg: msg.into(),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub job: JobConfig,
    pub kafka: KafkaConfig,
    pub topics: TopicsConfig,
    pub window: WindowConfig,
    pub watermark: WatermarkConfig,
    pub dedup: DedupConfig,
    pub limits: LimitsConfig,
    pub checkpoint: CheckpointConfig,
    pub state: StateConfig,
    pub sink: SinkConfig,
    pub metrics: MetricsConfig,
    pub api: ApiConfig,
    /// Where a record's fields are (JSON Pointers) and what they mean.
    pub input: InputConfig,
    /// Per model: USD per 1,000 tokens as decimal strings.
    pub prices: BTreeMap<String, PriceConfig>,
    /// The rating (issue 36) when the file declares usage quantities, a variant or
    /// `[prices]` in the rating schema (`rating::split`); `None`: today's pricing.
    #[serde(skip)]
    pub(crate) rating: Option<Arc<rating::Rating>>,
    /// Those tables as written (`effective_toml` prints them back).
    #[serde(skip)]
    pub(crate) rating_tables: Option<(toml::Table, toml::Table)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    /// Carried in every result; a higher generation replaces a lower one in the
    /// sink (re-billing after a price fix).
    #[serde(deserialize_with = "duration::de_u64")]
    pub generation: u64,
}

impl Default for JobConfig {
    fn default() -> Self {
        Self { generation: 1 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkConfig {
    pub database_url: String,
    /// Consumer group of the sink on the results topic.
    pub group_id: String,
    /// How long the sink keeps retrying PostgreSQL while it is unreachable (a
    /// restart, a failover) before it exits 4.
    pub retry_budget: Millis,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            database_url: "postgres://postgres@127.0.0.1:5432/tally".into(),
            group_id: "tally-sink".into(),
            retry_budget: Millis(300_000),
        }
    }
}

/// `tally api` (the usage API, docs/API.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Where the usage API listens (`host:port`). It reads PostgreSQL through
    /// `sink.database_url`; a role with SELECT on the sink's tables is enough.
    pub listen: String,
    /// The file of hashed API keys (`tally api-key create` writes it; reloaded on
    /// SIGHUP). Required unless `allow_unauthenticated`. (Not `keys_file`: a
    /// variable ending in `_FILE` reads a key's value from a file.)
    pub keys: Option<PathBuf>,
    /// Serve every route to anyone, without keys (logged as a warning at start).
    #[serde(deserialize_with = "crate::base::duration::de_bool")]
    pub allow_unauthenticated: bool,
    /// Serve `/metrics` without a key even when keys are configured.
    #[serde(deserialize_with = "crate::base::duration::de_bool")]
    pub public_metrics: bool,
    /// Serve HTTPS: the certificate chain and key (PEM), and with `client_ca`,
    /// require client certificates that CA signed. Reloaded on SIGHUP.
    pub tls: Option<ApiTlsConfig>,
    /// The longest `to − from` a usage query may span (400 beyond).
    pub max_range: Millis,
    /// PostgreSQL's `statement_timeout` for every query, CSV streams included.
    pub query_timeout: Millis,
    /// Requests in flight at once in this process (429 beyond).
    #[serde(deserialize_with = "crate::base::duration::de_u64")]
    pub max_concurrent: u64,
    /// Requests per second per key, in bursts of twice that (429 beyond); 0: none.
    #[serde(deserialize_with = "crate::base::duration::de_u64")]
    pub rate_limit: u64,
    /// PostgreSQL connections, each lent to one request at a time.
    #[serde(deserialize_with = "crate::base::duration::de_u64")]
    pub pool_size: u64,
    /// The most input records one `/v1/explain` replays (422 beyond).
    #[serde(deserialize_with = "crate::base::duration::de_u64")]
    pub explain_max_records: u64,
}

/// `[api.tls]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            keys: None,
            allow_unauthenticated: false,
            public_metrics: false,
            tls: None,
            max_range: Millis(366 * 86_400_000),
            query_timeout: Millis(60_000),
            max_concurrent: 64,
            rate_limit: 50,
            pool_size: 8,
            explain_max_records: 2_000_000,
        }
    }
}

impl Config {
    /// Loads `path` (if given), applies `TALLY_*` environment overrides, validates.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.into(),
                source,
            })?,
            None => String::new(),
        };
        Self::from_toml_with_env(&text, std::env::vars())
    }

    /// Parses TOML text with the given environment overrides, then validates.
    pub(crate) fn from_toml_with_env(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        // toml's own message quotes the offending line, which may hold a secret
        // that cannot be registered yet: say where, not what.
        let file: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            ConfigError::Parse(match line {
                Some(l) => format!("line {l}: {}", e.message()),
                None => e.message().to_string(),
            })
        })?;
        let mut root = file.clone();
        let applied = env::apply(&mut root, env)?;
        resolve_files(&mut root, "")?;
        // Before anything can print a value (see `secrets`).
        crate::secrets::register_from(&root);
        let rating_tables = rating::split(&mut root);
        let parse = |mut t: toml::Table| {
            rating::split(&mut t);
            Config::deserialize(toml::Value::Table(t))
        };
        let mut cfg = match parse(root) {
            Ok(cfg) => cfg,
            Err(e) => {
                // Name the variable when the file alone is fine: the first
                // override that fails on its own is the culprit.
                if parse(file.clone()).is_ok() {
                    for o in &applied {
                        let mut one = file.clone();
                        env::reapply(&mut one, o);
                        if let Err(e) = parse(one) {
                            return Err(ConfigError::Env {
                                var: o.var.clone(),
                                key: o.key.clone(),
                                msg: de_error(&e).0,
                            });
                        }
                    }
                }
                return Err(match de_error(&e) {
                    (msg, Some(key)) => ConfigError::Invalid { key, msg },
                    (msg, None) => ConfigError::Parse(msg),
                });
            }
        };
        if let Some((input, prices)) = &rating_tables {
            cfg.rating = Some(Arc::new(rating::parse(input, prices)?));
        }
        cfg.rating_tables = rating_tables;
        cfg.validate().map_err(|e| match e {
            ConfigError::Invalid { key, msg } => match applied.iter().find(|o| o.key == key) {
                Some(o) => ConfigError::Env {
                    var: o.var.clone(),
                    key,
                    msg,
                },
                None => ConfigError::Invalid { key, msg },
            },
            other => other,
        })?;
        Ok(cfg)
    }

    /// The configuration as TOML that loads back to itself, every secret (the
    /// rule of `crate::secrets`) shown as `***`: what `tally config` prints.
    pub(crate) fn effective_toml(&self) -> Result<String, ConfigError> {
        let err = |e: &dyn std::fmt::Display| ConfigError::Parse(e.to_string());
        let mut value = toml::Value::try_from(self).map_err(|e| err(&e))?;
        // By key, whatever the value's length, and inside connection strings;
        // then every registered value.
        fn mask(v: &mut toml::Value) {
            match v {
                toml::Value::Table(t) => {
                    for (k, v) in t.iter_mut() {
                        match v {
                            toml::Value::String(s) => *s = crate::secrets::mask_value(k, s),
                            _ => mask(v),
                        }
                    }
                }
                toml::Value::Array(a) => a.iter_mut().for_each(mask),
                _ => {}
            }
        }
        if let (Some((input, prices)), toml::Value::Table(root)) = (&self.rating_tables, &mut value)
        {
            rating::merge_back(root, input, prices);
        }
        mask(&mut value);
        let text = toml::to_string(&value).map_err(|e| err(&e))?;
        Ok(crate::secrets::redact(&text).into_owned())
    }

    /// Cross-field checks; each error names the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.window.validate()?;
        self.checkpoint.validate()?;
        if self.job.generation == 0 {
            return Err(invalid("job.generation", "must be at least 1"));
        }
        self.topics.validate()?;
        self.kafka.validate()?;
        let g = &self.kafka.group_id;
        if !crate::checkpoint::names::is_one_dir_name(g) {
            return Err(invalid(
                "kafka.group_id",
                format!(
                    "{g:?} also names the checkpoint directory <checkpoint.dir>/<group_id>, so it \
                     must be one directory name (no '/', not '.' or '..')"
                ),
            ));
        }
        self.input_mapping()?;
        // Prices are checked when present; commands that price require them
        // (`engine()`); the sink and the broker do not.
        if !self.prices.is_empty() {
            self.price_table()?;
        }
        Ok(())
    }

    /// The engine's view of the configuration.
    pub(crate) fn engine(&self) -> Result<Arc<EngineConfig>, ConfigError> {
        let (prices, rating) = match &self.rating {
            None => (self.price_table()?, None),
            Some(r) => (PriceTable::default(), Some(Arc::new(r.book.clone()))),
        };
        Ok(Arc::new(EngineConfig {
            window: WindowSpec::new(self.window.size.0, self.window.offset.0),
            allowed_lateness_ms: self.window.allowed_lateness.0,
            max_out_of_orderness_ms: self.watermark.max_out_of_orderness.0,
            max_future_ms: self.watermark.max_future.0.map(|m| m.0),
            time_source: self.watermark.time_source,
            max_lead_ms: self
                .watermark
                .max_lead
                .resolve(self.window.allowed_lateness.0),
            dedup_extra_ms: self.dedup.extra_horizon.0,
            max_record_bytes: usize::try_from(self.limits.max_record_bytes).unwrap_or(usize::MAX),
            generation: self.job.generation,
            prices,
            rating,
            rating_source: self.rating_source(),
            input: self.input_mapping()?,
        }))
    }

    /// The rating's tables as canonical TOML (keys sorted), `""` without a rating.
    fn rating_source(&self) -> String {
        let Some((input, prices)) = &self.rating_tables else {
            return String::new();
        };
        let mut t = toml::Table::new();
        t.insert("input".into(), toml::Value::Table(input.clone()));
        t.insert("prices".into(), toml::Value::Table(prices.clone()));
        toml::to_string(&t).unwrap_or_default()
    }

    /// The compiled `[input]` mapping.
    pub(crate) fn input_mapping(&self) -> Result<InputMapping, ConfigError> {
        let mapping = InputMapping::new(&self.input).map_err(|(key, msg)| invalid(key, msg))?;
        let Some(r) = &self.rating else {
            return Ok(mapping);
        };
        let variant = r.variant.as_ref().map(|(name, pointer)| ExtraDecl {
            name: name.clone(),
            pointer: pointer.clone(),
            required: false,
        });
        let quantities: Vec<ExtraDecl> = r
            .quantities
            .iter()
            .map(|q| ExtraDecl {
                name: q.name.clone(),
                pointer: q.pointer.clone(),
                required: q.required,
            })
            .collect();
        mapping
            .with_extra(&quantities, variant.as_ref())
            .map_err(|(key, msg)| invalid(key, msg))
    }
}

/// A deserialization error as its message and the dotted key it is about: toml
/// writes the key on a line of its own (`…\nin `prices.small.effective_from``).
fn de_error(e: &toml::de::Error) -> (String, Option<String>) {
    let text = e.to_string();
    let text = text.trim_end();
    match text.rsplit_once('\n') {
        Some((msg, last)) => match last.strip_prefix("in `").and_then(|k| k.strip_suffix('`')) {
            Some(key) => (msg.trim_end().to_string(), Some(key.to_string())),
            None => (text.to_string(), None),
        },
        None => (text.to_string(), None),
    }
}

/// A file's contents as a config value: one trailing newline dropped (as
/// `echo` writes it), nothing else changed.
fn read_secret_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    Ok(text.strip_suffix('\r').unwrap_or(text).to_string())
}

/// Replaces every value written `{ file = "/path" }` (inside a section) with the
/// file's contents: secrets from Kubernetes secret mounts.
fn resolve_files(t: &mut toml::Table, prefix: &str) -> Result<(), ConfigError> {
    for (k, v) in t.iter_mut() {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let toml::Value::Table(inner) = v else {
            continue;
        };
        match inner.get("file") {
            Some(toml::Value::String(path)) if inner.len() == 1 && !prefix.is_empty() => {
                let text =
                    read_secret_file(Path::new(path)).map_err(|msg| ConfigError::Invalid {
                        key: key.clone(),
                        msg,
                    })?;
                *v = toml::Value::String(text);
            }
            _ => resolve_files(inner, &key)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
