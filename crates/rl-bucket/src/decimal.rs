//! Exact decimals: the numbers users type (`0.1`, `2.5e3`, `100`), parsed from their text and
//! never through a double, and the few exact operations the bucket needs on them (compare,
//! multiply an integer and round, keep fewer digits).
//!
//! Pure integer arithmetic; no Redis, no floating point except [`Decimal::to_f64`], which only
//! reports a value.

use std::cmp::Ordering;
use std::fmt::Write;

/// The most significant digits a [`Decimal`] holds: every 38-digit integer fits in `u128`.
pub const MAX_DIGITS: u32 = 38;

/// A non-negative decimal `digits × 10^exp10`, exactly. Normalized: `digits` has no trailing
/// zeros (zero is `0 × 10^0`), so equal values are equal structs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decimal {
    digits: u128,
    exp10: i32,
}

/// Which way an inexact result rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Round {
    Down,
    Up,
}

/// The largest exponent magnitude a decimal may have, `10^±999999999`: far beyond every range,
/// and small enough that sums of two exponents and a digit count fit an `i32`. Beyond it the
/// text is refused, never clamped: a clamped exponent would change the ratio `N/S` of two huge
/// (or tiny) decimals.
pub const MAX_EXP10: i64 = 999_999_999;
/// Exponent digits are read saturating here, safely past [`MAX_EXP10`].
const EXP_SATURATE: i64 = 1 << 40;

impl Decimal {
    /// Zero.
    pub const ZERO: Decimal = Decimal {
        digits: 0,
        exp10: 0,
    };
    /// One.
    pub const ONE: Decimal = Decimal {
        digits: 1,
        exp10: 0,
    };

    /// `digits × 10^exp10`, normalized.
    pub fn new(digits: u128, exp10: i32) -> Decimal {
        if digits == 0 {
            return Decimal::ZERO;
        }
        let mut d = Decimal { digits, exp10 };
        while d.digits % 10 == 0 {
            d.digits /= 10;
            d.exp10 = d.exp10.saturating_add(1);
        }
        d
    }

    /// Parses a plain decimal: an optional `+`, digits with at most one `.` (at least one digit
    /// on either side), and an optional exponent `e`/`E` with an optional sign. `-` is taken
    /// only for zero (`-0` is 0, as the double parser took it). `None` for anything else:
    /// empty input, whitespace, `inf`, `nan`, hex, a negative number, more than
    /// [`MAX_DIGITS`] significant digits (leading and trailing zeros do not count), or a
    /// nonzero value beyond `10^±999999999` ([`MAX_EXP10`]).
    pub fn parse(bytes: &[u8]) -> Option<Decimal> {
        let (negative, rest) = match bytes.split_first() {
            Some((b'+', rest)) => (false, rest),
            Some((b'-', rest)) => (true, rest),
            _ => (false, bytes),
        };
        let (mantissa, exponent) = match rest.iter().position(|&b| b == b'e' || b == b'E') {
            Some(at) => (rest.get(..at)?, Some(rest.get(at + 1..)?)),
            None => (rest, None),
        };
        let (int_part, frac_part) = match mantissa.iter().position(|&b| b == b'.') {
            Some(at) => (mantissa.get(..at)?, mantissa.get(at + 1..)?),
            None => (mantissa, &[][..]),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return None;
        }
        let mut digits: u128 = 0;
        let mut len: u32 = 0;
        // Zeros after the last nonzero digit: they join `digits` only if another nonzero
        // digit follows, so a value is stored without trailing zeros.
        let mut zeros: i64 = 0;
        for &b in int_part.iter().chain(frac_part) {
            if !b.is_ascii_digit() {
                return None;
            }
            if b == b'0' {
                zeros += i64::from(len > 0);
                continue;
            }
            let need = u32::try_from(i64::from(len) + zeros + 1).ok()?;
            if need > MAX_DIGITS {
                return None;
            }
            // need <= 38, so the shifted value stays below 10^38 < u128::MAX.
            digits = digits * pow10(u32::try_from(zeros + 1).ok()?)? + u128::from(b - b'0');
            len = need;
            zeros = 0;
        }
        let exponent = match exponent {
            None => 0,
            Some(text) => {
                let (sign, text) = match text.split_first() {
                    Some((b'+', rest)) => (1, rest),
                    Some((b'-', rest)) => (-1, rest),
                    _ => (1, text),
                };
                if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                sign * text.iter().fold(0i64, |acc, &b| {
                    (acc * 10 + i64::from(b - b'0')).min(EXP_SATURATE)
                })
            }
        };
        if digits == 0 {
            return Some(Decimal::ZERO);
        }
        if negative {
            return None;
        }
        let frac_len = i64::try_from(frac_part.len()).ok()?;
        let exp10 = zeros + exponent - frac_len;
        if exp10.abs() > MAX_EXP10 {
            return None;
        }
        Some(Decimal {
            digits,
            exp10: i32::try_from(exp10).ok()?,
        })
    }

    /// The exact value of a finite double `>= 0` as the shortest decimal that reads back as
    /// it (what `Display` prints, and what the client libraries send); `None` for NaN,
    /// infinities and negative numbers.
    pub fn from_f64(x: f64) -> Option<Decimal> {
        if !x.is_finite() || x < 0.0 {
            return None;
        }
        let mut buf = Buf::default();
        write!(buf, "{x:e}").ok()?;
        Decimal::parse(buf.bytes())
    }

    /// An integer.
    pub fn from_int(n: u128) -> Decimal {
        Decimal::new(n, 0)
    }

    /// The nearest double, for display and for callers that want a float. Not used by the
    /// bucket's math.
    pub fn to_f64(self) -> f64 {
        let mut buf = Buf::default();
        if write!(buf, "{}e{}", self.digits, self.exp10).is_err() {
            return f64::NAN;
        }
        std::str::from_utf8(buf.bytes())
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Whether this is zero.
    pub fn is_zero(self) -> bool {
        self.digits == 0
    }

    /// `self × 10^by`.
    pub(crate) fn shifted(self, by: i32) -> Decimal {
        if self.digits == 0 {
            return self;
        }
        Decimal {
            digits: self.digits,
            exp10: self.exp10.saturating_add(by),
        }
    }

    /// `(digits, exp10)`: the value is `digits × 10^exp10`, with no trailing zeros in
    /// `digits` (zero is `(0, 0)`).
    pub fn parts(self) -> (u128, i32) {
        (self.digits, self.exp10)
    }

    pub(crate) fn digits(self) -> u128 {
        self.digits
    }

    pub(crate) fn exp10(self) -> i32 {
        self.exp10
    }

    /// At most `keep` significant digits, rounded `round`.
    pub(crate) fn round_to(self, keep: u32, round: Round) -> Decimal {
        let len = digit_count(self.digits);
        let Some(scale) = len.checked_sub(keep).filter(|&n| n > 0).and_then(pow10) else {
            return self;
        };
        let mut kept = self.digits / scale;
        if round == Round::Up && self.digits % scale != 0 {
            kept += 1;
        }
        let drop = i32::try_from(len - keep).unwrap_or(0);
        Decimal::new(kept, self.exp10.saturating_add(drop))
    }

    /// `floor` or `ceil` of `a × self`; `None` when it does not fit in `u128`.
    pub(crate) fn mul_round(self, a: u128, round: Round) -> Option<u128> {
        if a == 0 || self.digits == 0 {
            return Some(0);
        }
        if self.exp10 >= 0 {
            let scale = pow10(self.exp10.unsigned_abs())?;
            return a.checked_mul(self.digits)?.checked_mul(scale);
        }
        let k = self.exp10.unsigned_abs();
        // The usual case: the product fits, and so does the divisor.
        if let (Some(product), Some(scale)) = (a.checked_mul(self.digits), pow10(k)) {
            let (q, r) = (product / scale, product % scale);
            return q.checked_add(u128::from(round == Round::Up && r != 0));
        }
        let (q, inexact) = Wide::mul(a, self.digits).div_pow10(k);
        let q = q.to_u128()?;
        q.checked_add(u128::from(round == Round::Up && inexact))
    }
}

impl PartialOrd for Decimal {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Decimal {
    fn cmp(&self, other: &Self) -> Ordering {
        // Same exponent (integers, the usual case): compare the digits.
        if self.exp10 == other.exp10 || self.digits == 0 || other.digits == 0 {
            return self.digits.cmp(&other.digits);
        }
        let (la, lb) = (digit_count(self.digits), digit_count(other.digits));
        let ma = i64::from(la) + i64::from(self.exp10);
        let mb = i64::from(lb) + i64::from(other.exp10);
        if ma != mb {
            return ma.cmp(&mb);
        }
        // Same magnitude: align to the longer one's digit count (at most 38 digits, fits).
        let (a, b) = if la < lb {
            (self.digits * pow10(lb - la).unwrap_or(1), other.digits)
        } else {
            (self.digits, other.digits * pow10(la - lb).unwrap_or(1))
        };
        a.cmp(&b)
    }
}

/// `10^n`, or `None` past `u128`.
pub(crate) fn pow10(n: u32) -> Option<u128> {
    POW10.get(usize::try_from(n).ok()?).copied()
}

/// `10^n` for every `n` whose power fits a `u128` (0 to 38): a lookup where `checked_pow`
/// multiplies in a loop. Indexed and multiplied at compile time, where an index out of range
/// or an overflow fails the build.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
const POW10: [u128; 39] = {
    let mut table = [1u128; 39];
    let mut n = 1;
    while n < table.len() {
        table[n] = table[n - 1] * 10;
        n += 1;
    }
    table
};

/// Decimal digits of `n`; 1 for 0.
fn digit_count(n: u128) -> u32 {
    n.checked_ilog10().map_or(1, |l| l + 1)
}

/// A 256-bit unsigned integer, little-endian 64-bit limbs: just enough for `u128 × u128`
/// divided by a power of ten.
struct Wide([u64; 4]);

impl Wide {
    fn mul(a: u128, b: u128) -> Wide {
        let (a0, a1) = (a as u64, (a >> 64) as u64);
        let (b0, b1) = (b as u64, (b >> 64) as u64);
        let mut limbs = [0u64; 4];
        for (i, &x) in [a0, a1].iter().enumerate() {
            let mut carry: u128 = 0;
            for (j, &y) in [b0, b1].iter().enumerate() {
                let Some(limb) = limbs.get_mut(i + j) else {
                    continue;
                };
                let t = u128::from(x) * u128::from(y) + u128::from(*limb) + carry;
                *limb = t as u64;
                carry = t >> 64;
            }
            if let Some(limb) = limbs.get_mut(i + 2) {
                *limb = carry as u64;
            }
        }
        Wide(limbs)
    }

    /// `self / d` and whether there was a remainder.
    fn div_small(&mut self, d: u64) -> bool {
        let mut rem: u128 = 0;
        for limb in self.0.iter_mut().rev() {
            let cur = (rem << 64) | u128::from(*limb);
            *limb = (cur / u128::from(d)) as u64;
            rem = cur % u128::from(d);
        }
        rem != 0
    }

    /// `self / 10^k` (truncated) and whether it was inexact.
    fn div_pow10(mut self, mut k: u32) -> (Wide, bool) {
        let mut inexact = false;
        while k > 0 {
            if self.0 == [0; 4] {
                break;
            }
            let step = k.min(19);
            let divisor = 10u64.pow(step);
            inexact |= self.div_small(divisor);
            k -= step;
        }
        (self, inexact)
    }

    fn to_u128(&self) -> Option<u128> {
        let [l0, l1, l2, l3] = self.0;
        (l2 == 0 && l3 == 0).then_some(u128::from(l0) | (u128::from(l1) << 64))
    }
}

/// A stack buffer for formatting a number without allocating.
struct Buf {
    bytes: [u8; 64],
    len: usize,
}

impl Default for Buf {
    fn default() -> Self {
        Buf {
            bytes: [0; 64],
            len: 0,
        }
    }
}

impl Buf {
    fn bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }
}

impl Write for Buf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let dest = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dest.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}
