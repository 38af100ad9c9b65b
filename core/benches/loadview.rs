//! The load view's read, natively: what a filter thread does at each decision to see every
//! thread's requests in flight (each thread's shard, and its table of prefill ends). Each
//! shape runs twice in alternation for each of two comparisons, so that the two runs of one
//! kind give the noise floor: the tables of prefill ends empty (every first byte recorded as no
//! prefill end) against full (every first byte a first token), and, with the tables full, the
//! workers' arrival rates not counted (`load.arrival_window_ms` 0) against counted (the
//! default).
//! Run: `cargo bench -p kvroute-core --bench loadview`.

use kvroute_core::decision::config::sync::LoadLimits;
use kvroute_core::shared::fake::{MemStore, Tally};
use kvroute_core::shared::load::{LoadView, Shard};

#[path = "common/timing.rs"]
#[allow(dead_code)]
mod timing;

/// `threads` shards over `workers` workers: each thread has one request answered and one
/// still in prefill on every `spread`-th worker (offset by the thread); the reader is one of
/// them.
/// `window`: whether the arrival rates are counted (the default window, else 0).
fn store(
    threads: u32,
    workers: usize,
    spread: usize,
    ends: bool,
    window: bool,
) -> (MemStore, Shard) {
    let (store, t) = (MemStore::new(), Tally::default());
    let mut limits = LoadLimits { max_inflight_per_thread: 100_000, ..LoadLimits::default() };
    if !window {
        limits.arrival_window_ms = 0;
    }
    let names: Vec<String> =
        (0..workers).map(|i| format!("10.0.{}.{}:8000", i / 256, i % 256)).collect();
    let mut shards: Vec<Shard> =
        (0..threads).map(|i| Shard::register(&store, &t, limits, 0, u64::from(i))).collect();
    for (k, s) in shards.iter_mut().enumerate() {
        for w in names.iter().skip(k % spread).step_by(spread) {
            let answered = s.start(&t, w, 2000, 1000);
            if ends {
                s.prefill_ended(answered, 1500);
            } else {
                s.first_byte(answered);
            }
            s.start(&t, w, 2000, 1600);
        }
        s.flush(&store, &t, 2000);
    }
    let own = shards.pop().expect("at least one thread");
    (store, own)
}

/// The view read's p50 (µs) over two runs of each of `make(false)` and `make(true)`,
/// alternated: `(without, with)`.
fn alternate(make: impl Fn(bool) -> (MemStore, Shard)) -> ([f64; 2], [f64; 2]) {
    let counters = Tally::default();
    let mut p50 = [Vec::new(), Vec::new()];
    for run in 0..4 {
        let on = run % 2 == 1;
        let (s, own) = make(on);
        let t = timing::time(|| {
            std::hint::black_box(LoadView::read(&s, &counters, &own, 2000));
        });
        p50[usize::from(on)].push(timing::q(&t, 0.5));
    }
    ([p50[0][0], p50[0][1]], [p50[1][0], p50[1][1]])
}

/// One comparison's line: both runs of each kind, with / without, and the noise floor.
fn line(what: &str, (a, b): ([f64; 2], [f64; 2])) -> String {
    let floor = (a[1] / a[0]).max(a[0] / a[1]) - 1.0;
    format!(
        "view read p50 {:.1} / {:.1} µs without {what}, {:.1} / {:.1} µs with; with / without {:.2}× (floor ±{:.0} %)",
        a[0],
        a[1],
        b[0],
        b[1],
        (b[0] + b[1]) / (a[0] + a[1]),
        floor * 100.0
    )
}

fn main() {
    for (threads, workers, spread) in [(2, 64, 1), (8, 256, 2), (32, 1024, 4)] {
        let ends = alternate(|on| store(threads, workers, spread, on, true));
        let rates = alternate(|on| store(threads, workers, spread, true, on));
        println!("{threads} threads, {workers} workers:");
        println!("  {}", line("prefill ends", ends));
        println!("  {}", line("arrival rates", rates));
    }
}
