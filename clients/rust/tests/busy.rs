//! Busy is not down: 10,000 concurrent calls on one async limiter, cold (built with
//! `AsyncLimiter::connect`, nothing connected or detected yet) and warm, under each policy,
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
    // The first calls shared one detection of the module rather than sending one each.
    assert_eq!(server.calls("command|info"), 1, "{on_error:?} warm={warm}");
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
