//! kvroute-decision-bench: the filter's decision time inside Envoy for Qwen3 chat prompts of
//! about 1 k, 8 k and 32 k tokens, cold (a prompt the thread has never seen) and on the k-th
//! turn of a conversation (earlier turns already tokenized by the same Envoy thread), p50/p99.
//!
//! Each answer's `x-kvroute-decision` header reports the decision's own timing, measured by
//! the filter with Envoy's clock: `decision_us` (from the body's arrival to the destination
//! header: parse, knowledge catch-up, render, tokenize, hash, score, load and journal writes)
//! and inside it `parse_us` (JSON body parsing), `catchup_us` (applying other threads' journal
//! and the updater's knowledge, bounded per request) and `tokenize_us` (render + tokenize).
//! The rest is the decision proper: hashing, lookups, scoring, load and journal writes
//! (goal: decision p99 excluding tokenization ≤ 100 µs).
//!
//! The stack is the shipped bootstrap with two model pools (the demo model and Qwen3, both
//! bundles distributed by the updater). The same run reports memory: Envoy's RSS without the
//! filter, with the filter and the demo model only, and with both models built by every worker
//! thread. Workers are simulated with a 50× time speedup (their prefill time is not what is
//! measured here).
//!
//! Run: `target/release/kvroute-decision-bench` (after `./dev build`).

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kvroute_stack::client;
use kvroute_stack::stack::{Pool, RoutePolicy, Stack, StackOptions, QWEN3_MODEL};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Decision time of the kvroute filter inside Envoy, Qwen3 prompts")]
struct Args {
    /// Cold prompts per size.
    #[arg(long, default_value_t = 40)]
    cold: usize,
    /// Conversations per size (the last turn of each is measured warm).
    #[arg(long, default_value_t = 12)]
    conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 8)]
    turns: usize,
}

fn user_text(seed: u64, words: usize) -> String {
    kvroute_testkit::textgen::words(seed, words)
}

#[derive(Default)]
struct Timings {
    decision: Vec<f64>,
    parse: Vec<f64>,
    catchup: Vec<f64>,
    tokenize: Vec<f64>,
    /// Decision minus parsing, catch-up and tokenization: hashing, lookups, scoring, load and
    /// journal writes.
    rest: Vec<f64>,
}

impl Timings {
    fn add(&mut self, r: &client::Reply) -> anyhow::Result<u64> {
        anyhow::ensure!(r.status == 200, "request failed: {} {}", r.status, r.body);
        let field = |k: &str| -> anyhow::Result<f64> {
            r.decision_field(k)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("no {k} in x-kvroute-decision {:?}", r.decision))
        };
        let (d, p) = (field("decision_us")?, field("parse_us")?);
        let (c, t) = (field("catchup_us")?, field("tokenize_us")?);
        self.decision.push(d);
        self.parse.push(p);
        self.catchup.push(c);
        self.tokenize.push(t);
        self.rest.push((d - t - p - c).max(0.0));
        Ok(r.prompt_tokens.unwrap_or(0))
    }
}

/// Nearest-rank quantile of `v` (NaN when empty).
fn quantile(v: &[f64], q: f64) -> f64 {
    kvroute_stack::quantile(v, q).unwrap_or(f64::NAN)
}

fn row(name: &str, tokens: u64, t: &Timings) {
    let q = |v: &[f64]| format!("{:>7.0} {:>7.0}", quantile(v, 0.5), quantile(v, 0.99));
    println!(
        "{name:<14} {tokens:>7} {} {} {} {} {}",
        q(&t.decision),
        q(&t.parse),
        q(&t.catchup),
        q(&t.tokenize),
        q(&t.rest)
    );
}

fn body(messages: &[Value]) -> Value {
    json!({"model": QWEN3_MODEL, "messages": messages, "max_tokens": 1})
}

/// Sends a small chat for each model until none is decided without its bundle (the threads
/// build bundles on their tick; until then decisions are load-only, fallback `no_bundle`).
async fn wait_ready(http: &reqwest::Client, url: &str, models: &[&str]) -> anyhow::Result<()> {
    for model in models {
        let probe = json!({"model": model, "max_tokens": 1,
            "messages": [{"role": "user", "content": "warm up"}]});
        let mut ready = 0;
        for _ in 0..600 {
            let r = client::chat(http, url, &probe).await?;
            let bundled =
                r.status == 200 && r.decision_field("fallback").as_deref() != Some("no_bundle");
            // Several in a row: each Envoy thread builds its own copy.
            ready = if bundled { ready + 1 } else { 0 };
            if ready >= 8 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::ensure!(ready >= 8, "the {model} bundle never reached the filter");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let wpt = kvroute_stack::workload::words_per_token(
        &kvroute_core::decision::tokenize::model::qwen3()?,
    )?;
    let threads = 2;
    let opts = StackOptions {
        pools: vec![Pool::demo(1), Pool::qwen3(2)],
        updater: true,
        envoy_concurrency: threads,
        sim_args: vec!["--speedup".into(), "50".into(), "--num-gpu-blocks".into(), "65536".into()],
        filter: json!({"max_prompt_bytes": 1 << 20}),
        ..Default::default()
    };
    // Memory: Envoy without the filter, with the filter and the demo model only (built in),
    // and with both models (Qwen3's bundle from the updater) built by every thread.
    let http = reqwest::Client::new();
    let bare = StackOptions {
        policy: RoutePolicy::LeastRequest,
        envoy_concurrency: threads,
        workers: 1,
        ..Default::default()
    };
    let demo_only = StackOptions { envoy_concurrency: threads, workers: 1, ..Default::default() };
    let mut rss = Vec::new();
    for o in [bare, demo_only] {
        let s = Stack::start(o).await?;
        let models: &[&str] = &[kvroute_stack::stack::MODEL];
        wait_ready(&http, &s.base_url(), models).await?;
        rss.push(s.envoy.guard.rss_kb());
    }
    let stack = Stack::start(opts).await?;
    let url = stack.base_url();
    wait_ready(&http, &url, &[QWEN3_MODEL, kvroute_stack::stack::MODEL]).await?;
    rss.push(stack.envoy.guard.rss_kb());
    println!("kvroute-decision-bench: Qwen3, {threads} Envoy threads, µs (p50 p99)");
    println!(
        "{:<14} {:>7} {:>15} {:>15} {:>15} {:>15} {:>15}",
        "case", "tokens", "decision", "parse body", "catch-up", "render+tokenize", "score+publish"
    );
    for target in [1_000u64, 8_000, 32_000] {
        let words = (target as f64 * wpt) as usize;
        let mut cold = Timings::default();
        let mut tokens = 0;
        for i in 0..a.cold {
            let text = user_text(0xC01D_0000 + target + i as u64, words);
            let r = client::chat(&http, &url, &body(&[json!({"role": "user", "content": text})]))
                .await?;
            tokens = cold.add(&r)?;
        }
        row(&format!("{}k cold", target / 1000), tokens, &cold);
        // Conversations of `turns` turns growing to about `target` tokens; the final turn of
        // each is measured. One client connection per conversation keeps it on one thread:
        // HTTP/2 sends each turn on it (an HTTP/1.1 pool opens another now and then).
        let per_turn = words / a.turns;
        let mut warm = Timings::default();
        for c in 0..a.conversations {
            let conn = reqwest::Client::builder().http2_prior_knowledge().build()?;
            let mut messages = Vec::new();
            for turn in 0..a.turns {
                let seed = 0x3A4_0000 + target * 1000 + (c * 100 + turn) as u64;
                messages.push(json!({"role": "user", "content": user_text(seed, per_turn)}));
                let r = client::chat(&conn, &url, &body(&messages)).await?;
                if turn + 1 == a.turns {
                    tokens = warm.add(&r)?;
                } else {
                    anyhow::ensure!(r.status == 200, "turn failed: {}", r.status);
                }
                messages.push(json!({"role": "assistant", "content": "Noted."}));
            }
        }
        row(&format!("{}k turn {}", target / 1000, a.turns), tokens, &warm);
        println!(
            "{:<14} cold/warm decision p50 ratio {:.1}x",
            "",
            quantile(&cold.decision, 0.5) / quantile(&warm.decision, 0.5)
        );
    }
    if let [Some(bare), Some(demo), Some(both)] = rss[..] {
        let per_thread = |kb: u64| kb as f64 / 1024.0 / f64::from(threads);
        println!(
            "Envoy RSS, MiB: {} without the filter, {} with the filter (demo model), {} with demo + Qwen3 \
             built on every thread; per worker thread: {:.0} MiB with both models, of which Qwen3 {:.0} MiB \
             (the singleton's copy and the bundle parts in shared data counted in)",
            bare / 1024,
            demo / 1024,
            both / 1024,
            per_thread(both.saturating_sub(bare)),
            per_thread(both.saturating_sub(demo)),
        );
    }
    Ok(())
}

kvroute_stack::help_test!(Args);
