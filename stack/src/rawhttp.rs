//! Clients that send exactly the bytes they are given, for bad-input tests: HTTP/1.1 written
//! straight to a TCP stream, and HTTP/2 with prior knowledge (h2c) from hand-made frames.
//!
//! Why not hyper, h2 or reqwest: they all build requests from the `http` crate's types, and
//! `http::uri::PathAndQuery` refuses a request target that is not UTF-8 (a lone 0xff byte), which
//! is exactly what these tests must send. So the HTTP/2 client here writes its own frames and
//! HPACK literals (never Huffman, never indexed: any byte goes through as is) and decodes the
//! response headers with `loona-hpack` (Huffman and the dynamic table are the decoder's job).
//! One request per connection; good enough for tests, not a general client.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The wire protocol of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Http1,
    /// HTTP/2 over plaintext with prior knowledge.
    H2c,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Http1 => "http/1.1",
            Proto::H2c => "h2c",
        }
    }
}

/// A request as raw bytes. Header names should be lowercase (HTTP/2 requires it).
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub method: Vec<u8>,
    pub path: Vec<u8>,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
    /// HTTP/2 only: trailers sent after the body, in a HEADERS frame that ends the stream.
    pub trailers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RawRequest {
    /// A POST of a JSON body to `path`.
    pub fn post(path: impl Into<Vec<u8>>, body: impl Into<Vec<u8>>) -> RawRequest {
        RawRequest {
            method: b"POST".to_vec(),
            path: path.into(),
            headers: vec![(b"content-type".to_vec(), b"application/json".to_vec())],
            body: body.into(),
            trailers: vec![],
        }
    }

    /// A GET of `path`.
    pub fn get(path: impl Into<Vec<u8>>) -> RawRequest {
        RawRequest {
            method: b"GET".to_vec(),
            path: path.into(),
            headers: vec![],
            body: vec![],
            trailers: vec![],
        }
    }

    /// Adds a trailer (HTTP/2: the stream then ends with a trailers HEADERS frame).
    pub fn trailer(mut self, name: &str, value: impl Into<Vec<u8>>) -> RawRequest {
        self.trailers.push((name.as_bytes().to_vec(), value.into()));
        self
    }

    /// Adds a header (any bytes).
    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> RawRequest {
        self.headers.push((name.as_bytes().to_vec(), value.into()));
        self
    }
}

/// A response. Header names are lowercase text; values stay bytes.
#[derive(Debug, Clone, Default)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// HTTP/2: the stream was reset after the response headers (error code).
    pub reset: Option<u32>,
    /// The response ended as the protocol says it should (not cut by a close or a reset).
    pub complete: bool,
}

impl RawResponse {
    /// The first value of header `name`, as lossy text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// `error.code` of an OpenAI-style error body.
    pub fn error_code(&self) -> Option<String> {
        self.json()?["error"]["code"].as_str().map(str::to_owned)
    }
}

/// Sends `req` on a new connection to `addr` and reads the whole response, within `timeout`.
/// An error means no response at all (connection closed or stream reset before any headers).
pub async fn send(
    addr: SocketAddr,
    proto: Proto,
    req: &RawRequest,
    timeout: Duration,
) -> anyhow::Result<RawResponse> {
    let exchange = async {
        match proto {
            Proto::Http1 if !req.trailers.is_empty() => bail!("trailers are HTTP/2 only here"),
            Proto::Http1 => send_h1(addr, req).await,
            Proto::H2c => send_h2(addr, req).await,
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .with_context(|| format!("{}: no complete response within {timeout:?}", proto.name()))?
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1

/// The request head (request line and headers, `connection: close`).
pub fn h1_head(req: &RawRequest) -> Vec<u8> {
    let mut head = Vec::new();
    head.extend_from_slice(&req.method);
    head.push(b' ');
    head.extend_from_slice(&req.path);
    head.extend_from_slice(b" HTTP/1.1\r\nhost: kvroute.test\r\nconnection: close\r\n");
    for (k, v) in &req.headers {
        head.extend_from_slice(k);
        head.extend_from_slice(b": ");
        head.extend_from_slice(v);
        head.extend_from_slice(b"\r\n");
    }
    if !req.body.is_empty() || req.method == b"POST" {
        head.extend_from_slice(format!("content-length: {}\r\n", req.body.len()).as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    head
}

async fn send_h1(addr: SocketAddr, req: &RawRequest) -> anyhow::Result<RawResponse> {
    let tcp = TcpStream::connect(addr).await.context("connecting")?;
    tcp.set_nodelay(true)?;
    let (mut rd, mut wr) = tcp.into_split();
    let head = h1_head(req);
    let body = &req.body;
    // Write and read at once: Envoy may answer (413) and close before the body is all sent.
    // The write half stays open until the response is read: a half-close could end the stream.
    let writer = async move {
        let r = async {
            wr.write_all(&head).await?;
            wr.write_all(body).await
        }
        .await;
        (wr, r)
    };
    let reader = async move {
        let mut buf = Vec::new();
        // A reset after the response (unread body bytes) keeps what was read.
        let r = rd.read_to_end(&mut buf).await;
        (buf, r)
    };
    let ((_wr, _), (buf, read)) = tokio::join!(writer, reader);
    if buf.is_empty() {
        bail!("connection closed without a response ({read:?})");
    }
    parse_h1(&buf)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses one HTTP/1.1 response read to the end of the connection.
pub fn parse_h1(buf: &[u8]) -> anyhow::Result<RawResponse> {
    let end = find(buf, b"\r\n\r\n").context("incomplete response head")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line '{status_line}'"))?;
    let mut out = RawResponse { status, ..Default::default() };
    // Values as bytes: re-slice the raw head per line.
    let mut pos = find(buf, b"\r\n").map_or(end, |p| p + 2);
    while pos < end {
        let line_end = pos + find(&buf[pos..end + 2], b"\r\n").unwrap_or(end - pos);
        let line = &buf[pos..line_end];
        if let Some(colon) = line.iter().position(|b| *b == b':') {
            let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
            let value = line[colon + 1..].trim_ascii().to_vec();
            out.headers.push((name, value));
        }
        pos = line_end + 2;
    }
    let rest = &buf[end + 4..];
    let chunked = out.header("transfer-encoding").is_some_and(|t| t.contains("chunked"));
    out.body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = out.header("content-length").and_then(|n| n.parse::<usize>().ok()) {
        anyhow::ensure!(rest.len() >= n, "body cut: {} of {n} bytes", rest.len());
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    out.complete = true;
    Ok(out)
}

fn dechunk(mut rest: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").context("chunked body cut (size line)")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size '{size_text}'"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        anyhow::ensure!(rest.len() >= size + 2, "chunked body cut (chunk of {size})");
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/2 with prior knowledge

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The one stream of a connection.
const STREAM: u32 = 1;
/// Our receive window, stream and connection: large enough that nothing here needs updates.
const OUR_WINDOW: u32 = 1 << 30;
const MAX_FRAME: usize = 16_384;

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `prefix`-bit prefix, the high bits of the first byte set to `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, mut v: usize) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A literal header field without indexing, new name, no Huffman: the bytes go as they are.
fn hpack_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name);
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// The request's header block: pseudo-headers first, then the request's own.
fn header_block(req: &RawRequest) -> Vec<u8> {
    let mut block = Vec::new();
    hpack_literal(&mut block, b":method", &req.method);
    hpack_literal(&mut block, b":scheme", b"http");
    hpack_literal(&mut block, b":authority", b"kvroute.test");
    hpack_literal(&mut block, b":path", &req.path);
    for (k, v) in &req.headers {
        hpack_literal(&mut block, k, v);
    }
    if !req.body.is_empty() || req.method == b"POST" {
        hpack_literal(&mut block, b"content-length", req.body.len().to_string().as_bytes());
    }
    block
}

async fn read_frame(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<Frame>> {
    loop {
        if buf.len() >= 9 {
            let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
            if buf.len() >= 9 + len {
                let f = Frame {
                    kind: buf[3],
                    flags: buf[4],
                    stream: u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff,
                    payload: buf[9..9 + len].to_vec(),
                };
                buf.drain(..9 + len);
                return Ok(Some(f));
            }
        }
        let mut chunk = [0u8; 65_536];
        let n = rd.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// What the peer has said so far on the connection.
struct H2State {
    decoder: loona_hpack::Decoder<'static>,
    /// Send windows (the peer's receive windows), connection and stream.
    conn_window: i64,
    stream_window: i64,
    peer_initial_window: i64,
    block: Vec<u8>,
    block_ends_stream: bool,
    resp: Option<RawResponse>,
    done: bool,
    why_done: Option<String>,
}

impl H2State {
    fn new() -> H2State {
        H2State {
            decoder: loona_hpack::Decoder::new(),
            conn_window: 65_535,
            stream_window: 65_535,
            peer_initial_window: 65_535,
            block: Vec::new(),
            block_ends_stream: false,
            resp: None,
            done: false,
            why_done: None,
        }
    }

    /// Handles one frame; control replies go to `out`.
    fn on_frame(&mut self, f: Frame, out: &mut Vec<u8>) -> anyhow::Result<()> {
        match f.kind {
            SETTINGS if f.flags & ACK == 0 => {
                for s in f.payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([s[0], s[1]]);
                    let v = i64::from(u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
                    if id == 0x4 {
                        self.stream_window += v - self.peer_initial_window;
                        self.peer_initial_window = v;
                    }
                }
                out.extend(frame(SETTINGS, ACK, 0, &[]));
            }
            PING if f.flags & ACK == 0 => out.extend(frame(PING, ACK, 0, &f.payload)),
            WINDOW_UPDATE if f.payload.len() == 4 => {
                let inc = i64::from(
                    u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]])
                        & 0x7fff_ffff,
                );
                match f.stream {
                    0 => self.conn_window += inc,
                    STREAM => self.stream_window += inc,
                    _ => {}
                }
            }
            GOAWAY if f.payload.len() >= 8 => {
                let last =
                    u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]])
                        & 0x7fff_ffff;
                let code =
                    u32::from_be_bytes([f.payload[4], f.payload[5], f.payload[6], f.payload[7]]);
                if last < STREAM {
                    self.done = true;
                    self.why_done = Some(format!("GOAWAY (error code {code}) before the stream"));
                }
            }
            RST_STREAM if f.stream == STREAM => {
                let code =
                    f.payload.get(..4).map_or(0, |p| u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
                if let Some(r) = self.resp.as_mut() {
                    r.reset = Some(code);
                }
                self.done = true;
                self.why_done = Some(format!("RST_STREAM (error code {code})"));
            }
            HEADERS | CONTINUATION if f.stream == STREAM => {
                let mut p = &f.payload[..];
                if f.kind == HEADERS {
                    if f.flags & PADDED != 0 {
                        let pad = usize::from(*p.first().context("empty padded HEADERS")?);
                        p = p.get(1..p.len().saturating_sub(pad)).context("bad padding")?;
                    }
                    if f.flags & PRIORITY != 0 {
                        p = p.get(5..).context("short HEADERS")?;
                    }
                    self.block_ends_stream = f.flags & END_STREAM != 0;
                }
                self.block.extend_from_slice(p);
                if f.flags & END_HEADERS != 0 {
                    let block = std::mem::take(&mut self.block);
                    let fields =
                        self.decoder.decode(&block).map_err(|e| anyhow!("HPACK: {e:?}"))?;
                    let first = self.resp.is_none();
                    let resp = self.resp.get_or_insert_with(RawResponse::default);
                    for (k, v) in fields {
                        if k == b":status" {
                            resp.status = String::from_utf8_lossy(&v).parse().unwrap_or(0);
                        } else if !k.starts_with(b":") {
                            resp.headers.push((String::from_utf8_lossy(&k).into_owned(), v));
                        }
                    }
                    // 1xx headers come before the real ones.
                    if first && (100..200).contains(&resp.status) {
                        self.resp = None;
                    }
                    if self.block_ends_stream {
                        if let Some(r) = self.resp.as_mut() {
                            r.complete = true;
                        }
                        self.done = true;
                    }
                }
            }
            DATA if f.stream == STREAM => {
                let mut p = &f.payload[..];
                if f.flags & PADDED != 0 {
                    let pad = usize::from(*p.first().context("empty padded DATA")?);
                    p = p.get(1..p.len().saturating_sub(pad)).context("bad padding")?;
                }
                let resp = self.resp.as_mut().context("DATA before HEADERS")?;
                resp.body.extend_from_slice(p);
                if !f.payload.is_empty() {
                    // Give the window back, so long streams never stall on it.
                    let inc = (f.payload.len() as u32).to_be_bytes();
                    out.extend(frame(WINDOW_UPDATE, 0, 0, &inc));
                    out.extend(frame(WINDOW_UPDATE, 0, STREAM, &inc));
                }
                if f.flags & END_STREAM != 0 {
                    resp.complete = true;
                    self.done = true;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

async fn send_h2(addr: SocketAddr, req: &RawRequest) -> anyhow::Result<RawResponse> {
    let tcp = TcpStream::connect(addr).await.context("connecting")?;
    tcp.set_nodelay(true)?;
    let (mut rd, mut wr) = tcp.into_split();
    // Frames are read by a task of their own, so our receive buffer never fills while we write.
    let (tx, mut rx) = mpsc::unbounded_channel::<Frame>();
    let reader = tokio::spawn(async move {
        let mut buf = Vec::new();
        while let Ok(Some(f)) = read_frame(&mut rd, &mut buf).await {
            if tx.send(f).is_err() {
                break;
            }
        }
    });
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _reader = AbortOnDrop(reader);

    let mut start = PREFACE.to_vec();
    let mut settings = Vec::new();
    settings.extend_from_slice(&2u16.to_be_bytes()); // ENABLE_PUSH = 0
    settings.extend_from_slice(&0u32.to_be_bytes());
    settings.extend_from_slice(&4u16.to_be_bytes()); // INITIAL_WINDOW_SIZE
    settings.extend_from_slice(&OUR_WINDOW.to_be_bytes());
    start.extend(frame(SETTINGS, 0, 0, &settings));
    start.extend(frame(WINDOW_UPDATE, 0, 0, &(OUR_WINDOW - 65_535).to_be_bytes()));
    let block = header_block(req);
    anyhow::ensure!(block.len() <= MAX_FRAME, "header block too large for one frame");
    // With trailers, the stream ends with their HEADERS frame, not with the body.
    let ends_with_body = req.trailers.is_empty();
    let flags = END_HEADERS | if req.body.is_empty() && ends_with_body { END_STREAM } else { 0 };
    start.extend(frame(HEADERS, flags, STREAM, &block));
    wr.write_all(&start).await.context("writing the request head")?;

    let mut st = H2State::new();
    let mut out = Vec::new();
    let mut sent = 0;
    // The body, within the peer's flow-control windows; stop early if the stream is answered
    // (e.g. 413) or reset.
    while sent < req.body.len() && !st.done && st.resp.is_none() {
        while let Ok(f) = rx.try_recv() {
            st.on_frame(f, &mut out)?;
        }
        if !out.is_empty() {
            wr.write_all(&out).await?;
            out.clear();
        }
        let window = st.conn_window.min(st.stream_window);
        if window <= 0 {
            match rx.recv().await {
                Some(f) => st.on_frame(f, &mut out)?,
                None => bail!("connection closed while sending the body ({sent} bytes sent)"),
            }
            continue;
        }
        let n = (window as usize).min(MAX_FRAME).min(req.body.len() - sent);
        let last = sent + n == req.body.len() && ends_with_body;
        let data =
            frame(DATA, if last { END_STREAM } else { 0 }, STREAM, &req.body[sent..sent + n]);
        if wr.write_all(&data).await.is_err() {
            break; // the peer closed; read what it said
        }
        sent += n;
        st.conn_window -= n as i64;
        st.stream_window -= n as i64;
    }
    if !ends_with_body && !st.done && st.resp.is_none() {
        let mut block = Vec::new();
        for (k, v) in &req.trailers {
            hpack_literal(&mut block, k, v);
        }
        anyhow::ensure!(block.len() <= MAX_FRAME, "trailer block too large for one frame");
        wr.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, STREAM, &block))
            .await
            .context("writing the trailers")?;
    }
    while !st.done {
        if !out.is_empty() {
            // The peer may have closed its read side already; what it sent still counts.
            let _ = wr.write_all(&out).await;
            out.clear();
        }
        match rx.recv().await {
            Some(f) => st.on_frame(f, &mut out)?,
            None => {
                st.why_done.get_or_insert_with(|| "connection closed".into());
                break;
            }
        }
    }
    match st.resp {
        Some(r) if r.status != 0 => Ok(r),
        _ => bail!("no response: {}", st.why_done.unwrap_or_else(|| "nothing".into())),
    }
}
