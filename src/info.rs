//! The module's `INFO rl` section: what an operator needs to see without reading the log.

use std::ffi::{c_int, CString};

use redis_module::raw::{self, RedisModuleInfoCtx};

use crate::{clock, config, eviction, propagation, registry, stats, sweeper, table_registry};

/// Registers the section; `INFO rl` (or `INFO modules`, `INFO everything`) shows it.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn register(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: load-time context (caller); the callback has the required signature.
    unsafe {
        raw::RedisModule_RegisterInfoFunc
            .is_some_and(|register| register(ctx, Some(info)) == raw::REDISMODULE_OK as c_int)
    }
}

unsafe extern "C" fn info(ctx: *mut RedisModuleInfoCtx, _for_crash_report: c_int) {
    let counters = [
        ("calls", stats::CALLS.get()),
        ("allowed", stats::ALLOWED.get()),
        ("denied", stats::DENIED.get()),
        ("errors", stats::ERRORS.get()),
        ("sweep_tables", table_registry::len() as u64),
        ("sweep_ticks", stats::SWEEP_TICKS.get()),
        ("sweep_passes", stats::SWEEP_PASSES.get()),
        ("sweep_held_ticks", stats::SWEEP_HELD.get()),
        ("swept", stats::SWEPT.get()),
        ("sweep_tick_max_us", stats::SWEEP_TICK_MAX_US.get()),
        ("sweep_tick_max_cpu_us", stats::SWEEP_TICK_MAX_CPU_US.get()),
        (
            "sweep_tick_max_wall_us",
            stats::SWEEP_TICK_MAX_WALL_US.get(),
        ),
        ("sweep_tick_max_slots", stats::SWEEP_TICK_MAX_SLOTS.get()),
    ];
    // Lower case, as the server lists commands: the names this server already had.
    let skipped: Vec<String> = registry::skipped()
        .map(|name| name.to_string_lossy().to_ascii_lowercase())
        .collect();
    let skipped = skipped.join(",");
    let fields = [
        ("version", env!("CARGO_PKG_VERSION")),
        ("clock", clock::source().name()),
        ("propagation", propagation::describe()),
        ("cl_throttle_alias", yes_no(config::cl_throttle_alias())),
        ("gcra_alias", yes_no(config::gcra_alias())),
        ("skipped_commands", skipped.as_str()),
        ("sweep_held_because", sweeper::held_because()),
        ("tables_evictable", eviction::tables_evictable()),
    ];
    // SAFETY: `ctx` is the live info context Redis passed in; strings are NUL-terminated.
    unsafe {
        let (Some(add_section), Some(add_field)) = (
            raw::RedisModule_InfoAddSection,
            raw::RedisModule_InfoAddFieldCString,
        ) else {
            return;
        };
        if add_section(ctx, c"".as_ptr()) != raw::REDISMODULE_OK as c_int {
            return;
        }
        for (name, value) in fields {
            if let (Ok(name), Ok(value)) = (CString::new(name), CString::new(value)) {
                add_field(ctx, name.as_ptr(), value.as_ptr());
            }
        }
        if let Some(add_unsigned) = raw::RedisModule_InfoAddFieldULongLong {
            for (name, value) in counters {
                if let Ok(name) = CString::new(name) {
                    add_unsigned(ctx, name.as_ptr(), value);
                }
            }
        }
    }
}

fn yes_no(on: bool) -> &'static str {
    if on {
        "yes"
    } else {
        "no"
    }
}
