//! The bench's figures per router and prompt size: ratios to the buffer-only baseline (the mean
//! of its two runs, before and after the others), the A/A noise floor, the printed table and its
//! JSON. Pure: everything here is computed from the samples.

use serde_json::{json, Value};

/// One router's measured window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouterSample {
    /// Requests answered (all succeeded) in the window.
    pub requests: u64,
    /// Length of the window, seconds.
    pub secs: f64,
    /// CPU seconds of the router's process tree in the window.
    pub cpu_s: f64,
    /// Peak (`VmHWM`) and end (`VmRSS`) resident memory of the tree at the end, kB.
    pub hwm_kb: u64,
    pub rss_kb: u64,
    /// Upstream calls per client request in the window, by kind (`chat`, `tokenize`, ...).
    pub upstream_calls: Vec<(String, f64)>,
}

impl RouterSample {
    pub fn rps(&self) -> f64 {
        if self.secs > 0.0 {
            self.requests as f64 / self.secs
        } else {
            0.0
        }
    }

    /// CPU seconds per 1000 requests.
    pub fn cpu_per_1k(&self) -> f64 {
        if self.requests > 0 {
            self.cpu_s * 1000.0 / self.requests as f64
        } else {
            f64::NAN
        }
    }
}

/// A router's row: its sample and its ratios to the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterRow {
    pub router: String,
    pub sample: RouterSample,
    /// Requests/s over the baseline's.
    pub rps_ratio: f64,
    /// CPU per request over the baseline's.
    pub cpu_ratio: f64,
}

/// One prompt size: every router's row, the baseline runs first and last.
#[derive(Debug, Clone, PartialEq)]
pub struct OverheadTable {
    pub prompt: String,
    pub rows: Vec<RouterRow>,
    /// |run 1 - run 2| / mean of the two baseline runs, for requests/s and CPU per request.
    pub rps_noise: f64,
    pub cpu_noise: f64,
}

/// The baseline's rows are `buffer-only (1)` (run first) and `buffer-only (2)` (run last).
pub const BASELINE: &str = "buffer-only";

fn rel_gap(a: f64, b: f64) -> f64 {
    let mean = (a + b) / 2.0;
    if mean > 0.0 {
        (a - b).abs() / mean
    } else {
        f64::NAN
    }
}

fn ratio(x: f64, base: f64) -> f64 {
    if base > 0.0 {
        x / base
    } else {
        f64::NAN
    }
}

/// The table from the first baseline run, the routers in the order run, and the second
/// baseline run.
pub fn summarize(
    prompt: &str,
    first: RouterSample,
    routers: Vec<(String, RouterSample)>,
    last: RouterSample,
) -> OverheadTable {
    let base_rps = (first.rps() + last.rps()) / 2.0;
    let base_cpu = (first.cpu_per_1k() + last.cpu_per_1k()) / 2.0;
    let rps_noise = rel_gap(first.rps(), last.rps());
    let cpu_noise = rel_gap(first.cpu_per_1k(), last.cpu_per_1k());
    let mut all = vec![(format!("{BASELINE} (1)"), first)];
    all.extend(routers);
    all.push((format!("{BASELINE} (2)"), last));
    let rows = all
        .into_iter()
        .map(|(router, sample)| RouterRow {
            rps_ratio: ratio(sample.rps(), base_rps),
            cpu_ratio: ratio(sample.cpu_per_1k(), base_cpu),
            router,
            sample,
        })
        .collect();
    OverheadTable { prompt: prompt.to_owned(), rows, rps_noise, cpu_noise }
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// The table as printed: one line per router.
pub fn render(t: &OverheadTable) -> String {
    let mut out = format!(
        "prompt {}: noise floor (buffer-only run twice) {:.1}% requests/s, {:.1}% CPU/request\n",
        t.prompt,
        t.rps_noise * 100.0,
        t.cpu_noise * 100.0
    );
    out += &format!(
        "{:<26} {:>9} {:>7} {:>12} {:>7} {:>10} {:>9}  {}\n",
        "router",
        "req/s",
        "ratio",
        "CPU s/1000",
        "ratio",
        "peak MiB",
        "end MiB",
        "upstream calls/request"
    );
    for r in &t.rows {
        let s = &r.sample;
        // Kinds under 0.005 per request (the routers' periodic health checks) are left out.
        let calls: Vec<String> = s
            .upstream_calls
            .iter()
            .filter(|(_, v)| *v >= 0.005)
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        out += &format!(
            "{:<26} {:>9.0} {:>6.2}x {:>12.2} {:>6.2}x {:>10.0} {:>9.0}  {}\n",
            r.router,
            s.rps(),
            r.rps_ratio,
            s.cpu_per_1k(),
            r.cpu_ratio,
            mib(s.hwm_kb),
            mib(s.rss_kb),
            calls.join(", ")
        );
    }
    out
}

/// Non-finite numbers (no requests) become JSON null.
fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// The table as JSON.
pub fn to_json(t: &OverheadTable) -> Value {
    let rows: Vec<Value> = t
        .rows
        .iter()
        .map(|r| {
            let s = &r.sample;
            let calls: serde_json::Map<String, Value> =
                s.upstream_calls.iter().map(|(k, v)| (k.clone(), num(*v))).collect();
            json!({"router": r.router, "requests": s.requests, "secs": num(s.secs),
                   "rps": num(s.rps()), "rps_ratio": num(r.rps_ratio),
                   "cpu_s": num(s.cpu_s), "cpu_s_per_1000": num(s.cpu_per_1k()),
                   "cpu_ratio": num(r.cpu_ratio), "peak_rss_kb": s.hwm_kb, "end_rss_kb": s.rss_kb,
                   "upstream_calls_per_request": calls})
        })
        .collect();
    json!({"prompt": t.prompt, "noise_floor": {"rps": num(t.rps_noise), "cpu_per_request": num(t.cpu_noise)},
           "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(requests: u64, secs: f64, cpu_s: f64) -> RouterSample {
        RouterSample {
            requests,
            secs,
            cpu_s,
            hwm_kb: 2048,
            rss_kb: 1024,
            ..RouterSample::default()
        }
    }

    #[test]
    fn ratios_are_to_the_mean_of_both_baseline_runs() {
        // Baseline: 1000 and 900 req/s over 10 s; 1 s and 0.9 s of CPU per 1000 requests.
        let first = sample(10_000, 10.0, 10.0);
        let last = sample(9_000, 10.0, 8.1);
        let router = sample(4_750, 10.0, 9.5); // 475 req/s, 2 CPU s per 1000
        let t = summarize("short", first, vec![("kvroute".into(), router)], last);
        assert_eq!(t.rows.len(), 3);
        assert_eq!(t.rows[0].router, "buffer-only (1)");
        assert_eq!(t.rows[2].router, "buffer-only (2)");
        let r = &t.rows[1];
        assert!((r.sample.rps() - 475.0).abs() < 1e-9);
        assert!((r.rps_ratio - 0.5).abs() < 1e-9, "{}", r.rps_ratio);
        assert!((r.sample.cpu_per_1k() - 2.0).abs() < 1e-9);
        assert!((r.cpu_ratio - 2.0 / 0.95).abs() < 1e-9, "{}", r.cpu_ratio);
        // Noise: |1000 - 900| / 950 and |1.0 - 0.9| / 0.95.
        assert!((t.rps_noise - 100.0 / 950.0).abs() < 1e-9);
        assert!((t.cpu_noise - 0.1 / 0.95).abs() < 1e-9);
    }

    #[test]
    fn empty_windows_give_nan_and_json_null_not_a_panic() {
        let t = summarize("8k", sample(0, 0.0, 0.0), vec![], sample(0, 0.0, 0.0));
        assert!(t.rows[0].sample.cpu_per_1k().is_nan());
        assert_eq!(t.rows[0].sample.rps(), 0.0);
        assert!(t.rps_noise.is_nan());
        let j = to_json(&t);
        assert_eq!(j["noise_floor"]["rps"], Value::Null);
        assert_eq!(j["rows"][0]["cpu_s_per_1000"], Value::Null);
    }

    #[test]
    fn rendered_table_and_json_carry_every_router() {
        let mut router = sample(500, 10.0, 1.0);
        router.upstream_calls =
            vec![("chat".into(), 1.0), ("tokenize".into(), 2.0), ("probe".into(), 0.001)];
        let t = summarize(
            "short",
            sample(1000, 10.0, 1.0),
            vec![("smg".into(), router)],
            sample(1000, 10.0, 1.0),
        );
        let text = render(&t);
        assert_eq!(text.lines().count(), 2 + 3);
        let smg = text.lines().find(|l| l.starts_with("smg")).expect("smg line");
        assert!(
            smg.contains("0.50x") && smg.contains("2.00x") && smg.contains("tokenize 2.00"),
            "{smg}"
        );
        assert!(text.lines().next().is_some_and(|l| l.contains("0.0% requests/s")));
        let j = to_json(&t);
        assert_eq!(j["rows"][1]["router"], "smg");
        assert_eq!(j["rows"][1]["upstream_calls_per_request"]["tokenize"], 2.0);
        assert_eq!(j["rows"][1]["peak_rss_kb"], 2048);
    }
}
