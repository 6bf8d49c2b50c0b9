//! The post-paid step: [`charge`] reports work already done, so it always applies, even past
//! the capacity. The bucket may go below zero (debt); while it is in debt every take is
//! denied, cost 0 included, until refill repays it. Bounded: the bucket must be full again
//! within [`MAX_REFILL_S`](crate::MAX_REFILL_S) of now, and the instant storable.
//!
//! Never reads a clock and knows nothing of Redis; it must not depend on `acquire` or
//! `refund` (the steps share only the limit's tick conversions).

use crate::cost::Cost;
use crate::decision::Charged;
use crate::limit::Limit;
use crate::state::State;

/// Why a charge was refused. Nothing is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChargeError {
    /// The charge would leave the bucket short of full for more than
    /// [`MAX_REFILL_S`](crate::MAX_REFILL_S) (100 years) from now, or at an instant that
    /// cannot be stored (past [`MAX_FULL_AT_NS`](crate::MAX_FULL_AT_NS), in 2262).
    DebtTooLong,
}

/// Charges `cost` tokens at `now_us`, whatever the bucket holds: `full_at` moves to
/// `max(full_at, now) + cost × T` (`cost × T` rounded up to a tick), even past the capacity.
/// Never reads a clock.
///
/// Returns what the bucket holds after the charge and its new state; `None` means there is
/// nothing to write (`cost` 0, which only reports the bucket). `state` is `None` for a
/// missing key, which is a full bucket.
///
/// ```
/// use rl_bucket::{acquire, charge, Cost, Limit};
///
/// let limit = Limit::new(1.0, 10.0).unwrap(); // 1 token/s, burst of 10
/// let (charged, state) = charge(&limit, None, 0, Cost::new(12.0).unwrap()).unwrap();
/// assert_eq!(charged.balance, -2); // two tokens in debt
/// assert_eq!(charged.retry_after_ms(), 2_000); // repaid in 2 s
/// assert_eq!(charged.reset_after_ms(), 12_000); // full in 12 s
/// let (denied, _) = acquire(&limit, state, 1_000_000, Cost::new(0.0).unwrap());
/// assert!(!denied.allowed()); // still a token in debt after 1 s: even cost 0 is denied
/// assert_eq!((denied.remaining, denied.balance), (0, -1));
/// ```
///
/// # Errors
/// [`ChargeError::DebtTooLong`] if the bucket would not be full again within 100 years of
/// `now_us`, or its instant could not be stored; nothing is to be written.
pub fn charge(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    cost: Cost,
) -> Result<(Charged, Option<State>), ChargeError> {
    let now_ticks = limit.now_ticks(now_us);
    let full_ticks = limit.full_ticks(state);
    let report = |debt_ticks: u128| report_debt(limit, debt_ticks);
    let cost_ticks = limit.charge_ticks(cost).ok_or(ChargeError::DebtTooLong)?;
    if cost_ticks == 0 {
        return Ok((report(full_ticks.saturating_sub(now_ticks)), None));
    }
    let new_full_ticks = full_ticks
        .max(now_ticks)
        .checked_add(cost_ticks)
        .ok_or(ChargeError::DebtTooLong)?;
    let new_debt_ticks = new_full_ticks - now_ticks;
    if !limit.within_refill_bound(new_debt_ticks) {
        return Err(ChargeError::DebtTooLong);
    }
    let new_state =
        State::from_ticks(new_full_ticks, limit.ticks_per_ns).ok_or(ChargeError::DebtTooLong)?;
    Ok((report(new_debt_ticks), Some(new_state)))
}

/// The bucket at `now_us` in [`charge`]'s terms, changing nothing: what a charge of 0
/// reports, without converting a cost.
pub(crate) fn report(limit: &Limit, state: Option<State>, now_us: u64) -> Charged {
    let debt_ticks = limit
        .full_ticks(state)
        .saturating_sub(limit.now_ticks(now_us));
    report_debt(limit, debt_ticks)
}

/// The report of a bucket `debt_ticks` short of full.
fn report_debt(limit: &Limit, debt_ticks: u128) -> Charged {
    Charged {
        balance: limit.balance(debt_ticks),
        repaid_after_ns: limit.ns_ceil(debt_ticks.saturating_sub(limit.capacity_ticks)),
        reset_after_ns: limit.ns_ceil(debt_ticks),
    }
}
