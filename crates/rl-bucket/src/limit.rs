//! A limit: the refill rate and the capacity, parsed and validated once ([`Limit::parse`],
//! [`Limit::new`], [`Limit::per_period`], [`Limit::from_decimals`]) against the accepted
//! ranges, with `T` kept as an exact fraction; and its conversions between tokens,
//! instants and ticks, which the steps use. Inside the crate a `Limit` is always valid.
//!
//! Must not depend on the steps or what they report (`acquire`, `refund`, `decision`): a
//! limit is an input, and knows nothing of Redis or a clock.

use crate::cost::Cost;
use crate::decimal::{Decimal, Round};
use crate::state::{State, MAX_FULL_AT_NS};
use crate::ticks::{div_rem, ns_per_token, NS_PER_US};

/// Slowest refill accepted, in tokens per second (one token in about 11.6 days).
pub const MIN_RATE_PER_S: f64 = 1e-6;
/// Fastest refill accepted, in tokens per second (one token per nanosecond).
pub const MAX_RATE_PER_S: f64 = 1e9;
/// Largest burst accepted, in tokens.
pub const MAX_CAPACITY: f64 = 1e15;
/// [`MAX_CAPACITY`] as an integer.
const MAX_CAPACITY_TOKENS: u128 = 1_000_000_000_000_000;
/// The longest full refill (`capacity / rate`) accepted: 100 years, in seconds. The state
/// must be able to hold `now + capacity × T` (it ends in 2262), so a bucket can always hand
/// out every token it reports.
pub const MAX_REFILL_S: f64 = 3_153_600_000.0;

/// A validated limit: a refill rate and a capacity, with `T` as an exact fraction. Inside the
/// crate a `Limit` is always valid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// The rate is `tokens` every `period_s` seconds (`period_s` is 1 for a plain decimal).
    tokens: Decimal,
    period_s: Decimal,
    pub(crate) capacity: Decimal,
    /// `T` in ticks: `T = ticks_per_token / ticks_per_ns` ns, in lowest terms.
    pub(crate) ticks_per_token: u128,
    /// Ticks in one nanosecond: the denominator of `T`, at most 2^62.
    pub(crate) ticks_per_ns: u64,
    /// `capacity × T` in ticks, rounded down (exact for an integer capacity).
    pub(crate) capacity_ticks: u128,
    /// Whether one token fits the capacity: the default cost, checked once here.
    holds_one: bool,
}

/// Which half of a limit was out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// `rate` was not a decimal (or `N/S` of two positive decimals), or its value was outside
    /// `MIN_RATE_PER_S..=MAX_RATE_PER_S`.
    Rate,
    /// `capacity` was not a decimal above zero and at most `MAX_CAPACITY`.
    Capacity,
    /// `capacity / rate` (a full refill) is longer than `MAX_REFILL_S`.
    RefillTime,
}

/// The most significant digits kept of a rate's decimals when its exact `T` needs a finer
/// tick than 2^-62 ns: every decimal of up to 18 digits gives a tick denominator below
/// 10^18 < 2^62 (see the crate docs, "Why it is exact").
const ROUNDED_RATE_DIGITS: u32 = 18;
/// `MAX_REFILL_S` in nanoseconds.
const MAX_REFILL_NS: u128 = 3_153_600_000 * 1_000_000_000;
/// The slowest `T`: 1e15 ns, one token per 1e6 s.
const MAX_NS_PER_TOKEN: u128 = 1_000_000_000_000_000;

impl Limit {
    /// Parses a limit from the texts a user typed: `rate` is a decimal (`10`, `0.1`, `2.5e3`)
    /// in tokens per second, or `N/S`, N tokens every S seconds, both positive decimals
    /// (`100/60`, `3/10`); `capacity` is a decimal. Both are taken exactly, never through a
    /// double: `0.1` is one token every 10 s, and `100/60` one every 0.6 s.
    ///
    /// The grammar of each decimal is [`Decimal::parse`]'s: an optional `+`, digits with an
    /// optional `.`, an optional exponent, at most 38 significant digits; no whitespace,
    /// `inf`, `nan` or hex.
    ///
    /// ```
    /// use rl_bucket::Limit;
    ///
    /// let per_minute = Limit::parse(b"100/60", b"100").unwrap();
    /// assert_eq!(per_minute.ns_per_token(), (600_000_000, 1)); // 0.6 s a token, exactly
    /// assert_eq!(Limit::parse(b"0.1", b"1").unwrap().ns_per_token(), (10_000_000_000, 1));
    /// ```
    ///
    /// # Errors
    /// In argument order: [`LimitError::Rate`] unless `rate` parses and is from `1e-6` to `1e9`
    /// tokens per second (checked on the exact value); [`LimitError::Capacity`] unless
    /// `capacity` parses and `0 < capacity <= 1e15`; [`LimitError::RefillTime`] unless
    /// `capacity / rate <= MAX_REFILL_S`.
    pub fn parse(rate: &[u8], capacity: &[u8]) -> Result<Self, LimitError> {
        let (tokens, period_s) = parse_rate(rate).ok_or(LimitError::Rate)?;
        rate_in_range(tokens, period_s)?;
        let capacity = Decimal::parse(capacity).ok_or(LimitError::Capacity)?;
        Self::build(tokens, period_s, capacity)
    }

    /// A limit of `tokens` every `period_s` seconds and a burst of `capacity`, all exact
    /// decimals: what [`Limit::parse`] builds from `N/S`, and `RL.GCRA` from its integer
    /// count and decimal period.
    ///
    /// # Errors
    /// As for [`Limit::parse`], with the rate `tokens / period_s`.
    pub fn from_decimals(
        tokens: Decimal,
        period_s: Decimal,
        capacity: Decimal,
    ) -> Result<Self, LimitError> {
        rate_in_range(tokens, period_s)?;
        Self::build(tokens, period_s, capacity)
    }

    /// [`Limit::from_decimals`] for a rate already checked by [`rate_in_range`].
    fn build(tokens: Decimal, period_s: Decimal, capacity: Decimal) -> Result<Self, LimitError> {
        if capacity.is_zero() || capacity > Decimal::from_int(MAX_CAPACITY_TOKENS) {
            return Err(LimitError::Capacity);
        }
        let (ticks_per_token, ticks_per_ns) = ns_per_token(tokens, period_s)
            .or_else(|| {
                // The exact T needs a finer tick than the state's fraction can carry: round
                // the rate's decimals toward the slower rate (see the crate docs).
                let tokens = tokens.round_to(ROUNDED_RATE_DIGITS, Round::Down);
                let period_s = period_s.round_to(ROUNDED_RATE_DIGITS, Round::Up);
                let (p, q) = ns_per_token(tokens, period_s)?;
                // Rounding can only slow the rate; never below the slowest one accepted.
                Some(if p > MAX_NS_PER_TOKEN * u128::from(q) {
                    (MAX_NS_PER_TOKEN, 1)
                } else {
                    (p, q)
                })
            })
            .ok_or(LimitError::Rate)?;
        // capacity × T <= MAX_REFILL_S, exactly: ceil(capacity × ticks_per_token) ticks.
        let refill_ticks = capacity
            .mul_round(ticks_per_token, Round::Up)
            .ok_or(LimitError::RefillTime)?;
        if refill_ticks > MAX_REFILL_NS * u128::from(ticks_per_ns) {
            return Err(LimitError::RefillTime);
        }
        let capacity_ticks = capacity
            .mul_round(ticks_per_token, Round::Down)
            .ok_or(LimitError::RefillTime)?;
        Ok(Self {
            tokens,
            period_s,
            capacity,
            ticks_per_token,
            ticks_per_ns,
            capacity_ticks,
            holds_one: capacity >= Decimal::ONE,
        })
    }

    /// Builds a limit of `rate_per_s` tokens per second and a burst of `capacity` tokens from
    /// doubles. Each double is taken as the shortest decimal that reads back as it (what
    /// `Display` prints, and what the client libraries send to the module), so `0.1` is
    /// exactly one token every 10 s, and a bucket built here agrees with the module's bucket
    /// for the same numbers.
    ///
    /// # Errors
    /// [`LimitError::Rate`] unless `1e-6 <= rate_per_s <= 1e9`;
    /// [`LimitError::Capacity`] unless `0 < capacity <= 1e15`. NaN and infinities fail both.
    /// [`LimitError::RefillTime`] unless `capacity / rate_per_s <= MAX_REFILL_S`.
    pub fn new(rate_per_s: f64, capacity: f64) -> Result<Self, LimitError> {
        let rate = Decimal::from_f64(rate_per_s).ok_or(LimitError::Rate)?;
        rate_in_range(rate, Decimal::ONE)?;
        let capacity = Decimal::from_f64(capacity).ok_or(LimitError::Capacity)?;
        Self::build(rate, Decimal::ONE, capacity)
    }

    /// Builds a limit of `tokens` every `period_ns` nanoseconds, exactly: "3 per 10 s" is
    /// `T = 10e9 / 3` ns.
    ///
    /// # Errors
    /// As for [`Limit::new`], with the rate `tokens / period` (and `Rate` for zeros).
    pub fn per_period(tokens: u64, period_ns: u64, capacity: f64) -> Result<Self, LimitError> {
        let (tokens, period_s) = (
            Decimal::from_int(u128::from(tokens)),
            Decimal::new(u128::from(period_ns), -9),
        );
        rate_in_range(tokens, period_s)?;
        let capacity = Decimal::from_f64(capacity).ok_or(LimitError::Capacity)?;
        Self::build(tokens, period_s, capacity)
    }

    /// Tokens added per second, as the nearest double (for display; the bucket uses the exact
    /// value).
    pub fn rate_per_s(&self) -> f64 {
        self.tokens.to_f64() / self.period_s.to_f64()
    }

    /// The most tokens the bucket holds, as the nearest double.
    pub fn capacity(&self) -> f64 {
        self.capacity.to_f64()
    }

    /// The rate exactly: `(tokens, period_s)`, `tokens` every `period_s` seconds.
    pub fn rate(&self) -> (Decimal, Decimal) {
        (self.tokens, self.period_s)
    }

    /// The capacity exactly.
    pub fn capacity_exact(&self) -> Decimal {
        self.capacity
    }

    /// `T` as the exact fraction `(numerator, denominator)` of nanoseconds per token.
    pub fn ns_per_token(&self) -> (u128, u64) {
        (self.ticks_per_token, self.ticks_per_ns)
    }

    /// `cost × T` in ticks, rounded up; `None` when `cost` exceeds the capacity.
    pub(crate) fn cost_ticks(&self, cost: Cost) -> Option<u128> {
        // One token is the common case, and exact without the general product.
        if cost == Cost::ONE {
            return self.holds_one.then_some(self.ticks_per_token);
        }
        if cost.0 > self.capacity {
            return None;
        }
        self.charge_ticks(cost)
    }

    /// The signed balance of a bucket `debt_ticks` short of full, in whole tokens rounded
    /// toward −∞: `floor((capacity × T - debt) / T)`, the largest integer `k` with
    /// `debt <= capacity × T - k × T`, so that a request for that many tokens is always
    /// allowed. Negative while the bucket is in debt (`debt > capacity × T`): a bucket a
    /// quarter of a token in debt holds -1.
    pub(crate) fn balance(&self, debt_ticks: u128) -> i64 {
        match self.capacity_ticks.checked_sub(debt_ticks) {
            Some(held_ticks) => {
                let (held, _) = div_rem(held_ticks, self.ticks_per_token);
                i64::try_from(held).unwrap_or(i64::MAX)
            }
            None => {
                let (owed, rem) = div_rem(debt_ticks - self.capacity_ticks, self.ticks_per_token);
                let owed = owed.saturating_add(u128::from(rem > 0));
                i64::try_from(owed).map_or(i64::MIN, |owed| -owed)
            }
        }
    }

    /// `cost × T` in ticks, rounded up, whatever the capacity: what a charge adds, and what a
    /// take adds once [`Limit::cost_ticks`] has checked the capacity. `None` when it does not
    /// fit in 128 bits (far past any bound a charge accepts).
    pub(crate) fn charge_ticks(&self, cost: Cost) -> Option<u128> {
        if cost == Cost::ONE {
            return Some(self.ticks_per_token);
        }
        cost.0.mul_round(self.ticks_per_token, Round::Up)
    }

    /// [`Limit::balance`] and the whole tokens a caller may take, `remaining`: the balance,
    /// or 0 while in debt.
    pub(crate) fn tokens(&self, debt_ticks: u128) -> (u64, i64) {
        let balance = self.balance(debt_ticks);
        (u64::try_from(balance).unwrap_or(0), balance)
    }

    /// Whether a bucket `debt_ticks` short of full is full again within [`MAX_REFILL_S`]: the
    /// bound a charge may push the bucket to (the same as a full refill's).
    pub(crate) fn within_refill_bound(&self, debt_ticks: u128) -> bool {
        debt_ticks <= MAX_REFILL_NS * u128::from(self.ticks_per_ns)
    }

    /// `ticks` as whole nanoseconds, rounded up.
    pub(crate) fn ns_ceil(&self, ticks: u128) -> u64 {
        let (ns, rem) = div_rem(ticks, u128::from(self.ticks_per_ns));
        u64::try_from(ns + u128::from(rem > 0)).unwrap_or(u64::MAX)
    }

    /// The stored instant in ticks; 0 for a missing key (a full bucket).
    pub(crate) fn full_ticks(&self, state: Option<State>) -> u128 {
        state.map_or(0, |s| s.ticks(self.ticks_per_ns))
    }

    pub(crate) fn now_ticks(&self, now_us: u64) -> u128 {
        u128::from(now_us.saturating_mul(NS_PER_US)) * u128::from(self.ticks_per_ns)
    }

    /// Whether a state at `ticks` can be stored (before [`MAX_FULL_AT_NS`]).
    pub(crate) fn storable(&self, ticks: u128) -> bool {
        // `from_ticks` succeeds iff the whole nanoseconds fit: its fraction always does.
        ticks < u128::from(MAX_FULL_AT_NS + 1) * u128::from(self.ticks_per_ns)
    }
}

/// `N/S` or a plain decimal (`S` = 1), each part a positive decimal.
fn parse_rate(rate: &[u8]) -> Option<(Decimal, Decimal)> {
    let (tokens, period_s) = match rate.iter().position(|&b| b == b'/') {
        Some(at) => (
            Decimal::parse(rate.get(..at)?)?,
            Decimal::parse(rate.get(at + 1..)?)?,
        ),
        None => (Decimal::parse(rate)?, Decimal::ONE),
    };
    (!tokens.is_zero() && !period_s.is_zero()).then_some((tokens, period_s))
}

/// `1e-6 <= tokens / period_s <= 1e9` on the exact values: `period_s <= tokens × 1e6` and
/// `tokens <= period_s × 1e9`.
fn rate_in_range(tokens: Decimal, period_s: Decimal) -> Result<(), LimitError> {
    let ok = !tokens.is_zero()
        && !period_s.is_zero()
        && period_s <= tokens.shifted(6)
        && tokens <= period_s.shifted(9);
    ok.then_some(()).ok_or(LimitError::Rate)
}
