//! Config over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`), as envoyproxy/ratelimit takes it from a
//! management server such as Envoy Gateway's: its `CONFIG_GRPC_XDS_*` settings, the
//! state-of-the-world ADS stream for
//! `type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig`, the conversion of each
//! pushed `RateLimitConfig` into the YAML the file loader reads (so a push is validated by the
//! same code and refused with the same errors as a file), the ACK or NACK of each push, and
//! the reconnect with the Go service's linear back-off with jitter, over plaintext or (m)TLS.
//!
//! A push is all or nothing: every resource of a response is converted and the whole config
//! is built before anything changes; a bad one is NACKed (`error_detail` holds the problem)
//! and the last good config stays. `main` swaps each good one in with
//! `Service::replace_config`, as the file watcher does.

use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Any, Struct, Value};
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use serde_json::{json, Map};
use tokio::sync::{mpsc, oneshot};

use crate::config::rules::{Config, ConfigError};
use crate::config::settings::xds::XdsSettings;

/// The one resource type this client subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// gRPC's INVALID_ARGUMENT, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// A `google.protobuf.Value` as JSON (a non-finite number, which JSON lacks, as null).
fn value_json(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value_json).collect(),
    }
}

fn struct_json(s: &Struct) -> serde_json::Value {
    // Sorted, so one push always gives one text.
    let mut fields: Vec<_> = s.fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    serde_json::Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn policy_json(p: &RateLimitPolicy) -> serde_json::Value {
    // The Go service's `Unit.String()`: the enum's name, or the number when it has none
    // (refused by the loader as an invalid unit).
    let unit = RateLimitUnit::try_from(p.unit)
        .map_or_else(|_| p.unit.to_string(), |u| u.as_str_name().to_string());
    let mut m = Map::new();
    m.insert("unit".into(), json!(unit));
    m.insert("requests_per_unit".into(), json!(p.requests_per_unit));
    if p.unlimited {
        m.insert("unlimited".into(), json!(true));
    }
    if !p.name.is_empty() {
        m.insert("name".into(), json!(p.name));
    }
    if !p.replaces.is_empty() {
        let replaces: Vec<_> = p.replaces.iter().map(|r| json!({"name": r.name})).collect();
        m.insert("replaces".into(), json!(replaces));
    }
    serde_json::Value::Object(m)
}

fn descriptor_json(d: &RateLimitDescriptor) -> serde_json::Value {
    let mut m = Map::new();
    m.insert("key".into(), json!(d.key));
    if !d.value.is_empty() {
        m.insert("value".into(), json!(d.value));
    }
    if let Some(p) = &d.rate_limit {
        m.insert("rate_limit".into(), policy_json(p));
    }
    if !d.descriptors.is_empty() {
        let children: Vec<_> = d.descriptors.iter().map(descriptor_json).collect();
        m.insert("descriptors".into(), json!(children));
    }
    for (flag, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            m.insert(flag.into(), json!(true));
        }
    }
    if let Some(meta) = &d.metadata {
        m.insert("metadata".into(), struct_json(meta));
    }
    serde_json::Value::Object(m)
}

/// One `RateLimitConfig` as the YAML text of a config file (JSON, a subset of YAML, with
/// every string quoted so no value is read as a YAML 1.1 boolean or number).
pub fn config_yaml(c: &RateLimitConfig) -> String {
    let descriptors: Vec<_> = c.descriptors.iter().map(descriptor_json).collect();
    let root = json!({"domain": c.domain, "descriptors": descriptors});
    serde_json::to_string_pretty(&root).unwrap_or_default()
}

/// The config of one push: every resource decoded and converted, then loaded as the files
/// of a runtime directory are (`merge_domains` is MERGE_DOMAIN_CONFIG). Errors name the
/// resource (its `name`, else its place in the push).
///
/// # Errors
/// The first resource of another type, one that does not decode, or the loader's error.
pub fn config_from_resources(
    resources: &[Any],
    merge_domains: bool,
) -> Result<Config, ConfigError> {
    let mut files = Vec::with_capacity(resources.len());
    for (i, any) in resources.iter().enumerate() {
        let place = format!("xDS resource {i}");
        if any.type_url != TYPE_URL {
            return Err(ConfigError {
                file: place,
                problem: format!("type_url is {:?}, not {TYPE_URL:?}", any.type_url),
            });
        }
        let c = RateLimitConfig::decode(any.value.as_slice()).map_err(|e| ConfigError {
            file: place.clone(),
            problem: format!("cannot decode a RateLimitConfig: {e}"),
        })?;
        let name = if c.name.is_empty() {
            place
        } else {
            c.name.clone()
        };
        files.push((name, config_yaml(&c)));
    }
    Config::from_texts(&files, merge_domains)
}

/// What the client hands `main`: a config to swap in, or the problem of a refused push.
/// The client ACKs a config only once `applied` is answered, so an ACK means that calls
/// already see it.
pub struct Update {
    pub config: Result<Config, String>,
    pub applied: oneshot::Sender<()>,
}

/// Starts the client and, unless FORCE_START_WITHOUT_INITIAL_CONFIG, waits for the first
/// good config (as the Go service does before it listens). Returns that config (empty when
/// forced), how many pushes were refused meanwhile, and the later updates.
pub async fn start(
    settings: XdsSettings,
    merge_domains: bool,
) -> Option<(Config, u64, mpsc::Receiver<Update>)> {
    let (tx, mut rx) = mpsc::channel(4);
    let force = settings.force_start;
    tokio::spawn(run(settings, merge_domains, tx));
    if force {
        tracing::warn!(
            "FORCE_START_WITHOUT_INITIAL_CONFIG: serving with no domains until the first xDS push"
        );
        return Some((Config::default(), 0, rx));
    }
    let mut refused = 0u64;
    loop {
        let update = rx.recv().await?;
        let _ = update.applied.send(());
        match update.config {
            // The service is built on it before it listens.
            Ok(config) => return Some((config, refused, rx)),
            Err(_) => refused = refused.saturating_add(1),
        }
    }
}

/// The client: one ADS stream at a time, reconnected after the back-off whenever it cannot
/// be opened or ends, until `updates` is closed.
async fn run(settings: XdsSettings, merge_domains: bool, updates: mpsc::Sender<Update>) {
    // The version last applied: sent on a new stream so the server knows what this node has.
    let mut last_acked = String::new();
    loop {
        match session(&settings, merge_domains, &updates, &mut last_acked).await {
            Ok(()) => tracing::warn!(
                "xDS: the management server {} ended the stream",
                settings.server_url
            ),
            Err(e) => tracing::error!("xDS: {e}"),
        }
        if updates.is_closed() {
            return;
        }
        let wait = settings.retry_wait();
        tracing::warn!(
            "xDS: reconnecting to {} in {} ms; the current config stays",
            settings.server_url,
            wait.as_millis()
        );
        tokio::time::sleep(wait).await;
    }
}

fn request(
    settings: &XdsSettings,
    version_info: &str,
    response_nonce: &str,
    error: Option<String>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version_info.to_string(),
        node: Some(settings.node()),
        type_url: TYPE_URL.into(),
        response_nonce: response_nonce.to_string(),
        error_detail: error.map(|message| Status {
            code: INVALID_ARGUMENT,
            message,
            details: Vec::new(),
        }),
        ..DiscoveryRequest::default()
    }
}

async fn session(
    settings: &XdsSettings,
    merge_domains: bool,
    updates: &mpsc::Sender<Update>,
    last_acked: &mut String,
) -> Result<(), String> {
    let url = settings.endpoint_url();
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("CONFIG_GRPC_XDS_SERVER_URL {url:?}: {e}"))?
        .connect_timeout(Duration::from_secs(5));
    if let Some(tls) = &settings.tls {
        endpoint = endpoint
            .tls_config(tls.client_config())
            .map_err(|e| format!("TLS to the management server {url}: {e}"))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot reach the management server {url}: {e}"))?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (requests, outgoing) = mpsc::channel::<DiscoveryRequest>(4);
    let sent = |_| "the stream's sender is gone".to_string();
    requests
        .send(request(settings, last_acked, "", None))
        .await
        .map_err(sent)?;
    let mut call = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
    for (k, v) in &settings.headers {
        // Checked at startup (XdsSettings::from_env).
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(k.as_bytes()),
            tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(v.as_str()),
        ) {
            call.metadata_mut().insert(key, value);
        }
    }
    let mut responses = client
        .stream_aggregated_resources(call)
        .await
        .map_err(|e| format!("cannot open the ADS stream on {url}: {e}"))?
        .into_inner();
    tracing::warn!(
        "xDS: subscribed to {TYPE_URL} on {url} as node {:?}",
        settings.node_id
    );
    while let Some(response) = responses
        .message()
        .await
        .map_err(|e| format!("the ADS stream on {url} failed: {e}"))?
    {
        let reply = handle(settings, merge_domains, updates, last_acked, &response).await?;
        requests.send(reply).await.map_err(sent)?;
    }
    Ok(())
}

/// One response: its config applied and ACKed, or refused and NACKed (with the last good
/// version and this response's nonce, as xDS asks).
async fn handle(
    settings: &XdsSettings,
    merge_domains: bool,
    updates: &mpsc::Sender<Update>,
    last_acked: &mut String,
    response: &DiscoveryResponse,
) -> Result<DiscoveryRequest, String> {
    let version = &response.version_info;
    let built = if response.type_url == TYPE_URL {
        config_from_resources(&response.resources, merge_domains).map_err(|e| e.to_string())
    } else {
        Err(format!(
            "type_url is {:?}: this client subscribes to {TYPE_URL:?} only",
            response.type_url
        ))
    };
    match built {
        Ok(config) => {
            let summary = format!(
                "{} domain(s): {:?}",
                config.domain_count(),
                crate::config::rules::summary(&config)
            );
            let (applied, done) = oneshot::channel();
            let stopped = "the service stopped taking configs";
            updates
                .send(Update {
                    config: Ok(config),
                    applied,
                })
                .await
                .map_err(|_| stopped.to_string())?;
            done.await.map_err(|_| stopped.to_string())?;
            tracing::warn!("xDS: config version {version:?} applied: {summary}");
            last_acked.clone_from(version);
            Ok(request(settings, version, &response.nonce, None))
        }
        Err(problem) => {
            tracing::error!(
                "xDS: config version {version:?} refused, version {last_acked:?} stays: {problem}"
            );
            let (applied, _) = oneshot::channel();
            let _ = updates
                .send(Update {
                    config: Err(problem.clone()),
                    applied,
                })
                .await;
            Ok(request(
                settings,
                last_acked,
                &response.nonce,
                Some(problem),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn with(pairs: &[(&str, &str)]) -> Result<Option<XdsSettings>, String> {
        crate::config::settings::from_pairs(pairs).map(|s| s.xds)
    }

    fn any(c: &RateLimitConfig) -> Any {
        Any {
            type_url: TYPE_URL.into(),
            value: c.encode_to_vec(),
        }
    }

    fn descriptor(key: &str, value: &str, policy: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: policy,
            ..RateLimitDescriptor::default()
        }
    }

    fn per(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..RateLimitPolicy::default()
        })
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn settings_are_the_go_services() {
        assert!(with(&[]).unwrap().is_none());
        assert!(with(&[("CONFIG_TYPE", "FILE")]).unwrap().is_none());
        let s = with(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap().unwrap();
        assert_eq!(
            (
                s.node_id.as_str(),
                s.server_url.as_str(),
                s.retry_interval_ms
            ),
            ("default", "localhost:18000", 3000)
        );
        assert!(!s.force_start);
        let s = with(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,junk,b=x=y"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-token:abc,x-b:2",
            ),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "250ms"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            s.node_metadata,
            [("a".into(), "1".into()), ("b".into(), "x=y".into())]
        );
        assert_eq!(
            s.headers,
            [("x-token".into(), "abc".into()), ("x-b".into(), "2".into())]
        );
        assert_eq!(s.retry_interval_ms, 250);
        assert!(s.force_start);
        for _ in 0..100 {
            let wait = s.retry_wait().as_millis();
            assert!((125..=375).contains(&wait), "{wait}");
        }
        for (name, value) in [
            ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "bad key:v"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "maybe"),
        ] {
            let mut env = vec![(name, value)];
            if name != "CONFIG_TYPE" {
                env.push(("CONFIG_TYPE", "GRPC_XDS_SOTW"));
            }
            if name == "CONFIG_GRPC_XDS_SERVER_TLS_CACERT" {
                env.push(("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"));
            }
            let e = with(&env).unwrap_err();
            assert!(e.starts_with(name), "{name}={value}: {e}");
        }
    }

    #[test]
    fn a_pushed_config_loads_as_the_same_yaml_would() {
        let mut nested = descriptor("k", "v", None);
        nested.descriptors = vec![descriptor("sub", "", per(RateLimitUnit::Second, 7))];
        let mut meta = descriptor("m", "yes", per(RateLimitUnit::Hour, 3));
        meta.quota_mode = true;
        meta.shadow_mode = true;
        meta.metadata = Some(Struct {
            fields: [(
                "n".to_string(),
                Value {
                    kind: Some(Kind::NumberValue(1.5)),
                },
            )]
            .into_iter()
            .collect(),
        });
        let mut named = per(RateLimitUnit::Minute, 10);
        if let Some(p) = named.as_mut() {
            p.name = "a".into();
            p.replaces = vec![RateLimitReplace { name: "b".into() }];
        }
        let unlimited = Some(RateLimitPolicy {
            unlimited: true,
            ..RateLimitPolicy::default()
        });
        let c = RateLimitConfig {
            name: "gw".into(),
            domain: "d".into(),
            descriptors: vec![
                nested,
                meta,
                descriptor("01234", "0x10", named),
                descriptor("free", "", unlimited),
                descriptor("w", "api*", per(RateLimitUnit::Week, 2)),
            ],
        };
        let config = config_from_resources(&[any(&c)], false).unwrap();
        let m = config
            .lookup("d", &entries(&[("k", "v"), ("sub", "x")]))
            .unwrap();
        assert_eq!(m.rate_limit.requests_per_unit, 7);
        // A string that YAML 1.1 would read as a boolean or a number stays the string.
        let m = config.lookup("d", &entries(&[("m", "yes")])).unwrap();
        assert!(m.quota_mode && m.shadow_mode);
        assert_eq!(m.metadata.as_deref(), Some(&json!({"n": 1.5})));
        let m = config.lookup("d", &entries(&[("01234", "0x10")])).unwrap();
        assert_eq!(
            (m.rate_limit.name.as_str(), m.rate_limit.replaces.as_slice()),
            ("a", ["b".to_string()].as_slice())
        );
        assert!(
            config
                .lookup("d", &entries(&[("free", "x")]))
                .unwrap()
                .rate_limit
                .unlimited
        );
        assert_eq!(
            config
                .lookup("d", &entries(&[("w", "api/v1")]))
                .unwrap()
                .rate_limit
                .requests_per_unit,
            2
        );
    }

    #[test]
    fn a_bad_push_is_refused_with_the_loaders_error_naming_the_resource() {
        let good = RateLimitConfig {
            name: "good".into(),
            domain: "d".into(),
            descriptors: vec![descriptor("k", "", per(RateLimitUnit::Second, 1))],
        };
        // (the bad resource, words of the problem)
        let cases = [
            (
                RateLimitConfig {
                    name: "unit".into(),
                    domain: "e".into(),
                    descriptors: vec![descriptor("k", "", per(RateLimitUnit::Unknown, 1))],
                },
                "invalid rate limit unit 'UNKNOWN'",
            ),
            (
                RateLimitConfig {
                    name: "dup".into(),
                    domain: "d".into(),
                    descriptors: vec![],
                },
                "duplicate domain 'd'",
            ),
            (
                RateLimitConfig {
                    name: "nodomain".into(),
                    ..RateLimitConfig::default()
                },
                "empty domain",
            ),
            (
                RateLimitConfig {
                    name: "nokey".into(),
                    domain: "f".into(),
                    descriptors: vec![descriptor("", "v", None)],
                },
                "descriptor has empty key",
            ),
        ];
        for (bad, words) in cases {
            let e = config_from_resources(&[any(&good), any(&bad)], false).unwrap_err();
            assert_eq!(e.file, bad.name);
            assert!(e.problem.contains(words), "{e}");
        }
        let wrong = Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: vec![],
        };
        let e = config_from_resources(&[any(&good), wrong], false).unwrap_err();
        assert_eq!(e.file, "xDS resource 1");
        let garbage = Any {
            type_url: TYPE_URL.into(),
            value: vec![0xff, 0xff],
        };
        assert!(config_from_resources(&[garbage], false)
            .unwrap_err()
            .problem
            .contains("cannot decode"));
        // MERGE_DOMAIN_CONFIG merges two resources of one domain, as it merges two files.
        let more = RateLimitConfig {
            name: "more".into(),
            domain: "d".into(),
            descriptors: vec![descriptor("k2", "", per(RateLimitUnit::Day, 4))],
        };
        let merged = config_from_resources(&[any(&good), any(&more)], true).unwrap();
        assert!(merged.lookup("d", &entries(&[("k2", "x")])).is_some());
    }
}
