//! `bucket`: the RDB decoder, `datatype::decode`, on arbitrary fields, then the token bucket
//! (`bucket::acquire`, `peek` and `refund`) on the decoded state (or an arbitrary one) with
//! arbitrary limits, costs and times.
//!
//! Input, read with `arbitrary::Unstructured`: an encoding version (`i32`), 0 to 3 fields
//! (`Option<u64>`: `None` is a failed read; past the last field every read fails), then a
//! limit and up to 8 calls. Numbers are drawn from raw bits, boundaries, or realistic ranges
//! (times near now or near the end of the state range), so the interesting cases are near.
//!
//! Checks, besides "never panics":
//! - `decode` is `Ok` only for encoding version 1 holding `1 <= full_at <= i64::MAX`, reads
//!   exactly one field for version 1 and none otherwise, and names the right error;
//! - `Limit::new` and `Cost::new` refuse exactly what their documentation says;
//! - each decision: `remaining <= floor(capacity)`; allowed with cost > 0 writes
//!   `max(full_at, now) + ceil(cost × 1e9 / rate)`; denied or cost 0 writes nothing;
//!   denied means `retry_after_ms >= 1`, and retrying after it is not denied; impossible
//!   means `retry_after_ms == -1` and writes nothing; `reset_after_ns` is the time to full;
//! - `remaining` is exact: a request for `remaining` tokens is not denied, and one for
//!   `remaining + 1` is not allowed, at the same instant;
//! - a clock that steps back never shows more tokens;
//! - `peek` decides as `acquire` would and reports the bucket as it is;
//! - `refund` gives back at most `tokens` (whole nanoseconds of refill, rounded down), never
//!   takes any, deletes the key exactly when the bucket is full again, and otherwise moves
//!   `full_at` earlier but not before now.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use redis_rl::bucket::{
    acquire, peek, refund, Change, Cost, Decision, Limit, LimitError, Outcome, State, MAX_CAPACITY,
    MAX_FULL_AT_NS, MAX_RATE_PER_S, MAX_REFILL_S, MIN_RATE_PER_S,
};
use redis_rl::datatype::{decode, DecodeError, ENCODING_VERSION};

/// Mid-November 2023 in ns: a realistic "now".
const NOW_NS: u64 = 1_700_000_000_000_000_000;

/// A nanosecond instant: raw, small, near now, or near the end of the state range.
fn instant_ns(u: &mut Unstructured) -> Result<u64> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => u.arbitrary()?,
        1 => u.int_in_range(0..=2_000)?,
        2 => NOW_NS.wrapping_add_signed(u.arbitrary::<i64>()? >> u.int_in_range(0..=40)?),
        _ => MAX_FULL_AT_NS.wrapping_add_signed(i64::from(u.arbitrary::<i32>()?)),
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
    let encver: i32 = u.arbitrary()?;
    let n_fields = u.int_in_range(0..=3u8)?;
    let mut fields = Vec::new();
    for _ in 0..n_fields {
        let field = if u.arbitrary::<u8>()? & 7 == 0 {
            None
        } else {
            Some(instant_ns(u)?)
        };
        fields.push(field);
    }
    let mut reads = 0;
    let got = decode(encver, || {
        let field = fields.get(reads).copied().flatten();
        reads += 1;
        field
    });
    let want = if encver != ENCODING_VERSION {
        Err(DecodeError::Version)
    } else {
        match fields.first().copied().flatten() {
            None => Err(DecodeError::Io),
            Some(v) if (1..=i64::MAX as u64).contains(&v) => Ok(v),
            Some(_) => Err(DecodeError::Range),
        }
    };
    assert_eq!(
        got.map(State::full_at_ns),
        want,
        "encver {encver}, fields {fields:?}"
    );
    assert_eq!(
        reads,
        usize::from(encver == ENCODING_VERSION),
        "fields read"
    );
    if got.is_ok() {
        assert_eq!(encver, 1);
    }
    Ok(got.ok())
}

fn debt_ns(state: Option<State>, now_us: u64) -> u64 {
    state
        .map_or(0, State::full_at_ns)
        .saturating_sub(now_us.saturating_mul(1_000))
}

/// One call and its invariants. Returns the decision and the new state, if any.
fn check_call(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    cost: Cost,
) -> (Decision, Option<State>) {
    let (d, new) = acquire(limit, state, now_us, cost);
    let ctx = || format!("{limit:?} {state:?} now_us {now_us} {cost:?} -> {d:?} {new:?}");
    let tokens = cost.tokens();
    let now_ns = now_us.saturating_mul(1_000);
    let full_at = state.map_or(0, State::full_at_ns);
    assert!(d.remaining as f64 <= limit.capacity().floor(), "{}", ctx());
    assert!(d.reset_after_ms() >= 0, "{}", ctx());
    assert!(
        u128::from(d.reset_after_ms().unsigned_abs()) * 1_000_000 >= u128::from(d.reset_after_ns),
        "{}",
        ctx()
    );
    match d.outcome {
        Outcome::Allowed => {
            assert_eq!((d.retry_after_ns, d.retry_after_ms()), (0, 0), "{}", ctx());
            if tokens > 0.0 {
                let new = new.unwrap_or_else(|| panic!("allowed, no state: {}", ctx()));
                // Documented: full_at moves to max(full_at, now) + cost × T, rounded up.
                let take = (tokens * (1e9 / limit.rate_per_s())).ceil();
                let want = full_at.max(now_ns) as f64 + take;
                let base = full_at.max(now_ns);
                assert!(new.full_at_ns() > base, "{}", ctx());
                assert_eq!(
                    new.full_at_ns() - base,
                    take as u64,
                    "{} (want {want})",
                    ctx()
                );
                assert_eq!(
                    d.reset_after_ns,
                    new.full_at_ns() - now_ns.min(new.full_at_ns())
                );
            } else {
                assert_eq!(new, None, "cost 0 writes nothing: {}", ctx());
                assert_eq!(d.reset_after_ns, debt_ns(state, now_us), "{}", ctx());
            }
        }
        Outcome::Denied => {
            assert_eq!(new, None, "{}", ctx());
            assert!(tokens > 0.0 && tokens <= limit.capacity(), "{}", ctx());
            assert!(d.retry_after_ns > 0 && d.retry_after_ms() >= 1, "{}", ctx());
            assert_eq!(d.reset_after_ns, debt_ns(state, now_us), "{}", ctx());
        }
        Outcome::Impossible => {
            assert_eq!(new, None, "{}", ctx());
            assert_eq!((d.retry_after_ns, d.retry_after_ms()), (0, -1), "{}", ctx());
            assert_eq!(d.reset_after_ns, debt_ns(state, now_us), "{}", ctx());
        }
    }
    (d, new)
}

/// `peek` is `acquire` without the write, reporting the bucket as it is.
fn check_peek(limit: &Limit, state: Option<State>, now_us: u64, cost: Cost) {
    let p = peek(limit, state, now_us, cost);
    let (d, _) = check_call(limit, state, now_us, cost);
    let (now, _) = check_call(limit, state, now_us, Cost::new(0.0).unwrap());
    let ctx = format!("{limit:?} {state:?} {now_us} {cost:?}: peek {p:?}, acquire {d:?}");
    assert_eq!(p.outcome, d.outcome, "{ctx}");
    assert_eq!(p.retry_after_ns, d.retry_after_ns, "{ctx}");
    assert_eq!(p.remaining, now.remaining, "{ctx}");
    assert_eq!(p.reset_after_ns, debt_ns(state, now_us), "{ctx}");
}

/// `refund` and its invariants; returns the state after it.
fn check_refund(limit: &Limit, state: Option<State>, now_us: u64, tokens: Cost) -> Option<State> {
    let (d, change) = refund(limit, state, now_us, tokens);
    let ctx = || format!("{limit:?} {state:?} {now_us} {tokens:?}: {d:?} {change:?}");
    let now_ns = now_us.saturating_mul(1_000);
    let debt = debt_ns(state, now_us);
    let (before, _) = check_call(limit, state, now_us, Cost::new(0.0).unwrap());
    assert_eq!(
        (d.outcome, d.retry_after_ns),
        (Outcome::Allowed, 0),
        "{}",
        ctx()
    );
    assert!(d.remaining as f64 <= limit.capacity().floor(), "{}", ctx());
    assert!(
        d.remaining >= before.remaining,
        "a refund took tokens: {}",
        ctx()
    );
    let give_ns = (tokens.tokens() * (1e9 / limit.rate_per_s())).floor();
    assert!(
        ((debt - d.reset_after_ns) as f64) <= give_ns,
        "gave back more than asked: {}",
        ctx()
    );
    let after = match change {
        Change::Keep => {
            assert_eq!(d.reset_after_ns, debt, "{}", ctx());
            state
        }
        Change::Delete => {
            assert!(state.is_some() && debt > 0, "{}", ctx());
            assert_eq!(d.reset_after_ns, 0, "{}", ctx());
            assert!(give_ns >= debt as f64, "{}", ctx());
            None
        }
        Change::Set(new) => {
            let old = state.unwrap_or_else(|| panic!("set without a state: {}", ctx()));
            assert!(new.full_at_ns() < old.full_at_ns(), "{}", ctx());
            assert!(new.full_at_ns() > now_ns, "{}", ctx());
            assert_eq!(d.reset_after_ns, new.full_at_ns() - now_ns, "{}", ctx());
            Some(new)
        }
    };
    let (read, _) = check_call(limit, after, now_us, Cost::new(0.0).unwrap());
    assert_eq!(read.remaining, d.remaining, "{}", ctx());
    after
}

fn run(u: &mut Unstructured) -> Result<()> {
    let mut state = match check_decode(u)? {
        Some(state) => Some(state),
        None if u.arbitrary()? => State::from_full_at_ns(instant_ns(u)?),
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

    let mut now_us = state.map_or(NOW_NS, State::full_at_ns) / 1_000;
    let mut last_remaining = 1.0;
    for _ in 0..u.int_in_range(1..=8u8)? {
        now_us = match u.int_in_range(0..=3u8)? {
            0 => u.arbitrary()?,
            1 => now_us.saturating_add(u.int_in_range(0..=10_000_000)?),
            2 => now_us.wrapping_add_signed(u.arbitrary::<i64>()? >> u.int_in_range(0..=63)?),
            _ => state.map_or(now_us, |s| s.full_at_ns() / 1_000),
        };
        let tokens = match u.int_in_range(0..=2u8)? {
            0 => float_near(u, 1.0, limit.capacity())?,
            1 => last_remaining + f64::from(u.int_in_range(-1..=1i8)?),
            _ => limit.capacity(),
        };
        let Some(cost) = Cost::new(tokens) else {
            assert!(
                !(tokens.is_finite() && tokens >= 0.0),
                "Cost::new({tokens}) refused"
            );
            continue;
        };
        match u.int_in_range(0..=5u8)? {
            0 => {
                check_peek(&limit, state, now_us, cost);
                continue;
            }
            1 => {
                state = check_refund(&limit, state, now_us, cost);
                continue;
            }
            _ => {}
        }
        let (d, new) = check_call(&limit, state, now_us, cost);
        if d.outcome == Outcome::Denied {
            // A client that waits retry_after_ms gets through (or learns it never can).
            if let Some(later) = u64::try_from(d.retry_after_ms())
                .ok()
                .and_then(|ms| ms.checked_mul(1_000))
                .and_then(|us| now_us.checked_add(us))
            {
                let (retry, _) = check_call(&limit, state, later, cost);
                assert_ne!(retry.outcome, Outcome::Denied, "retry at {later} us: {d:?}");
            }
        }
        state = new.or(state);
        // `remaining` is exact at this instant: that many tokens are there, one more is not.
        let remaining = d.remaining as f64;
        if remaining >= 1.0 {
            let (d2, _) = check_call(&limit, state, now_us, Cost::new(remaining).unwrap());
            assert_ne!(
                d2.outcome,
                Outcome::Denied,
                "remaining {remaining} denied: {d:?}"
            );
        }
        let (d3, _) = check_call(&limit, state, now_us, Cost::new(remaining + 1.0).unwrap());
        assert_ne!(
            d3.outcome,
            Outcome::Allowed,
            "remaining {remaining} + 1 allowed: {d:?}"
        );
        // Going back in time never adds tokens.
        let earlier = now_us.saturating_sub(u.int_in_range(0..=1_000_000_000)?);
        let (d4, _) = check_call(&limit, state, earlier, Cost::new(0.0).unwrap());
        let (d5, _) = check_call(&limit, state, now_us, Cost::new(0.0).unwrap());
        assert_eq!(
            d5.remaining, d.remaining,
            "the same instant reads the same: {d:?}"
        );
        assert!(d4.remaining <= d5.remaining, "earlier {d4:?}, now {d5:?}");
        last_remaining = remaining;
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
