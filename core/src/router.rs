//! The router: an immutable per-model view built from the config, plus the mutable knowledge
//! index. `decide` turns a parsed request into an ordered list of workers.

use std::collections::HashMap;

use crate::audit::{classify, AuditClass};
use crate::config::{ConfigError, FilterConfig, ModelConfig};
use crate::cost::{rank, Candidate, Profile, Score, TieBand};
use crate::error::ApiError;
use crate::hash::{block_hashes, CacheDomain};
use crate::index::{EventChange, KnowledgeIndex, Source};
use crate::load::WorkerLoad;
use crate::model::ModelBundle;
use crate::request::{LoadOnly, ParsedRequest};

/// Why a decision was made without cache knowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// The chat template failed to render this request.
    Render,
    /// The tokenizer failed on this request.
    Tokenize,
    /// The prompt is longer than `max_prompt_tokens` or its body than `max_prompt_bytes`.
    TooLong,
    /// Event knowledge exists but the updater has not confirmed it within its age limit:
    /// decided on routing history and feedback only.
    StaleEvents,
    /// Messages with media parts: the engine's cache keys include media kvroute does not see.
    Multimodal,
    /// A completion with several prompts.
    Batch,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 6] = [
        FallbackReason::Render,
        FallbackReason::Tokenize,
        FallbackReason::TooLong,
        FallbackReason::StaleEvents,
        FallbackReason::Multimodal,
        FallbackReason::Batch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FallbackReason::Render => "render_error",
            FallbackReason::Tokenize => "tokenize_error",
            FallbackReason::TooLong => "too_long",
            FallbackReason::StaleEvents => "stale_events",
            FallbackReason::Multimodal => "multimodal",
            FallbackReason::Batch => "batch_prompt",
        }
    }
}

/// What the router decided for one request; holds no prompt text.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Workers in order of preference: primary first, then fallbacks.
    pub ranked: Vec<Score>,
    pub block_hashes: Vec<u64>,
    pub prompt_tokens: u64,
    pub block_size: u32,
    /// Age of the oldest knowledge credited to the primary (ms).
    pub knowledge_age_ms: u64,
    /// How many of the primary's credited blocks come from its KV events.
    pub blocks_from_events: usize,
    pub fallback: Option<FallbackReason>,
}

impl Decision {
    pub fn primary(&self) -> Option<&Score> {
        self.ranked.first()
    }

    /// Tokens the primary is expected to reuse.
    pub fn predicted_cached_tokens(&self) -> u64 {
        self.primary().map_or(0, |s| s.cached_tokens)
    }

    /// Tokens the primary must compute (what its load is charged with).
    pub fn uncached_tokens(&self) -> u64 {
        self.primary().map_or(self.prompt_tokens, |s| s.uncached_tokens)
    }

    /// The destination header value: `primary,fallback`.
    pub fn header_value(&self) -> String {
        self.ranked.iter().take(2).map(|s| s.worker.as_str()).collect::<Vec<_>>().join(",")
    }

    /// Classifies what the worker reported against this decision's prediction.
    pub fn audit(&self, actual_cached: u64) -> AuditClass {
        classify(self.predicted_cached_tokens(), actual_cached, self.prompt_tokens, self.block_size)
    }
}

struct ModelRoute {
    bundle: ModelBundle,
    config: ModelConfig,
}

/// One Envoy thread's router.
pub struct Router {
    models: HashMap<String, ModelRoute>,
    index: KnowledgeIndex,
    tie: TieBand,
    max_prompt_tokens: usize,
    max_prompt_bytes: usize,
    /// Workers whose announced config does not match kvroute's: no cache credit.
    incompatible: std::collections::HashSet<String>,
    /// What each worker last reported about its load (via the updater).
    reported: HashMap<String, crate::snapshot::ReportedLoad>,
    max_load_age_ms: u64,
}

/// Combines the router's own load accounting with what the worker reported: the worker sees
/// traffic from every router replica, the router sees its own requests without delay. Each
/// count takes the larger of the two; queued tokens stay the router's own (workers do not
/// report them).
pub fn combine_load(
    own: WorkerLoad,
    reported: Option<&crate::snapshot::ReportedLoad>,
) -> WorkerLoad {
    let Some(r) = reported else { return own };
    let prefilling = own.prefilling_requests.max(r.waiting);
    let decoding = own.decoding_requests().max(r.running);
    WorkerLoad {
        inflight_requests: prefilling.saturating_add(decoding),
        prefilling_requests: prefilling,
        prefill_tokens: own.prefill_tokens,
    }
}

impl Router {
    /// Builds the router, loading every model's tokenizer and template.
    pub fn new(cfg: &FilterConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let mut demo: Option<ModelBundle> = None;
        let mut models = HashMap::new();
        for m in &cfg.models {
            let invalid = |e: crate::model::ModelError| {
                ConfigError::Invalid(format!("model '{}': {e}", m.name))
            };
            let bundle = match (&m.tokenizer, &m.tokenizer_config) {
                (Some(t), Some(c)) => {
                    ModelBundle::from_hf(&t.to_string(), &c.to_string()).map_err(invalid)?
                }
                _ => match &demo {
                    Some(b) => b.clone(),
                    None => demo.insert(ModelBundle::demo().map_err(invalid)?).clone(),
                },
            };
            models.insert(m.name.clone(), ModelRoute { bundle, config: m.clone() });
        }
        Ok(Router {
            models,
            index: KnowledgeIndex::with_trust(cfg.index.limits(), cfg.knowledge.trust()),
            incompatible: Default::default(),
            reported: HashMap::new(),
            max_load_age_ms: cfg.knowledge.max_load_age_ms,
            tie: cfg.tie_band,
            max_prompt_tokens: cfg.max_prompt_tokens,
            max_prompt_bytes: cfg.max_prompt_bytes,
        })
    }

    /// The configured workers of `model`.
    pub fn workers(&self, model: &str) -> Option<&[String]> {
        self.models.get(model).map(|m| m.config.workers.as_slice())
    }

    /// Every configured worker, across models.
    pub fn all_workers(&self) -> impl Iterator<Item = &str> {
        self.models.values().flat_map(|m| m.config.workers.iter().map(String::as_str))
    }

    /// The cache domain a request belongs to.
    pub fn domain(&self, req: &ParsedRequest) -> Option<CacheDomain> {
        let m = self.models.get(&req.model)?;
        Some(CacheDomain {
            model: req.model.clone(),
            tokenizer_fingerprint: m.bundle.fingerprint(),
            block_size: m.config.block_size,
            lora_name: m.config.lora_name.clone(),
            tenant_salt: req.cache_salt.clone(),
        })
    }

    /// Decides where `req` goes. `load` reads a worker's current router-tracked load;
    /// `body_len` estimates the prompt size when tokenization fails; `pick` is a random number.
    pub fn decide(
        &self,
        req: &ParsedRequest,
        body_len: usize,
        load: &dyn Fn(&str) -> WorkerLoad,
        now_ms: u64,
        pick: u64,
    ) -> Result<Decision, ApiError> {
        let m = self.models.get(&req.model).ok_or_else(|| ApiError::model_not_found(&req.model))?;
        let bs = m.config.block_size;
        let estimate = (body_len / 4) as u64;
        let load_only = match req.load_only {
            Some(LoadOnly::Multimodal) => Some(FallbackReason::Multimodal),
            Some(LoadOnly::Batch) => Some(FallbackReason::Batch),
            None if body_len > self.max_prompt_bytes => Some(FallbackReason::TooLong),
            None => None,
        };
        if load_only.is_some() {
            return Ok(self.rank(m, Vec::new(), estimate, load, now_ms, pick, load_only));
        }
        let (tokens, fallback) = match m.bundle.prompt_tokens(&req.prompt) {
            Ok(t) if t.len() > self.max_prompt_tokens => {
                (t.len() as u64, Some(FallbackReason::TooLong))
            }
            Ok(t) => {
                let n = t.len() as u64;
                let seed = self.domain(req).map(|d| d.seed()).unwrap_or_default();
                return Ok(self.rank(m, block_hashes(seed, bs, &t), n, load, now_ms, pick, None));
            }
            Err(crate::model::ModelError::Template(_)) => (estimate, Some(FallbackReason::Render)),
            Err(_) => (estimate, Some(FallbackReason::Tokenize)),
        };
        Ok(self.rank(m, Vec::new(), tokens, load, now_ms, pick, fallback))
    }

    #[allow(clippy::too_many_arguments)]
    fn rank(
        &self,
        m: &ModelRoute,
        hashes: Vec<u64>,
        prompt_tokens: u64,
        load: &dyn Fn(&str) -> WorkerLoad,
        now_ms: u64,
        pick: u64,
        fallback: Option<FallbackReason>,
    ) -> Decision {
        let mut ages = HashMap::new();
        let candidates: Vec<Candidate> = m
            .config
            .workers
            .iter()
            .map(|w| {
                let pm = if self.incompatible.contains(w) {
                    Default::default()
                } else {
                    self.index.prefix_match(w, &hashes, now_ms)
                };
                ages.insert(w.as_str(), (pm.oldest_age_ms, pm.from_events));
                let reported = self.reported_load(w, now_ms);
                let load = combine_load(load(w), reported.as_ref());
                Candidate {
                    worker: w.clone(),
                    cached_blocks: pm.blocks,
                    offloaded_blocks: pm.offloaded,
                    load,
                }
            })
            .collect();
        let profile: &Profile = &m.config.profile;
        let ranked = rank(profile, &candidates, prompt_tokens, m.config.block_size, self.tie, pick);
        let (knowledge_age_ms, blocks_from_events) =
            ranked.first().and_then(|s| ages.get(s.worker.as_str())).copied().unwrap_or((0, 0));
        let fallback = fallback.or_else(|| {
            (self.index.event_state(now_ms) == (true, false)).then_some(FallbackReason::StaleEvents)
        });
        Decision {
            ranked,
            block_hashes: hashes,
            prompt_tokens,
            block_size: m.config.block_size,
            knowledge_age_ms,
            blocks_from_events,
            fallback,
        }
    }

    /// Takes in an updater snapshot: each worker's event view and config verdict.
    pub fn apply_snapshot(&mut self, snap: &crate::snapshot::Snapshot) {
        for w in &snap.workers {
            self.set_reported(&w.worker, w.load);
            self.verdict(&w.worker, w.compatible);
            if w.compatible {
                self.index.set_events(&w.worker, &w.gpu, &w.offloaded, w.observed_at_ms);
            } else {
                self.index.set_events(&w.worker, &[], &[], w.observed_at_ms);
            }
        }
    }

    /// Takes in a delta of the updater's knowledge (the caller checks that it follows the
    /// version last applied).
    pub fn apply_delta(&mut self, d: &crate::delta::Delta) {
        for w in &d.workers {
            self.set_reported(&w.worker, w.load);
            self.verdict(&w.worker, w.compatible);
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
        }
    }

    fn set_reported(&mut self, worker: &str, load: Option<crate::snapshot::ReportedLoad>) {
        match load {
            Some(l) => self.reported.insert(worker.to_owned(), l),
            None => self.reported.remove(worker),
        };
    }

    fn verdict(&mut self, worker: &str, compatible: bool) {
        if compatible {
            self.incompatible.remove(worker);
        } else {
            self.incompatible.insert(worker.to_owned());
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

    /// Applies a journal entry: a credit, or a routing credit taken back.
    pub fn apply_journal(&mut self, e: &crate::journal::JournalEntry) {
        if e.retract {
            self.index.retract_routed(&e.worker, &e.hashes);
        } else {
            self.observe(&e.worker, &e.hashes, e.source, e.at_ms);
        }
    }

    /// What `worker` last reported about its load, if younger than the allowed age.
    pub fn reported_load(
        &self,
        worker: &str,
        now_ms: u64,
    ) -> Option<crate::snapshot::ReportedLoad> {
        self.reported
            .get(worker)
            .filter(|r| now_ms.saturating_sub(r.observed_at_ms) <= self.max_load_age_ms)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse, Endpoint};
    use serde_json::json;

    fn router() -> Router {
        let cfg = FilterConfig::from_json(
            json!({"models":[{"name":"m","workers":["127.0.0.1:1","127.0.0.1:2","127.0.0.1:3"]}],
                   "tie_band":{"abs_ms":0.0,"rel":0.0}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        Router::new(&cfg).unwrap()
    }

    fn req(salt: Option<&str>, text: &str) -> ParsedRequest {
        let mut body = json!({"model":"m","messages":[{"role":"user","content":text}]});
        if let Some(s) = salt {
            body["cache_salt"] = json!(s);
        }
        parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap()
    }

    const LONG: &str = "the quick brown fox jumps over the lazy dog and keeps running far away ";

    #[test]
    fn media_and_batch_requests_are_routed_on_load_alone() {
        let r = router();
        let idle = |_: &str| WorkerLoad::default();
        let body = json!({"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":LONG},{"type":"image_url","image_url":{"url":"x"}}]}]});
        let q = parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap();
        let d = r.decide(&q, 400, &idle, 0, 0).unwrap();
        assert_eq!(d.fallback, Some(FallbackReason::Multimodal));
        assert!(d.block_hashes.is_empty() && d.primary().is_some());
        let body = json!({"model":"m","prompt":[LONG, LONG]});
        let q = parse(Endpoint::Completions, body.to_string().as_bytes()).unwrap();
        let d = r.decide(&q, 400, &idle, 0, 0).unwrap();
        assert_eq!(d.fallback, Some(FallbackReason::Batch));
        assert!(d.block_hashes.is_empty());
    }

    #[test]
    fn credited_worker_wins_and_unknown_model_is_404() {
        let mut r = router();
        let idle = |_: &str| WorkerLoad::default();
        let q = req(None, &LONG.repeat(20));
        let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
        assert!(d.block_hashes.len() > 10);
        assert_eq!(d.predicted_cached_tokens(), 0);
        r.observe("127.0.0.1:2", &d.block_hashes, Source::Routed, 0);
        let d2 = r.decide(&q, 0, &idle, 10, 0).unwrap();
        assert_eq!(d2.primary().unwrap().worker, "127.0.0.1:2");
        assert_eq!(d2.knowledge_age_ms, 10);
        assert_eq!(d2.predicted_cached_tokens(), d.block_hashes.len() as u64 * 16);
        assert_eq!(d2.header_value().split(',').count(), 2);
        let mut other = q.clone();
        other.model = "nope".into();
        assert_eq!(r.decide(&other, 0, &idle, 0, 0).unwrap_err().status, 404);
    }

    #[test]
    fn tenants_never_share_cache_credit() {
        let mut r = router();
        let idle = |_: &str| WorkerLoad::default();
        let a = r.decide(&req(Some("tenant-a"), &LONG.repeat(20)), 0, &idle, 0, 0).unwrap();
        r.observe("127.0.0.1:3", &a.block_hashes, Source::Routed, 0);
        let b = r.decide(&req(Some("tenant-b"), &LONG.repeat(20)), 0, &idle, 0, 0).unwrap();
        assert_eq!(b.predicted_cached_tokens(), 0);
        assert!(a.block_hashes.iter().all(|h| !b.block_hashes.contains(h)));
        let a2 = r.decide(&req(Some("tenant-a"), &LONG.repeat(20)), 0, &idle, 0, 0).unwrap();
        assert!(a2.predicted_cached_tokens() > 0);
    }

    #[test]
    fn busy_holder_loses_to_recompute_once_waiting_costs_more() {
        let mut r = router();
        let q = req(None, &LONG.repeat(20));
        let d = r.decide(&q, 0, &|_| WorkerLoad::default(), 0, 0).unwrap();
        r.observe("127.0.0.1:1", &d.block_hashes, Source::Routed, 0);
        let busy = |w: &str| {
            if w == "127.0.0.1:1" {
                WorkerLoad {
                    inflight_requests: 20,
                    prefilling_requests: 20,
                    prefill_tokens: 80_000,
                }
            } else {
                WorkerLoad::default()
            }
        };
        let d2 = r.decide(&q, 0, &busy, 1, 0).unwrap();
        assert_ne!(d2.primary().unwrap().worker, "127.0.0.1:1");
    }

    #[test]
    fn snapshots_credit_events_and_incompatible_workers_get_none() {
        use crate::snapshot::{Snapshot, WorkerKnowledge};
        let mut r = router();
        let idle = |_: &str| WorkerLoad::default();
        let q = req(None, &LONG.repeat(20));
        let d = r.decide(&q, 0, &idle, 0, 0).unwrap();
        let view = |w: &str, compatible| WorkerKnowledge {
            worker: w.into(),
            observed_at_ms: 100,
            compatible,
            gpu: d.block_hashes.clone(),
            offloaded: vec![],
            load: None,
            ..Default::default()
        };
        let snap = Snapshot {
            version: 2,
            generated_at_ms: 100,
            workers: vec![view("127.0.0.1:2", true), view("127.0.0.1:3", false)],
            ..Default::default()
        };
        r.apply_snapshot(&snap);
        r.events_checked(100);
        let d2 = r.decide(&q, 0, &idle, 150, 0).unwrap();
        assert_eq!(d2.primary().unwrap().worker, "127.0.0.1:2");
        assert_eq!(d2.blocks_from_events, d.block_hashes.len());
        assert_eq!(d2.fallback, None);
        let incompatible = d2.ranked.iter().find(|s| s.worker == "127.0.0.1:3").unwrap();
        assert_eq!(incompatible.cached_tokens, 0, "an incompatible worker got cache credit");
        // Unconfirmed past the age limit: events no longer count, and the decision says so.
        let d3 = r.decide(&q, 0, &idle, 100 + 6_000, 0).unwrap();
        assert_eq!(d3.fallback, Some(FallbackReason::StaleEvents));
        assert_eq!(d3.blocks_from_events, 0);
    }

    #[test]
    fn deltas_move_the_view_like_full_snapshots_and_offloaded_blocks_cost_a_transfer() {
        use crate::delta::Delta;
        use crate::snapshot::{Snapshot, WorkerKnowledge};
        let idle = |_: &str| WorkerLoad::default();
        let q = req(None, &LONG.repeat(20));
        let r = router();
        let hashes = r.decide(&q, 0, &idle, 0, 0).unwrap().block_hashes;
        let mut sorted = hashes.clone();
        sorted.sort_unstable();
        let view = |w: &str, gpu: Vec<u64>, offloaded: Vec<u64>| WorkerKnowledge {
            worker: w.into(),
            observed_at_ms: 100,
            compatible: true,
            gpu,
            offloaded,
            load: None,
            ..Default::default()
        };
        let s1 = Snapshot {
            version: 1,
            generated_at_ms: 100,
            workers: vec![view("127.0.0.1:1", vec![], vec![]), view("127.0.0.1:2", vec![], vec![])],
            ..Default::default()
        };
        // Worker 2 holds the whole prefix, but only in CPU memory.
        let s2 = Snapshot {
            version: 2,
            generated_at_ms: 100,
            workers: vec![
                view("127.0.0.1:1", vec![], vec![]),
                view("127.0.0.1:2", vec![], sorted.clone()),
            ],
            ..Default::default()
        };
        // Then it is loaded back to the GPU, and worker 1 computes the first half.
        let half = {
            let mut h = hashes[..hashes.len() / 2].to_vec();
            h.sort_unstable();
            h
        };
        let s3 = Snapshot {
            version: 3,
            generated_at_ms: 100,
            workers: vec![view("127.0.0.1:1", half, vec![]), view("127.0.0.1:2", sorted, vec![])],
            ..Default::default()
        };
        let mut full = router();
        let mut delta = router();
        full.events_checked(100);
        delta.events_checked(100);
        full.apply_snapshot(&s1);
        delta.apply_snapshot(&s1);
        let decide = |r: &Router| r.decide(&q, 0, &idle, 150, 0).unwrap();
        for s in [&s2, &s3] {
            let prev = if s.version == 2 { &s1 } else { &s2 };
            full.apply_snapshot(s);
            delta.apply_delta(&Delta::between(prev, s));
            assert_eq!(decide(&full).ranked, decide(&delta).ranked, "version {}", s.version);
        }
        let mut r = router();
        r.events_checked(100);
        r.apply_snapshot(&s2);
        let d = decide(&r);
        let w2 = d.primary().unwrap();
        assert_eq!(w2.worker, "127.0.0.1:2", "loading from CPU beats recomputing");
        assert!(w2.cached_tokens > 0 && w2.transfer_ms > 0.0);
        r.apply_delta(&Delta::between(&s2, &s3));
        let d = decide(&r);
        assert_eq!(d.primary().unwrap().worker, "127.0.0.1:2");
        assert_eq!(d.primary().unwrap().transfer_ms, 0.0, "back on the GPU: no transfer");
    }

    #[test]
    fn reported_load_counts_what_other_replicas_sent() {
        use crate::snapshot::ReportedLoad;
        let own = WorkerLoad { inflight_requests: 3, prefilling_requests: 1, prefill_tokens: 500 };
        assert_eq!(combine_load(own, None), own);
        let busy = ReportedLoad { running: 10, waiting: 4, observed_at_ms: 0 };
        let c = combine_load(own, Some(&busy));
        assert_eq!((c.prefilling_requests, c.decoding_requests(), c.prefill_tokens), (4, 10, 500));
        let quiet = ReportedLoad { running: 0, waiting: 0, observed_at_ms: 0 };
        assert_eq!(combine_load(own, Some(&quiet)), own, "a lagging report never hides own load");
    }
}
