//! `[checkpoint]`: where checkpoints go and how often (docs/DESIGN.md §7,
//! docs/reference/configuration.md). The section is this subsystem's; the config
//! tree (`config`) holds it, and calls `validate` from its own.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::objects::remote;
use crate::base::duration::{self, Millis, OptMillis};
use crate::base::InvalidKey;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// A local (or mounted) directory, or an object-store URL (`s3://bucket/prefix`,
    /// `gs://…`, `az://…`): `checkpoint::objects`.
    pub dir: PathBuf,
    /// Options of the object store, under the `object_store` crate's key names
    /// (`aws_endpoint`, `aws_region`, `aws_allow_http`, …). Credentials come from
    /// the environment (`AWS_*`, …) or the instance's identity.
    #[serde(deserialize_with = "de_string_map")]
    pub object_store: BTreeMap<String, String>,
    /// Time between state commits (producer flush, state write, offset commit).
    pub interval: Millis,
    #[serde(deserialize_with = "duration::de_u64")]
    pub retain: u64,
    /// Beyond `retain`: per partition, the oldest checkpoint of each period of
    /// this length is kept (`"off"`: none), for the newest `anchors` periods
    /// (`checkpoint::anchors`).
    pub anchor_every: OptMillis,
    #[serde(deserialize_with = "duration::de_u64")]
    pub anchors: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            dir: "./data/checkpoints".into(),
            object_store: BTreeMap::new(),
            interval: Millis(10_000),
            retain: 3,
            anchor_every: OptMillis(Some(Millis(86_400_000))),
            anchors: 8,
        }
    }
}

impl CheckpointConfig {
    /// The section's own checks; each error names the key.
    pub(crate) fn validate(&self) -> Result<(), InvalidKey> {
        if self.interval.0 <= 0 {
            return Err(InvalidKey::new(
                "checkpoint.interval",
                "must be greater than 0",
            ));
        }
        if self.retain == 0 {
            return Err(InvalidKey::new("checkpoint.retain", "must be at least 1"));
        }
        if self.anchor_every.0.is_some_and(|m| m.0 <= 0) {
            return Err(InvalidKey::new(
                "checkpoint.anchor_every",
                "must be greater than 0, or \"off\"",
            ));
        }
        if self.anchors == 0 {
            return Err(InvalidKey::new(
                "checkpoint.anchors",
                "must be at least 1 (`checkpoint.anchor_every = \"off\"` keeps none)",
            ));
        }
        let dir = self.dir.to_string_lossy();
        if remote::is_url(&dir) {
            remote::check(&dir, &self.object_store)
                .map_err(|(key, msg)| InvalidKey { key, msg })?;
        } else if !self.object_store.is_empty() {
            return Err(InvalidKey::new(
                "checkpoint.object_store",
                "is set but `checkpoint.dir` is a local path: set `checkpoint.dir` to the store's \
                 URL (s3://bucket/prefix), or remove the options",
            ));
        }
        Ok(())
    }
}

/// A table of string options whose values may be written as TOML scalars
/// (`aws_allow_http = true` is `"true"`).
fn de_string_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, toml::Value>::deserialize(d)?;
    raw.into_iter()
        .map(|(k, v)| match v {
            toml::Value::String(s) => Ok((k, s)),
            toml::Value::Boolean(_) | toml::Value::Integer(_) | toml::Value::Float(_) => {
                Ok((k, v.to_string()))
            }
            other => Err(serde::de::Error::custom(format!(
                "option {k:?} is a {}, not a string",
                other.type_str()
            ))),
        })
        .collect()
}
