//! Replay of the Mooncake conversation trace (FAST'25; found by [`find_trace`]).
//!
//! Each trace line gives an arrival time, input and output lengths in tokens, and the ids of the
//! prompt's 512-token prefix blocks: requests that share their first k ids share their first
//! k·512 tokens. The trace holds no text, so prompts are synthesized: one deterministic text
//! chunk per hash id, in order, the last one trimmed in proportion to how much of its 512-token
//! block `input_length` covers. A chunk depends only on the replay's seed and the hash id, and
//! every chunk starts with a space, so the token blocks of two prompts repeat exactly where
//! their hash ids repeat.
//!
//! A trace block is scaled down to [`Replay::tokens_per_block`] tokens of the served model's
//! tokenizer (the demo bundle by default), using its measured ratio ([`WORDS_PER_TOKEN`],
//! [`QWEN3_WORDS_PER_TOKEN`]).

use std::collections::HashSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use kvroute_testkit::textgen;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::schedule::{chat_body, Scheduled};

/// Tokens in one block of the trace's `hash_ids`.
pub const TRACE_BLOCK_TOKENS: u64 = 512;

/// Words of `kvroute_testkit::textgen::words` per token of the demo tokenizer, each chunk preceded
/// by a space: 0.893, measured over 400 chunks of 100 words by the test
/// `calibration_matches_demo_tokenizer` (which fails if this drifts by more than 3 %). With 64
/// tokens per block a chunk is 57 words, about 63.8 tokens.
pub const WORDS_PER_TOKEN: f64 = 0.893;

/// The same ratio for Qwen3's tokenizer: 0.813, measured the same way by
/// `calibration_matches_qwen3_tokenizer`.
pub const QWEN3_WORDS_PER_TOKEN: f64 = 0.813;

/// Salt of the per-hash-id text seeds.
const BLOCK_SALT: u64 = 0x6d6f_6f6e_6361_6b65;
/// Salt of the sampling draws.
const SAMPLE_SALT: u64 = 0x7361_6d70_6c65_0001;

/// One line of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival, ms from the start of the trace.
    #[serde(rename = "timestamp")]
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// Ids of the prompt's 512-token prefix blocks, in order.
    pub hash_ids: Vec<u64>,
}

/// The trace's file name, in `../shared/traces/` or `.cache/traces/`.
pub const TRACE_FILE: &str = "mooncake_conversation_trace.jsonl";

/// Where the trace lies: `$KVROUTE_TRACE` if set, else `../shared/traces/` beside the repository,
/// else `.cache/traces/`, where `./dev setup` fetches it (kvcache-ai/Mooncake at a pinned commit,
/// checked against a pinned sha256) when the network allows. The error says where it looked and
/// how to get it.
pub fn find_trace() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_TRACE") {
        let p = PathBuf::from(p);
        anyhow::ensure!(p.is_file(), "KVROUTE_TRACE names {}, which is not a file", p.display());
        return Ok(p);
    }
    let root = kvroute_stack::paths::repo_root();
    let places = [
        root.join("../shared/traces").join(TRACE_FILE),
        root.join(".cache/traces").join(TRACE_FILE),
    ];
    if let Some(p) = places.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    anyhow::bail!(
        "the Mooncake trace is absent (looked at {} and {}): `./dev setup` fetches it from \
         kvcache-ai/Mooncake when the network allows, or set KVROUTE_TRACE to a copy",
        places[0].display(),
        places[1].display()
    )
}

/// Reads a trace (JSON lines; blank lines are skipped). The error names the bad line.
pub fn load(path: &Path) -> anyhow::Result<Vec<TraceRequest>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("{}:{n}: reading", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let req = serde_json::from_str::<TraceRequest>(&line)
            .with_context(|| format!("{}:{n}: not a trace request", path.display()))?;
        out.push(req);
    }
    Ok(out)
}

/// The block hit rate of one unbounded cache that sees every request in order: the fraction of
/// all hash-id blocks whose id was seen before. No routing can reuse more.
pub fn block_reuse_ceiling(trace: &[TraceRequest]) -> f64 {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut reused = 0u64;
    for id in trace.iter().flat_map(|r| &r.hash_ids) {
        total += 1;
        if !seen.insert(*id) {
            reused += 1;
        }
    }
    if total == 0 {
        0.0
    } else {
        reused as f64 / total as f64
    }
}

/// How a window of the trace becomes an open-loop schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// Seeds the sampling and the synthesized text.
    pub seed: u64,
    /// Start of the replayed window, ms of trace time.
    pub start_ms: u64,
    /// Length of the replayed window, ms of trace time.
    pub window_ms: u64,
    /// Trace time runs this many times faster than the replay (non-positive or non-finite
    /// values are taken as 1).
    pub speedup: f64,
    /// Fraction of the window's requests that are kept, chosen from the seed and the line's
    /// index (1 keeps all).
    pub sample: f64,
    /// Synthesized tokens (of the served model's tokenizer) standing for one 512-token trace block.
    pub tokens_per_block: usize,
    /// Cap on each request's output length.
    pub max_output_tokens: u64,
    /// The `model` of every request.
    pub model: String,
    /// Words of synthesized text per token of that model's tokenizer.
    pub words_per_token: f64,
}

impl Replay {
    /// The schedule of the trace's requests in `[start_ms, start_ms + window_ms)` that the
    /// sample keeps, in arrival order. Cohort: `trace-reuse` when the request's first hash id
    /// was already seen earlier in this schedule, else `trace-first`.
    pub fn schedule(&self, trace: &[TraceRequest]) -> Vec<Scheduled> {
        let end_ms = self.start_ms.saturating_add(self.window_ms);
        let mut kept: Vec<(usize, &TraceRequest)> = trace
            .iter()
            .enumerate()
            .filter(|(i, r)| (self.start_ms..end_ms).contains(&r.timestamp_ms) && self.keeps(*i))
            .collect();
        kept.sort_by_key(|(_, r)| r.timestamp_ms);

        let mut first_ids = HashSet::new();
        let mut out = Vec::with_capacity(kept.len());
        for (_, req) in kept {
            let reuse = match req.hash_ids.first() {
                Some(id) => !first_ids.insert(*id),
                None => false,
            };
            let cohort = if reuse { "trace-reuse" } else { "trace-first" };
            let output_tokens = req.output_length.min(self.max_output_tokens).max(1);
            let message = json!({"role": "user", "content": self.prompt(req)});
            out.push(Scheduled {
                endpoint: crate::schedule::CHAT,
                at: self.arrival(req.timestamp_ms),
                body: chat_body(&self.model, vec![message], output_tokens),
                output_tokens,
                cohorts: vec![cohort.to_owned()],
            });
        }
        out
    }

    /// The synthesized prompt of one request: one chunk per hash id, the last one trimmed.
    pub fn prompt(&self, req: &TraceRequest) -> String {
        let full = self.words_per_block();
        let n = req.hash_ids.len();
        let mut out = String::with_capacity(n * full * 8);
        for (k, id) in req.hash_ids.iter().enumerate() {
            let words = if k + 1 == n {
                let before = TRACE_BLOCK_TOKENS * (n as u64 - 1);
                let covered = req.input_length.saturating_sub(before).clamp(1, TRACE_BLOCK_TOKENS);
                // Ceiling of full·covered/512: at least one word, all of them for a full block.
                (full as u64 * covered).div_ceil(TRACE_BLOCK_TOKENS) as usize
            } else {
                full
            };
            out.push_str(&self.block_text(*id, words));
        }
        out
    }

    /// Words in the chunk of a whole trace block.
    pub fn words_per_block(&self) -> usize {
        ((self.tokens_per_block as f64 * self.words_per_token).round() as usize).max(1)
    }

    /// The first `words` words of hash id `id`'s chunk, preceded by a space. A shorter chunk
    /// is a prefix of a longer one.
    fn block_text(&self, id: u64, words: usize) -> String {
        let seed = textgen::draw(self.seed ^ BLOCK_SALT, id);
        format!(" {}", textgen::words(seed, words))
    }

    /// Whether the sample keeps trace line `index`.
    fn keeps(&self, index: usize) -> bool {
        if self.sample >= 1.0 {
            return true;
        }
        // 53 random bits as a uniform number in [0, 1).
        let r = (textgen::draw(self.seed ^ SAMPLE_SALT, index as u64) >> 11) as f64;
        let unit = r / (1u64 << 53) as f64;
        unit < self.sample
    }

    /// Replay time of trace time `timestamp_ms`.
    fn arrival(&self, timestamp_ms: u64) -> Duration {
        let speedup =
            if self.speedup.is_finite() && self.speedup > 0.0 { self.speedup } else { 1.0 };
        let trace_ns = timestamp_ms.saturating_sub(self.start_ms) as f64 * 1e6;
        Duration::from_nanos((trace_ns / speedup).round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use kvroute_core::decision::request::{parse, Endpoint};
    use kvroute_core::decision::tokenize::model::ModelBundle;

    use super::*;
    use crate::schedule::hash;

    fn replay(seed: u64) -> Replay {
        Replay {
            seed,
            start_ms: 0,
            window_ms: 3_600_000,
            speedup: 1.0,
            sample: 1.0,
            tokens_per_block: 64,
            max_output_tokens: 128,
            model: "demo".into(),
            words_per_token: WORDS_PER_TOKEN,
        }
    }

    fn req(timestamp_ms: u64, input_length: u64, hash_ids: &[u64]) -> TraceRequest {
        TraceRequest { timestamp_ms, input_length, output_length: 300, hash_ids: hash_ids.to_vec() }
    }

    /// A small synthetic trace: a few conversations growing turn by turn.
    fn synthetic() -> Vec<TraceRequest> {
        (0..60u64)
            .map(|i| {
                let conv = i % 7;
                let turns = 1 + i / 7;
                let ids: Vec<u64> = (0..turns).map(|t| conv * 100 + t).collect();
                let len = TRACE_BLOCK_TOKENS * (turns - 1) + 100 + i;
                req(i * 1000, len, &ids)
            })
            .collect()
    }

    /// The engine's prompt tokens for a scheduled chat body.
    fn tokens(bundle: &ModelBundle, s: &Scheduled) -> Vec<u32> {
        let body = s.body.to_string();
        let parsed = match parse(Endpoint::Chat, body.as_bytes()) {
            Ok(p) => p,
            Err(e) => panic!("scheduled body does not parse: {e}"),
        };
        match bundle.prompt_tokens(&parsed.prompt) {
            Ok(t) => t,
            Err(e) => panic!("tokenizing failed: {e}"),
        }
    }

    fn demo() -> ModelBundle {
        match ModelBundle::demo() {
            Ok(b) => b,
            Err(e) => panic!("demo bundle: {e}"),
        }
    }

    #[test]
    fn calibration_matches_demo_tokenizer() {
        calibration(&demo(), WORDS_PER_TOKEN);
    }

    #[test]
    fn calibration_matches_qwen3_tokenizer() {
        match kvroute_core::decision::tokenize::model::qwen3() {
            Ok(b) => calibration(&b, QWEN3_WORDS_PER_TOKEN),
            Err(e) => panic!("{e}"),
        }
    }

    fn calibration(bundle: &ModelBundle, words_per_token: f64) {
        let r = Replay { words_per_token, ..replay(11) };
        let (mut words, mut toks) = (0usize, 0usize);
        for id in 0..400 {
            let text = r.block_text(id, 100);
            words += 100;
            toks += bundle.encode(&text, false).map(|t| t.len()).unwrap_or(0);
        }
        let measured = words as f64 / toks as f64;
        assert!(
            (measured / words_per_token - 1.0).abs() < 0.03,
            "measured {measured:.4} words per token, the constant is {words_per_token}"
        );
        // A whole block is then about tokens_per_block tokens.
        let per_block: usize = (0..50)
            .map(|id| {
                let text = r.block_text(id, r.words_per_block());
                bundle.encode(&text, false).map(|t| t.len()).unwrap_or(0)
            })
            .sum();
        let mean = per_block as f64 / 50.0;
        assert!((mean / 64.0 - 1.0).abs() < 0.05, "mean tokens per block {mean}");
    }

    #[test]
    fn tokens_never_merge_across_chunks() {
        never_merge(&demo());
        match kvroute_core::decision::tokenize::model::qwen3() {
            Ok(b) => never_merge(&b),
            Err(e) => panic!("{e}"),
        }
    }

    fn never_merge(bundle: &ModelBundle) {
        let r = replay(5);
        let enc = |s: &str| bundle.encode(s, false).unwrap_or_default();
        for id in 0..100 {
            let a = r.block_text(id, 1 + (id as usize * 7) % 60);
            let b = r.block_text(id + 1000, 40);
            let mut apart = enc(&a);
            apart.extend(enc(&b));
            assert_eq!(enc(&format!("{a}{b}")), apart, "chunks {id} and {}", id + 1000);
        }
    }

    #[test]
    fn schedule_is_deterministic_and_seeded() {
        let trace = synthetic();
        let mut r = replay(1);
        r.sample = 0.5;
        let a = r.schedule(&trace);
        assert_eq!(hash(&a), hash(&r.schedule(&trace)));
        assert!(!a.is_empty() && a.len() < trace.len(), "{} of {}", a.len(), trace.len());
        r.seed = 2;
        assert_ne!(hash(&a), hash(&r.schedule(&trace)));
        r.sample = 1.0;
        assert_eq!(r.schedule(&trace).len(), trace.len());
    }

    #[test]
    fn window_output_cap_and_cohorts() {
        let trace = synthetic();
        let mut r = replay(1);
        r.start_ms = 10_000;
        r.window_ms = 20_000;
        r.max_output_tokens = 50;
        let s = r.schedule(&trace);
        assert_eq!(s.len(), 20, "timestamps 10 s ..< 30 s");
        assert_eq!(s[0].at, Duration::ZERO);
        assert_eq!(s[19].at, Duration::from_secs(19));
        assert!(s.iter().all(|x| x.output_tokens == 50));
        assert_eq!(s[0].body["max_tokens"], 50);
        assert_eq!(s[0].body["model"], "demo");
        // Conversations 3, 4, 5, 6, 0, 1, 2 open the window; later turns reuse their first id.
        let tags: Vec<&str> = s.iter().map(|x| x.cohorts[0].as_str()).collect();
        assert_eq!(tags[..7], ["trace-first"; 7]);
        assert!(tags[7..].iter().all(|t| *t == "trace-reuse"));

        let mut short = req(0, 10, &[1]);
        short.output_length = 0;
        let s = replay(1).schedule(&[short]);
        assert_eq!(s[0].output_tokens, 1);
    }

    #[test]
    fn speedup_halves_arrivals() {
        let trace = synthetic();
        let mut r = replay(3);
        let slow = r.schedule(&trace);
        r.speedup = 2.0;
        let fast = r.schedule(&trace);
        assert_eq!(slow.len(), fast.len());
        for (a, b) in slow.iter().zip(&fast) {
            assert_eq!(a.at / 2, b.at);
            assert_eq!(a.body, b.body);
        }
        assert_eq!(fast[3].at, Duration::from_millis(1500));
    }

    #[test]
    fn shared_hash_ids_share_leading_tokens() {
        let bundle = demo();
        let r = replay(9);
        let tpb = r.tokens_per_block;
        let trace = [req(0, 1536, &[1, 2, 3]), req(5, 1536, &[1, 2, 4])];
        let s = r.schedule(&trace);
        let (a, b) = (tokens(&bundle, &s[0]), tokens(&bundle, &s[1]));
        let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let header = {
            let other = r.schedule(&[req(0, 512, &[77])]);
            let c = tokens(&bundle, &other[0]);
            a.iter().zip(&c).take_while(|(x, y)| x == y).count()
        };
        assert!(shared as f64 >= 2.0 * tpb as f64 * 0.9, "shared {shared}");
        assert!(
            shared <= header + 2 * tpb + tpb / 10,
            "shared {shared} tokens, expected to differ soon after two blocks (header {header})"
        );
        assert!(a.len() > shared + tpb / 2 && b.len() > shared + tpb / 2);
        assert_eq!(s[1].cohorts, ["trace-reuse"]);
    }

    #[test]
    fn short_last_block_is_trimmed() {
        let r = replay(4);
        let full = r.prompt(&req(0, 1024, &[1, 2]));
        let short = r.prompt(&req(0, 512 + 128, &[1, 2]));
        let one = r.prompt(&req(0, 512, &[1]));
        let words = |s: &str| s.split_whitespace().count();
        assert_eq!(words(&one), r.words_per_block());
        assert_eq!(words(&full), 2 * r.words_per_block());
        assert_eq!(words(&short), r.words_per_block() + r.words_per_block().div_ceil(4));
        assert!(full.starts_with(&short), "a trimmed block is a prefix of the whole one");
        assert!(short.starts_with(&one));
    }

    #[test]
    fn load_names_the_bad_line() {
        let dir = match kvroute_stack::paths::scratch_dir("mooncake-load") {
            Ok(d) => d,
            Err(e) => panic!("{e:#}"),
        };
        let path = dir.join("t.jsonl");
        let text = concat!(
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [0]}\n",
            "\n",
            "{\"timestamp\": 5, \"input_length\": 10, \"hash_ids\": [0]}\n",
        );
        if let Err(e) = std::fs::write(&path, text) {
            panic!("{e}");
        }
        let err = match load(&path) {
            Ok(t) => panic!("loaded a bad trace: {t:?}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains("t.jsonl:3"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn full_trace_reuse_ceiling() {
        let path = match find_trace() {
            Ok(p) => p,
            // Beside ../shared (the project's CI layout) the trace must be there.
            Err(e) if kvroute_stack::paths::beside_shared() => panic!("{e:#}"),
            Err(e) => {
                let name = "kvroute-eval mooncake::tests::full_trace_reuse_ceiling";
                return kvroute_stack::paths::skipped(name, &format!("{e:#}"));
            }
        };
        let trace = match load(&path) {
            Ok(t) => t,
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(trace.len(), 12_031);
        let ceiling = block_reuse_ceiling(&trace);
        assert!((ceiling - 0.366).abs() < 0.0005, "ceiling {ceiling}");
    }
}
