//! The in-flight layer in a real axum app on a real socket (127.0.0.1:0), against real
//! servers: 200 concurrent requests never run more handlers at once than the limit
//! (measured in the handler) and leave no lease behind, on the module, the script and the
//! Functions library; a streamed body holds its lease
//! until its last chunk; a client that disconnects mid-stream, or before any response, gives
//! its slot back. Needs `--features tower`.

#![cfg(test)]

mod common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::Server;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_rl_client::layer::InFlightLayer;
use redis_rl_client::{load_functions, AsyncLimiter, OnError, Options, Path};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Every request of these tests shares one key.
const KEY: &str = "rl:inflight:test:all";

async fn limiter(server: &Server) -> Arc<AsyncLimiter<ConnectionManager>> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(1000)))
        .set_response_timeout(Some(Duration::from_millis(2000)))
        .set_number_of_retries(1);
    let connection = server
        .client()
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    Arc::new(AsyncLimiter::new(
        connection,
        Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
    ))
}

fn layer(
    limiter: Arc<AsyncLimiter<ConnectionManager>>,
    limit: u32,
) -> InFlightLayer<ConnectionManager> {
    InFlightLayer::new(limiter, limit, Duration::from_secs(30))
        .prefix("rl:inflight:test:")
        .key_fn(|_| Some("all".to_string()))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

fn held(server: &Server) -> i64 {
    let reply: Vec<i64> = redis::cmd("RL.LEASES")
        .arg(KEY)
        .arg(100)
        .query(&mut server.conn())
        .unwrap();
    reply[0]
}

/// Polls RL.LEASES until it is `want` (a dropped lease's release is spawned), at most 3 s.
async fn eventually_held(server: &Server, want: i64) {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let now = held(server);
        if now == want {
            return;
        }
        assert!(Instant::now() < until, "{now} leases held, not {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends a GET and returns the open stream (the response not read yet).
async fn send(addr: SocketAddr, path: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// One GET to the end: the status and the raw response.
async fn get_once(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = send(addr, path).await;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw.split(' ').nth(1).unwrap().parse().unwrap();
    (status, raw)
}

/// 200 concurrent requests through a layer of limit 5 on `limiter`: never more than 5
/// handlers at once (measured in the handler), some limited, and no lease left at the end
/// (counted through the limiter, on whatever path it found).
async fn two_hundred_concurrent_requests(limiter: Arc<AsyncLimiter<ConnectionManager>>) {
    const LIMIT: usize = 5;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), most.clone());
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let (running, most) = (r.clone(), m.clone());
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            }),
        )
        .layer(layer(limiter.clone(), LIMIT as u32));
    let addr = serve(app).await;
    let requests: Vec<_> = (0..200)
        .map(|_| tokio::spawn(async move { get_once(addr, "/").await }))
        .collect();
    let (mut ok, mut limited) = (0, 0);
    for request in requests {
        let (status, raw) = request.await.unwrap();
        match status {
            200 => ok += 1,
            429 => {
                limited += 1;
                assert!(raw.to_ascii_lowercase().contains("retry-after: "), "{raw}");
            }
            other => panic!("status {other}: {raw}"),
        }
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} handlers ran at once, above {LIMIT}");
    assert!(most >= 2, "the requests overlapped: {most}");
    assert_eq!(ok + limited, 200);
    assert!(ok >= LIMIT && limited > 0, "{ok} passed, {limited} limited");
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let count = limiter.leases(KEY, 100).await.unwrap();
        if count.in_use == 0 {
            break;
        }
        assert!(Instant::now() < until, "{} leases left", count.in_use);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_requests_never_exceed_the_limit() {
    let server = Server::start();
    let limiter = limiter(&server).await;
    two_hundred_concurrent_requests(limiter.clone()).await;
    assert_eq!(held(&server), 0);
    assert_eq!(limiter.path(), Some(Path::Module));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_on_the_script_path() {
    let server = Server::plain();
    let limiter = limiter(&server).await;
    two_hundred_concurrent_requests(limiter.clone()).await;
    assert_eq!(limiter.path(), Some(Path::Lua));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_on_the_functions_path() {
    let server = Server::plain();
    load_functions(&mut server.conn()).unwrap();
    let limiter = limiter(&server).await;
    two_hundred_concurrent_requests(limiter.clone()).await;
    assert_eq!(limiter.path(), Some(Path::Functions));
}

/// A body whose chunks come from a channel: it ends when the sender is dropped.
struct Chunks(mpsc::Receiver<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// `/stream` answers a body fed by the test through the channel it hands over on `senders`.
fn streaming_app(senders: mpsc::Sender<mpsc::Sender<Bytes>>) -> Router {
    Router::new().route(
        "/stream",
        get(move || {
            let senders = senders.clone();
            async move {
                let (tx, rx) = mpsc::channel(16);
                senders.send(tx).await.unwrap();
                Body::new(Chunks(rx))
            }
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_holds_its_lease_until_its_last_chunk() {
    let server = Server::start();
    let (senders, mut handed) = mpsc::channel(4);
    let app = streaming_app(senders).layer(layer(limiter(&server).await, 1));
    let addr = serve(app).await;
    let mut stream = send(addr, "/stream").await;
    let chunks = handed.recv().await.unwrap();
    chunks.send(Bytes::from_static(b"first")).await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("first") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    // The handler has returned; its body is still being sent: the slot is taken.
    assert_eq!(held(&server), 1);
    let (status, _) = get_once(addr, "/stream").await;
    assert_eq!(status, 429);
    chunks.send(Bytes::from_static(b"last")).await.unwrap();
    drop(chunks);
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert!(String::from_utf8_lossy(&rest).contains("last"));
    eventually_held(&server, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_gives_its_slot_back() {
    let server = Server::start();
    // Mid-stream: the client goes while chunks keep coming; the connection fails on the next
    // write and the body is dropped.
    let (senders, mut handed) = mpsc::channel(4);
    let app = streaming_app(senders)
        .route(
            "/never",
            get(|| async {
                // Answers only when the request is dropped.
                std::future::pending::<()>().await;
                "never"
            }),
        )
        .layer(layer(limiter(&server).await, 1));
    let addr = serve(app).await;
    let stream = send(addr, "/stream").await;
    let chunks = handed.recv().await.unwrap();
    chunks.send(Bytes::from_static(b"first")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(held(&server), 1);
    drop(stream);
    let feeding = tokio::spawn(async move {
        while chunks.send(Bytes::from_static(b"more")).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    eventually_held(&server, 0).await;
    feeding.abort();

    // Before any response: the request's future is dropped with the connection.
    let stream = send(addr, "/never").await;
    let until = Instant::now() + Duration::from_secs(3);
    while held(&server) != 1 {
        assert!(Instant::now() < until, "the request never took its slot");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(stream);
    eventually_held(&server, 0).await;
}
