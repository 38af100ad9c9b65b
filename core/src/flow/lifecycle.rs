//! One request through the filter, as decisions without I/O.
//!
//! [`Intake`] is the request side: which requests are routed, when the filter waits for the
//! body, when it decides, what it refuses. [`Lifecycle`] is a routed request from its decision
//! to the end of its stream: where its routing credit (the journal entry that says "this worker
//! will hold these blocks") and its load go when Envoy serves it elsewhere after a retry, when
//! the credit is taken back (a failed answer, a reset before any response), when the load is
//! released (exactly once: end of body, trailers, or the stream's log), and the passive health
//! marks its response implies. The filter feeds in host values and carries out the
//! [`Effect`]s in order.

use crate::decision::error::ApiError;
use crate::decision::misdeploy::Unrouted;
use crate::decision::request::Endpoint;
use crate::shared::health;
use crate::wire::journal::Source;

/// What the filter does with the request after a callback.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Let it go on untouched (not ours, passed on, or the filter is done with it).
    Continue,
    /// Keep buffering the body.
    Buffer,
    /// Pause for the body (unless this thread knows bodies never reach it: then
    /// [`Intake::pass_on`] with [`Unrouted::BodyNotDelivered`] and continue).
    WaitForBody,
    /// Answer with this error.
    Reject(ApiError),
    /// The whole request is in: decide on the `len` body bytes buffered.
    Decide { endpoint: Endpoint, len: usize },
}

/// The request side of one stream.
#[derive(Debug, Default, Clone)]
pub struct Intake {
    endpoint: Option<Endpoint>,
    buffered: usize,
    unrouted: Option<Unrouted>,
}

impl Intake {
    /// Request headers: a `POST` to a known endpoint is routed, anything else passes.
    pub fn headers(&mut self, method: &[u8], path: &[u8], end_of_stream: bool) -> Step {
        self.endpoint = Endpoint::from_path(path).filter(|_| method == b"POST");
        match self.endpoint {
            None => Step::Continue,
            Some(endpoint) if end_of_stream => self.complete(endpoint),
            Some(_) => Step::WaitForBody,
        }
    }

    /// Whether a body chunk now is one the filter routes on.
    pub fn wants_body(&self) -> bool {
        self.endpoint.is_some()
    }

    /// A body chunk: `body_size` bytes buffered in all.
    pub fn body(&mut self, body_size: usize, end_of_stream: bool, limit: usize) -> Step {
        let Some(endpoint) = self.endpoint else { return Step::Continue };
        if body_size > limit {
            self.endpoint = None;
            return Step::Reject(ApiError::too_large(limit));
        }
        self.buffered = body_size;
        if !end_of_stream {
            return Step::Buffer;
        }
        self.complete(endpoint)
    }

    /// Request trailers end the stream: decide on the body buffered so far, exactly as if its
    /// last data frame had ended it.
    pub fn trailers(&mut self) -> Step {
        match self.endpoint {
            Some(endpoint) => self.complete(endpoint),
            None => Step::Continue,
        }
    }

    /// The request goes on without a decision (`why`); its body streams through untouched.
    pub fn pass_on(&mut self, why: Unrouted) {
        self.unrouted = Some(why);
        self.endpoint = None;
    }

    /// Why the request was passed on unrouted, if it was.
    pub fn unrouted(&self) -> Option<Unrouted> {
        self.unrouted
    }

    fn complete(&mut self, endpoint: Endpoint) -> Step {
        if self.buffered == 0 {
            self.endpoint = None;
            let e = ApiError::bad_request("invalid_json", None, "request body is empty".into());
            return Step::Reject(e);
        }
        Step::Decide { endpoint, len: self.buffered }
    }
}

/// What the filter carries out for a routed request, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The misdeployment watch: whether the planned worker (`true`) or another one served.
    Served { planned: bool },
    /// Move the request's load ticket to the worker that served.
    MoveLoad { to: String },
    /// Journal the request's block hashes for `worker` (`retract`: take that credit back).
    Journal { worker: String, source: Source, retract: bool },
    /// Passive health: `worker` failed a request.
    Failed { worker: String, why: String },
    /// Passive health: `worker` answered.
    Answered { worker: String },
    /// The first response byte: the request's prefill is done (load). `prefill_ended`: the
    /// byte is its first token (a successful streamed answer, or one token), so the worker's
    /// prefill ended now (a non-streamed answer's first byte comes after its decode, an
    /// error's without one).
    FirstByte { prefill_ended: bool },
    /// Online calibration may learn from this first byte (the scored worker served it).
    Calibrate,
    /// Release the request's load.
    Release,
    /// Audit the prediction: `worker` reported `actual` cached tokens.
    Audit { worker: String, actual: u64 },
}

/// `code_details` of a response that came from the upstream.
const VIA_UPSTREAM: &[u8] = b"via_upstream";
/// `code_details` prefix of a stream the worker reset after it began answering.
const RESET_AFTER_START: &[u8] = b"upstream_reset_after_response_started";

/// A routed request in flight.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    planned: String,
    served: String,
    status: Option<u16>,
    prefilling: bool,
    released: bool,
    first_byte_is_ttft: bool,
}

fn success(status: Option<u16>) -> bool {
    status.is_some_and(|s| (200..300).contains(&s))
}

impl Lifecycle {
    /// A request routed to `planned`; `first_byte_is_ttft`: its first response byte is its
    /// first token (streamed, or at most one output token), so calibration may learn from it.
    pub fn new(planned: &str, first_byte_is_ttft: bool) -> Self {
        Lifecycle {
            planned: planned.to_owned(),
            served: planned.to_owned(),
            status: None,
            prefilling: true,
            released: false,
            first_byte_is_ttft,
        }
    }

    /// The routing credit the decision takes.
    pub fn routed(&self) -> Effect {
        Effect::Journal { worker: self.planned.clone(), source: Source::Routed, retract: false }
    }

    pub fn planned(&self) -> &str {
        &self.planned
    }

    /// The worker that served (the planned one until a response says otherwise).
    pub fn served(&self) -> &str {
        &self.served
    }

    pub fn status(&self) -> Option<u16> {
        self.status
    }

    pub fn released(&self) -> bool {
        self.released
    }

    /// Response headers: `status`, the upstream that served (`None`: unknown, or a local
    /// reply), Envoy's `response.code_details`, and whether the cluster ignores the
    /// destination header (a misdeployment: a mismatch then says nothing about the planned
    /// worker). Load and credit move to the worker that served; a failed answer takes the
    /// credit back.
    pub fn response_started(
        &mut self,
        status: Option<u16>,
        served: Option<&str>,
        code_details: &[u8],
        override_ignored: bool,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        self.status = status;
        if let Some(served) = served {
            // Judged against the primary: a fallback serves only after the primary failed.
            out.push(Effect::Served { planned: served == self.planned });
            if served != self.planned {
                out.push(Effect::MoveLoad { to: served.to_owned() });
                self.served = served.to_owned();
            }
        }
        let (planned, served) = (self.planned.clone(), self.served.clone());
        if planned != served && !override_ignored {
            let why = "another worker served its request".to_owned();
            out.push(Effect::Failed { worker: planned.clone(), why });
        }
        if code_details == VIA_UPSTREAM {
            out.push(Effect::Answered { worker: served.clone() });
        } else if health::worker_failed(code_details) {
            let why = String::from_utf8_lossy(code_details).into_owned();
            out.push(Effect::Failed { worker: served.clone(), why });
        }
        let journal = |worker: &str, retract| Effect::Journal {
            worker: worker.to_owned(),
            source: Source::Routed,
            retract,
        };
        let ok = success(status);
        if planned != served {
            out.push(journal(&planned, true));
            if ok {
                out.push(journal(&served, false));
            }
        } else if !ok {
            out.push(journal(&served, true));
        }
        out
    }

    /// A response body chunk with data: the first one ends the prefill.
    pub fn first_byte(&mut self) -> Vec<Effect> {
        if !self.prefilling {
            return Vec::new();
        }
        self.prefilling = false;
        let first_token = self.first_byte_is_ttft && success(self.status);
        let mut out = vec![Effect::FirstByte { prefill_ended: first_token }];
        // Online calibration learns from successful answers of the worker it scored.
        if first_token && self.served == self.planned {
            out.push(Effect::Calibrate);
        }
        out
    }

    /// The stream ended (response end of stream, trailers, or its log): releases the load,
    /// once; `cached_tokens` is what the engine's usage reported. A request reset before any
    /// response gives its credit back (the worker may never have seen the prompt); a
    /// successful answer with usage confirms it (feedback).
    pub fn finish(&mut self, cached_tokens: Option<u64>) -> Vec<Effect> {
        if self.released {
            return Vec::new();
        }
        self.released = true;
        let mut out = vec![Effect::Release];
        let served = self.served.clone();
        if self.status.is_none() {
            out.push(Effect::Journal { worker: served, source: Source::Routed, retract: true });
            return out;
        }
        let Some(actual) = cached_tokens else { return out };
        out.push(Effect::Audit { worker: served.clone(), actual });
        if success(self.status) {
            out.push(Effect::Journal { worker: served, source: Source::Feedback, retract: false });
        }
        out
    }

    /// The stream's log: a worker that reset a response it had begun (it died mid-stream) is
    /// down.
    pub fn ended(&self, code_details: &[u8]) -> Option<Effect> {
        (self.status.is_some() && code_details.starts_with(RESET_AFTER_START)).then(|| {
            Effect::Failed { worker: self.served.clone(), why: "reset its response stream".into() }
        })
    }
}
