//! What the control planes do to a generated resource when they apply a patch, written for these
//! tests after the cited sources: Envoy Gateway's EnvoyPatchPolicy (a JSONPath that selects
//! places, a JSON pointer appended to each, an RFC 6902 `add`; Envoy Gateway v1.9.0,
//! internal/utils/jsonpatch/{patch.go,jsonpathtopointer.go}) and the protobuf merge that Istio's
//! EnvoyFilter MERGE, Envoy Gateway's bootstrap Merge and Envoy's `--config-yaml` share (objects
//! field by field, lists appended, scalars replaced).
//!
//! The JSONPath is the subset the manifests use: `$`, `.key`, `..key`, `[N]`, `[*]` and
//! `[?(@.key=='value')]`. Anything else is an error, never a silent non-match.

use anyhow::{anyhow, bail, ensure, Context};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Child(String),
    Descend(String),
    Index(usize),
    All,
    Filter(String, String),
}

fn parse(path: &str) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    let mut rest = path.strip_prefix('$').unwrap_or(path);
    // Envoy Gateway's examples also start without `$` or `.` ("virtual_hosts[0]").
    if !rest.is_empty() && !rest.starts_with('.') && !rest.starts_with('[') {
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        steps.push(Step::Child(rest[..end].to_owned()));
        rest = &rest[end..];
    }
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("..") {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            ensure!(end > 0, "JSONPath '{path}': '..' without a key");
            steps.push(Step::Descend(r[..end].to_owned()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            ensure!(end > 0, "JSONPath '{path}': '.' without a key");
            steps.push(Step::Child(r[..end].to_owned()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').with_context(|| format!("JSONPath '{path}': no ']'"))?;
            // A filter's value may hold ']' only inside its quotes.
            let (inner, after) = if r.starts_with("?(") {
                let close = r.find(")]").with_context(|| format!("JSONPath '{path}': no ')]'"))?;
                (&r[..close + 1], &r[close + 2..])
            } else {
                (&r[..end], &r[end + 1..])
            };
            steps.push(bracket(inner).with_context(|| format!("JSONPath '{path}'"))?);
            rest = after;
        } else {
            bail!("JSONPath '{path}': cannot read '{rest}'");
        }
    }
    Ok(steps)
}

fn bracket(inner: &str) -> anyhow::Result<Step> {
    if inner == "*" {
        return Ok(Step::All);
    }
    if let Ok(i) = inner.parse::<usize>() {
        return Ok(Step::Index(i));
    }
    let cond = inner
        .strip_prefix("?(")
        .and_then(|c| c.strip_suffix(')'))
        .ok_or_else(|| anyhow!("unsupported selector [{inner}]"))?;
    let (lhs, rhs) = cond.split_once("==").ok_or_else(|| anyhow!("unsupported filter {cond}"))?;
    let key = lhs.trim().strip_prefix("@.").ok_or_else(|| anyhow!("unsupported filter {cond}"))?;
    let rhs = rhs.trim();
    let value = rhs
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .or_else(|| rhs.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
        .ok_or_else(|| anyhow!("unsupported filter value {rhs}"))?;
    Ok(Step::Filter(key.to_owned(), value.to_owned()))
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn descend(ptr: &str, v: &Value, key: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{ptr}/{}", escape(k));
                if k == key {
                    out.push(p.clone());
                }
                descend(&p, child, key, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                descend(&format!("{ptr}/{i}"), child, key, out);
            }
        }
        _ => {}
    }
}

/// The JSON pointers `path` selects in `doc`, in document order.
pub fn select(doc: &Value, path: &str) -> anyhow::Result<Vec<String>> {
    let steps = parse(path)?;
    let mut at = vec![String::new()];
    for step in &steps {
        let mut next = Vec::new();
        for ptr in &at {
            let v = doc.pointer(ptr).expect("selected pointers exist");
            match step {
                Step::Child(k) => {
                    if v.get(k).is_some() && v.is_object() {
                        next.push(format!("{ptr}/{}", escape(k)));
                    }
                }
                Step::Descend(k) => descend(ptr, v, k, &mut next),
                Step::Index(i) => {
                    if v.as_array().is_some_and(|a| *i < a.len()) {
                        next.push(format!("{ptr}/{i}"));
                    }
                }
                Step::All => {
                    for i in 0..v.as_array().map_or(0, Vec::len) {
                        next.push(format!("{ptr}/{i}"));
                    }
                }
                Step::Filter(k, want) => {
                    for (i, e) in v.as_array().into_iter().flatten().enumerate() {
                        if e.get(k).and_then(Value::as_str) == Some(want.as_str()) {
                            next.push(format!("{ptr}/{i}"));
                        }
                    }
                }
            }
        }
        at = next;
    }
    Ok(at)
}

/// RFC 6902 `add` at `ptr`, creating missing parent objects (Envoy Gateway applies its patches
/// with EnsurePathExistsOnAdd).
pub fn add(doc: &mut Value, ptr: &str, value: Value) -> anyhow::Result<()> {
    ensure!(ptr.starts_with('/'), "'{ptr}' is not a JSON pointer");
    let (parent, last) = ptr.rsplit_once('/').expect("starts with /");
    let last = last.replace("~1", "/").replace("~0", "~");
    let mut cur = doc;
    for raw in parent.split('/').skip(1) {
        let key = raw.replace("~1", "/").replace("~0", "~");
        cur = match cur {
            Value::Object(m) => m.entry(key).or_insert_with(|| Value::Object(Default::default())),
            Value::Array(a) => {
                let i: usize = key.parse().with_context(|| format!("{ptr}: bad index"))?;
                a.get_mut(i).with_context(|| format!("{ptr}: no element {i}"))?
            }
            _ => bail!("{ptr}: cannot descend into a scalar"),
        };
    }
    match cur {
        Value::Object(m) => {
            m.insert(last, value);
        }
        Value::Array(a) if last == "-" => a.push(value),
        Value::Array(a) => {
            let i: usize = last.parse().with_context(|| format!("{ptr}: bad index"))?;
            ensure!(i <= a.len(), "{ptr}: index out of range");
            a.insert(i, value);
        }
        _ => bail!("{ptr}: the parent is a scalar"),
    }
    Ok(())
}

/// An Envoy Gateway JSONPatch operation on `doc`: the pointers of `jsonPath` (each with `path`
/// appended), or `path` alone. Only `add` is used by the manifests.
pub fn apply_operation(doc: &mut Value, op: &Value) -> anyhow::Result<()> {
    let kind = op.get("op").and_then(Value::as_str).context("operation without op")?;
    ensure!(kind == "add", "operation '{kind}' is not emulated here");
    let value = op.get("value").cloned().context("add without value")?;
    let path = op.get("path").and_then(Value::as_str).unwrap_or("");
    let pointers = match op.get("jsonPath").and_then(Value::as_str) {
        Some(jp) => {
            let found = select(doc, jp)?;
            ensure!(!found.is_empty(), "the jsonPath '{jp}' selects nothing");
            found
                .into_iter()
                .map(|p| {
                    if path.is_empty() {
                        p
                    } else {
                        format!("{}/{}", p.trim_end_matches('/'), path.trim_start_matches('/'))
                    }
                })
                .collect()
        }
        None => vec![path.to_owned()],
    };
    for p in pointers {
        add(doc, &p, value.clone())?;
    }
    Ok(())
}

/// Protobuf-style merge: objects field by field, lists appended, scalars replaced.
pub fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (a, b) => *a = b.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selects_by_descent_filter_and_child() {
        let doc = json!({"chains": [{"hcm": {"http_filters": [
            {"name": "a/b", "typed_config": {"config": {}}},
            {"name": "router"}
        ]}}]});
        let p = select(&doc, "..http_filters[?(@.name=='a/b')].typed_config.config").unwrap();
        assert_eq!(p, ["/chains/0/hcm/http_filters/0/typed_config/config"]);
        assert!(select(&doc, "..http_filters[?(@.name=='c')]").unwrap().is_empty());
        assert_eq!(select(&doc, "$.chains[0].hcm").unwrap(), ["/chains/0/hcm"]);
        assert!(select(&doc, "..x[?(@.a>1)]").is_err());
        let mut d = doc.clone();
        let jp = "..http_filters[?(@.name=='a/b')].typed_config.config";
        let op = json!({"op": "add", "jsonPath": jp, "path": "/flag", "value": true});
        apply_operation(&mut d, &op).unwrap();
        assert_eq!(
            d.pointer("/chains/0/hcm/http_filters/0/typed_config/config/flag"),
            Some(&json!(true))
        );
        let missing = json!({"op": "add", "jsonPath": "..nothing", "value": 1});
        assert!(apply_operation(&mut d, &missing).is_err());
    }
}
