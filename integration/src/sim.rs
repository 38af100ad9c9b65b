//! Simulated workers, one process each (so a test can kill one).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio::process::Command;

use crate::paths;
use crate::process::Guard;

/// A running simulated worker.
pub struct SimWorker {
    pub guard: Guard,
    pub addr: String,
}

impl SimWorker {
    /// Starts one worker on a free loopback port with extra `args`.
    pub async fn start(index: usize, args: &[String], dir: &Path) -> anyhow::Result<SimWorker> {
        let mut cmd = Command::new(paths::sim_bin()?);
        cmd.args(["--workers", "1", "--base-port", "0"]).args(args);
        let mut guard = Guard::spawn(
            &format!("sim-{index}"),
            cmd,
            &dir.join(format!("sim-{index}.log")),
        )?;
        let line = guard
            .wait_line("listening on", Duration::from_secs(30))
            .await?;
        let addr = line
            .rsplit(' ')
            .next()
            .context("no address in sim output")?
            .to_owned();
        Ok(SimWorker { guard, addr })
    }
}
