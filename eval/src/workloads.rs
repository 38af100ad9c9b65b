//! The workloads of a comparison. Each is made from a seed, turned once into an open-loop
//! [`Scheduled`] list that every policy replays identically, and carries its SLO.

use std::time::Duration;

use anyhow::Context;
use kvroute_testkit::textgen::{draw, words};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::model::BenchModel;
use crate::mooncake;
use crate::record::Slo;
use crate::schedule::{chat_body, completions_body, Scheduled, CHAT, COMPLETIONS};
use kvroute_stack::workload::Conversation;

/// The shape of a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Shape {
    /// Stable multi-turn conversations, each with its own long system prompt; conversation `c`
    /// belongs to tenant `c % tenants` (tenants other than the first send a `cache_salt`).
    MultiTurn {
        conversations: usize,
        turns: usize,
        system_words: usize,
        user_words: usize,
        start_gap_ms: u64,
        think_time_ms: u64,
        tenants: usize,
    },
    /// Many unique documents, each asked about once (little reuse).
    UniqueDocs { requests: usize, doc_words: usize, interval_ms: u64 },
    /// Background conversations, then from `hot_at_ms` a flash crowd on one long system prompt.
    FlashCrowd {
        conversations: usize,
        turns: usize,
        system_words: usize,
        start_gap_ms: u64,
        think_time_ms: u64,
        hot_at_ms: u64,
        hot_requests: usize,
        hot_interval_ms: u64,
        hot_system_words: usize,
    },
    /// The Mooncake conversation trace (see `mooncake::find_trace`), compressed and sampled.
    Mooncake { start_ms: u64, window_ms: u64, speedup: f64, sample: f64, tokens_per_block: usize },
    /// Agentic fan-out: one context, `fanout` parallel sub-requests, then a merge request.
    FanOut {
        groups: usize,
        context_words: usize,
        fanout: usize,
        task_words: usize,
        group_gap_ms: u64,
        merge_after_ms: u64,
    },
}

/// How prompts travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptForm {
    /// Chat messages to `/v1/chat/completions`: Envoy's filter and the workers render and
    /// tokenize every request (what a real deployment does).
    #[default]
    Chat,
    /// The same conversations rendered and tokenized once, when the schedule is made, and sent
    /// as token ids to `/v1/completions`: the same prefixes and lengths, while the 2-core
    /// host spends its time on routing and serving instead of tokenizing long prompts.
    TokenIds,
}

/// A named, seeded workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    pub seed: u64,
    /// Fixed output length of every request (equal budgets across policies).
    pub output_tokens: u64,
    pub slo: Slo,
    pub shape: Shape,
    #[serde(default)]
    pub prompts: PromptForm,
}

/// A jittered duration in [0.5, 1.5) x `span`, from the seed.
fn jitter(seed: u64, i: u64, span: Duration) -> Duration {
    span.mul_f64(0.5 + (draw(seed, i) % 1000) as f64 / 1000.0)
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn tenant_name(t: usize) -> String {
    ((b'a' + (t % 26) as u8) as char).to_string()
}

impl Workload {
    /// The open-loop schedule for the demo model, sorted by arrival.
    pub fn schedule(&self) -> anyhow::Result<Vec<Scheduled>> {
        self.schedule_for(BenchModel::Demo)
    }

    /// The open-loop schedule for `model`, sorted by arrival: its name in every request, and
    /// trace text sized in its tokens.
    pub fn schedule_for(&self, model: BenchModel) -> anyhow::Result<Vec<Scheduled>> {
        let name = model.name();
        let out_tokens = self.output_tokens;
        let seed = self.seed;
        let mut out = match &self.shape {
            Shape::MultiTurn {
                conversations,
                turns,
                system_words,
                user_words,
                start_gap_ms,
                think_time_ms,
                tenants,
            } => {
                let mut out = Vec::new();
                for c in 0..*conversations {
                    let tenant = c % (*tenants).max(1);
                    let conv = Conversation::new(seed, c, *system_words, *user_words, *turns);
                    let mut at =
                        ms(start_gap_ms * c as u64) + jitter(seed, c as u64, ms(*start_gap_ms));
                    for t in 0..*turns {
                        if t > 0 {
                            at += jitter(seed ^ 0x7, (c * 1000 + t) as u64, ms(*think_time_ms));
                        }
                        let mut body = conv.body(name, t, out_tokens, true);
                        if tenant > 0 {
                            body["cache_salt"] = json!(format!("tenant-{}", tenant_name(tenant)));
                        }
                        let turn = if t == 0 { "turn-1" } else { "turn-2+" };
                        let mut cohorts = vec![turn.to_string()];
                        if *tenants > 1 {
                            cohorts.push(format!("tenant:{}", tenant_name(tenant)));
                        }
                        out.push(Scheduled {
                            endpoint: CHAT,
                            at,
                            body,
                            output_tokens: out_tokens,
                            cohorts,
                        });
                    }
                }
                out
            }
            Shape::UniqueDocs { requests, doc_words, interval_ms } => {
                let mut at = Duration::ZERO;
                (0..*requests)
                    .map(|i| {
                        at += jitter(seed ^ 0xD0C, i as u64, ms(*interval_ms));
                        let doc = words(seed.wrapping_add(0xD0C0 + i as u64), *doc_words);
                        let q = words(seed.wrapping_add(0x9 + i as u64), 12);
                        let msgs = vec![
                            json!({"role": "user", "content": format!("{doc}\n\nQuestion:{q}")}),
                        ];
                        Scheduled {
                            endpoint: CHAT,
                            at,
                            body: chat_body(name, msgs, out_tokens),
                            output_tokens: out_tokens,
                            cohorts: vec!["unique-doc".into()],
                        }
                    })
                    .collect()
            }
            Shape::FlashCrowd {
                conversations,
                turns,
                system_words,
                start_gap_ms,
                think_time_ms,
                hot_at_ms,
                hot_requests,
                hot_interval_ms,
                hot_system_words,
            } => {
                let background = Workload {
                    shape: Shape::MultiTurn {
                        conversations: *conversations,
                        turns: *turns,
                        system_words: *system_words,
                        user_words: 30,
                        start_gap_ms: *start_gap_ms,
                        think_time_ms: *think_time_ms,
                        tenants: 1,
                    },
                    ..self.clone()
                };
                let mut out: Vec<Scheduled> = background
                    .schedule_for(model)?
                    .into_iter()
                    .map(|mut s| {
                        s.cohorts = vec!["background".into()];
                        s
                    })
                    .collect();
                let system = words(seed ^ 0x407, *hot_system_words);
                let mut at = ms(*hot_at_ms);
                for i in 0..*hot_requests {
                    at += jitter(seed ^ 0x408, i as u64, ms(*hot_interval_ms));
                    let msgs = vec![
                        json!({"role": "system", "content": system}),
                        json!({"role": "user", "content": words(seed.wrapping_add(0x4090 + i as u64), 25)}),
                    ];
                    out.push(Scheduled {
                        endpoint: CHAT,
                        at,
                        body: chat_body(name, msgs, out_tokens),
                        output_tokens: out_tokens,
                        cohorts: vec!["hot-prefix".into()],
                    });
                }
                out
            }
            Shape::Mooncake { start_ms, window_ms, speedup, sample, tokens_per_block } => {
                let path = mooncake::find_trace()?;
                let trace = mooncake::load(&path)
                    .with_context(|| format!("loading the Mooncake trace {}", path.display()))?;
                mooncake::Replay {
                    seed,
                    start_ms: *start_ms,
                    window_ms: *window_ms,
                    speedup: *speedup,
                    sample: *sample,
                    tokens_per_block: *tokens_per_block,
                    max_output_tokens: out_tokens,
                    model: name.into(),
                    words_per_token: model.words_per_token(),
                }
                .schedule(&trace)
            }
            Shape::FanOut {
                groups,
                context_words,
                fanout,
                task_words,
                group_gap_ms,
                merge_after_ms,
            } => {
                let mut out = Vec::new();
                for g in 0..*groups {
                    let context = words(seed.wrapping_add(0xFA0 + g as u64), *context_words);
                    let start = ms(group_gap_ms * g as u64)
                        + jitter(seed ^ 0xFA, g as u64, ms(*group_gap_ms / 4));
                    let system = json!({"role": "system", "content": context});
                    let mut answers = Vec::new();
                    for k in 0..*fanout {
                        let task = words(
                            seed.wrapping_add(0xFA1_0000 + (g * 1000 + k) as u64),
                            *task_words,
                        );
                        answers.push(words(
                            seed.wrapping_add(0xFA2_0000 + (g * 1000 + k) as u64),
                            out_tokens as usize,
                        ));
                        let msgs = vec![system.clone(), json!({"role": "user", "content": task})];
                        out.push(Scheduled {
                            endpoint: CHAT,
                            at: start + ms(k as u64 * 5),
                            body: chat_body(name, msgs, out_tokens),
                            output_tokens: out_tokens,
                            cohorts: vec!["fanout-sub".into()],
                        });
                    }
                    let merge = format!("Merge these findings:{}", answers.join("\n"));
                    let msgs = vec![system, json!({"role": "user", "content": merge})];
                    out.push(Scheduled {
                        endpoint: CHAT,
                        at: start + ms(*merge_after_ms),
                        body: chat_body(name, msgs, out_tokens),
                        output_tokens: out_tokens,
                        cohorts: vec!["fanout-merge".into()],
                    });
                }
                out
            }
        };
        out.sort_by_key(|s| s.at);
        if self.prompts == PromptForm::TokenIds {
            let bundle = model.bundle()?;
            for s in &mut out {
                *s = as_token_ids(&bundle, s)?;
            }
        }
        Ok(out)
    }

    /// One line for the report's scope header.
    pub fn describe(&self) -> String {
        let what = match &self.shape {
            Shape::MultiTurn { conversations, turns, system_words, tenants, .. } => format!(
                "multi-turn: {conversations} conversations x {turns} turns, system prompt {system_words} words, {tenants} tenant(s)"
            ),
            Shape::UniqueDocs { requests, doc_words, .. } => {
                format!("unique documents: {requests} requests of {doc_words} words")
            }
            Shape::FlashCrowd { conversations, hot_at_ms, hot_requests, hot_system_words, .. } => format!(
                "flash crowd: {conversations} background conversations; from t={:.1} s, {hot_requests} requests on one {hot_system_words}-word system prompt",
                *hot_at_ms as f64 / 1000.0
            ),
            Shape::Mooncake { start_ms, window_ms, speedup, sample, tokens_per_block } => format!(
                "Mooncake conversation trace: window {:.0}-{:.0} s, sampled {:.0} %, time compressed x{speedup}, one 512-token trace block = {tokens_per_block} tokens",
                *start_ms as f64 / 1000.0,
                (*start_ms + *window_ms) as f64 / 1000.0,
                sample * 100.0
            ),
            Shape::FanOut { groups, context_words, fanout, .. } => format!(
                "agentic fan-out: {groups} contexts of {context_words} words, {fanout} parallel sub-requests each, then a merge"
            ),
        };
        format!(
            "{} ({what}; output {} tokens per request; seed {})",
            self.name, self.output_tokens, self.seed
        )
    }
}

/// `s` with its chat prompt rendered and tokenized as the engine does, sent as token ids to
/// `/v1/completions` (the `cache_salt` kept); requests already in that form are unchanged.
pub fn as_token_ids(
    bundle: &kvroute_core::decision::tokenize::model::ModelBundle,
    s: &Scheduled,
) -> anyhow::Result<Scheduled> {
    if s.endpoint != CHAT {
        return Ok(s.clone());
    }
    let ids = prompt_tokens(bundle, s)?;
    let model = s.body["model"].as_str().unwrap_or_default();
    let mut body = completions_body(model, &ids, s.output_tokens);
    if let Some(salt) = s.body.get("cache_salt") {
        body["cache_salt"] = salt.clone();
    }
    Ok(Scheduled { endpoint: COMPLETIONS, body, ..s.clone() })
}

/// The engine's prompt tokens of a scheduled request, and its cache salt.
pub(crate) fn parsed(
    s: &Scheduled,
) -> anyhow::Result<kvroute_core::decision::request::ParsedRequest> {
    use kvroute_core::decision::request::{parse, Endpoint};
    let endpoint = if s.endpoint == COMPLETIONS { Endpoint::Completions } else { Endpoint::Chat };
    Ok(parse(endpoint, s.body.to_string().as_bytes())?)
}

fn prompt_tokens(
    bundle: &kvroute_core::decision::tokenize::model::ModelBundle,
    s: &Scheduled,
) -> anyhow::Result<Vec<u32>> {
    Ok(bundle.prompt_tokens(&parsed(s)?.prompt)?)
}

/// The hit rate of one unbounded cache that saw every request in order: cached tokens (whole
/// reused blocks) over prompt tokens, tenants kept apart. No routing can beat it.
pub fn reuse_ceiling(schedule: &[Scheduled], block_size: u32) -> anyhow::Result<f64> {
    reuse_ceiling_with(
        &kvroute_core::decision::tokenize::model::ModelBundle::demo()?,
        schedule,
        block_size,
    )
}

/// [`reuse_ceiling`] with the served model's `bundle`.
pub fn reuse_ceiling_with(
    bundle: &kvroute_core::decision::tokenize::model::ModelBundle,
    schedule: &[Scheduled],
    block_size: u32,
) -> anyhow::Result<f64> {
    let per = crate::report::ceiling::per_request(bundle, schedule, block_size)?;
    let (reused, total) = per.iter().fold((0u64, 0u64), |(r, t), [a, b]| (r + a, t + b));
    Ok(if total == 0 { 0.0 } else { reused as f64 / total as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::hash;

    fn slo() -> Slo {
        Slo { ttft_ms: 1000.0, mean_gap_ms: 100.0, stall_ms: 250.0 }
    }

    fn all(seed: u64) -> Vec<Workload> {
        let w = |name: &str, shape| Workload {
            name: name.into(),
            seed,
            output_tokens: 8,
            slo: slo(),
            shape,
            prompts: PromptForm::Chat,
        };
        vec![
            w(
                "multi-turn",
                Shape::MultiTurn {
                    conversations: 4,
                    turns: 3,
                    system_words: 60,
                    user_words: 10,
                    start_gap_ms: 100,
                    think_time_ms: 500,
                    tenants: 2,
                },
            ),
            w("unique", Shape::UniqueDocs { requests: 6, doc_words: 80, interval_ms: 100 }),
            w(
                "flash",
                Shape::FlashCrowd {
                    conversations: 2,
                    turns: 2,
                    system_words: 50,
                    start_gap_ms: 100,
                    think_time_ms: 300,
                    hot_at_ms: 500,
                    hot_requests: 5,
                    hot_interval_ms: 20,
                    hot_system_words: 100,
                },
            ),
            w(
                "fanout",
                Shape::FanOut {
                    groups: 2,
                    context_words: 80,
                    fanout: 3,
                    task_words: 10,
                    group_gap_ms: 1000,
                    merge_after_ms: 400,
                },
            ),
        ]
    }

    #[test]
    fn same_seed_same_schedule_for_every_workload() {
        for (a, b) in all(5).iter().zip(all(5)) {
            assert_eq!(hash(&a.schedule().unwrap()), hash(&b.schedule().unwrap()), "{}", a.name);
        }
        for (a, b) in all(5).iter().zip(all(6)) {
            assert_ne!(hash(&a.schedule().unwrap()), hash(&b.schedule().unwrap()), "{}", a.name);
        }
    }

    #[test]
    fn shapes_have_their_cohorts_and_order() {
        let [mt, unique, flash, fanout] = <[Workload; 4]>::try_from(all(1)).unwrap();
        let s = mt.schedule().unwrap();
        assert_eq!(s.len(), 12);
        assert!(s.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(s.iter().any(|x| x.body.get("cache_salt").is_some()), "second tenant salts");
        assert!(s.iter().any(|x| x.cohorts.contains(&"tenant:b".to_string())));
        let u = unique.schedule().unwrap();
        assert!(u.iter().all(|x| x.cohorts == ["unique-doc"]));
        let f = flash.schedule().unwrap();
        let hot: Vec<_> = f.iter().filter(|x| x.cohorts == ["hot-prefix"]).collect();
        assert_eq!(hot.len(), 5);
        assert!(hot.iter().all(|x| x.at >= Duration::from_millis(500)));
        assert_eq!(
            hot[0].body["messages"][0], hot[4].body["messages"][0],
            "one shared system prompt"
        );
        let o = fanout.schedule().unwrap();
        assert_eq!(o.iter().filter(|x| x.cohorts == ["fanout-merge"]).count(), 2);
        assert_eq!(o.iter().filter(|x| x.cohorts == ["fanout-sub"]).count(), 6);
    }

    #[test]
    fn ceilings_reflect_reuse() {
        let [mt, unique, flash, _] = <[Workload; 4]>::try_from(all(1)).unwrap();
        let c = |w: &Workload| reuse_ceiling(&w.schedule().unwrap(), 16).unwrap();
        assert!(c(&unique) < 0.05, "unique documents barely reuse: {}", c(&unique));
        assert!(c(&mt) > 0.3, "later turns reuse earlier ones: {}", c(&mt));
        assert!(c(&flash) > c(&unique));
    }

    #[test]
    fn qwen3_schedules_name_qwen3_and_reuse_in_its_tokens() {
        let qwen3 = BenchModel::Qwen3.bundle().unwrap();
        let [mt, unique, ..] = <[Workload; 4]>::try_from(all(1)).unwrap();
        let s = mt.schedule_for(BenchModel::Qwen3).unwrap();
        assert!(s.iter().all(|x| x.body["model"] == "qwen3"));
        let demo = mt.schedule().unwrap();
        assert_eq!(s.len(), demo.len());
        assert!(demo.iter().all(|x| x.body["model"] == "kvroute-demo"));
        let c = |w: &Workload| {
            reuse_ceiling_with(&qwen3, &w.schedule_for(BenchModel::Qwen3).unwrap(), 16).unwrap()
        };
        assert!(c(&mt) > 0.3 && c(&unique) < 0.05, "{} {}", c(&mt), c(&unique));
    }
}
