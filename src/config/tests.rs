use super::*;

const PRICES: &str = "[prices.small]\ninput_per_1k = \"0.00015\"\noutput_per_1k = \"0.0006\"\n";

fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_toml_with_env(
        text,
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
    )
}

#[test]
fn defaults_and_passthrough() {
    let c = load(
        &format!("[kafka]\n\"session.timeout.ms\" = \"6000\"\n{PRICES}"),
        &[],
    )
    .unwrap();
    assert_eq!(c.window.size, Millis(60_000));
    assert_eq!(c.kafka.properties["session.timeout.ms"], "6000");
    assert_eq!(c.topics.late, "requests.late");
    let e = c.engine().unwrap();
    assert_eq!(e.max_out_of_orderness_ms, 5_000);
}

#[test]
fn env_overrides_win() {
    let c = load(
        PRICES,
        &[
            ("TALLY_KAFKA__BOOTSTRAP_SERVERS", "10.0.0.1:9092"),
            ("TALLY_KAFKA__SESSION_TIMEOUT_MS", "7000"),
            ("TALLY_WINDOW__SIZE", "5m"),
            ("TALLY_CHECKPOINT__RETAIN", "5"),
            ("TALLY_PRICES__SMALL__INPUT_PER_1K", "0.001"),
            ("UNRELATED", "x"),
        ],
    )
    .unwrap();
    assert_eq!(c.kafka.bootstrap_servers, "10.0.0.1:9092");
    assert_eq!(c.kafka.properties["session.timeout.ms"], "7000");
    assert_eq!(c.window.size, Millis(300_000));
    assert_eq!(c.checkpoint.retain, 5);
    assert_eq!(c.prices["small"].input_per_1k, "0.001");
}

#[test]
fn errors_name_the_key() {
    let err = |t: &str| load(t, &[]).unwrap_err().to_string();
    assert!(err(&format!("[window]\nsise = \"1m\"\n{PRICES}")).contains("sise"));
    assert!(err(&format!("[kafka]\nbootstrap = \"x\"\n{PRICES}")).contains("kafka.bootstrap"));
    assert!(err(&format!("[window]\nsize = \"0\"\n{PRICES}")).contains("window.size"));
    assert!(err(&format!("[window]\nsize = \"5 minutes\"\n{PRICES}")).contains("5 minutes"));
    assert!(
        err("[prices.small]\ninput_per_1k = \"0.1\"\noutput_per_1k = \"1e-3\"\n")
            .contains("prices.small.output_per_1k")
    );
    // Prices are optional for the sink and the broker, required to price.
    let bare = load("", &[]).unwrap();
    assert!(bare.engine().unwrap_err().to_string().contains("prices"));
}

/// Secrets from files (Kubernetes secret mounts): `{ file = "…" }` in the
/// TOML, `TALLY_…_FILE` in the environment; masked like any secret.
#[test]
fn secrets_are_read_from_files() {
    let dir = std::env::temp_dir().join(format!("tally-secret-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("sasl"), "UNIT-CANARY-file-sasl\n").unwrap();
    std::fs::write(
        dir.join("url"),
        "postgres://u:UNIT-CANARY-file-url@db/tally",
    )
    .unwrap();
    let text = format!(
        "[kafka]\n\"sasl.password\" = {{ file = \"{}\" }}\n{PRICES}",
        dir.join("sasl").display()
    );
    let url_file = dir.join("url").display().to_string();
    let cfg = load(&text, &[("TALLY_SINK__DATABASE_URL_FILE", &url_file)]).unwrap();
    assert_eq!(
        cfg.kafka.properties["sasl.password"],
        "UNIT-CANARY-file-sasl"
    );
    assert_eq!(
        cfg.sink.database_url,
        "postgres://u:UNIT-CANARY-file-url@db/tally"
    );
    let printed = cfg.effective_toml().unwrap();
    assert!(!printed.contains("UNIT-CANARY"), "{printed}");
    let missing = format!(
        "[sink]\ndatabase_url = {{ file = \"{}/nope\" }}\n",
        dir.display()
    );
    let e = load(&missing, &[]).unwrap_err().to_string();
    assert!(e.contains("sink.database_url") && e.contains("nope"), "{e}");
    let e = load("", &[("TALLY_SINK__DATABASE_URL_FILE", "/no/such")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("TALLY_SINK__DATABASE_URL_FILE") && e.contains("/no/such"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tally config` prints TOML that loads back to the same configuration, with
/// secrets masked.
#[test]
fn the_effective_config_loads_back_and_masks_secrets() {
    let text = format!(
            "[kafka]\n\"sasl.password\" = \"UNIT-CANARY-eff\"\n\"session.timeout.ms\" = 7000\n\
             [sink]\ndatabase_url = \"postgres://u:UNIT-CANARY-url@db/tally\"\n[watermark]\nidle_timeout = \"2m\"\n{PRICES}"
        );
    let cfg = load(&text, &[("TALLY_WINDOW__SIZE", "5m")]).unwrap();
    let printed = cfg.effective_toml().unwrap();
    assert!(!printed.contains("UNIT-CANARY"), "{printed}");
    assert!(printed.contains("\"sasl.password\" = \"***\""), "{printed}");
    let short = load("[kafka]\n\"sasl.password\" = \"ab\"\n", &[]).unwrap();
    assert!(short
        .effective_toml()
        .unwrap()
        .contains("\"sasl.password\" = \"***\""));
    let again = load(&printed, &[]).unwrap();
    assert_eq!(again.effective_toml().unwrap(), printed);
    assert_eq!(again.window.size.0, 300_000);
    assert_eq!(again.kafka.properties["session.timeout.ms"], "7000");
}

/// The object-store contract: `checkpoint.dir` a URL, options under the
/// crate's key names in `[checkpoint.object_store]` (TOML scalars or strings),
/// each overridable from the environment; an unknown key, or options without a
/// URL, refused by name; secret options masked by `tally config`.
#[test]
fn object_store_options_load_override_and_are_checked_by_name() {
    let text = format!(
            "[checkpoint]\ndir = \"s3://bucket/tally\"\n[checkpoint.object_store]\n\
             aws_region = \"eu-west-1\"\naws_allow_http = true\n\
             aws_access_key_id = \"AKIDTEST\"\naws_secret_access_key = \"UNIT-CANARY-s3\"\n{PRICES}"
        );
    let c = load(
        &text,
        &[(
            "TALLY_CHECKPOINT__OBJECT_STORE__AWS_ENDPOINT",
            "http://127.0.0.1:9000",
        )],
    )
    .unwrap();
    let o = &c.checkpoint.object_store;
    assert_eq!(o["aws_endpoint"], "http://127.0.0.1:9000");
    assert_eq!(o["aws_allow_http"], "true");
    assert_eq!(o["aws_region"], "eu-west-1");
    let printed = c.effective_toml().unwrap();
    assert!(!printed.contains("UNIT-CANARY"), "{printed}");
    assert!(printed.contains("aws_endpoint"), "{printed}");
    let e = load(
        &text,
        &[("TALLY_CHECKPOINT__OBJECT_STORE__AWS_ENDPONT", "x")],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("checkpoint.object_store.aws_endpont"), "{e}");
    let e = load(
        &format!("[checkpoint.object_store]\naws_region = \"x\"\n{PRICES}"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("checkpoint.object_store") && e.contains("URL"),
        "{e}"
    );
    let e = load(&format!("[checkpoint]\ndir = \"ftp://x/y\"\n{PRICES}"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("checkpoint.dir") && e.contains("s3://"), "{e}");
}

/// The example file documents the defaults: every value it sets (but the
/// prices, which have none) must be the default, and it must load.
#[test]
fn the_example_config_loads_and_its_values_are_the_defaults() {
    let mut example = load(include_str!("../../tally.example.toml"), &[]).unwrap();
    example.engine().unwrap();
    assert_eq!(
        example.prices.keys().collect::<Vec<_>>(),
        ["large", "small"]
    );
    example.prices.clear();
    assert_eq!(
        serde_json::to_value(&example).unwrap(),
        serde_json::to_value(Config::default()).unwrap()
    );
}

/// Issue 19, defect 7: two prices of one model from the same instant are
/// refused, naming both; integer ms are accepted as documented.
#[test]
fn duplicate_effective_dates_are_refused_and_integer_ms_accepted() {
    let sched = |from: &str| {
        format!(
                "[[prices.small.schedule]]\neffective_from = {from}\ninput_per_1k = \"0.1\"\noutput_per_1k = \"0.2\"\n"
            )
    };
    let two = format!(
        "{PRICES}{}{}",
        sched("\"2027-01-01T00:00:00Z\""),
        sched("1798761600000")
    );
    let e = load(&two, &[]).unwrap_err().to_string();
    assert!(
        e.contains("prices.small.schedule[1].effective_from")
            && e.contains("prices.small.schedule[0].effective_from"),
        "{e}"
    );
    let base = format!(
        "{PRICES}effective_from = 1767261644000\n{}",
        sched("\"1767261644000\"")
    );
    let e = load(&base, &[]).unwrap_err().to_string();
    assert!(
        e.contains("schedule[0]") && e.contains("prices.small.effective_from"),
        "{e}"
    );
    let ok = load(&format!("{PRICES}effective_from = 1767261644000\n"), &[]).unwrap();
    let t = ok.price_table().unwrap();
    assert!(t.cost("small", 1000, 0, 1_767_261_643_999).is_err());
    assert!(t.cost("small", 1000, 0, 1_767_261_644_000).is_ok());
}

/// An override that fails names its environment variable; model names from
/// the environment match the file's regardless of case.
#[test]
fn environment_errors_name_the_variable() {
    let e = load(PRICES, &[("TALLY_FOO__BAR", "1")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("environment variable TALLY_FOO__BAR") && e.contains("foo"),
        "{e}"
    );
    let e = load(PRICES, &[("TALLY_WINDOW__SIZE", "0")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("environment variable TALLY_WINDOW__SIZE") && e.contains("window.size"),
        "{e}"
    );
    let text = "[prices.GPT4o]\ninput_per_1k = \"0.1\"\noutput_per_1k = \"0.2\"\n";
    let c = load(text, &[("TALLY_PRICES__GPT4O__INPUT_PER_1K", "0.3")]).unwrap();
    assert_eq!(c.prices.len(), 1);
    assert_eq!(c.prices["GPT4o"].input_per_1k, "0.3");
}

#[test]
fn the_properties_tally_owns_are_refused() {
    for owned in crate::kafka::OWNED_CONSUMER_PROPERTIES {
        let key = owned.key;
        let e = load(&format!("[kafka]\n\"{key}\" = \"earliest\"\n{PRICES}"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains(owned.why), "{e}");
    }
    let e = load(
        &format!("[kafka]\n\"isolation.level\" = \"read_uncommitted\"\n{PRICES}"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("kafka.\"isolation.level\"")
            && e.contains("\"read_committed\"")
            && e.contains("aborted transactions"),
        "{e}"
    );
    let env = load(PRICES, &[("TALLY_KAFKA__AUTO_OFFSET_RESET", "earliest")]);
    assert!(env.unwrap_err().to_string().contains("auto.offset.reset"));
}

#[test]
fn effective_dated_prices() {
    let c = load(
            &format!(
                "{PRICES}effective_from = \"2026-01-01T00:00:00Z\"\n[[prices.small.schedule]]\n\
                 effective_from = \"2026-02-01T00:00:00Z\"\ninput_per_1k = \"0.0001\"\noutput_per_1k = \"0.0004\"\n"
            ),
            &[],
        )
        .unwrap();
    let t = c.price_table().unwrap();
    let jan = crate::time::utc::parse_utc_ms("2026-01-15T00:00:00Z").unwrap();
    let feb = crate::time::utc::parse_utc_ms("2026-02-15T00:00:00Z").unwrap();
    assert_eq!(t.cost("small", 1000, 0, jan).unwrap().0, 150_000_000);
    assert_eq!(t.cost("small", 1000, 0, feb).unwrap().0, 100_000_000);
    assert!(t.cost("small", 1000, 0, jan - 31 * 86_400_000).is_err());
}

/// Issue 16: impossible dates are errors naming the key (they used to roll
/// over into the next month); offsets are converted to UTC.
#[test]
fn effective_from_dates_are_checked_and_offsets_accepted() {
    let sched = |from: &str| {
        format!(
            "{PRICES}[[prices.small.schedule]]\neffective_from = \"{from}\"\n\
                 input_per_1k = \"0.1\"\noutput_per_1k = \"0.2\"\n"
        )
    };
    for bad in [
        "2026-02-30T00:00:00Z",
        "2026-04-31T00:00:00Z",
        "2026-02-29T00:00:00Z",
    ] {
        let e = load(&sched(bad), &[]).unwrap_err().to_string();
        assert!(
            e.contains("prices.small.schedule[0].effective_from") && e.contains(bad),
            "{e}"
        );
    }
    let leap = load(&sched("2028-02-29T01:00:00+01:00"), &[]).unwrap();
    let t = leap.price_table().unwrap();
    let at = crate::time::utc::parse_utc_ms("2028-02-29T00:00:00Z").unwrap();
    assert_eq!(t.cost("small", 1000, 0, at - 1).unwrap().0, 150_000_000);
    assert_eq!(t.cost("small", 1000, 0, at).unwrap().0, 100_000_000_000);
}
