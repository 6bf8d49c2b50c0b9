//! Writes on a server that nothing listens to skip building the replication command; these
//! tests check that turning a listener on afterwards (AOF, save points, a replica) is seen
//! before the next write, so nothing is ever lost.

mod common;

use std::time::{Duration, Instant};

use common::{acquire, dump, pexpiretime, Server};
use redis::Connection;

fn info(con: &mut Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(con).expect("INFO")
}

fn info_field(con: &mut Connection, section: &str, field: &str) -> i64 {
    let text = info(con, section);
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from INFO {section}"))
}

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
    info(con, "rl")
        .lines()
        .find_map(|line| line.strip_prefix("rl_propagation:"))
        .map(|v| v.trim().to_string())
        .expect("rl_propagation in INFO rl")
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
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("yes")
        .query(&mut con)
        .expect("CONFIG SET");
    wait_for_aof_rewrite(&mut con);
    // The rewrite captured `before`; these takes must reach the AOF themselves.
    acquire(&mut con, b"after", "0.001", "5", Some("3"));
    acquire(&mut con, b"before", "0.001", "5", Some("1"));
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendfsync")
        .arg("always")
        .query(&mut con)
        .expect("CONFIG SET");
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
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("save")
        .arg("3600 1")
        .query(&mut con)
        .expect("CONFIG SET");
    let before = info_field(&mut con, "persistence", "rdb_changes_since_last_save");
    acquire(&mut con, b"k", "0.001", "5", None);
    let after = info_field(&mut con, "persistence", "rdb_changes_since_last_save");
    assert!(
        after > before,
        "an allowed take did not count as a change ({before} -> {after})"
    );
    // A denial changes nothing and counts nothing.
    acquire(&mut con, b"k", "0.001", "2", Some("2"));
    let denied_before = info_field(&mut con, "persistence", "rdb_changes_since_last_save");
    assert_eq!(acquire(&mut con, b"k", "0.001", "2", Some("2"))[0], 0);
    assert_eq!(
        info_field(&mut con, "persistence", "rdb_changes_since_last_save"),
        denied_before
    );
}

#[test]
fn replica_attached_after_unpropagated_takes_converges() {
    let master = Server::start();
    let mut con = master.conn();
    for i in 0..50 {
        acquire(
            &mut con,
            format!("k{i}").as_bytes(),
            "0.001",
            "100",
            Some("3"),
        );
    }
    assert_eq!(propagation_mode(&mut con), "skip");
    let replica = master.start_replica();
    // Streamed from now on.
    for i in 0..50 {
        acquire(
            &mut con,
            format!("k{i}").as_bytes(),
            "0.001",
            "100",
            Some("2"),
        );
    }
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut con)
        .expect("WAIT");
    assert_eq!(acked, 1);
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
