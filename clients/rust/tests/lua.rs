//! A plain server without the module: the shipped Lua script decides, with the module's
//! decisions for the same calls, one string per bucket with an absolute expiry, sent again as EVAL
//! after SCRIPT FLUSH (never SCRIPT LOAD), and under `WithoutModule::Refuse` the missing
//! module is a misconfiguration: `check` names it, calls go to the policy.

#![cfg(test)]

mod common;

use std::time::Instant;

use common::{limiter, options, slow, Server};
use redis_rl_client::{Decision, Error, Limit, Limiter, OnError, Path, Source, WithoutModule};

/// One reply of the fixed sequence: the single decisions, or an acquire_all's.
#[derive(Debug)]
enum Step {
    One(Decision),
    Refund(u64, i64),
    All(bool, Option<usize>, Vec<Decision>),
}

/// One fixed sequence of calls: bursts, denials, the impossible, cost 0, peek, refund,
/// acquire_all; at 1/s and at rates whose period is not a whole number of ns or µs: exact
/// ones (0.75/s: T = 4e9/3 ns, 0.875/s: T = 8e9/7 ns) and an inexact one (0.3/s), all slow
/// enough that a stall of the machine mid-sequence refills nothing.
fn sequence(limiter: &Limiter) -> Vec<Step> {
    let mut out = Vec::new();
    for (rate, capacity) in [(1.0, 5.0), (0.75, 3.0), (0.875, 7.0), (0.3, 3.0)] {
        let key = format!("a:{rate}");
        let limit = Limit::new(rate, capacity).unwrap();
        let burst = capacity as usize;
        for cost in std::iter::repeat_n(1.0, burst).chain([1.0, capacity + 1.0, 0.0, 2.0]) {
            out.push(Step::One(limiter.acquire(&key, &limit, cost).unwrap()));
        }
        out.push(Step::One(limiter.peek(&key, &limit, 1.0).unwrap()));
        let r = limiter.refund(&key, &limit, 2.0).unwrap();
        out.push(Step::Refund(r.remaining, r.reset_after_ms));
        out.push(Step::One(limiter.acquire(&key, &limit, 2.0).unwrap()));
        out.push(Step::One(limiter.acquire(&key, &limit, 1.0).unwrap()));
    }
    let items = [
        ("{t}s", Limit::new(1.0, 2.0).unwrap(), 1.0),
        ("{t}h", Limit::new(0.5, 3.0).unwrap(), 1.0),
        ("{t}s", Limit::new(1.0, 2.0).unwrap(), 1.0),
    ];
    for _ in 0..3 {
        let all = limiter.acquire_all(&items).unwrap();
        out.push(Step::All(all.allowed, all.refused_index, all.decisions));
    }
    out
}

#[test]
fn lua_gives_the_modules_decisions_for_the_same_calls() {
    let with_module = Server::start();
    let plain = Server::plain();
    let module_limiter = limiter(&with_module, options(OnError::Closed));
    let lua_limiter = limiter(&plain, options(OnError::Closed));
    let started = Instant::now();
    let expected = sequence(&module_limiter);
    let middle = Instant::now();
    let got = sequence(&lua_limiter);
    let took_ms = (middle - started).max(middle.elapsed()).as_millis() as i64 + 1;
    assert_eq!(lua_limiter.path(), Some(Path::Lua));
    assert_eq!(expected.len(), got.len());
    // The two servers decide at different instants: allowed, remaining, refused_index and -1
    // must agree exactly; waits may differ by the time the sequences took (rounded up).
    let close = |a: &Decision, b: &Decision, what: &str| {
        assert_eq!((a.allowed, a.remaining), (b.allowed, b.remaining), "{what}");
        assert_eq!(a.retry_after_ms < 0, b.retry_after_ms < 0, "{what}");
        assert!(
            (a.retry_after_ms - b.retry_after_ms).abs() <= took_ms,
            "{what}"
        );
        assert!(
            (a.reset_after_ms - b.reset_after_ms).abs() <= took_ms,
            "{what}"
        );
        assert_eq!((a.source, b.source), (Source::Redis, Source::Lua), "{what}");
    };
    let mut denials = 0;
    for (i, (a, b)) in expected.iter().zip(&got).enumerate() {
        let what = format!("step {i}: module {a:?}, lua {b:?}");
        match (a, b) {
            (Step::One(x), Step::One(y)) => {
                close(x, y, &what);
                denials += usize::from(!x.allowed);
            }
            (Step::Refund(r1, t1), Step::Refund(r2, t2)) => {
                assert_eq!(r1, r2, "{what}");
                assert!((t1 - t2).abs() <= took_ms, "{what}");
            }
            (Step::All(a1, i1, d1), Step::All(a2, i2, d2)) => {
                assert_eq!((a1, i1, d1.len()), (a2, i2, d2.len()), "{what}");
                for (x, y) in d1.iter().zip(d2) {
                    close(x, y, &what);
                }
            }
            _ => panic!("{what}"),
        }
    }
    assert!(denials >= 12, "the sequence exercises denials ({denials})");
}

#[test]
fn lua_bucket_is_a_string_with_an_absolute_expiry() {
    let plain = Server::plain();
    let limiter = limiter(&plain, options(OnError::Closed));
    let limit = Limit::new(1.0, 2.0).unwrap();
    limiter.acquire("k", &limit, 1.0).unwrap();
    let mut admin = plain.conn();
    let kind: String = redis::cmd("TYPE").arg("k").query(&mut admin).unwrap();
    assert_eq!(kind, "string");
    // "rl" and three little-endian doubles q, r, D: the instant q + r/D µs when the bucket is
    // full (1/s: D = 1, r = 0).
    let value: Vec<u8> = redis::cmd("GET").arg("k").query(&mut admin).unwrap();
    assert_eq!((value.len(), &value[..2]), (26, &b"rl"[..]), "{value:?}");
    let n = |i: usize| f64::from_le_bytes(value[2 + 8 * i..10 + 8 * i].try_into().unwrap());
    assert_eq!((n(1), n(2)), (0.0, 1.0), "{value:?}");
    assert_eq!(n(0).fract(), 0.0, "{value:?}");
    let full_at_us = n(0) as i64;
    let expire_ms: i64 = redis::cmd("PEXPIRETIME")
        .arg("k")
        .query(&mut admin)
        .unwrap();
    assert_eq!(expire_ms, (full_at_us + 999) / 1000);
    // A full bucket again deletes the key.
    assert_eq!(limiter.refund("k", &limit, 1.0).unwrap().remaining, 2);
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut admin).unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn the_script_goes_as_eval_after_script_flush_never_script_load() {
    let plain = Server::plain();
    let limiter = limiter(&plain, options(OnError::Closed));
    // The first call: EVALSHA meets NOSCRIPT, and the same call goes again as EVAL.
    limiter.acquire("k", &slow(), 1.0).unwrap();
    assert_eq!((plain.calls("evalsha"), plain.calls("eval")), (1, 1));
    limiter.acquire("k", &slow(), 1.0).unwrap();
    assert_eq!((plain.calls("evalsha"), plain.calls("eval")), (2, 1));
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut plain.conn())
        .unwrap();
    let d = limiter.acquire("k", &slow(), 1.0).unwrap();
    assert_eq!((d.remaining, d.source), (2, Source::Lua));
    assert_eq!((plain.calls("evalsha"), plain.calls("eval")), (3, 2));
    assert_eq!(plain.calls("script|load"), 0);
    assert_eq!(limiter.counters().lua, 3);
}

#[test]
fn refuse_without_the_module_is_a_misconfiguration() {
    let plain = Server::plain();
    let limiter = limiter(
        &plain,
        options(OnError::Open).without_module(WithoutModule::Refuse),
    );
    match limiter.check() {
        Err(e @ Error::Misconfigured(_)) => {
            assert!(e.to_string().contains("WithoutModule::Refuse"), "{e}")
        }
        other => panic!("expected Misconfigured, got {other:?}"),
    }
    assert_eq!(limiter.path(), Some(Path::Missing));
    // At run time the policy decides, counted apart: not an outage.
    let d = limiter.acquire("k", &slow(), 1.0).unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Open));
    let counters = limiter.counters();
    assert_eq!(
        (counters.misconfigured, counters.open, counters.outages),
        (1, 0, 0)
    );
    assert_eq!(
        plain.calls("evalsha") + plain.calls("eval") + plain.calls("fcall_ro"),
        0
    );
}
