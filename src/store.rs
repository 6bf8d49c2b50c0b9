//! The one door to stored state, shared by both stores (a per-key bucket in `datatype`, a
//! table's bucket in `table_type`), the way governor's `StateStore` is: a handle reads what is
//! stored when opened, the pure step stages one change, and [`Store::commit`] applies it
//! itself: the write or deletion, the modified-key signal and keyspace event, and the
//! replicated effect. A handler never hands the door back what it already knows, and a
//! handle with nothing staged commits nothing and propagates nothing.
//!
//! Also here: what both stores do to a key of the running command ([`OpenKey`], [`read`],
//! [`delete_key`], [`signal_modified`], [`replicate_del`]) and to their registered types, and
//! the one read of a value that is not ours: a bucket the Lua fallback wrote as a string or hash
//! ([`OpenKey::fallback_state`]), which the per-key store takes over.
//! Depends on the pure bucket (`rl_bucket`), `error` and `propagation` only.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;
use rl_bucket::{Change, FallbackState, State};

use crate::error::Error;

/// What a handle read, and the change staged on it since: the part of a handle both stores
/// share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staged {
    stored: Option<State>,
    change: Change,
}

impl Staged {
    /// A handle's view of `stored`, with nothing staged.
    pub fn new(stored: Option<State>) -> Self {
        Staged {
            stored,
            change: Change::Keep,
        }
    }

    /// What the handle read, as updated by its commits.
    pub fn stored(&self) -> Option<State> {
        self.stored
    }

    /// The bucket as the handle sees it: what it read, plus the change staged since.
    pub fn state(&self) -> Option<State> {
        match self.change {
            Change::Keep => self.stored,
            Change::Set(state) => Some(state),
            Change::Delete => None,
        }
    }

    /// Records `change` for the next commit; a later change replaces an earlier one, and
    /// `Keep` changes nothing.
    pub fn stage(&mut self, change: Change) {
        if change != Change::Keep {
            self.change = change;
        }
    }

    /// Takes the staged change for a commit, leaving nothing staged.
    fn take(&mut self) -> Change {
        std::mem::replace(&mut self.change, Change::Keep)
    }

    /// Records that `change` is now what is stored.
    fn applied(&mut self, change: Change) {
        self.stored = match change {
            Change::Keep => self.stored,
            Change::Set(state) => Some(state),
            Change::Delete => None,
        };
    }
}

/// A stored bucket behind the door. A store says how it reads ([`Store::staged`]) and how
/// it applies one change ([`Store::apply`]); reading, staging, committing and the
/// decide-then-commit step are the same for every store.
pub trait Store {
    /// What the handle read and has staged since.
    fn staged(&self) -> &Staged;
    /// As [`Store::staged`], to stage or record a change.
    fn staged_mut(&mut self) -> &mut Staged;
    /// Makes `change` (never `Keep`) durable: stores it, reports it as the keyspace event
    /// `event` (`del` for a deletion), and replicates its effect.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server refuses a write; [`Error::TableFull`] for a new
    /// bucket of a full table (nothing is written).
    fn apply(&mut self, change: Change, event: &CStr) -> Result<(), Error>;

    /// The bucket as this handle sees it: what it read, plus any change staged since.
    fn state(&self) -> Option<State> {
        self.staged().state()
    }

    /// Records `change` for the next [`Store::commit`]; touches nothing yet.
    fn stage(&mut self, change: Change) {
        self.staged_mut().stage(change);
    }

    /// Applies the staged change, if any (see [`Store::apply`]). A handle with nothing
    /// staged commits nothing and propagates nothing.
    ///
    /// # Errors
    /// As for [`Store::apply`]; the change stays unapplied.
    fn commit(&mut self, event: &CStr) -> Result<(), Error> {
        let change = self.staged_mut().take();
        if change == Change::Keep {
            return Ok(());
        }
        self.apply(change, event)?;
        self.staged_mut().applied(change);
        Ok(())
    }

    /// Reads the bucket, lets `decide` (a pure step) say what to answer and what to change,
    /// and commits the change as `event` (governor's `measure_and_replace`).
    ///
    /// # Errors
    /// As for [`Store::commit`].
    fn measure_and_replace<T>(
        &mut self,
        event: &CStr,
        decide: impl FnOnce(Option<State>) -> (T, Change),
    ) -> Result<T, Error>
    where
        Self: Sized,
    {
        let (answer, change) = decide(self.state());
        self.stage(change);
        self.commit(event)?;
        Ok(answer)
    }
}

/// A key of the running command, open for reading (and writing), closed on drop: what the
/// handles of both stores hold.
pub(crate) struct OpenKey {
    pub(crate) ctx: *mut raw::RedisModuleCtx,
    pub(crate) name: *mut raw::RedisModuleString,
    /// Null only for a missing key opened for reading.
    pub(crate) key: *mut raw::RedisModuleKey,
}

impl OpenKey {
    /// Opens `name`, for writing too when `write`.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server lacks the API or returns no handle to write through.
    ///
    /// # Safety
    /// `ctx` and `name` must be the live context and an argument of the running command.
    pub(crate) unsafe fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        write: bool,
    ) -> Result<Self, Error> {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let open = raw::RedisModule_OpenKey.ok_or(Error::Internal)?;
        // SAFETY: guaranteed by the caller; a non-null handle is closed exactly once, in Drop.
        let key = unsafe { open(ctx, name, mode as c_int) }.cast::<raw::RedisModuleKey>();
        let handle = Self { ctx, name, key };
        if write && key.is_null() {
            return Err(Error::Internal);
        }
        Ok(handle)
    }

    /// The key's value if it holds `expected_type`, `None` if it is missing.
    ///
    /// # Errors
    /// [`Error::WrongType`] for a key of any other type, whose value is never read.
    pub(crate) fn value(
        &self,
        expected_type: *mut raw::RedisModuleType,
    ) -> Result<Option<*mut c_void>, Error> {
        // SAFETY: `self.key` is null or open.
        unsafe { read(self.key, expected_type) }
    }

    /// The key's value if it holds either of `types`, with whether it is the second; `None`
    /// if it is missing. One look at the key's type, where two [`OpenKey::value`] calls make
    /// two.
    ///
    /// # Errors
    /// [`Error::WrongType`] for a key of any other type, whose value is never read.
    pub(crate) fn value_of_either(
        &self,
        types: [*mut raw::RedisModuleType; 2],
    ) -> Result<Option<(*mut c_void, bool)>, Error> {
        if self.key.is_null() {
            return Ok(None);
        }
        // SAFETY: `self.key` is an open handle; these calls only inspect it.
        unsafe {
            let key_type = raw::RedisModule_KeyType.ok_or(Error::Internal)?(self.key);
            if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
                return Ok(None);
            }
            if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int {
                return Err(Error::WrongType);
            }
            let module_type = raw::RedisModule_ModuleTypeGetType.ok_or(Error::Internal)?(self.key);
            let [first, second] = types;
            if module_type != first && module_type != second {
                return Err(Error::WrongType);
            }
            let value = raw::RedisModule_ModuleTypeGetValue.ok_or(Error::Internal)?(self.key);
            Ok(Some((value, module_type == second)))
        }
    }

    /// The bucket a string or hash holds if the Lua fallback wrote it: its packed string (`rl`
    /// and three doubles), or (the form before it) a hash of exactly three fields `a`, `b` and
    /// `d`, each an integer as the fallback writes one, in its range
    /// ([`FallbackState::parse_packed`], [`FallbackState::parse`]). Only the values are read,
    /// and nothing is changed.
    ///
    /// # Errors
    /// [`Error::WrongType`] for a missing key, any other type, any other string, or any other
    /// hash (more or fewer fields, other names, values the fallback would not write): a value
    /// that is not the fallback's stays someone else's.
    pub(crate) fn fallback_state(&self) -> Result<State, Error> {
        if self.key.is_null() {
            return Err(Error::WrongType);
        }
        // SAFETY: `self.key` is an open handle; this call only inspects it.
        let key_type = unsafe { raw::RedisModule_KeyType.ok_or(Error::Internal)?(self.key) };
        if key_type == raw::REDISMODULE_KEYTYPE_STRING as c_int {
            return self.fallback_string_state();
        }
        // SAFETY: as above.
        let is_three_field_hash = key_type == raw::REDISMODULE_KEYTYPE_HASH as c_int
            && unsafe { raw::RedisModule_ValueLength.ok_or(Error::Internal)?(self.key) } == 3;
        if !is_three_field_hash {
            return Err(Error::WrongType);
        }
        let mut values: [*mut raw::RedisModuleString; 3] = [ptr::null_mut(); 3];
        let [a, b, d] = &mut values;
        // SAFETY: an open hash key; CFIELDS takes C-string names, each followed by where to
        // put its value (NULL when the field is missing), the list ended by NULL. Each value
        // returned is a new string this function frees below.
        let status = unsafe {
            raw::RedisModule_HashGet.ok_or(Error::Internal)?(
                self.key,
                raw::REDISMODULE_HASH_CFIELDS as c_int,
                c"a".as_ptr(),
                ptr::from_mut(a),
                c"b".as_ptr(),
                ptr::from_mut(b),
                c"d".as_ptr(),
                ptr::from_mut(d),
                ptr::null::<c_void>(),
            )
        };
        let parsed = match values.map(|value| {
            // SAFETY: null or a live string returned by HashGet.
            (!value.is_null()).then(|| unsafe { string_bytes(value) })
        }) {
            [Some(a), Some(b), Some(d)] if status == raw::REDISMODULE_OK as c_int => {
                FallbackState::parse(a, b, d).map_err(|_| Error::WrongType)
            }
            _ => Err(Error::WrongType),
        };
        for value in values {
            if !value.is_null() {
                // SAFETY: returned by HashGet for this context, freed once, after its bytes
                // were last read.
                unsafe {
                    if let Some(free) = raw::RedisModule_FreeString {
                        free(self.ctx, value);
                    }
                }
            }
        }
        parsed.map(FallbackState::state)
    }

    /// The bucket a string holds if the Lua fallback wrote it: `rl` and three doubles
    /// ([`FallbackState::parse_packed`]), read in place and not changed.
    ///
    /// # Errors
    /// [`Error::WrongType`] for any other string.
    fn fallback_string_state(&self) -> Result<State, Error> {
        let mut len = 0usize;
        // SAFETY: `self.key` is an open string key; READ access only reads the bytes, which
        // stay valid until the key is modified or closed, after this function returns.
        let bytes = unsafe {
            let ptr = raw::RedisModule_StringDMA.ok_or(Error::Internal)?(
                self.key,
                &mut len,
                raw::REDISMODULE_READ as c_int,
            );
            if ptr.is_null() {
                return Err(Error::WrongType);
            }
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        };
        FallbackState::parse_packed(bytes)
            .map(FallbackState::state)
            .map_err(|_| Error::WrongType)
    }
}

/// The bytes of a string (a command argument, a hash value).
///
/// # Safety
/// `s` must be a live RedisModuleString that outlives the returned slice.
pub(crate) unsafe fn string_bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: guaranteed by the caller.
    unsafe {
        let Some(ptr_len) = raw::RedisModule_StringPtrLen else {
            return &[];
        };
        let data = ptr_len(s, &mut len);
        if data.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(data.cast::<u8>(), len)
    }
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        // SAFETY: a non-null handle is open and is closed only here.
        unsafe {
            if let (false, Some(close)) = (self.key.is_null(), raw::RedisModule_CloseKey) {
                close(self.key);
            }
        }
    }
}

/// The value of an open key if it holds `expected_type`, `None` if the key is missing.
///
/// # Errors
/// [`Error::WrongType`] for a key of any other type, whose value is never read.
///
/// # Safety
/// `key` must be null or an open key handle.
pub(crate) unsafe fn read(
    key: *mut raw::RedisModuleKey,
    expected_type: *mut raw::RedisModuleType,
) -> Result<Option<*mut c_void>, Error> {
    if key.is_null() {
        return Ok(None);
    }
    // SAFETY: `key` is an open handle (caller); these calls only inspect it.
    unsafe {
        let key_type = raw::RedisModule_KeyType.ok_or(Error::Internal)?(key);
        if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            return Ok(None);
        }
        if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int
            || raw::RedisModule_ModuleTypeGetType.ok_or(Error::Internal)?(key) != expected_type
        {
            return Err(Error::WrongType);
        }
        Ok(Some(
            raw::RedisModule_ModuleTypeGetValue.ok_or(Error::Internal)?(key)
        ))
    }
}

/// Deletes an open key.
pub(crate) fn delete_key(key: *mut raw::RedisModuleKey) -> Result<(), Error> {
    // SAFETY: `key` is open for writing (every caller opened it so).
    let ok = unsafe { raw::RedisModule_DeleteKey.ok_or(Error::Internal)?(key) }
        == raw::REDISMODULE_OK as c_int;
    ok.then_some(()).ok_or(Error::Internal)
}

/// Reports a write: to WATCH and client-side caching, and as a keyspace event. The module
/// opts out of implicit signals (so denials do not break WATCH), which makes the commits of
/// the stores the one place a key is reported modified.
pub(crate) fn signal_modified(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    class: c_int,
    event: &CStr,
) -> Result<(), Error> {
    // SAFETY: the context and key name of the running command; a static event name.
    unsafe {
        raw::RedisModule_SignalModifiedKey.ok_or(Error::Internal)?(ctx, name);
        if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
            notify(ctx, class, event.as_ptr(), name);
        }
    }
    Ok(())
}

/// The effect of a deletion: `DEL`.
pub(crate) fn replicate_del(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
) -> Result<(), Error> {
    // SAFETY: read once, after load; "s" matches the one RedisModuleString.
    let status = unsafe {
        raw::RedisModule_Replicate.ok_or(Error::Internal)?(
            ctx,
            c"DEL".as_ptr(),
            c"s".as_ptr(),
            name,
        )
    };
    replicated(status)
}

pub(crate) fn replicated(status: c_int) -> Result<(), Error> {
    (status == raw::REDISMODULE_OK as c_int)
        .then_some(())
        .ok_or(Error::Internal)
}

/// Logs to the server log at warning level, from a callback that has no context.
pub(crate) fn log_warning(message: &std::ffi::CStr) {
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

/// Caches `registered`'s type pointer in `slot`, so the hot path reads one atomic instead of
/// a RefCell: for each type of the module.
pub(crate) fn cache_type_in(
    registered: &RedisType,
    slot: &AtomicPtr<raw::RedisModuleType>,
) -> Result<(), Error> {
    let raw_type = registered
        .raw_type
        .try_borrow()
        .map_err(|_| Error::Internal)?;
    if raw_type.is_null() {
        return Err(Error::Internal);
    }
    slot.store(*raw_type, Ordering::Relaxed);
    Ok(())
}

/// The signed form used in commands and digests; `State` guarantees both fit.
pub(crate) fn full_at_i64(state: State) -> (i64, i64) {
    (
        i64::try_from(state.full_at_ns()).unwrap_or(i64::MAX),
        i64::try_from(state.full_at_frac()).unwrap_or(i64::MAX),
    )
}
