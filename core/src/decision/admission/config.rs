//! The `admission` section of the plugin configuration: which headers carry a request's TTFT
//! deadline and priority class, what happens when a deadline cannot be met, and the classes.

use serde::{Deserialize, Serialize};

/// What to do with a request whose deadline no worker's estimate meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MissPolicy {
    /// Answer 429 with `Retry-After` instead of queueing work that will miss anyway.
    Shed,
    /// Route it to the best worker all the same, and count it.
    BestEffort,
}

/// One priority class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// The header value that selects it (matched ignoring ASCII case); also the stats segment
    /// of its counters, so `[a-z0-9_]`, 1 to 32 characters.
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^[a-z0-9_]{1,32}$")))]
    pub name: String,
    /// Default TTFT deadline (ms) of this class's requests without a deadline header; 0: the
    /// model's `ttft_deadline_ms`.
    #[serde(default)]
    pub deadline_ms: u64,
    /// Shed this class's requests (reason `saturated`) when even the least-waiting worker of
    /// the pool has more than this estimated wait (ms) before their prefill could start.
    /// Absent: never shed for saturation. `0`: only idle workers are good enough.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0)))]
    pub max_wait_ms: Option<f64>,
    /// How much a worker's queued work counts against it in this class's choice:
    /// `cost = ttft + (queue_weight - 1) * wait`. `1` ranks exactly as without classes; above
    /// 1 the class gives up cache hits on busy workers (where it would delay the work queued
    /// there) for less busy ones.
    #[serde(default = "one")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1.0)))]
    pub queue_weight: f64,
    /// Overrides `admission.on_deadline_miss` for this class.
    #[serde(default)]
    pub on_deadline_miss: Option<MissPolicy>,
    /// The engine's queue priority for this class's requests: written as `"priority": n` into
    /// the JSON body forwarded (chat, completions, responses), replacing any the client sent.
    /// Engines that schedule by priority (vLLM `--scheduling-policy priority`) serve lower
    /// values first. Absent: the body is left alone, unless another class sets one, in which
    /// case a client's own `priority` is removed (clients never choose their engine priority
    /// once the classes do).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = -2147483648, max = 2147483647)))]
    pub engine_priority: Option<i64>,
}

fn one() -> f64 {
    1.0
}

/// Deadlines, shedding and priority classes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Request header with the TTFT deadline in milliseconds (decimal digits; absent, `0` or
    /// anything else: the default of the class, then of the model). Not under `x-kvroute-` or
    /// `x-envoy-`: the shipped bootstrap strips client copies of those before the filter runs.
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^(?!x-kvroute-|x-envoy-)[a-z0-9-]+$"))
    )]
    pub deadline_header: String,
    /// Request header naming the priority class (unknown or garbage: `default_class`).
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^(?!x-kvroute-|x-envoy-)[a-z0-9-]+$"))
    )]
    pub priority_header: String,
    /// Remove both headers before the request goes upstream (engines have no use for them).
    pub strip_headers: bool,
    /// What to do when no worker's estimate meets the deadline.
    pub on_deadline_miss: MissPolicy,
    /// Upper bound of the `Retry-After` seconds of a shed request (the lower bound is 1).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_retry_after_s: u32,
    /// The class of requests without a (known) priority header.
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^[a-z0-9_]{1,32}$")))]
    pub default_class: String,
    /// The priority classes (names unique; `default_class` must be one of them).
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub classes: Vec<ClassConfig>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            deadline_header: "x-ttft-deadline-ms".into(),
            priority_header: "x-request-priority".into(),
            strip_headers: true,
            on_deadline_miss: MissPolicy::Shed,
            max_retry_after_s: 60,
            default_class: "interactive".into(),
            classes: vec![
                ClassConfig {
                    name: "interactive".into(),
                    deadline_ms: 0,
                    max_wait_ms: None,
                    queue_weight: 1.0,
                    on_deadline_miss: None,
                    engine_priority: None,
                },
                ClassConfig {
                    name: "batch".into(),
                    deadline_ms: 0,
                    max_wait_ms: None,
                    queue_weight: 2.0,
                    on_deadline_miss: None,
                    engine_priority: None,
                },
            ],
        }
    }
}

fn header_name_ok(h: &str) -> bool {
    !h.is_empty() && h.bytes().all(|b| b.is_ascii_lowercase() || b == b'-' || b.is_ascii_digit())
}

impl AdmissionConfig {
    /// Checks names, bounds and that the headers are distinct from `destination_header`.
    pub fn validate(&self, destination_header: &str) -> Result<(), String> {
        for (key, h) in
            [("deadline_header", &self.deadline_header), ("priority_header", &self.priority_header)]
        {
            if !header_name_ok(h) {
                return Err(format!("admission.{key} '{h}' must be a lowercase header name"));
            }
            if h.starts_with("x-kvroute-") || h.starts_with("x-envoy-") {
                return Err(format!(
                    "admission.{key} '{h}' must not start with x-kvroute- or x-envoy-: the \
                     bootstrap strips client copies of those before the filter runs"
                ));
            }
            if h == destination_header {
                return Err(format!("admission.{key} must differ from destination_header"));
            }
        }
        if self.deadline_header == self.priority_header {
            return Err("admission.deadline_header and priority_header must differ".into());
        }
        if self.max_retry_after_s == 0 {
            return Err("admission.max_retry_after_s must be >= 1".into());
        }
        if self.classes.is_empty() {
            return Err("admission.classes must list at least one class".into());
        }
        for (i, c) in self.classes.iter().enumerate() {
            let name_ok = (1..=32).contains(&c.name.len())
                && c.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !name_ok {
                return Err(format!(
                    "admission class '{}': name must be [a-z0-9_]{{1,32}}",
                    c.name
                ));
            }
            if self.classes[..i].iter().any(|o| o.name == c.name) {
                return Err(format!("admission class '{}' is listed twice", c.name));
            }
            if !(c.queue_weight.is_finite() && c.queue_weight >= 1.0) {
                return Err(format!("admission class '{}': queue_weight must be >= 1", c.name));
            }
            if c.max_wait_ms.is_some_and(|w| !(w.is_finite() && w >= 0.0)) {
                return Err(format!("admission class '{}': max_wait_ms must be >= 0", c.name));
            }
            if c.engine_priority.is_some_and(|p| i32::try_from(p).is_err()) {
                return Err(format!(
                    "admission class '{}': engine_priority must be a 32-bit integer \
                     (-2147483648 to 2147483647)",
                    c.name
                ));
            }
        }
        if self.class_index(&self.default_class).is_none() {
            return Err(format!(
                "admission.default_class '{}' is not one of the classes",
                self.default_class
            ));
        }
        Ok(())
    }

    /// Whether the filter owns the body's `priority` field: some class sets `engine_priority`.
    pub fn sets_engine_priority(&self) -> bool {
        self.classes.iter().any(|c| c.engine_priority.is_some())
    }

    /// The index of the class named `name` (exactly).
    pub fn class_index(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c.name == name)
    }
}
