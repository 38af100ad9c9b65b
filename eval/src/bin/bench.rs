//! kvroute-bench: compares routing policies on the same seeded arrivals through real Envoy, with
//! faults, and writes a report (Markdown, JSON, SVG) per workload plus a summary.
//!
//! `kvroute-bench --preset demo` (about a minute), `--preset full` (every workload against
//! every policy), `--plan my-plan.toml` (a plan file; `--print-plan` shows the format).
//!
//! Every (workload, offered load, policy) cell runs `repeats` times; repeat r runs the
//! policies in the plan's order rotated by r, and offered-load rungs run inside each repeat.
//! Every run is kept in the workload's `report.json`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use kvroute_eval::cluster::Policy;
use kvroute_eval::model::BenchModel;
use kvroute_eval::preset::{self, ComparisonPlan};
use kvroute_eval::report::{self, Report, Scope, Setup};
use kvroute_eval::runner::{run_policy, RunOptions};
use kvroute_eval::{reference, repeat, schedule, workloads};
use kvroute_stack::paths;

#[derive(Parser, Debug)]
#[command(about = "Compare routing policies on identical arrivals through real Envoy")]
struct Args {
    /// A preset plan: demo, full, full-70b, peers, stress, selfcheck, two-site or pd.
    #[arg(long, default_value = "demo")]
    preset: String,
    /// A plan file (TOML) instead of a preset.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Replace the plan's topology with this TOML file.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// The served model: demo (the built-in bundle) or qwen3 (a real 151 k-token tokenizer,
    /// fetched by `./dev setup`, distributed to Envoy by the updater). Overrides the plan's
    /// `[workers] model`.
    #[arg(long)]
    model: Option<String>,
    /// Base seed of the workloads.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Only these workloads (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<String>>,
    /// Only these policies (comma-separated): kvroute, kvroute-history, kvroute-load-only,
    /// prefix-only, kvroute-no-pd, kvroute-ttft-only, kvroute-no-growth, kvroute-fixed-step,
    /// least-request,
    /// round-robin, random, oracle, pinned, and the peer routers smg-cache-aware,
    /// vllm-router-cache-aware, vllm-router-kv-aware.
    #[arg(long, value_delimiter = ',')]
    policies: Option<Vec<String>>,
    /// Runs of every (workload, load, policy) cell (default: the plan's, 3 in the presets);
    /// least-request's runs against each other give the noise floor.
    #[arg(long)]
    repeats: Option<usize>,
    /// The offered-load ladder, as multiples of each workload's own rate (comma-separated,
    /// e.g. 0.5,1,2,4; default: the plan's).
    #[arg(long, value_delimiter = ',')]
    rates: Option<Vec<f64>>,
    /// Also run the three reference cases (the `full` presets do): a busy worker holding all of
    /// a prefix, an idle one holding none, a loaded one holding part, swept over how busy the
    /// first is; per policy the chosen worker, its TTFT and the what-if best, and the crossover
    /// the cost model predicts against the measured one. `--no-reference` skips them.
    #[arg(long, conflicts_with = "no_reference")]
    reference: bool,
    /// Skip the three reference cases, also where the plan runs them (the `full` presets).
    #[arg(long)]
    no_reference: bool,
    /// Run only the transfer reference sweep (issue 25) on the plan's simulator profile: a
    /// busy holder of a prefix, an idle worker that recomputes, an idle peer that pulls it over
    /// a link of swept bandwidth; the crossovers kvroute's cost model predicts against the
    /// measured ones (`transfer/transfer.md`).
    #[arg(long)]
    transfer_sweep: bool,
    /// The transfer sweep's link bandwidths (Gb/s, comma-separated; default 5,10,20,40,80,160).
    #[arg(long, value_delimiter = ',')]
    transfer_bandwidths: Option<Vec<f64>>,
    /// The transfer sweep's holder queues (background requests, comma-separated; default
    /// 0,1,2,3,4,6,8,12,16).
    #[arg(long, value_delimiter = ',')]
    transfer_levels: Option<Vec<usize>>,
    /// Scale the filter's default cost profile by this (3: a prior three times too slow), to
    /// see how kvroute fares when told the wrong speed. Overrides the plan's
    /// `[filter] prior_scale`.
    #[arg(long)]
    filter_prior_scale: Option<f64>,
    /// Scale the filter's decode step coefficients (`decode_ms_per_seq`,
    /// `decode_ms_per_1k_context`) by this on top (a prior wrong about the decode step alone).
    /// Overrides the plan's `[filter] decode_prior_scale`.
    #[arg(long)]
    filter_decode_prior_scale: Option<f64>,
    /// Results folder (default: results/<plan name>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the plan as TOML and exit.
    #[arg(long)]
    print_plan: bool,
    /// Only make the schedules and print their size, hash and hit-rate ceiling.
    #[arg(long)]
    dry_run: bool,
    /// Recompute the reports of an earlier run from its `report.json` files (for example after
    /// a change to the report), without running anything.
    #[arg(long)]
    rerender: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or("unknown memory".into(), |kb| format!("{:.0} GiB", kb as f64 / 1048576.0));
    format!("{cores} cores, {mem}, {} {}", std::env::consts::OS, std::env::consts::ARCH)
}

fn load_plan(args: &Args) -> anyhow::Result<ComparisonPlan> {
    let mut plan = match &args.plan {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing plan {}", p.display()))?
        }
        None => preset::preset(&args.preset, args.seed)?,
    };
    if let Some(t) = &args.topology {
        let text =
            std::fs::read_to_string(t).with_context(|| format!("reading {}", t.display()))?;
        plan.topology = kvroute_eval::topology::Topology::from_toml(&text)?;
    }
    if let Some(k) = args.filter_prior_scale {
        plan.topology.filter.prior_scale = k;
    }
    if let Some(k) = args.filter_decode_prior_scale {
        plan.topology.filter.decode_prior_scale = k;
    }
    if let Some(m) = &args.model {
        plan.topology.workers.model = BenchModel::parse(m)?;
    }
    let policies = match &args.policies {
        Some(names) => {
            Some(names.iter().map(|n| Policy::parse(n)).collect::<anyhow::Result<Vec<_>>>()?)
        }
        None => None,
    };
    if let Some(n) = args.repeats {
        plan.repeats = n;
    }
    if let Some(r) = &args.rates {
        plan.rate_scales = r.clone();
        // The flag overrides every scenario's own ladder too.
        plan.scenarios.iter_mut().for_each(|s| s.rate_scales = None);
    }
    if policies.is_some() {
        plan.scenarios.iter_mut().for_each(|s| s.policies = None);
    }
    plan.select(args.workloads.as_deref(), policies.as_deref())?;
    Ok(plan)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.rerender {
        return rerender(dir);
    }
    let plan = load_plan(&args)?;
    if args.print_plan {
        print!("{}", toml::to_string(&plan)?);
        return Ok(());
    }
    let out =
        args.out.clone().unwrap_or_else(|| paths::repo_root().join("results").join(&plan.name));
    std::fs::create_dir_all(&out)?;
    let out = out.canonicalize().unwrap_or(out);
    if args.transfer_sweep {
        return transfer_sweep(&args, &plan, &out).await;
    }
    let block_size = 16;
    let model = plan.topology.workers.model;
    let bundle = model.bundle()?;
    let mut reports: Vec<Report> = Vec::new();
    let mut failed = 0usize;
    println!(
        "kvroute-bench: plan {}, {} workload(s) x {} policies x {} repeat(s) x load {:?}; {}",
        plan.name,
        plan.scenarios.len(),
        plan.policies.len(),
        plan.repeats,
        plan.rate_scales,
        plan.topology.describe()
    );
    for sc in &plan.scenarios {
        let w = &sc.workload;
        let topo = sc.topology(&plan);
        let sched = w.schedule_for(model)?;
        let hash = schedule::hash(&sched);
        let ceiling = workloads::reuse_ceiling_with(&bundle, &sched, block_size)?;
        // Per request, for the per-cohort ceilings; kept only when it adds up to the workload's.
        let reuse = report::ceiling::per_request(&bundle, &sched, block_size)
            .ok()
            .filter(|r| {
                report::ceiling::of(r, 0..sched.len()).is_some_and(|c| (c - ceiling).abs() < 1e-9)
            })
            .unwrap_or_default();
        let span = sched.last().map_or(0.0, |s| s.at.as_secs_f64());
        println!(
            "\n== {} — {} requests over {:.1} s, schedule hash {hash:016x}, hit-rate ceiling {:.1} %",
            w.name,
            sched.len(),
            span,
            100.0 * ceiling
        );
        for f in &sc.faults {
            println!("   fault {}", f.describe());
        }
        if args.dry_run {
            continue;
        }
        let mut runs = Vec::new();
        for r in 0..plan.repeats {
            for &rate in sc.rate_scales(&plan) {
                for policy in repeat::rotated(sc.policies(&plan), r) {
                    let opts = RunOptions {
                        progress: !args.quiet,
                        repeat: r,
                        rate_scale: rate,
                        whatif_sample: plan.whatif_sample,
                        warmup_per_envoy: plan.warmup_per_envoy,
                        prewarm: sc.prewarm.clone(),
                        ..Default::default()
                    };
                    let run = run_policy(topo, policy, &sched, w.slo, &sc.faults, &opts)
                        .await
                        .with_context(|| {
                            format!(
                                "{} on {} (repeat {}, load x{rate})",
                                policy.name(),
                                w.name,
                                r + 1
                            )
                        })?;
                    let ok = run.records.iter().filter(|x| x.ok()).count();
                    failed += run.records.len() - ok;
                    println!(
                        "   repeat {} load x{rate:<5} {:<18} {ok}/{} ok in {:.1} s{}",
                        r + 1,
                        policy.name(),
                        run.records.len(),
                        run.duration_s,
                        if run.health.valid() {
                            String::new()
                        } else {
                            format!(" — INVALID: {}", run.health.invalid.join("; "))
                        }
                    );
                    runs.push(run);
                }
            }
        }
        let scope = Scope {
            title: format!("{} — {}", plan.name, w.name),
            model_profile: format!(
                "{}{}",
                topo.workers.profile,
                topo.workers
                    .prefill_ms_per_token
                    .map(|p| format!(" with prefill at {p} ms/token"))
                    .unwrap_or_default()
            ),
            workload: w.describe(),
            seed: w.seed,
            schedule_hash: hash,
            requests: sched.len(),
            knowledge: format!(
                "kvroute: KV events via kvroute-updater, pulled by Envoy every 100 ms as snapshot deltas, event credit allowed for {} ms (fading after half), extra delay {} ms; kvroute-history: routing history and response feedback with the updater's load; kvroute-load-only: the cost model on load alone",
                topo.knowledge.max_event_age_ms, topo.knowledge.delay_ms
            ),
            topology: format!(
                "{}{}",
                topo.describe(),
                if sc.prewarm.is_empty() {
                    String::new()
                } else {
                    format!("; workers {:?} hold the shared prefixes at the start", sc.prewarm)
                }
            ),
            machine: machine(),
            faults: sc.faults.iter().map(|f| f.describe()).collect(),
            block_size,
            filter_profile: topo.filter.describe(),
            sim_profile: topo.sim_profile(),
        };
        let setup =
            Setup { scope, ceiling: Some(ceiling), slo: w.slo, faults: sc.faults.clone(), reuse };
        let rep = report::summarize(&setup, &runs);
        let dir = out.join(&w.name);
        report::write(&rep, &runs, &dir)?;
        println!("\n{}", report::summary_table(&rep));
        println!("   (report: {})", dir.join("report.md").display());
        reports.push(rep);
    }
    if args.dry_run {
        return Ok(());
    }
    let mut summary = report::summary::overview(&plan.name, &reports);
    if (plan.reference || args.reference) && !args.no_reference {
        let policies: Vec<Policy> = [Policy::Kvroute, Policy::LeastRequest, Policy::Oracle]
            .into_iter()
            .filter(|p| plan.policies.contains(p))
            .collect();
        println!(
            "\n== reference cases: {} x levels {:?}",
            policies.len(),
            reference::DEFAULT_LEVELS
        );
        let rep = reference::run(
            &plan.topology,
            &policies,
            &reference::DEFAULT_LEVELS,
            &out.join("reference"),
            &reference::ReferenceOptions::default(),
        )
        .await
        .context("the reference cases")?;
        summary.push_str(&reference_summary(&rep));
    }
    std::fs::write(out.join("summary.md"), &summary)?;
    println!("\n{summary}\n(written to {})", out.display());
    anyhow::ensure!(
        failed == 0 || plan.scenarios.iter().any(|s| !s.faults.is_empty()),
        "{failed} requests failed"
    );
    Ok(())
}

/// The transfer reference sweep alone, into `<out>/transfer/`.
async fn transfer_sweep(
    args: &Args,
    plan: &ComparisonPlan,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    let mut opts = kvroute_eval::transfer::TransferOptions::default();
    if let Some(b) = &args.transfer_bandwidths {
        opts.bandwidths_gbps = b.clone();
    }
    if let Some(l) = &args.transfer_levels {
        opts.levels = l.clone();
    }
    println!(
        "== transfer sweep: {:?} Gb/s x holder queues {:?}",
        opts.bandwidths_gbps, opts.levels
    );
    let rep = kvroute_eval::transfer::run(&plan.topology, &opts, &out.join("transfer"))
        .await
        .context("the transfer sweep")?;
    let md = kvroute_eval::transfer::markdown(&rep);
    println!(
        "{md}
(written to {})",
        out.join("transfer").display()
    );
    Ok(())
}

/// The reference cases' crossovers, for the summary.
fn reference_summary(rep: &reference::ReferenceReport) -> String {
    let n = |v: Option<usize>| v.map_or("none in the sweep".to_string(), |n| format!("n = {n}"));
    format!(
        "\n## The three reference cases\n\nA busy worker A holding all of the prefix, an idle worker B holding none, a loaded worker C holding part; A carries n background requests. Measured crossover (the what-if best stops being A): {}. Crossover kvroute's cost model predicts: {} with A's requests reported running, {} with them reported waiting, {} on the load the workers actually reported. Details: `reference/reference.md`, plot `reference/reference.svg`.\n",
        n(rep.measured_crossover),
        n(rep.predicted_crossover),
        n(rep.predicted_crossover_queued),
        n(rep.model_crossover_observed),
    )
}

/// Re-summarizes every `<dir>/<workload>/report.json` and rewrites the reports and the summary.
fn rerender(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("report.json").is_file())
        .collect();
    let mut reports = Vec::new();
    // Keep the order the workloads ran in (the schedule hash does not tell it; titles do not
    // either), so sort by the file's modification time.
    subdirs
        .sort_by_key(|p| std::fs::metadata(p.join("report.json")).and_then(|m| m.modified()).ok());
    for sub in subdirs {
        let (setup, runs) = report::read_json(&sub.join("report.json"))?;
        let rep = report::summarize(&setup, &runs);
        report::write(&rep, &runs, &sub)?;
        println!("{}\n{}", rep.scope.title, report::summary_table(&rep));
        reports.push(rep);
    }
    anyhow::ensure!(!reports.is_empty(), "no */report.json under {}", dir.display());
    let name = dir.file_name().map_or("results".into(), |n| n.to_string_lossy().into_owned());
    let mut summary = report::summary::overview(&name, &reports);
    let reference = dir.join("reference").join("reference.json");
    if reference.is_file() {
        let text = std::fs::read_to_string(&reference)?;
        let rep: reference::ReferenceReport = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", reference.display()))?;
        summary.push_str(&reference_summary(&rep));
    }
    std::fs::write(dir.join("summary.md"), &summary)?;
    println!("{summary}");
    Ok(())
}

kvroute_stack::help_test!(Args);
