//! The steps that take: [`acquire`] (take `cost` tokens if the bucket holds them) and
//! [`peek`] (what `acquire` would decide, taking nothing). Each is a function of the limit,
//! the old state, the time and the cost, returning the decision and the new state.
//!
//! Never reads a clock (`now_us` is passed in) and knows nothing of Redis: writing the new
//! state and replicating it is the caller's work.

use crate::cost::Cost;
use crate::decision::{ms_ceil, Decision, Outcome};
use crate::limit::Limit;
use crate::state::State;
use crate::ticks::NS_PER_MS;

/// Takes `cost` tokens at `now_us` if the bucket holds them. Never reads a clock.
///
/// Returns the decision and, only when the call changed the bucket, its new state: `None`
/// means there is nothing to write (a denial, or `cost` 0).
///
/// `state` is `None` for a missing key, which is a full bucket.
pub fn acquire(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    cost: Cost,
) -> (Decision, Option<State>) {
    let (decision, new_state, _) = decide(limit, state, now_us, cost);
    (decision, new_state)
}

/// [`acquire`], also returning how far short of full the bucket was before the call, which
/// [`peek`] reports.
fn decide(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    cost: Cost,
) -> (Decision, Option<State>, u128) {
    let now_ticks = limit.now_ticks(now_us);
    let full_ticks = limit.full_ticks(state);
    let debt_ticks = full_ticks.saturating_sub(now_ticks);
    let report = |outcome, debt_ticks, retry_ticks| {
        let (remaining, balance) = limit.tokens(debt_ticks);
        Decision {
            outcome,
            remaining,
            balance,
            retry_after_ns: limit.ns_ceil(retry_ticks),
            reset_after_ns: limit.ns_ceil(debt_ticks),
        }
    };

    let Some(cost_ticks) = limit.cost_ticks(cost) else {
        return (report(Outcome::Impossible, debt_ticks, 0), None, debt_ticks);
    };
    // The bucket holds `cost` tokens iff it is at most (capacity - cost) × T short of full.
    let slack_ticks = limit.capacity_ticks.saturating_sub(cost_ticks);
    if debt_ticks > slack_ticks {
        let retry_ticks = debt_ticks - slack_ticks;
        // A client retries after `retry_after_ms`: the take then starts from the later of
        // the stored instant and that moment. If it could not be stored (past 2262), the
        // retry would be answered "impossible": say so now rather than promise it. The
        // retry rounds up by under 1 ms + 1 ns past `now + retry = full - slack`, so a take
        // from `full` with that much to spare always fits (the usual case: one comparison).
        let d = u128::from(limit.ticks_per_ns);
        let spare_ticks = u128::from(NS_PER_MS + 1) * d;
        let take_ticks = full_ticks.saturating_add(cost_ticks);
        if !limit.storable(take_ticks.saturating_add(spare_ticks)) {
            let wait_ns = ms_ceil(limit.ns_ceil(retry_ticks)).unsigned_abs() * NS_PER_MS;
            let retry_at_ticks = now_ticks.saturating_add(u128::from(wait_ns).saturating_mul(d));
            if !limit.storable(full_ticks.max(retry_at_ticks).saturating_add(cost_ticks)) {
                return (report(Outcome::Impossible, debt_ticks, 0), None, debt_ticks);
            }
        }
        return (
            report(Outcome::Denied, debt_ticks, retry_ticks),
            None,
            debt_ticks,
        );
    }
    if cost_ticks == 0 {
        return (report(Outcome::Allowed, debt_ticks, 0), None, debt_ticks);
    }
    let new_state = full_ticks
        .max(now_ticks)
        .checked_add(cost_ticks)
        .and_then(|ticks| Some((ticks, State::from_ticks(ticks, limit.ticks_per_ns)?)));
    let Some((new_full_ticks, new_state)) = new_state else {
        return (report(Outcome::Impossible, debt_ticks, 0), None, debt_ticks);
    };
    let new_debt_ticks = new_full_ticks - now_ticks;
    (
        report(Outcome::Allowed, new_debt_ticks, 0),
        Some(new_state),
        debt_ticks,
    )
}

/// What [`acquire`] would decide for `cost`, taking nothing. `remaining`, `balance` and
/// `reset_after_ns` describe the bucket as it is now (`balance` negative while in debt); `retry_after_ns` is the wait until
/// `cost` tokens are there (0 if they are).
pub fn peek(limit: &Limit, state: Option<State>, now_us: u64, cost: Cost) -> Decision {
    let (mut decision, taken, debt_ticks) = decide(limit, state, now_us, cost);
    if taken.is_some() {
        (decision.remaining, decision.balance) = limit.tokens(debt_ticks);
        decision.reset_after_ns = limit.ns_ceil(debt_ticks);
    }
    decision
}
