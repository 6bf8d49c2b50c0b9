//! [`settle`]: reservations (a take of the estimate) settled with the actual cost, against
//! the exact model (`model.rs`): over-estimates go back as the model's refund of the exact
//! difference, under-estimates are the model's charge of it, at 3/s, 7/s, 3 per 10 s and any
//! decimal or N/S rate, with whole and fractional estimates and actuals.

use super::against_model::{holds_the_model_instant, rate_texts};
use super::*;

fn parsed(rate: &str, capacity: &str) -> Limit {
    Limit::parse(rate.as_bytes(), capacity.as_bytes()).unwrap()
}

fn text_cost(tokens: &str) -> Cost {
    Cost::parse(tokens.as_bytes()).unwrap()
}

#[test]
fn a_settle_gives_back_the_over_estimate_and_charges_the_under_estimate() {
    // (rate, capacity, estimate, actual, balance, repaid_after_ns, reset_after_ns), the
    // reservation taken from full in the same instant.
    let rows: [(&str, &str, &str, &str, i64, u64, u64); 7] = [
        // 3/s from 3, reserved 3, used 1: two back, one short of full for T = 1/3 s.
        ("3", "3", "3", "1", 2, 0, 333_333_334),
        // Used exactly the estimate: nothing moves.
        ("7", "7", "4", "4", 3, 0, 571_428_572),
        // Used 9 of an estimate of 4 at 7/s from 7: 2 in debt, 2T to repay, 9T to full.
        ("7", "7", "4", "9", -2, 285_714_286, 1_285_714_286),
        // 3 per 10 s: estimate 2, used 0.5: 1.5 back; half a token short.
        ("3/10", "3", "2", "0.5", 2, 0, 1_666_666_667),
        // Used nothing: the whole estimate goes back, and the bucket is full.
        ("3", "3", "2", "0", 3, 0, 0),
        // A fractional estimate and actual: 2.75 - 0.25 = 2.5 back at 3/s.
        ("3", "3", "2.75", "0.25", 2, 0, 83_333_334),
        // Charged past the capacity from empty: 3 more at 3/s, 3 in debt for 1 s.
        ("3", "3", "3", "6", -3, 1_000_000_000, 2_000_000_000),
    ];
    for (i, (rate, capacity, estimate, actual, balance, repaid, reset)) in
        rows.into_iter().enumerate()
    {
        let lim = parsed(rate, capacity);
        let (taken, state) = acquire(&lim, None, NOW_US, text_cost(estimate));
        assert!(taken.allowed(), "row {i}");
        let (settled, _) =
            settle(&lim, state, NOW_US, text_cost(estimate), text_cost(actual)).unwrap();
        assert_eq!(
            (
                settled.balance,
                settled.repaid_after_ns,
                settled.reset_after_ns
            ),
            (balance, repaid, reset),
            "row {i}: {estimate} then {actual} at {rate}, capacity {capacity}"
        );
    }
}

#[test]
fn an_under_estimate_past_the_bound_is_refused_and_writes_nothing() {
    let lim = parsed("1", "1");
    let (_, state) = acquire(&lim, None, NOW_US, Cost::ONE);
    // One token already owed, plus 3153600000 more: a second past 100 years' refill.
    assert_eq!(
        settle(&lim, state, NOW_US, Cost::ONE, text_cost("3153600001")),
        Err(ChargeError::DebtTooLong)
    );
    // Exactly 100 years' refill from now is allowed.
    let (settled, change) =
        settle(&lim, state, NOW_US, Cost::ONE, text_cost("3153600000")).unwrap();
    assert_eq!(settled.balance, -3_153_599_999);
    assert!(matches!(change, Change::Set(_)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Reservations, each settled later at a random time: every reply, and the stored
    /// instant after every call, equal the exact model's. Whole amounts, which the bucket
    /// keeps exactly at every rate (a fractional cost rounds to a tick of under 1 ns, as
    /// the crate docs say; the table above checks fractional settles by hand).
    #[test]
    fn settles_match_the_model(
        rate in prop_oneof![
            3 => prop::sample::select(vec!["3", "7", "3/10"]).prop_map(String::from),
            1 => rate_texts(),
        ],
        capacity in prop_oneof![1u64..=10, 1u64..=1000],
        pairs in prop::collection::vec((0u64..=2000, 0u64..=2000, 0u64..=3_000_000, 0u64..=3_000_000), 1..20),
        start_us in nows(),
    ) {
        let cap = capacity.to_string();
        let Ok(lim) = Limit::parse(rate.as_bytes(), cap.as_bytes()) else {
            return Ok(());
        };
        let mut m = model::Model::parse(&rate, &cap);
        let mut state = None;
        let mut now_us = start_us;
        for (estimate, actual, reserve_step, settle_step) in &pairs {
            // Amounts drawn for capacity 1000, scaled to this one's: 0 to twice the capacity.
            let scale = |n: u64| (n * capacity / 1000).to_string();
            let (estimate, actual) = (scale(*estimate), scale(*actual));
            now_us += reserve_step;
            let (taken, new_state) = acquire(&lim, state, now_us, text_cost(&estimate));
            let want = m.acquire_exact(now_us, model::decimal(&estimate));
            prop_assert_eq!(taken.allowed(), want.allowed == Some(true));
            prop_assert_eq!(taken.remaining, want.remaining);
            state = new_state.or(state);
            prop_assert!(holds_the_model_instant(state, &m, now_us));
            if !taken.allowed() {
                continue;
            }
            now_us += settle_step;
            let got = settle(&lim, state, now_us, text_cost(&estimate), text_cost(&actual));
            let (e, a) = (model::decimal(&estimate), model::decimal(&actual));
            let want = if a > e {
                m.charge_exact(now_us, a - e)
            } else {
                m.refund_exact(now_us, e - a);
                m.charge_exact(now_us, num_rational::BigRational::from_integer(0.into()))
            };
            match (got, want) {
                (Ok((settled, change)), Some(want)) => {
                    prop_assert_eq!(
                        (settled.balance, settled.repaid_after_ns, settled.reset_after_ns),
                        (want.balance, want.repaid_after_ns, want.reset_after_ns),
                        "{} then {} at {}, capacity {}", estimate, actual, rate, capacity
                    );
                    state = match change {
                        Change::Keep => state,
                        Change::Set(s) => Some(s),
                        Change::Delete => None,
                    };
                }
                (Err(ChargeError::DebtTooLong), None) => {}
                (got, want) => prop_assert!(false, "settle {:?}, model {:?}", got, want),
            }
            prop_assert!(holds_the_model_instant(state, &m, now_us));
        }
    }
}
