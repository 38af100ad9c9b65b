//! Finds `usage` token counts in a response body that arrives in chunks (a JSON body or an SSE
//! stream), without buffering it: a short tail is carried over so that a key split across two
//! chunks is still found. The last complete value seen wins (the final SSE chunk has the usage).

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
}

impl UsageScanner {
    pub fn push(&mut self, chunk: &[u8]) {
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(chunk);
        if let Some(v) = last_number(&buf, b"\"cached_tokens\"") {
            self.usage.cached_tokens = Some(v);
        }
        if let Some(v) = last_number(&buf, b"\"prompt_tokens\"") {
            self.usage.prompt_tokens = Some(v);
        }
        let keep = buf.len().saturating_sub(TAIL);
        self.tail = buf.split_off(keep);
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }
}

/// The value of the last complete `key: <integer>` in `buf` (one whose digits are followed by
/// another byte, so a number cut at the chunk end is not taken).
fn last_number(buf: &[u8], key: &[u8]) -> Option<u64> {
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
            found = Some(v);
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
    fn null_or_absent_details_give_none() {
        let mut s = UsageScanner::default();
        s.push(br#"{"usage":{"prompt_tokens":3,"prompt_tokens_details":null}}"#);
        assert_eq!(s.usage(), Usage { prompt_tokens: Some(3), cached_tokens: None });
    }
}
