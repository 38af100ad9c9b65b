//! Delay lines on real sockets and channels: every chunk is released a fixed time after it
//! arrived, so a stream keeps its spacing and is shifted, not bunched.
//!
//! [`delayed_connection`] puts one on each direction of an accepted HTTP connection (the
//! client round trip: half on the request, half on every response byte); [`delay_channel`] on
//! the KV-event path. Worker-to-worker connections (KV pulls, P/D prefill requests), marked by
//! [`PEER_HEADER`] in their first request, skip the client delay: they pay their link's cost
//! on the pulling side instead.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Request header a worker sets on its requests to other workers.
pub const PEER_HEADER: &str = "x-kvroute-sim-peer";

const CHUNK: usize = 64 * 1024;

/// Whether the first bytes of a connection carry [`PEER_HEADER`] in their header block.
fn is_peer(first: &[u8]) -> bool {
    let head = first.windows(4).position(|w| w == b"\r\n\r\n").map_or(first, |i| &first[..i]);
    let needle = PEER_HEADER.as_bytes();
    head.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

/// Copies `r` to `w`, each chunk written `d` after it was read (`first`: a chunk already read,
/// and when); shuts `w` down at the end of `r`.
async fn delay_copy<R, W>(mut r: R, mut w: W, d: Duration, first: Option<(Instant, Vec<u8>)>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    if let Some((at, b)) = first {
        let _ = tx.send((at + d, b));
    }
    let reader = async move {
        loop {
            let mut buf = vec![0; CHUNK];
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.send((Instant::now() + d, buf)).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((at, b)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if w.write_all(&b).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// Serves one accepted connection through a delay line of `one_way` in each direction:
/// `serve` gets the delayed side. The whole connection (both lines and `serve`) lives in this
/// future, so dropping it closes everything at once.
pub async fn delayed_connection<F, Fut>(stream: TcpStream, one_way: Duration, serve: F)
where
    F: FnOnce(tokio::io::DuplexStream) -> Fut,
    Fut: Future<Output = ()>,
{
    let (mut rd, wr) = stream.into_split();
    let mut first = vec![0; CHUNK];
    let n = match rd.read(&mut first).await {
        Ok(0) | Err(_) => return,
        Ok(n) => n,
    };
    let arrived = Instant::now();
    first.truncate(n);
    let d = if is_peer(&first) { Duration::ZERO } else { one_way };
    let (ours, theirs) = tokio::io::duplex(4 * CHUNK);
    let (our_rd, our_wr) = tokio::io::split(ours);
    let inbound = delay_copy(rd, our_wr, d, Some((arrived, first)));
    let outbound = delay_copy(our_rd, wr, d, None);
    // The client may keep its side open after the response: the connection ends with the
    // server and the response line; the request line only ends it by finishing first.
    tokio::select! {
        _ = async { tokio::join!(serve(theirs), outbound) } => {}
        _ = async { inbound.await; std::future::pending::<()>().await } => {}
    }
}

/// Forwards `rx` to `tx`, each item `d` after it arrived (a delay line: spacing kept).
pub async fn delay_channel<T>(
    mut rx: mpsc::UnboundedReceiver<T>,
    tx: mpsc::UnboundedSender<T>,
    d: Duration,
) {
    let (line_tx, mut line_rx) = mpsc::unbounded_channel::<(Instant, T)>();
    let reader = async move {
        while let Some(item) = rx.recv().await {
            if line_tx.send((Instant::now() + d, item)).is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((at, item)) = line_rx.recv().await {
            tokio::time::sleep_until(at).await;
            if tx.send(item).is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_told_by_their_header() {
        assert!(is_peer(b"POST /kv/pull HTTP/1.1\r\nX-Kvroute-Sim-Peer: 1\r\n\r\n{}"));
        assert!(!is_peer(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n\r\nx-kvroute-sim-peer"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_line_shifts_without_bunching() {
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        let (out_tx, mut out_rx) = mpsc::unbounded_channel();
        let d = Duration::from_millis(40);
        tokio::spawn(delay_channel(in_rx, out_tx, d));
        let t0 = Instant::now();
        in_tx.send(1).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        in_tx.send(2).unwrap();
        assert_eq!(out_rx.recv().await, Some(1));
        assert_eq!(Instant::now() - t0, d);
        assert_eq!(out_rx.recv().await, Some(2));
        assert_eq!(Instant::now() - t0, d + Duration::from_millis(10));
    }

    /// A response written in two pieces 30 ms apart reaches the client one way later each
    /// (lower bounds: each piece keeps its own delay, none is bunched with an earlier one); the
    /// request reaches the server one way after it was sent.
    #[tokio::test]
    async fn a_connection_line_delays_both_ways() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let one_way = Duration::from_millis(50);
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            delayed_connection(s, one_way, |mut io| async move {
                let mut b = [0u8; 5];
                io.read_exact(&mut b).await.unwrap();
                io.write_all(b"a").await.unwrap();
                tokio::time::sleep(Duration::from_millis(30)).await;
                io.write_all(b"b").await.unwrap();
                io.shutdown().await.unwrap();
            })
            .await;
        });
        let mut c = TcpStream::connect(addr).await.unwrap();
        let t0 = Instant::now();
        c.write_all(b"hello").await.unwrap();
        let mut one = [0u8; 1];
        c.read_exact(&mut one).await.unwrap();
        let first = t0.elapsed();
        c.read_exact(&mut one).await.unwrap();
        let second = t0.elapsed();
        assert!(first >= 2 * one_way, "first byte after {first:?}");
        // Written 30 ms after the first: never released before its own one-way delay.
        let floor = 2 * one_way + Duration::from_millis(30);
        assert!(second >= floor, "{first:?} then {second:?}");
        drop(c);
        server.await.unwrap();
    }
}
