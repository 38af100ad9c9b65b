//! Misdeployment watch: what one filter thread can see of a host or control plane that did not
//! set kvroute up the way it needs, and how it makes that loud instead of silent.
//!
//! Three symptoms ([`Symptom`]):
//! - **the body is never delivered.** The filter pauses a POST to read its body. Envoy honours
//!   the pause only with `allow_on_headers_stop_iteration: true` on the wasm filter; without it
//!   the request body never reaches the filter and the request would wait for its timeout. The
//!   glue resumes any request whose body made no progress for `body_wait_ms` (the cluster's own
//!   balancing then chooses), and once a thread has seen a paused request get no body at all
//!   while it never saw a body arrive, it stops pausing (requests pass on at once, counted),
//!   except one probe per `probe_interval_ms` that waits to see whether bodies arrive now;
//! - **no knowledge.** The updater's snapshots never arrived within `knowledge_within_ms` of
//!   the filter's start (no singleton, no updater cluster, a wrong token);
//! - **the destination header is ignored.** At least `override_mismatch_percent` of the last
//!   `override_window` answered requests came from a worker other than the header's primary:
//!   the cluster has no `override_host`.
//!
//! [`Watch`] is a pure state machine over those observations and the clock; the glue feeds it
//! and turns its answers into a gauge per symptom, a warning at most once per
//! `warn_interval_ms`, and a `misdeployed=` field in the decision header.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// A sign that kvroute is not deployed as it needs to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Symptom {
    BodyNotDelivered,
    NoKnowledge,
    OverrideIgnored,
}

impl Symptom {
    pub const ALL: [Symptom; 3] =
        [Symptom::BodyNotDelivered, Symptom::NoKnowledge, Symptom::OverrideIgnored];

    /// Its name in metrics and in the decision header.
    pub fn name(self) -> &'static str {
        match self {
            Symptom::BodyNotDelivered => "body_not_delivered",
            Symptom::NoKnowledge => "no_knowledge",
            Symptom::OverrideIgnored => "override_ignored",
        }
    }

    /// What is wrong and what to change, in plain words (for the log).
    pub fn advice(self) -> &'static str {
        match self {
            Symptom::BodyNotDelivered => {
                "request bodies never reach the filter: set allow_on_headers_stop_iteration: true \
                 on the envoy.filters.http.wasm filter (Istio: use the EnvoyFilter in \
                 deploy/k8s/istio; Envoy Gateway: the EnvoyPatchPolicy in deploy/k8s/envoy-gateway). \
                 POSTs pass on unrouted (fallback=body_not_delivered) until then"
            }
            Symptom::NoKnowledge => {
                "no knowledge snapshot from the updater has arrived: the singleton bootstrap \
                 extension, the updater's cluster or the token is missing or wrong; routing uses \
                 load and routing history only"
            }
            Symptom::OverrideIgnored => {
                "the workers' cluster ignores the destination header (most answers come from a \
                 worker kvroute did not choose): give the cluster the \
                 envoy.load_balancing_policies.override_host policy reading that header"
            }
        }
    }
}

/// Why a request the filter paused was passed on without a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrouted {
    /// No byte of its body reached the filter (or the thread knows bodies never do).
    BodyNotDelivered,
    /// Part of its body arrived, then nothing more for `body_wait_ms` (a stalled client): it
    /// is answered 408.
    BodyTimeout,
}

impl Unrouted {
    pub const ALL: [Unrouted; 2] = [Unrouted::BodyNotDelivered, Unrouted::BodyTimeout];

    /// Its name as a fallback reason (metrics, decision header).
    pub fn name(self) -> &'static str {
        match self {
            Unrouted::BodyNotDelivered => "body_not_delivered",
            Unrouted::BodyTimeout => "body_timeout",
        }
    }
}

/// `misdeployment` in the filter config.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct MisdeployConfig {
    /// A paused POST none of whose body arrived within this long (ms) is passed on unrouted
    /// (the cluster's balancing chooses); one whose body stopped part way for this long is
    /// answered 408. Bounds how long a request can wait on the filter.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 60_000)))]
    pub body_wait_ms: u64,
    /// While bodies are known not to arrive, one request per this period (ms) still waits for
    /// its body, to notice a fixed host configuration.
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub probe_interval_ms: u64,
    /// The updater's knowledge is expected within this long (ms) of the filter's start; `0`
    /// when the deployment runs no updater on purpose.
    pub knowledge_within_ms: u64,
    /// How many recent answered, routed requests the header check looks at.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1024)))]
    pub override_window: u32,
    /// Percent of that window served by a worker the header did not name that means the
    /// header is ignored.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 100)))]
    pub override_mismatch_percent: u8,
    /// Each symptom's warning is logged at most once per this period (ms).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub warn_interval_ms: u64,
}

impl Default for MisdeployConfig {
    fn default() -> Self {
        MisdeployConfig {
            body_wait_ms: 2_000,
            probe_interval_ms: 60_000,
            knowledge_within_ms: 30_000,
            override_window: 16,
            override_mismatch_percent: 50,
            warn_interval_ms: 60_000,
        }
    }
}

impl MisdeployConfig {
    pub fn validate(&self, tick_ms: u64) -> Result<(), String> {
        if self.body_wait_ms == 0 || self.body_wait_ms > 60_000 {
            return Err("misdeployment.body_wait_ms must be 1..=60000".into());
        }
        if self.body_wait_ms < tick_ms {
            return Err("misdeployment.body_wait_ms must be >= tick_ms (the tick resumes)".into());
        }
        if self.probe_interval_ms == 0 || self.warn_interval_ms == 0 {
            return Err("misdeployment intervals must be > 0".into());
        }
        if self.override_window == 0 || self.override_window > 1024 {
            return Err("misdeployment.override_window must be 1..=1024".into());
        }
        if !(1..=100).contains(&self.override_mismatch_percent) {
            return Err("misdeployment.override_mismatch_percent must be 1..=100".into());
        }
        Ok(())
    }
}

/// One thread's view of the symptoms.
#[derive(Debug, Clone)]
pub struct Watch {
    cfg: MisdeployConfig,
    started_ms: u64,
    /// A body ever reached this thread's filter: the host delivers bodies.
    body_seen: bool,
    /// A paused request got no body at all while none ever arrived.
    body_missing: bool,
    next_probe_ms: u64,
    knowledge_arrived: bool,
    /// Recent answered, routed requests: `true` when served by a worker the header named.
    honoured: VecDeque<bool>,
    last_warned_ms: [Option<u64>; 3],
}

impl Watch {
    pub fn new(cfg: MisdeployConfig, now_ms: u64) -> Watch {
        Watch {
            cfg,
            started_ms: now_ms,
            body_seen: false,
            body_missing: false,
            next_probe_ms: 0,
            knowledge_arrived: false,
            honoured: VecDeque::new(),
            last_warned_ms: [None; 3],
        }
    }

    pub fn config(&self) -> &MisdeployConfig {
        &self.cfg
    }

    /// Whether a POST whose body the filter needs should be paused to wait for it. `false`
    /// while this thread knows bodies are not delivered, except one probe per period.
    pub fn should_pause(&mut self, now_ms: u64) -> bool {
        if !self.body_missing {
            return true;
        }
        if now_ms >= self.next_probe_ms {
            self.next_probe_ms = now_ms.saturating_add(self.cfg.probe_interval_ms);
            return true;
        }
        false
    }

    /// A body chunk reached the filter.
    pub fn body_delivered(&mut self) {
        self.body_seen = true;
        self.body_missing = false;
    }

    /// A paused request was passed on after `body_wait_ms`; `got_body`: part of it arrived.
    /// Returns why, for its metric and decision header.
    pub fn timed_out(&mut self, got_body: bool, now_ms: u64) -> Unrouted {
        if got_body {
            return Unrouted::BodyTimeout;
        }
        if !self.body_seen && !self.body_missing {
            self.body_missing = true;
            self.next_probe_ms = now_ms.saturating_add(self.cfg.probe_interval_ms);
        }
        Unrouted::BodyNotDelivered
    }

    /// The updater's knowledge has arrived at least once (snapshot version > 0).
    pub fn knowledge(&mut self, arrived: bool) {
        self.knowledge_arrived |= arrived;
    }

    /// An answered, routed request: whether the worker that served it was the header's primary
    /// (a fallback serves only after the primary failed). A cluster that ignores the header
    /// balances on its own: with `n` workers it misses the primary `(n - 1) / n` of the time,
    /// so two workers sit right at the default threshold; three or more are clear.
    pub fn served(&mut self, named_in_header: bool) {
        let window = self.cfg.override_window as usize;
        while self.honoured.len() >= window {
            self.honoured.pop_front();
        }
        self.honoured.push_back(named_in_header);
    }

    /// Whether `s` is present now.
    pub fn has(&self, s: Symptom, now_ms: u64) -> bool {
        match s {
            Symptom::BodyNotDelivered => self.body_missing,
            Symptom::NoKnowledge => {
                let within = self.cfg.knowledge_within_ms;
                within > 0
                    && !self.knowledge_arrived
                    && now_ms.saturating_sub(self.started_ms) >= within
            }
            Symptom::OverrideIgnored => {
                let n = self.honoured.len();
                if n < self.cfg.override_window as usize {
                    return false;
                }
                let missed = self.honoured.iter().filter(|h| !**h).count();
                missed * 100 >= n * usize::from(self.cfg.override_mismatch_percent)
            }
        }
    }

    /// The symptoms present now, in [`Symptom::ALL`] order.
    pub fn present(&self, now_ms: u64) -> Vec<Symptom> {
        Symptom::ALL.into_iter().filter(|s| self.has(*s, now_ms)).collect()
    }

    /// `misdeployed=` as the decision header shows it: `none` or names joined by `+`.
    pub fn header_field(&self, now_ms: u64) -> String {
        let names: Vec<&str> = self.present(now_ms).into_iter().map(Symptom::name).collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join("+")
        }
    }

    /// The present symptoms whose warning is due (at most once per `warn_interval_ms` each);
    /// marks them warned.
    pub fn warnings_due(&mut self, now_ms: u64) -> Vec<Symptom> {
        let mut due = Vec::new();
        for (i, s) in Symptom::ALL.into_iter().enumerate() {
            if !self.has(s, now_ms) {
                continue;
            }
            let last = self.last_warned_ms[i];
            if last.is_none_or(|t| now_ms.saturating_sub(t) >= self.cfg.warn_interval_ms) {
                self.last_warned_ms[i] = Some(now_ms);
                due.push(s);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests;
