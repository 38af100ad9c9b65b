//! kvroute against each peer router that ran (SMG, the vLLM router): per metric of cohort
//! `all`, kvroute's figure over the peer's, paired by repeat and judged against least-request's
//! A/A noise floor, the same way the ablation ladder judges a rung against the one before it.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::markdown::{cell, ratio_cell, table};
use super::summarize::metric_ratio;
use super::types::{CohortStats, Metric, MetricRatio, Report};
use super::ALL;
use crate::cluster::Policy;

/// kvroute against one peer router, cohort `all`, reference rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerComparison {
    pub peer: String,
    /// kvroute's valid runs and the peer's.
    pub runs: [usize; 2],
    /// kvroute over the peer, per [`Metric::ALL`] (`better`: kvroute's figure is better).
    pub metrics: Vec<MetricRatio>,
}

/// One comparison per peer policy that ran beside kvroute.
pub(super) fn compare(report: &Report) -> Vec<PeerComparison> {
    let runs = |policy: &str| -> Vec<(usize, &CohortStats)> {
        report
            .runs_of(policy)
            .into_iter()
            .filter_map(|p| Some((p.repeat, p.cohort(ALL)?)))
            .collect()
    };
    let kvroute = runs(Policy::Kvroute.name());
    if kvroute.is_empty() {
        return Vec::new();
    }
    let floor = report.noise.iter().find(|n| n.cohort == ALL);
    let names = report.policy_names();
    Policy::PEERS
        .iter()
        .map(|p| p.name())
        .filter(|n| names.contains(n))
        .map(|peer| {
            let theirs = runs(peer);
            PeerComparison {
                peer: peer.to_owned(),
                runs: [kvroute.len(), theirs.len()],
                metrics: Metric::ALL
                    .iter()
                    .map(|&m| metric_ratio(m, &kvroute, &theirs, floor.and_then(|f| f.floor(m))))
                    .collect(),
            }
        })
        .collect()
}

/// The report's section, when a peer ran.
pub(super) fn section(report: &Report, out: &mut String) {
    if report.peers.is_empty() {
        return;
    }
    out.push_str(
        "## kvroute against the peer routers\n\nCohort `all`: kvroute's figure over each peer's, \
         paired by repeat, judged against least-request's A/A noise floor (\"better\": kvroute's \
         figure is better). Each peer ran from its pinned wheel in front of the same workers, \
         on the same arrivals.\n\n",
    );
    let metrics = [Metric::TtftP50, Metric::TtftP99, Metric::SloShare, Metric::UsefulPerS];
    let mut header = vec!["peer".to_owned(), "runs (kvroute / peer)".to_owned()];
    header.extend(metrics.iter().map(|m| format!("kvroute / peer: {}", m.label())));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let rows = report.peers.iter().map(|p| {
        let mut row = vec![cell(&p.peer), format!("{} / {}", p.runs[0], p.runs[1])];
        for m in metrics {
            row.push(p.metrics.iter().find(|x| x.metric == m).map_or("—".into(), ratio_cell));
        }
        row
    });
    out.push_str(&table(&header, rows));
    out.push_str("\nHow each peer ran:\n\n");
    for p in &report.peers {
        let flags = Policy::parse(&p.peer).ok().and_then(Policy::peer_flags);
        let flags = flags.unwrap_or("(unknown peer)");
        let _ = writeln!(out, "- `{}`: {}", cell(&p.peer), flags);
    }
    let _ = writeln!(out);
}
