//! The `rl-htable` module type, a key holding a [`Table`] of buckets: its callbacks (RDB, AOF,
//! digest, copy, memory, lazy free) and its handles behind the [`Store`] door: [`TableKey`]
//! for a key, [`TableField`] for one bucket of it.
//!
//! What the glue decides, and the pure table does not:
//! - **Replication.** Every change travels as its effect, `RL.HSETSTATE key tag full_at_ns
//!   full_at_frac` (`full_at_ns` 0 deletes), so replicas and AOF hold the same buckets. Tags,
//!   not fields, travel, since a sweep only knows tags.
//! - **Sweeping.** Each write of the master's own commands sweeps [`SWEEP_STEP`] slots by the
//!   master's clock and replicates what it removed, and the master's background sweep
//!   ([`crate::sweeper`]) does the same through [`TableKey::sweep`]; `RL.HSETSTATE` (what
//!   replicas and AOF replay) never sweeps, so a replica never decides by its own clock.
//! - **Reservations.** A bucket's reservation records (`RL.HRESERVE`) live in the table's
//!   side map; a write of them replicates as `RL.HRESVSTATE key tag full_at_ns full_at_frac
//!   [id estimate expires_at_us ...]`. A bucket with a record open is never swept, and a
//!   write that leaves it full stores it full as of now instead of removing it.
//! - **No expiry.** A table's key has no expiry: each write that stores a bucket takes away
//!   one a user set (`EXPIRE`, `PEXPIREAT`, `RESTORE` with a TTL), on the master and on every
//!   copy that applies the write, so every copy holds the same (none). Reclaim is the
//!   sweep's: it removes full buckets, and a table left empty by a removal is deleted on the
//!   spot, each replicated. An expiry derived from the buckets could not be the same on
//!   every copy without carrying a high-water mark in every format (a removal does not lower
//!   the latest instant, a snapshot holds only live buckets), and a key with an expiry is
//!   what the `volatile-*` eviction policies evict, denials and all.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;
use rl_bucket::{Change, Reservation, State};

use crate::datatype::{self, emit_with_args, estimate_text, replicate_with_args};
use crate::error::Error;
use crate::store::{
    cache_type_in, delete_key, full_at_i64, log_warning, replicate_del, replicated,
    signal_modified, OpenKey, Staged, Store,
};
use crate::table::{self, Table, Tag};
use crate::{propagation, table_registry};

/// The type's name in RDB files and `TYPE` (exactly 9 characters, as Redis requires).
pub const TYPE_NAME: &str = "rl-htable";

/// Slots each write of a master's own command sweeps: a bounded cost per call (a few µs).
pub const SWEEP_STEP: usize = 32;

/// The type as registered by `redis_module!`.
pub static TABLE_TYPE: RedisType = RedisType::new(
    TYPE_NAME,
    table::ENCODING_VERSION,
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
        free_effort: Some(free_effort),
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: Some(copy2),
        aux_save2: None,
    },
);

static TYPE_PTR: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Caches the registered type pointer. Call once, after `redis_module!` created the type.
pub fn cache_type() -> Result<(), Error> {
    cache_type_in(&TABLE_TYPE, &TYPE_PTR)
}

fn table_type() -> *mut raw::RedisModuleType {
    TYPE_PTR.load(Ordering::Relaxed)
}

/// The registered type, to recognise a table's key without opening it (the sweeper's scan).
pub fn registered_type() -> *mut raw::RedisModuleType {
    table_type()
}

/// A key holding a table (or nothing yet), opened for a command: the door to the table's
/// buckets. Reads see what is stored; changes are staged and applied, in order, at
/// [`TableKey::commit`], as a per-key bucket's are.
pub struct TableKey {
    key: OpenKey,
    /// The key's table; null while the key is missing.
    table: *mut Table,
    /// The master's clock for this command, or `None` where nothing may be swept.
    sweep_now_ns: Option<u64>,
    /// Changes staged and not yet committed, in order: each tag's new state, or `None` for
    /// a removal.
    staged: Vec<(Tag, Option<State>)>,
}

impl TableKey {
    /// Opens `name` for reading and writing. `sweep_now_ns` is the master's clock for the
    /// master's own commands, which sweep as they commit; `None` for `RL.HSETSTATE`.
    ///
    /// # Errors
    /// [`Error::WrongType`] if the key holds any other type; [`Error::Internal`] if the
    /// server returns no handle.
    ///
    /// # Safety
    /// `ctx` and `name` must be the live context and an argument of the running command.
    pub unsafe fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        sweep_now_ns: Option<u64>,
    ) -> Result<Self, Error> {
        // SAFETY: forwarded (caller).
        Self::with(unsafe { OpenKey::open(ctx, name, true) }?, sweep_now_ns)
    }

    /// Opens `name` for reading only (replicas, read-only scripts). Nothing is committed.
    ///
    /// # Errors
    /// As for [`TableKey::open`].
    ///
    /// # Safety
    /// As for [`TableKey::open`].
    pub unsafe fn open_read(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
    ) -> Result<Self, Error> {
        // SAFETY: forwarded (caller).
        Self::with(unsafe { OpenKey::open(ctx, name, false) }?, None)
    }

    fn with(key: OpenKey, sweep_now_ns: Option<u64>) -> Result<Self, Error> {
        // A value of our type is always a `Table`.
        let table = key
            .value(table_type())?
            .map_or(ptr::null_mut(), |value| value.cast::<Table>());
        Ok(Self {
            key,
            table,
            sweep_now_ns,
            staged: Vec::new(),
        })
    }

    fn table(&self) -> Option<&Table> {
        // SAFETY: a non-null `table` is the key's live value, which only this command touches.
        unsafe { self.table.as_ref() }
    }

    fn table_mut(&mut self) -> Option<&mut Table> {
        // SAFETY: as for `table`; `&mut self` makes this the one reference.
        unsafe { self.table.as_mut() }
    }

    /// Buckets held, including full ones not yet swept.
    pub fn len(&self) -> usize {
        self.table().map_or(0, Table::len)
    }

    /// Whether the key holds no table.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored bucket of `tag` (staged changes are not seen): `None` for a missing key or
    /// field (a full bucket).
    pub fn get(&self, tag: Tag) -> Option<State> {
        self.table()?.get(tag)
    }

    /// Stages `state` for `tag`, or its removal for `None`; applied at [`TableKey::commit`].
    pub fn stage(&mut self, tag: Tag, state: Option<State>) {
        self.staged.push((tag, state));
    }

    /// Applies the staged changes in order, then sweeps a step (the master's own commands
    /// only), deletes the key if no bucket is left, reports the write as `event`, and
    /// replicates each change as `RL.HSETSTATE` (or the key's deletion as `DEL`). Nothing
    /// changed, nothing reported.
    ///
    /// # Errors
    /// [`Error::TableFull`] if the new fields would take the table past
    /// [`table::MAX_BUCKETS`] (nothing is written); [`Error::Internal`] if the server refuses.
    pub fn commit(&mut self, event: &CStr) -> Result<(), Error> {
        // The staged changes become the effects in place: one allocation per write.
        let mut effects = std::mem::take(&mut self.staged);
        // Counting the new fields costs a lookup each; only a table near the cap needs it.
        if self.len().saturating_add(effects.len()) > table::MAX_BUCKETS {
            let new_fields = effects
                .iter()
                .filter(|&&(tag, state)| state.is_some() && self.get(tag).is_none())
                .count();
            if self.len().saturating_add(new_fields) > table::MAX_BUCKETS {
                return Err(Error::TableFull);
            }
        }
        let mut applied = 0;
        for i in 0..effects.len() {
            let Some(&(tag, state)) = effects.get(i) else {
                break;
            };
            let changed = match state {
                Some(state) => {
                    self.set(tag, state)?;
                    true
                }
                // Removing a bucket that is not there changes nothing, and reports nothing.
                None => self
                    .table_mut()
                    .and_then(|table| table.remove(tag))
                    .is_some(),
            };
            if changed {
                if let Some(effect) = effects.get_mut(applied) {
                    *effect = (tag, state);
                }
                applied += 1;
            }
        }
        effects.truncate(applied);
        if let (Some(now_ns), false) = (self.sweep_now_ns, effects.is_empty()) {
            if let Some(table) = self.table_mut() {
                let swept = table.sweep(now_ns, SWEEP_STEP);
                effects.extend(swept.into_iter().map(|tag| (tag, None)));
            }
        }
        self.publish(effects, event)
    }

    /// Stores `state` for `tag`, creating the table if the key is missing, and takes away
    /// any expiry the key has.
    fn set(&mut self, tag: Tag, state: State) -> Result<(), Error> {
        if self.table.is_null() {
            let table = Box::into_raw(Box::new(Table::new()));
            // SAFETY: the key is open for writing and empty; on success the key owns `table`.
            let set = unsafe {
                raw::RedisModule_ModuleTypeSetValue.ok_or(Error::Internal)?(
                    self.key.key,
                    table_type(),
                    table.cast(),
                )
            };
            if set != raw::REDISMODULE_OK as c_int {
                // SAFETY: made just above, owned by nothing else.
                drop(unsafe { Box::from_raw(table) });
                return Err(Error::Internal);
            }
            self.table = table;
        }
        // SAFETY: the running command's context and key name, live for this command.
        let place = unsafe { table_registry::place_of(self.key.ctx, self.key.name) };
        let table = self.table_mut().ok_or(Error::Internal)?;
        // A new table, one under a new name (renamed, moved, restored), or a bucket that
        // fills before any the sweep knew of: the sweep must look at this table by then.
        let recorded = table
            .recorded_at
            .as_ref()
            .map(|(db, name)| (*db, &name[..]));
        if let Some((db, name)) = place {
            if recorded != place {
                table_registry::note_at(db, name);
                table.recorded_at = Some((db, name.into()));
            } else if state.full_at_ns() < table.earliest_full_ns() {
                table_registry::note_at(db, name);
            }
        }
        table
            .set(tag, state)
            .map_err(|table::Full| Error::TableFull)?;
        // A table has no expiry: its reclaim is the sweep's, which removes full buckets and
        // deletes the table with its last one, replicating each removal. An expiry a user set
        // (EXPIRE, RESTORE with a TTL) goes at the next write that stores a bucket, on every
        // copy alike, since each applies the same writes: so every copy holds the same
        // expiry, and no eviction policy that picks keys with an expiry (`volatile-*`) can
        // take a table, and the denials in it, away.
        // SAFETY: the key is open for writing and holds our table.
        unsafe {
            let current = raw::RedisModule_GetAbsExpire.ok_or(Error::Internal)?(self.key.key);
            if current != raw::REDISMODULE_NO_EXPIRE as i64 {
                let set = raw::RedisModule_SetAbsExpire.ok_or(Error::Internal)?(
                    self.key.key,
                    raw::REDISMODULE_NO_EXPIRE as i64,
                );
                if set != raw::REDISMODULE_OK as c_int {
                    return Err(Error::Internal);
                }
            }
        }
        Ok(())
    }

    /// Reports applied `effects`: deletes the key if no bucket is left, signals the write
    /// as `event` (or `del`), and replicates each effect as `RL.HSETSTATE` (or the key's
    /// deletion as `DEL`). No effect, nothing reported.
    fn publish(&mut self, effects: Vec<(Tag, Option<State>)>, event: &CStr) -> Result<(), Error> {
        self.publish_with(None, effects, event)
    }

    /// As [`TableKey::publish`], with first the effect of a write of one bucket's state and
    /// records, replicated as `RL.HRESVSTATE`.
    fn publish_with(
        &mut self,
        first: Option<(Tag, State, &[Reservation])>,
        effects: Vec<(Tag, Option<State>)>,
        event: &CStr,
    ) -> Result<(), Error> {
        if effects.is_empty() && first.is_none() {
            return Ok(());
        }
        let propagate = propagation::needed(self.key.ctx);
        if self.table().is_some_and(Table::is_empty) {
            delete_key(self.key.key)?;
            self.table = ptr::null_mut();
            signal_modified(
                self.key.ctx,
                self.key.name,
                raw::REDISMODULE_NOTIFY_GENERIC,
                c"del",
            )?;
            return if propagate {
                replicate_del(self.key.ctx, self.key.name)
            } else {
                Ok(())
            };
        }
        signal_modified(
            self.key.ctx,
            self.key.name,
            raw::REDISMODULE_NOTIFY_MODULE,
            event,
        )?;
        if propagate {
            if let Some((tag, state, records)) = first {
                replicate_records(self.key.ctx, self.key.name, tag, state, records)?;
            }
            for (tag, state) in effects {
                replicate_set_state(self.key.ctx, self.key.name, tag, state)?;
            }
        }
        Ok(())
    }

    /// The reservation records of the bucket of `tag`, as stored (lapsed ones included: the
    /// steps drop them).
    pub fn records(&self, tag: Tag) -> Vec<Reservation> {
        self.table()
            .map_or_else(Vec::new, |table| table.records(tag).to_vec())
    }

    /// A state full at the master's clock: what a bucket full again becomes while another
    /// of its records is open, so it is held (and not removed) until that record lapses.
    fn full_now(&self) -> Result<State, Error> {
        self.sweep_now_ns
            .and_then(State::from_full_at_ns)
            .ok_or(Error::Internal)
    }

    /// Stores the bucket of `tag` as `change` leaves it together with exactly `records`,
    /// sweeps a step (the master's own commands), and reports the write as `event`: the
    /// effect replicates as `RL.HRESVSTATE key tag full_at_ns full_at_frac [id estimate
    /// expires_at_us ...]`. A bucket full again (`Delete`) is removed with its records when
    /// none is left, else kept full as of now until the others lapse.
    ///
    /// # Errors
    /// [`Error::TableFull`] for a new field past [`table::MAX_BUCKETS`], [`Error::Internal`]
    /// for `Keep` on a bucket not held or if the server refuses; nothing is written.
    pub fn commit_records(
        &mut self,
        tag: Tag,
        change: Change,
        records: Vec<Reservation>,
        event: &CStr,
    ) -> Result<(), Error> {
        let state = match change {
            Change::Set(state) => state,
            Change::Keep => self.get(tag).ok_or(Error::Internal)?,
            Change::Delete if records.is_empty() => {
                self.stage(tag, None);
                return self.commit(event);
            }
            Change::Delete => self.full_now()?,
        };
        if self.len() >= table::MAX_BUCKETS && self.get(tag).is_none() {
            return Err(Error::TableFull);
        }
        self.set(tag, state)?;
        let replicated: Vec<Reservation> = if propagation::needed(self.key.ctx) {
            records.clone()
        } else {
            Vec::new()
        };
        let sweep_now_ns = self.sweep_now_ns;
        let table = self.table_mut().ok_or(Error::Internal)?;
        if !table.set_records(tag, records) {
            return Err(Error::Internal);
        }
        let swept = match sweep_now_ns {
            Some(now_ns) => table.sweep(now_ns, SWEEP_STEP),
            None => Vec::new(),
        };
        let effects = swept.into_iter().map(|tag| (tag, None)).collect();
        self.publish_with(Some((tag, state, &replicated)), effects, event)
    }

    /// The background sweep's step: sweeps up to `budget` slots by `now_ns` (the master's
    /// clock) and reports what it removed, as a write's commit does. Returns the slots used,
    /// the buckets removed, and whether the table still has slots to look at: it is
    /// migrating, or has not been looked at whole since its [`Table::sweep_passes`] were
    /// `passes_before`.
    ///
    /// # Errors
    /// [`Error::Internal`] if the server refuses.
    pub fn sweep(
        &mut self,
        now_ns: u64,
        budget: usize,
        passes_before: u64,
    ) -> Result<(usize, usize, bool), Error> {
        let Some(table) = self.table_mut() else {
            return Ok((0, 0, false));
        };
        let (swept, used) = table.sweep_counted(now_ns, budget);
        let more = table.is_migrating() || table.sweep_passes() == passes_before;
        let removed = swept.len();
        self.publish(
            swept.into_iter().map(|tag| (tag, None)).collect(),
            c"rl.hsweep",
        )?;
        Ok((used, removed, more && !self.table.is_null()))
    }

    /// No bucket of the table is full before this instant (ns), and no migration is under
    /// way that a visit should drive; `None` when a visit has work to do now or later.
    pub fn quiet_until_ns(&self) -> Option<u64> {
        let table = self.table()?;
        (!table.is_migrating()).then(|| table.earliest_full_ns())
    }

    /// Starts a visit of the background sweep: the table's sweep moves back to its first
    /// slot, and the sweep passes so far are returned for [`TableKey::sweep`], so the visit
    /// ends having looked at every slot, wherever the writes' own sweeping had got to.
    pub fn begin_visit(&mut self) -> u64 {
        self.table_mut().map_or(0, |table| {
            table.restart_sweep();
            table.sweep_passes()
        })
    }

    /// The handle of one bucket, named by `field`.
    pub fn field(self, field: &[u8]) -> TableField {
        let tag = table::tag(field);
        let staged = Staged::new(self.get(tag));
        TableField {
            key: self,
            tag,
            staged,
        }
    }
}

/// One bucket of a table, behind the same door as a per-key bucket.
pub struct TableField {
    key: TableKey,
    tag: Tag,
    staged: Staged,
}

impl Store for TableField {
    fn staged(&self) -> &Staged {
        &self.staged
    }

    fn staged_mut(&mut self) -> &mut Staged {
        &mut self.staged
    }

    fn apply(&mut self, change: Change, event: &CStr) -> Result<(), Error> {
        match change {
            Change::Keep => return Ok(()),
            Change::Set(state) => self.key.stage(self.tag, Some(state)),
            Change::Delete => {
                // A bucket with an open reservation is held until it lapses: full as of now.
                let held = match (self.key.table(), self.key.sweep_now_ns) {
                    (Some(table), Some(now_ns)) => table.has_open_records(self.tag, now_ns),
                    _ => false,
                };
                let state = if held {
                    Some(self.key.full_now()?)
                } else {
                    None
                };
                self.key.stage(self.tag, state);
            }
        }
        self.key.commit(event)
    }
}

/// `RL.HSETSTATE key tag full_at_ns full_at_frac`: one change's effect. `full_at_ns` 0
/// deletes (as `0 0`).
fn replicate_set_state(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    tag: Tag,
    state: Option<State>,
) -> Result<(), Error> {
    let (full_at_ns, full_at_frac) = state.map_or((0, 0), full_at_i64);
    let tag = tag.to_le_bytes();
    // SAFETY: read once, after load; "sbll" matches a RedisModuleString, a buffer and its
    // length, and two long longs.
    let status = unsafe {
        raw::RedisModule_Replicate.ok_or(Error::Internal)?(
            ctx,
            c"RL.HSETSTATE".as_ptr(),
            c"sbll".as_ptr(),
            name,
            tag.as_ptr().cast::<c_char>(),
            tag.len(),
            full_at_ns,
            full_at_frac,
        )
    };
    replicated(status)
}

/// The arguments of `RL.HRESVSTATE` after the key: `tag full_at_ns full_at_frac` and each
/// record's `id estimate expires_at_us`.
fn resv_state_args(tag: Tag, state: State, records: &[Reservation]) -> Vec<Vec<u8>> {
    let mut args = vec![tag.to_le_bytes().to_vec()];
    args.extend(datatype::resv_state_args(state, records));
    args
}

/// The effect of a reservation write on a table: `RL.HRESVSTATE` with the bucket's exact
/// state and every record it holds.
fn replicate_records(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    tag: Tag,
    state: State,
    records: &[Reservation],
) -> Result<(), Error> {
    replicate_with_args(
        ctx,
        c"RL.HRESVSTATE",
        name,
        &resv_state_args(tag, state, records),
    )
}

/// The table a value pointer holds.
///
/// # Safety
/// `value` must be null or a value of this type (a `Box<Table>` made here).
unsafe fn table_of<'a>(value: *const c_void) -> Option<&'a Table> {
    // SAFETY: guaranteed by the caller.
    unsafe { value.cast::<Table>().as_ref() }
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
    match table::decode(encver, next_unsigned, next_bytes) {
        Ok(table) => {
            // The key it is loaded under (a load, RESTORE, MIGRATE) joins the registry.
            // SAFETY: `rdb` is live; the name, if any, lives for this call.
            unsafe {
                if let (Some(name), Some(db)) = (
                    raw::RedisModule_GetKeyNameFromIO,
                    raw::RedisModule_GetDbIdFromIO,
                ) {
                    table_registry::note_place(db(rdb), name(rdb));
                }
            }
            Box::into_raw(Box::new(table)).cast()
        }
        Err(table::DecodeError::Io) => ptr::null_mut(),
        Err(error) => {
            let message = match error {
                table::DecodeError::Version => c"rl-htable: unknown encoding version",
                table::DecodeError::Count => c"rl-htable: bucket count out of range",
                table::DecodeError::TagLength => {
                    c"rl-htable: a tag or a block of buckets of the wrong length"
                }
                table::DecodeError::Order => c"rl-htable: buckets out of order or repeated",
                _ => c"rl-htable: stored state out of range",
            };
            log_warning(message);
            ptr::null_mut()
        }
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes a live value of this type.
    let Some(table) = (unsafe { table_of(value) }) else {
        return;
    };
    // SAFETY: `rdb` is the live IO handle Redis passed in.
    unsafe {
        let (Some(unsigned), Some(buffer)) = (
            raw::RedisModule_SaveUnsigned,
            raw::RedisModule_SaveStringBuffer,
        ) else {
            return;
        };
        table.encode(
            |count| unsigned(rdb, count),
            |block| buffer(rdb, block.as_ptr().cast::<c_char>(), block.len()),
        );
    }
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: Redis passes a live value of this type.
    let Some(table) = (unsafe { table_of(value) }) else {
        return;
    };
    let Some(emit) = (unsafe { raw::RedisModule_EmitAOF }) else {
        return;
    };
    // In the RDB's order, so a rewrite does not depend on history. The key's expiry follows
    // as a PEXPIREAT that the server writes itself.
    for (tag, state) in table.ordered_entries() {
        let (full_at_ns, full_at_frac) = full_at_i64(state);
        let tag = tag.to_le_bytes();
        // SAFETY: live handles from Redis; "sbll" matches the arguments.
        unsafe {
            emit(
                aof,
                c"RL.HSETSTATE".as_ptr(),
                c"sbll".as_ptr(),
                key,
                tag.as_ptr().cast::<c_char>(),
                tag.len(),
                full_at_ns,
                full_at_frac,
            );
        }
    }
    // Then each bucket's reservation records, with its state again (the same instant).
    for (tag, records) in table.reserved() {
        let Some(state) = table.get(tag) else {
            continue;
        };
        // SAFETY: the live handles of this callback.
        let emitted = unsafe {
            emit_with_args(
                aof,
                c"RL.HRESVSTATE",
                key,
                &resv_state_args(tag, state, records),
            )
        };
        if emitted.is_err() {
            return;
        }
    }
}

/// The server's record of the module value (type pointer and value word) plus the table.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a live value of this type.
    2 * size_of::<usize>() + unsafe { table_of(value) }.map_or(0, Table::mem_bytes)
}

/// One unit per allocation, so `UNLINK` and `FLUSHALL ASYNC` free a large table in the
/// background (the server does so above 64).
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    // SAFETY: Redis passes a live value of this type.
    unsafe { table_of(value) }.map_or(1, Table::allocations)
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: Redis passes a live value of this type and a live digest handle.
    unsafe {
        let (Some(table), Some(add_buffer), Some(add), Some(end)) = (
            table_of(value),
            raw::RedisModule_DigestAddStringBuffer,
            raw::RedisModule_DigestAddLongLong,
            raw::RedisModule_DigestEndSequence,
        ) else {
            return;
        };
        // In the RDB's order, which no history changes.
        for (tag, state) in table.ordered_entries() {
            let tag = tag.to_le_bytes();
            let (full_at_ns, full_at_frac) = full_at_i64(state);
            add_buffer(md, tag.as_ptr().cast::<c_char>(), tag.len());
            add(md, full_at_ns);
            add(md, full_at_frac);
            end(md);
        }
        // Then the reservation records, by bucket in the same order.
        for (tag, records) in table.reserved() {
            let tag = tag.to_le_bytes();
            add_buffer(md, tag.as_ptr().cast::<c_char>(), tag.len());
            for record in records {
                let id = record.id.as_bytes();
                let estimate = estimate_text(record.estimate);
                add_buffer(md, id.as_ptr().cast::<c_char>(), id.len());
                add_buffer(md, estimate.as_ptr().cast::<c_char>(), estimate.len());
                add(md, i64::try_from(record.expires_at_us).unwrap_or(i64::MAX));
            }
            end(md);
        }
    }
}

unsafe extern "C" fn free(value: *mut c_void) {
    if !value.is_null() {
        // SAFETY: made by `Box::into_raw` here; Redis frees a value once (perhaps on its
        // lazy-free thread, which the allocator allows).
        drop(unsafe { Box::from_raw(value.cast::<Table>()) });
    }
}

unsafe extern "C" fn copy(
    _from_key: *mut raw::RedisModuleString,
    _to_key: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes a live value of this type.
    match unsafe { table_of(value) } {
        Some(table) => Box::into_raw(Box::new(table.clone())).cast(),
        None => ptr::null_mut(),
    }
}

/// `COPY` where the server has `copy2` (and calls it instead of `copy`): the copy joins the
/// registry under its name and database.
unsafe extern "C" fn copy2(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes a live option context and a live value of this type.
    unsafe {
        if let (Some(name), Some(db)) = (
            raw::RedisModule_GetToKeyNameFromOptCtx,
            raw::RedisModule_GetToDbIdFromOptCtx,
        ) {
            table_registry::note_place(db(ctx), name(ctx));
        }
        copy(ptr::null_mut(), ptr::null_mut(), value)
    }
}
