//! The updater following a real simulated worker over real ZMQ: its canonical knowledge
//! predicts exactly what the worker reports as reused, survives dropped events (replay) and
//! publisher restarts (resync), and is served only with the token.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{sim_setup, SimSetup};
use kvroute_core::decision::hash::block_hashes;
use kvroute_core::decision::request::Prompt;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_core::wire::snapshot::Snapshot;
use kvroute_sim::events::{EventEncoding, ReplyShape};
use kvroute_sim::worker::Worker;
use kvroute_updater::decode::Tier;
use kvroute_updater::state::State;
use kvroute_updater::subscriber::follow;
use serde_json::{json, Value};

struct Setup {
    worker: Arc<Worker>,
    http: u16,
    state: Arc<State>,
    name: String,
    bundle: ModelBundle,
}

async fn setup(encoding: EventEncoding, shape: ReplyShape) -> Setup {
    let SimSetup { worker, http, state, name, ep, bundle } = sim_setup(encoding, shape, 1000).await;
    tokio::spawn(follow(Arc::clone(&state), ep));
    Setup { worker, http, state, name, bundle }
}

fn messages(conv: u64, turns: usize) -> Vec<Value> {
    let mut m =
        vec![json!({"role": "system", "content": kvroute_testkit::textgen::words(conv, 150)})];
    for t in 0..turns {
        m.push(json!({"role": "user", "content": kvroute_testkit::textgen::words(conv * 100 + t as u64, 20)}));
    }
    m
}

impl Setup {
    async fn send(&self, msgs: &[Value]) -> u64 {
        let body = json!({"model": "kvroute-demo", "messages": msgs, "max_tokens": 2});
        let r = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/chat/completions", self.http))
            .json(&body)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    }

    /// What the updater's knowledge predicts the worker will reuse for `msgs`.
    fn predicted(&self, msgs: &[Value]) -> u64 {
        let tokens = self.bundle.prompt_tokens(&Prompt::messages(msgs.to_vec())).unwrap();
        let hashes =
            block_hashes(self.state.domain_of(&self.name).unwrap().seed(None, None), 16, &tokens);
        let known: std::collections::HashSet<u64> =
            self.state.snapshot().workers[0].gpu.iter().copied().collect();
        let blocks = hashes.iter().take_while(|h| known.contains(h)).count();
        // The engine recomputes the last token: a fully known prompt reuses one block less.
        (blocks.min((tokens.len() - 1) / 16) * 16) as u64
    }

    async fn settle(&self, msgs: &[Value]) -> u64 {
        // Events arrive asynchronously; wait until the prompt's blocks are known.
        for _ in 0..100 {
            let p = self.predicted(msgs);
            if p > 0 {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        0
    }

    fn stat(&self, key: &str) -> u64 {
        self.state.status()["workers"][&self.name]["stats"][key].as_u64().unwrap_or(0)
    }
}

/// ZMQ subscriptions take a moment: send warm-up requests until the first events arrive.
async fn warm_up(s: &Setup) {
    for i in 0..50 {
        s.send(&messages(9000 + i, 1)).await;
        if s.stat("batches") > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the updater never received an event");
}

#[tokio::test]
async fn predictions_from_events_match_reported_reuse() {
    for enc in [EventEncoding::Array, EventEncoding::Map] {
        let s = setup(enc, ReplyShape::Triple).await;
        warm_up(&s).await;
        for conv in 0..5u64 {
            let first = messages(conv, 1);
            s.send(&first).await;
            s.settle(&first).await;
            let second = messages(conv, 2);
            let predicted = s.predicted(&second);
            let actual = s.send(&second).await;
            assert!(actual > 0);
            assert_eq!(predicted, actual, "encoding {enc:?}, conversation {conv}");
        }
        assert_eq!(s.stat("orphans"), 0);
    }
}

#[tokio::test]
async fn dropped_batches_are_replayed() {
    for shape in [ReplyShape::Pair, ReplyShape::Triple] {
        let s = setup(EventEncoding::Array, shape).await;
        warm_up(&s).await;
        let (_, log) = s.worker.current().await.unwrap();
        log.drop_remaining.store(2, std::sync::atomic::Ordering::SeqCst);
        let dropped = messages(50, 1);
        s.send(&dropped).await;
        s.send(&messages(51, 1)).await;
        // The next published batch reveals the gap; the replay fills it.
        s.send(&messages(52, 1)).await;
        assert!(s.settle(&dropped).await > 0, "blocks of dropped batches never arrived");
        assert!(s.stat("gaps") >= 1 && s.stat("replays") >= 1);
        assert_eq!(s.stat("resyncs"), 0);
    }
}

#[tokio::test]
async fn a_silent_stream_is_caught_up_from_replay() {
    let s = setup(EventEncoding::Array, ReplyShape::Triple).await;
    warm_up(&s).await;
    // From now on nothing reaches the subscriber (as if its subscription were lost), and no
    // later batch reveals the gap: only the silence probe can find these blocks.
    let (_, log) = s.worker.current().await.unwrap();
    log.drop_remaining.store(1_000, std::sync::atomic::Ordering::SeqCst);
    let unseen = messages(70, 1);
    s.send(&unseen).await;
    let mut found = 0;
    for _ in 0..200 {
        found = s.predicted(&unseen);
        if found > 0 && s.stat("resubscribes") >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(found > 0, "blocks published only to replay never arrived");
    assert!(s.stat("resubscribes") >= 1);
    assert_eq!(s.stat("resyncs"), 0, "catching up keeps what was known");
}

#[tokio::test]
async fn a_restarted_publisher_triggers_a_resync() {
    let s = setup(EventEncoding::Map, ReplyShape::Triple).await;
    warm_up(&s).await;
    let before = messages(60, 1);
    s.send(&before).await;
    assert!(s.settle(&before).await > 0);
    s.worker.crash().await;
    s.worker.start().await.unwrap();
    // New traffic after the restart: the updater notices the sequence went back and resyncs.
    let mut last = messages(100, 1);
    for i in 0..200 {
        last = messages(100 + i, 1);
        s.send(&last).await;
        if s.stat("resyncs") >= 1 && s.predicted(&last) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(s.stat("resyncs") >= 1, "no resync after the restart");
    assert_eq!(s.predicted(&before), 0, "knowledge from before the restart survived");
    assert!(s.settle(&last).await > 0);
}

#[tokio::test]
async fn snapshots_need_the_token() {
    let s = setup(EventEncoding::Array, ReplyShape::Triple).await;
    warm_up(&s).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = kvroute_updater::server::router(Arc::clone(&s.state), "0123456789abcdef");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("http://127.0.0.1:{port}/v1/snapshot");
    let http = reqwest::Client::new();
    assert_eq!(http.get(&url).send().await.unwrap().status(), 401);
    assert_eq!(
        http.get(&url).header("x-kvroute-token", "wrong").send().await.unwrap().status(),
        401
    );
    let r = http.get(&url).header("x-kvroute-token", "0123456789abcdef").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let snap = Snapshot::decode(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(snap.workers[0].worker, s.name);
    assert!(!snap.workers[0].gpu.is_empty());
    assert!(snap.workers[0].compatible);
    let status: Value = http
        .get(format!("http://127.0.0.1:{port}/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["workers"][&s.name]["connected"], true);
    let _ = Tier::Gpu;
}
