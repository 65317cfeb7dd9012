//! Handcrafted records through every parser: prints what each extracts.
use parsebench::*;

fn show(v: Option<Vals<'_>>, n: usize) -> String {
    match v {
        None => "REJECT".into(),
        Some(v) => fmt_vals(&v, n),
    }
}

fn fmt_vals(v: &Vals<'_>, n: usize) -> String {
    v[..n]
        .iter()
        .map(|x| match x {
            Val::Absent => "-".to_string(),
            Val::Null => "null".into(),
            Val::Str(s) => format!("{s:?}"),
            Val::U64(n) => format!("u{n}"),
            Val::I64(n) => format!("i{n}"),
            Val::Other => "Other".into(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

const BASE: &str = r#""request_id":"r1","tenant_id":"t1","model":"m","completion_tokens":2,"started_ts":1,"completed_ts":1767261596490"#;

fn main() {
    let shape = Shape::Default;
    let plan = shape.plan();
    let tree = shape.tree();
    let n = 7;
    let mut cases: Vec<(&str, Vec<u8>)> = vec![];
    let rec = |pt: &str| format!("{{{BASE},\"prompt_tokens\":{pt}}}").into_bytes();
    cases.push(("baseline", rec("5")));
    cases.push(("-0", rec("-0")));
    cases.push(("-1", rec("-1")));
    cases.push(("1.0", rec("1.0")));
    cases.push(("1e2", rec("1e2")));
    cases.push(("1e400", rec("1e400")));
    cases.push(("-1e400", rec("-1e400")));
    cases.push(("u64::MAX 18446744073709551615", rec("18446744073709551615")));
    cases.push(("u64::MAX+1 18446744073709551616", rec("18446744073709551616")));
    cases.push(("i64::MIN-1 -9223372036854775809", rec("-9223372036854775809")));
    cases.push(("leading zero 01", rec("01")));
    cases.push(("1e400 in skipped member", format!("{{{BASE},\"prompt_tokens\":5,\"x\":1e400}}").into_bytes()));
    cases.push(("model \"\\ud800\" (lone surrogate)", format!("{{{BASE},\"prompt_tokens\":5,\"model\":\"\\ud800\"}}").replace("\"model\":\"m\",", "").into_bytes()));
    cases.push(("lone surrogate in skipped member", format!("{{{BASE},\"prompt_tokens\":5,\"x\":\"\\ud800\"}}").into_bytes()));
    cases.push(("lone trailing surrogate \\udc00 in model", format!("{{{BASE},\"prompt_tokens\":5}}").replace("\"model\":\"m\"", "\"model\":\"\\udc00\"").into_bytes()));
    cases.push(("escaped model \"\\u00e9\\n\"", format!("{{{BASE},\"prompt_tokens\":5}}").replace("\"model\":\"m\"", "\"model\":\"\\u00e9\\n\"").into_bytes()));
    cases.push(("escaped key \"mod\\u0065l\"", format!("{{{BASE},\"prompt_tokens\":5}}").replace("\"model\":\"m\"", "\"mod\\u0065l\":\"m\"").into_bytes()));
    let mut bad = format!("{{{BASE},\"prompt_tokens\":5}}").replace("\"model\":\"m\"", "\"model\":\"m\u{0}\"").into_bytes();
    let p = bad.iter().position(|&b| b == 0).unwrap();
    bad[p] = 0xff;
    cases.push(("invalid UTF-8 (0xff) in model", bad));
    let mut bad = format!("{{{BASE},\"prompt_tokens\":5,\"x\":\"a\u{0}\"}}").into_bytes();
    let p = bad.iter().position(|&b| b == 0).unwrap();
    bad[p] = 0xff;
    cases.push(("invalid UTF-8 (0xff) in skipped member (last)", bad));
    let mut bad = format!("{{\"x\":\"a\u{0}\",{BASE},\"prompt_tokens\":5}}").into_bytes();
    let p = bad.iter().position(|&b| b == 0).unwrap();
    bad[p] = 0xff;
    cases.push(("invalid UTF-8 (0xff) in skipped member (first)", bad));
    let mut bad = format!("{{{BASE},\"prompt_tokens\":5,\"a\u{0}\":1}}").into_bytes();
    let p = bad.iter().position(|&b| b == 0).unwrap();
    bad[p] = 0xff;
    cases.push(("invalid UTF-8 (0xff) in a skipped key", bad));
    cases.push(("duplicate mapped key (model twice)", format!("{{{BASE},\"prompt_tokens\":5,\"model\":\"m2\"}}").into_bytes()));
    cases.push(("duplicate unmapped key", format!("{{{BASE},\"prompt_tokens\":5,\"x\":1,\"x\":2}}").into_bytes()));
    cases.push(("trailing garbage", format!("{{{BASE},\"prompt_tokens\":5}} x").into_bytes()));
    cases.push(("trailing second value", format!("{{{BASE},\"prompt_tokens\":5}} {{}}").into_bytes()));
    cases.push(("invalid JSON in skipped member after all fields", format!("{{{BASE},\"prompt_tokens\":5,\"x\":[1,,2]}}").into_bytes()));
    cases.push(("invalid JSON in skipped member: bare word", format!("{{{BASE},\"prompt_tokens\":5,\"x\":nul}}").into_bytes()));
    cases.push(("raw control char (\\n) in model", format!("{{{BASE},\"prompt_tokens\":5}}").replace("\"model\":\"m\"", "\"model\":\"m\nx\"").into_bytes()));
    cases.push(("raw control char in skipped member", format!("{{{BASE},\"prompt_tokens\":5,\"x\":\"a\tb\"}}").into_bytes()));
    cases.push(("truncated (missing closing brace)", format!("{{{BASE},\"prompt_tokens\":5").into_bytes()));
    cases.push(("BOM prefix", [b"\xEF\xBB\xBF".as_slice(), format!("{{{BASE},\"prompt_tokens\":5}}").as_bytes()].concat()));
    cases.push(("root is an array", b"[1,2]".to_vec()));
    cases.push(("tokens as string \"5\"", rec("\"5\"")));
    cases.push(("tokens null", rec("null")));
    cases.push(("deep nesting skipped (200 levels)", format!("{{{BASE},\"prompt_tokens\":5,\"x\":{}{}}}", "[".repeat(200), "]".repeat(200)).into_bytes()));

    let mut buf = Vec::new();
    let mut buffers = simd_json::Buffers::new(4096);
    for (name, b) in &cases {
        println!("### {name}\n    input: {}", String::from_utf8_lossy(b));
        println!("    a  serde from_slice : {}", show(a_serde_slice(&plan, b), n));
        println!("    b  utf8+serde str   : {}", show(b_serde_str(&plan, b), n));
        println!("    c  sonic from_slice : {}", show(c_sonic_slice(&plan, b), n));
        println!("    c2 utf8+sonic str   : {}", show(c2_sonic_str(&plan, b), n));
        println!("    d  simd-json serde  : {}", show(d_simd(&plan, &mut buf, &mut buffers, b), n));
        println!("    e  derive Wire      : {}", show(e_wire(b), n));
        println!(
            "    f  sonic get_many   : {}",
            f_sonic_get_many(&tree, n, b, |v| fmt_vals(v, n)).unwrap_or_else(|| "REJECT".into())
        );
    }
    // Error messages for a couple of cases, to see why.
    let why = |b: &[u8]| {
        let mut de = sonic_rs::Deserializer::from_slice(b);
        let r = walk_vals(&plan, &mut de).map(|_| ()).and_then(|_| de.end());
        let mut de2 = serde_json::Deserializer::from_slice(b);
        let r2 = walk_vals(&plan, &mut de2).map(|_| ()).and_then(|_| de2.end());
        let r3 = sonic_rs::get_many(b, &tree).map(|_| ());
        (format!("{r:?}"), format!("{r2:?}"), format!("{r3:?}"))
    };
    println!("\n### error texts (sonic serde / serde_json / sonic get_many)");
    for (name, b) in &cases {
        let (s, j, g) = why(b);
        println!("{name}:\n    sonic: {s}\n    serde: {j}\n    get_many: {g}");
    }
}
