//! Parity with the classic Lua token bucket (bench/token_bucket.lua), the baseline the module
//! replaces: the same sequence of costs gets the same `allowed` and `remaining` from
//! RL.ACQUIRE as from the script.
//!
//! The script runs via SCRIPT LOAD + EVALSHA on the same server, with `now_ms` read from the
//! server's TIME, so both see the same clock. Rates are at most 0.01 token/s, so the refill
//! during a test is well under 0.01 token. Every count in the table is a multiple of a quarter
//! token, so that refill never moves `floor(tokens)`, and where a cost equals exactly what is
//! left, refill only adds, so both sides allow it.
//!
//! Only the first two reply elements are compared: the script has no retry/reset times.

#![cfg(test)]

mod common;

use common::info::rdb_changes;
use common::lua::{load_script, lua_acquire};
use common::{acquire, dump, exists, server_time_ms, Server};
use redis::Connection;

/// One sequence: rate, capacity, the costs in order (`None` omits the argument), and the
/// expected `allowed` flags, spelled out so that a shared mistake cannot pass unnoticed.
struct Row {
    rate: &'static str,
    capacity: &'static str,
    costs: &'static [Option<&'static str>],
    allowed: &'static [i64],
}

const ROWS: &[Row] = &[
    // Default cost: a burst of 3, then denials.
    Row {
        rate: "0.001",
        capacity: "3",
        costs: &[None, None, None, None, None],
        allowed: &[1, 1, 1, 0, 0],
    },
    // Fractional capacity: two whole tokens, then half a token that 1 cannot take.
    Row {
        rate: "0.01",
        capacity: "2.5",
        costs: &[None, None, None],
        allowed: &[1, 1, 0],
    },
    // Half-token costs drain a 2.5 bucket in five calls.
    Row {
        rate: "0.01",
        capacity: "2.5",
        costs: &[
            Some("0.5"),
            Some("0.5"),
            Some("0.5"),
            Some("0.5"),
            Some("0.5"),
            Some("0.5"),
        ],
        allowed: &[1, 1, 1, 1, 1, 0],
    },
    // Mixed: after 1 + 1 half a token is left; 1 is denied, 0.5 takes it, the next 0.5 is not.
    Row {
        rate: "0.002",
        capacity: "2.5",
        costs: &[Some("1"), Some("1"), Some("1"), Some("0.5"), Some("0.5")],
        allowed: &[1, 1, 0, 1, 0],
    },
    // Cost above capacity on a full bucket: denied (RL adds retry_after -1), then the whole
    // capacity at once, then a denial.
    Row {
        rate: "0.001",
        capacity: "5",
        costs: &[Some("6"), Some("5"), Some("1")],
        allowed: &[0, 1, 0],
    },
    // Cost 0 is always allowed and takes nothing: on a full bucket, after a take, and on an
    // empty bucket.
    Row {
        rate: "0.001",
        capacity: "4",
        costs: &[
            Some("0"),
            Some("2"),
            Some("0"),
            Some("3"),
            Some("2"),
            Some("0"),
            Some("1"),
        ],
        allowed: &[1, 1, 1, 0, 1, 1, 0],
    },
    // A fractional cost leaves a fractional remainder: 0.75 of 1000, then 0.25, then a denial.
    Row {
        rate: "0.01",
        capacity: "1000",
        costs: &[Some("999.25"), Some("0.5"), Some("0.5")],
        allowed: &[1, 1, 0],
    },
    // Capacity below one token: remaining is 0 throughout, quarter tokens still pass, and the
    // default cost of 1 can never pass (RL: retry_after -1).
    Row {
        rate: "0.001",
        capacity: "0.75",
        costs: &[Some("0.25"), None, Some("0.25"), Some("0.25"), Some("0.25")],
        allowed: &[1, 0, 1, 1, 0],
    },
];

/// One call of the script, with the server's clock as its `now_ms`: `{allowed, floor(tokens)}`.
fn lua_acquire_now(
    con: &mut Connection,
    sha: &str,
    key: &str,
    rate: &str,
    capacity: &str,
    cost: Option<&str>,
) -> [i64; 2] {
    let now_ms = server_time_ms(con);
    lua_acquire(con, sha, key, rate, capacity, now_ms, cost)
}

#[test]
fn rl_acquire_matches_the_lua_baseline() {
    let server = Server::start();
    let mut con = server.conn();
    let sha = load_script(&mut con);
    for (i, row) in ROWS.iter().enumerate() {
        assert_eq!(row.costs.len(), row.allowed.len(), "row {i} is malformed");
        let (rl_key, lua_key) = (format!("rl:{i}"), format!("lua:{i}"));
        for (step, (&cost, &want_allowed)) in row.costs.iter().zip(row.allowed).enumerate() {
            let rl = acquire(&mut con, rl_key.as_bytes(), row.rate, row.capacity, cost);
            let lua = lua_acquire_now(&mut con, &sha, &lua_key, row.rate, row.capacity, cost);
            let at = format!(
                "row {i} (rate {}, capacity {}) step {step} cost {cost:?}",
                row.rate, row.capacity
            );
            assert_eq!(rl[..2], lua, "{at}: RL.ACQUIRE {rl:?}, script {lua:?}");
            assert_eq!(rl[0], want_allowed, "{at}: RL.ACQUIRE {rl:?}");
            // The one reply difference: a cost above capacity can never succeed, and says so
            // with retry_after_ms -1; an ordinary denial names a positive wait.
            let cost_tokens: f64 = cost.map_or(1.0, |c| c.parse().expect("cost"));
            if cost_tokens > row.capacity.parse().expect("capacity") {
                assert_eq!(rl[2], -1, "{at}: retry_after_ms of an impossible cost");
            } else if rl[0] == 0 {
                assert!(rl[2] > 0, "{at}: retry_after_ms of a denial");
            }
        }
    }
}

#[test]
fn lua_baseline_writes_on_denial_where_rl_acquire_does_not() {
    let server = Server::start();
    let mut con = server.conn();
    let sha = load_script(&mut con);

    // A denial on a missing key: the script creates a full bucket, RL.ACQUIRE nothing.
    assert_eq!(
        lua_acquire_now(&mut con, &sha, "lua", "0.001", "2", Some("3")),
        [0, 2]
    );
    assert_eq!(
        acquire(&mut con, b"rl", "0.001", "2", Some("3"))[..2],
        [0, 2]
    );
    assert!(
        exists(&mut con, b"lua"),
        "the classic script writes on denial"
    );
    assert!(!exists(&mut con, b"rl"));

    // A denial on an empty bucket: the script rewrites its hash, RL.ACQUIRE leaves the
    // bucket byte-identical.
    assert_eq!(acquire(&mut con, b"rl", "0.001", "2", Some("2"))[0], 1);
    let before = dump(&mut con, b"rl");
    assert_eq!(acquire(&mut con, b"rl", "0.001", "2", None)[0], 0);
    assert_eq!(dump(&mut con, b"rl"), before);
    assert_eq!(
        lua_acquire_now(&mut con, &sha, "lua", "0.001", "2", Some("2"))[0],
        1
    );
    // The server's dirty counter: what RDB save points and the AOF count as changes.
    let dirty_before = rdb_changes(&mut con);
    assert_eq!(
        lua_acquire_now(&mut con, &sha, "lua", "0.001", "2", None)[0],
        0
    );
    assert!(
        rdb_changes(&mut con) > dirty_before,
        "the script's denial wrote nothing"
    );
    let dirty_before = rdb_changes(&mut con);
    assert_eq!(acquire(&mut con, b"rl", "0.001", "2", None)[0], 0);
    assert_eq!(
        rdb_changes(&mut con),
        dirty_before,
        "RL.ACQUIRE's denial changed something"
    );
}

/// At rates where `1e9 / rate` is not a whole number of ns, a burst at one instant gets the
/// same answers from the module and the classic script, and both are the exact model's:
/// `capacity` allowed, `remaining` counting down, then a denial. The script is given one
/// `now_ms` for every call; all calls run in one MULTI so the module's refill stays far
/// below a token (the fastest rate here needs 143 ms for one).
#[test]
fn bursts_at_one_instant_match_the_lua_baseline_at_rates_that_do_not_divide() {
    let server = Server::start();
    let mut con = server.conn();
    let sha = load_script(&mut con);
    for (rate, capacity) in [("3", 3i64), ("7", 7), ("0.3", 5), ("3.3", 10)] {
        let now_ms = server_time_ms(&mut con);
        let (rl_key, lua_key) = (format!("rl:{rate}"), format!("lua:{rate}"));
        let mut pipe = redis::pipe();
        pipe.atomic();
        for _ in 0..=capacity {
            pipe.cmd("RL.ACQUIRE").arg(&rl_key).arg(rate).arg(capacity);
            pipe.cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(&lua_key)
                .arg(rate)
                .arg(capacity)
                .arg(now_ms);
        }
        let replies: Vec<Vec<i64>> = pipe.query(&mut con).expect("EXEC");
        for (i, pair) in replies.chunks(2).enumerate() {
            let (rl, lua) = (&pair[0], &pair[1]);
            let at = format!("rate {rate}, capacity {capacity}, call {i}: {rl:?} / {lua:?}");
            assert_eq!(rl[..2], lua[..], "{at}");
            let i = i as i64;
            let want = if i < capacity {
                [1, capacity - 1 - i]
            } else {
                [0, 0]
            };
            assert_eq!(rl[..2], want, "{at}");
        }
    }
}
