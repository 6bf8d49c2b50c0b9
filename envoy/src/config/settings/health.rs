//! The health and gRPC transport variables (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`,
//! `GRPC_UDS`, `GRPC_SERVER_USE_TLS` and its files, `GRPC_CLIENT_TLS_CACERT`/`_SAN`,
//! `GRPC_MAX_CONNECTION_AGE`/`_GRACE`, `RL_DRAIN_DELAY_MS`), read into the struct the
//! transports take. Imports only the environment readers.

/// The Go service's defaults: a connection lives a day, then gets an hour to finish.
const DEFAULT_MAX_CONNECTION_AGE_MS: u64 = 24 * 3_600_000;
const DEFAULT_MAX_CONNECTION_AGE_GRACE_MS: u64 = 3_600_000;

/// This part's variables, read with the others in `Settings::from_env`.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: not serving until a config with a domain loads.
    pub need_config: bool,
    /// RL_DRAIN_DELAY_MS: after SIGTERM, how long the listeners stay open answering "not
    /// serving" (and serving calls) before they close, so load balancers see it first.
    pub drain_delay_ms: u64,
    /// GRPC_UDS: a Unix socket path to serve gRPC on instead of GRPC_HOST:GRPC_PORT.
    pub grpc_uds: Option<String>,
    /// GRPC_SERVER_USE_TLS with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (PEM files).
    pub tls: Option<TlsFiles>,
    /// GRPC_MAX_CONNECTION_AGE, then GOAWAY; 0 means no limit.
    pub max_connection_age_ms: u64,
    /// GRPC_MAX_CONNECTION_AGE_GRACE: how long calls may finish after the GOAWAY.
    pub max_connection_age_grace_ms: u64,
}

/// The gRPC server's TLS files.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: String,
    pub key: String,
    /// GRPC_CLIENT_TLS_CACERT: clients must present a certificate this CA signed (mTLS).
    pub client_ca: Option<String>,
    /// GRPC_CLIENT_TLS_SAN: and that certificate must name this (a DNS SAN).
    pub client_san: Option<String>,
}

impl HealthSettings {
    /// Reads this part's variables through `var`.
    ///
    /// # Errors
    /// The variable and what it must be.
    pub fn from_env(
        var: &impl Fn(&str) -> Option<String>,
        flag: &impl Fn(&str, bool) -> Result<bool, String>,
    ) -> Result<HealthSettings, String> {
        let nonempty = |name: &str| var(name).filter(|v| !v.is_empty());
        let duration = |name: &str, default_ms: u64| -> Result<u64, String> {
            match var(name) {
                None => Ok(default_ms),
                Some(v) => crate::config::env::go_duration_ms(&v).ok_or_else(|| {
                    format!("{name} must be a Go duration such as 30s, 1h or 0, not {v:?}")
                }),
            }
        };
        let drain_delay_ms = match var("RL_DRAIN_DELAY_MS") {
            None => 0,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms <= 600_000)
                .ok_or("RL_DRAIN_DELAY_MS must be a whole number from 0 to 600000")?,
        };
        let tls = if flag("GRPC_SERVER_USE_TLS", false)? {
            let cert = nonempty("GRPC_SERVER_TLS_CERT").ok_or(
                "GRPC_SERVER_TLS_CERT must name a PEM file when GRPC_SERVER_USE_TLS is true",
            )?;
            let key = nonempty("GRPC_SERVER_TLS_KEY").ok_or(
                "GRPC_SERVER_TLS_KEY must name a PEM file when GRPC_SERVER_USE_TLS is true",
            )?;
            let client_ca = nonempty("GRPC_CLIENT_TLS_CACERT");
            let client_san = nonempty("GRPC_CLIENT_TLS_SAN");
            if client_san.is_some() && client_ca.is_none() {
                return Err(
                    "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT (a SAN is checked on a verified client certificate)"
                        .into(),
                );
            }
            Some(TlsFiles {
                cert,
                key,
                client_ca,
                client_san,
            })
        } else {
            None
        };
        Ok(HealthSettings {
            need_config: flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
            drain_delay_ms,
            grpc_uds: nonempty("GRPC_UDS"),
            tls,
            max_connection_age_ms: duration(
                "GRPC_MAX_CONNECTION_AGE",
                DEFAULT_MAX_CONNECTION_AGE_MS,
            )?,
            max_connection_age_grace_ms: duration(
                "GRPC_MAX_CONNECTION_AGE_GRACE",
                DEFAULT_MAX_CONNECTION_AGE_GRACE_MS,
            )?,
        })
    }
}
