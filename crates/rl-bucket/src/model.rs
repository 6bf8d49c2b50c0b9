//! The exact model the bucket is tested against: a token bucket in rational arithmetic
//! (`BigRational`), with every number the exact decimal typed (a double is the decimal it
//! prints as) and a rate `N/S` exactly N over S. Test-only.
//!
//! It shares no code and no representation with `bucket`: no ticks, no fixed-point fraction,
//! no rounding until a reply is formed. State is the exact instant `full_at` (in ns), which
//! for forward time is the classic "tokens and last update" bucket written another way:
//! `tokens(now) = capacity - max(0, full_at - now) / T`.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};

/// The model's view of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// `None` for impossible (cost above capacity), else whether it was allowed.
    pub allowed: Option<bool>,
    pub remaining: u64,
    /// floor(tokens), signed: negative while the bucket is in debt.
    pub balance: i64,
    /// ceil(ns) until `cost` tokens are there; 0 unless denied.
    pub retry_after_ns: u64,
    /// ceil(ns) until full, after the call.
    pub reset_after_ns: u64,
}

/// The model's view of one charge: the bucket after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charged {
    /// floor(tokens), signed: negative while the bucket is in debt.
    pub balance: i64,
    /// ceil(ns) until the debt is repaid (tokens back to 0); 0 when not in debt.
    pub repaid_after_ns: u64,
    /// ceil(ns) until full.
    pub reset_after_ns: u64,
}

/// The longest a charge may leave a bucket short of full: 100 years, in ns.
const MAX_DEBT_NS: u64 = 3_153_600_000 * 1_000_000_000;
/// The first instant (ns) a state cannot hold: `i64::MAX + 1`.
const FIRST_UNSTORABLE_NS: u64 = 1 << 63;

/// A limit and an exact instant; `full_at_ns: None` is a full bucket.
#[derive(Clone, Debug)]
pub struct Model {
    capacity: BigRational,
    ns_per_token: BigRational,
    pub full_at_ns: Option<BigRational>,
}

/// A double as the decimal it prints as (`Display`, the shortest that reads back as it): what
/// the client libraries send, and what the bucket takes `Limit::new(0.1, …)` to mean.
pub fn exact(x: f64) -> BigRational {
    assert!(x.is_finite());
    decimal(&format!("{x}"))
}

/// The exact value of a double's bits (what 0.1.0 and 0.2.0 took a rate to mean).
pub fn exact_double(x: f64) -> BigRational {
    BigRational::from_float(x).expect("finite")
}

/// A decimal text, exactly: `[+]digits[.digits][(e|E)[+-]digits]`. Written here with
/// big integers, so it shares nothing with the bucket's parser.
pub fn decimal(text: &str) -> BigRational {
    let text = text.strip_prefix('+').unwrap_or(text);
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (
            &text[..at],
            text[at + 1..].parse::<i64>().expect("exponent"),
        ),
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int_part}{frac_part}");
    let digits: BigInt = if all.is_empty() {
        BigInt::zero()
    } else {
        all.parse().expect("digits")
    };
    let exp10 = exponent - frac_part.len() as i64;
    let ten = BigInt::from(10);
    let scale = num_traits::pow(ten, exp10.unsigned_abs() as usize);
    if exp10 >= 0 {
        BigRational::from_integer(digits * scale)
    } else {
        BigRational::new(digits, scale)
    }
}

/// A rate text, `N/S` or a decimal, in tokens per second.
pub fn rate(text: &str) -> BigRational {
    match text.split_once('/') {
        Some((n, s)) => decimal(n) / decimal(s),
        None => decimal(text),
    }
}

fn ceil_u64(x: &BigRational) -> u64 {
    if x.is_negative() {
        return 0;
    }
    x.ceil().to_integer().to_u64().unwrap_or(u64::MAX)
}

impl Model {
    pub fn new(rate_per_s: f64, capacity: f64) -> Self {
        Self::exact(exact(rate_per_s), exact(capacity))
    }

    /// From the texts a user types: `rate` a decimal or `N/S`, `capacity` a decimal.
    pub fn parse(rate_text: &str, capacity: &str) -> Self {
        Self::exact(rate(rate_text), decimal(capacity))
    }

    /// `rate_per_s` tokens per second, exactly.
    pub fn exact(rate_per_s: BigRational, capacity: BigRational) -> Self {
        Self {
            capacity,
            ns_per_token: BigRational::from_integer(BigInt::from(1_000_000_000)) / rate_per_s,
            full_at_ns: None,
        }
    }

    /// `tokens` every `period_ns`, exactly.
    pub fn per_period(tokens: u64, period_ns: u64, capacity: f64) -> Self {
        Self::with_ns_per_token(
            BigRational::new(BigInt::from(period_ns), BigInt::from(tokens)),
            capacity,
        )
    }

    fn with_ns_per_token(ns_per_token: BigRational, capacity: f64) -> Self {
        Self {
            capacity: exact(capacity),
            ns_per_token,
            full_at_ns: None,
        }
    }

    /// The same bucket under another limit: the instant is kept.
    pub fn relimit(&self, other: &Model) -> Model {
        Model {
            full_at_ns: self.full_at_ns.clone(),
            ..other.clone()
        }
    }

    fn debt_ns(&self, now_ns: &BigRational) -> BigRational {
        match &self.full_at_ns {
            Some(full_at) if full_at > now_ns => full_at - now_ns,
            _ => BigRational::zero(),
        }
    }

    /// Whole tokens in a bucket `debt_ns` short of full: floor(capacity - debt / T), >= 0.
    fn whole_tokens(&self, debt_ns: &BigRational) -> u64 {
        let tokens = &self.capacity - debt_ns / &self.ns_per_token;
        if tokens.is_negative() {
            0
        } else {
            tokens.floor().to_integer().to_u64().unwrap_or(u64::MAX)
        }
    }

    /// floor(capacity - debt / T), signed, saturated to `i64` as the bucket saturates it (a
    /// debt of more than 2^63 tokens: a state near the end of its range, at a rate of more
    /// than one token a nanosecond).
    fn balance(&self, debt_ns: &BigRational) -> i64 {
        let balance = (&self.capacity - debt_ns / &self.ns_per_token)
            .floor()
            .to_integer();
        balance.to_i64().unwrap_or(if balance.is_negative() {
            i64::MIN
        } else {
            i64::MAX
        })
    }

    fn reply(&self, allowed: Option<bool>, debt_ns: &BigRational, retry_ns: &BigRational) -> Reply {
        Reply {
            allowed,
            remaining: self.whole_tokens(debt_ns),
            balance: self.balance(debt_ns),
            retry_after_ns: ceil_u64(retry_ns),
            reset_after_ns: ceil_u64(debt_ns),
        }
    }

    /// Takes `cost` at `now_us` if the bucket holds it (cost 0: if it holds >= 0 tokens).
    pub fn acquire(&mut self, now_us: u64, cost: f64) -> Reply {
        self.acquire_exact(now_us, exact(cost))
    }

    /// [`Model::acquire`] with an exact cost.
    pub fn acquire_exact(&mut self, now_us: u64, cost: BigRational) -> Reply {
        let now_ns = BigRational::from_integer(BigInt::from(now_us) * 1000);
        let debt_ns = self.debt_ns(&now_ns);
        let zero = BigRational::zero();
        if cost > self.capacity {
            return self.reply(None, &debt_ns, &zero);
        }
        let slack_ns = (&self.capacity - &cost) * &self.ns_per_token;
        if debt_ns > slack_ns {
            let retry_ns = &debt_ns - &slack_ns;
            return self.reply(Some(false), &debt_ns, &retry_ns);
        }
        if cost.is_zero() {
            return self.reply(Some(true), &debt_ns, &zero);
        }
        let start = match &self.full_at_ns {
            Some(full_at) if full_at > &now_ns => full_at.clone(),
            _ => now_ns.clone(),
        };
        let full_at = start + &cost * &self.ns_per_token;
        let new_debt = &full_at - &now_ns;
        self.full_at_ns = Some(full_at);
        self.reply(Some(true), &new_debt, &zero)
    }

    /// What `acquire` would answer, taking nothing; remaining and reset describe now.
    pub fn peek(&self, now_us: u64, cost: f64) -> Reply {
        let mut probe = self.clone();
        let mut reply = probe.acquire(now_us, cost);
        let debt_ns = self.debt_ns(&BigRational::from_integer(BigInt::from(now_us) * 1000));
        reply.remaining = self.whole_tokens(&debt_ns);
        reply.balance = self.balance(&debt_ns);
        reply.reset_after_ns = ceil_u64(&debt_ns);
        reply
    }

    /// Charges `cost` whatever the bucket holds: `full_at = max(full_at, now) + cost × T`.
    /// `None` (and nothing changes) when the bucket would not be full again within 100 years
    /// of now, or the instant could not be stored (at or past `i64::MAX + 1` ns).
    pub fn charge_exact(&mut self, now_us: u64, cost: BigRational) -> Option<Charged> {
        let now_ns = BigRational::from_integer(BigInt::from(now_us) * 1000);
        let full_at = if cost.is_zero() {
            self.full_at_ns.clone()
        } else {
            let start = match &self.full_at_ns {
                Some(full_at) if full_at > &now_ns => full_at.clone(),
                _ => now_ns.clone(),
            };
            let full_at = start + &cost * &self.ns_per_token;
            let debt = &full_at - &now_ns;
            if debt > BigRational::from_integer(MAX_DEBT_NS.into())
                || full_at >= BigRational::from_integer(FIRST_UNSTORABLE_NS.into())
            {
                return None;
            }
            Some(full_at)
        };
        self.full_at_ns = full_at;
        let debt_ns = self.debt_ns(&now_ns);
        let owed_ns = &debt_ns - &self.capacity * &self.ns_per_token;
        Some(Charged {
            balance: self.balance(&debt_ns),
            repaid_after_ns: ceil_u64(&owed_ns),
            reset_after_ns: ceil_u64(&debt_ns),
        })
    }

    /// `T` in ns, exactly.
    pub fn ns_per_token(&self) -> BigRational {
        self.ns_per_token.clone()
    }

    /// Gives `tokens` back (at most the capacity): `tokens × T` less debt, never below full.
    pub fn refund(&mut self, now_us: u64, tokens: f64) {
        self.refund_exact(now_us, exact(tokens))
    }

    /// [`Model::refund`] with an exact count.
    pub fn refund_exact(&mut self, now_us: u64, tokens: BigRational) {
        let now_ns = BigRational::from_integer(BigInt::from(now_us) * 1000);
        let give = tokens.min(self.capacity.clone()) * &self.ns_per_token;
        let debt_ns = self.debt_ns(&now_ns);
        if debt_ns.is_zero() || give.is_zero() {
            return;
        }
        let left = debt_ns - give;
        self.full_at_ns = (left.is_positive()).then(|| now_ns + left);
    }

    /// Whether the bucket is full at `now_us`.
    pub fn is_full(&self, now_us: u64) -> bool {
        self.debt_ns(&BigRational::from_integer(BigInt::from(now_us) * 1000))
            .is_zero()
    }

    /// Whether `cost` fits when the bucket may be `tolerance_ns` more in debt than it is.
    pub fn fits_within(&self, now_us: u64, cost: f64, tolerance_ns: &BigRational) -> bool {
        let now_ns = BigRational::from_integer(BigInt::from(now_us) * 1000);
        let cost = exact(cost);
        cost <= self.capacity
            && self.debt_ns(&now_ns) <= (&self.capacity - cost) * &self.ns_per_token + tolerance_ns
    }

    /// Takes `cost` whatever the bucket holds: to follow another implementation's decisions.
    pub fn force_take(&mut self, now_us: u64, cost: f64) {
        let now_ns = BigRational::from_integer(BigInt::from(now_us) * 1000);
        let start = match &self.full_at_ns {
            Some(full_at) if full_at > &now_ns => full_at.clone(),
            _ => now_ns,
        };
        self.full_at_ns = Some(start + exact(cost) * &self.ns_per_token);
    }
}
