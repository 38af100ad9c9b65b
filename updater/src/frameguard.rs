//! A frame-size guard in front of each ZMQ connection to a worker.
//!
//! The `zeromq` crate (0.7) reads a frame's 8-byte length and immediately reserves a buffer of
//! that size (plus a read chunk), before a byte of the body arrives; its only check is that the
//! length fits in `isize`, and its read-buffer options are explicitly no message-size limit. A
//! peer announcing a huge frame therefore makes the updater allocate it, or abort when the
//! allocation fails. The crate offers no hook before that point, so the updater never lets a
//! worker's bytes reach the crate directly: each ZMQ socket connects to a loopback relay that
//! parses the ZMTP framing of what the worker sends and
//!
//! - passes a message frame longer than the cap on as an *empty* frame (same flags) while it
//!   discards the body as it streams in, so the message keeps its shape, the batch is refused
//!   (counted) and the stream goes on;
//! - does the same with every frame that would take the message's frames, together, past the
//!   message cap (the codec holds a whole message before the updater sees it);
//! - drops the middle frames of a message beyond the frame-count cap (the codec would buffer
//!   every frame of a message);
//! - closes the connection on a command frame longer than the cap (no command is that large).
//!
//! Bytes the updater sends (subscriptions, replay requests) pass unchanged.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::limits::{Cap, WireLimits};

const GREETING: usize = 64;
const MORE: u8 = 0b001;
const LONG: u8 = 0b010;
const COMMAND: u8 = 0b100;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum GuardError {
    #[error("'{0}' is not tcp://host:port")]
    Endpoint(String),
    #[error("binding the loopback relay: {0}")]
    Bind(String),
    #[error("command frame of {0} bytes")]
    CommandTooLarge(u64),
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Greeting(usize),
    Flags,
    Len { flags: u8, got: usize },
    Body { left: u64, forward: bool },
}

/// The ZMTP framing of one direction of a connection, checked as bytes arrive.
#[derive(Debug)]
pub struct Framer {
    limits: WireLimits,
    step: Step,
    header: [u8; 9],
    /// Message frames so far in the current message.
    frames: usize,
    /// Bytes of the current message's frames passed on so far.
    message_bytes: u64,
    /// The current message already hit the message-bytes cap (counted once).
    message_capped: bool,
}

impl Framer {
    pub fn new(limits: WireLimits) -> Framer {
        Framer {
            limits,
            step: Step::Greeting(0),
            header: [0; 9],
            frames: 0,
            message_bytes: 0,
            message_capped: false,
        }
    }

    /// Consumes `input`, appending what may pass to `out` and each cap hit to `hits`.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        out: &mut Vec<u8>,
        hits: &mut Vec<Cap>,
    ) -> Result<(), GuardError> {
        while !input.is_empty() {
            match self.step {
                Step::Greeting(seen) => {
                    let n = (GREETING - seen).min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.step =
                        if seen + n == GREETING { Step::Flags } else { Step::Greeting(seen + n) };
                }
                Step::Flags => {
                    self.header[0] = input[0];
                    input = &input[1..];
                    self.step = Step::Len { flags: self.header[0], got: 0 };
                }
                Step::Len { flags, got } => {
                    let need = if flags & LONG != 0 { 8 } else { 1 };
                    let n = (need - got).min(input.len());
                    self.header[1 + got..1 + got + n].copy_from_slice(&input[..n]);
                    input = &input[n..];
                    self.step = if got + n == need {
                        self.header_done(flags, need, out, hits)?
                    } else {
                        Step::Len { flags, got: got + n }
                    };
                }
                Step::Body { left, forward } => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(input.len());
                    if forward {
                        out.extend_from_slice(&input[..n]);
                    }
                    input = &input[n..];
                    let left = left - n as u64;
                    self.step = if left == 0 { Step::Flags } else { Step::Body { left, forward } };
                }
            }
        }
        Ok(())
    }

    fn header_done(
        &mut self,
        flags: u8,
        len_bytes: usize,
        out: &mut Vec<u8>,
        hits: &mut Vec<Cap>,
    ) -> Result<Step, GuardError> {
        let len = if len_bytes == 8 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&self.header[1..9]);
            u64::from_be_bytes(b)
        } else {
            u64::from(self.header[1])
        };
        let too_long = len > self.limits.max_frame_bytes as u64;
        if flags & COMMAND != 0 {
            if too_long {
                hits.push(Cap::FrameBytes);
                return Err(GuardError::CommandTooLarge(len));
            }
            out.extend_from_slice(&self.header[..1 + len_bytes]);
            return Ok(body(len, true));
        }
        self.frames += 1;
        let last = flags & MORE == 0;
        let counted = self.frames;
        let over_total =
            self.message_bytes.saturating_add(len) > self.limits.max_message_bytes as u64;
        let step = if !last && counted > self.limits.max_message_frames {
            if counted == self.limits.max_message_frames + 1 {
                hits.push(Cap::MessageFrames);
            }
            body(len, false)
        } else if too_long || over_total {
            if too_long {
                hits.push(Cap::FrameBytes);
            } else if !std::mem::replace(&mut self.message_capped, true) {
                hits.push(Cap::MessageBytes);
            }
            out.extend_from_slice(&[flags & !LONG, 0]);
            body(len, false)
        } else {
            self.message_bytes += len;
            out.extend_from_slice(&self.header[..1 + len_bytes]);
            body(len, true)
        };
        if last {
            self.frames = 0;
            self.message_bytes = 0;
            self.message_capped = false;
        }
        Ok(step)
    }
}

fn body(left: u64, forward: bool) -> Step {
    if left == 0 {
        Step::Flags
    } else {
        Step::Body { left, forward }
    }
}

/// Called with each cap hit on a guarded connection.
pub type OnCap = Arc<dyn Fn(Cap) + Send + Sync>;

/// A loopback relay to one worker endpoint; stops (with its connections) when dropped.
#[derive(Debug)]
pub struct FrameGuard {
    endpoint: String,
    task: JoinHandle<()>,
}

impl Drop for FrameGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FrameGuard {
    /// Starts a relay to `target` (`tcp://host:port`) on 127.0.0.1.
    pub async fn start(
        target: &str,
        limits: WireLimits,
        on_cap: OnCap,
    ) -> Result<FrameGuard, GuardError> {
        let upstream = target
            .strip_prefix("tcp://")
            .filter(|a| a.contains(':'))
            .ok_or_else(|| GuardError::Endpoint(target.to_owned()))?
            .to_owned();
        let listener =
            TcpListener::bind("127.0.0.1:0").await.map_err(|e| GuardError::Bind(e.to_string()))?;
        let port = listener.local_addr().map_err(|e| GuardError::Bind(e.to_string()))?.port();
        let task = tokio::spawn(accept(listener, upstream, limits, on_cap));
        Ok(FrameGuard { endpoint: format!("tcp://127.0.0.1:{port}"), task })
    }

    /// Where the updater's ZMQ socket connects instead of the worker.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

async fn accept(listener: TcpListener, upstream: String, limits: WireLimits, on_cap: OnCap) {
    // Dropping the set (this task aborted) aborts every connection.
    let mut conns = JoinSet::new();
    while let Ok((down, _)) = listener.accept().await {
        while conns.try_join_next().is_some() {}
        conns.spawn(relay(down, upstream.clone(), limits, Arc::clone(&on_cap)));
    }
}

async fn relay(down: TcpStream, upstream: String, limits: WireLimits, on_cap: OnCap) {
    let up = match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&upstream)).await
    {
        Ok(Ok(up)) => up,
        _ => return, // closing `down` tells the ZMQ socket the peer is unreachable
    };
    let _ = (down.set_nodelay(true), up.set_nodelay(true));
    let (mut down_r, mut down_w) = down.into_split();
    let (mut up_r, mut up_w) = up.into_split();
    let to_worker = tokio::io::copy(&mut down_r, &mut up_w);
    let from_worker = async {
        let mut framer = Framer::new(limits);
        let mut buf = vec![0u8; 64 * 1024];
        let (mut out, mut hits) = (Vec::with_capacity(buf.len() + 16), Vec::new());
        loop {
            let n = match up_r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            out.clear();
            let fed = framer.feed(&buf[..n], &mut out, &mut hits);
            for cap in hits.drain(..) {
                on_cap(cap);
            }
            if down_w.write_all(&out).await.is_err() || fed.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = to_worker => {}
        _ = from_worker => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framer(max_frame: usize, max_frames: usize) -> Framer {
        Framer::new(WireLimits {
            max_frame_bytes: max_frame,
            max_message_frames: max_frames,
            max_message_bytes: 4 * max_frame,
            ..WireLimits::default()
        })
    }

    fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
        let mut v = if body.len() > 255 || flags & LONG != 0 {
            let mut v = vec![flags | LONG];
            v.extend_from_slice(&(body.len() as u64).to_be_bytes());
            v
        } else {
            vec![flags, body.len() as u8]
        };
        v.extend_from_slice(body);
        v
    }

    fn run(f: &mut Framer, input: &[u8], step: usize) -> (Vec<u8>, Vec<Cap>, bool) {
        let (mut out, mut hits) = (Vec::new(), Vec::new());
        let mut ok = true;
        for chunk in input.chunks(step) {
            ok &= f.feed(chunk, &mut out, &mut hits).is_ok();
        }
        (out, hits, ok)
    }

    #[test]
    fn small_frames_pass_unchanged_whatever_the_read_sizes() {
        let mut input = vec![0xFF; GREETING];
        input.extend(frame(COMMAND, b"\x05READY"));
        input.extend(frame(MORE, b"topic"));
        input.extend(frame(MORE | LONG, &7u64.to_be_bytes()));
        input.extend(frame(0, &[9; 300]));
        for step in [1, 3, 64, 1000] {
            let (out, hits, ok) = run(&mut framer(1000, 4), &input, step);
            assert!(ok && hits.is_empty());
            assert_eq!(out, input, "read size {step}");
        }
    }

    #[test]
    fn a_long_frame_becomes_empty_and_its_body_is_skipped() {
        let mut input = vec![0xFF; GREETING];
        input.extend(frame(MORE, b"t"));
        input.extend(frame(0, &[1; 5000]));
        input.extend(frame(0, b"next"));
        let (out, hits, ok) = run(&mut framer(1000, 4), &input, 700);
        assert!(ok);
        assert_eq!(hits, vec![Cap::FrameBytes]);
        let mut want = vec![0xFF; GREETING];
        want.extend(frame(MORE, b"t"));
        want.extend([0, 0]);
        want.extend(frame(0, b"next"));
        assert_eq!(out, want);
    }

    #[test]
    fn a_huge_announced_length_costs_nothing() {
        let mut f = framer(1000, 4);
        let mut input = vec![0xFF; GREETING];
        input.push(LONG);
        input.extend_from_slice(&(1u64 << 62).to_be_bytes());
        input.extend_from_slice(&[0; 100]);
        let (out, hits, ok) = run(&mut f, &input, 4096);
        assert!(ok);
        assert_eq!(hits, vec![Cap::FrameBytes]);
        assert_eq!(out.len(), GREETING + 2);
    }

    #[test]
    fn too_many_frames_and_long_commands() {
        let mut input = vec![0xFF; GREETING];
        for _ in 0..10 {
            input.extend(frame(MORE, b"x"));
        }
        input.extend(frame(0, b"end"));
        let (out, hits, ok) = run(&mut framer(1000, 3), &input, 5);
        assert!(ok);
        assert_eq!(hits, vec![Cap::MessageFrames]);
        let mut want = vec![0xFF; GREETING];
        for _ in 0..3 {
            want.extend(frame(MORE, b"x"));
        }
        want.extend(frame(0, b"end"));
        assert_eq!(out, want);
        let mut input = vec![0xFF; GREETING];
        input.extend(frame(COMMAND, &[0; 2000]));
        let (_, hits, ok) = run(&mut framer(1000, 3), &input, 5000);
        assert!(!ok);
        assert_eq!(hits, vec![Cap::FrameBytes]);
    }

    #[test]
    fn frames_past_the_message_cap_are_emptied() {
        // Frames of 600 bytes under a 1000-byte frame cap, 4000 bytes per message: each
        // message passes six whole frames, the rest go on empty, and the next message starts
        // afresh.
        let mut input = vec![0xFF; GREETING];
        for _ in 0..2 {
            for _ in 0..9 {
                input.extend(frame(MORE, &[5; 600]));
            }
            input.extend(frame(0, &[6; 600]));
        }
        let (out, hits, ok) = run(&mut framer(1000, 16), &input, 333);
        assert!(ok);
        assert_eq!(hits, vec![Cap::MessageBytes, Cap::MessageBytes]);
        let mut want = vec![0xFF; GREETING];
        for _ in 0..2 {
            for _ in 0..6 {
                want.extend(frame(MORE, &[5; 600]));
            }
            for _ in 0..3 {
                want.extend([MORE, 0]);
            }
            want.extend([0, 0]);
        }
        assert_eq!(out, want);
    }
}
