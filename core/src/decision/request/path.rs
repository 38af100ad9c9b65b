//! Request paths as vLLM's HTTP server reads them, so that kvroute recognises every path vLLM
//! serves as one of its endpoints. vLLM runs FastAPI on uvicorn (with httptools): the request
//! target ends its path at the first `?` (query) or `#` (fragment); uvicorn percent-decodes
//! the path with Python's `urllib.parse.unquote` (every `%XX` with two hex digits, `%2F`
//! included, decoded once; a malformed escape kept as written; bytes that are not UTF-8 become
//! U+FFFD); Starlette then matches the decoded path exactly (no slash merging, no `.`/`..`
//! resolution, case-sensitive), and answers a path that matches only without its trailing
//! slashes with a redirect there (`redirect_slashes`), which a client follows.

/// The path a request target names, as uvicorn hands it to Starlette: without its query or
/// fragment, percent-decoded once. Bytes, not text: a decoded byte sequence that is not UTF-8
/// (which Python would turn into U+FFFD) matches no route either way.
pub fn server_path(target: &[u8]) -> Vec<u8> {
    let end = target.iter().position(|b| matches!(b, b'?' | b'#')).unwrap_or(target.len());
    percent_decode(&target[..end])
}

/// `unquote` on bytes: `%` and two hex digits is the byte they spell; anything else as is.
fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            if let (Some(hi), Some(lo)) =
                (raw.get(i + 1).and_then(hex), raw.get(i + 2).and_then(hex))
            {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    out
}

fn hex(b: &u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The route a decoded path reaches: itself, or itself without trailing slashes (Starlette's
/// redirect, followed by the client). The root stays `/`.
pub fn route_path(decoded: &[u8]) -> &[u8] {
    let mut end = decoded.len();
    while end > 1 && decoded[end - 1] == b'/' {
        end -= 1;
    }
    &decoded[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_decode_as_uvicorn_decodes_them() {
        let rows: &[(&[u8], &[u8])] = &[
            (b"/v1/chat/completions", b"/v1/chat/completions"),
            (b"/v1/chat/%63ompletions", b"/v1/chat/completions"),
            (b"/v1/chat/%63OMPLETIONS", b"/v1/chat/cOMPLETIONS"),
            (b"/%76%31/%63%68%61%74/completions", b"/v1/chat/completions"),
            (b"/v1%2Fchat%2fcompletions", b"/v1/chat/completions"),
            (b"/v1/completions?x=%2F", b"/v1/completions"),
            (b"/v1/completions#frag", b"/v1/completions"),
            (b"/v1/completions%3Fx", b"/v1/completions?x"),
            (b"/v1/completions%23", b"/v1/completions#"),
            // Decoded once: `%2563` is `%63`, not `c`.
            (b"/v1/chat/%2563ompletions", b"/v1/chat/%63ompletions"),
            // Malformed escapes are kept.
            (b"/v1/%zzchat", b"/v1/%zzchat"),
            (b"/v1/chat%", b"/v1/chat%"),
            (b"/v1/chat%6", b"/v1/chat%6"),
            (b"/a%00b", b"/a\0b"),
            (b"/a%ffb", b"/a\xffb"),
            (b"", b""),
        ];
        for (target, want) in rows {
            assert_eq!(server_path(target), *want, "{}", String::from_utf8_lossy(target));
        }
    }

    #[test]
    fn trailing_slashes_reach_the_route_the_redirect_names() {
        assert_eq!(route_path(b"/v1/messages///"), b"/v1/messages");
        assert_eq!(route_path(b"/v1/messages"), b"/v1/messages");
        assert_eq!(route_path(b"/"), b"/");
        assert_eq!(route_path(b"///"), b"/");
        assert_eq!(route_path(b""), b"");
    }
}
