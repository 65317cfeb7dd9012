//! The worked examples of issue 36, to the pico-USD, and one test per rejection.

use super::*;
use crate::time::utc::parse_utc_ms;

/// USD per 1,000 as a rate (test shorthand: the config parses exactly).
fn k(usd: &str) -> Rate {
    Rate::per_1k(crate::model::NanoPer1k::parse_usd(usd).unwrap().0)
}

fn set(q: &QuantitySet, rates: &[(&str, &str)]) -> RateSet {
    RateSet::new(rates.iter().map(|(n, r)| (q.id(n).unwrap(), k(r))), None)
}

fn openai_quantities() -> QuantitySet {
    QuantitySet::new(&[
        ("cached_tokens", Some("prompt_tokens")),
        ("reasoning_tokens", Some("completion_tokens")),
        ("web_search_calls", None),
    ])
    .unwrap()
}

const O_LARGE: [(&str, &str); 5] = [
    ("prompt_tokens", "0.002"),
    ("cached_tokens", "0.0005"),
    ("completion_tokens", "0.008"),
    ("reasoning_tokens", "0.008"),
    ("web_search_calls", "10"),
];

/// `o-large` with a batch variant at half price, and plan `enterprise` for `acme`
/// from 2026-02-01T00:00:00Z.
fn openai() -> RateBook {
    openai_from(openai_quantities(), i64::MIN)
}

/// `openai()` with these quantities and the variant attribute read from `variant_from`.
fn openai_from(q: QuantitySet, variant_from: i64) -> RateBook {
    // Half of every rate of the list.
    let half = [
        ("prompt_tokens", "0.001"),
        ("cached_tokens", "0.00025"),
        ("completion_tokens", "0.004"),
        ("reasoning_tokens", "0.004"),
        ("web_search_calls", "5"),
    ];
    let own = PriceSet::new(set(&q, &O_LARGE), Vec::new());
    let batch = PriceSet::new(set(&q, &half), Vec::new());
    let variant = VariantAttribute {
        name: "service_tier".into(),
        values: vec!["batch".into(), "default".into(), "flex".into()],
        default: "default".into(),
        effective_from_ms: variant_from,
    };
    let mut book = RateBook::new(q.clone(), Some(variant));
    book.insert_price(
        "o-large",
        i64::MIN,
        ModelRates::new(own, vec![("batch".into(), batch)]),
    );
    let enterprise = ModelRates::new(
        PriceSet::new(set(&q, &[("prompt_tokens", "0.0015")]), Vec::new()),
        Vec::new(),
    );
    book.insert_plan(
        "enterprise",
        PlanVersion::new(i64::MIN, 0, vec![("o-large".into(), enterprise)]),
    );
    book.assign("acme", ms("2026-02-01T00:00:00Z"), Some("enterprise"));
    book
}

fn ms(t: &str) -> i64 {
    parse_utc_ms(t).unwrap()
}

/// prompt 10,000 (8,000 cached), completion 500 (200 reasoning).
const OPENAI_RECORD: [u64; 5] = [10_000, 500, 8_000, 200, 0];

fn rate(
    book: &RateBook,
    tenant: &str,
    at: &str,
    model: &str,
    v: Option<&str>,
    c: &[u64],
) -> Result<Rated, Rejection> {
    book.rate(&Request {
        tenant,
        at_ms: ms(at),
        model,
        variant: v,
        counts: c,
    })
}

fn total(r: Result<Rated, Rejection>) -> u128 {
    let r = r.unwrap();
    let sum: u128 = r.lines.iter().map(|l| l.cost.0).sum::<u128>() + r.fee.0;
    assert_eq!(sum, r.total.0, "lines and fee add up to the total");
    r.total.0
}

const T: &str = "2026-01-15T00:00:00Z";

#[test]
fn openai_style_cached_and_reasoning_tokens() {
    let book = openai();
    let r = rate(&book, "t", T, "o-large", None, &OPENAI_RECORD).unwrap();
    let lines: Vec<(&str, u64, u128)> = r
        .lines
        .iter()
        .map(|l| (&*l.name, l.count, l.cost.0))
        .collect();
    assert_eq!(
        lines,
        [
            ("prompt_tokens", 2_000, 4_000_000_000),
            ("completion_tokens", 300, 2_400_000_000),
            ("cached_tokens", 8_000, 4_000_000_000),
            ("reasoning_tokens", 200, 1_600_000_000),
        ]
    );
    assert_eq!(r.total, Pico(12_000_000_000));
    assert_eq!((r.plan, r.variant, r.tier_above), (None, None, None));
}

#[test]
fn per_call_rates_batch_variant_and_the_default_value() {
    let book = openai();
    let searches = [0, 0, 0, 0, 3];
    assert_eq!(
        total(rate(&book, "t", T, "o-large", None, &searches)),
        30_000_000_000
    );
    // Per unit is the same integer: $0.01 per call.
    assert_eq!(Rate::per_unit(10_000_000_000).cost(3), Pico(30_000_000_000));
    let batch = rate(&book, "t", T, "o-large", Some("batch"), &OPENAI_RECORD).unwrap();
    assert_eq!(
        (batch.total, batch.variant.as_deref()),
        (Pico(6_000_000_000), Some("batch"))
    );
    let default = rate(&book, "t", T, "o-large", Some("default"), &OPENAI_RECORD);
    assert_eq!(total(default), 12_000_000_000);
}

#[test]
fn enterprise_plan_from_its_instant_for_its_tenant_only() {
    let book = openai();
    let before = rate(
        &book,
        "acme",
        "2026-01-31T23:59:59.999Z",
        "o-large",
        None,
        &OPENAI_RECORD,
    );
    assert_eq!(total(before), 12_000_000_000);
    let from = rate(
        &book,
        "acme",
        "2026-02-01T00:00:00Z",
        "o-large",
        None,
        &OPENAI_RECORD,
    )
    .unwrap();
    assert_eq!(
        (from.total, from.plan.as_deref()),
        (Pico(11_000_000_000), Some("enterprise"))
    );
    let other = rate(
        &book,
        "other",
        "2026-02-01T00:00:00Z",
        "o-large",
        None,
        &OPENAI_RECORD,
    );
    assert_eq!(total(other), 12_000_000_000);
    // The plan overrides only what it names: batch keeps its list rates.
    let batch = rate(
        &book,
        "acme",
        "2026-02-02T00:00:00Z",
        "o-large",
        Some("batch"),
        &OPENAI_RECORD,
    );
    assert_eq!(total(batch), 6_000_000_000);
}

#[test]
fn a_tenant_may_move_again_and_a_discount_rounds_per_line() {
    let mut book = openai();
    book.assign("acme", ms("2026-03-01T00:00:00Z"), None);
    book.insert_plan("tenth", PlanVersion::new(i64::MIN, 100_000, Vec::new()));
    book.assign("acme", ms("2026-04-01T00:00:00Z"), Some("tenth"));
    let at = |t| total(rate(&book, "acme", t, "o-large", None, &OPENAI_RECORD));
    assert_eq!(at("2026-02-15T00:00:00Z"), 11_000_000_000);
    assert_eq!(at("2026-03-15T00:00:00Z"), 12_000_000_000);
    assert_eq!(at("2026-04-15T00:00:00Z"), 10_800_000_000);
    // 7 tokens at 1 pico each, 10 % off: 6.3 → 6 per line.
    let mut b = RateBook::default();
    let q = QuantitySet::default();
    let one = RateSet::new(q.ids().map(|i| (i, Rate::per_1k(1))), Some(Pico(5)));
    b.insert_price(
        "m",
        i64::MIN,
        ModelRates::new(PriceSet::new(one, Vec::new()), Vec::new()),
    );
    b.insert_plan("tenth", PlanVersion::new(i64::MIN, 100_000, Vec::new()));
    b.assign("a", i64::MIN, Some("tenth"));
    let r = b
        .rate(&Request {
            tenant: "a",
            at_ms: 0,
            model: "m",
            variant: None,
            counts: &[7, 7],
        })
        .unwrap();
    let costs: Vec<u128> = r.lines.iter().map(|l| l.cost.0).collect();
    // Fee 5 × 0.9 = 4.5 → 4 (half to even).
    assert_eq!((costs, r.fee, r.total), (vec![6, 6], Pico(4), Pico(16)));
}

fn anthropic() -> RateBook {
    let q = QuantitySet::new(&[
        ("input_tokens", None),
        ("cache_read_input_tokens", None),
        ("cache_creation_input_tokens", None),
        ("output_tokens", None),
    ])
    .unwrap();
    let names = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens",
    ];
    let with = |r: [&str; 4]| set(&q, &names.into_iter().zip(r).collect::<Vec<_>>());
    let on: Vec<QuantityId> = names[..3].iter().map(|n| q.id(n).unwrap()).collect();
    let long = Tier::new(on, 200_000, with(["0.006", "0.0006", "0.0075", "0.0225"]));
    let own = PriceSet::new(with(["0.003", "0.0003", "0.00375", "0.015"]), vec![long]);
    let mut book = RateBook::new(q, None);
    book.insert_price("c-sonnet", i64::MIN, ModelRates::new(own, Vec::new()));
    book
}

#[test]
fn anthropic_style_four_quantities_and_long_context() {
    let book = anthropic();
    let rec = |read| [0, 0, 3_000, read, 5_000, 1_000];
    let at = |read| rate(&book, "t", T, "c-sonnet", None, &rec(read));
    assert_eq!(total(at(20_000)), 48_750_000_000);
    assert_eq!(total(at(150_000)), 87_750_000_000);
    let long = at(250_000).unwrap();
    assert_eq!(
        (long.total, long.tier_above),
        (Pico(228_000_000_000), Some(200_000))
    );
    // Strictly above: 200,000 in all is still the base rates.
    assert_eq!(at(192_000).unwrap().tier_above, None);
    assert_eq!(at(192_001).unwrap().tier_above, Some(200_000));
}

#[test]
fn each_rejection_is_named() {
    let book = openai();
    let r = |m, v, c: &[u64]| rate(&book, "t", T, m, v, c).unwrap_err();
    let part = r("o-large", None, &[1, 0, 2, 0, 0]);
    assert_eq!(part.code(), "part_exceeds_whole");
    assert!(
        part.to_string().contains("`prompt_tokens` (1)")
            && part.to_string().contains("cached_tokens"),
        "{part}"
    );
    assert_eq!(r("nope", None, &[1, 0, 0, 0, 0]).code(), "unknown_model");
    let undeclared = r("o-large", Some("bulk"), &[1, 0, 0, 0, 0]);
    assert_eq!(undeclared.code(), "unknown_variant");
    assert!(
        undeclared
            .to_string()
            .contains("service_tier = \"bulk\" is not a declared"),
        "{undeclared}"
    );
    let unpriced_variant = r("o-large", Some("flex"), &[1, 0, 0, 0, 0]);
    assert!(
        unpriced_variant
            .to_string()
            .contains("has no price for service_tier = \"flex\""),
        "{unpriced_variant}"
    );
    // Not yet priced.
    let mut later = openai();
    later.insert_price("new", ms("2027-01-01T00:00:00Z"), ModelRates::default());
    let e = rate(&later, "t", T, "new", None, &[1, 0, 0, 0, 0]).unwrap_err();
    assert_eq!(e.code(), "no_price_in_effect");
    // A model without a rate for a non-zero quantity; zero of it is fine.
    let e = rate(
        &later,
        "t",
        "2027-02-01T00:00:00Z",
        "new",
        None,
        &[0, 0, 0, 0, 2],
    )
    .unwrap_err();
    assert_eq!(e.code(), "unpriced_quantity");
    assert!(
        e.to_string().contains("`web_search_calls`") && e.to_string().contains("2 of it"),
        "{e}"
    );
    assert_eq!(
        total(rate(
            &later,
            "t",
            "2027-02-01T00:00:00Z",
            "new",
            None,
            &[0; 5]
        )),
        0
    );
}

#[test]
fn the_limits_are_exact_or_overflow() {
    let q = QuantitySet::default();
    let max = RateSet::new(q.ids().map(|i| (i, Rate::per_unit(u64::MAX))), None);
    let mut book = RateBook::default();
    book.insert_price(
        "x",
        i64::MIN,
        ModelRates::new(PriceSet::new(max, Vec::new()), Vec::new()),
    );
    let at = |c: &[u64]| {
        book.rate(&Request {
            tenant: "t",
            at_ms: 0,
            model: "x",
            variant: None,
            counts: c,
        })
    };
    let one = u128::from(u64::MAX) * u128::from(u64::MAX);
    assert_eq!(at(&[u64::MAX, 0]).unwrap().total, Pico(one));
    assert_eq!(at(&[u64::MAX, u64::MAX]), Err(Rejection::Overflow));
    assert_eq!(Rejection::Overflow.code(), "overflow");
}

/// Today's price table is the degenerate case: the same cost for every record.
#[test]
fn the_price_table_is_the_degenerate_case() {
    use crate::model::{NanoPer1k, PriceEntry, PriceTable};
    let mut t = PriceTable::default();
    let entry = |from, i, o| PriceEntry {
        effective_from_ms: from,
        input: NanoPer1k(i),
        output: NanoPer1k(o),
    };
    t.insert("small", entry(i64::MIN, 150_000, 600_000));
    t.insert("small", entry(1_000, 100_000, 400_000));
    let book = RateBook::from_price_table(&t);
    for (p, c, at) in [
        (1_200, 350, 999),
        (1_200, 350, 1_000),
        (0, 0, 5),
        (u64::MAX, 0, 0),
    ] {
        let r = book.rate(&Request {
            tenant: "a",
            at_ms: at,
            model: "small",
            variant: None,
            counts: &[p, c],
        });
        assert_eq!(
            r.map(|r| r.total),
            t.cost("small", p, c, at).map_err(|_| Rejection::Overflow)
        );
    }
}

/// A quantity or the variant attribute declared from a time: before it, the record
/// is read as a config without it would (the quantity 0, the default value).
#[test]
fn declarations_from_a_time_read_nothing_before_it() {
    let from = ms("2026-02-01T00:00:00Z");
    let mut q = openai_quantities();
    q.set_effective_from(q.id("cached_tokens").unwrap(), from);
    let book = openai_from(q, from);
    let before = "2026-01-31T23:59:59.999Z";
    // 10,000 prompt tokens at 0.002, 300 + 200 completion and reasoning at 0.008.
    assert_eq!(
        total(rate(&book, "t", before, "o-large", None, &OPENAI_RECORD)),
        24_000_000_000
    );
    assert_eq!(
        total(rate(
            &book,
            "t",
            before,
            "o-large",
            Some("bulk"),
            &OPENAI_RECORD
        )),
        24_000_000_000
    );
    let after = "2026-02-01T00:00:00Z";
    assert_eq!(
        total(rate(&book, "t", after, "o-large", None, &OPENAI_RECORD)),
        12_000_000_000
    );
    assert_eq!(
        total(rate(
            &book,
            "t",
            after,
            "o-large",
            Some("batch"),
            &OPENAI_RECORD
        )),
        6_000_000_000
    );
}
