//! Token timings from an OpenAI streaming response (server-sent events).
//!
//! [`SseTimer`] is fed the response body incrementally, split anywhere (inside a line, inside a
//! UTF-8 sequence, between `\r` and `\n`), each piece stamped with its arrival time. Events are
//! the `data:` lines up to a blank line; lines may end with `\n`, `\r\n` or `\r`; comments
//! (`:`) and other fields are ignored; `data: [DONE]` ends the stream. Every JSON chunk with a
//! non-empty `choices[*].delta.content` (chat) or `choices[*].text` (completions) counts as one
//! generated token, stamped with the arrival time of the bytes that completed its event. Usage
//! and in-stream error objects are read from any chunk. Only metrics are kept: the generated
//! text is never stored.
//!
//! Memory is bounded: an unfinished line (or the data of one event) longer than
//! [`MAX_LINE_BYTES`] is dropped and the stream is flagged `malformed`.

use std::time::Duration;

use serde_json::Value;

/// The most bytes of one unfinished line, or of one event's data, that are kept.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// What one streamed response measured.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamMetrics {
    /// Arrival of the first generated token, from the request's start.
    pub ttft: Option<Duration>,
    /// Arrival of every generated token (one per content chunk), from the request's start.
    pub token_times: Vec<Duration>,
    /// The gaps between consecutive token arrivals (`token_times.len() - 1` of them).
    pub gaps: Vec<Duration>,
    /// The longest gap (zero when there are fewer than two tokens).
    pub max_gap: Duration,
    /// End of the stream, from the request's start.
    pub end: Duration,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`: what the engine reported reusing.
    pub cached_tokens: Option<u64>,
    /// `data: [DONE]` was seen.
    pub done: bool,
    /// The message of an error object sent in the stream, if any.
    pub error: Option<String>,
    /// Something could not be used: a line or event over [`MAX_LINE_BYTES`], invalid UTF-8, a
    /// `data` payload that is not JSON, or an event left unterminated when the stream ended.
    pub malformed: bool,
}

impl StreamMetrics {
    /// The number of gaps strictly longer than `threshold`.
    pub fn stalls(&self, threshold: Duration) -> u32 {
        let n = self.gaps.iter().filter(|g| **g > threshold).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The mean gap between consecutive tokens, `None` with fewer than two tokens.
    pub fn mean_gap(&self) -> Option<Duration> {
        let n = u32::try_from(self.gaps.len()).ok().filter(|n| *n > 0)?;
        Some(self.gaps.iter().sum::<Duration>() / n)
    }
}

/// Incremental SSE parser that records token arrival times; see the module docs.
#[derive(Debug, Default)]
pub struct SseTimer {
    /// Bytes of the current, unfinished line.
    line: Vec<u8>,
    /// The current line grew past the limit: its remaining bytes are skipped.
    skipping_line: bool,
    /// The previous byte was a `\r` ending a line: a following `\n` belongs to it.
    after_cr: bool,
    /// Whether any line has been completed yet (a leading byte-order mark is stripped).
    seen_line: bool,
    /// The `data` of the current event, lines joined with `\n`.
    data: String,
    /// The current event has at least one `data` field.
    has_data: bool,
    /// Part of the current event was dropped: the event is discarded when it ends.
    event_broken: bool,
    metrics: StreamMetrics,
}

impl SseTimer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the body, which arrived `at` after the request was sent.
    pub fn push(&mut self, bytes: &[u8], at: Duration) {
        let mut rest = bytes;
        if self.after_cr {
            if let Some((b'\n', tail)) = rest.split_first() {
                rest = tail;
            }
            if !bytes.is_empty() {
                self.after_cr = false;
            }
        }
        while !rest.is_empty() {
            match rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(i) => {
                    self.append(&rest[..i]);
                    self.end_line(at);
                    if rest[i] == b'\r' {
                        match rest.get(i + 1) {
                            Some(b'\n') => rest = &rest[i + 2..],
                            Some(_) => rest = &rest[i + 1..],
                            None => {
                                self.after_cr = true;
                                rest = &[];
                            }
                        }
                    } else {
                        rest = &rest[i + 1..];
                    }
                }
                None => {
                    self.append(rest);
                    rest = &[];
                }
            }
        }
    }

    /// Ends the stream at `end` (from the request's start) and returns what was measured.
    /// An event not terminated by a blank line is not used (as in the SSE specification) and
    /// flags the stream `malformed`, unless `[DONE]` was already seen.
    pub fn finish(self, end: Duration) -> StreamMetrics {
        let mut m = self.metrics;
        let unterminated = !self.line.is_empty() || self.skipping_line || self.has_data;
        if unterminated && !m.done {
            m.malformed = true;
        }
        m.gaps = m.token_times.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
        m.max_gap = m.gaps.iter().copied().max().unwrap_or(Duration::ZERO);
        m.ttft = m.token_times.first().copied();
        m.end = end;
        m
    }

    /// Appends bytes to the current line, within the limit.
    fn append(&mut self, bytes: &[u8]) {
        if self.skipping_line || bytes.is_empty() {
            return;
        }
        if self.line.len() + bytes.len() > MAX_LINE_BYTES {
            self.line = Vec::new();
            self.skipping_line = true;
            self.event_broken = true;
            self.metrics.malformed = true;
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    /// Handles the line just completed (a blank one dispatches the event).
    fn end_line(&mut self, at: Duration) {
        let raw = std::mem::take(&mut self.line);
        let first = !self.seen_line;
        self.seen_line = true;
        if std::mem::take(&mut self.skipping_line) {
            return;
        }
        let mut bytes = raw.as_slice();
        if first {
            bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        }
        if bytes.is_empty() {
            self.dispatch(at);
            return;
        }
        if self.metrics.done {
            return;
        }
        let Ok(line) = std::str::from_utf8(bytes) else {
            self.metrics.malformed = true;
            self.event_broken = true;
            return;
        };
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field != "data" {
            return;
        }
        if self.data.len() + value.len() + 1 > MAX_LINE_BYTES {
            self.data = String::new();
            self.event_broken = true;
            self.metrics.malformed = true;
            return;
        }
        if self.has_data {
            self.data.push('\n');
        }
        self.data.push_str(value);
        self.has_data = true;
    }

    /// Ends the current event, completed by bytes that arrived `at`.
    fn dispatch(&mut self, at: Duration) {
        let data = std::mem::take(&mut self.data);
        let has_data = std::mem::take(&mut self.has_data);
        let broken = std::mem::take(&mut self.event_broken);
        if broken || !has_data || self.metrics.done {
            return;
        }
        if data.trim() == "[DONE]" {
            self.metrics.done = true;
            return;
        }
        match serde_json::from_str::<Value>(&data) {
            Ok(chunk) => self.chunk(&chunk, at),
            Err(_) => self.metrics.malformed = true,
        }
    }

    /// Reads one JSON chunk: a token, usage, or an error object.
    fn chunk(&mut self, chunk: &Value, at: Duration) {
        if let Some(err) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = match err {
                Value::String(s) => s.clone(),
                other => match other.get("message").and_then(Value::as_str) {
                    Some(s) => s.to_owned(),
                    None => other.to_string(),
                },
            };
            self.metrics.error.get_or_insert(message);
        }
        let is_token = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|choices| choices.iter().any(has_text));
        if is_token {
            self.metrics.token_times.push(at);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let m = &mut self.metrics;
            if let Some(v) = usage.get("prompt_tokens").and_then(Value::as_u64) {
                m.prompt_tokens = Some(v);
            }
            if let Some(v) = usage.get("completion_tokens").and_then(Value::as_u64) {
                m.completion_tokens = Some(v);
            }
            let cached = usage.pointer("/prompt_tokens_details/cached_tokens");
            if let Some(v) = cached.and_then(Value::as_u64) {
                m.cached_tokens = Some(v);
            }
        }
    }
}

/// A choice carrying generated text: `delta.content` (chat) or `text` (completions), non-empty.
fn has_text(choice: &Value) -> bool {
    let non_empty = |v: Option<&Value>| v.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    non_empty(choice.pointer("/delta/content")) || non_empty(choice.get("text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chat stream as the kvroute simulator (vLLM-style) sends it: a role-only first chunk,
    /// three tokens (one with multi-byte UTF-8), a finish chunk, the usage chunk, `[DONE]`.
    const CHAT: &str = concat!(
        r#"data: {"id":"cmpl-1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"cmpl-1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"cmpl-1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":" café"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"cmpl-1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":" 🚀"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"cmpl-1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length"}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"cmpl-1","object":"chat.completion.chunk","created":0,"model":"m","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":3,"total_tokens":123,"prompt_tokens_details":{"cached_tokens":64}}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );

    /// A text-completions stream with `\r\n` line ends, a keep-alive comment and an `event:`
    /// field; no usage.
    const COMPLETIONS_CRLF: &str = concat!(
        ": keep-alive\r\n\r\n",
        "event: message\r\n",
        r#"data: {"id":"cmpl-2","object":"text_completion","created":0,"model":"m","choices":[{"index":0,"text":" river","logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\r\n\r\n",
        r#"data: {"id":"cmpl-2","object":"text_completion","created":0,"model":"m","choices":[{"index":0,"text":" bank","logprobs":null,"finish_reason":"length"}],"usage":null}"#,
        "\r\n\r\n",
        "data: [DONE]\r\n\r\n",
    );

    /// A request the engine rejected after the stream started (as the simulator sends it).
    const ERROR: &str = concat!(
        r#"data: {"error":{"message":"request needs 900 KV blocks, more than the cache holds","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn whole(stream: &[u8], at: Duration) -> StreamMetrics {
        let mut t = SseTimer::new();
        t.push(stream, at);
        t.finish(at)
    }

    #[test]
    fn recorded_chat_stream() {
        let m = whole(CHAT.as_bytes(), ms(5));
        assert_eq!(m.token_times, vec![ms(5); 3], "the role-only and finish chunks are no tokens");
        assert_eq!(m.ttft, Some(ms(5)));
        assert_eq!(m.prompt_tokens, Some(120));
        assert_eq!(m.completion_tokens, Some(3));
        assert_eq!(m.cached_tokens, Some(64));
        assert!(m.done);
        assert!(!m.malformed);
        assert_eq!(m.error, None);
        assert_eq!(m.end, ms(5));
    }

    #[test]
    fn every_two_way_split_gives_the_same_metrics() {
        for stream in [CHAT, COMPLETIONS_CRLF, ERROR] {
            let bytes = stream.as_bytes();
            let reference = whole(bytes, ms(1));
            for cut in 0..=bytes.len() {
                let (a, b) = bytes.split_at(cut);
                let mut t = SseTimer::new();
                t.push(a, ms(1));
                t.push(b, ms(2));
                let m = t.finish(ms(3));
                assert_eq!(m.token_times.len(), reference.token_times.len(), "cut at {cut}");
                assert_eq!(m.prompt_tokens, reference.prompt_tokens, "cut at {cut}");
                assert_eq!(m.completion_tokens, reference.completion_tokens, "cut at {cut}");
                assert_eq!(m.cached_tokens, reference.cached_tokens, "cut at {cut}");
                assert_eq!(m.done, reference.done, "cut at {cut}");
                assert_eq!(m.error, reference.error, "cut at {cut}");
                assert!(!m.malformed, "cut at {cut}");
                // Tokens whose event the first part completed carry its time; the rest, the
                // second's.
                let first_only = whole(a, ms(1)).token_times.len();
                let stamped_early = m.token_times.iter().filter(|t| **t == ms(1)).count();
                assert_eq!(stamped_early, first_only, "cut at {cut}");
            }
        }
    }

    #[test]
    fn byte_by_byte_pushes() {
        let mut t = SseTimer::new();
        for (i, b) in CHAT.as_bytes().iter().enumerate() {
            t.push(std::slice::from_ref(b), Duration::from_micros(i as u64));
        }
        let m = t.finish(ms(100));
        assert_eq!(m.token_times.len(), 3);
        assert_eq!(m.cached_tokens, Some(64));
        assert!(m.done && !m.malformed);
    }

    /// The recorded chat stream cut into its events, each arriving at its own time.
    fn timed_chat(times: &[u64]) -> StreamMetrics {
        let events: Vec<&str> = CHAT.split_inclusive("\n\n").collect();
        assert_eq!(events.len(), times.len());
        let mut t = SseTimer::new();
        for (event, at) in events.iter().zip(times) {
            t.push(event.as_bytes(), ms(*at));
        }
        t.finish(ms(times.last().copied().unwrap_or(0) + 1))
    }

    #[test]
    fn gaps_and_stalls_from_arrival_times() {
        // role, the, café, 🚀, finish, usage, [DONE]
        let m = timed_chat(&[10, 40, 60, 310, 311, 312, 313]);
        assert_eq!(m.ttft, Some(ms(40)));
        assert_eq!(m.token_times, vec![ms(40), ms(60), ms(310)]);
        assert_eq!(m.gaps, vec![ms(20), ms(250)]);
        assert_eq!(m.max_gap, ms(250));
        assert_eq!(m.mean_gap(), Some(ms(135)));
        assert_eq!(m.stalls(ms(200)), 1);
        assert_eq!(m.stalls(ms(250)), 0, "only gaps strictly longer stall");
        assert_eq!(m.stalls(ms(10)), 2);
        assert_eq!(m.end, ms(314));
    }

    #[test]
    fn crlf_stream_with_comments_and_fields() {
        let m = whole(COMPLETIONS_CRLF.as_bytes(), ms(7));
        assert_eq!(m.token_times.len(), 2);
        assert_eq!(m.prompt_tokens, None);
        assert!(m.done && !m.malformed);
        // The same stream with bare `\r` line ends.
        let cr = COMPLETIONS_CRLF.replace("\r\n", "\r");
        let m = whole(cr.as_bytes(), ms(7));
        assert_eq!(m.token_times.len(), 2);
        assert!(m.done && !m.malformed);
    }

    #[test]
    fn error_object_in_stream() {
        let m = whole(ERROR.as_bytes(), ms(3));
        let msg = m.error.as_deref().unwrap_or_default();
        assert!(msg.contains("KV blocks"), "{msg}");
        assert!(m.token_times.is_empty());
        assert_eq!(m.ttft, None);
        assert!(m.done);
    }

    #[test]
    fn oversize_line_is_dropped_and_flagged() {
        let mut t = SseTimer::new();
        t.push(b"data: {\"choices\":[{\"text\":\"", ms(1));
        let filler = vec![b'a'; 64 * 1024];
        for _ in 0..20 {
            t.push(&filler, ms(2));
        }
        assert!(t.line.len() <= MAX_LINE_BYTES);
        t.push(b"\"}]}\n\n", ms(3));
        // The stream goes on normally afterwards.
        t.push(CHAT.as_bytes(), ms(4));
        let m = t.finish(ms(5));
        assert!(m.malformed);
        assert_eq!(m.token_times, vec![ms(4); 3], "the oversize event is not a token");
        assert!(m.done);
    }

    #[test]
    fn empty_and_truncated_streams() {
        let m = whole(b"", ms(9));
        assert_eq!(m.ttft, None);
        assert!(m.token_times.is_empty() && m.gaps.is_empty());
        assert_eq!(m.max_gap, Duration::ZERO);
        assert_eq!(m.mean_gap(), None);
        assert!(!m.done && !m.malformed);
        assert_eq!(m.end, ms(9));

        // Cut inside the second token's event: one token, not done, flagged.
        let cut = CHAT.match_indices("\n\n").nth(1).map_or(0, |(i, _)| i) + 30;
        let m = whole(&CHAT.as_bytes()[..cut], ms(1));
        assert_eq!(m.token_times.len(), 1);
        assert!(!m.done && m.malformed);
    }

    #[test]
    fn invalid_json_is_flagged() {
        let m = whole(b"data: {not json\n\ndata: [DONE]\n\n", ms(1));
        assert!(m.malformed && m.done);
        assert!(m.token_times.is_empty());
    }
}
