//! A table's expiry against what users do to the key: `PERSIST`, `EXPIRE`, `PEXPIREAT`,
//! `RESTORE` (TTL 0 or `ABSTTL`), `COPY` and `RENAME`. A table has no expiry of its own (the
//! sweep reclaims it): a user's command stands until the next write that stores a bucket,
//! which takes the expiry away, so the table never expires with live buckets in it (their
//! taken tokens would come back). Replicas and the AOF hold the master's expiry at each step.
//!
//! Time: bucket `a` (and every bucket of the property test) refills 1 token per 1000 s, so
//! it does not change during a test, and its full-at is thousands of seconds away; the
//! written bucket `b` is full again 1 ms after its call. A user's expiry is compared within
//! a second. The waits that let a wrong expiry pass are plain sleeps past it; nothing
//! asserts a duration.

#![cfg(test)]

mod common;

use std::cell::RefCell;
use std::thread::sleep;
use std::time::Duration;

use common::{dump, exists, pexpiretime, server_time_ms, snapshot, wait_for_replica, Server};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use redis::Connection;

/// Bucket `a`'s limit: 1 token per 1000 s, capacity 5.
const A: [&str; 2] = ["0.001", "5"];
/// Bucket `b`: capacity 1 at 1000/s, its token taken: full again 1 ms after the call.
const B: [&str; 3] = ["1000", "1", "1"];
/// How far an expiry may be from the full-at it should equal (ms).
const TOLERANCE_MS: i64 = 1000;
/// Ten years, in ms: an expiry far later than any bucket's full-at.
const FAR_MS: i64 = 10 * 365 * 24 * 3600 * 1000;

fn hacquire(con: &mut Connection, key: &str, field: &str, args: &[&str]) -> Vec<i64> {
    redis::cmd("RL.HACQUIRE")
        .arg(key)
        .arg(field)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("RL.HACQUIRE {key} {field} {args:?}: {e}"))
}

/// `PERSIST key`: 1 if it took an expiry away.
fn persist(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("PERSIST").arg(key).query(con).expect("PERSIST")
}

/// `RL.HPEEK key field rate capacity`'s reply.
fn hpeek(con: &mut Connection, key: &str, field: &str, limit: &[&str]) -> Vec<i64> {
    redis::cmd("RL.HPEEK")
        .arg(key)
        .arg(field)
        .arg(limit)
        .query(con)
        .unwrap_or_else(|e| panic!("RL.HPEEK {key} {field}: {e}"))
}

/// The server's clock and `RL.HPEEK`'s reply for each field (at limit `A`), read in one
/// transaction so they share an instant; and the key's `PEXPIRETIME` with them.
fn read_table(con: &mut Connection, key: &str, fields: &[String]) -> (i64, i64, Vec<Vec<i64>>) {
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("TIME").cmd("PEXPIRETIME").arg(key);
    for field in fields {
        pipe.cmd("RL.HPEEK").arg(key).arg(field).arg(&A[..]);
    }
    let (time, expire_at, peeks): ((i64, i64), i64, Vec<Vec<i64>>) = {
        let replies: Vec<redis::Value> = pipe.query(con).expect("read the table");
        let mut replies = replies.into_iter();
        let time = redis::from_redis_value(replies.next().expect("TIME")).expect("TIME");
        let expire_at =
            redis::from_redis_value(replies.next().expect("PEXPIRETIME")).expect("PEXPIRETIME");
        let peeks = replies
            .map(|v| redis::from_redis_value(v).expect("RL.HPEEK"))
            .collect();
        (time, expire_at, peeks)
    };
    let now_ms = time.0 * 1000 + time.1 / 1000;
    (now_ms, expire_at, peeks)
}

/// Asserts that `key` has no expiry.
fn assert_no_expiry(con: &mut Connection, key: &str, what: &str) {
    let got = pexpiretime(con, key.as_bytes());
    assert_eq!(got, -1, "{what}: {key} expires at {got}");
}

/// Table `key` holding bucket `a` with its 5 tokens taken (full again in 5000 s).
fn table_with_a(con: &mut Connection, key: &str) {
    assert_eq!(
        hacquire(con, key, "a", &["0.001", "5", "5"]),
        [1, 0, 0, 5_000_000]
    );
    assert_no_expiry(con, key, "a new table");
}

/// Writes bucket `b` of `key`, checks that the key then has no expiry, and that once `b` is
/// full (`wait` later) the table, and a's empty bucket, are still there.
fn write_b_then_a_holds(con: &mut Connection, key: &str, wait: Duration) {
    assert_eq!(hacquire(con, key, "b", &B), [1, 0, 0, 1], "writing b");
    assert_no_expiry(con, key, "after the write of b");
    sleep(wait);
    assert!(
        exists(con, key.as_bytes()),
        "{key} expired with a's bucket live"
    );
    let a = hpeek(con, key, "a", &["0.001", "5", "5"]);
    assert_eq!(a[..2], [0, 0], "a's tokens came back: {a:?}");
}

/// A user's `EXPIRE` then `PERSIST`, then a write of a short-lived bucket.
#[test]
fn a_write_after_persist_keeps_the_table_without_an_expiry() {
    let server = Server::start();
    let mut con = server.conn();
    table_with_a(&mut con, "t");
    assert_eq!(persist(&mut con, "t"), 0, "a table has no expiry to take");
    let _: i64 = redis::cmd("EXPIRE")
        .arg("t")
        .arg(100)
        .query(&mut con)
        .unwrap();
    assert_eq!(persist(&mut con, "t"), 1);
    assert_eq!(
        pexpiretime(&mut con, b"t"),
        -1,
        "PERSIST stands until a write"
    );
    write_b_then_a_holds(&mut con, "t", Duration::from_millis(100));
}

#[test]
fn a_write_after_expire_shortened_the_key_takes_the_expiry_away() {
    let server = Server::start();
    let mut con = server.conn();
    table_with_a(&mut con, "t");
    let _: i64 = redis::cmd("EXPIRE")
        .arg("t")
        .arg(1)
        .query(&mut con)
        .unwrap();
    // Past the 1 s the user asked for.
    write_b_then_a_holds(&mut con, "t", Duration::from_millis(1200));
}

#[test]
fn a_write_after_pexpireat_far_ahead_takes_the_expiry_away() {
    let server = Server::start();
    let mut con = server.conn();
    table_with_a(&mut con, "t");
    let far = server_time_ms(&mut con) + FAR_MS;
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("t")
        .arg(far)
        .query(&mut con)
        .unwrap();
    assert_eq!(
        pexpiretime(&mut con, b"t"),
        far,
        "PEXPIREAT stands until a write"
    );
    write_b_then_a_holds(&mut con, "t", Duration::from_millis(100));
}

#[test]
fn a_write_after_restore_without_a_ttl_keeps_the_table_without_an_expiry() {
    let server = Server::start();
    let mut con = server.conn();
    table_with_a(&mut con, "t");
    let payload = dump(&mut con, b"t").expect("DUMP t");
    let _: () = redis::cmd("RESTORE")
        .arg("t2")
        .arg(0)
        .arg(&payload)
        .query(&mut con)
        .unwrap();
    assert_eq!(
        pexpiretime(&mut con, b"t2"),
        -1,
        "RESTORE 0 stands until a write"
    );
    write_b_then_a_holds(&mut con, "t2", Duration::from_millis(100));
}

#[test]
fn a_write_after_restore_absttl_takes_the_expiry_away() {
    let server = Server::start();
    let mut con = server.conn();
    table_with_a(&mut con, "t");
    let payload = dump(&mut con, b"t").expect("DUMP t");
    let now = server_time_ms(&mut con);
    // Sooner than a's full-at (the key would take a's bucket with it), and far later.
    for (key, at) in [("soon", now + 1000), ("far", now + FAR_MS)] {
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(at)
            .arg(&payload)
            .arg("ABSTTL")
            .query(&mut con)
            .unwrap();
        assert_eq!(
            pexpiretime(&mut con, key.as_bytes()),
            at,
            "{key} as restored"
        );
        assert_eq!(hacquire(&mut con, key, "b", &B), [1, 0, 0, 1]);
        assert_no_expiry(&mut con, key, key);
    }
    sleep(Duration::from_millis(1200));
    let a = hpeek(&mut con, "soon", "a", &["0.001", "5", "5"]);
    assert_eq!(a[..2], [0, 0], "a's tokens came back: {a:?}");
}

#[test]
fn a_write_to_a_copy_leaves_it_without_an_expiry() {
    let server = Server::start();
    let mut con = server.conn();
    table_with_a(&mut con, "t");
    let copy = |con: &mut Connection, to: &str| {
        let copied: i64 = redis::cmd("COPY").arg("t").arg(to).query(con).unwrap();
        assert_eq!(copied, 1);
        assert_eq!(pexpiretime(con, to.as_bytes()), pexpiretime(con, b"t"));
    };
    copy(&mut con, "t2");
    write_b_then_a_holds(&mut con, "t2", Duration::from_millis(100));
    // A copy the user then gave an expiry.
    copy(&mut con, "t3");
    let _: i64 = redis::cmd("EXPIRE")
        .arg("t3")
        .arg(1)
        .query(&mut con)
        .unwrap();
    write_b_then_a_holds(&mut con, "t3", Duration::from_millis(1200));
}

#[test]
fn a_write_after_rename_leaves_it_without_an_expiry() {
    let server = Server::start();
    let mut con = server.conn();
    table_with_a(&mut con, "t");
    let _: () = redis::cmd("RENAME")
        .arg("t")
        .arg("t2")
        .query(&mut con)
        .unwrap();
    write_b_then_a_holds(&mut con, "t2", Duration::from_millis(100));
    // Renamed back, with its expiry shortened by the user in between.
    let _: i64 = redis::cmd("EXPIRE")
        .arg("t2")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("RENAME")
        .arg("t2")
        .arg("t")
        .query(&mut con)
        .unwrap();
    write_b_then_a_holds(&mut con, "t", Duration::from_millis(1200));
}

/// After each user command and each write, the replica holds the master's expiry (and
/// buckets), and the AOF replays to the same.
#[test]
fn replicas_and_the_aof_hold_the_masters_expiry_after_user_commands_and_writes() {
    let mut master = Server::start_with(&common::aof::PLAIN_AOF_ALWAYS);
    let replica = master.start_replica();
    let mut m = master.conn();
    let mut r = replica.conn();
    let far = server_time_ms(&mut m) + FAR_MS;
    let far = far.to_string();
    let steps: &[&[&str]] = &[
        &["RL.HACQUIRE", "t", "a", "0.001", "5", "5"],
        &["PERSIST", "t"],
        &["RL.HACQUIRE", "t", "b", "0.001", "5", "1"],
        &["EXPIRE", "t", "100"],
        &["RL.HACQUIRE", "t", "c", "0.001", "5", "2"],
        &["PEXPIREAT", "t", &far],
        &["RL.HACQUIRE", "t", "d", "0.001", "5", "1"],
        &["RENAME", "t", "t2"],
        &["PERSIST", "t2"],
        &["RL.HACQUIRE", "t2", "e", "0.001", "5", "1"],
    ];
    for step in steps {
        let (name, args) = step.split_first().unwrap();
        let _: redis::Value = redis::cmd(name).arg(args).query(&mut m).unwrap();
        wait_for_replica(&mut m);
        assert_eq!(snapshot(&mut r), snapshot(&mut m), "after {step:?}");
    }
    let on_master = snapshot(&mut m);
    master.restart_with(&common::aof::PLAIN_AOF_ALWAYS);
    assert_eq!(snapshot(&mut master.conn()), on_master, "after the AOF");
}

/// Fields of the property test's table.
const FIELDS: usize = 4;
/// Its buckets' capacity.
const CAPACITY: u32 = 5;

/// A step of the property test.
#[derive(Debug, Clone)]
enum Op {
    /// `RL.HACQUIRE cur f<field> 0.001 5 <cost>`: a write when allowed.
    Acquire { field: usize, cost: u32 },
    /// `PERSIST cur`.
    Persist,
    /// `EXPIRE cur 3000`: sooner than a bucket with 4 or 5 tokens taken is full.
    Expire,
    /// `PEXPIREAT cur <now + 10 years>`.
    PexpireatFar,
    /// `RESTORE cur 0 <DUMP cur> REPLACE`: no expiry.
    RestoreNoTtl,
    /// `RESTORE cur <now + 2000 s> <DUMP cur> REPLACE ABSTTL`.
    RestoreAbsttl,
    /// `COPY cur other REPLACE`, `DEL cur`: the table goes on under the other name.
    Copy,
    /// `RENAME cur other`.
    Rename,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..FIELDS, 1..=CAPACITY).prop_map(|(field, cost)| Op::Acquire { field, cost }),
        1 => Just(Op::Persist),
        1 => Just(Op::Expire),
        1 => Just(Op::PexpireatFar),
        1 => Just(Op::RestoreNoTtl),
        1 => Just(Op::RestoreAbsttl),
        1 => Just(Op::Copy),
        1 => Just(Op::Rename),
    ]
}

/// What the key's expiry may be after a step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expiry {
    /// None (`-1`): after a write, or a user's `PERSIST` or `RESTORE … 0`.
    Persisted,
    /// This instant (ms since the epoch), within [`TOLERANCE_MS`]: set by the user.
    At(i64),
}

/// The model: tokens taken per field (at 1 per 1000 s nothing refills during a test), the
/// table's current name, and the expiries allowed now. After a user's command its own
/// expiry stands; after a write that stores a bucket, none. A denial writes nothing.
struct Model {
    taken: [u32; FIELDS],
    name: &'static str,
    allowed: Vec<Expiry>,
}

impl Model {
    fn other(&self) -> &'static str {
        if self.name == "t" {
            "t2"
        } else {
            "t"
        }
    }

    fn user_set(&mut self, expiry: Expiry) {
        self.allowed = vec![expiry];
    }
}

fn field(i: usize) -> String {
    format!("f{i}")
}

/// Runs `op` on the server and the model; checks the reply of a write.
fn apply(con: &mut Connection, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    let (cur, other) = (model.name, model.other());
    match *op {
        Op::Acquire { field: f, cost } => {
            let cost_text = cost.to_string();
            let reply = hacquire(con, cur, &field(f), &[A[0], A[1], &cost_text]);
            let left = CAPACITY - model.taken[f];
            if cost <= left {
                prop_assert_eq!(&reply[..2], &[1, i64::from(left - cost)], "{:?}", op);
                model.taken[f] += cost;
                model.allowed = vec![Expiry::Persisted];
            } else {
                prop_assert_eq!(&reply[..2], &[0, i64::from(left)], "{:?}", op);
                // A denied call writes nothing, the key's expiry included.
            }
        }
        Op::Persist => {
            let _: i64 = redis::cmd("PERSIST").arg(cur).query(con).unwrap();
            model.user_set(Expiry::Persisted);
        }
        Op::Expire => {
            let now = server_time_ms(con);
            let _: i64 = redis::cmd("EXPIRE").arg(cur).arg(3000).query(con).unwrap();
            model.user_set(Expiry::At(now + 3_000_000));
        }
        Op::PexpireatFar => {
            let at = server_time_ms(con) + FAR_MS;
            let _: i64 = redis::cmd("PEXPIREAT").arg(cur).arg(at).query(con).unwrap();
            model.user_set(Expiry::At(at));
        }
        Op::RestoreNoTtl | Op::RestoreAbsttl => {
            let payload = dump(con, cur.as_bytes()).expect("the table exists");
            let mut restore = redis::cmd("RESTORE");
            restore.arg(cur);
            if matches!(op, Op::RestoreAbsttl) {
                let at = server_time_ms(con) + 2_000_000;
                restore.arg(at).arg(&payload).arg("REPLACE").arg("ABSTTL");
                model.user_set(Expiry::At(at));
            } else {
                restore.arg(0).arg(&payload).arg("REPLACE");
                model.user_set(Expiry::Persisted);
            }
            let _: () = restore.query(con).unwrap();
        }
        Op::Copy => {
            let copied: i64 = redis::cmd("COPY")
                .arg(cur)
                .arg(other)
                .arg("REPLACE")
                .query(con)
                .unwrap();
            prop_assert_eq!(copied, 1);
            let _: i64 = redis::cmd("DEL").arg(cur).query(con).unwrap();
            model.name = other;
        }
        Op::Rename => {
            let _: () = redis::cmd("RENAME").arg(cur).arg(other).query(con).unwrap();
            model.name = other;
        }
    }
    Ok(())
}

/// Checks the server against the model: every field holds what the model says (no tokens
/// came back), the other name holds nothing, and the expiry is one the model allows.
fn check(con: &mut Connection, model: &Model, after: &Op) -> Result<(), TestCaseError> {
    let fields: Vec<String> = (0..FIELDS).map(field).collect();
    let (now_ms, expire_at, peeks) = read_table(con, model.name, &fields);
    prop_assert!(!exists(con, model.other().as_bytes()), "after {:?}", after);
    for (f, peek) in peeks.iter().enumerate() {
        prop_assert_eq!(
            peek[1],
            i64::from(CAPACITY - model.taken[f]),
            "f{} after {:?}: {:?}",
            f,
            after,
            peek
        );
    }
    let latest = now_ms + peeks.iter().map(|p| p[3]).max().unwrap_or(0);
    let near = |want: i64| (expire_at - want).abs() <= TOLERANCE_MS;
    let fits = model.allowed.iter().any(|allowed| match *allowed {
        Expiry::Persisted => expire_at == -1,
        Expiry::At(at) => near(at),
    });
    prop_assert!(
        fits,
        "after {:?}: expires at {} (latest full-at {}, {} ms from it), allowed {:?}",
        after,
        expire_at,
        latest,
        expire_at - latest,
        model.allowed
    );
    Ok(())
}

/// Random sequences of writes and users' key commands against the model, on one server.
#[test]
fn a_table_has_no_expiry_after_a_write_whatever_users_did_to_the_key() {
    let server = Server::start();
    let con = RefCell::new(server.conn());
    let config = Config {
        cases: 16,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/table_expiry.txt",
        ))),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let steps = (1..=CAPACITY, prop::collection::vec(op(), 1..20));
    let result = runner.run(&steps, |(first_cost, ops)| {
        let con = &mut *con.borrow_mut();
        let _: () = redis::cmd("FLUSHALL").query(con).unwrap();
        let mut model = Model {
            taken: [0; FIELDS],
            name: "t",
            allowed: vec![Expiry::Persisted],
        };
        let first = Op::Acquire {
            field: 0,
            cost: first_cost,
        };
        for op in std::iter::once(&first).chain(&ops) {
            apply(con, &mut model, op)?;
            check(con, &model, op)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
