//! `Limiter::wait` and `AsyncLimiter::wait` against real servers: 20 waiters on 5 tokens/s
//! take turns at the bucket's rate, the timeout, "never" at once, a dropped wait holding no
//! token (checked with RL.PEEK, also when its take was in flight), the Lua path, and an
//! outage decided by the failure policy.

#![cfg(test)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{slow, Server};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_rl_client::{AsyncLimiter, Limit, Limiter, OnError, Options, Source, WaitError};

/// Scheduling delay allowed on a loaded machine, in the contention test's upper bounds only.
fn slack() -> Duration {
    let ms = std::env::var("RL_WAIT_SLACK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    Duration::from_millis(ms)
}

async fn shared(server: &Server, options: Options) -> Arc<AsyncLimiter<ConnectionManager>> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(1);
    let connection = server
        .client()
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    Arc::new(AsyncLimiter::new(
        connection,
        options.timeout(Duration::from_secs(5)),
    ))
}

fn peek_remaining(server: &Server, key: &str, rate: &str, capacity: &str) -> i64 {
    let reply: Vec<i64> = redis::cmd("RL.PEEK")
        .arg(key)
        .arg(rate)
        .arg(capacity)
        .arg(0)
        .query(&mut server.conn())
        .unwrap();
    reply[1]
}

fn signal(server: &Server, name: &str) {
    let status = std::process::Command::new("kill")
        .args([name, &server.pid().expect("running").to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_waiters_on_five_per_second_take_turns_at_the_rate() {
    let server = Server::start();
    let limiter = shared(&server, Options::new(OnError::Closed)).await;
    let five = Limit::new(5.0, 1.0).unwrap(); // one token every 200 ms, no burst
    let start = Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let d = limiter.wait("vendor", &five, 1.0, None).await.unwrap();
                (start.elapsed(), d)
            })
        })
        .collect();
    let mut times = Vec::new();
    for task in tasks {
        let (took, d) = task.await.unwrap();
        assert!(d.allowed && d.source == Source::Redis, "{d:?}");
        times.push(took);
    }
    times.sort();
    // The bound: by any moment t after the start, at most 1 + 5 t tokens (1 ms: the clock's
    // resolution in the module's replies).
    for (i, t) in times.iter().enumerate() {
        let earliest =
            Duration::from_millis(200 * i as u64).saturating_sub(Duration::from_millis(1));
        assert!(*t >= earliest, "token {i} at {t:?} came early");
    }
    // No idle gap longer than a retry interval (200 ms + 10% jitter), plus slack() for a
    // loaded machine's scheduling (the times are read after the reply).
    let interval = Duration::from_millis(222);
    for pair in times.windows(2) {
        assert!(pair[1] - pair[0] < interval + slack(), "{times:?}");
    }
    assert!(times[19] < interval * 19 + slack(), "{times:?}");
    assert_eq!(peek_remaining(&server, "vendor", "5", "1"), 0);
}

#[test]
fn sync_wait_takes_turns_times_out_and_refuses_never_at_once() {
    for module in [true, false] {
        let server = Server::new(module);
        let limiter = Limiter::new(
            server.client(),
            Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
        );
        let ten = Limit::new(10.0, 1.0).unwrap();
        let start = Instant::now();
        for _ in 0..3 {
            assert!(limiter.wait("k", &ten, 1.0, None).unwrap().allowed);
        }
        assert!(start.elapsed() >= Duration::from_millis(199));
        limiter.acquire("s", &slow(), 5.0).unwrap();
        let start = Instant::now();
        match limiter.wait("s", &slow(), 1.0, Some(Duration::from_millis(300))) {
            Err(WaitError::Timeout(d)) => assert!(!d.allowed && d.retry_after_ms > 900_000),
            other => panic!("{other:?}"),
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(1),
            "{took:?}"
        );
        let start = Instant::now();
        match limiter.wait("s", &slow(), 6.0, None) {
            Err(WaitError::Never(d)) => assert_eq!(d.retry_after_ms, -1),
            other => panic!("{other:?}"),
        }
        assert!(start.elapsed() < Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_holds_no_token() {
    let server = Server::start();
    let limiter = shared(&server, Options::new(OnError::Closed)).await;
    let two = Limit::new(2.0, 1.0).unwrap(); // a token every 500 ms
    limiter.acquire("k", &two, 1.0).await.unwrap();
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        limiter.clone().wait("k", &two, 1.0, None),
    )
    .await;
    assert!(dropped.is_err(), "the wait was cut short");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(peek_remaining(&server, "k", "2", "1"), 1);

    // Paused server: the take is sent, the wait is dropped, then the server says "allowed".
    limiter.peek("k2", &slow(), 0.0).await.unwrap();
    signal(&server, "-STOP");
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        limiter.clone().wait("k2", &slow(), 1.0, None),
    )
    .await;
    signal(&server, "-CONT");
    assert!(dropped.is_err());
    // The refund runs as its own task once the reply arrives.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.calls("rl.refund") == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(peek_remaining(&server, "k2", "0.001", "5"), 5);
    assert_eq!(server.calls("rl.refund"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_decided_by_the_failure_policy() {
    let mut server = Server::start();
    let closed = shared(
        &server,
        Options::new(OnError::Closed).probe_interval(Duration::ZERO),
    )
    .await;
    let local = shared(&server, Options::new(OnError::Local)).await;
    server.kill();
    match closed
        .clone()
        .wait("k", &slow(), 1.0, Some(Duration::from_millis(200)))
        .await
    {
        Err(WaitError::Timeout(d)) => assert_eq!(d.source, Source::Closed),
        other => panic!("{other:?}"),
    }
    let d = local.wait("k", &slow(), 1.0, None).await.unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Local));
}
