//! A thin app on the redis-rl client library (`clients/rust`, crate `redis-rl-client`): a
//! per-request limiter with an explicit fail-open or fail-closed policy and HTTP-style
//! answers.
//!
//! ```no_run
//! use redis_rl_limiter::{FailurePolicy, Limiter};
//!
//! // Logins are a security control: if Redis cannot decide, refuse.
//! let limiter = Limiter::new("redis://127.0.0.1/", FailurePolicy::Closed)?;
//! let decision = limiter.acquire("login:alice", 0.1, 5.0, 1.0)?;
//! if !decision.allowed {
//!     // 429 (or 503 when `decision.fallback` is set), Retry-After: decision.retry_after_secs()
//! }
//! # Ok::<(), redis_rl_limiter::Error>(())
//! ```
//!
//! Everything that matters lives in the library: the typed decision, the failure policy
//! (applied to connection errors, timeouts and OOM / READONLY / LOADING, counted and logged
//! once per outage), the deny cache (on here: a flooded, denied key costs Redis nothing until
//! its wait has passed) and the Lua fallback for servers without the module. This app adds
//! two things:
//!
//! - [`Limiter::acquire`] returns `Err` only when the *call* is wrong (a rate, capacity or
//!   cost outside the module's ranges, checked before any I/O): a bug in the caller must not
//!   be mistaken for an outage.
//! - An error reply the library does not treat as an outage (the key holds another type) is
//!   decided by the same policy here, with [`Decision::fallback`] saying why.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_rl_client::{Limit, OnError, Options, Source};

/// What to decide when Redis cannot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Allow the request: for limits that protect capacity or fairness (an API quota).
    Open,
    /// Refuse the request: for limits that are a security control (logins, OTP).
    Closed,
}

/// When a refused request may be retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    /// Allowed: no wait.
    Now,
    /// Refused: after this long the tokens are there (rounded up to the millisecond).
    After(Duration),
    /// Refused for good: the cost is above the capacity. No wait helps.
    Never,
}

/// Why the failure policy decided instead of Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    /// The policy that decided.
    pub policy: FailurePolicy,
    /// What went wrong, for logs.
    pub reason: String,
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Whole tokens left (`X-RateLimit-Remaining`); 0 when the policy decided.
    pub remaining: u64,
    /// When a refused request may be retried.
    pub retry_after: RetryAfter,
    /// Until the bucket is full again.
    pub reset_after: Duration,
    /// `Some` when Redis could not decide and the [`FailurePolicy`] did.
    pub fallback: Option<Fallback>,
    /// The library's headers (X-RateLimit-*, Retry-After when denied).
    pub headers: Vec<(&'static str, String)>,
}

impl Decision {
    /// `Retry-After` in whole seconds, rounded up; `None` when allowed or never possible.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.retry_after {
            RetryAfter::After(wait) => Some(ceil_secs(wait)),
            RetryAfter::Now | RetryAfter::Never => None,
        }
    }

    /// `X-RateLimit-Reset` in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }

    fn from_library(d: &redis_rl_client::Decision, policy: FailurePolicy) -> Decision {
        let millis = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        let decided_without_redis = matches!(d.source, Source::Open | Source::Closed);
        Decision {
            allowed: d.allowed,
            remaining: d.remaining,
            retry_after: match (d.allowed, d.retry_after_ms) {
                (true, _) => RetryAfter::Now,
                (false, ms) if ms < 0 => RetryAfter::Never,
                (false, ms) => RetryAfter::After(millis(ms)),
            },
            reset_after: millis(d.reset_after_ms),
            fallback: decided_without_redis.then(|| Fallback {
                policy,
                reason: "Redis could not decide (logged once per outage by redis-rl)".into(),
            }),
            headers: d.headers(),
        }
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A call that can never be right, whatever Redis does.
#[derive(Debug, PartialEq)]
pub enum Error {
    /// An argument outside the module's ranges.
    InvalidArgument(&'static str),
    /// The URL could not be parsed.
    InvalidUrl(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::InvalidUrl(why) => write!(f, "invalid Redis URL: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// Token buckets in Redis, one per key.
pub struct Limiter {
    client: redis::Client,
    policy: FailurePolicy,
    inner: redis_rl_client::Limiter,
    /// Error replies that were not outages (WRONGTYPE), decided by the policy here.
    failed_on_errors: AtomicU64,
}

impl Limiter {
    /// A limiter on the server at `url`, deciding by `policy` when that server cannot.
    /// Connects lazily, on the first call.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] if `url` is not a Redis URL.
    pub fn new(url: &str, policy: FailurePolicy) -> Result<Limiter, Error> {
        let client = redis::Client::open(url).map_err(|e| Error::InvalidUrl(e.to_string()))?;
        Ok(Limiter::build(client, policy, Duration::from_millis(50)))
    }

    fn build(client: redis::Client, policy: FailurePolicy, timeout: Duration) -> Limiter {
        let on_error = match policy {
            FailurePolicy::Open => OnError::Open,
            FailurePolicy::Closed => OnError::Closed,
        };
        let options = Options::new(on_error).deny_cache(true).timeout(timeout);
        Limiter {
            inner: redis_rl_client::Limiter::new(client.clone(), options),
            client,
            policy,
            failed_on_errors: AtomicU64::new(0),
        }
    }

    /// Sets each call's deadline (default 50 ms).
    pub fn with_timeout(self, timeout: Duration) -> Limiter {
        Limiter::build(self.client, self.policy, timeout)
    }

    /// Takes `cost` tokens from the bucket at `key` (refilling `rate` per second, holding at
    /// most `capacity`) if it has them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a rate, capacity or cost the module would refuse; checked
    /// before any I/O. Redis being unable to decide is never an `Err`: see the module docs.
    pub fn acquire(
        &self,
        key: &str,
        rate: f64,
        capacity: f64,
        cost: f64,
    ) -> Result<Decision, Error> {
        let limit = Limit::new(rate, capacity).map_err(invalid)?;
        match self.inner.acquire(key, &limit, cost) {
            Ok(d) => Ok(Decision::from_library(&d, self.policy)),
            Err(e @ redis_rl_client::Error::Invalid(_)) => Err(invalid(e)),
            Err(e) => Ok(self.fall_back(e.to_string())),
        }
    }

    /// How many calls the policy allowed because Redis could not decide.
    pub fn failed_open(&self) -> u64 {
        self.inner.counters().open + self.on_errors(FailurePolicy::Open)
    }

    /// How many calls the policy refused because Redis could not decide.
    pub fn failed_closed(&self) -> u64 {
        self.inner.counters().closed + self.on_errors(FailurePolicy::Closed)
    }

    fn on_errors(&self, policy: FailurePolicy) -> u64 {
        if self.policy == policy {
            self.failed_on_errors.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    fn fall_back(&self, reason: String) -> Decision {
        self.failed_on_errors.fetch_add(1, Ordering::Relaxed);
        let allowed = self.policy == FailurePolicy::Open;
        Decision {
            allowed,
            remaining: 0,
            retry_after: if allowed {
                RetryAfter::Now
            } else {
                RetryAfter::After(Duration::from_millis(
                    redis_rl_client::CLOSED_RETRY_AFTER_MS as u64,
                ))
            },
            reset_after: Duration::ZERO,
            fallback: Some(Fallback {
                policy: self.policy,
                reason,
            }),
            headers: Vec::new(),
        }
    }
}

fn invalid(e: redis_rl_client::Error) -> Error {
    match e {
        redis_rl_client::Error::Invalid(text) => Error::InvalidArgument(text),
        // Limit::new and the cost check only ever fail with Invalid.
        _ => Error::InvalidArgument("invalid argument"),
    }
}
