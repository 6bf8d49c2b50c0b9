//! The real-server test harness of redis-rl, shared by the module's integration tests
//! (`tests/`, through `tests/common`) and the Rust client's (`clients/rust/tests`).
//!
//! - [`Server`]: one `redis-server` per test, with the module loaded (or a plain one), on a
//!   free port and in its own temp dir, killed (and waited for) on drop. `REDIS_SERVER` picks
//!   the server binary (default `redis-server`), so the same suites run against Valkey. The
//!   module is the cdylib built beside the test binary; `RL_MODULE` overrides it.
//! - [`table`]: the table-driven shape every command family's tests share: rows of
//!   arguments and the exact reply or error each must get.
//! - [`info`] reads `INFO`; [`cluster`] starts a Redis Cluster of such servers.
//! - Below: building and running commands (`command`, `ints`, `show`, `error_text`,
//!   `config_set`), key state (`dump`, `pexpiretime`, `exists`, `dbsize`, `all_keys`,
//!   `snapshot`, `keys_and_flags`), the server's clock, `WAIT` for a replica, and `SAVE`
//!   once no RDB child runs.
//!
//! Nothing here knows the module's replies: that stays with the tests. It starts the module
//! as a file and never links it, so it adds no build dependency of the module's to a tree.

// Test code: a failed expectation panics, which fails the test that called it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod cluster;
pub mod info;
mod server;
pub mod table;

use redis::{Connection, Value};

pub use server::{free_port, module_path, server_binary, Server};
pub use table::{assert_rejected_on_empty_server, assert_table, Want};

/// `name args…` as a command, each argument as raw bytes.
pub fn command(name: &str, args: &[&[u8]]) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// `name args…`'s reply as a flat list of integers; panics on an error reply.
pub fn ints(con: &mut Connection, name: &str, args: &[&str]) -> Vec<i64> {
    redis::cmd(name)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("{name} {args:?}: {e}"))
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

/// The reply to an error as the server sent it: `CODE detail`.
pub fn error_reply_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// The error text a command replies with; panics if it succeeds.
pub fn error_text(con: &mut Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<Value>(con) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => error_reply_text(&e),
    }
}

/// The server's text for a wrong argument count. The server checks a command's minimum
/// itself (from the declared arity) and a module the rest; both must give this text.
pub fn arity(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
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

/// Each key's `DUMP` payload and `PEXPIRETIME`, sorted by key: what "nothing was written"
/// and "the replica is identical" compare.
pub type Snapshot = Vec<(Vec<u8>, Option<Vec<u8>>, i64)>;

/// The [`Snapshot`] of every key.
pub fn snapshot(con: &mut Connection) -> Snapshot {
    all_keys(con)
        .into_iter()
        .map(|key| {
            let payload = dump(con, &key);
            let expire_at = pexpiretime(con, &key);
            (key, payload, expire_at)
        })
        .collect()
}

/// `COMMAND GETKEYSANDFLAGS name args…`: each key with its flags, sorted.
pub fn keys_and_flags(con: &mut Connection, command_line: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut keys: Vec<(String, Vec<String>)> = redis::cmd("COMMAND")
        .arg("GETKEYSANDFLAGS")
        .arg(command_line)
        .query(con)
        .unwrap_or_else(|e| panic!("COMMAND GETKEYSANDFLAGS {command_line:?}: {e}"));
    for (_, flags) in &mut keys {
        flags.sort();
    }
    keys
}

/// The server's clock (`TIME`) in milliseconds.
pub fn server_time_ms(con: &mut Connection) -> i64 {
    server_time_us(con) / 1000
}

/// The server's clock (`TIME`) in µs.
pub fn server_time_us(con: &mut Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000_000 + micros
}

/// Runs `steps` until one run spans less than `limit_us` of the server's clock (`TIME` before
/// and after), at most five times, passing the run's number so each run can use new keys.
/// For replies that are exact only while the calls take less than a rounding unit: on a
/// machine stalled that long, the run is repeated rather than asserted on, since the stall,
/// not the module, changed the replies.
pub fn within_server_time<T>(
    con: &mut Connection,
    limit_us: i64,
    mut steps: impl FnMut(&mut Connection, usize) -> T,
) -> T {
    let mut spans = Vec::new();
    for run in 0..5 {
        let before = server_time_us(con);
        let result = steps(con, run);
        let span = server_time_us(con) - before;
        if span < limit_us {
            return result;
        }
        spans.push(span);
    }
    panic!("every run took {limit_us} µs or more of the server's clock: {spans:?}");
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

/// `SAVE`, once no RDB child of the server runs. `SAVE` refuses while one does, and a
/// replica's full sync can leave one running after `WAIT` returned: Redis 8.0's rdb channel
/// marks the replica online as the child starts sending, before it ends.
pub fn save(con: &mut Connection) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while info::info(con, "persistence").contains("rdb_bgsave_in_progress:1") {
        assert!(
            std::time::Instant::now() < deadline,
            "an RDB child ran for 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _: () = redis::cmd("SAVE").query(con).expect("SAVE");
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
