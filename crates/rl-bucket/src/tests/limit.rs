//! [`Limit`]: rates parsed as exact decimals and `N/S` fractions, the ranges and which
//! argument an error names, rates finer than the finest tick, and limits that are the same
//! bucket however they are written.

use super::*;
use crate::ticks::MAX_TICKS_PER_NS;

#[test]
fn rates_parse_as_exact_decimals_and_fractions() {
    // (rate text, T as (ticks_per_token, ticks_per_ns)), all with a capacity of 1.
    let rows: &[(&str, (u128, u64))] = &[
        ("10", (100_000_000, 1)),                 // 0.1 s a token
        ("0.1", (10_000_000_000, 1)),             // one token per 10 s exactly, whole ns
        ("0.01", (100_000_000_000, 1)),           // whole ns: the inline 8-byte state
        ("0.000001", (1_000_000_000_000_000, 1)), // the slowest rate, whole ns
        ("1e-6", (1_000_000_000_000_000, 1)),
        ("1000000000", (1, 1)),       // the fastest rate
        ("3", (1_000_000_000, 3)),    // 1e9 / 3 ns: a fraction of a ns
        ("0.3", (10_000_000_000, 3)), // 3 per 10 s exactly
        ("100/60", (600_000_000, 1)), // 100 a minute: 0.6 s a token
        ("5/1", (200_000_000, 1)),
        ("3/10", (10_000_000_000, 3)),
        ("7/3", (3_000_000_000, 7)),
        ("1/3600", (3_600_000_000_000, 1)),        // one an hour
        ("2.5/0.5", (200_000_000, 1)),             // both decimals: 5/s
        ("1/1e-9", (1, 1)),                        // the fastest rate, as a fraction
        ("1/1000000", (1_000_000_000_000_000, 1)), // the slowest rate, as a fraction
        ("+2", (500_000_000, 1)),
        // 19 significant digits whose exact T still fits the finest tick: exact.
        (
            "1.000000000000000001",
            (10u128.pow(27), 1_000_000_000_000_000_001),
        ),
    ];
    for &(rate, want) in rows {
        let limit =
            Limit::parse(rate.as_bytes(), b"1").unwrap_or_else(|e| panic!("rate {rate}: {e:?}"));
        assert_eq!(limit.ns_per_token(), want, "rate {rate}");
        let model = model::Model::parse(rate, "1").ns_per_token();
        let (p, q) = want;
        assert_eq!(
            model,
            num_rational::BigRational::new(p.into(), q.into()),
            "rate {rate} against the model"
        );
    }
}

#[test]
fn huge_decimals_count_through_their_ratio() {
    // 10/s from two decimals near the exponent limit (too large for the model to build).
    let limit = Limit::parse(b"1e999999999/1e999999998", b"1").unwrap();
    assert_eq!(limit.ns_per_token(), (100_000_000, 1));
    let limit = Limit::parse(b"3e-999999999/1e-999999998", b"1").unwrap();
    assert_eq!(limit.ns_per_token(), (10_000_000_000, 3)); // 0.3/s
}

#[test]
fn rates_and_capacities_out_of_range_name_their_argument() {
    use LimitError::{Capacity, Rate, RefillTime};
    let rows: &[(&str, &str, LimitError)] = &[
        ("0.0000009", "1", Rate),                      // below 1e-6/s
        ("0.00000099999999999999999999", "1", Rate),   // just below, past a double's digits
        ("1000000001", "1", Rate),                     // above 1e9/s
        ("1000000000.0000000000000000001", "1", Rate), // just above, exactly
        ("1/1000001", "1", Rate),                      // below, as a fraction
        ("1000000001/1", "1", Rate),                   // above, as a fraction
        ("1/0.0000000009", "1", Rate),
        ("0", "1", Rate),
        ("0/1", "1", Rate),
        ("1/0", "1", Rate),
        ("1/", "1", Rate),
        ("/1", "1", Rate),
        ("1/2/3", "1", Rate),
        ("1 /2", "1", Rate),
        ("-1/-2", "1", Rate),
        // A huge N over a huge S: the ratio counts, so exponents are never clamped.
        ("1e999999999/1e999999989", "1", Rate), // 1e10 per second
        ("1e2000000000/1e2000000000", "1", Rate), // beyond the exponent limit: not decimals
        ("inf", "1", Rate),
        ("x", "x", Rate), // the first bad argument is named
        ("0", "x", Rate),
        ("1", "0", Capacity),
        ("1", "-1", Capacity),
        ("1", "1000000000000000.1", Capacity),
        ("1", "x", Capacity),
        ("1", "3153600001", RefillTime),  // a century and a second
        ("1/60", "52560001", RefillTime), // 1 a minute: a century is 52,560,000 tokens
        ("0.000001", "3154", RefillTime),
    ];
    for &(rate, capacity, want) in rows {
        assert_eq!(
            Limit::parse(rate.as_bytes(), capacity.as_bytes()),
            Err(want),
            "rate {rate} capacity {capacity}"
        );
    }
    // The ends of every range are included.
    for (rate, capacity) in [
        ("0.000001", "3153.6"),
        ("1/60", "52560000"),
        ("1000000000", "1000000000000000"),
        ("1", "3153600000"),
        ("1", "0.000000000000000000000000000001"),
    ] {
        assert!(
            Limit::parse(rate.as_bytes(), capacity.as_bytes()).is_ok(),
            "rate {rate} capacity {capacity}"
        );
    }
}

#[test]
fn rates_finer_than_the_finest_tick_round_toward_the_slower_rate() {
    use num_rational::BigRational;
    // Their exact T needs a denominator above 2^62; the rate's decimals are cut to 18
    // significant digits (tokens down, period up), which only makes the limit stricter, and
    // by less than a part in 1e17.
    for rate in [
        "1.000000000000000000000001", // 25 digits: T's denominator is 10^24 + 1
        "3.141592653589793238462643383279", // 31 digits
        "1/3.000000000000000000000001", // the period rounds up
        "7.000000000000000000000003/1.00000000000000000000007",
        "0.0000010000000000000000000000001", // just above the slowest rate: stays in range
    ] {
        let limit = Limit::parse(rate.as_bytes(), b"1").unwrap();
        let (p, q) = limit.ns_per_token();
        assert!(q <= MAX_TICKS_PER_NS, "rate {rate}");
        let got = BigRational::new(p.into(), q.into());
        let exact = model::Model::parse(rate, "1").ns_per_token();
        assert!(got >= exact, "rate {rate}: T {got} is laxer than {exact}");
        let bound = &exact / BigRational::from_integer(100_000_000_000_000_000u64.into());
        assert!(&got - &exact < bound, "rate {rate}: T {got} vs {exact}");
        assert!(got <= BigRational::from_integer(1_000_000_000_000_000u64.into()));
    }
}

#[test]
fn limit_new_accepts_only_the_documented_ranges() {
    use LimitError::{Capacity, Rate, RefillTime};
    let rows: Vec<(f64, f64, Result<(), LimitError>)> = vec![
        // The doc example.
        (5.0, 10.0, Ok(())),
        // Both ends of the rate range are included.
        (1e-6, 1.0, Ok(())),
        (1e9, 1.0, Ok(())),
        // The largest capacity is included (at a rate that refills it within 100 years).
        (1e6, 1e15, Ok(())),
        // A full refill of exactly 100 years is included; a longer one is not.
        (1.0, 3_153_600_000.0, Ok(())),
        (1.0, 3_153_600_001.0, Err(RefillTime)),
        (1e-6, 1e15, Err(RefillTime)),
        // Any positive capacity, however small.
        (1.0, f64::MIN_POSITIVE, Ok(())),
        // Fractional capacity.
        (1.0, 2.5, Ok(())),
        // Rate: not a number, infinite, zero, negative, just out of range.
        (f64::NAN, 10.0, Err(Rate)),
        (f64::INFINITY, 10.0, Err(Rate)),
        (f64::NEG_INFINITY, 10.0, Err(Rate)),
        (0.0, 10.0, Err(Rate)),
        (-0.0, 10.0, Err(Rate)),
        (-5.0, 10.0, Err(Rate)),
        // Just below 1e-6/s.
        (9.999_999e-7, 10.0, Err(Rate)),
        // Just above 1e9/s.
        (1.000_000_1e9, 10.0, Err(Rate)),
        // Capacity: not a number, infinite, zero, negative, just above 1e15.
        (5.0, f64::NAN, Err(Capacity)),
        (5.0, f64::INFINITY, Err(Capacity)),
        (5.0, f64::NEG_INFINITY, Err(Capacity)),
        (5.0, 0.0, Err(Capacity)),
        (5.0, -0.0, Err(Capacity)),
        (5.0, -1.0, Err(Capacity)),
        (5.0, 1.000_000_1e15, Err(Capacity)),
    ];
    for (rate, capacity, want) in rows {
        let got = Limit::new(rate, capacity);
        assert_eq!(got.map(|_| ()), want, "Limit::new({rate}, {capacity})");
        if let Ok(l) = got {
            assert_eq!((l.rate_per_s(), l.capacity()), (rate, capacity));
        }
    }
    // Both halves wrong is still an error (which one is reported is not specified).
    assert!(Limit::new(f64::NAN, f64::NAN).is_err());
    assert!(Limit::new(f64::INFINITY, f64::INFINITY).is_err());
}

/// A full refill must fit in the state (which ends in 2262), or a full bucket would report
/// tokens it cannot hand out. `Limit::new` therefore caps `capacity / rate` at 100 years, and
/// at that cap a full bucket's `remaining` is takeable in one request.
#[test]
fn refills_longer_than_a_century_are_rejected_and_the_longest_is_takeable() {
    for (rate, capacity) in [(1e-6, 1e15), (1e-6, 1e4), (1.0, 1e15)] {
        assert_eq!(
            Limit::new(rate, capacity),
            Err(LimitError::RefillTime),
            "{rate} {capacity}"
        );
    }
    for (rate, capacity) in [(1e-6, 3153.0), (1.0, 3_153_600_000.0), (1e6, 1e15)] {
        let lim = limit(rate, capacity);
        let (probe, _) = acquire(&lim, None, NOW_US, Cost::new(0.0).unwrap());
        assert_eq!(probe.remaining as f64, capacity.floor());
        let (d, _) = acquire(&lim, None, NOW_US, cost(probe.remaining as f64));
        assert_eq!(
            d.outcome,
            Outcome::Allowed,
            "rate {rate} capacity {capacity}: {d:?}"
        );
    }
}

#[test]
fn three_per_ten_seconds_refills_three_in_ten_seconds() {
    // As a period, "3/10", or the decimal 0.3: exactly 3 tokens in 10 s, and 2 just before.
    // (0.2.0 took 0.3 as its double, just below 3/10, and refilled 2 in 10 s.)
    let limits = [
        Limit::per_period(3, 10 * S, 3.0).unwrap(),
        Limit::parse(b"3/10", b"3").unwrap(),
        Limit::parse(b"0.3", b"3").unwrap(),
        limit(0.3, 3.0),
    ];
    for lim in limits {
        let (_, st) = acquire(&lim, None, NOW_US, cost(3.0));
        assert_eq!(peek(&lim, st, NOW_US + 10 * S_US, Cost::ONE).remaining, 3);
        assert_eq!(
            peek(&lim, st, NOW_US + 10 * S_US - 1, Cost::ONE).remaining,
            2
        );
    }
}
