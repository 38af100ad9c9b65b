//! The state a scenario starts from: the prefixes it shares already held by chosen workers
//! (e.g. a remote site), before the schedule starts. The first request of every tenant (every
//! distinct `tenant:*` cohort, or just the first request) is sent straight to each chosen
//! worker with a one-token answer, bypassing Envoy; then, for a policy that follows KV events,
//! the run waits until the updater knows those blocks and every Envoy holds that snapshot.

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::schedule::Scheduled;

/// The requests that warm the schedule's shared prefixes: the first of every tenant.
pub fn requests(schedule: &[Scheduled]) -> Vec<Scheduled> {
    let mut seen: Vec<Option<&str>> = Vec::new();
    let mut out = Vec::new();
    for s in schedule {
        let tenant = s.cohorts.iter().find(|c| c.starts_with("tenant:")).map(String::as_str);
        if seen.contains(&tenant) {
            continue;
        }
        seen.push(tenant);
        let mut body = s.body.clone();
        if let Some(obj) = body.as_object_mut() {
            obj.insert("stream".into(), Value::Bool(false));
            obj.remove("stream_options");
            for k in ["max_tokens", "max_completion_tokens"] {
                if obj.contains_key(k) {
                    obj.insert(k.into(), Value::from(1));
                }
            }
        }
        out.push(Scheduled { body, output_tokens: 1, cohorts: Vec::new(), ..s.clone() });
    }
    out
}

/// Sends the warming requests of `schedule` to each worker of `workers` (indices into the
/// cluster's workers), then waits (up to `timeout`) until kvroute knows them.
pub async fn run(
    cluster: &Cluster,
    schedule: &[Scheduled],
    workers: &[usize],
    timeout: Duration,
) -> anyhow::Result<()> {
    if workers.is_empty() {
        return Ok(());
    }
    let addrs = cluster.addrs();
    let http = reqwest::Client::builder().timeout(timeout).build()?;
    let reqs = requests(schedule);
    for &w in workers {
        let addr = addrs.get(w).with_context(|| format!("prewarm: no worker {w}"))?;
        for s in &reqs {
            let resp = http
                .post(format!("http://{addr}{}", s.endpoint))
                .json(&s.body)
                .send()
                .await
                .with_context(|| format!("prewarming {addr}"))?;
            let status = resp.status();
            let _ = resp.bytes().await;
            anyhow::ensure!(status.is_success(), "prewarming {addr}: {status}");
        }
    }
    if !cluster.policy.events() {
        return Ok(());
    }
    let Some(updater) = cluster.updater.as_ref() else { return Ok(()) };
    let gpu = |s: &Value, w: &str| s["workers"][w]["blocks"]["GPU"].as_u64().unwrap_or(0);
    let version = kvroute_stack::eventually_every(
        "the updater to learn the prewarmed prefixes",
        timeout,
        Duration::from_millis(20),
        || async {
            let s = updater.status().await.ok()?;
            workers
                .iter()
                .all(|&w| addrs.get(w).is_some_and(|a| gpu(&s, a) > 0))
                .then(|| s["version"].as_f64().unwrap_or(0.0))
        },
    )
    .await?;
    for e in &cluster.envoys {
        kvroute_stack::eventually_every(
            "Envoy to hold the updater's snapshot",
            timeout,
            Duration::from_millis(20),
            || async {
                e.prometheus()
                    .await
                    .ok()
                    .and_then(|m| m.get("kvroute_sync_snapshot_version").copied())
                    .filter(|v| *v >= version)
            },
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(tenant: Option<&str>, prompt: &str) -> Scheduled {
        Scheduled {
            at: Duration::ZERO,
            endpoint: crate::schedule::COMPLETIONS,
            body: json!({"model": "m", "prompt": prompt, "max_tokens": 24, "stream": true,
                         "stream_options": {"include_usage": true}}),
            output_tokens: 24,
            cohorts: tenant.map(|t| vec![format!("tenant:{t}")]).unwrap_or_default(),
        }
    }

    #[test]
    fn the_first_request_of_each_tenant_with_a_one_token_answer() {
        let sched = vec![s(Some("a"), "1"), s(Some("b"), "2"), s(Some("a"), "3"), s(None, "4")];
        let r = requests(&sched);
        let prompts: Vec<&str> = r.iter().map(|x| x.body["prompt"].as_str().unwrap()).collect();
        assert_eq!(prompts, ["1", "2", "4"]);
        assert_eq!(r[0].body["max_tokens"], 1);
        assert_eq!(r[0].body["stream"], false);
        assert!(r[0].body.get("stream_options").is_none());
        assert_eq!(requests(&sched[..1]).len(), 1);
    }
}
