//! The bodies of the fuzz targets, one function per target in `fuzz_targets/`.
//!
//! Each `fuzz_targets/<name>.rs` only hands libFuzzer's input to the function of the same name
//! here, so the same code runs under `cargo +nightly fuzz run <name>` (`./dev fuzz`) and, on
//! stable, in this crate's tests, which replay every committed seed in `corpus/<name>/`
//! (`./dev test`). A function panics only on a bug: the decoders must return errors, and what
//! they accept must survive a round trip.

use std::sync::OnceLock;

use kvroute_core::decision::config::{FilterConfig, SnapshotSyncConfig};
use kvroute_core::decision::pyjson;
use kvroute_core::decision::request::{parse, parse_general, Endpoint};
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_core::decision::usage::UsageScanner;
use kvroute_core::shared::knowledge::Head;
use kvroute_core::shared::load::{decode_registry, encode_registry, PrefillsDone, ShardData};
use kvroute_core::wire::delta::Delta;
use kvroute_core::wire::journal::JournalEntry;
use kvroute_core::wire::snapshot::Snapshot;

#[cfg(test)]
mod priority_seeds;
#[cfg(test)]
mod scan_seeds;
#[cfg(test)]
mod seeds;
#[cfg(test)]
mod steps_seeds;

/// A target: its name (as in `Cargo.toml`'s `[[bin]]` and `corpus/`) and its body.
pub type FuzzTarget = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: &[FuzzTarget] = &[
    ("request_parse", request_parse),
    ("request_scan", request_scan),
    ("journal_decode", journal_decode),
    ("usage_scan", usage_scan),
    ("config_parse", config_parse),
    ("snapshot_decode", snapshot_decode),
    ("event_decode", event_decode),
    ("delta_decode", delta_decode),
    ("shared_head_decode", shared_head_decode),
    ("shared_load_decode", shared_load_decode),
    ("shared_protocol", shared_protocol),
    ("zmtp_frames", zmtp_frames),
    ("bundle_decode", bundle_decode),
    ("compiled_encoder", compiled_encoder),
    ("peer_report_decode", peer_report_decode),
    ("admission_headers", admission_headers),
    ("calib_decode", calib_decode),
    ("calib_steps_decode", calib_steps_decode),
    ("kube_watch_event", kube_watch_event),
    ("priority_field", priority_field),
];

/// The deadline and priority headers come straight from clients, as bytes: the first byte
/// picks where the rest splits into the two values. Whatever they hold, they resolve to a
/// known class and no deadline or a positive one, and the verdict's `Retry-After` is in bounds.
pub fn admission_headers(data: &[u8]) {
    use kvroute_core::decision::admission::{admit, AdmissionConfig, AdmissionVerdict};
    let rest = data.get(1..).unwrap_or_default();
    let split = data.first().map_or(0, |b| *b as usize % (rest.len() + 1));
    let (deadline, priority) = rest.split_at(split);
    let mut cfg = AdmissionConfig::default();
    cfg.classes[1].max_wait_ms = Some(1.0);
    let ask = cfg.ask(Some(deadline), Some(priority), 0);
    assert!(ask.class < cfg.classes.len());
    assert!(ask.deadline_ms.is_none_or(|d| d > 0));
    let c = kvroute_core::decision::cost::Candidate::<kvroute_core::decision::worker::WorkerName> {
        worker: "127.0.0.1:1".into(),
        cached_blocks: 0,
        offloaded_blocks: 0,
        load: Default::default(),
        adapter_missing: false,
        deviation: 1.0,
    };
    let mut ranked = vec![kvroute_core::decision::cost::score(&Default::default(), &c, 1000, 16)];
    ranked[0].wait_ms = f64::from(data.len() as u32);
    if let AdmissionVerdict::Shed { retry_after_s, .. } = admit(&mut ranked, &ask, &cfg) {
        assert!((1..=cfg.max_retry_after_s).contains(&retry_after_s));
    }
}

/// Request bodies come straight from clients: parsing, rendering and tokenizing any bytes
/// must return a value or an error, never panic.
pub fn request_parse(data: &[u8]) {
    // Loading the demo bundle costs far more than one input; it is the same every time.
    static BUNDLE: OnceLock<Option<ModelBundle>> = OnceLock::new();
    let bundle = BUNDLE.get_or_init(|| ModelBundle::demo().ok());
    // Bodies are read as Python's json reads them (`request::pyjson`), with an explicit stack.
    let python = pyjson::from_body(data);
    if let Ok(p) = &python {
        // A completions body is read in one pass with its token ids straight into u32s: it
        // must parse exactly as the general path (the whole body as one JSON value) does.
        if !p.truncated {
            let general =
                kvroute_core::decision::request::parse_value(Endpoint::Completions, &p.value);
            assert_eq!(parse(Endpoint::Completions, data), general);
        }
        // What it keeps prints back (serde_json) as JSON it reads again the same way.
        if let Ok(text) = serde_json::to_vec(&p.value) {
            assert_eq!(pyjson::from_body(&text).map(|q| q.value), Ok(p.value.clone()));
        }
    }
    // Where a strict parser reads the body too and it holds no float (floats are where Python
    // may differ: -0, integers beyond 64 bits), both read the same value.
    if let Ok(strict) = serde_json::from_slice::<serde_json::Value>(data) {
        if !has_float(&strict) {
            assert_eq!(python.map(|p| p.value), Ok(strict));
        }
    }
    for ep in [Endpoint::Chat, Endpoint::Completions, Endpoint::Messages, Endpoint::Responses] {
        if let (Ok(req), Some(b)) = (parse(ep, data), bundle.as_ref()) {
            let _ = b.prompt_tokens(&req.prompt);
            let _ = b.routing_tokens(&req.prompt);
        }
    }
}

/// The body scan (one pass, no DOM of the whole body) against the general path (the body as
/// Python's `json` reads it, then its fields), on chat and completions bodies: any bytes give
/// both the same request or the same error. The first byte picks a way to read the rest: as
/// it is, as the `messages` of a chat body or as the `prompt` of a completions body (so that
/// the fuzzer reaches the field readers without having to find the frame first).
pub fn request_scan(data: &[u8]) {
    let rest = data.get(1..).unwrap_or_default();
    let body = match data.first().map(|b| b % 3) {
        Some(1) => [&br#"{"model":"m","messages":"#[..], rest, b"}"].concat(),
        Some(2) => [&br#"{"model":"m","prompt":"#[..], rest, b"}"].concat(),
        _ => rest.to_vec(),
    };
    for ep in [Endpoint::Chat, Endpoint::Completions] {
        assert_eq!(parse(ep, &body), parse_general(ep, &body), "{ep:?}");
    }
}

/// Whether `v` holds a float anywhere.
fn has_float(v: &serde_json::Value) -> bool {
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        match v {
            serde_json::Value::Number(n) if n.is_f64() => return true,
            serde_json::Value::Array(items) => todo.extend(items),
            serde_json::Value::Object(m) => todo.extend(m.values()),
            _ => {}
        }
    }
    false
}

/// Shared-data journal entries: the decoder never panics, and an accepted entry round-trips.
pub fn journal_decode(data: &[u8]) {
    if let Ok(e) = JournalEntry::decode(data) {
        assert_eq!(JournalEntry::decode(&e.encode()), Ok(e));
    }
}

/// Response bodies come from workers: the usage scanner takes any chunking of any bytes (the
/// first byte picks where the input is split in two).
pub fn usage_scan(data: &[u8]) {
    let mut s = UsageScanner::default();
    let split = data.first().map_or(0, |b| *b as usize % (data.len().max(1)));
    s.push(&data[..split]);
    s.push(&data[split..]);
    let _ = s.usage();
}

/// Plugin configurations (the filter's and the snapshot singleton's): any bytes parse and
/// validate to a config or an error, and a valid filter config builds a router or an error.
pub fn config_parse(data: &[u8]) {
    if let Ok(cfg) = FilterConfig::from_json(data) {
        let _ = kvroute_core::decision::router::Router::new(&cfg);
    }
    let _ = SnapshotSyncConfig::from_json(data, &sync_env);
}

/// The Envoy environment the singleton's `token_env` is looked up in: one variable.
pub fn sync_env(name: &str) -> Option<String> {
    (name == "KVROUTE_TOKEN").then(|| "0123456789abcdef".to_string())
}

/// Knowledge snapshots arrive over HTTP from the updater: any bytes decode or fail cleanly.
pub fn snapshot_decode(data: &[u8]) {
    if let Ok(s) = Snapshot::decode(data) {
        assert_eq!(Snapshot::decode(&s.encode()), Ok(s));
    }
}

/// KV-event payloads come from workers over ZMQ: any bytes decode or fail cleanly, and what the
/// pre-pass lets through to decoding is bounded by the input's length (size amplification:
/// elements and allocation per input byte).
pub fn event_decode(data: &[u8]) {
    use kvroute_updater::decode::{check, decode_batch_with, Bounds, DecodeError};
    // Small caps, so that the fuzzer reaches them with small inputs.
    let bounds = Bounds { max_elements: 4096, max_depth: 16 };
    let shape = check(data, &bounds);
    if let Ok(s) = &shape {
        // Size amplification: every element is at least one byte, and what decoding may
        // allocate is bounded by the input's length.
        assert!(s.elements <= data.len() && s.elements <= bounds.max_elements);
        assert!(s.data_bytes <= data.len() && s.depth <= bounds.max_depth);
        assert!(s.decoded_bytes_bound() <= MAX_AMPLIFICATION * data.len());
    }
    match decode_batch_with(data, &bounds) {
        Err(DecodeError::Bounds(e)) => assert_eq!(shape, Err(e)),
        Ok(b) => assert!(shape.is_ok() && b.events.len() <= data.len()),
        Err(_) => assert!(shape.is_ok()),
    }
}

/// Most bytes decoding an event batch may allocate per input byte. The worst input is a batch
/// of one-byte events (nils): each is materialised as an `rmpv::Value` (40 bytes) and then as
/// an `EngineEvent` (56 bytes), both alive at the peak; strings and binaries are copied once.
pub const MAX_AMPLIFICATION: usize = 128;

/// Snapshot deltas arrive over HTTP from the updater and sit in shared data: any bytes decode
/// or fail cleanly.
pub fn delta_decode(data: &[u8]) {
    if let Ok(s) = Delta::decode(data) {
        assert_eq!(Delta::decode(&s.encode()), Ok(s));
    }
}

/// Other Envoy replicas' reports arrive over HTTP at the updater (`POST /v1/peers`): any
/// bytes decode or fail cleanly, and what is accepted round-trips.
pub fn peer_report_decode(data: &[u8]) {
    let limits = kvroute_core::wire::DecodeLimits::default();
    if let Ok(r) = kvroute_core::wire::peers::PeerReport::decode_with(data, &limits) {
        assert_eq!(kvroute_core::wire::peers::PeerReport::decode_with(&r.encode(), &limits), Ok(r));
    }
}

/// The snapshot head in Envoy shared data (version, confirmation time, full version, the
/// last delta's sequence number), read by every thread on every request: any bytes decode or
/// fail cleanly, and the encoding of an accepted head is exactly the bytes it came from.
pub fn shared_head_decode(data: &[u8]) {
    if let Some(h) = Head::decode(data) {
        assert_eq!(h.encode(), data);
    }
}

/// A thread's load shard (in-flight entries with their leases), its table of prefill ends and
/// the shard registry in Envoy shared data: any bytes decode or fail cleanly, and what is
/// accepted round-trips.
pub fn shared_load_decode(data: &[u8]) {
    if let Some(s) = ShardData::decode(data) {
        assert_eq!(ShardData::decode(&s.encode()), Some(s));
    }
    if let Some(d) = PrefillsDone::decode(data) {
        assert_eq!(d.encode(), data);
    }
    if let Some(ids) = decode_registry(data) {
        assert_eq!(encode_registry(&ids), data);
    }
}

/// The ZMTP framing a worker sends, as the updater's frame guard relays it: any bytes, in any
/// read sizes (the first byte picks the size), pass or fail cleanly, and the guard never
/// forwards more than it received (an oversized frame shrinks to an empty one).
pub fn zmtp_frames(data: &[u8]) {
    use kvroute_updater::frameguard::Framer;
    use kvroute_updater::limits::WireLimits;
    let step = data.first().map_or(1, |b| usize::from(*b % 64) + 1);
    let limits = WireLimits {
        max_frame_bytes: 256,
        max_message_frames: 4,
        max_message_bytes: 512,
        ..WireLimits::default()
    };
    let mut framer = Framer::new(limits);
    let (mut out, mut hits) = (Vec::new(), Vec::new());
    for chunk in data.chunks(step) {
        if framer.feed(chunk, &mut out, &mut hits).is_err() {
            break;
        }
    }
    assert!(out.len() <= data.len());
}

/// The shared-data keys [`shared_protocol`] fills, by index.
pub fn protocol_keys() -> Vec<String> {
    use kvroute_core::shared::{journal, knowledge, load};
    let mut keys = vec![knowledge::HEAD_KEY.to_owned(), knowledge::DATA_KEY.to_owned()];
    keys.extend((0..4).map(knowledge::delta_key));
    keys.push(journal::HEAD_KEY.to_owned());
    keys.extend((0..4).map(journal::slot_key));
    keys.push(load::REGISTRY_KEY.to_owned());
    keys.extend((0..4).map(load::shard_key));
    keys.extend((0..4).map(load::done_key));
    keys.extend((0..4).map(load::passed_key));
    keys
}

/// Encodes a store's values as [`shared_protocol`] reads them: `[key index, len (u16 LE),
/// bytes]` records.
pub fn protocol_records(store: &kvroute_core::shared::fake::MemStore) -> Vec<u8> {
    use kvroute_core::shared::SharedStore;
    let mut out = Vec::new();
    for (i, key) in protocol_keys().iter().enumerate() {
        if let Some(v) = store.get(key).0 {
            let v = &v[..v.len().min(u16::MAX as usize)];
            out.push(i as u8);
            out.extend_from_slice(&(v.len() as u16).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

/// Whatever other VMs (or a corruption) left in shared data, a thread's whole protocol runs
/// over it without panicking: following the knowledge chain (with and without the full
/// snapshot), polling the journal into a router, registering a load shard, reading every
/// shard and asking every thread's table of passes. The input is records of `[key index, len (u16 LE), bytes]` (see [`protocol_keys`]).
pub fn shared_protocol(data: &[u8]) {
    use kvroute_core::decision::config::sync::LoadLimits;
    use kvroute_core::decision::router::Router;
    use kvroute_core::shared::fake::{MemStore, Tally};
    use kvroute_core::shared::journal::JournalCursor;
    use kvroute_core::shared::knowledge::Follower;
    use kvroute_core::shared::load::{LoadView, Shard};
    thread_local! {
        static ROUTER: Option<std::cell::RefCell<Router>> = {
            let cfg = br#"{"models": [{"name": "m", "workers": ["127.0.0.1:1", "127.0.0.1:2"]}]}"#;
            FilterConfig::from_json(cfg)
                .ok()
                .and_then(|c| Router::new(&c).ok())
                .map(std::cell::RefCell::new)
        };
    }
    let keys = protocol_keys();
    let store = MemStore::new();
    let mut rest = data;
    while let [k, a, b, tail @ ..] = rest {
        let len = (u16::from_le_bytes([*a, *b]) as usize).min(tail.len());
        store.poke(&keys[*k as usize % keys.len()], &tail[..len]);
        rest = &tail[len..];
    }
    let tally = Tally::default();
    ROUTER.with(|r| {
        let Some(r) = r else { return };
        let mut router = r.borrow_mut();
        for allow_full in [false, true] {
            Follower::default().catch_up(&store, &tally, &mut router, allow_full);
        }
        let mut cursor = JournalCursor::default();
        for _ in 0..8 {
            let (entries, more) = cursor.poll(&store, &tally, 4096);
            for e in &entries {
                router.apply_journal(e);
            }
            if !more {
                break;
            }
        }
    });
    let shard = Shard::register(&store, &tally, LoadLimits::default(), 1_700_000_000_000, 1);
    let view = LoadView::read(&store, &tally, &shard, 1_700_000_001_000);
    let _ = view.load("127.0.0.1:1");
    let worker = kvroute_core::decision::load::worker_key("127.0.0.1:1");
    let _ = shard.passed_over(&store, &tally, worker, &[-5, 0], 0);
}

/// A compiled encoder comes from the updater inside a compiled bundle, and every filter
/// thread reads it back (`ModelBundle::from_compiled`): any bytes are read or refused, and an
/// encoder that was read encodes any text without panicking and writes itself back to bytes
/// that read to the same encoder.
pub fn compiled_encoder(data: &[u8]) {
    use kvroute_core::decision::tokenize::model::DEMO_TOKENIZER_CONFIG;
    let Ok(b) = ModelBundle::from_compiled(1, data, DEMO_TOKENIZER_CONFIG) else { return };
    for special in [false, true] {
        let _ = b.encode("Hello <|eot_id|> wörld  \n\n 🦀 12345 e\u{301}", special);
    }
    let written = b.compiled_encoder().expect("a compiled bundle has its encoder");
    let again = ModelBundle::from_compiled(1, &written, DEMO_TOKENIZER_CONFIG)
        .expect("what was written reads back");
    assert_eq!(again.compiled_encoder().as_deref(), Some(&written[..]));
}

/// Model bundles come from the updater (part by part) and sit in shared data with the bundle
/// manifest; the updater's bundle list is JSON from it. Any bytes decode or fail cleanly, what
/// is accepted round-trips, and a thread following a manifest made of these bytes (its parts
/// absent or garbage) builds nothing and does not panic.
pub fn bundle_decode(data: &[u8]) {
    use kvroute_core::shared::bundles::{parse_list, BundleFollower, Manifest, MAX_MODELS};
    use kvroute_core::shared::fake::MemStore;
    use kvroute_core::wire::bundle::BundleBlob;
    if let Ok(b) = BundleBlob::decode(data) {
        assert_eq!(BundleBlob::decode(&b.encode()), Ok(b));
    }
    if let Ok(m) = Manifest::decode(data) {
        assert_eq!(Manifest::decode(&m.encode()), Ok(m.clone()));
        let store = MemStore::new();
        store.poke(kvroute_core::shared::bundles::MANIFEST_KEY, data);
        if let Some(p) = m.models.first() {
            // One part holds these same bytes: never a valid bundle of that fingerprint.
            store.poke(&kvroute_core::shared::bundles::part_key(p.fingerprint, 0), data);
            let cfg = br#"{"models":[{"name":"m","workers":["127.0.0.1:1"],"bundle":"updater"}]}"#;
            if let Ok(mut cfg) = FilterConfig::from_json(cfg) {
                cfg.models[0].name.clone_from(&p.model);
                let mut follower = BundleFollower::new(&cfg.models);
                let t = follower.tick(&store, 0);
                assert!(t.built.is_none() && t.changed.is_empty());
            }
        }
    }
    if let Ok((list, _)) = parse_list(data) {
        assert!(list.len() <= MAX_MODELS);
    }
}

/// A model's online-calibration state in shared data, read by every thread: any bytes decode
/// or fail cleanly, an accepted state encodes to exactly the bytes it came from, and learning
/// from it keeps its coefficients finite, non-negative and within their bounds.
pub fn calib_decode(data: &[u8]) {
    use kvroute_core::decision::calib::{CalibrationConfig, ModelState, Sample};
    let Ok(mut st) = ModelState::decode(data) else { return };
    assert_eq!(st.encode(), data);
    let cfg = CalibrationConfig::default();
    let s = Sample {
        worker: "127.0.0.1:1".into(),
        uncached_tokens: 512,
        cached_tokens: 1024,
        load: Default::default(),
        fixed_ms: 0.0,
        observed_ms: 25.0,
        priority: 0,
        passed: false,
        fill_ms: 0.0,
        wait_factor: 1.0,
    };
    st.observe(&cfg, &s);
    for c in st.coefficients() {
        assert!(c.is_finite() && c >= 0.0);
    }
    let _ = ModelState::decode(&st.encode());
}

/// A model's decode step in shared data, read by every thread: any bytes decode or fail
/// cleanly, an accepted state encodes to exactly the bytes it came from, and learning from it
/// keeps its coefficients finite, positive and within their bounds.
pub fn calib_steps_decode(data: &[u8]) {
    use kvroute_core::decision::calib::{CalibrationConfig, StepSample, StepState};
    let Ok(mut st) = StepState::decode(data) else { return };
    assert_eq!(st.encode(), data);
    let cfg = CalibrationConfig::default();
    let s = StepSample { streams: 8.0, context_tokens: 8000.0, step_ms: 7.5 };
    st.observe(&cfg, &s);
    let bound = cfg.coefficient_bound;
    for (i, t) in st.theta.iter().enumerate() {
        assert!(t.is_finite() && *t > 0.0, "theta {i} = {t}");
        if st.samples > 1 && st.prior[i] > 0.0 {
            assert!((1.0 / bound - 1e-9..=bound + 1e-9).contains(t), "theta {i} = {t}");
        }
    }
    let _ = StepState::decode(&st.encode());
}

/// How one watch stream ended for one collection (see [`watch_stream`]).
#[derive(Debug, PartialEq, Eq)]
pub struct WatchRun {
    /// `Ok`, or the error's message (`Gone`: list again; a line over the bound).
    pub end: Result<(), String>,
    /// The last `resourceVersion` seen.
    pub version: Option<String>,
    /// The workers after each event applied, in order.
    pub after_each: Vec<Vec<kvroute_updater::discovery::WorkerEntry>>,
}

/// Reads the watch stream `data` as the updater's watch loop does
/// ([`kvroute_updater::discovery::kube::take_events`]), `step` bytes at a time, applying each
/// event to `objects` through `c`; the workers after each event are checked with
/// [`check_workers`].
pub fn watch_stream(
    data: &[u8],
    step: usize,
    c: &kvroute_updater::discovery::kube::Collection,
    cfg: &kvroute_updater::discovery::DiscoveryConfig,
    port: Option<u16>,
    objects: &mut kvroute_updater::discovery::kube::Objects,
) -> WatchRun {
    use kvroute_updater::discovery::kube::take_events;
    let (mut buf, mut version, mut after_each) = (Vec::new(), None, Vec::new());
    let mut end = Ok(());
    for chunk in data.chunks(step.max(1)) {
        buf.extend_from_slice(chunk);
        end = take_events(&mut buf, c, objects, &mut version, |o| {
            let w = o.workers(cfg);
            check_workers(&w, cfg, port);
            after_each.push(w);
        })
        .map_err(|e| e.to_string());
        if end.is_err() {
            break;
        }
        // Every complete line is taken: what is left is the start of the next one.
        assert!(!buf.contains(&b'\n'));
    }
    WatchRun { end, version, after_each }
}

/// Discovered workers as [`kvroute_updater::discovery::kube::Objects::workers`] makes them:
/// each an `ip:port` on `port` (when the collection fixes one; never port 0), in ascending
/// order without duplicates, its KV-event and replay endpoints on the configured ports of the
/// same address (replay only with events), in the configured site and on no rack (Kubernetes
/// names none).
pub fn check_workers(
    workers: &[kvroute_updater::discovery::WorkerEntry],
    cfg: &kvroute_updater::discovery::DiscoveryConfig,
    port: Option<u16>,
) {
    use std::net::SocketAddr;
    let mut prev: Option<SocketAddr> = None;
    for w in workers {
        let http: SocketAddr = w.http.parse().expect("a worker's HTTP address is ip:port");
        assert_ne!(http.port(), 0, "{w:?}");
        assert!(port.is_none_or(|p| http.port() == p), "{w:?} not on {port:?}");
        assert!(prev.is_none_or(|p| p < http), "{w:?} out of order or twice");
        prev = Some(http);
        let at = |p: Option<u16>| p.map(|p| format!("tcp://{}", SocketAddr::new(http.ip(), p)));
        assert_eq!(w.events, at(cfg.events_port), "{w:?}");
        assert_eq!(w.replay, at(cfg.events_port.and(cfg.replay_port)), "{w:?}");
        assert_eq!((&w.labels.site, &w.labels.rack), (&cfg.site, &None), "{w:?}");
    }
}

/// The Kubernetes API server's watch stream (newline-delimited `WatchEvent`s), as the
/// updater's watch loop reads it, applied to three collections' objects: a Service's
/// EndpointSlices by port name and by configured port, and an InferencePool's pods on its
/// target port. Read in one piece and in chunks (the first byte picks their size) it ends the
/// same, with the same workers after each event; every worker is a valid address on the
/// collection's port with the configured event and replay ports; an event that is neither
/// ADDED, MODIFIED nor DELETED changes no worker; the collections agree on how the stream ends
/// and on the version; and a DELETED of every name seen leaves no worker.
pub fn kube_watch_event(data: &[u8]) {
    use std::collections::{BTreeMap, BTreeSet};

    use kvroute_updater::discovery::kube::{
        take_events, Api, Collection, Objects, PoolTarget, WatchEvent,
    };
    use kvroute_updater::discovery::{DiscoveryConfig, DiscoverySource};
    let api = Api {
        base: "https://127.0.0.1:6443".into(),
        token_file: None,
        namespace: "ns".into(),
        service: "vllm".into(),
    };
    let kube = DiscoverySource::Kube { namespace: "ns".into(), service: "vllm".into() };
    // The port named `http` wins over `http_port`; events and replay on fixed ports.
    let by_name = DiscoveryConfig {
        source: kube.clone(),
        port_name: Some("http".into()),
        http_port: Some(9000),
        events_port: Some(5557),
        replay_port: Some(5558),
        ..Default::default()
    };
    let by_port = DiscoveryConfig {
        source: kube,
        http_port: Some(8000),
        events_port: Some(5557),
        ..Default::default()
    };
    let pool = DiscoveryConfig {
        source: DiscoverySource::KubePool { namespace: "ns".into(), pool: "vllm".into() },
        events_port: Some(5557),
        replay_port: Some(5558),
        ..Default::default()
    };
    let target = PoolTarget { labels: BTreeMap::from([("app".into(), "vllm".into())]), port: 8000 };
    let collections = [
        (Collection::endpoint_slices(&api, &by_name), &by_name, None),
        (Collection::endpoint_slices(&api, &by_port), &by_port, Some(8000)),
        (Collection::pool_pods(&api, &target), &pool, Some(target.port)),
    ];

    // The events the loop applies, by the rule it follows: complete lines, blank ones
    // skipped, up to the first that is not a watch event or is an ERROR.
    let complete = data.iter().rposition(|b| *b == b'\n').map_or(&[][..], |end| &data[..end]);
    let mut kinds = Vec::new();
    let mut relist = false;
    let mut names = BTreeSet::new();
    for line in complete.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<WatchEvent>(line) {
            Ok(ev) if ev.kind != "ERROR" => {
                if let Some(n) = ev.object["metadata"]["name"].as_str() {
                    names.insert(n.to_owned());
                }
                kinds.push(ev.kind);
            }
            _ => {
                relist = true;
                break;
            }
        }
    }

    let step = data.first().map_or(1, |b| usize::from(*b % 64) + 1);
    let mut first: Option<WatchRun> = None;
    for (c, cfg, port) in &collections {
        let mut objects = Objects::default();
        let whole = watch_stream(data, data.len(), c, cfg, *port, &mut objects);
        let chunked = watch_stream(data, step, c, cfg, *port, &mut Objects::default());
        assert_eq!(whole, chunked);
        assert_eq!(whole.end.is_err(), relist, "{:?}", whole.end);
        assert_eq!(whole.after_each.len(), kinds.len());
        let mut before: &[_] = &[];
        for (kind, after) in kinds.iter().zip(&whole.after_each) {
            if !matches!(kind.as_str(), "ADDED" | "MODIFIED" | "DELETED") {
                assert_eq!(before, &after[..], "a {kind} event changed the workers");
            }
            before = after;
        }
        // Which objects were seen depends on the collection; how the stream ends does not.
        if let Some(f) = &first {
            assert_eq!(
                (&f.end, &f.version, f.after_each.len()),
                (&whole.end, &whole.version, whole.after_each.len())
            );
        }
        // Every name seen, deleted (through the same loop): nothing is left.
        let mut deletes = Vec::new();
        for n in &names {
            let ev = serde_json::json!({"type": "DELETED", "object": {"metadata": {"name": n}}});
            deletes.extend(serde_json::to_vec(&ev).unwrap());
            deletes.push(b'\n');
        }
        let mut version = whole.version.clone();
        assert!(take_events(&mut deletes, c, &mut objects, &mut version, |_| {}).is_ok());
        assert!(deletes.is_empty());
        assert_eq!(version, whole.version);
        assert!(objects.workers(cfg).is_empty(), "workers left after deleting {names:?}");
        first.get_or_insert(whole);
    }
}

/// Request bodies come straight from clients, and the filter edits the engine priority of
/// every admitted one: the first byte picks the value set (`byte - 128`), the rest is the body.
/// Any bytes get an answer, never a panic; a body Python reads as an object is edited (never an
/// error), and the edited body reads as the same object with only its top-level `priority` set
/// (or removed): no spelling or duplicate of the key keeps a client's own value.
pub fn priority_field(data: &[u8]) {
    use kvroute_core::decision::admission::priority_field::{rewrite, PriorityEdit};
    use serde_json::Value;
    let n = i64::from(data.first().copied().unwrap_or(0)) - 128;
    let body = data.get(1..).unwrap_or_default();
    let before = pyjson::from_body(body).ok().map(|p| p.value).filter(Value::is_object);
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("priority");
        }
        v
    };
    for (edit, want) in [(PriorityEdit::Remove, None), (PriorityEdit::Set(n), Some(Value::from(n)))]
    {
        let out = rewrite(body, edit);
        let Some(before) = &before else { continue };
        let after = match out.expect("a body Python reads as an object is edited") {
            Some(b) => pyjson::from_body(&b).expect("the edited body reads").value,
            None => before.clone(),
        };
        assert_eq!(strip(&after), strip(before), "only `priority` changes");
        assert_eq!(after.get("priority"), want.as_ref(), "{edit:?}");
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::TARGETS;

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    fn corpus(target: &str) -> Vec<PathBuf> {
        let dir = root().join("corpus").join(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        files
    }

    /// Every file of `fuzz_targets/` is in [`TARGETS`] and the other way round.
    #[test]
    fn every_fuzz_target_is_listed() {
        let mut on_disk: Vec<String> = std::fs::read_dir(root().join("fuzz_targets"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }

    /// Replays every committed seed of every target through the target's own code, each on
    /// its own thread with Rust's default 2 MiB stack (a tokio worker's too): a stack overflow
    /// aborts the run, and the abort message names the thread, i.e. the target and the seed.
    #[test]
    fn committed_corpus_replays() {
        for (name, run) in TARGETS {
            let files = corpus(name);
            assert!(files.len() >= 3, "corpus/{name}/ has {} seeds, want a handful", files.len());
            for f in files {
                let data = std::fs::read(&f).unwrap();
                let seed = f.file_name().unwrap().to_string_lossy();
                let r = std::thread::Builder::new()
                    .name(format!("{name}/{seed}"))
                    .spawn(move || run(&data))
                    .unwrap()
                    .join();
                assert!(r.is_ok(), "{name} panics on {}", f.display());
            }
        }
    }
}
