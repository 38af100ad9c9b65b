//! Cost ranking, bit for bit: a [`Router`] with the demo bundle and a profile whose numbers are
//! not round ranks four workers (one holds the whole prompt but is busy with prefill done in
//! part, one holds half of it, one is idle, one is decoding) for a fixed chat request. The
//! order, the cached and uncached tokens and every float of every estimate (wait, prefill,
//! TTFT, the stall it adds to running streams with its decode's growth of their steps, and the
//! cost ranked on) must equal the values computed on the host, to the last bit.

use serde_json::json;

use crate::decision::config::FilterConfig;
use crate::decision::load::WorkerLoad;
use crate::decision::request::{parse, Endpoint};
use crate::decision::router::Router;
use crate::wire::journal::Source;

const WORKERS: [&str; 4] = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"];

/// The router of the scenario.
pub fn scenario_router() -> Router {
    let cfg = json!({
        "models": [{"name": "m", "workers": WORKERS, "block_size": 16, "profile": {
            "prefill_base_ms": 3.7,
            "prefill_ms_per_token": 0.0417,
            "prefill_ms_per_token_sq": 3.3e-7,
            "decode_interference_ms": 0.61,
            "decode_ms_per_seq": 0.027,
            "decode_ms_per_1k_context": 0.043,
            "transfer_ms_per_token": 0.0031,
            "adapter_load_ms": 180.0
        }}],
        "tie_band": {"abs_ms": 0.0, "rel": 0.0}
    });
    let cfg = FilterConfig::from_json(cfg.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("scenario config: {e}"));
    Router::new(&cfg).unwrap_or_else(|e| panic!("scenario router: {e}"))
}

fn load(w: &str) -> WorkerLoad {
    let (inflight_requests, prefilling_requests, prefill_tokens, prefill_elapsed_ms) = match w {
        "127.0.0.1:1" => (6, 2, 900, 13),
        "127.0.0.1:2" => (3, 1, 700, 0),
        "127.0.0.1:4" => (9, 0, 0, 0),
        _ => (0, 0, 0, 0),
    };
    WorkerLoad {
        inflight_requests,
        prefilling_requests,
        prefill_tokens,
        prefill_elapsed_ms,
        prefill_sq_tokens: WorkerLoad::even_sq_tokens(prefill_tokens, prefilling_requests),
        arriving_tokens_per_s: 0,
        behind_tokens: 0,
        passing_tokens_per_s: 0,
    }
}

/// One ranked worker: name, cached and uncached tokens, and the bits of its wait, prefill,
/// TTFT, stall (the delay to the streams it decodes) and cost estimates (ms).
type Ranked = (&'static str, u64, u64, [u64; 5]);

// Computed on x86_64 (the decimal values in the comments are for reading only): the idle
// worker wins; the holder of the whole prefix follows (its own prefill is the shortest, but it
// is busy: it waits for its queue and a batch that fills behind it, and its short prefill would
// delay the 4 streams it decodes), then the half holder, then the worker decoding 9 streams.
const PROMPT_TOKENS: u64 = 895;
const GOLDEN: [Ranked; 4] = [
    // wait 0.0, prefill 41.28583825, TTFT 41.28583825, stall 0.0, cost 41.28583825
    (
        "127.0.0.1:3",
        0,
        895,
        [0x0000000000000000, 0x4044a4965907d913, 0x4044a4965907d913, 0, 0x4044a4965907d913],
    ),
    // wait 41.3325645, prefill 4.33428625, TTFT 45.66685075, stall 17.337145, cost 63.00399575
    (
        "127.0.0.1:1",
        880,
        15,
        [
            0x4044aa917939a7c1,
            0x4011564f227d028a,
            0x4046d55b5d894812,
            0x4050cf2656abde40,
            0x405c39d405708249,
        ],
    ),
    // wait 41.103828, prefill 23.20985233, TTFT 64.31368033, stall 46.41970466, cost 110.73338499
    (
        "127.0.0.1:2",
        432,
        463,
        [
            0x40448d4a3c64345d,
            0x403735b8e1de56e3,
            0x4050141356a9afe7,
            0x4051d7a5b7f57a40,
            0x4060f5dc874f9514,
        ],
    ),
    // wait 5.49, prefill 41.28583825, TTFT 46.77583825, stall 371.57254425, cost 418.3483825
    (
        "127.0.0.1:4",
        0,
        895,
        [
            0x4015f5c28f5c28f6,
            0x4044a4965907d913,
            0x4047634eaaf35e32,
            0x407be6c0196d8f50,
            0x407ed329eecbfb16,
        ],
    ),
];

/// The ranking of the scenario: what the router decides.
pub fn scenario_ranking() -> (u64, Vec<Ranked>) {
    let mut r = scenario_router();
    let text = "the quick brown fox jumps over the lazy dog and keeps running far away ".repeat(20);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": text}]});
    let q = parse(Endpoint::Chat, body.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("scenario request: {e}"));
    let first =
        r.decide(&q, 0, &|_: &str| WorkerLoad::default(), 0, 0).unwrap_or_else(|e| panic!("{e:?}"));
    let hashes = &first.block_hashes;
    r.observe(WORKERS[0], hashes, Source::Routed, 100);
    r.observe(WORKERS[1], &hashes[..hashes.len() / 2], Source::Feedback, 100);
    let d = r.decide(&q, 0, &load, 200, 0).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(d.fallback, None);
    let leak = |w: &str| WORKERS.iter().find(|k| **k == w).copied().unwrap_or("?");
    let ranked = d
        .ranked
        .iter()
        .map(|s| {
            let bits = [
                s.wait_ms.to_bits(),
                s.prefill_ms.to_bits(),
                s.ttft_ms.to_bits(),
                s.stall_ms.to_bits(),
                s.cost_ms.to_bits(),
            ];
            (leak(&s.worker), s.cached_tokens, s.uncached_tokens, bits)
        })
        .collect();
    (d.prompt_tokens, ranked)
}

pub fn ranking_golden() {
    let (prompt_tokens, ranked) = scenario_ranking();
    let show = |r: &[Ranked]| {
        r.iter()
            .map(|(w, c, u, b)| {
                let hex = b.map(|x| format!("{x:#018x}")).join(", ");
                format!("{w} cached {c} uncached {u} ms {:?} bits [{hex}]", b.map(f64::from_bits))
            })
            .collect::<Vec<_>>()
            .join("\n  ")
    };
    assert_eq!(prompt_tokens, PROMPT_TOKENS);
    assert_eq!(ranked, GOLDEN, "got:\n  {}\nwant:\n  {}", show(&ranked), show(&GOLDEN));
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranking_golden() {
        super::ranking_golden();
    }
}
