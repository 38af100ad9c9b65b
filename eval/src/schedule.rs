//! An open-loop arrival schedule: made once from a workload and its seed, replayed identically
//! by every policy (its hash is printed in the report).

use std::time::Duration;

use serde_json::Value;

/// The OpenAI chat endpoint.
pub const CHAT: &str = "/v1/chat/completions";
/// The OpenAI completions endpoint (token-id prompts).
pub const COMPLETIONS: &str = "/v1/completions";

/// One scheduled request.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    /// Arrival, from the start of the run (engine time: divided by the workers' speedup and
    /// the run's rate scale when sent).
    pub at: Duration,
    /// Where it is sent: [`CHAT`] or [`COMPLETIONS`].
    pub endpoint: &'static str,
    /// The OpenAI body (streaming, with usage).
    pub body: Value,
    /// Fixed output length (`max_tokens`; the sims generate exactly this many).
    pub output_tokens: u64,
    /// Cohort tags known before routing (e.g. `hot-prefix`, `tenant:b`, `turn-1`).
    pub cohorts: Vec<String>,
}

/// A fingerprint of a schedule (times, bodies, tags).
pub fn hash(s: &[Scheduled]) -> u64 {
    let mut bytes = Vec::new();
    for a in s {
        bytes.extend_from_slice(&(a.at.as_micros() as u64).to_le_bytes());
        if a.endpoint != CHAT {
            bytes.extend_from_slice(a.endpoint.as_bytes());
        }
        bytes.extend_from_slice(a.body.to_string().as_bytes());
        bytes.extend_from_slice(&a.output_tokens.to_le_bytes());
        for c in &a.cohorts {
            bytes.extend_from_slice(c.as_bytes());
            bytes.push(0);
        }
    }
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// A streaming chat body with one user message (usage included, fixed output length).
pub fn chat_body(model: &str, messages: Vec<Value>, output_tokens: u64) -> Value {
    serde_json::json!({
        "model": model,
        "messages": messages,
        "max_tokens": output_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// A streaming completions body whose prompt is token ids (usage included, fixed output
/// length): nothing on the way tokenizes it.
pub fn completions_body(model: &str, ids: &[u32], output_tokens: u64) -> Value {
    serde_json::json!({
        "model": model,
        "prompt": ids,
        "max_tokens": output_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}
