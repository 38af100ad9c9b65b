//! The oracle policy on real Envoy and simulated workers: the harness asks every worker's
//! `/sim/what_if` and the bench-only Envoy sends the request exactly to the best one.

use std::time::Duration;

use kvroute_eval::cluster::{Cluster, Policy};
use kvroute_eval::record::Slo;
use kvroute_eval::schedule::{completions_body, Scheduled, COMPLETIONS};
use kvroute_eval::send::{send, SendCtx};
use kvroute_eval::topology::Topology;
use kvroute_eval::whatif;
use serde_json::{json, Value};

fn topo(workers: usize) -> Topology {
    let mut t = Topology::default();
    t.workers.count = workers;
    t
}

fn ctx(cluster: &Cluster) -> SendCtx {
    SendCtx {
        policy: Policy::Oracle,
        workers: cluster.addrs(),
        whatif_sample: 0.0,
        speedup: 1.0,
        slo: Slo { ttft_ms: f64::INFINITY, mean_gap_ms: f64::INFINITY, stall_ms: f64::INFINITY },
        timeout: Duration::from_secs(60),
    }
}

fn scheduled(body: Value, output_tokens: u64) -> Scheduled {
    Scheduled { at: Duration::ZERO, endpoint: COMPLETIONS, body, output_tokens, cohorts: vec![] }
}

/// `len` token ids starting at `from` (inside the demo model's vocabulary).
fn ids(from: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 10 + (from + i * 7) % 1600).collect()
}

/// A completion straight to a worker (around Envoy), waited for.
async fn direct(http: &reqwest::Client, worker: &str, prompt: &[u32], max_tokens: u64) {
    let body =
        json!({"model": kvroute_stack::stack::MODEL, "prompt": prompt, "max_tokens": max_tokens});
    let r = http.post(format!("http://{worker}{COMPLETIONS}")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

#[tokio::test]
async fn the_oracle_sends_every_request_to_the_worker_whose_what_if_was_best() {
    let cluster = Cluster::start(&topo(3), Policy::Oracle, &[]).await.unwrap();
    let url = cluster.urls()[0].clone();
    let ctx = ctx(&cluster);
    let http = reqwest::Client::new();
    let model = kvroute_stack::stack::MODEL;
    // Worker 0 busy with long prefills in flight (about a second of work), so the best worker
    // is not always the first.
    let load: Vec<_> = (0..4u32)
        .map(|i| {
            // Long outputs keep worker 0 loaded for the whole test.
            let busy = completions_body(model, &ids(1 + i * 13, 8000), 2000);
            let (http, busy_worker) = (http.clone(), ctx.workers[0].clone());
            tokio::spawn(async move {
                let r = http.post(format!("http://{busy_worker}{COMPLETIONS}")).json(&busy).send();
                if let Ok(r) = r.await {
                    let _ = r.bytes().await;
                }
            })
        })
        .collect();
    kvroute_stack::eventually("worker 0 busy", Duration::from_secs(10), || async {
        let q = kvroute_eval::runner::scrape_queue(&http, &ctx.workers[0]).await?;
        (q.0 + q.1 >= 4).then_some(())
    })
    .await
    .unwrap();
    let mut chosen = std::collections::BTreeSet::new();
    // Two requests, the second sent only once the first is running on an idle worker (its
    // long output keeps it there): the second's what-if sees that load, whatever the host's
    // speed, so each idle worker is best once.
    let mut sends = Vec::new();
    for i in 0..2u32 {
        // 1 500 output tokens (seconds of decoding): the first is still running when the second's
        // what-if is asked, however slow the host is.
        let s = scheduled(completions_body(model, &ids(100 + i * 50, 3000), 1500), 1500);
        let (http2, url, ctx2) = (http.clone(), url.clone(), ctx.clone());
        sends.push(tokio::spawn(async move { send(&http2, &url, i as usize, &s, &ctx2).await }));
        kvroute_stack::eventually(
            "the request running on an idle worker",
            Duration::from_secs(10),
            || async {
                let mut running = 0;
                for w in &ctx.workers[1..] {
                    running += kvroute_eval::runner::scrape_queue(&http, w).await?.0;
                }
                (running > i).then_some(())
            },
        )
        .await
        .unwrap();
    }
    let sends = futures::future::join_all(sends).await.into_iter().map(|r| r.unwrap());
    for rec in sends {
        assert!(rec.ok(), "{:?}", rec.error);
        assert_eq!(rec.whatif_ms.len(), 3, "every worker asked");
        assert!(
            rec.whatif_ms.iter().all(Option::is_some),
            "every sim answers: {:?}",
            rec.whatif_ms
        );
        let best = whatif::best(&rec.whatif_ms).unwrap();
        assert_eq!(rec.worker.as_deref(), Some(ctx.workers[best].as_str()), "{:?}", rec.whatif_ms);
        assert_eq!(whatif::regret(&rec.whatif_ms, best), Some(0.0));
        chosen.insert(best);
    }
    assert!(!chosen.contains(&0), "the busy worker was never best: {chosen:?}");
    assert_eq!(chosen.len(), 2, "both idle workers were best at some point: {chosen:?}");
    load.iter().for_each(|l| l.abort());
}

#[tokio::test]
async fn with_every_worker_idle_the_oracle_picks_the_one_holding_the_prefix() {
    let cluster = Cluster::start(&topo(3), Policy::Oracle, &[]).await.unwrap();
    let url = cluster.urls()[0].clone();
    let ctx = ctx(&cluster);
    let http = reqwest::Client::new();
    let prefix = ids(3, 4096);
    // The last worker (not the one ties go to) holds the prefix.
    direct(&http, &ctx.workers[2], &prefix, 1).await;
    let mut prompt = prefix.clone();
    prompt.extend(ids(2000, 24));
    let s = scheduled(completions_body(kvroute_stack::stack::MODEL, &prompt, 4), 4);
    let rec = send(&http, &url, 0, &s, &ctx).await;
    assert!(rec.ok(), "{:?}", rec.error);
    assert_eq!(rec.worker.as_deref(), Some(ctx.workers[2].as_str()), "{:?}", rec.whatif_ms);
    assert!(
        rec.cached_tokens.is_some_and(|c| c >= 4080),
        "reused the prefix: {:?}",
        rec.cached_tokens
    );
    let w = &rec.whatif_ms;
    let (holder, other) = (w[2].unwrap(), w[0].unwrap().min(w[1].unwrap()));
    assert!(holder < other / 4.0, "reuse is far faster: {w:?}");
    // The what-if was the TTFT the request got (a deterministic simulation; loopback latency,
    // scheduling noise and a step boundary aside).
    let ttft = rec.ttft_ms.unwrap();
    assert!((ttft - holder).abs() < holder.max(20.0) + 50.0, "TTFT {ttft} vs what-if {holder}");
}

#[tokio::test]
async fn without_simulated_workers_the_oracle_fails_the_request_clearly() {
    // Nothing listens on these: no what-if answers.
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ctx = SendCtx {
        workers: vec![format!("127.0.0.1:{}", port()), format!("127.0.0.1:{}", port())],
        ..ctx_without_cluster()
    };
    let s = scheduled(completions_body("m", &[1, 2, 3], 1), 1);
    let rec = send(&reqwest::Client::new(), "http://127.0.0.1:1", 0, &s, &ctx).await;
    assert!(!rec.ok());
    assert!(rec.error.as_deref().unwrap().contains("needs simulated workers"), "{:?}", rec.error);
    assert_eq!(rec.whatif_ms, [None, None]);
}

fn ctx_without_cluster() -> SendCtx {
    SendCtx {
        policy: Policy::Oracle,
        workers: vec![],
        whatif_sample: 0.0,
        speedup: 1.0,
        slo: Slo { ttft_ms: 1.0, mean_gap_ms: 1.0, stall_ms: 1.0 },
        timeout: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn other_policies_get_every_workers_what_if_for_sampled_requests_only() {
    let cluster = Cluster::start(&topo(2), Policy::LeastRequest, &[]).await.unwrap();
    let url = cluster.urls()[0].clone();
    let http = reqwest::Client::new();
    let model = kvroute_stack::stack::MODEL;
    for (share, answers) in [(1.0, 2), (0.0, 0)] {
        let ctx = SendCtx { policy: Policy::LeastRequest, whatif_sample: share, ..ctx(&cluster) };
        let s = scheduled(completions_body(model, &ids(5, 300), 4), 4);
        let rec = send(&http, &url, 3, &s, &ctx).await;
        assert!(rec.ok(), "{:?}", rec.error);
        assert_eq!(rec.whatif_ms.len(), answers, "share {share}: {:?}", rec.whatif_ms);
        if answers > 0 {
            assert!(rec.whatif_ms.iter().all(Option::is_some), "{:?}", rec.whatif_ms);
            let chosen = whatif::index_of(&ctx.workers, rec.worker.as_deref().unwrap()).unwrap();
            assert!(whatif::regret(&rec.whatif_ms, chosen).is_some_and(|r| r >= 0.0));
        }
    }
}
