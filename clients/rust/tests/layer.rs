//! The tower Layer in a real axum app served on a real socket (127.0.0.1:0), requests sent
//! as raw HTTP/1.1: against the module, the Lua fallback (a plain server) and an outage (a
//! dead port). Exact counts, header fields and problem+json bodies. Needs `--features tower`.

#![cfg(test)]

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use common::Server;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_rl_client::layer::RateLimitLayer;
use redis_rl_client::{AsyncLimiter, Limit, OnError, Options, Path};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 3 of burst, one more each 100 s: no refill while a test runs.
fn limit() -> Limit {
    Limit::new(0.01, 3.0).unwrap()
}

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Reply {
    fn rate_headers(&self) -> HashMap<String, String> {
        self.headers
            .iter()
            .filter(|(k, _)| k.contains("ratelimit") || *k == "retry-after")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

fn expected(remaining: u64, reset_s: u64, legacy: bool) -> HashMap<String, String> {
    let mut h = HashMap::from([
        (
            "ratelimit-policy".to_string(),
            "\"default\";q=3;w=300".to_string(),
        ),
        (
            "ratelimit".to_string(),
            format!("\"default\";r={remaining};t={reset_s}"),
        ),
    ]);
    if legacy {
        h.insert("x-ratelimit-limit".into(), "3".into());
        h.insert("x-ratelimit-remaining".into(), remaining.to_string());
        h.insert("x-ratelimit-reset".into(), reset_s.to_string());
    }
    h
}

/// One GET on a fresh connection, as raw HTTP/1.1.
async fn get_once(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

async fn limiter(port: u16, on_error: OnError) -> Arc<AsyncLimiter<ConnectionManager>> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)))
        .set_number_of_retries(0);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let connection = client
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    Arc::new(AsyncLimiter::new(
        connection,
        Options::new(on_error)
            .timeout(Duration::from_millis(500))
            .probe_interval(Duration::ZERO),
    ))
}

fn axum_peer(parts: &http::request::Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// Serves `layer` around two routes on 127.0.0.1:0; returns the address.
async fn serve(layer: RateLimitLayer<ConnectionManager>) -> SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer.peer(axum_peer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

async fn four(addr: SocketAddr, headers: &[(&str, &str)]) -> Vec<Reply> {
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(get_once(addr, "/", headers).await);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_allowed_then_a_problem_429_on_module_and_lua() {
    for module in [true, false] {
        let server = Server::new(module);
        let limiter = limiter(server.port, OnError::Closed).await;
        let addr = serve(RateLimitLayer::new(limiter.clone(), limit())).await;
        let got = four(addr, &[]).await;
        let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [200, 200, 200, 429]);
        assert_eq!(got[0].body, "hello");
        assert_eq!(got[0].rate_headers(), expected(2, 100, true));
        assert_eq!(got[2].rate_headers(), expected(0, 300, true));
        let mut denied = expected(0, 300, true);
        denied.insert("retry-after".into(), "100".into());
        assert_eq!(got[3].rate_headers(), denied);
        assert_eq!(got[3].headers["content-type"], "application/problem+json");
        assert_eq!(
            got[3].body,
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Rate limit exceeded; retry after 100 s."}"#
        );
        let path = if module { Path::Module } else { Path::Lua };
        assert_eq!(limiter.path(), Some(path));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_key_cost_skip_custom_response_and_trusted_proxies() {
    let server = Server::start();
    let limiter = limiter(server.port, OnError::Closed).await;
    let layer = RateLimitLayer::new(limiter.clone(), limit())
        .key_header(http::HeaderName::from_static("x-api-key"))
        .cost(|_| 2.0)
        .skip(|parts| parts.uri.path() == "/health")
        .legacy_headers(false)
        .on_limited(|d, _| {
            http::Response::builder()
                .status(429)
                .body(format!("slow down, {} ms", d.retry_after_ms > 0))
                .unwrap()
        });
    let addr = serve(layer).await;
    let first = get_once(addr, "/", &[("X-Api-Key", "alice")]).await;
    assert_eq!(first.rate_headers(), expected(1, 200, false));
    let second = get_once(addr, "/", &[("X-Api-Key", "alice")]).await;
    assert_eq!(
        (second.status, second.body.as_str()),
        (429, "slow down, true ms")
    );
    assert_eq!(second.headers["retry-after"], "100");
    assert_eq!(
        get_once(addr, "/", &[("X-Api-Key", "bob")]).await.status,
        200
    );
    for _ in 0..3 {
        let health = get_once(addr, "/health", &[("X-Api-Key", "alice")]).await;
        assert_eq!(
            (health.status, health.rate_headers()),
            (200, HashMap::new())
        );
    }

    // The test's socket comes from 127.0.0.1: untrusted first, then a trusted proxy.
    let direct = serve(RateLimitLayer::new(limiter.clone(), limit()).prefix("a:")).await;
    for i in 0..3 {
        let xff = format!("198.51.100.{i}");
        get_once(direct, "/", &[("X-Forwarded-For", &xff)]).await;
    }
    let r = get_once(direct, "/", &[("X-Forwarded-For", "198.51.100.9")]).await;
    assert_eq!(r.status, 429);
    let proxied = serve(
        RateLimitLayer::new(limiter.clone(), limit())
            .prefix("b:")
            .trusted_proxies([
                ("127.0.0.0".parse().unwrap(), 8),
                ("10.0.0.0".parse().unwrap(), 8),
            ]),
    )
    .await;
    let r = get_once(
        proxied,
        "/",
        &[("X-Forwarded-For", "203.0.113.5, 198.51.100.9, 10.1.1.1")],
    )
    .await;
    assert_eq!(r.headers["ratelimit"], "\"default\";r=2;t=100");
    let r = get_once(proxied, "/", &[("X-Forwarded-For", "198.51.100.9")]).await;
    assert_eq!(r.headers["ratelimit"], "\"default\";r=1;t=200");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("b:*")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(keys, ["b:ip:198.51.100.9"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_decided_by_the_failure_policy() {
    let mut server = Server::start();
    let closed = limiter(server.port, OnError::Closed).await;
    let open = limiter(server.port, OnError::Open).await;
    let local = limiter(server.port, OnError::Local).await;
    server.kill();
    let r = get_once(serve(RateLimitLayer::new(closed, limit())).await, "/", &[]).await;
    assert_eq!((r.status, r.headers["retry-after"].as_str()), (429, "1"));
    assert_eq!(r.headers["ratelimit"], "\"default\";r=0;t=0");
    let r = get_once(serve(RateLimitLayer::new(open, limit())).await, "/", &[]).await;
    assert_eq!((r.status, r.rate_headers()), (200, HashMap::new()));
    let got = four(serve(RateLimitLayer::new(local, limit())).await, &[]).await;
    let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(got[1].rate_headers(), expected(1, 200, true));
}
