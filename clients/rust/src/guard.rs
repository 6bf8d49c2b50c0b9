//! A lease as a scope: [`Limiter::hold`] and [`AsyncLimiter::hold`] wait (up to a deadline)
//! for a free slot and return a guard that renews the lease at `ttl_ms / 2` while it lives
//! and releases it when dropped, on every way out of the scope: a return, `?`, a panic
//! unwinding. And a reservation's [`Reservation::settle`] for each limiter.
//!
//! The blocking guard renews on a thread of its own and releases inline when dropped. The
//! async guard renews on a tokio task and, when dropped, spawns its release on the runtime it
//! is dropped in (a `Drop` cannot await); dropped outside any runtime it cannot call Redis,
//! so the lease runs out at its `ttl_ms`, as a crashed holder's would. [`LeaseGuard::release`]
//! and [`AsyncLeaseGuard::release`] release it now and return Redis's answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use crate::lease::{self, Lease, Reservation};
use crate::sync::Connect;
use crate::types::{Charged, Error, Source};
use crate::wait::jitter_fraction;
use crate::{AsyncLimiter, Limiter};

const DENIED_NOTHING: &str = "a denied reservation took nothing and has nothing to settle";

/// The renewal period: half the lease's time to live, at least 1 ms.
fn renew_every(ttl_ms: u64) -> Duration {
    Duration::from_millis((ttl_ms / 2).max(1))
}

/// The first pause between tries while waiting for a slot, and the longest.
const FIRST_POLL: Duration = Duration::from_millis(5);
const LONGEST_POLL: Duration = Duration::from_secs(1);

/// The pause before the next try: a denial's `retry_after_ms` is when the earliest lease
/// expires, the latest a slot frees, but a release frees one sooner, so a waiter polls, from
/// 5 ms doubling up to 1 s (`poll`, doubled here for the next time), never past the denial's
/// wait nor the `deadline`, with up to 10% jitter so waiters do not wake together. `None`
/// once the deadline passed.
fn next_try(retry_after_ms: i64, poll: &mut Duration, deadline: Instant) -> Option<Duration> {
    let now = Instant::now();
    if now >= deadline {
        return None;
    }
    let slot_frees = Duration::from_millis(u64::try_from(retry_after_ms.max(1)).unwrap_or(1));
    let pause = (*poll).min(slot_frees).mul_f64(1.0 + jitter_fraction());
    *poll = poll.saturating_mul(2).min(LONGEST_POLL);
    Some(pause.min(deadline.saturating_duration_since(now)))
}

fn timed_out(wait: Duration, lease: &Lease) -> Error {
    Error::TimedOut {
        waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        retry_after_ms: lease.retry_after_ms,
    }
}

/// Whether a lease is one a renewer can keep alive (the `Open` policy's holds nothing).
fn renewable(lease: &Lease) -> bool {
    lease.source != Source::Open
}

// Blocking ----------------------------------------------------------------------------------

/// A lease held for a scope, from [`Limiter::hold`]: renewed on a thread of its own at
/// `ttl_ms / 2`, released when dropped (inline, blocking for at most the limiter's deadline)
/// or by [`LeaseGuard::release`].
pub struct LeaseGuard<K: Connect + 'static> {
    limiter: Arc<Limiter<K>>,
    key: String,
    lease: Lease,
    renewer: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    lost: Arc<AtomicBool>,
    released: bool,
}

impl<K> Limiter<K>
where
    K: Connect + Send + Sync + 'static,
    K::Connection: Send,
{
    /// Takes a lease at `key` (at most `limit` held at once, each for `ttl_ms` unless renewed)
    /// and returns a guard that renews it while held and releases it when dropped. Denied, it
    /// tries again (from 5 ms, doubling up to 1 s, never past when the denial says a slot
    /// frees) until `wait` has passed (`Duration::ZERO`: one try).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use redis_rl_client::{Limiter, OnError, Options};
    ///
    /// let limiter = Arc::new(Limiter::new(redis::Client::open("redis://127.0.0.1/")?, Options::new(OnError::Local)));
    /// {
    ///     let _slot = limiter.hold("exports:tenant:7", 2, 30_000, Duration::from_secs(5))?;
    ///     // at most 2 exports of tenant 7 run here at once; the slot is given back at the
    ///     // end of the scope, on an error or a panic too
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::TimedOut`] when no slot freed within `wait`; otherwise as for
    /// [`Limiter::lease`].
    pub fn hold(
        self: &Arc<Self>,
        key: &str,
        limit: u32,
        ttl_ms: u64,
        wait: Duration,
    ) -> Result<LeaseGuard<K>, Error> {
        // One id for every try: a take whose reply was lost is answered as held on the next.
        let id = lease::new_id()?;
        let deadline = Instant::now() + wait;
        let mut poll = FIRST_POLL;
        loop {
            let lease = self.lease(key, limit, ttl_ms, Some(&id))?;
            if lease.allowed {
                return Ok(LeaseGuard::start(self.clone(), key, lease, ttl_ms));
            }
            match next_try(lease.retry_after_ms, &mut poll, deadline) {
                Some(sleep) => std::thread::sleep(sleep),
                None => return Err(timed_out(wait, &lease)),
            }
        }
    }
}

impl<K> LeaseGuard<K>
where
    K: Connect + Send + Sync + 'static,
    K::Connection: Send,
{
    fn start(limiter: Arc<Limiter<K>>, key: &str, lease: Lease, ttl_ms: u64) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = renewable(&lease)
            .then(|| {
                let (stop, stopped) = mpsc::channel::<()>();
                let (limiter, owned_key, id, lost) = (
                    limiter.clone(),
                    key.to_string(),
                    lease.id.clone(),
                    lost.clone(),
                );
                let every = renew_every(ttl_ms);
                let spawned = std::thread::Builder::new()
                    .name("redis-rl-renew".into())
                    .spawn(move || {
                        let key = owned_key;
                        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                            match limiter.renew(&key, &id, ttl_ms) {
                                Ok(true) => {}
                                Ok(false) => {
                                    lost.store(true, Ordering::Relaxed);
                                    log::warn!(
                                        "redis-rl: the lease {id} of {key} is no longer held \
                                         (expired or released elsewhere); renewing stops"
                                    );
                                    return;
                                }
                                Err(e) => {
                                    log::warn!("redis-rl: renewing the lease {id} of {key}: {e}")
                                }
                            }
                        }
                    });
                match spawned {
                    Ok(thread) => Some((stop, thread)),
                    Err(e) => {
                        log::warn!(
                            "redis-rl: no thread to renew the lease of {key} ({e}): it lasts \
                             its ttl_ms"
                        );
                        None
                    }
                }
            })
            .flatten();
        LeaseGuard {
            limiter,
            key: key.to_string(),
            lease,
            renewer,
            lost,
            released: false,
        }
    }
}

impl<K: Connect + 'static> LeaseGuard<K> {
    /// The lease as taken.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The lease's id.
    pub fn id(&self) -> &str {
        &self.lease.id
    }

    /// Whether a renewal found the lease gone (it expired, say after a long pause, or was
    /// released elsewhere): the slot may be someone else's now.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    fn stop_renewing(&mut self) {
        if let Some((stop, thread)) = self.renewer.take() {
            drop(stop);
            if thread.join().is_err() {
                log::warn!("redis-rl: the renewer of a lease of {} panicked", self.key);
            }
        }
    }

    /// Releases the lease now: `true` if it was held.
    ///
    /// # Errors
    /// As for [`Limiter::release`].
    pub fn release(mut self) -> Result<bool, Error> {
        self.stop_renewing();
        self.released = true;
        self.limiter.release(&self.key, &self.lease.id)
    }
}

impl<K: Connect + 'static> Drop for LeaseGuard<K> {
    fn drop(&mut self) {
        self.stop_renewing();
        if self.released {
            return;
        }
        if let Err(e) = self.limiter.release(&self.key, &self.lease.id) {
            log::warn!(
                "redis-rl: releasing the lease {} of {} failed ({e}); it expires at its ttl_ms",
                self.lease.id,
                self.key
            );
        }
    }
}

impl<K: Connect> Reservation<'_, Limiter<K>> {
    /// Settles the reservation with the `actual` cost, once (it is consumed): what was
    /// over-estimated goes back, what was under-estimated is charged (into debt).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a denied reservation (it took nothing), and as for
    /// [`Limiter::settle`].
    pub fn settle(self, actual: f64) -> Result<Charged, Error> {
        if !self.reserved.allowed {
            return Err(Error::Invalid(DENIED_NOTHING));
        }
        let r = &self.reserved;
        self.limiter.settle(&r.key, &r.limit, &r.id, actual)
    }
}

// Async -------------------------------------------------------------------------------------

/// A lease held for a scope, from [`AsyncLimiter::hold`]: renewed on a tokio task at
/// `ttl_ms / 2`, released when dropped (the release spawned on the current runtime) or by
/// [`AsyncLeaseGuard::release`].
pub struct AsyncLeaseGuard<C: ConnectionLike + Clone + Send + Sync + 'static> {
    limiter: Arc<AsyncLimiter<C>>,
    key: String,
    lease: Lease,
    renewer: Option<tokio::task::JoinHandle<()>>,
    lost: Arc<AtomicBool>,
    released: bool,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> AsyncLimiter<C> {
    /// Takes a lease and returns a guard, as [`Limiter::hold`]: renewed at `ttl_ms / 2` on a
    /// task, released when dropped, waiting up to `wait` for a free slot.
    ///
    /// # Errors
    /// As for [`Limiter::hold`].
    pub async fn hold(
        self: &Arc<Self>,
        key: &str,
        limit: u32,
        ttl_ms: u64,
        wait: Duration,
    ) -> Result<AsyncLeaseGuard<C>, Error> {
        let id = lease::new_id()?;
        let deadline = Instant::now() + wait;
        let mut poll = FIRST_POLL;
        loop {
            let lease = self.lease(key, limit, ttl_ms, Some(&id)).await?;
            if lease.allowed {
                return Ok(AsyncLeaseGuard::start(self.clone(), key, lease, ttl_ms));
            }
            match next_try(lease.retry_after_ms, &mut poll, deadline) {
                Some(sleep) => tokio::time::sleep(sleep).await,
                None => return Err(timed_out(wait, &lease)),
            }
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> AsyncLeaseGuard<C> {
    /// The guard of a lease already taken (`lease.allowed`) with `ttl_ms`: the in-flight
    /// layer's, and `hold`'s.
    pub(crate) fn start(
        limiter: Arc<AsyncLimiter<C>>,
        key: &str,
        lease: Lease,
        ttl_ms: u64,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Handle::try_current().ok();
        let renewer = match (renewable(&lease), runtime) {
            (true, Some(runtime)) => {
                let (limiter, key, id, lost) = (
                    limiter.clone(),
                    key.to_string(),
                    lease.id.clone(),
                    lost.clone(),
                );
                let every = renew_every(ttl_ms);
                Some(runtime.spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        match limiter.renew(&key, &id, ttl_ms).await {
                            Ok(true) => {}
                            Ok(false) => {
                                lost.store(true, Ordering::Relaxed);
                                log::warn!(
                                    "redis-rl: the lease {id} of {key} is no longer held \
                                     (expired or released elsewhere); renewing stops"
                                );
                                return;
                            }
                            Err(e) => {
                                log::warn!("redis-rl: renewing the lease {id} of {key}: {e}")
                            }
                        }
                    }
                }))
            }
            _ => None,
        };
        AsyncLeaseGuard {
            limiter,
            key: key.to_string(),
            lease,
            renewer,
            lost,
            released: false,
        }
    }

    /// The lease as taken.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The lease's id.
    pub fn id(&self) -> &str {
        &self.lease.id
    }

    /// Whether a renewal found the lease gone, as [`LeaseGuard::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    fn stop_renewing(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }

    /// Releases the lease now: `true` if it was held.
    ///
    /// # Errors
    /// As for [`AsyncLimiter::release`].
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop_renewing();
        self.released = true;
        self.limiter.release(&self.key, &self.lease.id).await
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for AsyncLeaseGuard<C> {
    fn drop(&mut self) {
        self.stop_renewing();
        if self.released {
            return;
        }
        let (limiter, key, id) = (
            self.limiter.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.lease.id),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = limiter.release(&key, &id).await {
                        log::warn!(
                            "redis-rl: releasing the lease {id} of {key} failed ({e}); it \
                             expires at its ttl_ms"
                        );
                    }
                });
            }
            Err(_) => log::warn!(
                "redis-rl: the lease {id} of {key} was dropped outside a tokio runtime, so it \
                 cannot be released: it expires at its ttl_ms"
            ),
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> Reservation<'_, AsyncLimiter<C>> {
    /// Settles the reservation with the `actual` cost, once, as the blocking
    /// [`Reservation::settle`].
    ///
    /// # Errors
    /// As for [`AsyncLimiter::settle`].
    pub async fn settle(self, actual: f64) -> Result<Charged, Error> {
        if !self.reserved.allowed {
            return Err(Error::Invalid(DENIED_NOTHING));
        }
        let r = &self.reserved;
        self.limiter.settle(&r.key, &r.limit, &r.id, actual).await
    }
}
