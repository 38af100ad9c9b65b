//! The Kubernetes examples under `deploy/k8s/` (Istio, Envoy Gateway, the updater, the OCI
//! image of the module): every manifest parses; the fields that must agree do (ports, routing
//! header, token Secret, cluster names, worker lists, images, vm_ids, updater flags against
//! `kvroute-updater --help`); every embedded filter config passes kvroute-core's parser and
//! `validate()`; and the embedded Envoy config (bootstrap fragments, cluster/listener/filter
//! patches) passes `envoy --mode validate` inside a complete bootstrap with the real module.
//! No cluster runs here: what Istio and Envoy Gateway do with these objects is not tested.

#[path = "deploy_k8s/checks.rs"]
mod checks;
#[path = "deploy_k8s/envoy_assembly.rs"]
mod envoy_assembly;
#[path = "deploy_k8s/manifests.rs"]
mod manifests;
#[path = "deploy_k8s/singleton.rs"]
mod singleton;

use std::time::Duration;

use kvroute_integration::paths;
use manifests::{help_flags, Doc};
use serde_json::{json, Value};

fn docs() -> Vec<Doc> {
    manifests::load_dir(&paths::repo_root().join("deploy/k8s")).expect("loading deploy/k8s")
}

fn updater_help_flags() -> Vec<String> {
    let bin = paths::updater_bin().expect("kvroute-updater (./dev build)");
    let out =
        std::process::Command::new(bin).arg("--help").output().expect("kvroute-updater --help");
    assert!(out.status.success(), "kvroute-updater --help failed");
    let flags = help_flags(&String::from_utf8_lossy(&out.stdout));
    assert!(flags.iter().any(|f| f == "worker"), "--help lists no --worker: {flags:?}");
    flags
}

fn server_rs() -> String {
    std::fs::read_to_string(paths::repo_root().join("updater/src/server.rs")).expect("server.rs")
}

#[test]
fn every_manifest_parses_and_the_fields_agree() {
    let docs = docs();
    checks::check_all(&docs, &updater_help_flags(), &server_rs()).unwrap();
}

#[test]
fn stats_tags_match_the_reference_bootstrap() {
    let template = std::fs::read_to_string(paths::repo_root().join("envoy/kvroute.yaml")).unwrap();
    let vars = ["ADMIN_PORT", "LISTEN_PORT", "UPDATER_PORT", "WASM_PATH", "KVROUTE_CONFIG"]
        .map(|k| (k, "1".to_owned()));
    let mut vars = vars.to_vec();
    vars.push(("ENDPOINTS", "[]".to_owned()));
    let text = kvroute_integration::envoy::render(&template, &vars).unwrap();
    let reference: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let reference = serde_json::to_value(reference).unwrap();
    let want = reference.pointer("/stats_config/stats_tags").expect("reference stats tags");
    for (fragment, _, _) in singleton::singletons(&docs()).unwrap() {
        assert_eq!(fragment.pointer("/stats_config/stats_tags"), Some(want), "stats tags differ");
    }
}

#[test]
fn the_wasm_image_holds_the_built_module_as_plugin_wasm() {
    let root = paths::repo_root();
    let text = std::fs::read_to_string(root.join("deploy/k8s/wasm-image/Dockerfile")).unwrap();
    let steps: Vec<&str> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    // The module as cargo builds it (paths::wasm_path's default), and that directory as the
    // build context the comment tells users to pass.
    let context = "target/wasm32-wasip1/release";
    let file = "kvroute_filter.wasm";
    let default = root.join(context).join(file).canonicalize();
    if std::env::var_os("KVROUTE_WASM").is_none() {
        let built = paths::wasm_path().expect("the filter module (./dev build)");
        assert_eq!(default.ok(), Some(built), "the module is not built at {context}/{file}");
    }
    assert_eq!(steps, ["FROM scratch".to_owned(), format!("COPY {file} /plugin.wasm")]);
    assert!(text.contains(&format!(" {context}\n")), "build context is not {context}");
}

/// Each mutation breaks one agreement; the checks must name it.
#[test]
fn a_disagreeing_field_is_caught() {
    let help = updater_help_flags();
    let server = server_rs();
    let base = docs();
    checks::check_all(&base, &help, &server).expect("the committed manifests agree");
    type Mutation = (&'static str, &'static str, &'static str, Value);
    let mutations: [Mutation; 10] = [
        ("Service", "kvroute-updater", "/spec/ports/0/port", json!(9101)),
        ("NetworkPolicy", "kvroute-updater", "/spec/ingress/0/ports/0/port", json!(9101)),
        ("WasmPlugin", "kvroute", "/spec/pluginConfig/destination_header", json!("x-other")),
        ("WasmPlugin", "kvroute", "/spec/pluginConfig/models/0/workers/0", json!("10.9.9.9:8000")),
        ("WasmPlugin", "kvroute", "/spec/failStrategy", json!("FAIL_CLOSE")),
        (
            "EnvoyProxy",
            "kvroute-proxy",
            "/spec/provider/kubernetes/envoyDeployment/container/env/0/valueFrom/secretKeyRef/name",
            json!("other"),
        ),
        ("EnvoyExtensionPolicy", "kvroute", "/metadata/name", json!("renamed")),
        (
            "Deployment",
            "kvroute-updater",
            "/spec/template/spec/containers/0/args/0",
            json!("--no-such-flag=1"),
        ),
        (
            "EnvoyFilter",
            "kvroute",
            "/spec/configPatches/0/patch/value/static_resources/clusters/0/name",
            json!("other"),
        ),
        (
            "Deployment",
            "kvroute-updater",
            "/spec/template/spec/volumes/0/secret/secretName",
            json!("other"),
        ),
    ];
    for (kind, name, ptr, value) in mutations {
        let mut docs = base.clone();
        let d = docs.iter_mut().find(|d| d.kind == kind && d.name == name).unwrap();
        *d.body.pointer_mut(ptr).unwrap_or_else(|| panic!("{kind} {name}: no {ptr}")) = value;
        if ptr == "/metadata/name" {
            d.name = d.body.pointer(ptr).and_then(Value::as_str).unwrap().to_owned();
        }
        let r = checks::check_all(&docs, &help, &server);
        assert!(r.is_err(), "changing {kind} {name} {ptr} went unnoticed");
    }
}

#[tokio::test]
async fn embedded_envoy_config_validates_with_the_module() {
    let docs = docs();
    let wasm = paths::wasm_path().expect("the filter module (./dev build)");
    let dir = paths::scratch_dir("deploy-k8s").unwrap();
    for (name, bootstrap) in envoy_assembly::bootstraps(&docs, &wasm).unwrap() {
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&bootstrap).unwrap()).unwrap();
        let out = tokio::process::Command::new(paths::envoy_bin().expect("envoy (./dev setup)"))
            .args(["--mode", "validate", "--log-level", "info", "-c"])
            .arg(&path)
            .env(checks::TOKEN_ENV, checks::TEST_TOKEN)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(120), out).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: envoy --mode validate failed ({path:?}):\n{text}");
        assert!(text.contains("kvroute: configured"), "{name}: the filter did not load:\n{text}");
    }
}
