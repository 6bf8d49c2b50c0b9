//! Health and the gRPC transport, on the settings of `config/settings/health.rs`: the two
//! health faces on [`Readiness`] (`GET /healthcheck`: 200 `OK` or 500, as the Go service;
//! `grpc.health.v1.Health/Check` and `Watch`), the Redis probe that feeds it, and the gRPC
//! server's builder (TLS, mTLS, connection age) and listener (TCP or a Unix socket).

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tonic_health::ServingStatus;

use crate::config::settings::health::HealthSettings;
use crate::config::settings::Settings;
use crate::transport::readiness::Readiness;

/// How often Redis is probed while it answers, and while it does not.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The names `grpc.health.v1` answers for: the server as a whole (`""`, what Kubernetes'
/// probe and Envoy's `grpc_health_check` ask by default), the Go service's name, and the
/// rate-limit service's full name. All three follow [`Readiness`].
pub const SERVICE_NAMES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// `GET /healthcheck`: `OK` with 200 while serving, else an empty 500 (the Go service's
/// answers).
pub fn http_router(readiness: Arc<Readiness>) -> Router {
    Router::new().route(
        "/healthcheck",
        get(move || {
            let serving = readiness.serving();
            async move {
                if serving {
                    (StatusCode::OK, "OK").into_response()
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR.into_response()
                }
            }
        }),
    )
}

fn status(serving: bool) -> ServingStatus {
    if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// The `grpc.health.v1.Health` service, following `readiness` for every name in
/// [`SERVICE_NAMES`] from the start (a `Watch` sees each change).
pub async fn grpc_service(
    readiness: Arc<Readiness>,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, server) = tonic_health::server::health_reporter();
    let mut changes = readiness.subscribe();
    let now = readiness.serving();
    for name in SERVICE_NAMES {
        reporter.set_service_status(name, status(now)).await;
    }
    tokio::spawn(async move {
        loop {
            let serving = readiness.serving();
            for name in SERVICE_NAMES {
                reporter.set_service_status(name, status(serving)).await;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
    server
}

/// One PING within `deadline` on `connection`, (re)connecting first when there is none.
/// Probes Redis each [`PROBE_INTERVAL`] on a connection of its own and tells `readiness`.
///
/// Why a probe and not the Go service's count of open pool connections
/// (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`): the pool here is a few multiplexed connections
/// that reconnect on their own, so "none open" is rarely seen; a PING answered within the
/// call deadline is what "Redis reachable" means for a call.
pub fn spawn_redis_probe(settings: &Settings, readiness: Arc<Readiness>) {
    let settings = settings.clone();
    let deadline = Duration::from_millis(settings.timeout_ms.clamp(100, 5_000));
    tokio::spawn(async move {
        let mut was: Option<bool> = None;
        // Its own connection, made as the limiter's are (TLS, auth, Sentinel, cluster), so a
        // probe never queues behind calls; dropped after a failure and made again.
        let mut link: Option<crate::redis::setup::Opened> = None;
        loop {
            let attempt = async {
                if link.is_none() {
                    link = crate::redis::setup::open(&settings, 1).await.ok();
                }
                match link.as_mut() {
                    Some(l) => l.ping().await,
                    None => false,
                }
            };
            let ok = tokio::time::timeout(deadline, attempt)
                .await
                .unwrap_or(false);
            if !ok {
                link = None;
            }
            if was != Some(ok) {
                if ok {
                    tracing::warn!("health: Redis answers; serving");
                } else {
                    tracing::error!("health: Redis does not answer a PING; not serving");
                }
                was = Some(ok);
            }
            readiness.set_redis_ok(ok);
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    });
}

/// The gRPC server builder with TLS (and mTLS) and the connection age of `settings`.
///
/// # Errors
/// A TLS file that cannot be read or used, naming its variable.
pub fn grpc_builder(settings: &HealthSettings) -> Result<tonic::transport::Server, String> {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let mut builder = tonic::transport::Server::builder();
    if settings.max_connection_age_ms > 0 {
        builder = builder
            .max_connection_age(Duration::from_millis(settings.max_connection_age_ms))
            .max_connection_age_grace(Duration::from_millis(settings.max_connection_age_grace_ms));
    }
    if let Some(tls) = &settings.tls {
        let read = |name: &str, path: &str| {
            std::fs::read(path).map_err(|e| format!("{name} {path:?}: {e}"))
        };
        let identity = Identity::from_pem(
            read("GRPC_SERVER_TLS_CERT", &tls.cert)?,
            read("GRPC_SERVER_TLS_KEY", &tls.key)?,
        );
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &tls.client_ca {
            config =
                config.client_ca_root(Certificate::from_pem(read("GRPC_CLIENT_TLS_CACERT", ca)?));
        }
        builder = builder
            .tls_config(config)
            .map_err(|e| format!("GRPC_SERVER_TLS_CERT/KEY: {e}"))?;
    }
    Ok(builder)
}

/// Where gRPC listens: GRPC_HOST:GRPC_PORT, or the Unix socket GRPC_UDS.
pub enum GrpcListener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Binds the gRPC listener. A socket file left at GRPC_UDS by an earlier run is replaced
/// (a fresh bind would fail on it); any other file there is an error.
///
/// # Errors
/// Why it cannot listen.
pub async fn bind_grpc(settings: &Settings) -> Result<GrpcListener, String> {
    match &settings.health.grpc_uds {
        Some(path) => {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if !meta.file_type().is_socket() {
                    return Err(format!("GRPC_UDS {path:?} exists and is not a socket"));
                }
                std::fs::remove_file(path).map_err(|e| format!("GRPC_UDS {path:?}: {e}"))?;
            }
            tokio::net::UnixListener::bind(path)
                .map(GrpcListener::Unix)
                .map_err(|e| e.to_string())
        }
        None => {
            tokio::net::TcpListener::bind(format!("{}:{}", settings.grpc_host, settings.grpc_port))
                .await
                .map(GrpcListener::Tcp)
                .map_err(|e| e.to_string())
        }
    }
}

/// Removes the GRPC_UDS socket at exit, so no client connects to a dead path.
pub fn remove_socket(settings: &HealthSettings) {
    if let Some(path) = &settings.grpc_uds {
        let _ = std::fs::remove_file(path);
    }
}

/// A gRPC service that answers only calls whose TLS client certificate names `san` (a DNS
/// SAN, wildcards as in TLS server names): GRPC_CLIENT_TLS_SAN. The certificate itself was
/// already verified against GRPC_CLIENT_TLS_CACERT in the handshake; a call without one that
/// names `san` gets UNAUTHENTICATED, which a client (Envoy) treats as a failed call.
#[derive(Clone)]
pub struct SanGuard<S> {
    inner: S,
    san: Option<Arc<str>>,
}

impl<S> SanGuard<S> {
    /// `inner` behind the check of `settings`' GRPC_CLIENT_TLS_SAN (no check when unset).
    pub fn new(inner: S, settings: &HealthSettings) -> SanGuard<S> {
        let san = settings
            .tls
            .as_ref()
            .and_then(|t| t.client_san.as_deref())
            .map(Arc::from);
        SanGuard { inner, san }
    }
}

/// Whether the first (leaf) certificate of `certs` is valid for the DNS name `san`.
fn names(certs: &[rustls_pki_types::CertificateDer<'static>], san: &str) -> bool {
    let Ok(name) = rustls_pki_types::ServerName::try_from(san) else {
        return false;
    };
    certs.first().is_some_and(|leaf| {
        webpki::EndEntityCert::try_from(leaf)
            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
    })
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for SanGuard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for SanGuard<S>
where
    S: tonic::codegen::Service<
        tonic::codegen::http::Request<B>,
        Response = tonic::codegen::http::Response<tonic::body::Body>,
        Error = std::convert::Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: tonic::codegen::http::Request<B>) -> Self::Future {
        use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
        if let Some(san) = &self.san {
            let extensions = request.extensions();
            let certs = extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(TlsConnectInfo::peer_certs)
                .or_else(|| {
                    extensions
                        .get::<TlsConnectInfo<UdsConnectInfo>>()
                        .and_then(TlsConnectInfo::peer_certs)
                });
            if !certs.is_some_and(|c| names(&c, san)) {
                let refused = tonic::Status::unauthenticated(format!(
                    "the client certificate does not name GRPC_CLIENT_TLS_SAN {san:?}"
                ))
                .into_http();
                return Box::pin(async move { Ok(refused) });
            }
        }
        Box::pin(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<HealthSettings, String> {
        crate::config::settings::from_pairs(pairs).map(|s| s.health)
    }

    #[test]
    fn defaults_are_the_go_services() {
        let s = with(&[]).unwrap();
        assert!(!s.need_config);
        assert_eq!(s.grpc_uds, None);
        assert_eq!(s.tls, None);
        assert_eq!(s.max_connection_age_ms, 86_400_000);
        assert_eq!(s.max_connection_age_grace_ms, 3_600_000);
        assert_eq!(s.drain_delay_ms, 0);
    }

    #[test]
    fn durations_and_tls_files_are_read() {
        let s = with(&[
            ("GRPC_MAX_CONNECTION_AGE", "1m30s"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "0"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/c.pem"),
            ("GRPC_SERVER_TLS_KEY", "/k.pem"),
            ("GRPC_CLIENT_TLS_CACERT", "/ca.pem"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.client"),
            ("GRPC_UDS", "/run/rl.sock"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ])
        .unwrap();
        assert_eq!(s.max_connection_age_ms, 90_000);
        assert_eq!(s.max_connection_age_grace_ms, 0);
        assert_eq!(s.grpc_uds.as_deref(), Some("/run/rl.sock"));
        assert!(s.need_config);
        let tls = s.tls.unwrap();
        assert_eq!(tls.client_san.as_deref(), Some("envoy.client"));
        // TLS off: its files are not read, nor required.
        assert_eq!(
            with(&[("GRPC_SERVER_TLS_CERT", "/c.pem")]).unwrap().tls,
            None
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (pairs, name) in [
            (
                &[("GRPC_MAX_CONNECTION_AGE", "a day")][..],
                "GRPC_MAX_CONNECTION_AGE must",
            ),
            (
                &[("GRPC_MAX_CONNECTION_AGE_GRACE", "-1s")][..],
                "GRPC_MAX_CONNECTION_AGE_GRACE must",
            ),
            (
                &[("GRPC_SERVER_USE_TLS", "true")][..],
                "GRPC_SERVER_TLS_CERT must",
            ),
            (
                &[
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_SERVER_TLS_CERT", "/c.pem"),
                ][..],
                "GRPC_SERVER_TLS_KEY must",
            ),
            (
                &[
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_SERVER_TLS_CERT", "/c.pem"),
                    ("GRPC_SERVER_TLS_KEY", "/k.pem"),
                    ("GRPC_CLIENT_TLS_SAN", "x"),
                ][..],
                "GRPC_CLIENT_TLS_SAN needs",
            ),
            (
                &[("GRPC_SERVER_USE_TLS", "maybe")][..],
                "GRPC_SERVER_USE_TLS must",
            ),
            (
                &[("RL_DRAIN_DELAY_MS", "soon")][..],
                "RL_DRAIN_DELAY_MS must",
            ),
            (
                &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "2")][..],
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED must",
            ),
        ] {
            let e = with(pairs).unwrap_err();
            assert!(e.starts_with(name), "{pairs:?}: {e}");
        }
    }

    #[test]
    fn a_missing_tls_file_is_an_error_naming_its_variable() {
        let s = with(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/nonexistent/c.pem"),
            ("GRPC_SERVER_TLS_KEY", "/nonexistent/k.pem"),
        ])
        .unwrap();
        let e = grpc_builder(&s).err().unwrap();
        assert!(e.starts_with("GRPC_SERVER_TLS_CERT"), "{e}");
    }
}
