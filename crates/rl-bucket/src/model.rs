//! The exact model the bucket is tested against: a token bucket in rational arithmetic
//! (`BigRational`), with the rate as the exact value of its double. Test-only.
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
    /// ceil(ns) until `cost` tokens are there; 0 unless denied.
    pub retry_after_ns: u64,
    /// ceil(ns) until full, after the call.
    pub reset_after_ns: u64,
}

/// A limit and an exact instant; `full_at_ns: None` is a full bucket.
#[derive(Clone, Debug)]
pub struct Model {
    capacity: BigRational,
    ns_per_token: BigRational,
    pub full_at_ns: Option<BigRational>,
}

pub fn exact(x: f64) -> BigRational {
    BigRational::from_float(x).expect("finite")
}

fn ceil_u64(x: &BigRational) -> u64 {
    if x.is_negative() {
        return 0;
    }
    x.ceil().to_integer().to_u64().unwrap_or(u64::MAX)
}

impl Model {
    pub fn new(rate_per_s: f64, capacity: f64) -> Self {
        Self::with_ns_per_token(
            BigRational::from_integer(BigInt::from(1_000_000_000)) / exact(rate_per_s),
            capacity,
        )
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

    fn reply(&self, allowed: Option<bool>, debt_ns: &BigRational, retry_ns: &BigRational) -> Reply {
        Reply {
            allowed,
            remaining: self.whole_tokens(debt_ns),
            retry_after_ns: ceil_u64(retry_ns),
            reset_after_ns: ceil_u64(debt_ns),
        }
    }

    /// Takes `cost` at `now_us` if the bucket holds it (cost 0: if it holds >= 0 tokens).
    pub fn acquire(&mut self, now_us: u64, cost: f64) -> Reply {
        let now_ns = BigRational::from_integer(BigInt::from(now_us) * 1000);
        let cost = exact(cost);
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
        reply.reset_after_ns = ceil_u64(&debt_ns);
        reply
    }

    /// `T` in ns, exactly.
    pub fn ns_per_token(&self) -> BigRational {
        self.ns_per_token.clone()
    }

    /// Gives `tokens` back (at most the capacity): `tokens × T` less debt, never below full.
    pub fn refund(&mut self, now_us: u64, tokens: f64) {
        let now_ns = BigRational::from_integer(BigInt::from(now_us) * 1000);
        let give = exact(tokens).min(self.capacity.clone()) * &self.ns_per_token;
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
