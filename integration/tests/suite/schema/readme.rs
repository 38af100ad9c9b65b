//! The configuration reference's tables (`docs/configuration.md`) against the schemas, strictly
//! both ways: every field a table names exists, its default column says the schema's default,
//! and every leaf field of the schema is documented by exactly one row. The filter's fields are
//! in "The filter" (whose `admission.*` / `calibration.*` rows point to the tables of
//! "Admission", "Calibration" and "Topology"); the singleton's are in "The singleton (snapshot sync)".

use std::collections::BTreeMap;

use kvroute_stack::paths;
use serde_json::Value;

use super::walk::{leaves, lookup, resolve};
use super::SCHEMAS;

/// One row of a field table.
#[derive(Debug, Clone)]
struct Row {
    /// `section: first cell`, for messages.
    at: String,
    /// The fields it names, full paths (`models[].tokenizer_config`, `admission.*`).
    fields: Vec<String>,
    default: String,
    meaning: String,
}

/// The reference the tables are in, relative to the repository root.
const DOC: &str = "docs/configuration.md";

/// The lines of section `## title` (without the heading).
fn section<'a>(doc: &'a str, title: &str) -> Vec<&'a str> {
    let heading = format!("## {title}");
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "{DOC} has no section '{heading}'");
    lines.take_while(|l| !l.starts_with("## ")).collect()
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(|c| c.trim().to_string()).collect()
}

/// The `code` spans of `text`, in order.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(String::from).collect()
}

/// `name` relative to the first field of its row: `.x` or `x` is a sibling of `first`.
fn expand(first: &str, name: &str) -> String {
    if first.is_empty() || (name.contains('.') && !name.starts_with('.')) {
        return name.to_string();
    }
    let parent = first.rsplit_once('.').map_or("", |(p, _)| p);
    let name = name.trim_start_matches('.');
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}.{name}")
    }
}

/// The prefix of a table that is not a field table.
const NOT_FIELDS: &str = "<not a field table>";

/// The field tables (first header cell `field`, e.g. ``field (`calibration.`)``) of a
/// section, each as its rows.
fn field_tables(doc: &str, title: &str) -> Vec<Vec<Row>> {
    let mut tables = Vec::new();
    let mut current: Option<(String, Vec<Row>)> = None;
    for line in section(doc, title) {
        if !line.trim_start().starts_with('|') {
            match current.take() {
                Some((prefix, rows)) if prefix != NOT_FIELDS => tables.push(rows),
                _ => {}
            }
            continue;
        }
        let c = cells(line);
        if c.iter().all(|x| x.chars().all(|ch| ch == '-' || ch == ':')) {
            continue;
        }
        match &mut current {
            None if c[0].starts_with("field") => {
                let prefix = code_spans(&c[0]).into_iter().next().unwrap_or_default();
                current = Some((prefix, Vec::new()));
            }
            None => current = Some((NOT_FIELDS.into(), Vec::new())),
            Some((prefix, rows)) if prefix != NOT_FIELDS => {
                assert_eq!(c.len(), 3, "{title}: a field row has 3 cells: {line}");
                let names = code_spans(&c[0]);
                assert!(!names.is_empty(), "{title}: no field named in {line}");
                let first = format!("{prefix}{}", names[0]);
                let fields = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| if i == 0 { first.clone() } else { expand(&first, n) })
                    .collect();
                rows.push(Row {
                    at: format!("{title}: {}", c[0]),
                    fields,
                    default: c[1].clone(),
                    meaning: c[2].clone(),
                });
            }
            Some(_) => {}
        }
    }
    if let Some((prefix, rows)) = current {
        if prefix != NOT_FIELDS {
            tables.push(rows);
        }
    }
    tables
}

/// Does the default column `text` say `default` (absent: none; `required`: the parent
/// requires the field)?
fn default_agrees(text: &str, default: Option<&Value>, required: bool) -> bool {
    let text = text.trim();
    match (text, default) {
        ("required", None) => return required,
        ("none", Some(Value::Null)) => return true,
        // An absent inline tokenizer means the built-in demo bundle.
        ("demo bundle", Some(Value::Null)) => return true,
        _ => {}
    }
    let Some(default) = default else { return false };
    // `0 (none)`: the value, then a gloss.
    let value = text.split(" (").next().unwrap_or(text).trim().trim_matches('`');
    match (serde_json::from_str::<Value>(value), default) {
        (Ok(Value::Number(a)), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Ok(a), b) => a == *b,
        // A bare word: a string default (`shed`, `x-ttft-deadline-ms`).
        (Err(_), b) => b.as_str() == Some(value),
    }
}

/// An array of objects' default written as ``` `name` (q <queue_weight>), ...```.
fn classes_agree(text: &str, default: Option<&Value>) -> bool {
    let Some(items) = default.and_then(Value::as_array) else { return false };
    let written: Vec<(String, f64)> = text
        .split("), ")
        .filter_map(|item| {
            let name = code_spans(item).into_iter().next()?;
            let q = item.split("(q ").nth(1)?.trim_end_matches(')').trim().parse().ok()?;
            Some((name, q))
        })
        .collect();
    let want: Vec<(String, f64)> = items
        .iter()
        .filter_map(|c| Some((c["name"].as_str()?.to_string(), c["queue_weight"].as_f64()?)))
        .collect();
    written == want && !want.is_empty()
}

/// Holds `tables` against `schema` (whose leaf paths lose `strip`); the problems found.
fn check(schema: &Value, strip: &str, tables: &[Vec<Row>]) -> Vec<String> {
    let mut problems = Vec::new();
    let all: Vec<String> =
        leaves(schema).into_iter().map(|l| l.trim_start_matches(strip).to_string()).collect();
    let find = |path: &str| lookup(schema, &format!("{strip}{path}"));
    let mut documented: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in tables.iter().flatten() {
        let pointer = row.default.is_empty();
        let parts: Vec<&str> = row.default.split(" / ").collect();
        if !pointer && parts.len() != 1 && parts.len() != row.fields.len() {
            problems.push(format!(
                "{}: {} defaults for {} fields",
                row.at,
                parts.len(),
                row.fields.len()
            ));
            continue;
        }
        for (i, field) in row.fields.iter().enumerate() {
            if let Some(prefix) = field.strip_suffix(".*") {
                if !all.iter().any(|l| l.starts_with(&format!("{prefix}."))) {
                    problems.push(format!("{}: no field under {prefix}", row.at));
                }
                continue;
            }
            let Some((prop, required)) = find(field) else {
                problems.push(format!("{}: {field} is not a field of the configuration", row.at));
                continue;
            };
            if pointer {
                continue;
            }
            let text = parts.get(i).unwrap_or(&parts[0]);
            if let Some(array) = field.strip_suffix("[]") {
                // An array of objects: its item fields are named in the meaning column.
                if !classes_agree(text, prop.get("default")) {
                    problems.push(format!("{}: default '{text}' is not {}", row.at, show(prop)));
                }
                let named = code_spans(&row.meaning);
                for leaf in all.iter().filter(|l| l.starts_with(&format!("{array}[]."))) {
                    let sub = &leaf[array.len() + 3..];
                    if named.iter().any(|n| n == sub) {
                        documented.entry(leaf.clone()).or_default().push(row.at.clone());
                    }
                }
                continue;
            }
            if resolve(schema, prop).get("properties").is_some() {
                problems.push(format!("{}: {field} is a section, not a field", row.at));
                continue;
            }
            if !default_agrees(text, prop.get("default"), required) {
                problems.push(format!(
                    "{}: {field} default '{text}', schema {}",
                    row.at,
                    show(prop)
                ));
            }
            documented.entry(field.clone()).or_default().push(row.at.clone());
        }
    }
    for leaf in &all {
        match documented.get(leaf).map(Vec::len) {
            None => problems.push(format!("{leaf} is not documented in {DOC}")),
            Some(1) => {}
            Some(_) => problems.push(format!("{leaf} is documented twice: {:?}", documented[leaf])),
        }
    }
    problems
}

fn show(prop: &Value) -> String {
    match prop.get("default") {
        Some(d) => format!("default {d}"),
        None => "no default".into(),
    }
}

/// Exactly one field table in section `title`.
fn one_table(doc: &str, title: &str) -> Vec<Row> {
    let mut tables = field_tables(doc, title);
    assert_eq!(tables.len(), 1, "{DOC}, {title}: one field table");
    tables.pop().expect("one table")
}

/// The problems of `doc` for the filter's and the singleton's schemas.
fn problems(doc: &str) -> Vec<String> {
    let filter: Vec<Vec<Row>> = ["The filter", "Admission", "Calibration", "Topology"]
        .iter()
        .map(|t| one_table(doc, t))
        .collect();
    let sync = one_table(doc, "The singleton (snapshot sync)");
    let mut out = check(&(SCHEMAS[0].1)(), "", &filter);
    out.extend(check(&(SCHEMAS[1].1)(), "snapshot_sync.", &[sync]));
    out
}

fn reference() -> String {
    std::fs::read_to_string(paths::repo_root().join(DOC)).expect(DOC)
}

#[test]
fn reference_tables_document_every_field_with_its_default() {
    let found = problems(&reference());
    assert!(found.is_empty(), "{DOC} configuration tables vs schema:\n{}", found.join("\n"));
}

/// The check fails on each way the reference can go stale.
#[test]
fn reference_check_catches_removed_stale_and_wrong_rows() {
    let text = reference();
    let edit = |from: &str, to: &str| {
        assert_eq!(text.matches(from).count(), 1, "{DOC} row to mutate: {from}");
        problems(&text.replacen(from, to, 1))
    };
    let has = |found: &[String], needle: &str| found.iter().any(|p| p.contains(needle));
    // A removed row: its field is undocumented.
    let row = text.lines().find(|l| l.starts_with("| `tick_ms` |")).expect("tick_ms row");
    let found = edit(&format!("{row}\n"), "");
    assert!(has(&found, "tick_ms is not documented"), "{found:?}");
    // A removed row of the singleton's table, and of a pointed-to section.
    let row = text.lines().find(|l| l.starts_with("| `long_poll_ms` |")).expect("long_poll_ms row");
    assert!(has(&edit(&format!("{row}\n"), ""), "long_poll_ms is not documented"));
    let row = text.lines().find(|l| l.starts_with("| `refresh_ms` |")).expect("refresh_ms row");
    assert!(has(&edit(&format!("{row}\n"), ""), "calibration.refresh_ms is not documented"));
    // A wrong default, a wrong one of several, and a class default that drifted.
    assert!(has(&edit("| `tick_ms` | 250 |", "| `tick_ms` | 300 |"), "tick_ms default '300'"));
    assert!(has(&edit("| 2.0 / 0.05 |", "| 2.0 / 0.5 |"), "tie_band.rel default '0.5'"));
    assert!(has(&edit("`batch` (q 2)", "`batch` (q 3)"), "admission.classes[]"));
    // A row for a field that does not exist, or a section named as a field.
    let row = text.lines().find(|l| l.starts_with("| `tick_ms` |")).expect("tick_ms row");
    let stale = format!("{row}\n| `tick_jitter_ms` | 0 | gone |\n| `index` | {{}} | x |\n");
    let found = edit(&format!("{row}\n"), &stale);
    assert!(has(&found, "tick_jitter_ms is not a field"), "{found:?}");
    assert!(has(&found, "index is a section"), "{found:?}");
    // A field documented twice.
    let dup = format!("{row}\n{row}\n");
    assert!(has(&edit(&format!("{row}\n"), &dup), "tick_ms is documented twice"));
    // A class field no longer named in the classes row.
    assert!(has(
        &edit("`queue_weight` (≥ 1", "weight (≥ 1"),
        "classes[].queue_weight is not documented"
    ));
}
