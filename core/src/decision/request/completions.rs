//! OpenAI `/v1/completions` prompts: a string (tokenized with special tokens, as vLLM's
//! `CompletionRequest.add_special_tokens` defaults to true), token ids (used as given), or a
//! batch of either, which the engine caches prompt by prompt and kvroute routes on load alone.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::scan::{self, give_up, maybe_python_int, Field, Skip};
use super::{id_array, pyint, EarlyPrompt, LoadOnly, Prompt, RequestError};

/// The body's top level in one pass (see `scan`), with `prompt` read on its own: token ids
/// (tens of thousands of numbers in a long prompt) go straight into `u32`s, read by hand in
/// their usual form (`id_array`), else by `serde_json` without a JSON value per number. `None` when the scan gives up: the caller's general parse
/// then gives the result or the error. The result equals the general parse
/// (`tests::early_prompt`, `scan_tests`).
pub(super) fn split_prompt(body: &[u8]) -> Option<(serde_json::Map<String, Value>, EarlyPrompt)> {
    let top = scan::split::<PromptField>(body)?;
    let early = match top.field {
        None => parse_prompt(None),
        Some(PromptField::Ids(ids)) if ids.is_empty() => Err(RequestError::InvalidPrompt),
        Some(PromptField::Ids(ids)) => Ok((Prompt::Tokens(ids), None)),
        Some(PromptField::Text(text)) => Ok((Prompt::Text(text), None)),
        Some(PromptField::Other(v)) => parse_prompt(Some(&v)),
        Some(PromptField::Invalid) => Err(RequestError::InvalidPrompt),
    };
    Some((top.obj, early))
}

/// A `prompt` as read in one pass.
pub(super) enum PromptField {
    /// An array of numbers that all fit a token id.
    Ids(Vec<u32>),
    Text(String),
    /// Any other array (a batch, or numbers that are not token ids).
    Other(Value),
    /// Not a string or an array.
    Invalid,
}

impl Field for PromptField {
    const KEY: &'static str = "prompt";

    fn read_fast(text: &[u8]) -> Option<(Self, usize)> {
        id_array::read(text).map(|(ids, len)| (PromptField::Ids(ids), len))
    }
}

/// One item of a prompt array: a token id, or any other value.
enum Item {
    Id(u32),
    Other(Value),
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = Item;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a prompt item")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Item, E> {
                Ok(u32::try_from(v).map_or_else(|_| Item::Other(v.into()), Item::Id))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Item, E> {
                Ok(Item::Other(v.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Item, E> {
                let n = serde_json::Number::from_f64(v).ok_or_else(give_up)?;
                Ok(Item::Other(Value::Number(n)))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Item, E> {
                Ok(Item::Other(v.into()))
            }
            fn visit_unit<E>(self) -> Result<Item, E> {
                Ok(Item::Other(Value::Null))
            }
            fn visit_str<E>(self, v: &str) -> Result<Item, E> {
                Ok(Item::Other(v.into()))
            }
            fn visit_string<E>(self, v: String) -> Result<Item, E> {
                Ok(Item::Other(v.into()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Item, A::Error> {
                let d = serde::de::value::SeqAccessDeserializer::new(seq);
                Value::deserialize(d).map(Item::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
                let d = serde::de::value::MapAccessDeserializer::new(map);
                Value::deserialize(d).map(Item::Other)
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}

impl<'de> Deserialize<'de> for PromptField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PromptVisitor;
        impl<'de> Visitor<'de> for PromptVisitor {
            type Value = PromptField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a prompt")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PromptField, A::Error> {
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(item) = seq.next_element::<Item>()? {
                    let v = match item {
                        Item::Id(id) => {
                            ids.push(id);
                            continue;
                        }
                        Item::Other(v) => v,
                    };
                    // Not token ids after all: the rest as JSON values.
                    let mut rest: Vec<Value> = ids.into_iter().map(Value::from).collect();
                    rest.push(v);
                    while let Some(v) = seq.next_element::<Value>()? {
                        rest.push(v);
                    }
                    let rest = Value::Array(rest);
                    if maybe_python_int(&rest) {
                        return Err(give_up());
                    }
                    return Ok(PromptField::Other(rest));
                }
                Ok(PromptField::Ids(ids))
            }
            fn visit_str<E>(self, v: &str) -> Result<PromptField, E> {
                Ok(PromptField::Text(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<PromptField, E> {
                Ok(PromptField::Text(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PromptField, A::Error> {
                while map.next_entry::<Skip, Skip>()?.is_some() {}
                Ok(PromptField::Invalid)
            }
            fn visit_bool<E>(self, _: bool) -> Result<PromptField, E> {
                Ok(PromptField::Invalid)
            }
            fn visit_i64<E>(self, _: i64) -> Result<PromptField, E> {
                Ok(PromptField::Invalid)
            }
            fn visit_u64<E>(self, _: u64) -> Result<PromptField, E> {
                Ok(PromptField::Invalid)
            }
            fn visit_f64<E>(self, _: f64) -> Result<PromptField, E> {
                Ok(PromptField::Invalid)
            }
            fn visit_unit<E>(self) -> Result<PromptField, E> {
                Ok(PromptField::Invalid)
            }
        }
        d.deserialize_any(PromptVisitor)
    }
}

/// The items as token ids: with `lax`, as pydantic's lax `int` reads each (`1.0`, `"2"`,
/// `true`); without, Python `int`s only (its strict mode).
fn token_ids(items: &[Value], lax: bool) -> Option<Vec<u32>> {
    let id = |t: &Value| {
        if !lax && !pyint::is_strict_int(t) {
            return None;
        }
        pyint::lax_int(t).and_then(|n| u32::try_from(n).ok())
    };
    items.iter().map(id).collect()
}

/// The items as a batch of token-id lists (see [`token_ids`]).
fn token_lists(items: &[Value], lax: bool) -> Option<Vec<Vec<u32>>> {
    items.iter().map(|i| i.as_array().and_then(|l| token_ids(l, lax))).collect()
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
    // vLLM's `prompt: list[int] | list[list[int]] | str | list[str]` is a pydantic smart
    // union: an exact (strict) match of any member wins, then the first lax one (`["1"]` is a
    // string, `[1, "2"]` and `[1.0]` token ids, `[["1"]]` a batch of token ids).
    if let Some(ids) = token_ids(items, false) {
        return Ok((Prompt::Tokens(ids), None));
    }
    let batch = Some(LoadOnly::Batch);
    if let Some(texts) = items.iter().map(Value::as_str).collect::<Option<Vec<&str>>>() {
        return Ok((Prompt::Text(texts.join("\n")), batch));
    }
    if let Some(lists) = token_lists(items, false) {
        return Ok((Prompt::Tokens(lists.concat()), batch));
    }
    if let Some(ids) = token_ids(items, true) {
        return Ok((Prompt::Tokens(ids), None));
    }
    let lists = token_lists(items, true).ok_or(RequestError::InvalidPrompt)?;
    Ok((Prompt::Tokens(lists.concat()), batch))
}
