//! `make bench-envoy`: what redis-rl-envoy costs. In one run, on one Redis with the module:
//!
//! - `ShouldRateLimit` decisions/s and p50/p99 over gRPC (one HTTP/2 connection, as an Envoy
//!   worker holds) at 1, 16 and 64 concurrent streams, against the Rust client calling
//!   `RL.ACQUIRE` directly (one multiplexed connection) at the same concurrency;
//! - the service's CPU per 10,000 decisions, from its threads' `schedstat`, and its Redis's;
//! - the same load on a peer, Kuadrant's limitador-server (`redis` storage, on the same Redis,
//!   pinned like the service), with the closest limit it has (a fixed window of N per second
//!   where the service has a token bucket of N per second);
//! - the hot path's CPU per decision with the module against the Lua script: the service
//!   again, on a second Redis (same binary, same CPU) without the module;
//! - Envoy's requests/s end to end, with the rate-limit filter on and off.
//!
//! Two CPUs, so: the services alone on CPU 1; Redis on CPU 0; and this driver (the load
//! generator, and the Envoy it starts) on CPU 0 beside Redis, where it hurts least, since
//! Redis needs far less CPU per decision than the service. A floating load generator would
//! take CPU from the service on the gRPC rounds and give the direct rounds a second CPU, so
//! the ratio would measure the scheduler. The direct path runs on CPU 0 alone: it is what
//! an application spends without the service, and the service's own CPU is its cost.
//! Rounds are interleaved (service, direct, Lua path, peer, service, direct …) and each
//! figure is the median of three. Only one service has load at a time; the others idle.
//! Before any round, each service must count (a probe domain of one call a minute answers
//! OK, then OVER_LIMIT), and every measured call must answer OK: a peer that matched no
//! limit would answer OK without touching Redis and look fast. The markdown goes to
//! `--out` with each round's raw figures, and the budgets' verdicts to stdout too.
//!
//! Environment: `MODULE` (the module .so), `ENVOY` (the envoy binary), `REDIS_SERVER`,
//! `SECONDS_PER_ROUND` (default 5), `SERVICE` (default: redis-rl-envoy beside this binary),
//! `LIMITADOR_BIN` (the peer's built limitador-server; unset or empty skips its rows, with
//! `LIMITADOR_SKIP` as the reason written into the results),
//! `PEER_GRPC` (`host:port` of a rate-limit service already running, benched beside the
//! others: envoyproxy/ratelimit, limitador, a team's own; it must hold the config
//! `envoy-bench --write-config DIR` writes), `PEER_NAME` (its label), `PEER_PID` (its
//! process, when local, for its CPU; else its CPU rows say n/a), `PEER_REDIS` (`host:port` of
//! its Redis, for its Redis CPU from `INFO cpu` and the memory row; else those say n/a),
//! `MEMORY_USERS` (distinct users of the memory row, default 2000),
//! `SERVICE_CPU` (the services' taskset list, default `1`), `REDIS_CPU` (default `0`),
//! `LOAD_CPU` (this driver's and Envoy's, default `0`; empty leaves it unpinned),
//! `REDIS_POOL_SIZE` (the service's, default 10); for profiling, `STREAMS` (a comma list,
//! default `1,16,64`), `SKIP_ENVOY=1` and `SKIP_LUA=1`.

use std::error::Error;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use redis_rl_client::{AsyncLimiter, Limit, OnError, Options};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::transport::Channel;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Keys the load spreads over, so no bucket runs dry (each allows far more than a round).
const KEYS: usize = 10_000;

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Res<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn pinned(cpu: &str, program: &str) -> Command {
    let mut c = Command::new("taskset");
    c.args(["-c", cpu, program]);
    c
}

async fn wait_port(port: u16) -> Res<()> {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(format!("nothing listens on {port}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Latencies of one round and the calls it made.
struct Round {
    calls: u64,
    seconds: f64,
    latencies_us: Vec<u64>,
}

impl Round {
    fn per_s(&self) -> f64 {
        self.calls as f64 / self.seconds
    }

    fn percentile(&self, p: f64) -> u64 {
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1));
        v.get(i).copied().unwrap_or(0)
    }
}

/// Runs `streams` loops of `call` for `seconds`; each call's latency is recorded.
async fn round<F, Fut>(streams: usize, seconds: f64, call: F) -> Res<Round>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Res<()>> + Send,
{
    let call = Arc::new(call);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for stream in 0..streams {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n: u64 = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                call(stream, n).await?;
                latencies.push(t.elapsed().as_micros() as u64);
                n += 1;
            }
            Ok::<_, Box<dyn Error + Send + Sync>>(latencies)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(Round {
        calls: all.len() as u64,
        seconds: started.elapsed().as_secs_f64(),
        latencies_us: all,
    })
}

/// CPU time `pid` has used, in ns, summed over its threads: each thread's
/// `/proc/<pid>/task/<tid>/schedstat` (the scheduler's exact run time, where utime + stime
/// are sampled at the tick).
fn cpu_ns(pid: u32) -> Res<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread that ended between the listing and the read counts nothing.
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let ns: u64 = text.split_whitespace().next().ok_or("schedstat")?.parse()?;
        total = total.saturating_add(ns);
    }
    Ok(total)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn request(stream: usize, n: u64) -> RateLimitRequest {
    let key = (stream * 7919 + n as usize) % KEYS;
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: key.to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// What sets this run's users apart from an earlier run's on a service (and Redis) that
/// outlives it: the process id and the start time.
fn run_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos}", std::process::id())
    })
}

/// The probe: a domain of one call a minute per user, in every service's config. Its user
/// is this run's, so a service that a previous run probed less than a minute ago passes.
fn probe_request() -> RateLimitRequest {
    let mut r = request(0, 0);
    r.domain = "probe".into();
    if let Some(d) = r.descriptors.first_mut() {
        if let Some(e) = d.entries.first_mut() {
            e.value = format!("probe-{}", run_id());
        }
    }
    r
}

/// The config every benched service holds, one file per domain as envoyproxy/ratelimit
/// reads them: the load's domain (never denies it), the probe, and the memory row's domain
/// (ten an hour, so each user's counter outlives the measurement on every service).
const CONFIG_FILES: [(&str, &str); 3] = [
    (
        "bench.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n",
    ),
    (
        "probe.yaml",
        "domain: probe\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    ),
    (
        "memory.yaml",
        "domain: memory\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    ),
];

fn write_config(dir: &std::path::Path) -> Res<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in CONFIG_FILES {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

/// A Redis's counter from `INFO <section>` (`used_memory`, `used_cpu_user` …).
async fn info_field(
    redis: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> Res<f64> {
    let text: String = redis::cmd("INFO").arg(section).query_async(redis).await?;
    text.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.strip_prefix(':')))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("INFO {section} has no {field}").into())
}

/// A Redis's memory for its data: `used_memory` without its clients' buffers
/// (`mem_clients_normal`), which Redis grows and trims as connections come and go idle, so a
/// growth in it is the keys' (their values, their expiry and the dictionaries' entries).
async fn memory(redis: &mut redis::aio::MultiplexedConnection) -> Res<f64> {
    Ok(info_field(redis, "memory", "used_memory").await?
        - info_field(redis, "memory", "mem_clients_normal").await?)
}

/// [`memory`] once it stops moving (two reads 100 ms apart within 1 KB, for at most 3 s):
/// a Redis that has just answered the probe is still expiring and freeing what the load's
/// and the probe's calls left.
async fn settled_memory(redis: &mut redis::aio::MultiplexedConnection) -> Res<f64> {
    let mut last = memory(redis).await?;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = memory(redis).await?;
        if (now - last).abs() < 1024.0 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// CPU ms per 10,000 decisions, or n/a (NaN) where the process could not be read.
fn ms(v: f64) -> String {
    if v.is_nan() {
        "n/a".into()
    } else {
        format!("{v:.0}")
    }
}

/// One `ShouldRateLimit` call's overall code; an unknown code is an error.
async fn decide(client: &mut RateLimitServiceClient<Channel>, req: RateLimitRequest) -> Res<Code> {
    let code = client
        .should_rate_limit(req)
        .await?
        .into_inner()
        .overall_code;
    Code::try_from(code).map_err(|_| format!("unknown overall_code {code}").into())
}

/// A rate-limit service under load: redis-rl-envoy on the module or on the Lua path, or
/// the peer.
struct Rls {
    label: String,
    client: RateLimitServiceClient<Channel>,
    /// The service's process, for its CPU: none for a service given by address alone.
    pid: Option<u32>,
    /// Its Redis's process, for Redis's CPU; without it, Redis's `INFO cpu`.
    redis_pid: Option<u32>,
    /// Its Redis's `host:port`, for `INFO` (the memory row); none when not given.
    redis_addr: Option<String>,
    /// The processes this run started, stopped when it ends.
    _guard: Option<Guard>,
}

impl Rls {
    /// Connects to `grpc_port` and checks that the service counts before anything is
    /// measured: the load's domain answers OK, and the probe domain (one call a minute)
    /// answers OK, then OVER_LIMIT. A service that matched no limit answers OK to both.
    async fn connect(label: &str, guard: Guard, grpc_port: u16, redis_pid: u32) -> Res<Self> {
        let mut rls = Self::connect_to(label, &format!("127.0.0.1:{grpc_port}")).await?;
        rls.pid = Some(guard.0.id());
        rls.redis_pid = Some(redis_pid);
        rls._guard = Some(guard);
        Ok(rls)
    }

    /// As [`Rls::connect`] for a service this run did not start, at `addr` (`host:port`).
    async fn connect_to(label: &str, addr: &str) -> Res<Self> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await
            .map_err(|e| format!("{label} at {addr}: {e}"))?;
        let mut client = RateLimitServiceClient::new(channel);
        let load = decide(&mut client, request(0, 0)).await?;
        let first = decide(&mut client, probe_request()).await?;
        let second = decide(&mut client, probe_request()).await?;
        if (load, first, second) != (Code::Ok, Code::Ok, Code::OverLimit) {
            return Err(format!(
                "{label} does not count: the load's domain answered {load:?}, the probe \
                 (one call a minute) {first:?} then {second:?}, not Ok, Ok, OverLimit"
            )
            .into());
        }
        Ok(Self {
            label: label.into(),
            client,
            pid: None,
            redis_pid: None,
            redis_addr: None,
            _guard: None,
        })
    }

    /// A connection to the service's Redis, when its address is known.
    async fn redis(&self) -> Res<Option<redis::aio::MultiplexedConnection>> {
        let Some(addr) = &self.redis_addr else {
            return Ok(None);
        };
        let c = redis::Client::open(format!("redis://{addr}/"))?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("{}: its Redis at {addr}: {e}", self.label))?;
        Ok(Some(c))
    }

    /// Redis's CPU so far in ns: its threads' `schedstat` when the process is local, else
    /// `INFO cpu` (user + system, µs resolution); none without either.
    async fn redis_cpu_ns(
        &self,
        info: &mut Option<redis::aio::MultiplexedConnection>,
    ) -> Res<Option<u64>> {
        if let Some(pid) = self.redis_pid {
            return Ok(Some(cpu_ns(pid)?));
        }
        let Some(c) = info.as_mut() else {
            return Ok(None);
        };
        let seconds = info_field(c, "cpu", "used_cpu_user").await?
            + info_field(c, "cpu", "used_cpu_sys").await?;
        Ok(Some((seconds * 1e9) as u64))
    }

    /// Redis bytes per limited user: `used_memory`'s growth on the service's Redis while
    /// `users` distinct users (this run's) each make one call to the memory domain, which
    /// must answer OK. None when the Redis's address is not known.
    async fn bytes_per_user(&self, users: usize) -> Res<Option<(f64, f64)>> {
        let Some(mut info) = self.redis().await? else {
            return Ok(None);
        };
        let before = settled_memory(&mut info).await?;
        let mut client = self.client.clone();
        for i in 0..users {
            let mut r = request(0, 0);
            r.domain = "memory".into();
            if let Some(e) = r
                .descriptors
                .first_mut()
                .and_then(|d| d.entries.first_mut())
            {
                e.value = format!("mem-{}-{i}", run_id());
            }
            let code = decide(&mut client, r).await?;
            if code != Code::Ok {
                return Err(format!("{}: the memory domain answered {code:?}", self.label).into());
            }
        }
        let after = memory(&mut info).await?;

        let growth = after - before;
        Ok(Some((growth, growth / users.max(1) as f64)))
    }

    /// One round of `streams` callers: the round, and the CPU the service and its Redis
    /// used in it, each in ms per 10,000 decisions. Every call must answer OK.
    async fn round(&self, streams: usize, seconds: f64) -> Res<(Round, f64, f64)> {
        let mut info = if self.redis_pid.is_none() {
            self.redis().await?
        } else {
            None
        };
        let service_before = self.pid.map(cpu_ns).transpose()?;
        let redis_before = self.redis_cpu_ns(&mut info).await?;
        let client = self.client.clone();
        let r = round(streams, seconds, move |s, n| {
            let mut client = client.clone();
            async move {
                match decide(&mut client, request(s, n)).await? {
                    Code::Ok => Ok(()),
                    other => Err(format!("a measured call answered {other:?}").into()),
                }
            }
        })
        .await
        .map_err(|e| format!("{}: {e}", self.label))?;
        let per_10k = |ns: u64| ns as f64 / 1e6 * 10_000.0 / r.calls.max(1) as f64;
        // n/a (NaN) where the process is not known: see `ms`.
        let service = match (self.pid, service_before) {
            (Some(pid), Some(before)) => per_10k(cpu_ns(pid)?.saturating_sub(before)),
            _ => f64::NAN,
        };
        let redis = match (self.redis_cpu_ns(&mut info).await?, redis_before) {
            (Some(after), Some(before)) => per_10k(after.saturating_sub(before)),
            _ => f64::NAN,
        };
        Ok((r, service, redis))
    }
}

/// A redis-server on `cpu`, with the module when `module` is given.
async fn start_redis(redis_server: &str, cpu: &str, module: Option<&str>) -> Res<(Guard, u16)> {
    let port = free_port()?;
    let mut command = pinned(cpu, redis_server);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"]);
    if let Some(module) = module {
        command.args(["--loadmodule", module]);
    }
    let guard = Guard(command.stdout(Stdio::null()).spawn()?);
    wait_port(port).await?;
    Ok((guard, port))
}

/// Ports of a started redis-rl-envoy.
struct ServicePorts {
    grpc: u16,
    metrics: u16,
}

/// redis-rl-envoy on `cpu` with the config in `dir`, on the Redis at `redis_port`.
async fn start_service(
    service_bin: &std::path::Path,
    cpu: &str,
    dir: &std::path::Path,
    redis_port: u16,
) -> Res<(Guard, ServicePorts)> {
    start_service_with(service_bin, cpu, dir, redis_port, "keys").await
}

/// [`start_service`] with its buckets stored as `storage` says (`RL_BUCKET_STORAGE`).
async fn start_service_with(
    service_bin: &std::path::Path,
    cpu: &str,
    dir: &std::path::Path,
    redis_port: u16,
    storage: &str,
) -> Res<(Guard, ServicePorts)> {
    let (http_port, grpc_port, metrics_port) = (free_port()?, free_port()?, free_port()?);
    let guard = Guard(
        pinned(cpu, &service_bin.to_string_lossy())
            .env("RL_BUCKET_STORAGE", storage)
            .env("RUNTIME_ROOT", dir)
            .env("RUNTIME_APPDIRECTORY", "config")
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", format!("127.0.0.1:{redis_port}"))
            .env("PORT", http_port.to_string())
            .env("GRPC_PORT", grpc_port.to_string())
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_PORT", free_port()?.to_string())
            .env("RL_TIMEOUT_MS", "5000")
            .env(
                "REDIS_POOL_SIZE",
                std::env::var("REDIS_POOL_SIZE").unwrap_or_else(|_| "10".into()),
            )
            .env("USE_PROMETHEUS", "true")
            .env("PROMETHEUS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .stdout(Stdio::null())
            .spawn()?,
    );
    wait_port(grpc_port).await?;
    wait_port(http_port).await?;
    Ok((
        guard,
        ServicePorts {
            grpc: grpc_port,
            metrics: metrics_port,
        },
    ))
}

/// limitador's limits: the closest to the service's config. Its counters are fixed windows,
/// so "N per second" is at most N in each whole second, where the service's token bucket
/// refills one token every 1/N s; at N = 10^9 neither denies the load, so both take the
/// allowed path every call.
const LIMITADOR_LIMITS: &str = "---
- namespace: edge
  max_value: 1000000000
  seconds: 1
  conditions: []
  variables:
    - descriptors[0]['user']
- namespace: probe
  max_value: 1
  seconds: 60
  conditions: []
  variables:
    - descriptors[0]['user']
- namespace: memory
  max_value: 10
  seconds: 3600
  conditions: []
  variables:
    - descriptors[0]['user']
";

/// limitador-server on `cpu`, its counters in the Redis at `redis_port` (`redis` storage:
/// every decision goes to Redis, as the service's do). Its log goes to `dir`.
async fn start_limitador(
    bin: &str,
    cpu: &str,
    dir: &std::path::Path,
    redis_port: u16,
) -> Res<(Guard, u16)> {
    let limits = dir.join("limitador.yaml");
    std::fs::write(&limits, LIMITADOR_LIMITS)?;
    let (grpc_port, http_port) = (free_port()?, free_port()?);
    let log = dir.join("limitador.log");
    let mut guard = Guard(
        pinned(cpu, bin)
            .args(["-b", "127.0.0.1", "-p", &grpc_port.to_string()])
            .args(["-B", "127.0.0.1", "-P", &http_port.to_string()])
            .arg(&limits)
            .args(["redis", &format!("redis://127.0.0.1:{redis_port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?,
    );
    // It exits at once on a bad limits file or an unreachable Redis: say so with its log,
    // rather than wait out the port's deadline.
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", grpc_port))
        .await
        .is_err()
    {
        let exited = guard.0.try_wait()?;
        if exited.is_some() || started.elapsed() > Duration::from_secs(30) {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let what = exited.map_or("nothing listens on its port after 30 s".to_string(), |s| {
                format!("it exited ({s})")
            });
            return Err(format!("limitador-server ({bin}): {what}; its log: {said}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((guard, grpc_port))
}

/// A keep-alive HTTP/1.1 GET loop body: one request, the whole reply read.
async fn http_get(
    stream: &mut BufReader<tokio::net::TcpStream>,
    path: &str,
    user: usize,
) -> Res<u16> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nx-user: {user}\r\n\r\n");
    stream.get_mut().write_all(req.as_bytes()).await?;
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    let status: u16 = line.split_whitespace().nth(1).ok_or("status")?.parse()?;
    let mut length = 0usize;
    loop {
        line.clear();
        stream.read_line(&mut line).await?;
        let t = line.trim_end();
        if t.is_empty() {
            break;
        }
        if let Some((k, v)) = t.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse()?;
            }
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await?;
    Ok(status)
}

/// The service's own view: mean time per call inside the service and inside Redis, from its
/// Prometheus histograms (cumulative since start).
/// The service's own histograms, summed since it started: (seconds answering calls,
/// seconds waiting for Redis, calls). Zero when the metrics page cannot be read.
async fn service_sums(metrics_port: u16) -> (f64, f64, f64) {
    let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", metrics_port)).await else {
        return (0.0, 0.0, 0.0);
    };
    let mut stream = BufReader::new(stream);
    let req = "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
    if stream.get_mut().write_all(req.as_bytes()).await.is_err() {
        return (0.0, 0.0, 0.0);
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text).await;
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    (
        value("ratelimit_service_response_time_seconds_sum"),
        value("redis_rl_envoy_redis_seconds_sum"),
        value("ratelimit_service_response_time_seconds_count"),
    )
}

async fn upstream() -> Res<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut reader = BufReader::new(socket);
                let mut line = String::new();
                loop {
                    let mut seen = false;
                    loop {
                        line.clear();
                        match reader.read_line(&mut line).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        if line.trim_end().is_empty() {
                            if seen {
                                break;
                            }
                            continue;
                        }
                        seen = true;
                    }
                    let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                    if reader.get_mut().write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

/// The tests' Envoy config (`envoy/tests/envoy-template.yaml`) with two routes: one behind
/// the rate-limit filter (one request_headers descriptor), one without.
const ROUTES: &str = r#"              - match: {prefix: "/limited"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
              - match: {prefix: "/"}
                route: {cluster: upstream}
"#;

/// The peer panel's colours: redis-rl-envoy on the module (as the gRPC bars), then the
/// others in the order they run (the Lua path, limitador).
const PEER_COLOURS: [&str; 3] = ["#3b6fb6", "#9a9a9a", "#4f9a5b"];

/// One round's raw figures, a row of the results' last table.
fn raw_row(
    streams: usize,
    rep: usize,
    path: &str,
    r: &Round,
    cpu_ms: Option<(f64, f64)>,
) -> String {
    let one = |v: f64| {
        if v.is_nan() {
            "n/a".to_string()
        } else {
            format!("{v:.1}")
        }
    };
    let (service, redis) = cpu_ms.map_or((String::new(), String::new()), |(s, r)| (one(s), one(r)));
    format!(
        "| {streams} | {rep} | {path} | {} | {:.2} | {:.0} | {} | {} | {service} | {redis} |\n",
        r.calls,
        r.seconds,
        r.per_s(),
        r.percentile(0.5),
        r.percentile(0.99),
    )
}

/// One concurrency's CPU per decision, in µs as (service, Redis): redis-rl-envoy on the
/// module and on the Lua path.
struct HotPath {
    streams: usize,
    module_us: (f64, f64),
    lua_us: (f64, f64),
}

/// One concurrency's medians, for the chart.
struct ChartRow {
    streams: usize,
    grpc_per_s: f64,
    direct_per_s: f64,
    grpc_p50_us: f64,
    direct_p50_us: f64,
    /// The service's mean wait for Redis per gRPC call.
    redis_wait_us: f64,
}

/// Horizontal bars, one panel per measure: decisions/s and p50 by concurrency (gRPC against
/// direct), then Envoy's requests/s with the filter on and off. Plain SVG, no dependency,
/// in the style of `bench/chart.svg`.
fn chart_svg(rows: &[ChartRow], peers: &[(String, f64, &str)], envoy: &[(&str, f64)]) -> String {
    const GRPC: &str = "#3b6fb6";
    const DIRECT: &str = "#e0873a";
    // Wide enough for "64 streams, redis-rl-envoy, Lua path".
    const LEFT: f64 = 290.0;
    const WIDTH: f64 = 500.0;
    const BAR: f64 = 16.0;
    let mut body = String::new();
    let mut y = 92.0;
    let mut panel = |title: &str, unit: &str, bars: &[(String, f64, &str)], body: &mut String| {
        let max = bars.iter().map(|b| b.1).fold(1.0, f64::max);
        body.push_str(&format!(
            "<text x=\"16\" y=\"{y}\" font-weight=\"bold\">{title}</text>\n"
        ));
        y += 10.0;
        for (label, value, colour) in bars {
            let w = WIDTH * value / max;
            body.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{label}</text>\n\
                 <rect x=\"{LEFT}\" y=\"{y}\" width=\"{w:.1}\" height=\"{BAR}\" fill=\"{colour}\"/>\n\
                 <text x=\"{:.1}\" y=\"{}\" fill=\"#333\">{value:.0} {unit}</text>\n",
                LEFT - 8.0,
                y + 12.0,
                LEFT + w + 6.0,
                y + 12.0,
            ));
            y += BAR + 6.0;
        }
        y += 24.0;
    };
    let mut rates = Vec::new();
    let mut p50s = Vec::new();
    for r in rows {
        rates.push((format!("{} streams, gRPC", r.streams), r.grpc_per_s, GRPC));
        rates.push((
            format!("{} streams, direct", r.streams),
            r.direct_per_s,
            DIRECT,
        ));
        p50s.push((format!("{} streams, gRPC", r.streams), r.grpc_p50_us, GRPC));
        p50s.push((
            format!("{} streams, direct", r.streams),
            r.direct_p50_us,
            DIRECT,
        ));
    }
    panel("Decisions per second", "/s", &rates, &mut body);
    panel("p50 latency", "µs", &p50s, &mut body);
    if !peers.is_empty() {
        panel(
            "Decisions per second: module, Lua path and the peer (limitador)",
            "/s",
            peers,
            &mut body,
        );
    }
    let routes: Vec<(String, f64, &str)> = envoy
        .iter()
        .map(|&(label, rate)| (format!("Envoy, {label}"), rate, GRPC))
        .collect();
    if !routes.is_empty() {
        panel(
            "Envoy end to end, requests per second",
            "/s",
            &routes,
            &mut body,
        );
    }
    let height = y + 8.0;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"{height}\" \
         viewBox=\"0 0 900 {height}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" \
         font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"16\" y=\"28\" font-size=\"18\" font-weight=\"bold\">redis-rl-envoy: \
         ShouldRateLimit over gRPC against RL.ACQUIRE direct</text>\n\
         <rect x=\"16\" y=\"44\" width=\"14\" height=\"14\" fill=\"{GRPC}\"/>\n\
         <text x=\"36\" y=\"56\">through redis-rl-envoy (gRPC)</text>\n\
         <rect x=\"270\" y=\"44\" width=\"14\" height=\"14\" fill=\"{DIRECT}\"/>\n\
         <text x=\"290\" y=\"56\">the Rust client, direct</text>\n{body}</svg>\n"
    )
}

fn main() -> Res<()> {
    // Pinned before the runtime starts, so its threads inherit the CPU (and tokio sizes its
    // workers to it).
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load_cpu = std::env::var("LOAD_CPU").unwrap_or_else(|_| "0".into());
    if !load_cpu.is_empty() {
        let pinned = Command::new("taskset")
            .args(["-cp", &load_cpu, &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status()?;
        if !pinned.success() {
            return Err(format!("taskset -cp {load_cpu} failed").into());
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(&load_cpu, cpus))
}

async fn run(load_cpu: &str, cpus: usize) -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "bench/envoy.md".into());
    // `--write-config DIR`: the config a service given by PEER_GRPC must hold, then exit.
    if let Some(dir) = args
        .iter()
        .position(|a| a == "--write-config")
        .and_then(|i| args.get(i + 1))
    {
        write_config(std::path::Path::new(dir))?;
        println!(
            "wrote {} into {dir}",
            CONFIG_FILES.map(|(n, _)| n).join(", ")
        );
        return Ok(());
    }
    let seconds: f64 = std::env::var("SECONDS_PER_ROUND")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let module = std::env::var("MODULE").map_err(|_| "MODULE (the module .so) is not set")?;
    let envoy_bin = std::env::var("ENVOY").unwrap_or_else(|_| "envoy".into());
    let redis_server = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let service_bin = match std::env::var("SERVICE") {
        Ok(s) => PathBuf::from(s),
        Err(_) => std::env::current_exe()?.with_file_name("redis-rl-envoy"),
    };
    let limitador_bin = std::env::var("LIMITADOR_BIN").unwrap_or_default();
    // A binary that was named must be there: a typo is an error, not a skipped row.
    if !limitador_bin.is_empty() && !std::path::Path::new(&limitador_bin).is_file() {
        return Err(format!("LIMITADOR_BIN={limitador_bin}: no such file").into());
    }
    let dir = std::env::temp_dir().join(format!("envoy-bench-{}", std::process::id()));
    // With the probe every service must pass before it is measured (see `Rls::connect`).
    write_config(&dir.join("config"))?;
    let redis_cpu = std::env::var("REDIS_CPU").unwrap_or_else(|_| "0".into());
    let service_cpu = std::env::var("SERVICE_CPU").unwrap_or_else(|_| "1".into());
    // Before anything starts: what else the machine was doing.
    let load_before = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let started_utc = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();

    let (redis, redis_port) = start_redis(&redis_server, &redis_cpu, Some(&module)).await?;
    let redis_pid = redis.0.id();
    let (service, ports) = start_service(&service_bin, &service_cpu, &dir, redis_port).await?;
    let (grpc_port, metrics_port) = (ports.grpc, ports.metrics);
    let mut module_rls = Rls::connect("redis-rl-envoy", service, grpc_port, redis_pid).await?;
    module_rls.redis_addr = Some(format!("127.0.0.1:{redis_port}"));
    let mut others: Vec<Rls> = Vec::new();
    // The Lua path: the same service on a Redis without the module, where the client
    // library runs the shipped script (RL_WITHOUT_MODULE's default, lua).
    let skip_lua = std::env::var("SKIP_LUA").is_ok_and(|v| v == "1");
    let _lua_redis = if skip_lua {
        None
    } else {
        let (lua_redis, lua_port) = start_redis(&redis_server, &redis_cpu, None).await?;
        let (service, ports) = start_service(&service_bin, &service_cpu, &dir, lua_port).await?;
        let mut rls = Rls::connect(
            "redis-rl-envoy, Lua path",
            service,
            ports.grpc,
            lua_redis.0.id(),
        )
        .await?;
        rls.redis_addr = Some(format!("127.0.0.1:{lua_port}"));
        // A server without the module cannot take RL.* commands, so the probe went through
        // the script; say so rather than trust it.
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{lua_port}/"))?
            .get_multiplexed_async_connection()
            .await?;
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await?;
        if !stats.contains("cmdstat_evalsha") {
            return Err("the Lua path's Redis ran no EVALSHA after the probe".into());
        }
        others.push(rls);
        Some(lua_redis)
    };
    // The peer, when a built binary was given; else its rows say why not.
    let limitador_skipped = if limitador_bin.is_empty() {
        let why = std::env::var("LIMITADOR_SKIP").unwrap_or_default();
        Some(if why.is_empty() {
            "LIMITADOR_BIN (a built limitador-server) is not set".to_string()
        } else {
            why
        })
    } else {
        let (guard, port) = start_limitador(&limitador_bin, &service_cpu, &dir, redis_port).await?;
        let mut rls = Rls::connect("limitador-server", guard, port, redis_pid).await?;
        rls.redis_addr = Some(format!("127.0.0.1:{redis_port}"));
        others.push(rls);
        None
    };
    // A service already running, given by address: benched like the others, with its CPU
    // where its process is local (PEER_PID) and its Redis's figures where its address is
    // given (PEER_REDIS); what is not known is n/a, and the results say why.
    let mut peer_notes = String::new();
    if let Ok(addr) = std::env::var("PEER_GRPC") {
        if !addr.is_empty() {
            let name = std::env::var("PEER_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("the service at {addr}"));
            let mut rls = Rls::connect_to(&name, &addr).await.map_err(|e| {
                format!("{e} (PEER_GRPC's service must hold the config `envoy-bench --write-config DIR` writes)")
            })?;
            match std::env::var("PEER_PID").ok().filter(|p| !p.is_empty()) {
                Some(pid) => {
                    let pid: u32 = pid.parse().map_err(|_| format!("PEER_PID={pid}: not a process id"))?;
                    cpu_ns(pid).map_err(|e| format!("PEER_PID={pid}: its /proc/{pid}/task cannot be read ({e}): is the process local?"))?;
                    rls.pid = Some(pid);
                }
                None => peer_notes.push_str(&format!(
                    "{name}'s service CPU is n/a: PEER_PID (its process, when it runs on this machine) is not set.\n"
                )),
            }
            match std::env::var("PEER_REDIS").ok().filter(|r| !r.is_empty()) {
                Some(redis) => rls.redis_addr = Some(redis),
                None => peer_notes.push_str(&format!(
                    "{name}'s Redis CPU and Redis bytes per limited user are n/a: PEER_REDIS (its Redis's host:port) is not set.\n"
                )),
            }
            others.push(rls);
        }
    }
    let limitador_version = if limitador_bin.is_empty() {
        String::new()
    } else {
        Command::new(&limitador_bin)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            // "Limitador Server v2.4.0-dev (<sha>) [] release": only the version, since the
            // sha is whatever git repository the build ran in (ours, for a copy under target/).
            .and_then(|s| {
                s.split_whitespace()
                    .find(|w| {
                        w.starts_with('v') && w.chars().nth(1).is_some_and(|c| c.is_ascii_digit())
                    })
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };

    // Redis bytes per limited user, before any load (whose short-lived keys would expire
    // during the measurement): each service in turn, its users this run's own.
    let memory_users: usize = std::env::var("MEMORY_USERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2000);
    let mut memory_rows = String::new();
    for rls in std::iter::once(&module_rls).chain(others.iter()) {
        memory_rows.push_str(&match rls.bytes_per_user(memory_users).await? {
            Some((growth, per_user)) => format!(
                "| {} | {memory_users} | {growth:.0} | {per_user:.0} |\n",
                rls.label
            ),
            None => format!(
                "| {} | {memory_users} | n/a | n/a: its Redis's address is not known |\n",
                rls.label
            ),
        });
    }
    {
        // The same service with its buckets in tables (RL_BUCKET_STORAGE=tables), on the
        // module's Redis, its users its own; stopped before the load.
        let (service, ports) =
            start_service_with(&service_bin, &service_cpu, &dir, redis_port, "tables").await?;
        let mut tables_rls = Rls::connect(
            "redis-rl-envoy, RL_BUCKET_STORAGE=tables",
            service,
            ports.grpc,
            redis_pid,
        )
        .await?;
        tables_rls.redis_addr = module_rls.redis_addr.clone();
        if let Some((growth, per_user)) = tables_rls.bytes_per_user(memory_users).await? {
            memory_rows.push_str(&format!(
                "| {} | {memory_users} | {growth:.0} | {per_user:.0} |\n",
                tables_rls.label
            ));
        }
    }
    if let Some(why) = &limitador_skipped {
        memory_rows.push_str(&format!("| limitador-server | | | skipped: {why} |\n"));
    }

    // TCP_NODELAY as the service sets it, so both paths send the same way.
    let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    let info = redis::Client::open(format!("redis://127.0.0.1:{redis_port}/"))?
        .get_connection_info()
        .clone()
        .set_tcp_settings(tcp);
    let connection = redis::Client::open(info)?.get_connection_manager().await?;
    let limiter = Arc::new(AsyncLimiter::new(
        connection,
        Options::new(OnError::Closed).timeout(Duration::from_secs(5)),
    ));
    let limit = Limit::new(1e9, 1e9)?;
    // The direct path is checked like the services: a closed decision (Redis could not
    // decide) is a denial, and every measured call must be allowed.
    if !limiter.acquire("direct_check", &limit, 1.0).await?.allowed {
        return Err("RL.ACQUIRE direct denied its first call".into());
    }
    let mut verdicts = String::new();

    let mut table = String::new();
    table.push_str("| streams | ShouldRateLimit decisions/s | p50 µs | p99 µs | mean µs in the service / waiting for Redis | RL.ACQUIRE direct/s | p50 µs | p99 µs | gRPC / direct | service CPU ms per 10,000 |\n");
    table.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let mut peer_table = String::new();
    peer_table.push_str("| streams | service | decisions/s | p50 µs | p99 µs | service CPU ms per 10,000 | Redis CPU ms per 10,000 |\n");
    peer_table.push_str("| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    let mut raw = String::from(
        "| streams | round | path | decisions | s | decisions/s | p50 µs | p99 µs | service CPU ms per 10,000 | Redis CPU ms per 10,000 |\n\
         | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    // STREAMS narrows a profiling run to some of the concurrencies (say `STREAMS=16`).
    let stream_counts: Vec<usize> = std::env::var("STREAMS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64]);
    let mut chart_rows: Vec<ChartRow> = Vec::new();
    let mut peer_chart: Vec<(String, f64, &str)> = Vec::new();
    let mut hot_path: Vec<HotPath> = Vec::new();
    for streams in stream_counts {
        let (mut g_rate, mut g_p50, mut g_p99, mut d_rate, mut d_p50, mut d_p99, mut cpu) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        let mut g_redis_cpu = vec![];
        // Per other service: rates, p50s, p99s, service CPU, Redis CPU.
        let mut other_figures: Vec<[Vec<f64>; 5]> =
            others.iter().map(|_| Default::default()).collect();
        let sums_before = service_sums(metrics_port).await;
        for rep in 1..=3 {
            let (r, service_cpu_ms, redis_cpu_ms) = module_rls.round(streams, seconds).await?;
            raw.push_str(&raw_row(
                streams,
                rep,
                &module_rls.label,
                &r,
                Some((service_cpu_ms, redis_cpu_ms)),
            ));
            cpu.push(service_cpu_ms);
            g_redis_cpu.push(redis_cpu_ms);
            g_rate.push(r.per_s());
            g_p50.push(r.percentile(0.5) as f64);
            g_p99.push(r.percentile(0.99) as f64);
            let l = limiter.clone();
            let r = round(streams, seconds, move |s, n| {
                let l = l.clone();
                async move {
                    let key = format!("direct_{}", (s * 7919 + n as usize) % KEYS);
                    if !l.acquire(&key, &limit, 1.0).await?.allowed {
                        return Err("RL.ACQUIRE direct denied a measured call".into());
                    }
                    Ok(())
                }
            })
            .await?;
            raw.push_str(&raw_row(streams, rep, "RL.ACQUIRE direct", &r, None));
            d_rate.push(r.per_s());
            d_p50.push(r.percentile(0.5) as f64);
            d_p99.push(r.percentile(0.99) as f64);
            for (rls, figures) in others.iter().zip(other_figures.iter_mut()) {
                let (r, service_cpu_ms, redis_cpu_ms) = rls.round(streams, seconds).await?;
                raw.push_str(&raw_row(
                    streams,
                    rep,
                    &rls.label,
                    &r,
                    Some((service_cpu_ms, redis_cpu_ms)),
                ));
                let [rate, p50, p99, s_cpu, r_cpu] = figures;
                rate.push(r.per_s());
                p50.push(r.percentile(0.5) as f64);
                p99.push(r.percentile(0.99) as f64);
                s_cpu.push(service_cpu_ms);
                r_cpu.push(redis_cpu_ms);
            }
        }
        let (g, d) = (median(g_rate.clone()), median(d_rate));
        let ratio = g / d.max(1.0);
        if streams >= 16 {
            verdicts.push_str(&format!(
                "- {streams} streams: gRPC / direct decisions/s = {ratio:.2} (budget at least \
                 0.50): {}\n",
                if ratio >= 0.5 { "met" } else { "missed" }
            ));
        }
        if streams == 16 {
            let added = median(g_p50.clone()) - median(d_p50.clone());
            verdicts.push_str(&format!(
                "- 16 streams: p50 added = {added:.0} µs (budget at most 200 µs): {}\n",
                if added <= 200.0 { "met" } else { "missed" }
            ));
        }
        // Where a gRPC call's time went inside the service, over this concurrency's rounds.
        let sums_after = service_sums(metrics_port).await;
        let calls = (sums_after.2 - sums_before.2).max(1.0);
        let in_service_us = (sums_after.0 - sums_before.0) / calls * 1e6;
        let in_redis_us = (sums_after.1 - sums_before.1) / calls * 1e6;
        chart_rows.push(ChartRow {
            streams,
            grpc_per_s: g,
            direct_per_s: d,
            grpc_p50_us: median(g_p50.clone()),
            direct_p50_us: median(d_p50.clone()),
            redis_wait_us: in_redis_us,
        });
        let (module_cpu, module_redis_cpu) = (median(cpu.clone()), median(g_redis_cpu));
        table.push_str(&format!(
            "| {streams} | {g:.0} | {:.0} | {:.0} | {in_service_us:.0} / {in_redis_us:.0} | {d:.0} | {:.0} | {:.0} | {:.2} | {:.0} |\n",
            median(g_p50.clone()),
            median(g_p99.clone()),
            median(d_p50),
            median(d_p99),
            ratio,
            module_cpu,
        ));
        peer_table.push_str(&format!(
            "| {streams} | {} | {g:.0} | {:.0} | {:.0} | {module_cpu:.0} | {module_redis_cpu:.0} |\n",
            module_rls.label,
            median(g_p50),
            median(g_p99),
        ));
        peer_chart.push((
            format!("{streams} streams, {}", module_rls.label),
            g,
            PEER_COLOURS[0],
        ));
        for (i, (rls, figures)) in others.iter().zip(other_figures).enumerate() {
            let [rate, p50, p99, s_cpu, r_cpu] = figures.map(median);
            peer_table.push_str(&format!(
                "| {streams} | {} | {rate:.0} | {p50:.0} | {p99:.0} | {} | {} |\n",
                rls.label,
                ms(s_cpu),
                ms(r_cpu),
            ));
            let colour = PEER_COLOURS.get(i + 1).copied().unwrap_or(PEER_COLOURS[0]);
            peer_chart.push((format!("{streams} streams, {}", rls.label), rate, colour));
            if rls.label.ends_with("Lua path") {
                // ms per 10,000 decisions is 0.1 µs per decision.
                hot_path.push(HotPath {
                    streams,
                    module_us: (module_cpu / 10.0, module_redis_cpu / 10.0),
                    lua_us: (s_cpu / 10.0, r_cpu / 10.0),
                });
            }
        }
        if let Some(why) = &limitador_skipped {
            peer_table.push_str(&format!(
                "| {streams} | limitador-server | skipped: {why} | | | | |\n"
            ));
        }
        eprintln!("{streams} streams done");
    }

    // Envoy end to end: the same keep-alive load on a route with the filter and one without.
    // SKIP_ENVOY=1 leaves it out of a profiling run.
    let skip_envoy = std::env::var("SKIP_ENVOY").is_ok_and(|v| v == "1");
    let up = upstream().await?;
    let (listen, admin) = (free_port()?, free_port()?);
    let config = include_str!("../../tests/envoy-template.yaml")
        .replace("@ROUTES@", ROUTES.trim_matches('\n'))
        .replace("{admin}", &admin.to_string())
        .replace("{listener}", &listen.to_string())
        .replace("{upstream}", &up.to_string())
        .replace("{grpc}", &grpc_port.to_string());
    std::fs::write(dir.join("envoy.yaml"), config)?;
    // Started only when measured: a profiling run (SKIP_ENVOY=1) needs no Envoy on PATH.
    let _envoy = if skip_envoy {
        None
    } else {
        let mut envoy = if load_cpu.is_empty() {
            Command::new(&envoy_bin)
        } else {
            pinned(load_cpu, &envoy_bin)
        };
        let child = envoy
            .arg("-c")
            .arg(dir.join("envoy.yaml"))
            .args([
                "--use-dynamic-base-id",
                "--log-level",
                "error",
                "--concurrency",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let guard = Guard(child);
        wait_port(listen).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        Some(guard)
    };
    let mut envoy_rows = String::new();
    let mut envoy_chart: Vec<(&str, f64)> = Vec::new();
    let routes: &[(&str, &str)] = if skip_envoy {
        &[]
    } else {
        &[("filter on", "/limited"), ("filter off", "/open")]
    };
    for &(label, path) in routes {
        let mut rates = vec![];
        for _ in 0..3 {
            let connections = 16;
            let mut streams = Vec::new();
            for _ in 0..connections {
                let s = tokio::net::TcpStream::connect(("127.0.0.1", listen)).await?;
                streams.push(Arc::new(tokio::sync::Mutex::new(BufReader::new(s))));
            }
            let streams = Arc::new(streams);
            let r = round(connections, seconds, move |s, n| {
                let streams = streams.clone();
                async move {
                    let conn = streams.get(s).ok_or("stream")?.clone();
                    let mut conn = conn.lock().await;
                    let status = http_get(&mut conn, path, (s * 7919 + n as usize) % KEYS).await?;
                    if status != 200 {
                        return Err(format!("HTTP {status}").into());
                    }
                    Ok(())
                }
            })
            .await?;
            rates.push(r.per_s());
        }
        let rate = median(rates);
        envoy_chart.push((label, rate));
        envoy_rows.push_str(&format!("| {label} | {rate:.0} |\n"));
    }

    // The chart sits beside the markdown, which links it by name.
    let svg_path = std::path::Path::new(&out).with_extension("svg");
    let svg_name = svg_path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let redis_version = Command::new(&redis_server)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.split_whitespace()
                .find(|w| w.starts_with("v="))
                .map(|w| w.trim_start_matches("v=").to_string())
        })
        .unwrap_or_default();
    let mut hot_rows = String::new();
    for HotPath {
        streams,
        module_us: (m_service, m_redis),
        lua_us: (l_service, l_redis),
    } in &hot_path
    {
        hot_rows.push_str(&format!(
            "| {streams} | {m_service:.1} / {m_redis:.1} | {l_service:.1} / {l_redis:.1} | {:.2} | {:.2} |\n",
            l_redis / m_redis.max(f64::MIN_POSITIVE),
            (l_service + l_redis) / (m_service + m_redis).max(f64::MIN_POSITIVE),
        ));
    }
    let hot = if hot_rows.is_empty() {
        "Not measured in this run (`SKIP_LUA=1`).\n".to_string()
    } else {
        format!(
            "CPU µs per decision, from the rows above: redis-rl-envoy on the module \
             (`RL.ACQUIRE.MULTI`) and on a Redis without it (the client library's Lua script \
             by `EVALSHA`), the same service, load and CPUs.\n\n\
             | streams | module: service / Redis µs | Lua path: service / Redis µs | Redis, Lua / module | service + Redis, Lua / module |\n\
             | ---: | ---: | ---: | ---: | ---: |\n{hot_rows}"
        )
    };
    let skipped = match &limitador_skipped {
        Some(why) => format!("\nlimitador's rows are skipped: {why}.\n"),
        None => String::new(),
    };
    let peer = format!(
        "## Against peers: limitador, and any service already running\n\n\
         The same load (the same request, keys, streams and one HTTP/2 connection) on each \
         service in turn, each pinned to CPU {service_cpu}: redis-rl-envoy on the module; \
         the same service on a second Redis {redis_version} without the module, on CPU \
         {redis_cpu} (the Lua path); and Kuadrant's limitador-server{limitador_version} with \
         `redis` storage (every decision goes to Redis, as the service's do) on the same \
         Redis as the module. The limits are the closest each has, not the same: \
         redis-rl-envoy a token bucket of 10^9 per second (`requests_per_unit: 1000000000`), \
         limitador a fixed window of 10^9 per second (`max_value: 1000000000`, \
         `seconds: 1`), both one counter per `user` value; neither denies this load. Before \
         measuring, each service answered OK on the load's domain, then OK and OVER_LIMIT \
         on a probe domain of one call a minute; every measured call answered OK. CPU is \
         each process's threads' `schedstat` over the round, in ms per 10,000 decisions \
         (1 ms per 10,000 is 0.1 µs per decision). A service given by `PEER_GRPC` runs \
         where it runs, with its own config (the one `envoy-bench --write-config DIR` \
         writes): its CPU is its process's (`PEER_PID`) when it is on this machine, its \
         Redis's from that Redis's `INFO cpu` (`PEER_REDIS`), else n/a.\n\n{peer_table}{skipped}{peer_notes}\n\
         ## Redis bytes per limited user\n\n\
         Each service in turn, before any load: the growth of its Redis's `used_memory` \
         less its clients' buffers (`mem_clients_normal`, which Redis trims on its own), \
         once it has settled, while {memory_users} distinct users (this run's own) each make \
         one call to a domain of ten calls an hour, divided by the users. It is what one \
         user's counter costs in that service's Redis, keys and their expiry included.\n\n\
         | service | users | growth, bytes | bytes per limited user |\n\
         | --- | ---: | ---: | ---: |\n{memory_rows}\n\
         ## The hot path: the module against the Lua script\n\n{hot}",
        limitador_version = if limitador_version.is_empty() {
            String::new()
        } else {
            format!(" ({limitador_version})")
        },
    );
    let text = format!(
        "# redis-rl-envoy benchmark\n\n\
         Run at {started_utc}; load average before it started {load_before} (1, 5 and 15 \
         minutes): other work on the machine shows in these figures.\n\n\
         ![decisions/s and p50, gRPC against direct, and against the peer]({svg_name})\n\n\
         `make bench-envoy` on {host} ({cpus} CPUs): Redis {redis} with the module pinned \
         to CPU {redis_cpu}, redis-rl-envoy (release) pinned to CPU {service_cpu}, the load \
         generator and Envoy 1.40 on CPU {load_cpu_label}. {seconds} s per round, rounds interleaved, each figure the median of three. \
         Keys spread over {KEYS} buckets that never run dry (the allowed path).\n\n\
         ## ShouldRateLimit over gRPC against RL.ACQUIRE from the Rust client\n\n\
         gRPC: one HTTP/2 connection (as one Envoy worker holds), `streams` calls in flight. \
         Direct: redis-rl-client's AsyncLimiter on one multiplexed connection, the same \
         number of calls in flight, on CPU {load_cpu_label} alone.\n\n{table}\n\
         Budgets:\n\n{verdicts}\n\
         ## Envoy end to end\n\n16 keep-alive HTTP/1.1 connections through one Envoy \
         worker to a tiny upstream, with the rate-limit filter (one descriptor per request) \
         and without.\n\n| route | requests/s |\n| --- | ---: |\n{envoy_rows}\n\
         What bounds these on two CPUs: the direct path runs on CPU {load_cpu_label} alone \
         (client and Redis wake each other without crossing CPUs), while each gRPC call \
         crosses between the CPUs four times and pays HTTP/2 framing twice, in the load \
         generator and in the service, with the load generator's share beside Redis. On \
         this virtual machine a wake-up across CPUs is dear{halt_poll}{one_stream} The \
         service spends far more CPU per decision at one stream than at 16, where one wave \
         of calls shares each wake-up. The service does batch: `strace -c` on it at 16 \
         streams counted about 0.5 system calls per decision (one `writev` to Redis and one \
         to the client per wave of calls). The service's CPU per 10,000 decisions (from its \
         threads' `schedstat`) is the figure that carries over to a larger machine.\n\n\
         {peer}\n\
         ## Raw rounds\n\n\
         Every round of this run, in the order they ran.\n\n{raw}",
        halt_poll = match std::fs::read_to_string("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
            Ok(ns) if ns.trim() == "0" => " (this guest does not poll before it halts an idle CPU, `haltpoll.guest_halt_poll_ns=0`, so waking one exits to the host)",
            _ => "",
        },
        one_stream = match chart_rows.iter().find(|r| r.streams == 1) {
            Some(r) => format!(
                ": at one stream the service waited {:.0} µs for each Redis reply across the \
                 CPUs, where the whole direct call took {:.0} µs at p50 on one CPU.",
                r.redis_wait_us, r.direct_p50_us
            ),
            None => ".".into(),
        },
        host = std::env::consts::ARCH,
        load_cpu_label = if load_cpu.is_empty() { "any" } else { load_cpu },
        redis = redis_version,
    );
    std::fs::write(&out, &text)?;
    std::fs::write(&svg_path, chart_svg(&chart_rows, &peer_chart, &envoy_chart))?;
    println!("{text}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
