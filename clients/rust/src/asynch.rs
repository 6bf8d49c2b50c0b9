//! The async limiter, on any `redis::aio::ConnectionLike` that can be cloned: a
//! `redis::aio::ConnectionManager` (reconnects by itself) or a cluster's
//! `redis::cluster_async::ClusterConnection`. Tokio only.
//!
//! Each call runs under `tokio::time::timeout` with the limiter's deadline, so a slow or
//! unreachable Redis costs at most that before the failure policy decides. A command already
//! sent is not withdrawn then, and Redis may still apply it (see `Options::timeout`). The
//! rules live in `engine`; this file only sends.

use std::time::Instant;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::Value;

use crate::engine::{Answer, Engine, Exchange, Path, Step, Target};
use crate::lease::{self, Call, Lease, LeaseCount, Reservation};
use crate::op::{CallError, Op};
use crate::slots::{Across, AcrossStep, SlotItem, SlotsDecision};
use crate::types::{
    check_cost, Charged, Counters, Decision, Error, Limit, MultiDecision, Options, Refund,
};

/// The async twin of [`crate::Limiter`], with the same methods, awaited.
///
/// Build it with [`AsyncLimiter::connect`], which does not need Redis to be up: the failure
/// policy then covers the start too, and decisions go to Redis once it answers. A plain
/// `MultiplexedConnection` does not reconnect after the server restarts; on
/// [`AsyncLimiter::new`] use a `ConnectionManager` (or a cluster connection).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use redis_rl_client::{AsyncLimiter, Limit, OnError, Options};
///
/// let client = redis::Client::open("redis://127.0.0.1/")?;
/// let limiter = AsyncLimiter::connect(client, Options::new(OnError::Closed))?;
/// let d = limiter.acquire("login:alice", &Limit::new(0.1, 5.0)?, 1.0).await?;
/// # let _ = d;
/// # Ok(())
/// # }
/// ```
pub struct AsyncLimiter<C> {
    connection: C,
    engine: Engine,
    /// Held while one call finds the path, so a cold limiter's first calls wait for its
    /// answer instead of each trying every path.
    detecting: tokio::sync::Mutex<()>,
}

impl AsyncLimiter<ConnectionManager> {
    /// A limiter on `client` that connects on its first call, not here, so it can be built
    /// while Redis is down (a service starting before its Redis): until Redis answers, the
    /// failure policy decides, as in any outage, and each probe tries to connect again. Call
    /// it inside a tokio runtime.
    ///
    /// The `ConnectionManager` it makes gives each connect attempt the limiter's deadline and
    /// makes one attempt per try, no backoff of its own: the limiter's `probe_interval` paces
    /// the tries, so decisions go back to Redis within a probe or two of it coming up.
    ///
    /// # Errors
    /// [`Error::Redis`] if the redis crate refuses the connection's settings; never because
    /// Redis is unreachable.
    pub fn connect(client: redis::Client, options: Options) -> Result<Self, Error> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            // The limiter bounds each call itself, and a reply late for one call is still
            // read off the connection.
            .set_response_timeout(None)
            .set_number_of_retries(0);
        let connection = client
            .get_connection_manager_lazy(config)
            .map_err(Error::Redis)?;
        Ok(AsyncLimiter::new(connection, options))
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> AsyncLimiter<C> {
    /// A limiter on `connection` with `options` (which carry the failure policy).
    ///
    /// A `redis::cluster_async::ClusterConnection` is known as a cluster client (see
    /// [`crate::Connect::cluster`]); any other connection as a single-node one.
    pub fn new(connection: C, options: Options) -> Self {
        // The redis crate's async cluster connection, whatever module path it is defined at
        // (a test on a cluster holds this).
        let name = std::any::type_name::<C>();
        let cluster = name.starts_with("redis::") && name.contains("ClusterConnection");
        AsyncLimiter {
            connection,
            engine: Engine::new(options, cluster),
            detecting: tokio::sync::Mutex::new(()),
        }
    }

    /// The connection the limiter sends on, for a caller's own commands (leases,
    /// reservations) beside the limiter's. They get none of the limiter's failure policy.
    pub fn connection(&self) -> &C {
        &self.connection
    }

    /// Decisions by source, and outages seen.
    pub fn counters(&self) -> Counters {
        self.engine.counters()
    }

    /// How Redis is reached; `None` before the first call that reached it.
    pub fn path(&self) -> Option<Path> {
        self.engine.path()
    }

    /// The startup check, as [`crate::Limiter::check`]: finds the path and returns it;
    /// `Ok(None)` (and a warning) when Redis is down or busy. Each peek runs under the
    /// limiter's deadline.
    ///
    /// # Errors
    /// As for [`crate::Limiter::check`]: [`Error::Misconfigured`] with the cause.
    pub async fn check(&self) -> Result<Option<Path>, Error> {
        self.engine.forget_path();
        let limit = crate::engine::probe_limit()?;
        for key in crate::engine::probe_keys() {
            let items = [(Target::Key(key.as_str()), limit, 0.0)];
            if let Err(e) = self.call(Op::Peek, &items).await {
                return self.engine.checked(e);
            }
        }
        Ok(self.engine.checked_path())
    }

    /// Takes `cost` tokens from the bucket `key` of `limit`.
    ///
    /// # Errors
    /// As for [`crate::Limiter::acquire`].
    pub async fn acquire(&self, key: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        self.decide(Op::Acquire, Target::Key(key), limit, cost)
            .await
    }

    /// What [`AsyncLimiter::acquire`] would decide for `cost`, taking nothing.
    ///
    /// # Errors
    /// As for [`crate::Limiter::acquire`].
    pub async fn peek(&self, key: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        self.decide(Op::Peek, Target::Key(key), limit, cost).await
    }

    /// An acquire or a peek (`op`), of a key or of a table's field (`crate::table`).
    pub(crate) async fn decide(
        &self,
        op: Op,
        target: Target<'_>,
        limit: &Limit,
        cost: f64,
    ) -> Result<Decision, Error> {
        let cost = check_cost(cost)?;
        let key = target.key();
        let take = op.takes();
        if let Some(decision) = self.engine.before(key, limit, cost, take) {
            return Ok(decision);
        }
        let sent_at = Instant::now();
        let result = self.call(op, &[(target, *limit, cost)]).await;
        self.engine.after(result, (key, limit, cost), take, sent_at)
    }

    /// All or nothing, as [`crate::Limiter::acquire_all`]; in a cluster the keys need one
    /// hash tag.
    ///
    /// # Errors
    /// As for [`crate::Limiter::acquire_all`].
    pub async fn acquire_all(&self, items: &[(&str, Limit, f64)]) -> Result<MultiDecision, Error> {
        if items.is_empty() {
            return Err(Error::Invalid(
                "acquire_all needs at least one (key, limit, cost)",
            ));
        }
        for (_, _, cost) in items {
            check_cost(*cost)?;
        }
        if let Some(multi) = self.engine.before_multi(items) {
            return Ok(multi);
        }
        let sent_at = Instant::now();
        let targets: Vec<(Target<'_>, Limit, f64)> = items
            .iter()
            .map(|(key, limit, cost)| (Target::Key(key), *limit, *cost))
            .collect();
        let result = self.call(Op::Multi, &targets).await;
        self.engine.after_multi(result, items, sent_at)
    }

    /// [`Self::acquire_all`] over keys or table fields (all of one kind: RL.ACQUIRE.MULTI or
    /// RL.HACQUIRE.MULTI), each known to the deny cache and the policy by its key.
    pub(crate) async fn acquire_targets(
        &self,
        targets: &[(Target<'_>, Limit, f64)],
    ) -> Result<MultiDecision, Error> {
        let items: Vec<(&str, Limit, f64)> = targets
            .iter()
            .map(|(target, limit, cost)| (target.key(), *limit, *cost))
            .collect();
        if let Some(multi) = self.engine.before_multi(&items) {
            return Ok(multi);
        }
        let sent_at = Instant::now();
        let result = self.call(Op::Multi, targets).await;
        self.engine.after_multi(result, &items, sent_at)
    }

    /// All or nothing across hash slots, as [`crate::Limiter::acquire_across_slots`].
    ///
    /// # Errors
    /// As for [`crate::Limiter::acquire_across_slots`].
    pub async fn acquire_across_slots(
        &self,
        items: &[SlotItem<'_>],
    ) -> Result<SlotsDecision, Error> {
        let mut plan = Across::new(&self.engine, items)?;
        let mut step = plan.start();
        loop {
            step = match step {
                AcrossStep::Ask(args) => plan.answer(self.acquire_targets(&args).await),
                AcrossStep::Refund(args) => {
                    for (target, limit, cost) in args {
                        if let Err(e) = self.give_back(Op::Refund, target, &limit, cost).await {
                            let key = target.key();
                            log::warn!("redis-rl: giving back {key} after a refusal failed: {e}");
                        }
                    }
                    plan.refunded()
                }
                AcrossStep::Done(result) => return result,
            };
        }
    }

    /// Gives `cost` tokens back and clears the deny cache's entry for `key`.
    ///
    /// # Errors
    /// As for [`crate::Limiter::acquire`].
    pub async fn refund(&self, key: &str, limit: &Limit, cost: f64) -> Result<Refund, Error> {
        self.give_back(Op::Refund, Target::Key(key), limit, cost)
            .await
    }

    /// Charges `cost` tokens for work already done, as [`crate::Limiter::charge`].
    ///
    /// # Errors
    /// As for [`crate::Limiter::charge`].
    pub async fn charge(&self, key: &str, limit: &Limit, cost: f64) -> Result<Charged, Error> {
        self.charge_target(Target::Key(key), limit, cost).await
    }

    /// A charge of a key or of a table's field.
    pub(crate) async fn charge_target(
        &self,
        target: Target<'_>,
        limit: &Limit,
        cost: f64,
    ) -> Result<Charged, Error> {
        let cost = check_cost(cost)?;
        let key = target.key();
        if let Some(charged) = self.engine.before_charge(key, limit, cost) {
            return charged;
        }
        let sent_at = Instant::now();
        let result = self.call(Op::Charge, &[(target, *limit, cost)]).await;
        self.engine
            .after_charge(result, (key, limit, cost), sent_at)
    }

    /// A refund (`op`), of a key or of a table's field.
    pub(crate) async fn give_back(
        &self,
        op: Op,
        target: Target<'_>,
        limit: &Limit,
        cost: f64,
    ) -> Result<Refund, Error> {
        let cost = check_cost(cost)?;
        let key = target.key();
        if let Some(refund) = self.engine.before_refund(key, limit, cost) {
            return Ok(refund);
        }
        let result = self.call(op, &[(target, *limit, cost)]).await;
        self.engine.after_refund(result, (key, limit, cost))
    }

    // Leases and reservations ----------------------------------------------------------------

    /// Takes a lease, as [`crate::Limiter::lease`]. Prefer [`AsyncLimiter::hold`].
    ///
    /// # Errors
    /// As for [`crate::Limiter::lease`].
    pub async fn lease(
        &self,
        key: &str,
        limit: u32,
        ttl_ms: u64,
        id: Option<&str>,
    ) -> Result<Lease, Error> {
        let limit = lease::check_limit(limit)?;
        let ttl_ms = lease::check_ttl(ttl_ms)?;
        let (id, drawn) = lease::id_or_new(id)?;
        self.run(Call::Lease {
            key,
            limit,
            ttl_ms,
            id: &id,
            drawn,
        })
        .await?
        .lease()
    }

    /// Gives a lease back, as [`crate::Limiter::release`].
    ///
    /// # Errors
    /// As for [`crate::Limiter::lease`].
    pub async fn release(&self, key: &str, id: &str) -> Result<bool, Error> {
        let id = lease::check_held_id(id)?;
        self.run(Call::Release { key, id }).await?.flag()
    }

    /// Renews a held lease, as [`crate::Limiter::renew`].
    ///
    /// # Errors
    /// As for [`crate::Limiter::lease`].
    pub async fn renew(&self, key: &str, id: &str, ttl_ms: u64) -> Result<bool, Error> {
        let ttl_ms = lease::check_ttl(ttl_ms)?;
        let id = lease::check_held_id(id)?;
        self.run(Call::Renew { key, id, ttl_ms }).await?.flag()
    }

    /// Counts the leases held, as [`crate::Limiter::leases`].
    ///
    /// # Errors
    /// As for [`crate::Limiter::lease`].
    pub async fn leases(&self, key: &str, limit: u32) -> Result<LeaseCount, Error> {
        let limit = lease::check_limit(limit)?;
        self.run(Call::Leases { key, limit }).await?.count()
    }

    /// Takes an estimate now, as [`crate::Limiter::reserve`]; settle it with
    /// `reservation.settle(actual).await`.
    ///
    /// # Errors
    /// As for [`crate::Limiter::reserve`].
    pub async fn reserve(
        &self,
        key: &str,
        limit: &Limit,
        estimate: f64,
        ttl_ms: u64,
        id: Option<&str>,
    ) -> Result<Reservation<'_, Self>, Error> {
        let estimate = lease::check_estimate(estimate)?;
        let ttl_ms = lease::check_ttl(ttl_ms)?;
        let (id, drawn) = lease::id_or_new(id)?;
        let reserved = self
            .run(Call::Reserve {
                key,
                limit: *limit,
                estimate,
                ttl_ms,
                id: &id,
                drawn,
            })
            .await?
            .reserved()?;
        Ok(Reservation {
            limiter: self,
            reserved,
        })
    }

    /// Settles the reservation `id` of `key`, as [`crate::Limiter::settle`].
    ///
    /// # Errors
    /// As for [`crate::Limiter::settle`].
    pub async fn settle(
        &self,
        key: &str,
        limit: &Limit,
        id: &str,
        actual: f64,
    ) -> Result<Charged, Error> {
        let actual = lease::check_actual(actual)?;
        let id = lease::check_held_id(id)?;
        self.run(Call::Settle {
            key,
            limit: *limit,
            id,
            actual,
        })
        .await?
        .settled()
    }

    /// One lease or reservation call under the deadline, as the blocking limiter's.
    async fn run(&self, call: Call<'_>) -> Result<Answer, Error> {
        if let Some(answer) = self.engine.before_call(&call) {
            return answer;
        }
        let mut connection = self.connection.clone();
        let deadline = self.engine.options.timeout;
        let result =
            match tokio::time::timeout(deadline, self.call_exchange(&mut connection, call)).await {
                Ok(result) => result,
                Err(_) => Err(CallError::Timeout(deadline)),
            };
        self.engine.after_call(result, &call)
    }

    /// A lease or reservation call's exchange; on a cold limiter one call finds the path while
    /// the others wait for it.
    async fn call_exchange(&self, connection: &mut C, call: Call<'_>) -> Result<Value, CallError> {
        let _detecting = match self.engine.ready() {
            Some(_) => None,
            None => Some(self.detecting.lock().await),
        };
        let mut exchange = Exchange::of_call(&self.engine, call);
        let mut step = exchange.start();
        loop {
            step = match step {
                Step::Send(cmd) => exchange.reply(cmd.query_async(connection).await),
                Step::Done(result) => return result,
            };
        }
    }

    /// The engine, for a table's calls that are not decisions.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A connection with the detected path (detecting it first) and the deadline, for a
    /// table's calls that are not decisions.
    pub(crate) async fn connection_with_path(&self) -> Result<(C, Path), CallError> {
        let mut connection = self.connection.clone();
        let deadline = self.engine.options.timeout;
        let path = tokio::time::timeout(deadline, self.detected_path(&mut connection))
            .await
            .map_err(|_| CallError::Timeout(deadline))??;
        Ok((connection, path))
    }

    // The call into Redis ------------------------------------------------------------------

    async fn call(&self, op: Op, items: &[(Target<'_>, Limit, f64)]) -> Result<Value, CallError> {
        let mut connection = self.connection.clone();
        let deadline = self.engine.options.timeout;
        match tokio::time::timeout(deadline, self.call_on(&mut connection, op, items)).await {
            Ok(result) => result,
            Err(_) => Err(CallError::Timeout(deadline)),
        }
    }

    /// One call's exchange (`engine::Exchange`), each step awaited. On a cold limiter one
    /// call finds the path while the others wait for it.
    async fn call_on(
        &self,
        connection: &mut C,
        op: Op,
        items: &[(Target<'_>, Limit, f64)],
    ) -> Result<Value, CallError> {
        if self.engine.ready().is_none() {
            let _detecting = self.detecting.lock().await;
            if self.engine.ready().is_none() {
                return self.exchange(connection, op, items).await;
            }
        }
        self.exchange(connection, op, items).await
    }

    async fn exchange(
        &self,
        connection: &mut C,
        op: Op,
        items: &[(Target<'_>, Limit, f64)],
    ) -> Result<Value, CallError> {
        let mut exchange = Exchange::new(&self.engine, op, items);
        let mut step = exchange.start();
        loop {
            step = match step {
                Step::Send(cmd) => exchange.reply(cmd.query_async(connection).await),
                Step::Done(result) => return result,
            };
        }
    }

    /// The detected path, finding it first with a peek that writes nothing.
    async fn detected_path(&self, connection: &mut C) -> Result<Path, CallError> {
        if let Some(path) = self.engine.ready() {
            return Ok(path);
        }
        let limit = crate::engine::probe_limit().map_err(|e| CallError::Reply(e.to_string()))?;
        let key = crate::engine::probe_keys()
            .first()
            .map_or("redis-rl:check", String::as_str);
        self.call_on(connection, Op::Peek, &[(Target::Key(key), limit, 0.0)])
            .await?;
        self.engine
            .ready()
            .ok_or_else(|| CallError::Reply("no path after a detection".into()))
    }
}
