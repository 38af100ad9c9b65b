//! `/v1/responses` and `/v1/messages` as vLLM 0.33 serves them, streamed and not, and the stop
//! conditions of every endpoint (finish reasons, cut text, token counts), over real HTTP.

use std::sync::Arc;

use kvroute_sim::engine::{Finish, StopReason, StopRule};
use kvroute_sim::worker::Worker;
use serde_json::{json, Value};

use crate::common;

async fn start() -> (Arc<Worker>, u16) {
    let w = common::demo_worker();
    let http = w.start().await.unwrap().http;
    (w, http)
}

async fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// A streamed answer as `(event name, data)` pairs (`event` is `None` for data-only lines).
async fn stream(port: u16, path: &str, body: &Value) -> Vec<(Option<String>, String)> {
    let text = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut event = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_owned();
                }
            }
            (event, data)
        })
        .collect()
}

fn text(words: usize, seed: u64) -> String {
    kvroute_testkit::textgen::words(seed, words)
}

#[tokio::test]
async fn one_conversation_renders_alike_on_every_chat_endpoint_and_each_reports_the_reuse() {
    let (_w, port) = start().await;
    let user = text(120, 7);
    let chat = json!({"model": common::MODEL, "max_tokens": 2,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}]});
    let (s, c) = post(port, "/v1/chat/completions", &chat).await;
    assert_eq!(s, 200, "{c}");
    let prompt = c["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    let resp = json!({"model": common::MODEL, "max_output_tokens": 2, "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": user}]}]});
    let (s, r) = post(port, "/v1/responses", &resp).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["usage"]["input_tokens"].as_u64(), Some(prompt), "{r}");
    let cached = r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt, "{r}");

    let msgs = json!({"model": common::MODEL, "max_tokens": 2, "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}]});
    let (s, m) = post(port, "/v1/messages", &msgs).await;
    assert_eq!(s, 200, "{m}");
    let u = &m["usage"];
    let read = u["cache_read_input_tokens"].as_u64().unwrap();
    let created = u["cache_creation_input_tokens"].as_u64().unwrap();
    assert_eq!(read, cached, "{m}");
    assert_eq!(u["input_tokens"].as_u64().unwrap() + read + created, prompt, "{m}");
    assert_eq!(u["output_tokens"], 2);
}

#[tokio::test]
async fn responses_answer_and_stream_in_vllm_shape() {
    let (_w, port) = start().await;
    let body = json!({"model": common::MODEL, "input": text(40, 1), "max_output_tokens": 4});
    let (s, r) = post(port, "/v1/responses", &body).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    // Ran to its limit: incomplete, as vLLM reports it.
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["max_output_tokens"], 4);
    let item = &r["output"][0];
    assert_eq!(
        (item["type"].as_str(), item["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(item["status"], "incomplete");
    let full_text = item["content"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(item["content"][0]["type"], "output_text");
    assert!(!full_text.is_empty());
    assert_eq!(r["usage"]["output_tokens"], 4);
    assert_eq!(
        r["usage"]["total_tokens"].as_u64(),
        Some(r["usage"]["input_tokens"].as_u64().unwrap() + 4)
    );

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let events = stream(port, "/v1/responses", &sbody).await;
    let kinds: Vec<&str> = events.iter().map(|(e, _)| e.as_deref().unwrap_or("")).collect();
    let deltas = kinds.iter().filter(|k| **k == "response.output_text.delta").count();
    assert!(deltas >= 1, "{kinds:?}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]);
    assert_eq!(kinds, expected);
    let data: Vec<Value> = events.iter().map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["sequence_number"], i, "{d}");
        assert_eq!(Some(d["type"].as_str().unwrap()), events[i].0.as_deref());
    }
    assert_eq!(data[0]["response"]["status"], "in_progress");
    let streamed: String = data
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    let last = &data[data.len() - 1]["response"];
    assert_eq!(last["output"][0]["content"][0]["text"].as_str(), Some(streamed.as_str()));
    // The same body but `stream`: another seed, so compare the lengths of what each reports.
    assert_eq!(last["usage"]["output_tokens"], 4);
    assert!(last["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn messages_answer_and_stream_in_vllm_shape() {
    let (_w, port) = start().await;
    let body = json!({"model": common::MODEL, "max_tokens": 3,
        "messages": [{"role": "user", "content": text(40, 2)}]});
    let (s, m) = post(port, "/v1/messages", &body).await;
    assert_eq!(s, 200, "{m}");
    assert_eq!((m["type"].as_str(), m["role"].as_str()), (Some("message"), Some("assistant")));
    assert_eq!(m["stop_reason"], "max_tokens");
    assert!(m.get("stop_sequence").is_none(), "vLLM drops null fields: {m}");
    assert_eq!(m["content"][0]["type"], "text");

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let events = stream(port, "/v1/messages", &sbody).await;
    let kinds: Vec<&str> = events.iter().map(|(e, _)| e.as_deref().unwrap_or("")).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let data: Vec<Value> = events.iter().map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(data[0]["message"]["usage"]["output_tokens"], 0);
    let delta = &data[6];
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 3);
    assert!(delta["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0, "{delta}");

    let (s, e) = post(
        port,
        "/v1/messages",
        &json!({"model": "nope", "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(
        (e["type"].as_str(), e["error"]["type"].as_str()),
        (Some("error"), Some("not_found_error"))
    );
}

#[tokio::test]
async fn without_stop_conditions_every_request_runs_to_max_tokens() {
    let (_w, port) = start().await;
    for n in [1, 5, 17] {
        let body = json!({"model": common::MODEL, "max_tokens": n, "prompt": text(30, n)});
        let (s, c) = post(port, "/v1/completions", &body).await;
        assert_eq!(s, 200, "{c}");
        assert_eq!(c["usage"]["completion_tokens"], n);
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert_eq!(c["choices"][0]["stop_reason"], Value::Null);
    }
}

#[tokio::test]
async fn a_stop_string_ends_the_request_and_is_cut_on_every_endpoint() {
    let (_w, port) = start().await;
    let user = text(30, 3);
    let chat = json!({"model": common::MODEL, "max_tokens": 64, "stop": ["e"],
        "messages": [{"role": "user", "content": user}]});
    let (_, c) = post(port, "/v1/chat/completions", &chat).await;
    assert_eq!(c["choices"][0]["finish_reason"], "stop", "{c}");
    assert_eq!(c["choices"][0]["stop_reason"], "e");
    assert!(!c["choices"][0]["message"]["content"].as_str().unwrap().contains('e'));
    assert!(c["usage"]["completion_tokens"].as_u64().unwrap() < 64);

    let mut inc = chat.clone();
    inc["include_stop_str_in_output"] = json!(true);
    let (_, c) = post(port, "/v1/chat/completions", &inc).await;
    assert!(c["choices"][0]["message"]["content"].as_str().unwrap().ends_with('e'), "{c}");

    // Streamed: the chunks never carry the stop string, the last one has the reason.
    let mut st = chat.clone();
    st["stream"] = json!(true);
    let chunks: Vec<Value> = stream(port, "/v1/chat/completions", &st)
        .await
        .into_iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(&d).unwrap())
        .collect();
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert!(!streamed.contains('e'), "{streamed:?}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");

    let resp = json!({"model": common::MODEL, "max_output_tokens": 64, "stop": "e",
        "input": user});
    let (_, r) = post(port, "/v1/responses", &resp).await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["incomplete_details"], Value::Null);
    assert_eq!(r["output"][0]["status"], "completed");

    let msgs = json!({"model": common::MODEL, "max_tokens": 64, "stop_sequences": ["e"],
        "messages": [{"role": "user", "content": user}]});
    let (_, m) = post(port, "/v1/messages", &msgs).await;
    assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
    assert_eq!(m["stop_sequence"], "e");
    let mut ms = msgs.clone();
    ms["stream"] = json!(true);
    let events = stream(port, "/v1/messages", &ms).await;
    let delta = events.iter().find(|(e, _)| e.as_deref() == Some("message_delta")).unwrap();
    let delta: Value = serde_json::from_str(&delta.1).unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], "e");
}

#[tokio::test]
async fn stop_token_ids_end_the_request_after_min_tokens_without_their_text() {
    let (_w, port) = start().await;
    // Every token the simulator samples is below 4096: any sampled token stops the request,
    // but only from the third one on.
    let ids: Vec<u32> = (0..4096).collect();
    let body = json!({"model": common::MODEL, "max_tokens": 10, "min_tokens": 3,
        "stop_token_ids": ids, "prompt": text(20, 4)});
    let (s, c) = post(port, "/v1/completions", &body).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["usage"]["completion_tokens"], 3);
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    assert!(c["choices"][0]["stop_reason"].is_u64(), "{c}");
    // The stop token's text is not in the output: two words.
    assert_eq!(c["choices"][0]["text"].as_str().unwrap().split_whitespace().count(), 2, "{c}");
}

#[test]
fn stop_rule_order_matches_vllm() {
    let ids = StopRule { min_tokens: 2, token_ids: vec![5], ..Default::default() };
    assert_eq!(ids.check(&[5]), None, "before min_tokens");
    assert_eq!(ids.check(&[1, 5]), Some(Finish::Stop(Some(StopReason::Token(5)))));
    assert_eq!(ids.check(&[1, 6]), None);
    let eos = StopRule { eos: Some(2), ..Default::default() };
    assert_eq!(eos.check(&[2]), Some(Finish::Stop(None)));
    assert_eq!(StopRule::default().check(&[1, 2, 3]), None);
}

#[tokio::test]
async fn what_if_takes_responses_and_messages_requests() {
    let (_w, port) = start().await;
    let user = text(60, 9);
    let chat = json!({"model": common::MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": user}]});
    let (_, c) = post(port, "/v1/chat/completions", &chat).await;
    let prompt = c["usage"]["prompt_tokens"].clone();
    for (endpoint, request) in [
        ("/v1/responses", json!({"model": common::MODEL, "input": user})),
        (
            "/v1/messages",
            json!({"model": common::MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": user}]}),
        ),
    ] {
        let (s, a) =
            post(port, "/sim/what_if", &json!({"endpoint": endpoint, "request": request})).await;
        assert_eq!(s, 200, "{endpoint}: {a}");
        assert_eq!(a["prompt_tokens"], prompt, "{endpoint}: {a}");
        assert!(a["cached_tokens"].as_u64().unwrap() > 0, "{endpoint}: {a}");
    }
}

#[tokio::test]
async fn it_says_it_is_vllm_where_gateways_look() {
    let (_w, port) = start().await;
    let get = |path: &'static str| async move {
        reqwest::get(format!("http://127.0.0.1:{port}{path}"))
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    assert_eq!(get("/version").await["version"], kvroute_sim::api::VLLM_VERSION);
    let models = get("/v1/models").await;
    assert_eq!(models["data"][0]["owned_by"], "vllm");
}
