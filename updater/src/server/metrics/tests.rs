use std::collections::HashMap;

use super::*;
use crate::conns::ConnLimits;
use crate::engine_metrics::EngineLoad;
use crate::ingest::DomainBase;

/// A worker name with every character the text format escapes.
const ODD: &str = "w\"x\\y\nz";

fn state() -> State {
    let domain =
        DomainBase { model: "m".into(), tokenizer_fingerprint: 1, block_size: 16, lora_name: None };
    let s = State::new(domain, ["a:1".to_owned(), ODD.to_owned()]);
    s.update("a:1", |e| {
        e.connected = true;
        e.knowledge.stats.batches = 7;
        e.knowledge.stats.caps_hit.add(Cap::DeclaredLength, 4);
        e.knowledge.stats.last_event_ms = now_ms();
        e.load = Some(EngineLoad {
            running: Some(3.0),
            waiting: None,
            kv_usage: Some(0.5),
            observed_at_ms: now_ms(),
        });
    });
    s.update(ODD, |e| e.knowledge.stats.gaps = 2);
    s
}

/// The text format's label-value escapes undone (`\\`, `\"`, `\n`).
fn unescape(v: &str) -> String {
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// `metric{labels}` → value, by prometheus-parse (label values unescaped here).
fn parse(text: &str) -> HashMap<(String, Vec<(String, String)>), f64> {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("parses");
    scrape
        .samples
        .into_iter()
        .map(|s| {
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                other => panic!("{} is not a plain sample: {other:?}", s.metric),
            };
            let mut labels: Vec<(String, String)> =
                s.labels.iter().map(|(k, v)| (k.clone(), unescape(v))).collect();
            labels.sort();
            ((s.metric, labels), v)
        })
        .collect()
}

fn key(metric: &str, labels: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
    let mut l: Vec<(String, String)> =
        labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    l.sort();
    (metric.to_owned(), l)
}

#[test]
fn exposition_parses_with_help_type_and_typed_values() {
    let conns = ConnStats::new(&ConnLimits::default(), Some(1024));
    let text = render(&state(), Some(&conns));
    let samples = parse(&text);
    let get = |m: &str, l: &[(&str, &str)]| samples.get(&key(m, l)).copied();
    assert_eq!(get("kvroute_updater_batches_total", &[("worker", "a:1")]), Some(7.0), "{text}");
    assert_eq!(get("kvroute_updater_batches_total", &[("worker", ODD)]), Some(0.0));
    assert_eq!(get("kvroute_updater_gaps_total", &[("worker", ODD)]), Some(2.0));
    let cap = [("worker", "a:1"), ("cap", "declared_length")];
    assert_eq!(get("kvroute_updater_caps_hit_total", &cap), Some(4.0));
    assert_eq!(get("kvroute_updater_connected", &[("worker", "a:1")]), Some(1.0));
    assert_eq!(get("kvroute_updater_reported_running", &[("worker", "a:1")]), Some(3.0));
    assert_eq!(get("kvroute_updater_reported_kv_usage", &[("worker", "a:1")]), Some(0.5));
    assert_eq!(get("kvroute_updater_reported_waiting", &[("worker", "a:1")]), None);
    assert!(get("kvroute_updater_last_event_age_seconds", &[("worker", "a:1")]).is_some());
    assert_eq!(get("kvroute_updater_last_event_age_seconds", &[("worker", ODD)]), None);
    assert_eq!(get("kvroute_updater_pool_workers", &[]), Some(2.0));
    assert_eq!(get("kvroute_updater_pool_left_total", &[]), Some(0.0));
    assert_eq!(get("kvroute_updater_peer_replicas", &[]), Some(0.0));
    assert_eq!(
        get("kvroute_updater_http_max_connections", &[]),
        Some(ConnLimits::default().max_connections as f64)
    );
    let shed = [("reason", "idle_timeout")];
    assert_eq!(get("kvroute_updater_http_connections_shed_total", &shed), Some(0.0));
    // Every metric has its HELP and TYPE lines, under the sample's name.
    for (counter, kind) in
        [("kvroute_updater_batches_total", "counter"), ("kvroute_updater_engine_keys", "gauge")]
    {
        assert!(text.contains(&format!("# HELP {counter} ")), "{text}");
        assert!(text.contains(&format!("# TYPE {counter} {kind}\n")), "{text}");
    }
    // The lines the dashboards and tests read, byte for byte.
    assert!(text.contains("kvroute_updater_pool_workers 2\n"), "{text}");
    assert!(
        text.contains("kvroute_updater_caps_hit_total{worker=\"a:1\",cap=\"declared_length\"} 4\n")
    );
}

#[test]
fn label_values_are_escaped() {
    let text = render(&state(), None);
    // `"`, `\` and the newline written as `\"`, `\\`, `\n`: one line per sample.
    assert!(text.contains("kvroute_updater_gaps_total{worker=\"w\\\"x\\\\y\\nz\"} 2\n"), "{text}");
    for line in text.lines() {
        let ok = line.starts_with("# HELP ")
            || line.starts_with("# TYPE ")
            || line.starts_with("kvroute_updater_");
        assert!(ok, "a line cut by an unescaped newline: {line:?}");
    }
}
