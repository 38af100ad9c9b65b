//! The engine loop of one simulated worker: vLLM-style continuous batching with chunked
//! prefill. Every step admits waiting requests FCFS (while `max_num_seqs` and KV blocks allow),
//! gives each decoding sequence one token and spends the rest of `max_num_batched_tokens` on
//! prefill chunks, then sleeps for the step's modelled duration.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cache::{engine_hashes, BlockCache, EngineHash};

/// How long a scheduler step takes (milliseconds), before `speedup`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
pub struct Timing {
    /// Fixed cost of any step (weight reads, launch overhead): the decode step floor.
    pub step_floor_ms: f64,
    /// Cost per prefill token in the step.
    pub prefill_ms_per_token: f64,
    /// Cost per decoding sequence in the step (KV reads).
    pub decode_ms_per_seq: f64,
    /// Every duration is divided by this (for fast replays).
    pub speedup: f64,
}

impl Timing {
    pub fn step(&self, prefill_tokens: usize, decoding: usize) -> Duration {
        let ms = self.step_floor_ms
            + self.prefill_ms_per_token * prefill_tokens as f64
            + self.decode_ms_per_seq * decoding as f64;
        Duration::from_secs_f64((ms / self.speedup.max(1e-9)).max(0.0) / 1000.0)
    }
}

/// Static engine parameters.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub timing: Timing,
}

/// What a request's stream receives.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    /// One output token (index from 0); the first one marks the end of prefill.
    Token { index: usize, cached_tokens: usize },
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
    pub events: mpsc::UnboundedSender<TokenEvent>,
}

/// Counters and gauges the HTTP side exposes on `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub prefix_queries_tokens: u64,
    pub prefix_hits_tokens: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub requests_finished: u64,
    /// TTFT observations (seconds) bucketed at [`TTFT_BUCKETS`], plus sum and count.
    pub ttft_buckets: Vec<u64>,
    pub ttft_sum: f64,
    pub ttft_count: u64,
    pub steps: u64,
}

pub const TTFT_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

struct Seq {
    tokens: Vec<u32>,
    hashes: Vec<EngineHash>,
    max_tokens: usize,
    computed: usize,
    cached_tokens: usize,
    filled: usize,
    fresh_blocks: usize,
    hit_blocks: usize,
    generated: usize,
    arrived: Instant,
    events: mpsc::UnboundedSender<TokenEvent>,
}

/// Handle to a running engine.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::UnboundedSender<Submit>,
    pub stats: Arc<Mutex<EngineStats>>,
}

impl Engine {
    /// Starts the engine loop on the current tokio runtime.
    pub fn start(cfg: EngineConfig) -> Engine {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Mutex::new(EngineStats {
            ttft_buckets: vec![0; TTFT_BUCKETS.len()],
            ..Default::default()
        }));
        tokio::spawn(run(cfg, rx, Arc::clone(&stats)));
        Engine { tx, stats }
    }

    /// Queues a request; false if the engine has stopped.
    pub fn submit(&self, s: Submit) -> bool {
        self.tx.send(s).is_ok()
    }
}

async fn run(
    cfg: EngineConfig,
    mut rx: mpsc::UnboundedReceiver<Submit>,
    stats: Arc<Mutex<EngineStats>>,
) {
    let bs = cfg.block_size.max(1);
    let mut cache = BlockCache::new(cfg.num_gpu_blocks);
    let mut waiting: VecDeque<Seq> = VecDeque::new();
    let mut running: Vec<Seq> = Vec::new();
    loop {
        if running.is_empty() && waiting.is_empty() {
            match rx.recv().await {
                Some(s) => waiting.push_back(new_seq(s, bs)),
                None => return,
            }
        }
        while let Ok(s) = rx.try_recv() {
            waiting.push_back(new_seq(s, bs));
        }
        let step_start = Instant::now();
        admit(&cfg, &mut cache, &mut waiting, &mut running, &stats);
        // Plan: decodes first (one token each), prefill chunks with the remaining budget.
        let decoding = running
            .iter()
            .filter(|s| s.computed >= s.tokens.len())
            .count();
        let mut budget = cfg.max_num_batched_tokens.saturating_sub(decoding);
        let mut prefill_tokens = 0;
        let mut chunks = vec![0usize; running.len()];
        for (i, s) in running.iter().enumerate() {
            if s.computed < s.tokens.len() && budget > 0 {
                let c = (s.tokens.len() - s.computed).min(budget);
                chunks[i] = c;
                budget -= c;
                prefill_tokens += c;
            }
        }
        tokio::time::sleep_until(step_start + cfg.timing.step(prefill_tokens, decoding)).await;
        // Apply the step's results.
        let now = Instant::now();
        let mut st = stats.lock().unwrap_or_else(|e| e.into_inner());
        st.steps += 1;
        for (s, chunk) in running.iter_mut().zip(&chunks) {
            let was_decoding = s.computed >= s.tokens.len();
            if !was_decoding && *chunk == 0 {
                continue;
            }
            s.computed += chunk;
            if s.computed < s.tokens.len() {
                continue;
            }
            if !was_decoding {
                // Prefill done: its full prompt blocks become cached.
                let full = s.tokens.len() / bs;
                for h in &s.hashes[s.filled..full] {
                    cache.fill(*h);
                }
                s.filled = full;
                let ttft = now.duration_since(s.arrived).as_secs_f64();
                observe_ttft(&mut st, ttft);
            }
            let _ = s.events.send(TokenEvent::Token {
                index: s.generated,
                cached_tokens: s.cached_tokens,
            });
            s.generated += 1;
            st.generation_tokens_total += 1;
        }
        let mut i = 0;
        while i < running.len() {
            let s = &running[i];
            let closed = s.events.is_closed();
            if s.generated >= s.max_tokens || closed {
                let s = running.remove(i);
                let anon = s.fresh_blocks.saturating_sub(s.filled - s.hit_blocks);
                cache.release(&s.hashes[..s.filled], anon);
                if !closed {
                    let _ = s.events.send(TokenEvent::Done {
                        prompt_tokens: s.tokens.len(),
                        completion_tokens: s.generated,
                        cached_tokens: s.cached_tokens,
                    });
                }
                st.requests_finished += 1;
            } else {
                i += 1;
            }
        }
        st.running = running.len();
        st.waiting = waiting.len();
        st.kv_usage = cache.used() as f64 / cache.capacity().max(1) as f64;
        st.prefix_queries_tokens = cache.queries_tokens;
        st.prefix_hits_tokens = cache.hits_tokens;
    }
}

fn new_seq(s: Submit, bs: usize) -> Seq {
    let hashes = engine_hashes(&s.tokens, bs, s.salt.as_deref());
    Seq {
        hashes,
        tokens: s.tokens,
        max_tokens: s.max_tokens.max(1),
        computed: 0,
        cached_tokens: 0,
        filled: 0,
        fresh_blocks: 0,
        hit_blocks: 0,
        generated: 0,
        arrived: Instant::now(),
        events: s.events,
    }
}

fn observe_ttft(st: &mut EngineStats, secs: f64) {
    if let Some(i) = TTFT_BUCKETS.iter().position(|b| secs <= *b) {
        st.ttft_buckets[i] += 1;
    }
    st.ttft_sum += secs;
    st.ttft_count += 1;
}

fn admit(
    cfg: &EngineConfig,
    cache: &mut BlockCache,
    waiting: &mut VecDeque<Seq>,
    running: &mut Vec<Seq>,
    stats: &Arc<Mutex<EngineStats>>,
) {
    let bs = cfg.block_size.max(1);
    while running.len() < cfg.max_num_seqs {
        let Some(s) = waiting.front_mut() else { break };
        let len = s.tokens.len();
        // vLLM recomputes at least the last prompt token, so a fully cached prompt reuses
        // one block less.
        let hit = cache
            .longest_prefix(&s.hashes)
            .min(len.saturating_sub(1) / bs);
        let total_blocks = (len + s.max_tokens).div_ceil(bs);
        let fresh = total_blocks - hit;
        if total_blocks > cache.capacity() {
            if let Some(s) = waiting.pop_front() {
                let _ = s.events.send(TokenEvent::Rejected {
                    needed_blocks: total_blocks,
                });
            }
            continue;
        }
        if cache.acquire(&s.hashes[..hit], fresh).is_err() {
            break;
        }
        cache.queries_tokens += len as u64;
        cache.hits_tokens += (hit * bs) as u64;
        s.cached_tokens = hit * bs;
        s.computed = hit * bs;
        s.filled = hit;
        s.fresh_blocks = fresh;
        s.hit_blocks = hit;
        if let Some(s) = waiting.pop_front() {
            let mut st = stats.lock().unwrap_or_else(|e| e.into_inner());
            st.prompt_tokens_total += len as u64;
            running.push(s);
        }
    }
}
