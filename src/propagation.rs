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

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};

use crate::server;

const UNKNOWN: u8 = 0;
const NEEDED: u8 = 1;
const DISCARDED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
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
