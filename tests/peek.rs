//! RL.PEEK against a real server: it answers like RL.ACQUIRE and takes nothing, every bad
//! argument gets its exact error, and it works where writes cannot (a read-only replica, a
//! read-only script).
//!
//! Time: rates are 0.001 token/s or slower, so refill cannot change a reply during a test.

#![cfg(test)]

mod common;

use common::rl::{acquire, peek};
use common::tables::limit_rows;
use common::{
    assert_rejected_on_empty_server, command, dump, error_text, exists, pexpiretime, snapshot,
    wait_for_replica, Server,
};

#[test]
fn peek_answers_like_acquire_and_takes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    // A missing key is a full bucket; peeking creates nothing.
    assert_eq!(peek(&mut con, &["k", "0.001", "3"]), [1, 3, 0, 0]);
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "3"]), [1, 3, 0, 0]);
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "0"]), [1, 3, 0, 0]);
    // More than the capacity: never possible, as RL.ACQUIRE says.
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "4"]), [0, 3, -1, 0]);
    assert!(!exists(&mut con, b"k"), "RL.PEEK created a key");

    assert_eq!(
        acquire(&mut con, &["k", "0.001", "3", "2"]),
        [1, 1, 0, 2_000_000]
    );
    let before = dump(&mut con, b"k").expect("bucket");
    let expire_before = pexpiretime(&mut con, b"k");

    // Enough for one: allowed, and remaining is the bucket now (1), not after a take (0).
    let [allowed, remaining, retry, reset] = peek(&mut con, &["k", "0.001", "3"])[..] else {
        unreachable!()
    };
    assert_eq!((allowed, remaining, retry), (1, 1, 0));
    assert!(reset > 0 && reset <= 2_000_000, "reset {reset}");
    // Not enough for two: the wait is one token (1000 s) shorter than the full refill, exactly.
    let [allowed, remaining, retry, reset] = peek(&mut con, &["k", "0.001", "3", "2"])[..] else {
        unreachable!()
    };
    assert_eq!((allowed, remaining), (0, 1));
    assert_eq!(reset - retry, 1_000_000, "retry {retry} reset {reset}");
    assert!(retry > 0 && retry <= 1_000_000);
    assert_eq!(peek(&mut con, &["k", "0.001", "3", "4"])[..3], [0, 1, -1]);

    // Nothing was written by any of it, and RL.ACQUIRE agrees with what was peeked.
    assert_eq!(dump(&mut con, b"k"), Some(before));
    assert_eq!(pexpiretime(&mut con, b"k"), expire_before);
    assert_eq!(acquire(&mut con, &["k", "0.001", "3", "2"])[..2], [0, 1]);
    assert_eq!(acquire(&mut con, &["k", "0.001", "3"])[..2], [1, 0]);
}

#[test]
fn peek_rejects_each_bad_argument_with_its_exact_error() {
    assert_rejected_on_empty_server("RL.PEEK", &limit_rows("RL.PEEK"));
}

#[test]
fn peek_works_on_a_read_only_replica_where_writes_get_readonly() {
    let master_server = Server::start();
    let mut master = master_server.conn();
    assert_eq!(
        acquire(&mut master, &["k", "0.001", "3", "3"]),
        [1, 0, 0, 3_000_000]
    );
    let replica_server = master_server.start_replica();
    let mut replica = replica_server.conn();
    wait_for_replica(&mut master);

    // The replica sees the empty bucket: the wait for one token is two tokens (2000 s)
    // shorter than the full refill, exactly.
    let [allowed, remaining, retry, reset] = peek(&mut replica, &["k", "0.001", "3"])[..] else {
        unreachable!()
    };
    assert_eq!((allowed, remaining), (0, 0));
    assert_eq!(reset - retry, 2_000_000, "retry {retry} reset {reset}");
    assert_eq!(peek(&mut replica, &["fresh", "0.001", "3"]), [1, 3, 0, 0]);
    // ...also from a read-only script on the replica.
    let from_script: Vec<i64> = redis::cmd("EVAL_RO")
        .arg("return redis.call('RL.PEEK', KEYS[1], '0.001', '3')")
        .arg(1)
        .arg("k")
        .query(&mut replica)
        .expect("EVAL_RO on the replica");
    assert_eq!(from_script[..2], [0, 0]);

    // Every command that can write is refused by the server before it runs.
    let writes: &[(&str, &[&[u8]])] = &[
        ("RL.ACQUIRE", &[b"k", b"0.001", b"3"]),
        ("RL.ACQUIRE", &[b"k", b"0.001", b"3", b"0"]),
        ("RL.ACQUIRE.MULTI", &[b"k", b"0.001", b"3", b"1"]),
        ("RL.THROTTLE", &[b"k", b"2", b"1", b"3600"]),
        ("RL.REFUND", &[b"k", b"0.001", b"3"]),
    ];
    let before = snapshot(&mut replica);
    for (name, args) in writes {
        let err = error_text(&mut replica, &command(name, args));
        assert!(err.starts_with("READONLY "), "{name} on a replica: {err}");
    }
    assert_eq!(snapshot(&mut replica), before);
}

#[test]
fn peek_works_inside_read_only_scripts() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, &["k", "0.001", "3", "2"]);
    let before = snapshot(&mut con);
    let script = "return redis.call('RL.PEEK', KEYS[1], '0.001', '3', ARGV[1])";
    let reply: Vec<i64> = redis::cmd("EVAL_RO")
        .arg(script)
        .arg(1)
        .arg("k")
        .arg("1")
        .query(&mut con)
        .expect("EVAL_RO");
    assert_eq!(reply[..3], [1, 1, 0]);
    let no_writes = format!("#!lua flags=no-writes\n{script}");
    let reply: Vec<i64> = redis::cmd("EVAL")
        .arg(&no_writes)
        .arg(1)
        .arg("k")
        .arg("2")
        .query(&mut con)
        .expect("EVAL with flags=no-writes");
    assert_eq!(reply[..2], [0, 1]);

    // A read-only script may not take: the server refuses RL.ACQUIRE (a write command).
    for (eval, body) in [
        (
            "EVAL_RO",
            "return redis.call('RL.ACQUIRE', KEYS[1], '0.001', '3')".to_string(),
        ),
        (
            "EVAL",
            "#!lua flags=no-writes\nreturn redis.call('RL.ACQUIRE', KEYS[1], '0.001', '3')"
                .to_string(),
        ),
    ] {
        let mut cmd = redis::cmd(eval);
        cmd.arg(body).arg(1).arg("k");
        let err = error_text(&mut con, &cmd);
        assert!(
            err.starts_with("ERR ") && err.contains("read-only"),
            "{eval}: {err}"
        );
    }
    assert_eq!(
        snapshot(&mut con),
        before,
        "a read-only script changed a bucket"
    );
}
