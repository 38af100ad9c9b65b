//! The compose demo's pieces as the tests compare them: the workers, updater, Envoy and bench
//! services' settings ([`Demo`]) and the Envoy bootstrap they mount ([`Bootstrap`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvroute_core::decision::config::{FilterConfig, SnapshotSyncConfig};
use kvroute_stack::paths;
use kvroute_stack::process::Guard;
use serde_yaml_ng::Value;

use crate::compose::file::{command, flag_pairs, read, script, value, Compose};
use crate::compose::flags::{binary, help_flags};

/// One simulated worker service.
pub struct ComposeWorker {
    pub service: String,
    /// `ip:port`, as Envoy and the filter name it.
    pub http: String,
    pub events: String,
    pub replay: String,
    pub speedup: f64,
    pub model: String,
    args: Vec<String>,
}

pub struct Demo<'a> {
    c: &'a Compose,
    pub workers: Vec<ComposeWorker>,
    /// The updater's flags.
    pub updater: Vec<(String, String)>,
    updater_args: Vec<String>,
    bench_args: Vec<String>,
    pub bootstrap_path: PathBuf,
    pub envoy_token_file: String,
    pub envoy_token_env: String,
}

/// The only service running `bin`, and its arguments.
fn only(c: &Compose, bin: &str) -> (String, Vec<String>) {
    let s = c.running(bin);
    assert_eq!(s.len(), 1, "services running {bin}: {s:?}");
    let argv = command(c.service(&s[0]));
    (s[0].clone(), argv[1..].to_vec())
}

/// The word after `key` in `words`.
fn after<'w>(words: &[&'w str], key: &str) -> &'w str {
    let i = words.iter().position(|w| *w == key).unwrap_or_else(|| panic!("no {key}"));
    words.get(i + 1).copied().unwrap_or_else(|| panic!("nothing after {key}"))
}

impl<'a> Demo<'a> {
    pub fn load(c: &'a Compose) -> Demo<'a> {
        let sim_flags = help_flags("kvroute-sim");
        let mut workers = Vec::new();
        for service in c.running("kvroute-sim") {
            let args = command(c.service(&service))[1..].to_vec();
            let f = flag_pairs(&args, &sim_flags);
            assert_eq!(value(&f, "--workers", "1"), "1", "{service}: one worker per container");
            assert_eq!(value(&f, "--host", "127.0.0.1"), "0.0.0.0", "{service}: --host");
            let ip = c.ipv4(&service);
            let port = |flag: &str| {
                let p = value(&f, flag, "0");
                assert_ne!(p, "0", "{service}: {flag} must be fixed");
                p.to_owned()
            };
            workers.push(ComposeWorker {
                http: format!("{ip}:{}", port("--base-port")),
                events: format!("tcp://{ip}:{}", port("--events-base-port")),
                replay: format!("tcp://{ip}:{}", port("--replay-base-port")),
                speedup: value(&f, "--speedup", "1").parse().expect("--speedup"),
                model: value(&f, "--model", "kvroute-demo").to_owned(),
                service,
                args,
            });
        }
        assert_eq!(workers.len(), 3, "three simulated workers");
        let (_, updater_args) = only(c, "kvroute-updater");
        let updater = flag_pairs(&updater_args, &help_flags("kvroute-updater"));
        let (_, bench_args) = only(c, "kvroute-bench");
        let envoy = script(c.service("envoy")).expect("envoy: a /bin/sh -c script");
        let exec =
            envoy.lines().find(|l| l.trim_start().starts_with("exec envoy")).expect("exec envoy");
        let words: Vec<&str> = exec.split_whitespace().collect();
        let bootstrap_path = c.host_file("envoy", after(&words, "-c"));
        let cat = envoy.split("$$(cat ").nth(1).expect("the token read with $$(cat FILE)");
        let envoy_token_file = cat.split(')').next().unwrap().to_owned();
        let export = envoy.lines().find_map(|l| l.trim().strip_prefix("export ")).expect("export");
        Demo {
            c,
            workers,
            updater,
            updater_args,
            bench_args,
            bootstrap_path,
            envoy_token_file,
            envoy_token_env: export.trim().to_owned(),
        }
    }

    /// `args` with the value of `flag` replaced.
    fn with(args: &[String], flag: &str, new: &str) -> Vec<String> {
        let mut out = args.to_vec();
        let i = out.iter().position(|a| a == flag).unwrap_or_else(|| panic!("no {flag}"));
        out[i + 1] = new.to_owned();
        out
    }

    /// The updater's command line through its own `--check` (the token file a local one).
    pub fn updater_check(&self) {
        let dir = paths::scratch_dir("compose-updater").unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
        let mut args = Self::with(&self.updater_args, "--token-file", &token.display().to_string());
        args.push("--check".into());
        let out = std::process::Command::new(binary("kvroute-updater"))
            .args(&args)
            .env_remove("KVROUTE_UPDATER_TOKEN")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kvroute-updater {args:?} --check:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The harness's command line with `--dry-run` (the topology the mounted file, the report
    /// folder a scratch one): it loads the plan and the topology and makes the schedule.
    pub fn bench_dry_run(&self) {
        let dir = paths::scratch_dir("compose-bench").unwrap();
        let topo = self.topology_path();
        let args = Self::with(&self.bench_args, "--topology", &topo.display().to_string());
        let mut args = Self::with(&args, "--out", &dir.display().to_string());
        args.push("--dry-run".into());
        let out = std::process::Command::new(binary("kvroute-bench")).args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kvroute-bench {args:?}:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("3 external workers"), "{text}");
    }

    /// Every simulator started with its service's flags (on loopback, free ports) until it
    /// listens; stopped when its guard drops.
    pub async fn start_sims(&self) {
        let dir = paths::scratch_dir("compose-sims").unwrap();
        for w in &self.workers {
            let mut args = Self::with(&w.args, "--host", "127.0.0.1");
            for p in ["--base-port", "--events-base-port", "--replay-base-port"] {
                args = Self::with(&args, p, "0");
            }
            let mut cmd = tokio::process::Command::new(binary("kvroute-sim"));
            cmd.args(&args);
            let log = dir.join(format!("{}.log", w.service));
            let mut guard = Guard::spawn(&w.service, cmd, &log).unwrap();
            let started = guard.wait_line("listening on", Duration::from_secs(30)).await;
            assert!(started.is_ok(), "{}: kvroute-sim {args:?}:\n{}", w.service, read(&log));
        }
    }

    fn topology_path(&self) -> PathBuf {
        let i = self.bench_args.iter().position(|a| a == "--topology").expect("--topology");
        self.c.host_file("bench", &self.bench_args[i + 1])
    }

    pub fn topology(&self) -> toml::Value {
        toml::from_str(&read(&self.topology_path())).expect("the topology is TOML")
    }

    /// `path` of `service` lies in a named volume, read-only there, that `init` writes the
    /// same file into.
    pub fn assert_volume_written_by_init(&self, service: &str, path: &str, what: &str) {
        let m = self.c.mount_of(service, path);
        assert!(!m.bind && m.read_only, "{service}: the {what} must come from a read-only volume");
        let init = self.c.mounts("init").into_iter().find(|i| i.source == m.source);
        let init = init.unwrap_or_else(|| panic!("init does not mount {}", m.source));
        let rel = path.strip_prefix(&m.target).unwrap();
        let written = format!("{}{rel}", init.target);
        let script = script(self.c.service("init")).expect("init: a script");
        assert!(script.contains(&written), "init never writes the {what} ({written})");
    }

    /// `service` publishes exactly `ports` (same inside and out), on 127.0.0.1 only.
    pub fn assert_published(&self, service: &str, ports: &[u16]) {
        let list = self.c.service(service)["ports"].as_sequence().expect("ports");
        let mut inside = Vec::new();
        for p in list {
            let p = p.as_str().expect("ports as HOST_IP:HOST:CONTAINER strings");
            let parts: Vec<&str> = p.split(':').collect();
            assert_eq!(parts.len(), 3, "{service}: {p} does not name the host address");
            assert_eq!(parts[0], "127.0.0.1", "{service}: {p} is published beyond loopback");
            assert_eq!(parts[1], parts[2], "{service}: {p}");
            inside.push(parts[2].parse::<u16>().unwrap());
        }
        for name in self.c.service_names() {
            for p in self.c.service(&name)["ports"].as_sequence().into_iter().flatten() {
                let p = p.as_str().unwrap_or("");
                assert!(p.starts_with("127.0.0.1:"), "{name}: {p} is published beyond loopback");
            }
        }
        assert_eq!(inside, ports, "{service}: published ports");
    }

    /// Every service on the network has a fixed address of its own in the subnet, none the
    /// network's, gateway's (the first) or broadcast address, and nothing is left to Docker's
    /// allocator (which could hand a fixed address to whoever starts first).
    pub fn assert_fixed_addresses(&self) {
        let subnet = self.c.doc["networks"]["kvroute"]["ipam"]["config"][0]["subnet"].as_str();
        let (ip, bits) = subnet.expect("a fixed subnet").split_once('/').unwrap();
        let net = u32::from(ip.parse::<std::net::Ipv4Addr>().unwrap());
        let mask = u32::MAX << (32 - bits.parse::<u32>().unwrap());
        let mut seen = std::collections::BTreeSet::new();
        for name in self.c.service_names() {
            let s = self.c.service(&name);
            if s["network_mode"].as_str() == Some("none") {
                continue;
            }
            let ip = u32::from(self.c.ipv4(&name).parse::<std::net::Ipv4Addr>().unwrap());
            assert_eq!(ip & mask, net & mask, "{name}: outside the subnet");
            let host = ip & !mask;
            assert!(host > 1 && host < !mask, "{name}: network, gateway or broadcast address");
            assert!(seen.insert(ip), "{name}: an address already taken");
        }
    }
}

/// The cluster `name` of a bootstrap document.
pub fn cluster_mut<'v>(doc: &'v mut Value, name: &str) -> &'v mut Value {
    let clusters = doc["static_resources"]["clusters"].as_sequence_mut().expect("clusters");
    clusters.iter_mut().find(|c| c["name"].as_str() == Some(name)).expect("the cluster")
}

pub struct Bootstrap {
    pub doc: Value,
}

impl Bootstrap {
    pub fn load(path: &Path) -> Bootstrap {
        Bootstrap { doc: serde_yaml_ng::from_str(&read(path)).expect("the bootstrap is YAML") }
    }

    fn cluster(&self, name: &str) -> &Value {
        let clusters = self.doc["static_resources"]["clusters"].as_sequence().expect("clusters");
        clusters
            .iter()
            .find(|c| c["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no cluster {name} in the bootstrap"))
    }

    /// `ip:port` of every endpoint of cluster `name`.
    pub fn cluster_endpoints(&self, name: &str) -> Vec<String> {
        let c = self.cluster(name);
        assert_eq!(c["type"].as_str(), Some("STATIC"), "{name}: a STATIC cluster");
        let eps = c["load_assignment"]["endpoints"][0]["lb_endpoints"].as_sequence().unwrap();
        eps.iter()
            .map(|e| {
                let sa = &e["endpoint"]["address"]["socket_address"];
                format!(
                    "{}:{}",
                    sa["address"].as_str().unwrap(),
                    sa["port_value"].as_u64().unwrap()
                )
            })
            .collect()
    }

    pub fn override_host_header(&self, cluster: &str) -> String {
        let p = &self.cluster(cluster)["load_balancing_policy"]["policies"][0];
        let t = &p["typed_extension_config"]["typed_config"];
        t["override_host_sources"][0]["header"].as_str().expect("override_host header").to_owned()
    }

    fn http_filters(&self) -> &Vec<Value> {
        let l = &self.doc["static_resources"]["listeners"][0];
        l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"].as_sequence().unwrap()
    }

    fn http_filter(&self, name: &str) -> &Value {
        let f = self.http_filters().iter().find(|f| f["name"].as_str() == Some(name));
        &f.unwrap_or_else(|| panic!("no http filter {name}"))["typed_config"]
    }

    /// Headers the native header_mutation filter removes before the wasm filter.
    pub fn stripped_headers(&self) -> Vec<String> {
        let m = &self.http_filter("envoy.filters.http.header_mutation")["mutations"];
        let list = m["request_mutations"].as_sequence().expect("request_mutations");
        list.iter().filter_map(|r| r["remove"].as_str().map(String::from)).collect()
    }

    pub fn wasm_failure_policy(&self) -> String {
        let c = &self.http_filter("envoy.filters.http.wasm")["config"];
        c["failure_policy"].as_str().unwrap_or("FAIL_CLOSED").to_owned()
    }

    pub fn filter_config_text(&self) -> String {
        let c = &self.http_filter("envoy.filters.http.wasm")["config"];
        c["configuration"]["value"].as_str().expect("the filter configuration").to_owned()
    }

    /// The filter's configuration through kvroute's parser and validation.
    pub fn filter_config(&self) -> FilterConfig {
        FilterConfig::from_json(self.filter_config_text().as_bytes())
            .unwrap_or_else(|e| panic!("the bootstrap's filter configuration: {e}"))
    }

    fn singleton(&self) -> &Value {
        let ext = self.doc["bootstrap_extensions"].as_sequence().expect("bootstrap_extensions");
        assert_eq!(ext.len(), 1);
        &ext[0]["typed_config"]["config"]
    }

    /// The singleton's sync configuration, parsed with its token variable set to a dummy.
    pub fn sync_config(&self) -> SnapshotSyncConfig {
        let text = self.singleton()["configuration"]["value"].as_str().expect("sync config");
        let want = self.token_env();
        let env = move |k: &str| (k == want).then(|| "x".repeat(32));
        SnapshotSyncConfig::from_json(text.as_bytes(), &env)
            .unwrap_or_else(|e| panic!("the singleton's configuration: {e}"))
            .expect("a snapshot_sync configuration")
    }

    /// The one environment variable the VM sees: the token's.
    pub fn token_env(&self) -> String {
        let keys = &self.singleton()["vm_config"]["environment_variables"]["host_env_keys"];
        let keys = keys.as_sequence().expect("host_env_keys");
        assert_eq!(keys.len(), 1, "{keys:?}");
        keys[0].as_str().unwrap().to_owned()
    }

    /// The module path of the filter and of the singleton.
    pub fn wasm_filenames(&self) -> Vec<String> {
        let local = |vm: &Value| vm["code"]["local"]["filename"].as_str().unwrap().to_owned();
        let filter = &self.http_filter("envoy.filters.http.wasm")["config"]["vm_config"];
        vec![local(filter), local(&self.singleton()["vm_config"])]
    }

    pub fn admin_port(&self) -> u16 {
        let p = &self.doc["admin"]["address"]["socket_address"]["port_value"];
        p.as_u64().expect("admin port") as u16
    }

    pub fn listener_port(&self) -> u16 {
        let l = &self.doc["static_resources"]["listeners"][0]["address"]["socket_address"];
        l["port_value"].as_u64().expect("listener port") as u16
    }
}

/// The final `USER` of Dockerfile stage `target` (following `FROM <stage>`).
pub fn final_user(dockerfile: &str, target: &str) -> String {
    let mut stage = String::new();
    let mut base: std::collections::BTreeMap<String, String> = Default::default();
    let mut user: std::collections::BTreeMap<String, String> = Default::default();
    for line in dockerfile.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|w| w.to_ascii_uppercase()) {
            Some(w) if w == "FROM" => {
                stage = words.get(3).copied().unwrap_or("").to_owned();
                base.insert(stage.clone(), words.get(1).copied().unwrap_or("").to_owned());
            }
            Some(w) if w == "USER" => {
                user.insert(stage.clone(), words.get(1).copied().unwrap_or("").to_owned());
            }
            _ => {}
        }
    }
    let mut s = target.to_owned();
    assert!(base.contains_key(&s), "Dockerfile has no stage {target}");
    loop {
        if let Some(u) = user.get(&s) {
            return u.clone();
        }
        match base.get(&s) {
            Some(b) if base.contains_key(b) => s = b.clone(),
            _ => return "root (no USER)".into(),
        }
    }
}
