//! Named comparison plans: a topology, workloads, policies and faults. `demo` fits in about a
//! minute (the README's demo command); `full` runs every workload against every policy;
//! `selfcheck` proves the report exposes a bad policy.

use serde::{Deserialize, Serialize};

use crate::cluster::{Fault, Policy, TimedFault};
use crate::record::Slo;
use crate::topology::Topology;
use crate::workloads::{Shape, Workload};

/// One workload with the faults applied while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub workload: Workload,
    #[serde(default)]
    pub faults: Vec<TimedFault>,
}

/// A whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub name: String,
    pub topology: Topology,
    pub policies: Vec<Policy>,
    pub scenarios: Vec<Scenario>,
    /// Runs of every (workload, policy, rate) cell; the policies' order rotates between them,
    /// and least-request's runs against each other give the noise floor (the A/A row).
    #[serde(default = "default_repeats")]
    pub repeats: usize,
    /// Offered load ladder, as multiples of each workload's own rate (`[1.0]`: no sweep).
    #[serde(default = "default_rates")]
    pub rate_scales: Vec<f64>,
    /// Share of requests whose what-if TTFT is asked of every simulated worker (regret).
    #[serde(default = "default_whatif_sample")]
    pub whatif_sample: f64,
}

fn default_repeats() -> usize {
    3
}

fn default_rates() -> Vec<f64> {
    vec![1.0]
}

fn default_whatif_sample() -> f64 {
    0.25
}

pub const PRESETS: [&str; 3] = ["demo", "full", "selfcheck"];

/// Interactive chat on a 70B-class prefill speed: first token within 0.6 s, ~20 tokens/s or better.
const SLO: Slo = Slo { ttft_ms: 600.0, mean_gap_ms: 50.0, stall_ms: 250.0 };

fn workload(name: &str, seed: u64, shape: Shape) -> Workload {
    Workload {
        name: name.into(),
        seed,
        output_tokens: 24,
        slo: SLO,
        shape,
        prompts: Default::default(),
    }
}

fn multi_turn(seed: u64, conversations: usize, start_gap_ms: u64, tenants: usize) -> Workload {
    workload(
        "multi-turn",
        seed,
        Shape::MultiTurn {
            conversations,
            turns: 4,
            system_words: 1500,
            user_words: 40,
            start_gap_ms,
            think_time_ms: 3000,
            tenants,
        },
    )
}

fn scenario(workload: Workload) -> Scenario {
    Scenario { workload, faults: Vec::new() }
}

/// The preset called `name`, with workload seeds derived from `seed`.
pub fn preset(name: &str, seed: u64) -> anyhow::Result<Plan> {
    let plan = match name {
        "demo" => Plan {
            name: "demo".into(),
            topology: Topology {
                workers: crate::topology::Workers { count: 3, ..Default::default() },
                ..Default::default()
            },
            policies: vec![Policy::Kvroute, Policy::LeastRequest],
            scenarios: vec![scenario(multi_turn(seed, 24, 500, 1))],
            repeats: default_repeats(),
            rate_scales: default_rates(),
            whatif_sample: default_whatif_sample(),
        },
        "full" => {
            let mut faulty = multi_turn(seed + 5, 30, 600, 2);
            faulty.name = "multi-turn-faults".into();
            Plan {
                name: "full".into(),
                topology: Topology {
                    envoy: crate::topology::EnvoySpec { instances: 2, concurrency: 2 },
                    ..Default::default()
                },
                policies: Policy::COMPARED.to_vec(),
                scenarios: vec![
                    scenario(multi_turn(seed, 30, 600, 2)),
                    scenario(workload(
                        "unique-docs",
                        seed + 1,
                        Shape::UniqueDocs { requests: 80, doc_words: 1200, interval_ms: 300 },
                    )),
                    scenario(workload(
                        "flash-crowd",
                        seed + 2,
                        Shape::FlashCrowd {
                            conversations: 12,
                            turns: 3,
                            system_words: 1200,
                            start_gap_ms: 600,
                            think_time_ms: 3000,
                            hot_at_ms: 8000,
                            hot_requests: 60,
                            hot_interval_ms: 150,
                            hot_system_words: 2500,
                        },
                    )),
                    scenario(workload(
                        "mooncake-trace",
                        seed + 3,
                        Shape::Mooncake {
                            start_ms: 0,
                            window_ms: 300_000,
                            speedup: 10.0,
                            sample: 0.5,
                            tokens_per_block: 32,
                        },
                    )),
                    scenario(workload(
                        "agentic-fan-out",
                        seed + 4,
                        Shape::FanOut {
                            groups: 8,
                            context_words: 2000,
                            fanout: 6,
                            task_words: 30,
                            group_gap_ms: 3000,
                            merge_after_ms: 1500,
                        },
                    )),
                    Scenario {
                        workload: faulty,
                        faults: vec![
                            TimedFault {
                                at_ms: 8000,
                                fault: Fault::Evict { worker: 0, percent: 100 },
                            },
                            TimedFault {
                                at_ms: 11_000,
                                fault: Fault::UpdaterOutage { duration_ms: 4000 },
                            },
                            TimedFault {
                                at_ms: 17_000,
                                fault: Fault::KnowledgeDelay { delay_ms: 1000, duration_ms: 4000 },
                            },
                            TimedFault { at_ms: 22_000, fault: Fault::WorkerLoss { worker: 1 } },
                        ],
                    },
                ],
                repeats: default_repeats(),
                rate_scales: default_rates(),
                whatif_sample: default_whatif_sample(),
            }
        }
        "selfcheck" => Plan {
            name: "selfcheck".into(),
            topology: Topology {
                workers: crate::topology::Workers { count: 3, ..Default::default() },
                ..Default::default()
            },
            policies: vec![Policy::Pinned, Policy::LeastRequest],
            scenarios: vec![scenario(workload(
                "multi-turn-small",
                seed,
                Shape::MultiTurn {
                    conversations: 12,
                    turns: 3,
                    system_words: 800,
                    user_words: 20,
                    start_gap_ms: 100,
                    think_time_ms: 600,
                    tenants: 1,
                },
            ))],
            repeats: 1,
            rate_scales: default_rates(),
            whatif_sample: 0.0,
        },
        other => anyhow::bail!("unknown preset {other} (have: {})", PRESETS.join(", ")),
    };
    Ok(plan)
}

impl Plan {
    pub fn validate(&self) -> anyhow::Result<()> {
        self.topology.validate()?;
        anyhow::ensure!(!self.policies.is_empty(), "a plan needs at least one policy");
        anyhow::ensure!(!self.scenarios.is_empty(), "a plan needs at least one workload");
        anyhow::ensure!((1..=20).contains(&self.repeats), "repeats: between 1 and 20");
        anyhow::ensure!(
            !self.rate_scales.is_empty()
                && self.rate_scales.iter().all(|r| r.is_finite() && *r > 0.0 && *r <= 100.0),
            "rate_scales: at least one, each in (0, 100]"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.whatif_sample),
            "whatif_sample: between 0 and 1"
        );
        let n = self.topology.worker_count();
        for s in &self.scenarios {
            for f in &s.faults {
                if let Fault::WorkerLoss { worker } | Fault::Evict { worker, .. } = f.fault {
                    anyhow::ensure!(worker < n, "fault on worker {worker}, but there are {n}");
                }
            }
        }
        Ok(())
    }

    /// Keeps only the named workloads / policies (all when `None`).
    pub fn select(
        &mut self,
        workloads: Option<&[String]>,
        policies: Option<&[Policy]>,
    ) -> anyhow::Result<()> {
        if let Some(names) = workloads {
            for n in names {
                anyhow::ensure!(
                    self.scenarios.iter().any(|s| &s.workload.name == n),
                    "preset {} has no workload {n}",
                    self.name
                );
            }
            self.scenarios.retain(|s| names.contains(&s.workload.name));
        }
        if let Some(p) = policies {
            self.policies = p.to_vec();
        }
        self.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_schedules_are_reproducible() {
        for name in PRESETS {
            let plan = preset(name, 7).unwrap();
            plan.validate().unwrap();
            let again = preset(name, 7).unwrap();
            for (s, t) in plan.scenarios.iter().zip(&again.scenarios) {
                if matches!(s.workload.shape, Shape::Mooncake { .. }) {
                    continue; // loads the whole trace; its determinism is tested in `mooncake`
                }
                let hash = |w: &Workload| crate::schedule::hash(&w.schedule().unwrap());
                assert_eq!(hash(&s.workload), hash(&t.workload), "{}", s.workload.name);
            }
        }
        let full = preset("full", 7).unwrap();
        assert_eq!(full.policies.len(), Policy::COMPARED.len());
        assert_eq!(full.scenarios.len(), 6);
        assert!(preset("nope", 1).is_err());
    }

    #[test]
    fn selection_and_plan_files() {
        let mut p = preset("full", 1).unwrap();
        assert!(p.select(Some(&["nope".to_string()]), None).is_err());
        p.select(Some(&["unique-docs".to_string()]), Some(&[Policy::Random])).unwrap();
        assert_eq!((p.scenarios.len(), p.policies.as_slice()), (1, &[Policy::Random][..]));
        let text = toml::to_string(&p).unwrap();
        let back: Plan = toml::from_str(&text).unwrap();
        assert_eq!(back, p);
    }
}
