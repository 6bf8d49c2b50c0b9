//! What a bucket that does not exist yet must answer to its first call, computed exactly from
//! the arguments, so tests compare whole replies instead of their length.
//!
//! A first call sees a full bucket, so no clock is involved: `remaining` is the capacity less
//! the cost (floored), and the reset is the time the cost takes to refill. Arguments are
//! decimals the module parses into f64, and the time to refill divides by the rate, so the
//! wait is known only up to the input's float rounding: it is given as the range from the
//! wait at the decimal's exact value to the wait at the parsed f64's exact value (either way
//! round), both rounded up to the reply's unit. Plain u128 fractions: the arguments used are
//! small enough (the checks panic rather than overflow).

/// A non-negative fraction `num / den`.
#[derive(Clone, Copy, Debug)]
pub struct Q {
    num: u128,
    den: u128,
}

impl Q {
    fn new(num: u128, den: u128) -> Q {
        assert!(den > 0);
        Q { num, den }
    }

    /// The exact value of a plain decimal: digits, an optional fraction, an optional `e`
    /// exponent (`2.5`, `1e15`, `0.000001`).
    pub fn decimal(text: &str) -> Q {
        let (mantissa, exponent) = match text.split_once(['e', 'E']) {
            Some((m, e)) => (m, e.parse::<i32>().expect("exponent")),
            None => (text, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits: u128 = format!("{int}{frac}").parse().expect("digits");
        let scale = exponent - frac.len() as i32;
        let ten = |n: i32| 10u128.checked_pow(n as u32).expect("10^n fits");
        if scale >= 0 {
            Q::new(digits.checked_mul(ten(scale)).expect("fits"), 1)
        } else {
            Q::new(digits, ten(-scale))
        }
    }

    /// The exact value of the f64 the module parses `text` into.
    pub fn parsed_f64(text: &str) -> Q {
        Q::of_f64(text.parse().expect("a number"))
    }

    /// The exact value of a finite, non-negative f64.
    pub fn of_f64(value: f64) -> Q {
        assert!(value.is_finite() && value >= 0.0);
        let bits = value.to_bits();
        let exponent = ((bits >> 52) & 0x7ff) as i32;
        let fraction = u128::from(bits & ((1 << 52) - 1));
        let (mantissa, power) = if exponent == 0 {
            (fraction, -1074)
        } else {
            (fraction | (1 << 52), exponent - 1075)
        };
        if power >= 0 {
            Q::new(mantissa.checked_shl(power as u32).expect("fits"), 1)
        } else {
            Q::new(mantissa, 1u128.checked_shl((-power) as u32).expect("fits"))
        }
    }

    fn mul(self, other: Q) -> Q {
        Q::new(
            self.num.checked_mul(other.num).expect("fits"),
            self.den.checked_mul(other.den).expect("fits"),
        )
    }

    fn div(self, other: Q) -> Q {
        assert!(other.num > 0, "division by zero");
        self.mul(Q::new(other.den, other.num))
    }

    fn sub(self, other: Q) -> Option<Q> {
        let left = self.num.checked_mul(other.den).expect("fits");
        let right = other.num.checked_mul(self.den).expect("fits");
        let den = self.den.checked_mul(other.den).expect("fits");
        left.checked_sub(right).map(|num| Q::new(num, den))
    }

    fn floor(self) -> i64 {
        i64::try_from(self.num / self.den).expect("fits i64")
    }

    fn ceil(self) -> i64 {
        i64::try_from(self.num.div_ceil(self.den)).expect("fits i64")
    }
}

/// An inclusive range an integer reply must fall in.
pub type Range = (i64, i64);

fn ordered(a: i64, b: i64) -> Range {
    (a.min(b), a.max(b))
}

/// A first `RL.ACQUIRE key rate capacity [cost]`: `allowed`, `remaining`, `retry_after_ms`,
/// and the range `reset_after_ms` must fall in.
pub fn acquire(rate: &str, capacity: &str, cost: Option<&str>) -> ([i64; 3], Range) {
    let cost = Q::decimal(cost.unwrap_or("1"));
    let capacity = Q::decimal(capacity);
    let Some(left) = capacity.sub(cost) else {
        // More than the bucket can ever hold: refused for good, nothing taken.
        return ([0, capacity.floor(), -1], (0, 0));
    };
    let ms = Q::new(1000, 1);
    let at_decimal = cost.mul(ms).div(Q::decimal(rate)).ceil();
    let at_f64 = cost.mul(ms).div(Q::parsed_f64(rate)).ceil();
    ([1, left.floor(), 0], ordered(at_decimal, at_f64))
}

/// A first `RL.THROTTLE key max_burst count_per_period period [quantity]`: `limited`,
/// `limit`, `remaining`, `retry_after` (s), and the range `reset_after` (s) must fall in.
/// The module divides `count_per_period / period` in f64, so the range spans that rounding.
pub fn throttle(max_burst: u64, count: u64, period_s: u64, quantity: u64) -> ([i64; 4], Range) {
    let total = max_burst + 1;
    let limit = i64::try_from(total).expect("fits");
    if quantity > total {
        // More than the bucket can ever hold: limited for good, nothing taken.
        return ([1, limit, limit, -1], (0, 0));
    }
    let left = i64::try_from(total - quantity).expect("fits");
    let quantity = Q::new(u128::from(quantity), 1);
    let exact = quantity
        .div(Q::new(u128::from(count), u128::from(period_s)))
        .ceil();
    let at_f64 = quantity
        .div(Q::of_f64(count as f64 / period_s as f64))
        .ceil();
    ([0, limit, left, -1], ordered(exact, at_f64))
}
