//! The Grafana dashboard `deploy/grafana/kvroute-dashboard.json`: its panels and their PromQL,
//! the structural rules an importable dashboard follows, Grafana's variable interpolation, the
//! metric names a scrape offers, and the demo traffic that makes every panel show something.
//! The dashboard test (`tests/dashboard.rs`) and `kvroute-dashboard-render` share all of it.

pub mod prometheus;
pub mod promql;
pub mod svg;

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;

use crate::client;
use crate::stack::{Stack, MODEL};
use crate::workload::Conversation;

/// Where the dashboard lives in the repository.
pub fn path() -> PathBuf {
    crate::paths::repo_root().join("deploy/grafana/kvroute-dashboard.json")
}

/// The datasource reference every panel and query must use.
pub const DATASOURCE_UID: &str = "${datasource}";

/// One panel: its title, unit and queries (`legendFormat`, `expr`).
#[derive(Debug, Clone)]
pub struct Panel {
    pub id: u64,
    pub kind: String,
    pub title: String,
    pub unit: String,
    pub targets: Vec<(String, String)>,
}

/// Reads and parses the dashboard.
pub fn load() -> anyhow::Result<Value> {
    let p = path();
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", p.display()))
}

/// The panels of `dashboard` in order.
pub fn panels(dashboard: &Value) -> Vec<Panel> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    dashboard["panels"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| Panel {
                    id: p["id"].as_u64().unwrap_or(0),
                    kind: s(&p["type"]),
                    title: s(&p["title"]),
                    unit: s(&p["fieldConfig"]["defaults"]["unit"]),
                    targets: p["targets"]
                        .as_array()
                        .map(|ts| {
                            ts.iter().map(|t| (s(&t["legendFormat"]), s(&t["expr"]))).collect()
                        })
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn uses_variable(ds: &Value) -> bool {
    ds["type"] == "prometheus" && ds["uid"] == DATASOURCE_UID
}

/// What keeps `dashboard` from importing cleanly into Grafana with a datasource chosen at import
/// time (empty: nothing).
pub fn structure_problems(d: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let input = d["__inputs"].as_array().and_then(|i| {
        i.iter().find(|x| x["type"] == "datasource" && x["pluginId"] == "prometheus")
    });
    let Some(input) = input else {
        return vec!["no Prometheus datasource in __inputs (import would not ask for one)".into()];
    };
    let vars: Vec<&Value> =
        d["templating"]["list"].as_array().map(|l| l.iter().collect()).unwrap_or_default();
    match vars.iter().find(|v| v["name"] == "datasource") {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {
            let want = format!("${{{}}}", input["name"].as_str().unwrap_or_default());
            if v["current"]["value"] != want.as_str() {
                out.push(format!(
                    "variable datasource does not default to the import input {want}"
                ));
            }
        }
        _ => out.push("no templating variable `datasource` of type datasource (prometheus)".into()),
    }
    for v in vars.iter().filter(|v| v["type"] == "query") {
        if !uses_variable(&v["datasource"]) {
            out.push(format!("variable {} does not query ${{datasource}}", v["name"]));
        }
    }
    if d["schemaVersion"].as_u64().unwrap_or(0) < 36 {
        out.push("schemaVersion older than Grafana 9 (36)".into());
    }
    let mut ids = HashSet::new();
    let raw = d["panels"].as_array().map(Vec::as_slice).unwrap_or_default();
    if raw.is_empty() {
        out.push("no panels".into());
    }
    for p in raw {
        let title = p["title"].as_str().unwrap_or_default();
        let name = format!("panel {} ({title})", p["id"]);
        if title.is_empty() {
            out.push(format!("{name}: no title"));
        }
        if p["description"].as_str().is_none_or(|s| s.len() < 40) {
            out.push(format!("{name}: no description of how to read it"));
        }
        if p["fieldConfig"]["defaults"]["unit"].as_str().is_none_or(str::is_empty) {
            out.push(format!("{name}: no unit"));
        }
        if !matches!(p["id"].as_u64(), Some(id) if ids.insert(id)) {
            out.push(format!("{name}: id missing or not unique"));
        }
        let g = &p["gridPos"];
        if ["h", "w", "x", "y"].iter().any(|k| g[k].as_u64().is_none())
            || g["w"].as_u64() > Some(24)
        {
            out.push(format!("{name}: gridPos incomplete or wider than 24"));
        }
        if !uses_variable(&p["datasource"]) {
            out.push(format!("{name}: datasource is not ${{datasource}}"));
        }
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        if targets.is_empty() {
            out.push(format!("{name}: no queries"));
        }
        for t in targets {
            if !uses_variable(&t["datasource"]) {
                let r = t["refId"].as_str().unwrap_or("?");
                out.push(format!("{name}: query {r} does not use ${{datasource}}"));
            }
            if t["expr"].as_str().is_none_or(str::is_empty) {
                let r = t["refId"].as_str().unwrap_or("?");
                out.push(format!("{name}: query {r} has no expr"));
            }
        }
    }
    out
}

/// Grafana's interpolation of `$name`, `${name}` and `$__rate_interval` in `expr`, with
/// `vars` (`name`, value). Unknown variables are an error: the result goes to Prometheus.
pub fn interpolate(expr: &str, vars: &[(&str, &str)]) -> anyhow::Result<String> {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(b) => {
                let end = b.find('}').with_context(|| format!("unclosed ${{ in {expr}"))?;
                (&b[..end], end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        let value = vars
            .iter()
            .find(|(k, _)| *k == name)
            .with_context(|| format!("no value for variable ${name} in {expr}"))?;
        out.push_str(value.1);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The metric names a Prometheus text exposition offers, as a query sees them: a histogram's
/// `_bucket` series under that name (prometheus-parse reports the histogram under its base name
/// and `_sum`/`_count` as their own samples).
pub fn scrape_names(text: &str) -> anyhow::Result<BTreeSet<String>> {
    // Envoy writes label-less samples as `name{} value`, which prometheus-parse skips.
    let lines = text.lines().map(|l| Ok(l.replacen("{} ", " ", 1)));
    let scrape = prometheus_parse::Scrape::parse(lines).context("parsing a Prometheus scrape")?;
    Ok(scrape
        .samples
        .into_iter()
        .map(|s| match s.value {
            prometheus_parse::Value::Histogram(_) => format!("{}_bucket", s.metric),
            _ => s.metric,
        })
        .collect())
}

/// Demo traffic for the dashboard: `conversations` conversations (made from `seed`) of `turns`
/// turns each (later turns share the earlier ones' prefix, so hits, misses and audits all
/// happen), then one malformed request (a rejection) and one batch prompt (a fallback).
/// Returns the statuses.
pub async fn traffic(
    stack: &Stack,
    seed: u64,
    conversations: usize,
    turns: usize,
) -> anyhow::Result<Vec<u16>> {
    let http = reqwest::Client::new();
    let url = stack.base_url();
    let mut statuses = Vec::new();
    let convs: Vec<Conversation> =
        (0..conversations).map(|i| Conversation::new(seed, i, 120, 12, turns)).collect();
    for turn in 0..turns {
        for c in &convs {
            let r = client::chat(&http, &url, &c.body(MODEL, turn, 4, turn % 2 == 1)).await?;
            statuses.push(r.status);
        }
    }
    let bad = client::send(&http, &url, "/v1/chat/completions", b"{not json".to_vec(), &[]).await?;
    statuses.push(bad.status);
    let batch = serde_json::json!({"model": MODEL, "prompt": ["one", "two"], "max_tokens": 2});
    let r =
        client::send(&http, &url, "/v1/completions", batch.to_string().into_bytes(), &[]).await?;
    statuses.push(r.status);
    Ok(statuses)
}
