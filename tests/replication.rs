//! Replication against a real master and replica: the replica holds byte-identical buckets
//! (after a full sync and from the command stream), the stream carries `RL.SETSTATE` and
//! never `RL.ACQUIRE`, calls that change nothing ship nothing, and a client's `RL.SETSTATE`
//! travels verbatim. States with a fraction of a nanosecond (rates such as 3/s and 7/s) ship
//! as `RL.SETSTATE key full_at_ns full_at_frac`, whole ones in 0.1.0's two-argument form, and
//! both replay from the AOF to the same bytes.
//!
//! Time: every bucket is far enough from full (slow rates, or costs of hundreds of tokens at
//! 3 to 10/s) that none fills up (and so no key expires) during a test. Nothing here asserts
//! a duration.

#![cfg(test)]

mod common;

use std::path::Path;

use common::aof::{parse_aof, uint_arg};
use common::info::{calls, info_number};
use common::rl::{self, multi, peek, refund, throttle};
use common::{
    acquire, acquire_cmd, all_keys, dump, error_text, exists, pexpiretime, snapshot,
    wait_for_replica, Server,
};
use redis::Connection;

/// The master's `master_repl_offset`: how many bytes it has fed its replication stream.
fn repl_offset(con: &mut Connection) -> i64 {
    info_number(con, "replication", "master_repl_offset")
}

/// `DEBUG DIGEST-VALUE key`: the digest of the value in memory (through the type's digest
/// callback, not its RDB form, so a state that lost its fraction on the way shows here).
fn digest_value(con: &mut Connection, key: &[u8]) -> Vec<String> {
    redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(con)
        .expect("DEBUG DIGEST-VALUE")
}

/// Asserts that master and replica hold the same keys, with equal DUMP payloads, in-memory
/// digests and PEXPIRETIME for each.
fn assert_same_state(master: &mut Connection, replica: &mut Connection) {
    let keys = all_keys(master);
    assert_eq!(
        all_keys(replica),
        keys,
        "the replica holds other keys than the master"
    );
    for key in &keys {
        let name = String::from_utf8_lossy(key);
        let payload = dump(master, key).expect("DUMP of a listed key");
        assert_eq!(
            dump(replica, key),
            Some(payload),
            "DUMP differs for {name:?}"
        );
        assert_eq!(
            digest_value(replica, key),
            digest_value(master, key),
            "DEBUG DIGEST-VALUE differs for {name:?}"
        );
        let expire_at = pexpiretime(master, key);
        // A per-key bucket expires when full; a table has no expiry (the sweep reclaims it).
        let kind: String = redis::cmd("TYPE").arg(key).query(master).expect("TYPE");
        if kind == "rl-htable" {
            assert_eq!(expire_at, -1, "{name:?} is a table with an expiry");
        } else {
            assert!(expire_at > 0, "{name:?} has no expiry ({expire_at})");
        }
        assert_eq!(
            pexpiretime(replica, key),
            expire_at,
            "PEXPIRETIME differs for {name:?}"
        );
    }
}

/// One call of a mix: key, rate, capacity, cost, and whether it must be allowed.
type Call = (
    &'static [u8],
    &'static str,
    &'static str,
    Option<&'static str>,
    bool,
);

/// Runs each call on `con`, checking the allowed flag so a mix means what it says.
fn run_calls(con: &mut Connection, calls: &[Call]) {
    for &(key, rate, capacity, cost, want_allowed) in calls {
        let reply = acquire(con, key, rate, capacity, cost);
        assert_eq!(
            reply[0] == 1,
            want_allowed,
            "RL.ACQUIRE {:?} {rate} {capacity} {cost:?} replied {reply:?}",
            String::from_utf8_lossy(key)
        );
    }
}

/// A bucket key that is not UTF-8.
const BINARY_KEY: &[u8] = b"\xff\xfe\x00bin";

#[test]
fn replica_holds_identical_state() {
    let server = Server::start();
    let mut master = server.conn();

    // Before the replica exists: it gets these buckets from the full sync (RDB).
    run_calls(
        &mut master,
        &[
            (b"a", "0.001", "3", None, true),            // new bucket
            (b"a", "0.001", "3", None, true),            // existing bucket
            (b"a", "0.001", "3", Some("2"), false),      // denied: one token left
            (b"frac", "0.01", "2.5", Some("0.5"), true), // fractional cost and capacity
            (b"frac", "0.01", "2.5", Some("1.5"), true),
            (b"frac", "0.01", "2.5", Some("0.75"), false),
            (BINARY_KEY, "0.001", "2", None, true),
            (b"big", "1", "100", Some("60"), true), // full again in 60 s
            (b"third", "3", "3000", Some("1000"), true), // a fraction of a ns: 1000 × 1e9/3
            (b"third", "3", "3000", Some("1"), true),
            (b"seventh", "7", "7000", Some("6999"), true), // full again in 999.86 s
            (b"tenth", "10", "10000", Some("5000"), true), // whole ns at 10/s
            (b"never", "1", "5", Some("6"), false),        // cost above capacity: no key
            (b"zero", "1", "5", Some("0"), true),          // cost 0: no key
        ],
    );
    assert!(!exists(&mut master, b"never") && !exists(&mut master, b"zero"));

    let replica_server = server.start_replica();
    let mut replica = replica_server.conn();
    wait_for_replica(&mut master);
    assert_same_state(&mut master, &mut replica);

    // With the replica attached: it gets these through the command stream.
    run_calls(
        &mut master,
        &[
            (b"a", "0.001", "3", None, true),             // takes the last token
            (b"a", "0.001", "3", None, false),            // denied
            (b"frac", "0.01", "2.5", Some("0.25"), true), // 0.25 left
            (b"frac", "0.01", "2.5", Some("0.5"), false),
            (BINARY_KEY, "0.001", "2", Some("0.5"), true),
            (BINARY_KEY, "0.001", "2", Some("0.5"), true),
            (BINARY_KEY, "0.001", "2", Some("0.5"), false),
            (b"big", "1", "100", Some("0"), true), // cost 0 on an existing bucket
            (b"big", "1", "100", Some("39"), true),
            (b"third", "3", "3000", Some("1"), true), // updated in place on the master
            (b"seventh", "7", "7000", Some("1"), true),
            (b"seventh", "7", "7000", Some("1000"), false), // 143 s of refill short
            (b"tenth", "10", "10000", Some("1"), true),
            (b"sevens", "7", "7000", Some("700"), true), // a new fractional bucket
            (b"late", "0.002", "4", Some("3.5"), true),  // created while streaming
            (b"late", "0.002", "4", None, false),
            (b"never", "1", "5", Some("6"), false),
        ],
    );
    wait_for_replica(&mut master);
    assert_same_state(&mut master, &mut replica);
    assert_eq!(
        all_keys(&mut master),
        [
            &b"a"[..],
            b"big",
            b"frac",
            b"late",
            b"sevens",
            b"seventh",
            b"tenth",
            b"third",
            BINARY_KEY
        ],
        "exactly the buckets that took tokens exist"
    );
}

/// Every command in the incremental AOF files under `dir/appendonlydir`.
fn aof_commands(dir: &Path) -> Vec<Vec<Vec<u8>>> {
    let aof_dir = dir.join("appendonlydir");
    let mut files: Vec<_> = std::fs::read_dir(&aof_dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", aof_dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.to_string_lossy().ends_with(".incr.aof"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no incremental AOF in {}",
        aof_dir.display()
    );
    files
        .iter()
        .flat_map(|f| parse_aof(&std::fs::read(f).expect("read AOF")))
        .collect()
}

#[test]
fn replication_stream_carries_setstate_never_acquire() {
    // The AOF is written before each reply, so the file is complete when the test reads it.
    let server = Server::start_with(&common::aof::PLAIN_AOF_ALWAYS);
    let replica_server = server.start_replica();
    let mut master = server.conn();
    let mut replica = replica_server.conn();

    let mix: &[Call] = &[
        (b"s1", "0.0003", "2", None, true),
        (b"s1", "0.0003", "2", None, true),
        (b"s1", "0.0003", "2", None, false), // denied
        (b"s2", "0.003", "1.5", Some("0.5"), true),
        (b"s2", "0.003", "1.5", Some("0"), true),  // cost 0
        (b"s2", "0.003", "1.5", Some("2"), false), // cost above capacity
        (BINARY_KEY, "0.0007", "1", None, true),
        (b"s3", "3", "3000", Some("1000"), true), // a fraction of a nanosecond
        (b"s3", "3", "3000", Some("1"), true),
        (b"s7", "7", "7000", Some("6999"), true),
        (b"s7", "7", "7000", Some("1000"), false), // denied: 143 s of refill short
        (b"s10", "10", "10000", Some("5000"), true), // whole nanoseconds
    ];
    run_calls(&mut master, mix);
    let allowed_writes = 8; // the allowed calls with a cost above 0
    wait_for_replica(&mut master);

    // The replica executed one RL.SETSTATE per write and never an RL.ACQUIRE.
    assert_eq!(calls(&mut replica, "rl.setstate"), Some(allowed_writes));
    assert_eq!(
        calls(&mut replica, "rl.acquire"),
        None,
        "RL.ACQUIRE reached the replica"
    );
    assert_eq!(calls(&mut master, "rl.acquire"), Some(mix.len() as u64));
    assert_same_state(&mut master, &mut replica);

    // The AOF is fed the same stream: only SELECT and RL.SETSTATE.
    let commands = aof_commands(server.dir.path());
    let names: Vec<String> = commands
        .iter()
        .map(|c| String::from_utf8_lossy(&c[0]).to_ascii_uppercase())
        .collect();
    assert!(
        names.iter().all(|n| n == "SELECT" || n == "RL.SETSTATE"),
        "unexpected commands in the AOF: {names:?}"
    );
    let set_states: Vec<&Vec<Vec<u8>>> = commands
        .iter()
        .filter(|c| c[0].eq_ignore_ascii_case(b"RL.SETSTATE"))
        .collect();
    assert_eq!(set_states.len() as u64, allowed_writes, "AOF: {names:?}");
    // Each key's last RL.SETSTATE is its exact state: its expiry is the full_at instant
    // rounded up to a millisecond, as the master holds it. A state with a fraction of a
    // nanosecond carries it as a third argument; a whole one keeps 0.1.0's two.
    let keys: &[(&[u8], bool)] = &[
        (b"s1", true), // 0.0003/s: 3,333.33… s a token, not whole ns
        (b"s2", true),
        (BINARY_KEY, true),
        (b"s3", true),
        (b"s7", true),
        (b"s10", false),
    ];
    for &(key, has_fraction) in keys {
        let name = String::from_utf8_lossy(key);
        let last = set_states
            .iter()
            .rev()
            .find(|c| c[1] == key)
            .unwrap_or_else(|| panic!("no RL.SETSTATE for {name:?}"));
        let full_at_ns = uint_arg(&last[2]);
        let full_at_frac = match last.len() {
            3 => 0,
            4 => uint_arg(&last[3]),
            n => panic!("RL.SETSTATE for {name:?} with {n} arguments"),
        };
        assert_eq!(last.len() == 4, has_fraction, "{name:?}: {last:?}");
        assert_eq!(full_at_frac != 0, has_fraction, "{name:?}: {last:?}");
        let ns_ceil = full_at_ns + u64::from(full_at_frac > 0);
        let expire_at_ms = i64::try_from(ns_ceil.div_ceil(1_000_000)).expect("fits");
        assert_eq!(pexpiretime(&mut master, key), expire_at_ms, "{name:?}");
    }

    // The AOF replays to the same bytes: restart the master from it. The replica is detached
    // first, so it keeps what the stream gave it instead of resyncing from the replay.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica)
        .expect("REPLICAOF NO ONE");
    let mut server = server;
    server.restart_with(&common::aof::PLAIN_AOF_ALWAYS);
    let mut replayed = server.conn();
    assert_same_state(&mut replayed, &mut replica);
    assert_eq!(all_keys(&mut replayed).len(), keys.len());
}

#[test]
fn denial_and_zero_cost_propagate_nothing() {
    // No replication PINGs during the test: they would move the offset too.
    let server = Server::start_with(&["--repl-ping-replica-period", "3600"]);
    let replica_server = server.start_replica();
    let mut master = server.conn();
    let mut replica = replica_server.conn();

    assert_eq!(acquire(&mut master, b"k", "0.001", "2", Some("2"))[0], 1);
    let offset = repl_offset(&mut master);

    // Calls that change nothing: each leaves the stream where it was.
    let unchanged: &[(&[u8], &str, &str, Option<&str>)] = &[
        (b"k", "0.001", "2", None),            // denied: the bucket is empty
        (b"k", "0.001", "2", Some("0")),       // cost 0 on an existing bucket
        (b"k", "0.001", "2", Some("3")),       // cost above capacity
        (b"missing", "0.001", "2", Some("0")), // cost 0 on a missing key
        (b"missing", "0.001", "2", Some("3")), // cost above capacity on a missing key
    ];
    for &(key, rate, capacity, cost) in unchanged {
        let reply = acquire(&mut master, key, rate, capacity, cost);
        assert_eq!(
            repl_offset(&mut master),
            offset,
            "RL.ACQUIRE {:?} {rate} {capacity} {cost:?} (reply {reply:?}) propagated something",
            String::from_utf8_lossy(key)
        );
    }
    // A rejected call propagates nothing either.
    let bad = acquire_cmd(b"k", "x", "2", None);
    assert!(error_text(&mut master, &bad).starts_with("ERR rate"));
    assert_eq!(
        repl_offset(&mut master),
        offset,
        "a rejected call propagated something"
    );

    // An allowed call does.
    assert_eq!(acquire(&mut master, b"other", "0.001", "2", None)[0], 1);
    assert!(
        repl_offset(&mut master) > offset,
        "an allowed call propagated nothing"
    );

    wait_for_replica(&mut master);
    assert_same_state(&mut master, &mut replica);
}

#[test]
fn setstate_replicates_verbatim_and_replica_is_read_only() {
    let server = Server::start();
    let replica_server = server.start_replica();
    let mut master = server.conn();
    let mut replica = replica_server.conn();

    // 2100-01-01T00:00:00Z plus 1 ns: the expiry rounds up to the next millisecond.
    let full_at_ns: u64 = 4_102_444_800_000_000_001;
    let set_state = |con: &mut Connection, key: &[u8], full_at_ns: u64| -> String {
        redis::cmd("RL.SETSTATE")
            .arg(key)
            .arg(full_at_ns)
            .query(con)
            .expect("RL.SETSTATE")
    };
    assert_eq!(set_state(&mut master, b"fixed", full_at_ns), "OK");
    assert_eq!(pexpiretime(&mut master, b"fixed"), 4_102_444_800_001);
    // Overwriting an existing bucket, on an exact millisecond this time.
    assert_eq!(set_state(&mut master, BINARY_KEY, full_at_ns), "OK");
    assert_eq!(set_state(&mut master, BINARY_KEY, full_at_ns - 1), "OK");
    assert_eq!(pexpiretime(&mut master, BINARY_KEY), 4_102_444_800_000);

    wait_for_replica(&mut master);
    assert_same_state(&mut master, &mut replica);
    assert_eq!(pexpiretime(&mut replica, b"fixed"), 4_102_444_800_001);
    assert_eq!(pexpiretime(&mut replica, BINARY_KEY), 4_102_444_800_000);
    // Replicated as it came: three RL.SETSTATE calls, nothing else of ours.
    assert_eq!(calls(&mut replica, "rl.setstate"), Some(3));
    assert_eq!(calls(&mut replica, "rl.acquire"), None);

    // The bucket is full in 2100: the master denies, the replica refuses to write at all.
    assert_eq!(acquire(&mut master, b"fixed", "1", "10", None)[0], 0);
    let before = dump(&mut replica, b"fixed");
    let on_replica = acquire_cmd(b"fixed", "1", "10", None);
    let text = error_text(&mut replica, &on_replica);
    assert!(
        text.starts_with("READONLY"),
        "RL.ACQUIRE on a replica: {text}"
    );
    let mut set_on_replica = redis::cmd("RL.SETSTATE");
    set_on_replica.arg("fixed").arg(1);
    let text = error_text(&mut replica, &set_on_replica);
    assert!(
        text.starts_with("READONLY"),
        "RL.SETSTATE on a replica: {text}"
    );
    assert_eq!(
        dump(&mut replica, b"fixed"),
        before,
        "the replica's bucket changed"
    );
    assert_eq!(pexpiretime(&mut replica, b"fixed"), 4_102_444_800_001);
}

#[test]
fn new_commands_replicate_their_effect_never_themselves() {
    let master_server = Server::start();
    let mut master = master_server.conn();
    let replica_server = master_server.start_replica();
    let mut replica = replica_server.conn();

    // RL.THROTTLE: allowed, then limited (nothing to ship).
    throttle(&mut master, &["th", "0", "1", "3600"]);
    assert_eq!(throttle(&mut master, &["th", "0", "1", "3600"])[0], 1);
    // RL.ACQUIRE.MULTI: allowed over three buckets (one named twice), then refused.
    let reply = multi(
        &mut master,
        &[
            "m1", "0.001", "5", "2", "m2", "0.001", "3", "1", "m1", "0.001", "5", "1.5",
        ],
    );
    assert_eq!(reply.allowed, 1, "{reply:?}");
    assert_eq!(
        multi(
            &mut master,
            &["m1", "0.001", "5", "2", "m2", "0.001", "3", "3"]
        )
        .allowed,
        0
    );
    // RL.REFUND: partly (RL.SETSTATE), to full (DEL), and of a missing key (nothing).
    rl::acquire(&mut master, &["r1", "0.001", "5", "4"]);
    rl::acquire(&mut master, &["r2", "0.001", "5", "4"]);
    assert_eq!(refund(&mut master, &["r1", "0.001", "5", "1.25"])[0], 2);
    assert_eq!(refund(&mut master, &["r2", "0.001", "5", "4"]), [5, 0]);
    assert_eq!(refund(&mut master, &["gone", "0.001", "5"]), [5, 0]);
    // RL.PEEK: nothing to ship.
    peek(&mut master, &["m1", "0.001", "5"]);

    wait_for_replica(&mut master);
    let on_master = snapshot(&mut master);
    let keys: Vec<&[u8]> = on_master.iter().map(|(k, _, _)| &k[..]).collect();
    assert_eq!(keys, [&b"m1"[..], b"m2", b"r1", b"th"]);
    for (key, payload, expire_at) in &on_master {
        assert!(payload.is_some() && *expire_at > 0, "{key:?}");
    }
    assert_eq!(
        snapshot(&mut replica),
        on_master,
        "the replica differs (DUMP/PEXPIRETIME)"
    );

    assert!(calls(&mut replica, "rl.setstate").is_some_and(|n| n >= 4));
    assert_eq!(calls(&mut replica, "del"), Some(1), "the refund to full");
    for name in [
        "rl.throttle",
        "rl.acquire.multi",
        "rl.refund",
        "rl.acquire",
        "rl.peek",
    ] {
        assert_eq!(
            calls(&mut replica, name),
            None,
            "{name} reached the replica"
        );
    }
}

#[test]
fn charges_into_debt_replicate_their_effect_and_replay_to_the_same_bytes() {
    let server = Server::start_with(&common::aof::PLAIN_AOF_ALWAYS);
    let mut master = server.conn();
    // Before the replica exists: it gets these from the full sync.
    rl::charge(&mut master, &["c1", "0.001", "5", "8"]); // three in debt
    rl::hcharge(&mut master, &["ct", "f", "0.001", "5", "12"]); // seven in debt
    let replica_server = server.start_replica();
    let mut replica = replica_server.conn();
    wait_for_replica(&mut master);
    assert_same_state(&mut master, &mut replica);

    // With the replica attached: charges into debt at rates whose 1e9 / rate is not whole
    // (states with a fraction of a ns), a charge adding to a debt, denials and refunds while
    // in debt, cost-0 charges, and the same on a table.
    rl::charge(&mut master, &["c1", "0.001", "5", "2"]);
    assert_eq!(rl::acquire(&mut master, &["c1", "0.001", "5", "0"])[0], 0);
    rl::charge(&mut master, &["c3", "3", "3000", "5000"]);
    rl::charge(&mut master, &["c7", "7", "7000", "9000"]);
    assert_eq!(refund(&mut master, &["c7", "7", "7000", "1"])[0], 0);
    rl::charge(&mut master, &["c7", "7", "7000", "0"]);
    rl::charge(&mut master, &["zero", "7", "7000", "0"]);
    rl::hcharge(&mut master, &["ct", "g", "3", "3000", "4000"]);
    rl::hcharge(&mut master, &["ct", "f", "0.001", "5", "1"]);
    assert_eq!(
        rl::hacquire(&mut master, &["ct", "f", "0.001", "5", "0"])[0],
        0
    );
    rl::hcharge(&mut master, &["ct", "h", "7", "7", "0"]);
    let _: Vec<i64> = redis::cmd("RL.HREFUND")
        .arg(&["ct", "g", "3", "3000", "1"])
        .query(&mut master)
        .expect("RL.HREFUND");
    wait_for_replica(&mut master);
    assert_same_state(&mut master, &mut replica);
    assert_eq!(
        all_keys(&mut master),
        [&b"c1"[..], b"c3", b"c7", b"ct"],
        "exactly the charged buckets exist"
    );
    assert_eq!(peek(&mut replica, &["c1", "0.001", "5", "0"])[1], -5);
    for name in ["rl.charge", "rl.hcharge", "rl.acquire", "rl.refund"] {
        assert_eq!(
            calls(&mut replica, name),
            None,
            "{name} reached the replica"
        );
    }

    // The AOF holds the effects only, and replays to the same bytes.
    let commands = aof_commands(server.dir.path());
    let names: Vec<String> = commands
        .iter()
        .map(|c| String::from_utf8_lossy(&c[0]).to_ascii_uppercase())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| n == "SELECT" || n == "RL.SETSTATE" || n == "RL.HSETSTATE"),
        "unexpected commands in the AOF: {names:?}"
    );
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica)
        .expect("REPLICAOF NO ONE");
    let mut server = server;
    server.restart_with(&common::aof::PLAIN_AOF_ALWAYS);
    let mut replayed = server.conn();
    assert_same_state(&mut replayed, &mut replica);
}

#[test]
fn a_zero_or_refused_charge_propagates_nothing() {
    // No replication PINGs during the test: they would move the offset too.
    let server = Server::start_with(&["--repl-ping-replica-period", "3600"]);
    let replica_server = server.start_replica();
    let mut master = server.conn();
    let mut replica = replica_server.conn();
    rl::charge(&mut master, &["k", "1", "1", "3153600000"]);
    rl::hcharge(&mut master, &["t", "f", "1", "1", "5"]);
    let offset = repl_offset(&mut master);
    // (command, arguments, refused): each changes nothing, so ships nothing.
    let rows: &[(&str, &[&str], bool)] = &[
        ("RL.CHARGE", &["k", "1", "1", "0"], false), // cost 0 on a bucket in debt
        ("RL.CHARGE", &["missing", "1", "1", "0"], false), // cost 0 on a missing key
        ("RL.HCHARGE", &["t", "f", "1", "1", "0"], false),
        ("RL.HCHARGE", &["t", "new", "1", "1", "0"], false),
        ("RL.CHARGE", &["k", "1", "1", "1"], true), // past the bound
        ("RL.HCHARGE", &["t", "f", "1", "1", "3153600000"], true),
    ];
    for &(name, args, refused) in rows {
        let reply: redis::RedisResult<Vec<i64>> = redis::cmd(name).arg(args).query(&mut master);
        assert_eq!(reply.is_err(), refused, "{name} {args:?}: {reply:?}");
        assert_eq!(
            repl_offset(&mut master),
            offset,
            "{name} {args:?} propagated something"
        );
    }
    wait_for_replica(&mut master);
    assert_same_state(&mut master, &mut replica);
}
