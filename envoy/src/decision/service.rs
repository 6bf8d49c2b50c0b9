//! One `ShouldRateLimit` call: check the request, find each descriptor's limit in the
//! config, take every bucket's cost all or nothing through redis-rl-client, and build the
//! response. The failure policy, the deny cache and the Lua fallback are the client
//! library's; this file only maps Envoy's request onto `acquire_all` and back.
//!
//! All or nothing is the client's `acquire_across_slots`: on one server every limited
//! descriptor is one `RL.ACQUIRE.MULTI`; on a cluster the buckets are taken slot by slot, and
//! the slots already taken are refunded when a later one refuses (the one window where a
//! cluster is not atomic: see the client's `slots` module).
//!
//! Quota-mode and `post_paid` descriptors, and plain ones `POST_PAID_CHARGES` names (by
//! default a cost other than 1, and 1 on a limit asked with 0 hits), are charged first,
//! post-paid (the client's `charge`: it always applies and may leave the bucket in debt);
//! whether the request is over is the quota rule's (`crate::decision::quota`), which also
//! builds the dynamic metadata.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as ProtoRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use redis_rl_client::{Decision, Error as ClientError, Limit, SlotItem, SlotOutcome, Source};

use crate::config::rules::{bucket_limit, Config, Match, RateLimit, Unit};
use crate::config::settings::{Policy, PostPaidCharges, Settings};
use crate::decision::quota::{MetadataDescriptor, Verdict};
use crate::redis::setup::{Backend, Tables};
use crate::telemetry::metrics::Metrics;

/// At most this many descriptors per request: Envoy sends one per rate-limit action list,
/// usually a handful; more is refused before anything is written.
pub const MAX_DESCRIPTORS: usize = 64;
/// At most this many entries per descriptor.
pub const MAX_ENTRIES: usize = 32;
/// The longest Redis key kept as it is, in bytes (prefix, domain and escaped entries). A
/// longer descriptor is keyed by the SHA-256 of its escaped entries instead (see
/// [`redis_key`]): a value of any length is limited, never refused, since Envoy's default
/// (`failure_mode_deny: false`) lets a refused call through.
pub const MAX_PLAIN_KEY_BYTES: usize = 1024;
/// The largest capacity the module keeps: a cost above it can never pass any bucket, so it
/// is answered over the limit without asking Redis (not refused: `hits_addend` may come from
/// a client's header, and a refused call is let through by Envoy's default).
pub const MAX_COST: u64 = 1_000_000_000_000_000;
/// At most this many limits remembered as asked with 0 hits (one per config rule; a
/// descriptor's `limit` override may carry a request's value in its key, so it is bounded).
pub const MAX_CHECKED_LIMITS: usize = 10_000;

/// Why a call has no response.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// A bad request: gRPC INVALID_ARGUMENT, HTTP 400. Nothing was written.
    Invalid(String),
    /// Redis could not decide and `RL_ON_ERROR=error`: gRPC UNAVAILABLE, HTTP 500.
    Unavailable(String),
    /// Redis answered with an error the policy does not cover: gRPC INTERNAL, HTTP 500.
    Internal(String),
}

impl Failure {
    /// The `ratelimit_service_should_rate_limit_error` label of this failure.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Failure::Invalid(_) => "invalid_argument",
            Failure::Unavailable(_) => "redis_unavailable",
            Failure::Internal(_) => "redis_error",
        }
    }
}

/// The service: the config (swapped whole on reload), the limiter, the settings.
pub struct Service {
    config: RwLock<Arc<Config>>,
    pub(crate) backend: Backend,
    pub(crate) settings: Arc<Settings>,
    pub metrics: Metrics,
    // Redis setups: per-second limits on their own Redis
    // (`REDIS_PERSECOND`), see `take` and docs/envoy-redis.md.
    per_second: Option<Backend>,
    /// The stats keys holding a client's value seen so far, at most
    /// `RL_MAX_CLIENT_STATS_KEYS`: each is a metric series and a statsd name.
    client_stats_keys: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The limits (by their config stats key) asked with 0 hits since the config loaded, at
    /// most [`MAX_CHECKED_LIMITS`]: under `POST_PAID_CHARGES=auto` each is post-paid at
    /// every cost, a cost of 1 included (see `post_paid_at`).
    checked_limits: RwLock<std::collections::HashSet<String>>,
    /// The domains asked for that the config does not define, each warned about once.
    unknown_domains: crate::decision::unknown_domains::UnknownDomains,
    /// `RL_BUCKET_STORAGE=tables`: the tables the buckets are fields of.
    tables: Option<Tables>,
}

/// One descriptor after checking.
pub(crate) struct Wanted {
    pub(crate) entries: Vec<(String, String)>,
    pub(crate) cost: u64,
    pub(crate) refund: bool,
    override_limit: Option<(u32, Unit)>,
}

/// One descriptor's limit for this call.
struct Limited {
    index: usize,
    found: Match,
    key: String,
    /// With tables: the table key and fallback key of the field `key`.
    in_table: Option<(String, String)>,
    limit: Limit,
    cost: u64,
    shadow: bool,
    /// Quota mode (`quota_mode` or `GLOBAL_QUOTA_MODE`): see `crate::decision::quota`.
    quota: bool,
    /// Charged post-paid (quota mode or `post_paid`) rather than taken all or nothing.
    post_paid: bool,
}

/// What happened to one limited descriptor.
#[derive(Clone, Copy)]
enum Outcome {
    /// Its cost was taken.
    Taken(Decision),
    /// It had room, but another descriptor refused, so all or nothing took nothing: the
    /// decision is as if taken.
    Uncharged(Decision),
    Over(Option<Decision>),
    ShadowOver(Option<Decision>),
    /// It had room but was not read by the take (a later cluster slot, or a ban denied
    /// the request): a peek's decision, the bucket as it is.
    Peeked(Decision),
    /// Not asked: an earlier slot refused (cluster), or a ban denied the request.
    Skipped,
}

impl Service {
    /// A service on `backend` with `config`.
    pub fn new(
        config: Config,
        backend: Backend,
        settings: Arc<Settings>,
        metrics: Metrics,
    ) -> Self {
        let tables = Tables::of(&settings);
        Service {
            config: RwLock::new(Arc::new(config)),
            backend,
            settings,
            metrics,
            per_second: None,
            client_stats_keys: std::sync::Mutex::new(std::collections::HashSet::new()),
            checked_limits: RwLock::new(std::collections::HashSet::new()),
            unknown_domains: Default::default(),
            tables,
        }
    }

    /// `m`'s stats key, or the config's own key when it holds a request's value and the
    /// bound on such keys is reached (counted).
    fn bound_stats_key(&self, m: &mut Match) {
        if m.stats_key == m.config_stats_key {
            return;
        }
        let Ok(mut seen) = self.client_stats_keys.lock() else {
            return;
        };
        if seen.contains(&m.stats_key) {
            return;
        }
        if seen.len() < self.settings.max_client_stats_keys {
            seen.insert(m.stats_key.clone());
            return;
        }
        drop(seen);
        self.metrics.stats_keys_folded.inc();
        m.stats_key = m.config_stats_key.clone();
    }

    /// `POST_PAID_CHARGES=auto`'s rule for a plain limit: a cost other than 1 is post-paid (0
    /// is a check, above 1 may be usage), and so is a cost of 1 on a limit asked with 0 hits
    /// before. Such a limit is checked at request time and charged on stream done (Envoy
    /// Gateway's request cost 0 and response cost), so its cost of 1 is a usage charge: taken
    /// all or nothing, a charge of 1 on an empty bucket would be lost while every 0-hit check
    /// passes, and the limit would never bind.
    fn auto_post_paid(&self, m: &Match, cost: u64, refund: bool) -> bool {
        let key = &m.config_stats_key;
        let known = match self.checked_limits.read() {
            Ok(c) => c.contains(key),
            Err(poisoned) => poisoned.into_inner().contains(key),
        };
        if cost == 0 && !refund && !known {
            if let Ok(mut c) = self.checked_limits.write() {
                if c.len() < MAX_CHECKED_LIMITS {
                    c.insert(key.clone());
                }
            }
        }
        cost != 1 || known
    }

    /// Sends the limits whose unit is `second` to `backend` (`REDIS_PERSECOND`).
    pub fn with_per_second(mut self, backend: Option<Backend>) -> Self {
        self.per_second = backend;
        self
    }

    /// The Redis an item's bucket lives on: the per-second one for a `second` limit when
    /// `REDIS_PERSECOND` is on (the Go service's rule: the unit, whatever the multiplier).
    fn backend_for(&self, item: &Limited) -> &Backend {
        match &self.per_second {
            Some(b) if item.found.rate_limit.unit == Unit::Second => b,
            _ => &self.backend,
        }
    }

    /// The config in use.
    pub fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Puts `config` in use for the calls that start from now.
    pub fn replace_config(&self, config: Config) {
        let config = Arc::new(config);
        match self.config.write() {
            Ok(mut c) => *c = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
        self.unknown_domains.clear();
        match self.checked_limits.write() {
            Ok(mut c) => c.clear(),
            Err(poisoned) => poisoned.into_inner().clear(),
        }
    }

    /// Every descriptor as a rate limit: the take, the charges, the response.
    pub(crate) async fn decide_plain(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Failure> {
        tracing::debug!(
            "ShouldRateLimit domain={} descriptors={:?} hits_addend={}",
            request.domain,
            request
                .descriptors
                .iter()
                .map(|d| (
                    d.entries
                        .iter()
                        .map(|e| (&e.key, &e.value))
                        .collect::<Vec<_>>(),
                    d.hits_addend.map(|h| h.value),
                ))
                .collect::<Vec<_>>(),
            request.hits_addend
        );
        let wanted = check(request)?;
        let config = self.config();
        let mut statuses = ok_statuses(wanted.len());
        if !config.has_domain(&request.domain) {
            self.unknown_domains.note(&request.domain);
            return Ok(response(Code::Ok, statuses, Vec::new()));
        }
        // Each descriptor's limit: Envoy's override first, then the config.
        let mut found: Vec<(usize, Match, u64, bool)> = Vec::new();
        for (index, w) in wanted.iter().enumerate() {
            let m = match w.override_limit {
                Some((requests_per_unit, unit)) => Some(Match {
                    rate_limit: Arc::new(RateLimit {
                        requests_per_unit,
                        unit,
                        unit_multiplier: 1,
                        burst: None,
                        unlimited: false,
                        name: String::new(),
                        replaces: Vec::new(),
                        post_paid: false,
                        reserve: None,
                        bucket: bucket_limit(
                            requests_per_unit,
                            unit.seconds(),
                            f64::from(requests_per_unit),
                        ),
                    }),
                    stats_key: override_stats_key(&request.domain, &w.entries),
                    config_stats_key: override_stats_key(
                        &request.domain,
                        &w.entries
                            .iter()
                            .map(|(k, _)| (k.clone(), String::new()))
                            .collect::<Vec<_>>(),
                    ),
                    shadow_mode: false,
                    key_entries: w.entries.clone(),
                    quota_mode: false,
                    metadata: None,
                    concurrency: None,
                }),
                None => config.lookup(&request.domain, &w.entries),
            };
            if let Some(mut m) = m {
                self.bound_stats_key(&mut m);
                found.push((index, m, w.cost, w.refund));
            }
        }
        // `replaces`: a limit named in another matched limit's list does not apply.
        let replaced =
            crate::config::rules::replaced_names(found.iter().map(|(_, m, _, _)| &*m.rate_limit));
        found.retain(|(_, m, _, _)| {
            m.rate_limit.name.is_empty() || !replaced.contains(&m.rate_limit.name)
        });

        let mut limited: Vec<Limited> = Vec::new();
        let mut refunds: Vec<Limited> = Vec::new();
        // `requests_per_unit: 0` (bans) and costs above every capacity: over the limit
        // without asking Redis.
        let mut bans: Vec<(usize, Match, u64, bool)> = Vec::new();
        for (index, m, cost, refund) in found {
            if let Some(status) = statuses.get_mut(index) {
                status.current_limit = Some(ProtoRateLimit {
                    name: m.rate_limit.name.clone(),
                    requests_per_unit: m.rate_limit.requests_per_unit,
                    unit: m.rate_limit.unit.proto(),
                });
                if m.rate_limit.unlimited {
                    status.current_limit = None;
                    status.limit_remaining = u32::MAX;
                    continue;
                }
            }
            let shadow = m.shadow_mode || self.settings.shadow_mode;
            // A cost above every capacity never passes: over the limit, as a ban is.
            if m.rate_limit.is_ban() || cost > MAX_COST {
                // A refund to a ban changes nothing; a take is over the limit.
                if !refund {
                    bans.push((index, m, cost, shadow));
                }
                continue;
            }
            let limit = m.rate_limit.bucket.clone().map_err(Failure::Invalid)?;
            let key = redis_key(
                &self.settings.cache_key_prefix,
                &request.domain,
                &m.key_entries,
            );
            let quota = m.quota_mode || self.settings.global_quota_mode;
            // A stream-done charge comes as an ordinary call: which plain limits charge it
            // past what is left is `POST_PAID_CHARGES`'s rule.
            let post_paid = quota
                || m.rate_limit.post_paid
                || match self.settings.post_paid_charges {
                    PostPaidCharges::Always => true,
                    PostPaidCharges::Never => false,
                    PostPaidCharges::Auto => self.auto_post_paid(&m, cost, refund),
                };
            let in_table = self.tables.as_ref().map(|t| t.names(&key));
            let item = Limited {
                index,
                found: m,
                in_table,
                key,
                limit,
                cost,
                shadow,
                quota,
                post_paid,
            };
            if refund {
                refunds.push(item);
            } else {
                limited.push(item);
            }
        }

        let mut overall = Code::Ok;
        let mut tightest: Option<Tightest> = None;
        let banned = bans.iter().any(|(_, _, _, shadow)| !shadow);
        for (index, m, cost, shadow) in &bans {
            let Some(status) = statuses.get_mut(*index) else {
                continue;
            };
            let labels = Metrics::labels(&request.domain, &m.stats_key);
            self.metrics
                .total_hits
                .with_label_values(&labels)
                .inc_by(*cost);
            // The Go service counts every hit of a ban as over the limit.
            self.metrics
                .over_limit
                .with_label_values(&labels)
                .inc_by(*cost);
            if *shadow {
                self.metrics
                    .shadow_mode
                    .with_label_values(&labels)
                    .inc_by(*cost);
            } else {
                status.code = Code::OverLimit as i32;
                overall = Code::OverLimit;
            }
            // No token ever comes: the reset is a whole period (the Go service's fixed
            // window reports the time to its end).
            let period_ms =
                i64::try_from(m.rate_limit.period_s().saturating_mul(1000)).unwrap_or(i64::MAX);
            status.limit_remaining = 0;
            status.duration_until_reset = Some(duration(period_ms));
            let candidate = Tightest {
                requests_per_unit: m.rate_limit.requests_per_unit,
                remaining: 0,
                reset_ms: period_ms,
                over: !*shadow,
            };
            if tightest.is_none_or(|t| candidate.tighter_than(&t)) {
                tightest = Some(candidate);
            }
        }

        let redis_started = Instant::now();
        for r in &refunds {
            #[allow(clippy::cast_precision_loss)]
            let cost = r.cost as f64;
            let source = self
                .backend_for(r)
                .refund(self.tables.as_ref(), &r.key, &r.limit, cost)
                .await
                .map_err(|e| self.client_failure(e))?;
            // A refund Redis could not apply fails the call under `error` as a take does:
            // the client's `closed` policy skips it quietly, and a caller who gave tokens
            // back must learn they were not.
            self.policy_check(source)?;
        }
        // Post-paid charges first: they apply whatever happens next. When every quota is
        // over (or a ban refuses), the request is refused, and the plain buckets are left
        // untouched.
        let (charged, limited): (Vec<Limited>, Vec<Limited>) =
            limited.into_iter().partition(|it| it.post_paid);
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(charged.len() + limited.len());
        for item in &charged {
            outcomes.push(self.charge(item).await?);
        }
        let charged_verdicts: Vec<Verdict> = charged.iter().zip(&outcomes).map(verdict).collect();
        // A post-paid plain descriptor over its limit refuses the request as a ban does: the
        // other plain buckets are left untouched.
        let plain_over = charged
            .iter()
            .zip(&outcomes)
            .any(|(it, o)| !it.quota && matches!(o, Outcome::Over(_)));
        if banned || plain_over || crate::decision::quota::all_quotas_over(&charged_verdicts) {
            outcomes.extend(limited.iter().map(|_| Outcome::Skipped));
        } else {
            outcomes.extend(self.take(&limited).await?);
        }
        let limited: Vec<Limited> = charged.into_iter().chain(limited).collect();
        let verdicts: Vec<Verdict> = limited.iter().zip(&outcomes).map(verdict).collect();
        // A denied request charged nothing of its plain buckets; the ones nobody read are
        // peeked, so each status tells its own bucket's truth.
        if banned || crate::decision::quota::request_over(&verdicts) {
            for (item, outcome) in limited.iter().zip(outcomes.iter_mut()) {
                if matches!(outcome, Outcome::Skipped) {
                    *outcome = self.peek(item).await?;
                }
            }
        }
        self.metrics
            .redis_time
            .observe(redis_started.elapsed().as_secs_f64());

        for (item, outcome) in limited.iter().zip(&outcomes) {
            let Some(status) = statuses.get_mut(item.index) else {
                continue;
            };
            let labels = Metrics::labels(&request.domain, &item.found.stats_key);
            self.metrics
                .total_hits
                .with_label_values(&labels)
                .inc_by(item.cost);
            let thresholds = Thresholds::of(item, self.settings.near_limit_ratio);
            let decision = match outcome {
                Outcome::Taken(d) | Outcome::Uncharged(d) | Outcome::Peeked(d) => {
                    // Within its own limit: counted as the Go service counts it (which
                    // takes each descriptor on its own), whether or not all or nothing
                    // charged it.
                    self.metrics
                        .within_limit
                        .with_label_values(&labels)
                        .inc_by(item.cost);
                    // What the bucket would hold once this cost is taken.
                    let after = match outcome {
                        Outcome::Peeked(d) => d.remaining.saturating_sub(item.cost),
                        _ => d.remaining,
                    };
                    let near = thresholds.near_hits_within(after, item.cost);
                    if near > 0 {
                        self.metrics
                            .near_limit
                            .with_label_values(&labels)
                            .inc_by(near);
                    }
                    Some(*d)
                }
                Outcome::Over(d) | Outcome::ShadowOver(d) => {
                    let (over, near) = match d {
                        Some(d) => thresholds.over_hits(d.remaining, item.cost),
                        None => (item.cost, 0),
                    };
                    self.metrics
                        .over_limit
                        .with_label_values(&labels)
                        .inc_by(over);
                    if near > 0 {
                        self.metrics
                            .near_limit
                            .with_label_values(&labels)
                            .inc_by(near);
                    }
                    if matches!(outcome, Outcome::ShadowOver(_)) {
                        self.metrics
                            .shadow_mode
                            .with_label_values(&labels)
                            .inc_by(item.cost);
                    } else {
                        // A quota over its quota says so in its status; whether the request
                        // is refused is the rule's (below).
                        status.code = Code::OverLimit as i32;
                    }
                    *d
                }
                Outcome::Skipped => None,
            };
            if let Some(d) = decision {
                self.metrics
                    .decisions
                    .with_label_values(&[d.source.as_str()])
                    .inc();
                // The bucket as it is: a take that did not happen is added back, and its
                // time with it (the decision is "as if taken").
                let (remaining, reset_after_ms) = match outcome {
                    Outcome::Uncharged(d) => (
                        d.remaining.saturating_add(item.cost),
                        d.reset_after_ms
                            .saturating_sub(cost_ms(&item.limit, item.cost))
                            .max(0),
                    ),
                    _ => (d.remaining, d.reset_after_ms),
                };
                status.limit_remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
                // A refusing descriptor says when this same request could pass; any other,
                // when its bucket is whole again.
                let over = matches!(outcome, Outcome::Over(_) | Outcome::ShadowOver(_));
                let wait_ms = match (over, item.post_paid) {
                    // Post-paid: over while the charge leaves a debt, so the request passes
                    // once the debt is repaid and its own cost has come back too.
                    (true, true) => d
                        .retry_after_ms
                        .max(0)
                        .saturating_add(cost_ms_up(&item.limit, item.cost)),
                    // -1: the cost is above the capacity and no wait helps.
                    (true, false) if d.retry_after_ms >= 0 => d.retry_after_ms,
                    _ => reset_after_ms,
                };
                status.duration_until_reset = Some(duration(wait_ms));
                let rpu = item.found.rate_limit.requests_per_unit;
                let candidate = Tightest {
                    requests_per_unit: rpu,
                    remaining: status.limit_remaining,
                    reset_ms: wait_ms,
                    over: over && !matches!(outcome, Outcome::ShadowOver(_)),
                };
                if tightest.is_none_or(|t| candidate.tighter_than(&t)) {
                    tightest = Some(candidate);
                }
            }
        }
        let verdicts: Vec<Verdict> = limited.iter().zip(&outcomes).map(verdict).collect();
        if crate::decision::quota::request_over(&verdicts) {
            overall = Code::OverLimit;
        }
        let dynamic_metadata = self.settings.response_dynamic_metadata.then(|| {
            let described: Vec<MetadataDescriptor<'_>> = wanted
                .iter()
                .enumerate()
                .map(|(index, w)| {
                    let found = limited
                        .iter()
                        .zip(&outcomes)
                        .find(|(it, _)| it.index == index);
                    MetadataDescriptor {
                        entries: &w.entries,
                        quota: found.is_some_and(|(it, _)| it.quota),
                        over: found.is_some_and(|(_, o)| {
                            matches!(o, Outcome::Over(_) | Outcome::ShadowOver(_))
                        }),
                        metadata: found.and_then(|(it, _)| it.found.metadata.as_deref()),
                    }
                })
                .collect();
            crate::decision::quota::to_struct(&crate::decision::quota::dynamic_metadata(
                &request.domain,
                &described,
            ))
        });
        let mut headers = Vec::new();
        if self.settings.limit_response_headers_enabled {
            if let Some(Tightest {
                requests_per_unit: rpu,
                remaining,
                reset_ms,
                ..
            }) = tightest
            {
                let reset_s = (reset_ms.max(0) + 999) / 1000;
                for (key, value) in [
                    (&self.settings.limit_limit_header, rpu.to_string()),
                    (&self.settings.limit_remaining_header, remaining.to_string()),
                    (&self.settings.limit_reset_header, reset_s.to_string()),
                ] {
                    headers.push(HeaderValue {
                        key: key.clone(),
                        value,
                        raw_value: Vec::new(),
                    });
                }
            }
        }
        let mut out = response(overall, statuses, headers);
        out.dynamic_metadata = dynamic_metadata;
        Ok(out)
    }

    /// Takes every item's cost, all or nothing. With `REDIS_PERSECOND`, the per-second
    /// items are taken first on their Redis, then the others; when the others refuse, what
    /// the first took is refunded (as across cluster slots), so a denied request costs
    /// nothing once the call returns.
    async fn take(&self, items: &[Limited]) -> Result<Vec<Outcome>, Failure> {
        let all: Vec<&Limited> = items.iter().collect();
        let Some(per_second) = &self.per_second else {
            return self.take_on(&self.backend, &all).await;
        };
        type Indexed<'a> = Vec<(usize, &'a Limited)>;
        let (fast, slow): (Indexed<'_>, Indexed<'_>) = items
            .iter()
            .enumerate()
            .partition(|(_, it)| it.found.rate_limit.unit == Unit::Second);
        if fast.is_empty() || slow.is_empty() {
            let backend = if slow.is_empty() {
                per_second
            } else {
                &self.backend
            };
            return self.take_on(backend, &all).await;
        }
        let fast_items: Vec<&Limited> = fast.iter().map(|(_, it)| *it).collect();
        let slow_items: Vec<&Limited> = slow.iter().map(|(_, it)| *it).collect();
        let refused = |o: &Outcome| matches!(o, Outcome::Over(_));
        let mut first = self.take_on(per_second, &fast_items).await?;
        let second = if first.iter().any(refused) {
            // Denied already: the others are left for the denied request's peeks.
            vec![Outcome::Skipped; slow_items.len()]
        } else {
            let second = self.take_on(&self.backend, &slow_items).await?;
            if second.iter().any(refused) {
                for (item, outcome) in fast_items.iter().zip(first.iter_mut()) {
                    if let Outcome::Taken(d) = *outcome {
                        #[allow(clippy::cast_precision_loss)]
                        let cost = item.cost as f64;
                        let source = per_second
                            .refund(self.tables.as_ref(), &item.key, &item.limit, cost)
                            .await
                            .map_err(|e| self.client_failure(e))?;
                        self.policy_check(source)?;
                        *outcome = Outcome::Uncharged(d);
                    }
                }
            }
            second
        };
        let mut outcomes = vec![Outcome::Skipped; items.len()];
        let placed = fast.iter().zip(first).chain(slow.iter().zip(second));
        for ((index, _), outcome) in placed {
            if let Some(slot) = outcomes.get_mut(*index) {
                *slot = outcome;
            }
        }
        Ok(outcomes)
    }

    /// Takes every item's cost on `backend`, all or nothing, through the client's
    /// `acquire_across_slots`; shadow-mode items that refuse are reported and left out.
    async fn take_on(
        &self,
        backend: &Backend,
        items: &[&Limited],
    ) -> Result<Vec<Outcome>, Failure> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let asked: Vec<SlotItem<'_>> = items
            .iter()
            .map(|it| {
                #[allow(clippy::cast_precision_loss)]
                let item = match &it.in_table {
                    Some((table, fallback)) => {
                        SlotItem::new(fallback, it.limit, it.cost as f64).in_table(table, &it.key)
                    }
                    None => SlotItem::new(&it.key, it.limit, it.cost as f64),
                };
                if it.shadow {
                    item.shadow()
                } else {
                    item
                }
            })
            .collect();
        let decided = backend
            .acquire_across_slots(&asked)
            .await
            .map_err(|e| self.client_failure(e))?;
        for source in &decided.sources {
            self.policy_check(*source)?;
        }
        Ok(decided
            .outcomes
            .iter()
            .map(|outcome| match *outcome {
                SlotOutcome::Taken(d) => Outcome::Taken(d),
                // Allowed alone but not taken (or given back): reported with what Redis said.
                SlotOutcome::NotTaken(Some(d)) => Outcome::Uncharged(d),
                SlotOutcome::NotTaken(None) => Outcome::Skipped,
                SlotOutcome::Refused(d) => Outcome::Over(d),
                SlotOutcome::ShadowRefused(d) => Outcome::ShadowOver(d),
            })
            .collect())
    }

    /// Charges one post-paid item: the charge applies, and the item is over while its
    /// bucket is in debt.
    async fn charge(&self, item: &Limited) -> Result<Outcome, Failure> {
        #[allow(clippy::cast_precision_loss)]
        let cost = item.cost as f64;
        let c = self
            .backend_for(item)
            .charge(self.tables.as_ref(), &item.key, &item.limit, cost)
            .await
            .map_err(|e| self.client_failure(e))?;
        self.policy_check(c.source)?;
        // `closed` charged nothing and must still refuse, as its takes do.
        let over = crate::decision::quota::post_paid_over(c.balance) || c.source == Source::Closed;
        let d = Decision {
            allowed: !over,
            remaining: c.remaining(),
            retry_after_ms: c.retry_after_ms,
            reset_after_ms: c.reset_after_ms,
            limit: item.limit,
            source: c.source,
        };
        Ok(match (over, item.shadow) {
            (false, _) => Outcome::Taken(d),
            (true, false) => Outcome::Over(Some(d)),
            (true, true) => Outcome::ShadowOver(Some(d)),
        })
    }

    /// One bucket's state for a denied request that did not read it: a peek of its cost.
    async fn peek(&self, item: &Limited) -> Result<Outcome, Failure> {
        #[allow(clippy::cast_precision_loss)]
        let cost = item.cost as f64;
        let d = self
            .backend_for(item)
            .peek(self.tables.as_ref(), &item.key, &item.limit, cost)
            .await
            .map_err(|e| self.client_failure(e))?;
        self.policy_check(d.source)?;
        Ok(match (d.allowed, item.shadow) {
            (true, _) => Outcome::Peeked(d),
            (false, true) => Outcome::ShadowOver(Some(d)),
            (false, false) => Outcome::Over(Some(d)),
        })
    }

    /// RL_ON_ERROR=error: a `closed` decision of the library means Redis could not decide,
    /// and the call fails instead.
    fn policy_check(&self, source: Source) -> Result<(), Failure> {
        if self.settings.on_error == Policy::Error && source == Source::Closed {
            self.metrics.decisions.with_label_values(&["error"]).inc();
            return Err(Failure::Unavailable(
                "Redis cannot decide (RL_ON_ERROR=error)".into(),
            ));
        }
        Ok(())
    }

    fn client_failure(&self, e: ClientError) -> Failure {
        match e {
            ClientError::Invalid(text) => Failure::Invalid(text.to_string()),
            e => Failure::Internal(e.to_string()),
        }
    }
}

/// What the quota rule reads of one item's outcome: over when enforced and refused.
fn verdict((item, outcome): (&Limited, &Outcome)) -> Verdict {
    Verdict {
        quota: item.quota,
        over: matches!(outcome, Outcome::Over(_)),
    }
}

/// The Go service's thresholds for one bucket (`base_limiter.go`), in whole tokens: over
/// the limit past the capacity, near it past `floor(capacity × NEAR_LIMIT_RATIO)`.
struct Thresholds {
    over: u64,
    near: u64,
}

impl Thresholds {
    fn of(item: &Limited, ratio: f64) -> Thresholds {
        let capacity = item.limit.capacity().floor().max(0.0);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let (over, near) = (capacity as u64, (capacity * ratio).floor().max(0.0) as u64);
        Thresholds { over, near }
    }

    /// Of `cost` hits that fit, those past the near threshold: `used_after` is what the
    /// bucket has used once they are taken.
    fn near_hits_within(&self, remaining_after: u64, cost: u64) -> u64 {
        let used_after = self.over.saturating_sub(remaining_after);
        if used_after <= self.near {
            return 0;
        }
        let used_before = used_after.saturating_sub(cost);
        if used_before >= self.near {
            cost
        } else {
            used_after - self.near
        }
    }

    /// Of `cost` hits that do not fit, `(over, near)` as the Go service splits them: all
    /// over when the bucket was already past its capacity, else the part past the capacity
    /// over and the part between the near threshold and the capacity near.
    fn over_hits(&self, remaining_now: u64, cost: u64) -> (u64, u64) {
        let used_before = self.over.saturating_sub(remaining_now);
        if used_before >= self.over {
            return (cost, 0);
        }
        let used_after = used_before.saturating_add(cost);
        let over = used_after.saturating_sub(self.over);
        let near = self.over.saturating_sub(self.near.max(used_before));
        (over, near)
    }
}

/// The time `cost` tokens take to come back, in whole milliseconds rounded down: a take
/// that did not happen is that much sooner full.
fn cost_ms(limit: &Limit, cost: u64) -> i64 {
    let Some((per, period)) = limit.period() else {
        return 0;
    };
    if per == 0 {
        return 0;
    }
    let ms = u128::from(cost).saturating_mul(period.as_millis()) / u128::from(per);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// `cost_ms`, rounded up: a wait that must not end before the tokens are there.
fn cost_ms_up(limit: &Limit, cost: u64) -> i64 {
    let Some((per, period)) = limit.period() else {
        return 0;
    };
    if per == 0 {
        return 0;
    }
    let ms = u128::from(cost)
        .saturating_mul(period.as_millis())
        .div_ceil(u128::from(per));
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The status the `LIMIT_*` response headers report: a refusing one before any other (the
/// longest wait among them, since the request passes only when all do), else the one with
/// the fewest tokens left.
#[derive(Clone, Copy)]
struct Tightest {
    requests_per_unit: u32,
    remaining: u32,
    reset_ms: i64,
    over: bool,
}

impl Tightest {
    fn tighter_than(&self, other: &Tightest) -> bool {
        match (self.over, other.over) {
            (true, false) => true,
            (false, true) => false,
            (true, true) => self.reset_ms > other.reset_ms,
            (false, false) => self.remaining < other.remaining,
        }
    }
}

/// Whole seconds, rounded up: Envoy's x-ratelimit-reset reads only the seconds, and a
/// reset rounded down would tell a client to come back before the token is there.
pub(crate) fn duration(ms: i64) -> ProtoDuration {
    let ms = ms.max(0);
    ProtoDuration {
        seconds: ms / 1000 + i64::from(ms % 1000 > 0),
        nanos: 0,
    }
}

/// `n` descriptor statuses, each `OK` and nothing else yet: what a decision starts from.
pub(crate) fn ok_statuses(n: usize) -> Vec<DescriptorStatus> {
    (0..n)
        .map(|_| DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        })
        .collect()
}

fn response(
    code: Code,
    statuses: Vec<DescriptorStatus>,
    headers: Vec<HeaderValue>,
) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        response_headers_to_add: headers,
        ..Default::default()
    }
}

/// The Go service's stats key of an Envoy override: `domain.key_value.key…`.
fn override_stats_key(domain: &str, entries: &[(String, String)]) -> String {
    let mut key = domain.to_string();
    for (k, v) in entries {
        key.push('.');
        key.push_str(k);
        if !v.is_empty() {
            key.push('_');
            key.push_str(v);
        }
    }
    key
}

/// Appends `text` with `%` escaping of `%`, `_`, `{` and `}`: the unescaped `_` separates
/// the parts, so no two descriptors share a key, and no descriptor value can set a cluster
/// hash tag.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '_' => out.push_str("%5F"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// `CACHE_KEY_PREFIX` + escaped domain, then `_key_value` per entry, escaped. When that
/// is longer than [`MAX_PLAIN_KEY_BYTES`], the entries part is replaced by `%H` and the
/// SHA-256 (hex) of the escaped entries part: distinct descriptors keep distinct keys (the
/// escaping makes the entries part injective, SHA-256 keeps it so), and no short key can
/// equal a long one, since escaped text never holds `%H` (`%` is always `%25`, `%5F`,
/// `%7B` or `%7D` there). Hex holds no `{`, so a long key sets no cluster hash tag either.
pub fn redis_key(prefix: &str, domain: &str, entries: &[(String, String)]) -> String {
    let mut key = String::with_capacity(prefix.len() + domain.len() + 32);
    key.push_str(prefix);
    escape_into(&mut key, domain);
    let mut tail = String::with_capacity(32);
    for (k, v) in entries {
        tail.push('_');
        escape_into(&mut tail, k);
        tail.push('_');
        escape_into(&mut tail, v);
    }
    if key.len().saturating_add(tail.len()) <= MAX_PLAIN_KEY_BYTES {
        key.push_str(&tail);
        return key;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(tail.as_bytes());
    key.push_str("%H");
    for byte in digest {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

/// Checks a request before anything touches Redis.
pub(crate) fn check(request: &RateLimitRequest) -> Result<Vec<Wanted>, Failure> {
    let bad = |text: String| Err(Failure::Invalid(text));
    if request.domain.is_empty() {
        return bad("domain must not be empty".into());
    }
    if request.descriptors.is_empty() {
        return bad("descriptors must not be empty".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return bad(format!(
            "descriptors must be at most {MAX_DESCRIPTORS} (got {})",
            request.descriptors.len()
        ));
    }
    let request_cost = u64::from(request.hits_addend.max(1));
    let mut wanted = Vec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.iter().enumerate() {
        wanted.push(check_descriptor(i, d, request_cost)?);
    }
    Ok(wanted)
}

fn check_descriptor(
    i: usize,
    d: &RateLimitDescriptor,
    request_cost: u64,
) -> Result<Wanted, Failure> {
    let bad = |text: String| Err(Failure::Invalid(format!("descriptors[{i}]: {text}")));
    if d.entries.is_empty() {
        return bad("entries must not be empty".into());
    }
    if d.entries.len() > MAX_ENTRIES {
        return bad(format!("entries must be at most {MAX_ENTRIES}"));
    }
    for (j, e) in d.entries.iter().enumerate() {
        if e.key.is_empty() {
            return bad(format!("entries[{j}].key must not be empty"));
        }
    }
    let cost = d.hits_addend.map_or(request_cost, |h| h.value);
    // A refund of more than any bucket holds fills the bucket, as MAX_COST does.
    let cost = if d.is_negative_hits {
        cost.min(MAX_COST)
    } else {
        cost
    };
    let override_limit = match &d.limit {
        None => None,
        // requests_per_unit 0 is a ban, as in the config.
        Some(o) => match Unit::from_proto(o.unit) {
            Some(unit) => Some((o.requests_per_unit, unit)),
            None => return bad("limit needs a unit from SECOND to YEAR".into()),
        },
    };
    Ok(Wanted {
        entries: d
            .entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect(),
        cost,
        refund: d.is_negative_hits,
        override_limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn config_limits_go_to_redis_as_exact_periods() {
        use std::time::Duration;
        // 100 per minute: sent as 100/60, not as the double 1.666….
        let limit = bucket_limit(100, 60, 100.0).unwrap();
        assert_eq!(limit.period(), Some((100, Duration::from_secs(60))));
        assert_eq!(limit.capacity(), 100.0);
        // 20 per 5 minutes (unit_multiplier 5) with a burst of 7.
        let limit = bucket_limit(20, 300, 7.0).unwrap();
        assert_eq!(limit.period(), Some((20, Duration::from_secs(300))));
        assert_eq!(limit.capacity(), 7.0);
    }

    #[test]
    fn keys_are_distinct_whatever_the_underscores() {
        // Each pair would collide if `_` separated parts without escaping.
        let pairs = [
            (
                redis_key("", "d", &e(&[("a_b", "c")])),
                redis_key("", "d", &e(&[("a", "b_c")])),
            ),
            (
                redis_key("", "d_a", &e(&[("b", "c")])),
                redis_key("", "d", &e(&[("a_b", "c")])),
            ),
            (
                redis_key("", "d", &e(&[("a", ""), ("b", "")])),
                redis_key("", "d", &e(&[("a", "_b_")])),
            ),
            (
                redis_key("", "d", &e(&[("a", "%5F")])),
                redis_key("", "d", &e(&[("a", "_")])),
            ),
        ];
        for (a, b) in pairs {
            assert_ne!(a, b);
        }
        assert_eq!(redis_key("rl:", "d", &e(&[("k", "{x}")])), "rl:d_k_%7Bx%7D");
    }

    #[test]
    fn bad_requests_are_refused_before_redis() {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
        let desc = |key: &str, value: &str| RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        };
        let req = |domain: &str, descriptors: Vec<RateLimitDescriptor>| RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        };
        let cases = vec![
            (req("", vec![desc("k", "v")]), "domain"),
            (req("d", vec![]), "descriptors must not be empty"),
            (req("d", vec![desc("k", "v"); 5000]), "at most 64"),
            (req("d", vec![desc("", "v")]), "key must not be empty"),
            (
                req("d", vec![RateLimitDescriptor::default()]),
                "entries must not be empty",
            ),
        ];
        for (r, words) in cases {
            match check(&r) {
                Err(Failure::Invalid(text)) => assert!(text.contains(words), "{text}"),
                Err(other) => panic!("{other:?}"),
                Ok(_) => panic!("accepted {words}"),
            }
        }
    }

    #[test]
    fn long_keys_are_hashed_distinct_and_never_equal_a_short_one() {
        let long = |last: &str| redis_key("rl:", "d", &e(&[("k", &("v".repeat(2000) + last))]));
        let (a, b) = (long("a"), long("b"));
        assert_ne!(a, b);
        // The prefix and domain, the marker, 64 hex digits.
        assert!(a.starts_with("rl:d%H"), "{a}");
        assert_eq!(a.len(), "rl:d%H".len() + 64);
        assert!(a.bytes().skip(6).all(|c| c.is_ascii_hexdigit()));
        // A short key whose value spells the marker is escaped, so it cannot be `d%H…`.
        let spelled = redis_key("rl:", "d", &e(&[("k", &a[4..])]));
        assert_ne!(spelled, a);
        assert!(!spelled.contains("%H"));
        // At the boundary: 1,024 bytes stay plain, 1,025 are hashed.
        let at = |n: usize| redis_key("", "d", &e(&[("k", &"x".repeat(n))]));
        assert_eq!(at(MAX_PLAIN_KEY_BYTES - 4).len(), MAX_PLAIN_KEY_BYTES);
        assert!(at(MAX_PLAIN_KEY_BYTES - 3).contains("%H"));
    }

    #[test]
    fn over_and_near_hits_split_as_base_limiter_splits_them() {
        // A bucket of 10 with NEAR_LIMIT_RATIO 0.8: near past 8 used, over past 10.
        let t = Thresholds { over: 10, near: 8 };
        // (remaining now, cost, (over, near))
        let over_cases = [
            // Already empty: every hit over.
            (0, 3, (3, 0)),
            // 2 used before, cost 12: 4 past the capacity over, the 2 between 8 and 10 near.
            (8, 12, (4, 2)),
            // 9 used before, cost 2: 1 over, 1 near (from 9, not from 8).
            (1, 2, (1, 1)),
        ];
        for (remaining, cost, expected) in over_cases {
            assert_eq!(t.over_hits(remaining, cost), expected, "{remaining} {cost}");
        }
        // (remaining after the take, cost, near hits)
        let within_cases = [(5, 1, 0), (2, 1, 0), (1, 1, 1), (0, 3, 2), (0, 1, 1)];
        for (after, cost, near) in within_cases {
            assert_eq!(t.near_hits_within(after, cost), near, "{after} {cost}");
        }
    }
}
