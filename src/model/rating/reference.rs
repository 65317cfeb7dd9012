//! A deliberately simple reference model of rating, written apart from `book`: a
//! scenario is plain vectors (indices, not ids or slots), every choice a linear scan
//! of everything, every sum checked, the discount by long division of 32-bit limbs.
//! `proptests` compares it with `RateBook::rate`.

/// A rate set: per quantity a rate in pico per unit (or none), and a fee.
#[derive(Debug, Clone)]
pub struct RSet {
    pub rates: Vec<Option<u64>>,
    pub fee: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct PSet {
    pub base: RSet,
    /// `(on, above, rates)`; `above` distinct within a set.
    pub tiers: Vec<(Vec<usize>, u64, RSet)>,
}

/// A model's rates: its own, and per variant value (an index into `VALUES`).
#[derive(Debug, Clone)]
pub struct MRates {
    pub own: PSet,
    pub variants: Vec<(usize, PSet)>,
}

/// The declared variant values; `VALUES[0]` is the default.
pub const VALUES: [&str; 3] = ["default", "batch", "flex"];
pub const MODELS: [&str; 3] = ["a", "b", "c"];
pub const TENANTS: [&str; 3] = ["t0", "t1", "t2"];
pub const PLANS: [&str; 2] = ["p0", "p1"];

/// `(plan index, from, discount ppm, [(model index, rates)])`.
pub type PlanEntry = (usize, i64, u32, Vec<(usize, MRates)>);

#[derive(Debug, Clone)]
pub struct Scenario {
    /// Per quantity, the index of its whole (always a lower index); 0 and 1 are the
    /// defaults, parts of nothing.
    pub whole: Vec<Option<usize>>,
    /// `(model index, from, rates)`, in insertion order.
    pub list: Vec<(usize, i64, MRates)>,
    /// `(plan index, from, discount ppm, [(model index, rates)])`.
    pub plans: Vec<PlanEntry>,
    /// `(tenant index, from, plan index or the list)`.
    pub assignments: Vec<(usize, i64, Option<usize>)>,
    /// Per quantity, from when it is read (before: 0).
    pub qfrom: Vec<i64>,
    /// From when the variant attribute is read (before: the default).
    pub variant_from: i64,
}

/// A request: tenant, time, model, variant value as written, gross counts.
#[derive(Debug, Clone)]
pub struct Req {
    pub tenant: usize,
    pub at: i64,
    pub model: usize,
    pub variant: Option<String>,
    pub counts: Vec<u64>,
}

/// What the reference expects: `(model, variant, plan, tier above, lines
/// (quantity, count, cost), fee, total)`, or the rejection's code and detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Rated {
        model: String,
        variant: Option<String>,
        plan: Option<String>,
        tier_above: Option<u64>,
        lines: Vec<(usize, u64, u128)>,
        fee: u128,
        total: u128,
    },
    Rejected(&'static str, String),
}

/// The last of the entries in effect at `at` (greatest `from` ≤ `at`; of equal ones,
/// the last inserted).
fn latest<T: Clone>(entries: impl Iterator<Item = (i64, T)>, at: i64) -> Option<T> {
    let mut best: Option<(i64, T)> = None;
    for (from, v) in entries {
        if from <= at && best.as_ref().is_none_or(|(b, _)| from >= *b) {
            best = Some((from, v));
        }
    }
    best.map(|(_, v)| v)
}

/// `cost × (10^6 − ppm) / 10^6`, rounded half to even, by schoolbook long division.
pub fn discounted(cost: u128, ppm: u32) -> u128 {
    let keep = u64::from(1_000_000 - ppm);
    // cost as four 32-bit limbs, most significant first, times `keep`: five limbs.
    let mut limbs = [0u64; 5];
    let mut carry = 0u64;
    for i in (0..4).rev() {
        let limb = ((cost >> (32 * (3 - i))) & 0xffff_ffff) as u64;
        let p = limb * keep + carry;
        limbs[i + 1] = p & 0xffff_ffff;
        carry = p >> 32;
    }
    limbs[0] = carry;
    let (mut q, mut rem) = (0u128, 0u64);
    for limb in limbs {
        let cur = (rem << 32) | limb;
        q = (q << 32) | u128::from(cur / 1_000_000);
        rem = cur % 1_000_000;
    }
    if rem * 2 > 1_000_000 || (rem * 2 == 1_000_000 && q % 2 == 1) {
        q += 1;
    }
    q
}

fn measure(on: &[usize], counts: &[u64]) -> u128 {
    let mut on = on.to_vec();
    on.sort();
    on.dedup();
    on.iter().map(|&q| u128::from(counts[q])).sum()
}

fn same_on(a: &[usize], b: &[usize]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    a.dedup();
    b.sort();
    b.dedup();
    a == b
}

/// Step 1: the nets; a whole whose direct parts exceed it, the first in quantity
/// order, is the rejection.
fn nets(s: &Scenario, names: &[String], counts: &[u64]) -> Result<Vec<u64>, Reject> {
    let n = s.whole.len();
    let mut net = vec![0u64; n];
    for q in 0..n {
        let parts: Vec<usize> = (0..n).filter(|&p| s.whole[p] == Some(q)).collect();
        let total: i128 = parts.iter().map(|&p| i128::from(counts[p])).sum();
        let left = i128::from(counts[q]) - total;
        if left < 0 {
            let mut run = 0i128;
            let first = parts
                .iter()
                .find(|&&p| {
                    run += i128::from(counts[p]);
                    run > i128::from(counts[q])
                })
                .expect("some part tips it");
            let detail = format!("{} {} {} {}", names[q], counts[q], names[*first], total);
            return Err(("part_exceeds_whole", detail));
        }
        net[q] = left as u64;
    }
    Ok(net)
}

/// A rejection's code and detail.
type Reject = (&'static str, String);

/// The lines `(quantity, count, cost)`, the fee and the total.
type Bill = (Vec<(usize, u64, u128)>, u128, u128);

type Slots = (Option<RSet>, Option<RSet>, Option<u64>);

/// Step 5: the list's and the plan's rate sets that price the request: the tier
/// with the greatest applying `above` (the plan's on a tie) and its twin on the
/// other side, or both bases.
fn slots(lset: Option<PSet>, pset: Option<PSet>, counts: &[u64]) -> Slots {
    let applying = |p: &Option<PSet>| -> Option<(Vec<usize>, u64, RSet)> {
        let p = p.as_ref()?;
        let mut best: Option<&(Vec<usize>, u64, RSet)> = None;
        for t in &p.tiers {
            if measure(&t.0, counts) > u128::from(t.1) && best.is_none_or(|b| t.1 > b.1) {
                best = Some(t);
            }
        }
        best.cloned()
    };
    let twin = |p: &Option<PSet>, on: &[usize], above: u64| -> Option<RSet> {
        let p = p.as_ref()?;
        p.tiers
            .iter()
            .find(|t| t.1 == above && same_on(&t.0, on))
            .map(|t| t.2.clone())
    };
    match (applying(&lset), applying(&pset)) {
        (None, None) => (lset.map(|p| p.base), pset.map(|p| p.base), None),
        (Some(l), Some(p)) if l.1 > p.1 => (Some(l.2.clone()), twin(&pset, &l.0, l.1), Some(l.1)),
        (_, Some(p)) => (twin(&lset, &p.0, p.1), Some(p.2.clone()), Some(p.1)),
        (Some(l), None) => (Some(l.2.clone()), twin(&pset, &l.0, l.1), Some(l.1)),
    }
}

/// Step 6: the lines (each non-zero net), the fee and the total, all discounted.
fn bill(
    net: &[u64],
    names: &[String],
    (lslot, pslot, _): &Slots,
    ppm: u32,
) -> Result<Bill, Reject> {
    let overflow = || ("overflow", String::new());
    let mut lines = Vec::new();
    let mut total: u128 = 0;
    for (q, &count) in net.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let from = |s: &Option<RSet>| s.as_ref().and_then(|s| s.rates[q]);
        let Some(rate) = from(pslot).or_else(|| from(lslot)) else {
            return Err(("unpriced_quantity", format!("{} {count}", names[q])));
        };
        let cost = discounted(u128::from(count) * u128::from(rate), ppm);
        total = total.checked_add(cost).ok_or_else(overflow)?;
        lines.push((q, count, cost));
    }
    let fee = pslot
        .as_ref()
        .and_then(|s| s.fee)
        .or_else(|| lslot.as_ref().and_then(|s| s.fee))
        .unwrap_or(0);
    let fee = discounted(u128::from(fee), ppm);
    let total = total.checked_add(fee).ok_or_else(overflow)?;
    Ok((lines, fee, total))
}

/// The reference rating.
pub fn rate(s: &Scenario, names: &[String], r: &Req) -> Outcome {
    // 0. What the request says, as far as the config reads it at its time.
    let counts: Vec<u64> = (0..s.whole.len())
        .map(|q| if r.at >= s.qfrom[q] { r.counts[q] } else { 0 })
        .collect();
    let written = if r.at >= s.variant_from {
        r.variant.as_deref()
    } else {
        None
    };
    let net = match nets(s, names, &counts) {
        Ok(net) => net,
        Err((code, detail)) => return Outcome::Rejected(code, detail),
    };
    // 2. The plan version in effect for the tenant.
    let assigned = latest(
        s.assignments
            .iter()
            .filter(|a| a.0 == r.tenant)
            .map(|a| (a.1, a.2)),
        r.at,
    )
    .flatten();
    let version = assigned.and_then(|p| {
        latest(
            s.plans
                .iter()
                .filter(|v| v.0 == p)
                .map(|v| (v.1, (v.2, &v.3))),
            r.at,
        )
    });
    // 3. The model: the list's entry, the plan's override.
    let list = latest(
        s.list
            .iter()
            .filter(|e| e.0 == r.model)
            .map(|e| (e.1, &e.2)),
        r.at,
    );
    let over =
        version.and_then(|(_, models)| models.iter().find(|(m, _)| *m == r.model).map(|(_, x)| x));
    let model = MODELS[r.model].to_string();
    if list.is_none() && over.is_none() {
        let known = s.list.iter().any(|e| e.0 == r.model);
        let code = if known {
            "no_price_in_effect"
        } else {
            "unknown_model"
        };
        return Outcome::Rejected(code, model);
    }
    // 4. The variant.
    let value = match written {
        None => 0,
        Some(v) => match VALUES.iter().position(|d| *d == v) {
            Some(i) => i,
            None => return Outcome::Rejected("unknown_variant", format!("undeclared {v}")),
        },
    };
    let pick = |m: &MRates| -> Option<PSet> {
        if value == 0 {
            return Some(m.own.clone());
        }
        m.variants
            .iter()
            .find(|(v, _)| *v == value)
            .map(|(_, p)| p.clone())
    };
    let (lset, pset) = (list.and_then(pick), over.and_then(pick));
    if lset.is_none() && pset.is_none() {
        return Outcome::Rejected("unknown_variant", format!("unpriced {}", VALUES[value]));
    }
    let slots = slots(lset, pset, &counts);
    let (lines, fee, total) = match bill(&net, names, &slots, version.map_or(0, |(d, _)| d)) {
        Ok(b) => b,
        Err((code, detail)) => return Outcome::Rejected(code, detail),
    };
    Outcome::Rated {
        model,
        variant: (value != 0).then(|| VALUES[value].to_string()),
        plan: version.and(assigned).map(|p| PLANS[p].to_string()),
        tier_above: slots.2,
        lines,
        fee,
        total,
    }
}
