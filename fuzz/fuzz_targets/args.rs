//! `args`: the argument parsers on arbitrary bytes: `args::acquire` (`rate capacity [cost]`),
//! `args::throttle` (`max_burst count_per_period period [quantity]`), `args::gcra`
//! (`max_burst tokens_per_period period [TOKENS count]`) and `args::state`
//! (`full_at_ns [full_at_frac]` of `RL.SETSTATE`).
//!
//! Input: 1 to 4 arguments separated by NUL bytes (the 4th takes the rest, NULs included), so
//! a corpus file reads like a command line: `5\x0010\x001`. Every argument goes through
//! `state` alone, and every pair of neighbours as `full_at_ns full_at_frac`; with 2 or more,
//! the first three go through `acquire`, and with 3 or more, all of them through `throttle`
//! and `gcra` (whose option is the 4th argument, split at its first NUL into the name and the
//! count).
//!
//! Checks, besides "never panics":
//! - every `Ok` is within the documented ranges: rate in [1e-6, 1e9], capacity in (0, 1e15],
//!   capacity / rate at most 100 years, cost >= 0, full_at_ns in 1..=i64::MAX,
//!   full_at_frac in 0..=i64::MAX;
//! - the parsers agree exactly (same value, same error, same argument named) with a reference
//!   written from their documentation in big rationals, sharing no code with them: a decimal
//!   is `[+]digits[.digits][(e|E)[+-]digits]` (a digit on at least one side of the point, `-`
//!   only for zero, at most 38 significant digits), taken exactly; a rate is a decimal or
//!   `N/S`; every range is checked on the exact values, and `T = 1e9 / rate` must come out
//!   exactly, or (when its denominator exceeds 2^62) from the rate's decimals cut to 18
//!   significant digits toward the slower rate. A throttle integer is digits only, saturating
//!   at `u64::MAX`, as are `full_at_ns` and `full_at_frac` (leading zeros allowed); a throttle
//!   limit is exactly `count` tokens per `period` seconds; a GCRA period is a decimal, exact
//!   (never a double rounded to whole nanoseconds: a period too long or too short for any
//!   rate is refused).
#![no_main]

use libfuzzer_sys::fuzz_target;
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, Zero};
use redis_rl::args;
use redis_rl::error::Error;
use rl_bucket::{Decimal, Limit, MAX_FULL_AT_FRAC, MAX_FULL_AT_NS};

/// A decimal's digits (significant ones only counted) and exponent, as documented; `None` for
/// anything else.
fn reference_digits(bytes: &[u8]) -> Option<(String, i64, bool)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (negative, text) = match text.as_bytes().first() {
        Some(b'+') => (false, &text[1..]),
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int_part}{frac_part}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let exponent: i64 = match exponent {
        None => 0,
        Some(e) => {
            let body = e.strip_prefix(['+', '-']).unwrap_or(e);
            if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Far past every range either way; clamped so it stays an i64.
            let magnitude = body.parse::<i64>().unwrap_or(i64::MAX / 4).min(1 << 40);
            if e.starts_with('-') {
                -magnitude
            } else {
                magnitude
            }
        }
    };
    let leading = digits.trim_start_matches('0');
    let significant = leading.trim_end_matches('0');
    if significant.len() > 38 {
        return None;
    }
    let zero = significant.is_empty();
    if negative && !zero {
        return None;
    }
    // Normalized: the significant digits, and the exponent that makes up the trailing zeros.
    let trailing = (leading.len() - significant.len()) as i64;
    let exp10 = exponent - frac_part.len() as i64 + trailing;
    // Documented: a nonzero value beyond 10^±999999999 is not a decimal.
    if !zero && exp10.abs() > 999_999_999 {
        return None;
    }
    Some((significant.to_string(), exp10, zero))
}

/// `digits × 10^exp10` exactly; `None` when the exponent is too large to build (past every
/// range, which the caller then treats as out of range).
fn rational(digits: &str, exp10: i64) -> Option<BigRational> {
    let n: BigInt = digits.parse().ok()?;
    if n.is_zero() {
        return Some(BigRational::zero());
    }
    if exp10.abs() > 2000 {
        return None;
    }
    let scale = num_traits::pow(BigInt::from(10), exp10.unsigned_abs() as usize);
    Some(if exp10 >= 0 {
        BigRational::from_integer(n * scale)
    } else {
        BigRational::new(n, scale)
    })
}

/// A decimal's exact value. Out-of-reach exponents (beyond 10^±2000, past every range) become
/// 10^±2000, which decides every comparison the same way.
fn reference_decimal(bytes: &[u8]) -> Option<BigRational> {
    let (digits, exp10, zero) = reference_digits(bytes)?;
    if zero {
        return Some(BigRational::zero());
    }
    Some(value(&digits, exp10))
}

/// `digits × 10^exp10` (normalized), with the far exponents mapped as [`reference_decimal`]
/// maps them.
fn value(digits: &str, exp10: i64) -> BigRational {
    rational(digits, exp10)
        .unwrap_or_else(|| rational("1", 2000 * exp10.signum()).unwrap_or_default())
}

/// The decimal's significant digits and exponent, cut to 18 digits, rounded down or up.
fn round18(bytes: &[u8], up: bool) -> Option<(BigInt, i64)> {
    let (significant, exp10, _) = reference_digits(bytes)?;
    let len = significant.len() as i64;
    if len <= 18 {
        return Some((significant.parse().ok()?, exp10));
    }
    let kept: BigInt = significant[..18].parse().ok()?;
    let dropped = significant[18..].bytes().any(|b| b != b'0');
    let kept = if up && dropped { kept + 1 } else { kept };
    Some((kept, exp10 + len - 18))
}

/// `a / b` for decimals given as digits and exponents: only the exponents' difference counts
/// (beyond ±2000, past every range, it is taken as ±2000).
fn ratio((a, ea): (BigInt, i64), (b, eb): (BigInt, i64)) -> Option<BigRational> {
    if b.is_zero() {
        return None;
    }
    let scale = rational("1", (ea - eb).clamp(-2000, 2000))?;
    Some(BigRational::new(a, b) * scale)
}

/// A decimal's digits and exponent, exactly.
fn parts_of(bytes: &[u8]) -> Option<(BigInt, i64)> {
    let (significant, exp10, zero) = reference_digits(bytes)?;
    if zero {
        return Some((BigInt::zero(), 0));
    }
    Some((significant.parse().ok()?, exp10))
}

fn int(n: u128) -> BigRational {
    BigRational::from_integer(BigInt::from(n))
}

/// `(tokens, period_s)` of a rate text, each a positive decimal, as bytes.
fn split_rate(rate: &[u8]) -> (&[u8], &[u8]) {
    match rate.iter().position(|&b| b == b'/') {
        Some(at) => (&rate[..at], &rate[at + 1..]),
        None => (rate, b"1"),
    }
}

/// T in ns for `tokens` every `period` (both in range): exact, or, when its reduced
/// denominator exceeds 2^62, from the decimals cut to 18 digits toward the slower rate
/// (never slower than 1e15 ns).
fn reference_t(tokens: &[u8], period: &[u8]) -> Option<BigRational> {
    let t = ratio(parts_of(period)?, parts_of(tokens)?)? * int(1_000_000_000);
    if t.denom() <= &BigInt::from(1u64 << 62) {
        return Some(t);
    }
    let t = ratio(round18(period, true)?, round18(tokens, false)?)? * int(1_000_000_000);
    Some(t.min(int(1_000_000_000_000_000)))
}

/// `(T ns, capacity, cost)` or the first argument at fault, from the documentation alone.
fn reference_acquire(
    rate: &[u8],
    capacity: &[u8],
    cost: Option<&[u8]>,
) -> Result<(BigRational, BigRational, BigRational), Error> {
    let (tokens, period) = split_rate(rate);
    let t = reference_limit(tokens, period, capacity, Error::Rate, Error::Capacity)?;
    if refill_too_long(&t.0, &t.1) {
        return Err(Error::RefillTime);
    }
    let cost = match cost {
        None => BigRational::one(),
        Some(bytes) => reference_decimal(bytes).ok_or(Error::Cost)?,
    };
    Ok((t.0, t.1, cost))
}

/// `(T ns, capacity)` of `tokens` every `period` seconds and a capacity text, or the error.
fn reference_limit(
    tokens: &[u8],
    period: &[u8],
    capacity: &[u8],
    rate_error: Error,
    capacity_error: Error,
) -> Result<(BigRational, BigRational), Error> {
    let n = parts_of(tokens).filter(|(n, _)| n.is_positive());
    let s = parts_of(period).filter(|(s, _)| s.is_positive());
    let (Some(n), Some(s)) = (n, s) else {
        return Err(rate_error);
    };
    let rate = ratio(n, s).ok_or(rate_error)?;
    if rate < BigRational::new(1.into(), 1_000_000.into()) || rate > int(1_000_000_000) {
        return Err(rate_error);
    }
    let capacity = reference_decimal(capacity)
        .filter(|c| c.is_positive() && *c <= int(1_000_000_000_000_000))
        .ok_or(capacity_error)?;
    let t = reference_t(tokens, period).ok_or(rate_error)?;
    Ok((t, capacity))
}

/// The limit's exact T and capacity, to compare with the reference.
fn exact(limit: &Limit) -> (BigRational, BigRational) {
    let (p, q) = limit.ns_per_token();
    (
        BigRational::new(BigInt::from(p), BigInt::from(q)),
        decimal(limit.capacity_exact()),
    )
}

fn decimal(d: Decimal) -> BigRational {
    let (digits, exp10) = d.parts();
    if digits == 0 {
        return BigRational::zero();
    }
    value(&digits.to_string(), i64::from(exp10))
}

/// Whether `capacity × T` (a full refill) is more than 100 years.
fn refill_too_long(t: &BigRational, capacity: &BigRational) -> bool {
    capacity * t > int(3_153_600_000 * 1_000_000_000)
}

/// A `throttle` integer: ASCII digits only, saturating at `u64::MAX` (callers range-check).
fn reference_integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(std::str::from_utf8(bytes).ok()?.parse().unwrap_or(u64::MAX))
}

/// `(T ns, capacity, cost, total)` of `RL.THROTTLE`, or the first argument at fault.
fn reference_throttle(
    max_burst: &[u8],
    count: &[u8],
    period: &[u8],
    quantity: Option<&[u8]>,
) -> Result<(BigRational, BigRational, BigRational, u64), Error> {
    let max_burst = reference_integer(max_burst)
        .filter(|&n| n <= 999_999_999_999_999)
        .ok_or(Error::MaxBurst)?;
    let count = reference_integer(count)
        .filter(|n| (1..=1_000_000_000).contains(n))
        .ok_or(Error::CountPerPeriod)?;
    let period = reference_integer(period)
        .filter(|n| (1..=3_153_600_000).contains(n))
        .ok_or(Error::Period)?;
    let cost = match quantity {
        None => BigRational::one(),
        Some(bytes) => int(u128::from(reference_integer(bytes).ok_or(Error::Quantity)?)),
    };
    let total = max_burst + 1;
    let rate = int(count.into()) / int(period.into());
    if rate < BigRational::new(1.into(), 1_000_000.into()) || rate > int(1_000_000_000) {
        return Err(Error::ThrottleRate);
    }
    let t = int(1_000_000_000) / rate;
    if refill_too_long(&t, &int(total.into())) {
        return Err(Error::ThrottleRefillTime);
    }
    Ok((t, int(total.into()), cost, total))
}

/// `(T ns, capacity, cost, total)` of `RL.GCRA`, or the first argument at fault.
fn reference_gcra(
    max_burst: &[u8],
    tokens: &[u8],
    period: &[u8],
    option: Option<(&[u8], Option<&[u8]>)>,
) -> Result<(BigRational, BigRational, BigRational, u64), Error> {
    let max_burst = reference_integer(max_burst)
        .filter(|&n| n <= 999_999_999_999_999)
        .ok_or(Error::MaxBurst)?;
    let tokens = reference_integer(tokens)
        .filter(|n| (1..=1_000_000_000_000_000).contains(n))
        .ok_or(Error::TokensPerPeriod)?;
    reference_decimal(period)
        .filter(|p| p.is_positive())
        .ok_or(Error::GcraPeriod)?;
    let cost = match option {
        None => BigRational::one(),
        Some((name, count)) => {
            if !name.eq_ignore_ascii_case(b"tokens") {
                return Err(Error::GcraOption);
            }
            int(reference_integer(count.ok_or(Error::TokensMissing)?)
                .ok_or(Error::Tokens)?
                .into())
        }
    };
    // The rate tokens / period on the exact values, never a period rounded to whole ns.
    let total = max_burst + 1;
    let tokens_text = tokens.to_string();
    let total_text = total.to_string();
    let (t, capacity) = reference_limit(
        tokens_text.as_bytes(),
        period,
        total_text.as_bytes(),
        Error::GcraRate,
        Error::MaxBurst,
    )?;
    if refill_too_long(&t, &capacity) {
        return Err(Error::GcraRefillTime);
    }
    Ok((t, capacity, cost, total))
}

/// `(full_at_ns, full_at_frac)` or the argument at fault: ASCII digits only (any number of
/// leading zeros), `full_at_ns` in `1..=i64::MAX`, `full_at_frac` (0 when absent) in
/// `0..=i64::MAX`. Checked in order: a bad `full_at_ns` is named first.
fn reference_state(ns: &[u8], frac: Option<&[u8]>) -> Result<(u64, u64), Error> {
    let ns = reference_integer(ns)
        .filter(|n| (1..=MAX_FULL_AT_NS).contains(n))
        .ok_or(Error::FullAt)?;
    let frac = match frac {
        None => 0,
        Some(bytes) => reference_integer(bytes)
            .filter(|&f| f <= MAX_FULL_AT_FRAC)
            .ok_or(Error::FullAtFrac)?,
    };
    if (1..=MAX_FULL_AT_NS).contains(&ns) {
        Ok((ns, frac))
    } else {
        Err(Error::FullAt)
    }
}

fn check_state(ns: &[u8], frac: Option<&[u8]>) {
    let got = args::state(ns, frac).map(|s| (s.full_at_ns(), s.full_at_frac()));
    if let Ok((n, f)) = got {
        assert!((1..=i64::MAX as u64).contains(&n) && f <= i64::MAX as u64);
    }
    assert_eq!(got, reference_state(ns, frac), "state({ns:?}, {frac:?})");
}

fn check_acquire(rate: &[u8], capacity: &[u8], cost: Option<&[u8]>) {
    let got = args::acquire(rate, capacity, cost);
    if let Ok(a) = got {
        // On the exact values: a double can round a tiny capacity to 0, or a rate N/S just
        // outside its range.
        let (t, c) = exact(&a.limit);
        assert!(t >= int(1) && t <= int(1_000_000_000_000_000), "T {t} ns");
        assert!(
            c.is_positive() && c <= int(1_000_000_000_000_000),
            "capacity {c}"
        );
        assert!(!refill_too_long(&t, &c), "refill {c} × {t}");
        assert!(!decimal(a.cost.exact()).is_negative(), "cost");
    }
    match (got, reference_acquire(rate, capacity, cost)) {
        (Ok(a), Ok((t, c, k))) => {
            assert_eq!(exact(&a.limit), (t, c), "{rate:?} {capacity:?}");
            assert_eq!(decimal(a.cost.exact()), k, "cost {cost:?}");
        }
        (Err(e), Err(want)) => assert_eq!(e, want, "{rate:?} {capacity:?} {cost:?}"),
        (got, want) => {
            panic!("acquire({rate:?}, {capacity:?}, {cost:?}) = {got:?}, reference {want:?}")
        }
    }
}

fn check_throttle(max_burst: &[u8], count: &[u8], period: &[u8], quantity: Option<&[u8]>) {
    let got = args::throttle(max_burst, count, period, quantity);
    match (got, reference_throttle(max_burst, count, period, quantity)) {
        (Ok(t), Ok((ns, c, k, total))) => {
            assert_eq!(exact(&t.limit), (ns, c), "limit");
            assert_eq!(decimal(t.cost.exact()), k, "quantity");
            assert_eq!(t.total, total, "total");
        }
        (Err(e), Err(want)) => assert_eq!(e, want, "{max_burst:?} {count:?} {period:?} {quantity:?}"),
        (got, want) => panic!(
            "throttle({max_burst:?}, {count:?}, {period:?}, {quantity:?}) = {got:?}, reference {want:?}"
        ),
    }
}

fn check_gcra(max_burst: &[u8], tokens: &[u8], period: &[u8], option: Option<&[u8]>) {
    // The option as a command line gives it: a name, then (after a NUL) a count.
    let option = option.map(|o| match o.iter().position(|&b| b == 0) {
        Some(at) => (&o[..at], Some(&o[at + 1..])),
        None => (o, None),
    });
    let got = args::gcra(max_burst, tokens, period, option);
    match (got, reference_gcra(max_burst, tokens, period, option)) {
        (Ok(t), Ok((ns, c, k, total))) => {
            assert_eq!(exact(&t.limit), (ns, c), "limit");
            assert_eq!(decimal(t.cost.exact()), k, "count");
            assert_eq!(t.total, total, "total");
        }
        (Err(e), Err(want)) => {
            assert_eq!(e, want, "{max_burst:?} {tokens:?} {period:?} {option:?}")
        }
        (got, want) => panic!(
            "gcra({max_burst:?}, {tokens:?}, {period:?}, {option:?}) = {got:?}, reference {want:?}"
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    let parts: Vec<&[u8]> = data.splitn(4, |&b| b == 0).collect();
    for part in &parts {
        check_state(part, None);
    }
    for pair in parts.windows(2) {
        check_state(pair[0], Some(pair[1]));
    }
    match parts[..] {
        [rate, capacity] => check_acquire(rate, capacity, None),
        [a, b, c] => {
            check_acquire(a, b, Some(c));
            check_throttle(a, b, c, None);
            check_gcra(a, b, c, None);
        }
        [a, b, c, d] => {
            check_acquire(a, b, Some(c));
            check_throttle(a, b, c, Some(d));
            check_gcra(a, b, c, Some(d));
        }
        _ => {}
    }
});
