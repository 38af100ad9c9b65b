//! The docker compose demo (docker-compose.yml, Dockerfile, deploy/compose/), checked without a
//! container engine: Compose itself accepts the file; every command line that runs one of our
//! binaries uses only their real flags and parses (the updater's `--check`, the harness's
//! `--dry-run`, a simulator started with the same flags); the addresses, ports, header, token
//! and module paths agree across the compose file, the Envoy bootstrap, the filter and sync
//! configurations (through kvroute's own parsers) and the harness's topology; the bootstrap is
//! envoy/kvroute.yaml filled in and passes `envoy --mode validate`; the images pin the tested
//! toolchain and Envoy.

#[path = "compose/file.rs"]
mod file;
#[path = "compose/flags.rs"]
mod flags;
#[path = "compose/stack.rs"]
mod stack;

use std::process::Command;

use file::{command, read, repo_file, value, values, Compose, OUR_BINARIES};
use kvroute_stack::{envoy, paths};
use stack::{Bootstrap, Demo};

/// The compose tools on this machine: `docker compose` and/or `docker-compose`.
fn compose_tools() -> Vec<Vec<&'static str>> {
    let works = |argv: &[&str]| {
        Command::new(argv[0])
            .args(&argv[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let tools: Vec<Vec<&str>> = [vec!["docker", "compose"], vec!["docker-compose"]]
        .into_iter()
        .filter(|t| works(t))
        .collect();
    let missing = "neither `docker compose` nor `docker-compose` works here: install one \
         (Debian/Ubuntu: `apt-get install -y docker-compose`; .ci/run does it in CI)";
    // In CI the compose file must be checked by the tool itself; elsewhere the check says it
    // was skipped (the file's own checks below still run).
    assert!(!tools.is_empty() || std::env::var_os("CI").is_none(), "{missing}");
    if tools.is_empty() {
        paths::skipped("kvroute-integration compose::compose_config_accepts_the_file", missing);
    }
    tools
}

/// `config` of every compose tool, with the token file given or not; returns the outputs.
fn compose_config(token_file: Option<&std::path::Path>) -> Vec<serde_yaml_ng::Value> {
    let root = paths::repo_root();
    let mut outs = Vec::new();
    for tool in compose_tools() {
        let mut cmd = Command::new(tool[0]);
        cmd.args(&tool[1..])
            .arg("--project-directory")
            .arg(&root)
            .arg("-f")
            .arg(root.join("docker-compose.yml"))
            .arg("config")
            .current_dir(&root);
        for v in ["KVROUTE_UPDATER_TOKEN_FILE", "KVROUTE_UID", "KVROUTE_GID", "COMPOSE_FILE"] {
            cmd.env_remove(v);
        }
        if let Some(f) = token_file {
            cmd.env("KVROUTE_UPDATER_TOKEN_FILE", f);
        }
        let out = cmd.output().expect("running the compose tool");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{} config failed:\n{err}", tool.join(" "));
        outs.push(serde_yaml_ng::from_slice(&out.stdout).expect("config prints YAML"));
    }
    outs
}

#[test]
fn compose_config_accepts_the_file() {
    let mut expected =
        vec!["bench", "envoy", "init", "updater", "worker-1", "worker-2", "worker-3"];
    expected.sort();
    let default_secret = repo_file("deploy/compose/token.default");
    assert_eq!(
        std::fs::metadata(&default_secret).expect("deploy/compose/token.default").len(),
        0,
        "the default token file must stay empty (init then generates a random token)"
    );
    for cfg in compose_config(None) {
        let services = cfg["services"].as_mapping().expect("services");
        let mut names: Vec<&str> = services.keys().filter_map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, expected);
        let secret = cfg["secrets"]["kvroute_updater_token"]["file"].as_str().expect("secret file");
        assert!(secret.ends_with("deploy/compose/token.default"), "{secret}");
    }
    // A token file of the user's replaces the default through the environment.
    let dir = paths::scratch_dir("compose-config").unwrap();
    let mine = dir.join("my-token");
    std::fs::write(&mine, "0123456789abcdef0123").unwrap();
    for cfg in compose_config(Some(&mine)) {
        let secret = cfg["secrets"]["kvroute_updater_token"]["file"].as_str().expect("secret file");
        let secret = std::path::Path::new(secret).canonicalize().unwrap();
        assert_eq!(secret, mine.canonicalize().unwrap());
    }
}

#[tokio::test]
async fn commands_use_only_the_binaries_real_flags_and_parse() {
    let c = Compose::load();
    let mut checked = Vec::new();
    for name in c.service_names() {
        let argv = command(c.service(&name));
        if let Some(script) = file::script(c.service(&name)) {
            for bin in OUR_BINARIES {
                assert!(!script.contains(bin), "{name}: run {bin} in exec form, not in a script");
            }
            continue;
        }
        let Some(bin) = argv.first().filter(|b| OUR_BINARIES.contains(&b.as_str())) else {
            continue;
        };
        let known = flags::help_flags(bin);
        let problems = flags::problems(&argv[1..], &known);
        assert!(problems.is_empty(), "{name}: `{}`: {problems:?}", argv.join(" "));
        checked.push(bin.clone());
    }
    checked.sort();
    assert_eq!(
        checked,
        ["kvroute-bench", "kvroute-sim", "kvroute-sim", "kvroute-sim", "kvroute-updater"],
        "the services running our binaries"
    );
    // Beyond the names: each command line, as the binary itself parses it.
    let demo = Demo::load(&c);
    demo.updater_check();
    demo.bench_dry_run();
    demo.start_sims().await;
}

#[test]
fn addresses_ports_header_and_token_agree() {
    let c = Compose::load();
    let demo = Demo::load(&c);
    let boot = Bootstrap::load(&demo.bootstrap_path);
    let addrs: Vec<String> = demo.workers.iter().map(|w| w.http.clone()).collect();

    // Envoy's cluster and the filter's pool list the workers identically.
    assert_eq!(boot.cluster_endpoints("workers"), addrs, "the workers cluster");
    let filter = boot.filter_config();
    assert_eq!(filter.models.len(), 1);
    assert_eq!(filter.models[0].workers, addrs, "the filter's workers");
    // The routing header: the filter writes it, override_host reads it, clients' copies go.
    assert_eq!(boot.override_host_header("workers"), filter.destination_header);
    assert!(boot.stripped_headers().contains(&filter.destination_header));
    assert_eq!(boot.wasm_failure_policy(), "FAIL_RELOAD");

    // The updater follows exactly these workers, serves where the bootstrap's cluster points,
    // and follows this Envoy's admin and cluster.
    let u = &demo.updater;
    let want: Vec<String> =
        demo.workers.iter().map(|w| format!("{},{},{}", w.http, w.events, w.replay)).collect();
    assert_eq!(values(u, "--worker"), want, "the updater's --worker list");
    let listen: std::net::SocketAddr = value(u, "--listen", "127.0.0.1:9100").parse().unwrap();
    let (ip, port) = boot.cluster_endpoints("kvroute_updater")[0]
        .rsplit_once(':')
        .map(|(a, p)| (a.to_owned(), p.parse::<u16>().unwrap()))
        .unwrap();
    assert_eq!((ip.as_str(), port), (c.ipv4("updater").as_str(), listen.port()));
    assert!(listen.ip().is_unspecified() || listen.ip().to_string() == ip, "{listen}");
    let admin = format!("http://{}:{}", c.ipv4("envoy"), boot.admin_port());
    assert_eq!(value(u, "--envoy-admin", ""), admin);
    let cluster = value(u, "--envoy-cluster", "workers");
    assert_eq!(boot.override_host_header(cluster), filter.destination_header);
    let sync = boot.sync_config();
    assert_eq!(sync.cluster, "kvroute_updater");
    assert!(sync.token.len() >= 16);

    // One token file: the updater reads it, Envoy's command exports it under the name the
    // singleton reads, both from the volume init writes it to. No token anywhere in the file.
    let token = value(u, "--token-file", "");
    assert_eq!(demo.envoy_token_file, token);
    assert_eq!(boot.token_env(), demo.envoy_token_env);
    assert!(values(u, "--token").is_empty(), "a --token on a command line");
    for name in c.service_names() {
        let env = serde_yaml_ng::to_string(&c.service(&name)["environment"]).unwrap();
        assert!(!env.contains("TOKEN"), "{name}: a token in the environment: {env}");
    }
    demo.assert_volume_written_by_init("updater", token, "token");
    demo.assert_volume_written_by_init("envoy", &boot.wasm_filenames()[0], "module");
    assert!(read(&repo_file("Dockerfile")).contains("/opt/kvroute/kvroute_filter.wasm"));
    let init = file::script(c.service("init")).unwrap();
    assert!(init.contains("cp /opt/kvroute/kvroute_filter.wasm "), "{init}");

    // The harness's topology: the same workers, the same time compression, the sims' model.
    let topo = demo.topology();
    let ext = topo["workers"]["external"].as_array().expect("[[workers.external]]");
    let listed: Vec<String> = ext
        .iter()
        .map(|e| {
            format!(
                "{},{},{}",
                e["addr"].as_str().unwrap(),
                e["events"].as_str().unwrap(),
                e["replay"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(listed, want, "the topology's external workers");
    for w in &demo.workers {
        assert_eq!(Some(w.speedup), topo["workers"]["speedup"].as_float(), "{}: speedup", w.http);
        assert_eq!(w.model, "kvroute-demo");
    }
    assert_eq!(topo["workers"]["model"].as_str(), Some("demo"));

    // Published ports: loopback only, and the ones the bootstrap and the updater listen on.
    demo.assert_published("envoy", &[boot.listener_port(), boot.admin_port()]);
    demo.assert_published("updater", &[listen.port()]);
    demo.assert_fixed_addresses();
}

#[test]
fn bootstrap_is_the_reference_template_filled_in() {
    let c = Compose::load();
    let demo = Demo::load(&c);
    let boot = Bootstrap::load(&demo.bootstrap_path);
    let addrs: Vec<String> = demo.workers.iter().map(|w| w.http.clone()).collect();
    let wasm = boot.wasm_filenames();
    assert!(
        wasm.len() == 2 && wasm[0] == wasm[1],
        "filter and singleton load one module: {wasm:?}"
    );
    let updater = boot.cluster_endpoints("kvroute_updater")[0].clone();
    let vars = [
        ("ADMIN_PORT", boot.admin_port().to_string()),
        ("LISTEN_PORT", boot.listener_port().to_string()),
        ("UPDATER_PORT", updater.rsplit_once(':').unwrap().1.to_owned()),
        ("WASM_PATH", wasm[0].clone()),
        ("ENDPOINTS", envoy::endpoints(&addrs).unwrap()),
        ("KVROUTE_CONFIG", boot.filter_config_text().trim_end().to_owned()),
    ];
    let template = read(&repo_file("envoy/kvroute.yaml"));
    let mut reference: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&envoy::render(&template, &vars).unwrap()).unwrap();
    // What the compose network changes on purpose: admin and listener on the container's
    // interfaces, the updater in its own container.
    reference["admin"]["address"]["socket_address"]["address"] = "0.0.0.0".into();
    reference["static_resources"]["listeners"][0]["address"]["socket_address"]["address"] =
        "0.0.0.0".into();
    let (ip, _) = updater.rsplit_once(':').unwrap();
    stack::cluster_mut(&mut reference, "kvroute_updater")["load_assignment"]["endpoints"][0]
        ["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] = ip.into();
    assert!(
        boot.doc == reference,
        "deploy/compose/envoy.yaml drifted from envoy/kvroute.yaml (beyond the compose \
         addresses): keep the hardening, timeouts and stats of the reference"
    );
}

#[tokio::test]
async fn mounted_bootstraps_pass_envoy_validate() {
    let c = Compose::load();
    let envoys: Vec<String> = c
        .service_names()
        .into_iter()
        .filter(|s| {
            c.service(s)["image"].as_str().is_some_and(|i| i.starts_with("envoyproxy/envoy:"))
        })
        .collect();
    assert_eq!(envoys, ["envoy"]);
    let dir = paths::scratch_dir("compose-validate").unwrap();
    let wasm = paths::wasm_path().unwrap();
    let mut validated = 0;
    for m in c.mounts("envoy").iter().filter(|m| m.bind && m.target.ends_with(".yaml")) {
        assert!(m.read_only, "{} is mounted writable", m.target);
        let boot = Bootstrap::load(std::path::Path::new(&m.source));
        let mut text = read(std::path::Path::new(&m.source));
        // Container-only paths: the module, from the volume init fills.
        for p in boot.wasm_filenames() {
            text = text.replace(&p, &wasm.display().to_string());
        }
        let local = dir.join(format!("validate-{validated}.yaml"));
        std::fs::write(&local, text).unwrap();
        let (ok, out) = envoy::validate(&local).await.unwrap();
        assert!(ok, "{} failed validation:\n{out}", m.source);
        assert!(out.contains("kvroute: configured"), "the filter did not load:\n{out}");
        validated += 1;
    }
    assert_eq!(validated, 1, "one bootstrap mounted into envoy");
}

#[test]
fn images_pin_the_tested_toolchain_and_envoy_and_run_unprivileged() {
    let c = Compose::load();
    let docker = read(&repo_file("Dockerfile"));
    let arg = |name: &str| {
        docker
            .lines()
            .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
            .unwrap_or_else(|| panic!("Dockerfile: no ARG {name}="))
            .trim()
            .to_owned()
    };
    let toolchain = read(&repo_file("rust-toolchain.toml"));
    let channel = toolchain.lines().find_map(|l| l.strip_prefix("channel = ")).unwrap();
    assert_eq!(arg("RUST_VERSION"), channel.trim_matches('"'));
    let out = Command::new(paths::envoy_bin().unwrap()).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout).to_string();
    let is_version =
        |s: &&str| s.split('.').count() == 3 && s.split('.').all(|n| n.parse::<u32>().is_ok());
    let tag = version.split('/').find(is_version).expect("envoy --version: .../X.Y.Z/...");
    let image = format!("envoyproxy/envoy:v{tag}");
    assert_eq!(arg("ENVOY_IMAGE"), image, "the image's Envoy is the tested one");
    assert_eq!(c.service("envoy")["image"].as_str(), Some(image.as_str()));
    // Every image built here is a Dockerfile stage ending as the numeric non-root user, and
    // every service but the one-shot init runs as a non-root user (Envoy's image by `user:`).
    for name in c.service_names() {
        let s = c.service(&name);
        let user = match s["build"]["target"].as_str() {
            Some(target) => {
                let user = stack::final_user(&docker, target);
                assert_eq!(user, "10001:10001", "stage {target}: final USER");
                user
            }
            None => "root (an image not built here)".to_owned(),
        };
        let run_as = s["user"].as_str().map_or(user, String::from);
        let uid = run_as.split(':').next().unwrap_or("");
        let root = uid.is_empty() || uid == "0" || uid.starts_with("root");
        assert_eq!(root, name == "init", "{name} runs as '{run_as}'");
        if name == "init" {
            assert!(s["network_mode"].as_str() == Some("none"), "init (root) has no network");
        }
    }
    assert!(read(&repo_file(".dockerignore")).lines().any(|l| l.trim() == "target/"));
}
