//! Walks a generated schema: `$ref`s resolved, the leaf fields with their dotted paths.

use serde_json::Value;

/// `s` with its `$ref` (`#/$defs/Name`) followed, if it has one.
pub fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.strip_prefix("#/$defs/").unwrap_or_else(|| panic!("unexpected $ref {r}"));
            root["$defs"].get(name).unwrap_or_else(|| panic!("missing definition {name}"))
        }
        None => s,
    }
}

/// An object schema's named fields and the names it requires.
type Fields<'a> = (Vec<(&'a str, &'a Value)>, Vec<&'a str>);

fn fields<'a>(root: &'a Value, s: &'a Value) -> Option<Fields<'a>> {
    let s = resolve(root, s);
    let props = s.get("properties")?.as_object()?;
    let required = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    Some((props.iter().map(|(k, v)| (k.as_str(), v)).collect(), required))
}

/// The schema of an array's items when they are objects with named fields.
fn object_items<'a>(root: &'a Value, s: &'a Value) -> Option<&'a Value> {
    let items = resolve(root, s).get("items")?;
    resolve(root, items).get("properties").map(|_| items)
}

/// The dotted path (`[]` for the items of an array: `models[].profile.prefill_base_ms`) of
/// every leaf field of `root` (a value that is not itself an object of named fields), in
/// schema order.
pub fn leaves(root: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(root, root, "", &mut out);
    out
}

fn walk(root: &Value, s: &Value, prefix: &str, out: &mut Vec<String>) {
    let Some((props, _)) = fields(root, s) else { return };
    for (name, prop) in props {
        let path = format!("{prefix}{name}");
        if fields(root, prop).is_some() {
            walk(root, prop, &format!("{path}."), out);
        } else if let Some(items) = object_items(root, prop) {
            walk(root, items, &format!("{path}[]."), out);
        } else {
            out.push(path);
        }
    }
}

/// Every object schema reachable from `root` that refuses unknown fields, with its path
/// (`""` for the root): where a stray key must be refused.
pub fn closed_objects(root: &Value) -> Vec<String> {
    let mut out = Vec::new();
    closed(root, root, "", &mut out);
    out
}

fn closed(root: &Value, s: &Value, path: &str, out: &mut Vec<String>) {
    let r = resolve(root, s);
    if r.get("additionalProperties") == Some(&Value::Bool(false)) {
        out.push(path.to_string());
    }
    let Some((props, _)) = fields(root, s) else { return };
    for (name, prop) in props {
        let sub = if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
        if fields(root, prop).is_some() {
            closed(root, prop, &sub, out);
        } else if let Some(items) = object_items(root, prop) {
            closed(root, items, &format!("{sub}[]"), out);
        }
    }
}

/// A field by its dotted path (leaf or not): its property schema (with its `default`, `$ref`
/// not followed) and whether its parent requires it.
pub fn lookup<'a>(root: &'a Value, path: &str) -> Option<(&'a Value, bool)> {
    let mut parent = root;
    let mut found = None;
    for part in path.split('.') {
        if let Some((_, item_schema)) = found {
            parent = item_schema;
        }
        let (name, item) = match part.strip_suffix("[]") {
            Some(n) => (n, true),
            None => (part, false),
        };
        let (props, required) = fields(root, parent)?;
        let prop = props.iter().find(|(k, _)| *k == name)?.1;
        let items = if item { Some(resolve(root, prop).get("items")?) } else { None };
        found = Some(((prop, required.contains(&name)), items.unwrap_or(prop)));
    }
    found.map(|(f, _)| f)
}
