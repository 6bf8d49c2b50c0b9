//! The step that gives back: [`refund`] returns tokens (for a request that failed before
//! doing any work), capped at capacity and rounded down to a whole tick, and says what to
//! write: keep, set, or delete a bucket that is full again.
//!
//! Never reads a clock and knows nothing of Redis; it must not depend on `acquire` (the two
//! steps share only the limit's tick conversions).

use crate::cost::Cost;
use crate::decimal::Round;
use crate::decision::{Change, Decision, Outcome};
use crate::limit::Limit;
use crate::state::State;

/// Gives `tokens` back (for a request that failed before doing any work), capped at
/// capacity. The refund is rounded down to a whole tick of refill, so it never returns more
/// than was asked. The decision reports the bucket after the refund.
pub fn refund(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    tokens: Cost,
) -> (Decision, Change) {
    let now_ticks = limit.now_ticks(now_us);
    let debt_ticks = limit.full_ticks(state).saturating_sub(now_ticks);
    let give_ticks = tokens
        .0
        .min(limit.capacity)
        .mul_round(limit.ticks_per_token, Round::Down)
        .unwrap_or(0);
    let (new_debt_ticks, change) = match state {
        Some(_) if debt_ticks > 0 && give_ticks > 0 => {
            let new_debt_ticks = debt_ticks.saturating_sub(give_ticks);
            if new_debt_ticks == 0 {
                (0, Change::Delete)
            } else {
                // `now + new_debt` is below the stored instant, so it is always a valid state.
                match State::from_ticks(now_ticks + new_debt_ticks, limit.ticks_per_ns) {
                    Some(new_state) => (new_debt_ticks, Change::Set(new_state)),
                    None => (debt_ticks, Change::Keep),
                }
            }
        }
        _ => (debt_ticks, Change::Keep),
    };
    let (remaining, balance) = limit.tokens(new_debt_ticks);
    let decision = Decision {
        outcome: Outcome::Allowed,
        remaining,
        balance,
        retry_after_ns: 0,
        reset_after_ns: limit.ns_ceil(new_debt_ticks),
    };
    (decision, change)
}
