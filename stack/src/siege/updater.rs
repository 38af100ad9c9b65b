//! Attacks on the updater (and generic ones any TCP listener can take, Envoy's too): msgpack
//! bombs and oversized messages from a worker's PUB socket, idle connections and partial
//! requests held against an HTTP listener, and what to measure while they last (a process's
//! peak resident memory and open descriptors). The updater runs under real limits
//! ([`spawn_limited`]: `prlimit` on the child).
//!
//! [`ZmtpPublisher`] speaks ZMTP 3.0 as a PUB socket over a plain TCP listener, so a test can
//! send any frames, of any size, streamed from one buffer (16 frames of 60 MiB cost the sender
//! 60 MiB), whatever a ZMQ library would refuse to send.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::process::Guard;

const MORE: u8 = 0b001;
const LONG: u8 = 0b010;

/// A PUB endpoint that subscribers (the updater's SUB socket, through its frame guard) connect
/// to. Every message goes to the most recent subscriber connection. Its task stops on drop.
pub struct ZmtpPublisher {
    port: u16,
    conn: Arc<Mutex<Option<OwnedWriteHalf>>>,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for ZmtpPublisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ZMTP 3.0 greeting of a NULL-mechanism peer.
fn greeting() -> Vec<u8> {
    let mut g = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 0];
    g.extend_from_slice(b"NULL");
    g.resize(64, 0);
    g
}

/// The READY command of a PUB socket.
fn ready() -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&3u32.to_be_bytes());
    body.extend_from_slice(b"PUB");
    let mut cmd = vec![0x04, body.len() as u8];
    cmd.extend(body);
    cmd
}

/// The header of a message frame of `len` bytes (`more`: not the message's last).
pub fn frame_header(len: u64, more: bool) -> Vec<u8> {
    let flags = if more { MORE } else { 0 };
    if len > 255 {
        let mut h = vec![flags | LONG];
        h.extend_from_slice(&len.to_be_bytes());
        h
    } else {
        vec![flags, len as u8]
    }
}

impl ZmtpPublisher {
    /// Listens on a free loopback port.
    pub async fn bind() -> anyhow::Result<ZmtpPublisher> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let conn: Arc<Mutex<Option<OwnedWriteHalf>>> = Arc::new(Mutex::new(None));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (c, a) = (Arc::clone(&conn), Arc::clone(&accepted));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let (mut r, mut w) = stream.into_split();
                if w.write_all(&greeting()).await.is_err() || w.write_all(&ready()).await.is_err() {
                    continue;
                }
                // Whatever the subscriber sends (greeting, READY, subscriptions) is read and
                // dropped; PUB filtering is not needed: every test message goes to everyone.
                tokio::spawn(async move {
                    let mut sink = vec![0u8; 4096];
                    while r.read(&mut sink).await.is_ok_and(|n| n > 0) {}
                });
                *c.lock().await = Some(w);
                a.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Ok(ZmtpPublisher { port, conn, accepted, task })
    }

    /// `tcp://127.0.0.1:PORT`, as the updater's `--worker` flag takes it.
    pub fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    /// Subscriber connections accepted so far.
    pub fn subscribers(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends one message of `frames` to the current subscriber (an error when there is none
    /// or it went away).
    pub async fn send(&self, frames: &[&[u8]]) -> anyhow::Result<()> {
        let mut guard = self.conn.lock().await;
        let w = guard.as_mut().context("no subscriber connected")?;
        for (i, f) in frames.iter().enumerate() {
            w.write_all(&frame_header(f.len() as u64, i + 1 < frames.len())).await?;
            for chunk in f.chunks(1 << 20) {
                w.write_all(chunk).await?;
            }
        }
        Ok(())
    }

    /// Sends a batch as a worker publishes it: `[topic "", seq, payload]`.
    pub async fn batch(&self, seq: u64, payload: &[u8]) -> anyhow::Result<()> {
        self.send(&[b"", &seq.to_be_bytes(), payload]).await
    }
}

/// Msgpack payloads a hostile or broken worker can publish as a batch.
pub mod bombs {
    /// `[ts, events, rank]` opening: a 3-array and a float64 timestamp of 0.
    fn head() -> Vec<u8> {
        vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0]
    }

    /// A batch of `total` bytes whose events array holds nils, one byte each (the
    /// 60 MiB bomb: tens of millions of real elements).
    pub fn nils(total: usize) -> Vec<u8> {
        let mut b = head();
        let n = total.saturating_sub(b.len() + 6) as u32;
        b.push(0xdd);
        b.extend_from_slice(&n.to_be_bytes());
        b.resize(b.len() + n as usize, 0xc0);
        b.push(0xc0);
        b
    }

    /// A batch of `total` bytes whose events nest one-entry maps (`{nil: {nil: ...}}`) as deep
    /// as the bytes allow.
    pub fn nested_maps(total: usize) -> Vec<u8> {
        let mut b = head();
        b.push(0x91);
        let pairs = total.saturating_sub(b.len() + 2) / 2;
        for _ in 0..pairs {
            b.extend_from_slice(&[0x81, 0xc0]);
        }
        b.push(0xc0);
        b.push(0xc0);
        b
    }

    /// A batch of `total` bytes whose one event is a map of nil keys and nil values (two
    /// elements per entry, two bytes).
    pub fn wide_map(total: usize) -> Vec<u8> {
        let mut b = head();
        b.push(0x91);
        let n = (total.saturating_sub(b.len() + 6) / 2) as u32;
        b.push(0xdf);
        b.extend_from_slice(&n.to_be_bytes());
        b.resize(b.len() + 2 * n as usize, 0xc0);
        b.push(0xc0);
        b
    }

    /// Batches a few bytes long that declare 2^32 - 1 elements or bytes: an array, a map, a
    /// string, a binary.
    pub fn declared_huge() -> Vec<(&'static str, Vec<u8>)> {
        let at = |marker: u8| {
            let mut b = head();
            b.push(marker);
            b.extend_from_slice(&[0xff; 4]);
            b.extend_from_slice(&[0xc0; 8]);
            b
        };
        vec![
            ("array32 of 2^32-1", at(0xdd)),
            ("map32 of 2^32-1", at(0xdf)),
            ("str32 of 4 GiB", at(0xdb)),
            ("bin32 of 4 GiB", at(0xc6)),
        ]
    }

    /// A well-formed vLLM batch storing one GPU block of `block_size` tokens (`first`,
    /// `first + 1`, ...) under engine hash `hash`.
    pub fn stored(hash: u64, first: u32, block_size: u32) -> Vec<u8> {
        let mut b = vec![0x93, 0xcb];
        b.extend_from_slice(&1.5f64.to_be_bytes());
        b.extend_from_slice(&[0x91, 0x99, 0xab]);
        b.extend_from_slice(b"BlockStored");
        b.extend_from_slice(&[0x91, 0xcf]);
        b.extend_from_slice(&hash.to_be_bytes());
        b.push(0xc0);
        b.push(0xdd);
        b.extend_from_slice(&block_size.to_be_bytes());
        for t in first..first + block_size {
            b.push(0xce);
            b.extend_from_slice(&t.to_be_bytes());
        }
        b.push(0xce);
        b.extend_from_slice(&block_size.to_be_bytes());
        b.extend_from_slice(&[0xc0, 0xa3]);
        b.extend_from_slice(b"GPU");
        b.extend_from_slice(&[0xc0, 0xc0, 0xc0]);
        b
    }
}

/// Peak resident memory of `pid` (`VmHWM`, kB), while it runs.
pub fn peak_rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmHWM:")
}

/// Resident memory of `pid` (`VmRSS`, kB), while it runs.
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS:")
}

fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// Open file descriptors of `pid`, while it runs.
pub fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// Limits a child runs under (`prlimit` on the child; unset: inherited).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChildLimits {
    /// Address space (`RLIMIT_AS`), bytes: an allocation past it fails (and aborts a Rust
    /// process), whatever is resident.
    pub address_space: Option<u64>,
    /// Open files (`RLIMIT_NOFILE`), soft and hard.
    pub nofile: Option<u64>,
}

/// Starts `program` with `args` under `limits` (through `prlimit`, which execs it: the pid is
/// the program's), stderr to `log`, stdout readable through the guard. glibc reserves address
/// space per thread arena whether used or not, so under an address-space limit the child gets
/// `MALLOC_ARENA_MAX=2`: the limit then measures what the program allocates.
pub fn spawn_limited(
    name: &str,
    program: &Path,
    args: &[String],
    limits: ChildLimits,
    log: &Path,
) -> anyhow::Result<Guard> {
    let mut cmd = tokio::process::Command::new("prlimit");
    if let Some(a) = limits.address_space {
        cmd.arg(format!("--as={a}:{a}"));
        cmd.env("MALLOC_ARENA_MAX", "2");
    }
    if let Some(n) = limits.nofile {
        cmd.arg(format!("--nofile={n}:{n}"));
    }
    cmd.arg("--").arg(program).args(args);
    Guard::spawn(name, cmd, log)
}

/// The release `kvroute-updater` with `args` under `limits` ([`spawn_limited`]), logging to
/// `dir/updater.log`; returns once it listens (30 s at most).
pub async fn start_limited(
    args: &[String],
    limits: ChildLimits,
    dir: &Path,
) -> anyhow::Result<Guard> {
    let bin = crate::paths::updater_bin()?;
    let mut guard = spawn_limited("kvroute-updater", &bin, args, limits, &dir.join("updater.log"))?;
    guard.wait_line("listening on", Duration::from_secs(30)).await?;
    Ok(guard)
}

/// Opens up to `n` TCP connections to `addr` that send nothing; returns those that opened
/// (a listener out of backlog or descriptors refuses or drops some). Dropping them closes them.
pub async fn open_idle(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let c = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await;
        if let Ok(Ok(s)) = c {
            out.push(s);
        }
    }
    out
}

/// Opens up to `n` connections to `addr` that each send the start of a request head and never
/// finish it.
pub async fn open_partial(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut out = open_idle(addr, n).await;
    for s in &mut out {
        let _ = s.write_all(b"GET /status HTTP/1.1\r\nhost: siege\r\nx-slow: ").await;
    }
    out
}

/// How many of `conns` the peer has closed (EOF or reset seen within `within` each).
pub async fn closed_by_peer(conns: &mut [TcpStream], within: Duration) -> usize {
    let mut n = 0;
    for s in conns {
        let mut b = [0u8; 256];
        let r = tokio::time::timeout(within, s.read(&mut b)).await;
        n += usize::from(matches!(r, Ok(Ok(0)) | Ok(Err(_))));
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bombs_have_the_size_asked_and_a_valid_prefix() {
        for (name, b) in [
            ("nils", bombs::nils(1 << 16)),
            ("nested", bombs::nested_maps(1 << 16)),
            ("wide", bombs::wide_map(1 << 16)),
        ] {
            assert!(b.len().abs_diff(1 << 16) <= 2, "{name}: {}", b.len());
            assert_eq!(&b[..2], &[0x93, 0xcb], "{name}");
        }
        let s = bombs::stored(7, 100, 16);
        assert_eq!(s.len(), 10 + 3 + 11 + 2 + 8 + 1 + 5 + 16 * 5 + 5 + 1 + 4 + 3);
        assert_eq!(frame_header(3, true), vec![MORE, 3]);
        assert_eq!(frame_header(300, false)[..2], [LONG, 0]);
        assert_eq!(ready().len(), 2 + 25);
    }

    #[test]
    fn own_peak_memory_and_descriptors_read() {
        let pid = std::process::id();
        // Current first: the peak can only grow after it is read, while
        // other test threads allocate concurrently.
        let now = rss_kb(pid).unwrap();
        let peak = peak_rss_kb(pid).unwrap();
        assert!(peak >= now, "peak {peak} KiB < current {now} KiB");
        assert!(fd_count(pid).unwrap() >= 3);
    }
}
