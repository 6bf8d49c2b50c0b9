//! Bad input against a real server: wrong arity, every malformed number, foreign key types.
//!
//! Every case asserts the exact reply text, that nothing was written (no key created, an
//! existing value byte-identical by `DUMP` with the same expiry), and that the server still
//! answers `PING`.
//!
//! Time: nothing here depends on it. Buckets use a rate of 0.001 tokens/s, so refill cannot
//! change their state during a test, and every comparison is of stored bytes.

mod common;

use common::{
    assert_rejected_on_empty_server, command, dbsize, dump, error_text, exists, fresh, pexpiretime,
    show, Server,
};
use redis::Connection;

const ACQUIRE_ARITY: &str = "ERR wrong number of arguments for 'RL.ACQUIRE' command";
const SETSTATE_ARITY: &str = "ERR wrong number of arguments for 'RL.SETSTATE' command";
const RATE: &str = "ERR rate must be a number from 0.000001 to 1000000000 (tokens per second)";
const CAPACITY: &str = "ERR capacity must be a number above 0 and at most 1e15 (tokens)";
const COST: &str = "ERR cost must be a finite number >= 0 (tokens)";
const FULL_AT: &str =
    "ERR full_at_ns must be an integer from 1 to 9223372036854775807 (ns since the Unix epoch)";
const FULL_AT_FRAC: &str =
    "ERR full_at_frac must be an integer from 0 to 9223372036854775807 (units of 2^-63 ns)";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// 400 nines: a valid decimal far beyond f64's range, so it parses to infinity.
const DIGITS_400: [u8; 400] = [b'9'; 400];

/// The arguments after the command name, and the exact error they must get.
type Row = (&'static [&'static [u8]], &'static str);

/// Bad `RL.ACQUIRE` calls. The key is always `k`; the good values around the bad one are
/// rate 1, capacity 10 and cost 1.
const BAD_ACQUIRE: &[Row] = &[
    // --- arity: key rate capacity [cost], so 3 or 4 arguments after the name
    (&[], ACQUIRE_ARITY),                              // nothing after the name
    (&[b"k"], ACQUIRE_ARITY),                          // key only
    (&[b"k", b"1"], ACQUIRE_ARITY),                    // no capacity
    (&[b"k", b"1", b"10", b"1", b"1"], ACQUIRE_ARITY), // one argument too many
    (&[b"k", b"x", b"x", b"x", b"x", b"x"], ACQUIRE_ARITY), // arity is checked before values
    // --- rate
    (&[b"k", b"x", b"10"], RATE),            // not a number
    (&[b"k", b"", b"10"], RATE),             // empty string
    (&[b"k", b"nan", b"10"], RATE),          // NaN, lower case
    (&[b"k", b"NaN", b"10"], RATE),          // NaN, mixed case
    (&[b"k", b"inf", b"10"], RATE),          // infinity spelled "inf"
    (&[b"k", b"-inf", b"10"], RATE),         // negative infinity
    (&[b"k", b"+inf", b"10"], RATE),         // signed infinity
    (&[b"k", b"infinity", b"10"], RATE),     // infinity spelled out
    (&[b"k", b"0.0000001", b"10"], RATE),    // below the minimum of 0.000001/s
    (&[b"k", b"1e10", b"10"], RATE),         // above the maximum of 1e9/s
    (&[b"k", b"-1", b"10"], RATE),           // negative
    (&[b"k", b"0", b"10"], RATE),            // zero: a bucket that never refills
    (&[b"k", b"-0", b"10"], RATE),           // negative zero is zero
    (&[b"k", b"1e999", b"10"], RATE),        // far above the maximum
    (&[b"k", &DIGITS_400, b"10"], RATE),     // 400 significant digits: more than 38
    (&[b"k", b"1e-400", b"10"], RATE),       // far below the minimum
    (&[b"k", b"1x", b"10"], RATE),           // trailing junk
    (&[b"k", b"1 ", b"10"], RATE),           // trailing space
    (&[b"k", b" 1", b"10"], RATE),           // leading space
    (&[b"k", b"0x10", b"10"], RATE),         // hex
    (&[b"k", b"\xff\xfe", b"10"], RATE),     // not UTF-8
    (&[b"k", b"1\xff", b"10"], RATE),        // a digit, then a non-UTF-8 byte
    (&[b"k", b"1,5", b"10"], RATE),          // decimal comma
    (&[b"k", b"1..5", b"10"], RATE),         // two decimal points
    (&[b"k", b"1/0", b"10"], RATE),          // N/S with a zero period
    (&[b"k", b"0/1", b"10"], RATE),          // N/S with no tokens
    (&[b"k", b"1/", b"10"], RATE),           // N/S without S
    (&[b"k", b"/1", b"10"], RATE),           // N/S without N
    (&[b"k", b"1/2/3", b"10"], RATE),        // two slashes
    (&[b"k", b"1/1000001", b"10"], RATE),    // N/S just below the minimum, exactly
    (&[b"k", b"1000000001/1", b"10"], RATE), // N/S above the maximum
    // --- capacity
    (&[b"k", b"1", b"x"], CAPACITY),        // not a number
    (&[b"k", b"1", b""], CAPACITY),         // empty string
    (&[b"k", b"1", b"nan"], CAPACITY),      // NaN, lower case
    (&[b"k", b"1", b"NaN"], CAPACITY),      // NaN, mixed case
    (&[b"k", b"1", b"inf"], CAPACITY),      // infinity spelled "inf"
    (&[b"k", b"1", b"-inf"], CAPACITY),     // negative infinity
    (&[b"k", b"1", b"+inf"], CAPACITY),     // signed infinity
    (&[b"k", b"1", b"infinity"], CAPACITY), // infinity spelled out
    (&[b"k", b"1", b"1e16"], CAPACITY),     // above the maximum of 1e15
    (&[b"k", b"1", b"-1"], CAPACITY),       // negative
    (&[b"k", b"1", b"0"], CAPACITY),        // zero: a bucket that holds nothing
    (&[b"k", b"1", b"1e999"], CAPACITY),    // far above the maximum
    (&[b"k", b"1", &DIGITS_400], CAPACITY), // 400 significant digits: more than 38
    (&[b"k", b"1", b"1x"], CAPACITY),       // trailing junk
    (&[b"k", b"1", b"1 "], CAPACITY),       // trailing space
    (&[b"k", b"1", b" 1"], CAPACITY),       // leading space
    (&[b"k", b"1", b"0x10"], CAPACITY),     // hex
    (&[b"k", b"1", b"\xff\xfe"], CAPACITY), // not UTF-8
    (&[b"k", b"1", b"1,5"], CAPACITY),      // decimal comma
    // --- cost (no upper bound: a cost above capacity is a denial, not an error)
    (&[b"k", b"1", b"10", b"x"], COST),        // not a number
    (&[b"k", b"1", b"10", b""], COST),         // empty string
    (&[b"k", b"1", b"10", b"nan"], COST),      // NaN, lower case
    (&[b"k", b"1", b"10", b"NaN"], COST),      // NaN, mixed case
    (&[b"k", b"1", b"10", b"inf"], COST),      // infinity spelled "inf"
    (&[b"k", b"1", b"10", b"-inf"], COST),     // negative infinity
    (&[b"k", b"1", b"10", b"+inf"], COST),     // signed infinity
    (&[b"k", b"1", b"10", b"infinity"], COST), // infinity spelled out
    (&[b"k", b"1", b"10", b"-1"], COST),       // negative
    (&[b"k", b"1", b"10", b"-0.5"], COST),     // negative fraction
    (
        &[
            b"k",
            b"1",
            b"10",
            b"1.00000000000000000000000000000000000001",
        ],
        COST,
    ), // 39 digits
    (&[b"k", b"1", b"10", b"1/2"], COST),      // only a rate may be N/S
    (&[b"k", b"1", b"10", b"-1e999"], COST),   // negative
    (&[b"k", b"1", b"10", &DIGITS_400], COST), // 400 significant digits: more than 38
    (&[b"k", b"1", b"10", b"1x"], COST),       // trailing junk
    (&[b"k", b"1", b"10", b"1 "], COST),       // trailing space
    (&[b"k", b"1", b"10", b" 1"], COST),       // leading space
    (&[b"k", b"1", b"10", b"0x10"], COST),     // hex
    (&[b"k", b"1", b"10", b"\xff\xfe"], COST), // not UTF-8
    (&[b"k", b"1", b"10", b"1,5"], COST),      // decimal comma
    // --- several bad arguments: the first one, in order rate, capacity, cost, is named
    (&[b"k", b"x", b"x", b"x"], RATE),       // all three unparsable
    (&[b"k", b"nan", b"0", b"-1"], RATE),    // all three bad, rate unparsable
    (&[b"k", b"0", b"0", b"-1"], RATE),      // all three parse, all three out of range
    (&[b"k", b"1e10", b"1e16", b"x"], RATE), // rate and capacity out of range, cost junk
    (&[b"k", b"1", b"x", b"x"], CAPACITY),   // capacity and cost unparsable
    (&[b"k", b"1", b"0", b"-1"], CAPACITY),  // capacity and cost out of range
    (&[b"k", b"1", b"1e16", b"nan"], CAPACITY), // capacity out of range, cost unparsable
];

/// A rate that parses but is out of range, then a capacity that does not parse: the rate is
/// the first bad argument and must be the one named. (Kept apart from `BAD_ACQUIRE` because
/// range and parse errors are found in different steps, so this order is easy to get wrong.)
const RATE_OUT_OF_RANGE_BEFORE_BAD_CAPACITY: &[Row] = &[
    (&[b"k", b"0", b"x"], RATE),          // zero rate, junk capacity
    (&[b"k", b"1e10", b""], RATE),        // too fast, empty capacity
    (&[b"k", b"-1", b"nan", b"1"], RATE), // negative rate, NaN capacity
    (&[b"k", b"0.0000001", b"1x"], RATE), // too slow, trailing junk in capacity
];

/// Bad `RL.SETSTATE key full_at_ns [full_at_frac]` calls: `full_at_ns` must be a plain
/// integer in `1..=i64::MAX`, `full_at_frac` one in `0..=i64::MAX`.
const BAD_SETSTATE: &[Row] = &[
    (&[], SETSTATE_ARITY),                             // nothing after the name
    (&[b"k"], SETSTATE_ARITY),                         // key only
    (&[b"k", b"1", b"1", b"1"], SETSTATE_ARITY),       // one argument too many
    (&[b"k", b"x", b"x", b"x"], SETSTATE_ARITY),       // arity is checked before values
    (&[b"k", b"x", b"x", b"x", b"x"], SETSTATE_ARITY), // two too many
    (&[b"k", b"0"], FULL_AT),                          // zero is not a state
    (&[b"k", b"-1"], FULL_AT),                         // negative
    (&[b"k", b"+1"], FULL_AT),                         // no sign allowed
    (&[b"k", b"1.5"], FULL_AT),                        // fraction
    (&[b"k", b"1.0"], FULL_AT),                        // integral, but written as a float
    (&[b"k", b"1e3"], FULL_AT),                        // exponent
    (&[b"k", b"9223372036854775808"], FULL_AT),        // i64::MAX + 1
    (&[b"k", b"18446744073709551615"], FULL_AT),       // u64::MAX
    (&[b"k", b"18446744073709551616"], FULL_AT),       // u64::MAX + 1
    (&[b"k", b"99999999999999999999999"], FULL_AT),    // far past u64
    (&[b"k", b""], FULL_AT),                           // empty string
    (&[b"k", b"abc"], FULL_AT),                        // not a number
    (&[b"k", b"1x"], FULL_AT),                         // trailing junk
    (&[b"k", b"1 "], FULL_AT),                         // trailing space
    (&[b"k", b" 1"], FULL_AT),                         // leading space
    (&[b"k", b"0x10"], FULL_AT),                       // hex
    (&[b"k", b"1,5"], FULL_AT),                        // comma
    (&[b"k", b"\xff\xfe"], FULL_AT),                   // not UTF-8
    (&[b"k", b"nan"], FULL_AT),                        // NaN
    (&[b"k", b"inf"], FULL_AT),                        // infinity
    // --- full_at_frac, after a valid full_at_ns
    (&[b"k", b"1", b"9223372036854775808"], FULL_AT_FRAC), // 2^63: a whole nanosecond
    (&[b"k", b"1", b"18446744073709551615"], FULL_AT_FRAC), // u64::MAX
    (&[b"k", b"1", b"18446744073709551616"], FULL_AT_FRAC), // u64::MAX + 1
    (&[b"k", b"1", b"99999999999999999999999"], FULL_AT_FRAC), // far past u64
    (&[b"k", b"1", b"-1"], FULL_AT_FRAC),                  // negative
    (&[b"k", b"1", b"-0"], FULL_AT_FRAC),                  // no sign allowed, even on zero
    (&[b"k", b"1", b"+1"], FULL_AT_FRAC),                  // no sign allowed
    (&[b"k", b"1", b"0.5"], FULL_AT_FRAC),                 // a fraction of a unit
    (&[b"k", b"1", b"1e3"], FULL_AT_FRAC),                 // exponent
    (&[b"k", b"1", b""], FULL_AT_FRAC),                    // empty string
    (&[b"k", b"1", b"x"], FULL_AT_FRAC),                   // not a number
    (&[b"k", b"1", b"1 "], FULL_AT_FRAC),                  // trailing space
    (&[b"k", b"1", b" 1"], FULL_AT_FRAC),                  // leading space
    (&[b"k", b"1", b"0x10"], FULL_AT_FRAC),                // hex
    (&[b"k", b"1", b"\xff"], FULL_AT_FRAC),                // not UTF-8
    (&[b"k", b"1", b"nan"], FULL_AT_FRAC),                 // NaN
    // --- both bad: full_at_ns, the first argument, is named first
    (&[b"k", b"0", b"x"], FULL_AT), // a zero instant with a junk fraction
    (&[b"k", b"9223372036854775808", b"1"], FULL_AT), // instant past 2262, valid fraction
    (&[b"k", b"x", b"9223372036854775808"], FULL_AT), // junk instant, fraction too big
    (&[b"k", b"0", b"0"], FULL_AT), // a zero fraction does not help
];

#[test]
fn acquire_rejects_each_bad_argument_with_its_exact_error() {
    assert!(BAD_ACQUIRE.len() >= 30);
    assert_rejected_on_empty_server("RL.ACQUIRE", BAD_ACQUIRE);
}

#[test]
fn acquire_names_an_out_of_range_rate_before_an_unparsable_capacity() {
    assert_rejected_on_empty_server("RL.ACQUIRE", RATE_OUT_OF_RANGE_BEFORE_BAD_CAPACITY);
}

#[test]
fn setstate_rejects_each_bad_argument_with_its_exact_error() {
    assert_rejected_on_empty_server("RL.SETSTATE", BAD_SETSTATE);
}

#[test]
fn boundary_values_are_accepted() {
    // The edges of each range, so the tables above reject for the reason they claim.
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
