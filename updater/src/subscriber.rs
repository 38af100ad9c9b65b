//! One worker's event stream: a ZMQ SUB socket, gap detection from sequence numbers, replay
//! over the worker's ROUTER socket, and a full resync when the publisher restarts.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::decode::decode_batch;
use crate::ingest::SeqCheck;
use crate::state::{now_ms, State};

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

const END: [u8; 8] = [0xFF; 8];

fn seq_of(frame: &Bytes) -> Option<u64> {
    <[u8; 8]>::try_from(frame.as_ref()).ok().map(u64::from_be_bytes)
}

/// Asks the replay socket for every buffered batch from `start`; returns `(seq, payload)` in
/// order. Accepts both reply shapes (`seq, payload` and `topic, seq, payload`).
pub async fn replay(endpoint: &str, start: u64) -> anyhow::Result<Vec<(u64, Bytes)>> {
    let mut dealer = zeromq::DealerSocket::new();
    tokio::time::timeout(Duration::from_secs(2), dealer.connect(endpoint)).await??;
    let req =
        ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())])
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    dealer.send(req).await?;
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), dealer.recv()).await??.into_vec();
        let body: Vec<Bytes> = m.into_iter().skip_while(|f| !f.is_empty()).skip(1).collect();
        let (seq, payload) = match body.len() {
            2 => (&body[0], &body[1]),
            3 => (&body[1], &body[2]),
            n => anyhow::bail!("replay reply with {n} frames"),
        };
        if seq.as_ref() == END {
            return Ok(out);
        }
        if let Some(s) = seq_of(seq) {
            out.push((s, payload.clone()));
        }
    }
}

fn apply(state: &State, worker: &str, seq: u64, payload: &[u8]) {
    match decode_batch(payload) {
        Ok(batch) => {
            state.update(worker, |e, d| {
                if e.member {
                    e.knowledge.apply(seq, &batch, d, now_ms());
                } else {
                    // Out of the pool: events are not indexed (resynced when it returns).
                    e.knowledge.next_seq = Some(seq + 1);
                }
            });
        }
        Err(e) => {
            log_line(worker, &format!("undecodable batch {seq}: {e}"));
            state.update(worker, |e, _| e.knowledge.next_seq = Some(seq + 1));
        }
    }
}

fn log_line(worker: &str, msg: &str) {
    eprintln!(
        "{{\"component\":\"kvroute-updater\",\"worker\":\"{worker}\",\"msg\":{}}}",
        serde_json::Value::from(msg)
    );
}

/// Fills `from..to` from the replay socket; counts a replay, or a gap that stays open.
async fn fill(state: &State, ep: &Endpoints, from: u64, to: u64) {
    let got = match &ep.replay {
        Some(r) => replay(r, from).await.unwrap_or_default(),
        None => Vec::new(),
    };
    let mut next = from;
    for (seq, payload) in got.into_iter().filter(|(s, _)| *s >= from && *s < to) {
        if seq != next {
            break;
        }
        apply(state, &ep.worker, seq, &payload);
        next += 1;
    }
    state.update(&ep.worker, |e, _| {
        e.knowledge.stats.replays += 1;
        if next < to {
            // Still missing: the knowledge may be wrong; start over from what the stream says.
            e.knowledge.clear();
            e.knowledge.stats.resyncs += 1;
            e.knowledge.stats.last_event_ms = crate::state::now_ms();
        }
        e.knowledge.next_seq = Some(to);
    });
}

/// Fetches every buffered batch from the next expected one on (all of them on a first
/// connection) and applies them in order. Returns the sequence number live messages must reach
/// before they are new (older ones were just applied from the replay).
async fn catch_up(state: &State, ep: &Endpoints) -> Option<u64> {
    let replay_ep = ep.replay.as_ref()?;
    let from = state.update(&ep.worker, |e, _| e.knowledge.next_seq).flatten().unwrap_or(0);
    let got = replay(replay_ep, from).await.unwrap_or_default();
    let mut next = from;
    for (seq, payload) in got {
        if seq != next {
            break;
        }
        apply(state, &ep.worker, seq, &payload);
        next += 1;
    }
    (next > from).then_some(next)
}

/// How long a worker's live stream may stay silent before the replay buffer is asked whether
/// batches were published that the subscription did not deliver.
const SILENCE_PROBE: Duration = Duration::from_secs(2);

/// Follows one worker's stream until the task is dropped. After subscribing, everything the
/// worker published before (ZMQ's slow joiner drops it) is fetched from its replay socket. A
/// lost connection ends in a full resync.
pub async fn follow(state: Arc<State>, ep: Endpoints) {
    loop {
        let mut sub = zeromq::SubSocket::new();
        let mut monitor = sub.monitor();
        let connected = async {
            sub.connect(&ep.events).await?;
            sub.subscribe("").await?;
            Ok::<_, zeromq::ZmqError>(())
        };
        if tokio::time::timeout(Duration::from_secs(2), connected)
            .await
            .map_or(true, |r| r.is_err())
        {
            state.update(&ep.worker, |e, _| e.connected = false);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        state.update(&ep.worker, |e, _| e.connected = true);
        // Let the subscription reach the publisher, then fetch what came before it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut dup_floor = catch_up(&state, &ep).await;
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
                _ = probe.tick() => {
                    // A silent stream is normal for an idle worker, but if the replay buffer
                    // holds batches the subscription never delivered, it was lost: take them
                    // and subscribe again.
                    if !std::mem::take(&mut heard) && catch_up(&state, &ep).await.is_some() {
                        resubscribe = true;
                        break;
                    }
                    continue;
                }
            };
            heard = true;
            let frames = msg.into_vec();
            let (Some(seq), Some(payload)) = (frames.get(1).and_then(seq_of), frames.get(2)) else {
                continue;
            };
            if let Some(floor) = dup_floor {
                if seq < floor {
                    continue; // already applied from the replay
                }
                dup_floor = None;
            }
            let check = state
                .update(&ep.worker, |e, _| e.knowledge.check(seq))
                .unwrap_or(SeqCheck::InOrder);
            match check {
                SeqCheck::InOrder => {}
                SeqCheck::Gap { from, to } => {
                    state.update(&ep.worker, |e, _| e.knowledge.stats.gaps += 1);
                    log_line(&ep.worker, &format!("gap: batches {from}..{to} missed, replaying"));
                    fill(&state, &ep, from, to).await;
                }
                SeqCheck::Restart => {
                    log_line(&ep.worker, "publisher restarted: full resync");
                    state.update(&ep.worker, |e, _| {
                        e.knowledge.clear();
                        e.knowledge.stats.resyncs += 1;
                    });
                    if seq > 0 {
                        fill(&state, &ep, 0, seq).await;
                    }
                }
            }
            apply(&state, &ep.worker, seq, payload);
        }
        if resubscribe {
            log_line(&ep.worker, "live stream silent while replay had new batches: resubscribing");
            state.update(&ep.worker, |e, _| e.knowledge.stats.resubscribes += 1);
            continue;
        }
        log_line(&ep.worker, "event stream lost: reconnecting with a full resync");
        state.update(&ep.worker, |e, _| {
            e.connected = false;
            e.knowledge.clear();
            e.knowledge.next_seq = None;
            e.knowledge.stats.resyncs += 1;
            // As of now nothing is known to be cached there: older routing guesses give way.
            e.knowledge.stats.last_event_ms = crate::state::now_ms();
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
