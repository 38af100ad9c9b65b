//! One worker's event stream: a ZMQ SUB socket (behind a [`FrameGuard`]), gap detection from
//! sequence numbers, and catching up from the worker's replay socket.
//!
//! What is known is kept unless the publisher provably restarted: a replay window that starts
//! later than asked (the engine's buffer rolled over) is applied on top of the blocks known
//! before, and a lost connection keeps them too. The sequence going back, or a replay whose
//! first batch is the last one applied but with different bytes, is a restart: the worker's
//! blocks are gone and are rebuilt from replay. No resync moves the last-event time forward:
//! only batches do, replayed ones with the time the engine published them.
//!
//! Every message that is not a batch (no 8-byte sequence frame, no payload frame) is counted
//! (`malformed_messages`); every refused batch is counted (`bad_batches`, and the cap that
//! refused it). Log lines are rate-limited per worker and kind ([`RateLog`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::time::Instant;
use zeromq::{Socket, SocketRecv};

use crate::decode::{decode_batch_with, BoundError, DecodeError};
use crate::frameguard::{FrameGuard, OnCap};
use crate::ingest::SeqCheck;
use crate::limits::{Cap, Limits};
use crate::ratelog::RateLog;
use crate::replay::{self, seq_of, End};
use crate::state::{now_ms, State};

pub use crate::replay::fetch as replay;

/// Where a worker publishes.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The worker's name in snapshots (its HTTP `ip:port`).
    pub worker: String,
    /// `tcp://ip:port` of its PUB socket.
    pub events: String,
    /// `tcp://ip:port` of its replay ROUTER socket, if it has one.
    pub replay: Option<String>,
}

fn log_line(worker: &str, msg: &str) {
    eprintln!(
        "{{\"component\":\"kvroute-updater\",\"worker\":\"{worker}\",\"msg\":{}}}",
        serde_json::Value::from(msg)
    );
}

/// The cap a refused batch hit, if a cap refused it.
fn cap_of(e: &DecodeError) -> Option<Cap> {
    match e {
        DecodeError::Bounds(BoundError::Elements(_)) => Some(Cap::BatchElements),
        DecodeError::Bounds(BoundError::Declared { .. }) => Some(Cap::DeclaredLength),
        DecodeError::Bounds(BoundError::Depth(_)) => Some(Cap::DecodeDepth),
        _ => None,
    }
}

fn digest(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

/// How a batch reached the updater.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Live,
    ReplayBatch,
}

/// What a catch-up from replay found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caught {
    /// Batches applied; live messages below this sequence number were among them.
    Upto(u64),
    Nothing,
    /// The publisher's history is not the one known: it restarted.
    Restarted,
}

/// One worker being followed.
struct Follower {
    state: Arc<State>,
    worker: String,
    limits: Limits,
    /// The guarded replay endpoint.
    replay: Option<FrameGuard>,
    /// No replay before this instant (a replay was cut recently).
    replay_after: Option<Instant>,
    log: RateLog,
}

impl Follower {
    /// Writes `msg` unless a line of `kind` was written for this worker in the last interval.
    fn log(&mut self, kind: &'static str, msg: &str) {
        if let Some(line) = self.log.line(kind, msg) {
            log_line(&self.worker, &line);
        }
    }

    /// Counts a message that is not a batch.
    fn malformed(&mut self, frames: usize) {
        self.state.update(&self.worker, |e| e.knowledge.stats.malformed_messages += 1);
        let msg = format!("message of {frames} frames without an 8-byte sequence and a payload");
        self.log("malformed_message", &msg);
    }

    fn apply(&mut self, seq: u64, payload: &[u8], via: Via) {
        let decoded = if payload.len() > self.limits.wire.max_frame_bytes {
            self.state.cap_hit(&self.worker, Cap::PayloadBytes);
            Err(format!("payload of {} bytes over the cap", payload.len()))
        } else {
            decode_batch_with(payload, &self.limits.wire.decode_bounds()).map_err(|e| {
                if let Some(cap) = cap_of(&e) {
                    self.state.cap_hit(&self.worker, cap);
                }
                e.to_string()
            })
        };
        let now = now_ms();
        let d = digest(payload);
        self.state.update(&self.worker, |e| {
            e.knowledge.last_applied = Some((seq, d));
            match (&decoded, &e.domain) {
                (Ok(batch), Some(domain)) if e.member => {
                    // A replayed batch is as recent as the engine says (never in the future).
                    let stamp = match via {
                        Via::Live => now,
                        Via::ReplayBatch if batch.ts > 0.0 => ((batch.ts * 1000.0) as u64).min(now),
                        Via::ReplayBatch => e.knowledge.stats.last_event_ms,
                    };
                    e.knowledge.apply(seq, batch, domain, stamp);
                }
                // Out of the pool, or its model not identified yet: events are not indexed
                // (resynced when it returns, or once its domain is known).
                (Ok(_), _) => e.knowledge.next_seq = Some(seq + 1),
                (Err(_), _) => {
                    e.knowledge.stats.bad_batches += 1;
                    e.knowledge.next_seq = Some(seq + 1);
                }
            }
        });
        if let Err(msg) = decoded {
            self.log("bad_batch", &format!("batch {seq} refused: {msg}"));
        }
    }

    /// Marks a resync: blocks known so far are kept, as of now.
    fn resynced(&self, rollover: bool) {
        self.state.update(&self.worker, |e| {
            e.knowledge.stats.resyncs += 1;
            e.knowledge.stats.rollovers += u64::from(rollover);
            e.knowledge.stats.last_resync_ms = now_ms();
        });
    }

    /// Forgets the worker's blocks: its publisher restarted.
    fn restarted(&self) {
        self.state.update(&self.worker, |e| {
            e.knowledge.clear();
            e.knowledge.next_seq = None;
            e.knowledge.last_applied = None;
            e.knowledge.stats.resyncs += 1;
            e.knowledge.stats.last_resync_ms = now_ms();
        });
    }

    /// Applies what the replay buffer holds after the last applied batch (below `upto`, when
    /// given), checking first that the publisher's history is the one known.
    async fn catch_up(&mut self, upto: Option<u64>) -> Caught {
        let Some(endpoint) = self.replay.as_ref().map(|g| g.endpoint().to_owned()) else {
            return Caught::Nothing;
        };
        if self.replay_after.is_some_and(|t| Instant::now() < t) {
            return Caught::Nothing;
        }
        let (next, last) = self
            .state
            .update(&self.worker, |e| (e.knowledge.next_seq, e.knowledge.last_applied))
            .unwrap_or((None, None));
        // Ask again for the last applied batch: its bytes prove continuity.
        let witness = last.filter(|(s, _)| next == Some(s + 1));
        let ask = witness.map(|(s, _)| s).or(next).unwrap_or(0);
        let got = match replay::fetch(&endpoint, ask, &self.limits.replay).await {
            Ok(r) => r,
            Err(e) => {
                self.log("replay_failed", &format!("replay from {ask} failed: {e}"));
                return Caught::Nothing;
            }
        };
        self.state.update(&self.worker, |e| e.knowledge.stats.replays += 1);
        match &got.end {
            End::Complete => {}
            End::Cut(cap) => {
                self.log("replay_cut", &format!("replay from {ask} cut by {}", cap.name()));
                let cap = *cap;
                self.state.update(&self.worker, |e| {
                    e.knowledge.stats.replays_cut += 1;
                    e.knowledge.stats.caps_hit.hit(cap);
                });
                self.replay_after = Some(Instant::now() + self.limits.replay.retry_after);
            }
            End::Broken(why) => self.log("replay_broken", &format!("replay from {ask}: {why}")),
        }
        let holds_any = got.batches.iter().any(|(s, _)| *s >= ask);
        let mut batches = got
            .batches
            .into_iter()
            .filter(|(s, _)| *s >= ask && upto.is_none_or(|u| *s < u))
            .peekable();
        if let Some((seq, d)) = witness {
            match batches.peek() {
                Some((s, p)) if *s == seq => {
                    if digest(p) != d {
                        return Caught::Restarted;
                    }
                    batches.next();
                }
                Some(_) => {}
                // A complete replay holds nothing from the last applied batch on: a publisher
                // that kept running still buffers at least that batch (or later ones, after a
                // roll-over), so this one restarted and has not reached that sequence again.
                None if !holds_any && matches!(got.end, End::Complete) => return Caught::Restarted,
                None => {}
            }
        }
        let Some(first) = batches.peek().map(|(s, _)| *s) else {
            return Caught::Nothing;
        };
        if next.is_some_and(|n| first > n) {
            // The engine's buffer no longer reaches back to what was asked: what it holds is
            // applied on top of what was known.
            self.log("rolled_over", &format!("replay starts at {first}, not {ask}: rolled over"));
            self.resynced(true);
        }
        let mut expected = first;
        for (s, p) in batches {
            if s != expected {
                break;
            }
            self.apply(s, &p, Via::ReplayBatch);
            expected += 1;
        }
        Caught::Upto(expected)
    }

    /// Catches up; after a detected restart, rebuilds from the start of the new history.
    async fn catch_up_or_rebuild(&mut self, upto: Option<u64>) -> Caught {
        match self.catch_up(upto).await {
            Caught::Restarted => {
                self.log("restarted", "publisher restarted: full resync");
                self.restarted();
                self.catch_up(upto).await
            }
            other => other,
        }
    }

    /// A live batch after `from..to` were missed: fill from replay; what stays missing is
    /// skipped, keeping what is known.
    async fn fill(&mut self, from: u64, to: u64) {
        self.state.update(&self.worker, |e| e.knowledge.stats.gaps += 1);
        self.log("gap", &format!("gap: batches {from}..{to} missed, replaying"));
        self.catch_up_or_rebuild(Some(to)).await;
        let (next, known) = self
            .state
            .update(&self.worker, |e| (e.knowledge.next_seq, !e.knowledge.is_empty()))
            .unwrap_or((None, false));
        if next != Some(to) {
            if next.is_some() || known {
                self.resynced(false);
            }
            self.state.update(&self.worker, |e| e.knowledge.next_seq = Some(to));
        }
    }
}

/// How long a worker's live stream may stay silent before the replay buffer is asked whether
/// batches were published that the subscription did not deliver.
const SILENCE_PROBE: Duration = Duration::from_secs(2);

fn on_cap(state: &Arc<State>, worker: &str) -> OnCap {
    let (state, worker) = (Arc::clone(state), worker.to_owned());
    Arc::new(move |cap| state.cap_hit(&worker, cap))
}

/// Follows one worker's stream until the task is dropped. After subscribing, everything the
/// worker published before (ZMQ's slow joiner drops it) is fetched from its replay socket.
pub async fn follow(state: Arc<State>, ep: Endpoints) {
    let limits = state.limits;
    let cap = on_cap(&state, &ep.worker);
    let events = match FrameGuard::start(&ep.events, limits.wire, Arc::clone(&cap)).await {
        Ok(g) => g,
        Err(e) => return log_line(&ep.worker, &format!("events endpoint: {e}")),
    };
    let replay = match &ep.replay {
        Some(r) => match FrameGuard::start(r, limits.wire, cap).await {
            Ok(g) => Some(g),
            Err(e) => return log_line(&ep.worker, &format!("replay endpoint: {e}")),
        },
        None => None,
    };
    let resync = state.resync_signal(&ep.worker).unwrap_or_default();
    let mut f = Follower {
        state: Arc::clone(&state),
        worker: ep.worker.clone(),
        limits,
        replay,
        replay_after: None,
        log: RateLog::default(),
    };
    loop {
        let mut sub = zeromq::SubSocket::new();
        let mut monitor = sub.monitor();
        let connected = async {
            sub.connect(events.endpoint()).await?;
            sub.subscribe("").await?;
            Ok::<_, zeromq::ZmqError>(())
        };
        if tokio::time::timeout(Duration::from_secs(2), connected)
            .await
            .map_or(true, |r| r.is_err())
        {
            state.update(&ep.worker, |e| e.connected = false);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        state.update(&ep.worker, |e| e.connected = true);
        // Let the subscription reach the publisher, then fetch what came before it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut dup_floor = match f.catch_up_or_rebuild(None).await {
            Caught::Upto(n) => Some(n),
            _ => None,
        };
        let mut probe = tokio::time::interval(SILENCE_PROBE);
        probe.tick().await;
        let (mut heard, mut resubscribe) = (false, false);
        loop {
            let msg = tokio::select! {
                m = sub.recv() => match m { Ok(m) => m, Err(_) => break },
                ev = monitor.next() => match ev {
                    Some(zeromq::SocketEvent::Disconnected(_)) | None => break,
                    Some(_) => continue,
                },
                _ = resync.notified() => {
                    // The worker's domain changed: everything it buffered is re-hashed.
                    if let Caught::Upto(n) = f.catch_up_or_rebuild(None).await {
                        dup_floor = Some(n);
                    }
                    continue;
                }
                _ = probe.tick() => {
                    // A silent stream is normal for an idle worker, but if the replay buffer
                    // holds batches the subscription never delivered, it was lost: take them
                    // and subscribe again.
                    if !std::mem::take(&mut heard)
                        && matches!(f.catch_up_or_rebuild(None).await, Caught::Upto(_))
                    {
                        resubscribe = true;
                        break;
                    }
                    continue;
                }
            };
            heard = true;
            let frames = msg.into_vec();
            let (Some(seq), Some(payload)) = (frames.get(1).and_then(|f| seq_of(f)), frames.get(2))
            else {
                f.malformed(frames.len());
                continue;
            };
            if let Some(floor) = dup_floor {
                if seq < floor {
                    continue; // already applied from the replay
                }
                dup_floor = None;
            }
            live(&mut f, seq, payload).await;
        }
        if resubscribe {
            f.log("resubscribe", "live stream silent while replay had new batches: resubscribing");
            state.update(&ep.worker, |e| e.knowledge.stats.resubscribes += 1);
            continue;
        }
        // The blocks stay: on reconnecting, the replay tells whether the history continues.
        f.log("stream_lost", "event stream lost: reconnecting");
        state.update(&ep.worker, |e| e.connected = false);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Handles one live batch.
async fn live(f: &mut Follower, seq: u64, payload: &Bytes) {
    let check = f.state.update(&f.worker, |e| e.knowledge.check(seq)).unwrap_or(SeqCheck::InOrder);
    match check {
        SeqCheck::InOrder => {}
        SeqCheck::Gap { from, to } => f.fill(from, to).await,
        SeqCheck::Restart => {
            f.log("restarted", "publisher restarted (sequence went back): full resync");
            f.restarted();
            if seq > 0 {
                f.catch_up(Some(seq)).await;
                f.state.update(&f.worker, |e| e.knowledge.next_seq = Some(seq));
            }
        }
    }
    f.apply(seq, payload, Via::Live);
}
