//! The report's files: `report.md`, `report.json` and the plots ([`write`]), and reading
//! `report.json` back ([`read_json`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use super::markdown::markdown;
use super::plots;
use super::summarize::rate_of;
use super::types::{Report, Scope, Setup};
use crate::cluster::TimedFault;
use crate::record::{RunResult, Slo};

/// What one plot file shows.
enum Plot {
    TtftCdf,
    /// Index into [`Report::policies`].
    Queue(usize),
    CohortTails,
    Sweep,
    Estimate,
}

/// The plots of a report with their file names (file-safe and unique) and captions.
fn plots_of(report: &Report) -> Vec<(String, String, Plot)> {
    let mut files = vec![(
        "ttft_cdf.svg".to_owned(),
        "TTFT CDF at the reference load, one line per policy (valid runs pooled; log x)".to_owned(),
        Plot::TtftCdf,
    )];
    let mut used = BTreeSet::new();
    for name in report.policy_names() {
        let Some(i) = report
            .policy(name)
            .and_then(|p| report.policies.iter().position(|q| std::ptr::eq(p, q)))
        else {
            continue;
        };
        let safe: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let mut file = format!("queue_{safe}.svg");
        let mut n = 2;
        while !used.insert(file.clone()) {
            file = format!("queue_{safe}_{n}.svg");
            n += 1;
        }
        let p = &report.policies[i];
        let caption = format!(
            "{name}: queue (running + waiting) per worker over time (repeat {}, load ×{})",
            p.repeat + 1,
            p.rate_scale
        );
        files.push((file, caption, Plot::Queue(i)));
    }
    files.push((
        "cohort_tails.svg".to_owned(),
        "TTFT p99 per cohort, one bar per policy (median of valid runs)".to_owned(),
        Plot::CohortTails,
    ));
    files.push((
        "sweep.svg".to_owned(),
        "Load sweep: TTFT p90 and useful/s against offered load, one line per policy (medians)"
            .to_owned(),
        Plot::Sweep,
    ));
    files.push((
        "estimate_error.svg".to_owned(),
        "kvroute's TTFT estimate error (median |predicted − observed| / observed) per time window"
            .to_owned(),
        Plot::Estimate,
    ));
    files
}

/// The plot files of a report, with what each shows: `ttft_cdf.svg`, one `queue_<policy>.svg`
/// per policy (names made file-safe and unique), `cohort_tails.svg`, `sweep.svg`,
/// `estimate_error.svg`.
pub fn plot_files(report: &Report) -> Vec<(String, String)> {
    plots_of(report).into_iter().map(|(name, caption, _)| (name, caption)).collect()
}

/// Writes `report.md`, `report.json` (the [`Report`]'s fields plus `runs`, every per-request
/// record and queue sample) and the plots of [`plot_files`] into `dir` (created if needed).
/// Returns the paths written. `runs` should be the runs the report was made from.
pub fn write(report: &Report, runs: &[RunResult], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: &str, content: &str| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };

    put("report.md", &markdown(report))?;

    let mut json = serde_json::to_value(report)?;
    if let serde_json::Value::Object(map) = &mut json {
        map.insert("runs".to_owned(), serde_json::to_value(runs)?);
    }
    put("report.json", &serde_json::to_string_pretty(&json)?)?;

    let at_ref = |r: &&RunResult| rate_of(r) == report.reference_rate && r.health.valid();
    let cdf_runs: Vec<RunResult> = runs.iter().filter(at_ref).cloned().collect();
    for (name, _, plot) in plots_of(report) {
        let svg = match plot {
            Plot::TtftCdf => plots::ttft_cdf(&cdf_runs),
            Plot::CohortTails => plots::cohort_tails(report),
            Plot::Sweep => plots::sweep(report),
            Plot::Estimate => plots::estimate(report),
            Plot::Queue(i) => {
                let p = &report.policies[i];
                plots::queue(
                    &p.policy,
                    runs.iter().find(|r| {
                        r.policy == p.policy && r.repeat == p.repeat && rate_of(r) == p.rate_scale
                    }),
                )
            }
        };
        put(&name, &svg.with_context(|| format!("drawing {name}"))?)?;
    }
    Ok(written)
}

/// Reads back a `report.json` written by [`write`] (this version or an older one): what the
/// report was made from, and the runs.
pub fn read_json(path: &Path) -> anyhow::Result<(Setup, Vec<RunResult>)> {
    #[derive(Deserialize)]
    struct File {
        scope: Scope,
        ceiling: Option<f64>,
        slo: Slo,
        #[serde(default)]
        faults: Vec<TimedFault>,
        #[serde(default)]
        reuse: Vec<[u64; 2]>,
        #[serde(default)]
        runs: Vec<RunResult>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let f: File = serde_json::from_str(&text).context("report.json")?;
    let setup =
        Setup { scope: f.scope, ceiling: f.ceiling, slo: f.slo, faults: f.faults, reuse: f.reuse };
    Ok((setup, f.runs))
}
