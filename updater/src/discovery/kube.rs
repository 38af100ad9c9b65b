//! Kubernetes discovery. `kube:NAMESPACE/SERVICE`: the ready endpoints of a Service's
//! EndpointSlices (`discovery.k8s.io/v1`, label `kubernetes.io/service-name`).
//! `kube-pool:NAMESPACE/POOL`: the ready pods (condition `Ready`, not being deleted) that an
//! InferencePool (`inference.networking.k8s.io/v1`) selects, on its target port; the pool
//! itself is read again every `max_ttl_ms`. Each collection is followed with list + watch: a list gives every slice and a `resourceVersion`, a watch from there sends
//! ADDED / MODIFIED / DELETED slices and BOOKMARKs (a newer `resourceVersion`, nothing else).
//! A watch the server ends is started again from the last version seen; `410 Gone` (the
//! version is too old, as an HTTP status or an ERROR event) lists again.
//!
//! A small client over reqwest rather than kube-rs + k8s-openapi: one resource kind, read
//! only, and the types below carry just the fields used, shaped after the upstream API types
//! (k8s.io/api `discovery/v1/types.go`: `EndpointSlice`, `Endpoint`, `EndpointConditions`,
//! `EndpointPort`; k8s.io/apimachinery `meta/v1` `ListMeta`, `ObjectMeta`, `Status`,
//! `watch.Event`). An endpoint whose `conditions.ready` is absent counts as ready, as
//! types.go says consumers should read an unknown state.
//!
//! Placement: an endpoint's `zone` and `nodeName` (discovery/v1 `Endpoint`) become the
//! worker's zone and node labels; a pod's `spec.nodeName` (core/v1 `PodSpec`) its node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use thiserror::Error;
use tokio::sync::watch;

use kvroute_core::decision::topology::Labels;

use super::WorkerEntry;
use super::{defaults, log_line, DiscoveryConfig, DiscoverySource};

/// `metav1.ObjectMeta` / `metav1.ListMeta`: the fields used.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub resource_version: Option<String>,
}

/// `discoveryv1.EndpointConditions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct EndpointConditions {
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
}

/// `discoveryv1.Endpoint`: the fields used.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeEndpoint {
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub conditions: EndpointConditions,
    /// The Node hosting this endpoint.
    #[serde(default)]
    pub node_name: Option<String>,
    /// The zone this endpoint exists in (its Node's `topology.kubernetes.io/zone`).
    #[serde(default)]
    pub zone: Option<String>,
}

/// Ready addresses with where each runs.
pub type Placed = BTreeMap<SocketAddr, Labels>;

/// A label as Kubernetes gives it: empty or absent is unknown.
fn label(v: Option<&String>) -> Option<String> {
    v.filter(|s| !s.is_empty()).cloned()
}

/// `discoveryv1.EndpointPort`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct EndpointPort {
    pub name: Option<String>,
    pub port: Option<i32>,
    pub protocol: Option<String>,
}

/// `discoveryv1.EndpointSlice`: the fields used.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default)]
    pub metadata: Meta,
    /// `IPv4`, `IPv6` or `FQDN` (FQDN slices are not followed).
    #[serde(default)]
    pub address_type: String,
    #[serde(default)]
    pub endpoints: Option<Vec<KubeEndpoint>>,
    #[serde(default)]
    pub ports: Option<Vec<EndpointPort>>,
}

/// `discoveryv1.EndpointSliceList`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct EndpointSliceList {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default)]
    pub items: Vec<EndpointSlice>,
}

/// `metav1.WatchEvent`: `type` and the raw object (a slice, a bookmark's partial object, or
/// a `metav1.Status` for ERROR).
#[derive(Debug, Clone, Deserialize)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub object: serde_json::Value,
}

/// Why Kubernetes discovery could not run.
#[derive(Debug, Error)]
pub enum KubeError {
    #[error("Kubernetes discovery needs a kube: source")]
    NotKube,
    #[error("no Kubernetes API address: give --discover-kube-api, or run in a pod")]
    NoApi,
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("the Kubernetes API CA bundle {0}: {1}")]
    Ca(PathBuf, reqwest::Error),
    #[error("building the HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("{0}")]
    Http(String),
    #[error("410 Gone: the resource version is too old")]
    Gone,
}

/// Where and how to reach the API server.
#[derive(Debug, Clone)]
pub struct Api {
    pub base: String,
    pub token_file: Option<PathBuf>,
    pub namespace: String,
    /// The Service (`kube:`) or the InferencePool (`kube-pool:`).
    pub service: String,
}

impl Api {
    /// From the configuration, else the in-cluster defaults.
    pub fn from_config(cfg: &DiscoveryConfig) -> Result<Api, KubeError> {
        let (namespace, service) = match &cfg.source {
            DiscoverySource::Kube { namespace, service } => (namespace, service),
            DiscoverySource::KubePool { namespace, pool } => (namespace, pool),
            _ => return Err(KubeError::NotKube),
        };
        let base = match &cfg.kube_api {
            Some(a) => a.trim_end_matches('/').to_owned(),
            None => {
                let host =
                    std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| KubeError::NoApi)?;
                let port =
                    std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                let host = match host.parse::<IpAddr>() {
                    Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
                    _ => host,
                };
                format!("https://{host}:{port}")
            }
        };
        let token_file = cfg.kube_token_file.clone().or_else(|| {
            let p = PathBuf::from(defaults::KUBE_TOKEN_FILE);
            p.exists().then_some(p)
        });
        Ok(Api { base, token_file, namespace: namespace.clone(), service: service.clone() })
    }

    fn path(&self) -> String {
        format!(
            "{}/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{}",
            self.base, self.namespace, self.service
        )
    }

    fn get(
        &self,
        http: &reqwest::Client,
        url: String,
    ) -> Result<reqwest::RequestBuilder, KubeError> {
        let mut req = http.get(url).header("accept", "application/json");
        if let Some(f) = &self.token_file {
            // Read at each request: projected service-account tokens rotate.
            let t = std::fs::read_to_string(f).map_err(|e| KubeError::Read(f.clone(), e))?;
            req = req.bearer_auth(t.trim());
        }
        Ok(req)
    }
}

/// The HTTP client: with the configured (or in-cluster) CA bundle when it has one.
pub fn client(cfg: &DiscoveryConfig) -> Result<reqwest::Client, KubeError> {
    // A watch sends at least a bookmark a minute and ends at `timeoutSeconds` (290 s): a
    // connection silent for longer is dead.
    let b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .read_timeout(Duration::from_secs(330));
    let ca = cfg.kube_ca_file.clone().or_else(|| {
        let p = PathBuf::from(defaults::KUBE_CA_FILE);
        p.exists().then_some(p)
    });
    let b = match ca {
        Some(path) => add_ca(b, &path)?,
        None => b,
    };
    b.build().map_err(KubeError::Client)
}

fn add_ca(b: reqwest::ClientBuilder, path: &PathBuf) -> Result<reqwest::ClientBuilder, KubeError> {
    let pem = std::fs::read(path).map_err(|e| KubeError::Read(path.clone(), e))?;
    let certs =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| KubeError::Ca(path.clone(), e))?;
    Ok(certs.into_iter().fold(b.tls_built_in_root_certs(false), |b, c| b.add_root_certificate(c)))
}

/// The ready endpoints of one slice, on its HTTP port (see [`DiscoveryConfig::http_port`]).
pub fn ready(cfg: &DiscoveryConfig, slice: &EndpointSlice) -> BTreeSet<SocketAddr> {
    ready_placed(cfg, slice).into_keys().collect()
}

/// [`ready`], with each endpoint's zone and node.
pub fn ready_placed(cfg: &DiscoveryConfig, slice: &EndpointSlice) -> Placed {
    if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
        return Placed::new();
    }
    let ports = slice.ports.as_deref().unwrap_or_default();
    let port = match (&cfg.port_name, cfg.http_port) {
        (Some(name), _) => {
            ports.iter().find(|p| p.name.as_ref() == Some(name)).and_then(|p| p.port)
        }
        (None, Some(p)) => Some(i32::from(p)),
        (None, None) if ports.len() == 1 => ports[0].port,
        (None, None) => None,
    };
    let Some(port) = port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0) else {
        return Placed::new();
    };
    let mut out = Placed::new();
    for e in slice.endpoints.iter().flatten().filter(|e| e.conditions.ready != Some(false)) {
        let labels = Labels {
            zone: label(e.zone.as_ref()),
            node: label(e.node_name.as_ref()),
            ..Labels::default()
        };
        for ip in e.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
            out.insert(SocketAddr::new(ip, port), labels.clone());
        }
    }
    out
}

/// `corev1.PodCondition`: the fields used.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodCondition {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub status: String,
}

/// `corev1.PodStatus`: the fields used.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(default)]
    pub conditions: Option<Vec<PodCondition>>,
}

/// `corev1.PodSpec`: the fields used.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// The Node the pod is scheduled on.
    #[serde(default)]
    pub node_name: Option<String>,
}

/// `corev1.Pod`: the fields used (`metadata.deletionTimestamp` marks a terminating pod).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: serde_json::Value,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

/// A ready pod's address on `port`: condition `Ready` is `True`, it has an IP, and it is not
/// being deleted.
pub fn ready_pod(pod: &Pod, port: u16) -> BTreeSet<SocketAddr> {
    let ready =
        pod.status.conditions.iter().flatten().any(|c| c.kind == "Ready" && c.status == "True");
    let deleting = pod.metadata.get("deletionTimestamp").is_some_and(|t| !t.is_null());
    let ip = pod.status.pod_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok());
    match ip {
        Some(ip) if ready && !deleting => BTreeSet::from([SocketAddr::new(ip, port)]),
        _ => BTreeSet::new(),
    }
}

/// [`ready_pod`], with the pod's node.
pub fn ready_pod_placed(pod: &Pod, port: u16) -> Placed {
    let labels = Labels { node: label(pod.spec.node_name.as_ref()), ..Labels::default() };
    ready_pod(pod, port).into_iter().map(|a| (a, labels.clone())).collect()
}

/// `inference.networking.k8s.io/v1` InferencePool: the fields used (gateway-api-inference-
/// extension `api/v1/inferencepool_types.go`: `spec.selector.matchLabels`,
/// `spec.targetPorts[].number`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    #[serde(default)]
    pub selector: LabelSelector,
    #[serde(default)]
    pub target_ports: Vec<PoolPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PoolPort {
    #[serde(default)]
    pub number: i32,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct InferencePool {
    #[serde(default)]
    pub spec: InferencePoolSpec,
}

/// What an InferencePool selects: its pods' labels and their port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    pub labels: BTreeMap<String, String>,
    pub port: u16,
}

impl InferencePool {
    /// Its selector and (first) target port; `None` without either.
    pub fn target(&self) -> Option<PoolTarget> {
        let port = self.spec.target_ports.first().and_then(|p| u16::try_from(p.number).ok())?;
        let labels = self.spec.selector.match_labels.clone();
        (port > 0 && !labels.is_empty()).then_some(PoolTarget { labels, port })
    }
}

/// `labelSelector` query value for `labels` (`k=v,k2=v2`), URL-encoded.
fn selector_query(labels: &BTreeMap<String, String>) -> String {
    let raw: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    percent(&raw.join(","))
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An object's ready addresses, with where each runs.
pub type Addrs = Box<dyn Fn(&serde_json::Value) -> Placed + Send + Sync>;

/// One followed collection: where to list and watch it, and each object's ready addresses.
pub struct Collection {
    /// The collection URL with its `labelSelector` (more query parameters follow with `&`).
    pub url: String,
    pub addrs: Addrs,
}

impl Collection {
    /// The EndpointSlices of a Service: ready endpoints on the HTTP port.
    pub fn endpoint_slices(api: &Api, cfg: &DiscoveryConfig) -> Collection {
        let cfg = cfg.clone();
        Collection {
            url: api.path(),
            addrs: Box::new(move |v| {
                serde_json::from_value::<EndpointSlice>(v.clone())
                    .map(|s| ready_placed(&cfg, &s))
                    .unwrap_or_default()
            }),
        }
    }

    /// The pods an InferencePool selects: ready pods on its target port.
    pub fn pool_pods(api: &Api, target: &PoolTarget) -> Collection {
        let port = target.port;
        Collection {
            url: format!(
                "{}/api/v1/namespaces/{}/pods?labelSelector={}",
                api.base,
                api.namespace,
                selector_query(&target.labels)
            ),
            addrs: Box::new(move |v| {
                serde_json::from_value::<Pod>(v.clone())
                    .map(|p| ready_pod_placed(&p, port))
                    .unwrap_or_default()
            }),
        }
    }
}

/// Every object's ready addresses (with their placement), by object name.
#[derive(Debug, Default)]
pub struct Objects {
    by_name: BTreeMap<String, Placed>,
}

impl Objects {
    /// The workers of every object, each with its zone and node (an address two objects
    /// list takes the labels of the first by name that knows any) and the configured site.
    pub fn workers(&self, cfg: &DiscoveryConfig) -> Vec<WorkerEntry> {
        let mut all: BTreeMap<&SocketAddr, &Labels> = BTreeMap::new();
        for (a, l) in self.by_name.values().flatten() {
            let e = all.entry(a).or_insert(l);
            if crate::state::labels_unknown(e) {
                *e = l;
            }
        }
        all.into_iter()
            .map(|(a, l)| {
                let w = cfg.worker(a.ip(), a.port());
                let labels = Labels { zone: l.zone.clone(), node: l.node.clone(), ..w.labels };
                WorkerEntry { labels, ..w }
            })
            .collect()
    }

    fn set(&mut self, c: &Collection, obj: &serde_json::Value) {
        if let Some(name) = obj["metadata"]["name"].as_str() {
            self.by_name.insert(name.to_owned(), (c.addrs)(obj));
        }
    }

    fn remove(&mut self, obj: &serde_json::Value) {
        if let Some(name) = obj["metadata"]["name"].as_str() {
            self.by_name.remove(name);
        }
    }
}

/// What a watch event asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchStep {
    /// The objects changed (or only the version moved).
    Continue,
    /// 410 Gone (or another error): list again.
    Relist,
}

/// Applies one watch event to `objects`, moving `version` on.
pub fn apply_event(
    c: &Collection,
    objects: &mut Objects,
    version: &mut Option<String>,
    ev: WatchEvent,
) -> WatchStep {
    if ev.kind == "ERROR" {
        // A metav1.Status: 410 (Expired / Gone) means the version is too old; any other
        // error ends the watch too, and the list starts over.
        let code = ev.object.get("code").and_then(serde_json::Value::as_u64);
        if code != Some(410) {
            log_line(&format!("watch error: {}", ev.object));
        }
        return WatchStep::Relist;
    }
    if let Some(rv) = ev.object["metadata"]["resourceVersion"].as_str() {
        *version = Some(rv.to_owned());
    }
    match ev.kind.as_str() {
        "ADDED" | "MODIFIED" => objects.set(c, &ev.object),
        "DELETED" => objects.remove(&ev.object),
        // BOOKMARK: only the version.
        _ => {}
    }
    WatchStep::Continue
}

/// A list's items and version.
#[derive(Deserialize)]
struct List {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

async fn list(
    api: &Api,
    http: &reqwest::Client,
    c: &Collection,
) -> Result<(Objects, Option<String>), KubeError> {
    let resp = api
        .get(http, c.url.clone())?
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|e| KubeError::Http(format!("list: {e}")))?;
    if !resp.status().is_success() {
        return Err(KubeError::Http(format!("list: {}", resp.status())));
    }
    let l: List = resp.json().await.map_err(|e| KubeError::Http(format!("list: {e}")))?;
    let mut objects = Objects::default();
    for o in &l.items {
        objects.set(c, o);
    }
    Ok((objects, l.metadata.resource_version))
}

fn send(tx: &watch::Sender<Option<Vec<WorkerEntry>>>, want: Vec<WorkerEntry>) {
    tx.send_if_modified(|cur| {
        let changed = cur.as_ref() != Some(&want);
        *cur = Some(want);
        changed
    });
}

/// Longest line of one watch event accepted.
const MAX_EVENT_BYTES: usize = 16 << 20;

/// One watch from `version` until the server ends it (`Ok`) or says 410 (`Err(Gone)`).
async fn watch_from(
    api: &Api,
    http: &reqwest::Client,
    (cfg, c): (&DiscoveryConfig, &Collection),
    objects: &mut Objects,
    version: &mut Option<String>,
    tx: &watch::Sender<Option<Vec<WorkerEntry>>>,
) -> Result<(), KubeError> {
    let rv = version.clone().unwrap_or_default();
    let url = format!(
        "{}&watch=true&allowWatchBookmarks=true&timeoutSeconds=290&resourceVersion={}",
        c.url,
        percent(&rv)
    );
    let resp =
        api.get(http, url)?.send().await.map_err(|e| KubeError::Http(format!("watch: {e}")))?;
    if resp.status() == reqwest::StatusCode::GONE {
        return Err(KubeError::Gone);
    }
    if !resp.status().is_success() {
        return Err(KubeError::Http(format!("watch: {}", resp.status())));
    }
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| KubeError::Http(format!("watch: {e}")))?;
        buf.extend_from_slice(&chunk);
        take_events(&mut buf, c, objects, version, |o| send(tx, o.workers(cfg)))?;
    }
    Ok(())
}

/// The watch stream's bytes received so far, `buf`: applies each complete line (one
/// [`WatchEvent`]; blank lines skipped) to `objects` and removes it, calling `applied` after
/// each event. What is left is the start of the next line. `Err(Gone)`: a line that is not a
/// watch event, or an ERROR event (list again); `Err(Http)`: more than 16 MiB without a newline.
pub fn take_events(
    buf: &mut Vec<u8>,
    c: &Collection,
    objects: &mut Objects,
    version: &mut Option<String>,
    mut applied: impl FnMut(&Objects),
) -> Result<(), KubeError> {
    while let Some(end) = buf.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = buf.drain(..=end).collect();
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(ev) = serde_json::from_slice::<WatchEvent>(&line) else {
            log_line("watch: an event that is not JSON; listing again");
            return Err(KubeError::Gone);
        };
        if apply_event(c, objects, version, ev) == WatchStep::Relist {
            return Err(KubeError::Gone);
        }
        applied(objects);
    }
    if buf.len() > MAX_EVENT_BYTES {
        return Err(KubeError::Http("watch: an event longer than 16 MiB".into()));
    }
    Ok(())
}

/// Lists `c`, then watches it, forever (lists again after 410); sends each new set of
/// workers. Returns only when nobody listens any more.
async fn follow(
    api: &Api,
    http: &reqwest::Client,
    cfg: &DiscoveryConfig,
    c: &Collection,
    tx: &watch::Sender<Option<Vec<WorkerEntry>>>,
) {
    let retry = Duration::from_millis(cfg.min_ttl_ms.max(100));
    'relist: loop {
        if tx.is_closed() {
            return;
        }
        let (mut objects, mut version) = match list(api, http, c).await {
            Ok(l) => l,
            Err(e) => {
                log_line(&format!("{}: {e}; the pool stays as it was", cfg.source));
                tokio::time::sleep(retry).await;
                continue;
            }
        };
        send(tx, objects.workers(cfg));
        loop {
            match watch_from(api, http, (cfg, c), &mut objects, &mut version, tx).await {
                Ok(()) => {}
                Err(KubeError::Gone) => continue 'relist,
                Err(e) => {
                    log_line(&format!("{}: {e}; watching again", cfg.source));
                    tokio::time::sleep(retry).await;
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    }
}

/// Reads an InferencePool's selector and target port.
pub async fn pool_target(
    api: &Api,
    http: &reqwest::Client,
    pool: &str,
) -> Result<PoolTarget, KubeError> {
    let url = format!(
        "{}/apis/inference.networking.k8s.io/v1/namespaces/{}/inferencepools/{}",
        api.base, api.namespace, pool
    );
    let resp = api
        .get(http, url)?
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|e| KubeError::Http(format!("InferencePool {pool}: {e}")))?;
    if !resp.status().is_success() {
        return Err(KubeError::Http(format!("InferencePool {pool}: {}", resp.status())));
    }
    let p: InferencePool =
        resp.json().await.map_err(|e| KubeError::Http(format!("InferencePool {pool}: {e}")))?;
    p.target().ok_or_else(|| {
        KubeError::Http(format!("InferencePool {pool}: no selector labels or target port"))
    })
}

/// Follows the configured source forever; sends each new set of workers. Returns only when
/// the configuration cannot work (no API address, unreadable CA bundle) or nobody listens.
/// An InferencePool is read again every `max_ttl_ms`: a changed selector or port restarts
/// the pods' watch.
pub async fn run(
    cfg: &DiscoveryConfig,
    tx: watch::Sender<Option<Vec<WorkerEntry>>>,
) -> Result<(), KubeError> {
    let api = Api::from_config(cfg)?;
    let http = client(cfg)?;
    if !matches!(cfg.source, DiscoverySource::KubePool { .. }) {
        let c = Collection::endpoint_slices(&api, cfg);
        follow(&api, &http, cfg, &c, &tx).await;
        return Ok(());
    }
    let (_, reread) = cfg.ttl_bounds();
    let retry = Duration::from_millis(cfg.min_ttl_ms.max(100));
    let mut target: Option<PoolTarget> = None;
    while !tx.is_closed() {
        match pool_target(&api, &http, &api.service).await {
            Ok(t) => target = Some(t),
            Err(e) => {
                log_line(&format!("{}: {e}", cfg.source));
                if target.is_none() {
                    tokio::time::sleep(retry).await;
                    continue;
                }
            }
        }
        let Some(t) = target.clone() else { continue };
        let c = Collection::pool_pods(&api, &t);
        // Follow the pods until the pool is read again and found changed.
        let changed = async {
            loop {
                tokio::time::sleep(reread).await;
                match pool_target(&api, &http, &api.service).await {
                    Ok(now) if now != t => {
                        log_line(&format!("{}: selector or port changed", cfg.source));
                        target = Some(now);
                        return;
                    }
                    _ => {}
                }
            }
        };
        tokio::select! {
            _ = follow(&api, &http, cfg, &c, &tx) => return Ok(()),
            _ = changed => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DiscoveryConfig {
        DiscoveryConfig { source: "kube:ns/vllm".parse().unwrap(), ..Default::default() }
    }

    /// An EndpointSlice as the API server writes it (k8s.io/api discovery/v1).
    fn slice() -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": "vllm-abc12", "namespace": "ns", "resourceVersion": "7",
                         "labels": {"kubernetes.io/service-name": "vllm"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                 "targetRef": {"kind": "Pod", "name": "vllm-0", "namespace": "ns"}, "nodeName": "n1",
                 "zone": "us-east-1a"},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.0.0.3"], "conditions": {}}
            ],
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"},
                      {"name": "kv-events", "port": 5557, "protocol": "TCP"}]
        }))
        .unwrap()
    }

    #[test]
    fn ready_endpoints_on_the_named_or_configured_port() {
        let names =
            |s: BTreeSet<SocketAddr>| s.into_iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let by_name = DiscoveryConfig { port_name: Some("http".into()), ..cfg() };
        assert_eq!(names(ready(&by_name, &slice())), ["10.0.0.1:8000", "10.0.0.3:8000"]);
        let by_port = DiscoveryConfig { http_port: Some(9000), ..cfg() };
        assert_eq!(names(ready(&by_port, &slice())), ["10.0.0.1:9000", "10.0.0.3:9000"]);
        // Two ports and neither setting: which one is HTTP is not known.
        assert!(ready(&cfg(), &slice()).is_empty());
        let fqdn = EndpointSlice { address_type: "FQDN".into(), ..slice() };
        assert!(ready(&by_port, &fqdn).is_empty());
    }

    #[test]
    fn endpoints_carry_their_zone_and_node_and_the_source_its_site() {
        let east = DiscoveryConfig { http_port: Some(8000), site: Some("east".into()), ..cfg() };
        let placed = ready_placed(&east, &slice());
        let first = &placed[&"10.0.0.1:8000".parse().unwrap()];
        assert_eq!(
            (first.zone.as_deref(), first.node.as_deref()),
            (Some("us-east-1a"), Some("n1"))
        );
        assert_eq!(placed[&"10.0.0.3:8000".parse().unwrap()], Labels::default(), "none given");
        let c = Collection {
            url: String::new(),
            addrs: Box::new(|v| {
                serde_json::from_value::<EndpointSlice>(v.clone())
                    .map(|s| ready_placed(&DiscoveryConfig { http_port: Some(8000), ..cfg() }, &s))
                    .unwrap_or_default()
            }),
        };
        let mut objects = Objects::default();
        let obj = serde_json::to_value(serde_json::json!({
            "metadata": {"name": "vllm-abc12"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "n1", "zone": "us-east-1a"},
                          {"addresses": ["10.0.0.3"], "nodeName": ""}],
            "ports": [{"port": 8000}]
        }))
        .unwrap();
        objects.set(&c, &obj);
        let w = objects.workers(&east);
        let labels: Vec<_> = w.iter().map(|w| (w.http.as_str(), w.labels.clone())).collect();
        let east = |zone: Option<&str>, node: Option<&str>| Labels {
            site: Some("east".into()),
            zone: zone.map(Into::into),
            node: node.map(Into::into),
            rack: None,
        };
        assert_eq!(
            labels,
            [
                ("10.0.0.1:8000", east(Some("us-east-1a"), Some("n1"))),
                ("10.0.0.3:8000", east(None, None)),
            ],
            "an empty nodeName is unknown; the site is the source's"
        );
    }

    /// A pod as the API server writes it (k8s.io/api core/v1): `spec.nodeName` is its node.
    #[test]
    fn a_ready_pod_carries_its_node() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "vllm-0", "namespace": "ns", "labels": {"app": "vllm"}},
            "spec": {"nodeName": "gpu-node-7", "containers": [{"name": "vllm", "image": "vllm"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.9",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let placed = ready_pod_placed(&pod, 8000);
        let want = Labels { node: Some("gpu-node-7".into()), ..Labels::default() };
        assert_eq!(
            placed.into_iter().collect::<Vec<_>>(),
            [("10.0.0.9:8000".parse().unwrap(), want)]
        );
        let unscheduled = Pod { spec: PodSpec::default(), ..pod };
        assert_eq!(
            ready_pod_placed(&unscheduled, 8000).into_values().next(),
            Some(Labels::default())
        );
    }
}
