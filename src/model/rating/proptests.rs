//! `RateBook::rate` against the reference model (`reference`) on random scenarios:
//! quantities with nested parts, effective-dated list prices, variants, tiers, plans
//! with discounts and tenants moving between them — at the limits too (`u64::MAX`
//! counts and rates, so overflow is reached and must be a rejection in both).

use proptest::prelude::*;

use super::reference::{
    self, MRates, Outcome, PSet, RSet, Req, Scenario, MODELS, PLANS, TENANTS, VALUES,
};
use super::*;

/// At most this many quantities (2 defaults + declared).
const MAX_Q: usize = 6;
const TIMES: [i64; 5] = [i64::MIN, 0, 100, 200, 300];

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![6 => 0u64..300_000, 2 => Just(0u64), 1 => Just(u64::MAX), 1 => any::<u64>()]
}

fn rate_value() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        1 => Just(None),
        7 => (0u64..20_000_000).prop_map(Some),
        1 => Just(Some(u64::MAX)),
        1 => any::<u64>().prop_map(Some),
    ]
}

fn rset(n: usize) -> impl Strategy<Value = RSet> {
    (
        proptest::collection::vec(rate_value(), n),
        prop_oneof![3 => Just(None), 1 => (0u64..1_000_000).prop_map(Some), 1 => Just(Some(u64::MAX))],
    )
        .prop_map(|(rates, fee)| RSet { rates, fee })
}

fn pset(n: usize) -> impl Strategy<Value = PSet> {
    let tier = (
        proptest::collection::vec(0..n, 1..=3),
        prop_oneof![
            Just(0u64),
            Just(100_000),
            Just(200_000),
            Just(u64::MAX - 1),
            Just(u64::MAX)
        ],
        rset(n),
    );
    (rset(n), proptest::collection::vec(tier, 0..=2)).prop_map(|(base, mut tiers)| {
        // Distinct `above` within a set (the config refuses two).
        let mut seen = Vec::new();
        tiers.retain(|t| {
            !seen.contains(&t.1) && {
                seen.push(t.1);
                true
            }
        });
        PSet { base, tiers }
    })
}

fn mrates(n: usize) -> impl Strategy<Value = MRates> {
    (
        pset(n),
        proptest::collection::vec((1..VALUES.len(), pset(n)), 0..=2),
    )
        .prop_map(|(own, mut variants)| {
            let mut seen = Vec::new();
            variants.retain(|v| {
                !seen.contains(&v.0) && {
                    seen.push(v.0);
                    true
                }
            });
            MRates { own, variants }
        })
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (2..=MAX_Q)
        .prop_flat_map(|n| {
            // Quantity i ≥ 2 is part of a lower one, or of nothing.
            let whole = (2..n)
                .map(|i| prop_oneof![Just(None), (0..i).prop_map(Some)])
                .collect::<Vec<_>>();
            let time = proptest::sample::select(TIMES.to_vec());
            let from = prop_oneof![2 => Just(i64::MIN), 3 => time.clone()];
            // Model `a` always listed, `b` mostly, `c` never (only in plans).
            let list = (
                proptest::collection::vec((Just(0usize), from.clone(), mrates(n)), 1..=3),
                proptest::collection::vec((Just(1usize), from, mrates(n)), 0..=3),
            )
                .prop_map(|(a, b)| [a, b].concat());
            let over = proptest::collection::vec((0..MODELS.len(), mrates(n)), 0..=2);
            let ppm = prop_oneof![Just(0u32), 0..=PPM, Just(PPM), Just(500_000)];
            let plans = proptest::collection::vec((0..PLANS.len(), time.clone(), ppm, over), 1..=3);
            let assign = (
                0..TENANTS.len(),
                time.clone(),
                prop_oneof![Just(None), (0..PLANS.len()).prop_map(Some)],
            );
            // Mostly read always; sometimes from a time (before it: 0, the default).
            let read_from = prop_oneof![4 => Just(i64::MIN), 1 => time.clone()];
            let dated = (proptest::collection::vec(read_from.clone(), n), read_from);
            let assignments = proptest::collection::vec(assign, 1..=4);
            (whole, list, plans, assignments, dated)
        })
        .prop_map(
            |(whole, list, mut plans, assignments, (qfrom, variant_from))| {
                let mut w = vec![None, None];
                w.extend(whole);
                for p in &mut plans {
                    let mut seen = Vec::new();
                    p.3.retain(|m| {
                        !seen.contains(&m.0) && {
                            seen.push(m.0);
                            true
                        }
                    });
                }
                Scenario {
                    whole: w,
                    list,
                    plans,
                    assignments,
                    qfrom,
                    variant_from,
                }
            },
        )
}

fn request(s: &Scenario) -> impl Strategy<Value = Req> {
    let n = s.whole.len();
    let whole = s.whole.clone();
    let variant = prop_oneof![
        3 => Just(None),
        1 => Just(Some("default".to_string())),
        2 => Just(Some("batch".to_string())),
        1 => Just(Some("flex".to_string())),
        1 => Just(Some("bulk".to_string())),
    ];
    let at = prop_oneof![
        4 => proptest::sample::select(vec![i64::MIN, -1, 0, 99, 100, 150, 200, 300, i64::MAX]),
        1 => any::<i64>()
    ];
    let model = prop_oneof![5 => 0..2usize, 1 => Just(2usize)];
    let consistent = prop_oneof![4 => Just(true), 1 => Just(false)];
    (
        0..TENANTS.len(),
        at,
        model,
        variant,
        proptest::collection::vec(count(), n),
        consistent,
    )
        .prop_map(move |(tenant, at, model, variant, nets, consistent)| {
            // Mostly gross counts that hold their parts (from nets, the last first).
            let mut counts = nets;
            if consistent {
                for q in (0..n).rev() {
                    if let Some(w) = whole[q] {
                        counts[w] = counts[w].saturating_add(counts[q]);
                    }
                }
            }
            Req {
                tenant,
                at,
                model,
                variant,
                counts,
            }
        })
}

fn names(n: usize) -> Vec<String> {
    let mut v = vec!["prompt_tokens".to_string(), "completion_tokens".to_string()];
    v.extend((2..n).map(|i| format!("q{i}")));
    v
}

fn rate_set(r: &RSet) -> RateSet {
    let rates = r
        .rates
        .iter()
        .enumerate()
        .filter_map(|(q, r)| r.map(|r| (QuantityId(q as u16), Rate::per_unit(r))));
    RateSet::new(rates, r.fee.map(|f| Pico(u128::from(f))))
}

fn price_set(p: &PSet) -> PriceSet {
    let tiers = p.tiers.iter().map(|(on, above, r)| {
        Tier::new(
            on.iter().map(|&q| QuantityId(q as u16)).collect(),
            *above,
            rate_set(r),
        )
    });
    PriceSet::new(rate_set(&p.base), tiers.collect())
}

fn model_rates(m: &MRates) -> ModelRates {
    let variants = m
        .variants
        .iter()
        .map(|(v, p)| (VALUES[*v].into(), price_set(p)))
        .collect();
    ModelRates::new(price_set(&m.own), variants)
}

/// The rate book the scenario describes, through the public builder.
fn book(s: &Scenario, names: &[String]) -> RateBook {
    let decls: Vec<(&str, Option<&str>)> = (2..s.whole.len())
        .map(|i| (names[i].as_str(), s.whole[i].map(|w| names[w].as_str())))
        .collect();
    let variant = VariantAttribute {
        name: "service_tier".into(),
        values: VALUES.iter().map(|v| (*v).into()).collect(),
        default: VALUES[0].into(),
        effective_from_ms: s.variant_from,
    };
    let mut q = QuantitySet::new(&decls).unwrap();
    for (i, from) in s.qfrom.iter().enumerate() {
        q.set_effective_from(QuantityId(i as u16), *from);
    }
    let mut b = RateBook::new(q, Some(variant));
    for (m, from, r) in &s.list {
        b.insert_price(MODELS[*m], *from, model_rates(r));
    }
    for (p, from, ppm, models) in &s.plans {
        let models = models
            .iter()
            .map(|(m, r)| (MODELS[*m].into(), model_rates(r)))
            .collect();
        b.insert_plan(PLANS[*p], PlanVersion::new(*from, *ppm, models));
    }
    for (t, from, p) in &s.assignments {
        b.assign(TENANTS[*t], *from, p.map(|p| PLANS[p]));
    }
    b
}

fn outcome(r: Result<Rated, Rejection>) -> Outcome {
    match r {
        Ok(r) => {
            let sum = r.lines.iter().map(|l| l.cost.0).sum::<u128>() + r.fee.0;
            assert_eq!(sum, r.total.0, "lines + fee == total");
            Outcome::Rated {
                model: r.model.to_string(),
                variant: r.variant.map(|v| v.to_string()),
                plan: r.plan.map(|p| p.to_string()),
                tier_above: r.tier_above,
                lines: r
                    .lines
                    .iter()
                    .map(|l| (l.quantity.index(), l.count, l.cost.0))
                    .collect(),
                fee: r.fee.0,
                total: r.total.0,
            }
        }
        Err(e) => {
            let detail = match &e {
                Rejection::PartExceedsWhole {
                    whole,
                    whole_count,
                    part,
                    parts_count,
                } => {
                    format!("{whole} {whole_count} {part} {parts_count}")
                }
                Rejection::UnknownModel(m) | Rejection::NoPriceInEffect(m) => m.clone(),
                Rejection::UnknownVariant {
                    value, declared, ..
                } => {
                    format!(
                        "{} {value}",
                        if *declared { "unpriced" } else { "undeclared" }
                    )
                }
                Rejection::UnpricedQuantity {
                    quantity, count, ..
                } => format!("{quantity} {count}"),
                Rejection::Overflow => String::new(),
            };
            Outcome::Rejected(e.code(), detail)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn rating_equals_the_reference(
        (s, reqs) in scenario().prop_flat_map(|s| {
            let reqs = proptest::collection::vec(request(&s), 1..=8);
            (Just(s), reqs)
        })
    ) {
        let names = names(s.whole.len());
        let b = book(&s, &names);
        for r in &reqs {
            let got = outcome(b.rate(&Request {
                tenant: TENANTS[r.tenant],
                at_ms: r.at,
                model: MODELS[r.model],
                variant: r.variant.as_deref(),
                counts: &r.counts,
            }));
            prop_assert_eq!(got, reference::rate(&s, &names, r), "{:?}", r);
        }
    }

    #[test]
    fn the_discount_equals_long_division(cost in prop_oneof![any::<u128>(), 0u128..10_000_000], ppm in prop_oneof![0..=PPM, Just(500_000u32)]) {
        prop_assert_eq!(discount(Pico(cost), ppm).0, reference::discounted(cost, ppm));
    }

    /// Today's table, as a rate book, prices every record as today.
    #[test]
    fn the_degenerate_case_equals_the_price_table(
        entries in proptest::collection::vec((0..2usize, proptest::sample::select(TIMES.to_vec()), any::<u64>(), 0u64..10_000_000), 1..5),
        prompt in count(), completion in count(), at in any::<i64>(), model in 0..3usize,
    ) {
        use crate::model::{NanoPer1k, PriceEntry, PriceTable};
        let mut t = PriceTable::default();
        for (m, from, i, o) in entries {
            t.insert(MODELS[m], PriceEntry { effective_from_ms: from, input: NanoPer1k(i), output: NanoPer1k(o) });
        }
        let b = RateBook::from_price_table(&t);
        let got = b.rate(&Request { tenant: "t", at_ms: at, model: MODELS[model], variant: None, counts: &[prompt, completion] });
        let want = t.cost(MODELS[model], prompt, completion, at);
        match (got, want) {
            (Ok(r), Ok(c)) => prop_assert_eq!(r.total, c),
            (Err(Rejection::UnknownModel(_)), Err(crate::model::PriceError::UnknownModel))
            | (Err(Rejection::NoPriceInEffect(_)), Err(crate::model::PriceError::NotYetPriced))
            | (Err(Rejection::Overflow), Err(crate::model::PriceError::Overflow)) => {}
            (g, w) => prop_assert!(false, "{:?} vs {:?}", g, w),
        }
    }
}

/// The scenarios reach every outcome (a property test that never rejects, or never
/// applies a plan or a tier, would prove little).
#[test]
fn the_scenarios_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    use std::collections::BTreeMap;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for _ in 0..400 {
        let s = scenario().new_tree(&mut runner).unwrap().current();
        let names = names(s.whole.len());
        for _ in 0..8 {
            let r = request(&s).new_tree(&mut runner).unwrap().current();
            let kind = match reference::rate(&s, &names, &r) {
                Outcome::Rejected(code, _) => code,
                Outcome::Rated {
                    plan: Some(_),
                    tier_above: Some(_),
                    ..
                } => "rated: plan and tier",
                Outcome::Rated { plan: Some(_), .. } => "rated: plan",
                Outcome::Rated {
                    tier_above: Some(_),
                    ..
                } => "rated: tier",
                Outcome::Rated {
                    variant: Some(_), ..
                } => "rated: variant",
                Outcome::Rated { .. } => "rated: list",
            };
            *seen.entry(kind).or_default() += 1;
        }
    }
    println!("{seen:?}");
    for kind in [
        "part_exceeds_whole",
        "unknown_model",
        "no_price_in_effect",
        "unknown_variant",
        "unpriced_quantity",
        "overflow",
        "rated: plan and tier",
        "rated: plan",
        "rated: tier",
        "rated: variant",
        "rated: list",
    ] {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= 10,
            "{kind}: {seen:?}"
        );
    }
}
