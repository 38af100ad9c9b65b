//! Parse time of the body scan against the general path, token-id and chat bodies of about
//! 1 k, 8 k and 32 k tokens, in one run. Ignored: a measurement, not a test. Run it optimised:
//!
//! `cargo test --release -p kvroute-core --lib request::scan_bench -- --ignored --nocapture`
//!
//! Each round times a batch of parses by each path, in turn: the general path twice (A and
//! A', whose ratio is the noise floor), what the filter ran before the top level and token
//! ids were read by hand (`serde_json` over the whole body, reproduced here without the rest of
//! the request), the same part of the scan now (*split*), the whole scan, and the least `serde_json` can do with the body (a floor).
//! The table gives the medians over the rounds, per parse, and the ratios.

use std::time::Instant;

use serde_json::json;

use super::chat_scan::MessagesField;
use super::completions::PromptField;
use super::scan::{Field, Split};
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

/// The body scan before the top level was read by hand (`serde_json` over the whole body, a
/// visitor per token id), reproduced for the *before* column.
struct SerdeSplit<F>(#[allow(dead_code)] Split<F>);

impl<'de, F: Field> serde::Deserialize<'de> for SerdeSplit<F> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TopVisitor<F>(std::marker::PhantomData<F>);
        impl<'de, F: Field> serde::de::Visitor<'de> for TopVisitor<F> {
            type Value = SerdeSplit<F>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SerdeSplit<F>, A::Error> {
                let mut top = Split { obj: serde_json::Map::new(), field: None };
                while let Some(key) = map.next_key::<String>()? {
                    if key == F::KEY {
                        top.field = Some(map.next_value()?);
                    } else {
                        top.obj.insert(key, map.next_value()?);
                    }
                }
                Ok(SerdeSplit(top))
            }
        }
        d.deserialize_map(TopVisitor(std::marker::PhantomData))
    }
}

/// What the filter read a body with before the hand-read top level and token ids.
fn before<F: Field>(body: &[u8]) -> Option<SerdeSplit<F>> {
    let top: SerdeSplit<F> = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
    (!top.0.obj.values().any(super::scan::maybe_python_int)).then_some(top)
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
        "| shape | tokens | body KiB | general µs | before µs | split µs | scan µs \
         | serde floor µs | scan / general | split / before | floor / general | A' / A |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
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
            // The scan before the hand-read top level (the big field and the rest only).
            let previous = || match ep {
                Endpoint::Completions => drop(std::hint::black_box(before::<PromptField>(&body))),
                _ => drop(std::hint::black_box(before::<MessagesField>(&body))),
            };
            // The same part of the scan now: the top level with the big field.
            let split = || match ep {
                Endpoint::Completions => {
                    drop(std::hint::black_box(super::scan::split::<PromptField>(&body)))
                }
                _ => drop(std::hint::black_box(super::scan::split::<MessagesField>(&body))),
            };
            let read = match ep {
                Endpoint::Completions => {
                    before::<PromptField>(&body).is_some()
                        && super::scan::split::<PromptField>(&body).is_some()
                }
                _ => {
                    before::<MessagesField>(&body).is_some()
                        && super::scan::split::<MessagesField>(&body).is_some()
                }
            };
            assert!(read, "both scans read the body");
            let [a, p, sp, s, f, a2] =
                medians(61, batch, [&general, &previous, &split, &scan, &floor, &general]);
            println!(
                "| {shape} | {tokens} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} \
                 | {:.2} | {:.2} | {:.2} |",
                body.len() as f64 / 1024.0,
                a * 1e6,
                p * 1e6,
                sp * 1e6,
                s * 1e6,
                f * 1e6,
                s / a,
                sp / p,
                f / a,
                a2 / a
            );
        }
    }
}
