//! The gRPC face of the service: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! decoding the request leniently so that no bytes a client sends can turn a call into an
//! error (which Envoy's default `failure_mode_deny: false` lets through).
//!
//! Why not envoy-types' generated server: its prost decoder refuses a string field that is
//! not UTF-8, and Envoy sends a header's bytes as they came (HTTP allows bytes 0x80 to 0xFF in
//! a header value), so such a request was an INTERNAL error and passed unlimited. Here the
//! request is decoded with bytes for every string, and a byte that is not part of UTF-8 is
//! kept as the private-use character U+10FF00 + byte: distinct bytes stay distinct, and the
//! value is limited like any other.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::codegen::{http, Body, BoxFuture, StdError};

use crate::decision::service::{Failure, Service};

/// The largest request decoded, in bytes: Envoy's headers may be up to 8 MiB
/// (`max_request_headers_kb`), and a descriptor may repeat a header; the default 4 MiB would
/// answer a bigger call with an error.
const MAX_REQUEST_BYTES: usize = 64 << 20;

/// `RateLimitRequest` with bytes for its strings (same field numbers).
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
    #[prost(uint32, tag = "3")]
    hits_addend: u32,
}

/// `RateLimitDescriptor` with bytes for its entries' strings.
#[derive(Clone, PartialEq, prost::Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
    #[prost(message, optional, tag = "2")]
    limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    is_negative_hits: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// The first private-use code point of the ones a byte outside UTF-8 is kept as.
const RAW_BYTE_BASE: u32 = 0x10_FF00;

/// `bytes` as text: UTF-8 runs as they are, each other byte as U+10FF00 + byte.
pub fn lenient_text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for &b in chunk.invalid() {
            out.push(char::from_u32(RAW_BYTE_BASE + u32::from(b)).unwrap_or('\u{FFFD}'));
        }
    }
    out
}

impl From<RawRequest> for RateLimitRequest {
    fn from(raw: RawRequest) -> Self {
        RateLimitRequest {
            domain: lenient_text(&raw.domain),
            descriptors: raw
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: lenient_text(&e.key),
                            value: lenient_text(&e.value),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: raw.hits_addend,
        }
    }
}

/// The gRPC server of `service`.
#[derive(Clone)]
pub struct Server(pub Arc<Service>);

impl tonic::server::NamedService for Server {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// One call: the lenient request to [`Service::should_rate_limit`].
struct Unary(Arc<Service>);

impl tonic::server::UnaryService<RawRequest> for Unary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RawRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let request = RateLimitRequest::from(request.into_inner());
            match service.should_rate_limit(&request, "ShouldRateLimit").await {
                Ok(response) => Ok(tonic::Response::new(response)),
                Err(Failure::Invalid(text)) => Err(tonic::Status::invalid_argument(text)),
                Err(Failure::Unavailable(text)) => Err(tonic::Status::unavailable(text)),
                Err(Failure::Internal(text)) => Err(tonic::Status::internal(text)),
            }
        })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for Server
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
            return Box::pin(async move {
                Ok(tonic::Status::unimplemented("unknown method").into_http())
            });
        }
        let service = self.0.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<RateLimitResponse, RawRequest>::default();
            let mut grpc = tonic::server::Grpc::new(codec)
                .apply_max_message_size_config(Some(MAX_REQUEST_BYTES), None);
            Ok(grpc.unary(Unary(service), request).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_outside_utf8_stay_distinct_and_utf8_stays_itself() {
        assert_eq!(lenient_text("é漢🙂".as_bytes()), "é漢🙂");
        let a = lenient_text(b"user-\xff");
        let b = lenient_text(b"user-\xfe");
        assert_ne!(a, b);
        assert!(a.starts_with("user-"));
        // A truncated sequence is its bytes, each kept.
        assert_eq!(lenient_text(b"\xe6\xbc").chars().count(), 2);
    }
}
