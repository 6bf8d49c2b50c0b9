//! The `rl-bucket` module type: its callbacks (RDB, AOF, digest, copy, memory), and its
//! per-key handle [`BucketKey`], one of the two stores behind the [`Store`] door (`store`);
//! the table type (`table_type`) is the other.
//!
//! A whole-nanosecond [`State`] (every state at rates dividing 1e9) lives in the value pointer
//! itself, tagged with its low bit, so it costs no allocation of ours. A state with a fraction
//! of a nanosecond (rates such as 3/s) is a 16-byte allocation, `[full_at_ns, full_at_frac]`,
//! updated in place by later writes. Loading trusts nothing: a value that is not a [`State`]
//! fails the load instead of becoming a bucket.
//!
//! A key holding a bucket the Lua fallback wrote (its string, `rl` and three packed doubles,
//! or an older hash `{a, b, d}`; see `store`) opens as the bucket it holds, converted exactly
//! ([`rl_bucket::FallbackState`]). Reading it writes nothing; the first commit that writes
//! replaces the string or hash with this type, and propagates `DEL` before the usual
//! `RL.SETSTATE`, so a replica or an AOF replay removes the value whatever it would make
//! of it. A call that writes nothing (a peek, a denial) leaves the value as it was.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;
use rl_bucket::{Change, Cost, LeaseId, Records, Reservation, State, MAX_RESERVATIONS};

use crate::error::Error;
use crate::propagation;
use crate::store::{
    cache_type_in, delete_key, full_at_i64, log_warning, replicate_del, replicated,
    signal_modified, OpenKey, Staged, Store,
};

/// The type's name in RDB files (exactly 9 characters, as Redis requires).
pub const TYPE_NAME: &str = "rl-bucket";
/// The RDB encoding written: 2 is two unsigned integers, `full_at_ns` and `full_at_frac`.
/// Version 1 (0.1.0) is `full_at_ns` alone, and still loads.
pub const ENCODING_VERSION: i32 = 2;
const ENCODING_V2: i32 = ENCODING_VERSION;

/// The type's name of a bucket that has held reservations (9 characters). A bucket never
/// given one keeps [`TYPE_NAME`] and its encoding, so 0.2.0 still reads it; the first
/// reservation makes a bucket of this type, and it stays so, with none open after its last
/// settle, until the key goes (expired full, refunded full, deleted). Settling the last
/// record in place spares the settle a change of type, which Redis makes only by deleting
/// the key and adding it again (about 3,000 instructions).
pub const RESV_TYPE_NAME: &str = "rl-bkresv";
/// The RDB encoding of [`RESV_TYPE_NAME`]: 1 is `full_at_ns`, `full_at_frac` and the open
/// reservations (a count, possibly 0, then for each its id, estimate and expiry; see
/// [`decode_value`]).
pub const RESV_ENCODING_VERSION: i32 = 1;

// The state lives in the pointer, so pointers must hold 64 bits.
const _: () = assert!(usize::BITS == 64);

/// The type as registered by `redis_module!`.
pub static BUCKET_TYPE: RedisType = RedisType::new(
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

/// The type of a bucket with open reservations, on the same callbacks (each dispatches on
/// the value's tag).
pub static RESV_TYPE: RedisType = RedisType::new(
    RESV_TYPE_NAME,
    RESV_ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(resv_rdb_load),
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

/// The registered type, cached at load so the hot path reads one atomic instead of a RefCell.
static TYPE_PTR: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());
static RESV_TYPE_PTR: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Caches the registered type pointers. Call once, after `redis_module!` created the types.
pub fn cache_type() -> Result<(), Error> {
    cache_type_in(&BUCKET_TYPE, &TYPE_PTR)?;
    cache_type_in(&RESV_TYPE, &RESV_TYPE_PTR)
}

fn bucket_type() -> *mut raw::RedisModuleType {
    TYPE_PTR.load(Ordering::Relaxed)
}

fn resv_type() -> *mut raw::RedisModuleType {
    RESV_TYPE_PTR.load(Ordering::Relaxed)
}

/// A heap-held state: `[full_at_ns, full_at_frac]`.
type Boxed = [u64; 2];

/// A bucket of [`RESV_TYPE_NAME`]: its state and its open records (possibly none), tagged
/// `0b10` in the pointer's low bits (an allocation's are clear, an inline state's low bit is
/// set). Every value of that type is one of these, and no value of [`TYPE_NAME`] is.
#[derive(Clone)]
struct WithRecords {
    state: State,
    /// One record inline, so a bucket with one open is a single allocation.
    records: Records,
}

const TAG_MASK: usize = 0b11;
const TAG_RECORDS: usize = 0b10;

/// The value pointer of a [`RESV_TYPE_NAME`] bucket holding `state` and `records` (possibly
/// none).
fn to_value_with(state: State, records: Records) -> *mut c_void {
    let boxed = Box::into_raw(Box::new(WithRecords { state, records }));
    ((boxed as usize) | TAG_RECORDS) as *mut c_void
}

fn is_with_records(value: *const c_void) -> bool {
    (value as usize) & TAG_MASK == TAG_RECORDS
}

/// The state and records of a tagged value.
///
/// # Safety
/// `value` must be a live value made by `to_value_with` with records (`is_with_records`).
unsafe fn with_records<'a>(value: *const c_void) -> &'a mut WithRecords {
    // SAFETY: untagged, the pointer is the Box made by `to_value_with` (caller).
    unsafe { &mut *(((value as usize) & !TAG_MASK) as *mut WithRecords) }
}

/// The open reservations a value holds (none for a plain state).
fn records_of<'a>(value: *const c_void) -> &'a [Reservation] {
    if is_with_records(value) {
        // SAFETY: a tagged value is only made by `to_value_with`, live until `free`.
        unsafe { &with_records(value).records }
    } else {
        &[]
    }
}

/// The value pointer for `state`: inline (`full_at_ns << 1 | 1`) when it has no fraction,
/// else a new allocation that `free` releases.
fn to_value(state: State) -> *mut c_void {
    if state.full_at_frac() == 0 {
        // full_at_ns < 2^63, so the shift keeps every bit.
        ((state.full_at_ns() << 1) | 1) as usize as *mut c_void
    } else {
        Box::into_raw(Box::new([state.full_at_ns(), state.full_at_frac()])).cast()
    }
}

/// An allocation is aligned, so its low bits are clear; an inline state's low bit is set, a
/// value with records has `0b10`.
fn is_boxed(value: *const c_void) -> bool {
    !value.is_null() && (value as usize) & TAG_MASK == 0
}

fn from_value(value: *const c_void) -> Option<State> {
    if is_with_records(value) {
        // SAFETY: a tagged value is only made by `to_value_with`, live until `free`.
        return Some(unsafe { with_records(value) }.state);
    }
    if is_boxed(value) {
        // SAFETY: a boxed value is only ever made by `to_value`, and is live until `free`.
        let [full_at_ns, full_at_frac] = unsafe { *value.cast::<Boxed>() };
        State::from_parts(full_at_ns, full_at_frac)
    } else {
        State::from_full_at_ns((value as usize as u64) >> 1).filter(|_| !value.is_null())
    }
}

/// Releases what `to_value` allocated, if anything.
///
/// # Safety
/// `value` must be a value made by `to_value` and no longer referenced by any key.
unsafe fn free_value(value: *mut c_void) {
    if is_with_records(value) {
        // SAFETY: made by `Box::into_raw` in `to_value_with`, released once (caller).
        drop(unsafe { Box::from_raw(((value as usize) & !TAG_MASK) as *mut WithRecords) });
    } else if is_boxed(value) {
        // SAFETY: made by `Box::into_raw` in `to_value`, released once (caller).
        drop(unsafe { Box::from_raw(value.cast::<Boxed>()) });
    }
}

/// A key holding one bucket, opened for a command.
pub struct BucketKey {
    key: OpenKey,
    /// What the key held when opened (updated by each commit), and what the next commit
    /// writes.
    staged: Staged,
    /// Whether the running command is its own effect (it reads no clock), so a commit
    /// replicates it as it came.
    verbatim: bool,
    /// Whether the key holds a bucket the Lua fallback wrote (string or hash), not yet
    /// replaced by a commit.
    fallback: bool,
    /// The [`RESV_TYPE_NAME`] value read at open, which [`BucketKey::records`] lends; null
    /// for any other key, and from the first commit on.
    records: *mut c_void,
}

impl BucketKey {
    /// Opens `name` for reading and writing, and reads its bucket.
    ///
    /// # Errors
    /// [`Error::WrongType`] if the key holds any other type (whose value is never read);
    /// [`Error::Internal`] if the server returns no handle.
    ///
    /// # Safety
    /// `ctx` and `name` must be the live context and an argument of the running command.
    pub unsafe fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
    ) -> Result<Self, Error> {
        // SAFETY: forwarded (caller).
        Self::with(unsafe { OpenKey::open(ctx, name, true) }?)
    }

    /// Opens `name` for reading only (it works on replicas and in read-only scripts). A
    /// missing key reads as a full bucket. Nothing staged on it is ever committed.
    ///
    /// # Errors
    /// As for [`BucketKey::open`].
    ///
    /// # Safety
    /// As for [`BucketKey::open`].
    pub unsafe fn open_read(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
    ) -> Result<Self, Error> {
        // SAFETY: forwarded (caller).
        Self::with(unsafe { OpenKey::open(ctx, name, false) }?)
    }

    fn with(key: OpenKey) -> Result<Self, Error> {
        // A bucket that has held reservations is of the other type.
        let (stored, fallback, records) = match key.value_of_either([bucket_type(), resv_type()]) {
            Ok(None) => (None, false, ptr::null_mut()),
            // Only a State is ever stored, so this cannot fail unless memory was corrupted.
            Ok(Some((value, resv))) => (
                Some(from_value(value).ok_or(Error::Internal)?),
                false,
                if resv { value } else { ptr::null_mut() },
            ),
            // Another type: the Lua fallback's string or hash is taken over, anything else stays
            // WRONGTYPE.
            Err(Error::WrongType) => (Some(key.fallback_state()?), true, ptr::null_mut()),
            Err(error) => return Err(error),
        };
        Ok(Self {
            key,
            staged: Staged::new(stored),
            verbatim: false,
            fallback,
            records,
        })
    }

    /// Marks the running command as its own effect (`RL.SETSTATE` reads no clock): a commit
    /// replicates it verbatim, keeping the form the client sent.
    pub fn replicate_verbatim(&mut self) {
        self.verbatim = true;
    }

    /// Stores `state` with its expiry, `state.expire_at_ms()`.
    fn write(&self, state: State) -> Result<(), Error> {
        let expire_at_ms = i64::try_from(state.expire_at_ms()).map_err(|_| Error::Internal)?;
        // The fallback's string or hash is not a value of ours: SetValue deletes it (and its
        // expiry).
        let existed = self.staged.stored().is_some() && !self.fallback;
        // SAFETY: `self.key` is open for writing and, when `existed`, holds a value of our type
        // (checked at open); values are only ever made by `to_value`.
        let ok = unsafe {
            let stored = if existed {
                raw::RedisModule_ModuleTypeGetValue.ok_or(Error::Internal)?(self.key.key)
            } else {
                ptr::null_mut()
            };
            let set = if is_with_records(stored) {
                // The reservations stay: a take, charge or refund changes the state alone.
                with_records(stored).state = state;
                raw::REDISMODULE_OK as c_int
            } else if is_boxed(stored) && state.full_at_frac() != 0 {
                // The common write at rates with a fraction: update the allocation in place.
                *stored.cast::<Boxed>() = [state.full_at_ns(), state.full_at_frac()];
                raw::REDISMODULE_OK as c_int
            } else if existed {
                // Swapping the pointer in place keeps the key object and its expiry entry,
                // where SetValue would delete and re-create both. Redis hands the old value
                // back instead of freeing it.
                let replace = raw::RedisModule_ModuleTypeReplaceValue.ok_or(Error::Internal)?;
                let value = to_value(state);
                let mut old = ptr::null_mut();
                let set = replace(self.key.key, bucket_type(), value, &mut old);
                if set == raw::REDISMODULE_OK as c_int {
                    free_value(old);
                } else {
                    free_value(value);
                }
                set
            } else {
                let value = to_value(state);
                let set = raw::RedisModule_ModuleTypeSetValue.ok_or(Error::Internal)?(
                    self.key.key,
                    bucket_type(),
                    value,
                );
                if set != raw::REDISMODULE_OK as c_int {
                    free_value(value);
                }
                set
            };
            set == raw::REDISMODULE_OK as c_int
                && raw::RedisModule_SetAbsExpire.ok_or(Error::Internal)?(self.key.key, expire_at_ms)
                    == raw::REDISMODULE_OK as c_int
        };
        ok.then_some(()).ok_or(Error::Internal)
    }

    /// Stores `state` and exactly `records` (the open reservations, possibly none) as a
    /// [`RESV_TYPE_NAME`] bucket, with the state's expiry. A key already of that type is
    /// updated in place, its key object and expiry entry kept; any other (a plain bucket,
    /// the fallback's value, none) becomes one through SetValue.
    fn write_with_records(&self, state: State, records: Records) -> Result<(), Error> {
        let expire_at_ms = i64::try_from(state.expire_at_ms()).map_err(|_| Error::Internal)?;
        let existed = self.staged.stored().is_some() && !self.fallback;
        // SAFETY: `self.key` is open for writing and, when `existed`, holds a value of one of
        // our bucket types (checked at open), a tagged one exactly when it is of
        // RESV_TYPE_NAME; a new value is owned here until the server takes it.
        let ok = unsafe {
            let stored = if existed {
                raw::RedisModule_ModuleTypeGetValue.ok_or(Error::Internal)?(self.key.key)
            } else {
                ptr::null_mut()
            };
            let set = if is_with_records(stored) {
                // The list the step built replaces the old one, which is freed here.
                let held = with_records(stored);
                held.state = state;
                held.records = records;
                raw::REDISMODULE_OK as c_int
            } else {
                // A change of type (or a new key): SetValue frees the old value and drops
                // the expiry, set again below.
                let value = to_value_with(state, records);
                let set = raw::RedisModule_ModuleTypeSetValue.ok_or(Error::Internal)?(
                    self.key.key,
                    resv_type(),
                    value,
                );
                if set != raw::REDISMODULE_OK as c_int {
                    free_value(value);
                }
                set
            };
            set == raw::REDISMODULE_OK as c_int
                && raw::RedisModule_SetAbsExpire.ok_or(Error::Internal)?(self.key.key, expire_at_ms)
                    == raw::REDISMODULE_OK as c_int
        };
        ok.then_some(()).ok_or(Error::Internal)
    }

    /// The open reservations stored with the bucket, as read (none for a missing key or the
    /// fallback's value). Records past their expiry are still listed: the steps drop them.
    /// Borrowed from the stored value, not copied: the steps build the list to store anew.
    pub fn records(&self) -> &[Reservation] {
        records_of(self.records)
    }

    /// Stores the bucket as `change` leaves it together with exactly `records`, or deletes
    /// the key (its records with it) for [`Change::Delete`]; signals `event` and replicates
    /// the effect: `RL.RESVSTATE` with the exact state and every record, or `DEL`.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server refuses the write, or `Keep` on a missing key (no
    /// state to hold records).
    pub fn commit_records(
        &mut self,
        change: Change,
        records: Records,
        event: &CStr,
    ) -> Result<(), Error> {
        let took_over = self.fallback;
        // The write may free or change the value read at open.
        self.records = ptr::null_mut();
        let state = match change {
            Change::Delete => {
                delete_key(self.key.key)?;
                signal_modified(
                    self.key.ctx,
                    self.key.name,
                    raw::REDISMODULE_NOTIFY_GENERIC,
                    c"del",
                )?;
                self.fallback = false;
                self.staged = Staged::new(None);
                if self.verbatim {
                    return replicate_verbatim(self.key.ctx);
                }
                if propagation::needed(self.key.ctx) {
                    replicate_del(self.key.ctx, self.key.name)?;
                }
                return Ok(());
            }
            Change::Set(state) => state,
            Change::Keep => self.staged.state().ok_or(Error::Internal)?,
        };
        // Asked once: nothing between here and the effect changes where writes go.
        let propagate = !self.verbatim && propagation::needed(self.key.ctx);
        let replicated_records = if propagate {
            records.to_vec()
        } else {
            Vec::new()
        };
        self.write_with_records(state, records)?;
        signal_modified(
            self.key.ctx,
            self.key.name,
            raw::REDISMODULE_NOTIFY_MODULE,
            event,
        )?;
        self.fallback = false;
        self.staged = Staged::new(Some(state));
        if self.verbatim {
            return replicate_verbatim(self.key.ctx);
        }
        if !propagate {
            return Ok(());
        }
        if took_over {
            replicate_del(self.key.ctx, self.key.name)?;
        }
        replicate_records(self.key.ctx, self.key.name, state, &replicated_records)
    }
}

/// Replicates the running command as it came (it reads no clock).
fn replicate_verbatim(ctx: *mut raw::RedisModuleCtx) -> Result<(), Error> {
    // SAFETY: the running command's context.
    let verbatim = unsafe { raw::RedisModule_ReplicateVerbatim }.ok_or(Error::Internal)?;
    // SAFETY: as above.
    replicated(unsafe { verbatim(ctx) })
}

/// An estimate as text that [`Cost::parse`] reads back exactly: `digits` `e` `exp10`.
pub fn estimate_text(estimate: Cost) -> String {
    let (digits, exp10) = estimate.exact().parts();
    format!("{digits}e{exp10}")
}

/// The arguments of `RL.RESVSTATE` after the key: `full_at_ns full_at_frac` and each record's
/// `id estimate expires_at_us`.
pub(crate) fn resv_state_args(state: State, records: &[Reservation]) -> Vec<Vec<u8>> {
    let mut args = Vec::with_capacity(2 + 3 * records.len());
    let (full_at_ns, full_at_frac) = full_at_i64(state);
    args.push(full_at_ns.to_string().into_bytes());
    args.push(full_at_frac.to_string().into_bytes());
    for record in records {
        args.push(record.id.as_bytes().to_vec());
        args.push(estimate_text(record.estimate).into_bytes());
        args.push(record.expires_at_us.to_string().into_bytes());
    }
    args
}

/// Makes server strings of `args` (with no context: the caller frees them with
/// [`free_strings`]).
pub(crate) fn new_strings(args: &[Vec<u8>]) -> Result<Vec<*mut raw::RedisModuleString>, Error> {
    // SAFETY: read once, after load.
    let create = unsafe { raw::RedisModule_CreateString }.ok_or(Error::Internal)?;
    Ok(args
        .iter()
        // SAFETY: a NULL context makes a string the caller frees; the bytes outlive the call.
        .map(|arg| unsafe { create(ptr::null_mut(), arg.as_ptr().cast(), arg.len()) })
        .collect())
}

pub(crate) fn free_strings(strings: Vec<*mut raw::RedisModuleString>) {
    // SAFETY: each string was made by `new_strings` with no context and is freed once.
    unsafe {
        if let Some(free) = raw::RedisModule_FreeString {
            for s in strings {
                free(ptr::null_mut(), s);
            }
        }
    }
}

/// Replicates `command name args…`, the arguments made server strings for the call: the
/// effect of a write whose arguments are counted at run time (a bucket's records).
pub(crate) fn replicate_with_args(
    ctx: *mut raw::RedisModuleCtx,
    command: &CStr,
    name: *mut raw::RedisModuleString,
    args: &[Vec<u8>],
) -> Result<(), Error> {
    let mut strings = new_strings(args)?;
    // SAFETY: read once, after load; "sv" matches one RedisModuleString, then an array of
    // them and its length.
    let status = unsafe {
        raw::RedisModule_Replicate.ok_or(Error::Internal)?(
            ctx,
            command.as_ptr(),
            c"sv".as_ptr(),
            name,
            strings.as_mut_ptr(),
            strings.len(),
        )
    };
    free_strings(strings);
    replicated(status)
}

/// Emits `command key args…` into an AOF rewrite, the arguments made server strings for
/// the call. An error when the strings could not be made (nothing emitted).
///
/// # Safety
/// `aof` and `key` must be the live handles of the running `aof_rewrite` callback.
pub(crate) unsafe fn emit_with_args(
    aof: *mut raw::RedisModuleIO,
    command: &CStr,
    key: *mut raw::RedisModuleString,
    args: &[Vec<u8>],
) -> Result<(), Error> {
    // SAFETY: read once, after load.
    let emit = unsafe { raw::RedisModule_EmitAOF }.ok_or(Error::Internal)?;
    let mut strings = new_strings(args)?;
    // SAFETY: live handles from Redis (the caller's guarantee); "sv" matches one
    // RedisModuleString, then an array of them and its length.
    unsafe {
        emit(
            aof,
            command.as_ptr(),
            c"sv".as_ptr(),
            key,
            strings.as_mut_ptr(),
            strings.len(),
        );
    }
    free_strings(strings);
    Ok(())
}

/// The effect of a reservation write: `RL.RESVSTATE` with the exact state and every record.
fn replicate_records(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    state: State,
    records: &[Reservation],
) -> Result<(), Error> {
    replicate_with_args(ctx, c"RL.RESVSTATE", name, &resv_state_args(state, records))
}

impl Store for BucketKey {
    fn staged(&self) -> &Staged {
        &self.staged
    }

    fn staged_mut(&mut self) -> &mut Staged {
        &mut self.staged
    }

    fn apply(&mut self, change: Change, event: &CStr) -> Result<(), Error> {
        let took_over = self.fallback;
        // The write may free or change the value read at open.
        self.records = ptr::null_mut();
        match change {
            Change::Keep => return Ok(()),
            Change::Set(state) => {
                self.write(state)?;
                signal_modified(
                    self.key.ctx,
                    self.key.name,
                    raw::REDISMODULE_NOTIFY_MODULE,
                    event,
                )?;
            }
            Change::Delete => {
                delete_key(self.key.key)?;
                signal_modified(
                    self.key.ctx,
                    self.key.name,
                    raw::REDISMODULE_NOTIFY_GENERIC,
                    c"del",
                )?;
            }
        }
        // Written or deleted: the key no longer holds the fallback's value.
        self.fallback = false;
        if self.verbatim {
            // SAFETY: the running command's context.
            let verbatim = unsafe { raw::RedisModule_ReplicateVerbatim }.ok_or(Error::Internal)?;
            // SAFETY: as above.
            return replicated(unsafe { verbatim(self.key.ctx) });
        }
        if !propagation::needed(self.key.ctx) {
            return Ok(());
        }
        match change {
            Change::Set(state) => {
                if took_over {
                    // The hash goes first, so RL.SETSTATE meets an empty key wherever it runs.
                    replicate_del(self.key.ctx, self.key.name)?;
                }
                replicate_set_state(self.key.ctx, self.key.name, state)
            }
            _ => replicate_del(self.key.ctx, self.key.name),
        }
    }
}

/// The effect of a bucket write: `RL.SETSTATE` with the exact state, whose expiry follows
/// from it. A whole-nanosecond state keeps 0.1.0's two-argument form.
fn replicate_set_state(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    state: State,
) -> Result<(), Error> {
    let (full_at_ns, full_at_frac) = full_at_i64(state);
    // SAFETY: read once, after load.
    let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(Error::Internal)?;
    // SAFETY: the format strings match the variadic arguments: a RedisModuleString, and for
    // each "l" a long long.
    let status = unsafe {
        if full_at_frac == 0 {
            replicate(
                ctx,
                c"RL.SETSTATE".as_ptr(),
                c"sl".as_ptr(),
                name,
                full_at_ns,
            )
        } else {
            replicate(
                ctx,
                c"RL.SETSTATE".as_ptr(),
                c"sll".as_ptr(),
                name,
                full_at_ns,
                full_at_frac,
            )
        }
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
    /// `full_at_ns` is 0 or past `MAX_FULL_AT_NS`, or `full_at_frac` past `MAX_FULL_AT_FRAC`.
    Range,
}

/// Decodes one stored bucket from the fields Redis hands back. `next_unsigned` yields the next
/// unsigned field, or `None` on an I/O error. Pure, so fuzzers drive it with arbitrary input.
///
/// # Errors
/// A [`DecodeError`] for anything but encoding version 1 (`full_at_ns`) or 2 (`full_at_ns`,
/// `full_at_frac`) holding a valid [`State`].
pub fn decode(
    encver: i32,
    mut next_unsigned: impl FnMut() -> Option<u64>,
) -> Result<State, DecodeError> {
    let fields = match encver {
        1 => 1,
        ENCODING_V2 => 2,
        _ => return Err(DecodeError::Version),
    };
    let full_at_ns = next_unsigned().ok_or(DecodeError::Io)?;
    let full_at_frac = if fields == 2 {
        next_unsigned().ok_or(DecodeError::Io)?
    } else {
        0
    };
    State::from_parts(full_at_ns, full_at_frac).ok_or(DecodeError::Range)
}

/// The most bytes a stored reservation id may hold: a longer one fails the load.
const MAX_ID_BYTES: usize = rl_bucket::MAX_LEASE_ID_BYTES;

/// Decodes one stored bucket of [`RESV_TYPE_NAME`] and its open reservations. Version 1 is
/// `full_at_ns`, `full_at_frac`, a count (at most [`MAX_RESERVATIONS`]), then per record its
/// id (a string of 1 to 16 bytes), the estimate's digits (high and low 64 bits), its signed
/// exponent, and its expiry in µs. Every field is checked: an estimate must be the canonical
/// form of a decimal above 0 that a command could have taken, an expiry storable, and each id
/// named once. A count of 0 is a bucket whose reservations were all settled (or lapsed).
///
/// # Errors
/// A [`DecodeError`] for anything else.
pub fn decode_value(
    encver: i32,
    mut next_unsigned: impl FnMut() -> Option<u64>,
    mut next_signed: impl FnMut() -> Option<i64>,
    mut next_bytes: impl FnMut() -> Option<Vec<u8>>,
) -> Result<(State, Vec<Reservation>), DecodeError> {
    if encver != RESV_ENCODING_VERSION {
        return Err(DecodeError::Version);
    }
    let full_at_ns = next_unsigned().ok_or(DecodeError::Io)?;
    let full_at_frac = next_unsigned().ok_or(DecodeError::Io)?;
    let state = State::from_parts(full_at_ns, full_at_frac).ok_or(DecodeError::Range)?;
    let count = next_unsigned().ok_or(DecodeError::Io)?;
    let count = usize::try_from(count)
        .ok()
        .filter(|&count| count <= MAX_RESERVATIONS)
        .ok_or(DecodeError::Range)?;
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let id = next_bytes().ok_or(DecodeError::Io)?;
        let id = Some(id.as_slice())
            .filter(|id| id.len() <= MAX_ID_BYTES)
            .and_then(LeaseId::new)
            .ok_or(DecodeError::Range)?;
        let high = next_unsigned().ok_or(DecodeError::Io)?;
        let low = next_unsigned().ok_or(DecodeError::Io)?;
        let exp10 = next_signed().ok_or(DecodeError::Io)?;
        let expires_at_us = next_unsigned().ok_or(DecodeError::Io)?;
        let digits = (u128::from(high) << 64) | u128::from(low);
        let exp10 = i32::try_from(exp10).map_err(|_| DecodeError::Range)?;
        let estimate = Cost::parse(format!("{digits}e{exp10}").as_bytes())
            .filter(|cost| cost.exact().parts() == (digits, exp10))
            .ok_or(DecodeError::Range)?;
        records.push(Reservation::new(id, estimate, expires_at_us).ok_or(DecodeError::Range)?);
    }
    if !rl_bucket::valid_records(&records) {
        return Err(DecodeError::Range);
    }
    Ok((state, records))
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY: forwarded (Redis's call).
    unsafe { load_with(rdb, encver, false) }
}

unsafe extern "C" fn resv_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY: forwarded (Redis's call).
    unsafe { load_with(rdb, encver, true) }
}

/// Loads a value of either type: `resv` for [`RESV_TYPE_NAME`].
///
/// # Safety
/// `rdb` must be the live IO handle Redis passed to a load callback.
unsafe fn load_with(rdb: *mut raw::RedisModuleIO, encver: c_int, resv: bool) -> *mut c_void {
    let failed = || {
        // SAFETY: `rdb` is the live IO handle Redis passed in.
        unsafe { raw::RedisModule_IsIOError.is_none_or(|failed| failed(rdb) != 0) }
    };
    // SAFETY: `rdb` is the live IO handle Redis passed in. HANDLE_IO_ERRORS is set at load,
    // so a short or mistyped read sets the error flag instead of aborting the server.
    let next_unsigned = || unsafe {
        let value = raw::RedisModule_LoadUnsigned.map(|load| load(rdb))?;
        (!failed()).then_some(value)
    };
    // SAFETY: as above.
    let next_signed = || unsafe {
        let value = raw::RedisModule_LoadSigned.map(|load| load(rdb))?;
        (!failed()).then_some(value)
    };
    // SAFETY: as above; the buffer Redis returns is copied, then freed once.
    let next_bytes = || unsafe {
        let mut len = 0usize;
        let buffer = raw::RedisModule_LoadStringBuffer.map(|load| load(rdb, &mut len))?;
        if failed() || buffer.is_null() {
            return None;
        }
        let bytes = std::slice::from_raw_parts(buffer.cast::<u8>(), len).to_vec();
        if let Some(free) = raw::RedisModule_Free {
            free(buffer.cast());
        }
        Some(bytes)
    };
    let decoded = if resv {
        decode_value(encver, next_unsigned, next_signed, next_bytes)
            .map(|(state, records)| (state, Some(Records::from(records))))
    } else {
        decode(encver, next_unsigned).map(|state| (state, None))
    };
    match decoded {
        Ok((state, Some(records))) => to_value_with(state, records),
        Ok((state, None)) => to_value(state),
        Err(DecodeError::Io) => ptr::null_mut(),
        Err(DecodeError::Version) => {
            log_warning(c"rl-bucket: unknown encoding version, refusing to load the value");
            ptr::null_mut()
        }
        Err(DecodeError::Range) => {
            log_warning(c"rl-bucket: stored state out of range, refusing to load the value");
            ptr::null_mut()
        }
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: read once, after load.
    let (Some(state), Some(save), Some(save_signed), Some(save_buffer)) = (
        from_value(value),
        unsafe { raw::RedisModule_SaveUnsigned },
        unsafe { raw::RedisModule_SaveSigned },
        unsafe { raw::RedisModule_SaveStringBuffer },
    ) else {
        return;
    };
    // SAFETY: `rdb` is the live IO handle Redis passed in; each id's bytes outlive the call.
    unsafe {
        save(rdb, state.full_at_ns());
        save(rdb, state.full_at_frac());
        if !is_with_records(value) {
            return;
        }
        let records = records_of(value);
        save(rdb, records.len() as u64);
        for record in records {
            let id = record.id.as_bytes();
            save_buffer(rdb, id.as_ptr().cast(), id.len());
            let (digits, exp10) = record.estimate.exact().parts();
            save(rdb, (digits >> 64) as u64);
            save(rdb, digits as u64);
            save_signed(rdb, i64::from(exp10));
            save(rdb, record.expires_at_us);
        }
    }
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    if let (Some(state), Some(emit)) = (from_value(value), unsafe { raw::RedisModule_EmitAOF }) {
        let records = records_of(value);
        // A bucket of RESV_TYPE_NAME stays one on replay, records or none, so a copy built
        // from the AOF DUMPs as the original.
        if is_with_records(value) {
            // The expiry follows as Redis's own PEXPIREAT.
            // SAFETY: the live handles of this callback.
            let _ = unsafe {
                emit_with_args(aof, c"RL.RESVSTATE", key, &resv_state_args(state, records))
            };
            return;
        }
        let (full_at_ns, full_at_frac) = full_at_i64(state);
        // SAFETY: live handles from Redis; "sl" matches one RedisModuleString and one long long,
        // "sll" two. The key's expiry follows as a PEXPIREAT that Redis writes itself. A
        // whole-nanosecond state keeps 0.1.0's form, so its AOF reads the same.
        unsafe {
            if full_at_frac == 0 {
                emit(
                    aof,
                    c"RL.SETSTATE".as_ptr(),
                    c"sl".as_ptr(),
                    key,
                    full_at_ns,
                );
            } else {
                emit(
                    aof,
                    c"RL.SETSTATE".as_ptr(),
                    c"sll".as_ptr(),
                    key,
                    full_at_ns,
                    full_at_frac,
                );
            }
        }
    }
}

/// The server's record of each module value (`moduleValue`: the type pointer and the value
/// word): memory the bucket costs that no server counts itself.
const VALUE_RECORD_BYTES: usize = 2 * std::mem::size_of::<usize>();

/// The value record plus what the value owns: nothing for an inline state, 16 bytes for a
/// boxed one. Never 0: Valkey 8.1 answers `MEMORY USAGE` of a module key with this number
/// alone (the key is embedded in its object, and neither is added), so 0 made every bucket
/// look free there.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    if is_with_records(value) {
        // SAFETY: a tagged value is only made by `to_value_with`, live until `free`.
        let capacity = unsafe { with_records(value) }.records.heap_capacity();
        VALUE_RECORD_BYTES
            + std::mem::size_of::<WithRecords>()
            + capacity.saturating_mul(std::mem::size_of::<Reservation>())
    } else if is_boxed(value) {
        VALUE_RECORD_BYTES + std::mem::size_of::<Boxed>()
    } else {
        VALUE_RECORD_BYTES
    }
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    if let Some(state) = from_value(value) {
        // SAFETY: `md` is the live digest handle Redis passed in.
        unsafe {
            if let (Some(add), Some(end)) = (
                raw::RedisModule_DigestAddLongLong,
                raw::RedisModule_DigestEndSequence,
            ) {
                let (full_at_ns, full_at_frac) = full_at_i64(state);
                add(md, full_at_ns);
                // Whole-nanosecond states digest as in 0.1.0.
                if full_at_frac != 0 {
                    add(md, full_at_frac);
                }
                for record in records_of(value) {
                    if let Some(add_buffer) = raw::RedisModule_DigestAddStringBuffer {
                        let id = record.id.as_bytes();
                        add_buffer(md, id.as_ptr().cast_mut().cast(), id.len());
                        let estimate = estimate_text(record.estimate);
                        add_buffer(md, estimate.as_ptr().cast_mut().cast(), estimate.len());
                    }
                    add(md, i64::try_from(record.expires_at_us).unwrap_or(i64::MAX));
                }
                end(md);
            }
        }
    }
}

unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: Redis frees a value once, when no key holds it any more.
    unsafe { free_value(value) }
}

/// `COPY`: an inline value is plain data; a boxed one, or one of [`RESV_TYPE_NAME`], gets an
/// allocation of its own.
unsafe extern "C" fn copy(
    _from_key: *mut raw::RedisModuleString,
    _to_key: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    match from_value(value) {
        Some(state) if is_with_records(value) => {
            to_value_with(state, Records::from(records_of(value).to_vec()))
        }
        Some(state) => to_value(state),
        None => ptr::null_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_accepts_versions_one_and_two_with_a_valid_state() {
        const MAX_NS: u64 = i64::MAX as u64;
        type Row = (i32, &'static [Option<u64>], Result<(u64, u64), DecodeError>);
        let rows: &[Row] = &[
            (1, &[Some(1)], Ok((1, 0))),                       // 0.1.0, smallest
            (1, &[Some(MAX_NS)], Ok((MAX_NS, 0))),             // 0.1.0, latest
            (1, &[Some(0)], Err(DecodeError::Range)),          // zero is not a state
            (1, &[Some(MAX_NS + 1)], Err(DecodeError::Range)), // past 2262
            (1, &[None], Err(DecodeError::Io)),                // short read
            (2, &[Some(5), Some(0)], Ok((5, 0))),              // whole ns
            (2, &[Some(5), Some(MAX_NS)], Ok((5, MAX_NS))),    // largest fraction
            (2, &[Some(5), Some(MAX_NS + 1)], Err(DecodeError::Range)), // fraction past 2^63
            (2, &[Some(0), Some(1)], Err(DecodeError::Range)), // zero instant
            (2, &[Some(u64::MAX), Some(0)], Err(DecodeError::Range)), // all ones
            (2, &[Some(5), None], Err(DecodeError::Io)),       // truncated fraction
            (2, &[None, None], Err(DecodeError::Io)),          // nothing at all
            (0, &[Some(1)], Err(DecodeError::Version)),        // unknown older
            (3, &[Some(1), Some(0)], Err(DecodeError::Version)), // unknown newer
        ];
        for &(encver, fields, want) in rows {
            let mut next = fields.iter().copied();
            let got = decode(encver, || next.next().flatten())
                .map(|s| (s.full_at_ns(), s.full_at_frac()));
            assert_eq!(got, want, "encver {encver}, fields {fields:?}");
        }
    }

    /// One field of a reservation-bearing value, as the loader reads it.
    #[derive(Clone, Copy, Debug)]
    enum F {
        U(u64),
        S(i64),
        B(&'static [u8]),
    }

    fn decode_fields(encver: i32, fields: &[F]) -> Result<(State, Vec<Reservation>), DecodeError> {
        let fields = std::cell::RefCell::new(fields.iter().copied());
        decode_value(
            encver,
            || match fields.borrow_mut().next() {
                Some(F::U(v)) => Some(v),
                _ => None,
            },
            || match fields.borrow_mut().next() {
                Some(F::S(v)) => Some(v),
                _ => None,
            },
            || match fields.borrow_mut().next() {
                Some(F::B(v)) => Some(v.to_vec()),
                _ => None,
            },
        )
    }

    #[test]
    fn decode_value_checks_every_field_of_a_reservation() {
        use F::*;
        const AT: u64 = 1_800_000_000_000_000;
        // A valid record: id "a", estimate 25e-1 (2.5), expiry AT.
        let good: &[F] = &[U(5), U(0), U(1), B(b"a"), U(0), U(25), S(-1), U(AT)];
        let (state, records) = decode_fields(1, good).unwrap();
        assert_eq!(state.full_at_ns(), 5);
        assert_eq!(records.len(), 1);
        assert_eq!(estimate_text(records[0].estimate), "25e-1");
        // No record open: a bucket whose reservations were all settled.
        let (state, records) = decode_fields(1, &[U(5), U(7), U(0)]).unwrap();
        assert_eq!((state.full_at_ns(), state.full_at_frac()), (5, 7));
        assert!(records.is_empty());
        type Row = (i32, &'static [F], DecodeError);
        let rows: &[Row] = &[
            // unknown version
            (
                2,
                &[U(5), U(0), U(1), B(b"a"), U(0), U(25), S(-1), U(AT)],
                DecodeError::Version,
            ),
            // past the cap
            (1, &[U(5), U(0), U(1001)], DecodeError::Range),
            // zero instant
            (1, &[U(0), U(0), U(1)], DecodeError::Range),
            // an empty id, a 17-byte id
            (
                1,
                &[U(5), U(0), U(1), B(b""), U(0), U(1), S(0), U(AT)],
                DecodeError::Range,
            ),
            (
                1,
                &[
                    U(5),
                    U(0),
                    U(1),
                    B(b"12345678901234567"),
                    U(0),
                    U(1),
                    S(0),
                    U(AT),
                ],
                DecodeError::Range,
            ),
            // a zero estimate; digits not canonical (trailing zero); 39 digits
            (
                1,
                &[U(5), U(0), U(1), B(b"a"), U(0), U(0), S(0), U(AT)],
                DecodeError::Range,
            ),
            (
                1,
                &[U(5), U(0), U(1), B(b"a"), U(0), U(10), S(0), U(AT)],
                DecodeError::Range,
            ),
            (
                1,
                &[
                    U(5),
                    U(0),
                    U(1),
                    B(b"a"),
                    U(u64::MAX),
                    U(u64::MAX),
                    S(0),
                    U(AT),
                ],
                DecodeError::Range,
            ),
            // an exponent past any decimal a command takes
            (
                1,
                &[U(5), U(0), U(1), B(b"a"), U(0), U(1), S(i64::MAX), U(AT)],
                DecodeError::Range,
            ),
            // expiry 0 or past the storable range
            (
                1,
                &[U(5), U(0), U(1), B(b"a"), U(0), U(1), S(0), U(0)],
                DecodeError::Range,
            ),
            (
                1,
                &[U(5), U(0), U(1), B(b"a"), U(0), U(1), S(0), U(1 << 58)],
                DecodeError::Range,
            ),
            // an id twice
            (
                1,
                &[
                    U(5),
                    U(0),
                    U(2),
                    B(b"a"),
                    U(0),
                    U(1),
                    S(0),
                    U(AT),
                    B(b"a"),
                    U(0),
                    U(2),
                    S(0),
                    U(AT),
                ],
                DecodeError::Range,
            ),
            // truncated
            (
                1,
                &[U(5), U(0), U(1), B(b"a"), U(0), U(1), S(0)],
                DecodeError::Io,
            ),
        ];
        for (i, &(encver, fields, want)) in rows.iter().enumerate() {
            assert_eq!(
                decode_fields(encver, fields).map(|_| ()),
                Err(want),
                "row {i}"
            );
        }
    }

    #[test]
    fn values_round_trip_through_the_pointer_inline_or_boxed() {
        let cases = [
            (1, 0, false),
            (1_700_000_000_000_000_123, 0, false),
            (i64::MAX as u64, 0, false),
            (1_700_000_000_000_000_123, 1, true),
            (i64::MAX as u64, i64::MAX as u64, true),
        ];
        for (full_at_ns, full_at_frac, boxed) in cases {
            let state = State::from_parts(full_at_ns, full_at_frac).unwrap();
            let value = to_value(state);
            assert_eq!(is_boxed(value), boxed, "{state:?}");
            assert_eq!(from_value(value), Some(state));
            // SAFETY: made by to_value just above, referenced by nothing else.
            unsafe { free_value(value) };
        }
        assert_eq!(from_value(ptr::null()), None);
    }
}
