//! Parse time of the body scan against the general path, token-id and chat bodies of about
//! 1 k, 8 k and 32 k tokens, in one run. Ignored: a measurement, not a test. Run it optimised:
//!
//! `cargo test --release -p kvroute-core --lib request::scan_bench -- --ignored --nocapture`
//!
//! Each round times a batch of parses by each path, in turn: the general path twice (A and
//! A', whose ratio is the noise floor), what the filter ran before the scan (token ids: the
//! earlier one-pass prompt reader, reproduced here without the rest of the request; chat:
//! the general path), the scan, and the least `serde_json` can do with the body (a floor).
//! The table gives the medians over the rounds, per parse, and the ratios.

use std::time::Instant;

use serde_json::{json, Value};

use super::{parse, parse_general, Endpoint};

/// A small deterministic generator (no dependency on a random crate).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// About `tokens` tokens of English-like text (4 bytes a token), with a few characters
    /// JSON escapes.
    fn text(&mut self, tokens: usize) -> String {
        const WORDS: [&str; 12] = [
            "the",
            "cache",
            "worker",
            "prefix",
            "request",
            "model",
            "\"quoted\"",
            "token",
            "route",
            "line\nbreak",
            "décision",
            "and",
        ];
        let mut s = String::with_capacity(tokens * 4);
        while s.len() < tokens * 4 {
            s.push_str(WORDS[(self.next() % 12) as usize]);
            s.push(' ');
        }
        s
    }
}

fn token_body(tokens: usize) -> Vec<u8> {
    let mut g = Lcg(tokens as u64);
    let ids: Vec<u64> = (0..tokens).map(|_| g.next() % 151_000).collect();
    json!({"model": "m", "prompt": ids, "max_tokens": 16, "stream": true}).to_string().into_bytes()
}

/// A conversation: a system prompt of a quarter of the tokens, then turns of about 500.
fn chat_body(tokens: usize) -> Vec<u8> {
    let mut g = Lcg(tokens as u64 + 1);
    let mut messages = vec![json!({"role": "system", "content": g.text(tokens / 4)})];
    let mut left = tokens - tokens / 4;
    let mut user = true;
    while left > 0 {
        let n = left.min(500);
        let role = if user || left == n { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": g.text(n)}));
        left -= n;
        user = !user;
    }
    json!({"model": "m", "messages": messages, "max_tokens": 64, "stream": true,
        "stream_options": {"include_usage": true}, "temperature": 0.7})
    .to_string()
    .into_bytes()
}

/// The least `serde_json` can do with a token-id body: the ids into a `Vec<u32>`, the rest
/// skipped (a floor for the scan, not a parser kvroute could use).
#[derive(serde::Deserialize)]
struct IdsOnly {
    #[allow(dead_code)]
    prompt: Vec<u32>,
}

/// The same floor for a chat body: each message's role and content string, the rest skipped.
#[derive(serde::Deserialize)]
struct TextsOnly {
    #[allow(dead_code)]
    messages: Vec<RoleContent>,
}

#[derive(serde::Deserialize)]
struct RoleContent {
    #[allow(dead_code)]
    role: String,
    #[allow(dead_code)]
    content: String,
}

/// The one-pass prompt reader before the body scan, reproduced: each id read as a JSON value
/// first, then converted (`Other` holds any array that is not all ids).
enum PreviousPrompt {
    Ids(#[allow(dead_code)] Vec<u32>),
    Other(#[allow(dead_code)] Value),
}

impl super::scan::Field for PreviousPrompt {
    const KEY: &'static str = "prompt";
}

impl<'de> serde::Deserialize<'de> for PreviousPrompt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = PreviousPrompt;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a prompt")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<PreviousPrompt, A::Error> {
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(v) = seq.next_element::<Value>()? {
                    match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                        Some(id) => ids.push(id),
                        None => {
                            let mut rest: Vec<Value> = ids.into_iter().map(Value::from).collect();
                            rest.push(v);
                            while let Some(v) = seq.next_element::<Value>()? {
                                rest.push(v);
                            }
                            return Ok(PreviousPrompt::Other(Value::Array(rest)));
                        }
                    }
                }
                Ok(PreviousPrompt::Ids(ids))
            }
        }
        d.deserialize_any(V)
    }
}

/// Median seconds per call of each function over `rounds` batches of `batch` calls, the
/// functions timed in turn within each round.
fn medians<const N: usize>(rounds: usize, batch: usize, fs: [&dyn Fn(); N]) -> [f64; N] {
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for _ in 0..rounds {
        for (f, s) in fs.iter().zip(samples.iter_mut()) {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            s.push(t.elapsed().as_secs_f64() / batch as f64);
        }
    }
    samples.map(|mut s| {
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    })
}

#[test]
#[ignore = "a measurement: run optimised with --ignored --nocapture"]
fn body_scan_parse_time() {
    println!(
        "| shape | tokens | body KiB | general µs | before µs | scan µs | serde floor µs \
         | scan / general | scan / before | floor / general | A' / A |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (shape, ep, make) in [
        ("token ids", Endpoint::Completions, token_body as fn(usize) -> Vec<u8>),
        ("chat", Endpoint::Chat, chat_body),
    ] {
        for tokens in [1_000, 8_000, 32_000] {
            let body = make(tokens);
            assert_eq!(parse(ep, &body), parse_general(ep, &body));
            assert!(
                serde_json::from_slice::<IdsOnly>(&body).is_ok()
                    || serde_json::from_slice::<TextsOnly>(&body).is_ok()
            );
            let batch = (256_000 / tokens).max(4);
            let general = || drop(std::hint::black_box(parse_general(ep, &body)));
            let scan = || drop(std::hint::black_box(parse(ep, &body)));
            let floor = || match ep {
                Endpoint::Completions => {
                    drop(std::hint::black_box(serde_json::from_slice::<IdsOnly>(&body)))
                }
                _ => drop(std::hint::black_box(serde_json::from_slice::<TextsOnly>(&body))),
            };
            // Token ids: the reader the filter had before the body scan (the general path
            // for chat, which had none).
            let previous = || match ep {
                Endpoint::Completions => {
                    let split = super::scan::split::<PreviousPrompt>(&body);
                    drop(std::hint::black_box(split))
                }
                _ => drop(std::hint::black_box(parse_general(ep, &body))),
            };
            let [a, p, s, f, a2] =
                medians(61, batch, [&general, &previous, &scan, &floor, &general]);
            println!(
                "| {shape} | {tokens} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} \
                 | {:.2} | {:.2} |",
                body.len() as f64 / 1024.0,
                a * 1e6,
                p * 1e6,
                s * 1e6,
                f * 1e6,
                s / a,
                s / p,
                f / a,
                a2 / a
            );
        }
    }
}
