//! The token bucket: pure, exact math over one instant. No Redis types, no clock.
//!
//! Time comes in as `now_us`, so every rule here is testable with an injected clock. A crate
//! of its own with no dependencies: the module (which imports it directly), the Rust
//! client's local fallback and the fuzzers all run this same code.
//!
//! # Layout
//!
//! One file per concept. Dependencies run one way, from the steps down to the numbers, and
//! none of them reaches Redis or a clock:
//!
//! - `decimal.rs`: [`Decimal`], the exact decimals users type, and the few exact operations
//!   the bucket needs on them.
//! - `ticks.rs`: the tick. `T = 1e9 / rate` ns as an exact fraction reduced from the rate's
//!   decimals, and the integer helpers (time units, division) the tick math shares.
//! - `limit.rs`: [`Limit`] and [`LimitError`]: parsing and validating a rate and a capacity
//!   against the ranges ([`MIN_RATE_PER_S`], [`MAX_RATE_PER_S`], [`MAX_CAPACITY`],
//!   [`MAX_REFILL_S`]), and a limit's conversions between tokens, instants and ticks.
//! - `cost.rs`: [`Cost`], a request's size in tokens.
//! - `state.rs`: [`State`], the stored instant, its range ([`MAX_FULL_AT_NS`],
//!   [`MAX_FULL_AT_FRAC`]), the key's expiry, and its exact encoding in a rate's ticks.
//! - `decision.rs`: what a call reports and writes: [`Outcome`], [`Decision`] and its
//!   millisecond views, [`Change`].
//! - `fallback.rs`: [`FallbackState`], a bucket the Lua fallback wrote (its packed string of
//!   three doubles, or its older hash of three decimal texts), validated and converted to a
//!   [`State`] without moving it earlier.
//! - `acquire.rs`: the steps that take, [`acquire`](fn@acquire) and [`peek`].
//! - `refund.rs`: the step that gives back, [`refund`](fn@refund).
//! - `charge.rs`: the post-paid step, [`charge`](fn@charge), which always applies and may
//!   leave the bucket in debt, and its bound ([`ChargeError`]).
//! - `settle.rs`: the step that settles a reservation, [`settle`]: what was over-estimated
//!   goes back as a refund, what was under-estimated is charged, the difference exact.
//! - `lease.rs`: leases, a limit on work in flight: [`LeaseSet`] (a key's leases, in an
//!   arena indexed by id and by expiry), the steps [`lease`](fn@lease), [`release`],
//!   [`renew`] and [`leases_in_use`], and [`LeaseChange`], the effect a write replicates.
//!   Shares nothing with the bucket.
//! - `lease_index.rs`: the two indexes of a [`LeaseSet`]'s arena, a hash table by id and a
//!   B+tree with counts by `(expires_at_us, id)`.
//! - `model.rs` (tests only): the exact model in rational arithmetic, sharing no code with
//!   the above; the fuzzer includes it by path.
//! - `tests/`: the unit and property tests, one file per concept above, plus the runs that
//!   cross them: drift over a million calls, the invariants, and agreement with the model.
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
//! - **Debt.** A [`charge`](fn@charge) reports work already done, so it always applies and
//!   may take the bucket below zero: `full_at` moves to `max(full_at, now) + cost × T` past
//!   `now + capacity × T`. While `full_at - now > capacity × T` the bucket is in debt: every
//!   take is denied (cost 0 included) with the wait until the take fits, `remaining` is 0,
//!   and [`Decision::balance`] (what `RL.PEEK` reports) is negative. The debt is bounded:
//!   the bucket must be full again within [`MAX_REFILL_S`] of now ([`ChargeError`]).
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

mod acquire;
mod charge;
mod cost;
mod decimal;
mod decision;
mod fallback;
mod lease;
mod lease_index;
mod limit;
mod refund;
mod reserve;
mod settle;
mod state;
mod ticks;

pub use acquire::{acquire, peek};
pub use charge::{charge, ChargeError};
pub use cost::Cost;
pub use decimal::Decimal;
pub use decision::{Change, Charged, Decision, Outcome};
pub use fallback::{
    FallbackError, FallbackState, FALLBACK_MAX_DENOMINATOR, FALLBACK_MAX_US, PACKED_LEN,
    PACKED_PREFIX,
};
pub use lease::{
    expiry_us, lease, leases_in_use, release, renew, Lease, LeaseChange, LeaseId, LeaseOutcome,
    LeaseReply, LeaseSet, Leases, Live, MAX_EXPIRES_AT_US, MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT,
    MAX_LEASE_TTL_MS,
};
pub use limit::{Limit, LimitError, MAX_CAPACITY, MAX_RATE_PER_S, MAX_REFILL_S, MIN_RATE_PER_S};
pub use refund::refund;
pub use reserve::{
    reserve, settle_reservation, valid_records, Records, Reservation, ReserveError, Reserved,
    SettleError, MAX_RESERVATIONS, MAX_RESERVATION_TTL_MS,
};
pub use settle::settle;
pub use state::{State, MAX_FULL_AT_FRAC, MAX_FULL_AT_NS};

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
