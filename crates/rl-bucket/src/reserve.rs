//! Reservations: [`reserve`] takes an estimate now, exactly as [`acquire`] takes that cost,
//! and records it (an id, the estimate, an absolute expiry) with the bucket;
//! [`settle_reservation`] consumes the record and [`settle`]s the estimate against the actual
//! cost. A record settles at most once: the step that settles it removes it, and a second
//! settle of the same id finds nothing. A record never settled stands as taken: at its
//! expiry it is dropped, and the tokens it took stay taken.
//!
//! Never reads a clock and knows nothing of Redis: the caller stores the bucket's state and
//! the records together, and replicates both.

use crate::acquire::acquire;
use crate::charge::ChargeError;
use crate::cost::Cost;
use crate::decision::{Change, Charged, Decision};
use crate::lease::{LeaseId, MAX_EXPIRES_AT_US};
use crate::limit::Limit;
use crate::settle::settle;
use crate::state::State;

/// The most open reservations one bucket holds. Each costs 48 bytes and every write of a
/// reservation rewrites the list (replication carries it whole), so the cap bounds both.
pub const MAX_RESERVATIONS: usize = 1_000;
/// The longest a reservation stays open: 100 years, in ms.
pub const MAX_RESERVATION_TTL_MS: u64 = 3_153_600_000_000;

const US_PER_MS: u64 = 1_000;

/// One open reservation: its id, the tokens it took, and when its record lapses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reservation {
    /// The reservation's id, unique among the bucket's records.
    pub id: LeaseId,
    /// The tokens taken when it was made (above 0).
    pub estimate: Cost,
    /// The record lapses once `now_us >= expires_at_us` (µs since the Unix epoch).
    pub expires_at_us: u64,
}

impl Reservation {
    /// `None` unless the estimate is above 0 and `expires_at_us` is in
    /// `1..=`[`MAX_EXPIRES_AT_US`]: what a loader checks of each stored record.
    pub fn new(id: LeaseId, estimate: Cost, expires_at_us: u64) -> Option<Self> {
        let valid = !estimate.exact().is_zero() && (1..=MAX_EXPIRES_AT_US).contains(&expires_at_us);
        valid.then_some(Self {
            id,
            estimate,
            expires_at_us,
        })
    }

    /// Whether the record is still open at `now_us`.
    pub fn is_open(&self, now_us: u64) -> bool {
        now_us < self.expires_at_us
    }
}

/// A bucket's open records as a step leaves them: one held inline (a reservation on a bucket
/// with none open, the common case, costs no list), else a list (empty when none is open).
#[derive(Clone, Debug, PartialEq)]
pub enum Records {
    /// Exactly this one.
    One(Reservation),
    /// These, possibly none (an empty list allocates nothing).
    Many(Vec<Reservation>),
}

impl Records {
    /// The records, in order.
    pub fn as_slice(&self) -> &[Reservation] {
        match self {
            Records::One(record) => std::slice::from_ref(record),
            Records::Many(records) => records,
        }
    }

    /// The records as a list (allocated for `One`).
    pub fn into_vec(self) -> Vec<Reservation> {
        match self {
            Records::One(record) => vec![record],
            Records::Many(records) => records,
        }
    }

    /// How many records the heap holds room for beyond the value itself: a list's capacity,
    /// none for `One`.
    pub fn heap_capacity(&self) -> usize {
        match self {
            Records::One(_) => 0,
            Records::Many(records) => records.capacity(),
        }
    }
}

impl Default for Records {
    fn default() -> Self {
        Records::Many(Vec::new())
    }
}

impl From<Vec<Reservation>> for Records {
    fn from(records: Vec<Reservation>) -> Self {
        Records::Many(records)
    }
}

impl std::ops::Deref for Records {
    type Target = [Reservation];

    fn deref(&self) -> &[Reservation] {
        self.as_slice()
    }
}

/// Whether `records` is a valid list: at most [`MAX_RESERVATIONS`], each id once.
pub fn valid_records(records: &[Reservation]) -> bool {
    if records.len() > MAX_RESERVATIONS {
        return false;
    }
    let mut ids: Vec<LeaseId> = records.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids.windows(2).all(|pair| pair.first() != pair.get(1))
}

/// Why a reservation was refused. Nothing is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveError {
    /// The bucket already holds [`MAX_RESERVATIONS`] open reservations.
    TooMany,
    /// The estimate is 0: a reservation must take something.
    ZeroEstimate,
}

/// What [`reserve`] decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Reserved {
    /// [`acquire`]'s decision for the estimate; for a repeated id, the bucket as it is now
    /// (allowed, nothing taken).
    pub decision: Decision,
    /// Whether the id named a reservation already open (a retried call): nothing was taken.
    pub repeated: bool,
    /// What to store when the call wrote: the new state and the open records. `None` for a
    /// denial or a repeat, which write nothing.
    pub write: Option<(State, Records)>,
}

/// Reserves `estimate` tokens at `now_us` under `id` for `ttl_ms`: [`acquire`] of the estimate,
/// and on success the record `(id, estimate, now + ttl)` joins the open ones (records lapsed
/// by `now_us` are dropped). An `id` already open answers as allowed and takes nothing.
///
/// ```
/// use rl_bucket::{reserve, Cost, LeaseId, Limit};
///
/// let limit = Limit::new(1.0, 10.0).unwrap();
/// let id = LeaseId::new(b"job-1").unwrap();
/// let got = reserve(&limit, None, &[], 0, Cost::new(4.0).unwrap(), 1_000, id).unwrap();
/// assert_eq!(got.decision.remaining, 6);
/// let (state, records) = got.write.unwrap();
/// // The same id again: nothing more is taken.
/// let again = reserve(&limit, Some(state), &records, 0, Cost::new(4.0).unwrap(), 1_000, id).unwrap();
/// assert!(again.repeated && again.write.is_none() && again.decision.remaining == 6);
/// ```
///
/// # Errors
/// [`ReserveError::ZeroEstimate`] for an estimate of 0; [`ReserveError::TooMany`] when
/// [`MAX_RESERVATIONS`] are open (checked after a repeat, so a retry is still answered).
pub fn reserve(
    limit: &Limit,
    state: Option<State>,
    records: &[Reservation],
    now_us: u64,
    estimate: Cost,
    ttl_ms: u64,
    id: LeaseId,
) -> Result<Reserved, ReserveError> {
    if estimate.exact().is_zero() {
        return Err(ReserveError::ZeroEstimate);
    }
    if records.iter().any(|r| r.id == id && r.is_open(now_us)) {
        let decision = crate::acquire::peek(
            limit,
            state,
            now_us,
            Cost::from_decimal(crate::Decimal::ZERO),
        );
        return Ok(Reserved {
            decision,
            repeated: true,
            write: None,
        });
    }
    let open = records.iter().filter(|r| r.is_open(now_us)).count();
    if open >= MAX_RESERVATIONS {
        return Err(ReserveError::TooMany);
    }
    let (decision, new_state) = acquire(limit, state, now_us, estimate);
    let write = match new_state {
        Some(new_state) if decision.allowed() => {
            let expires_at_us = now_us
                .saturating_add(ttl_ms.saturating_mul(US_PER_MS))
                .min(MAX_EXPIRES_AT_US);
            let record = Reservation {
                id,
                estimate,
                expires_at_us,
            };
            if open == 0 {
                return Ok(Reserved {
                    decision,
                    repeated: false,
                    write: Some((new_state, Records::One(record))),
                });
            }
            let mut kept: Vec<Reservation> = Vec::with_capacity(open + 1);
            kept.extend(records.iter().filter(|r| r.is_open(now_us)).copied());
            kept.push(record);
            Some((new_state, Records::Many(kept)))
        }
        _ => None,
    };
    Ok(Reserved {
        decision,
        repeated: false,
        write,
    })
}

/// Why a settle was refused. Nothing is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleError {
    /// No open reservation has this id: settled already, lapsed, or never made.
    NotOpen,
    /// Charging the under-estimate would pass [`charge`](crate::charge)'s bound.
    DebtTooLong,
}

/// Settles the open reservation `id` with the `actual` cost at `now_us` ([`settle`] of its
/// estimate) and consumes its record. Returns the report, the bucket's change, and the
/// records still open (lapsed ones dropped).
///
/// # Errors
/// [`SettleError::NotOpen`] if no open record has `id`; [`SettleError::DebtTooLong`] as
/// [`settle`]. Either way nothing is to be written.
pub fn settle_reservation(
    limit: &Limit,
    state: Option<State>,
    records: &[Reservation],
    now_us: u64,
    id: LeaseId,
    actual: Cost,
) -> Result<(Charged, Change, Records), SettleError> {
    let record = records
        .iter()
        .find(|r| r.id == id && r.is_open(now_us))
        .ok_or(SettleError::NotOpen)?;
    let (charged, change) = settle(limit, state, now_us, record.estimate, actual)
        .map_err(|ChargeError::DebtTooLong| SettleError::DebtTooLong)?;
    let kept: Vec<Reservation> = records
        .iter()
        .filter(|r| r.id != id && r.is_open(now_us))
        .copied()
        .collect();
    Ok((charged, change, Records::Many(kept)))
}
