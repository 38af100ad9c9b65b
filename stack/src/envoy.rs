//! Envoy: rendering the bootstrap templates in `envoy/`, starting and validating, reading stats.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::process::Command;

use crate::paths;
use crate::process::Guard;

/// Fills `${NAME}` placeholders in one pass over the template; fails on a placeholder with no
/// value. Values are inserted as they are (a tokenizer inlined in a filter config may well
/// contain `${`).
pub fn render(template: &str, vars: &[(&str, String)]) -> anyhow::Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(pos) = rest.find("${") {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 2..];
        let name = after.split('}').next().unwrap_or("");
        match vars.iter().find(|(k, _)| *k == name).filter(|_| after.len() > name.len()) {
            Some((_, v)) => out.push_str(v),
            None => {
                let shown: String = rest[pos..].chars().take(30).collect();
                bail!("unfilled placeholder in Envoy template: {shown}");
            }
        }
        rest = &after[name.len() + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The template files shipped in `envoy/`.
pub fn templates() -> anyhow::Result<Vec<PathBuf>> {
    let dir = paths::repo_root().join("envoy");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    out.sort();
    Ok(out)
}

/// `lb_endpoints` for `addrs` (`ip:port`) as a YAML flow list.
pub fn endpoints(addrs: &[String]) -> anyhow::Result<String> {
    let list: Vec<serde_json::Value> = addrs
        .iter()
        .map(|a| {
            let sa: std::net::SocketAddr = a.parse().with_context(|| format!("bad address {a}"))?;
            Ok(serde_json::json!({"endpoint": {"address": {"socket_address": {
                "address": sa.ip().to_string(), "port_value": sa.port()}}}}))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(serde_json::Value::Array(list).to_string())
}

/// Runs `envoy --mode validate`; returns (success, combined output).
pub async fn validate(config: &Path) -> anyhow::Result<(bool, String)> {
    let out = Command::new(paths::envoy_bin()?)
        .args(["--mode", "validate", "--log-level", "info", "-c"])
        .arg(config)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .context("validate timed out")??;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

/// Envoy exited at startup because a port it was given was already taken.
#[derive(Debug)]
pub struct EnvoyLostAPort {
    pub admin_port: u16,
    pub listen_port: u16,
    /// Envoy's warning, error and critical lines.
    pub said: String,
}

impl std::fmt::Display for EnvoyLostAPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, l) = (self.admin_port, self.listen_port);
        write!(f, "envoy could not bind its ports (admin {a}, listener {l}): {}", self.said)
    }
}

impl std::error::Error for EnvoyLostAPort {}

/// Envoy's log says a port it was to bind was in use.
fn lost_a_port(log: &Path) -> bool {
    complaints(log).lines().any(|l| l.contains("Address already in use"))
}

/// The warning, error and critical lines of Envoy's `log` (the reason it stopped is among
/// them; its last lines are often the list of extensions it was built with).
fn complaints(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| ["][warning][", "][error][", "][critical]["].iter().any(|k| l.contains(k)))
        .collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A running Envoy.
pub struct Envoy {
    pub guard: Guard,
    pub admin_port: u16,
    pub listen_port: u16,
    pub log: PathBuf,
    /// From process start to the admin reporting ready (wasm compiled, filter configured).
    pub startup: Duration,
}

impl Envoy {
    /// Starts Envoy on `config` and waits until its admin says it is ready and the listener
    /// accepts connections.
    pub async fn start(
        config: &Path,
        admin_port: u16,
        listen_port: u16,
        dir: &Path,
        concurrency: u32,
    ) -> anyhow::Result<Envoy> {
        let log = dir.join("envoy.log");
        let started = std::time::Instant::now();
        let mut cmd = Command::new(paths::envoy_bin()?);
        cmd.arg("-c")
            .arg(config)
            .args(["--concurrency", &concurrency.to_string(), "--log-level", "info"])
            .args(["--base-id", &(std::process::id() % 60_000 + u32::from(admin_port)).to_string()])
            // The singleton reads the updater's token from Envoy's environment (host_env_keys),
            // so it never appears in the bootstrap or /config_dump.
            .env("KVROUTE_UPDATER_TOKEN", crate::stack::UPDATER_TOKEN);
        let mut guard = Guard::spawn("envoy", cmd, &log)?;
        // Each probe is bounded: whatever else answers on a port taken from under Envoy may
        // never reply, and the exit check below must still run.
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let ready = format!("http://127.0.0.1:{admin_port}/ready");
        let res = crate::eventually("envoy ready", Duration::from_secs(90), || {
            let http = http.clone();
            let ready = ready.clone();
            let exited = guard.try_exit();
            async move {
                if exited.is_some() {
                    return Some(false);
                }
                let ok = http.get(&ready).send().await.ok()?.status().is_success();
                ok.then_some(true)
            }
        })
        .await;
        if !matches!(res, Ok(true)) {
            let tail = crate::process::log_tail(&log, 20);
            let said = complaints(&log);
            if lost_a_port(&log) {
                bail!(EnvoyLostAPort { admin_port, listen_port, said });
            }
            bail!("envoy did not become ready ({res:?}); it said:\n{said}\nlog tail:\n{tail}");
        }
        Ok(Envoy { guard, admin_port, listen_port, log, startup: started.elapsed() })
    }

    /// [`Envoy::start`] on `admin` and `listen` with the bootstrap that `config(admin, listen)`
    /// writes. [`paths::free_port`] releases the port it found, so another process can take it
    /// before Envoy binds it (another listener; an outgoing connection's local port too, where
    /// the port lies in the kernel's ephemeral range), and Envoy exits at startup. That case,
    /// and only that one, is tried again on fresh ports, at most twice: the returned Envoy's
    /// `admin_port` and `listen_port` are the ones it has.
    pub async fn start_retrying_ports(
        (admin, listen): (u16, u16),
        dir: &Path,
        concurrency: u32,
        mut config: impl FnMut(u16, u16) -> anyhow::Result<PathBuf>,
    ) -> anyhow::Result<Envoy> {
        let (mut admin, mut listen) = (admin, listen);
        for _ in 0..2 {
            let path = config(admin, listen)?;
            match Envoy::start(&path, admin, listen, dir, concurrency).await {
                Err(e) if e.downcast_ref::<EnvoyLostAPort>().is_some() => {
                    eprintln!("kvroute-stack: {e}; starting Envoy again on other ports");
                }
                other => return other,
            }
            (admin, listen) = (paths::free_port()?, paths::free_port()?);
        }
        Envoy::start(&config(admin, listen)?, admin, listen, dir, concurrency).await
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.listen_port)
    }

    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    /// Waits until Envoy's active health checks report `n` healthy workers.
    pub async fn wait_healthy(&self, n: usize) -> anyhow::Result<()> {
        let url = format!("{}/clusters", self.admin_url());
        crate::eventually("healthy workers", Duration::from_secs(30), || {
            let url = url.clone();
            async move {
                let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
                let healthy = text
                    .lines()
                    .filter(|l| {
                        l.starts_with("workers::") && l.ends_with("::health_flags::healthy")
                    })
                    .count();
                (healthy == n).then_some(())
            }
        })
        .await
    }

    /// Waits until every one of Envoy's worker threads (`server.concurrency`) can route: each
    /// has every model's bundle and, with `knowledge`, a snapshot from the updater
    /// (`kvroute_threads_ready`; without: `kvroute_threads_bundled`). Worker threads count
    /// themselves from their first ticks, before they serve.
    pub async fn wait_threads_ready(
        &self,
        knowledge: bool,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let gauge = if knowledge { "kvroute_threads_ready" } else { "kvroute_threads_bundled" };
        let res = crate::eventually(
            &format!("every Envoy worker thread counted in {gauge}"),
            timeout,
            || async {
                let m = self.prometheus().await.ok()?;
                let threads = m.get("envoy_server_concurrency").copied()?;
                (threads >= 1.0 && m.get(gauge).copied().unwrap_or(0.0) >= threads).then_some(())
            },
        )
        .await;
        if let Err(e) = res {
            let m = self.prometheus().await.unwrap_or_default();
            let show = |k: &str| m.get(k).map_or("absent".to_string(), |v| v.to_string());
            anyhow::bail!(
                "{e}: server_concurrency {}, kvroute_threads_bundled {}, kvroute_threads_ready {}",
                show("envoy_server_concurrency"),
                show("kvroute_threads_bundled"),
                show("kvroute_threads_ready")
            );
        }
        Ok(())
    }

    /// Prometheus samples from `/stats/prometheus`: `name{label="v",...}` → value.
    pub async fn prometheus(&self) -> anyhow::Result<HashMap<String, f64>> {
        let text =
            reqwest::get(format!("{}/stats/prometheus", self.admin_url())).await?.text().await?;
        // Envoy writes label-less samples as `name{} value`, which prometheus-parse skips.
        let lines = text.lines().map(|l| Ok(l.replacen("{} ", " ", 1)));
        let scrape = prometheus_parse::Scrape::parse(lines).context("parsing /stats/prometheus")?;
        let mut out = HashMap::new();
        for s in scrape.samples {
            let mut labels: Vec<String> =
                s.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            labels.sort();
            let key = if labels.is_empty() {
                s.metric.clone()
            } else {
                format!("{}{{{}}}", s.metric, labels.join(","))
            };
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                prometheus_parse::Value::Histogram(h) => {
                    h.iter().map(|c| c.count).fold(0.0, f64::max)
                }
                prometheus_parse::Value::Summary(_) => continue,
            };
            out.insert(key, v);
        }
        Ok(out)
    }

    /// Histogram percentiles from the admin `/stats` text (`P50(interval,cumulative)` form):
    /// the cumulative value of each requested quantile of `stat`.
    pub async fn histogram_quantiles(&self, stat: &str) -> anyhow::Result<HashMap<String, f64>> {
        let text =
            reqwest::get(format!("{}/stats?filter={stat}", self.admin_url())).await?.text().await?;
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{stat}:")))
            .with_context(|| format!("no histogram {stat}"))?;
        let mut out = HashMap::new();
        for part in line.split_whitespace().skip(1) {
            // P50(12.3,45.6)
            if let Some((q, rest)) = part.split_once('(') {
                let cumulative = rest.trim_end_matches(')').split(',').nth(1).unwrap_or("nan");
                if let Ok(v) = cumulative.parse::<f64>() {
                    out.insert(q.to_owned(), v);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn placeholders_are_filled_once_and_values_kept_verbatim() {
        let vars = [("A", "x${B}y".to_string()), ("B", "2".to_string())];
        assert_eq!(render("${A}-${B}", &vars).unwrap(), "x${B}y-2");
        assert!(render("${C}", &vars).unwrap_err().to_string().contains("${C}"));
        assert!(render("tail ${A", &vars).is_err());
        assert_eq!(render("no placeholders", &vars).unwrap(), "no placeholders");
    }
}
