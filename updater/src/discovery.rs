//! Membership that follows the pool: where the workers come from ([`DiscoverySource`]: the static list,
//! DNS, or a Kubernetes Service's EndpointSlices) and the [`Supervisor`] that owns each
//! worker's tasks (KV-event follower, scrape, alignment check): a worker found is added to
//! the [`State`] and its tasks spawned; a worker gone has its tasks aborted and its knowledge
//! dropped at once, so the next snapshot neither lists nor credits it.
//!
//! A discovered address becomes the worker `ip:port` (the HTTP port), with its KV-event and
//! replay endpoints on the configured ports of the same address, as a static [`WorkerEntry`]
//! names them. With discovery the snapshot says it lists the whole pool
//! ([`kvroute_core::wire::snapshot::Snapshot::pool`]).
//!
//! [`dns`]: A/AAAA of a name (or SRV for the ports), re-resolved when the answer's TTL runs
//! out (between a floor and a ceiling). [`kube`]: list + watch of the EndpointSlices of a
//! Service (`discovery.k8s.io/v1`), ready endpoints only.
//!
//! Placement: each worker may carry [`Labels`] (site, zone, rack, node). A static worker's
//! come from its `labels` table; an EndpointSlice endpoint gives `zone` and `nodeName`, an
//! InferencePool's pod `spec.nodeName`; `[discovery] site` names the site of every worker
//! this updater finds (one cluster is one site) unless its own labels name one. The
//! [`Supervisor`] hands them to the [`State`] with the time it saw them; a change of labels
//! alone does not restart a worker's tasks.

pub mod dns;
pub mod kube;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvroute_core::decision::topology::Labels;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::state::State;
use crate::subscriber::Endpoints;

/// One worker: `[[workers]]` in the file, `--worker HTTP[,EVENTS[,REPLAY]]` on the command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerEntry {
    /// The worker's HTTP `ip:port` (OpenAI API, `/metrics`, `/tokenize`).
    pub http: String,
    /// Its KV-event PUB endpoint (`tcp://ip:port`); absent: followed for load only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<String>,
    /// Its replay ROUTER endpoint; needs `events`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    /// Where it runs (`labels = { site = "a", zone = "a1", rack = "r1", node = "n1" }`; any
    /// may be left out); discovery fills them from the workload's metadata.
    #[serde(default, skip_serializing_if = "crate::state::labels_unknown")]
    pub labels: Labels,
}

impl WorkerEntry {
    /// Whether `other` is the same worker at the same endpoints (labels aside).
    pub fn same_endpoints(&self, other: &WorkerEntry) -> bool {
        self.http == other.http && self.events == other.events && self.replay == other.replay
    }

    /// This entry with `site` as its site unless its labels name one.
    pub fn in_site(mut self, site: Option<&str>) -> WorkerEntry {
        if self.labels.site.is_none() {
            self.labels.site = site.map(str::to_owned);
        }
        self
    }
}

/// Defaults of the discovery settings.
pub mod defaults {
    pub const MIN_TTL_MS: u64 = 1_000;
    pub const MAX_TTL_MS: u64 = 30_000;
    pub const KUBE_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    pub const KUBE_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
}

/// Where the workers come from: `--discover`, `[discovery] source`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DiscoverySource {
    /// The configured `--worker` / `[[workers]]` list.
    #[default]
    Static,
    /// `dns:NAME`: the A and AAAA records of NAME (a headless Service), on `http_port`.
    Dns(String),
    /// `dns+srv:NAME`: the SRV records of NAME; each target's addresses on the record's port.
    DnsSrv(String),
    /// `kube:NAMESPACE/SERVICE`: the ready endpoints of the Service's EndpointSlices.
    Kube { namespace: String, service: String },
    /// `kube-pool:NAMESPACE/POOL`: the ready pods an InferencePool selects, on its port.
    KubePool { namespace: String, pool: String },
}

/// What is wrong with a discovery setting.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiscoveryConfigError {
    #[error(
        "discovery source '{0}' is not static, dns:NAME, dns+srv:NAME, kube:NAMESPACE/SERVICE or \
         kube-pool:NAMESPACE/POOL"
    )]
    DiscoverySource(String),
    #[error("discovery by {0} needs an HTTP port (--discover-http-port)")]
    HttpPort(String),
    #[error("a replay port needs an events port (--discover-events-port)")]
    ReplayWithoutEvents,
    #[error("the TTL floor ({0} ms) is above the ceiling ({1} ms), or zero")]
    Ttl(u64, u64),
    #[error("workers are listed (--worker / [[workers]]) and discovered ({0}): choose one")]
    WorkersAndDiscovery(String),
    #[error("the Kubernetes API address '{0}' is not an http:// or https:// URL")]
    KubeApi(String),
}

impl std::str::FromStr for DiscoverySource {
    type Err = DiscoveryConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DiscoveryConfigError::DiscoverySource(s.to_owned());
        fn named(n: &str) -> Option<&str> {
            (!n.is_empty() && !n.contains(char::is_whitespace)).then_some(n)
        }
        if s == "static" {
            return Ok(DiscoverySource::Static);
        }
        if let Some(n) = s.strip_prefix("dns+srv:") {
            return Ok(DiscoverySource::DnsSrv(named(n).ok_or_else(bad)?.to_owned()));
        }
        if let Some(n) = s.strip_prefix("dns:") {
            return Ok(DiscoverySource::Dns(named(n).ok_or_else(bad)?.to_owned()));
        }
        let kube = s.strip_prefix("kube:").map(|r| (r, false));
        let pool = s.strip_prefix("kube-pool:").map(|r| (r, true));
        if let Some((rest, pool)) = kube.or(pool) {
            let (ns, svc) = rest.split_once('/').ok_or_else(bad)?;
            let ok = |p: &str| {
                !p.is_empty()
                    && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            };
            if !ok(ns) || !ok(svc) {
                return Err(bad());
            }
            if pool {
                return Ok(DiscoverySource::KubePool { namespace: ns.into(), pool: svc.into() });
            }
            return Ok(DiscoverySource::Kube { namespace: ns.into(), service: svc.into() });
        }
        Err(bad())
    }
}

impl TryFrom<String> for DiscoverySource {
    type Error = DiscoveryConfigError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<DiscoverySource> for String {
    fn from(s: DiscoverySource) -> String {
        s.to_string()
    }
}

impl std::fmt::Display for DiscoverySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiscoverySource::Static => write!(f, "static"),
            DiscoverySource::Dns(n) => write!(f, "dns:{n}"),
            DiscoverySource::DnsSrv(n) => write!(f, "dns+srv:{n}"),
            DiscoverySource::Kube { namespace, service } => write!(f, "kube:{namespace}/{service}"),
            DiscoverySource::KubePool { namespace, pool } => {
                write!(f, "kube-pool:{namespace}/{pool}")
            }
        }
    }
}

/// The `[discovery]` table (flags `--discover` and `--discover-*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Where the workers come from.
    pub source: DiscoverySource,
    /// The DNS server to ask (`ip:port`); absent: the system's (`/etc/resolv.conf`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_server: Option<SocketAddr>,
    /// The workers' HTTP port (OpenAI API, `/metrics`): their name is `ip:port`. For SRV,
    /// the record's port; for Kubernetes, the endpoint port named `port_name`, else this
    /// one, else the slice's only port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_port: Option<u16>,
    /// The workers' KV-event PUB port; absent: followed for load only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_port: Option<u16>,
    /// The workers' replay ROUTER port (needs `events_port`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_port: Option<u16>,
    /// Kubernetes: the EndpointSlice port name of the HTTP port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_name: Option<String>,
    /// DNS: the shortest time between two resolutions (a shorter TTL is raised to it).
    pub min_ttl_ms: u64,
    /// DNS: the longest time between two resolutions (a longer TTL is cut to it).
    pub max_ttl_ms: u64,
    /// Kubernetes: the API server; absent: in-cluster (`KUBERNETES_SERVICE_HOST`/`_PORT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_api: Option<String>,
    /// Kubernetes: the bearer token file (in-cluster: the service account's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_token_file: Option<PathBuf>,
    /// Kubernetes: the API server's CA bundle (in-cluster: the service account's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_ca_file: Option<PathBuf>,
    /// The site every worker found here runs in (one cluster, one DNS zone: one site), for
    /// the filter's topology; a static worker's own `labels.site` wins.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            source: DiscoverySource::Static,
            dns_server: None,
            http_port: None,
            events_port: None,
            replay_port: None,
            port_name: None,
            min_ttl_ms: defaults::MIN_TTL_MS,
            max_ttl_ms: defaults::MAX_TTL_MS,
            kube_api: None,
            kube_token_file: None,
            kube_ca_file: None,
            site: None,
        }
    }
}

impl DiscoveryConfig {
    /// Checks what serde does not; `listed` is the number of statically listed workers.
    pub fn validate(&self, listed: usize) -> Result<(), DiscoveryConfigError> {
        if self.source == DiscoverySource::Static {
            return Ok(());
        }
        if listed > 0 {
            return Err(DiscoveryConfigError::WorkersAndDiscovery(self.source.to_string()));
        }
        if matches!(self.source, DiscoverySource::Dns(_)) && self.http_port.is_none() {
            return Err(DiscoveryConfigError::HttpPort(self.source.to_string()));
        }
        if self.replay_port.is_some() && self.events_port.is_none() {
            return Err(DiscoveryConfigError::ReplayWithoutEvents);
        }
        if self.min_ttl_ms == 0 || self.min_ttl_ms > self.max_ttl_ms {
            return Err(DiscoveryConfigError::Ttl(self.min_ttl_ms, self.max_ttl_ms));
        }
        if let Some(api) = &self.kube_api {
            let rest = api.strip_prefix("http://").or_else(|| api.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.contains(char::is_whitespace)) {
                return Err(DiscoveryConfigError::KubeApi(api.clone()));
            }
        }
        Ok(())
    }

    /// Whether workers are discovered (not the static list).
    pub fn is_dynamic(&self) -> bool {
        self.source != DiscoverySource::Static
    }

    /// The worker at `ip` whose HTTP port is `http_port`: its name and endpoints.
    pub fn worker(&self, ip: IpAddr, http_port: u16) -> WorkerEntry {
        let at = |port: u16| format!("tcp://{}", SocketAddr::new(ip, port));
        let events = self.events_port.map(at);
        let replay = events.as_ref().and(self.replay_port).map(at);
        let http = SocketAddr::new(ip, http_port).to_string();
        WorkerEntry { http, events, replay, labels: Labels::default() }
            .in_site(self.site.as_deref())
    }

    /// The resolution floor and ceiling.
    pub fn ttl_bounds(&self) -> (Duration, Duration) {
        let min = Duration::from_millis(self.min_ttl_ms.max(1));
        (min, Duration::from_millis(self.max_ttl_ms).max(min))
    }
}

/// How often each worker is scraped and checked.
#[derive(Debug, Clone, Copy)]
pub struct Intervals {
    pub scrape: Duration,
    pub align: Duration,
}

/// One worker's running tasks; aborted when dropped.
struct Tasks {
    entry: WorkerEntry,
    handles: Vec<JoinHandle<()>>,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for h in &self.handles {
            h.abort();
        }
    }
}

/// What one [`Supervisor::apply`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

/// Owns every worker's tasks: brings the [`State`] to a wanted set of workers.
pub struct Supervisor {
    state: Arc<State>,
    intervals: Intervals,
    tasks: BTreeMap<String, Tasks>,
}

impl Supervisor {
    pub fn new(state: Arc<State>, intervals: Intervals) -> Supervisor {
        Supervisor { state, intervals, tasks: BTreeMap::new() }
    }

    /// The workers supervised now.
    pub fn workers(&self) -> Vec<String> {
        self.tasks.keys().cloned().collect()
    }

    /// Makes `want` the pool: workers not in it are stopped and removed (their knowledge
    /// goes at once), new ones added and started. A worker whose endpoints changed is
    /// restarted with a fresh entry. Every wanted worker's labels are handed to the state as
    /// seen now (a change of labels alone restarts nothing).
    pub fn apply(&mut self, want: &[WorkerEntry]) -> Change {
        let wanted: BTreeMap<&str, &WorkerEntry> =
            want.iter().map(|w| (w.http.as_str(), w)).collect();
        let mut change = Change::default();
        let stale: Vec<String> = self
            .tasks
            .iter()
            .filter(|(name, t)| {
                wanted.get(name.as_str()).is_none_or(|w| !w.same_endpoints(&t.entry))
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            // Aborted first, so that no task of it writes after it left the state.
            drop(self.tasks.remove(&name));
            self.state.remove_worker(&name);
            change.removed.push(name);
        }
        for (name, entry) in wanted {
            if self.tasks.contains_key(name) {
                continue;
            }
            self.state.add_worker(name);
            self.tasks.insert(name.to_owned(), self.start(entry));
            change.added.push(name.to_owned());
        }
        let now = crate::state::now_ms();
        for w in want {
            self.state.set_labels(&w.http, &w.labels, now);
        }
        change
    }

    fn start(&self, entry: &WorkerEntry) -> Tasks {
        let state = &self.state;
        let name = entry.http.clone();
        let mut handles = vec![
            tokio::spawn(crate::scrape::run_scrape_worker(
                Arc::clone(state),
                name.clone(),
                self.intervals.scrape,
            )),
            tokio::spawn(crate::alignment::run_worker(
                Arc::clone(state),
                name.clone(),
                self.intervals.align,
            )),
        ];
        if let Some(events) = &entry.events {
            let ep =
                Endpoints { worker: name, events: events.clone(), replay: entry.replay.clone() };
            handles.push(tokio::spawn(crate::subscriber::follow(Arc::clone(state), ep)));
        }
        Tasks { entry: entry.clone(), handles }
    }
}

/// Why a discovery source could not run.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    #[error(transparent)]
    Dns(#[from] dns::DnsError),
    #[error(transparent)]
    Kube(#[from] kube::KubeError),
}

/// Runs discovery until the task is dropped: the source's sets of workers are applied by a
/// [`Supervisor`] as they come (the static list once). With a dynamic source the snapshot
/// says it is the whole pool.
pub async fn run(
    state: Arc<State>,
    cfg: DiscoveryConfig,
    workers: Vec<WorkerEntry>,
    intervals: Intervals,
) -> Result<(), DiscoveryError> {
    let mut sup = Supervisor::new(Arc::clone(&state), intervals);
    if !cfg.is_dynamic() {
        let site = cfg.site.as_deref();
        let workers: Vec<WorkerEntry> = workers.into_iter().map(|w| w.in_site(site)).collect();
        sup.apply(&workers);
        return futures::future::pending().await;
    }
    state.set_pool(true);
    let (tx, mut rx) = watch::channel::<Option<Vec<WorkerEntry>>>(None);
    let source = async {
        match &cfg.source {
            DiscoverySource::Static => Ok(()),
            DiscoverySource::Dns(_) | DiscoverySource::DnsSrv(_) => {
                dns::run(&cfg, tx).await.map_err(Into::into)
            }
            DiscoverySource::Kube { .. } | DiscoverySource::KubePool { .. } => {
                kube::run(&cfg, tx).await.map_err(Into::into)
            }
        }
    };
    let apply = async {
        while rx.changed().await.is_ok() {
            let want = rx.borrow_and_update().clone();
            if let Some(want) = want {
                let c = sup.apply(&want);
                if !c.added.is_empty() || !c.removed.is_empty() {
                    log_line(&format!("pool: +{:?} -{:?}", c.added, c.removed));
                }
            }
        }
    };
    tokio::select! {
        r = source => r,
        _ = apply => Ok(()),
    }
}

/// A structured log line of discovery.
pub(crate) fn log_line(msg: &str) {
    eprintln!(
        "{{\"component\":\"kvroute-updater\",\"discovery\":true,\"msg\":{}}}",
        serde_json::Value::from(msg)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_print_back() {
        for s in [
            "static",
            "dns:vllm.ns.svc.cluster.local",
            "dns+srv:_http._tcp.vllm",
            "kube:ns/vllm",
            "kube-pool:ns/p",
        ] {
            assert_eq!(s.parse::<DiscoverySource>().unwrap().to_string(), s);
        }
        for bad in ["", "dns:", "kube:ns", "kube:/x", "kube:a b/c", "consul:x", "dns:a b"] {
            assert!(bad.parse::<DiscoverySource>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_supervisor_adds_removes_and_restarts_workers() {
        let state = Arc::new(State::for_models(
            Arc::new(crate::models::Models::default()),
            Vec::new(),
            crate::limits::Limits::default(),
        ));
        let hour = Duration::from_secs(3600);
        let mut sup = Supervisor::new(Arc::clone(&state), Intervals { scrape: hour, align: hour });
        let w = |s: &str| s.parse::<WorkerEntry>().unwrap();
        let c = sup.apply(&[w("127.0.0.1:1"), w("127.0.0.1:2,tcp://127.0.0.1:3")]);
        assert_eq!(c.added, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(state.workers(), ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(sup.tasks["127.0.0.1:2"].handles.len(), 3, "scrape, alignment, events");
        let v = state.version();
        assert_eq!(
            sup.apply(&[w("127.0.0.1:1"), w("127.0.0.1:2,tcp://127.0.0.1:3")]),
            Change::default()
        );
        assert_eq!(state.version(), v, "the same set changes nothing");
        // 2's endpoints change: restarted (a fresh entry); 1 leaves.
        let handles: Vec<_> =
            sup.tasks["127.0.0.1:1"].handles.iter().map(|h| h.abort_handle()).collect();
        let c = sup.apply(&[w("127.0.0.1:2,tcp://127.0.0.1:4")]);
        assert_eq!((c.added.len(), c.removed.len()), (1, 2));
        assert_eq!(state.workers(), ["127.0.0.1:2"]);
        tokio::task::yield_now().await;
        assert!(handles.iter().all(|h| h.is_finished()), "a removed worker's tasks are aborted");
        assert!(state.snapshot().workers.iter().all(|k| k.worker == "127.0.0.1:2"));
    }

    #[tokio::test]
    async fn labels_reach_the_state_and_a_label_change_restarts_nothing() {
        let state = Arc::new(State::for_models(
            Arc::new(crate::models::Models::default()),
            Vec::new(),
            crate::limits::Limits::default(),
        ));
        let hour = Duration::from_secs(3600);
        let mut sup = Supervisor::new(Arc::clone(&state), Intervals { scrape: hour, align: hour });
        // A static worker as `[[workers]]` gives it; the source's site fills what it leaves out.
        let toml = "http = \"127.0.0.1:1\"\nlabels = { zone = \"z1\", node = \"n1\" }\n";
        let listed: WorkerEntry = toml::from_str(toml).unwrap();
        let w = listed.in_site(Some("a"));
        assert_eq!(w.labels.site.as_deref(), Some("a"));
        sup.apply(std::slice::from_ref(&w));
        let placed = state.answer_query(None, None, true, true, true);
        let crate::publish::Answer::Full(s) = placed else { panic!("expected a snapshot") };
        assert_eq!(s.placements.len(), 1);
        assert_eq!(s.placements[0].zone.as_deref(), Some("z1"));
        let handles: Vec<_> =
            sup.tasks["127.0.0.1:1"].handles.iter().map(|h| h.abort_handle()).collect();
        let mut moved = w.clone();
        moved.labels.zone = Some("z2".into());
        assert_eq!(sup.apply(&[moved]), Change::default(), "only the labels changed");
        tokio::task::yield_now().await;
        assert!(handles.iter().all(|h| !h.is_finished()), "its tasks kept running");
        assert_eq!(state.snapshot().placements[0].zone.as_deref(), Some("z2"));
        let cfg = DiscoveryConfig { site: Some("b".into()), ..Default::default() };
        let found = cfg.worker("10.0.0.1".parse().unwrap(), 8000);
        assert_eq!(found.labels.site.as_deref(), Some("b"));
    }

    #[test]
    fn validation_and_worker_names() {
        let dns = DiscoveryConfig { source: "dns:w".parse().unwrap(), ..Default::default() };
        assert!(matches!(dns.validate(0), Err(DiscoveryConfigError::HttpPort(_))));
        let dns = DiscoveryConfig { http_port: Some(8000), ..dns };
        dns.validate(0).unwrap();
        assert!(matches!(dns.validate(1), Err(DiscoveryConfigError::WorkersAndDiscovery(_))));
        let bad = DiscoveryConfig { replay_port: Some(2), ..dns.clone() };
        assert_eq!(bad.validate(0), Err(DiscoveryConfigError::ReplayWithoutEvents));
        let bad = DiscoveryConfig { min_ttl_ms: 5, max_ttl_ms: 4, ..dns.clone() };
        assert!(matches!(bad.validate(0), Err(DiscoveryConfigError::Ttl(5, 4))));
        let bad = DiscoveryConfig { kube_api: Some("kubernetes:443".into()), ..dns.clone() };
        assert!(matches!(bad.validate(0), Err(DiscoveryConfigError::KubeApi(_))));
        let srv = DiscoveryConfig { source: "dns+srv:w".parse().unwrap(), ..Default::default() };
        srv.validate(0).unwrap();
        let full = DiscoveryConfig { events_port: Some(5557), replay_port: Some(5558), ..dns };
        let w = full.worker("10.1.2.3".parse().unwrap(), 8000);
        assert_eq!(w.http, "10.1.2.3:8000");
        assert_eq!(w.events.as_deref(), Some("tcp://10.1.2.3:5557"));
        assert_eq!(w.replay.as_deref(), Some("tcp://10.1.2.3:5558"));
        let w6 = full.worker("fd00::7".parse().unwrap(), 8000);
        assert_eq!(
            (w6.http.as_str(), w6.events.as_deref()),
            ("[fd00::7]:8000", Some("tcp://[fd00::7]:5557"))
        );
    }
}
