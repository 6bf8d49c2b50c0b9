//! The two indexes a [`LeaseSet`](crate::LeaseSet) keeps over its arena, a `Vec<Lease>` in
//! no order where each lease is named by its slot (a `u16`: at most
//! [`MAX_LEASE_LIMIT`](crate::MAX_LEASE_LIMIT) leases, under 65,535):
//!
//! - [`IdIndex`], by id: open addressing with linear probing over slots, a keyed hash, a load
//!   of at most 7/8, a capacity grown by an eighth (not doubled) and mapped with
//!   multiply-shift, and backward-shift deletion (Knuth's Algorithm R), so no tombstones.
//! - [`OrderIndex`], by `(expires_at_us, id)`: a B+tree of slots whose inner nodes keep each
//!   child's lease count (rank and select in O(log N)) and first slot (the separator, read
//!   from the arena). Leaves hold up to 64 slots; the last leaf splits where the new lease
//!   goes (leases taken with one ttl arrive in expiry order, so the leaves behind stay full),
//!   other leaves halve.
//!
//! Neither owns a lease or reads a clock; each is handed the arena it indexes. The hash order
//! never reaches an output: replies, stored bytes and digests follow [`OrderIndex`].

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use crate::lease::{Lease, LeaseId};

/// A lease's place in the arena.
pub(crate) type Slot = u16;

fn lease_at(arena: &[Lease], slot: Slot) -> Option<&Lease> {
    arena.get(usize::from(slot))
}

/// The id's hash under a key drawn once per process (std's SipHash keys), so ids a caller
/// chooses cannot be made to share a probe sequence.
fn hash_id(id_bytes: &[u8]) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    let mut hasher = KEYS.get_or_init(RandomState::new).build_hasher();
    hasher.write(id_bytes);
    hasher.finish()
}

const EMPTY: u16 = 0;

/// Slots by id: `slot + 1` per entry, 0 when empty.
#[derive(Clone, Debug, Default)]
pub(crate) struct IdIndex {
    table: Vec<u16>,
}

/// The least table holding `held` entries at a load of at most 7/8.
fn least_table(held: usize) -> usize {
    (held * 8).div_ceil(7)
}

/// The table made for `held` entries: an eighth above the least, so growth is amortized.
fn grown_table(held: usize) -> usize {
    let least = least_table(held);
    least + least / 8 + 1
}

impl IdIndex {
    /// Bytes allocated.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.table.capacity() * size_of::<u16>()
    }

    /// Where a hash's probe starts: its top 32 bits scaled onto the table (multiply-shift),
    /// which needs no power-of-two size and no division.
    fn home(&self, hash: u64) -> usize {
        let len = self.table.len() as u64;
        usize::try_from(((hash >> 32) * len) >> 32).unwrap_or(0)
    }

    fn next(&self, at: usize) -> usize {
        let next = at + 1;
        if next >= self.table.len() {
            0
        } else {
            next
        }
    }

    /// The slot holding `id`.
    pub(crate) fn find(&self, arena: &[Lease], id: &LeaseId) -> Option<Slot> {
        if self.table.is_empty() {
            return None;
        }
        let mut at = self.home(hash_id(id.as_bytes()));
        // A load under 1 leaves an empty entry; the bound only makes the loop finite.
        for _ in 0..self.table.len() {
            let slot = self.table.get(at)?.checked_sub(1)?;
            if lease_at(arena, slot)?.has_id(id) {
                return Some(slot);
            }
            at = self.next(at);
        }
        None
    }

    /// Where the entry for `slot` is, probing from `hash`'s home.
    fn position_of(&self, hash: u64, slot: Slot) -> Option<usize> {
        let want = slot.checked_add(1)?;
        let mut at = self.home(hash);
        for _ in 0..self.table.len() {
            match *self.table.get(at)? {
                EMPTY => return None,
                entry if entry == want => return Some(at),
                _ => at = self.next(at),
            }
        }
        None
    }

    fn place(&mut self, hash: u64, slot: Slot) -> Option<()> {
        let entry = slot.checked_add(1)?;
        let mut at = self.home(hash);
        for _ in 0..self.table.len() {
            let held = self.table.get_mut(at)?;
            if *held == EMPTY {
                *held = entry;
                return Some(());
            }
            at = self.next(at);
        }
        None
    }

    /// A table of `len` entries holding every lease of `arena`; `None` if an id is there
    /// twice.
    fn rebuild(&mut self, arena: &[Lease], len: usize) -> Option<()> {
        self.table = Vec::new();
        if arena.is_empty() {
            return Some(());
        }
        self.table = vec![EMPTY; len];
        for (slot, lease) in arena.iter().enumerate() {
            let slot = Slot::try_from(slot).ok()?;
            if self.find(arena, &lease.id()).is_some() {
                return None;
            }
            self.place(hash_id(lease.id_bytes()), slot)?;
        }
        Some(())
    }

    /// An index of `arena`; `None` if an id is there twice.
    pub(crate) fn of(arena: &[Lease]) -> Option<Self> {
        let mut index = Self::default();
        index.rebuild(arena, grown_table(arena.len()))?;
        Some(index)
    }

    /// Adds `slot`, whose lease is the last of `arena` and whose id is not held.
    pub(crate) fn insert(&mut self, arena: &[Lease], slot: Slot) -> Option<()> {
        if least_table(arena.len()) > self.table.len() {
            return self.rebuild(arena, grown_table(arena.len()));
        }
        self.place(hash_id(lease_at(arena, slot)?.id_bytes()), slot)
    }

    /// Removes `slot`, whose lease is still in `arena`, shifting back the entries after it
    /// that may move (Algorithm R: those whose home is not cyclically in `(gap, at]`).
    pub(crate) fn remove(&mut self, arena: &[Lease], slot: Slot) -> Option<()> {
        let mut gap = self.position_of(hash_id(lease_at(arena, slot)?.id_bytes()), slot)?;
        let mut at = gap;
        for _ in 0..self.table.len() {
            at = self.next(at);
            let entry = *self.table.get(at)?;
            let Some(moved) = entry.checked_sub(1) else {
                break;
            };
            let home = self.home(hash_id(lease_at(arena, moved)?.id_bytes()));
            let stays = if gap < at {
                gap < home && home <= at
            } else {
                gap < home || home <= at
            };
            if !stays {
                *self.table.get_mut(gap)? = entry;
                gap = at;
            }
        }
        *self.table.get_mut(gap)? = EMPTY;
        Some(())
    }

    /// Points the entry of `from`'s lease (still at `from` in `arena`) at `to`.
    pub(crate) fn repoint(&mut self, arena: &[Lease], from: Slot, to: Slot) -> Option<()> {
        let at = self.position_of(hash_id(lease_at(arena, from)?.id_bytes()), from)?;
        *self.table.get_mut(at)? = to.checked_add(1)?;
        Some(())
    }

    /// Shrinks the table once `arena` holds under four fifths of what it was made for (a
    /// fifth of its entries removed since): O(N), after Θ(N) removals.
    pub(crate) fn fit(&mut self, arena: &[Lease]) -> Option<()> {
        let made_for = grown_table(arena.len());
        if self.table.len() > made_for + made_for / 4 + 4 {
            return self.rebuild(arena, made_for);
        }
        Some(())
    }
}

/// Slots per leaf: 128 bytes of slots.
const LEAF_CAP: usize = 64;
/// Children per inner node.
const INNER_CAP: usize = 16;

#[derive(Clone, Copy, Debug)]
struct Leaf {
    len: u16,
    slots: [Slot; LEAF_CAP],
}

#[derive(Clone, Copy, Debug)]
struct Inner {
    len: u16,
    /// Node indexes: leaves one level up from the leaves, else inner nodes.
    children: [u16; INNER_CAP],
    /// Leases under each child.
    counts: [u16; INNER_CAP],
    /// Each child's first lease, the separator searches compare with.
    mins: [Slot; INNER_CAP],
}

impl Inner {
    const EMPTY: Self = Self {
        len: 0,
        children: [0; INNER_CAP],
        counts: [0; INNER_CAP],
        mins: [0; INNER_CAP],
    };

    fn entries(&self) -> impl Iterator<Item = (u16, u16, Slot)> + '_ {
        self.children
            .iter()
            .zip(&self.counts)
            .zip(&self.mins)
            .take(usize::from(self.len))
            .map(|((&child, &count), &min)| (child, count, min))
    }

    fn set_entries(&mut self, entries: &[(u16, u16, Slot)]) -> Option<()> {
        self.len = u16::try_from(entries.len()).ok()?;
        for (i, &(child, count, min)) in entries.iter().enumerate() {
            *self.children.get_mut(i)? = child;
            *self.counts.get_mut(i)? = count;
            *self.mins.get_mut(i)? = min;
        }
        Some(())
    }
}

/// What a node handed back to its parent after an insert: the new right sibling, if it split.
type Split = Option<u16>;

/// Slots in `(expires_at_us, id)` order, with counts; see the module docs.
#[derive(Clone, Debug, Default)]
pub(crate) struct OrderIndex {
    leaves: Vec<Leaf>,
    inners: Vec<Inner>,
    /// Nodes merged away and not reused, until a rebuild compacts the pools.
    dead_leaves: usize,
    dead_inners: usize,
    root: u16,
    /// 0 when the root is a leaf.
    height: u8,
    len: usize,
}

/// Grows `pool` by an eighth when full, not by doubling: the nodes are part of a lease's
/// cost.
fn push_node<T>(pool: &mut Vec<T>, node: T) -> Option<u16> {
    let at = u16::try_from(pool.len()).ok()?;
    if pool.len() == pool.capacity() {
        pool.reserve_exact((pool.len() / 8).max(1));
    }
    pool.push(node);
    Some(at)
}

impl OrderIndex {
    /// Bytes allocated.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.leaves.capacity() * size_of::<Leaf>() + self.inners.capacity() * size_of::<Inner>()
    }

    fn leaf(&self, at: u16) -> Option<&Leaf> {
        self.leaves.get(usize::from(at))
    }

    fn leaf_mut(&mut self, at: u16) -> Option<&mut Leaf> {
        self.leaves.get_mut(usize::from(at))
    }

    fn inner(&self, at: u16) -> Option<&Inner> {
        self.inners.get(usize::from(at))
    }

    fn inner_mut(&mut self, at: u16) -> Option<&mut Inner> {
        self.inners.get_mut(usize::from(at))
    }

    /// The slots of leaf `at`.
    fn leaf_slots(&self, at: u16) -> Option<&[Slot]> {
        let leaf = self.leaf(at)?;
        leaf.slots.get(..usize::from(leaf.len))
    }

    /// Entries (slots or children) of node `at` on `level`.
    fn node_len(&self, level: u8, at: u16) -> Option<usize> {
        Some(usize::from(if level == 0 {
            self.leaf(at)?.len
        } else {
            self.inner(at)?.len
        }))
    }

    /// Leases under node `at` on `level`.
    fn node_count(&self, level: u8, at: u16) -> Option<u16> {
        if level == 0 {
            return Some(self.leaf(at)?.len);
        }
        Some(
            self.inner(at)?
                .entries()
                .fold(0u16, |sum, (_, count, _)| sum.saturating_add(count)),
        )
    }

    /// The first lease under node `at` on `level`.
    fn node_min(&self, level: u8, at: u16) -> Option<Slot> {
        if level == 0 {
            return self.leaf_slots(at)?.first().copied();
        }
        self.inner(at)?.entries().next().map(|(_, _, min)| min)
    }

    /// Which child of `inner` holds (or would hold) `key`: the last whose first lease is at
    /// or before it, else the first.
    fn child_for(arena: &[Lease], inner: &Inner, key: &Lease) -> usize {
        let mins = inner.mins.get(1..usize::from(inner.len)).unwrap_or(&[]);
        mins.partition_point(|&min| lease_at(arena, min).is_some_and(|min| min <= key))
    }

    /// The slots of `sorted` (in order), packed into leaves filled evenly to at most 7/8, so
    /// the next inserts do not split every leaf at once: O(N).
    pub(crate) fn build(sorted: &[Slot]) -> Option<Self> {
        let mut index = Self::default();
        if sorted.is_empty() {
            return Some(index);
        }
        let n = sorted.len();
        let count = n.div_ceil(LEAF_CAP * 7 / 8);
        index.leaves.reserve_exact(count);
        let mut level: Vec<(u16, u16, Slot)> = Vec::with_capacity(count);
        for j in 0..count {
            let part = sorted.get(j * n / count..(j + 1) * n / count)?;
            let mut leaf = Leaf {
                len: u16::try_from(part.len()).ok()?,
                slots: [0; LEAF_CAP],
            };
            leaf.slots.get_mut(..part.len())?.copy_from_slice(part);
            let at = push_node(&mut index.leaves, leaf)?;
            level.push((at, leaf.len, *part.first()?));
        }
        while level.len() > 1 {
            let m = level.len();
            let count = m.div_ceil(INNER_CAP);
            index.inners.reserve_exact(count);
            let mut up = Vec::with_capacity(count);
            for j in 0..count {
                let part = level.get(j * m / count..(j + 1) * m / count)?;
                let mut inner = Inner::EMPTY;
                inner.set_entries(part)?;
                let total = part
                    .iter()
                    .fold(0u16, |sum, &(_, c, _)| sum.saturating_add(c));
                let at = push_node(&mut index.inners, inner)?;
                up.push((at, total, part.first()?.2));
            }
            level = up;
            index.height = index.height.checked_add(1)?;
        }
        index.root = level.first()?.0;
        index.len = n;
        Some(index)
    }

    /// Every slot, in order.
    pub(crate) fn in_order(&self) -> Option<Vec<Slot>> {
        let mut out = Vec::with_capacity(self.len);
        if self.len > 0 {
            self.collect(self.height, self.root, &mut out)?;
        }
        Some(out)
    }

    fn collect(&self, level: u8, at: u16, out: &mut Vec<Slot>) -> Option<()> {
        if level == 0 {
            out.extend_from_slice(self.leaf_slots(at)?);
            return Some(());
        }
        for (child, _, _) in self.inner(at)?.entries() {
            self.collect(level - 1, child, out)?;
        }
        Some(())
    }

    /// Rebuilds the tree once a fifth of its nodes were merged away, or its leaves have room
    /// for more than twice the slots held (plus 4 leaves): removals spread over every leaf
    /// leave each about half full, which merging alone keeps. O(N), after Θ(N) changes: a
    /// rebuilt tree holds leaves 7/8 full, and a split needs an eighth of a leaf inserted.
    pub(crate) fn fit(&mut self) -> Option<()> {
        let live_leaves = self.leaves.len().saturating_sub(self.dead_leaves);
        let live_inners = self.inners.len().saturating_sub(self.dead_inners);
        let sparse = self.leaves.capacity() * LEAF_CAP > 2 * self.len + 4 * LEAF_CAP;
        if sparse
            || self.dead_leaves > live_leaves / 4 + 2
            || self.dead_inners > live_inners / 4 + 2
        {
            *self = Self::build(&self.in_order()?)?;
        }
        Some(())
    }

    /// The leaf holding rank `rank` (0 first) and the rank's place in it.
    pub(crate) fn select_leaf(&self, mut rank: usize) -> Option<(&[Slot], usize)> {
        if rank >= self.len {
            return None;
        }
        let mut at = self.root;
        for _ in 0..self.height {
            let inner = self.inner(at)?;
            let mut next = None;
            for (child, count, _) in inner.entries() {
                if rank < usize::from(count) {
                    next = Some(child);
                    break;
                }
                rank -= usize::from(count);
            }
            at = next?;
        }
        let slots = self.leaf_slots(at)?;
        (rank < slots.len()).then_some((slots, rank))
    }

    /// The slot of rank `rank` (0 first).
    pub(crate) fn select(&self, rank: usize) -> Option<Slot> {
        let (slots, at) = self.select_leaf(rank)?;
        slots.get(at).copied()
    }

    /// The first slot.
    pub(crate) fn first(&self) -> Option<Slot> {
        self.select(0)
    }

    /// The last slot.
    pub(crate) fn last(&self) -> Option<Slot> {
        self.select(self.len.checked_sub(1)?)
    }

    /// How many stored leases expire at or before `until_us`.
    pub(crate) fn count_until(&self, arena: &[Lease], until_us: u64) -> Option<usize> {
        if self.len == 0 {
            return Some(0);
        }
        let expired = |slot: &Slot| {
            lease_at(arena, *slot).is_some_and(|lease| lease.expires_at_us() <= until_us)
        };
        let mut at = self.root;
        let mut before = 0usize;
        for _ in 0..self.height {
            let inner = self.inner(at)?;
            // Children before the last one starting at or before `until_us` expire by then.
            let mins = inner.mins.get(1..usize::from(inner.len))?;
            let child = mins.partition_point(expired);
            before += inner
                .counts
                .get(..child)?
                .iter()
                .map(|&count| usize::from(count))
                .sum::<usize>();
            at = *inner.children.get(child)?;
        }
        Some(before + self.leaf_slots(at)?.partition_point(expired))
    }

    /// Adds `slot`, whose lease is in `arena` and not yet indexed.
    pub(crate) fn insert(&mut self, arena: &[Lease], slot: Slot) -> Option<()> {
        let key = *lease_at(arena, slot)?;
        if self.len == 0 {
            *self = Self::default();
            let mut leaf = Leaf {
                len: 1,
                slots: [0; LEAF_CAP],
            };
            *leaf.slots.first_mut()? = slot;
            self.root = push_node(&mut self.leaves, leaf)?;
            self.len = 1;
            return Some(());
        }
        if let Some(right) = self.insert_in(arena, self.height, self.root, &key, slot, true)? {
            let left = self.root;
            let mut root = Inner::EMPTY;
            root.set_entries(&[
                (
                    left,
                    self.node_count(self.height, left)?,
                    self.node_min(self.height, left)?,
                ),
                (
                    right,
                    self.node_count(self.height, right)?,
                    self.node_min(self.height, right)?,
                ),
            ])?;
            self.root = push_node(&mut self.inners, root)?;
            self.height = self.height.checked_add(1)?;
        }
        self.len += 1;
        Some(())
    }

    fn insert_in(
        &mut self,
        arena: &[Lease],
        level: u8,
        at: u16,
        key: &Lease,
        slot: Slot,
        rightmost: bool,
    ) -> Option<Split> {
        if level == 0 {
            return self.insert_in_leaf(arena, at, key, slot, rightmost);
        }
        let inner = self.inner(at)?;
        let i = Self::child_for(arena, inner, key);
        let child = *inner.children.get(i)?;
        let last = usize::from(inner.len) == i + 1;
        if level == 1
            && ((!last && self.spill(arena, at, i, key, slot)?)
                || (i > 0 && self.spill_left(arena, at, i, key, slot)?))
        {
            return Some(None);
        }
        let split = self.insert_in(arena, level - 1, child, key, slot, rightmost && last)?;
        let min = self.node_min(level - 1, child)?;
        let Some(right) = split else {
            let inner = self.inner_mut(at)?;
            let count = inner.counts.get_mut(i)?;
            *count = count.checked_add(1)?;
            *inner.mins.get_mut(i)? = min;
            return Some(None);
        };
        let mut entries: Vec<(u16, u16, Slot)> = self.inner(at)?.entries().collect();
        *entries.get_mut(i)? = (child, self.node_count(level - 1, child)?, min);
        entries.insert(
            i + 1,
            (
                right,
                self.node_count(level - 1, right)?,
                self.node_min(level - 1, right)?,
            ),
        );
        if entries.len() <= INNER_CAP {
            self.inner_mut(at)?.set_entries(&entries)?;
            return Some(None);
        }
        let keep = entries.len() / 2;
        self.inner_mut(at)?.set_entries(entries.get(..keep)?)?;
        let mut sibling = Inner::EMPTY;
        sibling.set_entries(entries.get(keep..)?)?;
        Some(Some(push_node(&mut self.inners, sibling)?))
    }

    /// Inserts into leaf `i` of inner node `at` without a split when it is full and the next
    /// leaf has room: its last lease (or the new one, if it goes last) moves to the front of
    /// the next leaf. Leases of one instant taken in a run straddle two leaves this way and
    /// leave both full. `false` if it does not apply.
    fn spill(
        &mut self,
        arena: &[Lease],
        at: u16,
        i: usize,
        key: &Lease,
        slot: Slot,
    ) -> Option<bool> {
        let inner = self.inner(at)?;
        let (a, b) = (*inner.children.get(i)?, *inner.children.get(i + 1)?);
        let full = self.leaf_slots(a)?;
        if full.len() < LEAF_CAP || usize::from(self.leaf(b)?.len) >= LEAF_CAP {
            return Some(false);
        }
        let &greatest = full.last()?;
        let moved = if lease_at(arena, greatest)? < key {
            slot
        } else {
            let leaf = self.leaf_mut(a)?;
            leaf.len -= 1;
            self.insert_in_leaf(arena, a, key, slot, false)?;
            greatest
        };
        let next = self.leaf_mut(b)?;
        let len = usize::from(next.len);
        next.slots.get_mut(..=len)?.rotate_right(1);
        *next.slots.first_mut()? = moved;
        next.len += 1;
        self.refresh_pair(at, i, [a, b])?;
        Some(true)
    }

    /// Writes leaves `pair` as children `first` and `first + 1` of inner node `at`, with
    /// their counts and least slots: after a lease moved between two neighbouring leaves.
    fn refresh_pair(&mut self, at: u16, first: usize, pair: [u16; 2]) -> Option<()> {
        let [a, b] = pair;
        let entries = [
            (a, self.node_count(0, a)?, self.node_min(0, a)?),
            (b, self.node_count(0, b)?, self.node_min(0, b)?),
        ];
        let inner = self.inner_mut(at)?;
        for (k, (child, count, min)) in entries.into_iter().enumerate() {
            *inner.children.get_mut(first + k)? = child;
            *inner.counts.get_mut(first + k)? = count;
            *inner.mins.get_mut(first + k)? = min;
        }
        Some(())
    }

    /// Inserts into leaf `i` (not the first) of inner node `at` without a split when it is
    /// full and the previous leaf has room: its first lease moves to the end of the previous
    /// leaf (the new one sorts after it, or the search would have gone left). `false` if it
    /// does not apply.
    fn spill_left(
        &mut self,
        arena: &[Lease],
        at: u16,
        i: usize,
        key: &Lease,
        slot: Slot,
    ) -> Option<bool> {
        let inner = self.inner(at)?;
        let (a, b) = (
            *inner.children.get(i.checked_sub(1)?)?,
            *inner.children.get(i)?,
        );
        let full = self.leaf_slots(b)?;
        if full.len() < LEAF_CAP || usize::from(self.leaf(a)?.len) >= LEAF_CAP {
            return Some(false);
        }
        let &least = full.first()?;
        let leaf = self.leaf_mut(b)?;
        leaf.slots.rotate_left(1);
        leaf.len -= 1;
        self.insert_in_leaf(arena, b, key, slot, false)?;
        let prev = self.leaf_mut(a)?;
        *prev.slots.get_mut(usize::from(prev.len))? = least;
        prev.len += 1;
        self.refresh_pair(at, i.checked_sub(1)?, [a, b])?;
        Some(true)
    }

    fn insert_in_leaf(
        &mut self,
        arena: &[Lease],
        at: u16,
        key: &Lease,
        slot: Slot,
        rightmost: bool,
    ) -> Option<Split> {
        let slots = self.leaf_slots(at)?;
        let len = slots.len();
        let pos = slots.partition_point(|&s| lease_at(arena, s).is_some_and(|held| held < key));
        let leaf = self.leaf_mut(at)?;
        if len < LEAF_CAP {
            leaf.slots.get_mut(pos..=len)?.rotate_right(1);
            *leaf.slots.get_mut(pos)? = slot;
            leaf.len += 1;
            return Some(None);
        }
        let mut all = [0; LEAF_CAP + 1];
        all.get_mut(..pos)?.copy_from_slice(leaf.slots.get(..pos)?);
        *all.get_mut(pos)? = slot;
        all.get_mut(pos + 1..)?
            .copy_from_slice(leaf.slots.get(pos..)?);
        // The last leaf splits where the new lease goes, keeping at least half: a run of one
        // ttl arrives in order, give or take leases of one instant (ordered by id), so the
        // leaves it leaves behind stay full. Any other leaf halves.
        let keep = if rightmost {
            pos.max(all.len() / 2)
        } else {
            all.len() / 2
        };
        leaf.slots
            .get_mut(..keep)?
            .copy_from_slice(all.get(..keep)?);
        leaf.len = u16::try_from(keep).ok()?;
        let rest = all.get(keep..)?;
        let mut sibling = Leaf {
            len: u16::try_from(rest.len()).ok()?,
            slots: [0; LEAF_CAP],
        };
        sibling.slots.get_mut(..rest.len())?.copy_from_slice(rest);
        Some(Some(push_node(&mut self.leaves, sibling)?))
    }

    /// Removes `slot`, whose lease is still in `arena`.
    pub(crate) fn remove(&mut self, arena: &[Lease], slot: Slot) -> Option<()> {
        let key = *lease_at(arena, slot)?;
        self.remove_in(arena, self.height, self.root, &key, slot)?;
        self.len = self.len.checked_sub(1)?;
        if self.len == 0 {
            *self = Self::default();
            return Some(());
        }
        while self.height > 0 {
            let root = self.inner(self.root)?;
            if root.len != 1 {
                break;
            }
            self.root = *root.children.first()?;
            self.dead_inners += 1;
            self.height -= 1;
        }
        Some(())
    }

    fn remove_in(
        &mut self,
        arena: &[Lease],
        level: u8,
        at: u16,
        key: &Lease,
        slot: Slot,
    ) -> Option<()> {
        if level == 0 {
            let slots = self.leaf_slots(at)?;
            let len = slots.len();
            let pos = slots.partition_point(|&s| lease_at(arena, s).is_some_and(|held| held < key));
            (*slots.get(pos)? == slot).then_some(())?;
            let leaf = self.leaf_mut(at)?;
            leaf.slots.get_mut(pos..len)?.rotate_left(1);
            leaf.len -= 1;
            return Some(());
        }
        let inner = self.inner(at)?;
        let i = Self::child_for(arena, inner, key);
        let child = *inner.children.get(i)?;
        let siblings = usize::from(inner.len);
        self.remove_in(arena, level - 1, child, key, slot)?;
        let child_len = self.node_len(level - 1, child)?;
        let least = if level == 1 {
            LEAF_CAP / 2
        } else {
            INNER_CAP / 2
        };
        if child_len == 0 {
            // An emptied child (a last leaf of one lease, or an inner node whose children
            // all went) is dropped.
            let mut entries: Vec<(u16, u16, Slot)> = self.inner(at)?.entries().collect();
            entries.remove(i);
            self.inner_mut(at)?.set_entries(&entries)?;
            self.mark_dead(level - 1);
            return Some(());
        }
        let min = self.node_min(level - 1, child)?;
        let inner = self.inner_mut(at)?;
        let count = inner.counts.get_mut(i)?;
        *count = count.checked_sub(1)?;
        *inner.mins.get_mut(i)? = min;
        if child_len < least && siblings > 1 {
            let left = if i + 1 < siblings { i } else { i - 1 };
            self.rebalance(level, at, left)?;
        }
        Some(())
    }

    fn mark_dead(&mut self, level: u8) {
        if level == 0 {
            self.dead_leaves += 1;
        } else {
            self.dead_inners += 1;
        }
    }

    /// Evens out children `left` and `left + 1` of inner node `at` (on `level`): merges them
    /// when they fit in 7/8 of a node (so a merge and a split are an eighth of a node's
    /// changes apart), else shares their entries.
    fn rebalance(&mut self, level: u8, at: u16, left: usize) -> Option<()> {
        let inner = self.inner(at)?;
        let a = *inner.children.get(left)?;
        let b = *inner.children.get(left + 1)?;
        let below = level - 1;
        let merged_len;
        if below == 0 {
            let mut all: Vec<Slot> = self.leaf_slots(a)?.to_vec();
            all.extend_from_slice(self.leaf_slots(b)?);
            merged_len = all.len();
            let keep = if all.len() <= LEAF_CAP * 7 / 8 {
                all.len()
            } else {
                all.len() / 2
            };
            for (node, part) in [(a, all.get(..keep)?), (b, all.get(keep..)?)] {
                let leaf = self.leaf_mut(node)?;
                leaf.slots.get_mut(..part.len())?.copy_from_slice(part);
                leaf.len = u16::try_from(part.len()).ok()?;
            }
        } else {
            let mut all: Vec<(u16, u16, Slot)> = self.inner(a)?.entries().collect();
            all.extend(self.inner(b)?.entries());
            merged_len = all.len();
            let keep = if all.len() <= INNER_CAP * 7 / 8 {
                all.len()
            } else {
                all.len() / 2
            };
            self.inner_mut(a)?.set_entries(all.get(..keep)?)?;
            self.inner_mut(b)?.set_entries(all.get(keep..)?)?;
        }
        let cap = if below == 0 { LEAF_CAP } else { INNER_CAP };
        let mut entries: Vec<(u16, u16, Slot)> = self.inner(at)?.entries().collect();
        if merged_len <= cap * 7 / 8 {
            entries.remove(left + 1);
            self.mark_dead(below);
        } else {
            *entries.get_mut(left + 1)? = (b, self.node_count(below, b)?, self.node_min(below, b)?);
        }
        *entries.get_mut(left)? = (a, self.node_count(below, a)?, self.node_min(below, a)?);
        self.inner_mut(at)?.set_entries(&entries)
    }

    /// Renames `from` (whose lease is still at `from` in `arena`) to `to` wherever the tree
    /// holds it: its leaf, and the separators on its path.
    pub(crate) fn repoint(&mut self, arena: &[Lease], from: Slot, to: Slot) -> Option<()> {
        let key = *lease_at(arena, from)?;
        let mut at = self.root;
        for _ in 0..self.height {
            let inner = self.inner(at)?;
            let i = Self::child_for(arena, inner, &key);
            let child = *inner.children.get(i)?;
            let min = self.inner_mut(at)?.mins.get_mut(i)?;
            if *min == from {
                *min = to;
            }
            at = child;
        }
        let slots = self.leaf_slots(at)?;
        let pos = slots.partition_point(|&s| lease_at(arena, s).is_some_and(|held| *held < key));
        let held = self.leaf_mut(at)?.slots.get_mut(pos)?;
        (*held == from).then_some(())?;
        *held = to;
        Some(())
    }
}

#[cfg(test)]
impl IdIndex {
    /// Panics unless every slot of `arena` is found by its id and the load is at most 7/8.
    pub(crate) fn check(&self, arena: &[Lease]) {
        assert!(arena.len() * 8 <= self.table.len() * 7 || arena.is_empty());
        let held = self.table.iter().filter(|&&e| e != EMPTY).count();
        assert_eq!(held, arena.len(), "entries");
        for (slot, lease) in arena.iter().enumerate() {
            assert_eq!(self.find(arena, &lease.id()), Some(slot as Slot));
        }
    }
}

#[cfg(test)]
impl OrderIndex {
    /// Panics unless the tree is well formed over `arena`: every slot once, in order, each
    /// inner node's counts and separators exact, every leaf at one depth and non-empty.
    pub(crate) fn check(&self, arena: &[Lease]) {
        assert_eq!(self.len, arena.len(), "len");
        if self.len == 0 {
            return;
        }
        let count = self.check_node(self.height, self.root);
        assert_eq!(usize::from(count), self.len);
        let order = self.in_order().unwrap();
        let mut seen = order.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), arena.len(), "each slot once");
        assert!(order
            .windows(2)
            .all(|w| arena[usize::from(w[0])] < arena[usize::from(w[1])]));
    }

    fn check_node(&self, level: u8, at: u16) -> u16 {
        if level == 0 {
            let leaf = self.leaf(at).unwrap();
            assert!(leaf.len > 0 && usize::from(leaf.len) <= LEAF_CAP);
            return leaf.len;
        }
        let inner = *self.inner(at).unwrap();
        assert!(inner.len > 0 && usize::from(inner.len) <= INNER_CAP);
        let mut total = 0;
        for (child, count, min) in inner.entries() {
            assert_eq!(self.check_node(level - 1, child), count, "count");
            assert_eq!(self.node_min(level - 1, child), Some(min), "separator");
            total += count;
        }
        total
    }

    /// Leaves in use, and their slots.
    pub(crate) fn leaf_fill(&self) -> (usize, usize) {
        let live = self.leaves.len() - self.dead_leaves;
        (live, self.len)
    }
}
