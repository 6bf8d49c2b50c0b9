//! No drift: a saturated caller over a million calls gets exactly the model's count, at rates
//! whose token interval is whole and at rates that do not divide 1e9 (against the classic
//! "tokens and last update" bucket in integers).

use super::*;

/// A rate as an exact fraction of tokens per second, so the model needs no floats.
#[derive(Clone, Copy, Debug)]
struct Rate {
    num: u64,
    den: u64,
}

impl Rate {
    fn per_s(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// `floor(rate × ns / 1e9)`: whole tokens refilled in `ns`.
    fn tokens_in(self, ns: u64) -> u64 {
        let t = u128::from(ns) * u128::from(self.num) / (u128::from(self.den) * u128::from(S));
        u64::try_from(t).unwrap()
    }

    /// `floor(1e9 / rate)`: the token interval in whole ns.
    fn interval_ns(self) -> u64 {
        S * self.den / self.num
    }
}

/// How the injected clock advances between calls. Every step is at most one token interval,
/// so the caller never skips a refilled token, and on average well under it, so it stays
/// saturated after draining the burst.
#[derive(Clone, Copy, Debug)]
enum Clock {
    /// Call `i` is at `start + floor(i × interval × num / den)`, truncated to µs: below one
    /// µs per token this makes several calls per µs tick.
    Fraction(u64, u64),
    /// Steps drawn uniformly from `0..=interval` µs (xorshift, fixed seed).
    Random(u64),
}

struct Run {
    allowed: u64,
    calls: u64,
    first_us: u64,
    last_us: u64,
}

fn drive(
    rate: Rate,
    capacity: u64,
    cost_tokens: u64,
    start_us: u64,
    calls: u64,
    clock: Clock,
) -> Run {
    let lim = limit(rate.per_s(), capacity as f64);
    let c = cost(cost_tokens as f64);
    let interval_ns = rate.interval_ns();
    let max_step_us = interval_ns / 1000;
    assert!(
        max_step_us >= 1,
        "the µs clock cannot follow a rate above 1e6/s"
    );
    let mut current: Option<State> = None;
    let mut allowed = 0;
    let mut now_us = start_us;
    let mut rng = match clock {
        Clock::Random(seed) => seed | 1,
        Clock::Fraction(..) => 0,
    };
    for i in 0..calls {
        now_us = match clock {
            Clock::Fraction(num, den) => {
                let ns =
                    u128::from(i) * u128::from(interval_ns) * u128::from(num) / u128::from(den);
                start_us + u64::try_from(ns / 1000).unwrap()
            }
            Clock::Random(_) if i == 0 => start_us,
            Clock::Random(_) => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                now_us + rng % (max_step_us + 1)
            }
        };
        let (d, new_state) = acquire(&lim, current, now_us, c);
        if d.allowed() {
            allowed += 1;
        }
        current = new_state.or(current);
    }
    Run {
        allowed,
        calls,
        first_us: start_us,
        last_us: now_us,
    }
}

/// Rates whose token interval is a whole number of ns.
const EXACT_RATES: [Rate; 10] = [
    Rate { num: 1, den: 1000 }, // 0.001/s: one token per 1000 s
    Rate { num: 1, den: 100 },  // 0.01/s
    Rate { num: 1, den: 2 },    // 0.5/s
    Rate { num: 1, den: 1 },    // 1/s
    Rate { num: 8, den: 1 },    // 8/s: 125 ms
    Rate { num: 10, den: 1 },   // 10/s
    Rate { num: 1000, den: 1 }, // 1000/s: the rate ms-precision limiters get wrong
    Rate { num: 3125, den: 1 }, // 3125/s: 320 µs
    Rate {
        num: 100_000,
        den: 1,
    }, // 100k/s: 10 µs
    Rate {
        num: 1_000_000,
        den: 1,
    }, // 1e6/s: 1 µs, several calls per tick
];

const ODD_START_US: u64 = NOW_US + 123_457;

fn assert_exact(rate: Rate, capacity: u64, cost_tokens: u64, run: &Run, what: &str) {
    let elapsed_ns = (run.last_us - run.first_us) * 1000;
    let model = capacity + elapsed_ns / rate.interval_ns();
    assert_eq!(
        model,
        capacity + rate.tokens_in(elapsed_ns),
        "interval is exact"
    );
    // A saturated caller asking for `cost` each time gets floor(model / cost) takes.
    assert_eq!(
        run.allowed,
        model / cost_tokens,
        "{what}: rate {rate:?}, {} calls",
        run.calls
    );
    assert!(
        run.allowed < run.calls,
        "{what}: the caller was never denied, so never saturated"
    );
}

#[test]
fn no_drift_over_a_million_calls_one_third_interval_steps() {
    for rate in EXACT_RATES {
        let run = drive(rate, 3, 1, NOW_US, 1_000_000, Clock::Fraction(1, 3));
        assert_exact(rate, 3, 1, &run, "steps of T/3");
    }
}

#[test]
fn no_drift_over_a_million_calls_random_steps_odd_start() {
    for (i, rate) in EXACT_RATES.into_iter().enumerate() {
        let run = drive(
            rate,
            5,
            1,
            ODD_START_US,
            1_000_000,
            Clock::Random(0x9e37_79b9 + i as u64),
        );
        assert_exact(rate, 5, 1, &run, "random steps up to T");
    }
}

#[test]
fn no_drift_near_saturation_and_with_integer_costs() {
    for rate in EXACT_RATES {
        // Steps of 0.9 T drain the burst slowly and leave the caller one call from a token.
        let run = drive(rate, 2, 1, ODD_START_US, 200_000, Clock::Fraction(9, 10));
        assert_exact(rate, 2, 1, &run, "steps of 0.9 T");
        // Integer costs are exact too: cost 3 from a capacity of 7.
        let run = drive(rate, 7, 3, NOW_US, 200_000, Clock::Fraction(1, 5));
        assert_exact(rate, 7, 3, &run, "cost 3, steps of T/5");
    }
}

/// The classic bucket, "tokens and last update", in integers: with `T = p / q` ns (from the
/// exact double, reduced by `BigRational`), a token is `p` units and a nanosecond refills `q`
/// units. Independent of `acquire`'s GCRA form and its ticks; forward time only.
struct Classic {
    p: i128,
    q: i128,
    capacity_units: i128,
    tokens_units: i128,
    last_ns: i128,
}

impl Classic {
    fn new(model_ns_per_token: num_rational::BigRational, capacity: u64) -> Self {
        use num_traits::ToPrimitive;
        let p = model_ns_per_token.numer().to_i128().unwrap();
        let q = model_ns_per_token.denom().to_i128().unwrap();
        let capacity_units = i128::from(capacity) * p;
        Self {
            p,
            q,
            capacity_units,
            tokens_units: capacity_units,
            last_ns: 0,
        }
    }

    /// (allowed, remaining) for a take of `cost` at `now_ns`.
    fn take(&mut self, now_ns: i128, cost: u64) -> (bool, u64) {
        if self.last_ns != 0 {
            let refill = (now_ns - self.last_ns) * self.q;
            self.tokens_units = (self.tokens_units + refill).min(self.capacity_units);
        }
        self.last_ns = now_ns;
        let need = i128::from(cost) * self.p;
        let allowed = self.tokens_units >= need;
        if allowed {
            self.tokens_units -= need;
        }
        (allowed, u64::try_from(self.tokens_units / self.p).unwrap())
    }
}

#[test]
fn no_drift_over_a_million_calls_at_rates_that_do_not_divide_1e9() {
    // (rate, capacity, cost, µs between calls): each caller asks faster than the refill, so
    // it is saturated and every call's answer depends on the exact remainder.
    let rows: [(f64, u64, u64, u64); 6] = [
        (3.0, 4, 1, 111_111),   // T = 333_333_333.3… ns: three calls per token
        (7.0, 7, 1, 47_619),    // T = 142_857_142.8… ns
        (0.3, 3, 1, 1_111_111), // 0.3 is the double 5404319552844595 / 2^54
        (333_333.0, 10, 1, 1),  // T = 3000.003 ns: several calls per µs tick
        (3e8, 4500, 1500, 2),   // bytes per second: 1500 B packets, T = 3.3… ns
        (6000.0, 6001, 7, 1),   // redis-cell's 6000/s, integer cost 7
    ];
    for (rate, capacity, cost_tokens, step_us) in rows {
        let lim = limit(rate, capacity as f64);
        let mut classic = Classic::new(model::Model::new(rate, 1.0).ns_per_token(), capacity);
        let mut current = None;
        let (mut allowed, mut model_allowed) = (0u64, 0u64);
        for i in 0..1_000_000u64 {
            let now_us = ODD_START_US + i * step_us;
            let (d, new_state) = acquire(&lim, current, now_us, cost(cost_tokens as f64));
            current = new_state.or(current);
            let (ok, remaining) = classic.take(i128::from(now_us) * 1000, cost_tokens);
            assert_eq!(
                (d.allowed(), d.remaining),
                (ok, remaining),
                "rate {rate}, call {i}"
            );
            allowed += u64::from(d.allowed());
            model_allowed += u64::from(ok);
        }
        assert_eq!(allowed, model_allowed, "rate {rate}");
        assert!(allowed < 1_000_000, "rate {rate}: never saturated");
    }
}
