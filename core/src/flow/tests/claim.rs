//! Two threads of one Envoy deciding at the same instant: the claim orders them.

use serde_json::json;

use crate::decision::config::sync::LoadLimits;
use crate::decision::config::FilterConfig;
use crate::decision::load::LoadSource;
use crate::decision::request::{parse, Endpoint, ParsedRequest};
use crate::decision::router::{Decision, Router};
use crate::flow::claim::{claim, Claim, Ordered};
use crate::shared::epoch::Epoch;
use crate::shared::fake::{MemStore, Tally};
use crate::shared::load::{LoadView, Shard};

const W: [&str; 3] = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"];

fn router() -> Router {
    let cfg = json!({"models":[{"name":"m","workers":W}], "tie_band":{"abs_ms":0.0,"rel":0.0}});
    Router::new(&FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()).unwrap()
}

fn req(text: &str) -> ParsedRequest {
    let body = json!({"model":"m","messages":[{"role":"user","content":text}]});
    parse(Endpoint::Chat, body.to_string().as_bytes()).unwrap()
}

fn primary(d: &Decision) -> String {
    d.primary().unwrap().worker.as_str().to_owned()
}

/// Two threads read the epoch and their views before either claims, and decide `q` alike;
/// then `a` claims, then `b`. Returns both decisions and `b`'s ordering.
fn race(
    ordered: bool,
    r: &Router,
    q: &ParsedRequest,
) -> (Decision, Decision, Ordered, Vec<(String, usize)>) {
    let (store, t) = (MemStore::new(), Tally::default());
    // The key exists (the first advance of all is unordered).
    Epoch::read(&store).advance(&store);
    let mut a = Shard::register(&store, &t, LoadLimits::default(), 0, 1);
    let mut b = Shard::register(&store, &t, LoadLimits::default(), 0, 2);
    let (ea, eb) = (Epoch::read(&store), Epoch::read(&store));
    let (va, vb) = (LoadView::read(&store, &t, &a, 10), LoadView::read(&store, &t, &b, 10));
    let mut da = r.decide(q, 0, &va, 10, 0).unwrap();
    let mut db = r.decide(q, 0, &vb, 10, 0).unwrap();
    assert_eq!(primary(&da), primary(&db), "the same view: the same choice");
    let rerank = |d: &Decision, v: &LoadView| r.rerank(q, d, v, 10, 0);
    let on = |e| ordered.then_some(e);
    let (ca, oa) = claim(&store, &t, &mut a, on(ea), &mut da, 0, 10, rerank);
    assert_eq!(oa, Ordered::default(), "the first to claim raced nothing");
    let (cb, ob) = claim(&store, &t, &mut b, on(eb), &mut db, 0, 10, rerank);
    assert!(matches!((ca, cb), (Some(Claim { .. }), Some(Claim { .. }))));
    // What a third thread sees now: each worker's started requests.
    let c = Shard::register(&store, &t, LoadLimits::default(), 0, 3);
    let view = LoadView::read(&store, &t, &c, 10);
    let starts =
        W.iter().map(|w| (w.to_string(), view.started_within(&(*w).into(), 0, 10))).collect();
    (da, db, ob, starts)
}

#[test]
fn of_two_threads_deciding_at_once_the_second_ranks_again_and_goes_elsewhere() {
    let r = router();
    let q = req(&"a prompt no worker holds yet ".repeat(40));
    let (da, db, ob, starts) = race(true, &r, &q);
    assert_eq!(ob, Ordered { reranked: true, moved: true });
    assert_ne!(primary(&da), primary(&db), "the second saw the first's request");
    let one_each: Vec<usize> = starts.iter().filter(|(_, n)| *n > 0).map(|(_, n)| *n).collect();
    assert_eq!(one_each, vec![1, 1], "one request on each of two workers: {starts:?}");
    assert_eq!(db.prompt_tokens, da.prompt_tokens);
    assert_eq!(db.block_hashes, da.block_hashes, "the same prompt, not tokenized again");
}

#[test]
fn unordered_the_two_threads_queue_on_one_worker() {
    let r = router();
    let q = req(&"a prompt no worker holds yet ".repeat(40));
    let (da, db, ob, starts) = race(false, &r, &q);
    assert_eq!(ob, Ordered::default());
    assert_eq!(primary(&da), primary(&db));
    assert!(starts.iter().any(|(_, n)| *n == 2), "{starts:?}");
}

#[test]
fn a_holder_worth_the_wait_keeps_the_second_request() {
    let mut r = router();
    let q = req(&"the quick brown fox jumps over the lazy dog and keeps running ".repeat(200));
    let d = r.decide(&q, 0, &|_: &str| Default::default(), 0, 0).unwrap();
    r.observe(W[1], &d.block_hashes, crate::wire::journal::Source::Routed, 0);
    let (da, db, ob, _) = race(true, &r, &q);
    assert_eq!(primary(&da), W[1]);
    assert_eq!(ob, Ordered { reranked: true, moved: false }, "ranked again, stayed");
    assert_eq!(primary(&db), W[1]);
}
