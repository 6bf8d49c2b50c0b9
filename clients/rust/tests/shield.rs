//! The deny cache against a real server: calls that reach it counted with INFO commandstats,
//! larger costs cached, smaller costs and refunds sent on, entries ending when retry_after
//! has passed, and the size bound.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{limiter, options, Server};
use redis_rl_client::{Decision, Limit, Limiter, OnError, Source};

fn flood(module: bool, deny_cache: bool, calls: usize) -> (Server, Limiter, Vec<Decision>, u64) {
    let server = Server::new(module);
    let limiter = limiter(&server, options(OnError::Closed).deny_cache(deny_cache));
    let limit = Limit::new(0.001, 1.0).unwrap();
    assert!(limiter.acquire("hot", &limit, 1.0).unwrap().allowed);
    let decisions: Vec<Decision> = (0..calls)
        .map(|_| limiter.acquire("hot", &limit, 1.0).unwrap())
        .collect();
    assert!(decisions.iter().all(|d| !d.allowed));
    let reached = server.calls(if module { "RL.ACQUIRE" } else { "evalsha" });
    (server, limiter, decisions, reached)
}

#[test]
fn a_denied_key_stops_reaching_the_server() {
    for module in [true, false] {
        let (_server, limiter, decisions, reached) = flood(module, true, 200);
        assert_eq!(reached, 2, "module={module}: the take and the first denial");
        assert!(decisions[1..].iter().all(|d| d.source == Source::Cache));
        assert_eq!(limiter.counters().cache, 199);
        assert!(decisions[199].retry_after_ms > 990_000);
    }
}

#[test]
fn without_the_shield_every_call_reaches_the_server() {
    let (_server, limiter, _, reached) = flood(true, false, 200);
    assert_eq!(reached, 201);
    assert_eq!(limiter.counters().cache, 0);
}

#[test]
fn smaller_costs_and_refunds_go_to_redis() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed).deny_cache(true));
    let limit = Limit::new(0.001, 3.0).unwrap();
    assert!(limiter.acquire("k", &limit, 2.0).unwrap().allowed);
    assert_eq!(
        limiter.acquire("k", &limit, 2.0).unwrap().source,
        Source::Redis
    ); // denied: remembered
    assert_eq!(
        limiter.acquire("k", &limit, 3.0).unwrap().source,
        Source::Cache
    ); // larger: cached
    let small = limiter.acquire("k", &limit, 1.0).unwrap(); // smaller: it may fit
    assert_eq!((small.source, small.allowed), (Source::Redis, true));
    limiter.acquire("k", &limit, 1.0).unwrap(); // denied, remembered for cost 1
    assert_eq!(
        limiter.acquire("k", &limit, 1.0).unwrap().source,
        Source::Cache
    );
    limiter.refund("k", &limit, 1.0).unwrap();
    let after = limiter.acquire("k", &limit, 1.0).unwrap();
    assert_eq!((after.source, after.allowed), (Source::Redis, true));
}

#[test]
fn acquire_all_is_shielded_by_its_refusing_bucket() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed).deny_cache(true));
    let items = [
        ("{u}:a", Limit::new(0.001, 5.0).unwrap(), 1.0),
        ("{u}:b", Limit::new(0.001, 1.0).unwrap(), 1.0),
    ];
    assert!(limiter.acquire_all(&items).unwrap().allowed);
    let refused = limiter.acquire_all(&items).unwrap();
    assert_eq!(
        (refused.allowed, refused.refused_index, refused.source),
        (false, Some(1), Source::Redis)
    );
    let cached = limiter.acquire_all(&items).unwrap();
    assert_eq!(
        (cached.allowed, cached.refused_index, cached.source),
        (false, Some(1), Source::Cache)
    );
    assert!(cached.decisions.is_empty());
    assert_eq!(server.calls("RL.ACQUIRE.MULTI"), 2);
}

#[test]
fn a_cache_entry_ends_when_retry_after_has_passed() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed).deny_cache(true));
    let limit = Limit::new(20.0, 1.0).unwrap(); // a token every 50 ms
    limiter.acquire("k", &limit, 1.0).unwrap();
    let denied = limiter.acquire("k", &limit, 1.0).unwrap();
    assert_eq!(denied.source, Source::Redis);
    std::thread::sleep(Duration::from_millis(denied.retry_after_ms as u64 + 10));
    assert_eq!(
        limiter.acquire("k", &limit, 1.0).unwrap().source,
        Source::Redis
    );
}

#[test]
fn the_cache_is_bounded() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed).deny_cache_entries(3));
    let limit = Limit::new(0.001, 1.0).unwrap();
    for i in 0..10 {
        limiter.acquire(&format!("k{i}"), &limit, 1.0).unwrap();
        limiter.acquire(&format!("k{i}"), &limit, 1.0).unwrap();
    }
    // The three newest are remembered; the oldest were dropped.
    for i in 7..10 {
        assert_eq!(
            limiter
                .acquire(&format!("k{i}"), &limit, 1.0)
                .unwrap()
                .source,
            Source::Cache
        );
    }
    assert_eq!(
        limiter.acquire("k0", &limit, 1.0).unwrap().source,
        Source::Redis
    );
}
