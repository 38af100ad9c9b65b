//! Two Envoy replicas sharing one updater: the stack's Envoy (A) and a second one (B) with the
//! same filter configuration and workers, both pulling from and reporting to the same
//! kvroute-updater. Used by `tests/replicas.rs` and the freshness tool's peer mode.

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use crate::envoy::Envoy;
use crate::stack::{
    edited_template, filter_config, write_config_text, Stack, StackOptions, StackPorts, Updater,
};
use crate::{eventually, paths};

/// Stack A (its Envoy, workers and updater) and replica B.
pub struct Replicas {
    pub stack: Stack,
    pub b: Envoy,
}

/// How to start the updater of a replica pair.
#[derive(Debug, Clone, Default)]
pub struct ReplicaOptions {
    pub workers: usize,
    /// Follow the workers' KV events; without them, only a peer's report can credit a block.
    pub events: bool,
    pub sim_args: Vec<String>,
    /// Extra updater flags.
    pub updater_args: Vec<String>,
    /// Merged into the filter configuration of both replicas.
    pub filter: Value,
    /// Merged into the model's entry of both replicas' configuration.
    pub model_overrides: Value,
    /// Edits (from, to) of both replicas' Envoy configuration template.
    pub envoy_edits: Vec<(String, String)>,
}

impl Replicas {
    pub async fn start(o: ReplicaOptions) -> anyhow::Result<Replicas> {
        let opts = StackOptions {
            workers: o.workers,
            sim_args: o.sim_args.clone(),
            filter: if o.filter.is_null() { serde_json::json!({}) } else { o.filter.clone() },
            model_overrides: o.model_overrides.clone(),
            envoy_edits: o.envoy_edits.clone(),
            updater: false,
            ..Default::default()
        };
        let mut stack = Stack::start(opts.clone()).await?;
        let endpoints: Vec<String> = stack
            .workers
            .iter()
            .map(|w| match o.events {
                true => format!(
                    "{},tcp://127.0.0.1:{},tcp://127.0.0.1:{}",
                    w.addr, w.events_port, w.replay_port
                ),
                false => w.addr.clone(),
            })
            .collect();
        let admin = Some(stack.envoy.admin_port);
        let updater = Updater::start_with_args(
            stack.updater_port,
            admin,
            &endpoints,
            &o.updater_args,
            &stack.dir,
        )
        .await?;
        stack.updater = Some(updater);
        let dir = stack.dir.join("replica-b");
        std::fs::create_dir_all(&dir).context("creating replica B's directory")?;
        let ports = StackPorts {
            admin: paths::free_port()?,
            listen: paths::free_port()?,
            updater: stack.updater_port,
        };
        let addrs = stack.addrs();
        let filter = filter_config(&addrs, &opts);
        let text = edited_template("kvroute.yaml", &o.envoy_edits)?;
        let config = |admin, listen| {
            let ports = StackPorts { admin, listen, ..ports };
            write_config_text("kvroute.yaml", &text, &dir, ports, &addrs, &filter)
        };
        let first = (ports.admin, ports.listen);
        let b = Envoy::start_retrying_ports(first, &dir, opts.envoy_concurrency, config).await?;
        b.wait_healthy(addrs.len()).await?;
        Ok(Replicas { stack, b })
    }

    pub fn a(&self) -> &Envoy {
        &self.stack.envoy
    }

    /// The updater's `/status`.
    pub async fn status(&self) -> anyhow::Result<Value> {
        self.stack.updater.as_ref().context("no updater")?.status().await
    }

    /// Waits until the updater found every worker compatible (alignment checked).
    pub async fn wait_aligned(&self) -> anyhow::Result<()> {
        let n = self.stack.workers.len();
        eventually("every worker aligned", Duration::from_secs(30), || async {
            let s = self.status().await.ok()?;
            let ok = s["workers"].as_object()?.values().filter(|w| w["compatible"] == true);
            (ok.count() == n).then_some(())
        })
        .await
    }

    /// Waits until `envoy`'s singleton holds the updater's version `v` or a later one (its
    /// threads apply it on their next request).
    pub async fn wait_version(envoy: &Envoy, v: u64) -> anyhow::Result<()> {
        eventually("the replica at the updater's version", Duration::from_secs(20), || async {
            let m = envoy.prometheus().await.ok()?;
            let have = m.get("kvroute_sync_snapshot_version").copied()?;
            (have >= v as f64).then_some(())
        })
        .await
    }
}
