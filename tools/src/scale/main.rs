//! kvroute-scale: how kvroute's costs grow with the fleet, each as a curve measured in one run
//! on one machine, written as CSV + SVG into `--out`:
//!
//! - `decision_vs_workers`, `decision_vs_blocks`: native decision time (body parse, the core
//!   router's decision, the header value: the filter's path without host calls) p50/p99 for a
//!   4 k-token prompt that one worker holds (hit) and one nobody holds (miss), against the
//!   pool's size (blocks per worker fixed) and against the blocks the fleet holds (workers
//!   fixed). The knowledge is the updater's: KV events applied to its real state, its snapshot
//!   taken in by a router as a filter thread takes it in (see `fleet.rs`).
//! - `wire_vs_workers`, `delta_vs_events`: snapshot bytes (real encoder), encode, decode and
//!   take-in time; the delta the updater's publisher composes after 1, 100 events, its bytes,
//!   decode and take-in time; and at a fixed pool, the delta against the events since the
//!   caller's version (event rate × long-poll interval).
//! - `decision_in_envoy_vs_workers`: the same decision inside Envoy (the filter's own timing
//!   in each answer's `x-kvroute-decision`), a real updater following simulated workers' KV
//!   events (see `envoy.rs`); with the updater's curves (`--skip-updater` leaves it out).
//! - `noise`: one point (the workers sweep's pool at `--noise-workers`) rebuilt and re-timed
//!   `--repeats` times: the spread to read the curves against.
//!
//! Run: `target/release/kvroute-scale --out results/scale` (minutes; flags shrink it).

mod decision;
mod envoy;
mod fleet;
mod out;
mod pin;
mod updater;
mod wire;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use fleet::Fleet;
use out::Curve;

#[derive(Parser, Debug, Clone)]
#[command(about = "kvroute's costs against the fleet's size: decision time, wire sizes, CSV + SVG")]
struct Args {
    /// Folder for the CSV and SVG files (created).
    #[arg(long, default_value = "results/scale")]
    out: PathBuf,
    /// Pool sizes of the workers sweep.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64,256,1024")]
    workers: Vec<usize>,
    /// Blocks each worker holds in the workers sweep.
    #[arg(long, default_value_t = 4096)]
    blocks_per_worker: usize,
    /// Blocks the whole fleet holds, per point of the blocks sweep.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000,10000000")]
    blocks: Vec<usize>,
    /// Pool size of the blocks sweep.
    #[arg(long, default_value_t = 64)]
    blocks_workers: usize,
    /// Decisions timed per prompt and point (fewer when `--budget-ms` runs out first).
    #[arg(long, default_value_t = 3000)]
    iters: usize,
    /// Time budget per prompt and point (ms).
    #[arg(long, default_value_t = 2000)]
    budget_ms: u64,
    /// Events since the caller's version, per point of the delta curve.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    delta_events: Vec<usize>,
    /// Repetitions of each encode/decode/take-in timing (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The noise point's pool size.
    #[arg(long, default_value_t = 64)]
    noise_workers: usize,
    /// How often the noise point is rebuilt and re-timed.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Leave out the updater's curves (ingest, fan-out): they start real processes
    /// (`kvroute-sim`, `kvroute-updater`, release builds).
    #[arg(long)]
    skip_updater: bool,
    /// Pool sizes of the updater's ingest curve.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    ingest_workers: Vec<usize>,
    /// Requests per second sent to the workers (open loop) while ingest and fan-out are measured.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds the updater is watched idle (its alignment checks and scrapes), then loaded.
    #[arg(long, default_value_t = 5.0)]
    idle_s: f64,
    /// Seconds the updater is watched under load.
    #[arg(long, default_value_t = 15.0)]
    load_s: f64,
    /// Pool size of the fan-out curve.
    #[arg(long, default_value_t = 100)]
    fanout_workers: usize,
    /// Long-poll clients per point of the fan-out curve.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    clients: Vec<usize>,
    /// Freshness probes per fan-out point (each seen by every client).
    #[arg(long, default_value_t = 20)]
    probes: usize,
    /// Pool sizes of the in-Envoy decision curve.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64,256,1024")]
    envoy_workers: Vec<usize>,
    /// Prompts of 4 096 tokens each worker is filled with before the in-Envoy decisions.
    #[arg(long, default_value_t = 2)]
    envoy_fill: usize,
    /// Hit and miss decisions timed per point inside Envoy.
    #[arg(long, default_value_t = 200)]
    envoy_iters: usize,
    /// Tokens of the hit and miss prompts of the in-Envoy decisions (token ids).
    #[arg(long, default_value_t = 4096)]
    envoy_prompt_tokens: usize,
    /// Seconds without requests after each in-Envoy point, to measure Envoy's upkeep.
    #[arg(long, default_value_t = 3.0)]
    envoy_idle_s: f64,
    /// Run Envoy's worker threads alone on the last CPU of this process and everything else
    /// (Envoy's main thread, this process, the simulated workers, the updater) on the others,
    /// with util-linux's `taskset` (Linux, two CPUs or more): on a small machine the
    /// simulator, the updater and the filter's singleton otherwise share the deciding
    /// threads' core, which shows in the in-Envoy decision time's tail.
    #[arg(long)]
    pin_envoy: bool,
    /// The filter's `knowledge.catch_up_budget_us` for the in-Envoy decisions (its default
    /// when not given; 0: no time limit).
    #[arg(long)]
    envoy_catch_up_budget_us: Option<u64>,
}

/// This process's resident memory (MiB).
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

const DECISION_COLUMNS: &[&str] = &[
    "hit_p50_us",
    "hit_p99_us",
    "miss_p50_us",
    "miss_p99_us",
    "hit_cached_tokens",
    "miss_cached_tokens",
    "samples",
    "hit_decide_p50_us",
    "miss_decide_p50_us",
];

/// Times the hit and the miss prompt on `router`: the decision columns.
fn decisions(
    a: &Args,
    workers: &[String],
    router: &mut kvroute_core::decision::router::Router,
) -> anyhow::Result<Vec<f64>> {
    let loads = decision::loads(workers);
    let budget = Duration::from_millis(a.budget_ms);
    let hit = decision::time(
        &mut *router,
        &loads,
        &fleet::body(&fleet::prompt_tokens(true)),
        a.iters,
        budget,
    )?;
    let miss = decision::time(
        &mut *router,
        &loads,
        &fleet::body(&fleet::prompt_tokens(false)),
        a.iters,
        budget,
    )?;
    Ok(vec![
        hit.p50_us,
        hit.p99_us,
        miss.p50_us,
        miss.p99_us,
        hit.cached_tokens as f64,
        miss.cached_tokens as f64,
        hit.samples.min(miss.samples) as f64,
        hit.decide_p50_us,
        miss.decide_p50_us,
    ])
}

/// Every curve of one run.
fn run(a: &Args) -> anyhow::Result<Vec<Curve>> {
    let mut by_workers = Curve::new(
        "decision_vs_workers",
        format!("decision time vs workers ({} blocks per worker)", a.blocks_per_worker),
        &[&["workers", "blocks_held"], DECISION_COLUMNS, &["build_s", "rss_mib"]].concat(),
    )
    .plotting(&["hit_p50_us", "hit_p99_us", "miss_p50_us", "miss_p99_us"], "µs");
    let mut wire_curve = Curve::new(
        "wire_vs_workers",
        format!("snapshot and delta vs workers ({} blocks per worker)", a.blocks_per_worker),
        &[
            "workers",
            "snapshot_bytes",
            "snapshot_encode_us",
            "snapshot_decode_us",
            "snapshot_apply_us",
            "delta1_bytes",
            "delta1_decode_us",
            "delta1_apply_us",
            "delta100_bytes",
            "delta100_decode_us",
            "delta100_apply_us",
            "delta100_is_delta",
        ],
    )
    .plotting(&["snapshot_bytes", "delta1_bytes", "delta100_bytes"], "bytes");
    let mut wire_times = Curve::new(
        "wire_time_vs_workers",
        "decode and take-in time vs workers".into(),
        &[
            "workers",
            "snapshot_decode_us",
            "snapshot_apply_us",
            "delta1_decode_us",
            "delta1_apply_us",
            "delta100_decode_us",
            "delta100_apply_us",
        ],
    )
    .plotting(
        &["snapshot_decode_us", "snapshot_apply_us", "delta1_apply_us", "delta100_apply_us"],
        "µs",
    );
    let mut deltas = Curve::new(
        "delta_vs_events",
        format!(
            "delta vs events since the caller's version ({} workers, {} blocks each)",
            a.blocks_workers, a.blocks_per_worker
        ),
        &["events", "bytes", "bytes_per_event", "decode_us", "apply_us", "is_delta"],
    )
    .plotting(&["bytes", "decode_us", "apply_us"], "bytes / µs");
    for &w in &a.workers {
        let mut f = Fleet::build(w, a.blocks_per_worker)?;
        let (mut router, snap) = f.router()?;
        let held = Fleet::blocks_held(&snap) as f64;
        let mut row = vec![w as f64, held];
        row.extend(decisions(a, &f.workers, &mut router)?);
        row.extend([f.build_s, rss_mib()]);
        by_workers.push(row);
        let s = wire::snapshot(&snap, &mut router, a.reps)?;
        let d1 = wire::delta(&mut f, &mut router, 1, a.reps)?;
        let d100 = wire::delta(&mut f, &mut router, 100, a.reps)?;
        wire_curve.push(vec![
            w as f64,
            s.bytes as f64,
            s.encode_us,
            s.decode_us,
            s.apply_us,
            d1.bytes as f64,
            d1.decode_us,
            d1.apply_us,
            d100.bytes as f64,
            d100.decode_us,
            d100.apply_us,
            f64::from(u8::from(d100.delta)),
        ]);
        wire_times.push(vec![
            w as f64,
            s.decode_us,
            s.apply_us,
            d1.decode_us,
            d1.apply_us,
            d100.decode_us,
            d100.apply_us,
        ]);
        eprintln!("kvroute-scale: {w} workers done ({held} blocks)");
    }
    {
        let mut f = Fleet::build(a.blocks_workers, a.blocks_per_worker)?;
        let (mut router, _) = f.router()?;
        for &events in &a.delta_events {
            let d = wire::delta(&mut f, &mut router, events, a.reps)?;
            deltas.push(vec![
                events as f64,
                d.bytes as f64,
                d.bytes as f64 / events as f64,
                d.decode_us,
                d.apply_us,
                f64::from(u8::from(d.delta)),
            ]);
        }
    }
    let mut by_blocks = Curve::new(
        "decision_vs_blocks",
        format!("decision time vs blocks held ({} workers)", a.blocks_workers),
        &[&["blocks", "blocks_held"], DECISION_COLUMNS, &["build_s", "rss_mib"]].concat(),
    )
    .plotting(&["hit_p50_us", "hit_p99_us", "miss_p50_us", "miss_p99_us"], "µs");
    for &b in &a.blocks {
        let f = Fleet::build(a.blocks_workers, (b / a.blocks_workers.max(1)).max(1))?;
        let (mut router, snap) = f.router()?;
        let mut row = vec![b as f64, Fleet::blocks_held(&snap) as f64];
        let (workers, build_s, rss) = (f.workers.clone(), f.build_s, rss_mib());
        // The updater's state and the snapshot are not part of a filter thread.
        drop((f, snap));
        row.extend(decisions(a, &workers, &mut router)?);
        row.extend([build_s, rss]);
        by_blocks.push(row);
        eprintln!("kvroute-scale: {b} blocks done");
    }
    let mut noise = Curve::new(
        "noise",
        format!("one point repeated ({} workers)", a.noise_workers),
        &[&["repeat"], DECISION_COLUMNS].concat(),
    );
    for r in 0..a.repeats {
        let f = Fleet::build(a.noise_workers, a.blocks_per_worker)?;
        let (mut router, _) = f.router()?;
        let mut row = vec![r as f64 + 1.0];
        row.extend(decisions(a, &f.workers, &mut router)?);
        noise.push(row);
    }
    Ok(vec![by_workers, by_blocks, wire_curve, wire_times, deltas, noise])
}

/// The updater's curves: ingest and memory against the pool's size, fan-out to long polls.
async fn run_updater(a: &Args) -> anyhow::Result<Vec<Curve>> {
    let dir = kvroute_stack::paths::scratch_dir("scale")?;
    let mut ingest = Curve::new(
        "updater_vs_workers",
        format!("one updater's ingest vs workers ({} req/s of fresh prompts)", a.rate),
        &["workers", "events_per_s", "idle_cores", "load_cores", "events_per_core_s", "rss_mib"],
    )
    .plotting(&["events_per_s", "events_per_core_s", "rss_mib"], "events/s, MiB");
    for &w in &a.ingest_workers {
        let pool = updater::SimPool::start(w, &dir).await?;
        let i = updater::ingest(&pool, a.rate, a.idle_s, a.load_s).await?;
        ingest.push(vec![
            w as f64,
            i.events_per_s,
            i.idle_cores,
            i.load_cores,
            i.events_per_core_s,
            i.rss_mib,
        ]);
        eprintln!("kvroute-scale: updater with {w} workers done");
    }
    let mut fanout = Curve::new(
        "fanout_vs_clients",
        format!("freshness vs long-poll clients ({} workers, {} req/s)", a.fanout_workers, a.rate),
        &[
            "clients",
            "freshness_p50_ms",
            "freshness_p99_ms",
            "samples",
            "updater_cores",
            "bytes_per_s",
        ],
    )
    .plotting(&["freshness_p50_ms", "freshness_p99_ms"], "ms");
    if !a.clients.is_empty() {
        let pool = updater::SimPool::start(a.fanout_workers, &dir).await?;
        for &c in &a.clients {
            let f = updater::fanout(&pool, c, a.rate, a.probes).await?;
            fanout.push(vec![
                c as f64,
                f.freshness_p50_ms,
                f.freshness_p99_ms,
                f.samples as f64,
                f.updater_cores,
                f.bytes_per_s,
            ]);
            eprintln!("kvroute-scale: fan-out to {c} clients done");
        }
    }
    let mut in_envoy = Curve::new(
        "decision_in_envoy_vs_workers",
        format!(
            "decision time inside Envoy vs workers ({} prompts of 4 096 tokens per worker, \
             prompts of {} tokens timed)",
            a.envoy_fill, a.envoy_prompt_tokens
        ),
        &[&["workers"], envoy::COLUMNS].concat(),
    )
    .plotting(&["hit_p50_us", "hit_p99_us", "miss_p50_us", "miss_p99_us"], "µs");
    // Pinned before the pools start, so that their processes inherit it.
    let pinning = if a.pin_envoy && !a.envoy_workers.is_empty() {
        let p = pin::Pinning::from_proc()?;
        p.apply_rest()?;
        Some(p)
    } else {
        None
    };
    let mut samples = vec![envoy::SAMPLE_COLUMNS.to_owned()];
    for &w in &a.envoy_workers {
        let pool = updater::SimPool::start(w, &dir).await?;
        let mut row = vec![w as f64];
        let idle = Duration::from_secs_f64(a.envoy_idle_s.max(0.1));
        let timed = (a.envoy_iters, idle, a.envoy_prompt_tokens, a.envoy_catch_up_budget_us);
        let pin = pinning.as_ref();
        row.extend(envoy::point(&pool, &dir, a.envoy_fill, timed, pin, &mut samples).await?);
        in_envoy.push(row);
        eprintln!("kvroute-scale: in-Envoy decisions with {w} workers done");
    }
    if samples.len() > 1 {
        std::fs::create_dir_all(&a.out)?;
        let path = a.out.join("decision_in_envoy_samples.csv");
        std::fs::write(&path, samples.join("\n") + "\n")
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(vec![ingest, fanout, in_envoy])
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    std::fs::create_dir_all(&a.out)?;
    let write = |curves: &[Curve]| -> anyhow::Result<()> {
        for c in curves {
            c.write(&a.out)?;
            println!("{} ({}):\n{}", c.name, c.title, c.csv());
        }
        Ok(())
    };
    // Each part's curves are written as soon as it ends.
    write(&run(&a)?)?;
    if !a.skip_updater {
        let rt = tokio::runtime::Runtime::new()?;
        write(&rt.block_on(run_updater(&a))?)?;
    }
    Ok(())
}

kvroute_stack::help_test!(Args);

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny sweep: every curve has its columns and every point, and the points are sane
    /// (the hit is found on its worker, the miss nowhere; sizes grow with the pool). No
    /// timing is asserted.
    #[test]
    fn tiny_sweep_writes_every_point() {
        let dir = std::env::temp_dir().join(format!("kvroute-scale-test-{}", std::process::id()));
        let a = Args::parse_from([
            "kvroute-scale",
            "--out",
            dir.to_str().unwrap(),
            "--workers",
            "2,8",
            "--blocks-per-worker",
            "200",
            "--blocks",
            "1000,4000",
            "--blocks-workers",
            "4",
            "--iters",
            "30",
            "--delta-events",
            "1,5",
            "--reps",
            "1",
            "--noise-workers",
            "2",
            "--repeats",
            "2",
            "--skip-updater",
        ]);
        std::fs::create_dir_all(&a.out).unwrap();
        let curves = run(&a).unwrap();
        let names: Vec<&str> = curves.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "decision_vs_workers",
                "decision_vs_blocks",
                "wire_vs_workers",
                "wire_time_vs_workers",
                "delta_vs_events",
                "noise"
            ]
        );
        for c in &curves {
            c.write(&a.out).unwrap();
            let csv = std::fs::read_to_string(a.out.join(format!("{}.csv", c.name))).unwrap();
            let mut lines = csv.lines();
            assert_eq!(lines.next().unwrap(), c.columns.join(","), "{}", c.name);
            for l in lines {
                let cells: Vec<f64> = l.split(',').map(|v| v.parse().unwrap()).collect();
                assert_eq!(cells.len(), c.columns.len(), "{}: {l}", c.name);
                assert!(cells.iter().all(|v| v.is_finite() && *v >= 0.0), "{}: {l}", c.name);
            }
            if !c.plot.is_empty() {
                let svg = std::fs::read_to_string(a.out.join(format!("{}.svg", c.name))).unwrap();
                assert!(svg.starts_with("<svg"), "{}", c.name);
            }
        }
        let col = |c: &Curve, name: &str| c.columns.iter().position(|x| *x == name).unwrap();
        let (w, b, wire, deltas, noise) =
            (&curves[0], &curves[1], &curves[2], &curves[4], &curves[5]);
        assert_eq!(w.rows.iter().map(|r| r[0]).collect::<Vec<_>>(), [2.0, 8.0]);
        assert_eq!(b.rows.iter().map(|r| r[0]).collect::<Vec<_>>(), [1000.0, 4000.0]);
        assert_eq!(deltas.rows.iter().map(|r| r[0]).collect::<Vec<_>>(), [1.0, 5.0]);
        assert_eq!(noise.rows.len(), 2);
        for c in [w, b, noise] {
            for r in &c.rows {
                // The hit prompt's whole prefix is found (256 blocks of 16 tokens, minus the
                // last block, which the engine recomputes); the miss finds nothing.
                assert!(r[col(c, "hit_cached_tokens")] >= 4000.0, "{}: {r:?}", c.name);
                assert_eq!(r[col(c, "miss_cached_tokens")], 0.0, "{}: {r:?}", c.name);
                assert!(r[col(c, "hit_p99_us")] >= r[col(c, "hit_p50_us")]);
                assert!(r[col(c, "samples")] >= 20.0);
            }
        }
        for r in &w.rows {
            assert!(r[col(w, "blocks_held")] >= 200.0 * r[0], "{r:?}");
        }
        let bytes = col(wire, "snapshot_bytes");
        assert!(wire.rows[1][bytes] > 2.0 * wire.rows[0][bytes], "{:?}", wire.rows);
        assert!(wire.rows.iter().all(|r| r[col(wire, "delta1_bytes")] < r[bytes]));
        std::fs::remove_dir_all(&dir).ok();
    }
}
