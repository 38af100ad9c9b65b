//! The Grafana dashboard against the real stack: every metric any panel queries exists in what
//! Envoy (`/stats/prometheus`, with the stats_tags of `envoy/kvroute.yaml`) and kvroute-updater
//! (`/metrics`) export after a little traffic, and the JSON imports cleanly (datasource chosen
//! at import, unique panel ids, positions, units, descriptions).

use std::collections::BTreeSet;
use std::time::Duration;

use kvroute_stack::dashboard::{self, promql};
use kvroute_stack::eventually;
use kvroute_stack::stack::{Stack, StackOptions};
use serde_json::json;

/// The values of every sample of `name` (a counter, gauge or untyped metric) in a Prometheus
/// text exposition, read by prometheus-parse (Envoy's label-less `name{} value` included).
fn samples(text: &str, name: &str) -> Vec<f64> {
    let lines = text.lines().map(|l| Ok(l.replacen("{} ", " ", 1)));
    let Ok(scrape) = prometheus_parse::Scrape::parse(lines) else { return Vec::new() };
    scrape
        .samples
        .into_iter()
        .filter(|s| s.metric == name)
        .filter_map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// The calibrated model's name segment in the test stack (`kvroute-demo`).
const CALIB_MODEL: &str = "kvroute_demo";

fn vars() -> [(&'static str, &'static str); 4] {
    [
        ("envoy_job", ".+"),
        ("updater_job", ".+"),
        ("calib_model", CALIB_MODEL),
        ("__rate_interval", "1m"),
    ]
}

#[test]
fn dashboard_is_importable() {
    let d = dashboard::load().unwrap();
    let problems = dashboard::structure_problems(&d);
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(dashboard::panels(&d).len() >= 12);
}

#[test]
fn structure_check_catches_what_breaks_an_import() {
    let good = dashboard::load().unwrap();
    let mut d = good.clone();
    d["panels"][1]["id"] = d["panels"][0]["id"].clone();
    d["panels"][2]["datasource"] = json!({"type": "prometheus", "uid": "PBFA97CFB590B2093"});
    d["panels"][3]["targets"][0]["datasource"] = json!(null);
    d["panels"][4].as_object_mut().unwrap().remove("gridPos");
    d["panels"][5]["fieldConfig"]["defaults"]["unit"] = json!("");
    d["panels"][6]["description"] = json!("");
    let p = dashboard::structure_problems(&d);
    for (panel, what) in [
        (1, "not unique"),
        (2, "datasource"),
        (3, "query A"),
        (4, "gridPos"),
        (5, "unit"),
        (6, "description"),
    ] {
        let title = good["panels"][panel]["title"].as_str().unwrap();
        assert!(p.iter().any(|m| m.contains(title) && m.contains(what)), "{panel} {what}: {p:#?}");
    }
    let mut d = good;
    d.as_object_mut().unwrap().remove("__inputs");
    assert!(!dashboard::structure_problems(&d).is_empty());
}

#[test]
fn every_query_interpolates_and_parses() {
    let d = dashboard::load().unwrap();
    for p in dashboard::panels(&d) {
        for (_, expr) in &p.targets {
            let e = dashboard::interpolate(expr, &vars()).unwrap();
            let refs = promql::metric_refs(&e).unwrap_or_else(|err| panic!("{}: {err}", p.title));
            assert!(!refs.is_empty(), "{}: no metric in {e}", p.title);
        }
    }
    assert!(dashboard::interpolate("rate(a[$nope])", &vars()).is_err());
    assert_eq!(
        dashboard::interpolate("a_${calib_model}_b{j=~\"$envoy_job\"}[$__rate_interval]", &vars())
            .unwrap(),
        "a_kvroute_demo_b{j=~\".+\"}[1m]"
    );
}

/// Every metric name (or `__name__` pattern) the panels query, with the panel titles.
fn queried() -> Vec<(promql::MetricRef, String)> {
    let d = dashboard::load().unwrap();
    let mut out = Vec::new();
    for p in dashboard::panels(&d) {
        for (_, expr) in &p.targets {
            let e = dashboard::interpolate(expr, &vars()).unwrap();
            for r in promql::metric_refs(&e).unwrap() {
                out.push((r, p.title.clone()));
            }
        }
    }
    out
}

fn missing(names: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (r, title) in queried() {
        let found = match &r {
            promql::MetricRef::Name(n) => names.contains(n),
            promql::MetricRef::Pattern(p) => {
                names.iter().any(|n| promql::pattern_matches(p, n).unwrap())
            }
        };
        if !found {
            out.push(format!("{r:?} (panel {title})"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_metric_exists_in_the_real_scrapes() {
    let stack = Stack::start(StackOptions {
        updater: true,
        filter: json!({"calibration": {"enabled": true}}),
        ..Default::default()
    })
    .await
    .unwrap();
    let updater = stack.updater.as_ref().unwrap();
    let updater_metrics = format!("http://127.0.0.1:{}/metrics", updater.port);
    let envoy_stats = format!("{}/stats/prometheus", stack.envoy.admin_url());
    // The updater follows every worker and has scraped each one's load before traffic.
    let workers = stack.workers.len();
    eventually("updater connected and scraped", Duration::from_secs(30), || {
        let url = updater_metrics.clone();
        async move {
            let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
            let connected = samples(&text, "kvroute_updater_connected");
            let running = samples(&text, "kvroute_updater_reported_running");
            let up = connected.iter().filter(|v| **v == 1.0).count();
            (up == workers && running.len() == workers).then_some(())
        }
    })
    .await
    .unwrap();

    let statuses = dashboard::traffic(&stack, 13, 3, 3).await.unwrap();
    // Nine chat turns, a malformed body (refused by the filter), a batch prompt (a fallback).
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 200, 200, 400, 200]);

    // Audits arrive with each response's usage; KV events reach the updater asynchronously.
    let text = eventually("audits, knowledge and event ages", Duration::from_secs(30), || {
        let (e, u) = (envoy_stats.clone(), updater_metrics.clone());
        async move {
            let envoy = reqwest::get(&e).await.ok()?.text().await.ok()?;
            let upd = reqwest::get(&u).await.ok()?.text().await.ok()?;
            let audited: f64 = samples(&envoy, "kvroute_worker_audited_requests").iter().sum();
            let aged = !samples(&upd, "kvroute_updater_last_event_age_seconds").is_empty();
            (audited >= 9.0 && aged).then_some(format!("{envoy}\n{upd}"))
        }
    })
    .await
    .unwrap();
    // The per-worker audit counters add up to the per-class ones.
    let m = stack.envoy.prometheus().await.unwrap();
    let sum = |prefix: &str| -> f64 {
        m.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
    };
    assert_eq!(sum("kvroute_worker_audited_requests{"), sum("kvroute_audit_requests{"));
    assert_eq!(
        sum("kvroute_worker_false_hits{"),
        sum("kvroute_audit_requests{kvroute_audit=\"false_hit\"}")
    );
    let names = dashboard::scrape_names(&text).unwrap();
    let gone = missing(&names);
    assert!(
        gone.is_empty(),
        "metrics the dashboard queries that neither Envoy nor the updater exports: {gone:#?}\n\
         kvroute names exported: {:#?}",
        names.iter().filter(|n| n.starts_with("kvroute")).collect::<Vec<_>>()
    );
    // The check itself: a name nobody exports is reported.
    let mut fewer = names.clone();
    fewer.remove("kvroute_worker_false_hits");
    assert!(missing(&fewer).iter().any(|m| m.contains("kvroute_worker_false_hits")));
}
