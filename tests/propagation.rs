//! Writes on a server that nothing listens to skip building the replication command; these
//! tests check that turning a listener on afterwards (AOF, save points, a replica) is seen
//! before the next write, so nothing is ever lost.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::info::{info, info_field, rdb_changes};
use common::{acquire, config_set, dump, pexpiretime, wait_for_replica, Server};
use redis::Connection;

fn wait_for_aof_rewrite(con: &mut Connection) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        let text = info(con, "persistence");
        if text.contains("aof_rewrite_in_progress:0")
            && text.contains("aof_rewrite_scheduled:0")
            && text.contains("aof_enabled:1")
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("AOF rewrite did not finish");
}

fn propagation_mode(con: &mut Connection) -> String {
    info_field(&info(con, "rl"), "rl_propagation")
        .expect("rl_propagation in INFO rl")
        .to_string()
}

/// Takes `cost` tokens from each of the buckets `k0` to `k49`.
fn take_from_each(con: &mut Connection, cost: &str) {
    for i in 0..50 {
        acquire(con, format!("k{i}").as_bytes(), "0.001", "100", Some(cost));
    }
}

#[test]
fn aof_turned_on_at_runtime_records_later_takes() {
    let mut server = Server::start();
    let mut con = server.conn();
    // Nothing listens yet: this take is written but not propagated.
    acquire(&mut con, b"before", "0.001", "5", Some("2"));
    assert_eq!(
        propagation_mode(&mut con),
        "skip",
        "a server without listeners skips"
    );
    config_set(&mut con, "appendonly", "yes");
    wait_for_aof_rewrite(&mut con);
    // The rewrite captured `before`; these takes must reach the AOF themselves.
    acquire(&mut con, b"after", "0.001", "5", Some("3"));
    acquire(&mut con, b"before", "0.001", "5", Some("1"));
    config_set(&mut con, "appendfsync", "always");
    let snapshot: Vec<_> = [&b"before"[..], b"after"]
        .iter()
        .map(|k| (dump(&mut con, k), pexpiretime(&mut con, k)))
        .collect();
    drop(con);
    server.restart_with(&["--appendonly", "yes"]);
    let mut con = server.conn();
    let reloaded: Vec<_> = [&b"before"[..], b"after"]
        .iter()
        .map(|k| (dump(&mut con, k), pexpiretime(&mut con, k)))
        .collect();
    assert_eq!(reloaded, snapshot, "state after replaying the AOF differs");
    assert!(reloaded.iter().all(|(d, _)| d.is_some()));
}

#[test]
fn save_points_count_takes_as_changes() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, b"k", "0.001", "5", None);
    config_set(&mut con, "save", "3600 1");
    let before = rdb_changes(&mut con);
    acquire(&mut con, b"k", "0.001", "5", None);
    let after = rdb_changes(&mut con);
    assert!(
        after > before,
        "an allowed take did not count as a change ({before} -> {after})"
    );
    // A denial changes nothing and counts nothing.
    acquire(&mut con, b"k", "0.001", "2", Some("2"));
    let denied_before = rdb_changes(&mut con);
    assert_eq!(acquire(&mut con, b"k", "0.001", "2", Some("2"))[0], 0);
    assert_eq!(rdb_changes(&mut con), denied_before);
}

#[test]
fn replica_attached_after_unpropagated_takes_converges() {
    let master = Server::start();
    let mut con = master.conn();
    take_from_each(&mut con, "3");
    assert_eq!(propagation_mode(&mut con), "skip");
    let replica = master.start_replica();
    // Streamed from now on.
    take_from_each(&mut con, "2");
    wait_for_replica(&mut con);
    let mut rcon = replica.conn();
    for i in 0..50 {
        let key = format!("k{i}");
        assert_eq!(
            dump(&mut rcon, key.as_bytes()),
            dump(&mut con, key.as_bytes()),
            "{key}"
        );
        assert_eq!(
            pexpiretime(&mut rcon, key.as_bytes()),
            pexpiretime(&mut con, key.as_bytes()),
            "{key}"
        );
    }
}
