//! Whether anything listens to what a command propagates: the AOF, replicas, the replication
//! backlog, or save points counting changes.
//!
//! `RedisModule_Replicate` looks the command name up and builds its arguments before Redis
//! checks whether anyone will receive them; on a server with no AOF, no replication and no
//! save points that work (about a third of an allowed call) is thrown away. This file answers
//! "could it be thrown away?" conservatively: the answer is cached, and every server event
//! that can change it (a fork, a role or replica change, loading, a config change) clears the
//! cache so the next call asks the server again. Any doubt means "propagate".
//!
//! Why the events suffice: a replica can only start receiving the stream after the master
//! forks for it (full sync) or from a backlog that already exists (partial sync), and a fork
//! fires `ForkChild` in the parent before the next command runs; AOF and save points change
//! through config (`Config` event) or loading; promotion fires `ReplicationRoleChanged`.
//!
//! Valkey 9's atomic slot migration streams a slot's writes to the target node from the same
//! propagation path as replication. It only runs on cluster nodes, which always propagate,
//! and its events (export/import started, completed, aborted) clear the cache as well and are
//! logged, so an operator sees each migration the module took part in.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};

use crate::server;

const UNKNOWN: u8 = 0;
const NEEDED: u8 = 1;
const DISCARDED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Bumped by every event that clears the cache, so others that cache a server fact (the
/// sweep's `min-replicas-to-write`) know when to ask again.
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Set once every event is subscribed: without them a cached answer could go stale.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether a write must be propagated. Cheap except on the first call after an event.
pub fn needed(ctx: *mut RedisModuleCtx) -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return true;
    }
    match STATE.load(Ordering::Relaxed) {
        NEEDED => true,
        DISCARDED => false,
        _ => {
            let needed = probe(ctx);
            STATE.store(if needed { NEEDED } else { DISCARDED }, Ordering::Relaxed);
            needed
        }
    }
}

/// The current answer for `INFO`, without probing: "replicate", "skip" or "unknown".
pub fn describe() -> &'static str {
    if !ENABLED.load(Ordering::Relaxed) {
        return "replicate";
    }
    match STATE.load(Ordering::Relaxed) {
        NEEDED => "replicate",
        DISCARDED => "skip",
        _ => "unknown",
    }
}

/// Asks the server. Anything unexpected (a missing API, an unreadable field) means "needed".
fn probe(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: `ctx` is the running command's context; the info data is freed before return.
    unsafe {
        let Some(flags) = raw::RedisModule_GetContextFlags else {
            return true;
        };
        let flags = flags(ctx) as u32;
        // Cluster nodes always propagate: they run with replicas in practice, and their
        // topology also changes through cluster-bus messages, so the saving is not worth the
        // reasoning.
        let always = raw::REDISMODULE_CTX_FLAGS_AOF
            | raw::REDISMODULE_CTX_FLAGS_RDB
            | raw::REDISMODULE_CTX_FLAGS_CLUSTER;
        if flags & always != 0 || flags & raw::REDISMODULE_CTX_FLAGS_MASTER == 0 {
            return true;
        }
        let listened = server::with_info(ctx, c"replication", |info| {
            let field = raw::RedisModule_ServerInfoGetFieldUnsigned?;
            let mut err: c_int = 0;
            let replicas = field(info, c"connected_slaves".as_ptr(), &mut err);
            let mut err2: c_int = 0;
            let backlog = field(info, c"repl_backlog_active".as_ptr(), &mut err2);
            Some(err != 0 || err2 != 0 || replicas != 0 || backlog != 0)
        });
        // Anything unreadable counts as "someone listens".
        listened.flatten().unwrap_or(true)
    }
}

unsafe extern "C" fn invalidate(
    _ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    STATE.store(UNKNOWN, Ordering::Relaxed);
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

/// A number that changes after every server event that may change the server's role,
/// replicas, persistence or config; `None` where those events are not subscribed, so any
/// cached fact must be asked for again each time.
pub fn epoch() -> Option<u64> {
    ENABLED
        .load(Ordering::Relaxed)
        .then(|| EPOCH.load(Ordering::Relaxed))
}

/// Subscribes to every event after which the answer may differ, and only then allows
/// skipping. On a server that refuses any of them, every write is propagated.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn subscribe(ctx: *mut RedisModuleCtx) {
    // SAFETY: load-time context (caller); the callback has the required signature.
    unsafe {
        let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent else {
            return;
        };
        for id in [
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            raw::REDISMODULE_EVENT_PERSISTENCE,
            raw::REDISMODULE_EVENT_LOADING,
            raw::REDISMODULE_EVENT_REPLICA_CHANGE,
            raw::REDISMODULE_EVENT_MASTER_LINK_CHANGE,
            raw::REDISMODULE_EVENT_FORK_CHILD,
            raw::REDISMODULE_EVENT_CONFIG,
        ] {
            let event = RedisModuleEvent { id, dataver: 1 };
            if subscribe(ctx, event, Some(invalidate)) != raw::REDISMODULE_OK as c_int {
                if let Some(log) = raw::RedisModule_Log {
                    log(
                        ctx,
                        c"notice".as_ptr(),
                        c"rl: server event %llu unavailable; every write will be propagated"
                            .as_ptr(),
                        id,
                    );
                }
                return;
            }
        }
    }
    STATE.store(UNKNOWN, Ordering::Relaxed);
    ENABLED.store(true, Ordering::Relaxed);
}

/// Valkey's `ValkeyModuleEvent_AtomicSlotMigration` (Valkey 9.0+), absent from the bindings.
const VALKEY_EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;

/// What each subevent of [`VALKEY_EVENT_ATOMIC_SLOT_MIGRATION`] means, by number
/// (`VALKEYMODULE_SUBEVENT_ATOMIC_SLOT_MIGRATION_*`).
const SLOT_MIGRATION_SUBEVENTS: [&str; 6] = [
    "import started",
    "export started",
    "import aborted",
    "export aborted",
    "import completed",
    "export completed",
];

/// `ValkeyModuleSlotRange`: one inclusive range of slots.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfoV1`, the event's data.
#[repr(C)]
struct SlotMigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// Subscribes to Valkey's atomic slot migration events. Call it only where the server has
/// them (Valkey 9+, where it reports the module option): on Redis the event number is free or
/// means something else. Returns whether the server accepted the subscription.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn subscribe_slot_migration(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: load-time context (caller); the callback has the required signature.
    unsafe {
        raw::RedisModule_SubscribeToServerEvent.is_some_and(|subscribe| {
            let event = RedisModuleEvent {
                id: VALKEY_EVENT_ATOMIC_SLOT_MIGRATION,
                dataver: 1,
            };
            subscribe(ctx, event, Some(on_slot_migration)) == raw::REDISMODULE_OK as c_int
        })
    }
}

unsafe extern "C" fn on_slot_migration(
    ctx: *mut RedisModuleCtx,
    _event: RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    // The slot's writes now go (or no longer go) to another node: ask again on the next write.
    STATE.store(UNKNOWN, Ordering::Relaxed);
    let what = usize::try_from(subevent)
        .ok()
        .and_then(|i| SLOT_MIGRATION_SUBEVENTS.get(i))
        .map_or_else(|| format!("event {subevent}"), |s| (*s).to_string());
    // SAFETY: Valkey passes a live ValkeyModuleAtomicSlotMigrationInfoV1 for this event, valid
    // for the callback; its ranges array holds num_slot_ranges entries.
    let (job, slots) = unsafe { describe_migration(data.cast::<SlotMigrationInfo>()) };
    let line = format!("rl: atomic slot migration {what} (job {job}, slots {slots})");
    if let (Some(log), Ok(line)) = (unsafe { raw::RedisModule_Log }, CString::new(line)) {
        // SAFETY: `ctx` is the event's context; "%s" takes the one NUL-terminated string.
        unsafe { log(ctx, c"notice".as_ptr(), c"%s".as_ptr(), line.as_ptr()) };
    }
}

/// The job name and slot ranges of a migration event, for the log.
///
/// # Safety
/// `info` must be null or point to a live `SlotMigrationInfo` whose `slot_ranges` holds
/// `num_slot_ranges` entries.
unsafe fn describe_migration(info: *const SlotMigrationInfo) -> (String, String) {
    // SAFETY: guaranteed by the caller.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return ("?".into(), "?".into());
    };
    if info.version < 1 {
        return ("?".into(), "?".into());
    }
    let job = CStr::from_bytes_until_nul(
        // SAFETY: the array is 41 initialized bytes of the struct.
        unsafe { std::slice::from_raw_parts(info.job_name.as_ptr().cast::<u8>(), 41) },
    )
    .map_or_else(|_| "?".into(), |name| name.to_string_lossy().into_owned());
    // A migration names at most every slot once; anything longer is not a real count.
    let count = usize::try_from(info.num_slot_ranges)
        .unwrap_or(0)
        .min(16_384);
    let ranges: &[SlotRange] = if info.slot_ranges.is_null() || count == 0 {
        &[]
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts(info.slot_ranges, count) }
    };
    let slots = ranges
        .iter()
        .map(|r| format!("{}-{}", r.start, r.end))
        .collect::<Vec<_>>()
        .join(" ");
    (job, slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_events_are_described_from_valkeys_struct() {
        let ranges = [
            SlotRange { start: 0, end: 99 },
            SlotRange {
                start: 5171,
                end: 5171,
            },
        ];
        let mut job_name = [0 as c_char; 41];
        for (slot, byte) in job_name
            .iter_mut()
            .zip(b"2187bd299e1f6ea9ad376d1b80e42eb034bcfd3a")
        {
            *slot = *byte as c_char;
        }
        let info = SlotMigrationInfo {
            version: 1,
            job_name,
            slot_ranges: ranges.as_ptr(),
            num_slot_ranges: 2,
        };
        // SAFETY: a live struct whose array holds num_slot_ranges entries.
        let (job, slots) = unsafe { describe_migration(&info) };
        assert_eq!(job, "2187bd299e1f6ea9ad376d1b80e42eb034bcfd3a");
        assert_eq!(slots, "0-99 5171-5171");
        // No data, an unknown version, or no ranges: still a line, never a crash.
        // SAFETY: null is allowed.
        assert_eq!(unsafe { describe_migration(std::ptr::null()) }.0, "?");
        let old = SlotMigrationInfo { version: 0, ..info };
        // SAFETY: as above.
        assert_eq!(unsafe { describe_migration(&old) }.1, "?");
        let empty = SlotMigrationInfo {
            version: 1,
            job_name: [0; 41],
            slot_ranges: std::ptr::null(),
            num_slot_ranges: 3,
        };
        // SAFETY: a null array is never read.
        assert_eq!(
            unsafe { describe_migration(&empty) },
            (String::new(), String::new())
        );
        assert_eq!(SLOT_MIGRATION_SUBEVENTS[4], "import completed");
    }
}
