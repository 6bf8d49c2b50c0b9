//! Differential properties against the exact model (`model.rs`): the same generated calls
//! drive the bucket and the model, and every field of every reply, and every written
//! instant, must be the model's (within the documented bound for fractional values).

use super::*;
use Outcome::Denied;

// ---------------------------------------------------------------------------------------------
// Properties against the exact model (`model.rs`): every field of every reply.
// ---------------------------------------------------------------------------------------------

/// Rates log-uniform over the whole range, and the awkward ones by name.
fn any_rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => (-6.0..=9.0f64).prop_map(|e| 10f64.powf(e).clamp(MIN_RATE_PER_S, MAX_RATE_PER_S)),
        1 => prop::sample::select(vec![3.0, 7.0, 0.3, 333_333.0, 6000.0, 3e8, 1e-6, 1e9, 0.1]),
    ]
}

/// A rate and an integer capacity it accepts (a full refill within the century).
fn integer_limits() -> impl Strategy<Value = (f64, u64)> {
    (
        any_rate(),
        prop_oneof![1u64..=10, 1u64..=1000, 1u64..=1_000_000],
    )
        .prop_filter_map("refill longer than a century", |(rate, capacity)| {
            Limit::new(rate, capacity as f64)
                .ok()
                .map(|_| (rate, capacity))
        })
}

/// Calls of integer costs (0 to capacity + 1) separated by `0..=max_step_us`.
fn integer_calls(capacity: u64, max_step_us: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let cost = prop_oneof![1 => Just(0u64), 6 => 1..=capacity.min(4), 2 => 0..=capacity + 1];
    prop::collection::vec((0..=max_step_us, cost), 1..48)
}

/// Drives `acquire` and the model through the same calls, comparing every reply.
fn run_against_model(rate: f64, capacity: u64, start_us: u64, calls: &[(u64, u64)]) {
    let lim = limit(rate, capacity as f64);
    let mut m = model::Model::new(rate, capacity as f64);
    let mut current = None;
    let mut now_us = start_us;
    for (i, &(step_us, c)) in calls.iter().enumerate() {
        now_us += step_us;
        let at = format!(
            "rate {rate}, capacity {capacity}, call {i} at +{} µs, cost {c}",
            now_us - start_us
        );
        let seen = peek(&lim, current, now_us, cost(c as f64));
        assert_matches(&seen, &m.peek(now_us, c as f64), &format!("peek, {at}"));
        let (d, new_state) = acquire(&lim, current, now_us, cost(c as f64));
        assert_matches(&d, &m.acquire(now_us, c as f64), &at);
        assert_eq!(
            new_state.is_some(),
            d.allowed() && c > 0,
            "writes iff it took, {at}"
        );
        current = new_state.or(current);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Points 1 and 4: at one instant, from full, takes are allowed while their sum fits, and
    /// every reply (remaining, retry, reset) is the model's; cost 0 included.
    #[test]
    fn bursts_in_one_instant_match_the_model(
        ((rate, capacity), calls) in integer_limits()
            .prop_flat_map(|(r, c)| (Just((r, c)), integer_calls(c, 0))),
        start_us in nows(),
    ) {
        run_against_model(rate, capacity, start_us, &calls);
    }

    /// Points 2 and 4: at random µs instants, refill is exact and every reply is the model's.
    #[test]
    fn calls_at_random_instants_match_the_model(
        ((rate, capacity), calls) in integer_limits().prop_flat_map(|(r, c)| {
            // Steps up to about two token intervals, so calls see partial refills.
            let max_step_us = ((2e6 / r) as u64).clamp(1, 1_000_000_000_000);
            (Just((r, c)), integer_calls(c, max_step_us))
        }),
        start_us in nows(),
    ) {
        run_against_model(rate, capacity, start_us, &calls);
    }

    /// Point 2, the other half: `retry_after_ms` is enough. The same request, made that many
    /// ms later, is allowed (the model agrees, so this is the bucket's promise to a client).
    #[test]
    fn waiting_retry_after_ms_is_enough(
        ((rate, capacity), calls) in integer_limits()
            .prop_flat_map(|(r, c)| (Just((r, c)), integer_calls(c, 0))),
        start_us in nows(),
    ) {
        let lim = limit(rate, capacity as f64);
        let mut current = None;
        for &(_, c) in &calls {
            let (d, new_state) = acquire(&lim, current, start_us, cost(c as f64));
            if d.outcome == Denied {
                let wait_us = u64::try_from(d.retry_after_ms()).unwrap() * 1000;
                let (later, _) = acquire(&lim, current, start_us + wait_us, cost(c as f64));
                prop_assert!(later.allowed(), "denied again after {} ms", d.retry_after_ms());
            }
            current = new_state.or(current);
        }
    }

    /// Point 4: after the capacity shrank below what the bucket owes, cost 0 is denied for
    /// exactly as long as the model says, and RL.PEEK agrees.
    #[test]
    fn zero_cost_after_a_shrink_matches_the_model(
        ((rate, capacity), taken, smaller, wait_us) in integer_limits()
            .prop_filter("room to shrink", |&(_, c)| c >= 2)
            .prop_flat_map(|(r, c)| {
                let interval_us = ((1e6 / r) as u64).clamp(1, 1_000_000_000_000);
                (Just((r, c)), 1..=c, 1..c, 0..=interval_us * c)
            }),
        start_us in nows(),
    ) {
        let (big, small) = (limit(rate, capacity as f64), limit(rate, smaller as f64));
        let mut m = model::Model::new(rate, capacity as f64);
        m.acquire(start_us, taken as f64);
        let (_, st) = acquire(&big, None, start_us, cost(taken as f64));
        let shrunk = m.relimit(&model::Model::new(rate, smaller as f64));
        let now_us = start_us + wait_us;
        let (d, writes) = acquire(&small, st, now_us, cost(0.0));
        assert_matches(&d, &shrunk.clone().acquire(now_us, 0.0), "acquire cost 0");
        prop_assert_eq!(writes, None);
        assert_matches(&peek(&small, st, now_us, cost(0.0)), &shrunk.peek(now_us, 0.0), "peek cost 0");
    }

    /// Point 5: fractional rates, capacities and costs. Following the same takes, the bucket
    /// never allows what the model refuses, and refuses only within its documented bound:
    /// each take charged under one tick (1/den ns) more, and capacity and cost each rounded
    /// by under a tick.
    #[test]
    fn fractional_values_are_never_laxer_and_within_the_bound(
        rate in prop_oneof![Just(0.5), Just(3.0), Just(0.3), any_rate()],
        capacity_tenths in 1u32..=100_000,
        calls in prop::collection::vec((0u64..=2_000_000, 0u32..=50), 1..48),
        start_us in nows(),
    ) {
        let capacity = f64::from(capacity_tenths) / 10.0;
        let Ok(lim) = Limit::new(rate, capacity) else { return Ok(()) };
        let ticks_per_ns = lim.ns_per_token().1;
        let mut m = model::Model::new(rate, capacity);
        let mut current = None;
        let mut now_us = start_us;
        let mut takes = 0u64;
        for (step_us, tenths) in calls {
            now_us += step_us;
            let c = f64::from(tenths) / 10.0;
            let (d, new_state) = acquire(&lim, current, now_us, cost(c));
            let zero = num_rational::BigRational::from_integer(0.into());
            let model_allows = m.fits_within(now_us, c, &zero);
            if d.allowed() {
                prop_assert!(model_allows, "allowed {} that the model refuses", c);
                if c > 0.0 {
                    m.force_take(now_us, c);
                    takes += 1;
                }
            } else if model_allows {
                let bound = num_rational::BigRational::new(
                    (takes + 2).into(),
                    ticks_per_ns.into(),
                );
                prop_assert!(
                    !m.fits_within(now_us, c, &-bound),
                    "refused {} by more than {} ticks", c, takes + 2
                );
            }
            current = new_state.or(current);
        }
    }

    /// RL.THROTTLE's limits, "count per period seconds", are exact as fractions: bursts and
    /// refills match the model of `period × 1e9 / count` ns per token.
    #[test]
    fn per_period_limits_match_the_model(
        count in prop_oneof![1u64..=10, 1u64..=1_000_000_000],
        period_s in prop_oneof![1u64..=60, 1u64..=3_153_600],
        max_burst in 0u64..=100,
        calls in prop::collection::vec((0u64..=3_000_000, 0u64..=3), 1..32),
        start_us in nows(),
    ) {
        let total = max_burst + 1;
        let Ok(lim) = Limit::per_period(count, period_s * S, total as f64) else { return Ok(()) };
        let mut m = model::Model::per_period(count, period_s * S, total as f64);
        let mut current = None;
        let mut now_us = start_us;
        for (step_us, c) in calls {
            now_us += step_us;
            let (d, new_state) = acquire(&lim, current, now_us, cost(c as f64));
            assert_matches(&d, &m.acquire(now_us, c as f64), &format!("{count} per {period_s} s"));
            current = new_state.or(current);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decimal and N/S rates, refunds and stored instants, against the exact model.
// ---------------------------------------------------------------------------------------------

/// A rate as a user types it: a decimal with random digits and exponent (`3.7e-4`,
/// `0.0123`, `81`), or `N/S` from pairs that do not divide (100/60, 7/3, 3/10) or random
/// ones, some with decimal parts. Only texts `Limit::parse` accepts with `capacity`.
pub(super) fn rate_texts() -> impl Strategy<Value = String> {
    prop_oneof![
        // digits × 10^exp: 1 to 17 digits, anywhere from 1e-6 to 1e9.
        (1u64..=99_999_999_999_999_999, -22i32..=9).prop_map(|(m, e)| format!("{m}e{e}")),
        (1u64..=9_999, 0u32..=8).prop_map(|(m, frac)| {
            let scale = 10u64.pow(frac);
            format!("{}.{:0width$}", m / scale, m % scale, width = frac as usize)
        }),
        prop::sample::select(vec![
            "100/60", "7/3", "3/10", "1000/7", "5/3600", "2/3", "1/86400", "0.3", "0.1", "0.01",
            "3", "7", "0.000001", "1/1e-9", "2.5/0.7",
        ])
        .prop_map(String::from),
        (1u64..=1_000_000, 1u64..=100_000).prop_map(|(n, s)| format!("{n}/{s}")),
        (1u64..=1_000, 1u64..=1_000, 0u32..=3).prop_map(|(n, s, k)| format!("{n}/{s}e-{k}")),
    ]
}

/// One operation on a bucket: acquire, peek or refund `cost` after `step_us`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire,
    Peek,
    Refund,
}

fn ops(capacity: u64, max_step_us: u64) -> impl Strategy<Value = Vec<(Op, u64, u64)>> {
    let op = prop_oneof![5 => Just(Op::Acquire), 1 => Just(Op::Peek), 2 => Just(Op::Refund)];
    let cost = prop_oneof![1 => Just(0u64), 6 => 1..=capacity.min(4), 2 => 0..=capacity + 1];
    prop::collection::vec((op, 0..=max_step_us, cost), 1..40)
}

/// Whether `st` (or a missing key) is the model's exact instant: the stored state is at least
/// it and less than 2^-63 ns above it (the fraction is rounded up, never down).
pub(super) fn holds_the_model_instant(st: Option<State>, m: &model::Model, now_us: u64) -> bool {
    let two63 = num_rational::BigRational::new(1.into(), num_bigint::BigInt::from(1u64) << 63);
    match (st, &m.full_at_ns) {
        (None, _) => m.is_full(now_us),
        (Some(s), Some(exact)) => {
            let got = instant(s);
            &got >= exact && got < exact + two63
        }
        // A state the model has no instant for: only if both are full now.
        (Some(s), None) => {
            instant(s)
                <= num_rational::BigRational::from_integer((u128::from(now_us) * 1000).into())
        }
    }
}

/// Drives the bucket and the model of the same texts through acquires, peeks and refunds:
/// every reply is the model's, and every written state is the model's exact instant.
fn run_text_against_model(rate: &str, capacity: u64, start_us: u64, calls: &[(Op, u64, u64)]) {
    let lim = Limit::parse(rate.as_bytes(), capacity.to_string().as_bytes()).unwrap();
    let mut m = model::Model::parse(rate, &capacity.to_string());
    let mut current = None;
    let mut now_us = start_us;
    for (i, &(op, step_us, c)) in calls.iter().enumerate() {
        now_us += step_us;
        let at = format!(
            "rate {rate}, capacity {capacity}, call {i} {op:?} at +{} µs, cost {c}",
            now_us - start_us
        );
        let cost = Cost::parse(c.to_string().as_bytes()).unwrap();
        match op {
            Op::Peek => assert_matches(
                &peek(&lim, current, now_us, cost),
                &m.peek(now_us, c as f64),
                &at,
            ),
            Op::Acquire => {
                let (d, new_state) = acquire(&lim, current, now_us, cost);
                assert_matches(&d, &m.acquire(now_us, c as f64), &at);
                current = new_state.or(current);
            }
            Op::Refund => {
                let (d, change) = refund(&lim, current, now_us, cost);
                m.refund(now_us, c as f64);
                let after = m.peek(now_us, 0.0);
                assert_eq!(
                    (d.remaining, d.reset_after_ns),
                    (after.remaining, after.reset_after_ns),
                    "refund, {at}"
                );
                match change {
                    Change::Keep => {}
                    Change::Set(s) => current = Some(s),
                    Change::Delete => current = None,
                }
            }
        }
        assert!(
            holds_the_model_instant(current, &m, now_us),
            "state {current:?} vs model {:?}, {at}",
            m.full_at_ns
        );
    }
}

proptest! {
    // Sized so that `cargo test -p rl-bucket` (debug, in `make test`) stays under a minute.
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Decimal and N/S rates: bursts, refill, peeks and refunds match the exact model of the
    /// same texts, and every written state is the model's instant to within 2^-63 ns.
    #[test]
    fn decimal_and_fraction_rates_match_the_model(
        (rate, capacity) in (rate_texts(), prop_oneof![1u64..=10, 1u64..=1000, 1u64..=100_000])
            .prop_filter("rate or refill out of range", |(r, c)| {
                Limit::parse(r.as_bytes(), c.to_string().as_bytes()).is_ok()
            }),
        steps in prop_oneof![Just(0u64), Just(1_000u64), Just(1_000_000u64), Just(3_600_000_000u64)],
        seed_calls in ops(1000, 1),
        start_us in nows(),
    ) {
        // Scale the generated steps so some calls see partial refills at this rate.
        let calls: Vec<_> = seed_calls
            .iter()
            .map(|&(op, step, c)| (op, step * steps, c.min(capacity + 1)))
            .collect();
        run_text_against_model(&rate, capacity, start_us, &calls);
    }

    /// Refunds against the model at any rate: what comes back, the reply, and the stored
    /// instant are the model's (integer counts are exact).
    #[test]
    fn refunds_match_the_model(
        ((rate, capacity), calls) in integer_limits().prop_flat_map(|(r, c)| {
            let max_step_us = ((2e6 / r) as u64).clamp(1, 1_000_000_000_000);
            (Just((r, c)), ops(c, max_step_us))
        }),
        start_us in nows(),
    ) {
        run_text_against_model(&format!("{rate}"), capacity, start_us, &calls);
    }

    /// Per-period limits as RL.GCRA allows them: nanosecond periods and up to 1e15 tokens a
    /// period, bursts up to 1e15, against the model of `period_ns / count` ns per token.
    #[test]
    fn per_period_limits_with_nanosecond_periods_match_the_model(
        count in prop_oneof![1u64..=10, 1u64..=1_000_000_000, 1u64..=1_000_000_000_000_000],
        period_ns in prop_oneof![1u64..=1_000, 1u64..=1_000_000_000, 1u64..=1_000_000_000_000_000_000],
        total in prop_oneof![1u64..=100, 1u64..=1_000_000_000_000_000],
        calls in prop::collection::vec((0u64..=3_000_000, 0u64..=3, 0u64..=4), 1..32),
        start_us in nows(),
    ) {
        let Ok(lim) = Limit::per_period(count, period_ns, total as f64) else { return Ok(()) };
        let mut m = model::Model::per_period(count, period_ns, total as f64);
        let mut current = None;
        let mut now_us = start_us;
        for (step_us, small, scale) in calls {
            now_us += step_us;
            // Small costs, or a large share of the burst.
            let c = if scale == 0 { total } else { small * total.div_ceil(10u64.pow(scale as u32 * 3)).max(1) };
            let at = format!("{count} per {period_ns} ns, burst {total}, cost {c}");
            let (d, new_state) = acquire(&lim, current, now_us, Cost::parse(c.to_string().as_bytes()).unwrap());
            assert_matches(&d, &m.acquire(now_us, c as f64), &at);
            current = new_state.or(current);
            prop_assert!(holds_the_model_instant(current, &m, now_us), "{}", at);
        }
    }
}
