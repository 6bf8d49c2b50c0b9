//! The step that settles a reservation: a take sized by an estimate ([`acquire`](crate::acquire)
//! with the estimate as its cost) is settled once the actual cost is known. [`settle`] gives
//! back what was over-estimated, capped and rounded as [`refund`](crate::refund) gives back,
//! or charges what was under-estimated as [`charge`](crate::charge) charges, into debt and
//! within its bound. The difference is taken exactly, on the decimals typed, before either
//! step rounds it once.
//!
//! Never reads a clock and knows nothing of Redis, nor of where a reservation's record lives:
//! the caller keeps the estimate and makes sure a reservation is settled at most once.

use crate::charge::{charge, report, ChargeError};
use crate::cost::Cost;
use crate::decimal::{pow10, Decimal};
use crate::decision::{Change, Charged};
use crate::limit::Limit;
use crate::refund::refund;
use crate::state::State;

/// `a - b` exactly when `a >= b`, `None` if the aligned digits do not fit (decimals whose
/// exponents lie more than 38 digits apart).
fn difference(a: Decimal, b: Decimal) -> Option<Decimal> {
    let ((a_digits, a_exp), (b_digits, b_exp)) = (a.parts(), b.parts());
    if b_digits == 0 {
        return Some(a);
    }
    let exp = a_exp.min(b_exp);
    let align = |digits: u128, from: i32| -> Option<u128> {
        let places = u32::try_from(from.checked_sub(exp)?).ok()?;
        if places == 0 {
            return Some(digits);
        }
        let pow = pow10(places)?;
        // Both within 64 bits (the usual case): the product fits, one multiplication.
        match (u64::try_from(digits), u64::try_from(pow)) {
            (Ok(digits), Ok(pow)) => Some(u128::from(digits) * u128::from(pow)),
            _ => digits.checked_mul(pow),
        }
    };
    let diff = align(a_digits, a_exp)?.checked_sub(align(b_digits, b_exp)?)?;
    Some(Decimal::new(diff, exp))
}

/// Settles a reservation of `estimate` tokens with the `actual` cost at `now_us`: gives back
/// `estimate - actual` when that is positive (capped at capacity and rounded down to a tick,
/// as a refund), charges `actual - estimate` when that is positive (into debt, as a charge),
/// and reports the bucket after it in [`charge`]'s terms: the signed balance, the wait until
/// any debt is repaid, the wait until full. Never reads a clock.
///
/// ```
/// use rl_bucket::{acquire, settle, Cost, Limit};
///
/// let limit = Limit::new(1.0, 10.0).unwrap(); // 1 token/s, burst of 10
/// let estimate = Cost::new(4.0).unwrap();
/// let (reserved, state) = acquire(&limit, None, 0, estimate);
/// assert_eq!(reserved.remaining, 6);
/// // It used 1: 3 go back, 9 are left, full in 1 s.
/// let (settled, _) = settle(&limit, state, 0, estimate, Cost::new(1.0).unwrap()).unwrap();
/// assert_eq!((settled.balance, settled.reset_after_ms()), (9, 1_000));
/// // Had it used 13, the 9 more would leave it 3 in debt.
/// let (settled, _) = settle(&limit, state, 0, estimate, Cost::new(13.0).unwrap()).unwrap();
/// assert_eq!((settled.balance, settled.retry_after_ms()), (-3, 3_000));
/// ```
///
/// # Errors
/// [`ChargeError::DebtTooLong`] if charging the difference would pass [`charge`]'s bound, or
/// the difference of two decimals this far apart cannot be taken exactly; nothing is to be
/// written.
pub fn settle(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    estimate: Cost,
    actual: Cost,
) -> Result<(Charged, Change), ChargeError> {
    let (estimate, actual) = (estimate.exact(), actual.exact());
    // The exact difference when the estimate is at least the actual cost; otherwise (or for
    // decimals too far apart to subtract) the comparison decides.
    let change = match difference(estimate, actual) {
        Some(back) if back.is_zero() => Change::Keep,
        Some(back) => refund(limit, state, now_us, Cost::from_decimal(back)).1,
        None if actual > estimate => {
            let more = difference(actual, estimate).ok_or(ChargeError::DebtTooLong)?;
            let (charged, new_state) = charge(limit, state, now_us, Cost::from_decimal(more))?;
            return Ok((charged, new_state.map_or(Change::Keep, Change::Set)));
        }
        // Too far apart to subtract: nothing goes back (never more than owed).
        None => Change::Keep,
    };
    let after = match change {
        Change::Keep => state,
        Change::Set(new_state) => Some(new_state),
        Change::Delete => None,
    };
    // The report of a charge of 0: the bucket, changed by nothing more.
    Ok((report(limit, after, now_us), change))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_exact_on_the_decimals() {
        let d = |text: &str| Decimal::parse(text.as_bytes()).unwrap();
        let rows = [
            ("5", "3", Some("2")),
            ("3", "3", Some("0")),
            ("2.5", "0.25", Some("2.25")),
            ("1e3", "1", Some("999")),
            ("0.1", "0.3", None),
            ("1e20", "1e-20", None),
            // Digits past 64 bits, aligned: the checked multiplication.
            (
                "18446744073709551616",
                "0.5",
                Some("18446744073709551615.5"),
            ),
        ];
        for (a, b, want) in rows {
            assert_eq!(difference(d(a), d(b)), want.map(d), "{a} - {b}");
        }
    }
}
