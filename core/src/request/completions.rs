//! OpenAI `/v1/completions` prompts: a string (tokenized with special tokens, as vLLM's
//! `CompletionRequest.add_special_tokens` defaults to true), token ids (used as given), or a
//! batch of either, which the engine caches prompt by prompt and kvroute routes on load alone.

use serde_json::Value;

use super::{LoadOnly, Prompt, RequestError};

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
