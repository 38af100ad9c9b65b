//! The cross-checks over the parsed manifests: each returns an error naming the first field that
//! disagrees with another manifest or with the code's defaults.

use anyhow::{anyhow, ensure, Context};
use kvroute_core::decision::config::FilterConfig;
use serde_json::Value;

use crate::deploy_k8s::manifests::{
    at, by_field, find, flags, only, port_of, quantity_bytes, str_at, u64_at, Doc,
};
use crate::deploy_k8s::singleton::{singleton, singletons};

/// The environment variable the Envoy side reads the token from.
pub const TOKEN_ENV: &str = "KVROUTE_UPDATER_TOKEN";
/// The token the checks give the singleton configs (any 16+ characters).
pub const TEST_TOKEN: &str = "deploy-k8s-test-token-0123456789";

/// Every kind a manifest may have; a new kind needs its checks here first.
const KINDS: [&str; 18] = [
    "Namespace",
    "Deployment",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "ConfigMap",
    "EnvoyFilter",
    "Gateway",
    "VirtualService",
    "GatewayClass",
    "HTTPRoute",
    "EnvoyProxy",
    "EnvoyExtensionPolicy",
    "EnvoyPatchPolicy",
    "BackendTrafficPolicy",
    "ClientTrafficPolicy",
];

/// Everything, in order; `help` is `kvroute-updater --help`.
pub fn check_all(docs: &[Doc], help_flags: &[String], server_rs: &str) -> anyhow::Result<()> {
    for d in docs {
        ensure!(
            KINDS.contains(&d.kind.as_str()),
            "{}: unexpected kind {}",
            d.file.display(),
            d.kind
        );
    }
    let cfgs = filter_configs(docs)?;
    let header = &FilterConfig::default().destination_header;
    for (what, c) in &cfgs {
        ensure!(&c.destination_header == header, "{what}: destination_header is not {header}");
    }
    routing_header(docs, header)?;
    fail_open(docs)?;
    updater_flags(docs, help_flags)?;
    crate::deploy_k8s::discovery::check(docs, &cfgs)?;
    updater_port(docs)?;
    token(docs)?;
    hardening(docs, server_rs)?;
    selectors(docs)?;
    let max_body = cfgs.iter().map(|(_, c)| c.max_body_bytes as u64).max().unwrap_or(0);
    buffer_limits(docs, max_body)?;
    for (fragment, vm_id, proxy) in singletons(docs)? {
        singleton(docs, &fragment, &vm_id, &proxy)?;
    }
    Ok(())
}

/// Every embedded filter configuration, parsed and validated by kvroute-core.
pub fn filter_configs(docs: &[Doc]) -> anyhow::Result<Vec<(String, FilterConfig)>> {
    let mut out = Vec::new();
    let w = istio_wasm_filter(docs)?;
    let text = w
        .pointer("/typed_config/config/configuration/value")
        .and_then(Value::as_str)
        .context("EnvoyFilter kvroute: the wasm filter has no StringValue configuration")?;
    out.push((
        "EnvoyFilter kvroute (wasm filter)".to_owned(),
        parse_cfg(&serde_json::from_str(text)?)?,
    ));
    for d in docs.iter().filter(|d| d.kind == "EnvoyExtensionPolicy") {
        let wasms = at(d, "/spec/wasm")?.as_array().context("spec.wasm is not a list")?;
        for (i, w) in wasms.iter().enumerate() {
            let cfg =
                w.get("config").ok_or_else(|| anyhow!("{}: wasm[{i}] has no config", d.name))?;
            out.push((format!("EnvoyExtensionPolicy {} wasm[{i}]", d.name), parse_cfg(cfg)?));
        }
    }
    ensure!(out.len() >= 2, "expected the Istio and the Envoy Gateway filter configs");
    Ok(out)
}

fn parse_cfg(v: &Value) -> anyhow::Result<FilterConfig> {
    Ok(FilterConfig::from_json(&serde_json::to_vec(v)?)?)
}

/// The value of the EnvoyFilter's one patch applying to `apply_to` whose value is named `name`
/// (any name when `None`).
pub fn envoy_filter_patch<'a>(
    docs: &'a [Doc],
    apply_to: &str,
    name: Option<&str>,
) -> anyhow::Result<&'a Value> {
    let ef = find(docs, "EnvoyFilter", "kvroute")?;
    let mut it = at(ef, "/spec/configPatches")?.as_array().into_iter().flatten().filter(|p| {
        p.get("applyTo").and_then(Value::as_str) == Some(apply_to)
            && name
                .is_none_or(|n| p.pointer("/patch/value/name").and_then(Value::as_str) == Some(n))
    });
    let p =
        it.next().ok_or_else(|| anyhow!("EnvoyFilter kvroute: no {apply_to} patch {name:?}"))?;
    ensure!(it.next().is_none(), "EnvoyFilter kvroute: two {apply_to} patches {name:?}");
    p.pointer("/patch/value").ok_or_else(|| anyhow!("the {apply_to} patch has no value"))
}

/// The wasm HTTP filter the EnvoyFilter inserts (the one whose typed_config is a Wasm).
pub fn istio_wasm_filter(docs: &[Doc]) -> anyhow::Result<&Value> {
    let ef = find(docs, "EnvoyFilter", "kvroute")?;
    let wasm = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
    let mut it = at(ef, "/spec/configPatches")?.as_array().into_iter().flatten().filter(|p| {
        p.get("applyTo").and_then(Value::as_str) == Some("HTTP_FILTER")
            && p.pointer("/patch/value/typed_config/@type").and_then(Value::as_str) == Some(wasm)
    });
    let p = it.next().context("EnvoyFilter kvroute inserts no wasm HTTP filter")?;
    ensure!(it.next().is_none(), "EnvoyFilter kvroute inserts two wasm HTTP filters");
    p.pointer("/patch/value").context("the wasm patch has no value")
}

/// The header the native strip filter removes (Istio) is in this list.
fn strip_filter(docs: &[Doc]) -> anyhow::Result<&Value> {
    envoy_filter_patch(docs, "HTTP_FILTER", Some("kvroute.strip_routing_headers"))
}

fn override_host_header(lb: &Value) -> anyhow::Result<&str> {
    lb.pointer("/policies/0/typed_extension_config/typed_config/override_host_sources/0/header")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("load_balancing_policy is not override_host with a header source"))
}

/// The header the filter sets is the one override_host reads and the one stripped from clients.
fn routing_header(docs: &[Doc], header: &str) -> anyhow::Result<()> {
    let cluster = envoy_filter_patch(docs, "CLUSTER", None)?;
    let lb =
        cluster.get("load_balancing_policy").context("CLUSTER patch: no load_balancing_policy")?;
    ensure!(
        override_host_header(lb)? == header,
        "Istio CLUSTER patch: override_host reads another header"
    );
    let removes = strip_filter(docs)?
        .pointer("/typed_config/mutations/request_mutations")
        .context("HTTP_FILTER patch")?;
    ensure!(
        by_field(removes, "remove", header).is_ok(),
        "Istio HTTP_FILTER patch does not strip {header}"
    );
    let btp = find(docs, "BackendTrafficPolicy", "kvroute-override-host")?;
    let from = at(btp, "/spec/loadBalancer/endpointOverride/extractFrom")?;
    ensure!(
        by_field(from, "header", header).is_ok(),
        "BackendTrafficPolicy: endpointOverride does not read {header}"
    );
    let ctp = find(docs, "ClientTrafficPolicy", "kvroute-strip-routing-header")?;
    let removed = at(ctp, "/spec/headers/earlyRequestHeaders/remove")?;
    ensure!(
        removed.as_array().is_some_and(|r| r.iter().any(|h| h == header)),
        "ClientTrafficPolicy does not strip {header}"
    );
    Ok(())
}

/// A failed kvroute VM never fails requests for good (docs/operations.md, "Fail-safe"): Istio's
/// filter is reloaded (FAIL_RELOAD, as the shipped bootstraps), Envoy Gateway's (whose policy
/// offers only `failOpen`) fails open; and Envoy honours the filter's pause.
fn fail_open(docs: &[Doc]) -> anyhow::Result<()> {
    let c = istio_wasm_filter(docs)?.pointer("/typed_config/config").context("wasm config")?;
    ensure!(
        c.get("failure_policy") == Some(&Value::from("FAIL_RELOAD"))
            && c.pointer("/reload_config/backoff/base_interval").is_some(),
        "EnvoyFilter kvroute: the wasm filter's failure_policy is not FAIL_RELOAD with a backoff"
    );
    ensure!(
        c.get("allow_on_headers_stop_iteration") == Some(&Value::Bool(true)),
        "EnvoyFilter kvroute: the wasm filter lacks allow_on_headers_stop_iteration: true"
    );
    let eep = only(docs, "EnvoyExtensionPolicy")?;
    for w in at(eep, "/spec/wasm")?.as_array().into_iter().flatten() {
        ensure!(
            w.get("failOpen") == Some(&Value::Bool(true)),
            "EnvoyExtensionPolicy: failOpen is not true"
        );
    }
    Ok(())
}

/// The updater Deployment's container.
pub fn updater_container(docs: &[Doc]) -> anyhow::Result<(&Doc, &Value)> {
    let d = find(docs, "Deployment", "kvroute-updater")?;
    let c = by_field(at(d, "/spec/template/spec/containers")?, "name", "updater")?;
    Ok((d, c))
}

pub fn updater_args(docs: &[Doc]) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let (_, c) = updater_container(docs)?;
    let args: Vec<String> =
        serde_json::from_value(c.get("args").cloned().context("updater: no args")?)?;
    flags(&args)
}

pub fn flag_values(args: &[(String, Option<String>)], name: &str) -> Vec<String> {
    args.iter().filter(|(k, _)| k == name).filter_map(|(_, v)| v.clone()).collect()
}

/// Every flag the manifests pass the updater exists in its `--help`.
fn updater_flags(docs: &[Doc], help_flags: &[String]) -> anyhow::Result<()> {
    let (_, c) = updater_container(docs)?;
    ensure!(c.pointer("/command/0").and_then(Value::as_str) == Some("kvroute-updater"));
    for (k, _) in updater_args(docs)? {
        ensure!(help_flags.contains(&k), "updater flag --{k} is not in `kvroute-updater --help`");
    }
    Ok(())
}

/// The updater's listen port = its container port = the Service's target = the NetworkPolicy's
/// ingress port; the Service port = the port of every `kvroute_updater` bootstrap cluster.
fn updater_port(docs: &[Doc]) -> anyhow::Result<()> {
    let listen = flag_values(&updater_args(docs)?, "listen");
    let listen =
        port_of(listen.first().context("the updater has no --listen (default is loopback)")?)?;
    let (_, c) = updater_container(docs)?;
    let cport = by_field(c.get("ports").context("updater: no ports")?, "name", "http")?;
    ensure!(
        cport.get("containerPort").and_then(Value::as_u64) == Some(listen.into()),
        "containerPort != --listen"
    );
    let svc = find(docs, "Service", "kvroute-updater")?;
    let sp = by_field(at(svc, "/spec/ports")?, "name", "http")?;
    let target = sp.get("targetPort").context("Service: no targetPort")?;
    ensure!(
        target == "http" || target.as_u64() == Some(listen.into()),
        "Service targetPort is not the updater's"
    );
    let svc_port = sp.get("port").and_then(Value::as_u64).context("Service: no port")?;
    let np = find(docs, "NetworkPolicy", "kvroute-updater")?;
    let np_port = u64_at(np, "/spec/ingress/0/ports/0/port")?;
    ensure!(
        np_port == u64::from(listen),
        "NetworkPolicy ingress port {np_port} != --listen {listen}"
    );
    let host = format!("{}.{}.svc.cluster.local", svc.name, svc.namespace);
    for (fragment, _, _) in singletons(docs)? {
        let cl = by_field(
            fragment.pointer("/static_resources/clusters").context("no clusters")?,
            "name",
            "kvroute_updater",
        )?;
        let sa = cl
            .pointer("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
            .context("kvroute_updater: no socket_address")?;
        ensure!(
            sa.get("address").and_then(Value::as_str) == Some(&host),
            "kvroute_updater does not point at {host}"
        );
        ensure!(
            sa.get("port_value").and_then(Value::as_u64) == Some(svc_port),
            "kvroute_updater port != Service port"
        );
    }
    Ok(())
}

/// The Secret (name, key) an env entry `name` reads, from a container.
pub fn secret_env(c: &Value, name: &str) -> anyhow::Result<(String, String)> {
    let e = by_field(c.get("env").context("container has no env")?, "name", name)?;
    let r = e.pointer("/valueFrom/secretKeyRef").context("env entry is not from a Secret")?;
    let s = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_owned).context("secretKeyRef");
    Ok((s("name")?, s("key")?))
}

/// The updater and every gateway proxy read the same Secret key.
fn token(docs: &[Doc]) -> anyhow::Result<()> {
    let (d, c) = updater_container(docs)?;
    let args = updater_args(docs)?;
    let used = match flag_values(&args, "token-file").first() {
        Some(path) => {
            let (dir, file) = path.rsplit_once('/').context("--token-file is not a path")?;
            let m = by_field(c.get("volumeMounts").context("no volumeMounts")?, "mountPath", dir)?;
            let vol = str_or(m, "name")?;
            let v = by_field(at(d, "/spec/template/spec/volumes")?, "name", vol)?;
            let secret = v
                .pointer("/secret/secretName")
                .and_then(Value::as_str)
                .context("token volume is not a Secret")?;
            (secret.to_owned(), file.to_owned())
        }
        None => secret_env(c, TOKEN_ENV)?,
    };
    for (what, proxy) in proxies(docs)? {
        let theirs = secret_env(&proxy, TOKEN_ENV).with_context(|| what.clone())?;
        ensure!(
            theirs == used,
            "{what} reads the token from {theirs:?}, the updater from {used:?}"
        );
    }
    Ok(())
}

pub fn str_or<'a>(v: &'a Value, k: &str) -> anyhow::Result<&'a str> {
    v.get(k).and_then(Value::as_str).ok_or_else(|| anyhow!("no {k}"))
}

/// The gateway proxy containers: Istio's injected istio-proxy and Envoy Gateway's envoy.
pub fn proxies(docs: &[Doc]) -> anyhow::Result<Vec<(String, Value)>> {
    let gw = find(docs, "Deployment", "kvroute-gateway")?;
    let istio = by_field(at(gw, "/spec/template/spec/containers")?, "name", "istio-proxy")?.clone();
    let ep = find(docs, "EnvoyProxy", "kvroute-proxy")?;
    let eg = at(ep, "/spec/provider/kubernetes/envoyDeployment/container")?.clone();
    Ok(vec![("Istio gateway".into(), istio), ("EnvoyProxy".into(), eg)])
}

fn hardening(docs: &[Doc], server_rs: &str) -> anyhow::Result<()> {
    let (d, c) = updater_container(docs)?;
    let t = |v: Option<&Value>, what: &str| -> anyhow::Result<()> {
        ensure!(v == Some(&Value::Bool(true)), "updater: {what} is not true");
        Ok(())
    };
    t(d.body.pointer("/spec/template/spec/securityContext/runAsNonRoot"), "runAsNonRoot")?;
    t(c.pointer("/securityContext/readOnlyRootFilesystem"), "readOnlyRootFilesystem")?;
    let no_esc = c.pointer("/securityContext/allowPrivilegeEscalation");
    ensure!(no_esc == Some(&Value::Bool(false)), "updater: allowPrivilegeEscalation is not false");
    ensure!(
        c.pointer("/resources/requests/cpu").is_some()
            && c.pointer("/resources/limits/memory").is_some()
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        let path =
            c.pointer(&format!("/{probe}/httpGet/path")).and_then(Value::as_str).context(probe)?;
        ensure!(
            server_rs.contains(&format!(".route(\"{path}\"")),
            "{probe}: the updater serves no {path}"
        );
        ensure!(
            c.pointer(&format!("/{probe}/httpGet/port")) == Some(&Value::from("http")),
            "{probe} port"
        );
    }
    Ok(())
}

/// The NetworkPolicy selects the updater's pods and lets the Istio gateway's pods in.
fn selectors(docs: &[Doc]) -> anyhow::Result<()> {
    let np = find(docs, "NetworkPolicy", "kvroute-updater")?;
    let (d, _) = updater_container(docs)?;
    let labels = at(d, "/spec/template/metadata/labels")?;
    subset(at(np, "/spec/podSelector/matchLabels")?, labels)
        .context("NetworkPolicy podSelector")?;
    let gw = find(docs, "Deployment", "kvroute-gateway")?;
    let gw_labels = at(gw, "/spec/template/metadata/labels")?;
    let from = at(np, "/spec/ingress/0/from")?.as_array().context("ingress.from")?;
    let istio_ok = from.iter().any(|f| {
        f.get("namespaceSelector").is_none()
            && f.pointer("/podSelector/matchLabels").is_some_and(|m| subset(m, gw_labels).is_ok())
    });
    ensure!(
        istio_ok && np.namespace == gw.namespace,
        "NetworkPolicy does not admit the Istio gateway pods"
    );
    Ok(())
}

pub fn subset(sel: &Value, labels: &Value) -> anyhow::Result<()> {
    for (k, v) in sel.as_object().context("selector is not a map")? {
        ensure!(labels.get(k) == Some(v), "label {k}={v} not on the pods");
    }
    Ok(())
}

/// Connection buffer limits hold the largest body the filters accept.
fn buffer_limits(docs: &[Doc], max_body: u64) -> anyhow::Result<()> {
    let l = envoy_filter_patch(docs, "LISTENER", None)?;
    let istio = l
        .get("per_connection_buffer_limit_bytes")
        .and_then(Value::as_u64)
        .context("LISTENER patch")?;
    ensure!(istio >= max_body, "Istio listener buffer {istio} < max_body_bytes {max_body}");
    let ctp = find(docs, "ClientTrafficPolicy", "kvroute-strip-routing-header")?;
    let eg = quantity_bytes(str_at(ctp, "/spec/connection/bufferLimit")?)?;
    ensure!(eg >= max_body, "Envoy Gateway bufferLimit {eg} < max_body_bytes {max_body}");
    Ok(())
}
