//! CPU time and memory of a process and its descendants, from /proc: `utime + stime` (and
//! `cutime + cstime`, the reaped children's) of every process in the tree, and the sums of
//! their `VmHWM` / `VmRSS`.

use std::collections::HashMap;

/// The fields of `/proc/<pid>/stat` this bench uses (clock ticks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub ppid: u32,
    /// `utime + stime + cutime + cstime`: this process's threads and its reaped children.
    pub ticks: u64,
}

/// Parses one `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may
/// hold spaces or parentheses itself, so the fields are counted from its last `)`.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (3), ppid (4), ... utime (14), stime (15), cutime (16), cstime (17).
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let ticks = field(14)? + field(15)? + field(16)? + field(17)?;
    Some(ProcStat { ppid: u32::try_from(field(4)?).ok()?, ticks })
}

/// A `kB` value of `/proc/<pid>/status` (`VmHWM`, `VmRSS`).
pub fn parse_status_kb(status: &str, key: &str) -> Option<u64> {
    let v = status.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    v.split_whitespace().next()?.parse().ok()
}

/// `root` and every process descending from it, given each live process's parent.
pub fn descendants(root: u32, parents: &HashMap<u32, u32>) -> Vec<u32> {
    let mut tree = vec![root];
    let mut i = 0;
    // Each pass adds the children of one member; a pid is added once (bounded by the map).
    while i < tree.len() && tree.len() <= parents.len() + 1 {
        let p = tree[i];
        let mut kids: Vec<u32> = parents
            .iter()
            .filter(|(c, pp)| **pp == p && !tree.contains(c))
            .map(|(c, _)| *c)
            .collect();
        kids.sort_unstable();
        tree.extend(kids);
        i += 1;
    }
    tree
}

fn stats() -> HashMap<u32, ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return HashMap::new() };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some((pid, parse_stat(&line)?))
    })
    .collect()
}

fn tree(root: u32) -> (Vec<u32>, HashMap<u32, ProcStat>) {
    let all = stats();
    let parents = all.iter().map(|(p, s)| (*p, s.ppid)).collect();
    (descendants(root, &parents), all)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's usual value, if that fails).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU seconds used so far by `root`'s tree (`None` when `root` is gone).
pub fn cpu_seconds(root: u32, ticks_per_s: f64) -> Option<f64> {
    let (pids, all) = tree(root);
    all.get(&root)?;
    let ticks: u64 = pids.iter().filter_map(|p| all.get(p)).map(|s| s.ticks).sum();
    Some(ticks as f64 / ticks_per_s)
}

/// Memory of `root`'s tree, kB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeMem {
    /// Sum of each process's peak resident set (`VmHWM`).
    pub hwm_kb: u64,
    /// Sum of each process's resident set now (`VmRSS`).
    pub rss_kb: u64,
}

/// [`TreeMem`] of `root`'s tree now (`None` when `root` is gone).
pub fn mem(root: u32) -> Option<TreeMem> {
    let (pids, _) = tree(root);
    let mut m = TreeMem::default();
    for (i, pid) in pids.iter().enumerate() {
        let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(s) => s,
            Err(_) if i > 0 => continue,
            Err(_) => return None,
        };
        m.hwm_kb += parse_status_kb(&status, "VmHWM").unwrap_or(0);
        m.rss_kb += parse_status_kb(&status, "VmRSS").unwrap_or(0);
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a ')' in it, as a Python thread may set.
        let line = "4242 (python3 (x) y) S 4200 4242 4200 0 -1 4194560 100 0 0 0 \
                    150 25 7 3 20 0 9 0 12345 1000000 2000 18446744073709551615";
        assert_eq!(parse_stat(line), Some(ProcStat { ppid: 4200, ticks: 150 + 25 + 7 + 3 }));
        assert_eq!(parse_stat("4242 (truncated) S 1"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn status_kb_values() {
        let status =
            "Name:\tenvoy\nVmPeak:\t 900000 kB\nVmHWM:\t  231000 kB\nVmRSS:\t  229500 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM"), Some(231_000));
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(229_500));
        assert_eq!(parse_status_kb(status, "VmSwap"), None);
        // A key that is a prefix of another is not confused with it.
        assert_eq!(parse_status_kb("VmRSSx:\t1 kB\n", "VmRSS"), None);
    }

    #[test]
    fn descendants_follow_parents_and_stay_bounded() {
        let parents: HashMap<u32, u32> =
            [(10, 1), (11, 10), (12, 10), (13, 11), (20, 1), (21, 20)].into_iter().collect();
        assert_eq!(descendants(10, &parents), vec![10, 11, 12, 13]);
        assert_eq!(descendants(21, &parents), vec![21]);
        // A cycle (pid reuse seen mid-scan) does not loop.
        let cyclic: HashMap<u32, u32> = [(1, 2), (2, 1)].into_iter().collect();
        assert_eq!(descendants(1, &cyclic), vec![1, 2]);
    }

    #[test]
    fn this_process_is_measured() {
        let me = std::process::id();
        assert!(cpu_seconds(me, clock_ticks()).is_some());
        let m = mem(me).expect("own /proc entry");
        assert!(m.hwm_kb >= m.rss_kb && m.rss_kb > 0);
    }
}
