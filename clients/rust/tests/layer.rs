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
    serve_app(app).await
}

async fn serve_app(app: Router) -> SocketAddr {
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
    // "Closed" knows the configured limit, not what is left: no RateLimit, no remaining, no
    // reset (they would claim an empty bucket full again at once).
    assert_eq!(r.status, 429);
    assert_eq!(
        r.rate_headers(),
        HashMap::from([
            ("ratelimit-policy".into(), "\"default\";q=3;w=300".into()),
            ("x-ratelimit-limit".into(), "3".into()),
            ("retry-after".into(), "1".into()),
        ])
    );
    let r = get_once(serve(RateLimitLayer::new(open, limit())).await, "/", &[]).await;
    assert_eq!((r.status, r.rate_headers()), (200, HashMap::new()));
    let got = four(serve(RateLimitLayer::new(local, limit())).await, &[]).await;
    let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(got[1].rate_headers(), expected(1, 200, true));
}

fn keys(server: &Server, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut server.conn())
        .unwrap();
    keys.sort();
    keys
}

fn header<'a>(parts: &'a http::request::Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_key_cost_and_skip_are_awaited() {
    let server = Server::start();
    let limiter = limiter(server.port, OnError::Closed).await;
    let layer = RateLimitLayer::new(limiter, limit())
        .key_fn_async(|parts| {
            let user = header(parts, "x-user").unwrap_or("anon").to_string();
            async move {
                tokio::task::yield_now().await;
                Some(format!("user:{user}"))
            }
        })
        .cost_async(|parts| {
            let heavy = parts.uri.path() == "/heavy";
            async move {
                tokio::task::yield_now().await;
                if heavy {
                    3.0
                } else {
                    1.0
                }
            }
        })
        .skip_async(|parts| {
            let health = parts.uri.path() == "/health";
            async move {
                tokio::task::yield_now().await;
                health
            }
        });
    let addr = serve(layer).await;
    let got = four(addr, &[("X-User", "alice")]).await;
    let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    for _ in 0..5 {
        assert_eq!(get_once(addr, "/health", &[]).await.status, 200);
    }
    // Cost 3 empties bob's bucket at once (a 404 route, but it was decided first).
    let heavy = get_once(addr, "/heavy", &[("X-User", "bob")]).await;
    assert_eq!(heavy.headers["ratelimit"], "\"default\";r=0;t=300");
    // One bucket per user, in the limit's own key space; nothing for the skipped requests.
    assert_eq!(
        keys(&server, "*"),
        ["rl:http:0.01:3:user:alice", "rl:http:0.01:3:user:bob"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_per_request_sync_and_async() {
    fn plan(parts: &http::request::Parts) -> Limit {
        match header(parts, "x-plan") {
            Some("pro") => Limit::new(0.01, 3.0).unwrap(),
            _ => Limit::new(0.01, 1.0).unwrap(),
        }
    }
    for asynchronous in [false, true] {
        let server = Server::start();
        let limiter = limiter(server.port, OnError::Closed).await;
        let layer = RateLimitLayer::new(limiter, limit())
            .key_header(http::HeaderName::from_static("x-user"));
        let layer = if asynchronous {
            layer.limit_async(|parts| {
                let limit = plan(parts);
                async move { limit }
            })
        } else {
            layer.limit_fn(plan)
        };
        let addr = serve(layer).await;
        let mut free = Vec::new();
        for _ in 0..2 {
            let r = get_once(addr, "/", &[("X-User", "a"), ("X-Plan", "free")]).await;
            free.push(r.status);
        }
        assert_eq!(free, [200, 429], "async: {asynchronous}");
        let pro = four(addr, &[("X-User", "b"), ("X-Plan", "pro")]).await;
        let statuses: Vec<u16> = pro.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [200, 200, 200, 429], "async: {asynchronous}");
        assert_eq!(pro[0].headers["ratelimit-policy"], "\"default\";q=3;w=300");
        assert_eq!(
            keys(&server, "*"),
            ["rl:http:0.01:1:h:a", "rl:http:0.01:3:h:b"]
        );
    }
}

/// Two layers on one route: an outer limit of 3 and an inner one of 5, named "route".
async fn two_layers(
    limiter: Arc<AsyncLimiter<ConnectionManager>>,
    inner: RateLimitLayer<ConnectionManager>,
) -> SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(inner.peer(axum_peer))
        .layer(RateLimitLayer::new(limiter, limit()).peer(axum_peer));
    serve_app(app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_keep_their_own_buckets_and_send_one_set_of_fields() {
    let server = Server::start();
    let limiter = limiter(server.port, OnError::Closed).await;
    let inner =
        RateLimitLayer::new(limiter.clone(), Limit::new(0.01, 5.0).unwrap()).policy_name("route");
    let addr = two_layers(limiter, inner).await;
    let got = four(addr, &[]).await;
    let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    // Both limits as the draft's lists; X-RateLimit-* of the tighter (2 left of 3, not 4 of 5).
    let mut first = expected(2, 100, true);
    first.insert(
        "ratelimit-policy".into(),
        "\"default\";q=3;w=300, \"route\";q=5;w=500".into(),
    );
    first.insert(
        "ratelimit".into(),
        "\"default\";r=2;t=100, \"route\";r=4;t=100".into(),
    );
    assert_eq!(got[0].rate_headers(), first);
    assert_eq!(
        got[2].headers["ratelimit"],
        "\"default\";r=0;t=300, \"route\";r=2;t=300"
    );
    // The outer layer denied before the inner one ran: its fields alone.
    let mut denied = expected(0, 300, true);
    denied.insert("retry-after".into(), "100".into());
    assert_eq!(got[3].rate_headers(), denied);
    // Each limit its own key space: the inner 5 were not spent by the outer layer's takes.
    assert_eq!(
        keys(&server, "*"),
        ["rl:http:0.01:3:ip:127.0.0.1", "rl:http:0.01:5:ip:127.0.0.1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_denial_sends_both_limits_fields() {
    let server = Server::start();
    let limiter = limiter(server.port, OnError::Closed).await;
    let inner = RateLimitLayer::new(limiter.clone(), Limit::new(0.01, 1.0).unwrap())
        .policy_name("route")
        .legacy_headers(false);
    let addr = two_layers(limiter, inner).await;
    assert_eq!(get_once(addr, "/", &[]).await.status, 200);
    let r = get_once(addr, "/", &[]).await;
    assert_eq!(r.status, 429);
    let mut want = expected(1, 200, true);
    want.insert(
        "ratelimit-policy".into(),
        "\"default\";q=3;w=300, \"route\";q=1;w=100".into(),
    );
    // Tightest: the route's 0 left, though its layer writes no X-RateLimit-* of its own.
    want.insert(
        "ratelimit".into(),
        "\"default\";r=1;t=200, \"route\";r=0;t=100".into(),
    );
    want.insert("x-ratelimit-limit".into(), "1".into());
    want.insert("x-ratelimit-remaining".into(), "0".into());
    want.insert("x-ratelimit-reset".into(), "100".into());
    want.insert("retry-after".into(), "100".into());
    assert_eq!(r.rate_headers(), want);
    assert_eq!(r.headers["content-type"], "application/problem+json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_on_one_redis_key_for_a_request_are_refused() {
    let server = Server::start();
    let limiter = limiter(server.port, OnError::Closed).await;
    let addr = two_layers(limiter.clone(), RateLimitLayer::new(limiter, limit())).await;
    let r = get_once(addr, "/", &[]).await;
    assert_eq!(r.status, 500);
    assert!(
        r.body.starts_with(
            "two rate limits use the Redis key \"rl:http:0.01:3:ip:127.0.0.1\" for one request"
        ),
        "{}",
        r.body
    );
    assert!(r.body.ends_with("give each its own prefix"), "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_window_is_exact_where_doubles_are_not() {
    // 21 tokens at 7 per 10 s refill from empty in 30 s exactly; in doubles 21 / 0.7 is
    // 30.000000000000004, which rounded up to w=31.
    let server = Server::start();
    let limiter = limiter(server.port, OnError::Closed).await;
    for (limit, policy) in [
        (Limit::new(0.7, 21.0).unwrap(), "\"default\";q=21;w=30"),
        (
            Limit::per(7, Duration::from_secs(10))
                .unwrap()
                .with_capacity(21.0)
                .unwrap(),
            "\"default\";q=21;w=30",
        ),
        (Limit::new(0.3, 3.0).unwrap(), "\"default\";q=3;w=10"),
        (Limit::new(7.0, 10.0).unwrap(), "\"default\";q=10;w=2"),
    ] {
        let addr = serve(RateLimitLayer::new(limiter.clone(), limit)).await;
        let r = get_once(addr, "/", &[]).await;
        assert_eq!(r.headers["ratelimit-policy"], policy, "{limit:?}");
    }
}
