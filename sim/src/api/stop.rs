//! A request's stop conditions as each endpoint names them, and the output text they leave.
//!
//! - chat and completions: `stop` (a string or a list), `stop_token_ids`, `min_tokens`,
//!   `ignore_eos`, `include_stop_str_in_output`;
//! - responses: the same, without `min_tokens`;
//! - messages: `stop_sequences` (vLLM passes them on as the chat request's `stop`).
//!
//! As in vLLM, a stop token's text and a stop string (with whatever the last token held after
//! it) are cut from the output unless `include_stop_str_in_output`; both count as generated
//! tokens. The simulator samples words only, never the end-of-sequence token, so EOS never ends
//! a request here (`ignore_eos` is accepted and changes nothing).

use std::sync::Arc;

use kvroute_core::decision::request::Endpoint;
use kvroute_core::decision::tokenize::model::ModelBundle;
use serde::Deserialize;

use crate::engine::{Finish, StopReason, StopRule, StopText};

#[derive(Deserialize)]
#[serde(untagged)]
enum StopParam {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct Fields {
    #[serde(default)]
    stop: Option<StopParam>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    min_tokens: Option<usize>,
    #[serde(default)]
    include_stop_str_in_output: Option<bool>,
}

/// The stop conditions of one request.
#[derive(Debug, Clone, Default)]
pub struct Stops {
    pub strings: Vec<String>,
    pub token_ids: Vec<u32>,
    pub min_tokens: usize,
    pub include: bool,
}

impl Stops {
    /// Reads `endpoint`'s stop fields from a request body; an ill-typed field is an error
    /// (`param`, message).
    pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Stops, String> {
        let f: Fields = serde_json::from_slice(body).map_err(|e| format!("invalid stop: {e}"))?;
        let (strings, token_ids, min_tokens, include) = match endpoint {
            Endpoint::Messages => (f.stop_sequences.unwrap_or_default(), Vec::new(), 0, false),
            _ => {
                let strings = match f.stop {
                    None => Vec::new(),
                    Some(StopParam::One(s)) => vec![s],
                    Some(StopParam::Many(v)) => v,
                };
                let min =
                    if endpoint == Endpoint::Responses { 0 } else { f.min_tokens.unwrap_or(0) };
                (
                    strings,
                    f.stop_token_ids.unwrap_or_default(),
                    min,
                    f.include_stop_str_in_output.unwrap_or(false),
                )
            }
        };
        let strings = strings.into_iter().filter(|s| !s.is_empty()).collect();
        Ok(Stops { strings, token_ids, min_tokens, include })
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty() && self.token_ids.is_empty()
    }

    fn longest(&self) -> usize {
        self.strings.iter().map(String::len).max().unwrap_or(0)
    }

    /// The engine's rule: stop token ids and, through `bundle`'s decoding of the output's
    /// tail, the stop strings.
    pub fn rule(&self, bundle: &ModelBundle) -> StopRule {
        let text = (!self.strings.is_empty()).then(|| {
            let strings = self.strings.clone();
            let bundle = bundle.clone();
            // Every output token decodes to at least one byte: this many cover any match.
            let window = self.longest() + 1;
            Arc::new(move |ids: &[u32]| {
                let tail = &ids[ids.len().saturating_sub(window)..];
                let pieces: Vec<String> =
                    tail.iter().map(|id| bundle.decode(&[*id]).unwrap_or_default()).collect();
                let last = pieces.last().map_or(0, String::len);
                let text = pieces.concat();
                first_match(&strings, &text, text.len() - last).map(|(_, s)| s.to_owned())
            }) as StopText
        });
        StopRule { min_tokens: self.min_tokens, eos: None, token_ids: self.token_ids.clone(), text }
    }
}

/// The earliest stop string that ends after byte `new_from` of `text` (one the newest text
/// completes): its start and the string.
fn first_match<'a>(strings: &'a [String], text: &str, new_from: usize) -> Option<(usize, &'a str)> {
    strings
        .iter()
        .filter_map(|s| {
            let from = floor_boundary(text, (new_from + 1).saturating_sub(s.len()));
            text[from..].find(s.as_str()).map(|i| (from + i, s.as_str()))
        })
        .min_by_key(|(i, _)| *i)
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The output text of one request as it streams: holds back what a stop condition may still
/// cut (the last token while stop tokens are set, and as many bytes as the longest stop string
/// before it), and cuts the end when the request stops.
pub struct TextOut {
    stops: Stops,
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
    /// Where the last token's text starts.
    last_from: usize,
}

impl TextOut {
    pub fn new(stops: Stops) -> TextOut {
        TextOut { stops, text: String::new(), sent: 0, last_from: 0 }
    }

    /// Adds a token's text; returns what can be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        self.last_from = self.text.len();
        self.text.push_str(piece);
        if self.stops.is_empty() {
            return self.take(self.text.len());
        }
        let hold = if self.stops.strings.is_empty() { 0 } else { self.stops.longest() };
        let upto = floor_boundary(&self.text, self.last_from.saturating_sub(hold));
        self.take(upto)
    }

    fn take(&mut self, upto: usize) -> String {
        if upto <= self.sent {
            return String::new();
        }
        let out = self.text[self.sent..upto].to_owned();
        self.sent = upto;
        out
    }

    /// The rest of the output after the request ended for `finish`.
    pub fn finish(&mut self, finish: &Finish) -> String {
        let end = match finish {
            Finish::Stop(Some(StopReason::Token(_))) | Finish::Stop(None)
                if !self.stops.include =>
            {
                self.last_from
            }
            Finish::Stop(Some(StopReason::Text(s))) => {
                match first_match(std::slice::from_ref(s), &self.text, self.last_from) {
                    Some((i, _)) if self.stops.include => i + s.len(),
                    Some((i, _)) => i,
                    None => self.text.len(),
                }
            }
            _ => self.text.len(),
        };
        self.take(end.max(self.sent))
    }

    /// The whole output so far (what was sent plus what [`TextOut::finish`] returned).
    pub fn sent_text(&self) -> &str {
        &self.text[..self.sent]
    }
}

/// vLLM's `finish_reason` and `stop_reason` for chat and completions.
pub fn openai_reasons(finish: &Finish) -> (&'static str, serde_json::Value) {
    match finish {
        Finish::Length => ("length", serde_json::Value::Null),
        Finish::Stop(None) => ("stop", serde_json::Value::Null),
        Finish::Stop(Some(StopReason::Token(t))) => ("stop", (*t).into()),
        Finish::Stop(Some(StopReason::Text(s))) => ("stop", s.clone().into()),
    }
}

/// The status of a Responses output item that ended for `finish` (vLLM's
/// `response_item_status`).
pub fn item_status(finish: &Finish) -> &'static str {
    match finish {
        Finish::Length => "incomplete",
        Finish::Stop(_) => "completed",
    }
}

/// Anthropic's `stop_reason` and `stop_sequence` (vLLM's mapping: length is `max_tokens`, a
/// matched stop string `stop_sequence`, any other stop `end_turn`).
pub fn anthropic_reasons(finish: &Finish) -> (&'static str, serde_json::Value) {
    match finish {
        Finish::Length => ("max_tokens", serde_json::Value::Null),
        Finish::Stop(Some(StopReason::Text(s))) => ("stop_sequence", s.clone().into()),
        Finish::Stop(_) => ("end_turn", serde_json::Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(strings: &[&str], include: bool) -> Stops {
        Stops {
            strings: strings.iter().map(|s| s.to_string()).collect(),
            include,
            ..Default::default()
        }
    }

    #[test]
    fn a_stop_string_is_cut_with_what_follows_it() {
        let mut t = TextOut::new(stops(&["lo w"], false));
        let mut out = String::new();
        for p in [" one", " hello", " world"] {
            out += &t.push(p);
        }
        assert!(!out.contains("lo"), "sent part of the stop string: {out:?}");
        let s = Finish::Stop(Some(StopReason::Text("lo w".into())));
        out += &t.finish(&s);
        assert_eq!(out, " one hel");
    }

    #[test]
    fn included_stop_string_stays() {
        let mut t = TextOut::new(stops(&["lo w"], true));
        let mut out = String::new();
        for p in [" one", " hello", " world"] {
            out += &t.push(p);
        }
        out += &t.finish(&Finish::Stop(Some(StopReason::Text("lo w".into()))));
        assert_eq!(out, " one hello w");
    }

    #[test]
    fn a_stop_token_leaves_no_text_and_length_keeps_all() {
        let st = Stops { token_ids: vec![7], ..Default::default() };
        let mut t = TextOut::new(st.clone());
        let mut out = t.push(" a");
        out += &t.push(" b");
        assert_eq!(out, " a");
        out += &t.finish(&Finish::Stop(Some(StopReason::Token(7))));
        assert_eq!(out, " a");
        let mut t = TextOut::new(st);
        let mut out = t.push(" a") + &t.push(" b");
        out += &t.finish(&Finish::Length);
        assert_eq!(out, " a b");
    }

    #[test]
    fn matches_only_in_new_text() {
        let s = vec!["ab".to_string()];
        assert_eq!(first_match(&s, "xxab yy", 5), None);
        assert_eq!(first_match(&s, "xxab yya", 7), None);
        assert_eq!(first_match(&s, "xxa", 2).map(|m| m.0), None);
        assert_eq!(first_match(&s, "xxab", 3).map(|m| m.0), Some(2));
    }
}
