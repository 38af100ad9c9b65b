//! Waking the filter threads when the singleton publishes new knowledge, so that they apply it
//! then, off the request path, rather than on their next request or tick.
//!
//! Each thread registers a proxy-wasm shared queue named after its load shard
//! ([`queue_name`]); the singleton, after it publishes a snapshot or delta, enqueues an empty
//! message to the queue of every shard the load registry lists, and Envoy calls the thread's
//! `on_queue_ready` on its own thread. A message carries nothing: the knowledge itself stays in
//! shared data, where the thread's catch-up reads it (bounded as on a request). [`WakePace`]
//! keeps the singleton to at most one wake per [`WAKE_GAP_MS`]; a publish inside the gap is
//! carried to the next publish or tick.

/// What a wake message holds (a message, not its bytes, is the signal; an empty one would
/// read back as no message).
pub const MESSAGE: &[u8] = b"w";

/// The least time (ms) between two wakes of the threads.
pub const WAKE_GAP_MS: u64 = 2;

/// Knowledge published less than this long ago (ms, by the head's `checked_at_ms`) is being
/// woken for: the singleton writes the head, then sends the wakes. A request that finds such
/// deltas waiting leaves them to that wake.
pub const JUST_PUBLISHED_MS: u64 = 2;

/// Whether knowledge confirmed at `checked_at_ms` was published less than
/// [`JUST_PUBLISHED_MS`] before `now_ms` (a clock behind the singleton's counts as just).
pub fn just_published(checked_at_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(checked_at_ms) < JUST_PUBLISHED_MS
}

/// The shared queue of the thread whose load shard is `shard`.
pub fn queue_name(shard: u32) -> String {
    format!("kvroute.wake.{shard}")
}

/// When the singleton wakes the threads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WakePace {
    last_ms: Option<u64>,
    pending: bool,
}

impl WakePace {
    /// Knowledge was published at `now_ms`: whether to wake the threads now (otherwise the
    /// wake waits for the next publish or [`WakePace::tick`]).
    pub fn published(&mut self, now_ms: u64) -> bool {
        self.pending = true;
        self.due(now_ms)
    }

    /// The singleton's tick at `now_ms`: whether a wake held back by the gap is due now.
    pub fn tick(&mut self, now_ms: u64) -> bool {
        self.pending && self.due(now_ms)
    }

    fn due(&mut self, now_ms: u64) -> bool {
        let due = self.last_ms.is_none_or(|t| now_ms.saturating_sub(t) >= WAKE_GAP_MS);
        if due {
            self.last_ms = Some(now_ms);
            self.pending = false;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_wakes_at_once_unless_a_wake_was_inside_the_gap() {
        let mut p = WakePace::default();
        assert!(p.published(1_000), "the first publish wakes");
        assert!(!p.published(1_001), "inside the gap: held back");
        assert!(!p.tick(1_001), "still inside the gap");
        assert!(p.tick(1_000 + WAKE_GAP_MS), "the held-back wake goes out on the tick");
        assert!(!p.tick(1_010), "nothing published since: no wake");
        assert!(p.published(1_010), "past the gap: at once");
    }

    #[test]
    fn a_clock_going_back_does_not_stop_the_wakes_for_good() {
        let mut p = WakePace::default();
        assert!(p.published(5_000));
        assert!(!p.published(4_000), "earlier than the last wake: held back");
        assert!(p.tick(5_000 + WAKE_GAP_MS));
    }

    #[test]
    fn knowledge_is_just_published_for_less_than_the_bound() {
        assert!(just_published(1_000, 1_000));
        assert!(just_published(1_000, 1_000 + JUST_PUBLISHED_MS - 1));
        assert!(!just_published(1_000, 1_000 + JUST_PUBLISHED_MS));
        assert!(just_published(1_005, 1_000), "a thread clock behind the singleton's");
    }

    #[test]
    fn queue_names_differ_per_shard() {
        assert_eq!(queue_name(7), "kvroute.wake.7");
        assert_ne!(queue_name(1), queue_name(11));
    }
}
