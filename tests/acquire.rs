//! RL.ACQUIRE against a real server: the burst/deny/refill sequence, the reply shape, the
//! expiry instant, MULTI/EXEC, EVAL, non-UTF-8 keys and command metadata.
//!
//! Time: rates are chosen so slow that refill cannot change a reply during a test, except
//! where a test waits for the `retry_after_ms` the server itself returned.

#![cfg(test)]

mod common;

use common::tables::{BAD_ACQUIRE, RATE_OUT_OF_RANGE_BEFORE_BAD_CAPACITY};
use common::{
    acquire, assert_rejected_on_empty_server, config_set, dump, exists, pexpiretime,
    server_time_ms, Server,
};
use redis::Value;

#[test]
fn burst_then_deny_then_refill() {
    let server = Server::start();
    let mut con = server.conn();
    // 1 token per 2 s, burst 3: three allowed, then a denial that names its wait. The rate is
    // slow enough that a stall of the test machine cannot refill a token between the calls.
    for want_remaining in [2, 1, 0] {
        let [allowed, remaining, retry_after_ms, reset_after_ms] =
            acquire(&mut con, b"burst", "0.5", "3", None);
        assert_eq!((allowed, remaining, retry_after_ms), (1, want_remaining, 0));
        assert!(
            reset_after_ms > 0 && reset_after_ms <= 6000,
            "reset {reset_after_ms}"
        );
    }
    let [allowed, remaining, retry_after_ms, reset_after_ms] =
        acquire(&mut con, b"burst", "0.5", "3", None);
    assert_eq!((allowed, remaining), (0, 0));
    assert!(
        retry_after_ms > 0 && retry_after_ms <= 2000,
        "retry {retry_after_ms}"
    );
    assert!(reset_after_ms >= retry_after_ms);
    // Waiting exactly the time the server named is enough.
    std::thread::sleep(std::time::Duration::from_millis(retry_after_ms as u64));
    let [allowed, ..] = acquire(&mut con, b"burst", "0.5", "3", None);
    assert_eq!(allowed, 1, "allowed once retry_after_ms has passed");
}

#[test]
fn readme_example_reply() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        acquire(&mut con, b"user:42", "5", "10", None),
        [1, 9, 0, 200]
    );
}

#[test]
fn cost_above_capacity_is_a_denial_with_minus_one() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        acquire(&mut con, b"k", "1", "10", Some("11")),
        [0, 10, -1, 0]
    );
    assert!(
        !exists(&mut con, b"k"),
        "a denial on a missing key creates nothing"
    );
}

#[test]
fn denial_and_zero_cost_write_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, b"k", "0.001", "2", Some("2"));
    let before = dump(&mut con, b"k").expect("bucket exists");
    let ttl_before = pexpiretime(&mut con, b"k");
    assert_eq!(acquire(&mut con, b"k", "0.001", "2", None)[0], 0);
    assert_eq!(acquire(&mut con, b"k", "0.001", "2", Some("0"))[0], 1);
    assert_eq!(dump(&mut con, b"k").as_deref(), Some(&before[..]));
    assert_eq!(pexpiretime(&mut con, b"k"), ttl_before);
    assert_eq!(
        acquire(&mut con, b"fresh", "1", "2", Some("0")),
        [1, 2, 0, 0]
    );
    assert!(
        !exists(&mut con, b"fresh"),
        "cost 0 on a missing key creates nothing"
    );
}

#[test]
fn expiry_is_the_full_instant() {
    let server = Server::start();
    let mut con = server.conn();
    let before_ms = server_time_ms(&mut con);
    // 1 token/s, take 5: full again 5 s after the call.
    let [_, _, _, reset_after_ms] = acquire(&mut con, b"k", "1", "10", Some("5"));
    assert_eq!(reset_after_ms, 5000);
    let after_ms = server_time_ms(&mut con);
    let expire_at = pexpiretime(&mut con, b"k");
    assert!(
        expire_at >= before_ms + 5000 && expire_at <= after_ms + 5001,
        "expiry {expire_at} not within [{}, {}]",
        before_ms + 5000,
        after_ms + 5001
    );
}

#[test]
fn works_inside_multi_exec() {
    let server = Server::start();
    let mut con = server.conn();
    let replies: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("RL.ACQUIRE")
        .arg("m")
        .arg("0.001")
        .arg("2")
        .cmd("RL.ACQUIRE")
        .arg("m")
        .arg("0.001")
        .arg("2")
        .cmd("RL.ACQUIRE")
        .arg("m")
        .arg("0.001")
        .arg("2")
        .query(&mut con)
        .expect("EXEC");
    let allowed: Vec<i64> = replies.iter().map(|r| r[0]).collect();
    assert_eq!(allowed, [1, 1, 0]);
}

#[test]
fn works_inside_eval() {
    let server = Server::start();
    let mut con = server.conn();
    let script = "local a = redis.call('RL.ACQUIRE', KEYS[1], '0.001', '1') \
                  local b = redis.call('RL.ACQUIRE', KEYS[1], '0.001', '1') \
                  return {a[1], b[1], b[3] > 0 and 1 or 0}";
    let reply: Vec<i64> = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("e")
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(reply, [1, 0, 1]);
}

#[test]
fn non_utf8_key() {
    let server = Server::start();
    let mut con = server.conn();
    let key = b"\xff\xfe\x00bucket";
    assert_eq!(acquire(&mut con, key, "0.001", "2", None)[..2], [1, 1]);
    assert_eq!(acquire(&mut con, key, "0.001", "2", None)[..2], [1, 0]);
    assert!(exists(&mut con, key));
    let key_type: String = redis::cmd("TYPE")
        .arg(&key[..])
        .query(&mut con)
        .expect("TYPE");
    assert_eq!(key_type, "rl-bucket");
}

#[test]
fn command_metadata_routes_the_key() {
    let server = Server::start();
    let mut con = server.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.ACQUIRE")
        .arg("route:me")
        .arg("1")
        .arg("2")
        .query(&mut con)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["route:me"]);
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.ACQUIRE")
        .query(&mut con)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    for flag in ["write", "denyoom", "fast"] {
        assert!(text.contains(flag), "flag {flag} missing from {text}");
    }
    // Key specs: the key is read, written and updated in place (RW, access, update).
    let keys: Vec<(String, Vec<String>)> = redis::cmd("COMMAND")
        .arg("GETKEYSANDFLAGS")
        .arg("RL.ACQUIRE")
        .arg("route:me")
        .arg("1")
        .arg("2")
        .query(&mut con)
        .expect("COMMAND GETKEYSANDFLAGS");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].0, "route:me");
    let mut flags = keys[0].1.clone();
    flags.sort();
    assert_eq!(flags, ["RW", "access", "update"]);
    let set_keys: Vec<(String, Vec<String>)> = redis::cmd("COMMAND")
        .arg("GETKEYSANDFLAGS")
        .arg("RL.SETSTATE")
        .arg("b")
        .arg("1")
        .query(&mut con)
        .expect("COMMAND GETKEYSANDFLAGS");
    assert_eq!(set_keys[0].0, "b");
    assert!(set_keys[0].1.contains(&"OW".to_string()), "{set_keys:?}");
}

#[test]
fn writes_publish_keyspace_events_and_denials_do_not() {
    let server = Server::start();
    let mut con = server.conn();
    config_set(&mut con, "notify-keyspace-events", "KEA");
    let mut listener = server.conn();
    let mut pubsub = listener.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:*").expect("PSUBSCRIBE");
    // Only events that must come are read, so a long timeout costs nothing but a hang guard.
    pubsub
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    acquire(&mut con, b"events", "0.001", "1", None); // a take: rl.take
    acquire(&mut con, b"events", "0.001", "1", None); // a denial: nothing
    let refund: Vec<i64> = redis::cmd("RL.REFUND")
        .arg("events")
        .arg("0.001")
        .arg("1")
        .query(&mut con)
        .expect("RL.REFUND"); // back to full: the key is deleted, del
    assert_eq!(refund, [1, 0]);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let msg = pubsub.get_message().expect("keyspace event");
        let key: String = msg.get_payload().expect("payload");
        seen.push((msg.get_channel_name().to_string(), key));
    }
    assert_eq!(
        seen,
        [
            ("__keyevent@0__:rl.take".to_string(), "events".to_string()),
            ("__keyevent@0__:del".to_string(), "events".to_string()),
        ],
        "the denial in between published nothing"
    );
}

#[test]
fn acquire_rejects_each_bad_argument_with_its_exact_error() {
    assert!(BAD_ACQUIRE.len() >= 30);
    assert_rejected_on_empty_server("RL.ACQUIRE", BAD_ACQUIRE);
}

#[test]
fn acquire_names_an_out_of_range_rate_before_an_unparsable_capacity() {
    assert_rejected_on_empty_server("RL.ACQUIRE", RATE_OUT_OF_RANGE_BEFORE_BAD_CAPACITY);
}
