//! Exact counts at rates where `1e9 / rate` is not a whole number of nanoseconds, against a
//! real server: the transcripts of the exactness issue as regressions, bursts inside one
//! MULTI, RL.THROTTLE's `remaining` on a fresh key, and cost/quantity 0 after a limit shrank.
//!
//! Expected values come from the token-bucket model by hand (`capacity - taken`, redis-cell's
//! `max_burst` on a fresh key), not from the module.

#![cfg(test)]

mod common;

use common::info::{info, info_field};
use common::{acquire, command, Server};
use redis::Connection;

fn throttle(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    command("RL.THROTTLE", &args)
        .query(con)
        .expect("RL.THROTTLE")
}

/// Whether the module's clock can move inside one MULTI (Redis 7.0's millisecond clock).
fn clock_moves_within_exec(con: &mut Connection) -> bool {
    let rl = info(con, "rl");
    info_field(&rl, "rl_clock") == Some("RedisModule_Milliseconds")
}

/// Server time in µs, from TIME.
fn time_us(value: &redis::Value) -> i64 {
    let parts: Vec<i64> = redis::from_redis_value(value.clone()).expect("TIME");
    parts[0] * 1_000_000 + parts[1]
}

#[test]
fn the_issue_transcripts_are_exact() {
    let server = Server::start();
    let mut con = server.conn();
    // A fresh bucket of 7, one taken: 6 remain (it said 5), full again in 1/7 s.
    assert_eq!(acquire(&mut con, b"b", "7", "7", None), [1, 6, 0, 143]);
    // redis-cell's answer: limit 3, remaining 2, reset in 4 s (3.33 s rounded up).
    assert_eq!(throttle(&mut con, &["t", "2", "3", "10"]), [0, 3, 2, -1, 4]);
    // 6001 tokens, one taken: 6000 remain (it said 5999; redis-cell says 6024, see
    // docs/commands/rl.throttle.md).
    assert_eq!(
        throttle(&mut con, &["a", "6000", "6000", "1"]),
        [0, 6001, 6000, -1, 1]
    );
}

#[test]
fn a_burst_of_capacity_plus_one_in_one_multi_gets_exactly_capacity() {
    let server = Server::start();
    let mut con = server.conn();
    let ms_clock = clock_moves_within_exec(&mut con);
    for (rate, capacity) in [("3", 3i64), ("7", 7), ("0.3", 5), ("6000", 10)] {
        // On Redis 7.0 the clock may tick a millisecond between two commands of the EXEC (6
        // tokens at 6000/s); such an attempt is retried, bracketed by TIME to know.
        let mut exact = false;
        for attempt in 0..20 {
            let key = format!("burst:{rate}:{attempt}");
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("TIME");
            for _ in 0..=capacity {
                pipe.cmd("RL.ACQUIRE").arg(&key).arg(rate).arg(capacity);
            }
            pipe.cmd("TIME");
            let replies: Vec<redis::Value> = pipe.query(&mut con).expect("EXEC");
            let (first, last) = (time_us(&replies[0]), time_us(&replies[replies.len() - 1]));
            let calls: Vec<Vec<i64>> = replies[1..replies.len() - 1]
                .iter()
                .map(|v| redis::from_redis_value(v.clone()).expect("reply"))
                .collect();
            let ticked = ms_clock && first / 1000 != last / 1000;
            if ticked && rate == "6000" {
                continue;
            }
            for (i, reply) in calls.iter().enumerate() {
                let i = i as i64;
                let at = format!("rate {rate}, capacity {capacity}, call {i}: {reply:?}");
                if i < capacity {
                    assert_eq!(reply[..3], [1, capacity - 1 - i, 0], "{at}");
                } else {
                    assert_eq!(reply[..2], [0, 0], "one more than capacity, {at}");
                    assert!(reply[2] > 0, "a denial names its wait, {at}");
                }
            }
            exact = true;
            break;
        }
        assert!(exact, "rate {rate}: every attempt straddled a clock tick");
    }
}

#[test]
fn throttle_on_a_fresh_key_leaves_max_burst_at_rates_that_do_not_divide() {
    let server = Server::start();
    let mut con = server.conn();
    // (max_burst, count_per_period, period): "3 per 10 s", 7/s, "4 per 7 s", 333333/s, ...
    let rows: [(u64, u64, u64); 6] = [
        (2, 3, 10),
        (6, 7, 1),
        (4, 4, 7),
        (99, 333_333, 1),
        (6000, 6000, 1),
        (0, 3, 10),
    ];
    for (max_burst, count, period) in rows {
        let key = format!("fresh:{max_burst}:{count}:{period}");
        let args = [
            key.clone(),
            max_burst.to_string(),
            count.to_string(),
            period.to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply = throttle(&mut con, &args);
        let limit = max_burst as i64 + 1;
        // One token's refill, in whole seconds rounded up: period / count.
        let reset_s = period.div_ceil(count) as i64;
        assert_eq!(reply, [0, limit, max_burst as i64, -1, reset_s], "{args:?}");
    }
}

#[test]
fn quantity_and_cost_zero_after_a_limit_shrank_are_limited_until_the_debt_fits() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens at 1/s, all taken: the bucket owes 10 s.
    assert_eq!(
        throttle(&mut con, &["k", "9", "1", "1", "10"])[..3],
        [0, 10, 0]
    );
    // Shrunk to 3 tokens: it owes 7 s more than it can hold, so "am I limited?" says yes,
    // and retry_after is the wait until it says no (7 s), as redis-cell answers.
    let reply = throttle(&mut con, &["k", "2", "1", "1", "0"]);
    assert_eq!(reply[..3], [1, 3, 0], "{reply:?}");
    assert!((6..=7).contains(&reply[3]), "retry_after {reply:?}");
    assert!((9..=10).contains(&reply[4]), "reset_after {reply:?}");
    // RL.ACQUIRE and RL.PEEK with cost 0 agree, and nothing is written.
    let before = common::dump(&mut con, b"k");
    let acquired = acquire(&mut con, b"k", "1", "3", Some("0"));
    assert_eq!(acquired[..2], [0, 0], "{acquired:?}");
    assert!((6_000..=7_000).contains(&acquired[2]), "{acquired:?}");
    let peeked: Vec<i64> = command("RL.PEEK", &[b"k", b"1", b"3", b"0"])
        .query(&mut con)
        .expect("RL.PEEK");
    // RL.PEEK shows the debt: 3 tokens less the 10 s owed, -7 (under a second has passed).
    assert_eq!(peeked[..2], [0, -7], "{peeked:?}");
    assert!(peeked[2] <= acquired[2], "{peeked:?} after {acquired:?}");
    assert_eq!(common::dump(&mut con, b"k"), before, "cost 0 wrote");
    // With the old capacity it is allowed: the bucket holds 0 tokens, not fewer.
    assert_eq!(
        acquire(&mut con, b"k", "1", "10", Some("0"))[..3],
        [1, 0, 0]
    );
}
