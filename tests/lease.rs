//! Leases against real servers: RL.LEASE, RL.RELEASE, RL.RENEW, RL.LEASES and the internal
//! RL.LEASESETSTATE. Exact replies; a retried take answered as held, writing nothing; 1,000
//! concurrent callers on one key of limit 10 never holding more than 10; a holder that never
//! releases freeing its slot when its ttl runs out; a lease held across a failover (promotion
//! and the `FAILOVER` command, the old master's AOF included); made ids
//! never repeating across a restart or on a promoted replica; replica,
//! AOF replay, AOF rewrite and RDB restart holding identical values (`DUMP` and
//! `PEXPIRETIME`); WRONGTYPE both ways; every bad argument's exact error, writing nothing;
//! writes refused on replicas and held under `CLIENT PAUSE WRITE` and while `SHUTDOWN` waits
//! for a replica (then saved); the ACL category; the
//! loader refusing every malformed payload.
//!
//! Time: leases that must outlive a test last an hour. The one test about expiry waits for
//! the wait the server returned, never a duration of its own, and asserts no duration.

#![cfg(test)]

mod common;

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::aof::{parse_aof, PLAIN_AOF_ALWAYS};
use common::rdb::{crc64, CRASH_MARKERS};
use common::texts::{ID, ID_MISSING, TTL, WRONGTYPE};
use common::{
    arity, assert_rejected_on_empty_server, assert_restarts_keep, dbsize, dump, error_text, exists,
    info, pexpiretime, server_time_ms, snapshot, text_command as command, wait_for_replica, Server,
};
use redis::{Connection, Value};

const HOUR_MS: &str = "3600000";
const LIMIT_TEXT: &str = "ERR limit must be an integer from 1 to 10000 (leases)";
const OPTION_TEXT: &str = "ERR unknown option: RL.LEASE takes only ID id after ttl_ms";
const DROP_UNTIL_TEXT: &str =
    "ERR drop_until_us must be an integer from 0 to 288230376151711743 (µs since the Unix epoch)";
const EXPIRES_AT_TEXT: &str = "ERR expires_at_us must be an integer from 0 to 288230376151711743 (µs since the Unix epoch; 0 removes the lease)";
const TOO_MANY_TEXT: &str = "ERR a key holds at most 10000 leases";

/// `RL.LEASE`'s reply: allowed, id, in_use, expires_in_ms or retry_after_ms.
type Taken = (i64, Vec<u8>, i64, i64);

fn lease(con: &mut Connection, args: &[&str]) -> Taken {
    redis::cmd("RL.LEASE")
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("RL.LEASE {args:?}: {e}"))
}

fn int(con: &mut Connection, name: &str, args: &[&str]) -> i64 {
    redis::cmd(name)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("{name} {args:?}: {e}"))
}

fn leases(con: &mut Connection, key: &str, limit: &str) -> [i64; 2] {
    let reply: Vec<i64> = redis::cmd("RL.LEASES")
        .arg(key)
        .arg(limit)
        .query(con)
        .unwrap_or_else(|e| panic!("RL.LEASES {key} {limit}: {e}"));
    reply.try_into().expect("RL.LEASES replies with 2 integers")
}

fn rdb_changes(con: &mut Connection) -> i64 {
    common::info::rdb_changes(con)
}

#[test]
fn takes_up_to_the_limit_then_answers_the_wait_until_a_slot_frees() {
    let server = Server::start();
    let mut con = server.conn();
    let before_ms = server_time_ms(&mut con);
    // A made id is 16 hex characters; a lease's first reply is its ttl exactly.
    let (ok, made, in_use, expires_in) = lease(&mut con, &["k", "3", "1000"]);
    assert_eq!((ok, in_use, expires_in), (1, 1, 1000));
    assert_eq!(made.len(), 16, "{made:?}");
    assert!(made.iter().all(|b| b.is_ascii_hexdigit()), "{made:?}");
    assert_eq!(
        lease(&mut con, &["k", "3", "3000", "ID", "b"]),
        (1, b"b".to_vec(), 2, 3000)
    );
    assert_eq!(
        lease(&mut con, &["k", "3", "2000", "id", "c"]),
        (1, b"c".to_vec(), 3, 2000)
    );
    let after_ms = server_time_ms(&mut con);
    // The key expires with its last lease, b's: 3 s after the take, to the ms.
    let expire_at = pexpiretime(&mut con, b"k");
    assert!(
        (before_ms + 3000..=after_ms + 3001).contains(&expire_at),
        "{expire_at} not within [{before_ms}, {after_ms}] + 3 s"
    );
    // Full: denied with the wait until the earliest lease (the made one, 1 s) expires.
    let changes = rdb_changes(&mut con);
    let (ok, id, in_use, retry_after) = lease(&mut con, &["k", "3", "1000", "ID", "d"]);
    assert_eq!((ok, id.as_slice(), in_use), (0, &b""[..], 3));
    assert!((1..=1000).contains(&retry_after), "{retry_after}");
    // Under limit 2 two must go, so the wait is c's (2 s); under limit 1 all three, b's (3 s).
    let [in_use, wait] = leases(&mut con, "k", "2");
    assert!(
        in_use == 3 && (1001..=2000).contains(&wait),
        "{in_use} {wait}"
    );
    let [in_use, wait] = leases(&mut con, "k", "1");
    assert!(
        in_use == 3 && (2001..=3000).contains(&wait),
        "{in_use} {wait}"
    );
    assert_eq!(leases(&mut con, "k", "4"), [3, 0]);
    assert_eq!(leases(&mut con, "missing", "4"), [0, 0]);
    // Neither the denial nor the counts wrote anything.
    assert_eq!(rdb_changes(&mut con), changes);
    // A lower limit denies; a higher one takes.
    assert_eq!(lease(&mut con, &["k", "1", "1000", "ID", "d"]).0, 0);
    assert_eq!(
        lease(&mut con, &["k", "4", "1000", "ID", "d"]),
        (1, b"d".to_vec(), 4, 1000)
    );
    // Released one by one, the last release deletes the key.
    for (i, id) in ["b", "c", "d"].iter().enumerate() {
        assert_eq!(int(&mut con, "RL.RELEASE", &["k", id]), 1, "{id}");
        assert_eq!(leases(&mut con, "k", "4")[0], 3 - i as i64);
    }
    let made = String::from_utf8(made).unwrap();
    assert_eq!(int(&mut con, "RL.RELEASE", &["k", &made]), 1);
    assert!(!exists(&mut con, b"k"));
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn a_retried_take_with_its_id_is_answered_as_held_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(lease(&mut con, &["k", "1", HOUR_MS, "ID", "job-42"]).0, 1);
    let before = snapshot(&mut con);
    let changes = rdb_changes(&mut con);
    // The same id again, with another ttl and at a limit now full: held, its expiry as it was
    // (within the ms the calls take), nothing written.
    let (ok, id, in_use, expires_in) = lease(&mut con, &["k", "1", "5", "ID", "job-42"]);
    assert_eq!((ok, id.as_slice(), in_use), (1, &b"job-42"[..], 1));
    assert!(
        (3_599_000..=3_600_000).contains(&expires_in),
        "{expires_in}"
    );
    assert_eq!(snapshot(&mut con), before);
    assert_eq!(rdb_changes(&mut con), changes);
    // Another id is denied.
    assert_eq!(lease(&mut con, &["k", "1", "5", "ID", "other"]).0, 0);
}

#[test]
fn release_and_renew_reply_whether_the_lease_was_held() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(int(&mut con, "RL.RELEASE", &["k", "a"]), 0);
    assert_eq!(int(&mut con, "RL.RENEW", &["k", "a", "1000"]), 0);
    assert_eq!(dbsize(&mut con), 0, "a miss creates nothing");
    lease(&mut con, &["k", "5", "1000", "ID", "a"]);
    lease(&mut con, &["k", "5", "2000", "ID", "b"]);
    let changes = rdb_changes(&mut con);
    assert_eq!(int(&mut con, "RL.RELEASE", &["k", "x"]), 0);
    assert_eq!(int(&mut con, "RL.RENEW", &["k", "x", "1000"]), 0);
    assert_eq!(rdb_changes(&mut con), changes, "a miss writes nothing");
    // Renewing a for an hour makes it the key's last lease: the key's expiry follows.
    let before_ms = server_time_ms(&mut con);
    assert_eq!(int(&mut con, "RL.RENEW", &["k", "a", HOUR_MS]), 1);
    let expire_at = pexpiretime(&mut con, b"k");
    assert!(
        (before_ms + 3_600_000..=server_time_ms(&mut con) + 3_600_001).contains(&expire_at),
        "{expire_at}"
    );
    // Renewing shorter shortens: b for an hour and a for 1 s leave b last.
    assert_eq!(int(&mut con, "RL.RENEW", &["k", "b", HOUR_MS]), 1);
    assert_eq!(int(&mut con, "RL.RENEW", &["k", "a", "1000"]), 1);
    assert_eq!(int(&mut con, "RL.RELEASE", &["k", "a"]), 1);
    assert_eq!(int(&mut con, "RL.RELEASE", &["k", "a"]), 0, "released once");
    assert_eq!(
        int(&mut con, "RL.RENEW", &["k", "a", "1000"]),
        0,
        "not revived"
    );
    assert_eq!(leases(&mut con, "k", "5"), [1, 0]);
}

#[test]
fn a_holder_that_never_releases_frees_its_slot_when_its_ttl_runs_out() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        lease(&mut con, &["k", "1", "300", "ID", "gone"]),
        (1, b"gone".to_vec(), 1, 300)
    );
    let expire_at = pexpiretime(&mut con, b"k");
    let (ok, _, in_use, retry_after) = lease(&mut con, &["k", "1", "300", "ID", "next"]);
    let after_ms = server_time_ms(&mut con);
    assert_eq!((ok, in_use), (0, 1));
    assert!((1..=300).contains(&retry_after), "{retry_after}");
    // The key expires with its lease, to the ms: no later than the wait the server gave.
    assert!(
        expire_at <= after_ms + retry_after + 1,
        "{expire_at} {after_ms} {retry_after}"
    );
    // Waiting exactly what the server said is enough: not later.
    sleep(Duration::from_millis(retry_after as u64));
    assert_eq!(leases(&mut con, "k", "1"), [0, 0]);
    assert_eq!(
        lease(&mut con, &["k", "1", "300", "ID", "next"]),
        (1, b"next".to_vec(), 1, 300)
    );
    assert_eq!(
        int(&mut con, "RL.RELEASE", &["k", "gone"]),
        0,
        "expired, not held"
    );
}

#[test]
fn one_thousand_concurrent_callers_never_hold_more_than_the_limit() {
    const CALLERS: usize = 1000;
    const LIMIT: i64 = 10;
    let server = Server::start();
    // Each caller has its own connection, opened here so the server's accept queue never
    // overflows; the threads start together.
    let connections: Vec<Connection> = (0..CALLERS).map(|_| server.conn()).collect();
    let start = Arc::new(Barrier::new(CALLERS + 1));
    let holding = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let released = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(60);
    let callers: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(n, mut con)| {
            let (start, holding, most, released) = (
                start.clone(),
                holding.clone(),
                most.clone(),
                released.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                loop {
                    assert!(Instant::now() < deadline, "caller {n} never got a lease");
                    let (ok, id, in_use, _) = lease(&mut con, &["k", "10", "60000"]);
                    if ok == 0 {
                        // Denied only when full.
                        assert_eq!(in_use, LIMIT);
                        sleep(Duration::from_micros(500 + (n as u64 % 7) * 200));
                        continue;
                    }
                    assert!(in_use <= LIMIT, "{in_use} held");
                    // Counted after the take and uncounted before the release, so this never
                    // exceeds what the server holds.
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    sleep(Duration::from_millis(1));
                    holding.fetch_sub(1, Ordering::SeqCst);
                    let id = String::from_utf8(id).unwrap();
                    assert_eq!(int(&mut con, "RL.RELEASE", &["k", &id]), 1);
                    released.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            })
        })
        .collect();
    // A watcher samples the count while they run.
    let watching = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let mut con = server.conn();
        let (released, watching) = (released.clone(), watching.clone());
        std::thread::spawn(move || {
            while released.load(Ordering::SeqCst) < CALLERS && Instant::now() < deadline {
                let [in_use, _] = leases(&mut con, "k", "10");
                assert!(in_use <= LIMIT, "{in_use} leases held");
                watching.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    start.wait();
    for caller in callers {
        caller.join().expect("a caller failed");
    }
    watcher.join().expect("the watcher saw more than the limit");
    assert_eq!(released.load(Ordering::SeqCst), CALLERS);
    let most = most.load(Ordering::SeqCst);
    assert!((1..=LIMIT).contains(&most), "{most} held at once");
    let mut con = server.conn();
    assert_eq!(leases(&mut con, "k", "10"), [0, 0]);
    assert!(
        !exists(&mut con, b"k"),
        "every lease released, so the key is gone"
    );
}

#[test]
fn other_types_get_wrongtype_and_keep_their_value() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("hello")
        .query(&mut con)
        .unwrap();
    common::rl::acquire(&mut con, &["b", "0.001", "5"]);
    common::rl::hacquire(&mut con, &["t", "f", "0.001", "5"]);
    let before = snapshot(&mut con);
    for key in ["s", "b", "t"] {
        for cmd in [
            command("RL.LEASE", &[key, "1", "1000"]),
            command("RL.RELEASE", &[key, "a"]),
            command("RL.RENEW", &[key, "a", "1000"]),
            command("RL.LEASES", &[key, "1"]),
            command("RL.LEASESETSTATE", &[key, "0", "a", "1"]),
        ] {
            assert_eq!(error_text(&mut con, &cmd), WRONGTYPE, "{key}");
        }
    }
    assert_eq!(snapshot(&mut con), before);
    // And the other way: bucket commands on a lease key.
    lease(&mut con, &["l", "1", HOUR_MS]);
    let held = dump(&mut con, b"l");
    for cmd in [
        command("RL.ACQUIRE", &["l", "1", "5"]),
        command("RL.PEEK", &["l", "1", "5"]),
        command("RL.HACQUIRE", &["l", "f", "1", "5"]),
    ] {
        assert_eq!(error_text(&mut con, &cmd), WRONGTYPE);
    }
    assert_eq!(dump(&mut con, b"l"), held);
}

fn bad_rows() -> Vec<(&'static str, Vec<&'static [u8]>, String)> {
    let mut rows: Vec<(&str, Vec<&[u8]>, String)> = vec![
        ("RL.LEASE", vec![b"k", b"1"], arity("RL.LEASE")),
        (
            "RL.LEASE",
            vec![b"k", b"1", b"1", b"ID", b"a", b"x"],
            arity("RL.LEASE"),
        ),
        ("RL.LEASE", vec![b"k", b"0", b"1"], LIMIT_TEXT.into()),
        ("RL.LEASE", vec![b"k", b"10001", b"1"], LIMIT_TEXT.into()),
        ("RL.LEASE", vec![b"k", b"-1", b"1"], LIMIT_TEXT.into()),
        ("RL.LEASE", vec![b"k", b"1.5", b"1"], LIMIT_TEXT.into()),
        ("RL.LEASE", vec![b"k", b"", b"1"], LIMIT_TEXT.into()),
        (
            "RL.LEASE",
            vec![b"k", b"99999999999999999999999", b"1"],
            LIMIT_TEXT.into(),
        ),
        ("RL.LEASE", vec![b"k", b"1", b"0"], TTL.into()),
        ("RL.LEASE", vec![b"k", b"1", b"3153600000001"], TTL.into()),
        ("RL.LEASE", vec![b"k", b"1", b"1e3"], TTL.into()),
        ("RL.LEASE", vec![b"k", b"1", b"+5"], TTL.into()),
        ("RL.LEASE", vec![b"k", b"1", b"1", b"ID"], ID_MISSING.into()),
        (
            "RL.LEASE",
            vec![b"k", b"1", b"1", b"NX"],
            OPTION_TEXT.into(),
        ),
        (
            "RL.LEASE",
            vec![b"k", b"1", b"1", b"IDS", b"a"],
            OPTION_TEXT.into(),
        ),
        ("RL.LEASE", vec![b"k", b"1", b"1", b"ID", b""], ID.into()),
        (
            "RL.LEASE",
            vec![b"k", b"1", b"1", b"ID", b"0123456789abcdefX"],
            ID.into(),
        ),
        // The limit is checked before the ttl, the ttl before the option.
        ("RL.LEASE", vec![b"k", b"0", b"0", b"NX"], LIMIT_TEXT.into()),
        ("RL.LEASE", vec![b"k", b"1", b"0", b"NX"], TTL.into()),
        ("RL.RELEASE", vec![b"k"], arity("RL.RELEASE")),
        ("RL.RELEASE", vec![b"k", b"a", b"b"], arity("RL.RELEASE")),
        ("RL.RELEASE", vec![b"k", b""], ID.into()),
        ("RL.RELEASE", vec![b"k", b"0123456789abcdefX"], ID.into()),
        ("RL.RENEW", vec![b"k", b"a"], arity("RL.RENEW")),
        ("RL.RENEW", vec![b"k", b"", b"1"], ID.into()),
        ("RL.RENEW", vec![b"k", b"a", b"0"], TTL.into()),
        ("RL.RENEW", vec![b"k", b"a", b"x"], TTL.into()),
        ("RL.LEASES", vec![b"k"], arity("RL.LEASES")),
        ("RL.LEASES", vec![b"k", b"0"], LIMIT_TEXT.into()),
        ("RL.LEASES", vec![b"k", b"10001"], LIMIT_TEXT.into()),
        (
            "RL.LEASESETSTATE",
            vec![b"k", b"0", b"a"],
            arity("RL.LEASESETSTATE"),
        ),
        (
            "RL.LEASESETSTATE",
            vec![b"k", b"0", b"a", b"1", b"b"],
            arity("RL.LEASESETSTATE"),
        ),
        (
            "RL.LEASESETSTATE",
            vec![b"k", b"x", b"a", b"1"],
            DROP_UNTIL_TEXT.into(),
        ),
        (
            "RL.LEASESETSTATE",
            vec![b"k", b"288230376151711744", b"a", b"1"],
            DROP_UNTIL_TEXT.into(),
        ),
        ("RL.LEASESETSTATE", vec![b"k", b"0", b"", b"1"], ID.into()),
        (
            "RL.LEASESETSTATE",
            vec![b"k", b"0", b"a", b"-1"],
            EXPIRES_AT_TEXT.into(),
        ),
        (
            "RL.LEASESETSTATE",
            vec![b"k", b"0", b"a", b"288230376151711744"],
            EXPIRES_AT_TEXT.into(),
        ),
        // A good pair before a bad one: nothing is written.
        (
            "RL.LEASESETSTATE",
            vec![b"k", b"0", b"a", b"1", b"b", b"x"],
            EXPIRES_AT_TEXT.into(),
        ),
    ];
    rows.sort_by_key(|row| row.0);
    rows
}

#[test]
fn every_bad_argument_gets_its_exact_error_and_writes_nothing() {
    let rows = bad_rows();
    for name in [
        "RL.LEASE",
        "RL.RELEASE",
        "RL.RENEW",
        "RL.LEASES",
        "RL.LEASESETSTATE",
    ] {
        let mine: Vec<(Vec<&[u8]>, String)> = rows
            .iter()
            .filter(|row| row.0 == name)
            .map(|row| (row.1.clone(), row.2.clone()))
            .collect();
        assert!(!mine.is_empty(), "{name}");
        assert_rejected_on_empty_server(name, &mine);
    }
}

#[test]
fn lease_set_state_refuses_more_than_the_cap_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let far = "100000000000000000";
    let ids: Vec<String> = (0..10_001).map(|i| format!("i{i}")).collect();
    let mut cmd = redis::cmd("RL.LEASESETSTATE");
    cmd.arg("k").arg("0");
    for id in &ids[..10_000] {
        cmd.arg(id).arg(far);
    }
    let _: () = cmd.query(&mut con).expect("10,000 leases");
    assert_eq!(leases(&mut con, "k", "10000")[0], 10_000);
    let before = dump(&mut con, b"k");
    let one_more = command("RL.LEASESETSTATE", &["k", "0", &ids[10_000], far]);
    assert_eq!(error_text(&mut con, &one_more), TOO_MANY_TEXT);
    assert_eq!(dump(&mut con, b"k"), before);
    // Removing one first makes room.
    let swap = command(
        "RL.LEASESETSTATE",
        &["k", "0", &ids[0], "0", &ids[10_000], far],
    );
    let _: () = swap.query(&mut con).expect("swap");
    assert_eq!(leases(&mut con, "k", "10000")[0], 10_000);
    // RL.LEASE at the cap is denied like any full key.
    assert_eq!(lease(&mut con, &["k", "10000", "1"]).0, 0);
}

/// Each AOF file of `dir` that holds plain RESP, parsed into commands.
fn aof_commands(dir: &std::path::Path) -> Vec<Vec<Vec<u8>>> {
    let aof_dir = dir.join("appendonlydir");
    let mut names: Vec<_> = std::fs::read_dir(&aof_dir)
        .expect("appendonlydir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "aof"))
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|p| parse_aof(&std::fs::read(p).unwrap()))
        .collect()
}

/// Takes, renews, releases and denials on a few keys, leaving long leases behind, a key
/// emptied (deleted), and leases dropped after expiring.
fn populate(con: &mut Connection) {
    for id in ["a", "b", "c"] {
        lease(con, &["three", "3", HOUR_MS, "ID", id]);
    }
    assert_eq!(lease(con, &["three", "3", HOUR_MS, "ID", "d"]).0, 0);
    assert_eq!(int(con, "RL.RENEW", &["three", "b", "7200000"]), 1);
    assert_eq!(int(con, "RL.RELEASE", &["three", "c"]), 1);
    lease(con, &["made", "5", HOUR_MS]);
    lease(con, &["made", "5", "7200000"]);
    lease(con, &["gone", "1", HOUR_MS, "ID", "x"]);
    assert_eq!(int(con, "RL.RELEASE", &["gone", "x"]), 1);
    // Two leases of 1 ms, expired by the next take, which drops them everywhere.
    lease(con, &["drop", "5", "1", "ID", "short1"]);
    lease(con, &["drop", "5", "1", "ID", "short2"]);
    sleep(Duration::from_millis(5));
    lease(con, &["drop", "5", HOUR_MS, "ID", "long"]);
    lease(con, &["\u{0}bin\u{ff}", "2", HOUR_MS, "ID", "\u{1}"]);
}

#[test]
fn replica_aof_replay_rewrite_and_rdb_restart_hold_identical_leases() {
    let mut server = Server::start_with(&PLAIN_AOF_ALWAYS);
    let replica = server.start_replica();
    let mut con = server.conn();
    populate(&mut con);
    wait_for_replica(&mut con);
    let want = snapshot(&mut con);
    assert_eq!(want.len(), 4, "{want:?}");
    assert!(want
        .iter()
        .all(|(_, payload, expire)| payload.is_some() && *expire > 0));
    assert_eq!(snapshot(&mut replica.conn()), want, "replica");
    // The AOF holds the effects, never the clock-dependent commands.
    let commands = aof_commands(server.dir.path());
    let names: Vec<String> = commands
        .iter()
        .map(|c| String::from_utf8_lossy(&c[0]).to_ascii_uppercase())
        .collect();
    assert!(names.iter().any(|n| n == "RL.LEASESETSTATE"), "{names:?}");
    for clocked in ["RL.LEASE", "RL.RENEW", "RL.RELEASE"] {
        assert!(
            !names.iter().any(|n| n == clocked),
            "{clocked} in {names:?}"
        );
    }
    let drops = commands
        .iter()
        .filter(|c| c[0].eq_ignore_ascii_case(b"RL.LEASESETSTATE") && c[1] == b"drop")
        .count();
    assert_eq!(drops, 3);
    // Replayed from the AOF as written, rewritten and replayed, saved as RDB and loaded
    // without the AOF.
    let mut con = assert_restarts_keep(&mut server, &want);
    // COPY makes an identical value of its own.
    let _: i64 = redis::cmd("COPY")
        .arg("three")
        .arg("copy")
        .query(&mut con)
        .unwrap();
    assert_eq!(dump(&mut con, b"copy"), dump(&mut con, b"three"));
    assert_eq!(int(&mut con, "RL.RELEASE", &["copy", "a"]), 1);
    assert_eq!(
        leases(&mut con, "three", "3")[0],
        2,
        "the original keeps its leases"
    );
}

#[test]
fn a_lease_held_across_a_failover_is_still_held_on_the_new_master() {
    let server = Server::start();
    let replica = server.start_replica();
    let mut con = server.conn();
    assert_eq!(lease(&mut con, &["k", "2", HOUR_MS, "ID", "a"]).0, 1);
    let (_, made, _, _) = lease(&mut con, &["k", "2", HOUR_MS]);
    wait_for_replica(&mut con);
    let mut new = replica.conn();
    // The replica answers counts, and refuses writes as every write command is refused.
    assert_eq!(leases(&mut new, "k", "2")[0], 2);
    let refused = error_text(&mut new, &command("RL.LEASE", &["k", "3", "1"]));
    assert!(refused.starts_with("READONLY "), "{refused}");
    let want = snapshot(&mut con);
    let _: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut new)
        .unwrap();
    assert_eq!(snapshot(&mut new), want);
    // Both leases still count there: a retried take is held, a new one denied.
    let (ok, id, in_use, _) = lease(&mut new, &["k", "2", HOUR_MS, "ID", "a"]);
    assert_eq!((ok, id.as_slice(), in_use), (1, &b"a"[..], 2));
    assert_eq!(lease(&mut new, &["k", "2", HOUR_MS, "ID", "c"]).0, 0);
    let made = String::from_utf8(made).unwrap();
    assert_eq!(int(&mut new, "RL.RELEASE", &["k", &made]), 1);
    assert_eq!(lease(&mut new, &["k", "2", HOUR_MS, "ID", "c"]).0, 1);
}

fn role(con: &mut Connection) -> String {
    let text = info::info(con, "replication");
    info::info_field(&text, "role")
        .unwrap_or_default()
        .to_string()
}

#[test]
fn leases_held_across_the_failover_command_are_held_on_the_new_master_and_in_its_aof() {
    // FAILOVER pauses the master's writes, waits for the replica to catch up and swaps the
    // roles; the old master, with its AOF, then follows the new one.
    let mut old = Server::start_with(&PLAIN_AOF_ALWAYS);
    let replica = old.start_replica();
    let mut m = old.conn();
    assert_eq!(lease(&mut m, &["k", "3", HOUR_MS, "ID", "a"]).0, 1);
    let (_, made, _, _) = lease(&mut m, &["k", "3", HOUR_MS]);
    lease(&mut m, &["k", "3", "1", "ID", "short"]);
    sleep(Duration::from_millis(5));
    // Drops the expired one: the drop travels too.
    assert_eq!(lease(&mut m, &["k", "3", HOUR_MS, "ID", "b"]).2, 3);
    wait_for_replica(&mut m);
    let want = snapshot(&mut m);
    let _: () = redis::cmd("FAILOVER").query(&mut m).expect("FAILOVER");
    let mut r = replica.conn();
    let deadline = Instant::now() + Duration::from_secs(30);
    while role(&mut r) != "master"
        || role(&mut m) != "slave"
        || !info::info(&mut m, "replication").contains("master_link_status:up")
    {
        assert!(
            Instant::now() < deadline,
            "the failover did not complete:\n{}",
            info::info(&mut m, "replication")
        );
        sleep(Duration::from_millis(20));
    }
    assert_eq!(snapshot(&mut r), want, "the new master");
    // All three still count there: a retried take is held, a fourth denied.
    let (ok, id, in_use, _) = lease(&mut r, &["k", "3", HOUR_MS, "ID", "a"]);
    assert_eq!((ok, id.as_slice(), in_use), (1, &b"a"[..], 3));
    assert_eq!(lease(&mut r, &["k", "3", HOUR_MS, "ID", "c"]).0, 0);
    let made = String::from_utf8(made).unwrap();
    assert_eq!(int(&mut r, "RL.RELEASE", &["k", &made]), 1);
    assert_eq!(lease(&mut r, &["k", "3", HOUR_MS, "ID", "c"]).0, 1);
    wait_for_replica(&mut r);
    let now = snapshot(&mut r);
    assert_eq!(snapshot(&mut m), now, "the old master, now a replica");
    // Its AOF holds the same: restarted from it alone (no longer a replica), it is equal.
    drop(m);
    old.restart();
    assert_eq!(snapshot(&mut old.conn()), now, "the old master's AOF");
}

/// `n` leases taken on `key` with ids the server makes, each checked to be 16 hex characters.
fn made_ids(con: &mut Connection, key: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let (ok, id, _, _) = lease(con, &[key, "10000", HOUR_MS]);
            assert_eq!(ok, 1);
            assert!(
                id.len() == 16 && id.iter().all(|b| b.is_ascii_hexdigit()),
                "{id:?}"
            );
            id
        })
        .collect()
}

#[test]
fn made_ids_never_repeat_across_a_restart_or_on_a_promoted_replica() {
    // A generator seeded alike at each start would make the same ids again after a restart,
    // and on a replica started the same way: a late release from before could then free a
    // lease taken after. Each batch is on a key of its own, so the redraw against the key's
    // own leases cannot hide a repeat.
    const EACH: usize = 200;
    let mut server = Server::start_with(&PLAIN_AOF_ALWAYS);
    let mut con = server.conn();
    let mut seen: Vec<Vec<u8>> = made_ids(&mut con, "first", EACH);
    drop(con);
    server.restart();
    let mut con = server.conn();
    assert_eq!(leases(&mut con, "first", "10000")[0], EACH as i64, "kept");
    seen.extend(made_ids(&mut con, "after-restart", EACH));
    let replica = server.start_replica();
    wait_for_replica(&mut con);
    let mut promoted = replica.conn();
    let _: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut promoted)
        .unwrap();
    seen.extend(made_ids(&mut promoted, "on-promoted", EACH));
    seen.extend(made_ids(&mut con, "old-master", EACH));
    let all = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), all, "a made id repeated");
}

#[test]
fn writes_wait_under_client_pause_write_and_counts_do_not() {
    let server = Server::start();
    let mut admin = server.conn();
    lease(&mut admin, &["k", "5", HOUR_MS, "ID", "a"]);
    let _: String = redis::cmd("CLIENT")
        .arg(&["PAUSE", "10000", "WRITE"])
        .query(&mut admin)
        .unwrap();
    let writer = {
        let mut con = server.conn();
        std::thread::spawn(move || lease(&mut con, &["k", "5", HOUR_MS, "ID", "b"]))
    };
    // Counts are answered while writes are paused; the take waits and writes nothing.
    let mut reader = server.conn();
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        assert_eq!(leases(&mut reader, "k", "5"), [1, 0]);
        sleep(Duration::from_millis(20));
    }
    assert!(
        !writer.is_finished(),
        "RL.LEASE ran during CLIENT PAUSE WRITE"
    );
    let _: String = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut admin)
        .unwrap();
    assert_eq!(writer.join().unwrap(), (1, b"b".to_vec(), 2, 3_600_000));
}

/// `SHUTDOWN` waiting for a lagging replica holds lease writes back (counts are answered),
/// then saves and exits cleanly; the restart holds what was saved, and the take that waited
/// is not in it.
#[test]
fn shutdown_holds_lease_writes_while_it_waits_then_saves_them() {
    let args = ["--dbfilename", "dump.rdb", "--shutdown-timeout", "2"];
    let mut server = Server::start_with(&args);
    let replica = server.start_replica();
    let mut con = server.conn();
    populate(&mut con);
    wait_for_replica(&mut con);
    let want = snapshot(&mut con);
    replica.suspend();
    let shutdown = {
        let mut con = server.conn();
        con.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // No reply once the server exits.
        std::thread::spawn(move || redis::cmd("SHUTDOWN").arg("SAVE").query::<String>(&mut con))
    };
    sleep(Duration::from_millis(50));
    let taker = {
        let mut con = server.conn();
        con.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        std::thread::spawn(move || {
            command("RL.LEASE", &["three", "3", HOUR_MS, "ID", "late"]).query::<Value>(&mut con)
        })
    };
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        assert_eq!(
            leases(&mut con, "three", "3")[0],
            2,
            "a count while it waits"
        );
        sleep(Duration::from_millis(20));
    }
    assert!(!taker.is_finished(), "RL.LEASE ran while SHUTDOWN waited");
    let status = server.wait_exit(Duration::from_secs(30));
    let log = server.log();
    let status = status.unwrap_or_else(|| panic!("still running after SHUTDOWN; log:\n{log}"));
    assert!(
        status.success(),
        "SHUTDOWN ended with {status}; log:\n{log}"
    );
    assert!(
        log.contains("Waiting for replicas before shutting down"),
        "SHUTDOWN did not wait for the replica; log:\n{log}"
    );
    let _ = shutdown.join().expect("the SHUTDOWN thread");
    assert!(
        taker.join().expect("the taker").is_err(),
        "the waiting take got a reply"
    );
    replica.resume();
    drop(replica);
    server.restart();
    assert_eq!(
        snapshot(&mut server.conn()),
        want,
        "the RDB saved at shutdown"
    );
}

#[test]
fn the_commands_declare_their_flags_and_the_ratelimit_category() {
    let server = Server::start();
    let mut con = server.conn();
    let categories: Vec<String> = redis::cmd("ACL").arg("CAT").query(&mut con).unwrap();
    let has_category = categories.iter().any(|c| c == "ratelimit");
    for (name, flag, public) in [
        ("RL.LEASE", "write", true),
        ("RL.RELEASE", "write", true),
        ("RL.RENEW", "write", true),
        ("RL.LEASES", "readonly", true),
        ("RL.LEASESETSTATE", "write", false),
    ] {
        let info: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut con)
            .unwrap();
        let text = format!("{info:?}");
        assert!(text.contains(&format!("\"{flag}\"")), "{name}: {text}");
        if has_category {
            assert_eq!(text.contains("@ratelimit"), public, "{name}: {text}");
        }
    }
    if has_category {
        // +@ratelimit is enough to take and release a lease, not to forge one.
        let _: String = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&["app", "on", "nopass", "+@ratelimit", "~*"][..])
            .query(&mut con)
            .unwrap();
        let mut app = server.conn();
        let _: String = redis::cmd("AUTH")
            .arg("app")
            .arg("x")
            .query(&mut app)
            .unwrap();
        assert_eq!(lease(&mut app, &["k", "1", "1000", "ID", "a"]).0, 1);
        assert_eq!(int(&mut app, "RL.RELEASE", &["k", "a"]), 1);
        let forged = command("RL.LEASESETSTATE", &["k", "0", "a", "99999999999999999"]);
        assert!(error_text(&mut app, &forged).starts_with("NOPERM "));
    }
}

/// A `DUMP` payload of an `rl-leases` value: `header` (the type opcode and module id, taken
/// from a real payload), the fields, EOF, the RDB version and the CRC.
fn payload(header: &[u8], fields: &[Field], rdb_version: &[u8]) -> Vec<u8> {
    let mut bytes = header.to_vec();
    for field in fields {
        match field {
            Field::Unsigned(n) => {
                bytes.push(2);
                bytes.extend(common::rdb::rdb_len(*n));
            }
            Field::Bytes(b) => {
                bytes.push(5);
                bytes.extend(common::rdb::rdb_len(b.len() as u64));
                bytes.extend_from_slice(b);
            }
        }
    }
    bytes.push(0);
    bytes.extend_from_slice(rdb_version);
    let crc = crc64(&bytes);
    bytes.extend(crc.to_le_bytes());
    bytes
}

#[derive(Clone)]
enum Field {
    Unsigned(u64),
    Bytes(Vec<u8>),
}

fn restore(con: &mut Connection, key: &str, payload: &[u8]) -> Result<(), String> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .query::<()>(con)
        .map_err(|e| common::error_reply_text(&e))
}

#[test]
fn the_loader_refuses_every_malformed_value_and_reads_the_first_version() {
    let server = Server::start();
    let mut con = server.conn();
    let far: u64 = 100_000_000_000_000_000;
    let set = command("RL.LEASESETSTATE", &["k", "0", "a", &far.to_string()]);
    let _: () = set.query(&mut con).unwrap();
    let real = dump(&mut con, b"k").unwrap();
    // Opcode 7 (module, version 2), then the module id as a 64-bit length (0x81 + 8 bytes).
    assert_eq!(&real[..2], &[7, 0x81]);
    let header = &real[..10];
    let version = &real[real.len() - 10..real.len() - 8];
    use Field::{Bytes, Unsigned};
    let good = [Unsigned(1), Unsigned(far), Bytes(b"a".to_vec())];
    // The payload built here is the server's own.
    assert_eq!(payload(header, &good, version), real);
    // The checked-in first version (made by Redis 7.0.15) still restores.
    let fixture = std::fs::read("tests/fixtures/v1-leases.dump").expect("fixture");
    restore(&mut con, "fixture", &fixture).expect("v1 fixture");
    assert_eq!(leases(&mut con, "fixture", "3"), [2, 0]);
    assert_eq!(
        lease(&mut con, &["fixture", "3", "1", "ID", "alpha"]).0,
        1,
        "held"
    );
    assert_eq!(int(&mut con, "RL.RELEASE", &["fixture", "beta"]), 1);

    let mut wrong_version = header.to_vec();
    wrong_version[9] ^= 1; // encoding version 0 (the low 10 bits of the id)
    let two = |a: u64, ida: &[u8], b: u64, idb: &[u8]| {
        vec![
            Unsigned(2),
            Unsigned(a),
            Bytes(ida.to_vec()),
            Unsigned(b),
            Bytes(idb.to_vec()),
        ]
    };
    let rows: Vec<(&str, Vec<u8>)> = vec![
        (
            "unknown encoding version",
            payload(&wrong_version, &good, version),
        ),
        ("no leases", payload(header, &[Unsigned(0)], version)),
        (
            "above the cap",
            payload(header, &[Unsigned(10_001)], version),
        ),
        (
            "empty id",
            payload(
                header,
                &[Unsigned(1), Unsigned(far), Bytes(vec![])],
                version,
            ),
        ),
        (
            "17-byte id",
            payload(
                header,
                &[Unsigned(1), Unsigned(far), Bytes(vec![b'x'; 17])],
                version,
            ),
        ),
        (
            "expiry 0",
            payload(
                header,
                &[Unsigned(1), Unsigned(0), Bytes(b"a".to_vec())],
                version,
            ),
        ),
        (
            "expiry past 2^58",
            payload(
                header,
                &[Unsigned(1), Unsigned(1 << 58), Bytes(b"a".to_vec())],
                version,
            ),
        ),
        (
            "out of order",
            payload(header, &two(far + 1, b"a", far, b"b"), version),
        ),
        (
            "an id twice",
            payload(header, &two(far, b"a", far + 1, b"a"), version),
        ),
        (
            "a string for the count",
            payload(header, &[Bytes(b"1".to_vec())], version),
        ),
        (
            "fields missing",
            payload(
                header,
                &[Unsigned(2), Unsigned(far), Bytes(b"a".to_vec())],
                version,
            ),
        ),
        (
            "a field too many",
            payload(
                header,
                &[
                    Unsigned(1),
                    Unsigned(far),
                    Bytes(b"a".to_vec()),
                    Unsigned(1),
                ],
                version,
            ),
        ),
    ];
    for (what, bytes) in &rows {
        let err = restore(&mut con, "bad", bytes).expect_err(what);
        assert!(err.starts_with("ERR "), "{what}: {err}");
        assert!(!exists(&mut con, b"bad"), "{what}");
        server.assert_alive();
    }
    // Every truncation of a valid two-lease payload, checksummed, is refused too.
    let body = payload(header, &two(far, b"a", far, b"b"), version);
    restore(&mut con, "whole", &body).expect("the whole payload");
    let fields_end = body.len() - 11; // before EOF, the version and the CRC
    for cut in header.len()..fields_end {
        let mut bytes = body[..cut].to_vec();
        bytes.push(0);
        bytes.extend_from_slice(version);
        let crc = crc64(&bytes);
        bytes.extend(crc.to_le_bytes());
        assert!(restore(&mut con, "cut", &bytes).is_err(), "cut at {cut}");
        assert!(!exists(&mut con, b"cut"));
    }
    server.assert_alive();
    let log = server.log();
    for marker in CRASH_MARKERS {
        assert!(!log.contains(marker), "{marker} in the log:\n{log}");
    }
}

#[test]
fn a_held_lease_costs_at_most_32_bytes_beyond_the_key() {
    let server = Server::start();
    let mut con = server.conn();
    let usage = |con: &mut Connection| -> i64 {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg("k")
            .query(con)
            .unwrap()
    };
    lease(&mut con, &["k", "10000", HOUR_MS]);
    let one = usage(&mut con);
    for _ in 1..1000 {
        lease(&mut con, &["k", "10000", HOUR_MS]);
    }
    assert_eq!(leases(&mut con, "k", "10000")[0], 1000);
    let per_lease = (usage(&mut con) - one) as f64 / 999.0;
    assert!(per_lease <= 32.0, "{per_lease} bytes a lease");
    // Dropped down to one (every lease of the hour expired by the instant given), the
    // allocation shrinks with it.
    let far_future_us = 100_000_000_000_000_000u64;
    let _: () = redis::cmd("RL.LEASESETSTATE")
        .arg("k")
        .arg(far_future_us - 1)
        .arg("extra")
        .arg(far_future_us)
        .query(&mut con)
        .unwrap();
    assert_eq!(leases(&mut con, "k", "10000")[0], 1);
    assert!(
        usage(&mut con) <= one + 4 * 24,
        "{} after shrinking",
        usage(&mut con)
    );
}
