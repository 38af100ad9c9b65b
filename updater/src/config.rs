//! The updater's settings: one [`UpdaterConfig`] resolved from an optional TOML file
//! (`--config`, see `deploy/updater.example.toml`) and the command line ([`crate::cli`]); a flag
//! given on the command line wins over the file. Every key of the file is a flag's long name in
//! snake case (`--max-replay-ms` is `max_replay_ms`), except that `[[models]]` and
//! `[[workers]]` are tables (`--model` / `--model-block-size` and `--worker` in flag form),
//! and that `[discovery]` holds `--discover` as `source` and each `--discover-X` as `X`.
//! Unknown keys are refused; [`UpdaterConfig::validate`] checks what serde cannot.
//!
//! The shared token is never part of the config: it comes from `--token`, the environment
//! (`KVROUTE_UPDATER_TOKEN`), `--token-file` or the file's `token_file`, exactly one of them
//! ([`Token`]), and it is never printed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::discovery::{DiscoveryConfig, DiscoveryConfigError, WorkerEntry};
use crate::limits::{AdapterLimits, BlockLimits, Limits, ReplayLimits, WireLimits};
use crate::models::{ModelSource, ModelSpec};
use crate::peers::PeerLimits;
use crate::subscriber::Endpoints;

/// Shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// Default values, shared by the flags' `default_value_t` and [`UpdaterConfig::default`].
pub mod defaults {
    pub const LISTEN: &str = "127.0.0.1:9100";
    pub const MODEL: &str = "kvroute-demo";
    pub const MAX_ADAPTERS_PER_WORKER: usize = 256;
    pub const MAX_ADAPTER_NAME_BYTES: usize = 256;
    pub const ALIGN_INTERVAL_MS: u64 = 10_000;
    pub const SCRAPE_INTERVAL_MS: u64 = 500;
    pub const LOAD_PUBLISH_MS: u64 = crate::limits::LOAD_PUBLISH_MS;
    pub const ENVOY_CLUSTER: &str = "workers";
    pub const MAX_BLOCKS_PER_TIER: usize = 1 << 20;
    pub const MAX_ENGINE_KEYS: usize = 3 << 20;
    pub const MAX_REPLAY_BATCHES: usize = 20_000;
    pub const MAX_REPLAY_BYTES: usize = 256 << 20;
    pub const MAX_REPLAY_MS: u64 = 10_000;
    pub const REPLAY_RETRY_MS: u64 = 5_000;
    pub const MAX_FRAME_BYTES: usize = 64 << 20;
    pub const MAX_MESSAGE_FRAMES: usize = 16;
    /// One message's frames together: one maximal frame, never sixteen.
    pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
    pub const MAX_BATCH_ELEMENTS: usize = crate::decode::DEFAULT_MAX_ELEMENTS;
    pub const MAX_HTTP_BODY_BYTES: usize = 4 << 20;
    pub const PEER_TTL_MS: u64 = 10_000;
    pub const PEER_LOAD_TTL_MS: u64 = 3_000;
    pub const MAX_PEER_REPLICAS: usize = 256;
    pub const MAX_PEER_HASHES: usize = 1 << 20;
    pub const MAX_PEER_REPORT_BYTES: usize = 1 << 20;
}

/// What is wrong with a configuration.
#[derive(Debug, Error)]
pub enum UpdaterConfigError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Toml { path: String, source: Box<toml::de::Error> },
    #[error("no worker configured: give --worker (repeatable) or [[workers]] in the config file")]
    NoWorkers,
    #[error("worker '{0}': the HTTP address is not ip:port")]
    WorkerAddr(String),
    #[error("worker '{0}' is configured twice")]
    DuplicateWorker(String),
    #[error("worker '{0}': a replay endpoint needs an events endpoint")]
    ReplayWithoutEvents(String),
    #[error("worker '{0}': an empty events or replay endpoint")]
    EmptyEndpoint(String),
    #[error("worker spec '{0}' is not HTTP_ADDR[,EVENTS_ENDPOINT[,REPLAY_ENDPOINT]]")]
    WorkerSpec(String),
    #[error("no model configured")]
    NoModels,
    #[error("model '{0}' is configured twice")]
    DuplicateModel(String),
    #[error("a model has an empty name")]
    EmptyModelName,
    #[error("a block size is given for '{0}', which is not a configured model")]
    UnknownModel(String),
    #[error("{0}: the block size must be > 0")]
    ZeroBlockSize(String),
    #[error("envoy_admin '{0}' is not an http:// URL")]
    EnvoyAdmin(String),
    #[error("envoy_cluster must not be empty")]
    EnvoyCluster,
    #[error(
        "no token: give exactly one of --token, KVROUTE_UPDATER_TOKEN, --token-file or the \
         config file's token_file"
    )]
    NoToken,
    #[error("the token is given more than once ({0}); give exactly one source")]
    TokenTwice(String),
    #[error("the token from {0} is shorter than {MIN_TOKEN_LEN} characters")]
    ShortToken(String),
    #[error("discovery: {0}")]
    Discovery(#[from] DiscoveryConfigError),
    #[error("max_frame_bytes ({frame}) must not exceed max_message_bytes ({message})")]
    FrameOverMessage { frame: usize, message: usize },
    #[error("{0} must be > 0")]
    Zero(&'static str),
}

/// One model: `[[models]]` in the file, `--model NAME[=DIR]` on the command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The model id its workers serve (their `/v1/models` base model).
    pub name: String,
    /// A Hugging Face style directory (`tokenizer.json`, `tokenizer_config.json`); absent: the
    /// built-in demo bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// The KV block size this model's workers must announce (overrides `block_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
}

impl From<ModelSpec> for ModelEntry {
    fn from(s: ModelSpec) -> Self {
        let dir = match s.source {
            ModelSource::Demo => None,
            ModelSource::Dir(d) => Some(d),
        };
        ModelEntry { name: s.name, dir, block_size: None }
    }
}

impl std::str::FromStr for WorkerEntry {
    type Err = UpdaterConfigError;

    /// `HTTP_ADDR[,EVENTS_ENDPOINT[,REPLAY_ENDPOINT]]` (the `--worker` form).
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut parts = spec.split(',');
        let http = parts.next().unwrap_or_default().to_owned();
        let part = |p: Option<&str>| p.filter(|s| !s.is_empty()).map(str::to_owned);
        let (events, replay) = (part(parts.next()), part(parts.next()));
        if http.is_empty() || parts.next().is_some() {
            return Err(UpdaterConfigError::WorkerSpec(spec.into()));
        }
        Ok(WorkerEntry { http, events, replay, labels: Default::default() })
    }
}

/// Every setting of the updater except the token. Field names are the file's keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpdaterConfig {
    pub listen: SocketAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_admin: Option<String>,
    pub envoy_cluster: String,
    pub align_interval_ms: u64,
    pub scrape_interval_ms: u64,
    pub load_publish_ms: u64,
    pub max_adapters_per_worker: usize,
    pub max_adapter_name_bytes: usize,
    pub max_blocks_per_tier: usize,
    pub max_engine_keys: usize,
    pub max_replay_batches: usize,
    pub max_replay_bytes: usize,
    pub max_replay_ms: u64,
    pub replay_retry_ms: u64,
    pub max_frame_bytes: usize,
    pub max_message_frames: usize,
    pub max_message_bytes: usize,
    pub max_batch_elements: usize,
    pub max_http_body_bytes: usize,
    pub max_connections: usize,
    pub header_read_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub peer_ttl_ms: u64,
    pub peer_load_ttl_ms: u64,
    pub max_peer_replicas: usize,
    pub max_peer_hashes: usize,
    pub max_peer_report_bytes: usize,
    pub models: Vec<ModelEntry>,
    pub workers: Vec<WorkerEntry>,
    /// Where the workers come from when not from `workers` (`[discovery]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoveryConfig>,
}

impl Default for UpdaterConfig {
    fn default() -> Self {
        use defaults as d;
        UpdaterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9100)),
            token_file: None,
            block_size: None,
            envoy_admin: None,
            envoy_cluster: d::ENVOY_CLUSTER.into(),
            align_interval_ms: d::ALIGN_INTERVAL_MS,
            scrape_interval_ms: d::SCRAPE_INTERVAL_MS,
            load_publish_ms: d::LOAD_PUBLISH_MS,
            max_adapters_per_worker: d::MAX_ADAPTERS_PER_WORKER,
            max_adapter_name_bytes: d::MAX_ADAPTER_NAME_BYTES,
            max_blocks_per_tier: d::MAX_BLOCKS_PER_TIER,
            max_engine_keys: d::MAX_ENGINE_KEYS,
            max_replay_batches: d::MAX_REPLAY_BATCHES,
            max_replay_bytes: d::MAX_REPLAY_BYTES,
            max_replay_ms: d::MAX_REPLAY_MS,
            replay_retry_ms: d::REPLAY_RETRY_MS,
            max_frame_bytes: d::MAX_FRAME_BYTES,
            max_message_frames: d::MAX_MESSAGE_FRAMES,
            max_message_bytes: d::MAX_MESSAGE_BYTES,
            max_batch_elements: d::MAX_BATCH_ELEMENTS,
            max_http_body_bytes: d::MAX_HTTP_BODY_BYTES,
            max_connections: crate::conns::MAX_CONNECTIONS,
            header_read_timeout_ms: crate::conns::HEADER_READ_TIMEOUT_MS,
            idle_timeout_ms: crate::conns::IDLE_TIMEOUT_MS,
            peer_ttl_ms: d::PEER_TTL_MS,
            peer_load_ttl_ms: d::PEER_LOAD_TTL_MS,
            max_peer_replicas: d::MAX_PEER_REPLICAS,
            max_peer_hashes: d::MAX_PEER_HASHES,
            max_peer_report_bytes: d::MAX_PEER_REPORT_BYTES,
            models: vec![ModelEntry { name: d::MODEL.into(), dir: None, block_size: None }],
            workers: Vec::new(),
            discovery: None,
        }
    }
}

impl UpdaterConfig {
    /// Parses a TOML file; relative paths in it (`token_file`, models' `dir`) are taken
    /// relative to the file's directory.
    pub fn from_file(path: &Path) -> Result<UpdaterConfig, UpdaterConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| UpdaterConfigError::Read { path: shown.clone(), source })?;
        let mut cfg = Self::from_toml(&text)
            .map_err(|source| UpdaterConfigError::Toml { path: shown, source: Box::new(source) })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let rebase = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        cfg.token_file.iter_mut().for_each(rebase);
        if let Some(d) = cfg.discovery.as_mut() {
            d.kube_token_file.iter_mut().for_each(rebase);
            d.kube_ca_file.iter_mut().for_each(rebase);
        }
        cfg.models.iter_mut().filter_map(|m| m.dir.as_mut()).for_each(rebase);
        Ok(cfg)
    }

    /// Parses TOML text (paths are kept as written).
    pub fn from_toml(text: &str) -> Result<UpdaterConfig, toml::de::Error> {
        toml::from_str(text)
    }

    /// Checks everything serde does not: workers (addresses, endpoints, duplicates), models
    /// (names, duplicates, block sizes), the Envoy admin URL and cluster, the wire and
    /// connection bounds.
    pub fn validate(&self) -> Result<(), UpdaterConfigError> {
        self.validate_bounds()?;
        let discovery = self.discovery();
        discovery.validate(self.workers.len())?;
        if self.workers.is_empty() && !discovery.is_dynamic() {
            return Err(UpdaterConfigError::NoWorkers);
        }
        let mut seen = BTreeSet::new();
        for w in &self.workers {
            w.http
                .parse::<SocketAddr>()
                .map_err(|_| UpdaterConfigError::WorkerAddr(w.http.clone()))?;
            if !seen.insert(w.http.as_str()) {
                return Err(UpdaterConfigError::DuplicateWorker(w.http.clone()));
            }
            if w.events.is_none() && w.replay.is_some() {
                return Err(UpdaterConfigError::ReplayWithoutEvents(w.http.clone()));
            }
            if [&w.events, &w.replay].into_iter().flatten().any(|e| e.trim().is_empty()) {
                return Err(UpdaterConfigError::EmptyEndpoint(w.http.clone()));
            }
        }
        if self.models.is_empty() {
            return Err(UpdaterConfigError::NoModels);
        }
        let mut names = BTreeSet::new();
        for m in &self.models {
            if m.name.is_empty() {
                return Err(UpdaterConfigError::EmptyModelName);
            }
            if !names.insert(m.name.as_str()) {
                return Err(UpdaterConfigError::DuplicateModel(m.name.clone()));
            }
            if m.block_size == Some(0) {
                return Err(UpdaterConfigError::ZeroBlockSize(format!("model '{}'", m.name)));
            }
        }
        if self.block_size == Some(0) {
            return Err(UpdaterConfigError::ZeroBlockSize("block_size".into()));
        }
        if let Some(a) = &self.envoy_admin {
            let host = a.strip_prefix("http://").unwrap_or_default();
            if host.is_empty() || host.contains(char::is_whitespace) {
                return Err(UpdaterConfigError::EnvoyAdmin(a.clone()));
            }
        }
        if self.envoy_cluster.is_empty() {
            return Err(UpdaterConfigError::EnvoyCluster);
        }
        Ok(())
    }

    /// The bounds that have no floor to raise them to: zero is refused, and a frame may not be
    /// larger than the message that holds it.
    fn validate_bounds(&self) -> Result<(), UpdaterConfigError> {
        let zero = [
            ("max_message_bytes", self.max_message_bytes as u64),
            ("max_batch_elements", self.max_batch_elements as u64),
            ("max_connections", self.max_connections as u64),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Err(UpdaterConfigError::Zero(name));
        }
        if self.max_frame_bytes > self.max_message_bytes {
            return Err(UpdaterConfigError::FrameOverMessage {
                frame: self.max_frame_bytes,
                message: self.max_message_bytes,
            });
        }
        Ok(())
    }

    /// The HTTP server's connection bounds, before the open-files limit clamps them.
    pub fn conn_limits(&self) -> crate::conns::ConnLimits {
        crate::conns::ConnLimits {
            max_connections: self.max_connections,
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms.max(100)),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms.max(100)),
        }
    }

    /// The discovery settings (the static list when none are given).
    pub fn discovery(&self) -> DiscoveryConfig {
        self.discovery.clone().unwrap_or_default()
    }

    /// The models as [`crate::models::Models::load`] takes them.
    pub fn model_specs(&self) -> Vec<ModelSpec> {
        let source = |m: &ModelEntry| m.dir.clone().map_or(ModelSource::Demo, ModelSource::Dir);
        self.models.iter().map(|m| ModelSpec { name: m.name.clone(), source: source(m) }).collect()
    }

    /// Each model's block size: its own, else `block_size`.
    pub fn block_sizes(&self) -> Vec<(String, u32)> {
        let size = |m: &ModelEntry| m.block_size.or(self.block_size);
        self.models.iter().filter_map(|m| Some((m.name.clone(), size(m)?))).collect()
    }

    /// Every worker's HTTP address and, when it publishes KV events, where to follow them.
    pub fn endpoints(&self) -> Vec<(String, Option<Endpoints>)> {
        let follow = |w: &WorkerEntry| {
            let events = w.events.clone()?;
            Some(Endpoints { worker: w.http.clone(), events, replay: w.replay.clone() })
        };
        self.workers.iter().map(|w| (w.http.clone(), follow(w))).collect()
    }

    /// How often each worker's alignment is checked (at least 100 ms).
    pub fn align_interval(&self) -> Duration {
        Duration::from_millis(self.align_interval_ms.max(100))
    }

    /// How often each worker's `/metrics` is scraped (at least 50 ms).
    pub fn scrape_interval(&self) -> Duration {
        Duration::from_millis(self.scrape_interval_ms.max(50))
    }

    /// Every bound, each raised to its floor where set below it.
    pub fn limits(&self) -> Limits {
        Limits {
            blocks: BlockLimits {
                max_blocks_per_tier: self.max_blocks_per_tier.max(1),
                max_engine_keys: self.max_engine_keys.max(1),
            },
            replay: ReplayLimits {
                max_batches: self.max_replay_batches.max(1),
                max_bytes: self.max_replay_bytes.max(1),
                max_time: Duration::from_millis(self.max_replay_ms.max(100)),
                retry_after: Duration::from_millis(self.replay_retry_ms),
            },
            wire: WireLimits {
                max_frame_bytes: self.max_frame_bytes.max(1024),
                max_message_frames: self.max_message_frames.max(4),
                max_message_bytes: self.max_message_bytes.max(1024),
                max_batch_elements: self.max_batch_elements.max(1),
            },
            max_http_body_bytes: self.max_http_body_bytes.max(64 << 10),
            adapters: AdapterLimits {
                max_adapters: self.max_adapters_per_worker,
                max_name_bytes: self.max_adapter_name_bytes.max(1),
            },
            peers: PeerLimits {
                ttl_ms: self.peer_ttl_ms.max(1),
                load_ttl_ms: self.peer_load_ttl_ms.max(1),
                max_replicas: self.max_peer_replicas,
                max_hashes: self.max_peer_hashes,
                max_report_bytes: self.max_peer_report_bytes.max(1024),
            },
            load_publish_ms: self.load_publish_ms.min(self.scrape_interval_ms),
        }
    }

    /// The resolved configuration as TOML (what `--check` prints; holds no token).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# not printable as TOML: {e}\n"))
    }
}

/// The shared token. Its `Debug` shows only where it came from and its length.
#[derive(Clone)]
pub struct Token {
    value: String,
    /// Where it came from (`--token`, `KVROUTE_UPDATER_TOKEN`, `--token-file PATH`, ...).
    pub source: String,
}

impl Token {
    /// A token from `source`; refused when shorter than [`MIN_TOKEN_LEN`].
    pub fn new(value: String, source: String) -> Result<Token, UpdaterConfigError> {
        if value.chars().count() < MIN_TOKEN_LEN {
            return Err(UpdaterConfigError::ShortToken(source));
        }
        Ok(Token { value, source })
    }

    /// Reads a token file; trailing line ends (`\n`, `\r\n`) are not part of the token.
    pub fn from_file(path: &Path, source: String) -> Result<Token, UpdaterConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| UpdaterConfigError::Read {
            path: path.display().to_string(),
            source: e,
        })?;
        Token::new(text.trim_end_matches(['\n', '\r']).to_owned(), source)
    }

    pub fn expose(&self) -> &str {
        &self.value
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(<{} characters from {}>)", self.value.chars().count(), self.source)
    }
}

#[cfg(test)]
mod tests;
