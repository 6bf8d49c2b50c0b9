//! One expiry everywhere: after any history of writes (takes, denials, refunds, charges,
//! `RL.HDEL`), AOF rewrites, reloads and restarts, every copy of a table (a replica attached
//! from the start, one attached later by a full sync, the AOF with and without the RDB
//! preamble, the rewritten AOF, an RDB, `DUMP`/`RESTORE`) holds the master's buckets and the
//! master's `PEXPIRETIME`, and no copy's expiry comes before its latest live bucket is full.
//!
//! The trap: a table's expiry is the latest any of its buckets asked for, which a removal
//! (`RL.HDEL`, a refund that fills a bucket) does not lower. A copy made from a snapshot (a
//! rewrite, an RDB, a full sync) holds only the live buckets, so a write after it computed
//! an earlier expiry there than on the master; a master that reloaded computed an earlier one
//! than its replicas. Removing each table's latest bucket is what the history below does
//! often, so most of the 30 tables go through that state.
//!
//! Time: every rate is at most 1 token per 100 s and the capacities are small, so a take's
//! full-at is minutes to weeks ahead and nothing fills during a test; the comparisons are of
//! `DUMP` payloads and `PEXPIRETIME` values, which do not move with the clock. `REDIS_SERVER`
//! picks the server (`make test-servers` runs this on every server of the matrix).

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{snapshot, Server, Snapshot};
use redis::Connection;

/// Tables in the history.
const TABLES: usize = 30;
/// Fields per table.
const FIELDS: usize = 6;
/// Limits (rate, capacity), one per table in turn: slow, and some with a fraction of a
/// nanosecond per token.
const LIMITS: [(&str, &str); 6] = [
    ("0.01", "3"),
    ("0.001", "5"),
    ("1/3600", "4"),
    ("0.0003", "2"),
    ("1/86400", "6"),
    ("0.007", "3"),
];

fn limit(table: usize) -> (&'static str, &'static str) {
    LIMITS[table % LIMITS.len()]
}

fn table_name(table: usize) -> String {
    format!("t{table}")
}

fn field(f: usize) -> String {
    format!("f{f}")
}

/// A small deterministic generator, so a failure replays the same history.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// One round of history on every table, pipelined: takes (some denied), refunds, charges and
/// removals, and after every few steps a removal of the table's field with the latest
/// full-at, so the table's expiry is left above every live bucket's.
fn history(con: &mut Connection, seed: u64) {
    let mut rng = Lcg(seed);
    let mut pipe = redis::pipe();
    for t in 0..TABLES {
        let key = table_name(t);
        let (rate, capacity) = limit(t);
        for step in 0..16 {
            let f = field(rng.next(FIELDS as u64) as usize);
            let cost = (1 + rng.next(3)).to_string();
            match rng.next(10) {
                0..=4 => {
                    pipe.cmd("RL.HACQUIRE")
                        .arg(&key)
                        .arg(&f)
                        .arg(rate)
                        .arg(capacity)
                        .arg(&cost)
                        .ignore();
                }
                5 => {
                    pipe.cmd("RL.HREFUND")
                        .arg(&key)
                        .arg(&f)
                        .arg(rate)
                        .arg(capacity)
                        .arg(&cost)
                        .ignore();
                }
                6 => {
                    pipe.cmd("RL.HCHARGE")
                        .arg(&key)
                        .arg(&f)
                        .arg(rate)
                        .arg(capacity)
                        .arg(&cost)
                        .ignore();
                }
                7 => {
                    pipe.cmd("RL.HDEL").arg(&key).arg(&f).ignore();
                }
                _ => {
                    // A deep debt on one field, soon removed below: the latest full-at.
                    pipe.cmd("RL.HACQUIRE")
                        .arg(&key)
                        .arg("deep")
                        .arg(rate)
                        .arg(capacity)
                        .arg(capacity)
                        .ignore();
                }
            }
            if step % 5 == 4 {
                pipe.cmd("RL.HDEL").arg(&key).arg("deep").ignore();
            }
        }
        // Keep the table (and its latest bucket gone) for the checks.
        pipe.cmd("RL.HACQUIRE")
            .arg(&key)
            .arg("deep")
            .arg(rate)
            .arg(capacity)
            .arg(capacity)
            .ignore();
        pipe.cmd("RL.HACQUIRE")
            .arg(&key)
            .arg("keep")
            .arg(rate)
            .arg(capacity)
            .arg("1")
            .ignore();
        pipe.cmd("RL.HDEL").arg(&key).arg("deep").ignore();
    }
    let () = pipe.query(con).expect("the history");
}

/// A short write on every table after a snapshot: a one-token take on a field of its own,
/// whose full-at is earlier than the table's expiry.
fn small_writes(con: &mut Connection, round: usize) {
    let mut pipe = redis::pipe();
    for t in 0..TABLES {
        let (rate, capacity) = limit(t);
        pipe.cmd("RL.HACQUIRE")
            .arg(table_name(t))
            .arg(format!("small{round}"))
            .arg(rate)
            .arg(capacity)
            .arg("1")
            .ignore();
    }
    let () = pipe.query(con).expect("the small writes");
}

/// `WAIT replicas 30000`: returns once `replicas` replicas acknowledged every write so far.
fn wait_for_replicas(con: &mut Connection, replicas: i64) {
    let acked: i64 = redis::cmd("WAIT")
        .arg(replicas)
        .arg(30_000)
        .query(con)
        .expect("WAIT");
    assert_eq!(acked, replicas, "the replicas did not acknowledge in time");
}

/// `BGREWRITEAOF`, waited for.
fn rewrite_aof(server: &Server) {
    let mut con = server.conn();
    let _: String = redis::cmd("BGREWRITEAOF")
        .query(&mut con)
        .expect("BGREWRITEAOF");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut con)
            .expect("INFO persistence");
        if info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") {
            assert!(
                info.contains("aof_last_bgrewrite_status:ok"),
                "rewrite failed:\n{info}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "AOF rewrite never finished; log:\n{}",
            server.log()
        );
        sleep(Duration::from_millis(10));
    }
}

/// The tables' part of a snapshot, with a readable failure: which tables differ, and by how
/// much their expiries do.
fn assert_same(what: &str, got: &Snapshot, want: &Snapshot) {
    let mut differ = Vec::new();
    for (w, g) in want.iter().zip(got) {
        if w != g {
            if std::env::var("RL_DEBUG").is_ok() {
                eprintln!("{:?}\n{:?}", w, g);
            }
            differ.push(format!(
                "{} (expiry {} ms from the master's{})",
                String::from_utf8_lossy(&w.0),
                g.2 - w.2,
                if w.1 == g.1 { "" } else { ", buckets differ" }
            ));
        }
    }
    assert!(
        got.len() == want.len() && differ.is_empty(),
        "{what}: {} of {} keys differ from the master ({} keys there): {differ:?}",
        differ.len(),
        want.len(),
        got.len()
    );
}

/// No table's expiry comes before its latest live bucket is full: for each field held, the
/// server's clock plus `RL.HPEEK`'s time to full, read in one transaction.
fn assert_no_early_expiry(con: &mut Connection, what: &str) {
    let fields: Vec<String> = (0..FIELDS)
        .map(field)
        .chain(["deep".into(), "keep".into()])
        .chain((0..4).map(|r| format!("small{r}")))
        .collect();
    for t in 0..TABLES {
        let key = table_name(t);
        let (rate, capacity) = limit(t);
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("TIME").cmd("PEXPIRETIME").arg(&key);
        for f in &fields {
            pipe.cmd("RL.HPEEK")
                .arg(&key)
                .arg(f)
                .arg(rate)
                .arg(capacity);
        }
        let replies: Vec<redis::Value> = pipe.query(con).expect("read the table");
        let mut replies = replies.into_iter();
        let (secs, micros): (i64, i64) = redis::from_redis_value(replies.next().unwrap()).unwrap();
        let expire_at: i64 = redis::from_redis_value(replies.next().unwrap()).unwrap();
        let now_ms = secs * 1000 + micros / 1000;
        let latest = replies
            .map(|v| redis::from_redis_value::<Vec<i64>>(v).unwrap()[3])
            .max()
            .unwrap();
        assert!(
            expire_at == -1 || expire_at >= now_ms + latest - 1,
            "{what}: {key} expires at {expire_at}, before its latest bucket is full at {}",
            now_ms + latest
        );
    }
}

/// A master with the AOF (`preamble` picks `aof-use-rdb-preamble`) and a replica from the
/// start; the history; a second replica by full sync; a rewrite; more history; a restart
/// from the AOF; a reload of the master alone; more writes. After each step every copy holds
/// the master's snapshot.
fn one_expiry_everywhere(preamble: &str) {
    let config = [
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        preamble,
        "--appendfsync",
        "always",
    ];
    let mut master = Server::start_with(&config);
    let early = master.start_replica();
    let mut m = master.conn();
    history(&mut m, 1);
    let late = master.start_replica();
    let replicas = 2;
    small_writes(&mut m, 0);
    wait_for_replicas(&mut m, replicas);
    let want = snapshot(&mut m);
    assert_eq!(want.len(), TABLES, "every table is there");
    assert_same(
        "a replica from the start",
        &snapshot(&mut early.conn()),
        &want,
    );
    assert_same("a replica by full sync", &snapshot(&mut late.conn()), &want);
    assert_no_early_expiry(&mut m, "the master");

    rewrite_aof(&master);
    history(&mut m, 2);
    small_writes(&mut m, 1);
    rewrite_aof(&master);
    small_writes(&mut m, 2);
    wait_for_replicas(&mut m, replicas);
    let want = snapshot(&mut m);
    assert_same(
        "a replica from the start",
        &snapshot(&mut early.conn()),
        &want,
    );
    assert_same("a replica by full sync", &snapshot(&mut late.conn()), &want);
    for copy in ["DUMP/RESTORE", "the rewritten AOF"] {
        if copy == "DUMP/RESTORE" {
            let mut restored = Server::start();
            let mut r = restored.conn();
            for (key, payload, expire_at) in &want {
                let _: () = redis::cmd("RESTORE")
                    .arg(key)
                    .arg((*expire_at).max(0))
                    .arg(payload.as_deref().unwrap())
                    .arg("ABSTTL")
                    .query(&mut r)
                    .unwrap();
            }
            assert_same(copy, &snapshot(&mut r), &want);
            // A write on each, at each server's own instant: the buckets written differ by
            // the clocks, the expiries may not.
            small_writes(&mut r, 3);
            small_writes(&mut m, 3);
            wait_for_replicas(&mut m, replicas);
            let expiries = |con: &mut Connection| -> Vec<(Vec<u8>, i64)> {
                snapshot(con).into_iter().map(|(k, _, e)| (k, e)).collect()
            };
            assert_eq!(
                expiries(&mut r),
                expiries(&mut m),
                "{copy}, then a write on each"
            );
            assert_no_early_expiry(&mut r, copy);
            restored.kill();
        } else {
            let want = snapshot(&mut m);
            drop(m);
            master.restart();
            m = master.conn();
            assert_same(copy, &snapshot(&mut m), &want);
            assert_no_early_expiry(&mut m, copy);
        }
    }
    drop((early, late));

    // The master reloads alone (its replica keeps its own tables), then writes.
    let replica = master.start_replica();
    let replicas = 1;
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut m)
        .expect("DEBUG RELOAD");
    history(&mut m, 3);
    wait_for_replicas(&mut m, replicas);
    let want = snapshot(&mut m);
    assert_same(
        "a replica across the master's reload",
        &snapshot(&mut replica.conn()),
        &want,
    );
    assert_no_early_expiry(&mut m, "the master after a reload");
    assert_no_early_expiry(&mut replica.conn(), "the replica");

    // SAVE and a restart from the RDB alone. (On Redis 8.0 the replica's full sync after the
    // reload may still be sending from its child, which SAVE waits out.)
    common::save(&mut m);
    let want = snapshot(&mut m);
    drop(m);
    master.restart_with(&["--appendonly", "no"]);
    let mut m = master.conn();
    assert_same("the RDB", &snapshot(&mut m), &want);
}

#[test]
fn every_copy_holds_the_masters_expiry_with_a_plain_aof() {
    one_expiry_everywhere("no");
}

#[test]
fn every_copy_holds_the_masters_expiry_with_an_rdb_preamble() {
    one_expiry_everywhere("yes");
}
