//! The token bucket: pure, exact math over one instant. No Redis types, no clock.
//!
//! Time comes in as `now_us`, so every rule here is testable with an injected clock. A crate
//! of its own with no dependencies: the module (which imports it directly), the Rust
//! client's local fallback and the fuzzers all run this same code.
//!
//! # Representation
//!
//! A bucket's whole state is one instant, `full_at`: when the bucket will be full again. This
//! is GCRA (the "virtual scheduling" form of a token bucket): with `T = 1e9 / rate`
//! nanoseconds per token,
//!
//! ```text
//! tokens(now) = capacity - max(0, full_at - now) / T
//! ```
//!
//! and taking `cost` tokens moves `full_at` to `max(full_at, now) + cost × T`.
//!
//! # Rates are the decimals typed
//!
//! `rate`, `capacity` and `cost` are exact decimals, parsed from their text ([`Limit::parse`],
//! [`Cost::parse`]) and never through a double: `0.1` is one token every 10 s exactly, not
//! the double 0.1000000000000000055…. A rate may also be `N/S`, N tokens every S seconds,
//! both positive decimals: `100/60` is 100 a minute, one token every 0.6 s, which no decimal
//! can write. The ranges (`1e-6..=1e9` tokens per second, a capacity up to `1e15`, a full
//! refill within 100 years) are checked on these exact values. A double given to
//! [`Limit::new`] or [`Cost::new`] is taken as the shortest decimal that reads back as it
//! (what `Display` prints and the client libraries send), so `Limit::new(0.1, …)` is the same
//! bucket as the text `0.1`.
//!
//! # Why it is exact at every rate
//!
//! `T = 1e9 / rate` is often not a whole number of nanoseconds (`1e9 / 3`, or `100/60`'s
//! `6e8`, which is whole, but `7/3`'s `3e9 / 7`, which is not), so a state rounded to whole
//! nanoseconds loses part of a nanosecond on every take, and two takes in one instant lose a
//! token. Instead the math runs in **ticks**: `T` is reduced to an exact fraction
//! `ticks_per_token / ticks_per_ns` (for `rate = n × 10^e`, `T = 10^(9-e) / n`, so the
//! denominator divides the rate's digits), and one tick is `1 / ticks_per_ns` ns. Every
//! instant the bucket produces, `now` (whole ns) plus whole multiples of `T`, is a whole
//! number of ticks, so every comparison is an integer comparison in `u128`, with no rounding
//! at all for integer capacities and costs:
//!
//! - **Bursts:** from full, takes in one instant are allowed while their sum is at most
//!   `capacity`, and `remaining` is exactly `capacity` minus the sum.
//! - **Refill:** after `E` ns from empty there are exactly `floor(rate × E / 1e9)` tokens.
//! - **No drift:** nothing is accumulated; after any number of calls the count is the model's.
//!
//! The stored instant is `full_at_ns` (whole ns) plus `full_at_frac`, the part of a nanosecond
//! in units of 2^-63 ns, **rounded up**. Because `ticks_per_ns <= 2^62`, rounding the fraction
//! `rem / ticks_per_ns` up to 2^-63 is reversible: decoding at the same rate recovers `rem`
//! exactly (see [`State::ticks`]). Decoding at another rate (the caller changed the limit)
//! re-expresses the instant in the new rate's ticks, rounded up, so a limit change can make
//! the bucket stricter by under a tick, never laxer by more than 2^-63 ns. A state written by
//! 0.1.0 or 0.2.0, which took a rate as the exact value of its double (`0.1` was
//! 0.1000000000000000055…/s), is read the same way: it is the same instant, re-expressed in
//! the decimal rate's ticks, so it is at most one tick stricter.
//!
//! Most buckets never have a fraction: every rate whose `T` is a whole number of nanoseconds
//! (1/s, 8/s, 1000/s, 0.5/s, 0.1/s, 0.01/s, 0.000001/s, `100/60` …) has `ticks_per_ns = 1`.
//! Then the state is 64 bits and lives in the value pointer; only a state with a fraction
//! costs the 16-byte allocation (see `datatype`).
//!
//! **Decimals too fine for the tick.** The fraction is reversible only for a denominator of
//! at most 2^62. Every rate of up to 18 significant digits (every double's shortest decimal
//! has at most 17) fits: the denominator divides its digits, below 10^18 < 2^62. So does
//! every `N/S` whose N and S have up to 18 digits each: the denominator divides N's digits
//! times a power of ten, and that product is at most S's digits, since `T >= 1` ns. A longer decimal whose exact `T` needs a finer tick (say
//! `1.000000000000000000000001`, whose denominator is 10^24 + 1) is not refused: its
//! decimals are cut to 18 significant digits, N (or the rate) rounded down and S rounded up.
//! That only slows the rate, by under a part in 10^17, and never below the slowest rate
//! accepted; the range checks have already been made on the exact value.
//!
//! What is not exact, and by how much:
//!
//! - **Fractional capacity or cost** (2.5, 0.1): `capacity × T` is rounded down and
//!   `cost × T` up to a whole tick, from the exact decimals. A decision is at most two ticks
//!   (under 2 ns of refill) stricter than the model and never laxer.
//! - **A refund** gives back `cost × T` rounded down to a tick: never more than asked.
//! - **A denial near 2262.** If taking `cost` after the promised `retry_after_ms` would
//!   store an instant past [`MAX_FULL_AT_NS`], the request is [`Outcome::Impossible`] now,
//!   rather than a promise that the retry would break.
//!
//! Other properties:
//!
//! - **Denials are read-only.** Refill is implicit in `now - full_at`, so a call that takes
//!   nothing changes nothing, and has nothing to write or replicate.
//! - **A missing key means a full bucket**, and so does any `full_at <= now`. The key can
//!   therefore expire exactly at `full_at` (rounded up to a millisecond).
//! - **Clocks that step back never add tokens**: a smaller `now` only raises `full_at - now`.
//! - **Cost 0** asks "am I limited?": allowed iff the bucket holds at least 0 tokens. After a
//!   limit shrank, a bucket can owe more than its whole capacity; then cost 0 is denied with
//!   the wait until the debt fits again, as redis-cell answers.
//!
//! ```
//! use rl_bucket::{acquire, Cost, Limit};
//!
//! let limit = Limit::new(7.0, 7.0).unwrap(); // 7 tokens/s, burst of 7
//! let (decision, state) = acquire(&limit, None, 1_000_000, Cost::ONE);
//! assert!(decision.allowed());
//! assert_eq!(decision.remaining, 6);
//! assert_eq!(decision.reset_after_ms(), 143); // one token at 7/s, rounded up
//! let (decision, _) = acquire(&limit, state, 1_000_000, Cost::new(6.0).unwrap());
//! assert_eq!(decision.remaining, 0); // a burst of 7 in one instant gets exactly 7
//! ```

use std::num::NonZeroU64;

mod decimal;

pub use decimal::Decimal;
use decimal::Round;

const NS_PER_US: u64 = 1_000;
const NS_PER_MS: u64 = 1_000_000;
/// The stored fraction of a nanosecond is in units of `2^-FRAC_BITS` ns.
const FRAC_BITS: u32 = 63;
const FRAC_MASK: u128 = (1 << FRAC_BITS) - 1;
/// The finest tick, 2^-62 ns: the stored fraction (units of 2^-63 ns) is reversible only for
/// denominators below 2^63.
const MAX_TICKS_PER_NS: u64 = 1 << 62;

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
/// The latest `full_at_ns` a state may hold: `i64::MAX` ns, in the year 2262. Keeping it in
/// `i64` range lets it travel as a signed integer through replication and RDB.
pub const MAX_FULL_AT_NS: u64 = i64::MAX as u64;
/// The largest `full_at_frac` (units of 2^-63 ns): it travels as a signed 64-bit integer too.
pub const MAX_FULL_AT_FRAC: u64 = FRAC_MASK as u64;

/// A validated limit: a refill rate and a capacity, with `T` as an exact fraction. Inside the
/// crate a `Limit` is always valid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// The rate is `tokens` every `period_s` seconds (`period_s` is 1 for a plain decimal).
    tokens: Decimal,
    period_s: Decimal,
    capacity: Decimal,
    /// `T` in ticks: `T = ticks_per_token / ticks_per_ns` ns, in lowest terms.
    ticks_per_token: u128,
    /// Ticks in one nanosecond: the denominator of `T`, at most 2^62.
    ticks_per_ns: u64,
    /// `capacity × T` in ticks, rounded down (exact for an integer capacity).
    capacity_ticks: u128,
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
    fn cost_ticks(&self, cost: Cost) -> Option<u128> {
        // One token is the common case, and exact without the general product.
        if cost == Cost::ONE {
            return self.holds_one.then_some(self.ticks_per_token);
        }
        if cost.0 > self.capacity {
            return None;
        }
        cost.0.mul_round(self.ticks_per_token, Round::Up)
    }

    /// Whole tokens in a bucket `debt_ticks` short of full: the largest integer `k` with
    /// `debt_ticks <= capacity_ticks - k × T`, so that a request for `remaining` tokens is
    /// always allowed. 0 when the bucket owes more than its capacity.
    fn whole_tokens(&self, debt_ticks: u128) -> u64 {
        let (held, _) = div_rem(
            self.capacity_ticks.saturating_sub(debt_ticks),
            self.ticks_per_token,
        );
        u64::try_from(held).unwrap_or(u64::MAX)
    }

    /// `ticks` as whole nanoseconds, rounded up.
    fn ns_ceil(&self, ticks: u128) -> u64 {
        let (ns, rem) = div_rem(ticks, u128::from(self.ticks_per_ns));
        u64::try_from(ns + u128::from(rem > 0)).unwrap_or(u64::MAX)
    }

    /// The stored instant in ticks; 0 for a missing key (a full bucket).
    fn full_ticks(&self, state: Option<State>) -> u128 {
        state.map_or(0, |s| s.ticks(self.ticks_per_ns))
    }

    fn now_ticks(&self, now_us: u64) -> u128 {
        u128::from(now_us.saturating_mul(NS_PER_US)) * u128::from(self.ticks_per_ns)
    }

    /// Whether a state at `ticks` can be stored (before [`MAX_FULL_AT_NS`]).
    fn storable(&self, ticks: u128) -> bool {
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

/// A request's size in tokens: an exact decimal `>= 0`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost(Decimal);

impl Cost {
    /// One token, the default cost.
    pub const ONE: Cost = Cost(Decimal::ONE);

    /// Parses a cost from its text, exactly (the grammar of [`Decimal::parse`]). `None` for
    /// anything that is not a decimal `>= 0`.
    ///
    /// ```
    /// use rl_bucket::Cost;
    ///
    /// assert_eq!(Cost::parse(b"1"), Some(Cost::ONE));
    /// assert_eq!(Cost::parse(b"-1"), None);
    /// ```
    pub fn parse(text: &[u8]) -> Option<Self> {
        Decimal::parse(text).map(Self)
    }

    /// An exact decimal cost.
    pub fn from_decimal(tokens: Decimal) -> Self {
        Self(tokens)
    }

    /// `None` unless `tokens` is finite and `>= 0`. The double is taken as the shortest
    /// decimal that reads back as it, as [`Limit::new`] takes its numbers.
    pub fn new(tokens: f64) -> Option<Self> {
        Decimal::from_f64(tokens).map(Self)
    }

    /// The cost in tokens, as the nearest double.
    pub fn tokens(self) -> f64 {
        self.0.to_f64()
    }

    /// The cost in tokens, exactly.
    pub fn exact(self) -> Decimal {
        self.0
    }
}

/// A bucket's stored state: the instant it will be full again, as whole nanoseconds since the
/// Unix epoch plus a fraction of a nanosecond. Never zero, so it can live in a non-null
/// pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State {
    full_at_ns: NonZeroU64,
    /// The part of a nanosecond past `full_at_ns`, in units of 2^-63 ns, rounded up.
    full_at_frac: u64,
}

impl State {
    /// A whole-nanosecond instant. `None` for 0 or anything past [`MAX_FULL_AT_NS`]: neither
    /// is a state this code writes.
    pub fn from_full_at_ns(full_at_ns: u64) -> Option<Self> {
        Self::from_parts(full_at_ns, 0)
    }

    /// An instant of `full_at_ns + full_at_frac × 2^-63` ns. `None` unless `full_at_ns` is a
    /// valid instant and `full_at_frac <= MAX_FULL_AT_FRAC`.
    pub fn from_parts(full_at_ns: u64, full_at_frac: u64) -> Option<Self> {
        if full_at_ns > MAX_FULL_AT_NS || full_at_frac > MAX_FULL_AT_FRAC {
            return None;
        }
        NonZeroU64::new(full_at_ns).map(|full_at_ns| Self {
            full_at_ns,
            full_at_frac,
        })
    }

    /// The whole Unix-epoch nanosecond at or before which the bucket is full.
    pub fn full_at_ns(self) -> u64 {
        self.full_at_ns.get()
    }

    /// The fraction of a nanosecond past [`State::full_at_ns`], in units of 2^-63 ns.
    pub fn full_at_frac(self) -> u64 {
        self.full_at_frac
    }

    /// The key's expiry: `full_at`, rounded up to a whole millisecond. From that moment a
    /// missing key and this state mean the same full bucket, so no grace is needed.
    pub fn expire_at_ms(self) -> u64 {
        let ns_ceil = self.full_at_ns.get() + u64::from(self.full_at_frac > 0);
        ns_ceil.div_ceil(NS_PER_MS)
    }

    /// The instant in ticks of `1 / ticks_per_ns` ns, rounded up to a tick.
    ///
    /// When the state was made at the same `ticks_per_ns` (`from_ticks`), this is exact: with
    /// `frac = ceil(rem × 2^63 / d)` and `d < 2^63`, `frac × d` lies in
    /// `[rem × 2^63, rem × 2^63 + d)`, so its high part is `rem` and its low part is below
    /// `d`. A low part of `d` or more can only come from another `d`; rounding up then keeps
    /// the instant from moving earlier.
    fn ticks(self, ticks_per_ns: u64) -> u128 {
        let d = u128::from(ticks_per_ns);
        let product = u128::from(self.full_at_frac) * d;
        let rem = (product >> FRAC_BITS) + u128::from((product & FRAC_MASK) >= d);
        u128::from(self.full_at_ns.get()) * d + rem
    }

    /// The state at `ticks` of `1 / ticks_per_ns` ns; `None` past [`MAX_FULL_AT_NS`].
    fn from_ticks(ticks: u128, ticks_per_ns: u64) -> Option<Self> {
        let d = u128::from(ticks_per_ns);
        let (full_at_ns, rem) = div_rem(ticks, d);
        let full_at_ns = u64::try_from(full_at_ns).ok()?;
        // rem < d < 2^63, so the shift fits and the quotient is below 2^63.
        let full_at_frac = if rem == 0 {
            0
        } else {
            u64::try_from((rem << FRAC_BITS).div_ceil(d)).ok()?
        };
        Self::from_parts(full_at_ns, full_at_frac)
    }
}

/// What a call decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The tokens were taken.
    Allowed,
    /// Not enough tokens now; they will be there after `retry_after_ns`.
    Denied,
    /// The request can never succeed: `cost` exceeds capacity, or its refill time would run
    /// past [`MAX_FULL_AT_NS`]. A denial, reported with `retry_after_ms() == -1`.
    Impossible,
}

/// The reply to one call, in exact units. Millisecond views round the way a client needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Allowed, denied, or impossible.
    pub outcome: Outcome,
    /// Whole tokens left after this call (rounded down).
    pub remaining: u64,
    /// When denied, the nanoseconds until `cost` tokens are there (rounded up); 0 otherwise.
    pub retry_after_ns: u64,
    /// The nanoseconds until the bucket is full (rounded up); 0 when it is full.
    pub reset_after_ns: u64,
}

impl Decision {
    /// Whether the tokens were taken.
    pub fn allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// Milliseconds to wait before retrying, rounded up so that a client waiting that long
    /// gets through; 0 when allowed, -1 when the request can never succeed.
    pub fn retry_after_ms(&self) -> i64 {
        match self.outcome {
            Outcome::Allowed => 0,
            Outcome::Denied => ms_ceil(self.retry_after_ns),
            Outcome::Impossible => -1,
        }
    }

    /// Milliseconds until the bucket is full, rounded up; 0 when full.
    pub fn reset_after_ms(&self) -> i64 {
        ms_ceil(self.reset_after_ns)
    }
}

fn ms_ceil(ns: u64) -> i64 {
    // At most u64::MAX / 1e6, which always fits.
    i64::try_from(ns.div_ceil(NS_PER_MS)).unwrap_or(i64::MAX)
}

/// Takes `cost` tokens at `now_us` if the bucket holds them. Never reads a clock.
///
/// Returns the decision and, only when the call changed the bucket, its new state: `None`
/// means there is nothing to write (a denial, or `cost` 0).
///
/// `state` is `None` for a missing key, which is a full bucket.
pub fn acquire(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    cost: Cost,
) -> (Decision, Option<State>) {
    let (decision, new_state, _) = decide(limit, state, now_us, cost);
    (decision, new_state)
}

/// [`acquire`], also returning how far short of full the bucket was before the call, which
/// [`peek`] reports.
fn decide(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    cost: Cost,
) -> (Decision, Option<State>, u128) {
    let now_ticks = limit.now_ticks(now_us);
    let full_ticks = limit.full_ticks(state);
    let debt_ticks = full_ticks.saturating_sub(now_ticks);
    let report = |outcome, debt_ticks, retry_ticks| Decision {
        outcome,
        remaining: limit.whole_tokens(debt_ticks),
        retry_after_ns: limit.ns_ceil(retry_ticks),
        reset_after_ns: limit.ns_ceil(debt_ticks),
    };

    let Some(cost_ticks) = limit.cost_ticks(cost) else {
        return (report(Outcome::Impossible, debt_ticks, 0), None, debt_ticks);
    };
    // The bucket holds `cost` tokens iff it is at most (capacity - cost) × T short of full.
    let slack_ticks = limit.capacity_ticks.saturating_sub(cost_ticks);
    if debt_ticks > slack_ticks {
        let retry_ticks = debt_ticks - slack_ticks;
        // A client retries after `retry_after_ms`: the take then starts from the later of
        // the stored instant and that moment. If it could not be stored (past 2262), the
        // retry would be answered "impossible": say so now rather than promise it. The
        // retry rounds up by under 1 ms + 1 ns past `now + retry = full - slack`, so a take
        // from `full` with that much to spare always fits (the usual case: one comparison).
        let d = u128::from(limit.ticks_per_ns);
        let spare_ticks = u128::from(NS_PER_MS + 1) * d;
        let take_ticks = full_ticks.saturating_add(cost_ticks);
        if !limit.storable(take_ticks.saturating_add(spare_ticks)) {
            let wait_ns = ms_ceil(limit.ns_ceil(retry_ticks)).unsigned_abs() * NS_PER_MS;
            let retry_at_ticks = now_ticks.saturating_add(u128::from(wait_ns).saturating_mul(d));
            if !limit.storable(full_ticks.max(retry_at_ticks).saturating_add(cost_ticks)) {
                return (report(Outcome::Impossible, debt_ticks, 0), None, debt_ticks);
            }
        }
        return (
            report(Outcome::Denied, debt_ticks, retry_ticks),
            None,
            debt_ticks,
        );
    }
    if cost_ticks == 0 {
        return (report(Outcome::Allowed, debt_ticks, 0), None, debt_ticks);
    }
    let new_state = full_ticks
        .max(now_ticks)
        .checked_add(cost_ticks)
        .and_then(|ticks| Some((ticks, State::from_ticks(ticks, limit.ticks_per_ns)?)));
    let Some((new_full_ticks, new_state)) = new_state else {
        return (report(Outcome::Impossible, debt_ticks, 0), None, debt_ticks);
    };
    let new_debt_ticks = new_full_ticks - now_ticks;
    (
        report(Outcome::Allowed, new_debt_ticks, 0),
        Some(new_state),
        debt_ticks,
    )
}

/// What [`acquire`] would decide for `cost`, taking nothing. `remaining` and
/// `reset_after_ns` describe the bucket as it is now; `retry_after_ns` is the wait until
/// `cost` tokens are there (0 if they are).
pub fn peek(limit: &Limit, state: Option<State>, now_us: u64, cost: Cost) -> Decision {
    let (mut decision, taken, debt_ticks) = decide(limit, state, now_us, cost);
    if taken.is_some() {
        decision.remaining = limit.whole_tokens(debt_ticks);
        decision.reset_after_ns = limit.ns_ceil(debt_ticks);
    }
    decision
}

/// What a call does to the stored key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing to write.
    Keep,
    /// Store this state.
    Set(State),
    /// The bucket is full again: delete the key, which means the same.
    Delete,
}

/// Gives `tokens` back (for a request that failed before doing any work), capped at
/// capacity. The refund is rounded down to a whole tick of refill, so it never returns more
/// than was asked. The decision reports the bucket after the refund.
pub fn refund(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    tokens: Cost,
) -> (Decision, Change) {
    let now_ticks = limit.now_ticks(now_us);
    let debt_ticks = limit.full_ticks(state).saturating_sub(now_ticks);
    let give_ticks = tokens
        .0
        .min(limit.capacity)
        .mul_round(limit.ticks_per_token, Round::Down)
        .unwrap_or(0);
    let (new_debt_ticks, change) = match state {
        Some(_) if debt_ticks > 0 && give_ticks > 0 => {
            let new_debt_ticks = debt_ticks.saturating_sub(give_ticks);
            if new_debt_ticks == 0 {
                (0, Change::Delete)
            } else {
                // `now + new_debt` is below the stored instant, so it is always a valid state.
                match State::from_ticks(now_ticks + new_debt_ticks, limit.ticks_per_ns) {
                    Some(new_state) => (new_debt_ticks, Change::Set(new_state)),
                    None => (debt_ticks, Change::Keep),
                }
            }
        }
        _ => (debt_ticks, Change::Keep),
    };
    let decision = Decision {
        outcome: Outcome::Allowed,
        remaining: limit.whole_tokens(new_debt_ticks),
        retry_after_ns: 0,
        reset_after_ns: limit.ns_ceil(new_debt_ticks),
    };
    (decision, change)
}

// ---------------------------------------------------------------------------------------------
// T from the rate's decimals.
// ---------------------------------------------------------------------------------------------

/// `T = 1e9 × period_s / tokens` ns as `(numerator, denominator)` in lowest terms, for a rate
/// in range; `None` when the denominator exceeds [`MAX_TICKS_PER_NS`].
///
/// With `period_s = s × 10^a` and `tokens = n × 10^b`, `T = s × 10^k / n` for
/// `k = 9 + a - b`. After dividing out `gcd(s, n)`, only the twos and fives of `10^k` can
/// cancel against the other side, so the reduction is a gcd and two short loops.
fn ns_per_token(tokens: Decimal, period_s: Decimal) -> Option<(u128, u64)> {
    let (s, n) = (period_s.digits(), tokens.digits());
    let g = gcd(s, n);
    let (mut p, mut q) = (s.checked_div(g)?, n.checked_div(g)?);
    let k = 9 + i64::from(period_s.exp10()) - i64::from(tokens.exp10());
    let k_abs = u32::try_from(k.unsigned_abs()).ok()?;
    // 10^k on the side its sign puts it; what it cancels on the other side first.
    let (top, bottom) = if k >= 0 {
        (&mut p, &mut q)
    } else {
        (&mut q, &mut p)
    };
    let twos = bottom.trailing_zeros().min(k_abs);
    *bottom >>= twos;
    let mut fives = 0;
    while fives < k_abs && *bottom % 5 == 0 {
        *bottom /= 5;
        fives += 1;
    }
    *top = top
        .checked_mul(2u128.checked_pow(k_abs - twos)?)?
        .checked_mul(5u128.checked_pow(k_abs - fives)?)?;
    let q = u64::try_from(q).ok().filter(|&q| q <= MAX_TICKS_PER_NS)?;
    Some((p, q))
}

/// `(n / d, n % d)` for `d > 0`, in 64-bit arithmetic when both fit (the usual case, and
/// several times faster than a 128-bit division), and `d == 1` for free.
fn div_rem(n: u128, d: u128) -> (u128, u128) {
    if d == 1 {
        return (n, 0);
    }
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) if d > 0 => (u128::from(n / d), u128::from(n % d)),
        _ => (n.checked_div(d).unwrap_or(0), n.checked_rem(d).unwrap_or(0)),
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
