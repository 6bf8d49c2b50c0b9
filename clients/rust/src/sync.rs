//! The blocking limiter, on a `redis::Client` or a `redis::cluster::ClusterClient`.
//!
//! It keeps one connection, made through [`Connect`] with the call's deadline as connect, read
//! and write timeouts, and drops it on a connection error so the next call (the next probe,
//! during an outage) connects again. Calls take turns on it; a call waits for its turn at
//! most the deadline, then the failure policy decides. The rules live in `engine`.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisResult, Value};

use crate::engine::{Answer, Engine, Exchange, Path, Step, Target};
use crate::lease::{self, Call, Lease, LeaseCount, Reservation};
use crate::op::{CallError, Op};
use crate::slots::{Across, AcrossStep, SlotItem, SlotsDecision};
use crate::types::{
    check_cost, Charged, Counters, Decision, Error, Limit, MultiDecision, Options, Refund,
};

/// How the blocking limiter opens a connection with a deadline.
pub trait Connect {
    /// The connection it opens.
    type Connection: ConnectionLike;

    /// Opens a connection whose connect, read and write each give up after `timeout`.
    ///
    /// # Errors
    /// The connection error (refused, timed out …), which the failure policy then decides.
    fn connect(&self, timeout: Duration) -> RedisResult<Self::Connection>;

    /// Whether the connections route each key to its cluster slot (a cluster client). Then
    /// CROSSSLOT is the caller's keys spanning slots rather than a single-node client on a
    /// cluster, and a table's `len` off the module path is refused (SCAN cannot reach every
    /// node through it).
    fn cluster(&self) -> bool {
        false
    }
}

impl Connect for redis::Client {
    type Connection = redis::Connection;

    fn connect(&self, timeout: Duration) -> RedisResult<redis::Connection> {
        let connection = self.get_connection_with_timeout(timeout)?;
        connection.set_read_timeout(Some(timeout))?;
        connection.set_write_timeout(Some(timeout))?;
        Ok(connection)
    }
}

/// A cluster connection: build the `ClusterClient` with `.connection_timeout(..)` and
/// `.response_timeout(..)` as short as the limiter's deadline; the read and write timeouts
/// are set here.
impl Connect for redis::cluster::ClusterClient {
    type Connection = redis::cluster::ClusterConnection;

    /// A seed node that answers but gives no slots (a standalone server answers CLUSTER SLOTS
    /// with an error, which the redis crate reads as no slots) leaves a connection to no node:
    /// a PING, which goes to every node, then finds none, and that is told apart from a
    /// cluster that cannot be reached (no seed answers: the connect itself fails).
    fn connect(&self, timeout: Duration) -> RedisResult<redis::cluster::ClusterConnection> {
        let mut connection = self.get_connection()?;
        connection.set_read_timeout(Some(timeout))?;
        connection.set_write_timeout(Some(timeout))?;
        if let Err(e) = redis::cmd("PING").query::<Value>(&mut connection) {
            if e.kind() == redis::ErrorKind::ClusterConnectionNotFound {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    crate::diagnose::NO_SLOTS,
                )));
            }
            return Err(e);
        }
        Ok(connection)
    }

    fn cluster(&self) -> bool {
        true
    }
}

/// Rate limits on Redis with the redis-rl module (or its Lua fallback), with an explicit
/// failure policy, blocking. Share one across threads; calls take turns on its connection, so
/// a busy service gives each worker its own, or uses [`crate::AsyncLimiter`].
///
/// ```no_run
/// use redis_rl_client::{Limit, Limiter, OnError, Options};
///
/// let client = redis::Client::open("redis://127.0.0.1/")?;
/// let limiter = Limiter::new(client, Options::new(OnError::Local).instances(4).deny_cache(true));
/// let d = limiter.acquire("user:42", &Limit::new(5.0, 10.0)?, 1.0)?;
/// if !d.allowed {
///     // 429 with d.headers()
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Limiter<K: Connect = redis::Client> {
    connector: K,
    connection: Mutex<Slot<K::Connection>>,
    /// Signalled when a call gives the connection back.
    freed: Condvar,
    engine: Engine,
}

/// The connection, and whether a call has it now (it is taken out of the lock for the call,
/// so waiting for it can be bounded).
struct Slot<C> {
    connection: Option<C>,
    busy: bool,
}

/// One call's turn on the connection: gives it back (or drops it) and wakes the next waiter,
/// even if the call panicked.
struct Turn<'a, K: Connect> {
    limiter: &'a Limiter<K>,
    connection: Option<K::Connection>,
}

impl<K: Connect> Drop for Turn<'_, K> {
    fn drop(&mut self) {
        let mut slot = self.limiter.lock();
        slot.busy = false;
        slot.connection = self.connection.take();
        drop(slot);
        self.limiter.freed.notify_one();
    }
}

impl<K: Connect> Limiter<K> {
    /// A limiter on `connector` with `options` (which carry the failure policy).
    pub fn new(connector: K, options: Options) -> Self {
        let cluster = connector.cluster();
        Limiter {
            connector,
            connection: Mutex::new(Slot {
                connection: None,
                busy: false,
            }),
            freed: Condvar::new(),
            engine: Engine::new(options, cluster),
        }
    }

    /// Decisions by source, and outages seen.
    pub fn counters(&self) -> Counters {
        self.engine.counters()
    }

    /// How Redis is reached; `None` before the first call that reached it.
    pub fn path(&self) -> Option<Path> {
        self.engine.path()
    }

    /// The startup check: contacts Redis, finds the path (module, Functions library, script)
    /// by sending peeks that write nothing (on keys spread over the cluster slots, so a
    /// single-node client on a cluster meets a MOVED), and returns it. Call it once when the
    /// service starts, so a misconfigured Redis stops it with its cause rather than leaving
    /// every call to the failure policy.
    ///
    /// When Redis is down or busy it returns `Ok(None)` and logs a warning: the service can
    /// start, and the failure policy decides until Redis answers.
    ///
    /// # Errors
    /// [`Error::Misconfigured`] naming the cause and its fix: authentication refused, a
    /// missing ACL permission (the command and the rule to add), a `ClusterClient` on a
    /// standalone server or a `redis::Client` on a cluster, no module under
    /// `WithoutModule::Refuse`; [`Error::Redis`] for another error reply.
    pub fn check(&self) -> Result<Option<Path>, Error> {
        self.engine.forget_path();
        let limit = crate::engine::probe_limit()?;
        for key in crate::engine::probe_keys() {
            let items = [(Target::Key(key.as_str()), limit, 0.0)];
            if let Err(e) = self.call(Op::Peek, &items) {
                return self.engine.checked(e);
            }
        }
        Ok(self.engine.checked_path())
    }

    /// Takes `cost` tokens from the bucket `key` of `limit`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad cost; [`Error::Redis`] for an error reply the failure
    /// policy does not cover (WRONGTYPE). Outages and misconfigurations (see
    /// [`Limiter::check`]) are decided by the policy, not returned.
    pub fn acquire(&self, key: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        self.decide(Op::Acquire, Target::Key(key), limit, cost)
    }

    /// What [`Limiter::acquire`] would decide for `cost`, taking nothing.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub fn peek(&self, key: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        self.decide(Op::Peek, Target::Key(key), limit, cost)
    }

    /// An acquire or a peek (`op`), of a key or of a table's field (`crate::table`).
    pub(crate) fn decide(
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
        let result = self.call(op, &[(target, *limit, cost)]);
        self.engine.after(result, (key, limit, cost), take, sent_at)
    }

    /// All or nothing over `(key, limit, cost)`: takes every bucket's cost if each holds it,
    /// else nothing (RL.ACQUIRE.MULTI). In a cluster every key must hash to one slot: give
    /// them one hash tag, as in `{user:42}:s` and `{user:42}:h`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for no items or a bad cost, and as for [`Limiter::acquire`].
    pub fn acquire_all(&self, items: &[(&str, Limit, f64)]) -> Result<MultiDecision, Error> {
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
        let result = self.call(Op::Multi, &targets);
        self.engine.after_multi(result, items, sent_at)
    }

    /// [`Self::acquire_all`] over keys or table fields (all of one kind: RL.ACQUIRE.MULTI or
    /// RL.HACQUIRE.MULTI), each known to the deny cache and the policy by its key.
    pub(crate) fn acquire_targets(
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
        let result = self.call(Op::Multi, targets);
        self.engine.after_multi(result, &items, sent_at)
    }

    /// All or nothing over `items`, whatever slots their keys hash to: one
    /// [`Limiter::acquire_all`] on one server; on a cluster (learnt from its first CROSSSLOT
    /// reply) one per hash slot, in slot order, refunding the slots already taken when a later
    /// one refuses or fails. A shadow item's refusal is reported but does not refuse the call.
    /// The deny cache and the failure policy apply to each `acquire_all`, and
    /// [`SlotsDecision::sources`] says who decided each.
    ///
    /// On a cluster it is not atomic: between a slot's take and its refund (one round trip)
    /// other calls see that slot's buckets short of the tokens given back.
    ///
    /// ```no_run
    /// use redis_rl_client::{Limit, Limiter, OnError, Options, SlotItem};
    ///
    /// let limiter = Limiter::new(redis::Client::open("redis://127.0.0.1/")?, Options::new(OnError::Closed));
    /// let per_user = Limit::new(1.0, 10.0)?;
    /// let per_route = Limit::new(100.0, 100.0)?;
    /// let d = limiter.acquire_across_slots(&[
    ///     SlotItem::new("user:42", per_user, 1.0),
    ///     SlotItem::new("route:/search", per_route, 1.0).shadow(),
    /// ])?;
    /// # let _ = d.allowed;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Invalid`] for no items or a bad cost, and as for [`Limiter::acquire`] (after
    /// the slots already taken are refunded).
    pub fn acquire_across_slots(&self, items: &[SlotItem<'_>]) -> Result<SlotsDecision, Error> {
        let mut plan = Across::new(&self.engine, items)?;
        let mut step = plan.start();
        loop {
            step = match step {
                AcrossStep::Ask(args) => plan.answer(self.acquire_targets(&args)),
                AcrossStep::Refund(args) => {
                    for (target, limit, cost) in args {
                        if let Err(e) = self.give_back(Op::Refund, target, &limit, cost) {
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

    /// Gives `cost` tokens back (a request that failed before doing any work), capped at the
    /// capacity, and clears the deny cache's entry for `key`.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub fn refund(&self, key: &str, limit: &Limit, cost: f64) -> Result<Refund, Error> {
        self.give_back(Op::Refund, Target::Key(key), limit, cost)
    }

    /// Charges `cost` tokens to the bucket `key` of `limit` for work already done
    /// (RL.CHARGE): post-paid, it always applies, and may take the bucket below zero. While
    /// the bucket is in debt every acquire is denied, cost 0 included, until refill repays
    /// it ([`Charged::retry_after_ms`]). Use it when the cost is known only afterwards
    /// (tokens of a response, bytes sent); `acquire` with an estimate first if the request
    /// must be refused up front.
    ///
    /// ```no_run
    /// use redis_rl_client::{Limit, Limiter, OnError, Options};
    ///
    /// let limiter = Limiter::new(redis::Client::open("redis://127.0.0.1/")?, Options::new(OnError::Local));
    /// let per_user = Limit::new(1000.0, 10_000.0)?; // 1000 tokens/s, bursts of 10,000
    /// let used = 12_500.0; // what the request turned out to cost
    /// let c = limiter.charge("llm:user:42", &per_user, used)?;
    /// if c.in_debt() { /* later requests get 429 until c.retry_after_ms */ }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad cost; [`Error::Redis`] (or, on the `Local` policy,
    /// [`Error::Invalid`]) when the charge would leave the bucket in debt for more than 100
    /// years, and nothing is written; and as for [`Limiter::acquire`].
    pub fn charge(&self, key: &str, limit: &Limit, cost: f64) -> Result<Charged, Error> {
        self.charge_target(Target::Key(key), limit, cost)
    }

    /// A charge of a key or of a table's field.
    pub(crate) fn charge_target(
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
        let result = self.call(Op::Charge, &[(target, *limit, cost)]);
        self.engine
            .after_charge(result, (key, limit, cost), sent_at)
    }

    /// A refund (`op`), of a key or of a table's field.
    pub(crate) fn give_back(
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
        let result = self.call(op, &[(target, *limit, cost)]);
        self.engine.after_refund(result, (key, limit, cost))
    }

    // Leases and reservations ----------------------------------------------------------------

    /// Takes a lease at `key` if fewer than `limit` are held (RL.LEASE): one slot of work in
    /// flight for `ttl_ms`, unless released or renewed first. With `id` (1 to 16 bytes) a
    /// retried take is answered as held; without, an id is drawn here (16 hex characters).
    /// An id starting `open:` or `local:` is refused (the failure policy's). Prefer
    /// [`Limiter::hold`], whose guard releases the lease when dropped.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming a bad argument; [`Error::Redis`] for an error reply the
    /// failure policy does not cover (WRONGTYPE). Outages are decided by the policy: `Open`
    /// allows (an id starting `open:`, never sent to Redis), `Closed` denies, `Local` takes a
    /// lease in an in-process table, `limit / instances` per key (an id starting `local:`
    /// unless the caller gave one; released and renewed here, even once Redis is back).
    pub fn lease(
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
        })?
        .lease()
    }

    /// Gives a lease back (RL.RELEASE): `true` if it was held. An `open:` or `local:` id, or
    /// one the `Local` policy holds, never goes to Redis.
    ///
    /// # Errors
    /// As for [`Limiter::lease`].
    pub fn release(&self, key: &str, id: &str) -> Result<bool, Error> {
        let id = lease::check_held_id(id)?;
        self.run(Call::Release { key, id })?.flag()
    }

    /// Makes a held lease expire `ttl_ms` from now (RL.RENEW): `true` if it was held.
    ///
    /// # Errors
    /// As for [`Limiter::lease`].
    pub fn renew(&self, key: &str, id: &str, ttl_ms: u64) -> Result<bool, Error> {
        let ttl_ms = lease::check_ttl(ttl_ms)?;
        let id = lease::check_held_id(id)?;
        self.run(Call::Renew { key, id, ttl_ms })?.flag()
    }

    /// Counts the leases held at `key` and how long a take under `limit` would wait
    /// (RL.LEASES), writing nothing.
    ///
    /// # Errors
    /// As for [`Limiter::lease`].
    pub fn leases(&self, key: &str, limit: u32) -> Result<LeaseCount, Error> {
        let limit = lease::check_limit(limit)?;
        self.run(Call::Leases { key, limit })?.count()
    }

    /// Takes `estimate` tokens now from the bucket `key` of `limit`, as an acquire of that
    /// cost, and records the take for `ttl_ms` (RL.RESERVE); settle it with
    /// [`Reservation::settle`] once the actual cost is known. One never settled stands as
    /// taken.
    ///
    /// ```no_run
    /// use redis_rl_client::{Limit, Limiter, OnError, Options};
    ///
    /// let limiter = Limiter::new(redis::Client::open("redis://127.0.0.1/")?, Options::new(OnError::Local));
    /// let tpm = Limit::per(10_000, std::time::Duration::from_secs(60))?;
    /// let r = limiter.reserve("llm:tenant:7", &tpm, 1000.0, 60_000, None)?;
    /// if r.allowed {
    ///     let used = 640.0; // known when the answer ends
    ///     let settled = r.settle(used)?;
    ///     # let _ = settled;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As for [`Limiter::lease`]; [`Error::Invalid`] for an estimate not above 0.
    pub fn reserve(
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
            })?
            .reserved()?;
        Ok(Reservation {
            limiter: self,
            reserved,
        })
    }

    /// Settles the reservation `id` of `key` with its `actual` cost (RL.SETTLE), once: the
    /// over-estimate goes back, the under-estimate is charged (into debt). For a reservation
    /// made elsewhere (another process); [`Reservation::settle`] otherwise. An `open:` id
    /// settles nothing; a `local:` one, or one the `Local` policy holds, is settled here. A
    /// reservation Redis holds, while Redis cannot answer, is not settled: the answer has
    /// `applied` false, is counted in [`crate::Counters::unapplied_charges`] and logged.
    ///
    /// # Errors
    /// [`Error::Redis`] when `id` is not an open reservation of `key` (settled, expired or
    /// never made; [`Error::Invalid`] for one the `Local` policy made), and as for
    /// [`Limiter::lease`].
    pub fn settle(
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
        })?
        .settled()
    }

    /// One lease or reservation call: without Redis when the policy or a local id answers
    /// it, else its exchange.
    fn run(&self, call: Call<'_>) -> Result<Answer, Error> {
        if let Some(answer) = self.engine.before_call(&call) {
            return answer;
        }
        let result = self.with_connection(|connection| {
            let mut exchange = Exchange::of_call(&self.engine, call);
            let mut step = exchange.start();
            loop {
                step = match step {
                    Step::Send(cmd) => exchange.reply(cmd.query(connection)),
                    Step::Done(result) => return result,
                };
            }
        });
        self.engine.after_call(result, &call)
    }

    /// The engine, for a table's calls that are not decisions.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    // The call into Redis ------------------------------------------------------------------

    fn lock(&self) -> MutexGuard<'_, Slot<K::Connection>> {
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn call(&self, op: Op, items: &[(Target<'_>, Limit, f64)]) -> Result<Value, CallError> {
        self.with_connection(|connection| self.call_on(connection, op, items))
    }

    /// Waits for the connection's turn, at most the deadline: a call queued behind others
    /// on a slow Redis must not wait for all of them before its policy decides.
    fn turn(&self) -> Result<Turn<'_, K>, CallError> {
        let deadline = self.engine.options.timeout;
        let until = Instant::now() + deadline;
        let mut slot = self.lock();
        while slot.busy {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CallError::Busy(deadline));
            }
            slot = match self.freed.wait_timeout(slot, left) {
                Ok((slot, _)) => slot,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        slot.busy = true;
        Ok(Turn {
            limiter: self,
            connection: slot.connection.take(),
        })
    }

    /// Runs `work` on the connection, connecting first if there is none, and drops it when
    /// Redis is unavailable so the next try connects again.
    fn with_connection<T>(
        &self,
        work: impl FnOnce(&mut K::Connection) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        let mut turn = self.turn()?;
        let result = match turn.connection.as_mut() {
            Some(connection) => work(connection),
            None => match self.connector.connect(self.engine.options.timeout) {
                Ok(connection) => work(turn.connection.insert(connection)),
                Err(e) => Err(CallError::of(e, self.engine.cluster_client)),
            },
        };
        if result.as_ref().is_err_and(CallError::unavailable) {
            turn.connection = None; // connect again on the next try
        }
        result
    }

    /// Runs `work` with the detected path (detecting it first), for a table's calls that are
    /// not decisions: what it returns, errors and all, goes back to the caller as it is.
    pub(crate) fn with_path<T>(
        &self,
        work: impl FnOnce(&mut K::Connection, Path) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        self.with_connection(|connection| {
            let path = match self.engine.ready() {
                Some(path) => path,
                None => self.detect(connection)?,
            };
            work(connection, path)
        })
    }

    /// One call's exchange (`engine::Exchange`), each step sent blocking.
    fn call_on(
        &self,
        connection: &mut K::Connection,
        op: Op,
        items: &[(Target<'_>, Limit, f64)],
    ) -> Result<Value, CallError> {
        let mut exchange = Exchange::new(&self.engine, op, items);
        let mut step = exchange.start();
        loop {
            step = match step {
                Step::Send(cmd) => exchange.reply(cmd.query(connection)),
                Step::Done(result) => return result,
            };
        }
    }

    /// Finds the path with a peek that writes nothing (the first call's own detection).
    fn detect(&self, connection: &mut K::Connection) -> Result<Path, CallError> {
        let limit = crate::engine::probe_limit().map_err(|e| CallError::Reply(e.to_string()))?;
        let key = crate::engine::probe_keys()
            .first()
            .map_or("redis-rl:check", String::as_str);
        self.call_on(connection, Op::Peek, &[(Target::Key(key), limit, 0.0)])?;
        self.engine
            .ready()
            .ok_or_else(|| CallError::Reply("no path after a detection".into()))
    }
}
