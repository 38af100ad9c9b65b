//! Where the built artifacts and the Envoy binary are. `./dev` builds and installs them; the
//! environment variables override the defaults.

use std::path::PathBuf;

use anyhow::Context;

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn existing(env: &str, default: PathBuf, hint: &str) -> anyhow::Result<PathBuf> {
    let p = std::env::var_os(env).map(PathBuf::from).unwrap_or(default);
    anyhow::ensure!(p.exists(), "{} not found ({hint}; or set {env})", p.display());
    p.canonicalize().with_context(|| format!("resolving {}", p.display()))
}

/// The Envoy binary: `$KVROUTE_ENVOY`, else `.venv/bin/envoy` (installed by `./dev`).
pub fn envoy_bin() -> anyhow::Result<PathBuf> {
    existing("KVROUTE_ENVOY", repo_root().join(".venv/bin/envoy"), "run ./dev setup")
}

/// The filter module: `$KVROUTE_WASM`, else the release build.
pub fn wasm_path() -> anyhow::Result<PathBuf> {
    let default = repo_root().join("target/wasm32-wasip1/release/kvroute_filter.wasm");
    existing("KVROUTE_WASM", default, "run ./dev build")
}

/// The simulator binary: `$KVROUTE_SIM`, else the release build.
pub fn sim_bin() -> anyhow::Result<PathBuf> {
    existing("KVROUTE_SIM", repo_root().join("target/release/kvroute-sim"), "run ./dev build")
}

/// The updater binary: `$KVROUTE_UPDATER`, else the release build.
pub fn updater_bin() -> anyhow::Result<PathBuf> {
    existing(
        "KVROUTE_UPDATER",
        repo_root().join("target/release/kvroute-updater"),
        "run ./dev build",
    )
}

/// `kvroute-doctor` (built with the updater by `./dev build`).
pub fn doctor_bin() -> anyhow::Result<PathBuf> {
    existing("KVROUTE_DOCTOR", repo_root().join("target/release/kvroute-doctor"), "run ./dev build")
}

/// `kvroute-up` (crate kvroute-tools, built by `./dev build`): `$KVROUTE_UP`, else the release
/// build.
pub fn up_bin() -> anyhow::Result<PathBuf> {
    existing("KVROUTE_UP", repo_root().join("target/release/kvroute-up"), "run ./dev build")
}

/// A fresh scratch directory for one stack's configs and logs.
pub fn scratch_dir(tag: &str) -> anyhow::Result<PathBuf> {
    let base = std::env::var_os("KVROUTE_SCRATCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/kvroute-scratch"));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = base.join(format!("{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A free loopback port (bound and released; the caller binds it soon after).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Records that `test` could not run here and why: on stderr and, under `./dev test`, as one
/// line of `$KVROUTE_SKIP_LOG`, which `./dev test` prints at the end (nothing skips silently).
pub fn skipped(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    let Some(log) = std::env::var_os("KVROUTE_SKIP_LOG") else { return };
    let line = format!("{test}: {}\n", reason.replace('\n', " "));
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&log);
    if let Err(e) = file.and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes())) {
        eprintln!("(could not append to {}: {e})", PathBuf::from(log).display());
    }
}

/// Whether this checkout sits beside `../shared` (the project's CI layout), where everything the
/// tests read from it must be present: a missing file there is a failure, not a skip.
pub fn beside_shared() -> bool {
    repo_root().join("../shared").is_dir()
}
