//! The words a call into Redis is spoken in, shared by the engine, the leases and the
//! shells that send the calls: what a call asks for ([`Op`]) and the module's command for it,
//! and why a call gave no reply ([`CallError`]). A leaf: it knows the error replies
//! (`diagnose`) and the values (`types`), never the engine.

use std::time::Duration;

use redis::RedisError;

use crate::diagnose::{self, is_unavailable};
use crate::script;
use crate::types::Error;

/// What a call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Peek,
    Refund,
    Multi,
    /// A post-paid cost (RL.CHARGE): always applies, may leave the bucket in debt.
    Charge,
    /// The lease and reservation calls (`crate::lease`).
    Lease,
    Release,
    Renew,
    Leases,
    Reserve,
    Settle,
}

impl Op {
    /// Whether a decision of this op takes tokens (and so may be remembered by the shield).
    pub(crate) fn takes(self) -> bool {
        self == Op::Acquire
    }

    /// The module's command for this op on a key.
    pub(crate) fn module_name(self) -> &'static str {
        module_name(self, false)
    }

    /// The Functions library's version this op needs (`rl_version`): the same for every op,
    /// since the path found by one call serves the next. Leases came with version 2, the
    /// packed numbers of every op that sends a limit with version 3, buckets stored packed
    /// (which an older library would not read) with version 4, `rl_acquire_packed` (a
    /// one-key acquire's packed reply) with version 5.
    pub(crate) fn functions_version(self) -> i64 {
        script::FUNCTIONS_VERSION
    }
}

/// The module's command name for `op`, on a key or (`field`) on a table's field.
pub(crate) fn module_name(op: Op, field: bool) -> &'static str {
    match (op, field) {
        (Op::Acquire, false) => "RL.ACQUIRE",
        (Op::Peek, false) => "RL.PEEK",
        (Op::Refund, false) => "RL.REFUND",
        (Op::Multi, false) => "RL.ACQUIRE.MULTI",
        (Op::Multi, true) => "RL.HACQUIRE.MULTI",
        (Op::Acquire, true) => "RL.HACQUIRE",
        (Op::Peek, true) => "RL.HPEEK",
        (Op::Refund, true) => "RL.HREFUND",
        (Op::Charge, false) => "RL.CHARGE",
        (Op::Charge, true) => "RL.HCHARGE",
        (Op::Lease, _) => "RL.LEASE",
        (Op::Release, _) => "RL.RELEASE",
        (Op::Renew, _) => "RL.RENEW",
        (Op::Leases, _) => "RL.LEASES",
        (Op::Reserve, _) => "RL.RESERVE",
        (Op::Settle, _) => "RL.SETTLE",
    }
}

/// Why a call into Redis gave no reply.
#[derive(Debug)]
pub(crate) enum CallError {
    Redis(RedisError),
    /// The per-call deadline passed (async: the whole call; sync: the socket timeouts).
    Timeout(Duration),
    /// The blocking limiter's connection stayed taken by other calls for the whole deadline.
    Busy(Duration),
    /// Redis is misconfigured for this client: the cause and its fix.
    Misconfigured(String),
    Reply(String),
}

/// For the calls that are not decisions (a table's delete and len): any cluster client's.
impl From<RedisError> for CallError {
    fn from(e: RedisError) -> Self {
        CallError::of(e, true)
    }
}

impl CallError {
    /// `e` as the limiter sees it: a misconfiguration named by its cause, or the error.
    pub(crate) fn of(e: RedisError, cluster_client: bool) -> CallError {
        match diagnose::misconfiguration(&e, cluster_client) {
            Some(cause) => CallError::Misconfigured(cause),
            None => CallError::Redis(e),
        }
    }

    /// Whether the failure policy decides this one as an outage (or a busy connection).
    pub(crate) fn unavailable(&self) -> bool {
        match self {
            CallError::Timeout(_) | CallError::Busy(_) => true,
            CallError::Redis(e) => is_unavailable(e),
            CallError::Misconfigured(_) | CallError::Reply(_) => false,
        }
    }

    pub(crate) fn into_error(self) -> Error {
        match self {
            CallError::Redis(e) => Error::Redis(e),
            CallError::Timeout(_) | CallError::Busy(_) => Error::Reply("timeout".into()),
            CallError::Misconfigured(cause) => Error::Misconfigured(cause),
            CallError::Reply(text) => Error::Reply(text),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            CallError::Redis(e) => e.to_string(),
            // Which it was matters to whoever reads the log: a deadline too short for the
            // load looks like an outage from here.
            CallError::Timeout(deadline) => format!(
                "no reply within {} ms: Redis is down, or too busy for the deadline \
                 (Options::timeout)",
                deadline.as_millis()
            ),
            CallError::Busy(deadline) => format!(
                "no turn on the connection within {} ms: other calls held it (a blocking \
                 Limiter has one connection; give each worker its own, or use AsyncLimiter)",
                deadline.as_millis()
            ),
            CallError::Misconfigured(cause) => cause.clone(),
            CallError::Reply(text) => text.clone(),
        }
    }
}
