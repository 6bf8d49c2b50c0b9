//! Argument parsing and validation: one function per command, each error naming its argument.
//!
//! Works on raw bytes, so non-UTF-8 input is an ordinary parse error. Nothing here touches a
//! key; handlers parse everything first.

use crate::bucket::{Cost, Limit, LimitError, State, MAX_RATE_PER_S, MIN_RATE_PER_S};
use crate::error::Error;

/// `RL.ACQUIRE key rate capacity [cost]`, past the key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Acquire {
    /// The validated rate and capacity.
    pub limit: Limit,
    /// Tokens to take; 1 when omitted.
    pub cost: Cost,
}

/// Parses `rate capacity [cost]`.
///
/// # Errors
/// [`Error::Rate`], [`Error::Capacity`] or [`Error::Cost`], for the first argument at fault.
pub fn acquire(rate: &[u8], capacity: &[u8], cost: Option<&[u8]>) -> Result<Acquire, Error> {
    // Range-check the rate before reading the capacity, so the first bad argument is named.
    let rate_per_s = decimal(rate)
        .filter(|r| (MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(r))
        .ok_or(Error::Rate)?;
    let capacity = decimal(capacity).ok_or(Error::Capacity)?;
    let limit = Limit::new(rate_per_s, capacity).map_err(|e| match e {
        LimitError::Rate => Error::Rate,
        LimitError::Capacity => Error::Capacity,
        LimitError::RefillTime => Error::RefillTime,
    })?;
    let cost = match cost {
        None => Cost::ONE,
        Some(bytes) => decimal(bytes).and_then(Cost::new).ok_or(Error::Cost)?,
    };
    Ok(Acquire { limit, cost })
}

/// Parses the `full_at_ns` of `RL.SETSTATE`: a plain decimal integer, no sign, no junk.
///
/// # Errors
/// [`Error::FullAt`] unless it is an integer in `1..=i64::MAX`.
pub fn full_at_ns(bytes: &[u8]) -> Result<State, Error> {
    if bytes.is_empty() || bytes.len() > 19 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(Error::FullAt);
    }
    let value = bytes
        .iter()
        .try_fold(0u64, |acc, &b| {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        })
        .ok_or(Error::FullAt)?;
    State::from_full_at_ns(value).ok_or(Error::FullAt)
}

/// A finite decimal such as `0.5`, `100` or `2.5e3`. `None` for anything else: empty input,
/// whitespace, trailing junk, `nan`, `inf`, and values that overflow to infinity.
fn decimal(bytes: &[u8]) -> Option<f64> {
    // Fast path for the common case, plain integers: up to 15 digits convert exactly.
    if !bytes.is_empty() && bytes.len() <= 15 && bytes.iter().all(u8::is_ascii_digit) {
        let value = bytes
            .iter()
            .fold(0u64, |acc, &b| acc * 10 + u64::from(b - b'0'));
        return Some(value as f64);
    }
    // Rust's float grammar would also take "inf", "NaN" and "infinity"; allowing only these
    // characters keeps the grammar to plain decimals.
    if !bytes
        .iter()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'))
    {
        return None;
    }
    let value: f64 = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    value.is_finite().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_accept_plain_forms_only() {
        let rows: &[(&[u8], Option<f64>)] = &[
            (b"0.5", Some(0.5)),      // fraction
            (b"100", Some(100.0)),    // integer
            (b"2.5e3", Some(2500.0)), // exponent
            (b"1E2", Some(100.0)),
            (b"007", Some(7.0)), // leading zeros, integer fast path
            (b"999999999999999", Some(999999999999999.0)), // longest fast-path integer
            (b"1000000000000000", Some(1e15)), // 16 digits: the general parser    // upper-case exponent
            (b".5", Some(0.5)),                // no leading digit
            (b"", None),                       // empty
            (b" 1", None),                     // leading space
            (b"1 ", None),                     // trailing space
            (b"1x", None),                     // trailing junk
            (b"nan", None),                    // NaN spelled out
            (b"inf", None),                    // infinity spelled out
            (b"1e999", None),                  // overflows to infinity
            (b"0x10", None),                   // hex
            (b"1,5", None),                    // locale comma
            (b"1..2", None),                   // two points
            (b"\xff", None),                   // not UTF-8
        ];
        for (input, want) in rows {
            assert_eq!(
                decimal(input),
                *want,
                "input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn acquire_names_the_first_bad_argument() {
        assert_eq!(acquire(b"x", b"x", Some(b"x")).unwrap_err(), Error::Rate);
        assert_eq!(
            acquire(b"1", b"0", Some(b"x")).unwrap_err(),
            Error::Capacity
        );
        assert_eq!(acquire(b"1", b"1", Some(b"-1")).unwrap_err(), Error::Cost);
        // A parseable but out-of-range rate is still the first bad argument.
        assert_eq!(acquire(b"0", b"x", None).unwrap_err(), Error::Rate);
        let ok = acquire(b"5", b"10", None).unwrap();
        assert_eq!(ok.cost, Cost::ONE);
        assert_eq!(ok.limit.capacity(), 10.0);
    }

    #[test]
    fn full_at_is_a_bounded_integer() {
        assert!(full_at_ns(b"1").is_ok());
        assert!(full_at_ns(b"9223372036854775807").is_ok());
        for bad in [
            &b""[..],
            b"0",
            b"-1",
            b"+1",
            b"1.0",
            b"9223372036854775808",
            b"99999999999999999999",
            b"1 ",
        ] {
            assert_eq!(
                full_at_ns(bad),
                Err(Error::FullAt),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
