//! `--pin-envoy`: the in-Envoy point with Envoy's worker threads alone on one CPU and
//! everything else on the others.
//!
//! Envoy's worker threads (named `wrk:…`), where the filter decides, go to the last CPU this
//! process may use. Envoy's other threads go to the rest: its main thread, where the filter's
//! singleton takes in the updater's knowledge and publishes it, and its helpers. So do this
//! process, and with it the simulated workers and the updater it starts. On the project's
//! 2-core machine the simulator and the updater otherwise take Envoy's core now and then, and
//! on one CPU with the workers the singleton preempts a deciding thread each time knowledge
//! arrives. Both show in the decision time's tail, not in its median. Linux only: it reads
//! `/proc` and runs util-linux's `taskset`.

use std::process::Command;

use anyhow::Context;

/// Which CPUs Envoy gets and which the rest gets, as `taskset -c` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinning {
    envoy: String,
    rest: String,
}

impl Pinning {
    /// From the CPUs this process may use (`Cpus_allowed_list` in `/proc/self/status`): at
    /// least two are needed.
    pub fn from_proc() -> anyhow::Result<Pinning> {
        let status = std::fs::read_to_string("/proc/self/status")
            .context("--pin-envoy reads /proc/self/status (Linux only)")?;
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .context("no Cpus_allowed_list in /proc/self/status")?;
        Pinning::from_cpus(&parse_cpu_list(list.trim())?)
    }

    fn from_cpus(cpus: &[usize]) -> anyhow::Result<Pinning> {
        let Some((last, rest)) = cpus.split_last().filter(|(_, rest)| !rest.is_empty()) else {
            anyhow::bail!("--pin-envoy needs at least two CPUs, this process may use {cpus:?}");
        };
        let rest: Vec<String> = rest.iter().map(usize::to_string).collect();
        Ok(Pinning { envoy: last.to_string(), rest: rest.join(",") })
    }

    /// Moves this process (every thread; the processes it starts from now on inherit it) off
    /// Envoy's CPU.
    pub fn apply_rest(&self) -> anyhow::Result<()> {
        taskset(&["-a", "-p", "-c", &self.rest, &std::process::id().to_string()])
    }

    /// Moves Envoy's worker threads onto its CPU and its other threads to the rest; returns
    /// how many worker threads were moved. Envoy must be ready: its worker threads exist then
    /// (threads it starts later inherit their creator's CPUs). Without a thread named as a
    /// worker (another build's names), every thread goes to Envoy's CPU.
    pub fn apply_envoy(&self, pid: u32) -> anyhow::Result<usize> {
        let threads = threads(pid)?;
        let workers = threads.iter().filter(|(_, name)| is_worker(name)).count();
        for (tid, name) in &threads {
            let cpus = if workers == 0 || is_worker(name) { &self.envoy } else { &self.rest };
            let moved = taskset(&["-p", "-c", cpus, &tid.to_string()]);
            // A thread that ended since it was listed has nothing left to pin.
            let gone = || !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists();
            if moved.is_err() && !gone() {
                return moved.map(|()| 0);
            }
        }
        Ok(workers)
    }
}

/// Envoy names its worker threads `wrk:worker_<n>`.
fn is_worker(name: &str) -> bool {
    name.starts_with("wrk:")
}

/// The threads of process `pid`: id and name (`/proc/<pid>/task/<tid>/comm`).
fn threads(pid: u32) -> anyhow::Result<Vec<(u32, String)>> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for t in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let t = t?;
        let Ok(tid) = t.file_name().to_string_lossy().parse::<u32>() else { continue };
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        out.push((tid, name.trim().to_owned()));
    }
    Ok(out)
}

fn taskset(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("taskset")
        .args(args)
        .output()
        .context("running taskset (util-linux) for --pin-envoy")?;
    anyhow::ensure!(
        out.status.success(),
        "taskset {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// A Linux CPU list (`0-1`, `2,5-7`) as the CPUs it names, in increasing order.
fn parse_cpu_list(list: &str) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |s: &str| s.parse::<usize>().with_context(|| format!("CPU list {list:?}"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                anyhow::ensure!(a <= b && b - a < 4096, "CPU range {part:?} in {list:?}");
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_linux_writes_them() {
        assert_eq!(parse_cpu_list("0-1").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpu_list("2,5-7").unwrap(), vec![2, 5, 6, 7]);
        assert_eq!(parse_cpu_list("3").unwrap(), vec![3]);
        assert!(parse_cpu_list("1-x").is_err());
        assert!(parse_cpu_list("5-2").is_err());
    }

    #[test]
    fn envoy_gets_the_last_cpu_and_the_rest_the_others() {
        let p = Pinning::from_cpus(&[0, 1]).unwrap();
        assert_eq!(p, Pinning { envoy: "1".into(), rest: "0".into() });
        let p = Pinning::from_cpus(&[2, 5, 6, 7]).unwrap();
        assert_eq!(p, Pinning { envoy: "7".into(), rest: "2,5,6".into() });
        assert!(Pinning::from_cpus(&[0]).is_err(), "one CPU cannot be split");
    }

    #[test]
    fn envoys_worker_threads_are_told_by_name() {
        assert!(is_worker("wrk:worker_0"));
        assert!(!is_worker("envoy"));
        assert!(!is_worker("dog:main_thread"));
        assert!(!is_worker("GrpcGoogClient"));
    }

    #[test]
    fn a_process_lists_its_own_threads() {
        let me = threads(std::process::id()).unwrap();
        assert!(me.iter().any(|(tid, _)| *tid == std::process::id()), "{me:?}");
    }
}
