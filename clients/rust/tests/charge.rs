//! `charge` against real servers: RL.CHARGE and RL.HCHARGE with the module, the script's
//! `charge` mode without it, and the `Local` policy's bucket (rl-bucket's `charge`) while
//! Redis is down; sync and async. A charge on a fresh bucket does not depend on the clock,
//! so its reply is checked exactly, at rates whose token time is not a whole number of ns
//! (3/s, 7/s, 3 per 10 s). Later steps use 3 per 10 s, slow enough that refill cannot
//! change what a test asserts.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::Server;
use redis_rl_client::{AsyncLimiter, Error, Limit, Limiter, OnError, Options, Source};

/// Fresh buckets charged once: `(limit, cost, (balance, retry_after_ms, reset_after_ms))`,
/// worked out in exact fractions of the token time T.
fn fresh_cases() -> Vec<(Limit, f64, (i64, i64, i64))> {
    let per_10s = Limit::per(3, Duration::from_secs(10))
        .unwrap()
        .with_capacity(3.0)
        .unwrap();
    vec![
        // 3/s, burst 3, charged 5: 2 tokens owed, repaid after 2T = 666.7 ms, full after
        // 5T = 1666.7 ms (both rounded up).
        (Limit::new(3.0, 3.0).unwrap(), 5.0, (-2, 667, 1667)),
        // 7/s, burst 7, charged 10: 3 owed, 3/7 s and 10/7 s.
        (Limit::new(7.0, 7.0).unwrap(), 10.0, (-3, 429, 1429)),
        // 3 per 10 s, burst 3, charged 5: T = 10/3 s; 2 owed, 20/3 s and 50/3 s.
        (per_10s, 5.0, (-2, 6667, 16667)),
        // Within the capacity a charge is a take: 2 left, no debt, full after T.
        (Limit::new(3.0, 3.0).unwrap(), 1.0, (2, 0, 334)),
        // Half a token past the burst is a whole token owed (rounded toward -inf).
        (Limit::new(3.0, 3.0).unwrap(), 3.5, (-1, 167, 1167)),
    ]
}

fn slow() -> Limit {
    Limit::per(3, Duration::from_secs(10))
        .unwrap()
        .with_capacity(3.0)
        .unwrap()
}

fn charges_exactly_and_debt_denies(server: &Server, up: Source) {
    let limiter = Limiter::new(server.client(), Options::new(OnError::Closed));
    for (i, (limit, cost, want)) in fresh_cases().into_iter().enumerate() {
        let key = format!("fresh:{i}");
        let c = limiter.charge(&key, &limit, cost).unwrap();
        assert_eq!(
            (c.balance, c.retry_after_ms, c.reset_after_ms),
            want,
            "{key}"
        );
        assert_eq!((c.source, c.in_debt()), (up, want.0 < 0), "{key}");
        assert_eq!(c.remaining(), u64::try_from(want.0).unwrap_or(0));
    }
    // In debt, even a cost of 0 is denied; a second charge adds to the debt.
    let c = limiter.charge("debt", &slow(), 5.0).unwrap();
    assert_eq!(c.balance, -2);
    let d = limiter.acquire("debt", &slow(), 0.0).unwrap();
    assert!(!d.allowed);
    assert_eq!((d.remaining, d.source), (0, up));
    assert!(d.retry_after_ms > 0 && d.retry_after_ms <= 6667, "{d:?}");
    let c = limiter.charge("debt", &slow(), 1.0).unwrap();
    assert_eq!(c.balance, -3, "{c:?}");
    // A table's field: RL.HCHARGE with the module, the field's fallback key without.
    let table = limiter.table("charged", 4).unwrap();
    let c = table.charge("user:1", &slow(), 5.0).unwrap();
    assert_eq!(
        (c.balance, c.retry_after_ms, c.reset_after_ms),
        (-2, 6667, 16667)
    );
    assert!(!table.acquire("user:1", &slow(), 0.0).unwrap().allowed);
    // Past the bound (full again within 100 years) the charge is refused and writes nothing.
    let one = Limit::new(1.0, 1.0).unwrap();
    match limiter.charge("too-deep", &one, 3_153_600_001.0) {
        Err(Error::Redis(e)) => assert!(e.to_string().contains("debt"), "{e}"),
        other => panic!("{other:?}"),
    }
    let mut con = server.conn();
    assert!(!common::exists(&mut con, b"too-deep"));
    // The most it may owe is accepted.
    let c = limiter.charge("deepest", &one, 3_153_600_000.0).unwrap();
    assert_eq!(c.balance, -3_153_599_999);
    assert!(limiter.charge("bad", &one, -1.0).is_err());

    // The async limiter: the same replies.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter =
            AsyncLimiter::connect(server.client(), Options::new(OnError::Closed)).unwrap();
        let c = limiter.charge("async", &slow(), 5.0).await.unwrap();
        assert_eq!(
            (c.balance, c.retry_after_ms, c.reset_after_ms, c.source),
            (-2, 6667, 16667, up)
        );
        let table = limiter.table("charged-async", 4).unwrap();
        let c = table.charge("user:1", &slow(), 4.0).await.unwrap();
        assert_eq!(c.balance, -1);
    });
}

#[test]
fn the_module_charges_exactly_and_a_debt_denies_every_acquire() {
    charges_exactly_and_debt_denies(&Server::start(), Source::Redis);
}

#[test]
fn the_lua_path_charges_as_the_module_does() {
    charges_exactly_and_debt_denies(&Server::plain(), Source::Lua);
}

#[test]
fn a_charge_into_debt_primes_the_deny_cache_until_repaid_or_refunded() {
    let server = Server::start();
    let limiter = Limiter::new(
        server.client(),
        Options::new(OnError::Closed).deny_cache(true),
    );
    limiter.charge("k", &slow(), 5.0).unwrap();
    let d = limiter.acquire("k", &slow(), 0.0).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Cache));
    // A refund clears the entry and goes to Redis: 3 back leaves one token.
    limiter.refund("k", &slow(), 3.0).unwrap();
    let d = limiter.acquire("k", &slow(), 1.0).unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Redis), "{d:?}");
}

#[test]
fn without_redis_each_policy_charges_as_it_says() {
    let mut server = Server::start();
    let options = |on_error| {
        Options::new(on_error)
            .timeout(Duration::from_millis(500))
            .probe_interval(Duration::from_secs(3600))
    };
    let local = Limiter::new(server.client(), options(OnError::Local));
    let open = Limiter::new(server.client(), options(OnError::Open));
    let closed = Limiter::new(server.client(), options(OnError::Closed));
    server.kill();
    // Local: the module's own bucket, in process, with the same exact replies.
    for (i, (limit, cost, want)) in fresh_cases().into_iter().enumerate() {
        let c = local.charge(&format!("k{i}"), &limit, cost).unwrap();
        assert_eq!(
            (c.balance, c.retry_after_ms, c.reset_after_ms, c.source),
            (want.0, want.1, want.2, Source::Local),
            "case {i}"
        );
    }
    let d = local.acquire("k2", &slow(), 0.0).unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Local));
    let one = Limit::new(1.0, 1.0).unwrap();
    assert!(matches!(
        local.charge("deep", &one, 3_153_600_001.0),
        Err(Error::Invalid(text)) if text.contains("debt")
    ));
    // Open and Closed charge nothing; Closed reports its usual wait.
    let c = open.charge("k", &slow(), 5.0).unwrap();
    assert_eq!(
        (c.balance, c.retry_after_ms, c.source),
        (0, 0, Source::Open)
    );
    // They know nothing of the bucket: no "0 left, full now" in the headers.
    let limit_only = vec![("X-RateLimit-Limit", slow().capacity_text())];
    assert_eq!(c.headers(), limit_only);
    let c = closed.charge("k", &slow(), 5.0).unwrap();
    assert_eq!(
        (c.balance, c.retry_after_ms, c.source),
        (0, 1000, Source::Closed)
    );
    assert_eq!(c.headers(), limit_only);
}
