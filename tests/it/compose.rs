//! docker-compose.yml and the Dockerfile as issue 37 asks (step 6): the usage API
//! runs with a key file and never without keys, and no port is published beyond
//! the host's loopback (none of the listeners there authenticates but the API's).

use serde_json::Value;

fn compose() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yml"))
        .unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

#[test]
fn compose_runs_the_api_with_keys_and_publishes_on_loopback_only() {
    let c = compose();
    let services = c["services"].as_object().unwrap();
    let mut published = 0;
    for (name, s) in services {
        for port in s["ports"].as_array().into_iter().flatten() {
            let port = port.as_str().unwrap();
            assert!(
                port.starts_with("127.0.0.1:"),
                "{name} publishes {port} beyond loopback"
            );
            published += 1;
        }
        let env = &s["environment"];
        assert!(
            env.get("TALLY_API__ALLOW_UNAUTHENTICATED").is_none(),
            "{name} serves the API without keys"
        );
    }
    assert!(published >= 1);
    let api = &services["api"];
    assert_eq!(api["command"][0], "api");
    let keys = api["environment"]["TALLY_API__KEYS"]
        .as_str()
        .expect("the API's key file");
    assert!(api["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p.as_str().unwrap().ends_with(":8080")));
    // The file comes from the api-key service's volume, which mints the first key.
    let mounts: Vec<&str> = api["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let dir = std::path::Path::new(keys)
        .parent()
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        mounts.iter().any(|m| m.contains(&format!(":{dir}"))),
        "{mounts:?}"
    );
    assert_eq!(services["api-key"]["environment"]["TALLY_API__KEYS"], keys);
    assert!(services["api-key"]["command"][0]
        .as_str()
        .unwrap()
        .contains("tally api-key create"));
    // The image has the key file's directory, owned by the user tally runs as.
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("-o tally -g tally -m 0700 {dir}")),
        "{dockerfile}"
    );
    assert!(dockerfile.contains("USER tally"));
}
