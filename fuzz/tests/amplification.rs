//! Size amplification of the event decoder, measured: every byte the decoder allocates is
//! counted (a counting global allocator), and over the committed `event_decode` corpus plus
//! bomb shapes of up to 8 MiB, the peak live bytes of one decode stay under
//! [`kvroute_fuzz::MAX_AMPLIFICATION`] per input byte (plus a small constant), and under an
//! absolute bound whatever the input's size (the element cap times that factor: 256 MiB with
//! the default cap of 2 Mi elements). Bombs past the caps are refused before any allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use kvroute_fuzz::MAX_AMPLIFICATION;
use kvroute_updater::decode::{decode_batch, DEFAULT_MAX_ELEMENTS};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let live = LIVE.fetch_add(l.size(), SeqCst) + l.size();
            PEAK.fetch_max(live, SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), SeqCst);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                let live = LIVE.fetch_add(new - l.size(), SeqCst) + new - l.size();
                PEAK.fetch_max(live, SeqCst);
            } else {
                LIVE.fetch_sub(l.size() - new, SeqCst);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The tests of this file measure one at a time (the counters are process-wide).
static GATE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Peak bytes allocated above what was live before, while decoding `data`.
fn peak_of(data: &[u8]) -> usize {
    let base = LIVE.load(SeqCst);
    PEAK.store(base, SeqCst);
    let _ = std::hint::black_box(decode_batch(std::hint::black_box(data)));
    PEAK.load(SeqCst) - base
}

/// Slack for the decoder's fixed costs (error strings, the pre-pass's stack, small vectors).
const SLACK: usize = 16 << 10;

fn head() -> Vec<u8> {
    vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// `[ts, [x; n], nil]` with `x` the bytes of one element.
fn array_of(n: usize, x: &[u8]) -> Vec<u8> {
    let mut b = head();
    b.push(0xdd);
    b.extend_from_slice(&(n as u32).to_be_bytes());
    for _ in 0..n {
        b.extend_from_slice(x);
    }
    b.push(0xc0);
    b
}

/// Generated shapes: bombs past every cap, and the largest inputs that pass (the worst real
/// amplification: one-byte elements materialised as values).
fn generated() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for n in [1000, 100_000, DEFAULT_MAX_ELEMENTS - 8, 8 << 20] {
        out.push((format!("{n} nils"), array_of(n, &[0xc0])));
        out.push((format!("{n} fixints"), array_of(n, &[0x07])));
    }
    let mut nested = head();
    nested.push(0x91);
    for _ in 0..(4 << 20) {
        nested.extend([0x81, 0xc0]);
    }
    out.push(("4 Mi nested maps".into(), nested));
    let mut wide = head();
    wide.extend([0x91, 0xdf]);
    wide.extend_from_slice(&(4u32 << 20).to_be_bytes());
    wide.resize(wide.len() + (8 << 20), 0xc0);
    out.push(("a map of 4 Mi nil pairs".into(), wide));
    // A real store: one event of 256 blocks of 16 tokens, as vLLM sends it.
    let mut store = head();
    store.extend([0x91, 0x99, 0xab]);
    store.extend_from_slice(b"BlockStored");
    store.extend([0xdc, 0x01, 0x00]);
    for h in 0..256u64 {
        store.push(0xcf);
        store.extend_from_slice(&(h * 7919).to_be_bytes());
    }
    store.push(0xc0);
    store.extend([0xdc, 0x10, 0x00]);
    for t in 0..4096u32 {
        store.push(0xce);
        store.extend_from_slice(&(t * 31).to_be_bytes());
    }
    store.extend([0x10, 0xc0, 0xa3]);
    store.extend_from_slice(b"GPU");
    store.extend([0xc0, 0xc0, 0xc0]);
    assert_eq!(decode_batch(&store).map(|b| b.events.len()), Ok(1));
    out.push(("a 256-block store".into(), store));
    out
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/event_decode");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect()
}

#[test]
fn decoding_allocates_at_most_max_amplification_bytes_per_input_byte() {
    let _one = GATE.lock().unwrap_or_else(|e| e.into_inner());
    // The absolute bound, whatever the input: the element cap times the per-byte bound (every
    // element is at least one byte).
    let absolute = DEFAULT_MAX_ELEMENTS * MAX_AMPLIFICATION + SLACK;
    let mut worst = 0f64;
    for (name, data) in corpus().into_iter().chain(generated()) {
        let peak = peak_of(&data);
        let factor = peak as f64 / data.len() as f64;
        worst = worst.max(factor);
        eprintln!("{name}: {} bytes in, {peak} bytes peak ({factor:.2} per byte)", data.len());
        assert!(
            peak <= MAX_AMPLIFICATION * data.len() + SLACK,
            "{name}: {peak} bytes allocated for {} input bytes",
            data.len()
        );
        assert!(peak <= absolute, "{name}: {peak} bytes, over the element cap's {absolute}");
    }
    eprintln!("worst: {worst:.2} bytes allocated per input byte (bound {MAX_AMPLIFICATION})");
}

#[test]
fn bombs_past_the_caps_allocate_next_to_nothing() {
    let _one = GATE.lock().unwrap_or_else(|e| e.into_inner());
    for n in [DEFAULT_MAX_ELEMENTS + 1, 8 << 20] {
        let peak = peak_of(&array_of(n, &[0xc0]));
        assert!(peak <= SLACK, "{n} nils: {peak} bytes allocated before refusal");
    }
    let mut declared = head();
    declared.extend([0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0]);
    assert!(peak_of(&declared) <= SLACK);
}
