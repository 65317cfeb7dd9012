//! Who may read what: the keys of `api.keys` (reloaded on SIGHUP), or — only when
//! `api.allow_unauthenticated` says so — anyone (docs/API.md#authentication).
//!
//! Invariants:
//! - Every route but `/healthz` and `/readyz` needs a key; `/metrics` too unless
//!   `api.public_metrics`. A refusal is 401 with `WWW-Authenticate` (RFC 6750),
//!   counted by reason in `tally_api_auth_failures_total`; the key presented
//!   never reaches a log, an answer or a metric.
//! - A tenant-scoped key sees its tenants only: any other tenant, in a path or a
//!   parameter, answers 404 "unknown tenant" — whether or not it exists.
//! - A reload that fails keeps the keys in use (logged); a revoked key is refused
//!   from the first request after a successful reload.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use hyper::{Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::{error, info, warn};

use super::keys::{Keys, Refused, Scope};
use super::params::UsageQuery;
use super::{error, Body};
use crate::config::{ApiConfig, ConfigError};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    reason: &'static str,
}

enum Mode {
    /// `api.allow_unauthenticated`: every request reads everything.
    Open,
    Keys {
        /// Where they are reloaded from (`None`: given in memory, the demo's).
        path: Option<PathBuf>,
        keys: RwLock<Arc<Keys>>,
        public_metrics: bool,
    },
}

pub(crate) struct Access {
    mode: Mode,
    failures: Family<FailureLabels, Counter>,
}

impl Access {
    /// From `[api]`: the keys file, or the explicit choice to serve without keys.
    pub(crate) fn from_config(cfg: &ApiConfig) -> Result<Access, ConfigError> {
        let mode = match (&cfg.keys, cfg.allow_unauthenticated) {
            (Some(path), _) => {
                let keys = Keys::load(path).map_err(|msg| ConfigError::Invalid {
                    key: "api.keys".into(),
                    msg,
                })?;
                if keys.len() == 0 {
                    warn!(file = %path.display(), "usage API: the keys file holds no key: every request but /healthz and /readyz answers 401");
                }
                info!(
                    keys = keys.len(),
                    "usage API: requests need a key (api.keys)"
                );
                Mode::Keys {
                    path: Some(path.clone()),
                    keys: RwLock::new(Arc::new(keys)),
                    public_metrics: cfg.public_metrics,
                }
            }
            (None, true) => {
                warn!("usage API: api.allow_unauthenticated = true: anyone who reaches api.listen reads every tenant's usage and invoices");
                Mode::Open
            }
            (None, false) => {
                return Err(ConfigError::Invalid {
                    key: "api.keys".into(),
                    msg: "the usage API needs keys: mint one with `tally api-key create --config <file> \
                          --id <name> --scope admin` (or `--scope tenant:<id>`) and set `api.keys` to its \
                          file; or, knowingly, set `api.allow_unauthenticated = true`"
                        .into(),
                });
            }
        };
        Ok(Access {
            mode,
            failures: Family::default(),
        })
    }

    /// Keys given in memory (the demo's API), never reloaded.
    pub(crate) fn with_keys(keys: Keys) -> Access {
        Access {
            mode: Mode::Keys {
                path: None,
                keys: RwLock::new(Arc::new(keys)),
                public_metrics: false,
            },
            failures: Family::default(),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "tally_api_auth_failures",
            "Usage API requests refused for their credentials (401), by reason: missing, malformed, unknown",
            self.failures.clone(),
        );
    }

    /// Whether SIGHUP reloads the keys.
    pub(crate) fn reloads(&self) -> bool {
        matches!(&self.mode, Mode::Keys { path: Some(_), .. })
    }

    /// Reads the keys file again; on an error the keys in use stay.
    pub(crate) fn reload(&self) {
        let Mode::Keys {
            path: Some(path),
            keys,
            ..
        } = &self.mode
        else {
            return;
        };
        match Keys::load(path) {
            Ok(new) => {
                let n = new.len();
                if let Ok(mut k) = keys.write() {
                    *k = Arc::new(new);
                }
                info!(keys = n, "usage API: keys reloaded (SIGHUP)");
            }
            Err(e) => {
                error!(error = %e, "usage API: SIGHUP: the keys file could not be reloaded; the keys in use stay")
            }
        }
    }

    /// The scope of the request's key and the key's id (`None` without keys),
    /// or why it is refused (counted; answer it with `unauthorized`).
    pub(crate) fn authorize<B>(
        &self,
        req: &Request<B>,
        metrics: bool,
    ) -> Result<(Scope, Option<String>), Refused> {
        let Mode::Keys {
            keys,
            public_metrics,
            ..
        } = &self.mode
        else {
            return Ok((Scope::Admin, None));
        };
        if metrics && *public_metrics {
            return Ok((Scope::Admin, None));
        }
        let header = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or(""));
        let keys = keys.read().map(|k| k.clone()).unwrap_or_default();
        match keys.check(header) {
            Ok(key) => Ok((key.scope.clone(), Some(key.id.clone()))),
            Err(why) => {
                self.failures
                    .get_or_create(&FailureLabels {
                        reason: why.label(),
                    })
                    .inc();
                Err(why)
            }
        }
    }
}

/// The 401 answer, with its RFC 6750 challenge.
pub(crate) fn unauthorized(why: Refused) -> Response<Body> {
    let (challenge, message) = match why {
        Refused::Missing => (
            r#"Bearer realm="tally""#,
            "this route needs an API key: Authorization: Bearer <key>",
        ),
        Refused::Malformed => (
            r#"Bearer realm="tally", error="invalid_request""#,
            "the Authorization header is not `Bearer <key>` with a tally key",
        ),
        Refused::Unknown => (
            r#"Bearer realm="tally", error="invalid_token""#,
            "the API key is not valid (wrong, or revoked)",
        ),
    };
    let mut resp = error(401, None, message);
    resp.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static(challenge),
    );
    resp
}

/// A usage query under `scope`: a tenant key that names no tenant reads every
/// tenant of its scope; one that names a tenant outside it is answered as if
/// that tenant were unknown (`Err`: the first such tenant, by bytes).
pub(crate) fn scoped_usage(scope: &Scope, mut q: UsageQuery) -> Result<UsageQuery, String> {
    if let Scope::Tenants(t) = scope {
        if q.tenants.is_empty() {
            q.tenants = t.iter().cloned().collect();
        }
    }
    match q.tenants.iter().find(|t| !scope.allows(t)) {
        Some(outside) => Err(outside.clone()),
        None => Ok(q),
    }
}

/// The answer for a tenant the key may not read — the same whether or not it
/// exists.
pub(crate) fn unknown_tenant(tenant: &str) -> Response<Body> {
    error(
        404,
        Some("tenant_id"),
        &format!("unknown tenant {tenant:?}"),
    )
}
