//! kvroute-soak: a long run of the whole stack (Envoy with the kvroute filter, kvroute-updater,
//! simulated workers) at a steady open-loop rate of multi-turn conversations, with a fault every
//! few minutes in rotation: a worker crashed and restarted, the updater restarted, a burst of
//! bad requests, a deliberate VM abort through the filter's fault injection. Every sample
//! period it records the VmRSS of Envoy and of the updater and the success rate and latency of
//! the period; at the end it writes `soak.csv`, `rss.svg` and `summary.md` to `--out`.
//!
//! `kvroute-soak --minutes 2` is a quick check (faults every fifth of the run); the default is
//! 30 minutes with a fault every 150 s. A benchmark, not a test: it reports, it does not judge
//! (beyond saying whether memory is flat after warm-up).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use kvroute_stack::client;
use kvroute_stack::nearest_rank;
use kvroute_stack::rawhttp::{self, Proto, RawRequest};
use kvroute_stack::stack::{Stack, StackOptions, MODEL};
use kvroute_stack::workload::Conversation;
use plotters::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const TRAP_PATH: &str = "/kvroute/trap";

#[derive(Parser, Debug)]
#[command(
    about = "Soak: the full stack under steady load and rotating faults; RSS and success over time"
)]
struct Args {
    /// Length of the run.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Requests per second, open loop.
    #[arg(long, default_value_t = 8.0)]
    rate: f64,
    /// Simulated workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Seconds between faults (default: 150, or a fifth of runs shorter than 15 minutes).
    #[arg(long)]
    fault_every_s: Option<f64>,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0)]
    sample_s: f64,
    /// Envoy worker threads (each has its own VM).
    #[arg(long, default_value_t = 4)]
    envoy_concurrency: u32,
    /// Fraction of requests that stream.
    #[arg(long, default_value_t = 0.25)]
    stream_fraction: f64,
    /// Seed of the load's conversations and of which requests stream.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Folder for soak.csv, rss.svg and summary.md.
    #[arg(long, default_value = "results/soak")]
    out: PathBuf,
    /// KV-cache capacity of each simulated worker, in blocks (default: its profile's). A small
    /// cache fills within minutes, so a run reaches the steady state where the workers evict
    /// as much as they store and every index in the stack is at its working size.
    #[arg(long)]
    num_gpu_blocks: Option<usize>,
}

/// The faults, in rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    WorkerRestart,
    UpdaterRestart,
    BadBurst,
    VmAbort,
}

const FAULTS: [Fault; 4] =
    [Fault::WorkerRestart, Fault::UpdaterRestart, Fault::BadBurst, Fault::VmAbort];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::WorkerRestart => "worker_restart",
            Fault::UpdaterRestart => "updater_restart",
            Fault::BadBurst => "bad_burst",
            Fault::VmAbort => "vm_abort",
        }
    }
}

/// One finished normal request.
#[derive(Debug, Clone, Copy)]
struct Done {
    /// Seconds from the start of the run, at sending.
    sent: f64,
    ok: bool,
    routed: bool,
    latency_ms: f64,
}

/// One sample period.
#[derive(Debug, Clone)]
struct Sample {
    t: f64,
    envoy_mib: f64,
    updater_mib: f64,
    requests: usize,
    success: f64,
    routed: f64,
    p50_ms: f64,
    p99_ms: f64,
    fault: String,
}

/// A fault as it happened: when, and what the fault routine itself saw.
#[derive(Debug, Clone)]
struct FaultEvent {
    at: f64,
    fault: Fault,
    note: String,
}

fn rss_mib(pid: Option<u32>) -> f64 {
    pid.and_then(kvroute_stack::process::rss_kb).map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}

/// Nearest-rank quantile of ascending `sorted` values (NaN when empty).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    nearest_rank(sorted, q).unwrap_or(f64::NAN)
}

/// Conversations in progress: each turn goes out when the open-loop clock says, on a
/// conversation that has no turn in flight (a new one starts when all are busy).
struct Conversations {
    seed: u64,
    next_id: usize,
    live: Vec<(Conversation, usize, bool)>,
}

const TURNS: usize = 6;

impl Conversations {
    /// Picks a conversation and turn; marks it busy.
    fn take(&mut self, rng: &mut StdRng) -> (usize, Conversation, usize) {
        let idle: Vec<usize> = (0..self.live.len()).filter(|i| !self.live[*i].2).collect();
        let i = if idle.is_empty() || (self.live.len() < 48 && rng.random_bool(0.1)) {
            let c = Conversation::new(self.seed, self.next_id, 400, 40, TURNS);
            self.next_id += 1;
            self.live.push((c, 0, false));
            self.live.len() - 1
        } else {
            idle[rng.random_range(0..idle.len())]
        };
        let e = &mut self.live[i];
        e.2 = true;
        (e.0.id, e.0.clone(), e.1)
    }

    /// The turn is done: the conversation moves on, or ends after its last turn.
    fn release(&mut self, id: usize) {
        if let Some(i) = self.live.iter().position(|e| e.0.id == id) {
            self.live[i].1 += 1;
            self.live[i].2 = false;
            if self.live[i].1 >= TURNS {
                self.live.swap_remove(i);
            }
        }
    }
}

/// The burst's bad requests, with the statuses the bad-input matrix pins (never a 5xx). A raw
/// 0xff in the request target gets 400 either way: from Envoy's HTTP/1 codec, or over h2c from
/// the worker's HTTP/1.1 server after kvroute routed it (tests/bad_input.rs).
fn bad_requests() -> Vec<(&'static str, RawRequest, &'static [u16])> {
    let chat = |seed: u64| {
        Conversation::new(seed, 0, 40, 5, 1).body(MODEL, 0, 2, false).to_string().into_bytes()
    };
    vec![
        (
            "0xff in the query",
            RawRequest::post(b"/v1/chat/completions?\xff".to_vec(), chat(1)),
            &[400],
        ),
        (
            "0xff in the path",
            RawRequest::post(b"/v1/chat/\xffcompletions".to_vec(), chat(2)),
            &[400],
        ),
        (
            "non-UTF-8 headers",
            RawRequest::post("/v1/chat/completions", chat(3))
                .header("x-custom", b"\xff\xfe".to_vec()),
            &[200],
        ),
        (
            "invalid JSON",
            RawRequest::post("/v1/chat/completions", b"{\"model\": [".to_vec()),
            &[400],
        ),
        ("deep nesting", RawRequest::post("/v1/chat/completions", vec![b'['; 100_000]), &[400]),
        (
            "spoofed headers",
            RawRequest::post("/v1/chat/completions", chat(4))
                .header("x-gateway-destination-endpoint", "127.0.0.1:1")
                .header("x-envoy-upstream-rq-timeout-ms", "1")
                .header("x-kvroute-decision", "worker=evil"),
            &[200],
        ),
        (
            "image part",
            RawRequest::post(
                "/v1/chat/completions",
                json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
                .to_string(),
            ),
            &[200],
        ),
        ("10 MiB body", RawRequest::post("/v1/chat/completions", vec![b' '; 10 << 20]), &[413]),
    ]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let fault_every = args.fault_every_s.unwrap_or(if args.minutes >= 15.0 {
        150.0
    } else {
        args.minutes * 60.0 / 5.0
    });
    let down_s = (fault_every / 3.0).min(20.0);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;

    eprintln!("soak: starting Envoy, the updater and {} workers", args.workers);
    let sim_args = match args.num_gpu_blocks {
        Some(n) => vec!["--num-gpu-blocks".to_string(), n.to_string()],
        None => Vec::new(),
    };
    let mut stack = Stack::start(StackOptions {
        workers: args.workers,
        sim_args,
        updater: true,
        filter: json!({"fault_injection": {"trap_path": TRAP_PATH}}),
        // Four worker threads: each VM abort takes one thread's VM; the rest keep routing.
        envoy_concurrency: args.envoy_concurrency,
        ..Default::default()
    })
    .await?;
    let base = stack.base_url();
    let listener = SocketAddr::from(([127, 0, 0, 1], stack.envoy.listen_port));
    let envoy_pid = stack.envoy.guard.pid();
    eprintln!(
        "soak: up (Envoy pid {envoy_pid:?}, scratch {}); {:.1} min at {} req/s, a fault every {fault_every:.0} s",
        stack.dir.display(),
        args.minutes,
        args.rate
    );

    let start = Instant::now();
    let done: Arc<Mutex<Vec<Done>>> = Arc::default();
    // A new connection per request: requests spread over Envoy's worker threads, so the routed
    // share shows how many threads still have a live VM after the aborts.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(0)
        .build()?;

    // The open-loop load: one request per tick, whatever the previous ones are doing.
    let load = {
        let done = Arc::clone(&done);
        let base = base.clone();
        let (rate, stream_fraction, seed) = (args.rate, args.stream_fraction, args.seed);
        tokio::spawn(async move {
            let convs = Arc::new(Mutex::new(Conversations { seed, next_id: 0, live: vec![] }));
            let mut rng = StdRng::seed_from_u64(seed);
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            loop {
                tick.tick().await;
                let (id, conv, turn) =
                    convs.lock().unwrap_or_else(|e| e.into_inner()).take(&mut rng);
                let stream = rng.random_bool(stream_fraction);
                let body = conv.body(MODEL, turn, 16, stream);
                let (http, base, done, convs) =
                    (http.clone(), base.clone(), Arc::clone(&done), Arc::clone(&convs));
                tokio::spawn(async move {
                    let sent = start.elapsed().as_secs_f64();
                    let r = client::send(
                        &http,
                        &base,
                        "/v1/chat/completions",
                        body.to_string().into_bytes(),
                        &[],
                    )
                    .await;
                    let at = start.elapsed().as_secs_f64();
                    let (ok, routed) = match &r {
                        Ok(r) => (r.status == 200, r.decision.is_some()),
                        Err(_) => (false, false),
                    };
                    convs.lock().unwrap_or_else(|e| e.into_inner()).release(id);
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(Done {
                        sent,
                        ok,
                        routed,
                        latency_ms: (at - sent) * 1000.0,
                    });
                });
            }
        })
    };

    let mut samples: Vec<Sample> = Vec::new();
    let mut events: Vec<FaultEvent> = Vec::new();
    let mut next_sample = args.sample_s;
    let mut next_fault = fault_every;
    let mut fault_i = 0usize;
    let mut restart_at: Option<(f64, usize)> = None;
    let mut last_fault = String::new();
    let mut seen = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while start.elapsed() < total {
        tick.tick().await;
        let now = start.elapsed().as_secs_f64();
        if let Some((at, w)) = restart_at {
            if now >= at {
                restart_at = None;
                let note = match stack.workers[w].admin("restart", None).await {
                    Ok(_) => "restarted".to_owned(),
                    Err(e) => format!("restart failed: {e:#}"),
                };
                eprintln!("soak: {now:>6.0} s worker {w} {note}");
                if let Some(ev) = events.last_mut() {
                    let _ = write!(ev.note, "; {note} after {:.0} s", now - ev.at);
                }
            }
        }
        if now >= next_fault && now < total.as_secs_f64() - 5.0 {
            next_fault += fault_every;
            let fault = FAULTS[fault_i % FAULTS.len()];
            fault_i += 1;
            let note = match fault {
                Fault::WorkerRestart => {
                    let w = (fault_i / FAULTS.len()) % stack.workers.len();
                    restart_at = Some((now + down_s, w));
                    match stack.workers[w].admin("crash", None).await {
                        Ok(_) => format!(
                            "worker {w} ({}) crashed for {down_s:.0} s",
                            stack.workers[w].addr
                        ),
                        Err(e) => format!("worker {w} crash failed: {e:#}"),
                    }
                }
                Fault::UpdaterRestart => match stack.updater.as_mut() {
                    Some(u) => {
                        let t = Instant::now();
                        match u.restart().await {
                            Ok(()) => {
                                format!("updater restarted in {:.1} s", t.elapsed().as_secs_f64())
                            }
                            Err(e) => format!("updater restart failed: {e:#}"),
                        }
                    }
                    None => "no updater".into(),
                },
                Fault::BadBurst => {
                    let mut handled = 0;
                    let mut tried = 0;
                    let mut odd = Vec::new();
                    for proto in [Proto::Http1, Proto::H2c] {
                        for (name, req, ok) in bad_requests() {
                            tried += 1;
                            match rawhttp::send(listener, proto, &req, Duration::from_secs(30))
                                .await
                            {
                                Ok(r) if ok.contains(&r.status) => handled += 1,
                                Ok(r) => odd.push(format!("{} {name}: {}", proto.name(), r.status)),
                                Err(e) => odd.push(format!("{} {name}: {e:#}", proto.name())),
                            }
                        }
                    }
                    format!(
                        "{handled}/{tried} bad requests answered as defined{}{}",
                        if odd.is_empty() { "" } else { "; others: " },
                        odd.join(", ")
                    )
                }
                Fault::VmAbort => {
                    let r = rawhttp::send(
                        listener,
                        Proto::Http1,
                        &RawRequest::get(TRAP_PATH),
                        Duration::from_secs(30),
                    )
                    .await;
                    match r {
                        Ok(r) => format!(
                            "trap request answered {} (the VM of one Envoy thread aborted)",
                            r.status
                        ),
                        Err(e) => format!("trap request: {e:#}"),
                    }
                }
            };
            eprintln!("soak: {now:>6.0} s fault {}: {note}", fault.name());
            last_fault = fault.name().to_owned();
            events.push(FaultEvent { at: now, fault, note });
        }
        if now >= next_sample {
            next_sample += args.sample_s;
            let window: Vec<Done> = {
                let d = done.lock().unwrap_or_else(|e| e.into_inner());
                let w = d[seen..].to_vec();
                seen = d.len();
                w
            };
            let mut lat: Vec<f64> = window.iter().filter(|d| d.ok).map(|d| d.latency_ms).collect();
            lat.sort_by(f64::total_cmp);
            let n = window.len();
            let frac = |f: &dyn Fn(&Done) -> bool| {
                if n == 0 {
                    f64::NAN
                } else {
                    window.iter().filter(|d| f(d)).count() as f64 / n as f64
                }
            };
            let s = Sample {
                t: now,
                envoy_mib: rss_mib(envoy_pid),
                updater_mib: rss_mib(stack.updater.as_ref().and_then(|u| u.guard.pid())),
                requests: n,
                success: frac(&|d| d.ok),
                routed: frac(&|d| d.routed),
                p50_ms: quantile(&lat, 0.5),
                p99_ms: quantile(&lat, 0.99),
                fault: std::mem::take(&mut last_fault),
            };
            eprintln!(
                "soak: {:>6.0} s envoy {:.1} MiB updater {:.1} MiB | {} req ok {:.1} % routed {:.1} % p50 {:.0} ms p99 {:.0} ms {}",
                s.t, s.envoy_mib, s.updater_mib, s.requests, s.success * 100.0, s.routed * 100.0, s.p50_ms, s.p99_ms, s.fault
            );
            samples.push(s);
        }
        if stack.envoy.guard.try_exit().is_some() {
            anyhow::bail!("Envoy exited during the soak (log: {})", stack.envoy.log.display());
        }
    }
    load.abort();
    // Let requests in flight finish (they are not counted if they do not).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = done.lock().unwrap_or_else(|e| e.into_inner()).clone();
    drop(stack);

    write_csv(&args.out.join("soak.csv"), &samples)?;
    std::fs::write(args.out.join("rss.svg"), rss_svg(&samples, &events)?)?;
    let summary = summary(&args, fault_every, &samples, &events, &all);
    std::fs::write(args.out.join("summary.md"), &summary)?;
    println!("{summary}");
    eprintln!("soak: wrote {}/{{soak.csv,rss.svg,summary.md}}", args.out.display());
    Ok(())
}

fn write_csv(path: &std::path::Path, samples: &[Sample]) -> anyhow::Result<()> {
    let mut out = String::from(
        "t_s,envoy_rss_mib,updater_rss_mib,requests,success_rate,routed_rate,p50_ms,p99_ms,fault\n",
    );
    for s in samples {
        let _ = writeln!(
            out,
            "{:.1},{:.2},{:.2},{},{:.4},{:.4},{:.1},{:.1},{}",
            s.t,
            s.envoy_mib,
            s.updater_mib,
            s.requests,
            s.success,
            s.routed,
            s.p50_ms,
            s.p99_ms,
            s.fault
        );
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

fn rss_svg(samples: &[Sample], events: &[FaultEvent]) -> anyhow::Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (900, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let t_max = samples.last().map_or(1.0, |s| s.t / 60.0).max(0.1);
        let y_max = samples
            .iter()
            .flat_map(|s| [s.envoy_mib, s.updater_mib])
            .filter(|v| v.is_finite())
            .fold(1.0f64, f64::max)
            * 1.15;
        let caption = if samples.is_empty() { "VmRSS (no data)" } else { "VmRSS over the soak" };
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
        chart.configure_mesh().x_desc("minutes").y_desc("MiB").draw()?;
        for e in events {
            let x = e.at / 60.0;
            let c = Palette99::pick(4 + FAULTS.iter().position(|f| *f == e.fault).unwrap_or(0))
                .to_rgba();
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_max)],
                c.mix(0.35),
            )))?;
        }
        type Pick = fn(&Sample) -> f64;
        let lines: [(&str, Pick, RGBAColor); 2] = [
            ("Envoy", |s| s.envoy_mib, Palette99::pick(0).to_rgba()),
            ("kvroute-updater", |s| s.updater_mib, Palette99::pick(1).to_rgba()),
        ];
        for (name, pick, color) in lines {
            let pts: Vec<(f64, f64)> =
                samples.iter().map(|s| (s.t / 60.0, pick(s))).filter(|p| p.1.is_finite()).collect();
            chart.draw_series(LineSeries::new(pts, color.stroke_width(2)))?.label(name).legend(
                move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)),
            );
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
        root.present()?;
    }
    Ok(buf)
}

/// The sample nearest to `t` seconds.
fn at(samples: &[Sample], t: f64) -> Option<&Sample> {
    samples.iter().min_by(|a, b| (a.t - t).abs().total_cmp(&(b.t - t).abs()))
}

fn rate(ds: &[&Done]) -> String {
    if ds.is_empty() {
        return "n/a (0 requests)".into();
    }
    let ok = ds.iter().filter(|d| d.ok).count();
    let routed = ds.iter().filter(|d| d.routed).count();
    format!(
        "{:.2} % ({ok}/{}), routed by kvroute {:.1} %",
        ok as f64 * 100.0 / ds.len() as f64,
        ds.len(),
        routed as f64 * 100.0 / ds.len() as f64
    )
}

fn summary(
    args: &Args,
    fault_every: f64,
    samples: &[Sample],
    events: &[FaultEvent],
    all: &[Done],
) -> String {
    let mut md = String::new();
    let end = samples.last();
    let warm = if args.minutes >= 15.0 { 600.0 } else { args.minutes * 30.0 };
    let _ = writeln!(md, "# kvroute soak\n");
    let _ = writeln!(
        md,
        "{:.1} minutes at {} req/s open loop ({} workers, {:.0} % streaming, 6-turn conversations), a fault every {fault_every:.0} s in rotation (worker crash and restart, updater restart, bad-request burst, VM abort); samples every {} s. RSS is VmRSS from /proc; the machine may be shared with other work (builds), which moves latency, not RSS much.\n",
        args.minutes, args.rate, args.workers, args.stream_fraction * 100.0, args.sample_s
    );
    let _ = writeln!(md, "## Memory (VmRSS, MiB)\n");
    let _ = writeln!(md, "| process | at 5 min | at {:.0} min (warm) | at the end ({:.1} min) | growth warm → end | flat (< 5 %) |", warm / 60.0, end.map_or(0.0, |s| s.t / 60.0));
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    type Pick = fn(&Sample) -> f64;
    let procs: [(&str, Pick); 2] =
        [("Envoy", |s| s.envoy_mib), ("kvroute-updater", |s| s.updater_mib)];
    for (name, pick) in procs {
        let five = if args.minutes >= 5.0 { at(samples, 300.0).map(pick) } else { None };
        let w = at(samples, warm).map(pick);
        let e = end.map(pick);
        let fmt = |v: Option<f64>| {
            v.filter(|v| v.is_finite()).map_or("n/a".to_owned(), |v| format!("{v:.1}"))
        };
        let (growth, flat) = match (w, e) {
            (Some(w), Some(e)) if w.is_finite() && e.is_finite() && w > 0.0 => {
                let pct = (e - w) / w * 100.0;
                (format!("{:+.1} MiB ({pct:+.1} %)", e - w), if pct < 5.0 { "yes" } else { "no" })
            }
            _ => ("n/a".into(), "n/a"),
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {growth} | {flat} |",
            fmt(five),
            fmt(w),
            fmt(e)
        );
    }
    let _ = writeln!(md, "\nFlat means less than 5 % growth from minute 10 to the end (the halfway point for runs shorter than 15 minutes). The updater's RSS restarts with the process at each updater restart, so its row compares different processes; the lines below do not.\n");
    let growth = |pick: Pick, from: f64| -> String {
        match (at(samples, from).map(pick), end.map(pick)) {
            (Some(a), Some(b)) if a.is_finite() && b.is_finite() && a > 0.0 => {
                format!("{a:.1} → {b:.1} MiB ({:+.1} MiB, {:+.1} %)", b - a, (b - a) / a * 100.0)
            }
            _ => "n/a".into(),
        }
    };
    let end_t = end.map_or(0.0, |s| s.t);
    let tail = (end_t / 3.0).min(600.0);
    for (name, pick) in procs {
        let _ =
            writeln!(md, "- {name}, last {:.0} min: {}", tail / 60.0, growth(pick, end_t - tail));
    }
    if let Some(last) = events.iter().rev().find(|e| e.fault == Fault::UpdaterRestart) {
        let _ = writeln!(
            md,
            "- kvroute-updater, the last process (restarted at {:.0} s), one minute after its start → end: {}",
            last.at,
            growth(procs[1].1, last.at + 60.0)
        );
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "## Normal requests\n");
    let refs: Vec<&Done> = all.iter().collect();
    let _ = writeln!(md, "- overall: {}", rate(&refs));
    let mut lat: Vec<f64> = all.iter().filter(|d| d.ok).map(|d| d.latency_ms).collect();
    lat.sort_by(f64::total_cmp);
    let _ = writeln!(
        md,
        "- latency of successful requests: p50 {:.0} ms, p99 {:.0} ms",
        quantile(&lat, 0.5),
        quantile(&lat, 0.99)
    );
    // A fault's window: from the fault to one minute after it (or to the next fault).
    let window = (fault_every).min(60.0);
    let in_fault = |d: &Done| {
        events.iter().find(|e| d.sent >= e.at && d.sent < e.at + window).map(|e| e.fault)
    };
    let steady: Vec<&Done> = all.iter().filter(|d| in_fault(d).is_none()).collect();
    let _ = writeln!(md, "- outside fault windows: {}", rate(&steady));
    for f in FAULTS {
        let ds: Vec<&Done> = all.iter().filter(|d| in_fault(d) == Some(f)).collect();
        let _ = writeln!(md, "- within {window:.0} s after `{}`: {}", f.name(), rate(&ds));
    }
    let _ = writeln!(md, "\n## Faults\n");
    let _ = writeln!(md, "| at (s) | fault | what happened |\n|---|---|---|");
    for e in events {
        let _ = writeln!(md, "| {:.0} | {} | {} |", e.at, e.fault.name(), e.note.replace('|', "/"));
    }
    let worst = samples
        .iter()
        .filter(|s| s.success.is_finite())
        .min_by(|a, b| a.success.total_cmp(&b.success));
    if let Some(w) = worst {
        let _ = writeln!(
            md,
            "\nWorst {} s window: {:.1} % success at {:.0} s ({} requests).",
            args.sample_s,
            w.success * 100.0,
            w.t,
            w.requests
        );
    }
    let _ = writeln!(md, "\nFiles: `soak.csv` (one row per sample), `rss.svg` (RSS over time; faint vertical lines are faults).");
    md
}

kvroute_stack::help_test!(Args);
