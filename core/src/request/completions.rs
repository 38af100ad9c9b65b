//! OpenAI `/v1/completions` prompts: a string (tokenized with special tokens, as vLLM's
//! `CompletionRequest.add_special_tokens` defaults to true), token ids (used as given), or a
//! batch of either, which the engine caches prompt by prompt and kvroute routes on load alone.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{EarlyPrompt, LoadOnly, Prompt, RequestError};

/// The body's top level with `prompt` parsed on its own: token ids (tens of thousands of
/// numbers in a long prompt) go straight into `u32`s instead of a JSON value per number first,
/// which was most of the filter's time on such requests. Any other prompt shape takes the
/// general path. `None` when the body is not a JSON object: the caller's general parse then
/// gives the error. The result equals the general parse (`tests::early_prompts_parse_as_the_general_path_does`).
pub(super) fn split_prompt(body: &[u8]) -> Option<(Map<String, Value>, EarlyPrompt)> {
    // Duplicate keys: the last one wins, as in a `serde_json::Map`.
    let top: BTreeMap<String, &RawValue> = serde_json::from_slice(body).ok()?;
    let mut obj = Map::new();
    let mut prompt = None;
    for (k, v) in top {
        if k == "prompt" {
            prompt = Some(v);
        } else {
            obj.insert(k, serde_json::from_str(v.get()).ok()?);
        }
    }
    let ids = prompt.and_then(|p| serde_json::from_str::<Vec<u32>>(p.get()).ok());
    let early = match ids {
        Some(ids) if !ids.is_empty() => Ok((Prompt::Tokens(ids), None)),
        _ => {
            let value: Option<Value> = match prompt {
                Some(p) => Some(serde_json::from_str(p.get()).ok()?),
                None => None,
            };
            parse_prompt(value.as_ref())
        }
    };
    Some((obj, early))
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
}

/// A completion prompt: a string, token ids, or a batch (several strings or token-id lists),
/// which is routed load-only with the prompts joined for its size.
pub(super) fn parse_prompt(
    prompt: Option<&Value>,
) -> Result<(Prompt, Option<LoadOnly>), RequestError> {
    let items = match prompt {
        Some(Value::String(s)) => return Ok((Prompt::Text(s.clone()), None)),
        Some(Value::Array(items)) if !items.is_empty() => items,
        _ => return Err(RequestError::InvalidPrompt),
    };
    if let [Value::String(s)] = items.as_slice() {
        return Ok((Prompt::Text(s.clone()), None));
    }
    if let Some(ids) = token_ids(items) {
        return Ok((Prompt::Tokens(ids), None));
    }
    let batch = Some(LoadOnly::Batch);
    if let Some(texts) = items.iter().map(Value::as_str).collect::<Option<Vec<&str>>>() {
        return Ok((Prompt::Text(texts.join("\n")), batch));
    }
    let lists = items.iter().map(|i| i.as_array().and_then(|l| token_ids(l)));
    let ids = lists.collect::<Option<Vec<Vec<u32>>>>().ok_or(RequestError::InvalidPrompt)?;
    Ok((Prompt::Tokens(ids.concat()), batch))
}
