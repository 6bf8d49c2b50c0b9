//! Redis as teams run it: the `REDIS_*` variables of envoyproxy/ratelimit beyond
//! the address, turned into the redis crate's connections. It owns TLS (`REDIS_TLS`,
//! `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`/`_KEY`, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`),
//! credentials of any bytes and ACL users (`REDIS_AUTH`), Sentinel (`REDIS_TYPE=sentinel`,
//! `REDIS_SENTINEL_AUTH`), the pool's on-empty behaviour (`REDIS_POOL_ON_EMPTY_*`) and the
//! start-up retries (`REDIS_STARTUP_*`). `main` calls [`connect_with_retries`] only.
//!
//! Why connection infos and not URLs: a password was pasted into a `redis://` URL, so one
//! holding `#`, `/` or `@` broke the URL and start-up blamed `REDIS_URL`. A setting that asks
//! for security is honoured or refused, never downgraded: `REDIS_TLS=true` on a unix socket
//! or a `redis://` URL is an error, not a plaintext connection.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisFuture, RedisResult, TlsCertificates, TlsMode, Value,
};
use redis_rl_client::{
    AsyncLimiter, Charged, Decision, Error as ClientError, Limit, OnError, Options, SlotItem,
    SlotsDecision, Source, WithoutModule,
};

use crate::config::settings::redis_setup::RedisSetup;
use crate::config::settings::{BucketStorage, Policy, Settings};
use crate::redis::pool::Pool;

/// The async limiter on one server (a pool of multiplexed connections) or on a cluster.
/// The decision's leases and reservations send their own commands on the same connections.
pub enum Backend {
    Single(AsyncLimiter<Pool<Link>>),
    Cluster(AsyncLimiter<redis::cluster_async::ClusterConnection>),
}

/// `RL_BUCKET_STORAGE=tables`: the buckets are fields of the tables `name:{i}`, `i` among
/// `shards`, named as the client library's bucket tables name them (the field is the
/// descriptor's key; its fallback key `name:{i}:field` is what the Lua path keeps).
pub(crate) struct Tables {
    pub(crate) name: String,
    pub(crate) shards: u32,
}

impl Tables {
    /// The tables of `settings`, or `None` when buckets are keys.
    pub(crate) fn of(settings: &Settings) -> Option<Tables> {
        (settings.bucket_storage == BucketStorage::Tables).then(|| Tables {
            name: format!("{}buckets", settings.cache_key_prefix),
            shards: settings.table_shards,
        })
    }

    /// The table key and the fallback key of the field `key`.
    pub(crate) fn names(&self, key: &str) -> (String, String) {
        let table = format!(
            "{}:{{{}}}",
            self.name,
            redis_rl_client::shard_of(key, self.shards)
        );
        let fallback = format!("{table}:{key}");
        (table, fallback)
    }
}

/// `method(args…)` awaited on the bucket a [`Backend`] keeps for a key: the key's own, or
/// with [`Tables`] its field in the table the key shards to. One body for the two backends
/// and the two storages.
macro_rules! on_bucket {
    ($backend:expr, $tables:expr, $method:ident($($arg:expr),*)) => {
        match ($backend, $tables) {
            (Backend::Single(l), None) => l.$method($($arg),*).await,
            (Backend::Cluster(l), None) => l.$method($($arg),*).await,
            (Backend::Single(l), Some(t)) => l.table(&t.name, t.shards)?.$method($($arg),*).await,
            (Backend::Cluster(l), Some(t)) => l.table(&t.name, t.shards)?.$method($($arg),*).await,
        }
    };
}

impl Backend {
    pub(crate) async fn acquire_across_slots(
        &self,
        items: &[SlotItem<'_>],
    ) -> Result<SlotsDecision, ClientError> {
        match self {
            Backend::Single(l) => l.acquire_across_slots(items).await,
            Backend::Cluster(l) => l.acquire_across_slots(items).await,
        }
    }

    /// Who applied the refund (`Closed` when Redis could not and the policy skipped it).
    pub(crate) async fn refund(
        &self,
        tables: Option<&Tables>,
        key: &str,
        limit: &Limit,
        cost: f64,
    ) -> Result<Source, ClientError> {
        on_bucket!(self, tables, refund(key, limit, cost)).map(|r| r.source)
    }

    /// Charges `cost` post-paid: applied whatever the bucket holds, which may go into debt.
    pub(crate) async fn charge(
        &self,
        tables: Option<&Tables>,
        key: &str,
        limit: &Limit,
        cost: f64,
    ) -> Result<Charged, ClientError> {
        on_bucket!(self, tables, charge(key, limit, cost))
    }

    /// What a take of `cost` would decide, taking nothing.
    pub(crate) async fn peek(
        &self,
        tables: Option<&Tables>,
        key: &str,
        limit: &Limit,
        cost: f64,
    ) -> Result<Decision, ClientError> {
        on_bucket!(self, tables, peek(key, limit, cost))
    }
}

/// Why a connection was not made: the setup is wrong (refused at once), or Redis did not
/// answer (tried again under `REDIS_STARTUP_*`).
#[derive(Debug)]
pub enum Failed {
    Setup(String),
    Unreachable(String),
}

/// `REDIS_AUTH`-style credentials: `user:password` (an ACL user), else a password of any
/// bytes, sent as they are (never through a URL).
fn credentials(auth: &str, info: RedisConnectionInfo) -> RedisConnectionInfo {
    if auth.is_empty() {
        return info;
    }
    match auth.split_once(':') {
        Some((user, password)) if !user.is_empty() => {
            info.set_username(user).set_password(password)
        }
        _ => info.set_password(auth),
    }
}

/// `host:port` (an IPv6 host in brackets) as a host and a port.
fn host_port(text: &str, what: &str) -> Result<(String, u16), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{what} must be host:port, not {text:?}"))?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
        format!("{what} must be host:port with a port from 1 to 65535, not {text:?}")
    })?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{what} must be host:port, not {text:?}"));
    }
    Ok((host.to_string(), port))
}

/// A TCP address, over TLS (its certificates applied later) when `tls`.
fn tcp_addr(host: String, port: u16, tls: bool) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    }
}

/// The certificates `REDIS_TLS_*` name, read now so a missing file stops start-up.
fn certificates(setup: &RedisSetup) -> Result<TlsCertificates, String> {
    let read = |name: &str, path: &str| {
        std::fs::read(path).map_err(|e| format!("{name}: cannot read {path}: {e}"))
    };
    let root_cert = if setup.tls_cacert.is_empty() {
        None
    } else {
        Some(read("REDIS_TLS_CACERT", &setup.tls_cacert)?)
    };
    let client_tls = if setup.tls_client_cert.is_empty() {
        None
    } else {
        Some(ClientTlsConfig {
            client_cert: read("REDIS_TLS_CLIENT_CERT", &setup.tls_client_cert)?,
            client_key: read("REDIS_TLS_CLIENT_KEY", &setup.tls_client_key)?,
        })
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// One address as a connection info, TLS and credentials applied.
fn node_info(settings: &Settings, address: &str) -> Result<ConnectionInfo, String> {
    let setup = &settings.redis_setup;
    let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    if address.contains("://") {
        // A URL carries its own credentials and scheme; REDIS_TLS may not be downgraded.
        if setup.tls && !address.starts_with("rediss://") {
            return Err(format!(
                "REDIS_TLS is true but REDIS_URL {address:?} is not a rediss:// URL: refusing \
                 to connect in plaintext"
            ));
        }
        let info = address
            .into_connection_info()
            .map_err(|e| format!("REDIS_URL: {e}"))?;
        return tls_applied(settings, info.set_tcp_settings(tcp));
    }
    if settings.redis_socket_type == "unix" {
        if setup.tls {
            return Err(
                "REDIS_TLS is true but REDIS_SOCKET_TYPE is unix: TLS needs tcp; refusing to \
                 connect in plaintext"
                    .to_string(),
            );
        }
        let info = ConnectionAddr::Unix(address.into())
            .into_connection_info()
            .map_err(|e| format!("REDIS_URL: {e}"))?;
        let redis = credentials(&settings.redis_auth, info.redis_settings().clone());
        return Ok(info.set_redis_settings(redis));
    }
    let (host, port) = host_port(address, "REDIS_URL")?;
    let info = tcp_addr(host, port, setup.tls)
        .into_connection_info()
        .map_err(|e| format!("REDIS_URL: {e}"))?;
    let redis = credentials(&settings.redis_auth, info.redis_settings().clone());
    tls_applied(
        settings,
        info.set_redis_settings(redis).set_tcp_settings(tcp),
    )
}

/// A TLS address gets the `REDIS_TLS_*` certificates and hostname choice.
fn tls_applied(settings: &Settings, info: ConnectionInfo) -> Result<ConnectionInfo, String> {
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return Ok(info);
    }
    let setup = &settings.redis_setup;
    let client = redis::Client::build_with_tls(info, certificates(setup)?)
        .map_err(|e| format!("REDIS_TLS: {e}"))?;
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    if setup.tls_skip_hostname_verification {
        // The chain is still verified against REDIS_TLS_CACERT (or the system's roots);
        // only the name in the certificate may differ from the host dialled.
        addr.set_danger_accept_invalid_hostnames(true);
    }
    Ok(info.set_addr(addr))
}

/// One link of the single-server pool: a connection manager (which reconnects by itself to
/// the same address) or, under Sentinel, a connection that asks the sentinels for the
/// primary again after a failure.
#[derive(Clone)]
pub enum Link {
    Direct(ConnectionManager),
    Sentinel(SentinelLink),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Direct(c) => c.req_packed_command(cmd),
            Link::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Direct(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Direct(c) => c.get_db(),
            Link::Sentinel(_) => 0,
        }
    }
}

struct SentinelState {
    client: SentinelClient,
    config: redis::AsyncConnectionConfig,
    connection: Option<MultiplexedConnection>,
}

/// A multiplexed connection to the primary the sentinels name. A call that fails on the
/// connection (dropped, refused, timed out, or `READONLY` from a demoted primary) drops it,
/// and the next call asks the sentinels again: that is how a failover is followed. The
/// failed call itself goes to the failure policy, as any Redis error does.
#[derive(Clone)]
pub struct SentinelLink {
    state: Arc<tokio::sync::Mutex<SentinelState>>,
}

impl SentinelLink {
    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        let mut state = self.state.lock().await;
        if let Some(c) = &state.connection {
            return Ok(c.clone());
        }
        let config = state.config.clone();
        let c = state
            .client
            .get_async_connection_with_config(&config)
            .await?;
        state.connection = Some(c.clone());
        Ok(c)
    }

    async fn after<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            let stale = e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || e.is_unrecoverable_error()
                || e.code() == Some("READONLY");
            if stale {
                self.state.lock().await.connection = None;
            }
        }
        result
    }
}

impl ConnectionLike for SentinelLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = match self.connection().await {
                Ok(mut c) => c.req_packed_command(cmd).await,
                Err(e) => Err(e),
            };
            self.after(result).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = match self.connection().await {
                Ok(mut c) => c.req_packed_commands(pipeline, offset, count).await,
                Err(e) => Err(e),
            };
            self.after(result).await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// `REDIS_URL` for Sentinel: `primary-name,host:port[,host:port…]` (the sentinels).
fn sentinel_client(settings: &Settings) -> Result<SentinelClient, String> {
    let setup = &settings.redis_setup;
    let mut parts = settings.redis_url.split(',').map(str::trim);
    let name = parts.next().filter(|n| !n.is_empty() && !n.contains(':'));
    let sentinels = parts
        .filter(|p| !p.is_empty())
        .map(|p| {
            host_port(p, "REDIS_URL (a sentinel)")
                .map(|(host, port)| tcp_addr(host, port, setup.tls))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (Some(name), false) = (name, sentinels.is_empty()) else {
        return Err(format!(
            "REDIS_URL must be primary-name,host:port[,host:port...] for REDIS_TYPE=sentinel, \
             not {:?}",
            settings.redis_url
        ));
    };
    if setup.tls_skip_hostname_verification {
        return Err(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION is not supported with REDIS_TYPE=sentinel"
                .to_string(),
        );
    }
    let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    let mut builder = SentinelClientBuilder::new(sentinels, name, SentinelServerType::Master)
        .map_err(|e| format!("REDIS_URL: {e}"))?
        .set_client_to_redis_tcp_settings(tcp.clone())
        .set_client_to_sentinel_tcp_settings(tcp);
    let auth = |b: SentinelClientBuilder, auth: &str, to_sentinel: bool| match (
        auth.split_once(':'),
        to_sentinel,
    ) {
        _ if auth.is_empty() => b,
        (Some((user, password)), false) if !user.is_empty() => b
            .set_client_to_redis_username(user)
            .set_client_to_redis_password(password),
        (Some((user, password)), true) if !user.is_empty() => b
            .set_client_to_sentinel_username(user)
            .set_client_to_sentinel_password(password),
        (_, false) => b.set_client_to_redis_password(auth),
        (_, true) => b.set_client_to_sentinel_password(auth),
    };
    builder = auth(builder, &settings.redis_auth, false);
    builder = auth(builder, &setup.sentinel_auth, true);
    if setup.tls {
        let certs = certificates(setup)?;
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_redis_certificates(certs.clone())
            .set_client_to_sentinel_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_certificates(certs);
    }
    builder.build().map_err(|e| format!("REDIS_URL: {e}"))
}

/// Connects once: the limiter on the Redis the settings name.
///
/// # Errors
/// [`Failed::Setup`] for settings that can never work, [`Failed::Unreachable`] otherwise.
pub async fn connect(settings: &Settings) -> Result<Backend, Failed> {
    let on_error = match settings.on_error {
        Policy::Open => OnError::Open,
        // `error` rides on `closed`: a closed decision means Redis could not decide, and
        // the service turns it into a failed call.
        Policy::Closed | Policy::Error => OnError::Closed,
        Policy::Local => OnError::Local,
    };
    let mut options = Options::new(on_error)
        .instances(settings.instances)
        .timeout(Duration::from_millis(settings.timeout_ms))
        .without_module(if settings.without_module_lua {
            WithoutModule::Lua
        } else {
            WithoutModule::Refuse
        });
    if settings.local_cache_size_in_bytes > 0 {
        // About 128 bytes per remembered key.
        options = options.deny_cache_entries((settings.local_cache_size_in_bytes / 128).max(1));
    }
    let backend = match open(settings, settings.redis_pool_size).await? {
        Opened::Cluster(connection) => Backend::Cluster(AsyncLimiter::new(connection, options)),
        Opened::Single(links) => {
            let pool = Pool::new(links)
                .ok_or_else(|| Failed::Setup("REDIS_POOL_SIZE is 0".to_string()))?;
            Backend::Single(AsyncLimiter::new(pool, options))
        }
    };
    let checked = match &backend {
        Backend::Single(limiter) => limiter.check().await,
        Backend::Cluster(limiter) => limiter.check().await,
    };
    match checked {
        Ok(Some(path)) => tracing::info!(
            "Redis at {} is reached by the {} path",
            settings.redis_url,
            path.as_str()
        ),
        // Down or busy right after connecting: the failure policy covers it, as any outage.
        Ok(None) => {}
        Err(ClientError::Misconfigured(cause)) => {
            return Err(Failed::Setup(format!(
                "Redis at {} is misconfigured for redis-rl-envoy: {cause}",
                settings.redis_url
            )))
        }
        Err(e) => tracing::warn!("checking Redis at {}: {e}", settings.redis_url),
    }
    Ok(backend)
}

/// Why opening a connection to `what` failed: a misconfiguration (a wrong password, the wrong
/// kind of Redis for `REDIS_TYPE`) is a setup that retrying cannot fix; anything else is Redis
/// not answering yet.
fn open_failed(e: redis::RedisError, what: String) -> Failed {
    match redis_rl_client::misconfiguration(&e) {
        Some(cause) => Failed::Setup(format!(
            "{what} is misconfigured for redis-rl-envoy: {cause}"
        )),
        None => Failed::Unreachable(format!("cannot reach {what}: {e}")),
    }
}

/// Connections to the Redis the settings name, made one way for the limiter and for the
/// health probe (TLS, credentials, Sentinel and cluster alike).
pub enum Opened {
    /// `pool_size` links to one server (directly, or the primary Sentinel names).
    Single(Vec<Link>),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Opened {
    /// One `PING` on the first link; false on any error.
    pub async fn ping(&mut self) -> bool {
        let cmd = redis::cmd("PING");
        let reply = match self {
            Opened::Single(links) => match links.first_mut() {
                Some(link) => cmd.query_async::<String>(link).await,
                None => return false,
            },
            Opened::Cluster(c) => cmd.query_async::<String>(c).await,
        };
        reply.is_ok()
    }
}

/// Opens `pool_size` links (or one cluster connection) to the Redis the settings name.
///
/// # Errors
/// [`Failed::Setup`] for settings that can never work, [`Failed::Unreachable`] otherwise.
pub async fn open(settings: &Settings, pool_size: usize) -> Result<Opened, Failed> {
    // The client library's deadline (RL_TIMEOUT_MS) is the one that counts: the redis
    // crate's own response timeout (500 ms by default) would otherwise cut a slow call short
    // with an error of its own. Connecting keeps a bound of its own.
    let response_timeout = Duration::from_millis(settings.timeout_ms.max(1000));
    let connect_timeout = Duration::from_secs(2);
    let unreachable = |e: redis::RedisError| {
        open_failed(e, format!("cannot reach Redis at {}", settings.redis_url))
    };
    if settings.redis_type == "cluster" {
        let infos = settings
            .redis_url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| node_info(settings, u))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failed::Setup)?;
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        let mut builder = redis::cluster::ClusterClient::builder(infos)
            .tcp_settings(tcp)
            .response_timeout(response_timeout)
            .connection_timeout(connect_timeout);
        let setup = &settings.redis_setup;
        if setup.tls {
            if setup.tls_skip_hostname_verification {
                return Err(Failed::Setup(
                    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION is not supported with REDIS_TYPE=cluster"
                        .to_string(),
                ));
            }
            builder = builder
                .tls(TlsMode::Secure)
                .certs(certificates(setup).map_err(Failed::Setup)?);
        }
        let client = builder
            .build()
            .map_err(|e| Failed::Setup(format!("REDIS_URL: {e}")))?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(|e| open_failed(e, format!("the Redis cluster at {}", settings.redis_url)))?;
        return Ok(Opened::Cluster(connection));
    }
    // No retries inside the manager: its own back-off (about 9.5 s of attempts) hid Redis
    // being down at start-up, then gave up; REDIS_STARTUP_* decides that now. After start-up
    // a dropped connection is still made again on the next call.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(connect_timeout))
        .set_number_of_retries(0);
    let mut links = Vec::with_capacity(pool_size);
    if settings.redis_type == "sentinel" {
        let async_config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(response_timeout))
            .set_connection_timeout(Some(connect_timeout));
        for _ in 0..pool_size {
            let mut client = sentinel_client(settings).map_err(Failed::Setup)?;
            let first = client
                .get_async_connection_with_config(&async_config)
                .await
                .map_err(unreachable)?;
            links.push(Link::Sentinel(SentinelLink {
                state: Arc::new(tokio::sync::Mutex::new(SentinelState {
                    client,
                    config: async_config.clone(),
                    connection: Some(first),
                })),
            }));
        }
    } else {
        let address = settings.redis_url.trim();
        let info = node_info(settings, address).map_err(Failed::Setup)?;
        let client =
            redis::Client::open(info).map_err(|e| Failed::Setup(format!("REDIS_URL: {e}")))?;
        for _ in 0..pool_size {
            let manager = client
                .get_connection_manager_with_config(config.clone())
                .await
                .map_err(unreachable)?;
            links.push(Link::Direct(manager));
        }
    }
    Ok(Opened::Single(links))
}

/// The Redis of every limit, and the one of per-second limits when `REDIS_PERSECOND` is on.
pub struct Backends {
    pub main: Backend,
    pub per_second: Option<Backend>,
}

/// The settings of the per-second Redis: the same, its `REDIS_PERSECOND_*` values in place of
/// the `REDIS_*` ones (the TLS certificates are shared, as in the Go service).
fn per_second_settings(settings: &Settings) -> Option<Settings> {
    let ps = settings.redis_setup.per_second.as_ref()?;
    let mut out = settings.clone();
    out.redis_socket_type.clone_from(&ps.socket_type);
    out.redis_type.clone_from(&ps.redis_type);
    out.redis_url.clone_from(&ps.url);
    out.redis_auth.clone_from(&ps.auth);
    out.redis_pool_size = ps.pool_size;
    out.redis_setup.tls = ps.tls;
    out.redis_setup.sentinel_auth.clone_from(&ps.sentinel_auth);
    out.redis_setup.per_second = None;
    Some(out)
}

async fn connect_all(settings: &Settings) -> Result<Backends, Failed> {
    let main = connect(settings).await?;
    let per_second = match per_second_settings(settings) {
        Some(ps) => Some(connect(&ps).await.map_err(|e| match e {
            Failed::Setup(e) => Failed::Setup(format!("REDIS_PERSECOND: {e}")),
            Failed::Unreachable(e) => Failed::Unreachable(format!("REDIS_PERSECOND: {e}")),
        })?),
        None => None,
    };
    Ok(Backends { main, per_second })
}

/// Connects, trying again with a doubling back-off (`REDIS_STARTUP_RETRY_*`) while Redis does
/// not answer; the service listens only once this returns, and the health faces call it not
/// ready until the health probe's first `PING` is answered.
///
/// # Errors
/// A setup that can never work at once; Redis still unreachable after the last attempt.
pub async fn connect_with_retries(settings: &Settings) -> Result<Backends, String> {
    let setup = &settings.redis_setup;
    if setup.pool_on_empty_behavior != "CREATE" {
        // Checked and then said plainly: the Go pool can run out of connections, ours cannot
        // (each connection takes every call in flight), so the choice never comes up.
        tracing::info!(
            "REDIS_POOL_ON_EMPTY_BEHAVIOR={} (wait {} ms) has no effect here: the connections \
             are multiplexed and never run empty; REDIS_TIMEOUT bounds each call",
            setup.pool_on_empty_behavior,
            setup.pool_on_empty_wait_ms
        );
    }
    let mut attempt: u64 = 1;
    let mut delay_ms = setup.startup_initial_interval_ms;
    loop {
        match connect_all(settings).await {
            Ok(backend) => {
                if attempt > 1 {
                    tracing::warn!(
                        "connected to Redis at {} (attempt {attempt})",
                        settings.redis_url
                    );
                }
                return Ok(backend);
            }
            Err(Failed::Setup(e)) => return Err(e),
            Err(Failed::Unreachable(e)) => {
                let last = !setup.startup_retry
                    || (setup.startup_max_attempts > 0 && attempt >= setup.startup_max_attempts);
                if last {
                    return Err(e);
                }
                tracing::warn!("{e}; trying again in {delay_ms} ms (attempt {attempt})");
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                delay_ms = delay_ms
                    .saturating_mul(2)
                    .min(setup.startup_max_interval_ms);
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        crate::config::settings::from_pairs(pairs)
    }

    #[test]
    fn any_password_bytes_are_sent_as_they_are() {
        for auth in ["p#w/rd@x?y%z", "with space", ":leading-colon"] {
            let s = settings(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "h:7"),
                ("REDIS_AUTH", auth),
            ])
            .unwrap();
            let info = node_info(&s, "h:7").unwrap();
            assert_eq!(info.redis_settings().password(), Some(auth), "{auth}");
            assert_eq!(info.redis_settings().username(), None);
        }
        let s = settings(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_AUTH", "alice:s3:cr@t"),
        ])
        .unwrap();
        let info = node_info(&s, "h:7").unwrap();
        assert_eq!(info.redis_settings().username(), Some("alice"));
        assert_eq!(info.redis_settings().password(), Some("s3:cr@t"));
    }

    #[test]
    fn tls_is_honoured_or_refused() {
        let s = settings(&[("REDIS_TLS", "true")]).unwrap();
        let e = node_info(&s, "/tmp/r.sock").unwrap_err();
        assert!(e.starts_with("REDIS_TLS is true"), "{e}");
        let s = settings(&[("REDIS_TLS", "true"), ("REDIS_SOCKET_TYPE", "tcp")]).unwrap();
        let e = node_info(&s, "redis://h:1/").unwrap_err();
        assert!(e.starts_with("REDIS_TLS is true"), "{e}");
        assert!(matches!(
            node_info(&s, "h:1").unwrap().addr(),
            ConnectionAddr::TcpTls { .. }
        ));
        let s = settings(&[
            ("REDIS_TLS", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TLS_CACERT", "/nonexistent/ca.pem"),
        ])
        .unwrap();
        let e = node_info(&s, "h:1").unwrap_err();
        assert!(e.starts_with("REDIS_TLS_CACERT: cannot read"), "{e}");
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("REDIS_TLS", "maybe"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "x"),
            ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "panic"),
            ("REDIS_POOL_ON_EMPTY_WAIT_DURATION", "5"),
            ("REDIS_STARTUP_RETRY_ENABLED", "sometimes"),
            ("REDIS_STARTUP_RETRY_MAX_ATTEMPTS", "-1"),
            ("REDIS_STARTUP_RETRY_INITIAL_INTERVAL", "2h"),
            ("REDIS_STARTUP_RETRY_MAX_INTERVAL", "soon"),
            ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
        ] {
            let e = settings(&[(name, value)]).unwrap_err();
            assert!(e.starts_with(name), "{name}: {e}");
        }
        for (name, value) in [
            ("REDIS_PERSECOND_SOCKET_TYPE", "udp"),
            ("REDIS_PERSECOND_TYPE", "ring"),
            ("REDIS_PERSECOND_POOL_SIZE", "0"),
            ("REDIS_PERSECOND_TLS", "maybe"),
        ] {
            let e = settings(&[("REDIS_PERSECOND", "true"), (name, value)]).unwrap_err();
            assert!(e.starts_with(name), "{name}: {e}");
        }
        // The Go defaults for the second Redis.
        let s = settings(&[("REDIS_PERSECOND", "true")]).unwrap();
        let ps = s.redis_setup.per_second.unwrap();
        assert_eq!(
            (
                ps.socket_type.as_str(),
                ps.redis_type.as_str(),
                ps.pool_size
            ),
            ("unix", "single", 10)
        );
        assert_eq!(ps.url, "/var/run/nutcracker/ratelimitpersecond.sock");
        assert!(settings(&[]).unwrap().redis_setup.per_second.is_none());
        let s = settings(&[("REDIS_POOL_ON_EMPTY_BEHAVIOR", "wait")]).unwrap();
        assert_eq!(s.redis_setup.pool_on_empty_behavior, "WAIT");
    }

    #[test]
    fn sentinel_url_is_a_name_then_sentinels() {
        let s = settings(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,127.0.0.1:26379"),
        ])
        .unwrap();
        assert!(sentinel_client(&s).is_ok());
        for bad in [
            "mymaster",
            "127.0.0.1:26379,127.0.0.1:26380",
            "m,nohost",
            "",
        ] {
            let s = settings(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", bad)]).unwrap();
            let e = sentinel_client(&s).err().unwrap();
            assert!(e.starts_with("REDIS_URL"), "{bad}: {e}");
        }
    }
}
