//! Envoy Gateway's usage limits behind a real Envoy 1.40: a `BackendTrafficPolicy` rule with
//! a request cost (`from: Number, number: 0`) and a response cost becomes two route
//! `rate_limits` with the same actions (a generic key naming the rule, then the client's
//! header), the first with `hits_addend: {number: 0}`, the second with
//! `apply_on_stream_done: true` and the response's cost as `hits_addend.format`, in the
//! ratelimit filter's per-route config; and a rule
//! without a cost becomes one entry, each request costing 1. The limit itself is plain (no
//! `quota_mode`, which Envoy Gateway never writes), from a file or pushed over xDS.
//!
//! The debts are hundreds of tokens, so the refill of 1,000 a minute (one token each 60 ms)
//! cannot repay them within a test.
//!
//! What holds under the default `POST_PAID_CHARGES=auto`: a stream-done charge larger than
//! what is left is applied (the bucket goes into debt) and the next request is refused;
//! a request-time denial at cost 1 takes nothing.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::pin::Pin;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use serde_json::json;
use support::{Envoy, Service};
use tokio_stream::wrappers::ReceiverStream;

const DOMAIN: &str = "default/eg/http";
/// Envoy Gateway's generic key for a rule: the route, rule and match it came from.
const TOKENS_RULE: &str = "httproute/default/llm/rule/0/match/0/*";
const REQUESTS_RULE: &str = "httproute/default/llm/rule/1/match/0/*";
/// The descriptor key Envoy Gateway gives the client selector's header.
const TOKENS_HEADER_KEY: &str = "rule-0-match-0";
const REQUESTS_HEADER_KEY: &str = "rule-1-match-0";
const FAILURES_RULE: &str = "httproute/default/llm/rule/2/match/0/*";
const FAILURES_HEADER_KEY: &str = "rule-2-match-0";

/// The rate-limit config Envoy Gateway writes for the three rules: 1,000 tokens a minute per
/// `x-user-id`, 2 requests a minute per `x-user-id`, and 3 answers a minute per `x-user-id`
/// charged after the answer (request cost 0, response cost 1: say, failed logins).
fn file_config() -> String {
    format!(
        "domain: {DOMAIN}
descriptors:
  - key: \"{TOKENS_RULE}\"
    value: \"{TOKENS_RULE}\"
    descriptors:
      - key: {TOKENS_HEADER_KEY}
        rate_limit: {{unit: minute, requests_per_unit: 1000}}
  - key: \"{REQUESTS_RULE}\"
    value: \"{REQUESTS_RULE}\"
    descriptors:
      - key: {REQUESTS_HEADER_KEY}
        rate_limit: {{unit: minute, requests_per_unit: 2}}
  - key: \"{FAILURES_RULE}\"
    value: \"{FAILURES_RULE}\"
    descriptors:
      - key: {FAILURES_HEADER_KEY}
        rate_limit: {{unit: minute, requests_per_unit: 3}}
"
    )
}

/// The same config as Envoy Gateway pushes it over xDS.
fn xds_config() -> RateLimitConfig {
    let rule = |rule: &str, header_key: &str, requests_per_unit: u32| RateLimitDescriptor {
        key: rule.into(),
        value: rule.into(),
        descriptors: vec![RateLimitDescriptor {
            key: header_key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
        ..RateLimitDescriptor::default()
    };
    RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![
            rule(TOKENS_RULE, TOKENS_HEADER_KEY, 1000),
            rule(REQUESTS_RULE, REQUESTS_HEADER_KEY, 2),
            rule(FAILURES_RULE, FAILURES_HEADER_KEY, 3),
        ],
    }
}

/// The route actions Envoy Gateway generates for a rule: its generic key, then the header.
fn actions(rule: &str, header_key: &str) -> String {
    format!(
        "[{{generic_key: {{descriptor_key: \"{rule}\", descriptor_value: \"{rule}\"}}}}, {{request_headers: {{header_name: x-user-id, descriptor_key: {header_key}}}}}]"
    )
}

/// /v1/chat: the token rule in the filter's per-route config (where Envoy Gateway puts a
/// rule with a cost, since only there does Envoy send a descriptor's `hits_addend`),
/// checked with 0 hits, charged the answer's cost on stream done
/// (here the client's `x-tokens`, where Envoy Gateway reads the AI gateway's metadata);
/// /v1/models: the request rule, 1 per request;
/// /v1/login: checked with 0 hits, charged 1 on stream done.
fn routes() -> String {
    let tokens = actions(TOKENS_RULE, TOKENS_HEADER_KEY);
    let requests = actions(REQUESTS_RULE, REQUESTS_HEADER_KEY);
    let failures = actions(FAILURES_RULE, FAILURES_HEADER_KEY);
    format!(
        "              - match: {{prefix: \"/v1/chat\"}}
                route: {{cluster: upstream}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: {tokens}
                      hits_addend: {{number: 0}}
                    - actions: {tokens}
                      apply_on_stream_done: true
                      hits_addend: {{format: \"%REQ(x-tokens)%\"}}
              - match: {{prefix: \"/v1/login\"}}
                route: {{cluster: upstream}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: {failures}
                      hits_addend: {{number: 0}}
                    - actions: {failures}
                      apply_on_stream_done: true
                      hits_addend: {{number: 1}}
              - match: {{prefix: \"/v1/models\"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: {requests}"
    )
}

fn envoy_for(service: &Service) -> Envoy {
    let config = include_str!("envoy-template.yaml")
        .replace("@ROUTES@", &routes())
        .replace("domain: edge", &format!("domain: {DOMAIN}"))
        .replace("{upstream}", &support::upstream().to_string())
        .replace("{grpc}", &service.grpc_port.to_string());
    Envoy::start(&config)
}

/// Every hit the service counted, all descriptors together.
fn total_hits(service: &Service) -> u64 {
    service
        .metrics()
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The hits the service counted on the descriptors of `rule`.
fn rule_hits(service: &Service, rule: &str) -> u64 {
    service
        .metrics()
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{") && l.contains(rule))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits until the service has counted `hits` in all (a stream-done charge is sent after
/// the answer).
fn wait_hits(service: &Service, hits: u64) {
    let started = Instant::now();
    while total_hits(service) < hits {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never {hits} hits: {}\n{}",
            service.metrics(),
            service.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A 0-hit check of the request rule for `user`, straight to the service: 200 unless the
/// bucket is in debt.
fn check_requests(service: &Service, user: &str) -> u16 {
    let body = json!({"domain": DOMAIN, "descriptors": [{
        "entries": [
            {"key": REQUESTS_RULE, "value": REQUESTS_RULE},
            {"key": REQUESTS_HEADER_KEY, "value": user}
        ],
        "hitsAddend": "0"
    }]});
    service.json(&body.to_string()).status
}

/// The scenario, on a service already holding Envoy Gateway's config.
fn charges_past_what_is_left_apply(service: &Service) {
    let envoy = envoy_for(service);
    let chat = |user: &str, tokens: &str| {
        envoy
            .get("/v1/chat", &[("x-user-id", user), ("x-tokens", tokens)])
            .status
    };
    // An answer of 1,500 tokens on 1,000 a minute: the check passes (nothing is known
    // yet), and the charge on stream done applies in full, 500 in debt (30 s to repay).
    assert_eq!(chat("alice", "1500"), 200, "{}", service.log());
    wait_hits(service, 1500);
    // In debt: refused (Envoy charges a refused request's stream-done cost too).
    assert_eq!(chat("alice", "5"), 429, "{}", service.log());
    assert_eq!(chat("alice", "5"), 429, "{}", service.log());
    // Another user has their own bucket.
    assert_eq!(chat("bob", "999"), 200, "{}", service.log());

    // The request rule: 2 a minute, then denials at request time that take nothing, so a
    // 0-hit check finds the bucket at 0, not in debt.
    let models = |user: &str| envoy.get("/v1/models", &[("x-user-id", user)]).status;
    let got: Vec<u16> = (0..5).map(|_| models("carol")).collect();
    assert_eq!(got, [200, 200, 429, 429, 429], "{}", service.log());
    assert_eq!(check_requests(service, "carol"), 200, "{}", service.log());

    // Charged 1 after each answer, 3 a minute: three answers empty the bucket, and the
    // fourth check (0 hits) still passes, as the peer's does at its limit. Its charge of 1
    // applies past what is left, so the fifth is refused: a charge of 1 taken all or
    // nothing would be refused on the empty bucket and lost, and every check would pass.
    let failures_rule = "rule/2/match/0";
    let mut got = Vec::new();
    for n in 1..=5u64 {
        got.push(envoy.get("/v1/login", &[("x-user-id", "dave")]).status);
        let started = Instant::now();
        while got.last() == Some(&200) && rule_hits(service, failures_rule) < n {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{}",
                service.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(got, [200, 200, 200, 200, 429], "{}", service.log());
}

#[test]
fn envoy_gateway_usage_limits_from_files_take_every_charge() {
    let redis = common::Server::start();
    let service = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("eg.yaml", &file_config())],
        &[("RL_TIMEOUT_MS", "10000")],
    );
    charges_past_what_is_left_apply(&service);
}

#[test]
fn post_paid_charges_never_keeps_the_all_or_nothing_take() {
    // The old rule, kept behind POST_PAID_CHARGES=never: the charge of 1,001 on 1,000 is
    // refused, takes nothing, and the next request passes.
    let redis = common::Server::start();
    let service = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("eg.yaml", &file_config())],
        &[("RL_TIMEOUT_MS", "10000"), ("POST_PAID_CHARGES", "never")],
    );
    let envoy = envoy_for(&service);
    let chat = |tokens: &str| {
        envoy
            .get("/v1/chat", &[("x-user-id", "alice"), ("x-tokens", tokens)])
            .status
    };
    assert_eq!(chat("1001"), 200);
    wait_hits(&service, 1001);
    assert_eq!(chat("1"), 200, "{}", service.log());
}

#[test]
fn always_post_paid_charges_the_request_time_denials_too() {
    // POST_PAID_CHARGES=always: every plain limit is post-paid, so a denial at cost 1
    // applies too (the Go service's counter), and the 0-hit check finds the bucket in debt.
    let redis = common::Server::start();
    let service = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("eg.yaml", &file_config())],
        &[("RL_TIMEOUT_MS", "10000"), ("POST_PAID_CHARGES", "always")],
    );
    let envoy = envoy_for(&service);
    let got: Vec<u16> = (0..3)
        .map(|_| envoy.get("/v1/models", &[("x-user-id", "carol")]).status)
        .collect();
    assert_eq!(got, [200, 200, 429], "{}", service.log());
    assert_eq!(check_requests(&service, "carol"), 429, "{}", service.log());
}

// -- over xDS: a management server pushing Envoy Gateway's config once.

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

struct Plane {
    push: DiscoveryResponse,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Plane {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let push = self.push.clone();
        tokio::spawn(async move {
            if tx.send(Ok(push)).await.is_err() {
                return;
            }
            // Keep the stream open, reading the ACKs, until the service goes.
            while let Ok(Some(_)) = incoming.message().await {}
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaResponses>, tonic::Status> {
        Err(tonic::Status::unimplemented("SotW only"))
    }
}

#[test]
fn envoy_gateway_usage_limits_over_xds_take_every_charge() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let type_url = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";
    let plane = Plane {
        push: DiscoveryResponse {
            version_info: "1".into(),
            resources: vec![Any {
                type_url: type_url.into(),
                value: xds_config().encode_to_vec(),
            }],
            type_url: type_url.into(),
            nonce: "n1".into(),
            ..DiscoveryResponse::default()
        },
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
        .expect("bind the control plane");
    let port = listener.local_addr().expect("addr").port();
    rt.spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(plane))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    let redis = common::Server::start();
    let url = format!("127.0.0.1:{port}");
    let service = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[],
        &[
            ("RL_TIMEOUT_MS", "10000"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &url),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-gateway"),
        ],
    );
    charges_past_what_is_left_apply(&service);
}
