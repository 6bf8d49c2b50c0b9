//! What the loading server supports, probed through the module API at load, never inferred
//! from a version number (Valkey reports `redis_version:7.2.4` whatever its own version).

use std::ffi::{c_int, CStr};

use redis_module::raw::{self, RedisModuleCtx};

/// Valkey's module option: `ValkeyModule_Replicate` skips its command-name lookup, which
/// costs more than the rest of a replicated write.
const VALKEY_SKIP_COMMAND_VALIDATION: c_int = 1 << 4;
/// Valkey's module option (`VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION`, Valkey 9.0+):
/// the module's keys may move with `CLUSTER MIGRATESLOTS`. Without it a loaded module makes
/// the server refuse atomic slot migration for the whole cluster.
///
/// The migration sends the slot as an AOF-format snapshot (the type's `aof_rewrite`:
/// `RL.SETSTATE` with the exact state, then the key's `PEXPIREAT`) followed by the slot's
/// share of the replication stream. Both carry exact effects, never a clock-dependent command,
/// so the target ends DUMP-identical to the source. Buckets are plain keys with no per-slot
/// state of the module's, and cluster nodes always propagate (see `propagation`), so no write
/// can skip the stream.
pub const VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

/// The module options to set: the portable ones, plus Valkey's own where this is Valkey and
/// it reports supporting them (the bits mean something else, or nothing, to Redis), so
/// atomic slot migration is declared exactly on Valkey 9+.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn module_options(ctx: *mut RedisModuleCtx) -> c_int {
    let mut options = (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as c_int;
    // SAFETY: load-time context (caller); the info data is freed before returning.
    unsafe {
        if let (true, Some(all)) = (is_valkey(ctx), raw::RedisModule_GetModuleOptionsAll) {
            options |=
                all() & (VALKEY_SKIP_COMMAND_VALIDATION | VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION);
        }
    }
    options
}

/// Whether `INFO server` says `server_name:valkey`.
///
/// # Safety
/// `ctx` must be a live context.
pub unsafe fn is_valkey(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: as in `module_options`.
    unsafe {
        with_info(ctx, c"server", |info| {
            let field = raw::RedisModule_ServerInfoGetFieldC?;
            let name = field(info, c"server_name".as_ptr());
            Some(!name.is_null() && CStr::from_ptr(name) == c"valkey")
        })
    }
    .flatten()
    .unwrap_or(false)
}

/// Whether a module subscribed to generic keyspace events moves the client of a `MOVE` or a
/// cross-database `COPY` to the destination database: Valkey from 8.1 (valkey-io/valkey#1819
/// runs the callbacks on the executing client and selects the event's database on it) until
/// the fix (valkey-io/valkey#4024, seen fixed in 9.1.2). A server bug has no API to probe, so
/// this reads `valkey_version`, and any Valkey whose version it cannot read counts as
/// affected: the safe side is not to subscribe.
///
/// # Safety
/// `ctx` must be a live context.
pub unsafe fn generic_events_move_clients(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: as in `module_options`.
    if !unsafe { is_valkey(ctx) } {
        return false;
    }
    // SAFETY: as above.
    let version = unsafe {
        with_info(ctx, c"server", |info| {
            let field = raw::RedisModule_ServerInfoGetFieldC?;
            let text = field(info, c"valkey_version".as_ptr());
            (!text.is_null()).then(|| CStr::from_ptr(text).to_string_lossy().into_owned())
        })
    }
    .flatten();
    version
        .as_deref()
        .and_then(parse_version)
        .is_none_or(|v| ((8, 1, 0)..(9, 1, 2)).contains(&v))
}

/// `major.minor.patch` as numbers; `None` for anything else.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.trim().splitn(3, '.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// Runs `read` on one `INFO` section and frees it; `None` if the server cannot provide it.
///
/// # Safety
/// `ctx` must be a live context; `read` must not keep the pointer.
pub unsafe fn with_info<T>(
    ctx: *mut RedisModuleCtx,
    section: &CStr,
    read: impl FnOnce(*mut raw::RedisModuleServerInfoData) -> T,
) -> Option<T> {
    // SAFETY: guaranteed by the caller; the data is freed exactly once, after `read`.
    unsafe {
        let (get_info, free_info) = (
            raw::RedisModule_GetServerInfo?,
            raw::RedisModule_FreeServerInfo?,
        );
        let info = get_info(ctx, section.as_ptr());
        if info.is_null() {
            return None;
        }
        let value = read(info);
        free_info(ctx, info);
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_three_numbers_or_not_at_all() {
        assert_eq!(parse_version("8.1.1"), Some((8, 1, 1)));
        assert_eq!(parse_version("9.1.2\r"), Some((9, 1, 2)));
        assert_eq!(parse_version("9.1"), None);
        assert_eq!(parse_version("9.1.x"), None);
        assert_eq!(parse_version(""), None);
    }
}
