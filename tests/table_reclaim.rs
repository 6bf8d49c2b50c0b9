//! Reclaim does not wait on the rest of the keyspace: with 1,000,000 other keys on the
//! server (`DEBUG POPULATE`), the background sweep still gives back a flood of one-off
//! fields in a table, and many small tables, within their time to full plus a few seconds.
//! A sweep that finds tables by scanning the keyspace needs minutes per pass over a million
//! keys; one that keeps a registry of its tables does not look at the other keys at all.
//!
//! Time: the one-off buckets take 1 token with capacity 1 at 1/s, so each is full again 1 s
//! after its call; the long-lived bucket beside them refills 1 token in 1000 s and so never
//! does during a test. The deadlines (the last call's time to full, plus a few seconds for
//! the sweep at its documented pace, with a margin for a debug build on a loaded machine)
//! do not grow with the other keys; nothing else asserts a duration. `OTHER_KEYS` changes
//! the number of other keys (1,000,000).

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::info::{info, info_field, info_number};
use common::{dbsize, Server};
use redis::Connection;

/// The long-lived bucket: 1 token per 1000 s, capacity 5, 1 taken.
const LONG: [&str; 3] = ["0.001", "5", "1"];
/// A one-off bucket: capacity 1 at 1/s, its token taken: full again 1 s after the call.
const ONE_OFF: [&str; 3] = ["1", "1", "1"];
/// The one-off buckets' time to full.
const TIME_TO_FULL: Duration = Duration::from_secs(1);

/// The other keys: `OTHER_KEYS`, else 1,000,000.
fn other_keys() -> i64 {
    std::env::var("OTHER_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// A server holding [`other_keys`] plain string keys (`DEBUG POPULATE`).
fn crowded_server() -> (Server, Connection) {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let other = other_keys();
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(other)
        .arg("other")
        .query(&mut con)
        .expect("DEBUG POPULATE");
    assert_eq!(dbsize(&mut con), other);
    (server, con)
}

fn hacquire(key: &str, field: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.HACQUIRE");
    cmd.arg(key).arg(field).arg(args);
    cmd
}

/// Sends `calls` in pipelines of 10,000.
fn send(con: &mut Connection, calls: impl Iterator<Item = redis::Cmd>) {
    let mut pipe = redis::pipe();
    for cmd in calls {
        pipe.add_command(cmd).ignore();
        if pipe.cmd_iter().count() >= 10_000 {
            let _: () = pipe.query(con).expect("a pipeline of calls");
            pipe = redis::pipe();
        }
    }
    if pipe.cmd_iter().next().is_some() {
        let _: () = pipe.query(con).expect("a pipeline of calls");
    }
}

/// `rl_swept` of `INFO rl`.
fn swept(con: &mut Connection) -> u64 {
    info_number(con, "rl", "rl_swept")
}

/// Polls `done` until it holds, failing with `left`'s account at `deadline`; returns how long
/// it took from `since` (printed, never asserted).
fn wait_until(
    con: &mut Connection,
    since: Instant,
    deadline: Instant,
    mut done: impl FnMut(&mut Connection) -> bool,
    left: impl Fn(&mut Connection) -> String,
) -> Duration {
    while !done(con) {
        assert!(
            Instant::now() < deadline,
            "not reclaimed within {:?}: {}",
            deadline - since,
            left(con)
        );
        sleep(Duration::from_millis(20));
    }
    since.elapsed()
}

/// `INFO rl` shows the sweep's counters.
fn assert_sweep_fields(con: &mut Connection) {
    let text = info(con, "rl");
    for name in [
        "rl_sweep_ticks",
        "rl_swept",
        "rl_sweep_tick_max_us",
        "rl_sweep_tick_max_cpu_us",
        "rl_sweep_tick_max_wall_us",
        "rl_sweep_tick_max_slots",
    ] {
        let value = info_field(&text, name).and_then(|v| v.parse::<u64>().ok());
        assert!(value.is_some(), "no {name} in INFO rl:\n{text}");
    }
}

/// 20,000 one-off fields beside a long-lived bucket in one table (so the key itself does
/// not expire: the sweep must remove each bucket): all gone within their time to full plus
/// 3 s.
#[test]
fn a_flood_in_one_table_is_reclaimed_whatever_else_the_keyspace_holds() {
    const FIELDS: usize = 20_000;
    let (server, mut con) = crowded_server();
    assert_sweep_fields(&mut con);
    let _: Vec<i64> = hacquire("t", "long", &LONG).query(&mut con).unwrap();
    let swept_before = swept(&mut con);
    send(
        &mut con,
        (0..FIELDS).map(|i| hacquire("t", &format!("{i:08}"), &ONE_OFF)),
    );
    let sent = Instant::now();
    let hlen = |con: &mut Connection| -> i64 {
        redis::cmd("RL.HLEN").arg("t").query(con).expect("RL.HLEN")
    };
    let took = wait_until(
        &mut con,
        sent,
        sent + TIME_TO_FULL + Duration::from_secs(3),
        |con| hlen(con) == 1,
        |con| format!("{} buckets left", hlen(con)),
    );
    println!("{FIELDS} one-off fields reclaimed {took:?} after the last was sent");
    // The background sweep removed them: the flood's own writes sweep too, but only fields
    // full by then, and the last second's were not.
    assert!(swept(&mut con) > swept_before);
    assert_eq!(
        dbsize(&mut con),
        other_keys() + 1,
        "the other keys are untouched"
    );
    server.assert_alive();
}

/// 10,000 tables of one one-off bucket each: all gone within their time to full plus 5 s.
#[test]
fn ten_thousand_small_tables_are_reclaimed_whatever_else_the_keyspace_holds() {
    const TABLES: usize = 10_000;
    let (server, mut con) = crowded_server();
    let other = other_keys();
    send(
        &mut con,
        (0..TABLES).map(|i| hacquire(&format!("table:{i}"), "f", &ONE_OFF)),
    );
    let sent = Instant::now();
    let took = wait_until(
        &mut con,
        sent,
        sent + TIME_TO_FULL + Duration::from_secs(5),
        |con| dbsize(con) == other,
        |con| format!("{} tables left", dbsize(con) - other),
    );
    println!("{TABLES} one-bucket tables reclaimed {took:?} after the last was sent");
    assert_sweep_fields(&mut con);
    server.assert_alive();
}

/// 5,000 tables, each with a long-lived bucket and a one-off one: the sweep (not the keys'
/// expiry) must visit every table. The deadline allows twice the documented pace of 16
/// tables a 10 ms tick (3.1 s for 5,000), plus the time to full and 2 s.
#[test]
fn five_thousand_live_tables_are_swept_whatever_else_the_keyspace_holds() {
    const TABLES: usize = 5_000;
    const TABLES_PER_TICK: u64 = 16;
    const TICK: Duration = Duration::from_millis(10);
    let pace = TICK * (TABLES as u64).div_ceil(TABLES_PER_TICK) as u32;
    let (server, mut con) = crowded_server();
    let swept_before = swept(&mut con);
    send(
        &mut con,
        (0..TABLES).flat_map(|i| {
            let key = format!("table:{i}");
            [hacquire(&key, "long", &LONG), hacquire(&key, "f", &ONE_OFF)]
        }),
    );
    let sent = Instant::now();
    let took = wait_until(
        &mut con,
        sent,
        sent + TIME_TO_FULL + pace * 2 + Duration::from_secs(2),
        |con| swept(con) >= swept_before + TABLES as u64,
        |con| format!("{} of {TABLES} swept", swept(con) - swept_before),
    );
    println!("{TABLES} live tables swept {took:?} after the last was sent");
    let mut pipe = redis::pipe();
    for i in 0..TABLES {
        pipe.cmd("RL.HLEN").arg(format!("table:{i}"));
    }
    let lens: Vec<i64> = pipe.query(&mut con).unwrap();
    assert!(
        lens.iter().all(|&n| n == 1),
        "a table lost its long-lived bucket or kept a full one"
    );
    server.assert_alive();
}
