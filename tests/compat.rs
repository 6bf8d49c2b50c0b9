//! What differs between the servers of the compatibility matrix (`make test-servers` runs
//! every test file on each): the clock API the module picked, checked against the version the
//! server reports, and `MEMORY USAGE` of a bucket, which each server computes its own way.

#![cfg(test)]

mod common;

use common::info::{info, info_field};
use common::Server;
use redis::Connection;

/// A server as `INFO server` names it.
#[derive(Debug, PartialEq, Eq)]
enum Flavour {
    Redis,
    Valkey,
}

/// The server and its (major, minor) version. Valkey also reports a `redis_version` (7.2.4, for
/// clients that check it), so `valkey_version` decides.
fn server_version(con: &mut Connection) -> (Flavour, u32, u32) {
    let text = info(con, "server");
    let (flavour, version) = match info_field(&text, "valkey_version") {
        Some(version) => (Flavour::Valkey, version),
        None => (
            Flavour::Redis,
            info_field(&text, "redis_version").expect("redis_version in INFO server"),
        ),
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (flavour, major, minor),
        _ => panic!("unreadable version {version:?} in\n{text}"),
    }
}

#[test]
fn the_clock_is_cached_microseconds_except_on_redis_before_7_2() {
    let server = Server::start();
    let mut con = server.conn();
    let (flavour, major, minor) = server_version(&mut con);
    // RedisModule_CachedMicroseconds arrived in Redis 7.2; every Valkey has it.
    let want = if flavour == Flavour::Redis && (major, minor) < (7, 2) {
        "RedisModule_Milliseconds"
    } else {
        "RedisModule_CachedMicroseconds"
    };
    let text = info(&mut con, "rl");
    assert_eq!(
        info_field(&text, "rl_clock"),
        Some(want),
        "{flavour:?} {major}.{minor}"
    );
    // The load log names the same clock, so an operator sees it without INFO.
    assert!(
        server
            .log()
            .contains(&format!("rl: loaded; clock source {want}")),
        "the log does not name {want}:\n{}",
        server.log()
    );
}

fn memory_usage(con: &mut Connection, key: &str) -> Option<i64> {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query(con)
        .expect("MEMORY USAGE")
}

#[test]
fn memory_usage_of_a_bucket_is_counted_on_every_server() {
    let server = Server::start();
    let mut con = server.conn();
    let _: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg("bucket")
        .arg("0.001")
        .arg("10")
        .query(&mut con)
        .expect("RL.ACQUIRE");
    let _: () = redis::cmd("SET")
        .arg("string")
        .arg("0123456789")
        .query(&mut con)
        .expect("SET");
    let bucket = memory_usage(&mut con, "bucket").expect("the bucket exists");
    let string = memory_usage(&mut con, "string").expect("the string exists");
    // At least the server's 16-byte record of the value, and no more than a small string key
    // with some slack: the servers differ in whether they add the key and its table entry
    // (Valkey 8.1 adds neither for module values), never by more than that.
    assert!(
        (16..=string + 64).contains(&bucket),
        "MEMORY USAGE: bucket {bucket} bytes, 10-byte string {string} bytes"
    );
    assert_eq!(memory_usage(&mut con, "missing"), None);
}
