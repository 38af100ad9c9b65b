//! `kvroute-doctor`: reads a running Envoy's admin (`/config_dump`, `/stats`, `/server_info`)
//! and, when given, the updater's `/status`, and says in plain words what of kvroute's
//! deployment is missing or broken. [`diagnose`] is pure (JSON and text in, findings out) so
//! each misdeployment is tested on the shapes Envoy really dumps; the binary only fetches.
//!
//! It looks through the whole config dump rather than at fixed paths: a filter may sit in a
//! static listener, an LDS listener or an ECDS entry (Istio's `WasmPlugin`), depending on
//! who configured Envoy.

use serde_json::Value;

const WASM_FILTER: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const WASM_SERVICE: &str = "type.googleapis.com/envoy.extensions.wasm.v3.WasmService";
const OVERRIDE_HOST: &str =
    "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The filter config's default `destination_header`.
const DEFAULT_HEADER: &str = "x-gateway-destination-endpoint";
/// `override_host` and `allow_on_headers_stop_iteration` came with 1.35, `remove_on_match`
/// (the header mutation that strips client copies by prefix) with 1.36.
const MIN_ENVOY: (u32, u32) = (1, 36);

/// One line of the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub ok: bool,
    pub text: String,
}

fn ok(text: impl Into<String>) -> Finding {
    Finding { ok: true, text: text.into() }
}

fn problem(text: impl Into<String>) -> Finding {
    Finding { ok: false, text: text.into() }
}

/// What was read; `None` where it could not be.
#[derive(Debug, Default)]
pub struct Inputs {
    pub config_dump: Option<Value>,
    /// `/stats` in Envoy's text form (`name: value` per line).
    pub stats: Option<String>,
    pub server_info: Option<Value>,
    pub updater_status: Option<Value>,
    /// Whether an updater address was given at all.
    pub updater_asked: bool,
}

/// Every object in `v`, depth first.
fn objects(v: &Value) -> Vec<&serde_json::Map<String, Value>> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                out.push(m);
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    out
}

fn typed<'a>(dump: &'a Value, ty: &str) -> Vec<&'a serde_json::Map<String, Value>> {
    objects(dump)
        .into_iter()
        .filter(|m| m.get("@type").and_then(Value::as_str) == Some(ty))
        .collect()
}

/// A plugin config's `configuration` (a `StringValue` or a bare string) parsed as JSON.
fn plugin_json(config: &Value) -> Option<Value> {
    let c = config.get("configuration")?;
    let text = c.get("value").and_then(Value::as_str).or_else(|| c.as_str())?;
    serde_json::from_str(text).ok()
}

fn vm_id(config: &Value) -> String {
    config.pointer("/vm_config/vm_id").and_then(Value::as_str).unwrap_or("").to_owned()
}

/// kvroute's HTTP filter as Envoy holds it.
struct FilterSeen {
    stop_iteration: bool,
    vm_id: String,
    header: String,
}

fn kvroute_filters(dump: &Value) -> Vec<FilterSeen> {
    typed(dump, WASM_FILTER)
        .into_iter()
        .filter_map(|m| {
            let config = m.get("config")?;
            let json = plugin_json(config)?;
            json.get("models")?;
            Some(FilterSeen {
                stop_iteration: config
                    .get("allow_on_headers_stop_iteration")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                vm_id: vm_id(config),
                header: json
                    .get("destination_header")
                    .and_then(Value::as_str)
                    .unwrap_or(DEFAULT_HEADER)
                    .to_owned(),
            })
        })
        .collect()
}

/// The snapshot singleton: its vm_id and the cluster it pulls from.
fn singletons(dump: &Value) -> Vec<(String, String)> {
    typed(dump, WASM_SERVICE)
        .into_iter()
        .filter_map(|m| {
            let config = m.get("config")?;
            let json = plugin_json(config)?;
            let cluster = json.pointer("/snapshot_sync/cluster")?.as_str()?.to_owned();
            Some((vm_id(config), cluster))
        })
        .collect()
}

fn cluster_names(dump: &Value) -> Vec<String> {
    typed(dump, CLUSTER)
        .into_iter()
        .filter_map(|m| m.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Headers some cluster's `override_host` policy reads.
fn override_headers(dump: &Value) -> Vec<String> {
    typed(dump, OVERRIDE_HOST)
        .into_iter()
        .flat_map(|m| {
            m.get("override_host_sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| s.get("header").and_then(Value::as_str).map(str::to_owned))
        })
        .collect()
}

/// `name: value` of Envoy's text `/stats`.
fn stat(stats: &str, name: &str) -> Option<u64> {
    stats.lines().find_map(|l| {
        let (n, v) = l.split_once(": ")?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `1.40.0` out of `/server_info`'s `version` (`<hash>/1.40.0/Clean/RELEASE/BoringSSL`).
fn envoy_version(info: &Value) -> Option<(u32, u32)> {
    let v = info.get("version")?.as_str()?;
    let semver = v.split('/').nth(1)?;
    let mut parts = semver.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn check_config(dump: &Value, out: &mut Vec<Finding>) {
    let filters = kvroute_filters(dump);
    let Some(filter) = filters.first() else {
        out.push(problem(
            "no kvroute HTTP filter in any listener: the wasm filter with kvroute's configuration \
             is not loaded (nothing is routed by kvroute)",
        ));
        return;
    };
    out.push(ok(format!("kvroute HTTP filter loaded (vm_id {:?})", filter.vm_id)));
    if filters.iter().all(|f| f.stop_iteration) {
        out.push(ok("allow_on_headers_stop_iteration: true on the kvroute filter"));
    } else {
        out.push(problem(
            "the kvroute filter lacks allow_on_headers_stop_iteration: true: Envoy never hands it \
             a request body, so every POST waits misdeployment.body_wait_ms and goes on unrouted \
             (Istio: load it with deploy/k8s/istio/envoyfilter.yaml; Envoy Gateway: apply the \
             EnvoyPatchPolicy in deploy/k8s/envoy-gateway)",
        ));
    }
    let clusters = cluster_names(dump);
    let singles = singletons(dump);
    match singles.iter().find(|(vm, _)| *vm == filter.vm_id) {
        Some((_, cluster)) => {
            out.push(ok(format!(
                "snapshot singleton runs with the filter's vm_id, pulling from {cluster}"
            )));
            if clusters.iter().any(|c| c == cluster) {
                out.push(ok(format!("updater cluster {cluster} exists")));
            } else {
                out.push(problem(format!(
                    "the singleton pulls from cluster {cluster}, which Envoy does not have: no \
                     knowledge arrives"
                )));
            }
        }
        None if singles.is_empty() => out.push(problem(
            "no snapshot singleton (bootstrap_extensions wasm service with snapshot_sync): no \
             knowledge from the updater ever arrives (Istio >= 1.21 ignores BOOTSTRAP patches: use \
             the bootstrap override in deploy/k8s/istio)",
        )),
        None => out.push(problem(format!(
            "the snapshot singleton's vm_id {:?} differs from the filter's {:?}: they do not share \
             data, so no knowledge reaches the filter",
            singles[0].0, filter.vm_id
        ))),
    }
    if override_headers(dump).iter().any(|h| h.eq_ignore_ascii_case(&filter.header)) {
        out.push(ok(format!("a cluster balances with override_host on {}", filter.header)));
    } else {
        out.push(problem(format!(
            "no cluster's override_host policy reads {}: the workers' cluster ignores kvroute's \
             choice (Envoy Gateway: BackendTrafficPolicy loadBalancer.endpointOverride; Istio: the \
             CLUSTER patch in deploy/k8s/istio/envoyfilter.yaml)",
            filter.header
        )));
    }
}

fn check_stats(stats: &str, out: &mut Vec<Finding>) {
    let mut seen = false;
    for s in kvroute_core::decision::misdeploy::Symptom::ALL {
        let name = format!("wasmcustom.kvroute.misdeployed.{}.present", s.name());
        if let Some(v) = stat(stats, &name) {
            seen = true;
            if v > 0 {
                out.push(problem(format!("the filter reports {}: {}", s.name(), s.advice())));
            }
        }
    }
    if !seen {
        out.push(problem(
            "Envoy's stats have no kvroute.misdeployed gauges: the filter never configured \
             (look for 'kvroute: rejecting plugin configuration' in Envoy's log) or is an older build",
        ));
    }
    check_threads(stats, out);
    match stat(stats, "wasmcustom.kvroute.sync.snapshot_version") {
        Some(v) if v > 0 => out.push(ok(format!("knowledge snapshot version {v} in shared data"))),
        Some(_) => out.push(problem(
            "the singleton has no snapshot yet: the updater is unreachable or refuses its token",
        )),
        None => {}
    }
}

/// Whether every worker thread can route with knowledge: each counts itself in
/// `kvroute.threads.*` from its first ticks (Envoy's main thread never does).
fn check_threads(stats: &str, out: &mut Vec<Finding>) {
    let Some(n) = stat(stats, "server.concurrency").filter(|n| *n > 0) else { return };
    let (Some(ready), Some(bundled)) = (
        stat(stats, "wasmcustom.kvroute.threads.ready"),
        stat(stats, "wasmcustom.kvroute.threads.bundled"),
    ) else {
        return;
    };
    if ready >= n {
        out.push(ok(format!(
            "ready: all {n} worker threads route with their bundles and the updater's knowledge"
        )));
    } else if bundled < n {
        out.push(problem(format!(
            "not ready: {bundled} of {n} worker threads have every model's bundle; the others \
             route on load alone (fallback no_bundle) until theirs is built (see \
             kvroute_bundles_build_failures and 'does not build here' in Envoy's log)"
        )));
    } else {
        out.push(problem(format!(
            "not ready: {ready} of {n} worker threads have the updater's knowledge; the others \
             route on their own history until a snapshot arrives"
        )));
    }
}

fn check_updater(status: &Value, out: &mut Vec<Finding>) {
    let workers = status.get("workers").and_then(Value::as_object);
    let Some(workers) = workers.filter(|w| !w.is_empty()) else {
        out.push(problem("the updater follows no worker: nothing to know"));
        return;
    };
    let mut fine = 0;
    for (w, e) in workers {
        let flag = |k: &str| e.get(k).and_then(Value::as_bool).unwrap_or(false);
        let mut wrong = Vec::new();
        if !flag("connected") {
            wrong.push("its KV event stream is not connected");
        }
        if !flag("compatible") {
            wrong.push("its config is not compatible (no cache credit)");
        }
        if !flag("member") {
            wrong.push("it is not in the pool (Envoy's health checks)");
        }
        if wrong.is_empty() {
            fine += 1;
        } else {
            out.push(problem(format!("updater: worker {w}: {}", wrong.join("; "))));
        }
    }
    if fine == workers.len() {
        out.push(ok(format!("updater follows {fine} workers, all connected and compatible")));
    }
}

/// The findings, problems and confirmations in the order they are checked.
pub fn diagnose(inputs: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    match inputs.server_info.as_ref().and_then(envoy_version) {
        Some(v) if v >= MIN_ENVOY => out.push(ok(format!("Envoy {}.{}", v.0, v.1))),
        Some(v) => out.push(problem(format!(
            "Envoy {}.{} is older than {}.{}: override_host, allow_on_headers_stop_iteration or \
             remove_on_match are missing",
            v.0, v.1, MIN_ENVOY.0, MIN_ENVOY.1
        ))),
        None => {}
    }
    match &inputs.config_dump {
        Some(dump) => check_config(dump, &mut out),
        None => out.push(problem("Envoy's /config_dump could not be read")),
    }
    match &inputs.stats {
        Some(stats) => check_stats(stats, &mut out),
        None => out.push(problem("Envoy's /stats could not be read")),
    }
    match (&inputs.updater_status, inputs.updater_asked) {
        (Some(status), _) => check_updater(status, &mut out),
        (None, true) => out.push(problem("the updater's /status could not be read")),
        (None, false) => {}
    }
    out
}

#[cfg(test)]
mod tests;
