//! The updater's shared state: every worker's knowledge, which model it serves (and so which
//! cache domain its events are hashed in), the models' block sizes, and the snapshot version
//! that moves whenever any of it changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use kvroute_core::decision::topology::Labels;
use kvroute_core::wire::snapshot::{ModelInfo, Snapshot, SnapshotWorker as Wire, WorkerPlacement};
use tokio::sync::Notify;

use crate::decode::Tier;
use crate::ingest::{DomainBase, WorkerKnowledge};
use crate::limits::Limits;
use crate::models::Models;
use crate::peers::{PeerStore, Refused};
use crate::publish::{Answer, Changes, Publisher, RingLimits};
use crate::worker_check::{AlignmentOutcome, AlignmentVerdict, ServedModels};

/// vLLM's default KV block size: used for a worker that announces none (SGLang, older
/// engines) of a model with no configured or learned block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Per-worker entry.
#[derive(Debug, Default)]
pub struct WorkerRecord {
    pub knowledge: WorkerKnowledge,
    pub connected: bool,
    /// False when the worker's announced config does not match kvroute's.
    pub compatible: bool,
    /// Why it is incompatible, or the last check's error.
    pub alignment: Option<String>,
    /// Block-size mismatches in events seen by the last alignment pass.
    pub mismatches_seen: u64,
    /// Whether Envoy's health checks keep this worker in the pool (true without an Envoy).
    pub member: bool,
    /// What the worker last reported about its load.
    pub load: Option<crate::engine_metrics::EngineLoad>,
    /// The cache domain its events are hashed in: its model's, once the alignment check
    /// identified a configured model. Until then its events are not indexed.
    pub domain: Option<DomainBase>,
    /// Its base model as `/v1/models` lists it (configured or not).
    pub model: Option<String>,
    /// Its loaded LoRA adapters, sorted and bounded.
    pub adapters: Vec<String>,
    /// Woken when the worker's domain changed: its follower fetches the whole replay buffer
    /// again, so the blocks are re-hashed in the new domain.
    pub resync: Arc<Notify>,
    /// Woken to check the worker's alignment now (its base model changed).
    pub align_now: Arc<Notify>,
    /// Where it runs, as discovery or the configuration last said (none known: all `None`).
    pub labels: Labels,
    /// When discovery last handed over `labels` (unix ms; 0: never).
    pub labels_seen_ms: u64,
}

impl WorkerRecord {
    /// Moves the worker to another cache domain: what was indexed is forgotten and rebuilt
    /// from the worker's replay buffer.
    fn set_domain(&mut self, domain: Option<DomainBase>) {
        if self.domain == domain {
            return;
        }
        self.domain = domain;
        self.knowledge.clear();
        self.knowledge.next_seq = None;
        self.knowledge.last_applied = None;
        self.resync.notify_one();
    }
}

#[derive(Debug)]
pub struct State {
    pub limits: Limits,
    models: Arc<Models>,
    /// Set when every worker has one fixed domain (no models to identify them by).
    fixed: Option<DomainBase>,
    /// Woken (all waiters) whenever knowledge changed: long polls answer at once.
    changed: Notify,
    inner: Mutex<Inner>,
}

/// What [`State::observe`] shows.
#[derive(Debug)]
pub struct Observed<'a> {
    /// The published snapshot version.
    pub version: u64,
    pub workers: &'a BTreeMap<String, WorkerRecord>,
    /// Workers that joined / left the pool since the start.
    pub joined: u64,
    pub left: u64,
    pub peers: &'a PeerStore,
}

#[derive(Debug)]
struct Inner {
    workers: BTreeMap<String, WorkerRecord>,
    /// Workers changed since the last publication.
    dirty: BTreeSet<String>,
    /// Workers whose scraped load alone changed since the last publication.
    load_dirty: BTreeSet<String>,
    /// When loads were last published (unix ms): loads wait for
    /// [`Limits::load_publish_ms`] after it.
    loads_published_ms: u64,
    /// Block sizes learned from workers, for models without a configured one.
    learned: BTreeMap<String, u32>,
    /// The model list changed since the last publication.
    models_dirty: bool,
    publisher: Publisher,
    /// Other Envoy replicas' recent decisions.
    peers: PeerStore,
    /// Workers that left the pool since the last publication.
    removed: BTreeSet<String>,
    /// Some worker's placement labels were seen since the last publication.
    placements_dirty: bool,
    /// Workers that joined / left the pool since the start.
    joined: u64,
    left: u64,
}

impl State {
    /// Every worker hashed in one fixed `domain` (tests and tools that follow a known model).
    pub fn new(domain: DomainBase, workers: impl IntoIterator<Item = String>) -> State {
        State::with_limits(domain, workers, Limits::default())
    }

    /// As [`State::new`], with every worker's knowledge bounded by `limits`.
    pub fn with_limits(
        domain: DomainBase,
        workers: impl IntoIterator<Item = String>,
        limits: Limits,
    ) -> State {
        State::build(Arc::new(Models::default()), Some(domain), workers, limits)
    }

    /// Workers of any of `models`: each one's model (and so its domain) is learned by the
    /// alignment check; until then it is incompatible and its events are not indexed.
    pub fn for_models(
        models: Arc<Models>,
        workers: impl IntoIterator<Item = String>,
        limits: Limits,
    ) -> State {
        State::build(models, None, workers, limits)
    }

    /// A new worker's entry: of the fixed domain, else not identified yet.
    fn entry(fixed: Option<&DomainBase>, limits: &Limits) -> WorkerRecord {
        let knowledge = WorkerKnowledge::with_limits(limits.blocks);
        match fixed {
            Some(domain) => WorkerRecord {
                compatible: true,
                member: true,
                knowledge,
                domain: Some(domain.clone()),
                model: Some(domain.model.clone()),
                ..Default::default()
            },
            None => WorkerRecord {
                compatible: false,
                alignment: Some("not checked yet".into()),
                member: true,
                knowledge,
                ..Default::default()
            },
        }
    }

    fn build(
        models: Arc<Models>,
        fixed: Option<DomainBase>,
        workers: impl IntoIterator<Item = String>,
        limits: Limits,
    ) -> State {
        let workers: BTreeMap<String, WorkerRecord> =
            workers.into_iter().map(|w| (w, State::entry(fixed.as_ref(), &limits))).collect();
        let dirty = workers.keys().cloned().collect();
        let publisher = Publisher::new(now_ms(), RingLimits::default());
        let peers = PeerStore::new(limits.peers);
        let inner = Inner {
            workers,
            dirty,
            load_dirty: BTreeSet::new(),
            learned: BTreeMap::new(),
            models_dirty: true,
            publisher,
            peers,
            removed: BTreeSet::new(),
            placements_dirty: false,
            joined: 0,
            left: 0,
            loads_published_ms: 0,
        };
        State { limits, models, fixed, changed: Notify::new(), inner: Mutex::new(inner) }
    }

    /// Says that the worker list is the whole pool (membership is discovered): snapshots then
    /// carry the pool flag and deltas the workers removed (to callers that ask, `pool=1`).
    pub fn set_pool(&self, pool: bool) {
        let mut inner = self.lock();
        if inner.publisher.set_pool(pool) {
            self.changed.notify_waiters();
        }
    }

    /// Whether `worker` is known (in the pool).
    pub fn knows(&self, worker: &str) -> bool {
        self.lock().workers.contains_key(worker)
    }

    /// The workers known now, by name.
    pub fn workers(&self) -> Vec<String> {
        self.lock().workers.keys().cloned().collect()
    }

    /// Adds a worker (a new member of the pool), not identified yet; false if it is known.
    pub fn add_worker(&self, worker: &str) -> bool {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.workers.contains_key(worker) {
            return false;
        }
        let entry = State::entry(self.fixed.as_ref(), &self.limits);
        inner.workers.insert(worker.to_owned(), entry);
        inner.removed.remove(worker);
        inner.joined += 1;
        inner.dirty.insert(worker.to_owned());
        self.changed.notify_waiters();
        true
    }

    /// Removes a worker that left the pool: what is known of it goes at once, and the next
    /// snapshot neither lists it nor credits it; false if it was not known.
    pub fn remove_worker(&self, worker: &str) -> bool {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.workers.remove(worker).is_none() {
            return false;
        }
        inner.dirty.remove(worker);
        inner.removed.insert(worker.to_owned());
        inner.left += 1;
        self.changed.notify_waiters();
        true
    }

    /// Records where `worker` runs, as seen at `now_ms` (discovery's answer or the configured
    /// labels): published to callers that ask (`placement=1`) with that time as its age. A
    /// worker with no label known, before and now, changes nothing; an unknown worker neither.
    pub fn set_labels(&self, worker: &str, labels: &Labels, now_ms: u64) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(e) = inner.workers.get_mut(worker) else { return };
        if labels_unknown(labels) && labels_unknown(&e.labels) {
            return;
        }
        e.labels.clone_from(labels);
        e.labels_seen_ms = now_ms;
        inner.placements_dirty = true;
        self.changed.notify_waiters();
    }

    /// Wakes when `worker`'s alignment should be checked now (see [`WorkerRecord::align_now`]).
    pub fn align_signal(&self, worker: &str) -> Option<Arc<Notify>> {
        self.lock().workers.get(worker).map(|e| Arc::clone(&e.align_now))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configured models (bundles and configured block sizes).
    pub fn models(&self) -> &Arc<Models> {
        &self.models
    }

    /// The cache domain `worker`'s events are hashed in, if known.
    pub fn domain_of(&self, worker: &str) -> Option<DomainBase> {
        self.lock().workers.get(worker).and_then(|e| e.domain.clone())
    }

    /// Wakes when `worker` moved to another domain (see [`WorkerRecord::resync`]).
    pub fn resync_signal(&self, worker: &str) -> Option<Arc<Notify>> {
        self.lock().workers.get(worker).map(|e| Arc::clone(&e.resync))
    }

    /// Counts a cap hit for `worker` (not a knowledge change: no new version).
    pub fn cap_hit(&self, worker: &str, cap: crate::limits::Cap) {
        self.cap_hits(worker, cap, 1);
    }

    /// Counts `n` hits of a cap for `worker`.
    pub fn cap_hits(&self, worker: &str, cap: crate::limits::Cap, n: u64) {
        if let Some(e) = self.lock().workers.get_mut(worker) {
            e.knowledge.stats.caps_hit.add(cap, n);
        }
    }

    /// Runs `f` on `worker`'s entry and moves the version.
    pub fn update<T>(&self, worker: &str, f: impl FnOnce(&mut WorkerRecord) -> T) -> Option<T> {
        let mut inner = self.lock();
        let out = inner.workers.get_mut(worker).map(f);
        if out.is_some() {
            inner.dirty.insert(worker.to_owned());
            self.changed.notify_waiters();
        }
        out
    }

    /// Records what `worker` reported about its load on a scrape. Only its head is published
    /// (see [`Changes::loads`]): its hash lists are not rebuilt for it. Loads wake the
    /// long polls at most once per [`Limits::load_publish_ms`] (see [`State::pace_loads`]).
    pub fn set_load(&self, worker: &str, load: crate::engine_metrics::EngineLoad) {
        let mut inner = self.lock();
        if let Some(e) = inner.workers.get_mut(worker) {
            e.load = Some(load);
            inner.load_dirty.insert(worker.to_owned());
            if self.loads_due(&inner, now_ms()) {
                self.changed.notify_waiters();
            }
        }
    }

    /// The workers marked changed since the last publication (tests).
    #[cfg(test)]
    fn dirty(&self) -> Vec<String> {
        self.lock().dirty.iter().cloned().collect()
    }

    /// Whether loads may be published at `now`.
    fn loads_due(&self, inner: &Inner, now: u64) -> bool {
        now >= inner.loads_published_ms.saturating_add(self.limits.load_publish_ms)
    }

    /// Wakes the long polls every [`Limits::load_publish_ms`] while scraped loads wait to be
    /// published (the scrapes themselves do not, within that time). Runs until the task is
    /// dropped; returns at once when loads are published as they come.
    pub async fn pace_loads(self: Arc<Self>) {
        let every = self.limits.load_publish_ms;
        if every == 0 {
            return;
        }
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(every));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let inner = self.lock();
            if !inner.load_dirty.is_empty() && self.loads_due(&inner, now_ms()) {
                self.changed.notify_waiters();
            }
        }
    }

    /// Takes another Envoy replica's report; waiting long polls answer with it at once.
    pub fn peer_report(
        &self,
        report: kvroute_core::wire::peers::PeerReport,
    ) -> Result<(), Refused> {
        let taken = self.lock().peers.report(report, now_ms());
        if taken.is_ok() {
            self.changed.notify_waiters();
        }
        taken
    }

    /// Counts a report refused before it could be decoded (too large, malformed).
    pub fn peer_refused(&self) {
        self.lock().peers.stats.refused += 1;
    }

    /// Resolves when knowledge may have changed after this call. Create it before checking
    /// the version, so that a change in between is not missed.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// Applies an alignment check: the worker's model, adapters, domain and verdict. A model's
    /// block size is the configured one, else the first one a compatible worker announced;
    /// workers announcing another are incompatible.
    pub fn apply_check(&self, worker: &str, outcome: AlignmentOutcome) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(e) = inner.workers.get_mut(worker) else {
            return;
        };
        inner.dirty.insert(worker.to_owned());
        self.changed.notify_waiters();
        let mismatches = e.knowledge.stats.block_size_mismatches;
        let new_mismatches = mismatches > e.mismatches_seen;
        e.mismatches_seen = mismatches;
        let mut verdict = outcome.verdict;
        if let AlignmentVerdict::Unknown(why) = verdict {
            e.alignment = Some(format!("check failed: {why}"));
            return;
        }
        if let (Some(served), None) = (&outcome.served, &self.fixed) {
            e.adapters.clone_from(&served.adapters);
            e.model.clone_from(&served.base);
            match served.base.as_deref().and_then(|b| self.models.get(b)) {
                None => e.set_domain(None),
                Some(m) => {
                    let want = m.block_size.or_else(|| inner.learned.get(&m.name).copied());
                    let block_size = match (outcome.announced_block_size, want) {
                        (Some(a), Some(w)) if !pages_fit(a, w) => {
                            if verdict == AlignmentVerdict::Compatible {
                                verdict = AlignmentVerdict::Incompatible(format!(
                                    "announced block size {a}, model '{}' uses {w}",
                                    m.name
                                ));
                            }
                            w
                        }
                        (Some(_), Some(w)) => w,
                        (Some(a), None) if verdict == AlignmentVerdict::Compatible => {
                            let a = block_size_for_pages(a);
                            inner.learned.insert(m.name.clone(), a);
                            inner.models_dirty = true;
                            a
                        }
                        (Some(a), None) => block_size_for_pages(a),
                        (None, w) => w.unwrap_or(DEFAULT_BLOCK_SIZE),
                    };
                    e.set_domain(Some(DomainBase {
                        model: m.name.clone(),
                        tokenizer_fingerprint: m.fingerprint(),
                        block_size,
                        lora_name: None,
                    }));
                }
            }
        } else if let (Some(d), Some(a)) = (&self.fixed, outcome.announced_block_size) {
            if !pages_fit(a, d.block_size) && verdict == AlignmentVerdict::Compatible {
                verdict = AlignmentVerdict::Incompatible(format!(
                    "announced block size {a}, kvroute uses {}",
                    d.block_size
                ));
            }
        }
        match verdict {
            _ if new_mismatches => {
                e.compatible = false;
                e.alignment = Some("events report a different block size".into());
            }
            AlignmentVerdict::Compatible => {
                e.compatible = true;
                e.alignment = None;
            }
            AlignmentVerdict::Incompatible(why) | AlignmentVerdict::Unknown(why) => {
                e.compatible = false;
                e.alignment = Some(why);
            }
        }
    }

    /// Applies a scrape of `worker`'s `/v1/models`: its adapters; a base model other than the
    /// one identified makes it incompatible until the alignment check (woken now) ran again.
    pub fn apply_served(&self, worker: &str, served: ServedModels) {
        // Every scrape asks; most answers repeat the last. Those change nothing: no new
        // version, and the worker's hash lists are not rebuilt for it.
        let same = self.lock().workers.get(worker).is_some_and(|e| {
            let model = self.fixed.is_some() || served.base.is_none() || e.model == served.base;
            model && e.adapters == served.adapters
        });
        if same {
            return;
        }
        if self.fixed.is_some() {
            self.update(worker, |e| e.adapters = served.adapters);
            return;
        }
        let changed = self.update(worker, |e| {
            e.adapters = served.adapters;
            if e.model == served.base || served.base.is_none() {
                return None;
            }
            if e.model.is_none() {
                // Not identified yet: the check can run now.
                e.model = served.base;
                return Some(Arc::clone(&e.align_now));
            }
            let shown = |m: &Option<String>| m.as_deref().unwrap_or("nothing").to_owned();
            e.compatible = false;
            e.alignment = Some(format!(
                "now serves '{}' (was '{}'): checking again",
                shown(&served.base),
                shown(&e.model)
            ));
            e.model = served.base;
            e.set_domain(None);
            Some(Arc::clone(&e.align_now))
        });
        if let Some(Some(align)) = changed {
            align.notify_one();
        }
    }

    /// The published model list: every configured model with its bundle's fingerprint and its
    /// block size (configured, else learned, else 0: not known yet).
    fn model_infos(&self, inner: &Inner) -> Vec<ModelInfo> {
        self.models
            .iter()
            .map(|m| ModelInfo {
                name: m.name.clone(),
                fingerprint: m.fingerprint(),
                block_size: m
                    .block_size
                    .or_else(|| inner.learned.get(&m.name).copied())
                    .unwrap_or(0),
            })
            .collect()
    }

    /// Publishes what changed since the last call as a new snapshot version (if anything did).
    fn publish(&self, inner: &mut Inner) {
        let now = now_ms();
        inner.peers.expire(now);
        let peers = inner.peers.take_pending();
        let others = !inner.dirty.is_empty()
            || inner.models_dirty
            || peers.is_some()
            || !inner.removed.is_empty()
            || inner.placements_dirty;
        // Loads go out once their pace allows, not with other changes: a change that makes no
        // new version (a worker touched but unchanged) would otherwise carry them every time.
        let loads_out = !inner.load_dirty.is_empty() && self.loads_due(inner, now);
        if !others && !loads_out {
            return;
        }
        // Envoy's health checking (membership) decides who is down; a change is published
        // whether or not anything else changed.
        let down: Vec<String> =
            inner.workers.iter().filter(|(_, e)| !e.member).map(|(w, _)| w.clone()).collect();
        inner.publisher.set_down(down, now);
        // Likewise the placements (the whole list, by worker; a worker gone takes its own).
        inner.placements_dirty = false;
        let placements = inner.workers.iter().filter_map(|(w, e)| placement(w, e)).collect();
        inner.publisher.set_placements(placements, now);
        let models = std::mem::take(&mut inner.models_dirty).then(|| self.model_infos(inner));
        let mut dirty = std::mem::take(&mut inner.dirty);
        // A scrape changes a worker's load alone: its head goes out without its hash lists,
        // unless the snapshot does not list it yet.
        let mut loads = Vec::new();
        let waiting = if loads_out {
            inner.loads_published_ms = now;
            Vec::new()
        } else {
            std::mem::take(&mut inner.load_dirty).into_iter().collect()
        };
        for w in std::mem::take(&mut inner.load_dirty) {
            match inner.workers.get(&w) {
                Some(e) if !dirty.contains(&w) && inner.publisher.lists(&w) => {
                    loads.push((w, snapshot_load(e)));
                }
                Some(_) => {
                    dirty.insert(w);
                }
                None => {}
            }
        }
        let changes = Changes {
            workers: dirty
                .iter()
                .filter_map(|w| inner.workers.get(w).map(|e| wire(w, e)))
                .collect(),
            loads,
            removed: std::mem::take(&mut inner.removed).into_iter().collect(),
        };
        inner.publisher.publish_changes(changes, models, peers, now);
        // Loads not due wait, but for workers that just went out whole (with their load).
        inner.load_dirty.extend(waiting.into_iter().filter(|w| !dirty.contains(w)));
    }

    /// The published snapshot version (after publishing pending changes).
    pub fn version(&self) -> u64 {
        let mut inner = self.lock();
        self.publish(&mut inner);
        inner.publisher.version()
    }

    /// A full snapshot of everything known now.
    pub fn snapshot(&self) -> Snapshot {
        let mut inner = self.lock();
        self.publish(&mut inner);
        inner.publisher.full().clone()
    }

    /// What a caller holding version `since` should receive: nothing new, the composed delta,
    /// or a full snapshot.
    pub fn answer(&self, since: Option<u64>) -> Answer {
        self.answer_for(since, None)
    }

    /// [`State::answer`] for a replica that takes peer knowledge (`Some(its id)`): full
    /// snapshots carry every live peer entry, deltas the peer changes, both without the
    /// replica's own. `None`: no peer section (format 3 / 2, as older filters expect).
    pub fn answer_for(&self, since: Option<u64>, replica: Option<u64>) -> Answer {
        self.answer_with(since, replica, false)
    }

    /// [`State::answer_for`]; `pool`: the caller reads the pool flag and removed workers
    /// (snapshot format 5, delta format 4). Without it they are left out as before: a removed
    /// worker is sent as an incompatible worker that holds nothing.
    pub fn answer_with(&self, since: Option<u64>, replica: Option<u64>, pool: bool) -> Answer {
        self.answer_health(since, replica, pool, false)
    }

    /// [`State::answer_with`]; `health`: as in [`State::answer_health`]; `placement`: the caller
    /// reads the workers' placements (`placement=1`, snapshot sections bit 8, delta bit 16).
    pub fn answer_query(
        &self,
        since: Option<u64>,
        replica: Option<u64>,
        pool: bool,
        health: bool,
        placement: bool,
    ) -> Answer {
        let answer = self.answer_health(since, replica, pool, health);
        if placement {
            answer
        } else {
            answer.without_placement()
        }
    }

    /// [`State::answer_with`]; `health`: the caller reads the list of workers down (`health=1`,
    /// snapshot sections bit 4, delta sections bit 8).
    pub fn answer_health(
        &self,
        since: Option<u64>,
        replica: Option<u64>,
        pool: bool,
        health: bool,
    ) -> Answer {
        let mut inner = self.lock();
        self.publish(&mut inner);
        let mut answer = inner.publisher.answer(since);
        if !pool {
            answer = answer.without_pool();
        }
        if !health {
            answer = answer.without_health();
        }
        match (answer, replica) {
            (Answer::Full(mut s), Some(r)) => {
                s.peers = Some(inner.peers.section().without(r));
                Answer::Full(s)
            }
            (Answer::Delta(mut d), Some(r)) => {
                d.peers = d.peers.map(|p| p.without(r));
                Answer::Delta(d)
            }
            (Answer::Delta(mut d), None) => {
                d.peers = None;
                Answer::Delta(d)
            }
            (other, _) => other,
        }
    }

    /// Runs `f` on everything known now (after publishing pending changes), under the lock:
    /// `/metrics` reads its typed counters from it.
    pub fn observe<T>(&self, f: impl FnOnce(&Observed<'_>) -> T) -> T {
        let mut inner = self.lock();
        self.publish(&mut inner);
        let inner = &*inner;
        f(&Observed {
            version: inner.publisher.version(),
            workers: &inner.workers,
            joined: inner.joined,
            left: inner.left,
            peers: &inner.peers,
        })
    }

    /// `/status` JSON.
    pub fn status(&self) -> serde_json::Value {
        let mut inner = self.lock();
        self.publish(&mut inner);
        let now = now_ms();
        let workers: serde_json::Map<String, serde_json::Value> = inner
            .workers
            .iter()
            .map(|(w, e)| {
                let k = &e.knowledge;
                let age =
                    (k.stats.last_event_ms > 0).then(|| now.saturating_sub(k.stats.last_event_ms));
                (
                    w.clone(),
                    serde_json::json!({
                        "connected": e.connected,
                        "compatible": e.compatible,
                        "alignment": e.alignment,
                        "model": e.model,
                        "adapters": e.adapters,
                        "block_size": e.domain.as_ref().map(|d| d.block_size),
                        "member": e.member,
                        "reported_load": e.load,
                        "reported_load_age_ms": e.load.as_ref().map(|l| now.saturating_sub(l.observed_at_ms)),
                        "next_seq": k.next_seq,
                        "blocks": k.counts(),
                        "engine_keys": k.engine_keys(),
                        "kv_cache_groups": k.group_kinds(),
                        "last_event_age_ms": age,
                        "stats": k.stats,
                        "placement": placement(w, e).map(|p| serde_json::json!({
                            "site": p.site, "zone": p.zone, "rack": p.rack, "node": p.node,
                            "observed_at_ms": p.observed_at_ms,
                            "age_ms": now.saturating_sub(p.observed_at_ms),
                        })),
                    }),
                )
            })
            .collect();
        let models: Vec<serde_json::Value> = inner
            .publisher
            .full()
            .models
            .iter()
            .map(|m| {
                serde_json::json!({
                    "name": m.name,
                    "fingerprint": format!("{:016x}", m.fingerprint),
                    "block_size": m.block_size,
                })
            })
            .collect();
        serde_json::json!({
            "version": inner.publisher.version(),
            "pool": {
                "whole": inner.publisher.full().pool,
                "workers": inner.workers.len(),
                "joined": inner.joined,
                "left": inner.left,
            },
            "models": models,
            "workers": workers,
            "peers": inner.peers.status(),
        })
    }
}

/// Whether a worker's engine pages of `page` tokens can be re-chunked into kvroute blocks of
/// `block` tokens (one divides the other; see `ingest`).
pub fn pages_fit(page: u32, block: u32) -> bool {
    page > 0 && block > 0 && (block % page == 0 || page % block == 0)
}

/// The block size kvroute learns from a worker announcing `page`: SGLang's default page of 1
/// (or any page dividing vLLM's default block) would make every prompt's block list as long as
/// the prompt, so such pages are grouped into blocks of [`DEFAULT_BLOCK_SIZE`].
pub fn block_size_for_pages(page: u32) -> u32 {
    if page > 0 && page < DEFAULT_BLOCK_SIZE && DEFAULT_BLOCK_SIZE % page == 0 {
        DEFAULT_BLOCK_SIZE
    } else {
        page
    }
}

/// Whether no placement label is known.
pub fn labels_unknown(l: &Labels) -> bool {
    l.site.is_none() && l.zone.is_none() && l.rack.is_none() && l.node.is_none()
}

/// One worker's placement as published; `None` while no label is known.
fn placement(worker: &str, e: &WorkerRecord) -> Option<WorkerPlacement> {
    if labels_unknown(&e.labels) {
        return None;
    }
    let l = &e.labels;
    Some(WorkerPlacement {
        worker: worker.to_owned(),
        site: l.site.clone(),
        zone: l.zone.clone(),
        rack: l.rack.clone(),
        node: l.node.clone(),
        observed_at_ms: e.labels_seen_ms,
    })
}

/// One worker's entry as published (hash lists sorted).
/// The load a snapshot carries for `e`: whole requests, as last scraped.
fn snapshot_load(e: &WorkerRecord) -> Option<kvroute_core::wire::snapshot::SnapshotLoad> {
    e.load.as_ref().and_then(|l| {
        Some(kvroute_core::wire::snapshot::SnapshotLoad {
            running: l.running? as u32,
            waiting: l.waiting? as u32,
            observed_at_ms: l.observed_at_ms,
        })
    })
}

fn wire(worker: &str, e: &WorkerRecord) -> Wire {
    let mut offloaded = e.knowledge.blocks(Tier::Cpu);
    offloaded.extend(e.knowledge.blocks(Tier::Storage));
    offloaded.sort_unstable();
    offloaded.dedup();
    Wire {
        worker: worker.to_owned(),
        observed_at_ms: e.knowledge.stats.last_event_ms,
        compatible: e.compatible,
        gpu: e.knowledge.blocks(Tier::Gpu),
        offloaded,
        load: snapshot_load(e),
        model: e.model.clone().unwrap_or_default(),
        adapters: e.adapters.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> Arc<Models> {
        let specs = ["a".parse().unwrap(), "b".parse().unwrap()];
        Arc::new(Models::load(&specs, &[("b".into(), 32)]).unwrap())
    }

    fn served(base: &str, adapters: &[&str]) -> ServedModels {
        ServedModels {
            base: Some(base.into()),
            adapters: adapters.iter().map(|a| a.to_string()).collect(),
            ..ServedModels::default()
        }
    }

    fn outcome(verdict: AlignmentVerdict, base: &str, block_size: Option<u32>) -> AlignmentOutcome {
        AlignmentOutcome {
            verdict,
            served: Some(served(base, &["l"])),
            announced_block_size: block_size,
        }
    }

    fn entry<T>(s: &State, w: &str, f: impl FnOnce(&WorkerRecord) -> T) -> T {
        f(s.lock().workers.get(w).unwrap())
    }

    #[test]
    fn checks_identify_the_model_its_domain_and_block_size() {
        let s = State::for_models(models(), ["w".to_string(), "v".to_string()], Limits::default());
        assert!(!entry(&s, "w", |e| e.compatible) && s.domain_of("w").is_none());
        assert_eq!(s.snapshot().models.iter().map(|m| m.block_size).collect::<Vec<_>>(), [0, 32]);
        s.apply_check("w", outcome(AlignmentVerdict::Compatible, "a", Some(16)));
        let d = s.domain_of("w").unwrap();
        assert_eq!((d.model.as_str(), d.block_size), ("a", 16));
        assert_eq!(d.tokenizer_fingerprint, s.models().get("a").unwrap().fingerprint());
        let snap = s.snapshot();
        assert_eq!(snap.models[0].block_size, 16, "learned from the compatible worker");
        let w = snap.workers.iter().find(|w| w.worker == "w").unwrap();
        assert!(w.compatible);
        assert_eq!((w.model.as_str(), w.adapters.clone()), ("a", vec!["l".to_string()]));
        // Another worker of "a" announcing 24 is incompatible (its pages cannot be re-chunked
        // into blocks of 16); 64 and 1 can, and its events are hashed in blocks of 16.
        s.apply_check("v", outcome(AlignmentVerdict::Compatible, "a", Some(24)));
        assert!(!entry(&s, "v", |e| e.compatible));
        for page in [64, 1] {
            s.apply_check("v", outcome(AlignmentVerdict::Compatible, "a", Some(page)));
            assert!(entry(&s, "v", |e| e.compatible), "page {page}");
            assert_eq!(s.domain_of("v").unwrap().block_size, 16);
        }
        // one of "b" must announce a size that fits 32.
        s.apply_check("v", outcome(AlignmentVerdict::Compatible, "b", Some(32)));
        assert!(entry(&s, "v", |e| e.compatible));
        assert_eq!(s.domain_of("v").unwrap().block_size, 32);
        // An unconfigured model: incompatible, no domain, its name still shown.
        s.apply_check(
            "v",
            outcome(AlignmentVerdict::Incompatible("not configured".into()), "zz", None),
        );
        assert!(s.domain_of("v").is_none());
        assert_eq!(entry(&s, "v", |e| e.model.clone()).as_deref(), Some("zz"));
        // A failed check changes nothing but the message.
        s.apply_check(
            "w",
            AlignmentOutcome {
                verdict: AlignmentVerdict::Unknown("down".into()),
                served: None,
                announced_block_size: None,
            },
        );
        assert!(entry(&s, "w", |e| e.compatible) && s.domain_of("w").is_some());
    }

    /// SGLang announces its page size (1 by default): kvroute learns blocks of 16, not 1, and
    /// a vLLM worker of the same model with 16 fits.
    #[test]
    fn a_page_size_of_one_is_learned_as_blocks_of_sixteen() {
        let s = State::for_models(models(), ["g".to_string(), "v".to_string()], Limits::default());
        s.apply_check("g", outcome(AlignmentVerdict::Compatible, "a", Some(1)));
        assert!(entry(&s, "g", |e| e.compatible));
        assert_eq!(s.domain_of("g").unwrap().block_size, 16);
        assert_eq!(s.snapshot().models[0].block_size, 16);
        s.apply_check("v", outcome(AlignmentVerdict::Compatible, "a", Some(16)));
        assert!(entry(&s, "v", |e| e.compatible));
        assert_eq!(
            (1..=64).filter(|&p| pages_fit(p, 16)).collect::<Vec<_>>(),
            [1, 2, 4, 8, 16, 32, 48, 64]
        );
    }

    #[test]
    fn a_scraped_model_change_forgets_the_domain_and_asks_for_a_check() {
        let s = State::for_models(models(), ["w".to_string()], Limits::default());
        s.apply_check("w", outcome(AlignmentVerdict::Compatible, "a", Some(16)));
        let resync = s.resync_signal("w").unwrap();
        let woken = futures::FutureExt::now_or_never(resync.notified());
        assert!(woken.is_some(), "identifying the domain asks for a resync");
        s.apply_served("w", served("a", &["l", "m"]));
        assert!(futures::FutureExt::now_or_never(resync.notified()).is_none());
        assert!(entry(&s, "w", |e| e.compatible));
        assert_eq!(s.snapshot().workers[0].adapters, ["l", "m"]);
        s.apply_served("w", served("b", &[]));
        assert!(!entry(&s, "w", |e| e.compatible) && s.domain_of("w").is_none());
        let align = s.align_signal("w").unwrap();
        let now = futures::FutureExt::now_or_never(align.notified());
        assert!(now.is_some(), "the alignment check was not woken");
        assert!(futures::FutureExt::now_or_never(resync.notified()).is_some());
    }
}

#[cfg(test)]
mod load_pace_tests;
#[cfg(test)]
mod placement_tests;
