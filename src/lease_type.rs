//! The `rl-leases` module type, a key's leases (`rl_bucket::LeaseSet`): its callbacks (RDB,
//! AOF, digest, copy, memory) and its handle [`LeaseKey`], which reads the set, applies one
//! change, and makes it durable: the write or deletion, the key's absolute expiry (its last
//! lease's), the modified-key signal and keyspace event, and the replicated effect.
//!
//! The effect of a write is `RL.LEASESETSTATE key drop_until_us id expires_at_us`, the change
//! itself with absolute instants, never the clock-dependent command; a write that leaves no
//! lease deletes the key and replicates `DEL`. Loading trusts nothing: a value that is not a
//! valid set fails the load instead of becoming one.
//!
//! Shares the key helpers of `store` with the bucket types, and nothing else of theirs.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;
use rl_bucket::{Lease, LeaseChange, LeaseId, LeaseSet, MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT};

use crate::error::Error;
use crate::propagation;
use crate::store::{
    cache_type_in, delete_key, log_warning, replicate_del, replicated, signal_modified, OpenKey,
};

/// The type's name in RDB files (exactly 9 characters, as Redis requires).
pub const TYPE_NAME: &str = "rl-leases";
/// The RDB encoding written: 1 is the lease count, then per lease in order of expiry its
/// `expires_at_us` (unsigned) and its id (a string of 1 to 16 bytes).
pub const ENCODING_VERSION: i32 = 1;

/// The type as registered by `redis_module!`.
pub static LEASE_TYPE: RedisType = RedisType::new(
    TYPE_NAME,
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    },
);

static TYPE_PTR: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Caches the registered type pointer. Call once, after `redis_module!` created the type.
pub fn cache_type() -> Result<(), Error> {
    cache_type_in(&LEASE_TYPE, &TYPE_PTR)
}

fn lease_type() -> *mut raw::RedisModuleType {
    TYPE_PTR.load(Ordering::Relaxed)
}

/// The set a value pointer holds.
///
/// # Safety
/// `value` must be null or a value of this type (a `Box<LeaseSet>` made here), not otherwise
/// borrowed for `'a`.
unsafe fn set_of<'a>(value: *const c_void) -> Option<&'a LeaseSet> {
    // SAFETY: guaranteed by the caller.
    unsafe { value.cast::<LeaseSet>().as_ref() }
}

/// A key of leases, open for the running command.
pub struct LeaseKey {
    key: OpenKey,
    /// The stored value, or null for a missing key.
    value: *mut LeaseSet,
}

impl LeaseKey {
    /// Opens `name`, for writing when `write`, and finds its set.
    ///
    /// # Errors
    /// [`Error::WrongType`] if the key holds any other type (whose value is never read);
    /// [`Error::Internal`] if the server returns no handle to write through.
    ///
    /// # Safety
    /// `ctx` and `name` must be the live context and an argument of the running command.
    pub unsafe fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        write: bool,
    ) -> Result<Self, Error> {
        // SAFETY: forwarded (caller).
        let key = unsafe { OpenKey::open(ctx, name, write) }?;
        let value = key
            .value(lease_type())?
            .map_or(ptr::null_mut(), |v| v.cast::<LeaseSet>());
        Ok(Self { key, value })
    }

    /// The stored set; `None` for a missing key.
    pub fn set(&self) -> Option<&LeaseSet> {
        // SAFETY: null or this type's value, live while the key is open, and only mutated
        // through `&mut self`.
        unsafe { self.value.as_ref() }
    }

    /// Drops what expired by `drop_until_us`, puts each `(id, expires_at_us)` (0 removes),
    /// and makes it durable as the keyspace event `event`. Replicates `effect` when it is
    /// `Some` and the set still holds leases, the running command verbatim when it is `None`
    /// (`RL.LEASESETSTATE` is its own effect), and `DEL` when the key goes.
    ///
    /// # Errors
    /// [`Error::TooManyLeases`] if the set would hold more than the cap, [`Error::ExpiresAt`]
    /// if an expiry is out of range; nothing is written. [`Error::Internal`] if the server
    /// refuses a write.
    pub fn apply(
        &mut self,
        drop_until_us: u64,
        puts: &[(LeaseId, u64)],
        event: &CStr,
        verbatim: bool,
    ) -> Result<(), Error> {
        let check = |set: &mut LeaseSet| -> Result<(), Error> {
            let applied = match *puts {
                // Every command's write: the path that allocates nothing.
                [(id, expires_at_us)] => set.apply(&LeaseChange {
                    drop_until_us,
                    id,
                    expires_at_us,
                }),
                _ => set.apply_all(drop_until_us, puts),
            };
            applied.ok_or_else(|| {
                let bad_expiry = puts
                    .iter()
                    .any(|&(id, at)| at != 0 && Lease::new(id, at).is_none());
                if bad_expiry {
                    Error::ExpiresAt
                } else {
                    Error::TooManyLeases
                }
            })
        };
        let ctx = self.key.ctx;
        let name = self.key.name;
        let existed = !self.value.is_null();
        let last_before = self.set().and_then(LeaseSet::last_expires_at_us);
        // SAFETY: null or this type's value, live while the key is open.
        let left = match unsafe { self.value.as_mut() } {
            Some(set) => {
                check(set)?;
                set.last_expires_at_us()
            }
            None => {
                let mut set = LeaseSet::new();
                check(&mut set)?;
                let last = set.last_expires_at_us();
                if last.is_some() {
                    let value = Box::into_raw(Box::new(set));
                    // SAFETY: the key is open for writing (a write makes changes) and missing;
                    // on success the server owns `value` and frees it through `free`.
                    let status = unsafe {
                        raw::RedisModule_ModuleTypeSetValue.ok_or(Error::Internal)?(
                            self.key.key,
                            lease_type(),
                            value.cast(),
                        )
                    };
                    if status != raw::REDISMODULE_OK as c_int {
                        // SAFETY: made just above and not handed over.
                        drop(unsafe { Box::from_raw(value) });
                        return Err(Error::Internal);
                    }
                    self.value = value;
                }
                last
            }
        };
        match left {
            Some(last_us) => {
                // The key's expiry is set only when its last lease changed: a take, release
                // or renewal of an earlier lease leaves it as it was.
                if !existed || last_before != Some(last_us) {
                    let expire_at_ms =
                        i64::try_from(last_us.div_ceil(1_000)).map_err(|_| Error::Internal)?;
                    // SAFETY: the key is open for writing and holds a value.
                    let ok = unsafe {
                        raw::RedisModule_SetAbsExpire.ok_or(Error::Internal)?(
                            self.key.key,
                            expire_at_ms,
                        )
                    } == raw::REDISMODULE_OK as c_int;
                    ok.then_some(()).ok_or(Error::Internal)?;
                }
                signal_modified(ctx, name, raw::REDISMODULE_NOTIFY_MODULE, event)?;
            }
            // Only removals on a missing key: nothing was or is stored.
            None if !existed => return Ok(()),
            None => {
                delete_key(self.key.key)?;
                self.value = ptr::null_mut();
                signal_modified(ctx, name, raw::REDISMODULE_NOTIFY_GENERIC, c"del")?;
            }
        }
        if verbatim {
            // SAFETY: the running command's context.
            let replicate = unsafe { raw::RedisModule_ReplicateVerbatim }.ok_or(Error::Internal)?;
            // SAFETY: as above.
            return replicated(unsafe { replicate(ctx) });
        }
        if !propagation::needed(ctx) {
            return Ok(());
        }
        match (left, puts) {
            (Some(_), &[(id, expires_at_us)]) => {
                replicate_set_state(ctx, name, drop_until_us, id, expires_at_us)
            }
            (None, _) => replicate_del(ctx, name),
            // Only RL.LEASESETSTATE puts several, and it replicates verbatim.
            _ => Err(Error::Internal),
        }
    }
}

/// The effect of one lease write: `RL.LEASESETSTATE key drop_until_us id expires_at_us`.
fn replicate_set_state(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    drop_until_us: u64,
    id: LeaseId,
    expires_at_us: u64,
) -> Result<(), Error> {
    let drop_until_us = i64::try_from(drop_until_us).map_err(|_| Error::Internal)?;
    let expires_at_us = i64::try_from(expires_at_us).map_err(|_| Error::Internal)?;
    let id = id.as_bytes();
    // SAFETY: read once, after load.
    let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(Error::Internal)?;
    // SAFETY: "slbl" matches a RedisModuleString, a long long, a buffer and its length, and a
    // long long.
    let status = unsafe {
        replicate(
            ctx,
            c"RL.LEASESETSTATE".as_ptr(),
            c"slbl".as_ptr(),
            name,
            drop_until_us,
            id.as_ptr().cast::<c_char>(),
            id.len(),
            expires_at_us,
        )
    };
    replicated(status)
}

/// Why a stored value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// An encoding version this build does not know.
    Version,
    /// The server reported a short or mistyped read.
    Io,
    /// A count of 0 (no key is an empty set) or above the cap.
    Count,
    /// An id of 0 or more than 16 bytes.
    Id,
    /// An expiry of 0 or past `MAX_EXPIRES_AT_US`.
    Expiry,
    /// Leases out of order, or an id twice.
    Order,
}

/// Decodes one stored set from the fields Redis hands back: `next_unsigned` and `next_bytes`
/// yield the next field, or `None` on an I/O error. Pure, so tests drive it byte by byte.
///
/// # Errors
/// A [`DecodeError`] for anything but encoding version 1 holding a valid, non-empty set.
pub fn decode(
    encver: i32,
    mut next_unsigned: impl FnMut() -> Option<u64>,
    mut next_bytes: impl FnMut() -> Option<Vec<u8>>,
) -> Result<LeaseSet, DecodeError> {
    if encver != ENCODING_VERSION {
        return Err(DecodeError::Version);
    }
    let count = next_unsigned().ok_or(DecodeError::Io)?;
    if !(1..=MAX_LEASE_LIMIT).contains(&count) {
        return Err(DecodeError::Count);
    }
    // The count is checked before it sizes an allocation.
    let mut leases = Vec::with_capacity(usize::try_from(count).map_err(|_| DecodeError::Count)?);
    for _ in 0..count {
        let expires_at_us = next_unsigned().ok_or(DecodeError::Io)?;
        let bytes = next_bytes().ok_or(DecodeError::Io)?;
        if bytes.len() > MAX_LEASE_ID_BYTES {
            return Err(DecodeError::Id);
        }
        let id = LeaseId::new(&bytes).ok_or(DecodeError::Id)?;
        leases.push(Lease::new(id, expires_at_us).ok_or(DecodeError::Expiry)?);
    }
    LeaseSet::from_sorted(leases).ok_or(DecodeError::Order)
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY (both closures): `rdb` is the live IO handle Redis passed in. HANDLE_IO_ERRORS is
    // set at load, so a short or mistyped read sets the error flag instead of aborting.
    let failed = || unsafe { raw::RedisModule_IsIOError.is_none_or(|failed| failed(rdb) != 0) };
    let next_unsigned = || unsafe {
        let value = raw::RedisModule_LoadUnsigned.map(|load| load(rdb))?;
        (!failed()).then_some(value)
    };
    let next_bytes = || unsafe {
        let mut len = 0usize;
        let data = raw::RedisModule_LoadStringBuffer.map(|load| load(rdb, &mut len))?;
        if failed() || data.is_null() {
            return None;
        }
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec();
        if let Some(free) = raw::RedisModule_Free {
            free(data.cast());
        }
        Some(bytes)
    };
    match decode(encver, next_unsigned, next_bytes) {
        Ok(set) => Box::into_raw(Box::new(set)).cast(),
        Err(DecodeError::Io) => ptr::null_mut(),
        Err(error) => {
            log_warning(match error {
                DecodeError::Version => c"rl-leases: unknown encoding version",
                DecodeError::Count => c"rl-leases: lease count out of range",
                DecodeError::Id => c"rl-leases: an id is not 1 to 16 bytes",
                DecodeError::Expiry => c"rl-leases: an expiry out of range",
                _ => c"rl-leases: leases out of order or an id repeated",
            });
            ptr::null_mut()
        }
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes a live value of this type and a live IO handle.
    unsafe {
        let (Some(set), Some(unsigned), Some(buffer)) = (
            set_of(value),
            raw::RedisModule_SaveUnsigned,
            raw::RedisModule_SaveStringBuffer,
        ) else {
            return;
        };
        unsigned(rdb, set.len() as u64);
        for lease in set.iter() {
            let id = lease.id();
            let id = id.as_bytes();
            unsigned(rdb, lease.expires_at_us());
            buffer(rdb, id.as_ptr().cast::<c_char>(), id.len());
        }
    }
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: Redis passes a live value of this type.
    let (Some(set), Some(emit)) = (unsafe { set_of(value) }, unsafe {
        raw::RedisModule_EmitAOF
    }) else {
        return;
    };
    // One lease per command, in the stored order, dropping nothing (drop_until_us 0). The
    // key's expiry follows as a PEXPIREAT that the server writes itself.
    for lease in set.iter() {
        let id = lease.id();
        let id = id.as_bytes();
        let expires_at_us = i64::try_from(lease.expires_at_us()).unwrap_or(i64::MAX);
        // SAFETY: live handles from Redis; "slbl" matches the arguments.
        unsafe {
            emit(
                aof,
                c"RL.LEASESETSTATE".as_ptr(),
                c"slbl".as_ptr(),
                key,
                0i64,
                id.as_ptr().cast::<c_char>(),
                id.len(),
                expires_at_us,
            );
        }
    }
}

/// The server's record of the module value (type pointer and value word), the set's header,
/// and its allocations: the arena (24 bytes per lease it has room for) and its two indexes.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a live value of this type.
    let allocated = unsafe { set_of(value) }.map_or(0, LeaseSet::allocated_bytes);
    2 * size_of::<usize>() + size_of::<LeaseSet>() + allocated
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: Redis passes a live value of this type and a live digest handle.
    unsafe {
        let (Some(set), Some(add_buffer), Some(add), Some(end)) = (
            set_of(value),
            raw::RedisModule_DigestAddStringBuffer,
            raw::RedisModule_DigestAddLongLong,
            raw::RedisModule_DigestEndSequence,
        ) else {
            return;
        };
        for lease in set.iter() {
            let id = lease.id();
            let id = id.as_bytes();
            add_buffer(md, id.as_ptr().cast::<c_char>(), id.len());
            add(md, i64::try_from(lease.expires_at_us()).unwrap_or(i64::MAX));
            end(md);
        }
    }
}

unsafe extern "C" fn free(value: *mut c_void) {
    if !value.is_null() {
        // SAFETY: made by `Box::into_raw` here; Redis frees a value once.
        drop(unsafe { Box::from_raw(value.cast::<LeaseSet>()) });
    }
}

unsafe extern "C" fn copy(
    _from_key: *mut raw::RedisModuleString,
    _to_key: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes a live value of this type.
    match unsafe { set_of(value) } {
        Some(set) => Box::into_raw(Box::new(set.clone())).cast(),
        None => ptr::null_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Field = Result<u64, Vec<u8>>;

    fn run(encver: i32, fields: &[Option<Field>]) -> Result<Vec<(Vec<u8>, u64)>, DecodeError> {
        let fields = std::cell::RefCell::new(fields.iter().cloned());
        let next_unsigned = || match fields.borrow_mut().next().flatten() {
            Some(Ok(n)) => Some(n),
            _ => None,
        };
        let next_bytes = || match fields.borrow_mut().next().flatten() {
            Some(Err(b)) => Some(b),
            _ => None,
        };
        decode(encver, next_unsigned, next_bytes).map(|set| {
            set.iter()
                .map(|l| (l.id().as_bytes().to_vec(), l.expires_at_us()))
                .collect()
        })
    }

    #[test]
    fn decode_accepts_version_one_holding_a_valid_set_and_nothing_else() {
        let n = |v: u64| Some(Ok(v));
        let b = |v: &[u8]| Some(Err(v.to_vec()));
        let max = rl_bucket::MAX_EXPIRES_AT_US;
        type Row = (
            i32,
            Vec<Option<Field>>,
            Result<Vec<(Vec<u8>, u64)>, DecodeError>,
        );
        let rows: Vec<Row> = vec![
            // one lease
            (1, vec![n(1), n(5), b(b"a")], Ok(vec![(b"a".to_vec(), 5)])),
            // two, by expiry; the latest storable expiry; a 16-byte id
            (
                1,
                vec![n(2), n(5), b(b"b"), n(max), b(&[7; 16])],
                Ok(vec![(b"b".to_vec(), 5), (vec![7; 16], max)]),
            ),
            // unknown versions
            (0, vec![n(1), n(5), b(b"a")], Err(DecodeError::Version)),
            (2, vec![n(1), n(5), b(b"a")], Err(DecodeError::Version)),
            // no key is empty; the cap
            (1, vec![n(0)], Err(DecodeError::Count)),
            (1, vec![n(MAX_LEASE_LIMIT + 1)], Err(DecodeError::Count)),
            // ids of 0 and 17 bytes
            (1, vec![n(1), n(5), b(b"")], Err(DecodeError::Id)),
            (1, vec![n(1), n(5), b(&[1; 17])], Err(DecodeError::Id)),
            // expiries of 0 and past the bound
            (1, vec![n(1), n(0), b(b"a")], Err(DecodeError::Expiry)),
            (1, vec![n(1), n(max + 1), b(b"a")], Err(DecodeError::Expiry)),
            // out of order; an id twice
            (
                1,
                vec![n(2), n(6), b(b"a"), n(5), b(b"b")],
                Err(DecodeError::Order),
            ),
            (
                1,
                vec![n(2), n(5), b(b"a"), n(6), b(b"a")],
                Err(DecodeError::Order),
            ),
            // short reads: the count, an expiry, an id
            (1, vec![None], Err(DecodeError::Io)),
            (1, vec![n(2), n(5), b(b"a"), None], Err(DecodeError::Io)),
            (1, vec![n(1), n(5), None], Err(DecodeError::Io)),
        ];
        for (encver, fields, want) in rows {
            assert_eq!(run(encver, &fields), want, "encver {encver}, {fields:?}");
        }
    }
}
