//! JSON Schemas of the plugin configurations (feature `schema`), generated from the types that
//! parse them, so that an editor or CI can check a plugin configuration before Envoy loads it.
//!
//! The schemas say what the parser accepts: unknown fields are refused
//! (`additionalProperties: false`), defaults are the types' defaults, and the bounds that
//! `validate()` enforces on single fields are `minimum` / `maximum` / `pattern` / `minItems`.
//! Checks across fields (e.g. `max_body_bytes >= max_prompt_bytes`, `default_class` naming a
//! class, `load.shard_timeout_ms` of at least 3 ticks) stay with `validate()`: a configuration
//! the schema accepts may still be refused, never the other way round. The committed copies
//! live in `deploy/schema/` (the integration tests regenerate them and fail on drift).

use std::borrow::Cow;

use schemars::generate::SchemaSettings;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value};

use super::{BundleRef, FilterConfig, SnapshotSyncConfig};

/// `$id` of the HTTP filter's schema.
pub const FILTER_SCHEMA_ID: &str = "urn:kvroute:schema:filter-config";
/// `$id` of the singleton's (`snapshot_sync`) schema.
pub const SNAPSHOT_SYNC_SCHEMA_ID: &str = "urn:kvroute:schema:snapshot-sync-config";

impl JsonSchema for BundleRef {
    fn schema_name() -> Cow<'static, str> {
        "BundleRef".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "\"updater\": the fingerprint the updater names for this model, as \
                it changes; or 16 hex digits: only the bundle with that fingerprint.",
            "type": "string",
            "pattern": "^(updater|[0-9a-fA-F]{16})$"
        })
    }
}

/// The plugin configuration of kvroute's bootstrap singleton (`envoy.bootstrap.wasm`), which
/// pulls the updater's snapshots and bundles into shared data. Other top-level keys are
/// ignored.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct SnapshotSyncPlugin {
    snapshot_sync: SnapshotSyncConfig,
}

/// The schema of the HTTP filter's plugin configuration (`FilterConfig`), draft 2020-12.
/// `models` is required: the parser would default it to an empty list, which `validate()`
/// refuses.
pub fn filter_config_schema() -> Value {
    let mut schema =
        SchemaSettings::draft2020_12().into_generator().into_root_schema_for::<FilterConfig>();
    if let Some(models) = schema.get_mut("properties").and_then(|p| p.get_mut("models")) {
        if let Some(m) = models.as_object_mut() {
            m.remove("default");
        }
    }
    schema.insert("required".into(), serde_json::json!(["models"]));
    with_header(
        schema,
        FILTER_SCHEMA_ID,
        "kvroute filter configuration",
        "Plugin configuration of the kvroute HTTP filter (envoy.filters.http.wasm, the JSON in \
         its google.protobuf.StringValue). Generated from kvroute-core's FilterConfig; the \
         filter also enforces checks across fields (validate()).",
    )
}

/// The schema of the singleton's plugin configuration (`{"snapshot_sync": {...}}`).
pub fn snapshot_sync_schema() -> Value {
    let schema = SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<SnapshotSyncPlugin>();
    with_header(
        schema,
        SNAPSHOT_SYNC_SCHEMA_ID,
        "kvroute snapshot sync configuration",
        "Plugin configuration of kvroute's bootstrap singleton (envoy.bootstrap.wasm): \
         {\"snapshot_sync\": {...}}. Generated from kvroute-core's SnapshotSyncConfig; give \
         `token` (16+ characters) or `token_env`, not both.",
    )
}

/// `$schema`, `$id`, `title`, `description` first, then the generated rest.
fn with_header(schema: Schema, id: &str, title: &str, description: &str) -> Value {
    let mut generated = match schema.to_value() {
        Value::Object(m) => m,
        other => return other,
    };
    let mut out = Map::new();
    if let Some(s) = generated.remove("$schema") {
        out.insert("$schema".into(), s);
    }
    out.insert("$id".into(), id.into());
    out.insert("title".into(), title.into());
    out.insert("description".into(), description.into());
    generated.remove("title");
    generated.remove("description");
    out.extend(generated);
    let mut out = Value::Object(out);
    reflow_descriptions(&mut out);
    out
}

/// Doc comments keep their line breaks; an editor shows a description as one paragraph, so
/// single line breaks become spaces (blank lines stay).
fn reflow_descriptions(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match x {
                    Value::String(s) if k == "description" => {
                        *s = s
                            .split("\n\n")
                            .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                            .collect::<Vec<_>>()
                            .join("\n\n");
                    }
                    _ => reflow_descriptions(x),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(reflow_descriptions),
        _ => {}
    }
}
