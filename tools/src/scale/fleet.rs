//! A simulated fleet's knowledge, built the way the updater builds it: each worker's KV events
//! (chains of stored blocks with their token ids) applied to a real [`State`], whose snapshot a
//! real [`Router`] takes in, as a filter thread does.
//!
//! Every worker holds `blocks_per_worker` blocks in chains of [`CHAIN_BLOCKS`]; each chain
//! starts with one of [`SYSTEM_PROMPTS`] shared system prompts ([`SHARED_BLOCKS`] blocks), so
//! many workers hold the same leading blocks, as a fleet serving common system prompts does.
//! One worker (the middle one) also holds the "hit" prompt; the "miss" prompt shares nothing.

use std::time::Instant;

use anyhow::Context;
use kvroute_core::decision::config::FilterConfig;
use kvroute_core::decision::router::Router;
use kvroute_core::wire::snapshot::Snapshot;
use kvroute_stack::stack::MODEL;
use kvroute_updater::decode::{Batch, EngineEvent, Place, Stored};
use kvroute_updater::engine_metrics::EngineLoad;
use kvroute_updater::ingest::DomainBase;
use kvroute_updater::limits::Limits;
use kvroute_updater::state::{now_ms, State};
use serde_json::json;

/// Blocks per stored chain (one request's prompt: 512 tokens at 16 tokens a block).
pub const CHAIN_BLOCKS: usize = 32;
/// Leading blocks of every chain that are one of the shared system prompts.
pub const SHARED_BLOCKS: usize = 8;
/// A chain's own blocks after its system prompt.
const TAIL_BLOCKS: usize = CHAIN_BLOCKS - SHARED_BLOCKS;
/// Distinct shared system prompts in the fleet.
pub const SYSTEM_PROMPTS: u64 = 8;
/// Tokens of the hit and miss prompts (256 blocks).
pub const PROMPT_TOKENS: usize = 4096;
/// Chains per event batch (vLLM batches the events of one engine step).
const CHAINS_PER_BATCH: usize = 16;

/// A 64-bit mix (splitmix64): deterministic token ids and engine hashes without storing them.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Token ids `[start, start + n)` of the stream named `seed` (ids below the demo vocabulary).
fn tokens(seed: u64, start: usize, n: usize) -> impl Iterator<Item = u32> {
    (start..start + n).map(move |i| 1 + (mix(seed ^ mix(i as u64)) % 900) as u32)
}

/// Worker `i`'s address, `ip:port` as in an Envoy cluster.
pub fn worker_name(i: usize) -> String {
    format!("10.{}.{}.{}:8000", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

/// The prompt tokens of the hit (`hit`) or miss prompt: the hit starts with system prompt 0.
pub fn prompt_tokens(hit: bool) -> Vec<u32> {
    prompt_of(hit, PROMPT_TOKENS)
}

/// [`prompt_tokens`] of `n` tokens (at least the shared system prompt's): a longer hit prompt
/// starts with the shorter one.
pub fn prompt_of(hit: bool, n: usize) -> Vec<u32> {
    if hit {
        let shared = SHARED_BLOCKS * 16;
        let n = n.max(shared);
        tokens(system_seed(0), 0, shared).chain(tokens(0x417, 0, n - shared)).collect()
    } else {
        tokens(0x3155, 0, n).collect()
    }
}

/// A prompt of [`PROMPT_TOKENS`] tokens that starts with one of the shared system prompts
/// (chosen by `seed`) and continues with tokens nobody else has (named by `seed`).
pub fn fill_prompt(seed: u64) -> Vec<u32> {
    let shared = SHARED_BLOCKS * 16;
    tokens(system_seed(seed % SYSTEM_PROMPTS), 0, shared)
        .chain(tokens(mix(seed ^ 0xF111), 0, PROMPT_TOKENS - shared))
        .collect()
}

/// A prompt of `n` tokens that shares nothing with any other (named by `seed`).
pub fn fresh_prompt(seed: u64, n: usize) -> Vec<u32> {
    tokens(mix(seed ^ 0xF5E5), 0, n).collect()
}

fn system_seed(s: u64) -> u64 {
    0x5157_0000 + s
}

/// The completions body of a prompt (token ids: the decision's cost without tokenization).
pub fn body(tokens: &[u32]) -> Vec<u8> {
    json!({"model": MODEL, "prompt": tokens, "max_tokens": 1}).to_string().into_bytes()
}

/// The knowledge of `workers` workers holding `blocks_per_worker` blocks each.
pub struct Fleet {
    pub workers: Vec<String>,
    pub state: State,
    pub domain: DomainBase,
    pub cfg: FilterConfig,
    /// Next chain number per worker (chains stored so far).
    next_chain: Vec<u64>,
    /// Oldest chain still held per worker (evicted first).
    oldest_chain: Vec<u64>,
    seq: Vec<u64>,
    /// Which system prompts each worker stored (bit `s`).
    systems: Vec<u8>,
    /// Events applied while building, and the seconds it took (in-process ingest).
    pub build_events: u64,
    pub build_s: f64,
}

impl Fleet {
    /// Builds the fleet: the filter's configuration for its pool, and the updater's state
    /// after every worker's stores.
    pub fn build(workers: usize, blocks_per_worker: usize) -> anyhow::Result<Fleet> {
        let names: Vec<String> = (0..workers).map(worker_name).collect();
        // The router's index holds what the snapshot carries (its default bound is 65 536
        // blocks per worker: more would be cut, not measured).
        let cap = (blocks_per_worker + PROMPT_TOKENS / 16 + 1024).max(65_536);
        let cfg = FilterConfig::from_json(
            json!({"models": [{"name": MODEL, "workers": names}],
                   "index": {"max_blocks_per_worker": cap}})
            .to_string()
            .as_bytes(),
        )?;
        let router = Router::new(&cfg)?;
        let plan = router.plan().model(MODEL).context("no model plan")?;
        let domain = DomainBase {
            model: MODEL.into(),
            tokenizer_fingerprint: plan.fingerprint().context("no demo bundle")?,
            block_size: plan.block_size,
            lora_name: None,
        };
        anyhow::ensure!(domain.block_size == 16, "the fleet assumes 16-token blocks");
        let mut limits = Limits::default();
        limits.blocks.max_blocks_per_tier = limits.blocks.max_blocks_per_tier.max(cap);
        limits.blocks.max_engine_keys = limits.blocks.max_engine_keys.max(2 * cap);
        let state = State::with_limits(domain.clone(), names.clone(), limits);
        let mut f = Fleet {
            workers: names,
            state,
            domain,
            cfg,
            next_chain: vec![0; workers],
            oldest_chain: vec![0; workers],
            seq: vec![0; workers],
            systems: vec![0; workers],
            build_events: 0,
            build_s: 0.0,
        };
        let t = Instant::now();
        let chains =
            blocks_per_worker.saturating_sub(SHARED_BLOCKS * 8).div_ceil(TAIL_BLOCKS).max(1);
        for w in 0..workers {
            let mut left = chains;
            while left > 0 {
                let n = left.min(CHAINS_PER_BATCH);
                let mut events = Vec::new();
                for _ in 0..n {
                    f.store_next(w, &mut events);
                }
                f.build_events += events.len() as u64;
                f.apply(w, events);
                left -= n;
            }
            let now = now_ms();
            let load = EngineLoad {
                running: Some((mix(w as u64) % 8) as f64),
                waiting: Some((mix(w as u64 + 1) % 3) as f64),
                kv_usage: Some(0.8),
                observed_at_ms: now,
            };
            f.state.update(&f.workers[w], |r| r.load = Some(load));
        }
        // The hit prompt on the middle worker: system prompt 0, then its own blocks.
        let (w, mut events) = (workers / 2, Vec::new());
        f.store_system(w, 0, &mut events);
        let parent = Self::block_key(Self::system_key(w, 0), SHARED_BLOCKS - 1);
        let tail = prompt_tokens(true)[SHARED_BLOCKS * 16..].to_vec();
        events.push(f.stored_event(0x417_417, Some(parent), tail));
        f.build_events += events.len() as u64;
        f.apply(w, events);
        f.build_s = t.elapsed().as_secs_f64();
        Ok(f)
    }

    fn stored_event(&self, key_seed: u64, parent: Option<u64>, token_ids: Vec<u32>) -> EngineEvent {
        let blocks = token_ids.len() / 16;
        EngineEvent::stored(Stored {
            hashes: (0..blocks).map(|b| Self::block_key(key_seed, b)).collect(),
            parent,
            token_ids,
            block_size: 16,
            place: Place::Gpu,
            lora_name: None,
            salt: None,
            group: None,
            kind: None,
            lookahead: false,
            pairs: false,
        })
    }

    /// The engine key seed of chain `c` on worker `w` (its blocks' keys follow from it).
    fn chain_key(w: usize, c: u64) -> u64 {
        mix(((w as u64) << 32) ^ c ^ 0xC4A1)
    }

    /// The engine key of block `b` of the chain keyed `key`.
    fn block_key(key: u64, b: usize) -> u64 {
        mix(key ^ mix(b as u64 + 1))
    }

    /// The engine key seed of system prompt `s` on worker `w`.
    fn system_key(w: usize, s: u64) -> u64 {
        Self::chain_key(w, (1 << 40) | s)
    }

    /// The store event of system prompt `s` on worker `w`, the first time it is used there.
    fn store_system(&mut self, w: usize, s: u64, events: &mut Vec<EngineEvent>) {
        if self.systems[w] & (1 << s) == 0 {
            self.systems[w] |= 1 << s;
            let ids = tokens(system_seed(s), 0, SHARED_BLOCKS * 16).collect();
            events.push(self.stored_event(Self::system_key(w, s), None, ids));
        }
    }

    /// The store events of worker `w`'s next chain: its system prompt (once per worker, as
    /// an engine with prefix caching stores a prefix once) and its own blocks after it.
    fn store_next(&mut self, w: usize, events: &mut Vec<EngineEvent>) {
        let c = self.next_chain[w];
        self.next_chain[w] += 1;
        let s = (w as u64 + c) % SYSTEM_PROMPTS;
        self.store_system(w, s, events);
        let parent = Self::block_key(Self::system_key(w, s), SHARED_BLOCKS - 1);
        let own = mix(Self::chain_key(w, c));
        let ids = tokens(own, 0, TAIL_BLOCKS * 16).collect();
        events.push(self.stored_event(Self::chain_key(w, c), Some(parent), ids));
    }

    /// One event as a steady-state engine sends it: a new chain stored, and the oldest one's
    /// own blocks removed in the same batch (its cache is full).
    pub fn churn(&mut self, w: usize) {
        let old = self.oldest_chain[w];
        self.oldest_chain[w] += 1;
        let key = Self::chain_key(w, old);
        let mut events = Vec::new();
        self.store_next(w, &mut events);
        events.push(EngineEvent::Removed {
            hashes: (0..TAIL_BLOCKS).map(|b| Self::block_key(key, b)).collect(),
            place: Place::Gpu,
            group: None,
        });
        self.apply(w, events);
    }

    fn apply(&mut self, w: usize, events: Vec<EngineEvent>) {
        let seq = self.seq[w];
        self.seq[w] += 1;
        let batch = Batch { ts: 0.0, events, rank: None };
        let (domain, now) = (&self.domain, now_ms());
        self.state.update(&self.workers[w], |r| r.knowledge.apply(seq, &batch, domain, now));
    }

    /// A filter thread's router that took in the updater's current snapshot.
    pub fn router(&self) -> anyhow::Result<(Router, Snapshot)> {
        let snap = self.state.snapshot();
        let mut router = Router::new(&self.cfg)?;
        router.apply_snapshot(&snap);
        router.events_checked(now_ms());
        Ok((router, snap))
    }

    /// Blocks the snapshot lists, all workers.
    pub fn blocks_held(snap: &Snapshot) -> usize {
        snap.workers.iter().map(|w| w.gpu.len() + w.offloaded.len()).sum()
    }
}
