//! The tick: `T = 1e9 / rate` nanoseconds per token as an exact fraction
//! `ticks_per_token / ticks_per_ns`, reduced from the rate's decimals, and the integer
//! helpers the tick math shares (time units, a fast division).
//!
//! Pure integer arithmetic on [`Decimal`]s: knows nothing of limits, states or decisions
//! (they are built on it), and nothing of Redis or a clock.

use crate::decimal::Decimal;

pub(crate) const NS_PER_US: u64 = 1_000;
pub(crate) const NS_PER_MS: u64 = 1_000_000;
/// The finest tick, 2^-62 ns: the stored fraction (units of 2^-63 ns) is reversible only for
/// denominators below 2^63.
pub(crate) const MAX_TICKS_PER_NS: u64 = 1 << 62;

/// `T = 1e9 × period_s / tokens` ns as `(numerator, denominator)` in lowest terms, for a rate
/// in range; `None` when the denominator exceeds [`MAX_TICKS_PER_NS`].
///
/// With `period_s = s × 10^a` and `tokens = n × 10^b`, `T = s × 10^k / n` for
/// `k = 9 + a - b`. After dividing out `gcd(s, n)`, only the twos and fives of `10^k` can
/// cancel against the other side, so the reduction is a gcd and two short loops.
pub(crate) fn ns_per_token(tokens: Decimal, period_s: Decimal) -> Option<(u128, u64)> {
    let (s, n) = (period_s.digits(), tokens.digits());
    let g = gcd(s, n);
    let (mut p, mut q) = (s.checked_div(g)?, n.checked_div(g)?);
    let k = 9 + i64::from(period_s.exp10()) - i64::from(tokens.exp10());
    let k_abs = u32::try_from(k.unsigned_abs()).ok()?;
    // 10^k on the side its sign puts it; what it cancels on the other side first.
    let (top, bottom) = if k >= 0 {
        (&mut p, &mut q)
    } else {
        (&mut q, &mut p)
    };
    let twos = bottom.trailing_zeros().min(k_abs);
    *bottom >>= twos;
    let mut fives = 0;
    while fives < k_abs && *bottom % 5 == 0 {
        *bottom /= 5;
        fives += 1;
    }
    *top = top
        .checked_mul(2u128.checked_pow(k_abs - twos)?)?
        .checked_mul(5u128.checked_pow(k_abs - fives)?)?;
    let q = u64::try_from(q).ok().filter(|&q| q <= MAX_TICKS_PER_NS)?;
    Some((p, q))
}

/// `(n / d, n % d)` for `d > 0`, in 64-bit arithmetic when both fit (the usual case, and
/// several times faster than a 128-bit division), and `d == 1` for free.
pub(crate) fn div_rem(n: u128, d: u128) -> (u128, u128) {
    if d == 1 {
        return (n, 0);
    }
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) if d > 0 => (u128::from(n / d), u128::from(n % d)),
        _ => (n.checked_div(d).unwrap_or(0), n.checked_rem(d).unwrap_or(0)),
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
