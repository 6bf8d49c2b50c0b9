//! The background sweep: a module timer on the master that walks the keyspace and gives
//! back the memory of table buckets that are full again, even in a table no one writes to.
//!
//! Each tick (every [`TICK_MS`]) does a bounded amount of work, then re-arms the timer:
//! - at most [`TICK_SCANS`] `RedisModule_Scan` steps, over one database at a time with a
//!   cursor that survives between ticks (so FLUSHALL, RENAME, MOVE, SWAPDB, expiry and a
//!   promotion need no bookkeeping: the scan finds whatever tables exist now);
//! - at most [`TICK_KEYS`] tables visited;
//! - at most [`TICK_SLOTS`] slots swept (or migrated), over all of them.
//!
//! A table whose sweep used its whole share is kept as the *pending* key and resumed on the
//! next tick until it has been looked at whole, so one big table is not left for a full
//! pass over a large keyspace.
//!
//! Reclaiming is the master's decision: a tick does nothing on a replica or while loading,
//! and every removal is committed through [`TableKey`] exactly as a write's sweep is
//! (`RL.HSETSTATE key tag 0 0`, or `DEL` when the table empties). A timer's propagation
//! reaches replicas and the AOF wrapped in MULTI/EXEC.
//!
//! Depends on `table_type` and `clock`; nothing depends on it but registration.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Mutex;

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::table_type::{self, TableKey};
use crate::{clock, stats};

/// The timer's period: the "sweep interval" in the docs.
pub const TICK_MS: i64 = 10;
/// Slots one tick sweeps at most, over every table it visits.
pub const TICK_SLOTS: usize = 2048;
/// Tables one tick visits at most.
pub const TICK_KEYS: usize = 16;
/// `RedisModule_Scan` steps one tick takes at most (each is one bucket of the keyspace).
pub const TICK_SCANS: usize = 64;

/// Where the walk is, kept between ticks (only the main thread touches it).
struct Walk {
    db: c_int,
    cursor: *mut raw::RedisModuleScanCursor,
    /// A table not yet looked at whole: its db, name (owned) and sweep passes when picked.
    pending: Option<(c_int, *mut RedisModuleString, u64)>,
}

// SAFETY: the pointers are only used from timer callbacks, which run on the main thread.
unsafe impl Send for Walk {}

static WALK: Mutex<Option<Walk>> = Mutex::new(None);

/// Arms the first tick.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn start(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: read once, after load.
    let Some(create) = (unsafe { raw::RedisModule_ScanCursorCreate }) else {
        return false;
    };
    // SAFETY: no preconditions; destroyed never (it lives as long as the module).
    let cursor = unsafe { create() };
    if cursor.is_null() {
        return false;
    }
    if let Ok(mut walk) = WALK.lock() {
        *walk = Some(Walk {
            db: 0,
            cursor,
            pending: None,
        });
    }
    // SAFETY: load-time context (caller).
    unsafe { arm(ctx) }
}

/// # Safety
/// `ctx` must be a live context.
unsafe fn arm(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: read once, after load; `tick` has the timer callback's signature.
    unsafe {
        match raw::RedisModule_CreateTimer {
            Some(create) => {
                create(ctx, TICK_MS, Some(tick), ptr::null_mut());
                true
            }
            None => false,
        }
    }
}

/// Whether this server decides reclaim: a master, not loading.
///
/// # Safety
/// `ctx` must be a live context.
unsafe fn is_deciding(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: read once, after load; the context is live (caller).
    let Some(flags) = (unsafe { raw::RedisModule_GetContextFlags }) else {
        return false;
    };
    // SAFETY: as above.
    let flags = unsafe { flags(ctx) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0
        && flags & raw::REDISMODULE_CTX_FLAGS_LOADING == 0
}

unsafe extern "C" fn tick(ctx: *mut RedisModuleCtx, _data: *mut c_void) {
    // A panic must not cross into the server; the next tick is armed whatever happens.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the timer's context, live for this call.
        if unsafe { is_deciding(ctx) } {
            // A panic in an earlier tick poisons the lock; the walk is still sound (each
            // step leaves it usable; at worst a pending name leaks), so go on rather than stop sweeping for good.
            let mut guard = WALK
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(walk) = guard.as_mut() {
                let started_ns = thread_cpu_ns();
                // SAFETY: as above.
                unsafe { walk.step(ctx) };
                let took_us = thread_cpu_ns().saturating_sub(started_ns) / 1000;
                stats::SWEEP_TICKS.bump();
                stats::SWEEP_TICK_MAX_US.raise(took_us);
            }
        }
    });
    // SAFETY: as above.
    unsafe { arm(ctx) };
}

/// The main thread's CPU time in ns: what a tick costs the server, which wall time on a
/// busy machine overstates by whatever the scheduler gave other processes. 0 if unreadable.
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return 0;
    }
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}

/// Names of the tables one scan step found, owned until swept.
struct Found {
    ctx: *mut RedisModuleCtx,
    names: Vec<*mut RedisModuleString>,
}

unsafe extern "C" fn collect(
    _ctx: *mut RedisModuleCtx,
    keyname: *mut RedisModuleString,
    key: *mut RedisModuleKey,
    privdata: *mut c_void,
) {
    // SAFETY: `privdata` is the `Found` that `step` passed to this scan; `key` is null or
    // the open (read-only) handle of `keyname`, valid for this callback.
    unsafe {
        let found = &mut *privdata.cast::<Found>();
        let (Some(key_type), Some(module_type), Some(retain)) = (
            raw::RedisModule_KeyType,
            raw::RedisModule_ModuleTypeGetType,
            raw::RedisModule_CreateStringFromString,
        ) else {
            return;
        };
        if key.is_null()
            || key_type(key) != raw::REDISMODULE_KEYTYPE_MODULE as c_int
            || module_type(key) != table_type::registered_type()
        {
            return;
        }
        let name = retain(found.ctx, keyname);
        if !name.is_null() {
            found.names.push(name);
        }
    }
}

/// # Safety
/// `ctx` must be a live context; `name` an owned string, freed here.
unsafe fn free_name(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) {
    // SAFETY: forwarded (caller); each name is freed exactly once.
    unsafe {
        if let Some(free) = raw::RedisModule_FreeString {
            free(ctx, name);
        }
    }
}

impl Walk {
    /// One tick's work.
    ///
    /// # Safety
    /// `ctx` must be the timer's live context.
    unsafe fn step(&mut self, ctx: *mut RedisModuleCtx) {
        // SAFETY: read once, after load.
        let (Some(select), Some(scan), Some(restart)) = (unsafe {
            (
                raw::RedisModule_SelectDb,
                raw::RedisModule_Scan,
                raw::RedisModule_ScanCursorRestart,
            )
        }) else {
            return;
        };
        let now_ns = clock::now_us().saturating_mul(1000);
        let mut slots_left = TICK_SLOTS;
        let mut keys_left = TICK_KEYS;
        // The pending table first: it needs the time more than the scan does.
        if let Some((db, name, passes)) = self.pending.take() {
            // SAFETY: the timer's context; `name` is owned by the walk.
            unsafe {
                if select(ctx, db) == raw::REDISMODULE_OK as c_int {
                    keys_left -= 1;
                    if Self::sweep_key(ctx, name, now_ns, &mut slots_left, Some(passes)).is_some() {
                        self.pending = Some((db, name, passes));
                        return;
                    }
                }
                free_name(ctx, name);
            }
        }
        // SAFETY: the timer's context.
        if unsafe { select(ctx, self.db) } != raw::REDISMODULE_OK as c_int {
            self.db = 0;
            // SAFETY: as above; the walk owns the cursor.
            unsafe {
                restart(self.cursor);
                if select(ctx, 0) != raw::REDISMODULE_OK as c_int {
                    return;
                }
            }
        }
        let mut found = Found {
            ctx,
            names: Vec::new(),
        };
        for _ in 0..TICK_SCANS {
            if slots_left == 0 || keys_left == 0 {
                break;
            }
            // SAFETY: `collect` only touches `found`, which outlives the call.
            let more = unsafe {
                scan(
                    ctx,
                    self.cursor,
                    Some(collect),
                    ptr::from_mut(&mut found).cast(),
                )
            };
            for name in found.names.drain(..) {
                if keys_left == 0 || slots_left == 0 || self.pending.is_some() {
                    // SAFETY: owned, not kept.
                    unsafe { free_name(ctx, name) };
                    continue;
                }
                keys_left -= 1;
                // SAFETY: the timer's context with `self.db` selected; `name` is owned.
                unsafe {
                    if let Some(passes) = Self::sweep_key(ctx, name, now_ns, &mut slots_left, None)
                    {
                        self.pending = Some((self.db, name, passes));
                    } else {
                        free_name(ctx, name);
                    }
                }
            }
            if more == 0 {
                // This database is done: the next one, from its start.
                self.db = self.db.saturating_add(1);
                // SAFETY: the walk owns the cursor; the next select may fail (past the last
                // database), which the next tick handles by starting over at 0.
                unsafe {
                    restart(self.cursor);
                    if select(ctx, self.db) != raw::REDISMODULE_OK as c_int {
                        self.db = 0;
                        break;
                    }
                }
            }
        }
    }

    /// Sweeps one table with what is left of the tick's slots. Returns its sweep passes
    /// when picked up if it has more to look at (see [`TableKey::sweep`]).
    ///
    /// # Safety
    /// `ctx` is live with `name`'s database selected.
    unsafe fn sweep_key(
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        now_ns: u64,
        slots_left: &mut usize,
        passes_before: Option<u64>,
    ) -> Option<u64> {
        // SAFETY: forwarded (caller). A key of another type now (RENAME, SET) is a WrongType
        // error, left alone.
        let mut key = unsafe { TableKey::open(ctx, name, None) }.ok()?;
        let passes_before = passes_before.unwrap_or_else(|| key.sweep_passes());
        match key.sweep(now_ns, *slots_left, passes_before) {
            Ok((used, removed, more)) => {
                stats::SWEPT.add(removed as u64);
                *slots_left = slots_left.saturating_sub(used);
                if more {
                    // Resumed next tick, before anything else.
                    *slots_left = 0;
                    Some(passes_before)
                } else {
                    None
                }
            }
            Err(_) => None,
        }
    }
}
