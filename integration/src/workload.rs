//! Seeded multi-turn chat workloads, turned once into an open-loop arrival schedule that every
//! policy replays identically.

use std::time::Duration;

use kvroute_core::textgen;
use serde_json::{json, Value};

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

/// One scheduled request.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub at: Duration,
    pub conversation: usize,
    pub turn: usize,
    pub body: Value,
}

/// Shape of a multi-turn workload.
#[derive(Debug, Clone)]
pub struct MultiTurn {
    pub seed: u64,
    pub conversations: usize,
    pub turns: usize,
    pub system_words: usize,
    pub user_words: usize,
    pub max_tokens: u64,
    /// Conversations start this far apart (with seeded jitter).
    pub start_gap: Duration,
    /// Time between turns of one conversation (with seeded jitter).
    pub think_time: Duration,
}

impl MultiTurn {
    /// The open-loop schedule, sorted by arrival time.
    pub fn schedule(&self, model: &str) -> Vec<Arrival> {
        let mut out = Vec::new();
        for c in 0..self.conversations {
            let conv =
                Conversation::new(self.seed, c, self.system_words, self.user_words, self.turns);
            let jitter = |i: u64, span: Duration| {
                let r = textgen::draw(self.seed ^ 0xA11, c as u64 * 1000 + i) % 1000;
                span.mul_f64(0.5 + r as f64 / 1000.0)
            };
            let mut at = self.start_gap * c as u32 + jitter(999, self.start_gap);
            for t in 0..self.turns {
                if t > 0 {
                    at += jitter(t as u64, self.think_time);
                }
                out.push(Arrival {
                    at,
                    conversation: c,
                    turn: t,
                    body: conv.body(model, t, self.max_tokens, true),
                });
            }
        }
        out.sort_by_key(|a| a.at);
        out
    }
}

/// A fingerprint of a schedule (times and bodies), printed so runs can be compared.
pub fn schedule_hash(s: &[Arrival]) -> u64 {
    let mut bytes = Vec::new();
    for a in s {
        bytes.extend_from_slice(&(a.at.as_micros() as u64).to_le_bytes());
        bytes.extend_from_slice(a.body.to_string().as_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(seed: u64) -> MultiTurn {
        MultiTurn {
            seed,
            conversations: 4,
            turns: 3,
            system_words: 50,
            user_words: 10,
            max_tokens: 8,
            start_gap: Duration::from_millis(100),
            think_time: Duration::from_millis(500),
        }
    }

    #[test]
    fn same_seed_same_schedule() {
        assert_eq!(schedule_hash(&w(1).schedule("m")), schedule_hash(&w(1).schedule("m")));
        assert_ne!(schedule_hash(&w(1).schedule("m")), schedule_hash(&w(2).schedule("m")));
        assert_eq!(w(1).schedule("m").len(), 12);
    }

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
