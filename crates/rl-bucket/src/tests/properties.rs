//! The invariants as properties over generated limits, times, states and costs: never above
//! capacity, `remaining` is takeable, denied just before `retry_after` and allowed at it,
//! splitting a cost never lets more through, no more granted than capacity plus refill, and
//! a clock stepping back never adds tokens.

use super::*;

/// The longest full refill the generated limits have: the 100-year cap itself, so states
/// (up to 2.5 refills past 2020–2033) reach past 2262, where a take cannot be stored and a
/// denial must not promise one (`a_denial_never_promises_a_take_that_cannot_be_stored`).
const HORIZON_S: f64 = MAX_REFILL_S;

/// Valid limits: capacity whole, in quarter tokens, or any fraction up to 1e6; rate
/// log-uniform between the slowest the horizon allows and 1e9/s.
fn limits() -> impl Strategy<Value = Limit> {
    let capacity = prop_oneof![
        (1u32..=10).prop_map(f64::from),
        (1u32..=1_000_000).prop_map(f64::from),
        (1u32..=4_000_000).prop_map(|q| f64::from(q) / 4.0),
        1e-3..=1e6f64,
    ];
    capacity.prop_flat_map(|capacity| {
        let slowest = (capacity / HORIZON_S).max(MIN_RATE_PER_S).log10();
        (slowest..=9.0).prop_map(move |e| {
            let rate = 10f64.powf(e).clamp(MIN_RATE_PER_S, MAX_RATE_PER_S);
            limit(rate, capacity)
        })
    })
}

/// A state near `now`: missing; full_at anywhere from one full refill before now to 2.5
/// refills after (beyond empty), plus some ns of jitter off the µs grid; or exactly on the
/// edge of holding `k` whole tokens (`(capacity - k) × T` short of full, ± 1 ns), where
/// float rounding in the whole-token count is most likely to be off by one.
fn states(lim: Limit, now_us: u64) -> impl Strategy<Value = Option<State>> {
    let ns_per_token = 1e9 / lim.rate_per_s();
    let full_ns = lim.capacity() * ns_per_token;
    let now_ns = now_us * 1000;
    let whole = lim.capacity().floor() as u64;
    prop_oneof![
        1 => Just(None),
        4 => (-1.0..=2.5f64, -1000i64..=1000).prop_map(move |(f, jitter)| {
            let at = now_ns as f64 + f * full_ns + jitter as f64;
            State::from_full_at_ns(at.max(1.0) as u64)
        }),
        3 => (0..=whole, 0u64..=2).prop_map(move |(k, nudge)| {
            let edge_ns = ((lim.capacity() - k as f64) * ns_per_token).floor() as u64;
            State::from_full_at_ns((now_ns + edge_ns + nudge).saturating_sub(1))
        }),
    ]
}

/// A cost for `lim`: zero, whole, a quarter multiple, any fraction of capacity, capacity
/// itself, or (rarely) above it.
fn costs(lim: Limit) -> impl Strategy<Value = f64> {
    let capacity = lim.capacity();
    let whole_max = capacity.ceil().min(1e6) as u64;
    prop_oneof![
        1 => Just(0.0),
        3 => (1..=whole_max.max(1)).prop_map(|k| k as f64),
        2 => (1..=(whole_max * 4).max(1)).prop_map(|q| q as f64 / 4.0),
        3 => (0.0..=1.0f64).prop_map(move |f| f * capacity),
        1 => Just(capacity),
        1 => (1.0..=2.0f64).prop_map(move |f| f * capacity),
    ]
}

/// A limit, a time, a state near it and a cost.
fn cases() -> impl Strategy<Value = (Limit, u64, Option<State>, f64)> {
    (limits(), nows())
        .prop_flat_map(|(lim, now_us)| (Just(lim), Just(now_us), states(lim, now_us), costs(lim)))
}

proptest! {
    /// The bucket never holds more than capacity, a denial or a cost of 0 writes nothing,
    /// and `remaining` is exact: a request for it succeeds, one for a token more does not.
    #[test]
    fn never_above_capacity_and_remaining_is_takeable((lim, now_us, st, c) in cases()) {
        let (d, new_state) = acquire(&lim, st, now_us, cost(c));
        let capacity = lim.capacity();
        prop_assert!(d.remaining as f64 <= capacity.floor());
        match d.outcome {
            Outcome::Allowed => {
                prop_assert_eq!(new_state.is_some(), c > 0.0);
                // What is left is at most capacity - cost (whole tokens, rounded down).
                prop_assert!(d.remaining as f64 <= (capacity - c).floor());
            }
            Outcome::Denied | Outcome::Impossible => prop_assert_eq!(new_state, None),
        }
        if c > capacity {
            prop_assert_eq!(d.outcome, Outcome::Impossible);
        } else if d.outcome == Outcome::Impossible {
            // Within capacity, only a take that cannot be stored (past 2262) is impossible.
            prop_assert!(take_cannot_be_stored(&lim, st, now_us, c), "wrongly impossible");
        }

        let after = new_state.or(st);
        if d.remaining > 0 {
            let (take, _) = acquire(&lim, after, now_us, cost(d.remaining as f64));
            prop_assert_eq!(take.outcome, Outcome::Allowed, "remaining {} not takeable", d.remaining);
        }
        let (more, _) = acquire(&lim, after, now_us, cost(d.remaining as f64 + 1.0));
        prop_assert!(!more.allowed(), "remaining {} + 1 was takeable too", d.remaining);
    }

    /// A denied request is still denied 1 µs before `retry_after` (rounded up to the µs
    /// clock) and allowed at it, and at the rounded-up ms view.
    #[test]
    fn denied_just_before_retry_after_and_allowed_at_it((lim, now_us, st, c) in cases()) {
        let (d, _) = acquire(&lim, st, now_us, cost(c));
        if d.outcome == Outcome::Denied {
            prop_assert!(d.retry_after_ns > 0);
            prop_assert!(d.retry_after_ms() > 0);
            let wait_us = d.retry_after_ns.div_ceil(1000);
            let (just_before, _) = acquire(&lim, st, now_us + wait_us - 1, cost(c));
            prop_assert_eq!(just_before.outcome, Outcome::Denied, "allowed 1 µs early");
            let (at, _) = acquire(&lim, st, now_us + wait_us, cost(c));
            prop_assert_eq!(at.outcome, Outcome::Allowed);
            let wait_ms = u64::try_from(d.retry_after_ms()).unwrap();
            let (at_ms, _) = acquire(&lim, st, now_us + wait_ms * 1000, cost(c));
            prop_assert_eq!(at_ms.outcome, Outcome::Allowed);
        }
    }

    /// If `a` then `b` both succeed at one instant, `a + b` at once succeeds from the same
    /// state: splitting a request never lets more through.
    #[test]
    fn splitting_a_cost_never_lets_more_through(
        ((lim, now_us, st, a), b_frac) in (cases(), 0.0..=1.0f64)
    ) {
        let b_options = [b_frac * lim.capacity(), (b_frac * lim.capacity() * 4.0).floor() / 4.0];
        for b in b_options {
            let (first, s1) = acquire(&lim, st, now_us, cost(a));
            if !first.allowed() {
                continue;
            }
            let (second, _) = acquire(&lim, s1.or(st), now_us, cost(b));
            if second.allowed() {
                let (whole, _) = acquire(&lim, st, now_us, cost(a + b));
                prop_assert!(
                    whole.allowed(),
                    "{} then {} allowed, {} at once {:?}", a, b, a + b, whole
                );
            }
        }
    }

    /// Over any sequence of calls from a full bucket, the tokens granted by time t never
    /// exceed capacity + rate × (t - t0).
    #[test]
    fn granted_never_exceeds_capacity_plus_refill(
        (lim, calls) in limits().prop_flat_map(|lim| {
            let interval_us = (1e6 / lim.rate_per_s()).min(1e12);
            let step = prop_oneof![
                Just(0.0),
                0.0..=(3.0 * interval_us),
                // Long idle gaps, up to the whole refill (capped at ~116 days so that 64 of
                // them stay well inside the representable range).
                0.0..=(3.0 * interval_us * lim.capacity()).min(1e13),
            ];
            (Just(lim), prop::collection::vec((step, costs(lim)), 1..64))
        }),
        start_us in nows(),
    ) {
        let mut current = None;
        let mut now_us = start_us;
        let mut granted = 0.0f64;
        for (step_us, c) in calls {
            now_us += step_us as u64;
            let (d, new_state) = acquire(&lim, current, now_us, cost(c));
            if d.allowed() {
                granted += c;
            }
            current = new_state.or(current);
            let elapsed_s = (now_us - start_us) as f64 / 1e6;
            let model = lim.capacity() + lim.rate_per_s() * elapsed_s;
            // Float noise only, and only in the direction that lets the limiter pass.
            prop_assert!(
                granted <= model * (1.0 + 1e-9),
                "granted {} > model {} after {} s", granted, model, elapsed_s
            );
        }
    }

    /// A clock that steps back never adds tokens: remaining does not rise, and nothing is
    /// allowed at the earlier time that was denied at the later one. This holds both for a
    /// stored state and for the state a take at the later time just wrote.
    #[test]
    fn a_clock_stepping_back_never_adds_tokens(
        (lim, now_us, st, c) in cases(),
        back_us in prop_oneof![1u64..=1000, 1u64..=1_000_000_000_000],
    ) {
        let earlier_us = now_us - back_us;
        // The level, probed with cost 0, is never higher at the earlier time.
        let (probe_now, _) = acquire(&lim, st, now_us, cost(0.0));
        let (probe_back, _) = acquire(&lim, st, earlier_us, cost(0.0));
        prop_assert!(probe_back.remaining <= probe_now.remaining);
        // Whatever the earlier time allows, the later one allows too.
        let (later, written) = acquire(&lim, st, now_us, cost(c));
        let (earlier, _) = acquire(&lim, st, earlier_us, cost(c));
        prop_assert!(!earlier.allowed() || later.allowed());
        // After a take at the later time, stepping back shows no more than was left.
        if let Some(w) = written {
            let (back, _) = acquire(&lim, Some(w), earlier_us, cost(0.0));
            prop_assert!(back.remaining <= later.remaining);
        }
    }
}
