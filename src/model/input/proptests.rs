//! The fast parser against the reference parser (STYLE.md "Tests"): on random and
//! hostile records, under the default, a nested and the CloudEvents mapping, both
//! extract the same values — so the same event or the same reason — and whatever
//! the fast parser gives up on, the reference refuses as malformed JSON.

use proptest::prelude::*;

use super::render::Tree;
use super::*;

/// Scalars at the edges of what the fields accept.
const SCALARS: &[&str] = &[
    "0",
    "1",
    "-0",
    "-1",
    "1200",
    "9007199254740991",
    "9007199254740992",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "1767261644000",
    "1767261644",
    "1767261644000000",
    "1.5",
    "1.0",
    "1e3",
    "-0.0",
    "1E400",
    "true",
    "null",
    "\"\"",
    "\"acme\"",
    "\"small\"",
    "\"1.0\"",
    "\"ac\\u006de\"",
    "\"a\\\"b\\\\c\\n\"",
    "\"\\ud83d\\ude00\"",
    "\"\\ud800\"",
    "\"😀 ünï\"",
    "\"2026-01-01T10:00:44Z\"",
    "\"2026-01-01T10:00:44.123456789+02:00\"",
    "\"2026-02-30T10:00:00Z\"",
    "[]",
    "[1,{\"id\":\"x\"}]",
    "{}",
];

/// Values (some not JSON) where the hand-written scanner must check what
/// serde_json checks; rarer, so that enough records stay valid.
const HOSTILE: &[&str] = &[
    "01",
    "-",
    "1.",
    "1e",
    "1e+5",
    "-1.5E-3",
    " 7 ",
    "[1,2 ,3 ]",
    "[1,]",
    "{\"a\" : [ ] }",
    "{,}",
    "[[[[[[[[]]]]]]]]",
    "\"\\u00e9\"",
    "\"\\u12G4\"",
    "\"bad\\x\"",
    "\"tab\there\"",
    "tru",
    "nul",
];

/// Keys of all three mappings, and some no mapping reads.
const KEYS: &[&str] = &[
    "request_id",
    "tenant_id",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "started_ts",
    "completed_ts",
    "id",
    "subject",
    "source",
    "specversion",
    "time",
    "data",
    "customer",
    "usage",
    "input_tokens",
    "output_tokens",
    "spans",
    "at",
    "other",
    "tenant\\u005fid",
    // Longer names a mapped one begins (the scanner matches `"name":` whole).
    "request_idx",
    "timex",
];

fn value(depth: u32) -> BoxedStrategy<String> {
    let scalar = prop_oneof![
        12 => proptest::sample::select(SCALARS),
        1 => proptest::sample::select(HOSTILE),
    ]
    .prop_map(str::to_owned);
    if depth == 0 {
        return scalar.boxed();
    }
    prop_oneof![
        4 => scalar,
        2 => object(depth - 1),
        1 => proptest::collection::vec(value(depth - 1), 0..3)
            .prop_map(|v| format!("[{}]", v.join(","))),
    ]
    .boxed()
}

fn object(depth: u32) -> BoxedStrategy<String> {
    proptest::collection::vec((proptest::sample::select(KEYS), value(depth)), 0..10)
        .prop_map(|members| {
            let body: Vec<String> = members
                .iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect();
            format!("{{{}}}", body.join(","))
        })
        .boxed()
}

/// A record that is often valid: every field of `m` at its pointer, then edits.
fn record(m: &'static InputMapping) -> impl Strategy<Value = Vec<u8>> {
    let good = proptest::collection::vec(
        (
            proptest::bool::weighted(0.93),
            proptest::sample::select(SCALARS),
        ),
        m.fields.len(),
    );
    (good, object(2), 0u8..24, any::<prop::sample::Index>()).prop_map(
        move |(vals, noise, edit, at)| {
            let mut tree = Tree::Obj(Vec::new());
            for (f, (good, v)) in m.fields.iter().zip(&vals) {
                let v = match (f.kind, good) {
                    // Mostly the right type, so that many records parse.
                    (_, false) => v,
                    (Kind::Str { .. }, _) => "\"acme\"",
                    (Kind::SpecVersion, _) => "\"1.0\"",
                    (Kind::Tokens, _) => "1200",
                    (Kind::Ts(TimestampFormat::Rfc3339), _) => "\"2026-01-01T10:00:44Z\"",
                    (Kind::Ts(_), _) => "1767261644000",
                };
                tree.insert(&f.tokens, v.to_string());
            }
            let mut text = tree.text();
            text.pop();
            text.push_str(if text.len() > 1 { "," } else { "" });
            text.push_str(&format!("\"noise\":{noise}}}"));
            let mut bytes = text.into_bytes();
            let i = at.index(bytes.len());
            match edit {
                0 => bytes.truncate(i),
                1 => bytes.insert(i, 0xff),
                2 => bytes.insert(i, b','),
                3 => bytes.splice(0..0, *b"\xEF\xBB\xBF").for_each(drop),
                4 => bytes.extend_from_slice(b" x"),
                // Repeat one member (some on a mapped path).
                5 => {
                    let s = String::from_utf8(bytes.clone()).unwrap();
                    let first = s[1..].split(',').next().unwrap_or("").to_string();
                    bytes
                        .splice(1..1, format!("{first},").into_bytes())
                        .for_each(drop);
                }
                6 => bytes = noise.into_bytes(),
                _ => {}
            }
            bytes
        },
    )
}

fn mappings() -> &'static [InputMapping; 4] {
    static M: std::sync::OnceLock<[InputMapping; 4]> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let nested: InputConfig = toml::from_str(
            r#"
            tenant_id = "/customer/id"
            prompt_tokens = "/usage/input_tokens"
            completion_tokens = "/usage/output_tokens"
            started_ts = "/spans/1/at"
            completed_ts = "/time"
            completed_ts_format = "rfc3339"
            started_ts_format = "epoch_us"
            "#,
        )
        .unwrap();
        let ce = InputConfig {
            format: InputFormat::Cloudevents,
            ..Default::default()
        };
        // The nested mapping and a rating's extras: quantities beside and inside
        // the mapped members, a required one, the variant.
        let decl = |name: &str, pointer: &str, required| super::ExtraDecl {
            name: name.into(),
            pointer: Some(pointer.into()),
            required,
        };
        let rated = InputMapping::new(&nested)
            .unwrap()
            .with_extra(
                &[
                    decl("cached_tokens", "/usage/details/cached", false),
                    decl("calls", "/calls", true),
                ],
                Some(&decl("tier", "/tier", false)),
            )
            .unwrap();
        [
            InputMapping::default(),
            InputMapping::new(&nested).unwrap(),
            InputMapping::new(&ce).unwrap(),
            rated,
        ]
    })
}

fn agree(m: &InputMapping, bytes: &[u8]) -> Result<(), TestCaseError> {
    // The event's own fields (a rating's extras are compared below, whole).
    let reference = super::reference::parse(m, bytes);
    let mut vals = absent();
    match fast::extract(&m.plan, bytes, &mut vals).then_some(&mut vals) {
        Some(vals) => prop_assert_eq!(decide(m, vals, None), reference),
        // Malformed, or a key repeated on a mapped path (which a type error
        // outranks).
        None => prop_assert!(reference.is_err(), "{:?}", reference),
    }
    // The scanner tier alone: where it accepts, serde_json's walk accepts too and
    // finds the same values.
    if let Ok(text) = std::str::from_utf8(bytes) {
        let mut by_scan = absent();
        if scan::extract(&m.plan, text, &mut by_scan) {
            let mut by_walk = absent();
            let mut de = serde_json::Deserializer::from_str(text);
            let walked = fast::walk(&m.plan, &mut de, &mut by_walk).is_ok() && de.end().is_ok();
            prop_assert!(walked, "the scanner accepted what serde_json refuses");
            prop_assert_eq!(by_scan, by_walk);
        }
    }
    // The public path is the fast one with the reference behind it.
    prop_assert_eq!(m.parse(bytes), m.parse_reference(bytes));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::base::proptest_cases(3000)))]

    #[test]
    fn fast_and_reference_agree_under_the_default_mapping(b in record(&mappings()[0])) {
        agree(&mappings()[0], &b)?;
    }

    #[test]
    fn fast_and_reference_agree_under_a_nested_mapping(b in record(&mappings()[1])) {
        agree(&mappings()[1], &b)?;
    }

    #[test]
    fn fast_and_reference_agree_on_cloudevents(b in record(&mappings()[2])) {
        agree(&mappings()[2], &b)?;
    }

    #[test]
    fn fast_and_reference_agree_with_a_ratings_extras(
        b in record(&mappings()[1]),
        cached in prop_oneof![Just(""), Just(",\"details\":{\"cached\":7}"), Just(",\"details\":{\"cached\":-1}"), Just(",\"details\":{\"cached\":1.5}")],
        calls in prop_oneof![Just(""), Just("\"calls\":3,"), Just("\"calls\":null,"), Just("\"calls\":\"x\",")],
        tier in prop_oneof![Just(""), Just("\"tier\":\"batch\","), Just("\"tier\":7,"), Just("\"tier\":\"a\\u0000b\",")],
    ) {
        // The nested mapping's record, with the extras spliced in.
        let mut text = String::from_utf8_lossy(&b).into_owned();
        if let Some(i) = text.find("\"usage\":{") {
            text.insert_str(i + 9, &cached.trim_start_matches(',').replace('}', "},"));
        }
        if text.starts_with('{') {
            text.insert_str(1, &format!("{calls}{tier}"));
        }
        agree(&mappings()[3], text.as_bytes())?;
    }

    #[test]
    fn arbitrary_objects_agree(o in object(3)) {
        for m in mappings() {
            agree(m, o.as_bytes())?;
        }
    }
}

#[test]
fn enough_random_records_are_valid_to_test_the_success_path() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    // (The fourth needs extras `record` does not write.)
    for m in &mappings()[..3] {
        let s = record(m);
        let ok = (0..500)
            .filter(|_| m.parse(&s.new_tree(&mut runner).unwrap().current()).is_ok())
            .count();
        assert!(ok > 100, "{ok} of 500 valid under {:?}", m.format);
    }
}
