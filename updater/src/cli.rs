//! The updater's command line ([`Args`]) and how it combines with a `--config` file into one
//! [`UpdaterConfig`] and a [`Token`] ([`resolve`]): defaults, then the file, then every flag
//! given on the command line (or through its environment variable).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use thiserror::Error;

use crate::config::{defaults, ModelEntry, Token, UpdaterConfig, UpdaterConfigError};
use crate::discovery::WorkerEntry;
use crate::models::{parse_block_size, ModelSpec};

/// Follows workers' KV events and serves canonical knowledge snapshots to kvroute.
///
/// Every setting can also come from a TOML file (`--config`); a flag given on the command line
/// overrides the file.
#[derive(Parser, Debug)]
#[command(name = "kvroute-updater", version, about)]
pub struct Args {
    /// A TOML config file (see deploy/updater.example.toml): every flag below as a snake_case
    /// key, models and workers as [[models]] and [[workers]] tables. Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Parse and validate the configuration (file, flags, token, model bundles), print it
    /// without the token, and exit without binding anything.
    #[arg(long)]
    pub check: bool,
    /// Address of the HTTP surface (status, metrics, snapshots). Loopback by default.
    #[arg(long, default_value = defaults::LISTEN)]
    pub listen: SocketAddr,
    /// Shared token the Envoy side must send for snapshots (or env KVROUTE_UPDATER_TOKEN).
    /// At least 16 characters. Prefer --token-file: a flag shows in the process list.
    #[arg(long, env = "KVROUTE_UPDATER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the shared token (a trailing newline is ignored), e.g. a mounted
    /// Kubernetes or Docker secret. Exclusive with --token and the config's token_file.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// A served model: `NAME=DIR` (a Hugging Face style directory with `tokenizer.json` and
    /// `tokenizer_config.json`) or a bare `NAME` (the built-in demo bundle). Repeat per model.
    /// A worker's model is its `/v1/models` base model; one not given here is incompatible.
    #[arg(long = "model", value_name = "NAME[=DIR]", default_value = defaults::MODEL)]
    pub models: Vec<ModelSpec>,
    /// The KV block size every model's workers must announce (else learned per model from the
    /// first compatible worker).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// `NAME=BLOCK_SIZE`: the block size of one model's workers (overrides --block-size).
    #[arg(long = "model-block-size", value_name = "NAME=BLOCK_SIZE", value_parser = parse_block_size)]
    pub model_block_sizes: Vec<(String, u32)>,
    /// Most LoRA adapters published per worker (the first by name).
    #[arg(long, default_value_t = defaults::MAX_ADAPTERS_PER_WORKER)]
    pub max_adapters_per_worker: usize,
    /// Longest model or adapter name taken from a worker's `/v1/models`, in bytes.
    #[arg(long, default_value_t = defaults::MAX_ADAPTER_NAME_BYTES)]
    pub max_adapter_name_bytes: usize,
    /// How often each worker's config alignment is checked (ms).
    #[arg(long, default_value_t = defaults::ALIGN_INTERVAL_MS)]
    pub align_interval_ms: u64,
    /// How often each worker's `/metrics` is scraped (ms).
    #[arg(long, default_value_t = defaults::SCRAPE_INTERVAL_MS)]
    pub scrape_interval_ms: u64,
    /// Scraped loads are published to the long polls at most this often (ms; at most the
    /// scrape interval); KV events and peer reports go out at once. 0: each scrape at once.
    #[arg(long, default_value_t = defaults::LOAD_PUBLISH_MS)]
    pub load_publish_ms: u64,
    /// Envoy's admin address (e.g. `http://127.0.0.1:9901`): its health checks decide which
    /// workers are in the pool. Without it, every configured worker is.
    #[arg(long)]
    pub envoy_admin: Option<String>,
    /// The Envoy cluster holding the workers.
    #[arg(long, default_value = defaults::ENVOY_CLUSTER)]
    pub envoy_cluster: String,
    /// Most blocks kept per worker and tier; past it the oldest-known blocks are forgotten.
    #[arg(long, default_value_t = defaults::MAX_BLOCKS_PER_TIER)]
    pub max_blocks_per_tier: usize,
    /// Most engine-hash -> canonical-hash entries kept per worker (all tiers).
    #[arg(long, default_value_t = defaults::MAX_ENGINE_KEYS)]
    pub max_engine_keys: usize,
    /// Most batches taken from one replay; a longer replay is cut.
    #[arg(long, default_value_t = defaults::MAX_REPLAY_BATCHES)]
    pub max_replay_batches: usize,
    /// Most payload bytes taken from one replay.
    #[arg(long, default_value_t = defaults::MAX_REPLAY_BYTES)]
    pub max_replay_bytes: usize,
    /// Most time spent on one replay (ms).
    #[arg(long, default_value_t = defaults::MAX_REPLAY_MS)]
    pub max_replay_ms: u64,
    /// After a replay was cut, the worker's next replay waits this long (ms).
    #[arg(long, default_value_t = defaults::REPLAY_RETRY_MS)]
    pub replay_retry_ms: u64,
    /// Longest ZMQ frame (and batch payload) accepted from a worker; longer ones are refused
    /// before the ZMQ codec allocates them.
    #[arg(long, default_value_t = defaults::MAX_FRAME_BYTES)]
    pub max_frame_bytes: usize,
    /// Most frames in one ZMQ message from a worker.
    #[arg(long, default_value_t = defaults::MAX_MESSAGE_FRAMES)]
    pub max_message_frames: usize,
    /// Most bytes of all frames of one ZMQ message together (at least --max-frame-bytes);
    /// frames past it are refused before the ZMQ codec holds them.
    #[arg(long, default_value_t = defaults::MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Most msgpack elements in one event batch; a batch with more, or declaring more than its
    /// bytes can hold, is refused before it is decoded.
    #[arg(long, default_value_t = defaults::MAX_BATCH_ELEMENTS)]
    pub max_batch_elements: usize,
    /// Largest HTTP answer read from a worker (`/metrics`, `/tokenize`, `/v1/models`).
    #[arg(long, default_value_t = defaults::MAX_HTTP_BODY_BYTES)]
    pub max_http_body_bytes: usize,
    /// Most open connections to the HTTP surface; lowered to fit the open-files limit. Past
    /// it, the oldest idle connection that never sent the token is closed first.
    #[arg(long, default_value_t = crate::conns::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// A connection must complete a request's head this long after it opened or after the
    /// first byte of a request (ms).
    #[arg(long, default_value_t = crate::conns::HEADER_READ_TIMEOUT_MS)]
    pub header_read_timeout_ms: u64,
    /// A kept-alive connection with no request in flight is closed after this long (ms); a
    /// long poll is a request in flight.
    #[arg(long, default_value_t = crate::conns::IDLE_TIMEOUT_MS)]
    pub idle_timeout_ms: u64,
    /// How long another Envoy replica's routing credit is kept and published (ms).
    #[arg(long, default_value_t = defaults::PEER_TTL_MS)]
    pub peer_ttl_ms: u64,
    /// How long a replica's reported in-flight load counts without a refresh (ms); replicas
    /// re-send held loads every `snapshot_sync.peers.heartbeat_ms` (1 s by default).
    #[arg(long, default_value_t = defaults::PEER_LOAD_TTL_MS)]
    pub peer_load_ttl_ms: u64,
    /// Most Envoy replicas reporting at once; reports of more are refused (429).
    #[arg(long, default_value_t = defaults::MAX_PEER_REPLICAS)]
    pub max_peer_replicas: usize,
    /// Most credited hashes kept from all replicas; past it the oldest credits are dropped.
    #[arg(long, default_value_t = defaults::MAX_PEER_HASHES)]
    pub max_peer_hashes: usize,
    /// Largest peer report body accepted (bytes); larger ones get 413.
    #[arg(long, default_value_t = defaults::MAX_PEER_REPORT_BYTES)]
    pub max_peer_report_bytes: usize,
    /// A worker: `HTTP_ADDR[,EVENTS_ENDPOINT[,REPLAY_ENDPOINT]]`, e.g.
    /// `127.0.0.1:8000,tcp://127.0.0.1:5557,tcp://127.0.0.1:5558`. Repeat per worker (or
    /// [[workers]] in the config file). A worker given without an events endpoint is followed
    /// for load, adapters and alignment only (an engine without KV events, or an evaluation
    /// that withholds them).
    #[arg(long = "worker", value_name = "HTTP[,EVENTS[,REPLAY]]", value_parser = parse_worker)]
    pub workers: Vec<WorkerEntry>,
    /// Where the workers come from instead of --worker: `dns:NAME` (A/AAAA records of a
    /// headless Service, on --discover-http-port), `dns+srv:NAME` (SRV records: targets and
    /// HTTP ports), `kube:NAMESPACE/SERVICE` (ready endpoints of the Service's EndpointSlices,
    /// list + watch), `kube-pool:NAMESPACE/POOL` (ready pods an InferencePool selects, on its
    /// target port), or `static` (the default: --worker). Discovered workers are named
    /// `ip:port`; the snapshot then lists the whole pool. Config file: [discovery] source.
    #[arg(long, value_name = "SOURCE")]
    pub discover: Option<crate::discovery::DiscoverySource>,
    /// The DNS server to ask (`ip:port`); default: the system's (/etc/resolv.conf).
    #[arg(long, value_name = "IP:PORT")]
    pub discover_dns_server: Option<SocketAddr>,
    /// The discovered workers' HTTP port (required for `dns:`; for `kube:` used unless
    /// --discover-port-name is given, else the slice's only port).
    #[arg(long, value_name = "PORT")]
    pub discover_http_port: Option<u16>,
    /// The discovered workers' KV-event PUB port (absent: followed for load only).
    #[arg(long, value_name = "PORT")]
    pub discover_events_port: Option<u16>,
    /// The discovered workers' replay ROUTER port (needs --discover-events-port).
    #[arg(long, value_name = "PORT")]
    pub discover_replay_port: Option<u16>,
    /// `kube:`: the EndpointSlice port name of the workers' HTTP port.
    #[arg(long, value_name = "NAME")]
    pub discover_port_name: Option<String>,
    /// DNS: shortest time between two resolutions (ms); a shorter TTL is raised to it.
    #[arg(long, value_name = "MS")]
    pub discover_min_ttl_ms: Option<u64>,
    /// DNS: longest time between two resolutions (ms); a longer TTL is cut to it.
    #[arg(long, value_name = "MS")]
    pub discover_max_ttl_ms: Option<u64>,
    /// `kube:`: the API server URL; default in a pod: https://$KUBERNETES_SERVICE_HOST:PORT.
    #[arg(long, value_name = "URL")]
    pub discover_kube_api: Option<String>,
    /// `kube:`: the bearer token file; default: the pod's service-account token, if present.
    #[arg(long, value_name = "PATH")]
    pub discover_kube_token_file: Option<PathBuf>,
    /// `kube:`: the API server's CA bundle; default: the pod's service-account ca.crt.
    #[arg(long, value_name = "PATH")]
    pub discover_kube_ca_file: Option<PathBuf>,
    /// The site the discovered (or listed) workers run in, for the filter's topology (one
    /// cluster is one site). Config file: [discovery] site.
    #[arg(long, value_name = "NAME")]
    pub discover_site: Option<String>,
}

fn parse_worker(s: &str) -> Result<WorkerEntry, UpdaterConfigError> {
    s.parse()
}

/// Why the command line could not be turned into a configuration.
#[derive(Debug, Error)]
pub enum CliError {
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    Config(#[from] UpdaterConfigError),
}

/// A validated configuration, its token, and whether only to check it.
#[derive(Debug)]
pub struct Resolved {
    pub config: UpdaterConfig,
    pub token: Token,
    pub check: bool,
}

/// Parses `argv` (the program name first) and resolves it ([`resolve`]).
pub fn resolve_from<I, T>(argv: I) -> Result<Resolved, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Args::command().try_get_matches_from(argv)?;
    let args = Args::from_arg_matches(&matches)?;
    Ok(resolve(&args, &matches)?)
}

/// Defaults, then the `--config` file, then the flags given on the command line; validated,
/// with the token read from its one source.
pub fn resolve(args: &Args, m: &ArgMatches) -> Result<Resolved, UpdaterConfigError> {
    let given = |id: &str| {
        matches!(m.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
    };
    let mut cfg = match &args.config {
        Some(path) => UpdaterConfig::from_file(path)?,
        None => UpdaterConfig::default(),
    };
    macro_rules! overlay {
        ($($field:ident),* $(,)?) => {
            $(if given(stringify!($field)) { cfg.$field = args.$field.clone(); })*
        };
    }
    overlay!(
        listen,
        envoy_cluster,
        align_interval_ms,
        scrape_interval_ms,
        load_publish_ms,
        max_adapters_per_worker,
        max_adapter_name_bytes,
        max_blocks_per_tier,
        max_engine_keys,
        max_replay_batches,
        max_replay_bytes,
        max_replay_ms,
        replay_retry_ms,
        max_frame_bytes,
        max_message_frames,
        max_message_bytes,
        max_batch_elements,
        max_http_body_bytes,
        max_connections,
        header_read_timeout_ms,
        idle_timeout_ms,
        peer_ttl_ms,
        peer_load_ttl_ms,
        max_peer_replicas,
        max_peer_hashes,
        max_peer_report_bytes,
        workers,
    );
    if given("block_size") {
        cfg.block_size = args.block_size;
    }
    if given("envoy_admin") {
        cfg.envoy_admin = args.envoy_admin.clone();
    }
    if given("models") {
        cfg.models = args.models.iter().cloned().map(ModelEntry::from).collect();
    }
    discovery_flags(args, &given, &mut cfg);
    for (name, size) in &args.model_block_sizes {
        let model = cfg.models.iter_mut().find(|m| m.name == *name);
        model.ok_or_else(|| UpdaterConfigError::UnknownModel(name.clone()))?.block_size =
            Some(*size);
    }
    let token = token(args, m, &cfg)?;
    cfg.validate()?;
    Ok(Resolved { config: cfg, token, check: args.check })
}

/// `--discover` and `--discover-*` given on the command line, over the file's [discovery].
fn discovery_flags(args: &Args, given: &dyn Fn(&str) -> bool, cfg: &mut UpdaterConfig) {
    let ids = [
        "discover",
        "discover_dns_server",
        "discover_http_port",
        "discover_events_port",
        "discover_replay_port",
        "discover_port_name",
        "discover_min_ttl_ms",
        "discover_max_ttl_ms",
        "discover_kube_api",
        "discover_kube_token_file",
        "discover_kube_ca_file",
        "discover_site",
    ];
    if !ids.iter().any(|id| given(id)) {
        return;
    }
    let d = cfg.discovery.get_or_insert_with(Default::default);
    macro_rules! set {
        ($($flag:ident => $key:ident),* $(,)?) => {
            $(if given(stringify!($flag)) { d.$key = args.$flag.clone(); })*
        };
    }
    set!(
        discover_dns_server => dns_server,
        discover_http_port => http_port,
        discover_events_port => events_port,
        discover_replay_port => replay_port,
        discover_port_name => port_name,
        discover_kube_api => kube_api,
        discover_kube_token_file => kube_token_file,
        discover_kube_ca_file => kube_ca_file,
        discover_site => site,
    );
    if let (true, Some(s)) = (given("discover"), &args.discover) {
        d.source = s.clone();
    }
    if let (true, Some(v)) = (given("discover_min_ttl_ms"), args.discover_min_ttl_ms) {
        d.min_ttl_ms = v;
    }
    if let (true, Some(v)) = (given("discover_max_ttl_ms"), args.discover_max_ttl_ms) {
        d.max_ttl_ms = v;
    }
}

/// The token from exactly one of `--token`, its environment variable, `--token-file` and the
/// file's `token_file`.
fn token(args: &Args, m: &ArgMatches, cfg: &UpdaterConfig) -> Result<Token, UpdaterConfigError> {
    let mut sources = Vec::new();
    if let Some(t) = &args.token {
        let from = match m.value_source("token") {
            Some(ValueSource::EnvVariable) => "KVROUTE_UPDATER_TOKEN",
            _ => "--token",
        };
        sources.push((from.to_owned(), Ok(t.clone())));
    }
    if let Some(p) = &args.token_file {
        sources.push((format!("--token-file {}", p.display()), Err(p.clone())));
    }
    if let Some(p) = &cfg.token_file {
        sources.push((format!("token_file {}", p.display()), Err(p.clone())));
    }
    match sources.len() {
        0 => Err(UpdaterConfigError::NoToken),
        1 => match sources.remove(0) {
            (from, Ok(value)) => Token::new(value, from),
            (from, Err(path)) => Token::from_file(&path, from),
        },
        _ => {
            let names: Vec<&str> = sources.iter().map(|(s, _)| s.as_str()).collect();
            Err(UpdaterConfigError::TokenTwice(names.join(", ")))
        }
    }
}
