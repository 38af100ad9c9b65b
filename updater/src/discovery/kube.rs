//! Kubernetes discovery (`kube:NAMESPACE/SERVICE`): the ready endpoints of a Service's
//! EndpointSlices (`discovery.k8s.io/v1`, label `kubernetes.io/service-name`), followed with
//! list + watch: a list gives every slice and a `resourceVersion`, a watch from there sends
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

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use thiserror::Error;
use tokio::sync::watch;

use super::{defaults, log_line, DiscoveryConfig, Source};
use crate::config::WorkerEntry;

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
pub struct Endpoint {
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub conditions: EndpointConditions,
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
    pub endpoints: Option<Vec<Endpoint>>,
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
    pub service: String,
}

impl Api {
    /// From the configuration, else the in-cluster defaults.
    pub fn from_config(cfg: &DiscoveryConfig) -> Result<Api, KubeError> {
        let Source::Kube { namespace, service } = &cfg.source else {
            return Err(KubeError::NotKube);
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
    let b = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
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
    if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
        return BTreeSet::new();
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
        return BTreeSet::new();
    };
    slice
        .endpoints
        .iter()
        .flatten()
        .filter(|e| e.conditions.ready != Some(false))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

/// Every slice's ready endpoints, by slice name.
#[derive(Debug, Default)]
pub struct Slices {
    by_name: BTreeMap<String, BTreeSet<SocketAddr>>,
}

impl Slices {
    /// The workers of every slice.
    pub fn workers(&self, cfg: &DiscoveryConfig) -> Vec<WorkerEntry> {
        let all: BTreeSet<&SocketAddr> = self.by_name.values().flatten().collect();
        all.into_iter().map(|a| cfg.worker(a.ip(), a.port())).collect()
    }

    fn set(&mut self, cfg: &DiscoveryConfig, slice: &EndpointSlice) {
        if let Some(name) = &slice.metadata.name {
            self.by_name.insert(name.clone(), ready(cfg, slice));
        }
    }

    fn remove(&mut self, slice: &EndpointSlice) {
        if let Some(name) = &slice.metadata.name {
            self.by_name.remove(name);
        }
    }
}

/// What a watch event asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The slices changed (or only the version moved).
    Continue,
    /// 410 Gone: list again.
    Relist,
}

/// Applies one watch event to `slices`, moving `version` on.
pub fn apply_event(
    cfg: &DiscoveryConfig,
    slices: &mut Slices,
    version: &mut Option<String>,
    ev: WatchEvent,
) -> Step {
    if ev.kind == "ERROR" {
        // A metav1.Status: 410 (Expired / Gone) means the version is too old.
        let code = ev.object.get("code").and_then(serde_json::Value::as_u64);
        if code == Some(410) {
            return Step::Relist;
        }
        log_line(&format!("watch error: {}", ev.object));
        return Step::Relist;
    }
    let Ok(slice) = serde_json::from_value::<EndpointSlice>(ev.object) else {
        return Step::Continue;
    };
    if let Some(rv) = &slice.metadata.resource_version {
        *version = Some(rv.clone());
    }
    match ev.kind.as_str() {
        "ADDED" | "MODIFIED" => slices.set(cfg, &slice),
        "DELETED" => slices.remove(&slice),
        // BOOKMARK: only the version.
        _ => {}
    }
    Step::Continue
}

async fn list(
    api: &Api,
    http: &reqwest::Client,
    cfg: &DiscoveryConfig,
) -> Result<(Slices, Option<String>), KubeError> {
    let resp = api
        .get(http, api.path())?
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|e| KubeError::Http(format!("list: {e}")))?;
    if !resp.status().is_success() {
        return Err(KubeError::Http(format!("list: {}", resp.status())));
    }
    let l: EndpointSliceList =
        resp.json().await.map_err(|e| KubeError::Http(format!("list: {e}")))?;
    let mut slices = Slices::default();
    for s in &l.items {
        slices.set(cfg, s);
    }
    Ok((slices, l.metadata.resource_version))
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
    cfg: &DiscoveryConfig,
    slices: &mut Slices,
    version: &mut Option<String>,
    tx: &watch::Sender<Option<Vec<WorkerEntry>>>,
) -> Result<(), KubeError> {
    let rv = version.clone().unwrap_or_default();
    let url = format!(
        "{}&watch=true&allowWatchBookmarks=true&timeoutSeconds=290&resourceVersion={rv}",
        api.path()
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
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let Ok(ev) = serde_json::from_slice::<WatchEvent>(&line) else {
                log_line("watch: an event that is not JSON; listing again");
                return Err(KubeError::Gone);
            };
            if apply_event(cfg, slices, version, ev) == Step::Relist {
                return Err(KubeError::Gone);
            }
            send(tx, slices.workers(cfg));
        }
        if buf.len() > MAX_EVENT_BYTES {
            return Err(KubeError::Http("watch: an event longer than 16 MiB".into()));
        }
    }
    Ok(())
}

/// Lists, then watches, forever; sends each new set of workers. Returns only when the
/// configuration cannot work (no API address, unreadable CA bundle) or nobody listens.
pub async fn run(
    cfg: &DiscoveryConfig,
    tx: watch::Sender<Option<Vec<WorkerEntry>>>,
) -> Result<(), KubeError> {
    let api = Api::from_config(cfg)?;
    let http = client(cfg)?;
    let retry = Duration::from_millis(cfg.min_ttl_ms.max(100));
    'relist: loop {
        if tx.is_closed() {
            return Ok(());
        }
        let (mut slices, mut version) = match list(&api, &http, cfg).await {
            Ok(l) => l,
            Err(e) => {
                log_line(&format!("{}: {e}; the pool stays as it was", cfg.source));
                tokio::time::sleep(retry).await;
                continue;
            }
        };
        send(&tx, slices.workers(cfg));
        loop {
            match watch_from(&api, &http, cfg, &mut slices, &mut version, &tx).await {
                Ok(()) => {}
                Err(KubeError::Gone) => continue 'relist,
                Err(e) => {
                    log_line(&format!("{}: {e}; watching again", cfg.source));
                    tokio::time::sleep(retry).await;
                }
            }
            if tx.is_closed() {
                return Ok(());
            }
        }
    }
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
                 "targetRef": {"kind": "Pod", "name": "vllm-0", "namespace": "ns"}, "nodeName": "n1"},
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
}
