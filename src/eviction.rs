//! What the server's `maxmemory-policy` does to tables, and the warning when it may evict
//! them.
//!
//! A table has no key expiry (see `table_type`), so the policies that pick among keys with an
//! expiry (`volatile-lru`, `volatile-lfu`, `volatile-random`, `volatile-ttl`) never evict
//! one, and `noeviction` evicts nothing. The `allkeys-*` policies pick among every key: an
//! evicted table takes its denials with it, and every subject in it starts full again. The
//! module cannot veto an eviction, so it says so: a warning in the log when it sees such a
//! policy (at load, and again whenever the policy changes to one), and
//! `rl_tables_evictable:yes` in `INFO rl` while tables exist under it.
//!
//! The policy is read with `CONFIG GET`, again only after a config event
//! ([`propagation::epoch`]), from the load and the sweep's timer. Depends on `propagation`
//! and `table_registry`.

use std::ffi::CStr;
use std::ptr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use redis_module::raw::{self, RedisModuleCtx};

use crate::{propagation, table_registry};

/// The policy as last read: not read yet.
const UNKNOWN: u8 = 0;
/// A policy that never evicts a table: `noeviction` or `volatile-*`.
const KEEPS_TABLES: u8 = 1;
/// An `allkeys-*` policy: any key, a table too, may be evicted.
const EVICTS_TABLES: u8 = 2;

static POLICY: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The [`propagation::epoch`] the policy was read at.
static READ_AT: Mutex<Option<Option<u64>>> = Mutex::new(None);

/// Whether a policy, by name, may evict a key without an expiry.
pub fn evicts_keys_without_expiry(policy: &str) -> bool {
    policy.starts_with("allkeys-")
}

/// `yes` while tables exist and the policy may evict them, for `INFO rl`.
pub fn tables_evictable() -> &'static str {
    if POLICY.load(Ordering::Relaxed) == EVICTS_TABLES && table_registry::len() > 0 {
        "yes"
    } else {
        "no"
    }
}

/// Reads the policy if it may have changed since last read, and logs a warning when it
/// becomes one that may evict tables (once per change).
///
/// # Safety
/// `ctx` must be a live context that may call commands (the load's, a timer's).
pub unsafe fn check(ctx: *mut RedisModuleCtx) {
    let epoch = propagation::epoch();
    {
        let mut read_at = READ_AT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if epoch.is_some() && *read_at == Some(epoch) {
            return;
        }
        *read_at = Some(epoch);
    }
    // SAFETY: forwarded (caller).
    let Some(policy) = (unsafe { config_text(ctx, c"maxmemory-policy") }) else {
        return;
    };
    let now = if evicts_keys_without_expiry(&policy) {
        EVICTS_TABLES
    } else {
        KEEPS_TABLES
    };
    if POLICY.swap(now, Ordering::Relaxed) != now && now == EVICTS_TABLES {
        if let (Ok(policy), Some(log)) = (
            std::ffi::CString::new(policy),
            // SAFETY: read once, after load.
            unsafe { raw::RedisModule_Log },
        ) {
            // SAFETY: a live context; the format takes the one NUL-terminated string.
            unsafe {
                log(
                    ctx,
                    c"warning".as_ptr(),
                    c"rl: maxmemory-policy %s may evict a bucket table, and with it every denial it holds: its subjects start full again. Tables have no expiry, so noeviction and the volatile-* policies never evict one (see docs/operations.md, Memory and eviction)"
                        .as_ptr(),
                    policy.as_ptr(),
                );
            }
        }
    }
}

/// A server setting's value as text, by `CONFIG GET`; `None` if unreadable.
///
/// # Safety
/// `ctx` must be a live context that may call commands.
pub(crate) unsafe fn config_text(ctx: *mut RedisModuleCtx, name: &CStr) -> Option<String> {
    // SAFETY: read once, after load; "cc" matches the two C strings; the reply is freed.
    unsafe {
        let (call, element, string, free) = (
            raw::RedisModule_Call?,
            raw::RedisModule_CallReplyArrayElement?,
            raw::RedisModule_CallReplyStringPtr?,
            raw::RedisModule_FreeCallReply?,
        );
        let reply = call(
            ctx,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            name.as_ptr(),
        );
        if reply.is_null() {
            return None;
        }
        let value = element(reply, 1);
        let mut len = 0usize;
        let bytes = if value.is_null() {
            ptr::null()
        } else {
            string(value, &mut len)
        };
        let text = (!bytes.is_null())
            .then(|| std::slice::from_raw_parts(bytes.cast::<u8>(), len))
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .map(str::to_owned);
        free(reply);
        text
    }
}

/// A numeric server setting, by `CONFIG GET`.
///
/// # Safety
/// As for [`config_text`].
pub(crate) unsafe fn config_number(ctx: *mut RedisModuleCtx, name: &CStr) -> Option<u64> {
    // SAFETY: forwarded (caller).
    unsafe { config_text(ctx, name) }?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allkeys_policies_evict_keys_without_an_expiry() {
        for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert!(evicts_keys_without_expiry(policy), "{policy}");
        }
        for policy in [
            "noeviction",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(!evicts_keys_without_expiry(policy), "{policy}");
        }
    }
}
