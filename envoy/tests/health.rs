//! Health and the gRPC transport, against real processes: the
//! service, a real `redis-server` (killed and restarted), Envoy 1.40 as the gRPC client.
//!
//! - `grpc.health.v1` Check and Watch through tonic's client follow Redis (killed:
//!   NOT_SERVING, restarted: SERVING), and so does `/healthcheck` (500 / 200);
//! - SIGTERM: health flips to NOT_SERVING while a call in flight finishes;
//! - `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: not serving until a config with a domain loads;
//! - `GRPC_UDS` with Envoy's cluster on `pipe:`, and Envoy's `grpc_health_check` on it; a
//!   stale socket there is replaced, another file refused;
//! - gRPC server TLS and mTLS (with `GRPC_CLIENT_TLS_SAN`), Envoy presenting certificates
//!   generated here with `openssl`;
//! - `GRPC_MAX_CONNECTION_AGE` + `_GRACE`: a connection is closed after the age and grace.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use support::{http, openssl, upstream, Envoy, Service};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const LIMITS: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
";

const ROUTES: &str = r#"              - match: {prefix: "/"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]"#;

/// The template's address of the service, which the tests below replace.
const GRPC_ADDRESS: &str = "{socket_address: {address: 127.0.0.1, port_value: {grpc}}}";

fn redis_url(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

async fn channel(port: u16) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn check(client: &mut HealthClient<tonic::transport::Channel>, name: &str) -> ServingStatus {
    let reply = client
        .check(HealthCheckRequest {
            service: name.into(),
        })
        .await
        .unwrap_or_else(|s| panic!("Check({name:?}): {s:?}"));
    ServingStatus::try_from(reply.into_inner().status).unwrap()
}

/// The next status a `Watch` stream sends, within `within`.
async fn next_status(
    stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
    within: Duration,
) -> ServingStatus {
    let message = tokio::time::timeout(within, stream.message())
        .await
        .expect("a status in time")
        .expect("the stream stays up")
        .expect("a message");
    ServingStatus::try_from(message.status).unwrap()
}

fn healthcheck(svc: &Service) -> u16 {
    http(svc.http_port, "GET", "/healthcheck", &[], "").map_or(0, |r| r.status)
}

fn wait_for(what: &str, within: Duration, done: impl FnMut() -> bool) {
    wait_for_or(what, within, done, String::new);
}

fn wait_for_or(
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> bool,
    state: impl Fn() -> String,
) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?}: {}",
            state()
        );
        sleep(Duration::from_millis(50));
    }
}

fn request(user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

#[test]
fn grpc_health_and_healthcheck_follow_redis() {
    let mut redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("l.yaml", LIMITS)], &[]);
    runtime().block_on(async {
        let mut client = HealthClient::new(channel(svc.grpc_port).await);
        for name in [
            "",
            "ratelimit",
            "envoy.service.ratelimit.v3.RateLimitService",
        ] {
            assert_eq!(
                check(&mut client, name).await,
                ServingStatus::Serving,
                "{name:?}"
            );
        }
        let unknown = client
            .check(HealthCheckRequest {
                service: "nope".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
        let mut watch = client
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            next_status(&mut watch, Duration::from_secs(2)).await,
            ServingStatus::Serving
        );
        assert_eq!(healthcheck(&svc), 200);

        redis.kill();
        assert_eq!(
            next_status(&mut watch, Duration::from_secs(10)).await,
            ServingStatus::NotServing
        );
        assert_eq!(
            check(&mut client, "ratelimit").await,
            ServingStatus::NotServing
        );
        assert_eq!(healthcheck(&svc), 500);

        redis.restart();
        assert_eq!(
            next_status(&mut watch, Duration::from_secs(10)).await,
            ServingStatus::Serving
        );
        assert_eq!(check(&mut client, "").await, ServingStatus::Serving);
        assert_eq!(healthcheck(&svc), 200);
    });
}

#[test]
fn sigterm_flips_health_while_a_call_in_flight_finishes() {
    let redis = common::Server::start();
    let mut svc = Service::start(
        &redis_url(redis.port),
        &[("l.yaml", LIMITS)],
        &[("RL_DRAIN_DELAY_MS", "3000"), ("RL_TIMEOUT_MS", "6000")],
    );
    let rt = runtime();
    rt.block_on(async {
        let ch = channel(svc.grpc_port).await;
        let mut limiter = RateLimitServiceClient::new(ch.clone());
        let mut health = HealthClient::new(ch);
        // A first call finds the module, so the one in flight below is only the write.
        let first = limiter.should_rate_limit(request("a")).await.unwrap();
        assert_eq!(first.into_inner().overall_code, Code::Ok as i32);
        let mut watch = health
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            next_status(&mut watch, Duration::from_secs(2)).await,
            ServingStatus::Serving
        );
        // Writes wait 2.5 s in Redis (PING, the health probe, does not): a call in flight.
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg("2500")
            .arg("WRITE")
            .query(&mut redis.conn())
            .unwrap();
        let started = Instant::now();
        let in_flight = tokio::spawn(async move { limiter.should_rate_limit(request("b")).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!in_flight.is_finished());
        svc.signal("TERM");
        assert_eq!(
            next_status(&mut watch, Duration::from_secs(2)).await,
            ServingStatus::NotServing
        );
        assert!(
            !in_flight.is_finished(),
            "health flipped before the call finished"
        );
        drop(watch);
        let port = svc.http_port;
        let status = tokio::task::spawn_blocking(move || {
            http(port, "GET", "/healthcheck", &[], "").map_or(0, |r| r.status)
        })
        .await
        .unwrap();
        assert_eq!(status, 500, "/healthcheck while draining");
        let answer = in_flight
            .await
            .unwrap()
            .expect("the call in flight is answered");
        assert_eq!(answer.into_inner().overall_code, Code::Ok as i32);
        assert!(started.elapsed() >= Duration::from_millis(2000));
    });
    let status = svc.wait_exit().expect("exits");
    assert!(status.success(), "{status:?}: {}", svc.log());
}

#[test]
fn healthy_with_at_least_one_config_loaded_waits_for_a_domain() {
    let redis = common::Server::start();
    let root = tempfile::tempdir().unwrap();
    let dir = Service::config_dir(root.path());
    std::fs::create_dir_all(&dir).unwrap();
    let svc = Service::try_start_until(
        root,
        &redis_url(redis.port),
        &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")],
        |r| r.status == 500,
    )
    .unwrap();
    // Redis answers (a second of probes), yet no config has a domain.
    sleep(Duration::from_millis(1500));
    assert_eq!(healthcheck(&svc), 500, "{}", svc.log());
    runtime().block_on(async {
        let mut client = HealthClient::new(channel(svc.grpc_port).await);
        assert_eq!(check(&mut client, "").await, ServingStatus::NotServing);
    });
    std::fs::write(dir.join("l.yaml"), LIMITS).unwrap();
    wait_for(
        "serving once a domain loads",
        Duration::from_secs(10),
        || healthcheck(&svc) == 200,
    );
    // The Go service fails the check again when a reload leaves no domain.
    std::fs::remove_file(dir.join("l.yaml")).unwrap();
    wait_for(
        "not serving with no domain",
        Duration::from_secs(10),
        || healthcheck(&svc) == 500,
    );
}

#[test]
fn without_the_flag_an_empty_config_is_healthy() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[], &[]);
    assert_eq!(healthcheck(&svc), 200);
}

/// Envoy in front of `svc` with `cluster` (YAML for the service's address and any TLS)
/// replacing the template's plain address.
fn envoy_with(address: &str, extra_cluster_yaml: &str) -> Envoy {
    let config = include_str!("envoy-template.yaml")
        .replace("@ROUTES@", ROUTES)
        .replace("{upstream}", &upstream().to_string())
        .replace(GRPC_ADDRESS, address)
        .replace(
            "  - name: ratelimit\n",
            &format!("  - name: ratelimit\n{extra_cluster_yaml}"),
        );
    Envoy::start(&config)
}

/// Three calls pass and the fourth is limited (3 per hour), through Envoy.
fn limited_through(envoy: &Envoy, user: &str) {
    let statuses: Vec<u16> = (0..4)
        .map(|_| envoy.get("/", &[("x-user", user)]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429], "{}", envoy.log());
}

/// Envoy's view of the `ratelimit` cluster's host from its admin `/clusters`.
fn host_health(envoy: &Envoy) -> String {
    http(envoy.admin_port, "GET", "/clusters", &[], "")
        .map(|r| r.body)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("ratelimit::") && l.contains("::health_flags::"))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn grpc_on_a_unix_socket_behind_envoy_with_its_grpc_health_check() {
    let mut redis = common::Server::start();
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("ratelimit.sock");
    let svc = Service::start(
        &redis_url(redis.port),
        &[("l.yaml", LIMITS)],
        &[("GRPC_UDS", socket.to_str().unwrap())],
    );
    assert!(socket.exists(), "{}", svc.log());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", svc.grpc_port)).is_err(),
        "GRPC_UDS replaces the TCP listener"
    );
    let health_check = "    health_checks:\n    - {timeout: 1s, interval: 0.3s, no_traffic_interval: 0.3s, unhealthy_threshold: 1, healthy_threshold: 1, grpc_health_check: {}}\n";
    let envoy = envoy_with(
        &format!("{{pipe: {{path: {:?}}}}}", socket.to_str().unwrap()),
        health_check,
    );
    limited_through(&envoy, "uds");
    wait_for(
        "Envoy's health check passes",
        Duration::from_secs(10),
        || host_health(&envoy).ends_with("::healthy"),
    );
    redis.kill();
    wait_for_or(
        "Envoy sees NOT_SERVING",
        Duration::from_secs(15),
        || host_health(&envoy).contains("failed_active_hc"),
        || format!("{}\n{}\n{}", host_health(&envoy), svc.log(), envoy.log()),
    );
    redis.restart();
    wait_for("Envoy sees SERVING again", Duration::from_secs(15), || {
        host_health(&envoy).ends_with("::healthy")
    });
}

/// A CA and leaf certificates it signed, `<name>.pem`/`<name>.key`, each with one DNS SAN.
fn certificates(dir: &Path, leaves: &[(&str, &str, &str)]) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=redis-rl test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    for (name, san, usage) in leaves {
        let ext = format!("{name}.ext");
        std::fs::write(
            dir.join(&ext),
            format!(
                "subjectAltName=DNS:{san}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
            ),
        )
        .unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={san}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
}

/// The cluster's `transport_socket`: TLS to `ratelimit.test`, trusting the test CA, with
/// the client certificate `client` if any.
fn tls_socket(dir: &Path, client: Option<&str>) -> String {
    let file = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let certificates = client.map_or(String::new(), |c| {
        format!(
            "\n          tls_certificates: [{{certificate_chain: {{filename: {:?}}}, private_key: {{filename: {:?}}}}}]",
            file(&format!("{c}.pem")),
            file(&format!("{c}.key"))
        )
    });
    format!(
        "    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: ratelimit.test
        common_tls_context:
          alpn_protocols: [h2]
          validation_context:
            trusted_ca: {{filename: {:?}}}
            match_typed_subject_alt_names: [{{san_type: DNS, matcher: {{exact: ratelimit.test}}}}]{certificates}
",
        file("ca.pem")
    )
}

#[test]
fn grpc_server_tls_and_mtls_with_envoy_as_the_client() {
    let redis = common::Server::start();
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    certificates(
        dir,
        &[
            ("server", "ratelimit.test", "serverAuth"),
            ("client", "envoy.client", "clientAuth"),
            ("other", "other.client", "clientAuth"),
        ],
    );
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let address = GRPC_ADDRESS.to_string();
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true".to_string()),
        ("GRPC_SERVER_TLS_CERT", path("server.pem")),
        ("GRPC_SERVER_TLS_KEY", path("server.key")),
    ];
    let env = |extra: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
        tls.iter().cloned().chain(extra.iter().cloned()).collect()
    };
    let start = |env: &[(&'static str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Service::start(&redis_url(redis.port), &[("l.yaml", LIMITS)], &env)
    };
    let envoy_for = |svc: &Service, client: Option<&str>| {
        envoy_with(
            &address.replace("{grpc}", &svc.grpc_port.to_string()),
            &tls_socket(dir, client),
        )
    };

    // TLS: Envoy verifies the server's certificate and calls over it.
    let svc = start(&env(&[]));
    limited_through(&envoy_for(&svc, None), "tls");
    drop(svc);

    // mTLS: a client certificate the CA signed, naming GRPC_CLIENT_TLS_SAN, is required.
    let svc = start(&env(&[
        ("GRPC_CLIENT_TLS_CACERT", path("ca.pem")),
        ("GRPC_CLIENT_TLS_SAN", "envoy.client".to_string()),
    ]));
    limited_through(&envoy_for(&svc, Some("client")), "mtls");
    // Without a certificate, or with one naming another client, every call fails (and
    // `failure_mode_deny` turns that into a 500).
    for client in [None, Some("other")] {
        let envoy = envoy_for(&svc, client);
        let status = envoy.get("/", &[("x-user", "refused")]).status;
        assert_eq!(status, 500, "{client:?}: {}", envoy.log());
    }
}

#[test]
fn a_connection_is_closed_after_max_connection_age_and_grace() {
    let redis = common::Server::start();
    let svc = Service::start(
        &redis_url(redis.port),
        &[("l.yaml", LIMITS)],
        &[
            ("GRPC_MAX_CONNECTION_AGE", "1s"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "1s"),
        ],
    );
    runtime().block_on(async {
        let mut client = HealthClient::new(channel(svc.grpc_port).await);
        let started = Instant::now();
        // A Watch never ends on its own: after the age the server sends GOAWAY and lets it
        // run for the grace, then closes the connection under it.
        let mut watch = client
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            next_status(&mut watch, Duration::from_secs(2)).await,
            ServingStatus::Serving
        );
        let ended = tokio::time::timeout(Duration::from_secs(8), async {
            loop {
                match watch.message().await {
                    Ok(Some(_)) => continue,
                    _ => return,
                }
            }
        })
        .await;
        let lived = started.elapsed();
        assert!(
            ended.is_ok(),
            "the connection outlived age + grace: {lived:?}"
        );
        assert!(
            lived >= Duration::from_millis(1800),
            "closed before the age and grace: {lived:?}"
        );
    });
}

#[test]
fn grpc_uds_replaces_a_stale_socket_and_refuses_another_file() {
    let redis = common::Server::start();
    let dir = tempfile::tempdir().unwrap();
    // A socket file an earlier run left behind (its listener gone): replaced.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let svc = Service::start(
        &redis_url(redis.port),
        &[("l.yaml", LIMITS)],
        &[("GRPC_UDS", stale.to_str().unwrap())],
    );
    assert!(std::os::unix::net::UnixStream::connect(&stale).is_ok());
    drop(svc);
    // Any other file is not ours to remove.
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    let refused = Service::try_start(
        &redis_url(redis.port),
        &[("l.yaml", LIMITS)],
        &[("GRPC_UDS", file.to_str().unwrap())],
    )
    .err()
    .expect("refused");
    assert!(refused.contains("is not a socket"), "{refused}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}
