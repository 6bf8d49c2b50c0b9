//! The reservation commands on per-key buckets, one handler each: parse everything, open the
//! key, run the pure step (`rl_bucket::reserve`, `settle_reservation`), store the bucket and
//! its open reservations through [`BucketKey::commit_records`], reply.
//!
//! - `RL.RESERVE key rate capacity estimate ttl_ms [ID id]` → `[allowed, id, remaining,
//!   retry_after_ms]`: takes `estimate` exactly as `RL.ACQUIRE` takes that cost and records
//!   the reservation; a denial (`[0, "", remaining, retry_after_ms]`) writes nothing. An `ID`
//!   already open answers `[1, id, remaining, 0]` and takes nothing, so a retry is safe.
//! - `RL.SETTLE key rate capacity id actual` → `[balance, retry_after_ms, reset_after_ms]`:
//!   gives back the over-estimate (as `RL.REFUND`) or charges the under-estimate (as
//!   `RL.CHARGE`), and consumes the record; an id not open is an error naming it.
//! - `RL.RESVSTATE key full_at_ns full_at_frac [id estimate expires_at_us ...]`: internal,
//!   what the others replicate and AOF rewrites emit: the exact state and every record.
//! - `RL.HRESERVE key field ...` and `RL.HSETTLE key field ...`: the same on one bucket of a
//!   table, whose records the table keeps beside its buckets ([`TableKey::commit_records`]);
//!   `RL.HRESVSTATE key tag full_at_ns full_at_frac [id estimate expires_at_us ...]` is what
//!   they replicate.
//!
//! Ids the server makes are drawn as `RL.LEASE` draws them (16 hex characters from the
//! server's random generator, drawn again while a record of the key has the same id).
//!
//! Depends on `datatype`, `table`, `table_type`, `args`, `clock`, `handler` and `error`.

use std::ffi::{c_char, c_int, CString};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use rl_bucket::{
    Change, Charged, Cost, Decision, LeaseId, Reservation, ReserveError, Reserved, SettleError,
    State, MAX_EXPIRES_AT_US, MAX_LEASE_ID_BYTES, MAX_RESERVATIONS, MAX_RESERVATION_TTL_MS,
};

use crate::datatype::BucketKey;
use crate::error::Error;
use crate::handler::{self, handler, Failure};
use crate::store::Store;
use crate::table::{self, Tag};
use crate::table_type::TableKey;
use crate::{args, clock};

/// How many ids a reservation draws before giving up (see `lease_commands`).
const ID_DRAWS: usize = 4;

enum Reply {
    /// `RL.RESERVE`: the decision and the reservation's id (sent empty on a denial).
    Reserve(Decision, LeaseId),
    /// `RL.SETTLE`: the bucket after the settle.
    Settle(Charged),
    /// `+OK`.
    Ok,
}

handler!(
    /// `RL.RESERVE key rate capacity estimate ttl_ms [ID id]`
    reserve, c"RL.RESERVE", reserve_body, true
);
handler!(
    /// `RL.SETTLE key rate capacity id actual`
    settle, c"RL.SETTLE", settle_body, true
);
handler!(
    /// `RL.HRESERVE key field rate capacity estimate ttl_ms [ID id]`
    hreserve, c"RL.HRESERVE", hreserve_body, true
);
handler!(
    /// `RL.HSETTLE key field rate capacity id actual`
    hsettle, c"RL.HSETTLE", hsettle_body, true
);
handler!(
    /// `RL.HRESVSTATE key tag full_at_ns full_at_frac [id estimate expires_at_us ...]`: not
    /// counted, it is internal.
    hresv_state, c"RL.HRESVSTATE", hresv_state_body, false
);
handler!(
    /// `RL.RESVSTATE key full_at_ns full_at_frac [id estimate expires_at_us ...]`: not
    /// counted, it is internal.
    resv_state, c"RL.RESVSTATE", resv_state_body, false
);

/// `rate capacity amount`, the amount's error renamed to the argument it is. Through the
/// memo of recently accepted limits `RL.ACQUIRE` uses: parsing a limit exactly was the
/// largest part of a reserve's and a settle's own instructions.
fn parse_limit(
    rate: &[u8],
    capacity: &[u8],
    amount: &[u8],
    amount_error: Error,
) -> Result<args::Acquire, Error> {
    args::acquire_memo(rate, capacity, Some(amount)).map_err(|error| match error {
        Error::Cost => amount_error,
        other => other,
    })
}

fn parse_id(bytes: &[u8]) -> Result<LeaseId, Error> {
    LeaseId::new(bytes).ok_or(Error::LeaseId)
}

/// A reserve's arguments after its key (and field), parsed.
struct ReserveArgs {
    parsed: args::Acquire,
    ttl_ms: u64,
    chosen: Option<LeaseId>,
}

/// `rate capacity estimate ttl_ms [ID id]`, checked in order.
fn parse_reserve(
    rest: &[*mut RedisModuleString],
    option_error: Error,
) -> Result<ReserveArgs, Failure> {
    let (rate, capacity, estimate, ttl, option) = match *rest {
        [r, c, e, t] => (r, c, e, t, None),
        [r, c, e, t, name] => (r, c, e, t, Some((name, None))),
        [r, c, e, t, name, id] => (r, c, e, t, Some((name, Some(id)))),
        _ => return Err(Failure::Arity),
    };
    // SAFETY (all): arguments of the running command.
    let parsed = unsafe {
        parse_limit(
            bytes(rate),
            bytes(capacity),
            bytes(estimate),
            Error::Estimate,
        )
    }?;
    if parsed.cost.exact().is_zero() {
        return Err(Error::Estimate.into());
    }
    let ttl_ms = args::integer(unsafe { bytes(ttl) })
        .filter(|ttl| (1..=MAX_RESERVATION_TTL_MS).contains(ttl))
        .ok_or(Error::LeaseTtl)?;
    let chosen = match option {
        None => None,
        Some((name, id)) => {
            if !unsafe { bytes(name) }.eq_ignore_ascii_case(b"ID") {
                return Err(option_error.into());
            }
            let id = id.ok_or(Error::LeaseIdMissing)?;
            Some(parse_id(unsafe { bytes(id) })?)
        }
    };
    Ok(ReserveArgs {
        parsed,
        ttl_ms,
        chosen,
    })
}

impl ReserveArgs {
    /// The pure step on a bucket's `state` and `records` at `now_us`, under the id the caller
    /// chose or else a new one: what to reply and write, and the id.
    fn reserve(
        &self,
        state: Option<State>,
        records: &[Reservation],
        now_us: u64,
    ) -> Result<(Reserved, LeaseId), Error> {
        let id = match self.chosen {
            Some(id) => id,
            None => draw_id(records)?,
        };
        let reserved = rl_bucket::reserve(
            &self.parsed.limit,
            state,
            records,
            now_us,
            self.parsed.cost,
            self.ttl_ms,
            id,
        )
        .map_err(|error| match error {
            ReserveError::TooMany => Error::TooManyReservations,
            ReserveError::ZeroEstimate => Error::Estimate,
        })?;
        Ok((reserved, id))
    }
}

fn reserve_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let [_, key, ref rest @ ..] = *argv else {
        return Err(Failure::Arity);
    };
    let args = parse_reserve(rest, Error::ReserveOption)?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    let (reserved, id) = args.reserve(bucket.state(), bucket.records(), clock::now_us())?;
    if let Some((state, records)) = reserved.write {
        bucket.commit_records(Change::Set(state), records, c"rl.reserve")?;
    }
    Ok(Reply::Reserve(reserved.decision, id))
}

fn hreserve_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let [_, key, field, ref rest @ ..] = *argv else {
        return Err(Failure::Arity);
    };
    let args = parse_reserve(rest, Error::HReserveOption)?;
    let now_us = clock::now_us();
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut table = unsafe { TableKey::open(ctx, key, Some(now_us.saturating_mul(1000))) }?;
    // SAFETY: an argument of the running command.
    let tag = table::tag(unsafe { bytes(field) });
    let (reserved, id) = args.reserve(table.get(tag), &table.records(tag), now_us)?;
    if let Some((state, records)) = reserved.write {
        table.commit_records(tag, Change::Set(state), records.into_vec(), c"rl.hreserve")?;
    }
    Ok(Reply::Reserve(reserved.decision, id))
}

/// A new id, 16 hex characters, that no record of the key has.
fn draw_id(records: &[Reservation]) -> Result<LeaseId, Error> {
    // SAFETY: read once, after load.
    let random = unsafe { raw::RedisModule_GetRandomHexChars }.ok_or(Error::Internal)?;
    for _ in 0..ID_DRAWS {
        let mut hex = [0u8; MAX_LEASE_ID_BYTES];
        // SAFETY: writes exactly `hex.len()` bytes into the buffer.
        unsafe { random(hex.as_mut_ptr().cast::<c_char>(), hex.len()) };
        let id = parse_id(&hex).map_err(|_| Error::Internal)?;
        if records.iter().all(|record| record.id != id) {
            return Ok(id);
        }
    }
    Err(Error::Internal)
}

fn settle_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let &[_, key, rate, capacity, id, actual] = argv else {
        return Err(Failure::Arity);
    };
    // SAFETY (all): arguments of the running command.
    let parsed =
        unsafe { parse_limit(bytes(rate), bytes(capacity), bytes(actual), Error::Actual) }?;
    let id = parse_id(unsafe { bytes(id) })?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    let records = bucket.records();
    let (charged, change, left) = rl_bucket::settle_reservation(
        &parsed.limit,
        bucket.state(),
        records,
        clock::now_us(),
        id,
        parsed.cost,
    )
    .map_err(|error| match error {
        SettleError::NotOpen => Failure::Text(not_open_text(id, false)),
        SettleError::DebtTooLong => Failure::Error(Error::DebtTooLong),
    })?;
    bucket.commit_records(change, left, c"rl.settle")?;
    Ok(Reply::Settle(charged))
}

fn hsettle_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let &[_, key, field, rate, capacity, id, actual] = argv else {
        return Err(Failure::Arity);
    };
    // SAFETY (all): arguments of the running command.
    let parsed =
        unsafe { parse_limit(bytes(rate), bytes(capacity), bytes(actual), Error::Actual) }?;
    let id = parse_id(unsafe { bytes(id) })?;
    let now_us = clock::now_us();
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut table = unsafe { TableKey::open(ctx, key, Some(now_us.saturating_mul(1000))) }?;
    // SAFETY: an argument of the running command.
    let tag = table::tag(unsafe { bytes(field) });
    let records = table.records(tag);
    let (charged, change, left) = rl_bucket::settle_reservation(
        &parsed.limit,
        table.get(tag),
        &records,
        now_us,
        id,
        parsed.cost,
    )
    .map_err(|error| match error {
        SettleError::NotOpen => Failure::Text(not_open_text(id, true)),
        SettleError::DebtTooLong => Failure::Error(Error::DebtTooLong),
    })?;
    table.commit_records(tag, change, left.into_vec(), c"rl.hsettle")?;
    Ok(Reply::Settle(charged))
}

/// Whole `id estimate expires_at_us` triples, at most [`MAX_RESERVATIONS`] of them: checked
/// before anything else of the state commands is parsed.
fn check_triples(triples: &[*mut RedisModuleString]) -> Result<(), Failure> {
    if triples.len() % 3 != 0 {
        return Err(Failure::Arity);
    }
    if triples.len() / 3 > MAX_RESERVATIONS {
        return Err(Error::TooManyReservations.into());
    }
    Ok(())
}

/// `id estimate expires_at_us` triples, checked as a loader checks stored records.
fn parse_records(triples: &[*mut RedisModuleString]) -> Result<Vec<Reservation>, Failure> {
    check_triples(triples)?;
    let mut records = Vec::with_capacity(triples.len() / 3);
    for triple in triples.chunks_exact(3) {
        let &[id, estimate, expires_at] = triple else {
            return Err(Failure::Arity);
        };
        // SAFETY (all): arguments of the running command.
        let id = parse_id(unsafe { bytes(id) })?;
        let estimate = Cost::parse(unsafe { bytes(estimate) })
            .filter(|cost| !cost.exact().is_zero())
            .ok_or(Error::Estimate)?;
        let expires_at_us = args::integer(unsafe { bytes(expires_at) })
            .filter(|at| (1..=MAX_EXPIRES_AT_US).contains(at))
            .ok_or(Error::ReservationExpiresAt)?;
        records.push(
            Reservation::new(id, estimate, expires_at_us).ok_or(Error::ReservationExpiresAt)?,
        );
    }
    if !rl_bucket::valid_records(&records) {
        return Err(Error::TooManyReservations.into());
    }
    Ok(records)
}

fn hresv_state_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let [_, key, tag, full_at_ns, full_at_frac, ref triples @ ..] = *argv else {
        return Err(Failure::Arity);
    };
    check_triples(triples)?;
    // SAFETY (all): arguments of the running command.
    let tag: [u8; 16] = unsafe { bytes(tag) }.try_into().map_err(|_| Error::Tag)?;
    let state = unsafe { args::state(bytes(full_at_ns), Some(bytes(full_at_frac))) }?;
    let records = parse_records(triples)?;
    // SAFETY: `ctx` and `key` belong to the running command. No sweep: what the master
    // swept arrives as its own effect.
    let mut table = unsafe { TableKey::open(ctx, key, None) }?;
    table.commit_records(
        Tag::from_le_bytes(tag),
        Change::Set(state),
        records,
        c"rl.hresvstate",
    )?;
    Ok(Reply::Ok)
}

fn resv_state_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let [_, key, full_at_ns, full_at_frac, ref triples @ ..] = *argv else {
        return Err(Failure::Arity);
    };
    check_triples(triples)?;
    // SAFETY (all): arguments of the running command.
    let state = unsafe { args::state(bytes(full_at_ns), Some(bytes(full_at_frac))) }?;
    let records = parse_records(triples)?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let mut bucket = unsafe { BucketKey::open(ctx, key) }?;
    bucket.replicate_verbatim();
    bucket.commit_records(Change::Set(state), records.into(), c"rl.resvstate")?;
    Ok(Reply::Ok)
}

/// The text of `RL.SETTLE`'s error for an id with no open reservation, naming the id (bytes
/// outside printable ASCII as `\xNN`, so the reply stays one line).
fn not_open_text(id: LeaseId, field: bool) -> CString {
    let mut shown = String::new();
    for &byte in id.as_bytes() {
        if byte.is_ascii_graphic() && byte != b'\\' {
            shown.push(char::from(byte));
        } else {
            shown.push_str(&format!("\\x{byte:02x}"));
        }
    }
    let of = if field { "field" } else { "key" };
    let text = format!(
        "ERR id {shown} is not an open reservation of this {of} (settled, expired or never made)"
    );
    // The text holds no NUL: every byte of the id outside printable ASCII was escaped.
    CString::new(text).unwrap_or_default()
}

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
    /// A reservation taken is allowed, one refused denied; a settle decides nothing.
    fn verdict(&self) -> Option<bool> {
        match self {
            Reply::Reserve(decision, _) => Some(decision.allowed()),
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
            Reply::Reserve(decision, id) => {
                let id: &[u8] = if decision.allowed() {
                    id.as_bytes()
                } else {
                    b""
                };
                array(ctx, 4);
                integer(ctx, i64::from(decision.allowed()));
                buffer(ctx, id.as_ptr().cast::<c_char>(), id.len());
                integer(ctx, saturating_i64(decision.remaining));
                integer(ctx, decision.retry_after_ms())
            }
            Reply::Settle(charged) => {
                array(ctx, 3);
                integer(ctx, charged.balance);
                integer(ctx, charged.retry_after_ms());
                integer(ctx, charged.reset_after_ms())
            }
            Reply::Ok => simple(ctx, c"OK".as_ptr()),
        }
    }
}
