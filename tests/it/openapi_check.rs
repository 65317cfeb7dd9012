//! The part of JSON Schema (2020-12, as OpenAPI 3.1 uses it) that
//! docs/openapi.yaml uses, checked against answers, for the conformance test
//! (`api_openapi`).
//!
//! Invariants: a keyword this checker does not know fails the check (so the spec
//! cannot start using one that is silently ignored); objects are closed — a
//! property the schema does not list is a failure unless `additionalProperties`
//! allows it, so the server answers nothing undocumented.

use serde_json::Value;

/// The spec, read from docs/openapi.yaml.
pub(crate) struct Spec(pub Value);

/// Keywords that describe and never constrain.
const ANNOTATIONS: &[&str] = &["description", "example", "examples", "default", "title"];

impl Spec {
    pub fn load() -> Spec {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        Spec(serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}")))
    }

    /// `v` with its `$ref` (a local JSON pointer) followed, repeatedly.
    pub fn deref<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        while let Some(r) = v.get("$ref").and_then(Value::as_str) {
            let pointer = r
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("a remote $ref {r}"));
            v = self
                .0
                .pointer(pointer)
                .unwrap_or_else(|| panic!("$ref {r} points nowhere"));
        }
        v
    }

    /// Every way `value` breaks `schema`, each with the place (`at`) it breaks it.
    pub fn check(&self, schema: &Value, value: &Value, at: &str) -> Vec<String> {
        let mut errors = Vec::new();
        self.walk(schema, value, at, &mut errors);
        errors
    }

    fn walk(&self, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        let schema = self.deref(schema);
        let Some(keywords) = schema.as_object() else {
            return errors.push(format!("{at}: the schema {schema} is not an object"));
        };
        let fail = |errors: &mut Vec<String>, what: String| {
            errors.push(format!("{at}: {what} (value {value})"))
        };
        for (k, want) in keywords {
            match k.as_str() {
                "type" => {
                    let types: Vec<&str> = match want {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                        _ => vec![],
                    };
                    if !types.iter().any(|t| is_type(value, t)) {
                        fail(errors, format!("not of type {want}"));
                    }
                }
                "enum" => {
                    if !want.as_array().is_some_and(|e| e.contains(value)) {
                        fail(errors, format!("not one of {want}"));
                    }
                }
                "const" => {
                    if value != want {
                        fail(errors, format!("not {want}"));
                    }
                }
                "pattern" => {
                    let re = regex::Regex::new(want.as_str().unwrap()).unwrap();
                    if value.as_str().is_some_and(|s| !re.is_match(s)) {
                        fail(errors, format!("does not match {want}"));
                    }
                }
                "minLength" | "maxLength" => {
                    let n = want.as_u64().unwrap() as usize;
                    if let Some(len) = value.as_str().map(|s| s.chars().count()) {
                        if (k == "minLength" && len < n) || (k == "maxLength" && len > n) {
                            fail(errors, format!("{k} {n}"));
                        }
                    }
                }
                "minimum" | "maximum" => {
                    // Integers of any size (the sums are unbounded): compared as
                    // digits, the bounds here being small.
                    if let Some(text) = value.as_number().map(|n| n.to_string()) {
                        let bound = want.as_i64().unwrap();
                        let below = text.starts_with('-');
                        let v: Option<i128> = text.parse().ok();
                        let broken = match (k.as_str(), v) {
                            ("minimum", Some(v)) => v < bound as i128,
                            ("minimum", None) => below,
                            (_, Some(v)) => v > bound as i128,
                            (_, None) => !below,
                        };
                        if broken {
                            fail(errors, format!("{k} {bound}"));
                        }
                    }
                }
                "format" => {
                    let ok = match want.as_str() {
                        Some("date-time") => value
                            .as_str()
                            .is_none_or(|s| tally::time::utc::parse_utc_ms(s).is_ok()),
                        other => panic!("{at}: format {other:?} is not checked here"),
                    };
                    if !ok {
                        fail(errors, format!("not a {want}"));
                    }
                }
                "required" => {
                    if let Some(obj) = value.as_object() {
                        for name in want.as_array().unwrap() {
                            if !obj.contains_key(name.as_str().unwrap()) {
                                fail(errors, format!("lacks the required {name}"));
                            }
                        }
                    }
                }
                "properties" => {
                    if let Some(obj) = value.as_object() {
                        let open = keywords.get("additionalProperties") == Some(&Value::Bool(true));
                        for (name, v) in obj {
                            match want.get(name) {
                                Some(s) => self.walk(s, v, &format!("{at}.{name}"), errors),
                                None if open => {}
                                None => errors.push(format!("{at}: {name:?} is not documented")),
                            }
                        }
                    }
                }
                "items" => {
                    for (i, v) in value.as_array().into_iter().flatten().enumerate() {
                        self.walk(want, v, &format!("{at}[{i}]"), errors);
                    }
                }
                "additionalProperties" | "$ref" => {}
                k if ANNOTATIONS.contains(&k) => {}
                other => panic!("{at}: the keyword {other:?} is not checked here"),
            }
        }
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "string" => v.is_string(),
        "integer" => v
            .as_number()
            .is_some_and(|n| !n.to_string().contains(['.', 'e', 'E'])),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        other => panic!("the type {other:?} is not checked here"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every JSON example the spec gives is an answer its schema admits.
    #[test]
    fn the_specs_examples_validate_against_their_schemas() {
        let spec = Spec::load();
        let mut responses: Vec<(String, Value)> = vec![];
        for (path, item) in spec.0["paths"].as_object().unwrap() {
            for (status, r) in item["get"]["responses"].as_object().unwrap() {
                responses.push((format!("{path} {status}"), spec.deref(r).clone()));
            }
        }
        for (name, r) in spec.0["components"]["responses"].as_object().unwrap() {
            responses.push((name.clone(), r.clone()));
        }
        let mut checked = 0;
        for (at, r) in responses {
            for (media, m) in r["content"].as_object().into_iter().flatten() {
                if !media.contains("json") {
                    continue;
                }
                let mut examples: Vec<&Value> = m.get("example").into_iter().collect();
                examples.extend(
                    m["examples"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(_, e)| &e["value"]),
                );
                for e in examples {
                    let errors = spec.check(&m["schema"], e, &at);
                    assert!(errors.is_empty(), "{at}: {errors:?}");
                    checked += 1;
                }
            }
        }
        assert!(checked >= 10, "{checked}");
    }

    /// The checker catches what it must, against the spec's own schemas.
    #[test]
    fn the_checker_refuses_what_the_schemas_refuse() {
        let spec = Spec::load();
        let row = json!({"$ref": "#/components/schemas/UsageRow"});
        let good = json!({"window_start": "2026-01-01T10:00:00Z", "window_end": "2026-01-01T11:00:00Z",
            "cost_pico": "5", "usd": "0.000000000005", "requests": 12345,
            "prompt_tokens": 1, "completion_tokens": 1, "final": true});
        assert_eq!(spec.check(&row, &good, "row"), Vec::<String>::new());
        for (field, bad) in [
            ("cost_pico", json!(5)),
            ("usd", json!("0.5")),
            ("requests", json!(-1)),
            ("window_start", json!("yesterday")),
            ("final", json!("true")),
            // Undocumented (objects are closed), and a documented one of the wrong type.
            ("colour", json!("gold")),
            ("plan", json!(7)),
        ] {
            let mut v = good.clone();
            v[field] = bad;
            assert!(!spec.check(&row, &v, "row").is_empty(), "{field}: {v}");
        }
        let mut v = good.clone();
        v.as_object_mut().unwrap().remove("usd");
        assert!(!spec.check(&row, &v, "row").is_empty());
    }
}
