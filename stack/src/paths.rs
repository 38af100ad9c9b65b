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
///
/// Taken below the kernel's ephemeral range where there is room: a port in that range can be
/// given to an outgoing connection's local end between this check and the caller's bind (a
/// stack of a thousand workers keeps thousands of such connections), one below it cannot.
/// Elsewhere, or when no port there is free, the kernel picks one.
pub fn free_port() -> anyhow::Result<u16> {
    if let Some(port) = ephemeral_range().and_then(|(low, _)| free_below(low)) {
        return Ok(port);
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The lowest port [`free_port`] takes below the ephemeral range (under it: well-known and
/// registered services' ports).
const LOWEST_PICKED: u16 = 10_000;
/// Fewer ports than this between [`LOWEST_PICKED`] and the ephemeral range: not worth a search.
const FEWEST_PICKED: u16 = 1_000;
/// Ports tried below the ephemeral range before the kernel is asked.
const TRIES: u32 = 64;
/// Ports this process was given lately: not given again (the callers of [`free_port`] take a few
/// in a row before binding any).
const REMEMBERED: usize = 4_096;

static GIVEN: std::sync::Mutex<std::collections::VecDeque<u16>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// The kernel's range of local ports for outgoing connections (Linux), inclusive.
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut parts = text.split_whitespace().map(str::parse::<u16>);
    Some((parts.next()?.ok()?, parts.next()?.ok()?))
}

/// A loopback port in `[LOWEST_PICKED, low)` that binds now, tried at random (so that processes
/// searching together seldom meet); `None` when that span is too small or none of
/// the tried ports is free.
fn free_below(low: u16) -> Option<u16> {
    let span = low.checked_sub(LOWEST_PICKED).filter(|&s| s >= FEWEST_PICKED)?;
    let random = std::collections::hash_map::RandomState::new();
    let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let port = (0..TRIES)
        .map(|i| {
            LOWEST_PICKED + (std::hash::BuildHasher::hash_one(&random, i) % u64::from(span)) as u16
        })
        .filter(|p| !given.contains(p))
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())?;
    if given.len() >= REMEMBERED {
        given.pop_front();
    }
    given.push_back(port);
    Some(port)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_binds_and_lies_below_the_ephemeral_range_where_there_is_room() {
        for _ in 0..16 {
            let port = free_port().expect("a free port");
            let held = std::net::TcpListener::bind(("127.0.0.1", port));
            assert!(held.is_ok(), "port {port} did not bind");
            if let Some((low, _)) =
                ephemeral_range().filter(|(l, _)| *l >= LOWEST_PICKED + FEWEST_PICKED)
            {
                assert!(
                    (LOWEST_PICKED..low).contains(&port),
                    "port {port} not in [{LOWEST_PICKED}, {low})"
                );
            }
        }
    }

    #[test]
    fn no_room_below_the_range_leaves_the_choice_to_the_kernel() {
        assert_eq!(free_below(LOWEST_PICKED + FEWEST_PICKED - 1), None);
        assert_eq!(free_below(1_024), None);
        let port = free_below(LOWEST_PICKED + FEWEST_PICKED).expect("a port in a span of 1 000");
        assert!((LOWEST_PICKED..LOWEST_PICKED + FEWEST_PICKED).contains(&port));
    }

    #[test]
    fn a_port_given_lately_is_not_given_again() {
        let ports: Vec<u16> = (0..200).filter_map(|_| free_port().ok()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "a port was given twice: {ports:?}");
    }
}
