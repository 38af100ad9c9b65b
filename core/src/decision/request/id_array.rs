//! A JSON array of token ids in its usual form, read by hand: `[`, then unsigned integers of
//! at most ten digits without a leading zero and no larger than a `u32`, separated by commas,
//! with JSON whitespace anywhere between, then `]`. Anything else (a sign, a fraction, an
//! exponent, a leading zero, a larger number, any other value, a cut) is not answered, and the
//! caller has `serde_json` read the array from its start.
//!
//! `serde_json` reads each such number as a `u64` and the prompt reader keeps it as a token id
//! (`completions`), so wherever this answers it gives what `serde_json` gives; it only skips
//! the visitor call and the `u64` overflow checks per number (`scan_bench` has the figures).

use super::scan::skip_ws;

/// The ids of the array at the start of `text` and the bytes it took, or `None` when the
/// array is not in the usual form (see the module doc).
pub(super) fn read(text: &[u8]) -> Option<(Vec<u32>, usize)> {
    if text.first() != Some(&b'[') {
        return None;
    }
    // A token id takes at least two bytes with its comma; grow past 64 Ki ids as needed.
    let mut ids = Vec::with_capacity((text.len() / 2).min(1 << 16));
    let mut at = skip_ws(text, 1);
    if text.get(at) == Some(&b']') {
        return Some((ids, at + 1));
    }
    loop {
        let (id, end) = read_id(text, at)?;
        ids.push(id);
        at = skip_ws(text, end);
        match text.get(at) {
            Some(b',') => at = skip_ws(text, at + 1),
            Some(b']') => return Some((ids, at + 1)),
            _ => return None,
        }
    }
}

/// The unsigned integer at `at` (at most ten digits, no leading zero, within a `u32`) and
/// the index after its last digit.
fn read_id(text: &[u8], at: usize) -> Option<(u32, usize)> {
    let first = digit(*text.get(at)?)?;
    let mut value = u64::from(first);
    let mut end = at + 1;
    while let Some(d) = text.get(end).and_then(|&b| digit(b)) {
        if end - at == 10 {
            return None;
        }
        value = value * 10 + u64::from(d);
        end += 1;
    }
    if first == 0 && end - at > 1 {
        return None;
    }
    Some((u32::try_from(value).ok()?, end))
}

fn digit(b: u8) -> Option<u8> {
    let d = b.wrapping_sub(b'0');
    (d < 10).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::read;

    fn ids(text: &str) -> Option<(Vec<u32>, usize)> {
        read(text.as_bytes())
    }

    #[test]
    fn the_usual_form_is_read_with_the_bytes_it_took() {
        assert_eq!(ids("[]"), Some((vec![], 2)));
        assert_eq!(ids("[ \t\n\r]"), Some((vec![], 6)));
        assert_eq!(ids("[0]"), Some((vec![0], 3)));
        assert_eq!(ids("[1,22, 333 ,\n4444]}"), Some((vec![1, 22, 333, 4444], 18)));
        assert_eq!(ids("[4294967295]"), Some((vec![u32::MAX], 12)));
        assert_eq!(ids("[ 7 ] , \"x\""), Some((vec![7], 5)));
    }

    #[test]
    fn anything_else_is_left_to_serde_json() {
        for text in [
            "",
            " [1]",
            "1",
            "[",
            "[1",
            "[1,",
            "[1,]",
            "[,1]",
            "[1 2]",
            "[-1]",
            "[+1]",
            "[01]",
            "[00]",
            "[1.0]",
            "[1e3]",
            "[1E3]",
            "[4294967296]",
            "[10000000000]",
            "[99999999999999999999]",
            "[\"1\"]",
            "[null]",
            "[[1]]",
            "[1\u{a0}]",
        ] {
            assert_eq!(ids(text), None, "{text:?}");
        }
    }

    #[test]
    fn what_it_reads_serde_json_reads_the_same() {
        for text in ["[]", "[0, 1, 4294967295]", "[ 12 ,\t3 ]", "[9,8,7,6,5,4,3,2,1,0]"] {
            let (got, len) = ids(text).unwrap();
            assert_eq!(len, text.len());
            assert_eq!(serde_json::from_str::<Vec<u32>>(text).unwrap(), got);
        }
    }
}
