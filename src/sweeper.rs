//! The background sweep: a module timer on the master that walks the keyspace and gives
//! back the memory of table buckets that are full again, even in a table no one writes to.
//!
//! Each tick (every [`TICK_MS`]) does a bounded amount of work, then re-arms the timer:
//! - at most [`TICK_SCANS`] `RedisModule_Scan` steps, over one database at a time with a
//!   cursor that survives between ticks (so FLUSHALL, RENAME, MOVE, SWAPDB, expiry and a
//!   promotion need no bookkeeping: the scan finds whatever tables exist now);
//! - at most [`TICK_KEYS`] tables visited;
//! - at most [`TICK_SLOTS`] slot reads, over all of them: each slot swept or migrated, and
//!   each slot a removal shifts back (see [`crate::table::Table::sweep_counted`]);
//! - at most [`TICK_CPU_NS`] of server time, checked every [`KEY_STEP_SLOTS`] slot reads
//!   (a few µs of work apart).
//!
//! A tick's time is the lesser of the main thread's CPU time and the monotonic clock over
//! it ([`TickClock`]): each clock alone overstates on a shared virtual machine. Wall time
//! counts the slices other processes ran in; the thread CPU clock, measured here on a
//! Firecracker guest, jumps by up to 4.5 ms between two reads 1 µs apart (steal time charged
//! late). The work itself is bounded by the slot reads whatever the clocks say.
//!
//! A pass over every database starts at most every [`PASS_GAP_NS`] (100 ms), so a small
//! keyspace costs a few scan steps per 100 ms when nothing needs reclaiming.
//!
//! Tables a scan step finds are queued and swept before the next scan step, so none is
//! skipped when a tick runs out; the table a tick stops in stays first in the queue and is
//! resumed next tick until it has been looked at whole, so one big table is not left for a
//! full pass over a large keyspace.
//!
//! Reclaiming is the master's decision: a tick does nothing on a replica or while loading,
//! and every removal is committed through [`TableKey`] exactly as a write's sweep is
//! (`RL.HSETSTATE key tag 0 0`, or `DEL` when the table empties). A timer's propagation
//! reaches replicas and the AOF wrapped in MULTI/EXEC.
//!
//! Depends on `table_type` and `clock`; nothing depends on it but registration.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Mutex;

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::table_type::{self, TableKey};
use crate::{clock, stats};

/// The timer's period: the "sweep interval" in the docs.
pub const TICK_MS: i64 = 10;
/// Slot reads one tick makes at most, over every table it visits (about 180 µs of a release
/// build on the 2-core machine the docs measure on).
pub const TICK_SLOTS: usize = 8192;
/// Tables one tick visits at most.
pub const TICK_KEYS: usize = 16;
/// `RedisModule_Scan` steps one tick takes at most (each is one bucket of the keyspace).
pub const TICK_SCANS: usize = 64;
/// Server time after which a tick stops, whatever budget is left (checked between steps of
/// [`KEY_STEP_SLOTS`] slot reads, so a tick ends within about one step of it).
pub const TICK_CPU_NS: u64 = 400_000;
/// The least time between the starts of two passes over the keyspace, 100 ms: with few
/// tables, what a tick costs when there is nothing to reclaim.
pub const PASS_GAP_NS: u64 = 100_000_000;
/// Slot reads between checks of the tick's time: a few µs of work. The check reads the
/// monotonic clock (a vDSO read, about 25 ns here) and only past the budget the thread CPU
/// clock, a system call: 1.2-1.4 µs a read on the Firecracker guest the docs measure on.
pub const KEY_STEP_SLOTS: usize = 256;

/// Where the walk is, kept between ticks (only the main thread touches it).
struct Walk {
    db: c_int,
    cursor: *mut raw::RedisModuleScanCursor,
    /// Tables found and not yet looked at whole, oldest first: db, name (owned), and sweep
    /// passes when first swept. At most one scan step's keys beyond the one in progress,
    /// since the walk scans only when this is empty.
    queue: VecDeque<Queued>,
    /// When the last pass over every database ended (ns, the master's clock): the next
    /// starts [`PASS_GAP_NS`] later, so an idle keyspace is not swept over and over.
    pass_ended_ns: u64,
}

struct Queued {
    db: c_int,
    name: *mut RedisModuleString,
    passes_before: Option<u64>,
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
            queue: VecDeque::new(),
            pass_ended_ns: 0,
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
                let clock = TickClock::start();
                // SAFETY: as above.
                let reads = unsafe { walk.step(ctx, &clock) };
                stats::SWEEP_TICKS.bump();
                let (cpu_ns, wall_ns) = clock.both_ns();
                stats::SWEEP_TICK_MAX_US.raise(cpu_ns.min(wall_ns) / 1000);
                stats::SWEEP_TICK_MAX_CPU_US.raise(cpu_ns / 1000);
                stats::SWEEP_TICK_MAX_WALL_US.raise(wall_ns / 1000);
                stats::SWEEP_TICK_MAX_SLOTS.raise(reads as u64);
            }
        }
    });
    // SAFETY: as above.
    unsafe { arm(ctx) };
}

/// A tick's server time: the lesser of the main thread's CPU time and the monotonic clock
/// since the tick began. Both are at least the time the tick's work took; each alone can
/// overstate it on a shared machine (see the file's docs), and both rarely at once.
struct TickClock {
    cpu_ns: u64,
    wall_ns: u64,
}

impl TickClock {
    fn start() -> Self {
        TickClock {
            cpu_ns: clock_ns(libc::CLOCK_THREAD_CPUTIME_ID),
            wall_ns: clock_ns(libc::CLOCK_MONOTONIC),
        }
    }

    fn elapsed_ns(&self) -> u64 {
        let (cpu_ns, wall_ns) = self.both_ns();
        cpu_ns.min(wall_ns)
    }

    /// The main thread's CPU time and the monotonic clock's time since the tick began.
    fn both_ns(&self) -> (u64, u64) {
        let wall_ns = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(self.wall_ns);
        let cpu_ns = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(self.cpu_ns);
        (cpu_ns, wall_ns)
    }

    /// Whether the tick has used up [`TICK_CPU_NS`]. The wall clock first: it is a vDSO
    /// read, and while it is under the budget the CPU clock's system call is not needed.
    fn out_of_time(&self) -> bool {
        clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(self.wall_ns) > TICK_CPU_NS
            && self.elapsed_ns() > TICK_CPU_NS
    }
}

/// `clock` in ns; 0 if unreadable.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
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
    /// One tick's work: sweep queued tables, scanning for more when the queue is empty,
    /// until the tick's slot reads, tables, scan steps or time run out. Returns the slot
    /// reads made.
    ///
    /// # Safety
    /// `ctx` must be the timer's live context.
    unsafe fn step(&mut self, ctx: *mut RedisModuleCtx, clock: &TickClock) -> usize {
        // SAFETY: read once, after load.
        let (Some(select), Some(scan), Some(restart)) = (unsafe {
            (
                raw::RedisModule_SelectDb,
                raw::RedisModule_Scan,
                raw::RedisModule_ScanCursorRestart,
            )
        }) else {
            return 0;
        };
        let now_ns = clock::now_us().saturating_mul(1000);
        // Slot reads so far, which may pass TICK_SLOTS by the rest of one cluster.
        let mut reads = 0;
        let mut keys_left = TICK_KEYS;
        let mut scans_left = TICK_SCANS;
        let out_of_time = || clock.out_of_time();
        while reads < TICK_SLOTS && keys_left > 0 && !out_of_time() {
            if let Some(mut next) = self.queue.pop_front() {
                keys_left -= 1;
                // SAFETY: the timer's context; `next.name` is owned by the walk.
                let more = unsafe {
                    select(ctx, next.db) == raw::REDISMODULE_OK as c_int
                        && Self::sweep_key(ctx, &mut next, now_ns, &mut reads, &out_of_time)
                };
                if more {
                    // Resumed first next tick: one big table is not left for a whole pass.
                    self.queue.push_front(next);
                    break;
                }
                // SAFETY: owned, done with.
                unsafe { free_name(ctx, next.name) };
                continue;
            }
            let resting = self.db == 0
                && self.pass_ended_ns != 0
                && now_ns.saturating_sub(self.pass_ended_ns) < PASS_GAP_NS;
            if scans_left == 0 || resting {
                break;
            }
            scans_left -= 1;
            // SAFETY: the timer's context; the walk owns the cursor.
            unsafe {
                if select(ctx, self.db) != raw::REDISMODULE_OK as c_int {
                    // Past the last database: the pass is over; the next starts at 0.
                    self.db = 0;
                    self.pass_ended_ns = now_ns.max(1);
                    restart(self.cursor);
                    continue;
                }
            }
            let mut found = Found {
                ctx,
                names: Vec::new(),
            };
            // SAFETY: `collect` only touches `found`, which outlives the call.
            let more = unsafe {
                scan(
                    ctx,
                    self.cursor,
                    Some(collect),
                    ptr::from_mut(&mut found).cast(),
                )
            };
            let db = self.db;
            self.queue
                .extend(found.names.into_iter().map(|name| Queued {
                    db,
                    name,
                    passes_before: None,
                }));
            if more == 0 {
                // This database is done: the next one, from its start.
                self.db = self.db.saturating_add(1);
                // SAFETY: the walk owns the cursor.
                unsafe { restart(self.cursor) };
            }
        }
        reads
    }

    /// Sweeps one table with what is left of the tick's [`TICK_SLOTS`] (adding to `reads`),
    /// in steps of [`KEY_STEP_SLOTS`] while there is time. Returns whether it has more to
    /// look at (see [`TableKey::sweep`]).
    ///
    /// # Safety
    /// `ctx` is live with the table's database selected.
    unsafe fn sweep_key(
        ctx: *mut RedisModuleCtx,
        table: &mut Queued,
        now_ns: u64,
        reads: &mut usize,
        out_of_time: &dyn Fn() -> bool,
    ) -> bool {
        // SAFETY: forwarded (caller). A key of another type now (RENAME, SET) is a WrongType
        // error, left alone.
        let Ok(mut key) = (unsafe { TableKey::open(ctx, table.name, None) }) else {
            return false;
        };
        let passes_before = *table
            .passes_before
            .get_or_insert_with(|| key.sweep_passes());
        loop {
            let budget = TICK_SLOTS.saturating_sub(*reads).min(KEY_STEP_SLOTS);
            let Ok((used, removed, more)) = key.sweep(now_ns, budget, passes_before) else {
                return false;
            };
            stats::SWEPT.add(removed as u64);
            *reads = reads.saturating_add(used.max(1));
            if !more {
                return false;
            }
            if *reads >= TICK_SLOTS || out_of_time() {
                return true;
            }
        }
    }
}
