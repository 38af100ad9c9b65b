//! Long polls and peer reports over real HTTP: `GET /v1/snapshot?since=V&wait_ms=W` answers as
//! soon as a newer version exists (a peer report, a worker's knowledge) and 304 after W; peer
//! reports (`POST /v1/peers`) are published at once, with the token only, and a replica gets
//! every replica's decisions but its own.

use crate::common;

use std::sync::Arc;

use common::*;
use kvroute_core::wire::delta::Delta;
use kvroute_core::wire::peers::{PeerCredit, PeerLoad, PeerReport};
use kvroute_core::wire::snapshot::Snapshot;
use kvroute_updater::limits::Limits;
use kvroute_updater::state::State;

struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    async fn poll(&self, query: &str) -> (u16, Vec<u8>) {
        let url = format!("{}/v1/snapshot?{query}", self.base);
        let r = self.http.get(url).header("x-kvroute-token", TOKEN).send().await.unwrap();
        (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
    }

    async fn report(&self, token: &str, body: Vec<u8>) -> u16 {
        let url = format!("{}/v1/peers", self.base);
        let r = self.http.post(url).header("x-kvroute-token", token).body(body);
        r.send().await.unwrap().status().as_u16()
    }
}

fn report(replica: u64, seq: u64, hashes: &[u64]) -> PeerReport {
    PeerReport {
        replica,
        seq,
        loads: vec![PeerLoad {
            replica,
            worker_key: 5,
            at_ms: 0,
            inflight: 1,
            prefilling: 1,
            prefill_tokens: 300,
            arriving_tokens_per_s: 1500,
        }],
        credits: vec![PeerCredit {
            replica,
            worker: "w".into(),
            at_ms: 0,
            hashes: hashes.to_vec(),
        }],
    }
}

async fn setup() -> (Arc<State>, Client, Task, u64) {
    let state = Arc::new(State::with_limits(domain(), ["w".to_string()], Limits::default()));
    let (port, server) = serve(Arc::clone(&state)).await;
    let c = Client { base: format!("http://127.0.0.1:{port}"), http: reqwest::Client::new() };
    let (status, body) = c.poll("peers=1&replica=9").await;
    assert_eq!(status, 200);
    let full = Snapshot::decode(&body).unwrap();
    assert!(full.peers.is_some_and(|p| p.is_empty()), "asked for peers: format 4");
    (state, c, server, full.version)
}

#[tokio::test]
async fn a_long_poll_answers_on_a_peer_report_without_the_callers_own() {
    let (_state, c, _server, v) = setup().await;
    let waiting = {
        let (http, base) = (c.http.clone(), c.base.clone());
        tokio::spawn(async move {
            let c = Client { base, http };
            let (status, body) =
                c.poll(&format!("since={v}&wait_ms=20000&peers=1&replica=9")).await;
            assert_eq!(status, 200, "answered with the report, not after the wait");
            let d = Delta::decode(&body).unwrap();
            let p = d.peers.unwrap();
            assert_eq!((p.credits.len(), p.loads.len()), (1, 1));
            assert_eq!(p.credits[0].hashes, [1, 2]);
            assert_eq!(p.credits[0].replica, 7);
            assert!(p.credits[0].at_ms > 0, "stamped by the updater");
            assert_eq!(p.loads[0].arriving_tokens_per_s, 0, "arrivals only to who asks");
        })
    };
    assert_eq!(c.report("wrong-token-000000", report(7, 1, &[1, 2]).encode()).await, 401);
    assert_eq!(c.report(TOKEN, b"KVRP\x01garbage".to_vec()).await, 400);
    assert_eq!(c.report(TOKEN, report(7, 1, &[1, 2]).encode()).await, 204);
    waiting.await.unwrap();
    // Replica 7 is not sent its own decisions; a caller without peers=1 gets format 2.
    let (_, body) = c.poll(&format!("since={v}&peers=1&replica=7")).await;
    assert!(Delta::decode(&body).unwrap().peers.unwrap().is_empty());
    let (_, body) = c.poll(&format!("since={v}")).await;
    assert_eq!(body[4], kvroute_core::wire::delta::DELTA_FORMAT);
    assert!(Delta::decode(&body).unwrap().peers.is_none());
    // A full snapshot carries the live peer view.
    let (_, body) = c.poll("peers=1&replica=9").await;
    let full = Snapshot::decode(&body).unwrap();
    assert_eq!(full.peers.unwrap().credits.len(), 1);
    // A caller that reads arrivals gets the replica's, from a delta or a snapshot.
    let (_, body) = c.poll(&format!("since={v}&peers=1&arrivals=1&replica=9")).await;
    assert_eq!(Delta::decode(&body).unwrap().peers.unwrap().loads[0].arriving_tokens_per_s, 1500);
    let (_, body) = c.poll("peers=1&arrivals=1&replica=9").await;
    let full = Snapshot::decode(&body).unwrap();
    assert_eq!(full.peers.unwrap().loads[0].arriving_tokens_per_s, 1500);
    // A report in the format before arrivals is still taken in.
    assert_eq!(c.report(TOKEN, report(7, 2, &[3]).encode_with(false)).await, 204);
    let (_, body) = c.poll("peers=1&arrivals=1&replica=9").await;
    let full = Snapshot::decode(&body).unwrap();
    let p = full.peers.unwrap();
    assert_eq!((p.credits.len(), p.loads[0].arriving_tokens_per_s), (2, 0));
}

#[tokio::test]
async fn a_long_poll_answers_on_a_knowledge_change_and_304_after_its_wait() {
    let (state, c, _server, v) = setup().await;
    let (status, body) = c.poll(&format!("since={v}&wait_ms=50")).await;
    assert_eq!((status, body.len()), (304, 0), "nothing new within the wait");
    let waiting = {
        let (http, base) = (c.http.clone(), c.base.clone());
        tokio::spawn(async move {
            let c = Client { base, http };
            let (status, _) = c.poll(&format!("since={v}&wait_ms=20000")).await;
            assert_eq!(status, 200);
        })
    };
    // Any knowledge change (here a worker's reported load) wakes the waiting poll (or, had
    // it not arrived yet, is already there when it does).
    state.update("w", |e| {
        e.load = Some(kvroute_updater::engine_metrics::EngineLoad {
            running: Some(1.0),
            waiting: Some(0.0),
            kv_usage: None,
            observed_at_ms: 1,
        })
    });
    waiting.await.unwrap();
}
