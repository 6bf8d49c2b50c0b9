//! Thin apps on the redis-rl client library (`clients/rust`, crate `redis-rl-client`):
//!
//! - [`api`]: an axum API behind the library's tower Layer. Each client address gets a bucket
//!   of 5 requests at once, then 1 per second; over it, a 429 with a problem+json body and
//!   the RateLimit fields. `/health` is never limited.
//! - [`worker_pool`]: outbound throttling. Workers share one vendor's limit (10 calls per
//!   second across all workers and processes) and wait for their turn with
//!   `AsyncLimiter::wait` instead of getting a 429.
//!
//! `cargo run` serves the API on 127.0.0.1:8000 (REDIS_URL, default redis://127.0.0.1:6379).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::{Json, Router};
use redis::aio::ConnectionManager;
use redis_rl_client::layer::RateLimitLayer;
use redis_rl_client::{AsyncLimiter, Limit, OnError, Options, WaitError};

/// A shared async limiter on `redis_url` with the failure policy `on_error`. It needs no
/// connection to be built: a service that starts before its Redis serves at once, decided by
/// `on_error` until Redis answers, then by Redis. Call it inside the tokio runtime.
///
/// # Errors
/// A malformed `redis_url`; never an unreachable Redis.
pub fn limiter(
    redis_url: &str,
    on_error: OnError,
) -> Result<Arc<AsyncLimiter<ConnectionManager>>, redis_rl_client::Error> {
    let client = redis::Client::open(redis_url).map_err(redis_rl_client::Error::Redis)?;
    let options = Options::new(on_error)
        .deny_cache(true)
        .timeout(Duration::from_millis(500));
    Ok(Arc::new(AsyncLimiter::connect(client, options)?))
}

/// The API behind its rate limit: `limit` per client address, keys under `prefix`.
pub fn api(limiter: Arc<AsyncLimiter<ConnectionManager>>, limit: Limit, prefix: &str) -> Router {
    let layer = RateLimitLayer::new(limiter, limit)
        .prefix(prefix)
        .peer(|parts| {
            let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>();
            peer.map(|c| c.0.ip())
        })
        .skip(|parts| parts.uri.path() == "/health");
    Router::new()
        .route(
            "/",
            get(|| async { Json(serde_json::json!({ "hello": "world" })) }),
        )
        .route("/health", get(|| async { "ok" }))
        .layer(layer)
}

/// Serves `router` on `listener`, with each request's peer address for the limiter.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// A stand-in for the vendor's API.
async fn call_vendor(job: u64) -> u64 {
    job * job
}

/// Runs `jobs` on `workers` tasks, each call after its token from `key` of `limit`; returns
/// the results in order.
///
/// # Errors
/// [`WaitError::Timeout`] when a job gets no token within 30 s.
pub async fn worker_pool(
    limiter: Arc<AsyncLimiter<ConnectionManager>>,
    jobs: Vec<u64>,
    workers: usize,
    limit: Limit,
    key: String,
) -> Result<Vec<u64>, WaitError> {
    let jobs = Arc::new(jobs);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (limiter, jobs, next, key) = (limiter.clone(), jobs.clone(), next.clone(), key.clone());
        handles.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(i) else {
                    return Ok(done);
                };
                limiter
                    .clone()
                    .wait(&key, &limit, 1.0, Some(Duration::from_secs(30)))
                    .await?;
                done.push((i, call_vendor(*job).await));
            }
        }));
    }
    let mut results = vec![0; jobs.len()];
    for handle in handles {
        let done: Result<Vec<(usize, u64)>, WaitError> =
            handle.await.unwrap_or_else(|_| Ok(Vec::new()));
        for (i, value) in done? {
            if let Some(slot) = results.get_mut(i) {
                *slot = value;
            }
        }
    }
    Ok(results)
}
