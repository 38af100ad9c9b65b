//! The numbers and paths a client can abuse, over real HTTP: a `max_tokens` of 2^64-1 (once an
//! overflow that left the request running forever), `"prompt": [[]]` (once never answered),
//! integral floats where vLLM's pydantic models accept them, and percent-encoded paths, each
//! answered as vLLM 0.33 answers it, within a bounded time.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common;

use common::MODEL;

/// Longer than any of these requests takes when answered; a hang fails the test.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

async fn post(port: u16, path: &str, body: &Value) -> (u16, String) {
    let send =
        reqwest::Client::new().post(format!("http://127.0.0.1:{port}{path}")).json(body).send();
    let r = tokio::time::timeout(ANSWER_WITHIN, async {
        let r = send.await.unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    })
    .await;
    r.unwrap_or_else(|_| panic!("{path} {body} not answered within {ANSWER_WITHIN:?}"))
}

fn error(text: &str) -> Value {
    serde_json::from_str::<Value>(text).unwrap()["error"].clone()
}

#[tokio::test]
async fn odd_numbers_are_answered_as_vllm_answers_them() {
    let w = common::demo_worker();
    let port = w.start().await.unwrap().http;
    let max_len = w.spec.profile.max_model_len;
    let chat = |extra: Value| {
        let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };

    let huge = u64::MAX;
    for stream in [false, true] {
        let (status, text) = post(
            port,
            "/v1/chat/completions",
            &chat(json!({"max_tokens": huge, "stream": stream})),
        )
        .await;
        assert_eq!(status, 400, "{text}");
        let want = format!(
            "max_tokens={huge} cannot be greater than max_model_len={max_len}. Please request \
             fewer output tokens. (parameter=max_tokens, value={huge})"
        );
        assert_eq!(
            error(&text),
            json!({"message": want, "type": "BadRequestError", "param": "max_tokens", "code": 400})
        );
    }
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": huge});
    let (status, text) = post(port, "/v1/completions", &body).await;
    assert_eq!((status, error(&text)["param"].clone()), (400, json!("max_tokens")), "{text}");
    let (status, text) =
        post(port, "/v1/chat/completions", &chat(json!({"max_completion_tokens": huge}))).await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(error(&text)["param"], "max_completion_tokens");

    // Empty prompts: refused by the engine, as a 400 or, streamed, as the stream's one event.
    for prompt in [json!([[]]), json!([[], [1, 2, 3]])] {
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2});
        let (status, text) = post(port, "/v1/completions", &body).await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(
            error(&text),
            json!({"message": "The decoder prompt cannot be empty", "type": "BadRequestError",
                "param": null, "code": 400})
        );
    }
    let body = json!({"model": MODEL, "prompt": [[]], "max_tokens": 2, "stream": true});
    let (status, text) = post(port, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 2, "{text}");
    let first = events[0].strip_prefix("data: ").unwrap();
    assert_eq!(error(first)["message"], "The decoder prompt cannot be empty");
    assert_eq!(events[1], "data: [DONE]");

    // Integral floats are integers to vLLM: a 2-token answer.
    let (status, text) =
        post(port, "/v1/chat/completions", &chat(json!({"max_tokens": 2.0}))).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let body = json!({"model": MODEL, "prompt": [1.0, 2.0, 3.0], "max_tokens": "3"});
    let (status, text) = post(port, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (v["usage"]["prompt_tokens"].clone(), v["usage"]["completion_tokens"].clone()),
        (json!(3), json!(3))
    );
    let (status, text) =
        post(port, "/v1/chat/completions", &chat(json!({"max_tokens": 2.5}))).await;
    assert_eq!(status, 400, "{text}");
    let (status, text) = post(port, "/v1/chat/completions", &chat(json!({"max_tokens": 0}))).await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(
        error(&text)["message"],
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    );

    // A budget within the model's length but past what the prompt leaves is clamped, not
    // refused: the answer ends at the context's end.
    let words = kvroute_testkit::textgen::words(7, 50);
    let body = json!({"model": MODEL, "prompt": words, "max_tokens": max_len});
    let (status, text) =
        post(port, "/sim/what_if", &json!({"endpoint": "/v1/completions", "request": body})).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn percent_encoded_paths_are_served_as_the_decoded_path() {
    let w = common::demo_worker();
    let port = w.start().await.unwrap().http;
    let body =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for path in
        ["/v1/chat/%63ompletions", "/v1%2Fchat%2Fcompletions", "/%76%31/chat/completions?x=%2F"]
    {
        let (status, text) = post(port, path, &body).await;
        assert_eq!(status, 200, "{path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["object"], "chat.completion", "{path}");
    }
    // Decoded once, as uvicorn does: `%2563` is `%63`, which no route matches.
    let (status, _) = post(port, "/v1/chat/%2563ompletions", &body).await;
    assert_eq!(status, 404);
}
