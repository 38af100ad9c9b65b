//! The load: `concurrency` connections sending chat requests back to back, each prompt new (a
//! per-request number leads the user message, so no two share a prefix past the template's
//! first tokens), 2 s of warm-up, then the counted window. Every answer in the window must be a
//! success.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

/// The body of request `n`.
pub fn body(model: &str, words: &str, n: u64) -> String {
    json!({"model": model, "max_tokens": 1,
           "messages": [{"role": "user", "content": format!("{n} {words}")}]})
    .to_string()
}

/// What to send, how hard and how long.
pub struct LoadSpec<'a> {
    pub url: &'a str,
    pub model: &'a str,
    pub words: &'a str,
    pub concurrency: usize,
    pub seconds: u64,
}

/// A counted window: requests answered, its length, and what `probe` (e.g. the router's CPU
/// seconds) read right before and right after it.
pub struct LoadWindow<P> {
    pub requests: u64,
    pub secs: f64,
    pub before: P,
    pub after: P,
}

/// Waits (up to 60 s) for one request to succeed (a router may register its workers after it
/// listens), then warm-up, then the counted window, `probe` read right before and right after
/// it.
pub async fn measure<P>(l: &LoadSpec<'_>, probe: impl Fn() -> P) -> anyhow::Result<LoadWindow<P>> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(l.concurrency).build()?;
    kvroute_stack::eventually_every(
        "a first answer",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let req = http.post(l.url).header("content-type", "application/json").body(body(
                l.model,
                l.words,
                u64::MAX,
            ));
            async move { req.send().await.ok().filter(|r| r.status().is_success()).map(|_| ()) }
        },
    )
    .await?;
    let counter = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(0));
    let run = |until: Instant, count: bool| {
        let mut tasks = Vec::new();
        for _ in 0..l.concurrency {
            let (http, url, counter, failures, seq) =
                (http.clone(), l.url.to_owned(), counter.clone(), failures.clone(), seq.clone());
            let (model, words) = (l.model.to_owned(), l.words.to_owned());
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
                            if count {
                                eprintln!(
                                    "{status}: {}",
                                    text.chars().take(200).collect::<String>()
                                );
                            }
                            false
                        }
                        Err(e) => {
                            if count {
                                eprintln!("{e}");
                            }
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
    let before = probe();
    let started = Instant::now();
    for t in run(started + Duration::from_secs(l.seconds), true) {
        t.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let after = probe();
    let bad = failures.load(Ordering::Relaxed);
    anyhow::ensure!(bad == 0, "{bad} requests failed");
    Ok(LoadWindow { requests: counter.load(Ordering::Relaxed), secs, before, after })
}
