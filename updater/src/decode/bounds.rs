//! A structural pre-pass over a msgpack payload, run before anything is allocated for it.
//!
//! Reading a value with `rmpv` materialises every element (a `Value` of tens of bytes each) and
//! sizes each container from the length its header declares. A payload that declares far more
//! than its bytes hold (an array header of 2^32 - 1 elements), or that really holds tens of
//! millions of 1-byte elements (60 MiB of nils), would make the updater allocate gigabytes.
//! This pass walks the markers with `rmp` and refuses a payload, before decoding, when
//!
//! - a container declares more elements than the bytes left can hold (every msgpack element is
//!   at least one byte), or a string, binary or extension more bytes than are left;
//! - it holds more elements, in all, than the cap;
//! - containers nest deeper than the cap.
//!
//! What passes bounds the decoder's allocation ([`PayloadShape::decoded_bytes_bound`]): at most
//! `elements` values of `size_of::<rmpv::Value>()` bytes and as many events, plus `data_bytes`
//! of strings and binaries, and `elements <= payload.len()` always. Measured, the worst input
//! (a batch of nils) costs under 128 bytes per input byte (`fuzz/tests/amplification.rs`).

use rmp::Marker;
use thiserror::Error;

/// Caps on one payload's structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Most msgpack elements (every scalar, container, map key and map value counts one).
    pub max_elements: usize,
    /// Most containers nested inside each other.
    pub max_depth: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { max_elements: DEFAULT_MAX_ELEMENTS, max_depth: DEFAULT_MAX_DEPTH }
    }
}

/// Elements one batch may hold by default. A vLLM step stores at most its batched tokens (8 k
/// to 128 k) plus a hash per block; SGLang with pages of one token sends ~12 elements per token.
/// Decoded, a batch at this cap costs at most ~190 MiB (measured: 88 bytes per element).
pub const DEFAULT_MAX_ELEMENTS: usize = 1 << 21;
/// Nesting a batch needs: batch, events, event, extra keys, one block's keys, a key tuple.
pub const DEFAULT_MAX_DEPTH: usize = 24;

/// What a payload that passed holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PayloadShape {
    /// Msgpack elements, all levels together.
    pub elements: usize,
    /// Bytes of strings, binaries and extensions.
    pub data_bytes: usize,
    /// Deepest container nesting.
    pub depth: usize,
}

impl PayloadShape {
    /// What decoding this payload may allocate, in bytes: a value and an event per element
    /// (an upper bound: most elements are not events), and the strings and binaries.
    pub fn decoded_bytes_bound(&self) -> usize {
        let per_element =
            std::mem::size_of::<rmpv::Value>() + std::mem::size_of::<super::EngineEvent>();
        self.elements.saturating_mul(per_element).saturating_add(self.data_bytes)
    }
}

/// Why a payload was refused before decoding.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BoundError {
    #[error("byte {at} declares {declared} {what}, only {left} bytes follow")]
    Declared { what: &'static str, declared: u64, left: usize, at: usize },
    #[error("more than {0} msgpack elements")]
    Elements(usize),
    #[error("containers nested deeper than {0}")]
    Depth(usize),
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("reserved marker 0xc1 at byte {0}")]
    Reserved(usize),
}

/// Reads a big-endian length of `n` bytes at `*pos`.
fn length(buf: &[u8], pos: &mut usize, n: usize) -> Result<u64, BoundError> {
    let bytes = buf.get(*pos..*pos + n).ok_or(BoundError::Truncated(*pos))?;
    *pos += n;
    Ok(bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
}

/// What one marker is followed by: bytes to skip and elements it contains.
fn extent(m: Marker, buf: &[u8], pos: &mut usize, at: usize) -> Result<(u64, u64), BoundError> {
    use Marker as M;
    Ok(match m {
        M::FixPos(_) | M::FixNeg(_) | M::Null | M::True | M::False => (0, 0),
        M::U8 | M::I8 => (1, 0),
        M::U16 | M::I16 => (2, 0),
        M::U32 | M::I32 | M::F32 => (4, 0),
        M::U64 | M::I64 | M::F64 => (8, 0),
        M::FixStr(n) => (u64::from(n), 0),
        M::Str8 | M::Bin8 => (length(buf, pos, 1)?, 0),
        M::Str16 | M::Bin16 => (length(buf, pos, 2)?, 0),
        M::Str32 | M::Bin32 => (length(buf, pos, 4)?, 0),
        M::FixExt1 => (2, 0),
        M::FixExt2 => (3, 0),
        M::FixExt4 => (5, 0),
        M::FixExt8 => (9, 0),
        M::FixExt16 => (17, 0),
        M::Ext8 => (length(buf, pos, 1)? + 1, 0),
        M::Ext16 => (length(buf, pos, 2)? + 1, 0),
        M::Ext32 => (length(buf, pos, 4)? + 1, 0),
        M::FixArray(n) => (0, u64::from(n)),
        M::Array16 => (0, length(buf, pos, 2)?),
        M::Array32 => (0, length(buf, pos, 4)?),
        M::FixMap(n) => (0, 2 * u64::from(n)),
        M::Map16 => (0, 2 * length(buf, pos, 2)?),
        M::Map32 => (0, 2 * length(buf, pos, 4)?),
        M::Reserved => return Err(BoundError::Reserved(at)),
    })
}

/// Strings, binaries and extensions: what `rmpv` copies into a buffer of its own.
fn carries_data(m: Marker) -> bool {
    use Marker as M;
    matches!(
        m,
        M::FixStr(_)
            | M::Str8
            | M::Str16
            | M::Str32
            | M::Bin8
            | M::Bin16
            | M::Bin32
            | M::FixExt1
            | M::FixExt2
            | M::FixExt4
            | M::FixExt8
            | M::FixExt16
            | M::Ext8
            | M::Ext16
            | M::Ext32
    )
}

/// Walks the first msgpack value of `buf` without materialising it; refuses it when its
/// declared sizes exceed what its bytes can hold or `bounds`.
pub fn check(buf: &[u8], bounds: &Bounds) -> Result<PayloadShape, BoundError> {
    // Elements still to read in each open container, innermost last (at most max_depth).
    let mut open: Vec<u64> = Vec::new();
    let mut shape = PayloadShape::default();
    let mut pos = 0usize;
    loop {
        let at = pos;
        let m = Marker::from_u8(*buf.get(pos).ok_or(BoundError::Truncated(pos))?);
        pos += 1;
        shape.elements += 1;
        if shape.elements > bounds.max_elements {
            return Err(BoundError::Elements(bounds.max_elements));
        }
        let (skip, items) = extent(m, buf, &mut pos, at)?;
        let left = buf.len() - pos;
        if skip > left as u64 {
            return Err(BoundError::Declared { what: "bytes", declared: skip, left, at });
        }
        pos += skip as usize;
        if carries_data(m) {
            shape.data_bytes += skip as usize;
        }
        if items > 0 {
            if items > left as u64 {
                return Err(BoundError::Declared { what: "elements", declared: items, left, at });
            }
            if shape.elements as u64 + items > bounds.max_elements as u64 {
                return Err(BoundError::Elements(bounds.max_elements));
            }
            if open.len() >= bounds.max_depth {
                return Err(BoundError::Depth(bounds.max_depth));
            }
            open.push(items);
            shape.depth = shape.depth.max(open.len());
            continue;
        }
        // A complete value: close every container it completes.
        loop {
            match open.last_mut() {
                None => return Ok(shape),
                Some(n) if *n > 1 => {
                    *n -= 1;
                    break;
                }
                Some(_) => {
                    open.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn enc(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    #[test]
    fn every_shape_rmpv_writes_is_measured_exactly() {
        let v = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Map(vec![("type".into(), "BlockStored".into()), (1.into(), Value::Nil)]),
                Value::Binary(vec![7; 300]),
                Value::Ext(3, vec![1, 2, 3]),
                Value::Ext(4, vec![1]),
                Value::Array(vec![]),
                Value::from(-70_000),
                Value::from(u64::MAX),
            ]),
            "x".repeat(70_000).into(),
        ]);
        let bytes = enc(&v);
        let s = check(&bytes, &Bounds::default()).unwrap();
        assert_eq!(s.elements, 15);
        assert_eq!(s.depth, 3);
        assert_eq!(s.data_bytes, 4 + 11 + 300 + 4 + 2 + 70_000);
        assert!(s.elements <= bytes.len());
        assert_eq!(rmpv::decode::read_value(&mut &bytes[..]).unwrap(), v);
    }

    #[test]
    fn declared_sizes_beyond_the_bytes_are_refused() {
        // array32 of 2^32 - 1 elements with 3 bytes behind it
        let r = check(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0, 0xc0, 0xc0], &Bounds::default());
        assert!(matches!(r, Err(BoundError::Declared { what: "elements", left: 3, .. })), "{r:?}");
        // map16 of 4 entries (8 elements) with 7 bytes
        let r = check(&[0xde, 0, 4, 1, 2, 3, 4, 5, 6, 7], &Bounds::default());
        assert!(matches!(r, Err(BoundError::Declared { declared: 8, .. })), "{r:?}");
        // str32 and bin32 of 4 GiB
        for m in [0xdb, 0xc6] {
            let r = check(&[m, 0xff, 0xff, 0xff, 0xff, b'a'], &Bounds::default());
            assert!(matches!(r, Err(BoundError::Declared { what: "bytes", .. })), "{r:?}");
        }
        assert_eq!(
            check(&[0x92, 0xc0], &Bounds::default()),
            Err(BoundError::Declared { what: "elements", declared: 2, left: 1, at: 0 })
        );
        assert_eq!(check(&[0xdc, 0], &Bounds::default()), Err(BoundError::Truncated(1)));
        assert_eq!(check(&[0x91, 0xc1], &Bounds::default()), Err(BoundError::Reserved(1)));
        assert_eq!(check(&[], &Bounds::default()), Err(BoundError::Truncated(0)));
    }

    #[test]
    fn element_and_depth_caps() {
        let bounds = Bounds { max_elements: 100, max_depth: 4 };
        let nils = |n: usize| {
            let mut b = vec![0xdd];
            b.extend_from_slice(&(n as u32).to_be_bytes());
            b.extend(std::iter::repeat_n(0xc0, n));
            b
        };
        assert_eq!(check(&nils(99), &bounds).map(|s| s.elements), Ok(100));
        // refused at the header, before a single nil is walked
        assert_eq!(check(&nils(100), &bounds), Err(BoundError::Elements(100)));
        let mut deep = vec![0x91; 4];
        deep.push(0xc0);
        assert_eq!(check(&deep, &bounds).map(|s| s.depth), Ok(4));
        let mut deeper = vec![0x91; 5];
        deeper.push(0xc0);
        assert_eq!(check(&deeper, &bounds), Err(BoundError::Depth(4)));
        // Many small maps: keys and values both count.
        let maps = Value::Array((0..20).map(|i| Value::Map(vec![(i.into(), i.into())])).collect());
        assert_eq!(check(&enc(&maps), &bounds).map(|s| s.elements), Ok(61));
    }

    #[test]
    fn only_the_first_value_is_walked() {
        assert_eq!(check(&[0x90, 0xdd, 0xff], &Bounds::default()).map(|s| s.elements), Ok(1));
    }
}
