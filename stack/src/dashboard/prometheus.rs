//! A real Prometheus on loopback for the dashboard rendering: it scrapes Envoy's admin
//! (`/stats/prometheus`, job `envoy`) and kvroute-updater (`/metrics`, job `updater`) every
//! second, and answers the panels' queries through its HTTP API (`/api/v1/query_range`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::paths;
use crate::process::Guard;

/// The Prometheus binary: `$KVROUTE_PROMETHEUS`, else `prometheus` on `PATH`.
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("KVROUTE_PROMETHEUS") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("prometheus")).find(|p| p.is_file()).context(
        "prometheus not found on PATH (./dev dashboard installs it; or set KVROUTE_PROMETHEUS)",
    )
}

/// One series of a range query: its labels and (unix seconds, value) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

/// A running Prometheus.
pub struct Prometheus {
    _guard: Guard,
    pub port: u16,
}

/// The scrape configuration for Envoy's admin on `envoy_admin` and the updater on `updater`.
pub fn config(envoy_admin: u16, updater: u16) -> String {
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n\
         - job_name: envoy\n  metrics_path: /stats/prometheus\n  static_configs:\n\
         \x20 - targets: ['127.0.0.1:{envoy_admin}']\n\
         - job_name: updater\n  static_configs:\n  - targets: ['127.0.0.1:{updater}']\n"
    )
}

impl Prometheus {
    /// Starts Prometheus in `dir` scraping Envoy's admin and the updater; waits until ready.
    pub async fn start(dir: &Path, envoy_admin: u16, updater: u16) -> anyhow::Result<Prometheus> {
        let cfg = dir.join("prometheus.yml");
        std::fs::write(&cfg, config(envoy_admin, updater))?;
        let port = paths::free_port()?;
        let mut cmd = tokio::process::Command::new(binary()?);
        cmd.arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let guard = Guard::spawn("prometheus", cmd, &dir.join("prometheus.log"))?;
        let ready = format!("http://127.0.0.1:{port}/-/ready");
        crate::eventually("prometheus ready", Duration::from_secs(60), || {
            let ready = ready.clone();
            async move { reqwest::get(&ready).await.ok()?.status().is_success().then_some(()) }
        })
        .await?;
        Ok(Prometheus { _guard: guard, port })
    }

    /// `query` evaluated from `start` to `end` (unix seconds) every `step_s` seconds.
    pub async fn query_range(
        &self,
        query: &str,
        start: f64,
        end: f64,
        step_s: f64,
    ) -> anyhow::Result<Vec<Series>> {
        let url = format!("http://127.0.0.1:{}/api/v1/query_range", self.port);
        let params = [
            ("query", query.to_owned()),
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
            ("step", format!("{step_s}")),
        ];
        let body: Value =
            reqwest::Client::new().post(url).form(&params).send().await?.json().await?;
        parse_matrix(&body).with_context(|| format!("query {query}"))
    }
}

/// The series of a `query_range` answer; an error answer is an error.
pub fn parse_matrix(body: &Value) -> anyhow::Result<Vec<Series>> {
    if body["status"] != "success" {
        bail!("prometheus: {} {}", body["errorType"], body["error"]);
    }
    let result = body["data"]["result"].as_array().context("no data.result")?;
    result
        .iter()
        .map(|s| {
            let labels = s["metric"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            let points = s["values"]
                .as_array()
                .context("a series without values")?
                .iter()
                .filter_map(|p| {
                    let t = p.get(0)?.as_f64()?;
                    let v = p.get(1)?.as_str()?.parse::<f64>().ok()?;
                    Some((t, v))
                })
                .collect();
            Ok(Series { labels, points })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matrices_and_errors_are_read() {
        let ok = json!({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"worker": "a"}, "values": [[1700000000.5, "1.5"], [1700000001.5, "NaN"]]}
        ]}});
        let s = parse_matrix(&ok).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].labels["worker"], "a");
        assert_eq!(s[0].points[0], (1700000000.5, 1.5));
        assert!(s[0].points[1].1.is_nan());
        let err = json!({"status": "error", "errorType": "bad_data", "error": "parse error"});
        assert!(parse_matrix(&err).unwrap_err().to_string().contains("parse error"));
    }

    #[test]
    fn config_scrapes_envoy_admin_and_updater() {
        let c = config(9901, 8080);
        assert!(c.contains("metrics_path: /stats/prometheus"));
        assert!(c.contains("'127.0.0.1:9901'") && c.contains("'127.0.0.1:8080'"));
        assert!(c.contains("job_name: envoy") && c.contains("job_name: updater"));
    }
}
