//! No stall at 10,000,000 buckets in one key (`make stall-tables`, ignored by default): the
//! largest single-call server time while one table is filled to `STALL_BUCKETS` (default
//! 10,000,000) with pipelined `RL.HACQUIRE` (every growth step on the way), swept in the
//! background (half its fields are one-off and fill up during the run), and cut with
//! `RL.HDEL` of 1,000 fields a call; then what `DEL` and `UNLINK` of the whole table cost.
//!
//! Measured with the server's own clocks: `SLOWLOG` at `slowlog-log-slower-than 1000`
//! (every call of 1 ms or more, wall time), `LATENCY LATEST` at `latency-monitor-threshold
//! 1`, and the module's `rl_sweep_tick_max_us` for the timer ticks (no command, so no
//! slowlog entry; CPU time of the main thread). The slowlog is asserted empty of `RL.*`
//! calls only with `STALL_STRICT=1` (a quiet machine): elsewhere it shows the scheduler.
//! Run it on the release build (`RL_MODULE`, as the make target does): a debug build is
//! several times slower per slot.

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::info::info_number;
use common::Server;
use redis::{Connection, Value};

/// Slowlog entries as (command name, µs).
fn slowlog(con: &mut Connection) -> Vec<(String, i64)> {
    let entries: Vec<Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(1024)
        .query(con)
        .unwrap();
    entries
        .iter()
        .filter_map(|e| match e {
            Value::Array(parts) => {
                let us = match parts.get(2) {
                    Some(Value::Int(us)) => *us,
                    _ => return None,
                };
                let name = match parts.get(3) {
                    Some(Value::Array(args)) => match args.first() {
                        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).to_uppercase(),
                        _ => String::new(),
                    },
                    _ => String::new(),
                };
                Some((name, us))
            }
            _ => None,
        })
        .collect()
}

fn reset_slowlog(con: &mut Connection) {
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(con).unwrap();
}

/// `LATENCY LATEST` as (event, max ms).
fn latency(con: &mut Connection) -> Vec<(String, i64)> {
    let events: Vec<Value> = redis::cmd("LATENCY").arg("LATEST").query(con).unwrap();
    events
        .iter()
        .filter_map(|e| match e {
            Value::Array(parts) => match (parts.first(), parts.get(3)) {
                (Some(Value::BulkString(name)), Some(Value::Int(max))) => {
                    Some((String::from_utf8_lossy(name).into_owned(), *max))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn hlen(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("RL.HLEN").arg(key).query(con).unwrap()
}

#[test]
#[ignore = "10,000,000 buckets: minutes and about 1 GB; run with `make stall-tables`"]
fn no_call_stalls_at_ten_million_buckets_in_one_key() {
    let buckets: usize = std::env::var("STALL_BUCKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let server = Server::start_with(&[
        "--slowlog-log-slower-than",
        "1000",
        "--slowlog-max-len",
        "1024",
        "--latency-monitor-threshold",
        "1",
    ]);
    let mut con = server.conn();
    let started = Instant::now();
    let mut pipe = redis::pipe();
    // Even fields live long (a token per 1024 s); odd ones are full again a while after
    // their call: about when the fill ends (it runs at 30,000 calls/s or more), so the table
    // reaches its full size and the background sweep then removes them from it.
    let one_off = format!("1/{}", (buckets / 30_000).max(20));
    for i in 0..buckets {
        let rate = if i % 2 == 0 { "0.0009765625" } else { &one_off };
        pipe.cmd("RL.HACQUIRE")
            .arg("big")
            .arg(format!("{i:016}"))
            .arg(rate)
            .arg(1)
            .ignore();
        if pipe.cmd_iter().count() >= 10_000 || i + 1 == buckets {
            let _: () = pipe.query(&mut con).unwrap();
            pipe = redis::pipe();
        }
    }
    let filled = hlen(&mut con, "big");
    println!("filled {filled} buckets in {:?}", started.elapsed());
    assert!(
        filled as usize > buckets * 9 / 10,
        "the sweep ran ahead of the fill"
    );
    // Let the sweep remove a good share of the one-off half.
    let deadline = Instant::now() + Duration::from_secs(60);
    while info_number::<u64>(&mut con, "rl", "rl_swept") < buckets as u64 / 4
        && Instant::now() < deadline
    {
        sleep(Duration::from_millis(200));
    }
    let fill_calls = slowlog(&mut con);
    reset_slowlog(&mut con);
    // RL.HDEL of 1,000 fields a call, 100 calls.
    for call in 0..100 {
        let mut cmd = redis::cmd("RL.HDEL");
        cmd.arg("big");
        for j in 0..1000 {
            cmd.arg(format!("{:016}", (call * 1000 + j) * 2));
        }
        let _: i64 = cmd.query(&mut con).unwrap();
    }
    let hdel_calls = slowlog(&mut con);
    println!("RL.HDEL calls of 1 ms or more (wall): {hdel_calls:?}");
    let calls: Vec<(String, i64)> = fill_calls.into_iter().chain(hdel_calls).collect();
    let events = latency(&mut con);
    let tick_max_us: u64 = info_number(&mut con, "rl", "rl_sweep_tick_max_us");
    let swept: u64 = info_number(&mut con, "rl", "rl_swept");
    let rl: Vec<i64> = calls
        .iter()
        .filter(|(name, _)| name.starts_with("RL."))
        .map(|&(_, us)| us)
        .collect();
    println!(
        "at {} buckets ({} swept): {} RL calls of 1 ms or more (wall), longest {:?} µs; \
         latency {events:?}; longest sweep tick {tick_max_us} µs of CPU",
        hlen(&mut con, "big"),
        swept,
        rl.len(),
        rl.iter().max()
    );

    // The whole table: COPY (O(N), like COPY of any big value), DEL in the calling thread,
    // UNLINK on the lazy-free thread.
    reset_slowlog(&mut con);
    let _: i64 = redis::cmd("COPY")
        .arg("big")
        .arg("big2")
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("DEL").arg("big2").query(&mut con).unwrap();
    let _: i64 = redis::cmd("UNLINK").arg("big").query(&mut con).unwrap();
    let whole = slowlog(&mut con);
    println!("whole table: {whole:?}");

    assert!(
        tick_max_us < 1000,
        "a sweep tick took {tick_max_us} µs of CPU"
    );
    // SLOWLOG is wall time: on a shared machine a call that lost the CPU to another process
    // shows the scheduler's slices (multiples of 4 ms), so these are checked only where the
    // run says the machine is quiet.
    if std::env::var("STALL_STRICT").is_ok_and(|v| v == "1") {
        let rl_over: Vec<_> = calls
            .iter()
            .filter(|(name, _)| name.starts_with("RL."))
            .collect();
        assert!(rl_over.is_empty(), "RL calls of 1 ms or more: {rl_over:?}");
        assert!(
            !whole.iter().any(|(name, _)| name == "UNLINK"),
            "UNLINK took 1 ms or more: {whole:?}"
        );
    }
}
