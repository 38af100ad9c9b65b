//! Deterministic synthetic text: the demo tokenizer's training corpus, the simulator's output
//! and the harness's prompts all come from here. Word `i` of stream `seed` is picked by
//! xxh3(seed, i), so any text can be regenerated from its seed alone.

use xxhash_rust::xxh3::xxh3_64_with_seed;

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "model",
    "cache",
    "request",
    "worker",
    "token",
    "block",
    "prefix",
    "router",
    "queue",
    "latency",
    "envoy",
    "prompt",
    "answer",
    "stream",
    "system",
    "user",
    "assistant",
    "document",
    "summary",
    "question",
    "time",
    "first",
    "memory",
    "compute",
    "transfer",
    "weight",
    "layer",
    "attention",
    "batch",
    "decode",
    "prefill",
    "server",
    "cluster",
    "policy",
    "tenant",
    "session",
    "history",
    "context",
    "window",
    "length",
    "data",
    "result",
    "report",
    "value",
    "number",
    "table",
    "river",
    "mountain",
    "city",
    "forest",
    "ocean",
    "garden",
    "library",
    "market",
    "engine",
    "signal",
    "bridge",
    "harbor",
    "window",
    "letter",
    "picture",
    "season",
    "morning",
    "evening",
    "quickly",
    "slowly",
    "carefully",
    "really",
    "always",
    "never",
    "often",
    "perhaps",
    "maybe",
    "large",
    "small",
    "early",
    "late",
    "bright",
    "quiet",
    "heavy",
    "light",
    "simple",
    "complex",
    "write",
    "read",
    "explain",
    "compare",
    "describe",
    "consider",
    "remember",
    "measure",
    "build",
    "route",
    "serve",
    "store",
    "evict",
    "schedule",
    "balance",
    "predict",
    "verify",
];

const PUNCT: &[&str] = &[".", ",", ";", "?", "!", ":"];

/// The `i`-th pseudo-random number of stream `seed`.
pub fn draw(seed: u64, i: u64) -> u64 {
    xxh3_64_with_seed(&i.to_le_bytes(), seed)
}

/// `n` words of deterministic text for `seed`, with sentence punctuation and the odd number.
pub fn words(seed: u64, n: usize) -> String {
    let mut out = String::with_capacity(n * 7);
    let mut capital = true;
    for i in 0..n as u64 {
        let r = draw(seed, i);
        if i > 0 {
            out.push(' ');
        }
        if r % 29 == 0 {
            out.push_str(&(r % 1000).to_string());
        } else {
            let w = WORDS[(r >> 8) as usize % WORDS.len()];
            if capital {
                let mut cs = w.chars();
                if let Some(c) = cs.next() {
                    out.extend(c.to_uppercase());
                    out.push_str(cs.as_str());
                }
            } else {
                out.push_str(w);
            }
        }
        capital = false;
        if (r >> 20) % 9 == 0 {
            let p = PUNCT[(r >> 32) as usize % PUNCT.len()];
            out.push_str(p);
            capital = p != ",";
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seed_dependent() {
        assert_eq!(words(1, 50), words(1, 50));
        assert_ne!(words(1, 50), words(2, 50));
        assert_eq!(words(3, 10).split(' ').count(), 10);
        assert!(words(3, 20).starts_with(|c: char| c.is_uppercase() || c.is_ascii_digit()));
    }
}
