//! Leases (at most `limit` in flight per key, RL.LEASE …) and reservations (an estimate taken
//! now and settled with the actual cost, RL.RESERVE / RL.SETTLE): the values the limiters
//! return, each call as the command of each path, the replies read back, and the `Local`
//! policy's in-process lease table and open reservations. No I/O and no clock here: the
//! caller passes the time in and holds the engine's lock.
//!
//! Every call sends an id, on every path: the caller's, or 16 lowercase hex characters drawn
//! here from the system's CSPRNG. The fallbacks cannot draw randomness, and with an id of its
//! own a take retried after a lost reply is answered as held instead of taking a second slot.

use std::fmt;

use redis::Value;

use crate::local::Bounded;
use crate::op::{CallError, Op};
use crate::script;
use crate::types::{number, Charged, Error, Limit, Source, CLOSED_RETRY_AFTER_MS};

/// The module's bounds on a lease's `limit` and on any `ttl_ms` (100 years).
pub(crate) const MAX_LEASE_LIMIT: u32 = 10_000;
pub(crate) const MAX_TTL_MS: u64 = 3_153_600_000_000;
/// The module's bound on a key's open reservations; the local table keeps the same.
const MAX_OPEN_RESERVATIONS: usize = 1000;

const LIMIT_ERROR: &str = "limit must be an integer from 1 to 10000 (leases)";
const TTL_ERROR: &str = "ttl_ms must be an integer from 1 to 3153600000000 (ms)";
const ID_ERROR: &str = "id must be 1 to 16 bytes";
const POLICY_ID_ERROR: &str =
    "id must not start with \"open:\" or \"local:\" (the failure policy's ids)";
const ESTIMATE_ERROR: &str = "estimate must be a number above 0 (tokens)";
const ACTUAL_ERROR: &str = "actual must be a finite number >= 0 (tokens)";
pub(crate) const NOT_OPEN_ERROR: &str =
    "id is not an open reservation of this key (settled, expired or never made)";

/// The prefix of a lease or reservation id the `Open` policy made: never sent to Redis, and
/// releasing or settling it does nothing.
pub const OPEN_ID_PREFIX: &str = "open:";

/// The prefix of a lease or reservation id the `Local` policy made (when the caller gave
/// none): never sent to Redis, so its release, renew and settle are answered in this process,
/// even once Redis is back.
pub const LOCAL_ID_PREFIX: &str = "local:";

/// Whether `id` starts with one of the failure policy's prefixes: `Open` or `Local`.
pub(crate) fn policy_of(id: &str) -> Option<Source> {
    if id.starts_with(OPEN_ID_PREFIX) {
        Some(Source::Open)
    } else if id.starts_with(LOCAL_ID_PREFIX) {
        Some(Source::Local)
    } else {
        None
    }
}

/// The answer to a take ([`crate::Limiter::lease`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Whether the lease was taken (or, for a caller's id already held, is held).
    pub allowed: bool,
    /// The lease's id when taken; empty when denied. `open:…` when the `Open` policy allowed
    /// it without Redis, `local:…` when the `Local` policy took it (and the caller gave no id).
    pub id: String,
    /// Leases held after the call, this one included (when denied: held now).
    pub in_use: u64,
    /// When taken: ms until this lease expires (exactly `ttl_ms` when new). 0 when denied.
    pub expires_in_ms: i64,
    /// When denied: ms until a slot frees, rounded up. 0 when taken.
    pub retry_after_ms: i64,
    /// The limit asked for.
    pub limit: u32,
    /// Who decided: `Redis`, `Functions`, `Lua`, or the failure policy.
    pub source: Source,
}

impl Lease {
    /// `X-RateLimit-Remaining`: `max(0, limit - in_use)`.
    pub fn remaining(&self) -> u64 {
        u64::from(self.limit).saturating_sub(self.in_use)
    }
}

/// The count of a key's leases ([`crate::Limiter::leases`]), taking nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseCount {
    /// Leases held now.
    pub in_use: u64,
    /// 0 when a take under the limit would pass; else ms until one would.
    pub retry_after_ms: i64,
    /// Who answered.
    pub source: Source,
}

/// A reservation's answer, without the limiter it settles on: what
/// [`crate::Limiter::reserve`] returns inside a [`Reservation`].
#[derive(Clone, Debug, PartialEq)]
pub struct Reserved {
    /// Whether the estimate was taken.
    pub allowed: bool,
    /// The reservation's id when taken; empty when denied.
    pub id: String,
    /// Whole tokens left after the take (when denied: left now).
    pub remaining: u64,
    /// When denied: ms until the estimate fits, rounded up; -1 if it never can (above the
    /// capacity). 0 when taken.
    pub retry_after_ms: i64,
    /// The bucket.
    pub key: String,
    /// Its limit.
    pub limit: Limit,
    /// The tokens taken now.
    pub estimate: f64,
    /// Who decided.
    pub source: Source,
}

/// A reservation on the limiter `L` it was taken from: settle it once with
/// [`Reservation::settle`] when the actual cost is known (the method consumes it, so a second
/// settle cannot be written). One never settled stands as taken when its `ttl_ms` runs out.
pub struct Reservation<'a, L> {
    pub(crate) limiter: &'a L,
    /// What the reserve answered.
    pub reserved: Reserved,
}

impl<L> fmt::Debug for Reservation<'_, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("reserved", &self.reserved)
            .finish_non_exhaustive()
    }
}

impl<L> std::ops::Deref for Reservation<'_, L> {
    type Target = Reserved;

    fn deref(&self) -> &Reserved {
        &self.reserved
    }
}

/// One lease or reservation call, with its checked arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call<'a> {
    Lease {
        key: &'a str,
        limit: u32,
        ttl_ms: u64,
        id: &'a str,
        /// Whether `id` was drawn here (the caller gave none): the `Local` policy then
        /// prefixes it with `local:`.
        drawn: bool,
    },
    Release {
        key: &'a str,
        id: &'a str,
    },
    Renew {
        key: &'a str,
        id: &'a str,
        ttl_ms: u64,
    },
    Leases {
        key: &'a str,
        limit: u32,
    },
    Reserve {
        key: &'a str,
        limit: Limit,
        estimate: f64,
        ttl_ms: u64,
        id: &'a str,
        /// As for `Lease`.
        drawn: bool,
    },
    Settle {
        key: &'a str,
        limit: Limit,
        id: &'a str,
        actual: f64,
    },
}

impl Call<'_> {
    pub(crate) fn op(&self) -> Op {
        match self {
            Call::Lease { .. } => Op::Lease,
            Call::Release { .. } => Op::Release,
            Call::Renew { .. } => Op::Renew,
            Call::Leases { .. } => Op::Leases,
            Call::Reserve { .. } => Op::Reserve,
            Call::Settle { .. } => Op::Settle,
        }
    }

    pub(crate) fn key(&self) -> &str {
        match *self {
            Call::Lease { key, .. }
            | Call::Release { key, .. }
            | Call::Renew { key, .. }
            | Call::Leases { key, .. }
            | Call::Reserve { key, .. }
            | Call::Settle { key, .. } => key,
        }
    }

    /// The module's command: RL.LEASE key limit ttl_ms ID id, and so on.
    pub(crate) fn module_command(&self) -> redis::Cmd {
        let mut cmd = redis::cmd(self.op().module_name());
        cmd.arg(self.key());
        match *self {
            Call::Lease {
                limit, ttl_ms, id, ..
            } => cmd.arg(limit).arg(ttl_ms).arg("ID").arg(id),
            Call::Release { id, .. } => cmd.arg(id),
            Call::Renew { id, ttl_ms, .. } => cmd.arg(id).arg(ttl_ms),
            Call::Leases { limit, .. } => cmd.arg(limit),
            Call::Reserve {
                limit,
                estimate,
                ttl_ms,
                id,
                ..
            } => cmd
                .arg(limit.rate_text())
                .arg(limit.capacity_text())
                .arg(number(estimate))
                .arg(ttl_ms)
                .arg("ID")
                .arg(id),
            Call::Settle {
                limit, id, actual, ..
            } => cmd
                .arg(limit.rate_text())
                .arg(limit.capacity_text())
                .arg(id)
                .arg(number(actual)),
        };
        cmd
    }

    /// The fallbacks' arguments after the key (the script's mode goes before them).
    pub(crate) fn fallback_args(&self, cmd: &mut redis::Cmd) {
        match *self {
            Call::Lease {
                limit, ttl_ms, id, ..
            } => {
                cmd.arg(limit).arg(ttl_ms).arg(id);
            }
            Call::Release { id, .. } => {
                cmd.arg(id);
            }
            Call::Renew { id, ttl_ms, .. } => {
                cmd.arg(id).arg(ttl_ms);
            }
            Call::Leases { limit, .. } => {
                cmd.arg(limit);
            }
            Call::Reserve {
                limit,
                estimate,
                ttl_ms,
                id,
                ..
            } => {
                cmd.arg(script::packed(&limit, estimate, false));
                cmd.arg(ttl_ms).arg(id);
            }
            Call::Settle {
                limit, id, actual, ..
            } => {
                // A charge's numbers for `actual` (K rounded up): the script nets the settle
                // to `actual` taken, never more lenient than the module.
                cmd.arg(script::packed(&limit, actual, false));
                cmd.arg(id);
            }
        }
    }
}

/// A lease's `limit` as the module takes it.
pub(crate) fn check_limit(limit: u32) -> Result<u32, Error> {
    if (1..=MAX_LEASE_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(Error::Invalid(LIMIT_ERROR))
    }
}

pub(crate) fn check_ttl(ttl_ms: u64) -> Result<u64, Error> {
    if (1..=MAX_TTL_MS).contains(&ttl_ms) {
        Ok(ttl_ms)
    } else {
        Err(Error::Invalid(TTL_ERROR))
    }
}

pub(crate) fn check_id(id: &str) -> Result<&str, Error> {
    if (1..=16).contains(&id.len()) {
        Ok(id)
    } else {
        Err(Error::Invalid(ID_ERROR))
    }
}

pub(crate) fn check_estimate(estimate: f64) -> Result<f64, Error> {
    if estimate.is_finite() && estimate > 0.0 {
        Ok(estimate)
    } else {
        Err(Error::Invalid(ESTIMATE_ERROR))
    }
}

pub(crate) fn check_actual(actual: f64) -> Result<f64, Error> {
    if actual.is_finite() && actual >= 0.0 {
        Ok(actual)
    } else {
        Err(Error::Invalid(ACTUAL_ERROR))
    }
}

/// An id as a release, renew or settle takes it: one Redis could hold, or one the `Open` or
/// `Local` policy made (longer, never sent).
pub(crate) fn check_held_id(id: &str) -> Result<&str, Error> {
    if policy_of(id).is_some() {
        return Ok(id);
    }
    check_id(id)
}

/// 16 lowercase hex characters from the system's CSPRNG.
///
/// # Errors
/// [`Error::Reply`] if the system has no random source to read (never on Linux after boot).
pub(crate) fn new_id() -> Result<String, Error> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| Error::Reply(format!("no random source for a lease id: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The caller's id, checked, or a new one; and whether it was drawn here. A caller's id
/// starting with a failure policy's prefix is refused: its release or settle would be answered
/// in this process, never reaching the Redis lease it names.
pub(crate) fn id_or_new(id: Option<&str>) -> Result<(String, bool), Error> {
    match id {
        Some(id) if policy_of(id).is_some() => Err(Error::Invalid(POLICY_ID_ERROR)),
        Some(id) => check_id(id).map(|id| (id.to_string(), false)),
        None => new_id().map(|id| (id, true)),
    }
}

// Replies -----------------------------------------------------------------------------------

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn bad(what: &str, value: &Value) -> CallError {
    CallError::Reply(format!("{what} reply: {value:?}"))
}

/// `[allowed, id, n, ms]`: RL.LEASE's and RL.RESERVE's shape.
fn id_reply(value: &Value, what: &str) -> Result<(bool, String, i64, i64), CallError> {
    let Value::Array(items) = value else {
        return Err(bad(what, value));
    };
    match items.as_slice() {
        [allowed, id, n, ms] => match (int(allowed), text(id), int(n), int(ms)) {
            (Some(allowed), Some(id), Some(n), Some(ms)) => Ok((allowed == 1, id, n, ms)),
            _ => Err(bad(what, value)),
        },
        _ => Err(bad(what, value)),
    }
}

pub(crate) fn read_lease(value: &Value, limit: u32, source: Source) -> Result<Lease, CallError> {
    let (allowed, id, in_use, ms) = id_reply(value, "RL.LEASE")?;
    Ok(Lease {
        allowed,
        id,
        in_use: u64::try_from(in_use).unwrap_or(0),
        expires_in_ms: if allowed { ms } else { 0 },
        retry_after_ms: if allowed { 0 } else { ms },
        limit,
        source,
    })
}

/// RL.RELEASE's and RL.RENEW's reply: 1 or 0.
pub(crate) fn read_flag(value: &Value, what: &str) -> Result<bool, CallError> {
    match int(value) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(bad(what, value)),
    }
}

pub(crate) fn read_count(value: &Value, source: Source) -> Result<LeaseCount, CallError> {
    let Value::Array(items) = value else {
        return Err(bad("RL.LEASES", value));
    };
    match items.as_slice() {
        [in_use, retry] => match (int(in_use), int(retry)) {
            (Some(in_use), Some(retry)) => Ok(LeaseCount {
                in_use: u64::try_from(in_use).unwrap_or(0),
                retry_after_ms: retry,
                source,
            }),
            _ => Err(bad("RL.LEASES", value)),
        },
        _ => Err(bad("RL.LEASES", value)),
    }
}

pub(crate) fn read_reserved(
    value: &Value,
    (key, limit, estimate): (&str, &Limit, f64),
    source: Source,
) -> Result<Reserved, CallError> {
    let (allowed, id, remaining, retry) = id_reply(value, "RL.RESERVE")?;
    Ok(Reserved {
        allowed,
        id,
        remaining: u64::try_from(remaining).unwrap_or(0),
        retry_after_ms: retry,
        key: key.to_string(),
        limit: *limit,
        estimate,
        source,
    })
}

/// RL.SETTLE's reply: RL.CHARGE's last three, `[balance, retry_after_ms, reset_after_ms]`.
pub(crate) fn read_settled(
    value: &Value,
    limit: &Limit,
    source: Source,
) -> Result<Charged, CallError> {
    let Value::Array(items) = value else {
        return Err(bad("RL.SETTLE", value));
    };
    match items.as_slice() {
        [balance, retry, reset] => match (int(balance), int(retry), int(reset)) {
            (Some(balance), Some(retry_after_ms), Some(reset_after_ms)) => Ok(Charged {
                applied: true,
                balance,
                retry_after_ms,
                reset_after_ms,
                limit: *limit,
                source,
            }),
            _ => Err(bad("RL.SETTLE", value)),
        },
        _ => Err(bad("RL.SETTLE", value)),
    }
}

// The failure policy's answers ----------------------------------------------------------------

pub(crate) fn open_lease(limit: u32, id: &str) -> Lease {
    Lease {
        allowed: true,
        id: format!("{OPEN_ID_PREFIX}{id}"),
        in_use: 0,
        expires_in_ms: 0,
        retry_after_ms: 0,
        limit,
        source: Source::Open,
    }
}

pub(crate) fn closed_lease(limit: u32) -> Lease {
    Lease {
        allowed: false,
        id: String::new(),
        in_use: 0,
        expires_in_ms: 0,
        retry_after_ms: CLOSED_RETRY_AFTER_MS,
        limit,
        source: Source::Closed,
    }
}

// The `Local` policy's leases and reservations ------------------------------------------------

/// µs from ms, saturating.
fn us(ms: u64) -> u64 {
    ms.saturating_mul(1000)
}

/// ms until `at_us`, rounded up.
fn ms_until(at_us: u64, now_us: u64) -> i64 {
    let left = at_us.saturating_sub(now_us);
    i64::try_from(left.div_ceil(1000)).unwrap_or(i64::MAX)
}

/// The leases of each key (id, expiry in the engine's µs) and the open reservations of each
/// bucket (id, estimate, expiry), each at most `max_keys` keys. Each instance holds
/// `limit / instances` leases of a key (at least one), as its local buckets hold their share.
#[derive(Debug)]
pub(crate) struct LocalLeases {
    instances: u32,
    leases: Bounded<Vec<(String, u64)>>,
    reservations: Bounded<Vec<(String, f64, u64)>>,
}

impl LocalLeases {
    pub(crate) fn new(instances: u32, max_keys: usize) -> Self {
        LocalLeases {
            instances: instances.max(1),
            leases: Bounded::new(max_keys.max(1)),
            reservations: Bounded::new(max_keys.max(1)),
        }
    }

    fn share(&self, limit: u32) -> u64 {
        (u64::from(limit) / u64::from(self.instances)).max(1)
    }

    /// The key's leases that count at `now_us`.
    fn live(&self, key: &str, now_us: u64) -> Vec<(String, u64)> {
        self.leases
            .get(key)
            .map(|all| {
                all.iter()
                    .filter(|(_, expiry)| *expiry > now_us)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn store(&mut self, key: &str, live: Vec<(String, u64)>) {
        if live.is_empty() {
            self.leases.remove(key);
        } else {
            self.leases.insert(key, live);
        }
    }

    /// ms until enough of `live` expire for one slot to free under `share`.
    fn wait_ms(live: &[(String, u64)], share: u64, now_us: u64) -> i64 {
        let held = u64::try_from(live.len()).unwrap_or(u64::MAX);
        if held < share {
            return 0;
        }
        let mut expiries: Vec<u64> = live.iter().map(|(_, e)| *e).collect();
        expiries.sort_unstable();
        let index = usize::try_from(held.saturating_sub(share)).unwrap_or(usize::MAX);
        expiries
            .get(index)
            .map_or(0, |expiry| ms_until(*expiry, now_us))
    }

    pub(crate) fn lease(
        &mut self,
        (key, limit, ttl_ms, id): (&str, u32, u64, &str),
        now_us: u64,
    ) -> Lease {
        let share = self.share(limit);
        let mut live = self.live(key, now_us);
        let held = |live: &[(String, u64)]| u64::try_from(live.len()).unwrap_or(u64::MAX);
        if let Some((_, expiry)) = live.iter().find(|(held_id, _)| held_id == id) {
            let expires_in_ms = ms_until(*expiry, now_us);
            let in_use = held(&live);
            return Lease {
                allowed: true,
                id: id.to_string(),
                in_use,
                expires_in_ms,
                retry_after_ms: 0,
                limit,
                source: Source::Local,
            };
        }
        if held(&live) >= share {
            return Lease {
                allowed: false,
                id: String::new(),
                in_use: held(&live),
                expires_in_ms: 0,
                retry_after_ms: Self::wait_ms(&live, share, now_us),
                limit,
                source: Source::Local,
            };
        }
        live.push((id.to_string(), now_us.saturating_add(us(ttl_ms))));
        let in_use = held(&live);
        self.store(key, live);
        Lease {
            allowed: true,
            id: id.to_string(),
            in_use,
            expires_in_ms: i64::try_from(ttl_ms).unwrap_or(i64::MAX),
            retry_after_ms: 0,
            limit,
            source: Source::Local,
        }
    }

    /// Whether `id` is a lease held here now (so a release or renew of it is local).
    pub(crate) fn holds(&self, key: &str, id: &str, now_us: u64) -> bool {
        self.live(key, now_us).iter().any(|(held, _)| held == id)
    }

    pub(crate) fn release(&mut self, key: &str, id: &str, now_us: u64) -> bool {
        let mut live = self.live(key, now_us);
        let before = live.len();
        live.retain(|(held, _)| held != id);
        let released = live.len() != before;
        self.store(key, live);
        released
    }

    pub(crate) fn renew(&mut self, key: &str, id: &str, ttl_ms: u64, now_us: u64) -> bool {
        let mut live = self.live(key, now_us);
        let mut renewed = false;
        for (held, expiry) in &mut live {
            if held == id {
                *expiry = now_us.saturating_add(us(ttl_ms));
                renewed = true;
            }
        }
        self.store(key, live);
        renewed
    }

    pub(crate) fn count(&self, key: &str, limit: u32, now_us: u64) -> LeaseCount {
        let live = self.live(key, now_us);
        LeaseCount {
            in_use: u64::try_from(live.len()).unwrap_or(u64::MAX),
            retry_after_ms: Self::wait_ms(&live, self.share(limit), now_us),
            source: Source::Local,
        }
    }

    /// The open reservations of `key` at `now_us` (lapsed ones stand as taken: dropped).
    fn open(&self, key: &str, now_us: u64) -> Vec<(String, f64, u64)> {
        self.reservations
            .get(key)
            .map(|all| {
                all.iter()
                    .filter(|(_, _, expiry)| *expiry > now_us)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn store_open(&mut self, key: &str, open: Vec<(String, f64, u64)>) {
        if open.is_empty() {
            self.reservations.remove(key);
        } else {
            self.reservations.insert(key, open);
        }
    }

    /// Whether `id` is an open reservation of `key` here.
    pub(crate) fn is_open(&self, key: &str, id: &str, now_us: u64) -> bool {
        self.open(key, now_us).iter().any(|(open, _, _)| open == id)
    }

    /// Records a reservation taken from the local bucket; `false` when the key holds the
    /// most open reservations already (then nothing is recorded, and the caller gives the
    /// tokens back).
    pub(crate) fn record(
        &mut self,
        key: &str,
        (id, estimate, ttl_ms): (&str, f64, u64),
        now_us: u64,
    ) -> bool {
        let mut open = self.open(key, now_us);
        if open.len() >= MAX_OPEN_RESERVATIONS {
            return false;
        }
        open.push((id.to_string(), estimate, now_us.saturating_add(us(ttl_ms))));
        self.store_open(key, open);
        true
    }

    /// Takes the record of `id` out (once): its estimate, or `None` if it is not open.
    pub(crate) fn take_record(&mut self, key: &str, id: &str, now_us: u64) -> Option<f64> {
        let mut open = self.open(key, now_us);
        let index = open.iter().position(|(open_id, _, _)| open_id == id)?;
        let (_, estimate, _) = open.remove(index);
        self.store_open(key, open);
        Some(estimate)
    }

    /// Puts a record taken out back (its settle failed: nothing is written on an error).
    pub(crate) fn put_back(&mut self, key: &str, (id, estimate, expiry_us): (&str, f64, u64)) {
        let mut open = self.reservations.get(key).cloned().unwrap_or_default();
        open.push((id.to_string(), estimate, expiry_us));
        self.reservations.insert(key, open);
    }

    /// The expiry of an open record, to put it back as it was.
    pub(crate) fn expiry_of(&self, key: &str, id: &str) -> Option<u64> {
        self.reservations
            .get(key)?
            .iter()
            .find(|(open, _, _)| open == id)
            .map(|(_, _, expiry)| *expiry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_leases_hold_at_most_the_limit_and_free_on_expiry() {
        let mut t = LocalLeases::new(1, 10);
        let now = 1_000_000;
        assert!(t.lease(("k", 2, 100, "a"), now).allowed);
        assert!(t.lease(("k", 2, 200, "b"), now).allowed);
        let denied = t.lease(("k", 2, 100, "c"), now + 1);
        assert!(!denied.allowed);
        assert_eq!(denied.in_use, 2);
        // "a" expires at now + 100 ms: 99.999 ms from now + 1 µs, rounded up.
        assert_eq!(denied.retry_after_ms, 100);
        // A retried take of a held id is answered as held and takes nothing.
        let again = t.lease(("k", 2, 999, "a"), now + 50_000);
        assert_eq!(
            (again.allowed, again.in_use, again.expires_in_ms),
            (true, 2, 50)
        );
        assert!(t.lease(("k", 2, 100, "c"), now + 100_000).allowed);
        assert!(t.release("k", "b", now + 100_000));
        assert!(!t.release("k", "b", now + 100_000));
        assert_eq!(t.count("k", 2, now + 100_000).in_use, 1);
    }

    #[test]
    fn local_renew_moves_the_expiry_and_never_revives() {
        let mut t = LocalLeases::new(1, 10);
        assert!(t.lease(("k", 1, 10, "a"), 0).allowed);
        assert!(t.renew("k", "a", 1000, 5_000));
        assert_eq!(t.count("k", 1, 900_000).in_use, 1);
        assert!(!t.renew("k", "a", 1000, 1_005_000));
        assert_eq!(t.count("k", 1, 1_005_000).in_use, 0);
    }

    #[test]
    fn each_instance_holds_its_share_of_the_limit() {
        let mut t = LocalLeases::new(4, 10);
        assert!(t.lease(("k", 8, 100, "a"), 0).allowed);
        assert!(t.lease(("k", 8, 100, "b"), 0).allowed);
        assert!(!t.lease(("k", 8, 100, "c"), 0).allowed);
        // A limit below the instances still lets one through here.
        assert!(t.lease(("j", 2, 100, "a"), 0).allowed);
    }

    #[test]
    fn a_record_settles_once() {
        let mut t = LocalLeases::new(1, 10);
        assert!(t.record("k", ("r", 4.0, 100), 0));
        assert!(t.is_open("k", "r", 1));
        assert_eq!(t.take_record("k", "r", 1), Some(4.0));
        assert_eq!(t.take_record("k", "r", 1), None);
        assert!(t.record("k", ("s", 1.0, 1), 0));
        assert_eq!(t.take_record("k", "s", 1_000), None);
    }

    /// The `Local` policy's table (one instance) replays the shared lease vectors
    /// (clients/vectors/lease.json) to the same replies as the module and the fallbacks.
    #[test]
    fn the_local_table_replays_the_shared_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/lease.json");
        let text = std::fs::read_to_string(path).unwrap();
        let vectors: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = vectors["cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let mut t = LocalLeases::new(1, 10);
            for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
                let now_us = step["now_us"].as_u64().unwrap();
                let id = step["id"].as_str().unwrap_or("");
                let limit = step["limit"].as_u64().map(|l| u32::try_from(l).unwrap());
                let ttl_ms = step["ttl_ms"].as_u64();
                let got = match step["op"].as_str().unwrap() {
                    "lease" => {
                        let l = t.lease(("k", limit.unwrap(), ttl_ms.unwrap(), id), now_us);
                        let ms = if l.allowed {
                            l.expires_in_ms
                        } else {
                            l.retry_after_ms
                        };
                        serde_json::json!([i64::from(l.allowed), l.id, l.in_use, ms])
                    }
                    "leases" => {
                        let c = t.count("k", limit.unwrap(), now_us);
                        serde_json::json!([c.in_use, c.retry_after_ms])
                    }
                    "release" => serde_json::json!(i64::from(t.release("k", id, now_us))),
                    "renew" => {
                        serde_json::json!(i64::from(t.renew("k", id, ttl_ms.unwrap(), now_us)))
                    }
                    other => panic!("{name}: unknown op {other}"),
                };
                assert_eq!(got, step["expect"], "{name}, step {i}: {step}");
            }
        }
    }

    #[test]
    fn ids_are_16_lowercase_hex() {
        let id = new_id().unwrap();
        assert_eq!(id.len(), 16);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(id, new_id().unwrap());
    }

    #[test]
    fn replies_are_read_exactly() {
        let v = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"w7".to_vec()),
            Value::Int(2),
            Value::Int(30000),
        ]);
        let lease = read_lease(&v, 3, Source::Redis).unwrap();
        assert_eq!(
            (lease.id.as_str(), lease.in_use, lease.expires_in_ms),
            ("w7", 2, 30000)
        );
        assert_eq!(lease.remaining(), 1);
        assert!(read_lease(&Value::Int(1), 3, Source::Redis).is_err());
    }
}
