//! Bad input against a real server, across commands: the bad-argument tables of RL.ACQUIRE
//! and RL.SETSTATE (tests/common/tables.rs; acquire.rs and setstate.rs run them on an empty
//! server) run again against an existing bucket, the edges of each range are accepted, and
//! every command answers `WRONGTYPE` on every foreign type.
//!
//! Every case asserts the exact reply text, that nothing was written (no key created, an
//! existing value byte-identical by `DUMP` with the same expiry), and that the server still
//! answers `PING`.
//!
//! Time: nothing here depends on it. Buckets use a rate of 0.001 tokens/s, so refill cannot
//! change their state during a test, and every comparison is of stored bytes.

#![cfg(test)]

mod common;

use common::rl::acquire;
use common::tables::{BAD_ACQUIRE, BAD_SETSTATE, RATE_OUT_OF_RANGE_BEFORE_BAD_CAPACITY};
use common::texts::{FULL_AT, FULL_AT_FRAC, RATE, WRONGTYPE};
use common::{
    command, dbsize, dump, error_text, exists, fresh, pexpiretime, show, snapshot, Server,
};
use redis::Connection;

#[test]
fn boundary_values_are_accepted() {
    // The edges of each range, so the tables in common::tables reject for the reason they claim.
    let server = Server::start();
    let mut con = server.conn();
    let good: &[&[&[u8]]] = &[
        &[b"a", b"0.000001", b"1"],   // slowest rate
        &[b"b", b"1000000000", b"1"], // fastest rate
        &[b"c", b"1000000", b"1e15"], // largest capacity (refilled within a century)
        &[b"h", b"1", b"3153600000"], // longest full refill: 100 years
        &[b"d", b"1", b"0.5", b"0"],  // fractional capacity, zero cost
        &[b"e", b"1", b"10", b"1"],   // key, rate, capacity, cost: the most arguments
    ];
    for args in good {
        let reply: [i64; 4] = command("RL.ACQUIRE", args)
            .query(&mut con)
            .expect("accepted");
        // Each key is new: the whole reply follows from the arguments.
        let text = |i: usize| args.get(i).map(|a| std::str::from_utf8(a).expect("ASCII"));
        let (head, (reset_low, reset_high)) =
            fresh::acquire(text(1).unwrap(), text(2).unwrap(), text(3));
        assert_eq!(reply[..3], head, "RL.ACQUIRE {}: {reply:?}", show(args));
        assert!(
            (reset_low..=reset_high).contains(&reply[3]),
            "RL.ACQUIRE {}: reset_after_ms {} not in {reset_low}..={reset_high}",
            show(args),
            reply[3]
        );
    }
    // One second more than a century of refill is refused, naming both halves.
    let err = error_text(
        &mut con,
        &command("RL.ACQUIRE", &[b"i", b"1", b"3153600001"]),
    );
    assert_eq!(
        err,
        "ERR capacity / rate must be at most 3153600000 (a full refill within 100 years)"
    );
    assert!(!exists(&mut con, b"i"));
    // A cost above capacity is a denial that can never succeed, not an argument error.
    let reply: Vec<i64> = command("RL.ACQUIRE", &[b"f", b"1", b"10", b"11"])
        .query(&mut con)
        .expect("denial");
    assert_eq!(reply, [0, 10, -1, 0]);
    // `-0` is zero, and a zero cost is allowed.
    let reply: Vec<i64> = command("RL.ACQUIRE", &[b"g", b"1", b"10", b"-0"])
        .query(&mut con)
        .expect("zero cost");
    assert_eq!(reply, [1, 10, 0, 0]);
    // RL.SETSTATE's edges, with and without a fraction (4 arguments is the most). The
    // smallest instants are long past, so their keys expire at once: only OK is checked.
    let past: [&[&[u8]]; 3] = [
        &[b"s", b"1"],
        &[b"s", b"1", b"0"],
        &[b"s", b"1", b"9223372036854775807"],
    ];
    for args in past {
        let ok: String = command("RL.SETSTATE", args)
            .query(&mut con)
            .unwrap_or_else(|e| panic!("RL.SETSTATE {}: {e}", show(args)));
        assert_eq!(ok, "OK");
    }
    // Future instants, each with the expiry it gets: full_at rounded up to a millisecond, where
    // any fraction counts as part of a nanosecond more.
    let states: &[(&[&[u8]], i64)] = &[
        (&[b"s", b"4102444800000000000"], 4_102_444_800_000),
        (&[b"s", b"4102444800000000000", b"0"], 4_102_444_800_000),
        (&[b"s", b"4102444800000000000", b"1"], 4_102_444_800_001), // 2^-63 ns past the ms
        (&[b"s", b"4102444800000000001", b"0"], 4_102_444_800_001),
        // Just under the millisecond: the fraction rounds up to it, not past it.
        (
            &[b"s", b"4102444799999999999", b"9223372036854775807"],
            4_102_444_800_000,
        ),
        (&[b"s", b"9223372036854775807"], 9_223_372_036_855), // ceil(i64::MAX / 1e6) ms
        (
            &[b"s", b"9223372036854775807", b"9223372036854775807"],
            9_223_372_036_855,
        ),
        (&[b"s", b"0004102444800000000000", b"00"], 4_102_444_800_000), // leading zeros
    ];
    for (args, expire_at_ms) in states {
        let ok: String = command("RL.SETSTATE", args)
            .query(&mut con)
            .unwrap_or_else(|e| panic!("RL.SETSTATE {}: {e}", show(args)));
        assert_eq!(ok, "OK");
        assert_eq!(
            pexpiretime(&mut con, b"s"),
            *expire_at_ms,
            "RL.SETSTATE {}",
            show(args)
        );
    }
    // A zero fraction is the 2-argument state, byte for byte.
    let _: String = command("RL.SETSTATE", &[b"s", b"4102444800000000123", b"0"])
        .query(&mut con)
        .expect("accepted");
    let _: String = command("RL.SETSTATE", &[b"t", b"4102444800000000123"])
        .query(&mut con)
        .expect("accepted");
    assert_eq!(dump(&mut con, b"s"), dump(&mut con, b"t"));
    let _: String = command("RL.SETSTATE", &[b"t", b"4102444800000000123", b"1"])
        .query(&mut con)
        .expect("accepted");
    assert_ne!(
        dump(&mut con, b"s"),
        dump(&mut con, b"t"),
        "a fraction is stored"
    );
}

/// Asserts that `key` still holds the bytes `before` (by `DUMP`) and the expiry
/// `expire_before`; `what` names the call that must not have changed them.
fn assert_untouched(
    con: &mut Connection,
    key: &[u8],
    before: &[u8],
    expire_before: i64,
    what: &str,
) {
    assert_eq!(
        dump(con, key).as_deref(),
        Some(before),
        "{what} changed the value"
    );
    assert_eq!(
        pexpiretime(con, key),
        expire_before,
        "{what} changed the expiry"
    );
}

/// Every foreign type Redis has, each with the commands that create it as key `w`.
fn foreign_values() -> Vec<(&'static str, Vec<redis::Cmd>)> {
    fn cmd(parts: &[&str]) -> redis::Cmd {
        let mut cmd = redis::cmd(parts[0]);
        for part in &parts[1..] {
            cmd.arg(*part);
        }
        cmd
    }
    vec![
        ("string", vec![cmd(&["SET", "w", "hello"])]),
        ("list", vec![cmd(&["RPUSH", "w", "a", "b", "c"])]),
        ("hash", vec![cmd(&["HSET", "w", "f1", "v1", "f2", "v2"])]),
        ("set", vec![cmd(&["SADD", "w", "a", "b", "c"])]),
        ("zset", vec![cmd(&["ZADD", "w", "1", "a", "2.5", "b"])]),
        ("stream", vec![cmd(&["XADD", "w", "1-1", "f", "v"])]),
        (
            "string with expiry",
            vec![cmd(&["SET", "w", "hello", "PXAT", "4102444800000"])],
        ),
        (
            "hash with expiry",
            vec![
                cmd(&["HSET", "w", "f", "v"]),
                cmd(&["PEXPIREAT", "w", "4102444800123"]),
            ],
        ),
    ]
}

#[test]
fn foreign_types_get_wrongtype_and_stay_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let calls: &[(&str, &[&[u8]], &str)] = &[
        ("RL.ACQUIRE", &[b"w", b"0.001", b"10"], WRONGTYPE), // default cost
        ("RL.ACQUIRE", &[b"w", b"0.001", b"10", b"3"], WRONGTYPE), // explicit cost
        ("RL.ACQUIRE", &[b"w", b"0.001", b"10", b"0"], WRONGTYPE), // zero cost writes nothing, still refused
        ("RL.ACQUIRE", &[b"w", b"0.001", b"10", b"11"], WRONGTYPE), // impossible cost, still refused
        ("RL.SETSTATE", &[b"w", b"4102444800000000123"], WRONGTYPE), // the replicated form
        (
            "RL.SETSTATE",
            &[b"w", b"4102444800000000123", b"5"],
            WRONGTYPE,
        ), // with a fraction
        ("RL.SETSTATE", &[b"w", b"1", b"x"], FULL_AT_FRAC),         // arguments are parsed first
        ("RL.ACQUIRE", &[b"w", b"x", b"10"], RATE),                 // arguments are parsed first
        ("RL.SETSTATE", &[b"w", b"0"], FULL_AT),                    // arguments are parsed first
    ];
    for (kind, create) in foreign_values() {
        let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
        for cmd in create {
            let _: redis::Value = cmd.query(&mut con).expect("create the foreign value");
        }
        let type_before: String = redis::cmd("TYPE").arg("w").query(&mut con).expect("TYPE");
        let before = dump(&mut con, b"w").expect("value exists");
        let expire_before = pexpiretime(&mut con, b"w");
        let pttl_before: i64 = redis::cmd("PTTL").arg("w").query(&mut con).expect("PTTL");
        if kind.ends_with("with expiry") {
            assert!(
                expire_before > 0 && pttl_before > 0,
                "{kind}: expiry was set"
            );
        } else {
            assert_eq!((expire_before, pttl_before), (-1, -1), "{kind}: no expiry");
        }
        for (name, args, want) in calls {
            let what = format!("{kind}: {name} {}", show(args));
            let got = error_text(&mut con, &command(name, args));
            assert_eq!(got, *want, "{what}");
            assert_untouched(&mut con, b"w", &before, expire_before, &what);
            let pttl: i64 = redis::cmd("PTTL").arg("w").query(&mut con).expect("PTTL");
            if pttl_before == -1 {
                assert_eq!(pttl, -1, "{what} added an expiry");
            } else {
                assert!(pttl > 0 && pttl <= pttl_before, "{what} moved the expiry");
            }
            let key_type: String = redis::cmd("TYPE").arg("w").query(&mut con).expect("TYPE");
            assert_eq!(key_type, type_before, "{what}");
            assert_eq!(dbsize(&mut con), 1, "{what} created a key");
            server.assert_alive();
        }
    }
}

/// Writes a bucket with a state that is not round (fractional cost) and returns its bytes
/// and expiry.
fn make_bucket(con: &mut Connection, key: &[u8]) -> (Vec<u8>, i64) {
    let reply: Vec<i64> = command("RL.ACQUIRE", &[key, b"0.003", b"10", b"2.7"])
        .query(con)
        .expect("RL.ACQUIRE");
    assert_eq!(reply[0], 1, "allowed");
    (
        dump(con, key).expect("bucket exists"),
        pexpiretime(con, key),
    )
}

#[test]
fn bad_arguments_leave_an_existing_bucket_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let (before, expire_before) = make_bucket(&mut con, b"k");
    assert!(expire_before > 0);
    // The rows whose exact text is the subject of its own test are only required to fail.
    let rows = BAD_ACQUIRE
        .iter()
        .map(|(args, want)| ("RL.ACQUIRE", *args, Some(*want)))
        .chain(
            RATE_OUT_OF_RANGE_BEFORE_BAD_CAPACITY
                .iter()
                .map(|(args, _)| ("RL.ACQUIRE", *args, None)),
        )
        .chain(
            BAD_SETSTATE
                .iter()
                .map(|(args, want)| ("RL.SETSTATE", *args, Some(*want))),
        );
    for (name, args, want) in rows {
        let what = format!("{name} {}", show(args));
        let got = error_text(&mut con, &command(name, args));
        match want {
            Some(want) => assert_eq!(got, want, "{what} on a bucket"),
            None => assert!(got.starts_with("ERR "), "{what}: {got}"),
        }
        assert_untouched(&mut con, b"k", &before, expire_before, &what);
        assert_eq!(dbsize(&mut con), 1, "{what} created a key");
        server.assert_alive();
    }
}

#[test]
fn foreign_keys_get_wrongtype_and_stay_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let foreign: &[(&str, &[&str])] = &[
        ("string", &["SET", "w", "hello"]),
        ("list", &["RPUSH", "w", "a", "b"]),
        ("hash with expiry", &["HSET", "w", "f", "v"]),
    ];
    let calls: &[(&str, &[&[u8]])] = &[
        ("RL.PEEK", &[b"w", b"0.001", b"10"]),
        ("RL.PEEK", &[b"w", b"0.001", b"10", b"0"]),
        ("RL.ACQUIRE.MULTI", &[b"w", b"0.001", b"10", b"1"]),
        // A bucket beside the foreign key is untouched too.
        (
            "RL.ACQUIRE.MULTI",
            &[
                b"bucket", b"0.001", b"10", b"1", b"w", b"0.001", b"10", b"1",
            ],
        ),
        (
            "RL.ACQUIRE.MULTI",
            &[
                b"w", b"0.001", b"10", b"0", b"bucket", b"0.001", b"10", b"1",
            ],
        ),
        ("RL.THROTTLE", &[b"w", b"15", b"30", b"60"]),
        ("RL.THROTTLE", &[b"w", b"15", b"30", b"60", b"0"]),
        ("RL.REFUND", &[b"w", b"0.001", b"10"]),
        ("RL.REFUND", &[b"w", b"0.001", b"10", b"0"]),
    ];
    for (kind, create) in foreign {
        let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
        let mut cmd = redis::cmd(create[0]);
        cmd.arg(&create[1..]);
        let _: redis::Value = cmd.query(&mut con).expect("create the foreign value");
        if kind.ends_with("with expiry") {
            let _: i64 = redis::cmd("PEXPIREAT")
                .arg("w")
                .arg(4_102_444_800_123_i64)
                .query(&mut con)
                .expect("PEXPIREAT");
        }
        acquire(&mut con, &["bucket", "0.001", "10", "3"]);
        let before = snapshot(&mut con);
        for (name, args) in calls {
            let got = error_text(&mut con, &command(name, args));
            assert_eq!(got, WRONGTYPE, "{kind}: {name} {}", show(args));
            assert_eq!(
                snapshot(&mut con),
                before,
                "{kind}: {name} {} changed a key",
                show(args)
            );
            server.assert_alive();
        }
    }
}
