//! The sweep finds tables through a registry, not a scan of the keyspace, so every way a
//! table comes to be under a name must reach it: created by a write, renamed, moved to
//! another database, copied, restored, swapped with `SWAPDB`, loaded (`DEBUG RELOAD`, a
//! restart), replicated to a replica that is then promoted. Each test puts a table under a
//! new name that way, with no write to it after, and waits for the background sweep to
//! remove its full buckets there: a name the registry missed would keep them for good (a
//! table has no key expiry). And what the server refuses to write with is not swept:
//! `min-replicas-to-write` not met holds the sweep back until it is; over `maxmemory` the
//! sweep goes on, since its removals only free memory.
//!
//! Time: each table holds one long-lived bucket (1 token per 1000 s, capacity 5, 1 taken),
//! so its key never expires during a test, beside short-lived ones (capacity 1 at 10/s:
//! full again 100 ms after their call). Every wait polls against a generous deadline.

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::info::{info, info_field};
use common::{wait_for_replica, Server};
use redis::Connection;

/// The long-lived bucket: 1 token per 1000 s, capacity 5, 1 taken.
const LONG: [&str; 3] = ["0.001", "5", "1"];
/// A short-lived bucket: capacity 1 at 10/s, full again 100 ms after its call.
const SHORT: [&str; 3] = ["10", "1", "1"];
/// Short-lived fields per table.
const SHORT_FIELDS: usize = 50;
/// How long reclaim may take (a deadline, not a measurement).
const DEADLINE: Duration = Duration::from_secs(20);

fn hlen(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("RL.HLEN").arg(key).query(con).expect("RL.HLEN")
}

/// Table `key`: the long-lived bucket and `SHORT_FIELDS` short-lived ones.
fn fill(con: &mut Connection, key: &str) {
    let mut pipe = redis::pipe();
    pipe.cmd("RL.HACQUIRE")
        .arg(key)
        .arg("long")
        .arg(&LONG)
        .ignore();
    for i in 0..SHORT_FIELDS {
        pipe.cmd("RL.HACQUIRE")
            .arg(key)
            .arg(format!("short{i}"))
            .arg(&SHORT)
            .ignore();
    }
    let _: () = pipe.query(con).expect("fill a table");
    assert_eq!(hlen(con, key), 1 + SHORT_FIELDS as i64);
}

/// Waits until the table `key` (in the connection's database) holds only its long-lived
/// bucket: the sweep found it under that name.
fn wait_swept(con: &mut Connection, key: &str) {
    let started = Instant::now();
    loop {
        let left = hlen(con, key);
        if left == 1 {
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{key}: {left} buckets left, the sweep did not find the table under this name \
             (INFO rl: {})",
            info(con, "rl")
        );
        sleep(Duration::from_millis(50));
    }
}

fn select(con: &mut Connection, db: i64) {
    let _: () = redis::cmd("SELECT").arg(db).query(con).unwrap();
}

/// Whether this server is a Valkey where listening to `RENAME`'s and `MOVE`'s keyspace
/// events would move clients between databases, so the module does not listen: there a
/// renamed or moved table is found again at its next write (see `src/server.rs`).
fn renames_found_at_next_write_only(con: &mut Connection) -> bool {
    let text = info(con, "server");
    let Some(version) = info_field(&text, "valkey_version") else {
        return false;
    };
    let v: Vec<u32> = version
        .trim()
        .split('.')
        .filter_map(|p| p.parse().ok())
        .collect();
    v.len() != 3 || ((8, 1, 0)..(9, 1, 2)).contains(&(v[0], v[1], v[2]))
}

/// After a `RENAME` or `MOVE`, where the server's events cannot be listened to, the next
/// write under the new name records it.
fn write_where_events_are_not_heard(con: &mut Connection, key: &str) {
    if renames_found_at_next_write_only(con) {
        let _: Vec<i64> = redis::cmd("RL.HACQUIRE")
            .arg(key)
            .arg("long")
            .arg(&LONG)
            .query(con)
            .unwrap();
    }
}

#[test]
fn move_and_copy_to_another_database_leave_the_clients_database_alone() {
    // A module that listens to generic keyspace events must not move the client issuing
    // MOVE or COPY … DB to the destination database (Valkey 8.1 did, valkey-io/valkey#4024).
    let server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "t");
    let _: () = redis::cmd("SET").arg("s").arg("v").query(&mut con).unwrap();
    for (command, args) in [
        ("COPY", vec!["t", "t_copy", "DB", "4"]),
        ("COPY", vec!["s", "s_copy", "DB", "4"]),
        ("MOVE", vec!["s", "6"]),
        ("MOVE", vec!["t", "6"]),
    ] {
        let done: i64 = redis::cmd(command).arg(&args).query(&mut con).unwrap();
        assert_eq!(done, 1, "{command} {args:?}");
        let client = info_field_of_client(&mut con);
        assert!(
            client.contains(" db=0 "),
            "{command} {args:?} left the client at {client}"
        );
    }
}

fn info_field_of_client(con: &mut Connection) -> String {
    redis::cmd("CLIENT").arg("INFO").query(con).unwrap()
}

#[test]
fn a_table_is_swept_under_the_name_it_was_renamed_to() {
    let server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "t");
    let _: () = redis::cmd("RENAME")
        .arg("t")
        .arg("t2")
        .query(&mut con)
        .unwrap();
    write_where_events_are_not_heard(&mut con, "t2");
    wait_swept(&mut con, "t2");
}

#[test]
fn a_table_is_swept_in_the_database_it_was_moved_to() {
    let server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "t");
    let moved: i64 = redis::cmd("MOVE").arg("t").arg(3).query(&mut con).unwrap();
    assert_eq!(moved, 1);
    select(&mut con, 3);
    write_where_events_are_not_heard(&mut con, "t");
    wait_swept(&mut con, "t");
}

#[test]
fn a_copy_and_a_restored_table_are_swept_under_their_names() {
    let server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "t");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("t").query(&mut con).unwrap();
    let copied: i64 = redis::cmd("COPY")
        .arg("t")
        .arg("copy")
        .arg("DB")
        .arg(2)
        .query(&mut con)
        .unwrap();
    assert_eq!(copied, 1);
    let _: () = redis::cmd("RESTORE")
        .arg("restored")
        .arg(0)
        .arg(payload)
        .query(&mut con)
        .unwrap();
    wait_swept(&mut con, "restored");
    wait_swept(&mut con, "t");
    select(&mut con, 2);
    wait_swept(&mut con, "copy");
}

#[test]
fn swapdb_takes_the_tables_with_their_databases() {
    let server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "t");
    let _: () = redis::cmd("SWAPDB").arg(0).arg(5).query(&mut con).unwrap();
    select(&mut con, 5);
    wait_swept(&mut con, "t");
}

#[test]
fn tables_loaded_from_an_rdb_are_swept() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut con = server.conn();
    fill(&mut con, "t");
    select(&mut con, 1);
    fill(&mut con, "u");
    // Reloading empties the registry's view of the keyspace and fills it again from the
    // keys loaded, among many keys that are not tables.
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(10_000)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    wait_swept(&mut con, "u");
    select(&mut con, 0);
    wait_swept(&mut con, "t");
}

#[test]
fn flushall_empties_the_registry_and_new_tables_are_found() {
    let server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "t");
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    let text = info(&mut con, "rl");
    assert_eq!(info_field(&text, "rl_sweep_tables"), Some("0"), "{text}");
    fill(&mut con, "t");
    wait_swept(&mut con, "t");
}

#[test]
fn a_promoted_replica_sweeps_the_tables_it_was_sent() {
    let master = Server::start();
    let replica = Server::start();
    let mut m = master.conn();
    let mut r = replica.conn();
    // One table before the replica attaches (sent in the full sync's RDB), one after (sent
    // as RL.HSETSTATE in the stream).
    fill(&mut m, "before");
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut r)
        .unwrap();
    wait_for_replica(&mut m);
    fill(&mut m, "after");
    wait_for_replica(&mut m);
    // Cut off before the master sweeps: the replica holds every bucket, and never sweeps.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    wait_swept(&mut r, "before");
    wait_swept(&mut r, "after");
}

/// Sets `setting` to `refusing` (from then on the server refuses writes), checks that for
/// 600 ms the sweep removes nothing from table `t` and `INFO rl` names `reason`, then sets it
/// to `accepting` and waits for the sweep to resume on its own.
fn assert_held_until_lifted(
    con: &mut Connection,
    setting: &str,
    refusing: i64,
    accepting: i64,
    reason: &str,
) {
    let set = |con: &mut Connection, value: i64| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(setting)
            .arg(value)
            .query(con)
            .unwrap();
    };
    set(con, refusing);
    sleep(Duration::from_millis(600));
    assert_eq!(
        hlen(con, "t"),
        1 + SHORT_FIELDS as i64,
        "the sweep wrote while {setting} was {refusing}"
    );
    let text = info(con, "rl");
    assert_eq!(
        info_field(&text, "rl_sweep_held_because"),
        Some(reason),
        "{text}"
    );
    set(con, accepting);
    wait_swept(con, "t");
}

#[test]
fn min_replicas_to_write_not_met_holds_the_sweep_back() {
    let server = Server::start_with(&["--min-replicas-max-lag", "10"]);
    let mut con = server.conn();
    fill(&mut con, "t");
    // No replica: with one required the server refuses writes.
    assert_held_until_lifted(&mut con, "min-replicas-to-write", 1, 0, "min-replicas");
}

/// Over `maxmemory` the sweep goes on, as the server's own active expiry does: a removal
/// only frees memory, and a table has no key expiry to fall back on.
#[test]
fn a_server_over_maxmemory_sweeps_on() {
    let server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "t");
    // Any server uses more than a byte: at 1 it is out of memory, and refuses writes
    // (maxmemory-policy noeviction, the default).
    common::config_set(&mut con, "maxmemory", "1");
    let refused: redis::RedisResult<Vec<i64>> = redis::cmd("RL.HACQUIRE")
        .arg("t")
        .arg("new")
        .arg(&LONG[..])
        .query(&mut con);
    let refused = refused.expect_err("a write over maxmemory");
    assert_eq!(refused.code(), Some("OOM"), "{refused}");
    wait_swept(&mut con, "t");
    let text = info(&mut con, "rl");
    assert_eq!(
        info_field(&text, "rl_sweep_held_because"),
        Some("none"),
        "{text}"
    );
    common::config_set(&mut con, "maxmemory", "0");
}
