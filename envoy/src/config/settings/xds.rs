//! The `CONFIG_TYPE` and `CONFIG_GRPC_XDS_*` variables, read into the struct the xDS client
//! takes, with the client's reconnect back-off. Imports only the environment readers.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The xDS settings (the Go service's names and defaults).
#[derive(Clone, Debug)]
pub struct XdsSettings {
    /// CONFIG_GRPC_XDS_NODE_ID: the node the management server keys its snapshots by.
    pub node_id: String,
    /// CONFIG_GRPC_XDS_NODE_METADATA (`k1=v1,k2=v2`): string fields of the node's metadata.
    pub node_metadata: Vec<(String, String)>,
    /// CONFIG_GRPC_XDS_SERVER_URL: `host:port` (plaintext gRPC) or an `http://` URL.
    pub server_url: String,
    /// CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL: the mean wait between two attempts to
    /// reach the management server; each wait is drawn within ±50% of it.
    pub retry_interval_ms: u64,
    /// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS (`k1:v1,k2:v2`): gRPC metadata on the stream.
    pub headers: Vec<(String, String)>,
    /// FORCE_START_WITHOUT_INITIAL_CONFIG: serve with no domains until the first push, instead
    /// of waiting for it before listening.
    pub force_start: bool,
    /// CONFIG_GRPC_XDS_SERVER_USE_TLS and its files, read at startup.
    pub tls: Option<Tls>,
}

/// TLS to the management server, as the Go service sets it up: the server is verified
/// against CONFIG_GRPC_XDS_SERVER_TLS_CACERT (the system roots without it) under the name
/// CONFIG_GRPC_XDS_SERVER_TLS_SAN (the URL's host without it), and the client presents
/// CONFIG_GRPC_XDS_CLIENT_TLS_CERT and _KEY when both are set (mTLS, as Envoy Gateway asks).
#[derive(Clone, Debug)]
pub struct Tls {
    /// PEM: the certificate chain and the private key.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// PEM: the CA certificate(s) the server's certificate must chain to.
    pub server_ca: Option<Vec<u8>>,
    /// The name the server's certificate must hold; empty for the URL's host.
    pub server_san: String,
}

impl Tls {
    fn from_env(var: &impl Fn(&str) -> Option<String>) -> Result<Tls, String> {
        let file = |name: &str| -> Result<Option<Vec<u8>>, String> {
            match var(name).filter(|p| !p.is_empty()) {
                None => Ok(None),
                Some(path) => std::fs::read(&path)
                    .map(Some)
                    .map_err(|e| format!("{name} must be a readable PEM file, not {path:?}: {e}")),
            }
        };
        let cert = file("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")?;
        let key = file("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")?;
        Ok(Tls {
            client_identity: cert.zip(key),
            server_ca: file("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")?,
            server_san: var("CONFIG_GRPC_XDS_SERVER_TLS_SAN").unwrap_or_default(),
        })
    }

    pub(crate) fn client_config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new();
        config = match &self.server_ca {
            Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.client_identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if !self.server_san.is_empty() {
            config = config.domain_name(self.server_san.clone());
        }
        config
    }
}

/// A Go `strconv.ParseBool`.
fn go_bool(name: &str, text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" | "" => Ok(false),
        _ => Err(format!("{name} must be true or false, not {text:?}")),
    }
}

/// `k<sep>v` pairs separated by commas; an entry without `sep` is skipped (as the Go
/// service's node metadata does) when `lenient`, an error naming `name` otherwise.
fn pairs(
    name: &str,
    text: &str,
    sep: char,
    lenient: bool,
) -> Result<Vec<(String, String)>, String> {
    let mut all = Vec::new();
    for entry in text.split(',').filter(|e| !e.trim().is_empty()) {
        match entry.split_once(sep) {
            Some((k, v)) => all.push((k.trim().to_string(), v.trim().to_string())),
            None if lenient => {}
            None => {
                return Err(format!(
                    "{name} must be a list of key{sep}value pairs separated by commas, not {text:?}"
                ))
            }
        }
    }
    Ok(all)
}

impl XdsSettings {
    /// The xDS settings when `CONFIG_TYPE` is `GRPC_XDS_SOTW`; `None` for `FILE` (the default).
    ///
    /// # Errors
    /// The variable and what it must be; TLS to the management server is refused rather than
    /// silently replaced by plaintext.
    pub fn from_env(var: &impl Fn(&str) -> Option<String>) -> Result<Option<XdsSettings>, String> {
        let config_type = var("CONFIG_TYPE").unwrap_or_else(|| "FILE".into());
        match config_type.to_ascii_uppercase().as_str() {
            "FILE" => return Ok(None),
            "GRPC_XDS_SOTW" => {}
            _ => {
                return Err(format!(
                    "CONFIG_TYPE must be FILE or GRPC_XDS_SOTW, not {config_type:?}"
                ))
            }
        }
        let tls = if go_bool(
            "CONFIG_GRPC_XDS_SERVER_USE_TLS",
            &var("CONFIG_GRPC_XDS_SERVER_USE_TLS").unwrap_or_default(),
        )? {
            Some(Tls::from_env(var)?)
        } else {
            None
        };
        let retry_text =
            var("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL").unwrap_or_else(|| "3s".into());
        let retry_interval_ms = crate::config::env::go_duration_ms(&retry_text)
            .filter(|ms| (1..=3_600_000).contains(ms))
            .ok_or_else(|| {
                format!(
                    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL must be a Go duration from \
                     1ms to 1h, such as 3s, not {retry_text:?}"
                )
            })?;
        let headers = pairs(
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            &var("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS").unwrap_or_default(),
            ':',
            false,
        )?;
        for (k, v) in &headers {
            let key =
                tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(k.as_bytes());
            let value =
                tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(v.as_str());
            if key.is_err() || value.is_err() {
                return Err(format!(
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS must hold valid gRPC header names \
                     and values, not {k:?}: {v:?}"
                ));
            }
        }
        Ok(Some(XdsSettings {
            node_id: var("CONFIG_GRPC_XDS_NODE_ID").unwrap_or_else(|| "default".into()),
            node_metadata: pairs(
                "CONFIG_GRPC_XDS_NODE_METADATA",
                &var("CONFIG_GRPC_XDS_NODE_METADATA").unwrap_or_default(),
                '=',
                true,
            )?,
            server_url: var("CONFIG_GRPC_XDS_SERVER_URL")
                .unwrap_or_else(|| "localhost:18000".into()),
            retry_interval_ms,
            headers,
            force_start: go_bool(
                "FORCE_START_WITHOUT_INITIAL_CONFIG",
                &var("FORCE_START_WITHOUT_INITIAL_CONFIG").unwrap_or_default(),
            )?,
            tls,
        }))
    }

    pub(crate) fn node(&self) -> Node {
        let fields = self
            .node_metadata
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value {
                        kind: Some(Kind::StringValue(v.clone())),
                    },
                )
            })
            .collect();
        Node {
            id: self.node_id.clone(),
            metadata: Some(Struct { fields }),
            user_agent_name: "redis-rl-envoy".into(),
            ..Node::default()
        }
    }

    pub(crate) fn endpoint_url(&self) -> String {
        if self.server_url.contains("://") {
            self.server_url.clone()
        } else if self.tls.is_some() {
            // tonic applies TLS to https URLs only.
            format!("https://{}", self.server_url)
        } else {
            format!("http://{}", self.server_url)
        }
    }

    /// The next wait before reconnecting: the interval ±50%, as the Go service's
    /// `BackoffLinearWithJitter(interval, 0.5)`.
    pub(crate) fn retry_wait(&self) -> Duration {
        let interval_ms = self.retry_interval_ms;
        let span_ms = interval_ms / 2;
        // A random draw without a crate: RandomState is seeded from the OS per process and
        // stepped per instance.
        let draw = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let offset_ms = draw % span_ms.saturating_mul(2).saturating_add(1);
        Duration::from_millis(
            interval_ms
                .saturating_sub(span_ms)
                .saturating_add(offset_ms)
                .max(1),
        )
    }
}
