//! The module's `INFO rl` section: what an operator needs to see without reading the log.

use std::ffi::{c_int, CString};

use redis_module::raw::{self, RedisModuleInfoCtx};

use crate::{clock, propagation};

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
    let fields = [
        ("version", env!("CARGO_PKG_VERSION")),
        ("clock", clock::source().name()),
        ("propagation", propagation::describe()),
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
    }
}
