//! Every Envoy config in the repo passes `envoy --mode validate`, and a bad filter
//! configuration makes Envoy reject the filter with kvroute's reason in the log.

use kvroute_stack::envoy;
use kvroute_stack::paths;
use kvroute_stack::stack::{filter_config, write_config, StackOptions, StackPorts};
use serde_json::json;

const PORTS: StackPorts = StackPorts { admin: 19901, listen: 19000, updater: 19100 };

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

/// `deploy/updater.example.toml` with its commented `[discovery]` table enabled (every key in
/// it uncommented, the `[[workers]]` list removed, the token and the model directory local):
/// `kvroute-updater --check` accepts it and resolves every key of the table as written.
#[test]
fn the_example_updater_config_with_discovery_checks() {
    let root = paths::repo_root();
    let text = std::fs::read_to_string(root.join("deploy/updater.example.toml")).unwrap();
    // The commented table: from `# [discovery]` on, each `# KEY = VALUE` line (a `# # ` line is
    // its documentation).
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| l.trim() == "# [discovery]").expect("no # [discovery]");
    let mut table = String::from("[discovery]\n");
    for l in &lines[start + 1..] {
        let Some(kv) = l.strip_prefix("# ") else { break };
        if kv.starts_with('#') {
            continue;
        }
        table.push_str(kv);
        table.push('\n');
    }
    let discovery: toml::Value = toml::from_str(&table).unwrap();
    let discovery = discovery["discovery"].as_table().unwrap().clone();
    let keys = [
        "source",
        "dns_server",
        "http_port",
        "events_port",
        "replay_port",
        "port_name",
        "min_ttl_ms",
        "max_ttl_ms",
        "kube_api",
        "kube_token_file",
        "kube_ca_file",
        "site",
    ];
    let mut shown: Vec<&str> = discovery.keys().map(String::as_str).collect();
    shown.sort_unstable();
    let mut want = keys.to_vec();
    want.sort_unstable();
    assert_eq!(shown, want, "the example's [discovery] table does not show every key");

    let mut cfg: toml::Table = toml::from_str(&text).unwrap();
    assert!(cfg.remove("workers").is_some(), "the example lists workers");
    assert!(!cfg.contains_key("discovery"), "the example's [discovery] is enabled");
    let dir = paths::scratch_dir("example-discovery").unwrap();
    std::fs::write(dir.join("token"), "example-config-test-token-0123456789").unwrap();
    cfg.insert("token_file".into(), "token".into());
    let demo = root.join("assets/demo-model").display().to_string();
    for m in cfg["models"].as_array_mut().unwrap() {
        if let Some(t) = m.as_table_mut().filter(|t| t.contains_key("dir")) {
            t.insert("dir".into(), demo.clone().into());
        }
    }
    cfg.insert("discovery".into(), toml::Value::Table(discovery.clone()));
    let path = dir.join("updater.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();

    let bin = paths::updater_bin().expect("kvroute-updater (./dev build)");
    let out =
        std::process::Command::new(bin).arg("--config").arg(&path).arg("--check").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "--check refused the example with discovery:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resolved: toml::Table = toml::from_str(&stdout).unwrap();
    let got = resolved["discovery"].as_table().expect("no [discovery] resolved");
    assert_eq!(got, &discovery, "--check resolved another [discovery]");
    let workers = resolved.get("workers").and_then(toml::Value::as_array);
    assert!(workers.is_none_or(|w| w.is_empty()), "the resolved configuration lists workers");
    let _ = std::fs::remove_dir_all(&dir);
}
