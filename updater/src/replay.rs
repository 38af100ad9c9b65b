//! The replay client: asks a worker's ROUTER socket for every buffered batch from a sequence
//! number on, within [`ReplayLimits`] (batches, payload bytes, time). A replay that overruns a
//! bound is cut: what arrived is returned with the bound that cut it.

use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;
use tokio::time::Instant;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::limits::{Cap, ReplayLimits};

/// The end marker of a replay: a sequence number of all 0xFF bytes.
const END: [u8; 8] = [0xFF; 8];

/// Longest silence between two replies of one replay.
const REPLY_SILENCE: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("replay socket: {0}")]
    Zmq(#[from] zeromq::ZmqError),
    #[error("replay socket: no connection")]
    Connect,
    #[error("replay request: {0}")]
    Request(String),
}

/// How a replay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The end marker arrived.
    Complete,
    /// A bound was reached.
    Cut(Cap),
    /// The socket failed, went silent or replied in an unknown shape.
    Broken(String),
}

/// What one replay brought: `(seq, payload)` in the order received.
#[derive(Debug, Clone)]
pub struct ReplayBatch {
    pub batches: Vec<(u64, Bytes)>,
    pub end: End,
}

pub fn seq_of(frame: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(frame).ok().map(u64::from_be_bytes)
}

/// Asks `endpoint` for every buffered batch from `start`. Accepts both reply shapes
/// (`seq, payload` and `topic, seq, payload`).
pub async fn fetch(
    endpoint: &str,
    start: u64,
    limits: &ReplayLimits,
) -> Result<ReplayBatch, ReplayError> {
    let deadline = Instant::now() + limits.max_time;
    let mut dealer = zeromq::DealerSocket::new();
    let connect_by = deadline.min(Instant::now() + Duration::from_secs(2));
    tokio::time::timeout_at(connect_by, dealer.connect(endpoint))
        .await
        .map_err(|_| ReplayError::Connect)??;
    let req =
        ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())])
            .map_err(|e| ReplayError::Request(e.to_string()))?;
    dealer.send(req).await?;
    let mut out = ReplayBatch { batches: Vec::new(), end: End::Complete };
    let mut bytes = 0usize;
    loop {
        let by = deadline.min(Instant::now() + REPLY_SILENCE);
        let m = match tokio::time::timeout_at(by, dealer.recv()).await {
            Ok(Ok(m)) => m.into_vec(),
            Ok(Err(e)) => return Ok(ReplayBatch { end: End::Broken(e.to_string()), ..out }),
            Err(_) if by == deadline => {
                return Ok(ReplayBatch { end: End::Cut(Cap::ReplayTime), ..out })
            }
            Err(_) => {
                return Ok(ReplayBatch { end: End::Broken("replay went silent".into()), ..out })
            }
        };
        let body: Vec<Bytes> = m.into_iter().skip_while(|f| !f.is_empty()).skip(1).collect();
        let (seq, payload) = match body.as_slice() {
            [seq, payload] | [_, seq, payload] => (seq, payload),
            other => {
                let msg = format!("replay reply with {} frames", other.len());
                return Ok(ReplayBatch { end: End::Broken(msg), ..out });
            }
        };
        if seq.as_ref() == END {
            return Ok(out);
        }
        let Some(s) = seq_of(seq) else { continue };
        if out.batches.len() >= limits.max_batches {
            out.end = End::Cut(Cap::ReplayBatches);
            return Ok(out);
        }
        if bytes.saturating_add(payload.len()) > limits.max_bytes {
            out.end = End::Cut(Cap::ReplayBytes);
            return Ok(out);
        }
        bytes += payload.len();
        out.batches.push((s, payload.clone()));
    }
}
