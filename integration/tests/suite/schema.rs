//! The plugin configurations' JSON Schemas (`deploy/schema/`, generated from kvroute-core's
//! types with its `schema` feature): the committed files are exactly what the types generate
//! (`KVROUTE_WRITE_SCHEMA=1 cargo test -p kvroute-integration --test suite schema::` rewrites them),
//! every plugin configuration shipped in the repository validates against them, the schema
//! accepts whatever the parser accepts, and the configuration reference's tables
//! (`docs/configuration.md`) document every field with the schema's default. Also the README
//! and `docs/` themselves (`docs`): length, the two commands on the first screen, links,
//! `./dev` subcommands.

#[path = "schema/agree.rs"]
mod agree;
#[path = "schema/docs.rs"]
mod docs;
#[path = "schema/readme.rs"]
mod readme;
#[path = "schema/repo.rs"]
mod repo;
#[path = "schema/walk.rs"]
mod walk;

use std::path::PathBuf;

use kvroute_core::decision::config::schema::{filter_config_schema, snapshot_sync_schema};
use kvroute_stack::paths;
use serde_json::Value;

type Generator = fn() -> Value;

/// The committed schemas: file name and generator.
const SCHEMAS: [(&str, Generator); 2] = [
    ("kvroute-filter-config.schema.json", filter_config_schema),
    ("kvroute-snapshot-sync.schema.json", snapshot_sync_schema),
];

fn schema_path(name: &str) -> PathBuf {
    paths::repo_root().join("deploy/schema").join(name)
}

/// The text a schema is committed as: pretty JSON, generator's key order, final newline.
fn committed_text(schema: &Value) -> String {
    let mut text = serde_json::to_string_pretty(schema).expect("a schema serializes");
    text.push('\n');
    text
}

/// A compiled validator for a generated schema.
fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).expect("the generated schema compiles")
}

/// The validation errors of `instance`, one line each (empty: valid).
fn errors(v: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    v.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

#[test]
fn committed_schemas_are_what_the_types_generate() {
    let write = std::env::var_os("KVROUTE_WRITE_SCHEMA").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (name, generate) in SCHEMAS {
        let path = schema_path(name);
        let want = committed_text(&generate());
        if write {
            std::fs::create_dir_all(path.parent().expect("deploy/schema")).unwrap();
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let first = have.lines().zip(want.lines()).position(|(a, b)| a != b);
            let line = first.unwrap_or(have.lines().count().min(want.lines().count()));
            stale.push(format!(
                "{} differs from the generated schema from line {} on:\n  committed: {}\n  \
                 generated: {}",
                path.display(),
                line + 1,
                have.lines().nth(line).unwrap_or("<end of file>"),
                want.lines().nth(line).unwrap_or("<end of file>"),
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nthe configuration types changed: regenerate with \
         KVROUTE_WRITE_SCHEMA=1 cargo test -p kvroute-integration --test suite schema::, review the \
         diff and commit it",
        stale.join("\n")
    );
}

#[test]
fn schemas_say_what_they_are() {
    for (name, generate) in SCHEMAS {
        let s = generate();
        assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema", "{name}");
        for key in ["$id", "title", "description"] {
            assert!(s[key].as_str().is_some_and(|t| !t.is_empty()), "{name}: no {key}");
        }
        // Compiles under its own meta-schema (jsonschema checks the schema when building).
        validator(&s);
    }
}
