//! Runs one policy on a schedule: brings the cluster up, replays every arrival open-loop (each
//! request at its scheduled time, whatever happened to the others), applies the faults on time,
//! samples every worker's queue, and collects one record per request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::{watch, Mutex};

use crate::cluster::{reset_prefix_caches, Cluster, Policy, TimedFault};
use crate::health::{self, HealthBounds};
use crate::record::{QueueSample, RunResult, Slo};
use crate::schedule::Scheduled;
use crate::send::{send, SendCtx};
use crate::topology::Topology;

/// How often every worker's `/metrics` is scraped for its queue.
pub const QUEUE_SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Knobs of a run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// A request that has not finished by then counts as failed.
    pub request_timeout: Duration,
    /// Draw a progress bar (stderr, only on a terminal).
    pub progress: bool,
    /// Which repetition of the cell this is (recorded in the result).
    pub repeat: usize,
    /// Offered load as a multiple of the schedule's own rate: arrival times are divided by it.
    pub rate_scale: f64,
    /// Share of requests whose what-if TTFT is asked of every worker (regret sampling).
    pub whatif_sample: f64,
    /// Past these the run is flagged invalid.
    pub health: HealthBounds,
    /// Unrecorded warm-up requests per Envoy before the schedule (see [`crate::warmup`]).
    pub warmup_per_envoy: usize,
    /// Workers that hold the schedule's shared prefixes before it starts (see
    /// [`crate::prewarm`]).
    pub prewarm: Vec<usize>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            request_timeout: Duration::from_secs(120),
            progress: true,
            repeat: 0,
            rate_scale: 1.0,
            whatif_sample: 0.25,
            health: HealthBounds::default(),
            warmup_per_envoy: 0,
            prewarm: Vec::new(),
        }
    }
}

/// How engine time maps to the wall clock in a run: the workers run `speedup` times faster than
/// real time, and the schedule is offered `rate_scale` times faster than written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    pub speedup: f64,
    pub rate_scale: f64,
}

impl Clock {
    /// The wall-clock offset of schedule time `at`.
    pub fn wall(&self, at: Duration) -> Duration {
        at.div_f64((self.speedup * self.rate_scale).max(1e-9))
    }

    /// Engine milliseconds of a wall-clock duration.
    pub fn engine_ms(&self, wall: Duration) -> f64 {
        wall.as_secs_f64() * 1000.0 * self.speedup
    }
}

/// Runs `policy` on `schedule`. Every time in the result is engine time, arrivals as offered
/// (the schedule's time divided by the rate scale).
pub async fn run_policy(
    topo: &Topology,
    policy: Policy,
    schedule: &[Scheduled],
    slo: Slo,
    faults: &[TimedFault],
    opts: &RunOptions,
) -> anyhow::Result<RunResult> {
    let clock = Clock { speedup: topo.workers.speedup, rate_scale: opts.rate_scale };
    let cluster = Cluster::start(topo, policy, faults).await?;
    let urls = cluster.urls();
    let workers = cluster.addrs();
    let cluster = Arc::new(Mutex::new(cluster));
    let (stop_tx, stop_rx) = watch::channel(false);
    let probe = reqwest::Client::new();
    if opts.warmup_per_envoy > 0 {
        let warm = crate::warmup::requests(schedule, opts.warmup_per_envoy, urls.len());
        crate::warmup::run(&probe, &urls, &warm).await;
        // The schedule starts on empty prefix caches, as without a warm-up.
        reset_prefix_caches(&workers, &topo.workers.reset_path).await?;
    }
    if !opts.prewarm.is_empty() {
        let c = cluster.lock().await;
        crate::prewarm::run(&c, schedule, &opts.prewarm, Duration::from_secs(60)).await?;
    }
    let lag_before = health::step_lags(&probe, &workers).await;
    let cpu_before = health::cpu_times();
    let start = tokio::time::Instant::now();
    let sampler = tokio::spawn(sample_queues(workers.clone(), start, clock, stop_rx.clone()));
    let fault_task =
        tokio::spawn(run_faults(cluster.clone(), faults.to_vec(), start, clock, stop_rx));
    let bar = progress_bar(opts.progress, schedule.len() as u64, policy.name());
    let http = reqwest::Client::new();
    let ctx = Arc::new(SendCtx {
        policy,
        workers: workers.clone(),
        whatif_sample: opts.whatif_sample,
        speedup: topo.workers.speedup,
        slo,
        timeout: opts.request_timeout,
    });
    let tasks: Vec<_> = schedule
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let envoy = i % urls.len();
            let (http, url, s, bar) = (http.clone(), urls[envoy].clone(), s.clone(), bar.clone());
            let ctx = Arc::clone(&ctx);
            let net = topo.net.clone();
            tokio::spawn(async move {
                let due = start + clock.wall(s.at);
                tokio::time::sleep_until(due).await;
                let lag = tokio::time::Instant::now().saturating_duration_since(due);
                let mut r = send(&http, &url, i, &s, &ctx).await;
                r.envoy = Some(envoy);
                r.at_ms = s.at.as_secs_f64() * 1000.0 / clock.rate_scale;
                r.send_lag_ms = clock.engine_ms(lag);
                if let Some(net) = &net {
                    let tags = net.cohort_tags(&ctx.workers, &r);
                    r.cohorts.extend(tags);
                }
                bar.inc(1);
                r
            })
        })
        .collect();
    let mut records = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(r) => records.push(r),
            Err(e) => anyhow::bail!("request task {i} failed: {e}"),
        }
    }
    let duration_s = clock.engine_ms(start.elapsed()) / 1000.0;
    let lag_after = health::step_lags(&probe, &workers).await;
    let step_lag_p99_ms = lag_before
        .iter()
        .zip(&lag_after)
        .filter_map(|(b, a)| health::quantile_between(b.as_ref()?, a.as_ref()?, 0.99))
        .reduce(f64::max)
        .map(|s| s * 1000.0 * clock.speedup);
    let mut send_lags: Vec<f64> = records.iter().map(|r| r.send_lag_ms).collect();
    send_lags.sort_by(f64::total_cmp);
    let cpu = cpu_before.zip(health::cpu_times()).and_then(|(b, a)| health::cpu_busy(b, a));
    let health = health::assess(
        &opts.health,
        step_lag_p99_ms,
        kvroute_stack::nearest_rank(&send_lags, 0.99).unwrap_or(0.0),
        cpu,
    );
    bar.finish_and_clear();
    let _ = stop_tx.send(true);
    let queue = sampler.await.unwrap_or_default();
    if let Ok(Err(e)) = fault_task.await {
        anyhow::bail!("applying faults: {e}");
    }
    // What the filter's calibration learned, read before the stack stops (best effort).
    let calibration = if policy.filter() {
        let admins: Vec<String> =
            cluster.lock().await.envoys.iter().map(|e| e.admin_url()).collect();
        crate::calibration::scrape(&admins, topo, &workers).await
    } else {
        None
    };
    cluster.lock().await.check_peer()?;
    // Stop every process of this policy before the next one starts.
    drop(cluster);
    Ok(RunResult {
        policy: policy.name().into(),
        repeat: opts.repeat,
        rate_scale: opts.rate_scale,
        speedup: topo.workers.speedup,
        health,
        workers,
        duration_s,
        records,
        queue,
        calibration,
    })
}

fn progress_bar(show: bool, len: u64, name: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "  {prefix:<18} [{elapsed_precise}] {bar:30} {pos}/{len} requests finished",
    ) {
        bar.set_style(style);
    }
    bar.set_prefix(name.to_owned());
    bar
}

async fn run_faults(
    cluster: Arc<Mutex<Cluster>>,
    faults: Vec<TimedFault>,
    start: tokio::time::Instant,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    // (time, index, is_end), in time order.
    let mut events: Vec<(Duration, usize, bool)> = Vec::new();
    for (i, f) in faults.iter().enumerate() {
        let at = Duration::from_millis(f.at_ms);
        events.push((at, i, false));
        if !f.fault.duration().is_zero() {
            events.push((at + f.fault.duration(), i, true));
        }
    }
    events.sort();
    for (at, i, end) in events {
        tokio::select! {
            _ = tokio::time::sleep_until(start + clock.wall(at)) => {}
            _ = stop.changed() => {}
        }
        let mut c = cluster.lock().await;
        let f = &faults[i].fault;
        if end {
            c.end(f).await?;
        } else {
            c.apply(f).await?;
        }
    }
    Ok(())
}

async fn sample_queues(
    workers: Vec<String>,
    start: tokio::time::Instant,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
) -> Vec<QueueSample> {
    let http = match reqwest::Client::builder().timeout(Duration::from_millis(500)).build() {
        Ok(h) => h,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    let began = Instant::now();
    // Bounded: at most a day of samples.
    while began.elapsed() < Duration::from_secs(86_400) && !*stop.borrow() {
        for (i, w) in workers.iter().enumerate() {
            if let Some((running, waiting)) = scrape_queue(&http, w).await {
                out.push(QueueSample {
                    t_ms: clock.engine_ms(start.elapsed()),
                    worker: i,
                    running,
                    waiting,
                });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(QUEUE_SAMPLE_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
    out
}

/// `vllm:num_requests_running` and `_waiting` (SGLang: `sglang:num_running_reqs`,
/// `sglang:num_queue_reqs`) from a worker's `/metrics`.
pub async fn scrape_queue(http: &reqwest::Client, worker: &str) -> Option<(u32, u32)> {
    let text = http.get(format!("http://{worker}/metrics")).send().await.ok()?.text().await.ok()?;
    parse_queue(&text)
}

/// The same reading the updater makes of a worker's load.
pub fn parse_queue(text: &str) -> Option<(u32, u32)> {
    let load = kvroute_updater::engine_metrics::parse_load(text, 0);
    Some((load.running?.max(0.0) as u32, load.waiting.unwrap_or(0.0).max(0.0) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_from_vllm_and_sglang_metrics() {
        let vllm = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 2\n";
        assert_eq!(parse_queue(vllm), Some((3, 2)));
        let sglang = "sglang:num_running_reqs{model_name=\"m\"} 5\nsglang:num_queue_reqs{model_name=\"m\"} 1\n";
        assert_eq!(parse_queue(sglang), Some((5, 1)));
        assert_eq!(parse_queue("other 1\n"), None);
        let two_engines = "vllm:num_requests_running{engine=\"0\"} 1 1700000000\nvllm:num_requests_running{engine=\"1\"} 2\nvllm:num_requests_waiting 4\n";
        assert_eq!(parse_queue(two_engines), Some((3, 4)));
    }
}
