//! The library's values: [`Limit`], [`Decision`], [`MultiDecision`], [`Refund`], [`Source`],
//! the options ([`Options`], [`OnError`], [`WithoutModule`]), [`Counters`] and [`Error`].
//!
//! Nothing here does I/O; the names are the Python and Node libraries' names.

use std::fmt;
use std::time::Duration;

/// What a `closed` decision tells the caller to wait, in ms (it cannot know better).
pub const CLOSED_RETRY_AFTER_MS: i64 = 1000;

/// A validated limit: `rate` tokens per second, a burst of `capacity` tokens, with the
/// module's ranges. Built once where it is written, so a bad limit fails there rather than
/// on every request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    bucket: rl_bucket::Limit,
}

impl Limit {
    /// `rate_per_s` tokens per second and a burst of `capacity` tokens.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the argument unless `1e-6 <= rate_per_s <= 1e9`,
    /// `0 < capacity <= 1e15` and `capacity / rate_per_s <= 3153600000` (a full refill within
    /// 100 years), as the module checks them.
    pub fn new(rate_per_s: f64, capacity: f64) -> Result<Limit, Error> {
        match rl_bucket::Limit::new(rate_per_s, capacity) {
            Ok(bucket) => Ok(Limit { bucket }),
            Err(rl_bucket::LimitError::Rate) => Err(Error::Invalid(
                "rate must be a number from 0.000001 to 1000000000 (tokens per second)",
            )),
            Err(rl_bucket::LimitError::Capacity) => Err(Error::Invalid(
                "capacity must be a number above 0 and at most 1e15 (tokens)",
            )),
            Err(rl_bucket::LimitError::RefillTime) => Err(Error::Invalid(
                "capacity / rate must be at most 3153600000 (a full refill within 100 years)",
            )),
        }
    }

    /// Tokens per second.
    pub fn rate_per_s(&self) -> f64 {
        self.bucket.rate_per_s()
    }

    /// The burst, in tokens.
    pub fn capacity(&self) -> f64 {
        self.bucket.capacity()
    }

    /// The module's bucket for this limit (what `Local` decides with when `instances` is 1).
    pub fn bucket(&self) -> &rl_bucket::Limit {
        &self.bucket
    }
}

/// Who decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The module, on the server.
    Redis,
    /// The deny cache (the hot-key shield), without asking Redis.
    Cache,
    /// The `Local` failure policy: an in-process bucket.
    Local,
    /// The `Open` failure policy: allowed without Redis.
    Open,
    /// The `Closed` failure policy: denied without Redis.
    Closed,
    /// The Lua fallback script, on a server without the module.
    Lua,
}

impl Source {
    /// The lowercase name the other libraries use: "redis", "cache", "local", "open",
    /// "closed", "lua".
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Cache => "cache",
            Source::Local => "local",
            Source::Open => "open",
            Source::Closed => "closed",
            Source::Lua => "lua",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer to one `acquire` or `peek`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Whole tokens left.
    pub remaining: u64,
    /// 0 when allowed; the wait until the cost fits when denied; -1 when the cost exceeds
    /// the capacity and no wait helps.
    pub retry_after_ms: i64,
    /// Until the bucket is full again.
    pub reset_after_ms: i64,
    /// The limit asked for.
    pub limit: Limit,
    /// Who decided.
    pub source: Source,
}

impl Decision {
    /// `X-RateLimit-Limit` (the capacity), `-Remaining`, `-Reset` (seconds until full,
    /// rounded up), and `Retry-After` (seconds, rounded up) when denied and a wait can help.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            ("X-RateLimit-Limit", number(self.limit.capacity())),
            ("X-RateLimit-Remaining", self.remaining.to_string()),
            ("X-RateLimit-Reset", ceil_s(self.reset_after_ms).to_string()),
        ];
        if !self.allowed && self.retry_after_ms >= 0 {
            headers.push(("Retry-After", ceil_s(self.retry_after_ms).to_string()));
        }
        headers
    }
}

/// The answer of `acquire_all`: all or nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiDecision {
    /// Whether every bucket's cost was taken.
    pub allowed: bool,
    /// The first refusing item, `None` when allowed.
    pub refused_index: Option<usize>,
    /// The longest wait among the refusing items; -1 if one can never succeed; 0 if allowed.
    pub retry_after_ms: i64,
    /// One decision per item, as RL.ACQUIRE.MULTI replies; empty when `source` is
    /// [`Source::Cache`], which knows only the refusing item.
    pub decisions: Vec<Decision>,
    /// Who decided.
    pub source: Source,
}

/// The answer of `refund`: the bucket after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refund {
    /// Whole tokens left after the refund (0 when `Open` or `Closed` decided).
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset_after_ms: i64,
    /// Who answered.
    pub source: Source,
}

/// What to decide when Redis cannot: connection errors, timeouts, and OOM, READONLY, LOADING
/// (and cluster-down) error replies. There is no default: a fairness limit and a login limit
/// want different answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// Allow: for fairness or capacity limits, where a limiter outage must not become an
    /// API outage.
    Open,
    /// Deny: for security limits (logins, OTP), where knocking Redis over must not open the
    /// gate.
    Closed,
    /// Decide in process with an exact bucket of `rate / instances` and
    /// `capacity / instances` per key.
    Local,
}

/// What to do on a server without the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WithoutModule {
    /// Run the shipped Lua script (clients/lua/rl.lua) with EVALSHA: the module's decisions,
    /// slower, a hash per bucket.
    Lua,
    /// Fail every call with [`Error::ModuleMissing`].
    Refuse,
}

/// A limiter's settings. [`Options::new`] takes the failure policy, which has no default.
#[derive(Clone, Debug)]
pub struct Options {
    pub(crate) on_error: OnError,
    pub(crate) instances: u32,
    pub(crate) deny_cache: usize,
    pub(crate) without_module: WithoutModule,
    pub(crate) timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) local_max_keys: usize,
}

/// The deny cache's size bound when it is switched on with `true`.
pub const DEFAULT_DENY_CACHE_ENTRIES: usize = 10_000;

impl Options {
    /// Settings with the failure policy `on_error`, one instance, no deny cache, the Lua
    /// fallback, a 50 ms deadline per call, Redis tried again every 100 ms during an outage,
    /// and at most 100,000 local buckets.
    pub fn new(on_error: OnError) -> Options {
        Options {
            on_error,
            instances: 1,
            deny_cache: 0,
            without_module: WithoutModule::Lua,
            timeout: Duration::from_millis(50),
            probe_interval: Duration::from_millis(100),
            local_max_keys: 100_000,
        }
    }

    /// How many processes share each limit: `Local` gives each a 1/`instances` share.
    /// 0 is taken as 1.
    pub fn instances(mut self, instances: u32) -> Options {
        self.instances = instances.max(1);
        self
    }

    /// The hot-key shield on (10,000 entries) or off.
    pub fn deny_cache(mut self, on: bool) -> Options {
        self.deny_cache = if on { DEFAULT_DENY_CACHE_ENTRIES } else { 0 };
        self
    }

    /// The hot-key shield with at most `entries` keys remembered (0 turns it off).
    pub fn deny_cache_entries(mut self, entries: usize) -> Options {
        self.deny_cache = entries;
        self
    }

    /// What to do on a server without the module.
    pub fn without_module(mut self, without_module: WithoutModule) -> Options {
        self.without_module = without_module;
        self
    }

    /// Each call's deadline; past it the failure policy decides. The async limiter bounds the
    /// whole call with it; the blocking one sets it as the connect, read and write timeouts,
    /// so a call that also detects the module or loads the script (its first, or the first
    /// after an "unknown command" or NOSCRIPT) can take up to three of them.
    pub fn timeout(mut self, timeout: Duration) -> Options {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// During an outage, Redis is tried again at most this often; calls in between are
    /// decided by the policy at once, so an outage costs no deadline per call.
    pub fn probe_interval(mut self, probe_interval: Duration) -> Options {
        self.probe_interval = probe_interval;
        self
    }

    /// The most buckets `Local` keeps (oldest first out; a forgotten bucket is full again).
    pub fn local_max_keys(mut self, keys: usize) -> Options {
        self.local_max_keys = keys.max(1);
        self
    }
}

/// Decisions by source, and outages seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Answered by the module.
    pub redis: u64,
    /// Answered by the Lua script.
    pub lua: u64,
    /// Denied by the deny cache.
    pub cache: u64,
    /// Decided by the `Local` policy.
    pub local: u64,
    /// Allowed by the `Open` policy.
    pub open: u64,
    /// Denied by the `Closed` policy.
    pub closed: u64,
    /// Outages: runs of calls Redis could not answer, each logged once.
    pub outages: u64,
}

impl Counters {
    pub(crate) fn count(&mut self, source: Source) {
        let slot = match source {
            Source::Redis => &mut self.redis,
            Source::Lua => &mut self.lua,
            Source::Cache => &mut self.cache,
            Source::Local => &mut self.local,
            Source::Open => &mut self.open,
            Source::Closed => &mut self.closed,
        };
        *slot = slot.saturating_add(1);
    }

    /// Decisions the failure policy took without Redis (`local + open + closed`; the deny
    /// cache's answers are counted apart, in `cache`).
    pub fn without_redis(&self) -> u64 {
        self.local
            .saturating_add(self.open)
            .saturating_add(self.closed)
    }
}

/// Why a call returned no decision. Outages are not errors: the failure policy decides them.
#[derive(Debug)]
pub enum Error {
    /// A bad argument, found before any I/O: the text names it and its range.
    Invalid(&'static str),
    /// The server has no RL.ACQUIRE and the limiter was built with
    /// [`WithoutModule::Refuse`].
    ModuleMissing,
    /// An error reply the failure policy does not cover (WRONGTYPE, a script error …).
    Redis(redis::RedisError),
    /// A reply of an unexpected shape.
    Reply(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(text) => f.write_str(text),
            Error::ModuleMissing => f.write_str(
                "the server has no RL.ACQUIRE (the redis-rl module is not loaded) and this \
                 limiter was built with WithoutModule::Refuse; load the module or use \
                 WithoutModule::Lua",
            ),
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Reply(text) => write!(f, "unexpected reply: {text}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

/// A cost as the module takes it: a finite number of tokens, at least 0.
pub(crate) fn check_cost(cost: f64) -> Result<f64, Error> {
    if cost.is_finite() && cost >= 0.0 {
        Ok(cost)
    } else {
        Err(Error::Invalid("cost must be a finite number >= 0 (tokens)"))
    }
}

/// A double as text the module parses back to the same double: Rust prints the shortest
/// decimal that round-trips, without an exponent ("10", "0.000001", "2500").
pub(crate) fn number(value: f64) -> String {
    format!("{value}")
}

fn ceil_s(ms: i64) -> i64 {
    if ms <= 0 {
        0
    } else {
        ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) > 0)
    }
}
