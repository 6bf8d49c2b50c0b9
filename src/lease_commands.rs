//! The lease commands, one handler each: parse everything, open the key, run the pure step
//! (`rl_bucket::lease`, `release`, `renew`, `leases_in_use`), apply its change through
//! [`LeaseKey`], reply.
//!
//! - `RL.LEASE key limit ttl_ms [ID id]` → `[1, id, in_use, expires_in_ms]`, or
//!   `[0, "", in_use, retry_after_ms]` when `limit` leases are held.
//! - `RL.RELEASE key id` → 1 if the lease was held, else 0.
//! - `RL.RENEW key id ttl_ms` → 1 if the lease was held (it now expires `ttl_ms` from now),
//!   else 0.
//! - `RL.LEASES key limit` → `[in_use, retry_after_ms]`; reads only.
//! - `RL.LEASESETSTATE key drop_until_us id expires_at_us [id expires_at_us ...]`: internal,
//!   what the others replicate and AOF rewrites emit; reads no clock.
//!
//! Ids the server makes are 16 lowercase hex characters, 64 bits from the server's random
//! generator (`RedisModule_GetRandomHexChars`, seeded from /dev/urandom at each start), drawn
//! again while a lease stored under the key has the same id. So a made id is unique among
//! the key's leases when made, on every server, since replicas and the AOF receive the id
//! itself; it names a lease only within its key and while it is held. What 64 bits leave is a
//! holder whose lease already expired releasing or renewing a later lease that drew its id:
//! at most `limit / 2^64` per such late call (5e-16 at the cap), well below the risk of a
//! mistyped id, so 128 bits (32 characters, past the 16 bytes an id may hold inline) buy
//! nothing worth the memory.
//!
//! Depends on `lease_type`, `args` (the integer parser), `clock`, `handler` and `error`.

use std::ffi::{c_char, c_int};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use rl_bucket::{
    LeaseId, LeaseReply, MAX_EXPIRES_AT_US, MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT, MAX_LEASE_TTL_MS,
};

use crate::error::Error;
use crate::handler::{self, handler, Failure};
use crate::lease_type::LeaseKey;
use crate::{args, clock};

/// How many ids a take draws before giving up: a fourth collision among at most 10,000
/// leases in 2^64 ids does not happen, so reaching it means the generator is broken.
const ID_DRAWS: usize = 4;

/// What a lease command answers when it succeeds.
enum Reply {
    /// `RL.LEASE`: the step's reply and the lease's id.
    Lease(LeaseReply, LeaseId),
    /// `RL.RELEASE`, `RL.RENEW`: 1 or 0.
    Flag(bool),
    /// `RL.LEASES`: `[in_use, retry_after_ms]`.
    InUse(u64, u64),
    /// `+OK`.
    Ok,
}

handler!(
    /// `RL.LEASE key limit ttl_ms [ID id]`
    lease, c"RL.LEASE", lease_body, true
);
handler!(
    /// `RL.RELEASE key id`
    release, c"RL.RELEASE", release_body, true
);
handler!(
    /// `RL.RENEW key id ttl_ms`
    renew, c"RL.RENEW", renew_body, true
);
handler!(
    /// `RL.LEASES key limit`
    leases, c"RL.LEASES", leases_body, true
);
handler!(
    /// `RL.LEASESETSTATE key drop_until_us id expires_at_us [id expires_at_us ...]`: not
    /// counted, it is internal.
    lease_set_state, c"RL.LEASESETSTATE", lease_set_state_body, false
);

/// `limit`: an integer from 1 to the cap.
fn parse_limit(bytes: &[u8]) -> Result<u64, Error> {
    args::integer(bytes)
        .filter(|limit| (1..=MAX_LEASE_LIMIT).contains(limit))
        .ok_or(Error::LeaseLimit)
}

/// `ttl_ms`: an integer from 1 to 100 years.
fn parse_ttl(bytes: &[u8]) -> Result<u64, Error> {
    args::integer(bytes)
        .filter(|ttl| (1..=MAX_LEASE_TTL_MS).contains(ttl))
        .ok_or(Error::LeaseTtl)
}

fn parse_id(bytes: &[u8]) -> Result<LeaseId, Error> {
    LeaseId::new(bytes).ok_or(Error::LeaseId)
}

/// An absolute instant of `RL.LEASESETSTATE`, in µs: 0 to the latest storable expiry.
fn parse_instant(bytes: &[u8], error: Error) -> Result<u64, Error> {
    args::integer(bytes)
        .filter(|&us| us <= MAX_EXPIRES_AT_US)
        .ok_or(error)
}

fn lease_body(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<Reply, Failure> {
    let (key, limit, ttl, option) = match *argv {
        [_, key, limit, ttl] => (key, limit, ttl, None),
        [_, key, limit, ttl, name] => (key, limit, ttl, Some((name, None))),
        [_, key, limit, ttl, name, id] => (key, limit, ttl, Some((name, Some(id)))),
        _ => return Err(Failure::Arity),
    };
    // SAFETY (all): arguments of the running command.
    let limit = parse_limit(unsafe { bytes(limit) })?;
    let ttl_ms = parse_ttl(unsafe { bytes(ttl) })?;
    let chosen = match option {
        None => None,
        Some((name, id)) => {
            if !unsafe { bytes(name) }.eq_ignore_ascii_case(b"ID") {
                return Err(Error::LeaseOption.into());
            }
            let id = id.ok_or(Error::LeaseIdMissing)?;
            Some(parse_id(unsafe { bytes(id) })?)
        }
    };
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut leases = unsafe { LeaseKey::open(ctx, key, true) }?;
    let id = match chosen {
        Some(id) => id,
        None => draw_id(&leases)?,
    };
    let now_us = clock::now_us();
    let (reply, change) = rl_bucket::lease(leases.set(), limit, now_us, ttl_ms, id);
    if let Some(change) = change {
        leases.apply(
            change.drop_until_us,
            &[(change.id, change.expires_at_us)],
            c"rl.lease",
            false,
        )?;
    }
    Ok(Reply::Lease(reply, id))
}

/// A new id, 16 hex characters, that no lease stored under the key has.
fn draw_id(leases: &LeaseKey) -> Result<LeaseId, Error> {
    // SAFETY: read once, after load.
    let random = unsafe { raw::RedisModule_GetRandomHexChars }.ok_or(Error::Internal)?;
    for _ in 0..ID_DRAWS {
        let mut hex = [0u8; MAX_LEASE_ID_BYTES];
        // SAFETY: writes exactly `hex.len()` bytes into the buffer.
        unsafe { random(hex.as_mut_ptr().cast::<c_char>(), hex.len()) };
        let id = parse_id(&hex).map_err(|_| Error::Internal)?;
        if leases.set().and_then(|set| set.find(id)).is_none() {
            return Ok(id);
        }
    }
    Err(Error::Internal)
}

fn release_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let &[_, key, id] = argv else {
        return Err(Failure::Arity);
    };
    // SAFETY: an argument of the running command.
    let id = parse_id(unsafe { bytes(id) })?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut leases = unsafe { LeaseKey::open(ctx, key, true) }?;
    let (released, change) = rl_bucket::release(leases.set(), clock::now_us(), id);
    if let Some(change) = change {
        leases.apply(
            change.drop_until_us,
            &[(change.id, change.expires_at_us)],
            c"rl.release",
            false,
        )?;
    }
    Ok(Reply::Flag(released))
}

fn renew_body(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<Reply, Failure> {
    let &[_, key, id, ttl] = argv else {
        return Err(Failure::Arity);
    };
    // SAFETY (both): arguments of the running command.
    let id = parse_id(unsafe { bytes(id) })?;
    let ttl_ms = parse_ttl(unsafe { bytes(ttl) })?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut leases = unsafe { LeaseKey::open(ctx, key, true) }?;
    let (renewed, change) = rl_bucket::renew(leases.set(), clock::now_us(), id, ttl_ms);
    if let Some(change) = change {
        leases.apply(
            change.drop_until_us,
            &[(change.id, change.expires_at_us)],
            c"rl.renew",
            false,
        )?;
    }
    Ok(Reply::Flag(renewed))
}

fn leases_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let &[_, key, limit] = argv else {
        return Err(Failure::Arity);
    };
    // SAFETY: an argument of the running command.
    let limit = parse_limit(unsafe { bytes(limit) })?;
    // SAFETY: `ctx` and `key` belong to the running command; opened for reading only.
    let leases = unsafe { LeaseKey::open(ctx, key, false) }?;
    let (in_use, wait_us) = rl_bucket::leases_in_use(leases.set(), limit, clock::now_us());
    Ok(Reply::InUse(in_use, wait_us.div_ceil(1_000)))
}

fn lease_set_state_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let [_, key, drop_until, pairs @ ..] = argv else {
        return Err(Failure::Arity);
    };
    if pairs.is_empty() || pairs.len() % 2 != 0 {
        return Err(Failure::Arity);
    }
    if pairs.len() / 2 > usize::try_from(MAX_LEASE_LIMIT).unwrap_or(usize::MAX) {
        return Err(Error::TooManyLeases.into());
    }
    // SAFETY (all): arguments of the running command.
    let drop_until_us = parse_instant(unsafe { bytes(*drop_until) }, Error::DropUntil)?;
    let mut puts = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks_exact(2) {
        let &[id, at] = pair else {
            return Err(Failure::Arity);
        };
        let id = parse_id(unsafe { bytes(id) })?;
        puts.push((id, parse_instant(unsafe { bytes(at) }, Error::ExpiresAt)?));
    }
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut leases = unsafe { LeaseKey::open(ctx, *key, true) }?;
    leases.apply(drop_until_us, &puts, c"rl.leasesetstate", true)?;
    Ok(Reply::Ok)
}

/// The bytes of a command argument (`argv` entries outlive the call).
///
/// # Safety
/// `s` must be a live RedisModuleString that outlives the returned slice.
unsafe fn bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { crate::store::string_bytes(s) }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl handler::Reply for Reply {
    /// A lease taken is allowed, one refused denied; the other calls decide nothing.
    fn verdict(&self) -> Option<bool> {
        match self {
            Reply::Lease(reply, _) => Some(reply.held()),
            _ => None,
        }
    }

    unsafe fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        // SAFETY: `ctx` is live (caller).
        unsafe { send(ctx, self) }
    }
}

/// # Safety
/// `ctx` must be live.
unsafe fn send(ctx: *mut RedisModuleCtx, reply: &Reply) -> c_int {
    // SAFETY: `ctx` is live (caller); the buffers outlive the calls.
    unsafe {
        let (Some(array), Some(integer), Some(buffer), Some(simple)) = (
            raw::RedisModule_ReplyWithArray,
            raw::RedisModule_ReplyWithLongLong,
            raw::RedisModule_ReplyWithStringBuffer,
            raw::RedisModule_ReplyWithSimpleString,
        ) else {
            return raw::REDISMODULE_ERR as c_int;
        };
        match reply {
            Reply::Lease(reply, id) => {
                let id: &[u8] = if reply.held() { id.as_bytes() } else { b"" };
                array(ctx, 4);
                integer(ctx, i64::from(reply.held()));
                buffer(ctx, id.as_ptr().cast::<c_char>(), id.len());
                integer(ctx, saturating_i64(reply.in_use));
                integer(ctx, saturating_i64(reply.wait_ms()))
            }
            Reply::Flag(flag) => integer(ctx, i64::from(*flag)),
            Reply::InUse(in_use, retry_after_ms) => {
                array(ctx, 2);
                integer(ctx, saturating_i64(*in_use));
                integer(ctx, saturating_i64(*retry_after_ms))
            }
            Reply::Ok => simple(ctx, c"OK".as_ptr()),
        }
    }
}
