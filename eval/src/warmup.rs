//! The warm-up before a measured run. Every run starts a fresh stack, and a fresh Envoy runs
//! its first requests through cold code (the wasm filter's first calls run before V8 has
//! optimised them) and opens its upstream connections; a deployment that has been up for a
//! minute has done all that. So before the schedule, every policy's stack serves the same
//! warm-up requests, which are not recorded: copies of the schedule's first requests, each
//! with its prompt made unique (a marker in front, so no block is shared with the schedule or
//! with another warm-up request) and a two-token answer. The workers' prefix caches are then
//! reset, so the schedule starts on empty caches as before. What stays is what a running
//! deployment has: warm code, open connections, and (kvroute) a calibration that has seen a
//! few requests.

use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;

use crate::schedule::Scheduled;

/// Output tokens of a warm-up request.
const WARMUP_OUTPUT_TOKENS: u64 = 2;

/// `per_envoy` warm-up requests for each of `envoys` Envoys: the schedule's first requests,
/// disguised (see [`disguise`]), round robin over the schedule if it is shorter.
pub fn requests(schedule: &[Scheduled], per_envoy: usize, envoys: usize) -> Vec<Scheduled> {
    let want = per_envoy.saturating_mul(envoys);
    schedule.iter().cycle().take(want).enumerate().filter_map(|(n, s)| disguise(s, n)).collect()
}

/// A copy of `s` whose prompt starts with a marker of its own (`n`), so that it shares no
/// block with any other request, answering two tokens; `None` for a prompt shape it does not
/// know (such a request is left out of the warm-up).
pub fn disguise(s: &Scheduled, n: usize) -> Option<Scheduled> {
    let mut body = s.body.clone();
    let obj = body.as_object_mut()?;
    let marker = format!("warm-up {n} ");
    match obj.get_mut("prompt") {
        Some(Value::Array(ids)) if ids.iter().all(Value::is_u64) => {
            // A different first token changes every block hash of the chain; small ids are in
            // every vocabulary.
            ids.insert(0, Value::from(n as u64 % 1000 + 1));
            ids.insert(1, Value::from(n as u64 / 1000 + 1));
        }
        Some(Value::String(text)) => text.insert_str(0, &marker),
        Some(_) => return None,
        None => {
            let first = obj.get_mut("messages")?.as_array_mut()?.first_mut()?;
            match first.get_mut("content")? {
                Value::String(text) => text.insert_str(0, &marker),
                _ => return None,
            }
        }
    }
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(v) = obj.get_mut(key) {
            *v = Value::from(WARMUP_OUTPUT_TOKENS);
        }
    }
    Some(Scheduled { body, output_tokens: WARMUP_OUTPUT_TOKENS, cohorts: Vec::new(), ..s.clone() })
}

/// Sends `reqs` through the Envoys at `urls` (request i to Envoy i mod n, each Envoy's in
/// turn, one at a time), reading every answer to its end; returns how many got a 2xx.
pub async fn run(http: &reqwest::Client, urls: &[String], reqs: &[Scheduled]) -> usize {
    if urls.is_empty() {
        return 0;
    }
    let per_envoy = urls.iter().enumerate().map(|(e, url)| async move {
        let mut ok = 0;
        for s in reqs.iter().skip(e).step_by(urls.len()) {
            let sent = http
                .post(format!("{url}{}", s.endpoint))
                .header("content-type", "application/json")
                .body(s.body.to_string())
                .timeout(Duration::from_secs(60))
                .send()
                .await;
            if let Ok(resp) = sent {
                let good = resp.status().is_success();
                if resp.bytes().await.is_ok() && good {
                    ok += 1;
                }
            }
        }
        ok
    });
    join_all(per_envoy).await.into_iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sched(body: Value) -> Scheduled {
        Scheduled {
            at: Duration::from_millis(5),
            endpoint: crate::schedule::COMPLETIONS,
            body,
            output_tokens: 64,
            cohorts: vec!["hot-prefix".into()],
        }
    }

    #[test]
    fn every_prompt_shape_is_made_unique_and_short_to_answer() {
        let ids = sched(json!({"model": "m", "prompt": [5, 6, 7], "max_tokens": 64}));
        let d = disguise(&ids, 1234).unwrap();
        assert_eq!(d.body["prompt"], json!([235, 2, 5, 6, 7]));
        assert_eq!(d.body["max_tokens"], json!(2));
        assert_eq!((d.output_tokens, d.cohorts.len()), (2, 0));
        let text = sched(json!({"model": "m", "prompt": "hello", "max_tokens": 64}));
        assert_eq!(disguise(&text, 3).unwrap().body["prompt"], json!("warm-up 3 hello"));
        let chat = sched(json!({"model": "m", "messages": [
            {"role": "system", "content": "long"}, {"role": "user", "content": "q"}],
            "max_completion_tokens": 64}));
        let d = disguise(&chat, 0).unwrap();
        assert_eq!(d.body["messages"][0]["content"], json!("warm-up 0 long"));
        assert_eq!(d.body["messages"][1]["content"], json!("q"));
        assert_eq!(d.body["max_completion_tokens"], json!(2));
        // The schedule itself is untouched.
        assert_eq!(chat.body["messages"][0]["content"], json!("long"));
        let parts = sched(json!({"model": "m", "messages": [{"role": "user", "content": []}]}));
        assert!(disguise(&parts, 0).is_none());
        assert!(disguise(&sched(json!({"model": "m", "prompt": [[1], [2]]})), 0).is_none());
    }

    #[test]
    fn warm_up_requests_are_unique_and_cycle_over_a_short_schedule() {
        let s = vec![sched(json!({"model": "m", "prompt": "a"})), sched(json!({"prompt": "b"}))];
        let w = requests(&s, 3, 2);
        assert_eq!(w.len(), 6);
        let prompts: std::collections::HashSet<String> =
            w.iter().map(|r| r.body["prompt"].to_string()).collect();
        assert_eq!(prompts.len(), 6, "{prompts:?}");
        assert!(requests(&s, 0, 2).is_empty());
        assert!(requests(&[], 4, 2).is_empty());
    }
}
