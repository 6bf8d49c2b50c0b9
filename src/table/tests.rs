//! The table against a `HashMap<field, State>` model: the same bucket steps on both stores,
//! so any difference is the table's (lookups across migrations, shifts on removal, sweeps).

use std::cell::Cell;
use std::collections::HashMap;

use proptest::prelude::*;
use rl_bucket::{Change, Cost, Limit};

use super::*;

thread_local! {
    /// Slots read by this thread (`Array::slot`): the work a call does, counted apart from
    /// the budget accounting it is checked against.
    pub(super) static SLOT_READS: Cell<usize> = const { Cell::new(0) };
}

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Op {
    Take(u16, u8),
    Peek(u16, u8),
    Refund(u16, u8),
    Delete(u16),
    /// Moves the clock forward by this many milliseconds.
    Advance(u32),
    /// A sweep of this many slots.
    Sweep(u16),
}

fn op(fields: u16) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..fields, 0u8..4).prop_map(|(f, c)| Op::Take(f, c)),
        2 => (0..fields, 0u8..4).prop_map(|(f, c)| Op::Peek(f, c)),
        2 => (0..fields, 0u8..4).prop_map(|(f, c)| Op::Refund(f, c)),
        2 => (0..fields).prop_map(Op::Delete),
        1 => (0u32..3000).prop_map(Op::Advance),
        1 => (0u16..2000).prop_map(Op::Sweep),
    ]
}

fn field(i: u16) -> Vec<u8> {
    format!("client:{i:05}").into_bytes()
}

/// A store the steps run on: the table under test or the model.
trait Buckets {
    fn get(&self, field: &[u8]) -> Option<State>;
    fn put(&mut self, field: &[u8], change: Change);
}

impl Buckets for Table {
    fn get(&self, field: &[u8]) -> Option<State> {
        Table::get(self, tag(field))
    }
    fn put(&mut self, field: &[u8], change: Change) {
        match change {
            Change::Keep => {}
            Change::Set(state) => self.set(tag(field), state).unwrap(),
            Change::Delete => {
                self.remove(tag(field));
            }
        }
    }
}

impl Buckets for HashMap<Vec<u8>, State> {
    fn get(&self, field: &[u8]) -> Option<State> {
        HashMap::get(self, field).copied()
    }
    fn put(&mut self, field: &[u8], change: Change) {
        match change {
            Change::Keep => {}
            Change::Set(state) => {
                self.insert(field.to_vec(), state);
            }
            Change::Delete => {
                self.remove(field);
            }
        }
    }
}

/// Runs one op on a store, returning what a command would reply.
fn step(store: &mut impl Buckets, limit: &Limit, now_us: u64, op: &Op) -> Option<String> {
    let cost = |c: u8| Cost::new(f64::from(c)).unwrap();
    match *op {
        Op::Take(f, c) => {
            let f = field(f);
            let (decision, new) = rl_bucket::acquire(limit, store.get(&f), now_us, cost(c));
            store.put(&f, new.map_or(Change::Keep, Change::Set));
            Some(format!("{decision:?}"))
        }
        Op::Peek(f, c) => Some(format!(
            "{:?}",
            rl_bucket::peek(limit, store.get(&field(f)), now_us, cost(c))
        )),
        Op::Refund(f, c) => {
            let f = field(f);
            let (decision, change) = rl_bucket::refund(limit, store.get(&f), now_us, cost(c));
            store.put(&f, change);
            Some(format!("{decision:?}"))
        }
        Op::Delete(f) => {
            let f = field(f);
            let live = store.get(&f).is_some_and(|s| !is_full(s, now_us * 1000));
            store.put(&f, Change::Delete);
            Some(format!("deleted live {live}"))
        }
        Op::Advance(_) | Op::Sweep(_) => None,
    }
}

fn run(limit: &Limit, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut table = Table::new();
    let mut model: HashMap<Vec<u8>, State> = HashMap::new();
    let mut now_us: u64 = 1_700_000_000_000_000;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance(ms) => now_us += u64::from(ms) * 1000,
            Op::Sweep(budget) => {
                for swept in table.sweep(now_us * 1000, usize::from(budget)) {
                    // Only buckets full now may go, and only buckets the model holds.
                    let held = model.iter().find(|(f, _)| tag(f) == swept);
                    let (f, state) = held.expect("swept a tag the model lacks");
                    prop_assert!(is_full(*state, now_us * 1000), "swept a live bucket");
                    let f = f.clone();
                    model.remove(&f);
                }
            }
            _ => {
                let want = step(&mut model, limit, now_us, op);
                let got = step(&mut table, limit, now_us, op);
                prop_assert_eq!(got, want, "op {} {:?}", i, op);
            }
        }
        let live_model = model
            .values()
            .filter(|s| !is_full(**s, now_us * 1000))
            .count();
        prop_assert_eq!(table.live(now_us * 1000), live_model, "live after op {}", i);
        prop_assert_eq!(table.len(), model.len(), "held after op {}", i);
        // The bound a sweeper relies on: no bucket fills before the earliest instant.
        let earliest = model.values().map(|s| s.full_at_ns()).min();
        prop_assert!(
            earliest.is_none_or(|e| table.earliest_full_ns() <= e),
            "earliest after op {}",
            i
        );
    }
    // Every bucket the model holds, the table holds, with the same state.
    for (f, state) in &model {
        prop_assert_eq!(table.get(tag(f)), Some(*state));
    }
    // Two whole sweep passes after any migration leave exactly the live buckets. (A call's
    // budget counts the slots its removals shift back, so a pass may take several calls.)
    let slots = table.current.slots + table.old.as_ref().map_or(0, |m| m.array.slots);
    table.migrate(usize::MAX);
    let passes = table.sweep_passes();
    for _ in 0..10_000 {
        if table.sweep_passes().wrapping_sub(passes) >= 2 && !table.is_migrating() {
            break;
        }
        table.migrate(usize::MAX);
        table.sweep(now_us * 1000, slots * 2);
    }
    prop_assert_eq!(table.len(), table.live(now_us * 1000));
    // A pass from the first slot with no migration and no removal but its own sees every
    // bucket, so the bound it leaves is exact.
    table.migrate(usize::MAX);
    table.restart_sweep();
    let passes = table.sweep_passes();
    while table.sweep_passes() == passes {
        table.sweep(now_us * 1000, slots * 2);
    }
    prop_assume!(!table.is_migrating());
    let earliest = table.entries().map(|(_, s)| s.full_at_ns()).min();
    prop_assert_eq!(table.earliest_full_ns(), earliest.unwrap_or(u64::MAX));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A few hot fields: probe chains, shifts and refills at 3/s (a fraction) and 10/s.
    #[test]
    fn table_agrees_with_a_hashmap_on_few_fields(
        ops in proptest::collection::vec(op(40), 1..400),
        fraction in any::<bool>(),
    ) {
        let limit = Limit::new(if fraction { 3.0 } else { 10.0 }, 5.0).unwrap();
        run(&limit, &ops)?;
    }

    /// Thousands of fields: growth past one chunk, migrations under load, shrinking.
    #[test]
    fn table_agrees_with_a_hashmap_through_growth_and_shrinking(
        ops in proptest::collection::vec(op(5000), 2000..4000),
    ) {
        let limit = Limit::new(7.0, 3.0).unwrap();
        run(&limit, &ops)?;
    }
}

#[test]
fn a_table_grows_without_a_full_rehash_and_shrinks_back() {
    let state = State::from_full_at_ns(2_000_000_000_000_000_000).unwrap();
    let mut table = Table::new();
    let n = 200_000u32;
    let mut longest_migration = 0;
    for i in 0..n {
        table.set(tag(&i.to_le_bytes()), state).unwrap();
        if let Some(m) = &table.old {
            longest_migration = longest_migration.max(m.passed);
        }
    }
    assert_eq!(table.len(), n as usize);
    for i in 0..n {
        assert_eq!(table.get(tag(&i.to_le_bytes())), Some(state), "{i}");
    }
    // Load stays between the target and the maximum once past the smallest sizes.
    table.migrate(usize::MAX);
    let load = table.len() * 100 / table.current.slots;
    assert!(
        (TARGET_LOAD_PCT - 1..=MAX_LOAD_PCT).contains(&load),
        "{load}"
    );
    for i in 0..n {
        assert_eq!(table.remove(tag(&i.to_le_bytes())), Some(state), "{i}");
    }
    for _ in 0..100 {
        table.migrate(usize::MAX);
        table.sweep(0, 1);
    }
    assert!(table.is_empty());
    assert!(table.mem_bytes() < 4096, "{}", table.mem_bytes());
}

#[test]
fn bytes_per_bucket_of_a_256th_of_a_million() {
    // The shape the memory budget names: 1,000,000 buckets over 256 keys.
    let mut table = Table::new();
    let whole = State::from_full_at_ns(2_000_000_000_000_000_000).unwrap();
    for i in 0..3906u32 {
        table
            .set(tag(format!("{i:016}").as_bytes()), whole)
            .unwrap();
    }
    table.migrate(usize::MAX);
    let per_bucket = table.mem_bytes() as f64 / 3906.0;
    assert!(per_bucket <= 34.0, "{per_bucket}");
    let fraction = State::from_parts(2_000_000_000_000_000_000, 1).unwrap();
    for i in 0..3906u32 {
        table
            .set(tag(format!("{i:016}").as_bytes()), fraction)
            .unwrap();
    }
    let per_bucket = table.mem_bytes() as f64 / 3906.0;
    assert!(per_bucket <= 45.0, "{per_bucket}");
}

#[test]
fn size_classes_match_jemalloc() {
    let rows = [
        (1, 8),
        (9, 16),
        (129, 160),
        (192, 192),
        (24480, 24576),
        (24577, 28672),
        (6144, 6144),
    ];
    for (bytes, class) in rows {
        assert_eq!(size_class(bytes), class, "{bytes}");
    }
}

#[test]
fn decode_accepts_only_what_is_written() {
    let a = State::from_full_at_ns(5).unwrap();
    type Row = (
        i32,
        Vec<Option<u64>>,
        Vec<Option<Vec<u8>>>,
        Result<usize, DecodeError>,
    );
    let tag_bytes = |t: u128| Some(t.to_le_bytes().to_vec());
    let rows: Vec<Row> = vec![
        // one bucket
        (
            1,
            vec![Some(1), Some(5), Some(0)],
            vec![tag_bytes(7)],
            Ok(1),
        ),
        // two, in tag order
        (
            1,
            vec![Some(2), Some(5), Some(0), Some(6), Some(3)],
            vec![tag_bytes(7), tag_bytes(8)],
            Ok(2),
        ),
        // out of order
        (
            1,
            vec![Some(2), Some(5), Some(0), Some(6), Some(0)],
            vec![tag_bytes(8), tag_bytes(7)],
            Err(DecodeError::Order),
        ),
        // repeated
        (
            1,
            vec![Some(2), Some(5), Some(0), Some(6), Some(0)],
            vec![tag_bytes(7), tag_bytes(7)],
            Err(DecodeError::Order),
        ),
        // empty tables are never written
        (1, vec![Some(0)], vec![], Err(DecodeError::Count)),
        // past the cap
        (
            1,
            vec![Some(MAX_BUCKETS as u64 + 1)],
            vec![],
            Err(DecodeError::Count),
        ),
        // a lying count: the stream ends
        (
            1,
            vec![Some(1000), Some(5), Some(0)],
            vec![tag_bytes(7)],
            Err(DecodeError::Io),
        ),
        // a short tag
        (
            1,
            vec![Some(1), Some(5), Some(0)],
            vec![Some(vec![1, 2, 3])],
            Err(DecodeError::TagLength),
        ),
        // zero instant, fraction past range
        (
            1,
            vec![Some(1), Some(0), Some(0)],
            vec![tag_bytes(7)],
            Err(DecodeError::Range),
        ),
        (
            1,
            vec![Some(1), Some(5), Some(u64::MAX)],
            vec![tag_bytes(7)],
            Err(DecodeError::Range),
        ),
        // unknown versions
        (0, vec![Some(1)], vec![], Err(DecodeError::Version)),
        (4, vec![Some(1)], vec![], Err(DecodeError::Version)),
    ];
    for (encver, unsigned, buffers, want) in rows {
        let mut u = unsigned.clone().into_iter();
        let mut b = buffers.into_iter();
        let got = decode(encver, || u.next().flatten(), || b.next().flatten()).map(|t| t.len());
        assert_eq!(got, want, "{encver} {unsigned:?}");
    }
    let mut u = [1u64, 5, 0].into_iter();
    let mut b = [7u128.to_le_bytes().to_vec()].into_iter();
    let table = decode(1, || u.next(), || b.next()).unwrap();
    assert_eq!(table.get(7), Some(a));
}

/// A table of `n` buckets of random tags, a third with fractions, written in encoding version
/// 2: the count and the blocks.
fn encoded(table: &Table) -> (u64, Vec<Vec<u8>>) {
    let mut counts = Vec::new();
    let mut blocks = Vec::new();
    table.encode(|c| counts.push(c), |block| blocks.push(block.to_vec()));
    // Version 3's count of reservation records follows: none in these tables.
    assert_eq!(counts[1..], [0]);
    (counts[0], blocks)
}

fn random_table(n: usize, seed: u64) -> Table {
    let mut table = Table::new();
    let mut x = seed;
    for i in 0..n {
        // splitmix64
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let tag = (u128::from(next()) << 64) | u128::from(next());
        let frac = if i % 3 == 0 { i as u64 + 1 } else { 0 };
        let state = State::from_parts(1_000 + i as u64, frac).unwrap();
        table.set(tag, state).unwrap();
    }
    table
}

fn decode_v2_blocks(count: u64, blocks: &[Vec<u8>]) -> Result<Table, DecodeError> {
    let mut u = std::iter::once(count);
    let mut b = blocks.iter().cloned();
    decode(2, || u.next(), || b.next())
}

#[test]
fn encoding_two_round_trips_in_blocks_and_in_order() {
    // 70,000 buckets: two full blocks and a partial one.
    let table = random_table(70_000, 1);
    let (count, blocks) = encoded(&table);
    assert_eq!(count, 70_000);
    let lens: Vec<usize> = blocks.iter().map(Vec::len).collect();
    assert_eq!(
        lens,
        vec![
            BLOCK_RECORDS * RECORD_BYTES,
            BLOCK_RECORDS * RECORD_BYTES,
            (70_000 - 2 * BLOCK_RECORDS) * RECORD_BYTES
        ]
    );
    let loaded = decode_v2_blocks(count, &blocks).unwrap();
    assert_eq!(loaded.len(), table.len());
    assert_eq!(loaded.sorted_entries(), table.sorted_entries());
    // The order: by low half, then high half, strictly increasing.
    let keys: Vec<(u64, u64)> = table
        .ordered_entries()
        .map(|(tag, _)| (tag as u64, (tag >> 64) as u64))
        .collect();
    assert_eq!(keys.len(), 70_000);
    assert!(keys.windows(2).all(|w| w[0] < w[1]));
    // Loaded and written again: the same bytes.
    assert_eq!(encoded(&loaded), (count, blocks));
}

#[test]
fn encoding_two_does_not_depend_on_history() {
    // The same buckets reached by other paths: inserted in another order, and with buckets
    // added then removed (growths, a shrink to another slot order, a migration under way).
    let want = random_table(20_000, 7);
    let entries = want.sorted_entries();
    let mut other = Table::new();
    for &(tag, state) in entries.iter().rev() {
        other.set(tag, state).unwrap();
    }
    let mut churned = random_table(150_000, 9);
    for (tag, _) in churned.sorted_entries() {
        churned.remove(tag);
    }
    for &(tag, state) in &entries {
        churned.set(tag, state).unwrap();
    }
    assert_eq!(encoded(&other), encoded(&want));
    assert_eq!(encoded(&churned), encoded(&want));
}

#[test]
fn encoding_two_refuses_corrupt_and_truncated_blocks() {
    let table = random_table(40_000, 3);
    let (count, blocks) = encoded(&table);
    let last = blocks.len() - 1;
    let with = |f: &dyn Fn(&mut Vec<Vec<u8>>)| {
        let mut b = blocks.clone();
        f(&mut b);
        decode_v2_blocks(count, &b).map(|t| t.len())
    };
    let word = |b: &mut Vec<Vec<u8>>, block: usize, record: usize, w: usize, v: u64| {
        let at = record * RECORD_BYTES + w * 8;
        b[block][at..at + 8].copy_from_slice(&v.to_le_bytes());
    };
    let rows: Vec<(&str, Result<usize, DecodeError>)> = vec![
        ("as written", with(&|_| {})),
        ("a block missing", with(&|b| drop(b.pop()))),
        (
            "a block cut short by one byte",
            with(&|b| {
                b[last].pop();
            }),
        ),
        (
            "a block cut at a record",
            with(&|b| b[0].truncate(RECORD_BYTES * 100)),
        ),
        ("a block one byte long", with(&|b| b[0].push(0))),
        ("an empty block", with(&|b| b[last].clear())),
        (
            "two records swapped",
            with(&|b| {
                let (x, y) = b[0].split_at_mut(RECORD_BYTES);
                x.swap_with_slice(&mut y[..RECORD_BYTES]);
            }),
        ),
        (
            "a record repeated",
            with(&|b| {
                let first = b[0][..RECORD_BYTES].to_vec();
                b[0][RECORD_BYTES..2 * RECORD_BYTES].copy_from_slice(&first);
            }),
        ),
        (
            "a block's first record below the last one before",
            with(&|b| word(b, 1, 0, 0, 0)),
        ),
        ("a zero instant", with(&|b| word(b, 0, 5, 2, 0))),
        ("an instant past i64", with(&|b| word(b, 0, 5, 2, u64::MAX))),
        (
            "a fraction past range",
            with(&|b| word(b, last, 0, 3, u64::MAX)),
        ),
    ];
    let got: Vec<_> = rows.iter().map(|(_, r)| *r).collect();
    let want = vec![
        Ok(40_000),
        Err(DecodeError::Io),
        Err(DecodeError::TagLength),
        Err(DecodeError::TagLength),
        Err(DecodeError::TagLength),
        Err(DecodeError::TagLength),
        Err(DecodeError::Order),
        Err(DecodeError::Order),
        Err(DecodeError::Order),
        Err(DecodeError::Range),
        Err(DecodeError::Range),
        Err(DecodeError::Range),
    ];
    for ((name, got), want) in rows.iter().map(|(n, _)| n).zip(got).zip(want) {
        assert_eq!(got, want, "{name}");
    }
    // A count the blocks do not match: the last block is then too short or too long.
    assert_eq!(
        decode_v2_blocks(count + 1, &blocks).map(|t| t.len()),
        Err(DecodeError::TagLength)
    );
    assert_eq!(
        decode_v2_blocks(count - 1, &blocks).map(|t| t.len()),
        Err(DecodeError::TagLength)
    );
    assert_eq!(
        decode_v2_blocks(0, &blocks).map(|t| t.len()),
        Err(DecodeError::Count)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any bytes in the blocks: refused or a table of exactly the count, never a panic; and
    /// every byte flipped in a valid encoding either is refused or loads a table that writes
    /// back to those very bytes.
    #[test]
    fn encoding_two_survives_any_bytes(
        count in 1u64..200,
        blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..400), 0..3),
        n in 1usize..300,
        flip in any::<(usize, u8)>(),
    ) {
        if let Ok(table) = decode_v2_blocks(count, &blocks) {
            prop_assert_eq!(table.len() as u64, count);
        }
        let table = random_table(n, n as u64);
        let (count, mut blocks) = encoded(&table);
        let at = flip.0 % blocks[0].len();
        blocks[0][at] ^= flip.1.max(1);
        if let Ok(loaded) = decode_v2_blocks(count, &blocks) {
            prop_assert_eq!(encoded(&loaded), (count, blocks));
        }
    }
}

/// The longest run of occupied slots in the current array (a cluster).
fn longest_cluster(table: &Table) -> usize {
    let array = &table.current;
    let (mut longest, mut run) = (0, 0);
    // Twice round, so a cluster that wraps past the end is counted whole.
    for i in 0..array.slots * 2 {
        if array.slot(i % array.slots).full_at_ns == EMPTY {
            run = 0;
        } else {
            run += 1;
            longest = longest.max(run);
        }
    }
    longest.min(array.slots)
}

/// A sweep's work is bounded by its budget whatever the clusters hold: removing a long
/// cluster of full buckets one at a time shifts the rest back each time, and those reads
/// count. (Before they counted, one 256-slot step of a 10,000,000-bucket table read its
/// longest cluster once per bucket removed: hundreds of thousands of slots in one call.)
#[test]
fn a_sweep_reads_at_most_its_budget_plus_one_cluster() {
    let now_ns = 1_000_000_000_000;
    let mut table = Table::new();
    // Half the buckets full at `now_ns`, interleaved with long-lived ones; at the most
    // load a table reaches, so its clusters are as long as they get.
    let count = 300_000u64;
    for i in 0..count {
        let full_at = if i % 3 == 0 {
            now_ns * 1000
        } else {
            now_ns - 1
        };
        table
            .set(
                tag(&i.to_le_bytes()),
                State::from_parts(full_at, 0).unwrap(),
            )
            .unwrap();
    }
    table.migrate(usize::MAX);
    let cluster = longest_cluster(&table);
    let budget = 256;
    let (mut most, mut calls, mut removed) = (0, 0, 0);
    while table.len() > (count as usize).div_ceil(3) {
        SLOT_READS.with(|reads| reads.set(0));
        let (swept, used) = table.sweep_counted(now_ns, budget);
        let reads = SLOT_READS.with(Cell::get);
        // Each slot looked at reads it (and `state` once more); a removal reads the rest
        // of the cluster; shrinking's migration step reads `budget` more.
        assert!(
            reads <= 3 * (used + 1) + budget + cluster,
            "{reads} reads for {used} counted"
        );
        assert!(
            used <= 2 * budget + cluster,
            "{used} counted, budget {budget}"
        );
        most = most.max(reads);
        removed += swept.len();
        calls += 1;
        assert!(calls < 100_000, "the sweep does not finish");
    }
    assert_eq!(removed, count as usize - (count as usize).div_ceil(3));
    println!("longest cluster {cluster}, most reads in one call {most}, calls {calls}");
}

/// A flood swept away costs a few slot reads per slot, not a cluster's walk per bucket:
/// shrinking midway through a sweep pass bunched the survivors (tags past the sweep's
/// cursor) into one cluster the size of the table, and removing it one bucket at a time
/// read about 2,000 slots per slot (456 million reads for 200,000 buckets).
#[test]
fn a_swept_flood_never_bunches_into_one_cluster() {
    let now_ns = 1_000_000_000_000;
    let count = 200_000u64;
    let mut table = Table::new();
    for i in 0..count {
        let state = State::from_parts(now_ns - 1, 0).unwrap();
        table.set(tag(&i.to_le_bytes()), state).unwrap();
    }
    table.migrate(usize::MAX);
    let slots = table.current.slots;
    let (mut reads, mut longest, mut calls) = (0, 0, 0);
    while !table.is_empty() {
        reads += table.sweep_counted(now_ns, 256).1;
        calls += 1;
        if calls % 128 == 0 {
            longest = longest.max(longest_cluster(&table));
        }
        assert!(reads < 20 * slots, "{reads} reads for {slots} slots");
    }
    assert!(longest < 2_000, "a cluster of {longest} slots");
    println!("{count} buckets, {slots} slots: {reads} reads, longest cluster {longest}");
}

/// A table of `count` buckets full at `now_ns`, but for those in the first `1 / one_in` of
/// its slots, which are live until `2 × now_ns`: a stretch dense in the array's order. Returns
/// the table and the live buckets' tags.
fn full_but_a_first_stretch(count: u64, now_ns: u64, one_in: usize) -> (Table, Vec<Tag>) {
    let full = State::from_parts(now_ns - 1, 0).unwrap();
    let mut table = Table::new();
    for i in 0..count {
        table.set(tag(&i.to_le_bytes()), full).unwrap();
    }
    table.migrate(usize::MAX);
    let live = State::from_parts(now_ns * 2, 0).unwrap();
    let first: Vec<Tag> = (0..table.current.slots / one_in)
        .map(|i| table.current.slot(i))
        .filter(|slot| slot.is_live())
        .map(Slot::tag)
        .collect();
    for &tag in &first {
        table.set(tag, live).unwrap();
    }
    (table, first)
}

/// The buckets a pass leaves are bunched in the array's order (the cursor met some slots
/// before their buckets filled up and others after), and a shrink must not pack them into
/// one cluster. With the old array's order they all shared one range of homes in the
/// smaller array: a 200,000-field flood on a server left its last 7,000 buckets in a
/// 7,000-slot cluster, which each removal walked (one or two removals per 10 ms tick).
#[test]
fn the_survivors_of_a_pass_do_not_bunch_when_the_table_shrinks() {
    let now_ns = 1_000_000_000_000u64;
    // The buckets in the first 5% of the slots are live: a pass leaves exactly those when
    // it met their slots before they filled up and every later slot after.
    let (mut table, first) = full_but_a_first_stretch(100_000, now_ns, 20);
    let slots = table.current.slots;
    let mut calls = 0;
    while table.len() > first.len() || table.is_migrating() {
        table.sweep(now_ns, 256);
        calls += 1;
        assert!(
            calls < 100_000,
            "the sweep does not finish: {} left",
            table.len()
        );
    }
    assert!(
        table.current.slots < slots / 4,
        "no shrink: {} slots",
        table.current.slots
    );
    let longest = longest_cluster(&table);
    assert!(
        longest < 200,
        "{} buckets in a cluster of {longest}",
        first.len()
    );
    // Removing them reads a few slots each, not the cluster's rest each.
    let (mut reads, left) = (0, table.current.slots);
    while !table.is_empty() {
        reads += table.sweep_counted(now_ns * 2 + 1, 256).1;
        assert!(reads < 20 * left, "{reads} reads for {left} slots");
    }
}

/// One step of a master's table, mirrored on a replica's.
#[derive(Clone, Debug)]
enum MasterOp {
    /// A write of field `.0`, full `.1` ms from now, then the write's own sweep step.
    Set(u16, u16),
    /// `RL.HDEL` of field `.0`.
    Remove(u16),
    /// A background sweep call of this budget.
    Sweep(u16),
    /// Moves the clock on by this many ms.
    Advance(u16),
}

fn master_op(fields: u16) -> impl Strategy<Value = MasterOp> {
    prop_oneof![
        12 => (0..fields, 0u16..2000).prop_map(|(f, ms)| MasterOp::Set(f, ms)),
        2 => (0..fields).prop_map(MasterOp::Remove),
        4 => (1u16..600).prop_map(MasterOp::Sweep),
        2 => (0u16..500).prop_map(MasterOp::Advance),
    ]
}

/// The master's sweeps against a replica that applies only what the master reports, and a
/// `HashMap` model: every removal a sweep makes is reported exactly once (the replica and
/// the model lose the same bucket, and only a full one), whether the table is growing,
/// shrinking or shifting a cluster back; and a whole pass with no migration under way
/// leaves no full bucket.
fn run_master_and_replica(ops: &[MasterOp]) -> Result<(), TestCaseError> {
    let mut master = Table::new();
    let mut replica = Table::new();
    let mut model: HashMap<Tag, State> = HashMap::new();
    let mut now_ns: u64 = 1_000_000_000_000;
    let ms = 1_000_000;
    let report = |swept: Vec<Tag>,
                  now_ns: u64,
                  replica: &mut Table,
                  model: &mut HashMap<Tag, State>|
     -> Result<(), TestCaseError> {
        for tag in swept {
            let held = model.remove(&tag);
            prop_assert!(
                held.is_some(),
                "a removal reported twice, or of a bucket never held"
            );
            prop_assert!(
                held.is_some_and(|s| is_full(s, now_ns)),
                "swept a live bucket"
            );
            prop_assert_eq!(replica.remove(tag), held);
        }
        Ok(())
    };
    for (i, op) in ops.iter().enumerate() {
        match *op {
            MasterOp::Set(f, after_ms) => {
                let tag = tag(&f.to_le_bytes());
                let state = State::from_parts(now_ns + u64::from(after_ms) * ms, 0).unwrap();
                master.set(tag, state).unwrap();
                replica.set(tag, state).unwrap();
                model.insert(tag, state);
                let swept = master.sweep(now_ns, 32);
                report(swept, now_ns, &mut replica, &mut model)?;
            }
            MasterOp::Remove(f) => {
                let tag = tag(&f.to_le_bytes());
                let removed = master.remove(tag);
                prop_assert_eq!(removed, model.remove(&tag), "op {}", i);
                if removed.is_some() {
                    prop_assert_eq!(replica.remove(tag), removed);
                }
            }
            MasterOp::Sweep(budget) => {
                let swept = master.sweep(now_ns, usize::from(budget));
                report(swept, now_ns, &mut replica, &mut model)?;
            }
            MasterOp::Advance(by_ms) => now_ns += u64::from(by_ms) * ms,
        }
        prop_assert_eq!(master.len(), model.len(), "op {}", i);
        prop_assert_eq!(replica.len(), model.len(), "op {}", i);
    }
    let mut sorted: Vec<(Tag, State)> = model.iter().map(|(&t, &s)| (t, s)).collect();
    sorted.sort_unstable_by_key(|&(tag, _)| tag);
    prop_assert_eq!(&master.sorted_entries(), &sorted);
    prop_assert_eq!(&replica.sorted_entries(), &sorted);
    // Sweep on at a fixed clock until a whole pass ran with no migration from its first slot
    // to its last: it must have left only live buckets.
    for _ in 0..1000 {
        while master.is_migrating() || master.sweep_at != 0 {
            let swept = master.sweep(now_ns, 64);
            report(swept, now_ns, &mut replica, &mut model)?;
        }
        let passes = master.sweep_passes();
        let mut migrated = false;
        while master.sweep_passes() == passes {
            let swept = master.sweep(now_ns, 64);
            migrated |= master.is_migrating();
            report(swept, now_ns, &mut replica, &mut model)?;
        }
        if !migrated {
            prop_assert_eq!(
                master.len(),
                master.live(now_ns),
                "a whole pass left full buckets"
            );
            prop_assert_eq!(replica.sorted_entries(), master.sorted_entries());
            return Ok(());
        }
    }
    Err(TestCaseError::fail("no whole pass without a migration"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Growth past several chunks and shrinks back, with sweeps of every budget between.
    #[test]
    fn every_sweep_removal_is_reported_once_and_a_pass_misses_none(
        ops in proptest::collection::vec(master_op(3000), 1000..5000),
    ) {
        run_master_and_replica(&ops)?;
    }
}

/// A shrink's new array has another slot order, so the buckets of a dense stretch of the old
/// array land in as many new chunks, each allocated (and zeroed) on first use. A migration
/// step counts each allocation, so it allocates a bounded number of chunks whatever the old
/// array holds.
#[test]
fn a_migration_step_allocates_a_bounded_number_of_chunks() {
    let now_ns = 1_000_000_000_000u64;
    // The first tenth of the slots stays live: a dense stretch of the old order.
    let (mut table, _) = full_but_a_first_stretch(400_000, now_ns, 10);
    let mut calls = 0;
    while !table.is_migrating() {
        table.sweep(now_ns, 256);
        calls += 1;
        assert!(calls < 100_000, "no shrink");
    }
    let made = |t: &Table| t.current.chunks.made + t.current.fracs.made;
    let (mut most, mut steps) = (0, 0);
    while table.is_migrating() {
        let before = made(&table);
        table.migrate(MIGRATE_STEP);
        most = most.max(made(&table) - before);
        steps += 1;
    }
    // The step that crosses its budget finishes its last bucket (one chunk and one page).
    assert!(
        most <= MIGRATE_STEP / CHUNK_ALLOC_SLOTS + 2,
        "a step allocated {most} chunks"
    );
    // The new array is made in many steps, so the bound above was tested.
    assert!(
        most >= 2 && steps > 10,
        "{most} chunks at most, {steps} steps"
    );
    println!("{steps} steps, at most {most} allocations in one");
}

#[test]
fn a_lookup_near_the_end_of_a_migration_does_not_walk_the_tail_again() {
    // An old array whose last slots and first slots are one cluster (it wraps), with a
    // migration past all but the last few: a lookup of a missing tag whose chain runs into
    // that tail must stop where the chain wraps into the passed slots, not go round the tail
    // until it has read as many slots as the array has.
    let slots = 4096;
    let mut array = Array::new(slots, 0);
    let state = State::from_full_at_ns(1_700_000_000_000_000_000).unwrap();
    let mut tail = Vec::new();
    for i in 0u64.. {
        let t = tag(format!("f{i}").as_bytes());
        if array.home(t) >= slots - 8 {
            array.insert_absent(t, state);
            tail.push(t);
        }
        if tail.len() == 12 {
            break;
        }
    }
    let missing = (0u64..)
        .map(|i| tag(format!("m{i}").as_bytes()))
        .find(|&t| array.home(t) >= slots - 8)
        .unwrap();
    let passed = slots - 8;
    SLOT_READS.with(|reads| reads.set(0));
    assert_eq!(array.find(missing, passed), None);
    let reads = SLOT_READS.with(Cell::get);
    assert!(reads <= 8, "a lookup read {reads} slots");
    // Held tags in the tail are still found, and one that wrapped past the end is gone
    // with the passed slots (the migration moved it).
    for &t in &tail {
        match array.find(t, 0) {
            Some(i) if i >= passed => assert_eq!(array.find(t, passed), Some(i)),
            Some(_) => assert_eq!(array.find(t, passed), None),
            None => panic!("a held tag is missing"),
        }
    }
}

fn record(id: &str, estimate: &str, expires_at_us: u64) -> Reservation {
    Reservation::new(
        LeaseId::new(id.as_bytes()).unwrap(),
        Cost::parse(estimate.as_bytes()).unwrap(),
        expires_at_us,
    )
    .unwrap()
}

/// Version 3's fields of `table`: the unsigned fields and the string fields, in order.
fn encoded_v3(table: &Table) -> (Vec<u64>, Vec<Vec<u8>>) {
    let mut counts = Vec::new();
    let mut blocks = Vec::new();
    table.encode(|c| counts.push(c), |block| blocks.push(block.to_vec()));
    (counts, blocks)
}

fn decode_v3(counts: &[u64], blocks: &[Vec<u8>]) -> Result<Table, DecodeError> {
    let mut u = counts.iter().copied();
    let mut b = blocks.iter().cloned();
    decode(3, || u.next(), || b.next())
}

#[test]
fn records_round_trip_in_encoding_three_and_go_with_their_bucket() {
    let mut table = random_table(50, 7);
    let tags: Vec<Tag> = table.entries().map(|(tag, _)| tag).take(3).collect();
    // A record may only join a bucket held.
    assert!(!table.set_records(12345, vec![record("x", "1", 10)]));
    assert!(table.set_records(
        tags[0],
        vec![record("a", "2.5", 9_000), record("b", "1e-3", 8)]
    ));
    assert!(table.set_records(tags[1], vec![record("\u{0}\u{ff}", "7", u64::MAX >> 7)]));
    assert_eq!(table.record_count(), 3);
    let (counts, blocks) = encoded_v3(&table);
    assert_eq!(counts, vec![50, 3]);
    assert_eq!(blocks.last().unwrap().len(), 3 * RESV_RECORD_BYTES);
    let loaded = decode_v3(&counts, &blocks).unwrap();
    assert_eq!(loaded.sorted_entries(), table.sorted_entries());
    for &tag in &tags {
        assert_eq!(loaded.records(tag), table.records(tag));
    }
    // Written again, the same bytes: the order depends on nothing but the content.
    assert_eq!(encoded_v3(&loaded), (counts.clone(), blocks.clone()));
    // Corrupt records are refused: a tag not held, an id padded with garbage, a zero
    // estimate, an expiry of 0, a count the block does not match.
    let corrupt = |at: usize, value: u8| {
        let mut blocks = blocks.clone();
        blocks.last_mut().unwrap()[at] ^= value;
        decode_v3(&counts, &blocks).map(|t| t.len())
    };
    assert!(corrupt(0, 1).is_err(), "a tag not held");
    assert!(corrupt(45 + 15, 1).is_err(), "an id's padding");
    assert!(corrupt(44, 0x20).is_err(), "an id longer than 16 bytes");
    let mut zero = blocks.clone();
    zero.last_mut().unwrap()[24..40].fill(0);
    assert!(decode_v3(&counts, &zero).is_err(), "a zero estimate");
    let mut short = counts.clone();
    short[1] = 2;
    assert_eq!(
        decode_v3(&short, &blocks).map(|t| t.len()),
        Err(DecodeError::TagLength)
    );
    // Versions 1 and 2 still load, without records.
    let (count, v2_blocks) = {
        let plain = random_table(10, 3);
        let (counts, blocks) = encoded_v3(&plain);
        (counts[0], blocks)
    };
    assert_eq!(decode_v2_blocks(count, &v2_blocks).map(|t| t.len()), Ok(10));
    // Removing a bucket removes its records.
    table.remove(tags[0]);
    assert!(table.records(tags[0]).is_empty());
    assert_eq!(table.record_count(), 1);
}

#[test]
fn the_sweep_holds_a_full_bucket_until_its_last_record_lapses() {
    let mut table = Table::new();
    let state = State::from_full_at_ns(1_000_000).unwrap();
    table.set(1, state).unwrap();
    table.set(2, state).unwrap();
    // Bucket 1 has a record open until 5 ms (5,000 µs); bucket 2 none.
    assert!(table.set_records(1, vec![record("r", "1", 5_000)]));
    let swept = table.sweep(2_000_000, 64);
    assert_eq!(
        swept,
        vec![2],
        "full at 1 ms, swept at 2 ms; the reserved one is held"
    );
    assert_eq!(table.get(1), Some(state));
    // The table tells a sweeper to come back when the record lapses, not before.
    table.sweep(2_000_000, 64);
    assert!(table.earliest_full_ns() <= 5_000_000);
    assert!(table.sweep(4_999_999, 64).is_empty());
    assert!(table.has_open_records(1, 4_999_999));
    assert!(!table.has_open_records(1, 5_000_000));
    assert_eq!(table.sweep(5_000_000, 64), vec![1]);
    assert!(table.is_empty());
    assert_eq!(table.record_count(), 0);
}

/// One step of the reservation property test: on field `f` of a few.
#[derive(Clone, Debug)]
enum ResvOp {
    Reserve {
        f: u8,
        id: u8,
        estimate: u8,
        ttl_ms: u64,
    },
    Settle {
        f: u8,
        id: u8,
        actual: u8,
    },
    Take {
        f: u8,
        cost: u8,
    },
    Refund {
        f: u8,
        cost: u8,
    },
    Remove {
        f: u8,
    },
    Sweep,
    Step(u64),
}

fn resv_op() -> impl Strategy<Value = ResvOp> {
    prop_oneof![
        4 => (0u8..4, 0u8..4, 1u8..=4, prop_oneof![1u64..=50, 1u64..=5_000])
            .prop_map(|(f, id, estimate, ttl_ms)| ResvOp::Reserve { f, id, estimate, ttl_ms }),
        3 => (0u8..4, 0u8..4, 0u8..=6).prop_map(|(f, id, actual)| ResvOp::Settle { f, id, actual }),
        1 => (0u8..4, 0u8..=3).prop_map(|(f, cost)| ResvOp::Take { f, cost }),
        1 => (0u8..4, 1u8..=5).prop_map(|(f, cost)| ResvOp::Refund { f, cost }),
        1 => (0u8..4).prop_map(|f| ResvOp::Remove { f }),
        2 => Just(ResvOp::Sweep),
        3 => prop_oneof![0u64..=2_000, 0u64..=200_000, 0u64..=3_000_000].prop_map(ResvOp::Step),
    ]
}

/// What the glue stores for a write that leaves field `tag` as `change` with `records`: a
/// bucket full again is removed with its records when none is left, else kept full as of
/// now (`TableKey::commit_records`, `TableField::apply`).
fn store(table: &mut Table, tag: Tag, change: Change, records: Vec<Reservation>, now_us: u64) {
    let now_ns = now_us * 1000;
    let state = match change {
        Change::Set(state) => Some(state),
        Change::Keep => table.get(tag),
        Change::Delete if records.iter().any(|r| r.is_open(now_us)) => {
            Some(State::from_full_at_ns(now_ns).unwrap())
        }
        Change::Delete => None,
    };
    match state {
        Some(state) => {
            table.set(tag, state).unwrap();
            assert!(table.set_records(tag, records));
        }
        None => {
            table.remove(tag);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Reservations on table buckets, driven as the glue drives them, against a plain model
    /// of the open records by field, with clock steps, sweeps, takes, refunds and removals:
    /// a settle finds exactly the records the model holds open (so it applies once); a
    /// field with an open record is never swept, and a removed field has no records; and
    /// the encoding carries the records back unchanged.
    #[test]
    fn table_reservations_agree_with_the_model(
        rate in prop::sample::select(vec!["3", "7", "3/10"]),
        ops in prop::collection::vec(resv_op(), 1..80),
    ) {
        let lim = Limit::parse(rate.as_bytes(), b"5").unwrap();
        let mut table = random_table(20, 9);
        // The model: field → (id, estimate, expires_at_us) of the records still open.
        let mut open: HashMap<u8, Vec<(u8, u8, u64)>> = HashMap::new();
        let mut now_us = 1_800_000_000_000_000u64;
        let tag_of = |f: u8| 0xF00D_0000 + Tag::from(f);
        let id_of = |id: u8| rl_bucket::LeaseId::new(&[b'a' + id]).unwrap();
        for op in &ops {
            for records in open.values_mut() {
                records.retain(|&(_, _, at)| now_us < at);
            }
            match *op {
                ResvOp::Reserve { f, id, estimate, ttl_ms } => {
                    let tag = tag_of(f);
                    let records = table.records(tag).to_vec();
                    let cost = Cost::parse(estimate.to_string().as_bytes()).unwrap();
                    let got = rl_bucket::reserve(&lim, table.get(tag), &records, now_us, cost, ttl_ms, id_of(id)).unwrap();
                    let mine = open.entry(f).or_default();
                    prop_assert_eq!(got.repeated, mine.iter().any(|&(k, _, _)| k == id));
                    if let Some((state, records)) = got.write {
                        store(&mut table, tag, Change::Set(state), records.into_vec(), now_us);
                        mine.push((id, estimate, now_us + ttl_ms * 1000));
                    }
                }
                ResvOp::Settle { f, id, actual } => {
                    let tag = tag_of(f);
                    let records = table.records(tag).to_vec();
                    let cost = Cost::parse(actual.to_string().as_bytes()).unwrap();
                    let got = rl_bucket::settle_reservation(&lim, table.get(tag), &records, now_us, id_of(id), cost);
                    let mine = open.entry(f).or_default();
                    match (got, mine.iter().position(|&(k, _, _)| k == id)) {
                        (Ok((_, change, left)), Some(at)) => {
                            mine.remove(at);
                            store(&mut table, tag, change, left.into_vec(), now_us);
                        }
                        (Err(rl_bucket::SettleError::NotOpen), None) => {}
                        (got, want) => prop_assert!(false, "settle {:?}, model {:?}", got, want),
                    }
                }
                ResvOp::Take { f, cost } => {
                    let tag = tag_of(f);
                    let cost = Cost::parse(cost.to_string().as_bytes()).unwrap();
                    if let (d, Some(state)) = rl_bucket::acquire(&lim, table.get(tag), now_us, cost) {
                        if d.allowed() {
                            table.set(tag, state).unwrap();
                        }
                    }
                }
                ResvOp::Refund { f, cost } => {
                    let tag = tag_of(f);
                    let cost = Cost::parse(cost.to_string().as_bytes()).unwrap();
                    let (_, change) = rl_bucket::refund(&lim, table.get(tag), now_us, cost);
                    let records = table.records(tag).to_vec();
                    if change != Change::Keep {
                        store(&mut table, tag, change, records, now_us);
                    }
                }
                ResvOp::Remove { f } => {
                    table.remove(tag_of(f));
                    open.remove(&f);
                }
                ResvOp::Sweep => {
                    let swept = table.sweep(now_us * 1000, 64);
                    for tag in swept {
                        let held = open.iter().any(|(&f, r)| tag_of(f) == tag && !r.is_empty());
                        prop_assert!(!held, "swept a field with an open record");
                    }
                }
                ResvOp::Step(us) => now_us += us,
            }
            // Every field's open records are the model's, and a field with one is held.
            for f in 0..4u8 {
                let tag = tag_of(f);
                let mut got: Vec<(u8, u64)> = table
                    .records(tag)
                    .iter()
                    .filter(|r| r.is_open(now_us))
                    .map(|r| (r.id.as_bytes()[0] - b'a', r.expires_at_us))
                    .collect();
                let mut want: Vec<(u8, u64)> = open
                    .get(&f)
                    .map(|r| r.iter().filter(|&&(_, _, at)| now_us < at).map(|&(k, _, at)| (k, at)).collect())
                    .unwrap_or_default();
                got.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(&got, &want, "field {} after {:?}", f, op);
                if !want.is_empty() {
                    prop_assert!(table.get(tag).is_some(), "field {} with records not held", f);
                }
                if table.get(tag).is_none() {
                    prop_assert!(table.records(tag).is_empty());
                }
            }
        }
        // The encoding carries every record back (an empty table is deleted, never written).
        if table.is_empty() {
            prop_assert_eq!(table.record_count(), 0);
            return Ok(());
        }
        let (counts, blocks) = encoded_v3(&table);
        let loaded = decode_v3(&counts, &blocks).unwrap();
        prop_assert_eq!(loaded.sorted_entries(), table.sorted_entries());
        for f in 0..4u8 {
            prop_assert_eq!(loaded.records(tag_of(f)), table.records(tag_of(f)));
        }
    }
}
