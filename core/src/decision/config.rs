//! The filter's plugin configuration (JSON), with defaults and an explicit `validate()`.

use std::collections::HashSet;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::decision::cost::{Profile, TieBand};
use crate::decision::index::IndexLimits;

#[cfg(feature = "schema")]
pub mod schema;
pub mod sync;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("plugin configuration is not valid JSON for kvroute: {0}")]
    Parse(String),
    #[error("invalid plugin configuration: {0}")]
    Invalid(String),
}

/// Top-level plugin configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// One pool per served model.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub models: Vec<ModelConfig>,
    /// Header the cluster's `override_host` policy reads: `primary,fallback`.
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^[a-z0-9-]+$")))]
    pub destination_header: String,
    /// Knowledge index bounds and ages (routing history).
    pub index: IndexConfig,
    /// Estimates within `max(abs_ms, rel · best)` of the best are a tie, broken at random.
    pub tie_band: TieBand,
    /// The price of running streams' delay: how many milliseconds of a new request's TTFT one
    /// millisecond of delay to one stream already running on a worker is worth. A prefill
    /// placed on a worker runs in the steps its decoding streams share, so each of them waits
    /// about that prefill's time; once the new request decodes, each step carries one more
    /// sequence and its context, so every stream in flight there runs slower
    /// (`stream_growth_tokens`). The ranking minimises `ttft + stream_stall_weight · stall`
    /// (in the decision header: `predicted_ttft_ms`, `stall_ms`, and the decode's part,
    /// `growth_ms`). 1: a millisecond is a millisecond, whoever waits; 0: TTFT alone (streams
    /// are not priced).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0, max = 100.0)))]
    pub stream_stall_weight: f64,
    /// The most output tokens over which a new request's growth of a worker's decode steps is
    /// priced (the profile's `decode_ms_per_seq` and `decode_ms_per_1k_context` per step, for
    /// each request in flight there): the request's `max_tokens` (or `max_completion_tokens`)
    /// where it is lower. The streams beside it may end sooner and how long it will really run
    /// is not known, so this caps a guess. 0: only the prefill's stall is priced.
    #[cfg_attr(feature = "schema", schemars(range(max = 65536)))]
    pub stream_growth_tokens: u64,
    /// Prompts longer than this (tokens) are routed load-only without hashing.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_prompt_tokens: usize,
    /// Bodies larger than this (bytes) are routed load-only without tokenizing, so one huge
    /// prompt cannot hold an Envoy worker thread (cold tokenizing runs at ~7 M tokens/s on the
    /// fast BPE path, ~0.5 M/s through the `tokenizers` crate).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_prompt_bytes: usize,
    /// Request bodies larger than this get 413 from the filter, whatever the protocol (the
    /// listener's buffer limit answers 413 for HTTP/1.1, but HTTP/2 streams are bounded by
    /// their flow-control window instead). Match `per_connection_buffer_limit_bytes`.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_body_bytes: usize,
    /// Adds `x-kvroute-decision` (worker, predicted cached tokens, reason) to responses.
    pub expose_decision_header: bool,
    /// How far knowledge from KV events (via the updater) is trusted.
    pub knowledge: KnowledgeConfig,
    /// Bounds on the knowledge journal shared by Envoy's threads.
    pub journal: sync::JournalLimits,
    /// Leases and bounds of the router-tracked load.
    pub load: sync::LoadLimits,
    /// Each thread's housekeeping period: knowledge refresh off the request path, load
    /// heartbeats, lease expiry, reconciliation with worker-reported load.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 10_000)))]
    pub tick_ms: u64,
    /// Deliberate faults for testing a deployment's failure policy. Off by default.
    pub fault_injection: FaultInjection,
    /// TTFT deadlines, shedding (429) and priority classes (`core/src/decision/admission.rs`).
    pub admission: crate::decision::admission::AdmissionConfig,
    /// Look-ahead on hot prefixes: when to place a shared prefix on one more worker on purpose.
    pub lookahead: crate::decision::lookahead::LookaheadConfig,
    /// Online calibration of the cost profiles (`core/src/decision/calib.rs`).
    pub calibration: crate::decision::calib::CalibrationConfig,
    /// How long a paused request may wait for its body, and when a deployment counts as broken
    /// (`core/src/decision/misdeploy.rs`).
    pub misdeployment: crate::decision::misdeploy::MisdeployConfig,
    /// Passive health: workers that fail requests are left out for a backoff; the per-try
    /// first-byte timeout (`core/src/shared/health.rs`).
    pub health: sync::HealthConfig,
    /// Where workers are and what moving KV between them costs
    /// (`core/src/decision/topology.rs`); absent (or empty): every worker local, no pulls.
    pub topology: crate::decision::topology::TopologyConfig,
}

/// The default of [`FilterConfig::stream_stall_weight`].
pub const DEFAULT_STREAM_STALL_WEIGHT: f64 = 1.0;
/// The default of [`FilterConfig::stream_growth_tokens`].
pub const DEFAULT_STREAM_GROWTH_TOKENS: u64 = 128;

/// Deliberate faults, for proving that traffic survives them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct FaultInjection {
    /// A request to exactly this path (which must start with `/kvroute/`) aborts the VM of the
    /// thread that handles it, as a bug would: the plugin's failure policy then decides what
    /// happens to traffic. Never set it where clients can reach the listener.
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^/kvroute/[\s\S]")))]
    pub trap_path: Option<String>,
}

/// Trust in event knowledge delivered by the updater's snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct KnowledgeConfig {
    /// Event knowledge the updater has not confirmed for this long is ignored (the decision
    /// uses routing history and feedback only, counted as fallback `stale_events`).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_event_age_ms: u64,
    /// Routing-history and feedback observations older than a worker's last event by more
    /// than this are superseded by the event view.
    pub event_grace_ms: u64,
    /// Worker-reported load older than this is not used.
    pub max_load_age_ms: u64,
    /// Time a request may spend applying what the updater and the other threads published
    /// since the thread's last catch-up (deltas, then the journal), checked after each one; the
    /// rest waits for the next request or the thread's tick. Bounds the tail a burst of
    /// knowledge adds to one request. 0: no time limit (the count limits still hold).
    pub catch_up_budget_us: u64,
    /// Bounds the snapshot and delta decoders enforce before allocating.
    pub decode_limits: crate::wire::DecodeLimits,
    /// `false` is an ablation, not a deployment setting: the decision then credits no worker
    /// with any cached block (events, routing history and feedback are all ignored) and ranks
    /// on the cost model and load alone. The evaluation's `kvroute-load-only` policy uses it to
    /// measure what cache knowledge adds over the same cost model.
    pub cache_aware: bool,
}

impl Default for KnowledgeConfig {
    fn default() -> Self {
        KnowledgeConfig {
            max_event_age_ms: 5_000,
            event_grace_ms: 2_000,
            max_load_age_ms: 2_000,
            catch_up_budget_us: 500,
            decode_limits: Default::default(),
            cache_aware: true,
        }
    }
}

impl KnowledgeConfig {
    pub fn trust(&self) -> crate::decision::index::EventTrust {
        crate::decision::index::EventTrust {
            max_age_ms: self.max_event_age_ms,
            grace_ms: self.event_grace_ms,
        }
    }
}

/// Configuration of the singleton that pulls snapshots from the updater (bootstrap service).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SnapshotSyncConfig {
    /// Envoy cluster of the updater.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub cluster: String,
    /// `:authority` sent to it.
    #[serde(default = "default_authority")]
    pub authority: String,
    /// Shared token (`x-kvroute-token`), inline in the plugin configuration (visible in
    /// Envoy's `/config_dump`). Prefer `token_env`.
    #[serde(default)]
    pub token: String,
    /// Name of an environment variable of the Envoy process that holds the token, exposed to
    /// the VM by `vm_config.environment_variables.host_env_keys`: the token then never appears
    /// in the bootstrap or in `/config_dump`.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Period (ms) of the singleton's tick: plain polling without the long poll, and the
    /// retry after a failed snapshot call.
    #[serde(default = "default_interval")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub interval_ms: u64,
    /// Timeout (ms) of one snapshot call (the long poll's wait is added to it).
    #[serde(default = "default_timeout")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub timeout_ms: u64,
    /// Model bundles (tokenizer + chat template) fetched from the updater into shared data,
    /// for models configured with `"bundle"`.
    #[serde(default)]
    pub bundles: sync::BundleLimits,
    /// Long poll: each snapshot request waits up to this long at the updater for a version
    /// newer than the singleton's (`wait_ms`), and the next is sent as soon as one answers, so
    /// knowledge arrives as it is published; the `interval_ms` tick remains the fallback after
    /// a failed call. 0: plain polling every `interval_ms`. Keep it well below
    /// `knowledge.max_event_age_ms` of the filter: an answer is what confirms the knowledge.
    #[serde(default = "default_long_poll")]
    #[cfg_attr(feature = "schema", schemars(range(max = 30_000)))]
    pub long_poll_ms: u64,
    /// Long poll: its pace (ms) while the updater answers faster. Up to 8 requests go out
    /// back to back (a few changes in quick succession each arrive at once), then at most one
    /// per `min_poll_gap_ms` on average: the next request waits and its answer carries every
    /// change since. Knowledge arrives up to this much later, only while it changes that fast.
    /// It bounds the deltas each filter thread applies (`1000 / min_poll_gap_ms` a second):
    /// for a pool whose knowledge changes faster than the shared ring holds between two ticks
    /// of an idle thread. 0 (the default): the next request goes out as soon as one answers.
    #[serde(default = "default_min_poll_gap")]
    #[cfg_attr(feature = "schema", schemars(range(max = 1_000)))]
    pub min_poll_gap_ms: u64,
    /// Cross-replica knowledge: report this replica's decisions, receive other replicas'.
    #[serde(default)]
    pub peers: sync::PeerSyncConfig,
}

fn default_authority() -> String {
    "kvroute-updater".into()
}
fn default_interval() -> u64 {
    100
}
fn default_timeout() -> u64 {
    1000
}
fn default_long_poll() -> u64 {
    1000
}
fn default_min_poll_gap() -> u64 {
    0
}

impl SnapshotSyncConfig {
    /// Parses `{"snapshot_sync": {...}}`; `Ok(None)` when the JSON is not a sync config.
    /// `env` looks up the variable named by `token_env`.
    pub fn from_json(
        bytes: &[u8],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ConfigError> {
        let v: Value =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let Some(inner) = v.get("snapshot_sync") else { return Ok(None) };
        let mut cfg: SnapshotSyncConfig =
            serde_json::from_value(inner.clone()).map_err(|e| ConfigError::Parse(e.to_string()))?;
        if let Some(name) = &cfg.token_env {
            if !cfg.token.is_empty() {
                return Err(ConfigError::Invalid("give 'token' or 'token_env', not both".into()));
            }
            cfg.token = env(name).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "snapshot_sync.token_env: {name} is not set in the VM's environment \
                     (set it for Envoy and list it in vm_config.environment_variables.host_env_keys)"
                ))
            })?;
        }
        if cfg.cluster.is_empty() || cfg.token.len() < 16 {
            return Err(ConfigError::Invalid(
                "snapshot_sync needs a cluster and a token of 16+ characters".into(),
            ));
        }
        if cfg.interval_ms == 0 || cfg.timeout_ms == 0 {
            return Err(ConfigError::Invalid("snapshot_sync intervals must be > 0".into()));
        }
        cfg.bundles.validate().map_err(|e| ConfigError::Invalid(format!("snapshot_sync.{e}")))?;
        cfg.peers.validate().map_err(|e| ConfigError::Invalid(format!("snapshot_sync.{e}")))?;
        if cfg.long_poll_ms > 30_000 {
            return Err(ConfigError::Invalid("snapshot_sync.long_poll_ms must be <= 30000".into()));
        }
        if cfg.min_poll_gap_ms > 1_000 {
            return Err(ConfigError::Invalid(
                "snapshot_sync.min_poll_gap_ms must be <= 1000".into(),
            ));
        }
        Ok(Some(cfg))
    }
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            models: Vec::new(),
            destination_header: "x-gateway-destination-endpoint".into(),
            index: IndexConfig::default(),
            tie_band: TieBand::default(),
            stream_stall_weight: DEFAULT_STREAM_STALL_WEIGHT,
            stream_growth_tokens: DEFAULT_STREAM_GROWTH_TOKENS,
            max_prompt_tokens: 262_144,
            max_prompt_bytes: 512 * 1024,
            max_body_bytes: 8 << 20,
            expose_decision_header: false,
            knowledge: KnowledgeConfig::default(),
            journal: Default::default(),
            load: Default::default(),
            tick_ms: 250,
            fault_injection: FaultInjection::default(),
            admission: Default::default(),
            lookahead: Default::default(),
            calibration: Default::default(),
            misdeployment: Default::default(),
            health: Default::default(),
            topology: Default::default(),
        }
    }
}

/// A model's pool and how to tokenize and cost its requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The `model` value clients send.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub name: String,
    /// Worker endpoints, `ip:port`, exactly as they appear in the Envoy cluster.
    #[cfg_attr(
        feature = "schema",
        schemars(
            length(min = 1),
            extend("uniqueItems" = true),
            inner(regex(pattern = r"^([0-9]{1,3}(\.[0-9]{1,3}){3}|\[[0-9a-fA-F:.]+(%[0-9]+)?\]):[0-9]+$"))
        )
    )]
    pub workers: Vec<String>,
    /// The engine's KV block size in tokens.
    #[serde(default = "default_block_size")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 4096)))]
    pub block_size: u32,
    /// LoRA adapter name, part of the cache domain.
    #[serde(default)]
    pub lora_name: Option<String>,
    /// LoRA adapters of this base model that clients may name as `model`: routed within this
    /// pool, hashed in the adapter's cache domain. Workers also report the adapters they load.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(inner(length(min = 1)), extend("uniqueItems" = true)))]
    pub adapters: Vec<String>,
    /// `tokenizer.json` content (object), inline. Absent (and no `bundle`): the built-in demo
    /// bundle.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<serde_json::Map<String, Value>>"))]
    pub tokenizer: Option<Value>,
    /// `tokenizer_config.json` content (object with `chat_template`, `bos_token`, ...).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<serde_json::Map<String, Value>>"))]
    pub tokenizer_config: Option<Value>,
    /// The bundle distributed by the updater through shared data: `"updater"` (whatever
    /// fingerprint the updater names for this model) or a pinned 16-hex-digit fingerprint.
    /// Exclusive with the inline `tokenizer` / `tokenizer_config`.
    #[serde(default)]
    pub bundle: Option<BundleRef>,
    /// The cost model's timing profile of this model's workers (the prior of online
    /// calibration).
    #[serde(default)]
    pub profile: Profile,
    /// Default TTFT deadline (ms) of this model's requests without a deadline header or class
    /// default; 0: none (see `admission`).
    #[serde(default)]
    pub ttft_deadline_ms: u64,
    /// A disaggregated pool's prefill workers (`ip:port`): then `workers` are its decode
    /// workers, the destination header names a decode worker, and the request carries the
    /// chosen prefill worker in `pd_header`. Empty: an aggregated pool.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(
            extend("uniqueItems" = true),
            inner(regex(pattern = r"^([0-9]{1,3}(\.[0-9]{1,3}){3}|\[[0-9a-fA-F:.]+(%[0-9]+)?\]):[0-9]+$"))
        )
    )]
    pub prefill_workers: Vec<String>,
    /// The request header naming the prefill worker (`host:port`) for the decode side's P/D
    /// proxy (llm-d's routing sidecar reads `x-prefiller-host-port`).
    #[serde(default = "default_pd_header")]
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^[a-z0-9-]+$")))]
    pub pd_header: String,
}

/// The default of [`ModelConfig::pd_header`] (llm-d's P/D routing sidecar).
pub const DEFAULT_PD_HEADER: &str = "x-prefiller-host-port";

fn default_pd_header() -> String {
    DEFAULT_PD_HEADER.into()
}

fn default_block_size() -> u32 {
    16
}

/// A model's bundle from the updater, as written in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum BundleRef {
    /// `"updater"`: the fingerprint the updater names for this model, as it changes.
    Updater,
    /// `"<16 hex digits>"`: only the bundle with this fingerprint.
    Pinned(u64),
}

impl TryFrom<String> for BundleRef {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s == "updater" {
            return Ok(BundleRef::Updater);
        }
        if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            if let Ok(fp) = u64::from_str_radix(&s, 16) {
                return Ok(BundleRef::Pinned(fp));
            }
        }
        Err(format!("bundle '{s}' is neither \"updater\" nor a 16-hex-digit fingerprint"))
    }
}

impl From<BundleRef> for String {
    fn from(b: BundleRef) -> String {
        match b {
            BundleRef::Updater => "updater".into(),
            BundleRef::Pinned(fp) => format!("{fp:016x}"),
        }
    }
}

/// Where a model's tokenizer and chat template come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundleSource<'a> {
    /// `tokenizer` and `tokenizer_config` inline in the configuration.
    Inline { tokenizer: &'a Value, tokenizer_config: &'a Value },
    /// The built-in demo bundle (neither inline files nor `bundle`).
    Demo,
    /// Distributed by the updater through shared data.
    Shared(BundleRef),
}

impl ModelConfig {
    /// Where this model's bundle comes from (after `validate`, exactly one source applies).
    pub fn bundle_source(&self) -> BundleSource<'_> {
        match (&self.bundle, &self.tokenizer, &self.tokenizer_config) {
            (Some(b), _, _) => BundleSource::Shared(*b),
            (None, Some(tokenizer), Some(tokenizer_config)) => {
                BundleSource::Inline { tokenizer, tokenizer_config }
            }
            _ => BundleSource::Demo,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct IndexConfig {
    /// Per-worker bound of the knowledge index (least recently used blocks go first).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_blocks_per_worker: usize,
    /// How long a routing credit (a block predicted cached where a request was sent) counts.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub predicted_ttl_ms: u64,
    /// How long a block confirmed by a response's cached-token count counts.
    pub feedback_ttl_ms: u64,
    /// Other Envoy replicas' routing credits (relayed by the updater) count this long: long
    /// enough for the worker's own KV events to arrive.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub peer_ttl_ms: u64,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            max_blocks_per_worker: 65_536,
            predicted_ttl_ms: 120_000,
            feedback_ttl_ms: 600_000,
            peer_ttl_ms: 10_000,
        }
    }
}

impl IndexConfig {
    pub fn limits(&self) -> IndexLimits {
        IndexLimits {
            max_blocks_per_worker: self.max_blocks_per_worker,
            routed_ttl_ms: self.predicted_ttl_ms,
            feedback_ttl_ms: self.feedback_ttl_ms,
            event_ttl_ms: 0,
            peer_ttl_ms: self.peer_ttl_ms,
        }
    }
}

impl FilterConfig {
    /// Parses and validates; an empty configuration is invalid (no pool to route to).
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let cfg: FilterConfig =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.models.is_empty() {
            return bad("'models' must list at least one model".into());
        }
        let h = &self.destination_header;
        if h.is_empty()
            || h.bytes().any(|b| !(b.is_ascii_lowercase() || b == b'-' || b.is_ascii_digit()))
        {
            return bad(format!("destination_header '{h}' must be a lowercase header name"));
        }
        if self.index.max_blocks_per_worker == 0 || self.index.predicted_ttl_ms == 0 {
            return bad("index.max_blocks_per_worker and index.predicted_ttl_ms must be > 0".into());
        }
        if self.index.peer_ttl_ms == 0 {
            return bad("index.peer_ttl_ms must be > 0".into());
        }
        if !(self.tie_band.abs_ms >= 0.0 && self.tie_band.rel >= 0.0) {
            return bad("tie_band values must be >= 0".into());
        }
        if !(0.0..=100.0).contains(&self.stream_stall_weight) {
            return bad(format!(
                "stream_stall_weight must be a number in [0, 100], got {}",
                self.stream_stall_weight
            ));
        }
        if self.stream_growth_tokens > 65_536 {
            return bad(format!(
                "stream_growth_tokens must be at most 65536, got {}",
                self.stream_growth_tokens
            ));
        }
        if self.knowledge.max_event_age_ms == 0 {
            return bad("knowledge.max_event_age_ms must be > 0".into());
        }
        if self.max_prompt_tokens == 0 || self.max_prompt_bytes == 0 {
            return bad("max_prompt_tokens and max_prompt_bytes must be > 0".into());
        }
        if self.max_body_bytes < self.max_prompt_bytes {
            return bad("max_body_bytes must be >= max_prompt_bytes".into());
        }
        if self.tick_ms == 0 || self.tick_ms > 10_000 {
            return bad("tick_ms must be 1..=10000".into());
        }
        self.journal.validate().map_err(ConfigError::Invalid)?;
        self.load.validate(self.tick_ms).map_err(ConfigError::Invalid)?;
        self.calibration.validate().map_err(ConfigError::Invalid)?;
        self.lookahead.validate().map_err(ConfigError::Invalid)?;
        self.misdeployment.validate(self.tick_ms).map_err(ConfigError::Invalid)?;
        self.health.validate().map_err(ConfigError::Invalid)?;
        let d = self.knowledge.decode_limits;
        if d.max_workers == 0 || d.max_hashes_per_worker == 0 {
            return bad("knowledge.decode_limits values must be > 0".into());
        }
        if let Some(p) = &self.fault_injection.trap_path {
            if !p.starts_with("/kvroute/") || p.len() <= "/kvroute/".len() {
                return bad("fault_injection.trap_path must start with /kvroute/".into());
            }
        }
        self.admission.validate(&self.destination_header).map_err(ConfigError::Invalid)?;
        self.topology.validate().map_err(ConfigError::Invalid)?;
        if self.topology.transfer.header == self.destination_header {
            return bad("topology.transfer.header must differ from destination_header".into());
        }
        let mut names = HashSet::new();
        for m in &self.models {
            if m.name.is_empty() || !names.insert(m.name.as_str()) {
                return bad(format!("model name '{}' is empty or repeated", m.name));
            }
            m.validate().map_err(|e| ConfigError::Invalid(format!("model '{}': {e}", m.name)))?;
        }
        for a in self.models.iter().flat_map(|m| &m.adapters) {
            if a.is_empty() || !names.insert(a.as_str()) {
                return bad(format!("adapter '{a}' is empty or repeats a model or adapter name"));
            }
        }
        Ok(())
    }
}

impl ModelConfig {
    fn validate(&self) -> Result<(), String> {
        if self.workers.is_empty() {
            return Err("'workers' must list at least one ip:port".into());
        }
        let mut seen = HashSet::new();
        for w in &self.workers {
            if w.parse::<SocketAddr>().is_err() {
                return Err(format!("worker '{w}' is not an ip:port"));
            }
            if !seen.insert(w) {
                return Err(format!("worker '{w}' is listed twice"));
            }
        }
        for w in &self.prefill_workers {
            if w.parse::<SocketAddr>().is_err() || self.workers.contains(w) || !seen.insert(w) {
                return Err(format!(
                    "prefill worker '{w}' is not an ip:port or is also a decode worker"
                ));
            }
        }
        if self.pd_header.is_empty()
            || self
                .pd_header
                .bytes()
                .any(|b| !(b.is_ascii_lowercase() || b == b'-' || b.is_ascii_digit()))
        {
            return Err(format!("pd_header '{}' must be a lowercase header name", self.pd_header));
        }
        if !(1..=4096).contains(&self.block_size) {
            return Err(format!("block_size {} is outside 1..=4096", self.block_size));
        }
        if self.tokenizer.is_some() != self.tokenizer_config.is_some() {
            return Err("give both 'tokenizer' and 'tokenizer_config', or neither (demo)".into());
        }
        if self.bundle.is_some() && self.tokenizer.is_some() {
            return Err("give the bundle inline ('tokenizer' + 'tokenizer_config') or from \
                        the updater ('bundle'), not both"
                .into());
        }
        self.profile.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<FilterConfig, ConfigError> {
        FilterConfig::from_json(v.to_string().as_bytes())
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(json!({"models":[{"name":"m","workers":["127.0.0.1:8000"]}]})).unwrap();
        assert_eq!(c.destination_header, "x-gateway-destination-endpoint");
        assert_eq!(c.models[0].block_size, 16);
        assert_eq!(c.models[0].profile, Profile::default());
    }

    #[test]
    fn invalid_configs_say_why() {
        let cases = [
            (json!({}), "at least one model"),
            (json!({"models":[{"name":"m","workers":[]}]}), "at least one ip:port"),
            (json!({"models":[{"name":"m","workers":["host:80"]}]}), "not an ip:port"),
            (json!({"models":[{"name":"m","workers":["127.0.0.1:1","127.0.0.1:1"]}]}), "twice"),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"],"block_size":0}]}),
                "block_size",
            ),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"]},{"name":"m","workers":["127.0.0.1:1"]}]}),
                "repeated",
            ),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"],"profile":{"prefill_ms_per_token":-1}}]}),
                "profile",
            ),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"]}],"destination_header":"X-Bad"}),
                "lowercase",
            ),
            (json!({"models":[{"name":"m","workers":["127.0.0.1:1"],"tokenizer":{}}]}), "both"),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"]}],"max_body_bytes":1}),
                "max_body_bytes",
            ),
            (json!({"models":[{"name":"m","workers":["127.0.0.1:1"]}],"tick_ms":0}), "tick_ms"),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"]}],"load":{"shard_timeout_ms":100}}),
                "3 ticks",
            ),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"]}],"journal":{"max_hashes_per_entry":0}}),
                "max_hashes_per_entry",
            ),
            (
                json!({"models":[{"name":"m","workers":["127.0.0.1:1"]}],"fault_injection":{"trap_path":"/v1/x"}}),
                "/kvroute/",
            ),
        ];
        for (v, needle) in cases {
            let e = parse(v.clone()).unwrap_err().to_string();
            assert!(e.contains(needle), "{v}: {e}");
        }
        assert!(matches!(parse(json!({"modelz":[]})), Err(ConfigError::Parse(_))));
    }

    #[test]
    fn a_model_bundle_is_inline_the_demo_or_from_the_updater() {
        let model = |extra: Value| {
            let mut m = json!({"name": "m", "workers": ["127.0.0.1:1"]});
            for (k, v) in extra.as_object().unwrap() {
                m[k] = v.clone();
            }
            parse(json!({ "models": [m] })).map(|c| c.models[0].clone())
        };
        let demo = model(json!({})).unwrap();
        assert_eq!(demo.bundle_source(), BundleSource::Demo);
        let t = json!({"model": {}});
        let inline = model(json!({"tokenizer": t, "tokenizer_config": {}})).unwrap();
        assert!(matches!(inline.bundle_source(), BundleSource::Inline { .. }));
        let updater = model(json!({"bundle": "updater"})).unwrap();
        assert_eq!(updater.bundle_source(), BundleSource::Shared(BundleRef::Updater));
        let pinned = model(json!({"bundle": "00c0FFee12345678"})).unwrap();
        assert_eq!(
            pinned.bundle_source(),
            BundleSource::Shared(BundleRef::Pinned(0xc0ffee12345678))
        );
        assert_eq!(String::from(BundleRef::Pinned(0xc0ffee12345678)), "00c0ffee12345678");
        for bad in
            ["", "upd", "c0ffee", "00c0ffee123456789", "zzzzzzzzzzzzzzzz", "+0c0ffee12345678"]
        {
            let e = model(json!({ "bundle": bad })).unwrap_err().to_string();
            assert!(e.contains("16-hex-digit"), "{bad}: {e}");
        }
        let both = model(json!({"bundle": "updater", "tokenizer": t, "tokenizer_config": {}}));
        assert!(both.unwrap_err().to_string().contains("not both"));
    }

    #[test]
    fn the_singleton_takes_bundle_bounds() {
        let sync = |v: Value| SnapshotSyncConfig::from_json(v.to_string().as_bytes(), &|_| None);
        let tok = "0123456789abcdef";
        let c = sync(json!({"snapshot_sync": {"cluster": "u", "token": tok}})).unwrap().unwrap();
        assert!(c.bundles.enabled);
        assert_eq!(c.bundles.max_bundles, 4);
        let c = sync(json!({"snapshot_sync": {"cluster": "u", "token": tok,
            "bundles": {"max_bundles": 2, "grace_ms": 5}}}))
        .unwrap()
        .unwrap();
        assert_eq!((c.bundles.max_bundles, c.bundles.grace_ms), (2, 5));
        let bad = sync(json!({"snapshot_sync": {"cluster": "u", "token": tok,
            "bundles": {"retry_min_ms": 10, "retry_max_ms": 5}}}));
        assert!(bad.unwrap_err().to_string().contains("retry_min_ms"));
        let unknown =
            sync(json!({"snapshot_sync": {"cluster": "u", "token": tok, "bundles": {"x": 1}}}));
        assert!(unknown.is_err());
    }

    #[test]
    fn sync_token_comes_from_the_environment_when_named() {
        let env = |k: &str| (k == "TOK").then(|| "0123456789abcdef".to_string());
        let sync = |v: Value| SnapshotSyncConfig::from_json(v.to_string().as_bytes(), &env);
        let c = sync(json!({"snapshot_sync": {"cluster": "u", "token_env": "TOK"}})).unwrap();
        assert_eq!(c.map(|c| c.token).as_deref(), Some("0123456789abcdef"));
        let unset = sync(json!({"snapshot_sync": {"cluster": "u", "token_env": "NOPE"}}));
        assert!(unset.unwrap_err().to_string().contains("NOPE is not set"));
        let both = sync(
            json!({"snapshot_sync": {"cluster": "u", "token": "0123456789abcdef", "token_env": "TOK"}}),
        );
        assert!(both.unwrap_err().to_string().contains("not both"));
        let short = sync(json!({"snapshot_sync": {"cluster": "u", "token": "short"}}));
        assert!(short.unwrap_err().to_string().contains("16+"));
        assert_eq!(sync(json!({"models": []})).unwrap(), None);
    }
}
