//! Seeded multi-turn conversations (the evaluation harness turns them into schedules, see
//! `eval::workloads`).

use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_testkit::textgen;
use serde_json::{json, Value};

/// Words of `textgen` text per token of `bundle`, measured on a 2 000-word sample, so that a
/// tool can size a prompt in tokens.
pub fn words_per_token(bundle: &ModelBundle) -> anyhow::Result<f64> {
    let words = 2000;
    let tokens = bundle.encode(&textgen::words(11, words), false)?.len();
    Ok(words as f64 / tokens.max(1) as f64)
}

/// A conversation: a long system prompt (its shared context) and the user's turns. Assistant
/// answers in the history are synthetic and fixed, so every policy sends identical bodies.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub id: usize,
    pub system: String,
    pub users: Vec<String>,
    pub answers: Vec<String>,
}

impl Conversation {
    pub fn new(seed: u64, id: usize, system_words: usize, user_words: usize, turns: usize) -> Self {
        let s = seed.wrapping_mul(1_000_003).wrapping_add(id as u64 * 7919);
        Conversation {
            id,
            system: textgen::words(s, system_words),
            users: (0..turns).map(|t| textgen::words(s + 1 + 2 * t as u64, user_words)).collect(),
            answers: (0..turns).map(|t| textgen::words(s + 2 + 2 * t as u64, user_words)).collect(),
        }
    }

    /// The chat body of turn `turn` (0-based): system, then every earlier exchange, then the
    /// user's new message.
    pub fn body(&self, model: &str, turn: usize, max_tokens: u64, stream: bool) -> Value {
        let mut messages = vec![json!({"role": "system", "content": self.system})];
        for t in 0..turn {
            messages.push(json!({"role": "user", "content": self.users[t]}));
            messages.push(json!({"role": "assistant", "content": self.answers[t]}));
        }
        messages.push(json!({"role": "user", "content": self.users[turn]}));
        let mut b = json!({"model": model, "messages": messages, "max_tokens": max_tokens});
        if stream {
            b["stream"] = json!(true);
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_turns_extend_earlier_ones() {
        let c = Conversation::new(3, 0, 50, 10, 3);
        let t0 = c.body("m", 0, 8, false);
        let t2 = c.body("m", 2, 8, false);
        assert_eq!(t0["messages"][0], t2["messages"][0]);
        assert_eq!(t0["messages"][1], t2["messages"][1]);
        assert_eq!(t2["messages"].as_array().map(Vec::len), Some(6));
    }
}
