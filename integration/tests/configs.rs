//! Every Envoy config in the repo passes `envoy --mode validate`, and a bad filter
//! configuration makes Envoy reject the filter with kvroute's reason in the log.

use kvroute_integration::envoy;
use kvroute_integration::paths;
use kvroute_integration::stack::{filter_config, write_config, Ports, StackOptions};
use serde_json::json;

const PORTS: Ports = Ports { admin: 19901, listen: 19000, updater: 19100 };

fn workers() -> Vec<String> {
    vec!["127.0.0.1:18001".into(), "127.0.0.1:18002".into()]
}

#[tokio::test]
async fn every_repo_config_validates() {
    let dir = paths::scratch_dir("validate").unwrap();
    let templates = envoy::templates().unwrap();
    assert!(templates.len() >= 2, "expected the kvroute and baseline configs");
    for t in templates {
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        let cfg = filter_config(&workers(), &StackOptions::default());
        let path = write_config(&name, &dir, PORTS, &workers(), &cfg).unwrap();
        let (ok, out) = envoy::validate(&path).await.unwrap();
        assert!(ok, "{name} failed validation:\n{out}");
        if name == "kvroute.yaml" {
            assert!(out.contains("kvroute: configured"), "the filter did not load:\n{out}");
        }
    }
}

#[tokio::test]
async fn bad_filter_config_is_rejected_with_a_reason() {
    let dir = paths::scratch_dir("badconfig").unwrap();
    let cases = [
        (json!({"models": []}), "at least one model"),
        (json!({"models": [{"name": "m", "workers": ["not-an-address"]}]}), "not an ip:port"),
        (
            json!({"models": [{"name": "m", "workers": ["127.0.0.1:1"]}], "bogus": 1}),
            "unknown field",
        ),
    ];
    for (cfg, reason) in cases {
        let path = write_config("kvroute.yaml", &dir, PORTS, &workers(), &cfg).unwrap();
        let (ok, out) = envoy::validate(&path).await.unwrap();
        assert!(!ok, "Envoy accepted a bad filter config {cfg}");
        assert!(
            out.contains("kvroute: rejecting plugin configuration"),
            "no reason logged:\n{out}"
        );
        assert!(out.contains(reason), "reason '{reason}' missing:\n{out}");
    }
}
