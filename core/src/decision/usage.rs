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
        // One pass over the quotes that start a key; a later value overrides an earlier one.
        for (key, v) in keyed_numbers(&buf) {
            match key {
                Key::Cached => self.usage.cached_tokens = Some(v),
                Key::CacheRead => {
                    self.usage.cached_tokens = Some(v);
                    self.cache_read = Some(v);
                }
                Key::CacheCreation => self.cache_creation = Some(v),
                Key::Prompt | Key::Input => self.usage.prompt_tokens = Some(v),
            }
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

/// The keys whose numbers are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Cached,
    CacheRead,
    CacheCreation,
    Prompt,
    Input,
}

/// Each key with its quotes. None is a prefix of another, so at most one starts at a quote.
const KEYS: [(&[u8], Key); 5] = [
    (b"\"cached_tokens\"", Key::Cached),
    (b"\"cache_read_input_tokens\"", Key::CacheRead),
    (b"\"cache_creation_input_tokens\"", Key::CacheCreation),
    (b"\"prompt_tokens\"", Key::Prompt),
    (b"\"input_tokens\"", Key::Input),
];

/// Every complete `"key": <integer>` in `buf`, in order: one whose digits are followed by
/// another byte, so a number cut at the chunk end is not taken.
fn keyed_numbers(buf: &[u8]) -> impl Iterator<Item = (Key, u64)> + '_ {
    memchr::memchr_iter(b'"', buf).filter_map(move |at| {
        let rest = &buf[at..];
        let (name, key) = KEYS.iter().find(|(name, _)| rest.starts_with(name))?;
        Some((*key, number_after(&rest[name.len()..])?))
    })
}

/// The integer of `: <digits>` at the start of `rest` (whitespace allowed around the colon).
fn number_after(rest: &[u8]) -> Option<u64> {
    let rest = skip_ws(rest).strip_prefix(b":")?;
    let rest = skip_ws(rest);
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits == rest.len() || digits > 19 {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

fn skip_ws(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
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

    /// The scan as first written, one key at a time over the whole buffer: the reference the
    /// one-pass scan must agree with.
    #[derive(Default)]
    struct Reference {
        tail: Vec<u8>,
        fields: [Option<u64>; 4],
    }

    impl Reference {
        fn push(&mut self, chunk: &[u8]) {
            let mut buf = std::mem::take(&mut self.tail);
            buf.extend_from_slice(chunk);
            let keys: [&[&[u8]]; 4] = [
                &[b"\"cached_tokens\"", b"\"cache_read_input_tokens\""],
                &[b"\"cache_read_input_tokens\""],
                &[b"\"cache_creation_input_tokens\""],
                &[b"\"prompt_tokens\"", b"\"input_tokens\""],
            ];
            for (field, keys) in self.fields.iter_mut().zip(keys) {
                let last = keys
                    .iter()
                    .filter_map(|k| last_number(&buf, k))
                    .max_by_key(|(at, _)| *at)
                    .map(|(_, v)| v);
                if last.is_some() {
                    *field = last;
                }
            }
            let keep = buf.len().saturating_sub(TAIL);
            self.tail = buf.split_off(keep);
        }
    }

    fn last_number(buf: &[u8], key: &[u8]) -> Option<(usize, u64)> {
        let mut found = None;
        let mut from = 0;
        while let Some(pos) = buf[from..].windows(key.len()).position(|w| w == key) {
            let start = from + pos + key.len();
            from = start;
            let rest = skip_ws(&buf[start..]);
            let Some(rest) = rest.strip_prefix(b":") else { continue };
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

    proptest::proptest! {
        /// Bodies made of keys, separators, digits and stray bytes, cut into chunks anywhere:
        /// the one-pass scan reads what the reference reads.
        #[test]
        fn one_pass_scan_agrees_with_the_reference(
            parts in proptest::collection::vec(0usize..16, 0..80),
            numbers in proptest::collection::vec(0u64..u64::MAX, 80),
            cuts in proptest::collection::vec(0usize..400, 0..6),
        ) {
            const PIECES: [&[u8]; 12] = [
                b"\"cached_tokens\"", b"\"cache_read_input_tokens\"",
                b"\"cache_creation_input_tokens\"", b"\"prompt_tokens\"", b"\"input_tokens\"",
                b":", b" ", b"\n", b",", b"\"", b"{\"usage\":", b"data: ",
            ];
            let mut body = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                match PIECES.get(*p) {
                    Some(piece) => body.extend_from_slice(piece),
                    // Numbers of every length, up to past the 19 digits read.
                    None if *p == 12 => body.extend_from_slice(numbers[i].to_string().as_bytes()),
                    None if *p == 13 => body.extend_from_slice(b"99999999999999999999"),
                    None => body.push(b'x'.wrapping_add(*p as u8)),
                }
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort_unstable();
            let (mut s, mut r) = (UsageScanner::default(), Reference::default());
            let mut from = 0;
            for at in cuts.into_iter().chain([body.len()]) {
                s.push(&body[from..at]);
                r.push(&body[from..at]);
                from = at;
                let got = [s.usage.cached_tokens, s.cache_read, s.cache_creation, s.usage.prompt_tokens];
                proptest::prop_assert_eq!(got, r.fields);
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
