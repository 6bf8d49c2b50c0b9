//! The commands beside RL.ACQUIRE, against a real server: RL.PEEK, RL.ACQUIRE.MULTI,
//! RL.THROTTLE (and its CL.THROTTLE alias), RL.REFUND, the module load arguments, the
//! `INFO rl` counters and the `ratelimit` ACL category.
//!
//! Each command gets its happy path with exact replies, a table of bad arguments (exact error
//! text, no key created, `PING` still answers), `WRONGTYPE` on foreign keys, its declared
//! keys, and replication by effect.
//!
//! Time: rates are 0.001 token/s or slower (or one token per hour for RL.THROTTLE), so refill
//! cannot change a reply during a test. Where a reply depends on how much time passed since an
//! earlier call, the test asserts an exact relation instead of a value (two waits differing by
//! a whole number of tokens, an expiry moving by exactly the refunded time), or relies on a
//! wait being rounded up to a whole second. That holds only while the calls span less than a
//! second, so those runs measure their span on the server's clock and are repeated on new keys
//! when a stalled machine made them longer (`within_server_time`). Nothing asserts a
//! wall-clock duration.

mod common;

use common::info::{calls, info, info_field};
use common::{
    all_keys, assert_rejected_on_empty_server, command, dbsize, dump, error_text, exists, fresh,
    pexpiretime, show, wait_for_replica, Server,
};
use redis::Connection;

const RATE: &str = "ERR rate must be a number from 0.000001 to 1000000000 (tokens per second)";
const CAPACITY: &str = "ERR capacity must be a number above 0 and at most 1e15 (tokens)";
const REFILL: &str =
    "ERR capacity / rate must be at most 3153600000 (a full refill within 100 years)";
const THROTTLE_REFILL: &str = "ERR (max_burst + 1) * period / count_per_period must be at most 3153600000 (a full refill within 100 years)";
const COST: &str = "ERR cost must be a finite number >= 0 (tokens)";
const MAX_BURST: &str = "ERR max_burst must be an integer from 0 to 999999999999999";
const COUNT: &str = "ERR count_per_period must be an integer from 1 to 1000000000";
const PERIOD: &str = "ERR period must be an integer from 1 to 3153600000 (seconds)";
const QUANTITY: &str = "ERR quantity must be an integer >= 0";
const THROTTLE_RATE: &str =
    "ERR count_per_period / period must be from 0.000001 to 1000000000 per second";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// The server's text for a wrong argument count. The server checks the minimum itself (from
/// the declared arity) and the module checks the rest; both must give this text.
fn arity(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A command's reply as a flat list of integers.
fn ints(con: &mut Connection, name: &str, args: &[&str]) -> Vec<i64> {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd.query(con)
        .unwrap_or_else(|e| panic!("{name} {args:?}: {e}"))
}

fn peek(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.PEEK", args)
}

fn throttle(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.THROTTLE", args)
}

fn refund(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.REFUND", args)
}

fn acquire(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.ACQUIRE", args)
}

/// `RL.ACQUIRE.MULTI`'s reply.
#[derive(Debug, PartialEq)]
struct Multi {
    allowed: i64,
    refused_index: i64,
    retry_after_ms: i64,
    buckets: Vec<Vec<i64>>,
}

fn multi(con: &mut Connection, args: &[&str]) -> Multi {
    let (allowed, refused_index, retry_after_ms, buckets): (i64, i64, i64, Vec<Vec<i64>>) =
        redis::cmd("RL.ACQUIRE.MULTI")
            .arg(args)
            .query(con)
            .unwrap_or_else(|e| panic!("RL.ACQUIRE.MULTI {args:?}: {e}"));
    for bucket in &buckets {
        assert_eq!(bucket.len(), 4, "each bucket's reply is 4 integers");
    }
    Multi {
        allowed,
        refused_index,
        retry_after_ms,
        buckets,
    }
}

/// The server's clock (`TIME`) in µs.
fn server_time_us(con: &mut Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000_000 + micros
}

/// Runs `steps` until one run spans less than `limit_us` of the server's clock (`TIME` before
/// and after), at most five times, passing the run's number so each run can use new keys.
/// For replies that are exact only while the calls take less than a rounding unit: on a
/// machine stalled that long, the run is repeated rather than asserted on, since the stall,
/// not the module, changed the replies.
fn within_server_time<T>(
    con: &mut Connection,
    limit_us: i64,
    mut steps: impl FnMut(&mut Connection, usize) -> T,
) -> T {
    let mut spans = Vec::new();
    for run in 0..5 {
        let before = server_time_us(con);
        let result = steps(con, run);
        let span = server_time_us(con) - before;
        if span < limit_us {
            return result;
        }
        spans.push(span);
    }
    panic!("every run took {limit_us} µs or more of the server's clock: {spans:?}");
}

/// Each key's DUMP payload and PEXPIRETIME, sorted by key.
type Snapshot = Vec<(Vec<u8>, Option<Vec<u8>>, i64)>;

fn snapshot(con: &mut Connection) -> Snapshot {
    all_keys(con)
        .into_iter()
        .map(|key| {
            let payload = dump(con, &key);
            let expire_at = pexpiretime(con, &key);
            (key, payload, expire_at)
        })
        .collect()
}

/// Bad `rate capacity [cost]` values, shared by RL.PEEK and RL.REFUND (the key is `k`).
const BAD_LIMITS: &[(&[&[u8]], &str)] = &[
    (&[b"k", b"x", b"10"], RATE),              // rate not a number
    (&[b"k", b"0", b"10"], RATE),              // zero rate
    (&[b"k", b"1e10", b"10"], RATE),           // above 1e9/s
    (&[b"k", b"nan", b"10"], RATE),            // NaN
    (&[b"k", b"1", b"0"], CAPACITY),           // zero capacity
    (&[b"k", b"1", b"1e16"], CAPACITY),        // above 1e15
    (&[b"k", b"1", b"inf"], CAPACITY),         // infinity
    (&[b"k", b"1", b"3153600001"], REFILL),    // a full refill longer than 100 years
    (&[b"k", b"1", b"10", b"-1"], COST),       // negative cost
    (&[b"k", b"1", b"10", b"nan"], COST),      // NaN cost
    (&[b"k", b"1", b"10", b"x"], COST),        // junk cost
    (&[b"k", b"1", b"10", b"\xff\xfe"], COST), // not UTF-8
    (&[b"k", b"x", b"x", b"x"], RATE),         // several bad: the first is named
    (&[b"k", b"1", b"0", b"-1"], CAPACITY),    // capacity before cost
];

/// Rows for a `key rate capacity [cost]` command: its arity errors, then [`BAD_LIMITS`].
fn limit_rows(name: &str) -> Vec<(Vec<&'static [u8]>, String)> {
    let arity_rows: &[&[&[u8]]] = &[
        &[],                              // nothing after the name
        &[b"k"],                          // key only
        &[b"k", b"1"],                    // no capacity
        &[b"k", b"1", b"10", b"1", b"1"], // one argument too many
    ];
    arity_rows
        .iter()
        .map(|args| (args.to_vec(), arity(name)))
        .chain(
            BAD_LIMITS
                .iter()
                .map(|(args, want)| (args.to_vec(), want.to_string())),
        )
        .collect()
}

// ---------------------------------------------------------------------------------------------
// RL.PEEK

#[test]
fn peek_answers_like_acquire_and_takes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    // A missing key is a full bucket; peeking creates nothing.
    assert_eq!(peek(&mut con, &["k", "0.001", "3"]), [1, 3, 0, 0]);
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "3"]), [1, 3, 0, 0]);
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "0"]), [1, 3, 0, 0]);
    // More than the capacity: never possible, as RL.ACQUIRE says.
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "4"]), [0, 3, -1, 0]);
    assert!(!exists(&mut con, b"k"), "RL.PEEK created a key");

    assert_eq!(
        acquire(&mut con, &["k", "0.001", "3", "2"]),
        [1, 1, 0, 2_000_000]
    );
    let before = dump(&mut con, b"k").expect("bucket");
    let expire_before = pexpiretime(&mut con, b"k");

    // Enough for one: allowed, and remaining is the bucket now (1), not after a take (0).
    let [allowed, remaining, retry, reset] = peek(&mut con, &["k", "0.001", "3"])[..] else {
        unreachable!()
    };
    assert_eq!((allowed, remaining, retry), (1, 1, 0));
    assert!(reset > 0 && reset <= 2_000_000, "reset {reset}");
    // Not enough for two: the wait is one token (1000 s) shorter than the full refill, exactly.
    let [allowed, remaining, retry, reset] = peek(&mut con, &["k", "0.001", "3", "2"])[..] else {
        unreachable!()
    };
    assert_eq!((allowed, remaining), (0, 1));
    assert_eq!(reset - retry, 1_000_000, "retry {retry} reset {reset}");
    assert!(retry > 0 && retry <= 1_000_000);
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "4"])[..3], [0, 1, -1]);

    // Nothing was written by any of it, and RL.ACQUIRE agrees with what was peeked.
    assert_eq!(dump(&mut con, b"k"), Some(before));
    assert_eq!(pexpiretime(&mut con, b"k"), expire_before);
    assert_eq!(acquire(&mut con, &["k", "0.001", "3", "2"])[..2], [0, 1]);
    assert_eq!(acquire(&mut con, &["k", "0.001", "3"])[..2], [1, 0]);
}

#[test]
fn peek_rejects_each_bad_argument_with_its_exact_error() {
    assert_rejected_on_empty_server("RL.PEEK", &limit_rows("RL.PEEK"));
}

#[test]
fn peek_works_on_a_read_only_replica_where_writes_get_readonly() {
    let master_server = Server::start();
    let mut master = master_server.conn();
    assert_eq!(
        acquire(&mut master, &["k", "0.001", "3", "3"]),
        [1, 0, 0, 3_000_000]
    );
    let replica_server = master_server.start_replica();
    let mut replica = replica_server.conn();
    wait_for_replica(&mut master);

    // The replica sees the empty bucket: the wait for one token is two tokens (2000 s)
    // shorter than the full refill, exactly.
    let [allowed, remaining, retry, reset] = peek(&mut replica, &["k", "0.001", "3"])[..] else {
        unreachable!()
    };
    assert_eq!((allowed, remaining), (0, 0));
    assert_eq!(reset - retry, 2_000_000, "retry {retry} reset {reset}");
    assert_eq!(peek(&mut replica, &["fresh", "0.001", "3"]), [1, 3, 0, 0]);
    // ...also from a read-only script on the replica.
    let from_script: Vec<i64> = redis::cmd("EVAL_RO")
        .arg("return redis.call('RL.PEEK', KEYS[1], '0.001', '3')")
        .arg(1)
        .arg("k")
        .query(&mut replica)
        .expect("EVAL_RO on the replica");
    assert_eq!(from_script[..2], [0, 0]);

    // Every command that can write is refused by the server before it runs.
    let writes: &[(&str, &[&[u8]])] = &[
        ("RL.ACQUIRE", &[b"k", b"0.001", b"3"]),
        ("RL.ACQUIRE", &[b"k", b"0.001", b"3", b"0"]),
        ("RL.ACQUIRE.MULTI", &[b"k", b"0.001", b"3", b"1"]),
        ("RL.THROTTLE", &[b"k", b"2", b"1", b"3600"]),
        ("RL.REFUND", &[b"k", b"0.001", b"3"]),
    ];
    let before = snapshot(&mut replica);
    for (name, args) in writes {
        let err = error_text(&mut replica, &command(name, args));
        assert!(err.starts_with("READONLY "), "{name} on a replica: {err}");
    }
    assert_eq!(snapshot(&mut replica), before);
}

#[test]
fn peek_works_inside_read_only_scripts() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, &["k", "0.001", "3", "2"]);
    let before = snapshot(&mut con);
    let script = "return redis.call('RL.PEEK', KEYS[1], '0.001', '3', ARGV[1])";
    let reply: Vec<i64> = redis::cmd("EVAL_RO")
        .arg(script)
        .arg(1)
        .arg("k")
        .arg("1")
        .query(&mut con)
        .expect("EVAL_RO");
    assert_eq!(reply[..3], [1, 1, 0]);
    let no_writes = format!("#!lua flags=no-writes\n{script}");
    let reply: Vec<i64> = redis::cmd("EVAL")
        .arg(&no_writes)
        .arg(1)
        .arg("k")
        .arg("2")
        .query(&mut con)
        .expect("EVAL with flags=no-writes");
    assert_eq!(reply[..2], [0, 1]);

    // A read-only script may not take: the server refuses RL.ACQUIRE (a write command).
    for (eval, body) in [
        (
            "EVAL_RO",
            "return redis.call('RL.ACQUIRE', KEYS[1], '0.001', '3')".to_string(),
        ),
        (
            "EVAL",
            "#!lua flags=no-writes\nreturn redis.call('RL.ACQUIRE', KEYS[1], '0.001', '3')"
                .to_string(),
        ),
    ] {
        let mut cmd = redis::cmd(eval);
        cmd.arg(body).arg(1).arg("k");
        let err = error_text(&mut con, &cmd);
        assert!(
            err.starts_with("ERR ") && err.contains("read-only"),
            "{eval}: {err}"
        );
    }
    assert_eq!(
        snapshot(&mut con),
        before,
        "a read-only script changed a bucket"
    );
}

// ---------------------------------------------------------------------------------------------
// RL.ACQUIRE.MULTI

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

// ---------------------------------------------------------------------------------------------
// RL.THROTTLE and CL.THROTTLE

#[test]
fn throttle_gives_redis_cells_documented_reply() {
    let server = Server::start();
    let mut con = server.conn();
    // redis-cell's README: `CL.THROTTLE user123 15 30 60` on a fresh key.
    assert_eq!(
        throttle(&mut con, &["user123", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
}

#[test]
fn throttle_counts_down_then_limits() {
    let server = Server::start();
    let mut con = server.conn();
    // A burst of 3 (max_burst 2), one more per hour. Each wait rounds up to a whole second,
    // so these replies are exact while the four calls span less than a second of the
    // server's clock; a run that took longer (a stalled machine) is repeated on a new key.
    let (key, replies, before, after) = within_server_time(&mut con, 1_000_000, |con, run| {
        let key = format!("t{run}");
        let args = [key.as_str(), "2", "1", "3600"];
        let mut replies: Vec<Vec<i64>> = (0..3).map(|_| throttle(con, &args)).collect();
        let before = snapshot(con);
        replies.push(throttle(con, &args));
        (key, replies, before, snapshot(con))
    });
    assert_eq!(
        replies,
        [
            [0, 3, 2, -1, 3600],
            [0, 3, 1, -1, 7200],
            [0, 3, 0, -1, 10800],
            [1, 3, 0, 3600, 10800],
        ]
    );
    assert_eq!(after, before, "a limited call wrote");

    // quantity: 3 at once, more than the limit (never: -1, limited), and 0 (a read).
    assert_eq!(
        throttle(&mut con, &["q", "2", "1", "3600", "3"]),
        [0, 3, 0, -1, 10800]
    );
    assert_eq!(
        throttle(&mut con, &["n", "2", "1", "3600", "4"]),
        [1, 3, 3, -1, 0]
    );
    assert_eq!(
        throttle(&mut con, &["n", "2", "1", "3600", "0"]),
        [0, 3, 3, -1, 0]
    );
    assert!(!exists(&mut con, b"n"), "neither call may create the key");
    // An RL.THROTTLE bucket is an ordinary bucket of max_burst + 1 tokens at count/period.
    assert_eq!(
        peek(&mut con, &[&key, "0.000277777777777778", "3"])[..2],
        [0, 0]
    );
}

#[test]
fn throttle_rounds_waits_up_to_whole_seconds() {
    let server = Server::start();
    let mut con = server.conn();
    // max_burst 0, one per 60 s: the second call is limited, and its wait equals the reset
    // (one token is the whole bucket), rounded up: 60, not 59, while the two calls span less
    // than a second (else the run is repeated on a new key).
    let (first, second) = within_server_time(&mut con, 1_000_000, |con, run| {
        let key = format!("r{run}");
        let args = [key.as_str(), "0", "1", "60"];
        (throttle(con, &args), throttle(con, &args))
    });
    assert_eq!(first, [0, 1, 0, -1, 60]);
    let [limited, limit, remaining, retry_s, reset_s] = second[..] else {
        unreachable!()
    };
    assert_eq!((limited, limit, remaining), (1, 1, 0));
    assert_eq!(
        retry_s, reset_s,
        "a one-token bucket waits until it is full"
    );
    assert_eq!(retry_s, 60, "59.99x s rounds up");

    // A bucket full 59.5 s from now: the wait is between 59 and 59.5 s when the command runs
    // within half a second (else the run is repeated on a new key), which rounds down or to
    // nearest as 59, and up as 60.
    let reply = within_server_time(&mut con, 500_000, |con, run| {
        let key = format!("half{run}");
        let full_at_ns = (server_time_us(con) + 59_500_000) * 1_000;
        let ok: String = redis::cmd("RL.SETSTATE")
            .arg(&key)
            .arg(full_at_ns)
            .query(con)
            .expect("RL.SETSTATE");
        assert_eq!(ok, "OK");
        throttle(con, &[&key, "0", "1", "60"])
    });
    assert_eq!(reply, [1, 1, 0, 60, 60]);
}

#[test]
fn throttle_rejects_each_bad_argument_with_its_exact_error() {
    let a = arity("RL.THROTTLE");
    let a = a.as_str();
    let rows: &[(&[&[u8]], &str)] = &[
        // --- arity: key max_burst count_per_period period [quantity]
        (&[], a),                                      // nothing after the name
        (&[b"k"], a),                                  // key only
        (&[b"k", b"15", b"30"], a),                    // no period
        (&[b"k", b"15", b"30", b"60", b"1", b"1"], a), // one argument too many
        // --- max_burst
        (&[b"k", b"-1", b"30", b"60"], MAX_BURST), // negative
        (&[b"k", b"1.5", b"30", b"60"], MAX_BURST), // not an integer
        (&[b"k", b"1e3", b"30", b"60"], MAX_BURST), // exponent form
        (&[b"k", b"x", b"30", b"60"], MAX_BURST),  // junk
        (&[b"k", b"", b"30", b"60"], MAX_BURST),   // empty
        (&[b"k", b"+1", b"30", b"60"], MAX_BURST), // sign
        (&[b"k", b" 1", b"30", b"60"], MAX_BURST), // leading space
        (&[b"k", b"1000000000000000", b"1", b"1"], MAX_BURST), // 1e15: a limit above 1e15
        (&[b"k", b"99999999999999999999", b"1", b"1"], MAX_BURST), // 20 digits
        (&[b"k", b"\xff", b"30", b"60"], MAX_BURST), // not UTF-8
        // --- count_per_period
        (&[b"k", b"15", b"0", b"60"], COUNT),   // no refill
        (&[b"k", b"15", b"-1", b"60"], COUNT),  // negative
        (&[b"k", b"15", b"1.5", b"60"], COUNT), // not an integer
        (&[b"k", b"15", b"1000000001", b"60"], COUNT), // above 1e9
        (&[b"k", b"15", b"x", b"60"], COUNT),   // junk
        // --- period
        (&[b"k", b"15", b"30", b"0"], PERIOD),          // zero
        (&[b"k", b"15", b"30", b"-60"], PERIOD),        // negative
        (&[b"k", b"15", b"30", b"1.5"], PERIOD),        // not an integer
        (&[b"k", b"15", b"30", b"3153600001"], PERIOD), // above 100 years
        (&[b"k", b"15", b"30", b""], PERIOD),           // empty
        // --- quantity
        (&[b"k", b"15", b"30", b"60", b"-1"], QUANTITY), // negative
        (&[b"k", b"15", b"30", b"60", b"1.5"], QUANTITY), // not an integer
        (&[b"k", b"15", b"30", b"60", b"x"], QUANTITY),  // junk
        (&[b"k", b"15", b"30", b"60", b""], QUANTITY),   // empty
        // --- the rate they make together
        (&[b"k", b"15", b"1", b"3153600000"], THROTTLE_RATE), // one per century
        (&[b"k", b"0", b"1", b"1000001"], THROTTLE_RATE),     // just under 1e-6 per second
        // --- a burst refilling for longer than 100 years
        (&[b"k", b"3153600000", b"1", b"1"], THROTTLE_REFILL),
        // --- several bad: the first one, in argument order, is named
        (&[b"k", b"-1", b"0", b"0", b"-1"], MAX_BURST),
        (&[b"k", b"1", b"0", b"0", b"-1"], COUNT),
        (&[b"k", b"1", b"1", b"0", b"-1"], PERIOD),
    ];
    assert_rejected_on_empty_server("RL.THROTTLE", rows);
}

#[test]
fn throttle_accepts_the_edges_of_each_range() {
    let server = Server::start();
    let mut con = server.conn();
    let good: &[&[&str]] = &[
        &["a", "0", "1", "1"],                        // smallest burst and period
        &["b", "999999999999999", "1000000000", "1"], // largest burst, fastest rate
        &["c", "0", "1", "1000000"],                  // slowest rate: 1e-6 per second
        &["d", "0", "1000000000", "3153600000"],      // longest period
        &["e", "5", "1", "1", "0"],                   // quantity 0
        &["f", "5", "1", "1", "999999999999999999"],  // a huge quantity is a denial
    ];
    for args in good {
        // Each key is new: the whole reply follows from the arguments.
        let reply = throttle(&mut con, args);
        let number = |i: usize| args.get(i).map(|a| a.parse::<u64>().expect("an integer"));
        let (head, (reset_low, reset_high)) = fresh::throttle(
            number(1).unwrap(),
            number(2).unwrap(),
            number(3).unwrap(),
            number(4).unwrap_or(1),
        );
        assert_eq!(reply[..4], head, "RL.THROTTLE {args:?}: {reply:?}");
        assert!(
            (reset_low..=reset_high).contains(&reply[4]),
            "RL.THROTTLE {args:?}: reset_after {} not in {reset_low}..={reset_high}",
            reply[4]
        );
    }
}

#[test]
fn cl_throttle_is_registered_only_when_asked() {
    // By default (and with `no`) there is no CL.THROTTLE, so redis-cell can be loaded beside.
    for module_args in [&[][..], &["cl-throttle-alias", "no"]] {
        let server = Server::start_with_module_args(&[], module_args);
        let mut con = server.conn();
        let err = error_text(
            &mut con,
            &command("CL.THROTTLE", &[b"k", b"15", b"30", b"60"]),
        );
        assert!(
            err.starts_with("ERR unknown command"),
            "{module_args:?}: {err}"
        );
        assert_eq!(
            info_field(&info(&mut con, "rl"), "rl_cl_throttle_alias"),
            Some("no")
        );
    }

    let server = Server::start_with_module_args(&[], &["cl-throttle-alias", "yes"]);
    let mut con = server.conn();
    assert_eq!(
        info_field(&info(&mut con, "rl"), "rl_cl_throttle_alias"),
        Some("yes")
    );
    assert_eq!(
        ints(&mut con, "CL.THROTTLE", &["u", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    // The same bucket as RL.THROTTLE's.
    assert_eq!(
        throttle(&mut con, &["u", "15", "30", "60"])[..3],
        [0, 16, 14]
    );
    assert_eq!(
        error_text(
            &mut con,
            &command("CL.THROTTLE", &[b"u", b"-1", b"30", b"60"])
        ),
        MAX_BURST
    );
    let keys: Vec<(String, Vec<String>)> = redis::cmd("COMMAND")
        .arg("GETKEYSANDFLAGS")
        .arg("CL.THROTTLE")
        .arg("u")
        .arg("15")
        .arg("30")
        .arg("60")
        .query(&mut con)
        .expect("COMMAND GETKEYSANDFLAGS");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].0, "u");
    assert!(keys[0].1.contains(&"RW".to_string()), "{keys:?}");
}

// ---------------------------------------------------------------------------------------------
// RL.REFUND

#[test]
fn refund_gives_tokens_back_capped_at_capacity() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        acquire(&mut con, &["k", "0.001", "5", "3"]),
        [1, 2, 0, 3_000_000]
    );
    let expire_at = pexpiretime(&mut con, b"k");

    // One token back: one token's refill (1000 s) earlier, exactly.
    let [remaining, reset] = refund(&mut con, &["k", "0.001", "5"])[..] else {
        unreachable!()
    };
    assert_eq!(remaining, 3);
    assert!(reset > 1_000_000 && reset <= 2_000_000, "reset {reset}");
    assert_eq!(pexpiretime(&mut con, b"k"), expire_at - 1_000_000);
    // Fractions too.
    assert_eq!(refund(&mut con, &["k", "0.001", "5", "1.5"])[0], 4);
    assert_eq!(pexpiretime(&mut con, b"k"), expire_at - 2_500_000);
    // Not full yet (half a token short): the key stays, the other half of "deletes exactly
    // when full".
    assert!(
        exists(&mut con, b"k"),
        "a bucket short of full must not be deleted"
    );

    // Cost 0 changes nothing.
    let before = snapshot(&mut con);
    assert_eq!(refund(&mut con, &["k", "0.001", "5", "0"])[0], 4);
    assert_eq!(snapshot(&mut con), before);

    // More than was taken: capped at capacity, and a full bucket is a missing key.
    assert_eq!(refund(&mut con, &["k", "0.001", "5", "100"]), [5, 0]);
    assert!(!exists(&mut con, b"k"), "a full bucket must be deleted");
    assert_eq!(peek(&mut con, &["k", "0.001", "5"]), [1, 5, 0, 0]);

    // A thousandth of a token short of full keeps the key; back to full deletes it.
    acquire(&mut con, &["e", "0.001", "5", "2"]);
    assert_eq!(refund(&mut con, &["e", "0.001", "5", "1.999"])[0], 4);
    assert!(exists(&mut con, b"e"), "deleted while still short of full");
    assert_eq!(refund(&mut con, &["e", "0.001", "5", "1"]), [5, 0]);
    assert!(!exists(&mut con, b"e"));
    acquire(&mut con, &["f", "0.001", "5", "2"]);
    assert_eq!(refund(&mut con, &["f", "0.001", "5", "2"]), [5, 0]);
    assert!(!exists(&mut con, b"f"));
}

#[test]
fn refund_of_a_missing_key_creates_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for cost in ["1", "0", "100"] {
        assert_eq!(
            refund(&mut con, &["m", "0.001", "5", cost]),
            [5, 0],
            "cost {cost}"
        );
    }
    assert_eq!(refund(&mut con, &["m", "0.001", "5"]), [5, 0]);
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn refund_rejects_each_bad_argument_with_its_exact_error() {
    assert_rejected_on_empty_server("RL.REFUND", &limit_rows("RL.REFUND"));
}

// ---------------------------------------------------------------------------------------------
// Across commands: foreign keys, declared keys, replication, counters, ACL

#[test]
fn foreign_keys_get_wrongtype_and_stay_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let foreign: &[(&str, &[&str])] = &[
        ("string", &["SET", "w", "hello"]),
        ("list", &["RPUSH", "w", "a", "b"]),
        ("hash with expiry", &["HSET", "w", "f", "v"]),
    ];
    let calls: &[(&str, &[&[u8]])] = &[
        ("RL.PEEK", &[b"w", b"0.001", b"10"]),
        ("RL.PEEK", &[b"w", b"0.001", b"10", b"0"]),
        ("RL.ACQUIRE.MULTI", &[b"w", b"0.001", b"10", b"1"]),
        // A bucket beside the foreign key is untouched too.
        (
            "RL.ACQUIRE.MULTI",
            &[
                b"bucket", b"0.001", b"10", b"1", b"w", b"0.001", b"10", b"1",
            ],
        ),
        (
            "RL.ACQUIRE.MULTI",
            &[
                b"w", b"0.001", b"10", b"0", b"bucket", b"0.001", b"10", b"1",
            ],
        ),
        ("RL.THROTTLE", &[b"w", b"15", b"30", b"60"]),
        ("RL.THROTTLE", &[b"w", b"15", b"30", b"60", b"0"]),
        ("RL.REFUND", &[b"w", b"0.001", b"10"]),
        ("RL.REFUND", &[b"w", b"0.001", b"10", b"0"]),
    ];
    for (kind, create) in foreign {
        let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
        let mut cmd = redis::cmd(create[0]);
        cmd.arg(&create[1..]);
        let _: redis::Value = cmd.query(&mut con).expect("create the foreign value");
        if kind.ends_with("with expiry") {
            let _: i64 = redis::cmd("PEXPIREAT")
                .arg("w")
                .arg(4_102_444_800_123_i64)
                .query(&mut con)
                .expect("PEXPIREAT");
        }
        acquire(&mut con, &["bucket", "0.001", "10", "3"]);
        let before = snapshot(&mut con);
        for (name, args) in calls {
            let got = error_text(&mut con, &command(name, args));
            assert_eq!(got, WRONGTYPE, "{kind}: {name} {}", show(args));
            assert_eq!(
                snapshot(&mut con),
                before,
                "{kind}: {name} {} changed a key",
                show(args)
            );
            server.assert_alive();
        }
    }
}

#[test]
fn watch_is_broken_by_writes_only() {
    // The module signals a modified key itself, only when it writes: a WATCH on a bucket
    // aborts the transaction after a take or a refund, never after a read or a denial.
    let server = Server::start();
    let mut con = server.conn();
    let mut other = server.conn();
    let cases: &[(&str, &str, &[&str], bool)] = &[
        // (what, command, arguments, whether EXEC must abort)
        ("peek", "RL.PEEK", &["k", "0.001", "5", "2"], false),
        (
            "refused multi",
            "RL.ACQUIRE.MULTI",
            &["k", "0.001", "5", "9"],
            false,
        ),
        (
            "allowed multi",
            "RL.ACQUIRE.MULTI",
            &["k", "0.001", "5", "1"],
            true,
        ),
        (
            "impossible throttle",
            "RL.THROTTLE",
            &["k", "4", "1", "1000", "6"],
            false,
        ),
        (
            "throttle of 0",
            "RL.THROTTLE",
            &["k", "4", "1", "1000", "0"],
            false,
        ),
        (
            "allowed throttle",
            "RL.THROTTLE",
            &["k", "4", "1", "1000"],
            true,
        ),
        ("refund of 0", "RL.REFUND", &["k", "0.001", "5", "0"], false),
        (
            "partial refund",
            "RL.REFUND",
            &["k", "0.001", "5", "1"],
            true,
        ),
        (
            "refund to full",
            "RL.REFUND",
            &["k", "0.001", "5", "100"],
            true,
        ),
        (
            "refund of a missing key",
            "RL.REFUND",
            &["k", "0.001", "5", "1"],
            false,
        ),
    ];
    acquire(&mut con, &["k", "0.001", "5", "2"]);
    for (what, name, args, aborts) in cases {
        let _: () = redis::cmd("WATCH").arg("k").query(&mut con).expect("WATCH");
        let _: redis::Value = redis::cmd(name)
            .arg(*args)
            .query(&mut other)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let _: () = redis::cmd("MULTI").query(&mut con).expect("MULTI");
        let _: redis::Value = redis::cmd("PING").query(&mut con).expect("PING");
        let exec: redis::Value = redis::cmd("EXEC").query(&mut con).expect("EXEC");
        assert_eq!(
            exec == redis::Value::Nil,
            *aborts,
            "{what}: EXEC replied {exec:?}"
        );
    }
}

#[test]
fn declared_keys_and_flags() {
    let server = Server::start();
    let mut con = server.conn();
    let keys_and_flags = |con: &mut Connection, args: &[&str]| -> Vec<(String, Vec<String>)> {
        let mut keys: Vec<(String, Vec<String>)> = redis::cmd("COMMAND")
            .arg("GETKEYSANDFLAGS")
            .arg(args)
            .query(con)
            .unwrap_or_else(|e| panic!("COMMAND GETKEYSANDFLAGS {args:?}: {e}"));
        for (_, flags) in &mut keys {
            flags.sort();
        }
        keys
    };
    let rw = || vec!["RW".to_string(), "access".into(), "update".into()];
    assert_eq!(
        keys_and_flags(&mut con, &["RL.PEEK", "p", "1", "2"]),
        [("p".to_string(), vec!["RO".to_string(), "access".into()])]
    );
    assert_eq!(
        keys_and_flags(
            &mut con,
            &[
                "RL.ACQUIRE.MULTI",
                "a",
                "1",
                "2",
                "1",
                "b",
                "1",
                "2",
                "1",
                "c",
                "1",
                "2",
                "1"
            ]
        ),
        [
            ("a".to_string(), rw()),
            ("b".into(), rw()),
            ("c".into(), rw())
        ]
    );
    assert_eq!(
        keys_and_flags(&mut con, &["RL.THROTTLE", "t", "15", "30", "60", "1"]),
        [("t".to_string(), rw())]
    );
    assert_eq!(
        keys_and_flags(&mut con, &["RL.REFUND", "r", "1", "2"]),
        [("r".to_string(), rw())]
    );

    // Command flags: RL.PEEK is a fast read, the others writes.
    let flags = |con: &mut Connection, name: &str| -> Vec<String> {
        let info: redis::Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(con)
            .expect("COMMAND INFO");
        // [[name, arity, [flags...], ...]]
        let redis::Value::Array(entries) = info else {
            panic!("COMMAND INFO {name}: {info:?}")
        };
        let Some(redis::Value::Array(entry)) = entries.first() else {
            panic!("COMMAND INFO {name}: {entries:?}")
        };
        redis::from_redis_value(entry[2].clone()).expect("flags")
    };
    let peek_flags = flags(&mut con, "RL.PEEK");
    assert!(
        peek_flags.contains(&"readonly".to_string()),
        "{peek_flags:?}"
    );
    assert!(peek_flags.contains(&"fast".to_string()), "{peek_flags:?}");
    assert!(!peek_flags.contains(&"write".to_string()), "{peek_flags:?}");
    for name in ["RL.ACQUIRE.MULTI", "RL.THROTTLE", "RL.REFUND"] {
        let got = flags(&mut con, name);
        assert!(got.contains(&"write".to_string()), "{name}: {got:?}");
        assert!(got.contains(&"denyoom".to_string()), "{name}: {got:?}");
    }
}

#[test]
fn new_commands_replicate_their_effect_never_themselves() {
    let master_server = Server::start();
    let mut master = master_server.conn();
    let replica_server = master_server.start_replica();
    let mut replica = replica_server.conn();

    // RL.THROTTLE: allowed, then limited (nothing to ship).
    throttle(&mut master, &["th", "0", "1", "3600"]);
    assert_eq!(throttle(&mut master, &["th", "0", "1", "3600"])[0], 1);
    // RL.ACQUIRE.MULTI: allowed over three buckets (one named twice), then refused.
    let reply = multi(
        &mut master,
        &[
            "m1", "0.001", "5", "2", "m2", "0.001", "3", "1", "m1", "0.001", "5", "1.5",
        ],
    );
    assert_eq!(reply.allowed, 1, "{reply:?}");
    assert_eq!(
        multi(
            &mut master,
            &["m1", "0.001", "5", "2", "m2", "0.001", "3", "3"]
        )
        .allowed,
        0
    );
    // RL.REFUND: partly (RL.SETSTATE), to full (DEL), and of a missing key (nothing).
    acquire(&mut master, &["r1", "0.001", "5", "4"]);
    acquire(&mut master, &["r2", "0.001", "5", "4"]);
    assert_eq!(refund(&mut master, &["r1", "0.001", "5", "1.25"])[0], 2);
    assert_eq!(refund(&mut master, &["r2", "0.001", "5", "4"]), [5, 0]);
    assert_eq!(refund(&mut master, &["gone", "0.001", "5"]), [5, 0]);
    // RL.PEEK: nothing to ship.
    peek(&mut master, &["m1", "0.001", "5"]);

    wait_for_replica(&mut master);
    let on_master = snapshot(&mut master);
    let keys: Vec<&[u8]> = on_master.iter().map(|(k, _, _)| &k[..]).collect();
    assert_eq!(keys, [&b"m1"[..], b"m2", b"r1", b"th"]);
    for (key, payload, expire_at) in &on_master {
        assert!(payload.is_some() && *expire_at > 0, "{key:?}");
    }
    assert_eq!(
        snapshot(&mut replica),
        on_master,
        "the replica differs (DUMP/PEXPIRETIME)"
    );

    assert!(calls(&mut replica, "rl.setstate").is_some_and(|n| n >= 4));
    assert_eq!(calls(&mut replica, "del"), Some(1), "the refund to full");
    for name in [
        "rl.throttle",
        "rl.acquire.multi",
        "rl.refund",
        "rl.acquire",
        "rl.peek",
    ] {
        assert_eq!(
            calls(&mut replica, name),
            None,
            "{name} reached the replica"
        );
    }
}

#[test]
fn info_counts_calls_decisions_and_errors() {
    let server = Server::start();
    let mut con = server.conn();
    let text = info(&mut con, "rl");
    assert_eq!(
        info_field(&text, "rl_version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let clock = info_field(&text, "rl_clock").unwrap_or_default();
    assert!(
        ["RedisModule_CachedMicroseconds", "RedisModule_Milliseconds"].contains(&clock),
        "{text}"
    );
    assert!(info_field(&text, "rl_propagation").is_some(), "{text}");
    assert_eq!(info_field(&text, "rl_cl_throttle_alias"), Some("no"));

    let counters = |con: &mut Connection| -> [u64; 4] {
        let text = info(con, "rl");
        ["rl_calls", "rl_allowed", "rl_denied", "rl_errors"].map(|name| {
            info_field(&text, name)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        })
    };
    assert_eq!(counters(&mut con), [0, 0, 0, 0]);
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("x")
        .query(&mut con)
        .expect("SET");

    // Each step: the call, and how [calls, allowed, denied, errors] must move.
    type Step = (&'static str, &'static [&'static [u8]], [u64; 4]);
    let steps: &[Step] = &[
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1"], [1, 1, 0, 0]),
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1"], [1, 0, 1, 0]),
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1", b"2"], [1, 0, 1, 0]), // impossible: a denial
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1", b"0"], [1, 1, 0, 0]), // cost 0: allowed
        (
            "RL.ACQUIRE.MULTI",
            &[b"m", b"0.001", b"1", b"1", b"n", b"0.001", b"1", b"1"],
            [1, 1, 0, 0],
        ),
        (
            "RL.ACQUIRE.MULTI",
            &[b"m", b"0.001", b"1", b"1", b"o", b"0.001", b"1", b"1"],
            [1, 0, 1, 0],
        ),
        ("RL.THROTTLE", &[b"t", b"0", b"1", b"3600"], [1, 1, 0, 0]),
        ("RL.THROTTLE", &[b"t", b"0", b"1", b"3600"], [1, 0, 1, 0]),
        ("RL.PEEK", &[b"a", b"0.001", b"1"], [1, 0, 0, 0]), // decides nothing
        ("RL.PEEK", &[b"fresh", b"0.001", b"1"], [1, 0, 0, 0]),
        ("RL.REFUND", &[b"a", b"0.001", b"1"], [1, 0, 0, 0]),
        ("RL.SETSTATE", &[b"s", b"1"], [0, 0, 0, 0]), // internal: not counted
        // Error replies from the module count as calls and errors.
        ("RL.ACQUIRE", &[b"a", b"x", b"1"], [1, 0, 0, 1]),
        ("RL.PEEK", &[b"str", b"0.001", b"1"], [1, 0, 0, 1]), // WRONGTYPE
        ("RL.THROTTLE", &[b"t", b"-1", b"1", b"1"], [1, 0, 0, 1]),
        ("RL.REFUND", &[b"a", b"1", b"1", b"-1"], [1, 0, 0, 1]),
        // A wrong argument count that only the module sees (the server checks the minimum).
        (
            "RL.ACQUIRE.MULTI",
            &[b"m", b"1", b"1", b"1", b"n"],
            [1, 0, 0, 1],
        ),
        // The server refuses too few arguments before the module runs: nothing is counted.
        ("RL.PEEK", &[b"a"], [0, 0, 0, 0]),
        ("RL.SETSTATE", &[b"s", b"0"], [0, 0, 0, 0]),
    ];
    let mut want = counters(&mut con);
    for (name, args, delta) in steps {
        let _ = command(name, args).query::<redis::Value>(&mut con);
        for (w, d) in want.iter_mut().zip(delta) {
            *w += d;
        }
        assert_eq!(
            counters(&mut con),
            want,
            "after {name} {} ([calls, allowed, denied, errors])",
            show(args)
        );
    }
}

#[test]
fn bad_module_arguments_fail_the_load_and_name_the_argument() {
    let rows: &[(&[&str], &str)] = &[
        (
            &["colour", "blue"],
            "rl: unknown module argument 'colour' (known: cl-throttle-alias yes|no, gcra-alias yes|no)",
        ),
        (
            &["cl-throttle-alias"],
            "rl: module argument 'cl-throttle-alias' needs a value",
        ),
        (
            &["cl-throttle-alias", "maybe"],
            "rl: module argument 'cl-throttle-alias' must be yes or no, not 'maybe'",
        ),
        // A name without a value after a good pair.
        (&["cl-throttle-alias", "yes", "extra"], "'extra'"),
    ];
    for (module_args, want) in rows {
        match Server::try_start_with_module_args(module_args) {
            Ok(server) => panic!(
                "the server started with module arguments {module_args:?}; log:\n{}",
                server.log()
            ),
            Err(log) => assert!(
                log.contains("rl: ") && log.contains(want),
                "{module_args:?}: the log does not say {want:?}:\n{log}"
            ),
        }
    }
    // Names and values are case-insensitive.
    let server = Server::try_start_with_module_args(&["CL-THROTTLE-ALIAS", "Yes"])
        .unwrap_or_else(|log| panic!("did not start: {log}"));
    let mut con = server.conn();
    assert_eq!(
        ints(&mut con, "CL.THROTTLE", &["u", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
}

#[test]
fn ratelimit_acl_category_where_the_server_supports_it() {
    let server = Server::start();
    let mut admin = server.conn();
    let categories: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .query(&mut admin)
        .expect("ACL CAT");
    let has_category = categories.iter().any(|c| c == "ratelimit");

    // Redis 7.4+ and Valkey 9 have module ACL categories; Redis 7.0 does not.
    let server_info = info(&mut admin, "server");
    let version = |field: &str| -> Option<(u32, u32)> {
        let v = info_field(&server_info, field)?;
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        Some((parts.next()?, parts.next().unwrap_or(0)))
    };
    let must_have = match version("valkey_version") {
        Some(valkey) => valkey >= (9, 0),
        None => version("redis_version").is_some_and(|redis| redis >= (7, 4)),
    };
    assert!(
        has_category || !must_have,
        "no ratelimit category on a server that supports module categories:\n{server_info}"
    );

    if !has_category {
        // The module still loaded, and the category is simply unknown.
        let list: redis::Value = redis::cmd("MODULE")
            .arg("LIST")
            .query(&mut admin)
            .expect("MODULE LIST");
        assert!(format!("{list:?}").contains("rl"), "{list:?}");
        let err = error_text(
            &mut admin,
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("app")
                .arg("on")
                .arg("nopass")
                .arg("+@ratelimit"),
        );
        assert!(err.starts_with("ERR "), "{err}");
        return;
    }

    let mut members: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .arg("ratelimit")
        .query(&mut admin)
        .expect("ACL CAT ratelimit");
    members.iter_mut().for_each(|m| m.make_ascii_lowercase());
    // ACL CAT <category> skips every module command on Redis 7.4 and Valkey 8.0 (fixed in
    // Redis 8.0 and Valkey 8.1); COMMAND INFO still shows each command's categories there,
    // and the ACL checks below use them.
    let lists_module_commands = match version("valkey_version") {
        Some(valkey) => valkey >= (8, 1),
        None => version("redis_version").is_some_and(|redis| redis >= (8, 0)),
    };
    for name in [
        "rl.acquire",
        "rl.peek",
        "rl.acquire.multi",
        "rl.throttle",
        "rl.refund",
    ] {
        assert!(
            members.contains(&name.to_string()) || !lists_module_commands,
            "{name} not in {members:?}"
        );
        let info: redis::Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut admin)
            .expect("COMMAND INFO");
        assert!(
            format!("{info:?}").contains("@ratelimit"),
            "{name}: no @ratelimit in {info:?}"
        );
    }

    let ok: String = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg(&["on", "nopass", "+@ratelimit", "~*"][..])
        .query(&mut admin)
        .expect("ACL SETUSER");
    assert_eq!(ok, "OK");
    let mut app = server.conn();
    let ok: String = redis::cmd("AUTH")
        .arg("app")
        .arg("any")
        .query(&mut app)
        .expect("AUTH");
    assert_eq!(ok, "OK");
    assert_eq!(
        acquire(&mut app, &["k", "0.001", "3"]),
        [1, 2, 0, 1_000_000]
    );
    assert_eq!(peek(&mut app, &["k", "0.001", "3"])[..2], [1, 2]);
    let err = error_text(&mut app, redis::cmd("SET").arg("k2").arg("v"));
    assert!(err.starts_with("NOPERM "), "{err}");
    assert!(!exists(&mut admin, b"k2"));
}
