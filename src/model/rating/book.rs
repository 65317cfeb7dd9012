//! The rate book: the declared quantities and variant attribute, the list prices
//! per model (effective-dated), the plans and the tenants' assignments — and the
//! rating function over them (the contract is in the module header of `rating`).
//!
//! Invariants: models are sorted by name, each model's entries by `effective_from`,
//! unique (a later insert from the same instant replaces); plans are sorted by name;
//! each tenant's assignments are sorted by time, unique. A lookup is a scan or a
//! binary search, never a clock.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::plans::{discount, in_effect, Plan, PlanVersion};
use super::quantities::{QuantitySet, MAX_QUANTITIES};
use super::rates::{ModelRates, PriceSet, Rate, RateSet, Tier, VariantAttribute};
use super::{LineItem, Rated, Rejection};
use crate::model::{Pico, PriceTable};

/// Entries from each time (inclusive), sorted by it, unique.
type Dated<T> = Vec<(i64, T)>;

/// One request to rate. `counts` are gross, one per declared quantity in id order
/// (a missing one is 0); `variant` is the record's value of the variant attribute.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub tenant: &'a str,
    pub at_ms: i64,
    pub model: &'a str,
    pub variant: Option<&'a str>,
    pub counts: &'a [u64],
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateBook {
    quantities: QuantitySet,
    variant: Option<VariantAttribute>,
    models: Vec<(Arc<str>, Dated<ModelRates>)>,
    plans: Vec<Plan>,
    /// Per tenant: from each time, a plan (its index in `plans`) or the list.
    assignments: BTreeMap<String, Vec<(i64, Option<usize>)>>,
}

/// The sets a request is priced from: the plan's slot overrides the list's.
struct Slot<'a> {
    list: Option<&'a RateSet>,
    plan: Option<&'a RateSet>,
}

impl Slot<'_> {
    fn rate(&self, q: super::QuantityId) -> Option<Rate> {
        self.plan
            .and_then(|s| s.get(q))
            .or_else(|| self.list.and_then(|s| s.get(q)))
    }

    fn fee(&self) -> Pico {
        self.plan
            .and_then(|s| s.fee)
            .or_else(|| self.list.and_then(|s| s.fee))
            .unwrap_or(Pico::ZERO)
    }
}

impl RateBook {
    pub fn new(quantities: QuantitySet, variant: Option<VariantAttribute>) -> Self {
        RateBook {
            quantities,
            variant,
            ..RateBook::default()
        }
    }

    /// Today's price table as a rate book: the default quantities, no variant, no
    /// tier, no plan (the degenerate case).
    pub fn from_price_table(t: &PriceTable) -> Self {
        let mut book = RateBook::default();
        for (model, e) in t.entries() {
            let set = RateSet::new(
                [
                    (super::QuantityId::PROMPT_TOKENS, Rate::per_1k(e.input.0)),
                    (
                        super::QuantityId::COMPLETION_TOKENS,
                        Rate::per_1k(e.output.0),
                    ),
                ],
                None,
            );
            let rates = ModelRates::new(PriceSet::new(set, Vec::new()), Vec::new());
            book.insert_price(model, e.effective_from_ms, rates);
        }
        book
    }

    pub fn quantities(&self) -> &QuantitySet {
        &self.quantities
    }

    pub fn variant_attribute(&self) -> Option<&VariantAttribute> {
        self.variant.as_ref()
    }

    /// Every list price: `(model, effective_from_ms, rates)`, by model, then time.
    pub fn list_entries(&self) -> impl Iterator<Item = (&str, i64, &ModelRates)> {
        self.models
            .iter()
            .flat_map(|(m, es)| es.iter().map(move |(at, r)| (&**m, *at, r)))
    }

    /// Every plan, by name.
    pub fn plans(&self) -> &[Plan] {
        &self.plans
    }

    /// Every assignment: `(tenant, effective_from_ms, plan name or the list)`.
    pub fn assignments(&self) -> impl Iterator<Item = (&str, i64, Option<&str>)> {
        self.assignments.iter().flat_map(move |(t, es)| {
            es.iter()
                .map(move |(at, p)| (t.as_str(), *at, p.map(|p| &*self.plans[p].name)))
        })
    }

    /// Adds a model's list price from `effective_from_ms` (inclusive).
    pub fn insert_price(&mut self, model: &str, effective_from_ms: i64, rates: ModelRates) {
        let i = match self.models.binary_search_by(|(m, _)| (**m).cmp(model)) {
            Ok(i) => i,
            Err(i) => {
                self.models.insert(i, (model.into(), Vec::new()));
                i
            }
        };
        let entries = &mut self.models[i].1;
        entries.retain(|(from, _)| *from != effective_from_ms);
        entries.push((effective_from_ms, rates));
        entries.sort_by_key(|(from, _)| *from);
    }

    /// Adds a version of plan `name` (the plan is created by its first version).
    pub fn insert_plan(&mut self, name: &str, version: PlanVersion) {
        let i = self.plan_index(name);
        self.plans[i].insert(version);
    }

    /// From `effective_from_ms` on, `tenant` is on plan `plan` (`None`: the list). A
    /// plan not yet inserted is created without versions (list prices until it has
    /// one).
    pub fn assign(&mut self, tenant: &str, effective_from_ms: i64, plan: Option<&str>) {
        let plan = plan.map(|p| self.plan_index(p));
        let entries = self.assignments.entry(tenant.to_string()).or_default();
        entries.retain(|(from, _)| *from != effective_from_ms);
        entries.push((effective_from_ms, plan));
        entries.sort_by_key(|(from, _)| *from);
    }

    fn plan_index(&mut self, name: &str) -> usize {
        match self.plans.binary_search_by(|p| (*p.name).cmp(name)) {
            Ok(i) => i,
            Err(i) => {
                let plan = Plan {
                    name: name.into(),
                    versions: Vec::new(),
                };
                self.plans.insert(i, plan);
                // Assignments point at plans by index: shift those after `i`.
                for entries in self.assignments.values_mut() {
                    for (_, p) in entries.iter_mut() {
                        if let Some(p) = p.as_mut().filter(|p| **p >= i) {
                            *p += 1;
                        }
                    }
                }
                i
            }
        }
    }

    /// The plan a tenant is on at `at_ms`, and its version then, if any.
    fn plan_at(&self, tenant: &str, at_ms: i64) -> Option<(&Plan, &PlanVersion)> {
        let plan = &self.plans[(*in_effect(self.assignments.get(tenant)?, at_ms)?)?];
        Some((plan, plan.at(at_ms)?))
    }

    /// Rates one request (the contract is in the module header of `rating`).
    pub fn rate(&self, r: &Request<'_>) -> Result<Rated, Rejection> {
        let n = self.quantities.len();
        debug_assert!(r.counts.len() <= n, "more counts than declared quantities");
        let (mut gross, mut net) = ([0u64; MAX_QUANTITIES], [0u64; MAX_QUANTITIES]);
        let gross = &mut gross[..n];
        self.quantities.in_effect_into(r.counts, r.at_ms, gross);
        self.quantities.net_into(gross, &mut net[..n])?;
        let plan = self.plan_at(r.tenant, r.at_ms);
        let listed = self
            .models
            .iter()
            .find(|(m, _)| crate::model::same(m.as_bytes(), r.model.as_bytes()));
        let list = listed.and_then(|(_, entries)| in_effect(entries, r.at_ms));
        let over = plan.and_then(|(_, v)| v.model(r.model));
        if list.is_none() && over.is_none() {
            return Err(match listed {
                Some(_) => Rejection::NoPriceInEffect(r.model.into()),
                None => Rejection::UnknownModel(r.model.into()),
            });
        }
        let model: Arc<str> = match (listed, plan) {
            (Some((m, _)), _) => m.clone(),
            (None, Some((_, v))) => v
                .models
                .iter()
                .find(|(m, _)| **m == *r.model)
                .map_or_else(|| r.model.into(), |(m, _)| m.clone()),
            (None, None) => r.model.into(),
        };
        let variant = self.variant_value(r)?;
        let value = variant.as_deref();
        let (list_set, plan_set) = (
            list.and_then(|m| m.variant(value)),
            over.and_then(|m| m.variant(value)),
        );
        if list_set.is_none() && plan_set.is_none() {
            let attribute = self.variant.as_ref().map(|v| v.name.clone());
            return Err(Rejection::UnknownVariant {
                model: r.model.into(),
                attribute: attribute.unwrap_or_else(|| "variant".into()),
                value: value.unwrap_or_default().into(),
                declared: true,
            });
        }
        let (slot, tier_above) = choose_slot(list_set, plan_set, gross);
        let ppm = plan.map_or(0, |(_, v)| v.discount_ppm);
        let mut lines = Vec::new();
        let mut total = Pico::ZERO;
        for q in self.quantities.ids() {
            let count = net[q.index()];
            if count == 0 {
                continue;
            }
            let rate = slot.rate(q).ok_or_else(|| Rejection::UnpricedQuantity {
                model: r.model.into(),
                quantity: self.quantities.name(q).clone(),
                count,
            })?;
            let cost = discount(rate.cost(count), ppm);
            total = total.checked_add(cost).map_err(|_| Rejection::Overflow)?;
            lines.push(LineItem {
                quantity: q,
                name: self.quantities.name(q).clone(),
                count,
                cost,
            });
        }
        let fee = discount(slot.fee(), ppm);
        let total = total.checked_add(fee).map_err(|_| Rejection::Overflow)?;
        Ok(Rated {
            model,
            variant,
            plan: plan.map(|(p, _)| p.name.clone()),
            tier_above,
            lines,
            fee,
            total,
        })
    }

    /// The request's variant value, `None` for the default (or with no attribute
    /// declared, or before it is, where a value is ignored); an undeclared value is a
    /// rejection.
    fn variant_value(&self, r: &Request<'_>) -> Result<Option<Arc<str>>, Rejection> {
        let (Some(attr), Some(v)) = (&self.variant, r.variant) else {
            return Ok(None);
        };
        if r.at_ms < attr.effective_from_ms {
            return Ok(None);
        }
        if *attr.default == *v {
            return Ok(None);
        }
        match attr.values.iter().find(|d| ***d == *v) {
            Some(d) => Ok(Some(d.clone())),
            None => Err(Rejection::UnknownVariant {
                model: r.model.into(),
                attribute: attr.name.clone(),
                value: v.into(),
                declared: false,
            }),
        }
    }
}

/// The slot that prices a request: of the tiers of the list's set and the plan's set
/// that apply, the one with the greatest `above` (the plan's on a tie), and the
/// other side's same slot; with none, both bases.
fn choose_slot<'a>(
    list: Option<&'a PriceSet>,
    plan: Option<&'a PriceSet>,
    counts: &[u64],
) -> (Slot<'a>, Option<u64>) {
    let lt = list.and_then(|s| s.tier(counts));
    let pt = plan.and_then(|s| s.tier(counts));
    let same = |side: Option<&'a PriceSet>, t: &Tier| {
        side.and_then(|s| s.tiers.iter().find(|o| o.same_slot(t)))
            .map(|o| &o.set)
    };
    let chosen = match (lt, pt) {
        (Some(l), Some(p)) if l.above > p.above => Some((l, false)),
        (_, Some(p)) => Some((p, true)),
        (Some(l), None) => Some((l, false)),
        (None, None) => None,
    };
    match chosen {
        None => (
            Slot {
                list: list.map(|s| &s.base),
                plan: plan.map(|s| &s.base),
            },
            None,
        ),
        Some((t, true)) => (
            Slot {
                list: same(list, t),
                plan: Some(&t.set),
            },
            Some(t.above),
        ),
        Some((t, false)) => (
            Slot {
                list: Some(&t.set),
                plan: same(plan, t),
            },
            Some(t.above),
        ),
    }
}
