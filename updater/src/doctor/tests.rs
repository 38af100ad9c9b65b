use serde_json::json;

use super::*;

/// A config dump shaped as Envoy 1.40 writes it for `envoy/kvroute.yaml`: a static listener
/// with the wasm filter, the singleton in the bootstrap, the updater and workers clusters.
fn dump(stop_iteration: bool, singleton_vm: &str, override_header: &str) -> Value {
    let filter_config = json!({"models": [{"name": "m", "workers": ["127.0.0.1:8001"]}]});
    let mut plugin = json!({
        "name": "kvroute", "root_id": "kvroute",
        "vm_config": {"vm_id": "kvroute", "runtime": "envoy.wasm.runtime.v8"},
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                          "value": filter_config.to_string()},
        "failure_policy": "FAIL_OPEN"
    });
    if stop_iteration {
        plugin["allow_on_headers_stop_iteration"] = json!(true);
    }
    let sync = json!({"snapshot_sync": {"cluster": "kvroute_updater", "token_env": "T"}});
    json!({"configs": [
        {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump", "bootstrap": {
            "bootstrap_extensions": [{"name": "envoy.bootstrap.wasm", "typed_config": {
                "@type": WASM_SERVICE, "singleton": true, "config": {
                    "vm_config": {"vm_id": singleton_vm},
                    "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                      "value": sync.to_string()}}}}]}},
        {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump", "static_clusters": [
            {"cluster": {"@type": CLUSTER, "name": "kvroute_updater"}},
            {"cluster": {"@type": CLUSTER, "name": "workers", "load_balancing_policy": {
                "policies": [{"typed_extension_config": {
                    "name": "envoy.load_balancing_policies.override_host",
                    "typed_config": {"@type": OVERRIDE_HOST,
                        "override_host_sources": [{"header": override_header}]}}}]}}}]},
        {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump", "static_listeners": [
            {"listener": {"name": "l", "filter_chains": [{"filters": [{"typed_config": {
                "http_filters": [
                    {"name": "envoy.filters.http.wasm",
                     "typed_config": {"@type": WASM_FILTER, "config": plugin}},
                    {"name": "envoy.filters.http.router"}]}}]}]}}]}
    ]})
}

const STATS: &str = "wasmcustom.kvroute.misdeployed.body_not_delivered.present: 0\n\
                     wasmcustom.kvroute.misdeployed.no_knowledge.present: 0\n\
                     wasmcustom.kvroute.misdeployed.override_ignored.present: 0\n\
                     wasmcustom.kvroute.sync.snapshot_version: 42\n\
                     server.concurrency: 2\n\
                     wasmcustom.kvroute.threads.bundled: 2\n\
                     wasmcustom.kvroute.threads.ready: 2\n";

fn inputs(dump: Value, stats: &str) -> Inputs {
    Inputs {
        config_dump: Some(dump),
        stats: Some(stats.into()),
        server_info: Some(json!({"version": "abc/1.40.0/Clean/RELEASE/BoringSSL"})),
        updater_status: Some(json!({"workers": {"127.0.0.1:8001":
            {"connected": true, "compatible": true, "member": true}}})),
        updater_asked: true,
    }
}

fn problems(f: &[Finding]) -> Vec<&str> {
    f.iter().filter(|f| !f.ok).map(|f| f.text.as_str()).collect()
}

#[test]
fn a_complete_deployment_has_no_problem() {
    let f = diagnose(&inputs(dump(true, "kvroute", DEFAULT_HEADER), STATS));
    assert!(problems(&f).is_empty(), "{f:#?}");
    assert!(f.iter().any(|f| f.text.contains("snapshot version 42")));
    assert!(f.iter().any(|f| f.ok && f.text.contains("ready: all 2 worker threads")));
}

#[test]
fn threads_without_bundle_or_knowledge_are_not_ready() {
    let with = |bundled: u32, ready: u32| {
        let stats = STATS
            .replace("threads.bundled: 2", &format!("threads.bundled: {bundled}"))
            .replace("threads.ready: 2", &format!("threads.ready: {ready}"));
        let f = diagnose(&inputs(dump(true, "kvroute", DEFAULT_HEADER), &stats));
        problems(&f).into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let p = with(1, 1);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(p[0].contains("1 of 2 worker threads have every model's bundle"), "{p:#?}");
    let p = with(2, 0);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(p[0].contains("0 of 2 worker threads have the updater's knowledge"), "{p:#?}");
}

#[test]
fn each_missing_piece_is_named_in_one_line() {
    let one = |i: Inputs, needle: &str| {
        let f = diagnose(&i);
        let p = problems(&f);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].contains(needle), "{:?} lacks {needle}", p[0]);
    };
    one(inputs(dump(false, "kvroute", DEFAULT_HEADER), STATS), "allow_on_headers_stop_iteration");
    one(inputs(dump(true, "", DEFAULT_HEADER), STATS), "vm_id");
    one(inputs(dump(true, "kvroute", "x-other"), STATS), "override_host");
    let mut no_singleton = dump(true, "kvroute", DEFAULT_HEADER);
    no_singleton["configs"][0]["bootstrap"] = json!({});
    one(inputs(no_singleton, STATS), "no snapshot singleton");
    let mut no_cluster = dump(true, "kvroute", DEFAULT_HEADER);
    no_cluster["configs"][1]["static_clusters"][0]["cluster"]["name"] = json!("other");
    one(inputs(no_cluster, STATS), "does not have");
    let old = Inputs {
        server_info: Some(json!({"version": "abc/1.34.1/Clean/RELEASE/BoringSSL"})),
        ..inputs(dump(true, "kvroute", DEFAULT_HEADER), STATS)
    };
    one(old, "older than 1.36");
    let reported = STATS.replace("no_knowledge.present: 0", "no_knowledge.present: 1");
    one(inputs(dump(true, "kvroute", DEFAULT_HEADER), &reported), "no_knowledge");
    let unsynced = STATS.replace("snapshot_version: 42", "snapshot_version: 0");
    one(inputs(dump(true, "kvroute", DEFAULT_HEADER), &unsynced), "no snapshot yet");
    let mut bad_worker = inputs(dump(true, "kvroute", DEFAULT_HEADER), STATS);
    bad_worker.updater_status = Some(json!({"workers": {"127.0.0.1:8001":
        {"connected": false, "compatible": true, "member": true}}}));
    one(bad_worker, "not connected");
}

#[test]
fn no_filter_at_all_and_unreadable_sources_are_problems() {
    let f = diagnose(&Inputs { updater_asked: true, ..Default::default() });
    assert_eq!(problems(&f).len(), 3, "{f:#?}");
    let mut no_filter = dump(true, "kvroute", DEFAULT_HEADER);
    no_filter["configs"][2] = json!({});
    let f = diagnose(&inputs(no_filter, STATS));
    assert!(problems(&f)[0].contains("no kvroute HTTP filter"), "{f:#?}");
}

#[test]
fn a_filter_from_ecds_counts() {
    // Istio's WasmPlugin puts the filter in an ECDS entry, not in the listener.
    let mut d = dump(true, "kvroute", DEFAULT_HEADER);
    let filter = d["configs"][2]["static_listeners"][0]["listener"]["filter_chains"][0]["filters"]
        [0]["typed_config"]["http_filters"][0]["typed_config"]
        .clone();
    d["configs"][2] = json!({"@type": "type.googleapis.com/envoy.admin.v3.EcdsConfigDump",
        "ecds_filters": [{"ecds_filter": {"name": "kvroute", "typed_config": filter}}]});
    assert!(problems(&diagnose(&inputs(d, STATS))).is_empty());
}
