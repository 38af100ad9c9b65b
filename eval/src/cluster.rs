//! A running topology for one policy: workers, the updater (kvroute with events), an optional
//! knowledge delay relay, and M Envoy instances with that policy. Dropping it stops every
//! process it started.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::delay::DelayRelay;
use crate::topology::Topology;
use kvroute_stack::dynamo::DynamoRouter;
use kvroute_stack::envoy::Envoy;
use kvroute_stack::paths;
use kvroute_stack::peers::{PeerConfig, PeerKind, PeerRouter, PeerWorker};
use kvroute_stack::sim::SimWorker;
use kvroute_stack::stack::{write_config_text, BundleFrom, StackPorts, Updater};

/// What makes the routing decision. Every policy goes through the same Envoy listener, and
/// every kvroute variant gets the same updater (cluster-wide load scraped from the workers'
/// `/metrics`), so the ablation ladder least-request → kvroute-load-only → kvroute-history →
/// kvroute → oracle adds one ingredient per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// The kvroute filter with KV events from kvroute-updater (everything).
    Kvroute,
    /// The kvroute filter with its own routing history and response feedback, and the
    /// updater's load, but no KV events.
    #[serde(alias = "kvroute-no-events")]
    KvrouteHistory,
    /// The kvroute filter's cost model on load alone (the updater's and its own): credits no
    /// worker with any cached block (`knowledge.cache_aware: false`).
    KvrouteLoadOnly,
    /// The kvroute filter without the topology's `topology` section: network-blind (no client
    /// RTT, no link costs, no pulls), as peers that route on prefix and load alone.
    KvroutePrefixOnly,
    /// The kvroute filter unaware of a P/D split: only the decode workers, as one aggregated
    /// pool (each prefills locally); the prefill workers idle.
    KvrouteNoPd,
    /// The kvroute filter ranking on TTFT alone (`stream_stall_weight: 0`): running streams'
    /// delay unpriced, as before it was.
    KvrouteTtftOnly,
    /// The kvroute filter pricing only a prefill's stall of running streams, not its decode's
    /// growth of their steps (`stream_growth_tokens: 0`), as before it did.
    KvrouteNoGrowth,
    /// The kvroute filter pricing the growth with its configured decode step, not learning it
    /// from streams' gaps (`calibration.learn_decode_step: false`).
    KvrouteFixedStep,
    /// Envoy's LEAST_REQUEST.
    LeastRequest,
    /// Envoy's ROUND_ROBIN.
    RoundRobin,
    /// Envoy's RANDOM.
    Random,
    /// The limit: the harness asks every simulated worker what TTFT it would give the request
    /// now (`/sim/what_if`) and sends it to the best one through a bench-only Envoy that
    /// honours a client-set destination (`envoy/bench-oracle.yaml`).
    Oracle,
    /// Deliberately bad: everything to the first worker (the harness's self-check).
    Pinned,
    /// SMG (the SGLang model gateway, `smg launch --policy cache_aware`) in front of the same
    /// workers, from its pinned wheel: a radix tree of the prompts it routed.
    SmgCacheAware,
    /// The vLLM router with `--policy cache_aware` (its own tree of routed prompts).
    VllmRouterCacheAware,
    /// The vLLM router with `--policy kv_aware`, fed by the workers' own KV events over ZMQ.
    VllmRouterKvAware,
    /// NVIDIA Dynamo's frontend with `--router-mode kv` (`kvroute_stack::dynamo`): its KV
    /// router fed by the workers' events, each worker behind a bridge that registers it with
    /// Dynamo's runtime (an extra hop on Dynamo's path).
    DynamoKv,
}

impl Policy {
    /// Every policy a full comparison runs.
    pub const COMPARED: [Policy; 7] = [
        Policy::Kvroute,
        Policy::KvrouteHistory,
        Policy::KvrouteLoadOnly,
        Policy::LeastRequest,
        Policy::RoundRobin,
        Policy::Random,
        Policy::Oracle,
    ];

    /// The peer routers, each started from its pinned wheel in front of the same workers
    /// (`kvroute_stack::peers`), one instance each.
    pub const PEERS: [Policy; 4] = [
        Policy::SmgCacheAware,
        Policy::VllmRouterCacheAware,
        Policy::VllmRouterKvAware,
        Policy::DynamoKv,
    ];

    /// The ablation ladder, one ingredient added per step.
    pub const LADDER: [Policy; 5] = [
        Policy::LeastRequest,
        Policy::KvrouteLoadOnly,
        Policy::KvrouteHistory,
        Policy::Kvroute,
        Policy::Oracle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Kvroute => "kvroute",
            Policy::KvrouteHistory => "kvroute-history",
            Policy::KvrouteLoadOnly => "kvroute-load-only",
            Policy::KvroutePrefixOnly => "prefix-only",
            Policy::KvrouteNoPd => "kvroute-no-pd",
            Policy::KvrouteTtftOnly => "kvroute-ttft-only",
            Policy::KvrouteNoGrowth => "kvroute-no-growth",
            Policy::KvrouteFixedStep => "kvroute-fixed-step",
            Policy::LeastRequest => "least-request",
            Policy::RoundRobin => "round-robin",
            Policy::Random => "random",
            Policy::Oracle => "oracle",
            Policy::Pinned => "pinned",
            Policy::SmgCacheAware => "smg-cache-aware",
            Policy::VllmRouterCacheAware => "vllm-router-cache-aware",
            Policy::VllmRouterKvAware => "vllm-router-kv-aware",
            Policy::DynamoKv => "dynamo-kv",
        }
    }

    /// How a peer runs (its flags and why), for reports.
    pub fn peer_flags(self) -> Option<&'static str> {
        match self {
            Policy::DynamoKv => Some(kvroute_stack::dynamo::flags()),
            _ => self.peer().map(PeerKind::flags),
        }
    }

    /// Runs a peer router in front of the workers instead of Envoy.
    pub fn is_peer(self) -> bool {
        self.peer().is_some() || self == Policy::DynamoKv
    }

    /// The peer router this policy runs, if it is one.
    pub fn peer(self) -> Option<PeerKind> {
        match self {
            Policy::SmgCacheAware => Some(PeerKind::SmgCacheAware),
            Policy::VllmRouterCacheAware => Some(PeerKind::VllmRouterCacheAware),
            Policy::VllmRouterKvAware => Some(PeerKind::VllmRouterKvAware),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Policy> {
        if s == "kvroute-no-events" {
            return Ok(Policy::KvrouteHistory);
        }
        [
            Policy::Pinned,
            Policy::KvroutePrefixOnly,
            Policy::KvrouteNoPd,
            Policy::KvrouteTtftOnly,
            Policy::KvrouteNoGrowth,
            Policy::KvrouteFixedStep,
        ]
        .into_iter()
        .chain(Policy::COMPARED)
        .chain(Policy::PEERS)
        .find(|p| p.name() == s)
        .with_context(|| format!("unknown policy {s}"))
    }

    /// Runs the kvroute filter (and the updater beside it).
    pub fn filter(self) -> bool {
        matches!(
            self,
            Policy::Kvroute
                | Policy::KvrouteHistory
                | Policy::KvrouteLoadOnly
                | Policy::KvroutePrefixOnly
                | Policy::KvrouteNoPd
                | Policy::KvrouteTtftOnly
                | Policy::KvrouteNoGrowth
                | Policy::KvrouteFixedStep
        )
    }

    /// The updater follows the workers' KV events.
    pub fn events(self) -> bool {
        matches!(
            self,
            Policy::Kvroute
                | Policy::KvroutePrefixOnly
                | Policy::KvrouteNoPd
                | Policy::KvrouteTtftOnly
                | Policy::KvrouteNoGrowth
                | Policy::KvrouteFixedStep
        )
    }

    /// The filter gets the topology's `topology` section.
    pub fn network_aware(self) -> bool {
        self.filter() && self != Policy::KvroutePrefixOnly
    }

    fn lb_policy(self) -> &'static str {
        match self {
            Policy::RoundRobin | Policy::Pinned => "ROUND_ROBIN",
            Policy::Random => "RANDOM",
            _ => "LEAST_REQUEST",
        }
    }
}

/// A scheduled fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Fault {
    /// The worker's ports go away (it stays down for the rest of the run).
    WorkerLoss { worker: usize },
    /// Evict this share of the worker's free cached blocks.
    Evict { worker: usize, percent: u32 },
    /// The updater is down for this long, then restarts.
    UpdaterOutage { duration_ms: u64 },
    /// No worker publishes KV events for this long (`/admin/mute-events`): whoever follows
    /// them (kvroute's updater, the vLLM router's kv_aware) sees a sequence gap afterwards and
    /// has to recover through replay, which keeps only the most recent batches.
    EventOutage { duration_ms: u64 },
    /// Knowledge reaches Envoy this much later, for this long.
    KnowledgeDelay { delay_ms: u64, duration_ms: u64 },
}

/// A fault at a time of the run. (No `deny_unknown_fields` here: serde cannot combine it with
/// the flattened, tagged `fault`, and would refuse every fault it wrote itself; `Fault`'s own
/// variants still refuse unknown fields.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedFault {
    pub at_ms: u64,
    #[serde(flatten)]
    pub fault: Fault,
}

impl TimedFault {
    pub fn describe(&self) -> String {
        let what = match &self.fault {
            Fault::WorkerLoss { worker } => format!("worker {worker} lost"),
            Fault::Evict { worker, percent } => {
                format!("{percent} % of worker {worker}'s cache evicted")
            }
            Fault::UpdaterOutage { duration_ms } => {
                format!("updater down for {:.1} s", *duration_ms as f64 / 1000.0)
            }
            Fault::EventOutage { duration_ms } => {
                format!("no KV events for {:.1} s", *duration_ms as f64 / 1000.0)
            }
            Fault::KnowledgeDelay { delay_ms, duration_ms } => format!(
                "knowledge delayed by {delay_ms} ms for {:.1} s",
                *duration_ms as f64 / 1000.0
            ),
        };
        format!("t={:.1} s: {what}", self.at_ms as f64 / 1000.0)
    }
}

/// The peer router a peer policy runs.
pub enum PeerProcess {
    Router(Box<PeerRouter>),
    Dynamo(Box<DynamoRouter>),
}

/// A worker of the cluster.
pub enum WorkerHandle {
    Sim(Box<SimWorker>),
    External { addr: String },
}

impl WorkerHandle {
    pub fn addr(&self) -> &str {
        match self {
            WorkerHandle::Sim(s) => &s.addr,
            WorkerHandle::External { addr } => addr,
        }
    }
}

pub struct Cluster {
    pub policy: Policy,
    pub workers: Vec<WorkerHandle>,
    pub envoys: Vec<Envoy>,
    /// The peer router in front of the workers, for a peer policy (instead of Envoy).
    pub peer: Option<PeerProcess>,
    pub updater: Option<Updater>,
    pub relay: Option<DelayRelay>,
    pub dir: PathBuf,
    base_delay: Duration,
}

impl Cluster {
    /// Brings up the workers (or takes the external ones), the updater for kvroute policies
    /// (following Envoy 0's health checks through its admin, so a lost worker leaves the
    /// pool), and the Envoy instances. `faults` are the ones the run will apply (knowledge
    /// delays size the filter's poll timeout).
    pub async fn start(
        topo: &Topology,
        policy: Policy,
        faults: &[TimedFault],
    ) -> anyhow::Result<Cluster> {
        let max_fault_delay_ms = faults
            .iter()
            .filter_map(|f| match f.fault {
                Fault::KnowledgeDelay { delay_ms, .. } => Some(delay_ms),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        topo.validate()?;
        let dir = paths::scratch_dir(&format!("bench-{}", policy.name()))?;
        let mut workers = Vec::new();
        let mut endpoints = Vec::new();
        let mut peer_workers = Vec::new();
        if topo.workers.external.is_empty() {
            let mut args = vec![
                "--profile".to_string(),
                topo.workers.profile.clone(),
                "--speedup".into(),
                topo.workers.speedup.to_string(),
            ];
            if let Some(p) = topo.workers.prefill_ms_per_token {
                args.extend(["--prefill-ms-per-token".into(), p.to_string()]);
            }
            args.extend(topo.workers.model.pool(0, BundleFrom::Updater).sim_args());
            args.extend(topo.workers.sim_args.iter().cloned());
            for i in 0..topo.workers.count {
                let mut args = args.clone();
                if let Some(net) = &topo.net {
                    args.extend(net.sim_args(i, topo.workers.count));
                }
                let w = SimWorker::start(i, &args, &dir).await?;
                endpoints.push(format!(
                    "{},tcp://127.0.0.1:{},tcp://127.0.0.1:{}",
                    w.addr, w.events_port, w.replay_port
                ));
                peer_workers.push(PeerWorker::of(&w));
                workers.push(WorkerHandle::Sim(Box::new(w)));
            }
        } else {
            let addrs: Vec<String> = topo.workers.external.iter().map(|e| e.addr.clone()).collect();
            reset_prefix_caches(&addrs, &topo.workers.reset_path).await?;
            for e in &topo.workers.external {
                if let (Some(ev), Some(rp)) = (&e.events, &e.replay) {
                    endpoints.push(format!("{},{ev},{rp}", e.addr));
                }
                peer_workers.push(PeerWorker {
                    url: format!("http://{}", e.addr),
                    events: e.events.clone(),
                    replay: e.replay.clone(),
                });
                workers.push(WorkerHandle::External { addr: e.addr.clone() });
            }
        }
        let addrs: Vec<String> = workers.iter().map(|w| w.addr().to_owned()).collect();
        // Envoy routes to the workers that take requests: not a P/D pool's prefill workers.
        let routable: Vec<String> = addrs
            .iter()
            .enumerate()
            .filter(|(i, _)| !topo.net.as_ref().is_some_and(|n| n.is_prefill(*i)))
            .map(|(_, a)| a.clone())
            .collect();
        let updater_port = paths::free_port()?;
        // Envoy 0's admin port, known before Envoy starts so the updater can follow it.
        let admin0 = paths::free_port()?;
        let base_delay = Duration::from_millis(topo.knowledge.delay_ms);
        let (mut updater, relay) = if policy.filter() {
            let model = topo.workers.model.pool(0, BundleFrom::Updater).updater_model();
            // Without events the updater still scrapes every worker's load.
            let endpoints = if policy.events() { endpoints } else { addrs.clone() };
            let u =
                Updater::start_with(updater_port, Some(admin0), &endpoints, &[model], &dir).await?;
            let r = DelayRelay::start(updater_port, base_delay).await?;
            (Some(u), Some(r))
        } else {
            (None, None)
        };
        if policy.is_peer() {
            let peer = Self::start_peer(topo, policy, peer_workers, &dir).await?;
            return Ok(Cluster {
                policy,
                workers,
                envoys: Vec::new(),
                peer: Some(peer),
                updater,
                relay,
                dir,
                base_delay,
            });
        }
        let mut envoys = Vec::new();
        for i in 0..topo.envoy.instances {
            let ports = StackPorts {
                admin: if i == 0 { admin0 } else { paths::free_port()? },
                listen: paths::free_port()?,
                // Without the updater the singleton finds nothing there and the filter routes on
                // its own history.
                updater: relay.as_ref().map_or(updater_port, |r| r.port),
            };
            let sub = dir.join(format!("envoy-{i}"));
            std::fs::create_dir_all(&sub)?;
            let config = |admin, listen| {
                let ports = StackPorts { admin, listen, ..ports };
                Self::config(topo, policy, &sub, ports, &addrs, max_fault_delay_ms)
            };
            let first = (ports.admin, ports.listen);
            let envoy = Envoy::start_retrying_ports(first, &sub, topo.envoy.concurrency, config)
                .await
                .with_context(|| format!("starting Envoy {i} for {}", policy.name()))?;
            if let Some(u) = updater.as_mut().filter(|_| i == 0 && envoy.admin_port != admin0) {
                u.follow_admin(envoy.admin_port).await?;
            }
            envoys.push(envoy);
        }
        let cluster =
            Cluster { policy, workers, envoys, peer: None, updater, relay, dir, base_delay };
        let healthy = match policy {
            Policy::Pinned => 1,
            // The oracle's cluster has no fixed members: each request names its destination.
            Policy::Oracle => 0,
            _ => routable.len(),
        };
        for e in &cluster.envoys {
            e.wait_healthy(healthy).await?;
            if policy.filter() {
                // Every worker thread can route before the schedule starts: it has every
                // model's bundle and, where the updater runs, its knowledge.
                e.wait_threads_ready(cluster.updater.is_some(), Duration::from_secs(180)).await?;
            }
        }
        Ok(cluster)
    }

    /// The kvroute filter's configuration for `policy` on workers `addrs` (topology order):
    /// the filter's own prior (never the simulator's profile), a P/D pool's prefill workers
    /// (not for `kvroute-no-pd`), and the network's `topology` section (not for
    /// `prefix-only`).
    pub fn filter_config(
        topo: &Topology,
        policy: Policy,
        addrs: &[String],
    ) -> anyhow::Result<serde_json::Value> {
        let profile = serde_json::to_value(topo.filter.profile())?;
        let pool = topo.workers.model.pool(addrs.len(), Self::bundle_from(topo));
        let (decode, prefill) = split_pool(topo, addrs);
        let mut model = pool.filter_model(&decode)?;
        model["profile"] = profile;
        if !prefill.is_empty() && policy != Policy::KvrouteNoPd {
            model["prefill_workers"] = json!(prefill);
            model["pd_header"] = json!(crate::net::PREFILLER_HEADER);
        }
        let mut filter = json!({
            "models": [model],
            "expose_decision_header": true,
            "knowledge": {
                "max_event_age_ms": topo.knowledge.max_event_age_ms,
                "cache_aware": policy != Policy::KvrouteLoadOnly,
            },
        });
        if let (Some(net), true) = (&topo.net, policy.network_aware()) {
            filter["topology"] = net.filter_section(addrs);
        }
        if policy == Policy::KvrouteTtftOnly {
            filter["stream_stall_weight"] = json!(0.0);
        }
        if policy == Policy::KvrouteNoGrowth {
            filter["stream_growth_tokens"] = json!(0);
        }
        if policy == Policy::KvrouteFixedStep {
            filter["calibration"]["learn_decode_step"] = json!(false);
        }
        Ok(filter)
    }

    fn config(
        topo: &Topology,
        policy: Policy,
        dir: &std::path::Path,
        ports: StackPorts,
        addrs: &[String],
        max_fault_delay_ms: u64,
    ) -> anyhow::Result<PathBuf> {
        if policy.filter() {
            let filter = Self::filter_config(topo, policy, addrs)?;
            let (addrs, _) = split_pool(topo, addrs);
            let addrs = &addrs;
            // A knowledge-delay fault must delay, not cut off: the poll's timeout outlasts the
            // longest delay the topology or a fault can add.
            let path = paths::repo_root().join("envoy").join("kvroute.yaml");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let timeout = topo.knowledge.delay_ms.max(max_fault_delay_ms) + 2000;
            let text = with_poll_timeout(&text, timeout)?;
            return write_config_text("kvroute.yaml", &text, dir, ports, addrs, &filter);
        }
        if policy == Policy::Oracle {
            let path = paths::repo_root().join("envoy").join("bench-oracle.yaml");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            return write_config_text("oracle.yaml", &text, dir, ports, addrs, &json!({}));
        }
        let (addrs, _) = split_pool(topo, addrs);
        let addrs = &addrs;
        let path = paths::repo_root().join("envoy").join("least-request.yaml");
        let text = std::fs::read_to_string(&path)?;
        anyhow::ensure!(text.contains("lb_policy: LEAST_REQUEST"), "baseline template changed");
        let text =
            text.replace("lb_policy: LEAST_REQUEST", &format!("lb_policy: {}", policy.lb_policy()));
        let addrs = if policy == Policy::Pinned { &addrs[..1] } else { addrs };
        let name = format!("{}.yaml", policy.name());
        write_config_text(&name, &text, dir, ports, addrs, &json!({}))
    }

    /// The peer router `kind` in front of `workers`, told the model, its tokenizer bundle and the
    /// block size the workers announce (`vllm:cache_config_info`), as a provider would.
    async fn start_peer(
        topo: &Topology,
        policy: Policy,
        workers: Vec<PeerWorker>,
        dir: &std::path::Path,
    ) -> anyhow::Result<PeerProcess> {
        let first = workers.first().context("a peer router needs workers")?;
        let block_size = announced_block_size(&first.url).await?;
        let cfg = PeerConfig {
            kind: policy.peer().unwrap_or(PeerKind::VllmRouterKvAware),
            workers,
            model: topo.workers.model.name().to_owned(),
            block_size,
            tokenizer_dir: topo.workers.model.dir(),
        };
        let started = match policy.peer() {
            Some(_) => PeerRouter::start(&cfg, dir).await.map(|p| PeerProcess::Router(Box::new(p))),
            None => DynamoRouter::start(&cfg, dir).await.map(|d| PeerProcess::Dynamo(Box::new(d))),
        };
        started.with_context(|| format!("starting {}", policy.name()))
    }

    /// How kvroute's filter gets the model bundle: the built-in demo bundle needs nothing, any
    /// other comes from the updater.
    fn bundle_from(topo: &Topology) -> BundleFrom {
        match topo.workers.model.dir() {
            None => BundleFrom::Inline,
            Some(_) => BundleFrom::Updater,
        }
    }

    /// Fails when the peer that follows the workers' KV events could not decode some of them:
    /// its figures would be those of a router without (some of) its knowledge.
    pub fn check_peer(&self) -> anyhow::Result<()> {
        if let Some(PeerProcess::Router(p)) = &self.peer {
            let n = p.undecoded_event_batches();
            anyhow::ensure!(
                n == 0,
                "{} could not decode {n} KV-event batches (see {})",
                p.kind().name(),
                p.log_path().display()
            );
        }
        Ok(())
    }

    /// Base URLs clients send to: the Envoy instances, or the peer router.
    pub fn urls(&self) -> Vec<String> {
        match &self.peer {
            Some(PeerProcess::Router(p)) => vec![p.base_url()],
            Some(PeerProcess::Dynamo(d)) => vec![d.base_url()],
            None => self.envoys.iter().map(Envoy::base_url).collect(),
        }
    }

    pub fn addrs(&self) -> Vec<String> {
        self.workers.iter().map(|w| w.addr().to_owned()).collect()
    }

    /// Applies a fault now.
    pub async fn apply(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let sim = |w: usize| match self.workers.get(w) {
            Some(WorkerHandle::Sim(s)) => Ok(s),
            Some(WorkerHandle::External { .. }) => {
                anyhow::bail!("faults on external worker {w} are not supported")
            }
            None => anyhow::bail!("no worker {w}"),
        };
        match fault {
            Fault::WorkerLoss { worker } => {
                sim(*worker)?.admin("crash", None).await?;
            }
            Fault::Evict { worker, percent } => {
                sim(*worker)?.admin(&format!("evict?percent={percent}"), None).await?;
            }
            Fault::UpdaterOutage { .. } => {
                if let Some(u) = self.updater.as_mut() {
                    u.stop().await;
                }
            }
            Fault::KnowledgeDelay { delay_ms, .. } => {
                if let Some(r) = &self.relay {
                    r.set_delay(Duration::from_millis(*delay_ms));
                }
            }
            // Muted until `end` (bounded: an hour at most, should the run stop before).
            Fault::EventOutage { .. } => self.mute_events(3_600_000).await?,
        }
        Ok(())
    }

    /// Ends a fault that has a duration.
    pub async fn end(&mut self, fault: &Fault) -> anyhow::Result<()> {
        match fault {
            Fault::UpdaterOutage { .. } => {
                if let Some(u) = self.updater.as_mut() {
                    u.restart().await?;
                }
            }
            Fault::KnowledgeDelay { .. } => {
                if let Some(r) = &self.relay {
                    r.set_delay(self.base_delay);
                }
            }
            Fault::EventOutage { .. } => self.mute_events(0).await?,
            Fault::WorkerLoss { .. } | Fault::Evict { .. } => {}
        }
        Ok(())
    }

    /// Every simulated worker still up publishes no events for `ms` (0: publishes again).
    async fn mute_events(&self, ms: u64) -> anyhow::Result<()> {
        for w in &self.workers {
            match w {
                WorkerHandle::Sim(s) => {
                    match s.admin(&format!("mute-events?ms={ms}"), None).await {
                        // A crashed worker (409) publishes nothing anyway.
                        Err(e) if e.to_string().contains("409") => {}
                        r => {
                            r?;
                        }
                    }
                }
                WorkerHandle::External { addr } => {
                    anyhow::bail!("event outages on external worker {addr} are not supported")
                }
            }
        }
        Ok(())
    }
}

impl Fault {
    /// How long the fault lasts (zero: a one-off event).
    pub fn duration(&self) -> Duration {
        match self {
            Fault::UpdaterOutage { duration_ms }
            | Fault::EventOutage { duration_ms }
            | Fault::KnowledgeDelay { duration_ms, .. } => Duration::from_millis(*duration_ms),
            _ => Duration::ZERO,
        }
    }
}

/// The workers Envoy routes to (every one but a P/D pool's prefill workers) and the prefill
/// workers, each in topology order.
fn split_pool(topo: &Topology, addrs: &[String]) -> (Vec<String>, Vec<String>) {
    let prefill = |i: usize| topo.net.as_ref().is_some_and(|n| n.is_prefill(i));
    let (p, d): (Vec<_>, Vec<_>) = addrs.iter().enumerate().partition(|(i, _)| prefill(*i));
    let strip = |v: Vec<(usize, &String)>| v.into_iter().map(|(_, a)| a.clone()).collect();
    (strip(d), strip(p))
}

/// The block size a vLLM-style worker announces in `vllm:cache_config_info` on `/metrics`.
async fn announced_block_size(url: &str) -> anyhow::Result<usize> {
    let text = reqwest::get(format!("{url}/metrics")).await?.error_for_status()?.text().await?;
    parse_block_size(&text).with_context(|| format!("{url}/metrics has no cache_config_info"))
}

fn parse_block_size(metrics: &str) -> Option<usize> {
    let line = metrics.lines().find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let rest = &line[line.find("block_size=\"")? + "block_size=\"".len()..];
    rest[..rest.find('"')?].parse().ok()
}

/// `kvroute.yaml`'s text with the singleton's snapshot poll timeout set to `timeout_ms`.
fn with_poll_timeout(text: &str, timeout_ms: u64) -> anyhow::Result<String> {
    let poll = "\"interval_ms\": 100}";
    anyhow::ensure!(text.matches(poll).count() == 1, "kvroute.yaml's snapshot_sync line changed");
    Ok(text.replace(poll, &format!("\"interval_ms\": 100, \"timeout_ms\": {timeout_ms}}}")))
}

/// Empties every worker's prefix cache with `POST {path}` (vLLM's `/reset_prefix_cache`), so a
/// run starts cold whatever ran before. An engine refuses while requests of the previous run
/// still hold blocks: retried for up to a minute. An empty `path` resets nothing.
pub async fn reset_prefix_caches(addrs: &[String], path: &str) -> anyhow::Result<()> {
    if path.is_empty() {
        return Ok(());
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    for a in addrs {
        let url = format!("http://{a}{path}");
        kvroute_stack::eventually(
            &format!("POST {url} to succeed"),
            Duration::from_secs(60),
            || async { http.post(&url).send().await.ok()?.status().is_success().then_some(()) },
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knowledge_delay_fault_lengthens_the_poll_timeout_past_the_delay() {
        let path = kvroute_stack::paths::repo_root().join("envoy").join("kvroute.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let out = with_poll_timeout(&text, 3000).unwrap();
        let line = out.lines().find(|l| l.contains("snapshot_sync")).unwrap();
        let cfg: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(cfg["snapshot_sync"]["timeout_ms"], 3000);
        assert_eq!(cfg["snapshot_sync"]["interval_ms"], 100);
        assert!(with_poll_timeout("nothing here", 1).is_err());
    }

    #[test]
    fn faults_read_back_what_they_write() {
        let faults = vec![
            TimedFault { at_ms: 1, fault: Fault::WorkerLoss { worker: 1 } },
            TimedFault { at_ms: 2, fault: Fault::Evict { worker: 0, percent: 50 } },
            TimedFault { at_ms: 3, fault: Fault::UpdaterOutage { duration_ms: 4 } },
            TimedFault { at_ms: 5, fault: Fault::KnowledgeDelay { delay_ms: 6, duration_ms: 7 } },
            TimedFault { at_ms: 8, fault: Fault::EventOutage { duration_ms: 9 } },
        ];
        let json = serde_json::to_string(&faults).unwrap();
        assert_eq!(serde_json::from_str::<Vec<TimedFault>>(&json).unwrap(), faults);
        #[derive(Serialize, Deserialize)]
        struct Doc {
            faults: Vec<TimedFault>,
        }
        let text = toml::to_string(&Doc { faults: faults.clone() }).unwrap();
        assert_eq!(toml::from_str::<Doc>(&text).unwrap().faults, faults);
        assert!(serde_json::from_str::<TimedFault>(r#"{"at_ms":1,"kind":"nope"}"#).is_err());
    }

    #[test]
    fn peers_are_policies_of_their_own() {
        for p in Policy::PEERS {
            if let Some(kind) = p.peer() {
                assert_eq!(kind.name(), p.name());
            }
            assert!(p.is_peer());
            assert_eq!(Policy::parse(p.name()).unwrap(), p);
            assert!(!p.filter() && !p.events());
        }
        assert!(Policy::COMPARED.iter().all(|p| !p.is_peer()));
    }

    #[test]
    fn network_and_pd_configs_are_ones_the_filter_accepts() {
        let addrs: Vec<String> = (0..4).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        let parse = |topo: &Topology, p: Policy| {
            let v = Cluster::filter_config(topo, p, &addrs).unwrap();
            kvroute_core::decision::config::FilterConfig::from_json(v.to_string().as_bytes())
                .unwrap_or_else(|e| panic!("{}: {e}", p.name()));
            v
        };
        let two = crate::preset::preset("two-site", 1).unwrap().topology;
        assert!(parse(&two, Policy::Kvroute)["topology"]["workers"].is_object());
        assert!(parse(&two, Policy::KvroutePrefixOnly).get("topology").is_none(), "blind");
        assert_eq!(parse(&two, Policy::KvrouteTtftOnly)["stream_stall_weight"], 0.0);
        assert!(parse(&two, Policy::Kvroute).get("stream_stall_weight").is_none());
        assert_eq!(parse(&two, Policy::KvrouteNoGrowth)["stream_growth_tokens"], 0);
        assert!(parse(&two, Policy::Kvroute).get("stream_growth_tokens").is_none());
        assert_eq!(parse(&two, Policy::KvrouteLoadOnly)["knowledge"]["cache_aware"], false);
        let pd = crate::preset::preset("pd", 1).unwrap().topology;
        let v = parse(&pd, Policy::Kvroute);
        assert_eq!(v["models"][0]["prefill_workers"], json!(addrs[..2]));
        assert_eq!(v["models"][0]["workers"], json!(addrs[2..]));
        let v = parse(&pd, Policy::KvrouteNoPd);
        assert!(v["models"][0].get("prefill_workers").is_none());
        assert_eq!(v["models"][0]["workers"], json!(addrs[2..]), "decode workers only");
        let v = parse(&pd, Policy::KvrouteLoadOnly);
        assert_eq!(v["models"][0]["prefill_workers"], json!(addrs[..2]), "the same P/D config");
        assert_eq!(split_pool(&Topology::default(), &addrs).0, addrs, "no net: one pool");
    }

    #[test]
    fn the_block_size_a_worker_announces() {
        let m = "# TYPE vllm:cache_config_info gauge\n\
                 vllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"True\"} 1\n";
        assert_eq!(parse_block_size(m), Some(32));
        assert_eq!(parse_block_size("vllm:num_requests_running 1\n"), None);
        assert_eq!(parse_block_size("vllm:cache_config_info{block_size=\"x\"} 1"), None);
    }

    #[test]
    fn the_ladder_adds_one_ingredient_per_rung() {
        assert!(Policy::LADDER.windows(2).all(|w| w[0] != w[1]));
        assert!(!Policy::LeastRequest.filter() && Policy::KvrouteLoadOnly.filter());
        assert!(Policy::Kvroute.events() && !Policy::KvrouteHistory.events());
        assert_eq!(Policy::parse("kvroute-no-events").unwrap(), Policy::KvrouteHistory);
        for p in Policy::COMPARED {
            assert_eq!(Policy::parse(p.name()).unwrap(), p);
        }
    }
}
