//! A limiter built while Redis is down: it starts (no live connection needed), its startup
//! check says no path yet instead of failing, each policy decides until Redis comes up, and
//! then the module does. A service that starts before its
//! Redis is covered by its failure policy, as in any later outage.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::{slow, Server};
use redis_rl_client::{AsyncLimiter, Decision, Limiter, OnError, Options, Source};

fn options(on_error: OnError) -> Options {
    Options::new(on_error)
        .timeout(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(20))
}

/// What `on_error` must answer with Redis down.
fn policy(on_error: OnError) -> Source {
    match on_error {
        OnError::Open => Source::Open,
        OnError::Closed => Source::Closed,
        OnError::Local => Source::Local,
    }
}

/// A server with the module that is not running yet, on a port of its own.
fn down() -> Server {
    let mut server = Server::start();
    server.kill();
    server
}

/// Calls `acquire` until the module answers (at most 10 s), and returns that first answer.
fn until_redis(mut acquire: impl FnMut() -> Decision) -> Decision {
    let start = Instant::now();
    loop {
        let d = acquire();
        if d.source == Source::Redis || start.elapsed() > Duration::from_secs(10) {
            return d;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_blocking_limiter_built_while_redis_is_down_decides_by_policy_then_by_the_module() {
    for on_error in [OnError::Open, OnError::Closed, OnError::Local] {
        let mut server = down();
        let limiter = Limiter::new(server.client(), options(on_error));
        // The startup check does not stop a service whose Redis is down: no path yet.
        assert_eq!(limiter.check().unwrap(), None, "{on_error:?}");
        for _ in 0..3 {
            let d = limiter.acquire("boot", &slow(), 1.0).unwrap();
            assert_eq!(d.source, policy(on_error), "{on_error:?}");
        }
        server.restart();
        let d = until_redis(|| limiter.acquire("boot", &slow(), 1.0).unwrap());
        assert_eq!((d.source, d.allowed, d.remaining), (Source::Redis, true, 4));
        let d = limiter.acquire("boot", &slow(), 1.0).unwrap();
        assert_eq!((d.source, d.remaining), (Source::Redis, 3), "{on_error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_limiter_built_while_redis_is_down_decides_by_policy_then_by_the_module() {
    for on_error in [OnError::Open, OnError::Closed, OnError::Local] {
        let mut server = down();
        // Building it needs no connection: nothing listens on the port yet.
        let limiter = AsyncLimiter::connect(server.client(), options(on_error)).unwrap();
        assert_eq!(limiter.check().await.unwrap(), None, "{on_error:?}");
        for _ in 0..3 {
            let d = limiter.acquire("boot", &slow(), 1.0).await.unwrap();
            assert_eq!(d.source, policy(on_error), "{on_error:?}");
        }
        assert_eq!(limiter.counters().without_redis(), 3);
        // The restart waits for the server to answer: a blocking step of the test.
        tokio::task::block_in_place(|| server.restart());
        let start = Instant::now();
        let d = loop {
            let d = limiter.acquire("boot", &slow(), 1.0).await.unwrap();
            if d.source == Source::Redis || start.elapsed() > Duration::from_secs(10) {
                break d;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(
            (d.source, d.allowed, d.remaining),
            (Source::Redis, true, 4),
            "{on_error:?}"
        );
        let d = limiter.acquire("boot", &slow(), 1.0).await.unwrap();
        assert_eq!((d.source, d.remaining), (Source::Redis, 3), "{on_error:?}");
    }
}
