//! Leases: a limit on work in flight. A key holds at most `limit` leases, each an id and an
//! absolute expiry; a lease counts until it is released or expires, whichever comes first.
//! Pure: time comes in as `now_us`, ids come in chosen, and nothing here knows Redis.
//!
//! # Representation: an arena and two indexes
//!
//! A [`LeaseSet`] holds its 24-byte [`Lease`]s in one vector, the arena, grown by a sixteenth
//! (not doubled) so little of it is slack. Every call is O(log N) amortized, N the leases
//! held (at most [`MAX_LEASE_LIMIT`]), through two indexes of the arena's `u16` slots
//! (`lease_index.rs`):
//!
//! - by id, an open-addressing table under a keyed hash, at most 7/8 full: finding the
//!   lease a call names, O(1) expected, whatever ids callers choose;
//! - by `(expires_at_us, id)`, a B+tree whose inner nodes keep each child's lease count: how
//!   many leases expired by an instant (so how many count, even on a call that drops
//!   nothing), the lease of a rank (the wait of a denial: the one at `in_use - limit` of the
//!   live ones), the latest expiry (the key's), and the stored order. Inserts and removals
//!   are O(log N); dropping the expired takes the earliest one at a time, each lease once.
//!
//! A removal moves the arena's last lease into the gap and renames it in both indexes, so
//! the arena has no holes. Where a lease sits in the arena, and the hash's order, reach no
//! output: replies, the stored form (RDB, `DUMP`, AOF) and the digest follow the tree's
//! `(expires_at_us, id)` order, as the sorted vector this replaced did (kept in the tests as
//! the model every call is checked against).
//!
//! Up to 16 leases, the usual case (limits of 10 to 100 in flight, few held at once), no
//! index is kept: the arena stays sorted and a call scans it, which costs less than the
//! indexes' allocations and hashing. Past 16 both are built (O(16)); at 8 they go again.
//!
//! Memory: a held lease costs its 24 bytes, its table entry (2 bytes at a load of 7/8 to
//! about 3/4) and its tree slot (2 bytes in leaves kept nearly full: a full leaf spills into
//! a neighbour before it splits, and the last one splits where the new lease goes, since
//! leases of one ttl arrive in expiry order), plus the slack of each: 29.7 to 29.9 B a lease as
//! `make bench` measures it (`MEMORY USAGE` from 1 to 1,000 leases in a key), against 26.8 B
//! for the sorted vector and a budget of 32. Releases spread over the whole set leave more
//! slack until each structure shrinks (O(N), after Θ(N) changes): 31.8 B a lease once half
//! of 1,000 or 10,000 were released at random, 33 to 35 B once 7/8 were. A release and take
//! at 10,000 leases cost 1.5 to 1.6 µs of server time, against 17 to 22 µs when the vector
//! was scanned and moved.
//!
//! An id is 1 to [`MAX_LEASE_ID_BYTES`] bytes (a UUID fits as its 16 raw bytes), stored
//! inline. Its length shares a word with the expiry (`expires_at_us << 5 | len`), which keeps
//! the order by expiry first and bounds an expiry to [`MAX_EXPIRES_AT_US`] (the year 11100).
//!
//! # Changes are effects
//!
//! The steps ([`lease`], [`release`], [`renew`]) read the set and say what to answer and what
//! to change, as a [`LeaseChange`]: drop every lease that expired by `drop_until_us`, then put
//! one id at an absolute expiry (or remove it). Applying the same change to the same set gives
//! the same set whatever the clock says, so a change is what a replica or an AOF replays. A
//! call that changes nothing returns no change: denials, a take answered as already held, and
//! a release or renewal of an id not held write nothing (expired leases, counting for
//! nothing, wait for the next change or the key's expiry).

use crate::lease_index::{IdIndex, OrderIndex, Slot};

/// The largest `limit` a call may give. Bounds the size of one key's value (10,000 leases are
/// about 300 KB) and keeps a slot within a `u16` (see the module docs).
pub const MAX_LEASE_LIMIT: u64 = 10_000;
/// The longest id, in bytes.
pub const MAX_LEASE_ID_BYTES: usize = 16;
/// The longest `ttl_ms`: 100 years, the bucket's longest refill.
pub const MAX_LEASE_TTL_MS: u64 = 3_153_600_000_000;
/// The latest expiry a lease may hold, in µs since the Unix epoch (2^58 - 1, in the year
/// 11100): the expiry shares a word with the id's length.
pub const MAX_EXPIRES_AT_US: u64 = (1 << 58) - 1;

const LEN_BITS: u32 = 5;
const LEN_MASK: u64 = (1 << LEN_BITS) - 1;
const US_PER_MS: u64 = 1_000;

/// A lease's id: 1 to [`MAX_LEASE_ID_BYTES`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId {
    bytes: [u8; MAX_LEASE_ID_BYTES],
    len: u8,
}

impl LeaseId {
    /// The id `bytes`; `None` unless they are 1 to [`MAX_LEASE_ID_BYTES`] bytes long.
    pub fn new(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() || bytes.len() > MAX_LEASE_ID_BYTES {
            return None;
        }
        let mut inline = [0u8; MAX_LEASE_ID_BYTES];
        inline.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Self {
            bytes: inline,
            len: u8::try_from(bytes.len()).ok()?,
        })
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

/// One held lease: an id and the instant it stops counting. 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lease {
    /// `expires_at_us << 5 | id length`: ordering leases orders them by expiry first.
    packed: u64,
    bytes: [u8; MAX_LEASE_ID_BYTES],
}

impl Lease {
    /// `id` until `expires_at_us`; `None` unless `expires_at_us` is in
    /// `1..=`[`MAX_EXPIRES_AT_US`].
    pub fn new(id: LeaseId, expires_at_us: u64) -> Option<Self> {
        if !(1..=MAX_EXPIRES_AT_US).contains(&expires_at_us) {
            return None;
        }
        Some(Self {
            packed: (expires_at_us << LEN_BITS) | u64::from(id.len),
            bytes: id.bytes,
        })
    }

    /// When the lease stops counting, in µs since the Unix epoch: it counts while
    /// `now_us < expires_at_us`.
    pub fn expires_at_us(&self) -> u64 {
        self.packed >> LEN_BITS
    }

    /// The id's bytes.
    pub(crate) fn id_bytes(&self) -> &[u8] {
        self.bytes
            .get(..(self.packed & LEN_MASK) as usize)
            .unwrap_or(&[])
    }

    /// Whether the lease is named `id`, without making a [`LeaseId`].
    pub(crate) fn has_id(&self, id: &LeaseId) -> bool {
        self.packed & LEN_MASK == u64::from(id.len) && self.bytes == id.bytes
    }

    /// The lease's id.
    pub fn id(&self) -> LeaseId {
        LeaseId {
            bytes: self.bytes,
            // At most 16 (checked when made), so it fits.
            len: (self.packed & LEN_MASK) as u8,
        }
    }
}

/// What a change does: drop every lease that expired by `drop_until_us`, then hold `id`
/// until `expires_at_us`, or release it when that is 0. Reads no clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseChange {
    /// Leases with `expires_at_us <= drop_until_us` are dropped (the call's `now_us`).
    pub drop_until_us: u64,
    /// The lease put or removed.
    pub id: LeaseId,
    /// Its new expiry in µs since the Unix epoch, or 0 to remove it.
    pub expires_at_us: u64,
}

/// Up to this many leases a set keeps no index: its arena is sorted, and a scan of at most
/// 16 leases costs less than the indexes' allocations and hashing. Past it the indexes are
/// built; they go again at half of it, so a set at the boundary does not flip every call.
const SMALL: usize = 16;

/// The leases of one key, each id at most once, at most [`MAX_LEASE_LIMIT`] of them: up to
/// 16 in a sorted arena, more in an arena indexed by id and by `(expires_at_us, id)`. See the
/// module docs.
#[derive(Clone, Default)]
pub struct LeaseSet {
    /// The leases: sorted by `(expires_at_us, id)` while no index is kept, else in no order
    /// (a removal moves the last one into its slot).
    leases: Vec<Lease>,
    /// The indexes, boxed: `None` while the set is small, so that a small key's value is two
    /// words and a vector, not every index's header.
    index: Option<Box<Indexes>>,
}

/// A large set's two indexes over its arena.
#[derive(Clone, Default)]
struct Indexes {
    ids: IdIndex,
    order: OrderIndex,
}

impl PartialEq for LeaseSet {
    /// Equal when they hold the same leases: where each sits in the arena is no part of it.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for LeaseSet {}

impl std::fmt::Debug for LeaseSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl LeaseSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// A set of exactly `leases`, as stored: `None` unless they are strictly ascending by
    /// `(expires_at_us, id)`, name each id once, and number at most [`MAX_LEASE_LIMIT`].
    /// What a loader calls, trusting nothing. O(N).
    pub fn from_sorted(leases: Vec<Lease>) -> Option<Self> {
        if leases.len() as u64 > MAX_LEASE_LIMIT {
            return None;
        }
        if !leases.windows(2).all(|w| matches!(w, [a, b] if a < b)) {
            return None;
        }
        let mut set = Self {
            leases,
            index: None,
        };
        if set.len() > SMALL {
            set.index()?;
        } else if set
            .leases
            .iter()
            .enumerate()
            .any(|(i, a)| set.leases.iter().skip(i + 1).any(|b| a.id() == b.id()))
        {
            return None;
        }
        Some(set)
    }

    /// Whether the indexes are kept (more than [`SMALL`] leases were held since it was last
    /// small).
    fn indexed(&self) -> bool {
        self.index.is_some()
    }

    /// Builds both indexes over the sorted arena: O(N), once past [`SMALL`]. `None` if an id
    /// is there twice.
    fn index(&mut self) -> Option<()> {
        // Slots in order: the arena is sorted.
        let slots = (0..self.leases.len())
            .map(Slot::try_from)
            .collect::<Result<Vec<Slot>, _>>()
            .ok()?;
        self.index = Some(Box::new(Indexes {
            ids: IdIndex::of(&self.leases)?,
            order: OrderIndex::build(&slots)?,
        }));
        Some(())
    }

    /// Drops both indexes, sorting the arena: O(N), at half of [`SMALL`].
    fn unindex(&mut self) {
        let sorted: Vec<Lease> = self.iter().copied().collect();
        self.leases = sorted;
        self.index = None;
    }

    /// Every stored lease, expired ones included, in order of `(expires_at_us, id)`: the
    /// stored order. O(1) a lease.
    pub fn iter(&self) -> Leases<'_> {
        Leases {
            set: self,
            rank: 0,
            leaf: &[],
        }
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// How many leases are stored, expired ones included.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// How many leases the arena holds room for.
    pub fn capacity(&self) -> usize {
        self.leases.capacity()
    }

    /// The bytes the set allocated, its header aside: the arena's and both indexes'. What a
    /// memory report adds per key.
    pub fn allocated_bytes(&self) -> usize {
        self.leases.capacity() * size_of::<Lease>()
            + self.index.as_ref().map_or(0, |index| {
                size_of::<Indexes>() + index.ids.allocated_bytes() + index.order.allocated_bytes()
            })
    }

    /// The latest expiry stored: when the key may expire, since every lease is gone by then.
    /// O(log N).
    pub fn last_expires_at_us(&self) -> Option<u64> {
        let last = match &self.index {
            Some(index) => self.slot_lease(index.order.last()?),
            None => self.leases.last(),
        };
        last.map(Lease::expires_at_us)
    }

    /// The leases that count at `now_us` (those expiring after it), as a view: O(log N).
    pub fn live(&self, now_us: u64) -> Live<'_> {
        let expired = match &self.index {
            Some(index) => index
                .order
                .count_until(&self.leases, now_us)
                .unwrap_or(self.len()),
            None => self
                .leases
                .partition_point(|lease| lease.expires_at_us() <= now_us),
        };
        Live {
            set: self,
            now_us,
            expired,
        }
    }

    /// The lease of rank `rank` in stored order (0 the earliest). O(log N).
    pub fn get(&self, rank: usize) -> Option<&Lease> {
        match &self.index {
            Some(index) => self.slot_lease(index.order.select(rank)?),
            None => self.leases.get(rank),
        }
    }

    /// The stored lease named `id`, expired or not. O(1) expected.
    pub fn find(&self, id: LeaseId) -> Option<&Lease> {
        self.slot_lease(self.slot_of(id)?)
    }

    /// Where the lease named `id` is in the arena.
    fn slot_of(&self, id: LeaseId) -> Option<Slot> {
        if let Some(index) = &self.index {
            return index.ids.find(&self.leases, &id);
        }
        let at = self.leases.iter().position(|held| held.has_id(&id))?;
        Slot::try_from(at).ok()
    }

    fn slot_lease(&self, slot: Slot) -> Option<&Lease> {
        self.leases.get(usize::from(slot))
    }

    /// Whether `id` is stored and expires after `until_us`.
    fn holds_after(&self, id: LeaseId, until_us: u64) -> bool {
        self.find(id)
            .is_some_and(|held| held.expires_at_us() > until_us)
    }

    /// Applies `change` (see [`LeaseChange`]); the same change on the same set always gives
    /// the same set, as [`LeaseSet::apply_all`] with one pair does. `None`, with the set
    /// untouched, if the expiry is out of range or the set would hold more than
    /// [`MAX_LEASE_LIMIT`]. O(log N) amortized, each dropped lease O(log N) once. Allocates
    /// nothing but the set's own growth: it is every write's path.
    pub fn apply(&mut self, change: &LeaseChange) -> Option<()> {
        let lease = match change.expires_at_us {
            0 => None,
            at => Some(Lease::new(change.id, at)?),
        };
        let live = self.live(change.drop_until_us).len();
        let found = self.holds_after(change.id, change.drop_until_us);
        let after = live - usize::from(found) + usize::from(lease.is_some());
        if after as u64 > MAX_LEASE_LIMIT {
            return None;
        }
        self.drop_until(change.drop_until_us)?;
        self.put(change.id, lease)?;
        self.fit()
    }

    /// Drops every lease that expired by `drop_until_us`, then puts each `(id, expires_at_us)`
    /// in turn (removing the id when `expires_at_us` is 0). `None`, with the set untouched,
    /// if an expiry is out of range or the set would hold more than [`MAX_LEASE_LIMIT`].
    pub fn apply_all(&mut self, drop_until_us: u64, puts: &[(LeaseId, u64)]) -> Option<()> {
        let mut puts_checked = Vec::with_capacity(puts.len());
        for &(id, expires_at_us) in puts {
            let lease = match expires_at_us {
                0 => None,
                at => Some(Lease::new(id, at)?),
            };
            puts_checked.push((id, lease));
        }
        // Count the result first, so a refused call leaves the set as it was: whether each id
        // is held after the puts before it.
        let mut count = self.live(drop_until_us).len();
        let mut held_after: std::collections::HashMap<LeaseId, bool> =
            std::collections::HashMap::with_capacity(puts.len());
        for &(id, lease) in &puts_checked {
            let held = match held_after.get(&id) {
                Some(&held) => held,
                None => self.holds_after(id, drop_until_us),
            };
            count = count - usize::from(held) + usize::from(lease.is_some());
            if count as u64 > MAX_LEASE_LIMIT {
                return None;
            }
            held_after.insert(id, lease.is_some());
        }
        self.drop_until(drop_until_us)?;
        for (id, lease) in puts_checked {
            self.put(id, lease)?;
        }
        self.fit()
    }

    /// Removes `id` if stored, then stores `lease` if given.
    fn put(&mut self, id: LeaseId, lease: Option<Lease>) -> Option<()> {
        if let Some(slot) = self.slot_of(id) {
            self.remove(slot)?;
        }
        match lease {
            Some(lease) => self.insert(lease),
            None => Some(()),
        }
    }

    /// Drops the earliest leases while they expire by `until_us`: O(log N) each.
    fn drop_until(&mut self, until_us: u64) -> Option<()> {
        if !self.indexed() {
            let dropped = self
                .leases
                .partition_point(|lease| lease.expires_at_us() <= until_us);
            self.leases.drain(..dropped);
            return Some(());
        }
        while let Some(slot) = self.index.as_ref().and_then(|index| index.order.first()) {
            if self.slot_lease(slot)?.expires_at_us() > until_us {
                break;
            }
            self.remove(slot)?;
        }
        Some(())
    }

    fn insert(&mut self, lease: Lease) -> Option<()> {
        if !self.indexed() && self.leases.len() >= SMALL {
            self.index()?;
        }
        let slot = Slot::try_from(self.leases.len()).ok()?;
        if self.leases.len() == self.leases.capacity() {
            // Grow by a sixteenth (at least 2): amortized O(1) copies, little slack.
            self.leases.reserve_exact((self.leases.len() / 16).max(2));
        }
        let Some(index) = &mut self.index else {
            let at = self.leases.partition_point(|held| *held < lease);
            self.leases.insert(at, lease);
            return Some(());
        };
        self.leases.push(lease);
        index.ids.insert(&self.leases, slot)?;
        index.order.insert(&self.leases, slot)
    }

    /// Removes the lease at `slot`, moving the last lease into it and renaming that one in
    /// both indexes.
    fn remove(&mut self, slot: Slot) -> Option<()> {
        let last = Slot::try_from(self.leases.len().checked_sub(1)?).ok()?;
        if slot > last {
            return None;
        }
        let Some(index) = &mut self.index else {
            self.leases.remove(usize::from(slot));
            return Some(());
        };
        index.order.remove(&self.leases, slot)?;
        index.ids.remove(&self.leases, slot)?;
        if slot != last {
            index.order.repoint(&self.leases, last, slot)?;
            index.ids.repoint(&self.leases, last, slot)?;
        }
        self.leases.swap_remove(usize::from(slot));
        Some(())
    }

    /// Keeps the slack small once leases have gone: the arena under an eighth (plus 4), the
    /// id table under half again what it needs, the tree rebuilt once a fifth of it merged
    /// away. Each shrink is O(N) after Θ(N) removals.
    fn fit(&mut self) -> Option<()> {
        let len = self.leases.len();
        if self.indexed() && len <= SMALL / 2 {
            self.unindex();
        }
        if self.leases.capacity() > len + len / 8 + 4 {
            self.leases.shrink_to(len + len / 16);
        }
        let Some(index) = &mut self.index else {
            return Some(());
        };
        index.ids.fit(&self.leases)?;
        index.order.fit()
    }
}

#[cfg(test)]
impl LeaseSet {
    /// Panics unless both indexes are well formed over the arena.
    pub(crate) fn check(&self) {
        match &self.index {
            Some(index) => {
                assert!(self.len() > SMALL / 2, "indexed at {}", self.len());
                index.ids.check(&self.leases);
                index.order.check(&self.leases);
            }
            None => {
                assert!(self.len() <= SMALL, "not indexed at {}", self.len());
                assert!(self.leases.windows(2).all(|w| w[0] < w[1]), "unsorted");
            }
        }
    }

    /// Leaves in use, and the leases in them.
    pub(crate) fn leaf_fill(&self) -> (usize, usize) {
        self.index
            .as_ref()
            .map_or((0, 0), |index| index.order.leaf_fill())
    }
}

/// The stored leases in `(expires_at_us, id)` order: [`LeaseSet::iter`].
#[derive(Clone, Debug)]
pub struct Leases<'a> {
    set: &'a LeaseSet,
    /// The rank of the next lease.
    rank: usize,
    /// The rest of the current leaf's slots.
    leaf: &'a [Slot],
}

impl<'a> Iterator for Leases<'a> {
    type Item = &'a Lease;

    fn next(&mut self) -> Option<&'a Lease> {
        let Some(index) = &self.set.index else {
            let lease = self.set.leases.get(self.rank)?;
            self.rank += 1;
            return Some(lease);
        };
        if self.leaf.is_empty() {
            let (slots, at) = index.order.select_leaf(self.rank)?;
            self.leaf = slots.get(at..)?;
        }
        let (&slot, rest) = self.leaf.split_first()?;
        self.leaf = rest;
        self.rank += 1;
        self.set.slot_lease(slot)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.set.len().saturating_sub(self.rank);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Leases<'_> {}

/// The leases of a set that count at an instant: [`LeaseSet::live`].
#[derive(Clone, Copy, Debug)]
pub struct Live<'a> {
    set: &'a LeaseSet,
    now_us: u64,
    /// How many stored leases expired by `now_us`: the live ones follow them.
    expired: usize,
}

impl<'a> Live<'a> {
    /// How many count.
    pub fn len(&self) -> usize {
        self.set.len().saturating_sub(self.expired)
    }

    /// Whether none counts.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live lease of rank `rank` in order of expiry (0 the earliest). O(log N).
    pub fn get(&self, rank: usize) -> Option<&'a Lease> {
        self.set.get(self.expired.checked_add(rank)?)
    }

    /// The live lease named `id`. O(1) expected.
    pub fn find(&self, id: LeaseId) -> Option<&'a Lease> {
        self.set
            .find(id)
            .filter(|held| held.expires_at_us() > self.now_us)
    }
}

/// What [`lease`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// A new lease was taken.
    Taken,
    /// The id was already held: answered as held with its current expiry, changing nothing
    /// (a retried take is idempotent; [`renew`] extends a lease).
    Held,
    /// `limit` leases are held; none was taken.
    Denied,
}

/// The reply of [`lease`], in µs; the millisecond views round up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseReply {
    /// Taken, held or denied.
    pub outcome: LeaseOutcome,
    /// Leases counting after the call, this one included.
    pub in_use: u64,
    /// Taken or held: µs until this lease expires. Denied: µs until a slot frees, when the
    /// earliest lease that must go for one to free expires.
    pub wait_us: u64,
}

impl LeaseReply {
    /// Whether the caller holds the lease now.
    pub fn held(&self) -> bool {
        self.outcome != LeaseOutcome::Denied
    }

    /// [`LeaseReply::wait_us`] in ms, rounded up, so that a denied caller waiting that long
    /// finds a slot free.
    pub fn wait_ms(&self) -> u64 {
        self.wait_us.div_ceil(US_PER_MS)
    }
}

/// The expiry of a lease taken or renewed at `now_us` for `ttl_ms`, capped at
/// [`MAX_EXPIRES_AT_US`].
pub fn expiry_us(now_us: u64, ttl_ms: u64) -> u64 {
    now_us
        .saturating_add(ttl_ms.saturating_mul(US_PER_MS))
        .min(MAX_EXPIRES_AT_US)
}

/// The µs until `limit` leases leave a slot free at `now_us`: 0 if fewer than `limit` count,
/// else until the lease whose expiry brings the count under `limit`. O(log N).
fn free_after_us(live: Option<Live<'_>>, limit: u64, now_us: u64) -> u64 {
    let Some(live) = live else {
        return 0;
    };
    let in_use = live.len() as u64;
    if in_use < limit {
        return 0;
    }
    // in_use - limit < in_use = live.len(), so the rank is in range.
    usize::try_from(in_use - limit)
        .ok()
        .and_then(|rank| live.get(rank))
        .map_or(0, |lease| lease.expires_at_us().saturating_sub(now_us))
}

/// Takes a lease named `id` for `ttl_ms` at `now_us` if fewer than `limit` leases count.
/// `id` already held is answered [`LeaseOutcome::Held`] with its current expiry and changes
/// nothing; a caller making ids draws one no stored lease has (see [`LeaseSet::find`]). A
/// missing key is `None`, an empty set. Never reads a clock.
///
/// ```
/// use rl_bucket::{lease, LeaseId, LeaseOutcome, LeaseSet};
///
/// let mut set = LeaseSet::new();
/// let a = LeaseId::new(b"a").unwrap();
/// let (reply, change) = lease(Some(&set), 1, 1_000, 50, a);
/// assert_eq!((reply.outcome, reply.in_use, reply.wait_ms()), (LeaseOutcome::Taken, 1, 50));
/// set.apply(&change.unwrap()).unwrap();
/// // Full: the next waits for a's expiry, 50 ms later.
/// let (reply, change) = lease(Some(&set), 1, 1_000, 50, LeaseId::new(b"b").unwrap());
/// assert_eq!((reply.outcome, reply.wait_ms(), change), (LeaseOutcome::Denied, 50, None));
/// ```
pub fn lease(
    set: Option<&LeaseSet>,
    limit: u64,
    now_us: u64,
    ttl_ms: u64,
    id: LeaseId,
) -> (LeaseReply, Option<LeaseChange>) {
    let live = set.map(|set| set.live(now_us));
    let in_use = live.map_or(0, |live| live.len() as u64);
    if let Some(held) = live.and_then(|live| live.find(id)) {
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
pub fn release(set: Option<&LeaseSet>, now_us: u64, id: LeaseId) -> (bool, Option<LeaseChange>) {
    put_if_held(set, now_us, id, 0)
}

/// Extends (or shortens) `id` to expire `ttl_ms` after `now_us` if it counts at `now_us`:
/// `true` and the change, else `false` and nothing to change. An expired lease is not
/// revived: its slot may have been taken since.
pub fn renew(
    set: Option<&LeaseSet>,
    now_us: u64,
    id: LeaseId,
    ttl_ms: u64,
) -> (bool, Option<LeaseChange>) {
    put_if_held(set, now_us, id, expiry_us(now_us, ttl_ms))
}

fn put_if_held(
    set: Option<&LeaseSet>,
    now_us: u64,
    id: LeaseId,
    expires_at_us: u64,
) -> (bool, Option<LeaseChange>) {
    let held = set.is_some_and(|set| set.live(now_us).find(id).is_some());
    let change = held.then_some(LeaseChange {
        drop_until_us: now_us,
        id,
        expires_at_us,
    });
    (held, change)
}

/// What `limit` allows at `now_us`, writing nothing: the leases that count, and the µs until
/// a slot frees (0 if one is free now).
pub fn leases_in_use(set: Option<&LeaseSet>, limit: u64, now_us: u64) -> (u64, u64) {
    let live = set.map(|set| set.live(now_us));
    let in_use = live.map_or(0, |live| live.len() as u64);
    (in_use, free_after_us(live, limit, now_us))
}
