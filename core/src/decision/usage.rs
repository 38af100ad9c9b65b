//! Finds `usage` token counts in a response body that arrives in chunks (a JSON body or an SSE
//! stream), without buffering it: a short tail is carried over so that a key split across two
//! chunks is still found. The last complete value seen wins (the final SSE chunk has the usage).
//!
//! Every endpoint's spelling is read: chat and completions (`prompt_tokens`,
//! `prompt_tokens_details.cached_tokens`), Responses (`input_tokens`,
//! `input_tokens_details.cached_tokens`, in the body or the `response.completed` event) and
//! Anthropic-style Messages (`input_tokens`, `cache_read_input_tokens`,
//! `cache_creation_input_tokens`). Anthropic's `input_tokens` leaves out what was read from
//! and written to the cache (vLLM 0.33: `input_tokens = prompt_tokens - cache_read -
//! cache_creation`), so the prompt of a Messages answer is the sum of the three.

/// Carried-over bytes between chunks; longer than any `"key": value` we look for.
const TAIL: usize = 96;

/// Usage numbers seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

/// Streaming scanner over response body chunks.
#[derive(Debug, Default)]
pub struct UsageScanner {
    tail: Vec<u8>,
    usage: Usage,
    /// Anthropic's cache fields, when the answer has them.
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
}

impl UsageScanner {
    pub fn push(&mut self, chunk: &[u8]) {
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(chunk);
        if let Some(v) = last_of(&buf, &[b"\"cached_tokens\"", b"\"cache_read_input_tokens\""]) {
            self.usage.cached_tokens = Some(v);
        }
        if let Some(v) = last_of(&buf, &[b"\"cache_read_input_tokens\""]) {
            self.cache_read = Some(v);
        }
        if let Some(v) = last_of(&buf, &[b"\"cache_creation_input_tokens\""]) {
            self.cache_creation = Some(v);
        }
        if let Some(v) = last_of(&buf, &[b"\"prompt_tokens\"", b"\"input_tokens\""]) {
            self.usage.prompt_tokens = Some(v);
        }
        let keep = buf.len().saturating_sub(TAIL);
        self.tail = buf.split_off(keep);
    }

    pub fn usage(&self) -> Usage {
        let mut u = self.usage;
        // A Messages answer: its `input_tokens` excludes the cache's reads and writes.
        if self.cache_read.is_some() || self.cache_creation.is_some() {
            let cache =
                self.cache_read.unwrap_or(0).saturating_add(self.cache_creation.unwrap_or(0));
            u.prompt_tokens = u.prompt_tokens.map(|p| p.saturating_add(cache));
        }
        u
    }
}

/// The value of whichever of `keys` comes last in `buf` with a complete number.
fn last_of(buf: &[u8], keys: &[&[u8]]) -> Option<u64> {
    keys.iter().filter_map(|k| last_number(buf, k)).max_by_key(|(at, _)| *at).map(|(_, v)| v)
}

/// The position and value of the last complete `key: <integer>` in `buf` (one whose digits are
/// followed by another byte, so a number cut at the chunk end is not taken).
fn last_number(buf: &[u8], key: &[u8]) -> Option<(usize, u64)> {
    let mut found = None;
    let mut from = 0;
    while let Some(pos) = find(&buf[from..], key) {
        let start = from + pos + key.len();
        from = start;
        let rest = &buf[start..];
        let rest = skip_ws(rest);
        let Some(rest) = rest.strip_prefix(b":") else {
            continue;
        };
        let rest = skip_ws(rest);
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || digits == rest.len() || digits > 19 {
            continue;
        }
        let text = std::str::from_utf8(&rest[..digits]).ok();
        if let Some(v) = text.and_then(|t| t.parse().ok()) {
            found = Some((start, v));
        }
    }
    found
}

fn skip_ws(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SSE: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":1234,",
        "\"completion_tokens\":5,\"total_tokens\":1239,",
        "\"prompt_tokens_details\":{\"cached_tokens\": 1216}}}\n\n",
        "data: [DONE]\n\n"
    );

    #[test]
    fn finds_usage_at_every_split_point() {
        for split in 0..SSE.len() {
            let mut s = UsageScanner::default();
            s.push(&SSE.as_bytes()[..split]);
            s.push(&SSE.as_bytes()[split..]);
            assert_eq!(
                s.usage(),
                Usage { prompt_tokens: Some(1234), cached_tokens: Some(1216) },
                "split at {split}"
            );
        }
    }

    #[test]
    fn byte_by_byte_and_json_bodies() {
        let body = r#"{"usage":{"prompt_tokens":17,"prompt_tokens_details":{"cached_tokens":16}}}"#;
        let mut s = UsageScanner::default();
        for b in body.as_bytes() {
            s.push(&[*b]);
        }
        assert_eq!(s.usage().cached_tokens, Some(16));
        assert_eq!(s.usage().prompt_tokens, Some(17));
    }

    #[test]
    fn responses_and_messages_usage_at_every_split_point() {
        // vLLM's Responses stream ends with `response.completed`; its Messages stream with a
        // `message_delta` event carrying the usage.
        let responses = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":",
            "{\"input_tokens\":1234,\"input_tokens_details\":{\"cached_tokens\":1216,",
            "\"input_tokens_per_turn\":[],\"cached_tokens_per_turn\":[]},\"output_tokens\":5,",
            "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":1239}}}\n\n"
        );
        let messages = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":",
            "{\"input_tokens\":0,\"output_tokens\":0}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":0,",
            "\"output_tokens\":5,\"cache_creation_input_tokens\":18,\"cache_read_input_tokens\":1216}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        for body in [responses, messages] {
            for split in 0..body.len() {
                let mut s = UsageScanner::default();
                s.push(&body.as_bytes()[..split]);
                s.push(&body.as_bytes()[split..]);
                assert_eq!(
                    s.usage(),
                    Usage { prompt_tokens: Some(1234), cached_tokens: Some(1216) },
                    "split at {split}"
                );
            }
        }
    }

    #[test]
    fn null_or_absent_details_give_none() {
        let mut s = UsageScanner::default();
        s.push(br#"{"usage":{"prompt_tokens":3,"prompt_tokens_details":null}}"#);
        assert_eq!(s.usage(), Usage { prompt_tokens: Some(3), cached_tokens: None });
    }
}
