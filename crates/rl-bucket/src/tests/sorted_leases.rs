//! The model of a key's leases: the sorted vector `LeaseSet` was before it was indexed, kept
//! verbatim (renamed `SortedLeaseSet`, its steps suffixed `_sorted`) so the indexed set can be
//! checked against it call by call. It answers every question by the obvious means: a vector
//! sorted by `(expires_at_us, id)`, binary searches, scans by id, and `Vec::insert`/`remove`.
//! O(N) a call, and plainly right.

#![allow(dead_code)]

use crate::lease::{expiry_us, Lease, LeaseChange, LeaseId, LeaseOutcome, LeaseReply};
use crate::MAX_LEASE_LIMIT;

/// The leases of one key, sorted by `(expires_at_us, id)`, each id at most once, at most
/// `MAX_LEASE_LIMIT` of them. See the module docs for why a sorted vector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SortedLeaseSet {
    leases: Vec<Lease>,
}

impl SortedLeaseSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// A set of exactly `leases`, as stored: `None` unless they are strictly ascending by
    /// `(expires_at_us, id)`, name each id once, and number at most `MAX_LEASE_LIMIT`.
    /// What a loader calls, trusting nothing.
    pub fn from_sorted(leases: Vec<Lease>) -> Option<Self> {
        if leases.len() as u64 > MAX_LEASE_LIMIT {
            return None;
        }
        if !leases.windows(2).all(|w| matches!(w, [a, b] if a < b)) {
            return None;
        }
        let mut ids: Vec<LeaseId> = leases.iter().map(Lease::id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| matches!(w, [a, b] if a == b)) {
            return None;
        }
        Some(Self { leases })
    }

    /// Every stored lease, expired ones included, in order of expiry.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// How many leases are stored, expired ones included.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// How many entries the allocation holds room for (for memory reports).
    pub fn capacity(&self) -> usize {
        self.leases.capacity()
    }

    /// The latest expiry stored: when the key may expire, since every lease is gone by then.
    pub fn last_expires_at_us(&self) -> Option<u64> {
        self.leases.last().map(Lease::expires_at_us)
    }

    /// The leases that count at `now_us`: those expiring after it.
    pub fn live(&self, now_us: u64) -> &[Lease] {
        let first = self
            .leases
            .partition_point(|lease| lease.expires_at_us() <= now_us);
        self.leases.get(first..).unwrap_or(&[])
    }

    /// The stored lease named `id`, expired or not.
    pub fn find(&self, id: LeaseId) -> Option<&Lease> {
        self.position(id).and_then(|i| self.leases.get(i))
    }

    fn position(&self, id: LeaseId) -> Option<usize> {
        self.leases.iter().position(|lease| lease.id() == id)
    }

    /// Applies `change` (see `LeaseChange`); the same change on the same set always gives
    /// the same set, as `SortedLeaseSet::apply_all` with one pair does. `None`, with the set
    /// untouched, if the expiry is out of range or the set would hold more than
    /// `MAX_LEASE_LIMIT`. Allocates nothing but the set's own growth: it is every write's
    /// path.
    pub fn apply(&mut self, change: &LeaseChange) -> Option<()> {
        let lease = match change.expires_at_us {
            0 => None,
            at => Some(Lease::new(change.id, at)?),
        };
        let dropped = self
            .leases
            .partition_point(|held| held.expires_at_us() <= change.drop_until_us);
        let live = self.leases.get(dropped..).unwrap_or(&[]);
        let found = live.iter().position(|held| held.id() == change.id);
        let after = live.len() - usize::from(found.is_some()) + usize::from(lease.is_some());
        if after as u64 > MAX_LEASE_LIMIT {
            return None;
        }
        if let Some(i) = found {
            self.leases.remove(dropped + i);
        }
        self.leases.drain(..dropped);
        if let Some(lease) = lease {
            self.insert(lease);
        }
        self.shrink();
        Some(())
    }

    /// Keeps the slack under an eighth once leases have gone.
    fn shrink(&mut self) {
        let len = self.leases.len();
        if self.leases.capacity() > len + len / 8 + 4 {
            self.leases.shrink_to(len + len / 8);
        }
    }

    /// Drops every lease that expired by `drop_until_us`, then puts each `(id, expires_at_us)`
    /// in turn (removing the id when `expires_at_us` is 0). `None`, with the set untouched,
    /// if an expiry is out of range or the set would hold more than `MAX_LEASE_LIMIT`.
    pub fn apply_all(&mut self, drop_until_us: u64, puts: &[(LeaseId, u64)]) -> Option<()> {
        let mut puts_checked = Vec::with_capacity(puts.len());
        for &(id, expires_at_us) in puts {
            let lease = match expires_at_us {
                0 => None,
                at => Some(Lease::new(id, at)?),
            };
            puts_checked.push((id, lease));
        }
        // Count the result first, so a refused call leaves the set as it was.
        let dropped = self
            .leases
            .partition_point(|lease| lease.expires_at_us() <= drop_until_us);
        let mut ids: Vec<LeaseId> = self
            .leases
            .get(dropped..)
            .unwrap_or(&[])
            .iter()
            .map(Lease::id)
            .collect();
        for &(id, lease) in &puts_checked {
            ids.retain(|held| *held != id);
            if lease.is_some() {
                ids.push(id);
            }
            if ids.len() as u64 > MAX_LEASE_LIMIT {
                return None;
            }
        }
        self.leases.drain(..dropped);
        for (id, lease) in puts_checked {
            if let Some(i) = self.position(id) {
                self.leases.remove(i);
            }
            if let Some(lease) = lease {
                self.insert(lease);
            }
        }
        self.shrink();
        Some(())
    }

    fn insert(&mut self, lease: Lease) {
        if self.leases.len() == self.leases.capacity() {
            // Grow by an eighth (at least 4): amortized O(1) copies, at most 1/8 slack.
            self.leases.reserve_exact((self.leases.len() / 8).max(4));
        }
        let at = self.leases.partition_point(|held| *held < lease);
        self.leases.insert(at, lease);
    }
}

/// The µs until `limit` leases leave a slot free at `now_us`: 0 if fewer than `limit` count,
/// else until the lease whose expiry brings the count under `limit`.
fn free_after_us(live: &[Lease], limit: u64, now_us: u64) -> u64 {
    let in_use = live.len() as u64;
    if in_use < limit {
        return 0;
    }
    // in_use - limit < in_use = live.len(), so the index is in range.
    usize::try_from(in_use - limit)
        .ok()
        .and_then(|i| live.get(i))
        .map_or(0, |lease| lease.expires_at_us().saturating_sub(now_us))
}

/// The step as it was: see `lease::lease`.
pub fn lease_sorted(
    set: Option<&SortedLeaseSet>,
    limit: u64,
    now_us: u64,
    ttl_ms: u64,
    id: LeaseId,
) -> (LeaseReply, Option<LeaseChange>) {
    let live = set.map_or(&[][..], |set| set.live(now_us));
    let in_use = live.len() as u64;
    if let Some(held) = live.iter().find(|lease| lease.id() == id) {
        let reply = LeaseReply {
            outcome: LeaseOutcome::Held,
            in_use,
            wait_us: held.expires_at_us().saturating_sub(now_us),
        };
        return (reply, None);
    }
    if in_use >= limit {
        let reply = LeaseReply {
            outcome: LeaseOutcome::Denied,
            in_use,
            wait_us: free_after_us(live, limit, now_us),
        };
        return (reply, None);
    }
    let expires_at_us = expiry_us(now_us, ttl_ms);
    let reply = LeaseReply {
        outcome: LeaseOutcome::Taken,
        in_use: in_use + 1,
        wait_us: expires_at_us.saturating_sub(now_us),
    };
    let change = LeaseChange {
        drop_until_us: now_us,
        id,
        expires_at_us,
    };
    (reply, Some(change))
}

/// Releases `id` if it counts at `now_us`: `true` and the change, else `false` and nothing
/// to change (never held, released already, or expired).
pub fn release_sorted(
    set: Option<&SortedLeaseSet>,
    now_us: u64,
    id: LeaseId,
) -> (bool, Option<LeaseChange>) {
    put_if_held(set, now_us, id, 0)
}

/// Extends (or shortens) `id` to expire `ttl_ms` after `now_us` if it counts at `now_us`:
/// `true` and the change, else `false` and nothing to change. An expired lease is not
/// revived: its slot may have been taken since.
pub fn renew_sorted(
    set: Option<&SortedLeaseSet>,
    now_us: u64,
    id: LeaseId,
    ttl_ms: u64,
) -> (bool, Option<LeaseChange>) {
    put_if_held(set, now_us, id, expiry_us(now_us, ttl_ms))
}

fn put_if_held(
    set: Option<&SortedLeaseSet>,
    now_us: u64,
    id: LeaseId,
    expires_at_us: u64,
) -> (bool, Option<LeaseChange>) {
    let held = set.is_some_and(|set| set.live(now_us).iter().any(|lease| lease.id() == id));
    let change = held.then_some(LeaseChange {
        drop_until_us: now_us,
        id,
        expires_at_us,
    });
    (held, change)
}

/// What `limit` allows at `now_us`, writing nothing: the leases that count, and the µs until
/// a slot frees (0 if one is free now).
pub fn leases_in_use_sorted(set: Option<&SortedLeaseSet>, limit: u64, now_us: u64) -> (u64, u64) {
    let live = set.map_or(&[][..], |set| set.live(now_us));
    (live.len() as u64, free_after_us(live, limit, now_us))
}
