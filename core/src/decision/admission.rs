//! Deadlines, shedding and priority classes: what happens to a request after ranking.
//!
//! A request may carry a time-to-first-token deadline and a priority class (two headers, see
//! [`AdmissionConfig`]). [`admit`] takes the ranked scores of a decision and returns a
//! [`AdmissionVerdict`]:
//! - `Shed { reason: Saturated }` when the class has a `max_wait_ms` and even the
//!   least-waiting worker would make the request wait longer than that before its prefill
//!   (checked first: it is the class's policy, whatever the deadline);
//! - `Shed { reason: Deadline }` or `BestEffort(Deadline)` (by `on_deadline_miss`) when no
//!   worker's estimate meets the deadline;
//! - `Admit` otherwise.
//!
//! An admitted or best-effort request is reordered for its class: workers whose estimate meets
//! the deadline first, then by `cost + (queue_weight - 1) * wait` (the router's cost: TTFT and the
//! priced delay to running streams; stable, so with weight 1 the
//! router's own order, its tie-breaking included, is kept). A class with `queue_weight` 1 and
//! no `max_wait_ms` (the default `interactive`) is therefore decided exactly as without
//! classes; other classes only move or drop their own requests, which can only leave the
//! interactive ones less queued work.
//!
//! Every check uses the estimate admission can promise ([`Score::promise_ttft_ms`],
//! [`Score::promise_wait_ms`]): on a worker with a queue, the estimate times the calibrated
//! upper quantile of observed over estimated (see [`crate::decision::calib`]), with a share of
//! a whole step added first while that quantile has too few samples to be known
//! ([`crate::decision::cost::QueueTerms::promise_fill_ms`]). The estimate is
//! an average over traffic it cannot see (how the batches behind the request fill), and
//! admission selects the requests whose estimate happens to be low, so promising the average
//! breaks about half the promises made behind a queue.
//!
//! Header values are untrusted bytes: anything that is not a plain positive decimal number of
//! milliseconds, or not a class name, falls back to the defaults. They come from clients on
//! purpose and steer nothing in their favour: a deadline can only get a request shed sooner
//! (no deadline is the most lenient), and with the default class the most favoured one, naming
//! another class can only cost the sender. A deployment whose default class is not the most
//! favoured one must have a trusted gateway set or strip the priority header.
//!
//! Admission alone orders nothing inside an engine. A class's `engine_priority` passes it on:
//! [`AdmissionConfig::priority_edit`] says what becomes of the forwarded body's `priority`
//! member ([`priority_field`]: the class's value written, or, once any class sets one, a
//! client's own removed), for engines that order their queue by it (vLLM's
//! `--scheduling-policy priority`: lower values first). The decision already ranked the
//! workers by the queue that runs before the request at that priority
//! ([`crate::shared::load::LoadView::behind`]).

mod config;
pub mod priority_field;
#[cfg(test)]
pub(crate) mod tests;

pub use config::{AdmissionConfig, ClassConfig, MissPolicy};
pub use priority_field::PriorityEdit;

use crate::decision::cost::Score;
use crate::decision::error::ApiError;

/// Why a request was shed or routed best-effort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No worker's TTFT estimate meets the request's deadline.
    Deadline,
    /// The class's `max_wait_ms` is below the shortest estimated wait of the pool.
    Saturated,
}

impl Reason {
    pub const ALL: [Reason; 2] = [Reason::Deadline, Reason::Saturated];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Deadline => "deadline",
            Reason::Saturated => "saturated",
        }
    }
}

/// What to do with a ranked request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionVerdict {
    Admit,
    /// Routed although it will (by the estimate) miss.
    BestEffort(Reason),
    /// Answered 429 with `Retry-After: retry_after_s` (>= 1).
    Shed {
        reason: Reason,
        retry_after_s: u32,
    },
}

impl AdmissionVerdict {
    /// Every outcome's [`AdmissionVerdict::outcome`] name.
    pub const OUTCOMES: [&'static str; 4] =
        ["admitted", "shed_deadline", "shed_saturated", "best_effort_deadline"];

    /// The outcome's counter name: `admitted`, `shed_<reason>` or `best_effort_<reason>`.
    pub fn outcome(&self) -> &'static str {
        match self {
            AdmissionVerdict::Admit => "admitted",
            AdmissionVerdict::Shed { reason: Reason::Deadline, .. } => "shed_deadline",
            AdmissionVerdict::Shed { reason: Reason::Saturated, .. } => "shed_saturated",
            AdmissionVerdict::BestEffort(Reason::Deadline) => "best_effort_deadline",
            AdmissionVerdict::BestEffort(Reason::Saturated) => "best_effort_saturated",
        }
    }
}

/// A request's admission inputs, resolved from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// The TTFT deadline in ms, if any.
    pub deadline_ms: Option<u64>,
    /// Index of its class in `AdmissionConfig::classes`.
    pub class: usize,
}

/// Longest header value read as a deadline (digits, after trimming blanks).
const MAX_DEADLINE_DIGITS: usize = 12;

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(start, |e| e + 1);
    &v[start..end.max(start)]
}

/// A deadline header value: a positive decimal number of milliseconds, blanks around it
/// allowed. `None` (the default applies) for `0`, empty, signs, fractions, non-digits, more
/// than 12 digits, or bytes that are not text.
pub fn parse_deadline_ms(v: &[u8]) -> Option<u64> {
    let v = trim(v);
    if v.is_empty() || v.len() > MAX_DEADLINE_DIGITS || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms = v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    (ms > 0).then_some(ms)
}

impl AdmissionConfig {
    /// The class a priority header value selects (trimmed, ASCII case ignored); absent,
    /// unknown or garbage: the default class.
    pub fn class_of(&self, header: Option<&[u8]>) -> usize {
        let by_header = header.map(trim).and_then(|v| {
            self.classes.iter().position(|c| c.name.as_bytes().eq_ignore_ascii_case(v))
        });
        by_header.or_else(|| self.class_index(&self.default_class)).unwrap_or(0)
    }

    /// The deadline of a request: its header's, else its class's default, else its model's
    /// (`model_default_ms`, 0: none).
    pub fn deadline_ms(
        &self,
        header: Option<&[u8]>,
        class: usize,
        model_default_ms: u64,
    ) -> Option<u64> {
        let class_default = self.classes.get(class).map_or(0, |c| c.deadline_ms);
        header
            .and_then(parse_deadline_ms)
            .or((class_default > 0).then_some(class_default))
            .or((model_default_ms > 0).then_some(model_default_ms))
    }

    /// Both header values resolved.
    pub fn ask(
        &self,
        deadline: Option<&[u8]>,
        priority: Option<&[u8]>,
        model_default_ms: u64,
    ) -> Ask {
        let class = self.class_of(priority);
        Ask { deadline_ms: self.deadline_ms(deadline, class, model_default_ms), class }
    }

    /// What the filter does to the `priority` member of the body of a request of class `i`:
    /// sets the class's `engine_priority`; without one, removes a client's own when any class
    /// sets one (the classes own the engine's queue order); else leaves the body alone.
    pub fn priority_edit(&self, i: usize) -> PriorityEdit {
        match self.classes.get(i).and_then(|c| c.engine_priority) {
            Some(n) => PriorityEdit::Set(n),
            None if self.sets_engine_priority() => PriorityEdit::Remove,
            None => PriorityEdit::Keep,
        }
    }

    /// The engine priority a request of class `i` is forwarded with: the class's
    /// `engine_priority`, else 0 (the engines' default, what a body without one gets).
    pub fn engine_priority(&self, i: usize) -> i32 {
        let p = self.classes.get(i).and_then(|c| c.engine_priority).unwrap_or(0);
        // `validate` keeps it within 32 bits.
        i32::try_from(p).unwrap_or(0)
    }

    /// The name of class `i` (for counters and messages).
    pub fn class_name(&self, i: usize) -> &str {
        self.classes.get(i).map_or("", |c| c.name.as_str())
    }

    /// `Retry-After` seconds for an estimate `over_ms` past its limit: at least 1, at most
    /// `max_retry_after_s`, rounded up (the queue ahead must drain by about that much first).
    pub fn retry_after_s(&self, over_ms: f64) -> u32 {
        let max = self.max_retry_after_s.max(1);
        if !over_ms.is_finite() {
            return max;
        }
        let s = (over_ms.max(0.0) / 1000.0).ceil();
        if s >= f64::from(max) {
            max
        } else {
            (s as u32).clamp(1, max)
        }
    }
}

fn min_of(ranked: &[Score], f: impl Fn(&Score) -> f64) -> Option<f64> {
    ranked.iter().map(f).min_by(f64::total_cmp)
}

/// Decides a ranked request's admission, and reorders `ranked` for its class unless it is
/// shed (see the module documentation). An empty ranking is admitted as is.
pub fn admit(ranked: &mut [Score], ask: &Ask, cfg: &AdmissionConfig) -> AdmissionVerdict {
    let Some(class) = cfg.classes.get(ask.class) else { return AdmissionVerdict::Admit };
    let (Some(best_ttft), Some(best_wait)) =
        (min_of(ranked, Score::promise_ttft_ms), min_of(ranked, Score::promise_wait_ms))
    else {
        return AdmissionVerdict::Admit;
    };
    if let Some(max_wait) = class.max_wait_ms {
        if best_wait > max_wait {
            let retry_after_s = cfg.retry_after_s(best_wait - max_wait);
            return AdmissionVerdict::Shed { reason: Reason::Saturated, retry_after_s };
        }
    }
    let mut verdict = AdmissionVerdict::Admit;
    if let Some(d) = ask.deadline_ms.map(|d| d as f64) {
        if best_ttft > d {
            match class.on_deadline_miss.unwrap_or(cfg.on_deadline_miss) {
                MissPolicy::Shed => {
                    let retry_after_s = cfg.retry_after_s(best_ttft - d);
                    return AdmissionVerdict::Shed { reason: Reason::Deadline, retry_after_s };
                }
                MissPolicy::BestEffort => verdict = AdmissionVerdict::BestEffort(Reason::Deadline),
            }
        }
    }
    let misses = |s: &Score| ask.deadline_ms.is_some_and(|d| s.promise_ttft_ms() > d as f64);
    let extra = class.queue_weight - 1.0;
    if extra > 0.0 {
        let cost = |s: &Score| s.cost_ms + extra * (s.wait_ms - s.passed_ms);
        ranked.sort_by(|a, b| misses(a).cmp(&misses(b)).then(cost(a).total_cmp(&cost(b))));
    } else {
        ranked.sort_by_key(misses);
    }
    verdict
}

/// The decision header's value for a shed request (`expose_decision_header`): why
/// (`shed=deadline` or `shed=saturated`), the class, what it asked (`deadline_ms`, the class's
/// `max_wait_ms`; `-` where none), and the worker with the best promise for that reason
/// (`best_worker`, `none` for an empty ranking) with its estimate, its wait, what admission
/// promised there and the part of the wait foreseen for the urgent work passing it. Times in
/// ms from the decision, as the 429's message states them. Ids and times only.
pub fn shed_detail(
    reason: Reason,
    retry_after_s: u32,
    ranked: &[Score],
    ask: &Ask,
    cfg: &AdmissionConfig,
) -> String {
    let key: fn(&Score) -> f64 = match reason {
        Reason::Deadline => Score::promise_ttft_ms,
        Reason::Saturated => Score::promise_wait_ms,
    };
    let best = ranked.iter().min_by(|a, b| key(a).total_cmp(&key(b)));
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let limit = cfg.classes.get(ask.class).and_then(|c| c.max_wait_ms);
    let ms = |f: fn(&Score) -> f64| or_dash(best.map(|s| format!("{:.1}", f(s))));
    format!(
        "shed={}; class={}; deadline_ms={}; max_wait_ms={}; best_worker={}; predicted_ttft_ms={}; predicted_wait_ms={}; promised_ttft_ms={}; promised_wait_ms={}; passed_ms={}; retry_after_s={retry_after_s}",
        reason.name(),
        cfg.class_name(ask.class),
        or_dash(ask.deadline_ms.map(|d| d.to_string())),
        or_dash(limit.map(|l| format!("{l:.0}"))),
        best.map_or_else(|| "none".to_string(), |s| s.worker.to_string()),
        ms(|s| s.ttft_ms),
        ms(|s| s.wait_ms),
        ms(Score::promise_ttft_ms),
        ms(Score::promise_wait_ms),
        ms(|s| s.passed_ms),
    )
}

/// The 429 body of a shed request (OpenAI's error shape; no prompt content).
pub fn shed_error(
    reason: Reason,
    retry_after_s: u32,
    ranked: &[Score],
    ask: &Ask,
    cfg: &AdmissionConfig,
) -> ApiError {
    let class = cfg.class_name(ask.class);
    let (code, message) = match reason {
        Reason::Deadline => {
            let best = min_of(ranked, Score::promise_ttft_ms).unwrap_or(f64::INFINITY);
            (
                "ttft_deadline_unmeetable",
                format!(
                    "no worker can return a first token within this request's {} ms deadline \
                     (best estimate {best:.0} ms); retry after {retry_after_s} s",
                    ask.deadline_ms.unwrap_or(0)
                ),
            )
        }
        Reason::Saturated => {
            let wait = min_of(ranked, Score::promise_wait_ms).unwrap_or(f64::INFINITY);
            let limit = cfg.classes.get(ask.class).and_then(|c| c.max_wait_ms).unwrap_or(0.0);
            (
                "pool_saturated",
                format!(
                    "the pool is saturated for priority class '{class}' (shortest estimated \
                     wait {wait:.0} ms, class limit {limit:.0} ms); retry after {retry_after_s} s"
                ),
            )
        }
    };
    ApiError { status: 429, kind: "rate_limit_error", code, param: None, message }
}
