//! `GET /v1/usage`'s parameters (pure): the range, the bucket, the dimensions of
//! a row (`group_by`) and the filters.
//!
//! Invariants: the lists (`tenant_id`, `model`, `variant`, `plan`, `quantity`,
//! `group_by`) are sets — sorted, without repeats — so the same sets in another
//! order are the same query (one page token); every other parameter is given at
//! most once. A dimension or filter of the rating's line items (`variant`,
//! `plan`, `quantity`) makes the rows the quantity rows (`UsageQuery::by_quantity`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::page::{decode_token, token, Cursor};
use super::{bad, check_tz, limit_of, time, ParamError, Unit};

/// What the rows of `/v1/usage` are grouped by, besides the bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Group {
    pub tenant: bool,
    pub model: bool,
    pub variant: bool,
    pub plan: bool,
    pub quantity: bool,
}

impl Group {
    /// By tenant alone: the rows of the API's first version.
    pub(crate) const TENANT: Group = Group {
        tenant: true,
        model: false,
        variant: false,
        plan: false,
        quantity: false,
    };
}

/// `GET /v1/usage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageQuery {
    /// The tenants to read, sorted by bytes and without repeats; empty: every
    /// tenant the key may read (`access::scoped_usage` fills a tenant key's).
    pub tenants: Vec<String>,
    /// Only these models' lines (sorted, no repeats); empty: every model.
    pub models: Vec<String>,
    /// Only these variants', plans' and quantities' rows (likewise).
    pub variants: Vec<String>,
    pub plans: Vec<String>,
    pub quantities: Vec<String>,
    pub from_ms: i64,
    pub to_ms: i64,
    pub unit: Unit,
    pub tz: String,
    pub group: Group,
    pub limit: usize,
    /// Rows after this one (from `page`).
    pub after: Option<Cursor>,
}

impl UsageQuery {
    /// Whether the rows come from the per-model lines (grouped or filtered by
    /// model) rather than the windows' totals.
    pub(crate) fn by_model(&self) -> bool {
        self.group.model || !self.models.is_empty()
    }

    /// Whether the rows come from the rating's quantity rows
    /// (`tally_usage_quantity`): grouped or filtered by variant, plan or quantity.
    pub(crate) fn by_quantity(&self) -> bool {
        self.group.variant
            || self.group.plan
            || self.group.quantity
            || !self.variants.is_empty()
            || !self.plans.is_empty()
            || !self.quantities.is_empty()
    }
}

const USAGE_PARAMETERS: &str =
    "tenant_id, model, variant, plan, quantity, from, to, window, tz, group_by, limit, page";

const DIMENSIONS: &str = "tenant, model, variant, plan or quantity";

/// Parses the query string of `/v1/usage`. `tenant_id`, `model`, `variant`,
/// `plan`, `quantity` and `group_by` may be repeated (OpenMeter's convention:
/// `group_by=tenant&group_by=model`); every other parameter is given at most once.
pub(crate) fn usage(query: &str) -> Result<UsageQuery, ParamError> {
    let (mut tenants, mut models, mut dimensions) = (Vec::new(), Vec::new(), Vec::new());
    let (mut variants, mut plans, mut quantities) = (Vec::new(), Vec::new(), Vec::new());
    let (mut from, mut to, mut window, mut tz, mut limit, mut page) =
        (None, None, None, None, None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let list = match &*k {
            "tenant_id" => Some(&mut tenants),
            "model" => Some(&mut models),
            "variant" => Some(&mut variants),
            "plan" => Some(&mut plans),
            "quantity" => Some(&mut quantities),
            "group_by" => Some(&mut dimensions),
            _ => None,
        };
        if let Some(list) = list {
            if v.is_empty() {
                return Err(bad(&k, "empty"));
            }
            list.push(v.into_owned());
            continue;
        }
        let slot = match &*k {
            "from" => &mut from,
            "to" => &mut to,
            "window" => &mut window,
            "tz" => &mut tz,
            "limit" => &mut limit,
            "page" => &mut page,
            other => {
                return Err(bad(
                    other,
                    format!("unknown parameter (known: {USAGE_PARAMETERS})"),
                ))
            }
        };
        if slot.replace(v.into_owned()).is_some() {
            return Err(bad(&k, "given more than once"));
        }
    }
    let from_ms = time(
        "from",
        from.as_deref().ok_or_else(|| bad("from", "required"))?,
    )?;
    let to_ms = time("to", to.as_deref().ok_or_else(|| bad("to", "required"))?)?;
    if to_ms <= from_ms {
        return Err(bad("to", "must be after `from` ([from, to) is half-open)"));
    }
    let unit = match window.as_deref().unwrap_or("minute") {
        "minute" => Unit::Minute,
        "hour" => Unit::Hour,
        "day" => Unit::Day,
        "month" => Unit::Month,
        other => {
            return Err(bad(
                "window",
                format!("{other:?} is not one of minute, hour, day, month"),
            ))
        }
    };
    let tz = tz.unwrap_or_else(|| "UTC".into());
    check_tz(&tz)?;
    let group = group(&dimensions)?;
    let limit = limit_of(limit.as_deref())?;
    for list in [
        &mut tenants,
        &mut models,
        &mut variants,
        &mut plans,
        &mut quantities,
    ] {
        list.sort();
        list.dedup();
    }
    let mut q = UsageQuery {
        tenants,
        models,
        variants,
        plans,
        quantities,
        from_ms,
        to_ms,
        unit,
        tz,
        group,
        limit,
        after: None,
    };
    if let Some(p) = page {
        q.after = Some(decode_token(&p, &fingerprint(&q))?);
    }
    Ok(q)
}

/// The dimensions of `group_by` (each given as its own parameter); none given:
/// by tenant, as the first version of the API grouped.
fn group(dimensions: &[String]) -> Result<Group, ParamError> {
    if dimensions.is_empty() {
        return Ok(Group::TENANT);
    }
    let mut g = Group::default();
    for d in dimensions {
        match d.as_str() {
            "tenant" => g.tenant = true,
            "model" => g.model = true,
            "variant" => g.variant = true,
            "plan" => g.plan = true,
            "quantity" => g.quantity = true,
            other if other.contains(',') => {
                return Err(bad(
                    "group_by",
                    format!("{other:?}: repeat the parameter for each dimension (group_by=tenant&group_by=model)"),
                ))
            }
            other => {
                return Err(bad(
                    "group_by",
                    format!("{other:?} is not a dimension: {DIMENSIONS}"),
                ))
            }
        }
    }
    Ok(g)
}

/// What a page token must match: every parameter but `limit` and `page`.
fn fingerprint(q: &UsageQuery) -> String {
    let text = format!(
        "{:?}|{:?}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}",
        q.tenants,
        q.models,
        q.from_ms,
        q.to_ms,
        q.unit.sql(),
        q.tz,
        q.group,
        q.variants,
        q.plans,
        q.quantities
    );
    let d = Sha256::digest(text.as_bytes());
    URL_SAFE_NO_PAD.encode(&d[..9])
}

/// The `next_page` token after `last`.
pub(crate) fn next_page(q: &UsageQuery, last: Cursor) -> String {
    token(fingerprint(q), last)
}
