//! Reading docker-compose.yml the way Compose does for what the tests need: services, their
//! command lines, bind mounts and named volumes, fixed addresses, and the flags of a command
//! line as (name, value) pairs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kvroute_stack::paths;
use serde_yaml_ng::Value;

/// The binaries of this repository a compose service may run.
pub const OUR_BINARIES: [&str; 3] = ["kvroute-sim", "kvroute-updater", "kvroute-bench"];

/// The parsed compose file (YAML anchors and merge keys applied).
pub struct Compose {
    pub doc: Value,
}

/// One volume entry of a service: `SOURCE:TARGET[:MODE]`.
#[derive(Debug, Clone)]
pub struct Mount {
    /// A bind mount's host path (resolved against the repository root) or a volume's name.
    pub source: String,
    pub target: String,
    pub bind: bool,
    pub read_only: bool,
}

impl Compose {
    pub fn load() -> Compose {
        let path = paths::repo_root().join("docker-compose.yml");
        let text = std::fs::read_to_string(&path).expect("docker-compose.yml at the repo root");
        let mut doc: Value = serde_yaml_ng::from_str(&text).expect("docker-compose.yml is YAML");
        doc.apply_merge().expect("merge keys");
        Compose { doc }
    }

    pub fn service_names(&self) -> Vec<String> {
        let services = self.doc["services"].as_mapping().expect("a services mapping");
        services.keys().map(|k| k.as_str().expect("service names are strings").to_owned()).collect()
    }

    pub fn service(&self, name: &str) -> &Value {
        let s = &self.doc["services"][name];
        assert!(s.is_mapping(), "no service {name} in docker-compose.yml");
        s
    }

    /// Services whose command runs `binary` (exec form, the binary first).
    pub fn running(&self, binary: &str) -> Vec<String> {
        self.service_names()
            .into_iter()
            .filter(|s| command(self.service(s)).first().map(String::as_str) == Some(binary))
            .collect()
    }

    /// A service's fixed address on the `kvroute` network.
    pub fn ipv4(&self, service: &str) -> String {
        let v = &self.service(service)["networks"]["kvroute"]["ipv4_address"];
        v.as_str().unwrap_or_else(|| panic!("{service}: no fixed ipv4_address")).to_owned()
    }

    pub fn mounts(&self, service: &str) -> Vec<Mount> {
        let Some(list) = self.service(service)["volumes"].as_sequence() else { return vec![] };
        list.iter()
            .map(|v| {
                let s = v.as_str().unwrap_or_else(|| panic!("{service}: short volume syntax"));
                let parts: Vec<&str> = s.split(':').collect();
                assert!((2..=3).contains(&parts.len()), "{service}: volume {s}");
                let bind = parts[0].starts_with('.') || parts[0].starts_with('/');
                let source = if bind {
                    paths::repo_root().join(parts[0]).display().to_string()
                } else {
                    parts[0].to_owned()
                };
                Mount {
                    source,
                    target: parts[1].to_owned(),
                    bind,
                    read_only: parts.get(2) == Some(&"ro"),
                }
            })
            .collect()
    }

    /// The mount of `service` that holds the container path `path`.
    pub fn mount_of(&self, service: &str, path: &str) -> Mount {
        self.mounts(service)
            .into_iter()
            .filter(|m| path == m.target || path.starts_with(&format!("{}/", m.target)))
            .max_by_key(|m| m.target.len())
            .unwrap_or_else(|| panic!("{service}: nothing is mounted at {path}"))
    }

    /// The host file behind container path `path` of `service` (a bind-mounted file).
    pub fn host_file(&self, service: &str, path: &str) -> PathBuf {
        let m = self.mount_of(service, path);
        assert!(m.bind, "{service}: {path} is in volume {}, not a host file", m.source);
        let rel = path.strip_prefix(&m.target).unwrap_or("").trim_matches('/');
        let source = PathBuf::from(m.source);
        if rel.is_empty() {
            source
        } else {
            source.join(rel)
        }
    }
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Null => vec![],
        Value::String(s) => vec![s.clone()],
        Value::Sequence(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                other => panic!("a command word that is not a string: {other:?}"),
            })
            .collect(),
        other => panic!("a command that is neither a string nor a list: {other:?}"),
    }
}

/// A service's `entrypoint` followed by its `command`.
pub fn command(service: &Value) -> Vec<String> {
    let mut argv = strings(&service["entrypoint"]);
    argv.extend(strings(&service["command"]));
    argv
}

/// A `sh -c` script of a service (entrypoint `/bin/sh -c`, the script as the command).
pub fn script(service: &Value) -> Option<String> {
    let argv = command(service);
    (argv.len() == 3 && argv[0] == "/bin/sh" && argv[1] == "-c").then(|| argv[2].clone())
}

/// The flags of `args` (the binary's name not included) as (name, value) pairs, for flags
/// named in `takes_value`'s keys; `--name=value` and `--name value` alike. Panics on anything
/// else: the command-line check ([`crate::compose::flags`]) has already refused it.
pub fn flag_pairs(args: &[String], takes_value: &BTreeMap<String, bool>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (a.as_str(), None),
        };
        let value = match (takes_value.get(name), inline) {
            (Some(true), Some(v)) => v,
            (Some(true), None) => it.next().cloned().unwrap_or_default(),
            (Some(false), _) => String::new(),
            (None, _) => panic!("unknown flag {name}"),
        };
        out.push((name.to_owned(), value));
    }
    out
}

/// Every value of `flag` in `pairs`.
pub fn values<'a>(pairs: &'a [(String, String)], flag: &str) -> Vec<&'a str> {
    pairs.iter().filter(|(n, _)| n == flag).map(|(_, v)| v.as_str()).collect()
}

/// The one value of `flag`, or `default` when it is not given.
pub fn value<'a>(pairs: &'a [(String, String)], flag: &str, default: &'a str) -> &'a str {
    let v = values(pairs, flag);
    assert!(v.len() <= 1, "{flag} given {} times", v.len());
    v.first().copied().unwrap_or(default)
}

/// The repository file at `rel`.
pub fn repo_file(rel: &str) -> PathBuf {
    paths::repo_root().join(rel)
}

/// `path`, read.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}
