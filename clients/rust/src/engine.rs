//! What the sync and async limiters share: which path reaches Redis (module, Functions
//! library, script, or none), the outage and its counters, misconfigurations, the deny cache
//! and the local buckets, behind one lock; the commands to send; the replies read back. What
//! a call asks for and why it gave no reply (`Op`, `CallError`) are `op`'s, so that the leases
//! read their replies without the engine.
//!
//! Nothing here does I/O. One call's conversation with Redis is an [`Exchange`]: the path is
//! found by sending the call itself and reading the error (module, then Functions, then
//! script; never COMMAND, INFO or SCRIPT LOAD), the script goes as EVALSHA of its locally
//! computed SHA-1 and again as EVAL on NOSCRIPT, and a path that stops answering is looked
//! for again; a fallback that meets a key of another type (WRONGTYPE) asks the module, loaded
//! since, once. `sync` and `asynch` send each command it asks for and hand back the reply,
//! blocking or awaited, and that loop is all they repeat. The lock is never held across a call
//! into Redis. What each error reply means is `diagnose`'s.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{RedisError, Value};

use crate::diagnose::{
    self, is_denied, is_function_not_found, is_noscript, is_unavailable, is_unknown_command,
    is_wrongtype,
};
use crate::lease::{self, Call, Lease, LeaseCount, LocalLeases, Reserved};
use crate::local::{DenyCache, LocalBuckets, Reply};
use crate::op::{module_name, CallError, Op};
use crate::script;
use crate::types::{
    number, Charged, Counters, Decision, Error, Limit, MultiDecision, OnError, Options, Refund,
    Source, WithoutModule, CLOSED_RETRY_AFTER_MS, DEBT_ERROR,
};

/// The bucket a call is about: a key of its own, or a field of a bucket table
/// (`crate::table`), each part kept as it is rather than encoded into one string and split
/// back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// A bucket of its own, at `key`.
    Key(&'a str),
    /// A table's field: RL.H* on `table` (`name:{i}`) and `field` on the module path; the
    /// field's fallback key `name:{i}:field` everywhere else.
    Field {
        table: &'a str,
        field: &'a str,
        fallback_key: &'a str,
    },
}

impl<'a> Target<'a> {
    /// The name the deny cache, the `Local` policy and the Lua path know the bucket by.
    pub(crate) fn key(self) -> &'a str {
        match self {
            Target::Key(key) => key,
            Target::Field { fallback_key, .. } => fallback_key,
        }
    }
}

/// How Redis is reached, once detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// RL.* commands of the module.
    Module,
    /// The Functions library `redis_rl` through FCALL (FCALL_RO for peeks), loaded by an
    /// admin with [`crate::load_functions`].
    Functions,
    /// The Lua script through EVALSHA of its SHA-1, or EVAL when the server has not cached
    /// it (or EVALSHA is not allowed).
    Lua,
    /// No module, and `WithoutModule::Refuse`: a misconfiguration.
    Missing,
}

impl Path {
    /// The lowercase name the other libraries use: "module", "functions", "lua", "missing".
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Module => "module",
            Path::Functions => "functions",
            Path::Lua => "lua",
            Path::Missing => "missing",
        }
    }
}

/// How often one misconfiguration's cause is logged again while it lasts.
const MISCONFIGURED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Why the failure policy decides a call: Redis is down or busy, or misconfigured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    Outage,
    Misconfigured,
}

/// The answer to a lease or reservation call, whichever it was.
#[derive(Debug)]
pub(crate) enum Answer {
    Lease(Lease),
    /// RL.RELEASE's or RL.RENEW's.
    Flag(bool),
    Count(LeaseCount),
    Reserved(Reserved),
    Settled(Charged),
}

impl Answer {
    fn unexpected(self, what: &str) -> Error {
        Error::Reply(format!("{what}: {self:?}"))
    }

    pub(crate) fn lease(self) -> Result<Lease, Error> {
        match self {
            Answer::Lease(lease) => Ok(lease),
            other => Err(other.unexpected("a lease's answer")),
        }
    }

    pub(crate) fn flag(self) -> Result<bool, Error> {
        match self {
            Answer::Flag(flag) => Ok(flag),
            other => Err(other.unexpected("a release's or renew's answer")),
        }
    }

    pub(crate) fn count(self) -> Result<LeaseCount, Error> {
        match self {
            Answer::Count(count) => Ok(count),
            other => Err(other.unexpected("a count's answer")),
        }
    }

    pub(crate) fn reserved(self) -> Result<Reserved, Error> {
        match self {
            Answer::Reserved(reserved) => Ok(reserved),
            other => Err(other.unexpected("a reserve's answer")),
        }
    }

    pub(crate) fn settled(self) -> Result<Charged, Error> {
        match self {
            Answer::Settled(settled) => Ok(settled),
            other => Err(other.unexpected("a settle's answer")),
        }
    }
}

/// One limiter's state; see [`crate::Limiter`] for the meaning of each option.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) options: Options,
    /// The local buckets' clock: microseconds since this engine was built, plus one second so
    /// no instant is 0 (a state is a nonzero instant). Monotonic, so a wall clock stepping
    /// back cannot refill them.
    epoch: Instant,
    /// Whether the connection is a cluster client's (it routes each key to its slot): then a
    /// CROSSSLOT reply is the caller's keys spanning slots, not a misconfiguration, and SCAN
    /// cannot count a table's keys.
    pub(crate) cluster_client: bool,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: Option<Path>,
    /// EVALSHA is refused to this user but EVAL is not: the script path sends EVAL.
    eval_only: bool,
    /// Redis answered CROSSSLOT once, or the client is a cluster client: a cluster
    /// (`crate::slots`).
    cluster: bool,
    /// When each misconfiguration's cause was last logged.
    misconfigured_logged: HashMap<String, Instant>,
    counters: Counters,
    down_since: Option<Instant>,
    next_probe: Instant,
    /// Decisions taken without Redis in the current outage.
    without_redis: u64,
    /// When "busy, not down" was last logged: at most once a second.
    busy_logged: Option<Instant>,
    cache: DenyCache,
    local: LocalBuckets,
    leases: LocalLeases,
}

impl Engine {
    pub(crate) fn new(options: Options, cluster_client: bool) -> Engine {
        let now = Instant::now();
        Engine {
            epoch: now,
            cluster_client,
            inner: Mutex::new(Inner {
                path: None,
                eval_only: false,
                cluster: cluster_client,
                misconfigured_logged: HashMap::new(),
                counters: Counters::default(),
                down_since: None,
                next_probe: now,
                without_redis: 0,
                busy_logged: None,
                cache: DenyCache::new(options.deny_cache),
                local: LocalBuckets::new(options.instances, options.local_max_keys),
                leases: LocalLeases::new(options.instances, options.local_max_keys),
            }),
            options,
        }
    }

    /// The lock, even if a thread panicked holding it: every field stays consistent between
    /// statements, so the state is still usable.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn counters(&self) -> Counters {
        self.lock().counters
    }

    pub(crate) fn path(&self) -> Option<Path> {
        self.lock().path
    }

    /// Whether Redis has shown itself a cluster (a CROSSSLOT reply).
    pub(crate) fn is_cluster(&self) -> bool {
        self.lock().cluster
    }

    pub(crate) fn set_cluster(&self) {
        let mut inner = self.lock();
        if !inner.cluster {
            log::info!("redis-rl: a cluster: calls across slots go slot by slot");
        }
        inner.cluster = true;
    }

    fn now_us(&self) -> u64 {
        let us = self.epoch.elapsed().as_micros().saturating_add(1_000_000);
        u64::try_from(us).unwrap_or(u64::MAX)
    }

    // The shield ---------------------------------------------------------------------------

    /// A denial from the deny cache, counted, or `None`.
    pub(crate) fn cached(&self, key: &str, limit: &Limit, cost: f64) -> Option<Decision> {
        let mut inner = self.lock();
        if !inner.cache.enabled() {
            return None;
        }
        let (remaining, retry_after_ms, reset_after_ms) =
            inner.cache.lookup(key, limit, cost, Instant::now())?;
        inner.counters.count(Source::Cache);
        Some(Decision {
            allowed: false,
            remaining,
            retry_after_ms,
            reset_after_ms,
            limit: *limit,
            source: Source::Cache,
        })
    }

    pub(crate) fn remember(&self, key: &str, cost: f64, decision: &Decision, sent_at: Instant) {
        if decision.allowed {
            return;
        }
        let mut inner = self.lock();
        if inner.cache.enabled() {
            inner.cache.remember(key, cost, decision, sent_at);
        }
    }

    pub(crate) fn forget(&self, key: &str) {
        self.lock().cache.forget(key);
    }

    /// A bucket reset elsewhere (a table's delete) is full: drops its deny-cache entry and its
    /// local bucket.
    pub(crate) fn reset(&self, key: &str) {
        let mut inner = self.lock();
        inner.cache.forget(key);
        inner.local.forget(key);
    }

    // The failure policy -------------------------------------------------------------------

    /// During an outage, Redis is tried again only every `probe_interval`.
    pub(crate) fn skip_redis(&self) -> bool {
        let mut inner = self.lock();
        if inner.down_since.is_none() {
            return false;
        }
        let now = Instant::now();
        if now >= inner.next_probe {
            inner.next_probe = now + self.options.probe_interval;
            return false;
        }
        true
    }

    /// Redis answered: counts it, and ends an outage (logged once).
    pub(crate) fn answered(&self) -> Source {
        let mut inner = self.lock();
        let source = match inner.path {
            Some(Path::Lua) => Source::Lua,
            Some(Path::Functions) => Source::Functions,
            _ => Source::Redis,
        };
        inner.counters.count(source);
        if let Some(since) = inner.down_since.take() {
            log::warn!(
                "redis-rl: Redis answers again after {:.1} s; {} decisions were taken without \
                 it (on_error={:?})",
                since.elapsed().as_secs_f64(),
                inner.without_redis,
                self.options.on_error
            );
            inner.without_redis = 0;
        }
        source
    }

    /// Redis could not answer: starts an outage (logged once, not once per call). A call
    /// that never had its turn on the connection (`Busy`) is counted and logged apart, at
    /// most once a second, and starts no outage: the next call goes to Redis.
    /// A misconfiguration is logged at error level with its cause (each cause at most once
    /// every 10 s) and starts no outage: the next call goes to Redis again.
    pub(crate) fn failed(&self, error: &CallError) {
        let mut inner = self.lock();
        if let CallError::Misconfigured(cause) = error {
            let now = Instant::now();
            let due = inner
                .misconfigured_logged
                .get(cause)
                .is_none_or(|at| now.duration_since(*at) >= MISCONFIGURED_LOG_EVERY);
            if due {
                if inner.misconfigured_logged.len() >= 64 {
                    inner.misconfigured_logged.clear();
                }
                inner.misconfigured_logged.insert(cause.clone(), now);
                log::error!(
                    "redis-rl: Redis is misconfigured for this client: {cause}; deciding with \
                     on_error={:?} (not an outage)",
                    self.options.on_error
                );
            }
            return;
        }
        if let CallError::Busy(_) = error {
            inner.counters.busy = inner.counters.busy.saturating_add(1);
            let now = Instant::now();
            if inner
                .busy_logged
                .is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_secs(1))
            {
                inner.busy_logged = Some(now);
                log::warn!(
                    "redis-rl: busy, not down ({}); deciding this call with on_error={:?}",
                    error.describe(),
                    self.options.on_error
                );
            }
            return;
        }
        if inner.down_since.is_none() {
            let now = Instant::now();
            inner.down_since = Some(now);
            inner.next_probe = now + self.options.probe_interval;
            inner.counters.outages = inner.counters.outages.saturating_add(1);
            log::warn!(
                "redis-rl: Redis cannot decide ({}); deciding with on_error={:?} until it answers",
                error.describe(),
                self.options.on_error
            );
        }
    }

    fn count_policy(&self, inner: &mut Inner, why: Why) -> Source {
        let source = match self.options.on_error {
            OnError::Open => Source::Open,
            OnError::Closed => Source::Closed,
            OnError::Local => Source::Local,
        };
        if why == Why::Misconfigured {
            inner.counters.misconfigured = inner.counters.misconfigured.saturating_add(1);
            return source;
        }
        inner.counters.count(source);
        inner.without_redis = inner.without_redis.saturating_add(1);
        source
    }

    /// Why the policy decides after `e`.
    fn why(e: &CallError) -> Why {
        match e {
            CallError::Misconfigured(_) => Why::Misconfigured,
            _ => Why::Outage,
        }
    }

    pub(crate) fn policy_acquire(
        &self,
        key: &str,
        limit: &Limit,
        cost: f64,
        take: bool,
        why: Why,
    ) -> Decision {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner, why);
        let reply = match source {
            Source::Open => open_reply(),
            Source::Closed => closed_reply(),
            _ => inner.local.acquire(key, limit, cost, now_us, take),
        };
        decision(reply, limit, source)
    }

    pub(crate) fn policy_acquire_all(
        &self,
        items: &[(&str, Limit, f64)],
        why: Why,
    ) -> MultiDecision {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner, why);
        let (allowed, refused_index, retry_after_ms, replies) = match source {
            Source::Open => (true, None, 0, vec![open_reply(); items.len()]),
            Source::Closed => (
                false,
                Some(0),
                CLOSED_RETRY_AFTER_MS,
                vec![closed_reply(); items.len()],
            ),
            _ => inner.local.acquire_all(items, now_us),
        };
        MultiDecision {
            allowed,
            refused_index,
            retry_after_ms,
            decisions: replies
                .into_iter()
                .zip(items)
                .map(|(reply, (_, limit, _))| decision(reply, limit, source))
                .collect(),
            source,
        }
    }

    pub(crate) fn policy_refund(&self, key: &str, limit: &Limit, cost: f64, why: Why) -> Refund {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner, why);
        let (remaining, reset_after_ms) = match source {
            Source::Local => inner.local.refund(key, limit, cost, now_us),
            _ => (0, 0),
        };
        Refund {
            remaining,
            reset_after_ms,
            source,
        }
    }

    // One call's flow, shared by the sync and async limiters ------------------------------

    /// Before asking Redis for an acquire or peek: the deny cache's answer, or the policy's
    /// during an outage between probes.
    pub(crate) fn before(
        &self,
        key: &str,
        limit: &Limit,
        cost: f64,
        take: bool,
    ) -> Option<Decision> {
        if take {
            if let Some(hit) = self.cached(key, limit, cost) {
                return Some(hit);
            }
        }
        self.skip_redis()
            .then(|| self.policy_acquire(key, limit, cost, take, Why::Outage))
    }

    /// After asking Redis for an acquire or peek sent at `sent_at`.
    pub(crate) fn after(
        &self,
        result: Result<Value, CallError>,
        (key, limit, cost): (&str, &Limit, f64),
        take: bool,
        sent_at: Instant,
    ) -> Result<Decision, Error> {
        match result {
            Ok(value) => {
                let source = self.answered();
                let decision =
                    read_decision(&value, limit, source).map_err(CallError::into_error)?;
                if take {
                    self.remember(key, cost, &decision, sent_at);
                }
                Ok(decision)
            }
            Err(e) if e.unavailable() || matches!(e, CallError::Misconfigured(_)) => {
                self.failed(&e);
                Ok(self.policy_acquire(key, limit, cost, take, Self::why(&e)))
            }
            Err(e) => Err(e.into_error()),
        }
    }

    pub(crate) fn before_multi(&self, items: &[(&str, Limit, f64)]) -> Option<MultiDecision> {
        for (index, (key, limit, cost)) in items.iter().enumerate() {
            if let Some(hit) = self.cached(key, limit, *cost) {
                return Some(MultiDecision {
                    allowed: false,
                    refused_index: Some(index),
                    retry_after_ms: hit.retry_after_ms,
                    decisions: Vec::new(),
                    source: Source::Cache,
                });
            }
        }
        self.skip_redis()
            .then(|| self.policy_acquire_all(items, Why::Outage))
    }

    pub(crate) fn after_multi(
        &self,
        result: Result<Value, CallError>,
        items: &[(&str, Limit, f64)],
        sent_at: Instant,
    ) -> Result<MultiDecision, Error> {
        match result {
            Ok(value) => {
                let source = self.answered();
                let multi = read_multi(&value, items, source).map_err(CallError::into_error)?;
                if !multi.allowed {
                    // Only refusing buckets are remembered, each with its own wait.
                    for ((key, _, cost), d) in items.iter().zip(&multi.decisions) {
                        self.remember(key, *cost, d, sent_at);
                    }
                }
                Ok(multi)
            }
            Err(e) if e.unavailable() || matches!(e, CallError::Misconfigured(_)) => {
                self.failed(&e);
                Ok(self.policy_acquire_all(items, Self::why(&e)))
            }
            Err(e) => Err(e.into_error()),
        }
    }

    /// During an outage between probes, the policy's charge (a charge always applies, so the
    /// deny cache has nothing to say before it).
    pub(crate) fn before_charge(
        &self,
        key: &str,
        limit: &Limit,
        cost: f64,
    ) -> Option<Result<Charged, Error>> {
        self.skip_redis()
            .then(|| self.policy_charge(key, limit, cost, Why::Outage))
    }

    /// After asking Redis for a charge sent at `sent_at`. A charge into debt is remembered by
    /// the deny cache as a denial of any cost until the debt is repaid: every acquire is
    /// denied until then, so asking Redis would change nothing.
    pub(crate) fn after_charge(
        &self,
        result: Result<Value, CallError>,
        (key, limit, cost): (&str, &Limit, f64),
        sent_at: Instant,
    ) -> Result<Charged, Error> {
        match result {
            Ok(value) => {
                let source = self.answered();
                let charged = read_charged(&value, limit, source).map_err(CallError::into_error)?;
                if charged.in_debt() {
                    let denied = Decision {
                        allowed: false,
                        remaining: 0,
                        retry_after_ms: charged.retry_after_ms,
                        reset_after_ms: charged.reset_after_ms,
                        limit: *limit,
                        source,
                    };
                    self.remember(key, 0.0, &denied, sent_at);
                }
                Ok(charged)
            }
            Err(e) if e.unavailable() || matches!(e, CallError::Misconfigured(_)) => {
                self.failed(&e);
                self.policy_charge(key, limit, cost, Self::why(&e))
            }
            Err(e) => Err(e.into_error()),
        }
    }

    /// The policy's charge: `Local` charges the local bucket; `Open` and `Closed` charge
    /// nothing (`Closed` reports its usual wait, as its denials do).
    pub(crate) fn policy_charge(
        &self,
        key: &str,
        limit: &Limit,
        cost: f64,
        why: Why,
    ) -> Result<Charged, Error> {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner, why);
        let (balance, retry_after_ms, reset_after_ms) = match source {
            Source::Local => inner
                .local
                .charge(key, limit, cost, now_us)
                .ok_or(Error::Invalid(DEBT_ERROR))?,
            Source::Closed => (0, CLOSED_RETRY_AFTER_MS, 0),
            _ => (0, 0, 0),
        };
        let applied = source == Source::Local;
        if !applied {
            inner.counters.unapplied_charges = inner.counters.unapplied_charges.saturating_add(1);
            drop(inner);
            // Usage already done that nothing recorded: said every time, with what was lost.
            log::warn!(
                "redis-rl: a charge of {cost} on {key:?} was not applied: Redis cannot decide and \
                 the {source:?} policy keeps no buckets (send it again, or use OnError::Local)"
            );
        }
        Ok(Charged {
            applied,
            balance,
            retry_after_ms,
            reset_after_ms,
            limit: *limit,
            source,
        })
    }

    /// Before a refund: clears the deny cache's entry; the policy's answer between probes.
    pub(crate) fn before_refund(&self, key: &str, limit: &Limit, cost: f64) -> Option<Refund> {
        self.forget(key);
        self.skip_redis()
            .then(|| self.policy_refund(key, limit, cost, Why::Outage))
    }

    pub(crate) fn after_refund(
        &self,
        result: Result<Value, CallError>,
        (key, limit, cost): (&str, &Limit, f64),
    ) -> Result<Refund, Error> {
        match result {
            Ok(value) => {
                let source = self.answered();
                read_refund(&value, source).map_err(CallError::into_error)
            }
            Err(e) if e.unavailable() || matches!(e, CallError::Misconfigured(_)) => {
                self.failed(&e);
                Ok(self.policy_refund(key, limit, cost, Self::why(&e)))
            }
            Err(e) => Err(e.into_error()),
        }
    }

    // Leases and reservations ----------------------------------------------------------------

    /// A call that never goes to Redis: a release, renew or settle of an id the `Open` policy
    /// made (nothing to do), or of a lease or reservation the `Local` policy made (its id
    /// starts with `local:`) or holds here (a caller's id), counted as that policy's.
    fn without_redis(&self, call: &Call<'_>) -> Option<Result<Answer, Error>> {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let (key, id) = match *call {
            Call::Release { key, id } | Call::Renew { key, id, .. } => (key, id),
            Call::Settle { key, id, .. } => (key, id),
            _ => return None,
        };
        let kind = lease::policy_of(id).or_else(|| {
            let held = match *call {
                Call::Settle { .. } => inner.leases.is_open(key, id, now_us),
                _ => inner.leases.holds(key, id, now_us),
            };
            held.then_some(Source::Local)
        })?;
        inner.counters.count(kind);
        let open = kind == Source::Open;
        Some(match *call {
            Call::Release { .. } => {
                Ok(Answer::Flag(!open && inner.leases.release(key, id, now_us)))
            }
            Call::Renew { ttl_ms, .. } => Ok(Answer::Flag(
                open || inner.leases.renew(key, id, ttl_ms, now_us),
            )),
            Call::Settle { limit, .. } if open => Ok(Answer::Settled(Charged {
                applied: false,
                balance: 0,
                retry_after_ms: 0,
                reset_after_ms: 0,
                limit,
                source: Source::Open,
            })),
            Call::Settle { limit, actual, .. } => {
                Self::settle_local(&mut inner, (key, &limit, id, actual), now_us)
            }
            _ => return None,
        })
    }

    /// Settles a reservation the `Local` policy holds: what was over-estimated goes back to
    /// the local bucket, what was under-estimated is charged to it; the record goes in the
    /// same step, and stays when the charge fails.
    fn settle_local(
        inner: &mut Inner,
        (key, limit, id, actual): (&str, &Limit, &str, f64),
        now_us: u64,
    ) -> Result<Answer, Error> {
        let expiry = inner.leases.expiry_of(key, id);
        let Some(estimate) = inner.leases.take_record(key, id, now_us) else {
            return Err(Error::Invalid(lease::NOT_OPEN_ERROR));
        };
        let over = estimate - actual;
        if over > 0.0 {
            inner.local.refund(key, limit, over, now_us);
        }
        let under = if over < 0.0 { -over } else { 0.0 };
        match inner.local.charge(key, limit, under, now_us) {
            Some((balance, retry_after_ms, reset_after_ms)) => Ok(Answer::Settled(Charged {
                applied: true,
                balance,
                retry_after_ms,
                reset_after_ms,
                limit: *limit,
                source: Source::Local,
            })),
            None => {
                if let Some(expiry) = expiry {
                    inner.leases.put_back(key, (id, estimate, expiry));
                }
                Err(Error::Invalid(DEBT_ERROR))
            }
        }
    }

    /// The failure policy's answer to a lease or reservation call.
    fn policy_call(&self, call: &Call<'_>, why: Why) -> Result<Answer, Error> {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner, why);
        let local = source == Source::Local;
        Ok(match *call {
            Call::Lease {
                key,
                limit,
                ttl_ms,
                id,
                drawn,
            } => Answer::Lease(match source {
                Source::Open => lease::open_lease(limit, id),
                Source::Closed => lease::closed_lease(limit),
                _ => inner
                    .leases
                    .lease((key, limit, ttl_ms, &local_id(id, drawn)), now_us),
            }),
            Call::Release { key, id } => {
                Answer::Flag(local && inner.leases.release(key, id, now_us))
            }
            Call::Renew { key, id, ttl_ms } => Answer::Flag(match source {
                Source::Open => true,
                Source::Closed => false,
                _ => inner.leases.renew(key, id, ttl_ms, now_us),
            }),
            Call::Leases { key, limit } => Answer::Count(match source {
                Source::Open => LeaseCount {
                    in_use: 0,
                    retry_after_ms: 0,
                    source,
                },
                Source::Closed => LeaseCount {
                    in_use: 0,
                    retry_after_ms: CLOSED_RETRY_AFTER_MS,
                    source,
                },
                _ => inner.leases.count(key, limit, now_us),
            }),
            Call::Reserve {
                key,
                limit,
                estimate,
                ttl_ms,
                id,
                drawn,
            } => {
                let local_id = local_id(id, drawn);
                let id = if local { local_id.as_str() } else { id };
                let reply = match source {
                    Source::Open => open_reply(),
                    Source::Closed => closed_reply(),
                    // A retried reserve of an id open here takes nothing, as the module's.
                    _ if inner.leases.is_open(key, id, now_us) => {
                        let now = inner.local.acquire(key, &limit, 0.0, now_us, false);
                        return Ok(Answer::Reserved(Reserved {
                            allowed: true,
                            id: id.to_string(),
                            remaining: now.remaining,
                            retry_after_ms: 0,
                            key: key.to_string(),
                            limit,
                            estimate,
                            source,
                        }));
                    }
                    _ => inner.local.acquire(key, &limit, estimate, now_us, true),
                };
                if local
                    && reply.allowed
                    && !inner.leases.record(key, (id, estimate, ttl_ms), now_us)
                {
                    inner.local.refund(key, &limit, estimate, now_us);
                    return Err(Error::Invalid(
                        "a key holds at most 1000 open reservations, each id once",
                    ));
                }
                let id = match (reply.allowed, source) {
                    (false, _) => String::new(),
                    (true, Source::Open) => format!("{}{id}", lease::OPEN_ID_PREFIX),
                    (true, _) => id.to_string(),
                };
                Answer::Reserved(Reserved {
                    allowed: reply.allowed,
                    id,
                    remaining: reply.remaining,
                    retry_after_ms: reply.retry_after_ms,
                    key: key.to_string(),
                    limit,
                    estimate,
                    source,
                })
            }
            Call::Settle {
                key,
                limit,
                id,
                actual,
            } => {
                // A reservation Redis holds (one this process holds was answered before
                // asking Redis): it stands as taken there until its ttl, and the difference is
                // the caller's to send again. Said every time, as an unapplied charge is.
                inner.counters.unapplied_charges =
                    inner.counters.unapplied_charges.saturating_add(1);
                drop(inner);
                log::warn!(
                    "redis-rl: the settle of reservation {id:?} on {key:?} (actual {actual}) was \
                     not applied: Redis cannot answer (send it again; unsettled, the reservation \
                     stands as taken until its ttl)"
                );
                Answer::Settled(Charged {
                    applied: false,
                    balance: 0,
                    retry_after_ms: 0,
                    reset_after_ms: 0,
                    limit,
                    source,
                })
            }
        })
    }

    /// Before a lease or reservation call: the answer without Redis (an `open:` id, a lease
    /// or reservation held locally), or the policy's during an outage between probes.
    pub(crate) fn before_call(&self, call: &Call<'_>) -> Option<Result<Answer, Error>> {
        if let Some(answer) = self.without_redis(call) {
            return Some(answer);
        }
        self.skip_redis()
            .then(|| self.policy_call(call, Why::Outage))
    }

    /// After asking Redis a lease or reservation call.
    pub(crate) fn after_call(
        &self,
        result: Result<Value, CallError>,
        call: &Call<'_>,
    ) -> Result<Answer, Error> {
        match result {
            Ok(value) => {
                let source = self.answered();
                let answer = match *call {
                    Call::Lease { limit, .. } => {
                        lease::read_lease(&value, limit, source).map(Answer::Lease)
                    }
                    Call::Release { .. } => {
                        lease::read_flag(&value, "RL.RELEASE").map(Answer::Flag)
                    }
                    Call::Renew { .. } => lease::read_flag(&value, "RL.RENEW").map(Answer::Flag),
                    Call::Leases { .. } => lease::read_count(&value, source).map(Answer::Count),
                    Call::Reserve {
                        key,
                        limit,
                        estimate,
                        ..
                    } => lease::read_reserved(&value, (key, &limit, estimate), source)
                        .map(Answer::Reserved),
                    Call::Settle { limit, .. } => {
                        lease::read_settled(&value, &limit, source).map(Answer::Settled)
                    }
                };
                answer.map_err(CallError::into_error)
            }
            Err(e) if e.unavailable() || matches!(e, CallError::Misconfigured(_)) => {
                self.failed(&e);
                self.policy_call(call, Self::why(&e))
            }
            Err(e) => Err(e.into_error()),
        }
    }

    // Paths, commands and replies ---------------------------------------------------------

    /// The path to use, if one has answered; `None` (or `Missing`) means detect.
    pub(crate) fn ready(&self) -> Option<Path> {
        match self.lock().path {
            Some(Path::Missing) => None,
            path => path,
        }
    }

    /// Forgets the path, so the next call detects it again.
    pub(crate) fn forget_path(&self) {
        self.lock().path = None;
    }

    /// Whether the script path is known and this user may only send EVAL on it.
    fn eval_only(&self) -> bool {
        let inner = self.lock();
        inner.eval_only && inner.path == Some(Path::Lua)
    }

    /// `path` answered (or, for `Missing`, the module did not): remembered, and logged when
    /// it changes.
    fn learn(&self, path: Path, eval_only: bool) {
        let mut inner = self.lock();
        if inner.path != Some(path) {
            log::info!("redis-rl: the {} path", path.as_str());
        }
        inner.path = Some(path);
        inner.eval_only = eval_only;
    }

    /// The module answered a call that the Functions library or the script (`from`), kept
    /// since the module was missing, refused with WRONGTYPE: the module path from now on,
    /// logged once.
    fn switch_to_module(&self, from: Path) {
        let mut inner = self.lock();
        if inner.path != Some(Path::Module) {
            let fallback = match from {
                Path::Functions => "the Functions library",
                _ => "the script",
            };
            log::info!(
                "redis-rl: {fallback} met a key of another type (WRONGTYPE) and the module \
                 answers: using the module path"
            );
        }
        inner.path = Some(Path::Module);
        inner.eval_only = false;
    }

    /// The module's command for `op` on `items`.
    fn module_command(op: Op, items: &[(Target<'_>, Limit, f64)]) -> redis::Cmd {
        let field = matches!(items.first(), Some((Target::Field { .. }, _, _)));
        let mut cmd = redis::cmd(module_name(op, field));
        for (target, limit, cost) in items {
            match *target {
                Target::Key(key) => cmd.arg(key),
                Target::Field { table, field, .. } => cmd.arg(table).arg(field),
            }
            // The texts the limit was validated with: `5/60` stays exact, where the double
            // 0.08333… would leave a fraction of a token in every state.
            .arg(limit.rate_text())
            .arg(limit.capacity_text())
            .arg(number(*cost));
        }
        cmd
    }

    /// `FCALL rl_<op>` (FCALL_RO for a peek) with the library's numbers: no mode argument. A
    /// one-key acquire goes to `rl_acquire_packed`, answered packed as the script's short form
    /// (read by `reply_of`).
    fn functions_command(op: Op, items: &[(Target<'_>, Limit, f64)]) -> redis::Cmd {
        let (call, mut function) = functions_name(op);
        if op == Op::Acquire && items.len() == 1 {
            function = "rl_acquire_packed";
        }
        let mut cmd = redis::cmd(call);
        cmd.arg(function).arg(items.len());
        for (target, _, _) in items {
            cmd.arg(target.key());
        }
        for (_, limit, cost) in items {
            cmd.arg(script::packed(limit, *cost, op == Op::Refund));
        }
        cmd
    }

    /// `EVALSHA <sha1>` (or `EVAL <script>`) with the script's mode and numbers; a one-key
    /// acquire leaves out the mode (the script's short form: one Lua string and one argument
    /// fewer for Redis to make, on the call an application makes most), and is answered
    /// packed (32 bytes, read by `reply_of`).
    fn script_command(op: Op, items: &[(Target<'_>, Limit, f64)], eval: bool) -> redis::Cmd {
        let mut cmd;
        if eval {
            cmd = redis::cmd("EVAL");
            cmd.arg(script::SCRIPT);
        } else {
            cmd = redis::cmd("EVALSHA");
            cmd.arg(script::sha());
        }
        cmd.arg(items.len());
        for (target, _, _) in items {
            cmd.arg(target.key());
        }
        if op != Op::Acquire || items.len() != 1 {
            cmd.arg(script_mode(op));
        }
        for (_, limit, cost) in items {
            cmd.arg(script::packed(limit, *cost, op == Op::Refund));
        }
        cmd
    }
}

/// FCALL or FCALL_RO, and the library's function for `op`.
fn functions_name(op: Op) -> (&'static str, &'static str) {
    match op {
        Op::Acquire => ("FCALL", "rl_acquire"),
        Op::Peek => ("FCALL_RO", "rl_peek"),
        Op::Refund => ("FCALL", "rl_refund"),
        Op::Multi => ("FCALL", "rl_multi"),
        Op::Charge => ("FCALL", "rl_charge"),
        Op::Lease => ("FCALL", "rl_lease"),
        Op::Release => ("FCALL", "rl_release"),
        Op::Renew => ("FCALL", "rl_renew"),
        Op::Leases => ("FCALL_RO", "rl_leases"),
        Op::Reserve => ("FCALL", "rl_reserve"),
        Op::Settle => ("FCALL", "rl_settle"),
    }
}

fn script_mode(op: Op) -> &'static str {
    match op {
        Op::Acquire => "acquire",
        Op::Peek => "peek",
        Op::Refund => "refund",
        Op::Multi => "multi",
        Op::Charge => "charge",
        Op::Lease => "lease",
        Op::Release => "release",
        Op::Renew => "renew",
        Op::Leases => "leases",
        Op::Reserve => "reserve",
        Op::Settle => "settle",
    }
}

/// The keys `check` peeks at: one in each eighth of the cluster's slots, so that on a cluster
/// a single-node client meets a MOVED whatever node it reached (unless that node serves
/// every slot, where such a client works). A peek of cost 0 writes nothing.
pub(crate) fn probe_keys() -> &'static [String] {
    static KEYS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        const PARTS: u16 = 8;
        let span = 16384 / PARTS;
        (0..PARTS)
            .filter_map(|part| {
                (0..100_000u32)
                    .map(|n| format!("redis-rl:check:{{{n}}}"))
                    .find(|key| crate::hashslot::key_slot(key.as_bytes()) / span == part)
            })
            .collect()
    })
}

/// The limit of `check`'s peeks (any valid one: a peek of cost 0 on a missing key is full).
pub(crate) fn probe_limit() -> Result<Limit, Error> {
    Limit::new(1.0, 1.0)
}

impl Engine {
    /// What `check` returns after `e`: a misconfiguration (logged at error level) or another
    /// error reply as the error; Redis down or busy as `Ok(None)`, with a warning.
    pub(crate) fn checked(&self, e: CallError) -> Result<Option<Path>, Error> {
        if e.unavailable() {
            log::warn!(
                "redis-rl: check: Redis does not answer now ({}); starting anyway, deciding \
                 with on_error={:?} until it does",
                e.describe(),
                self.options.on_error
            );
            return Ok(None);
        }
        if let CallError::Misconfigured(cause) = &e {
            log::error!("redis-rl: check: Redis is misconfigured for this client: {cause}");
        }
        Err(e.into_error())
    }

    /// The path `check` found, logged.
    pub(crate) fn checked_path(&self) -> Option<Path> {
        let path = self.ready();
        if let Some(path) = path {
            log::info!("redis-rl: check: the {} path", path.as_str());
        }
        path
    }
}

/// What an [`Exchange`] wants next: a command sent and its reply handed back, or its result.
pub(crate) enum Step {
    Send(redis::Cmd),
    Done(Result<Value, CallError>),
}

/// Which reply an [`Exchange`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The module's command.
    Module,
    /// `FCALL_RO rl_version 0`: is the Functions library there, and new enough?
    Version,
    /// `FCALL_RO rl_peek` after "no rl_version": an older library without it?
    OldLibrary,
    /// The library's function.
    Functions,
    /// EVALSHA of the script's SHA-1.
    Sha,
    /// EVAL of the script: after NOSCRIPT (`after_noscript`), or because EVALSHA is refused.
    Eval {
        after_noscript: bool,
    },
    Done,
}

/// One call's conversation with Redis, as steps, without I/O. On a known path, the call goes
/// as that path's command. Otherwise (the first call, or a path that stopped answering) the
/// path is found by sending the call itself: the module's command; on "unknown command" or
/// NOPERM, `FCALL_RO rl_version 0` and then the library's function; on "Function not found",
/// an older library, NOPERM or a version too low, the script by EVALSHA. On NOSCRIPT the same
/// call goes again as EVAL (which caches the script; once, no loop); when EVALSHA is refused,
/// as EVAL from then on. A library that stops answering sends the call back to the module's
/// command once. When no path is allowed, the call ends as a misconfiguration naming every
/// command refused and the ACL rules to add.
///
/// The module loaded after a limiter chose the Functions library or the script: processes on
/// the module path convert the buckets the fallback wrote to the module's type, which the
/// fallback answers with WRONGTYPE. Then, under `WithoutModule::Lua` and unless this call
/// asked the module already, the same call goes to the module once: when the module answers
/// (a reply, or an error of its own such as its WRONGTYPE for a string key), the limiter keeps
/// the module path and the call ends with the module's answer; when the module is missing
/// (unknown command) or this user may not run it (NOPERM), the call ends with the fallback's
/// WRONGTYPE as it came. Either way the error is the caller's, never the failure policy's.
///
/// ```text
/// let mut step = exchange.start();
/// loop { match step { Step::Send(cmd) => step = exchange.reply(cmd.query(c)), Step::Done(r) => return r } }
/// ```
pub(crate) struct Exchange<'a> {
    engine: &'a Engine,
    op: Op,
    items: &'a [(Target<'a>, Limit, f64)],
    stage: Stage,
    /// Whether the path is being found (so the one that answers is remembered).
    detecting: bool,
    /// Whether a path that stopped answering has sent this call back to detection already.
    redetected: bool,
    /// The commands this user may not run, in the order tried.
    denied: Vec<&'static str>,
    /// Whether this call has sent the module's command (it asks the module at most once).
    module_tried: bool,
    /// The fallback's WRONGTYPE, and which fallback gave it, while the module is asked.
    wrongtype: Option<(Path, RedisError)>,
    /// A lease or reservation call: its commands are built from it rather than from `items`.
    call: Option<Call<'a>>,
}

impl<'a> Exchange<'a> {
    pub(crate) fn new(engine: &'a Engine, op: Op, items: &'a [(Target<'a>, Limit, f64)]) -> Self {
        Exchange {
            engine,
            op,
            items,
            stage: Stage::Done,
            detecting: false,
            redetected: false,
            denied: Vec::new(),
            module_tried: false,
            wrongtype: None,
            call: None,
        }
    }

    /// The exchange of a lease or reservation call.
    pub(crate) fn of_call(engine: &'a Engine, call: Call<'a>) -> Self {
        let mut exchange = Exchange::new(engine, call.op(), &[]);
        exchange.call = Some(call);
        exchange
    }

    /// The first step.
    pub(crate) fn start(&mut self) -> Step {
        match self.engine.ready() {
            Some(Path::Module) => self.module(),
            Some(Path::Functions) => self.functions(),
            Some(Path::Lua) => self.script(),
            None | Some(Path::Missing) => {
                self.detecting = true;
                self.module()
            }
        }
    }

    /// The next step, given the reply to the command of the last.
    pub(crate) fn reply(&mut self, reply: redis::RedisResult<Value>) -> Step {
        match reply {
            Ok(value) => self.answered(value),
            Err(e) => self.refused(e),
        }
    }

    fn answered(&mut self, value: Value) -> Step {
        match self.stage {
            Stage::Module => {
                if let Some((from, _)) = self.wrongtype.take() {
                    self.engine.switch_to_module(from);
                } else if self.detecting {
                    self.engine.learn(Path::Module, false);
                }
                self.done(Ok(value))
            }
            Stage::Version => match value {
                Value::Int(version) if version >= self.op.functions_version() => {
                    self.engine.learn(Path::Functions, false);
                    self.functions()
                }
                other => {
                    log::error!(
                        "redis-rl: the Functions library redis_rl on the server is version \
                         {other:?}, this call needs {}: using the script instead; reload the \
                         library with redis_rl_client::load_functions (FUNCTION LOAD REPLACE)",
                        self.op.functions_version()
                    );
                    self.script()
                }
            },
            Stage::OldLibrary => {
                log::error!(
                    "redis-rl: the Functions library on the server has rl_peek but no \
                     rl_version (older than version {}): using the script instead; reload the \
                     library with redis_rl_client::load_functions (FUNCTION LOAD REPLACE)",
                    script::FUNCTIONS_VERSION
                );
                self.script()
            }
            Stage::Functions | Stage::Sha => {
                if self.detecting && self.stage == Stage::Sha {
                    self.engine.learn(Path::Lua, false);
                }
                self.done(Ok(value))
            }
            Stage::Eval { after_noscript } => {
                self.engine.learn(Path::Lua, !after_noscript);
                self.done(Ok(value))
            }
            Stage::Done => self.done(Err(CallError::Reply("a reply after the end".into()))),
        }
    }

    fn refused(&mut self, e: RedisError) -> Step {
        match self.stage {
            Stage::Module => {
                let name = module_name(self.op, self.field());
                if let Some((from, wrongtype)) = self.wrongtype.take() {
                    // Asked after the fallback's WRONGTYPE: missing, or not for this user,
                    // the fallback's error stands; any other error reply is the module's own
                    // answer, so the module is there.
                    if is_unknown_command(&e) || is_denied(&e, name) {
                        return self.fail(wrongtype);
                    }
                    if !is_unavailable(&e)
                        && diagnose::misconfiguration(&e, self.engine.cluster_client).is_none()
                    {
                        self.engine.switch_to_module(from);
                    }
                    return self.fail(e);
                }
                if is_unknown_command(&e) {
                    return self.no_module(None);
                }
                if is_denied(&e, name) {
                    return self.no_module(Some(name));
                }
                // Any other error reply comes from the module's command itself (WRONGTYPE, a
                // bad argument): the module is there.
                if self.detecting
                    && !is_unavailable(&e)
                    && diagnose::misconfiguration(&e, self.engine.cluster_client).is_none()
                {
                    self.engine.learn(Path::Module, false);
                }
                self.fail(e)
            }
            Stage::Version => {
                if is_function_not_found(&e) {
                    return self.old_library();
                }
                if is_unknown_command(&e) {
                    return self.script();
                }
                if is_denied(&e, "FCALL_RO") {
                    self.denied.push("fcall_ro");
                    return self.script();
                }
                self.fail(e)
            }
            Stage::OldLibrary => {
                if is_unavailable(&e) {
                    return self.fail(e);
                }
                self.script()
            }
            Stage::Functions => {
                let (call, _) = functions_name(self.op);
                if is_function_not_found(&e) || is_unknown_command(&e) {
                    // The library went away (FUNCTION FLUSH, a failover to a node without
                    // it): look again, once.
                    self.engine.forget_path();
                    if !self.redetected {
                        self.redetected = true;
                        self.detecting = true;
                        return self.module();
                    }
                    return self.script();
                }
                if is_denied(&e, call) {
                    self.denied
                        .push(if call == "FCALL" { "fcall" } else { "fcall_ro" });
                    self.detecting = true;
                    return self.script();
                }
                self.fallback_failed(Path::Functions, e)
            }
            Stage::Sha => {
                if is_noscript(&e) {
                    return self.eval(true);
                }
                if is_denied(&e, "EVALSHA") {
                    self.denied.push("evalsha");
                    return self.eval(false);
                }
                if is_unknown_command(&e) && !self.redetected {
                    self.engine.forget_path();
                    self.redetected = true;
                    self.detecting = true;
                    return self.module();
                }
                self.fallback_failed(Path::Lua, e)
            }
            Stage::Eval { after_noscript } => {
                if is_denied(&e, "EVAL") {
                    self.denied.push("eval");
                    let cause = if after_noscript {
                        diagnose::not_loaded()
                    } else {
                        diagnose::no_permission(&self.denied)
                    };
                    return self.done(Err(CallError::Misconfigured(cause)));
                }
                self.fallback_failed(Path::Lua, e)
            }
            Stage::Done => self.done(Err(CallError::Reply("a reply after the end".into()))),
        }
    }

    /// An error reply of the Functions library or the script (`from`) to the call itself:
    /// WRONGTYPE asks the module once (see [`Exchange`]), any other ends the call.
    fn fallback_failed(&mut self, from: Path, e: RedisError) -> Step {
        if is_wrongtype(&e)
            && self.engine.options.without_module == WithoutModule::Lua
            && !self.module_tried
        {
            self.wrongtype = Some((from, e));
            return self.module();
        }
        self.fail(e)
    }

    fn field(&self) -> bool {
        matches!(self.items.first(), Some((Target::Field { .. }, _, _)))
    }

    fn module(&mut self) -> Step {
        self.stage = Stage::Module;
        self.module_tried = true;
        Step::Send(match &self.call {
            Some(call) => call.module_command(),
            None => Engine::module_command(self.op, self.items),
        })
    }

    /// No module (or not for this user, `denied`): the Functions library next, or under
    /// `WithoutModule::Refuse`, a misconfiguration.
    fn no_module(&mut self, denied: Option<&'static str>) -> Step {
        let lowercase = denied.map(|name| match name {
            "RL.ACQUIRE" => "rl.acquire",
            "RL.PEEK" => "rl.peek",
            "RL.REFUND" => "rl.refund",
            "RL.CHARGE" => "rl.charge",
            "RL.ACQUIRE.MULTI" => "rl.acquire.multi",
            "RL.HACQUIRE" => "rl.hacquire",
            "RL.HACQUIRE.MULTI" => "rl.hacquire.multi",
            "RL.HPEEK" => "rl.hpeek",
            "RL.HREFUND" => "rl.hrefund",
            "RL.LEASE" => "rl.lease",
            "RL.RELEASE" => "rl.release",
            "RL.RENEW" => "rl.renew",
            "RL.LEASES" => "rl.leases",
            "RL.RESERVE" => "rl.reserve",
            "RL.SETTLE" => "rl.settle",
            _ => "rl.hcharge",
        });
        if let Some(name) = lowercase {
            self.denied.push(name);
        }
        if self.engine.options.without_module == WithoutModule::Refuse {
            let cause = match lowercase {
                Some(_) => diagnose::no_permission(&self.denied),
                None => {
                    self.engine.learn(Path::Missing, false);
                    diagnose::module_missing()
                }
            };
            return self.done(Err(CallError::Misconfigured(cause)));
        }
        self.detecting = true;
        self.stage = Stage::Version;
        let mut cmd = redis::cmd("FCALL_RO");
        cmd.arg("rl_version").arg(0);
        Step::Send(cmd)
    }

    /// A peek through the library's `rl_peek`: answered only by a library without
    /// `rl_version`, which then is too old.
    fn old_library(&mut self) -> Step {
        let Some((target, limit, cost)) = self.items.first() else {
            return self.script();
        };
        self.stage = Stage::OldLibrary;
        Step::Send(Engine::functions_command(
            Op::Peek,
            &[(*target, *limit, *cost)],
        ))
    }

    fn functions(&mut self) -> Step {
        self.stage = Stage::Functions;
        Step::Send(match &self.call {
            Some(call) => {
                let (fcall, function) = functions_name(self.op);
                let mut cmd = redis::cmd(fcall);
                cmd.arg(function).arg(1).arg(call.key());
                call.fallback_args(&mut cmd);
                cmd
            }
            None => Engine::functions_command(self.op, self.items),
        })
    }

    /// The script's command for a lease or reservation call: `EVALSHA <sha1> 1 key <mode> …`.
    fn script_call(call: &Call<'_>, eval: bool) -> redis::Cmd {
        let mut cmd;
        if eval {
            cmd = redis::cmd("EVAL");
            cmd.arg(script::SCRIPT);
        } else {
            cmd = redis::cmd("EVALSHA");
            cmd.arg(script::sha());
        }
        cmd.arg(1).arg(call.key()).arg(script_mode(call.op()));
        call.fallback_args(&mut cmd);
        cmd
    }

    /// The script: EVALSHA, or EVAL when this user may only run that.
    fn script(&mut self) -> Step {
        if self.engine.eval_only() {
            return self.eval(false);
        }
        self.stage = Stage::Sha;
        Step::Send(match &self.call {
            Some(call) => Self::script_call(call, false),
            None => Engine::script_command(self.op, self.items, false),
        })
    }

    fn eval(&mut self, after_noscript: bool) -> Step {
        self.stage = Stage::Eval { after_noscript };
        Step::Send(match &self.call {
            Some(call) => Self::script_call(call, true),
            None => Engine::script_command(self.op, self.items, true),
        })
    }

    fn fail(&mut self, e: RedisError) -> Step {
        let error = CallError::of(e, self.engine.cluster_client);
        self.done(Err(error))
    }

    fn done(&mut self, result: Result<Value, CallError>) -> Step {
        self.stage = Stage::Done;
        Step::Done(result)
    }
}

fn open_reply() -> Reply {
    Reply {
        allowed: true,
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
    }
}

fn closed_reply() -> Reply {
    Reply {
        allowed: false,
        remaining: 0,
        retry_after_ms: CLOSED_RETRY_AFTER_MS,
        reset_after_ms: 0,
    }
}

fn decision(reply: Reply, limit: &Limit, source: Source) -> Decision {
    Decision {
        allowed: reply.allowed,
        remaining: reply.remaining,
        retry_after_ms: reply.retry_after_ms,
        reset_after_ms: reply.reset_after_ms,
        limit: *limit,
        source,
    }
}

fn integers(value: &Value, what: &str, len: usize) -> Result<Vec<i64>, CallError> {
    let bad = || CallError::Reply(format!("{what}: {value:?}"));
    let Value::Array(items) = value else {
        return Err(bad());
    };
    if items.len() != len {
        return Err(bad());
    }
    items
        .iter()
        .map(|v| match v {
            Value::Int(i) => Ok(*i),
            _ => Err(bad()),
        })
        .collect()
}

/// The script's short form answers an acquire's four numbers packed: 32 bytes, four
/// little-endian doubles, each a whole number (its `packed_reply`).
fn short_form_integers(bytes: &[u8]) -> Option<Vec<i64>> {
    if bytes.len() != 32 {
        return None;
    }
    bytes
        .chunks_exact(8)
        .map(|chunk| {
            let x = f64::from_le_bytes(chunk.try_into().ok()?);
            // Whole and within i64: the script packs integers below 2^53 in magnitude.
            (x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0).then_some(x as i64)
        })
        .collect()
}

fn reply_of(value: &Value) -> Result<Reply, CallError> {
    let v = match value {
        Value::BulkString(bytes) => short_form_integers(bytes)
            .ok_or_else(|| CallError::Reply(format!("the script's short form reply: {value:?}")))?,
        _ => integers(value, "RL.ACQUIRE reply", 4)?,
    };
    match v.as_slice() {
        [allowed, remaining, retry, reset] => Ok(Reply {
            allowed: *allowed == 1,
            remaining: u64::try_from(*remaining).unwrap_or(0),
            retry_after_ms: *retry,
            reset_after_ms: *reset,
        }),
        _ => Err(CallError::Reply(format!("RL.ACQUIRE reply: {value:?}"))),
    }
}

/// RL.ACQUIRE / RL.PEEK (or the script's acquire / peek) reply as a decision.
pub(crate) fn read_decision(
    value: &Value,
    limit: &Limit,
    source: Source,
) -> Result<Decision, CallError> {
    Ok(decision(reply_of(value)?, limit, source))
}

/// The id a lease or reservation the `Local` policy takes gets: `local:` and the drawn id
/// when the caller gave none (so its release, renew and settle stay in this process), else
/// the caller's.
fn local_id(id: &str, drawn: bool) -> String {
    if drawn {
        format!("{}{id}", lease::LOCAL_ID_PREFIX)
    } else {
        id.to_string()
    }
}

/// RL.CHARGE's reply: `[1, balance, retry_after_ms, reset_after_ms]`, the balance signed.
pub(crate) fn read_charged(
    value: &Value,
    limit: &Limit,
    source: Source,
) -> Result<Charged, CallError> {
    let v = integers(value, "RL.CHARGE reply", 4)?;
    match v.as_slice() {
        [1, balance, retry, reset] => Ok(Charged {
            applied: true,
            balance: *balance,
            retry_after_ms: *retry,
            reset_after_ms: *reset,
            limit: *limit,
            source,
        }),
        _ => Err(CallError::Reply(format!("RL.CHARGE reply: {value:?}"))),
    }
}

/// RL.REFUND's reply: `[remaining, reset_after_ms]`.
pub(crate) fn read_refund(value: &Value, source: Source) -> Result<Refund, CallError> {
    let v = integers(value, "RL.REFUND reply", 2)?;
    match v.as_slice() {
        [remaining, reset] => Ok(Refund {
            remaining: u64::try_from(*remaining).unwrap_or(0),
            reset_after_ms: *reset,
            source,
        }),
        _ => Err(CallError::Reply(format!("RL.REFUND reply: {value:?}"))),
    }
}

/// RL.ACQUIRE.MULTI's reply: `[allowed, refused_index, retry_after_ms, [reply …]]`.
pub(crate) fn read_multi(
    value: &Value,
    items: &[(&str, Limit, f64)],
    source: Source,
) -> Result<MultiDecision, CallError> {
    let bad = || CallError::Reply(format!("RL.ACQUIRE.MULTI reply: {value:?}"));
    let Value::Array(parts) = value else {
        return Err(bad());
    };
    let [Value::Int(allowed), Value::Int(refused), Value::Int(retry), Value::Array(replies)] =
        parts.as_slice()
    else {
        return Err(bad());
    };
    if replies.len() != items.len() {
        return Err(bad());
    }
    let decisions = replies
        .iter()
        .zip(items)
        .map(|(reply, (_, limit, _))| read_decision(reply, limit, source))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MultiDecision {
        allowed: *allowed == 1,
        refused_index: usize::try_from(*refused).ok(),
        retry_after_ms: *retry,
        decisions,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::OnError;

    /// A server's reply, parsed from RESP as the redis crate would read it off the socket.
    fn reply(resp: &str) -> redis::RedisResult<Value> {
        redis::parse_redis_value(resp.as_bytes())?.extract_error()
    }

    fn packed(numbers: [f64; 4]) -> Value {
        Value::BulkString(numbers.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    #[test]
    fn the_short_forms_packed_reply_reads_as_the_modules_array() {
        let array = reply("*4\r\n:0\r\n:7\r\n:-1\r\n:3600001\r\n").unwrap();
        let from_array = reply_of(&array).unwrap();
        let from_packed = reply_of(&packed([0.0, 7.0, -1.0, 3_600_001.0])).unwrap();
        assert_eq!(from_packed, from_array);
        assert_eq!(from_packed.retry_after_ms, -1);
        let largest = reply_of(&packed([1.0, 9_007_199_254_740_991.0, 0.0, 0.0])).unwrap();
        assert_eq!(largest.remaining, 9_007_199_254_740_991);
        // Not 32 bytes, or a number that is not whole or not below 2^53: not the script's.
        for bad in [
            Value::BulkString(vec![0; 31]),
            Value::BulkString(vec![0; 33]),
            packed([1.0, 0.5, 0.0, 0.0]),
            packed([1.0, f64::NAN, 0.0, 0.0]),
            packed([1.0, 9_007_199_254_740_992.0, 0.0, 0.0]),
        ] {
            assert!(reply_of(&bad).is_err(), "{bad:?}");
        }
    }

    /// The command name of a step, or "done: ok" / "done: err".
    fn name(step: &Step) -> String {
        match step {
            Step::Send(cmd) => match cmd.args_iter().next() {
                Some(redis::Arg::Simple(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "?".into(),
            },
            Step::Done(Ok(_)) => "done: ok".into(),
            Step::Done(Err(_)) => "done: err".into(),
        }
    }

    /// Runs an exchange against scripted replies, one per command it sends; returns the
    /// commands' names and how it ended.
    fn run(engine: &Engine, replies: &[&str]) -> Vec<String> {
        let limit = Limit::new(5.0, 10.0).unwrap();
        let items = [(Target::Key("k"), limit, 1.0)];
        let mut exchange = Exchange::new(engine, Op::Acquire, &items);
        let mut step = exchange.start();
        let mut seen = vec![name(&step)];
        for r in replies {
            step = exchange.reply(reply(r));
            seen.push(name(&step));
        }
        seen
    }

    const DECISION: &str = "*4\r\n:1\r\n:9\r\n:0\r\n:200\r\n";
    const UNKNOWN: &str = "-ERR unknown command 'RL.ACQUIRE'\r\n";
    const NO_FUNCTION: &str = "-ERR Function not found\r\n";
    const VERSION: &str = ":5\r\n";
    const NOSCRIPT: &str = "-NOSCRIPT No matching script.\r\n";
    const NOPERM_FCALL_RO: &str =
        "-NOPERM this user has no permissions to run the 'fcall_ro' command\r\n";
    const NOPERM_EVALSHA: &str =
        "-NOPERM this user has no permissions to run the 'evalsha' command\r\n";
    const NOPERM_EVAL: &str = "-NOPERM this user has no permissions to run the 'eval' command\r\n";

    fn engine(without_module: WithoutModule) -> Engine {
        Engine::new(
            Options::new(OnError::Closed).without_module(without_module),
            false,
        )
    }

    /// How a call that ended in an error ended: its misconfiguration's text, or "other".
    fn ending(engine: &Engine, replies: &[&str]) -> String {
        let limit = Limit::new(5.0, 10.0).unwrap();
        let items = [(Target::Key("k"), limit, 1.0)];
        let mut exchange = Exchange::new(engine, Op::Acquire, &items);
        let mut step = exchange.start();
        for r in replies {
            step = exchange.reply(reply(r));
        }
        match step {
            Step::Done(Err(CallError::Misconfigured(cause))) => cause,
            Step::Done(Ok(_)) => "ok".into(),
            _ => "other".into(),
        }
    }

    #[test]
    fn a_cold_call_is_the_module_command_itself() {
        let engine = engine(WithoutModule::Lua);
        assert_eq!(run(&engine, &[DECISION]), ["RL.ACQUIRE", "done: ok"]);
        assert_eq!(engine.path(), Some(Path::Module));
        assert_eq!(run(&engine, &[DECISION]), ["RL.ACQUIRE", "done: ok"]);
    }

    #[test]
    fn without_the_module_the_library_is_asked_its_version_then_called() {
        let engine = engine(WithoutModule::Lua);
        assert_eq!(
            run(&engine, &[UNKNOWN, VERSION, DECISION]),
            ["RL.ACQUIRE", "FCALL_RO", "FCALL", "done: ok"]
        );
        assert_eq!(engine.path(), Some(Path::Functions));
        assert_eq!(run(&engine, &[DECISION]), ["FCALL", "done: ok"]);
        // The library flushed: looked for again once, and the script found.
        assert_eq!(
            run(
                &engine,
                &[NO_FUNCTION, UNKNOWN, NO_FUNCTION, NO_FUNCTION, DECISION]
            ),
            [
                "FCALL",
                "RL.ACQUIRE",
                "FCALL_RO",
                "FCALL_RO",
                "EVALSHA",
                "done: ok"
            ]
        );
        assert_eq!(engine.path(), Some(Path::Lua));
    }

    #[test]
    fn a_library_too_old_is_passed_over_for_the_script() {
        let engine = engine(WithoutModule::Lua);
        assert_eq!(
            run(&engine, &[UNKNOWN, ":0\r\n", DECISION]),
            ["RL.ACQUIRE", "FCALL_RO", "EVALSHA", "done: ok"]
        );
        assert_eq!(engine.path(), Some(Path::Lua));
        // No rl_version, but an rl_peek that answers: older than version 1.
        let engine = Engine::new(Options::new(OnError::Closed), false);
        assert_eq!(
            run(&engine, &[UNKNOWN, NO_FUNCTION, DECISION, DECISION]),
            ["RL.ACQUIRE", "FCALL_RO", "FCALL_RO", "EVALSHA", "done: ok"]
        );
        assert_eq!(engine.path(), Some(Path::Lua));
    }

    #[test]
    fn noscript_resends_the_same_call_as_eval_once() {
        let engine = engine(WithoutModule::Lua);
        run(&engine, &[UNKNOWN, NO_FUNCTION, NO_FUNCTION, DECISION]);
        assert_eq!(engine.path(), Some(Path::Lua));
        assert_eq!(
            run(&engine, &[NOSCRIPT, DECISION]),
            ["EVALSHA", "EVAL", "done: ok"]
        );
        // EVALSHA stays the first try after it.
        assert_eq!(run(&engine, &[DECISION]), ["EVALSHA", "done: ok"]);
        // A failed EVAL is returned, not looped on.
        assert_eq!(
            run(&engine, &[NOSCRIPT, NOSCRIPT]),
            ["EVALSHA", "EVAL", "done: err"]
        );
    }

    #[test]
    fn evalsha_refused_means_eval_from_then_on() {
        let engine = engine(WithoutModule::Lua);
        assert_eq!(
            run(
                &engine,
                &[UNKNOWN, NO_FUNCTION, NO_FUNCTION, NOPERM_EVALSHA, DECISION]
            ),
            [
                "RL.ACQUIRE",
                "FCALL_RO",
                "FCALL_RO",
                "EVALSHA",
                "EVAL",
                "done: ok"
            ]
        );
        assert_eq!(run(&engine, &[DECISION]), ["EVAL", "done: ok"]);
    }

    #[test]
    fn no_path_allowed_is_a_misconfiguration_naming_each_command() {
        let engine = engine(WithoutModule::Lua);
        let cause = ending(
            &engine,
            &[UNKNOWN, NOPERM_FCALL_RO, NOPERM_EVALSHA, NOPERM_EVAL],
        );
        assert!(
            cause.starts_with(
                "NOPERM: this user may not run 'fcall_ro' (nor 'evalsha', 'eval'); add the ACL rules"
            ),
            "{cause}"
        );
        assert!(cause.contains("docs/clients.md#permissions"), "{cause}");
        // Not cached and EVAL refused: the admin must load it.
        let cause = ending(
            &engine,
            &[UNKNOWN, NO_FUNCTION, NO_FUNCTION, NOSCRIPT, NOPERM_EVAL],
        );
        assert!(cause.contains("has not cached the script"), "{cause}");
    }

    const WRONGTYPE_SCRIPT: &str = "-WRONGTYPE Operation against a key holding the wrong kind \
         of value script: rl_acquire, on @user_function:94.\r\n";
    const WRONGTYPE_MODULE: &str =
        "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
    const NOPERM_MODULE: &str =
        "-NOPERM this user has no permissions to run the 'rl.acquire' command\r\n";

    /// An engine that found `path` (Functions or Lua) with its first call.
    fn on_fallback(path: Path) -> Engine {
        let engine = engine(WithoutModule::Lua);
        match path {
            Path::Functions => run(&engine, &[UNKNOWN, VERSION, DECISION]),
            _ => run(&engine, &[UNKNOWN, NO_FUNCTION, NO_FUNCTION, DECISION]),
        };
        assert_eq!(engine.path(), Some(path));
        engine
    }

    /// The error text a call ended with, after `replies`.
    fn error_text(engine: &Engine, replies: &[&str]) -> String {
        let limit = Limit::new(5.0, 10.0).unwrap();
        let items = [(Target::Key("k"), limit, 1.0)];
        let mut exchange = Exchange::new(engine, Op::Acquire, &items);
        let mut step = exchange.start();
        for r in replies {
            step = exchange.reply(reply(r));
        }
        match step {
            Step::Done(Err(e)) => e.describe(),
            _ => "no error".into(),
        }
    }

    #[test]
    fn wrongtype_on_a_fallback_asks_the_module_once_and_keeps_it_when_it_answers() {
        for (path, call) in [(Path::Functions, "FCALL"), (Path::Lua, "EVALSHA")] {
            let engine = on_fallback(path);
            assert_eq!(
                run(&engine, &[WRONGTYPE_SCRIPT, DECISION]),
                [call, "RL.ACQUIRE", "done: ok"]
            );
            assert_eq!(engine.path(), Some(Path::Module));
            assert_eq!(run(&engine, &[DECISION]), ["RL.ACQUIRE", "done: ok"]);
            // The module's own error (a string key) is its answer: the module is kept.
            let engine = on_fallback(path);
            assert_eq!(
                run(&engine, &[WRONGTYPE_SCRIPT, WRONGTYPE_MODULE]),
                [call, "RL.ACQUIRE", "done: err"]
            );
            assert_eq!(engine.path(), Some(Path::Module));
            assert!(!error_text(&engine, &[WRONGTYPE_MODULE]).contains("script"));
        }
    }

    #[test]
    fn wrongtype_stands_when_the_module_is_missing_or_refused() {
        for path in [Path::Functions, Path::Lua] {
            for module in [UNKNOWN, NOPERM_MODULE] {
                let engine = on_fallback(path);
                let text = error_text(&engine, &[WRONGTYPE_SCRIPT, module]);
                assert!(
                    text.contains("WRONGTYPE") && text.contains("script"),
                    "{text}"
                );
                assert_eq!(engine.path(), Some(path));
            }
        }
        // A module already asked by this call (detection found it missing) is not asked again.
        let functions = engine(WithoutModule::Lua);
        assert_eq!(
            run(&functions, &[UNKNOWN, VERSION, WRONGTYPE_SCRIPT]),
            ["RL.ACQUIRE", "FCALL_RO", "FCALL", "done: err"]
        );
        assert_eq!(functions.path(), Some(Path::Functions));
        let script = engine(WithoutModule::Lua);
        assert_eq!(
            run(
                &script,
                &[UNKNOWN, NO_FUNCTION, NO_FUNCTION, WRONGTYPE_SCRIPT]
            ),
            ["RL.ACQUIRE", "FCALL_RO", "FCALL_RO", "EVALSHA", "done: err"]
        );
        // Another error of the fallback ends the call without asking the module.
        let engine = on_fallback(Path::Lua);
        assert_eq!(
            run(&engine, &["-ERR user_script:1: bad argument\r\n"]),
            ["EVALSHA", "done: err"]
        );
    }

    #[test]
    fn wrongtype_after_noscript_or_on_eval_only_asks_the_module_too() {
        let flushed = on_fallback(Path::Lua);
        assert_eq!(
            run(&flushed, &[NOSCRIPT, WRONGTYPE_SCRIPT, DECISION]),
            ["EVALSHA", "EVAL", "RL.ACQUIRE", "done: ok"]
        );
        assert_eq!(flushed.path(), Some(Path::Module));
        let eval_only = engine(WithoutModule::Lua);
        run(
            &eval_only,
            &[UNKNOWN, NO_FUNCTION, NO_FUNCTION, NOPERM_EVALSHA, DECISION],
        );
        assert_eq!(
            run(&eval_only, &[WRONGTYPE_SCRIPT, DECISION]),
            ["EVAL", "RL.ACQUIRE", "done: ok"]
        );
        assert_eq!(run(&eval_only, &[DECISION]), ["RL.ACQUIRE", "done: ok"]);
    }

    #[test]
    fn refuse_makes_a_missing_module_a_misconfiguration_and_tries_again_next_call() {
        let engine = engine(WithoutModule::Refuse);
        assert!(ending(&engine, &[UNKNOWN]).contains("WithoutModule::Refuse"));
        assert_eq!(engine.path(), Some(Path::Missing));
        // The module loaded since: found by the next call.
        assert_eq!(run(&engine, &[DECISION]), ["RL.ACQUIRE", "done: ok"]);
        assert_eq!(engine.path(), Some(Path::Module));
    }
}
