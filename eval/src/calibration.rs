//! What the filter's online calibration learned by the end of a run: each Envoy's
//! `kvroute.calibration.*` stats, read from its admin `/stats` (plain `name: value` lines),
//! turned back into wall-clock milliseconds, with the filter's prior and the simulator's own
//! coefficients (divided by its time speedup: the filter measures wall-clock time) to compare
//! them with.
//!
//! Stats read (see docs/operations.md, "Metrics"): per model segment `<m>`,
//! `kvroute.calibration.<m>.{base_us, prefill_ns_per_token, prefill_sq_ps_per_token2,
//! interference_us, samples, active, step_base_us, step_ns_per_seq, step_ns_per_1k_context,
//! step_samples}` and `kvroute.calibration.<m>.worker.<w>.deviation_permille`;
//! the counters `kvroute.calibration.{estimates, estimates_within_15pct}`. Envoy may show the
//! names under `wasmcustom.`. Reading is best effort: a failed scrape records nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::topology::Topology;

/// How long one Envoy's admin may take to answer the scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);

/// The stats' common prefix.
const PREFIX: &str = "kvroute.calibration.";

/// The per-model gauges, after `kvroute.calibration.<m>.`.
const MODEL_GAUGES: [&str; 10] = [
    "base_us",
    "prefill_ns_per_token",
    "prefill_sq_ps_per_token2",
    "interference_us",
    "samples",
    "active",
    "step_base_us",
    "step_ns_per_seq",
    "step_ns_per_1k_context",
    "step_samples",
];

/// The four cost coefficients calibration learns from first bytes, and the decode step's
/// three it learns from streams' gaps, in wall-clock milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Coefficients {
    pub base_ms: f64,
    pub prefill_ms_per_token: f64,
    pub prefill_ms_per_token_sq: f64,
    pub decode_interference_ms: f64,
    /// A decode step's base (the filter's prior has none: 0).
    #[serde(default)]
    pub step_base_ms: f64,
    /// What one more sequence adds to a decode step.
    #[serde(default)]
    pub decode_ms_per_seq: f64,
    /// What 1 000 more tokens of context add to a decode step.
    #[serde(default)]
    pub decode_ms_per_1k_context: f64,
}

/// One model's learned state on one Envoy. A coefficient the scrape did not show is `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnedModel {
    #[serde(default)]
    pub base_ms: Option<f64>,
    #[serde(default)]
    pub prefill_ms_per_token: Option<f64>,
    #[serde(default)]
    pub prefill_ms_per_token_sq: Option<f64>,
    #[serde(default)]
    pub decode_interference_ms: Option<f64>,
    /// Samples the model's state holds.
    #[serde(default)]
    pub samples: Option<u64>,
    /// The router decides with the calibrated profile.
    #[serde(default)]
    pub active: Option<bool>,
    /// The decode step learned from streams' gaps: its base, per sequence, per 1 000 tokens of
    /// context (ms), and its samples.
    #[serde(default)]
    pub step_base_ms: Option<f64>,
    #[serde(default)]
    pub decode_ms_per_seq: Option<f64>,
    #[serde(default)]
    pub decode_ms_per_1k_context: Option<f64>,
    #[serde(default)]
    pub step_samples: Option<u64>,
    /// Worker (its address where known, else its stat segment) → deviation factor (observed
    /// over model); workers without a published deviation are absent.
    #[serde(default)]
    pub deviations: BTreeMap<String, f64>,
}

/// One Envoy's calibration stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvoyCalibration {
    /// Index of the Envoy instance in the topology.
    pub envoy: usize,
    /// Model stat segment (the model name, non-alphanumerics as `_`) → its learned state.
    #[serde(default)]
    pub models: BTreeMap<String, LearnedModel>,
    /// Decisions whose TTFT estimate was compared with the observed first byte.
    #[serde(default)]
    pub estimates: Option<u64>,
    /// Of those, estimates within 15 % of the observed time.
    #[serde(default)]
    pub estimates_within_15pct: Option<u64>,
}

/// What calibration had learned at the end of a kvroute run, and what to compare it with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunCalibration {
    /// The simulated workers' time speedup (1 for real time or external workers).
    pub speedup: f64,
    /// The filter's configured profile (its prior), wall-clock ms.
    pub prior: Coefficients,
    /// The simulator's nearest counterparts (step floor, prefill per token and per token²,
    /// decode per sequence) divided by `speedup`: wall-clock ms. `None` for external workers.
    #[serde(default)]
    pub simulator: Option<Coefficients>,
    /// The Envoys whose stats could be read, in topology order.
    pub envoys: Vec<EnvoyCalibration>,
}

/// Parses an admin `/stats` text into Envoy `envoy`'s calibration; `None` when it holds no
/// calibration stat. Lines that are not `kvroute.calibration.* : <integer>` in a known shape
/// (histograms, other stats, garbage) are skipped.
pub fn parse(envoy: usize, text: &str) -> Option<EnvoyCalibration> {
    let mut out = EnvoyCalibration { envoy, ..Default::default() };
    let mut seen = false;
    for line in text.lines() {
        let Some((name, value)) = line.trim().split_once(':') else { continue };
        let name = name.trim();
        let name = name.strip_prefix("wasmcustom.").unwrap_or(name);
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Ok(v) = value.trim().parse::<u64>() else { continue };
        let parts: Vec<&str> = rest.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            continue;
        }
        match parts.as_slice() {
            ["estimates"] => out.estimates = Some(v),
            ["estimates_within_15pct"] => out.estimates_within_15pct = Some(v),
            [m, field] if MODEL_GAUGES.contains(field) => {
                let lm = out.models.entry((*m).to_owned()).or_default();
                let x = v as f64;
                match *field {
                    "base_us" => lm.base_ms = Some(x / 1e3),
                    "prefill_ns_per_token" => lm.prefill_ms_per_token = Some(x / 1e6),
                    "prefill_sq_ps_per_token2" => lm.prefill_ms_per_token_sq = Some(x / 1e9),
                    "interference_us" => lm.decode_interference_ms = Some(x / 1e3),
                    "samples" => lm.samples = Some(v),
                    "step_base_us" => lm.step_base_ms = Some(x / 1e3),
                    "step_ns_per_seq" => lm.decode_ms_per_seq = Some(x / 1e6),
                    "step_ns_per_1k_context" => lm.decode_ms_per_1k_context = Some(x / 1e6),
                    "step_samples" => lm.step_samples = Some(v),
                    _ => lm.active = Some(v != 0),
                }
            }
            // A deviation of 0 was never published (a published one is clamped above 0).
            [m, "worker", w, "deviation_permille"] if v > 0 => {
                let lm = out.models.entry((*m).to_owned()).or_default();
                lm.deviations.insert((*w).to_owned(), v as f64 / 1e3);
            }
            _ => continue,
        }
        seen = true;
    }
    seen.then_some(out)
}

/// A name as the filter writes it into a stat segment (`filter/src/metrics.rs`,
/// `worker_segment`): every non-alphanumeric character as `_`.
pub fn segment(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// Replaces worker segments in the deviations by the worker addresses they were made from,
/// where exactly one of `workers` makes that segment.
pub fn name_workers(envoy: &mut EnvoyCalibration, workers: &[String]) {
    for lm in envoy.models.values_mut() {
        let deviations = std::mem::take(&mut lm.deviations);
        lm.deviations = deviations
            .into_iter()
            .map(|(seg, d)| {
                let mut matching = workers.iter().filter(|w| segment(w) == seg);
                match (matching.next(), matching.next()) {
                    (Some(w), None) => (w.clone(), d),
                    _ => (seg, d),
                }
            })
            .collect();
    }
}

/// The simulator's coefficients nearest to the filter's four, divided by the speedup (wall
/// clock); `None` for external workers or an unreadable profile.
pub fn simulator_wall(topo: &Topology) -> Option<Coefficients> {
    if !topo.workers.external.is_empty() {
        return None;
    }
    let p = kvroute_sim::profile::HardwareProfile::load(&topo.workers.profile).ok()?;
    let k = speedup(topo);
    Some(Coefficients {
        base_ms: p.step_floor_ms / k,
        prefill_ms_per_token: topo.workers.prefill_ms_per_token.unwrap_or(p.prefill_ms_per_token)
            / k,
        prefill_ms_per_token_sq: p.prefill_ms_per_token_sq / k,
        decode_interference_ms: p.decode_ms_per_seq / k,
        step_base_ms: p.step_floor_ms / k,
        decode_ms_per_seq: p.decode_ms_per_seq / k,
        decode_ms_per_1k_context: p.kv_ms_per_1k_tokens / k,
    })
}

fn speedup(topo: &Topology) -> f64 {
    let s = topo.workers.speedup;
    if s.is_finite() && s > 0.0 {
        s
    } else {
        1.0
    }
}

/// Reads the calibration stats of every Envoy (`admins`: their admin base URLs, in topology
/// order) at the end of a kvroute run. Envoys that do not answer are left out; `None` when
/// none answered with calibration stats. Never fails the run.
pub async fn scrape(
    admins: &[String],
    topo: &Topology,
    workers: &[String],
) -> Option<RunCalibration> {
    let http = reqwest::Client::builder().timeout(SCRAPE_TIMEOUT).build().ok()?;
    let mut envoys = Vec::new();
    for (i, admin) in admins.iter().enumerate() {
        let url = format!("{admin}/stats?filter=kvroute.calibration");
        let Ok(resp) = http.get(&url).send().await else { continue };
        if !resp.status().is_success() {
            continue;
        }
        let Ok(text) = resp.text().await else { continue };
        if let Some(mut e) = parse(i, &text) {
            name_workers(&mut e, workers);
            envoys.push(e);
        }
    }
    if envoys.is_empty() {
        return None;
    }
    let prior = topo.filter.profile();
    Some(RunCalibration {
        speedup: speedup(topo),
        prior: Coefficients {
            base_ms: prior.prefill_base_ms,
            prefill_ms_per_token: prior.prefill_ms_per_token,
            prefill_ms_per_token_sq: prior.prefill_ms_per_token_sq,
            decode_interference_ms: prior.decode_interference_ms,
            step_base_ms: 0.0,
            decode_ms_per_seq: prior.decode_ms_per_seq,
            decode_ms_per_1k_context: prior.decode_ms_per_1k_context,
        },
        simulator: simulator_wall(topo),
        envoys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "\
wasmcustom.kvroute.calibration.kvroute_demo.base_us: 4500
wasmcustom.kvroute.calibration.kvroute_demo.prefill_ns_per_token: 109000
wasmcustom.kvroute.calibration.kvroute_demo.prefill_sq_ps_per_token2: 420
wasmcustom.kvroute.calibration.kvroute_demo.interference_us: 250
wasmcustom.kvroute.calibration.kvroute_demo.samples: 60
wasmcustom.kvroute.calibration.kvroute_demo.active: 1
wasmcustom.kvroute.calibration.kvroute_demo.step_base_us: 4870
wasmcustom.kvroute.calibration.kvroute_demo.step_ns_per_seq: 31000
wasmcustom.kvroute.calibration.kvroute_demo.step_ns_per_1k_context: 52000
wasmcustom.kvroute.calibration.kvroute_demo.step_samples: 40
wasmcustom.kvroute.calibration.kvroute_demo.worker.127_0_0_1_8001.deviation_permille: 2600
wasmcustom.kvroute.calibration.kvroute_demo.worker.127_0_0_1_8002.deviation_permille: 990
wasmcustom.kvroute.calibration.kvroute_demo.worker.127_0_0_1_8003.deviation_permille: 0
wasmcustom.kvroute.calibration.estimates: 200
wasmcustom.kvroute.calibration.estimates_within_15pct: 150
wasmcustom.kvroute.calibration.samples: 180
wasmcustom.kvroute.calibration.estimate_error_pct: P0(nan,1) P25(nan,5.1) P50(nan,7.2)
";

    #[test]
    fn stats_become_wall_clock_coefficients() {
        let e = parse(1, STATS).unwrap();
        assert_eq!(e.envoy, 1);
        assert_eq!((e.estimates, e.estimates_within_15pct), (Some(200), Some(150)));
        assert_eq!(e.models.len(), 1);
        let m = &e.models["kvroute_demo"];
        assert_eq!(m.base_ms, Some(4.5));
        assert_eq!(m.prefill_ms_per_token, Some(0.109));
        assert_eq!(m.prefill_ms_per_token_sq, Some(4.2e-7));
        assert_eq!(m.decode_interference_ms, Some(0.25));
        assert_eq!((m.samples, m.active), (Some(60), Some(true)));
        assert_eq!((m.step_base_ms, m.step_samples), (Some(4.87), Some(40)));
        assert_eq!((m.decode_ms_per_seq, m.decode_ms_per_1k_context), (Some(0.031), Some(0.052)));
        // A deviation never published (0) is left out.
        let devs: Vec<(&str, f64)> = m.deviations.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(devs, [("127_0_0_1_8001", 2.6), ("127_0_0_1_8002", 0.99)]);
    }

    #[test]
    fn names_without_the_namespace_and_garbage_lines() {
        let text = "\
kvroute.calibration.m.base_us: 7000
kvroute.calibration.m.active: 0
garbage without a colon
: 12
kvroute.calibration.m.base_us: -5
kvroute.calibration.m.prefill_ns_per_token: 1.5e3
kvroute.calibration.m.samples: lots
kvroute.calibration.m.unknown_gauge: 3
kvroute.calibration..base_us: 9
kvroute.calibration.m.worker.w.other: 9
kvroute.calibration.m.worker.w.x.deviation_permille: 9
kvroute.calibration.lost_updates: 4
cluster.workers.upstream_rq_total: 12
kvroute.decision_time_us: P50(1,2)
kvroute.calibration.ünïcode.base_us: 1000
";
        let e = parse(0, text).unwrap();
        let keys: Vec<&str> = e.models.keys().map(String::as_str).collect();
        assert_eq!(keys, ["m", "ünïcode"]);
        let m = &e.models["m"];
        assert_eq!((m.base_ms, m.active), (Some(7.0), Some(false)));
        assert_eq!((m.prefill_ms_per_token, m.samples), (None, None));
        assert!(m.deviations.is_empty());
        assert_eq!((e.estimates, e.estimates_within_15pct), (None, None));
        assert_eq!(parse(0, ""), None);
        assert_eq!(parse(0, "cluster.x: 1\nnonsense\n\u{0}\u{ffff}: 3\n"), None);
        assert_eq!(parse(0, "kvroute.calibration.m.unknown_gauge: 3\n"), None);
    }

    #[test]
    fn worker_segments_are_named_back_when_unambiguous() {
        let mut e = parse(0, STATS).unwrap();
        let workers = vec!["127.0.0.1:8001".to_string(), "127.0.0.1:8009".to_string()];
        name_workers(&mut e, &workers);
        let keys: Vec<&str> =
            e.models["kvroute_demo"].deviations.keys().map(String::as_str).collect();
        assert_eq!(keys, ["127.0.0.1:8001", "127_0_0_1_8002"]);
        // Two addresses with the same segment: the segment stays.
        let mut e = parse(0, STATS).unwrap();
        name_workers(&mut e, &["127.0.0.1:8001".into(), "127_0_0_1:8001".into()]);
        assert!(e.models["kvroute_demo"].deviations.contains_key("127_0_0_1_8001"));
    }

    #[test]
    fn simulator_coefficients_are_divided_by_the_speedup() {
        let mut topo = Topology::default();
        topo.workers.speedup = 4.0;
        topo.workers.prefill_ms_per_token = Some(0.2);
        let s = simulator_wall(&topo).unwrap();
        let p = kvroute_sim::profile::HardwareProfile::load(&topo.workers.profile).unwrap();
        assert_eq!(s.prefill_ms_per_token, 0.05);
        assert_eq!(s.base_ms, p.step_floor_ms / 4.0);
        assert_eq!(s.decode_interference_ms, p.decode_ms_per_seq / 4.0);
    }

    #[test]
    fn old_json_without_optional_fields_loads() {
        let c: RunCalibration = serde_json::from_str(
            r#"{"speedup":2.0,"prior":{"base_ms":5.0,"prefill_ms_per_token":0.033,
            "prefill_ms_per_token_sq":4.2e-7,"decode_interference_ms":0.5},
            "envoys":[{"envoy":0,"models":{"m":{"base_ms":4.0}}}]}"#,
        )
        .unwrap();
        assert_eq!(c.envoys[0].models["m"].base_ms, Some(4.0));
        assert_eq!(c.simulator, None);
    }

    /// Serves `body` to one HTTP request on a loopback port; returns the base URL and the
    /// request line it got.
    async fn one_shot(body: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = sock.read(&mut buf).await.unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_owned();
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(resp.as_bytes()).await.unwrap();
            head
        });
        (url, task)
    }

    #[tokio::test]
    async fn scrape_keeps_the_envoys_that_answer() {
        let (url, server) = one_shot(STATS).await;
        // A port nothing listens on (bound, then released).
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let admins = vec![format!("http://{dead}"), url];
        let mut topo = Topology::default();
        topo.workers.speedup = 2.0;
        let workers = vec!["127.0.0.1:8001".to_string()];
        let c = scrape(&admins, &topo, &workers).await.unwrap();
        assert!(server.await.unwrap().starts_with("GET /stats?filter=kvroute.calibration "));
        assert_eq!(c.speedup, 2.0);
        assert_eq!(c.prior.prefill_ms_per_token, topo.filter.profile().prefill_ms_per_token);
        assert!(c.simulator.is_some());
        assert_eq!(c.envoys.len(), 1);
        assert_eq!(c.envoys[0].envoy, 1);
        assert!(c.envoys[0].models["kvroute_demo"].deviations.contains_key("127.0.0.1:8001"));
        // Nobody answers: nothing recorded, no error.
        assert_eq!(scrape(&admins[..1], &topo, &workers).await, None);
    }
}
