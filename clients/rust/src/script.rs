//! The Lua fallbacks for servers without the module: the shipped script (`src/rl.lua`, a copy
//! of `clients/lua/rl.lua` that a test holds equal, compiled in) and its SHA-1, the Functions
//! library made from it (`src/rl_functions.lua`, a copy of `clients/lua/rl_functions.lua`) and
//! its version, and the ten fixed-point numbers both take per key, packed in one argument.
//!
//! The script only adds, compares and multiplies integers below 2^53; the exact rational
//! arithmetic that turns a limit into its pairs `(q, r)` (q + r/D µs) happens here, on the
//! exact values of the texts the module would be sent (0.1 is one tenth; `100/60` five
//! thirds), as in the Python and Node libraries.

use num_bigint::BigInt;
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use crate::types::{number, Limit};

/// The script every library ships.
pub(crate) const SCRIPT: &str = include_str!("rl.lua");

/// The Functions library `redis_rl` every library ships (`FUNCTION LOAD` text).
pub(crate) const FUNCTIONS: &str = include_str!("rl_functions.lua");

/// The version of the Functions library this client needs: `FCALL_RO rl_version 0` must
/// answer at least this. The shipped library's own `rl_version` answers it (a test checks).
pub const FUNCTIONS_VERSION: i64 = 5;

/// The script's SHA-1 in hex, as EVALSHA names it: computed here, never asked of the server.
pub(crate) fn sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| sha1_smol::Sha1::from(SCRIPT).digest().to_string())
}

/// Denominators of the script's pairs must stay below 2^31.
const MAX_EXACT_DENOMINATOR: u64 = 1 << 31;
/// When `T = 1e6 / rate` µs has no denominator below 2^31, it is rounded up to 2^-30 µs.
const ROUNDED_DENOMINATOR: u64 = 1 << 30;

/// `D` and `T × D` for a limit: the script's denominator and the µs per token in units of
/// 1/D µs (a whole number; `T` rounded up when not exact, so the script is only stricter).
fn period(limit: &Limit) -> (BigInt, BigInt) {
    let rate = exact(&limit.rate_text());
    let t_us = BigRational::from_integer(BigInt::from(1_000_000)) / rate;
    if *t_us.denom() < BigInt::from(MAX_EXACT_DENOMINATOR) {
        (t_us.denom().clone(), t_us.numer().clone())
    } else {
        let d = BigInt::from(ROUNDED_DENOMINATOR);
        let scaled = (t_us * BigRational::from_integer(d.clone()))
            .ceil()
            .to_integer();
        (d, scaled)
    }
}

/// Seconds a refill from empty takes, `capacity / rate` exactly, rounded up (at least 1):
/// the `w` of the RateLimit-Policy field. At 3 tokens per 10 s the doubles say
/// 3 / 0.3 = 10.000000000000002, which rounds up to 11.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) fn refill_s(limit: &Limit) -> u64 {
    let rate = exact(&limit.rate_text());
    if rate.is_zero() {
        return 1;
    }
    let seconds = (exact(&limit.capacity_text()) / rate).ceil().to_integer();
    u64::try_from(seconds).unwrap_or(u64::MAX).max(1)
}

/// The exact value of a text this library sends: a plain decimal ("0.1", "2500", as Rust
/// prints a double or a period) or `N/S`. Validated before, so anything else is not expected;
/// it reads as zero.
fn exact(text: &str) -> BigRational {
    let decimal = |part: &str| -> Option<BigRational> {
        let (whole, fraction) = part.split_once('.').unwrap_or((part, ""));
        let digits: BigInt = format!("{whole}{fraction}").parse().ok()?;
        let scale = BigInt::from(10).pow(u32::try_from(fraction.len()).ok()?);
        Some(BigRational::new(digits, scale))
    };
    let value = match text.split_once('/') {
        Some((count, period)) => decimal(period)
            .filter(|p| !p.is_zero())
            .and_then(|p| Some(decimal(count)? / p)),
        None => decimal(text),
    };
    value.unwrap_or_else(BigRational::zero)
}

/// The 10 numbers of `clients/lua/rl.lua` for one key: D, T, C, S, K as pairs, floor(C).
/// `refund` rounds `cost × T` down (never give back more), the others round it up.
#[cfg(test)]
pub(crate) fn args(limit: &Limit, cost: f64, refund: bool) -> [String; 10] {
    integers(limit, cost, refund).map(|x| x.to_string())
}

/// The same 10 numbers packed in the one argument of 80 bytes the script and the Functions
/// library (version 3 on) read fastest: little-endian IEEE doubles, in order. Each is an integer
/// below 2^53, so the double is exact.
pub(crate) fn packed(limit: &Limit, cost: f64, refund: bool) -> Vec<u8> {
    integers(limit, cost, refund)
        .iter()
        // Never above 2^53 for a valid limit; NaN would send the script to its checks.
        .flat_map(|x| x.to_f64().unwrap_or(f64::NAN).to_le_bytes())
        .collect()
}

fn integers(limit: &Limit, cost: f64, refund: bool) -> [BigInt; 10] {
    let (d, t_d) = period(limit);
    let cap = exact(&limit.capacity_text());
    let cost = exact(&number(cost));
    let t_d = BigRational::from_integer(t_d);
    let split = |units: BigInt| -> (BigInt, BigInt) { units.div_rem(&d) };
    let (tq, tr) = split(t_d.to_integer());
    let (cq, cr) = split((&cap * &t_d).floor().to_integer());
    let (sq, sr) = if cost > cap {
        (-BigInt::one(), BigInt::zero())
    } else {
        split(((&cap - &cost) * &t_d).floor().to_integer())
    };
    let k = &cost * &t_d;
    let k = if refund { k.floor() } else { k.ceil() };
    let (kq, kr) = split(k.to_integer());
    let cfloor = cap.floor().to_integer();
    debug_assert!(!tq.is_negative());
    [d.clone(), tq, tr, cq, cr, sq, sr, kq, kr, cfloor]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crate ships its own copy of the script (a packaged crate cannot reach outside its
    /// directory): it must be the repository's one script, byte for byte
    /// (`cp clients/lua/rl.lua clients/rust/src/rl.lua` after changing it).
    #[test]
    fn the_shipped_script_is_the_shared_one() {
        let shared = concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/rl.lua");
        assert!(
            SCRIPT == std::fs::read_to_string(shared).unwrap(),
            "clients/rust/src/rl.lua differs from clients/lua/rl.lua"
        );
    }

    /// The packed argument holds the same ten numbers, as doubles, in order.
    #[test]
    fn packed_holds_the_ten_numbers_as_little_endian_doubles() {
        for (limit, cost, refund) in [
            (Limit::new(10.0, 1e10).unwrap(), 1000.0, false),
            (Limit::new(3.0, 3e9).unwrap(), 301.0, false),
            (Limit::new(1.0, 2.0).unwrap(), 3.0, false),
            (Limit::new(1.0 / 60.0, 5.0).unwrap(), 1.0, true),
        ] {
            let bytes = packed(&limit, cost, refund);
            assert_eq!(bytes.len(), 80);
            let doubles: Vec<String> = bytes
                .chunks(8)
                .map(|c| format!("{}", f64::from_le_bytes(c.try_into().unwrap())))
                .collect();
            assert_eq!(doubles, args(&limit, cost, refund));
        }
    }

    /// The same for the Functions library (`clients/lua/rl_functions.lua`).
    #[test]
    fn the_shipped_library_is_the_shared_one() {
        let shared = concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/rl_functions.lua");
        assert!(
            FUNCTIONS == std::fs::read_to_string(shared).unwrap(),
            "clients/rust/src/rl_functions.lua differs from clients/lua/rl_functions.lua"
        );
        assert!(FUNCTIONS.starts_with("#!lua name=redis_rl"));
    }

    #[test]
    fn exact_rates_keep_their_denominator() {
        // 3/s: T = 1e6/3 µs, D = 3.
        let a = args(&Limit::new(3.0, 3.0).unwrap(), 1.0, false);
        assert_eq!(
            a,
            ["3", "333333", "1", "1000000", "0", "666666", "2", "333333", "1", "3"]
        );
        // cost above capacity: S = -1.
        let a = args(&Limit::new(1.0, 2.0).unwrap(), 3.0, false);
        assert_eq!(&a[5..7], ["-1", "0"]);
    }

    /// The same numbers as the Python library's `Limit.script_args` (its own exact
    /// rationals of the same decimals), for rates whose T is not whole, decimal capacities and
    /// costs, and a rate whose T has no denominator below 2^31.
    #[test]
    fn agrees_with_the_python_library() {
        let rows: [(f64, f64, f64, bool, [&str; 10]); 6] = [
            // 0.1 is one tenth: T = 1e7 µs, exact over D = 1
            (
                0.1,
                2.0,
                1.0,
                false,
                [
                    "1", "10000000", "0", "20000000", "0", "10000000", "0", "10000000", "0", "2",
                ],
            ),
            // the same, refunding
            (
                0.1,
                2.0,
                1.0,
                true,
                [
                    "1", "10000000", "0", "20000000", "0", "10000000", "0", "10000000", "0", "2",
                ],
            ),
            // T = 1e7/3 µs, over D = 3
            (
                0.3,
                3.0,
                3.0,
                false,
                [
                    "3", "3333333", "1", "10000000", "0", "0", "0", "10000000", "0", "3",
                ],
            ),
            // decimal capacity and cost: 0.7 × 5e5 µs is whole
            (
                2.0,
                2.5,
                0.7,
                false,
                [
                    "1", "500000", "0", "1250000", "0", "900000", "0", "350000", "0", "2",
                ],
            ),
            // the double nearest 1/60 prints 0.016666666666666666: T rounded up over 2^30
            (
                1.0 / 60.0,
                5.0,
                1.0,
                true,
                [
                    "1073741824",
                    "60000000",
                    "3",
                    "300000000",
                    "15",
                    "240000000",
                    "12",
                    "60000000",
                    "3",
                    "5",
                ],
            ),
            // tenths at 7/s: 1e5/7 µs over D = 7
            (
                7.0,
                0.3,
                0.1,
                false,
                [
                    "7", "142857", "1", "42857", "1", "28571", "3", "14285", "5", "0",
                ],
            ),
        ];
        for (rate, capacity, cost, refund, expect) in rows {
            let got = args(&Limit::new(rate, capacity).unwrap(), cost, refund);
            assert_eq!(
                got, expect,
                "rate {rate} capacity {capacity} cost {cost} refund {refund}"
            );
        }
    }
}
