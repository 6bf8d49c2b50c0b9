//! The token bucket: pure, exact math over one instant. No Redis types, no clock.
//!
//! Time comes in as `now_us`, so every rule here is testable with an injected clock. A crate
//! of its own with no dependencies: the module (`redis_rl::bucket` re-exports it), the Rust
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
//! # Why it is exact at every rate
//!
//! `T` is rarely a whole number of nanoseconds (`1e9 / 3`, or `1e9 / 0.3` where `0.3` is
//! really the double `5404319552844595 / 2^54`), so a state rounded to whole nanoseconds loses
//! part of a nanosecond on every take, and two takes in one instant lose a token. Instead the
//! math runs in **ticks**: `T` is reduced to an exact fraction `ticks_per_token /
//! ticks_per_ns` (the rate is taken as the exact value of its double, so the denominator is
//! below 2^53), and one tick is `1 / ticks_per_ns` ns. Every instant the bucket produces,
//! `now` (whole ns) plus whole multiples of `T`, is a whole number of ticks, so every
//! comparison is an integer comparison in `u128`, with no rounding at all for integer
//! capacities and costs:
//!
//! - **Bursts:** from full, takes in one instant are allowed while their sum is at most
//!   `capacity`, and `remaining` is exactly `capacity` minus the sum.
//! - **Refill:** after `E` ns from empty there are exactly `floor(rate × E / 1e9)` tokens.
//! - **No drift:** nothing is accumulated; after any number of calls the count is the model's.
//!
//! The stored instant is `full_at_ns` (whole ns) plus `full_at_frac`, the part of a nanosecond
//! in units of 2^-63 ns, **rounded up**. Because `ticks_per_ns < 2^63`, rounding the fraction
//! `rem / ticks_per_ns` up to 2^-63 is reversible: decoding at the same rate recovers `rem`
//! exactly (see [`State::ticks`]). Decoding at another rate (the caller changed the limit)
//! re-expresses the instant in the new rate's ticks, rounded up, so a limit change can make
//! the bucket stricter by under a tick, never laxer by more than 2^-63 ns.
//!
//! Most buckets never have a fraction: every rate dividing 1e9 (1/s, 8/s, 1000/s, 0.5/s …)
//! has `ticks_per_ns = 1`. Then the state is 64 bits and lives in the value pointer; only a
//! state with a fraction costs the 16-byte allocation (see `datatype`).
//!
//! What is not exact, and by how much:
//!
//! - **Fractional capacity or cost** (2.5, 0.1): `capacity × T` is rounded down and
//!   `cost × T` up to a whole tick, both from the exact values of the doubles. A decision is
//!   at most two ticks (under 2 ns of refill) stricter than the model and never laxer. The
//!   doubles themselves are the nearest to the decimals typed (relative error under 2^-53).
//! - **A refund** gives back `cost × T` rounded down to a tick: never more than asked.
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

const NS_PER_US: u64 = 1_000;
const NS_PER_MS: u64 = 1_000_000;
/// `1e9 = 2^9 × 5^9`: the factors `T = 1e9 / rate` can cancel.
const FIVE_POW_9: u128 = 1_953_125;
/// The stored fraction of a nanosecond is in units of `2^-FRAC_BITS` ns.
const FRAC_BITS: u32 = 63;
const FRAC_MASK: u128 = (1 << FRAC_BITS) - 1;
/// The finest tick: a double rate has a denominator of at most 2^53, a period one of 1e9.
const MAX_TICKS_PER_NS: u64 = 1 << 62;

/// Slowest refill accepted, in tokens per second (one token in about 11.6 days).
pub const MIN_RATE_PER_S: f64 = 1e-6;
/// Fastest refill accepted, in tokens per second (one token per nanosecond).
pub const MAX_RATE_PER_S: f64 = 1e9;
/// Largest burst accepted, in tokens.
pub const MAX_CAPACITY: f64 = 1e15;
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
    rate_per_s: f64,
    capacity: f64,
    /// `T` in ticks: `T = ticks_per_token / ticks_per_ns` ns, in lowest terms.
    ticks_per_token: u128,
    /// Ticks in one nanosecond: the denominator of `T`, at most 2^53.
    ticks_per_ns: u64,
    /// `capacity × T` in ticks, rounded down (exact for an integer capacity).
    capacity_ticks: u128,
}

/// Which half of a limit was out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// `rate` was not finite, or outside `MIN_RATE_PER_S..=MAX_RATE_PER_S`.
    Rate,
    /// `capacity` was not finite, not above zero, or above `MAX_CAPACITY`.
    Capacity,
    /// `capacity / rate` (a full refill) is longer than `MAX_REFILL_S`.
    RefillTime,
}

impl Limit {
    /// Builds a limit of `rate_per_s` tokens per second and a burst of `capacity` tokens. The
    /// rate is the exact value of the double.
    ///
    /// # Errors
    /// [`LimitError::Rate`] unless `1e-6 <= rate_per_s <= 1e9`;
    /// [`LimitError::Capacity`] unless `0 < capacity <= 1e15`. NaN and infinities fail both.
    /// [`LimitError::RefillTime`] unless `capacity / rate_per_s <= MAX_REFILL_S`.
    pub fn new(rate_per_s: f64, capacity: f64) -> Result<Self, LimitError> {
        if !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&rate_per_s) {
            return Err(LimitError::Rate);
        }
        let (ticks_per_token, ticks_per_ns) = ns_per_token(rate_per_s).ok_or(LimitError::Rate)?;
        Self::build(rate_per_s, capacity, ticks_per_token, ticks_per_ns)
    }

    /// Builds a limit of `tokens` every `period_ns` nanoseconds, exactly: "3 per 10 s" is
    /// `T = 10e9 / 3` ns, not `1e9 / 0.3` with `0.3` rounded to a double.
    ///
    /// # Errors
    /// As for [`Limit::new`], with the rate `tokens / period` (and `Rate` for zeros).
    pub fn per_period(tokens: u64, period_ns: u64, capacity: f64) -> Result<Self, LimitError> {
        if tokens == 0 || period_ns == 0 {
            return Err(LimitError::Rate);
        }
        let rate_per_s = tokens as f64 * 1e9 / period_ns as f64;
        // Compare exactly where the quotient rounds: tokens × 1e9 / period within the range.
        let scaled = u128::from(tokens) * 1_000_000_000;
        let too_slow = scaled * 1_000_000 < u128::from(period_ns);
        let too_fast = scaled > u128::from(period_ns) * 1_000_000_000;
        if too_slow || too_fast {
            return Err(LimitError::Rate);
        }
        let gcd = gcd(u128::from(period_ns), u128::from(tokens));
        let ticks_per_ns = u64::try_from(u128::from(tokens) / gcd).map_err(|_| LimitError::Rate)?;
        Self::build(
            rate_per_s,
            capacity,
            u128::from(period_ns) / gcd,
            ticks_per_ns,
        )
    }

    fn build(
        rate_per_s: f64,
        capacity: f64,
        ticks_per_token: u128,
        ticks_per_ns: u64,
    ) -> Result<Self, LimitError> {
        if !(capacity > 0.0 && capacity <= MAX_CAPACITY) {
            return Err(LimitError::Capacity);
        }
        // The stored fraction (2^-63 ns) is reversible only for denominators below 2^63.
        if ticks_per_ns == 0 || ticks_per_ns > MAX_TICKS_PER_NS {
            return Err(LimitError::Rate);
        }
        if capacity / rate_per_s > MAX_REFILL_S {
            return Err(LimitError::RefillTime);
        }
        let capacity_ticks =
            mul_f64(ticks_per_token, capacity, Round::Down).ok_or(LimitError::RefillTime)?;
        Ok(Self {
            rate_per_s,
            capacity,
            ticks_per_token,
            ticks_per_ns,
            capacity_ticks,
        })
    }

    /// Tokens added per second.
    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// `T` as the exact fraction `(numerator, denominator)` of nanoseconds per token.
    pub fn ns_per_token(&self) -> (u128, u64) {
        (self.ticks_per_token, self.ticks_per_ns)
    }

    /// `cost × T` in ticks, rounded up; `None` when `cost` exceeds the capacity.
    fn cost_ticks(&self, cost: Cost) -> Option<u128> {
        if cost.0 > self.capacity {
            return None;
        }
        // An integer cost is the common case, and exact without the general product.
        if cost.0 == 1.0 {
            return Some(self.ticks_per_token);
        }
        mul_f64(self.ticks_per_token, cost.0, Round::Up)
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
}

/// A request's size in tokens: finite and not negative.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost(f64);

impl Cost {
    /// One token, the default cost.
    pub const ONE: Cost = Cost(1.0);

    /// `None` unless `tokens` is finite and `>= 0`.
    pub fn new(tokens: f64) -> Option<Self> {
        (tokens.is_finite() && tokens >= 0.0).then_some(Self(tokens))
    }

    /// The cost in tokens.
    pub fn tokens(self) -> f64 {
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
    let give_ticks = mul_f64(
        limit.ticks_per_token,
        tokens.0.min(limit.capacity),
        Round::Down,
    )
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
// Exact arithmetic on doubles.
// ---------------------------------------------------------------------------------------------

/// The exact value of a finite, non-negative double: `mantissa × 2^exponent`.
fn dyadic(x: f64) -> (u64, i32) {
    let bits = x.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    }
}

/// `T = 1e9 / rate` ns as `(numerator, denominator)` in lowest terms, for a rate in range.
/// With `rate = m × 2^e` (m odd), `1e9 / rate = 5^9 × 2^(9 - e) / m`; only powers of five can
/// cancel against the odd `m`, and only when `e > 9` is there a power of two below the line.
fn ns_per_token(rate_per_s: f64) -> Option<(u128, u64)> {
    let (mantissa, exponent) = dyadic(rate_per_s);
    if mantissa == 0 {
        return None;
    }
    let zeros = mantissa.trailing_zeros();
    let mut odd = mantissa >> zeros;
    let exponent = exponent + zeros as i32;
    let mut fives = FIVE_POW_9;
    while fives > 1 && odd % 5 == 0 {
        odd /= 5;
        fives /= 5;
    }
    let twos = 9 - exponent;
    if twos >= 0 {
        let shift = u32::try_from(twos).ok()?;
        (fives.leading_zeros() > shift).then(|| (fives << shift, odd))
    } else {
        let shift = twos.unsigned_abs();
        (odd.leading_zeros() > shift).then(|| (fives, odd << shift))
    }
}

/// Which way an inexact product rounds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Round {
    Down,
    Up,
}

/// `a × x` for a finite `x >= 0`, computed exactly and then rounded to an integer; `None` when
/// it does not fit in `u128`.
fn mul_f64(a: u128, x: f64, round: Round) -> Option<u128> {
    let (mantissa, exponent) = dyadic(x);
    if a == 0 || mantissa == 0 {
        return Some(0);
    }
    let m = u128::from(mantissa);
    if exponent >= 0 {
        let product = a.checked_mul(m)?;
        let shift = exponent.unsigned_abs();
        return (product.leading_zeros() >= shift).then(|| product << shift);
    }
    // The 192-bit product a × m = high × 2^64 + low, shifted right by -exponent.
    let low_product = (a & u128::from(u64::MAX)) * m;
    let high = (a >> 64) * m + (low_product >> 64);
    let low = low_product & u128::from(u64::MAX);
    let shift = exponent.unsigned_abs();
    let (quotient, inexact) = if shift < 64 {
        if high.leading_zeros() < 64 - shift {
            return None;
        }
        let mask = (1u128 << shift) - 1;
        ((high << (64 - shift)) | (low >> shift), low & mask != 0)
    } else if shift < 192 {
        let t = shift - 64;
        let mask = if t == 0 { 0 } else { (1u128 << t) - 1 };
        (high >> t, low != 0 || high & mask != 0)
    } else {
        (0, true)
    };
    match round {
        Round::Down => Some(quotient),
        Round::Up => quotient.checked_add(u128::from(inexact)),
    }
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
