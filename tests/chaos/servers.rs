//! What the conductor does to the servers under load, one step each (AOF on and off, rewrites,
//! snapshots, replicas attaching, links killed, `redis-cli --rdb` and `--replica`), the waits
//! that end each step, and the small reads of `INFO` and `TIME` they use. Every wait is
//! bounded by `HANG_GUARD`. Knows nothing of the load or the checks.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::common;
use crate::common::info::{info, info_field};
use crate::common::{config_set, Server};

/// Hang guard for any one wait on a server (sync, rewrite, reconnect).
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(180);

/// Replication backlog: large enough that a killed link resyncs partially at this write rate.
pub(crate) const BACKLOG: &str = "64mb";

/// The client the migration tools' replica mode is exercised with.
pub(crate) fn cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// Polls `check` until it holds; panics with `what` after `HANG_GUARD`.
pub(crate) fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// One field of `INFO <section>`, or "" if it is missing.
pub(crate) fn field(con: &mut Connection, section: &str, name: &str) -> String {
    info_field(&info(con, section), name)
        .unwrap_or_default()
        .to_string()
}

pub(crate) fn number(con: &mut Connection, section: &str, name: &str) -> u64 {
    let text = info(con, section);
    info_field(&text, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO {section}:\n{text}"))
}

pub(crate) fn propagation(con: &mut Connection) -> String {
    field(con, "rl", "rl_propagation")
}

/// Waits until the module reports `mode` (the clients' next write probes an unknown state).
pub(crate) fn wait_for_propagation(con: &mut Connection, mode: &str) {
    wait_until(&format!("rl_propagation:{mode}"), || {
        propagation(con) == mode
    });
}

/// Whether a replica's link is up and it is not syncing.
pub(crate) fn synced(server: &Server) -> bool {
    let mut con = server.conn();
    let text = info(&mut con, "replication");
    text.contains("master_link_status:up") && text.contains("master_sync_in_progress:0")
}

/// Starts a replica of the server on `master_port` and waits for its first sync.
pub(crate) fn attach_replica(master_port: u16) -> Server {
    let port = master_port.to_string();
    let replica = Server::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &port,
        "--repl-backlog-size",
        BACKLOG,
    ]);
    wait_until(&format!("replica of {master_port} to sync"), || {
        synced(&replica)
    });
    replica
}

/// Waits until AOF is on, no rewrite is running or scheduled, and `aof_rewrites` passed
/// `before`.
pub(crate) fn wait_for_aof_rewrite(con: &mut Connection, before: u64) {
    wait_until("the AOF rewrite", || {
        let text = info(con, "persistence");
        let rewrites: u64 = info_field(&text, "aof_rewrites")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        text.contains("aof_enabled:1")
            && text.contains("aof_rewrite_in_progress:0")
            && text.contains("aof_rewrite_scheduled:0")
            && rewrites > before
    });
    assert_eq!(field(con, "persistence", "aof_last_bgrewrite_status"), "ok");
}

pub(crate) fn aof_on(con: &mut Connection) {
    let before = number(con, "persistence", "aof_rewrites");
    config_set(con, "appendonly", "yes");
    wait_for_aof_rewrite(con, before);
    wait_for_propagation(con, "replicate");
}

pub(crate) fn bgrewriteaof(con: &mut Connection) {
    let before = number(con, "persistence", "aof_rewrites");
    let _: String = redis::cmd("BGREWRITEAOF").query(con).expect("BGREWRITEAOF");
    wait_for_aof_rewrite(con, before);
}

pub(crate) fn bgsave(con: &mut Connection) {
    let before = number(con, "persistence", "rdb_saves");
    let _: String = redis::cmd("BGSAVE")
        .arg("SCHEDULE")
        .query(con)
        .expect("BGSAVE SCHEDULE");
    wait_until("BGSAVE", || {
        let text = info(con, "persistence");
        let saves: u64 = info_field(&text, "rdb_saves")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        text.contains("rdb_bgsave_in_progress:0") && saves > before
    });
    assert_eq!(field(con, "persistence", "rdb_last_bgsave_status"), "ok");
}

/// `CLIENT KILL TYPE <kind>` on `con`, then waits until `master` counted `replicas` more
/// partial resyncs and no full one, and every server in `linked` is synced again.
pub(crate) fn kill_links(
    con: &mut Connection,
    kind: &str,
    master: &mut Connection,
    replicas: u64,
    linked: &[&Server],
) {
    let partial = number(master, "stats", "sync_partial_ok");
    let full = number(master, "stats", "sync_full");
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg(kind)
        .query(con)
        .expect("CLIENT KILL TYPE");
    // At least: a migration tool's connection that just closed may still be listed.
    assert!(
        killed >= replicas,
        "CLIENT KILL TYPE {kind} killed {killed}"
    );
    wait_until("the partial resyncs", || {
        number(master, "stats", "sync_partial_ok") >= partial + replicas
            && linked.iter().all(|s| synced(s))
    });
    assert_eq!(
        number(master, "stats", "sync_full"),
        full,
        "a killed link resynced in full, not partially"
    );
}

/// Waits for a child process; kills it after `HANG_GUARD`.
pub(crate) fn wait_child(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + HANG_GUARD;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} did not finish");
}

/// `redis-cli --rdb <file>`: the master forks and streams a snapshot to a replication client,
/// as RedisShake and RIOT do to start a migration. Returns the file's size.
pub(crate) fn cli_rdb(port: u16, file: &Path) -> u64 {
    let mut child = Command::new(cli())
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--rdb"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redis-cli --rdb");
    let status = wait_child(&mut child, "redis-cli --rdb");
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    assert!(status.success(), "redis-cli --rdb: {status}: {stderr}");
    let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    assert!(size > 0, "redis-cli --rdb wrote nothing: {stderr}");
    size
}

/// `redis-cli --replica` for at least `seconds`, until it has logged `RL.SETSTATE` from the
/// stream: a replica that only reads the command stream, as a migration tool's sync phase
/// does. The stream must carry effects, never `RL.ACQUIRE`. Returns the commands seen.
pub(crate) fn cli_replica(port: u16, out: &Path, seconds: u64) -> usize {
    let file = std::fs::File::create(out).expect("create --replica output");
    let mut child = Command::new(cli())
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--replica"])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-cli --replica");
    let started = Instant::now();
    let deadline = started + HANG_GUARD;
    let mut text = String::new();
    while Instant::now() < deadline {
        text = std::fs::read_to_string(out).unwrap_or_default();
        if started.elapsed() >= Duration::from_secs(seconds) && text.contains("RL.SETSTATE") {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("redis-cli --replica exited: {status}; output:\n{text}");
        }
        sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let upper = text.to_ascii_uppercase();
    assert!(
        upper.contains("RL.SETSTATE"),
        "redis-cli --replica logged no RL.SETSTATE in {:?}; output:\n{}",
        started.elapsed(),
        &text[..text.len().min(2000)]
    );
    assert!(
        !upper.contains("RL.ACQUIRE"),
        "the replication stream carries RL.ACQUIRE verbatim"
    );
    upper.matches("RL.SETSTATE").count()
}

/// The server's `TIME` in microseconds.
pub(crate) fn server_time_us(con: &mut Connection) -> i128 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    i128::from(secs) * 1_000_000 + i128::from(micros)
}

/// The server binary's file name, for the report.
pub(crate) fn server_name() -> String {
    let binary = common::server_binary();
    Path::new(&binary)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or(binary)
}

/// `valkey_version`, else `redis_version` (Valkey reports 7.2.4 there).
pub(crate) fn version(con: &mut Connection) -> String {
    let text = info(con, "server");
    info_field(&text, "valkey_version")
        .or_else(|| info_field(&text, "redis_version"))
        .unwrap_or_default()
        .to_string()
}
