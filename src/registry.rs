//! What the module tells the server about each command: flags, key positions, key specs,
//! arity and docs. Key specs make `COMMAND INFO`, `COMMAND GETKEYSANDFLAGS`, cluster routing
//! and ACL key patterns describe the commands exactly as they behave.
//!
//! Key specs need `RedisModule_SetCommandInfo` (Redis 7.0+); it is probed, and without it the
//! legacy first/last/step key positions still route every command.
//!
//! A name the server already has (a built-in such as valkey-io/valkey#4081's proposed
//! `RL.THROTTLE`, another module's command, a `rename-command`) is skipped with a warning
//! rather than failing the load, so the other commands stay available; [`skipped`] lists
//! them for `INFO rl`. The one exception is `GCRA` under `gcra-alias yes`, which refuses.

use std::ffi::{c_int, CStr};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::{commands, config, lease_commands, reserve_commands};

type Handler =
    unsafe extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;

/// One command's registration.
pub struct Spec {
    /// The command name.
    pub name: &'static CStr,
    /// The raw handler.
    pub handler: Handler,
    /// Redis command flags.
    pub flags: &'static CStr,
    /// Legacy key positions: first key, last key (negative counts from the end), step.
    pub keys: (c_int, c_int, c_int),
    /// Key-spec flags (`REDISMODULE_CMD_KEY_*`) for every key the command takes.
    pub key_flags: u32,
    /// Redis arity: the exact argument count, or minus the minimum.
    pub arity: c_int,
    /// One line for `COMMAND DOCS`.
    pub summary: &'static CStr,
    /// Time complexity for `COMMAND DOCS`.
    pub complexity: &'static CStr,
    /// The module version that added the command, for `COMMAND DOCS`.
    pub since: &'static CStr,
    /// Command tips for clients and proxies, if any.
    pub tips: Option<&'static CStr>,
    /// Whether the command joins the `ratelimit` ACL category (not the internal RL.SETSTATE,
    /// so `+@ratelimit` never lets an application reset its own limits).
    pub in_category: bool,
    /// Whether the command also joins the server's own `rate_limit` category where the server
    /// has one (a Redis built with its GCRA command), as that server's `GCRA` does.
    pub in_server_category: bool,
}

const WRITE: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
const OVERWRITE: u32 = raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE;

const READ: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;

/// Every command the module registers.
pub const SPECS: &[Spec] = &[
    Spec {
        name: c"RL.ACQUIRE",
        handler: commands::acquire,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -4,
        summary: c"Refills a token bucket by the elapsed time and takes tokens if it holds enough.",
        complexity: c"O(1)",
        since: c"0.1.0",
        // The reply depends on the server's clock.
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.PEEK",
        handler: commands::peek,
        flags: c"readonly fast",
        keys: (1, 1, 1),
        key_flags: READ,
        arity: -4,
        summary: c"Replies as RL.ACQUIRE would, taking and writing nothing.",
        complexity: c"O(1)",
        since: c"0.1.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.ACQUIRE.MULTI",
        handler: commands::acquire_multi,
        flags: c"write deny-oom",
        keys: (1, -1, 4),
        key_flags: WRITE,
        arity: -5,
        summary: c"Takes from several buckets atomically: all of them, or none.",
        // A stable sort of the key names finds the keys named twice (see
        // commands::first_naming); N is capped at error::MAX_MULTI_BUCKETS.
        complexity: c"O(N log N) where N is the number of buckets (at most 1000 per call)",
        since: c"0.1.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.CHARGE",
        handler: commands::charge,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: 5,
        summary: c"Charges a token bucket for work already done: always applies, and may leave it in debt.",
        complexity: c"O(1)",
        since: c"0.3.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    THROTTLE,
    GCRA_SPEC,
    Spec {
        name: c"RL.REFUND",
        handler: commands::refund,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -4,
        summary: c"Gives tokens back to a bucket, capped at its capacity.",
        complexity: c"O(1)",
        since: c"0.1.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.HACQUIRE",
        handler: commands::hacquire,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -5,
        summary: c"RL.ACQUIRE on one bucket of a table: refills the field's bucket and takes tokens if it holds enough.",
        // Amortized: a write also moves one chunk of a growing table and sweeps 32 slots.
        complexity: c"O(1) amortized",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.HACQUIRE.MULTI",
        handler: commands::hacquire_multi,
        flags: c"write deny-oom",
        keys: (1, -1, 5),
        key_flags: WRITE,
        arity: -6,
        summary: c"Takes from several buckets of tables atomically: all of them, or none.",
        // As RL.ACQUIRE.MULTI: a sort of the key names finds the tables named twice.
        complexity: c"O(N log N) where N is the number of buckets (at most 1000 per call)",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.HPEEK",
        handler: commands::hpeek,
        flags: c"readonly fast",
        keys: (1, 1, 1),
        key_flags: READ,
        arity: -5,
        summary: c"Replies as RL.HACQUIRE would, taking and writing nothing.",
        complexity: c"O(1)",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.HREFUND",
        handler: commands::hrefund,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -5,
        summary: c"Gives tokens back to one bucket of a table, capped at its capacity.",
        complexity: c"O(1) amortized",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.HCHARGE",
        handler: commands::hcharge,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: 6,
        summary: c"RL.CHARGE on one bucket of a table: always applies, and may leave it in debt.",
        complexity: c"O(1) amortized",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.HDEL",
        handler: commands::hdel,
        // Frees memory, so no deny-oom (like DEL).
        flags: c"write fast",
        keys: (1, 1, 1),
        key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
        arity: -3,
        summary: c"Resets buckets of a table (full again); replies with how many were not full.",
        complexity: c"O(N) where N is the number of fields",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.HLEN",
        handler: commands::hlen,
        flags: c"readonly fast",
        keys: (1, 1, 1),
        key_flags: raw::REDISMODULE_CMD_KEY_RO,
        arity: 2,
        summary: c"The number of buckets a table holds (full ones leave within the sweep interval).",
        complexity: c"O(1)",
        tips: None,
        in_category: true,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.HSETSTATE",
        handler: commands::hset_state,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -5,
        summary: c"Sets or deletes table buckets by tag (internal: what table writes replicate and AOF rewrites emit).",
        complexity: c"O(N) where N is the number of tag groups",
        tips: None,
        in_category: false,
        in_server_category: false,
        since: c"0.3.0",
    },
    Spec {
        name: c"RL.SETSTATE",
        handler: commands::set_state,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: OVERWRITE,
        arity: -3,
        summary: c"Sets a bucket's exact state (internal: what RL.ACQUIRE replicates and AOF rewrites emit).",
        complexity: c"O(1)",
        since: c"0.1.0",
        tips: None,
        in_category: false,
        in_server_category: false,
    },
    Spec {
        name: c"RL.LEASE",
        handler: lease_commands::lease,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -4,
        summary: c"Takes a lease (a slot of work in flight) if fewer than limit are held.",
        // A hash by id and a counted B+tree by expiry (see rl_bucket's lease docs); each
        // expired lease dropped costs O(log N) once.
        complexity: c"O(log N) amortized where N is the number of leases held (at most 10000)",
        since: c"0.3.0",
        // The reply depends on the clock, and a made id is random.
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.RELEASE",
        handler: lease_commands::release,
        // Frees memory, so no deny-oom (like DEL).
        flags: c"write fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: 3,
        summary: c"Releases a lease; replies 1 if it was held.",
        complexity: c"O(log N) amortized where N is the number of leases held (at most 10000)",
        since: c"0.3.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.RENEW",
        handler: lease_commands::renew,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: 4,
        summary: c"Makes a held lease expire ttl_ms from now; replies 1 if it was held.",
        complexity: c"O(log N) amortized where N is the number of leases held (at most 10000)",
        since: c"0.3.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.LEASES",
        handler: lease_commands::leases,
        flags: c"readonly fast",
        keys: (1, 1, 1),
        key_flags: READ,
        arity: 3,
        summary: c"Counts the leases held and the wait until one of limit frees, writing nothing.",
        complexity: c"O(log N) where N is the number of leases held",
        since: c"0.3.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.LEASESETSTATE",
        handler: lease_commands::lease_set_state,
        flags: c"write deny-oom",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -5,
        summary: c"Drops expired leases and sets or removes leases by id (internal: what lease writes replicate and AOF rewrites emit).",
        complexity: c"O(M log N) amortized where N is the number of leases held and M the number of ids given",
        since: c"0.3.0",
        tips: None,
        in_category: false,
        in_server_category: false,
    },
    Spec {
        name: c"RL.RESERVE",
        handler: reserve_commands::reserve,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -6,
        summary: c"Takes an estimate of tokens as RL.ACQUIRE would and records it as a reservation to settle later.",
        // The open records are scanned and, on a take, rewritten (at most 1000 of 48 bytes).
        complexity: c"O(N) where N is the number of open reservations of the key (at most 1000)",
        since: c"0.3.0",
        // The reply depends on the clock, and a made id is random.
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.SETTLE",
        handler: reserve_commands::settle,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: 6,
        summary: c"Settles a reservation once with the actual cost: gives back the over-estimate or charges the rest.",
        complexity: c"O(N) where N is the number of open reservations of the key (at most 1000)",
        since: c"0.3.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.HRESERVE",
        handler: reserve_commands::hreserve,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -7,
        summary: c"RL.RESERVE on one bucket of a table: takes an estimate and records it as a reservation to settle.",
        complexity: c"O(N) where N is the number of open reservations of the field (at most 1000), plus O(1) amortized for the table",
        since: c"0.3.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.HSETTLE",
        handler: reserve_commands::hsettle,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: 7,
        summary: c"RL.SETTLE on one bucket of a table: settles a reservation once with the actual cost.",
        complexity: c"O(N) where N is the number of open reservations of the field (at most 1000), plus O(1) amortized for the table",
        since: c"0.3.0",
        tips: Some(c"nondeterministic_output"),
        in_category: true,
        in_server_category: false,
    },
    Spec {
        name: c"RL.HRESVSTATE",
        handler: reserve_commands::hresv_state,
        flags: c"write deny-oom",
        keys: (1, 1, 1),
        key_flags: WRITE,
        arity: -5,
        summary: c"Sets a table bucket's exact state and open reservations by tag (internal: what table reservations replicate and AOF rewrites emit).",
        complexity: c"O(N) where N is the number of reservations given",
        since: c"0.3.0",
        tips: None,
        in_category: false,
        in_server_category: false,
    },
    Spec {
        name: c"RL.RESVSTATE",
        handler: reserve_commands::resv_state,
        flags: c"write deny-oom",
        keys: (1, 1, 1),
        key_flags: OVERWRITE,
        arity: -4,
        summary: c"Sets a bucket's exact state and open reservations (internal: what reservations replicate and AOF rewrites emit).",
        complexity: c"O(N) where N is the number of reservations given",
        since: c"0.3.0",
        tips: None,
        in_category: false,
        in_server_category: false,
    },
];

/// `CL.THROTTLE`, registered only with the `cl-throttle-alias yes` load argument, so that
/// redis-cell users switch without renaming (and without clashing with redis-cell itself),
/// and so `RL.THROTTLE` stays reachable on a server that has a command of that name.
pub const CL_THROTTLE: Spec = Spec {
    name: c"CL.THROTTLE",
    summary: c"Alias of RL.THROTTLE, for redis-cell clients.",
    ..THROTTLE
};

const THROTTLE: Spec = Spec {
    name: c"RL.THROTTLE",
    handler: commands::throttle,
    flags: c"write deny-oom fast",
    keys: (1, 1, 1),
    key_flags: WRITE,
    arity: -5,
    summary: c"redis-cell's CL.THROTTLE: same arguments and reply, on an RL token bucket.",
    complexity: c"O(1)",
    since: c"0.1.0",
    tips: Some(c"nondeterministic_output"),
    in_category: true,
    in_server_category: false,
};

/// `GCRA`, registered only with the `gcra-alias yes` load argument, for clients written for
/// the `GCRA` command of the Redis 8.8 milestones, compiled out before 8.8 GA (Redisson's
/// `RGcra`, rueidis, phpredis). Unlike any other name, a `GCRA` the server already has makes
/// the module refuse to load.
pub const GCRA: Spec = Spec {
    name: c"GCRA",
    summary: c"Alias of RL.GCRA, for clients of the GCRA command of the Redis 8.8 milestones.",
    ..GCRA_SPEC
};

const GCRA_SPEC: Spec = Spec {
    name: c"RL.GCRA",
    handler: commands::gcra,
    flags: c"write deny-oom fast",
    keys: (1, 1, 1),
    key_flags: WRITE,
    arity: -5,
    summary: c"The GCRA command of the Redis 8.8 milestones: same arguments and reply, on an RL token bucket.",
    complexity: c"O(1)",
    since: c"0.2.0",
    tips: Some(c"nondeterministic_output"),
    in_category: true,
    in_server_category: true,
};

/// The ACL category every command joins where the server supports module categories
/// (Redis 7.4+, Valkey), so `ACL SETUSER app +@ratelimit` works.
pub const ACL_CATEGORY: &CStr = c"ratelimit";

/// [`ACL_CATEGORY`] plus the server's own rate-limit category, for the commands that join it
/// where it exists ([`server_has_category`] asks first: setting a category the server does
/// not know fails, and Redis 8 logs each such try at warning level).
const WITH_SERVER_CATEGORY: &CStr = c"ratelimit rate_limit";

/// The server's own rate-limit category, which a Redis built with its `GCRA` has.
const SERVER_CATEGORY: &CStr = c"rate_limit";

/// Whether the server has the ACL category `name`: `ACL CAT name` lists its commands, and
/// answers an error for a category it does not know (or where `ACL` is not allowed, when the
/// category cannot be set either way), silently.
///
/// # Safety
/// `ctx` must be a live context that may call commands.
unsafe fn server_has_category(ctx: *mut RedisModuleCtx, name: &CStr) -> bool {
    // SAFETY: read once, after load; "cc" matches the two C strings; the reply is freed.
    unsafe {
        let (Some(call), Some(reply_type), Some(free)) = (
            raw::RedisModule_Call,
            raw::RedisModule_CallReplyType,
            raw::RedisModule_FreeCallReply,
        ) else {
            return false;
        };
        let reply = call(
            ctx,
            c"ACL".as_ptr(),
            c"cc".as_ptr(),
            c"CAT".as_ptr(),
            name.as_ptr(),
        );
        if reply.is_null() {
            return false;
        }
        let known = reply_type(reply) == raw::REDISMODULE_REPLY_ARRAY as c_int;
        free(reply);
        known
    }
}

/// The aliases the load arguments may add, after [`SPECS`].
const ALIASES: [&Spec; 2] = [&CL_THROTTLE, &GCRA];

/// Every command the module may register, in registration order.
fn all_specs() -> impl Iterator<Item = &'static Spec> {
    SPECS.iter().chain(ALIASES)
}

/// Bit `i` set: the `i`-th of [`all_specs`] was skipped at load because the server already
/// had its name. Rewritten at each load.
static SKIPPED: AtomicU32 = AtomicU32::new(0);
const _: () = assert!(SPECS.len() + ALIASES.len() <= u32::BITS as usize);

/// The bit of [`SKIPPED`] for the `index`-th of [`all_specs`].
fn bit(index: usize) -> u32 {
    u32::try_from(index)
        .ok()
        .and_then(|i| 1u32.checked_shl(i))
        .unwrap_or(0)
}

/// The commands skipped at load because the server already had their names.
pub fn skipped() -> impl Iterator<Item = &'static CStr> {
    let mask = SKIPPED.load(Ordering::Relaxed);
    all_specs()
        .enumerate()
        .filter(move |&(i, _)| mask & bit(i) != 0)
        .map(|(_, spec)| spec.name)
}

/// The warning for a command skipped because the server has its name: which one, and how to
/// reach ours instead.
fn skip_warning(spec: &Spec) -> String {
    let name = spec.name.to_string_lossy();
    let reach = match spec.name {
        n if n == THROTTLE.name && config::cl_throttle_alias() => {
            "reach ours as CL.THROTTLE (cl-throttle-alias yes is set)".to_string()
        }
        n if n == THROTTLE.name => {
            "reach ours as CL.THROTTLE by loading with cl-throttle-alias yes".to_string()
        }
        n if n == GCRA_SPEC.name && config::gcra_alias() => {
            "reach ours as GCRA (gcra-alias yes is set)".to_string()
        }
        n if n == GCRA_SPEC.name => "reach ours as GCRA by loading with gcra-alias yes".to_string(),
        n if n == CL_THROTTLE.name => format!(
            "another module (redis-cell?) has it; use {} instead",
            THROTTLE.name.to_string_lossy()
        ),
        _ => format!(
            "to reach ours, free the name with rename-command {name} <new-name> in the \
             server's config"
        ),
    };
    format!(
        "skipped {name}: this server already has a command of that name, which stays the \
         server's; {reach}"
    )
}

/// Registers [`SPECS`] and the aliases the load arguments ask for, with key specs and docs
/// where the server supports them. Returns a warning for each command skipped because the
/// server already has its name.
///
/// # Errors
/// A message for the log naming the command the server refused. For `GCRA` under
/// `gcra-alias yes` a taken name is refused rather than skipped: a server with its own `GCRA`
/// (a Redis built with it) has that name for a reason.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn register(ctx: *mut RedisModuleCtx) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    let mut skipped = 0u32;
    // SAFETY: load-time context (caller); static NUL-terminated strings; handlers match.
    unsafe {
        let create = raw::RedisModule_CreateCommand
            .ok_or_else(|| "this server has no RedisModule_CreateCommand".to_string())?;
        // Probed by function pointer, never by version: Redis 7.0 has no module categories.
        let category = match raw::RedisModule_AddACLCategory {
            Some(add) if add(ctx, ACL_CATEGORY.as_ptr()) == raw::REDISMODULE_OK as c_int => {
                raw::RedisModule_SetCommandACLCategories
            }
            _ => None,
        };
        let server_category = category.is_some() && server_has_category(ctx, SERVER_CATEGORY);
        let wanted = |spec: &Spec| match spec.name {
            n if n == CL_THROTTLE.name => config::cl_throttle_alias(),
            n if n == GCRA.name => config::gcra_alias(),
            _ => true,
        };
        for (index, spec) in all_specs().enumerate().filter(|(_, spec)| wanted(spec)) {
            let (first, last, step) = spec.keys;
            let status = create(
                ctx,
                spec.name.as_ptr(),
                Some(spec.handler),
                spec.flags.as_ptr(),
                first,
                last,
                step,
            );
            if status != raw::REDISMODULE_OK as c_int {
                // The flags and names are constants the server accepts, so a refusal means
                // the name is taken (RedisModule_CreateCommand checks nothing else that varies).
                if spec.name == GCRA.name {
                    return Err(format!(
                        "cannot register GCRA (gcra-alias yes): this server already has a GCRA \
                         command (a Redis built with its own, or another module's); use {} \
                         instead, or load without gcra-alias",
                        GCRA_SPEC.name.to_string_lossy()
                    ));
                }
                skipped |= bit(index);
                warnings.push(skip_warning(spec));
                continue;
            }
            if let (Some(get_command), Some(set_info)) =
                (raw::RedisModule_GetCommand, raw::RedisModule_SetCommandInfo)
            {
                let command = get_command(ctx, spec.name.as_ptr());
                if command.is_null()
                    || set_info(command, &command_info(spec, &mut key_specs(spec)))
                        != raw::REDISMODULE_OK as c_int
                {
                    return Err(format!(
                        "the server refused the command info of {}",
                        spec.name.to_string_lossy()
                    ));
                }
                if let (Some(set_category), true) = (category, spec.in_category) {
                    let ok = |status: c_int| status == raw::REDISMODULE_OK as c_int;
                    let joined = (spec.in_server_category
                        && server_category
                        && ok(set_category(command, WITH_SERVER_CATEGORY.as_ptr())))
                        || ok(set_category(command, ACL_CATEGORY.as_ptr()));
                    if !joined {
                        return Err(format!(
                            "the server refused the ACL category of {}",
                            spec.name.to_string_lossy()
                        ));
                    }
                }
            }
        }
    }
    SKIPPED.store(skipped, Ordering::Relaxed);
    Ok(warnings)
}

static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// The spec's keys as one key spec, plus the zeroed terminator the API expects.
fn key_specs(spec: &Spec) -> [raw::RedisModuleCommandKeySpec; 2] {
    let (first, last, step) = spec.keys;
    // `last` counts from the end when negative; the range form wants it relative to `first`.
    let last_relative = if last < 0 { last } else { last - first };
    let keys = raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: u64::from(spec.key_flags),
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: first },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: last_relative,
                keystep: step,
                limit: 0,
            },
        },
    };
    // SAFETY: an all-zero key spec is the documented terminator (begin_search_type INVALID).
    let end: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    [keys, end]
}

fn command_info(
    spec: &Spec,
    key_specs: &mut [raw::RedisModuleCommandKeySpec; 2],
) -> raw::RedisModuleCommandInfo {
    raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: spec.summary.as_ptr(),
        complexity: spec.complexity.as_ptr(),
        since: spec.since.as_ptr(),
        history: ptr::null_mut(),
        tips: spec.tips.map_or(ptr::null(), CStr::as_ptr),
        arity: spec.arity,
        key_specs: key_specs.as_mut_ptr(),
        args: ptr::null_mut(),
    }
}
