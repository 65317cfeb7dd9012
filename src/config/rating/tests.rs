//! The rating schema: the fixtures bill the issue's examples, today's `[prices]`
//! parses into the degenerate case, and each refusal names its key.

use super::*;
use crate::model::rating::{Rated, Rejection, Request};
use crate::time::utc::parse_utc_ms;

const OPENAI: &str = include_str!("openai.toml");
const ANTHROPIC: &str = include_str!("anthropic.toml");

fn rate(
    r: &Rating,
    tenant: &str,
    at: &str,
    model: &str,
    v: Option<&str>,
    counts: &[u64],
) -> Result<Rated, Rejection> {
    let at_ms = parse_utc_ms(at).unwrap();
    r.book.rate(&Request {
        tenant,
        at_ms,
        model,
        variant: v,
        counts,
    })
}

fn pico(r: Result<Rated, Rejection>) -> u128 {
    let r = r.unwrap();
    assert_eq!(
        r.lines.iter().map(|l| l.cost.0).sum::<u128>() + r.fee.0,
        r.total.0
    );
    r.total.0
}

/// prompt, completion, cached, reasoning, web searches (the book's id order: the
/// defaults, then `[input.quantities]` by name).
const RECORD: [u64; 5] = [10_000, 500, 8_000, 200, 0];
const JAN: &str = "2026-01-15T00:00:00Z";

#[test]
fn the_openai_style_fixture_bills_the_issue_examples() {
    let r = from_toml(OPENAI).unwrap();
    let names: Vec<&str> = r
        .book
        .quantities()
        .ids()
        .map(|q| &**r.book.quantities().name(q))
        .collect();
    assert_eq!(
        names,
        [
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "reasoning_tokens",
            "web_search_calls"
        ]
    );
    assert_eq!(
        r.quantities[0].pointer.as_deref(),
        Some("/usage/prompt_tokens_details/cached_tokens")
    );
    assert_eq!(
        r.variant,
        Some(("service_tier".into(), Some("/service_tier".into())))
    );
    assert_eq!(
        pico(rate(&r, "t", JAN, "o-large", None, &RECORD)),
        12_000_000_000
    );
    assert_eq!(
        pico(rate(&r, "t", JAN, "o-large", Some("batch"), &RECORD)),
        6_000_000_000
    );
    assert_eq!(
        pico(rate(&r, "t", JAN, "o-large", None, &[0, 0, 0, 0, 3])),
        30_000_000_000
    );
    assert_eq!(
        pico(rate(
            &r,
            "t",
            JAN,
            "o-large",
            Some("batch"),
            &[0, 0, 0, 0, 3]
        )),
        15_000_000_000
    );
    // acme on enterprise from 2026-02-01T00:00:00Z; others keep the list.
    assert_eq!(
        pico(rate(
            &r,
            "acme",
            "2026-01-31T23:59:59.999Z",
            "o-large",
            None,
            &RECORD
        )),
        12_000_000_000
    );
    assert_eq!(
        pico(rate(
            &r,
            "acme",
            "2026-02-01T00:00:00Z",
            "o-large",
            None,
            &RECORD
        )),
        11_000_000_000
    );
    assert_eq!(
        pico(rate(
            &r,
            "other",
            "2026-02-01T00:00:00Z",
            "o-large",
            None,
            &RECORD
        )),
        12_000_000_000
    );
    // initech: 12.5 % off from March 2026 until back on the list in March 2027.
    assert_eq!(
        pico(rate(
            &r,
            "initech",
            "2026-03-01T00:00:00Z",
            "o-large",
            None,
            &RECORD
        )),
        10_500_000_000
    );
    assert_eq!(
        pico(rate(
            &r,
            "initech",
            "2027-03-01T00:00:00Z",
            "o-large",
            None,
            &RECORD
        )),
        12_000_000_000
    );
    // o-small: shorthand, fee, schedule. 2,000 × 150,000 + 300 × 600,000 + 8,000 ×
    // 75,000 + 200 × 600,000 + 10^6 fee.
    let small = 300_000_000 + 180_000_000 + 600_000_000 + 120_000_000 + 1_000_000;
    assert_eq!(pico(rate(&r, "t", JAN, "o-small", None, &RECORD)), small);
    let later = 200_000_000 + 120_000_000 + 400_000_000 + 80_000_000;
    assert_eq!(
        pico(rate(
            &r,
            "t",
            "2027-01-01T00:00:00Z",
            "o-small",
            None,
            &RECORD
        )),
        later
    );
    // flex is declared, but o-large has no price for it.
    let e = rate(&r, "t", JAN, "o-large", Some("flex"), &RECORD).unwrap_err();
    assert_eq!(e.code(), "unknown_variant");
}

#[test]
fn the_anthropic_style_fixture_bills_the_issue_examples() {
    let r = from_toml(ANTHROPIC).unwrap();
    // input (prompt), output (completion), cache creation, cache read.
    let rec = |read| [3_000, 1_000, 5_000, read];
    assert_eq!(
        pico(rate(&r, "t", JAN, "c-sonnet", None, &rec(20_000))),
        48_750_000_000
    );
    assert_eq!(
        pico(rate(&r, "t", JAN, "c-sonnet", None, &rec(150_000))),
        87_750_000_000
    );
    assert_eq!(
        pico(rate(&r, "t", JAN, "c-sonnet", None, &rec(250_000))),
        228_000_000_000
    );
    // acme: on the plan from always, its versions from February (10 %) and July (15 %).
    assert_eq!(
        pico(rate(&r, "acme", JAN, "c-sonnet", None, &rec(20_000))),
        48_750_000_000
    );
    let feb = rate(
        &r,
        "acme",
        "2026-02-01T00:00:00Z",
        "c-sonnet",
        None,
        &rec(20_000),
    )
    .unwrap();
    assert_eq!(
        (feb.total.0, feb.plan.as_deref()),
        (43_875_000_000, Some("enterprise"))
    );
    assert_eq!(
        pico(rate(
            &r,
            "acme",
            "2026-07-01T00:00:00Z",
            "c-sonnet",
            None,
            &rec(20_000)
        )),
        41_437_500_000
    );
}

/// Today's `[prices]` (the example config's, the tests') is the degenerate case:
/// every record costs what `Config::price_table` says.
#[test]
fn todays_prices_parse_unchanged_into_the_degenerate_case() {
    let example: toml::Table = include_str!("../../../tally.example.toml").parse().unwrap();
    let tests = [
        "[prices.small]\ninput_per_1k = \"0.00015\"\noutput_per_1k = \"0.0006\"\n",
        "[prices.small]\ninput_per_1k = \"0.00015\"\noutput_per_1k = \"0.0006\"\n[prices.medium]\n\
         input_per_1k = \"0.003\"\noutput_per_1k = \"0.015\"\n[prices.large]\ninput_per_1k = \"0.05\"\n\
         output_per_1k = \"0.10\"\n[[prices.small.schedule]]\neffective_from = \"2026-01-01T00:15:00Z\"\n\
         input_per_1k = \"0.0003\"\noutput_per_1k = \"0.0012\"\n[prices.newmodel]\n\
         effective_from = \"2026-01-01T01:12:00+01:00\"\ninput_per_1k = \"0.001\"\noutput_per_1k = \"0.002\"\n",
        // A model named like a key of the new schema is still a model.
        "[prices.models]\ninput_per_1k = \"0.1\"\noutput_per_1k = \"0.2\"\n",
    ];
    let texts = std::iter::once(toml::to_string(&example).unwrap())
        .chain(tests.iter().map(|s| s.to_string()));
    for text in texts {
        let config = Config::from_toml_with_env(&text, []).unwrap();
        let table = config.price_table().unwrap();
        let r = from_toml(&text).unwrap();
        assert_eq!(r.book.quantities().len(), 2);
        assert_eq!(r.book, RateBook::from_price_table(&table));
        let mut rng = crate::gen::Rng::new(36);
        for (model, e) in table.entries() {
            for at in [
                e.effective_from_ms,
                e.effective_from_ms.saturating_add(1),
                1_767_261_644_000,
            ] {
                let (p, c) = (rng.below(1 << 20), rng.below(1 << 20));
                let got = r.book.rate(&Request {
                    tenant: "t",
                    at_ms: at,
                    model,
                    variant: None,
                    counts: &[p, c],
                });
                assert_eq!(got.unwrap().total, table.cost(model, p, c, at).unwrap());
            }
        }
    }
}

/// Each refusal names its key (and both keys of a clash).
#[test]
fn refusals_name_the_key() {
    let model = "[prices.models.base.rates]\nprompt_tokens = \"0.1\"\n";
    let cases: &[(&str, &str, &str)] = &[
        ("[prices.models.m.rates]\ncached_tokens = \"0.1\"\n", "prices.models.m.rates.cached_tokens", "not a declared quantity"),
        ("[prices.models.m.rates]\nprompt_tokens = \"1e-3\"\n", "prices.models.m.rates.prompt_tokens", "plain decimal"),
        ("[prices.models.m.rates]\nprompt_tokens = 0.1\n", "prices.models.m.rates.prompt_tokens", ""),
        ("[prices.models.m.rates]\nprompt_tokens = { per_unit = \"0.0000000000001\" }\n", "prices.models.m.rates.prompt_tokens.per_unit", "12 decimal"),
        ("[prices.models.m.rates]\nprompt_tokens = { per_unit = \"1\", per_1k = \"1\" }\n", "prices.models.m.rates.prompt_tokens", "both"),
        ("[prices.models.m]\nfee = \"-1\"\n", "prices.models.m.fee", "plain decimal"),
        ("[prices.models.m]\ninput_per_1k = \"1\"\nrates.prompt_tokens = \"1\"\n", "prices.models.m.input_per_1k", "keep one"),
        ("[prices.models.m]\nprice = \"1\"\n", "prices.models.m", "unknown field `price`"),
        ("[prices.models.m]\neffective_from = \"2026-01-01T00:00:00Z\"\n[[prices.models.m.schedule]]\neffective_from = 1767225600000\n",
            "prices.models.m.schedule[0].effective_from", "same instant as prices.models.m"),
        ("[prices.models.m]\n[[prices.models.m.schedule]]\ninput_per_1k = \"1\"\n", "prices.models.m.schedule[0].effective_from", "missing"),
        ("[prices.models.m]\n[prices.models.M]\n", "prices.models.m", "differs only by case"),
        ("[[prices.models.m.tiers]]\nabove = 1\non = \"nope\"\n", "prices.models.m.tiers[0].on", "not a declared quantity"),
        ("[[prices.models.m.tiers]]\nabove = 1\non = []\n", "prices.models.m.tiers[0].on", "names no quantity"),
        ("[[prices.models.m.tiers]]\nabove = 1\non = \"prompt_tokens\"\n[[prices.models.m.tiers]]\nabove = 1\non = \"completion_tokens\"\n",
            "prices.models.m.tiers[1].above", "tiers[0].above"),
        ("[[prices.models.m.tiers]]\nabove = -1\non = \"prompt_tokens\"\n", "prices.models.m.tiers.above", "expected u64"),
        ("[prices.models.m.variants.batch]\n", "prices.models.m.variants.batch", "no attribute is declared"),
        ("[prices.plans.list]\n", "prices.plans.list", "reserved"),
        ("[prices.plans.p]\ndiscount_percent = \"100.5\"\n", "prices.plans.p.discount_percent", "more than 100"),
        ("[prices.plans.p]\ndiscount_percent = \"10.12345\"\n", "prices.plans.p.discount_percent", "4 decimal"),
        ("[prices.plans.p.models.m]\neffective_from = 5\n", "prices.plans.p.models.m.effective_from", "date the plan's version"),
        ("[prices.plans.p.models.m.rates]\nnope = \"1\"\n", "prices.plans.p.models.m.rates.nope", "not a declared"),
        ("[[prices.assignments]]\ntenant = \"a\"\nplan = \"gold\"\n", "prices.assignments[0].plan", "not a plan"),
        ("[prices.plans.p]\n[[prices.assignments]]\ntenant = \"a\"\nplan = \"p\"\n[[prices.assignments]]\ntenant = \"a\"\nplan = \"list\"\n",
            "prices.assignments[1].effective_from", "same instant as prices.assignments[0]"),
        ("[[prices.assignments]]\ntenant = \"\"\nplan = \"list\"\n", "prices.assignments[0].tenant", "not a valid tenant"),
    ];
    for (extra, key, msg) in cases {
        let text = format!("{model}{extra}");
        let e = from_toml(&text).expect_err(extra);
        let ConfigError::Invalid { key: k, msg: m } = &e else {
            panic!("{extra}: {e}")
        };
        assert_eq!(k, key, "{extra}: {e}");
        assert!(m.contains(msg), "{extra}: {e}");
    }
}

#[test]
fn input_declarations_are_checked_by_key() {
    let prices = "[prices.models.base.rates]\nprompt_tokens = \"0.1\"\n";
    let cases: &[(&str, &str, &str)] = &[
        ("[input.quantities.a]\npart_of = \"b\"\n", "input.quantities.a.part_of", "not declared"),
        ("[input.quantities.a]\npart_of = \"b\"\n[input.quantities.b]\npart_of = \"a\"\n", "input.quantities.a.part_of", "part of itself"),
        ("[input.quantities.prompt_tokens]\n", "input.quantities.prompt_tokens", "default quantity"),
        ("[input.quantities.Cached]\n", "input.quantities.Cached", "lower-case"),
        ("[input.quantities.a]\npointer = \"a\"\n", "input.quantities.a.pointer", "start with '/'"),
        ("[input.quantities.a]\nwhere = \"/a\"\n", "input.quantities.a", "unknown field"),
        ("[input.variant]\nname = \"tier\"\nvalues = [\"a\"]\ndefault = \"b\"\n", "input.variant.default", "not one of"),
        ("[input.variant]\nname = \"tier\"\nvalues = [\"a\", \"a\"]\ndefault = \"a\"\n", "input.variant.values[1]", "twice"),
        ("[input.variant]\nname = \"tier\"\nvalues = [\"a\", \"b\"]\ndefault = \"a\"\n[prices.models.m.variants.a]\n",
            "prices.models.m.variants.a", "default value"),
        ("[input.variant]\nname = \"tier\"\nvalues = [\"a\", \"b\"]\ndefault = \"a\"\n[prices.models.m.variants.c]\n",
            "prices.models.m.variants.c", "not one of"),
        ("[input.quantities.c]\npart_of = \"prompt_tokens\"\n[[prices.models.m.tiers]]\nabove = 5\non = [\"c\", \"prompt_tokens\"]\n",
            "prices.models.m.tiers[0].on", "count twice"),
    ];
    for (extra, key, msg) in cases {
        let text = format!("{prices}{extra}");
        let e = from_toml(&text).expect_err(extra);
        let ConfigError::Invalid { key: k, msg: m } = &e else {
            panic!("{extra}: {e}")
        };
        assert_eq!(k, key, "{extra}: {e}");
        assert!(m.contains(msg), "{extra}: {e}");
    }
    // Today's shape with a key of the rating schema says where it belongs.
    let e = from_toml(
        "[prices.small]\ninput_per_1k = \"1\"\noutput_per_1k = \"1\"\nrates = {}\n[prices.plans]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("rating schema"), "{e}");
}

/// A rate or a tier's `on` of the wrong type says what is accepted.
#[test]
fn the_wrong_type_says_what_is_accepted() {
    let cases = [
        (
            "[prices.models.m.rates]\nprompt_tokens = 0.1\n",
            "prices.models.m.rates.prompt_tokens",
            "is the number 0.1",
        ),
        (
            "[prices.models.m.rates]\nprompt_tokens = 1\n",
            "prices.models.m.rates.prompt_tokens",
            "{ per_unit",
        ),
        (
            "[prices.models.m.rates]\nprompt_tokens = { per_unit = \"1\", x = 1 }\n",
            "prices.models.m.rates.prompt_tokens",
            "unknown field `x`",
        ),
        (
            "[[prices.models.m.tiers]]\nabove = 1\non = 5\n",
            "prices.models.m.tiers.on",
            "a quantity's name or a list",
        ),
    ];
    for (text, key, msg) in cases {
        let e = from_toml(text).unwrap_err();
        let ConfigError::Invalid { key: k, msg: m } = &e else {
            panic!("{text}: {e}")
        };
        assert_eq!(k, key, "{text}: {e}");
        assert!(m.contains(msg), "{text}: {e}");
    }
}

/// Issue 36's evolution cases as the book sees them: a future plan assignment and a
/// future rate for a new quantity are changes from that future time only; a
/// retroactive rate is a change from always.
#[test]
fn changes_of_the_fixture_are_dated_by_key() {
    use crate::model::rating::{changes, What};
    let old = from_toml(OPENAI).unwrap().book;
    let june = "\"2026-06-01T00:00:00Z\"";
    let future = format!(
        "{OPENAI}\n[input.quantities.image_count]\npointer = \"/usage/images\"\neffective_from = {june}\n\
         [[prices.assignments]]\ntenant = \"globex\"\nplan = \"enterprise\"\neffective_from = {june}\n\
         [[prices.models.o-large.schedule]]\neffective_from = {june}\n\
         rates = {{ prompt_tokens = \"0.002\", cached_tokens = \"0.0005\", completion_tokens = \"0.008\", \
         reasoning_tokens = \"0.008\", web_search_calls = {{ per_unit = \"0.01\" }}, image_count = {{ per_unit = \"0.04\" }} }}\n"
    );
    let new = from_toml(&future).unwrap().book;
    let june_ms = parse_utc_ms("2026-06-01T00:00:00Z").unwrap();
    let got: Vec<(String, What, i64)> = changes(&old, &new)
        .into_iter()
        .map(|c| (c.key, c.what, c.effective_from_ms))
        .collect();
    assert_eq!(
        got,
        [
            (
                "input.quantities.image_count".to_string(),
                What::Added,
                june_ms
            ),
            (
                "prices.assignments (tenant \"globex\")".to_string(),
                What::Added,
                june_ms
            ),
            ("prices.models.o-large".to_string(), What::Added, june_ms),
        ]
    );
    let retro = OPENAI.replacen("prompt_tokens = \"0.002\"", "prompt_tokens = \"0.0021\"", 1);
    let c = changes(&old, &from_toml(&retro).unwrap().book);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].key.as_str(), c[0].effective_from_ms),
        ("prices.models.o-large", i64::MIN)
    );
}

/// `tally config` prints a rating so that it loads back to the same book: nothing
/// masked (`prompt_tokens` and its rates are usage, not secrets).
#[test]
fn the_effective_config_of_a_rating_loads_back_to_the_same_book() {
    for text in [include_str!("openai.toml"), include_str!("anthropic.toml")] {
        let cfg = Config::from_toml_with_env(text, Vec::new()).unwrap();
        let printed = cfg.effective_toml().unwrap();
        assert!(!printed.contains("***"), "{printed}");
        let again = Config::from_toml_with_env(&printed, Vec::new()).unwrap();
        let book = |c: &Config| c.rating.as_ref().unwrap().book.clone();
        assert_eq!(book(&again), book(&cfg));
        assert_eq!(again.effective_toml().unwrap(), printed);
    }
}
