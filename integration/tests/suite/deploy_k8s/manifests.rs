//! Loading every manifest under `deploy/k8s/` (multi-document YAML) and finding the objects
//! and fields the cross-checks compare.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context};
use serde::Deserialize;
use serde_json::Value;

/// One Kubernetes object from one YAML document.
#[derive(Debug, Clone)]
pub struct Doc {
    pub file: PathBuf,
    pub kind: String,
    pub name: String,
    pub namespace: String,
    pub body: Value,
}

/// Every object of every `.yaml`/`.yml` file under `dir` (recursively), in path order.
pub fn load_dir(dir: &Path) -> anyhow::Result<Vec<Doc>> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    files.sort();
    ensure!(!files.is_empty(), "no manifests under {}", dir.display());
    let mut docs = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let before = docs.len();
        for de in serde_yaml_ng::Deserializer::from_str(&text) {
            let y = serde_yaml_ng::Value::deserialize(de)
                .with_context(|| format!("{}: not valid YAML", f.display()))?;
            if y.is_null() {
                continue;
            }
            let body = serde_json::to_value(&y)
                .with_context(|| format!("{}: not representable as JSON", f.display()))?;
            docs.push(doc(&f, body)?);
        }
        ensure!(docs.len() > before, "{}: no object in it", f.display());
    }
    Ok(docs)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
    Ok(())
}

fn doc(file: &Path, body: Value) -> anyhow::Result<Doc> {
    let s = |ptr: &str| body.pointer(ptr).and_then(Value::as_str).map(str::to_owned);
    let what = file.display();
    ensure!(s("/apiVersion").is_some(), "{what}: an object without apiVersion");
    let kind = s("/kind").ok_or_else(|| anyhow!("{what}: an object without kind"))?;
    let name = s("/metadata/name").ok_or_else(|| anyhow!("{what}: a {kind} without a name"))?;
    // Cluster-scoped kinds have no namespace; every namespaced one here names its own.
    let namespace = s("/metadata/namespace").unwrap_or_default();
    if !matches!(kind.as_str(), "GatewayClass" | "Namespace") {
        ensure!(!namespace.is_empty(), "{what}: {kind} {name} has no metadata.namespace");
    }
    Ok(Doc { file: file.to_owned(), kind, name, namespace, body })
}

/// The one object of `kind` named `name`.
pub fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> anyhow::Result<&'a Doc> {
    let mut it = docs.iter().filter(|d| d.kind == kind && d.name == name);
    let d = it.next().ok_or_else(|| anyhow!("no {kind} named {name} under deploy/k8s"))?;
    ensure!(it.next().is_none(), "two {kind} objects named {name}");
    Ok(d)
}

/// The one object of `kind`, whatever its name (names derived from it are then checked where
/// they are used, e.g. Envoy Gateway's VM id from the EnvoyExtensionPolicy's name).
pub fn only<'a>(docs: &'a [Doc], kind: &str) -> anyhow::Result<&'a Doc> {
    let mut it = docs.iter().filter(|d| d.kind == kind);
    let d = it.next().ok_or_else(|| anyhow!("no {kind} under deploy/k8s"))?;
    ensure!(it.next().is_none(), "two {kind} objects (the checks expect one)");
    Ok(d)
}

/// The value at a JSON pointer, or an error naming where it was expected.
pub fn at<'a>(d: &'a Doc, ptr: &str) -> anyhow::Result<&'a Value> {
    d.body.pointer(ptr).ok_or_else(|| anyhow!("{} {}: no {ptr}", d.kind, d.name))
}

pub fn str_at<'a>(d: &'a Doc, ptr: &str) -> anyhow::Result<&'a str> {
    at(d, ptr)?.as_str().ok_or_else(|| anyhow!("{} {}: {ptr} is not a string", d.kind, d.name))
}

pub fn u64_at(d: &Doc, ptr: &str) -> anyhow::Result<u64> {
    at(d, ptr)?.as_u64().ok_or_else(|| anyhow!("{} {}: {ptr} is not a number", d.kind, d.name))
}

/// The one element of `list` (a JSON array) whose `key` field is `value`.
pub fn by_field<'a>(list: &'a Value, key: &str, value: &str) -> anyhow::Result<&'a Value> {
    let items = list.as_array().ok_or_else(|| anyhow!("expected a list holding {key}={value}"))?;
    let mut it = items.iter().filter(|v| v.get(key).and_then(Value::as_str) == Some(value));
    let found = it.next().ok_or_else(|| anyhow!("no element with {key}={value}"))?;
    ensure!(it.next().is_none(), "two elements with {key}={value}");
    Ok(found)
}

/// A container's command-line flags as (name, value) pairs; `--flag=value` and `--flag value`.
pub fn flags(args: &[String]) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for a in args {
        if let Some(flag) = a.strip_prefix("--") {
            match flag.split_once('=') {
                Some((k, v)) => out.push((k.to_owned(), Some(v.to_owned()))),
                None => out.push((flag.to_owned(), None)),
            }
        } else {
            match out.last_mut() {
                Some((_, v @ None)) => *v = Some(a.clone()),
                _ => bail!("argument '{a}' follows no flag"),
            }
        }
    }
    Ok(out)
}

/// The flags `--help` of a binary lists (every `--name` token).
pub fn help_flags(help: &str) -> Vec<String> {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter_map(|t| t.strip_prefix("--"))
        .map(|t| t.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).next().unwrap_or(""))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `ip:port` (or `tcp://ip:port`) -> port.
pub fn port_of(addr: &str) -> anyhow::Result<u16> {
    let a = addr.strip_prefix("tcp://").unwrap_or(addr);
    let (_, p) = a.rsplit_once(':').ok_or_else(|| anyhow!("'{addr}' has no port"))?;
    p.parse().with_context(|| format!("'{addr}': bad port"))
}

/// A Kubernetes quantity of bytes (`8Mi`, `8388608`, `1G`).
pub fn quantity_bytes(q: &str) -> anyhow::Result<u64> {
    let units: [(&str, u64); 6] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return Ok(n.parse::<u64>().with_context(|| format!("quantity '{q}'"))? * mult);
        }
    }
    q.parse().with_context(|| format!("quantity '{q}'"))
}
