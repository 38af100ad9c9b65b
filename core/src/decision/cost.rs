//! The cost model: estimated time to first token in milliseconds, and ordered selection.
//!
//! `ttft(w) = network(w) + wait(w) + prefill(uncached(w)) + transfer(offloaded(w)) + adapter(w)`,
//! where
//! `wait(w)` is the prefill work already queued on `w` (router-tracked uncached tokens of
//! requests not yet at first token) plus the slowdown from the requests `w` is decoding,
//! `transfer` moves prefix blocks that `w` holds only on a lower tier (CPU, storage) back to
//! the GPU, and `adapter` loads the request's LoRA adapter on a worker that has not loaded it.
//! The profile's numbers come from the plugin config.
//!
//! With a topology ([`crate::decision::topology`]) a candidate also has a [`Reach`]: the round
//! trip from this Envoy to it (`network`), a fixed extra such as a P/D hand-off, and the pulls
//! it could make: a holder with more of the prefix whose blocks it could receive over their
//! link. Its prefill is then `min(prefill(what it lacks), pull(holder's extra blocks) +
//! prefill(the rest))` over the offered holders. Without a topology every reach is zero and
//! the estimates are exactly the topology-free ones.

use std::borrow::Borrow;

use serde::{Deserialize, Serialize};

use crate::decision::load::WorkerLoad;
use crate::decision::worker::WorkerName;

mod fill;
mod order;
pub use fill::fill_forecast_ms;
pub(crate) use order::rank_pool;
pub use order::{rank, rank_reached, MAX_RANKED};

/// Per-model timing profile (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Profile {
    /// Fixed cost of a prefill (scheduling, one forward pass floor).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub prefill_base_ms: f64,
    /// Linear prefill cost per uncached token.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub prefill_ms_per_token: f64,
    /// Quadratic (attention) term per uncached token squared.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub prefill_ms_per_token_sq: f64,
    /// Extra wait per request the worker is decoding (decode steps interleave with prefill).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub decode_interference_ms: f64,
    /// What one more sequence in a worker's decode batch adds to each decode step, apart from
    /// its context (the batch's per-sequence work). With
    /// [`Profile::decode_ms_per_1k_context`], the price of a new stream's growth of the steps
    /// the worker's other streams run in ([`Score::stall_ms`]).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub decode_ms_per_seq: f64,
    /// What 1 000 tokens of one more sequence's context add to each decode step (its KV cache
    /// is read once per step).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub decode_ms_per_1k_context: f64,
    /// Cost of loading one cached token's KV from a lower tier (CPU, storage) to the GPU.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub transfer_ms_per_token: f64,
    /// Cost of loading a LoRA adapter on a worker that has not loaded it (reading the weights
    /// and moving them to the GPU), paid by a request for that adapter before its prefill.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub adapter_load_ms: f64,
    /// The most prompt tokens the engine prefills in one step (vLLM's
    /// `--max-num-batched-tokens`, SGLang's `--chunked-prefill-size`): behind a busy worker a
    /// request's first token comes when the step carrying its last chunk ends, and that step
    /// fills up with the prompts that arrive after it. The prior of that wait is
    /// [`BATCH_FILL_PRIOR`] of a step of this many tokens; calibration learns the real one.
    /// 0: the engine does not batch prefills (no such wait).
    pub step_token_budget: u64,
    /// What the queued prefill ahead of a request costs it, where calibration learned it apart
    /// from the request's own prefill ([`QueueTerms`]); `None` (always, in a configured
    /// profile): the queue costs what the same prefill would cost the request itself.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub queue: Option<QueueTerms>,
}

/// The coefficients of the queued prefill a request waits for, learned apart from its own.
///
/// Queued work costs a new request more than its compute alone: an engine batches the prefill
/// of every request waiting when a step starts, up to its token budget (vLLM's
/// `max_num_batched_tokens`, SGLang's chunked prefill size), so a request's first token comes
/// when the step carrying its last chunk ends, and that step also carries the requests that
/// arrived after it. How much that adds depends on the traffic, not on the worker's speed, so
/// calibration learns it as the queue's own coefficients and a request with nothing queued
/// ahead is estimated at the worker's speed alone (see [`crate::decision::calib`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueTerms {
    /// Per request still in prefill ahead.
    pub step_ms: f64,
    /// Per queued uncached token.
    pub ms_per_token: f64,
    /// Per queued token squared (the queued prompts' attention).
    pub ms_per_token_sq: f64,
    /// Once on a busy worker (a prefill queued or running): the share of the last step that the
    /// prompts arriving after the request fill ([`Profile::step_token_budget`]).
    pub batch_fill_ms: f64,
    /// What admission multiplies a busy worker's estimate by before it promises a deadline or
    /// a class's `max_wait_ms` (>= 1): the calibrated upper quantile of observed over
    /// estimated TTFT behind a queue, where the estimate is an average over traffic it cannot
    /// see (see [`Score::promise_ttft_ms`]).
    pub promise_margin: f64,
    /// What admission adds to a busy worker's estimate before the margin, while the
    /// calibration has seen too few requests behind a queue to know its margin
    /// ([`crate::decision::calib::PROMISE_FILL_SAMPLES`]): the rest of a whole step's budget
    /// beyond the learned batch fill (the most that prompts arriving after the request can add
    /// to its last step), times the share of those samples not yet seen. 0 once the margin is
    /// known, and in a configured profile.
    pub promise_fill_ms: f64,
}

/// The share of a step's token budget that a request behind a busy worker is expected to wait
/// for beyond the queue ahead of it, before calibration learns it. Small: at light load the
/// steps are short and nothing fills them (a large prior would price every busy worker as if
/// overloaded and undo cache-aware routing); under a sustained overload the steps run full and
/// the learned share rises towards half a step (where a request's prompt ends in its last step
/// is uniform), at most a whole one ([`BATCH_FILL_MAX`]).
pub const BATCH_FILL_PRIOR: f64 = 0.02;
/// The most a learned batch fill may be: a whole step's budget.
pub const BATCH_FILL_MAX: f64 = 1.0;

impl Default for Profile {
    /// An 8B-class model on one H100: ~30 k prefill tokens/s, ~5 ms decode step floor.
    fn default() -> Self {
        Profile {
            prefill_base_ms: 5.0,
            prefill_ms_per_token: 0.033,
            prefill_ms_per_token_sq: 4.2e-7,
            decode_interference_ms: 0.5,
            // Published Llama-3.1-8B serving figures (NVIDIA NIM benchmarks): ITL 4.63 ms at
            // concurrency 1, 7.57 ms at 100, i.e. about 0.03 ms per sequence in the batch.
            decode_ms_per_seq: 0.03,
            // Each step reads every sequence's KV: 128 KiB per token (below) at 3.35 TB/s is
            // 0.04 ms per 1 000 tokens.
            decode_ms_per_1k_context: 0.04,
            // 128 KiB of KV per token (32 layers x 8 KV heads x 128 dims x K,V x bf16) over
            // PCIe 5 at ~50 GB/s.
            transfer_ms_per_token: 0.0026,
            // A rank-16 adapter of an 8B model (tens of MB) read from local disk.
            adapter_load_ms: 250.0,
            // vLLM's default for its OpenAI server on an 80 GB H100.
            step_token_budget: 8192,
            queue: None,
        }
    }
}

impl Profile {
    pub fn prefill_ms(&self, tokens: u64) -> f64 {
        self.prefill_with_context_ms(tokens, 0)
    }

    /// Prefill of `tokens` new tokens on top of `cached` tokens already in the sequence's KV
    /// (a reused prefix): each new token attends to the whole context, so the attention term is
    /// `n · (2c + n)` (the square of the full prompt less the square of the reused part), and a
    /// partial hit on a long prefix is not as cheap as a short prompt of the same new tokens.
    pub fn prefill_with_context_ms(&self, tokens: u64, cached: u64) -> f64 {
        let n = tokens as f64;
        self.prefill_base_ms
            + self.prefill_ms_per_token * n
            + self.prefill_ms_per_token_sq * attention_tokens(tokens, cached)
    }

    /// `load` with the prefill its worker has done already taken off: since the oldest request
    /// still in prefill was sent, `prefill_elapsed_ms` of work (at this profile's speed times
    /// the worker's `deviation`) went into the queue, whose blocks are landing. The returned
    /// load counts only the tokens still to compute (and no elapsed time).
    ///
    /// A queued token costs its linear part plus its share of the queue's attention
    /// (`prefill_sq_tokens / prefill_tokens` of the squared term); the squares shrink with the
    /// tokens left (as if every queued prompt had been worked on alike).
    pub fn remaining(&self, load: &WorkerLoad, deviation: f64) -> WorkerLoad {
        // Nothing queued (an idle or decoding-only worker, most of a large pool): nothing left.
        if load.prefill_tokens == 0 {
            return WorkerLoad { prefill_sq_tokens: 0, prefill_elapsed_ms: 0, ..*load };
        }
        let tokens = load.prefill_tokens as f64;
        let sq = load.prefill_sq_tokens as f64;
        let attention_per_token = if tokens > 0.0 { sq / tokens } else { 0.0 };
        let per_token = (self.prefill_ms_per_token
            + self.prefill_ms_per_token_sq * attention_per_token)
            * deviation;
        let done = if per_token > 0.0 && per_token.is_finite() {
            (load.prefill_elapsed_ms as f64 / per_token) as u64
        } else {
            0
        };
        let left = load.prefill_tokens.saturating_sub(done);
        let share = if tokens > 0.0 { left as f64 / tokens } else { 0.0 };
        WorkerLoad {
            prefill_tokens: left,
            prefill_sq_tokens: (sq * share * share) as u64,
            prefill_elapsed_ms: 0,
            ..*load
        }
    }

    /// Waiting time before a new request's prefill starts on a worker with `load`: the queued
    /// prefill (linear and attention terms, one base per request; times [`passed_factor`] on a
    /// busy worker), the fill of the step it waits for and the decoding requests' interference.
    pub fn wait_ms(&self, load: &WorkerLoad) -> f64 {
        let factor = if busy(load) > 0.0 { passed_factor(self, load, 1.0) } else { 1.0 };
        self.wait_with(&self.queue_terms(), load, factor)
    }

    /// [`Profile::wait_ms`] with the queue's coefficients `q` already taken
    /// ([`Profile::queue_terms`]; a decision takes them once, not per worker) and the queued
    /// prefill's [`passed_factor`] `passed`.
    fn wait_with(&self, q: &QueueTerms, load: &WorkerLoad, passed: f64) -> f64 {
        let queued = load.prefill_tokens as f64 * q.ms_per_token
            + load.prefill_sq_tokens as f64 * q.ms_per_token_sq
            + queued_steps(load) * q.step_ms;
        queued * passed
            + busy(load) * q.batch_fill_ms
            + f64::from(load.decoding_requests()) * self.decode_interference_ms
    }

    /// The coefficients of queued prefill: the learned ones, else the request's own.
    pub fn queue_terms(&self) -> QueueTerms {
        self.queue.unwrap_or(QueueTerms {
            step_ms: self.prefill_base_ms,
            ms_per_token: self.prefill_ms_per_token,
            ms_per_token_sq: self.prefill_ms_per_token_sq,
            batch_fill_ms: BATCH_FILL_PRIOR
                * self.step_token_budget as f64
                * self.prefill_ms_per_token,
            promise_margin: 1.0,
            promise_fill_ms: 0.0,
        })
    }

    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("prefill_base_ms", self.prefill_base_ms),
            ("prefill_ms_per_token", self.prefill_ms_per_token),
            ("prefill_ms_per_token_sq", self.prefill_ms_per_token_sq),
            ("decode_interference_ms", self.decode_interference_ms),
            ("decode_ms_per_seq", self.decode_ms_per_seq),
            ("decode_ms_per_1k_context", self.decode_ms_per_1k_context),
            ("transfer_ms_per_token", self.transfer_ms_per_token),
            ("adapter_load_ms", self.adapter_load_ms),
        ];
        for (name, v) in fields {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("profile.{name} must be a finite number >= 0, got {v}"));
            }
        }
        if self.prefill_ms_per_token <= 0.0 && self.prefill_ms_per_token_sq <= 0.0 {
            return Err("profile: prefill must cost something per token".into());
        }
        Ok(())
    }
}

/// The step floors (`base`) a new request waits for on a worker with `load` before its own:
/// one per request still in prefill.
pub fn queued_steps(load: &WorkerLoad) -> f64 {
    f64::from(load.prefilling_requests)
}

/// The most of a worker's prefill time that more urgent arrivals are taken to use in
/// [`passed_factor`]: beyond it a less urgent request's wait is taken as ten times the work
/// ahead of it (it may never start while they keep coming; admission sheds it on its bound).
pub const PASSED_SHARE_MAX: f64 = 0.9;

/// How much longer than the work queued ahead of it a request waits on a busy worker whose
/// engine schedules by priority while more urgent prompts keep arriving there
/// ([`WorkerLoad::passing_tokens_per_s`]). The engine starts each of them before it, so they
/// take their share `ρ` of the worker's prefill time (their tokens per millisecond times the
/// profile's prefill cost per token and the worker's `deviation`), and a wait `W` for queued
/// prefill `W₀` is `W₀ + ρ · W`, i.e. `W₀ / (1 − ρ)`. But the engine's next step takes the
/// queue's first [`Profile::step_token_budget`] prompt tokens whatever arrives, so only the
/// share of the queued prefill beyond that budget is stretched: the factor on the queued
/// prefill is `1 + (1 / (1 − ρ) − 1) · beyond`, `beyond` the share of the queued tokens past
/// one step's budget (all of them where the budget is 0, unknown). `ρ` is held at most
/// [`PASSED_SHARE_MAX`]. 1 where nothing passes or the queue fits in one step.
pub fn passed_factor(profile: &Profile, load: &WorkerLoad, deviation: f64) -> f64 {
    let queued = load.prefill_tokens;
    if load.passing_tokens_per_s == 0 || queued == 0 {
        return 1.0;
    }
    let budget = profile.step_token_budget;
    let beyond =
        if budget == 0 { 1.0 } else { queued.saturating_sub(budget) as f64 / queued as f64 };
    let share =
        load.passing_tokens_per_s as f64 * profile.prefill_ms_per_token * deviation / 1000.0;
    if beyond > 0.0 && share.is_finite() && share > 0.0 {
        1.0 + (1.0 / (1.0 - share.min(PASSED_SHARE_MAX)) - 1.0) * beyond
    } else {
        1.0
    }
}

/// 1 on a busy worker (a prefill queued or running), else 0: whether a request waits for a
/// step that later arrivals fill ([`QueueTerms::batch_fill_ms`]).
pub fn busy(load: &WorkerLoad) -> f64 {
    f64::from(u8::from(load.prefilling_requests > 0))
}

/// The attention work of `tokens` new tokens on top of `cached` ones: `n · (2c + n)`, i.e.
/// `(c + n)² − c²` without the cancellation of two large squares.
pub fn attention_tokens(tokens: u64, cached: u64) -> f64 {
    let (n, c) = (tokens as f64, cached as f64);
    n * (2.0 * c + n)
}

/// The delay a new request placed on a worker with `load` adds to the streams it runs there,
/// summed over them:
/// - its prefill of `prefill_ms`: an engine runs a new prompt's prefill in the same steps as
///   its running decodes (vLLM's chunked prefill puts each chunk in a step with one token of
///   every decoding sequence; SGLang runs the prefill batch between decode batches), so every
///   decoding sequence waits about the prefill's compute time, in one gap or spread over a few;
/// - its own decode, `growth_ms` summed over the streams beside it ([`growth_ms`]).
pub fn stall_ms(load: &WorkerLoad, prefill_ms: f64, growth_ms: f64) -> f64 {
    f64::from(load.decoding_requests()) * prefill_ms + growth_ms
}

/// The growth a new stream adds, over its decode, to the steps of the requests in flight on a
/// worker with `load`, summed over them: `per_stream` ([`stream_growth_ms`]) for each, since
/// once it decodes each step carries one more sequence, and every request in flight there
/// (those still in prefill decode soon) runs in those longer steps.
pub fn growth_ms(load: &WorkerLoad, per_stream: f64) -> f64 {
    f64::from(load.inflight_requests) * per_stream
}

/// What a new stream of `context_tokens` (its prompt) decoding for `steps` steps adds to the
/// steps of one other stream running beside it: the batch's per-sequence work and the read of
/// its KV cache, in each of those steps. An estimate over the new stream's length, capped by
/// the caller: the other stream may end sooner, and the new one's context grows as it decodes.
pub fn stream_growth_ms(profile: &Profile, context_tokens: u64, steps: u64) -> f64 {
    let per_step = profile.decode_ms_per_seq
        + profile.decode_ms_per_1k_context * context_tokens as f64 / 1000.0;
    per_step * steps as f64
}

/// One worker as seen at decision time. `W`: its name, owned or borrowed from the pool (a
/// router's decisions borrow it: cloning a name writes to its allocation, a cache miss per
/// worker of a large pool).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<W = WorkerName> {
    pub worker: W,
    /// Leading prompt blocks believed cached on this worker (any tier).
    pub cached_blocks: usize,
    /// How many of those sit only on a lower tier and must be transferred.
    pub offloaded_blocks: usize,
    pub load: WorkerLoad,
    /// The request names a LoRA adapter this worker has not loaded.
    pub adapter_missing: bool,
    /// This worker's learned speed relative to the model's profile (online calibration;
    /// 1.0 without it): its wait and prefill estimates are multiplied by it.
    pub deviation: f64,
}

impl<W: Borrow<WorkerName>> Candidate<W> {
    /// The worker's name.
    pub fn name(&self) -> &WorkerName {
        self.worker.borrow()
    }
}

/// A candidate's estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    pub worker: WorkerName,
    pub cached_tokens: u64,
    pub uncached_tokens: u64,
    pub wait_ms: f64,
    pub prefill_ms: f64,
    pub transfer_ms: f64,
    /// Loading the request's adapter (0 where it is loaded, or for a base-model request).
    pub adapter_ms: f64,
    /// The round trip from this Envoy to the worker plus any fixed extra of its [`Reach`].
    pub network_ms: f64,
    /// The pull chosen for this worker, if pulling beats recomputing what it lacks.
    pub pull: Option<PullPlan>,
    pub ttft_ms: f64,
    /// The delay this request adds to the streams the worker runs, summed over them (ms):
    /// each decoding one shares the steps its prefill runs in, so each waits about its prefill
    /// time, and each in flight there runs in steps its decode makes longer ([`stall_ms`]).
    pub stall_ms: f64,
    /// The part of [`Score::stall_ms`] that is the request's growth of the decode batch: the
    /// requests in flight there times [`stream_growth_ms`] (ms).
    pub growth_ms: f64,
    /// What the ranking minimises: `ttft_ms − passed_ms + stall_weight · stall_ms` (see
    /// [`rank`]).
    pub cost_ms: f64,
    /// The load the estimate saw, with the prefill done already taken off (online calibration
    /// learns from it).
    pub load: WorkerLoad,
    /// The deviation factor applied to `wait_ms` and `prefill_ms`.
    pub deviation: f64,
    /// The factor admission applies to this estimate before promising anything: the model's
    /// [`QueueTerms::promise_margin`] on a busy worker, 1 on one with nothing queued.
    pub promise_margin: f64,
    /// What admission adds to this estimate before the margin: the model's
    /// [`QueueTerms::promise_fill_ms`] (times the worker's deviation) on a busy worker, 0 on
    /// one with nothing queued, or [`Score::fill_forecast_ms`] where that is more.
    pub promise_extra_ms: f64,
    /// How much longer than the estimate's learned batch fill the step carrying the request's
    /// prompt is foreseen to run on a busy worker (ms, 0 on one with nothing queued): the
    /// engine fills that step, up to its token budget, with whatever is waiting when it
    /// starts, so the prompts arriving while the request waits for it join it, and on an
    /// engine that schedules by priority the less urgent ones queued behind it. Foreseen from
    /// the worker's arrival rate ([`WorkerLoad::arriving_tokens_per_s`]) over the wait for the
    /// queue ahead plus [`WorkerLoad::behind_tokens`], at most the room the request's last
    /// chunk leaves in a step, at the worker's prefill speed ([`fill_forecast_ms`]). Admission promises with it
    /// ([`Score::promise_extra_ms`]), and the promise margin is learned against the estimate
    /// with it; the estimate and the ranking keep the learned average.
    pub fill_forecast_ms: f64,
    /// The factor on the queued prefill in `wait_ms` for the more urgent prompts foreseen to
    /// pass the request while it waits ([`passed_factor`]; 1 where none do). Online
    /// calibration learns the queue's coefficients with it.
    pub wait_factor: f64,
    /// What that factor adds to `wait_ms` (ms; 0 where it is 1). The estimate and admission's
    /// promise hold it; the ranking leaves it out ([`Score::cost_ms`]): the passing traffic is
    /// the more urgent class's, which the router places itself, and a first version ranked on
    /// it admitted fewer urgent requests (see the architecture's "the urgent work that passes
    /// it").
    pub passed_ms: f64,
}

impl Score {
    /// The TTFT admission promises: the estimate plus [`Score::promise_extra_ms`], times
    /// [`Score::promise_margin`].
    pub fn promise_ttft_ms(&self) -> f64 {
        (self.ttft_ms + self.promise_extra_ms) * self.promise_margin
    }

    /// The wait admission promises against a class's `max_wait_ms`.
    pub fn promise_wait_ms(&self) -> f64 {
        (self.wait_ms + self.promise_extra_ms) * self.promise_margin
    }
}

/// How a candidate is reached and what it could receive (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reach {
    /// Round trip from this Envoy to the worker (ms).
    pub network_ms: f64,
    /// A fixed extra on this worker's estimate (ms): a P/D hand-off to the decode worker.
    pub extra_ms: f64,
    /// Holders it could pull the prefix from.
    pub pulls: Vec<PullOffer>,
}

/// A holder a candidate could pull the prompt's prefix from.
#[derive(Debug, Clone, PartialEq)]
pub struct PullOffer {
    pub from: String,
    /// Leading prompt blocks the holder is believed to hold (any tier).
    pub blocks: usize,
    pub cost: crate::decision::topology::PullCost,
}

/// A pull a score counts on: `tokens` of the prefix from `from`, in `ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct PullPlan {
    pub from: String,
    pub tokens: u64,
    pub ms: f64,
}

/// How close two estimates must be to count as a tie (then the choice is random).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct TieBand {
    /// Absolute width of the band (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub abs_ms: f64,
    /// Width of the band relative to the best estimate (0.05: 5 %).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub rel: f64,
}

impl Default for TieBand {
    fn default() -> Self {
        TieBand { abs_ms: 2.0, rel: 0.05 }
    }
}

/// The most leading blocks an engine reuses for a prompt of `prompt_tokens` tokens.
///
/// The engine must compute at least the prompt's last token to get its logits, so its cache
/// lookup stops at `prompt_tokens - 1` tokens, rounded down to whole blocks: at most
/// `floor((n - 1) / block)` blocks. A prompt that is an exact multiple of the block size
/// reuses one block less than it holds (64 tokens at block 16: 48 cached), and a prompt of one
/// block or less reuses nothing. vLLM (its prefix-cache lookup bound) and SGLang (its radix
/// match bound, page-aligned) apply the same rule, so it needs no per-engine choice.
pub fn reusable_blocks(prompt_tokens: u64, block_size: u32) -> u64 {
    match u64::from(block_size) {
        0 => 0,
        bs => prompt_tokens.saturating_sub(1) / bs,
    }
}

/// [`reusable_blocks`] in tokens: the most cached tokens an engine reports for the prompt.
pub fn reusable_tokens(prompt_tokens: u64, block_size: u32) -> u64 {
    reusable_blocks(prompt_tokens, block_size) * u64::from(block_size)
}

/// Scores every candidate for a prompt of `prompt_tokens` tokens. Only the blocks the engine
/// will reuse ([`reusable_blocks`]) are credited, whatever the worker holds.
pub fn score<W: Borrow<WorkerName>>(
    profile: &Profile,
    c: &Candidate<W>,
    prompt_tokens: u64,
    block_size: u32,
) -> Score {
    score_reached(profile, c, &Reach::default(), prompt_tokens, block_size)
}

/// [`score`] with the candidate's [`Reach`]: its network time, and the best of the pulls it
/// is offered where one beats recomputing what it lacks.
pub fn score_reached<W: Borrow<WorkerName>>(
    profile: &Profile,
    c: &Candidate<W>,
    reach: &Reach,
    prompt_tokens: u64,
    block_size: u32,
) -> Score {
    estimate(profile, &Prompt::new(profile, prompt_tokens, block_size, &Weigh::default()), c, reach)
        .named(c.name().clone())
}

/// What every worker's estimate of one prompt shares, taken once per decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prompt {
    tokens: u64,
    block_size: u64,
    /// [`reusable_blocks`] of the prompt.
    reusable: u64,
    /// [`Profile::queue_terms`].
    queue: QueueTerms,
    /// [`stream_growth_ms`] of the prompt over the steps [`Weigh::stream_steps`] prices.
    growth_ms: f64,
}

impl Prompt {
    pub(crate) fn new(profile: &Profile, tokens: u64, block_size: u32, weigh: &Weigh) -> Prompt {
        Prompt {
            tokens,
            block_size: u64::from(block_size),
            reusable: reusable_blocks(tokens, block_size),
            queue: profile.queue_terms(),
            growth_ms: stream_growth_ms(profile, tokens, weigh.stream_steps),
        }
    }
}

/// A [`Score`] without the worker's name: what ranking a whole pool computes per worker.
/// Cloning a name touches its allocation, a cache miss per worker of a large pool; only the
/// workers a decision keeps are named.
#[derive(Debug, Clone)]
pub(crate) struct Estimate {
    cached_tokens: u64,
    uncached_tokens: u64,
    wait_ms: f64,
    prefill_ms: f64,
    transfer_ms: f64,
    adapter_ms: f64,
    network_ms: f64,
    pull: Option<PullPlan>,
    ttft_ms: f64,
    stall_ms: f64,
    growth_ms: f64,
    load: WorkerLoad,
    deviation: f64,
    promise_margin: f64,
    promise_extra_ms: f64,
    fill_forecast_ms: f64,
    wait_factor: f64,
    passed_ms: f64,
}

impl Estimate {
    pub(crate) fn named(self, worker: WorkerName) -> Score {
        let e = self;
        Score {
            worker,
            cached_tokens: e.cached_tokens,
            uncached_tokens: e.uncached_tokens,
            wait_ms: e.wait_ms,
            prefill_ms: e.prefill_ms,
            transfer_ms: e.transfer_ms,
            adapter_ms: e.adapter_ms,
            network_ms: e.network_ms,
            pull: e.pull,
            ttft_ms: e.ttft_ms,
            stall_ms: e.stall_ms,
            growth_ms: e.growth_ms,
            cost_ms: e.ttft_ms - e.passed_ms,
            load: e.load,
            deviation: e.deviation,
            promise_margin: e.promise_margin,
            promise_extra_ms: e.promise_extra_ms,
            fill_forecast_ms: e.fill_forecast_ms,
            wait_factor: e.wait_factor,
            passed_ms: e.passed_ms,
        }
    }

    /// What the ranking minimises: `ttft − passed + stall_weight · stall` (see
    /// [`Score::cost_ms`]).
    pub(crate) fn cost_ms(&self, stall_weight: f64) -> f64 {
        let ttft = self.ttft_ms - self.passed_ms;
        if stall_weight > 0.0 {
            ttft + stall_weight * self.stall_ms
        } else {
            ttft
        }
    }

    /// [`Score::promise_ttft_ms`].
    pub(crate) fn promise_ttft_ms(&self) -> f64 {
        (self.ttft_ms + self.promise_extra_ms) * self.promise_margin
    }

    /// [`Score::promise_wait_ms`].
    pub(crate) fn promise_wait_ms(&self) -> f64 {
        (self.wait_ms + self.promise_extra_ms) * self.promise_margin
    }
}

/// [`score_reached`] without naming the worker.
pub(crate) fn estimate<W>(
    profile: &Profile,
    p: &Prompt,
    c: &Candidate<W>,
    reach: &Reach,
) -> Estimate {
    let (prompt_tokens, reusable, bs) = (p.tokens, p.reusable, p.block_size);
    let blocks = (c.cached_blocks as u64).min(reusable);
    let cached = blocks * bs;
    let transferred = ((c.offloaded_blocks as u64).min(blocks)) * bs;
    let deviation = if c.deviation.is_finite() && c.deviation > 0.0 { c.deviation } else { 1.0 };
    let load = profile.remaining(&c.load, deviation);
    let queued = busy(&load) > 0.0;
    // Only a request that waits for a queue is passed in it.
    let wait_factor = if queued { passed_factor(profile, &load, deviation) } else { 1.0 };
    let wait_ms = profile.wait_with(&p.queue, &load, wait_factor) * deviation;
    let passed_ms = if wait_factor > 1.0 {
        wait_ms - profile.wait_with(&p.queue, &load, 1.0) * deviation
    } else {
        0.0
    };
    let prefill = |pulled: u64| {
        profile.prefill_with_context_ms(prompt_tokens - cached - pulled, cached + pulled)
            * deviation
    };
    let recompute_ms = prefill(0);
    // The best offer: the holder's extra blocks moved here, then the rest computed.
    let pull = reach
        .pulls
        .iter()
        .filter_map(|o| {
            let extra = (o.blocks as u64).min(reusable).checked_sub(blocks).filter(|&b| b > 0)?;
            let tokens = extra * bs;
            let ms = o.cost.ms(tokens);
            let total = ms + prefill(tokens);
            (total.is_finite() && total < recompute_ms)
                .then(|| (total, PullPlan { from: o.from.clone(), tokens, ms }))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.from.cmp(&b.1.from)))
        .map(|(_, p)| p);
    let pulled = pull.as_ref().map_or(0, |p| p.tokens);
    let prefill_ms = if pulled > 0 { prefill(pulled) } else { recompute_ms };
    let pull_ms = pull.as_ref().map_or(0.0, |p| p.ms);
    let transfer_ms = transferred as f64 * profile.transfer_ms_per_token;
    let adapter_ms = if c.adapter_missing { profile.adapter_load_ms } else { 0.0 };
    let network_ms = reach.network_ms + reach.extra_ms;
    let uncached = prompt_tokens - cached - pulled;
    let growth = growth_ms(&load, p.growth_ms);
    let fill_forecast_ms = if queued {
        fill::beyond_learned(profile, &p.queue, &load, (wait_ms, uncached), deviation)
    } else {
        0.0
    };
    Estimate {
        cached_tokens: cached,
        uncached_tokens: uncached,
        wait_ms,
        prefill_ms,
        transfer_ms,
        adapter_ms,
        network_ms,
        ttft_ms: network_ms + wait_ms + prefill_ms + transfer_ms + pull_ms + adapter_ms,
        stall_ms: stall_ms(&load, prefill_ms, growth),
        growth_ms: growth,
        pull,
        load,
        deviation,
        promise_margin: if queued { p.queue.promise_margin.max(1.0) } else { 1.0 },
        promise_extra_ms: if queued {
            (p.queue.promise_fill_ms.max(0.0) * deviation).max(fill_forecast_ms)
        } else {
            0.0
        },
        fill_forecast_ms,
        wait_factor,
        passed_ms,
    }
}

/// How candidates are weighed against each other.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Weigh {
    /// Estimates this close are a tie.
    pub tie: TieBand,
    /// Milliseconds of this request's TTFT one millisecond of delay to a running stream is
    /// worth ([`Score::stall_ms`]); 0 ranks on TTFT alone.
    pub stall_weight: f64,
    /// The decode steps of the request over which its growth of a worker's decode batch is
    /// priced ([`stream_growth_ms`]): its output tokens, as far as known and capped
    /// ([`Weigh::for_stream`]); 0 prices its prefill's stall alone.
    pub stream_steps: u64,
}

impl Weigh {
    /// Ties within `tie`, TTFT alone otherwise (no price on running streams).
    pub fn ties(tie: TieBand) -> Weigh {
        Weigh { tie, ..Weigh::default() }
    }

    /// This weighing for a request asking for at most `max_tokens` output tokens (`None`: as
    /// many as the engine allows): its growth of the decode batch priced over that many steps,
    /// at most `horizon` (the configured `stream_growth_tokens`). The first token comes from
    /// the prefill, so a request for one token adds no decode step.
    pub fn for_stream(self, max_tokens: Option<u64>, horizon: u64) -> Weigh {
        let steps = max_tokens.map_or(horizon, |m| m.min(horizon)).saturating_sub(1);
        Weigh { stream_steps: steps, ..self }
    }
}

#[cfg(test)]
mod fill_tests;
#[cfg(test)]
mod reach_tests;
#[cfg(test)]
mod stall_tests;

#[cfg(test)]
mod tests;
