//! The token bucket: pure math over one 64-bit state. No Redis types, no clock.
//!
//! Time comes in as `now_us`, so every rule here is testable with an injected clock.
//! `commands` depends on this file; this file depends on nothing of the crate.
//!
//! # Representation
//!
//! A bucket's whole state is one instant, `full_at_ns`: the nanosecond (Unix epoch) at which
//! the bucket will be full again. This is GCRA (the "virtual scheduling" form of a token
//! bucket): with `T = 1e9 / rate` nanoseconds per token,
//!
//! ```text
//! tokens(now) = capacity - max(0, full_at - now) / T
//! ```
//!
//! Taking `cost` tokens moves `full_at` to `max(full_at, now) + cost × T`, rounded **up** to
//! a whole nanosecond. Why this shape:
//!
//! - **Eight bytes.** The state fits in the module value pointer, so a bucket allocates
//!   nothing beyond Redis's own key overhead.
//! - **Denials are read-only.** Refill is implicit in `now - full_at`, so a call that takes
//!   nothing changes nothing, and has nothing to write or replicate.
//! - **No drift.** Refill is never accumulated; it is recomputed from one subtraction. The
//!   only rounding is `cost × T` up to a whole nanosecond, and it only ever delays tokens.
//!   When `cost × 1e9 / rate` is a whole number of nanoseconds (every integer cost at any
//!   rate that divides 1e9: 0.001/s, 0.5/s, 1/s, 8/s, 1000/s, 1e6/s, …) the count is exact:
//!   after any number of calls it equals `floor(capacity + rate × elapsed)`. At other rates
//!   (3/s, say) each take is late by under one nanosecond of refill, so the limiter can only
//!   be stricter than the model, by under a millisecond of refill per million takes.
//! - **A missing key means a full bucket**, and so does any `full_at <= now`. The key can
//!   therefore expire exactly at `full_at`: from then on, deleting it changes nothing.
//! - **Clocks that step back never add tokens**: a smaller `now` only raises `full_at - now`.
//!
//! ```
//! use redis_rl::bucket::{acquire, Cost, Limit};
//!
//! let limit = Limit::new(5.0, 10.0).unwrap(); // 5 tokens/s, burst of 10
//! let (decision, state) = acquire(&limit, None, 1_000_000, Cost::ONE);
//! assert!(decision.allowed());
//! assert_eq!(decision.remaining, 9);
//! assert_eq!(decision.reset_after_ms(), 200); // one token at 5/s
//! assert!(state.is_some()); // an allowed call changes the state
//! ```

use std::num::NonZeroU64;

const NS_PER_US: u64 = 1_000;
const NS_PER_MS: u64 = 1_000_000;
const NS_PER_S: f64 = 1e9;

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

/// A validated limit: a refill rate and a capacity. Inside the crate a `Limit` is always valid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    rate_per_s: f64,
    capacity: f64,
    ns_per_token: f64,
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
    /// Builds a limit of `rate_per_s` tokens per second and a burst of `capacity` tokens.
    ///
    /// # Errors
    /// [`LimitError::Rate`] unless `1e-6 <= rate_per_s <= 1e9`;
    /// [`LimitError::Capacity`] unless `0 < capacity <= 1e15`. NaN and infinities fail both.
    /// [`LimitError::RefillTime`] unless `capacity / rate_per_s <= MAX_REFILL_S`.
    pub fn new(rate_per_s: f64, capacity: f64) -> Result<Self, LimitError> {
        if !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&rate_per_s) {
            return Err(LimitError::Rate);
        }
        if !(capacity > 0.0 && capacity <= MAX_CAPACITY) {
            return Err(LimitError::Capacity);
        }
        if capacity / rate_per_s > MAX_REFILL_S {
            return Err(LimitError::RefillTime);
        }
        Ok(Self {
            rate_per_s,
            capacity,
            ns_per_token: NS_PER_S / rate_per_s,
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

    /// `floor(tokens × T)`: the refill time of `tokens`, rounded down, saturating.
    fn floor_ns(&self, tokens: f64) -> u64 {
        // `as` saturates (and maps NaN to 0), which is what every caller wants here.
        (tokens * self.ns_per_token).floor() as u64
    }

    /// `ceil(tokens × T)`, or `None` when it does not fit in the state's range.
    fn ceil_ns(&self, tokens: f64) -> Option<u64> {
        let ns = (tokens * self.ns_per_token).ceil();
        (ns <= MAX_FULL_AT_NS as f64).then_some(ns as u64)
    }

    /// Whether `tokens` could be taken now from a bucket that is `debt_ns` short of full.
    fn fits(&self, debt_ns: u64, tokens: f64) -> bool {
        tokens <= self.capacity && debt_ns <= self.floor_ns(self.capacity - tokens)
    }

    /// The whole tokens a bucket `debt_ns` short of full holds: the largest integer `k`
    /// with `fits(debt_ns, k)`, so that a request for `remaining` tokens is always allowed.
    fn whole_tokens(&self, debt_ns: u64) -> u64 {
        let estimate = (self.capacity - debt_ns as f64 / self.ns_per_token).floor();
        // The float estimate can be one off near integers; settle it with the exact test.
        let mut k = estimate.clamp(0.0, self.capacity.floor());
        if k >= 1.0 && !self.fits(debt_ns, k) {
            k -= 1.0;
        }
        if self.fits(debt_ns, k + 1.0) {
            k += 1.0;
        }
        k as u64
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

/// A bucket's stored state: the instant it will be full again. Never zero, so it can live
/// in a non-null pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State {
    full_at_ns: NonZeroU64,
}

impl State {
    /// `None` for 0 or anything past [`MAX_FULL_AT_NS`]: neither is a state this code writes.
    pub fn from_full_at_ns(full_at_ns: u64) -> Option<Self> {
        if full_at_ns > MAX_FULL_AT_NS {
            return None;
        }
        NonZeroU64::new(full_at_ns).map(|full_at_ns| Self { full_at_ns })
    }

    /// The Unix-epoch nanosecond at which the bucket is full.
    pub fn full_at_ns(self) -> u64 {
        self.full_at_ns.get()
    }

    /// The key's expiry: `full_at`, rounded up to a whole millisecond. From that moment a
    /// missing key and this state mean the same full bucket, so no grace is needed.
    pub fn expire_at_ms(self) -> u64 {
        self.full_at_ns.get().div_ceil(NS_PER_MS)
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
    /// When denied, the nanoseconds until `cost` tokens are there; 0 otherwise.
    pub retry_after_ns: u64,
    /// The nanoseconds until the bucket is full; 0 when it is full.
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
    let now_ns = now_us.saturating_mul(NS_PER_US);
    let full_at_ns = state.map_or(0, State::full_at_ns);
    let debt_ns = debt_ns(state, now_us);
    let report = |outcome, debt_ns, retry_after_ns| Decision {
        outcome,
        remaining: limit.whole_tokens(debt_ns),
        retry_after_ns,
        reset_after_ns: debt_ns,
    };

    let cost = cost.tokens();
    if cost > limit.capacity {
        return (report(Outcome::Impossible, debt_ns, 0), None);
    }
    if cost == 0.0 {
        return (report(Outcome::Allowed, debt_ns, 0), None);
    }
    let Some(take_ns) = limit.ceil_ns(cost) else {
        return (report(Outcome::Impossible, debt_ns, 0), None);
    };
    // The bucket has `cost` tokens iff it is at most (capacity - cost) × T short of full.
    let slack_ns = limit.floor_ns(limit.capacity - cost);
    if debt_ns > slack_ns {
        return (report(Outcome::Denied, debt_ns, debt_ns - slack_ns), None);
    }
    let new_full_at_ns = full_at_ns.max(now_ns).checked_add(take_ns);
    let Some(new_state) = new_full_at_ns.and_then(State::from_full_at_ns) else {
        return (report(Outcome::Impossible, debt_ns, 0), None);
    };
    let new_debt_ns = new_state.full_at_ns().saturating_sub(now_ns);
    (report(Outcome::Allowed, new_debt_ns, 0), Some(new_state))
}

/// What [`acquire`] would decide for `cost`, taking nothing. `remaining` and
/// `reset_after_ns` describe the bucket as it is now; `retry_after_ns` is the wait until
/// `cost` tokens are there (0 if they are).
pub fn peek(limit: &Limit, state: Option<State>, now_us: u64, cost: Cost) -> Decision {
    let (mut decision, _) = acquire(limit, state, now_us, cost);
    let debt_ns = debt_ns(state, now_us);
    decision.remaining = limit.whole_tokens(debt_ns);
    decision.reset_after_ns = debt_ns;
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
/// capacity. The refund is rounded down to a whole nanosecond of refill, so it never returns
/// more than was asked. The decision reports the bucket after the refund.
pub fn refund(
    limit: &Limit,
    state: Option<State>,
    now_us: u64,
    tokens: Cost,
) -> (Decision, Change) {
    let now_ns = now_us.saturating_mul(NS_PER_US);
    let debt_ns = debt_ns(state, now_us);
    let give_ns = limit.floor_ns(tokens.tokens());
    let (new_debt_ns, change) = match state {
        Some(_) if debt_ns > 0 && give_ns > 0 => {
            let new_debt_ns = debt_ns.saturating_sub(give_ns);
            // `now + new_debt` is below the stored instant, so it is always a valid state.
            match now_ns
                .checked_add(new_debt_ns)
                .and_then(State::from_full_at_ns)
            {
                _ if new_debt_ns == 0 => (0, Change::Delete),
                Some(new_state) => (new_debt_ns, Change::Set(new_state)),
                None => (debt_ns, Change::Keep),
            }
        }
        _ => (debt_ns, Change::Keep),
    };
    let decision = Decision {
        outcome: Outcome::Allowed,
        remaining: limit.whole_tokens(new_debt_ns),
        retry_after_ns: 0,
        reset_after_ns: new_debt_ns,
    };
    (decision, change)
}

fn debt_ns(state: Option<State>, now_us: u64) -> u64 {
    state
        .map_or(0, State::full_at_ns)
        .saturating_sub(now_us.saturating_mul(NS_PER_US))
}

#[cfg(test)]
mod tests;
