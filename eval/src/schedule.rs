//! An open-loop arrival schedule: made once from a workload and its seed, replayed identically
//! by every policy (its hash is printed in the report).

use std::time::Duration;

use serde_json::Value;

/// One scheduled request.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    /// Arrival, from the start of the run.
    pub at: Duration,
    /// The OpenAI chat body (streaming, with usage), sent to `/v1/chat/completions`.
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
