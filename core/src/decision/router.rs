//! The router of one Envoy thread: an immutable [`Plan`] (models, bundles, pools, profiles,
//! LoRA adapters, limits), built once per configuration or bundle change and swapped whole;
//! the mutable [`Knowledge`] of workers (blocks, verdicts, load, loaded adapters); and the
//! thread's [`TokenCache`]. `decide` turns a parsed request into an ordered list of workers of
//! its model's pool.

mod decision;
mod knowledge;
mod pd;
mod plan;
mod reach;
#[cfg(test)]
mod tests;
mod tokens;

pub use decision::{combine_load, Decision, FallbackReason};
pub use knowledge::Knowledge;
pub use plan::{ModelPlan, Plan};

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use crate::decision::config::{ConfigError, FilterConfig};
use crate::decision::cost::{rank_pool, Candidate, Weigh};
use crate::decision::error::ApiError;
use crate::decision::hash::{block_hashes, CacheDomain};
use crate::decision::index::PrefixMatch;
use crate::decision::load::{LoadSource, WorkerLoad};
use crate::decision::lookahead::{replica, Held};
use crate::decision::request::{LoadOnly, ParsedRequest};
use crate::decision::tokenize::model::{ModelBundle, ModelError};
use crate::decision::tokenize::rendercache::RenderCache;
use crate::decision::tokenize::tokcache::{TokenCache, TokenCacheLimits};
use crate::decision::topology::{DiscoveredLabels, TopologyConfig};
use crate::decision::worker::WorkerName;
use crate::wire::journal::Source;
use crate::wire::snapshot::{ModelInfo, SnapshotLoad};

/// One Envoy thread's router.
pub struct Router {
    plan: Arc<Plan>,
    knowledge: Knowledge,
    /// Interior mutability: `decide` takes `&self`, and each thread has its own router.
    tokens: RefCell<TokenCache>,
    /// Rendered chat prompts, so the next turn renders only its new messages.
    renders: RefCell<RenderCache>,
    /// A monotonic-enough clock in nanoseconds, to time rendering + tokenization.
    clock: Option<fn() -> u64>,
    /// Learned cost profiles and per-worker deviations (online calibration), when in use.
    calibration: Arc<crate::decision::calib::Calibrated>,
    /// The plan's topology with the labels the updater discovered filled in (`None`: no
    /// topology at all).
    topology: Option<Arc<TopologyConfig>>,
    /// The labels the updater discovered, as last received.
    discovered: Vec<DiscoveredLabels>,
}

/// A placement from the updater as the topology reads it.
fn discovered(p: &crate::wire::snapshot::WorkerPlacement) -> DiscoveredLabels {
    DiscoveredLabels {
        worker: p.worker.clone(),
        labels: crate::decision::topology::Labels {
            site: p.site.clone(),
            zone: p.zone.clone(),
            rack: p.rack.clone(),
            node: p.node.clone(),
        },
        observed_at_ms: p.observed_at_ms,
    }
}

/// A request's `model` resolved against the plan: its base model's entry, and the adapter it
/// names when it names one.
struct Target {
    model: Arc<ModelPlan>,
    adapter: Option<String>,
    /// The request's output-token limit, where it names one: how long its stream is priced
    /// ([`crate::decision::cost::Weigh::for_stream`]).
    max_tokens: Option<u64>,
}

impl Target {
    fn domain(&self, tenant_salt: Option<String>) -> Option<CacheDomain> {
        Some(CacheDomain {
            model: self.model.name.clone(),
            tokenizer_fingerprint: self.model.fingerprint()?,
            block_size: self.model.block_size,
            lora_name: self.adapter.clone().or_else(|| self.model.lora_name.clone()),
            tenant_salt,
        })
    }
}

impl Router {
    /// Builds the router, loading every model's tokenizer and template.
    pub fn new(cfg: &FilterConfig) -> Result<Self, ConfigError> {
        Ok(Router::with_plan(cfg, Arc::new(Plan::new(cfg)?)))
    }

    /// A router over an already built plan, with empty knowledge sized by `cfg`.
    pub fn with_plan(cfg: &FilterConfig, plan: Arc<Plan>) -> Router {
        Router {
            topology: plan.topology.clone(),
            discovered: Vec::new(),
            plan,
            knowledge: Knowledge::new(cfg),
            tokens: RefCell::new(TokenCache::new(TokenCacheLimits::default())),
            renders: RefCell::default(),
            clock: None,
            calibration: Arc::default(),
        }
    }

    /// Gives the router a clock (ns) so each decision reports its rendering + tokenization
    /// time ([`Decision::tokenize_us`]).
    pub fn set_clock(&mut self, clock: fn() -> u64) {
        self.clock = Some(clock);
    }

    /// Uses these learned profiles and deviations from now on (see [`crate::decision::calib`]).
    pub fn set_calibration(&mut self, calibration: Arc<crate::decision::calib::Calibrated>) {
        self.calibration = calibration;
    }

    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// Replaces the plan whole (knowledge stays); returns the previous one. Decisions already
    /// made keep their model's entry of the plan they were made with.
    #[cfg(test)]
    pub(crate) fn swap_plan(&mut self, plan: Arc<Plan>) -> Arc<Plan> {
        let old = std::mem::replace(&mut self.plan, plan);
        self.topology = self.effective_topology();
        old
    }

    /// Takes in the labels the updater discovered (the whole list each time).
    pub fn set_discovered(&mut self, found: Vec<DiscoveredLabels>) {
        if found != self.discovered {
            self.discovered = found;
            self.topology = self.effective_topology();
        }
    }

    /// The topology decisions use: the plan's with discovered labels filled in.
    pub fn topology(&self) -> Option<&Arc<TopologyConfig>> {
        self.topology.as_ref()
    }

    fn effective_topology(&self) -> Option<Arc<TopologyConfig>> {
        if self.discovered.is_empty() {
            return self.plan.topology.clone();
        }
        let base = self.plan.topology.as_deref().cloned().unwrap_or_default();
        Some(Arc::new(base.with_discovered(&self.discovered)))
    }

    /// Runs the battery of every configured template now ([`ChatTemplate::incremental`],
    /// once per template), so that no request pays for it.
    ///
    /// [`ChatTemplate::incremental`]: crate::decision::template::ChatTemplate::incremental
    pub fn check_templates(&self) {
        for b in self.plan.models().filter_map(|m| m.bundle.as_ref()) {
            b.template().incremental();
        }
    }

    /// Sets the bundle of a model fed by the updater (`None`: routed load-only, `no_bundle`)
    /// by swapping in a plan that differs in that entry only. Whether its template may be
    /// rendered incrementally is checked here, off the request path.
    pub fn set_bundle(&mut self, model: &str, bundle: Option<ModelBundle>) {
        if let Some(b) = &bundle {
            b.template().incremental();
        }
        self.plan = Arc::new(self.plan.with_bundle(model, bundle));
    }

    /// The requests the Envoy replicas have routed to `worker` and not seen end: `own` (this
    /// Envoy's threads') with other replicas' as the updater relays them. What a stream's
    /// decode batch is timed against. Not the worker's own report, which a decision also
    /// takes: scraped every few hundred milliseconds, it may still count a batch that ended.
    pub fn routed_load(&self, worker: &WorkerName, own: WorkerLoad, now_ms: u64) -> WorkerLoad {
        own.plus(self.knowledge.peer_load_key(worker.key(), now_ms))
    }

    pub fn knowledge(&self) -> &Knowledge {
        &self.knowledge
    }

    pub fn knowledge_mut(&mut self) -> &mut Knowledge {
        &mut self.knowledge
    }

    /// The token cache's counters (hits, misses, tokens saved, ...).
    #[cfg(test)]
    pub(crate) fn token_cache_stats(&self) -> crate::decision::tokenize::tokcache::TokenCacheStats {
        self.tokens.try_borrow().map(|c| c.stats()).unwrap_or_default()
    }

    /// The configured workers of base model `model`.
    pub fn workers(&self, model: &str) -> Option<&[WorkerName]> {
        self.plan.model(model).map(|m| m.workers.as_slice())
    }

    /// The workers `model`'s requests go to now: the updater's pool for it when the updater
    /// lists the whole pool and names members of `model`, else the configured workers.
    pub fn pool(&self, model: &str) -> Option<&[WorkerName]> {
        let m = self.plan.model(model)?;
        Some(self.knowledge.pool_members(model).unwrap_or(&m.workers))
    }

    /// Every configured worker, across models.
    pub fn all_workers(&self) -> impl Iterator<Item = &str> {
        self.plan.all_workers()
    }

    /// Every worker a decision may name: the configured ones and the members of the updater's
    /// pools (discovered workers), sorted, each once.
    pub fn routable_workers(&self) -> Vec<&str> {
        let mut all: Vec<&str> =
            self.plan.all_workers().chain(self.knowledge.all_pool_members()).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// How a request for `t` weighs its candidates: the plan's weighing, with its stream's
    /// growth of the decode batch priced over its output tokens.
    fn weigh(&self, t: &Target) -> Weigh {
        self.plan.weigh.for_stream(t.max_tokens, self.plan.stream_growth_tokens)
    }

    /// A model name or adapter resolved to its base model's plan entry; `None` is a 404.
    fn resolve(&self, model: &str) -> Option<Target> {
        if let Some(m) = self.plan.model(model) {
            return Some(Target { model: Arc::clone(m), adapter: None, max_tokens: None });
        }
        let base =
            self.plan.configured_base(model).or_else(|| self.knowledge.adapter_base(model))?;
        let m = self.plan.model(base)?;
        Some(Target { model: Arc::clone(m), adapter: Some(model.to_owned()), max_tokens: None })
    }

    /// The cache domain a request belongs to (an adapter's requests: its base model, with the
    /// adapter as LoRA name).
    pub fn domain(&self, req: &ParsedRequest) -> Option<CacheDomain> {
        self.resolve(&req.model)?.domain(req.cache_salt.clone())
    }

    /// Decides where `req` goes: always a worker of its (base) model's pool. `load` reads a
    /// worker's current router-tracked load; `body_len` estimates the prompt size when
    /// tokenization fails; `pick` is a random number.
    pub fn decide(
        &self,
        req: &ParsedRequest,
        body_len: usize,
        load: &dyn LoadSource,
        now_ms: u64,
        pick: u64,
    ) -> Result<Decision, ApiError> {
        let t = self.resolve(&req.model).ok_or_else(|| ApiError::model_not_found(&req.model))?;
        let t = Target { max_tokens: req.max_tokens, ..t };
        let estimate = (body_len / 4) as u64;
        // A request the engine will not look up in its cache reuses nothing anywhere.
        let cache_read = !req.skips_cache_read;
        let ranked = |hashes, tokens, fallback| {
            self.noted(self.rank(&t, hashes, tokens, load, now_ms, pick, fallback, cache_read))
        };
        let load_only = match req.load_only {
            Some(LoadOnly::Batch) => Some(FallbackReason::Batch),
            // Too deep to render as the engine would: too large to analyse.
            Some(LoadOnly::TooDeep) => Some(FallbackReason::TooLong),
            None if body_len > self.plan.max_prompt_bytes => Some(FallbackReason::TooLong),
            None => None,
        };
        if load_only.is_some() {
            return Ok(ranked(Vec::new(), estimate, load_only));
        }
        let Some(bundle) = &t.model.bundle else {
            return Ok(ranked(Vec::new(), estimate, Some(FallbackReason::NoBundle)));
        };
        let started = self.clock.map(|c| c());
        let routing = self.routing_tokens(&t.model, bundle, &req.prompt);
        let tokenize_us = match (self.clock, started) {
            (Some(c), Some(s)) => c().saturating_sub(s) / 1000,
            _ => 0,
        };
        let timed = |mut d: Decision| {
            d.tokenize_us = tokenize_us;
            d
        };
        let (tokens, fallback) = match routing {
            Ok(ids) if ids.prompt_tokens > self.plan.max_prompt_tokens as u64 => {
                (ids.prompt_tokens, Some(FallbackReason::TooLong))
            }
            Ok(ids) => {
                let seed = t.domain(req.cache_salt.clone()).map(|d| d.seed()).unwrap_or_default();
                let hashes = block_hashes(seed, t.model.block_size, &ids.hashable);
                // With media, only the blocks before the first media part are hashed; the
                // rest is costed as uncached and counted as `multimodal`.
                let reason = ids.media.then_some(FallbackReason::Multimodal);
                return Ok(timed(ranked(hashes, ids.prompt_tokens, reason)));
            }
            Err(ModelError::Template(_)) => (estimate, Some(FallbackReason::Render)),
            Err(_) => (estimate, Some(FallbackReason::Tokenize)),
        };
        Ok(timed(ranked(Vec::new(), tokens, fallback)))
    }

    /// `prior` ranked again on another load view, with the tokens and block hashes it was
    /// decided with (see [`crate::flow::claim`]); `None` when `req`'s model is no longer in
    /// the plan.
    pub fn rerank(
        &self,
        req: &ParsedRequest,
        prior: &Decision,
        load: &dyn LoadSource,
        now_ms: u64,
        pick: u64,
    ) -> Option<Decision> {
        let t = Target { max_tokens: req.max_tokens, ..self.resolve(&req.model)? };
        let hashes = prior.block_hashes.clone();
        let cache_read = !req.skips_cache_read;
        let (tokens, fallback) = (prior.prompt_tokens, prior.fallback);
        let mut d = self.rank(&t, hashes, tokens, load, now_ms, pick, fallback, cache_read);
        d.tokenize_us = prior.tokenize_us;
        Some(d)
    }

    /// Notes the prompt's computing worker's uncached tokens (once per request: not again
    /// when it is ranked again).
    fn noted(&self, d: Decision) -> Decision {
        // The prompt's computing worker: the prefill primary in a P/D pool.
        if let Some(p) = d.prefill.first().or(d.ranked.first()) {
            self.knowledge.note_uncached_tokens(p.uncached_tokens);
        }
        d
    }

    #[allow(clippy::too_many_arguments)]
    fn rank(
        &self,
        t: &Target,
        hashes: Vec<u64>,
        prompt_tokens: u64,
        load: &dyn LoadSource,
        now_ms: u64,
        pick: u64,
        fallback: Option<FallbackReason>,
        cache_read: bool,
    ) -> Decision {
        let m = &t.model;
        // The updater's pool when it sends one (a new pod joins once identified), else the
        // configured workers.
        let pool = self.knowledge.pool_members(&m.name).unwrap_or(&m.workers);
        // Each worker's lookup (`matches[i]` for `candidates[i]`), kept for the header fields
        // of the chosen one and the look-ahead.
        let (candidates, matches) = self.candidates(t, pool, &hashes, load, now_ms, cache_read);
        let looked = (candidates.as_slice(), matches.as_slice());
        // Names compare by key first: a scan of the pool reads no name but the chosen one's.
        let match_of = |w: &WorkerName| {
            candidates.iter().position(|c| c.worker == w).and_then(|i| matches.get(i)).copied()
        };
        let profile = self.calibration.profile_or(&m.name, load.priority(), &m.profile);
        let topo = self.topology.as_deref();
        let pd = !m.prefill_workers.is_empty();
        let (mut ranked, prefill) = if pd {
            self.rank_pd(t, &candidates, &hashes, prompt_tokens, load, now_ms, pick, cache_read)
        } else {
            // Without a topology every reach is zero: nothing to build per request.
            let reaches = match topo {
                Some(_) => reach::reaches(topo, &candidates, true, &|_| 0.0),
                None => Vec::new(),
            };
            let prompt = (prompt_tokens, m.block_size);
            let ranked = rank_pool(&profile, &candidates, &reaches, prompt, self.weigh(t), pick);
            (ranked, Vec::new())
        };
        let replicated =
            !pd && self.look_ahead(&mut ranked, &hashes, m.block_size, &profile, looked, now_ms);
        let chosen = ranked.first().and_then(|s| match_of(&s.worker)).unwrap_or_default();
        let fallback = fallback
            .or_else(|| self.knowledge.events_stale(now_ms).then_some(FallbackReason::StaleEvents));
        Decision {
            ranked,
            block_hashes: hashes,
            prompt_tokens,
            block_size: m.block_size,
            knowledge_age_ms: chosen.oldest_age_ms,
            blocks_from_events: chosen.from_events,
            fallback,
            model: Arc::clone(m),
            adapter: t.adapter.clone(),
            tokenize_us: 0,
            replicated,
            blocks_from_peers: chosen.from_peers,
            prefill,
            topology: self.topology.clone(),
        }
    }

    /// Each worker of `workers` that is up (all of them when none is) as a candidate, with its
    /// prefix lookup.
    fn candidates<'w>(
        &self,
        t: &Target,
        workers: &'w [WorkerName],
        hashes: &[u64],
        load: &dyn LoadSource,
        now_ms: u64,
        cache_read: bool,
    ) -> (Vec<Candidate<&'w WorkerName>>, Vec<PrefixMatch>) {
        // Workers that failed requests are left out, as primary and as fallback, unless every
        // worker of the pool is down: then the choice is among all of them (never a refusal).
        // Workers are looked up by key, never by name: a name's bytes are a cache miss each.
        let up: Vec<&WorkerName> = if self.knowledge.any_down() {
            workers.iter().filter(|w| !self.knowledge.is_down_key(w.key())).collect()
        } else {
            Vec::new()
        };
        if up.is_empty() {
            self.candidates_among(t, workers.iter(), hashes, load, now_ms, cache_read)
        } else {
            self.candidates_among(t, up.into_iter(), hashes, load, now_ms, cache_read)
        }
    }

    /// [`Router::candidates`] of the `eligible` workers (`matches` empty: none matched).
    #[allow(clippy::too_many_arguments)]
    fn candidates_among<'w>(
        &self,
        t: &Target,
        eligible: impl ExactSizeIterator<Item = &'w WorkerName> + Clone,
        hashes: &[u64],
        load: &dyn LoadSource,
        now_ms: u64,
        cache_read: bool,
    ) -> (Vec<Candidate<&'w WorkerName>>, Vec<PrefixMatch>) {
        let m = &t.model;
        // The cache-blind ablation skips the lookups rather than discarding them, and so does
        // a request the engine will not look up.
        let matches = if self.plan.cache_aware && cache_read {
            self.knowledge.prefix_matches(eligible.clone(), hashes, now_ms)
        } else {
            Vec::new()
        };
        let calibrated = self.calibration.model(&m.name);
        // Read once per decision, not per worker (a float rounded each time).
        let unseen_tokens = self.knowledge.typical_uncached_tokens();
        // Queued work this request's engine priority jumps (none without priorities).
        let defers = load.defers();
        // The more urgent prompts per second that pass this request in a worker's queue (none
        // without priorities).
        let passing = if load.passed() { self.passing(eligible.clone(), load, now_ms) } else { 0 };
        let candidates = eligible
            .enumerate()
            .map(|(i, w)| {
                let pm = matches.get(i).copied().unwrap_or_default();
                let reported = self.knowledge.reported_load_key(w.key(), now_ms);
                // Other replicas' in-flight work adds to this replica's own. The worker's
                // report is matched against all of it, the part this request jumps taken out
                // after (else the report would count that part again as unseen requests).
                let mut peers = self.knowledge.peer_load_key(w.key(), now_ms);
                if !self.plan.peer_arrivals {
                    peers.arriving_tokens_per_s = 0;
                }
                let mut seen =
                    combine_load(load.load(w).plus(peers), reported.as_ref(), unseen_tokens);
                seen.passing_tokens_per_s = passing;
                Candidate {
                    worker: w,
                    cached_blocks: pm.blocks,
                    offloaded_blocks: pm.offloaded,
                    load: if defers {
                        seen.less(load.behind(w, m.profile.step_token_budget))
                    } else {
                        seen
                    },
                    adapter_missing: t
                        .adapter
                        .as_deref()
                        .is_some_and(|a| !self.knowledge.has_adapter(w, a)),
                    deviation: calibrated.map_or(1.0, |v| v.deviation_of(w)),
                }
            })
            .collect();
        (candidates, matches)
    }

    /// The more urgent prompts per second foreseen to pass a request in a worker's queue
    /// ([`LoadSource::passing`]): the pool's, per worker of `eligible`. Over a wait longer than
    /// the arrival window the router spreads them over the pool; one worker's few arrivals in
    /// the window are too noisy a forecast. Other replicas' arrivals (their loads carry a rate
    /// but no priorities) are taken to hold the same share of urgent work as this replica's.
    fn passing<'w>(
        &self,
        eligible: impl ExactSizeIterator<Item = &'w WorkerName>,
        load: &dyn LoadSource,
        now_ms: u64,
    ) -> u64 {
        let n = eligible.len() as u64;
        let (mut urgent, mut own, mut peers) = (0u64, 0u64, 0u64);
        for w in eligible {
            urgent = urgent.saturating_add(load.passing(w));
            own = own.saturating_add(load.load(w).arriving_tokens_per_s);
            if self.plan.peer_arrivals {
                let p = self.knowledge.peer_load_key(w.key(), now_ms).arriving_tokens_per_s;
                peers = peers.saturating_add(p);
            }
        }
        if n == 0 {
            return 0;
        }
        let all = if own > 0 && peers > 0 {
            let scaled =
                u128::from(urgent) * (u128::from(own) + u128::from(peers)) / u128::from(own);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        } else {
            urgent
        };
        all / n
    }

    /// Places a hot prefix on one more worker when the requests still to come for it would
    /// queue longer on its holders than one recompute costs (see [`crate::decision::lookahead`]): moves
    /// that worker to the front of `ranked` and says so. `matches[i]` is `candidates[i]`'s lookup;
    /// its `routed_age_ms` is the youngest routing credit for this prompt: a prefix sent there
    /// that recently is still in prefill, and its remaining prefill is not a lasting queue.
    fn look_ahead(
        &self,
        ranked: &mut Vec<crate::decision::cost::Score>,
        hashes: &[u64],
        block_size: u32,
        profile: &crate::decision::cost::Profile,
        (candidates, matches): (&[Candidate<&WorkerName>], &[PrefixMatch]),
        now_ms: u64,
    ) -> bool {
        let hot = self.knowledge.hot();
        let Some(first) = ranked.first() else { return false };
        let full = ranked.iter().map(|s| s.cached_tokens).max().unwrap_or(0);
        if !hot.config().enabled || full == 0 || first.cached_tokens < full {
            return false;
        }
        let blocks = (full / u64::from(block_size.max(1))) as usize;
        let expected = hot.expected(hashes, blocks, now_ms);
        if expected < hot.config().min_arrivals {
            return false;
        }
        // Only the workers this prefix was recently routed to (a few, whatever the pool's
        // size): the others have no routing credit to look up.
        let routed: HashMap<u64, u64> = candidates
            .iter()
            .zip(matches)
            .filter_map(|(c, pm)| Some((c.worker.key(), pm.routed_age_ms?)))
            .collect();
        let held: Vec<Held<'_>> = ranked
            .iter()
            .map(|s| {
                let routed_age = routed.get(&s.worker.key()).copied();
                let inflight_ms = match routed_age {
                    Some(age) => {
                        (profile.prefill_ms(s.cached_tokens) * s.deviation - age as f64).max(0.0)
                    }
                    None => 0.0,
                };
                Held { score: s, inflight_ms }
            })
            .collect();
        let Some(i) = replica(hot.config(), &held, expected) else { return false };
        let chosen = ranked.remove(i);
        ranked.insert(0, chosen);
        true
    }

    /// The workers to leave out of decisions from now on (down after failed requests).
    pub fn set_down<'a>(&mut self, down: impl IntoIterator<Item = &'a str>) {
        self.knowledge.set_down(down);
    }

    /// Takes in an updater snapshot (see [`Knowledge::apply_snapshot`]).
    pub fn apply_snapshot(&mut self, snap: &crate::wire::snapshot::Snapshot) {
        self.knowledge.apply_snapshot(snap);
        self.set_discovered(snap.placements.iter().map(discovered).collect());
    }

    /// Takes in a delta of the updater's knowledge (the caller checks that it follows the
    /// version last applied).
    pub fn apply_delta(&mut self, d: &crate::wire::delta::Delta) {
        self.knowledge.apply_delta(d);
        if let Some(p) = &d.placements {
            self.set_discovered(p.iter().map(discovered).collect());
        }
    }

    /// Records that the updater confirmed its knowledge at `at_ms`.
    pub fn events_checked(&mut self, at_ms: u64) {
        self.knowledge.events_checked(at_ms);
    }

    /// Credits `worker` with blocks it is about to compute or was seen to hold.
    pub fn observe(&mut self, worker: &str, hashes: &[u64], source: Source, now_ms: u64) {
        self.knowledge.observe(worker, hashes, source, now_ms);
    }

    /// Grows the knowledge's large tables ahead, for the tick: a table then grows (or drops its
    /// tombstones) there, not during a request's catch-up. How many grew.
    pub fn make_room(&mut self) -> usize {
        self.knowledge.make_room()
    }

    /// Applies a journal entry: a credit, or a routing credit taken back.
    pub fn apply_journal(&mut self, e: &crate::wire::journal::JournalEntry) {
        self.knowledge.apply_journal(e);
    }

    /// Records the adapters `worker` has loaded under the base model it serves.
    pub fn set_adapters(&mut self, worker: &str, base_model: &str, adapters: &[String]) {
        self.knowledge.set_adapters(worker, base_model, adapters);
    }

    /// What `worker` last reported about its load, if younger than the allowed age.
    pub fn reported_load(&self, worker: &str, now_ms: u64) -> Option<SnapshotLoad> {
        self.knowledge.reported_load(worker, now_ms)
    }

    /// The models (and bundle fingerprints) the updater last named; with
    /// [`Plan::stale_bundles`], which bundles to fetch before the next plan.
    pub fn updater_models(&self) -> &[ModelInfo] {
        self.knowledge.updater_models()
    }
}
