//! `bucket`: the RDB decoder, `datatype::decode`, on arbitrary fields, then the token bucket
//! (`rl_bucket::acquire`, `peek` and `refund`) on the decoded state (or an arbitrary one) with
//! arbitrary limits, costs and times, checked against the exact model of `crates/rl-bucket/src/model.rs`
//! (rational arithmetic, shared with the unit tests by `#[path]`), never against itself.
//!
//! Input, read with `arbitrary::Unstructured`: an encoding version (`i32`), 0 to 3 fields
//! (`Option<u64>`: `None` is a failed read; past the last field every read fails), then a
//! limit and up to 8 calls. Numbers are drawn from raw bits, boundaries, or realistic ranges
//! (times near now or near the end of the state range, fractions near 0 and 2^63), so the
//! interesting cases are near.
//!
//! Checks, besides "never panics":
//! - `decode` is `Ok` only for encoding version 2 holding `1 <= full_at_ns <= i64::MAX` and
//!   `full_at_frac <= i64::MAX`, or version 1 holding such a `full_at_ns` alone (fraction 0);
//!   it reads two fields for version 2 (one if the first read fails), one for version 1 and
//!   none otherwise, and names the right error;
//! - `Limit::new` and `Cost::new` refuse exactly what their documentation says, and `T` is
//!   the model's `1e9 / rate` exactly;
//! - with an integer capacity and cost, every reply of `acquire` and `peek` (outcome,
//!   `remaining`, `retry_after_ns`, `reset_after_ns`) equals the model's, and an allowed take
//!   writes exactly the model's new instant; an allowed take the state cannot hold (past
//!   2262, or before the epoch's first nanosecond) is the only other `Impossible`;
//! - with a fractional capacity or cost, the bucket never allows what the model refuses, and
//!   refuses only within two ticks (1/den ns each) of the model's boundary; a take writes
//!   between `cost × T` and one tick more;
//! - `refund` gives back exactly `min(tokens, capacity) × T` for integer values, else at
//!   most that and under one tick less; it deletes the key exactly when the model is full;
//! - a denial's `retry_after_ms` is enough for the model and the bucket; a clock that steps
//!   back never shows more tokens;
//! - a state written by a take holds its instant exactly: rounded up to 2^-63 ns, by less
//!   than 2^-63 ns.
//!
//! The model follows the bucket: after each call it takes the bucket's new instant (exact
//! when the state was made at this rate). An arbitrary starting state with a fraction, made
//! at no particular rate, is only bracketed: decoded at this rate it is at most 2^-63 ns
//! earlier and under one tick later, so one call is checked between those two models.
#![no_main]

#[allow(dead_code)]
#[path = "../../crates/rl-bucket/src/model.rs"]
mod model;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use model::{Model, Reply};
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Zero};
use redis_rl::datatype::{decode, DecodeError, ENCODING_VERSION};
use rl_bucket::{
    acquire, peek, refund, Change, Cost, Decision, Limit, LimitError, Outcome, State, MAX_CAPACITY,
    MAX_FULL_AT_FRAC, MAX_FULL_AT_NS, MAX_RATE_PER_S, MAX_REFILL_S, MIN_RATE_PER_S,
};

/// Mid-November 2023 in ns: a realistic "now".
const NOW_NS: u64 = 1_700_000_000_000_000_000;
/// The latest `now_us` whose nanoseconds fit in `u64`; the bucket saturates beyond it, the
/// model does not, and no clock reaches it.
const MAX_NOW_US: u64 = u64::MAX / 1_000;

/// A nanosecond instant: raw, small, near now, or near the end of the state range.
fn instant_ns(u: &mut Unstructured) -> Result<u64> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => u.arbitrary()?,
        1 => u.int_in_range(0..=2_000)?,
        2 => NOW_NS.wrapping_add_signed(u.arbitrary::<i64>()? >> u.int_in_range(0..=40)?),
        _ => MAX_FULL_AT_NS.wrapping_add_signed(i64::from(u.arbitrary::<i32>()?)),
    })
}

/// A fraction of a nanosecond in units of 2^-63: raw, zero, small, or near 2^63.
fn fraction(u: &mut Unstructured) -> Result<u64> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => u.arbitrary()?,
        1 => 0,
        2 => u.int_in_range(0..=2_000)?,
        _ => MAX_FULL_AT_FRAC.wrapping_add_signed(i64::from(u.arbitrary::<i16>()?)),
    })
}

/// A float near `lo..=hi`: raw bits (NaN, infinities, negatives, subnormals), a boundary or
/// its neighbour, a small integer or fraction, or log-uniform from `lo / 100` to `hi * 100`.
fn float_near(u: &mut Unstructured, lo: f64, hi: f64) -> Result<f64> {
    Ok(match u.int_in_range(0..=4u8)? {
        0 => f64::from_bits(u.arbitrary()?),
        1 => *u.choose(&[
            lo,
            hi,
            lo.next_down(),
            lo.next_up(),
            hi.next_down(),
            hi.next_up(),
            0.0,
            -0.0,
            1.0,
            3.0,
            7.0,
            0.3,
            f64::MIN_POSITIVE,
            f64::from_bits(1),
        ])?,
        2 => f64::from(u.int_in_range(0..=1_000u16)?),
        3 => f64::from(u.int_in_range(0..=1_000u16)?) / f64::from(u.int_in_range(1..=1_000u16)?),
        _ => {
            let (a, b) = ((lo / 100.0).log10(), (hi * 100.0).log10());
            let t = f64::from(u.arbitrary::<u32>()?) / f64::from(u32::MAX);
            10f64.powf(a + t * (b - a))
        }
    })
}

/// Decodes the fields and checks the result against the decoder's contract.
fn check_decode(u: &mut Unstructured) -> Result<Option<State>> {
    let encver: i32 = if u.arbitrary()? {
        *u.choose(&[1, ENCODING_VERSION])?
    } else {
        u.arbitrary()?
    };
    let n_fields = u.int_in_range(0..=3u8)?;
    let mut fields = Vec::new();
    for _ in 0..n_fields {
        let field = match u.int_in_range(0..=7u8)? {
            0 => None,
            1..=4 => Some(instant_ns(u)?),
            _ => Some(fraction(u)?),
        };
        fields.push(field);
    }
    let mut reads = 0;
    let got = decode(encver, || {
        let field = fields.get(reads).copied().flatten();
        reads += 1;
        field
    });
    let field = |i: usize| fields.get(i).copied().flatten();
    let in_range = |ns: u64, frac: u64| {
        if (1..=MAX_FULL_AT_NS).contains(&ns) && frac <= MAX_FULL_AT_FRAC {
            Ok((ns, frac))
        } else {
            Err(DecodeError::Range)
        }
    };
    let (want, want_reads) = match encver {
        1 => (
            field(0)
                .ok_or(DecodeError::Io)
                .and_then(|ns| in_range(ns, 0)),
            1,
        ),
        2 => match (field(0), field(1)) {
            (None, _) => (Err(DecodeError::Io), 1),
            (Some(_), None) => (Err(DecodeError::Io), 2),
            (Some(ns), Some(frac)) => (in_range(ns, frac), 2),
        },
        _ => (Err(DecodeError::Version), 0),
    };
    assert_eq!(
        ENCODING_VERSION, 2,
        "the fuzzer knows encoding versions 1 and 2"
    );
    assert_eq!(
        got.map(|s| (s.full_at_ns(), s.full_at_frac())),
        want,
        "encver {encver}, fields {fields:?}"
    );
    assert_eq!(
        reads, want_reads,
        "fields read: encver {encver}, fields {fields:?}"
    );
    Ok(got.ok())
}

fn int(n: impl Into<BigInt>) -> BigRational {
    BigRational::from_integer(n.into())
}

/// 2^63: the stored fraction's unit is 1 / this ns.
fn frac_unit() -> BigRational {
    int(BigInt::one() << 63u32)
}

/// A state's instant, exactly: `full_at_ns + full_at_frac × 2^-63` ns.
fn exact_instant(state: State) -> BigRational {
    int(state.full_at_ns()) + int(state.full_at_frac()) / frac_unit()
}

/// The instant, in ns, that a state made at `ticks_per_ns` stands for: it holds a whole
/// number of ticks (`1 / ticks_per_ns` ns) rounded up to 2^-63 ns, by less than 2^-63 ns,
/// which is under a tick, so the tick is the floor.
fn tick_instant(state: State, ticks_per_ns: &BigInt) -> BigRational {
    let ticks = (exact_instant(state) * int(ticks_per_ns.clone())).floor();
    ticks / int(ticks_per_ns.clone())
}

/// Checks a written state against the instant `want_ns` it must hold, exactly: `full_at_ns`
/// its whole part, `full_at_frac` its fraction rounded up to 2^-63 ns.
fn assert_holds(state: State, want_ns: &BigRational, ctx: &dyn Fn() -> String) {
    let floor = want_ns.floor();
    let frac = ((want_ns - &floor) * frac_unit()).ceil();
    assert_eq!(int(state.full_at_ns()), floor, "whole ns: {}", ctx());
    assert_eq!(int(state.full_at_frac()), frac, "fraction: {}", ctx());
}

/// Whether the model's take at `now_us` would end outside what a state can hold: past 2262,
/// or (only with a clock at the epoch) before the first nanosecond, since `full_at_ns` 0 is no
/// state.
fn beyond_state_range(model: &Model, now_us: u64, cost: f64, slack: &BigRational) -> bool {
    let mut taken = model.clone();
    taken.force_take(now_us, cost);
    taken.full_at_ns.is_some_and(|full_at| {
        let whole = (full_at + slack).floor();
        whole > int(MAX_FULL_AT_NS) || whole < BigRational::one()
    })
}

/// Whether a denial must be impossible: taking `cost` after the retry it would promise (the
/// stored instant, or up to 1 ms + 1 ns past it where `retry_after_ms` rounds up) could not
/// be stored. 2 ns more of slack for the bucket's rounding up to a tick.
fn retry_beyond_state_range(model: &Model, now_us: u64, cost: f64) -> bool {
    let mut taken = model.clone();
    taken.force_take(now_us, cost);
    taken
        .full_at_ns
        .is_some_and(|full_at| full_at + int(1_000_003) > int(MAX_FULL_AT_NS) + BigRational::one())
}

fn model_outcome(reply: &Reply) -> Outcome {
    match reply.allowed {
        Some(true) => Outcome::Allowed,
        Some(false) => Outcome::Denied,
        None => Outcome::Impossible,
    }
}

/// The model and what the fuzzer needs to follow the bucket with it.
struct Follow {
    limit: Limit,
    model: Model,
    ticks_per_ns: BigInt,
    /// One tick, in ns.
    tick_ns: BigRational,
    /// Integer capacity: with an integer cost, replies must equal the model's.
    integer_capacity: bool,
}

impl Follow {
    fn exact_for(&self, cost: f64) -> bool {
        self.integer_capacity && cost == cost.floor()
    }

    /// The model's state after the bucket's change: its instant, or full.
    fn adopt(&mut self, state: Option<State>) {
        self.model.full_at_ns = state.map(|s| tick_instant(s, &self.ticks_per_ns));
    }

    /// One `acquire`, checked against the model; the model then follows the bucket.
    fn acquire(
        &mut self,
        state: Option<State>,
        now_us: u64,
        cost: Cost,
    ) -> (Decision, Option<State>) {
        let c = cost.tokens();
        let (d, new) = acquire(&self.limit, state, now_us, cost);
        let mut probe = self.model.clone();
        let reply = probe.acquire(now_us, c);
        let ctx = || {
            format!(
                "{:?} {state:?} now_us {now_us} {cost:?} -> {d:?} {new:?}; model {reply:?}",
                self.limit
            )
        };
        assert!(
            d.remaining as f64 <= self.limit.capacity().floor(),
            "{}",
            ctx()
        );
        assert_eq!(
            d.retry_after_ns > 0,
            d.outcome == Outcome::Denied,
            "{}",
            ctx()
        );
        match d.outcome {
            Outcome::Allowed if c > 0.0 => {
                let new = new.unwrap_or_else(|| panic!("allowed, no state: {}", ctx()));
                // The take starts at max(full_at, now) and adds cost × T, rounded up to a tick
                // (exact for an integer cost).
                let start = match &self.model.full_at_ns {
                    Some(full_at) if *full_at > int(now_us) * int(1_000) => full_at.clone(),
                    _ => int(now_us) * int(1_000),
                };
                let take = model::exact(c) * self.model.ns_per_token();
                let written = tick_instant(new, &self.ticks_per_ns);
                if self.exact_for(c) {
                    assert_eq!(Some(&written), probe.full_at_ns.as_ref(), "{}", ctx());
                } else {
                    let extra = &written - &start - &take;
                    assert!(
                        extra >= BigRational::zero() && extra < self.tick_ns,
                        "{}",
                        ctx()
                    );
                }
                assert_holds(new, &written, &ctx);
            }
            Outcome::Allowed => assert_eq!(new, None, "cost 0 writes nothing: {}", ctx()),
            Outcome::Denied | Outcome::Impossible => {
                assert_eq!(new, None, "{}", ctx());
            }
        }
        if d.outcome == Outcome::Impossible && reply.allowed == Some(true) {
            // The one impossibility the model does not know: a full_at no state can hold.
            assert!(
                beyond_state_range(&self.model, now_us, c, &self.slack(c)),
                "{}",
                ctx()
            );
        } else if d.outcome == Outcome::Impossible && reply.allowed == Some(false) {
            // Nor one whose promised retry could not take: impossible at once.
            assert!(
                retry_beyond_state_range(&self.model, now_us, c),
                "{}",
                ctx()
            );
        } else if self.exact_for(c) {
            assert_eq!(d.outcome, model_outcome(&reply), "{}", ctx());
            assert_eq!(d.remaining, reply.remaining, "remaining: {}", ctx());
            assert_eq!(d.retry_after_ns, reply.retry_after_ns, "retry: {}", ctx());
            assert_eq!(d.reset_after_ns, reply.reset_after_ns, "reset: {}", ctx());
        } else {
            self.assert_within_bound(&d, now_us, c, &ctx);
        }
        self.adopt(new.or(state));
        (d, new)
    }

    /// What the bucket may add to a take's instant: nothing for an exact cost, else the
    /// rounding of `cost × T` up to a tick.
    fn slack(&self, c: f64) -> BigRational {
        if self.exact_for(c) {
            BigRational::zero()
        } else {
            self.tick_ns.clone()
        }
    }

    /// Fractional values: never laxer than the model, stricter by at most two ticks.
    fn assert_within_bound(&self, d: &Decision, now_us: u64, c: f64, ctx: &dyn Fn() -> String) {
        let zero = BigRational::zero();
        let two_ticks = &self.tick_ns * int(2);
        match d.outcome {
            Outcome::Allowed => {
                assert!(self.model.fits_within(now_us, c, &zero), "laxer: {}", ctx());
            }
            Outcome::Denied | Outcome::Impossible => assert!(
                !self.model.fits_within(now_us, c, &-two_ticks),
                "refused by more than two ticks: {}",
                ctx()
            ),
        }
    }

    /// `peek`: the model's answer, and nothing written.
    fn peek(&self, state: Option<State>, now_us: u64, cost: Cost) {
        let c = cost.tokens();
        let p = peek(&self.limit, state, now_us, cost);
        let reply = self.model.peek(now_us, c);
        let ctx = || {
            format!(
                "{:?} {state:?} {now_us} {cost:?}: peek {p:?}, model {reply:?}",
                self.limit
            )
        };
        if p.outcome == Outcome::Impossible && reply.allowed == Some(true) {
            assert!(
                beyond_state_range(&self.model, now_us, c, &self.slack(c)),
                "{}",
                ctx()
            );
        } else if p.outcome == Outcome::Impossible && reply.allowed == Some(false) {
            assert!(
                retry_beyond_state_range(&self.model, now_us, c),
                "{}",
                ctx()
            );
        } else if self.exact_for(c) {
            assert_eq!(p.outcome, model_outcome(&reply), "{}", ctx());
            assert_eq!(p.retry_after_ns, reply.retry_after_ns, "{}", ctx());
        } else {
            self.assert_within_bound(&p, now_us, c, &ctx);
        }
        // Remaining and reset describe the bucket as it is, whatever the cost.
        let now = self.model.peek(now_us, 0.0);
        if self.integer_capacity {
            assert_eq!(p.remaining, now.remaining, "{}", ctx());
        } else {
            assert!(p.remaining <= now.remaining, "{}", ctx());
        }
        assert_eq!(p.reset_after_ns, now.reset_after_ns, "{}", ctx());
    }

    /// `refund`: the model's refund, exactly or within a tick less.
    fn refund(&mut self, state: Option<State>, now_us: u64, tokens: Cost) -> Option<State> {
        let c = tokens.tokens();
        let (d, change) = refund(&self.limit, state, now_us, tokens);
        let mut refunded = self.model.clone();
        refunded.refund(now_us, c);
        let ctx = || {
            format!(
                "{:?} {state:?} {now_us} {tokens:?}: {d:?} {change:?}; model {:?}",
                self.limit, refunded.full_at_ns
            )
        };
        assert_eq!(
            (d.outcome, d.retry_after_ns),
            (Outcome::Allowed, 0),
            "{}",
            ctx()
        );
        let now_ns = int(now_us) * int(1_000);
        let after = match change {
            Change::Keep => state,
            Change::Delete => {
                assert!(state.is_some(), "{}", ctx());
                None
            }
            Change::Set(new) => {
                assert!(state.is_some(), "{}", ctx());
                let instant = tick_instant(new, &self.ticks_per_ns);
                assert!(instant > now_ns, "a set state is not full: {}", ctx());
                assert_holds(new, &instant, &ctx);
                Some(new)
            }
        };
        let debt = |m: &Model| match &m.full_at_ns {
            Some(full_at) if *full_at > now_ns => full_at - &now_ns,
            _ => BigRational::zero(),
        };
        let mut followed = self.model.clone();
        followed.full_at_ns = after.map(|s| tick_instant(s, &self.ticks_per_ns));
        let (got_debt, want_debt) = (debt(&followed), debt(&refunded));
        if self.exact_for(c) {
            assert_eq!(got_debt, want_debt, "{}", ctx());
            // Deleted exactly when the model is full, in both directions.
            let had_debt = debt(&self.model) > BigRational::zero();
            assert_eq!(
                matches!(change, Change::Delete),
                had_debt && want_debt.is_zero(),
                "{}",
                ctx()
            );
        } else {
            assert!(
                got_debt >= want_debt,
                "gave back more than asked: {}",
                ctx()
            );
            assert!(
                got_debt < &want_debt + &self.tick_ns,
                "gave back a tick short: {}",
                ctx()
            );
        }
        let view = followed.peek(now_us, 0.0);
        if self.integer_capacity {
            assert_eq!(d.remaining, view.remaining, "{}", ctx());
        }
        assert_eq!(d.reset_after_ns, view.reset_after_ns, "{}", ctx());
        self.model = followed;
        after
    }
}

/// An arbitrary fractional state, not made at this rate: one call, bracketed between the
/// instant 2^-63 ns earlier and one tick later.
fn check_bracketed(follow: &Follow, state: State, now_us: u64, cost: Cost) {
    let c = cost.tokens();
    let exact = exact_instant(state);
    let mut early = follow.model.clone();
    early.full_at_ns = Some(&exact - BigRational::one() / frac_unit());
    let mut late = follow.model.clone();
    late.full_at_ns = Some(&exact + &follow.tick_ns);
    let (d, new) = acquire(&follow.limit, Some(state), now_us, cost);
    let ctx = || {
        format!(
            "{:?} {state:?} {now_us} {cost:?} -> {d:?} {new:?}",
            follow.limit
        )
    };
    let slack = if follow.exact_for(c) {
        BigRational::zero()
    } else {
        &follow.tick_ns * int(2)
    };
    if d.allowed() {
        assert!(
            early.fits_within(now_us, c, &BigRational::zero()),
            "laxer: {}",
            ctx()
        );
    } else if d.outcome == Outcome::Denied {
        assert!(!late.fits_within(now_us, c, &-slack), "stricter: {}", ctx());
        assert_eq!(new, None, "{}", ctx());
    }
    let (lo, hi) = (late.peek(now_us, 0.0), early.peek(now_us, 0.0));
    if follow.integer_capacity && d.allowed() && c == 0.0 {
        assert!(
            (lo.remaining..=hi.remaining).contains(&d.remaining),
            "{}",
            ctx()
        );
    }
}

fn run(u: &mut Unstructured) -> Result<()> {
    let mut state = match check_decode(u)? {
        Some(state) => Some(state),
        None if u.arbitrary()? => State::from_parts(instant_ns(u)?, fraction(u)?),
        None => None,
    };

    let rate = float_near(u, MIN_RATE_PER_S, MAX_RATE_PER_S)?;
    let capacity = float_near(u, 1.0, MAX_CAPACITY)?;
    let limit = match Limit::new(rate, capacity) {
        Ok(limit) => limit,
        Err(e) => {
            let rate_ok = (MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&rate);
            let capacity_ok = capacity > 0.0 && capacity <= MAX_CAPACITY;
            let want = if !rate_ok {
                LimitError::Rate
            } else if !capacity_ok {
                LimitError::Capacity
            } else {
                assert!(
                    capacity / rate > MAX_REFILL_S,
                    "Limit::new({rate}, {capacity}) refused"
                );
                LimitError::RefillTime
            };
            assert_eq!(e, want, "Limit::new({rate}, {capacity})");
            return Ok(());
        }
    };
    assert!((MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&limit.rate_per_s()));
    assert!(limit.capacity() > 0.0 && limit.capacity() <= MAX_CAPACITY);
    assert!(limit.capacity() / limit.rate_per_s() <= MAX_REFILL_S);
    let model = Model::new(rate, capacity);
    // T is exactly 1e9 / rate, in lowest terms.
    let t = model.ns_per_token();
    let (numer, denom) = limit.ns_per_token();
    assert_eq!(
        (t.numer().clone(), t.denom().clone()),
        (BigInt::from(numer), BigInt::from(denom)),
        "T of {rate}"
    );
    let ticks_per_ns = t.denom().clone();
    let mut follow = Follow {
        limit,
        tick_ns: BigRational::one() / int(ticks_per_ns.clone()),
        ticks_per_ns,
        integer_capacity: capacity == capacity.floor(),
        model,
    };

    let mut now_us = state.map_or(NOW_NS, State::full_at_ns) / 1_000;
    let mut last_remaining = 1.0;
    let mut bracketed = false;
    if let Some(s) = state {
        if s.full_at_frac() == 0 {
            // A whole nanosecond is a whole number of ticks at every rate: exact.
            follow.model.full_at_ns = Some(int(s.full_at_ns()));
        } else {
            bracketed = true;
        }
    }
    for _ in 0..u.int_in_range(1..=8u8)? {
        now_us = match u.int_in_range(0..=3u8)? {
            0 => u.arbitrary()?,
            1 => now_us.saturating_add(u.int_in_range(0..=10_000_000)?),
            2 => now_us.wrapping_add_signed(u.arbitrary::<i64>()? >> u.int_in_range(0..=63)?),
            _ => state.map_or(now_us, |s| s.full_at_ns() / 1_000),
        }
        .min(MAX_NOW_US);
        let tokens = match u.int_in_range(0..=2u8)? {
            0 => float_near(u, 1.0, follow.limit.capacity())?,
            1 => last_remaining + f64::from(u.int_in_range(-1..=1i8)?),
            _ => follow.limit.capacity(),
        };
        let Some(cost) = Cost::new(tokens) else {
            assert!(
                !(tokens.is_finite() && tokens >= 0.0),
                "Cost::new({tokens}) refused"
            );
            continue;
        };
        if bracketed {
            if let Some(s) = state {
                check_bracketed(&follow, s, now_us, cost);
            }
            return Ok(());
        }
        match u.int_in_range(0..=5u8)? {
            0 => {
                follow.peek(state, now_us, cost);
                continue;
            }
            1 => {
                state = follow.refund(state, now_us, cost);
                continue;
            }
            _ => {}
        }
        let before = follow.model.clone();
        let (d, new) = follow.acquire(state, now_us, cost);
        if d.outcome == Outcome::Denied {
            // A client that waits retry_after_ms gets through, by the model and the bucket
            // (or learns it never can).
            if let Some(later) = u64::try_from(d.retry_after_ms())
                .ok()
                .and_then(|ms| ms.checked_mul(1_000))
                .and_then(|us| now_us.checked_add(us))
                .filter(|&us| us <= MAX_NOW_US)
            {
                let (retry, _) = acquire(&follow.limit, state, later, cost);
                assert_ne!(retry.outcome, Outcome::Denied, "retry at {later} us: {d:?}");
                if follow.exact_for(cost.tokens()) {
                    let again = before.clone().acquire(later, cost.tokens());
                    assert_ne!(
                        again.allowed,
                        Some(false),
                        "model retry at {later} us: {d:?}"
                    );
                }
            }
        }
        state = new.or(state);
        // Going back in time never adds tokens.
        let earlier = now_us.saturating_sub(u.int_in_range(0..=1_000_000_000)?);
        let zero = Cost::new(0.0).unwrap();
        let (d4, _) = acquire(&follow.limit, state, earlier, zero);
        let (d5, _) = acquire(&follow.limit, state, now_us, zero);
        assert!(d4.remaining <= d5.remaining, "earlier {d4:?}, now {d5:?}");
        last_remaining = d.remaining as f64;
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
