//! A bucket's stored state: one instant, `full_at`, as whole nanoseconds since the Unix epoch
//! plus a fraction of a nanosecond in units of 2^-63 ns; its range, the key's expiry, and its
//! exact encoding in a rate's ticks (see the crate docs, "Why it is exact").
//!
//! A state is an instant and nothing more: it must not depend on limits, costs or the steps
//! (a caller passes the tick it reads at), and it knows nothing of Redis or a clock.

use std::num::NonZeroU64;

use crate::ticks::{div_rem, NS_PER_MS};

/// The stored fraction of a nanosecond is in units of `2^-FRAC_BITS` ns.
const FRAC_BITS: u32 = 63;
const FRAC_MASK: u128 = (1 << FRAC_BITS) - 1;

/// The latest `full_at_ns` a state may hold: `i64::MAX` ns, in the year 2262. Keeping it in
/// `i64` range lets it travel as a signed integer through replication and RDB.
pub const MAX_FULL_AT_NS: u64 = i64::MAX as u64;
/// The largest `full_at_frac` (units of 2^-63 ns): it travels as a signed 64-bit integer too.
pub const MAX_FULL_AT_FRAC: u64 = FRAC_MASK as u64;

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
    /// The earliest state, 1 ns after the epoch: a bucket full long ago.
    pub(crate) const EARLIEST: State = State {
        full_at_ns: NonZeroU64::MIN,
        full_at_frac: 0,
    };

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
    pub(crate) fn ticks(self, ticks_per_ns: u64) -> u128 {
        let d = u128::from(ticks_per_ns);
        let product = u128::from(self.full_at_frac) * d;
        let rem = (product >> FRAC_BITS) + u128::from((product & FRAC_MASK) >= d);
        u128::from(self.full_at_ns.get()) * d + rem
    }

    /// The state at `ticks` of `1 / ticks_per_ns` ns; `None` past [`MAX_FULL_AT_NS`].
    pub(crate) fn from_ticks(ticks: u128, ticks_per_ns: u64) -> Option<Self> {
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
