//! Eviction cannot open the gates: under the `volatile-*` policies a table full of denials is
//! never evicted (tables have no key expiry), while per-key buckets, which expire when full,
//! may be; under `allkeys-*` the module warns in the log, once, and in `INFO rl`.
//!
//! Size: `RL_EVICTION_BUCKETS` denied buckets in one table (default 50,000, so each test
//! takes seconds of a debug build on a shared machine; 200,000 passes too, in about 20 s a
//! test) beside 2,000 per-key buckets. `maxmemory` is set just above what that uses, then
//! more per-key buckets push the server over it, so the server must evict to take them. Rates are 1 token per 1000 s, so nothing refills during a test.

#![cfg(test)]

mod common;

use common::info::{info, info_field, used_memory};
use common::{config_set, Server};
use redis::Connection;

/// Denied buckets in the table.
fn table_buckets() -> usize {
    std::env::var("RL_EVICTION_BUCKETS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000)
}

/// Per-key buckets beside the table.
const KEYS: usize = 2_000;

/// `prefix{i}` for `i` in `range`, each a bucket of capacity 1 with its token taken: a
/// denial for its next call. In the table `table`, or one key each when `None`.
fn fill(con: &mut Connection, table: Option<&str>, prefix: &str, range: std::ops::Range<usize>) {
    let mut start = range.start;
    while start < range.end {
        let end = (start + 10_000).min(range.end);
        let mut pipe = redis::pipe();
        for i in start..end {
            let name = format!("{prefix}{i}");
            match table {
                Some(table) => pipe.cmd("RL.HACQUIRE").arg(table).arg(name),
                None => pipe.cmd("RL.ACQUIRE").arg(name),
            }
            .arg("0.001")
            .arg("1")
            .ignore();
        }
        let () = pipe.query(con).expect("the fill");
        start = end;
    }
}

/// `evicted_keys` from `INFO stats`.
fn evicted_keys(con: &mut Connection) -> u64 {
    let text = info(con, "stats");
    info_field(&text, "evicted_keys")
        .and_then(|v| v.parse().ok())
        .expect("evicted_keys")
}

/// A table of denials and 2,000 per-key buckets at `maxmemory` under `policy`; then more
/// per-key buckets, which the server must evict to take. Returns the connection, with the
/// table's expected size.
fn over_maxmemory(server: &Server, policy: &str) -> (Connection, usize) {
    let mut con = server.conn();
    config_set(&mut con, "maxmemory-policy", policy);
    let buckets = table_buckets();
    fill(&mut con, Some("gate"), "ip", 0..buckets);
    fill(&mut con, None, "key", 0..KEYS);
    let used = used_memory(&mut con);
    // Just above what is used: a few hundred more keys go over it.
    config_set(&mut con, "maxmemory", &(used + 64 * 1024).to_string());
    fill(&mut con, None, "more", 0..KEYS * 5);
    (con, buckets)
}

/// The table is all there, and its buckets still deny.
fn assert_gate_holds(con: &mut Connection, buckets: usize, policy: &str) {
    let len: usize = redis::cmd("RL.HLEN").arg("gate").query(con).unwrap();
    assert_eq!(len, buckets, "{policy}: the table lost buckets");
    for i in [0, buckets / 2, buckets - 1] {
        let reply: Vec<i64> = redis::cmd("RL.HACQUIRE")
            .arg("gate")
            .arg(format!("ip{i}"))
            .arg("0.001")
            .arg("1")
            .query(con)
            .unwrap();
        assert_eq!(reply[0], 0, "{policy}: ip{i} was let through: {reply:?}");
    }
}

fn volatile_policy_keeps_the_table(policy: &str) {
    let server = Server::start();
    let (mut con, buckets) = over_maxmemory(&server, policy);
    let evicted = evicted_keys(&mut con);
    assert!(
        evicted > 0,
        "{policy}: nothing was evicted; the test proves nothing"
    );
    assert_gate_holds(&mut con, buckets, policy);
    assert_eq!(
        info_field(&info(&mut con, "rl"), "rl_tables_evictable"),
        Some("no")
    );
    assert!(
        !server.log().contains("may evict a bucket table"),
        "{policy}: warned for a policy that keeps tables"
    );
    println!("{policy}: {evicted} per-key buckets evicted, the table of {buckets} kept");
}

#[test]
fn volatile_lru_never_evicts_a_table_of_denials() {
    volatile_policy_keeps_the_table("volatile-lru");
}

#[test]
fn volatile_ttl_never_evicts_a_table_of_denials() {
    volatile_policy_keeps_the_table("volatile-ttl");
}

/// Under `allkeys-lru` the module warns at load, once, and `INFO rl` says so once a table
/// exists; a change of policy at run time warns again.
#[test]
fn allkeys_lru_is_warned_at_load_and_in_info() {
    let server = Server::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let mut con = server.conn();
    let warning = "rl: maxmemory-policy allkeys-lru may evict a bucket table";
    let warned = |server: &Server, text: &str| server.log().matches(text).count();
    assert_eq!(warned(&server, warning), 1, "log:\n{}", server.log());
    assert_eq!(
        info_field(&info(&mut con, "rl"), "rl_tables_evictable"),
        Some("no"),
        "no table yet"
    );
    fill(&mut con, Some("gate"), "ip", 0..10);
    assert_eq!(
        info_field(&info(&mut con, "rl"), "rl_tables_evictable"),
        Some("yes")
    );
    // Over maxmemory, the server may evict anything: the warning was the point.
    let _ = over_maxmemory(&server, "allkeys-lru");
    assert_eq!(warned(&server, warning), 1, "warned once");
    config_set(&mut con, "maxmemory-policy", "volatile-lru");
    config_set(&mut con, "maxmemory", "0");
    wait_until(|| info_field(&info(&mut con, "rl"), "rl_tables_evictable") == Some("no"));
    config_set(&mut con, "maxmemory-policy", "allkeys-random");
    let warning = "rl: maxmemory-policy allkeys-random may evict a bucket table";
    wait_until(|| warned(&server, warning) == 1);
}

/// Polls `done` for up to 10 s (the sweep's timer reads the policy again after a change).
fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never happened");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
