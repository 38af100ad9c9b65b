//! The seed corpus of every target, made with the project's own encoders: valid inputs a
//! worker, a client, the updater or Envoy's shared data really carries, plus a few hostile
//! ones (truncated, deeply nested, not UTF-8, absurd counts).
//!
//! `corpus/<target>/` holds these files. The test below checks that they are there and
//! current, so a format change shows up as stale seeds; `KVROUTE_WRITE_SEEDS=1 cargo test
//! --manifest-path fuzz/Cargo.toml seeds` rewrites them. What libFuzzer finds is not committed
//! (`./dev fuzz` keeps it in `fuzz/scratch/`); an input that once crashed a target is added to
//! its corpus by hand, under a name starting with `crash-`, and `./dev test` replays it forever.

use std::path::Path;

use kvroute_core::decision::config::{FilterConfig, SnapshotSyncConfig};
use kvroute_core::decision::request::{parse, Endpoint};
use kvroute_core::decision::router::Router;
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_core::decision::usage::{Usage, UsageScanner};
use kvroute_core::shared::knowledge::Head;
use kvroute_core::shared::load::{
    decode_registry, encode_registry, InflightEntry, PrefillsDone, ShardData, MAX_SHARDS,
};
use kvroute_core::wire::delta::{Delta, SetChange, WorkerDelta};
use kvroute_core::wire::journal::JournalEntry;
use kvroute_core::wire::journal::Source;
use kvroute_core::wire::peers::{PeerCredit, PeerLoad, PeerReport, PeerSection};
use kvroute_core::wire::snapshot::{
    ModelInfo, Snapshot, SnapshotLoad, SnapshotWorker, WorkerPlacement,
};
use kvroute_updater::decode::{decode_batch, EngineEvent};
use rmpv::Value;
use serde_json::json;

type Seeds = Vec<(&'static str, Vec<u8>)>;

/// `data` cut at about two thirds.
fn truncated(data: &[u8]) -> Vec<u8> {
    data[..data.len() * 2 / 3].to_vec()
}

fn json_bytes(v: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

/// `depth` nested JSON arrays around `inner` under `key` of an otherwise plausible object.
fn deep_json(prefix: &str, depth: usize) -> Vec<u8> {
    let mut s = prefix.as_bytes().to_vec();
    s.extend(std::iter::repeat_n(b'[', depth));
    s.extend(std::iter::repeat_n(b']', depth));
    s.push(b'}');
    s
}

fn request_parse() -> Seeds {
    let chat = json_bytes(json!({
        "model": "demo",
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Summarize the plot of Hamlet in two sentences."}
        ],
        "max_tokens": 64,
        "temperature": 0.2
    }));
    let chat_stream = json_bytes(json!({
        "model": "demo",
        "messages": [
            {"role": "system", "content": "You answer questions about the attached report."},
            {"role": "user", "content": [
                {"type": "text", "text": "Here is the report:"},
                {"type": "text", "text": "Q3 revenue grew 12% while costs fell."}
            ]},
            {"role": "assistant", "content": "Revenue grew and costs fell."},
            {"role": "user", "content": "By how much did revenue grow?"}
        ],
        "stream": true,
        "stream_options": {"include_usage": true},
        "cache_salt": "tenant-a",
        "user": "user-42",
        "max_completion_tokens": 32
    }));
    let completion = json_bytes(json!({
        "model": "demo", "prompt": "Once upon a time, in a quiet village,", "max_tokens": 16,
        "stream": false
    }));
    let tokens = json_bytes(json!({
        "model": "demo", "prompt": (1u32..=40).collect::<Vec<_>>(), "max_tokens": 8
    }));
    let unicode = json_bytes(json!({
        "model": "demo",
        "messages": [{"role": "user", "content": "naïve café 東京 🚀 \u{0000} \\ \" \t end"}],
        "cache_salt": ""
    }));
    let chat_tools_media = json_bytes(json!({
        "model": "demo",
        "tools": [{"type": "function", "function": {"name": "weather", "description": "Now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "-3 °C"},
            {"role": "user", "content": [{"type": "text", "text": "And this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
        ],
        "chat_template_kwargs": {"enable_thinking": false},
        "add_generation_prompt": false, "continue_final_message": true, "reasoning_effort": "low"
    }));
    let messages = json_bytes(json!({
        "model": "demo", "max_tokens": 64, "stream": true,
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "weather", "input_schema": {"properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "-3 °C"},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/m.png"}}]},
                {"type": "text", "text": "Thanks."}]}
        ]
    }));
    let responses = json_bytes(json!({
        "model": "demo", "instructions": "Be brief.", "max_output_tokens": 64,
        "reasoning": {"effort": "low"}, "cache_salt": "tenant-a",
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}},
                  {"type": "web_search"}],
        "input": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"type": "reasoning", "id": "r1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "-3 °C"},
            {"type": "message", "role": "assistant", "status": "incomplete",
             "content": [{"type": "output_text", "text": "It is"}]}
        ]
    }));
    for body in [&chat, &chat_stream, &chat_tools_media] {
        parse(Endpoint::Chat, body).unwrap();
    }
    parse(Endpoint::Messages, &messages).unwrap();
    parse(Endpoint::Responses, &responses).unwrap();
    for body in [&completion, &tokens] {
        parse(Endpoint::Completions, body).unwrap();
    }
    parse(Endpoint::Chat, &unicode).unwrap();
    let python_numbers = br#"{"model":"demo","messages":[{"role":"user","content":"Tune."},
        {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":
        {"name":"tune","arguments":"{\"x\": NaN, \"y\": -0, \"z\": 1e400}"}},{"id":"c2",
        "type":"function","function":{"name":"tune","arguments":"[Infinity]"}}]}],
        "tools":[{"type":"function","function":{"name":"tune","parameters":{"type":"object",
        "properties":{"x":{"minimum":-Infinity,"maximum":123456789012345678901234567890123456789012,
        "default":-0.0,"examples":[NaN,-0,1E5,2.5e-3,-1e400]}}}}}],"temperature":NaN}"#
        .to_vec();
    parse(Endpoint::Chat, &python_numbers).unwrap();
    let deep_tool = format!(
        r#"{{"model":"demo","messages":[{{"role":"user","content":"x"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{}1{}}}}}]}}"#,
        r#"{"a":["#.repeat(200),
        "]}".repeat(200)
    )
    .into_bytes();
    parse(Endpoint::Chat, &deep_tool).unwrap();
    let mut not_utf8 = br#"{"model":"demo","messages":[{"role":"user","content":"caf"#.to_vec();
    not_utf8.extend_from_slice(b"\xc3\x28 \xff\xfe");
    not_utf8.extend_from_slice(br#""}]}"#);
    vec![
        ("chat.json", chat.clone()),
        ("chat-stream-salted-parts.json", chat_stream),
        ("chat-tools-reasoning-media.json", chat_tools_media),
        ("messages-tools-thinking-image.json", messages),
        ("responses-items-partial.json", responses),
        ("completion-text.json", completion),
        ("completion-token-ids.json", tokens),
        // The one-pass completions parse: ids up to u32::MAX, a later duplicate `prompt` out
        // of range, a batch of id lists, ids mixed with other values, a prompt that is no array.
        ("completions-ids-max.json", br#"{"model":"m","prompt":[1,2,3,4294967295],"stream":true}"#.to_vec()),
        ("completions-duplicate-prompt.json", br#"{"prompt":[1,2],"model":"m","prompt":[3,4294967296]}"#.to_vec()),
        ("completions-batch-ids.json", br#"{"model":"m","prompt":[[1,2],[3]],"max_tokens":1}"#.to_vec()),
        ("completions-mixed-ids.json", br#"{"model":"m","prompt":[1,-2,1.5,"7",null,{}]}"#.to_vec()),
        ("completions-prompt-object.json", br#"{"model":"m","prompt":{"a":[1]},"prompt":true}"#.to_vec()),
        ("chat-unicode.json", unicode),
        (
            "wrong-types.json",
            br#"{"model":"demo","messages":[{"role":"user","content":7}],"stream":"yes","max_tokens":-1}"#
                .to_vec(),
        ),
        ("truncated.json", truncated(&chat)),
        ("deep-nesting.json", deep_json(r#"{"model":"demo","messages":"#, 600)),
        ("not-utf8.json", not_utf8),
        // Read as Python's json reads them (`request::pyjson`): numbers a strict parser reads
        // differently or refuses, a BOM, nesting deeper than serde_json reads (past what is
        // kept: `deep-nesting.json`).
        ("python-numbers.json", python_numbers),
        ("python-bom.json", [&b"\xef\xbb\xbf"[..], &chat].concat()),
        ("python-deep-tool-schema.json", deep_tool),
        ("completions-python-ids.json", br#"{"model":"m","prompt":[-0,1,123456789012345678901],"max_tokens":-0}"#.to_vec()),
    ]
}

/// The usage block of a vLLM response.
fn usage_json(prompt: u64, cached: u64) -> serde_json::Value {
    json!({
        "prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8,
        "prompt_tokens_details": {"cached_tokens": cached}
    })
}

fn scan(data: &[u8]) -> Usage {
    let mut s = UsageScanner::default();
    let split = data.first().map_or(0, |b| *b as usize % (data.len().max(1)));
    s.push(&data[..split]);
    s.push(&data[split..]);
    s.usage()
}

fn usage_scan() -> Seeds {
    let chunk = |delta: serde_json::Value, usage: serde_json::Value| {
        let v = json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "demo", "choices": delta, "usage": usage
        });
        format!("data: {v}\n\n")
    };
    let mut sse = String::new();
    for word in ["Revenue", " grew", " 12%."] {
        sse += &chunk(json!([{"index": 0, "delta": {"content": word}}]), json!(null));
    }
    sse += &chunk(json!([]), usage_json(1034, 1024));
    sse += "data: [DONE]\n\n";
    let body = json_bytes(json!({
        "id": "cmpl-2", "object": "text_completion", "model": "demo",
        "choices": [{"index": 0, "text": " there lived a cat.", "finish_reason": "length"}],
        "usage": usage_json(17, 0)
    }));
    let no_details = json_bytes(json!({
        "id": "cmpl-3", "object": "text_completion", "model": "demo", "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                  "prompt_tokens_details": null}
    }));
    // The first byte ('{', 123) picks the split: pad so that it falls inside "cached_tokens".
    let key = br#""cached_tokens""#;
    let head: &[u8] = br#""usage": {"prompt_tokens": 300, "prompt_tokens_details": {"#;
    let mut split_key = b"{".to_vec();
    split_key.extend(std::iter::repeat_n(b' ', 123 - key.len() / 2 - 1 - head.len()));
    split_key.extend_from_slice(head);
    split_key.extend_from_slice(br#""cached_tokens": 256}}}"#);
    let at = split_key.windows(key.len()).position(|w| w == key).unwrap();
    assert!(at < 123 && 123 < at + key.len(), "split at 123 is inside the key at {at}");

    assert_eq!(scan(sse.as_bytes()).cached_tokens, Some(1024));
    assert_eq!(scan(&body).prompt_tokens, Some(17));
    assert_eq!(scan(&split_key).cached_tokens, Some(256));
    let responses = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":",
        "{\"input_tokens\":1034,\"input_tokens_details\":{\"cached_tokens\":1024},",
        "\"output_tokens\":8,\"total_tokens\":1042}}}\n\n"
    );
    let messages = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":",
        "{\"input_tokens\":0,\"output_tokens\":0}}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":1034,",
        "\"output_tokens\":8,\"cache_read_input_tokens\":1024}}\n\n"
    );
    assert_eq!(scan(responses.as_bytes()).cached_tokens, Some(1024));
    assert_eq!(scan(messages.as_bytes()).cached_tokens, Some(1024));
    let mut garbage = b"data: {\"usage\": {\"cached_tokens\": \xff\xfe 12".to_vec();
    garbage.extend_from_slice(b"\x00\"prompt_tokens\":99999999999999999999999 }");
    vec![
        ("sse-stream-with-usage.txt", sse.clone().into_bytes()),
        ("json-body.json", body),
        ("usage-null-details.json", no_details),
        ("key-across-chunks.json", split_key),
        ("sse-cut-in-number.txt", sse.as_bytes()[..sse.find("1024").unwrap() + 2].to_vec()),
        ("not-utf8-and-overflow.txt", garbage),
        ("responses-sse-usage.txt", responses.as_bytes().to_vec()),
        ("messages-sse-usage.txt", messages.as_bytes().to_vec()),
    ]
}

fn config_parse() -> Seeds {
    let minimal = json_bytes(json!({"models": [{"name": "demo", "workers": ["127.0.0.1:8000"]}]}));
    let full = json_bytes(json!({
        "models": [
            {
                "name": "llama-3-8b", "workers": ["10.0.0.5:8000", "10.0.0.6:8000", "[::1]:8000"],
                "block_size": 32, "lora_name": "sql-adapter",
                "profile": {
                    "prefill_base_ms": 5.0, "prefill_ms_per_token": 0.033,
                    "prefill_ms_per_token_sq": 4.2e-7, "decode_interference_ms": 0.5,
                    "transfer_ms_per_token": 0.0026
                }
            },
            {"name": "demo", "workers": ["127.0.0.1:8001"]}
        ],
        "destination_header": "x-gateway-destination-endpoint",
        "index": {"max_blocks_per_worker": 65536, "predicted_ttl_ms": 120000,
                  "feedback_ttl_ms": 600000},
        "tie_band": {"abs_ms": 2.0, "rel": 0.05},
        "max_prompt_tokens": 262144, "max_prompt_bytes": 524288,
        "expose_decision_header": true,
        "knowledge": {"max_event_age_ms": 5000, "event_grace_ms": 2000, "max_load_age_ms": 2000}
    }));
    // A word-level tokenizer and a one-line template: the smallest bundle a config can carry.
    let tiny = json_bytes(json!({"models": [{
        "name": "tiny", "workers": ["127.0.0.1:9000"], "block_size": 4,
        "tokenizer": {
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "unk_token": "<unk>",
                      "vocab": {"<unk>": 0, "<s>": 1, "hello": 2, "world": 3}}
        },
        "tokenizer_config": {
            "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}",
            "bos_token": "<s>", "eos_token": "<unk>"
        }
    }]}));
    for c in [&minimal, &full, &tiny] {
        let cfg = FilterConfig::from_json(c).unwrap();
        Router::new(&cfg).unwrap();
    }
    let sync = json_bytes(json!({"snapshot_sync": {
        "cluster": "kvroute_updater", "authority": "kvroute-updater",
        "token": "0123456789abcdef0123", "interval_ms": 100, "timeout_ms": 1000
    }}));
    let sync_env = json_bytes(json!({"snapshot_sync": {
        "cluster": "kvroute_updater", "token_env": "KVROUTE_TOKEN"
    }}));
    for s in [&sync, &sync_env] {
        assert!(SnapshotSyncConfig::from_json(s, &crate::sync_env).unwrap().is_some());
    }
    let from_updater = json_bytes(json!({"models": [
        {"name": "qwen3", "workers": ["127.0.0.1:8000"], "bundle": "updater"},
        {"name": "pinned", "workers": ["127.0.0.1:8001"], "bundle": "00c0ffee12345678"}
    ]}));
    Router::new(&FilterConfig::from_json(&from_updater).unwrap()).unwrap();
    let sync_bundles = json_bytes(json!({"snapshot_sync": {
        "cluster": "kvroute_updater", "token_env": "KVROUTE_TOKEN",
        "bundles": {"max_bundles": 4, "max_total_bytes": 134217728, "grace_ms": 60000}
    }}));
    assert!(SnapshotSyncConfig::from_json(&sync_bundles, &crate::sync_env).unwrap().is_some());
    let unknown = json_bytes(json!({"models": [{"name": "demo", "workers": ["127.0.0.1:8000"],
                                                "blocksize": 16}]}));
    let mut not_utf8 = br#"{"models":[{"name":"d"#.to_vec();
    not_utf8.extend_from_slice(b"\xed\xa0\x80\xff");
    not_utf8.extend_from_slice(br#"","workers":["127.0.0.1:8000"]}]}"#);
    vec![
        ("minimal.json", minimal),
        ("every-field.json", full.clone()),
        ("inline-tokenizer.json", tiny),
        ("snapshot-sync.json", sync),
        ("snapshot-sync-token-env.json", sync_env),
        ("bundle-from-updater.json", from_updater),
        ("snapshot-sync-bundles.json", sync_bundles),
        ("unknown-field.json", unknown),
        ("truncated.json", truncated(&full)),
        ("deep-nesting.json", deep_json(r#"{"models":"#, 600)),
        ("not-utf8.json", not_utf8),
    ]
}

fn journal_decode() -> Seeds {
    let entry = |seq, source, worker: &str, hashes: Vec<u64>, retract| {
        let at_ms = 1_700_000_000_123;
        let e = JournalEntry { seq, at_ms, source, worker: worker.into(), hashes, retract };
        let b = e.encode();
        assert_eq!(JournalEntry::decode(&b), Ok(e));
        b
    };
    let routed = entry(7, Source::Routed, "127.0.0.1:8001", vec![1, u64::MAX], false);
    let retract = entry(8, Source::Routed, "127.0.0.1:8001", vec![1, u64::MAX], true);
    let feedback = entry(
        1 << 40,
        Source::Feedback,
        "10.0.0.5:8000",
        (0..48u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect(),
        false,
    );
    let kv = entry(0, Source::KvEvent, "[::1]:8000", vec![], false);
    let mut bad_source = routed.clone();
    bad_source[17] = 9;
    let mut not_utf8 = routed.clone();
    not_utf8[19] = 0xff;
    let mut too_many = routed[..19 + 14].to_vec();
    too_many.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut trailing = routed.clone();
    trailing.push(0);
    vec![
        ("routed.bin", routed.clone()),
        ("routed-retracted.bin", retract),
        ("feedback-48-hashes.bin", feedback),
        ("kv-event-empty.bin", kv),
        ("truncated.bin", truncated(&routed)),
        ("bad-source.bin", bad_source),
        ("worker-not-utf8.bin", not_utf8),
        ("hash-count-u32-max.bin", too_many),
        ("trailing-byte.bin", trailing),
    ]
}

fn two_snapshots() -> (Snapshot, Snapshot) {
    let w = |name: &str, gpu: Vec<u64>, off: Vec<u64>, load| SnapshotWorker {
        worker: name.into(),
        observed_at_ms: 1_700_000_000_000,
        compatible: true,
        gpu,
        offloaded: off,
        load,
        model: "Qwen/Qwen3-8B".into(),
        adapters: vec![],
    };
    let load = SnapshotLoad { running: 4, waiting: 2, observed_at_ms: 1_700_000_000_050 };
    let qwen = ModelInfo {
        name: "Qwen/Qwen3-8B".into(),
        fingerprint: 0x0123_4567_89ab_cdef,
        block_size: 16,
    };
    let demo = ModelInfo { name: "kvroute-demo".into(), fingerprint: 42, block_size: 0 };
    let a = Snapshot {
        version: 1_700_000_000_000_000,
        generated_at_ms: 1_700_000_000_100,
        models: vec![qwen.clone()],
        workers: vec![
            SnapshotWorker {
                adapters: vec!["sql-lora".into()],
                ..w("127.0.0.1:8000", vec![3, 10, 42, 1 << 63], vec![7], Some(load))
            },
            SnapshotWorker { compatible: false, ..w("127.0.0.1:8001", vec![5, 6], vec![], None) },
        ],
        peers: None,
        pool: false,
        down: vec![],
        placements: vec![],
    };
    let b = Snapshot {
        version: a.version + 3,
        generated_at_ms: a.generated_at_ms + 300,
        models: vec![qwen, demo],
        workers: vec![
            SnapshotWorker {
                adapters: vec!["sql-lora".into(), "chat-lora".into()],
                ..w("127.0.0.1:8000", vec![3, 42, 99, 1 << 63], vec![7, 10], Some(load))
            },
            SnapshotWorker {
                model: "kvroute-demo".into(),
                ..w("127.0.0.1:8002", vec![11, 12, 13], vec![], None)
            },
        ],
        peers: None,
        pool: false,
        down: vec![],
        placements: vec![],
    };
    (a, b)
}

fn snapshot_decode() -> Seeds {
    let (a, b) = two_snapshots();
    let empty = Snapshot { version: 1, generated_at_ms: 0, ..Snapshot::default() };
    let with_peers = Snapshot { peers: Some(peer_section()), ..b.clone() };
    // Format 5: the updater's whole pool, with and without peers.
    let pool = Snapshot { pool: true, ..b.clone() };
    let pool_peers = Snapshot { pool: true, ..with_peers.clone() };
    // Workers down (Envoy's health checks dropped them), with and without the pool flag.
    let down = Snapshot { down: vec!["127.0.0.1:8001".into()], ..with_peers.clone() };
    let pool_down = Snapshot { pool: true, ..down.clone() };
    // Placements the updater discovered, after the workers down.
    let placed = Snapshot { placements: placements(), ..pool_down.clone() };
    let arriving = Snapshot { peers: Some(arriving_peers()), ..placed.clone() };
    for s in
        [&a, &b, &empty, &with_peers, &pool, &pool_peers, &down, &pool_down, &placed, &arriving]
    {
        assert_eq!(Snapshot::decode(&s.encode()).as_ref(), Ok(s));
    }
    let bytes = a.encode();
    let mut old_format = bytes.clone();
    old_format[4] = 2;
    // Header (21 bytes), then the model list: its first name starts at 21 + 2 + 2.
    let mut not_utf8 = bytes.clone();
    not_utf8[25] = 0xc0;
    // No models, worker count 1, then a name of 0 bytes, no load, no model, no adapters and a
    // GPU list of u32::MAX hashes.
    let mut huge = bytes[..21].to_vec();
    huge.extend_from_slice(&0u16.to_le_bytes());
    huge.extend_from_slice(&1u32.to_le_bytes());
    huge.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    // A model count of u16::MAX.
    let mut many_models = bytes[..21].to_vec();
    many_models.extend_from_slice(&u16::MAX.to_le_bytes());
    // One worker announcing u16::MAX adapters.
    let mut many_adapters = bytes[..21].to_vec();
    many_adapters.extend_from_slice(&0u16.to_le_bytes());
    many_adapters.extend_from_slice(&1u32.to_le_bytes());
    many_adapters.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    many_adapters.extend_from_slice(&u16::MAX.to_le_bytes());
    vec![
        ("two-workers.bin", bytes.clone()),
        ("changed.bin", b.encode()),
        ("empty.bin", empty.encode()),
        ("truncated.bin", truncated(&bytes)),
        ("old-format.bin", old_format),
        ("worker-not-utf8.bin", not_utf8),
        ("hash-count-u32-max.bin", huge),
        ("model-count-u16-max.bin", many_models),
        ("adapter-count-u16-max.bin", many_adapters),
        ("with-peers.bin", with_peers.encode()),
        ("peers-truncated.bin", truncated(&with_peers.encode())),
        ("pool.bin", pool.encode()),
        ("pool-with-peers.bin", pool_peers.encode()),
        ("pool-truncated.bin", truncated(&pool_peers.encode())),
        ("workers-down.bin", down.encode()),
        ("pool-workers-down.bin", pool_down.encode()),
        ("workers-down-truncated.bin", truncated(&pool_down.encode())),
        ("placements.bin", placed.encode()),
        ("placements-truncated.bin", truncated(&placed.encode())),
        ("peer-arrivals.bin", arriving.encode()),
        ("peer-arrivals-truncated.bin", truncated(&arriving.encode())),
    ]
}

/// Two placements: one with zone and node known, one with only its site.
fn placements() -> Vec<WorkerPlacement> {
    vec![
        WorkerPlacement {
            worker: "127.0.0.1:8000".into(),
            zone: Some("us-east-1a".into()),
            node: Some("gpu-node-1".into()),
            observed_at_ms: 1_700_000_000_050,
            ..WorkerPlacement::default()
        },
        WorkerPlacement {
            worker: "127.0.0.1:8002".into(),
            site: Some("b".into()),
            ..WorkerPlacement::default()
        },
    ]
}

/// Other replicas' decisions as the updater publishes them (a load and a credit).
fn peer_section() -> PeerSection {
    PeerSection {
        ttl_ms: 10_000,
        load_ttl_ms: 3_000,
        loads: vec![PeerLoad {
            replica: 7,
            worker_key: 0x1234,
            at_ms: 1_000,
            inflight: 2,
            prefilling: 1,
            prefill_tokens: 512,
            arriving_tokens_per_s: 0,
        }],
        credits: vec![PeerCredit {
            replica: 7,
            worker: "127.0.0.1:8001".into(),
            at_ms: 1_000,
            hashes: vec![3, 42],
        }],
    }
}

/// [`peer_section`] whose load carries the replica's arrivals (snapshot sections bit 16,
/// delta bit 32).
fn arriving_peers() -> PeerSection {
    let mut s = peer_section();
    s.loads[0].arriving_tokens_per_s = 2048;
    s
}

/// Replicas' reports to the updater (`POST /v1/peers`).
fn peer_report_decode() -> Seeds {
    let s = peer_section();
    let r = PeerReport { replica: 7, seq: 1, loads: arriving_peers().loads, credits: s.credits };
    let empty = PeerReport { replica: 7, seq: 2, ..PeerReport::default() };
    let bytes = r.encode();
    let mut many_loads = bytes[..21].to_vec();
    many_loads.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut many_hashes = bytes[..21].to_vec();
    many_hashes.extend_from_slice(&0u32.to_le_bytes());
    many_hashes.extend_from_slice(&1u32.to_le_bytes());
    many_hashes.extend_from_slice(&[7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    many_hashes.extend_from_slice(&u32::MAX.to_le_bytes());
    vec![
        ("load-and-credit.bin", bytes.clone()),
        ("format-1.bin", r.encode_with(false)),
        ("empty.bin", empty.encode()),
        ("truncated.bin", truncated(&bytes)),
        ("load-count-u32-max.bin", many_loads),
        ("hash-count-u32-max.bin", many_hashes),
    ]
}

fn delta_decode() -> Seeds {
    let (a, b) = two_snapshots();
    let d = Delta::between(&a, &b);
    assert!(!d.workers.is_empty());
    let reset = Delta {
        from_version: b.version,
        to_version: b.version + 1,
        generated_at_ms: b.generated_at_ms + 100,
        models: None,
        peers: None,
        pool: false,
        removed: vec![],
        down: None,
        placements: None,
        workers: vec![WorkerDelta {
            worker: "127.0.0.1:8002".into(),
            observed_at_ms: b.generated_at_ms + 90,
            compatible: true,
            load: Some(SnapshotLoad { running: 0, waiting: 0, observed_at_ms: 0 }),
            reset: true,
            model: None,
            adapters: Some(vec!["sql-lora".into()]),
            gpu: SetChange { add: vec![21, 22], remove: vec![] },
            offloaded: SetChange::default(),
        }],
    };
    let composed = Delta::compose(&[d.clone(), reset.clone()]).unwrap();
    let noop = Delta {
        from_version: 5,
        to_version: 6,
        generated_at_ms: 0,
        models: None,
        workers: vec![],
        peers: None,
        pool: false,
        removed: vec![],
        down: None,
        placements: None,
    };
    let with_peers = Delta { peers: Some(peer_section()), ..noop.clone() };
    // Format 4: a pool delta (a worker leaves the pool, one changes), and one with peers.
    let pool_a = Snapshot { pool: true, ..a.clone() };
    let pool_b = Snapshot { pool: true, ..b.clone() };
    let pool = Delta::between(&pool_a, &pool_b);
    assert_eq!(pool.removed, ["127.0.0.1:8001"]);
    let pool_peers = Delta { peers: Some(peer_section()), ..pool.clone() };
    // The list of workers down changed: one down, then nobody.
    let down = Delta { down: Some(vec!["127.0.0.1:8001".into()]), ..pool_peers.clone() };
    let up = Delta { down: Some(vec![]), ..noop.clone() };
    // The placements changed: a new list, then none known.
    let placed = Delta { placements: Some(placements()), ..down.clone() };
    let unplaced = Delta { placements: Some(vec![]), ..noop.clone() };
    let arriving = Delta { peers: Some(arriving_peers()), ..noop.clone() };
    let all = [&d, &reset, &composed, &noop, &with_peers, &pool, &pool_peers, &down, &up, &placed];
    for x in all.into_iter().chain([&arriving]) {
        assert_eq!(Delta::decode(&x.encode()).as_ref(), Ok(x));
    }
    assert!(d.models.is_some(), "the model list changed between the two snapshots");
    let bytes = d.encode();
    // Header (29 bytes), models unchanged, then u32::MAX workers.
    let mut many_workers = bytes[..29].to_vec();
    many_workers.push(0);
    many_workers.extend_from_slice(&u32::MAX.to_le_bytes());
    // One worker whose flags byte has an unknown bit.
    let mut bad_flags = bytes[..29].to_vec();
    bad_flags.push(0);
    bad_flags.extend_from_slice(&1u32.to_le_bytes());
    bad_flags.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x80]);
    bad_flags.extend_from_slice(&[0; 16]);
    vec![
        ("between-two-snapshots.bin", bytes.clone()),
        ("reset-worker.bin", reset.encode()),
        ("composed.bin", composed.encode()),
        ("no-change.bin", noop.encode()),
        ("truncated.bin", truncated(&bytes)),
        ("a-snapshot-not-a-delta.bin", a.encode()),
        ("worker-count-u32-max.bin", many_workers),
        ("unknown-worker-flags.bin", bad_flags),
        ("peers-only.bin", with_peers.encode()),
        ("pool-removes-a-worker.bin", pool.encode()),
        ("pool-with-peers.bin", pool_peers.encode()),
        ("pool-truncated.bin", truncated(&pool_peers.encode())),
        ("workers-down.bin", down.encode()),
        ("nobody-down.bin", up.encode()),
        ("workers-down-truncated.bin", truncated(&down.encode())),
        ("placements.bin", placed.encode()),
        ("no-placement.bin", unplaced.encode()),
        ("placements-truncated.bin", truncated(&placed.encode())),
        ("peer-arrivals.bin", arriving.encode()),
        ("peer-arrivals-truncated.bin", truncated(&arriving.encode())),
    ]
}

fn shared_head_decode() -> Seeds {
    let v0 = 1_700_000_000_000_000u64;
    let head = |seq: u64, full| Head {
        version: v0 + seq,
        checked_at_ms: 1_700_000_000_500,
        full_version: full,
        seq,
    };
    let three = head(3, v0);
    let lapped = head(5_000, v0 + 4_800);
    let fresh = Head::default();
    for h in [&three, &lapped, &fresh] {
        assert_eq!(Head::decode(&h.encode()).as_ref(), Some(h));
    }
    let bytes = three.encode();
    let mut trailing = bytes.clone();
    trailing.push(0);
    // The head of before the sequence number: a ring table after the three versions.
    let mut table = bytes[..24].to_vec();
    table.push(1);
    table.extend_from_slice(&[3; 17]);
    vec![
        ("three-deltas.bin", bytes.clone()),
        ("lapped-ring.bin", lapped.encode()),
        ("fresh.bin", fresh.encode()),
        ("truncated.bin", truncated(&bytes)),
        ("ring-table.bin", table),
        ("trailing-byte.bin", trailing),
    ]
}

fn shared_load_decode() -> Seeds {
    let shard = ShardData {
        heartbeat_ms: 1_700_000_000_250,
        entries: vec![
            InflightEntry {
                id: 1,
                worker: 0x1234_5678_9abc_def0,
                started_ms: 1_700_000_000_100,
                prefill_tokens: 4096,
                prefilling: true,
                priority: 0,
            },
            InflightEntry {
                id: 2,
                worker: 0x0fed_cba9_8765_4321,
                started_ms: 1_700_000_000_200,
                prefill_tokens: 0,
                prefilling: false,
                priority: 0,
            },
        ],
    };
    let with_priority = ShardData {
        heartbeat_ms: 1_700_000_000_300,
        entries: vec![InflightEntry {
            id: 3,
            worker: 0x1234_5678_9abc_def0,
            started_ms: 1_700_000_000_290,
            prefill_tokens: 2000,
            prefilling: true,
            priority: -10,
        }],
    };
    let empty = ShardData { heartbeat_ms: 1_700_000_000_000, entries: vec![] };
    for s in [&shard, &with_priority, &empty] {
        assert_eq!(ShardData::decode(&s.encode()).as_ref(), Some(s));
    }
    let mut done = PrefillsDone::default();
    done.record(0x1234_5678_9abc_def0, 1_700_000_000_200);
    done.record(0x0fed_cba9_8765_4321, 1_700_000_000_150);
    assert_eq!(PrefillsDone::decode(&done.encode()), Some(done.clone()));
    let registry = encode_registry(&[0, 1, 2, 7]);
    assert_eq!(decode_registry(&registry), Some(vec![0, 1, 2, 7]));
    let bytes = shard.encode();
    let mut prefilling_7 = bytes.clone();
    *prefilling_7.last_mut().unwrap() = 7;
    let mut huge = bytes[..9].to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut too_many = (MAX_SHARDS as u32 + 1).to_le_bytes().to_vec();
    too_many.extend(std::iter::repeat_n(0u8, 16));
    vec![
        ("shard-two-entries.bin", bytes.clone()),
        ("shard-empty.bin", empty.encode()),
        ("shard-with-priority.bin", with_priority.encode()),
        ("done-two-workers.bin", done.encode()),
        ("registry-four.bin", registry),
        ("registry-empty.bin", encode_registry(&[])),
        ("shard-truncated.bin", truncated(&bytes)),
        ("shard-flag-byte-7.bin", prefilling_7),
        ("shard-count-u32-max.bin", huge),
        ("registry-count-over-max.bin", too_many),
    ]
}

fn msgpack(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

fn ints(it: impl IntoIterator<Item = u64>) -> Value {
    Value::Array(it.into_iter().map(Value::from).collect())
}

fn batch(ts: Value, events: Vec<Value>, rank: Value) -> Vec<u8> {
    msgpack(&Value::Array(vec![ts, Value::Array(events), rank]))
}

fn event_decode() -> Seeds {
    // vLLM's positional form: [tag, block_hashes, parent, token_ids, block_size, lora_id,
    // medium, lora_name, extra_keys], as kvroute-sim publishes it (golden bytes in sim/).
    let mut golden = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x9a, 0xab];
    golden.extend_from_slice(b"BlockStored");
    golden.extend_from_slice(&[0x91, 0x07, 0xc0, 0x94, 1, 2, 3, 4, 4, 0xc0, 0xa3]);
    golden.extend_from_slice(b"GPU");
    golden.extend_from_slice(&[0xc0, 0xc0, 0x00, 0x00]);
    let stored = |hashes: Value, parent: Value, tokens: u64, medium: &str, lora: Value, extra| {
        Value::Array(vec![
            "BlockStored".into(),
            hashes,
            parent,
            ints(100..100 + tokens),
            16.into(),
            Value::Nil,
            medium.into(),
            lora,
            extra,
        ])
    };
    let salted = Value::Array(vec![Value::Array(vec!["tenant-a".into()]), Value::Nil]);
    let array_form = batch(
        Value::F64(1_700_000_000.25),
        vec![
            stored(ints([11, 12]), Value::Nil, 32, "GPU", Value::Nil, salted),
            stored(ints([13]), 12.into(), 16, "GPU", "sql-adapter".into(), Value::Nil),
            Value::Array(vec!["BlockRemoved".into(), ints([11]), "GPU".into()]),
            stored(ints([11]), Value::Nil, 16, "CPU", Value::Nil, Value::Nil),
            Value::Array(vec!["AllBlocksCleared".into()]),
        ],
        1.into(),
    );
    let map_form = batch(
        Value::F64(1.5),
        vec![
            map(vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints([7, 8])),
                ("parent_block_hash", 6.into()),
                ("token_ids", ints(0..8)),
                ("block_size", 4.into()),
                ("medium", "cpu_pinned".into()),
            ]),
            map(vec![
                ("type", "BlockRemoved".into()),
                ("block_hashes", ints([7])),
                ("medium", "CPU".into()),
            ]),
            map(vec![("type", "AllBlocksCleared".into())]),
        ],
        Value::Nil,
    );
    // SGLang: one hash per page, bytes or negative-integer hashes, salt in metadata or in a
    // trailing map, integer timestamps, and event kinds kvroute does not know.
    let sglang = batch(
        Value::from(1_700_000_000u64),
        vec![
            map(vec![
                ("type", "BlockStoredWithMetadata".into()),
                ("block_hashes", Value::Binary(vec![0xde, 0xad, 0xbe, 0xef])),
                ("parent_block_hash", Value::from(-5i64)),
                ("token_ids", ints(1..=4)),
                ("block_size", 4.into()),
                ("metadata", map(vec![("cache_salt", "tenant-b".into())])),
            ]),
            Value::Array(vec![
                "BlockStored".into(),
                Value::from(-1i64),
                Value::Nil,
                ints(5..=8),
                4.into(),
                Value::Nil,
                Value::Nil,
                Value::Nil,
                Value::Nil,
                map(vec![("cache_salt", "tenant-c".into())]),
            ]),
            map(vec![("type", "BlockRemoved".into()), ("block_hashes", "page-9".into())]),
            map(vec![("type", "KVCacheResized".into()), ("num_blocks", 1024.into())]),
        ],
        Value::Nil,
    );
    for (b, n) in [(&golden, 1), (&array_form, 5), (&map_form, 3), (&sglang, 4)] {
        assert_eq!(decode_batch(b).unwrap().events.len(), n);
    }
    assert!(matches!(
        &decode_batch(&array_form).unwrap().events[0],
        EngineEvent::Stored(s) if s.salt.as_deref() == Some("tenant-a")
    ));
    // vLLM 0.33: per-group stores with their kind, an offloading placeholder (no token ids,
    // block size 0), a remote block, lookahead tokens, an unknown medium, a reset.
    let vllm_033 = batch(
        Value::F64(2.0),
        vec![
            map(vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints([21, 22])),
                ("parent_block_hash", Value::Nil),
                ("token_ids", ints(0..32)),
                ("block_size", 16.into()),
                ("lora_id", Value::Nil),
                ("medium", "GPU".into()),
                ("lora_name", Value::Nil),
                ("group_idx", 0.into()),
                ("kv_cache_spec_kind", "full_attention".into()),
                ("lookahead_token_ids", Value::Array(vec![ints([16]), ints([32])])),
            ]),
            map(vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints([21, 22])),
                ("parent_block_hash", Value::Nil),
                ("token_ids", ints(0..32)),
                ("block_size", 16.into()),
                ("group_idx", 1.into()),
                ("kv_cache_spec_kind", "sliding_window".into()),
                ("kv_cache_spec_sliding_window", 128.into()),
            ]),
            map(vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints([22])),
                ("parent_block_hash", Value::Nil),
                ("token_ids", ints(std::iter::empty())),
                ("block_size", 0.into()),
                ("medium", "CPU".into()),
                ("group_idx", 0.into()),
            ]),
            map(vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints([23])),
                ("parent_block_hash", 22.into()),
                ("token_ids", ints(32..48)),
                ("block_size", 16.into()),
                ("medium", "CPU".into()),
                ("locality", "REMOTE".into()),
            ]),
            map(vec![
                ("type", "BlockRemoved".into()),
                ("block_hashes", ints([21])),
                ("medium", "LocalDiskBackend".into()),
                ("group_idx", 1.into()),
            ]),
            map(vec![("type", "AllBlocksCleared".into())]),
        ],
        0.into(),
    );
    // SGLang 0.5.23: page size 1 (a node's pages in one event), EAGLE's token pairs, the
    // HiCache host tier, a bad event among good ones.
    let pair = |a: u64| ints([a, a + 1]);
    let sglang_0523 = batch(
        Value::F64(3.0),
        vec![
            map(vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints(1..=5)),
                ("parent_block_hash", Value::Nil),
                ("token_ids", ints(100..105)),
                ("block_size", 1.into()),
                ("medium", "GPU".into()),
            ]),
            map(vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints([6, 7])),
                ("parent_block_hash", 5.into()),
                ("token_ids", Value::Array(vec![pair(105), pair(106)])),
                ("block_size", 1.into()),
                ("medium", "CPU_PINNED".into()),
                ("cache_salt", "tenant-d".into()),
            ]),
            map(vec![("type", "BlockStored".into()), ("block_hashes", ints([8]))]),
            map(vec![
                ("type", "BlockRemoved".into()),
                ("block_hashes", ints([7, 6])),
                ("medium", "CPU_PINNED".into()),
            ]),
        ],
        Value::Nil,
    );
    for (b, n) in [(&vllm_033, 6), (&sglang_0523, 4)] {
        assert_eq!(decode_batch(b).unwrap().events.len(), n);
    }
    let big_token = batch(
        Value::F64(0.0),
        vec![stored(ints([1]), Value::Nil, 0, "GPU", Value::Nil, Value::Nil)]
            .into_iter()
            .map(|mut e| {
                if let Value::Array(a) = &mut e {
                    a[3] = ints([u64::from(u32::MAX) + 1]);
                }
                e
            })
            .collect(),
        Value::Nil,
    );
    let mut not_utf8_tag = vec![0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xab];
    not_utf8_tag.extend_from_slice(b"Block\xffStored");
    not_utf8_tag.push(0xc0);
    // An array header claiming 2^32 - 1 elements, and 3000 nested one-element arrays.
    let huge_len = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff];
    let mut deep = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0];
    deep.extend(std::iter::repeat_n(0x91, 3000));
    deep.push(0xc0);
    // Size-amplification shapes, small: real elements of one byte each (nils, nil map pairs),
    // maps nested as deep as the bytes allow, and lengths far past the bytes.
    let head = || vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0];
    let mut nils = head();
    nils.extend([0xdd, 0, 0, 0x13, 0x88]);
    nils.extend(std::iter::repeat_n(0xc0, 5000));
    nils.push(0xc0);
    let mut nested = head();
    nested.push(0x91);
    for _ in 0..1000 {
        nested.extend([0x81, 0xc0]);
    }
    nested.extend([0xc0, 0xc0]);
    let mut wide = head();
    wide.extend([0x91, 0xde, 0x03, 0xe8]);
    wide.extend(std::iter::repeat_n(0xc0, 2000));
    wide.push(0xc0);
    let declared = |marker: u8| {
        let mut b = head();
        b.push(marker);
        b.extend([0xff; 4]);
        b.extend([0xc0; 8]);
        b
    };
    vec![
        ("vllm-array-golden.msgpack", golden),
        ("vllm-array-salt-lora-cpu.msgpack", array_form.clone()),
        ("vllm-map-form.msgpack", map_form),
        ("sglang-variants.msgpack", sglang),
        ("vllm-033-groups-offload.msgpack", vllm_033),
        ("sglang-0523-pages-pairs.msgpack", sglang_0523),
        ("token-id-over-u32.msgpack", big_token),
        ("truncated.msgpack", truncated(&array_form)),
        ("tag-not-utf8.msgpack", not_utf8_tag),
        ("array-len-u32-max.msgpack", huge_len),
        ("deep-nesting.msgpack", deep),
        ("bomb-nils-5000.msgpack", nils),
        ("bomb-nested-maps.msgpack", nested),
        ("bomb-wide-map.msgpack", wide),
        ("bomb-map32-max.msgpack", declared(0xdf)),
        ("bomb-str32-4gib.msgpack", declared(0xdb)),
        ("bomb-bin32-4gib.msgpack", declared(0xc6)),
    ]
}

/// Every generated seed, by target.
pub fn all() -> Vec<(&'static str, Seeds)> {
    vec![
        ("request_parse", request_parse()),
        ("request_scan", crate::scan_seeds::request_scan()),
        ("journal_decode", journal_decode()),
        ("usage_scan", usage_scan()),
        ("config_parse", config_parse()),
        ("snapshot_decode", snapshot_decode()),
        ("event_decode", event_decode()),
        ("delta_decode", delta_decode()),
        ("shared_head_decode", shared_head_decode()),
        ("shared_load_decode", shared_load_decode()),
        ("shared_protocol", shared_protocol()),
        ("zmtp_frames", zmtp_frames()),
        ("bundle_decode", bundle_decode()),
        ("compiled_encoder", compiled_encoder()),
        ("admission_headers", admission_headers()),
        ("peer_report_decode", peer_report_decode()),
        ("calib_decode", calib_decode()),
        ("calib_steps_decode", crate::steps_seeds::calib_steps_decode()),
        ("kube_watch_event", kube_watch_event()),
        ("priority_field", crate::priority_seeds::priority_field()),
    ]
}

/// A watch stream: one `metav1.WatchEvent` a line, as the API server writes it.
fn watch_lines(events: &[(&str, serde_json::Value)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, object) in events {
        out.extend(json_bytes(json!({"type": kind, "object": object})));
        out.push(b'\n');
    }
    out
}

/// Watch streams of EndpointSlices and Pods as the API server sends them (k8s.io/api
/// `discovery/v1`, `core/v1`): ADDED, MODIFIED, DELETED, BOOKMARK, ERROR 410; ready, not ready,
/// unknown and terminating endpoints, pods being deleted, IPv6 and FQDN slices, odd ports;
/// then a truncated stream, a line that is not JSON, a deeply nested object.
fn kube_watch_event() -> Seeds {
    let slice = |name: &str, rv: &str, ty: &str, endpoints: serde_json::Value, ports| {
        json!({
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                         "labels": {"kubernetes.io/service-name": "vllm"}},
            "addressType": ty, "endpoints": endpoints, "ports": ports
        })
    };
    let ep = |addr: &str, ready: serde_json::Value| {
        json!({"addresses": [addr], "conditions": {"ready": ready, "serving": ready,
               "terminating": ready == json!(false)}, "nodeName": "n1", "zone": "us-east-1a"})
    };
    let http_ports = json!([{"name": "http", "port": 8000, "protocol": "TCP"},
                            {"name": "kv-events", "port": 5557, "protocol": "TCP"}]);
    let v4 = |rv, second_ready| {
        slice(
            "vllm-abc12",
            rv,
            "IPv4",
            json!([ep("10.0.0.1", json!(true)), ep("10.0.0.2", second_ready),
                   {"addresses": ["10.0.0.3"], "conditions": {}}]),
            http_ports.clone(),
        )
    };
    let v6 = slice(
        "vllm-v6xyz",
        "21",
        "IPv6",
        json!([ep("fd00::1", json!(true)), ep("fd00::2", json!(null))]),
        http_ports.clone(),
    );
    let fqdn =
        slice("vllm-fqdn", "22", "FQDN", json!([ep("vllm-0.example", json!(true))]), json!([]));
    let odd_ports = |name, port: serde_json::Value| {
        slice(
            name,
            "30",
            "IPv4",
            json!([ep("10.0.1.1", json!(true))]),
            json!([{"name": "http", "port": port}, {"port": 8000}]),
        )
    };
    let pod = |name: &str, rv: &str, ip: &str, ready: &str, deleting: bool| {
        let mut meta = json!({"name": name, "namespace": "ns", "resourceVersion": rv,
                              "labels": {"app": "vllm"}});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": meta,
               "spec": {"containers": [{"name": "vllm", "ports": [{"containerPort": 8000}]}]},
               "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                          "conditions": [{"type": "PodScheduled", "status": "True"},
                                         {"type": "Ready", "status": ready}]}})
    };
    let bookmark = |rv| {
        json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
               "metadata": {"resourceVersion": rv,
                            "annotations": {"k8s.io/initial-events-end": "true"}}})
    };
    let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": "too old resource version: 7 (12)", "reason": "Expired",
                      "code": 410});
    let slices = watch_lines(&[
        ("ADDED", v4("7", json!(false))),
        ("MODIFIED", v4("8", json!(true))),
        ("DELETED", v4("9", json!(true))),
    ]);
    let pods = watch_lines(&[
        ("ADDED", pod("vllm-0", "40", "10.0.2.1", "True", false)),
        ("ADDED", pod("vllm-1", "41", "10.0.2.2", "False", false)),
        ("MODIFIED", pod("vllm-1", "42", "10.0.2.2", "True", false)),
        ("MODIFIED", pod("vllm-0", "43", "10.0.2.1", "True", true)),
        ("DELETED", pod("vllm-0", "44", "10.0.2.1", "True", true)),
    ]);
    // Starts with a blank line (the first byte picks the read size), and has one in between.
    let mut multi = b"\n".to_vec();
    multi.extend(watch_lines(&[
        ("ADDED", v4("7", json!(true))),
        ("ADDED", v6),
        ("ADDED", fqdn),
        ("BOOKMARK", bookmark("23")),
        ("ADDED", pod("vllm-0", "24", "10.0.2.1", "True", false)),
    ]));
    multi.extend(b" \r\n");
    multi.extend(watch_lines(&[
        ("MODIFIED", v4("25", json!(false))),
        ("DELETED", v4("26", json!(false))),
    ]));
    let mut not_json = watch_lines(&[("ADDED", v4("7", json!(true)))]);
    not_json.extend(b"{\"type\": \"ADDED\", \"object\": nope}\n");
    let mut deep = deep_json(r#"{"type":"ADDED","object":"#, 600);
    deep.push(b'\n');
    vec![
        ("endpointslice-added-modified-deleted.jsonl", slices),
        ("bookmark.jsonl", watch_lines(&[("BOOKMARK", bookmark("12"))])),
        (
            "error-410.jsonl",
            watch_lines(&[
                ("ADDED", v4("7", json!(true))),
                ("ERROR", gone),
                ("ADDED", v4("13", json!(true))),
            ]),
        ),
        ("pods.jsonl", pods),
        (
            "odd-ports.jsonl",
            watch_lines(&[
                ("ADDED", odd_ports("port-zero", json!(0))),
                ("ADDED", odd_ports("port-over-u16", json!(70_000))),
                ("ADDED", odd_ports("port-negative", json!(-1))),
                ("ADDED", odd_ports("port-not-a-number", json!("8000"))),
            ]),
        ),
        ("multi-event.jsonl", multi.clone()),
        ("truncated.jsonl", truncated(&multi)),
        ("not-json.jsonl", not_json),
        ("deep-nesting.jsonl", deep),
    ]
}

/// A fresh state, one that learned from a few samples on two workers, and hostile ones:
/// truncated, another version, a NaN, an absurd worker count.
fn calib_decode() -> Seeds {
    use kvroute_core::decision::calib::{CalibrationConfig, ModelState, Sample};
    use kvroute_core::decision::cost::Profile;
    let fresh = ModelState::new(&Profile::default());
    let mut learned = fresh.clone();
    for i in 0..20u64 {
        let s = Sample {
            worker: format!("127.0.0.1:{}", 8000 + i % 2),
            uncached_tokens: 100 * i,
            cached_tokens: 0,
            load: Default::default(),
            fixed_ms: 0.0,
            observed_ms: 5.0 + 0.01 * (100 * i) as f64,
            priority: 0,
            passed: false,
            fill_ms: 0.0,
            wait_factor: 1.0,
        };
        learned.observe(&CalibrationConfig::default(), &s);
    }
    let good = learned.encode();
    // Behind a queue, at two engine priorities: their promise quantiles kept apart.
    let mut by_priority = learned.clone();
    for i in 0..20u64 {
        let s = Sample {
            worker: "127.0.0.1:8000".into(),
            uncached_tokens: 500,
            cached_tokens: 0,
            load: kvroute_core::decision::load::WorkerLoad {
                inflight_requests: 1,
                prefilling_requests: 1,
                prefill_tokens: 500,
                prefill_elapsed_ms: 0,
                prefill_sq_tokens: 250_000,
                arriving_tokens_per_s: 0,
                behind_tokens: 0,
                passing_tokens_per_s: 0,
            },
            fixed_ms: 0.0,
            observed_ms: 30.0 + i as f64,
            priority: if i % 2 == 0 { 0 } else { 10 },
            passed: false,
            fill_ms: 0.0,
            wait_factor: 1.0,
        };
        by_priority.observe(&CalibrationConfig::default(), &s);
    }
    assert!(!by_priority.priorities.is_empty());
    let mut version = good.clone();
    version[3] = 9;
    let mut nan = good.clone();
    nan[4..12].copy_from_slice(&f64::NAN.to_le_bytes());
    let mut many = fresh.encode();
    let n = many.len();
    many[n - 2..].copy_from_slice(&u16::MAX.to_le_bytes());
    vec![
        ("fresh.bin", fresh.encode()),
        ("learned.bin", good.clone()),
        ("learned-priorities.bin", by_priority.encode()),
        ("truncated.bin", truncated(&good)),
        ("version.bin", version),
        ("nan.bin", nan),
        ("many-workers.bin", many),
    ]
}

/// Deadline and priority header values (split at the first byte, see the target): plain,
/// padded, huge, signed, fractional, not UTF-8.
fn admission_headers() -> Seeds {
    let pair = |deadline: &[u8], priority: &[u8]| {
        let mut v = vec![deadline.len() as u8];
        v.extend_from_slice(deadline);
        v.extend_from_slice(priority);
        v
    };
    vec![
        ("plain.bin", pair(b"250", b"batch")),
        ("padded-case.bin", pair(b" 1500\t", b"\tInterActive ")),
        ("huge.bin", pair(b"99999999999999999999999999", b"batch")),
        ("signed-fraction.bin", pair(b"-1.5e3", b"")),
        ("not-utf8.bin", pair(b"\xff\xfe12", b"\xc3\x28batch")),
        ("empty.bin", Vec::new()),
    ]
}

/// The demo tokenizer with only its first `merges` merges, compiled (small enough for a seed).
fn small_compiled(merges: usize) -> Vec<u8> {
    use kvroute_core::decision::tokenize::model::{DEMO_TOKENIZER_CONFIG, DEMO_TOKENIZER_JSON};
    let mut v: serde_json::Value = serde_json::from_str(DEMO_TOKENIZER_JSON).unwrap();
    let m = v["model"]["merges"].as_array_mut().unwrap();
    m.truncate(merges);
    let b = ModelBundle::from_hf(&v.to_string(), DEMO_TOKENIZER_CONFIG).unwrap();
    b.compiled_encoder().unwrap()
}

/// A compiled encoder with a few merges; truncated; a merge count of `u32::MAX`; a split
/// pattern that does not compile; a bad format byte.
fn compiled_encoder() -> Seeds {
    let enc = small_compiled(40);
    // Magic, format, NFC flag, pattern count, then the first pattern's length and text.
    let mut bad_pattern = enc.clone();
    bad_pattern[14] = b'(';
    let mut format = enc.clone();
    format[4] = 7;
    // Where the merge count is: after the patterns, the 256 byte ids and the added tokens.
    let u32_at = |i: usize| u32::from_le_bytes(enc[i..i + 4].try_into().unwrap()) as usize;
    let mut at = 10;
    for _ in 0..u32_at(6) {
        at += 4 + u32_at(at);
    }
    at += 1024;
    let added = u32_at(at);
    at += 4;
    for _ in 0..added {
        at += 8 + u32_at(at + 4);
    }
    assert_eq!(u32_at(at), 40, "the merge count");
    let mut count_max = enc[..at].to_vec();
    count_max.extend_from_slice(&u32::MAX.to_le_bytes());
    vec![
        ("compiled.bin", enc.clone()),
        ("compiled-truncated.bin", truncated(&enc)),
        ("compiled-merges-u32-max.bin", count_max),
        ("compiled-bad-pattern.bin", bad_pattern),
        ("compiled-format.bin", format),
    ]
}

/// A small bundle, the manifest naming it, the updater's list; then truncations, a flipped
/// checksum, absurd counts and lengths, and JSON the list parser must refuse.
fn bundle_decode() -> Seeds {
    use kvroute_core::shared::bundles::{Manifest, PublishedBundle, Retired};
    use kvroute_core::wire::bundle::BundleFiles;
    let files = BundleFiles {
        tokenizer_json:
            br#"{"model":{"type":"WordLevel","vocab":{"<unk>":0},"unk_token":"<unk>"}}"#.to_vec(),
        tokenizer_config_json: br#"{"chat_template":"{{ messages[0]['content'] }}"}"#.to_vec(),
    };
    let bundle = files.encode();
    let mut flipped = bundle.clone();
    flipped[12] ^= 1;
    let mut file_len_max = bundle[..5].to_vec();
    file_len_max.extend_from_slice(&u32::MAX.to_le_bytes());
    let manifest = Manifest {
        generation: 3,
        models: vec![
            PublishedBundle {
                model: "qwen3".into(),
                fingerprint: 0x1234,
                parts: 11,
                bytes: 11 << 20,
            },
            PublishedBundle {
                model: "kvroute-demo".into(),
                fingerprint: 0x77,
                parts: 1,
                bytes: 105_157,
            },
        ],
        retired: vec![Retired {
            fingerprint: 0x99,
            parts: 1,
            bytes: 10,
            since_ms: 1_700_000_000_000,
        }],
    }
    .encode();
    let mut count_max = manifest[..13].to_vec();
    count_max.extend_from_slice(&u16::MAX.to_le_bytes());
    let list = json_bytes(json!({"bundles": [
        {"model": "qwen3", "fingerprint": "0000000000001234", "parts": 11, "bytes": 11 << 20},
        {"model": "kvroute-demo", "fingerprint": "0000000000000077", "parts": 1, "bytes": 105_157}
    ]}));
    let bad_list = json_bytes(json!({"bundles": [
        {"model": "", "fingerprint": "xyz", "parts": 0, "bytes": 0},
        {"model": "m", "fingerprint": "0000000000000001", "parts": 99, "bytes": 1}
    ]}));
    let compiled = kvroute_core::wire::bundle::CompiledBundle {
        fingerprint: 0x77,
        encoder: small_compiled(8),
        tokenizer_config_json: files.tokenizer_config_json.clone(),
    }
    .encode();
    vec![
        ("bundle.bin", bundle.clone()),
        ("bundle-compiled.bin", compiled),
        ("bundle-truncated.bin", truncated(&bundle)),
        ("bundle-checksum-flipped.bin", flipped),
        ("bundle-file-len-u32-max.bin", file_len_max),
        ("manifest.bin", manifest.clone()),
        ("manifest-truncated.bin", truncated(&manifest)),
        ("manifest-count-u16-max.bin", count_max),
        ("list.json", list),
        ("list-bad-entries.json", bad_list),
        ("list-deep-nesting.json", deep_json(r#"{"bundles":"#, 600)),
    ]
}

/// ZMTP as a vLLM publisher sends it: greeting, READY, then three-frame messages; then a frame
/// that announces far more than it carries, a command frame over the cap, too many frames.
fn zmtp_frames() -> Seeds {
    let frame = |flags: u8, body: &[u8]| {
        let mut v = if body.len() > 255 {
            let mut v = vec![flags | 0b010];
            v.extend_from_slice(&(body.len() as u64).to_be_bytes());
            v
        } else {
            vec![flags, body.len() as u8]
        };
        v.extend_from_slice(body);
        v
    };
    let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0];
    greeting.extend_from_slice(b"NULL");
    greeting.resize(64, 0);
    let mut healthy = greeting.clone();
    healthy.extend(frame(0b100, b"\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB"));
    for seq in 0u64..3 {
        healthy.extend(frame(0b001, b"kv-events"));
        healthy.extend(frame(0b001, &seq.to_be_bytes()));
        healthy.extend(frame(0, &[0x93; 40]));
    }
    let mut huge = greeting.clone();
    huge.push(0b010);
    huge.extend_from_slice(&(1u64 << 62).to_be_bytes());
    huge.extend_from_slice(&[0; 32]);
    let mut big_command = greeting.clone();
    big_command.extend(frame(0b100, &[7; 300]));
    let mut many = greeting.clone();
    for _ in 0..10 {
        many.extend(frame(0b001, b"x"));
    }
    many.extend(frame(0, b"end"));
    let mut over_cap = greeting;
    over_cap.extend(frame(0b001, b"kv-events"));
    over_cap.extend(frame(0, &[1; 400]));
    vec![
        ("three-batches.bin", healthy.clone()),
        ("truncated.bin", truncated(&healthy)),
        ("announces-2-62-bytes.bin", huge),
        ("command-over-cap.bin", big_command),
        ("eleven-frames.bin", many),
        ("frame-over-cap.bin", over_cap),
    ]
}

/// Shared data as a running deployment leaves it: a published snapshot and deltas, journal
/// entries, two threads' load shards; then the same with damage.
fn shared_protocol() -> Seeds {
    use kvroute_core::decision::config::sync::JournalLimits;
    use kvroute_core::decision::config::sync::LoadLimits;
    use kvroute_core::shared::fake::{MemStore, Tally};
    use kvroute_core::shared::journal;
    use kvroute_core::shared::knowledge::KnowledgePublisher;
    use kvroute_core::shared::load::Shard;
    use kvroute_core::wire::DecodeLimits;
    let (old, new) = two_snapshots();
    let store = MemStore::new();
    let t = Tally::default();
    let mut p = KnowledgePublisher::new(DecodeLimits::default());
    p.take(&store, old.encode()).unwrap();
    p.take(&store, Delta::between(&old, &new).encode()).unwrap();
    p.confirmed(&store, 1_700_000_000_500);
    let entry = |worker: &str, retract| {
        let e = JournalEntry {
            seq: 0,
            at_ms: 1_700_000_000_400,
            source: kvroute_core::wire::journal::Source::Routed,
            worker: worker.into(),
            hashes: vec![1, 2, 3],
            retract,
        };
        journal::append(&store, &t, &JournalLimits::default(), e);
    };
    entry("127.0.0.1:1", false);
    entry("127.0.0.1:2", true);
    // The shard counter exists already (a thread that creates it takes an id outside the
    // protocol keys' 0..4): these two shards are 0 and 1.
    store.poke("kvroute.load.next_shard", &0u64.to_le_bytes());
    for k in 0..2 {
        let mut s = Shard::register(&store, &t, LoadLimits::default(), 1_700_000_000_000, k);
        // The second thread records passes: an urgent request answered on its worker.
        s.record_passes((k == 1).then_some(0));
        let answered = s.start_at(&t, "127.0.0.1:1", (512, -(k as i32)), 1_700_000_000_050);
        s.prefill_ended(answered, 1_700_000_000_300);
        s.start(&t, "127.0.0.1:1", 512, 1_700_000_000_100);
        s.flush(&store, &t, 1_700_000_000_900);
    }
    let healthy = crate::protocol_records(&store);
    let keys = crate::protocol_keys();
    let damaged = |key: &str, bytes: &[u8]| {
        let copy = MemStore::new();
        for k in &keys {
            if let Some(v) = kvroute_core::shared::SharedStore::get(&store, k).0 {
                copy.poke(k, &v);
            }
        }
        copy.poke(key, bytes);
        crate::protocol_records(&copy)
    };
    vec![
        ("healthy.bin", healthy.clone()),
        ("truncated.bin", truncated(&healthy)),
        ("head-garbage.bin", damaged(&keys[0], b"\x01\x02\x03")),
        ("delta-slot-garbage.bin", damaged(&keys[3], b"KVRD\x01\xff\xff")),
        ("journal-head-far-ahead.bin", damaged(&keys[6], &u64::MAX.to_le_bytes())),
        ("registry-garbage.bin", damaged(&keys[11], &[0xff; 9])),
        ("shard-truncated.bin", damaged(&keys[12], &[1, 2, 3])),
        ("done-table-truncated.bin", damaged(&keys[16], &[1, 2, 0, 0, 0, 9])),
        ("passed-table-truncated.bin", damaged(&keys[21], &[1, 1, 0, 0, 0, 9])),
    ]
}

#[test]
fn seeds_are_committed_and_current() {
    let write = std::env::var_os("KVROUTE_WRITE_SEEDS").is_some_and(|v| v == "1");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut stale = Vec::new();
    for (target, seeds) in all() {
        let dir = root.join(target);
        let total: usize = seeds.iter().map(|(_, b)| b.len()).sum();
        assert!(total <= 16 * 1024, "{target}: {total} bytes of seeds, keep them small");
        if write {
            std::fs::create_dir_all(&dir).unwrap();
        }
        for (name, bytes) in seeds {
            let path = dir.join(name);
            if write {
                std::fs::write(&path, &bytes).unwrap();
            } else if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
                stale.push(format!("{target}/{name}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "seeds missing or stale (KVROUTE_WRITE_SEEDS=1 cargo test --manifest-path \
         fuzz/Cargo.toml seeds rewrites them): {stale:?}"
    );
}
