//! The real-server harness: one `redis-server` per test, with the module loaded, on a free
//! port and in its own temp dir, killed (and waited for) on drop.
//!
//! `REDIS_SERVER` picks the server binary (default `redis-server`), so the same suite runs
//! against Valkey. The module is the cdylib built beside this test binary; `RL_MODULE`
//! overrides it.
//!
//! Beside the harness, the small helpers several test files share: building and running
//! commands (`acquire`, `acquire_cmd`, `command`, `show`, `error_text`, `config_set`), a table
//! of bad arguments checked against an empty server (`assert_rejected_on_empty_server`), key
//! state (`dump`, `pexpiretime`, `exists`, `dbsize`, `all_keys`), the server's clock, and
//! `WAIT` for a replica. Submodules: [`fresh`] computes the reply to a first call, [`info`]
//! reads `INFO`, [`lua`] runs the classic Lua token bucket, [`cluster`] starts a Redis Cluster,
//! [`aof`] reads AOF files and [`rdb`] builds `DUMP` payloads. Each test binary uses a subset
//! of all this,
//! hence `allow(dead_code)`.

#![allow(dead_code)]

pub mod aof;
pub mod cluster;
pub mod fresh;
pub mod info;
pub mod lua;
pub mod rdb;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

/// How long a server may take to answer PING after start (a deadline, not a wait: generous
/// for a loaded 2-CPU machine).
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// The module under test: `RL_MODULE`, else the cdylib cargo built next to this test binary.
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
        "module not built at {} (cargo test does not build the cdylib: run `cargo build --lib`, or `make test`)",
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
    /// Arguments after the module path: module load arguments first (`name value …`), then
    /// `--name value` config arguments.
    extra: Vec<String>,
}

impl Server {
    /// A server with the module loaded and no persistence.
    pub fn start() -> Server {
        Server::start_with(&[])
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

    fn unstarted(extra: &[&str], module_args: &[&str]) -> Server {
        Server {
            child: None,
            port: 0,
            dir: tempfile::tempdir().expect("temp dir"),
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

    fn spawn(&mut self) -> Result<(), String> {
        let module = module_path();
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
            "--logfile".into(),
            "redis.log".into(),
            "--save".into(),
            "".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            "--loadmodule".into(),
            module.display().to_string(),
        ];
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
        let answered = info::info_field(&text, "process_id").and_then(|p| p.parse::<u32>().ok());
        if answered == Some(pid) {
            return Ok(());
        }
        self.kill();
        Err(format!(
            "port {} is answered by process {answered:?}, not by our server (pid {pid})",
            self.port
        ))
    }

    fn try_conn(&self) -> redis::RedisResult<Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        client.get_connection_with_timeout(Duration::from_secs(2))
    }

    /// The server's process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A new connection.
    pub fn conn(&self) -> Connection {
        self.try_conn().expect("connect to the test server")
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
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

    /// Starts the server again on the same port and directory (after `kill` or `shutdown`),
    /// with `extra` config arguments replacing the original ones (module load arguments too).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.kill();
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        if let Err(e) = self.spawn() {
            panic!("restart failed: {e}; log:\n{}", self.log());
        }
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
            let replication = info::info(&mut con, "replication");
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

/// `RL.ACQUIRE key rate capacity [cost]` as a command: for error replies, or for a connection
/// other than a single node's.
pub fn acquire_cmd(key: &[u8], rate: &str, capacity: &str, cost: Option<&str>) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.ACQUIRE");
    cmd.arg(key).arg(rate).arg(capacity);
    if let Some(cost) = cost {
        cmd.arg(cost);
    }
    cmd
}

/// `RL.ACQUIRE key rate capacity [cost]` as the four integers of its reply.
pub fn acquire(
    con: &mut Connection,
    key: &[u8],
    rate: &str,
    capacity: &str,
    cost: Option<&str>,
) -> [i64; 4] {
    let reply: Vec<i64> = acquire_cmd(key, rate, capacity, cost)
        .query(con)
        .expect("RL.ACQUIRE reply");
    reply
        .try_into()
        .expect("RL.ACQUIRE replies with 4 integers")
}

/// `name args…` as a command, each argument as raw bytes.
pub fn command(name: &str, args: &[&[u8]]) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// Arguments, readable in a failure message: each one quoted, or as its length when it is
/// over 20 bytes.
pub fn show(args: &[&[u8]]) -> String {
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            if a.len() > 20 {
                format!("<{} bytes>", a.len())
            } else {
                format!("{:?}", String::from_utf8_lossy(a))
            }
        })
        .collect();
    shown.join(" ")
}

/// The error text a command replies with; panics if it succeeds.
pub fn error_text(con: &mut Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<Value>(con) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => {
            // Rebuild "CODE detail" as the server sent it.
            match (e.code(), e.detail()) {
                (Some(code), Some(detail)) => format!("{code} {detail}"),
                (Some(code), None) => code.to_string(),
                _ => e.to_string(),
            }
        }
    }
}

/// `DUMP key`, or `None` for a missing key.
pub fn dump(con: &mut Connection, key: &[u8]) -> Option<Vec<u8>> {
    redis::cmd("DUMP").arg(key).query(con).expect("DUMP")
}

/// `PEXPIRETIME key` (ms since the epoch; -1 no expiry, -2 missing).
pub fn pexpiretime(con: &mut Connection, key: &[u8]) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(con)
        .expect("PEXPIRETIME")
}

/// `EXISTS key`.
pub fn exists(con: &mut Connection, key: &[u8]) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(con)
        .expect("EXISTS")
        == 1
}

/// Runs each row, `name args…` with the exact error text it must get, against a new, empty
/// server: the exact error text, no key created (`k` nor any other), and PING still answers.
pub fn assert_rejected_on_empty_server<'a, A, W>(name: &str, rows: &[(A, W)])
where
    A: AsRef<[&'a [u8]]>,
    W: AsRef<str>,
{
    let server = Server::start();
    let mut con = server.conn();
    // Wrong texts are collected so one run lists every failing row.
    let mut wrong = Vec::new();
    for (args, want) in rows {
        let (args, want) = (args.as_ref(), want.as_ref());
        let got = error_text(&mut con, &command(name, args));
        if got != want {
            wrong.push(format!(
                "{name} {}\n   got: {got}\n  want: {want}",
                show(args)
            ));
        }
        assert!(
            !exists(&mut con, b"k"),
            "{name} {} created the key",
            show(args)
        );
        assert_eq!(dbsize(&mut con), 0, "{name} {} created a key", show(args));
        server.assert_alive();
    }
    assert!(
        wrong.is_empty(),
        "{} of {} rows got the wrong error:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
}

/// `CONFIG SET name value`.
pub fn config_set(con: &mut Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// `DBSIZE`.
pub fn dbsize(con: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(con).expect("DBSIZE")
}

/// Every key (`KEYS *`), sorted.
pub fn all_keys(con: &mut Connection) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    keys.sort();
    keys
}

/// The server's clock (`TIME`) in milliseconds.
pub fn server_time_ms(con: &mut Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1000 + micros / 1000
}

/// `WAIT 1` covering writes that *other* connections made (a cluster client, `MIGRATE`):
/// `WAIT` only waits for the calling connection's own last write, so this one first writes
/// and deletes `marker` (give it the buckets' hash tag in a cluster), and the stream being
/// ordered, its acknowledgement covers everything before it. Leaves no key behind.
pub fn wait_for_replica_after_others(master: &mut Connection, marker: &str) {
    let _: () = redis::cmd("SET")
        .arg(marker)
        .arg(1)
        .query(master)
        .expect("SET marker");
    let _: i64 = redis::cmd("DEL")
        .arg(marker)
        .query(master)
        .expect("DEL marker");
    wait_for_replica(master);
}

/// `WAIT 1 30000` on a master: returns once its one replica has acknowledged everything
/// written so far. WAIT returns at the acknowledgement, so the long timeout costs nothing
/// unless the replica is stalled, and a loaded machine can stall one for seconds.
pub fn wait_for_replica(master: &mut Connection) {
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(30_000)
        .query(master)
        .expect("WAIT");
    assert_eq!(
        acked, 1,
        "the replica did not acknowledge the stream in time"
    );
}
