//! Kubernetes discovery against a fake API server (axum on 127.0.0.1) that serves real
//! EndpointSlice list and watch JSON, shaped as the API server writes it (k8s.io/api
//! `discovery/v1` EndpointSlice / EndpointSliceList, apimachinery `watch.Event` and
//! `metav1.Status`): the watch follows ADDED / MODIFIED / DELETED slices and readiness
//! (`conditions.ready`), restarts from a BOOKMARK's version when the server ends it, and lists
//! again after `410 Gone` (as an ERROR event and as the watch's HTTP status).

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use common::*;
use kvroute_updater::discovery::{self, DiscoveryConfig, Intervals};
use kvroute_updater::limits::Limits;
use kvroute_updater::models::Models;
use kvroute_updater::state::State;
use serde_json::{json, Value};
use tokio::sync::mpsc;

const PATH: &str = "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices";

#[derive(Default)]
struct Fake {
    /// What a list returns: slices by name, and the collection's version.
    slices: Mutex<BTreeMap<String, Value>>,
    version: AtomicU64,
    lists: AtomicU64,
    /// The `resourceVersion` of each watch asked for.
    watches: Mutex<Vec<String>>,
    /// The next watch gets HTTP 410.
    gone_next: AtomicBool,
    /// The open watch's stream.
    stream: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    /// Every request's Authorization header.
    auth: Mutex<Vec<String>>,
    /// Every request's labelSelector.
    selectors: Mutex<Vec<String>>,
}

impl Fake {
    fn put(&self, slice: Value) {
        let name = slice["metadata"]["name"].as_str().unwrap().to_owned();
        self.slices.lock().unwrap().insert(name, slice);
    }

    fn send(&self, kind: &str, object: Value) {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        let s = self.stream.lock().unwrap();
        s.as_ref().expect("a watch is open").send(Bytes::from(line)).unwrap();
    }

    /// Ends the open watch (as the server does at `timeoutSeconds`).
    fn end(&self) {
        self.stream.lock().unwrap().take();
    }

    fn watching(&self) -> bool {
        self.stream.lock().unwrap().as_ref().is_some_and(|s| !s.is_closed())
    }

    fn watches(&self) -> Vec<String> {
        self.watches.lock().unwrap().clone()
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params {
    label_selector: Option<String>,
    watch: Option<bool>,
    resource_version: Option<String>,
    allow_watch_bookmarks: Option<bool>,
}

async fn endpointslices(
    AxState(f): AxState<Arc<Fake>>,
    Query(p): Query<Params>,
    headers: HeaderMap,
) -> Response {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
    f.auth.lock().unwrap().push(auth.to_owned());
    f.selectors.lock().unwrap().push(p.label_selector.clone().unwrap_or_default());
    if p.watch != Some(true) {
        f.lists.fetch_add(1, Ordering::SeqCst);
        let items: Vec<Value> = f.slices.lock().unwrap().values().cloned().collect();
        let rv = f.version.load(Ordering::SeqCst).to_string();
        return axum::Json(json!({
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": rv},
            "items": items,
        }))
        .into_response();
    }
    assert_eq!(p.allow_watch_bookmarks, Some(true));
    f.watches.lock().unwrap().push(p.resource_version.unwrap_or_default());
    if f.gone_next.swap(false, Ordering::SeqCst) {
        return (StatusCode::GONE, axum::Json(gone())).into_response();
    }
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    *f.stream.lock().unwrap() = Some(tx);
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    ([("content-type", "application/json")], axum::body::Body::from_stream(body)).into_response()
}

/// The `metav1.Status` of an expired resource version.
fn gone() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": "too old resource version: 100 (200)", "reason": "Expired", "code": 410})
}

/// An EndpointSlice of Service `vllm` as the API server writes it; `endpoints`: address and
/// `conditions.ready` (absent when `None`).
fn slice(name: &str, rv: u64, endpoints: &[(&str, Option<bool>)]) -> Value {
    let eps: Vec<Value> = endpoints
        .iter()
        .enumerate()
        .map(|(i, (addr, ready))| {
            let mut conditions = json!({"serving": true, "terminating": ready == &Some(false)});
            if let Some(r) = ready {
                conditions["ready"] = json!(r);
            }
            json!({
                "addresses": [addr],
                "conditions": conditions,
                "nodeName": "node-1",
                "zone": "zone-a",
                "targetRef": {"kind": "Pod", "namespace": "inference", "name": format!("vllm-{i}"),
                              "uid": format!("00000000-0000-0000-0000-00000000000{i}")},
            })
        })
        .collect();
    json!({
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name, "namespace": "inference", "resourceVersion": rv.to_string(),
            "generateName": "vllm-", "uid": format!("uid-{name}"),
            "labels": {"kubernetes.io/service-name": "vllm",
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "vllm",
                                 "uid": "svc-uid", "controller": true, "blockOwnerDeletion": true}],
        },
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8000},
                  {"name": "metrics", "protocol": "TCP", "port": 9090}],
    })
}

fn names(ips: &[&str]) -> Vec<String> {
    ips.iter().map(|ip| format!("{ip}:8000")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_follows_slices_readiness_bookmarks_and_410() {
    let fake = Arc::new(Fake::default());
    fake.version.store(100, Ordering::SeqCst);
    fake.put(slice("vllm-a", 100, &[("127.0.72.1", Some(true)), ("127.0.72.2", Some(false))]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route(PATH, axum::routing::get(endpointslices))
        .with_state(Arc::clone(&fake));
    let _server = spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let dir = std::env::temp_dir().join(format!("kvroute-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "sa-token\n").unwrap();

    let models = Models::load(&["kvroute-demo".parse().unwrap()], &[]).unwrap();
    let state = Arc::new(State::for_models(Arc::new(models), Vec::new(), Limits::default()));
    let cfg = DiscoveryConfig {
        source: "kube:inference/vllm".parse().unwrap(),
        port_name: Some("http".into()),
        events_port: Some(5557),
        kube_api: Some(api),
        kube_token_file: Some(token),
        min_ttl_ms: 100,
        site: Some("east".into()),
        ..Default::default()
    };
    cfg.validate(0).unwrap();
    let hour = Duration::from_secs(3600);
    let st = Arc::clone(&state);
    let _discovery = spawn(async move {
        discovery::run(st, cfg, Vec::new(), Intervals { scrape: hour, align: hour }).await.unwrap();
    });
    let workers = || state.workers();

    // The list: only the ready endpoint, on the port named `http`.
    assert!(until(10, || workers() == names(&["127.0.72.1"])).await, "{:?}", workers());
    assert!(until(10, || fake.watching()).await);
    assert_eq!(fake.watches(), ["100"], "the watch starts at the list's version");
    // Where it runs: the endpoint's zone and node, the source's site, seen just now.
    let placed = state.snapshot().placements;
    assert_eq!(placed.len(), 1, "{placed:?}");
    let p = &placed[0];
    let labels = (p.site.as_deref(), p.zone.as_deref(), p.rack.as_deref(), p.node.as_deref());
    assert_eq!(labels, (Some("east"), Some("zone-a"), None, Some("node-1")));
    assert!(p.observed_at_ms > 0 && p.worker == names(&["127.0.72.1"])[0]);

    // MODIFIED: the second endpoint became ready. ADDED: another slice of the Service.
    fake.send(
        "MODIFIED",
        slice("vllm-a", 101, &[("127.0.72.1", Some(true)), ("127.0.72.2", Some(true))]),
    );
    assert!(until(10, || workers() == names(&["127.0.72.1", "127.0.72.2"])).await);
    fake.send("ADDED", slice("vllm-b", 102, &[("127.0.72.3", None)]));
    assert!(until(10, || workers().len() == 3).await, "ready unknown counts as ready");

    // A BOOKMARK moves the version; the server ends the watch; the next watch starts there.
    let bookmark = json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"resourceVersion": "150", "annotations": {"k8s.io/initial-events-end": "true"}}});
    fake.send("BOOKMARK", bookmark);
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.end();
    assert!(until(10, || fake.watches().len() == 2 && fake.watching()).await);
    assert_eq!(fake.watches()[1], "150");
    assert_eq!(workers().len(), 3, "a bookmark changes no slice");

    // DELETED: the slice's endpoints leave, and their knowledge with them.
    fake.send("DELETED", slice("vllm-a", 151, &[]));
    assert!(until(10, || workers() == names(&["127.0.72.3"])).await, "{:?}", workers());
    assert!(state.snapshot().workers.iter().all(|w| w.worker == names(&["127.0.72.3"])[0]));

    // 410 as an ERROR event: list again (what changed meanwhile is taken from the list).
    fake.put(slice("vllm-b", 200, &[("127.0.72.3", Some(true)), ("127.0.72.4", Some(true))]));
    fake.slices.lock().unwrap().remove("vllm-a");
    fake.version.store(200, Ordering::SeqCst);
    fake.send("ERROR", gone());
    assert!(until(10, || workers() == names(&["127.0.72.3", "127.0.72.4"])).await);
    assert_eq!(fake.lists.load(Ordering::SeqCst), 2);
    assert!(until(10, || fake.watches().last().map(String::as_str) == Some("200")).await);

    // 410 as the watch's HTTP status: list again too.
    fake.put(slice("vllm-b", 300, &[("127.0.72.3", Some(false)), ("127.0.72.4", Some(true))]));
    fake.version.store(300, Ordering::SeqCst);
    fake.gone_next.store(true, Ordering::SeqCst);
    fake.end();
    assert!(until(10, || workers() == names(&["127.0.72.4"])).await, "{:?}", workers());
    assert_eq!(fake.lists.load(Ordering::SeqCst), 3);
    assert!(state.snapshot().pool);

    // Every request carried the token and asked for the Service's slices only.
    assert!(fake.auth.lock().unwrap().iter().all(|a| a == "Bearer sa-token"));
    let selectors = fake.selectors.lock().unwrap().clone();
    assert!(selectors.iter().all(|s| s == "kubernetes.io/service-name=vllm"), "{selectors:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

const PODS: &str = "/api/v1/namespaces/inference/pods";
const POOL: &str = "/apis/inference.networking.k8s.io/v1/namespaces/inference/inferencepools/qwen";

/// A Pod as the API server writes it (k8s.io/api core/v1), with its Ready condition.
fn pod(name: &str, ip: &str, ready: bool, deleting: bool) -> Value {
    let status = if ready { "True" } else { "False" };
    let mut p = json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "inference", "resourceVersion": "5",
                     "labels": {"app": "vllm", "model": "qwen"}},
        "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                                 "ports": [{"containerPort": 8000, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Initialized", "status": "True"},
                                  {"type": "Ready", "status": status},
                                  {"type": "ContainersReady", "status": status}]},
    });
    if deleting {
        p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    p
}

/// An InferencePool (inference.networking.k8s.io/v1) selecting `app=vllm,model=qwen` on `port`.
fn pool(port: u16) -> Value {
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "qwen", "namespace": "inference", "resourceVersion": "9"},
        "spec": {"selector": {"matchLabels": {"app": "vllm", "model": "qwen"}},
                 "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": "qwen-epp", "kind": "Service", "portNumber": 9002,
                                       "failureMode": "FailClose"}},
    })
}

async fn get_pool(AxState(p): AxState<Arc<Mutex<Value>>>) -> Response {
    axum::Json(p.lock().unwrap().clone()).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_pool_selects_ready_pods_on_its_target_port() {
    let pods = Arc::new(Fake::default());
    pods.version.store(10, Ordering::SeqCst);
    pods.put(pod("vllm-0", "127.0.73.1", true, false));
    pods.put(pod("vllm-1", "127.0.73.2", false, false));
    pods.put(pod("vllm-2", "127.0.73.3", true, true));
    let spec = Arc::new(Mutex::new(pool(8000)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route(PODS, axum::routing::get(endpointslices).with_state(Arc::clone(&pods)))
        .route(POOL, axum::routing::get(get_pool).with_state(Arc::clone(&spec)));
    let _server = spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let models = Models::load(&["kvroute-demo".parse().unwrap()], &[]).unwrap();
    let state = Arc::new(State::for_models(Arc::new(models), Vec::new(), Limits::default()));
    let cfg = DiscoveryConfig {
        source: "kube-pool:inference/qwen".parse().unwrap(),
        kube_api: Some(api),
        min_ttl_ms: 100,
        max_ttl_ms: 200,
        ..Default::default()
    };
    cfg.validate(0).unwrap();
    let hour = Duration::from_secs(3600);
    let st = Arc::clone(&state);
    let _discovery = spawn(async move {
        discovery::run(st, cfg, Vec::new(), Intervals { scrape: hour, align: hour }).await.unwrap();
    });
    let workers = || state.workers();

    // Only the ready pod that is not being deleted, on the pool's target port.
    assert!(until(10, || workers() == ["127.0.73.1:8000"]).await, "{:?}", workers());
    let placed = state.snapshot().placements;
    let nodes: Vec<_> = placed.iter().map(|p| (p.worker.as_str(), p.node.as_deref())).collect();
    assert_eq!(nodes, [("127.0.73.1:8000", Some("gpu-node-1"))], "the pod's spec.nodeName");
    assert_eq!(pods.selectors.lock().unwrap()[0], "app=vllm,model=qwen");
    assert!(until(10, || pods.watching()).await);
    pods.send("MODIFIED", pod("vllm-1", "127.0.73.2", true, false));
    assert!(until(10, || workers().len() == 2).await);
    pods.send("DELETED", pod("vllm-0", "127.0.73.1", true, true));
    assert!(until(10, || workers() == ["127.0.73.2:8000"]).await);

    // The pool's target port changes: the pods are listed again and named on the new port.
    pods.slices.lock().unwrap().remove("vllm-0");
    pods.put(pod("vllm-1", "127.0.73.2", true, false));
    let lists = pods.lists.load(Ordering::SeqCst);
    *spec.lock().unwrap() = pool(9000);
    assert!(until(10, || workers() == ["127.0.73.2:9000"]).await, "{:?}", workers());
    assert!(pods.lists.load(Ordering::SeqCst) > lists);
}
