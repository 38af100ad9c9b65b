//! The Kubernetes examples under `deploy/k8s/` (Istio, Envoy Gateway, the updater, the OCI
//! image of the module): every manifest parses; the fields that must agree do (ports, routing
//! header, token Secret, cluster names, worker ports, images, vm_ids, updater flags against
//! `kvroute-updater --help`, the updater's discovery with its RBAC and NetworkPolicy, and
//! `kvroute-updater --check` on its flags); every embedded filter config passes kvroute-core's
//! parser and `validate()`. Then what each control plane gives the gateway's Envoy for them:
//! fixtures of istiod's and Envoy Gateway's output for these objects (derived from their
//! sources at a pinned release, cited in each file), checked against the manifests, with the
//! EnvoyFilter and EnvoyPatchPolicy applied the way the control planes apply them; and real
//! Envoy running that configuration with the built module, simulated workers and
//! kvroute-updater. No cluster runs here: the fixtures are the assumption, stated and cited.

#[path = "deploy_k8s/checks.rs"]
mod checks;
#[path = "deploy_k8s/discovery.rs"]
mod discovery;
#[path = "deploy_k8s/jsonpatch.rs"]
mod jsonpatch;
#[path = "deploy_k8s/live.rs"]
mod live;
#[path = "deploy_k8s/manifests.rs"]
mod manifests;
#[path = "deploy_k8s/singleton.rs"]
mod singleton;
#[path = "deploy_k8s/xds.rs"]
mod xds;

use kvroute_stack::paths;
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

/// The fixtures describe what the control planes generate for these manifests, and with the
/// patch objects applied the result has everything kvroute needs.
#[test]
fn the_control_planes_configurations_have_what_kvroute_needs() {
    for x in xds::both(&docs()).unwrap() {
        let f = xds::wasm_filter(&x.listener).unwrap();
        eprintln!("{}: {}", x.name, serde_json::to_string(f).unwrap());
    }
}

#[test]
fn stats_tags_match_the_reference_bootstrap() {
    let template = std::fs::read_to_string(paths::repo_root().join("envoy/kvroute.yaml")).unwrap();
    let vars = ["ADMIN_PORT", "LISTEN_PORT", "UPDATER_PORT", "WASM_PATH", "KVROUTE_CONFIG"]
        .map(|k| (k, "1".to_owned()));
    let mut vars = vars.to_vec();
    vars.push(("ENDPOINTS", "[]".to_owned()));
    let text = kvroute_stack::envoy::render(&template, &vars).unwrap();
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

/// The manifests' checks and the control planes' configurations built from them.
fn verify(docs: &[Doc], help: &[String], server: &str) -> anyhow::Result<()> {
    checks::check_all(docs, help, server)?;
    xds::both(docs)?;
    Ok(())
}

fn doc_mut<'a>(docs: &'a mut [Doc], kind: &str, name: &str) -> &'a mut Value {
    &mut docs.iter_mut().find(|d| d.kind == kind && d.name == name).unwrap().body
}

fn set(docs: &mut [Doc], kind: &str, name: &str, ptr: &str, v: Value) {
    *doc_mut(docs, kind, name)
        .pointer_mut(ptr)
        .unwrap_or_else(|| panic!("{kind} {name}: no {ptr}")) = v;
}

/// The Secret the Envoy Gateway proxies read the token from, for the mutations.
const EG_TOKEN_SECRET: &str =
    "/spec/provider/kubernetes/envoyDeployment/container/env/0/valueFrom/secretKeyRef/name";

/// The EnvoyFilter patch inserting the wasm filter, for the mutations.
const WASM_PATCH: &str = "/spec/configPatches/1/patch/value/typed_config/config";

/// Each mutation breaks one agreement, or breaks what a control plane would give Envoy; the
/// checks must fail.
#[test]
fn a_disagreeing_field_is_caught() {
    let help = updater_help_flags();
    let server = server_rs();
    let base = docs();
    verify(&base, &help, &server).expect("the committed manifests agree");
    type Mutate = Box<dyn Fn(&mut Vec<Doc>)>;
    type Mutation = (&'static str, Mutate);
    let filter_cfg = |edit: fn(&mut Value)| -> Mutate {
        Box::new(move |d: &mut Vec<Doc>| {
            let ptr = format!("{WASM_PATCH}/configuration/value");
            let text = doc_mut(d, "EnvoyFilter", "kvroute")
                .pointer(&ptr)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned();
            let mut cfg: Value = serde_json::from_str(&text).unwrap();
            edit(&mut cfg);
            set(d, "EnvoyFilter", "kvroute", &ptr, cfg.to_string().into());
        })
    };
    let mutations: Vec<Mutation> = vec![
        (
            "updater Service port",
            Box::new(|d| set(d, "Service", "kvroute-updater", "/spec/ports/0/port", json!(9101))),
        ),
        (
            "NetworkPolicy port",
            Box::new(|d| {
                set(
                    d,
                    "NetworkPolicy",
                    "kvroute-updater",
                    "/spec/ingress/0/ports/0/port",
                    json!(9101),
                )
            }),
        ),
        ("Istio filter header", filter_cfg(|c| c["destination_header"] = json!("x-other"))),
        (
            "Istio filter worker port",
            filter_cfg(|c| c["models"][0]["workers"][0] = json!("10.0.1.11:8001")),
        ),
        (
            "Istio fail policy",
            Box::new(|d| {
                set(
                    d,
                    "EnvoyFilter",
                    "kvroute",
                    &format!("{WASM_PATCH}/failure_policy"),
                    json!("FAIL_CLOSED"),
                )
            }),
        ),
        (
            "Istio stop iteration",
            Box::new(|d| {
                doc_mut(d, "EnvoyFilter", "kvroute")
                    .pointer_mut(WASM_PATCH)
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove("allow_on_headers_stop_iteration");
            }),
        ),
        (
            "Istio vm_id",
            Box::new(|d| {
                set(
                    d,
                    "EnvoyFilter",
                    "kvroute",
                    &format!("{WASM_PATCH}/vm_config/vm_id"),
                    json!("other"),
                )
            }),
        ),
        (
            "Istio wasm before a missing filter",
            Box::new(|d| {
                set(
                    d,
                    "EnvoyFilter",
                    "kvroute",
                    "/spec/configPatches/1/match/listener/filterChain/filter/subFilter/name",
                    json!("envoy.filters.http.nope"),
                )
            }),
        ),
        (
            "Istio cluster patch port",
            Box::new(|d| {
                set(
                    d,
                    "EnvoyFilter",
                    "kvroute",
                    "/spec/configPatches/2/match/cluster/portNumber",
                    json!(8001),
                )
            }),
        ),
        (
            "Istio listener port",
            Box::new(|d| {
                set(
                    d,
                    "EnvoyFilter",
                    "kvroute",
                    "/spec/configPatches/0/match/listener/portNumber",
                    json!(80),
                )
            }),
        ),
        (
            "Istio BOOTSTRAP patch",
            Box::new(|d| {
                let ps = doc_mut(d, "EnvoyFilter", "kvroute")
                    .pointer_mut("/spec/configPatches")
                    .unwrap()
                    .as_array_mut()
                    .unwrap();
                ps.push(
                    json!({"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {}}}),
                );
            }),
        ),
        (
            "Istio bootstrap override annotation",
            Box::new(|d| {
                doc_mut(d, "Deployment", "kvroute-gateway")
                    .pointer_mut("/spec/template/metadata/annotations")
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove("sidecar.istio.io/bootstrapOverride");
            }),
        ),
        (
            "Istio singleton cluster",
            Box::new(|d| {
                let ptr = "/data/custom_bootstrap.json";
                let text = doc_mut(d, "ConfigMap", "kvroute-bootstrap")
                    .pointer(ptr)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .replace("name: kvroute_updater", "name: other");
                set(d, "ConfigMap", "kvroute-bootstrap", ptr, text.into());
            }),
        ),
        (
            "VirtualService timeout 0s",
            Box::new(|d| {
                doc_mut(d, "VirtualService", "inference")["spec"]["http"][0]["timeout"] =
                    json!("0s")
            }),
        ),
        (
            "EnvoyProxy token Secret",
            Box::new(|d| set(d, "EnvoyProxy", "kvroute-proxy", EG_TOKEN_SECRET, json!("other"))),
        ),
        (
            "EnvoyExtensionPolicy renamed",
            Box::new(|d| {
                let doc = d.iter_mut().find(|d| d.kind == "EnvoyExtensionPolicy").unwrap();
                doc.name = "renamed".into();
                doc.body["metadata"]["name"] = json!("renamed");
            }),
        ),
        (
            "EnvoyPatchPolicy filter name",
            Box::new(|d| {
                let ptr = "/spec/jsonPatches/0/operation/jsonPath";
                let p = doc_mut(d, "EnvoyPatchPolicy", "kvroute-stop-iteration")
                    .pointer(ptr)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .replace("wasm/0", "wasm/1");
                set(d, "EnvoyPatchPolicy", "kvroute-stop-iteration", ptr, p.into());
            }),
        ),
        (
            "EnvoyPatchPolicy listener",
            Box::new(|d| {
                set(
                    d,
                    "EnvoyPatchPolicy",
                    "kvroute-stop-iteration",
                    "/spec/jsonPatches/0/name",
                    json!("inference/inference-gateway/https"),
                )
            }),
        ),
        (
            "BackendTrafficPolicy header",
            Box::new(|d| {
                set(
                    d,
                    "BackendTrafficPolicy",
                    "kvroute-override-host",
                    "/spec/loadBalancer/endpointOverride/extractFrom/0/header",
                    json!("x-other"),
                )
            }),
        ),
        (
            "EnvoyExtensionPolicy fail open",
            Box::new(|d| {
                set(d, "EnvoyExtensionPolicy", "kvroute", "/spec/wasm/0/failOpen", json!(false))
            }),
        ),
        (
            "updater flag",
            Box::new(|d| {
                set(
                    d,
                    "Deployment",
                    "kvroute-updater",
                    "/spec/template/spec/containers/0/args/0",
                    json!("--no-such-flag=1"),
                )
            }),
        ),
        (
            "updater token Secret",
            Box::new(|d| {
                set(
                    d,
                    "Deployment",
                    "kvroute-updater",
                    "/spec/template/spec/volumes/0/secret/secretName",
                    json!("other"),
                )
            }),
        ),
        ("no Namespace", Box::new(|d| d.retain(|d| d.kind != "Namespace"))),
    ];
    for (what, mutate) in mutations {
        let mut docs = base.clone();
        mutate(&mut docs);
        let r = verify(&docs, &help, &server);
        assert!(r.is_err(), "{what}: the change went unnoticed");
        eprintln!("{what}: {:#}", r.unwrap_err());
    }
}

/// What istiod gives the gateway's Envoy for the Istio manifests, run by real Envoy.
#[tokio::test]
async fn istio_configuration_routes_with_kvroute_in_real_envoy() {
    let x = xds::istio(&docs()).unwrap();
    xds::kvroute_requirements(&x).unwrap();
    live::run(&x).await.unwrap();
}

/// What Envoy Gateway gives its proxies for the Envoy Gateway manifests, run by real Envoy.
#[tokio::test]
async fn envoy_gateway_configuration_routes_with_kvroute_in_real_envoy() {
    let x = xds::envoy_gateway(&docs()).unwrap();
    xds::kvroute_requirements(&x).unwrap();
    live::run(&x).await.unwrap();
}

/// The Istio configuration with the filter as a `WasmPlugin` alone would give it (no
/// `allow_on_headers_stop_iteration`): every POST still completes, counted, and named.
#[tokio::test]
async fn istio_without_stop_iteration_never_hangs_a_post() {
    let x = xds::istio(&docs()).unwrap();
    live::run_without_stop_iteration(&x).await.unwrap();
}

/// The same for Envoy Gateway without the EnvoyPatchPolicy (an `EnvoyExtensionPolicy` alone).
#[tokio::test]
async fn envoy_gateway_without_stop_iteration_never_hangs_a_post() {
    let x = xds::envoy_gateway(&docs()).unwrap();
    live::run_without_stop_iteration(&x).await.unwrap();
}
