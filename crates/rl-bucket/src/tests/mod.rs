//! Unit tests for the pure token bucket: tables for the exact replies, a long run for drift,
//! and properties for the invariants.
//!
//! Time is injected: every test picks its own `now_us`, so nothing here reads a clock or
//! depends on how fast it runs. Expected values are worked out by hand from the model
//! (`tokens(now) = capacity - max(0, full_at - now) / T`, `T = 1e9 / rate` ns), never copied
//! from the implementation.
//!
//! One file per concept of the crate, plus the runs that cross them:
//!
//! - `decimal.rs`, `limit.rs`, `cost.rs`, `state.rs`, `decision.rs`: each type's parsing,
//!   ranges, rounding and views.
//! - `acquire.rs`: every field of one call's reply, sequences of calls, extreme limits, and
//!   the replies that bug reports pinned down.
//! - `refund.rs`: peeks and refunds against the exact model.
//! - `charge.rs`: charges into debt, then takes, peeks and cost-0 checks at random times,
//!   against the exact model; the bound on the debt.
//! - `fallback.rs`: the Lua fallback's hash texts parsed, their instant converted, and a
//!   taken-over bucket driven by every step against the exact model of that instant.
//! - `reserve.rs`: reservations made and settled (once) against the exact model.
//! - `drift.rs`: a saturated caller over a million calls gets exactly the model's count.
//! - `properties.rs`: the invariants, over generated limits, states and costs.
//! - `against_model.rs`: every field of every reply against the exact model (`model.rs`),
//!   at integer, fractional, decimal, `N/S` and per-period limits.
//! - `lease.rs`: leases, by hand, against a plain model, and the indexed set against
//!   `sorted_leases.rs`, the sorted vector it replaced, call by call up to the cap.
//!
//! This file holds what several of them share: the instants, the constructors, and the
//! checks against the model. Proptest replays each file's saved failures from
//! `proptest-regressions/tests/<file>.txt` beside the crate; keep them checked in.

use super::*;
use proptest::prelude::*;

mod acquire;
mod against_model;
mod charge;
mod cost;
mod decimal;
mod decision;
mod drift;
mod fallback;
mod lease;
mod limit;
mod properties;
mod refund;
mod reserve;
mod settle;
mod sorted_leases;
mod state;

/// A realistic instant: 2023-11-14T22:13:20Z, in µs.
const NOW_US: u64 = 1_700_000_000_000_000;
const NOW_NS: u64 = NOW_US * 1_000;
const MS: u64 = 1_000_000; // ns
const S: u64 = 1_000_000_000; // ns
const S_US: u64 = 1_000_000; // µs

fn limit(rate_per_s: f64, capacity: f64) -> Limit {
    Limit::new(rate_per_s, capacity).unwrap()
}

fn cost(tokens: f64) -> Cost {
    Cost::new(tokens).unwrap()
}

fn state(full_at_ns: u64) -> State {
    State::from_full_at_ns(full_at_ns).unwrap()
}

/// Compares one call with the model, every field.
fn assert_matches(d: &Decision, want: &model::Reply, at: &str) {
    let outcome = match want.allowed {
        None => Outcome::Impossible,
        Some(true) => Outcome::Allowed,
        Some(false) => Outcome::Denied,
    };
    assert_eq!(d.outcome, outcome, "outcome, {at}");
    assert_eq!(d.remaining, want.remaining, "remaining, {at}");
    assert_eq!(d.balance, want.balance, "balance, {at}");
    assert_eq!(
        d.retry_after_ns, want.retry_after_ns,
        "retry_after_ns, {at}"
    );
    assert_eq!(
        d.reset_after_ns, want.reset_after_ns,
        "reset_after_ns, {at}"
    );
}

/// A stored state's exact instant, in ns: `full_at_ns + full_at_frac × 2^-63`.
fn instant(st: State) -> num_rational::BigRational {
    num_rational::BigRational::new(
        (num_bigint::BigInt::from(st.full_at_ns()) << 63) + st.full_at_frac(),
        num_bigint::BigInt::from(1u64) << 63,
    )
}

/// Whether taking `cost` at `now_us`, or after the retry a denial would promise, truly needs
/// an instant at or past `MAX_FULL_AT_NS + 1`, so "impossible" was the right answer for a
/// cost within capacity. Exact, with the slack the bucket may use: 2 ns for the cost and the
/// stored instant each rounded up to a tick, and 1 ms for a retry rounded up to whole ms
/// (which can start the take up to 1 ms after the stored instant).
fn take_cannot_be_stored(lim: &Limit, st: Option<State>, now_us: u64, cost: f64) -> bool {
    use num_rational::BigRational;
    let (p, q) = lim.ns_per_token();
    let t = BigRational::new(p.into(), q.into());
    let now = BigRational::from_integer((u128::from(now_us) * 1000).into());
    let full = st.map_or(now.clone(), instant).max(now);
    let need = full + model::exact(cost) * t;
    // A state is never 0 either: an instant within the epoch's first ns cannot be stored.
    let too_early = need < BigRational::from_integer(1.into());
    too_early
        || need + BigRational::from_integer((2 + MS).into())
            >= BigRational::from_integer((u128::from(MAX_FULL_AT_NS) + 1).into())
}

/// Times between 2020 and 2033, in µs.
fn nows() -> impl Strategy<Value = u64> {
    1_577_836_800_000_000u64..=2_000_000_000_000_000
}
