//! The tables of bad arguments several test files share: each row the arguments after a
//! command's name and the exact error it must get. `errors.rs` also runs them against an
//! existing bucket, which must stay untouched.

use super::arity;
use super::texts::{CAPACITY, COST, FULL_AT, FULL_AT_FRAC, RATE, REFILL};

/// The arguments after the command name, and the exact error they must get.
pub type Row = (&'static [&'static [u8]], &'static str);

pub const ACQUIRE_ARITY: &str = "ERR wrong number of arguments for 'RL.ACQUIRE' command";
pub const SETSTATE_ARITY: &str = "ERR wrong number of arguments for 'RL.SETSTATE' command";

/// 400 nines: more significant digits than a decimal argument takes (38).
pub const DIGITS_400: [u8; 400] = [b'9'; 400];

/// Bad `RL.ACQUIRE` calls. The key is always `k`; the good values around the bad one are
/// rate 1, capacity 10 and cost 1.
pub const BAD_ACQUIRE: &[Row] = &[
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
    (&[b"k", b"1e-400", b"10"], RATE),       // underflows to zero
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
pub const RATE_OUT_OF_RANGE_BEFORE_BAD_CAPACITY: &[Row] = &[
    (&[b"k", b"0", b"x"], RATE),          // zero rate, junk capacity
    (&[b"k", b"1e10", b""], RATE),        // too fast, empty capacity
    (&[b"k", b"-1", b"nan", b"1"], RATE), // negative rate, NaN capacity
    (&[b"k", b"0.0000001", b"1x"], RATE), // too slow, trailing junk in capacity
];

/// Bad `RL.SETSTATE key full_at_ns [full_at_frac]` calls: `full_at_ns` must be a plain
/// integer in `1..=i64::MAX`, `full_at_frac` one in `0..=i64::MAX`.
pub const BAD_SETSTATE: &[Row] = &[
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

/// Bad `rate capacity [cost]` values, shared by RL.PEEK and RL.REFUND (the key is `k`).
pub const BAD_LIMITS: &[(&[&[u8]], &str)] = &[
    (&[b"k", b"x", b"10"], RATE),              // rate not a number
    (&[b"k", b"0", b"10"], RATE),              // zero rate
    (&[b"k", b"1e10", b"10"], RATE),           // above 1e9/s
    (&[b"k", b"nan", b"10"], RATE),            // NaN
    (&[b"k", b"1", b"0"], CAPACITY),           // zero capacity
    (&[b"k", b"1", b"1e16"], CAPACITY),        // above 1e15
    (&[b"k", b"1", b"inf"], CAPACITY),         // infinity
    (&[b"k", b"1", b"3153600001"], REFILL),    // a full refill longer than 100 years
    (&[b"k", b"1", b"10", b"-1"], COST),       // negative cost
    (&[b"k", b"1", b"10", b"nan"], COST),      // NaN cost
    (&[b"k", b"1", b"10", b"x"], COST),        // junk cost
    (&[b"k", b"1", b"10", b"\xff\xfe"], COST), // not UTF-8
    (&[b"k", b"x", b"x", b"x"], RATE),         // several bad: the first is named
    (&[b"k", b"1", b"0", b"-1"], CAPACITY),    // capacity before cost
];

/// Rows for a `key rate capacity [cost]` command: its arity errors, then [`BAD_LIMITS`].
pub fn limit_rows(name: &str) -> Vec<(Vec<&'static [u8]>, String)> {
    let arity_rows: &[&[&[u8]]] = &[
        &[],                              // nothing after the name
        &[b"k"],                          // key only
        &[b"k", b"1"],                    // no capacity
        &[b"k", b"1", b"10", b"1", b"1"], // one argument too many
    ];
    arity_rows
        .iter()
        .map(|args| (args.to_vec(), arity(name)))
        .chain(
            BAD_LIMITS
                .iter()
                .map(|(args, want)| (args.to_vec(), want.to_string())),
        )
        .collect()
}
