use serde_json::json;

use crate::decision::admission::tests::score;
use crate::decision::admission::{AdmissionVerdict, Reason};
use crate::decision::config::FilterConfig;
use crate::decision::request::Endpoint;
use crate::flow::admission::{admit, engine_priority, forwarded_body};

fn config() -> FilterConfig {
    let cfg = json!({"models": [
        {"name": "slow", "workers": ["127.0.0.1:1"], "ttft_deadline_ms": 100},
        {"name": "free", "workers": ["127.0.0.1:2"]},
    ]});
    FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()
}

#[test]
fn the_models_deadline_applies_without_a_header_and_sheds_with_retry_after() {
    let cfg = config();
    let mut ranked = vec![score("a", 0.0, 1_500.0)];
    let a = admit(&cfg, "slow", &mut ranked, None, None);
    assert_eq!(a.class, "interactive");
    assert!(matches!(a.verdict, AdmissionVerdict::Shed { reason: Reason::Deadline, .. }));
    let shed = a.shed.unwrap();
    assert_eq!(shed.error.status, 429);
    assert_eq!(shed.retry_after, "2");
    // The decision header's value only where it is exposed.
    assert_eq!(shed.detail, None);
    let exposed = FilterConfig { expose_decision_header: true, ..cfg.clone() };
    let detail = admit(&exposed, "slow", &mut ranked, None, None).shed.unwrap().detail.unwrap();
    assert!(detail.starts_with("shed=deadline; class=interactive; deadline_ms=100;"), "{detail}");
    assert!(detail.contains("best_worker=a;"), "{detail}");
    // Another model has no deadline: admitted.
    let a = admit(&cfg, "free", &mut ranked, None, None);
    assert_eq!((a.verdict, a.shed), (AdmissionVerdict::Admit, None));
}

#[test]
fn the_header_deadline_and_class_win_and_reorder_the_ranking() {
    let cfg = config();
    let mut ranked = vec![score("busy", 400.0, 500.0), score("idle", 0.0, 600.0)];
    let a = admit(&cfg, "free", &mut ranked, Some(b"2000"), Some(b"batch"));
    assert_eq!((a.class.as_str(), a.verdict, a.shed), ("batch", AdmissionVerdict::Admit, None));
    // Batch weighs queueing: the idle worker first.
    assert_eq!(ranked[0].worker, "idle");
    let a = admit(&cfg, "slow", &mut ranked, Some(b"5000"), None);
    assert_eq!(a.verdict, AdmissionVerdict::Admit);
}

#[test]
fn the_forwarded_body_carries_the_class_engine_priority() {
    let cfg = json!({"models": [{"name": "m", "workers": ["127.0.0.1:1"]}],
    "admission": {"classes": [
        {"name": "interactive", "engine_priority": 0},
        {"name": "batch", "engine_priority": 10},
    ]}});
    let cfg = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
    let mut ranked = vec![score("a", 0.0, 100.0)];
    let body = br#"{"model":"m","priority":-50,"prompt":"x"}"#;
    let a = admit(&cfg, "m", &mut ranked, None, Some(b"batch"));
    let out = forwarded_body(&a, Endpoint::Completions, body).unwrap().unwrap();
    assert_eq!(out, br#"{"model":"m","priority":10,"prompt":"x"}"#);
    // vLLM's Messages request has no such field: left alone.
    assert_eq!(forwarded_body(&a, Endpoint::Messages, body), Ok(None));
    // Without a header: the default class (interactive), the client's -50 overwritten.
    let a = admit(&cfg, "m", &mut ranked, None, None);
    let out = forwarded_body(&a, Endpoint::Chat, body).unwrap().unwrap();
    assert_eq!(out, br#"{"model":"m","priority":0,"prompt":"x"}"#);
    // The priority its load is counted at is the one the engine gets.
    assert_eq!(engine_priority(&cfg, Endpoint::Completions, Some(b"batch")), 10);
    assert_eq!(engine_priority(&cfg, Endpoint::Chat, Some(b" BATCH ")), 10);
    assert_eq!(engine_priority(&cfg, Endpoint::Chat, None), 0);
    assert_eq!(engine_priority(&cfg, Endpoint::Messages, Some(b"batch")), 0);
}
