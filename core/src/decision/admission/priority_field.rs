//! The engine's queue priority in a forwarded request body: the top-level `priority` member of
//! a JSON object (vLLM's and SGLang's OpenAI-compatible requests), set to a class's
//! `engine_priority` or removed, everything else kept byte for byte.
//!
//! The body has already been read by the router (as Python's `json` reads it, see
//! [`crate::decision::pyjson`]); this only finds the top-level members' spans. Keys are compared
//! decoded, so an escaped spelling (`"pri\u006frity"`) or a duplicate (Python keeps the last)
//! cannot slip a client's own value past the edit: every top-level `priority` member goes, and
//! at most one, the class's, comes back. Members nested deeper (a tool's parameters named
//! `priority`) are values like any other and stay as they are.
//!
//! The scan never recurses (nested containers are skipped by counting brackets, strings by
//! their escapes) and never panics; a body it cannot read as one JSON object is an error, not
//! a guess.

use thiserror::Error;

/// What to do with a body's top-level `priority` member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriorityEdit {
    /// Leave the body alone.
    Keep,
    /// Remove every top-level `priority` member (the engine's default then applies).
    Remove,
    /// Exactly one top-level `"priority": n`.
    Set(i64),
}

/// A body the edit cannot be applied to.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("request body is not one JSON object: {what} at byte {at}")]
pub struct PriorityFieldError {
    pub what: &'static str,
    pub at: usize,
}

/// The key edited.
const KEY: &[u8] = b"priority";

/// One top-level member: where its key starts, where its value starts and ends, and whether
/// its key is `priority`.
#[derive(Debug, Clone, Copy)]
struct Member {
    key_start: usize,
    value_start: usize,
    value_end: usize,
    is_priority: bool,
}

/// Applies `edit` to `body`: `Ok(None)` when the body already says what the edit wants (or
/// the edit is [`PriorityEdit::Keep`]), else the new body.
pub fn rewrite(body: &[u8], edit: PriorityEdit) -> Result<Option<Vec<u8>>, PriorityFieldError> {
    if edit == PriorityEdit::Keep {
        return Ok(None);
    }
    let (open, members) = scan(body)?;
    let found: Vec<&Member> = members.iter().filter(|m| m.is_priority).collect();
    let set = match edit {
        PriorityEdit::Keep => return Ok(None),
        PriorityEdit::Remove if found.is_empty() => return Ok(None),
        PriorityEdit::Remove => None,
        PriorityEdit::Set(n) => Some(n),
    };
    if let (Some(n), [only]) = (set, found.as_slice()) {
        // One member already: its value replaced in place (or nothing to do).
        let text = n.to_string();
        let value = &body[only.value_start..only.value_end];
        if value == text.as_bytes() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(body.len() + text.len());
        out.extend_from_slice(&body[..only.value_start]);
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(&body[only.value_end..]);
        return Ok(Some(out));
    }
    Ok(Some(rebuild(body, open, &members, set)))
}

/// The body without its `priority` members, with `"priority":n` first when `set`.
fn rebuild(body: &[u8], open: usize, members: &[Member], set: Option<i64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 24);
    let (Some(first), Some(last)) = (members.first(), members.last()) else {
        out.extend_from_slice(&body[..=open]);
        if let Some(n) = set {
            push_member(&mut out, n);
        }
        out.extend_from_slice(&body[open + 1..]);
        return out;
    };
    out.extend_from_slice(&body[..first.key_start]);
    let kept: Vec<usize> = (0..members.len()).filter(|&i| !members[i].is_priority).collect();
    if let Some(n) = set {
        push_member(&mut out, n);
        if !kept.is_empty() {
            out.push(b',');
        }
    }
    for (k, &i) in kept.iter().enumerate() {
        if k > 0 {
            // The separator before member i (`, ` as the client wrote it), whoever preceded.
            out.extend_from_slice(&body[members[i - 1].value_end..members[i].key_start]);
        }
        out.extend_from_slice(&body[members[i].key_start..members[i].value_end]);
    }
    out.extend_from_slice(&body[last.value_end..]);
    out
}

fn push_member(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(b"\"priority\":");
    out.extend_from_slice(n.to_string().as_bytes());
}

fn err(what: &'static str, at: usize) -> PriorityFieldError {
    PriorityFieldError { what, at }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_ws(body: &[u8], mut at: usize) -> usize {
    while body.get(at).copied().is_some_and(is_ws) {
        at += 1;
    }
    at
}

/// The top-level object's opening brace and members.
fn scan(body: &[u8]) -> Result<(usize, Vec<Member>), PriorityFieldError> {
    let start = if body.starts_with(b"\xef\xbb\xbf") { 3 } else { 0 };
    let open = skip_ws(body, start);
    if body.get(open) != Some(&b'{') {
        return Err(err("an object expected", open));
    }
    let mut members = Vec::new();
    let mut at = skip_ws(body, open + 1);
    if body.get(at) == Some(&b'}') {
        return end(body, at + 1).map(|()| (open, members));
    }
    loop {
        if body.get(at) != Some(&b'"') {
            return Err(err("a key expected", at));
        }
        let key_start = at;
        let key_end = skip_string(body, at)?;
        let is_priority = key_is(&body[key_start + 1..key_end - 1], KEY);
        at = skip_ws(body, key_end);
        if body.get(at) != Some(&b':') {
            return Err(err("':' expected", at));
        }
        let value_start = skip_ws(body, at + 1);
        let value_end = skip_value(body, value_start)?;
        members.push(Member { key_start, value_start, value_end, is_priority });
        at = skip_ws(body, value_end);
        match body.get(at) {
            Some(b',') => at = skip_ws(body, at + 1),
            Some(b'}') => return end(body, at + 1).map(|()| (open, members)),
            _ => return Err(err("',' or '}' expected", at)),
        }
    }
}

/// Only white space may follow the object.
fn end(body: &[u8], at: usize) -> Result<(), PriorityFieldError> {
    let at = skip_ws(body, at);
    if at == body.len() {
        Ok(())
    } else {
        Err(err("data after the object", at))
    }
}

/// The end (one past the closing quote) of the string starting at `at` (a `"`).
fn skip_string(body: &[u8], at: usize) -> Result<usize, PriorityFieldError> {
    let mut i = at + 1;
    while let Some(&b) = body.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(err("unterminated string", at))
}

/// The end of the value starting at `at`: a string, a container (skipped by counting brackets
/// outside strings) or a scalar (a number or a literal, up to the next delimiter).
fn skip_value(body: &[u8], at: usize) -> Result<usize, PriorityFieldError> {
    match body.get(at) {
        None => Err(err("a value expected", at)),
        Some(b'"') => skip_string(body, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = at;
            while let Some(&b) = body.get(i) {
                match b {
                    b'"' => {
                        i = skip_string(body, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            Err(err("unterminated container", at))
        }
        Some(_) => {
            let mut i = at;
            while body.get(i).is_some_and(|&b| !is_ws(b) && !matches!(b, b',' | b'}' | b']')) {
                i += 1;
            }
            if i == at {
                Err(err("a value expected", at))
            } else {
                Ok(i)
            }
        }
    }
}

/// Whether a key's raw text (between its quotes) decodes to `want` (ASCII).
fn key_is(raw: &[u8], want: &[u8]) -> bool {
    let mut got = 0usize;
    let mut i = 0usize;
    while i < raw.len() {
        let b = if raw[i] == b'\\' {
            let Some(&e) = raw.get(i + 1) else { return false };
            i += 2;
            match e {
                b'"' | b'\\' | b'/' => e,
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                b'u' => {
                    let Some(hex) = raw.get(i..i + 4) else { return false };
                    i += 4;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return false;
                    }
                    let Some(cp) =
                        std::str::from_utf8(hex).ok().and_then(|h| u32::from_str_radix(h, 16).ok())
                    else {
                        return false;
                    };
                    // Only ASCII can match an ASCII key.
                    match u8::try_from(cp) {
                        Ok(c) if c.is_ascii() => c,
                        _ => return false,
                    }
                }
                _ => return false,
            }
        } else {
            i += 1;
            raw[i - 1]
        };
        if want.get(got) != Some(&b) {
            return false;
        }
        got += 1;
    }
    got == want.len()
}

#[cfg(test)]
#[path = "priority_field_tests.rs"]
mod tests;
