//! One row of `/v1/usage`, as both of its sources give it: the windows' rows
//! (`usage`) and the quantity rows (`quantities`).
//!
//! Invariants: a dimension the query does not group by is absent (`None`), and
//! so are the fields a source does not have — `count` outside quantity rows
//! grouped by quantity, the token and request fields in quantity rows.

use serde::Serialize;

use super::whole::Whole;

/// One row of `/v1/usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct UsageRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    pub window_start: String,
    pub window_end: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The rating's dimensions (`''` when a line has none), when grouped by them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantity: Option<String>,
    /// The quantity's count, when grouped by quantity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<Whole>,
    pub cost_pico: String,
    pub usd: String,
    /// The windows' fields: absent from quantity rows, which have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Whole>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<Whole>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<Whole>,
    #[serde(rename = "final")]
    pub is_final: bool,
    #[serde(skip)]
    pub(super) start_ms: i64,
}
