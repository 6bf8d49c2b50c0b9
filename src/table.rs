//! The bucket table: many token buckets in one value, each named by the 128-bit tag of its
//! field. Pure: no Redis types and no clock (`now_ns` is passed in). The glue, `table_type`,
//! keeps one [`Table`] per key and decides when to call what.
//!
//! # Layout
//! Open addressing with linear probing, in a slot order of the array's own (a shrink picks
//! a new one: see `Table::maybe_shrink`). A slot is 24 bytes: the field's tag and the bucket's
//! `full_at_ns` (0 marks an empty slot). Fractions of a nanosecond (rates such as 3/s) live
//! in a parallel column of 8 bytes per slot, allocated per chunk only where one is stored.
//! Slots come in chunks of [`CHUNK_SLOTS`] (6 KiB, an exact jemalloc size class), allocated
//! on first use and found through 4 KiB pages of chunk pointers, also allocated on first use
//! ([`Column`]), so a new array costs one pointer per 131,072 slots until it is written, and
//! no call zeroes more than one chunk and one page. A table under one chunk is one allocation sized to a jemalloc class.
//!
//! # No stop-the-world step
//! Growing or shrinking starts a migration: a new array becomes current, and each write moves
//! the next [`MIGRATE_STEP`] slots of the old one across ([`REMOVE_MIGRATE_STEP`] for each
//! field a removal takes away), freeing each old chunk once passed.
//! Until then a lookup also probes the old array, where the passed prefix reads as occupied
//! (its probe chains ran through it) and a removal leaves a tombstone. A sweep looks at a
//! bounded number of slots per call and removes buckets that are full again; the caller
//! decides when (only the master does, and replicates what it removed).
//!
//! # Tags instead of fields
//! A field is stored as its SipHash-1-3 128-bit hash under a fixed key ([`tag`]). Two fields
//! share a bucket only if their tags collide: for fields not chosen against the key, the
//! chance is 2^-128 per pair (2^-89 for a billion fields at once), far below the 2^-64 bound
//! asked for. The key is public, so a client can make two fields of its own collide with
//! about 2^64 hash evaluations (a birthday search), which only merges its own buckets;
//! reaching a given field needs a second preimage (2^128).

use std::collections::BTreeMap;

use rl_bucket::{Cost, LeaseId, Reservation, State, MAX_LEASE_ID_BYTES, MAX_RESERVATIONS};
use siphasher::sip128::SipHasher13;

/// A field's 128-bit tag.
pub type Tag = u128;

/// The fixed SipHash key: the tag of a field must be the same on every server, in every file
/// and on every replica, since replication and AOF carry tags.
const TAG_KEY: (u64, u64) = (0x7265_6469_732d_726c, 0x6275_636b_6574_7331);

/// The tag of `field`.
pub fn tag(field: &[u8]) -> Tag {
    let hash = SipHasher13::new_with_keys(TAG_KEY.0, TAG_KEY.1).hash(field);
    (u128::from(hash.h2) << 64) | u128::from(hash.h1)
}

/// Slots per chunk: 256 × 24 bytes = 6 KiB, a jemalloc size class. Small enough that
/// rounding a table up to whole chunks wastes little (at most 6 KiB a key).
pub const CHUNK_SLOTS: usize = 256;
/// The most buckets one key may hold (about 3.2 GB). Past it a new field is refused.
pub const MAX_BUCKETS: usize = 100_000_000;
/// Old slots moved to the new array per write during a migration: one chunk.
pub const MIGRATE_STEP: usize = CHUNK_SLOTS;
/// What allocating a chunk or a page counts for in a migration step, in slots moved: zeroing
/// 6 KiB of fresh memory costs about what moving 32 slots does. A shrink's new array has
/// another slot order, so the buckets of one old chunk land in as many new chunks, each
/// allocated on first use: uncounted, one 256-slot step of a dense stretch could allocate
/// 256 chunks (1.5 MB). Counted, a step allocates at most 8.
pub const CHUNK_ALLOC_SLOTS: usize = 32;
/// Old slots moved per removal. Less than a write's step because one `RL.HDEL` removes many
/// fields: at 256 a removal, 100 fields during a growth moved 25,600 slots (about 1 ms).
/// Still enough to finish any shrink by removals alone: a shrink starts below one bucket
/// per 8 slots, and those buckets' removals then move 4 times the old array.
pub const REMOVE_MIGRATE_STEP: usize = 32;
/// A table grows when a new bucket would fill more than this share of its slots (percent).
const MAX_LOAD_PCT: usize = 85;
/// The load a grown or shrunk array starts at (percent): 85 / 1.125, so each growth adds an
/// eighth. Small steps keep memory near 24 B / 0.8 per bucket; each growth moves every bucket
/// once per eighth of the table inserted, a handful of moves per insert.
const TARGET_LOAD_PCT: usize = 75;
/// A table shrinks when fewer than one slot in this many holds a bucket.
const SHRINK_BELOW_ONE_IN: usize = 8;
/// The smallest array.
const MIN_SLOTS: usize = 8;

const EMPTY: u64 = 0;
/// A removed slot of the old array during a migration (never a valid `full_at_ns`, which is
/// at most `i64::MAX`).
const TOMBSTONE: u64 = u64::MAX;

#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Slot {
    tag_lo: u64,
    tag_hi: u64,
    full_at_ns: u64,
}

impl Slot {
    fn new(tag: Tag, full_at_ns: u64) -> Self {
        Slot {
            tag_lo: tag as u64,
            tag_hi: (tag >> 64) as u64,
            full_at_ns,
        }
    }

    fn tag(self) -> Tag {
        (u128::from(self.tag_hi) << 64) | u128::from(self.tag_lo)
    }

    fn is_live(self) -> bool {
        self.full_at_ns != EMPTY && self.full_at_ns != TOMBSTONE
    }
}

const NS_PER_US: u64 = 1_000;

/// The instant (ns) the last of `records` lapses; `None` for none.
fn latest_lapse_ns(records: &[Reservation]) -> Option<u64> {
    records
        .iter()
        .map(|record| record.expires_at_us.saturating_mul(NS_PER_US))
        .max()
}

/// Whether `state` is full at `now_ns`: its instant is at or before now.
pub fn is_full(state: State, now_ns: u64) -> bool {
    state.full_at_ns() < now_ns || (state.full_at_ns() == now_ns && state.full_at_frac() == 0)
}

/// Chunk pointers per page of a [`Column`]'s directory: 512 × 8 bytes, 4 KiB.
const PAGE_CHUNKS: usize = 512;

/// One column of an array (its slots, or its fractions): chunks allocated on first write,
/// found through pages of chunk pointers that are also allocated on first use. So a new
/// array of any size allocates one pointer per page (per 131,072 slots) and nothing else up
/// front. A flat list of chunk pointers, as before, was allocated and zeroed whole when a
/// growth began: 832 KB for the two columns at 13 M slots, 200 fresh pages faulted in by
/// one command (about 0.4 ms on the test machine, more under memory pressure).
#[derive(Clone, Debug)]
struct Column<T> {
    chunks: usize,
    pages: Vec<Option<Page<T>>>,
    /// Chunks and pages allocated so far (never decreased): what a migration step counts.
    made: usize,
}

/// Up to [`PAGE_CHUNKS`] chunk pointers, each chunk allocated on first write.
type Page<T> = Box<[Option<Box<[T]>>]>;

impl<T: Copy + Default> Column<T> {
    fn new(chunks: usize) -> Self {
        Column {
            chunks,
            pages: vec![None; chunks.div_ceil(PAGE_CHUNKS)],
            made: 0,
        }
    }

    fn chunk(&self, chunk: usize) -> Option<&[T]> {
        let page = self.pages.get(chunk / PAGE_CHUNKS)?.as_deref()?;
        page.get(chunk % PAGE_CHUNKS)?.as_deref()
    }

    fn chunk_mut(&mut self, chunk: usize) -> Option<&mut [T]> {
        let page = self.pages.get_mut(chunk / PAGE_CHUNKS)?.as_deref_mut()?;
        page.get_mut(chunk % PAGE_CHUNKS)?.as_deref_mut()
    }

    /// The chunk, allocated (with its page) if need be, holding `chunk_len` values.
    fn chunk_or_new(&mut self, chunk: usize, chunk_len: usize) -> Option<&mut [T]> {
        let page_len = PAGE_CHUNKS.min(
            self.chunks
                .saturating_sub(chunk / PAGE_CHUNKS * PAGE_CHUNKS),
        );
        let made = &mut self.made;
        let page = self
            .pages
            .get_mut(chunk / PAGE_CHUNKS)?
            .get_or_insert_with(|| {
                *made += 1;
                vec![None; page_len].into()
            });
        let entry = page.get_mut(chunk % PAGE_CHUNKS)?;
        Some(entry.get_or_insert_with(|| {
            *made += 1;
            vec![T::default(); chunk_len].into()
        }))
    }

    fn is_allocated(&self, chunk: usize) -> bool {
        self.chunk(chunk).is_some()
    }

    fn free(&mut self, chunk: usize) {
        if let Some(Some(page)) = self.pages.get_mut(chunk / PAGE_CHUNKS) {
            if let Some(entry) = page.get_mut(chunk % PAGE_CHUNKS) {
                *entry = None;
            }
        }
    }

    /// The allocated chunks.
    fn allocated(&self) -> impl Iterator<Item = &[T]> {
        self.pages
            .iter()
            .flatten()
            .flat_map(|page| page.iter().flatten().map(|c| &c[..]))
    }

    /// Allocations: chunks and pages.
    fn allocations(&self) -> usize {
        self.pages.iter().flatten().count() + self.allocated().count()
    }

    fn mem_bytes(&self) -> usize {
        let pages = self.pages.iter().flatten().map(|page| page.len());
        let pointers = self.pages.capacity() + pages.sum::<usize>();
        let values = self.allocated().map(<[T]>::len).sum::<usize>();
        pointers * size_of::<usize>() + values * size_of::<T>()
    }
}

/// One open-addressed array of slots.
#[derive(Clone, Debug)]
struct Array {
    slots: usize,
    /// The array's slot order: a tag's home is its low 64 bits plus `order` times its high
    /// 64 bits, mapped onto the slots. 0 for a table's first array; a shrink picks another
    /// (see [`Table::maybe_shrink`]). Growth keeps it.
    order: u64,
    chunk_len: usize,
    chunks: Column<Slot>,
    fracs: Column<u64>,
    len: usize,
}

impl Array {
    fn new(slots: usize, order: u64) -> Self {
        let slots = slots.max(1);
        let chunk_len = slots.min(CHUNK_SLOTS);
        let count = slots.div_ceil(chunk_len);
        Array {
            slots,
            order,
            chunk_len,
            chunks: Column::new(count),
            fracs: Column::new(count),
            len: 0,
        }
    }

    fn home(&self, tag: Tag) -> usize {
        // The tag's halves are independent uniform hashes, so for any odd `order` the key is
        // uniform and independent of the key under any other order (see `reordered`).
        let key = (tag as u64).wrapping_add(((tag >> 64) as u64).wrapping_mul(self.order));
        // Lemire's multiply-shift maps the key onto any number of slots.
        ((u128::from(key) * self.slots as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 >= self.slots {
            0
        } else {
            i + 1
        }
    }

    fn locate(&self, i: usize) -> (usize, usize) {
        if self.slots <= CHUNK_SLOTS {
            (0, i)
        } else {
            (i / CHUNK_SLOTS, i % CHUNK_SLOTS)
        }
    }

    fn slot(&self, i: usize) -> Slot {
        #[cfg(test)]
        tests::SLOT_READS.with(|reads| reads.set(reads.get() + 1));
        let (chunk, offset) = self.locate(i);
        self.chunks
            .chunk(chunk)
            .and_then(|c| c.get(offset))
            .copied()
            .unwrap_or_default()
    }

    fn frac(&self, i: usize) -> u64 {
        let (chunk, offset) = self.locate(i);
        self.fracs
            .chunk(chunk)
            .and_then(|c| c.get(offset))
            .copied()
            .unwrap_or(0)
    }

    fn state(&self, i: usize) -> Option<State> {
        let slot = self.slot(i);
        if slot.is_live() {
            State::from_parts(slot.full_at_ns, self.frac(i))
        } else {
            None
        }
    }

    fn put(&mut self, i: usize, slot: Slot, frac: u64) {
        let (chunk, offset) = self.locate(i);
        let chunk_len = self.chunk_len;
        if let Some(target) = self
            .chunks
            .chunk_or_new(chunk, chunk_len)
            .and_then(|c| c.get_mut(offset))
        {
            *target = slot;
        }
        // A fraction column's chunk exists only where a fraction was ever stored.
        let fracs = if frac == 0 {
            self.fracs.chunk_mut(chunk)
        } else {
            self.fracs.chunk_or_new(chunk, chunk_len)
        };
        if let Some(target) = fracs.and_then(|c| c.get_mut(offset)) {
            *target = frac;
        }
    }

    /// The index holding `tag`. Slots below `passed` (the migrated prefix of an old array)
    /// are empty but read as occupied, since the probe chains ran through them.
    fn find(&self, tag: Tag, passed: usize) -> Option<usize> {
        if passed >= self.slots {
            return None;
        }
        let mut i = self.home(tag).max(passed);
        for _ in 0..self.slots {
            let slot = self.slot(i);
            if slot.full_at_ns == EMPTY {
                return None;
            }
            if slot.full_at_ns != TOMBSTONE && slot.tag() == tag {
                return Some(i);
            }
            i = self.next(i);
            if i == 0 && passed > 0 {
                // The chain wraps into the slots a migration has passed, whose buckets are
                // in the new array now. Going on at `passed` would walk the rest of this
                // array again, and again until `slots` reads: a lookup of a missing tag near
                // the end of a growth read the whole remaining tail per pass (27 ms at 8 M).
                return None;
            }
        }
        None
    }

    /// Stores a bucket whose tag the array does not hold, in the first empty slot of its
    /// chain. The array is never full (its load stays under 100%), so one exists.
    fn insert_absent(&mut self, tag: Tag, state: State) {
        let mut i = self.home(tag);
        for _ in 0..self.slots {
            if self.slot(i).full_at_ns == EMPTY {
                self.put(i, Slot::new(tag, state.full_at_ns()), state.full_at_frac());
                self.len += 1;
                return;
            }
            i = self.next(i);
        }
    }

    /// Cyclic distance from `from` forward to `to`.
    fn distance(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.slots - from
        }
    }

    /// Removes slot `i` by shifting the rest of its cluster back, so no tombstone is left and
    /// every chain stays unbroken. Returns the slots it looked at past `i`: the rest of the
    /// cluster, which a sweep counts against its budget (removing most of a long cluster
    /// one bucket at a time walks it once per bucket).
    fn remove_at(&mut self, i: usize) -> usize {
        let mut hole = i;
        let mut j = self.next(i);
        let mut walked = 0;
        for _ in 0..self.slots {
            let slot = self.slot(j);
            walked += 1;
            if slot.full_at_ns == EMPTY {
                break;
            }
            // The slot may fill the hole if the hole lies on its chain: from its home to it.
            if self.distance(self.home(slot.tag()), j) >= self.distance(hole, j) {
                let frac = self.frac(j);
                self.put(hole, slot, frac);
                hole = j;
            }
            j = self.next(j);
        }
        self.put(hole, Slot::default(), 0);
        self.len = self.len.saturating_sub(1);
        walked
    }

    fn mem_bytes(&self) -> usize {
        self.chunks.mem_bytes() + self.fracs.mem_bytes()
    }

    /// Calls `f` with every live bucket at index `from` or later, as encoding version 2
    /// writes it, chunk by chunk: the serializer's pass, which reads each chunk's slots and
    /// fractions as slices instead of looking every slot up through its page on its own.
    fn for_each_record(&self, from: usize, f: &mut impl FnMut(Record)) {
        for chunk in 0..self.chunks.chunks {
            let Some(slots) = self.chunks.chunk(chunk) else {
                continue;
            };
            let fracs = self.fracs.chunk(chunk).unwrap_or(&[]);
            let base = chunk.saturating_mul(self.chunk_len);
            let len = self.slots.saturating_sub(base).min(slots.len());
            let skip = from.saturating_sub(base);
            for (offset, slot) in slots.iter().enumerate().take(len).skip(skip) {
                if !slot.is_live() {
                    continue;
                }
                let frac = fracs.get(offset).copied().unwrap_or(0);
                // Only a valid state is stored; the check keeps this pass and `entries` equal.
                if State::from_parts(slot.full_at_ns, frac).is_some() {
                    f(Record {
                        lo: slot.tag_lo,
                        hi: slot.tag_hi,
                        full_at_ns: slot.full_at_ns,
                        full_at_frac: frac,
                    });
                }
            }
        }
    }

    /// Every live bucket at index `from` or later.
    fn entries(&self, from: usize) -> impl Iterator<Item = (Tag, State)> + '_ {
        (from..self.slots).filter_map(move |i| {
            let (chunk, offset) = self.locate(i);
            // Skip unallocated chunks cheaply: they hold nothing.
            if offset == 0 && !self.chunks.is_allocated(chunk) {
                return None;
            }
            self.state(i).map(|state| (self.slot(i).tag(), state))
        })
    }
}

/// The old array of a migration and how many of its slots have moved.
#[derive(Clone, Debug)]
struct Migration {
    array: Array,
    passed: usize,
}

/// A new field was refused: the table holds [`MAX_BUCKETS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

/// Many buckets, by tag. See the file's docs for the layout.
#[derive(Clone, Debug)]
pub struct Table {
    current: Array,
    old: Option<Box<Migration>>,
    sweep_at: usize,
    /// Sweeps that reached the end of the current array: how a background sweeper knows it
    /// has looked at every slot of a table it picked up.
    sweep_passes: u64,
    /// No bucket held is full before this instant (ns): a lower bound on the earliest
    /// `full_at_ns`, so a sweeper may skip the table until then. Lowered by every write, and
    /// set to the exact earliest by a pass that saw every bucket (see `pass_earliest_ns`).
    earliest_full_ns: u64,
    /// The earliest `full_at_ns` this pass of the sweep has seen, in the slots it looked at
    /// and in every write since it began.
    pass_earliest_ns: u64,
    /// Whether this pass can have seen every bucket: no migration and no removal other than
    /// the sweep's own since it began (either can move a bucket behind the cursor unseen).
    pass_whole: bool,
    /// Where the glue last recorded this table (a database number and key name), so it can
    /// tell when the table has moved (a rename, a move) at its next write. Not stored.
    pub recorded_at: Option<(i32, Box<[u8]>)>,
    /// The reservation records of the buckets that have any (`RL.HRESERVE`), by tag: a side
    /// structure, so a bucket without records stays one slot, and a table without any pays
    /// one empty map. Only tags of buckets held appear; removing a bucket removes its records.
    reservations: BTreeMap<Tag, Vec<Reservation>>,
}

impl Default for Table {
    fn default() -> Self {
        Self::new()
    }
}

/// The jemalloc size class holding `bytes` (4 classes per doubling above 128 bytes).
fn size_class(bytes: usize) -> usize {
    if bytes <= 8 {
        return 8;
    }
    if bytes <= 128 {
        return bytes.next_multiple_of(16);
    }
    let log2 = usize::BITS - 1 - (bytes - 1).leading_zeros();
    let step = 1usize << log2.saturating_sub(2);
    bytes.next_multiple_of(step)
}

/// A slot order other than `order` (see [`Array::order`]): odd, and apart from `order` by
/// about the golden ratio times 2^64, so the difference has few trailing zero bits and the
/// two orders' keys differ by a uniform multiple of the high half in their top bits.
fn reordered(order: u64) -> u64 {
    order.wrapping_add(0x9E37_79B9_7F4A_7C15) | 1
}

/// The number of slots for an array that starts holding `len` buckets at the target load:
/// a whole jemalloc size class below one chunk, whole chunks above.
fn slots_for(len: usize) -> usize {
    let want = (len.saturating_mul(100) / TARGET_LOAD_PCT + 1).max(MIN_SLOTS);
    if want <= CHUNK_SLOTS {
        (size_class(want * size_of::<Slot>()) / size_of::<Slot>()).min(CHUNK_SLOTS)
    } else {
        want.next_multiple_of(CHUNK_SLOTS)
    }
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Table {
            current: Array::new(MIN_SLOTS, 0),
            old: None,
            sweep_at: 0,
            sweep_passes: 0,
            earliest_full_ns: u64::MAX,
            pass_earliest_ns: u64::MAX,
            pass_whole: true,
            recorded_at: None,
            reservations: BTreeMap::new(),
        }
    }

    /// A table holding `entries`, whose tags must be distinct.
    pub fn from_entries(entries: &[(Tag, State)]) -> Self {
        let mut table = Table {
            current: Array::new(slots_for(entries.len()), 0),
            old: None,
            sweep_at: 0,
            sweep_passes: 0,
            earliest_full_ns: u64::MAX,
            pass_earliest_ns: u64::MAX,
            pass_whole: true,
            recorded_at: None,
            reservations: BTreeMap::new(),
        };
        for &(tag, state) in entries {
            table.current.insert_absent(tag, state);
            table.note_stored(state);
        }
        table
    }

    /// Buckets held, including full ones not swept yet.
    pub fn len(&self) -> usize {
        self.current.len + self.old.as_ref().map_or(0, |m| m.array.len)
    }

    /// Whether the table holds no bucket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bucket of `tag`, if held.
    pub fn get(&self, tag: Tag) -> Option<State> {
        if let Some(i) = self.current.find(tag, 0) {
            return self.current.state(i);
        }
        let old = self.old.as_ref()?;
        let i = old.array.find(tag, old.passed)?;
        old.array.state(i)
    }

    /// Stores `state` as the bucket of `tag`, after a step of any migration.
    ///
    /// # Errors
    /// [`Full`] for a new tag when the table holds [`MAX_BUCKETS`]; nothing changes.
    pub fn set(&mut self, tag: Tag, state: State) -> Result<(), Full> {
        self.migrate(MIGRATE_STEP);
        if let Some(i) = self.current.find(tag, 0) {
            self.current
                .put(i, Slot::new(tag, state.full_at_ns()), state.full_at_frac());
            self.note_stored(state);
            return Ok(());
        }
        let in_old = self.take_from_old(tag).is_some();
        if !in_old && self.len() >= MAX_BUCKETS {
            return Err(Full);
        }
        self.reserve_one();
        self.current.insert_absent(tag, state);
        self.note_stored(state);
        Ok(())
    }

    /// What every stored state moves: the earliest full instant.
    fn note_stored(&mut self, state: State) {
        self.earliest_full_ns = self.earliest_full_ns.min(state.full_at_ns());
        self.pass_earliest_ns = self.pass_earliest_ns.min(state.full_at_ns());
    }

    /// No bucket held is full before this instant (ns); `u64::MAX` for an empty table that
    /// a whole pass has seen. A lower bound: a removal never raises it, only a whole pass.
    pub fn earliest_full_ns(&self) -> u64 {
        self.earliest_full_ns
    }

    /// Removes the bucket of `tag`, returning it, and moves a step of any migration
    /// ([`REMOVE_MIGRATE_STEP`]).
    pub fn remove(&mut self, tag: Tag) -> Option<State> {
        // Shifting a cluster back can move a bucket behind the sweep's cursor unseen.
        self.pass_whole = false;
        self.migrate(REMOVE_MIGRATE_STEP);
        let removed = match self.current.find(tag, 0) {
            Some(i) => {
                let state = self.current.state(i);
                self.current.remove_at(i);
                state
            }
            None => self.take_from_old(tag),
        };
        if removed.is_some() {
            self.reservations.remove(&tag);
        }
        self.maybe_shrink();
        removed
    }

    /// The reservation records of the bucket of `tag` (lapsed ones included until a write of
    /// them or the bucket's removal drops them); empty for a bucket without any.
    pub fn records(&self, tag: Tag) -> &[Reservation] {
        self.reservations.get(&tag).map_or(&[], Vec::as_slice)
    }

    /// Replaces the records of the bucket of `tag` with `records` (none removes the entry).
    /// Records belong to a bucket: for a tag not held, nothing is stored and `false` is
    /// returned.
    pub fn set_records(&mut self, tag: Tag, records: Vec<Reservation>) -> bool {
        if records.is_empty() {
            self.reservations.remove(&tag);
            return true;
        }
        if self.get(tag).is_none() {
            return false;
        }
        // Lapsed records keep a bucket held until then: the sweep must look again by then.
        if let Some(lapse_ns) = latest_lapse_ns(&records) {
            self.earliest_full_ns = self.earliest_full_ns.min(lapse_ns);
            self.pass_earliest_ns = self.pass_earliest_ns.min(lapse_ns);
        }
        self.reservations.insert(tag, records);
        true
    }

    /// Whether the bucket of `tag` has a record still open at `now_ns`: such a bucket is
    /// never swept, so the record can be settled (and an under-estimate charged) until it
    /// lapses.
    pub fn has_open_records(&self, tag: Tag, now_ns: u64) -> bool {
        self.records(tag)
            .iter()
            .any(|record| record.is_open(now_ns / NS_PER_US))
    }

    /// Every bucket that has records, by tag, with its records: the order the encoding, the
    /// digest and the AOF rewrite use.
    pub fn reserved(&self) -> impl Iterator<Item = (Tag, &[Reservation])> + '_ {
        self.reservations
            .iter()
            .map(|(&tag, records)| (tag, records.as_slice()))
    }

    /// Records held, over all buckets.
    pub fn record_count(&self) -> usize {
        self.reservations.values().map(Vec::len).sum()
    }

    /// Marks `tag` removed in the old array, returning its bucket.
    fn take_from_old(&mut self, tag: Tag) -> Option<State> {
        let old = self.old.as_mut()?;
        let i = old.array.find(tag, old.passed)?;
        let state = old.array.state(i);
        let slot = Slot::new(tag, TOMBSTONE);
        old.array.put(i, slot, 0);
        old.array.len = old.array.len.saturating_sub(1);
        state
    }

    /// Makes room for one more bucket in the current array: starts a growth, or in the
    /// unexpected case that a migration's new array filled first, finishes that migration.
    fn reserve_one(&mut self) {
        let over = |array: &Array, pct: usize| (array.len + 1) * 100 > array.slots * pct;
        if self.old.is_some() && over(&self.current, 95) {
            self.migrate(usize::MAX);
        }
        if self.old.is_none() && over(&self.current, MAX_LOAD_PCT) {
            self.start_migration(slots_for(self.len() + 1), self.current.order);
        }
    }

    fn start_migration(&mut self, slots: usize, order: u64) {
        let array = std::mem::replace(&mut self.current, Array::new(slots, order));
        self.sweep_at = 0;
        self.pass_whole = false;
        self.old = Some(Box::new(Migration { array, passed: 0 }));
        self.migrate(MIGRATE_STEP);
    }

    /// Moves up to `budget` old slots into the current array, freeing each old chunk once
    /// passed; ends the migration at the last. Each chunk or page the move allocates in the
    /// current array counts as [`CHUNK_ALLOC_SLOTS`] slots.
    pub fn migrate(&mut self, budget: usize) {
        let Some(old) = self.old.as_mut() else { return };
        let mut moved = 0;
        while moved < budget && old.passed < old.array.slots {
            let i = old.passed;
            let (chunk, offset) = old.array.locate(i);
            if offset == 0 && !old.array.chunks.is_allocated(chunk) {
                // An unallocated chunk holds nothing: pass it whole.
                old.passed = (i + old.array.chunk_len).min(old.array.slots);
                moved += 1;
                continue;
            }
            let slot = old.array.slot(i);
            if let (true, Some(state)) = (slot.is_live(), old.array.state(i)) {
                let made = |a: &Array| a.chunks.made + a.fracs.made;
                let before = made(&self.current);
                self.current.insert_absent(slot.tag(), state);
                old.array.len = old.array.len.saturating_sub(1);
                let allocated = made(&self.current).saturating_sub(before);
                moved += allocated.saturating_mul(CHUNK_ALLOC_SLOTS);
            }
            old.passed = i + 1;
            moved += 1;
            if old.passed % old.array.chunk_len == 0 || old.passed == old.array.slots {
                old.array.chunks.free(chunk);
                old.array.fracs.free(chunk);
            }
        }
        if old.passed >= old.array.slots {
            self.old = None;
        }
    }

    /// Starts a shrink if few slots hold a bucket, into an array of another slot order.
    ///
    /// The buckets a sweep leaves are bunched in the array's order, wherever its cursor is:
    /// it met the slots before its cursor at other times than those after, and buckets fill
    /// up with time. (A flood whose buckets filled up while one slow pass went by left its
    /// survivors in the slots the cursor met first.) In a smaller array of the same order
    /// they would share one range of homes, at many times the array's load: one cluster as
    /// long as all of them, walked by every probe and every removal (a 200,000-field flood
    /// left 7,000 buckets in a 7,000-slot cluster, swept at one or two per 10 ms tick). Under
    /// a new order their homes are spread evenly again, whatever picked them.
    fn maybe_shrink(&mut self) {
        let current = &self.current;
        if self.old.is_none()
            && current.slots > MIN_SLOTS
            && current.len.saturating_mul(SHRINK_BELOW_ONE_IN) < current.slots
            && slots_for(current.len) < current.slots
        {
            self.start_migration(slots_for(current.len), reordered(current.order));
        }
    }

    /// Moves up to `budget` slots of any migration on, then looks at up to `budget` slots of
    /// the current array from where the last sweep stopped and removes the buckets full at
    /// `now_ns`, returning their tags (for the caller to replicate). An unallocated chunk
    /// counts as one slot. Migrating here is what lets a table that receives no writes finish
    /// a shrink, and so give its old array back.
    pub fn sweep(&mut self, now_ns: u64, budget: usize) -> Vec<Tag> {
        self.sweep_counted(now_ns, budget).0
    }

    /// As [`Table::sweep`], also returning the slots looked at (and migrated). Stops at the
    /// end of the current array, so a small table is never looked at twice in one call.
    ///
    /// The budget counts every slot read: each slot looked at, and each slot a removal
    /// shifts back. So a call reads at most `2 × budget` slots plus the rest of one cluster
    /// (the removal that crosses the budget finishes): its work does not depend on how many
    /// of the slots hold full buckets, nor on how long the table's clusters are.
    pub fn sweep_counted(&mut self, now_ns: u64, budget: usize) -> (Vec<Tag>, usize) {
        let migrating = self.old.is_some();
        self.migrate(budget);
        let used = if migrating { budget } else { 0 };
        let mut swept = Vec::new();
        let mut read = 0;
        while read < budget {
            let array = &mut self.current;
            if self.sweep_at >= array.slots {
                self.sweep_at = 0;
                self.sweep_passes = self.sweep_passes.wrapping_add(1);
                if self.pass_whole && self.old.is_none() {
                    self.earliest_full_ns = self.pass_earliest_ns;
                }
                self.begin_pass();
                break;
            }
            read += 1;
            let i = self.sweep_at;
            let (chunk, offset) = array.locate(i);
            if offset == 0 && !array.chunks.is_allocated(chunk) {
                self.sweep_at = i + array.chunk_len;
                continue;
            }
            let held_until_ns = match array.state(i) {
                Some(state) if is_full(state, now_ns) => self
                    .reservations
                    .get(&array.slot(i).tag())
                    .and_then(|records| latest_lapse_ns(records))
                    .filter(|&lapse_ns| lapse_ns > now_ns),
                _ => None,
            };
            if let Some(lapse_ns) = held_until_ns {
                // Full, but a record is open: kept until it lapses, looked at again then.
                self.pass_earliest_ns = self.pass_earliest_ns.min(lapse_ns);
                self.sweep_at = i + 1;
                continue;
            }
            match array.state(i) {
                Some(state) if is_full(state, now_ns) => {
                    let tag = array.slot(i).tag();
                    self.reservations.remove(&tag);
                    swept.push(tag);
                    // The cluster shifts back into `i`, so look at `i` again next.
                    read = read.saturating_add(array.remove_at(i));
                }
                Some(state) => {
                    self.pass_earliest_ns = self.pass_earliest_ns.min(state.full_at_ns());
                    self.sweep_at = i + 1;
                }
                None => self.sweep_at = i + 1,
            }
        }
        self.maybe_shrink();
        (swept, used + read)
    }

    /// Moves the sweep back to the first slot, so a caller that then sweeps until
    /// [`Table::sweep_passes`] changes has looked at every slot (a migration started on the
    /// way moves it back to the first slot of the new array, which it then walks whole).
    pub fn restart_sweep(&mut self) {
        self.sweep_at = 0;
        self.begin_pass();
    }

    fn begin_pass(&mut self) {
        self.pass_earliest_ns = u64::MAX;
        self.pass_whole = self.old.is_none();
    }

    /// How many sweeps have reached the end of the current array (wrapping).
    pub fn sweep_passes(&self) -> u64 {
        self.sweep_passes
    }

    /// Whether a migration (growth or shrink) is under way.
    pub fn is_migrating(&self) -> bool {
        self.old.is_some()
    }

    /// Every bucket, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (Tag, State)> + '_ {
        let old = self
            .old
            .as_ref()
            .map(|m| m.array.entries(m.passed))
            .into_iter()
            .flatten();
        self.current.entries(0).chain(old)
    }

    /// Calls `f` with every bucket as encoding version 2 writes it, in no particular order
    /// (the same buckets as [`Table::entries`]).
    fn for_each_record(&self, mut f: impl FnMut(Record)) {
        self.current.for_each_record(0, &mut f);
        if let Some(m) = &self.old {
            m.array.for_each_record(m.passed, &mut f);
        }
    }

    /// Every bucket, sorted by tag: the serialized order, which no history changes.
    pub fn sorted_entries(&self) -> Vec<(Tag, State)> {
        let mut entries: Vec<(Tag, State)> = self.entries().collect();
        entries.sort_unstable_by_key(|&(tag, _)| tag);
        entries
    }

    /// Buckets not full at `now_ns`. O(N): for tests and tools, not for commands.
    pub fn live(&self, now_ns: u64) -> usize {
        self.entries()
            .filter(|&(_, state)| !is_full(state, now_ns))
            .count()
    }

    /// Bytes this table owns, itself included.
    pub fn mem_bytes(&self) -> usize {
        // A B-tree entry: the tag, the list's header and its records, about 1.5 times over
        // for the nodes' spare room.
        let entry = size_of::<Tag>() + size_of::<Vec<Reservation>>();
        let records: usize = self
            .reservations
            .values()
            .map(|r| entry + r.capacity() * size_of::<Reservation>())
            .sum();
        size_of::<Self>()
            + records.saturating_add(records / 2)
            + self.current.mem_bytes()
            + self
                .old
                .as_ref()
                .map_or(0, |m| size_of::<Migration>() + m.array.mem_bytes())
    }

    /// Allocations a free releases, for the server's lazy-free decision.
    pub fn allocations(&self) -> usize {
        let count = |a: &Array| a.chunks.allocations() + a.fracs.allocations();
        1 + count(&self.current)
            + self.old.as_ref().map_or(0, |m| count(&m.array))
            + self.reservations.len()
    }
}

/// The RDB encoding of a table written by this build (version 2): the bucket count as an
/// unsigned field, then the buckets as string fields of [`BLOCK_RECORDS`] records each (the
/// last holds the rest), in [`Table::ordered_records`] order. A record is [`RECORD_BYTES`]
/// bytes, little-endian: the tag's low 64 bits, its high 64 bits, `full_at_ns`,
/// `full_at_frac`. A few large strings instead of three fields per bucket, and an order found
/// in linear time instead of a sort by tag: version 1 (a count, then per bucket in tag order
/// the 16-byte tag and two unsigned fields) cost about 700 ns a bucket to write and 900 ns to
/// load.
///
/// Version 3 is version 2 followed by the reservation records (`RL.HRESERVE`): an unsigned
/// count (0 for a table without any, the common case: one field more per table), then string
/// fields of up to [`BLOCK_RECORDS`] records of [`RESV_RECORD_BYTES`] bytes each, grouped by
/// bucket in the tag order of version 2 (see [`ResvRecord`]). Versions 1 and 2 still load.
pub const ENCODING_VERSION: i32 = 3;

/// The encoding without reservation records.
const ENCODING_V2: i32 = 2;

/// Bytes per reservation record of encoding version 3: the tag's low and high 64 bits, the
/// expiry in µs, the estimate's digits (low and high 64 bits) and its signed exponent (32
/// bits), the id's length (1 byte) and the id, padded with zeros to 16 bytes. Little-endian.
pub const RESV_RECORD_BYTES: usize = 8 + 8 + 8 + 16 + 4 + 1 + MAX_LEASE_ID_BYTES;

/// Bytes per record of encoding version 2.
pub const RECORD_BYTES: usize = 32;
/// Records per string field of encoding version 2: 32,768, so a field is 1 MiB.
pub const BLOCK_RECORDS: usize = 32_768;

/// One bucket as encoding version 2 writes it.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Record {
    lo: u64,
    hi: u64,
    full_at_ns: u64,
    full_at_frac: u64,
}

impl Record {
    fn tag(self) -> Tag {
        (u128::from(self.hi) << 64) | u128::from(self.lo)
    }

    /// The order written: by the tag's low half, then its high half.
    fn key(self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    fn write(self, out: &mut Vec<u8>) {
        for word in [self.lo, self.hi, self.full_at_ns, self.full_at_frac] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }

    fn read(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<u64> {
            let b: [u8; 8] = bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?;
            Some(u64::from_le_bytes(b))
        };
        Some(Record {
            lo: word(0)?,
            hi: word(1)?,
            full_at_ns: word(2)?,
            full_at_frac: word(3)?,
        })
    }
}

impl Table {
    /// Every bucket ordered by its tag's low 64 bits, then its high 64 bits: the order that
    /// encoding version 2, the digest and the AOF rewrite use, which no history changes.
    /// Linear time for tags spread as hashes are: a counting pass on the top bits of the low
    /// half places each bucket in its range (one or two buckets a range, up to 4 million
    /// ranges: 32 MB beside the 320 MB of records of a 10-million-bucket table), and each
    /// range is sorted on its own. Tags chosen to share those bits cost a sort of their
    /// range, as a sort of the whole table did before. Both passes read the slots chunk by
    /// chunk ([`Table::for_each_record`]).
    fn ordered_records(&self) -> Vec<Record> {
        let n = self.len();
        let bits = (usize::BITS - n.leading_zeros()).clamp(1, 22);
        let shift = 64 - bits;
        let range = |record: &Record| (record.lo >> shift) as usize;
        // starts[r + 1] counts range r, then holds where range r + 1 begins.
        let mut starts = vec![0usize; (1usize << bits) + 1];
        self.for_each_record(|record| {
            if let Some(count) = starts.get_mut(range(&record) + 1) {
                *count += 1;
            }
        });
        let mut total = 0usize;
        for start in starts.iter_mut() {
            total = total.saturating_add(*start);
            *start = total;
        }
        // Now starts[r + 1] is where range r ends; fill each range from its end backwards.
        let mut out = vec![Record::default(); n];
        self.for_each_record(|record| {
            if let Some(end) = starts.get_mut(range(&record) + 1) {
                *end = end.saturating_sub(1);
                if let Some(place) = out.get_mut(*end) {
                    *place = record;
                }
            }
        });
        // starts[r + 1] is now where range r begins, so range r ends where range r + 1
        // begins, or at the end for the last.
        for r in 0..1usize << bits {
            let from = starts.get(r + 1).copied().unwrap_or(n);
            let to = starts.get(r + 2).copied().unwrap_or(n);
            if let Some(slice) = out.get_mut(from..to) {
                if slice.len() > 1 {
                    slice.sort_unstable_by_key(|r| r.key());
                }
            }
        }
        out
    }

    /// Every bucket in the order encoding version 2 writes them (see
    /// [`Table::ordered_records`]).
    pub fn ordered_entries(&self) -> impl Iterator<Item = (Tag, State)> {
        self.ordered_records().into_iter().filter_map(|record| {
            State::from_parts(record.full_at_ns, record.full_at_frac).map(|s| (record.tag(), s))
        })
    }

    /// Writes the table in encoding version 2: passes the bucket count to `count`, then each
    /// string field, in order, to `block`.
    pub fn encode(&self, mut count: impl FnMut(u64), mut block: impl FnMut(&[u8])) {
        let records = self.ordered_records();
        count(records.len() as u64);
        let mut bytes = Vec::with_capacity(records.len().min(BLOCK_RECORDS) * RECORD_BYTES);
        for chunk in records.chunks(BLOCK_RECORDS) {
            bytes.clear();
            for record in chunk {
                record.write(&mut bytes);
            }
            block(&bytes);
        }
        let resv = self.ordered_resv_records();
        count(resv.len() as u64);
        for chunk in resv.chunks(BLOCK_RECORDS) {
            bytes.clear();
            for record in chunk {
                record.write(&mut bytes);
            }
            block(&bytes);
        }
    }

    /// Every reservation record, grouped by bucket in the order of
    /// [`Table::ordered_records`] (the tag's low half, then its high half), each bucket's
    /// records in the order held.
    fn ordered_resv_records(&self) -> Vec<ResvRecord> {
        let mut tags: Vec<Tag> = self.reservations.keys().copied().collect();
        tags.sort_unstable_by_key(|&tag| (tag as u64, (tag >> 64) as u64));
        tags.iter()
            .flat_map(|&tag| {
                self.records(tag).iter().map(move |record| ResvRecord {
                    tag,
                    record: *record,
                })
            })
            .collect()
    }
}

/// One reservation record as encoding version 3 writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ResvRecord {
    tag: Tag,
    record: Reservation,
}

impl ResvRecord {
    /// The order of the buckets written: as [`Record::key`].
    fn key(&self) -> (u64, u64) {
        (self.tag as u64, (self.tag >> 64) as u64)
    }

    fn write(&self, out: &mut Vec<u8>) {
        let (lo, hi) = self.key();
        let (digits, exp10) = self.record.estimate.exact().parts();
        for word in [lo, hi, self.record.expires_at_us] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&digits.to_le_bytes());
        out.extend_from_slice(&exp10.to_le_bytes());
        let id = self.record.id.as_bytes();
        let mut padded = [0u8; MAX_LEASE_ID_BYTES];
        for (to, from) in padded.iter_mut().zip(id) {
            *to = *from;
        }
        out.push(u8::try_from(id.len()).unwrap_or(0));
        out.extend_from_slice(&padded);
    }

    /// Reads one record, checking every field: an id of 1 to 16 bytes padded with zeros, an
    /// estimate in the canonical form of a decimal above 0 that a command could have taken,
    /// an expiry in range.
    fn read(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let (lo, hi, expires_at_us) = (word(0)?, word(8)?, word(16)?);
        let digits = u128::from_le_bytes(bytes.get(24..40)?.try_into().ok()?);
        let exp10 = i32::from_le_bytes(bytes.get(40..44)?.try_into().ok()?);
        let id_len = usize::from(*bytes.get(44)?);
        let padded = bytes.get(45..45 + MAX_LEASE_ID_BYTES)?;
        let id = padded.get(..id_len)?;
        if padded.get(id_len..)?.iter().any(|&b| b != 0) {
            return None;
        }
        let id = LeaseId::new(id)?;
        let estimate = Cost::parse(format!("{digits}e{exp10}").as_bytes())
            .filter(|cost| cost.exact().parts() == (digits, exp10))?;
        Some(ResvRecord {
            tag: (u128::from(hi) << 64) | u128::from(lo),
            record: Reservation::new(id, estimate, expires_at_us)?,
        })
    }
}

/// Why a stored table was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// An encoding version this build does not know.
    Version,
    /// A short or mistyped read.
    Io,
    /// A count of 0 (never written) or past [`MAX_BUCKETS`].
    Count,
    /// A tag not exactly 16 bytes (version 1), or a block not the length its count asks
    /// for (version 2).
    TagLength,
    /// Tags not strictly increasing in the encoding's order: out of order or repeated.
    Order,
    /// A state out of range.
    Range,
}

/// Decodes a stored table. `next_unsigned` and `next_bytes` yield the next field, or `None`
/// on an I/O error. Pure, so fuzzers drive it with arbitrary input. Reads at most
/// `count` entries and allocates as it reads, so a lying count costs little up front (the
/// array's directory: one pointer per 131,072 slots).
///
/// # Errors
/// A [`DecodeError`] for anything but a table this build or an earlier one writes.
pub fn decode(
    encver: i32,
    mut next_unsigned: impl FnMut() -> Option<u64>,
    next_bytes: impl FnMut() -> Option<Vec<u8>>,
) -> Result<Table, DecodeError> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return Err(DecodeError::Version);
    }
    let count = next_unsigned().ok_or(DecodeError::Io)?;
    let count = usize::try_from(count)
        .ok()
        .filter(|&c| (1..=MAX_BUCKETS).contains(&c))
        .ok_or(DecodeError::Count)?;
    if encver == 1 {
        return decode_v1(count, next_unsigned, next_bytes);
    }
    let mut next_bytes = next_bytes;
    let mut table = decode_v2(count, &mut next_bytes)?;
    if encver > ENCODING_V2 {
        decode_reservations(&mut table, next_unsigned, next_bytes)?;
    }
    Ok(table)
}

/// Version 3's records after the buckets: each names a bucket held, buckets in increasing
/// order, at most [`MAX_RESERVATIONS`] each, each id once per bucket.
fn decode_reservations(
    table: &mut Table,
    mut next_unsigned: impl FnMut() -> Option<u64>,
    mut next_bytes: impl FnMut() -> Option<Vec<u8>>,
) -> Result<(), DecodeError> {
    let count = next_unsigned().ok_or(DecodeError::Io)?;
    let mut remaining = usize::try_from(count)
        .ok()
        .filter(|&c| c <= table.len().saturating_mul(MAX_RESERVATIONS))
        .ok_or(DecodeError::Count)?;
    let mut group: Option<(Tag, Vec<Reservation>)> = None;
    let finish = |table: &mut Table, group: Option<(Tag, Vec<Reservation>)>| match group {
        None => Ok(()),
        Some((tag, records)) if rl_bucket::valid_records(&records) => table
            .set_records(tag, records)
            .then_some(())
            .ok_or(DecodeError::Order),
        Some(_) => Err(DecodeError::Range),
    };
    while remaining > 0 {
        let records = remaining.min(BLOCK_RECORDS);
        let bytes = next_bytes().ok_or(DecodeError::Io)?;
        if Some(bytes.len()) != records.checked_mul(RESV_RECORD_BYTES) {
            return Err(DecodeError::TagLength);
        }
        for raw in bytes.chunks_exact(RESV_RECORD_BYTES) {
            let read = ResvRecord::read(raw).ok_or(DecodeError::Range)?;
            match &mut group {
                Some((tag, records)) if *tag == read.tag => records.push(read.record),
                _ => {
                    let last = group.as_ref().map(|(tag, _)| *tag);
                    if last.is_some_and(|last| (last as u64, (last >> 64) as u64) >= read.key()) {
                        return Err(DecodeError::Order);
                    }
                    finish(table, group.take())?;
                    group = Some((read.tag, vec![read.record]));
                }
            }
        }
        remaining = remaining.saturating_sub(records);
    }
    finish(table, group)
}

/// Version 1: per bucket, in tag order, a 16-byte tag and two unsigned fields.
fn decode_v1(
    count: usize,
    mut next_unsigned: impl FnMut() -> Option<u64>,
    mut next_bytes: impl FnMut() -> Option<Vec<u8>>,
) -> Result<Table, DecodeError> {
    let mut entries: Vec<(Tag, State)> = Vec::with_capacity(count.min(4096));
    let mut last: Option<Tag> = None;
    for _ in 0..count {
        let bytes = next_bytes().ok_or(DecodeError::Io)?;
        let bytes: [u8; 16] = bytes.try_into().map_err(|_| DecodeError::TagLength)?;
        let tag = Tag::from_le_bytes(bytes);
        if last.is_some_and(|last| last >= tag) {
            return Err(DecodeError::Order);
        }
        last = Some(tag);
        let full_at_ns = next_unsigned().ok_or(DecodeError::Io)?;
        let full_at_frac = next_unsigned().ok_or(DecodeError::Io)?;
        let state = State::from_parts(full_at_ns, full_at_frac).ok_or(DecodeError::Range)?;
        entries.push((tag, state));
    }
    Ok(Table::from_entries(&entries))
}

/// Version 2: blocks of records, strictly increasing by (low half, high half) of the tag.
/// The buckets go straight into an array sized for `count`, of slot order 0, where a
/// tag's home grows with its low half: so they land in increasing slots, one pass over the
/// memory.
fn decode_v2(
    count: usize,
    mut next_bytes: impl FnMut() -> Option<Vec<u8>>,
) -> Result<Table, DecodeError> {
    let mut table = Table::new();
    table.current = Array::new(slots_for(count), 0);
    let mut remaining = count;
    let mut last: Option<(u64, u64)> = None;
    while remaining > 0 {
        let records = remaining.min(BLOCK_RECORDS);
        let bytes = next_bytes().ok_or(DecodeError::Io)?;
        if Some(bytes.len()) != records.checked_mul(RECORD_BYTES) {
            return Err(DecodeError::TagLength);
        }
        for raw in bytes.chunks_exact(RECORD_BYTES) {
            let record = Record::read(raw).ok_or(DecodeError::TagLength)?;
            if last.is_some_and(|last| last >= record.key()) {
                return Err(DecodeError::Order);
            }
            last = Some(record.key());
            let state = State::from_parts(record.full_at_ns, record.full_at_frac)
                .ok_or(DecodeError::Range)?;
            table.current.insert_absent(record.tag(), state);
            table.note_stored(state);
        }
        remaining = remaining.saturating_sub(records);
    }
    Ok(table)
}

#[cfg(test)]
mod tests;
