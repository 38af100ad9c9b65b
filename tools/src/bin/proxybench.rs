//! kvroute-proxybench: what the kvroute filter costs in proxy throughput. Requests per second
//! through one Envoy (2 worker threads by default) running the shipped `envoy/kvroute.yaml`,
//! against the same bootstrap with the wasm filter taken out (`envoy/buffer-only.yaml`: the same
//! listener, native header_mutation and buffer filters, and worker cluster), for short and
//! ~8 k-token chat prompts.
//!
//! The upstream is a fixture in this process that answers every chat request at once with a
//! fixed small OpenAI response (and `/health`), so Envoy and the filter are the bottleneck,
//! not a simulated engine's prefill. It stands in for nothing in the product.
//!
//! Each prompt is new to the filter (a per-request number leads the user message), so every
//! request renders and tokenizes in full: the cold path. Order: baseline, kvroute, baseline
//! again; the two baseline runs give the noise floor.
//!
//! Run: `target/release/kvroute-proxybench [--model qwen3] [--seconds 10]` (after `./dev build`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::routing::{get, post};
use clap::Parser;
use kvroute_stack::envoy::Envoy;
use kvroute_stack::paths;
use kvroute_stack::stack::{write_config, BundleFrom, Pool, StackPorts};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Requests per second through Envoy with and without the kvroute filter")]
struct Args {
    /// `demo` (built-in bundle) or `qwen3` (from `./dev setup`, given inline to the filter).
    #[arg(long, default_value = "qwen3")]
    model: String,
    /// Seconds of load per measurement (after 2 s of warm-up).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Envoy worker threads.
    #[arg(long, default_value_t = 2)]
    envoy_threads: u32,
    /// Request path. Another path than `/v1/chat/completions` (served by the fixture too) prices
    /// the filter on requests it passes through without a decision.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Which prompt sizes to run: `short`, `8k` (repeatable; default both).
    #[arg(long = "prompt")]
    prompts: Vec<String>,
}

const RESPONSE: &str = r#"{"id":"cmpl-bench","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}"#;

/// Two loopback upstreams answering at once (after reading the request body).
async fn upstreams() -> anyhow::Result<Vec<String>> {
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let app = axum::Router::new().route("/health", get(|| async { "ok" })).route(
            "/{*path}",
            // Reads the whole body first, as an engine does (an answer before the body is
            // read makes the server close the connection under Envoy's feet).
            post(|body: axum::body::Bytes| async move {
                let _ = body.len();
                ([("content-type", "application/json")], RESPONSE)
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?.to_string());
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    Ok(addrs)
}

/// The filter's configuration: one pool of `addrs`, its bundle inline (no updater here).
fn filter_config(model: &str, addrs: &[String]) -> anyhow::Result<(String, Value)> {
    let pool = match model {
        "qwen3" => Pool::qwen3(addrs.len()),
        "demo" => Pool::demo(addrs.len()),
        other => anyhow::bail!("unknown --model {other} (demo or qwen3)"),
    };
    let pool = Pool { bundle: BundleFrom::Inline, ..pool };
    Ok((pool.model.clone(), json!({"models": [pool.filter_model(addrs)?]})))
}

/// The body of request `n`: a user message led by `n`, so no two prompts share a prefix past
/// the template's first tokens.
fn body(model: &str, words: &str, n: u64) -> String {
    json!({"model": model, "max_tokens": 1,
           "messages": [{"role": "user", "content": format!("{n} {words}")}]})
    .to_string()
}

/// Requests per second over `seconds` after a warm-up, all answers checked.
async fn measure(url: &str, model: &str, words: &str, a: &Args) -> anyhow::Result<f64> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(a.concurrency).build()?;
    let counter = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(0));
    let run = |until: Instant, count: bool| {
        let mut tasks = Vec::new();
        for _ in 0..a.concurrency {
            let (http, url, counter, failures, seq) =
                (http.clone(), url.to_owned(), counter.clone(), failures.clone(), seq.clone());
            let (model, words) = (model.to_owned(), words.to_owned());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    let n = seq.fetch_add(1, Ordering::Relaxed);
                    let r = http
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body(&model, &words, n))
                        .send()
                        .await;
                    let ok = match r {
                        Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                        Ok(r) => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            eprintln!("{status}: {}", text.chars().take(200).collect::<String>());
                            false
                        }
                        Err(e) => {
                            eprintln!("{e}");
                            false
                        }
                    };
                    if count {
                        if ok { &counter } else { &failures }.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tasks
    };
    for t in run(Instant::now() + Duration::from_secs(2), false) {
        t.await?;
    }
    let started = Instant::now();
    for t in run(started + Duration::from_secs(a.seconds), true) {
        t.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let bad = failures.load(Ordering::Relaxed);
    anyhow::ensure!(bad == 0, "{bad} requests failed");
    Ok(counter.load(Ordering::Relaxed) as f64 / secs)
}

async fn envoy(template: &str, addrs: &[String], cfg: &Value, a: &Args) -> anyhow::Result<Envoy> {
    let dir = paths::scratch_dir(&format!("proxybench-{}", template.trim_end_matches(".yaml")))?;
    let ports = StackPorts {
        admin: paths::free_port()?,
        listen: paths::free_port()?,
        updater: paths::free_port()?,
    };
    let path = write_config(template, &dir, ports, addrs, cfg)?;
    let envoy = Envoy::start(&path, ports.admin, ports.listen, &dir, a.envoy_threads).await?;
    envoy.wait_healthy(addrs.len()).await?;
    Ok(envoy)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let addrs = upstreams().await?;
    let (model, cfg) = filter_config(&a.model, &addrs)?;
    let short = "Summarize the plot of a short story about a lighthouse keeper.".to_string();
    let long = kvroute_testkit::textgen::words(0x8_0000, 6_400);
    println!(
        "kvroute-proxybench: model {}, {} Envoy threads, {} connections, {} s per run",
        a.model, a.envoy_threads, a.concurrency, a.seconds
    );
    println!(
        "{:<10} {:>14} {:>14} {:>14} {:>8} {:>12}",
        "prompt", "baseline rps", "kvroute rps", "baseline2 rps", "ratio", "noise floor"
    );
    for (name, words) in [("short", &short), ("8k", &long)] {
        if !a.prompts.is_empty() && !a.prompts.iter().any(|p| p == name) {
            continue;
        }
        let mut rps = Vec::new();
        for template in ["buffer-only.yaml", "kvroute.yaml", "buffer-only.yaml"] {
            let mut e = envoy(template, &addrs, &cfg, &a).await?;
            let url = format!("{}{}", e.base_url(), a.path);
            let r = measure(&url, &model, words, &a).await;
            e.guard.kill().await;
            rps.push(r.with_context(|| format!("{template}, {name} prompts"))?);
        }
        let base = (rps[0] + rps[2]) / 2.0;
        let floor = (rps[0] - rps[2]).abs() / base;
        println!(
            "{:<10} {:>14.0} {:>14.0} {:>14.0} {:>7.2}x {:>11.1}%",
            name,
            rps[0],
            rps[1],
            rps[2],
            rps[1] / base,
            floor * 100.0
        );
    }
    Ok(())
}

kvroute_stack::help_test!(Args);
