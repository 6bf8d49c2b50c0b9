//! The background sweep: a module timer on the master that visits every table the registry
//! ([`crate::table_registry`]) knows and gives back the memory of buckets that are full
//! again, even in a table no one writes to. It never scans the keyspace, so its work does
//! not grow with keys that are not tables.
//!
//! **A guest that writes only when the server accepts writes.** Before any work a tick asks
//! the server ([`writes_refused`]) and does nothing, writes nothing and propagates nothing
//! while it refuses writes from clients:
//! - on a replica, or while loading (`RedisModule_GetContextFlags`);
//! - while writes are paused: `CLIENT PAUSE WRITE` or `ALL`, `FAILOVER`, a `SHUTDOWN`
//!   waiting for replicas, `CLUSTER FAILOVER` (`RedisModule_AvoidReplicaTraffic`, the
//!   server's own answer for modules with background writes; propagating then trips the
//!   server's assertion that nothing is propagated while clients are paused, and aborts it);
//! - while `min-replicas-to-write` is not met (`INFO replication`'s
//!   `min_slaves_good_slaves` against the setting, read with `CONFIG GET` again after any
//!   config event).
//!
//! Over `maxmemory` it sweeps on, as the server's own active expiry does: a removal only
//! frees memory, and tables have no key expiry to fall back on (see `table_type`).
//!
//! After a refusal the next tick comes [`REST_MS`] later and asks again, so reclaim
//! resumes on its own.
//!
//! **Bounded ticks.** Each tick (every [`TICK_MS`] while a pass is under way) does at most:
//! - [`TICK_SLOTS`] slot reads over all the tables it visits (each slot swept or migrated,
//!   each slot a removal shifts back, see [`crate::table::Table::sweep_counted`], and
//!   [`VISIT_SLOTS`] for opening each table);
//! - [`TICK_CPU_NS`] of server time, checked every [`KEY_STEP_SLOTS`] slot reads.
//!
//! A tick's time is the lesser of the main thread's CPU time and the monotonic clock over it
//! ([`TickClock`]): each clock alone overstates on a shared virtual machine. Wall time counts
//! the slices other processes ran in; the thread CPU clock, measured here on a Firecracker
//! guest, jumps by up to 4.5 ms between two reads 1 µs apart (steal time charged late). The
//! work itself is bounded by the slot reads whatever the clocks say.
//!
//! **Passes.** A pass visits every registered table once, in the registry's order; a visit
//! starts at the table's first slot and ends when it has looked at every slot, resumed first
//! next tick when a tick runs out. A name that is no longer a table is dropped on its visit.
//! The next pass starts [`PASS_GAP_NS`] after one ends, and the timer sleeps until then, so
//! a server whose tables need nothing costs a visit of their slots every 100 ms, and one
//! with no table a tick every [`REST_MS`].
//!
//! Every removal is committed through [`TableKey`] exactly as a write's sweep is
//! (`RL.HSETSTATE key tag 0 0`, or `DEL` when the table empties). A timer's propagation
//! reaches replicas and the AOF wrapped in MULTI/EXEC.
//!
//! Depends on `table_type`, `table_registry`, `propagation` and `server`; nothing depends on
//! it but registration and `INFO`.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use redis_module::raw::{self, RedisModuleCtx};

use crate::error::Error;
use crate::table_type::TableKey;
use crate::{clock, eviction, propagation, server, stats, table_registry};

/// The timer's period while a pass is under way: the "sweep interval" in the docs.
pub const TICK_MS: i64 = 10;
/// The timer's period while the server refuses writes, or no table is registered.
pub const REST_MS: i64 = 100;
/// Slot reads one tick makes at most, over every table it visits (about 180 µs of a release
/// build on the 2-core machine the docs measure on).
pub const TICK_SLOTS: usize = 8192;
/// What opening one table for a visit counts against [`TICK_SLOTS`]: a key lookup costs
/// about as much as a few slot reads, so a tick visits at most 1,024 small tables.
pub const VISIT_SLOTS: usize = 8;
/// Server time after which a tick stops, whatever budget is left (checked between steps of
/// [`KEY_STEP_SLOTS`] slot reads, so a tick ends within about one step of it).
pub const TICK_CPU_NS: u64 = 400_000;
/// The least time between the end of one pass and the start of the next, 100 ms: with
/// nothing to reclaim, what the sweep costs.
pub const PASS_GAP_NS: u64 = 100_000_000;
/// The longest a pass goes without looking at a table whose earliest bucket is not due. A
/// write that adds a bucket filling sooner wakes the table at once ([`TableKey`] tells the
/// registry), so this only bounds how long a mistake could last.
pub const RECHECK_NS: u64 = 10_000_000_000;
/// Slot reads between checks of the tick's time: a few µs of work. The check reads the
/// monotonic clock (a vDSO read, about 25 ns here) and only past the budget the thread CPU
/// clock, a system call: 1.2-1.4 µs a read on the Firecracker guest the docs measure on.
pub const KEY_STEP_SLOTS: usize = 256;

/// Where the walk is, kept between ticks (only the main thread touches it).
#[derive(Default)]
struct Walk {
    /// The next position of the registry's order to visit.
    at: usize,
    /// The table at `at` when a tick ran out inside it: its place, and the sweep passes it
    /// had when the visit began.
    visit: Option<(table_registry::Place, u64)>,
    /// When the next pass may start (ns, the master's clock).
    rest_until_ns: u64,
}

static WALK: Mutex<Option<Walk>> = Mutex::new(None);

/// Why the last tick that did nothing held back, for `INFO rl`.
static HELD_BECAUSE: AtomicU64 = AtomicU64::new(0);
const HELD_REASONS: [&str; 6] = [
    "none",
    "replica",
    "loading",
    "paused",
    "min-replicas",
    "unknown",
];

/// What the last tick held back for: "none" when it swept.
pub fn held_because() -> &'static str {
    let i = usize::try_from(HELD_BECAUSE.load(Ordering::Relaxed)).unwrap_or(0);
    HELD_REASONS.get(i).copied().unwrap_or("unknown")
}

/// Arms the first tick.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn start(ctx: *mut RedisModuleCtx) -> bool {
    if let Ok(mut walk) = WALK.lock() {
        *walk = Some(Walk::default());
    }
    // SAFETY: load-time context (caller).
    unsafe {
        eviction::check(ctx);
        arm(ctx, REST_MS)
    }
}

/// # Safety
/// `ctx` must be a live context.
unsafe fn arm(ctx: *mut RedisModuleCtx, period_ms: i64) -> bool {
    // SAFETY: read once, after load; `tick` has the timer callback's signature.
    unsafe {
        match raw::RedisModule_CreateTimer {
            Some(create) => {
                create(ctx, period_ms.max(1), Some(tick), ptr::null_mut());
                true
            }
            None => false,
        }
    }
}

/// Why the server refuses writes from clients now, as an index into [`HELD_REASONS`];
/// `None` when it accepts them. Anything it cannot find out counts as a refusal.
///
/// # Safety
/// `ctx` must be a live context.
unsafe fn writes_refused(ctx: *mut RedisModuleCtx) -> Option<u64> {
    // SAFETY: read once, after load; the context is live (caller).
    let (Some(flags), Some(avoid_replica_traffic)) = (unsafe {
        (
            raw::RedisModule_GetContextFlags,
            raw::RedisModule_AvoidReplicaTraffic,
        )
    }) else {
        return Some(5);
    };
    // SAFETY: as above.
    let flags = unsafe { flags(ctx) } as u32;
    if flags & raw::REDISMODULE_CTX_FLAGS_MASTER == 0 {
        return Some(1);
    }
    if flags & raw::REDISMODULE_CTX_FLAGS_LOADING != 0 {
        return Some(2);
    }
    // SAFETY: no preconditions; it reads (and expires) the server's pause state.
    if unsafe { avoid_replica_traffic() } != 0 {
        return Some(3);
    }
    // SAFETY: as above.
    match unsafe { min_replicas_met(ctx) } {
        Some(true) => None,
        Some(false) => Some(4),
        None => Some(5),
    }
}

/// `min-replicas-to-write` as last read, and the [`propagation::epoch`] it was read at.
static MIN_REPLICAS: Mutex<Option<(Option<u64>, u64)>> = Mutex::new(None);

/// Whether `min-replicas-to-write` is met (always, when it is 0); `None` if unreadable.
///
/// # Safety
/// `ctx` must be a live context.
unsafe fn min_replicas_met(ctx: *mut RedisModuleCtx) -> Option<bool> {
    let epoch = propagation::epoch();
    let mut cached = MIN_REPLICAS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let wanted = match *cached {
        Some((seen, wanted)) if seen.is_some() && seen == epoch => wanted,
        _ => {
            // SAFETY: forwarded (caller).
            let wanted = unsafe { eviction::config_number(ctx, c"min-replicas-to-write") }?;
            *cached = Some((epoch, wanted));
            wanted
        }
    };
    if wanted == 0 {
        return Some(true);
    }
    // SAFETY: forwarded (caller); the info data lives for the closure.
    let good = unsafe {
        server::with_info(ctx, c"replication", |info| {
            let field = raw::RedisModule_ServerInfoGetFieldUnsigned?;
            let mut err: c_int = 0;
            let good = field(info, c"min_slaves_good_slaves".as_ptr(), &mut err);
            // The field is shown only while the server checks (min-replicas-max-lag > 0).
            Some((err == 0).then_some(good))
        })
    }??;
    Some(good.is_none_or(|good| good >= wanted))
}

unsafe extern "C" fn tick(ctx: *mut RedisModuleCtx, _data: *mut c_void) {
    // A panic must not cross into the server; the next tick is armed whatever happens.
    let next_ms = std::panic::catch_unwind(|| {
        // SAFETY: the timer's context, live for this call.
        unsafe { eviction::check(ctx) };
        // SAFETY: as above.
        if let Some(reason) = unsafe { writes_refused(ctx) } {
            HELD_BECAUSE.store(reason, Ordering::Relaxed);
            stats::SWEEP_HELD.bump();
            return REST_MS;
        }
        HELD_BECAUSE.store(0, Ordering::Relaxed);
        // A panic in an earlier tick poisons the lock; the walk is still sound (each step
        // leaves it usable), so go on rather than stop sweeping for good.
        let mut guard = WALK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let walk = guard.get_or_insert_with(Walk::default);
        let now_ns = clock::now_us().saturating_mul(1000);
        if now_ns < walk.rest_until_ns {
            let rest_ms = (walk.rest_until_ns - now_ns).div_ceil(1_000_000);
            return i64::try_from(rest_ms).unwrap_or(REST_MS).min(REST_MS);
        }
        let clock = TickClock::start();
        // SAFETY: as above.
        let (reads, pass_ended) = unsafe { walk.step(ctx, now_ns, &clock) };
        stats::SWEEP_TICKS.bump();
        let (cpu_ns, wall_ns) = clock.both_ns();
        stats::SWEEP_TICK_MAX_US.raise(cpu_ns.min(wall_ns) / 1000);
        stats::SWEEP_TICK_MAX_CPU_US.raise(cpu_ns / 1000);
        stats::SWEEP_TICK_MAX_WALL_US.raise(wall_ns / 1000);
        stats::SWEEP_TICK_MAX_SLOTS.raise(reads as u64);
        if pass_ended {
            stats::SWEEP_PASSES.bump();
            walk.rest_until_ns = now_ns.saturating_add(PASS_GAP_NS);
            REST_MS
        } else {
            TICK_MS
        }
    })
    .unwrap_or(REST_MS);
    // SAFETY: as above.
    unsafe { arm(ctx, next_ms) };
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

/// What a visit found.
enum Visited {
    /// Looked at whole (or nothing in it is full before the instant, ns): move on.
    Done(Option<u64>),
    /// The tick ran out inside it: resume here next tick, with the visit's passes.
    More(u64),
    /// Not a table (any more): drop its name.
    Gone,
}

impl Walk {
    /// One tick's work: visit tables in the registry's order until the tick's slot reads or
    /// time run out, or the pass ends. Returns the slot reads made and whether the pass
    /// ended.
    ///
    /// # Safety
    /// `ctx` must be the timer's live context.
    unsafe fn step(
        &mut self,
        ctx: *mut RedisModuleCtx,
        now_ns: u64,
        clock: &TickClock,
    ) -> (usize, bool) {
        // Slot reads so far, which may pass TICK_SLOTS by the rest of one cluster.
        let mut reads = 0;
        while reads < TICK_SLOTS && !clock.out_of_time() {
            // Copied out, so the registry is not locked while the table is written (a
            // write's keyspace events reach the registry).
            let place = {
                let registry = table_registry::lock();
                let Some(registry) = registry.as_ref() else {
                    return (reads, true);
                };
                // Places whose tables have nothing due cost no lookup, and one slot read
                // each against the budget.
                while self.visit.is_none()
                    && reads < TICK_SLOTS
                    && now_ns < registry.skip_until_ns(self.at)
                {
                    self.at += 1;
                    reads += 1;
                }
                if reads >= TICK_SLOTS {
                    break;
                }
                let Some((db, name)) = registry.get(self.at) else {
                    self.at = 0;
                    self.visit = None;
                    return (reads, true);
                };
                (db, Box::<[u8]>::from(name))
            };
            let resumed = self
                .visit
                .take()
                .and_then(|(at, passes)| (at == place).then_some(passes));
            reads = reads.saturating_add(VISIT_SLOTS);
            // SAFETY: the timer's context.
            match unsafe { Self::visit(ctx, &place, resumed, now_ns, &mut reads, clock) } {
                Visited::Done(quiet_until_ns) => {
                    let recheck_ns = now_ns.saturating_add(RECHECK_NS);
                    let until_ns = quiet_until_ns.map_or(0, |q| q.min(recheck_ns));
                    if let Some(registry) = table_registry::lock().as_mut() {
                        if registry.get(self.at) == Some((place.0, &place.1[..])) {
                            registry.skip_until(self.at, until_ns);
                        }
                    }
                    self.at += 1;
                }
                Visited::More(passes) => {
                    self.visit = Some((place, passes));
                    break;
                }
                Visited::Gone => {
                    let mut registry = table_registry::lock();
                    if let Some(registry) = registry.as_mut() {
                        // Only if nothing moved it meanwhile; else it is visited again.
                        if registry.get(self.at) == Some((place.0, &place.1[..])) {
                            registry.remove_at(self.at);
                        }
                    }
                }
            }
        }
        (reads, false)
    }

    /// Visits one table with what is left of the tick's [`TICK_SLOTS`] (adding to `reads`),
    /// in steps of [`KEY_STEP_SLOTS`] while there is time. `resumed` holds the visit's
    /// passes when a tick ran out inside it.
    ///
    /// # Safety
    /// `ctx` must be the timer's live context.
    unsafe fn visit(
        ctx: *mut RedisModuleCtx,
        (db, name): &table_registry::Place,
        resumed: Option<u64>,
        now_ns: u64,
        reads: &mut usize,
        clock: &TickClock,
    ) -> Visited {
        // SAFETY: read once, after load.
        let (Some(select), Some(create), Some(free)) = (unsafe {
            (
                raw::RedisModule_SelectDb,
                raw::RedisModule_CreateString,
                raw::RedisModule_FreeString,
            )
        }) else {
            return Visited::Done(None);
        };
        // SAFETY: the timer's context; a database the server no longer has is refused.
        if unsafe { select(ctx, *db) } != raw::REDISMODULE_OK as c_int {
            return Visited::Gone;
        }
        // SAFETY: the bytes outlive the call, which copies them; freed below.
        let key_name = unsafe { create(ctx, name.as_ptr().cast(), name.len()) };
        if key_name.is_null() {
            return Visited::Done(None);
        }
        // SAFETY: the timer's context and a live name.
        let visited = unsafe { Self::sweep_key(ctx, key_name, resumed, now_ns, reads, clock) };
        // SAFETY: made above, freed once, after the key handle closed.
        unsafe { free(ctx, key_name) };
        visited
    }

    /// # Safety
    /// `ctx` is live with the table's database selected; `name` is live.
    unsafe fn sweep_key(
        ctx: *mut RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        resumed: Option<u64>,
        now_ns: u64,
        reads: &mut usize,
        clock: &TickClock,
    ) -> Visited {
        // SAFETY: forwarded (caller).
        let mut key = match unsafe { TableKey::open(ctx, name, None) } {
            Ok(key) if !key.is_empty() => key,
            // Missing, or a key of another type now (RENAME, SET): its name goes.
            Ok(_) | Err(Error::WrongType) => return Visited::Gone,
            Err(_) => return Visited::Done(None),
        };
        if resumed.is_none() {
            if let Some(quiet_until_ns) = key.quiet_until_ns().filter(|&q| q > now_ns) {
                // Nothing in it is full yet: as good as a visit.
                return Visited::Done(Some(quiet_until_ns));
            }
        }
        let passes_before = resumed.unwrap_or_else(|| key.begin_visit());
        loop {
            let budget = TICK_SLOTS.saturating_sub(*reads).min(KEY_STEP_SLOTS);
            let Ok((used, removed, more)) = key.sweep(now_ns, budget, passes_before) else {
                return Visited::Done(None);
            };
            stats::SWEPT.add(removed as u64);
            *reads = reads.saturating_add(used.max(1));
            if key.is_empty() {
                return Visited::Gone;
            }
            if !more {
                return Visited::Done(key.quiet_until_ns());
            }
            if *reads >= TICK_SLOTS || clock.out_of_time() {
                return Visited::More(passes_before);
            }
        }
    }
}
