//! Child processes that cannot outlive their owner: killed on drop (also when a test panics).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running child process; dropping it kills it.
pub struct Guard {
    pub name: String,
    child: Child,
}

impl Guard {
    /// Starts `cmd` with stderr to `log`; stdout is piped for [`Guard::wait_line`].
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Guard> {
        let err =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(err)).kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Guard { name: name.to_owned(), child })
    }

    /// Reads stdout until a line contains `needle`; returns that line.
    pub async fn wait_line(&mut self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        let mut lines = self.wait_lines(needle, 1, timeout).await?;
        lines.pop().with_context(|| format!("{}: no line", self.name))
    }

    /// Reads stdout until `count` lines contain `needle`; returns them. Stdout can be read
    /// this way once; afterwards it is drained in the background.
    pub async fn wait_lines(
        &mut self,
        needle: &str,
        count: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<String>> {
        let out = self.child.stdout.take().context("stdout already taken")?;
        let mut lines = BufReader::new(out).lines();
        let found = tokio::time::timeout(timeout, async {
            let mut found = Vec::new();
            while found.len() < count {
                match lines.next_line().await? {
                    Some(line) if line.contains(needle) => found.push(line),
                    Some(_) => {}
                    None => break,
                }
            }
            Ok::<_, std::io::Error>(found)
        })
        .await
        .with_context(|| format!("{}: no '{needle}' within {timeout:?}", self.name))??;
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        anyhow::ensure!(
            found.len() == count,
            "{} exited before printing '{needle}' {count} times",
            self.name
        );
        Ok(found)
    }

    /// The OS process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resident memory (`VmRSS`, kB), while running.
    pub fn rss_kb(&self) -> Option<u64> {
        rss_kb(self.pid()?)
    }

    /// Kills the process now and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Whether the process has exited, with its status.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for exit up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait()).await.ok().and_then(Result::ok)
    }
}

/// Resident memory (`VmRSS`, kB) of process `pid`, from /proc.
pub fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    kb.split_whitespace().next()?.parse().ok()
}

/// The last `n` lines of the log at `path` ("" if it cannot be read), for error messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut tail: Vec<&str> = text.lines().rev().take(n).collect();
    tail.reverse();
    tail.join("\n")
}
