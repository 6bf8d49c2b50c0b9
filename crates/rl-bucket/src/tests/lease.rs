//! Leases (`lease.rs`): the replies worked out by hand, the stored form's checks, a
//! property run against a plain model (a `Vec` of ids and expiries, filtered by `now` on
//! every question) through random takes, releases, renewals, counts and clock steps,
//! backwards included, and the indexed set against the sorted vector it replaced
//! (`sorted_leases.rs`): every reply, change and the whole stored order after each call,
//! with bulk puts and reloads up to the cap, its indexes checked for shape after each.

use super::*;

fn id(bytes: &[u8]) -> LeaseId {
    LeaseId::new(bytes).unwrap()
}

/// Applies what a step changed, as the store does, checking `apply` against `apply_all`.
fn commit(set: &mut LeaseSet, change: Option<LeaseChange>) {
    if let Some(change) = change {
        *set = assert_apply_agrees(set, &change).unwrap();
    }
}

#[test]
fn ids_are_one_to_sixteen_bytes_and_leases_pack_into_24_bytes() {
    assert_eq!(LeaseId::new(b""), None);
    assert_eq!(id(b"a").as_bytes(), b"a");
    assert_eq!(id(&[0xff; 16]).as_bytes(), &[0xff; 16]);
    assert_eq!(LeaseId::new(&[0; 17]), None);
    // A trailing NUL is part of the id, not padding.
    assert_ne!(id(b"a"), id(b"a\0"));
    assert_eq!(std::mem::size_of::<Lease>(), 24);
    let lease = Lease::new(id(b"0123456789abcdef"), MAX_EXPIRES_AT_US).unwrap();
    assert_eq!(lease.expires_at_us(), MAX_EXPIRES_AT_US);
    assert_eq!(lease.id(), id(b"0123456789abcdef"));
    assert_eq!(Lease::new(id(b"a"), 0), None);
    assert_eq!(Lease::new(id(b"a"), MAX_EXPIRES_AT_US + 1), None);
}

#[test]
fn takes_fill_the_limit_then_wait_for_the_lease_that_frees_a_slot() {
    let mut set = LeaseSet::new();
    // Three leases of 300, 100 and 200 ms at limit 3: each reply is the lease's own ttl.
    for (name, ttl_ms, in_use) in [(b"a", 300, 1), (b"b", 100, 2), (b"c", 200, 3)] {
        let (reply, change) = lease(Some(&set), 3, NOW_US, ttl_ms, id(name));
        assert_eq!(
            (reply.outcome, reply.in_use, reply.wait_ms()),
            (LeaseOutcome::Taken, in_use, ttl_ms)
        );
        commit(&mut set, change);
    }
    // Full: a slot frees when b (the earliest) expires, 100 ms on.
    let (reply, change) = lease(Some(&set), 3, NOW_US, 50, id(b"d"));
    assert_eq!(
        (reply.outcome, reply.in_use, reply.wait_ms()),
        (LeaseOutcome::Denied, 3, 100)
    );
    assert_eq!(change, None);
    // At limit 2 two must go, so the wait is for the second earliest, c, at 200 ms; at limit
    // 1 all three, a at 300 ms.
    assert_eq!(leases_in_use(Some(&set), 2, NOW_US), (3, 200 * 1000));
    assert_eq!(leases_in_use(Some(&set), 1, NOW_US), (3, 300 * 1000));
    // 40 µs later the wait is 99.96 ms, reported as 100.
    let (reply, _) = lease(Some(&set), 3, NOW_US + 40, 50, id(b"d"));
    assert_eq!((reply.wait_us, reply.wait_ms()), (99_960, 100));
    // At b's expiry exactly, b counts for nothing: d is taken, and b is dropped.
    let (reply, change) = lease(Some(&set), 3, NOW_US + 100_000, 50, id(b"d"));
    assert_eq!((reply.outcome, reply.in_use), (LeaseOutcome::Taken, 3));
    commit(&mut set, change);
    assert_eq!(set.len(), 3);
    assert!(set.find(id(b"b")).is_none());
    assert_eq!(set.last_expires_at_us(), Some(NOW_US + 300_000));
}

#[test]
fn a_retried_take_is_answered_as_held_and_changes_nothing() {
    let mut set = LeaseSet::new();
    let (_, change) = lease(Some(&set), 1, NOW_US, 1000, id(b"job"));
    commit(&mut set, change);
    // Retried 10 ms later with another ttl, even at a limit now full: held, 990 ms left.
    let (reply, change) = lease(Some(&set), 1, NOW_US + 10_000, 5000, id(b"job"));
    assert_eq!(
        (reply.outcome, reply.in_use, reply.wait_ms()),
        (LeaseOutcome::Held, 1, 990)
    );
    assert_eq!(change, None);
    // Once expired, the same id is a new lease.
    let (reply, _) = lease(Some(&set), 1, NOW_US + 1_000_000, 5000, id(b"job"));
    assert_eq!(reply.outcome, LeaseOutcome::Taken);
}

#[test]
fn release_and_renew_act_only_on_leases_that_count() {
    let mut set = LeaseSet::new();
    for (name, ttl_ms) in [(b"a", 100), (b"b", 200)] {
        let (_, change) = lease(Some(&set), 5, NOW_US, ttl_ms, id(name));
        commit(&mut set, change);
    }
    assert_eq!(release(Some(&set), NOW_US, id(b"x")), (false, None));
    assert_eq!(release(None, NOW_US, id(b"a")), (false, None));
    // a expired at 100 ms: neither released nor revived.
    assert_eq!(
        release(Some(&set), NOW_US + 100_000, id(b"a")),
        (false, None)
    );
    assert_eq!(
        renew(Some(&set), NOW_US + 100_000, id(b"a"), 10),
        (false, None)
    );
    // Renewing b at 150 ms for 1 ms shortens it to 151 ms, and drops a.
    let (renewed, change) = renew(Some(&set), NOW_US + 150_000, id(b"b"), 1);
    assert!(renewed);
    commit(&mut set, change);
    assert_eq!(set.len(), 1);
    assert_eq!(set.last_expires_at_us(), Some(NOW_US + 151_000));
    let (released, change) = release(Some(&set), NOW_US + 150_000, id(b"b"));
    assert!(released);
    commit(&mut set, change);
    assert!(set.is_empty());
}

#[test]
fn the_stored_form_is_refused_unless_sorted_unique_and_bounded() {
    let lease_at = |name: &[u8], at: u64| Lease::new(id(name), at).unwrap();
    let rows: Vec<(Vec<Lease>, bool)> = vec![
        // empty is a valid set (a loader refuses it separately: no key is empty)
        (vec![], true),
        // ascending by expiry
        (vec![lease_at(b"b", 1), lease_at(b"a", 2)], true),
        // same expiry, ascending by id
        (vec![lease_at(b"a", 5), lease_at(b"b", 5)], true),
        // descending
        (vec![lease_at(b"a", 2), lease_at(b"b", 1)], false),
        // an entry twice
        (vec![lease_at(b"a", 2), lease_at(b"a", 2)], false),
        // one id at two expiries
        (vec![lease_at(b"a", 1), lease_at(b"a", 2)], false),
    ];
    for (leases, ok) in rows {
        assert_eq!(
            LeaseSet::from_sorted(leases.clone()).is_some(),
            ok,
            "{leases:?}"
        );
    }
    let too_many: Vec<Lease> = (0..=MAX_LEASE_LIMIT)
        .map(|i| lease_at(&i.to_be_bytes(), i + 1))
        .collect();
    assert!(LeaseSet::from_sorted(too_many).is_none());
}

#[test]
fn apply_all_refuses_a_result_past_the_cap_and_leaves_the_set_as_it_was() {
    let puts: Vec<(LeaseId, u64)> = (0..MAX_LEASE_LIMIT)
        .map(|i| (id(&i.to_be_bytes()), NOW_US + i + 1))
        .collect();
    let mut set = LeaseSet::new();
    set.apply_all(0, &puts).unwrap();
    assert_eq!(set.len() as u64, MAX_LEASE_LIMIT);
    let before = set.clone();
    assert_eq!(set.apply_all(0, &[(id(b"one more"), NOW_US + 1)]), None);
    assert_eq!(set, before);
    let one_more = LeaseChange {
        drop_until_us: 0,
        id: id(b"one more"),
        expires_at_us: NOW_US + 1,
    };
    assert_eq!(assert_apply_agrees(&set, &one_more), None);
    // Moving a held id at the cap is no growth.
    let moved = LeaseChange {
        id: id(&0u64.to_be_bytes()),
        ..one_more
    };
    assert!(assert_apply_agrees(&set, &moved).is_some());
    assert_eq!(set.apply_all(0, &[(id(b"x"), MAX_EXPIRES_AT_US + 1)]), None);
    assert_eq!(set, before);
    // Dropping the expired first makes room: the cap counts what remains.
    set.apply_all(NOW_US + 1, &[(id(b"one more"), NOW_US + 1)])
        .unwrap();
    assert_eq!(set.len() as u64, MAX_LEASE_LIMIT);
    // Slack stays under an eighth, plus 4.
    assert!(
        set.capacity() <= set.len() + set.len() / 8 + 4,
        "{}",
        set.capacity()
    );
    set.apply_all(NOW_US + 9_000, &[]).unwrap();
    assert!(
        set.capacity() <= set.len() + set.len() / 8 + 4,
        "{}",
        set.capacity()
    );
}

/// `apply` (every write's path) and `apply_all` with the same one pair give the same set.
fn assert_apply_agrees(set: &LeaseSet, change: &LeaseChange) -> Option<LeaseSet> {
    let mut one = set.clone();
    let mut all = set.clone();
    let got = one.apply(change);
    assert_eq!(
        got,
        all.apply_all(change.drop_until_us, &[(change.id, change.expires_at_us)])
    );
    assert_eq!(one, all, "{change:?} on {set:?}");
    got.map(|()| one)
}

/// The model: every lease an id and an expiry, in no order; questions filter by `now`.
#[derive(Default, Debug)]
struct Model {
    leases: Vec<(Vec<u8>, u64)>,
}

impl Model {
    fn live(&self, now_us: u64) -> Vec<(Vec<u8>, u64)> {
        let mut live: Vec<_> = self
            .leases
            .iter()
            .filter(|l| l.1 > now_us)
            .cloned()
            .collect();
        live.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        live
    }

    fn wait_for_slot(&self, limit: u64, now_us: u64) -> u64 {
        let live = self.live(now_us);
        if (live.len() as u64) < limit {
            0
        } else {
            live[live.len() - limit as usize].1 - now_us
        }
    }

    /// A write drops what expired by `now_us`, as every change does.
    fn write(&mut self, now_us: u64) {
        self.leases.retain(|l| l.1 > now_us);
    }

    fn take(
        &mut self,
        limit: u64,
        now_us: u64,
        ttl_ms: u64,
        id: &[u8],
    ) -> (LeaseOutcome, u64, u64) {
        let live = self.live(now_us);
        if let Some(held) = live.iter().find(|l| l.0 == id) {
            return (LeaseOutcome::Held, live.len() as u64, held.1 - now_us);
        }
        if live.len() as u64 >= limit {
            return (
                LeaseOutcome::Denied,
                live.len() as u64,
                self.wait_for_slot(limit, now_us),
            );
        }
        self.write(now_us);
        self.leases.push((id.to_vec(), now_us + ttl_ms * 1000));
        (LeaseOutcome::Taken, live.len() as u64 + 1, ttl_ms * 1000)
    }

    fn put(&mut self, now_us: u64, id: &[u8], expires_at_us: Option<u64>) -> bool {
        if !self.live(now_us).iter().any(|l| l.0 == id) {
            return false;
        }
        self.write(now_us);
        self.leases.retain(|l| l.0 != id);
        if let Some(at) = expires_at_us {
            self.leases.push((id.to_vec(), at));
        }
        true
    }
}

#[derive(Clone, Debug)]
enum Op {
    Take {
        limit: u64,
        ttl_ms: u64,
        id: Vec<u8>,
    },
    Release {
        id: Vec<u8>,
    },
    Renew {
        id: Vec<u8>,
        ttl_ms: u64,
    },
    Count {
        limit: u64,
    },
    /// Moves the clock by this many µs, backwards when negative.
    Step(i64),
}

fn any_id() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // a small pool, so ids meet again: retries, releases of held and of expired ids
        4 => prop::sample::select(vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec(), b"e".to_vec(), b"f".to_vec(), b"g".to_vec()]),
        1 => prop::collection::vec(any::<u8>(), 1..=16),
    ]
}

fn any_op() -> impl Strategy<Value = Op> {
    let ttl = prop_oneof![1u64..=5, 1u64..=1000];
    prop_oneof![
        5 => (1u64..=5, ttl.clone(), any_id()).prop_map(|(limit, ttl_ms, id)| Op::Take { limit, ttl_ms, id }),
        2 => any_id().prop_map(|id| Op::Release { id }),
        2 => (any_id(), ttl).prop_map(|(id, ttl_ms)| Op::Renew { id, ttl_ms }),
        1 => (1u64..=5).prop_map(|limit| Op::Count { limit }),
        3 => prop_oneof![4 => 0i64..=2_000, 2 => 0i64..=1_000_000, 1 => -2_000i64..=0].prop_map(Op::Step),
    ]
}

proptest! {
    #[test]
    fn leases_agree_with_the_plain_model(ops in prop::collection::vec(any_op(), 1..120)) {
        let mut set = LeaseSet::new();
        let mut model = Model::default();
        let mut now_us = NOW_US;
        for op in &ops {
            match op {
                Op::Take { limit, ttl_ms, id: name } => {
                    let (reply, change) = lease(Some(&set), *limit, now_us, *ttl_ms, id(name));
                    let want = model.take(*limit, now_us, *ttl_ms, name);
                    prop_assert_eq!((reply.outcome, reply.in_use, reply.wait_us), want, "{:?}", op);
                    prop_assert_eq!(change.is_some(), want.0 == LeaseOutcome::Taken);
                    prop_assert!(reply.in_use <= *limit || reply.outcome != LeaseOutcome::Taken);
                    commit(&mut set, change);
                }
                Op::Release { id: name } => {
                    let (released, change) = release(Some(&set), now_us, id(name));
                    prop_assert_eq!(released, model.put(now_us, name, None), "{:?}", op);
                    commit(&mut set, change);
                }
                Op::Renew { id: name, ttl_ms } => {
                    let (renewed, change) = renew(Some(&set), now_us, id(name), *ttl_ms);
                    let want = model.put(now_us, name, Some(now_us + ttl_ms * 1000));
                    prop_assert_eq!(renewed, want, "{:?}", op);
                    commit(&mut set, change);
                }
                Op::Count { limit } => {
                    let want = (model.live(now_us).len() as u64, model.wait_for_slot(*limit, now_us));
                    prop_assert_eq!(leases_in_use(Some(&set), *limit, now_us), want);
                }
                Op::Step(us) => now_us = now_us.checked_add_signed(*us).unwrap(),
            }
            // Every stored lease is the model's, in the stored order, which stays valid.
            let mut stored: Vec<(Vec<u8>, u64)> = model.leases.clone();
            stored.sort_by(|a, b| (a.1, a.0.len(), &a.0).cmp(&(b.1, b.0.len(), &b.0)));
            let got: Vec<(Vec<u8>, u64)> = set
                .iter()
                .map(|l| (l.id().as_bytes().to_vec(), l.expires_at_us()))
                .collect();
            let mut got_sorted = got.clone();
            got_sorted.sort_by(|a, b| (a.1, a.0.len(), &a.0).cmp(&(b.1, b.0.len(), &b.0)));
            prop_assert_eq!(&got_sorted, &stored);
            prop_assert_eq!(LeaseSet::from_sorted(set.iter().copied().collect()), Some(set.clone()));
        }
    }
}

// The indexed set against the sorted vector it replaced (`sorted_leases.rs`), step by step.

use super::sorted_leases::{
    lease_sorted, leases_in_use_sorted, release_sorted, renew_sorted, SortedLeaseSet,
};

#[derive(Clone, Debug)]
enum Call {
    /// A take with a caller's id, or (None) an id made the way `RL.LEASE` makes one: one
    /// neither set stores.
    Take {
        limit: u64,
        ttl_ms: u64,
        id: Option<Vec<u8>>,
    },
    Release {
        id: Vec<u8>,
    },
    Renew {
        id: Vec<u8>,
        ttl_ms: u64,
    },
    Count {
        limit: u64,
    },
    /// `RL.LEASESETSTATE` with no pair's effect but the drop: drops what expired by now.
    Drop,
    /// `RL.LEASESETSTATE` putting `n` made ids at once (expiries `now + 1 + mix(seed, i) %
    /// spread_us`, ascending when `spread_us` is 0), plus removals of the small pool's ids.
    Fill {
        n: u64,
        seed: u64,
        spread_us: u64,
        remove: Vec<Vec<u8>>,
    },
    /// Reloads the set from its stored order (`from_sorted`, as a loader does).
    Reload,
    /// Moves the clock by this many µs, backwards when negative.
    Step(i64),
}

fn mix(seed: u64, i: u64) -> u64 {
    // splitmix64: spreads ids and expiries without a generator's state.
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn any_call() -> impl Strategy<Value = Call> {
    let limit = prop_oneof![3 => 1u64..=5, 2 => 1u64..=MAX_LEASE_LIMIT, 1 => Just(MAX_LEASE_LIMIT)];
    let ttl = prop_oneof![1u64..=5, 1u64..=1000, Just(60_000u64)];
    prop_oneof![
        6 => (limit.clone(), ttl.clone(), prop::option::weighted(0.6, any_id())).prop_map(|(limit, ttl_ms, id)| Call::Take { limit, ttl_ms, id }),
        2 => any_id().prop_map(|id| Call::Release { id }),
        2 => (any_id(), ttl).prop_map(|(id, ttl_ms)| Call::Renew { id, ttl_ms }),
        1 => limit.prop_map(|limit| Call::Count { limit }),
        1 => Just(Call::Drop),
        1 => (
            prop_oneof![6 => 0u64..=80, 3 => 0u64..=3_000, 1 => Just(MAX_LEASE_LIMIT)],
            any::<u64>(),
            prop_oneof![Just(0u64), 1u64..=100, 1u64..=2_000_000],
            prop::collection::vec(any_id(), 0..3),
        )
            .prop_map(|(n, seed, spread_us, remove)| Call::Fill { n, seed, spread_us, remove }),
        1 => Just(Call::Reload),
        3 => prop_oneof![4 => 0i64..=2_000, 2 => 0i64..=1_000_000, 1 => -2_000i64..=0].prop_map(Call::Step),
    ]
}

/// Stored order, as pairs the eye can read in a failure.
fn contents<'a>(leases: impl Iterator<Item = &'a Lease>) -> Vec<(Vec<u8>, u64)> {
    leases
        .map(|l| (l.id().as_bytes().to_vec(), l.expires_at_us()))
        .collect()
}

/// Runs `calls` on an indexed set and on the sorted model, comparing every reply, every
/// change and the whole stored order after each.
fn run_against_sorted(calls: &[Call]) -> Result<(), TestCaseError> {
    let mut set = LeaseSet::new();
    let mut model = SortedLeaseSet::new();
    let mut now_us = NOW_US;
    let mut made = 0u64;
    let mut make_id = |set: &LeaseSet, model: &SortedLeaseSet| loop {
        made += 1;
        let made_id = id(format!("{:016x}", mix(7, made)).as_bytes());
        assert_eq!(set.find(made_id), model.find(made_id).copied().as_ref());
        if set.find(made_id).is_none() {
            return made_id;
        }
    };
    for call in calls {
        match call {
            Call::Take {
                limit,
                ttl_ms,
                id: name,
            } => {
                let taken = match name {
                    Some(name) => id(name),
                    None => make_id(&set, &model),
                };
                let got = lease(Some(&set), *limit, now_us, *ttl_ms, taken);
                let want = lease_sorted(Some(&model), *limit, now_us, *ttl_ms, taken);
                prop_assert_eq!(got, want, "{:?}", call);
                if let Some(change) = want.1 {
                    prop_assert_eq!(set.apply(&change), model.apply(&change));
                }
            }
            Call::Release { id: name } => {
                let got = release(Some(&set), now_us, id(name));
                let want = release_sorted(Some(&model), now_us, id(name));
                prop_assert_eq!(got, want, "{:?}", call);
                if let Some(change) = want.1 {
                    prop_assert_eq!(set.apply(&change), model.apply(&change));
                }
            }
            Call::Renew { id: name, ttl_ms } => {
                let got = renew(Some(&set), now_us, id(name), *ttl_ms);
                let want = renew_sorted(Some(&model), now_us, id(name), *ttl_ms);
                prop_assert_eq!(got, want, "{:?}", call);
                if let Some(change) = want.1 {
                    prop_assert_eq!(set.apply(&change), model.apply(&change));
                }
            }
            Call::Count { limit } => {
                prop_assert_eq!(
                    leases_in_use(Some(&set), *limit, now_us),
                    leases_in_use_sorted(Some(&model), *limit, now_us)
                );
            }
            Call::Drop => {
                prop_assert_eq!(set.apply_all(now_us, &[]), model.apply_all(now_us, &[]));
            }
            Call::Fill {
                n,
                seed,
                spread_us,
                remove,
            } => {
                let mut puts: Vec<(LeaseId, u64)> =
                    remove.iter().map(|name| (id(name), 0)).collect();
                for i in 0..*n {
                    let made_id = make_id(&set, &model);
                    let after_us = match spread_us {
                        0 => i,
                        spread => mix(*seed, i) % spread,
                    };
                    puts.push((made_id, now_us + 1 + after_us));
                }
                let drop_until_us = now_us.saturating_sub(mix(*seed, 0) % 2_000);
                let got = set.apply_all(drop_until_us, &puts);
                prop_assert_eq!(got, model.apply_all(drop_until_us, &puts), "{:?}", call);
            }
            Call::Reload => {
                set = LeaseSet::from_sorted(set.iter().copied().collect()).unwrap();
            }
            Call::Step(us) => now_us = now_us.checked_add_signed(*us).unwrap(),
        }
        set.check();
        prop_assert_eq!(
            contents(set.iter()),
            contents(model.leases().iter()),
            "after {:?}",
            call
        );
        prop_assert_eq!(set.len(), model.len());
        prop_assert_eq!(set.last_expires_at_us(), model.last_expires_at_us());
        prop_assert_eq!(set.live(now_us).len(), model.live(now_us).len());
        let reloaded = LeaseSet::from_sorted(model.leases().to_vec());
        prop_assert_eq!(reloaded.as_ref(), Some(&set));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_indexed_set_answers_and_stores_as_the_sorted_vector_did(
        calls in prop::collection::vec(any_call(), 1..100),
    ) {
        run_against_sorted(&calls)?;
    }
}

#[test]
fn the_indexed_set_agrees_with_the_sorted_vector_up_to_the_cap_and_back() {
    // Fills to the cap in one ascending run (the last leaf kept full), takes past it, then
    // lets time drain it in steps, with takes and releases of made and own ids between:
    // every leaf split and merge, table growth and shrink, and tree rebuild on the way.
    let mut calls = vec![Call::Fill {
        n: MAX_LEASE_LIMIT - 10,
        seed: 1,
        spread_us: 0,
        remove: vec![],
    }];
    for round in 0..40u64 {
        calls.push(Call::Take {
            limit: MAX_LEASE_LIMIT,
            ttl_ms: 1 + round % 7,
            id: None,
        });
        calls.push(Call::Take {
            limit: MAX_LEASE_LIMIT,
            ttl_ms: 1,
            id: Some(b"a".to_vec()),
        });
        calls.push(Call::Fill {
            n: 400,
            seed: round,
            spread_us: 50_000_000,
            remove: vec![b"a".to_vec()],
        });
        calls.push(Call::Count {
            limit: 1 + round * 250,
        });
        calls.push(Call::Step(250 + (round as i64) * 10));
        calls.push(Call::Drop);
        if round % 8 == 0 {
            calls.push(Call::Reload);
        }
    }
    calls.push(Call::Step(100_000_000));
    calls.push(Call::Take {
        limit: 1,
        ttl_ms: 5,
        id: None,
    });
    run_against_sorted(&calls).unwrap();
}

#[test]
fn a_run_of_one_ttl_fills_its_leaves() {
    // The bench's pattern: leases of one ttl taken in time order, each appended after the
    // last. Whole leaves, so the tree costs about 2 bytes a lease.
    let mut set = LeaseSet::new();
    for i in 0..1000u64 {
        let (_, change) = lease(
            Some(&set),
            MAX_LEASE_LIMIT,
            NOW_US + i,
            3_600_000,
            id(&i.to_be_bytes()),
        );
        set.apply(&change.unwrap()).unwrap();
    }
    set.check();
    let (leaves, leases) = set.leaf_fill();
    assert_eq!((leaves, leases), (16, 1000));
    assert!(
        set.allocated_bytes() <= 1000 * 30,
        "{}",
        set.allocated_bytes()
    );
}
