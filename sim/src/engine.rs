//! The engine loop of one simulated worker: vLLM-style continuous batching with chunked
//! prefill. Every step admits waiting requests in queue order (while `max_num_seqs` and KV
//! blocks allow; the order is the scheduling policy's, [`SchedulingPolicy`]: arrival, or
//! `priority` then arrival),
//! gives each decoding sequence one token, spends the rest of `max_num_batched_tokens` on
//! prefill chunks, sleeps for the step's modelled duration, then caches every block that became
//! full (prompt or generated tokens) and publishes the matching KV events.
//!
//! Blocks are allocated as tokens are scheduled. When the cache is full, a running sequence is
//! preempted (FCFS: the most recently admitted; priority: the least urgent): its blocks are
//! freed (full ones stay cached) and it goes back to the queue, to be recomputed, as vLLM does.
//!
//! A request for a LoRA adapter is cached in that adapter's domain (its blocks never match the
//! base model's or another adapter's). As in vLLM's scheduler, at most `max_loras` adapters run
//! at once: a waiting request for another adapter is skipped (it keeps its place) while that
//! many are running.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cache::{engine_block_hash, engine_hashes, BlockCache, EngineHash};
use crate::events::KvEvent;

mod histogram;
mod kv;
mod sched;
mod timing;

pub use histogram::{Histogram, BUCKETS};
pub use kv::{KvLookup, KvOp};
pub use sched::SchedulingPolicy;
pub use timing::{Chunk, Timing};

/// Static engine parameters.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Most distinct LoRA adapters among running requests (vLLM's `--max-loras`).
    pub max_loras: usize,
    /// The waiting queue's order and whom KV pressure preempts (`--scheduling-policy`).
    pub policy: SchedulingPolicy,
    pub timing: Timing,
    /// Token ids the engine "generates" from (each decodes to a clean word).
    pub output_vocab: Arc<Vec<u32>>,
}

/// What a request's stream receives.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    /// One output token; the first one marks the end of prefill.
    Token { index: usize, id: u32 },
    /// Generation finished, for `finish`. `created_cache_tokens`: prompt tokens this request
    /// computed into cached blocks (vLLM's `created_cache_tokens`: the prompt's full blocks
    /// less the reused ones).
    Done {
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
        created_cache_tokens: usize,
        finish: Finish,
    },
    /// The request can never fit in the KV cache.
    Rejected { needed_blocks: usize },
}

/// Why a request's generation ended (vLLM's `finish_reason` and `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// `max_tokens` reached (`"length"`).
    Length,
    /// A stop condition (`"stop"`): the stop token id, the stop string, or `None` for EOS.
    Stop(Option<StopReason>),
}

/// What matched a stop condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Token(u32),
    Text(String),
}

/// Looks for a stop string in the output: given the generated token ids, the stop string that
/// the text of the last token completes, if any (vLLM checks stop strings on new text only).
pub type StopText = Arc<dyn Fn(&[u32]) -> Option<String> + Send + Sync>;

/// A request's stop conditions, checked after each sampled token as vLLM's scheduler and output
/// processor do: none before `min_tokens` tokens; then EOS (unless the request ignores it), a
/// token of `token_ids`, or a stop string ends the request with [`Finish::Stop`] even on its
/// last allowed token; otherwise `max_tokens` ends it with [`Finish::Length`]. The default has
/// none: every request runs to `max_tokens`.
#[derive(Clone, Default)]
pub struct StopRule {
    pub min_tokens: usize,
    /// The end-of-sequence token; `None` when the request sets `ignore_eos`.
    pub eos: Option<u32>,
    pub token_ids: Vec<u32>,
    pub text: Option<StopText>,
}

impl std::fmt::Debug for StopRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopRule")
            .field("min_tokens", &self.min_tokens)
            .field("eos", &self.eos)
            .field("token_ids", &self.token_ids)
            .field("text", &self.text.is_some())
            .finish()
    }
}

impl StopRule {
    /// The stop condition the last of `generated` meets, if any.
    pub fn check(&self, generated: &[u32]) -> Option<Finish> {
        let (&last, _) = generated.split_last()?;
        if generated.len() < self.min_tokens {
            return None;
        }
        if self.eos == Some(last) {
            return Some(Finish::Stop(None));
        }
        if self.token_ids.contains(&last) {
            return Some(Finish::Stop(Some(StopReason::Token(last))));
        }
        let text = self.text.as_ref().and_then(|f| f(generated))?;
        Some(Finish::Stop(Some(StopReason::Text(text))))
    }
}

/// A request handed to the engine.
pub struct Submit {
    pub tokens: Vec<u32>,
    pub salt: Option<String>,
    /// The LoRA adapter the request names, if any.
    pub lora: Option<String>,
    pub max_tokens: usize,
    /// The request's `priority` (lower first in priority mode; 0 by default).
    pub priority: i64,
    /// Seeds the generated token ids.
    pub seed: u64,
    /// When generation ends before `max_tokens`.
    pub stop: StopRule,
    pub events: mpsc::UnboundedSender<TokenEvent>,
}

/// Control messages for the engine loop.
pub enum Command {
    Submit(Submit),
    /// Pause the loop (no steps, no tokens) for this long.
    Stall(Duration),
    /// Run at this speedup from the next step on (`/admin/slow`: a slower GPU, a neighbour).
    SetSpeedup(f64),
    /// Evict this fraction (0..=1) of the free cached blocks; replies with how many.
    Evict {
        fraction: f64,
        reply: oneshot::Sender<usize>,
    },
    /// Reset the prefix cache; refused (false) while requests hold blocks, as in vLLM.
    Reset {
        reply: oneshot::Sender<bool>,
    },
    /// What TTFT would this request get if it arrived now? Answered from a copy of the engine's
    /// state; see [`WhatIf`].
    WhatIf(WhatIf),
    /// KV moved between workers: lookups for a pull and pulled blocks ([`KvOp`]).
    Kv(KvOp),
}

/// Most scheduler steps a what-if simulates before giving up.
pub const WHAT_IF_MAX_STEPS: usize = 1_000_000;

/// A what-if question: the request as the engine would receive it, and when it was asked.
///
/// The answer is a deterministic forward simulation on a copy of the engine's state (block
/// cache, running and waiting sequences, their streams detached so nothing reaches a client,
/// no KV events, no stats): the request joins the back of the waiting queue and the copy runs
/// the real scheduler step (the same `plan` and `apply` as the engine loop), adding up the
/// modelled step durations in engine time, without sleeping, until the request's first token.
/// No further arrivals are assumed.
///
/// **The step in progress.** The engine handles commands between steps, so a question that
/// arrives during a step is answered from the state that step leaves. The time from `asked` to
/// the start of the engine's next step (the rest of the step in progress, plus any commands
/// queued before the question) is measured and added, converted to engine time (times
/// `speedup`), so the answer counts from `asked`, exactly as a request submitted at that
/// instant would wait.
pub struct WhatIf {
    pub tokens: Vec<u32>,
    pub salt: Option<String>,
    pub lora: Option<String>,
    pub max_tokens: usize,
    /// Its `priority` (its place in a priority-ordered queue).
    pub priority: i64,
    /// When the question arrived (the origin of the answer's TTFT).
    pub asked: Instant,
    pub reply: oneshot::Sender<WhatIfAnswer>,
}

/// The answer to a [`WhatIf`].
#[derive(Debug, Clone, PartialEq)]
pub enum WhatIfAnswer {
    Ttft {
        /// Engine time from the question to the first token, ms (not divided by speedup).
        ttft_ms: f64,
        /// Prompt tokens reused at the request's (simulated) admission.
        cached_tokens: usize,
        prompt_tokens: usize,
        /// Running and waiting requests when the question was answered.
        running: usize,
        waiting: usize,
    },
    /// The engine would reject the request (it can never fit in the KV cache).
    Rejected { needed_blocks: usize },
    /// No first token within [`WHAT_IF_MAX_STEPS`] steps.
    TooLong,
}

/// Counters and gauges the HTTP side exposes on `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub cached_blocks: usize,
    pub prefix_queries_tokens: u64,
    pub prefix_hits_tokens: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub requests_finished: u64,
    pub preemptions_total: u64,
    pub ttft: Histogram,
    /// Actual minus intended start of each step.
    pub step_lag: Histogram,
    pub steps: u64,
}

/// Granularity of tokio's timer.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// Where a sequence's token events go.
#[derive(Debug, Clone)]
enum Sink {
    Client(mpsc::UnboundedSender<TokenEvent>),
    /// A what-if copy's stream: sends nothing; `closed` is the client's state when copied.
    Detached {
        closed: bool,
    },
}

impl Sink {
    fn send(&self, ev: TokenEvent) {
        if let Sink::Client(tx) = self {
            let _ = tx.send(ev);
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sink::Client(tx) => tx.is_closed(),
            Sink::Detached { closed } => *closed,
        }
    }
}

#[derive(Debug, Clone)]
struct Seq {
    prompt_len: usize,
    /// Prompt then generated token ids; every token's KV must be computed before the next
    /// token is sampled, so the work left is `tokens.len() - computed`.
    tokens: Vec<u32>,
    salt: Option<String>,
    lora: Option<String>,
    /// Hashes of the full blocks this request holds (prefix of its token blocks).
    hashes: Vec<EngineHash>,
    /// Blocks held: the full ones in `hashes` plus fresh ones still filling.
    allocated: usize,
    max_tokens: usize,
    computed: usize,
    /// Prompt tokens reused at first admission (what `usage` reports); `None` until then.
    cached_tokens: Option<usize>,
    generated: usize,
    preemptions: u32,
    seed: u64,
    stop: StopRule,
    /// Set when a stop condition is met.
    stopped: Option<Finish>,
    /// The request's `priority`, and its arrival number (ties of equal arrival instants).
    priority: i64,
    order: u64,
    arrived: Instant,
    events: Sink,
}

impl Seq {
    /// A copy for a what-if: the same state, a stream that sends nothing.
    fn detached(&self) -> Seq {
        Seq { events: Sink::Detached { closed: self.events.is_closed() }, ..self.clone() }
    }

    fn need(&self) -> usize {
        self.tokens.len() - self.computed
    }

    fn decoding(&self) -> bool {
        self.generated > 0 && self.need() == 1
    }

    /// Blocks needed to hold the KV of `computed + n` tokens.
    fn blocks_for(&self, n: usize, bs: usize) -> usize {
        (self.computed + n).div_ceil(bs)
    }
}

/// Handle to a running engine.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::UnboundedSender<Command>,
    pub stats: Arc<Mutex<EngineStats>>,
}

impl Engine {
    /// Starts the engine loop; KV events go to `events` when given.
    pub fn start(
        cfg: EngineConfig,
        events: Option<mpsc::UnboundedSender<(f64, Vec<KvEvent>)>>,
    ) -> (Engine, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let mut core = Core::new(cfg, Arc::clone(&stats), events);
        let handle = tokio::spawn(async move { core.run(rx).await });
        (Engine { tx, stats }, handle)
    }

    /// Queues a request; false if the engine has stopped.
    pub fn submit(&self, s: Submit) -> bool {
        self.tx.send(Command::Submit(s)).is_ok()
    }

    pub fn command(&self, c: Command) -> bool {
        self.tx.send(c).is_ok()
    }

    /// Asks the engine what TTFT this request would get if it arrived now (see [`WhatIf`]);
    /// `None` if the engine has stopped.
    pub async fn what_if(
        &self,
        tokens: Vec<u32>,
        salt: Option<String>,
        lora: Option<String>,
        max_tokens: usize,
        priority: i64,
    ) -> Option<WhatIfAnswer> {
        let (reply, rx) = oneshot::channel();
        let q = WhatIf { tokens, salt, lora, max_tokens, priority, asked: Instant::now(), reply };
        if !self.command(Command::WhatIf(q)) {
            return None;
        }
        rx.await.ok()
    }
}

struct Core {
    cfg: EngineConfig,
    cache: BlockCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    stats: Arc<Mutex<EngineStats>>,
    events: Option<mpsc::UnboundedSender<(f64, Vec<KvEvent>)>>,
    pending: Vec<KvEvent>,
    /// The intended start of the next step: the end of the last one. Steps follow each other
    /// on this model timeline (a wake-up a little early or late does not accumulate); a step
    /// after an idle spell or a late wake-up starts when it is scheduled.
    next_start: Instant,
    /// Commands that arrived during a step, other than a holder's read-only pull lookup
    /// (answered at once): handled, in order, once the step ends.
    deferred: VecDeque<Command>,
    /// Requests submitted so far (each one's arrival number).
    arrivals: u64,
}

/// One scheduler step as planned: each running sequence's chunk (tokens computed this step)
/// and the step's modelled duration in engine time.
struct Plan {
    chunks: Vec<usize>,
    ms: f64,
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Core {
    fn new(
        cfg: EngineConfig,
        stats: Arc<Mutex<EngineStats>>,
        events: Option<mpsc::UnboundedSender<(f64, Vec<KvEvent>)>>,
    ) -> Core {
        Core {
            cache: BlockCache::new(cfg.num_gpu_blocks),
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats,
            events,
            pending: Vec::new(),
            next_start: Instant::now(),
            deferred: VecDeque::new(),
            arrivals: 0,
        }
    }

    async fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            // Idle only with nothing deferred: a request submitted during the last step waits
            // in `deferred`, not in the channel.
            if self.running.is_empty() && self.waiting.is_empty() && self.deferred.is_empty() {
                match rx.recv().await {
                    Some(c) => self.handle(c).await,
                    None => return,
                }
            }
            while let Some(c) = self.deferred.pop_front() {
                self.handle(c).await;
            }
            while let Ok(c) = rx.try_recv() {
                self.handle(c).await;
            }
            if !self.running.is_empty() || !self.waiting.is_empty() {
                self.step(&mut rx).await;
            }
            self.flush_events();
        }
    }

    async fn handle(&mut self, c: Command) {
        match c {
            Command::Submit(s) => {
                let seq = self.new_seq(s);
                sched::enqueue(self.cfg.policy, &mut self.waiting, seq);
            }
            Command::Stall(d) => tokio::time::sleep(d).await,
            Command::SetSpeedup(s) if s.is_finite() && s > 0.0 => self.cfg.timing.speedup = s,
            Command::SetSpeedup(_) => {}
            Command::Evict { fraction, reply } => {
                let n = (self.cache.free_cached_len() as f64 * fraction.clamp(0.0, 1.0)).ceil();
                let evicted = self.cache.evict_free(n as usize);
                let count = evicted.len();
                if count > 0 {
                    self.pending
                        .push(KvEvent::BlockRemoved { block_hashes: evicted, medium: "GPU" });
                }
                self.flush_events();
                let _ = reply.send(count);
            }
            Command::Reset { reply } => {
                let ok = self.cache.used() == 0;
                if ok {
                    self.cache.evict_free(usize::MAX);
                    self.pending.push(KvEvent::AllBlocksCleared);
                    self.flush_events();
                }
                let _ = reply.send(ok);
            }
            Command::Kv(op) => self.kv(op),
            Command::WhatIf(q) => {
                let now = Instant::now();
                let waited = self.next_start.max(now).saturating_duration_since(q.asked);
                let offset_ms = waited.as_secs_f64() * 1000.0 * self.cfg.timing.speedup;
                let copy = self.detached_copy();
                // The simulation runs off the engine task, so the engine keeps stepping.
                tokio::task::spawn_blocking(move || {
                    let (reply, answer) = copy.what_if(q, offset_ms);
                    let _ = reply.send(answer);
                });
            }
        }
    }

    /// A copy of the scheduling state for a what-if: streams detached, no KV events, stats of
    /// its own.
    fn detached_copy(&self) -> Core {
        Core {
            cfg: self.cfg.clone(),
            cache: self.cache.clone(),
            waiting: self.waiting.iter().map(Seq::detached).collect(),
            running: self.running.iter().map(Seq::detached).collect(),
            stats: Arc::new(Mutex::new(EngineStats::default())),
            events: None,
            pending: Vec::new(),
            next_start: self.next_start,
            deferred: VecDeque::new(),
            arrivals: self.arrivals,
        }
    }

    /// Runs the forward simulation of [`WhatIf`] on this copy; `offset_ms` is the engine time
    /// from the question to the copy's first step.
    fn what_if(
        mut self,
        q: WhatIf,
        offset_ms: f64,
    ) -> (oneshot::Sender<WhatIfAnswer>, WhatIfAnswer) {
        let (running, waiting) = (self.running.len(), self.waiting.len());
        let prompt_tokens = q.tokens.len();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let probe = tx.clone();
        let seq = self.new_seq(Submit {
            tokens: q.tokens,
            salt: q.salt,
            lora: q.lora,
            max_tokens: q.max_tokens,
            priority: q.priority,
            seed: 0,
            stop: StopRule::default(),
            events: tx,
        });
        sched::enqueue(self.cfg.policy, &mut self.waiting, seq);
        let mut total = offset_ms;
        let at = self.next_start;
        for _ in 0..WHAT_IF_MAX_STEPS {
            if self.running.is_empty() && self.waiting.is_empty() {
                break;
            }
            let plan = self.plan();
            total += plan.ms;
            self.apply(&plan.chunks, at);
            let mut first = false;
            let mut cached = None;
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    TokenEvent::Token { index: 0, .. } => first = true,
                    TokenEvent::Token { .. } => {}
                    TokenEvent::Done { cached_tokens, .. } => cached = Some(cached_tokens),
                    TokenEvent::Rejected { needed_blocks } => {
                        return (q.reply, WhatIfAnswer::Rejected { needed_blocks });
                    }
                }
            }
            if first {
                let cached_tokens = cached
                    .or_else(|| {
                        self.running
                            .iter()
                            .find(
                                |s| matches!(&s.events, Sink::Client(c) if c.same_channel(&probe)),
                            )
                            .and_then(|s| s.cached_tokens)
                    })
                    .unwrap_or(0);
                let answer = WhatIfAnswer::Ttft {
                    ttft_ms: total,
                    cached_tokens,
                    prompt_tokens,
                    running,
                    waiting,
                };
                return (q.reply, answer);
            }
        }
        (q.reply, WhatIfAnswer::TooLong)
    }

    fn new_seq(&mut self, s: Submit) -> Seq {
        self.arrivals += 1;
        Seq {
            prompt_len: s.tokens.len(),
            tokens: s.tokens,
            salt: s.salt,
            lora: s.lora,
            hashes: Vec::new(),
            allocated: 0,
            max_tokens: s.max_tokens.max(1),
            computed: 0,
            cached_tokens: None,
            generated: 0,
            preemptions: 0,
            seed: s.seed,
            stop: s.stop,
            stopped: None,
            priority: s.priority,
            order: self.arrivals,
            arrived: Instant::now(),
            events: Sink::Client(s.events),
        }
    }

    fn flush_events(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        if let Some(tx) = &self.events {
            let _ = tx.send((unix_now(), batch));
        }
    }

    /// Gives `running[i]` blocks for `n` more tokens, preempting the policy's victims
    /// ([`sched::victim`]; recomputed later) when the cache is full. False if `i` itself had
    /// to go.
    fn reserve(&mut self, i: usize, n: usize, preempted: &mut [bool]) -> bool {
        let bs = self.cfg.block_size;
        loop {
            let s = &self.running[i];
            let more = s.blocks_for(n, bs).saturating_sub(s.allocated);
            if more == 0 {
                return true;
            }
            if let Ok(evicted) = self.cache.acquire(&[], more) {
                if !evicted.is_empty() {
                    self.pending
                        .push(KvEvent::BlockRemoved { block_hashes: evicted, medium: "GPU" });
                }
                self.running[i].allocated += more;
                return true;
            }
            let victim = sched::victim(self.cfg.policy, &self.running, preempted, i);
            preempted[victim] = true;
            let mut seq = std::mem::replace(&mut self.running[victim], placeholder());
            release(&mut self.cache, &mut seq);
            seq.computed = 0;
            seq.preemptions += 1;
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).preemptions_total += 1;
            self.running[victim] = seq;
            if victim == i {
                return false;
            }
        }
    }

    /// One real step: plans it, sleeps for its modelled duration, applies it. While it runs,
    /// a peer's pull lookup ([`KvOp::Held`]) is answered at once: serving a pull reads the
    /// holder's cache and never waits for its GPU (as with LMCache's peer-to-peer sharing); any
    /// other command waits for the step's end.
    async fn step(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) {
        let plan = self.plan();
        let start = self.next_start.max(Instant::now());
        let deadline = start + self.cfg.timing.wall(plan.ms);
        // Tokio's timer wakes on the millisecond tick after a deadline; aiming one tick early
        // centres the wake-up on the intended time instead of always running late.
        let wake = tokio::time::sleep_until(deadline.checked_sub(TIMER_TICK).unwrap_or(deadline));
        tokio::pin!(wake);
        let mut open = true;
        loop {
            tokio::select! {
                () = &mut wake => break,
                c = rx.recv(), if open => match c {
                    Some(Command::Kv(KvOp::Held { hashes, reply })) => {
                        let _ = reply.send(self.cache.longest_prefix(&hashes));
                    }
                    Some(other) => self.deferred.push_back(other),
                    None => open = false,
                },
            }
        }
        let now = Instant::now();
        {
            let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            st.step_lag.observe(now.saturating_duration_since(deadline).as_secs_f64());
            st.steps += 1;
        }
        self.next_start = deadline;
        self.apply(&plan.chunks, now);
        self.publish_stats();
    }

    /// Schedules one step, shared by the engine loop and the what-if: gives each decoding
    /// sequence one token and the rest of the token budget to prefill chunks (preempting the
    /// most recently admitted sequences when the cache is full), then admits waiting requests.
    /// Allocates the step's blocks; returns the chunks and the step's modelled duration.
    fn plan(&mut self) -> Plan {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = vec![false; self.running.len()];
        let mut chunks = vec![0usize; self.running.len()];
        // Running sequences: decodes first, then prefill chunks, each given its blocks.
        let order: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].decoding())
            .chain((0..self.running.len()).filter(|&i| !self.running[i].decoding()))
            .collect();
        for i in order {
            if preempted[i] || budget == 0 {
                continue;
            }
            let n = self.running[i].need().min(budget);
            let fits = self.reserve(i, n, &mut preempted);
            if fits {
                chunks[i] = n;
                budget -= n;
            }
            if self.cfg.policy == SchedulingPolicy::Priority {
                // A victim already given tokens this step gives them back; a request that had
                // to go itself ends the step's running pass (vLLM).
                for (c, _) in chunks.iter_mut().zip(&preempted).filter(|(c, p)| **p && **c > 0) {
                    budget += *c;
                    *c = 0;
                }
                if !fits {
                    break;
                }
            }
        }
        // Preempted sequences go back to the queue: FCFS at its front in their original order,
        // by priority at their place.
        let mut kept = Vec::new();
        let mut kept_chunks = Vec::new();
        let mut back = Vec::new();
        for (seq, (p, c)) in
            std::mem::take(&mut self.running).into_iter().zip(preempted.iter().zip(&chunks))
        {
            if *p {
                back.push(seq);
            } else {
                kept.push(seq);
                kept_chunks.push(*c);
            }
        }
        let had_preemption = !back.is_empty();
        sched::requeue(self.cfg.policy, &mut self.waiting, back);
        self.running = kept;
        chunks = kept_chunks;
        let bs = self.cfg.block_size;
        for (seq, &n) in self.running.iter_mut().zip(&chunks) {
            let upto = seq.computed + n;
            cache_full_blocks(seq, upto, &mut self.cache, &mut self.pending, bs);
        }
        // New admissions, FCFS, only when nobody was preempted this step.
        if !had_preemption {
            self.admit(&mut budget, &mut chunks);
        }
        let mut prefill = Vec::new();
        let mut decoding = 0;
        let mut context = 0;
        for (s, &n) in self.running.iter().zip(&chunks) {
            if n == 0 {
                continue;
            }
            if s.decoding() {
                decoding += 1;
                context += s.tokens.len();
            } else {
                prefill.push(Chunk { cached: s.computed, new: n });
            }
        }
        let ms = self.cfg.timing.step_ms(&prefill, decoding, context);
        Plan { chunks, ms }
    }

    /// Applies a planned step's effects at `now` (shared by the engine loop and the what-if):
    /// computes the chunks, caches every block that became full, emits a token from each
    /// sequence whose work is done, and finishes sequences at `max_tokens`, on a stop condition
    /// ([`StopRule`]) or when the client is gone, releasing their blocks.
    fn apply(&mut self, chunks: &[usize], now: Instant) {
        let bs = self.cfg.block_size;
        let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let vocab = Arc::clone(&self.cfg.output_vocab);
        for (s, chunk) in self.running.iter_mut().zip(chunks) {
            if *chunk == 0 {
                continue;
            }
            s.computed += chunk;
            // Normally a no-op: the step's full blocks were cached when it was planned.
            cache_full_blocks(s, s.computed, &mut self.cache, &mut self.pending, bs);
            if s.computed == s.tokens.len() {
                if s.generated == 0 {
                    st.ttft.observe(now.duration_since(s.arrived).as_secs_f64());
                }
                let pick = kvroute_testkit::textgen::draw(s.seed, s.generated as u64);
                let id = vocab.get(pick as usize % vocab.len().max(1)).copied().unwrap_or(0);
                s.tokens.push(id);
                s.events.send(TokenEvent::Token { index: s.generated, id });
                s.generated += 1;
                st.generation_tokens_total += 1;
                s.stopped = s.stop.check(&s.tokens[s.prompt_len..]);
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            let closed = self.running[i].events.is_closed();
            let r = &self.running[i];
            if r.generated >= r.max_tokens || r.stopped.is_some() || closed {
                let mut s = self.running.remove(i);
                release(&mut self.cache, &mut s);
                if !closed {
                    let cached = s.cached_tokens.unwrap_or(0);
                    s.events.send(TokenEvent::Done {
                        prompt_tokens: s.prompt_len,
                        completion_tokens: s.generated,
                        cached_tokens: cached,
                        created_cache_tokens: (s.prompt_len / bs * bs).saturating_sub(cached),
                        finish: s.stopped.take().unwrap_or(Finish::Length),
                    });
                }
                st.requests_finished += 1;
            } else {
                i += 1;
            }
        }
    }

    /// Publishes the gauges `/metrics` shows.
    fn publish_stats(&self) {
        let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        st.running = self.running.len();
        st.waiting = self.waiting.len();
        st.kv_usage = self.cache.used() as f64 / self.cache.capacity().max(1) as f64;
        st.cached_blocks = self.cache.cached_blocks();
        st.prefix_queries_tokens = self.cache.queries_tokens;
        st.prefix_hits_tokens = self.cache.hits_tokens;
    }

    /// Admits waiting sequences FCFS while the batch, the token budget and the cache allow;
    /// one for an adapter past `max_loras` running adapters is skipped, keeping its place.
    fn admit(&mut self, budget: &mut usize, chunks: &mut Vec<usize>) {
        let bs = self.cfg.block_size;
        let mut loras: std::collections::BTreeSet<String> =
            self.running.iter().filter_map(|s| s.lora.clone()).collect();
        let mut i = 0;
        while self.running.len() < self.cfg.max_num_seqs && *budget > 0 {
            let Some(s) = self.waiting.get_mut(i) else {
                break;
            };
            if s.events.is_closed() {
                self.waiting.remove(i);
                continue;
            }
            if let Some(l) = &s.lora {
                if !loras.contains(l) && loras.len() >= self.cfg.max_loras {
                    i += 1;
                    continue;
                }
            }
            let total_blocks = s.prompt_len.saturating_add(s.max_tokens).div_ceil(bs);
            if total_blocks > self.cache.capacity() {
                if let Some(s) = self.waiting.remove(i) {
                    s.events.send(TokenEvent::Rejected { needed_blocks: total_blocks });
                }
                continue;
            }
            let len = s.tokens.len();
            let hashes = engine_hashes(&s.tokens, bs, s.salt.as_deref(), s.lora.as_deref());
            // vLLM recomputes at least the last token, so a fully cached prefix reuses one
            // block less.
            let hit = self.cache.longest_prefix(&hashes).min(len.saturating_sub(1) / bs);
            let n = (len - hit * bs).min(*budget);
            let fresh = (hit * bs + n).div_ceil(bs) - hit;
            let Ok(evicted) = self.cache.acquire(&hashes[..hit], fresh) else {
                break;
            };
            if !evicted.is_empty() {
                self.pending.push(KvEvent::BlockRemoved { block_hashes: evicted, medium: "GPU" });
            }
            if s.cached_tokens.is_none() {
                self.cache.queries_tokens += len as u64;
                self.cache.hits_tokens += (hit * bs) as u64;
                s.cached_tokens = Some(hit * bs);
            }
            s.computed = hit * bs;
            s.hashes = hashes[..hit].to_vec();
            s.allocated = hit + fresh;
            if let Some(l) = &s.lora {
                loras.insert(l.clone());
            }
            if let Some(s) = self.waiting.remove(i) {
                if s.preemptions == 0 {
                    let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                    st.prompt_tokens_total += s.prompt_len as u64;
                }
                let mut s = s;
                let upto = s.computed + n;
                cache_full_blocks(&mut s, upto, &mut self.cache, &mut self.pending, bs);
                self.running.push(s);
                chunks.push(n);
                *budget -= n;
            }
        }
    }
}

/// Caches every block of `s` that is full once its first `upto` tokens are computed, with
/// their `BlockStored` event. Called when a step is planned, as vLLM caches a scheduled
/// chunk's full blocks when it allocates them (before the forward pass): a request scheduled
/// later, even in the same step, reuses blocks whose prefill is still in flight.
fn cache_full_blocks(
    s: &mut Seq,
    upto: usize,
    cache: &mut BlockCache,
    pending: &mut Vec<KvEvent>,
    bs: usize,
) {
    let mut stored = Vec::new();
    for b in s.hashes.len()..upto / bs {
        let parent = s.hashes.last().copied();
        let h = engine_block_hash(
            parent,
            &s.tokens[b * bs..(b + 1) * bs],
            s.salt.as_deref(),
            s.lora.as_deref(),
        );
        s.hashes.push(h);
        if cache.fill(h) {
            stored.push(b);
        }
    }
    if let (Some(&b0), Some(&b1)) = (stored.first(), stored.last()) {
        pending.push(KvEvent::BlockStored {
            block_hashes: stored.iter().map(|&b| s.hashes[b]).collect(),
            parent_block_hash: b0.checked_sub(1).map(|p| s.hashes[p]),
            token_ids: s.tokens[b0 * bs..(b1 + 1) * bs].to_vec(),
            block_size: bs,
            medium: "GPU",
            lora_name: s.lora.clone(),
            salt: s.salt.clone().filter(|_| b0 == 0),
        });
    }
}

/// Releases a sequence's blocks (full ones stay cached as free blocks).
fn release(cache: &mut BlockCache, s: &mut Seq) {
    let anon = s.allocated - s.hashes.len();
    cache.release(&s.hashes, anon);
    s.hashes.clear();
    s.allocated = 0;
}

/// A stand-in while a sequence is moved out of the running list.
fn placeholder() -> Seq {
    Seq {
        prompt_len: 0,
        tokens: Vec::new(),
        salt: None,
        lora: None,
        hashes: Vec::new(),
        allocated: 0,
        max_tokens: 0,
        computed: 0,
        cached_tokens: None,
        generated: 0,
        preemptions: 0,
        seed: 0,
        stop: StopRule::default(),
        stopped: None,
        priority: 0,
        order: 0,
        arrived: Instant::now(),
        events: Sink::Detached { closed: true },
    }
}

#[cfg(test)]
mod tests;
