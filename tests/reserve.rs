//! Reservations against real servers: RL.RESERVE, RL.SETTLE and the internal RL.RESVSTATE.
//! A reservation and its settle leave the bucket exactly as RL.ACQUIRE of the estimate then
//! RL.REFUND or RL.CHARGE of the difference leave a twin; a settle applies once whatever the
//! retries (concurrent settles of one id: exactly one applies); an unsettled reservation
//! lapses and its tokens stay taken; replica, AOF replay, AOF rewrite and RDB restart hold
//! identical values (`DUMP` and `PEXPIRETIME`); WRONGTYPE; every bad argument's exact error,
//! writing nothing; writes held under `CLIENT PAUSE WRITE`.
//!
//! Time: the rate is 1 token per 1000 s, so refill never moves a whole token during a test
//! and balances are exact; the one test about expiry waits past a ttl of its own and asserts
//! no duration.

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
    arity, assert_rejected_on_empty_server, assert_restarts_keep, dump, error_text, ints, race,
    snapshot, text_command as command, wait_for_replica, Server,
};
use redis::Connection;

/// One token per 1000 s: no whole token refills during a test.
const RATE: &str = "0.001";
const CAP: &str = "10";
const HOUR_MS: &str = "3600000";

/// `RL.RESERVE`'s reply: allowed, id, remaining, retry_after_ms.
type Reserved = (i64, Vec<u8>, i64, i64);

fn reserve(con: &mut Connection, args: &[&str]) -> Reserved {
    redis::cmd("RL.RESERVE")
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("RL.RESERVE {args:?}: {e}"))
}

fn settle(con: &mut Connection, key: &str, id: &str, actual: &str) -> [i64; 3] {
    let reply: Vec<i64> = redis::cmd("RL.SETTLE")
        .arg(&[key, RATE, CAP, id, actual])
        .query(con)
        .unwrap_or_else(|e| panic!("RL.SETTLE {key} {id} {actual}: {e}"));
    reply.try_into().expect("RL.SETTLE replies with 3 integers")
}

/// The signed balance of `key` (RL.PEEK's second integer).
fn balance(con: &mut Connection, key: &str) -> i64 {
    ints(con, "RL.PEEK", &[key, RATE, CAP, "0"])[1]
}

fn not_open(id: &str) -> String {
    format!("ERR id {id} is not an open reservation of this key (settled, expired or never made)")
}

#[test]
fn reserve_and_settle_match_acquire_refund_and_charge_on_a_twin() {
    let server = Server::start();
    let mut con = server.conn();
    // (estimate, actual) in order; the twin takes the estimate with RL.ACQUIRE and then
    // gives back or charges the difference.
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
        let got = reserve(&mut con, &["k", RATE, CAP, estimate, HOUR_MS, "ID", &id]);
        let want = ints(&mut con, "RL.ACQUIRE", &["twin", RATE, CAP, estimate]);
        assert_eq!((got.0, got.2), (want[0], want[1]), "reserve {estimate}");
        assert_eq!(
            got.1,
            if got.0 == 1 {
                id.as_bytes().to_vec()
            } else {
                Vec::new()
            }
        );
        ids.push((id, got.0 == 1));
    }
    for ((id, taken), (estimate, actual)) in ids.iter().zip(steps) {
        if !taken {
            let text = error_text(
                &mut con,
                &command("RL.SETTLE", &["k", RATE, CAP, id, actual]),
            );
            assert_eq!(text, not_open(id));
            continue;
        }
        let got = settle(&mut con, "k", id, actual);
        let (e, a): (f64, f64) = (estimate.parse().unwrap(), actual.parse().unwrap());
        if a > e {
            let diff = format!("{}", a - e);
            ints(&mut con, "RL.CHARGE", &["twin", RATE, CAP, &diff]);
        } else if e > a {
            let diff = format!("{}", e - a);
            ints(&mut con, "RL.REFUND", &["twin", RATE, CAP, &diff]);
        }
        assert_eq!(
            got[0],
            balance(&mut con, "twin"),
            "settle {id}: {estimate} then {actual}"
        );
        assert_eq!(balance(&mut con, "k"), balance(&mut con, "twin"));
        // Settled once: a retry is refused and changes nothing.
        let before = dump(&mut con, b"k");
        let text = error_text(
            &mut con,
            &command("RL.SETTLE", &["k", RATE, CAP, id, actual]),
        );
        assert_eq!(text, not_open(id));
        assert_eq!(dump(&mut con, b"k"), before);
    }
}

#[test]
fn a_denied_reserve_writes_nothing_and_a_retried_one_takes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let (ok, id, remaining, retry) = reserve(&mut con, &["k", RATE, CAP, "8", HOUR_MS]);
    assert_eq!((ok, id.len(), remaining, retry), (1, 16, 2, 0));
    assert!(id.iter().all(|b| b.is_ascii_hexdigit()), "{id:?}");
    let before = dump(&mut con, b"k");
    let (ok, id2, remaining, retry) = reserve(&mut con, &["k", RATE, CAP, "3", HOUR_MS]);
    assert_eq!((ok, id2, remaining), (0, Vec::new(), 2));
    // One token short at 1 per 1000 s: within a second of 1000 s.
    assert!((999_000..=1_000_000).contains(&retry), "{retry}");
    // More than the capacity can never succeed, as RL.ACQUIRE says: -1.
    assert_eq!(reserve(&mut con, &["k", RATE, CAP, "11", HOUR_MS]).3, -1);
    assert_eq!(dump(&mut con, b"k"), before, "denials write nothing");
    // A retry with the made id is answered as the original and takes nothing.
    let id = String::from_utf8(id).unwrap();
    let again = reserve(&mut con, &["k", RATE, CAP, "8", HOUR_MS, "ID", &id]);
    assert_eq!((again.0, again.1, again.2), (1, id.as_bytes().to_vec(), 2));
    assert_eq!(dump(&mut con, b"k"), before, "a retry writes nothing");
    assert_eq!(settle(&mut con, "k", &id, "8")[0], 2);
}

#[test]
fn concurrent_settles_of_one_id_apply_exactly_once() {
    let server = Server::start();
    let mut con = server.conn();
    reserve(&mut con, &["k", RATE, CAP, "5", HOUR_MS, "ID", "once"]);
    let results = race(
        &server,
        32,
        &command("RL.SETTLE", &["k", RATE, CAP, "once", "1"]),
    );
    let applied = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(applied, 1, "{results:?}");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(common::error_reply_text(refused), not_open("once"));
    }
    // 5 taken, 4 given back once: 9.
    assert_eq!(balance(&mut con, "k"), 9);
}

#[test]
fn an_unsettled_reservation_lapses_and_its_tokens_stay_taken() {
    let server = Server::start();
    let mut con = server.conn();
    reserve(&mut con, &["k", RATE, CAP, "4", "50", "ID", "late"]);
    reserve(&mut con, &["k", RATE, CAP, "1", HOUR_MS, "ID", "kept"]);
    sleep(Duration::from_millis(80));
    let text = error_text(
        &mut con,
        &command("RL.SETTLE", &["k", RATE, CAP, "late", "0"]),
    );
    assert_eq!(text, not_open("late"));
    assert_eq!(balance(&mut con, "k"), 5, "the lapsed estimate stays taken");
    // The other one still settles; the lapsed record is dropped by that write.
    assert_eq!(settle(&mut con, "k", "kept", "0")[0], 6);
    // A lapsed id can be reserved again: a new reservation.
    assert_eq!(
        reserve(&mut con, &["k", RATE, CAP, "1", HOUR_MS, "ID", "late"]).2,
        5
    );
}

#[test]
fn other_types_get_wrongtype_and_keep_their_value() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut con).unwrap();
    for cmd in [
        command("RL.RESERVE", &["s", RATE, CAP, "1", HOUR_MS]),
        command("RL.SETTLE", &["s", RATE, CAP, "a", "1"]),
        command("RL.RESVSTATE", &["s", "1", "0"]),
    ] {
        assert_eq!(error_text(&mut con, &cmd), WRONGTYPE);
    }
    let value: String = redis::cmd("GET").arg("s").query(&mut con).unwrap();
    assert_eq!(value, "v");
    // A bucket that has held reservations is of its own type, and stays so once none is
    // open (the last settle changes the value in place); WRONGTYPE to the lease commands.
    reserve(&mut con, &["k", RATE, CAP, "1", HOUR_MS, "ID", "a"]);
    let kind: String = redis::cmd("TYPE").arg("k").query(&mut con).unwrap();
    assert_eq!(kind, "rl-bkresv");
    assert_eq!(balance(&mut con, "k"), 9);
    assert_eq!(
        error_text(&mut con, &command("RL.LEASES", &["k", "1"])),
        WRONGTYPE
    );
    reserve(&mut con, &["k", RATE, CAP, "2", HOUR_MS, "ID", "b"]);
    settle(&mut con, "k", "a", "1");
    settle(&mut con, "k", "b", "3");
    let kind: String = redis::cmd("TYPE").arg("k").query(&mut con).unwrap();
    assert_eq!(kind, "rl-bkresv");
    assert_eq!(balance(&mut con, "k"), 6);
    assert_eq!(
        error_text(&mut con, &command("RL.LEASES", &["k", "1"])),
        WRONGTYPE
    );
}

#[test]
fn a_bucket_settled_to_no_reservation_works_and_goes_as_any_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    let kind = |con: &mut Connection, key: &str| -> String {
        redis::cmd("TYPE").arg(key).query(con).unwrap()
    };
    let expire_at_ms = |con: &mut Connection, key: &str| -> i64 {
        redis::cmd("PEXPIRETIME").arg(key).query(con).unwrap()
    };
    reserve(&mut con, &["k", RATE, CAP, "4", HOUR_MS, "ID", "a"]);
    assert_eq!(settle(&mut con, "k", "a", "1")[0], 9);
    assert_eq!(kind(&mut con, "k"), "rl-bkresv");
    let settled_at_ms = expire_at_ms(&mut con, "k");
    assert!(
        settled_at_ms > 0,
        "the key keeps an expiry: {settled_at_ms}"
    );
    // Every bucket command works on it, and writes its expiry as on any bucket.
    assert_eq!(ints(&mut con, "RL.ACQUIRE", &["k", RATE, CAP, "2"])[0], 1);
    assert_eq!(balance(&mut con, "k"), 7);
    assert!(expire_at_ms(&mut con, "k") > settled_at_ms);
    ints(&mut con, "RL.CHARGE", &["k", RATE, CAP, "1"]);
    assert_eq!(balance(&mut con, "k"), 6);
    assert_eq!(
        error_text(&mut con, &command("RL.SETTLE", &["k", RATE, CAP, "a", "1"])),
        not_open("a")
    );
    // A new reservation on it, settled again: still the same bucket, in place.
    reserve(&mut con, &["k", RATE, CAP, "1", HOUR_MS, "ID", "b"]);
    assert_eq!(settle(&mut con, "k", "b", "0")[0], 6);
    // A refund that fills it deletes the key, as for any bucket; the next take makes a
    // plain bucket.
    ints(&mut con, "RL.REFUND", &["k", RATE, CAP, "10"]);
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
    assert_eq!(exists, 0);
    ints(&mut con, "RL.ACQUIRE", &["k", RATE, CAP, "1"]);
    assert_eq!(kind(&mut con, "k"), "rl-bucket");
    // At a fast rate it is full within a millisecond of the settle, and expires then.
    reserve(&mut con, &["fast", "1000", "10", "1", HOUR_MS, "ID", "c"]);
    settle_at(&mut con, "fast", "1000", "c", "1");
    assert_eq!(kind(&mut con, "fast"), "rl-bkresv");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let exists: i64 = redis::cmd("EXISTS").arg("fast").query(&mut con).unwrap();
        if exists == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the settled bucket never expired"
        );
        sleep(Duration::from_millis(5));
    }
}

/// `RL.SETTLE` at another rate than [`RATE`].
fn settle_at(con: &mut Connection, key: &str, rate: &str, id: &str, actual: &str) -> Vec<i64> {
    ints(con, "RL.SETTLE", &[key, rate, CAP, id, actual])
}

#[test]
fn every_bad_argument_gets_its_exact_error_and_writes_nothing() {
    const OPT: &str = "ERR unknown option: RL.RESERVE takes only ID id after ttl_ms";
    let reserve_rows: Vec<(Vec<&[u8]>, String)> = vec![
        (vec![b"k", b"1", b"10", b"1"], arity("RL.RESERVE")),
        (vec![b"k", b"0", b"10", b"1", b"5"], RATE_TEXT.into()),
        (vec![b"k", b"1", b"0", b"1", b"5"], CAPACITY.into()),
        (vec![b"k", b"1", b"10", b"0", b"5"], ESTIMATE.into()),
        (vec![b"k", b"1", b"10", b"-1", b"5"], ESTIMATE.into()),
        (vec![b"k", b"1", b"10", b"x", b"5"], ESTIMATE.into()),
        (vec![b"k", b"1", b"10", b"1", b"0"], TTL.into()),
        (vec![b"k", b"1", b"10", b"1", b"3153600000001"], TTL.into()),
        (
            vec![b"k", b"1", b"10", b"1", b"5", b"NAME", b"a"],
            OPT.into(),
        ),
        (
            vec![b"k", b"1", b"10", b"1", b"5", b"ID"],
            ID_MISSING.into(),
        ),
        (vec![b"k", b"1", b"10", b"1", b"5", b"ID", b""], ID.into()),
        (
            vec![b"k", b"1", b"10", b"1", b"5", b"ID", b"12345678901234567"],
            ID.into(),
        ),
        (
            vec![b"k", b"1", b"10", b"1", b"5", b"ID", b"a", b"x"],
            arity("RL.RESERVE"),
        ),
    ];
    let settle_rows: Vec<(Vec<&[u8]>, String)> = vec![
        (vec![b"k", b"1", b"10", b"a"], arity("RL.SETTLE")),
        (vec![b"k", b"1", b"10", b"a", b"-1"], ACTUAL.into()),
        (vec![b"k", b"1", b"10", b"a", b"inf"], ACTUAL.into()),
        (vec![b"k", b"1", b"10", b"", b"1"], ID.into()),
        (
            vec![b"k", b"1", b"10", b"a\r\nb", b"1"],
            not_open("a\\x0d\\x0ab"),
        ),
        (vec![b"k", b"1", b"10", b"a", b"1"], not_open("a")),
    ];
    let state_rows: Vec<(Vec<&[u8]>, String)> = vec![
        (vec![b"k", b"1"], arity("RL.RESVSTATE")),
        (vec![b"k", b"0", b"0"], FULL_AT.into()),
        (vec![b"k", b"1", b"0", b"a", b"1"], arity("RL.RESVSTATE")),
        (vec![b"k", b"1", b"0", b"a", b"0", b"5"], ESTIMATE.into()),
        (
            vec![b"k", b"1", b"0", b"a", b"1", b"0"],
            RESERVATION_EXPIRES_AT.into(),
        ),
        (
            vec![b"k", b"1", b"0", b"a", b"1", b"5", b"a", b"2", b"6"],
            RESERVATIONS.into(),
        ),
    ];
    assert_rejected_on_empty_server("RL.RESERVE", &reserve_rows);
    assert_rejected_on_empty_server("RL.SETTLE", &settle_rows);
    assert_rejected_on_empty_server("RL.RESVSTATE", &state_rows);
}

#[test]
fn a_key_holds_at_most_1000_open_reservations() {
    let server = Server::start();
    let mut con = server.conn();
    let mut pipe = redis::pipe();
    for i in 0..1000 {
        pipe.cmd("RL.RESERVE")
            .arg(&["k", "1000", "1e6", "1", HOUR_MS, "ID", &format!("i{i}")]);
    }
    let replies: Vec<Reserved> = pipe.query(&mut con).unwrap();
    assert!(replies.iter().all(|r| r.0 == 1));
    let before = dump(&mut con, b"k");
    let text = error_text(
        &mut con,
        &command("RL.RESERVE", &["k", "1000", "1e6", "1", HOUR_MS]),
    );
    assert_eq!(text, RESERVATIONS);
    assert_eq!(dump(&mut con, b"k"), before);
    // A retry of an open one is still answered; a settle makes room.
    assert_eq!(
        reserve(&mut con, &["k", "1000", "1e6", "1", HOUR_MS, "ID", "i7"]).0,
        1
    );
    let _: Vec<i64> = command("RL.SETTLE", &["k", "1000", "1e6", "i7", "1"])
        .query(&mut con)
        .unwrap();
    assert_eq!(
        reserve(&mut con, &["k", "1000", "1e6", "1", HOUR_MS, "ID", "new"]).0,
        1
    );
}

/// Reservations open, settled, lapsed and taken over by plain writes on a few keys.
fn populate(con: &mut Connection) {
    reserve(con, &["open", RATE, CAP, "3", HOUR_MS, "ID", "a"]);
    reserve(con, &["open", RATE, CAP, "0.25", HOUR_MS]);
    reserve(con, &["open", "3", "3", "1", HOUR_MS, "ID", "b"]);
    ints(con, "RL.ACQUIRE", &["open", RATE, CAP, "1"]);
    reserve(con, &["settled", RATE, CAP, "4", HOUR_MS, "ID", "x"]);
    settle(con, "settled", "x", "6");
    // None open: still of the reservation type, written in place by a plain take.
    ints(con, "RL.ACQUIRE", &["settled", RATE, CAP, "1"]);
    reserve(con, &["lapsed", RATE, CAP, "2", "1", "ID", "short"]);
    sleep(Duration::from_millis(5));
    reserve(con, &["lapsed", RATE, CAP, "1", HOUR_MS, "ID", "long"]);
    reserve(
        con,
        &["\u{0}bin", RATE, CAP, "1", HOUR_MS, "ID", "\u{1}\u{ff}"],
    );
}

#[test]
fn replica_aof_replay_rewrite_and_rdb_restart_hold_identical_values() {
    let mut server = Server::start_with(&PLAIN_AOF_ALWAYS);
    let replica = server.start_replica();
    let mut con = server.conn();
    populate(&mut con);
    wait_for_replica(&mut con);
    let want = snapshot(&mut con);
    assert_eq!(want.len(), 4, "{want:?}");
    assert!(want
        .iter()
        .all(|(_, payload, expire)| payload.is_some() && *expire > 0));
    assert_eq!(snapshot(&mut replica.conn()), want, "replica");
    let mut con = assert_restarts_keep(&mut server, &want);
    // The records survived: each open one settles once.
    assert_eq!(
        settle(&mut con, "open", "a", "3")[0],
        balance(&mut con, "open")
    );
    let _: i64 = redis::cmd("COPY")
        .arg("lapsed")
        .arg("copy")
        .query(&mut con)
        .unwrap();
    assert_eq!(dump(&mut con, b"copy"), dump(&mut con, b"lapsed"));
    let _: i64 = redis::cmd("COPY")
        .arg("settled")
        .arg("settled-copy")
        .query(&mut con)
        .unwrap();
    assert_eq!(dump(&mut con, b"settled-copy"), dump(&mut con, b"settled"));
    settle(&mut con, "copy", "long", "0");
    // 2 lapsed and stay taken, 1 comes back: 8.
    assert_eq!(
        settle(&mut con, "lapsed", "long", "0")[0],
        8,
        "the original keeps its record"
    );
}

#[test]
fn writes_wait_under_client_pause_write() {
    let server = Server::start();
    let mut admin = server.conn();
    reserve(&mut admin, &["k", RATE, CAP, "2", HOUR_MS, "ID", "a"]);
    let _: String = redis::cmd("CLIENT")
        .arg(&["PAUSE", "10000", "WRITE"])
        .query(&mut admin)
        .unwrap();
    let writers = {
        let (mut one, mut two) = (server.conn(), server.conn());
        (
            std::thread::spawn(move || {
                reserve(&mut one, &["k", RATE, CAP, "3", HOUR_MS, "ID", "b"])
            }),
            std::thread::spawn(move || settle(&mut two, "k", "a", "1")),
        )
    };
    let mut reader = server.conn();
    let before = dump(&mut reader, b"k");
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        assert_eq!(balance(&mut reader, "k"), 8);
        sleep(Duration::from_millis(20));
    }
    assert!(
        !writers.0.is_finished() && !writers.1.is_finished(),
        "ran during the pause"
    );
    assert_eq!(dump(&mut reader, b"k"), before);
    let _: String = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut admin)
        .unwrap();
    assert_eq!(writers.0.join().unwrap().0, 1);
    writers.1.join().unwrap();
    assert_eq!(balance(&mut reader, "k"), 6);
}
