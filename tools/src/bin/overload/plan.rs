//! What the bench sends and when: seeded Poisson arrivals in two phases, each a class draw.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::Args;

/// The two priority classes the bench configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Sends a TTFT deadline.
    Interactive,
    /// No deadline; its class sheds above `max_wait_ms`.
    Batch,
}

impl Class {
    /// Both classes, in report order.
    pub const ALL: [Class; 2] = [Class::Interactive, Class::Batch];

    pub fn name(self) -> &'static str {
        match self {
            Class::Interactive => "interactive",
            Class::Batch => "batch",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Overload,
    /// Light traffic after the overload.
    After,
}

impl Phase {
    /// Both phases, in report order.
    pub const ALL: [Phase; 2] = [Phase::Overload, Phase::After];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Overload => "overload",
            Phase::After => "after",
        }
    }
}

/// One request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub id: usize,
    /// From the start of the overload.
    pub at: Duration,
    pub phase: Phase,
    pub class: Class,
    /// The deadline header's value (interactive requests only).
    pub deadline_ms: Option<u64>,
}

/// The overload's arrivals, then the light traffic's (interactive deadlines there:
/// `after_deadline_ms`).
pub fn arrivals(a: &Args, after_deadline_ms: u64) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut out = Vec::new();
    let phases = [
        (Phase::Overload, 0.0, a.seconds as f64, a.rate, a.deadline_ms),
        (
            Phase::After,
            a.seconds as f64,
            (a.seconds + a.after_seconds) as f64,
            a.after_rate,
            after_deadline_ms,
        ),
    ];
    for (phase, from, to, rate, deadline) in phases {
        if rate <= 0.0 {
            continue;
        }
        let mut t = from;
        loop {
            // Exponential gaps: 1 - u is in (0, 1], its logarithm finite.
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            if t >= to {
                break;
            }
            let class = if rng.random::<f64>() < a.interactive_share {
                Class::Interactive
            } else {
                Class::Batch
            };
            out.push(Arrival {
                id: out.len(),
                at: Duration::from_secs_f64(t),
                phase,
                class,
                deadline_ms: (class == Class::Interactive).then_some(deadline),
            });
        }
    }
    out
}

/// English-like text of about `tokens` demo-model tokens (each request prefixes its number).
pub fn prompt_text(tokens: usize) -> anyhow::Result<String> {
    let bundle = kvroute_core::decision::tokenize::model::ModelBundle::demo()?;
    let words =
        (tokens as f64 * kvroute_stack::workload::words_per_token(&bundle)?).round() as usize;
    Ok(kvroute_testkit::textgen::words(11, words.max(1)))
}
