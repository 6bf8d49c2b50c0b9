//! One handler per command: parse → open → pure step → commit → reply. The store handles of
//! [`crate::datatype`] commit and replicate their own changes.
//!
//! Handlers are raw `extern "C"` functions (no per-call argument vector), and each body runs
//! through [`crate::handler::run`], inside `catch_unwind`, so a bug becomes an error reply and
//! a log line, never an aborted server. Every clock-dependent write is replicated as its effect (`RL.SETSTATE` with the
//! exact state, or `DEL`), never as the command itself.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use rl_bucket::{self as bucket, Change, Charged, Decision, Outcome};

use crate::datatype::BucketKey;
use crate::error::{Error, MAX_MULTI_BUCKETS};
use crate::handler::{self, handler, Failure};
use crate::store::Store;
use crate::table_type::TableKey;
use crate::{args, clock, table};

/// What a command answers when it succeeds. Each variant carries the outcome itself, so the
/// counters read the decision and `send` formats it; nothing is decoded back from integers.
enum Reply {
    /// `RL.ACQUIRE`'s decision, sent as four integers.
    Decision(Decision),
    /// The same four integers from `RL.PEEK`, which decides nothing.
    Peek(Decision),
    /// `RL.THROTTLE` and `RL.GCRA`: the decision and the limit's `total`, sent as redis-cell's
    /// five integers.
    Throttle(Decision, u64),
    /// `RL.REFUND`: remaining, reset_after_ms.
    Refund(Decision),
    /// `RL.CHARGE`: 1 (applied), the signed balance, retry_after_ms (until the debt is
    /// repaid) and reset_after_ms, in `RL.ACQUIRE`'s shape.
    Charge(Charged),
    /// `RL.ACQUIRE.MULTI`: the first refused bucket if any, and every bucket's decision.
    Multi(Option<usize>, Vec<Decision>),
    /// One integer (`RL.HDEL`, `RL.HLEN`).
    Integer(u64),
    /// `+OK`.
    Ok,
}

impl handler::Reply for Reply {
    /// Whether the call took its tokens, for the counters; `None` when it decides nothing.
    fn verdict(&self) -> Option<bool> {
        match self {
            Reply::Decision(decision) | Reply::Throttle(decision, _) => Some(decision.allowed()),
            Reply::Multi(refused, _) => Some(refused.is_none()),
            // A charge always applies: it reports work done, and decides nothing.
            Reply::Peek(_)
            | Reply::Refund(_)
            | Reply::Charge(_)
            | Reply::Integer(_)
            | Reply::Ok => None,
        }
    }

    unsafe fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        // SAFETY: `ctx` is live (caller).
        unsafe { send(ctx, self) }
    }
}

handler!(
    /// `RL.ACQUIRE key rate capacity [cost]`
    acquire, c"RL.ACQUIRE", acquire_body, true
);
handler!(
    /// `RL.PEEK key rate capacity [cost]`
    peek, c"RL.PEEK", peek_body, true
);
handler!(
    /// `RL.ACQUIRE.MULTI key rate capacity cost [key rate capacity cost ...]`
    acquire_multi, c"RL.ACQUIRE.MULTI", acquire_multi_body, true
);
handler!(
    /// `RL.HACQUIRE.MULTI key field rate capacity cost [key field rate capacity cost ...]`
    hacquire_multi, c"RL.HACQUIRE.MULTI", hacquire_multi_body, true
);
handler!(
    /// `RL.THROTTLE key max_burst count_per_period period [quantity]` (and `CL.THROTTLE`)
    throttle, c"RL.THROTTLE", throttle_body, true
);
handler!(
    /// `RL.GCRA key max_burst tokens_per_period period [TOKENS count]` (and `GCRA`)
    gcra, c"RL.GCRA", gcra_body, true
);
handler!(
    /// `RL.REFUND key rate capacity [cost]`
    refund, c"RL.REFUND", refund_body, true
);
handler!(
    /// `RL.CHARGE key rate capacity cost`: takes `cost` whatever the bucket holds (post-paid),
    /// perhaps into debt.
    charge, c"RL.CHARGE", charge_body, true
);
handler!(
    /// `RL.HCHARGE key field rate capacity cost`: `RL.CHARGE` on one bucket of a table.
    hcharge, c"RL.HCHARGE", hcharge_body, true
);
handler!(
    /// `RL.HACQUIRE key field rate capacity [cost]`: `RL.ACQUIRE` on one bucket of a table.
    hacquire, c"RL.HACQUIRE", hacquire_body, true
);
handler!(
    /// `RL.HPEEK key field rate capacity [cost]`
    hpeek, c"RL.HPEEK", hpeek_body, true
);
handler!(
    /// `RL.HREFUND key field rate capacity [cost]`
    hrefund, c"RL.HREFUND", hrefund_body, true
);
handler!(
    /// `RL.HDEL key field [field ...]`: resets buckets; replies with how many were live.
    hdel, c"RL.HDEL", hdel_body, true
);
handler!(
    /// `RL.HLEN key`: buckets held.
    hlen, c"RL.HLEN", hlen_body, true
);
handler!(
    /// `RL.HSETSTATE key tag full_at_ns full_at_frac [tag full_at_ns full_at_frac ...]`: sets
    /// (or with `full_at_ns` 0, deletes) table buckets by tag. What table writes replicate and
    /// AOF rewrites emit; reads no clock and never sweeps. Not counted: it is internal.
    hset_state, c"RL.HSETSTATE", hset_state_body, false
);
handler!(
    /// `RL.SETSTATE key full_at_ns [full_at_frac]`: sets a bucket's exact state and derives its absolute
    /// expiry. It is what `RL.ACQUIRE` replicates and what AOF rewrites emit; it reads no
    /// clock, so replaying it anywhere gives the same bucket. Not counted: it is internal.
    set_state, c"RL.SETSTATE", set_state_body, false
);

/// Splits `name n1 … nN a b [c]`: the `N` names (the key, or the key and a field), the two
/// required arguments and the optional one.
#[allow(clippy::type_complexity)]
fn split_args<const N: usize>(
    argv: &[*mut RedisModuleString],
) -> Result<
    (
        [*mut RedisModuleString; N],
        [*mut RedisModuleString; 2],
        Option<*mut RedisModuleString>,
    ),
    Failure,
> {
    let (names, rest) = argv
        .get(1..)
        .and_then(|args| args.split_at_checked(N))
        .ok_or(Failure::Arity)?;
    let names: [*mut RedisModuleString; N] = names.try_into().map_err(|_| Failure::Arity)?;
    match *rest {
        [a, b] => Ok((names, [a, b], None)),
        [a, b, c] => Ok((names, [a, b], Some(c))),
        _ => Err(Failure::Arity),
    }
}

/// Parses `rate capacity [cost]`, through the memo of recently accepted limits.
fn parse_limit(
    [rate, capacity]: [*mut RedisModuleString; 2],
    cost: Option<*mut RedisModuleString>,
) -> Result<args::Acquire, Error> {
    // SAFETY (all): the strings are arguments of the running command.
    let (rate, capacity, cost) = unsafe { (bytes(rate), bytes(capacity), cost.map(|c| bytes(c))) };
    args::acquire_memo(rate, capacity, cost)
}

fn acquire_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let ([key], limit_args, cost) = split_args(argv)?;
    let parsed = parse_limit(limit_args, cost)?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    Ok(Reply::Decision(take(
        &mut bucket,
        &parsed.limit,
        parsed.cost,
    )?))
}

/// The pure step and commit of every taking command, on either store.
fn take(
    store: &mut impl Store,
    limit: &bucket::Limit,
    cost: bucket::Cost,
) -> Result<Decision, Error> {
    take_at(store, limit, cost, clock::now_us())
}

/// [`take`] at a given instant, for a handler that read the clock already.
fn take_at(
    store: &mut impl Store,
    limit: &bucket::Limit,
    cost: bucket::Cost,
    now_us: u64,
) -> Result<Decision, Error> {
    store.measure_and_replace(c"rl.take", |state| decide_take(limit, state, now_us, cost))
}

/// The pure step of every taking command: the decision, and the change it makes.
fn decide_take(
    limit: &bucket::Limit,
    state: Option<bucket::State>,
    now_us: u64,
    cost: bucket::Cost,
) -> (Decision, Change) {
    let (decision, new_state) = bucket::acquire(limit, state, now_us, cost);
    (decision, new_state.map_or(Change::Keep, Change::Set))
}

/// The pure step of `RL.PEEK` and `RL.HPEEK`: nothing is staged or committed.
fn look(store: &impl Store, parsed: &args::Acquire) -> Decision {
    bucket::peek(&parsed.limit, store.state(), clock::now_us(), parsed.cost)
}

/// The pure step and commit of `RL.REFUND` and `RL.HREFUND`.
fn give_back(
    store: &mut impl Store,
    parsed: &args::Acquire,
    now_us: u64,
) -> Result<Decision, Error> {
    store.measure_and_replace(c"rl.refund", |state| {
        bucket::refund(&parsed.limit, state, now_us, parsed.cost)
    })
}

/// The pure step and commit of `RL.CHARGE` and `RL.HCHARGE`. Past the bound nothing is
/// staged, so nothing is written.
fn post_paid(
    store: &mut impl Store,
    parsed: &args::Acquire,
    now_us: u64,
) -> Result<Charged, Error> {
    store.measure_and_replace(c"rl.charge", |state| {
        match bucket::charge(&parsed.limit, state, now_us, parsed.cost) {
            Ok((charged, new_state)) => (Ok(charged), new_state.map_or(Change::Keep, Change::Set)),
            Err(bucket::ChargeError::DebtTooLong) => (Err(Error::DebtTooLong), Change::Keep),
        }
    })?
}

/// `rate capacity cost` with the cost required, as `RL.CHARGE` and `RL.HCHARGE` take them.
fn split_charge_args<const N: usize>(
    argv: &[*mut RedisModuleString],
) -> Result<([*mut RedisModuleString; N], args::Acquire), Failure> {
    let (names, limit_args, cost) = split_args::<N>(argv)?;
    let cost = cost.ok_or(Failure::Arity)?;
    Ok((names, parse_limit(limit_args, Some(cost))?))
}

fn charge_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let ([key], parsed) = split_charge_args(argv)?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    Ok(Reply::Charge(post_paid(
        &mut bucket,
        &parsed,
        clock::now_us(),
    )?))
}

fn hcharge_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let ([key, field], parsed) = split_charge_args(argv)?;
    let now_us = clock::now_us();
    // SAFETY: `ctx`, `key` and `field` belong to the running command.
    let mut bucket = unsafe { TableKey::open(ctx, key, sweep_now_ns(now_us))?.field(bytes(field)) };
    Ok(Reply::Charge(post_paid(&mut bucket, &parsed, now_us)?))
}

fn peek_body(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<Reply, Failure> {
    let ([key], limit_args, cost) = split_args(argv)?;
    let parsed = parse_limit(limit_args, cost)?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let bucket = unsafe { BucketKey::open_read(ctx, key) }?;
    Ok(Reply::Peek(look(&bucket, &parsed)))
}

fn refund_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let ([key], limit_args, cost) = split_args(argv)?;
    let parsed = parse_limit(limit_args, cost)?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    Ok(Reply::Refund(give_back(
        &mut bucket,
        &parsed,
        clock::now_us(),
    )?))
}

fn throttle_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let (key, max_burst, count, period, quantity) = match *argv {
        [_, key, a, b, c] => (key, a, b, c, None),
        [_, key, a, b, c, d] => (key, a, b, c, Some(d)),
        _ => return Err(Failure::Arity),
    };
    // SAFETY (all): the strings are arguments of the running command.
    let parsed = unsafe {
        args::throttle(
            bytes(max_burst),
            bytes(count),
            bytes(period),
            quantity.map(|q| bytes(q)),
        )
    }?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    let decision = take(&mut bucket, &parsed.limit, parsed.cost)?;
    Ok(Reply::Throttle(decision, parsed.total))
}

/// The `GCRA` of the Redis 8.8 milestones, on the same bucket as `RL.THROTTLE`: `TOKENS count`
/// is the cost (0 checks without taking), and the reply is redis-cell's five integers.
fn gcra_body(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<Reply, Failure> {
    let (key, max_burst, tokens, period, option) = match *argv {
        [_, key, a, b, c] => (key, a, b, c, None),
        [_, key, a, b, c, name] => (key, a, b, c, Some((name, None))),
        [_, key, a, b, c, name, count] => (key, a, b, c, Some((name, Some(count)))),
        _ => return Err(Failure::Arity),
    };
    // SAFETY (all): the strings are arguments of the running command.
    let parsed = unsafe {
        args::gcra(
            bytes(max_burst),
            bytes(tokens),
            bytes(period),
            option.map(|(name, count)| (bytes(name), count.map(|c| bytes(c)))),
        )
    }?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    let decision = take(&mut bucket, &parsed.limit, parsed.cost)?;
    Ok(Reply::Throttle(decision, parsed.total))
}

fn acquire_multi_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let groups = argv.get(1..).ok_or(Failure::Arity)?;
    if groups.is_empty() || groups.len() % 4 != 0 {
        return Err(Failure::Arity);
    }
    // Checked before anything is parsed or opened, so a refused call costs O(1).
    if groups.len() / 4 > MAX_MULTI_BUCKETS {
        return Err(Error::TooManyBuckets.into());
    }
    // Parse every group before touching any key.
    let mut parsed = Vec::with_capacity(groups.len() / 4);
    for group in groups.chunks_exact(4) {
        let &[key, rate, capacity, cost] = group else {
            return Err(Failure::Arity);
        };
        parsed.push((key, parse_limit([rate, capacity], Some(cost))?));
    }
    // SAFETY: argument strings of the running command, which outlive this call.
    let names: Vec<&[u8]> = parsed
        .iter()
        .map(|(name, _)| unsafe { bytes(*name) })
        .collect();
    // A group naming a key already named shares that key's handle, so buckets named twice see
    // each other's takes. Keys open in the order first named.
    let mut handles: Vec<BucketKey> = Vec::new();
    let mut handle_of = Vec::with_capacity(parsed.len());
    for (i, first) in first_naming(&names).into_iter().enumerate() {
        let handle = if first == i {
            let (name, _) = parsed.get(i).ok_or(Error::Internal)?;
            // SAFETY: `ctx` and `name` belong to the running command.
            handles.push(unsafe { BucketKey::open(ctx, *name) }?);
            handles.len() - 1
        } else {
            // The first naming comes earlier, so its handle exists.
            *handle_of.get(first).ok_or(Error::Internal)?
        };
        handle_of.push(handle);
    }
    let now_us = clock::now_us();
    let mut decisions = Vec::with_capacity(parsed.len());
    for ((_, group), &handle) in parsed.iter().zip(&handle_of) {
        let bucket = handles.get_mut(handle).ok_or(Error::Internal)?;
        // Staged on each key, committed only if every group is allowed.
        let (decision, change) = decide_take(&group.limit, bucket.state(), now_us, group.cost);
        bucket.stage(change);
        decisions.push(decision);
    }
    let refused = decisions.iter().position(|d| !d.allowed());
    if refused.is_none() {
        for bucket in &mut handles {
            bucket.commit(c"rl.take")?;
        }
    }
    Ok(Reply::Multi(refused, decisions))
}

/// One table's buckets decided so far in a call: each tag and its latest state.
type Decided = Vec<(table::Tag, Option<bucket::State>)>;

/// `RL.ACQUIRE.MULTI` over buckets of tables: every group is parsed, every table opened and
/// every decision made before anything is written, and a table's changes are committed only
/// when every group is allowed and no table would pass its cap.
fn hacquire_multi_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let groups = argv.get(1..).ok_or(Failure::Arity)?;
    if groups.is_empty() || groups.len() % 5 != 0 {
        return Err(Failure::Arity);
    }
    // Checked before anything is parsed or opened, so a refused call costs O(1).
    if groups.len() / 5 > MAX_MULTI_BUCKETS {
        return Err(Error::TooManyTableBuckets.into());
    }
    let mut parsed = Vec::with_capacity(groups.len() / 5);
    for group in groups.chunks_exact(5) {
        let &[key, field, rate, capacity, cost] = group else {
            return Err(Failure::Arity);
        };
        // SAFETY: an argument of the running command.
        let tag = table::tag(unsafe { bytes(field) });
        parsed.push((key, tag, parse_limit([rate, capacity], Some(cost))?));
    }
    // SAFETY: argument strings of the running command, which outlive this call.
    let names: Vec<&[u8]> = parsed
        .iter()
        .map(|(name, _, _)| unsafe { bytes(*name) })
        .collect();
    let now_us = clock::now_us();
    // One handle per table, opened in the order first named, each with the buckets this call
    // has decided so far (tag and latest state), so a field named twice sees its own take.
    let mut tables: Vec<(TableKey, Decided)> = Vec::new();
    let mut table_of = Vec::with_capacity(parsed.len());
    for (i, first) in first_naming(&names).into_iter().enumerate() {
        let index = if first == i {
            let (name, _, _) = parsed.get(i).ok_or(Error::Internal)?;
            // SAFETY: `ctx` and `name` belong to the running command.
            let table = unsafe { TableKey::open(ctx, *name, sweep_now_ns(now_us)) }?;
            tables.push((table, Vec::new()));
            tables.len() - 1
        } else {
            *table_of.get(first).ok_or(Error::Internal)?
        };
        table_of.push(index);
    }
    // Where each (table, field) sits in its table's decided list: a lookup per group.
    let mut position_of: HashMap<(usize, table::Tag), usize> = HashMap::with_capacity(parsed.len());
    let mut decisions = Vec::with_capacity(parsed.len());
    for ((_, tag, group), &index) in parsed.iter().zip(&table_of) {
        let (table, decided) = tables.get_mut(index).ok_or(Error::Internal)?;
        let position = position_of.get(&(index, *tag)).copied();
        let state = match position.and_then(|p| decided.get(p)) {
            Some(&(_, state)) => state,
            None => table.get(*tag),
        };
        let (decision, change) = decide_take(&group.limit, state, now_us, group.cost);
        let new_state = match change {
            Change::Set(new_state) => Some(new_state),
            Change::Keep => state,
            Change::Delete => None,
        };
        match position.and_then(|p| decided.get_mut(p)) {
            Some(entry) => entry.1 = new_state,
            None => {
                position_of.insert((index, *tag), decided.len());
                decided.push((*tag, new_state));
            }
        }
        decisions.push(decision);
    }
    let refused = decisions.iter().position(|d| !d.allowed());
    if refused.is_none() {
        // No table may pass its cap, checked on all before any is written.
        for (table, decided) in &tables {
            let new_fields = decided
                .iter()
                .filter(|&&(tag, _)| table.get(tag).is_none())
                .count();
            if table.len().saturating_add(new_fields) > table::MAX_BUCKETS {
                return Err(Error::TableFull.into());
            }
        }
        for (table, decided) in &mut tables {
            for &(tag, state) in decided.iter() {
                if let Some(state) = state {
                    table.stage(tag, Some(state));
                }
            }
            table.commit(c"rl.take")?;
        }
    }
    Ok(Reply::Multi(refused, decisions))
}

/// The master's clock in ns, for the sweep a table write carries.
fn sweep_now_ns(now_us: u64) -> Option<u64> {
    Some(now_us.saturating_mul(1000))
}

fn hacquire_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let ([key, field], limit_args, cost) = split_args(argv)?;
    let parsed = parse_limit(limit_args, cost)?;
    let now_us = clock::now_us();
    // SAFETY: `ctx`, `key` and `field` belong to the running command.
    let mut bucket = unsafe { TableKey::open(ctx, key, sweep_now_ns(now_us))?.field(bytes(field)) };
    Ok(Reply::Decision(take_at(
        &mut bucket,
        &parsed.limit,
        parsed.cost,
        now_us,
    )?))
}

fn hpeek_body(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<Reply, Failure> {
    let ([key, field], limit_args, cost) = split_args(argv)?;
    let parsed = parse_limit(limit_args, cost)?;
    // SAFETY: `ctx`, `key` and `field` belong to the running command.
    let bucket = unsafe { TableKey::open_read(ctx, key)?.field(bytes(field)) };
    Ok(Reply::Peek(look(&bucket, &parsed)))
}

fn hrefund_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let ([key, field], limit_args, cost) = split_args(argv)?;
    let parsed = parse_limit(limit_args, cost)?;
    let now_us = clock::now_us();
    // SAFETY: `ctx`, `key` and `field` belong to the running command.
    let mut bucket = unsafe { TableKey::open(ctx, key, sweep_now_ns(now_us))?.field(bytes(field)) };
    Ok(Reply::Refund(give_back(&mut bucket, &parsed, now_us)?))
}

fn hdel_body(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<Reply, Failure> {
    let [_, key, ref fields @ ..] = *argv else {
        return Err(Failure::Arity);
    };
    if fields.is_empty() {
        return Err(Failure::Arity);
    }
    let now_ns = clock::now_us().saturating_mul(1000);
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut table = unsafe { TableKey::open(ctx, key, Some(now_ns)) }?;
    // A field named twice is removed and counted once.
    let mut seen = HashSet::with_capacity(fields.len());
    let mut live = 0;
    for &field in fields {
        // SAFETY: an argument of the running command.
        let tag = table::tag(unsafe { bytes(field) });
        if !seen.insert(tag) {
            continue;
        }
        if let Some(state) = table.get(tag) {
            table.stage(tag, None);
            if !table::is_full(state, now_ns) {
                live += 1;
            }
        }
    }
    table.commit(c"rl.hdel")?;
    Ok(Reply::Integer(live))
}

fn hlen_body(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<Reply, Failure> {
    let [_, key] = *argv else {
        return Err(Failure::Arity);
    };
    // SAFETY: `ctx` and `key` belong to the running command.
    let table = unsafe { TableKey::open_read(ctx, key) }?;
    Ok(Reply::Integer(table.len() as u64))
}

fn hset_state_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let [_, key, ref groups @ ..] = *argv else {
        return Err(Failure::Arity);
    };
    if groups.is_empty() || groups.len() % 3 != 0 {
        return Err(Failure::Arity);
    }
    // Parse every group before touching the key.
    let mut changes = Vec::with_capacity(groups.len() / 3);
    for group in groups.chunks_exact(3) {
        let &[tag, full_at_ns, full_at_frac] = group else {
            return Err(Failure::Arity);
        };
        // SAFETY (all): arguments of the running command.
        let (tag, full_at_ns, full_at_frac) =
            unsafe { (bytes(tag), bytes(full_at_ns), bytes(full_at_frac)) };
        let tag: [u8; 16] = tag.try_into().map_err(|_| Error::Tag)?;
        let state = if full_at_ns == b"0" {
            if full_at_frac != b"0" {
                return Err(Error::FullAtFrac.into());
            }
            None
        } else {
            Some(args::state(full_at_ns, Some(full_at_frac))?)
        };
        changes.push((table::Tag::from_le_bytes(tag), state));
    }
    // SAFETY: `ctx` and `key` belong to the running command. No sweep: only the master's own
    // commands sweep, by the master's clock.
    let mut table = unsafe { TableKey::open(ctx, key, None) }?;
    for (tag, state) in changes {
        table.stage(tag, state);
    }
    table.commit(c"rl.hsetstate")?;
    Ok(Reply::Ok)
}

/// For each name, the position of the first name equal to it (its own position if it is the
/// first). A stable sort of the positions by name bytes puts equal names side by side, first
/// naming first: O(N log N) comparisons, each a `memcmp` of two keys, where comparing every
/// name with every earlier one was quadratic (seconds of server time at 30,000 keys).
fn first_naming(key_bytes: &[&[u8]]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..key_bytes.len()).collect();
    order.sort_by_key(|&i| key_bytes.get(i).copied());
    let mut first: Vec<usize> = (0..key_bytes.len()).collect();
    let mut run_start: Option<usize> = None;
    for pair in order.windows(2) {
        let &[previous, current] = pair else { continue };
        if key_bytes.get(previous) == key_bytes.get(current) {
            let leader = *run_start.get_or_insert(previous);
            if let Some(slot) = first.get_mut(current) {
                *slot = leader;
            }
        } else {
            run_start = None;
        }
    }
    first
}

fn set_state_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let (key, full_at_ns, full_at_frac) = match *argv {
        [_, key, ns] => (key, ns, None),
        [_, key, ns, frac] => (key, ns, Some(frac)),
        _ => return Err(Failure::Arity),
    };
    // SAFETY (both): arguments of the running command.
    let state = unsafe { args::state(bytes(full_at_ns), full_at_frac.map(|f| bytes(f))) }?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    bucket.replicate_verbatim();
    bucket.measure_and_replace(c"rl.setstate", |_| ((), Change::Set(state)))?;
    Ok(Reply::Ok)
}

/// The four integers of `RL.ACQUIRE`'s reply.
fn four(decision: &Decision) -> [i64; 4] {
    [
        i64::from(decision.allowed()),
        saturating_i64(decision.remaining),
        decision.retry_after_ms(),
        decision.reset_after_ms(),
    ]
}

/// The five integers of redis-cell's reply (RL.GCRA's): limited, `total`, remaining,
/// retry_after_s (-1 unless waiting helps), reset_after_s. Waits round up to whole seconds, so
/// that waiting that long works.
fn five(decision: &Decision, total: u64) -> [i64; 5] {
    let retry_after_s = match decision.outcome {
        Outcome::Denied => seconds_ceil(decision.retry_after_ns),
        Outcome::Allowed | Outcome::Impossible => -1,
    };
    [
        i64::from(!decision.allowed()),
        saturating_i64(total),
        saturating_i64(decision.remaining),
        retry_after_s,
        seconds_ceil(decision.reset_after_ns),
    ]
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn seconds_ceil(ns: u64) -> i64 {
    saturating_i64(ns.div_ceil(1_000_000_000))
}

/// The bytes of a command argument.
///
/// # Safety
/// `s` must be a live RedisModuleString that outlives the returned slice (true for `argv`
/// entries during the call).
unsafe fn bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { crate::store::string_bytes(s) }
}

/// Sends integers as one flat array.
///
/// # Safety
/// `ctx` must be live.
unsafe fn send_integers(ctx: *mut RedisModuleCtx, values: &[i64]) -> c_int {
    // SAFETY: `ctx` is live (caller).
    unsafe {
        let (Some(array), Some(integer)) = (
            raw::RedisModule_ReplyWithArray,
            raw::RedisModule_ReplyWithLongLong,
        ) else {
            return raw::REDISMODULE_ERR as c_int;
        };
        array(ctx, values.len() as _);
        for &value in values {
            integer(ctx, value);
        }
        raw::REDISMODULE_OK as c_int
    }
}

unsafe fn send(ctx: *mut RedisModuleCtx, reply: &Reply) -> c_int {
    // SAFETY: `ctx` is live (caller).
    unsafe {
        match reply {
            Reply::Decision(decision) => send_integers(ctx, &four(decision)),
            // A peek reports the signed balance, negative while the bucket is in debt.
            Reply::Peek(decision) => send_integers(
                ctx,
                &[
                    i64::from(decision.allowed()),
                    decision.balance,
                    decision.retry_after_ms(),
                    decision.reset_after_ms(),
                ],
            ),
            Reply::Charge(charged) => send_integers(
                ctx,
                &[
                    1,
                    charged.balance,
                    charged.retry_after_ms(),
                    charged.reset_after_ms(),
                ],
            ),
            Reply::Throttle(decision, total) => send_integers(ctx, &five(decision, *total)),
            Reply::Refund(decision) => send_integers(
                ctx,
                &[
                    saturating_i64(decision.remaining),
                    decision.reset_after_ms(),
                ],
            ),
            Reply::Multi(refused, decisions) => {
                // The longest wait among the refusing buckets, or -1 if one of them can never
                // succeed.
                let retry_after_ms = decisions
                    .iter()
                    .filter(|d| !d.allowed())
                    .map(Decision::retry_after_ms)
                    .try_fold(0i64, |longest, ms| (ms >= 0).then_some(longest.max(ms)))
                    .unwrap_or(-1);
                let head = [
                    i64::from(refused.is_none()),
                    refused.map_or(-1, |i| i64::try_from(i).unwrap_or(i64::MAX)),
                    retry_after_ms,
                ];
                let Some(array) = raw::RedisModule_ReplyWithArray else {
                    return raw::REDISMODULE_ERR as c_int;
                };
                array(ctx, (head.len() + 1) as _);
                for &value in &head {
                    if let Some(integer) = raw::RedisModule_ReplyWithLongLong {
                        integer(ctx, value);
                    }
                }
                array(ctx, decisions.len() as _);
                for decision in decisions {
                    send_integers(ctx, &four(decision));
                }
                raw::REDISMODULE_OK as c_int
            }
            Reply::Integer(value) => match raw::RedisModule_ReplyWithLongLong {
                Some(integer) => integer(ctx, saturating_i64(*value)),
                None => raw::REDISMODULE_ERR as c_int,
            },
            Reply::Ok => match raw::RedisModule_ReplyWithSimpleString {
                Some(simple) => simple(ctx, c"OK".as_ptr()),
                None => raw::REDISMODULE_ERR as c_int,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::first_naming;

    /// The quadratic definition, obviously right: the first position holding the same bytes.
    fn first_naming_by_scan(names: &[&[u8]]) -> Vec<usize> {
        names
            .iter()
            .map(|name| names.iter().position(|other| other == name).unwrap())
            .collect()
    }

    #[test]
    fn first_naming_points_each_name_at_its_first_occurrence() {
        let rows: &[(&[&[u8]], &[usize])] = &[
            // no names
            (&[], &[]),
            // all distinct: each is its own first
            (&[b"b", b"a", b"c"], &[0, 1, 2]),
            // a key named twice, apart: the later one points back
            (&[b"a", b"b", b"a"], &[0, 1, 0]),
            // three times, out of sort order, beside another pair
            (&[b"z", b"y", b"z", b"y", b"z"], &[0, 1, 0, 1, 0]),
            // a prefix is a different key; so is the empty key
            (&[b"ab", b"a", b"", b"a", b""], &[0, 1, 2, 1, 2]),
        ];
        for (names, want) in rows {
            assert_eq!(first_naming(names), *want, "{names:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn first_naming_agrees_with_a_scan(
            names in proptest::collection::vec(proptest::collection::vec(0u8..4, 0..3), 0..60)
        ) {
            let names: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
            proptest::prop_assert_eq!(first_naming(&names), first_naming_by_scan(&names));
        }
    }
}
