//! Admission of a decided request: its deadline (header, else class default, else the model's
//! `ttft_deadline_ms`) and priority class reorder the ranking, or shed it with a 429 and a
//! `Retry-After` before it takes any load or routing credit. An admitted request's class also
//! says what becomes of the `priority` member of the body forwarded ([`PriorityEdit`]: the
//! class's `engine_priority`, for engines that order their queue by it).

use crate::decision::admission::priority_field::{self, PriorityFieldError};
use crate::decision::admission::{self, AdmissionVerdict, PriorityEdit};
use crate::decision::config::FilterConfig;
use crate::decision::cost::Score;
use crate::decision::error::ApiError;
use crate::decision::request::Endpoint;

/// A request's admission.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// The priority class's name (for its counters).
    pub class: String,
    pub verdict: AdmissionVerdict,
    /// The answer of a shed request.
    pub shed: Option<Shed>,
    /// What to do with the body's `priority` member.
    pub priority: PriorityEdit,
}

/// A 429: its body, its `Retry-After` value (seconds), and, where `expose_decision_header`,
/// the decision header's value (see [`admission::shed_detail`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Shed {
    pub error: ApiError,
    pub retry_after: String,
    pub detail: Option<String>,
}

/// Admits a decision for `model` ranked as `ranked` (reordered for the request's class),
/// given the deadline and priority header values as sent.
pub fn admit(
    cfg: &FilterConfig,
    model: &str,
    ranked: &mut [Score],
    deadline: Option<&[u8]>,
    priority: Option<&[u8]>,
) -> Admission {
    let model_default =
        cfg.models.iter().find(|m| m.name == model).map_or(0, |m| m.ttft_deadline_ms);
    let adm = &cfg.admission;
    let ask = adm.ask(deadline, priority, model_default);
    let verdict = admission::admit(ranked, &ask, adm);
    let shed = match verdict {
        AdmissionVerdict::Shed { reason, retry_after_s } => Some(Shed {
            error: admission::shed_error(reason, retry_after_s, ranked, &ask, adm),
            retry_after: retry_after_s.to_string(),
            detail: cfg
                .expose_decision_header
                .then(|| admission::shed_detail(reason, retry_after_s, ranked, &ask, adm)),
        }),
        _ => None,
    };
    let priority = adm.priority_edit(ask.class);
    Admission { class: adm.class_name(ask.class).to_owned(), verdict, shed, priority }
}

/// The engine priority a request of `endpoint` with this priority header is forwarded with
/// (0 where no class sets one, and on `/v1/messages`, whose body keeps no `priority`): what
/// its decision's load view and its claim on the worker are at (see
/// [`crate::shared::load::LoadView::behind`]).
pub fn engine_priority(cfg: &FilterConfig, endpoint: Endpoint, priority: Option<&[u8]>) -> i32 {
    if endpoint == Endpoint::Messages {
        return 0;
    }
    let adm = &cfg.admission;
    adm.engine_priority(adm.class_of(priority))
}

/// The body to forward for an admitted request of `endpoint`, when it differs from `body`:
/// the class's edit of the `priority` member on the endpoints whose engines read one (chat,
/// completions, responses; vLLM's `/v1/messages` has no such field and ignores it).
pub fn forwarded_body(
    a: &Admission,
    endpoint: Endpoint,
    body: &[u8],
) -> Result<Option<Vec<u8>>, PriorityFieldError> {
    if endpoint == Endpoint::Messages {
        return Ok(None);
    }
    priority_field::rewrite(body, a.priority)
}
