//! The real flags of this repository's binaries, read from their `--help` (clap's long help:
//! every option on its own line, `--name <VALUE>` for options that take a value), and a check of
//! a command line against them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kvroute_stack::paths;

/// The release binary `name` (`$KVROUTE_SIM` / `$KVROUTE_UPDATER` where the harness honours
/// them, `$KVROUTE_BENCH` for the harness itself, else target/release/).
pub fn binary(name: &str) -> PathBuf {
    let found = match name {
        "kvroute-sim" => paths::sim_bin(),
        "kvroute-updater" => paths::updater_bin(),
        _ => {
            let p = std::env::var_os("KVROUTE_BENCH")
                .map(PathBuf::from)
                .unwrap_or_else(|| paths::repo_root().join("target/release").join(name));
            if p.exists() {
                Ok(p)
            } else {
                Err(anyhow::anyhow!("{} not found (run ./dev build)", p.display()))
            }
        }
    };
    found.unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

/// Long flag -> whether it takes a value, from `binary --help`.
pub fn help_flags(name: &str) -> BTreeMap<String, bool> {
    let out = std::process::Command::new(binary(name))
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running {name} --help: {e}"));
    assert!(out.status.success(), "{name} --help failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut flags = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let w = w.trim_end_matches(',');
            if let Some(flag) = w.strip_prefix("--").filter(|f| !f.is_empty()) {
                let takes =
                    words.get(i + 1).is_some_and(|n| n.starts_with('<') || n.starts_with("[<"));
                flags.insert(format!("--{flag}"), takes);
            }
        }
    }
    assert!(flags.contains_key("--help"), "{name} --help lists no --help: parsed nothing");
    flags
}

/// What is wrong with `args` (the binary's name not included) against `flags`: unknown flags,
/// a value missing or given to a switch, stray words.
pub fn problems(args: &[String], flags: &BTreeMap<String, bool>) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if !a.starts_with("--") {
            out.push(format!("stray argument '{a}' (no flag takes it)"));
            continue;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (a.as_str(), None),
        };
        match flags.get(name) {
            None => out.push(format!("unknown flag {name}")),
            Some(false) if inline.is_some() => out.push(format!("{name} takes no value")),
            Some(true) if inline.is_none() => match args.get(i) {
                Some(v) if !v.starts_with("--") => i += 1,
                _ => out.push(format!("{name} needs a value")),
            },
            _ => {}
        }
    }
    out
}

#[test]
fn the_checker_refuses_what_clap_would() {
    let flags: BTreeMap<String, bool> =
        [("--port".to_string(), true), ("--quiet".to_string(), false)].into_iter().collect();
    let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert!(problems(&argv("--port 1 --quiet --port=2"), &flags).is_empty());
    assert_eq!(problems(&argv("--prot 1"), &flags).len(), 2, "unknown flag, stray value");
    assert_eq!(problems(&argv("--port --quiet"), &flags), ["--port needs a value"]);
    assert_eq!(problems(&argv("--quiet=yes"), &flags), ["--quiet takes no value"]);
    assert_eq!(problems(&argv("--port"), &flags), ["--port needs a value"]);
}
