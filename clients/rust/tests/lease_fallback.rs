//! Leases and reservations on servers without the module: the Functions library and the
//! script answer as the module does (the same sequence on a server with the module and on a
//! plain one gives the same replies, waits aside), a guard is released on an error and on a
//! panic, and reserve/settle move the same tokens.

#![cfg(test)]

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use common::{slow, Server};
use redis_rl_client::{load_functions, Error, Limiter, OnError, Options, Path, Source};

/// A plain server on `path` (the library loaded for `Functions`), and its limiter.
fn fallback(path: Path) -> (Server, Arc<Limiter>) {
    let server = Server::plain();
    if path == Path::Functions {
        load_functions(&mut server.conn()).unwrap();
    }
    let limiter = Arc::new(common::limiter(&server, Options::new(OnError::Closed)));
    (server, limiter)
}

fn source_of(path: Path) -> Source {
    match path {
        Path::Functions => Source::Functions,
        _ => Source::Lua,
    }
}

/// What a lease sequence answers, waits left out (they depend on the ms between calls).
fn lease_sequence(limiter: &Limiter) -> Vec<String> {
    let mut seen = Vec::new();
    let a = limiter.lease("jobs", 2, 30_000, Some("a")).unwrap();
    seen.push(format!(
        "{} {} {} {}",
        a.allowed, a.id, a.in_use, a.expires_in_ms
    ));
    let again = limiter.lease("jobs", 2, 30_000, Some("a")).unwrap();
    seen.push(format!("{} {} {}", again.allowed, again.id, again.in_use));
    let b = limiter.lease("jobs", 2, 30_000, None).unwrap();
    seen.push(format!("{} {} {}", b.allowed, b.id.len(), b.in_use));
    let c = limiter.lease("jobs", 2, 30_000, None).unwrap();
    seen.push(format!(
        "{} {:?} {} {}",
        c.allowed,
        c.id,
        c.in_use,
        c.retry_after_ms > 29_000
    ));
    let count = limiter.leases("jobs", 2).unwrap();
    seen.push(format!(
        "{} {}",
        count.in_use,
        count.retry_after_ms > 29_000
    ));
    seen.push(format!("{}", limiter.renew("jobs", "a", 60_000).unwrap()));
    seen.push(format!("{}", limiter.release("jobs", "a").unwrap()));
    seen.push(format!("{}", limiter.release("jobs", "a").unwrap()));
    seen.push(format!("{}", limiter.renew("jobs", "a", 60_000).unwrap()));
    seen.push(format!("{}", limiter.release("jobs", &b.id).unwrap()));
    let count = limiter.leases("jobs", 2).unwrap();
    seen.push(format!("{} {}", count.in_use, count.retry_after_ms));
    seen
}

/// What a reservation sequence answers: remaining and balances, exact.
fn reserve_sequence(limiter: &Limiter) -> Vec<String> {
    let limit = slow().with_capacity(10.0).unwrap();
    let mut seen = Vec::new();
    for (estimate, actual) in [(4.0, 1.5), (2.0, 12.0), (0.5, 0.5)] {
        let r = limiter
            .reserve("tokens", &limit, estimate, 60_000, None)
            .unwrap();
        seen.push(format!("{} {}", r.allowed, r.remaining));
        if !r.allowed {
            continue;
        }
        let id = r.id.clone();
        let c = r.settle(actual).unwrap();
        seen.push(format!("{} {}", c.balance, c.in_debt()));
        let again = limiter.settle("tokens", &limit, &id, actual).unwrap_err();
        seen.push(format!(
            "{}",
            again.to_string().contains("not an open reservation")
        ));
    }
    let first = limiter
        .reserve("retry", &limit, 3.0, 60_000, Some("r1"))
        .unwrap();
    let again = limiter
        .reserve("retry", &limit, 3.0, 60_000, Some("r1"))
        .unwrap();
    seen.push(format!(
        "{} {} {}",
        first.remaining, again.remaining, again.id
    ));
    seen
}

fn answers_as_the_module(path: Path) {
    let module = Server::start();
    let on_module = Arc::new(common::limiter(&module, Options::new(OnError::Closed)));
    let (_server, limiter) = fallback(path);
    assert_eq!(lease_sequence(&limiter), lease_sequence(&on_module));
    assert_eq!(reserve_sequence(&limiter), reserve_sequence(&on_module));
    assert_eq!(limiter.path(), Some(path));
    let c = limiter.counters();
    assert_eq!(c.lua + c.functions, on_module.counters().redis, "{c:?}");
    assert_eq!(c.lua * c.functions, 0, "one path answered: {c:?}");
    assert_eq!(
        limiter.lease("k", 1, 10, None).unwrap().source,
        source_of(path)
    );
}

#[test]
fn the_script_answers_as_the_module() {
    answers_as_the_module(Path::Lua);
}

#[test]
fn the_functions_library_answers_as_the_module() {
    answers_as_the_module(Path::Functions);
}

fn failing_work(limiter: &Arc<Limiter>) -> Result<(), Error> {
    let _slot = limiter.hold("work", 2, 30_000, Duration::ZERO)?;
    assert_eq!(limiter.leases("work", 2)?.in_use, 1);
    Err(Error::Invalid("the work failed"))
}

fn guards_are_released(path: Path) {
    let (_server, limiter) = fallback(path);
    assert!(matches!(
        failing_work(&limiter),
        Err(Error::Invalid("the work failed"))
    ));
    assert_eq!(limiter.leases("work", 2).unwrap().in_use, 0);
    let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _slot = limiter.hold("work", 2, 30_000, Duration::ZERO).unwrap();
        panic!("the work panicked");
    }));
    assert!(unwound.is_err());
    assert_eq!(limiter.leases("work", 2).unwrap().in_use, 0);
}

#[test]
fn a_guard_is_released_on_the_script_path() {
    guards_are_released(Path::Lua);
}

#[test]
fn a_guard_is_released_on_the_functions_path() {
    guards_are_released(Path::Functions);
}
