//! [`reserve`] and [`settle_reservation`]: reservations made and settled by id, each record
//! consumed once, against the exact model (`model.rs`) at 3/s, 7/s and 3 per 10 s: a
//! reservation is the model's take of the estimate, a settle the model's refund of the
//! over-estimate or charge of the under-estimate, a second settle changes nothing.

use super::against_model::holds_the_model_instant;
use super::*;

fn text_cost(tokens: &str) -> Cost {
    Cost::parse(tokens.as_bytes()).unwrap()
}

fn id(n: usize) -> LeaseId {
    LeaseId::new(format!("r{n}").as_bytes()).unwrap()
}

#[test]
fn a_settled_id_is_not_open_and_a_repeated_reserve_takes_nothing() {
    let lim = Limit::parse(b"3", b"3").unwrap();
    let got = reserve(&lim, None, &[], NOW_US, text_cost("2"), 1_000, id(1)).unwrap();
    assert_eq!(got.decision.remaining, 1);
    let (state, records) = got.write.unwrap();
    // The same id again: answered allowed, the bucket as it is, nothing written.
    let again = reserve(
        &lim,
        Some(state),
        &records,
        NOW_US,
        text_cost("2"),
        1_000,
        id(1),
    )
    .unwrap();
    assert!(again.repeated && again.decision.allowed() && again.write.is_none());
    assert_eq!(again.decision.remaining, 1);
    let (settled, change, left) =
        settle_reservation(&lim, Some(state), &records, NOW_US, id(1), text_cost("1")).unwrap();
    assert_eq!(settled.balance, 2);
    assert!(left.is_empty());
    let after = match change {
        Change::Set(s) => Some(s),
        Change::Keep => Some(state),
        Change::Delete => None,
    };
    assert_eq!(
        settle_reservation(&lim, after, &left, NOW_US, id(1), text_cost("1")),
        Err(SettleError::NotOpen)
    );
    // Lapsed: 1 s later the record is gone, the tokens stay taken.
    assert_eq!(
        settle_reservation(
            &lim,
            Some(state),
            &records,
            NOW_US + S_US,
            id(1),
            text_cost("0")
        ),
        Err(SettleError::NotOpen)
    );
}

#[test]
fn reservations_are_capped_and_a_zero_estimate_refused() {
    let lim = Limit::parse(b"1", b"10000").unwrap();
    let mut state = None;
    let mut records = Vec::new();
    for n in 0..MAX_RESERVATIONS {
        let got = reserve(&lim, state, &records, NOW_US, Cost::ONE, 1_000, id(n)).unwrap();
        let (s, r) = got.write.unwrap();
        (state, records) = (Some(s), r.into_vec());
    }
    assert!(valid_records(&records));
    let over = MAX_RESERVATIONS;
    assert_eq!(
        reserve(&lim, state, &records, NOW_US, Cost::ONE, 1_000, id(over)),
        Err(ReserveError::TooMany)
    );
    // A retry of an open one is still answered.
    assert!(
        reserve(&lim, state, &records, NOW_US, Cost::ONE, 1_000, id(0))
            .unwrap()
            .repeated
    );
    // Once they lapse there is room again.
    let later = NOW_US + S_US;
    let got = reserve(&lim, state, &records, later, Cost::ONE, 1_000, id(over)).unwrap();
    assert_eq!(got.write.unwrap().1.len(), 1);
    assert_eq!(
        reserve(&lim, None, &[], NOW_US, text_cost("0"), 1_000, id(0)),
        Err(ReserveError::ZeroEstimate)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Several reservations open at once, settled in any order, some twice, some never:
    /// every reply and the stored instant after every call equal the exact model's.
    #[test]
    fn reserve_and_settle_match_the_model(
        rate in prop::sample::select(vec!["3", "7", "3/10"]),
        capacity in prop_oneof![1u64..=10, 1u64..=1000],
        ops in prop::collection::vec((0u8..3, 0usize..6, 0u64..=2000, 0u64..=2_000_000), 1..40),
        start_us in nows(),
    ) {
        let cap = capacity.to_string();
        let lim = Limit::parse(rate.as_bytes(), cap.as_bytes()).unwrap();
        let mut m = model::Model::parse(rate, &cap);
        let mut state: Option<State> = None;
        let mut records: Vec<Reservation> = Vec::new();
        // The model's open reservations: id number → estimate text, expiry.
        let mut open: Vec<(usize, String, u64)> = Vec::new();
        let mut now_us = start_us;
        const TTL_MS: u64 = 1_500;
        for (kind, n, amount, step) in ops {
            now_us += step;
            open.retain(|&(_, _, at)| now_us < at);
            let tokens = (amount * capacity / 1000).to_string();
            if kind == 0 {
                let tokens = if tokens == "0" { "1".to_string() } else { tokens };
                let got = reserve(&lim, state, &records, now_us, text_cost(&tokens), TTL_MS, id(n)).unwrap();
                if open.iter().any(|&(k, _, _)| k == n) {
                    prop_assert!(got.repeated && got.write.is_none());
                    continue;
                }
                let want = m.acquire_exact(now_us, model::decimal(&tokens));
                prop_assert_eq!(got.decision.allowed(), want.allowed == Some(true));
                prop_assert_eq!(got.decision.remaining, want.remaining);
                if let Some((s, r)) = got.write {
                    state = Some(s);
                    records = r.into_vec();
                    open.push((n, tokens, now_us + TTL_MS * 1000));
                }
            } else {
                let got = settle_reservation(&lim, state, &records, now_us, id(n), text_cost(&tokens));
                let Some(pos) = open.iter().position(|&(k, _, _)| k == n) else {
                    prop_assert_eq!(got, Err(SettleError::NotOpen));
                    continue;
                };
                let (e, a) = (model::decimal(&open[pos].1), model::decimal(&tokens));
                let want = if a > e {
                    m.charge_exact(now_us, a - e)
                } else {
                    m.refund_exact(now_us, e - a);
                    m.charge_exact(now_us, num_rational::BigRational::from_integer(0.into()))
                };
                match (got, want) {
                    (Ok((settled, change, left)), Some(want)) => {
                        prop_assert_eq!(
                            (settled.balance, settled.repaid_after_ns, settled.reset_after_ns),
                            (want.balance, want.repaid_after_ns, want.reset_after_ns)
                        );
                        open.remove(pos);
                        state = match change {
                            Change::Keep => state,
                            Change::Set(s) => Some(s),
                            Change::Delete => None,
                        };
                        // A full bucket is deleted, and its records with it.
                        records = if state.is_some() { left.into_vec() } else { Vec::new() };
                        if state.is_none() {
                            open.clear();
                        }
                    }
                    (Err(SettleError::DebtTooLong), None) => {}
                    (got, want) => prop_assert!(false, "settle {:?}, model {:?}", got, want),
                }
            }
            prop_assert!(holds_the_model_instant(state, &m, now_us));
        }
    }
}
