//! What a call tells its caller: the [`Outcome`], the [`Decision`] in exact units with the
//! millisecond views a client needs (rounded so that waiting that long is enough), a
//! [`Charged`] bucket's report, and the [`Change`] a call makes to the stored key.
//!
//! Plain values: must not depend on limits or the steps that fill them in, and knows nothing
//! of Redis (a handler turns these into a reply) or a clock.

use crate::state::State;
use crate::ticks::NS_PER_MS;

/// What a call decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The tokens were taken.
    Allowed,
    /// Not enough tokens now; they will be there after `retry_after_ns`.
    Denied,
    /// The request can never succeed: `cost` exceeds capacity, or its refill time would run
    /// past [`MAX_FULL_AT_NS`](crate::MAX_FULL_AT_NS). A denial, reported with
    /// `retry_after_ms() == -1`.
    Impossible,
}

/// The reply to one call, in exact units. Millisecond views round the way a client needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Allowed, denied, or impossible.
    pub outcome: Outcome,
    /// Whole tokens left after this call (rounded down), 0 while the bucket is in debt: what
    /// `X-RateLimit-Remaining` reports.
    pub remaining: u64,
    /// The signed balance after this call, in whole tokens rounded toward −∞: `remaining`
    /// while the bucket holds tokens, negative while it is in debt (a [`charge`](crate::charge)
    /// took it below zero, or the capacity shrank under what it owes). What `RL.PEEK` reports.
    pub balance: i64,
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

/// What a [`charge`](crate::charge) reports: it always applies, so there is no outcome, only
/// the bucket after it, in exact units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charged {
    /// The balance after the charge in whole tokens, rounded toward −∞: negative while the
    /// bucket is in debt.
    pub balance: i64,
    /// The nanoseconds until the debt is repaid (rounded up): until the balance is back to 0,
    /// when a cost-0 check passes again. 0 when not in debt.
    pub repaid_after_ns: u64,
    /// The nanoseconds until the bucket is full (rounded up); 0 when it is full.
    pub reset_after_ns: u64,
}

impl Charged {
    /// Milliseconds until the debt is repaid, rounded up so that a cost-0 check made that
    /// much later passes; 0 when not in debt.
    pub fn retry_after_ms(&self) -> i64 {
        ms_ceil(self.repaid_after_ns)
    }

    /// Milliseconds until the bucket is full, rounded up; 0 when full.
    pub fn reset_after_ms(&self) -> i64 {
        ms_ceil(self.reset_after_ns)
    }
}

pub(crate) fn ms_ceil(ns: u64) -> i64 {
    // At most u64::MAX / 1e6, which always fits.
    i64::try_from(ns.div_ceil(NS_PER_MS)).unwrap_or(i64::MAX)
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
