//! redis-rl: native rate-limit commands for Redis and Valkey.
//!
//! # Layout
//! - The token bucket is the `rl-bucket` crate, imported directly (`rl_bucket::Limit`, …):
//!   pure math with the time passed in. Knows nothing of Redis.
//! - [`args`]: argument parsing and validation, one function per command.
//! - [`commands`]: the command handlers, thin glue between the others; [`handler`]: what
//!   every handler shares (the entry point, the panic catch, the counters, error replies).
//! - [`store`]: the one door to stored state ([`store::Store`]): read, stage one change,
//!   commit it (write, signal, replicate the effect). Both module types are stores on it.
//! - [`datatype`]: the `rl-bucket` module type (and `rl-bkresv`, a bucket that has held
//!   reservations) and its per-key handle; [`reserve_commands`]: `RL.RESERVE`, `RL.SETTLE`,
//!   and on table buckets `RL.HRESERVE`, `RL.HSETTLE`.
//! - [`table`]: the bucket table, pure (no Redis types); [`table_type`]: its module type
//!   `rl-htable` and its handles behind the same door.
//! - [`lease_type`]: the `rl-leases` module type (a key's leases, limits on work in
//!   flight) and its handle; [`lease_commands`]: the lease commands' handlers.
//! - [`clock`]: the one place that reads the server's time.
//! - [`error`]: the error enum and its reply texts.
//! - [`info`]: the `INFO rl` section; [`stats`]: its counters.
//! - [`config`]: module load arguments; [`server`]: what the loading server supports.
//! - [`registry`]: what the server is told about each command (flags, keys, docs).
//! - [`propagation`]: whether anything receives what a write propagates.
//! - [`sweeper`]: the master's background sweep of tables (a module timer), which writes
//!   only while the server accepts writes; [`table_registry`]: where the tables are, kept
//!   in step with the keyspace through keyspace and server events, for it to visit;
//!   [`eviction`]: what `maxmemory-policy` does to tables, and the warning.
//!
//! This file holds module registration only.

pub mod args;
pub mod clock;
pub mod commands;
pub mod config;
pub mod datatype;
pub mod error;
pub mod eviction;
pub mod handler;
pub mod info;
pub mod lease_commands;
pub mod lease_type;
pub mod propagation;
pub mod registry;
pub mod reserve_commands;
pub mod server;
pub mod stats;
pub mod store;
pub mod sweeper;
pub mod table;
pub mod table_registry;
pub mod table_type;

use redis_module::{raw, redis_module, Context, RedisString, Status};

use crate::datatype::{BUCKET_TYPE, RESV_TYPE};
use crate::lease_type::LEASE_TYPE;
use crate::table_type::TABLE_TYPE;

/// Inside Redis, Rust allocations go through Redis's allocator, so they show in `INFO memory`
/// and count against `maxmemory`. Unit tests, benches and fuzzers run outside Redis, where that
/// allocator does not exist.
#[cfg(not(any(test, feature = "system-alloc")))]
mod alloc {
    pub type Allocator = redis_module::alloc::RedisAlloc;
    pub const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
}
#[cfg(any(test, feature = "system-alloc"))]
mod alloc {
    pub type Allocator = std::alloc::System;
    pub const ALLOCATOR: Allocator = std::alloc::System;
}

/// The module version reported by `MODULE LIST`: major × 10000 + minor × 100 + patch.
pub const MODULE_VERSION: i32 = 300;

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let args: Vec<String> = args.iter().map(|a| a.to_string_lossy()).collect();
    if let Err(message) = config::apply(&args) {
        // Fail the load loudly rather than ignore a setting the operator thinks is active.
        ctx.log_warning(&format!("rl: {message}"));
        return Status::Err;
    }
    // SAFETY: `ctx.ctx` is the load-time context; the options are plain flags.
    unsafe {
        let mut options = server::module_options(ctx.ctx);
        let migration = server::VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION;
        // Atomic slot migration is declared only with its events subscribed.
        if options & migration != 0 && !propagation::subscribe_slot_migration(ctx.ctx) {
            options &= !migration;
            ctx.log_notice("rl: no slot migration events here; atomic slot migration not declared");
        }
        if let Some(set_options) = raw::RedisModule_SetModuleOptions {
            set_options(ctx.ctx, options);
        }
    }
    if datatype::cache_type().is_err()
        || table_type::cache_type().is_err()
        || lease_type::cache_type().is_err()
    {
        ctx.log_warning(
            "rl: the rl-bucket, rl-bkresv, rl-htable or rl-leases type was not registered",
        );
        return Status::Err;
    }
    // SAFETY: `ctx.ctx` is the context passed to RedisModule_OnLoad.
    match unsafe { registry::register(ctx.ctx) } {
        Ok(skipped) => {
            for warning in skipped {
                ctx.log_warning(&format!("rl: {warning}"));
            }
        }
        Err(message) => {
            // The server unregisters whatever was registered before the failure.
            ctx.log_warning(&format!("rl: {message}; the module is not loaded"));
            return Status::Err;
        }
    }
    // SAFETY: `ctx.ctx` is the context passed to RedisModule_OnLoad.
    if !unsafe { info::register(ctx.ctx) } {
        ctx.log_warning("rl: could not register the INFO section");
        return Status::Err;
    }
    // SAFETY: `ctx.ctx` is the context passed to RedisModule_OnLoad.
    unsafe { propagation::subscribe(ctx.ctx) };
    // SAFETY: as above.
    // SAFETY: as above.
    let renames = !unsafe { server::generic_events_move_clients(ctx.ctx) };
    if !renames {
        ctx.log_notice(
            "rl: this Valkey moves a client's database on MOVE or COPY when a module listens \
             to generic keyspace events (valkey-io/valkey#4024); not listening, so a renamed \
             or moved table is found again at a write that adds an earlier bucket",
        );
    }
    // SAFETY: as above.
    if !unsafe { table_registry::subscribe(ctx.ctx, table_type::registered_type(), renames) } {
        ctx.log_warning("rl: keyspace or server events unavailable; the sweep may miss tables");
    }
    // SAFETY: as above.
    if !unsafe { sweeper::start(ctx.ctx) } {
        ctx.log_warning("rl: no module timers here; tables are swept by writes only");
    }
    ctx.log_notice(&format!(
        "rl: loaded; clock source {}",
        clock::source().name()
    ));
    Status::Ok
}

/// Listed last among the data types, so its `create_data_type` runs once the server's API is
/// bound and before redis-module registers defrag callbacks. On servers without
/// `RedisModule_RegisterDefragCallbacks` (before Redis 8.0; Valkey 8 and 9) the crate then
/// logs "Skip register defrag callbacks …" at warning level at every load, although this
/// module registers no defrag callback on any server. A stand-in bound there keeps a normal
/// load free of warning-level lines: the crate calls it only when callbacks were registered,
/// and none are; if it were called, it would refuse.
struct QuietDefrag;

static QUIET_DEFRAG: QuietDefrag = QuietDefrag;

impl QuietDefrag {
    fn create_data_type(&self, _ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static str> {
        // SAFETY: module load runs once, on the main thread, before anything else reads these
        // pointers; only pointers the server left unbound are set.
        unsafe {
            let (callbacks, function) = (
                raw::RedisModule_RegisterDefragCallbacks,
                raw::RedisModule_RegisterDefragFunc,
            );
            if callbacks.is_none() {
                raw::RedisModule_RegisterDefragCallbacks = Some(no_defrag_callbacks);
            }
            if function.is_none() {
                raw::RedisModule_RegisterDefragFunc = Some(no_defrag_function);
            }
        }
        Ok(())
    }
}

unsafe extern "C" fn no_defrag_callbacks(
    _ctx: *mut raw::RedisModuleCtx,
    _start: raw::RedisModuleDefragFunc,
    _end: raw::RedisModuleDefragFunc,
) -> std::os::raw::c_int {
    raw::REDISMODULE_ERR as std::os::raw::c_int
}

unsafe extern "C" fn no_defrag_function(
    _ctx: *mut raw::RedisModuleCtx,
    _function: raw::RedisModuleDefragFunc,
) -> std::os::raw::c_int {
    raw::REDISMODULE_ERR as std::os::raw::c_int
}

redis_module! {
    name: "rl",
    version: MODULE_VERSION,
    allocator: (alloc::Allocator, alloc::ALLOCATOR),
    data_types: [BUCKET_TYPE, TABLE_TYPE, LEASE_TYPE, RESV_TYPE, QUIET_DEFRAG],
    init: init,
}
