//! The library's values: [`Limit`], [`Decision`], [`MultiDecision`], [`Refund`], [`Charged`],
//! [`Source`], the options ([`Options`], [`OnError`], [`WithoutModule`]), [`Counters`] and [`Error`].
//!
//! Nothing here does I/O; the names are the Python and Node libraries' names.

use std::fmt;
use std::time::Duration;

/// What a `closed` decision tells the caller to wait, in ms (it cannot know better).
pub const CLOSED_RETRY_AFTER_MS: i64 = 1000;

/// A validated limit: `rate` tokens per second (or `tokens` per `period`), a burst of
/// `capacity` tokens, with the module's ranges. Built once where it is written, so a bad limit
/// fails there rather than on every request.
///
/// What is sent to Redis is text the module reads as an exact decimal: `Limit::new(0.1, 1.0)`
/// sends `0.1` (one token every 10 s exactly, not the double nearest 0.1), and
/// `Limit::per(100, Duration::from_secs(60))` sends `100/60`. The local bucket (the `Local`
/// policy) and the Lua fallback use the exact value of that same text.
///
/// ```
/// use std::time::Duration;
/// use redis_rl_client::Limit;
///
/// let per_minute = Limit::per(100, Duration::from_secs(60))?;
/// assert_eq!(per_minute.rate_text(), "100/60");
/// assert_eq!(per_minute.capacity(), 100.0);
/// let with_burst = per_minute.with_capacity(10.0)?;
/// assert_eq!((with_burst.rate_text(), with_burst.capacity_text()), ("100/60".into(), "10".into()));
/// assert_eq!(Limit::new(0.1, 1.0)?.rate_text(), "0.1");
/// # Ok::<(), redis_rl_client::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    rate: Rate,
    capacity: f64,
    /// The module's bucket for the texts `rate` and `capacity` print: the local decisions'.
    bucket: rl_bucket::Limit,
}

/// How the caller wrote the rate; its text is what is sent.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rate {
    /// Tokens per second, sent as Rust prints the double: its shortest round-trip decimal.
    PerSecond(f64),
    /// `tokens` every `period`, sent as `tokens/seconds`, the period in exact decimal seconds.
    Per { tokens: u64, period: Duration },
}

impl Rate {
    fn text(self) -> String {
        match self {
            Rate::PerSecond(rate_per_s) => number(rate_per_s),
            Rate::Per { tokens, period } => format!("{tokens}/{}", seconds(period)),
        }
    }
}

/// A duration in exact decimal seconds: "60", "1.5", "0.000000001".
fn seconds(period: Duration) -> String {
    let nanos = period.subsec_nanos();
    if nanos == 0 {
        return period.as_secs().to_string();
    }
    let fraction = format!("{nanos:09}");
    format!("{}.{}", period.as_secs(), fraction.trim_end_matches('0'))
}

impl Limit {
    /// `rate_per_s` tokens per second and a burst of `capacity` tokens. The module is sent
    /// `format!("{rate_per_s}")` and `format!("{capacity}")`: each the shortest decimal that
    /// round-trips the double, which the module takes exactly.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the argument unless `1e-6 <= rate_per_s <= 1e9`,
    /// `0 < capacity <= 1e15` and `capacity / rate_per_s <= 3153600000` (a full refill within
    /// 100 years), as the module checks them (clients/vectors/ranges.json).
    pub fn new(rate_per_s: f64, capacity: f64) -> Result<Limit, Error> {
        if !rate_per_s.is_finite() || rate_per_s < 0.0 {
            return Err(Error::Invalid(RATE_ERROR));
        }
        Limit::build(Rate::PerSecond(rate_per_s), capacity)
    }

    /// `tokens` every `period`, with a burst of `tokens` (change it with
    /// [`Limit::with_capacity`]). Sent to the module as `tokens/seconds`, the period in exact
    /// decimal seconds: `Limit::per(100, Duration::from_secs(60))` is `100/60`, one token
    /// every 0.6 s exactly, which no decimal rate can say.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the argument unless `tokens / period` is from 1e-6 to 1e9
    /// tokens per second (`tokens` and `period` above zero), the capacity `tokens` is at most
    /// 1e15, and a full refill takes at most 100 years.
    pub fn per(tokens: u64, period: Duration) -> Result<Limit, Error> {
        if tokens == 0 || period.is_zero() {
            return Err(Error::Invalid(RATE_ERROR));
        }
        // Beyond 2^53 the capacity would not be exact, but it is then far above 1e15 anyway.
        Limit::build(Rate::Per { tokens, period }, tokens as f64)
    }

    /// The same rate with a burst of `capacity` tokens.
    ///
    /// # Errors
    /// [`Error::Invalid`] unless `0 < capacity <= 1e15` and a full refill takes at most 100
    /// years at this rate.
    pub fn with_capacity(self, capacity: f64) -> Result<Limit, Error> {
        Limit::build(self.rate, capacity)
    }

    fn build(rate: Rate, capacity: f64) -> Result<Limit, Error> {
        if !capacity.is_finite() || capacity < 0.0 {
            return Err(Error::Invalid(CAPACITY_ERROR));
        }
        // The very texts that will be sent, parsed as the module parses them.
        let bucket = rl_bucket::Limit::parse(rate.text().as_bytes(), number(capacity).as_bytes())
            .map_err(|e| {
            Error::Invalid(match e {
                rl_bucket::LimitError::Rate => RATE_ERROR,
                rl_bucket::LimitError::Capacity => CAPACITY_ERROR,
                rl_bucket::LimitError::RefillTime => REFILL_ERROR,
            })
        })?;
        Ok(Limit {
            rate,
            capacity,
            bucket,
        })
    }

    /// Tokens per second (the nearest double; the module gets the exact [`Limit::rate_text`]).
    pub fn rate_per_s(&self) -> f64 {
        match self.rate {
            Rate::PerSecond(rate_per_s) => rate_per_s,
            Rate::Per { tokens, period } => tokens as f64 / period.as_secs_f64(),
        }
    }

    /// The burst, in tokens.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The rate as sent to the module: a decimal ("5", "0.1") or `tokens/seconds` ("100/60").
    pub fn rate_text(&self) -> String {
        self.rate.text()
    }

    /// The capacity as sent to the module.
    pub fn capacity_text(&self) -> String {
        number(self.capacity)
    }

    /// `tokens` and `period` when the limit was built with [`Limit::per`].
    pub fn period(&self) -> Option<(u64, Duration)> {
        match self.rate {
            Rate::PerSecond(_) => None,
            Rate::Per { tokens, period } => Some((tokens, period)),
        }
    }

    /// The module's bucket for this limit (what `Local` decides with when `instances` is 1).
    pub fn bucket(&self) -> &rl_bucket::Limit {
        &self.bucket
    }

    /// This limit shared by `instances` processes: the rate exactly (`rate/instances` as
    /// `N/S`), the capacity as the double `capacity / instances` (within half an ulp: a
    /// capacity need not divide into a decimal). `None` when the share is out of range.
    pub(crate) fn share(&self, instances: u32) -> Option<rl_bucket::Limit> {
        let rate = match self.rate {
            Rate::PerSecond(rate_per_s) => format!("{}/{instances}", number(rate_per_s)),
            Rate::Per { tokens, period } => {
                format!("{tokens}/{}", seconds(period.checked_mul(instances)?))
            }
        };
        let capacity = number(self.capacity / f64::from(instances));
        rl_bucket::Limit::parse(rate.as_bytes(), capacity.as_bytes()).ok()
    }
}

/// The module's error texts for each argument, without the `ERR ` prefix; the same as
/// clients/vectors/ranges.json (a test checks them).
pub(crate) const RATE_ERROR: &str =
    "rate must be a number from 0.000001 to 1000000000 (tokens per second)";
pub(crate) const CAPACITY_ERROR: &str =
    "capacity must be a number above 0 and at most 1e15 (tokens)";
pub(crate) const REFILL_ERROR: &str =
    "capacity / rate must be at most 3153600000 (a full refill within 100 years)";
pub(crate) const COST_ERROR: &str = "cost must be a finite number >= 0 (tokens)";
/// The module's refusal of a charge past its bound, for the local bucket's (nothing written).
pub(crate) const DEBT_ERROR: &str = "cost would leave the bucket in debt for more than 100 years \
     (it must be full again within 3153600000 s, and before 2262)";

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
    /// The Lua fallback script (EVALSHA), on a server without the module.
    Lua,
    /// The Functions library `redis_rl` (FCALL), on a server without the module where an
    /// admin loaded it ([`crate::load_functions`]).
    Functions,
}

impl Source {
    /// The lowercase name the other libraries use: "redis", "cache", "local", "open",
    /// "closed", "lua", "functions".
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Cache => "cache",
            Source::Local => "local",
            Source::Open => "open",
            Source::Closed => "closed",
            Source::Lua => "lua",
            Source::Functions => "functions",
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
    /// A decision of the `Open` or `Closed` failure policy knows the limit but not what is
    /// left: `X-RateLimit-Limit` (and `Retry-After`) only, as the Python and Node clients.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![("X-RateLimit-Limit", self.limit.capacity_text())];
        if !matches!(self.source, Source::Open | Source::Closed) {
            headers.push(("X-RateLimit-Remaining", self.remaining.to_string()));
            headers.push(("X-RateLimit-Reset", ceil_s(self.reset_after_ms).to_string()));
        }
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

/// The answer of `charge`: a post-paid cost always applies, so there is no `allowed`, only the
/// bucket after it. Its balance is signed: a charge may take the bucket below zero (in debt),
/// and while it is, every acquire is denied, cost 0 included, until refill repays the debt.
///
/// ```
/// use redis_rl_client::{Charged, Limit, Source};
///
/// // 3 tokens/s, burst 3, charged 5 on a full bucket: two tokens in debt.
/// let c = Charged { applied: true, balance: -2, retry_after_ms: 667, reset_after_ms: 1667,
///                   limit: Limit::new(3.0, 3.0)?, source: Source::Redis };
/// assert!(c.in_debt());
/// assert_eq!(c.remaining(), 0);
/// # Ok::<(), redis_rl_client::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Charged {
    /// Whether the charge (or settle) was recorded somewhere: by Redis, or by the `Local`
    /// policy's bucket. `false` when the `Open` or `Closed` policy answered, or a reservation
    /// Redis holds was settled while Redis could not answer (then it stands as taken there
    /// until its ttl): the usage is the caller's to send again, and is counted in
    /// [`Counters::unapplied_charges`]. The numbers are then 0 (`Closed`'s charge: its wait).
    pub applied: bool,
    /// Whole tokens after the charge, rounded toward −∞: negative while in debt.
    pub balance: i64,
    /// Until the debt is repaid (a cost-0 acquire passes again), in ms rounded up; 0 when not
    /// in debt. `Retry-After` for the next request.
    pub retry_after_ms: i64,
    /// Until the bucket is full again, in ms rounded up.
    pub reset_after_ms: i64,
    /// The limit charged.
    pub limit: Limit,
    /// Who applied it: `Redis`, `Lua`, or the failure policy (`Local` charged its local
    /// bucket; `Open` and `Closed` charged nothing).
    pub source: Source,
}

impl Charged {
    /// Whether the bucket owes tokens: acquires are denied until `retry_after_ms` passes.
    pub fn in_debt(&self) -> bool {
        self.balance < 0
    }

    /// `X-RateLimit-Remaining`: the balance, 0 while in debt.
    pub fn remaining(&self) -> u64 {
        u64::try_from(self.balance).unwrap_or(0)
    }

    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`, and `Retry-After` while in debt, as
    /// [`Decision::headers`] (`X-RateLimit-Limit` only when `Open` or `Closed` charged nothing).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        Decision {
            allowed: !self.in_debt(),
            remaining: self.remaining(),
            retry_after_ms: self.retry_after_ms,
            reset_after_ms: self.reset_after_ms,
            limit: self.limit,
            source: self.source,
        }
        .headers()
    }
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
    /// Use the Functions library `redis_rl` if an admin loaded it (FCALL), else run the
    /// shipped Lua script (clients/lua/rl.lua) with EVALSHA, or EVAL when the server has not
    /// cached it: the module's decisions, slower, one string per bucket.
    Lua,
    /// The module only. Without it the server is misconfigured for this limiter: `check`
    /// returns [`Error::Misconfigured`], and calls are decided by the failure policy (logged
    /// and counted in [`Counters::misconfigured`]).
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

/// Each call's deadline unless [`Options::timeout`] sets another: long enough for calls
/// queued behind thousands of others on one connection, a connection still opening, or a slow
/// reply under load (busy is not down), short enough for a web request. The Node library's
/// `DEFAULT_TIMEOUT_MS` is the same.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The deny cache's size bound when it is switched on with `true`.
pub const DEFAULT_DENY_CACHE_ENTRIES: usize = 10_000;

impl Options {
    /// Settings with the failure policy `on_error`, one instance, no deny cache, the Lua
    /// fallback, a [`DEFAULT_TIMEOUT`] (2 s) deadline per call, Redis tried again every
    /// 100 ms during an outage, and at most 100,000 local buckets.
    pub fn new(on_error: OnError) -> Options {
        Options {
            on_error,
            instances: 1,
            deny_cache: 0,
            without_module: WithoutModule::Lua,
            timeout: DEFAULT_TIMEOUT,
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

    /// Each call's deadline ([`DEFAULT_TIMEOUT`], 2 s, by default); past it the failure
    /// policy decides. The async limiter bounds the whole call with it, waiting for the
    /// connection to open and for the calls queued ahead included. The blocking one waits at
    /// most this long for its turn on its connection (past it, the policy decides that call,
    /// counted in [`Counters::busy`], and no outage begins), then sets it as the connect,
    /// read and write timeouts, so a call that also finds the path (its first, or the first
    /// after the path stopped answering: the module's command, FCALL_RO rl_version, then the
    /// function or EVALSHA and EVAL) can take up to five of them. During a known outage calls do not wait for it: the policy decides at once
    /// between probes (`probe_interval`). Make it shorter only if a request cannot wait that
    /// long, knowing that calls then missing it under load are decided by the policy as if
    /// Redis were down.
    ///
    /// A call past its deadline may still reach Redis afterwards: a command already written
    /// (or queued on a multiplexed connection) is not withdrawn when the caller stops
    /// waiting, so Redis may apply it after the policy decided. An acquire then takes its
    /// tokens for a request the policy answered; nothing gives them back, since the library
    /// cannot know whether it ran (a `refund` would give back tokens that may never have been
    /// taken). The error is on the strict side (a bucket short of at most that call's cost),
    /// and it is why a deadline too short for the load makes limits stricter as well as
    /// handing decisions to the policy.
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
    /// Answered by the Functions library.
    pub functions: u64,
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
    /// Calls of a blocking [`crate::Limiter`] whose turn on its connection did not come within
    /// the deadline: busy, not down. The policy decided them, and no outage began.
    pub busy: u64,
    /// Calls the failure policy decided because Redis is misconfigured for this client
    /// (authentication, a missing ACL permission, a cluster client on a standalone server or
    /// the reverse, no module under [`WithoutModule::Refuse`]). Each is logged at error level
    /// with its cause; they are counted here only, not in `open`, `closed` or `local`, and
    /// start no outage.
    pub misconfigured: u64,
    /// Charges and settles recorded nowhere ([`Charged::applied`] `false`): a charge the `Open`
    /// or `Closed` policy answered, or a settle of a reservation Redis holds while Redis could
    /// not answer. Each is logged at warn level with its key and cost.
    pub unapplied_charges: u64,
}

impl Counters {
    pub(crate) fn count(&mut self, source: Source) {
        let slot = match source {
            Source::Redis => &mut self.redis,
            Source::Lua => &mut self.lua,
            Source::Functions => &mut self.functions,
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
    /// Redis is reachable but misconfigured for this client: the text names the cause and the
    /// fix (a wrong password, the ACL rule to add, a cluster client on a standalone server or
    /// the reverse, no module under [`WithoutModule::Refuse`]). Returned by `check`; at run
    /// time the failure policy decides such calls instead.
    Misconfigured(String),
    /// An error reply the failure policy does not cover (WRONGTYPE, a script error …).
    Redis(redis::RedisError),
    /// A reply of an unexpected shape.
    Reply(String),
    /// A wait for a free lease slot ([`crate::Limiter::hold`]) ran out: how long it waited,
    /// and the last denial's `retry_after_ms`.
    TimedOut {
        /// The wait asked for, in ms.
        waited_ms: u64,
        /// What the last denial said to wait, in ms.
        retry_after_ms: i64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(text) => f.write_str(text),
            Error::Misconfigured(cause) => {
                write!(f, "Redis is misconfigured for redis-rl: {cause}")
            }
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Reply(text) => write!(f, "unexpected reply: {text}"),
            Error::TimedOut {
                waited_ms,
                retry_after_ms,
            } => write!(
                f,
                "timed out: no free slot within {waited_ms} ms (the last denial said to retry \
                 after {retry_after_ms} ms)"
            ),
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
        Err(Error::Invalid(COST_ERROR))
    }
}

/// A double as the text sent for it: Rust prints the shortest decimal that round-trips,
/// without an exponent ("10", "0.000001", "2500"), and the module takes that decimal exactly.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// clients/vectors/ranges.json: the one statement of the module's ranges and texts.
    const RANGES: &str = include_str!("../../vectors/ranges.json");

    fn ranges() -> serde_json::Value {
        serde_json::from_str(RANGES).unwrap()
    }

    #[test]
    fn error_texts_are_the_shared_ones() {
        let doc = ranges();
        for (argument, text) in [
            ("rate", RATE_ERROR),
            ("capacity", CAPACITY_ERROR),
            ("refill", REFILL_ERROR),
            ("cost", COST_ERROR),
        ] {
            assert_eq!(doc[argument]["error"], text, "{argument}");
        }
    }

    /// The case's limit as a caller writes it: `Limit::new` for a decimal rate, `Limit::per`
    /// and `with_capacity` for N/S.
    fn limit_of(case: &serde_json::Value) -> Result<Limit, Error> {
        let rate = case["rate"].as_str().unwrap();
        let capacity: f64 = case["capacity"].as_str().unwrap().parse().unwrap();
        match rate.split_once('/') {
            Some((tokens, seconds)) => {
                let period = Duration::from_secs_f64(seconds.parse().unwrap());
                Limit::per(tokens.parse().unwrap(), period)?.with_capacity(capacity)
            }
            None => Limit::new(rate.parse().unwrap(), capacity),
        }
    }

    #[test]
    fn every_boundary_case_gets_the_shared_answer() {
        let doc = ranges();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 20);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let cost: f64 = case["cost"].as_str().unwrap().parse().unwrap();
            let got = match limit_of(case).and_then(|_| check_cost(cost)) {
                Ok(_) => None,
                Err(Error::Invalid(text)) => Some(text),
                Err(e) => panic!("{name}: {e}"),
            };
            let want = case["error"]
                .as_str()
                .map(|argument| doc[argument]["error"].as_str().unwrap());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn numbers_and_periods_are_sent_as_exact_decimals() {
        let limit = Limit::per(100, Duration::from_secs(60)).unwrap();
        assert_eq!(
            (limit.rate_text(), limit.capacity_text()),
            ("100/60".to_string(), "100".to_string())
        );
        assert_eq!(limit.bucket().ns_per_token(), (600_000_000, 1));
        let limit = Limit::per(3, Duration::from_millis(1500)).unwrap();
        assert_eq!(limit.rate_text(), "3/1.5");
        assert_eq!(
            Limit::per(1, Duration::from_nanos(1_000_000_001))
                .unwrap()
                .rate_text(),
            "1/1.000000001"
        );
        assert_eq!(Limit::new(0.1, 1e-7).unwrap().rate_text(), "0.1");
        assert_eq!(Limit::new(0.1, 1e-7).unwrap().capacity_text(), "0.0000001");
        assert_eq!(
            Limit::new(0.1, 1.0).unwrap().bucket().ns_per_token(),
            (10_000_000_000, 1)
        );
        // The capacity defaults to the count, and changes without touching the rate.
        let burst = Limit::per(100, Duration::from_secs(60))
            .unwrap()
            .with_capacity(5.0)
            .unwrap();
        assert_eq!(burst.capacity(), 5.0);
        assert_eq!(burst.period(), Some((100, Duration::from_secs(60))));
        assert!(matches!(
            Limit::per(0, Duration::from_secs(1)),
            Err(Error::Invalid(RATE_ERROR))
        ));
        assert!(matches!(
            Limit::per(1, Duration::ZERO),
            Err(Error::Invalid(RATE_ERROR))
        ));
        assert!(matches!(
            Limit::per(1, Duration::from_secs(10_000_000)),
            Err(Error::Invalid(RATE_ERROR))
        ));
        assert!(matches!(
            burst.with_capacity(0.0),
            Err(Error::Invalid(CAPACITY_ERROR))
        ));
    }

    #[test]
    fn a_share_divides_the_rate_exactly() {
        // 100 a minute over 4 instances: 100 every 240 s, 2.4 s a token, exactly.
        let share = Limit::per(100, Duration::from_secs(60))
            .unwrap()
            .share(4)
            .unwrap();
        assert_eq!(share.ns_per_token(), (2_400_000_000, 1));
        assert_eq!(share.capacity(), 25.0);
        // 0.3 per second over 3: one token every 10 s.
        let share = Limit::new(0.3, 3.0).unwrap().share(3).unwrap();
        assert_eq!(share.ns_per_token(), (10_000_000_000, 1));
        // Below the slowest rate: no share (the Local policy then denies, as Closed would).
        assert!(Limit::new(0.000001, 1.0).unwrap().share(2).is_none());
    }
}
