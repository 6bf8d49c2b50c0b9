//! redis-rl-envoy: Envoy's global rate-limit service
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on exact token buckets in
//! Redis, configured the way envoyproxy/ratelimit is (same YAML, same variables).
//!
//! # Layout
//!
//! One folder per step of a request, each importing only the ones listed before it:
//! `config` where limits and settings come from (`settings` and each part's settings in
//! `config/settings/`, all read through `env`, the YAML `rules` read through `yaml11`, the
//! file `watch`, `xds`); `redis` the store (`setup`: TLS, auth, Sentinel, cluster, retries and
//! the limiter on them; `pool` the multiplexed connections); `telemetry` (`metrics`, `stats`,
//! `logging`); `decision` one call (`call` its entry, `inflight` on `service`, `quota`,
//! `unknown_domains`); `transport` the faces (`grpc`, `http`, `health`, `readiness`). This
//! file wires them: startup, reload (file change, SIGHUP) and drain (SIGTERM). The service
//! never reaches around the client library to Redis.

mod config;
mod decision;
mod redis;
mod telemetry;
mod transport;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::rules::{Config, Source};
use crate::config::settings::Settings;
use crate::config::{settings, watch as config_watch, xds};
use crate::decision::service::Service;
use crate::redis::setup as redis_setup;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::stats;
use crate::transport::readiness::Readiness;
use crate::transport::{grpc, health, http};

// Every call allocates a few dozen small blocks (HTTP/2 frames, the protobuf, the Redis
// reply); glibc's malloc and free were a tenth of the service's CPU in `perf` at 16 streams.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(settings: &Settings) {
    let level = match settings.log_level.as_str() {
        "trace" => tracing::Level::TRACE,
        "debug" => tracing::Level::DEBUG,
        "info" => tracing::Level::INFO,
        "warn" | "warning" => tracing::Level::WARN,
        _ => tracing::Level::ERROR,
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .event_format(crate::telemetry::logging::PeerFormat {
            json: settings.log_format == "json",
            on_error: settings.on_error,
        })
        .init();
}

/// A fingerprint of the config: each file the runtime loader reads (envoyproxy/ratelimit's
/// rules for which files count, `RUNTIME_WATCH_ROOT` included) with a hash of its bytes. A
/// reload happens only when it changes: a log file written under `RUNTIME_ROOT`, or a file
/// rewritten with the same bytes, changes nothing.
fn fingerprint(source: &Source) -> Vec<(PathBuf, Option<u64>)> {
    use std::hash::{Hash, Hasher};
    source
        .files()
        .into_iter()
        .map(|path| {
            let hash = std::fs::read(&path).ok().map(|bytes| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                h.finish()
            });
            (path, hash)
        })
        .collect()
}

/// After a first notification, the quiet time that ends a burst of them (a writer, a
/// symlink swap), and the longest a burst may put a reload off.
const DEBOUNCE_QUIET: Duration = Duration::from_millis(200);
const DEBOUNCE_MAX: Duration = Duration::from_secs(2);

fn reload(service: &Service, readiness: &Readiness, source: &Source, why: &str) {
    let dir = source.config_dir();
    match Config::load(source) {
        Ok(config) => {
            service.metrics.config_load_success.inc();
            tracing::warn!(
                "config reloaded ({why}): {} domain(s) from {}",
                config.domain_count(),
                dir.display()
            );
            readiness.config_loaded(config.domain_count());
            service.replace_config(config);
        }
        Err(e) => {
            service.metrics.config_load_error.inc();
            tracing::error!("config reload refused ({why}), the previous config stays: {e}");
        }
    }
}

/// A warning when the files gave no rule: the service then answers `OK` to every call, so
/// rules mounted where the variables do not point (the peer's image reads
/// `/srv/runtime_data/current` unless `RUNTIME_ROOT` is set) would limit nothing in silence.
/// It names the variables and the directory looked at.
fn warn_if_no_rules(settings: &Settings, dir: &std::path::Path, domains: usize) {
    let vars = format!(
        "RUNTIME_ROOT={:?} RUNTIME_SUBDIRECTORY={:?} RUNTIME_APPDIRECTORY={:?}",
        settings.runtime_root, settings.runtime_subdirectory, settings.runtime_appdirectory
    );
    if !dir.is_dir() {
        tracing::warn!(
            "no config directory at {} ({vars}): no domain is loaded, so every call answers OK and limits nothing",
            dir.display()
        );
    } else if domains == 0 {
        tracing::warn!(
            "no domain in {} ({vars}): every call answers OK and limits nothing",
            dir.display()
        );
    }
}

async fn shutdown_signal(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

fn main() -> ExitCode {
    let settings = match Settings::from_env(|name| std::env::var(name).ok()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("redis-rl-envoy: {e}");
            return ExitCode::from(2);
        }
    };
    let workers = match settings.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // One thread: the current-thread runtime. The multi-thread one runs a task woken by
    // another right after it (its LIFO slot), so each call woke the Redis connection's and
    // the HTTP/2 connection's tasks on its own and every call cost two writes. Here a woken
    // task waits its turn, so the calls that one read brought in go out to Redis in one
    // write, and their responses to Envoy in one. (Tokio keeps turning the LIFO slot off
    // unstable, so more threads keep it.)
    let runtime = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    };
    match runtime {
        Ok(runtime) => runtime.block_on(serve(settings)),
        Err(e) => {
            eprintln!("redis-rl-envoy: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

/// Waits for `work` unless SIGTERM or SIGINT comes first (`None`, logged). A service still
/// waiting for its first config (xDS) or for Redis (`REDIS_STARTUP_*`) must stop when asked:
/// as PID 1 in a container, a process with no handler yet never sees SIGTERM at all.
async fn unless_stopped<F: std::future::Future>(work: F) -> Option<F::Output> {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return Some(work.await);
    };
    tokio::select! {
        out = work => Some(out),
        _ = term.recv() => {
            tracing::warn!("SIGTERM before the service was ready: exiting");
            None
        }
        _ = tokio::signal::ctrl_c() => {
            tracing::warn!("SIGINT before the service was ready: exiting");
            None
        }
    }
}

async fn serve(settings: Arc<Settings>) -> ExitCode {
    init_logging(&settings);
    let mut ignored: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| settings::unsupported(name))
        .collect();
    ignored.sort();
    for name in ignored {
        tracing::warn!(
            "{name} is set but not supported by redis-rl-envoy; it has no effect (see docs/envoy.md)"
        );
    }
    let source = settings.config_source();
    let dir = source.config_dir();
    // xds: over xDS the first config comes from the management server, not the files.
    let (config, mut xds_updates, xds_refused) = match settings.xds.clone() {
        Some(x) => match unless_stopped(xds::start(x, settings.merge_domain_config)).await {
            Some(Some((c, refused, updates))) => (c, Some(updates), refused),
            Some(None) => return ExitCode::from(1),
            None => return ExitCode::SUCCESS,
        },
        None => match Config::load(&source) {
            Ok(c) => (c, None, 0),
            Err(e) => {
                tracing::error!("config refused: {e}");
                eprintln!("redis-rl-envoy: config refused: {e}");
                return ExitCode::from(1);
            }
        },
    };
    let metrics = match Metrics::new() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("redis-rl-envoy: metrics: {e}");
            return ExitCode::from(1);
        }
    };
    metrics.config_load_success.inc();
    metrics.config_load_error.inc_by(xds_refused);
    tracing::info!(
        "loaded {} domain(s) from {}: {:?}",
        config.domain_count(),
        dir.display(),
        config::rules::summary(&config)
    );
    if settings.xds.is_none() {
        warn_if_no_rules(&settings, &dir, config.domain_count());
    }
    let backend = match unless_stopped(redis_setup::connect_with_retries(&settings)).await {
        None => return ExitCode::SUCCESS,
        Some(Ok(b)) => b,
        Some(Err(e)) => {
            tracing::error!("{e}");
            eprintln!("redis-rl-envoy: {e}");
            return ExitCode::from(1);
        }
    };
    // Health (`transport/health.rs`): not serving until Redis answers a probe (and, when asked, a
    // config with a domain has loaded), nor after SIGTERM.
    let readiness = Arc::new(Readiness::new(settings.health.need_config));
    readiness.config_loaded(config.domain_count());
    health::spawn_redis_probe(&settings, readiness.clone());
    let service = Arc::new(
        Service::new(config, backend.main, settings.clone(), metrics)
            .with_per_second(backend.per_second),
    );
    let (stop_tx, stop_rx) = watch::channel(false);

    let grpc_addr = match &settings.health.grpc_uds {
        Some(path) => format!("unix:{path}"),
        None => format!("{}:{}", settings.grpc_host, settings.grpc_port),
    };
    let http_addr = format!("{}:{}", settings.host, settings.port);
    let grpc_listener = match health::bind_grpc(&settings).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("redis-rl-envoy: cannot listen on GRPC {grpc_addr}: {e}");
            return ExitCode::from(1);
        }
    };
    let mut grpc_builder = match health::grpc_builder(&settings.health) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("redis-rl-envoy: {e}");
            return ExitCode::from(1);
        }
    };
    let http_listener = match tokio::net::TcpListener::bind(&http_addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("redis-rl-envoy: cannot listen on HTTP {http_addr}: {e}");
            return ExitCode::from(1);
        }
    };
    let grpc_router = grpc_builder
        .add_service(health::SanGuard::new(
            grpc::Server(service.clone()),
            &settings.health,
        ))
        .add_service(health::SanGuard::new(
            health::grpc_service(readiness.clone()).await,
            &settings.health,
        ));
    let http = axum::serve(
        http_listener,
        http::router(service.clone()).merge(health::http_router(readiness.clone())),
    )
    .with_graceful_shutdown(shutdown_signal(stop_rx.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    let grpc_stop = shutdown_signal(stop_rx.clone());
    match grpc_listener {
        health::GrpcListener::Tcp(listener) => {
            let grpc = grpc_router
                .serve_with_incoming_shutdown(tokio_stream_incoming(listener), grpc_stop);
            tasks.spawn(async move { grpc.await.map_err(|e| format!("gRPC server: {e}")) });
        }
        health::GrpcListener::Unix(listener) => {
            let grpc = grpc_router.serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                grpc_stop,
            );
            tasks.spawn(async move { grpc.await.map_err(|e| format!("gRPC server: {e}")) });
        }
    }
    tasks.spawn(async move { http.await.map_err(|e| format!("HTTP server: {e}")) });
    // DISABLE_STATS is the peer's null sink: no Prometheus page either.
    if settings.use_prometheus && !settings.stats.disabled {
        let addr = settings.prometheus_bind();
        match tokio::net::TcpListener::bind(&addr).await {
            Ok(listener) => {
                let page = axum::serve(
                    listener,
                    http::metrics_router(service.clone(), &settings.prometheus_path),
                )
                .with_graceful_shutdown(shutdown_signal(stop_rx.clone()));
                tasks.spawn(async move { page.await.map_err(|e| format!("metrics server: {e}")) });
            }
            Err(e) => {
                eprintln!("redis-rl-envoy: cannot listen on PROMETHEUS_ADDR {addr}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    tracing::warn!("listening: gRPC {grpc_addr}, HTTP {http_addr}");
    // stats: the statsd sink stops after the calls in flight are answered, so
    // its last flush counts them; the debug pages fail alone, as the peer's do.
    let (stats_stop_tx, stats_stop_rx) = watch::channel(false);
    let stats_task = tokio::spawn(stats::run(
        settings.stats.clone(),
        service.metrics.clone(),
        stats_stop_rx,
    ));
    stats_debug(&settings, &service, stop_rx.clone()).await;

    // Reload on a file change (a filesystem notification, or the poll each second as the
    // fallback) and on SIGHUP; drain and stop on SIGTERM or SIGINT.
    let watcher = if let Some(updates) = xds_updates.take() {
        tokio::spawn(apply_xds(service.clone(), readiness.clone(), updates))
    } else {
        let service = service.clone();
        let readiness = readiness.clone();
        let dir = dir.clone();
        let source = source.clone();
        let root = PathBuf::from(&settings.runtime_root);
        let targets = config_watch::targets(&dir, &root, settings.runtime_watch_root);
        tokio::spawn(async move {
            let changed = Arc::new(tokio::sync::Notify::new());
            let mut notifications = config_watch::start(&targets, changed.clone());
            if let Some(w) = &notifications {
                tracing::info!("watching {:?} for config changes", w.watched);
            }
            let mut last = fingerprint(&source);
            let mut hup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            loop {
                let hangup = async {
                    match hup.as_mut() {
                        Some(s) => {
                            s.recv().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                let notified = tokio::select! {
                    _ = hangup => {
                        reload(&service, &readiness, &source, "SIGHUP");
                        continue;
                    }
                    _ = changed.notified() => {
                        // A writer (or a symlink swap) usually comes as a burst of events:
                        // wait until it has been quiet for DEBOUNCE_QUIET, so the reload
                        // reads whole files and a burst is one reload.
                        let burst = Instant::now();
                        while burst.elapsed() < DEBOUNCE_MAX
                            && tokio::time::timeout(DEBOUNCE_QUIET, changed.notified())
                                .await
                                .is_ok()
                        {}
                        true
                    }
                    _ = tokio::time::sleep(Duration::from_secs(1)) => false,
                };
                let now = fingerprint(&source);
                if now != last {
                    last = now;
                    reload(&service, &readiness, &source, "a file changed");
                    // A swapped symlink or a recreated directory holds new inodes: watch
                    // those from now on.
                    notifications =
                        config_watch::start(&targets, changed.clone()).or(notifications);
                } else if !notified && notifications.is_none() {
                    notifications = config_watch::start(&targets, changed.clone());
                }
            }
        })
    };
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("redis-rl-envoy: SIGTERM handler: {e}");
            return ExitCode::from(1);
        }
    };
    let mut failed = false;
    tokio::select! {
        _ = term.recv() => tracing::warn!("SIGTERM: draining calls in flight"),
        _ = tokio::signal::ctrl_c() => tracing::warn!("SIGINT: draining calls in flight"),
        done = tasks.join_next() => {
            if let Some(Ok(Err(e))) = done {
                tracing::error!("{e}");
                failed = true;
            }
        }
    }
    // Not serving from here on; the listeners stay open RL_DRAIN_DELAY_MS longer so the
    // health checks see it before connections are refused.
    readiness.set_draining();
    if settings.health.drain_delay_ms > 0 && !failed {
        tokio::time::sleep(Duration::from_millis(settings.health.drain_delay_ms)).await;
    }
    watcher.abort();
    let _ = stop_tx.send(true);
    // Calls in flight end within their deadline; a stream that never ends (a health
    // `Watch`) must not hold the exit back longer than that.
    let drain_bound = Duration::from_millis(settings.timeout_ms.saturating_add(1_000));
    let drained = tokio::time::timeout(drain_bound, async {
        while let Some(done) = tasks.join_next().await {
            if let Ok(Err(e)) = done {
                tracing::error!("{e}");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("drain: streams still open after {drain_bound:?}; closing them");
    }
    let _ = stats_stop_tx.send(true);
    let _ = stats_task.await;
    health::remove_socket(&settings.health);
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The DEBUG_PORT listener (`/`, `/rlconfig`, `/stats`); a port that cannot be bound is an
/// error in the log, and the service runs on without it, as the peer's does.
async fn stats_debug(settings: &Settings, service: &Arc<Service>, stop: watch::Receiver<bool>) {
    let addr = stats::debug_bind(&settings.stats);
    match tokio::net::TcpListener::bind(&addr).await {
        Ok(listener) => {
            let page = axum::serve(
                listener,
                crate::transport::debug::debug_router(service.clone()),
            )
            .with_graceful_shutdown(shutdown_signal(stop));
            tokio::spawn(async move {
                if let Err(e) = page.await {
                    tracing::error!("debug server: {e}");
                }
            });
        }
        Err(e) => tracing::error!("cannot listen for debug on DEBUG_PORT {addr}: {e}"),
    }
}

/// The gRPC listener as the stream of connections tonic serves, each with TCP_NODELAY: tonic
/// sets it only on listeners it binds itself, and without it Nagle's algorithm and delayed
/// ACKs hold each small reply back about 40 ms.
fn tokio_stream_incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = Result<tokio::net::TcpStream, std::io::Error>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY: {e}");
            }
        })
    })
}

/// Applies each update to `service` (the swap is one pointer store: a call sees the old
/// config or the new one, never a mix), tells `readiness` (as a file reload does) and counts
/// it in the config-load metrics.
async fn apply_xds(
    service: Arc<Service>,
    readiness: Arc<Readiness>,
    mut updates: tokio::sync::mpsc::Receiver<xds::Update>,
) {
    // The file watcher owns SIGHUP otherwise; over xDS there is nothing to re-read, and the
    // signal's default action would end the process.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let hangup = async {
            match hup.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = hangup => tracing::warn!("SIGHUP: the config comes over xDS; nothing to reload"),
            update = updates.recv() => {
                let Some(update) = update else { return };
                match update.config {
                    Ok(config) => {
                        service.metrics.config_load_success.inc();
                        // As a file reload does: HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
                        // counts a pushed config too.
                        readiness.config_loaded(config.domain_count());
                        service.replace_config(config);
                    }
                    Err(_) => service.metrics.config_load_error.inc(),
                }
                let _ = update.applied.send(());
            }
        }
    }
}
