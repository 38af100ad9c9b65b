//! kvroute-overload: does admission keep its word under overload? Slowed simulated workers
//! behind Envoy with the filter (and the updater), two priority classes, open-loop arrivals
//! above the pool's capacity for a while, then light traffic. Per class and phase: requests
//! sent, admitted, shed (429), how many admitted ones met their promise (`interactive`: the
//! TTFT deadline sent in its header; `batch`: its class's `max_wait_ms`, the wait being the
//! TTFT minus what the same prompt takes on an idle worker), TTFT p50/p99, and the error of
//! the filter's TTFT estimate (`predicted_ttft_ms` of the decision header) against the TTFT
//! the client saw.
//!
//! Before the overload, `--warmup` requests go one at a time to the idle pool: they give the
//! idle TTFT and let the calibration learn the workers' speed, as on a pool that ran normally
//! before it was overloaded. After the overload, interactive requests carry a deadline an idle worker meets (a factor
//! above the idle TTFT): the report says whether they are admitted again, and how soon.
//!
//! Every prompt is new (a per-request number leads it), so no request is a cache hit: the
//! estimate is queueing plus a full prefill. The filter is told nothing about the workers'
//! speed: its cost profile is the configured one, and online calibration learns the rest.
//!
//! Run: `target/release/kvroute-overload [--seconds 40] [--rate 6] [--engine-priority] [--replicas 2]`
//! (after `./dev build`).

#[path = "overload/plan.rs"]
mod plan;
#[path = "overload/report.rs"]
mod report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kvroute_stack::client;
use kvroute_stack::envoy::Envoy;
use kvroute_stack::replicas::{ReplicaOptions, Replicas};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use serde_json::json;

use plan::Arrival;
use report::Outcome;

#[derive(Parser, Debug, Clone)]
#[command(about = "Admission under overload: per class, admitted, shed, promises kept, TTFT")]
pub(crate) struct Args {
    /// Simulated workers in the pool.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// The workers' prefill time per token (ms): slowed so that the pool saturates.
    #[arg(long, default_value_t = 0.33)]
    prefill_ms_per_token: f64,
    /// Tokens per prompt (about: the demo tokenizer decides).
    #[arg(long, default_value_t = 2000)]
    prompt_tokens: usize,
    /// Arrivals per second during the overload (Poisson).
    #[arg(long, default_value_t = 6.0)]
    rate: f64,
    /// Seconds of overload.
    #[arg(long, default_value_t = 40)]
    seconds: u64,
    /// Arrivals per second after the overload.
    #[arg(long, default_value_t = 1.0)]
    after_rate: f64,
    /// Seconds of light traffic after the overload.
    #[arg(long, default_value_t = 20)]
    after_seconds: u64,
    /// Share of interactive requests (the rest are batch).
    #[arg(long, default_value_t = 0.5)]
    interactive_share: f64,
    /// The TTFT deadline interactive requests send during the overload (ms).
    #[arg(long, default_value_t = 3000)]
    deadline_ms: u64,
    /// The batch class's `max_wait_ms`.
    #[arg(long, default_value_t = 5000.0)]
    batch_max_wait_ms: f64,
    /// After the overload, interactive deadlines are this factor × the idle TTFT.
    #[arg(long, default_value_t = 1.5)]
    after_deadline_factor: f64,
    /// Pass the class to the workers (`engine_priority` 0 / 10, workers scheduling by
    /// priority as vLLM's `--scheduling-policy priority`).
    #[arg(long)]
    engine_priority: bool,
    /// Requests sent one at a time before the overload (at least 5): the idle TTFT, and what
    /// the calibration learns on a pool that ran normally before it was overloaded.
    #[arg(long, default_value_t = 30)]
    warmup: usize,
    /// Seed of the arrivals and the class draws.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Also write one CSV row per request here (when sent, class, answer, TTFT, the filter's
    /// estimates, the worker, promise kept).
    #[arg(long)]
    requests_csv: Option<std::path::PathBuf>,
    /// Envoy replicas (1 or 2) sharing the workers and the updater: the arrivals alternate
    /// between them, so each one learns of the other's load and arrivals only through the
    /// updater. The calibration gauges are printed for each replica.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    replicas: u8,
}

fn options(a: &Args) -> StackOptions {
    let mut sim_args =
        vec!["--prefill-ms-per-token".to_string(), a.prefill_ms_per_token.to_string()];
    let mut batch =
        json!({"name": "batch", "max_wait_ms": a.batch_max_wait_ms, "queue_weight": 2.0});
    let mut interactive = json!({"name": "interactive"});
    if a.engine_priority {
        sim_args.extend(["--scheduling-policy".to_string(), "priority".to_string()]);
        interactive["engine_priority"] = json!(0);
        batch["engine_priority"] = json!(10);
    }
    StackOptions {
        workers: a.workers,
        updater: true,
        sim_args,
        filter: json!({"admission": {"classes": [interactive, batch]}}),
        ..Default::default()
    }
}

/// The stack, and the second replica when there are two.
async fn start(a: &Args) -> anyhow::Result<(Stack, Option<Envoy>)> {
    let o = options(a);
    if a.replicas < 2 {
        return Ok((Stack::start(o).await?, None));
    }
    let r = Replicas::start(ReplicaOptions {
        workers: o.workers,
        events: true,
        sim_args: o.sim_args,
        filter: o.filter,
        ..Default::default()
    })
    .await?;
    r.wait_aligned().await?;
    let Replicas { stack, b } = r;
    Ok((stack, Some(b)))
}

/// A short streamed chat request: `text` led by `tag`, so that no two requests share a prefix.
fn chat_body(tag: &str, text: &str) -> serde_json::Value {
    json!({"model": MODEL, "max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": format!("{tag} {text}")}]})
}

/// Sends one request as `arrival` says, at its time.
async fn fire(
    http: reqwest::Client,
    url: Arc<str>,
    start: Instant,
    arrival: Arrival,
    text: Arc<str>,
) -> Outcome {
    tokio::time::sleep_until((start + arrival.at).into()).await;
    let body = chat_body(&arrival.id.to_string(), &text);
    let deadline = arrival.deadline_ms.map(|d| d.to_string());
    let mut headers = vec![("x-request-priority", arrival.class.name())];
    if let Some(d) = &deadline {
        headers.push(("x-ttft-deadline-ms", d.as_str()));
    }
    let sent = start.elapsed();
    let reply =
        client::send(&http, &url, "/v1/chat/completions", body.to_string().into_bytes(), &headers)
            .await;
    Outcome::of(arrival, sent, reply)
}

/// TTFT of the prompt on an idle pool (ms): the median of `n` requests (at least 5) sent one
/// at a time, each led by `tag` and its number (a replica's own tag: another replica's
/// prompts are cache hits, which would teach its calibration nothing of a prefill).
async fn idle_ttft(
    http: &reqwest::Client,
    url: &str,
    tag: &str,
    text: &str,
    n: usize,
) -> anyhow::Result<f64> {
    let mut t = Vec::new();
    for i in 0..n.max(5) {
        let body = chat_body(&format!("{tag}-{i}"), text);
        let r = client::chat(http, url, &body).await?;
        anyhow::ensure!(r.status == 200, "idle request answered {}: {}", r.status, r.body);
        t.push(r.ttft.as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(a.rate > 0.0 && a.after_rate >= 0.0, "rates must be positive");
    anyhow::ensure!((0.0..=1.0).contains(&a.interactive_share), "a share is within 0..1");
    let text = plan::prompt_text(a.prompt_tokens)?;
    let (stack, b) = start(&a).await?;
    let mut urls: Vec<Arc<str>> = vec![stack.base_url().into()];
    urls.extend(b.as_ref().map(|b| b.base_url().into()));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
    // Every replica's calibration learns the idle pool; the first one's median is the idle TTFT.
    let idle = idle_ttft(&http, &urls[0], "idle", &text, a.warmup).await?;
    for (i, url) in urls.iter().enumerate().skip(1) {
        idle_ttft(&http, url, &format!("idle{i}"), &text, a.warmup).await?;
    }
    let after_deadline = (idle * a.after_deadline_factor).ceil() as u64;
    let arrivals = plan::arrivals(&a, after_deadline);
    println!(
        "kvroute-overload: {} workers at {} ms/token, ~{} tokens per prompt, idle TTFT {idle:.0} ms; \
         {} s at {}/s then {} s at {}/s, {} requests, {:.0} % interactive{}{}",
        a.workers,
        a.prefill_ms_per_token,
        a.prompt_tokens,
        a.seconds,
        a.rate,
        a.after_seconds,
        a.after_rate,
        arrivals.len(),
        a.interactive_share * 100.0,
        if a.engine_priority { ", engine priority" } else { "" },
        if urls.len() > 1 { ", 2 Envoy replicas" } else { "" }
    );
    println!(
        "promises: interactive deadline {} ms (after the overload {after_deadline} ms), batch max_wait {} ms",
        a.deadline_ms, a.batch_max_wait_ms
    );
    let text: Arc<str> = text.into();
    let envoys: Vec<&Envoy> = std::iter::once(&stack.envoy).chain(b.as_ref()).collect();
    let before = calibrations(&envoys).await;
    let start = Instant::now();
    let tasks: Vec<_> = arrivals
        .into_iter()
        .map(|arr| {
            let url = urls[arr.id % urls.len()].clone();
            tokio::spawn(fire(http.clone(), url, start, arr, text.clone()))
        })
        .collect();
    let overload_end = Duration::from_secs(a.seconds);
    tokio::time::sleep_until((start + overload_end).into()).await;
    let at_end = calibrations(&envoys).await;
    let mut outcomes = Vec::with_capacity(tasks.len());
    for t in tasks {
        outcomes.push(t.await?);
    }
    let after = calibrations(&envoys).await;
    drop(envoys);
    drop(b);
    drop(stack);
    report::print(&outcomes, (idle, a.batch_max_wait_ms), overload_end, urls.len());
    if let Some(path) = &a.requests_csv {
        std::fs::write(path, report::csv(&outcomes, idle, a.batch_max_wait_ms))?;
    }
    for (i, before) in before.iter().enumerate() {
        let whose = if after.len() > 1 { format!("replica {}'s", i + 1) } else { "Envoy's".into() };
        println!(
            "\ncalibration ({whose} gauges){:>w$} {:>16} {:>16}",
            "after idle",
            "overload end",
            "the end",
            w = 50 - whose.len() - 21
        );
        for (name, idle_v) in before {
            let at = |m: &[Vec<(String, f64)>]| {
                let v = m.get(i).and_then(|m| m.iter().find(|(k, _)| k == name));
                v.map_or("-".into(), |(_, v)| format!("{v:.0}"))
            };
            println!("{name:<32} {idle_v:>16.0} {:>16} {:>16}", at(&at_end), at(&after));
        }
    }
    Ok(())
}

/// [`calibration`] of each Envoy.
async fn calibrations(envoys: &[&Envoy]) -> Vec<Vec<(String, f64)>> {
    let mut out = Vec::with_capacity(envoys.len());
    for e in envoys {
        out.push(calibration(e).await);
    }
    out
}

/// The calibration's gauges of the model (coefficients, samples, each worker's deviation),
/// short names; empty when Envoy's stats cannot be read.
async fn calibration(envoy: &Envoy) -> Vec<(String, f64)> {
    let Ok(m) = envoy.prometheus().await else { return Vec::new() };
    let mut out: Vec<(String, f64)> = m
        .into_iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix("kvroute_calibration_")?;
            let keep = [
                "base_us",
                "per_token",
                "per_token2",
                "interference_us",
                "_samples",
                "permille",
                "fill_us",
            ];
            let model_gauge =
                !rest.starts_with("estimate") && keep.iter().any(|s| rest.ends_with(s));
            model_gauge.then(|| (rest.to_owned(), v))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

kvroute_stack::help_test!(Args);

#[cfg(test)]
mod tests {
    use super::*;
    use plan::{Class, Phase};

    fn args(extra: &[&str]) -> Args {
        Args::parse_from(["kvroute-overload"].iter().chain(extra))
    }

    #[test]
    fn arrivals_follow_the_phases_rates_and_shares() {
        let a = args(&[
            "--seconds",
            "200",
            "--rate",
            "5",
            "--after-seconds",
            "400",
            "--after-rate",
            "0.5",
        ]);
        let all = plan::arrivals(&a, 1234);
        assert_eq!(all, plan::arrivals(&a, 1234), "seeded: the same arrivals every run");
        let over: Vec<_> = all.iter().filter(|x| x.phase == Phase::Overload).collect();
        let after: Vec<_> = all.iter().filter(|x| x.phase == Phase::After).collect();
        // Poisson counts: 1000 ± 5 σ and 200 ± 5 σ.
        assert!((840..=1160).contains(&over.len()), "{}", over.len());
        assert!((130..=270).contains(&after.len()), "{}", after.len());
        assert!(all.windows(2).all(|w| w[0].at <= w[1].at && w[1].id == w[0].id + 1));
        assert!(over.iter().all(|x| x.at < Duration::from_secs(200)));
        assert!(after
            .iter()
            .all(|x| x.at >= Duration::from_secs(200) && x.at < Duration::from_secs(600)));
        let interactive = all.iter().filter(|x| x.class == Class::Interactive).count();
        assert!((480..=720).contains(&interactive), "{interactive} of {}", all.len());
        for x in &all {
            let want = match (x.class, x.phase) {
                (Class::Batch, _) => None,
                (Class::Interactive, Phase::Overload) => Some(3000),
                (Class::Interactive, Phase::After) => Some(1234),
            };
            assert_eq!(x.deadline_ms, want, "{x:?}");
        }
        let none = plan::arrivals(&args(&["--after-rate", "0", "--interactive-share", "0"]), 1);
        assert!(none.iter().all(|x| x.phase == Phase::Overload && x.class == Class::Batch));
    }

    #[test]
    fn engine_priority_reaches_the_classes_and_the_workers() {
        let plain = options(&args(&[]));
        assert!(!plain.sim_args.contains(&"--scheduling-policy".to_string()));
        assert!(plain.filter["admission"]["classes"][0].get("engine_priority").is_none());
        let o = options(&args(&["--engine-priority", "--batch-max-wait-ms", "900"]));
        assert!(o.sim_args.windows(2).any(|w| w == ["--scheduling-policy", "priority"]));
        let classes = &o.filter["admission"]["classes"];
        assert_eq!(classes[0]["name"], "interactive");
        assert_eq!(classes[0]["engine_priority"], 0);
        assert_eq!(classes[1]["engine_priority"], 10);
        assert_eq!(classes[1]["max_wait_ms"], 900.0);
        // The filter accepts what the bench configures.
        let cfg = json!({"models": [{"name": MODEL, "workers": ["127.0.0.1:1"]}],
            "admission": o.filter["admission"]});
        kvroute_core::decision::config::FilterConfig::from_json(cfg.to_string().as_bytes())
            .expect("a valid filter configuration");
    }
}
