//! A request's `priority`, as vLLM reads it: an `int` field of its chat, completions and
//! responses requests (default 0; lower values are served earlier under
//! `--scheduling-policy priority`). Its Anthropic-style `/v1/messages` request has no such
//! field (an extra key, ignored).
//!
//! - The value is read as pydantic's lax `int` ([`pyint::lax_int`]: `3`, `3.0`, `"3"`, `true`);
//!   anything else, `null` included (the field is not optional), is refused before anything
//!   else (400 `BadRequestError`, `param` `priority`).
//! - Under `fcfs` a non-zero value is refused by the engine when it takes the request
//!   (`Got priority N but Priority scheduling is not enabled.`): a streamed request already
//!   has its 200 and gets the error as its one event, as the empty prompt does ([`limits`]).
//!
//! Values beyond 64 bits (Python has no bound) are saturated: the order is the same.

use kvroute_core::decision::pyjson;
use kvroute_core::decision::request::{pyint, Endpoint};
use serde_json::Value;

use super::limits::Refusal;
use crate::engine::SchedulingPolicy;

/// The request's `priority`, or why vLLM's request model refuses it.
pub(crate) fn read(endpoint: Endpoint, body: &[u8]) -> Result<i64, Refusal> {
    if endpoint == Endpoint::Messages {
        return Ok(0);
    }
    // The router already read the body as Python does; one that is not JSON has no say here.
    let Ok(parsed) = pyjson::from_body(body) else { return Ok(0) };
    let Some(v) = parsed.value.get("priority") else { return Ok(0) };
    match pyint::lax_int(v) {
        Some(n) => Ok(n.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64),
        None => Err(Refusal {
            param: Some("priority"),
            message: format!("priority: Input should be a valid integer, got {}", shown(v)),
            in_engine: false,
        }),
    }
}

/// What the engine says of `priority` under `policy`: `None` when it takes the request.
pub(crate) fn check(policy: SchedulingPolicy, priority: i64) -> Option<Refusal> {
    (policy == SchedulingPolicy::Fcfs && priority != 0).then(|| Refusal {
        param: None,
        message: format!("Got priority {priority} but Priority scheduling is not enabled."),
        in_engine: true,
    })
}

/// A refused value in the message: its JSON type, never its content (a client's text).
fn shown(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number with a fractional part or out of range",
        Value::String(_) => "a string that is not an integer",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_is_read_as_pydantic_reads_an_int() {
        let chat = |b: &str| read(Endpoint::Chat, b.as_bytes()).map_err(|r| r.message);
        assert_eq!(chat(r#"{"model":"m"}"#), Ok(0));
        assert_eq!(chat(r#"{"priority":-7}"#), Ok(-7));
        assert_eq!(chat(r#"{"priority":"12"}"#), Ok(12));
        assert_eq!(chat(r#"{"priority":3.0}"#), Ok(3));
        assert_eq!(chat(r#"{"priority":true}"#), Ok(1));
        assert_eq!(chat(r#"{"priority":123456789012345678901234567890}"#), Ok(i64::MAX));
        for bad in ["null", "1.5", r#""high""#, "[1]", "{}"] {
            let e = chat(&format!(r#"{{"priority":{bad}}}"#)).unwrap_err();
            assert!(e.starts_with("priority: Input should be a valid integer"), "{bad}: {e}");
        }
        // The Messages request has no such field.
        assert_eq!(read(Endpoint::Messages, br#"{"priority":"x"}"#).ok(), Some(0));
    }

    #[test]
    fn fcfs_refuses_a_non_zero_priority_in_the_engine() {
        assert!(check(SchedulingPolicy::Fcfs, 0).is_none());
        assert!(check(SchedulingPolicy::Priority, -3).is_none());
        let r = check(SchedulingPolicy::Fcfs, 5).unwrap();
        assert_eq!(r.message, "Got priority 5 but Priority scheduling is not enabled.");
        assert!(r.in_engine && r.param.is_none());
    }
}
