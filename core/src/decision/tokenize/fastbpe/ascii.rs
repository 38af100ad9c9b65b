//! The known pre-tokenization patterns (GPT-2's, Qwen2's, Llama 3's) on ASCII text, without a
//! regex engine: one pass over the bytes that takes, at each position, the alternative the
//! pattern's leftmost-first alternation takes there.
//!
//! On ASCII the classes are bytes: `\p{L}` is `[A-Za-z]`, `\p{N}` is `[0-9]`, `\s` is
//! `[\t\n\x0B\x0C\r ]` (Unicode's White_Space below 0x80), and `(?i)` folds ASCII letters only.
//! Inside Envoy a regex search per piece was most of the tokenizer's time (a search call's
//! setup for each of a prompt's thousands of pieces); this is a few comparisons per byte. The
//! property tests `ascii_splitters_equal_fancy_regex` and `known_splitters_equal_fancy_regex`
//! check the pieces against `fancy-regex` running the very pattern. In text with other bytes,
//! a piece whose reading met one is found by the regex engine instead (`known_bounds`).

/// Which known pattern (see `GPT2_PATTERN`, `QWEN2_PATTERN`, `LLAMA3_PATTERN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
    /// \s*[\r\n]+|\s+(?!\S)|\s+`
    Qwen2,
    /// As Qwen2, with `\p{N}{1,3}` for `\p{N}`.
    Llama3,
}

fn space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

fn newline(b: u8) -> bool {
    matches!(b, b'\r' | b'\n')
}

/// `[^\s\p{L}\p{N}]`
fn other(b: u8) -> bool {
    !space(b) && !b.is_ascii_alphanumeric()
}

/// The end of the run of bytes from `at` that satisfy `f`.
fn run(s: &[u8], at: usize, f: impl Fn(u8) -> bool) -> usize {
    s[at.min(s.len())..].iter().position(|&b| !f(b)).map_or(s.len(), |n| at + n)
}

impl Known {
    /// Pushes the end of each piece of `s`, which must be ASCII, to `bounds` (cleared first).
    pub(super) fn bounds(self, s: &[u8], bounds: &mut Vec<usize>) {
        bounds.clear();
        let mut pos = 0;
        while pos < s.len() {
            pos = self.piece(s, pos).0;
            bounds.push(pos);
        }
    }

    /// The piece of `s` that starts at `pos` (`pos < s.len()`): its end, and the end of the
    /// bytes read to find it. The piece is the pattern's when those bytes are ASCII (a match
    /// depends on nothing before `pos`); other bytes count as neither letter, digit nor space,
    /// so the caller must check them.
    pub(super) fn piece(self, s: &[u8], pos: usize) -> (usize, usize) {
        let (end, read) = self.piece_end(s, pos);
        // Every alternative consumes at least one byte; `max` keeps a caller's loop finite.
        let end = end.max(pos + 1).min(s.len());
        // The contraction check reads up to two bytes past `pos`.
        (end, read.max(end).max(pos + 3).min(s.len()))
    }

    /// The piece's end and the end of the last run read (its first byte outside the run
    /// included).
    fn piece_end(self, s: &[u8], pos: usize) -> (usize, usize) {
        if let Some(end) = self.contraction(s, pos) {
            return (end, end);
        }
        let c = s[pos];
        let next = s.get(pos + 1).copied();
        let after_space = c == b' ' && next.is_some();
        let n = |f: fn(u8) -> bool| next.is_some_and(f);
        let ran = |end: usize| (end, end + 1);
        match self {
            Known::Gpt2 => {
                // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the space only with a class
                // byte after it.
                for class in [u8::is_ascii_alphabetic as fn(&u8) -> bool, u8::is_ascii_digit] {
                    if after_space && next.as_ref().is_some_and(class) {
                        return ran(run(s, pos + 1, |b| class(&b)));
                    }
                    if class(&c) {
                        return ran(run(s, pos, |b| class(&b)));
                    }
                }
                if after_space && n(other) {
                    return ran(run(s, pos + 1, other));
                }
                if other(c) {
                    return ran(run(s, pos, other));
                }
            }
            Known::Qwen2 | Known::Llama3 => {
                // `[^\r\n\p{L}\p{N}]?\p{L}+`
                if !newline(c) && !c.is_ascii_alphanumeric() && n(|b| b.is_ascii_alphabetic()) {
                    return ran(run(s, pos + 1, |b| b.is_ascii_alphabetic()));
                }
                if c.is_ascii_alphabetic() {
                    return ran(run(s, pos, |b| b.is_ascii_alphabetic()));
                }
                // `\p{N}` or `\p{N}{1,3}`
                if c.is_ascii_digit() {
                    let most = if self == Known::Llama3 { 3 } else { 1 };
                    return ran(run(s, pos, |b| b.is_ascii_digit()).min(pos + most));
                }
                // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
                let start = if after_space && n(other) { pos + 1 } else { pos };
                if other(s[start]) {
                    return ran(run(s, run(s, start, other), newline));
                }
                // `\s*[\r\n]+`: the whitespace run up to its last line break.
                let end = run(s, pos, space);
                if let Some(last) = s[pos..end].iter().rposition(|&b| newline(b)) {
                    return (pos + last + 1, end + 1);
                }
            }
        }
        // `\s+(?!\S)|\s+`: the whitespace run, less its last byte when more follows and the
        // run has two bytes or more.
        let end = run(s, pos, space);
        let piece = if end < s.len() && end - pos >= 2 { end - 1 } else { end };
        (piece, end + 1)
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-insensitive but for GPT-2).
    fn contraction(self, s: &[u8], pos: usize) -> Option<usize> {
        let fold = |b: u8| if self == Known::Gpt2 { b } else { b.to_ascii_lowercase() };
        let (&quote, rest) = s[pos..].split_first()?;
        if quote != b'\'' {
            return None;
        }
        let second = fold(*rest.first()?);
        let third = rest.get(1).copied().map(fold);
        match (second, third) {
            (b's' | b't' | b'm' | b'd', _) => Some(pos + 2),
            (b'r' | b'v', Some(b'e')) | (b'l', Some(b'l')) => Some(pos + 3),
            _ => None,
        }
    }
}
