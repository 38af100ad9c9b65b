//! Every plugin configuration shipped in the repository validates against its schema and is
//! accepted by the parser: the Envoy bootstraps under `envoy/` (rendered as the tests render
//! them), every YAML file under `deploy/` (compose bootstraps, Istio `WasmPlugin` and
//! `EnvoyFilter`, Envoy Gateway `EnvoyExtensionPolicy` and `EnvoyProxy`) and the JSON examples
//! of the README and of every page under `docs/`.

use std::path::{Path, PathBuf};

use kvroute_stack::stack::{filter_config, StackOptions};
use kvroute_stack::{envoy, paths};
use serde::Deserialize;
use serde_json::Value;

use super::agree::{parse_filter, parse_sync_in};
use super::{errors, validator, SCHEMAS};

/// Which plugin a configuration belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Filter,
    Sync,
}

/// One plugin configuration found in a file.
#[derive(Debug)]
struct Found {
    file: String,
    at: String,
    kind: Kind,
    config: Value,
    /// The VM's `environment_variables.host_env_keys` (what `token_env` may name).
    env_keys: Vec<String>,
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
}

/// `envoy/` templates rendered with the configuration the test stacks use; elsewhere only
/// `${KVROUTE_CONFIG}` is filled (other placeholders stay as text).
fn render(path: &Path, text: &str) -> String {
    let workers = vec!["127.0.0.1:18001".to_string(), "127.0.0.1:18002".to_string()];
    let filter = filter_config(&workers, &StackOptions::default()).to_string();
    if path.parent().is_some_and(|d| d.ends_with("envoy")) {
        let vars = [
            ("ADMIN_PORT", "19901".to_string()),
            ("LISTEN_PORT", "19000".to_string()),
            ("UPDATER_PORT", "19100".to_string()),
            ("WASM_PATH", "/kvroute_filter.wasm".to_string()),
            ("ENDPOINTS", envoy::endpoints(&workers).expect("endpoints")),
            ("KVROUTE_CONFIG", filter),
        ];
        return envoy::render(text, &vars).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    text.replace("${KVROUTE_CONFIG}", &filter)
}

fn classify(config: &Value) -> Kind {
    if config.get("snapshot_sync").is_some() {
        Kind::Sync
    } else {
        Kind::Filter
    }
}

/// Plugin configurations inside one parsed YAML document.
fn find(file: &str, at: &str, v: &Value, out: &mut Vec<Found>) {
    let mut push = |at: String, config: Value, env_keys: Vec<String>| {
        out.push(Found { file: file.into(), at, kind: classify(&config), config, env_keys })
    };
    match v {
        Value::Object(m) => {
            // Envoy's PluginConfig: vm_config + configuration (a StringValue holding JSON).
            if let (Some(vm), Some(c)) = (m.get("vm_config"), m.get("configuration")) {
                let keys =
                    vm.pointer("/environment_variables/host_env_keys").and_then(Value::as_array);
                let keys = keys.into_iter().flatten().filter_map(Value::as_str).map(String::from);
                let text = c.get("value").and_then(Value::as_str).unwrap_or_else(|| {
                    panic!("{file}: {at}.configuration is not a StringValue with a value")
                });
                let config: Value = serde_json::from_str(text).unwrap_or_else(|e| {
                    panic!("{file}: {at}.configuration.value is not JSON ({e}): {text}")
                });
                push(format!("{at}.configuration"), config, keys.collect());
            }
            // Istio WasmPlugin and Envoy Gateway EnvoyExtensionPolicy carry it as an object.
            match m.get("kind").and_then(Value::as_str) {
                Some("WasmPlugin") => {
                    if let Some(c) = v.pointer("/spec/pluginConfig") {
                        push(format!("{at}.spec.pluginConfig"), c.clone(), Vec::new());
                    }
                }
                Some("EnvoyExtensionPolicy") => {
                    let wasm = v.pointer("/spec/wasm").and_then(Value::as_array);
                    for (i, w) in wasm.into_iter().flatten().enumerate() {
                        if let Some(c) = w.get("config") {
                            push(format!("{at}.spec.wasm[{i}].config"), c.clone(), Vec::new());
                        }
                    }
                }
                _ => {}
            }
            for (k, x) in m {
                find(file, &format!("{at}.{k}"), x, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                find(file, &format!("{at}[{i}]"), x, out);
            }
        }
        // An Envoy configuration embedded as text (a ConfigMap's data, a bootstrap string).
        Value::String(s) if s.contains("vm_config") => {
            for doc in serde_yaml_ng::Deserializer::from_str(s) {
                if let Ok(inner) = Value::deserialize(doc) {
                    find(file, &format!("{at}(text)"), &inner, out);
                }
            }
        }
        _ => {}
    }
}

fn all_configs() -> Vec<Found> {
    let root = paths::repo_root();
    let mut files = Vec::new();
    yaml_files(&root.join("envoy"), &mut files);
    yaml_files(&root.join("deploy"), &mut files);
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable");
        let text = render(&path, &text);
        let file = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let v = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{file}: document {i} is not YAML: {e}"));
            find(&file, &format!("doc{i}"), &v, &mut out);
        }
    }
    for doc in markdown_docs() {
        out.extend(doc_configs(&doc));
    }
    out
}

/// README.md and every `.md` file under `docs/`, relative to the repository root.
pub(super) fn markdown_docs() -> Vec<String> {
    let root = paths::repo_root();
    let mut out = vec!["README.md".to_string()];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                let rel = path.strip_prefix(&root).unwrap_or(&path);
                out.push(rel.display().to_string());
            }
        }
    }
    out
}

/// The plugin configurations among a Markdown file's ```` ```json ```` blocks (a filter's:
/// `models` whose entries list `workers`; a singleton's: `snapshot_sync`). Others (`/status`)
/// are not.
fn doc_configs(file: &str) -> Vec<Found> {
    let text = std::fs::read_to_string(paths::repo_root().join(file)).expect(file);
    let mut out = Vec::new();
    for (i, block) in text.split("```json\n").skip(1).enumerate() {
        let body = block.split("\n```").next().unwrap_or_default();
        let v: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{file} json block {i} is not JSON ({e}): {body}"));
        let models = v.get("models").and_then(Value::as_array);
        let filter = models.is_some_and(|m| m.iter().all(|x| x.get("workers").is_some()));
        if filter || v.get("snapshot_sync").is_some() {
            let kind = classify(&v);
            out.push(Found {
                file: file.into(),
                at: format!("json block {i}"),
                kind,
                config: v,
                env_keys: Vec::new(),
            });
        }
    }
    out
}

#[test]
fn every_plugin_configuration_in_the_repo_validates() {
    let found = all_configs();
    let filter = validator(&(SCHEMAS[0].1)());
    let sync = validator(&(SCHEMAS[1].1)());
    let mut bad = Vec::new();
    for f in &found {
        let (v, parsed) = match f.kind {
            Kind::Filter => (&filter, parse_filter(&f.config)),
            // `token_env` must name a variable the VM is given.
            Kind::Sync => (
                &sync,
                parse_sync_in(&f.config, &|k| {
                    f.env_keys.iter().any(|e| e == k).then(|| "t".repeat(32))
                }),
            ),
        };
        let errs = errors(v, &f.config);
        if !errs.is_empty() {
            bad.push(format!("{} {}: {:?} fails its schema: {errs:?}", f.file, f.at, f.kind));
        }
        if let Err(e) = parsed {
            bad.push(format!("{} {}: {:?} refused by the parser: {e}", f.file, f.at, f.kind));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // The reference bootstrap holds both plugins; each kind is found somewhere.
    let count =
        |file: &str, kind: Kind| found.iter().filter(|f| f.file == file && f.kind == kind).count();
    assert_eq!(count("envoy/kvroute.yaml", Kind::Filter), 1, "{found:#?}");
    assert_eq!(count("envoy/kvroute.yaml", Kind::Sync), 1, "{found:#?}");
    let example = "docs/configuration.md";
    assert!(count(example, Kind::Filter) >= 1, "the example in {example} is not found");
    let files: std::collections::BTreeSet<&str> = found.iter().map(|f| f.file.as_str()).collect();
    eprintln!("validated {} plugin configurations in {files:?}", found.len());
}
