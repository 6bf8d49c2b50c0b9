//! Leases and reservations through both limiters against real servers: the module's replies
//! as RL.LEASE and RL.RESERVE give them, a guard released when its scope ends by an error or
//! a panic (blocking and async), waiting for a slot with a deadline, renewal while held,
//! reserve/settle against the module's own commands on a twin key, and each failure policy
//! on a stopped server.

#![cfg(test)]

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{slow, take_logs, Server};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_rl_client::{AsyncLimiter, Error, Limiter, OnError, Options, Source};

/// RL.LEASES read straight from the server: `[in_use, retry_after_ms]`.
fn held(server: &Server, key: &str, limit: u32) -> i64 {
    let reply: Vec<i64> = redis::cmd("RL.LEASES")
        .arg(key)
        .arg(limit)
        .query(&mut server.conn())
        .unwrap();
    reply[0]
}

/// Polls `held` until it is `want` (an async guard's release is spawned), at most 3 s.
fn eventually_held(server: &Server, key: &str, want: i64) {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let now = held(server, key, 10);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < until,
            "{key}: {now} leases held, not {want}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn blocking(server: &Server, on_error: OnError) -> Arc<Limiter> {
    Arc::new(common::limiter(server, Options::new(on_error)))
}

async fn manager(server: &Server) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)))
        .set_number_of_retries(1);
    server
        .client()
        .get_connection_manager_with_config(config)
        .await
        .unwrap()
}

async fn asynchronous(server: &Server, options: Options) -> Arc<AsyncLimiter<ConnectionManager>> {
    Arc::new(AsyncLimiter::new(
        manager(server).await,
        options
            .timeout(Duration::from_millis(500))
            .probe_interval(Duration::ZERO),
    ))
}

#[test]
fn leases_are_the_modules_own() {
    let server = Server::start();
    let limiter = blocking(&server, OnError::Closed);
    let a = limiter.lease("jobs", 2, 30_000, None).unwrap();
    assert!(a.allowed);
    assert_eq!(
        (a.in_use, a.expires_in_ms, a.source),
        (1, 30_000, Source::Redis)
    );
    assert_eq!(a.id.len(), 16, "an id drawn here: {}", a.id);
    let b = limiter.lease("jobs", 2, 30_000, Some("worker-7")).unwrap();
    assert_eq!((b.allowed, b.id.as_str(), b.in_use), (true, "worker-7", 2));
    // A retried take of a held id is answered as held and takes nothing.
    let again = limiter.lease("jobs", 2, 30_000, Some("worker-7")).unwrap();
    assert_eq!((again.allowed, again.in_use), (true, 2));
    let denied = limiter.lease("jobs", 2, 30_000, None).unwrap();
    assert!(!denied.allowed);
    assert_eq!((denied.id.as_str(), denied.in_use), ("", 2));
    assert!(denied.retry_after_ms > 29_000 && denied.retry_after_ms <= 30_000);
    let count = limiter.leases("jobs", 2).unwrap();
    // The same wait, less the ms between the two calls.
    assert_eq!(count.in_use, 2);
    assert!(count.retry_after_ms <= denied.retry_after_ms && count.retry_after_ms > 29_000);
    assert!(limiter.renew("jobs", "worker-7", 60_000).unwrap());
    assert!(limiter.release("jobs", "worker-7").unwrap());
    assert!(!limiter.release("jobs", "worker-7").unwrap());
    assert!(!limiter.renew("jobs", "worker-7", 60_000).unwrap());
    assert_eq!(held(&server, "jobs", 2), 1);
    assert_eq!(limiter.counters().redis, 9);
    // Bad arguments are named before any I/O.
    for (e, name) in [
        (limiter.lease("jobs", 0, 1, None).unwrap_err(), "limit"),
        (limiter.lease("jobs", 1, 0, None).unwrap_err(), "ttl_ms"),
        (limiter.lease("jobs", 1, 1, Some("")).unwrap_err(), "id"),
        (
            limiter.release("jobs", "seventeen-bytes!!").unwrap_err(),
            "id",
        ),
    ] {
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert!(e.to_string().starts_with(name), "{e}");
    }
}

/// The limiter's reserve and settle on one key, RL.RESERVE and RL.SETTLE sent by hand on a
/// twin: the same replies (the waits may differ by the ms between the calls).
#[test]
fn reserve_and_settle_are_exactly_the_modules() {
    let server = Server::start();
    let limiter = blocking(&server, OnError::Closed);
    let mut con = server.conn();
    let limit = slow().with_capacity(10.0).unwrap();
    let mut by_hand = |args: &[&str]| -> redis::Value {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut con).unwrap()
    };
    let rate = limit.rate_text();
    for (estimate, actual) in [(4.0, 1.5), (2.0, 12.0)] {
        let r = limiter
            .reserve("mine", &limit, estimate, 60_000, None)
            .unwrap();
        let twin = by_hand(&[
            "RL.RESERVE",
            "twin",
            &rate,
            "10",
            &estimate.to_string(),
            "60000",
            "ID",
            &r.id,
        ]);
        let redis::Value::Array(twin) = twin else {
            panic!("{twin:?}")
        };
        assert_eq!(twin[0], redis::Value::Int(i64::from(r.allowed)));
        assert_eq!(twin[2], redis::Value::Int(r.remaining as i64));
        assert_eq!(r.source, Source::Redis);
        let id = r.id.clone();
        let settled = r.settle(actual).unwrap();
        let twin: Vec<i64> = redis::cmd("RL.SETTLE")
            .arg("twin")
            .arg(&rate)
            .arg("10")
            .arg(&id)
            .arg(actual)
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(
            settled.balance, twin[0],
            "estimate {estimate} actual {actual}"
        );
        assert_eq!(settled.in_debt(), twin[0] < 0);
        // Settled once: a second settle of the id is the module's error, and writes nothing.
        let again = limiter.settle("mine", &limit, &id, actual).unwrap_err();
        assert!(
            again.to_string().contains("not an open reservation"),
            "{again}"
        );
    }
    // A retried reserve with the caller's id takes nothing more.
    let first = limiter
        .reserve("retry", &limit, 3.0, 60_000, Some("r1"))
        .unwrap();
    let again = limiter
        .reserve("retry", &limit, 3.0, 60_000, Some("r1"))
        .unwrap();
    assert_eq!((first.remaining, again.remaining), (7, 7));
    // Denied like an acquire, and a denied reservation has nothing to settle.
    let denied = limiter.reserve("retry", &limit, 8.0, 60_000, None).unwrap();
    assert!(!denied.allowed && denied.retry_after_ms > 0);
    assert!(matches!(denied.settle(1.0), Err(Error::Invalid(_))));
    assert!(matches!(
        limiter.reserve("retry", &limit, 0.0, 1, None),
        Err(Error::Invalid(_))
    ));
}

/// Work that fails: `?` leaves the scope with the guard, which releases the lease.
fn failing_work(limiter: &Arc<Limiter>, server: &Server) -> Result<(), String> {
    let _slot = limiter
        .hold("work", 3, 30_000, Duration::ZERO)
        .map_err(|e| e.to_string())?;
    assert_eq!(held(server, "work", 3), 1);
    Err("the work failed".to_string())
}

#[test]
fn a_guard_is_released_on_an_error_and_on_a_panic() {
    let server = Server::start();
    let limiter = blocking(&server, OnError::Closed);
    assert_eq!(
        failing_work(&limiter, &server),
        Err("the work failed".to_string())
    );
    assert_eq!(held(&server, "work", 3), 0);

    let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _slot = limiter.hold("work", 3, 30_000, Duration::ZERO).unwrap();
        assert_eq!(held(&server, "work", 3), 1);
        panic!("the work panicked");
    }));
    assert!(unwound.is_err());
    assert_eq!(held(&server, "work", 3), 0);

    // An explicit release says whether it was held.
    let slot = limiter.hold("work", 3, 30_000, Duration::ZERO).unwrap();
    assert!(slot.release().unwrap());
    assert_eq!(held(&server, "work", 3), 0);
}

#[test]
fn hold_waits_for_a_slot_until_its_deadline() {
    let server = Server::start();
    let limiter = blocking(&server, OnError::Closed);
    let first = limiter.hold("one", 1, 30_000, Duration::ZERO).unwrap();
    let started = Instant::now();
    let e = limiter
        .hold("one", 1, 30_000, Duration::from_millis(200))
        .err()
        .unwrap();
    let waited = started.elapsed();
    assert!(matches!(e, Error::TimedOut { waited_ms: 200, .. }), "{e}");
    assert!(e.to_string().starts_with("timed out"), "{e}");
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(2));

    // A slot that frees while one waits is taken: the first holder leaves after 150 ms.
    let leaving = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        drop(first);
    });
    let started = Instant::now();
    let second = limiter.hold("one", 1, 300, Duration::from_secs(5)).unwrap();
    // Taken soon after the release, not when the first lease would have expired (30 s).
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(140), "{waited:?}");
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    leaving.join().unwrap();
    // Renewed at ttl/2 while held: still held three ttls later.
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(held(&server, "one", 1), 1);
    assert!(!second.is_lost());
    drop(second);
    assert_eq!(held(&server, "one", 1), 0);
}

async fn failing_async_work(
    limiter: &Arc<AsyncLimiter<ConnectionManager>>,
    server: &Server,
) -> Result<(), Error> {
    let _slot = limiter.hold("work", 3, 30_000, Duration::ZERO).await?;
    assert_eq!(held(server, "work", 3), 1);
    Err(Error::Invalid("the work failed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_guard_is_released_on_an_error_and_on_a_panic() {
    let server = Server::start();
    let limiter = asynchronous(&server, Options::new(OnError::Closed)).await;
    assert!(matches!(
        failing_async_work(&limiter, &server).await,
        Err(Error::Invalid("the work failed"))
    ));
    eventually_held(&server, "work", 0);

    let task_limiter = limiter.clone();
    let task_server_port = server.url();
    let panicked = tokio::spawn(async move {
        let _slot = task_limiter
            .hold("work", 3, 30_000, Duration::ZERO)
            .await
            .unwrap();
        let mut con = redis::Client::open(task_server_port)
            .unwrap()
            .get_connection()
            .unwrap();
        let count: Vec<i64> = redis::cmd("RL.LEASES")
            .arg("work")
            .arg(3)
            .query(&mut con)
            .unwrap();
        assert_eq!(count[0], 1);
        panic!("the work panicked");
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    eventually_held(&server, "work", 0);

    // Waiting, renewal and an explicit release, as the blocking guard.
    let first = limiter.hold("one", 1, 300, Duration::ZERO).await.unwrap();
    let e = limiter
        .hold("one", 1, 300, Duration::from_millis(100))
        .await
        .err()
        .unwrap();
    assert!(matches!(e, Error::TimedOut { .. }), "{e}");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(held(&server, "one", 1), 1, "renewed while held");
    assert!(first.release().await.unwrap());
    assert_eq!(held(&server, "one", 1), 0);

    let r = limiter
        .reserve(
            "tokens",
            &slow().with_capacity(10.0).unwrap(),
            4.0,
            60_000,
            None,
        )
        .await
        .unwrap();
    assert_eq!((r.allowed, r.remaining), (true, 6));
    assert_eq!(r.settle(1.0).await.unwrap().balance, 9);
}

/// Each failure policy answers leases and reservations while the server is down, and counts
/// them; `Local` keeps the same semantics in this process.
#[test]
fn each_policy_decides_leases_without_redis() {
    let mut server = Server::start();
    let open = blocking(&server, OnError::Open);
    let closed = blocking(&server, OnError::Closed);
    let local = blocking(&server, OnError::Local);
    server.kill();

    let lease = open.lease("k", 1, 1000, None).unwrap();
    assert!(lease.allowed && lease.id.starts_with("open:"));
    assert_eq!(lease.source, Source::Open);
    assert!(
        open.lease("k", 1, 1000, None).unwrap().allowed,
        "open counts nothing"
    );
    assert!(!open.release("k", &lease.id).unwrap());
    let guard = open.hold("k", 1, 1000, Duration::ZERO).unwrap();
    assert!(guard.id().starts_with("open:"));
    drop(guard);
    // Two takes, the guard's take, and the two releases of `open:` ids answered in process.
    assert_eq!(open.counters().open, 5);

    let lease = closed.lease("k", 1, 1000, None).unwrap();
    assert!(!lease.allowed);
    assert_eq!((lease.source, lease.retry_after_ms), (Source::Closed, 1000));
    assert!(matches!(
        closed.hold("k", 1, 1000, Duration::ZERO),
        Err(Error::TimedOut { .. })
    ));
    let limit = slow().with_capacity(10.0).unwrap();
    assert!(
        !closed
            .reserve("t", &limit, 1.0, 1000, None)
            .unwrap()
            .allowed
    );

    let a = local.lease("k", 2, 60_000, None).unwrap();
    let b = local.lease("k", 2, 60_000, None).unwrap();
    let c = local.lease("k", 2, 60_000, None).unwrap();
    assert_eq!((a.allowed, b.allowed, c.allowed), (true, true, false));
    assert!(a.id.starts_with("local:") && b.id.starts_with("local:") && a.id != b.id);
    assert_eq!(
        (a.source, c.source, c.in_use),
        (Source::Local, Source::Local, 2)
    );
    assert!(c.retry_after_ms > 59_000 && c.retry_after_ms <= 60_000);
    assert!(local.release("k", &a.id).unwrap());
    assert!(!local.release("k", &a.id).unwrap());
    assert_eq!(local.leases("k", 2).unwrap().in_use, 1);
    {
        let _slot = local.hold("k", 2, 60_000, Duration::ZERO).unwrap();
        assert_eq!(local.leases("k", 2).unwrap().in_use, 2);
    }
    assert_eq!(local.leases("k", 2).unwrap().in_use, 1);
    let r = local.reserve("t", &limit, 4.0, 60_000, None).unwrap();
    assert_eq!((r.allowed, r.remaining, r.source), (true, 6, Source::Local));
    assert!(r.id.starts_with("local:"));
    let id = r.id.clone();
    let settled = r.settle(1.0).unwrap();
    assert_eq!(
        (settled.balance, settled.source, settled.applied),
        (9, Source::Local, true)
    );
    assert!(matches!(
        local.settle("t", &limit, &id, 1.0),
        Err(Error::Invalid(_))
    ));
    // A retried reserve of an id open here takes nothing more; a caller's id is kept.
    let first = local.reserve("t", &limit, 2.0, 60_000, Some("x")).unwrap();
    assert_eq!(first.id, "x");
    let again = local.reserve("t", &limit, 2.0, 60_000, Some("x")).unwrap();
    assert_eq!(
        (first.remaining, again.remaining, again.allowed),
        (7, 7, true)
    );
    assert!(local.counters().local >= 10);
    assert_eq!(local.counters().redis, 0);
}

/// A caller's id starting with a failure policy's prefix is refused before anything is sent:
/// its release or settle would be answered in process, never reaching the Redis lease.
#[test]
fn a_callers_id_cannot_take_a_policys_prefix() {
    let server = Server::start();
    let limiter = blocking(&server, OnError::Closed);
    let limit = slow();
    for id in ["open:x", "local:x"] {
        let refused = limiter.lease("k", 1, 1000, Some(id)).unwrap_err();
        assert!(
            matches!(refused, Error::Invalid(m) if m.contains("local:")),
            "{id}"
        );
        assert!(matches!(
            limiter.reserve("t", &limit, 1.0, 1000, Some(id)),
            Err(Error::Invalid(_))
        ));
    }
    assert_eq!(held(&server, "k", 1), 0);
    assert_eq!(limiter.counters().redis, 0);
}

/// A lease and a reservation the `Local` policy took while the server was down are released,
/// renewed and settled in this process once it is back (their ids start with `local:`), while
/// new takes go to Redis again.
#[test]
fn local_ids_stay_local_once_redis_is_back() {
    let mut server = Server::start();
    let local = Arc::new(common::limiter(
        &server,
        Options::new(OnError::Local).probe_interval(Duration::ZERO),
    ));
    let limit = slow();
    server.kill();
    let lease = local.lease("k", 1, 60_000, None).unwrap();
    let r = local.reserve("t", &limit, 3.0, 60_000, None).unwrap();
    assert!(lease.id.starts_with("local:") && r.id.starts_with("local:"));
    server.restart();

    let back = local.lease("k", 1, 60_000, None).unwrap();
    assert_eq!((back.allowed, back.source), (true, Source::Redis));
    let redis_before = local.counters().redis;
    assert!(local.renew("k", &lease.id, 60_000).unwrap());
    assert!(local.release("k", &lease.id).unwrap());
    assert!(!local.release("k", &lease.id).unwrap());
    let settled = r.settle(1.0).unwrap();
    assert_eq!(
        (settled.applied, settled.source, settled.balance),
        (true, Source::Local, 4)
    );
    assert_eq!(
        local.counters().redis,
        redis_before,
        "nothing went to Redis"
    );
    // Redis still holds its own lease, untouched by the local release.
    assert_eq!(held(&server, "k", 1), 1);
}

/// Settling a reservation Redis holds while Redis cannot answer applies nothing, under each
/// policy: `applied` false, counted in `unapplied_charges`, a warning naming the key.
#[test]
fn a_settle_redis_cannot_take_is_unapplied() {
    common::capture_logs();
    let mut server = Server::start();
    let limit = slow().with_capacity(10.0).unwrap();
    let limiters = [OnError::Open, OnError::Closed, OnError::Local].map(|on_error| {
        Arc::new(common::limiter(
            &server,
            Options::new(on_error).probe_interval(Duration::ZERO),
        ))
    });
    let mut ids = Vec::new();
    for (i, limiter) in limiters.iter().enumerate() {
        let r = limiter
            .reserve(&format!("t{i}"), &limit, 4.0, 60_000, None)
            .unwrap();
        assert_eq!((r.allowed, r.source), (true, Source::Redis));
        ids.push(r.id.clone());
    }
    take_logs();
    server.kill();
    for (i, limiter) in limiters.iter().enumerate() {
        let key = format!("t{i}");
        let settled = limiter.settle(&key, &limit, &ids[i], 1.0).unwrap();
        assert!(!settled.applied, "{key}: {settled:?}");
        assert_eq!(settled.balance, 0);
        assert_eq!(limiter.counters().unapplied_charges, 1, "{key}");
    }
    let logs = take_logs();
    let unapplied: Vec<_> = logs
        .iter()
        .filter(|l| l.contains("not applied") && l.contains("settle"))
        .collect();
    assert_eq!(unapplied.len(), 3, "{logs:?}");
}
