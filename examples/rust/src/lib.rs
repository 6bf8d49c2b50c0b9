//! A typed client for `RL.ACQUIRE` (redis-rl) with an explicit failure policy.
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
//! # Errors and the failure policy
//!
//! [`Limiter::acquire`] returns `Err` only when the *call* is wrong: a rate, capacity or cost
//! outside the module's ranges, checked before any I/O. A bug in the caller must not be
//! mistaken for an outage.
//!
//! Everything that keeps Redis from deciding (it is unreachable, too slow, out of memory, a
//! read-only replica, the module is not loaded, the key holds another type) is an outage, and
//! the limiter's [`FailurePolicy`] decides instead: `Ok(Decision)` with
//! [`Decision::fallback`] set to the reason. There is no default policy, so every limiter
//! states its choice, and each fallback decision is counted ([`Limiter::failed_open`],
//! [`Limiter::failed_closed`]).
//!
//! - [`FailurePolicy::Open`] allows: for limits that protect capacity or fairness (an API
//!   quota), where a limiter outage must not become an API outage.
//! - [`FailurePolicy::Closed`] refuses: for limits that are a security control (logins, OTP,
//!   password resets), where an attacker who can knock Redis over must not get unlimited tries.
//!
//! The connection has short timeouts (50 ms by default, [`Limiter::with_timeout`]), so a slow
//! Redis degrades to the policy instead of stacking up requests. This example keeps one
//! connection behind a mutex; a busy service would use a pool.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// What to decide when Redis cannot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Allow the request.
    Open,
    /// Refuse the request.
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

    /// The module's reply: `[allowed, remaining, retry_after_ms, reset_after_ms]`.
    fn from_reply((allowed, remaining, retry_ms, reset_ms): (i64, i64, i64, i64)) -> Decision {
        let millis = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        Decision {
            allowed: allowed == 1,
            remaining: u64::try_from(remaining).unwrap_or(0),
            retry_after: match (allowed, retry_ms) {
                (1, _) => RetryAfter::Now,
                (_, ms) if ms < 0 => RetryAfter::Never,
                (_, ms) => RetryAfter::After(millis(ms)),
            },
            reset_after: millis(reset_ms),
            fallback: None,
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

// The module's accepted ranges.
const MIN_RATE: f64 = 0.000_001;
const MAX_RATE: f64 = 1e9;
const MAX_CAPACITY: f64 = 1e15;
const MAX_REFILL_S: f64 = 3_153_600_000.0;

/// Token buckets in Redis, one per key.
pub struct Limiter {
    client: redis::Client,
    policy: FailurePolicy,
    timeout: Duration,
    connection: Mutex<Option<redis::Connection>>,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
}

impl Limiter {
    /// A limiter on the server at `url`, deciding by `policy` when that server cannot.
    /// Connects lazily, on the first call.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] if `url` is not a Redis URL.
    pub fn new(url: &str, policy: FailurePolicy) -> Result<Limiter, Error> {
        let client = redis::Client::open(url).map_err(|e| Error::InvalidUrl(e.to_string()))?;
        Ok(Limiter {
            client,
            policy,
            timeout: Duration::from_millis(50),
            connection: Mutex::new(None),
            failed_open: AtomicU64::new(0),
            failed_closed: AtomicU64::new(0),
        })
    }

    /// Sets the connect, read and write timeout (default 50 ms).
    pub fn with_timeout(mut self, timeout: Duration) -> Limiter {
        self.timeout = timeout;
        self
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
        if !(MIN_RATE..=MAX_RATE).contains(&rate) {
            return Err(Error::InvalidArgument(
                "rate must be from 0.000001 to 1e9 tokens/s",
            ));
        }
        if !(capacity > 0.0 && capacity <= MAX_CAPACITY) || capacity / rate > MAX_REFILL_S {
            return Err(Error::InvalidArgument(
                "capacity must be above 0, at most 1e15, and refill within 100 years",
            ));
        }
        if !(cost.is_finite() && cost >= 0.0) {
            return Err(Error::InvalidArgument("cost must be a finite number >= 0"));
        }
        let reply = self.query(
            redis::cmd("RL.ACQUIRE")
                .arg(key)
                .arg(rate)
                .arg(capacity)
                .arg(cost),
        );
        Ok(match reply {
            Ok(reply) => Decision::from_reply(reply),
            Err(error) => self.fall_back(error.to_string()),
        })
    }

    /// How many calls the policy allowed because Redis could not decide.
    pub fn failed_open(&self) -> u64 {
        self.failed_open.load(Ordering::Relaxed)
    }

    /// How many calls the policy refused because Redis could not decide.
    pub fn failed_closed(&self) -> u64 {
        self.failed_closed.load(Ordering::Relaxed)
    }

    fn query(&self, cmd: &redis::Cmd) -> redis::RedisResult<(i64, i64, i64, i64)> {
        // A panic elsewhere while holding the lock leaves a connection that is still usable.
        let mut slot = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        let con = match &mut *slot {
            Some(con) => con,
            empty => empty.insert(self.connect()?),
        };
        let result = cmd.query(con);
        if let Err(error) = &result {
            // After a timeout or I/O error the connection may hold a late reply: start afresh.
            if error.code().is_none() {
                *slot = None;
            }
        }
        result
    }

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let con = self.client.get_connection_with_timeout(self.timeout)?;
        con.set_read_timeout(Some(self.timeout))?;
        con.set_write_timeout(Some(self.timeout))?;
        Ok(con)
    }

    fn fall_back(&self, reason: String) -> Decision {
        let allowed = self.policy == FailurePolicy::Open;
        let counter = if allowed {
            &self.failed_open
        } else {
            &self.failed_closed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Decision {
            allowed,
            remaining: 0,
            // A short back-off, since nobody knows when the limiter will be back.
            retry_after: if allowed {
                RetryAfter::Now
            } else {
                RetryAfter::After(Duration::from_secs(1))
            },
            reset_after: Duration::ZERO,
            fallback: Some(Fallback {
                policy: self.policy,
                reason,
            }),
        }
    }
}
