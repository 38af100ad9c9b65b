//! The engine loop of one simulated worker: vLLM-style continuous batching with chunked
//! prefill. Every step admits waiting requests FCFS (while `max_num_seqs` and KV blocks allow),
//! gives each decoding sequence one token, spends the rest of `max_num_batched_tokens` on
//! prefill chunks, sleeps for the step's modelled duration, then caches every block that became
//! full (prompt or generated tokens) and publishes the matching KV events.
//!
//! Blocks for a request's whole length (prompt + `max_tokens`) are reserved at admission, so a
//! running request never runs out of blocks (vLLM allocates lazily and preempts instead).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cache::{engine_block_hash, engine_hashes, BlockCache, EngineHash};
use crate::events::KvEvent;
use crate::profile::Profile;

/// How long a scheduler step takes, from the profile, divided by `speedup`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub step_floor_ms: f64,
    pub prefill_ms_per_token: f64,
    pub prefill_ms_per_token_sq: f64,
    pub decode_ms_per_seq: f64,
    pub kv_ms_per_1k_tokens: f64,
    pub speedup: f64,
}

impl Timing {
    pub fn from_profile(p: &Profile, speedup: f64) -> Timing {
        Timing {
            step_floor_ms: p.step_floor_ms,
            prefill_ms_per_token: p.prefill_ms_per_token,
            prefill_ms_per_token_sq: p.prefill_ms_per_token_sq,
            decode_ms_per_seq: p.decode_ms_per_seq,
            kv_ms_per_1k_tokens: p.kv_ms_per_1k_tokens,
            speedup,
        }
    }

    /// Duration of a step with `prefill` new tokens, `decoding` sequences and `context` tokens
    /// of KV cache read by the decoding sequences.
    pub fn step(&self, prefill: usize, decoding: usize, context: usize) -> Duration {
        let p = prefill as f64;
        let ms = self.step_floor_ms
            + self.prefill_ms_per_token * p
            + self.prefill_ms_per_token_sq * p * p
            + self.decode_ms_per_seq * decoding as f64
            + self.kv_ms_per_1k_tokens * context as f64 / 1000.0;
        Duration::from_secs_f64((ms / self.speedup.max(1e-9)).max(0.0) / 1000.0)
    }
}

/// Static engine parameters.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub timing: Timing,
    /// Token ids the engine "generates" from (each decodes to a clean word).
    pub output_vocab: Arc<Vec<u32>>,
}

/// What a request's stream receives.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    /// One output token; the first one marks the end of prefill.
    Token { index: usize, id: u32 },
    /// Generation finished.
    Done {
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    /// The request can never fit in the KV cache.
    Rejected { needed_blocks: usize },
}

/// A request handed to the engine.
pub struct Submit {
    pub tokens: Vec<u32>,
    pub salt: Option<String>,
    pub max_tokens: usize,
    /// Seeds the generated token ids.
    pub seed: u64,
    pub events: mpsc::UnboundedSender<TokenEvent>,
}

/// Control messages for the engine loop.
pub enum Command {
    Submit(Submit),
    /// Pause the loop (no steps, no tokens) for this long.
    Stall(Duration),
    /// Evict this fraction (0..=1) of the free cached blocks; replies with how many.
    Evict {
        fraction: f64,
        reply: oneshot::Sender<usize>,
    },
    /// Reset the prefix cache; refused (false) while requests hold blocks, as in vLLM.
    Reset {
        reply: oneshot::Sender<bool>,
    },
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
    pub ttft: Histogram,
    /// Actual minus intended start of each step.
    pub step_lag: Histogram,
    pub steps: u64,
}

/// Buckets in seconds, shared by the TTFT and step-lag histograms.
pub const BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A fixed-bucket histogram (Prometheus style).
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    pub counts: [u64; BUCKETS.len()],
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn observe(&mut self, secs: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.counts[i] += 1;
        }
        self.sum += secs;
        self.count += 1;
    }

    /// Upper bound of the bucket holding quantile `q`.
    pub fn quantile(&self, q: f64) -> f64 {
        let target = (q * self.count as f64).ceil() as u64;
        let mut cum = 0;
        for (b, n) in BUCKETS.iter().zip(&self.counts) {
            cum += n;
            if cum >= target {
                return *b;
            }
        }
        f64::INFINITY
    }
}

struct Seq {
    prompt_len: usize,
    /// Prompt then generated token ids.
    tokens: Vec<u32>,
    salt: Option<String>,
    /// Hashes of the full blocks this request holds (prefix of its token blocks).
    hashes: Vec<EngineHash>,
    max_tokens: usize,
    computed: usize,
    cached_tokens: usize,
    fresh_blocks: usize,
    hit_blocks: usize,
    generated: usize,
    seed: u64,
    arrived: Instant,
    events: mpsc::UnboundedSender<TokenEvent>,
}

impl Seq {
    /// Tokens whose KV is computed (the newest sampled token is not yet).
    fn kv_tokens(&self) -> usize {
        if self.computed < self.prompt_len {
            self.computed
        } else {
            self.prompt_len + self.generated.saturating_sub(1)
        }
    }

    fn filled(&self) -> usize {
        self.hashes.len()
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
        let mut core = Core {
            cache: BlockCache::new(cfg.num_gpu_blocks),
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: Arc::clone(&stats),
            events,
            pending: Vec::new(),
        };
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
}

struct Core {
    cfg: EngineConfig,
    cache: BlockCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    stats: Arc<Mutex<EngineStats>>,
    events: Option<mpsc::UnboundedSender<(f64, Vec<KvEvent>)>>,
    pending: Vec<KvEvent>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Core {
    async fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match rx.recv().await {
                    Some(c) => self.handle(c).await,
                    None => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.handle(c).await;
            }
            if !self.running.is_empty() || !self.waiting.is_empty() {
                self.step().await;
            }
            self.flush_events();
        }
    }

    async fn handle(&mut self, c: Command) {
        match c {
            Command::Submit(s) => self.waiting.push_back(self.new_seq(s)),
            Command::Stall(d) => tokio::time::sleep(d).await,
            Command::Evict { fraction, reply } => {
                let n = (self.cache.free_cached_len() as f64 * fraction.clamp(0.0, 1.0)).ceil();
                let evicted = self.cache.evict_free(n as usize);
                let count = evicted.len();
                if count > 0 {
                    self.pending.push(KvEvent::BlockRemoved {
                        block_hashes: evicted,
                        medium: "GPU",
                    });
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
        }
    }

    fn new_seq(&self, s: Submit) -> Seq {
        Seq {
            prompt_len: s.tokens.len(),
            tokens: s.tokens,
            salt: s.salt,
            hashes: Vec::new(),
            max_tokens: s.max_tokens.max(1),
            computed: 0,
            cached_tokens: 0,
            fresh_blocks: 0,
            hit_blocks: 0,
            generated: 0,
            seed: s.seed,
            arrived: Instant::now(),
            events: s.events,
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

    async fn step(&mut self) {
        self.admit();
        let bs = self.cfg.block_size;
        let decoding = self
            .running
            .iter()
            .filter(|s| s.computed >= s.prompt_len)
            .count();
        let context: usize = self
            .running
            .iter()
            .filter(|s| s.computed >= s.prompt_len)
            .map(|s| s.prompt_len + s.generated)
            .sum();
        let mut budget = self.cfg.max_num_batched_tokens.saturating_sub(decoding);
        let mut chunks = vec![0usize; self.running.len()];
        let mut prefill = 0;
        for (i, s) in self.running.iter().enumerate() {
            if s.computed < s.prompt_len && budget > 0 {
                let c = (s.prompt_len - s.computed).min(budget);
                chunks[i] = c;
                budget -= c;
                prefill += c;
            }
        }
        let start = Instant::now();
        let deadline = start + self.cfg.timing.step(prefill, decoding, context);
        tokio::time::sleep_until(deadline).await;
        let now = Instant::now();
        let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        st.step_lag
            .observe(now.saturating_duration_since(deadline).as_secs_f64());
        st.steps += 1;
        let vocab = Arc::clone(&self.cfg.output_vocab);
        for (s, chunk) in self.running.iter_mut().zip(&chunks) {
            let was_decoding = s.computed >= s.prompt_len;
            if !was_decoding && *chunk == 0 {
                continue;
            }
            s.computed += chunk;
            if s.computed >= s.prompt_len {
                if !was_decoding {
                    st.ttft.observe(now.duration_since(s.arrived).as_secs_f64());
                }
                let pick = kvroute_core::textgen::draw(s.seed, s.generated as u64);
                let id = vocab
                    .get(pick as usize % vocab.len().max(1))
                    .copied()
                    .unwrap_or(0);
                s.tokens.push(id);
                let _ = s.events.send(TokenEvent::Token {
                    index: s.generated,
                    id,
                });
                s.generated += 1;
                st.generation_tokens_total += 1;
            }
            // Cache every block that is now full.
            let full = s.kv_tokens() / bs;
            let first_new = s.filled();
            let mut stored = Vec::new();
            for b in first_new..full {
                let parent = s.hashes.last().copied();
                let h =
                    engine_block_hash(parent, &s.tokens[b * bs..(b + 1) * bs], s.salt.as_deref());
                s.hashes.push(h);
                if self.cache.fill(h) {
                    stored.push(b);
                }
            }
            if let (Some(&b0), Some(&b1)) = (stored.first(), stored.last()) {
                self.pending.push(KvEvent::BlockStored {
                    block_hashes: stored.iter().map(|&b| s.hashes[b]).collect(),
                    parent_block_hash: b0.checked_sub(1).map(|p| s.hashes[p]),
                    token_ids: s.tokens[b0 * bs..(b1 + 1) * bs].to_vec(),
                    block_size: bs,
                    medium: "GPU",
                    lora_name: None,
                });
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            let closed = self.running[i].events.is_closed();
            if self.running[i].generated >= self.running[i].max_tokens || closed {
                let s = self.running.remove(i);
                let anon = s.fresh_blocks.saturating_sub(s.filled() - s.hit_blocks);
                self.cache.release(&s.hashes, anon);
                if !closed {
                    let _ = s.events.send(TokenEvent::Done {
                        prompt_tokens: s.prompt_len,
                        completion_tokens: s.generated,
                        cached_tokens: s.cached_tokens,
                    });
                }
                st.requests_finished += 1;
            } else {
                i += 1;
            }
        }
        st.running = self.running.len();
        st.waiting = self.waiting.len();
        st.kv_usage = self.cache.used() as f64 / self.cache.capacity().max(1) as f64;
        st.cached_blocks = self.cache.cached_set().len();
        st.prefix_queries_tokens = self.cache.queries_tokens;
        st.prefix_hits_tokens = self.cache.hits_tokens;
    }

    fn admit(&mut self) {
        let bs = self.cfg.block_size;
        while self.running.len() < self.cfg.max_num_seqs {
            let Some(s) = self.waiting.front_mut() else {
                break;
            };
            if s.events.is_closed() {
                self.waiting.pop_front();
                continue;
            }
            let len = s.prompt_len;
            let prompt_hashes = engine_hashes(&s.tokens, bs, s.salt.as_deref());
            // vLLM recomputes at least the last prompt token, so a fully cached prompt reuses
            // one block less.
            let hit = self
                .cache
                .longest_prefix(&prompt_hashes)
                .min(len.saturating_sub(1) / bs);
            let total_blocks = (len + s.max_tokens).div_ceil(bs);
            if total_blocks > self.cache.capacity() {
                if let Some(s) = self.waiting.pop_front() {
                    let _ = s.events.send(TokenEvent::Rejected {
                        needed_blocks: total_blocks,
                    });
                }
                continue;
            }
            let fresh = total_blocks - hit;
            let Ok(evicted) = self.cache.acquire(&prompt_hashes[..hit], fresh) else {
                break;
            };
            if !evicted.is_empty() {
                self.pending.push(KvEvent::BlockRemoved {
                    block_hashes: evicted,
                    medium: "GPU",
                });
            }
            self.cache.queries_tokens += len as u64;
            self.cache.hits_tokens += (hit * bs) as u64;
            s.cached_tokens = hit * bs;
            s.computed = hit * bs;
            s.hashes = prompt_hashes[..hit].to_vec();
            s.fresh_blocks = fresh;
            s.hit_blocks = hit;
            if let Some(s) = self.waiting.pop_front() {
                let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                st.prompt_tokens_total += len as u64;
                self.running.push(s);
            }
        }
    }
}

#[cfg(test)]
mod tests;
