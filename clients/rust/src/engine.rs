//! What the sync and async limiters share: which path reaches Redis (module, Lua, missing),
//! the outage and its counters, the deny cache and the local buckets, behind one lock; the
//! commands to send; the replies read back; the errors that mean "Redis cannot decide".
//!
//! Nothing here does I/O. One call's conversation with Redis (detect the module, load the
//! script, send, and look again after an "unknown command" or NOSCRIPT) is an [`Exchange`]:
//! `sync` and `asynch` send each command it asks for and hand back the reply, blocking or
//! awaited, and that loop is all they repeat. The lock is never held across a call into
//! Redis.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::local::{DenyCache, LocalBuckets, Reply};
use crate::script;
use crate::types::{
    number, Charged, Counters, Decision, Error, Limit, MultiDecision, OnError, Options, Refund,
    Source, WithoutModule, CLOSED_RETRY_AFTER_MS, DEBT_ERROR,
};

/// What a call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Peek,
    Refund,
    Multi,
    /// A post-paid cost (RL.CHARGE): always applies, may leave the bucket in debt.
    Charge,
}

impl Op {
    /// Whether a decision of this op takes tokens (and so may be remembered by the shield).
    pub(crate) fn takes(self) -> bool {
        self == Op::Acquire
    }
}

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
    /// The Lua script through EVALSHA.
    Lua,
    /// No module, and `WithoutModule::Refuse`.
    Missing,
}

/// Why a call into Redis gave no reply.
#[derive(Debug)]
pub(crate) enum CallError {
    Redis(RedisError),
    /// The per-call deadline passed (async: the whole call; sync: the socket timeouts).
    Timeout(std::time::Duration),
    /// The blocking limiter's connection stayed taken by other calls for the whole deadline.
    Busy(std::time::Duration),
    Missing,
    Reply(String),
}

impl From<RedisError> for CallError {
    fn from(e: RedisError) -> Self {
        CallError::Redis(e)
    }
}

impl CallError {
    /// Whether the failure policy decides this one.
    pub(crate) fn unavailable(&self) -> bool {
        match self {
            CallError::Timeout(_) | CallError::Busy(_) => true,
            CallError::Redis(e) => is_unavailable(e),
            CallError::Missing | CallError::Reply(_) => false,
        }
    }

    pub(crate) fn into_error(self) -> Error {
        match self {
            CallError::Redis(e) => Error::Redis(e),
            CallError::Timeout(_) | CallError::Busy(_) => Error::Reply("timeout".into()),
            CallError::Missing => Error::ModuleMissing,
            CallError::Reply(text) => Error::Reply(text),
        }
    }

    fn describe(&self) -> String {
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
            CallError::Missing => "module missing".into(),
            CallError::Reply(text) => text.clone(),
        }
    }
}

/// Connection errors, timeouts, and the replies of a server that cannot take writes now:
/// OOM, READONLY, LOADING, and a cluster that is down, has no master or asks to try again.
pub(crate) fn is_unavailable(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    if matches!(
        e.kind(),
        ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::TryAgain
            )
    ) {
        return true;
    }
    matches!(
        e.code(),
        Some("OOM" | "READONLY" | "LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN")
    )
}

pub(crate) fn is_unknown_command(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.to_string().to_lowercase().contains("unknown command")
}

pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) || e.code() == Some("NOSCRIPT")
}

/// One limiter's state; see [`crate::Limiter`] for the meaning of each option.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) options: Options,
    /// The local buckets' clock: microseconds since this engine was built, plus one second so
    /// no instant is 0 (a state is a nonzero instant). Monotonic, so a wall clock stepping
    /// back cannot refill them.
    epoch: Instant,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: Option<Path>,
    sha: Option<String>,
    /// Redis answered CROSSSLOT once: a cluster (`crate::slots`).
    cluster: bool,
    counters: Counters,
    down_since: Option<Instant>,
    next_probe: Instant,
    /// Decisions taken without Redis in the current outage.
    without_redis: u64,
    /// When "busy, not down" was last logged: at most once a second.
    busy_logged: Option<Instant>,
    cache: DenyCache,
    local: LocalBuckets,
}

impl Engine {
    pub(crate) fn new(options: Options) -> Engine {
        let now = Instant::now();
        Engine {
            epoch: now,
            inner: Mutex::new(Inner {
                path: None,
                sha: None,
                cluster: false,
                counters: Counters::default(),
                down_since: None,
                next_probe: now,
                without_redis: 0,
                busy_logged: None,
                cache: DenyCache::new(options.deny_cache),
                local: LocalBuckets::new(options.instances, options.local_max_keys),
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
    pub(crate) fn failed(&self, error: &CallError) {
        let mut inner = self.lock();
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

    fn count_policy(&self, inner: &mut Inner) -> Source {
        let source = match self.options.on_error {
            OnError::Open => Source::Open,
            OnError::Closed => Source::Closed,
            OnError::Local => Source::Local,
        };
        inner.counters.count(source);
        inner.without_redis = inner.without_redis.saturating_add(1);
        source
    }

    pub(crate) fn policy_acquire(
        &self,
        key: &str,
        limit: &Limit,
        cost: f64,
        take: bool,
    ) -> Decision {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner);
        let reply = match source {
            Source::Open => open_reply(),
            Source::Closed => closed_reply(),
            _ => inner.local.acquire(key, limit, cost, now_us, take),
        };
        decision(reply, limit, source)
    }

    pub(crate) fn policy_acquire_all(&self, items: &[(&str, Limit, f64)]) -> MultiDecision {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner);
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

    pub(crate) fn policy_refund(&self, key: &str, limit: &Limit, cost: f64) -> Refund {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner);
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
            .then(|| self.policy_acquire(key, limit, cost, take))
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
            Err(e) if e.unavailable() => {
                self.failed(&e);
                Ok(self.policy_acquire(key, limit, cost, take))
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
        self.skip_redis().then(|| self.policy_acquire_all(items))
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
            Err(e) if e.unavailable() => {
                self.failed(&e);
                Ok(self.policy_acquire_all(items))
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
            .then(|| self.policy_charge(key, limit, cost))
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
            Err(e) if e.unavailable() => {
                self.failed(&e);
                self.policy_charge(key, limit, cost)
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
    ) -> Result<Charged, Error> {
        let now_us = self.now_us();
        let mut inner = self.lock();
        let source = self.count_policy(&mut inner);
        let (balance, retry_after_ms, reset_after_ms) = match source {
            Source::Local => inner
                .local
                .charge(key, limit, cost, now_us)
                .ok_or(Error::Invalid(DEBT_ERROR))?,
            Source::Closed => (0, CLOSED_RETRY_AFTER_MS, 0),
            _ => (0, 0, 0),
        };
        Ok(Charged {
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
            .then(|| self.policy_refund(key, limit, cost))
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
            Err(e) if e.unavailable() => {
                self.failed(&e);
                Ok(self.policy_refund(key, limit, cost))
            }
            Err(e) => Err(e.into_error()),
        }
    }

    // Building commands and reading replies ------------------------------------------------

    /// The path to use, if detected; `Missing` fails the call with `ModuleMissing`.
    pub(crate) fn ready(&self) -> Result<Option<Path>, CallError> {
        match self.lock().path {
            Some(Path::Missing) => Err(CallError::Missing),
            path => Ok(path),
        }
    }

    /// `COMMAND INFO RL.ACQUIRE`: the probe for the module.
    pub(crate) fn detect_command() -> redis::Cmd {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO").arg("RL.ACQUIRE");
        cmd
    }

    /// Reads COMMAND INFO's reply (a list holding nil when there is no such command).
    pub(crate) fn detected(&self, reply: &Value) -> Result<Path, CallError> {
        let present = match reply {
            Value::Array(items) => items.iter().any(|v| !matches!(v, Value::Nil)),
            Value::Map(items) => !items.is_empty(),
            _ => false,
        };
        let path = match (present, self.options.without_module) {
            (true, _) => Path::Module,
            (false, WithoutModule::Lua) => Path::Lua,
            (false, WithoutModule::Refuse) => Path::Missing,
        };
        let mut inner = self.lock();
        if inner.path != Some(path) {
            log::info!(
                "redis-rl: {path:?} path (module {})",
                if present { "found" } else { "not loaded" }
            );
        }
        inner.path = Some(path);
        match path {
            Path::Missing => Err(CallError::Missing),
            path => Ok(path),
        }
    }

    pub(crate) fn sha(&self) -> Option<String> {
        self.lock().sha.clone()
    }

    pub(crate) fn set_sha(&self, reply: Value) -> Result<String, CallError> {
        let sha: String = redis::from_redis_value(reply)
            .map_err(|e| CallError::Reply(format!("SCRIPT LOAD: {e}")))?;
        self.lock().sha = Some(sha.clone());
        Ok(sha)
    }

    pub(crate) fn script_load() -> redis::Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(script::SCRIPT);
        cmd
    }

    /// The module command, or EVALSHA with `sha` and the script's arguments.
    pub(crate) fn command(
        path: Path,
        sha: &str,
        op: Op,
        items: &[(Target<'_>, Limit, f64)],
    ) -> redis::Cmd {
        if path == Path::Module {
            let field = matches!(items.first(), Some((Target::Field { .. }, _, _)));
            let name = match (op, field) {
                (Op::Acquire, false) => "RL.ACQUIRE",
                (Op::Peek, false) => "RL.PEEK",
                (Op::Refund, false) => "RL.REFUND",
                (Op::Multi, _) => "RL.ACQUIRE.MULTI",
                (Op::Acquire, true) => "RL.HACQUIRE",
                (Op::Peek, true) => "RL.HPEEK",
                (Op::Refund, true) => "RL.HREFUND",
                (Op::Charge, false) => "RL.CHARGE",
                (Op::Charge, true) => "RL.HCHARGE",
            };
            let mut cmd = redis::cmd(name);
            for (target, limit, cost) in items {
                match *target {
                    Target::Key(key) => cmd.arg(key),
                    Target::Field { table, field, .. } => cmd.arg(table).arg(field),
                }
                // The texts the limit was validated with: `5/60` stays exact, where the
                // double 0.08333… would leave a fraction of a token in every state.
                .arg(limit.rate_text())
                .arg(limit.capacity_text())
                .arg(number(*cost));
            }
            return cmd;
        }
        let mode = match op {
            Op::Acquire => "acquire",
            Op::Peek => "peek",
            Op::Refund => "refund",
            Op::Multi => "multi",
            Op::Charge => "charge",
        };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(items.len());
        for (target, _, _) in items {
            cmd.arg(target.key());
        }
        cmd.arg(mode);
        for (_, limit, cost) in items {
            for arg in script::args(limit, *cost, op == Op::Refund) {
                cmd.arg(arg);
            }
        }
        cmd
    }
}

/// What an [`Exchange`] wants next: a command sent and its reply handed back, or its result.
pub(crate) enum Step {
    Send(redis::Cmd),
    Done(Result<Value, CallError>),
}

/// Where an [`Exchange`] is: which reply it waits for, and which retries it has used (once
/// each: a new detection after "unknown command", a new SCRIPT LOAD after NOSCRIPT).
#[derive(Clone, Copy)]
enum Stage {
    Detecting {
        redetected: bool,
    },
    Loading {
        path: Path,
        redetected: bool,
        reloaded: bool,
    },
    Sending {
        path: Path,
        redetected: bool,
        reloaded: bool,
    },
    Done,
}

/// One call's conversation with Redis, as steps, without I/O: the module's command, or the
/// script's EVALSHA (loading it first if no SHA is known); the module is detected first when
/// no call has yet, and again, once, after an "unknown command" (the module went away or
/// came); the script is loaded again, once, after NOSCRIPT.
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
}

impl<'a> Exchange<'a> {
    pub(crate) fn new(engine: &'a Engine, op: Op, items: &'a [(Target<'a>, Limit, f64)]) -> Self {
        Exchange {
            engine,
            op,
            items,
            stage: Stage::Done,
        }
    }

    /// The first step.
    pub(crate) fn start(&mut self) -> Step {
        match self.engine.ready() {
            Err(e) => self.done(Err(e)),
            Ok(Some(path)) => self.send(path, false, false),
            Ok(None) => self.detect(false),
        }
    }

    /// The next step, given the reply to the command of the last.
    pub(crate) fn reply(&mut self, reply: redis::RedisResult<Value>) -> Step {
        match (self.stage, reply) {
            (Stage::Done, _) => self.done(Err(CallError::Reply("a reply after the end".into()))),
            (Stage::Detecting { redetected }, Ok(value)) => match self.engine.detected(&value) {
                Ok(path) => self.send(path, redetected, false),
                Err(e) => self.done(Err(e)),
            },
            (
                Stage::Loading {
                    path,
                    redetected,
                    reloaded,
                },
                Ok(value),
            ) => match self.engine.set_sha(value) {
                Ok(sha) => {
                    self.stage = Stage::Sending {
                        path,
                        redetected,
                        reloaded,
                    };
                    Step::Send(Engine::command(path, &sha, self.op, self.items))
                }
                Err(e) => self.done(Err(e)),
            },
            (Stage::Sending { .. }, Ok(value)) => self.done(Ok(value)),
            (
                Stage::Sending {
                    path,
                    redetected,
                    reloaded,
                },
                Err(e),
            ) if path == Path::Lua && !reloaded && is_noscript(&e) => {
                self.load(path, redetected, true)
            }
            (Stage::Sending { redetected, .. } | Stage::Loading { redetected, .. }, Err(e))
                if !redetected && is_unknown_command(&e) =>
            {
                self.detect(true)
            }
            (_, Err(e)) => self.done(Err(CallError::Redis(e))),
        }
    }

    fn detect(&mut self, redetected: bool) -> Step {
        self.stage = Stage::Detecting { redetected };
        Step::Send(Engine::detect_command())
    }

    fn load(&mut self, path: Path, redetected: bool, reloaded: bool) -> Step {
        self.stage = Stage::Loading {
            path,
            redetected,
            reloaded,
        };
        Step::Send(Engine::script_load())
    }

    fn send(&mut self, path: Path, redetected: bool, reloaded: bool) -> Step {
        let sha = match path {
            Path::Module => String::new(),
            _ => match self.engine.sha() {
                Some(sha) => sha,
                None => return self.load(path, redetected, reloaded),
            },
        };
        self.stage = Stage::Sending {
            path,
            redetected,
            reloaded,
        };
        Step::Send(Engine::command(path, &sha, self.op, self.items))
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

fn reply_of(value: &Value) -> Result<Reply, CallError> {
    let v = integers(value, "RL.ACQUIRE reply", 4)?;
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

/// RL.CHARGE's reply: `[1, balance, retry_after_ms, reset_after_ms]`, the balance signed.
pub(crate) fn read_charged(
    value: &Value,
    limit: &Limit,
    source: Source,
) -> Result<Charged, CallError> {
    let v = integers(value, "RL.CHARGE reply", 4)?;
    match v.as_slice() {
        [1, balance, retry, reset] => Ok(Charged {
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

    const MODULE: &str = "*1\r\n*1\r\n$10\r\nrl.acquire\r\n";
    const NO_MODULE: &str = "*1\r\n_\r\n";
    const DECISION: &str = "*4\r\n:1\r\n:9\r\n:0\r\n:200\r\n";
    const SHA: &str = "$3\r\nabc\r\n";
    const UNKNOWN: &str = "-ERR unknown command 'RL.ACQUIRE'\r\n";
    const NOSCRIPT: &str = "-NOSCRIPT No matching script.\r\n";

    #[test]
    fn a_cold_call_detects_the_module_then_sends() {
        let engine = Engine::new(Options::new(OnError::Closed));
        assert_eq!(
            run(&engine, &[MODULE, DECISION]),
            ["COMMAND", "RL.ACQUIRE", "done: ok"]
        );
        // Warm: straight to the command.
        assert_eq!(run(&engine, &[DECISION]), ["RL.ACQUIRE", "done: ok"]);
    }

    #[test]
    fn a_module_gone_is_detected_again_once_and_the_script_loaded() {
        let engine = Engine::new(Options::new(OnError::Closed));
        run(&engine, &[MODULE, DECISION]);
        assert_eq!(
            run(&engine, &[UNKNOWN, NO_MODULE, SHA, DECISION]),
            ["RL.ACQUIRE", "COMMAND", "SCRIPT", "EVALSHA", "done: ok"]
        );
        assert_eq!(engine.path(), Some(Path::Lua));
    }

    #[test]
    fn noscript_loads_the_script_again_once() {
        let engine = Engine::new(Options::new(OnError::Closed));
        assert_eq!(
            run(&engine, &[NO_MODULE, SHA, NOSCRIPT, SHA, DECISION]),
            ["COMMAND", "SCRIPT", "EVALSHA", "SCRIPT", "EVALSHA", "done: ok"]
        );
        // A second NOSCRIPT in the same call is returned, not looped on.
        assert_eq!(
            run(&engine, &[NOSCRIPT, SHA, NOSCRIPT]),
            ["EVALSHA", "SCRIPT", "EVALSHA", "done: err"]
        );
    }

    #[test]
    fn an_unknown_command_after_a_new_detection_is_returned() {
        let engine = Engine::new(Options::new(OnError::Closed));
        assert_eq!(
            run(&engine, &[MODULE, UNKNOWN, MODULE, UNKNOWN]),
            [
                "COMMAND",
                "RL.ACQUIRE",
                "COMMAND",
                "RL.ACQUIRE",
                "done: err"
            ]
        );
    }
}
