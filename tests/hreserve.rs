//! Reservations on table buckets against real servers: RL.HRESERVE, RL.HSETTLE and the
//! internal RL.HRESVSTATE. A reservation and its settle leave the field exactly as
//! RL.HACQUIRE of the estimate then RL.HREFUND or RL.HCHARGE of the difference leave a twin
//! field, and reply as RL.RESERVE and RL.SETTLE on a per-key twin; a settle applies once
//! whatever the retries (concurrent settles of one id: exactly one applies); an unsettled
//! reservation lapses and its tokens stay taken; a field with an open record is not swept
//! before the record lapses, even full; the records live beside the buckets (a table without
//! any costs what it did); replica, AOF replay, AOF rewrite and RDB restart hold identical
//! tables (`DUMP` and the digest); WRONGTYPE; every bad argument's exact error, writing
//! nothing.
//!
//! Time: most tests use 1 token per 1000 s, so refill never moves a whole token during a
//! test and balances are exact. The replies at 3/s, 7/s and 3 per 10 s are compared with a
//! per-key twin run in the same `MULTI`: equal where the server's clock is fixed per command
//! (Redis 7.2+, Valkey), and on Redis 7.0, whose module clock is read live in ms, equal in the
//! balance and within 1 ms in the waits. The tests about lapses wait past a ttl of their own
//! and assert no duration.

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::aof::PLAIN_AOF_ALWAYS;
use common::texts::{
    ACTUAL, CAPACITY, ESTIMATE, FULL_AT, ID, ID_MISSING, RATE as RATE_TEXT, RESERVATIONS,
    RESERVATION_EXPIRES_AT, TTL, WRONGTYPE,
};
use common::{
    arity, assert_rejected_on_empty_server, assert_restarts_keep, dump, error_text, info, ints,
    race, snapshot, text_command as command, wait_for_replica, Server,
};
use redis::{Connection, Value};

const RATE: &str = "0.001";
const CAP: &str = "10";
const HOUR_MS: &str = "3600000";

/// `RL.HRESERVE`'s reply: allowed, id, remaining, retry_after_ms.
type Reserved = (i64, Vec<u8>, i64, i64);

fn hreserve(con: &mut Connection, args: &[&str]) -> Reserved {
    redis::cmd("RL.HRESERVE")
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("RL.HRESERVE {args:?}: {e}"))
}

fn hsettle(con: &mut Connection, key: &str, field: &str, id: &str, actual: &str) -> [i64; 3] {
    let reply: Vec<i64> = redis::cmd("RL.HSETTLE")
        .arg(&[key, field, RATE, CAP, id, actual])
        .query(con)
        .unwrap_or_else(|e| panic!("RL.HSETTLE {key} {field} {id} {actual}: {e}"));
    reply
        .try_into()
        .expect("RL.HSETTLE replies with 3 integers")
}

/// The signed balance of `field` in `key` (RL.HPEEK's second integer).
fn balance(con: &mut Connection, key: &str, field: &str) -> i64 {
    ints(con, "RL.HPEEK", &[key, field, RATE, CAP, "0"])[1]
}

fn not_open(id: &str) -> String {
    format!("ERR id {id} is not an open reservation of this field (settled, expired or never made)")
}

fn hlen(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("RL.HLEN").arg(key).query(con).unwrap()
}

#[test]
fn hreserve_and_hsettle_match_hacquire_hrefund_and_hcharge_on_a_twin() {
    let server = Server::start();
    let mut con = server.conn();
    // (estimate, actual) in order; the twin field takes the estimate with RL.HACQUIRE and
    // then gives back or charges the difference.
    let steps = [
        ("4", "1"),
        ("3", "3"),
        ("2.5", "0.5"),
        ("1", "6"),
        ("2", "0"),
    ];
    let mut ids = Vec::new();
    for (i, (estimate, _)) in steps.iter().enumerate() {
        let id = format!("r{i}");
        let got = hreserve(
            &mut con,
            &["t", "f", RATE, CAP, estimate, HOUR_MS, "ID", &id],
        );
        let want = ints(&mut con, "RL.HACQUIRE", &["t", "twin", RATE, CAP, estimate]);
        assert_eq!((got.0, got.2), (want[0], want[1]), "reserve {estimate}");
        let want_id = if got.0 == 1 { id.as_bytes() } else { b"" };
        assert_eq!(got.1, want_id);
        ids.push((id, got.0 == 1));
    }
    for ((id, taken), (estimate, actual)) in ids.iter().zip(steps) {
        if !taken {
            let text = error_text(
                &mut con,
                &command("RL.HSETTLE", &["t", "f", RATE, CAP, id, actual]),
            );
            assert_eq!(text, not_open(id));
            continue;
        }
        let got = hsettle(&mut con, "t", "f", id, actual);
        let (e, a): (f64, f64) = (estimate.parse().unwrap(), actual.parse().unwrap());
        if a > e {
            let diff = format!("{}", a - e);
            ints(&mut con, "RL.HCHARGE", &["t", "twin", RATE, CAP, &diff]);
        } else if e > a {
            let diff = format!("{}", e - a);
            ints(&mut con, "RL.HREFUND", &["t", "twin", RATE, CAP, &diff]);
        }
        assert_eq!(got[0], balance(&mut con, "t", "twin"), "settle {id}");
        assert_eq!(balance(&mut con, "t", "f"), balance(&mut con, "t", "twin"));
        // Settled once: a retry is refused and changes nothing.
        let before = dump(&mut con, b"t");
        let text = error_text(
            &mut con,
            &command("RL.HSETTLE", &["t", "f", RATE, CAP, id, actual]),
        );
        assert_eq!(text, not_open(id));
        assert_eq!(dump(&mut con, b"t"), before);
    }
}

/// Whether the server's module clock is fixed per command (`RL_CLOCK` in `INFO rl`).
fn clock_is_cached(con: &mut Connection) -> bool {
    info::info(con, "rl").contains("RedisModule_CachedMicroseconds")
}

#[test]
fn replies_at_3_7_and_3_per_10_match_a_per_key_twin() {
    let server = Server::start();
    let mut con = server.conn();
    let cached = clock_is_cached(&mut con);
    // (rate, capacity, estimate, actual): over- and under-estimates, fractions of a token,
    // rates whose 1e9 / rate is not whole.
    let rows = [
        ("3", "3", "2", "1"),
        ("3", "3", "1", "2.5"),
        ("7", "7", "5", "0.25"),
        ("7", "7", "3", "9"),
        ("3/10", "3", "2.5", "0"),
        ("3/10", "3", "1", "4"),
    ];
    for (i, (rate, cap, estimate, actual)) in rows.into_iter().enumerate() {
        let (field, key, id) = (format!("f{i}"), format!("k{i}"), format!("id{i}"));
        let (table, per_key): (Reserved, Reserved) = redis::pipe()
            .atomic()
            .cmd("RL.HRESERVE")
            .arg(&["t", &field, rate, cap, estimate, HOUR_MS, "ID", &id])
            .cmd("RL.RESERVE")
            .arg(&[&key, rate, cap, estimate, HOUR_MS, "ID", &id])
            .query(&mut con)
            .unwrap();
        // A first call starts full whatever the clock: exact.
        assert_eq!(table, per_key, "reserve row {i}");
        assert_eq!(table.0, 1);
        let (table, per_key): (Vec<i64>, Vec<i64>) = redis::pipe()
            .atomic()
            .cmd("RL.HSETTLE")
            .arg(&["t", &field, rate, cap, &id, actual])
            .cmd("RL.SETTLE")
            .arg(&[&key, rate, cap, &id, actual])
            .query(&mut con)
            .unwrap();
        if cached {
            assert_eq!(table, per_key, "settle row {i}");
        } else {
            assert_eq!(
                table[0], per_key[0],
                "settle row {i}: {table:?} {per_key:?}"
            );
            for j in 1..3 {
                assert!(
                    (table[j] - per_key[j]).abs() <= 1,
                    "settle row {i}: {table:?} {per_key:?}"
                );
            }
        }
    }
}

#[test]
fn a_denied_reserve_writes_nothing_and_a_retried_one_takes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let (ok, id, remaining, retry) = hreserve(&mut con, &["t", "f", RATE, CAP, "8", HOUR_MS]);
    assert_eq!((ok, id.len(), remaining, retry), (1, 16, 2, 0));
    assert!(id.iter().all(|b| b.is_ascii_hexdigit()), "{id:?}");
    let before = dump(&mut con, b"t");
    let (ok, id2, remaining, retry) = hreserve(&mut con, &["t", "f", RATE, CAP, "3", HOUR_MS]);
    assert_eq!((ok, id2, remaining), (0, Vec::new(), 2));
    assert!((999_000..=1_000_000).contains(&retry), "{retry}");
    assert_eq!(
        hreserve(&mut con, &["t", "f", RATE, CAP, "11", HOUR_MS]).3,
        -1
    );
    // A denial on a missing field creates nothing.
    assert_eq!(
        hreserve(&mut con, &["t", "g", RATE, CAP, "11", HOUR_MS]).0,
        0
    );
    assert_eq!(dump(&mut con, b"t"), before, "denials write nothing");
    let id = String::from_utf8(id).unwrap();
    let again = hreserve(&mut con, &["t", "f", RATE, CAP, "8", HOUR_MS, "ID", &id]);
    assert_eq!((again.0, again.1, again.2), (1, id.as_bytes().to_vec(), 2));
    assert_eq!(dump(&mut con, b"t"), before, "a retry writes nothing");
    // The same id on another field is another reservation.
    assert_eq!(
        hreserve(&mut con, &["t", "g", RATE, CAP, "1", HOUR_MS, "ID", &id]).2,
        9
    );
    assert_eq!(hsettle(&mut con, "t", "f", &id, "8")[0], 2);
    assert_eq!(hsettle(&mut con, "t", "g", &id, "0")[0], 10);
}

#[test]
fn concurrent_settles_of_one_id_apply_exactly_once() {
    let server = Server::start();
    let mut con = server.conn();
    hreserve(&mut con, &["t", "f", RATE, CAP, "5", HOUR_MS, "ID", "once"]);
    let results = race(
        &server,
        32,
        &command("RL.HSETTLE", &["t", "f", RATE, CAP, "once", "1"]),
    );
    let applied = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(applied, 1, "{results:?}");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(common::error_reply_text(refused), not_open("once"));
    }
    assert_eq!(balance(&mut con, "t", "f"), 9);
}

#[test]
fn an_unsettled_reservation_lapses_and_its_tokens_stay_taken() {
    let server = Server::start();
    let mut con = server.conn();
    hreserve(&mut con, &["t", "f", RATE, CAP, "4", "50", "ID", "late"]);
    hreserve(&mut con, &["t", "f", RATE, CAP, "1", HOUR_MS, "ID", "kept"]);
    sleep(Duration::from_millis(80));
    let text = error_text(
        &mut con,
        &command("RL.HSETTLE", &["t", "f", RATE, CAP, "late", "0"]),
    );
    assert_eq!(text, not_open("late"));
    assert_eq!(
        balance(&mut con, "t", "f"),
        5,
        "the lapsed estimate stays taken"
    );
    assert_eq!(hsettle(&mut con, "t", "f", "kept", "0")[0], 6);
    assert_eq!(
        hreserve(&mut con, &["t", "f", RATE, CAP, "1", HOUR_MS, "ID", "late"]).2,
        5
    );
}

#[test]
fn a_full_field_with_an_open_record_is_not_swept_before_it_lapses() {
    let server = Server::start();
    let mut con = server.conn();
    // 1000/s: the 2 taken come back within 2 ms, so the field is full long before the
    // record lapses (60 s) and the sweep (each write's, and the background one) would
    // remove a full field without records.
    hreserve(&mut con, &["t", "f", "1000", "10", "2", "60000", "ID", "r"]);
    ints(&mut con, "RL.HACQUIRE", &["t", "plain", "1000", "10", "2"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    // Writes to other fields sweep as they go; the background sweep runs too.
    while hlen(&mut con, "t") > 1 {
        assert!(Instant::now() < deadline, "the plain field was never swept");
        ints(
            &mut con,
            "RL.HACQUIRE",
            &["t", "other", "1000", "10", "0.001"],
        );
        let _: i64 = command("RL.HDEL", &["t", "other"]).query(&mut con).unwrap();
        sleep(Duration::from_millis(20));
    }
    // The reserved field is still there, full, and its record settles: an under-estimate of
    // 7 is charged in full (no refill lost to a removal).
    assert_eq!(hlen(&mut con, "t"), 1);
    let got: Vec<i64> = command("RL.HSETTLE", &["t", "f", "1000", "10", "r", "9"])
        .query(&mut con)
        .unwrap();
    assert_eq!(got[0], 3, "{got:?}");
    // A refund to full with another record open keeps the field (full, as of now).
    hreserve(
        &mut con,
        &["t", "g", "0.001", "10", "1", "60000", "ID", "a"],
    );
    hreserve(
        &mut con,
        &["t", "g", "0.001", "10", "1", "60000", "ID", "b"],
    );
    let got: Vec<i64> = command("RL.HSETTLE", &["t", "g", "0.001", "10", "a", "0"])
        .query(&mut con)
        .unwrap();
    assert_eq!(got[0], 9);
    ints(&mut con, "RL.HREFUND", &["t", "g", "0.001", "10", "5"]);
    assert_eq!(balance(&mut con, "t", "g"), 10);
    let got: Vec<i64> = command("RL.HSETTLE", &["t", "g", "0.001", "10", "b", "3"])
        .query(&mut con)
        .unwrap();
    assert_eq!(got[0], 8, "the held field charged the under-estimate");
    // RL.HDEL resets a field, its records with it.
    hreserve(
        &mut con,
        &["t", "h", "0.001", "10", "1", "60000", "ID", "c"],
    );
    let _: i64 = command("RL.HDEL", &["t", "h"]).query(&mut con).unwrap();
    let text = error_text(
        &mut con,
        &command("RL.HSETTLE", &["t", "h", "0.001", "10", "c", "0"]),
    );
    assert_eq!(text, not_open("c"));
}

#[test]
fn other_types_get_wrongtype_and_keep_their_value() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut con).unwrap();
    ints(&mut con, "RL.ACQUIRE", &["bucket", RATE, CAP, "1"]);
    let tag = "0123456789abcdef";
    for key in ["s", "bucket"] {
        for cmd in [
            command("RL.HRESERVE", &[key, "f", RATE, CAP, "1", HOUR_MS]),
            command("RL.HSETTLE", &[key, "f", RATE, CAP, "a", "1"]),
            command("RL.HRESVSTATE", &[key, tag, "1", "0"]),
        ] {
            assert_eq!(error_text(&mut con, &cmd), WRONGTYPE, "{key}");
        }
    }
    let value: String = redis::cmd("GET").arg("s").query(&mut con).unwrap();
    assert_eq!(value, "v");
    // A table with records is still a table, and the per-key commands refuse it.
    hreserve(&mut con, &["t", "f", RATE, CAP, "1", HOUR_MS, "ID", "a"]);
    let kind: String = redis::cmd("TYPE").arg("t").query(&mut con).unwrap();
    assert_eq!(kind, "rl-htable");
    assert_eq!(
        error_text(&mut con, &command("RL.SETTLE", &["t", RATE, CAP, "a", "1"])),
        WRONGTYPE
    );
}

#[test]
fn every_bad_argument_gets_its_exact_error_and_writes_nothing() {
    const OPT: &str = "ERR unknown option: RL.HRESERVE takes only ID id after ttl_ms";
    const TAG: &str = "ERR tag must be 16 bytes (a field's tag, as RL.HSETSTATE replicates it)";
    let reserve_rows: Vec<(Vec<&[u8]>, String)> = vec![
        (vec![b"k", b"f", b"1", b"10", b"1"], arity("RL.HRESERVE")),
        (vec![b"k", b"f", b"0", b"10", b"1", b"5"], RATE_TEXT.into()),
        (vec![b"k", b"f", b"1", b"0", b"1", b"5"], CAPACITY.into()),
        (vec![b"k", b"f", b"1", b"10", b"0", b"5"], ESTIMATE.into()),
        (vec![b"k", b"f", b"1", b"10", b"-1", b"5"], ESTIMATE.into()),
        (vec![b"k", b"f", b"1", b"10", b"x", b"5"], ESTIMATE.into()),
        (vec![b"k", b"f", b"1", b"10", b"1", b"0"], TTL.into()),
        (
            vec![b"k", b"f", b"1", b"10", b"1", b"3153600000001"],
            TTL.into(),
        ),
        (
            vec![b"k", b"f", b"1", b"10", b"1", b"5", b"NAME", b"a"],
            OPT.into(),
        ),
        (
            vec![b"k", b"f", b"1", b"10", b"1", b"5", b"ID"],
            ID_MISSING.into(),
        ),
        (
            vec![b"k", b"f", b"1", b"10", b"1", b"5", b"ID", b""],
            ID.into(),
        ),
        (
            vec![
                b"k",
                b"f",
                b"1",
                b"10",
                b"1",
                b"5",
                b"ID",
                b"12345678901234567",
            ],
            ID.into(),
        ),
        (
            vec![b"k", b"f", b"1", b"10", b"1", b"5", b"ID", b"a", b"x"],
            arity("RL.HRESERVE"),
        ),
    ];
    let settle_rows: Vec<(Vec<&[u8]>, String)> = vec![
        (vec![b"k", b"f", b"1", b"10", b"a"], arity("RL.HSETTLE")),
        (vec![b"k", b"f", b"1", b"10", b"a", b"-1"], ACTUAL.into()),
        (vec![b"k", b"f", b"1", b"10", b"a", b"inf"], ACTUAL.into()),
        (vec![b"k", b"f", b"0", b"10", b"a", b"1"], RATE_TEXT.into()),
        (vec![b"k", b"f", b"1", b"10", b"", b"1"], ID.into()),
        (
            vec![b"k", b"f", b"1", b"10", b"a\r\nb", b"1"],
            not_open("a\\x0d\\x0ab"),
        ),
        (vec![b"k", b"f", b"1", b"10", b"a", b"1"], not_open("a")),
    ];
    let tag: &[u8] = b"0123456789abcdef";
    let state_rows: Vec<(Vec<&[u8]>, String)> = vec![
        (vec![b"k", tag, b"1"], arity("RL.HRESVSTATE")),
        (vec![b"k", b"short", b"1", b"0"], TAG.into()),
        (vec![b"k", tag, b"0", b"0"], FULL_AT.into()),
        (
            vec![b"k", tag, b"1", b"0", b"a", b"1"],
            arity("RL.HRESVSTATE"),
        ),
        (
            vec![b"k", tag, b"1", b"0", b"a", b"0", b"5"],
            ESTIMATE.into(),
        ),
        (
            vec![b"k", tag, b"1", b"0", b"a", b"1", b"0"],
            RESERVATION_EXPIRES_AT.into(),
        ),
        (
            vec![b"k", tag, b"1", b"0", b"a", b"1", b"5", b"a", b"2", b"6"],
            RESERVATIONS.into(),
        ),
    ];
    assert_rejected_on_empty_server("RL.HRESERVE", &reserve_rows);
    assert_rejected_on_empty_server("RL.HSETTLE", &settle_rows);
    assert_rejected_on_empty_server("RL.HRESVSTATE", &state_rows);
}

#[test]
fn a_field_holds_at_most_1000_open_reservations() {
    let server = Server::start();
    let mut con = server.conn();
    let mut pipe = redis::pipe();
    for i in 0..1000 {
        pipe.cmd("RL.HRESERVE").arg(&[
            "t",
            "f",
            "1000",
            "1e6",
            "1",
            HOUR_MS,
            "ID",
            &format!("i{i}"),
        ]);
    }
    let replies: Vec<Reserved> = pipe.query(&mut con).unwrap();
    assert!(replies.iter().all(|r| r.0 == 1));
    let before = dump(&mut con, b"t");
    let text = error_text(
        &mut con,
        &command("RL.HRESERVE", &["t", "f", "1000", "1e6", "1", HOUR_MS]),
    );
    assert_eq!(text, RESERVATIONS);
    assert_eq!(dump(&mut con, b"t"), before);
    // Another field of the same table has its own 1000.
    assert_eq!(
        hreserve(&mut con, &["t", "g", "1000", "1e6", "1", HOUR_MS]).0,
        1
    );
    assert_eq!(
        hreserve(
            &mut con,
            &["t", "f", "1000", "1e6", "1", HOUR_MS, "ID", "i7"]
        )
        .0,
        1
    );
    let _: Vec<i64> = command("RL.HSETTLE", &["t", "f", "1000", "1e6", "i7", "1"])
        .query(&mut con)
        .unwrap();
    assert_eq!(
        hreserve(
            &mut con,
            &["t", "f", "1000", "1e6", "1", HOUR_MS, "ID", "new"]
        )
        .0,
        1
    );
}

#[test]
fn records_cost_nothing_to_fields_without_them() {
    let server = Server::start();
    let mut con = server.conn();
    let usage = |con: &mut Connection| -> i64 {
        redis::cmd("MEMORY")
            .arg(&["USAGE", "t"])
            .query(con)
            .unwrap()
    };
    let mut pipe = redis::pipe();
    for i in 0..2000 {
        pipe.cmd("RL.HACQUIRE")
            .arg(&["t", &format!("f{i}"), RATE, CAP, "1"]);
    }
    let _: Vec<Value> = pipe.query(&mut con).unwrap();
    let plain = usage(&mut con);
    // One field with a record: the rest of the table is unchanged, and settling the record
    // gives its memory back.
    hreserve(&mut con, &["t", "f0", RATE, CAP, "1", HOUR_MS, "ID", "r"]);
    let with_record = usage(&mut con);
    assert!(
        with_record > plain && with_record - plain < 512,
        "{plain} -> {with_record}"
    );
    hsettle(&mut con, "t", "f0", "r", "1");
    assert_eq!(usage(&mut con), plain);
}

/// Reservations open, settled, lapsed and under plain writes in a few fields of two tables.
fn populate(con: &mut Connection) {
    hreserve(con, &["t", "open", RATE, CAP, "3", HOUR_MS, "ID", "a"]);
    hreserve(con, &["t", "open", RATE, CAP, "0.25", HOUR_MS]);
    hreserve(con, &["t", "frac", "3", "3", "1", HOUR_MS, "ID", "b"]);
    ints(con, "RL.HACQUIRE", &["t", "open", RATE, CAP, "1"]);
    ints(con, "RL.HACQUIRE", &["t", "plain", RATE, CAP, "1"]);
    hreserve(con, &["t", "settled", RATE, CAP, "4", HOUR_MS, "ID", "x"]);
    hsettle(con, "t", "settled", "x", "6");
    hreserve(con, &["t", "lapsed", RATE, CAP, "2", "1", "ID", "short"]);
    sleep(Duration::from_millis(5));
    hreserve(con, &["t", "lapsed", RATE, CAP, "1", HOUR_MS, "ID", "long"]);
    hreserve(
        con,
        &[
            "\u{0}bin",
            "\u{1}f",
            RATE,
            CAP,
            "1",
            HOUR_MS,
            "ID",
            "\u{1}\u{ff}",
        ],
    );
}

fn digest(con: &mut Connection, key: &str) -> String {
    redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query::<Vec<String>>(con)
        .unwrap()
        .remove(0)
}

#[test]
fn replica_aof_replay_rewrite_and_rdb_restart_hold_identical_tables() {
    let mut server = Server::start_with(&PLAIN_AOF_ALWAYS);
    let replica = server.start_replica();
    let mut con = server.conn();
    populate(&mut con);
    wait_for_replica(&mut con);
    let want = snapshot(&mut con);
    let want_digest = digest(&mut con, "t");
    assert_eq!(want.len(), 2, "{want:?}");
    assert_eq!(snapshot(&mut replica.conn()), want, "replica");
    assert_eq!(digest(&mut replica.conn(), "t"), want_digest);
    let mut con = assert_restarts_keep(&mut server, &want);
    assert_eq!(digest(&mut con, "t"), want_digest);
    // The records survived: each open one settles once, on a copy as on the original.
    let _: i64 = redis::cmd("COPY")
        .arg("t")
        .arg("copy")
        .query(&mut con)
        .unwrap();
    assert_eq!(dump(&mut con, b"copy"), dump(&mut con, b"t"));
    hsettle(&mut con, "copy", "lapsed", "long", "0");
    assert_eq!(
        hsettle(&mut con, "t", "lapsed", "long", "0")[0],
        8,
        "the original keeps its record"
    );
    assert_eq!(
        hsettle(&mut con, "t", "open", "a", "3")[0],
        balance(&mut con, "t", "open")
    );
}
