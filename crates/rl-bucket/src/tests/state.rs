//! [`State`]: its range, the key's expiry, and instants written by 0.1.0 and 0.2.0 read
//! under the decimal rate.

use super::*;

/// 0.1.0 and 0.2.0 took a rate as its double's exact value and stored the instants it made
/// (rounded up to 2^-63 ns). Read under the decimal rate, such an instant is re-expressed in
/// the decimal's ticks, rounded up: never earlier (never laxer), and less than one tick
/// (plus the 2^-63 ns of the stored rounding) later.
#[test]
fn states_written_under_the_double_read_at_most_one_tick_stricter() {
    use num_rational::BigRational;
    let two63 = BigRational::new(1.into(), num_bigint::BigInt::from(1u64) << 63);
    for rate in [
        0.1,
        0.3,
        0.000001,
        0.001,
        0.01,
        3.0,
        7.0,
        1e-5,
        123.456,
        0.0003208400192360113,
    ] {
        let decimal = Limit::new(rate, 1e6f64.min(rate * MAX_REFILL_S).floor()).unwrap();
        let (_, q) = decimal.ns_per_token();
        let tick = BigRational::new(1.into(), q.into());
        let t_double = BigRational::from_integer(1_000_000_000.into()) / model::exact_double(rate);
        for takes in [1u64, 7, 1000] {
            // What the old code stored: the exact instant, its fraction rounded up.
            let old = BigRational::from_integer(NOW_NS.into())
                + BigRational::from_integer(takes.into()) * &t_double;
            let ns = old.floor();
            let frac = ((&old - &ns) * BigRational::from_integer((1u64 << 63).into())).ceil();
            let st = State::from_parts(
                ns.to_integer().try_into().unwrap(),
                frac.to_integer().try_into().unwrap(),
            )
            .unwrap();
            let read = BigRational::new(st.ticks(q).into(), q.into());
            assert!(read >= old, "rate {rate}, {takes} takes: read earlier");
            assert!(
                read < &old + &tick + &two63,
                "rate {rate}, {takes} takes: a tick or more later"
            );
        }
    }
}

#[test]
fn state_range_and_expiry_rounding() {
    let rows: Vec<(u64, Option<u64>)> = vec![
        // Zero is not a state (it cannot live in a non-null pointer).
        (0, None),
        // 1 ns is the smallest state; it expires at the first ms.
        (1, Some(1)),
        // Just under, at, and just over a whole ms: expiry rounds up.
        (999_999, Some(1)),
        (1_000_000, Some(1)),
        (1_000_001, Some(2)),
        // A realistic instant.
        (NOW_NS, Some(NOW_NS / MS)),
        (NOW_NS + 1, Some(NOW_NS / MS + 1)),
        // The last representable instant (i64::MAX ns) rounds up too.
        (MAX_FULL_AT_NS, Some(9_223_372_036_855)),
        // Past it: not a state this code writes.
        (MAX_FULL_AT_NS + 1, None),
        (u64::MAX, None),
    ];
    for (full_at_ns, expire_at_ms) in rows {
        let got = State::from_full_at_ns(full_at_ns);
        assert_eq!(
            got.map(State::expire_at_ms),
            expire_at_ms,
            "full_at_ns {full_at_ns}"
        );
        if let Some(s) = got {
            assert_eq!(s.full_at_ns(), full_at_ns);
        }
    }
}
