//! Tests for the example API and worker pool against a real server with the module:
//! `cargo test`. REDIS_URL names the server (examples/run.sh starts one); nothing here starts
//! Redis. Keys are unique per run.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_rl_client::{Limit, OnError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn redis_url() -> String {
    std::env::var("REDIS_URL")
        .expect("set REDIS_URL to a server with the module (examples/run.sh does)")
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("rust-example:{name}:{nanos}:")
}

/// One GET as raw HTTP/1.1 on a fresh connection: (status, head, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: example\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_a_burst_then_a_problem_429() {
    let limiter = redis_rl_examples::limiter(&redis_url(), OnError::Closed).unwrap();
    let router = redis_rl_examples::api(limiter, Limit::new(0.001, 3.0).unwrap(), &unique("api"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(redis_rl_examples::serve(listener, router));
    for (remaining, reset) in [(2, 1000), (1, 2000), (0, 3000)] {
        let (status, head, body) = get(addr, "/").await;
        assert_eq!((status, body.as_str()), (200, r#"{"hello":"world"}"#));
        assert!(
            head.contains("ratelimit-policy: \"default\";q=3;w=3000\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!(
                "ratelimit: \"default\";r={remaining};t={reset}\r\n"
            )),
            "{head}"
        );
    }
    let (status, head, body) = get(addr, "/").await;
    assert_eq!(status, 429);
    assert!(
        head.contains("retry-after: 1000\r\n")
            && head.contains("content-type: application/problem+json"),
        "{head}"
    );
    assert!(body.contains("\"status\":429"), "{body}");
    for _ in 0..3 {
        assert_eq!(get(addr, "/health").await.0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_pool_takes_turns_at_the_vendors_rate() {
    let limiter = redis_rl_examples::limiter(&redis_url(), OnError::Closed).unwrap();
    let start = Instant::now();
    let jobs: Vec<u64> = (0..12).collect();
    let results = redis_rl_examples::worker_pool(
        limiter,
        jobs.clone(),
        6,
        Limit::new(20.0, 1.0).unwrap(),
        unique("pool"),
    )
    .await
    .unwrap();
    assert_eq!(results, jobs.iter().map(|j| j * j).collect::<Vec<_>>());
    // 12 calls at 20/s with no burst: the 12th is 11 intervals (550 ms) after the first.
    assert!(start.elapsed() >= Duration::from_millis(549));
}

/// A loopback port nothing listens on: bound, then let go.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("redis://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_starts_and_answers_by_its_policy_while_redis_is_down() {
    for (on_error, want) in [(OnError::Open, 200), (OnError::Closed, 429)] {
        let limiter = redis_rl_examples::limiter(&dead_url(), on_error).unwrap();
        let router = redis_rl_examples::api(limiter, Limit::new(1.0, 5.0).unwrap(), "boot:");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(redis_rl_examples::serve(listener, router));
        for _ in 0..3 {
            assert_eq!(get(addr, "/").await.0, want, "{on_error:?}");
        }
        assert_eq!(get(addr, "/health").await.0, 200);
    }
}
