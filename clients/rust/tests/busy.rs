//! Busy is not down: 10,000 concurrent calls on one async limiter, cold (built with
//! `AsyncLimiter::connect`, nothing connected or found yet) and warm, under each policy,
//! with the default deadline, are all answered by the module, each token given once, and no
//! policy decides, with the default deadline (`DEFAULT_TIMEOUT`, 2 s; at 50 ms, the default
//! before, many of these calls were decided by the policy). A queue of calls on one
//! connection, a connection still opening and slow replies under load are not an outage.

#![cfg(test)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::Server;
use redis_rl_client::{AsyncLimiter, Limit, OnError, Options, Source};

const CALLS: usize = 10_000;
const KEYS: usize = 100;

async fn flood(on_error: OnError, warm: bool) {
    let server = Server::start();
    let limiter = Arc::new(AsyncLimiter::connect(server.client(), Options::new(on_error)).unwrap());
    // Slow enough that nothing refills during the test; each key holds exactly its share.
    let limit = Limit::new(0.000001, (CALLS / KEYS) as f64).unwrap();
    if warm {
        let d = limiter.acquire("warm", &limit, 1.0).await.unwrap();
        assert_eq!(d.source, Source::Redis);
    }
    let tasks: Vec<_> = (0..CALLS)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let key = format!("busy:{}", i % KEYS);
                let d = limiter.acquire(&key, &limit, 1.0).await.unwrap();
                (key, d)
            })
        })
        .collect();
    let mut remaining: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for task in tasks {
        let (key, d) = task.await.unwrap();
        assert_eq!(
            (d.source, d.allowed),
            (Source::Redis, true),
            "{on_error:?} warm={warm}: {d:?}"
        );
        remaining.entry(key).or_default().push(d.remaining);
    }
    // Each key's tokens were given once each: remaining 0 … 99, each seen once.
    for (key, mut seen) in remaining {
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..(CALLS / KEYS) as u64).collect::<Vec<_>>(),
            "{key}"
        );
    }
    let counters = limiter.counters();
    assert_eq!(
        counters.without_redis(),
        0,
        "{on_error:?} warm={warm}: {counters:?}"
    );
    assert_eq!(counters.outages, 0, "{on_error:?} warm={warm}");
    assert_eq!(counters.redis, (CALLS + usize::from(warm)) as u64);
    // The path is found by the first call itself (its RL.ACQUIRE), while the others wait for
    // it: no probe, no other path tried, one RL.ACQUIRE per decision.
    assert_eq!(server.calls("command|info"), 0, "{on_error:?} warm={warm}");
    assert_eq!(server.calls("fcall_ro") + server.calls("evalsha"), 0);
    assert_eq!(server.calls("RL.ACQUIRE"), counters.redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_cold_calls_are_answered_by_the_module_under_each_policy() {
    for on_error in [OnError::Open, OnError::Closed, OnError::Local] {
        flood(on_error, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_warm_calls_are_answered_by_the_module_under_each_policy() {
    for on_error in [OnError::Open, OnError::Closed, OnError::Local] {
        flood(on_error, true).await;
    }
}

/// Connects to a real server, but only once the test opens the gate: a call holds the
/// blocking limiter's connection for as long as the test likes, with no timing involved.
struct Gated {
    client: redis::Client,
    open: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    entered: std::sync::mpsc::Sender<()>,
}

impl redis_rl_client::Connect for Gated {
    type Connection = redis::Connection;

    fn connect(&self, timeout: std::time::Duration) -> redis::RedisResult<redis::Connection> {
        let _ = self.entered.send(());
        let (lock, opened) = &*self.open;
        let mut open = lock.lock().unwrap();
        while !*open {
            open = opened.wait(open).unwrap();
        }
        drop(open);
        redis_rl_client::Connect::connect(&self.client, timeout)
    }
}

/// A blocking limiter's calls take turns on its one connection; a call whose turn does not
/// come within the deadline is decided by the policy then, not after every call ahead of it.
/// (Before, it waited on the connection's lock for as long as the call holding it took.)
#[test]
fn a_blocking_call_waits_for_its_turn_at_most_the_deadline() {
    use std::sync::mpsc;
    use std::time::Duration;

    let server = Server::start();
    let open = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let (entered, in_connect) = mpsc::channel();
    let limiter = Arc::new(redis_rl_client::Limiter::new(
        Gated {
            client: server.client(),
            open: open.clone(),
            entered,
        },
        Options::new(OnError::Closed).timeout(Duration::from_millis(200)),
    ));
    let limit = Limit::new(0.001, 5.0).unwrap();
    let first = {
        let limiter = limiter.clone();
        std::thread::spawn(move || limiter.acquire("first", &limit, 1.0).unwrap())
    };
    in_connect.recv().unwrap(); // the first call holds the connection, connecting
    let (done, second) = mpsc::channel();
    {
        let limiter = limiter.clone();
        std::thread::spawn(move || {
            let _ = done.send(limiter.acquire("second", &limit, 1.0).unwrap());
        });
    }
    // The first call is still held: the second must be answered without it. (A generous
    // bound on a liveness check, not a measured duration: before, it never came.)
    let d = second
        .recv_timeout(Duration::from_secs(30))
        .expect("the second call waited past its deadline for the connection");
    assert_eq!((d.allowed, d.source), (false, Source::Closed));
    // Busy, not down: counted apart, and no outage began.
    let counters = limiter.counters();
    assert_eq!((counters.busy, counters.outages), (1, 0));
    let (lock, opened) = &*open;
    *lock.lock().unwrap() = true;
    opened.notify_all();
    let d = first.join().unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Redis));
    // The connection is free again, and the next call gets it.
    let d = limiter.acquire("third", &limit, 1.0).unwrap();
    assert_eq!(d.source, Source::Redis);
}
