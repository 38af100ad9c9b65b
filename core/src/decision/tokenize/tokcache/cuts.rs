//! Where a text may be cut without changing its tokenization: right after an added token that
//! the tokenizer splits out of the raw text before normalization and pre-tokenization.
//!
//! Hugging Face tokenizers first find added tokens with `normalized: false` in the raw text
//! (Aho-Corasick, leftmost-longest), then normalize, pre-tokenize and encode every piece
//! between them on its own. So if such a token ends at byte `q`, the ids of `text[..q]` do not
//! depend on what follows, and the ids of `text[q..]` are those of encoding it alone — provided
//! that nothing lets a match or a piece look across `q`. [`Cuts::of`] keeps only the tokens for
//! which that holds and returns none at all for tokenizers with a feature that breaks it:
//!
//! - truncation or padding (they change ids depending on the whole length);
//! - `encode_special_tokens` (special tokens are then found but not split out);
//! - a Metaspace pre-tokenizer with `prepend_scheme: "first"` (it treats the piece at offset 0
//!   differently, and the suffix would start at offset 0).
//!
//! A token is a cut when it is not `normalized` (matched on raw text), has neither `rstrip`
//! (its match would extend over what follows) nor `single_word` (its match depends on the next
//! character), starts and ends with a non-space, ends with punctuation when any added token is
//! `single_word` (that token's match depends on the character before it), and overlaps no
//! other raw-matched added token (no other token contains it except as its suffix, and no
//! proper suffix of another token is a proper prefix of it), so every occurrence in a text is a
//! match of the tokenizer's. Post-processors add nothing without special tokens, which is how
//! chat prompts are encoded. The property tests in `tests.rs` check the claim on both bundles.

use serde_json::Value;
use tokenizers::{AddedToken, Tokenizer};

use crate::decision::tokenize::fastbpe::compiled::CompiledError;
use crate::wire::Reader;

/// The added tokens after which a text may be cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cuts {
    tokens: Vec<String>,
    /// First bytes of `tokens`, to skip the rest of the text quickly.
    first: Vec<u8>,
}

impl Cuts {
    /// The cut tokens of `tk`; none when its configuration makes cutting unsafe.
    pub fn of(tk: &Tokenizer) -> Cuts {
        if tk.get_truncation().is_some()
            || tk.get_padding().is_some()
            || tk.get_encode_special_tokens()
            || tk
                .get_pre_tokenizer()
                .is_some_and(|p| serde_json::to_value(p).map_or(true, |v| prepends_first_only(&v)))
        {
            return Cuts::default();
        }
        let raw: Vec<AddedToken> = tk
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(_, t)| t)
            .filter(|t| !t.normalized)
            .collect();
        let single_word = raw.iter().any(|t| t.single_word);
        let tokens: Vec<String> = raw
            .iter()
            .filter(|t| is_cut(t, &raw, single_word))
            .map(|t| t.content.clone())
            .collect();
        Cuts::from_tokens(tokens)
    }

    pub(crate) fn from_tokens(mut tokens: Vec<String>) -> Cuts {
        tokens.sort();
        let mut first: Vec<u8> = tokens.iter().filter_map(|t| t.bytes().next()).collect();
        first.sort_unstable();
        first.dedup();
        Cuts { tokens, first }
    }

    /// Appends the cut tokens (a `u32` count, then each as `u32` length + UTF-8), for a
    /// compiled bundle.
    pub fn write_compiled(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in &self.tokens {
            out.extend_from_slice(&(t.len() as u32).to_le_bytes());
            out.extend_from_slice(t.as_bytes());
        }
    }

    /// Reads what [`Cuts::write_compiled`] wrote.
    pub(crate) fn read_compiled(r: &mut Reader<'_>) -> Result<Cuts, CompiledError> {
        let n = r.u32().ok_or(CompiledError::Truncated)? as usize;
        if n.saturating_mul(4) > r.remaining() {
            return Err(CompiledError::Truncated);
        }
        let mut tokens = Vec::with_capacity(n);
        for _ in 0..n {
            let len = r.u32().ok_or(CompiledError::Truncated)? as usize;
            let bytes = r.take(len).ok_or(CompiledError::Truncated)?;
            let t = std::str::from_utf8(bytes).map_err(|_| CompiledError::Utf8)?;
            if t.is_empty() {
                return Err(CompiledError::Bound("empty cut token"));
            }
            tokens.push(t.to_owned());
        }
        Ok(Cuts::from_tokens(tokens))
    }

    /// No token cuts: texts are always encoded whole.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The cut tokens, sorted.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// Byte offsets right after each occurrence of a cut token in `text`, ascending. The
    /// offsets in `text[..q]` are the same for every text that starts with it.
    pub fn find(&self, text: &str) -> Vec<usize> {
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(at) = self.next_first(&bytes[i..]) {
            i += at;
            match self.tokens.iter().find(|t| bytes[i..].starts_with(t.as_bytes())) {
                Some(t) => {
                    i += t.len();
                    out.push(i);
                }
                None => i += 1,
            }
        }
        out
    }

    /// Where the next byte that starts a cut token is in `bytes` (memchr for up to three
    /// distinct first bytes, the usual case: chat tokens start with `<` or `[`).
    fn next_first(&self, bytes: &[u8]) -> Option<usize> {
        match self.first[..] {
            [] => None,
            [a] => memchr::memchr(a, bytes),
            [a, b] => memchr::memchr2(a, b, bytes),
            [a, b, c] => memchr::memchr3(a, b, c, bytes),
            _ => bytes.iter().position(|b| self.first.binary_search(b).is_ok()),
        }
    }
}

fn is_cut(t: &AddedToken, raw: &[AddedToken], any_single_word: bool) -> bool {
    let c = t.content.as_str();
    let (Some(first), Some(last)) = (c.chars().next(), c.chars().next_back()) else {
        return false;
    };
    if t.rstrip || t.single_word || first.is_whitespace() || last.is_whitespace() {
        return false;
    }
    if any_single_word && !last.is_ascii_punctuation() {
        return false;
    }
    raw.iter()
        .filter(|o| o.content != t.content)
        .all(|o| !overlaps(o.content.as_bytes(), c.as_bytes()))
}

/// Whether an occurrence of `t` in a text could be covered by a match of `o` that starts
/// before it or ends after it.
fn overlaps(o: &[u8], t: &[u8]) -> bool {
    // `t` inside `o`, anywhere but at its very end.
    let inside = o.len() > t.len() && o[..o.len() - 1].windows(t.len()).any(|w| w == t);
    // A proper suffix of `o` is a proper prefix of `t`.
    let straddles = (1..o.len().min(t.len())).any(|k| o.ends_with(&t[..k]));
    inside || straddles
}

/// Whether a serialized pre-tokenizer contains a Metaspace that prepends only at offset 0.
fn prepends_first_only(v: &Value) -> bool {
    match v {
        Value::Object(o) => {
            let first = o.get("type").and_then(Value::as_str) == Some("Metaspace")
                && o.get("prepend_scheme").and_then(Value::as_str) != Some("always")
                && o.get("prepend_scheme").and_then(Value::as_str) != Some("never");
            first || o.values().any(prepends_first_only)
        }
        Value::Array(a) => a.iter().any(prepends_first_only),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::tokenize::model::ModelBundle;

    #[test]
    fn every_demo_special_token_cuts() {
        let cuts = Cuts::of(ModelBundle::demo().unwrap().tokenizer().unwrap());
        assert_eq!(cuts.tokens().len(), 5, "{:?}", cuts.tokens());
        let text = "<|begin_of_text|>hi<|eot_id|>x<|eot_id|";
        assert_eq!(cuts.find(text), vec![17, 29]);
        assert!(cuts.find("no tokens here < |eot_id|>").is_empty());
    }

    #[test]
    fn overlapping_tokens_are_not_cuts() {
        assert!(overlaps(b"<a><b>", b"<a>"), "inside, not at the end");
        assert!(!overlaps(b"x<a>", b"<a>"), "a suffix ends where it ends");
        assert!(overlaps(b"xx<", b"<a>"), "straddles the start");
        assert!(!overlaps(b"<b>", b"<a>"));
    }

    #[test]
    fn unsafe_tokenizers_have_no_cuts() {
        let meta = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}]});
        assert!(prepends_first_only(&meta));
        let always = serde_json::json!({"type": "Metaspace", "prepend_scheme": "always"});
        assert!(!prepends_first_only(&always));
        let mut tk = ModelBundle::demo().unwrap().tokenizer().unwrap().clone();
        tk.set_encode_special_tokens(true);
        assert!(Cuts::of(&tk).is_empty());
    }
}
