//! kvroute-demo: the same multi-turn workload, on the same arrival schedule, through real Envoy
//! twice: once with the kvroute filter, once with Envoy's LEAST_REQUEST. Prints TTFT p50/p99
//! and cache-hit rate side by side and writes `results/demo.{md,json}`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use kvroute_integration::client::{self, Reply};
use kvroute_integration::paths;
use kvroute_integration::stack::{Policy, Stack, StackOptions, MODEL};
use kvroute_integration::workload::{schedule_hash, Arrival, MultiTurn};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Compare kvroute with Envoy's LEAST_REQUEST on one seeded multi-turn schedule")]
struct Args {
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    #[arg(long, default_value_t = 30)]
    conversations: usize,
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Words in each conversation's system prompt (its shared context).
    #[arg(long, default_value_t = 1500)]
    system_words: usize,
    #[arg(long, default_value_t = 40)]
    user_words: usize,
    #[arg(long, default_value_t = 24)]
    max_tokens: u64,
    #[arg(long, default_value_t = 400)]
    start_gap_ms: u64,
    #[arg(long, default_value_t = 3000)]
    think_time_ms: u64,
    /// Simulated prefill cost per token (ms); 0.2 ≈ a 70B-class model on one GPU.
    #[arg(long, default_value_t = 0.2)]
    prefill_ms_per_token: f64,
    /// Also measure the filter's decision time for 8k-token prompts (from its histogram).
    #[arg(long)]
    decision_bench: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workload = MultiTurn {
        seed: args.seed,
        conversations: args.conversations,
        turns: args.turns,
        system_words: args.system_words,
        user_words: args.user_words,
        max_tokens: args.max_tokens,
        start_gap: Duration::from_millis(args.start_gap_ms),
        think_time: Duration::from_millis(args.think_time_ms),
    };
    let schedule = workload.schedule(MODEL);
    let span = schedule.last().map_or(Duration::ZERO, |a| a.at);
    println!(
        "kvroute demo: {} workers, {} requests ({} conversations x {} turns) over {:.1} s, seed {}, schedule hash {:016x}",
        args.workers, schedule.len(), args.conversations, args.turns, span.as_secs_f64(), args.seed, schedule_hash(&schedule)
    );
    let sim_args =
        vec!["--prefill-ms-per-token".to_string(), args.prefill_ms_per_token.to_string()];
    let profile = json!({"profile": {"prefill_ms_per_token": args.prefill_ms_per_token, "prefill_base_ms": 5.0, "decode_interference_ms": 0.5}});
    let mut results = BTreeMap::new();
    for policy in [Policy::Kvroute, Policy::LeastRequest] {
        let opts = StackOptions {
            policy,
            workers: args.workers,
            sim_args: sim_args.clone(),
            model_overrides: profile.clone(),
            // kvroute learns from the workers' KV events through kvroute-updater.
            updater: policy == Policy::Kvroute,
            ..Default::default()
        };
        let started = Instant::now();
        let stack = Stack::start(opts)
            .await
            .with_context(|| format!("starting the {} stack", policy.name()))?;
        println!(
            "  {:<14} stack up in {:.1} s ({} workers; Envoy ready {:.2} s after its start); replaying...",
            policy.name(),
            started.elapsed().as_secs_f64(),
            args.workers,
            stack.envoy.startup.as_secs_f64()
        );
        let replies = replay(&stack, &schedule).await;
        let summary = Summary::of(&replies, &stack.addrs())?;
        println!("  {:<14} done: {}", policy.name(), summary.one_line());
        results.insert(policy.name(), summary);
    }
    if args.decision_bench {
        // A fresh stack, so the histogram holds only the 8k-token decisions.
        let opts = StackOptions {
            sim_args: sim_args.clone(),
            model_overrides: profile.clone(),
            ..Default::default()
        };
        decision_bench(&Stack::start(opts).await?).await?;
    }
    report(&results, &args, schedule_hash(&schedule))
}

async fn replay(stack: &Stack, schedule: &[Arrival]) -> Vec<anyhow::Result<Reply>> {
    let http = reqwest::Client::new();
    let url = stack.base_url();
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = schedule
        .iter()
        .map(|a| {
            let (http, url, body, at) = (http.clone(), url.clone(), a.body.clone(), a.at);
            tokio::spawn(async move {
                tokio::time::sleep_until(start + at).await;
                tokio::time::timeout(Duration::from_secs(120), client::chat(&http, &url, &body))
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("request timed out")))
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Err(anyhow::anyhow!("task failed: {e}"))));
    }
    out
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    requests: usize,
    ok: usize,
    ttft_p50_ms: f64,
    ttft_p90_ms: f64,
    ttft_p99_ms: f64,
    cache_hit_rate: f64,
    per_worker: BTreeMap<String, usize>,
}

impl Summary {
    fn of(replies: &[anyhow::Result<Reply>], addrs: &[String]) -> anyhow::Result<Summary> {
        let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
        let (mut prompt, mut cached, mut ok) = (0u64, 0u64, 0usize);
        let mut per_worker: BTreeMap<String, usize> =
            addrs.iter().map(|a| (a.clone(), 0)).collect();
        for r in replies.iter().flatten().filter(|r| r.status == 200) {
            ok += 1;
            let _ = hist.record(r.ttft.as_micros() as u64);
            prompt += r.prompt_tokens.unwrap_or(0);
            cached += r.cached_tokens.unwrap_or(0);
            if let Some(w) = &r.worker {
                *per_worker.entry(w.clone()).or_default() += 1;
            }
        }
        let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
        Ok(Summary {
            requests: replies.len(),
            ok,
            ttft_p50_ms: q(0.5),
            ttft_p90_ms: q(0.9),
            ttft_p99_ms: q(0.99),
            cache_hit_rate: if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 },
            per_worker,
        })
    }

    fn one_line(&self) -> String {
        format!(
            "{}/{} ok, TTFT p50 {:.0} ms, p99 {:.0} ms, cache hits {:.1} %",
            self.ok,
            self.requests,
            self.ttft_p50_ms,
            self.ttft_p99_ms,
            100.0 * self.cache_hit_rate
        )
    }
}

async fn decision_bench(stack: &Stack) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    // ~8k tokens: the demo tokenizer yields about 1.3 tokens per generated word.
    for i in 0..40u64 {
        let text = kvroute_core::textgen::words(0xBE7C4 + i, 7050);
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1});
        let r = client::chat(&http, &stack.base_url(), &body).await?;
        anyhow::ensure!(r.status == 200, "decision bench request failed: {}", r.status);
        if i == 0 {
            println!("  decision bench: prompt of {} tokens", r.prompt_tokens.unwrap_or(0));
        }
    }
    tokio::time::sleep(Duration::from_secs(6)).await; // Envoy merges histograms every 5 s.
    let q = stack.envoy.histogram_quantiles("wasmcustom.kvroute.decision_time_us").await?;
    let show = |k: &str| q.get(k).map_or("n/a".to_string(), |v| format!("{v:.0}"));
    println!("  decision time for these prompts (parse + render + tokenize + hash + score), µs: p50 {} p99 {}", show("P50"), show("P99"));
    Ok(())
}

fn report(results: &BTreeMap<&str, Summary>, args: &Args, hash: u64) -> anyhow::Result<()> {
    let kv = results.get("kvroute");
    let lr = results.get("least-request");
    let mut md = String::new();
    md.push_str(&format!(
        "## kvroute vs LEAST_REQUEST\n\nScope: {} simulated workers (profile llama3-8b-h100, prefill raised to {} ms/token), \
         {} conversations x {} turns, system prompt {} words, seed {}, schedule hash {hash:016x}, \
         knowledge for kvroute: KV events via kvroute-updater (100 ms snapshot tick) + routing history + response feedback.\n\n",
        args.workers, args.prefill_ms_per_token, args.conversations, args.turns, args.system_words, args.seed
    ));
    md.push_str("| policy | ok | TTFT p50 (ms) | TTFT p90 (ms) | TTFT p99 (ms) | cache-hit rate | requests per worker |\n|---|---|---|---|---|---|---|\n");
    for (name, s) in results {
        let spread: Vec<String> = s.per_worker.values().map(usize::to_string).collect();
        md.push_str(&format!(
            "| {name} | {}/{} | {:.0} | {:.0} | {:.0} | {:.1} % | {} |\n",
            s.ok,
            s.requests,
            s.ttft_p50_ms,
            s.ttft_p90_ms,
            s.ttft_p99_ms,
            100.0 * s.cache_hit_rate,
            spread.join(" / ")
        ));
    }
    if let (Some(k), Some(l)) = (kv, lr) {
        md.push_str(&format!(
            "\nkvroute / least-request: TTFT p50 x{:.2}, p99 x{:.2}; cache-hit rate {:.1} % vs {:.1} %.\n",
            k.ttft_p50_ms / l.ttft_p50_ms.max(1e-9),
            k.ttft_p99_ms / l.ttft_p99_ms.max(1e-9),
            100.0 * k.cache_hit_rate,
            100.0 * l.cache_hit_rate
        ));
    }
    println!("\n{md}");
    let dir = paths::repo_root().join("results");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("demo.md"), &md)?;
    std::fs::write(
        dir.join("demo.json"),
        serde_json::to_string_pretty(
            &json!({"seed": args.seed, "schedule_hash": format!("{hash:016x}"), "results": results}),
        )?,
    )?;
    println!("(written to results/demo.md and results/demo.json)");
    let failed: usize = results.values().map(|s| s.requests - s.ok).sum();
    anyhow::ensure!(failed == 0, "{failed} requests failed");
    Ok(())
}
