//! Real redis-server processes for the client's tests: one per test, on a free loopback port,
//! in a temp dir, killed (and waited for) on drop. With the module (`RL_MODULE`, default
//! `target/debug/libredis_rl.so` at the repository root: run `cargo build --lib` first) or
//! without it: a plain server, the Lua path. `REDIS_SERVER` picks the binary. No mocks.
//!
//! Also a test logger that keeps each thread's records apart, so tests running in parallel
//! can each count the warnings their own limiter logged.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, Once};
use std::thread::{sleep, ThreadId};
use std::time::{Duration, Instant};

use redis_rl_client::{Limit, Limiter, OnError, Options};

/// The module under test.
pub fn module_path() -> PathBuf {
    if let Ok(path) = std::env::var("RL_MODULE") {
        return PathBuf::from(path);
    }
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/debug/libredis_rl.so"
    ));
    assert!(
        path.exists(),
        "no module at {} (run `cargo build --lib` at the repository root, or set RL_MODULE)",
        path.display()
    );
    path
}

fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A redis-server; `stop()` and `start()` again on the same port model an outage.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub module: bool,
    dir: tempfile::TempDir,
}

impl Server {
    pub fn with_module() -> Server {
        Server::new(true)
    }

    pub fn plain() -> Server {
        Server::new(false)
    }

    pub fn new(module: bool) -> Server {
        let mut server = Server {
            child: None,
            port: 0,
            module,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn().is_ok() {
                return server;
            }
        }
        panic!("redis-server did not start; log:\n{}", server.log());
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut command = Command::new(server_binary());
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                "server.log",
            ]);
        if self.module {
            command.arg("--loadmodule").arg(module_path());
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", server_binary()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("server exited: {status}"));
                }
            }
            if self.answers() {
                return Ok(());
            }
            sleep(Duration::from_millis(20));
        }
        self.stop();
        Err("server not ready before the deadline".into())
    }

    fn answers(&self) -> bool {
        self.try_conn()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(2))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    /// An admin connection, apart from the limiter's.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect to the test server")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (the old socket may linger briefly: retry).
    pub fn start(&mut self) {
        self.stop();
        let mut last = String::new();
        for _ in 0..25 {
            match self.spawn() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            sleep(Duration::from_millis(200));
        }
        panic!("restart failed: {last}; log:\n{}", self.log());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("running")
    }

    /// How many times `command` reached the server (INFO commandstats). Module commands keep
    /// their case (cmdstat_RL.ACQUIRE), built-ins are lower case.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .expect("INFO commandstats");
        let wanted = format!("cmdstat_{}:", command.to_lowercase());
        info.lines()
            .filter(|line| line.to_lowercase().starts_with(&wanted))
            .filter_map(|line| {
                line.split([':', ','])
                    .find_map(|field| field.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Slow enough that no refill can happen while a test runs, even on a loaded machine.
pub fn slow() -> Limit {
    Limit::new(0.001, 5.0).expect("limit")
}

/// A limiter with a deadline generous enough for a loaded machine (tests that time out set
/// their own).
pub fn limiter(server: &Server, options: Options) -> Limiter {
    Limiter::new(server.client(), options.timeout(Duration::from_millis(500)))
}

pub fn options(on_error: OnError) -> Options {
    Options::new(on_error)
}

// The test logger -----------------------------------------------------------------------

struct ThreadLog;

static RECORDS: Mutex<Option<HashMap<ThreadId, Vec<String>>>> = Mutex::new(None);
static INSTALL: Once = Once::new();

impl log::Log for ThreadLog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let mut records = RECORDS.lock().unwrap_or_else(|p| p.into_inner());
            records
                .get_or_insert_with(HashMap::new)
                .entry(std::thread::current().id())
                .or_default()
                .push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// Starts capturing warnings (once per process).
pub fn capture_logs() {
    INSTALL.call_once(|| {
        log::set_logger(&ThreadLog).expect("one logger");
        log::set_max_level(log::LevelFilter::Warn);
    });
}

/// The warnings this thread logged since the last call.
pub fn take_logs() -> Vec<String> {
    let mut records = RECORDS.lock().unwrap_or_else(|p| p.into_inner());
    records
        .get_or_insert_with(HashMap::new)
        .remove(&std::thread::current().id())
        .unwrap_or_default()
}
