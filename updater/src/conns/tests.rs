use super::*;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "0123456789abcdef";

#[test]
fn the_cap_fits_the_open_files_limit() {
    let l = ConnLimits { max_connections: 4096, ..ConnLimits::default() };
    assert_eq!(l.clamped(None).max_connections, 4096);
    assert_eq!(l.clamped(Some(256)).max_connections, 192);
    assert_eq!(l.clamped(Some(1024)).max_connections, 768);
    assert_eq!(l.clamped(Some(100)).max_connections, 50);
    assert_eq!(l.clamped(Some(1)).max_connections, 1);
    assert_eq!(l.clamped(Some(1 << 20)).max_connections, 4096);
    let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                Max processes             63704                63704                processes \n\
                Max open files            256                  4096                 files     \n";
    assert_eq!(parse_nofile(text), Some(256));
    assert_eq!(parse_nofile("Max open files  unlimited unlimited files"), None);
    assert!(nofile_limit().is_some(), "/proc/self/limits is readable on Linux");
}

/// A server with `/status`, a snapshot-like route that needs the token, and a slow route
/// standing for a long poll.
async fn start(limits: ConnLimits) -> (u16, Arc<ConnStats>, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route("/status", get(|| async { "ok" }))
        .route(
            "/v1/snapshot",
            get(|h: axum::http::HeaderMap| async move {
                let ok = h.get(crate::conns::TOKEN_HEADER).is_some_and(|v| v == TOKEN);
                if ok {
                    (axum::http::StatusCode::OK, "snap")
                } else {
                    (axum::http::StatusCode::UNAUTHORIZED, "no")
                }
            }),
        )
        .route(
            "/poll",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(600)).await;
                "late"
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stats = Arc::new(ConnStats::new(&limits, None));
    let s = Arc::clone(&stats);
    let task = tokio::spawn(async move {
        let _ = serve(listener, app, TOKEN, limits, s).await;
    });
    (port, stats, task)
}

/// One request on a connection of its own; the status line's code.
async fn get_on(stream: &mut TcpStream, path: &str, token: bool) -> Option<u16> {
    let auth = if token { format!("x-kvroute-token: {TOKEN}\r\n") } else { String::new() };
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{auth}\r\n");
    stream.write_all(req.as_bytes()).await.ok()?;
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await.ok()?.ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.get(9..12)?.parse().ok()
}

async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).await.unwrap()
}

/// Whether the server closed `stream` (EOF or reset) within `within`.
async fn closed(stream: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(tokio::time::timeout(within, stream.read(&mut b)).await, Ok(Ok(0)) | Ok(Err(_)))
}

#[tokio::test]
async fn partial_requests_and_idle_connections_time_out_long_polls_do_not() {
    let limits = ConnLimits {
        max_connections: 100,
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(400),
    };
    let (port, stats, _task) = start(limits).await;
    let mut partial = connect(port).await;
    partial.write_all(b"GET /status HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let mut silent = connect(port).await;
    let mut kept = connect(port).await;
    assert_eq!(get_on(&mut kept, "/status", false).await, Some(200));
    // A long poll of 600 ms outlives the idle timeout: it is a request in flight.
    let mut poll = connect(port).await;
    assert_eq!(get_on(&mut poll, "/poll", true).await, Some(200));
    assert!(closed(&mut partial, Duration::from_secs(3)).await, "partial request kept open");
    assert!(closed(&mut silent, Duration::from_secs(3)).await, "silent connection kept open");
    assert!(closed(&mut kept, Duration::from_secs(3)).await, "idle connection kept open");
    let s = stats.status();
    assert_eq!(s["shed"]["header_timeout"], 2, "{s}");
    assert!(s["shed"]["idle_timeout"].as_u64() >= Some(1), "{s}");
}

#[tokio::test]
async fn at_the_cap_idle_strangers_go_first_and_the_token_holder_stays() {
    let limits = ConnLimits {
        max_connections: 8,
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
    };
    let (port, stats, _task) = start(limits).await;
    let mut envoy = connect(port).await;
    assert_eq!(get_on(&mut envoy, "/v1/snapshot", true).await, Some(200));
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(connect(port).await);
    }
    // Every new connection made room by closing an older stranger; the Envoy's connection,
    // the oldest of all, is still open and served.
    for _ in 0..3 {
        assert_eq!(get_on(&mut envoy, "/v1/snapshot", true).await, Some(200));
    }
    let mut fresh = connect(port).await;
    assert_eq!(get_on(&mut fresh, "/status", false).await, Some(200));
    assert!(stats.open() <= 8, "{}", stats.status());
    assert!(stats.status()["shed"]["for_room"].as_u64() >= Some(33), "{}", stats.status());
    let mut closed_count = 0;
    for s in &mut idle {
        closed_count += usize::from(closed(s, Duration::from_millis(50)).await);
    }
    assert!(closed_count >= 33, "{closed_count} of 40 strangers closed");
}

#[tokio::test]
async fn when_every_connection_is_busy_new_ones_are_refused() {
    let limits = ConnLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
    };
    let (port, stats, _task) = start(limits).await;
    let mut polls = Vec::new();
    for _ in 0..2 {
        let mut s = connect(port).await;
        s.write_all(b"GET /poll HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        polls.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = connect(port).await;
    assert!(closed(&mut third, Duration::from_secs(2)).await);
    assert_eq!(stats.status()["shed"]["refused"], 1);
    for mut p in polls {
        let mut buf = vec![0u8; 256];
        let n = p.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "a long poll was cut for room");
    }
}
