//! Rate-limited log lines: a flood of the same kind of event (bad batches from one worker, a
//! connection that keeps failing) gives one line per interval and kind, with how many like it
//! were left out since the last line, instead of one line each.
//!
//! A [`RateLog`] belongs to one source (a worker's follower, the HTTP server) and keys its
//! intervals by a static kind. The first line of a kind is written at once; later ones within
//! the interval are counted; the first one after the interval is written with that count.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long one kind of line stays quiet after it was written, by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct Kind {
    /// When the last line of this kind was written.
    written: Instant,
    /// Lines of this kind left out since.
    left_out: u64,
}

/// One source's log rate limiter.
#[derive(Debug)]
pub struct RateLog {
    interval: Duration,
    kinds: HashMap<&'static str, Kind>,
}

impl Default for RateLog {
    fn default() -> Self {
        RateLog::new(DEFAULT_INTERVAL)
    }
}

impl RateLog {
    pub fn new(interval: Duration) -> RateLog {
        RateLog { interval, kinds: HashMap::new() }
    }

    /// Whether a line of `kind` is written at `now`: `Some(n)` with the `n` lines of that kind
    /// left out since the last one, `None` when this one is left out (and counted).
    pub fn admit_at(&mut self, kind: &'static str, now: Instant) -> Option<u64> {
        match self.kinds.get_mut(kind) {
            Some(k) if now.saturating_duration_since(k.written) < self.interval => {
                k.left_out += 1;
                None
            }
            Some(k) => {
                let n = std::mem::take(&mut k.left_out);
                k.written = now;
                Some(n)
            }
            None => {
                self.kinds.insert(kind, Kind { written: now, left_out: 0 });
                Some(0)
            }
        }
    }

    /// [`RateLog::admit_at`] now.
    pub fn admit(&mut self, kind: &'static str) -> Option<u64> {
        self.admit_at(kind, Instant::now())
    }

    /// `msg`, or `msg` with the count of lines left out before it, if a line of `kind` is
    /// written now.
    pub fn line(&mut self, kind: &'static str, msg: &str) -> Option<String> {
        self.admit(kind).map(|n| with_count(msg, n, self.interval))
    }
}

/// `msg` followed by how many lines like it were left out.
pub fn with_count(msg: &str, left_out: u64, interval: Duration) -> String {
    if left_out == 0 {
        msg.to_owned()
    } else {
        format!("{msg} (and {left_out} more like it, at most one line per {}s)", interval.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_kind_with_the_count() {
        let mut log = RateLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(log.admit_at("bad_batch", t0), Some(0));
        let written = (1..1000)
            .filter_map(|i| log.admit_at("bad_batch", t0 + Duration::from_millis(i * 5)))
            .count();
        assert_eq!(written, 0, "999 lines within 5 s");
        // Another kind has its own interval.
        assert_eq!(log.admit_at("lost", t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(log.admit_at("bad_batch", t0 + Duration::from_secs(10)), Some(999));
        assert_eq!(log.admit_at("bad_batch", t0 + Duration::from_secs(11)), None);
        assert_eq!(log.admit_at("bad_batch", t0 + Duration::from_secs(25)), Some(1));
    }

    #[test]
    fn a_flood_writes_lines_bounded_by_its_duration() {
        let mut log = RateLog::new(Duration::from_secs(1));
        let t0 = Instant::now();
        // 20 000 lines over 20 s: at most one per second.
        let written: Vec<u64> = (0..20_000u64)
            .filter_map(|i| log.admit_at("bad_batch", t0 + Duration::from_millis(i)))
            .collect();
        assert_eq!(written.len(), 20);
        // Every line written counts those left out before it; the last second's are still pending.
        assert_eq!(written.iter().sum::<u64>() + written.len() as u64, 20_000 - 999);
    }

    #[test]
    fn the_line_says_how_many_were_left_out() {
        assert_eq!(with_count("batch refused", 0, DEFAULT_INTERVAL), "batch refused");
        assert_eq!(
            with_count("batch refused", 7, DEFAULT_INTERVAL),
            "batch refused (and 7 more like it, at most one line per 10s)"
        );
    }
}
