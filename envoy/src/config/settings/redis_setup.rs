//! The `REDIS_*` variables beyond the address (TLS, auth, Sentinel, the per-second Redis,
//! the pool's on-empty behaviour, the start-up retries), read into the struct the Redis
//! setups take. Imports only the environment readers.

/// The settings of this part (read with the others in `Settings::from_env`).
#[derive(Clone, Debug)]
pub struct RedisSetup {
    pub tls: bool,
    pub tls_cacert: String,
    pub tls_client_cert: String,
    pub tls_client_key: String,
    pub tls_skip_hostname_verification: bool,
    /// REDIS_SENTINEL_AUTH: the sentinels' own password (or `user:password`).
    pub sentinel_auth: String,
    /// REDIS_POOL_ON_EMPTY_BEHAVIOR, upper case: `CREATE`, `ERROR` or `WAIT`. Checked only:
    /// the connections are multiplexed and never run empty (docs/envoy-redis.md).
    pub pool_on_empty_behavior: String,
    pub pool_on_empty_wait_ms: u64,
    /// REDIS_STARTUP_RETRY_ENABLED: keep trying Redis at start-up instead of exiting.
    pub startup_retry: bool,
    /// REDIS_STARTUP_RETRY_MAX_ATTEMPTS: attempts before giving up; 0 is no bound.
    pub startup_max_attempts: u64,
    pub startup_initial_interval_ms: u64,
    pub startup_max_interval_ms: u64,
    /// REDIS_PERSECOND=true: the second Redis for limits whose unit is `second`.
    pub per_second: Option<PerSecond>,
}

/// The `REDIS_PERSECOND_*` Redis, read as the `REDIS_*` one (same forms, the Go defaults).
#[derive(Clone, Debug)]
pub struct PerSecond {
    pub socket_type: String,
    pub redis_type: String,
    pub url: String,
    pub auth: String,
    pub sentinel_auth: String,
    pub pool_size: usize,
    pub tls: bool,
}

/// The longest start-up back-off, in ms.
const MAX_INTERVAL_MS: u64 = 3_600_000;

impl RedisSetup {
    /// Reads this part's variables through `var`.
    ///
    /// # Errors
    /// The variable and what it must be.
    pub fn from_env(var: &impl Fn(&str) -> Option<String>) -> Result<RedisSetup, String> {
        let text = |name: &str| var(name).unwrap_or_default();
        let flag = |name: &str, default: bool| crate::config::env::env_flag(var, name, default);
        let duration = |name: &str, default_ms: u64| -> Result<u64, String> {
            match var(name) {
                None => Ok(default_ms),
                Some(v) => crate::config::env::go_duration_ms(&v)
                    .filter(|ms| *ms <= MAX_INTERVAL_MS)
                    .ok_or_else(|| {
                        format!(
                            "{name} must be a Go duration up to 1h, such as 500ms or 2s, not {v:?}"
                        )
                    }),
            }
        };
        let pool_on_empty_behavior = text("REDIS_POOL_ON_EMPTY_BEHAVIOR")
            .trim()
            .to_ascii_uppercase();
        let pool_on_empty_behavior = match pool_on_empty_behavior.as_str() {
            "" => "CREATE".to_string(),
            "CREATE" | "ERROR" | "WAIT" => pool_on_empty_behavior,
            _ => {
                return Err(format!(
                    "REDIS_POOL_ON_EMPTY_BEHAVIOR must be CREATE, ERROR or WAIT, not {:?}",
                    text("REDIS_POOL_ON_EMPTY_BEHAVIOR")
                ))
            }
        };
        let startup_max_attempts = match var("REDIS_STARTUP_RETRY_MAX_ATTEMPTS") {
            None => 0,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= 1_000_000)
                .ok_or_else(|| {
                    format!(
                    "REDIS_STARTUP_RETRY_MAX_ATTEMPTS must be a whole number from 0 (no bound) \
                     to 1000000, not {v:?}"
                )
                })?,
        };
        let per_second = if flag("REDIS_PERSECOND", false)? {
            let socket_type = text("REDIS_PERSECOND_SOCKET_TYPE")
                .trim()
                .to_ascii_lowercase();
            let socket_type = if socket_type.is_empty() {
                "unix".to_string()
            } else {
                socket_type
            };
            if !matches!(socket_type.as_str(), "tcp" | "unix") {
                return Err(format!(
                    "REDIS_PERSECOND_SOCKET_TYPE must be tcp or unix, not {socket_type:?}"
                ));
            }
            let redis_type = text("REDIS_PERSECOND_TYPE").trim().to_ascii_lowercase();
            let redis_type = if redis_type.is_empty() {
                "single".to_string()
            } else {
                redis_type
            };
            if !matches!(redis_type.as_str(), "single" | "cluster" | "sentinel") {
                return Err(format!(
                    "REDIS_PERSECOND_TYPE must be single, cluster or sentinel, not {redis_type:?}"
                ));
            }
            let pool_size = match var("REDIS_PERSECOND_POOL_SIZE") {
                None => 10,
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| {
                        format!("REDIS_PERSECOND_POOL_SIZE must be a whole number from 1 to 1024, not {v:?}")
                    })?,
            };
            Some(PerSecond {
                socket_type,
                redis_type,
                url: var("REDIS_PERSECOND_URL")
                    .unwrap_or_else(|| "/var/run/nutcracker/ratelimitpersecond.sock".to_string()),
                auth: text("REDIS_PERSECOND_AUTH"),
                sentinel_auth: text("REDIS_PERSECOND_SENTINEL_AUTH"),
                pool_size,
                tls: flag("REDIS_PERSECOND_TLS", false)?,
            })
        } else {
            None
        };
        let setup = RedisSetup {
            tls: flag("REDIS_TLS", false)?,
            tls_cacert: text("REDIS_TLS_CACERT"),
            tls_client_cert: text("REDIS_TLS_CLIENT_CERT"),
            tls_client_key: text("REDIS_TLS_CLIENT_KEY"),
            tls_skip_hostname_verification: flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?,
            sentinel_auth: text("REDIS_SENTINEL_AUTH"),
            pool_on_empty_behavior,
            pool_on_empty_wait_ms: duration("REDIS_POOL_ON_EMPTY_WAIT_DURATION", 1000)?,
            startup_retry: flag("REDIS_STARTUP_RETRY_ENABLED", true)?,
            startup_max_attempts,
            startup_initial_interval_ms: duration("REDIS_STARTUP_RETRY_INITIAL_INTERVAL", 500)?
                .max(1),
            startup_max_interval_ms: duration("REDIS_STARTUP_RETRY_MAX_INTERVAL", 30_000)?.max(1),
            per_second,
        };
        if setup.tls_client_cert.is_empty() != setup.tls_client_key.is_empty() {
            return Err(
                "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY must be set together".to_string(),
            );
        }
        Ok(setup)
    }
}
