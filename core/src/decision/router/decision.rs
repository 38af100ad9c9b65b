//! What a decision produces: the ranked workers, the prompt's block hashes, the plan entry it
//! was made with, and why it fell back to load alone if it did.

use std::sync::Arc;

use crate::decision::audit::{classify, prediction_error, AuditClass};
use crate::decision::cost::Score;
use crate::decision::load::WorkerLoad;
use crate::decision::topology::TopologyConfig;
use crate::wire::snapshot::SnapshotLoad;

use super::plan::ModelPlan;

/// Why a decision was made without cache knowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// The chat template failed to render this request.
    Render,
    /// The tokenizer failed on this request.
    Tokenize,
    /// The prompt is longer than `max_prompt_tokens` or its body than `max_prompt_bytes`, or
    /// the body is nested deeper than kvroute keeps (`request::pyjson::MAX_DEPTH`).
    TooLong,
    /// Event knowledge exists but the updater has not confirmed it within its age limit:
    /// decided on routing history and feedback only.
    StaleEvents,
    /// Messages with media parts: the engine's cache keys include media kvroute does not see,
    /// so only the blocks before the first media part are credited.
    Multimodal,
    /// A completion with several prompts.
    Batch,
    /// The model's bundle (from the updater through shared data) is not built yet.
    NoBundle,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 7] = [
        FallbackReason::Render,
        FallbackReason::Tokenize,
        FallbackReason::TooLong,
        FallbackReason::StaleEvents,
        FallbackReason::Multimodal,
        FallbackReason::Batch,
        FallbackReason::NoBundle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FallbackReason::Render => "render_error",
            FallbackReason::Tokenize => "tokenize_error",
            FallbackReason::TooLong => "too_long",
            FallbackReason::StaleEvents => "stale_events",
            FallbackReason::Multimodal => "multimodal",
            FallbackReason::Batch => "batch_prompt",
            FallbackReason::NoBundle => "no_bundle",
        }
    }
}

/// What the router decided for one request; holds no prompt text.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Workers in order of preference: primary first, then fallbacks; at most
    /// [`MAX_RANKED`](crate::decision::cost::MAX_RANKED) of them and the few that admission
    /// and the look-ahead read beyond those (see [`crate::decision::cost::rank`]).
    pub ranked: Vec<Score>,
    pub block_hashes: Vec<u64>,
    pub prompt_tokens: u64,
    pub block_size: u32,
    /// Age of the oldest knowledge credited to the primary (ms).
    pub knowledge_age_ms: u64,
    /// How many of the primary's credited blocks come from its KV events.
    pub blocks_from_events: usize,
    /// How many of the primary's credited blocks only another Envoy replica's routing vouches
    /// for (relayed by the updater).
    pub blocks_from_peers: usize,
    pub fallback: Option<FallbackReason>,
    /// The plan entry of the request's (base) model: the bundle, pool and profile the decision
    /// was made with, kept for the request's lifetime whatever plan replaces it.
    pub model: Arc<ModelPlan>,
    /// The LoRA adapter the request names, if any.
    pub adapter: Option<String>,
    /// Time spent rendering and tokenizing the prompt, in µs (0 without a clock, see
    /// [`super::Router::set_clock`]): the rest of the decision time is parsing, hashing,
    /// lookups and scoring.
    pub tokenize_us: u64,
    /// The look-ahead placed this hot prefix on one more worker on purpose (the primary does
    /// not hold it although a worker does).
    pub replicated: bool,
    /// A P/D pool's prefill workers in order of preference (empty for an aggregated pool):
    /// `ranked` then holds its decode workers, the primary's estimate being the whole request's.
    pub prefill: Vec<Score>,
    /// The topology the decision was made with (`None`: all local).
    pub topology: Option<Arc<TopologyConfig>>,
}

impl Decision {
    pub fn primary(&self) -> Option<&Score> {
        self.ranked.first()
    }

    /// Tokens the primary is expected to reuse: those it holds and those it pulls (an engine
    /// reports KV received through a connector as cached).
    pub fn predicted_cached_tokens(&self) -> u64 {
        self.primary().map_or(0, |s| s.cached_tokens + s.pull.as_ref().map_or(0, |p| p.tokens))
    }

    /// Tokens the primary must compute (what its load is charged with).
    pub fn uncached_tokens(&self) -> u64 {
        self.primary().map_or(self.prompt_tokens, |s| s.uncached_tokens)
    }

    /// The destination header value: `primary,fallback`.
    pub fn header_value(&self) -> String {
        self.ranked.iter().take(2).map(|s| s.worker.as_str()).collect::<Vec<_>>().join(",")
    }

    /// Request headers to set besides the destination, `(name, value)`: the holder the primary
    /// pulls the prefix from, and a P/D pool's prefill worker.
    pub fn steering_headers(&self) -> Vec<(&str, &str)> {
        let mut out = Vec::new();
        if let (Some(t), Some(pull)) =
            (self.topology.as_deref(), self.primary().and_then(|s| s.pull.as_ref()))
        {
            out.push((t.transfer.header.as_str(), pull.from.as_str()));
        }
        if let Some(p) = self.prefill.first() {
            out.push((self.model.pd_header.as_str(), p.worker.as_str()));
        }
        out
    }

    /// The cost and topology fields of the decision header for the worker that `served`: the
    /// delay the request was predicted to add to the streams it runs (`stall_ms`, summed over
    /// them), how many it decodes (`decoding`), and the part of that delay that is the
    /// request's growth of its decode batch (`growth_ms`); the part of its predicted wait that
    /// is the more urgent requests foreseen to pass it (`passed_ms`); `kv_source`, `prefill`,
    /// `network_ms`,
    /// `transfer_ms`, `site`, `cross_site`, and where the site comes from (`site_source`:
    /// `config`, `discovered` or `none`) and, when discovered, how long ago the updater saw it
    /// (`site_age_ms`, at `now_ms`).
    pub fn detail_fields(&self, served: &str, now_ms: u64) -> String {
        let score = self.ranked.iter().find(|s| s.worker == served);
        let pull = score.and_then(|s| s.pull.as_ref());
        let (site, cross, source, seen) = match self.topology.as_deref() {
            Some(t) => {
                let p = t.placement(served);
                let site = if p.known { p.site.unwrap_or_default() } else { "unknown".into() };
                (site, t.is_cross_site(served), p.source, p.observed_at_ms)
            }
            None => ("unknown".into(), false, "none", None),
        };
        let age = seen.map_or("none".into(), |at| now_ms.saturating_sub(at).to_string());
        format!(
            "stall_ms={:.1}; decoding={}; growth_ms={:.1}; passed_ms={:.1}; kv_source={}; prefill={}; network_ms={:.1}; transfer_ms={:.1}; site={site}; cross_site={}; site_source={source}; site_age_ms={age}",
            score.map_or(0.0, |s| s.stall_ms),
            score.map_or(0, |s| s.load.decoding_requests()),
            score.map_or(0.0, |s| s.growth_ms),
            score.map_or(0.0, |s| s.passed_ms),
            pull.map_or("none", |p| p.from.as_str()),
            self.prefill.first().map_or("none", |p| p.worker.as_str()),
            score.map_or(0.0, |s| s.network_ms),
            pull.map_or(0.0, |p| p.ms),
            u8::from(cross)
        )
    }

    /// Classifies what the worker reported against this decision's prediction.
    pub fn audit(&self, actual_cached: u64) -> AuditClass {
        classify(self.predicted_cached_tokens(), actual_cached, self.prompt_tokens, self.block_size)
    }

    /// Reported minus predicted cached tokens (see [`prediction_error`]).
    pub fn prediction_error(&self, actual_cached: u64) -> i64 {
        prediction_error(
            self.predicted_cached_tokens(),
            actual_cached,
            self.prompt_tokens,
            self.block_size,
        )
    }
}

/// Combines the router's own load accounting with what the worker reported: the worker sees
/// traffic from every router replica and from clients that bypass kvroute, the router sees its
/// own requests without delay. Each count takes the larger of the two. Workers do not report
/// queued tokens, so each waiting request the router did not send is costed at
/// `unseen_tokens` (the uncached tokens of a typical request: see
/// `Knowledge::typical_uncached_tokens`) on top of the router's own queued tokens.
pub fn combine_load(
    own: WorkerLoad,
    reported: Option<&SnapshotLoad>,
    unseen_tokens: u64,
) -> WorkerLoad {
    let Some(r) = reported else { return own };
    let prefilling = own.prefilling_requests.max(r.waiting);
    let decoding = own.decoding_requests().max(r.running);
    let unseen = u64::from(prefilling - own.prefilling_requests.min(prefilling));
    // Most workers report no request the router did not see: no products to take (a 64-bit
    // product checked for overflow is a call on 32-bit wasm).
    let (prefill_tokens, prefill_sq_tokens) = if unseen == 0 {
        (own.prefill_tokens, own.prefill_sq_tokens)
    } else {
        (
            own.prefill_tokens.saturating_add(unseen.saturating_mul(unseen_tokens)),
            own.prefill_sq_tokens
                .saturating_add(unseen.saturating_mul(unseen_tokens.saturating_mul(unseen_tokens))),
        )
    };
    WorkerLoad {
        inflight_requests: prefilling.saturating_add(decoding),
        prefilling_requests: prefilling,
        prefill_tokens,
        prefill_elapsed_ms: own.prefill_elapsed_ms,
        prefill_sq_tokens,
        arriving_tokens_per_s: own.arriving_tokens_per_s,
        behind_tokens: own.behind_tokens,
        passing_tokens_per_s: own.passing_tokens_per_s,
    }
}
