//! `./dev up` (`kvroute-up`): the stack comes up, the printed `curl` gets an answer with a
//! kvroute decision, and SIGINT stops every process it started; a failed start stops the ones
//! already running.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use kvroute_stack::{eventually, paths};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// `kvroute-up` on free ports with `extra` flags and environment.
fn up(
    extra: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<(Child, Lines<BufReader<ChildStdout>>)> {
    let mut cmd = Command::new(paths::up_bin()?);
    cmd.args(["--listen-port", "0", "--admin-port", "0", "--updater-port", "0"])
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("starting kvroute-up")?;
    let out = child.stdout.take().context("no stdout")?;
    Ok((child, BufReader::new(out).lines()))
}

/// Reads lines until one contains `needle` (or stdout ends); returns every line read.
async fn read_until(
    lines: &mut Lines<BufReader<ChildStdout>>,
    needle: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            let done = line.contains(needle);
            seen.push(line);
            if done {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(timeout, read).await.context("kvroute-up's output")??;
    Ok(seen)
}

/// `started NAME pid PID` lines → name → pid.
fn pids(lines: &[String]) -> HashMap<String, u32> {
    lines
        .iter()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "started").then_some(())?;
            let name = w.next()?.to_owned();
            (w.next()? == "pid").then_some(())?;
            Some((name, w.next()?.parse().ok()?))
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"))
        .unwrap_or(false)
}

async fn all_gone(pids: &HashMap<String, u32>) -> anyhow::Result<()> {
    eventually("every child gone", Duration::from_secs(20), || async {
        pids.values().all(|p| !alive(*p)).then_some(())
    })
    .await
    .with_context(|| {
        let left: Vec<_> = pids.iter().filter(|(_, p)| alive(**p)).collect();
        format!("still running: {left:?}")
    })
}

fn sigint(pid: u32) -> anyhow::Result<()> {
    let st = std::process::Command::new("kill").args(["-INT", &pid.to_string()]).status()?;
    anyhow::ensure!(st.success(), "kill -INT {pid} failed");
    Ok(())
}

/// A request as the printed `curl` sends it.
struct Curl {
    url: String,
    headers: Vec<(String, String)>,
    body: String,
}

/// The printed `curl ... URL -H 'k: v' -d 'BODY'` line.
fn parse_curl(line: &str) -> anyhow::Result<Curl> {
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).context("no URL")?;
    let quoted: Vec<&str> = line.split('\'').skip(1).step_by(2).collect();
    let before = |q: &str| line.split(&format!("'{q}'")).next().unwrap_or("").trim_end().to_owned();
    let mut headers = Vec::new();
    let mut body = None;
    for q in quoted {
        let b = before(q);
        if b.ends_with("-H") {
            let (k, v) = q.split_once(':').context("bad header")?;
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        } else if b.ends_with("-d") {
            body = Some(q.to_owned());
        }
    }
    Ok(Curl { url: url.to_owned(), headers, body: body.context("no -d body")? })
}

#[tokio::test]
async fn up_serves_the_printed_curl_and_sigint_stops_everything() -> anyhow::Result<()> {
    let (mut child, mut lines) = up(&["--workers", "2"], &[])?;
    let pid = child.id().context("no pid")?;
    let out = read_until(&mut lines, "ready", Duration::from_secs(180)).await?;
    anyhow::ensure!(out.last().is_some_and(|l| l.contains("ready")), "no ready line: {out:#?}");
    let children = pids(&out);
    for name in ["sim-0", "sim-1", "kvroute-updater", "envoy"] {
        anyhow::ensure!(children.contains_key(name), "no pid for {name}: {out:#?}");
    }
    for want in ["listener  http://127.0.0.1:", "admin     http://", "updater   http://"] {
        anyhow::ensure!(out.iter().any(|l| l.starts_with(want)), "no '{want}': {out:#?}");
    }
    let curl = out.iter().find(|l| l.starts_with("curl ")).context("no curl line")?;
    let Curl { url, headers, body } = parse_curl(curl)?;
    let mut req = reqwest::Client::new().post(&url).body(body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let resp = req.send().await?;
    anyhow::ensure!(resp.status() == 200, "{url}: {}", resp.status());
    let decision = resp.headers().get("x-kvroute-decision").context("no x-kvroute-decision")?;
    anyhow::ensure!(!decision.is_empty());
    let answer: serde_json::Value = resp.json().await?;
    anyhow::ensure!(answer["choices"][0]["message"]["content"].is_string(), "{answer}");
    // The updater and Envoy's admin answer where the banner says.
    let updater = out.iter().find_map(|l| l.strip_prefix("updater   ")).context("updater")?;
    let status =
        reqwest::get(format!("{}/status", updater.split_whitespace().next().unwrap_or(""))).await?;
    anyhow::ensure!(status.status() == 200);

    sigint(pid)?;
    let exit =
        tokio::time::timeout(Duration::from_secs(40), child.wait()).await.context("exit")??;
    anyhow::ensure!(exit.success(), "kvroute-up exited with {exit}");
    let rest = read_until(&mut lines, "stopped", Duration::from_secs(5)).await?;
    anyhow::ensure!(rest.iter().any(|l| l == "stopped"), "{rest:?}");
    all_gone(&children).await
}

#[tokio::test]
async fn a_failed_start_stops_what_was_started() -> anyhow::Result<()> {
    // An "Envoy" that exits at once: the workers and the updater are up by then.
    let (mut child, mut lines) = up(&["--workers", "2"], &[("KVROUTE_ENVOY", "/bin/false")])?;
    let exit =
        tokio::time::timeout(Duration::from_secs(180), child.wait()).await.context("exit")??;
    anyhow::ensure!(!exit.success(), "kvroute-up should fail without Envoy");
    let out = read_until(&mut lines, "stopped", Duration::from_secs(5)).await?;
    let children = pids(&out);
    for name in ["sim-0", "sim-1", "kvroute-updater"] {
        anyhow::ensure!(children.contains_key(name), "no pid for {name}: {out:#?}");
    }
    anyhow::ensure!(!out.iter().any(|l| l.contains("ready")), "{out:#?}");
    all_gone(&children).await
}
