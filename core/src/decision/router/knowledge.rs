//! The mutable half of a router: what it knows about workers, changing per request and per
//! snapshot — the block index, config verdicts, reported load, and which LoRA adapters each
//! worker has loaded (with the base model it serves, from which adapter names map to a base).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use foldhash::fast::RandomState as Fast;

use crate::decision::worker::ByKey;

use crate::decision::config::FilterConfig;
use crate::decision::index::{EventChange, KnowledgeIndex, PrefixMatch};
use crate::decision::load::{worker_key, WorkerLoad};
use crate::decision::lookahead::HotPrefixes;
use crate::decision::peers::PeerView;
use crate::decision::worker::WorkerName;
use crate::wire::delta::Delta;
use crate::wire::journal::{JournalEntry, Source};
use crate::wire::peers::PeerSection;
use crate::wire::snapshot::{ModelInfo, Snapshot, SnapshotLoad};

/// Other replicas' latest credit stamps kept per worker (see `Knowledge::instant_shared`).
const PEER_STAMPS: usize = 8;
/// Most workers whose peer credit stamps are kept (a pool is far smaller).
const MAX_STAMPED: usize = 1 << 16;

/// What a worker serves, as it reported (through the updater).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Serving {
    /// Its base model; empty while not known.
    model: String,
    /// Loaded adapters, sorted and deduplicated.
    adapters: Vec<String>,
}

/// One thread's knowledge of every worker.
pub struct Knowledge {
    index: KnowledgeIndex,
    /// Workers whose announced config does not match kvroute's: no cache credit. This set,
    /// `reported` and the down sets are keyed by [`worker_key`], so that a decision looks a
    /// worker up by [`WorkerName::key`] without reading its name.
    incompatible: HashSet<u64, ByKey>,
    /// What each worker last reported about its load (via the updater).
    reported: HashMap<u64, SnapshotLoad, ByKey>,
    max_load_age_ms: u64,
    serving: HashMap<String, Serving, Fast>,
    /// Adapter -> base model -> how many workers report that pair.
    adapter_bases: HashMap<String, BTreeMap<String, u32>>,
    /// The models (and bundle fingerprints) the updater last named.
    models: Vec<ModelInfo>,
    /// Recent routing decisions per prefix, for the look-ahead.
    hot: HotPrefixes,
    /// Other Envoy replicas' in-flight load (their credits go to the index as `Peer`).
    peers: PeerView,
    /// Moving average of the uncached tokens of this thread's decisions (`None` before the
    /// first): what a waiting request kvroute did not send is assumed to cost.
    typical_uncached: std::cell::Cell<Option<f64>>,
    /// When the updater stamped the latest routing credits other replicas sent for each worker
    /// (its last [`PEER_STAMPS`], by worker key): whether a request raced another replica's.
    peer_stamps: HashMap<u64, VecDeque<u64>, ByKey>,
    /// The updater's pool, when its snapshots list it whole ([`Snapshot::pool`]): each
    /// member's base model (empty while the updater has not identified it).
    pool: Option<BTreeMap<String, String>>,
    /// `pool` by base model: each model's members, sorted.
    members: HashMap<String, Vec<WorkerName>>,
    /// Workers to leave out of decisions now (failed requests, see `shared::health`).
    down: HashSet<u64, ByKey>,
    /// Workers the updater reports down (Envoy's health checking or outlier detection dropped
    /// them: [`Snapshot::down`]).
    updater_down: HashSet<u64, ByKey>,
}

impl Knowledge {
    pub fn new(cfg: &FilterConfig) -> Knowledge {
        Knowledge {
            index: KnowledgeIndex::with_trust(cfg.index.limits(), cfg.knowledge.trust()),
            incompatible: HashSet::default(),
            reported: HashMap::default(),
            max_load_age_ms: cfg.knowledge.max_load_age_ms,
            serving: HashMap::default(),
            adapter_bases: HashMap::new(),
            models: Vec::new(),
            hot: HotPrefixes::new(cfg.lookahead),
            peers: PeerView::default(),
            typical_uncached: std::cell::Cell::new(None),
            peer_stamps: HashMap::default(),
            pool: None,
            members: HashMap::new(),
            down: HashSet::default(),
            updater_down: HashSet::default(),
        }
    }

    /// The members of `model`'s pool as the updater listed them, when it lists the whole pool
    /// and `model` has any; `None`: the configured pool applies (no pool from the updater, or
    /// none of its workers serves `model` yet). A worker joins once the updater identified
    /// its model.
    pub fn pool_members(&self, model: &str) -> Option<&[WorkerName]> {
        self.members.get(model).map(Vec::as_slice).filter(|m| !m.is_empty())
    }

    /// Every member of the updater's pools, across models (a worker may repeat).
    pub fn all_pool_members(&self) -> impl Iterator<Item = &str> {
        self.members.values().flatten().map(WorkerName::as_str)
    }

    /// Replaces the workers left out of decisions (see `shared::health`).
    pub fn set_down<'a>(&mut self, down: impl IntoIterator<Item = &'a str>) {
        self.down.clear();
        self.down.extend(down.into_iter().map(worker_key));
    }

    /// Whether `worker` is left out of decisions now: it failed requests, or Envoy's health
    /// checking dropped it (as the updater reports).
    pub fn is_down(&self, worker: &str) -> bool {
        self.is_down_key(worker_key(worker))
    }

    /// [`Knowledge::is_down`] of the worker whose [`worker_key`] is `key`.
    pub fn is_down_key(&self, key: u64) -> bool {
        // Both sets are usually empty: then no key is hashed.
        (!self.down.is_empty() && self.down.contains(&key))
            || (!self.updater_down.is_empty() && self.updater_down.contains(&key))
    }

    /// Whether the updater's snapshots list the whole pool.
    #[cfg(test)]
    pub(crate) fn has_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// Forgets everything known about `worker` (it left the pool).
    fn forget(&mut self, worker: &str) {
        self.index.clear_worker(worker);
        let key = worker_key(worker);
        self.reported.remove(&key);
        self.incompatible.remove(&key);
        self.peer_stamps.remove(&key);
        if let Some(prev) = self.serving.remove(worker) {
            self.count_bases(&prev, false);
        }
    }

    fn rebuild_members(&mut self) {
        self.members.clear();
        for (w, model) in self.pool.iter().flatten() {
            if !model.is_empty() {
                self.members.entry(model.clone()).or_default().push(w.into());
            }
        }
    }

    /// The leading `hashes` known on `worker` (none for an incompatible worker).
    pub fn prefix_match(&self, worker: &str, hashes: &[u64], now_ms: u64) -> PrefixMatch {
        if self.incompatible.contains(&worker_key(worker)) {
            return PrefixMatch::default();
        }
        self.index.prefix_match(worker, hashes, now_ms)
    }

    /// [`Knowledge::prefix_match`] of each of `workers` (`out[i]` for `workers[i]`), each
    /// prompt block looked up once for all of them; empty when none matches (see
    /// [`KnowledgeIndex::prefix_matches`](crate::decision::index::KnowledgeIndex::prefix_matches)).
    pub fn prefix_matches<'w>(
        &self,
        workers: impl Iterator<Item = &'w WorkerName> + Clone,
        hashes: &[u64],
        now_ms: u64,
    ) -> Vec<PrefixMatch> {
        let mut out =
            self.index.prefix_matches(workers.clone().map(WorkerName::key), hashes, now_ms);
        if !self.incompatible.is_empty() {
            for (w, m) in workers.zip(out.iter_mut()) {
                if self.incompatible.contains(&w.key()) {
                    *m = PrefixMatch::default();
                }
            }
        }
        out
    }

    /// Whether any worker is down (after failed requests, or by the updater's word).
    pub fn any_down(&self) -> bool {
        !self.down.is_empty() || !self.updater_down.is_empty()
    }

    /// Event knowledge exists but the updater has not confirmed it within its age limit.
    pub fn events_stale(&self, now_ms: u64) -> bool {
        self.index.event_state(now_ms) == (true, false)
    }

    /// What `worker` last reported about its load, if younger than the allowed age.
    pub fn reported_load(&self, worker: &str, now_ms: u64) -> Option<SnapshotLoad> {
        self.reported_load_key(worker_key(worker), now_ms)
    }

    /// [`Knowledge::reported_load`] of the worker whose [`worker_key`] is `key`.
    pub fn reported_load_key(&self, key: u64, now_ms: u64) -> Option<SnapshotLoad> {
        self.reported
            .get(&key)
            .filter(|r| now_ms.saturating_sub(r.observed_at_ms) <= self.max_load_age_ms)
            .copied()
    }

    /// Records the adapters `worker` has loaded and the base model it serves (an empty base:
    /// not known, its adapters then name no base).
    pub fn set_adapters(&mut self, worker: &str, base_model: &str, adapters: &[String]) {
        let mut adapters = adapters.to_vec();
        adapters.sort();
        adapters.dedup();
        let next = Serving { model: base_model.to_owned(), adapters };
        let prev = self.serving.insert(worker.to_owned(), next.clone()).unwrap_or_default();
        self.count_bases(&prev, false);
        self.count_bases(&next, true);
    }

    fn count_bases(&mut self, s: &Serving, add: bool) {
        if s.model.is_empty() {
            return;
        }
        for a in &s.adapters {
            let bases = self.adapter_bases.entry(a.clone()).or_default();
            let n = bases.entry(s.model.clone()).or_default();
            *n = if add { n.saturating_add(1) } else { n.saturating_sub(1) };
            if *n == 0 {
                bases.remove(&s.model);
            }
            if bases.is_empty() {
                self.adapter_bases.remove(a);
            }
        }
    }

    /// Whether `worker` reported `adapter` loaded.
    pub fn has_adapter(&self, worker: &str, adapter: &str) -> bool {
        self.serving
            .get(worker)
            .is_some_and(|s| s.adapters.binary_search_by(|a| a.as_str().cmp(adapter)).is_ok())
    }

    /// The base model workers report `adapter` under (the most reported one if they disagree).
    pub fn adapter_base(&self, adapter: &str) -> Option<&str> {
        let bases = self.adapter_bases.get(adapter)?;
        let (base, _) = bases.iter().max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))?;
        Some(base.as_str())
    }

    /// The models (and bundle fingerprints) the updater last named.
    pub fn updater_models(&self) -> &[ModelInfo] {
        &self.models
    }

    /// Takes in an updater snapshot: the model list and each worker's event view, config
    /// verdict, load and adapters.
    pub fn apply_snapshot(&mut self, snap: &Snapshot) {
        self.apply_peers(snap.peers.as_ref(), true);
        self.models.clone_from(&snap.models);
        self.updater_down = snap.down.iter().map(|w| worker_key(w)).collect();
        if snap.pool {
            // Whoever is not listed left the pool: forgotten, with its routing credit.
            let listed: HashSet<&str> = snap.workers.iter().map(|w| w.worker.as_str()).collect();
            let known = self.serving.keys().chain(self.pool.iter().flat_map(|p| p.keys()));
            let gone: Vec<String> =
                known.filter(|w| !listed.contains(w.as_str())).cloned().collect();
            for w in gone {
                self.forget(&w);
            }
            let pool = snap.workers.iter().map(|w| (w.worker.clone(), w.model.clone()));
            self.pool = Some(pool.collect());
        } else {
            self.pool = None;
        }
        self.rebuild_members();
        for w in &snap.workers {
            self.set_reported(&w.worker, w.load);
            self.verdict(&w.worker, w.compatible);
            self.set_adapters(&w.worker, &w.model, &w.adapters);
            if w.compatible {
                self.index.set_events(&w.worker, &w.gpu, &w.offloaded, w.observed_at_ms);
            } else {
                self.index.set_events(&w.worker, &[], &[], w.observed_at_ms);
            }
        }
    }

    /// Takes in a delta of the updater's knowledge (the caller checks that it follows the
    /// version last applied).
    pub fn apply_delta(&mut self, d: &Delta) {
        self.apply_peers(d.peers.as_ref(), false);
        if let Some(models) = &d.models {
            self.models.clone_from(models);
        }
        if let Some(down) = &d.down {
            self.updater_down = down.iter().map(|w| worker_key(w)).collect();
        }
        for w in &d.removed {
            self.forget(w);
        }
        // The members per model are rebuilt only when the pool changes (a worker joins, leaves
        // or changes model): most deltas carry loads, and a rebuild reads the whole pool.
        let mut members_moved = !d.removed.is_empty() || d.pool != self.pool.is_some();
        if d.pool {
            // A pool delta over a partial view (not sent by the updater, which answers a
            // change of kind with a full snapshot): every worker known is taken as a member.
            let serving = &self.serving;
            let pool = self.pool.get_or_insert_with(|| {
                serving.iter().map(|(w, s)| (w.clone(), s.model.clone())).collect()
            });
            for w in &d.removed {
                pool.remove(w);
            }
        } else {
            self.pool = None;
        }
        for w in &d.workers {
            self.set_reported(&w.worker, w.load);
            self.verdict(&w.worker, w.compatible);
            if w.model.is_some() || w.adapters.is_some() {
                let prev = self.serving.get(&w.worker).cloned().unwrap_or_default();
                let model = w.model.as_deref().unwrap_or(&prev.model);
                self.set_adapters(
                    &w.worker,
                    model,
                    w.adapters.as_deref().unwrap_or(&prev.adapters),
                );
            }
            let change = if w.compatible {
                EventChange {
                    // A verdict flipping back to compatible comes as a reset with the whole
                    // view (see `WorkerDelta::between`).
                    reset: w.reset,
                    gpu_add: &w.gpu.add,
                    gpu_remove: &w.gpu.remove,
                    offloaded_add: &w.offloaded.add,
                    offloaded_remove: &w.offloaded.remove,
                }
            } else {
                EventChange { reset: true, ..Default::default() }
            };
            self.index.change_events(&w.worker, change, w.observed_at_ms);
            if let Some(pool) = self.pool.as_mut() {
                let model = self.serving.get(&w.worker).map_or("", |s| s.model.as_str());
                if pool.get(&w.worker).map(String::as_str) != Some(model) {
                    pool.insert(w.worker.clone(), model.to_owned());
                    members_moved = true;
                }
            }
        }
        if members_moved {
            self.rebuild_members();
        }
    }

    /// Credits other replicas' routed blocks (source `Peer`) and takes in their loads.
    fn apply_peers(&mut self, section: Option<&PeerSection>, full: bool) {
        let Some(section) = section else { return };
        if full {
            self.peer_stamps.clear();
        }
        for c in self.peers.apply(section, full) {
            self.hot.record(&c.hashes, c.at_ms);
            self.index.insert(&c.worker, &c.hashes, Source::Peer, c.at_ms);
            let key = worker_key(&c.worker);
            if self.peer_stamps.len() >= MAX_STAMPED && !self.peer_stamps.contains_key(&key) {
                continue;
            }
            let stamps = self.peer_stamps.entry(key).or_default();
            if stamps.len() >= PEER_STAMPS {
                stamps.pop_front();
            }
            stamps.push_back(c.at_ms);
        }
    }

    /// Whether a request sent to `worker` at `decided_ms` may have raced another request
    /// there that its decision could not count: one another thread of this Envoy sent in the
    /// same millisecond (`own` holds this request too, so two or more), or one another replica
    /// routed there whose credit the updater stamped within `SHARED_INSTANT_MS` of it (see
    /// [`crate::decision::calib::CalibrationConfig::skip_shared_instants`]).
    pub fn instant_shared(
        &self,
        worker: &WorkerName,
        decided_ms: u64,
        own: &dyn crate::decision::load::LoadSource,
    ) -> bool {
        if own.started_within(worker, decided_ms.saturating_sub(1), decided_ms) > 1 {
            return true;
        }
        let near = crate::decision::calib::SHARED_INSTANT_MS;
        let (from, to) = (decided_ms.saturating_sub(near), decided_ms.saturating_add(near));
        self.peer_stamps
            .get(&worker.key())
            .is_some_and(|s| s.iter().any(|t| (from..=to).contains(t)))
    }

    /// This replica's id, so that its own decisions coming back from the updater are ignored.
    pub fn set_replica(&mut self, replica: u64) {
        self.peers.set_replica(replica);
    }

    /// Other replicas' in-flight work on `worker` (see [`PeerView::load`]).
    pub fn peer_load(&self, worker: &str, now_ms: u64) -> WorkerLoad {
        self.peers.load(worker_key(worker), now_ms)
    }

    /// [`Knowledge::peer_load`] of the worker whose [`worker_key`] is `key`.
    pub fn peer_load_key(&self, key: u64, now_ms: u64) -> WorkerLoad {
        self.peers.load(key, now_ms)
    }

    /// When the updater last scraped `worker`'s load, however old (`None`: never).
    pub fn load_seen_at(&self, worker: &str) -> Option<u64> {
        self.reported.get(&worker_key(worker)).map(|r| r.observed_at_ms)
    }

    fn set_reported(&mut self, worker: &str, load: Option<SnapshotLoad>) {
        match load {
            Some(l) => self.reported.insert(worker_key(worker), l),
            None => self.reported.remove(&worker_key(worker)),
        };
    }

    fn verdict(&mut self, worker: &str, compatible: bool) {
        if compatible {
            self.incompatible.remove(&worker_key(worker));
        } else {
            self.incompatible.insert(worker_key(worker));
        }
    }

    /// Records that the updater confirmed its knowledge at `at_ms`.
    pub fn events_checked(&mut self, at_ms: u64) {
        self.index.events_checked(at_ms);
    }

    /// Credits `worker` with blocks it is about to compute or was seen to hold.
    pub fn observe(&mut self, worker: &str, hashes: &[u64], source: Source, now_ms: u64) {
        self.index.insert(worker, hashes, source, now_ms);
    }

    /// Grows the index's large tables ahead, off the request path (see
    /// [`KnowledgeIndex::make_room`]); how many grew.
    pub fn make_room(&mut self) -> usize {
        self.index.make_room()
    }

    /// Applies a journal entry: a credit, or a routing credit taken back.
    pub fn apply_journal(&mut self, e: &JournalEntry) {
        if e.retract {
            self.index.retract_routed(&e.worker, &e.hashes);
        } else {
            if e.source == Source::Routed {
                self.hot.record(&e.hashes, e.at_ms);
            }
            self.observe(&e.worker, &e.hashes, e.source, e.at_ms);
        }
    }

    /// The uncached tokens a typical request of this thread's recent decisions computes (0
    /// before any): the cost given to a waiting request a worker reports but kvroute did not
    /// send (another replica's, or a client's that bypassed kvroute).
    pub fn typical_uncached_tokens(&self) -> u64 {
        self.typical_uncached.get().map_or(0, |t| t.round() as u64)
    }

    /// Counts a decision's uncached tokens into the typical request (moving average over
    /// about the last 32 decisions).
    pub fn note_uncached_tokens(&self, tokens: u64) {
        let t = tokens as f64;
        let next = self.typical_uncached.get().map_or(t, |avg| avg + (t - avg) / 32.0);
        self.typical_uncached.set(Some(next));
    }

    /// Recent routing decisions for the first `blocks` blocks of a prompt (see
    /// [`HotPrefixes::expected`]), and the look-ahead's configuration.
    pub fn hot(&self) -> &HotPrefixes {
        &self.hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::snapshot::SnapshotWorker;
    use serde_json::json;

    fn knowledge() -> Knowledge {
        let cfg = json!({"models": [{"name": "m", "workers": ["127.0.0.1:1"]}]});
        Knowledge::new(&FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap())
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn adapters_map_to_the_base_their_workers_serve() {
        let mut k = knowledge();
        k.set_adapters("w1", "base", &names(&["sql", "law", "sql"]));
        k.set_adapters("w2", "base", &names(&["sql"]));
        k.set_adapters("w3", "", &names(&["orphan"]));
        assert!(k.has_adapter("w1", "law") && k.has_adapter("w2", "sql"));
        assert!(!k.has_adapter("w2", "law") && !k.has_adapter("w9", "sql"));
        assert_eq!(k.adapter_base("sql"), Some("base"));
        assert_eq!(k.adapter_base("orphan"), None, "a worker of unknown base names no base");
        k.set_adapters("w1", "base", &[]);
        assert_eq!(k.adapter_base("law"), None, "unloaded everywhere: forgotten");
        assert_eq!(k.adapter_base("sql"), Some("base"));
        k.set_adapters("w4", "other", &names(&["sql"]));
        k.set_adapters("w5", "other", &names(&["sql"]));
        assert_eq!(k.adapter_base("sql"), Some("other"), "the most reported base wins");
    }

    #[test]
    fn a_pool_snapshot_lists_the_members_and_removals_forget_workers() {
        let mut k = knowledge();
        let w = |name: &str, model: &str| SnapshotWorker {
            worker: name.into(),
            compatible: true,
            model: model.into(),
            gpu: vec![1, 2],
            adapters: names(&["a"]),
            ..Default::default()
        };
        let s1 = Snapshot {
            version: 1,
            workers: vec![w("10.0.0.1:80", "m"), w("10.0.0.2:80", "m"), w("10.0.0.3:80", "")],
            ..Default::default()
        };
        k.apply_snapshot(&s1);
        assert!(!k.has_pool() && k.pool_members("m").is_none(), "a partial view: no pool");
        let s1 = Snapshot { pool: true, ..s1 };
        k.apply_snapshot(&s1);
        k.events_checked(0);
        assert_eq!(k.pool_members("m").unwrap(), names(&["10.0.0.1:80", "10.0.0.2:80"]));
        assert!(k.pool_members("other").is_none());
        assert_eq!(k.prefix_match("10.0.0.2:80", &[1, 2], 0).blocks, 2);
        // 2 leaves, 3 is identified, 4 joins: as a delta.
        let s2 = Snapshot {
            version: 2,
            workers: vec![w("10.0.0.1:80", "m"), w("10.0.0.3:80", "m"), w("10.0.0.4:80", "m")],
            ..s1.clone()
        };
        let d = Delta::between(&s1, &s2);
        assert_eq!(d.removed, names(&["10.0.0.2:80"]));
        k.apply_delta(&d);
        let want = names(&["10.0.0.1:80", "10.0.0.3:80", "10.0.0.4:80"]);
        assert_eq!(k.pool_members("m").unwrap(), want);
        assert_eq!(k.prefix_match("10.0.0.2:80", &[1, 2], 0).blocks, 0, "forgotten");
        assert!(!k.has_adapter("10.0.0.2:80", "a"));
        // A full snapshot without 1: forgotten too.
        let s3 = Snapshot { version: 3, workers: s2.workers[1..].to_vec(), ..s2 };
        k.apply_snapshot(&s3);
        assert_eq!(k.pool_members("m").unwrap(), names(&["10.0.0.3:80", "10.0.0.4:80"]));
        assert_eq!(k.prefix_match("10.0.0.1:80", &[1, 2], 0).blocks, 0);
        // Everyone gone: the configured pool applies again.
        k.apply_delta(&Delta::between(
            &s3,
            &Snapshot { version: 4, workers: vec![], ..s3.clone() },
        ));
        assert!(k.has_pool() && k.pool_members("m").is_none());
    }

    /// Members follow the pool through deltas as they do through full snapshots, whether a
    /// delta moves the pool (joins, leaves, model changes) or only loads.
    #[test]
    fn pool_members_after_deltas_equal_those_of_the_snapshot() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let models = ["m", "n", ""];
        for _history in 0..20 {
            let mut k = knowledge();
            let mut prev = Snapshot { pool: true, ..Default::default() };
            k.apply_snapshot(&prev);
            for v in 1..40u64 {
                let mut s = Snapshot { version: v, ..prev.clone() };
                s.pool = next(10) != 0;
                match next(4) {
                    0 => {
                        let name = format!("10.0.0.{}:80", next(12));
                        if !s.workers.iter().any(|w| w.worker == name) {
                            s.workers.push(SnapshotWorker {
                                worker: name,
                                compatible: true,
                                model: models[next(3) as usize].into(),
                                ..Default::default()
                            });
                            s.workers.sort_by(|a, b| a.worker.cmp(&b.worker));
                        }
                    }
                    1 if !s.workers.is_empty() => {
                        s.workers.remove(next(s.workers.len() as u64) as usize);
                    }
                    2 if !s.workers.is_empty() => {
                        let i = next(s.workers.len() as u64) as usize;
                        s.workers[i].model = models[next(3) as usize].into();
                    }
                    _ => {
                        for w in &mut s.workers {
                            w.observed_at_ms = v;
                        }
                    }
                }
                // A delta over a partial view is not what the updater sends: whole instead.
                match prev.pool && s.pool {
                    true => k.apply_delta(&Delta::between(&prev, &s)),
                    false => k.apply_snapshot(&s),
                }
                let mut whole = knowledge();
                whole.apply_snapshot(&s);
                for m in models {
                    assert_eq!(
                        k.pool_members(m),
                        whole.pool_members(m),
                        "version {v}, model {m:?}"
                    );
                }
                assert_eq!(k.has_pool(), whole.has_pool());
                prev = s;
            }
        }
    }

    #[test]
    fn snapshots_and_deltas_carry_adapters_and_models() {
        let mut k = knowledge();
        let w = |adapters: &[&str]| SnapshotWorker {
            worker: "127.0.0.1:1".into(),
            compatible: true,
            model: "m".into(),
            adapters: names(adapters),
            ..Default::default()
        };
        let s1 = Snapshot {
            version: 1,
            models: vec![ModelInfo { name: "m".into(), fingerprint: 7, block_size: 16 }],
            workers: vec![w(&["a"])],
            ..Default::default()
        };
        k.apply_snapshot(&s1);
        assert!(k.has_adapter("127.0.0.1:1", "a"));
        assert_eq!(k.updater_models()[0].fingerprint, 7);
        let s2 = Snapshot { version: 2, workers: vec![w(&["b"])], ..s1.clone() };
        k.apply_delta(&Delta::between(&s1, &s2));
        assert!(k.has_adapter("127.0.0.1:1", "b") && !k.has_adapter("127.0.0.1:1", "a"));
        assert_eq!(k.adapter_base("b"), Some("m"));
    }
}
