//! Complete Envoy bootstraps around the Envoy config the manifests embed, shaped as Istio and
//! Envoy Gateway would generate them (a listener with the kvroute filter as the control plane
//! writes it, the workers' cluster with the control plane's own lb_policy), so that
//! `envoy --mode validate` checks every fragment, patch and filter config with the real module.
//! The shape of what the control planes generate is this file's assumption, not tested here.

use std::path::Path;

use anyhow::{ensure, Context};
use serde_json::{json, Value};

use crate::manifests::{at, by_field, find, quantity_bytes, str_at, Doc};
use crate::singleton;

/// (name, bootstrap) for Istio and for Envoy Gateway.
pub fn bootstraps(docs: &[Doc], wasm: &Path) -> anyhow::Result<Vec<(String, Value)>> {
    let wasm = wasm.to_str().context("module path is not UTF-8")?;
    let singles = singleton::singletons(docs)?;
    let mut out = Vec::new();

    // Istio: the WasmPlugin's filter after the HTTP_FILTER patch's (INSERT_FIRST), the
    // CLUSTER and LISTENER patches merged into the generated objects, the BOOTSTRAP patch
    // merged into the bootstrap.
    let wp = find(docs, "WasmPlugin", "kvroute")?;
    let ef = find(docs, "EnvoyFilter", "kvroute")?;
    let patch = |apply_to: &str| -> anyhow::Result<Value> {
        let p = by_field(at(ef, "/spec/configPatches")?, "applyTo", apply_to)?;
        p.pointer("/patch/value").cloned().context("patch without value")
    };
    let filter = wasm_filter(
        &format!("{}.{}", wp.namespace, wp.name),
        "",
        str_at(wp, "/spec/pluginName")?,
        at(wp, "/spec/pluginConfig")?,
        str_at(wp, "/spec/failStrategy")? == "FAIL_OPEN",
        wasm,
    );
    let mut istio_listener = listener(vec![patch("HTTP_FILTER")?, filter], None);
    merge(&mut istio_listener, &patch("LISTENER")?);
    let mut workers = workers_cluster(at(wp, "/spec/pluginConfig")?)?;
    merge(&mut workers, &patch("CLUSTER")?);
    out.push(("istio".to_owned(), assemble(istio_listener, workers, &singles[0].0, wasm)?));

    // Envoy Gateway: the EnvoyExtensionPolicy's filter, the ClientTrafficPolicy's early header
    // removal and buffer limit, the EnvoyPatchPolicy's JSON patch on the route's cluster, the
    // EnvoyProxy's Merge bootstrap.
    let eep = find(docs, "EnvoyExtensionPolicy", "kvroute")?;
    let w = at(eep, "/spec/wasm/0")?;
    let s = |k: &str| w.get(k).and_then(Value::as_str).context("EnvoyExtensionPolicy wasm field");
    let filter = wasm_filter(
        s("name")?,
        &singles[1].1,
        s("rootID")?,
        w.get("config").context("config")?,
        w.get("failOpen") == Some(&Value::Bool(true)),
        wasm,
    );
    let ctp = find(docs, "ClientTrafficPolicy", "kvroute-strip-routing-header")?;
    let removes: Vec<Value> = at(ctp, "/spec/headers/earlyRequestHeaders/remove")?
        .as_array()
        .context("remove")?
        .iter()
        .map(|h| json!({"remove": h}))
        .collect();
    let early = json!([{
        "name": "envoy.http.early_header_mutation.header_mutation",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
            "mutations": removes,
        }
    }]);
    let mut eg_listener = listener(vec![filter], Some(early));
    let limit = quantity_bytes(str_at(ctp, "/spec/connection/bufferLimit")?)?;
    merge(&mut eg_listener, &json!({"per_connection_buffer_limit_bytes": limit}));
    let mut workers = workers_cluster(w.get("config").context("config")?)?;
    let epp = find(docs, "EnvoyPatchPolicy", "kvroute-override-host")?;
    for op in at(epp, "/spec/jsonPatches")?.as_array().context("jsonPatches")? {
        ensure!(
            op.pointer("/operation/op") == Some(&json!("add")),
            "only 'add' patches are assembled"
        );
        let path = op.pointer("/operation/path").and_then(Value::as_str).context("path")?;
        let key =
            path.strip_prefix('/').filter(|k| !k.contains('/')).context("a top-level path")?;
        let value = op.pointer("/operation/value").context("value")?.clone();
        workers.as_object_mut().context("cluster")?.insert(key.to_owned(), value);
    }
    out.push(("envoy-gateway".to_owned(), assemble(eg_listener, workers, &singles[1].0, wasm)?));
    Ok(out)
}

fn wasm_filter(
    name: &str,
    vm_id: &str,
    root_id: &str,
    cfg: &Value,
    fail_open: bool,
    wasm: &str,
) -> Value {
    json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": root_id,
                "vm_config": {
                    "vm_id": vm_id,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": wasm}},
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": cfg.to_string(),
                },
                "failure_policy": if fail_open { "FAIL_OPEN" } else { "FAIL_CLOSED" },
            }
        }
    })
}

fn listener(mut filters: Vec<Value>, early: Option<Value>) -> Value {
    filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inference",
        "route_config": {"name": "inference", "virtual_hosts": [{
            "name": "inference", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "workers", "timeout": "0s"}}]
        }]},
        "http_filters": filters,
    });
    if let Some(e) = early {
        hcm["early_header_mutation_extensions"] = e;
    }
    json!({
        "name": "inference",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm
        }]}]
    })
}

/// The workers' cluster as a control plane writes it (its own lb_policy), with the filter
/// config's workers as endpoints.
fn workers_cluster(cfg: &Value) -> anyhow::Result<Value> {
    let mut eps = Vec::new();
    for m in cfg.get("models").and_then(Value::as_array).context("models")? {
        for w in m.get("workers").and_then(Value::as_array).context("workers")? {
            let a: std::net::SocketAddr = w.as_str().context("worker")?.parse()?;
            eps.push(json!({"endpoint": {"address": {"socket_address": {
                "address": a.ip().to_string(), "port_value": a.port()}}}}));
        }
    }
    Ok(json!({
        "name": "workers",
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": "workers", "endpoints": [{"lb_endpoints": eps}]}
    }))
}

fn assemble(
    listener: Value,
    workers: Value,
    fragment: &Value,
    wasm: &str,
) -> anyhow::Result<Value> {
    let mut b = json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": [listener], "clusters": [workers]},
    });
    let mut fragment = fragment.clone();
    // The singleton's module is a file in the mounted image; here, the locally built module.
    for ext in
        fragment.get_mut("bootstrap_extensions").and_then(Value::as_array_mut).into_iter().flatten()
    {
        if let Some(f) = ext.pointer_mut("/typed_config/config/vm_config/code/local/filename") {
            *f = Value::from(wasm);
        }
    }
    merge(&mut b, &fragment);
    Ok(b)
}

/// Protobuf-style merge: objects field by field, lists appended, scalars replaced.
fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (a, b) => *a = b.clone(),
    }
}
