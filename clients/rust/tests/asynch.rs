//! The async limiter (tokio, on a `ConnectionManager`) against real servers: the module's
//! replies, the Lua path, all or nothing, an outage with each policy and the way back, the
//! deadline on a stopped server, and the shield.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::{slow, Server};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_rl_client::{AsyncLimiter, Limit, OnError, Options, Path, Source};

async fn manager(server: &Server) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)))
        .set_number_of_retries(1);
    server
        .client()
        .get_connection_manager_with_config(config)
        .await
        .expect("connection manager")
}

async fn limiter(server: &Server, options: Options) -> AsyncLimiter<ConnectionManager> {
    AsyncLimiter::new(
        manager(server).await,
        options.timeout(Duration::from_millis(500)),
    )
}

/// `Limit::per` is sent as N/S and decides the same on the module, the Lua script and the
/// `Local` policy: 100 a minute, then the 101st waits for 0.6 s (less the calls' time);
/// `acquire_all` and `refund` take it too.
#[tokio::test(flavor = "current_thread")]
async fn a_limit_per_minute_decides_alike_everywhere() {
    let per_minute = Limit::per(100, Duration::from_secs(60)).unwrap();
    // Slow enough that no tenth refills while the test runs.
    let tenths = Limit::per(3, Duration::from_secs(10_000))
        .unwrap()
        .with_capacity(0.3)
        .unwrap();
    for module in [true, false] {
        let server = Server::new(module);
        let limiter = limiter(&server, Options::new(OnError::Closed)).await;
        let started = Instant::now();
        for remaining in (0..100).rev() {
            let d = limiter.acquire("m", &per_minute, 1.0).await.unwrap();
            assert_eq!(
                (d.allowed, d.remaining),
                (true, remaining),
                "module {module}"
            );
        }
        let denied = limiter.acquire("m", &per_minute, 1.0).await.unwrap();
        let took_ms = i64::try_from(started.elapsed().as_millis()).unwrap();
        assert!(!denied.allowed, "module {module}: {denied:?}");
        assert!(
            denied.retry_after_ms <= 600 && denied.retry_after_ms >= 600 - took_ms - 1,
            "module {module}: {denied:?}"
        );
        // Three tenths of a token, a tenth at a time: exactly three fit, and a refunded tenth
        // fits again.
        let items = [("{t}:a", tenths, 0.1), ("{t}:a", tenths, 0.1)];
        assert!(limiter.acquire_all(&items).await.unwrap().allowed);
        let mut allowed = Vec::new();
        for refund_first in [false, false, true] {
            if refund_first {
                limiter.refund("{t}:a", &tenths, 0.1).await.unwrap();
            }
            allowed.push(
                limiter
                    .acquire("{t}:a", &tenths, 0.1)
                    .await
                    .unwrap()
                    .allowed,
            );
        }
        assert_eq!(allowed, [true, false, true], "module {module}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn module_and_lua_paths_decide_alike() {
    for module in [true, false] {
        let server = Server::new(module);
        let limiter = limiter(&server, Options::new(OnError::Closed)).await;
        let expect = if module { Source::Redis } else { Source::Lua };
        for remaining in (0..5).rev() {
            let d = limiter.acquire("k", &slow(), 1.0).await.unwrap();
            assert_eq!(
                (d.allowed, d.remaining, d.source),
                (true, remaining, expect)
            );
        }
        let denied = limiter.acquire("k", &slow(), 1.0).await.unwrap();
        assert!(
            !denied.allowed && denied.retry_after_ms > 990_000,
            "{denied:?}"
        );
        assert!(limiter.peek("k", &slow(), 0.0).await.unwrap().allowed);
        assert_eq!(
            limiter.refund("k", &slow(), 2.0).await.unwrap().remaining,
            2
        );
        let items = [
            ("{u}:a", slow(), 2.0),
            ("{u}:b", Limit::new(0.001, 1.0).unwrap(), 1.0),
        ];
        assert!(limiter.acquire_all(&items).await.unwrap().allowed);
        let refused = limiter.acquire_all(&items).await.unwrap();
        assert_eq!((refused.allowed, refused.refused_index), (false, Some(1)));
        assert_eq!(
            limiter.peek("{u}:a", &slow(), 1.0).await.unwrap().remaining,
            3
        );
        assert_eq!(
            limiter.path(),
            Some(if module { Path::Module } else { Path::Lua })
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_outage_is_decided_by_the_policy_then_redis_again() {
    for on_error in [OnError::Open, OnError::Closed, OnError::Local] {
        let mut server = Server::start();
        let limiter = limiter(
            &server,
            Options::new(on_error)
                .instances(2)
                .probe_interval(Duration::ZERO),
        )
        .await;
        assert_eq!(
            limiter.acquire("warm", &slow(), 1.0).await.unwrap().source,
            Source::Redis
        );
        server.kill();
        let limit = Limit::new(0.001, 4.0).unwrap();
        let mut down = Vec::new();
        for _ in 0..4 {
            down.push(limiter.acquire("k", &limit, 1.0).await.unwrap());
        }
        let sources: Vec<Source> = down.iter().map(|d| d.source).collect();
        let allowed: Vec<bool> = down.iter().map(|d| d.allowed).collect();
        match on_error {
            OnError::Open => assert_eq!((sources[0], allowed), (Source::Open, vec![true; 4])),
            OnError::Closed => assert_eq!((sources[0], allowed), (Source::Closed, vec![false; 4])),
            OnError::Local => assert_eq!(
                (sources[0], allowed),
                (Source::Local, vec![true, true, false, false])
            ),
        }
        assert!(sources.iter().all(|s| *s == sources[0]));
        assert_eq!(
            (
                limiter.counters().without_redis(),
                limiter.counters().outages
            ),
            (4, 1)
        );
        server.restart();
        // The manager reconnects in the background; decisions return to Redis.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let d = limiter.acquire("k", &limit, 1.0).await.unwrap();
            if d.source == Source::Redis {
                assert_eq!(d.remaining, 3, "the restarted server's bucket was full");
                break;
            }
            assert!(Instant::now() < deadline, "never back to Redis: {d:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(limiter.counters().outages, 1);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_stopped_server_times_out_into_the_policy() {
    let server = Server::start();
    let limiter = AsyncLimiter::new(
        manager(&server).await,
        Options::new(OnError::Open)
            .timeout(Duration::from_millis(100))
            .probe_interval(Duration::ZERO),
    );
    assert_eq!(
        limiter.acquire("k", &slow(), 1.0).await.unwrap().source,
        Source::Redis
    );
    let pid = server.pid().expect("running").to_string();
    let signal = |name: &str| {
        std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap()
    };
    assert!(signal("-STOP").success());
    let started = Instant::now();
    let d = limiter.acquire("k", &slow(), 1.0).await.unwrap();
    let took = started.elapsed();
    assert!(signal("-CONT").success());
    assert_eq!(d.source, Source::Open);
    assert!(took < Duration::from_secs(1), "the deadline held: {took:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_shield_keeps_a_hot_key_off_the_server() {
    let server = Server::start();
    let limiter = limiter(&server, Options::new(OnError::Closed).deny_cache(true)).await;
    let limit = Limit::new(0.001, 1.0).unwrap();
    limiter.acquire("hot", &limit, 1.0).await.unwrap();
    for _ in 0..100 {
        assert!(!limiter.acquire("hot", &limit, 1.0).await.unwrap().allowed);
    }
    assert_eq!(server.calls("RL.ACQUIRE"), 2);
    assert_eq!(limiter.counters().cache, 99);
}

/// Both limiters can be shared across threads, and the async calls can be spawned on a
/// multi-threaded runtime (their futures are Send). A compile-time check.
#[allow(dead_code)]
fn limiters_are_send_and_sync(limiter: AsyncLimiter<ConnectionManager>, limit: Limit) {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: T) {}
    send_sync(&limiter);
    send_sync(&redis_rl_client::Limiter::new(
        redis::Client::open("redis://127.0.0.1/").unwrap(),
        Options::new(OnError::Open),
    ));
    send(async move {
        let _ = limiter.acquire("k", &limit, 1.0).await;
        let _ = limiter.acquire_all(&[("k", limit, 1.0)]).await;
        let _ = limiter.refund("k", &limit, 1.0).await;
    });
}
