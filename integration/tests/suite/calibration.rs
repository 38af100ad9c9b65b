//! Online calibration on the real stack: Envoy with the filter configured with a profile 3x too
//! slow, simulated workers with a known profile. The filter must learn the workers' real costs
//! from what it observes, and follow a worker that is slowed down mid-run.
//!
//! Nothing here depends on host speed: the workers' prefill cost is raised (0.1 ms per token)
//! so that their engine time dwarfs HTTP and tokenization overheads, the tolerances are wide
//! (overheads only add to what is learned), and the slowed worker is judged against the other.

use std::collections::HashMap;
use std::time::Duration;

use kvroute_stack::client;
use kvroute_stack::eventually;
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use serde_json::json;

/// The workers' prefill cost per token (ms), set on the simulator's command line.
const PER_TOKEN_MS: f64 = 0.1;
/// The filter's prior is this many times the workers' real costs.
const PRIOR_SCALE: f64 = 3.0;
/// Requests before the coefficients are checked.
const WARMUP: usize = 60;

fn opts() -> StackOptions {
    let k = PRIOR_SCALE;
    StackOptions {
        workers: 2,
        sim_args: vec!["--prefill-ms-per-token".into(), PER_TOKEN_MS.to_string()],
        model_overrides: json!({"profile": {
            "prefill_base_ms": 4.8 * k,
            "prefill_ms_per_token": PER_TOKEN_MS * k,
            "prefill_ms_per_token_sq": 4.21e-7 * k,
            "decode_interference_ms": 0.03 * k,
        }}),
        // Every decision is a tie (drawn at random), so both workers keep getting samples
        // whatever the estimates say; calibration does not depend on the choice.
        filter: json!({
            "tie_band": {"abs_ms": 1.0e6, "rel": 0.0},
            "calibration": {"min_samples": 20, "flush_samples": 1, "refresh_ms": 5},
        }),
        ..Default::default()
    }
}

/// One streamed request with a fresh prompt of `words` words: (worker, predicted TTFT,
/// observed TTFT) in ms.
async fn request(stack: &Stack, seed: u64, words: usize) -> (String, f64, f64) {
    let body = json!({"model": MODEL, "max_tokens": 1, "stream": true,
        "messages": [{"role": "user", "content": kvroute_testkit::textgen::words(seed, words)}]});
    let http = reqwest::Client::new();
    let r = client::chat(&http, &stack.base_url(), &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let predicted: f64 = r.decision_field("predicted_ttft_ms").unwrap().parse().unwrap();
    let worker = r.decision_field("worker").unwrap();
    (worker, predicted, r.ttft.as_secs_f64() * 1000.0)
}

/// The calibration gauges, by name without the `kvroute_calibration_` prefix.
async fn gauges(stack: &Stack) -> HashMap<String, f64> {
    let m = stack.envoy.prometheus().await.unwrap_or_default();
    m.into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("kvroute_calibration_")?.to_owned(), v)))
        .collect()
}

fn seg(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

fn model_gauge(g: &HashMap<String, f64>, name: &str) -> f64 {
    g.get(&format!("{}_{name}", seg(MODEL))).copied().unwrap_or(f64::NAN)
}

fn deviation(g: &HashMap<String, f64>, worker: &str) -> f64 {
    let name = format!("worker_{}_deviation_permille", seg(worker));
    model_gauge(g, &name) / 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prompt sizes from 150 to 1500 words, in a fixed order.
fn words(i: usize) -> usize {
    150 + (i * 337) % 1350
}

#[tokio::test]
async fn from_a_prior_three_times_off_the_filter_learns_the_workers_and_follows_a_slowed_one() {
    let stack = Stack::start(opts()).await.unwrap();
    stack.wait_healthy(2).await.unwrap();
    let mut seen = Vec::new();
    for i in 0..WARMUP {
        seen.push(request(&stack, i as u64, words(i)).await);
    }
    // The estimates the last requests were routed with are close to what they met: the first
    // ones were ~3x off.
    let rel = |(_, p, o): &(String, f64, f64)| (p - o).abs() / o;
    let first = rel(&seen[0]);
    let late = median(seen[WARMUP - 20..].iter().map(rel).collect());
    assert!(first > 1.0, "the prior starts ~3x off: {first}");
    assert!(late < 0.35, "median relative TTFT error of the last 20: {late}");
    let g = eventually("calibration gauges", Duration::from_secs(10), || async {
        let g = gauges(&stack).await;
        (model_gauge(&g, "samples") >= (WARMUP - 5) as f64).then_some(g)
    })
    .await
    .unwrap();
    assert_eq!(model_gauge(&g, "active"), 1.0, "{g:?}");
    let per_token = model_gauge(&g, "prefill_ns_per_token") / 1e6;
    eprintln!("first error {first:.2}, last 20 median {late:.3}, learned {per_token} ms/token");
    assert!(
        per_token > 0.6 * PER_TOKEN_MS && per_token < 1.8 * PER_TOKEN_MS,
        "learned {per_token} ms/token, the workers take {PER_TOKEN_MS} (prior {})",
        PER_TOKEN_MS * PRIOR_SCALE
    );
    // Slow one worker 3x: its deviation rises well above the other's.
    let slowed = &stack.workers[0];
    slowed.admin("slow?factor=3", None).await.unwrap();
    let (a, b) = (stack.workers[0].addr.clone(), stack.workers[1].addr.clone());
    let mut on_slowed = 0;
    for i in 0..80 {
        let (w, _, _) = request(&stack, 1000 + i as u64, words(i)).await;
        on_slowed += usize::from(w == a);
    }
    assert!(on_slowed >= 15, "ties are drawn at random: {on_slowed} of 80 on the slowed worker");
    let g = eventually("the slowed worker's deviation", Duration::from_secs(10), || async {
        let g = gauges(&stack).await;
        (deviation(&g, &a) / deviation(&g, &b) > 1.8).then_some(g)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: logs in {}", stack.dir.display()));
    let (da, db) = (deviation(&g, &a), deviation(&g, &b));
    eprintln!("deviations: slowed {da}, other {db} ({on_slowed} of 80 on the slowed worker)");
    assert!(da > 1.5 && db < 1.3, "deviations: slowed {da}, other {db}");
}

/// The count of samples from busy workers (below its threshold, a busy worker's promise holds
/// a share of a whole step) lives under its own shared-data key: through Envoy's shared data,
/// requests that waited behind a queue move it, idle ones do not, and it stops at the
/// threshold.
#[tokio::test]
async fn samples_from_behind_a_queue_are_counted_up_to_the_threshold() {
    use kvroute_core::decision::calib::PROMISE_FILL_SAMPLES;
    let stack = Stack::start(StackOptions {
        workers: 1,
        envoy_concurrency: 2,
        // One request at a time: requests sent together queue at the worker, and the filter
        // sees the ones before each in flight.
        sim_args: vec![
            "--max-num-seqs".into(),
            "1".into(),
            "--prefill-ms-per-token".into(),
            PER_TOKEN_MS.to_string(),
        ],
        filter: json!({"calibration": {"min_samples": 5, "flush_samples": 1, "refresh_ms": 5}}),
        ..Default::default()
    })
    .await
    .unwrap();
    let busy = |g: &HashMap<String, f64>| model_gauge(g, "busy_samples");
    for i in 0..8 {
        request(&stack, 3000 + i, 200).await;
    }
    let g = eventually("idle samples", Duration::from_secs(10), || async {
        let g = gauges(&stack).await;
        (model_gauge(&g, "samples") >= 8.0).then_some(g)
    })
    .await
    .unwrap();
    assert_eq!(busy(&g), 0.0, "one request at a time waits behind nothing: {g:?}");
    // Sixty, 5 ms apart (each takes the worker ~25 ms): all but the first are decided with
    // requests in flight before them, none in the same millisecond as another (those are
    // not learned from, `skip_shared_instants`).
    let sends = (0..60).map(|i| {
        let stack = &stack;
        async move {
            tokio::time::sleep(Duration::from_millis(5 * i)).await;
            request(stack, 4000 + i, 200).await
        }
    });
    futures::future::join_all(sends).await;
    let threshold = f64::from(PROMISE_FILL_SAMPLES);
    let g = eventually("busy samples", Duration::from_secs(10), || async {
        let g = gauges(&stack).await;
        (model_gauge(&g, "samples") >= 8.0 + threshold && busy(&g) >= threshold).then_some(g)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: logs in {}", stack.dir.display()));
    assert_eq!(busy(&g), threshold, "counted up to {threshold}: {g:?}");
}

/// Workers whose decode step is slow enough to time through HTTP on a shared machine: 20 ms,
/// plus 2 ms per sequence and 4 ms per 1 000 tokens of context in the batch.
const STEP_PROFILE: &str = r#"
name = "slow-decode"
step_floor_ms = 20.0
prefill_ms_per_token = 0.033
prefill_ms_per_token_sq = 4.21e-7
decode_ms_per_seq = 2.0
kv_ms_per_1k_tokens = 4.0
num_gpu_blocks = 26000
block_size = 16
max_num_seqs = 256
max_num_batched_tokens = 8192
max_model_len = 131072
"#;
const TRUE_PER_SEQ: f64 = 2.0;
const TRUE_PER_1K: f64 = 4.0;

/// A file removed when dropped, also when the test fails.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The decode step is learned from the gaps between streamed tokens: from a prior three times
/// the workers' per-sequence and per-context costs, what one more stream of a typical prompt
/// adds to each step comes within reach of the workers' own, and the growth price follows it.
#[tokio::test]
async fn from_streams_gaps_the_filter_learns_the_decode_step() {
    let profile = TempFile(std::env::temp_dir().join(format!(
        "kvroute-slow-decode-{}-{:x}.toml",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    )));
    std::fs::write(&profile.0, STEP_PROFILE).unwrap();
    let k = PRIOR_SCALE;
    let stack = Stack::start(StackOptions {
        workers: 1,
        // One thread knows every stream's prompt (with more, each thread's mean stands for the
        // others' streams).
        envoy_concurrency: 1,
        sim_args: vec!["--profile".into(), profile.0.display().to_string()],
        model_overrides: json!({"profile": {
            "decode_ms_per_seq": TRUE_PER_SEQ * k,
            "decode_ms_per_1k_context": TRUE_PER_1K * k,
        }}),
        filter: json!({
            "calibration": {"min_samples": 10, "flush_samples": 1, "refresh_ms": 5},
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    stack.wait_healthy(1).await.unwrap();
    let http = reqwest::Client::new();
    // Batches of 1 to 8 streams sent together, prompts of 100 to 800 words.
    let mut sent = 0u64;
    for batch in [1u64, 4, 8, 2, 6, 3, 7, 5, 8, 1] {
        let sends = (0..batch).map(|i| {
            let (http, url) = (&http, stack.base_url());
            let words = 100 + ((sent + i) * 271 % 700) as usize;
            let body = json!({"model": MODEL, "max_tokens": 24, "stream": true,
                "messages": [{"role": "user",
                    "content": kvroute_testkit::textgen::words(5000 + sent + i, words)}]});
            async move { client::chat(http, &url, &body).await.unwrap() }
        });
        for r in futures::future::join_all(sends).await {
            assert_eq!(r.status, 200, "{}", r.body);
        }
        sent += batch;
    }
    let g = eventually("decode step samples", Duration::from_secs(10), || async {
        let g = gauges(&stack).await;
        (model_gauge(&g, "step_samples") >= (sent - 2) as f64).then_some(g)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: logs in {}", stack.dir.display()));
    let per_seq = model_gauge(&g, "step_ns_per_seq") / 1e6;
    let per_1k = model_gauge(&g, "step_ns_per_1k_context") / 1e6;
    let base = model_gauge(&g, "step_base_us") / 1e3;
    // What one more stream of a 600-token prompt adds to each step.
    let added = per_seq + per_1k * 0.6;
    let truth = TRUE_PER_SEQ + TRUE_PER_1K * 0.6;
    eprintln!(
        "learned base {base} ms, {per_seq} ms/seq, {per_1k} ms/1k: {added} ms (truth {truth})"
    );
    assert!(
        added > 0.7 * truth && added < 1.5 * truth,
        "a stream adds {added} ms per step, the workers' {truth} (prior {})",
        truth * k
    );
    assert!(base > 15.0 && base < 30.0, "the step's base {base} ms, the workers' 20");
    // Batches of unlike sizes and prompts tell the two apart too.
    for (got, want) in [(per_seq, TRUE_PER_SEQ), (per_1k, TRUE_PER_1K)] {
        assert!(got > 0.5 * want && got < 2.0 * want, "learned {got}, the workers' {want}");
    }
}
