//! RL.ACQUIRE.MULTI against a real server: all buckets or none, the first refusal and the
//! longest wait reported, an impossible bucket, a key named twice seeing its own earlier take,
//! every bad argument with its exact error; and at its size limit: the documented cap on
//! buckets per call (at the cap allowed, one more refused with an error naming the cap,
//! nothing written), keys named many times in one call, and the server time of a call at the
//! cap.
//!
//! The cap is read from the server, not copied here: a call far above any sane cap answers an
//! error that names it, and `COMMAND DOCS` must state the same number. The test then holds the
//! server to it in both directions.
//!
//! Time: rates are 0.001 token/s, so refill cannot change a reply during a test. The one
//! timing assert is a generous bound on the server's own time (`INFO commandstats`) for a
//! call at the cap, the best of three calls so a preempted one does not count; the measured
//! figure is in bench/results.md.

#![cfg(test)]

mod common;

use common::info::info;
use common::rl::{acquire, multi, peek, Multi};
use common::texts::{CAPACITY, COST, RATE, REFILL};
use common::{
    arity, assert_rejected_on_empty_server, command, dbsize, dump, error_text, exists, snapshot,
    Server,
};
use redis::{Connection, Value};

/// Server time a call at the cap must stay under (debug build, loaded machine). The release
/// build measures about 1 ms for 1,000 new buckets; a quadratic or blocking path at 100,000
/// took seconds.
const CAP_CALL_BOUND_US: f64 = 100_000.0;

/// `key 0.001 capacity 1` for each key, as one RL.ACQUIRE.MULTI.
fn multi_cmd(keys: &[String], capacity: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for key in keys {
        cmd.arg(key).arg("0.001").arg(capacity).arg("1");
    }
    cmd
}

/// The reply of an RL.ACQUIRE.MULTI: allowed, refused index, retry, per-bucket replies.
fn multi_reply(con: &mut Connection, cmd: &redis::Cmd) -> (i64, i64, i64, Vec<[i64; 4]>) {
    cmd.query(con).expect("RL.ACQUIRE.MULTI reply")
}

/// `n` distinct keys sharing one hash tag, as a cluster would need.
fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{{{prefix}}}:{i}")).collect()
}

/// The cap as the server states it: the number in "at most N buckets" of the error for a call
/// far above any reasonable cap.
fn stated_cap(con: &mut Connection) -> usize {
    let text = error_text(con, &multi_cmd(&keys("probe", 100_000), "10"));
    let cap = text
        .strip_prefix("ERR RL.ACQUIRE.MULTI takes at most ")
        .and_then(|rest| rest.split_once(" buckets"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("100,000 buckets did not get the cap error: {text}"));
    assert_eq!(dbsize(con), 0, "the refused call wrote");
    cap
}

#[test]
fn multi_allows_exactly_the_documented_number_of_buckets() {
    let server = Server::start();
    let mut con = server.conn();
    let cap = stated_cap(&mut con);
    assert!(
        (100..=100_000).contains(&cap),
        "a cap of {cap} buckets is outside any sensible range"
    );

    // COMMAND DOCS states the same cap in its complexity (Redis 7.0+ has COMMAND DOCS).
    let docs: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("RL.ACQUIRE.MULTI")
        .query(&mut con)
        .expect("COMMAND DOCS");
    let docs = format!("{docs:?}");
    assert!(
        docs.contains("O(N log N)") && docs.contains(&format!("at most {cap} per call")),
        "COMMAND DOCS does not state the complexity and the cap of {cap}: {docs}"
    );

    // Some buckets exist before the refused calls: none of them may change.
    let existing = keys("t", 3);
    let (allowed, ..) = multi_reply(&mut con, &multi_cmd(&existing, "10"));
    assert_eq!(allowed, 1);
    let before: Vec<Option<Vec<u8>>> = existing
        .iter()
        .map(|k| dump(&mut con, k.as_bytes()))
        .collect();

    // One more than the cap, the existing buckets first: refused whole, whatever the
    // arguments, before any is parsed (a bad rate in the last group gets the cap error too).
    let mut over = existing.clone();
    over.extend(keys("t", cap + 1).into_iter().skip(existing.len()));
    assert_eq!(over.len(), cap + 1);
    let want = format!(
        "ERR RL.ACQUIRE.MULTI takes at most {cap} buckets (key rate capacity cost groups) per call"
    );
    assert_eq!(error_text(&mut con, &multi_cmd(&over, "10")), want);
    let mut bad_rate = multi_cmd(&over, "10");
    bad_rate.arg("{t}:bad").arg("x").arg("10").arg("1");
    assert_eq!(error_text(&mut con, &bad_rate), want);
    assert_eq!(
        dbsize(&mut con),
        existing.len() as i64,
        "a refused call created keys"
    );
    let after: Vec<Option<Vec<u8>>> = existing
        .iter()
        .map(|k| dump(&mut con, k.as_bytes()))
        .collect();
    assert_eq!(after, before, "a refused call changed an existing bucket");

    // Exactly the cap: allowed, every bucket taken once. The existing ones had one token taken
    // already, so each reply's `remaining` is the capacity minus the takes of that key.
    let at_cap = &over[..cap];
    let (allowed, refused_index, retry_after_ms, buckets) =
        multi_reply(&mut con, &multi_cmd(at_cap, "10"));
    assert_eq!((allowed, refused_index, retry_after_ms), (1, -1, 0));
    assert_eq!(buckets.len(), cap);
    for (i, bucket) in buckets.iter().enumerate() {
        let takes = if i < existing.len() { 2 } else { 1 };
        assert_eq!(bucket[..3], [1, 10 - takes, 0], "bucket {i}: {bucket:?}");
    }
    assert_eq!(dbsize(&mut con), cap as i64);
    server.assert_alive();
}

#[test]
fn multi_at_the_cap_sees_its_own_takes_of_keys_named_many_times() {
    let server = Server::start();
    let mut con = server.conn();
    let cap = stated_cap(&mut con);
    // `cap` groups over 7 keys, named in a scattered order (i * 3 mod 7), so that equal names
    // are never adjacent in the arguments. Each key's capacity is exactly how often it is
    // named: the call is allowed and every key ends empty.
    const KEYS: usize = 7;
    let key_of = |i: usize| format!("{{d}}:{}", (i * 3) % KEYS);
    let named = |k: usize| (0..cap).filter(|&i| (i * 3) % KEYS == k).count();
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for i in 0..cap {
        let capacity = named((i * 3) % KEYS).to_string();
        cmd.arg(key_of(i)).arg("0.001").arg(capacity).arg("1");
    }
    let (allowed, refused_index, _, buckets) = multi_reply(&mut con, &cmd);
    assert_eq!((allowed, refused_index), (1, -1));
    // The n-th naming of a key (from 1) leaves its capacity minus n.
    let mut seen = [0i64; KEYS];
    for (i, bucket) in buckets.iter().enumerate() {
        let k = (i * 3) % KEYS;
        seen[k] += 1;
        let want_remaining = named(k) as i64 - seen[k];
        assert_eq!(bucket[..3], [1, want_remaining, 0], "group {i}: {bucket:?}");
    }
    assert_eq!(dbsize(&mut con), KEYS as i64);

    // The same shape on new keys, but key 0 gets one token less than it is named: every
    // group is allowed on its own until key 0's last naming, which finds its own earlier takes
    // have emptied it. The call is refused there, and nothing is written.
    let short_key = 0;
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for i in 0..cap {
        let k = (i * 3) % KEYS;
        let capacity = named(k) - usize::from(k == short_key);
        cmd.arg(format!("{{e}}:{k}"))
            .arg("0.001")
            .arg(capacity.to_string())
            .arg("1");
    }
    let (allowed, refused_index, retry_after_ms, buckets) = multi_reply(&mut con, &cmd);
    let last_naming = (0..cap)
        .rev()
        .find(|&i| (i * 3) % KEYS == short_key)
        .expect("key 0 is named");
    assert_eq!((allowed, refused_index), (0, last_naming as i64));
    assert_eq!(
        buckets[last_naming][..2],
        [0, 0],
        "{:?}",
        buckets[last_naming]
    );
    assert!(retry_after_ms > 0, "a wait for a refill, not impossible");
    assert_eq!(dbsize(&mut con), KEYS as i64, "a refused call created keys");
}

/// `usec_per_call` of RL.ACQUIRE.MULTI in `INFO commandstats`.
fn usec_per_call(con: &mut Connection) -> f64 {
    let text = info(con, "commandstats");
    let line = text
        .lines()
        .find(|l| {
            l.to_ascii_lowercase()
                .starts_with("cmdstat_rl.acquire.multi:")
        })
        .unwrap_or_else(|| panic!("no RL.ACQUIRE.MULTI in INFO commandstats:\n{text}"));
    line.split([':', ','])
        .find_map(|kv| kv.strip_prefix("usec_per_call="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no usec_per_call in {line}"))
}

#[test]
fn multi_at_the_cap_takes_little_server_time() {
    let server = Server::start();
    let mut con = server.conn();
    let cap = stated_cap(&mut con);
    // New buckets each time: the most work a call can do (a create and a write per bucket).
    let best_us = (0..3)
        .map(|round| {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut con)
                .expect("CONFIG RESETSTAT");
            let (allowed, ..) =
                multi_reply(&mut con, &multi_cmd(&keys(&format!("r{round}"), cap), "5"));
            assert_eq!(allowed, 1);
            usec_per_call(&mut con)
        })
        .fold(f64::INFINITY, f64::min);
    assert!(
        best_us < CAP_CALL_BOUND_US,
        "an RL.ACQUIRE.MULTI of {cap} new buckets took {best_us} µs of server time"
    );
    // Sanity: the call did its work (3 rounds of cap new keys).
    assert_eq!(dbsize(&mut con), 3 * cap as i64);
}

#[test]
fn multi_takes_from_every_bucket_or_from_none() {
    let server = Server::start();
    let mut con = server.conn();
    // Fresh buckets, all read at one instant: exact replies.
    assert_eq!(
        multi(&mut con, &["a", "0.001", "2", "1", "b", "0.001", "1", "1"]),
        Multi {
            allowed: 1,
            refused_index: -1,
            retry_after_ms: 0,
            buckets: vec![vec![1, 1, 0, 1_000_000], vec![1, 0, 0, 1_000_000]],
        }
    );
    let before = snapshot(&mut con);
    let names: Vec<&[u8]> = before.iter().map(|(key, _, _)| &key[..]).collect();
    assert_eq!(names, [&b"a"[..], b"b"], "both buckets, and nothing else");

    // `b` is empty now: the call is refused at index 1 and nothing is taken from `a`, whose
    // reply still shows what it alone would answer (allowed).
    let refused = multi(&mut con, &["a", "0.001", "2", "1", "b", "0.001", "1", "1"]);
    assert_eq!((refused.allowed, refused.refused_index), (0, 1));
    assert_eq!(refused.buckets[0][..3], [1, 0, 0]);
    let [b_allowed, b_remaining, b_retry, b_reset] = refused.buckets[1][..] else {
        unreachable!()
    };
    assert_eq!((b_allowed, b_remaining), (0, 0));
    assert!(b_retry > 0 && b_retry <= 1_000_000 && b_retry == b_reset);
    assert_eq!(refused.retry_after_ms, b_retry);
    assert_eq!(
        snapshot(&mut con),
        before,
        "a refused call changed a bucket"
    );
    assert_eq!(peek(&mut con, &["a", "0.001", "2"])[..2], [1, 1]);

    // A refused call creates none of its missing buckets either.
    let refused = multi(
        &mut con,
        &["new", "0.001", "5", "1", "b", "0.001", "1", "1"],
    );
    assert_eq!((refused.allowed, refused.refused_index), (0, 1));
    assert_eq!(refused.buckets[0], [1, 4, 0, 1_000_000]);
    assert!(!exists(&mut con, b"new"));

    // Cost 0 everywhere: allowed, and nothing is written.
    let zero = multi(&mut con, &["z", "0.001", "5", "0", "a", "0.001", "2", "0"]);
    assert_eq!(
        (zero.allowed, zero.refused_index, zero.retry_after_ms),
        (1, -1, 0)
    );
    assert_eq!(zero.buckets[0], [1, 5, 0, 0]);
    assert_eq!(snapshot(&mut con), before);

    // A failing argument in a later group touches no earlier bucket.
    let err = error_text(
        &mut con,
        &command(
            "RL.ACQUIRE.MULTI",
            &[b"a", b"0.001", b"2", b"1", b"c", b"x", b"1", b"1"],
        ),
    );
    assert_eq!(err, RATE);
    assert_eq!(snapshot(&mut con), before);

    // When every bucket has the tokens, all of them are taken.
    let taken = multi(&mut con, &["a", "0.001", "2", "1", "c", "0.001", "1", "1"]);
    assert_eq!((taken.allowed, taken.refused_index), (1, -1));
    assert_eq!(taken.buckets[0][..3], [1, 0, 0]);
    assert_eq!(taken.buckets[1], [1, 0, 0, 1_000_000]);
    assert!(exists(&mut con, b"c"));
    assert_eq!(peek(&mut con, &["a", "0.001", "2"])[..2], [0, 0]);
}

#[test]
fn multi_reports_the_first_refusal_and_the_longest_wait() {
    let server = Server::start();
    let mut con = server.conn();
    // `short` waits 1000 s for one token; `long` waits 2000 s for two.
    acquire(&mut con, &["short", "0.001", "1"]);
    acquire(&mut con, &["long", "0.001", "3", "3"]);
    let before = snapshot(&mut con);
    let reply = multi(
        &mut con,
        &[
            "ok", "0.001", "5", "1", "short", "0.001", "1", "1", "long", "0.001", "3", "2",
        ],
    );
    assert_eq!((reply.allowed, reply.refused_index), (0, 1));
    let short_retry = reply.buckets[1][2];
    let long_retry = reply.buckets[2][2];
    assert!(short_retry > 0 && long_retry > short_retry, "{reply:?}");
    assert_eq!(reply.retry_after_ms, long_retry, "the longest wait");
    assert_eq!(reply.buckets[2][3] - long_retry, 1_000_000, "{reply:?}");
    assert_eq!(snapshot(&mut con), before);
    assert!(!exists(&mut con, b"ok"));
}

#[test]
fn multi_with_an_impossible_bucket_never_succeeds() {
    let server = Server::start();
    let mut con = server.conn();
    // Alone: a cost above the capacity.
    assert_eq!(
        multi(&mut con, &["imp", "0.001", "2", "3"]),
        Multi {
            allowed: 0,
            refused_index: 0,
            retry_after_ms: -1,
            buckets: vec![vec![0, 2, -1, 0]],
        }
    );
    // Beside a bucket that only needs to wait, the call still can never succeed: -1 wins.
    acquire(&mut con, &["wait", "0.001", "1"]);
    let before = snapshot(&mut con);
    let reply = multi(
        &mut con,
        &[
            "wait", "0.001", "1", "1", "imp", "0.001", "2", "3", "ok", "0.001", "1", "1",
        ],
    );
    assert_eq!(
        (reply.allowed, reply.refused_index, reply.retry_after_ms),
        (0, 0, -1)
    );
    assert!(reply.buckets[0][2] > 0, "{reply:?}");
    assert_eq!(reply.buckets[1], [0, 2, -1, 0]);
    assert_eq!(reply.buckets[2], [1, 0, 0, 1_000_000]);
    assert_eq!(snapshot(&mut con), before);
}

#[test]
fn multi_sees_its_own_earlier_take_of_a_key_named_twice() {
    let server = Server::start();
    let mut con = server.conn();
    // One token, asked for twice: the second group sees the first one's take and refuses,
    // so the whole call takes nothing.
    assert_eq!(
        multi(&mut con, &["s", "0.001", "1", "1", "s", "0.001", "1", "1"]),
        Multi {
            allowed: 0,
            refused_index: 1,
            retry_after_ms: 1_000_000,
            buckets: vec![vec![1, 0, 0, 1_000_000], vec![0, 0, 1_000_000, 1_000_000]],
        }
    );
    assert!(!exists(&mut con, b"s"));
    // Two tokens, asked for twice: both taken, in order.
    assert_eq!(
        multi(&mut con, &["s", "0.001", "2", "1", "s", "0.001", "2", "1"]),
        Multi {
            allowed: 1,
            refused_index: -1,
            retry_after_ms: 0,
            buckets: vec![vec![1, 1, 0, 1_000_000], vec![1, 0, 0, 2_000_000]],
        }
    );
    assert_eq!(peek(&mut con, &["s", "0.001", "2"])[..2], [0, 0]);
    // A different limit on the same key in the same call reads the same stored instant: 7
    // tokens (7000 s) short after the first group, which at 0.002/s is 14 tokens of 20.
    acquire(&mut con, &["t", "0.001", "10", "4"]);
    let reply = multi(
        &mut con,
        &["t", "0.001", "10", "3", "t", "0.002", "20", "0"],
    );
    assert_eq!(reply.allowed, 1);
    assert_eq!(reply.buckets[0][1], 3, "{reply:?}");
    assert_eq!(reply.buckets[1][1], 20 - 14, "{reply:?}");
}

#[test]
fn multi_rejects_each_bad_argument_with_its_exact_error() {
    let a = arity("RL.ACQUIRE.MULTI");
    let a = a.as_str();
    let rows: &[(&[&[u8]], &str)] = &[
        // --- arity: groups of exactly key rate capacity cost
        (&[], a),                                           // nothing after the name
        (&[b"a"], a),                                       // key only
        (&[b"a", b"1", b"10"], a),                          // no cost: it is required here
        (&[b"a", b"1", b"10", b"1", b"b"], a),              // a second group of one
        (&[b"a", b"1", b"10", b"1", b"b", b"1"], a),        // a second group of two
        (&[b"a", b"1", b"10", b"1", b"b", b"1", b"10"], a), // the second group lacks its cost
        (&[b"a", b"1", b"10", b"1", b"1"], a),              // one argument too many
        (&[b"a", b"x", b"x", b"x", b"x"], a),               // arity is checked before values
        // --- values, in the first or a later group
        (&[b"a", b"x", b"10", b"1"], RATE),
        (&[b"a", b"1", b"0", b"1"], CAPACITY),
        (&[b"a", b"1", b"3153600001", b"1"], REFILL),
        (&[b"a", b"1", b"10", b"-1"], COST),
        (&[b"a", b"1", b"10", b"1", b"b", b"0", b"10", b"1"], RATE),
        (
            &[b"a", b"1", b"10", b"1", b"b", b"1", b"1e16", b"1"],
            CAPACITY,
        ),
        (&[b"a", b"1", b"10", b"1", b"b", b"1", b"10", b"nan"], COST),
        // groups are parsed in order: the first group's cost before the second group's rate
        (&[b"a", b"1", b"10", b"x", b"b", b"x", b"10", b"1"], COST),
    ];
    assert_rejected_on_empty_server("RL.ACQUIRE.MULTI", rows);
}
