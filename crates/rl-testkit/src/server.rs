//! One `redis-server` per test: the module loaded (or not: a plain server), a free loopback
//! port, its own temp dir, and a guard that kills the child and waits for it on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::config_set;
use crate::info::{calls, info, info_field};

/// How long a server may take to answer PING after start (a deadline, not a wait: generous
/// for a loaded 2-CPU machine).
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// The log file each server writes in its temp dir.
const LOG_FILE: &str = "server.log";

/// The module under test: `RL_MODULE`, else the cdylib cargo built next to this test binary
/// (`target/<profile>/`, which the module's tests and the Rust client's share).
pub fn module_path() -> PathBuf {
    if let Ok(path) = std::env::var("RL_MODULE") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/libredis_rl.so
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let lib = profile_dir.join(format!(
        "{}redis_rl{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(
        lib.exists(),
        "module not built at {} (cargo test does not build the cdylib: run `cargo build --lib` at the repository root, or `make test`; or set RL_MODULE)",
        lib.display()
    );
    lib
}

/// The server binary: `REDIS_SERVER`, else `redis-server` from PATH.
pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A port nobody listens on right now (bind port 0 and let the OS choose).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// One running server, killed on drop.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// Whether `--loadmodule` loads the module (set before [`Server::restart`] to bring the
    /// server back with or without it).
    pub module: bool,
    /// Arguments after the module path: module load arguments first (`name value …`), then
    /// `--name value` config arguments.
    extra: Vec<String>,
}

impl Server {
    /// A server with the module loaded and no persistence.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// A plain server, without the module (what a managed service offers).
    pub fn plain() -> Server {
        Server::new(false)
    }

    /// A server with the module loaded or not, for tests that run both ways.
    pub fn new(module: bool) -> Server {
        let mut server = Server::unstarted(&[], &[]);
        server.module = module;
        server.spawn_on_free_port();
        server
    }

    /// A server with the module loaded plus extra `--name value` config arguments.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_with_module_args(extra, &[])
    }

    /// A server with extra config arguments and module load arguments: `module_args` follow
    /// the module path on the `--loadmodule` line (`--loadmodule lib.so name value …`), where
    /// the server reads everything up to the next `--option` as the module's arguments.
    pub fn start_with_module_args(extra: &[&str], module_args: &[&str]) -> Server {
        let mut server = Server::unstarted(extra, module_args);
        server.spawn_on_free_port();
        server
    }

    /// Tries once to start a server with these module load arguments. `Err` holds the
    /// server's log when it did not come up (a module that fails to load stops the server).
    pub fn try_start_with_module_args(module_args: &[&str]) -> Result<Server, String> {
        Server::try_start(&[], module_args)
    }

    /// Tries once to start a server with extra config arguments and module load arguments.
    /// `Err` holds the server's log when it did not come up.
    pub fn try_start(extra: &[&str], module_args: &[&str]) -> Result<Server, String> {
        let mut server = Server::unstarted(extra, module_args);
        server.port = free_port();
        match server.spawn() {
            Ok(()) => Ok(server),
            Err(e) => Err(format!("{e}; log:\n{}", server.log())),
        }
    }

    /// Tries once to start a server on `port`, which the caller chose. `Err` when it did not
    /// come up as our own process on that port.
    pub fn try_start_on_port(port: u16) -> Result<Server, String> {
        let mut server = Server::unstarted(&[], &[]);
        server.port = port;
        server.spawn().map(|()| server)
    }

    pub(crate) fn unstarted(extra: &[&str], module_args: &[&str]) -> Server {
        Server {
            child: None,
            port: 0,
            dir: tempfile::tempdir().expect("temp dir"),
            module: true,
            extra: module_args
                .iter()
                .chain(extra)
                .map(|s| s.to_string())
                .collect(),
        }
    }

    fn spawn_on_free_port(&mut self) {
        // The port is free when chosen but could be taken before the server binds it (then
        // `spawn` sees another process answer); retry on another port.
        let mut failures = Vec::new();
        for _ in 0..10 {
            self.port = free_port();
            match self.spawn() {
                Ok(()) => return,
                Err(e) => failures.push(e),
            }
        }
        panic!(
            "redis-server did not start: {}; log:\n{}",
            failures.join("; "),
            self.log()
        );
    }

    pub(crate) fn spawn(&mut self) -> Result<(), String> {
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
            "--logfile".into(),
            LOG_FILE.into(),
            "--save".into(),
            "".into(),
            "--enable-debug-command".into(),
            "yes".into(),
        ];
        if self.module {
            args.push("--loadmodule".into());
            args.push(module_path().display().to_string());
        }
        args.extend(self.extra.iter().cloned());
        let child = Command::new(server_binary())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", server_binary()))?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_DEADLINE;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("server exited: {status}"));
                }
            }
            if let Ok(mut con) = self.try_conn() {
                // LOADING replies are errors; wait until the dataset is in.
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return self.check_answered_by_child(&mut con);
                }
            }
            sleep(Duration::from_millis(20));
        }
        self.kill();
        Err("server not ready before the deadline".into())
    }

    /// Whether the server that answered on our port is our child. Another test's server can
    /// take the port between `free_port` and our bind; then ours exits ("Address already in
    /// use") while the other answers PING, and the test would run against a stranger (with
    /// other keys, config, and a lifetime of its own). `INFO server`'s `process_id` tells.
    fn check_answered_by_child(&mut self, con: &mut Connection) -> Result<(), String> {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return Err("the server exited".into());
        };
        let text: String = redis::cmd("INFO")
            .arg("server")
            .query(con)
            .map_err(|e| format!("INFO server: {e}"))?;
        let answered = info_field(&text, "process_id").and_then(|p| p.parse::<u32>().ok());
        if answered == Some(pid) {
            return Ok(());
        }
        self.kill();
        Err(format!(
            "port {} is answered by process {answered:?}, not by our server (pid {pid})",
            self.port
        ))
    }

    pub(crate) fn try_conn(&self) -> redis::RedisResult<Connection> {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(2))
    }

    /// The server's process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client for this server (connections are made on use).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client for the test server")
    }

    /// A new connection.
    pub fn conn(&self) -> Connection {
        self.try_conn().expect("connect to the test server")
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(LOG_FILE)).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server with `SHUTDOWN` (saving as configured) and waits for it to exit.
    pub fn shutdown(&mut self, how: &str) {
        let mut con = self.conn();
        let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg(how).query(&mut con);
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + READY_DEADLINE;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The server's exit status if it has exited on its own, without waiting; `None` while
    /// it runs (or after [`Server::kill`]). A server that aborted (a failed assertion, a
    /// crash) shows a signal here, a clean `SHUTDOWN` a zero exit code.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    /// Waits up to `within` for the server to exit on its own (after a `SHUTDOWN` sent on a
    /// connection of the test's), and returns its exit status; `None` if it still runs then.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline || self.child.is_none() {
                return None;
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server's process (`SIGSTOP`): it keeps its connections open and answers
    /// nothing, as a stalled host would, until [`Server::resume`]. A stopped server is still
    /// killed on drop (`SIGKILL` ends a stopped process too).
    pub fn suspend(&self) {
        self.signal("STOP");
    }

    /// Lets a server stopped by [`Server::suspend`] run again (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Sends `signal` (a name as `kill -s` takes it) to the running server. `kill(1)` rather
    /// than libc, so the harness adds no dependency to the trees that use it.
    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server is running");
        let status = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("run kill -s {signal} {pid}: {e}"));
        assert!(status.success(), "kill -s {signal} {pid}: {status}");
    }

    /// Starts the server again on the same port and directory (after `kill` or `shutdown`,
    /// or killing it first), as configured. The old socket may linger briefly: retried.
    pub fn restart(&mut self) {
        self.kill();
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

    /// [`Server::restart`] with `extra` config arguments replacing the original ones (module
    /// load arguments too).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// Whether the server still answers PING.
    pub fn is_alive(&self) -> bool {
        self.try_conn()
            .and_then(|mut con| redis::cmd("PING").query::<String>(&mut con))
            .is_ok()
    }

    /// Asserts that the server still answers PING; the failure message carries its log.
    pub fn assert_alive(&self) {
        assert!(
            self.is_alive(),
            "server stopped answering PING; log:\n{}",
            self.log()
        );
    }

    /// How many times `command` reached the server (`INFO commandstats`), 0 if never.
    pub fn calls(&self, command: &str) -> u64 {
        calls(&mut self.conn(), command).unwrap_or(0)
    }

    /// Starts a replica of this server and waits until its link is up and it has synced.
    pub fn start_replica(&self) -> Server {
        // Redis 7.0 waits 5 s before a diskless full sync by default; nothing here needs it.
        let mut master = self.conn();
        config_set(&mut master, "repl-diskless-sync-delay", "0");
        let port = self.port.to_string();
        let replica = Server::start_with(&["--replicaof", "127.0.0.1", &port]);
        let deadline = Instant::now() + READY_DEADLINE;
        let mut con = replica.conn();
        while Instant::now() < deadline {
            let replication = info(&mut con, "replication");
            if replication.contains("master_link_status:up")
                && replication.contains("master_sync_in_progress:0")
            {
                return replica;
            }
            sleep(Duration::from_millis(20));
        }
        panic!("replica never synced; log:\n{}", replica.log());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
