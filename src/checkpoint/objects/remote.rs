//! A checkpoint store in object storage, through the `object_store` crate:
//! `s3://bucket/prefix` (AWS S3 and S3-compatible servers), `gs://bucket/prefix`
//! (Google Cloud Storage), `az://container/prefix` or `abfss://…` (Azure Blob).
//!
//! - Options: `[checkpoint.object_store]` holds string options handed to the
//!   builder under the crate's own key names (`aws_endpoint`, `aws_region`,
//!   `aws_allow_http`, `google_service_account`, `azure_storage_account_name`, …);
//!   an unknown key is refused by name. Credentials come from the standard
//!   environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`) or the instance's identity, as
//!   the crate reads them; their values are registered as secrets before anything
//!   can print them (`crate::secrets`), and no error carries them.
//! - `put_new` is `PutMode::Create`: S3 sends `If-None-Match: *` (a `412` is
//!   `Exists`); GCS and Azure use their own create-only preconditions. The crate
//!   does not retry a create whose connection broke, so `put_new` tries again for
//!   up to 30 s itself (an outage of the store for a few seconds costs a
//!   checkpoint that much later, not a restart); and since an attempt may have
//!   created the object and lost only its answer, an `Exists` whose object holds
//!   exactly the bytes being written is success (keys are unique per writer,
//!   DESIGN §7.1, so those bytes are this write).
//! - Calls block the calling thread on this store's own small tokio runtime, so
//!   the worker's threads (the poll loop, the exporter, restores) use it as they use
//!   the local directory. It must not be called from inside another runtime.
//! - A failed call (after the crate's own retries: by default up to 10, with
//!   backoff, for at most 3 minutes — `object_store::RetryConfig`) is
//!   `ObjectError::Unavailable`, never damage: a restore stops there (exit 4)
//!   instead of falling back or concluding that there is no checkpoint. While a
//!   restore runs (`interrupt_when`), a stop request ends a read or listing
//!   waiting on the store within 50 ms.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::{valid_key, ObjectError, ObjectInfo, Objects};

pub struct RemoteObjects {
    store: Box<dyn ObjectStore>,
    /// `<prefix of the URL>/<group>`.
    root: ObjPath,
    /// The URL of the root, for people.
    url: String,
    rt: tokio::runtime::Runtime,
    /// When reads and listings give up (`Objects::interrupt_when`).
    stop: std::sync::Mutex<Option<fn() -> bool>>,
}

/// How often a waiting read checks for a stop request.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// How long `put_new` tries again a create that did not reach the store, from
/// 100 ms apart to 2 s apart.
const PUT_RETRY_FOR: Duration = Duration::from_secs(30);
const PUT_BACKOFF: Duration = Duration::from_millis(100);
const PUT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Whether `dir` (the value of `checkpoint.dir`) names object storage rather
/// than a local path.
pub(crate) fn is_url(dir: &str) -> bool {
    dir.split_once("://")
        .is_some_and(|(s, _)| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The schemes this build reads, for error messages.
pub(crate) const SCHEMES: &str = "s3://, s3a://, gs://, az://, azure://, abfs://, abfss://";

/// Environment variables whose values are credentials: registered as secrets.
fn register_credentials() {
    for (k, v) in std::env::vars() {
        let cloud = ["AWS_", "GOOGLE_", "AZURE_"]
            .iter()
            .any(|p| k.starts_with(p));
        let secret = ["SECRET", "TOKEN", "PASSWORD"]
            .iter()
            .any(|s| k.contains(s))
            || k.ends_with("_KEY")
            || k.ends_with("_SAS");
        if cloud && secret {
            crate::secrets::register(&v);
        }
    }
}

/// A configuration problem: `(config key, message)`.
pub(crate) type OptionError = (String, String);

fn unknown(key: &str, scheme: &str) -> OptionError {
    (
        format!("checkpoint.object_store.{key}"),
        format!(
            "not an option of the {scheme} store (the `object_store` crate's key names, e.g. \
             aws_endpoint, aws_region, aws_allow_http; credentials belong in the environment)"
        ),
    )
}

fn build(
    url: &str,
    options: &BTreeMap<String, String>,
) -> Result<Box<dyn ObjectStore>, OptionError> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    let built: Result<Box<dyn ObjectStore>, object_store::Error> = match scheme {
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env().with_url(url);
            for (k, v) in options {
                let key = AmazonS3ConfigKey::from_str(k).map_err(|_| unknown(k, "S3"))?;
                b = b.with_config(key, v);
            }
            b.build().map(|s| Box::new(s) as _)
        }
        "gs" => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url);
            for (k, v) in options {
                let key = GoogleConfigKey::from_str(k).map_err(|_| unknown(k, "GCS"))?;
                b = b.with_config(key, v);
            }
            b.build().map(|s| Box::new(s) as _)
        }
        "az" | "azure" | "abfs" | "abfss" | "adl" => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url);
            for (k, v) in options {
                let key = AzureConfigKey::from_str(k).map_err(|_| unknown(k, "Azure"))?;
                b = b.with_config(key, v);
            }
            b.build().map(|s| Box::new(s) as _)
        }
        other => {
            return Err((
                "checkpoint.dir".into(),
                format!("{other}:// is not a store this tally knows ({SCHEMES}, or a local path)"),
            ))
        }
    };
    built.map_err(|e| {
        (
            "checkpoint.dir".into(),
            crate::secrets::redact(&e.to_string()).into_owned(),
        )
    })
}

/// The key prefix inside the bucket: the URL's path (`s3://bucket/a/b` → `a/b`).
fn url_prefix(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split_once('/')
        .map_or("", |(_, p)| p.trim_matches('/'))
}

/// Checks `checkpoint.dir` and `[checkpoint.object_store]` without connecting.
pub(crate) fn check(url: &str, options: &BTreeMap<String, String>) -> Result<(), OptionError> {
    register_credentials();
    build(url, options).map(drop)
}

impl RemoteObjects {
    /// The store of `group` under the URL `url`.
    pub fn open(
        url: &str,
        options: &BTreeMap<String, String>,
        group: &str,
    ) -> Result<Self, OptionError> {
        register_credentials();
        let store = build(url, options)?;
        let prefix = url_prefix(url);
        let root = if prefix.is_empty() {
            group.to_string()
        } else {
            format!("{prefix}/{group}")
        };
        let root = ObjPath::parse(&root).map_err(|e| ("checkpoint.dir".into(), e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("checkpoint-io")
            .enable_all()
            .build()
            .map_err(|e| {
                (
                    "checkpoint.dir".into(),
                    format!("starting its I/O threads: {e}"),
                )
            })?;
        Ok(Self {
            store,
            root,
            url: format!("{}/{group}", url.trim_end_matches('/')),
            rt,
            stop: std::sync::Mutex::new(None),
        })
    }

    fn path(&self, key: &str) -> Result<ObjPath, ObjectError> {
        if !valid_key(key) {
            return Err(ObjectError::Refused {
                location: format!("{}/{key:?}", self.url),
                msg: "not a key of this store".into(),
            });
        }
        Ok(key
            .split('/')
            .fold(self.root.clone(), |p, part| p.join(part)))
    }

    fn err(&self, key: &str, e: object_store::Error) -> ObjectError {
        let location = self.location(key);
        match e {
            object_store::Error::AlreadyExists { .. } => ObjectError::Exists { location },
            object_store::Error::NotFound { .. } => ObjectError::NotFound { location },
            other => ObjectError::Unavailable {
                location,
                msg: crate::secrets::redact(&other.to_string()).into_owned(),
            },
        }
    }

    /// Whether `key` holds exactly `bytes`.
    fn holds(&self, key: &str, bytes: &[u8]) -> bool {
        self.get(key, bytes.len() as u64)
            .is_ok_and(|there| there == bytes)
    }

    /// Runs the read `f` on the store's runtime; gives up with `Interrupted` once
    /// the stop predicate (if set) holds.
    fn read<T>(
        &self,
        key: &str,
        f: impl std::future::Future<Output = Result<T, ObjectError>>,
    ) -> Result<T, ObjectError> {
        let stop = *self.stop.lock().unwrap_or_else(|e| e.into_inner());
        self.rt.block_on(async {
            let Some(stop) = stop else {
                return f.await;
            };
            let stopped = async {
                while !stop() {
                    tokio::time::sleep(STOP_POLL).await;
                }
            };
            tokio::select! {
                r = f => r,
                () = stopped => Err(ObjectError::Interrupted {
                    location: self.location(key),
                }),
            }
        })
    }
}

impl Objects for RemoteObjects {
    fn location(&self, key: &str) -> String {
        format!("{}/{key}", self.url)
    }

    fn put_new(&self, key: &str, bytes: &[u8]) -> Result<(), ObjectError> {
        let path = self.path(key)?;
        let give_up = Instant::now() + PUT_RETRY_FOR;
        let mut backoff = PUT_BACKOFF;
        loop {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            let payload = PutPayload::from(bytes.to_vec());
            let e = match self.rt.block_on(self.store.put_opts(&path, payload, opts)) {
                Ok(_) => return Ok(()),
                Err(e) => self.err(key, e),
            };
            match e {
                // An attempt — this loop's or the client's own retry — may have
                // created the object and lost only the answer: the same bytes
                // there are this write.
                ObjectError::Exists { .. } if self.holds(key, bytes) => return Ok(()),
                ObjectError::Unavailable { ref msg, .. } if Instant::now() + backoff < give_up => {
                    tracing::warn!(
                        location = %self.location(key),
                        error = %msg,
                        retry_in_ms = backoff.as_millis() as u64,
                        "creating a checkpoint object failed; trying again"
                    );
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(PUT_BACKOFF_MAX);
                }
                e => return Err(e),
            }
        }
    }

    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>, ObjectError> {
        let path = self.path(key)?;
        self.read(key, async {
            let r = self.store.get(&path).await.map_err(|e| self.err(key, e))?;
            if r.meta.size > limit {
                return Err(ObjectError::Refused {
                    location: self.location(key),
                    msg: format!(
                        "{} bytes, more than the {limit} this object can be",
                        r.meta.size
                    ),
                });
            }
            // The body is read chunk by chunk, and cut past `limit`.
            let mut out = Vec::with_capacity(r.meta.size as usize);
            let mut body = r.into_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| self.err(key, e))?;
                if out.len() as u64 + chunk.len() as u64 > limit {
                    return Err(ObjectError::Refused {
                        location: self.location(key),
                        msg: format!("more than the {limit} bytes this object can be"),
                    });
                }
                out.extend_from_slice(&chunk);
            }
            Ok(out)
        })
    }

    fn list(&self) -> Result<Vec<ObjectInfo>, ObjectError> {
        self.read("", async {
            let mut out = Vec::new();
            let mut listing = self.store.list(Some(&self.root));
            while let Some(meta) = listing.next().await {
                let meta = meta.map_err(|e| self.err("", e))?;
                let Some(key) = meta.location.prefix_match(&self.root).map(|parts| {
                    parts
                        .map(|p| p.as_ref().to_string())
                        .collect::<Vec<_>>()
                        .join("/")
                }) else {
                    continue;
                };
                out.push(ObjectInfo {
                    key,
                    size: meta.size,
                    modified_ms: meta.last_modified.timestamp_millis(),
                });
            }
            Ok(out)
        })
    }

    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        let path = self.path(key)?;
        match self.rt.block_on(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(key, e)),
        }
    }

    fn interrupt_when(&self, stop: Option<fn() -> bool>) {
        *self.stop.lock().unwrap_or_else(|e| e.into_inner()) = stop;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_options_are_checked_by_name() {
        assert!(is_url("s3://bucket/prefix"));
        assert!(!is_url("./data/checkpoints"));
        assert!(!is_url("/var/lib/tally"));
        assert_eq!(url_prefix("s3://bucket/a/b/"), "a/b");
        assert_eq!(url_prefix("s3://bucket"), "");
        let mut o = BTreeMap::new();
        o.insert("aws_region".to_string(), "eu-west-1".to_string());
        o.insert("aws_endpoint".to_string(), "http://127.0.0.1:9".to_string());
        o.insert("aws_allow_http".to_string(), "true".to_string());
        check("s3://bucket/prefix", &o).unwrap();
        o.insert("aws_endpont".to_string(), "x".to_string());
        let (key, msg) = check("s3://bucket/prefix", &o).unwrap_err();
        assert_eq!(key, "checkpoint.object_store.aws_endpont");
        assert!(msg.contains("aws_endpoint"), "{msg}");
        let (key, msg) = check("ftp://host/x", &BTreeMap::new()).unwrap_err();
        assert_eq!(key, "checkpoint.dir");
        assert!(msg.contains("s3://"), "{msg}");
    }
}
