//! One handler per command: parse → open key → pure step → write → propagate → reply.
//!
//! Handlers are raw `extern "C"` functions (no per-call argument vector), and each body runs
//! inside `catch_unwind`, so a bug becomes an error reply and a log line, never an aborted
//! server.

use std::ffi::{c_int, c_longlong};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::bucket::{self, State};
use crate::datatype::BucketKey;
use crate::error::Error;
use crate::{args, clock, propagation};

/// What a command answers when it succeeds.
enum Reply {
    /// `RL.ACQUIRE`: allowed, remaining, retry_after_ms, reset_after_ms.
    Decision([i64; 4]),
    /// `+OK`.
    Ok,
}

/// A command body's failure: the wrong number of arguments, or an [`Error`].
enum Failure {
    Arity,
    Error(Error),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Error(error)
    }
}

/// `RL.ACQUIRE key rate capacity [cost]`
///
/// # Safety
/// Called by Redis with a live context and `argc` valid arguments.
pub unsafe extern "C" fn acquire(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: forwarded from Redis's call.
    unsafe { run(ctx, argv, argc, c"RL.ACQUIRE", acquire_body) }
}

fn acquire_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let (&[_, key, rate, capacity], cost) = match argv {
        [name, key, rate, capacity] => (&[*name, *key, *rate, *capacity], None),
        [name, key, rate, capacity, cost] => (&[*name, *key, *rate, *capacity], Some(*cost)),
        _ => return Err(Failure::Arity),
    };
    // SAFETY (all three): the strings are arguments of the running command.
    let parsed = unsafe { args::acquire(bytes(rate), bytes(capacity), cost.map(|c| bytes(c))) }?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let bucket_key = unsafe { BucketKey::open(ctx, key) }?;
    let state = bucket_key.state()?;
    let (decision, new_state) = bucket::acquire(&parsed.limit, state, clock::now_us(), parsed.cost);
    if let Some(new_state) = new_state {
        bucket_key.write(new_state, state.is_some())?;
        if propagation::needed(ctx) {
            // SAFETY: as above.
            unsafe { propagate_state(ctx, key, new_state) }?;
        }
    }
    Ok(Reply::Decision([
        i64::from(decision.allowed()),
        i64::try_from(decision.remaining).unwrap_or(i64::MAX),
        decision.retry_after_ms(),
        decision.reset_after_ms(),
    ]))
}

/// `RL.SETSTATE key full_at_ns`: sets a bucket's exact state and derives its absolute expiry.
/// It is what `RL.ACQUIRE` replicates and what AOF rewrites emit; it reads no clock, so
/// replaying it anywhere gives the same bucket.
///
/// # Safety
/// Called by Redis with a live context and `argc` valid arguments.
pub unsafe extern "C" fn set_state(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: forwarded from Redis's call.
    unsafe { run(ctx, argv, argc, c"RL.SETSTATE", set_state_body) }
}

fn set_state_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, Failure> {
    let &[_, key, full_at_ns] = argv else {
        return Err(Failure::Arity);
    };
    // SAFETY: an argument of the running command.
    let state = args::full_at_ns(unsafe { bytes(full_at_ns) })?;
    // SAFETY: `ctx` and `key` belong to the running command.
    let bucket_key = unsafe { BucketKey::open(ctx, key) }?;
    let existed = bucket_key.state()?.is_some();
    bucket_key.write(state, existed)?;
    // SAFETY: `ctx` is the running command's context. The command is deterministic, so it
    // travels as it came.
    unsafe { raw::RedisModule_ReplicateVerbatim.ok_or(Error::Internal)?(ctx) };
    Ok(Reply::Ok)
}

/// Replicates the effect of a clock-dependent write: the exact state, whose expiry follows.
///
/// # Safety
/// `ctx` and `key` must belong to the running command.
unsafe fn propagate_state(
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleString,
    state: State,
) -> Result<(), Error> {
    let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(Error::Internal)?;
    let full_at_ns = c_longlong::try_from(state.full_at_ns()).map_err(|_| Error::Internal)?;
    // SAFETY: "sl" matches the two variadic arguments: a RedisModuleString and a long long.
    let status = unsafe {
        replicate(
            ctx,
            c"RL.SETSTATE".as_ptr(),
            c"sl".as_ptr(),
            key,
            full_at_ns,
        )
    };
    (status == raw::REDISMODULE_OK as c_int)
        .then_some(())
        .ok_or(Error::Internal)
}

/// The bytes of a command argument.
///
/// # Safety
/// `s` must be a live RedisModuleString that outlives the returned slice (true for `argv`
/// entries during the call).
unsafe fn bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: guaranteed by the caller; StringPtrLen never returns NULL for a live string.
    unsafe {
        let Some(ptr_len) = raw::RedisModule_StringPtrLen else {
            return &[];
        };
        let data = ptr_len(s, &mut len);
        if data.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(data.cast::<u8>(), len)
    }
}

/// Runs a command body, catching any panic, and sends its reply.
///
/// # Safety
/// `ctx`, `argv` and `argc` must be exactly what Redis passed to the command handler.
unsafe fn run(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    name: &std::ffi::CStr,
    body: fn(*mut RedisModuleCtx, &[*mut RedisModuleString]) -> Result<Reply, Failure>,
) -> c_int {
    let argv: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` valid pointers in `argv`.
        Ok(len) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, len) },
        _ => &[],
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| body(ctx, argv)));
    // SAFETY: `ctx` is live for the whole call; replies are sent once, here.
    unsafe {
        match outcome {
            Ok(Ok(reply)) => send(ctx, &reply),
            Ok(Err(Failure::Arity)) => match raw::RedisModule_WrongArity {
                Some(wrong_arity) => wrong_arity(ctx),
                None => send_error(ctx, Error::Internal),
            },
            Ok(Err(Failure::Error(error))) => send_error(ctx, error),
            Err(_) => {
                if let Some(log) = raw::RedisModule_Log {
                    log(
                        ctx,
                        c"warning".as_ptr(),
                        c"rl: caught a panic in %s; replied with an error".as_ptr(),
                        name.as_ptr(),
                    );
                }
                send_error(ctx, Error::Internal)
            }
        }
    }
}

unsafe fn send(ctx: *mut RedisModuleCtx, reply: &Reply) -> c_int {
    // SAFETY: `ctx` is live (caller).
    unsafe {
        match reply {
            Reply::Decision(values) => {
                let (Some(array), Some(integer)) = (
                    raw::RedisModule_ReplyWithArray,
                    raw::RedisModule_ReplyWithLongLong,
                ) else {
                    return raw::REDISMODULE_ERR as c_int;
                };
                array(ctx, values.len() as _);
                for &value in values {
                    integer(ctx, value);
                }
                raw::REDISMODULE_OK as c_int
            }
            Reply::Ok => match raw::RedisModule_ReplyWithSimpleString {
                Some(simple) => simple(ctx, c"OK".as_ptr()),
                None => raw::REDISMODULE_ERR as c_int,
            },
        }
    }
}

unsafe fn send_error(ctx: *mut RedisModuleCtx, error: Error) -> c_int {
    // SAFETY: `ctx` is live (caller); the text is a static NUL-terminated string.
    unsafe {
        match raw::RedisModule_ReplyWithError {
            Some(reply) => reply(ctx, error.text().as_ptr()),
            None => raw::REDISMODULE_ERR as c_int,
        }
    }
}
