//! redis-rl client: rate limits on Redis with the redis-rl module, with an explicit failure
//! policy, a hot-key shield, and two fallbacks for servers without the module (a Functions
//! library an admin loads, and a Lua script), found without privileges.
//!
//! ```no_run
//! use redis_rl_client::{Limit, Limiter, OnError, Options, Source, WithoutModule};
//!
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let limiter = Limiter::new(
//!     client,
//!     Options::new(OnError::Local).instances(4).deny_cache(true).without_module(WithoutModule::Lua),
//! );
//! // At startup: the path (module, functions, lua), or Error::Misconfigured with its cause.
//! let path = limiter.check()?;
//! let d = limiter.acquire("user:42", &Limit::new(5.0, 10.0)?, 1.0)?;
//! if !d.allowed {
//!     for (name, value) in d.headers() { /* 429 with these */ let _ = (name, value); }
//! }
//! assert!(matches!(
//!     d.source,
//!     Source::Redis | Source::Functions | Source::Lua | Source::Cache | Source::Local
//! ));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The same shape as the Python (`redis_rl`) and Node libraries:
//!
//! - [`Limit`] is validated at construction with the module's ranges (it is `rl_bucket`'s).
//! - [`Decision`] says who decided in [`Source`]: `Redis` (the module), `Functions` (the
//!   Functions library), `Lua` (the fallback script), `Cache` (the deny cache), or the
//!   failure policy: `Local`, `Open`, `Closed`.
//! - [`OnError`] has no default. It applies to connection errors, timeouts (each call has a
//!   deadline, 2 s by default: busy is not down) and the OOM, READONLY and LOADING replies. `Local` decides
//!   with the module's own pure bucket (`rl_bucket`) at `rate / instances` and
//!   `capacity / instances` per key, at most `local_max_keys` keys. Decisions without Redis
//!   are counted ([`Limiter::counters`]) and logged once per outage through the `log` crate;
//!   Redis is probed again every `probe_interval`, and decisions go back to it once it
//!   answers.
//! - The deny cache (`Options::deny_cache`): after Redis denies `(key, cost)` with
//!   `retry_after_ms = R`, the key is denied here, `Source::Cache`, until R has passed, for
//!   any cost at least as large. Nothing extra gets through: tokens reappear only by refill
//!   (R counts it) or a refund, and this library's `refund` clears the entry. The one
//!   approximation: a refund made by another instance is not seen until R passes.
//! - Three paths, in order: the module (RL.*), the Functions library `redis_rl` (FCALL, once
//!   an admin loaded it with [`load_functions`]), the script `clients/lua/rl.lua` (compiled
//!   in) as EVALSHA of its SHA-1 computed here, and EVAL of it on NOSCRIPT. The path is found
//!   by sending the call itself and reading the error ("unknown command", "Function not
//!   found", NOPERM), never with COMMAND, INFO or SCRIPT LOAD, so a user with only the
//!   documented ACL rules can use any of them; it is found again when it stops answering.
//!   [`WithoutModule::Refuse`] keeps to the module.
//! - Misconfiguration is not an outage: a wrong password, a missing ACL rule, a cluster
//!   client on a standalone server or a single-node one on a cluster, no module under
//!   `Refuse`. [`Limiter::check`] (and [`AsyncLimiter::check`]) returns
//!   [`Error::Misconfigured`] naming the cause and the fix, for a service to call once at
//!   startup; at run time such calls are logged at error level with the cause, decided by
//!   the policy and counted in [`Counters::misconfigured`], not as outages.
//!
//! # Layout
//!
//! `types` the values; `engine` the rules shared by both limiters and each call's exchange with
//! Redis as steps (no I/O); `op` the words of a call (what it asks for, why it gave no reply) that
//! the engine, the leases and the shells share; `diagnose` what each error reply means (down, no
//! path, NOPERM, misconfigured); `functions` loading the Functions library; `sync` the blocking
//! [`Limiter`] on a `redis::Client` or `ClusterClient` and `asynch` the tokio [`AsyncLimiter`],
//! shells that send each step, blocking or awaited; `local` the bounded local buckets and deny
//! cache; `script` the Lua script, the Functions library and their arguments; `hashslot` a key's
//! cluster hash slot ([`key_slot`]); `slots` all or nothing across a cluster's hash slots
//! ([`AsyncLimiter::acquire_across_slots`]); `table` the bucket tables ([`Limiter::table`]: a
//! limit's fields over `shards` keys).

mod asynch;
mod diagnose;
mod engine;
mod functions;
mod guard;
mod hashslot;
mod lease;
mod local;
mod op;
mod script;
mod slots;
mod sync;
mod table;
mod types;
mod wait;

/// HTTP rate limiting as a `tower::Layer` (axum, hyper, tonic): the `tower` feature.
#[cfg(feature = "tower")]
pub mod layer;

pub use asynch::AsyncLimiter;
pub use engine::Path;
pub use functions::{load_functions, load_functions_async};
pub use guard::{AsyncLeaseGuard, LeaseGuard};
pub use hashslot::key_slot;
pub use lease::{Lease, LeaseCount, Reservation, Reserved, LOCAL_ID_PREFIX, OPEN_ID_PREFIX};
pub use script::FUNCTIONS_VERSION;
pub use slots::{SlotItem, SlotOutcome, SlotsDecision};
pub use sync::{Connect, Limiter};
pub use table::{
    shard_of, shards_for, AsyncTable, Table, TableOptions, MAX_BUCKETS_PER_TABLE, MAX_SHARDS,
};
pub use types::{
    Charged, Counters, Decision, Error, Limit, MultiDecision, OnError, Options, Refund, Source,
    WithoutModule, CLOSED_RETRY_AFTER_MS, DEFAULT_DENY_CACHE_ENTRIES, DEFAULT_TIMEOUT,
};
pub use wait::WaitError;

/// The cause, if `error` (from a connection or a command) means Redis is misconfigured for
/// this library rather than down or busy: authentication refused, a missing ACL permission,
/// a cluster client on a standalone server or a single-node client on a cluster (MOVED, ASK).
/// For a service that opens its own connections and wants to stop at startup with that cause
/// instead of retrying as if Redis were down.
pub fn misconfiguration(error: &redis::RedisError) -> Option<String> {
    diagnose::misconfiguration(error, true)
}

/// The Lua fallback script this library runs on servers without the module
/// (`clients/lua/rl.lua`), for tools that load it themselves.
pub const LUA_SCRIPT: &str = script::SCRIPT;

/// The Functions library `redis_rl` (`clients/lua/rl_functions.lua`) that
/// [`load_functions`] loads, for tools that load it themselves (`FUNCTION LOAD REPLACE`).
pub const FUNCTIONS_LIBRARY: &str = script::FUNCTIONS;
