//! The schema and the parser agree: every configuration the parser (with `validate()`)
//! accepts, the schema accepts; a configuration the parser refuses for one field's value or an
//! unknown key, the schema refuses too. Only checks across fields (and integers past their
//! Rust type, which JSON Schema cannot name) are left to `validate()`, each listed below.

use kvroute_core::decision::config::{FilterConfig, SnapshotSyncConfig};
use kvroute_core::decision::router::Router;
use serde_json::{json, Value};

use super::walk::{closed_objects, leaves};
use super::{errors, validator, SCHEMAS};

/// Parser refusals the schema does not express, by the parser's message: each is a check
/// across fields (or an integer out of its Rust type's range).
const ACROSS_FIELDS: &[&str] = &[
    // serde: a JSON number the schema counts as an integer (1e300) but no u64 holds, or past
    // u32/usize.
    "invalid type: floating point",
    "invalid value: integer",
    "max_body_bytes must be >= max_prompt_bytes",
    "shard_timeout_ms",                // at least 3 ticks
    "body_wait_ms must be >= tick_ms", // the tick resumes waiting requests
    "max_hashes_per_poll must be >= max_hashes_per_entry",
    "must differ", // admission headers vs each other and destination_header
    "is not one of the classes", // admission.default_class
    "listed twice", // admission class names
    "repeats a model or adapter name",
    "min_arrivals <= max_arrivals",
    "retry_min_ms must be > 0 and <= retry_max_ms",
    "heartbeat_ms must be >= peers.forward_ms",
    "health.max_backoff_ms must be >= health.base_backoff_ms",
    "health.first_byte_timeout needs 0 < min_ms <= max_ms",
    "prefill must cost something per token", // prefill_ms_per_token and _sq both 0
    "give both 'tokenizer' and 'tokenizer_config'",
    "not both",                           // bundle vs inline files, token vs token_env
    "a token of 16+ characters",          // snapshot_sync: token unless token_env
    "is not set in the VM's environment", // token_env names an unset variable
];

/// Values every leaf is set to in turn.
fn probes() -> Vec<Value> {
    let big = u64::MAX;
    vec![
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(1),
        json!(-1),
        json!(2),
        json!(0.5),
        json!(1.5),
        json!(4096),
        json!(4097),
        json!(10_000),
        json!(10_001),
        json!(16_385),
        json!(30_001),
        json!(4_294_967_296u64),
        json!(big),
        json!(1e300),
        json!(""),
        json!("x"),
        json!("shed"),
        json!("best_effort"),
        json!("updater"),
        json!("0123456789abcdef"),
        json!("0123456789abcdeg"),
        json!("/kvroute/t"),
        json!("/kvroute/"),
        json!("x-kvroute-a"),
        json!("x-a"),
        json!("X-A"),
        json!("batch"),
        json!("127.0.0.1:9"),
        json!([]),
        json!(["127.0.0.1:9"]),
        json!(["[::1]:9", "127.0.0.1:9"]),
        json!(["127.0.0.1:9", "127.0.0.1:9"]),
        json!(["host:80"]),
        json!(["x"]),
        json!([""]),
        json!({}),
        json!({"a": 1}),
    ]
}

/// A valid filter configuration that sets the optional fields, so that every leaf exists.
fn filter_base() -> Value {
    json!({
        "models": [{"name": "m", "workers": ["127.0.0.1:8001", "[::1]:8002"], "adapters": ["a"],
                    "lora_name": "l", "bundle": "updater", "ttft_deadline_ms": 100}],
        "fault_injection": {"trap_path": "/kvroute/trap"},
        "admission": {"classes": [
            {"name": "interactive", "max_wait_ms": 5.0, "on_deadline_miss": "best_effort"},
            {"name": "batch", "queue_weight": 2.0}
        ]}
    })
}

fn sync_base() -> Value {
    json!({"snapshot_sync": {"cluster": "kvroute_updater", "token": "0123456789abcdef"}})
}

/// The environment the singleton's parser sees: only `TOKEN` is set.
fn env(name: &str) -> Option<String> {
    (name == "TOKEN").then(|| "0123456789abcdef".to_string())
}

type Parser = fn(&Value) -> Result<(), String>;

pub fn parse_filter(v: &Value) -> Result<(), String> {
    FilterConfig::from_json(v.to_string().as_bytes()).map(|_| ()).map_err(|e| e.to_string())
}

fn parse_sync(v: &Value) -> Result<(), String> {
    parse_sync_in(v, &env)
}

/// The singleton's parser, with `env` as the VM's environment.
pub fn parse_sync_in(v: &Value, env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    match SnapshotSyncConfig::from_json(v.to_string().as_bytes(), env) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err("not a snapshot_sync configuration".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Sets `path` (dotted, `[]` is the first item) in `v`, creating the objects on the way.
fn set(v: &mut Value, path: &str, to: Value) {
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let (name, item) = match part.strip_suffix("[]") {
            Some(n) => (n, true),
            None => (*part, false),
        };
        let last = i + 1 == parts.len();
        if last && !item {
            cur[name] = to;
            return;
        }
        if cur.get(name).is_none() {
            cur[name] = if item { json!([{}]) } else { json!({}) };
        }
        cur = &mut cur[name];
        if item {
            if cur.as_array().is_some_and(|a| a.is_empty()) {
                cur[0] = json!({});
            }
            cur = &mut cur[0];
        }
        if last {
            *cur = to;
            return;
        }
    }
}

struct Tally {
    both_accept: usize,
    both_refuse: usize,
    across_fields: usize,
}

/// Sets every leaf to every probe and holds the parser against the schema.
fn agree(schema: &Value, base: &Value, parse: Parser, skip: &[&str]) -> Tally {
    let v = validator(schema);
    assert!(parse(base).is_ok(), "base configuration refused: {:?}", parse(base));
    assert!(errors(&v, base).is_empty(), "schema refuses the base: {:?}", errors(&v, base));
    let mut tally = Tally { both_accept: 0, both_refuse: 0, across_fields: 0 };
    let mut wrong = Vec::new();
    for leaf in leaves(schema).iter().filter(|l| !skip.contains(&l.as_str())) {
        for probe in probes() {
            let mut cfg = base.clone();
            set(&mut cfg, leaf, probe.clone());
            let parsed = parse(&cfg);
            let errs = errors(&v, &cfg);
            match (&parsed, errs.is_empty()) {
                (Ok(()), true) => tally.both_accept += 1,
                (Err(_), false) => tally.both_refuse += 1,
                (Ok(()), false) => {
                    wrong.push(format!("{} = {probe}: parser accepts, schema: {errs:?}", leaf))
                }
                (Err(e), true) => {
                    if ACROSS_FIELDS.iter().any(|n| e.contains(n)) {
                        tally.across_fields += 1;
                    } else {
                        wrong.push(format!(
                            "{} = {probe}: parser refuses ({e}), the schema accepts",
                            leaf
                        ));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "schema and parser disagree:\n{}", wrong.join("\n"));
    tally
}

/// A stray key in every object that refuses unknown fields is refused by both.
fn unknown_keys(schema: &Value, base: &Value, parse: Parser) -> usize {
    let v = validator(schema);
    let paths = closed_objects(schema);
    for path in &paths {
        let mut cfg = base.clone();
        let key = if path.is_empty() { "bogus".to_string() } else { format!("{path}.bogus") };
        set(&mut cfg, &key, json!(1));
        let parsed = parse(&cfg);
        assert!(parsed.as_ref().is_err_and(|e| e.contains("unknown field")), "{key}: {parsed:?}");
        assert!(!errors(&v, &cfg).is_empty(), "the schema accepts the unknown field {key}");
    }
    paths.len()
}

#[test]
fn filter_schema_accepts_what_the_parser_accepts() {
    let schema = (SCHEMAS[0].1)();
    // Inline files are any JSON value to the parser; the router refuses what is not a
    // tokenizer (checked below), the schema what is not an object.
    let t = agree(
        &schema,
        &filter_base(),
        parse_filter,
        &["models[].tokenizer", "models[].tokenizer_config"],
    );
    assert!(t.both_accept > 100 && t.both_refuse > 500 && t.across_fields > 0, "{}", t.both_accept);
    // Every struct refuses unknown fields: the root, models, profiles, classes and sections.
    assert!(unknown_keys(&schema, &filter_base(), parse_filter) >= 14);
}

#[test]
fn snapshot_sync_schema_accepts_what_the_parser_accepts() {
    let schema = (SCHEMAS[1].1)();
    let t = agree(&schema, &sync_base(), parse_sync, &[]);
    assert!(t.both_accept > 20 && t.both_refuse > 50 && t.across_fields > 0);
    assert_eq!(unknown_keys(&schema, &sync_base(), parse_sync), 3, "snapshot_sync, bundles, peers");
    // `token_env` instead of `token`.
    let v = validator(&schema);
    let by_env = json!({"snapshot_sync": {"cluster": "u", "token_env": "TOKEN"}});
    assert!(parse_sync(&by_env).is_ok() && errors(&v, &by_env).is_empty());
}

#[test]
fn inline_files_that_are_not_objects_are_refused_by_the_router_and_the_schema() {
    let schema = (SCHEMAS[0].1)();
    let v = validator(&schema);
    let cfg = json!({"models": [{"name": "m", "workers": ["127.0.0.1:1"],
                                 "tokenizer": "x", "tokenizer_config": "y"}]});
    let parsed =
        FilterConfig::from_json(cfg.to_string().as_bytes()).expect("the parser takes any JSON");
    assert!(Router::new(&parsed).is_err(), "the router built a tokenizer from a string");
    assert!(!errors(&v, &cfg).is_empty());
}

#[test]
fn single_field_refusals_are_in_the_schema() {
    let schema = (SCHEMAS[0].1)();
    let v = validator(&schema);
    let model = |extra: Value| {
        let mut m = json!({"name": "m", "workers": ["127.0.0.1:1"]});
        for (k, x) in extra.as_object().expect("object") {
            m[k] = x.clone();
        }
        json!({ "models": [m] })
    };
    let with = |path: &str, to: Value| {
        let mut c = model(json!({}));
        set(&mut c, path, to);
        c
    };
    let cases = [
        json!({}),
        json!({"models": []}),
        model(json!({"workers": []})),
        model(json!({"workers": ["host:80"]})),
        model(json!({"workers": ["127.0.0.1:1", "127.0.0.1:1"]})),
        model(json!({"block_size": 0})),
        model(json!({"block_size": 4097})),
        model(json!({"bundle": "c0ffee"})),
        model(json!({"adapters": [""]})),
        model(json!({"profile": {"prefill_ms_per_token": -1}})),
        with("destination_header", json!("X-Bad")),
        with("tick_ms", json!(0)),
        with("tick_ms", json!(10_001)),
        with("journal.max_hashes_per_entry", json!(0)),
        with("fault_injection.trap_path", json!("/v1/x")),
        with("admission.deadline_header", json!("x-kvroute-deadline")),
        with("admission.priority_header", json!("x-envoy-priority")),
        with("admission.max_retry_after_s", json!(0)),
        with("admission.classes", json!([])),
        with("admission.classes", json!([{"name": "Bad"}])),
        with("admission.classes", json!([{"name": "interactive", "queue_weight": 0.5}])),
        with("admission.on_deadline_miss", json!("drop")),
        with("calibration.deviation_min", json!(0)),
        with("calibration.deviation_max", json!(0.5)),
        with("calibration.flush_samples", json!(0)),
        with("calibration.half_life_samples", json!(0)),
        with("lookahead.horizon_ms", json!(0)),
        with("knowledge.decode_limits.max_workers", json!(0)),
    ];
    for cfg in cases {
        assert!(parse_filter(&cfg).is_err(), "the parser accepts {cfg}");
        assert!(!errors(&v, &cfg).is_empty(), "the schema accepts {cfg}");
    }
}
