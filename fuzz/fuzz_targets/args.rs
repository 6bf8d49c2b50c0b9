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
//!   capacity / rate at most 100 years, cost finite and >= 0, full_at_ns in 1..=i64::MAX,
//!   full_at_frac in 0..=i64::MAX;
//! - the parsers agree exactly (same value, same error, same argument named) with a reference
//!   written from their documentation: a plain decimal is what Rust's `f64` parser accepts
//!   from the characters `0-9 . + - e E`, when finite; a throttle integer is digits only,
//!   saturating at `u64::MAX`, as are `full_at_ns` and `full_at_frac` (leading zeros allowed);
//!   a throttle limit is exactly `count` tokens per `period` seconds (`T = period × 1e9 /
//!   count` ns in lowest terms).
//!   That also cross-checks the integer fast path of the decimal parser against the general
//!   one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rl::args;
use redis_rl::bucket::{
    MAX_CAPACITY, MAX_FULL_AT_FRAC, MAX_FULL_AT_NS, MAX_RATE_PER_S, MAX_REFILL_S, MIN_RATE_PER_S,
};
use redis_rl::error::Error;

/// A finite decimal as documented: digits, '.', sign and exponent only; no "inf" or "nan".
fn reference_decimal(bytes: &[u8]) -> Option<f64> {
    if !bytes
        .iter()
        .all(|b| b.is_ascii_digit() || b".+-eE".contains(b))
    {
        return None;
    }
    let value: f64 = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    value.is_finite().then_some(value)
}

/// `(rate, capacity, cost)` or the first argument at fault, from the documentation alone.
fn reference_acquire(
    rate: &[u8],
    capacity: &[u8],
    cost: Option<&[u8]>,
) -> Result<(f64, f64, f64), Error> {
    let rate = reference_decimal(rate)
        .filter(|r| (MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(r))
        .ok_or(Error::Rate)?;
    let capacity = reference_decimal(capacity)
        .filter(|c| *c > 0.0 && *c <= MAX_CAPACITY)
        .ok_or(Error::Capacity)?;
    if capacity / rate > MAX_REFILL_S {
        return Err(Error::RefillTime);
    }
    let cost = match cost {
        None => 1.0,
        Some(bytes) => reference_decimal(bytes)
            .filter(|c| *c >= 0.0)
            .ok_or(Error::Cost)?,
    };
    Ok((rate, capacity, cost))
}

/// A `throttle` integer: ASCII digits only, saturating at `u64::MAX` (callers range-check).
fn reference_integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(std::str::from_utf8(bytes).ok()?.parse().unwrap_or(u64::MAX))
}

/// `(rate, capacity, cost, total)` of `RL.THROTTLE`, or the first argument at fault.
fn reference_throttle(
    max_burst: &[u8],
    count: &[u8],
    period: &[u8],
    quantity: Option<&[u8]>,
) -> Result<(f64, f64, f64, u64), Error> {
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
        None => 1.0,
        Some(bytes) => reference_integer(bytes).ok_or(Error::Quantity)? as f64,
    };
    // The rate as documented, tokens × 1e9 / period_ns; its range is checked exactly.
    let period_ns = period.saturating_mul(1_000_000_000);
    let rate = count as f64 * 1e9 / period_ns as f64;
    let total = max_burst + 1;
    let scaled = u128::from(count) * 1_000_000_000;
    if scaled * 1_000_000 < u128::from(period_ns) || scaled > u128::from(period_ns) * 1_000_000_000
    {
        return Err(Error::ThrottleRate);
    }
    if total as f64 / rate > MAX_REFILL_S {
        return Err(Error::ThrottleRefillTime);
    }
    Ok((rate, total as f64, cost, total))
}

/// `(rate, capacity, cost, total)` of `RL.GCRA`, or the first argument at fault.
fn reference_gcra(
    max_burst: &[u8],
    tokens: &[u8],
    period: &[u8],
    option: Option<(&[u8], Option<&[u8]>)>,
) -> Result<(f64, f64, f64, u64), Error> {
    let max_burst = reference_integer(max_burst)
        .filter(|&n| n <= 999_999_999_999_999)
        .ok_or(Error::MaxBurst)?;
    let tokens = reference_integer(tokens)
        .filter(|n| (1..=1_000_000_000_000_000).contains(n))
        .ok_or(Error::TokensPerPeriod)?;
    let period = reference_decimal(period)
        .filter(|p| *p > 0.0)
        .ok_or(Error::GcraPeriod)?;
    let cost = match option {
        None => 1.0,
        Some((name, count)) => {
            if !name.eq_ignore_ascii_case(b"tokens") {
                return Err(Error::GcraOption);
            }
            reference_integer(count.ok_or(Error::TokensMissing)?).ok_or(Error::Tokens)? as f64
        }
    };
    // The period to the nearest ns; T = period_ns / tokens exactly, range-checked exactly.
    let period_ns = (period * 1e9).round() as u64;
    let total = max_burst + 1;
    let scaled = u128::from(tokens) * 1_000_000_000;
    if period_ns == 0
        || scaled * 1_000_000 < u128::from(period_ns)
        || scaled > u128::from(period_ns) * 1_000_000_000
    {
        return Err(Error::GcraRate);
    }
    let rate = tokens as f64 * 1e9 / period_ns as f64;
    if total as f64 / rate > MAX_REFILL_S {
        return Err(Error::GcraRefillTime);
    }
    Ok((rate, total as f64, cost, total))
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
        let (r, c, k) = (a.limit.rate_per_s(), a.limit.capacity(), a.cost.tokens());
        assert!((1e-6..=1e9).contains(&r), "rate {r}");
        assert!(c > 0.0 && c <= 1e15, "capacity {c}");
        assert!(k.is_finite() && k >= 0.0, "cost {k}");
        assert!(c / r <= 3_153_600_000.0, "refill {c} / {r}");
    }
    match (got, reference_acquire(rate, capacity, cost)) {
        (Ok(a), Ok((r, c, k))) => {
            // Bit-for-bit: the fast path must round exactly as the general parser.
            assert_eq!(a.limit.rate_per_s().to_bits(), r.to_bits(), "rate {rate:?}");
            assert_eq!(
                a.limit.capacity().to_bits(),
                c.to_bits(),
                "capacity {capacity:?}"
            );
            assert_eq!(a.cost.tokens().to_bits(), k.to_bits(), "cost {cost:?}");
        }
        (Err(e), Err(want)) => assert_eq!(e, want, "{rate:?} {capacity:?} {cost:?}"),
        (got, want) => {
            panic!("acquire({rate:?}, {capacity:?}, {cost:?}) = {got:?}, reference {want:?}")
        }
    }
}

fn check_throttle(max_burst: &[u8], count: &[u8], period: &[u8], quantity: Option<&[u8]>) {
    let got = args::throttle(max_burst, count, period, quantity);
    if let Ok(t) = got {
        let (r, c, k) = (t.limit.rate_per_s(), t.limit.capacity(), t.cost.tokens());
        assert!((1e-6..=1e9).contains(&r), "rate {r}");
        assert!((1.0..=1e15).contains(&c) && c == c.floor(), "capacity {c}");
        assert!(k.is_finite() && k >= 0.0 && k == k.floor(), "quantity {k}");
        assert!(c / r <= 3_153_600_000.0, "refill {c} / {r}");
        assert_eq!(t.total as f64, c, "total");
    }
    match (got, reference_throttle(max_burst, count, period, quantity)) {
        (Ok(t), Ok((r, c, k, total))) => {
            assert_eq!(t.limit.rate_per_s().to_bits(), r.to_bits(), "rate");
            // T = period × 1e9 / count ns exactly, in lowest terms.
            let (count, period_ns) = (
                reference_integer(count).unwrap_or(0),
                reference_integer(period).unwrap_or(0) * 1_000_000_000,
            );
            let g = gcd(period_ns, count);
            assert_eq!(
                t.limit.ns_per_token(),
                (u128::from(period_ns / g), count / g),
                "T of {count} per {period_ns} ns"
            );
            assert_eq!(t.limit.capacity().to_bits(), c.to_bits(), "capacity");
            assert_eq!(t.cost.tokens().to_bits(), k.to_bits(), "quantity");
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
    if let Ok(t) = got {
        let (r, c, k) = (t.limit.rate_per_s(), t.limit.capacity(), t.cost.tokens());
        assert!((1e-6..=1e9).contains(&r), "rate {r}");
        assert!((1.0..=1e15).contains(&c) && c == c.floor(), "capacity {c}");
        assert!(k.is_finite() && k >= 0.0 && k == k.floor(), "count {k}");
        assert!(c / r <= 3_153_600_000.0, "refill {c} / {r}");
        assert_eq!(t.total as f64, c, "total");
    }
    match (got, reference_gcra(max_burst, tokens, period, option)) {
        (Ok(t), Ok((r, c, k, total))) => {
            assert_eq!(t.limit.rate_per_s().to_bits(), r.to_bits(), "rate");
            assert_eq!(t.limit.capacity().to_bits(), c.to_bits(), "capacity");
            assert_eq!(t.cost.tokens().to_bits(), k.to_bits(), "count");
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

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
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
