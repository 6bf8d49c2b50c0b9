//! The clock stepping backwards and forwards, and a failover to a replica whose clock is
//! skewed, through the module's clock seam: `RL_CLOCK_OFFSET_MS` in a debug build's
//! environment shifts the module's clock (src/clock.rs), so a server's clock moves across a
//! restart from its AOF, and a replica runs ahead of or behind its master, without touching
//! the machine's clock. What docs/precision.md states, checked:
//!
//! - **Backwards:** a clock set back by `s` gives no token: the stored instant is absolute, so
//!   the bucket is `s` further from full (its reset grows by `s`; `RL.PEEK` reads the excess
//!   as a debt, a negative remaining), and a take is denied.
//! - **Forwards:** a clock set ahead by `s` refills `floor(s × rate)` tokens at once, capped at
//!   the capacity, exactly as `s` of waiting would.
//! - **Failover with skew:** a replica applies its master's exact states and never reads its
//!   own clock for them; once promoted it decides by its own clock, so its buckets hold the
//!   tokens they would at its time: a replica ahead by `s` gives `floor(s × rate)` more, one
//!   behind gives fewer.
//! - **Leases** hold absolute expiries too: a clock set back by `s` keeps a lease `s` longer,
//!   one set ahead frees it `s` sooner, and a promoted replica frees it by its own clock.
//!
//! Time: 1 token per 1000 s and offsets of thousands of seconds, so the real seconds a test
//! takes add no token (a check allows for one at most where a test could run near a token's
//! edge, which these instants are not: each starts from a take at the server's own instant).
//! One test function, since the seam is read from the process environment each server is
//! started with.

#![cfg(test)]

mod common;

use common::{wait_for_replica, Server};
use redis::Connection;

/// 1 token per 1000 s, capacity 10: emptied, full again in 10,000 s.
const LIMIT: [&str; 2] = ["0.001", "10"];

fn with_offset_ms<T>(offset_ms: i64, start: impl FnOnce() -> T) -> T {
    // SAFETY-free in this edition; one test function in this binary, so no other thread
    // reads the environment meanwhile.
    std::env::set_var("RL_CLOCK_OFFSET_MS", offset_ms.to_string());
    let started = start();
    std::env::remove_var("RL_CLOCK_OFFSET_MS");
    started
}

/// Empties the per-key bucket `k` and the table bucket `t f`.
fn empty_both(con: &mut Connection) {
    let reply: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg("k")
        .arg(&LIMIT[..])
        .arg("10")
        .query(con)
        .unwrap();
    assert_eq!(reply[..2], [1, 0], "{reply:?}");
    let reply: Vec<i64> = redis::cmd("RL.HACQUIRE")
        .arg("t")
        .arg("f")
        .arg(&LIMIT[..])
        .arg("10")
        .query(con)
        .unwrap();
    assert_eq!(reply[..2], [1, 0], "{reply:?}");
}

/// `[remaining, reset_after_ms]` of `k` and of `t f`, by `RL.PEEK` and `RL.HPEEK`.
fn peek_both(con: &mut Connection) -> [[i64; 2]; 2] {
    let k: Vec<i64> = redis::cmd("RL.PEEK")
        .arg("k")
        .arg(&LIMIT[..])
        .query(con)
        .unwrap();
    let t: Vec<i64> = redis::cmd("RL.HPEEK")
        .arg("t")
        .arg("f")
        .arg(&LIMIT[..])
        .query(con)
        .unwrap();
    [[k[1], k[3]], [t[1], t[3]]]
}

/// Both buckets hold `tokens` and are full again `reset_s` seconds from now, give or take
/// the few real seconds the test took (fewer tokens never, more by at most one).
fn assert_both(con: &mut Connection, tokens: i64, reset_s: i64, what: &str) {
    for (which, [remaining, reset_ms]) in ["k", "t f"].into_iter().zip(peek_both(con)) {
        assert!(
            remaining == tokens || (remaining == tokens + 1 && tokens < 10),
            "{what}: {which} holds {remaining} tokens, not {tokens}"
        );
        assert!(
            (reset_ms - reset_s * 1000).abs() <= 30_000,
            "{what}: {which} is full in {reset_ms} ms, not about {reset_s} s"
        );
    }
}

/// A lease of an hour on `l` (limit 1): its expiry is absolute, by the module's clock.
fn take_lease(con: &mut Connection) {
    let taken: (i64, Vec<u8>, i64, i64) = redis::cmd("RL.LEASE")
        .arg(&["l", "1", "3600000", "ID", "a"][..])
        .query(con)
        .unwrap();
    assert_eq!(taken, (1, b"a".to_vec(), 1, 3_600_000));
}

/// `l` still held and its slot free in about `free_in_s` seconds (within the 30 s the test
/// may take), or, with `None`, no longer held.
fn assert_lease(con: &mut Connection, free_in_s: Option<i64>, what: &str) {
    let [in_use, retry_after_ms]: [i64; 2] = redis::cmd("RL.LEASES")
        .arg(&["l", "1"][..])
        .query::<Vec<i64>>(con)
        .unwrap()
        .try_into()
        .unwrap();
    match free_in_s {
        Some(s) => assert!(
            in_use == 1 && (retry_after_ms - s * 1000).abs() <= 30_000,
            "{what}: lease {in_use} held, free in {retry_after_ms} ms, not about {s} s"
        ),
        None => assert_eq!([in_use, retry_after_ms], [0, 0], "{what}: the lease"),
    }
}

/// Whether the module under test has the seam (a debug build; `make dist-check` runs the
/// suite with the release `.so`, which has none): with its clock 10^6 s ahead, an emptied
/// bucket's key expires that much later than the server's own clock says.
fn has_seam() -> bool {
    let server = with_offset_ms(1_000_000_000, Server::start);
    let mut con = server.conn();
    let _: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg("probe")
        .arg(&LIMIT[..])
        .query(&mut con)
        .unwrap();
    let ahead_ms = common::pexpiretime(&mut con, b"probe") - common::server_time_ms(&mut con);
    ahead_ms > 500_000_000
}

#[test]
fn the_clock_backwards_forwards_and_across_a_failover_with_skew() {
    if !has_seam() {
        println!(
            "SKIPPED: the module under test has no clock seam (a release build); run with a \
             debug build (cargo build --lib) to check the clock"
        );
        return;
    }
    let aof = common::aof::PLAIN_AOF_ALWAYS;
    // Backwards and forwards: one server, restarted from its AOF with its clock moved.
    let mut server = with_offset_ms(0, || Server::start_with(&aof));
    empty_both(&mut server.conn());
    take_lease(&mut server.conn());
    assert_both(&mut server.conn(), 0, 10_000, "emptied");
    with_offset_ms(-3_000_000, || server.restart());
    let mut con = server.conn();
    // 13,000 s from full at 1000 s a token: 3 tokens below empty, as a debt reads.
    assert_both(&mut con, -3, 13_000, "the clock 3000 s back");
    // The lease's expiry is absolute: held 3000 s longer.
    assert_lease(&mut con, Some(6_600), "the clock 3000 s back");
    let denied: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg("k")
        .arg(&LIMIT[..])
        .query(&mut con)
        .unwrap();
    assert_eq!(denied[0], 0, "a take after the clock went back: {denied:?}");
    with_offset_ms(3_000_000, || server.restart());
    assert_both(&mut server.conn(), 3, 7_000, "the clock 3000 s ahead");
    assert_lease(&mut server.conn(), Some(600), "the clock 3000 s ahead");
    with_offset_ms(20_000_000, || server.restart());
    assert_both(&mut server.conn(), 10, 0, "the clock past the full instant");
    assert_lease(&mut server.conn(), None, "the clock past its expiry");
    drop(server);

    // Failover to a replica ahead of its master, and to one behind it.
    for (skew_ms, tokens, reset_s) in [(2_000_000, 2, 8_000), (-2_000_000, -2, 12_000)] {
        let master = with_offset_ms(0, Server::start);
        let replica = with_offset_ms(skew_ms, || master.start_replica());
        let mut m = master.conn();
        empty_both(&mut m);
        take_lease(&mut m);
        wait_for_replica(&mut m);
        assert_eq!(
            common::snapshot(&mut replica.conn()),
            common::snapshot(&mut m),
            "the replica holds the master's exact states, whatever its clock"
        );
        let mut r = replica.conn();
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut r)
            .unwrap();
        let what = format!("promoted with its clock {} s off", skew_ms / 1000);
        assert_both(&mut r, tokens, reset_s, &what);
        // The lease frees by the promoted replica's clock: sooner when it is ahead.
        assert_lease(&mut r, Some(3_600 - skew_ms / 1000), &what);
    }
}
