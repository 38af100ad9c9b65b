//! kvroute-dashboard-render: the Grafana dashboard's panels from a demo run, as one SVG.
//!
//! Starts the stack (Envoy + kvroute filter + updater + simulated workers), a real Prometheus
//! scraping Envoy's admin and the updater every second, sends demo traffic in waves, then
//! evaluates every query of `deploy/grafana/kvroute-dashboard.json` over the run with
//! Prometheus's `query_range` (a query Prometheus refuses fails the tool: the PromQL is valid)
//! and draws the panels. Run with `./dev dashboard` (installs Prometheus if missing).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use kvroute_stack::dashboard::prometheus::Prometheus;
use kvroute_stack::dashboard::svg::{self, PanelData};
use kvroute_stack::dashboard::{self as dash};
use kvroute_stack::paths;
use kvroute_stack::stack::{Stack, StackOptions};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    about = "Renders the kvroute Grafana dashboard's panels from a demo run to SVG, with a real Prometheus"
)]
struct Args {
    /// Where the SVG goes (a relative path is taken from the repository root).
    #[arg(long, default_value = "deploy/grafana/dashboard.svg")]
    out: std::path::PathBuf,
    /// Waves of demo traffic (each: new conversations, three turns each, a bad and a batch request).
    #[arg(long, default_value_t = 12)]
    waves: u64,
    /// Conversations per wave.
    #[arg(long, default_value_t = 4)]
    conversations: usize,
    /// Simulated workers.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Grid columns.
    #[arg(long, default_value_t = 2)]
    columns: usize,
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dashboard = dash::load()?;
    let problems = dash::structure_problems(&dashboard);
    anyhow::ensure!(problems.is_empty(), "dashboard problems: {problems:#?}");
    let stack = Stack::start(StackOptions {
        updater: true,
        workers: args.workers,
        filter: json!({"calibration": {"enabled": true}}),
        ..Default::default()
    })
    .await?;
    let updater = stack.updater.as_ref().context("the stack has no updater")?;
    let prom = Prometheus::start(&stack.dir, stack.envoy.admin_port, updater.port).await?;
    eprintln!("stack and prometheus up (logs in {})", stack.dir.display());
    let start = now_s();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for wave in 0..args.waves {
        // Waves of growing then shrinking size, so rates move.
        let turns = 1 + (wave % 4) as usize;
        let statuses = dash::traffic(&stack, 100 + wave, args.conversations, turns).await?;
        let ok = statuses.iter().filter(|s| **s == 200).count();
        eprintln!("wave {wave}: {ok}/{} answered 200", statuses.len());
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Two more scrapes after the last request.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let end = now_s();
    let vars = [
        ("envoy_job", "envoy"),
        ("updater_job", "updater"),
        ("calib_model", "kvroute_demo"),
        ("__rate_interval", "5s"),
    ];
    let mut panels = Vec::new();
    for p in dash::panels(&dashboard) {
        let mut lines = Vec::new();
        for (format, expr) in &p.targets {
            let q = dash::interpolate(expr, &vars)?;
            let series = prom.query_range(&q, start, end, 1.0).await?;
            for s in series {
                let pts = s.points.iter().map(|(t, v)| (t - start, *v)).collect();
                lines.push((svg::legend(format, &s.labels), pts));
            }
        }
        eprintln!("panel {:>2} {:<48} {} series", p.id, p.title, lines.len());
        panels.push(PanelData { title: p.title, unit: p.unit, lines });
    }
    let subtitle = format!(
        "{} simulated workers, {} waves of demo traffic, evaluated by Prometheus",
        args.workers, args.waves
    );
    let text = svg::render(&panels, args.columns, &subtitle)?;
    let out = match args.out.is_absolute() {
        true => args.out.clone(),
        false => paths::repo_root().canonicalize()?.join(&args.out),
    };
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

kvroute_stack::help_test!(Args);
