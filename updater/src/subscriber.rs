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
        }
        e.knowledge.next_seq = Some(to);
    });
}

/// Quiet time after which the SUB socket is recreated: a restarted publisher is not always
/// noticed by the socket itself.
const IDLE_RECONNECT: Duration = Duration::from_secs(3);

/// Follows one worker's stream until the task is dropped, reconnecting on errors and after
/// quiet periods. The first batch after a reconnect that is not the next expected one means a
/// restart or a long gap: both end in a full resync.
pub async fn follow(state: Arc<State>, ep: Endpoints) {
    let mut resync_next = false;
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
        let mut idle_until = tokio::time::Instant::now() + IDLE_RECONNECT;
        let mut lost = true;
        loop {
            let msg = tokio::select! {
                m = sub.recv() => match m { Ok(m) => m, Err(_) => break },
                ev = monitor.next() => match ev {
                    Some(zeromq::SocketEvent::Disconnected(_)) | None => break,
                    Some(_) => continue,
                },
                _ = tokio::time::sleep_until(idle_until) => {
                    lost = false;
                    break;
                }
            };
            idle_until = tokio::time::Instant::now() + IDLE_RECONNECT;
            let frames = msg.into_vec();
            let (Some(seq), Some(payload)) = (frames.get(1).and_then(seq_of), frames.get(2)) else {
                continue;
            };
            let mut check = state
                .update(&ep.worker, |e, _| e.knowledge.check(seq))
                .unwrap_or(SeqCheck::InOrder);
            if std::mem::take(&mut resync_next) && check != SeqCheck::InOrder {
                check = SeqCheck::Restart;
            }
            match check {
                SeqCheck::InOrder => {}
                SeqCheck::Gap { from, to } => {
                    state.update(&ep.worker, |e, _| e.knowledge.stats.gaps += 1);
                    log_line(&ep.worker, &format!("gap: batches {from}..{to} missed, replaying"));
                    fill(&state, &ep, from, to).await;
                }
                SeqCheck::Restart => {
                    log_line(&ep.worker, "publisher restarted or reconnected: full resync");
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
        if lost {
            log_line(&ep.worker, "event stream lost: reconnecting");
        }
        state.update(&ep.worker, |e, _| e.connected = false);
        resync_next =
            state.update(&ep.worker, |e, _| e.knowledge.next_seq.is_some()).unwrap_or(false);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
