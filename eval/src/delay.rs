//! A loopback TCP relay that holds every byte from the upstream for a settable delay: put
//! between Envoy's snapshot singleton and kvroute-updater, it makes knowledge arrive late by
//! exactly that much (a remote updater, a congested control network).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running relay; dropping it stops accepting (open connections end with their peers).
pub struct DelayRelay {
    pub port: u16,
    delay_ms: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DelayRelay {
    /// Relays `127.0.0.1:<port>` to `127.0.0.1:<upstream>`.
    pub async fn start(upstream: u16, delay: Duration) -> anyhow::Result<DelayRelay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
        let d = delay_ms.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let d = d.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        relay(client, server, d).await;
                    }
                });
            }
        });
        Ok(DelayRelay { port, delay_ms, task })
    }

    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::Relaxed))
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Client → server bytes pass at once; server → client bytes are each released `delay` after
/// they arrived, in order.
async fn relay(client: TcpStream, server: TcpStream, delay_ms: Arc<AtomicU64>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
        let _ = sw.shutdown().await;
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = tokio::time::Instant::now()
                        + Duration::from_millis(delay_ms.load(Ordering::Relaxed));
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    while let Some((due, bytes)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if cw.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = cw.shutdown().await;
    reader.abort();
    up.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_come_back_late_and_intact() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
        });
        let relay = DelayRelay::start(up, Duration::from_millis(150)).await.unwrap();
        assert_eq!(relay.delay(), Duration::from_millis(150));
        let mut c = TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap();
        let sent = std::time::Instant::now();
        c.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello");
        // The relay adds at least its delay (an upper bound would depend on machine speed).
        assert!(sent.elapsed() >= Duration::from_millis(150));
    }
}
