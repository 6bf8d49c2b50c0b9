//! RL.THROTTLE, redis-cell's `CL.THROTTLE` interface, against a real server: redis-cell's
//! documented reply, the count down to a limit, waits rounded up to whole seconds, every bad
//! argument with its exact error, the edges of each range, and the `cl-throttle-alias` load
//! argument that registers `CL.THROTTLE` itself.
//!
//! Time: one token per hour or slower, so refill cannot change a reply during a test. Where a
//! reply depends on a wait rounded up to a whole second, the run measures its span on the
//! server's clock and is repeated on new keys when a stalled machine made it longer
//! (`within_server_time`). Nothing asserts a wall-clock duration.

#![cfg(test)]

mod common;

use common::rl::{peek, throttle};
use common::texts::{COUNT, MAX_BURST, PERIOD, QUANTITY, THROTTLE_RATE, THROTTLE_REFILL};
use common::{
    alias_server, arity, assert_rejected_on_empty_server, command, error_text, exists, fresh, ints,
    keys_and_flags, server_time_us, snapshot, within_server_time, Server,
};

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
    // (Exactly 1/3600: at a decimal a hair faster, 3 tokens' refill is shorter than the 3 h
    // owed, and RL.PEEK truthfully shows the bucket a token in debt.)
    assert_eq!(peek(&mut con, &[&key, "1/3600", "3"])[..2], [0, 0]);
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
    let server = alias_server(
        "cl-throttle-alias",
        "rl_cl_throttle_alias",
        &[b"CL.THROTTLE", b"k", b"15", b"30", b"60"],
    );
    let mut con = server.conn();
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
    let keys = keys_and_flags(&mut con, &["CL.THROTTLE", "u", "15", "30", "60"]);
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].0, "u");
    assert!(keys[0].1.contains(&"RW".to_string()), "{keys:?}");
}
