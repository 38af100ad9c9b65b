//! One request: buffer the body, decide, set the destination header; then watch the response
//! for the first byte (prefill done) and the usage counts (prediction audit), and release the
//! worker's load when the stream ends however it ends.

use std::rc::Rc;
use std::time::{Instant, UNIX_EPOCH};

use kvroute_core::error::ApiError;
use kvroute_core::index::Source;
use kvroute_core::journal::JournalEntry;
use kvroute_core::load::LoadDelta;
use kvroute_core::request::{self, Endpoint};
use kvroute_core::router::Decision;
use kvroute_core::usage::UsageScanner;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::root::ThreadState;
use crate::shared::read_load;

/// Response header with the decision summary, when the config asks for it.
pub const DECISION_HEADER: &str = "x-kvroute-decision";

/// A routed request still in flight.
struct InFlight {
    decision: Decision,
    worker: String,
    prefilling: bool,
    released: bool,
    scanner: UsageScanner,
}

pub struct KvHttp {
    state: Rc<ThreadState>,
    endpoint: Option<Endpoint>,
    inflight: Option<InFlight>,
}

impl KvHttp {
    pub fn new(state: Rc<ThreadState>) -> Self {
        KvHttp { state, endpoint: None, inflight: None }
    }

    fn now_ms(&self) -> u64 {
        self.get_current_time()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn reject(&self, e: &ApiError) -> Action {
        self.state.metrics.rejected();
        self.send_http_response(
            u32::from(e.status),
            vec![("content-type", "application/json")],
            Some(&e.body()),
        );
        Action::Pause
    }

    /// A random draw for tie-breaking, from the clock and this stream's identity.
    fn pick(&self, now_ms: u64) -> u64 {
        let nanos = self.get_current_time().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let seed = self as *const Self as usize as u64;
        xxhash_rust::xxh3::xxh3_64_with_seed(&nanos.to_le_bytes(), seed ^ now_ms)
    }

    fn route(&mut self, endpoint: Endpoint, body: &[u8]) -> Action {
        let started = Instant::now();
        let parsed = match request::parse(endpoint, body) {
            Ok(p) => p,
            Err(e) => return self.reject(&e.into()),
        };
        let state = Rc::clone(&self.state);
        state.catch_up();
        let now = self.now_ms();
        let decided =
            state.router.borrow().decide(&parsed, body.len(), &read_load, now, self.pick(now));
        let decision = match decided {
            Ok(d) => d,
            Err(e) => return self.reject(&e),
        };
        let Some(primary) = decision.primary().map(|s| s.worker.clone()) else {
            return Action::Continue;
        };
        self.set_http_request_header(
            &state.config.destination_header,
            Some(&decision.header_value()),
        );
        state.apply_load(&primary, LoadDelta::Start { prefill_tokens: decision.uncached_tokens() });
        if let Some(reason) = decision.fallback {
            state.metrics.fallback(reason);
        }
        if !decision.block_hashes.is_empty() {
            state.publish(JournalEntry {
                seq: 0,
                at_ms: now,
                source: Source::Routed,
                worker: primary.clone(),
                hashes: decision.block_hashes.clone(),
            });
        }
        let predicted = decision.predicted_cached_tokens();
        let blocks = predicted / u64::from(decision.block_size.max(1));
        let us = started.elapsed().as_micros() as u64;
        state.metrics.decision(&primary, blocks, predicted, us);
        log::debug!(
            "kvroute: decision worker={primary} prompt_tokens={} predicted_cached={predicted} age_ms={} us={us}",
            decision.prompt_tokens,
            decision.knowledge_age_ms
        );
        self.inflight = Some(InFlight {
            decision,
            worker: primary,
            prefilling: true,
            released: false,
            scanner: UsageScanner::default(),
        });
        Action::Continue
    }

    fn first_byte(&mut self) {
        if let Some(f) = self.inflight.as_mut().filter(|f| f.prefilling) {
            f.prefilling = false;
            let d = LoadDelta::FirstByte { prefill_tokens: f.decision.uncached_tokens() };
            self.state.apply_load(&f.worker, d);
        }
    }

    /// Releases the load and audits the prediction; runs once per routed request.
    fn finish(&mut self) {
        let now = self.now_ms();
        let Some(f) = self.inflight.as_mut().filter(|f| !f.released) else {
            return;
        };
        f.released = true;
        let d = LoadDelta::End {
            prefill_tokens: f.decision.uncached_tokens(),
            prefilling: f.prefilling,
        };
        self.state.apply_load(&f.worker, d);
        let Some(actual) = f.scanner.usage().cached_tokens else {
            return;
        };
        self.state.metrics.audit(f.decision.audit(actual), actual);
        if !f.decision.block_hashes.is_empty() {
            let entry = JournalEntry {
                seq: 0,
                at_ms: now,
                source: Source::Feedback,
                worker: f.worker.clone(),
                hashes: f.decision.block_hashes.clone(),
            };
            self.state.publish(entry);
        }
    }
}

impl Context for KvHttp {}

impl HttpContext for KvHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // A client must never steer routing: drop any copy of our header before anything else.
        self.set_http_request_header(&self.state.config.destination_header, None);
        let method = self.get_http_request_header(":method").unwrap_or_default();
        let path = self.get_http_request_header(":path").unwrap_or_default();
        self.endpoint = Endpoint::from_path(&path).filter(|_| method == "POST");
        match self.endpoint {
            None => Action::Continue,
            Some(_) if end_of_stream => self.reject(&ApiError::bad_request(
                "invalid_json",
                None,
                "request body is empty".into(),
            )),
            Some(_) => Action::Pause,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(endpoint) = self.endpoint else {
            return Action::Continue;
        };
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        self.route(endpoint, &body)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let (true, Some(f)) = (self.state.config.expose_decision_header, &self.inflight) {
            let d = &f.decision;
            let value = format!(
                "worker={}; predicted_cached_tokens={}; prompt_tokens={}; blocks_from_events={}; knowledge_age_ms={}; fallback={}",
                f.worker,
                d.predicted_cached_tokens(),
                d.prompt_tokens,
                d.blocks_from_events,
                d.knowledge_age_ms,
                d.fallback.map_or("none", |r| r.name())
            );
            self.set_http_response_header(DECISION_HEADER, Some(&value));
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.inflight.is_none() {
            return Action::Continue;
        }
        if body_size > 0 {
            self.first_byte();
            if let Some(chunk) = self.get_http_response_body(0, body_size) {
                if let Some(f) = self.inflight.as_mut() {
                    f.scanner.push(&chunk);
                }
            }
        }
        if end_of_stream {
            self.finish();
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.finish();
    }
}
