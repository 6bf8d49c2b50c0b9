//! The call's entry: counts it, hands the descriptors tied to a request by its id to
//! `inflight` and the others to the service's plain decision. Above both, so neither imports
//! the other back: `inflight` uses the service, the service knows nothing of `inflight`.

use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::decision::inflight;
use crate::decision::service::{Failure, Service};

impl Service {
    /// Answers one request; `method` labels the metrics (`ShouldRateLimit`, `json`).
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
        method: &str,
    ) -> Result<RateLimitResponse, Failure> {
        let started = Instant::now();
        self.metrics
            .total_requests
            .with_label_values(&[method])
            .inc();
        let result = self.decide(request).await;
        if let Err(e) = &result {
            self.metrics.errors.with_label_values(&[e.kind()]).inc();
            tracing::debug!("ShouldRateLimit failed: {e:?}");
        }
        self.metrics
            .observe_response_time(method, started.elapsed().as_secs_f64());
        result
    }

    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Failure> {
        // Descriptors tied to one request by its id (concurrency limits, reservations) are
        // `inflight`'s; it hands the others back to `decide_plain`.
        if let Some(out) = inflight::decide(self, request).await? {
            return Ok(out);
        }
        self.decide_plain(request).await
    }
}
