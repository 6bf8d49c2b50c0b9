//! The `rl-bucket` module type: its callbacks (RDB, AOF, digest, copy, memory) and the
//! open-key handle that commands read and write buckets through.
//!
//! The value is the bucket's 64-bit [`State`] stored in the value pointer itself, so a bucket
//! costs no allocation of ours and `free` has nothing to do. Loading trusts nothing: a value
//! that is not a [`State`] fails the load instead of becoming a bucket.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::bucket::State;
use crate::error::Error;

/// The type's name in RDB files (exactly 9 characters, as Redis requires).
pub const TYPE_NAME: &str = "rl-bucket";
/// The RDB encoding: 1 is one unsigned integer, `full_at_ns`.
pub const ENCODING_VERSION: i32 = 1;

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

/// The registered type, cached at load so the hot path reads one atomic instead of a RefCell.
static TYPE_PTR: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Caches the registered type pointer. Call once, after `redis_module!` created the type.
pub fn cache_type() -> Result<(), Error> {
    let raw_type = BUCKET_TYPE
        .raw_type
        .try_borrow()
        .map_err(|_| Error::Internal)?;
    if raw_type.is_null() {
        return Err(Error::Internal);
    }
    TYPE_PTR.store(*raw_type, Ordering::Relaxed);
    Ok(())
}

fn bucket_type() -> *mut raw::RedisModuleType {
    TYPE_PTR.load(Ordering::Relaxed)
}

fn to_value(state: State) -> *mut c_void {
    state.full_at_ns() as usize as *mut c_void
}

fn from_value(value: *const c_void) -> Option<State> {
    State::from_full_at_ns(value as usize as u64)
}

/// The signed form used in commands and digests; `State` guarantees it fits.
fn full_at_i64(state: State) -> i64 {
    i64::try_from(state.full_at_ns()).unwrap_or(i64::MAX)
}

/// A key opened for writing, closed on drop.
pub struct BucketKey {
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
}

impl BucketKey {
    /// Opens `name` for reading and writing.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server returns no handle.
    ///
    /// # Safety
    /// `ctx` and `name` must be the live context and an argument of the running command.
    pub unsafe fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
    ) -> Result<Self, Error> {
        // SAFETY: forwarded (caller).
        let key =
            unsafe { Self::open_mode(ctx, name, raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) }?;
        if key.key.is_null() {
            return Err(Error::Internal);
        }
        Ok(key)
    }

    /// Opens `name` for reading only (it works on replicas and in read-only scripts). A
    /// missing key yields a handle that reads as a full bucket.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server lacks the API.
    ///
    /// # Safety
    /// As for [`BucketKey::open`].
    pub unsafe fn open_read(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
    ) -> Result<Self, Error> {
        // SAFETY: forwarded (caller).
        unsafe { Self::open_mode(ctx, name, raw::REDISMODULE_READ) }
    }

    unsafe fn open_mode(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        mode: u32,
    ) -> Result<Self, Error> {
        let open = raw::RedisModule_OpenKey.ok_or(Error::Internal)?;
        // SAFETY: guaranteed by the caller; a non-null handle is closed exactly once, in Drop.
        let key = unsafe { open(ctx, name, mode as c_int) }.cast::<raw::RedisModuleKey>();
        Ok(Self { ctx, name, key })
    }

    /// The bucket held by the key: `None` for a missing key (a full bucket).
    ///
    /// # Errors
    /// [`Error::WrongType`] if the key holds any other type, whose value is never read.
    pub fn state(&self) -> Result<Option<State>, Error> {
        if self.key.is_null() {
            return Ok(None);
        }
        // SAFETY: `self.key` is an open handle (see `open`); these calls only inspect it.
        unsafe {
            let key_type = raw::RedisModule_KeyType.ok_or(Error::Internal)?(self.key);
            if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
                return Ok(None);
            }
            if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int
                || raw::RedisModule_ModuleTypeGetType.ok_or(Error::Internal)?(self.key)
                    != bucket_type()
            {
                return Err(Error::WrongType);
            }
            let value = raw::RedisModule_ModuleTypeGetValue.ok_or(Error::Internal)?(self.key);
            // Only a State is ever stored, so this cannot fail unless memory was corrupted.
            from_value(value).map(Some).ok_or(Error::Internal)
        }
    }

    /// Stores `state` with its expiry, `state.expire_at_ms()`, and publishes the keyspace
    /// event `event` (class `d`, module types). `existed` says whether the key already held a
    /// bucket, which `state()` told the caller.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server refuses the write.
    pub fn write(&self, state: State, existed: bool, event: &CStr) -> Result<(), Error> {
        let value = to_value(state);
        let expire_at_ms = i64::try_from(state.expire_at_ms()).map_err(|_| Error::Internal)?;
        // SAFETY: `self.key` is open for writing; the type is ours; the value needs no free.
        let ok = unsafe {
            let set = if existed {
                // Swapping the pointer in place keeps the key object and its expiry entry,
                // where SetValue would delete and re-create both.
                let replace = raw::RedisModule_ModuleTypeReplaceValue.ok_or(Error::Internal)?;
                replace(self.key, bucket_type(), value, ptr::null_mut())
            } else {
                raw::RedisModule_ModuleTypeSetValue.ok_or(Error::Internal)?(
                    self.key,
                    bucket_type(),
                    value,
                )
            };
            set == raw::REDISMODULE_OK as c_int
                && raw::RedisModule_SetAbsExpire.ok_or(Error::Internal)?(self.key, expire_at_ms)
                    == raw::REDISMODULE_OK as c_int
        };
        ok.then(|| self.modified(raw::REDISMODULE_NOTIFY_MODULE, event))
            .ok_or(Error::Internal)?
    }

    /// Deletes the key (a full bucket and a missing key mean the same), publishing `del`.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server refuses.
    pub fn delete(&self) -> Result<(), Error> {
        // SAFETY: `self.key` is open for writing.
        let ok = unsafe { raw::RedisModule_DeleteKey.ok_or(Error::Internal)?(self.key) }
            == raw::REDISMODULE_OK as c_int;
        ok.then(|| self.modified(raw::REDISMODULE_NOTIFY_GENERIC, c"del"))
            .ok_or(Error::Internal)?
    }

    /// Reports a write: to WATCH and client-side caching, and as a keyspace event. The module
    /// opts out of implicit signals (so denials do not break WATCH), which makes the writers
    /// above the one place a bucket is reported modified.
    fn modified(&self, class: c_int, event: &CStr) -> Result<(), Error> {
        // SAFETY: the context and key name of the running command; a static event name.
        unsafe {
            raw::RedisModule_SignalModifiedKey.ok_or(Error::Internal)?(self.ctx, self.name);
            if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
                notify(self.ctx, class, event.as_ptr(), self.name);
            }
        }
        Ok(())
    }
}

impl Drop for BucketKey {
    fn drop(&mut self) {
        // SAFETY: a non-null handle is open and is closed only here.
        unsafe {
            if let (false, Some(close)) = (self.key.is_null(), raw::RedisModule_CloseKey) {
                close(self.key);
            }
        }
    }
}

/// Logs to the server log at warning level, from a callback that has no context.
fn log_warning(message: &std::ffi::CStr) {
    // SAFETY: a NULL context is allowed by RedisModule_Log; both strings are NUL-terminated.
    unsafe {
        if let Some(log) = raw::RedisModule_Log {
            log(
                ptr::null_mut(),
                c"warning".as_ptr(),
                c"%s".as_ptr(),
                message.as_ptr(),
            );
        }
    }
}

/// Why a stored value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// An encoding version this build does not know.
    Version,
    /// The server reported a short or mistyped read.
    Io,
    /// `full_at_ns` is 0 or past `MAX_FULL_AT_NS`.
    Range,
}

/// Decodes one stored bucket from the fields Redis hands back. `next_unsigned` yields the next
/// unsigned field, or `None` on an I/O error. Pure, so fuzzers drive it with arbitrary input.
///
/// # Errors
/// A [`DecodeError`] for anything but encoding version 1 holding a valid [`State`].
pub fn decode(
    encver: i32,
    mut next_unsigned: impl FnMut() -> Option<u64>,
) -> Result<State, DecodeError> {
    if encver != ENCODING_VERSION {
        return Err(DecodeError::Version);
    }
    let full_at_ns = next_unsigned().ok_or(DecodeError::Io)?;
    State::from_full_at_ns(full_at_ns).ok_or(DecodeError::Range)
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY: `rdb` is the live IO handle Redis passed in. HANDLE_IO_ERRORS is set at load,
    // so a short or mistyped read sets the error flag instead of aborting the server.
    let next_unsigned = || unsafe {
        let value = raw::RedisModule_LoadUnsigned.map(|load| load(rdb))?;
        let failed = raw::RedisModule_IsIOError.is_none_or(|failed| failed(rdb) != 0);
        (!failed).then_some(value)
    };
    match decode(encver, next_unsigned) {
        Ok(state) => to_value(state),
        Err(DecodeError::Io) => ptr::null_mut(),
        Err(DecodeError::Version) => {
            log_warning(c"rl-bucket: unknown encoding version, refusing to load the value");
            ptr::null_mut()
        }
        Err(DecodeError::Range) => {
            log_warning(c"rl-bucket: stored full_at_ns out of range, refusing to load the value");
            ptr::null_mut()
        }
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    if let (Some(state), Some(save)) = (from_value(value), unsafe { raw::RedisModule_SaveUnsigned })
    {
        // SAFETY: `rdb` is the live IO handle Redis passed in.
        unsafe { save(rdb, state.full_at_ns()) };
    }
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    if let (Some(state), Some(emit)) = (from_value(value), unsafe { raw::RedisModule_EmitAOF }) {
        // SAFETY: live handles from Redis; "sl" matches one RedisModuleString and one long long.
        // The key's expiry follows as a PEXPIREAT that Redis writes itself.
        unsafe {
            emit(
                aof,
                c"RL.SETSTATE".as_ptr(),
                c"sl".as_ptr(),
                key,
                full_at_i64(state),
            );
        }
    }
}

/// The server's record of each module value (`moduleValue`: the type pointer and the value
/// word, which holds the state inline): memory the bucket costs that no server counts itself.
const VALUE_RECORD_BYTES: usize = 2 * std::mem::size_of::<usize>();

/// The value record plus what the value owns (nothing: the state is inline). Never 0: Valkey
/// 8.1 answers `MEMORY USAGE` of a module key with this number alone (the key is embedded in
/// its object, and neither is added), so 0 made every bucket look free there.
unsafe extern "C" fn mem_usage(_value: *const c_void) -> usize {
    VALUE_RECORD_BYTES
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    if let Some(state) = from_value(value) {
        // SAFETY: `md` is the live digest handle Redis passed in.
        unsafe {
            if let (Some(add), Some(end)) = (
                raw::RedisModule_DigestAddLongLong,
                raw::RedisModule_DigestEndSequence,
            ) {
                add(md, full_at_i64(state));
                end(md);
            }
        }
    }
}

/// Nothing to free: the value is the state, not a pointer to it.
unsafe extern "C" fn free(_value: *mut c_void) {}

/// `COPY`: the value is plain data, so the copy is the same 64 bits.
unsafe extern "C" fn copy(
    _from_key: *mut raw::RedisModuleString,
    _to_key: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    value.cast_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_accepts_only_version_one_with_a_valid_state() {
        let rows: &[(i32, Option<u64>, Result<u64, DecodeError>)] = &[
            (1, Some(1), Ok(1)),                                     // smallest state
            (1, Some(i64::MAX as u64), Ok(i64::MAX as u64)),         // latest state
            (1, Some(0), Err(DecodeError::Range)),                   // zero is not a state
            (1, Some(i64::MAX as u64 + 1), Err(DecodeError::Range)), // past 2262
            (1, Some(u64::MAX), Err(DecodeError::Range)),            // all ones
            (1, None, Err(DecodeError::Io)),                         // short read
            (0, Some(1), Err(DecodeError::Version)),                 // unknown older version
            (2, Some(1), Err(DecodeError::Version)),                 // unknown newer version
        ];
        for &(encver, field, want) in rows {
            let got = decode(encver, || field).map(State::full_at_ns);
            assert_eq!(got, want, "encver {encver}, field {field:?}");
        }
    }

    #[test]
    fn values_round_trip_through_the_pointer() {
        for full_at_ns in [1, 1_700_000_000_000_000_123, i64::MAX as u64] {
            let state = State::from_full_at_ns(full_at_ns).unwrap();
            assert_eq!(from_value(to_value(state)), Some(state));
        }
        assert_eq!(from_value(ptr::null()), None);
    }
}
