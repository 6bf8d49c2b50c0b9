//! HTTP rate limiting as a `tower::Layer` on [`AsyncLimiter`], for axum, hyper and tonic
//! (the `tower` feature; nothing HTTP is compiled without it).
//!
//! ```ignore
//! let layer = RateLimitLayer::new(limiter, Limit::new(10.0, 20.0)?)
//!     .peer(|req| req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
//! let app = Router::new().route("/", get(handler)).layer(layer);
//! ```
//!
//! Each request takes `cost` tokens from the bucket of its key (the client address, a
//! header, or the caller's function). Over the limit the inner service does not run and a
//! 429 with an RFC 9457 `application/problem+json` body is returned. Header fields written
//! on each response the limiter decided:
//!
//! - `RateLimit-Policy` and `RateLimit`, as draft-ietf-httpapi-ratelimit-headers-10
//!   (September 2025) defines them: `"default";q=<capacity>;w=<seconds to refill it>` and
//!   `"default";r=<remaining>;t=<seconds until full>`;
//! - `X-RateLimit-Limit`, `-Remaining`, `-Reset` (on by default);
//! - `Retry-After` on a 429 that a wait can cure.
//!
//! The key, limit, cost and skip extractors may each be a plain function or an async one
//! (`key_fn_async`, `limit_async`, ...): a user's plan can be looked up per request.
//!
//! Each limit has its own key space by default, `rl:http:<rate>:<capacity>:`, as in the
//! Python and Node middlewares, so two layers with different limits never share a bucket;
//! two layers that still name one Redis key for a request are refused (a 500 naming the key).
//! When several layers decide one request, one set of fields is written (by the outermost):
//! `RateLimit-Policy` and `RateLimit` as the draft's lists, one item per limit, and
//! `X-RateLimit-*` of the tightest (the fewest tokens left).
//!
//! A decision by the `Open` failure policy knows no quota, so it writes none of these; one by
//! `Closed` knows the configured limit but not what is left, so it writes `RateLimit-Policy`,
//! `X-RateLimit-Limit` and `Retry-After` only. The limiter's failure policy, deny cache and
//! Lua fallback apply unchanged. This module sits on the limiter's public API only.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use redis::aio::ConnectionLike;

use crate::types::{Decision, Limit, Source};
use crate::{AsyncLeaseGuard, AsyncLimiter};

/// The draft whose `RateLimit-Policy` and `RateLimit` syntax is written.
pub const HEADERS_DRAFT: &str = "draft-ietf-httpapi-ratelimit-headers-10";
/// The content type of the 429 body (RFC 9457).
pub const PROBLEM_TYPE: &str = "application/problem+json";

/// The start of every default key space: `rl:http:<rate>:<capacity>:`.
pub const DEFAULT_PREFIX: &str = "rl:http:";

/// The names the fields are written under; the outermost layer replaces them in a response.
const FIELD_NAMES: [&str; 6] = [
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

type Parts = http::request::Parts;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type SyncFn<T> = dyn Fn(&Parts) -> T + Send + Sync;
type AsyncFn<T> = dyn Fn(&Parts) -> BoxFuture<T> + Send + Sync;
type PeerFn = dyn Fn(&Parts) -> Option<IpAddr> + Send + Sync;
type LimitedFn = dyn Fn(&Decision, &[(String, String)]) -> Response<String> + Send + Sync;

/// An extractor of the request: a plain function, or one returning a future (awaited).
/// Plain ones are kept apart so they cost no allocation per request.
enum Hook<T> {
    Sync(Arc<SyncFn<T>>),
    Async(Arc<AsyncFn<T>>),
}

impl<T> Clone for Hook<T> {
    fn clone(&self) -> Self {
        match self {
            Hook::Sync(f) => Hook::Sync(f.clone()),
            Hook::Async(f) => Hook::Async(f.clone()),
        }
    }
}

impl<T: 'static> Hook<T> {
    fn sync(f: impl Fn(&Parts) -> T + Send + Sync + 'static) -> Self {
        Hook::Sync(Arc::new(f))
    }

    fn from_async<F>(f: impl Fn(&Parts) -> F + Send + Sync + 'static) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        Hook::Async(Arc::new(move |parts| Box::pin(f(parts)) as BoxFuture<T>))
    }

    async fn run(&self, parts: &Parts) -> T {
        match self {
            Hook::Sync(f) => f(parts),
            Hook::Async(f) => f(parts).await,
        }
    }
}

/// How a request names its bucket.
#[derive(Clone)]
enum Key {
    Client,
    Header(HeaderName),
    Function(Hook<Option<String>>),
}

struct Config<C> {
    limiter: Arc<AsyncLimiter<C>>,
    limit: Hook<Limit>,
    key: Key,
    peer: Arc<PeerFn>,
    cost: Hook<f64>,
    trusted: Vec<(IpAddr, u8)>,
    /// `None`: the limit's own key space, `rl:http:<rate>:<capacity>:`.
    prefix: Option<String>,
    policy_name: String,
    legacy_headers: bool,
    skip: Option<Hook<bool>>,
    on_limited: Option<Arc<LimitedFn>>,
}

// By hand: a derive would ask for `C: Clone`, and only the Arc is cloned.
impl<C> Clone for Config<C> {
    fn clone(&self) -> Self {
        Config {
            limiter: self.limiter.clone(),
            limit: self.limit.clone(),
            key: self.key.clone(),
            peer: self.peer.clone(),
            cost: self.cost.clone(),
            trusted: self.trusted.clone(),
            prefix: self.prefix.clone(),
            policy_name: self.policy_name.clone(),
            legacy_headers: self.legacy_headers,
            skip: self.skip.clone(),
            on_limited: self.on_limited.clone(),
        }
    }
}

/// The layer: build it with [`RateLimitLayer::new`] and the builder methods, then
/// `.layer(…)` it onto a router or service.
pub struct RateLimitLayer<C> {
    config: Arc<Config<C>>,
}

impl<C> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: self.config.clone(),
        }
    }
}

fn config_mut<C>(layer: &mut RateLimitLayer<C>) -> &mut Config<C> {
    Arc::make_mut(&mut layer.config)
}

impl<C> RateLimitLayer<C> {
    /// A layer taking one token per request from the bucket of the client address.
    /// The address is the `SocketAddr` in the request's extensions (hyper users insert it);
    /// for axum set [`RateLimitLayer::peer`] to read its `ConnectInfo`.
    pub fn new(limiter: Arc<AsyncLimiter<C>>, limit: Limit) -> Self {
        RateLimitLayer {
            config: Arc::new(Config {
                limiter,
                limit: Hook::sync(move |_| limit),
                key: Key::Client,
                peer: Arc::new(|parts| parts.extensions.get::<SocketAddr>().map(|a| a.ip())),
                cost: Hook::sync(|_| 1.0),
                trusted: Vec::new(),
                prefix: None,
                policy_name: "default".to_string(),
                legacy_headers: true,
                skip: None,
                on_limited: None,
            }),
        }
    }

    /// Keys by a request header's value (requests without it fall back to the address).
    pub fn key_header(mut self, name: HeaderName) -> Self {
        config_mut(&mut self).key = Key::Header(name);
        self
    }

    /// Keys by the caller's function (`None` falls back to the address).
    pub fn key_fn(
        mut self,
        key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        config_mut(&mut self).key = Key::Function(Hook::sync(key));
        self
    }

    /// Keys by the caller's async function (`None` falls back to the address). The future
    /// is `'static`: clone from the request what it needs before the `async move` block.
    pub fn key_fn_async<F>(mut self, key: impl Fn(&Parts) -> F + Send + Sync + 'static) -> Self
    where
        F: Future<Output = Option<String>> + Send + 'static,
    {
        config_mut(&mut self).key = Key::Function(Hook::from_async(key));
        self
    }

    /// The limit per request (a user's plan) instead of the one given to `new`. Each limit
    /// has its own key space unless [`RateLimitLayer::prefix`] is set.
    pub fn limit_fn(mut self, limit: impl Fn(&Parts) -> Limit + Send + Sync + 'static) -> Self {
        config_mut(&mut self).limit = Hook::sync(limit);
        self
    }

    /// The limit per request, from an async function (a plan looked up in a database).
    pub fn limit_async<F>(mut self, limit: impl Fn(&Parts) -> F + Send + Sync + 'static) -> Self
    where
        F: Future<Output = Limit> + Send + 'static,
    {
        config_mut(&mut self).limit = Hook::from_async(limit);
        self
    }

    /// Where the peer's address comes from (axum: its `ConnectInfo<SocketAddr>`).
    pub fn peer(mut self, peer: impl Fn(&Parts) -> Option<IpAddr> + Send + Sync + 'static) -> Self {
        config_mut(&mut self).peer = Arc::new(peer);
        self
    }

    /// Tokens per request (default 1).
    pub fn cost(mut self, cost: impl Fn(&Parts) -> f64 + Send + Sync + 'static) -> Self {
        config_mut(&mut self).cost = Hook::sync(cost);
        self
    }

    /// Tokens per request, from an async function.
    pub fn cost_async<F>(mut self, cost: impl Fn(&Parts) -> F + Send + Sync + 'static) -> Self
    where
        F: Future<Output = f64> + Send + 'static,
    {
        config_mut(&mut self).cost = Hook::from_async(cost);
        self
    }

    /// Proxies whose `X-Forwarded-For` is believed: (address, prefix bits), as
    /// `("10.0.0.0".parse()?, 8)`. From anyone else it is ignored (default: nobody).
    pub fn trusted_proxies(mut self, networks: impl IntoIterator<Item = (IpAddr, u8)>) -> Self {
        config_mut(&mut self).trusted = networks.into_iter().collect();
        self
    }

    /// Put before each key in Redis. By default each limit has its own key space,
    /// `rl:http:<rate>:<capacity>:` (`rl:http:0.01:3:ip:203.0.113.7`), so two layers with
    /// different limits never share a bucket; two that still name one key for a request (the
    /// same limit, or the same prefix) are refused: give each its own prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        config_mut(&mut self).prefix = Some(prefix.into());
        self
    }

    /// The policy name in the RateLimit fields (default "default").
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        config_mut(&mut self).policy_name = name.into();
        self
    }

    /// Whether to write `X-RateLimit-*` too (default true).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        config_mut(&mut self).legacy_headers = on;
        self
    }

    /// Requests for which `skip` is true pass untouched (health checks).
    pub fn skip(mut self, skip: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        config_mut(&mut self).skip = Some(Hook::sync(skip));
        self
    }

    /// Requests for which the async `skip` gives true pass untouched.
    pub fn skip_async<F>(mut self, skip: impl Fn(&Parts) -> F + Send + Sync + 'static) -> Self
    where
        F: Future<Output = bool> + Send + 'static,
    {
        config_mut(&mut self).skip = Some(Hook::from_async(skip));
        self
    }

    /// The response to send instead of the problem+json 429, given the decision and the
    /// header fields (which are added to it).
    pub fn on_limited(
        mut self,
        respond: impl Fn(&Decision, &[(String, String)]) -> Response<String> + Send + Sync + 'static,
    ) -> Self {
        config_mut(&mut self).on_limited = Some(Arc::new(respond));
        self
    }
}

impl<S, C> tower::Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around an inner one.
pub struct RateLimit<S, C> {
    inner: S,
    config: Arc<Config<C>>,
}

impl<S: Clone, C> Clone for RateLimit<S, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

fn in_network(ip: IpAddr, (net, bits): (IpAddr, u8)) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let bits = u32::from(bits.min(32));
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let bits = u32::from(bits.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The client address: the peer, or, when the peer is a trusted proxy, the nearest address
/// in `X-Forwarded-For` that is not one (read from the right, where the trusted proxies
/// appended; anything further left may be forged).
pub fn client_address(
    peer: Option<IpAddr>,
    forwarded_for: Option<&str>,
    trusted: &[(IpAddr, u8)],
) -> Option<IpAddr> {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| in_network(ip, *n));
    let peer_ip = peer?;
    let Some(forwarded) = forwarded_for.filter(|_| is_trusted(peer_ip)) else {
        return Some(peer_ip);
    };
    let hops: Vec<&str> = forwarded
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>() {
            Err(_) => return Some(peer_ip),
            Ok(ip) if !is_trusted(ip) => return Some(ip),
            Ok(_) => {}
        }
    }
    hops.first().and_then(|h| h.parse().ok()).or(Some(peer_ip))
}

impl<C> Config<C> {
    /// What goes before the key in Redis: `prefix`, or the limit's own key space.
    fn prefix_for(&self, limit: &Limit) -> String {
        match &self.prefix {
            Some(prefix) => prefix.clone(),
            None => format!(
                "{DEFAULT_PREFIX}{}:{}:",
                limit.rate_text(),
                limit.capacity_text()
            ),
        }
    }

    async fn key_for(&self, parts: &Parts, limit: &Limit) -> String {
        let key = request_key(&self.key, self.peer.as_ref(), &self.trusted, parts).await;
        format!("{}{}", self.prefix_for(limit), key)
    }
}

/// A request's key without the prefix: the header's value (`h:…`), the caller's function's,
/// or the client address (`ip:…`).
async fn request_key(key: &Key, peer: &PeerFn, trusted: &[(IpAddr, u8)], parts: &Parts) -> String {
    let key = match key {
        Key::Client => None,
        Key::Header(name) => parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| format!("h:{v}")),
        Key::Function(f) => f.run(parts).await,
    };
    key.unwrap_or_else(|| {
        let forwarded: Vec<&str> = parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let forwarded = (!forwarded.is_empty()).then(|| forwarded.join(","));
        match client_address(peer(parts), forwarded.as_deref(), trusted) {
            Some(ip) => format!("ip:{ip}"),
            None => "ip:unknown".to_string(),
        }
    })
}

/// What one layer decided for a request.
struct Decided {
    /// Which layer (its config's address), to tell a second layer from a repeat.
    layer_id: usize,
    key: String,
    policy_name: String,
    legacy_headers: bool,
    decision: Decision,
}

/// The decisions of every layer a request went through, kept in its extensions: the
/// outermost layer put it there and writes the one set of fields from it.
#[derive(Clone, Default)]
struct Decisions(Arc<Mutex<Vec<Decided>>>);

impl Decisions {
    fn with<T>(&self, f: impl FnOnce(&mut Vec<Decided>) -> T) -> T {
        // A poisoned lock only means another layer's hook panicked mid-push; the list is
        // still whole, so read on rather than turn it into a crash.
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }
}

fn policy_item(name: &str, limit: &Limit) -> String {
    let window_s = crate::script::refill_s(limit);
    format!("\"{name}\";q={};w={window_s}", limit.capacity().floor())
}

fn ceil_s(ms: i64) -> i64 {
    ms.max(0).saturating_add(999) / 1000
}

/// One set of header fields for the decisions of one request: each limit an item of
/// `RateLimit-Policy` (unless `Open` decided it) and of `RateLimit` (unless a failure
/// policy other than `Local` did: no quota is known), `X-RateLimit-*` of the tightest limit
/// whose quota is known (`X-RateLimit-Limit` alone when only `Closed` decided), and
/// `Retry-After`, the longest wait among the denials a wait can cure.
fn header_fields(all: &[Decided]) -> Vec<(String, String)> {
    let decided: Vec<&Decided> = all
        .iter()
        .filter(|d| d.decision.source != Source::Open)
        .collect();
    let known: Vec<&Decided> = decided
        .iter()
        .copied()
        .filter(|d| d.decision.source != Source::Closed)
        .collect();
    let mut out = Vec::new();
    if !decided.is_empty() {
        let items: Vec<String> = decided
            .iter()
            .map(|d| policy_item(&d.policy_name, &d.decision.limit))
            .collect();
        out.push(("RateLimit-Policy".to_string(), items.join(", ")));
    }
    if !known.is_empty() {
        let items: Vec<String> = known
            .iter()
            .map(|d| {
                let r = d.decision.remaining;
                let t = ceil_s(d.decision.reset_after_ms);
                format!("\"{}\";r={r};t={t}", d.policy_name)
            })
            .collect();
        out.push(("RateLimit".to_string(), items.join(", ")));
    }
    if decided.iter().any(|d| d.legacy_headers) {
        let tightest = known.iter().min_by_key(|d| {
            (
                d.decision.remaining,
                std::cmp::Reverse(d.decision.reset_after_ms),
            )
        });
        match (tightest, decided.first()) {
            (Some(tight), _) => {
                for (field, value) in tight.decision.headers() {
                    if field != "Retry-After" {
                        out.push((field.to_string(), value));
                    }
                }
            }
            (None, Some(first)) => out.push((
                "X-RateLimit-Limit".to_string(),
                first.decision.limit.capacity_text(),
            )),
            (None, None) => {}
        }
    }
    let longest_wait_ms = decided
        .iter()
        .filter(|d| !d.decision.allowed && d.decision.retry_after_ms >= 0)
        .map(|d| d.decision.retry_after_ms)
        .max();
    if let Some(wait_ms) = longest_wait_ms {
        out.push(("Retry-After".to_string(), ceil_s(wait_ms).to_string()));
    }
    out
}

/// The RFC 9457 problem details body of a 429.
pub fn problem(decision: &Decision) -> String {
    let detail = if decision.retry_after_ms < 0 {
        "This request costs more than the rate limit's capacity; it can never be allowed."
            .to_string()
    } else {
        let retry_s = decision.retry_after_ms.saturating_add(999) / 1000;
        format!("Rate limit exceeded; retry after {retry_s} s.")
    };
    format!(
        "{{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"{detail}\"}}"
    )
}

/// Writes `fields` in place of any rate-limit fields the response already has (an inner
/// layer's `on_limited` response, say), so one set is sent.
fn set_headers<B>(response: &mut Response<B>, fields: &[(String, String)]) {
    for name in FIELD_NAMES {
        response.headers_mut().remove(name);
    }
    for (name, value) in fields {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
}

fn plain<B: From<String>>(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

impl<S, C, ReqB, ResB> tower::Service<Request<ReqB>> for RateLimit<S, C>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    C: ConnectionLike + Clone + Send + Sync + 'static,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The clone that was polled ready serves this request; the fresh one waits its turn.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            if let Some(skip) = &config.skip {
                if skip.run(&parts).await {
                    return inner.call(Request::from_parts(parts, body)).await;
                }
            }
            // The first layer a request meets keeps the list; the inner ones add to it.
            let (decisions, outermost) = match parts.extensions.get::<Decisions>() {
                Some(decisions) => (decisions.clone(), false),
                None => {
                    let decisions = Decisions::default();
                    parts.extensions.insert(decisions.clone());
                    (decisions, true)
                }
            };
            let limit = config.limit.run(&parts).await;
            let key = config.key_for(&parts, &limit).await;
            let layer_id = Arc::as_ptr(&config) as *const () as usize;
            let clash =
                decisions.with(|all| all.iter().any(|d| d.key == key && d.layer_id != layer_id));
            if clash {
                let message = format!(
                    "two rate limits use the Redis key {key:?} for one request, so each would \
                     count the other's requests; give each its own prefix"
                );
                log::error!("redis-rl: {message}");
                return Ok(plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    message,
                ));
            }
            let cost = config.cost.run(&parts).await;
            let decision = match config.limiter.acquire(&key, &limit, cost).await {
                Ok(decision) => decision,
                Err(e) => {
                    log::error!("redis-rl: the rate limiter failed: {e}");
                    return Ok(plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        "rate limiter error".to_string(),
                    ));
                }
            };
            let fields = decisions.with(|all| {
                all.push(Decided {
                    layer_id,
                    key,
                    policy_name: config.policy_name.clone(),
                    legacy_headers: config.legacy_headers,
                    decision,
                });
                header_fields(all)
            });
            let mut response = if decision.allowed {
                inner.call(Request::from_parts(parts, body)).await?
            } else {
                match &config.on_limited {
                    Some(respond) => respond(&decision, &fields).map(ResB::from),
                    None => plain(
                        StatusCode::TOO_MANY_REQUESTS,
                        PROBLEM_TYPE,
                        problem(&decision),
                    ),
                }
            };
            if outermost {
                let fields = decisions.with(|all| header_fields(all));
                set_headers(&mut response, &fields);
            }
            Ok(response)
        })
    }
}

// The in-flight limit ------------------------------------------------------------------------

/// The start of the in-flight layer's default key space: `rl:inflight:<limit>:`.
pub const IN_FLIGHT_PREFIX: &str = "rl:inflight:";

struct InFlightConfig<C> {
    limiter: Arc<AsyncLimiter<C>>,
    limit: u32,
    ttl_ms: u64,
    key: Key,
    peer: Arc<PeerFn>,
    trusted: Vec<(IpAddr, u8)>,
    prefix: Option<String>,
    skip: Option<Hook<bool>>,
}

impl<C> Clone for InFlightConfig<C> {
    fn clone(&self) -> Self {
        InFlightConfig {
            limiter: self.limiter.clone(),
            limit: self.limit,
            ttl_ms: self.ttl_ms,
            key: self.key.clone(),
            peer: self.peer.clone(),
            trusted: self.trusted.clone(),
            prefix: self.prefix.clone(),
            skip: self.skip.clone(),
        }
    }
}

/// At most `limit` requests of one key in flight at once, with leases (RL.LEASE): a lease is
/// taken before the inner service runs and held until the response body has been sent to the
/// end, or dropped (a client that disconnects, a handler that fails or panics, a request
/// aborted before its response). A lease lasts `ttl` unless renewed, and is renewed at
/// `ttl / 2` while held, so a long stream keeps its slot and a crashed process loses it
/// after `ttl`. Over the limit the inner service does not run: a 429 with `Retry-After`
/// (when a slot frees) and an RFC 9457 problem body.
///
/// ```ignore
/// let app = Router::new()
///     .route("/export", get(export))
///     .layer(InFlightLayer::new(limiter, 10, Duration::from_secs(30)).key_header(tenant));
/// ```
///
/// The response body is wrapped in [`InFlightBody`], which holds the lease. The limiter's
/// failure policy applies: `Open` lets requests through uncounted, `Closed` answers 429,
/// `Local` counts in this process.
pub struct InFlightLayer<C> {
    config: Arc<InFlightConfig<C>>,
}

impl<C> Clone for InFlightLayer<C> {
    fn clone(&self) -> Self {
        InFlightLayer {
            config: self.config.clone(),
        }
    }
}

impl<C> InFlightLayer<C> {
    /// At most `limit` (1 to 10,000) requests in flight per client address, each lease
    /// lasting `ttl` (at least 1 ms) unless renewed. The address is read as for
    /// [`RateLimitLayer::new`]; see [`InFlightLayer::peer`].
    pub fn new(limiter: Arc<AsyncLimiter<C>>, limit: u32, ttl: std::time::Duration) -> Self {
        InFlightLayer {
            config: Arc::new(InFlightConfig {
                limiter,
                limit,
                ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                key: Key::Client,
                peer: Arc::new(|parts| parts.extensions.get::<SocketAddr>().map(|a| a.ip())),
                trusted: Vec::new(),
                prefix: None,
                skip: None,
            }),
        }
    }

    /// Keys by a request header's value (requests without it fall back to the address).
    pub fn key_header(mut self, name: HeaderName) -> Self {
        Arc::make_mut(&mut self.config).key = Key::Header(name);
        self
    }

    /// Keys by the caller's function (`None` falls back to the address).
    pub fn key_fn(
        mut self,
        key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).key = Key::Function(Hook::sync(key));
        self
    }

    /// Where the peer's address comes from (axum: its `ConnectInfo<SocketAddr>`).
    pub fn peer(mut self, peer: impl Fn(&Parts) -> Option<IpAddr> + Send + Sync + 'static) -> Self {
        Arc::make_mut(&mut self.config).peer = Arc::new(peer);
        self
    }

    /// Proxies whose `X-Forwarded-For` is believed, as [`RateLimitLayer::trusted_proxies`].
    pub fn trusted_proxies(mut self, networks: impl IntoIterator<Item = (IpAddr, u8)>) -> Self {
        Arc::make_mut(&mut self.config).trusted = networks.into_iter().collect();
        self
    }

    /// Put before each key in Redis (default `rl:inflight:<limit>:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.config).prefix = Some(prefix.into());
        self
    }

    /// Requests for which `skip` is true pass untouched and hold no lease.
    pub fn skip(mut self, skip: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        Arc::make_mut(&mut self.config).skip = Some(Hook::sync(skip));
        self
    }
}

impl<S, C> tower::Layer<S> for InFlightLayer<C> {
    type Service = InFlight<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlight {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`InFlightLayer`] wraps around an inner one.
pub struct InFlight<S, C> {
    inner: S,
    config: Arc<InFlightConfig<C>>,
}

impl<S: Clone, C> Clone for InFlight<S, C> {
    fn clone(&self) -> Self {
        InFlight {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

/// A response body that holds a lease of [`InFlightLayer`] until it ends (its last frame
/// was read) or is dropped, whichever comes first; the frames pass through unchanged.
pub struct InFlightBody<B> {
    inner: Pin<Box<B>>,
    held: Option<Box<dyn Send + Sync>>,
}

impl<B> InFlightBody<B> {
    /// A body that holds nothing (a 429, a skipped request).
    pub fn new(inner: B) -> Self {
        InFlightBody {
            inner: Box::pin(inner),
            held: None,
        }
    }

    fn holding(inner: B, held: Box<dyn Send + Sync>) -> Self {
        InFlightBody {
            inner: Box::pin(inner),
            held: Some(held),
        }
    }

    /// Whether the body still holds its lease.
    pub fn holds_lease(&self) -> bool {
        self.held.is_some()
    }
}

impl<B: http_body::Body> http_body::Body for InFlightBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = this.inner.as_mut().poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // Sent to the end (or failed, which ends it): the slot goes back now.
            this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<S, C, ReqB, ResB> tower::Service<Request<ReqB>> for InFlight<S, C>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    C: ConnectionLike + Clone + Send + Sync + 'static,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<InFlightBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            if let Some(skip) = &config.skip {
                if skip.run(&parts).await {
                    let response = inner.call(Request::from_parts(parts, body)).await?;
                    return Ok(response.map(InFlightBody::new));
                }
            }
            let prefix = match &config.prefix {
                Some(prefix) => prefix.clone(),
                None => format!("{IN_FLIGHT_PREFIX}{}:", config.limit),
            };
            let key = format!(
                "{prefix}{}",
                request_key(&config.key, config.peer.as_ref(), &config.trusted, &parts).await
            );
            let lease = match config
                .limiter
                .lease(&key, config.limit, config.ttl_ms, None)
                .await
            {
                Ok(lease) => lease,
                Err(e) => {
                    log::error!("redis-rl: the in-flight limit failed: {e}");
                    return Ok(plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        "rate limiter error".to_string(),
                    )
                    .map(InFlightBody::new));
                }
            };
            if !lease.allowed {
                let retry_s = ceil_s(lease.retry_after_ms);
                let detail = format!(
                    "{{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\
                     \"detail\":\"Too many requests in flight; retry after {retry_s} s.\"}}"
                );
                let mut response: Response<ResB> =
                    plain(StatusCode::TOO_MANY_REQUESTS, PROBLEM_TYPE, detail);
                if let Ok(value) = HeaderValue::from_str(&retry_s.to_string()) {
                    response.headers_mut().insert("retry-after", value);
                }
                return Ok(response.map(InFlightBody::new));
            }
            // Dropped with this future (a request aborted before its response) or with the
            // body: either way the lease goes back.
            let guard = AsyncLeaseGuard::start(config.limiter.clone(), &key, lease, config.ttl_ms);
            let response = inner.call(Request::from_parts(parts, body)).await?;
            Ok(response.map(|body| InFlightBody::holding(body, Box::new(guard))))
        })
    }
}
