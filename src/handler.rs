//! What every command handler shares: the `extern "C"` entry point around a command's body
//! ([`handler!`]), the body's failures ([`Failure`]), and [`run`], which catches a panic (a
//! bug becomes an error reply and a log line, never an aborted server), counts the call and
//! sends the reply once. Each command family (`commands`, `lease_commands`,
//! `reserve_commands`) keeps its own reply type and how it is sent ([`Reply`]).
//!
//! Depends on `error` and `stats`.

use std::ffi::{c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::error::Error;
use crate::stats;

/// A command body's failure: the wrong number of arguments, an [`Error`], or an error text
/// made for this call (one that names what the caller sent).
pub enum Failure {
    Arity,
    Error(Error),
    Text(CString),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Error(error)
    }
}

/// A command family's reply.
pub trait Reply {
    /// `Some(true)` when the call took what it asked for, `Some(false)` when it was refused
    /// (the allowed and denied counters), `None` when it decides nothing.
    fn verdict(&self) -> Option<bool>;

    /// Sends the reply.
    ///
    /// # Safety
    /// `ctx` must be the live context of the command being answered.
    unsafe fn send(&self, ctx: *mut RedisModuleCtx) -> c_int;
}

/// A command's body: the arguments (the command's name first) to a reply.
pub type Body<R> = fn(*mut RedisModuleCtx, &[*mut RedisModuleString]) -> Result<R, Failure>;

/// Declares the `extern "C"` entry point of a command around its body:
/// `handler!(/// doc, name, c"RL.NAME", body, counted)`; `counted` says whether the call
/// joins the calls, allowed, denied and errors counters of `INFO rl`.
macro_rules! handler {
    ($(#[$doc:meta])* $name:ident, $command:literal, $body:path, $counted:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Called by Redis with a live context and `argc` valid arguments.
        pub unsafe extern "C" fn $name(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            // SAFETY: forwarded from Redis's call.
            unsafe { $crate::handler::run(ctx, argv, argc, $command, $body, $counted) }
        }
    };
}
pub(crate) use handler;

/// Runs a command body, catching any panic, counts it, and sends its reply.
///
/// # Safety
/// `ctx`, `argv` and `argc` must be exactly what Redis passed to the command handler.
pub unsafe fn run<R: Reply>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    name: &CStr,
    body: Body<R>,
    counted: bool,
) -> c_int {
    let argv: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` valid pointers in `argv`.
        Ok(len) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, len) },
        _ => &[],
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| body(ctx, argv)));
    if counted {
        stats::CALLS.bump();
        match &outcome {
            Ok(Ok(reply)) => match reply.verdict() {
                Some(true) => stats::ALLOWED.bump(),
                Some(false) => stats::DENIED.bump(),
                None => {}
            },
            _ => stats::ERRORS.bump(),
        }
    }
    // SAFETY: `ctx` is live for the whole call; replies are sent once, here.
    unsafe {
        match outcome {
            Ok(Ok(reply)) => reply.send(ctx),
            Ok(Err(Failure::Arity)) => match raw::RedisModule_WrongArity {
                Some(wrong_arity) => wrong_arity(ctx),
                None => send_error(ctx, Error::Internal.text()),
            },
            Ok(Err(Failure::Error(error))) => send_error(ctx, error.text()),
            Ok(Err(Failure::Text(text))) => send_error(ctx, &text),
            Err(_) => {
                if let Some(log) = raw::RedisModule_Log {
                    log(
                        ctx,
                        c"warning".as_ptr(),
                        c"rl: caught a panic in %s; replied with an error".as_ptr(),
                        name.as_ptr(),
                    );
                }
                send_error(ctx, Error::Internal.text())
            }
        }
    }
}

/// Replies with an error text (it starts with its code: `ERR …`, `WRONGTYPE …`).
///
/// # Safety
/// `ctx` must be live.
pub unsafe fn send_error(ctx: *mut RedisModuleCtx, text: &CStr) -> c_int {
    // SAFETY: `ctx` is live (caller); the text is NUL-terminated and outlives the call.
    unsafe {
        match raw::RedisModule_ReplyWithError {
            Some(reply) => reply(ctx, text.as_ptr()),
            None => raw::REDISMODULE_ERR as c_int,
        }
    }
}
