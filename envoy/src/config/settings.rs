//! The environment variables, read as envoyproxy/ratelimit reads them (same names, same
//! defaults where they apply), plus this service's own `RL_*`. A bad value is an error that
//! names the variable; a Go variable this service does not support is a startup warning.

use std::path::PathBuf;

use crate::config::env::{env_flag, go_duration_ms};

pub mod health;
pub mod redis_setup;
pub mod runtime;
pub mod stats;
pub mod xds;

use runtime::Source;

/// What to answer when Redis cannot decide (`RL_ON_ERROR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The call fails (gRPC UNAVAILABLE, HTTP 500): Envoy's `failure_mode_deny` decides.
    Error,
    /// Allow.
    Open,
    /// Deny.
    Closed,
    /// Decide in process with `rate / RL_INSTANCES` per bucket.
    Local,
}

/// Which plain limits take a charge past what is left (`POST_PAID_CHARGES`). Envoy sends a
/// stream-done charge (`apply_on_stream_done`) as an ordinary call, so the service cannot
/// tell it from a request; this says which calls are charged as the Go service's counter
/// charges every hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostPaidCharges {
    /// A cost other than 1 is post-paid: 0 is a check (refused while the bucket is in
    /// debt) and a cost above 1 may be a usage charge, so it applies in full, debt
    /// included. A cost of 1, Envoy's default hits, is taken all or nothing, unless the
    /// limit has been asked with 0 hits: then it is checked at request time and its cost of
    /// 1 is a stream-done charge, post-paid too.
    Auto,
    /// Every plain limit is post-paid, as if each had `post_paid: true`.
    Always,
    /// Only `post_paid: true` and quota-mode limits are post-paid.
    Never,
}

/// Where each descriptor's bucket is kept (`RL_BUCKET_STORAGE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketStorage {
    /// A key per bucket: the descriptor's key (RL.ACQUIRE.MULTI).
    Keys,
    /// A field of a bucket table (RL.HACQUIRE.MULTI): the descriptor's key is the field, in
    /// the table `<prefix>buckets:{i}`, `i` derived from the field among
    /// `RL_TABLE_SHARDS` tables so the buckets spread over a cluster's slots.
    Tables,
}

/// Every setting the service reads.
#[derive(Clone, Debug)]
pub struct Settings {
    pub host: String,
    pub port: u16,
    pub grpc_host: String,
    pub grpc_port: u16,
    pub runtime_root: String,
    pub runtime_subdirectory: String,
    pub runtime_appdirectory: String,
    pub runtime_watch_root: bool,
    /// RUNTIME_IGNOREDOTFILES: skip runtime files and directories whose name starts with `.`.
    pub runtime_ignore_dotfiles: bool,
    /// MERGE_DOMAIN_CONFIG: files naming one domain are merged instead of refused.
    pub merge_domain_config: bool,
    pub redis_socket_type: String,
    pub redis_type: String,
    pub redis_url: String,
    pub redis_auth: String,
    pub redis_pool_size: usize,
    pub use_prometheus: bool,
    pub prometheus_addr: String,
    pub prometheus_path: String,
    pub shadow_mode: bool,
    /// GLOBAL_QUOTA_MODE: every limit is in quota mode, as if each had `quota_mode: true`.
    pub global_quota_mode: bool,
    /// POST_PAID_CHARGES: which plain limits take a charge past what is left.
    pub post_paid_charges: PostPaidCharges,
    /// RL_BUCKET_STORAGE: a key per bucket, or fields of bucket tables.
    pub bucket_storage: BucketStorage,
    /// RL_TABLE_SHARDS: how many tables the buckets spread over (tables storage).
    pub table_shards: u32,
    /// RL_MAX_CLIENT_STATS_KEYS: at most this many distinct stats keys carry a request's
    /// value (`detailed_metric`, `value_to_metric`, Envoy's limit override); a new one past
    /// it is counted under the config's own key (the values dropped) and in
    /// `redis_rl_envoy_stats_keys_folded`, so a client sending a new value each call cannot
    /// grow `/metrics` and the statsd names without bound.
    pub max_client_stats_keys: usize,
    /// RESPONSE_DYNAMIC_METADATA: each response carries dynamic metadata (the domain, the
    /// descriptors, the quota-mode violations and the configured `metadata` of the
    /// descriptors within their limits), which Envoy's filter emits for later filters.
    pub response_dynamic_metadata: bool,
    pub near_limit_ratio: f64,
    pub cache_key_prefix: String,
    pub local_cache_size_in_bytes: usize,
    pub limit_response_headers_enabled: bool,
    pub limit_limit_header: String,
    pub limit_remaining_header: String,
    pub limit_reset_header: String,
    pub log_level: String,
    pub log_format: String,
    pub on_error: Policy,
    pub instances: u32,
    pub without_module_lua: bool,
    /// Each Redis call's deadline before the failure policy decides: `RL_TIMEOUT_MS` if set,
    /// else the Go service's `REDIS_TIMEOUT`, else the client library's default.
    pub timeout_ms: u64,
    /// RL_WORKER_THREADS: the runtime's threads; 0 means one per CPU the process may use.
    pub worker_threads: usize,
    /// Health: health checks and the gRPC transport (see `config/settings/health.rs`).
    pub health: health::HealthSettings,
    // xds: CONFIG_TYPE=GRPC_XDS_SOTW and its CONFIG_GRPC_XDS_* (None for FILE).
    pub xds: Option<xds::XdsSettings>,
    // Redis setups: TLS, Sentinel, start-up retries.
    pub redis_setup: redis_setup::RedisSetup,
    // Stats: statsd/dogstatsd sinks, EXTRA_TAGS, DEBUG_HOST/DEBUG_PORT.
    pub stats: stats::StatsSettings,
}

/// The Go service's variables this service does not support: each one set is a warning.
pub const UNSUPPORTED: &[&str] = &[
    "USE_DOG_STATSD_MOGRIFIERS",
    "PROMETHEUS_MAPPER_YAML",
    "BACKEND_TYPE",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_SRV",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    // A newer upstream's settings.go: its radix v4 client's explicit pipelining, the
    // per-second Redis's own deadline and pool-empty behaviour. Here the per-second Redis
    // shares RL_TIMEOUT_MS/REDIS_TIMEOUT, and the multiplexed connections never run empty.
    "REDIS_USE_EXPLICIT_PIPELINE",
    "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "TRACING_ENABLED",
    // The Go listeners' network (`tcp`); here HOST and GRPC_HOST's address picks the family.
    "PROTO",
];

/// Families of the Go service's variables this service does not support (memcache, xDS, tracing): any variable starting with one is a warning too.
pub const UNSUPPORTED_PREFIXES: &[&str] = &[
    "MEMCACHE_",
    // xds: the newer upstream's exponential back-off and message size (see docs/envoy.md).
    "XDS_CLIENT_",
    "TRACING_",
    "DOG_STATSD_MOGRIFIER",
];

/// The longest deadline `RL_TIMEOUT_MS` and `REDIS_TIMEOUT` may set, in ms.
pub const MAX_TIMEOUT_MS: u64 = 60_000;

/// Whether `name` is a Go service variable this service ignores.
pub fn unsupported(name: &str) -> bool {
    UNSUPPORTED.contains(&name) || UNSUPPORTED_PREFIXES.iter().any(|p| name.starts_with(p))
}

impl Settings {
    /// Reads the settings through `var` (the process environment in `main`).
    ///
    /// # Errors
    /// The variable and what it must be.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let text = |name: &str, default: &str| var(name).unwrap_or_else(|| default.to_string());
        let flag = |name: &str, default: bool| env_flag(&var, name, default);
        let number = |name: &str, default: u64, max: u64| -> Result<u64, String> {
            match var(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n <= max)
                    .ok_or_else(|| format!("{name} must be a whole number from 0 to {max}")),
            }
        };
        let port = |name: &str, default: u16| -> Result<u16, String> {
            Ok(u16::try_from(number(name, u64::from(default), 65_535)?).unwrap_or(default))
        };
        let on_error = match text("RL_ON_ERROR", "error").to_ascii_lowercase().as_str() {
            "error" => Policy::Error,
            "open" => Policy::Open,
            "closed" => Policy::Closed,
            "local" => Policy::Local,
            other => {
                return Err(format!(
                    "RL_ON_ERROR must be error, open, closed or local, not {other:?}"
                ))
            }
        };
        let without_module_lua = match text("RL_WITHOUT_MODULE", "lua")
            .to_ascii_lowercase()
            .as_str()
        {
            "lua" => true,
            "refuse" => false,
            other => {
                return Err(format!(
                    "RL_WITHOUT_MODULE must be lua or refuse, not {other:?}"
                ))
            }
        };
        let post_paid_charges = match text("POST_PAID_CHARGES", "auto")
            .to_ascii_lowercase()
            .as_str()
        {
            "auto" => PostPaidCharges::Auto,
            "always" => PostPaidCharges::Always,
            "never" => PostPaidCharges::Never,
            other => {
                return Err(format!(
                    "POST_PAID_CHARGES must be auto, always or never, not {other:?}"
                ))
            }
        };
        let bucket_storage = match text("RL_BUCKET_STORAGE", "keys")
            .to_ascii_lowercase()
            .as_str()
        {
            "keys" => BucketStorage::Keys,
            "tables" => BucketStorage::Tables,
            other => {
                return Err(format!(
                    "RL_BUCKET_STORAGE must be keys or tables, not {other:?}"
                ))
            }
        };
        let table_shards = u32::try_from(number("RL_TABLE_SHARDS", 256, 16_384)?)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or("RL_TABLE_SHARDS must be a whole number from 1 to 16384")?;
        if bucket_storage == BucketStorage::Tables
            && text("CACHE_KEY_PREFIX", "").contains(['{', '}'])
        {
            // The shard index is the tables' hash tag; a brace before it would replace it.
            return Err(
                "CACHE_KEY_PREFIX must not contain { or } with RL_BUCKET_STORAGE=tables".into(),
            );
        }
        let near_limit_ratio = match var("NEAR_LIMIT_RATIO") {
            None => 0.8,
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or("NEAR_LIMIT_RATIO must be a number from 0 to 1")?,
        };
        let redis_socket_type = text("REDIS_SOCKET_TYPE", "unix").to_ascii_lowercase();
        if !matches!(redis_socket_type.as_str(), "tcp" | "unix") {
            return Err(format!(
                "REDIS_SOCKET_TYPE must be tcp or unix, not {redis_socket_type:?}"
            ));
        }
        let redis_type = text("REDIS_TYPE", "single").to_ascii_lowercase();
        if !matches!(redis_type.as_str(), "single" | "cluster" | "sentinel") {
            return Err(format!(
                "REDIS_TYPE must be single, cluster or sentinel, not {redis_type:?}"
            ));
        }
        let log_format = text("LOG_FORMAT", "text").to_ascii_lowercase();
        if !matches!(log_format.as_str(), "text" | "json") {
            return Err(format!(
                "LOG_FORMAT must be text or json, not {log_format:?}"
            ));
        }
        let log_level = text("LOG_LEVEL", "WARN").to_ascii_lowercase();
        if !matches!(
            log_level.as_str(),
            "trace" | "debug" | "info" | "warn" | "warning" | "error" | "fatal" | "panic"
        ) {
            return Err(format!(
                "LOG_LEVEL must be debug, info, warn or error, not {log_level:?}"
            ));
        }
        // Busy is not down: a deadline of tens of ms turns a loaded Redis into an outage. The
        // Go service's REDIS_TIMEOUT (a Go duration, 10s there) is read so a migrated
        // deployment keeps its choice; ours, in ms, wins when both are set.
        let redis_timeout_ms = match var("REDIS_TIMEOUT") {
            None => None,
            Some(v) => Some(
                go_duration_ms(&v)
                    .filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms))
                    .ok_or_else(|| {
                        format!(
                            "REDIS_TIMEOUT must be a Go duration from 1ms to 60s, such as 250ms \
                             or 10s, not {v:?}"
                        )
                    })?,
            ),
        };
        let timeout_ms = match (var("RL_TIMEOUT_MS"), redis_timeout_ms) {
            (Some(_), _) => number("RL_TIMEOUT_MS", 0, MAX_TIMEOUT_MS)?.max(1),
            (None, Some(ms)) => ms,
            (None, None) => {
                u64::try_from(redis_rl_client::DEFAULT_TIMEOUT.as_millis()).unwrap_or(2000)
            }
        };
        Ok(Settings {
            host: text("HOST", "0.0.0.0"),
            port: port("PORT", 8080)?,
            grpc_host: text("GRPC_HOST", "0.0.0.0"),
            grpc_port: port("GRPC_PORT", 8081)?,
            runtime_root: text("RUNTIME_ROOT", "/srv/runtime_data/current"),
            runtime_subdirectory: text("RUNTIME_SUBDIRECTORY", ""),
            runtime_appdirectory: text("RUNTIME_APPDIRECTORY", "config"),
            runtime_watch_root: flag("RUNTIME_WATCH_ROOT", true)?,
            runtime_ignore_dotfiles: flag("RUNTIME_IGNOREDOTFILES", false)?,
            merge_domain_config: flag("MERGE_DOMAIN_CONFIG", false)?,
            redis_socket_type,
            redis_type,
            redis_url: text("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
            redis_auth: text("REDIS_AUTH", ""),
            redis_pool_size: usize::try_from(number("REDIS_POOL_SIZE", 10, 1024)?)
                .unwrap_or(10)
                .max(1),
            use_prometheus: flag("USE_PROMETHEUS", false)?,
            prometheus_addr: text("PROMETHEUS_ADDR", ":9090"),
            prometheus_path: text("PROMETHEUS_PATH", "/metrics"),
            shadow_mode: flag("SHADOW_MODE", false)?,
            global_quota_mode: flag("GLOBAL_QUOTA_MODE", false)?,
            post_paid_charges,
            bucket_storage,
            table_shards,
            max_client_stats_keys: usize::try_from(number(
                "RL_MAX_CLIENT_STATS_KEYS",
                10_000,
                10_000_000,
            )?)
            .unwrap_or(10_000),
            response_dynamic_metadata: flag("RESPONSE_DYNAMIC_METADATA", false)?,
            near_limit_ratio,
            cache_key_prefix: text("CACHE_KEY_PREFIX", ""),
            local_cache_size_in_bytes: usize::try_from(number(
                "LOCAL_CACHE_SIZE_IN_BYTES",
                0,
                1 << 40,
            )?)
            .unwrap_or(0),
            limit_response_headers_enabled: flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)?,
            limit_limit_header: text("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
            limit_remaining_header: text("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
            limit_reset_header: text("LIMIT_RESET_HEADER", "RateLimit-Reset"),
            log_level,
            log_format,
            on_error,
            instances: u32::try_from(number("RL_INSTANCES", 1, 1_000_000)?)
                .unwrap_or(1)
                .max(1),
            without_module_lua,
            timeout_ms,
            worker_threads: usize::try_from(number("RL_WORKER_THREADS", 0, 1024)?).unwrap_or(0),
            health: health::HealthSettings::from_env(&var, &flag)?,
            xds: xds::XdsSettings::from_env(&var)?,
            redis_setup: redis_setup::RedisSetup::from_env(&var)?,
            stats: stats::StatsSettings::from_env(&var, go_duration_ms)?,
        })
    }

    /// The runtime files as the Go service's loader finds them (see [`Source`]).
    pub fn config_source(&self) -> Source {
        let mut base = PathBuf::from(&self.runtime_root);
        if !self.runtime_subdirectory.is_empty() {
            base.push(&self.runtime_subdirectory);
        }
        Source {
            base,
            app_dir: self.runtime_appdirectory.clone(),
            watch_root: self.runtime_watch_root,
            ignore_dotfiles: self.runtime_ignore_dotfiles,
            merge_domains: self.merge_domain_config,
        }
    }

    /// `host:port` from the Go-style `:9090` (all interfaces) or `host:port`.
    pub fn prometheus_bind(&self) -> String {
        if self.prometheus_addr.starts_with(':') {
            format!("0.0.0.0{}", self.prometheus_addr)
        } else {
            self.prometheus_addr.clone()
        }
    }
}

/// The settings read from `pairs` alone, for the unit tests of every part.
#[cfg(test)]
pub(crate) fn from_pairs(pairs: &[(&str, &str)]) -> Result<Settings, String> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_env(|k| map.get(k).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        from_pairs(pairs)
    }

    #[test]
    fn defaults_are_the_go_services() {
        let s = with(&[]).unwrap();
        assert_eq!((s.port, s.grpc_port), (8080, 8081));
        assert_eq!(
            s.config_source().config_dir(),
            PathBuf::from("/srv/runtime_data/current/config")
        );
        assert_eq!(s.redis_socket_type, "unix");
        assert_eq!(s.near_limit_ratio, 0.8);
        assert_eq!(s.limit_remaining_header, "RateLimit-Remaining");
        assert_eq!(s.on_error, Policy::Error);
        assert!(s.without_module_lua);
        assert_eq!(s.prometheus_bind(), "0.0.0.0:9090");
        // Not 50 ms: a deadline that fits a web request, the client library's.
        assert_eq!(s.timeout_ms, 2000);
    }

    #[test]
    fn post_paid_charges_is_auto_always_or_never() {
        let mode = |pairs: &[(&str, &str)]| with(pairs).map(|s| s.post_paid_charges);
        assert_eq!(mode(&[]), Ok(PostPaidCharges::Auto));
        assert_eq!(
            mode(&[("POST_PAID_CHARGES", "Always")]),
            Ok(PostPaidCharges::Always)
        );
        assert_eq!(
            mode(&[("POST_PAID_CHARGES", "never")]),
            Ok(PostPaidCharges::Never)
        );
        let e = mode(&[("POST_PAID_CHARGES", "yes")]).unwrap_err();
        assert!(e.starts_with("POST_PAID_CHARGES must be"), "{e}");
    }

    #[test]
    fn bucket_storage_is_keys_by_default_or_tables_and_bad_values_are_named() {
        let storage =
            |pairs: &[(&str, &str)]| with(pairs).map(|s| (s.bucket_storage, s.table_shards));
        assert_eq!(storage(&[]), Ok((BucketStorage::Keys, 256)));
        assert_eq!(
            storage(&[("RL_BUCKET_STORAGE", "Tables"), ("RL_TABLE_SHARDS", "16")]),
            Ok((BucketStorage::Tables, 16))
        );
        for (pairs, want) in [
            (
                &[("RL_BUCKET_STORAGE", "hash")][..],
                "RL_BUCKET_STORAGE must be",
            ),
            (&[("RL_TABLE_SHARDS", "0")][..], "RL_TABLE_SHARDS must be"),
            (
                &[("RL_TABLE_SHARDS", "16385")][..],
                "RL_TABLE_SHARDS must be",
            ),
            (
                &[("RL_BUCKET_STORAGE", "tables"), ("CACHE_KEY_PREFIX", "{x}")][..],
                "CACHE_KEY_PREFIX must not contain",
            ),
        ] {
            let e = storage(pairs).unwrap_err();
            assert!(e.starts_with(want), "{pairs:?}: {e}");
        }
        // A hash tag in the prefix is fine for keys, which it may group on purpose.
        assert!(storage(&[("CACHE_KEY_PREFIX", "{x}")]).is_ok());
    }

    #[test]
    fn the_deadline_is_rl_timeout_ms_else_the_go_services_redis_timeout() {
        let ms = |pairs: &[(&str, &str)]| with(pairs).map(|s| s.timeout_ms);
        for (text, want) in [
            ("10s", 10_000),
            ("250ms", 250),
            ("1.5s", 1500),
            ("1m", 60_000),
            ("0.5ms", 1),
            ("250us", 1),
            ("1s500ms", 1500),
            ("+2s", 2000),
        ] {
            assert_eq!(ms(&[("REDIS_TIMEOUT", text)]), Ok(want), "{text}");
        }
        assert_eq!(
            ms(&[("REDIS_TIMEOUT", "10s"), ("RL_TIMEOUT_MS", "50")]),
            Ok(50)
        );
        assert_eq!(ms(&[("RL_TIMEOUT_MS", "300")]), Ok(300));
        for bad in ["10", "ten", "-1s", "2m", "0", "1.2.3s", "s", "5 s", ""] {
            let e = ms(&[("REDIS_TIMEOUT", bad)]).unwrap_err();
            assert!(e.starts_with("REDIS_TIMEOUT must be"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("PORT", "http"),
            ("RL_ON_ERROR", "maybe"),
            ("RL_WITHOUT_MODULE", "x"),
            ("NEAR_LIMIT_RATIO", "2"),
            ("REDIS_TYPE", "replicated"),
            ("USE_PROMETHEUS", "perhaps"),
            ("LOG_FORMAT", "xml"),
        ] {
            let e = with(&[(name, value)]).unwrap_err();
            assert!(e.starts_with(name), "{e}");
        }
    }

    #[test]
    fn go_only_variables_are_recognised() {
        for name in [
            "REDIS_PERSECOND_PIPELINE_WINDOW",
            "REDIS_PIPELINE_LIMIT",
            "USE_DOG_STATSD_MOGRIFIERS",
            "MEMCACHE_TLS",
            "TRACING_SERVICE_NAME",
            "PROTO",
            "REDIS_USE_EXPLICIT_PIPELINE",
            "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE",
            "REDIS_PERSECOND_TIMEOUT",
            "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        ] {
            assert!(unsupported(name), "{name}");
        }
        for name in [
            "REDIS_URL",
            "PORT",
            "RL_ON_ERROR",
            "PATH",
            "GRPC_UDS",
            "GRPC_SERVER_USE_TLS",
            "GRPC_SERVER_TLS_CERT",
            "GRPC_CLIENT_TLS_SAN",
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
            "REDIS_PERSECOND_URL",
            "REDIS_PERSECOND_POOL_SIZE",
            "REDIS_TIMEOUT",
            "REDIS_POOL_ON_EMPTY_BEHAVIOR",
            "REDIS_TLS_CACERT",
            "USE_STATSD",
            "DEBUG_PORT",
            "CONFIG_TYPE",
        ] {
            assert!(!unsupported(name), "{name}");
        }
    }
}
