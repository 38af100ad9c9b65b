//! kvroute-turn-bench: the filter's per-request decision for Qwen3 chat prompts, timed by
//! phase, in one process and without Envoy, so that it runs the same natively and as
//! `wasm32-wasip1` (the filter's target) under Node's V8 with the flags Envoy's V8 runtime
//! sets (TurboFan only, no Liftoff), where a CPU profile can name the functions.
//!
//! Cases (all but `short` at about 8 k tokens, as `kvroute-decision-bench` sends them to Envoy):
//! - `cold`: one user message never seen before;
//! - `turn`: the 8th turn of a conversation whose first seven turns this router decided
//!   (its render and token caches hold them);
//! - `shared`: a new conversation (one user message of ~40 tokens) behind a system prompt of
//!   ~8 k tokens that earlier requests carried;
//! - `short`: one new user message of ~25 tokens (`kvroute-proxybench`'s short prompt);
//! - `mixed`: `turn`, with [`ONE_SHOTS`] new ~8 k-token prompts decided between two turns of a
//!   conversation (traffic where most long prompts are never seen again);
//! - `pool` (not run by default): the router's decision alone for a 4 096-token token-id
//!   prompt on pools of 64 and 1 024 workers (see [`pool`]).
//!
//! Phases: `parse` (`request::parse`), `tokenize` (render + tokenize, the router's own
//! clock), the rest of `Router::decide` (block hashes, lookups, scoring), and `credit` (the
//! routed blocks observed on the chosen worker, as the thread applies its journal entry).
//!
//! `--evict` walks 16 MiB before each decision, so that it starts with cold CPU caches.
//!
//! Run natively: `cargo run --release -p kvroute-turn-bench -- .cache/models/qwen3`; as wasm
//! under V8: `./dev turn-bench` (`core/turn-bench/run.mjs`; see it for a CPU profile).

use std::sync::OnceLock;
use std::time::Instant;

use kvroute_core::decision::config::sync::LoadLimits;
use kvroute_core::decision::config::FilterConfig;
use kvroute_core::decision::request::{self, Endpoint};
use kvroute_core::decision::router::Router;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_core::shared::fake::{MemStore, Tally};
use kvroute_core::shared::load::{LoadView, Shard};
use kvroute_core::wire::journal::Source;
use kvroute_testkit::textgen::words;
use serde_json::{json, Value};

mod pool;

const MODEL: &str = "qwen3";
const WORKERS: usize = 4;
const TARGET_TOKENS: usize = 8_000;
const TURNS: usize = 8;
/// One-shot prompts between two turns in the `mixed` case: about 5 MiB of their token ids,
/// more than a thread's token cache holds by default (4 MiB).
const ONE_SHOTS: usize = 160;
/// With `--evict`, bytes walked before each decision: more than the machine's last-level
/// cache, so that the decision starts with cold caches, as it does inside Envoy, whose own
/// work between two requests evicts the filter's code and data.
const EVICT_BYTES: usize = 16 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("kvroute-turn-bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let evict = all.iter().any(|a| a == "--evict");
    let mut args = all.into_iter().filter(|a| a != "--evict");
    let dir = args.next().ok_or("usage: kvroute-turn-bench QWEN3_DIR [ITERS [CASES]] [--evict]")?;
    let iters: usize = match args.next() {
        Some(n) => n.parse().map_err(|_| format!("ITERS: not a number: {n}"))?,
        None => 40,
    };
    let cases = args.next().unwrap_or_else(|| "cold,turn,shared,short,mixed".into());
    let case = |c: &str| cases.split(',').any(|x| x == c);
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}")).map_err(|e| format!("{dir}/{f}: {e}"))
    };
    let bundle = ModelBundle::from_hf(&read("tokenizer.json")?, &read("tokenizer_config.json")?)
        .map_err(|e| e.to_string())?;
    if case("pool") {
        pool::run(iters, &bundle, evict)?;
        if cases == "pool" {
            return Ok(());
        }
    }
    let wpt = words_per_token(&bundle)?;
    let workers: Vec<String> = (0..WORKERS).map(|i| format!("10.0.0.{i}:8000")).collect();
    let cfg = json!({"models": [{"name": MODEL, "workers": workers}], "max_prompt_bytes": 1 << 20});
    let cfg = FilterConfig::from_json(cfg.to_string().as_bytes()).map_err(|e| e.to_string())?;
    let mut router = Router::new(&cfg).map_err(|e| e.to_string())?;
    router.set_bundle(MODEL, Some(bundle));
    router.set_clock(clock_ns);
    let loads = loads(&workers);
    let evict = evict.then(|| vec![1u8; EVICT_BYTES]);
    let mut bench = Bench { router, loads, now_ms: 1_000_000, evict };

    let words_total = (TARGET_TOKENS as f64 * wpt) as usize;
    println!("kvroute-turn-bench: Qwen3, {WORKERS} workers, µs (p50 p99)");
    println!(
        "{:<8} {:>6} {:>15} {:>15} {:>15} {:>15} {:>15}",
        "case", "tokens", "whole", "parse", "render+tokenize", "decide rest", "credit"
    );
    // Warm-up: every path runs once (and the wasm memory grows) before anything is measured.
    for i in 0..4 {
        let text = words(0x3A53_0000 + i, words_total);
        bench.time(&[json!({"role": "user", "content": text})], &mut Phases::default())?;
    }
    let mut cold = Phases::default();
    for i in 0..iters * usize::from(case("cold")) {
        let text = words(0xC01D_0000 + i as u64, words_total);
        bench.time(&[json!({"role": "user", "content": text})], &mut cold)?;
    }
    cold.row("cold");
    let mut turn = Phases::default();
    for c in 0..iters * usize::from(case("turn")) {
        let mut messages = Vec::new();
        for t in 0..TURNS {
            let seed = 0x3A4_0000 + (c * 100 + t) as u64;
            messages.push(json!({"role": "user", "content": words(seed, words_total / TURNS)}));
            if t + 1 == TURNS {
                bench.time(&messages, &mut turn)?;
            } else {
                bench.time(&messages, &mut Phases::default())?;
            }
            messages.push(json!({"role": "assistant", "content": "Noted."}));
        }
    }
    turn.row("turn");
    let system = json!({"role": "system", "content": words(0x5157, words_total)});
    let mut shared = Phases::default();
    for i in 0..(iters + 1) * usize::from(case("shared")) {
        let user = json!({"role": "user", "content": words(0x05E2_0000 + i as u64, 30)});
        // The first request brings the system prompt to the caches; it is not measured.
        let into = if i == 0 { &mut Phases::default() } else { &mut shared };
        bench.time(&[system.clone(), user], into)?;
    }
    shared.row("shared");
    let mut short = Phases::default();
    for i in 0..iters * usize::from(case("short")) {
        let text = words(0x5807_0000 + i as u64, 18);
        bench.time(&[json!({"role": "user", "content": text})], &mut short)?;
    }
    short.row("short");
    let mut mixed = Phases::default();
    // Fewer conversations: each brings ONE_SHOTS cold prompts per turn.
    for c in 0..iters.div_ceil(8) * usize::from(case("mixed")) {
        let mut messages = Vec::new();
        for t in 0..TURNS {
            for o in 0..ONE_SHOTS {
                let text = words(0x0E5_0000_0000 + (c * 10_000 + t * 1000 + o) as u64, words_total);
                bench.time(&[json!({"role": "user", "content": text})], &mut Phases::default())?;
            }
            let seed = 0x3A5_0000 + (c * 100 + t) as u64;
            messages.push(json!({"role": "user", "content": words(seed, words_total / TURNS)}));
            let into = if t + 1 == TURNS { &mut mixed } else { &mut Phases::default() };
            bench.time(&messages, into)?;
            messages.push(json!({"role": "assistant", "content": "Noted."}));
        }
    }
    mixed.row("mixed");
    if !cold.whole.is_empty() && !turn.whole.is_empty() {
        let ratio = quantile(&cold.whole, 0.5) / quantile(&turn.whole, 0.5);
        println!("cold/turn whole p50 ratio {ratio:.1}x");
    }
    Ok(())
}

/// Writes one byte per cache line of `buf` (`--evict`): the CPU caches then hold it, not what
/// the last decision read.
fn evict_caches(buf: &mut [u8]) {
    for b in buf.iter_mut().step_by(64) {
        *b = b.wrapping_add(1);
    }
    std::hint::black_box(&buf);
}

/// Nanoseconds since the first call.
fn clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn us_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Words of [`words`] per Qwen3 token, measured on a sample.
fn words_per_token(bundle: &ModelBundle) -> Result<f64, String> {
    let sample = words(0x57A7, 4_000);
    let ids = bundle.encode(&sample, false).map_err(|e| e.to_string())?;
    Ok(4_000.0 / ids.len().max(1) as f64)
}

/// Router-tracked load as the filter reads it (its thread's shard in shared data, here in
/// memory): one request in flight on every other worker.
fn loads(workers: &[String]) -> LoadView {
    let (store, counters) = (MemStore::new(), Tally::default());
    let now = 1_000_000;
    let mut shard = Shard::register(&store, &counters, LoadLimits::default(), now, 1);
    for w in workers.iter().step_by(2) {
        shard.start(&counters, w, 2048, now - 15);
    }
    LoadView::read(&store, &counters, &shard, now)
}

struct Bench {
    router: Router,
    loads: LoadView,
    now_ms: u64,
    /// `--evict`'s buffer.
    evict: Option<Vec<u8>>,
}

impl Bench {
    /// Decides one chat request as the filter does and adds its phases to `into`.
    fn time(&mut self, messages: &[Value], into: &mut Phases) -> Result<(), String> {
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 1}).to_string();
        if let Some(buf) = &mut self.evict {
            evict_caches(buf);
        }
        self.measure(body.as_bytes(), into)
    }

    /// The measured part of [`Bench::time`], a frame of its own for CPU profiles.
    #[inline(never)]
    fn measure(&mut self, body: &[u8], into: &mut Phases) -> Result<(), String> {
        self.now_ms += 10;
        let started = Instant::now();
        let parsed = request::parse(Endpoint::Chat, body).map_err(|e| e.to_string())?;
        let parse = us_since(started);
        let decided = Instant::now();
        let d = self
            .router
            .decide(&parsed, body.len(), &self.loads, self.now_ms, self.now_ms)
            .map_err(|e| String::from_utf8_lossy(&e.body()).into_owned())?;
        std::hint::black_box(d.header_value());
        let decide = us_since(decided);
        let credited = Instant::now();
        let worker = d.primary().map(|s| s.worker.to_string()).ok_or("no worker chosen")?;
        self.router.observe(&worker, &d.block_hashes, Source::Routed, self.now_ms);
        let credit = us_since(credited);
        into.whole.push(us_since(started));
        into.parse.push(parse);
        into.tokenize.push(d.tokenize_us as f64);
        into.rest.push((decide - d.tokenize_us as f64).max(0.0));
        into.credit.push(credit);
        into.tokens = d.prompt_tokens;
        Ok(())
    }
}

#[derive(Default)]
struct Phases {
    whole: Vec<f64>,
    parse: Vec<f64>,
    tokenize: Vec<f64>,
    rest: Vec<f64>,
    credit: Vec<f64>,
    tokens: u64,
}

impl Phases {
    fn row(&self, case: &str) {
        if self.whole.is_empty() {
            return;
        }
        let cell = |v: &[f64]| format!("{:>7.0} {:>7.0}", quantile(v, 0.5), quantile(v, 0.99));
        println!(
            "{case:<8} {:>6} {} {} {} {} {}",
            self.tokens,
            cell(&self.whole),
            cell(&self.parse),
            cell(&self.tokenize),
            cell(&self.rest),
            cell(&self.credit)
        );
    }
}

/// Nearest-rank quantile (NaN when empty).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n => s[((q * n as f64).ceil() as usize).clamp(1, n) - 1],
    }
}
