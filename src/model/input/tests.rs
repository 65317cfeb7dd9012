use super::*;
use crate::model::event::DeadLetterReason as R;

fn mapping(toml_text: &str) -> InputMapping {
    let c: InputConfig = toml::from_str(toml_text).unwrap();
    InputMapping::new(&c).unwrap()
}

fn custom() -> InputMapping {
    mapping(
        r#"
        request_id = "/req"
        tenant_id = "/customer/id"
        model = "/usage/model"
        prompt_tokens = "/usage/input_tokens"
        completion_tokens = "/usage/output_tokens"
        completed_ts = "/time"
        started_ts = "/spans/0/at"
        completed_ts_format = "rfc3339"
        started_ts_format = "epoch_s"
        "#,
    )
}

const CUSTOM: &str = r#"{"req":"r-1","customer":{"name":"Acme","id":"acme"},"usage":{"model":"small",
 "input_tokens":1200,"output_tokens":350,"extra":{"x":[1,2]}},"spans":[{"at":1767261640},{"at":1}],
 "time":"2026-01-01T10:00:44.123456+00:00"}"#;

fn both<'a>(m: &InputMapping, s: &'a str) -> Result<Event<'a>, R> {
    let fast = m.parse(s.as_bytes());
    assert_eq!(fast, m.parse_reference(s.as_bytes()), "{s}");
    fast
}

#[test]
fn nested_pointers_arrays_and_time_formats() {
    let e = both(&custom(), CUSTOM).unwrap();
    assert_eq!(e.request_id, "r-1");
    assert_eq!(e.tenant_id, "acme");
    assert!(matches!(e.tenant_id, Cow::Borrowed(_)));
    assert_eq!(e.model, "small");
    assert_eq!((e.prompt_tokens, e.completion_tokens), (1200, 350));
    // Floored to the millisecond; seconds scaled.
    assert_eq!(e.completed_ts, 1_767_261_644_123);
    assert_eq!(e.started_ts, Some(1_767_261_640_000));
}

#[test]
fn reasons_name_the_pointer() {
    let m = custom();
    let reason = |s: &str| both(&m, s).unwrap_err();
    let missing = CUSTOM.replace(r#""id":"acme""#, r#""ident":"acme""#);
    let e = reason(&missing);
    assert_eq!(e.code(), "missing_field");
    assert_eq!(
        e.to_string(),
        "missing required field `tenant_id` (JSON Pointer `/customer/id`)"
    );
    // Through a scalar: absent.
    let scalar = CUSTOM.replace(
        r#""customer":{"name":"Acme","id":"acme"}"#,
        r#""customer":7"#,
    );
    assert_eq!(reason(&scalar).code(), "missing_field");
    let neg = CUSTOM.replace("1200", "-1200");
    assert_eq!(
        reason(&neg).to_string(),
        "field `prompt_tokens` (JSON Pointer `/usage/input_tokens`) is negative"
    );
    let float = CUSTOM.replace("350", "350.0");
    assert_eq!(reason(&float).code(), "invalid_field");
    let bad_time = CUSTOM.replace("2026-01-01T10", "2026-02-30T10");
    assert_eq!(
        reason(&bad_time),
        R::InvalidField(m.field(COMPLETED_TS).clone())
    );
    let repeated = CUSTOM.replace(r#""req":"r-1","#, r#""req":"r-1","customer":{"id":"b"},"#);
    let e = reason(&repeated);
    assert_eq!(e.code(), "malformed_json");
    assert!(e.to_string().contains("duplicate key `customer`"), "{e}");
    // A type error comes before the repeated key.
    let both_wrong = repeated.replace("1200", "\"many\"");
    assert_eq!(reason(&both_wrong).code(), "invalid_field");
}

#[test]
fn cloudevents_defaults_and_their_dedup_key() {
    let m = mapping(r#"format = "cloudevents""#);
    let ev = r#"{"specversion":"1.0","id":"e-1","source":"//gw/eu","type":"com.example.request.completed",
      "subject":"acme","time":"2026-01-01T10:00:44Z","datacontenttype":"application/json",
      "data":{"model":"small","prompt_tokens":1,"completion_tokens":2}}"#;
    let e = both(&m, ev).unwrap();
    assert_eq!(e.request_id, "7://gw/eu:e-1");
    assert_eq!(e.tenant_id, "acme");
    assert_eq!(e.completed_ts, 1_767_261_644_000);
    assert_eq!(e.started_ts, None);
    let no_source = ev.replace(r#""source":"//gw/eu","#, "");
    assert_eq!(
        both(&m, &no_source).unwrap_err().to_string(),
        "missing required field `source`"
    );
    let v2 = ev.replace(r#""1.0""#, r#""2.0""#);
    assert_eq!(both(&m, &v2).unwrap_err().code(), "invalid_field");
    // The same id from another source is another event.
    let us = ev.replace("//gw/eu", "//gw/us");
    let other = both(&m, &us).unwrap();
    assert_ne!(other.request_id, e.request_id);
}

#[test]
fn the_default_mapping_names_fields_as_before() {
    let m = InputMapping::default();
    let e = both(
        &m,
        r#"{"request_id":"r","tenant_id":"a","model":"m","prompt_tokens":1}"#,
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "missing required field `completion_tokens`");
    let dup = r#"{"request_id":"r","tenant_id":"a","tenant_id":"b","model":"m","prompt_tokens":1,"completion_tokens":1,"completed_ts":1767261644000}"#;
    assert_eq!(
        both(&m, dup).unwrap_err().to_string(),
        "malformed JSON: duplicate field `tenant_id`"
    );
    // Repeated keys off the mapped paths are ignored, as unknown keys are.
    let extra = dup.replace(r#""tenant_id":"b","#, r#""x":1,"x":2,"#);
    assert!(both(&m, &extra).is_ok());
}

#[test]
fn epoch_formats_scale_and_refuse_overflow() {
    let rec = |ts: &str| {
        format!(
            r#"{{"request_id":"r","tenant_id":"a","model":"m","prompt_tokens":1,"completion_tokens":1,"completed_ts":{ts}}}"#
        )
    };
    let at = |fmt: &str, ts: &str| {
        let m = mapping(&format!("timestamp_format = \"{fmt}\""));
        both(&m, &rec(ts))
            .map(|e| e.completed_ts)
            .map_err(|e| e.code())
    };
    assert_eq!(at("epoch_s", "1767261644"), Ok(1_767_261_644_000));
    assert_eq!(at("epoch_us", "1767261644123999"), Ok(1_767_261_644_123));
    assert_eq!(at("epoch_us", "-1"), Ok(-1));
    assert_eq!(at("epoch_s", "9223372036854776"), Err("invalid_field"));
    assert_eq!(at("epoch_ms", "9223372036854775808"), Err("invalid_field"));
    assert_eq!(at("epoch_ms", "1.5e12"), Err("invalid_field"));
    assert_eq!(at("rfc3339", "1767261644000"), Err("invalid_field"));
    assert_eq!(
        at("rfc3339", "\"2026-01-01T10:00:44+05:30\""),
        Ok(1_767_241_844_000)
    );
    assert_eq!(
        at("rfc3339", "\"2026-01-01T10:00:44\""),
        Err("invalid_field")
    );
}

#[test]
fn bad_mappings_name_the_key() {
    let err = |t: &str| InputMapping::new(&toml::from_str::<InputConfig>(t).unwrap()).unwrap_err();
    assert_eq!(err(r#"tenant_id = "customer.id""#).0, "input.tenant_id");
    assert_eq!(err(r#"model = """#).0, "input.model");
    let (key, msg) = err(r#"tenant_id = "/a"
        model = "/a/b""#);
    assert_eq!(key, "input.model");
    assert!(msg.contains("overlaps input.tenant_id"), "{msg}");
    assert!(toml::from_str::<InputConfig>(r#"timestamp_format = "epoch_ns""#).is_err());
    // A pointer deeper than the walk tracks: refused, not a panic.
    let deep = format!("tenant_id = \"{}\"", "/a".repeat(60));
    let (key, msg) = err(&deep);
    assert_eq!(key, "input");
    assert!(msg.contains("objects in all"), "{msg}");
    let fine = format!("tenant_id = \"{}\"", "/a".repeat(40));
    assert!(InputMapping::new(&toml::from_str::<InputConfig>(&fine).unwrap()).is_ok());
    assert!(toml::from_str::<InputConfig>(r#"tenant = "/a""#).is_err());
}

#[test]
fn member_names_compare_exactly_at_every_length() {
    let names = [
        "",
        "a",
        "ab",
        "abc",
        "abcd",
        "abcde",
        "abcdefg",
        "abcdefgh",
        "abcdefghi",
        "abcdefghijklmnop",
        "abcdefghijklmnopq",
    ];
    for a in names {
        for b in names {
            assert_eq!(
                crate::model::same(a.as_bytes(), b.as_bytes()),
                a == b,
                "{a:?} {b:?}"
            );
        }
        // One byte differs, at each position.
        for i in 0..a.len() {
            let mut c = a.as_bytes().to_vec();
            c[i] = b'#';
            assert!(!crate::model::same(a.as_bytes(), &c), "{a:?} at {i}");
        }
    }
}

/// A rating's extras (`extra`): counts in declaration order, absent = 0, the
/// variant; their reasons name them and come after the event's own.
#[test]
fn extras_are_read_after_the_events_fields_and_their_reasons_name_them() {
    let decl = |name: &str, pointer: Option<&str>, required| ExtraDecl {
        name: name.into(),
        pointer: pointer.map(Into::into),
        required,
    };
    let m = InputMapping::default()
        .with_extra(
            &[
                decl("cached_tokens", Some("/usage/cached"), false),
                decl("calls", None, true),
            ],
            Some(&decl("tier", None, false)),
        )
        .unwrap();
    let rec = |extra: &str| {
        format!(
            r#"{{"request_id":"r","tenant_id":"t","model":"m","prompt_tokens":1,"completion_tokens":2,"completed_ts":1767261644000{extra}}}"#
        )
    };
    let full = rec(r#","usage":{"cached":7},"calls":3,"tier":"batch""#);
    let ev = m.parse(full.as_bytes()).unwrap();
    assert_eq!(
        (ev.extra.counts.clone(), ev.extra.variant.as_deref()),
        (vec![7, 3], Some("batch"))
    );
    let bare = rec(r#","calls":0"#);
    let ev = m.parse(bare.as_bytes()).unwrap();
    assert_eq!((ev.extra.counts, ev.extra.variant), (vec![0, 0], None));
    let code = |extra: &str| {
        let r = m.parse(rec(extra).as_bytes()).unwrap_err();
        (r.code(), r.to_string())
    };
    let (c, why) = code(r#","usage":{"cached":-1},"calls":1"#);
    assert!(
        c == "negative_tokens" && why.contains("cached_tokens") && why.contains("/usage/cached"),
        "{why}"
    );
    assert_eq!(code(r#","calls":1.5"#).0, "invalid_field");
    let (c, why) = code("");
    assert!(c == "missing_field" && why.contains("calls"), "{why}");
    assert_eq!(code(r#","calls":1,"tier":7"#).0, "invalid_field");
    // The event's own reason first.
    let own = r#"{"request_id":"r","tenant_id":"t","model":"m","prompt_tokens":-1,"completion_tokens":2,"completed_ts":1767261644000}"#;
    let r = m.parse(own.as_bytes()).unwrap_err();
    assert!(r.to_string().contains("prompt_tokens"), "{r}");
    // A pointer into another field's value is refused, naming the key.
    let err = InputMapping::default()
        .with_extra(&[decl("x", Some("/prompt_tokens/x"), false)], None)
        .unwrap_err();
    assert_eq!(err.0, "input.quantities.x.pointer");
}
