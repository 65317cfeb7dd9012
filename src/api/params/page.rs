//! Page tokens of the usage API (pure): a token carries where the previous page
//! ended and a fingerprint of the other parameters, so a token is only good for
//! the query that made it.
//!
//! Invariants: the cursor names every dimension a row can have, so rows compare
//! totally by it (`window_start`, then each dimension by bytes, `""` for one the
//! rows are not grouped by); a token written before a dimension existed reads it
//! as `""`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{bad, ParamError};

/// Where a page ended: the last row's `(window_start, tenant_id, model, variant,
/// plan, quantity)` (`""` for a dimension the rows are not grouped by).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Cursor {
    pub window_start: i64,
    pub tenant_id: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plan: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub quantity: String,
}

#[derive(Serialize, Deserialize)]
struct Token {
    /// Fingerprint of the other parameters.
    q: String,
    c: Cursor,
}

/// The fingerprint of the tenants listing's pages.
pub(super) const TENANTS: &str = "tenants";

/// The `next_page` token of the tenants listing after `last`.
pub(crate) fn next_tenants_page(last: &str) -> String {
    token(
        TENANTS.into(),
        Cursor {
            tenant_id: last.to_string(),
            ..Cursor::default()
        },
    )
}

pub(super) fn token(q: String, c: Cursor) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&Token { q, c }).unwrap_or_default())
}

pub(super) fn decode_token(p: &str, fingerprint: &str) -> Result<Cursor, ParamError> {
    let t: Token = URL_SAFE_NO_PAD
        .decode(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| {
            bad(
                "page",
                "not a page token of this API (use `next_page` as given)",
            )
        })?;
    if t.q != fingerprint {
        return Err(bad(
            "page",
            "the token belongs to a query with other parameters: repeat the request that gave it, adding only `page`",
        ));
    }
    Ok(t.c)
}
