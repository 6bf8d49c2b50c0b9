//! The master's background sweep of tables (a module timer) against a real server: a flood
//! of one-off fields in a table that receives no writes afterwards gives its memory back
//! within time-to-full plus the sweep's documented pace, the long-lived bucket beside it is
//! untouched, replicas and the AOF follow the master's removals DUMP for DUMP, and a replica
//! never sweeps by its own clock.
//!
//! Time: the one-off fields take 1 token with capacity 1, so each is full again 1 / rate
//! after its call (10 s in the flood test, longer than the flood takes to send; 1 s
//! elsewhere); the long-lived bucket refills one token in 1024 s and so does
//! not change during a test. Waits poll against a deadline (time-to-full plus the documented
//! sweep pace, with a margin for a debug build on a shared machine); nothing asserts how
//! long the sweep took. The replica test's "never sweeps" waits, by the replica's own clock,
//! until every one-off bucket is past full, and then checks nothing was removed.
//!
//! `FLOOD_FIELDS` sets the flood of the default test (200,000); the ignored
//! `a_million_field_flood_is_reclaimed_by_the_background_sweep` runs 1,000,000.

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::info::{info_number, used_memory, wait_reclaimed};
use common::{server_time_ms, snapshot, wait_for_replica, wait_for_replica_after_others, Server};
use redis::Connection;

/// The long-lived bucket: 1 token per 1024 s, capacity 10, 3 taken.
const SLOW: [&str; 3] = ["0.0009765625", "10", "3"];
/// One-off fields in the small tests: full again 1 s after their one call.
const ONE_OFF: [&str; 2] = ["1", "1"];
/// The sweep's documented pace (docs/tables.md): 8,192 slot reads per 10 ms tick, about 9 a
/// slot when every bucket is full (a removal shifts its cluster's rest back). A table of N
/// buckets holds at most N / 0.5 slots, plus its shrinks' migrations, each at most as many.
const READS_PER_S: u64 = 819_200;
const READS_PER_SLOT: u64 = 9;

fn hlen(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("RL.HLEN").arg(key).query(con).expect("RL.HLEN")
}

fn hacquire(key: &str, field: &[u8], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.HACQUIRE");
    cmd.arg(key).arg(field).arg(args);
    cmd
}

/// The long-lived bucket's allowed, limit and remaining (its reset moves with the clock).
fn slow_peek(con: &mut Connection, key: &str) -> Vec<i64> {
    let mut reply: Vec<i64> = redis::cmd("RL.HPEEK")
        .arg(key)
        .arg("slow")
        .arg(&SLOW[..2])
        .arg(1)
        .query(con)
        .expect("RL.HPEEK");
    reply.truncate(3);
    reply
}

/// Sends `fields` one-off fields to `key` in pipelines of 10,000 and returns the peak of
/// used_memory above `before` seen after each pipeline.
fn flood(con: &mut Connection, key: &str, fields: usize, rate: &str, before: i64) -> i64 {
    let mut peak = 0;
    let mut pipe = redis::pipe();
    for i in 0..fields {
        pipe.add_command(hacquire(key, format!("{i:016}").as_bytes(), &[rate, "1"]))
            .ignore();
        if pipe.cmd_iter().count() >= 10_000 || i + 1 == fields {
            let _: () = pipe.query(con).expect("flood");
            pipe = redis::pipe();
            peak = peak.max(used_memory(con) - before);
        }
    }
    peak
}

/// How long the documented pace allows for a table of `fields` buckets, plus time-to-full,
/// times a margin for a debug build on a loaded machine.
fn allowed(fields: usize, time_to_full_ms: u64) -> Duration {
    let slots = fields as u64 * 2;
    let reads = slots * READS_PER_SLOT + slots * 2;
    let pace_ms = reads * 1000 / READS_PER_S + time_to_full_ms;
    Duration::from_millis(pace_ms * 10 + 5_000)
}

/// `fields` one-off fields at `rate` (1 token, capacity 1) beside one long-lived bucket.
/// The time-to-full (1 / rate) is longer than the flood takes to send, so the peak is the
/// whole flood's.
fn flood_is_reclaimed(fields: usize, rate: &str, time_to_full_ms: u64) {
    let server = Server::start();
    let mut con = server.conn();
    let _: Vec<i64> = hacquire("t", b"slow", &SLOW).query(&mut con).unwrap();
    let slow_before = slow_peek(&mut con, "t");
    let expiry_before = common::pexpiretime(&mut con, b"t");
    let before = used_memory(&mut con);
    let acquires_before = server.calls("rl.hacquire");
    let started = Instant::now();
    let peak = flood(&mut con, "t", fields, rate, before);
    println!(
        "flood of {fields}: peak {peak} B in {:?}",
        started.elapsed()
    );
    assert!(
        peak > fields as i64 * 16,
        "the flood added only {peak} bytes"
    );
    let flooded = Instant::now();
    wait_reclaimed(&mut con, before, peak, allowed(fields, time_to_full_ms));
    println!(
        "reclaimed to 5% of the peak {:?} after the flood",
        flooded.elapsed()
    );
    // Only the timer wrote: no command ran since the flood but these reads.
    assert_eq!(server.calls("rl.hacquire"), acquires_before + fields as u64);
    // The long-lived bucket is untouched, and its table (and expiry) with it.
    assert_eq!(slow_peek(&mut con, "t"), slow_before);
    assert_eq!(common::pexpiretime(&mut con, b"t"), expiry_before);
    // Every one-off bucket is gone, not only their memory.
    let deadline = Instant::now() + allowed(fields, 0);
    while hlen(&mut con, "t") != 1 {
        assert!(Instant::now() < deadline, "{} left", hlen(&mut con, "t"));
        sleep(Duration::from_millis(20));
    }
    // A tick's time is the lesser of its two clocks, so the longest is at most the longest
    // by either clock alone (which may come from other ticks).
    let tick = |con: &mut Connection, name: &str| info_number::<u64>(con, "rl", name);
    let (least, cpu, wall) = (
        tick(&mut con, "rl_sweep_tick_max_us"),
        tick(&mut con, "rl_sweep_tick_max_cpu_us"),
        tick(&mut con, "rl_sweep_tick_max_wall_us"),
    );
    println!("longest sweep tick {least} µs (CPU clock {cpu} µs, monotonic clock {wall} µs)");
    assert!(least > 0 && least <= cpu && least <= wall);
}

#[test]
fn a_flood_of_one_off_fields_is_reclaimed_by_the_background_sweep() {
    let fields = std::env::var("FLOOD_FIELDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // Full again in 10 s: longer than 200,000 calls take on a debug build.
    flood_is_reclaimed(fields, "0.1", 10_000);
}

#[test]
#[ignore = "1,000,000 fields: about a minute on a debug build; run with --ignored"]
fn a_million_field_flood_is_reclaimed_by_the_background_sweep() {
    // Full again in 50 s: longer than 1,000,000 calls take on a debug build.
    flood_is_reclaimed(1_000_000, "0.02", 50_000);
}

#[test]
fn a_table_left_with_only_full_buckets_is_deleted_by_the_sweep() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = {
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            pipe.add_command(hacquire("gone", format!("{i}").as_bytes(), &ONE_OFF))
                .ignore();
        }
        pipe.query(&mut con).unwrap()
    };
    // Under another db too: the walk visits every database.
    let _: () = redis::cmd("SELECT").arg(3).query(&mut con).unwrap();
    let _: Vec<i64> = hacquire("gone3", b"f", &ONE_OFF).query(&mut con).unwrap();
    let deadline = Instant::now() + allowed(1000, 1000);
    loop {
        let left: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        let _: () = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
        let left0: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        let _: () = redis::cmd("SELECT").arg(3).query(&mut con).unwrap();
        if left + left0 == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left0} and {left} keys left");
        sleep(Duration::from_millis(20));
    }
}

#[test]
fn replicas_and_the_aof_follow_the_masters_sweep_and_never_sweep_alone() {
    const FIELDS: usize = 20_000;
    let master = Server::start_with(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut m = master.conn();
    let replica = master.start_replica();
    let mut r = replica.conn();
    let _: Vec<i64> = hacquire("t", b"slow", &SLOW).query(&mut m).unwrap();
    // used_memory is no measure here: the replication backlog grows with the flood.
    let _ = flood(&mut m, "t", FIELDS, ONE_OFF[0], 0);
    let deadline = Instant::now() + allowed(FIELDS, 1000);
    while hlen(&mut m, "t") != 1 {
        assert!(Instant::now() < deadline, "{} left", hlen(&mut m, "t"));
        sleep(Duration::from_millis(20));
    }
    // The removals are the timer's writes, not this connection's: WAIT alone waits only
    // for this connection's last write (the flood), so a marker write orders after them.
    wait_for_replica_after_others(&mut m, "marker");
    let on_master = snapshot(&mut m);
    assert_eq!(snapshot(&mut r), on_master);
    // The stream carried the removals as effects.
    let calls = |con: &mut Connection, name: &str| common::info::calls(con, name).unwrap_or(0);
    assert_eq!(calls(&mut r, "rl.hacquire"), 0);
    assert!(calls(&mut r, "rl.hsetstate") >= FIELDS as u64);
    // The AOF replays to the same table.
    let mut master = master;
    master.restart_with(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    assert_eq!(snapshot(&mut master.conn()), on_master, "after the AOF");

    // A replica cut off from its master keeps full buckets: only a master decides.
    let mut master2 = Server::start();
    let mut m2 = master2.conn();
    let replica2 = master2.start_replica();
    let mut r2 = replica2.conn();
    let mut pipe = redis::pipe();
    // The long-lived bucket keeps the key from expiring, which a replica would show.
    pipe.add_command(hacquire("cut", b"slow", &SLOW)).ignore();
    for i in 0..1000 {
        // Full again in 5 s: time for the replica to sync before the master would sweep.
        pipe.add_command(hacquire("cut", format!("{i}").as_bytes(), &["0.2", "1"]))
            .ignore();
    }
    let _: () = pipe.query(&mut m2).unwrap();
    wait_for_replica(&mut m2);
    let flooded_ms = server_time_ms(&mut r2);
    master2.kill();
    let held = snapshot(&mut r2);
    assert_eq!(hlen(&mut r2, "cut"), 1001);
    // Past every bucket's full-at by the replica's clock, plus many sweep intervals.
    while server_time_ms(&mut r2) < flooded_ms + 5_000 + 500 {
        sleep(Duration::from_millis(50));
    }
    assert_eq!(hlen(&mut r2, "cut"), 1001);
    assert_eq!(snapshot(&mut r2), held);
}
