//! The immutable half of a router: every model with its bundle, pool, block size, profile and
//! LoRA adapters, and the decision limits. Built once per configuration (or bundle change),
//! held in an `Arc` and swapped whole; a decision keeps the `Arc` of its model's entry, so a
//! request in flight keeps the bundle it was hashed with.

use std::collections::HashMap;
use std::sync::Arc;

use crate::decision::config::{BundleRef, BundleSource, ConfigError, FilterConfig};
use crate::decision::cost::{Profile, Weigh};
use crate::decision::tokenize::model::ModelBundle;
use crate::decision::tokenize::tokcache::Cuts;
use crate::decision::topology::TopologyConfig;
use crate::decision::worker::WorkerName;
use crate::wire::snapshot::ModelInfo;

/// One model's pool and how its prompts are tokenized and costed.
#[derive(Debug, Clone)]
pub struct ModelPlan {
    pub name: String,
    /// `None` while a bundle from the updater is not built yet: routed load-only (`no_bundle`).
    pub bundle: Option<ModelBundle>,
    /// Where the configuration says the bundle comes from when it is the updater's.
    pub source: Option<BundleRef>,
    /// Where chat prompts of this bundle may be cut for the token cache.
    pub cuts: Cuts,
    /// The pool, in name order.
    pub workers: Vec<WorkerName>,
    pub block_size: u32,
    /// LoRA name of the whole entry (part of every request's cache domain), if configured.
    pub lora_name: Option<String>,
    pub profile: Profile,
    /// Adapters of this base model named in the configuration.
    pub adapters: Vec<String>,
    /// A disaggregated pool's prefill workers (empty: aggregated); `workers` decode then.
    pub prefill_workers: Vec<WorkerName>,
    /// The header naming the chosen prefill worker.
    pub pd_header: String,
}

/// A configured pool in name order (decisions break cost ties by name; a pool in that order
/// breaks them by position, without comparing names).
fn sorted_names(workers: &[String]) -> Vec<WorkerName> {
    let mut names: Vec<WorkerName> = workers.iter().map(WorkerName::from).collect();
    names.sort();
    names
}

impl PartialEq for ModelPlan {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name
            && self.fingerprint() == o.fingerprint()
            && self.source == o.source
            && self.workers == o.workers
            && self.block_size == o.block_size
            && self.lora_name == o.lora_name
            && self.profile == o.profile
            && self.adapters == o.adapters
            && self.prefill_workers == o.prefill_workers
            && self.pd_header == o.pd_header
    }
}

impl ModelPlan {
    /// The bundle's fingerprint, if it has one.
    pub fn fingerprint(&self) -> Option<u64> {
        self.bundle.as_ref().map(ModelBundle::fingerprint)
    }

    fn with_bundle(&self, bundle: Option<ModelBundle>) -> ModelPlan {
        let cuts = bundle.as_ref().map(|b| b.cuts().clone()).unwrap_or_default();
        ModelPlan { bundle, cuts, ..self.clone() }
    }
}

/// Everything a decision reads that changes only with the configuration or a bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    models: HashMap<String, Arc<ModelPlan>>,
    /// Adapter name -> base model, from the configuration.
    adapters: HashMap<String, String>,
    /// The tie band and the price of running streams' delay (no request's decode steps: see
    /// [`Weigh::for_stream`]).
    pub weigh: Weigh,
    /// `stream_growth_tokens`: the most decode steps a request's growth of a batch is priced
    /// over.
    pub stream_growth_tokens: u64,
    /// `knowledge.cache_aware`: false credits no worker with cached blocks (an ablation).
    pub cache_aware: bool,
    /// `load.arrival_window_ms` > 0: the arrival rates other replicas report count too (0
    /// turns the forecast off here, whatever the peers' singletons send).
    pub peer_arrivals: bool,
    pub max_prompt_tokens: usize,
    pub max_prompt_bytes: usize,
    /// Where workers are and what moving KV costs; `None`: all local, no pulls.
    pub topology: Option<Arc<TopologyConfig>>,
    /// See [`Plan::steering_headers`] (computed once per plan, not per request).
    steering: Vec<String>,
}

impl Plan {
    /// The plan of a configuration whose bundles are inline or the demo one (models fed by the
    /// updater start without a bundle).
    pub fn new(cfg: &FilterConfig) -> Result<Plan, ConfigError> {
        Plan::build(cfg, &HashMap::new(), &[])
    }

    /// Validates `cfg` and builds its plan. Inline bundles are loaded here; a model whose
    /// `bundle` comes from the updater takes it from `bundles` (built elsewhere, by
    /// fingerprint): the pinned fingerprint, or the one `updater_models` (the snapshot's model
    /// list) names for it. A bundle not there leaves the model load-only until a later plan.
    pub fn build(
        cfg: &FilterConfig,
        bundles: &HashMap<u64, ModelBundle>,
        updater_models: &[ModelInfo],
    ) -> Result<Plan, ConfigError> {
        cfg.validate()?;
        let mut demo: Option<ModelBundle> = None;
        let mut models = HashMap::new();
        let mut adapters = HashMap::new();
        for m in &cfg.models {
            let invalid = |e: crate::decision::tokenize::model::ModelError| {
                ConfigError::Invalid(format!("model '{}': {e}", m.name))
            };
            let (bundle, source) = match m.bundle_source() {
                BundleSource::Inline { tokenizer, tokenizer_config } => {
                    let (t, c) = (tokenizer.to_string(), tokenizer_config.to_string());
                    (Some(ModelBundle::from_hf(&t, &c).map_err(invalid)?), None)
                }
                BundleSource::Demo => (
                    Some(match &demo {
                        Some(b) => b.clone(),
                        None => demo.insert(ModelBundle::demo().map_err(invalid)?).clone(),
                    }),
                    None,
                ),
                BundleSource::Shared(r) => {
                    let fp = wanted(&m.name, r, updater_models);
                    (fp.and_then(|fp| bundles.get(&fp)).cloned(), Some(r))
                }
            };
            for a in &m.adapters {
                adapters.insert(a.clone(), m.name.clone());
            }
            let entry = ModelPlan {
                name: m.name.clone(),
                bundle: None,
                source,
                cuts: Cuts::default(),
                workers: sorted_names(&m.workers),
                block_size: m.block_size,
                lora_name: m.lora_name.clone(),
                profile: m.profile,
                adapters: m.adapters.clone(),
                prefill_workers: sorted_names(&m.prefill_workers),
                pd_header: m.pd_header.clone(),
            }
            .with_bundle(bundle);
            models.insert(m.name.clone(), Arc::new(entry));
        }
        Ok(Plan {
            models,
            adapters,
            weigh: Weigh {
                tie: cfg.tie_band,
                stall_weight: cfg.stream_stall_weight,
                stream_steps: 0,
            },
            stream_growth_tokens: cfg.stream_growth_tokens,
            cache_aware: cfg.knowledge.cache_aware,
            peer_arrivals: cfg.load.arrival_window_ms > 0,
            max_prompt_tokens: cfg.max_prompt_tokens,
            max_prompt_bytes: cfg.max_prompt_bytes,
            // An empty section is no topology: decisions stay exactly the topology-free ones.
            topology: (cfg.topology != TopologyConfig::default())
                .then(|| Arc::new(cfg.topology.clone())),
            steering: steering_headers(cfg),
        })
    }

    /// This plan with `model`'s bundle replaced (an unknown model changes nothing).
    pub fn with_bundle(&self, model: &str, bundle: Option<ModelBundle>) -> Plan {
        let mut next = self.clone();
        if let Some(m) = next.models.get_mut(model) {
            *m = Arc::new(m.with_bundle(bundle));
        }
        next
    }

    pub fn model(&self, name: &str) -> Option<&Arc<ModelPlan>> {
        self.models.get(name)
    }

    pub fn models(&self) -> impl Iterator<Item = &Arc<ModelPlan>> {
        self.models.values()
    }

    /// The base model of an adapter named in the configuration.
    pub fn configured_base(&self, adapter: &str) -> Option<&str> {
        self.adapters.get(adapter).map(String::as_str)
    }

    /// Every configured worker, across models (a worker in two pools appears twice), prefill
    /// workers included.
    pub fn all_workers(&self) -> impl Iterator<Item = &str> {
        self.models
            .values()
            .flat_map(|m| m.workers.iter().chain(&m.prefill_workers).map(WorkerName::as_str))
    }

    /// Every header name a decision may set besides the destination (pull source, prefill
    /// worker), the defaults included: a client's copies are removed before routing.
    pub fn steering_headers(&self) -> &[String] {
        &self.steering
    }

    /// Models fed by the updater whose plan entry lacks the bundle they should have now:
    /// (model, wanted fingerprint). Fetch those bundles, then build the next plan.
    pub fn stale_bundles(&self, updater_models: &[ModelInfo]) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .models
            .values()
            .filter_map(|m| {
                let fp = wanted(&m.name, m.source?, updater_models)?;
                (m.fingerprint() != Some(fp)).then(|| (m.name.clone(), fp))
            })
            .collect();
        out.sort();
        out
    }
}

/// The header names a decision of `cfg` may set besides the destination, sorted, each once.
fn steering_headers(cfg: &FilterConfig) -> Vec<String> {
    let mut out: Vec<String> = [
        crate::decision::topology::TransferConfig::DEFAULT_HEADER,
        crate::decision::config::DEFAULT_PD_HEADER,
        cfg.topology.transfer.header.as_str(),
    ]
    .into_iter()
    .chain(cfg.models.iter().map(|m| m.pd_header.as_str()))
    .map(str::to_owned)
    .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The fingerprint a model fed by the updater should use.
fn wanted(model: &str, r: BundleRef, updater_models: &[ModelInfo]) -> Option<u64> {
    match r {
        BundleRef::Pinned(fp) => Some(fp),
        BundleRef::Updater => {
            updater_models.iter().find(|i| i.name == model).map(|i| i.fingerprint)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: serde_json::Value) -> FilterConfig {
        FilterConfig::from_json(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn demo_and_updater_models_get_their_bundles_and_adapters_their_base() {
        let c = cfg(json!({"models": [
            {"name": "a", "workers": ["127.0.0.1:1"], "adapters": ["a-sql", "a-law"]},
            {"name": "b", "workers": ["127.0.0.1:2"], "bundle": "updater"},
            {"name": "c", "workers": ["127.0.0.1:3"], "bundle": "00000000000000ff"}]}));
        let plan = Plan::new(&c).unwrap();
        let demo = ModelBundle::demo().unwrap();
        assert_eq!(plan.model("a").unwrap().fingerprint(), Some(demo.fingerprint()));
        assert!(!plan.model("a").unwrap().cuts.is_empty());
        assert_eq!(plan.model("b").unwrap().bundle.as_ref().map(|_| ()), None);
        assert_eq!(plan.configured_base("a-law"), Some("a"));
        assert_eq!(plan.configured_base("b"), None);
        let named =
            [ModelInfo { name: "b".into(), fingerprint: demo.fingerprint(), block_size: 16 }];
        assert_eq!(
            plan.stale_bundles(&named),
            vec![("b".to_string(), demo.fingerprint()), ("c".to_string(), 0xff)]
        );
        let bundles = HashMap::from([(demo.fingerprint(), demo.clone())]);
        let next = Plan::build(&c, &bundles, &named).unwrap();
        assert_eq!(next.model("b").unwrap().fingerprint(), Some(demo.fingerprint()));
        assert_eq!(next.stale_bundles(&named), vec![("c".to_string(), 0xff)]);
        let swapped = plan.with_bundle("c", Some(demo));
        assert!(swapped.model("c").unwrap().bundle.is_some());
        assert!(plan.model("c").unwrap().bundle.is_none(), "the old plan is unchanged");
        assert!(Arc::ptr_eq(plan.model("a").unwrap(), swapped.model("a").unwrap()));
    }

    #[test]
    fn invalid_configurations_build_no_plan() {
        let mut c = cfg(json!({"models": [{"name": "a", "workers": ["127.0.0.1:1"]}]}));
        c.models[0].workers.clear();
        assert!(Plan::new(&c).is_err());
    }
}
