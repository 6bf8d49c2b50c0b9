//! Config over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`) against a real management server: a small
//! tonic ADS server in this process (the role Envoy Gateway's control plane plays) pushes
//! `RateLimitConfig` versions to the real service process, which answers real calls on a
//! real Redis. Covered: the subscription (type URL, node id and metadata, extra headers),
//! ACK of a good push, NACK of a bad one with the last good config kept, a restart of the
//! control plane (reconnect with back-off, config kept meanwhile, the last applied version
//! announced), the wait for a first config before listening,
//! FORCE_START_WITHOUT_INITIAL_CONFIG, and Envoy Gateway's whole variable set: mTLS to the
//! control plane and TLS on the gRPC port for Envoy's calls, one certificate for both
//! (certificates made by the `openssl` command).
//!
//! Time: limits are per minute, so refill cannot change a count within a test; the waits
//! are deadlines, and the back-off is set to 200 ms so a reconnect is quick.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use serde_json::Value;
use support::{one, openssl, Service};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

/// What the control plane saw: every request of every stream, in order, and each stream's
/// `x-token` header.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<(usize, DiscoveryRequest)>>,
    tokens: Mutex<Vec<String>>,
}

/// The ADS server: each stream gets the current push at once and every later one.
struct Plane {
    push: watch::Sender<Option<DiscoveryResponse>>,
    /// Set when the plane stops: its streams end with UNAVAILABLE.
    stopping: watch::Receiver<bool>,
    seen: Arc<Seen>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Plane {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let token = request
            .metadata()
            .get("x-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let stream_no = {
            let mut tokens = self.seen.tokens.lock().unwrap();
            tokens.push(token);
            tokens.len()
        };
        let mut incoming = request.into_inner();
        let seen = self.seen.clone();
        let mut pushes = self.push.subscribe();
        pushes.mark_changed();
        let mut stopping = self.stopping.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    got = incoming.message() => match got {
                        Ok(Some(r)) => seen.requests.lock().unwrap().push((stream_no, r)),
                        _ => return,
                    },
                    changed = pushes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let next = pushes.borrow_and_update().clone();
                        if let Some(r) = next {
                            if tx.send(Ok(r)).await.is_err() {
                                return;
                            }
                        }
                    }
                    _ = stopping.changed() => {
                        let _ = tx.send(Err(tonic::Status::unavailable("control plane restarting"))).await;
                        return;
                    }
                }
            }
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

/// A running control plane on `port`; stopped (connections closed) by [`Running::stop`].
struct Running {
    push: watch::Sender<Option<DiscoveryResponse>>,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(rt: &tokio::runtime::Runtime, port: u16, seen: Arc<Seen>) -> Running {
        Running::start_tls(rt, port, seen, None)
    }

    /// As [`Running::start`], serving TLS with `tls` when given.
    fn start_tls(
        rt: &tokio::runtime::Runtime,
        port: u16,
        seen: Arc<Seen>,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> Running {
        let (push, _) = watch::channel(None);
        let (stop, stopping) = watch::channel(false);
        let plane = Plane {
            push: push.clone(),
            stopping: stopping.clone(),
            seen,
        };
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("bind the control plane's port");
        let mut shutdown = stopping;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("server TLS config");
        }
        let server = rt.spawn(async move {
            let _ = builder
                .add_service(AggregatedDiscoveryServiceServer::new(plane))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async move {
                        let _ = shutdown.wait_for(|s| *s).await;
                    },
                )
                .await;
        });
        Running { push, stop, server }
    }

    fn push(&self, version: &str, nonce: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|c| Any {
                type_url: TYPE_URL.into(),
                value: c.encode_to_vec(),
            })
            .collect();
        self.push.send_replace(Some(DiscoveryResponse {
            version_info: version.into(),
            resources,
            type_url: TYPE_URL.into(),
            nonce: nonce.into(),
            ..DiscoveryResponse::default()
        }));
    }

    fn stop(self, rt: &tokio::runtime::Runtime) {
        let _ = self.stop.send(true);
        let server = self.server;
        let stopped = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .is_ok()
        });
        assert!(stopped, "the control plane did not stop");
    }
}

fn config(domain: &str, key: &str, unit: RateLimitUnit, requests_per_unit: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: format!("{domain}-config"),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

/// The requests_per_unit the service answers for `domain`/`key`; None when no limit applies.
fn limit(svc: &Service, domain: &str, key: &str) -> Option<u64> {
    let reply = svc.json(&one(domain, &[(key, "x")]));
    // 429 once the calls of a test have used the bucket up: the limit is still reported.
    assert!(matches!(reply.status, 200 | 429), "{}", reply.body);
    let body: Value = reply.json();
    body["statuses"][0]["currentLimit"]["requestsPerUnit"].as_u64()
}

/// Waits until a request matching `want` arrives; it, or a panic with the service's log.
fn wait_request(
    seen: &Seen,
    svc: &Service,
    what: &str,
    want: impl Fn(usize, &DiscoveryRequest) -> bool,
) -> (usize, DiscoveryRequest) {
    let started = Instant::now();
    loop {
        if let Some(found) = seen
            .requests
            .lock()
            .unwrap()
            .iter()
            .find(|(n, r)| want(*n, r))
            .cloned()
        {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no {what}: {:?}\n{}",
            seen.requests.lock().unwrap(),
            svc.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

fn xds_env(port: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_SERVER_URL", format!("127.0.0.1:{port}")),
        ("CONFIG_GRPC_XDS_NODE_ID", "test-node".into()),
        (
            "CONFIG_GRPC_XDS_NODE_METADATA",
            "cluster=ratelimit,zone=a".into(),
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "x-token:s3cret".into(),
        ),
        (
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "200ms".into(),
        ),
    ]
}

fn start_service(redis_port: u16, env: &[(&'static str, String)]) -> Service {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Service::start(&format!("127.0.0.1:{redis_port}"), &[], &env)
}

#[test]
fn pushes_are_acked_a_bad_one_is_nacked_and_a_restarted_plane_is_reconnected() {
    let redis = common::Server::start();
    let rt = runtime();
    let port = support::free_port();
    let seen = Arc::new(Seen::default());
    // Before any control plane: the service waits for its first config and does not listen
    // meanwhile (Service::start returns once /healthcheck answers).
    let redis_port = redis.port;
    let starting =
        std::thread::spawn(move || start_service(redis_port, &xds_env(&port.to_string())));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!starting.is_finished(), "ready without a config");
    let plane = Running::start(&rt, port, seen.clone());
    plane.push("1", "n1", &[config("gw", "k", RateLimitUnit::Minute, 3)]);
    let svc = starting.join().expect("the service started");

    // The subscription: the type, the node, its metadata, the extra header.
    let (_, first) = wait_request(&seen, &svc, "first request", |_, _| true);
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!(first.version_info, "");
    let node = first.node.clone().expect("a node");
    assert_eq!(node.id, "test-node");
    let meta = node.metadata.expect("node metadata").fields;
    assert_eq!(
        meta.get("zone").and_then(|v| v.kind.clone()),
        Some(Kind::StringValue("a".into()))
    );
    assert_eq!(seen.tokens.lock().unwrap()[0], "s3cret");

    // v1: applied and ACKed.
    let (_, ack) = wait_request(&seen, &svc, "ACK of v1", |_, r| r.response_nonce == "n1");
    assert_eq!(ack.version_info, "1");
    assert!(ack.error_detail.is_none(), "{ack:?}");
    assert_eq!(limit(&svc, "gw", "k"), Some(3));

    // v2 is bad (no unit): NACKed with the problem, the version stays 1, v1 still answers.
    plane.push("2", "n2", &[config("gw", "k", RateLimitUnit::Unknown, 5)]);
    let (_, nack) = wait_request(&seen, &svc, "NACK of v2", |_, r| r.response_nonce == "n2");
    assert_eq!(nack.version_info, "1");
    let detail = nack.error_detail.expect("a NACK carries error_detail");
    assert!(
        detail.message.contains("gw-config") && detail.message.contains("invalid rate limit unit"),
        "{detail:?}"
    );
    assert_eq!(limit(&svc, "gw", "k"), Some(3));
    assert_eq!(svc.metric("ratelimit_service_config_load_error"), 1);

    // v3: two resources, applied together.
    plane.push(
        "3",
        "n3",
        &[
            config("gw", "k", RateLimitUnit::Minute, 7),
            config("other", "o", RateLimitUnit::Hour, 9),
        ],
    );
    let (_, ack) = wait_request(&seen, &svc, "ACK of v3", |_, r| r.response_nonce == "n3");
    assert_eq!(ack.version_info, "3");
    assert_eq!(limit(&svc, "gw", "k"), Some(7));
    assert_eq!(limit(&svc, "other", "o"), Some(9));

    // The control plane goes away: the service keeps v3 and keeps trying.
    plane.stop(&rt);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(limit(&svc, "gw", "k"), Some(7));
    let log = svc.log();
    assert!(log.contains("reconnecting"), "{log}");

    // Back on the same port with v4: a new stream announces v3, then v4 is ACKed.
    let plane = Running::start(&rt, port, seen.clone());
    plane.push("4", "n4", &[config("gw", "k", RateLimitUnit::Minute, 11)]);
    let (_, hello) = wait_request(&seen, &svc, "a new stream", |n, _| n > 1);
    assert_eq!(hello.version_info, "3");
    assert_eq!(hello.response_nonce, "");
    wait_request(&seen, &svc, "ACK of v4", |_, r| r.response_nonce == "n4");
    assert_eq!(limit(&svc, "gw", "k"), Some(11));
    assert_eq!(limit(&svc, "other", "o"), None);
    assert_eq!(
        seen.tokens.lock().unwrap().last().map(String::as_str),
        Some("s3cret")
    );
    plane.stop(&rt);
}

#[test]
fn force_start_serves_without_a_config_until_the_first_push() {
    let redis = common::Server::start();
    let rt = runtime();
    let port = support::free_port();
    let mut env = xds_env(&port.to_string());
    env.push(("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()));
    // No control plane yet: the service is up anyway, with no domains.
    let svc = start_service(redis.port, &env);
    assert_eq!(limit(&svc, "gw", "k"), None);
    let seen = Arc::new(Seen::default());
    let plane = Running::start(&rt, port, seen.clone());
    plane.push("1", "n1", &[config("gw", "k", RateLimitUnit::Second, 3)]);
    wait_request(&seen, &svc, "ACK of v1", |_, r| r.response_nonce == "n1");
    assert_eq!(limit(&svc, "gw", "k"), Some(3));
    plane.stop(&rt);
}

#[test]
fn a_pushed_config_counts_for_healthy_with_at_least_one_config_loaded() {
    // Before: a config applied over xDS swapped the service's config but never told health,
    // so a service force-started without one stayed not serving for good.
    let redis = common::Server::start();
    let rt = runtime();
    let port = support::free_port();
    let mut env = xds_env(&port.to_string());
    env.push(("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()));
    env.push(("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let root = tempfile::tempdir().expect("temp dir");
    let svc = Service::try_start_until(root, &format!("127.0.0.1:{}", redis.port), &env, |r| {
        r.status == 500
    })
    .expect("up, not serving without a config");
    let seen = Arc::new(Seen::default());
    let plane = Running::start(&rt, port, seen.clone());
    plane.push("1", "n1", &[config("gw", "k", RateLimitUnit::Minute, 3)]);
    wait_request(&seen, &svc, "ACK of v1", |_, r| r.response_nonce == "n1");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = support::http(svc.http_port, "GET", "/healthcheck", &[], "").map(|r| r.status);
        if status == Some(200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {status:?} after the push: {}",
            svc.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    plane.stop(&rt);
}

/// A CA, a server certificate for the name `xds.test` only, and a client certificate.
fn certificates(dir: &std::path::Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ];
    ca.extend(ec);
    openssl(dir, &ca);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:xds.test\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    // Envoy Gateway gives the service one certificate (/certs/tls.crt) for both ends: the
    // client of its xDS and the server of Envoy's calls. So does this one.
    std::fs::write(
        dir.join("client.ext"),
        "subjectAltName=DNS:ratelimit.test\nextendedKeyUsage=clientAuth,serverAuth\n",
    )
    .unwrap();
    for who in ["server", "client"] {
        let (key, csr, crt, ext) = (
            format!("{who}.key"),
            format!("{who}.csr"),
            format!("{who}.crt"),
            format!("{who}.ext"),
        );
        let subject = format!("/CN={who}");
        let mut req = vec!["req", "-subj", &subject, "-keyout", &key, "-out", &csr];
        req.extend(ec);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-days",
                "1",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
        );
    }
}

#[test]
fn mtls_to_the_management_server_as_envoy_gateway_sets_it_up() {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    // The server asks for a client certificate from the CA: mutual TLS.
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read("server.crt"), read("server.key")))
        .client_ca_root(Certificate::from_pem(read("ca.crt")));
    let redis = common::Server::start();
    let rt = runtime();
    let port = support::free_port();
    let seen = Arc::new(Seen::default());
    let plane = Running::start_tls(&rt, port, seen.clone(), Some(tls));
    plane.push("1", "n1", &[config("gw", "k", RateLimitUnit::Minute, 5)]);
    let path = |name: &str| dir.path().join(name).display().to_string();
    let mut env = xds_env(&port.to_string());
    env.extend([
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_string()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path("client.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path("client.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path("ca.crt")),
        // The certificate names xds.test, not 127.0.0.1: verified under the SAN given.
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.test".to_string()),
        // TLS for Envoy's calls, with the same certificate and key as the xDS client, as
        // Envoy Gateway sets it. GRPC_SERVER_TLS_CA_CERT is Envoy Gateway's name; the Go
        // service reads GRPC_CLIENT_TLS_CACERT, so neither service asks for a client
        // certificate on it.
        ("GRPC_SERVER_USE_TLS", "true".to_string()),
        ("GRPC_SERVER_TLS_CERT", path("client.crt")),
        ("GRPC_SERVER_TLS_KEY", path("client.key")),
        ("GRPC_SERVER_TLS_CA_CERT", path("ca.crt")),
        // The rest of what Envoy Gateway's ratelimit Deployment sets: the service must start
        // on it.
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".to_string()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_string()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_string()),
        ("USE_STATSD", "false".to_string()),
        ("LOG_LEVEL", "info".to_string()),
    ]);
    let svc = start_service(redis.port, &env);
    let (_, ack) = wait_request(&seen, &svc, "ACK of v1", |_, r| r.response_nonce == "n1");
    assert_eq!(ack.version_info, "1");
    assert_eq!(ack.node.map(|n| n.id).as_deref(), Some("envoy-ratelimit"));
    assert_eq!(limit(&svc, "gw", "k"), Some(5));
    // Envoy's calls, over TLS to the name in that certificate, verified against the CA: gRPC
    // health serving, and a ShouldRateLimit answered from the pushed config. In cleartext,
    // no call gets through.
    rt.block_on(async {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as Descriptor;
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
        use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
        use tonic::transport::{ClientTlsConfig, Endpoint};
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::HealthCheckRequest;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("ca.crt")))
            .identity(Identity::from_pem(read("client.crt"), read("client.key")))
            .domain_name("ratelimit.test");
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", svc.grpc_port))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap_or_else(|e| panic!("TLS to the gRPC port: {e:?}\n{}", svc.log()));
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(health.into_inner().status, ServingStatus::Serving as i32);
        let request = RateLimitRequest {
            domain: "gw".into(),
            descriptors: vec![Descriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "tls".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let reply = RateLimitServiceClient::new(channel)
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.overall_code, Code::Ok as i32);
        assert_eq!(
            reply.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(5)
        );
        let plain = Endpoint::from_shared(format!("http://127.0.0.1:{}", svc.grpc_port))
            .unwrap()
            .connect()
            .await;
        let cleartext = match plain {
            Err(_) => true,
            Ok(ch) => HealthClient::new(ch)
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .is_err(),
        };
        assert!(cleartext, "a cleartext call was answered on the TLS port");
    });
    plane.stop(&rt);
}
