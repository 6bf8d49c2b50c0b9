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
//! A decision by the `Open` failure policy knows no quota, so it writes none of these. The
//! limiter's failure policy, deny cache and Lua fallback apply unchanged. This module sits
//! on the limiter's public API only.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use redis::aio::ConnectionLike;

use crate::types::{Decision, Limit, Source};
use crate::AsyncLimiter;

/// The draft whose `RateLimit-Policy` and `RateLimit` syntax is written.
pub const HEADERS_DRAFT: &str = "draft-ietf-httpapi-ratelimit-headers-10";
/// The content type of the 429 body (RFC 9457).
pub const PROBLEM_TYPE: &str = "application/problem+json";

type KeyFn = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;
type PeerFn = dyn Fn(&http::request::Parts) -> Option<IpAddr> + Send + Sync;
type CostFn = dyn Fn(&http::request::Parts) -> f64 + Send + Sync;
type SkipFn = dyn Fn(&http::request::Parts) -> bool + Send + Sync;
type LimitedFn = dyn Fn(&Decision, &[(String, String)]) -> Response<String> + Send + Sync;

/// How a request names its bucket.
#[derive(Clone)]
enum Key {
    Client,
    Header(HeaderName),
    Function(Arc<KeyFn>),
}

struct Config<C> {
    limiter: Arc<AsyncLimiter<C>>,
    limit: Limit,
    key: Key,
    peer: Arc<PeerFn>,
    cost: Arc<CostFn>,
    trusted: Vec<(IpAddr, u8)>,
    prefix: String,
    policy_name: String,
    legacy_headers: bool,
    skip: Option<Arc<SkipFn>>,
    on_limited: Option<Arc<LimitedFn>>,
}

// By hand: a derive would ask for `C: Clone`, and only the Arc is cloned.
impl<C> Clone for Config<C> {
    fn clone(&self) -> Self {
        Config {
            limiter: self.limiter.clone(),
            limit: self.limit,
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
                limit,
                key: Key::Client,
                peer: Arc::new(|parts| parts.extensions.get::<SocketAddr>().map(|a| a.ip())),
                cost: Arc::new(|_| 1.0),
                trusted: Vec::new(),
                prefix: "rl:http:".to_string(),
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
        key: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        config_mut(&mut self).key = Key::Function(Arc::new(key));
        self
    }

    /// Where the peer's address comes from (axum: its `ConnectInfo<SocketAddr>`).
    pub fn peer(
        mut self,
        peer: impl Fn(&http::request::Parts) -> Option<IpAddr> + Send + Sync + 'static,
    ) -> Self {
        config_mut(&mut self).peer = Arc::new(peer);
        self
    }

    /// Tokens per request (default 1).
    pub fn cost(
        mut self,
        cost: impl Fn(&http::request::Parts) -> f64 + Send + Sync + 'static,
    ) -> Self {
        config_mut(&mut self).cost = Arc::new(cost);
        self
    }

    /// Proxies whose `X-Forwarded-For` is believed: (address, prefix bits), as
    /// `("10.0.0.0".parse()?, 8)`. From anyone else it is ignored (default: nobody).
    pub fn trusted_proxies(mut self, networks: impl IntoIterator<Item = (IpAddr, u8)>) -> Self {
        config_mut(&mut self).trusted = networks.into_iter().collect();
        self
    }

    /// Put before each key in Redis (default "rl:http:").
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        config_mut(&mut self).prefix = prefix.into();
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
    pub fn skip(
        mut self,
        skip: impl Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        config_mut(&mut self).skip = Some(Arc::new(skip));
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
    fn key_for(&self, parts: &http::request::Parts) -> String {
        let key = match &self.key {
            Key::Client => None,
            Key::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| format!("h:{v}")),
            Key::Function(f) => f(parts),
        };
        let key = key.unwrap_or_else(|| {
            let forwarded: Vec<&str> = parts
                .headers
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            let forwarded = (!forwarded.is_empty()).then(|| forwarded.join(","));
            match client_address((self.peer)(parts), forwarded.as_deref(), &self.trusted) {
                Some(ip) => format!("ip:{ip}"),
                None => "ip:unknown".to_string(),
            }
        });
        format!("{}{}", self.prefix, key)
    }

    fn headers(&self, d: &Decision) -> Vec<(String, String)> {
        if d.source == Source::Open {
            return Vec::new();
        }
        let capacity = d.limit.capacity();
        let window_s = (capacity / d.limit.rate_per_s()).ceil().max(1.0);
        let reset_s = d.reset_after_ms.max(0).saturating_add(999) / 1000;
        let name = &self.policy_name;
        let mut out = vec![
            (
                "RateLimit-Policy".to_string(),
                format!("\"{name}\";q={};w={window_s}", capacity.floor()),
            ),
            (
                "RateLimit".to_string(),
                format!("\"{name}\";r={};t={reset_s}", d.remaining),
            ),
        ];
        for (field, value) in d.headers() {
            if field == "Retry-After" || self.legacy_headers {
                out.push((field.to_string(), value));
            }
        }
        out
    }
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

fn add_headers<B>(response: &mut Response<B>, fields: &[(String, String)]) {
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
            let (parts, body) = request.into_parts();
            if config.skip.as_ref().is_some_and(|skip| skip(&parts)) {
                return inner.call(Request::from_parts(parts, body)).await;
            }
            let key = config.key_for(&parts);
            let cost = (config.cost)(&parts);
            let decision = match config.limiter.acquire(&key, &config.limit, cost).await {
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
            let fields = config.headers(&decision);
            if !decision.allowed {
                let mut response = match &config.on_limited {
                    Some(respond) => respond(&decision, &fields).map(ResB::from),
                    None => plain(
                        StatusCode::TOO_MANY_REQUESTS,
                        PROBLEM_TYPE,
                        problem(&decision),
                    ),
                };
                add_headers(&mut response, &fields);
                return Ok(response);
            }
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            add_headers(&mut response, &fields);
            Ok(response)
        })
    }
}
