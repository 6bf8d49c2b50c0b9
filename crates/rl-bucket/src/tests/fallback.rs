//! [`FallbackState`]: the Lua fallback's packed string and hash texts, read byte by byte, and
//! its instant `q + r/D` µs converted to a [`State`]; then every step on the converted state
//! against the exact model holding the fallback's exact instant, at rates where `1e9 / rate`
//! is not whole.

use num_bigint::BigInt;
use num_rational::BigRational;

use super::*;

const US_53: u64 = (1 << 53) - 1;

#[test]
fn parse_takes_only_what_the_fallback_writes() {
    type Row = (
        &'static [u8],
        &'static [u8],
        &'static [u8],
        Result<(u64, u64, u64), FallbackError>,
    );
    use FallbackError::{NotAnInteger, OutOfRange};
    let rows: &[Row] = &[
        // What the script writes at 3/s: a third of a µs past q.
        (
            b"1700000000000000",
            b"1",
            b"3",
            Ok((1_700_000_000_000_000, 1, 3)),
        ),
        // A whole-µs instant (rates whose T is whole µs write D = 1, r = 0).
        (
            b"1700000000000000",
            b"0",
            b"1",
            Ok((1_700_000_000_000_000, 0, 1)),
        ),
        // The largest values the script can hold exactly: q below 2^53, D below 2^31.
        (
            b"9007199254740991",
            b"2147483646",
            b"2147483647",
            Ok((US_53, 2_147_483_646, 2_147_483_647)),
        ),
        // Zero is an integer (a bucket full in 1970).
        (b"0", b"0", b"1", Ok((0, 0, 1))),
        // Out of range: q at 2^53, D at 2^31, D zero, r equal to D, r above D.
        (b"9007199254740992", b"0", b"1", Err(OutOfRange("a"))),
        (b"1", b"0", b"2147483648", Err(OutOfRange("d"))),
        (b"1", b"0", b"0", Err(OutOfRange("d"))),
        (b"1", b"3", b"3", Err(OutOfRange("b"))),
        (b"1", b"4", b"3", Err(OutOfRange("b"))),
        // 20 digits past u64, and 21 digits: not integers the fallback writes.
        (b"99999999999999999999", b"0", b"1", Err(OutOfRange("a"))),
        (b"100000000000000000000", b"0", b"1", Err(NotAnInteger("a"))),
        // Texts Lua's tonumber would read but `%.0f` never writes.
        (b"", b"0", b"1", Err(NotAnInteger("a"))),
        (b"+1", b"0", b"1", Err(NotAnInteger("a"))),
        (b"-1", b"0", b"1", Err(NotAnInteger("a"))),
        (b" 1", b"0", b"1", Err(NotAnInteger("a"))),
        (b"1 ", b"0", b"1", Err(NotAnInteger("a"))),
        (b"01", b"0", b"1", Err(NotAnInteger("a"))),
        (b"0x10", b"0", b"1", Err(NotAnInteger("a"))),
        (b"1e3", b"0", b"1", Err(NotAnInteger("a"))),
        (b"1.0", b"0", b"1", Err(NotAnInteger("a"))),
        (b"1", b"-0", b"1", Err(NotAnInteger("b"))),
        (b"1", b"00", b"1", Err(NotAnInteger("b"))),
        (b"1", b"0", b"3\0", Err(NotAnInteger("d"))),
        (b"1", b"0", b"\xd9\xa3", Err(NotAnInteger("d"))), // Arabic-Indic three
        (b"1", b"0", b"inf", Err(NotAnInteger("d"))),
        (b"1", b"0", b"nan", Err(NotAnInteger("d"))),
    ];
    for &(a, b, d, want) in rows {
        let got = FallbackState::parse(a, b, d).map(|s| (s.q_us(), s.r(), s.d()));
        assert_eq!(
            got,
            want,
            "{:?} {:?} {:?}",
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b),
            String::from_utf8_lossy(d)
        );
    }
}

/// The fallback's string for three doubles, as `struct.pack('<Hddd', 27762, q, r, D)` makes it.
fn packed(q: f64, r: f64, d: f64) -> Vec<u8> {
    let mut out = 27762u16.to_le_bytes().to_vec();
    for n in [q, r, d] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

#[test]
fn parse_packed_takes_only_the_fallbacks_string() {
    type Row = (Vec<u8>, Result<(u64, u64, u64), FallbackError>);
    use FallbackError::{NotAnInteger, NotTheForm, OutOfRange};
    let two_53 = 9_007_199_254_740_992.0;
    let rows: Vec<Row> = vec![
        // What the script writes at 3/s and at 10/s.
        (packed(1.7e15, 1.0, 3.0), Ok((1_700_000_000_000_000, 1, 3))),
        (packed(1.7e15, 0.0, 1.0), Ok((1_700_000_000_000_000, 0, 1))),
        // The largest values the script holds exactly; -0 is 0, as the script compares it.
        (
            packed(two_53 - 1.0, 2_147_483_646.0, 2_147_483_647.0),
            Ok((US_53, 2_147_483_646, 2_147_483_647)),
        ),
        (packed(-0.0, -0.0, 1.0), Ok((0, 0, 1))),
        // Whole numbers out of range, each field named as in the hash.
        (packed(two_53, 0.0, 1.0), Err(OutOfRange("a"))),
        (packed(1e300, 0.0, 1.0), Err(OutOfRange("a"))),
        (packed(1.0, 3.0, 3.0), Err(OutOfRange("b"))),
        (packed(1.0, 0.0, 0.0), Err(OutOfRange("d"))),
        (packed(1.0, 0.0, 2_147_483_648.0), Err(OutOfRange("d"))),
        // Doubles that are not whole numbers at least 0.
        (packed(1.5, 0.0, 1.0), Err(NotAnInteger("a"))),
        (packed(-1.0, 0.0, 1.0), Err(NotAnInteger("a"))),
        (packed(f64::NAN, 0.0, 1.0), Err(NotAnInteger("a"))),
        (packed(1.0, f64::INFINITY, 1.0), Err(NotAnInteger("b"))),
        (packed(1.0, 0.0, f64::NEG_INFINITY), Err(NotAnInteger("d"))),
        (packed(1.0, 0.0, 5e-324), Err(NotAnInteger("d"))),
        // Not the form: another length, another prefix, the text form of earlier builds.
        (Vec::new(), Err(NotTheForm)),
        (b"rl".to_vec(), Err(NotTheForm)),
        (packed(1.0, 0.0, 1.0)[..25].to_vec(), Err(NotTheForm)),
        ([packed(1.0, 0.0, 1.0), vec![0]].concat(), Err(NotTheForm)),
        (
            [b"RL".to_vec(), packed(1.0, 0.0, 1.0)[2..].to_vec()].concat(),
            Err(NotTheForm),
        ),
        (b"rl:1700000000000000:1:3".to_vec(), Err(NotTheForm)),
    ];
    for (value, want) in rows {
        let got = FallbackState::parse_packed(&value).map(|s| (s.q_us(), s.r(), s.d()));
        assert_eq!(got, want, "{value:?}");
    }
}

/// Bytes that are mostly digits, with anything else mixed in.
fn texts() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![8 => b'0'..=b'9', 1 => any::<u8>()];
    prop::collection::vec(byte, 0..24)
}

/// Doubles the fallback might meet: whole numbers in and out of range, fractions, negatives,
/// NaN and the infinities.
fn doubles() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => (0u64..1 << 54).prop_map(|n| n as f64),
        2 => (0u64..1 << 32).prop_map(|n| n as f64),
        1 => any::<f64>(),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any three doubles after the prefix, and any bytes at all: no panic; what is accepted
    /// is exactly whole numbers in range, and writing them back gives the script's bytes.
    #[test]
    fn parse_packed_accepts_exactly_whole_numbers_in_range(
        q in doubles(), r in doubles(), d in doubles(), noise in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let value = packed(q, r, d);
        let whole = |n: f64| n.is_finite() && n.fract() == 0.0 && n >= 0.0;
        let valid = whole(q) && whole(r) && whole(d) && q < 9_007_199_254_740_992.0
            && d >= 1.0 && d <= FALLBACK_MAX_DENOMINATOR as f64 && r < d;
        let got = FallbackState::parse_packed(&value);
        prop_assert_eq!(got.is_ok(), valid, "{} {} {}", q, r, d);
        if let Ok(st) = got {
            prop_assert_eq!((st.q_us() as f64, st.r() as f64, st.d() as f64), (q, r, d));
            // -0.0 reads as 0 and is written back as +0.0, the script's own bytes for it.
            prop_assert_eq!(st.packed().to_vec(), packed(q + 0.0, r + 0.0, d));
        }
        let _ = FallbackState::parse_packed(&noise);
    }

    /// Any bytes: no panic, and what is accepted is exactly what `%.0f` writes for the
    /// numbers read back, in range.
    #[test]
    fn parse_accepts_only_the_fallbacks_own_texts(a in texts(), b in texts(), d in texts()) {
        if let Ok(st) = FallbackState::parse(&a, &b, &d) {
            prop_assert_eq!(st.q_us().to_string().into_bytes(), a);
            prop_assert_eq!(st.r().to_string().into_bytes(), b);
            prop_assert_eq!(st.d().to_string().into_bytes(), d);
            prop_assert!(st.q_us() <= US_53 && st.r() < st.d() && st.d() <= FALLBACK_MAX_DENOMINATOR);
        }
    }
}

/// The fallback's instant, exactly, in ns.
fn exact_ns(q_us: u64, r: u64, d: u64) -> BigRational {
    BigRational::from_integer(BigInt::from(q_us) * 1000)
        + BigRational::new(BigInt::from(r) * 1000, BigInt::from(d))
}

/// `1 / 2^63` ns, the stored fraction's unit.
fn unit() -> BigRational {
    BigRational::new(1.into(), BigInt::from(1u64) << 63)
}

#[test]
fn conversion_rows_land_on_the_instant_or_just_after() {
    // (q, r, D, full_at_ns, full_at_frac, expire_at_ms), worked out by hand.
    let rows: [(u64, u64, u64, u64, u64, u64); 7] = [
        // Whole µs: 1000 q ns, no fraction; the expiry is q rounded up to a ms.
        (NOW_US, 0, 1, NOW_NS, 0, NOW_US / 1000),
        (NOW_US + 1, 0, 1, NOW_NS + 1000, 0, NOW_US / 1000 + 1),
        // A third of a µs: 333 ns and a third (2^63 / 3 rounded up).
        (
            NOW_US,
            1,
            3,
            NOW_NS + 333,
            (1u64 << 63).div_ceil(3),
            NOW_US / 1000 + 1,
        ),
        // Two sevenths: 2000 / 7 = 285 ns and 5/7.
        (
            NOW_US,
            2,
            7,
            NOW_NS + 285,
            (5u128 << 63).div_ceil(7) as u64,
            NOW_US / 1000 + 1,
        ),
        // r/D of a µs that is a whole ns: 1/8 µs = 125 ns, no fraction.
        (NOW_US, 1, 8, NOW_NS + 125, 0, NOW_US / 1000 + 1),
        // The first nanosecond of 1970 becomes 1 ns: later, and full all the same.
        (0, 0, 1, 1, 0, 1),
        // The latest the fallback writes: below 2^53 µs, well inside a State.
        (US_53, 0, 1, US_53 * 1000, 0, US_53.div_ceil(1000)),
    ];
    for (q, r, d, ns, frac, expire_ms) in rows {
        let st = FallbackState::new(q, r, d).unwrap().state();
        assert_eq!(
            (st.full_at_ns(), st.full_at_frac(), st.expire_at_ms()),
            (ns, frac, expire_ms),
            "{q} + {r}/{d} µs"
        );
    }
}

/// The fallback's key expires at its instant rounded up to the ms (`PEXPIREAT`); the
/// converted state's key expires at the same millisecond.
fn fallback_expiry_ms(q: u64, r: u64) -> u64 {
    q / 1000 + u64::from(q % 1000 > 0 || r > 0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any valid hash: the state is at or after the exact instant, less than 2^-63 ns after
    /// it, and its key expires at the millisecond the fallback's did.
    #[test]
    fn conversion_is_never_earlier_and_keeps_the_expiry(
        q in prop_oneof![0..=US_53, NOW_US - 1_000_000..NOW_US + 1_000_000],
        d in prop_oneof![1..=FALLBACK_MAX_DENOMINATOR, 1u64..=10, Just(1u64 << 30)],
        r_seed in any::<u64>(),
    ) {
        let r = r_seed % d;
        let st = FallbackState::new(q, r, d).unwrap().state();
        let exact = exact_ns(q, r, d);
        let got = instant(st);
        prop_assert!(got >= exact || (q == 0 && st.full_at_ns() == 1));
        prop_assert!(got < &exact + unit() || q == 0);
        prop_assert_eq!(st.expire_at_ms(), fallback_expiry_ms(q, r).max(1));
        // The texts the fallback writes for it parse to the same.
        let parsed = FallbackState::parse(q.to_string().as_bytes(), r.to_string().as_bytes(), d.to_string().as_bytes());
        prop_assert_eq!(parsed, FallbackState::new(q, r, d));
    }
}

/// The fallback's denominator for a rate: that of `T = 1e6 / rate` µs (the script's `D`,
/// below 2^31 for these rates).
fn script_denominator(rate: &str) -> u64 {
    let t_us = BigRational::from_integer(1_000_000.into()) / model::rate(rate);
    t_us.denom().try_into().unwrap()
}

/// One step on a taken-over bucket.
#[derive(Clone, Copy, Debug)]
enum Step {
    Acquire,
    Peek,
    Refund,
    Charge,
}

fn steps(capacity: u64) -> impl Strategy<Value = Vec<(Step, u64, u64)>> {
    let step = prop_oneof![
        4 => Just(Step::Acquire),
        2 => Just(Step::Peek),
        1 => Just(Step::Refund),
        1 => Just(Step::Charge),
    ];
    let cost = prop_oneof![1 => Just(0u64), 6 => 1..=capacity.min(4), 2 => 0..=capacity + 1];
    prop::collection::vec((step, 0..=400_000u64, cost), 1..12)
}

/// Takes over the fallback's `q + r/D` and runs `calls` on it and on the exact model holding
/// that exact instant: every field of every reply is the model's, and every written state
/// the model's instant to within 2^-63 ns.
fn run_takeover(
    rate: &str,
    capacity: u64,
    q: u64,
    r: u64,
    d: u64,
    start_us: u64,
    calls: &[(Step, u64, u64)],
) {
    let lim = Limit::parse(rate.as_bytes(), capacity.to_string().as_bytes()).unwrap();
    let mut m = model::Model::parse(rate, &capacity.to_string());
    m.full_at_ns = Some(exact_ns(q, r, d));
    let mut current = Some(FallbackState::new(q, r, d).unwrap().state());
    let mut now_us = start_us;
    for (i, &(step, step_us, c)) in calls.iter().enumerate() {
        now_us += step_us;
        let at = format!("rate {rate}, capacity {capacity}, from {q} + {r}/{d} µs, call {i} {step:?} at {now_us}, cost {c}");
        let cost = Cost::parse(c.to_string().as_bytes()).unwrap();
        match step {
            Step::Peek => assert_matches(
                &peek(&lim, current, now_us, cost),
                &m.peek(now_us, c as f64),
                &at,
            ),
            Step::Acquire => {
                let (decision, new_state) = acquire(&lim, current, now_us, cost);
                assert_matches(&decision, &m.acquire(now_us, c as f64), &at);
                current = new_state.or(current);
            }
            Step::Refund => {
                let (decision, change) = refund(&lim, current, now_us, cost);
                m.refund(now_us, c as f64);
                let after = m.peek(now_us, 0.0);
                assert_eq!(
                    (decision.remaining, decision.reset_after_ns),
                    (after.remaining, after.reset_after_ns),
                    "{at}"
                );
                match change {
                    Change::Keep => {}
                    Change::Set(s) => current = Some(s),
                    Change::Delete => current = None,
                }
            }
            Step::Charge => {
                let want = m.charge_exact(now_us, model::decimal(&c.to_string()));
                match charge(&lim, current, now_us, cost) {
                    Ok((charged, new_state)) => {
                        let want = want.unwrap_or_else(|| panic!("the model refused, {at}"));
                        assert_eq!(
                            (
                                charged.balance,
                                charged.repaid_after_ns,
                                charged.reset_after_ns
                            ),
                            (want.balance, want.repaid_after_ns, want.reset_after_ns),
                            "{at}"
                        );
                        current = new_state.or(current);
                    }
                    Err(_) => assert!(want.is_none(), "the bucket refused, {at}"),
                }
            }
        }
        assert!(
            super::against_model::holds_the_model_instant(current, &m, now_us),
            "state {current:?} vs model {:?}, {at}",
            m.full_at_ns
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// A bucket the fallback wrote at 3/s, 7/s, 3 per 10 s (and 100 a minute, 7 per 3 s),
    /// anywhere from full to deep in debt, taken over and then driven by every step: the
    /// module answers exactly as the exact model of the fallback's instant, so exactly as
    /// the fallback itself would have.
    #[test]
    fn a_taken_over_bucket_answers_as_the_exact_model(
        rate in prop::sample::select(vec!["3", "7", "3/10", "100/60", "7/3"]),
        capacity in prop_oneof![1u64..=10, Just(3u64), Just(7u64)],
        // How far the fallback's instant is from the first call: full already, up to deep debt.
        ahead_us in prop_oneof![0u64..=10_000_000, 0u64..=100],
        behind in any::<bool>(),
        r_seed in any::<u64>(),
        start_us in nows(),
        calls in steps(10),
    ) {
        let d = script_denominator(rate);
        // The module's tick divides the fallback's denominator: the instant is whole ticks.
        let lim = Limit::parse(rate.as_bytes(), capacity.to_string().as_bytes()).unwrap();
        prop_assert_eq!(d % lim.ns_per_token().1, 0, "rate {}", rate);
        let q = if behind { start_us.saturating_sub(ahead_us) } else { start_us + ahead_us };
        run_takeover(rate, capacity, q, r_seed % d, d, start_us, &calls);
    }

    /// A denominator that is not the rate's (the rate changed, or the fallback rounded `T` to
    /// 2^-30 µs): the module is never laxer than the exact model of the fallback's instant.
    #[test]
    fn another_denominator_is_only_ever_stricter(
        rate in prop::sample::select(vec!["3", "7", "3/10"]),
        capacity in 1u64..=10,
        d in prop_oneof![1..=FALLBACK_MAX_DENOMINATOR, Just(1u64 << 30), 1u64..=1000],
        r_seed in any::<u64>(),
        ahead_us in 0u64..=5_000_000,
        later_us in 0u64..=5_000_000,
        c in 0u64..=11,
    ) {
        let (r, q) = (r_seed % d, NOW_US + ahead_us);
        let lim = Limit::parse(rate.as_bytes(), capacity.to_string().as_bytes()).unwrap();
        let mut m = model::Model::parse(rate, &capacity.to_string());
        m.full_at_ns = Some(exact_ns(q, r, d));
        let st = FallbackState::new(q, r, d).unwrap().state();
        let now_us = NOW_US + later_us;
        let got = peek(&lim, Some(st), now_us, cost(c as f64));
        let want = m.peek(now_us, c as f64);
        prop_assert!(got.remaining <= want.remaining);
        prop_assert!(got.balance <= want.balance);
        prop_assert!(got.reset_after_ns >= want.reset_after_ns);
        prop_assert!(!got.allowed() || want.allowed == Some(true));
    }
}
