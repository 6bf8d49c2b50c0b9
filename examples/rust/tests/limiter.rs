//! The limiter against a real server with the module (`REDIS_URL`; examples/run.sh starts
//! one), and against servers that are down or hang.
//!
//! Keys are unique per run, and rates so slow (0.001 token/s) that no bucket refills during
//! a test.

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_rl_limiter::{Error, FailurePolicy, Limiter, RetryAfter};

fn redis_url() -> String {
    std::env::var("REDIS_URL")
        .expect("set REDIS_URL to a server with the module (examples/run.sh does)")
}

/// A key no earlier run used.
fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("rust-example:{name}:{}:{nanos}", std::process::id())
}

/// A redis:// URL on a port nobody listens on.
fn dead_url() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port();
    format!("redis://127.0.0.1:{port}/")
}

#[test]
fn allows_the_burst_then_refuses_with_a_wait() {
    let limiter = Limiter::new(&redis_url(), FailurePolicy::Closed)
        .expect("url")
        .with_timeout(Duration::from_secs(2));
    let key = unique("burst");
    for (remaining, reset_secs) in [(2, 1000), (1, 2000), (0, 3000)] {
        let d = limiter.acquire(&key, 0.001, 3.0, 1.0).expect("valid call");
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.remaining, remaining);
        assert_eq!(d.retry_after, RetryAfter::Now);
        assert_eq!(d.retry_after_secs(), None);
        // One token per 1000 s: full again 1000 s per token taken, rounded up.
        assert_eq!(d.reset_after_secs(), reset_secs);
        assert_eq!(d.fallback, None);
    }
    let d = limiter.acquire(&key, 0.001, 3.0, 1.0).expect("valid call");
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert!(matches!(d.retry_after, RetryAfter::After(wait) if wait <= Duration::from_secs(1000)));
    // The next token is just under 1000 s away; seconds round up.
    assert_eq!(d.retry_after_secs(), Some(1000));
    assert_eq!(d.reset_after_secs(), 3000);
    assert_eq!(d.fallback, None);
    assert_eq!((limiter.failed_open(), limiter.failed_closed()), (0, 0));
}

#[test]
fn a_cost_above_capacity_is_never_allowed() {
    let limiter = Limiter::new(&redis_url(), FailurePolicy::Open)
        .expect("url")
        .with_timeout(Duration::from_secs(2));
    let d = limiter
        .acquire(&unique("never"), 0.001, 3.0, 4.0)
        .expect("valid call");
    assert!(!d.allowed, "a denial, not an error to fail open on");
    assert_eq!(d.retry_after, RetryAfter::Never);
    assert_eq!(d.retry_after_secs(), None);
    assert_eq!(d.remaining, 3);
    assert_eq!(d.fallback, None);
}

#[test]
fn an_error_reply_applies_the_policy() {
    // The key holds a string, so the server answers WRONGTYPE: no decision was made.
    let key = unique("wrongtype");
    let mut con = redis::Client::open(redis_url())
        .and_then(|c| c.get_connection())
        .expect("connect");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("not a bucket")
        .query(&mut con)
        .expect("SET");
    for (policy, allowed) in [(FailurePolicy::Open, true), (FailurePolicy::Closed, false)] {
        let limiter = Limiter::new(&redis_url(), policy)
            .expect("url")
            .with_timeout(Duration::from_secs(2));
        let d = limiter.acquire(&key, 1.0, 5.0, 1.0).expect("valid call");
        assert_eq!(d.allowed, allowed, "{policy:?}");
        let fallback = d.fallback.expect("the policy decided");
        assert_eq!(fallback.policy, policy);
        assert!(fallback.reason.contains("WRONGTYPE"), "{}", fallback.reason);
    }
    let _: () = redis::cmd("DEL").arg(&key).query(&mut con).expect("DEL");
}

#[test]
fn fail_open_allows_when_redis_is_down() {
    let limiter = Limiter::new(&dead_url(), FailurePolicy::Open).expect("url");
    for _ in 0..2 {
        let d = limiter.acquire("k", 1.0, 5.0, 1.0).expect("valid call");
        assert!(d.allowed);
        assert_eq!(d.fallback.map(|f| f.policy), Some(FailurePolicy::Open));
    }
    assert_eq!((limiter.failed_open(), limiter.failed_closed()), (2, 0));
}

#[test]
fn fail_closed_refuses_when_redis_is_down() {
    let limiter = Limiter::new(&dead_url(), FailurePolicy::Closed).expect("url");
    let d = limiter.acquire("k", 1.0, 5.0, 1.0).expect("valid call");
    assert!(!d.allowed);
    assert_eq!(d.retry_after_secs(), Some(1));
    assert_eq!(d.fallback.map(|f| f.policy), Some(FailurePolicy::Closed));
    assert_eq!((limiter.failed_open(), limiter.failed_closed()), (0, 1));
}

#[test]
fn a_server_that_never_answers_times_out_into_the_policy() {
    // Accepts connections and reads, but never replies: the read timeout bounds the wait.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "redis://127.0.0.1:{}/",
        listener.local_addr().expect("addr").port()
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 1024];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let limiter = Limiter::new(&url, FailurePolicy::Closed)
        .expect("url")
        .with_timeout(Duration::from_millis(100));
    let d = limiter.acquire("k", 1.0, 5.0, 1.0).expect("valid call");
    assert!(!d.allowed);
    assert!(d.fallback.is_some());
    assert_eq!(limiter.failed_closed(), 1);
}

#[test]
fn invalid_arguments_are_errors_never_fallbacks() {
    // Checked before any I/O, so a dead server does not matter: a bug is not an outage.
    let limiter = Limiter::new(&dead_url(), FailurePolicy::Open).expect("url");
    let bad: &[(f64, f64, f64)] = &[
        (0.0, 5.0, 1.0),           // no refill
        (1e10, 5.0, 1.0),          // too fast
        (f64::NAN, 5.0, 1.0),      // not a number
        (1.0, 0.0, 1.0),           // holds nothing
        (1.0, 1e16, 1.0),          // too big
        (1.0, 4e9, 1.0),           // refills over more than 100 years
        (1.0, 5.0, -1.0),          // negative cost
        (1.0, 5.0, f64::INFINITY), // infinite cost
    ];
    for &(rate, capacity, cost) in bad {
        let result = limiter.acquire("k", rate, capacity, cost);
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "({rate}, {capacity}, {cost}): {result:?}"
        );
    }
    assert_eq!((limiter.failed_open(), limiter.failed_closed()), (0, 0));
    assert!(matches!(
        Limiter::new("not a url", FailurePolicy::Open),
        Err(Error::InvalidUrl(_))
    ));
}

#[test]
fn a_refusal_carries_the_librarys_headers() {
    let limiter = Limiter::new(&redis_url(), FailurePolicy::Closed)
        .expect("url")
        .with_timeout(Duration::from_secs(2));
    let key = unique("headers");
    assert!(
        limiter
            .acquire(&key, 0.001, 1.0, 1.0)
            .expect("valid")
            .allowed
    );
    for _ in 0..3 {
        // The first refusal comes from Redis, the next from the library's deny cache: the
        // same answer either way.
        let d = limiter.acquire(&key, 0.001, 1.0, 1.0).expect("valid");
        assert!(!d.allowed);
        assert_eq!(d.fallback, None);
        assert!(
            d.headers.contains(&("X-RateLimit-Limit", "1".to_string())),
            "{:?}",
            d.headers
        );
        assert!(
            d.headers.contains(&("Retry-After", "1000".to_string())),
            "{:?}",
            d.headers
        );
    }
}
