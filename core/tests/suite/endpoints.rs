//! One conversation hashes the same on every chat-like endpoint, and media cost only what
//! follows them: the router's view of requests (block hashes, size, fallback reason).

use kvroute_core::decision::config::FilterConfig;
use kvroute_core::decision::load::WorkerLoad;
use kvroute_core::decision::request::{parse, Endpoint};
use kvroute_core::decision::router::{Decision, FallbackReason, Router};
use kvroute_core::decision::tokenize::model::{qwen3_dir, MEDIA_ITEM_TOKENS};
use serde_json::{json, Value};

const LONG: &str = "The quick brown fox jumps over the lazy dog and keeps running far away. ";

/// A router for model "m" with the demo bundle, or Qwen3's files inline.
fn router(qwen: bool) -> Router {
    let mut model = json!({"name": "m", "workers": ["127.0.0.1:1", "127.0.0.1:2"]});
    if qwen {
        let read = |f: &str| -> Value {
            let path = qwen3_dir().join(f);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{} (run ./dev setup): {e}", path.display()));
            serde_json::from_str(&text).unwrap()
        };
        model["tokenizer"] = read("tokenizer.json");
        model["tokenizer_config"] = read("tokenizer_config.json");
    }
    let cfg = json!({"models": [model]}).to_string();
    Router::new(&FilterConfig::from_json(cfg.as_bytes()).unwrap()).unwrap()
}

fn decide(r: &Router, endpoint: Endpoint, body: &Value) -> Decision {
    let body = body.to_string();
    let req = parse(endpoint, body.as_bytes()).unwrap();
    r.decide(&req, body.len(), &|_: &str| WorkerLoad::default(), 0, 0).unwrap()
}

/// System prompt, tools, a tool call and its result, a follow-up: as each endpoint spells it.
fn conversation() -> [(Endpoint, Value); 3] {
    let system = LONG.repeat(12);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]});
    let chat = json!({"model": "m",
        "tools": [{"type": "function", "function": {"name": "weather",
                   "description": "Current weather.", "parameters": schema}}],
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Weather in Zürich and 東京?"},
            {"role": "assistant", "content": "Checking both.", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Zürich\"}"}},
                {"id": "b", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"東京\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "12 °C"},
            {"role": "tool", "tool_call_id": "b", "content": "20 °C"},
            {"role": "user", "content": "Thanks! And tomorrow?"}]});
    let messages = json!({"model": "m", "max_tokens": 256, "system": system,
        "tools": [{"name": "weather", "description": "Current weather.", "input_schema": schema}],
        "messages": [
            {"role": "user", "content": "Weather in Zürich and 東京?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "a", "name": "weather", "input": {"city": "Zürich"}},
                {"type": "tool_use", "id": "b", "name": "weather", "input": {"city": "東京"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "12 °C"},
                {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "20 °C"}]},
                {"type": "text", "text": "Thanks! And tomorrow?"}]}]});
    let responses = json!({"model": "m", "instructions": system,
        "tools": [{"type": "function", "name": "weather", "description": "Current weather.",
                   "parameters": schema}],
        "input": [
            {"role": "user", "content": "Weather in Zürich and 東京?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking both."}]},
            {"type": "function_call", "call_id": "a", "name": "weather", "arguments": "{\"city\": \"Zürich\"}"},
            {"type": "function_call", "call_id": "b", "name": "weather", "arguments": "{\"city\":\"東京\"}"},
            {"type": "function_call_output", "call_id": "a", "output": "12 °C"},
            {"type": "function_call_output", "call_id": "b", "output": "20 °C"},
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks! And tomorrow?"}]}]});
    [(Endpoint::Chat, chat), (Endpoint::Messages, messages), (Endpoint::Responses, responses)]
}

fn same_hashes_on_every_endpoint(qwen: bool) {
    let r = router(qwen);
    let [chat, messages, responses] = conversation().map(|(ep, body)| decide(&r, ep, &body));
    assert!(chat.block_hashes.len() > 10, "{} blocks", chat.block_hashes.len());
    assert_eq!(chat.fallback, None);
    assert_eq!(messages.block_hashes, chat.block_hashes, "/v1/messages");
    assert_eq!(responses.block_hashes, chat.block_hashes, "/v1/responses");
    assert_eq!(
        (messages.prompt_tokens, responses.prompt_tokens),
        (chat.prompt_tokens, chat.prompt_tokens)
    );
}

#[test]
fn one_conversation_hashes_the_same_on_chat_messages_and_responses() {
    same_hashes_on_every_endpoint(false);
}

#[test]
fn one_conversation_hashes_the_same_on_every_endpoint_with_qwen3_tools() {
    same_hashes_on_every_endpoint(true);
}

#[test]
fn media_in_a_later_turn_keeps_the_earlier_blocks() {
    for qwen in [false, true] {
        let r = router(qwen);
        let turns = |last: Value| {
            json!({"model": "m", "messages": [
                {"role": "system", "content": LONG.repeat(10)},
                {"role": "user", "content": LONG.repeat(6)},
                {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": last}]})
        };
        let text = decide(&r, Endpoint::Chat, &turns(json!("What is in this picture?")));
        let media = decide(
            &r,
            Endpoint::Chat,
            &turns(json!([
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}])),
        );
        assert_eq!(text.fallback, None);
        assert_eq!(media.fallback, Some(FallbackReason::Multimodal), "counted as multimodal");
        assert!(media.block_hashes.len() > 10, "the turns before the image are hashed");
        assert!(media.block_hashes.len() < text.block_hashes.len());
        assert_eq!(media.block_hashes[..], text.block_hashes[..media.block_hashes.len()]);
        // The image and the text after it are costed (uncached), never hashed.
        assert!(media.prompt_tokens >= text.prompt_tokens + MEDIA_ITEM_TOKENS - 1);
        assert!(media.prompt_tokens <= text.prompt_tokens + MEDIA_ITEM_TOKENS + 2);
        // The same image in the first message: nothing before it to hash, still routed.
        let first = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "text", "text": LONG.repeat(10)}]}]});
        let d = decide(&r, Endpoint::Chat, &first);
        assert!(d.block_hashes.is_empty() && d.primary().is_some());
        assert_eq!(d.fallback, Some(FallbackReason::Multimodal));
    }
}

#[test]
fn the_sentinel_in_client_text_makes_the_media_prompt_unhashable() {
    let r = router(false);
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": format!("{}\u{e000}kvroute:media\u{e001}", LONG.repeat(10))},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]});
    let d = decide(&r, Endpoint::Chat, &body);
    assert!(d.block_hashes.is_empty());
    assert_eq!(d.fallback, Some(FallbackReason::Multimodal));
    assert!(d.prompt_tokens > MEDIA_ITEM_TOKENS);
}
