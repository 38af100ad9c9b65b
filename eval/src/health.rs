//! Whether the host kept up during a run: the simulated workers' step lag (how late their
//! scheduler steps started against plan, from `kvroute_sim:step_lag_seconds`), the client's
//! send lag, and the host's CPU. A run past a bound measured the host, not the policy, and is
//! flagged invalid (the report excludes it from medians and says so).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::record::Health;

/// The histogram a simulated worker exports for its step lag.
const STEP_LAG: &str = "kvroute_sim:step_lag_seconds";

/// Bounds past which a run is invalid. Lags are in engine time (wall time multiplied by the
/// workers' speedup), so a compressed run is held to the same standard as a real-time one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthBounds {
    /// Step lag p99, engine ms: about two decode steps of the 8B profile.
    pub step_lag_p99_ms: f64,
    /// Client send lag p99, engine ms.
    pub send_lag_p99_ms: f64,
    /// Busy share of all cores over the run.
    pub cpu_busy: f64,
}

impl Default for HealthBounds {
    fn default() -> Self {
        HealthBounds { step_lag_p99_ms: 10.0, send_lag_p99_ms: 25.0, cpu_busy: 0.98 }
    }
}

/// Cumulative step-lag bucket counts of one worker: (upper bound in seconds, count).
pub type Buckets = Vec<(f64, u64)>;

/// The step-lag histogram buckets in a worker's `/metrics` text (summed over label sets).
pub fn parse_step_lag(text: &str) -> Option<Buckets> {
    kvroute_updater::engine_metrics::EngineMetrics::parse(text).histogram(STEP_LAG)
}

/// The upper bound (seconds) of the bucket holding quantile `q` of the steps between two
/// cumulative snapshots of the same histogram; `None` without steps in between.
pub fn quantile_between(before: &Buckets, after: &Buckets, q: f64) -> Option<f64> {
    let count = |bs: &Buckets, le: f64| bs.iter().find(|(b, _)| *b == le).map_or(0, |(_, c)| *c);
    let total = after.last().map(|(le, c)| c.saturating_sub(count(before, *le)))?;
    if total == 0 {
        return None;
    }
    let target = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
    after.iter().find(|(le, c)| c.saturating_sub(count(before, *le)) >= target).map(|(le, _)| *le)
}

/// Busy and total jiffies of all cores, from `/proc/stat` (Linux); `None` elsewhere.
pub fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu(stat.lines().next()?)
}

fn parse_cpu(line: &str) -> Option<(u64, u64)> {
    let fields: Vec<u64> =
        line.strip_prefix("cpu ")?.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal ...
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    let total: u64 = fields.iter().take(8).sum();
    Some((total.saturating_sub(idle), total))
}

/// Busy share between two [`cpu_times`] readings.
pub fn cpu_busy(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let busy = after.0.checked_sub(before.0)? as f64;
    let total = after.1.checked_sub(before.1)? as f64;
    (total > 0.0).then(|| busy / total)
}

/// Fetches every worker's step-lag histogram (workers without one are skipped).
pub async fn step_lags(http: &reqwest::Client, workers: &[String]) -> Vec<Option<Buckets>> {
    let one = |w: &String| {
        let url = format!("http://{w}/metrics");
        async move {
            let resp = http.get(url).timeout(Duration::from_secs(2)).send().await.ok()?;
            parse_step_lag(&resp.text().await.ok()?)
        }
    };
    futures::future::join_all(workers.iter().map(one)).await
}

/// The run's health from the readings around it; lags in engine ms.
pub fn assess(
    bounds: &HealthBounds,
    step_lag_p99_ms: Option<f64>,
    send_lag_p99_ms: f64,
    cpu_busy: Option<f64>,
) -> Health {
    let mut invalid = Vec::new();
    if let Some(l) = step_lag_p99_ms.filter(|l| *l > bounds.step_lag_p99_ms) {
        invalid.push(format!(
            "simulator step lag p99 {l:.1} ms > {:.1} ms: the workers could not keep time",
            bounds.step_lag_p99_ms
        ));
    }
    if send_lag_p99_ms > bounds.send_lag_p99_ms {
        invalid.push(format!(
            "client send lag p99 {send_lag_p99_ms:.1} ms > {:.1} ms: arrivals were late",
            bounds.send_lag_p99_ms
        ));
    }
    if let Some(c) = cpu_busy.filter(|c| *c > bounds.cpu_busy) {
        invalid.push(format!(
            "host CPU {:.0} % busy > {:.0} %",
            100.0 * c,
            100.0 * bounds.cpu_busy
        ));
    }
    Health { step_lag_p99_ms, send_lag_p99_ms, cpu_busy, invalid }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_lag_quantile_from_bucket_deltas() {
        let text = "# TYPE kvroute_sim:step_lag_seconds histogram\n\
            kvroute_sim:step_lag_seconds_bucket{model_name=\"m\",le=\"0.001\"} 90\n\
            kvroute_sim:step_lag_seconds_bucket{model_name=\"m\",le=\"0.005\"} 99\n\
            kvroute_sim:step_lag_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 100\n\
            kvroute_sim:step_lag_seconds_sum{model_name=\"m\"} 0.2\n";
        let after = parse_step_lag(text).unwrap();
        assert_eq!(after, vec![(0.001, 90), (0.005, 99), (f64::INFINITY, 100)]);
        let before = vec![(0.001, 80), (0.005, 80), (f64::INFINITY, 80)];
        // 20 steps between: 10 under 1 ms, 9 under 5 ms, 1 beyond.
        assert_eq!(quantile_between(&before, &after, 0.5), Some(0.001));
        assert_eq!(quantile_between(&before, &after, 0.6), Some(0.005));
        assert_eq!(quantile_between(&before, &after, 0.99), Some(f64::INFINITY));
        assert_eq!(quantile_between(&after, &after, 0.99), None);
        assert_eq!(parse_step_lag("vllm:num_requests_running 1\n"), None);
    }

    #[test]
    fn cpu_share_and_bounds() {
        let a = parse_cpu("cpu  100 0 100 800 0 0 0 0 0 0").unwrap();
        let b = parse_cpu("cpu  250 0 150 900 0 0 0 0 0 0").unwrap();
        assert_eq!(cpu_busy(a, b), Some(200.0 / 300.0));
        let ok = assess(&HealthBounds::default(), Some(5.0), 3.0, Some(0.5));
        assert!(ok.valid());
        let bad = assess(&HealthBounds::default(), Some(50.0), 300.0, Some(0.999));
        assert_eq!(bad.invalid.len(), 3);
    }
}
