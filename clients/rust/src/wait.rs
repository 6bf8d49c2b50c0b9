//! Waiting for tokens: [`Limiter::wait`] (blocking) and [`AsyncLimiter::wait`] (tokio), for
//! outbound throttling: take your turn instead of a 429.
//!
//! Built only on the limiters' public `acquire` and `refund`, so the failure policy, the
//! deny cache and the Lua fallback apply to each try unchanged. Each denied try sleeps the
//! `retry_after_ms` the bucket returned plus up to 10% jitter (never less than 1 ms): waiters
//! on one bucket wake just after a token appears, do not stampede together, and never spin.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use crate::sync::Connect;
use crate::types::{Decision, Error, Limit};
use crate::{AsyncLimiter, Limiter};

/// Why a wait returned no token.
#[derive(Debug)]
pub enum WaitError {
    /// The timeout passed; the last denial (boxed: a `Decision` is large).
    Timeout(Box<Decision>),
    /// The cost exceeds the limit's capacity (`retry_after_ms = -1`): no wait can help.
    Never(Box<Decision>),
    /// A call failed with an error the failure policy does not cover.
    Limiter(Error),
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Timeout(d) => write!(
                f,
                "no token before the timeout (last retry_after_ms={})",
                d.retry_after_ms
            ),
            WaitError::Never(d) => write!(
                f,
                "cost can never be taken: it exceeds the capacity {} of the limit",
                d.limit.capacity()
            ),
            WaitError::Limiter(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitError::Limiter(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for WaitError {
    fn from(e: Error) -> Self {
        WaitError::Limiter(e)
    }
}

/// Up to 10% of jitter, from std's per-instance random hash keys (no extra dependency).
pub(crate) fn jitter_fraction() -> f64 {
    // Each RandomState has new keys, so the same input hashes differently each time.
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u8(0);
    (hasher.finish() % 1_000) as f64 / 10_000.0
}

/// What to do after a denial: the sleep before the next try, or the error to return.
fn next_sleep(decision: Decision, deadline: Option<Instant>) -> Result<Duration, WaitError> {
    if decision.retry_after_ms < 0 {
        return Err(WaitError::Never(Box::new(decision)));
    }
    let wait_ms = (decision.retry_after_ms as f64 * (1.0 + jitter_fraction())).max(1.0);
    let sleep = Duration::from_secs_f64(wait_ms / 1000.0);
    match deadline {
        None => Ok(sleep),
        Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
            // Sleep to the deadline at most, then try once more there.
            Some(left) if !left.is_zero() => Ok(sleep.min(left)),
            _ => Err(WaitError::Timeout(Box::new(decision))),
        },
    }
}

impl<K: Connect> Limiter<K> {
    /// Takes `cost` tokens from `key` once the bucket holds them, sleeping between tries;
    /// returns the allowed decision. `timeout: None` waits as long as it takes.
    ///
    /// # Errors
    /// [`WaitError::Timeout`] with the last denial once `timeout` has passed;
    /// [`WaitError::Never`] at once when the cost exceeds the capacity;
    /// [`WaitError::Limiter`] for what [`Limiter::acquire`] returns as an error.
    pub fn wait(
        &self,
        key: &str,
        limit: &Limit,
        cost: f64,
        timeout: Option<Duration>,
    ) -> Result<Decision, WaitError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let decision = self.acquire(key, limit, cost)?;
            if decision.allowed {
                return Ok(decision);
            }
            std::thread::sleep(next_sleep(decision, deadline)?);
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> AsyncLimiter<C> {
    /// The async [`Limiter::wait`], on a shared limiter. Dropping the future cancels the
    /// wait, holding no tokens: each try runs as its own task, and a try still in flight
    /// when the wait is dropped is refunded if it was allowed.
    ///
    /// # Errors
    /// As for [`Limiter::wait`].
    pub async fn wait(
        self: Arc<Self>,
        key: &str,
        limit: &Limit,
        cost: f64,
        timeout: Option<Duration>,
    ) -> Result<Decision, WaitError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let decision = self.clone().acquire_or_give_back(key, *limit, cost).await?;
            if decision.allowed {
                return Ok(decision);
            }
            tokio::time::sleep(next_sleep(decision, deadline)?).await;
        }
    }

    async fn acquire_or_give_back(
        self: Arc<Self>,
        key: &str,
        limit: Limit,
        cost: f64,
    ) -> Result<Decision, Error> {
        let me = self.clone();
        let owned_key = key.to_string();
        let task = tokio::spawn(async move { me.acquire(&owned_key, &limit, cost).await });
        let mut guard = GiveBack {
            task: Some(task),
            limiter: self,
            key: key.to_string(),
            limit,
            cost,
        };
        let result = match guard.task.as_mut() {
            Some(task) => task.await,
            None => return Err(Error::Reply("wait: no task".to_string())),
        };
        guard.task = None; // finished: nothing to give back
        result.map_err(|e| Error::Reply(format!("wait: the acquire task failed: {e}")))?
    }
}

/// Refunds a take that was still in flight when its wait was dropped, if it was allowed.
struct GiveBack<C: ConnectionLike + Clone + Send + Sync + 'static> {
    task: Option<tokio::task::JoinHandle<Result<Decision, Error>>>,
    limiter: Arc<AsyncLimiter<C>>,
    key: String,
    limit: Limit,
    cost: f64,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for GiveBack<C> {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limiter = self.limiter.clone();
        let (key, limit, cost) = (std::mem::take(&mut self.key), self.limit, self.cost);
        runtime.spawn(async move {
            if let Ok(Ok(decision)) = task.await {
                if decision.allowed {
                    let _ = limiter.refund(&key, &limit, cost).await;
                }
            }
        });
    }
}
