//! Reading what an inference engine reports about itself on `/metrics` (Prometheus text) with
//! `prometheus-parse`: vLLM's gauges, or SGLang's where vLLM's are absent, and the block size
//! either announces. The one reader of engine metrics, shared by the updater (the load it
//! publishes, the alignment check) and the evaluation harness (queue samples).
//!
//! prometheus-parse reads a metric name as `\w+`, so it would skip the engines' names, which
//! hold a colon (`vllm:num_requests_running`): [`EngineMetrics::parse`] spells the colon of a
//! name as [`COLON`] before parsing, and back after. Label values are kept as the exposition
//! writes them (escapes not undone); the labels read here (ranks, engine, priority, block
//! size) are plain numbers.

use std::borrow::Cow;
use std::collections::BTreeMap;

use prometheus_parse::{Sample, Scrape, Value};
use serde::Serialize;

/// How a colon in a metric name is spelled for prometheus-parse (a word no engine exports).
pub const COLON: &str = "__kvroute_colon__";

/// Load an engine reported about itself on `/metrics`, each value as the engine exports it
/// (not `kvroute_core`'s snapshot load, which is whole requests).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineLoad {
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
    /// Unix ms of the scrape.
    pub observed_at_ms: u64,
}

/// An engine's `/metrics`, parsed: the plain samples (counters, gauges, untyped).
#[derive(Debug, Clone, Default)]
pub struct EngineMetrics {
    samples: Vec<Sample>,
}

/// A sample's pipeline- and tensor-parallel ranks (`pp_rank`, `tp_rank`; 0 when absent).
type Ranks = (u64, u64);

/// How a gauge's per-rank values make the worker's one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Combine {
    /// Counts (requests): each data-parallel rank has its own.
    Sum,
    /// Fractions (KV usage): the worker's is the ranks' mean.
    Mean,
}

impl EngineMetrics {
    /// Parses a text exposition; lines prometheus-parse cannot read are skipped.
    pub fn parse(text: &str) -> EngineMetrics {
        let lines = text.lines().map(|l| Ok(colon_free(l).into_owned()));
        let mut samples = Scrape::parse(lines).map(|s| s.samples).unwrap_or_default();
        for s in &mut samples {
            if s.metric.contains(COLON) {
                s.metric = s.metric.replace(COLON, ":");
            }
        }
        EngineMetrics { samples }
    }

    /// [`EngineMetrics::parse`] of only the lines of the metrics named in `names` (their
    /// samples, `# TYPE` and `# HELP` lines, by exact name): what a reader of a few gauges
    /// needs, without parsing the rest. An engine exports hundreds of lines, mostly histogram
    /// buckets, and the updater reads three gauges of them on every scrape of every worker.
    pub fn parse_only(text: &str, names: &[&str]) -> EngineMetrics {
        let wanted = |l: &&str| metric_name(l).is_some_and(|n| names.contains(&n));
        let kept: Vec<&str> = text.lines().filter(wanted).collect();
        EngineMetrics::parse(&kept.join("\n"))
    }

    /// Every plain sample of `name` with its value (histograms and summaries left out).
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a Sample, f64)> + 'a {
        self.samples.iter().filter(move |s| s.metric == name).filter_map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some((s, v)),
            Value::Histogram(_) | Value::Summary(_) => None,
        })
    }

    /// The samples of `name` summed over label sets.
    pub fn sum(&self, name: &str) -> Option<f64> {
        self.values(name).map(|(_, v)| v).reduce(|a, b| a + b)
    }

    /// The cumulative buckets of histogram `name` (its base name, without `_bucket`), summed
    /// over label sets: (upper bound, count), by bound. Read from a typed histogram, or from
    /// `name_bucket` samples with an `le` label where no `# TYPE` line says so.
    pub fn histogram(&self, name: &str) -> Option<Vec<(f64, u64)>> {
        let mut out: Vec<(f64, u64)> = Vec::new();
        let mut add = |le: f64, count: f64| match out.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += count as u64,
            None => out.push((le, count as u64)),
        };
        for s in self.samples.iter().filter(|s| s.metric == name) {
            if let Value::Histogram(counts) = &s.value {
                counts.iter().for_each(|h| add(h.less_than, h.count));
            }
        }
        for (s, count) in self.values(&format!("{name}_bucket")) {
            let le = s.labels.get("le").and_then(prom_float);
            if let Some(le) = le {
                add(le, count);
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        (!out.is_empty()).then_some(out)
    }

    /// One worker's value of gauge `name`, read the way the engines export it:
    /// - SGLang with priority scheduling exports the total under `priority=""` plus one sample
    ///   per priority: only the total (a sample without the label, or with it empty) counts;
    /// - SGLang with `--enable-metrics-for-all-schedulers` exports every TP (and PP) rank of
    ///   one data-parallel rank, each the same batch: one sample per data-parallel rank counts
    ///   (the lowest `pp_rank`, then `tp_rank`);
    /// - data-parallel ranks (`dp_rank`, SGLang) and engines (`engine`, vLLM) are separate
    ///   schedulers: counts are summed over them, fractions averaged.
    fn gauge(&self, name: &str, how: Combine) -> Option<f64> {
        let rank = |s: &Sample, key: &str| -> u64 {
            s.labels.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        // (dp_rank, engine) -> ((pp_rank, tp_rank), value) of the lowest ranks seen.
        let mut groups: BTreeMap<(&str, &str), (Ranks, f64)> = BTreeMap::new();
        for (s, value) in self.values(name) {
            if s.labels.get("priority").is_some_and(|p| !p.is_empty()) {
                continue;
            }
            let key = (
                s.labels.get("dp_rank").unwrap_or_default(),
                s.labels.get("engine").unwrap_or_default(),
            );
            let order = (rank(s, "pp_rank"), rank(s, "tp_rank"));
            let slot = groups.entry(key).or_insert((order, value));
            if order < slot.0 {
                *slot = (order, value);
            }
        }
        if groups.is_empty() {
            return None;
        }
        let total: f64 = groups.values().map(|(_, v)| v).sum();
        Some(match how {
            Combine::Sum => total,
            Combine::Mean => total / groups.len() as f64,
        })
    }

    /// vLLM's gauges, or SGLang's where vLLM's are absent.
    pub fn load(&self, observed_at_ms: u64) -> EngineLoad {
        use Combine::{Mean, Sum};
        EngineLoad {
            running: self
                .gauge("vllm:num_requests_running", Sum)
                .or_else(|| self.gauge("sglang:num_running_reqs", Sum)),
            waiting: self
                .gauge("vllm:num_requests_waiting", Sum)
                .or_else(|| self.gauge("sglang:num_queue_reqs", Sum)),
            kv_usage: self
                .gauge("vllm:kv_cache_usage_perc", Mean)
                .or_else(|| self.gauge("vllm:gpu_cache_usage_perc", Mean))
                .or_else(|| self.gauge("sglang:token_usage", Mean)),
            observed_at_ms,
        }
    }

    /// The `block_size` label of vLLM's `vllm:cache_config_info`.
    pub fn vllm_block_size(&self) -> Option<u32> {
        self.values("vllm:cache_config_info")
            .find_map(|(s, _)| s.labels.get("block_size")?.parse().ok())
    }

    /// SGLang's `sglang:page_size` (a gauge, one sample per scheduler; all equal): a whole
    /// number of at least 1.
    pub fn sglang_page_size(&self) -> Option<u32> {
        let (_, v) = self.values("sglang:page_size").next()?;
        (v >= 1.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX)).then_some(v as u32)
    }

    /// The block size announced: vLLM's, else SGLang's page size.
    pub fn block_size(&self) -> Option<u32> {
        self.vllm_block_size().or_else(|| self.sglang_page_size())
    }
}

/// The gauges [`EngineMetrics::load`] reads.
pub const LOAD_GAUGES: [&str; 7] = [
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
];

/// The load in an engine's `/metrics` text (see [`EngineMetrics::load`]); only the lines of
/// [`LOAD_GAUGES`] are parsed.
pub fn parse_load(text: &str, observed_at_ms: u64) -> EngineLoad {
    EngineMetrics::parse_only(text, &LOAD_GAUGES).load(observed_at_ms)
}

/// A number as Prometheus writes it (`+Inf`, `-Inf`, `NaN` included).
fn prom_float(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

/// Where the metric name of `l` (a sample, `# TYPE` or `# HELP` line, leading blanks already
/// trimmed) is: `l[start..end]`; `None` for any other comment and for a line without a name.
fn name_span(l: &str) -> Option<(usize, usize)> {
    let start = match l.strip_prefix('#') {
        Some(comment) => {
            let c = comment.trim_start();
            let after = c.strip_prefix("TYPE").or_else(|| c.strip_prefix("HELP"))?;
            l.len() - after.trim_start().len()
        }
        None => 0,
    };
    let rest = &l[start..];
    let end = start + rest.find(|c: char| c == '{' || c.is_whitespace()).unwrap_or(rest.len());
    (end > start).then_some((start, end))
}

/// The metric name of `line` (see [`name_span`]).
fn metric_name(line: &str) -> Option<&str> {
    let l = line.trim_start();
    name_span(l).map(|(start, end)| &l[start..end])
}

/// `line` with the colons of its metric name (of a sample, `# TYPE` or `# HELP` line)
/// spelled as [`COLON`].
fn colon_free(line: &str) -> Cow<'_, str> {
    if !line.contains(':') {
        return Cow::Borrowed(line);
    }
    let l = line.trim_start();
    match name_span(l) {
        Some((start, end)) if l[start..end].contains(':') => {
            let name = l[start..end].replace(':', COLON);
            Cow::Owned(format!("{}{name}{}", &l[..start], &l[end..]))
        }
        _ => Cow::Borrowed(line),
    }
}

#[cfg(test)]
mod tests;
