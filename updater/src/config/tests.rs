use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::CommandFactory;

use super::*;
use crate::cli::{resolve_from, Args, CliError};

const TOKEN: &str = "0123456789abcdef-test";

/// A fresh directory for one test's files (removed when dropped).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kvroute-config-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/updater.example.toml")
}

fn run(args: &[&str]) -> Result<crate::cli::Resolved, CliError> {
    resolve_from(std::iter::once("kvroute-updater").chain(args.iter().copied()))
}

fn config_err(r: Result<crate::cli::Resolved, CliError>) -> UpdaterConfigError {
    match r {
        Err(CliError::Config(e)) => e,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn the_example_parses_validates_and_documents_every_key() {
    let text = std::fs::read_to_string(example_path()).unwrap();
    let cfg = UpdaterConfig::from_toml(&text).unwrap();
    cfg.validate().unwrap();
    assert!(cfg.token_file.is_some(), "the example reads the token from a file");
    assert!(cfg.workers.len() >= 2 && cfg.models.len() >= 2);
    // Every key the config has is shown in the example (set or commented out).
    let keys = toml::Value::try_from(UpdaterConfig::default()).unwrap();
    let mut keys: Vec<String> = keys.as_table().unwrap().keys().cloned().collect();
    keys.extend(["token_file", "block_size", "envoy_admin"].map(String::from));
    for key in keys {
        let shown = text.lines().any(|l| {
            let l = l.trim_start_matches(['#', ' ']);
            l.starts_with(&format!("{key} =")) || l.starts_with(&format!("[[{key}]]"))
        });
        assert!(shown, "the example does not show `{key}`");
    }
    for key in ["dir", "block_size", "http", "events", "replay"] {
        assert!(text.contains(&format!("{key} =")), "the example does not show `{key}`");
    }
}

#[test]
fn every_flag_has_a_config_key() {
    let keys = toml::Value::try_from(UpdaterConfig::default()).unwrap();
    let keys = keys.as_table().unwrap();
    let optional = ["block_size", "envoy_admin", "token_file"];
    // `[discovery]`: `--discover` is its `source`, each `--discover-X` its `X`.
    let discovery = toml::Value::try_from(crate::discovery::DiscoveryConfig {
        dns_server: Some("127.0.0.1:53".parse().unwrap()),
        http_port: Some(1),
        events_port: Some(1),
        replay_port: Some(1),
        port_name: Some("x".into()),
        kube_api: Some("x".into()),
        kube_token_file: Some("x".into()),
        kube_ca_file: Some("x".into()),
        site: Some("x".into()),
        ..Default::default()
    })
    .unwrap();
    let discovery = discovery.as_table().unwrap();
    let not_in_file = ["help", "version", "config", "check", "token", "model_block_sizes"];
    for arg in Args::command().get_arguments() {
        let id = arg.get_id().as_str();
        if not_in_file.contains(&id) {
            continue;
        }
        if let Some(key) = id.strip_prefix("discover_") {
            assert!(discovery.contains_key(key), "--{id} has no [discovery] key");
            continue;
        }
        if id == "discover" {
            assert!(discovery.contains_key("source"));
            continue;
        }
        assert!(keys.contains_key(id) || optional.contains(&id), "--{id} has no config key");
    }
}

#[test]
fn defaults_match_the_library_limits() {
    assert_eq!(UpdaterConfig::default().limits(), Limits::default());
    let plain = run(&["--worker", "127.0.0.1:8000", "--token", TOKEN]).unwrap();
    let expected = UpdaterConfig {
        workers: vec!["127.0.0.1:8000".parse().unwrap()],
        ..UpdaterConfig::default()
    };
    assert_eq!(plain.config, expected);
    assert_eq!(plain.config.listen.to_string(), defaults::LISTEN);
}

#[test]
fn flags_override_the_file_and_the_file_overrides_defaults() {
    let dir = TempDir::new();
    dir.write("token", &format!("{TOKEN}\n"));
    let file = dir.write(
        "u.toml",
        r#"
listen = "127.0.0.1:9200"
token_file = "token"
scrape_interval_ms = 250
max_replay_ms = 7000
block_size = 32
[[models]]
name = "qwen3"
dir = "models/qwen3"
block_size = 16
[[models]]
name = "kvroute-demo"
[[workers]]
http = "127.0.0.1:8000"
events = "tcp://127.0.0.1:5557"
replay = "tcp://127.0.0.1:5558"
"#,
    );
    let path = file.to_str().unwrap();
    let r =
        run(&["--config", path, "--listen", "127.0.0.1:9300", "--max-replay-ms", "9000"]).unwrap();
    let c = &r.config;
    assert_eq!(c.listen.to_string(), "127.0.0.1:9300", "flag over file");
    assert_eq!(c.max_replay_ms, 9000, "flag over file");
    assert_eq!(c.scrape_interval_ms, 250, "file over default");
    assert_eq!(c.align_interval_ms, defaults::ALIGN_INTERVAL_MS, "default");
    assert_eq!(r.token.expose(), TOKEN, "the token file's newline is not part of the token");
    assert_eq!(c.models[0].dir.as_deref(), Some(dir.0.join("models/qwen3").as_path()));
    assert_eq!(c.block_sizes(), vec![("qwen3".into(), 16), ("kvroute-demo".into(), 32)]);
    let eps = c.endpoints();
    assert_eq!(eps[0].1.as_ref().unwrap().replay.as_deref(), Some("tcp://127.0.0.1:5558"));

    // Lists given as flags replace the file's lists; a per-model block size applies on top.
    let r = run(&[
        "--config",
        path,
        "--worker",
        "127.0.0.1:8100",
        "--worker",
        "127.0.0.1:8101,tcp://127.0.0.1:6000",
        "--model",
        "a",
        "--model-block-size",
        "a=64",
    ])
    .unwrap();
    assert_eq!(r.config.workers.len(), 2);
    assert_eq!(r.config.workers[1].events.as_deref(), Some("tcp://127.0.0.1:6000"));
    assert_eq!(r.config.block_sizes(), vec![("a".into(), 64)]);
    let r = run(&["--config", path, "--model-block-size", "qwen3=8"]).unwrap();
    assert_eq!(r.config.block_sizes()[0], ("qwen3".into(), 8));
    assert!(matches!(
        config_err(run(&["--config", path, "--model-block-size", "nope=8"])),
        UpdaterConfigError::UnknownModel(_)
    ));
}

#[test]
fn unknown_keys_are_refused() {
    for bad in [
        "listen = \"127.0.0.1:1\"\nlisten_addr = \"x\"\n",
        "[[workers]]\nhttp = \"127.0.0.1:8000\"\nevent = \"tcp://x\"\n",
        "[[models]]\nname = \"m\"\nblocksize = 16\n",
        "[limits]\nmax_frame_bytes = 1\n",
    ] {
        let err = UpdaterConfig::from_toml(bad).unwrap_err().to_string();
        assert!(err.contains("unknown field"), "{bad}: {err}");
    }
    let dir = TempDir::new();
    let file = dir.write("u.toml", "scrape_intervall_ms = 5\n");
    let err = config_err(run(&["--config", file.to_str().unwrap(), "--token", TOKEN]));
    assert!(matches!(err, UpdaterConfigError::Toml { .. }));
    assert!(err.to_string().contains("scrape_intervall_ms"), "{err}");
}

#[test]
fn the_token_comes_from_exactly_one_source() {
    let w = ["--worker", "127.0.0.1:8000"];
    assert!(matches!(config_err(run(&w)), UpdaterConfigError::NoToken));
    let dir = TempDir::new();
    let tf = dir.write("token", &format!("{TOKEN}\r\n"));
    let tf = tf.to_str().unwrap();
    let r = run(&[w[0], w[1], "--token-file", tf]).unwrap();
    assert_eq!(r.token.expose(), TOKEN);
    assert!(matches!(
        config_err(run(&[w[0], w[1], "--token-file", tf, "--token", TOKEN])),
        UpdaterConfigError::TokenTwice(_)
    ));
    let file = dir.write("u.toml", &format!("token_file = {tf:?}\n"));
    let file = file.to_str().unwrap();
    assert_eq!(run(&[w[0], w[1], "--config", file]).unwrap().token.expose(), TOKEN);
    assert!(matches!(
        config_err(run(&[w[0], w[1], "--config", file, "--token", TOKEN])),
        UpdaterConfigError::TokenTwice(_)
    ));
    let short = dir.write("short", "short\n");
    assert!(matches!(
        config_err(run(&[w[0], w[1], "--token-file", short.to_str().unwrap()])),
        UpdaterConfigError::ShortToken(_)
    ));
    let missing = dir.0.join("missing");
    assert!(matches!(
        config_err(run(&[w[0], w[1], "--token-file", missing.to_str().unwrap()])),
        UpdaterConfigError::Read { .. }
    ));
}

#[test]
fn the_token_is_never_shown() {
    let r = run(&["--worker", "127.0.0.1:8000", "--token", TOKEN]).unwrap();
    let shown = format!("{r:?}\n{}", r.config.to_toml());
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(format!("{:?}", r.token).contains("--token"));
}

#[test]
fn validation_errors_are_specific() {
    let base = || UpdaterConfig {
        workers: vec!["127.0.0.1:8000,tcp://127.0.0.1:1,tcp://127.0.0.1:2".parse().unwrap()],
        ..UpdaterConfig::default()
    };
    base().validate().unwrap();
    let check = |f: &dyn Fn(&mut UpdaterConfig), want: &str| {
        let mut c = base();
        f(&mut c);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(want), "{want}: {err}");
    };
    check(&|c| c.workers.clear(), "no worker");
    check(&|c| c.workers[0].http = "localhost".into(), "not ip:port");
    check(&|c| c.workers.push(c.workers[0].clone()), "twice");
    check(&|c| c.workers[0].events = None, "replay endpoint needs");
    check(&|c| c.workers[0].replay = Some(" ".into()), "empty events or replay");
    check(&|c| c.models.clear(), "no model");
    check(&|c| c.models.push(c.models[0].clone()), "configured twice");
    check(&|c| c.models[0].block_size = Some(0), "must be > 0");
    check(&|c| c.block_size = Some(0), "must be > 0");
    check(&|c| c.envoy_admin = Some("127.0.0.1:9901".into()), "http:// URL");
    check(&|c| c.envoy_cluster.clear(), "envoy_cluster");
    check(&|c| c.max_message_bytes = c.max_frame_bytes - 1, "must not exceed max_message_bytes");
    check(&|c| c.max_message_bytes = 0, "max_message_bytes must be > 0");
    check(&|c| c.max_batch_elements = 0, "max_batch_elements must be > 0");
    check(&|c| c.max_connections = 0, "max_connections must be > 0");
    check(&|c| c.header_read_timeout_ms = 0, "header_read_timeout_ms must be > 0");
    check(&|c| c.idle_timeout_ms = 0, "idle_timeout_ms must be > 0");
    let wire = base().limits().wire;
    assert_eq!((wire.max_message_bytes, wire.max_batch_elements), (64 << 20, 1 << 21));
    assert!(wire.max_message_bytes < wire.max_frame_bytes * wire.max_message_frames);
    let conns = base().conn_limits();
    assert_eq!(conns.max_connections, 4096);
    assert!(conns.idle_timeout.as_millis() > u128::from(crate::server::MAX_WAIT_MS));
    assert!("".parse::<WorkerEntry>().is_err());
    assert!("a,b,c,d".parse::<WorkerEntry>().is_err());
}

#[test]
fn discovery_comes_from_the_file_or_the_flags() {
    let dir = TempDir::new();
    let file = dir.write(
        "u.toml",
        r#"
[discovery]
source = "dns:vllm.ns.svc.cluster.local"
dns_server = "127.0.0.1:5353"
http_port = 8000
events_port = 5557
replay_port = 5558
max_ttl_ms = 10000
kube_ca_file = "ca.crt"
"#,
    );
    let path = file.to_str().unwrap();
    let r = run(&["--config", path, "--token", TOKEN, "--discover-min-ttl-ms", "200"]).unwrap();
    let d = r.config.discovery();
    assert_eq!(d.source.to_string(), "dns:vllm.ns.svc.cluster.local");
    assert_eq!(d.dns_server.unwrap().to_string(), "127.0.0.1:5353");
    assert_eq!((d.http_port, d.events_port, d.replay_port), (Some(8000), Some(5557), Some(5558)));
    assert_eq!((d.min_ttl_ms, d.max_ttl_ms), (200, 10_000));
    assert_eq!(d.kube_ca_file.as_deref(), Some(dir.0.join("ca.crt").as_path()));
    // Printed back (--check) and parsed again: the same.
    let again = UpdaterConfig::from_toml(&r.config.to_toml()).unwrap();
    assert_eq!(again.discovery(), UpdaterConfig { ..r.config.clone() }.discovery());
    // Flags alone.
    let r = run(&["--token", TOKEN, "--discover", "kube:ns/vllm", "--discover-port-name", "http"])
        .unwrap();
    let d = r.config.discovery();
    assert_eq!(
        (d.source.to_string().as_str(), d.port_name.as_deref()),
        ("kube:ns/vllm", Some("http"))
    );
    // Errors: a bad source, no port for dns:, workers and discovery together.
    assert!(run(&["--token", TOKEN, "--discover", "consul:x"]).is_err());
    let err = config_err(run(&["--token", TOKEN, "--discover", "dns:x"]));
    assert!(err.to_string().contains("HTTP port"), "{err}");
    let err =
        config_err(run(&["--token", TOKEN, "--discover", "dns+srv:x", "--worker", "127.0.0.1:1"]));
    assert!(err.to_string().contains("choose one"), "{err}");
    let bad = "[discovery]\nsource = \"dns:x\"\nhttp_port = 1\nttl = 5\n";
    assert!(UpdaterConfig::from_toml(bad).unwrap_err().to_string().contains("unknown field"));
}

/// Every argument of `kvroute-updater --help` says what it is for.
#[test]
fn help_is_complete() {
    let cmd = Args::command();
    assert!(cmd.get_about().is_some(), "no about");
    let missing: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.get_help().is_none() && a.get_long_help().is_none())
        .map(|a| a.get_id().to_string())
        .collect();
    assert!(missing.is_empty(), "arguments without help: {missing:?}");
    cmd.debug_assert();
}

#[test]
fn a_listed_worker_may_say_where_it_runs_and_prints_back() {
    let text =
        "[[workers]]\nhttp = \"127.0.0.1:8000\"\nlabels = { zone = \"a1\", node = \"n1\" }\n\
                [[workers]]\nhttp = \"127.0.0.1:8001\"\n[discovery]\nsite = \"a\"\n";
    let cfg = UpdaterConfig::from_toml(text).unwrap();
    assert_eq!(cfg.workers[0].labels.zone.as_deref(), Some("a1"));
    assert_eq!(cfg.discovery().site.as_deref(), Some("a"));
    let back = UpdaterConfig::from_toml(&cfg.to_toml()).unwrap();
    assert_eq!(back.workers, cfg.workers, "{}", cfg.to_toml());
    assert!(!cfg.to_toml().contains("labels = {}"), "no label: no table");
    let bad = "[[workers]]\nhttp = \"127.0.0.1:8000\"\nlabels = { region = \"x\" }\n";
    assert!(UpdaterConfig::from_toml(bad).is_err(), "an unknown label is refused");
    let r = run(&["--worker", "127.0.0.1:1", "--discover-site", "b", "--token", &"t".repeat(16)]);
    assert_eq!(r.unwrap().config.discovery().site.as_deref(), Some("b"));
}
