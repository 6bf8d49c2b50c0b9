//! Prometheus metrics under envoyproxy/ratelimit's names and labels (what its statsd
//! mapper exports), so dashboards carry over, plus this service's own counters.

use std::borrow::Cow;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
    TextEncoder,
};

/// Every metric the service keeps.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub total_hits: IntCounterVec,
    pub over_limit: IntCounterVec,
    pub near_limit: IntCounterVec,
    pub within_limit: IntCounterVec,
    pub shadow_mode: IntCounterVec,
    /// Calls by method (`ShouldRateLimit`, `json`).
    pub total_requests: IntCounterVec,
    pub response_time: HistogramVec,
    /// Errors by kind: `invalid_argument`, `redis`, `module_missing`.
    pub errors: IntCounterVec,
    pub config_load_success: IntCounter,
    pub config_load_error: IntCounter,
    /// Decisions by who took them: redis, lua, cache, local, open, closed, error.
    pub decisions: IntCounterVec,
    /// Stats keys holding a request's value folded into the config's key past the bound.
    pub stats_keys_folded: IntCounter,
    /// Latency of the Redis part of a call.
    pub redis_time: Histogram,
    /// Each call's time for the statsd timers (`crate::telemetry::stats`), kept only while a sink is on.
    pub timings: crate::telemetry::timings::Timings,
}

const LIMIT_LABELS: &[&str] = &["domain", "key1", "key2"];

impl Metrics {
    /// A fresh registry with every metric registered.
    ///
    /// # Errors
    /// Only if two metrics shared a name, which the names below never do.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let plain = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let buckets = vec![
            0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
        ];
        let response_time = HistogramVec::new(
            HistogramOpts::new(
                "ratelimit_service_response_time_seconds",
                "Time to answer a call, by method",
            )
            .buckets(buckets.clone()),
            &["grpc_method"],
        )?;
        registry.register(Box::new(response_time.clone()))?;
        let redis_time = Histogram::with_opts(
            HistogramOpts::new(
                "redis_rl_envoy_redis_seconds",
                "Time spent in Redis (or the failure policy) per call",
            )
            .buckets(buckets),
        )?;
        registry.register(Box::new(redis_time.clone()))?;
        Ok(Metrics {
            total_hits: counter(
                "ratelimit_service_rate_limit_total_hits",
                "Hits (tokens asked for) per limit",
                LIMIT_LABELS,
            )?,
            over_limit: counter(
                "ratelimit_service_rate_limit_over_limit",
                "Hits denied per limit",
                LIMIT_LABELS,
            )?,
            near_limit: counter(
                "ratelimit_service_rate_limit_near_limit",
                "Hits allowed past NEAR_LIMIT_RATIO of the burst per limit",
                LIMIT_LABELS,
            )?,
            within_limit: counter(
                "ratelimit_service_rate_limit_within_limit",
                "Hits allowed per limit",
                LIMIT_LABELS,
            )?,
            shadow_mode: counter(
                "ratelimit_service_rate_limit_shadow_mode",
                "Hits over a shadow-mode limit, allowed anyway",
                LIMIT_LABELS,
            )?,
            total_requests: counter(
                "ratelimit_service_total_requests",
                "Calls by method",
                &["grpc_method"],
            )?,
            errors: counter(
                "ratelimit_service_should_rate_limit_error",
                "Calls that failed, by kind",
                &["err_type"],
            )?,
            config_load_success: plain(
                "ratelimit_service_config_load_success",
                "Config loads that succeeded",
            )?,
            config_load_error: plain(
                "ratelimit_service_config_load_error",
                "Config loads refused (the previous config stays)",
            )?,
            stats_keys_folded: plain(
                "redis_rl_envoy_stats_keys_folded",
                "Calls whose stats key held a request's value past the bound on such keys, counted under the config's key instead",
            )?,
            decisions: counter(
                "redis_rl_envoy_decisions_total",
                "Decisions by who took them (redis, lua, cache, local, open, closed)",
                &["source"],
            )?,
            redis_time,
            response_time,
            timings: crate::telemetry::timings::Timings::default(),
            registry,
        })
    }

    /// One call's time: the histogram, and the statsd timer if a sink is on.
    pub fn observe_response_time(&self, method: &str, seconds: f64) {
        self.response_time
            .with_label_values(&[method])
            .observe(seconds);
        self.timings.record(method, seconds);
    }

    /// Every metric's current values (what the statsd sinks and `/stats` read).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }

    /// The `domain`, `key1`, `key2` labels of a stats key `domain.level1.level2…` (levels
    /// past the second stay in `key2`, joined by dots), after the peer's cleaning of stat
    /// names (`crate::telemetry::names::sanitize_stat_name`): a value such as `10.1.2.3` stays in one
    /// label instead of splitting at its dots.
    pub fn labels<'a>(domain: &'a str, stats_key: &'a str) -> [Cow<'a, str>; 3] {
        fn split<'k>(domain: &str, stats_key: &'k str) -> (&'k str, &'k str) {
            let rest = stats_key
                .strip_prefix(domain)
                .and_then(|r| r.strip_prefix('.'))
                .unwrap_or("");
            rest.split_once('.').unwrap_or((rest, ""))
        }
        use crate::telemetry::names::sanitize_stat_name as clean;
        match (clean(domain), clean(stats_key)) {
            // The usual case: nothing to clean, nothing allocated.
            (Cow::Borrowed(domain), Cow::Borrowed(stats_key)) => {
                let (key1, key2) = split(domain, stats_key);
                [domain.into(), key1.into(), key2.into()]
            }
            (domain, stats_key) => {
                let (key1, key2) = split(&domain, &stats_key);
                let (key1, key2) = (key1.to_string(), key2.to_string());
                [Cow::Owned(domain.into_owned()), key1.into(), key2.into()]
            }
        }
    }
}
