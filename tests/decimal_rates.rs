//! Rates as the decimals typed, and `N/S`, against a real server:
//! the same exact buckets through `RL.ACQUIRE`, `RL.PEEK`, `RL.REFUND` and
//! `RL.ACQUIRE.MULTI`; the memory of a whole-nanosecond rate like `0.01`; `RL.GCRA` periods
//! checked exactly; and what 0.2.0 stored (RDB, AOF, `DUMP`) read under the decimal reading.
//!
//! Time: every bucket starts from an `RL.SETSTATE` in 2100, with a capacity that refills in
//! about 95 years, so a take starts from that stored instant whatever the clock says, and
//! every state compared is exact. Nothing asserts a wall-clock duration.

#![cfg(test)]

mod common;

use common::texts::{CAPACITY, GCRA_RATE, RATE};
use common::{dump, error_text, exists, pexpiretime, Server};
use redis::Connection;

/// 2100-01-01T00:00:00Z in ns: far enough that takes start from the stored instant.
const BASE_NS: u64 = 4_102_444_800_000_000_000;

/// `RL.SETSTATE key full_at_ns [full_at_frac]`.
fn set_state(con: &mut Connection, key: &str, full_at_ns: u64, full_at_frac: u64) {
    let mut cmd = redis::cmd("RL.SETSTATE");
    cmd.arg(key).arg(full_at_ns);
    if full_at_frac > 0 {
        cmd.arg(full_at_frac);
    }
    let ok: String = cmd.query(con).expect("RL.SETSTATE");
    assert_eq!(ok, "OK");
}

/// Whether `key` holds exactly the state `(full_at_ns, full_at_frac)`, with its expiry: its
/// `DUMP` and `PEXPIRETIME` equal those of a fresh `RL.SETSTATE` of that state.
fn assert_state(con: &mut Connection, key: &str, (full_at_ns, full_at_frac): (u64, u64)) {
    let probe = format!("probe:{key}");
    set_state(con, &probe, full_at_ns, full_at_frac);
    assert_eq!(
        dump(con, key.as_bytes()),
        dump(con, probe.as_bytes()),
        "{key} should hold {full_at_ns} + {full_at_frac} × 2^-63 ns"
    );
    assert_eq!(
        pexpiretime(con, key.as_bytes()),
        pexpiretime(con, probe.as_bytes()),
        "{key}"
    );
    let _: i64 = redis::cmd("DEL").arg(&probe).query(con).expect("DEL");
}

/// A fraction of a nanosecond as the state stores it: `ceil(num / den × 2^63)`.
fn frac(num: u128, den: u128) -> u64 {
    u64::try_from((num << 63).div_ceil(den)).expect("below 2^63")
}

fn ints(con: &mut Connection, name: &str, args: &[&str]) -> Vec<i64> {
    redis::cmd(name)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("{name} {args:?}: {e}"))
}

#[test]
fn fraction_rates_work_in_every_command() {
    let server = Server::start();
    let mut con = server.conn();
    // 100 a minute: T = 0.6 s exactly. Capacity 5e9 refills in 95 years.
    let (rate, capacity) = ("100/60", "5000000000");
    set_state(&mut con, "m", BASE_NS, 0);
    let peeked = ints(&mut con, "RL.PEEK", &["m", rate, capacity, "1"]);
    assert_eq!(peeked[0], 1, "a take fits");
    assert_state(&mut con, "m", (BASE_NS, 0)); // a peek writes nothing
    assert_eq!(ints(&mut con, "RL.ACQUIRE", &["m", rate, capacity])[0], 1);
    assert_state(&mut con, "m", (BASE_NS + 600_000_000, 0));
    ints(&mut con, "RL.REFUND", &["m", rate, capacity, "1"]);
    assert_state(&mut con, "m", (BASE_NS, 0));
    let multi: (i64, i64, i64, Vec<Vec<i64>>) = redis::cmd("RL.ACQUIRE.MULTI")
        .arg(&["m", rate, capacity, "2"])
        .query(&mut con)
        .expect("RL.ACQUIRE.MULTI");
    assert_eq!(multi.0, 1);
    assert_state(&mut con, "m", (BASE_NS + 1_200_000_000, 0));

    // 7 per 3 s: T = 3e9 / 7 ns, 428,571,428 and 4/7 ns. Capacity 7e9 refills in 95 years.
    set_state(&mut con, "s", BASE_NS, 0);
    assert_eq!(
        ints(&mut con, "RL.ACQUIRE", &["s", "7/3", "7000000000", "1"])[0],
        1
    );
    assert_state(&mut con, "s", (BASE_NS + 428_571_428, frac(4, 7)));
    // Seven takes are exactly 3 s: no drift from the fraction.
    for _ in 0..6 {
        ints(&mut con, "RL.ACQUIRE", &["s", "7/3", "7000000000", "1"]);
    }
    assert_state(&mut con, "s", (BASE_NS + 3_000_000_000, 0));

    // A bad fraction names the rate in each command, and writes nothing.
    for name in ["RL.ACQUIRE", "RL.PEEK", "RL.REFUND"] {
        for bad in ["1/0", "0/1", "1/", "/1", "1/2/3", "1/1000001"] {
            let cmd = redis::cmd(name).arg(&["fresh", bad, "10"]).clone();
            assert_eq!(error_text(&mut con, &cmd), RATE, "{name} {bad}");
        }
        let cmd = redis::cmd(name).arg(&["fresh", "100/60", "0"]).clone();
        assert_eq!(error_text(&mut con, &cmd), CAPACITY, "{name}");
    }
    let cmd = redis::cmd("RL.ACQUIRE.MULTI")
        .arg(&["fresh", "1/0", "10", "1"])
        .clone();
    assert_eq!(error_text(&mut con, &cmd), RATE);
    assert!(!exists(&mut con, b"fresh"));
}

#[test]
fn a_decimal_rate_whose_token_is_whole_nanoseconds_keeps_the_inline_state() {
    let server = Server::start();
    let mut con = server.conn();
    // 0.01/s is one token per 100 s exactly, so the state is whole ns and
    // costs what 10/s costs (0.2.0 took the double and allocated 16 bytes for a fraction).
    for key in ["at-0.01", "at-10.0"] {
        let rate = &key[3..];
        for _ in 0..2 {
            let reply = ints(&mut con, "RL.ACQUIRE", &[key, rate, "1000", "400"]);
            assert_eq!(reply[0], 1, "{key}");
        }
    }
    let usage = |con: &mut Connection, key: &str| -> i64 {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query(con)
            .expect("MEMORY USAGE")
    };
    assert_eq!(usage(&mut con, "at-0.01"), usage(&mut con, "at-10.0"));
    // 0.1 is one token per 10 s: ten takes from 2100 are exactly 100 s, whole ns.
    set_state(&mut con, "tenth", BASE_NS, 0);
    for _ in 0..10 {
        ints(&mut con, "RL.ACQUIRE", &["tenth", "0.1", "300000000"]);
    }
    assert_state(&mut con, "tenth", (BASE_NS + 100_000_000_000, 0));
}

/// A regression: `RL.GCRA`'s period was rounded to whole ns through a double (which
/// saturates above about 585 years) before the rate was checked.
#[test]
fn gcra_checks_the_rate_on_the_exact_period() {
    let server = Server::start();
    let mut con = server.conn();
    // About 1e-294 tokens/s, and 2e9/s: refused, nothing written.
    for period in ["1e300", "5e-10"] {
        let tokens = if period == "1e300" { "1000000" } else { "1" };
        let cmd = redis::cmd("RL.GCRA")
            .arg(&["g", "0", tokens, period])
            .clone();
        assert_eq!(error_text(&mut con, &cmd), GCRA_RATE, "period {period}");
    }
    assert!(!exists(&mut con, b"g"));
    // 1e15 per 1e11 s is 10,000/s: T = 1e5 ns exactly (it ran at 2^64 - 1 ns / 1e15, about
    // 54,210/s). A burst of 3e13 + 1 refills in 95 years, so the take starts from 2100.
    set_state(&mut con, "g", BASE_NS, 0);
    let reply = ints(
        &mut con,
        "RL.GCRA",
        &["g", "30000000000000", "1000000000000000", "100000000000"],
    );
    assert_eq!(reply[0], 0, "allowed");
    assert_state(&mut con, "g", (BASE_NS + 100_000, 0));
    // 1 per 1.4e-9 s: T = 1.4 ns (it was rounded to 1 ns, 40% looser). Emptying a burst of
    // 1e15 takes 1.4e15 ns, which the reset reports in whole seconds.
    let reply = ints(
        &mut con,
        "RL.GCRA",
        &[
            "h",
            "999999999999999",
            "1",
            "1.4e-9",
            "TOKENS",
            "1000000000000000",
        ],
    );
    assert_eq!((reply[0], reply[2], reply[4]), (0, 0, 1_400_000));
}

// ---------------------------------------------------------------------------------------------
// What 0.2.0 stored. See tests/fixtures/README.md and make-v2-fixtures.sh.
// ---------------------------------------------------------------------------------------------

const FIXTURE_V2_RDB: &[u8] = include_bytes!("fixtures/v2-buckets.rdb");
const FIXTURE_V2_DUMP: &[u8] = include_bytes!("fixtures/v2-bucket.dump");
const FIXTURE_V2_AOF_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v2-aof");

/// The states 0.2.0 wrote from `BASE_NS` with one take each, the rate taken as its double's
/// exact value: `BASE_NS + 1e9 / rate`, the fraction rounded up to 2^-63 ns (worked out with
/// exact fractions, not by this module).
const V2_ONE_TAKE: &[(&str, (u64, u64))] = &[
    // 10/s: 1e8 ns, whole.
    ("whole", (4_102_444_800_100_000_000, 0)),
    // 3/s: 333,333,333 and 1/3 ns.
    (
        "three",
        (4_102_444_800_333_333_333, 3_074_457_345_618_258_603),
    ),
    // The double 0.1 is 0.1000000000000000055…: 1e10 - 5.55e-7 ns.
    (
        "tenth",
        (4_102_444_809_999_999_999, 9_223_366_916_854_775_809),
    ),
    // The double 1e-6 is just below it: 1e15 + 0.045… ns.
    ("slow", (4_103_444_800_000_000_000, 417_375_000_000_000_019)),
];

/// Each bucket's limit as the fixture script used it, and the state one more take under the
/// decimal reading gives: the stored instant re-expressed in the decimal rate's ticks (rounded
/// up, so at most one tick stricter: 5.55e-7 ns for 0.1, 0.955 ns for 0.000001, nothing at
/// 10/s and 3/s, whose doubles are exact) plus the decimal `T`.
const V2_NEXT_TAKE: &[(&str, &str, &str, (u64, u64))] = &[
    ("whole", "10", "30000000000", (4_102_444_800_200_000_000, 0)),
    (
        "three",
        "3",
        "9000000000",
        (4_102_444_800_666_666_666, 6_148_914_691_236_517_206),
    ),
    // ceil(BASE + 1e10 - 5.55e-7 ns) = BASE + 1e10, plus 1e10: whole ns from now on.
    ("tenth", "0.1", "300000000", (4_102_444_820_000_000_000, 0)),
    // ceil(BASE + 1e15 + 0.045 ns) = BASE + 1e15 + 1, plus 1e15.
    ("slow", "0.000001", "3000", (4_104_444_800_000_000_001, 0)),
];

/// Checks the one-take states, then takes once more under the decimal reading.
fn assert_v2_buckets_take_on(con: &mut Connection, one_take: &[(&str, (u64, u64))]) {
    for &(key, state) in one_take {
        assert_state(con, key, state);
    }
    for &(key, rate, capacity, next) in V2_NEXT_TAKE {
        if !one_take.iter().any(|&(k, _)| k == key) {
            continue;
        }
        let reply = ints(con, "RL.ACQUIRE", &[key, rate, capacity, "1"]);
        assert_eq!(reply[0], 1, "{key}: allowed");
        assert_state(con, key, next);
    }
}

#[test]
fn v2_rdb_fixture_loads_to_the_same_buckets_and_takes_on_at_decimal_rates() {
    assert!(FIXTURE_V2_RDB.starts_with(b"REDIS0010"));
    let mut server = Server::start();
    server.kill();
    std::fs::write(server.dir.path().join("dump.rdb"), FIXTURE_V2_RDB).expect("write dump.rdb");
    server.restart_with(&[]);
    let mut con = server.conn();
    assert_v2_buckets_take_on(&mut con, V2_ONE_TAKE);
}

#[test]
fn v2_dump_fixture_restores_to_its_state() {
    let server = Server::start();
    let mut con = server.conn();
    let (_, state) = V2_ONE_TAKE[2];
    assert_eq!(V2_ONE_TAKE[2].0, "tenth");
    let expire_at_ms = (state.0 + 1).div_ceil(1_000_000);
    let ok: String = redis::cmd("RESTORE")
        .arg("tenth")
        .arg(expire_at_ms)
        .arg(FIXTURE_V2_DUMP)
        .arg("ABSTTL")
        .query(&mut con)
        .expect("RESTORE the fixture");
    assert_eq!(ok, "OK");
    assert_v2_buckets_take_on(&mut con, &V2_ONE_TAKE[2..3]);
}

#[test]
fn v2_aof_fixture_replays_to_the_same_buckets_and_takes_on_at_decimal_rates() {
    let args = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];
    let mut server = Server::start_with(&args);
    server.kill();
    let aof_dir = server.dir.path().join("appendonlydir");
    let _ = std::fs::remove_dir_all(&aof_dir);
    std::fs::create_dir(&aof_dir).expect("create appendonlydir");
    for entry in std::fs::read_dir(FIXTURE_V2_AOF_DIR).expect("the AOF fixture") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("file name");
        std::fs::copy(&path, aof_dir.join(name)).expect("copy a fixture file");
    }
    server.restart_with(&args);
    let mut con = server.conn();
    // The increment took once more from "three" and "tenth", still as 0.2.0: two takes.
    let two_takes = [
        (
            "three",
            (4_102_444_800_666_666_666, 6_148_914_691_236_517_206),
        ),
        (
            "tenth",
            (4_102_444_819_999_999_999, 9_223_361_796_854_775_809),
        ),
    ];
    for (key, state) in two_takes {
        assert_state(&mut con, key, state);
    }
    assert_v2_buckets_take_on(&mut con, &[V2_ONE_TAKE[0], V2_ONE_TAKE[3]]);
}
