//! The blocking limiter against a real server with the module: the module's replies as typed
//! decisions, headers, peek, refund, acquire_all, errors the policy must not swallow, and the
//! way back to the Lua path when the module goes away. Plus argument validation (no I/O).

#![cfg(test)]

mod common;

use common::{limiter, options, slow, Server};
use redis_rl_client::{Error, Limit, OnError, Path, Source, WithoutModule};

#[test]
fn acquire_reports_the_modules_reply() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed));
    let limit = Limit::new(5.0, 10.0).unwrap();
    let first = limiter.acquire("user:42", &limit, 1.0).unwrap();
    assert_eq!(
        (first.allowed, first.remaining, first.retry_after_ms),
        (true, 9, 0)
    );
    assert!(
        first.reset_after_ms > 0 && first.reset_after_ms <= 200,
        "{first:?}"
    );
    assert_eq!((first.source, first.limit), (Source::Redis, limit));
    assert_eq!(limiter.path(), Some(Path::Module));
    let headers = first.headers();
    assert_eq!(headers[0], ("X-RateLimit-Limit", "10".to_string()));
    assert_eq!(headers[1], ("X-RateLimit-Remaining", "9".to_string()));
    assert_eq!(headers[2], ("X-RateLimit-Reset", "1".to_string()));
    assert_eq!(headers.len(), 3, "no Retry-After when allowed");
    // The module's own reply for the same key agrees.
    let raw: Vec<i64> = redis::cmd("RL.PEEK")
        .arg("user:42")
        .arg(5)
        .arg(10)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(raw[1], 9);
    assert_eq!(limiter.counters().redis, 1);
}

#[test]
fn denial_has_retry_after_and_impossible_has_minus_one() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Open));
    let limit = slow();
    for remaining in (0..5).rev() {
        let d = limiter.acquire("k", &limit, 1.0).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, remaining));
    }
    let denied = limiter.acquire("k", &limit, 1.0).unwrap();
    assert!(!denied.allowed);
    assert!(
        denied.retry_after_ms > 990_000 && denied.retry_after_ms <= 1_000_000,
        "{denied:?}"
    );
    let headers = denied.headers();
    assert_eq!(headers[3].0, "Retry-After");
    assert_eq!(
        headers[3].1,
        (denied.retry_after_ms as u64).div_ceil(1000).to_string()
    );
    let impossible = limiter.acquire("k", &limit, 6.0).unwrap();
    assert_eq!((impossible.allowed, impossible.retry_after_ms), (false, -1));
    assert_eq!(
        impossible.headers().len(),
        3,
        "no Retry-After when no wait helps"
    );
}

#[test]
fn peek_takes_nothing_and_refund_gives_back() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed));
    let limit = slow();
    limiter.acquire("k", &limit, 3.0).unwrap();
    let peek = limiter.peek("k", &limit, 2.0).unwrap();
    assert_eq!((peek.allowed, peek.remaining), (true, 2));
    assert!(!limiter.peek("k", &limit, 3.0).unwrap().allowed);
    let refund = limiter.refund("k", &limit, 2.0).unwrap();
    assert_eq!((refund.remaining, refund.source), (4, Source::Redis));
    assert_eq!(limiter.acquire("k", &limit, 4.0).unwrap().remaining, 0);
}

#[test]
fn acquire_all_is_all_or_nothing() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed));
    let per_s = Limit::new(0.001, 2.0).unwrap();
    let per_h = Limit::new(0.001, 3.0).unwrap();
    let items = [("{u:42}:s", per_s, 1.0), ("{u:42}:h", per_h, 1.0)];
    for expect_remaining in [(1, 2), (0, 1)] {
        let all = limiter.acquire_all(&items).unwrap();
        assert!(all.allowed);
        assert_eq!(all.refused_index, None);
        let got: Vec<u64> = all.decisions.iter().map(|d| d.remaining).collect();
        assert_eq!(got, vec![expect_remaining.0, expect_remaining.1]);
    }
    let refused = limiter.acquire_all(&items).unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.refused_index, Some(0));
    assert!(refused.retry_after_ms > 990_000);
    // Nothing was taken from the hour bucket by the refused call.
    assert_eq!(limiter.peek("{u:42}:h", &per_h, 1.0).unwrap().remaining, 1);
    assert!(matches!(limiter.acquire_all(&[]), Err(Error::Invalid(_))));
}

#[test]
fn wrong_type_is_an_error_not_an_outage() {
    let server = Server::start();
    let limiter = limiter(&server, options(OnError::Open));
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    match limiter.acquire("str", &slow(), 1.0) {
        Err(Error::Redis(e)) => assert_eq!(e.code(), Some("WRONGTYPE")),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
    assert_eq!(limiter.counters().open, 0);
    assert_eq!(limiter.counters().outages, 0);
}

#[test]
fn unknown_command_makes_it_look_again_and_fall_back_to_lua() {
    let mut server = Server::start();
    let limiter = limiter(&server, options(OnError::Closed));
    assert_eq!(
        limiter.acquire("k", &slow(), 1.0).unwrap().source,
        Source::Redis
    );
    // The same port, now without the module: the first call is an outage (the connection
    // broke); the next reaches a server where RL.ACQUIRE is unknown.
    server.kill();
    server.module = false;
    server.restart();
    let mut source = Source::Closed;
    for _ in 0..50 {
        source = limiter.acquire("k", &slow(), 1.0).unwrap().source;
        if source != Source::Closed {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(110));
    }
    assert_eq!(source, Source::Lua);
    assert_eq!(limiter.path(), Some(Path::Lua));
}

#[test]
fn refuse_on_a_module_server_works_as_usual() {
    let server = Server::start();
    let limiter = limiter(
        &server,
        options(OnError::Closed).without_module(WithoutModule::Refuse),
    );
    assert_eq!(
        limiter.acquire("k", &slow(), 1.0).unwrap().source,
        Source::Redis
    );
}

#[test]
fn limits_and_costs_are_checked_with_the_modules_ranges() {
    let bad: [((f64, f64), &str); 8] = [
        ((0.0, 1.0), "rate must be"),
        ((1e-7, 1.0), "rate must be"),
        ((2e9, 1.0), "rate must be"),
        ((f64::NAN, 1.0), "rate must be"),
        ((1.0, 0.0), "capacity must be"),
        ((1.0, 2e15), "capacity must be"),
        ((1.0, f64::INFINITY), "capacity must be"),
        ((1e-6, 1e4), "capacity / rate"),
    ];
    for ((rate, capacity), text) in bad {
        match Limit::new(rate, capacity) {
            Err(e @ Error::Invalid(_)) => assert!(e.to_string().starts_with(text), "{e}"),
            other => panic!("Limit::new({rate}, {capacity}) gave {other:?}"),
        }
    }
    assert!(Limit::new(1e-6, 3153.6).is_ok() && Limit::new(1e9, 1e15).is_ok());
    // A bad cost fails before any I/O: no server at all here.
    let nobody = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let limiter = redis_rl_client::Limiter::new(nobody, options(OnError::Open));
    for cost in [-1.0, f64::NAN, f64::INFINITY] {
        match limiter.acquire("k", &slow(), cost) {
            Err(Error::Invalid(text)) => assert!(text.starts_with("cost must be")),
            other => panic!("cost {cost}: {other:?}"),
        }
    }
    assert_eq!(limiter.counters(), redis_rl_client::Counters::default());
}
