//! Concurrency limits and reservations: two calls of one request, tied by its id.
//!
//! Envoy's `ratelimit` filter calls the service when a request starts and, for the route's
//! `apply_on_stream_done` actions, again when its stream ends. A descriptor whose last entry
//! is `request_id` (from Envoy's `x-request-id`) belongs to the first call, and one whose
//! last entry is `request_done` (the same header) to the second. When the entries before it
//! match a limit with a `concurrency` limit or a `reserve`, this module handles the
//! descriptor:
//!
//! - at the start, `concurrency` takes a lease (`RL.LEASE`, at most `limit` held) and
//!   `reserve` reserves an estimate on the descriptor's bucket (`RL.RESERVE`): the cost Envoy
//!   sent (a `hits_addend` from a header or metadata), else the config's `estimate`;
//! - at the end, the lease is released (`RL.RELEASE`) and the reservation settled with the
//!   cost Envoy sent there, the usage (`RL.SETTLE`: an over-estimate goes back, an
//!   under-estimate is charged into debt).
//!
//! Both carry the request id as their id (its SHA-256's first 16 bytes, the module's longest
//! id), so a retried start takes nothing twice and a settle applies once. A stream whose end
//! call never comes loses its lease after the lease's `ttl`, and its reservation stands as
//! taken. The start is all or nothing with the request's other descriptors: what it took is
//! given back (released, settled at 0) when any of them refuses.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as ProtoRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use redis::Value;
use sha2::{Digest, Sha256};

use crate::config::rules::{Concurrency, Match, Reserve};
use crate::config::settings::Policy;
use crate::decision::service::{duration, ok_statuses, redis_key, Failure, Service};
use crate::redis::setup::Backend;

/// The descriptor key of the start call's request id entry.
pub const REQUEST_ID_KEY: &str = "request_id";
/// The descriptor key of the end call's request id entry.
pub const REQUEST_DONE_KEY: &str = "request_done";
/// Appended to a descriptor's key for its leases, which are another type than its bucket.
/// `%` is escaped in every other key, so no bucket key ends this way.
const LEASE_SUFFIX: &str = "%L";
/// The module's answer to a settle of an id it holds no reservation for.
const NOT_OPEN: &str = "is not an open reservation";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Done,
}

/// One descriptor tied to its request.
struct Tied {
    index: usize,
    domain: String,
    phase: Phase,
    id: [u8; 16],
    /// The bucket's key; the leases' key is it plus [`LEASE_SUFFIX`].
    key: String,
    found: Match,
    /// The cost Envoy sent for this descriptor (its own `hits_addend`, else the request's),
    /// if any above 0.
    sent: Option<u64>,
}

impl Tied {
    fn lease_key(&self) -> String {
        format!("{}{LEASE_SUFFIX}", self.key)
    }

    fn concurrency(&self) -> Option<Concurrency> {
        self.found.concurrency
    }

    fn reserve(&self) -> Option<Reserve> {
        self.found.rate_limit.reserve
    }
}

/// What one start call took, to give back if the request is refused.
enum Taken {
    Lease { key: String, id: [u8; 16] },
    Reservation(usize),
}

/// Answers `request` when it has a tied descriptor; `None` leaves it to the plain path.
pub async fn decide(
    service: &Service,
    request: &RateLimitRequest,
) -> Result<Option<RateLimitResponse>, Failure> {
    // The common case costs a look at each descriptor's last key.
    let maybe = request.descriptors.iter().any(|d| {
        d.entries
            .last()
            .is_some_and(|e| e.key == REQUEST_ID_KEY || e.key == REQUEST_DONE_KEY)
    });
    if !maybe {
        return Ok(None);
    }
    let wanted = crate::decision::service::check(request)?;
    let config = service.config();
    if !config.has_domain(&request.domain) {
        return Ok(None);
    }
    let mut tied = Vec::new();
    for (index, w) in wanted.iter().enumerate() {
        let Some(((key, value), rest)) = w.entries.split_last() else {
            continue;
        };
        let phase = match key.as_str() {
            REQUEST_ID_KEY => Phase::Start,
            REQUEST_DONE_KEY => Phase::Done,
            _ => continue,
        };
        if rest.is_empty() || w.refund {
            continue;
        }
        let Some(found) = config.lookup(&request.domain, rest) else {
            continue;
        };
        if found.concurrency.is_none() && found.rate_limit.reserve.is_none() {
            continue;
        }
        let sent = request
            .descriptors
            .get(index)
            .and_then(|d| d.hits_addend.map(|h| h.value))
            .or(Some(request.hits_addend.into()))
            .filter(|hits| *hits > 0);
        tied.push(Tied {
            index,
            domain: request.domain.clone(),
            phase,
            id: request_id(value),
            key: redis_key(
                &service.settings.cache_key_prefix,
                &request.domain,
                &found.key_entries,
            ),
            found,
            sent,
        });
    }
    if tied.is_empty() {
        return Ok(None);
    }
    for t in &tied {
        tracing::debug!(
            "tied descriptor {}: {} of {} (cost sent {:?})",
            t.index,
            if t.phase == Phase::Start {
                "start"
            } else {
                "end"
            },
            t.key,
            t.sent
        );
    }
    let mut statuses = ok_statuses(wanted.len());
    let ends: Vec<&Tied> = tied.iter().filter(|t| t.phase == Phase::Done).collect();
    for t in &ends {
        end(service, t).await?;
    }
    let starts: Vec<&Tied> = tied.iter().filter(|t| t.phase == Phase::Start).collect();
    let mut taken: Vec<Taken> = Vec::new();
    let mut refused = false;
    for t in &starts {
        let Some(status) = statuses.get_mut(t.index) else {
            continue;
        };
        match start(service, t, status, &mut taken).await {
            Ok(true) => {}
            Ok(false) => {
                refused = true;
                break;
            }
            Err(e) => {
                give_back(service, &starts, &taken).await;
                return Err(e);
            }
        }
    }
    // The other descriptors, as plain rate limits, unless the tied ones refused already.
    let rest: Vec<usize> = (0..wanted.len())
        .filter(|i| !tied.iter().any(|t| t.index == *i))
        .collect();
    let mut out = RateLimitResponse::default();
    if !refused && !rest.is_empty() {
        let sub = RateLimitRequest {
            domain: request.domain.clone(),
            descriptors: rest
                .iter()
                .filter_map(|i| request.descriptors.get(*i).cloned())
                .collect(),
            hits_addend: request.hits_addend,
        };
        out = match service.decide_plain(&sub).await {
            Ok(out) => out,
            Err(e) => {
                give_back(service, &starts, &taken).await;
                return Err(e);
            }
        };
        for (i, status) in rest.iter().zip(out.statuses.drain(..)) {
            if let Some(slot) = statuses.get_mut(*i) {
                *slot = status;
            }
        }
        refused = out.overall_code == Code::OverLimit as i32;
    }
    if refused {
        give_back(service, &starts, &taken).await;
    }
    out.overall_code = if refused { Code::OverLimit } else { Code::Ok } as i32;
    out.statuses = statuses;
    Ok(Some(out))
}

/// The 16-byte id of a request id: the first half of its SHA-256, so any id Envoy sends
/// (a UUID's 36 characters, or a client's own header) fits the module's ids.
fn request_id(value: &str) -> [u8; 16] {
    let digest = Sha256::digest(value.as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(digest.get(..16).unwrap_or(&[0u8; 16]));
    id
}

/// The start: the lease, then the reservation. `Ok(false)` when one refused (`status` says
/// which and until when); what was taken is in `taken`.
async fn start(
    service: &Service,
    t: &Tied,
    status: &mut DescriptorStatus,
    taken: &mut Vec<Taken>,
) -> Result<bool, Failure> {
    if let Some(c) = t.concurrency() {
        let mut cmd = redis::cmd("RL.LEASE");
        cmd.arg(t.lease_key())
            .arg(c.limit)
            .arg(c.ttl_ms)
            .arg("ID")
            .arg(&t.id[..]);
        let reply = match query(service, &cmd).await? {
            Some(reply) => reply,
            // Redis could not decide and the policy is not `error`.
            None => return Ok(policy_allows(service, status)),
        };
        let (allowed, in_use, ms) = read_lease(&reply)?;
        status.current_limit = Some(ProtoRateLimit {
            name: t.found.rate_limit.name.clone(),
            requests_per_unit: c.limit,
            unit: 0,
        });
        status.limit_remaining =
            u32::try_from(u64::from(c.limit).saturating_sub(in_use)).unwrap_or(0);
        if !goes_on(service, t, status, 1, allowed, ms) {
            return Ok(false);
        }
        if allowed {
            taken.push(Taken::Lease {
                key: t.lease_key(),
                id: t.id,
            });
        }
    }
    if let Some(r) = t.reserve() {
        let limit = t
            .found
            .rate_limit
            .bucket
            .clone()
            .map_err(Failure::Invalid)?;
        let estimate = t.sent.unwrap_or(r.estimate);
        let mut cmd = redis::cmd("RL.RESERVE");
        cmd.arg(&t.key)
            .arg(limit.rate_text())
            .arg(limit.capacity_text())
            .arg(estimate)
            .arg(r.ttl_ms)
            .arg("ID")
            .arg(&t.id[..]);
        let reply = match query(service, &cmd).await? {
            Some(reply) => reply,
            None => return Ok(policy_allows(service, status)),
        };
        let (allowed, remaining, retry_ms) = read_reserve(&reply)?;
        status.current_limit = Some(ProtoRateLimit {
            name: t.found.rate_limit.name.clone(),
            requests_per_unit: t.found.rate_limit.requests_per_unit,
            unit: t.found.rate_limit.unit.proto(),
        });
        status.limit_remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
        if !goes_on(service, t, status, estimate, allowed, retry_ms) {
            return Ok(false);
        }
        if allowed {
            taken.push(Taken::Reservation(t.index));
        }
    }
    Ok(true)
}

/// Counts a start's answer (`hits` taken or refused). A refusal sets the wait in `status`
/// and, unless only counted ([`shadow`]), the over-limit code. Whether the request goes on.
fn goes_on(
    service: &Service,
    t: &Tied,
    status: &mut DescriptorStatus,
    hits: u64,
    allowed: bool,
    wait_ms: i64,
) -> bool {
    count(service, t, hits, allowed);
    if allowed {
        return true;
    }
    status.duration_until_reset = Some(duration(wait_ms));
    if shadow(service, t, hits) {
        return true;
    }
    status.code = Code::OverLimit as i32;
    false
}

/// Whether a refusal is only counted: the descriptor's `shadow_mode` or `SHADOW_MODE`, as
/// the plain path treats them (nothing is taken, the request goes on).
fn shadow(service: &Service, t: &Tied, hits: u64) -> bool {
    let shadow = t.found.shadow_mode || service.settings.shadow_mode;
    if shadow {
        let labels = crate::telemetry::metrics::Metrics::labels(&t.domain, &t.found.stats_key);
        service
            .metrics
            .shadow_mode
            .with_label_values(&labels)
            .inc_by(hits);
    }
    shadow
}

/// The end: the lease released, the reservation settled with the usage Envoy sent (0 when
/// it sent none). An end whose start was refused, lapsed or already ended finds nothing
/// and changes nothing.
async fn end(service: &Service, t: &Tied) -> Result<(), Failure> {
    if t.concurrency().is_some() {
        let mut cmd = redis::cmd("RL.RELEASE");
        cmd.arg(t.lease_key()).arg(&t.id[..]);
        query(service, &cmd).await?;
    }
    if t.reserve().is_some() {
        settle(service, t, t.sent.unwrap_or(0)).await?;
    }
    Ok(())
}

async fn settle(service: &Service, t: &Tied, actual: u64) -> Result<(), Failure> {
    let limit = t
        .found
        .rate_limit
        .bucket
        .clone()
        .map_err(Failure::Invalid)?;
    let mut cmd = redis::cmd("RL.SETTLE");
    cmd.arg(&t.key)
        .arg(limit.rate_text())
        .arg(limit.capacity_text())
        .arg(&t.id[..])
        .arg(actual);
    match query(service, &cmd).await {
        Ok(_) => Ok(()),
        // Refused at the start, lapsed, or settled by an earlier end call.
        Err(Failure::Internal(text)) if text.contains(NOT_OPEN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Gives back what a refused start took: leases released, reservations settled at 0. A
/// failure here is logged; the lease lapses after its `ttl`, the reservation stands.
async fn give_back(service: &Service, starts: &[&Tied], taken: &[Taken]) {
    for item in taken {
        let result = match item {
            Taken::Lease { key, id } => {
                let mut cmd = redis::cmd("RL.RELEASE");
                cmd.arg(key).arg(&id[..]);
                query(service, &cmd).await.map(|_| ())
            }
            Taken::Reservation(index) => match starts.iter().find(|t| t.index == *index) {
                Some(t) => settle(service, t, 0).await,
                None => Ok(()),
            },
        };
        if let Err(e) = result {
            tracing::warn!("giving back a refused request's lease or reservation failed: {e:?}");
        }
    }
}

/// The failure policy's answer when Redis could not decide a start: `open` and `local`
/// (which keeps no leases in process) let it through, `closed` refuses.
fn policy_allows(service: &Service, status: &mut DescriptorStatus) -> bool {
    let allowed = service.settings.on_error != Policy::Closed;
    service
        .metrics
        .decisions
        .with_label_values(&[if allowed { "open" } else { "closed" }])
        .inc();
    if !allowed {
        status.code = Code::OverLimit as i32;
    }
    allowed
}

/// The hit metrics of a start, under the descriptor's stats key as the plain path counts.
fn count(service: &Service, t: &Tied, hits: u64, within: bool) {
    let labels = crate::telemetry::metrics::Metrics::labels(&t.domain, &t.found.stats_key);
    service
        .metrics
        .total_hits
        .with_label_values(&labels)
        .inc_by(hits);
    let counter = if within {
        &service.metrics.within_limit
    } else {
        &service.metrics.over_limit
    };
    counter.with_label_values(&labels).inc_by(hits);
}

/// Sends `cmd` within the service's deadline. `Ok(None)` when Redis could not answer (down,
/// late, OOM, read-only, loading) and the policy decides; under `error` that fails the call.
async fn query(service: &Service, cmd: &redis::Cmd) -> Result<Option<Value>, Failure> {
    let deadline = std::time::Duration::from_millis(service.settings.timeout_ms);
    let sent = match &service.backend {
        Backend::Single(l) => {
            let mut c = l.connection().clone();
            tokio::time::timeout(deadline, cmd.query_async::<Value>(&mut c)).await
        }
        Backend::Cluster(l) => {
            let mut c = l.connection().clone();
            tokio::time::timeout(deadline, cmd.query_async::<Value>(&mut c)).await
        }
    };
    let cannot = match sent {
        Ok(Ok(value)) => return Ok(Some(value)),
        Err(_) => "Redis did not answer in time".to_string(),
        Ok(Err(e)) => match e.code() {
            Some("OOM" | "READONLY" | "LOADING" | "CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN") => {
                e.to_string()
            }
            Some(_) if e.to_string().contains("unknown command") => {
                return Err(Failure::Unavailable(
                    "concurrency limits and reservations need the redis-rl module 0.3 or later"
                        .into(),
                ))
            }
            Some(_) => return Err(Failure::Internal(e.to_string())),
            None => e.to_string(),
        },
    };
    if service.settings.on_error == Policy::Error {
        service
            .metrics
            .decisions
            .with_label_values(&["error"])
            .inc();
        return Err(Failure::Unavailable(format!(
            "Redis cannot decide (RL_ON_ERROR=error): {cannot}"
        )));
    }
    Ok(None)
}

fn int(v: Option<&Value>) -> Result<i64, Failure> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(Failure::Internal(format!(
            "unexpected reply element {other:?}"
        ))),
    }
}

fn items(reply: &Value) -> Result<&[Value], Failure> {
    match reply {
        Value::Array(items) if items.len() == 4 => Ok(items),
        other => Err(Failure::Internal(format!("unexpected reply {other:?}"))),
    }
}

/// `RL.LEASE`'s `[allowed, id, in_use, ms]`.
fn read_lease(reply: &Value) -> Result<(bool, u64, i64), Failure> {
    let items = items(reply)?;
    let allowed = int(items.first())? == 1;
    let in_use = u64::try_from(int(items.get(2))?).unwrap_or(0);
    Ok((allowed, in_use, int(items.get(3))?))
}

/// `RL.RESERVE`'s `[allowed, id, remaining, retry_after_ms]`.
fn read_reserve(reply: &Value) -> Result<(bool, u64, i64), Failure> {
    let items = items(reply)?;
    let allowed = int(items.first())? == 1;
    let remaining = u64::try_from(int(items.get(2))?).unwrap_or(0);
    Ok((allowed, remaining, int(items.get(3))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_of_any_length_is_16_bytes_and_stable() {
        let uuid = "6f1e3c52-1b4e-4a43-9f8e-2a6c1f0b9d11";
        assert_eq!(request_id(uuid), request_id(uuid));
        assert_ne!(
            request_id(uuid),
            request_id("6f1e3c52-1b4e-4a43-9f8e-2a6c1f0b9d12")
        );
        assert_eq!(request_id(&"x".repeat(10_000)).len(), 16);
    }

    #[test]
    fn replies_are_read_and_bad_ones_refused() {
        let lease = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"id".to_vec()),
            Value::Int(3),
            Value::Int(30_000),
        ]);
        assert_eq!(read_lease(&lease).unwrap(), (true, 3, 30_000));
        let denied = Value::Array(vec![
            Value::Int(0),
            Value::BulkString(Vec::new()),
            Value::Int(7),
            Value::Int(907),
        ]);
        assert_eq!(read_reserve(&denied).unwrap(), (false, 7, 907));
        assert!(read_lease(&Value::Int(1)).is_err());
    }
}
