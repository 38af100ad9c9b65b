//! The cluster a comparison runs on, from a TOML file or a preset: simulated workers (each with
//! a timing profile) or existing OpenAI-compatible endpoints, M Envoy instances, the updater,
//! and an optional knowledge delay between the updater and Envoy.

use serde::{Deserialize, Serialize};

/// The whole topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Topology {
    pub workers: Workers,
    pub envoy: EnvoySpec,
    pub knowledge: KnowledgeTiming,
    pub filter: FilterPrior,
    /// Sites, links, client RTTs, KV pulls and P/D roles (absent: one flat, local pool).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net: Option<crate::net::NetSpec>,
}

/// What the filter is told about the workers' speed. Never the simulator's profile: the filter
/// starts from its own defaults (public figures for an 8B-class model on one H100), optionally
/// scaled to make the prior deliberately wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterPrior {
    /// Multiplies the default profile's prefill coefficients (base, per token, per token²),
    /// decode interference and decode step growth (per sequence, per 1 000 context tokens): 1
    /// is the default, 3 a prior three times too slow.
    pub prior_scale: f64,
    /// Multiplies the decode step growth's two coefficients once more (a prior wrong about
    /// the decode step alone): 1 leaves them at `prior_scale`.
    pub decode_prior_scale: f64,
}

impl Default for FilterPrior {
    fn default() -> Self {
        FilterPrior { prior_scale: 1.0, decode_prior_scale: 1.0 }
    }
}

impl FilterPrior {
    /// The cost profile the filter's configuration carries.
    pub fn profile(&self) -> kvroute_core::decision::cost::Profile {
        let d = kvroute_core::decision::cost::Profile::default();
        let k = self.prior_scale;
        kvroute_core::decision::cost::Profile {
            prefill_base_ms: d.prefill_base_ms * k,
            prefill_ms_per_token: d.prefill_ms_per_token * k,
            prefill_ms_per_token_sq: d.prefill_ms_per_token_sq * k,
            decode_interference_ms: d.decode_interference_ms * k,
            decode_ms_per_seq: d.decode_ms_per_seq * k * self.decode_prior_scale,
            decode_ms_per_1k_context: d.decode_ms_per_1k_context * k * self.decode_prior_scale,
            ..d
        }
    }

    /// The filter's coefficients, for the report's scope header.
    pub fn describe(&self) -> String {
        let p = self.profile();
        format!(
            "filter prior{}: prefill {} ms + {} ms/token + {:e} ms/token², decode interference {} ms, decode step growth {} ms/sequence + {} ms/1k context tokens",
            match (self.prior_scale, self.decode_prior_scale) {
                (1.0, 1.0) => " (its defaults)".to_string(),
                (k, 1.0) => format!(" (its defaults x{k})"),
                (k, d) => format!(" (its defaults x{k}, the decode step x{d} more)"),
            },
            p.prefill_base_ms,
            p.prefill_ms_per_token,
            p.prefill_ms_per_token_sq,
            p.decode_interference_ms,
            p.decode_ms_per_seq,
            p.decode_ms_per_1k_context
        )
    }
}

/// Where the workers come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Workers {
    /// Simulated workers to start (ignored when `external` is set).
    pub count: usize,
    /// Sim timing profile: a built-in name or a .toml path.
    pub profile: String,
    /// Prefill cost override (ms per token) for the labelled "stress" point only: default
    /// presets run the sourced profile as it is.
    pub prefill_ms_per_token: Option<f64>,
    /// Sim time compression (every duration divided by this).
    pub speedup: f64,
    /// Extra flags for every simulated worker.
    pub sim_args: Vec<String>,
    /// Existing endpoints instead of sims (a real vLLM pool).
    pub external: Vec<External>,
    /// Path POSTed to every external worker before each run so every policy starts with an
    /// empty prefix cache (vLLM's `/reset_prefix_cache`, served with `VLLM_SERVER_DEV_MODE=1`);
    /// empty: no reset (each run then inherits the previous one's cache, and the report says so).
    pub reset_path: String,
    /// The served model: `demo` (built-in bundle) or `qwen3` (`./dev setup` fetches it).
    pub model: crate::model::BenchModel,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            count: 4,
            profile: "llama3-8b-h100".into(),
            prefill_ms_per_token: None,
            speedup: 1.0,
            sim_args: Vec::new(),
            external: Vec::new(),
            reset_path: "/reset_prefix_cache".into(),
            model: Default::default(),
        }
    }
}

/// An existing OpenAI-compatible worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct External {
    /// HTTP `ip:port`.
    pub addr: String,
    /// KV-event PUB endpoint, e.g. `tcp://10.0.0.5:5557` (kvroute with events needs it).
    pub events: Option<String>,
    /// Replay ROUTER endpoint.
    pub replay: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvoySpec {
    /// Envoy replicas, each with the filter; clients spread requests over them.
    pub instances: usize,
    /// Worker threads per Envoy.
    pub concurrency: u32,
}

impl Default for EnvoySpec {
    fn default() -> Self {
        EnvoySpec { instances: 1, concurrency: 2 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnowledgeTiming {
    /// Extra delay on every updater → Envoy snapshot response (ms).
    pub delay_ms: u64,
    /// The filter's allowed age of event knowledge (ms).
    pub max_event_age_ms: u64,
}

impl Default for KnowledgeTiming {
    fn default() -> Self {
        KnowledgeTiming { delay_ms: 0, max_event_age_ms: 5000 }
    }
}

impl Topology {
    pub fn from_toml(text: &str) -> anyhow::Result<Topology> {
        let t: Topology = toml::from_str(text)?;
        t.validate()?;
        Ok(t)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let n = self.worker_count();
        anyhow::ensure!((1..=64).contains(&n), "workers: between 1 and 64, got {n}");
        anyhow::ensure!(
            (1..=8).contains(&self.envoy.instances),
            "envoy.instances: between 1 and 8, got {}",
            self.envoy.instances
        );
        anyhow::ensure!(
            (1..=16).contains(&self.envoy.concurrency),
            "envoy.concurrency: between 1 and 16"
        );
        anyhow::ensure!(
            self.workers.speedup.is_finite() && self.workers.speedup > 0.0,
            "workers.speedup must be > 0"
        );
        if let Some(p) = self.workers.prefill_ms_per_token {
            anyhow::ensure!(p.is_finite() && p > 0.0, "workers.prefill_ms_per_token must be > 0");
        }
        anyhow::ensure!(
            self.filter.prior_scale.is_finite()
                && (0.01..=100.0).contains(&self.filter.prior_scale),
            "filter.prior_scale: between 0.01 and 100"
        );
        anyhow::ensure!(
            self.filter.decode_prior_scale.is_finite()
                && (0.01..=100.0).contains(&self.filter.decode_prior_scale),
            "filter.decode_prior_scale: between 0.01 and 100"
        );
        anyhow::ensure!(
            self.workers.reset_path.is_empty() || self.workers.reset_path.starts_with('/'),
            "workers.reset_path: empty or a path starting with /"
        );
        for e in &self.workers.external {
            e.addr
                .parse::<std::net::SocketAddr>()
                .map_err(|_| anyhow::anyhow!("workers.external: bad address {}", e.addr))?;
        }
        anyhow::ensure!(self.knowledge.delay_ms <= 60_000, "knowledge.delay_ms: at most 60000");
        if let Some(net) = &self.net {
            anyhow::ensure!(
                self.workers.external.is_empty(),
                "net: the network is simulated (simulated workers only)"
            );
            // Link and client delays are wall-clock on the sockets: no time compression.
            anyhow::ensure!(self.workers.speedup == 1.0, "net: needs workers.speedup = 1");
            net.validate(n)?;
        }
        Ok(())
    }

    /// The simulated workers' timing coefficients, for the report's scope header.
    pub fn sim_profile(&self) -> String {
        if !self.workers.external.is_empty() {
            return "external workers (their own speed)".into();
        }
        match kvroute_sim::profile::HardwareProfile::load(&self.workers.profile) {
            Ok(p) => format!(
                "simulator {}: step floor {} ms, prefill {} ms/token{} + {:e} ms/token², decode {} ms/sequence{}",
                p.name,
                p.step_floor_ms,
                self.workers.prefill_ms_per_token.unwrap_or(p.prefill_ms_per_token),
                if self.workers.prefill_ms_per_token.is_some() { " (STRESS override)" } else { "" },
                p.prefill_ms_per_token_sq,
                p.decode_ms_per_seq,
                if self.workers.speedup != 1.0 {
                    format!(", run {}x faster than real time (figures in engine time)", self.workers.speedup)
                } else {
                    String::new()
                }
            ),
            Err(e) => format!("simulator profile {}: {e}", self.workers.profile),
        }
    }

    pub fn worker_count(&self) -> usize {
        if self.workers.external.is_empty() {
            self.workers.count
        } else {
            self.workers.external.len()
        }
    }

    /// One line for the report's scope header.
    pub fn describe(&self) -> String {
        let workers = if self.workers.external.is_empty() {
            format!(
                "{} simulated workers (model {}, profile {}{}{})",
                self.workers.count,
                self.workers.model.name(),
                self.workers.profile,
                self.workers
                    .prefill_ms_per_token
                    .map(|p| format!(", prefill {p} ms/token"))
                    .unwrap_or_default(),
                if self.workers.speedup != 1.0 {
                    format!(", time compressed x{}", self.workers.speedup)
                } else {
                    String::new()
                }
            )
        } else {
            format!(
                "{} external workers (model {}, {})",
                self.workers.external.len(),
                self.workers.model.name(),
                if self.workers.reset_path.is_empty() {
                    "prefix caches NOT reset between runs".to_string()
                } else {
                    format!(
                        "prefix caches reset before each run by POST {}",
                        self.workers.reset_path
                    )
                }
            )
        };
        format!(
            "{workers}; {} Envoy instance(s) x {} threads; kvroute-updater{}{}",
            self.envoy.instances,
            self.envoy.concurrency,
            if self.knowledge.delay_ms > 0 {
                format!(" behind a {} ms knowledge delay", self.knowledge.delay_ms)
            } else {
                String::new()
            },
            self.net.as_ref().map(|n| format!("; {}", n.describe())).unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_with_defaults_and_validation() {
        let t = Topology::from_toml("[workers]\ncount = 3\n[envoy]\ninstances = 2\n").unwrap();
        assert_eq!((t.worker_count(), t.envoy.instances, t.envoy.concurrency), (3, 2, 2));
        assert!(t.describe().contains("3 simulated workers (model kvroute-demo"));
        let q = Topology::from_toml("[workers]\nmodel = \"qwen3\"\n").unwrap();
        assert_eq!(q.workers.model, crate::model::BenchModel::Qwen3);
        assert!(Topology::from_toml("[workers]\nmodel = \"gpt\"\n").is_err());
        let ext = Topology::from_toml(
            "[[workers.external]]\naddr = \"127.0.0.1:8000\"\nevents = \"tcp://127.0.0.1:5557\"\n",
        )
        .unwrap();
        assert_eq!(ext.worker_count(), 1);
        assert!(Topology::from_toml("[workers]\ncount = 0\n").is_err());
        assert!(Topology::from_toml("[envoy]\ninstances = 9\n").is_err());
        assert!(Topology::from_toml("[workers]\nbogus = 1\n").is_err());
        assert!(Topology::from_toml("[[workers.external]]\naddr = \"nope\"\n").is_err());
    }
}
