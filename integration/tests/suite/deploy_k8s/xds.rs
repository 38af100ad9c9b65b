//! The Envoy configuration each control plane gives the gateway's Envoy for the manifests under
//! `deploy/k8s/`: the fixtures under `fixtures/` (what istiod and Envoy Gateway generate for our
//! Gateway, routes and policies, derived from their sources at a pinned release and cited at the
//! top of each file), checked against the manifests' values, with the patch objects (Istio's
//! EnvoyFilter, Envoy Gateway's EnvoyPatchPolicy) applied the way the control planes apply them,
//! and the bootstrap additions (Istio's custom bootstrap ConfigMap, the EnvoyProxy's Merge) kept
//! apart: Envoy merges them itself (`--config-yaml`).
//!
//! A manifest change that the fixtures no longer describe (a renamed policy, another port, a
//! patch that selects nothing) fails here with the field that disagrees.

use std::path::PathBuf;

use anyhow::{anyhow, bail, ensure, Context};
use kvroute_core::decision::config::FilterConfig;
use kvroute_stack::paths;
use serde_json::Value;

use crate::deploy_k8s::jsonpatch::{apply_operation, merge};
use crate::deploy_k8s::manifests::{at, by_field, find, only, quantity_bytes, str_at, Doc};

/// What one gateway's Envoy runs: its bootstrap (`-c`), the bootstrap addition Envoy merges
/// (`--config-yaml`), and the xDS resources for the kvroute route.
#[derive(Debug, Clone)]
pub struct Xds {
    pub name: &'static str,
    pub bootstrap: Value,
    pub addition: Value,
    pub listener: Value,
    pub route: Value,
    pub cluster: Value,
}

fn fixture(path: &str) -> anyhow::Result<Value> {
    let p: PathBuf =
        paths::repo_root().join("integration/tests/suite/deploy_k8s/fixtures").join(path);
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let y: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("{}: not YAML", p.display()))?;
    Ok(serde_json::to_value(y)?)
}

fn yaml(text: &str) -> anyhow::Result<Value> {
    let y: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)?;
    Ok(serde_json::to_value(y)?)
}

/// The HTTP connection manager's config in a listener (its only network filter).
pub fn hcm(listener: &Value) -> anyhow::Result<&Value> {
    let chains: Vec<&Value> = listener
        .get("filter_chains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .chain(listener.get("default_filter_chain"))
        .collect();
    let mut found =
        chains.iter().flat_map(|c| c.get("filters").and_then(Value::as_array)).flatten();
    let f = found
        .find(|f| {
            f.get("name") == Some(&Value::from("envoy.filters.network.http_connection_manager"))
        })
        .context("the listener has no http_connection_manager")?;
    f.get("typed_config").context("HCM without typed_config")
}

pub fn hcm_mut(listener: &mut Value) -> anyhow::Result<&mut Value> {
    let name = "envoy.filters.network.http_connection_manager";
    let chain = if listener.get("default_filter_chain").is_some() {
        listener.get_mut("default_filter_chain")
    } else {
        listener.pointer_mut("/filter_chains/0")
    }
    .context("no filter chain")?;
    let filters = chain.get_mut("filters").and_then(Value::as_array_mut).context("filters")?;
    let f = filters.iter_mut().find(|f| f["name"] == name).context("no HCM")?;
    f.get_mut("typed_config").context("HCM without typed_config")
}

fn http_filters(listener: &mut Value) -> anyhow::Result<&mut Vec<Value>> {
    hcm_mut(listener)?.get_mut("http_filters").and_then(Value::as_array_mut).context("http_filters")
}

fn listener_port(listener: &Value) -> Option<u64> {
    listener.pointer("/address/socket_address/port_value").and_then(Value::as_u64)
}

const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// The wasm HTTP filter of a listener (exactly one).
pub fn wasm_filter(listener: &Value) -> anyhow::Result<&Value> {
    let filters =
        hcm(listener)?.get("http_filters").and_then(Value::as_array).context("filters")?;
    let mut w =
        filters.iter().filter(|f| f.pointer("/typed_config/@type") == Some(&WASM_TYPE.into()));
    let f = w.next().context("no wasm HTTP filter")?;
    ensure!(w.next().is_none(), "two wasm HTTP filters");
    Ok(f)
}

/// The filter configuration JSON a wasm filter carries (a StringValue, as both control planes
/// and the reference bootstrap write it).
pub fn filter_config_json(filter: &Value) -> anyhow::Result<Value> {
    let c = filter.pointer("/typed_config/config/configuration").context("no configuration")?;
    ensure!(
        c.get("@type") == Some(&"type.googleapis.com/google.protobuf.StringValue".into()),
        "the configuration is not a StringValue"
    );
    let text = c.get("value").and_then(Value::as_str).context("configuration value")?;
    serde_json::from_str(text).context("the filter configuration is not JSON")
}

// ---------------------------------------------------------------------------------------------
// Istio

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The gateway's Envoy under Istio: the fixtures with the EnvoyFilter's patches applied, and the
/// custom bootstrap the pods' annotation names.
pub fn istio(docs: &[Doc]) -> anyhow::Result<Xds> {
    let bootstrap = fixture("istio/bootstrap.yaml")?;
    let mut listener = fixture("istio/listener.yaml")?;
    let route = fixture("istio/route.yaml")?;
    let mut cluster = fixture("istio/cluster.yaml")?;

    let gw = find(docs, "Deployment", "kvroute-gateway")?;
    let pod_labels = at(gw, "/spec/template/metadata/labels")?;
    let annotations = at(gw, "/spec/template/metadata/annotations")?;
    ensure!(
        annotations.get("inject.istio.io/templates") == Some(&"gateway".into()),
        "the gateway pods are not injected with Istio's gateway template"
    );
    let cm_name = annotations
        .get("sidecar.istio.io/bootstrapOverride")
        .and_then(Value::as_str)
        .context("the gateway pods have no sidecar.istio.io/bootstrapOverride annotation")?;
    let cm = find(docs, "ConfigMap", cm_name)
        .with_context(|| format!("the bootstrap override names ConfigMap {cm_name}"))?;
    ensure!(cm.namespace == gw.namespace, "the bootstrap ConfigMap is not in the pods' namespace");
    let addition = yaml(str_at(cm, "/data/custom_bootstrap.json").context(
        "the injector mounts the key custom_bootstrap.json (ISTIO_BOOTSTRAP_OVERRIDE points at it)",
    )?)?;

    // The Gateway server and the VirtualService the fixtures were generated for.
    let g = find(docs, "Gateway", "kvroute-gateway")?;
    ensure!(
        labels_match(at(g, "/spec/selector")?, pod_labels),
        "the Gateway selects no gateway pod"
    );
    let server = at(g, "/spec/servers/0")?;
    ensure!(
        server.pointer("/port/protocol") == Some(&"HTTP".into())
            && server.pointer("/port/number").and_then(Value::as_u64) == listener_port(&listener),
        "fixtures/istio/listener.yaml is for an HTTP server on port {:?}: update it",
        listener_port(&listener)
    );
    let vs = find(docs, "VirtualService", "inference")?;
    ensure!(
        at(vs, "/spec/gateways")?.as_array().is_some_and(|a| a.contains(&g.name.clone().into())),
        "the VirtualService is not bound to the Gateway"
    );
    let http = at(vs, "/spec/http/0")?;
    if let Some(t) = http.get("timeout") {
        let t = t.as_str().unwrap_or("");
        ensure!(
            t != "0s" && !t.is_empty(),
            "VirtualService timeout {t:?}: the CRD requires >= 1ms"
        );
    }
    let dest = http.pointer("/route/0/destination").context("VirtualService destination")?;
    let host = dest.get("host").and_then(Value::as_str).context("destination host")?;
    let port = dest.pointer("/port/number").and_then(Value::as_u64).context("destination port")?;
    let want = format!("outbound|{port}||{host}");
    let want_v = Value::from(want.clone());
    ensure!(
        cluster.get("name") == Some(&want_v)
            && route.pointer("/virtual_hosts/0/routes/0/route/cluster") == Some(&want_v),
        "fixtures/istio/{{cluster,route}}.yaml are for another destination than {want}: update them"
    );
    ensure!(
        hcm(&listener)?.pointer("/rds/route_config_name") == route.get("name"),
        "the fixture listener's RDS name is not the fixture route's"
    );

    let ef = find(docs, "EnvoyFilter", "kvroute")?;
    ensure!(
        labels_match(at(ef, "/spec/workloadSelector/labels")?, pod_labels),
        "the EnvoyFilter selects no gateway pod"
    );
    let patches = at(ef, "/spec/configPatches")?.as_array().context("configPatches")?;
    for (i, p) in patches.iter().enumerate() {
        envoy_filter_patch(p, &mut listener, &mut cluster)
            .with_context(|| format!("EnvoyFilter kvroute, configPatches[{i}]"))?;
    }
    Ok(Xds { name: "istio", bootstrap, addition, listener, route, cluster })
}

/// One EnvoyFilter patch, as istiod applies it to the gateway's listener and cluster (Istio
/// 1.30.3 pilot/pkg/networking/core/envoyfilter/{listener_patch.go,cluster_patch.go}); a patch
/// that matches nothing is an error here (istiod skips it silently).
fn envoy_filter_patch(p: &Value, listener: &mut Value, cluster: &mut Value) -> anyhow::Result<()> {
    let apply_to = p.get("applyTo").and_then(Value::as_str).context("applyTo")?;
    let op = p.pointer("/patch/operation").and_then(Value::as_str).context("operation")?;
    let value = p.pointer("/patch/value").context("patch value")?;
    let m = p.get("match").cloned().unwrap_or(Value::Null);
    if let Some(ctx) = m.get("context").and_then(Value::as_str) {
        ensure!(matches!(ctx, "GATEWAY" | "ANY"), "context {ctx} never matches a gateway");
    }
    let port_ok = |l: &Value| match m.pointer("/listener/portNumber").and_then(Value::as_u64) {
        Some(n) => listener_port(l) == Some(n),
        None => true,
    };
    match apply_to {
        "HTTP_FILTER" => {
            ensure!(port_ok(listener), "its listener portNumber matches no gateway listener");
            let want = m.pointer("/listener/filterChain/filter/name").and_then(Value::as_str);
            ensure!(
                want == Some("envoy.filters.network.http_connection_manager"),
                "HTTP_FILTER patches must match the http_connection_manager"
            );
            let sub =
                m.pointer("/listener/filterChain/filter/subFilter/name").and_then(Value::as_str);
            let filters = http_filters(listener)?;
            let pos = |filters: &Vec<Value>| -> anyhow::Result<usize> {
                let s = sub.context("INSERT_BEFORE/AFTER needs a subFilter")?;
                filters
                    .iter()
                    .position(|f| f["name"] == s)
                    .ok_or_else(|| anyhow!("no HTTP filter {s}"))
            };
            match op {
                "INSERT_FIRST" => filters.insert(0, value.clone()),
                "INSERT_BEFORE" => {
                    let i = pos(filters)?;
                    filters.insert(i, value.clone());
                }
                "INSERT_AFTER" => {
                    let i = pos(filters)?;
                    filters.insert(i + 1, value.clone());
                }
                other => bail!("operation {other} is not emulated for HTTP_FILTER"),
            }
        }
        "CLUSTER" => {
            let svc =
                m.pointer("/cluster/service").and_then(Value::as_str).context("cluster.service")?;
            let port =
                m.pointer("/cluster/portNumber").and_then(Value::as_u64).context("portNumber")?;
            let name = format!("outbound|{port}||{svc}");
            ensure!(
                cluster["name"] == name,
                "it matches cluster {name}, which the route does not use"
            );
            ensure!(op == "MERGE", "operation {op} is not emulated for CLUSTER");
            merge(cluster, value);
        }
        "LISTENER" => {
            ensure!(port_ok(listener), "its portNumber matches no gateway listener");
            ensure!(op == "MERGE", "operation {op} is not emulated for LISTENER");
            merge(listener, value);
        }
        "BOOTSTRAP" => {
            bail!("BOOTSTRAP patches are not applied since Istio 1.21 (no bootstrap discovery)")
        }
        other => bail!("applyTo {other} is not emulated"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Envoy Gateway

/// Envoy Gateway's name for a policy's wasm extension (its VM id, and after
/// "envoy.filters.http.wasm/" its HTTP filter's name): envoyextensionpolicy/<ns>/<name>/wasm/<i>
/// (v1.9.0 internal/gatewayapi/envoyextensionpolicy.go irConfigNameForWasm, helpers.go
/// irConfigName).
pub fn eg_wasm_name(eep: &Doc, index: usize) -> String {
    format!("envoyextensionpolicy/{}/{}/wasm/{index}", eep.namespace, eep.name)
}

fn target_is(d: &Doc, kind: &str, name: &str) -> anyhow::Result<()> {
    let refs = match d.body.pointer("/spec/targetRefs") {
        Some(r) => r.as_array().cloned().unwrap_or_default(),
        None => vec![at(d, "/spec/targetRef")?.clone()],
    };
    ensure!(
        refs.iter()
            .any(|r| r.get("kind") == Some(&kind.into()) && r.get("name") == Some(&name.into())),
        "{} {} does not target {kind} {name}",
        d.kind,
        d.name
    );
    Ok(())
}

/// The gateway's Envoy under Envoy Gateway: the fixtures (checked against the policies they were
/// generated for) with the EnvoyPatchPolicy applied, and the EnvoyProxy's bootstrap Merge.
pub fn envoy_gateway(docs: &[Doc]) -> anyhow::Result<Xds> {
    let bootstrap = fixture("envoy-gateway/bootstrap.yaml")?;
    let mut listener = fixture("envoy-gateway/listener.yaml")?;
    let route = fixture("envoy-gateway/route.yaml")?;
    let cluster = fixture("envoy-gateway/cluster.yaml")?;

    let ep = find(docs, "EnvoyProxy", "kvroute-proxy")?;
    ensure!(
        str_at(ep, "/spec/bootstrap/type")? == "Merge",
        "the EnvoyProxy bootstrap is not a Merge"
    );
    let addition = yaml(str_at(ep, "/spec/bootstrap/value")?)?;
    let gc = find(docs, "GatewayClass", "kvroute")?;
    ensure!(
        gc.body.pointer("/spec/parametersRef/name") == Some(&ep.name.clone().into()),
        "the GatewayClass does not use the EnvoyProxy"
    );

    // The Gateway listener and the route.
    let g = find(docs, "Gateway", "inference-gateway")?;
    ensure!(at(g, "/spec/gatewayClassName")? == &Value::from(gc.name.clone()));
    let l = at(g, "/spec/listeners/0")?;
    let lname = l.get("name").and_then(Value::as_str).context("listener name")?;
    let lport = l.get("port").and_then(Value::as_u64).context("listener port")?;
    let want = format!("{}/{}/{lname}", g.namespace, g.name);
    ensure!(
        listener["name"] == want,
        "fixtures/envoy-gateway/listener.yaml is not for {want}: update it"
    );
    // Envoy Gateway maps privileged ports up by 10000 (80 -> 10080).
    let mapped = if lport < 1024 { lport + 10000 } else { lport };
    ensure!(
        listener_port(&listener) == Some(mapped),
        "the fixture listener is not on port {mapped}"
    );
    let hr = find(docs, "HTTPRoute", "inference")?;
    ensure!(at(hr, "/spec/parentRefs/0/name")? == &Value::from(g.name.clone()));
    let cname = format!("httproute/{}/{}/rule/0", hr.namespace, hr.name);
    ensure!(
        cluster["name"] == cname
            && route.pointer("/virtual_hosts/0/routes/0/route/cluster")
                == Some(&cname.clone().into()),
        "fixtures/envoy-gateway/{{cluster,route}}.yaml are not for {cname}: update them"
    );
    if let Some(t) = hr.body.pointer("/spec/rules/0/timeouts/request") {
        ensure!(
            route.pointer("/virtual_hosts/0/routes/0/route/timeout") == Some(t),
            "the fixture route's timeout is not the HTTPRoute's {t}"
        );
    }

    // The EnvoyExtensionPolicy's filter, as Envoy Gateway writes it.
    let eep = only(docs, "EnvoyExtensionPolicy")?;
    target_is(eep, "HTTPRoute", &hr.name)?;
    let w = at(eep, "/spec/wasm/0")?;
    let vm = eg_wasm_name(eep, 0);
    let fname = format!("envoy.filters.http.wasm/{vm}");
    let f = wasm_filter(&listener)?;
    ensure!(f["name"] == fname, "the fixture's wasm filter is not named {fname}: update it");
    let c = &f["typed_config"]["config"];
    // Envoy Gateway's wasmConfig (v1.9.0 wasm.go) writes fail_open and neither of these:
    // allow_on_headers_stop_iteration can only come from the EnvoyPatchPolicy.
    ensure!(
        c.get("allow_on_headers_stop_iteration").is_none() && c.get("failure_policy").is_none(),
        "fixtures/envoy-gateway/listener.yaml has fields Envoy Gateway does not write"
    );
    ensure!(
        c.pointer("/vm_config/vm_id") == Some(&vm.clone().into()),
        "the fixture's vm_id is not {vm}"
    );
    let wname = w.get("name").and_then(Value::as_str).unwrap_or(&vm);
    ensure!(c["name"] == wname, "the fixture's plugin name is not the policy's wasm name {wname}");
    ensure!(
        c.get("root_id") == w.get("rootID"),
        "the fixture's root_id is not the policy's rootID"
    );
    ensure!(
        c.get("fail_open").and_then(Value::as_bool).unwrap_or(false)
            == w.get("failOpen").and_then(Value::as_bool).unwrap_or(false),
        "the fixture's fail_open is not the policy's failOpen"
    );
    ensure!(
        Some(&filter_config_json(f)?) == w.get("config"),
        "the fixture's filter configuration is not the EnvoyExtensionPolicy's config: update it"
    );
    ensure!(
        route
            .pointer("/virtual_hosts/0/routes/0/typed_per_filter_config")
            .and_then(|t| t.get(&fname))
            .is_some(),
        "the fixture route does not enable {fname}"
    );

    // BackendTrafficPolicy: endpointOverride -> override_host, its type -> the fallback.
    let btp = find(docs, "BackendTrafficPolicy", "kvroute-override-host")?;
    target_is(btp, "HTTPRoute", &hr.name)?;
    let headers: Vec<&Value> = at(btp, "/spec/loadBalancer/endpointOverride/extractFrom")?
        .as_array()
        .context("extractFrom")?
        .iter()
        .filter_map(|e| e.get("header"))
        .collect();
    let sources: Vec<&Value> = override_host(&cluster)?
        .get("override_host_sources")
        .and_then(Value::as_array)
        .context("override_host_sources")?
        .iter()
        .filter_map(|s| s.get("header"))
        .collect();
    ensure!(
        headers == sources,
        "the fixture cluster's override_host sources are not the BackendTrafficPolicy's headers"
    );
    let fallback = match str_at(btp, "/spec/loadBalancer/type")? {
        "RoundRobin" => "envoy.load_balancing_policies.round_robin",
        "LeastRequest" => "envoy.load_balancing_policies.least_request",
        "Random" => "envoy.load_balancing_policies.random",
        other => bail!("fallback type {other} is not in the fixture"),
    };
    ensure!(
        override_host(&cluster)?.pointer("/fallback_policy/policies/0/typed_extension_config/name")
            == Some(&fallback.into()),
        "the fixture's override_host fallback is not {fallback}"
    );

    // ClientTrafficPolicy: early header removal and the buffer limit.
    let ctp = find(docs, "ClientTrafficPolicy", "kvroute-strip-routing-header")?;
    target_is(ctp, "Gateway", &g.name)?;
    let removed =
        at(ctp, "/spec/headers/earlyRequestHeaders/remove")?.as_array().context("remove")?;
    let early: Vec<Value> = hcm(&listener)?
        .pointer("/early_header_mutation_extensions/0/typed_config/mutations")
        .and_then(Value::as_array)
        .context("the fixture has no early header mutation")?
        .iter()
        .filter_map(|m| m.get("remove").cloned())
        .collect();
    ensure!(
        &early == removed,
        "the fixture's early header removals are not the ClientTrafficPolicy's"
    );
    let limit = quantity_bytes(str_at(ctp, "/spec/connection/bufferLimit")?)?;
    ensure!(
        listener.get("per_connection_buffer_limit_bytes").and_then(Value::as_u64) == Some(limit),
        "the fixture listener's buffer limit is not the ClientTrafficPolicy's {limit}"
    );

    // The EnvoyPatchPolicies, applied in priority order to the resources they name.
    let mut epps: Vec<&Doc> = docs.iter().filter(|d| d.kind == "EnvoyPatchPolicy").collect();
    epps.sort_by_key(|d| d.body.pointer("/spec/priority").and_then(Value::as_i64).unwrap_or(0));
    for epp in epps {
        target_is(epp, "Gateway", &g.name)?;
        ensure!(
            epp.namespace == g.namespace,
            "EnvoyPatchPolicy {} is not in the Gateway's namespace",
            epp.name
        );
        for (i, p) in at(epp, "/spec/jsonPatches")?.as_array().into_iter().flatten().enumerate() {
            let what = format!("EnvoyPatchPolicy {} jsonPatches[{i}]", epp.name);
            let ty = p.get("type").and_then(Value::as_str).context("type")?;
            let name = p.get("name").and_then(Value::as_str).context("name")?;
            let target = match ty {
                "type.googleapis.com/envoy.config.listener.v3.Listener" => &mut listener,
                other => bail!("{what}: patches of {other} are not emulated"),
            };
            ensure!(
                target["name"] == name,
                "{what}: no {ty} named {name} (the listener is {})",
                target["name"]
            );
            apply_operation(target, p.get("operation").context("operation")?)
                .with_context(|| what.clone())?;
        }
    }
    Ok(Xds { name: "envoy-gateway", bootstrap, addition, listener, route, cluster })
}

/// The override_host policy of a cluster's load_balancing_policy (its first policy).
pub fn override_host(cluster: &Value) -> anyhow::Result<&Value> {
    let p = cluster
        .pointer("/load_balancing_policy/policies/0/typed_extension_config")
        .context("the cluster has no load_balancing_policy")?;
    ensure!(
        p.get("name") == Some(&"envoy.load_balancing_policies.override_host".into()),
        "the cluster's first load balancing policy is not override_host"
    );
    p.get("typed_config").context("override_host without typed_config")
}

// ---------------------------------------------------------------------------------------------
// What kvroute needs from the result, whichever control plane made it.

/// kvroute's requirements on a gateway's Envoy configuration.
pub fn kvroute_requirements(x: &Xds) -> anyhow::Result<()> {
    let n = x.name;
    let f = wasm_filter(&x.listener).with_context(|| n.to_owned())?;
    let c = &f["typed_config"]["config"];
    ensure!(
        c.get("allow_on_headers_stop_iteration") == Some(&Value::Bool(true)),
        "{n}: the wasm filter lacks allow_on_headers_stop_iteration: true (requests stall)"
    );
    ensure!(
        c.get("failure_policy") == Some(&"FAIL_RELOAD".into())
            || c.get("failure_policy") == Some(&"FAIL_OPEN".into())
            || c.get("fail_open") == Some(&Value::Bool(true)),
        "{n}: a failed wasm VM would fail requests (neither reloaded nor failing open)"
    );
    let cfg_json = filter_config_json(f)?;
    let cfg = FilterConfig::from_json(&serde_json::to_vec(&cfg_json)?)
        .with_context(|| format!("{n}: filter config"))?;
    // The filter runs on the route: enabled on the HCM, or enabled by the route when disabled.
    let name = f.get("name").and_then(Value::as_str).context("filter name")?;
    if f.get("disabled") == Some(&Value::Bool(true)) {
        let r = x
            .route
            .pointer("/virtual_hosts/0/routes/0/typed_per_filter_config")
            .and_then(|t| t.get(name));
        ensure!(r.is_some(), "{n}: the wasm filter is disabled and the route does not enable it");
    }
    let filters =
        hcm(&x.listener)?.get("http_filters").and_then(Value::as_array).context("filters")?;
    ensure!(
        filters.last().map(|f| &f["name"]) == Some(&"envoy.filters.http.router".into()),
        "{n}: the router is not the last HTTP filter"
    );
    // Client copies of the routing header go before any filter.
    let header = cfg.destination_header.clone();
    let early = hcm(&x.listener)?
        .pointer("/early_header_mutation_extensions/0/typed_config/mutations")
        .and_then(Value::as_array)
        .is_some_and(|m| m.iter().any(|m| m.get("remove") == Some(&header.clone().into())));
    let first =
        filters.first().and_then(|f| f.pointer("/typed_config/mutations/request_mutations"));
    let first = first
        .and_then(Value::as_array)
        .is_some_and(|m| m.iter().any(|m| m.get("remove") == Some(&header.clone().into())));
    ensure!(early || first, "{n}: client copies of {header} are not removed before the filters");
    // The route's cluster balances by the filter's header.
    ensure!(
        x.route.pointer("/virtual_hosts/0/routes/0/route/cluster") == x.cluster.get("name"),
        "{n}: the route does not use the cluster"
    );
    let sources = override_host(&x.cluster)?.get("override_host_sources").and_then(Value::as_array);
    ensure!(
        sources.and_then(|s| s.first()).and_then(|s| s.get("header"))
            == Some(&header.clone().into()),
        "{n}: override_host does not read {header}"
    );
    let limit = x
        .listener
        .get("per_connection_buffer_limit_bytes")
        .and_then(Value::as_u64)
        .unwrap_or(1 << 20);
    ensure!(
        limit >= cfg.max_body_bytes as u64,
        "{n}: the listener's buffer limit is below max_body_bytes"
    );
    // The singleton, merged into the bootstrap, shares the filter's VM id.
    let ext = by_field(
        x.addition.get("bootstrap_extensions").context("no bootstrap_extensions")?,
        "name",
        "envoy.bootstrap.wasm",
    )?;
    let vm_id = c.pointer("/vm_config/vm_id").and_then(Value::as_str).unwrap_or("");
    let theirs =
        ext.pointer("/typed_config/config/vm_config/vm_id").and_then(Value::as_str).unwrap_or("");
    ensure!(theirs == vm_id, "{n}: the singleton's vm_id '{theirs}' is not the filter's '{vm_id}'");
    ensure!(
        x.bootstrap
            .get("bootstrap_extensions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .all(|e| e.get("name") != Some(&"envoy.bootstrap.wasm".into())),
        "{n}: the generated bootstrap already has a wasm service"
    );
    Ok(())
}

/// Both control planes' configurations, checked.
pub fn both(docs: &[Doc]) -> anyhow::Result<Vec<Xds>> {
    let out = vec![istio(docs)?, envoy_gateway(docs)?];
    for x in &out {
        kvroute_requirements(x)?;
    }
    // The kvroute_updater cluster's port is the Service's (checked in checks.rs); every
    // namespace the fixtures' values come from exists (the Namespace manifest).
    let ns =
        docs.iter().filter(|d| d.kind == "Namespace").map(|d| d.name.clone()).collect::<Vec<_>>();
    for d in
        docs.iter().filter(|d| !d.namespace.is_empty() && d.namespace != "envoy-gateway-system")
    {
        ensure!(
            ns.contains(&d.namespace),
            "{} {}: no Namespace manifest creates {}",
            d.kind,
            d.name,
            d.namespace
        );
    }
    Ok(out)
}
