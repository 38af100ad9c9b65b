//! One request: buffer the body, decide, set the destination header; then watch the response
//! for the worker that really served it, its status, the first byte (prefill done) and the
//! usage counts (prediction audit), and release the load when the stream ends however it ends.
//! What to do at each step is `kvroute_core::flow::lifecycle` ([`Intake`] for the request,
//! [`Lifecycle`] for a routed request's credit, load and health marks); this carries out its
//! effects. Every host value is read as bytes through [`crate::host`]; nothing here can panic.

use std::cell::Cell;
use std::rc::Rc;

use kvroute_core::decision::calib::steps::StreamSteps;
use kvroute_core::decision::error::ApiError;
use kvroute_core::decision::misdeploy::{Symptom, Unrouted};
use kvroute_core::decision::request::{self, Endpoint};
use kvroute_core::decision::router::Decision;
use kvroute_core::decision::usage::UsageScanner;
use kvroute_core::flow::admission;
use kvroute_core::flow::lifecycle::{Effect, Intake, Lifecycle, Step};
use kvroute_core::shared::load::{AtPriority, Ticket};
use kvroute_core::wire::journal::{JournalEntry, Source};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel};

use crate::host;
use crate::root::{Catch, ThreadState};

/// Response header with the decision summary, when the config asks for it.
pub const DECISION_HEADER: &str = "x-kvroute-decision";
/// Envoy's per-try timeout request header (the native header_mutation filter strips clients'
/// copies of every `x-envoy-*` header before this filter runs).
pub const PER_TRY_TIMEOUT_HEADER: &str = "x-envoy-upstream-rq-per-try-timeout-ms";

/// A routed request still in flight.
struct InFlight {
    decision: Decision,
    ticket: Ticket,
    /// A P/D pool's prefill worker's share of the load: its prefill, ended at the first byte.
    prefill_ticket: Option<Ticket>,
    /// The worker planned and the one Envoy used (it differs after a retry), the status, and
    /// whether prefill is done and the load released.
    life: Lifecycle,
    scanner: UsageScanner,
    /// The decision's own time (µs), body arrival to destination header, and the part of it
    /// spent parsing the body.
    decision_us: u64,
    parse_us: u64,
    /// The part spent applying the threads' journal and the updater's knowledge, and of that
    /// the journal alone.
    catchup_us: u64,
    journal_us: u64,
    /// The part spent in the router's decision proper (lookups, scoring, the look-ahead).
    decide_us: u64,
    /// When the decision was made (ns): online calibration times the first byte from it.
    decided_ns: u64,
    /// The engine priority the request was sent with (0: none).
    priority: i32,
    /// Its answer's decode steps, timed for calibration (not for a P/D pool's, nor with
    /// calibration off).
    steps: Option<StreamSteps>,
    /// The requests this Envoy had in flight on the worker at the first byte (set by the
    /// calibration sample, taken by the steps).
    batch_at_first_byte: Cell<Option<u32>>,
}

pub struct KvHttp {
    state: Rc<ThreadState>,
    /// This stream's HTTP context id (the tick resumes it by id).
    id: u32,
    /// The request side: routed or not, the body buffered so far, passed on unrouted.
    intake: Intake,
    inflight: Option<InFlight>,
    /// The deadline and priority header values as sent (bytes; resolved after the decision,
    /// which names the model whose default deadline applies).
    admission_headers: (Option<Vec<u8>>, Option<Vec<u8>>),
}

impl KvHttp {
    pub fn new(state: Rc<ThreadState>, id: u32) -> Self {
        KvHttp {
            state,
            id,
            intake: Intake::default(),
            inflight: None,
            admission_headers: (None, None),
        }
    }

    fn reject(&self, e: &ApiError) -> Action {
        self.state.waiting.done(self.id);
        self.state.metrics.rejected();
        host::send_response(e.status, &[("content-type", "application/json")], &e.body());
        Action::Pause
    }

    /// A random draw for tie-breaking, from the clock and this stream's identity.
    fn pick(&self, now_ms: u64) -> u64 {
        let seed = self as *const Self as usize as u64;
        xxhash_rust::xxh3::xxh3_64_with_seed(&host::now_nanos().to_le_bytes(), seed ^ now_ms)
    }

    fn journal(&self, worker: &str, hashes: &[u64], source: Source, retract: bool) {
        if hashes.is_empty() {
            return;
        }
        self.state.publish(JournalEntry {
            seq: 0,
            at_ms: host::now_ms(),
            source,
            worker: worker.to_owned(),
            hashes: hashes.to_vec(),
            retract,
        });
    }

    /// Deadline and priority class: reorders the decision for the request's class, or answers
    /// 429 (`Err`) before the request takes any load or journal credit.
    fn admit(&self, decision: &mut Decision) -> Result<admission::Admission, Action> {
        let (deadline, priority) = &self.admission_headers;
        let mut a = admission::admit(
            &self.state.config,
            &decision.model.name,
            &mut decision.ranked,
            deadline.as_deref(),
            priority.as_deref(),
        );
        self.state.metrics.admission.outcome(&a.class, &a.verdict);
        let Some(shed) = a.shed.take() else { return Ok(a) };
        let mut headers =
            vec![("content-type", "application/json"), ("retry-after", shed.retry_after.as_str())];
        if let Some(detail) = &shed.detail {
            headers.push((DECISION_HEADER, detail.as_str()));
        }
        host::send_response(shed.error.status, &headers, &shed.error.body());
        Err(Action::Pause)
    }

    /// Writes the class's engine priority into the body forwarded (see
    /// `admission::forwarded_body`), and its new length into `content-length` when the client
    /// sent one: the body is still buffered here and the headers have not gone upstream yet,
    /// so Envoy forwards both as set (a stale length would cut or stall the request).
    fn forward_body(
        &self,
        a: &admission::Admission,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Result<(), ApiError> {
        let new = match admission::forwarded_body(a, endpoint, body) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(()),
            Err(e) => return Err(ApiError::bad_request("invalid_body", None, e.to_string())),
        };
        if hostcalls::set_buffer(BufferType::HttpRequestBody, 0, body.len(), &new).is_err() {
            return Err(ApiError {
                status: 500,
                kind: "server_error",
                code: "body_rewrite_failed",
                param: None,
                message: "the request body could not be rewritten".into(),
            });
        }
        if host::request_header("content-length").is_some() {
            host::set_request_header("content-length", Some(&new.len().to_string()));
        }
        Ok(())
    }

    fn route(&mut self, endpoint: Endpoint, body: &[u8]) -> Action {
        let started = host::now_nanos();
        let parsed = match request::parse(endpoint, body) {
            Ok(p) => p,
            Err(e) => return self.reject(&e.into()),
        };
        let parse_us = host::now_nanos().saturating_sub(started) / 1000;
        let state = Rc::clone(&self.state);
        let caught_up = host::now_nanos();
        let journal_us = state.catch_up(Catch::Request) / 1000;
        let catchup_us = host::now_nanos().saturating_sub(caught_up) / 1000;
        let now = host::now_ms();
        state.refresh_calibration(now);
        let health = state.refresh_health(now);
        // Read before the view: the claim below finds whether another thread decided since.
        let epoch = state.decision_epoch();
        let view = state.load_view(now);
        // The engine priority the request goes with: on engines that schedule by it, the
        // less urgent work queued behind a step is not in its wait.
        let priority = admission::engine_priority(
            &state.config,
            endpoint,
            self.admission_headers.1.as_deref(),
        );
        let pick = self.pick(now);
        let deciding = host::now_nanos();
        let at = AtPriority { view: &view, priority };
        let decided = state.router.borrow().decide(&parsed, body.len(), &at, now, pick);
        // One clock read ends the router's part and starts the calibration's timing.
        let decided_ns = host::now_nanos();
        let decide_us = decided_ns.saturating_sub(deciding) / 1000;
        let mut decision = match decided {
            Ok(d) => d,
            Err(e) => return self.reject(&e),
        };
        // The request's load is claimed before anything is sent, ordered against the other
        // threads' decisions of the same instant; every way out below that sends nothing
        // takes the claim back.
        let claimed = state.claim(epoch, (&mut decision, priority), &parsed, now, pick);
        let claimed_worker = decision.primary().map(|s| s.worker.key());
        let first_byte_is_ttft = parsed.stream || parsed.max_tokens.is_some_and(|m| m <= 1);
        let admitted = match self.admit(&mut decision) {
            Ok(a) => a,
            Err(action) => {
                state.release(claimed, now);
                return action;
            }
        };
        if let Err(e) = self.forward_body(&admitted, endpoint, body) {
            state.release(claimed, now);
            return self.reject(&e);
        }
        let (Some(primary), Some(claim)) = (decision.primary().map(|s| s.worker.clone()), claimed)
        else {
            state.release(claimed, now);
            return Action::Continue;
        };
        if !host::set_request_header(
            &state.config.destination_header,
            Some(&decision.header_value()),
        ) {
            // Envoy's fallback policy will pick a worker; nothing of ours to track.
            state.release(claimed, now);
            return Action::Continue;
        }
        for (name, value) in decision.steering_headers() {
            host::set_request_header(name, Some(value));
        }
        state.maybe_probe(&health, &primary, now);
        self.first_byte_timeout(&decision, first_byte_is_ttft);
        // Admission may have put another worker first: the claim moves there, with that
        // worker's uncached tokens.
        let ticket = if claimed_worker == Some(primary.key()) {
            claim.ticket
        } else {
            let mut shard = state.shard.borrow_mut();
            shard.end(claim.ticket);
            let t = shard.start_at(
                &state.metrics,
                &primary,
                (decision.uncached_tokens(), priority),
                now,
            );
            drop(shard);
            state.flush_load(now);
            t
        };
        let prefill_ticket = claim.prefill;
        let steps = self.time_steps(&decision, ticket);
        if let Some(reason) = decision.fallback {
            state.metrics.fallback(reason);
        }
        if decision.replicated {
            state.metrics.replicated();
        }
        if let Some(t) = decision.topology.as_deref() {
            let pull = decision.primary().is_some_and(|s| s.pull.is_some());
            let (cross, known) = (t.is_cross_site(&primary), t.placement(&primary).known);
            state.metrics.topology(pull, cross, !known, !decision.prefill.is_empty());
        } else if !decision.prefill.is_empty() {
            state.metrics.topology(false, false, false, true);
        }
        let life = Lifecycle::new(&primary, first_byte_is_ttft);
        if let Effect::Journal { worker, source, retract } = life.routed() {
            self.journal(&worker, &decision.block_hashes, source, retract);
            // A P/D pool's prefill worker computes the prefix and keeps it too.
            if let Some(p) = decision.prefill.first() {
                self.journal(&p.worker, &decision.block_hashes, source, retract);
            }
        }
        let predicted = decision.predicted_cached_tokens();
        let blocks = predicted / u64::from(decision.block_size.max(1));
        let us = host::now_nanos().saturating_sub(started) / 1000;
        state.metrics.decision(&primary, (blocks, predicted), us, decision.tokenize_us);
        log::debug!(
            "kvroute: decision worker={primary} prompt_tokens={} predicted_cached={predicted} age_ms={} us={us}",
            decision.prompt_tokens,
            decision.knowledge_age_ms
        );
        self.inflight = Some(InFlight {
            decision,
            ticket,
            prefill_ticket,
            life,
            scanner: UsageScanner::default(),
            decision_us: us,
            parse_us,
            catchup_us,
            journal_us,
            decide_us,
            decided_ns,
            priority,
            steps,
            batch_at_first_byte: Cell::new(None),
        });
        Action::Continue
    }

    /// What a routed request's answer's decode steps are timed against: the requests in flight
    /// on its worker when it was sent (its decision's view, itself included: the streams its
    /// growth was priced against) and the mean prompt of this thread's among them. `None` for
    /// a P/D pool's (two workers), or where the decode step is not learned.
    fn time_steps(&self, decision: &Decision, ticket: Ticket) -> Option<StreamSteps> {
        let state = &self.state;
        if !decision.prefill.is_empty() || !state.calib.try_borrow().is_ok_and(|c| c.learns_steps())
        {
            return None;
        }
        let score = decision.primary()?;
        let mut shard = state.shard.try_borrow_mut().ok()?;
        shard.note_context(ticket, decision.prompt_tokens);
        let mean = shard.mean_context(score.worker.key())?;
        Some(StreamSteps::new(score.load.inflight_requests.saturating_add(1), mean))
    }

    /// Carries out what the intake decided.
    fn step(&mut self, step: Step) -> Action {
        match step {
            Step::Continue => Action::Continue,
            Step::Buffer => Action::Pause,
            Step::WaitForBody => self.wait_for_body(),
            Step::Reject(e) => self.reject(&e),
            Step::Decide { endpoint, len } => {
                self.state.waiting.done(self.id);
                let body = host::request_body(len).unwrap_or_default();
                self.route(endpoint, &body)
            }
        }
    }

    /// Asks Envoy for a per-try timeout derived from the primary's predicted TTFT when the
    /// response headers come with the first token (see `shared::health::FirstByteTimeout`):
    /// a hung worker's try is reset and retried on the next listed worker.
    fn first_byte_timeout(&self, decision: &Decision, first_byte_is_ttft: bool) {
        let fbt = &self.state.config.health.first_byte_timeout;
        if !fbt.enabled || !first_byte_is_ttft {
            return;
        }
        let Some(ttft_ms) = decision.primary().map(|s| s.ttft_ms) else { return };
        let ms = fbt.for_ttft(ttft_ms).to_string();
        host::set_request_header(PER_TRY_TIMEOUT_HEADER, Some(&ms));
    }

    /// Carries out a routed request's effects, in order. Returns whether this thread's load
    /// shard changed in a way other threads must see: the caller writes it once, after every
    /// effect of its callback (an answer whose first bytes also end it writes it once).
    fn apply(&self, effects: Vec<Effect>) -> bool {
        let Some(f) = self.inflight.as_ref() else { return false };
        let state = &self.state;
        let mut changed = false;
        for effect in effects {
            match effect {
                Effect::Served { planned } => state.watch.borrow_mut().served(planned),
                Effect::MoveLoad { to } => state.shard.borrow_mut().served_by(f.ticket, &to),
                Effect::Journal { worker, source, retract } => {
                    self.journal(&worker, &f.decision.block_hashes, source, retract)
                }
                Effect::Failed { worker, why } => {
                    state.worker_failed(&worker, host::now_ms(), &why)
                }
                Effect::Answered { worker } => state.worker_answered(&worker, host::now_ms()),
                Effect::FirstByte { prefill_ended } => {
                    let mut shard = state.shard.borrow_mut();
                    if prefill_ended {
                        shard.prefill_ended(f.ticket, host::now_ms());
                    } else {
                        shard.first_byte(f.ticket);
                    }
                    if let Some(t) = f.prefill_ticket {
                        shard.end(t);
                    }
                    changed = true;
                }
                // A P/D estimate spans two workers: nothing to learn of the decode one alone.
                Effect::Calibrate if !f.decision.prefill.is_empty() => {}
                Effect::Calibrate => {
                    if let Some(score) = f.decision.primary() {
                        let observed_ms =
                            host::now_nanos().saturating_sub(f.decided_ns) as f64 / 1e6;
                        let model = &f.decision.model.name;
                        let batch =
                            state.calibration_sample(model, score, (observed_ms, f.priority));
                        f.batch_at_first_byte.set(batch);
                    }
                }
                Effect::Release => {
                    self.learn_steps(f);
                    state.shard.borrow_mut().end(f.ticket);
                    if let Some(t) = f.prefill_ticket {
                        state.shard.borrow_mut().end(t);
                    }
                    changed = true;
                }
                Effect::Audit { worker, actual } => {
                    state.metrics.audit(&worker, f.decision.audit(actual), actual)
                }
            }
        }
        changed
    }

    /// A successful answer from the worker its decision planned teaches the decode step
    /// ([`StreamSteps::sample`]: a streamed one of enough tokens).
    fn learn_steps(&self, f: &InFlight) {
        let ok = f.life.status().is_some_and(|s| (200..300).contains(&s))
            && f.life.served() == f.life.planned();
        if let Some(sample) = f.steps.as_ref().filter(|_| ok).and_then(StreamSteps::sample) {
            self.state.step_sample(&f.decision.model.name, sample);
        }
    }

    /// Writes this thread's load shard when `changed` says an effect changed it.
    fn write_load(&self, changed: bool) {
        if changed {
            self.state.flush_load(host::now_ms());
        }
    }

    /// Passive health at the end of the stream: a worker that reset a response it had begun
    /// (it died mid-stream) is down.
    fn judge_end(&self) {
        let Some(f) = self.inflight.as_ref().filter(|f| f.life.status().is_some()) else {
            return;
        };
        let details = host::property(&["response", "code_details"]).unwrap_or_default();
        if let Some(e) = f.life.ended(&details) {
            let changed = self.apply(vec![e]);
            self.write_load(changed);
        }
    }

    /// Whether the tick passed this request on; its body (buffered meanwhile) then goes
    /// through untouched.
    fn check_passed_on(&mut self) {
        if let Some(why) = self.state.waiting.take_passed_on(self.id) {
            self.intake.pass_on(why);
        }
    }

    /// Pauses for the body unless this thread knows bodies never reach the filter: then the
    /// request goes on at once, unrouted, counted. A paused request is registered so the tick
    /// can pass it on if its body does not come.
    fn wait_for_body(&mut self) -> Action {
        let now = host::now_ms();
        if self.state.watch.borrow_mut().should_pause(now) {
            self.state.waiting.pause(self.id, now);
            return Action::Pause;
        }
        let why = Unrouted::BodyNotDelivered;
        self.state.metrics.unrouted(why);
        self.intake.pass_on(why);
        Action::Continue
    }

    /// Response headers: who served, with what status, and how the response began (passive
    /// health). Load and routing credit move to the worker that served; a failed answer takes
    /// the routing credit back.
    fn response_started(&mut self) {
        if self.inflight.is_none() {
            return;
        }
        let status = host::response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok());
        let served = host::property(&["upstream", "address"])
            .and_then(|a| String::from_utf8(a).ok())
            .filter(|a| !a.is_empty());
        let details = host::property(&["response", "code_details"]).unwrap_or_default();
        // Unless the cluster ignores the header (a misdeployment: then any worker may serve
        // any request, and a mismatch says nothing about the planned one).
        let ignored = self.state.watch.borrow().has(Symptom::OverrideIgnored, host::now_ms());
        let Some(f) = self.inflight.as_mut() else { return };
        let effects = f.life.response_started(status, served.as_deref(), &details, ignored);
        let changed = self.apply(effects);
        self.write_load(changed);
    }

    /// The response's first bytes; returns whether the load shard changed (not written yet).
    fn first_byte(&mut self) -> bool {
        let Some(f) = self.inflight.as_mut() else { return false };
        let effects = f.life.first_byte();
        self.apply(effects)
    }

    /// Releases the load and audits the prediction; runs once per routed request. Returns
    /// whether the load shard changed (not written yet).
    fn finish(&mut self) -> bool {
        let Some(f) = self.inflight.as_mut() else { return false };
        if f.life.released() {
            return false;
        }
        let effects = f.life.finish(f.scanner.usage().cached_tokens);
        self.apply(effects)
    }

    /// The decision header of a request passed on unrouted: who served it, and why.
    fn unrouted_summary(&self, why: Unrouted) -> String {
        let served = host::property(&["upstream", "address"])
            .and_then(|a| String::from_utf8(a).ok())
            .unwrap_or_default();
        format!(
            "worker={served}; fallback={}; misdeployed={}",
            why.name(),
            self.state.watch.borrow().header_field(host::now_ms())
        )
    }

    fn decision_summary(&self) -> Option<String> {
        if let Some(why) = self.intake.unrouted() {
            return Some(self.unrouted_summary(why));
        }
        let f = self.inflight.as_ref()?;
        let d = &f.decision;
        let served = d.ranked.iter().find(|s| s.worker == f.life.served());
        Some(format!(
            "worker={}; predicted_cached_tokens={}; predicted_ttft_ms={:.1}; predicted_wait_ms={:.1}; promised_ttft_ms={:.1}; prompt_tokens={}; blocks_from_events={}; blocks_from_peers={}; knowledge_age_ms={}; fallback={}; replicated={}; decision_us={}; parse_us={}; catchup_us={}; journal_us={}; decide_us={}; tokenize_us={}; misdeployed={}; thread={}; {}",
            f.life.served(),
            d.predicted_cached_tokens(),
            // The estimate for the worker actually served (a fallback when the primary failed),
            // from the request's arrival in the filter: the filter's own time on it so far
            // plus the estimate from the decision on (what the calibration learns).
            served.map_or(-1.0, |s| s.ttft_ms + f.decision_us as f64 / 1000.0),
            // Of it, the wait behind the worker's queue (0: nothing queued there).
            served.map_or(-1.0, |s| s.wait_ms),
            // What admission promised there (the estimate where nothing is queued).
            served.map_or(-1.0, |s| s.promise_ttft_ms() + f.decision_us as f64 / 1000.0),
            d.prompt_tokens,
            d.blocks_from_events,
            d.blocks_from_peers,
            d.knowledge_age_ms,
            d.fallback.map_or("none", |r| r.name()),
            u8::from(d.replicated),
            f.decision_us,
            f.parse_us,
            f.catchup_us,
            f.journal_us,
            f.decide_us,
            d.tokenize_us,
            self.state.watch.borrow().header_field(host::now_ms()),
            // The deciding thread's load shard: which of Envoy's worker threads decided.
            self.state.shard.borrow().id(),
            d.detail_fields(f.life.served(), host::now_ms())
        ))
    }
}

impl Context for KvHttp {}

impl HttpContext for KvHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // A client must never steer routing: the native filter before this one strips copies
        // of our header already; dropping it here too keeps configs without it safe.
        host::set_request_header(&self.state.config.destination_header, None);
        // Nor name the holder an engine pulls KV from, or a P/D pool's prefill worker.
        if let Ok(router) = self.state.router.try_borrow() {
            for h in router.plan().steering_headers() {
                host::set_request_header(h, None);
            }
        }
        // Deadline and priority are inputs, not steering: read as bytes, dropped before the
        // request goes upstream when `admission.strip_headers` says so.
        let adm = &self.state.config.admission;
        self.admission_headers = (
            host::request_header(&adm.deadline_header),
            host::request_header(&adm.priority_header),
        );
        if adm.strip_headers {
            host::set_request_header(&adm.deadline_header, None);
            host::set_request_header(&adm.priority_header, None);
        }
        let method = host::request_header(":method").unwrap_or_default();
        let path = host::request_header(":path").unwrap_or_default();
        if let Some(trap) = &self.state.config.fault_injection.trap_path {
            if path == trap.as_bytes() {
                host::log(LogLevel::Warn, "kvroute: fault injection: aborting this VM");
                std::process::abort();
            }
        }
        let step = self.intake.headers(&method, &path, end_of_stream);
        self.step(step)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.check_passed_on();
        if !self.intake.wants_body() {
            return Action::Continue;
        }
        self.state.watch.borrow_mut().body_delivered();
        self.state.waiting.progress(self.id, host::now_ms());
        let step = self.intake.body(body_size, end_of_stream, self.state.config.max_body_bytes);
        self.step(step)
    }

    /// A request whose stream ends with trailers (HTTP/2, or HTTP/1.1 chunked) never sees a body
    /// callback with `end_of_stream`: the trailers end it, and it is decided here on the body
    /// buffered so far, exactly as if its last data frame had ended the stream.
    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.check_passed_on();
        let step = self.intake.trailers();
        self.step(step)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.check_passed_on();
        self.response_started();
        if self.state.config.expose_decision_header {
            if let Some(value) = self.decision_summary() {
                host::set_response_header(DECISION_HEADER, &value);
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.inflight.is_none() {
            return Action::Continue;
        }
        let mut changed = false;
        if body_size > 0 {
            changed = self.first_byte();
            if let Some(chunk) = host::response_body(body_size) {
                if let Some(f) = self.inflight.as_mut() {
                    f.scanner.push(&chunk);
                    if let Some(steps) = f.steps.as_mut() {
                        if let Some(batch) = f.batch_at_first_byte.take() {
                            let key = f.decision.primary().map(|s| s.worker.key());
                            let shard = self.state.shard.try_borrow().ok();
                            let mean = key.zip(shard).and_then(|(k, s)| s.mean_context(k));
                            steps.batch(batch, mean);
                        }
                        steps.chunk(host::now_nanos(), &chunk);
                        let worker = f.decision.primary().map(|s| &s.worker);
                        if let Some(w) = worker.filter(|_| steps.wants_batch()) {
                            if let Some((n, mean)) = self.state.batch_now(w) {
                                steps.batch(n, mean);
                            }
                        }
                    }
                }
            }
        }
        if end_of_stream {
            // An answer whose first bytes end it (not streamed): one write of the shard.
            changed |= self.finish();
        }
        self.write_load(changed);
        Action::Continue
    }

    /// A response that ends with trailers: its body callbacks never saw the end of the stream.
    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let changed = self.finish();
        self.write_load(changed);
        Action::Continue
    }

    fn on_log(&mut self) {
        self.state.waiting.done(self.id);
        self.judge_end();
        let changed = self.finish();
        self.write_load(changed);
        // The stream is over: what the other threads and the updater published since this
        // thread's last catch-up (this decision's own credit among it) is applied now, where no
        // request waits for it, rather than on the thread's next request. Bounded as on a
        // request (deltas only, the same time budget).
        if self.inflight.is_some() {
            self.state.catch_up(Catch::StreamEnd);
        }
    }
}
