//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) with the module loaded, on a
//! real six-node cluster: the source sends the slot as an AOF-format snapshot (the type's
//! `aof_rewrite`, so `RL.SETSTATE`) and then streams the slot's writes (`RL.SETSTATE` effects)
//! until it hands the slot over.
//!
//! - A migration while clients acquire on the slot's buckets moves every bucket exactly: the
//!   target holds DUMP- and PEXPIRETIME-identical state to the one the allowed replies add up
//!   to, every allowed reply saw its own state (no admission lost or doubled), and the
//!   target's replica holds the same.
//! - A cancelled migration leaves the source intact and the target without the slot's keys;
//!   a migration after it moves the exact state.
//!
//! Servers without the feature (Redis, Valkey before 9) skip each test with a printed reason:
//! `CLUSTER MIGRATESLOTS` is unknown there.
//!
//! Time: the rate is 2^-10 token/s, so no bucket refills a token during a test, and each
//! bucket starts from an exact state set with `RL.SETSTATE`. Waits poll the cluster's state
//! up to a deadline; nothing asserts a duration. `DEBUG SLOTMIGRATION PREVENT-PAUSE`, Valkey's
//! test hook, holds a migration in its streaming phase for as long as a test needs.

#![cfg(test)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, SETTLE_DEADLINE};
use common::info::{calls, info};
use common::{dump, pexpiretime, wait_for_replica_after_others, Server};
use redis::{Connection, Value};

/// One token every 1000 s: no refill during a test, and a whole number of nanoseconds.
// 2^-10 token/s: a whole number of ns per token (1.024e12), so the reference state built
// with the two-argument RL.SETSTATE is exact. (The double 0.001 is not a thousandth.)
const RATE: &str = "0.0009765625";
const NS_PER_TOKEN: i64 = 1_024_000_000_000;
/// The buckets every client takes from, in one slot, and the capacity of each.
const BIG: [&str; 3] = ["{rl:asm}:a", "{rl:asm}:b", "{rl:asm}:c"];
const BIG_CAPACITY: i64 = 1_000_000;
/// A bucket that runs dry during the test: it starts holding `SMALL_CAPACITY - 1` tokens.
const SMALL: &str = "{rl:asm}:small";
const SMALL_CAPACITY: i64 = 40;
/// Client threads.
const CLIENTS: usize = 4;

/// `None` if the server has atomic slot migration, else why the test is skipped.
fn skip_reason() -> Option<String> {
    let server = Server::start();
    let mut con = server.conn();
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("CLUSTER|MIGRATESLOTS")
        .query(&mut con)
        .expect("COMMAND INFO");
    let version = common::info::info_field(&info_text(&mut con), "redis_version")
        .unwrap_or("?")
        .to_string();
    matches!(info.first(), None | Some(Value::Nil)).then(|| {
        format!(
            "skipped: {} (redis_version {version}) has no CLUSTER MIGRATESLOTS; atomic slot \
             migration is Valkey 9+",
            common::server_binary()
        )
    })
}

fn info_text(con: &mut Connection) -> String {
    info(con, "server")
}

/// The server's clock in nanoseconds (`TIME`).
fn now_ns(con: &mut Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    (secs * 1_000_000 + micros) * 1_000
}

fn set_state(con: &mut Connection, key: &str, full_at_ns: i64) {
    let ok: String = redis::cmd("RL.SETSTATE")
        .arg(key)
        .arg(full_at_ns)
        .query(con)
        .unwrap_or_else(|e| panic!("RL.SETSTATE {key} {full_at_ns}: {e}"));
    assert_eq!(ok, "OK");
}

fn ok(con: &mut Connection, args: &[&str]) {
    let reply: String = redis::cmd(args[0])
        .arg(&args[1..])
        .query(con)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert_eq!(reply, "OK", "{args:?}");
}

/// `CLUSTER GETSLOTMIGRATIONS`: one map per job.
fn migrations(con: &mut Connection) -> Vec<HashMap<String, String>> {
    let jobs: Vec<Value> = redis::cmd("CLUSTER")
        .arg("GETSLOTMIGRATIONS")
        .query(con)
        .expect("CLUSTER GETSLOTMIGRATIONS");
    jobs.into_iter()
        .map(|job| {
            let fields: Vec<Value> = match job {
                Value::Array(fields) => fields,
                Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                other => panic!("a migration job: {other:?}"),
            };
            fields
                .chunks(2)
                .map(|pair| {
                    let text = |v: &Value| match v {
                        Value::Int(n) => n.to_string(),
                        other => redis::from_redis_value::<String>(other.clone())
                            .unwrap_or_else(|_| format!("{other:?}")),
                    };
                    (text(&pair[0]), pair.get(1).map(text).unwrap_or_default())
                })
                .collect()
        })
        .collect()
}

/// Waits until the node's only export job is in `state`, failing early on a terminal state
/// that is not the one awaited.
fn wait_for_export(con: &mut Connection, state: &str) {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        last = migrations(con);
        let exports: Vec<_> = last
            .iter()
            .filter(|j| j.get("operation").map(String::as_str) == Some("EXPORT"))
            .collect();
        if let Some(job) = exports.last() {
            let now = job.get("state").map(String::as_str).unwrap_or_default();
            if now == state {
                return;
            }
            assert!(
                !matches!(now, "failed" | "cancelled" | "success"),
                "the export ended {now}, not {state}: {job:?}"
            );
        }
        sleep(Duration::from_millis(20));
    }
    panic!("the export never reached {state}: {last:?}");
}

/// Every key of the test's slot with its DUMP and PEXPIRETIME, in key order.
fn slot_state(con: &mut Connection, keys: &[&str]) -> Vec<(Option<Vec<u8>>, i64)> {
    keys.iter()
        .map(|k| (dump(con, k.as_bytes()), pexpiretime(con, k.as_bytes())))
        .collect()
}

fn all_keys() -> Vec<&'static str> {
    BIG.iter().copied().chain([SMALL]).collect()
}

/// The replies one client saw: per key, the `remaining` of each allowed call and the number
/// of denials.
#[derive(Default)]
struct Seen {
    allowed: HashMap<&'static str, Vec<i64>>,
    denied: HashMap<&'static str, usize>,
    /// Calls answered by each port.
    by_port: HashMap<u16, usize>,
}

/// One client: `RL.ACQUIRE` on every key in turn, on the node that serves the slot, until
/// `stop`. A `MOVED` reply (the command did not run) sends it to the new owner, a `TRYAGAIN`
/// retries. Any other error, or no reply at all, fails the test: the call's outcome would be
/// unknown, and the counts could not be checked.
fn client(mut port: u16, stop: &AtomicBool) -> Seen {
    let connect = |port: u16| {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
        let con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect");
        con.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        con
    };
    let mut con = connect(port);
    let mut seen = Seen::default();
    let keys = all_keys();
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let key = keys[turn % keys.len()];
        let capacity = if key == SMALL {
            SMALL_CAPACITY
        } else {
            BIG_CAPACITY
        };
        let reply: redis::RedisResult<Vec<i64>> = redis::cmd("RL.ACQUIRE")
            .arg(key)
            .arg(RATE)
            .arg(capacity)
            .query(&mut con);
        match reply {
            Ok(reply) => {
                *seen.by_port.entry(port).or_default() += 1;
                if reply[0] == 1 {
                    seen.allowed.entry(key).or_default().push(reply[1]);
                } else {
                    *seen.denied.entry(key).or_default() += 1;
                }
                turn += 1;
            }
            Err(e) if e.code() == Some("MOVED") => {
                let (address, _slot) = e.redirect_node().expect("MOVED names a node");
                port = address
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("MOVED names a port");
                con = connect(port);
            }
            Err(e) if e.code() == Some("TRYAGAIN") => sleep(Duration::from_millis(5)),
            Err(e) => panic!("RL.ACQUIRE {key} on {port}: {e}"),
        }
    }
    seen
}

/// Runs `CLIENTS` clients against the slot's owner while `during` runs, then stops them and
/// merges what they saw.
fn with_clients(owner: u16, during: impl FnOnce()) -> Seen {
    let stop = AtomicBool::new(false);
    let seen: Vec<Seen> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|_| scope.spawn(|| client(owner, &stop)))
            .collect();
        during();
        stop.store(true, Ordering::Relaxed);
        threads
            .into_iter()
            .map(|t| t.join().expect("client thread"))
            .collect()
    });
    let mut all = Seen::default();
    for s in seen {
        for (k, v) in s.allowed {
            all.allowed.entry(k).or_default().extend(v);
        }
        for (k, n) in s.denied {
            *all.denied.entry(k).or_default() += n;
        }
        for (p, n) in s.by_port {
            *all.by_port.entry(p).or_default() += n;
        }
    }
    all
}

/// Starts every bucket from an exact state on `owner`: each big bucket 10 tokens short of
/// full, the small one 1 token short. Returns each key's `full_at_ns`.
fn seed(con: &mut Connection) -> HashMap<&'static str, i64> {
    let now = now_ns(con);
    let mut seeded = HashMap::new();
    for key in BIG {
        let full_at = now + 10 * NS_PER_TOKEN;
        set_state(con, key, full_at);
        seeded.insert(key, full_at);
    }
    set_state(con, SMALL, now + NS_PER_TOKEN);
    seeded.insert(SMALL, now + NS_PER_TOKEN);
    seeded
}

/// Asserts that the allowed calls on each key saw every state exactly once: the remaining
/// counts are exactly the run from the seeded level down, one per allowed call (a lost take
/// would repeat a count, a doubled one skip a count). Returns the allowed count per key.
fn assert_each_take_seen_once(seen: &Seen) -> HashMap<&'static str, i64> {
    let mut counts = HashMap::new();
    for key in all_keys() {
        let (capacity, start_debt) = if key == SMALL {
            (SMALL_CAPACITY, 1)
        } else {
            (BIG_CAPACITY, 10)
        };
        let mut remaining = seen.allowed.get(key).cloned().unwrap_or_default();
        remaining.sort_unstable();
        let n = remaining.len() as i64;
        let want: Vec<i64> = (capacity - start_debt - n..capacity - start_debt).collect();
        assert_eq!(
            remaining, want,
            "{key}: the allowed replies did not each see their own state"
        );
        counts.insert(key, n);
    }
    counts
}

/// The DUMP and PEXPIRETIME a bucket holding exactly `full_at_ns` has on the node of `con`,
/// made with `RL.SETSTATE` on a scratch key of the same slot (DUMP carries no key name).
fn reference(con: &mut Connection, full_at_ns: i64) -> (Option<Vec<u8>>, i64) {
    let scratch = "{rl:asm}:reference";
    set_state(con, scratch, full_at_ns);
    let state = (
        dump(con, scratch.as_bytes()),
        pexpiretime(con, scratch.as_bytes()),
    );
    let _: i64 = redis::cmd("DEL").arg(scratch).query(con).expect("DEL");
    state
}

fn count_keys_in_slot(con: &mut Connection, slot: u16) -> i64 {
    redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(con)
        .expect("CLUSTER COUNTKEYSINSLOT")
}

/// `keys=` of db0 in `INFO keyspace` (0 when the line is absent).
fn keys_held(con: &mut Connection) -> i64 {
    let text = info(con, "keyspace");
    text.lines()
        .find_map(|line| line.strip_prefix("db0:keys="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits until the node has answered some `RL.ACQUIRE` calls (from `INFO commandstats`).
fn wait_for_calls(con: &mut Connection) {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    while Instant::now() < deadline {
        if calls(con, "rl.acquire").is_some_and(|n| n >= 100) {
            return;
        }
        sleep(Duration::from_millis(10));
    }
    panic!("the clients made no calls on this node");
}

fn assert_logged(cluster: &Cluster, port: u16, line: &str) {
    let log = cluster.node(port).log();
    assert!(
        log.contains(line),
        "node {port} did not log {line:?}:\n{log}"
    );
}

/// A cluster with the module, the slot of the test's buckets, the master that owns it and the
/// one it will move to.
struct Migration {
    cluster: Cluster,
    slot: u16,
    source: u16,
    target: u16,
    target_id: String,
}

impl Migration {
    fn start() -> Migration {
        let cluster = Cluster::start();
        let topology = cluster.topology();
        let slot = cluster.keyslot(SMALL.as_bytes());
        let source = topology.owner(slot);
        let target = topology
            .masters()
            .iter()
            .map(|m| m.port)
            .find(|&m| m != source)
            .expect("another master");
        let target_id = cluster.node_id(target);
        Migration {
            cluster,
            slot,
            source,
            target,
            target_id,
        }
    }
}

#[test]
fn migrating_a_slot_while_clients_acquire_moves_every_bucket_exactly() {
    if let Some(reason) = skip_reason() {
        println!("{reason}");
        return;
    }
    let Migration {
        cluster,
        slot,
        source,
        target,
        target_id,
    } = Migration::start();
    let mut on_source = cluster.conn(source);
    let seeded = seed(&mut on_source);

    let seen = with_clients(source, || {
        // Let the clients run on the source, then migrate while they go on. The test hook
        // holds the migration in its streaming phase for a while, so takes are certainly
        // streamed to the target, then lets it hand the slot over.
        wait_for_calls(&mut on_source);
        ok(
            &mut on_source,
            &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"],
        );
        let slot = slot.to_string();
        ok(
            &mut on_source,
            &[
                "CLUSTER",
                "MIGRATESLOTS",
                "SLOTSRANGE",
                &slot,
                &slot,
                "NODE",
                &target_id,
            ],
        );
        wait_for_export(&mut on_source, "waiting-to-pause");
        sleep(Duration::from_millis(300));
        ok(
            &mut on_source,
            &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"],
        );
        wait_for_export(&mut on_source, "success");
        // And on the new owner.
        wait_for_calls(&mut cluster.conn(target));
    });
    let after = cluster.wait_settled();
    assert_eq!(after.owner(slot), target, "the slot did not move");
    assert!(
        seen.by_port.get(&source).is_some_and(|&n| n > 0)
            && seen.by_port.get(&target).is_some_and(|&n| n > 0),
        "the clients did not run on both nodes: {:?}",
        seen.by_port
    );

    // No admission lost or doubled: the replies each saw their own state, the small bucket
    // gave out exactly what it held, and the target holds exactly what they add up to.
    let counts = assert_each_take_seen_once(&seen);
    println!(
        "allowed per bucket {counts:?}, denied {:?}, calls per node {:?} (source {source}, \
         target {target})",
        seen.denied, seen.by_port
    );
    assert_eq!(counts[SMALL], SMALL_CAPACITY - 1, "the small bucket");
    assert!(seen.denied.get(SMALL).is_some_and(|&n| n > 0));
    let mut on_target = cluster.conn(target);
    for key in all_keys() {
        let full_at = seeded[key] + counts[key] * NS_PER_TOKEN;
        let want = reference(&mut on_target, full_at);
        let got = slot_state(&mut on_target, &[key]).remove(0);
        assert_eq!(
            got, want,
            "{key}: the target's DUMP/PEXPIRETIME is not the state of {} takes",
            counts[key]
        );
    }
    assert_eq!(
        count_keys_in_slot(&mut on_source, slot),
        0,
        "the source kept keys of the slot"
    );

    // The target's replica holds the same buckets.
    wait_for_replica_after_others(&mut on_target, "{rl:asm}:wait");
    let mut replica = cluster.conn(after.replica_of(target));
    ok(&mut replica, &["READONLY"]);
    assert_eq!(
        slot_state(&mut replica, &all_keys()),
        slot_state(&mut on_target, &all_keys())
    );

    // The module saw the migration on both ends.
    assert_logged(&cluster, source, "rl: atomic slot migration export started");
    assert_logged(
        &cluster,
        source,
        "rl: atomic slot migration export completed",
    );
    assert_logged(&cluster, target, "rl: atomic slot migration import started");
    assert_logged(
        &cluster,
        target,
        "rl: atomic slot migration import completed",
    );
}

#[test]
fn a_cancelled_migration_leaves_the_source_intact() {
    if let Some(reason) = skip_reason() {
        println!("{reason}");
        return;
    }
    let Migration {
        cluster,
        slot,
        source,
        target,
        target_id,
    } = Migration::start();
    let mut on_source = cluster.conn(source);
    let mut on_target = cluster.conn(target);
    seed(&mut on_source);
    let keys = all_keys();
    let slot_arg = slot.to_string();
    let migrate = [
        "CLUSTER",
        "MIGRATESLOTS",
        "SLOTSRANGE",
        &slot_arg,
        &slot_arg,
        "NODE",
        &target_id,
    ];

    // Hold a migration in its streaming phase while clients take from the slot: the target
    // has the snapshot and the streamed takes by then.
    ok(
        &mut on_source,
        &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"],
    );
    ok(&mut on_source, &migrate);
    wait_for_export(&mut on_source, "waiting-to-pause");
    let seen = with_clients(source, || sleep(Duration::from_millis(300)));
    assert_eq!(seen.by_port.keys().copied().collect::<Vec<_>>(), [source]);
    let counts = assert_each_take_seen_once(&seen);
    let before = slot_state(&mut on_source, &keys);
    // The target counts the slot's keys it is importing (they are not served yet).
    assert_eq!(
        count_keys_in_slot(&mut on_target, slot),
        keys.len() as i64,
        "the target has not imported the slot's keys"
    );

    // CLUSTER CANCELSLOTMIGRATIONS takes no argument in Valkey 9.1 and ALL in later versions.
    let cancelled: redis::RedisResult<String> = redis::cmd("CLUSTER")
        .arg("CANCELSLOTMIGRATIONS")
        .query(&mut on_source);
    let cancelled = match cancelled {
        Err(e) if e.to_string().contains("wrong number of arguments") => redis::cmd("CLUSTER")
            .arg("CANCELSLOTMIGRATIONS")
            .arg("ALL")
            .query(&mut on_source),
        other => other,
    };
    assert_eq!(cancelled.expect("CLUSTER CANCELSLOTMIGRATIONS"), "OK");
    wait_for_export(&mut on_source, "cancelled");
    ok(
        &mut on_source,
        &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"],
    );

    // The source still serves the slot with every bucket as it was; the target dropped the
    // slot's keys.
    assert_eq!(cluster.wait_settled().owner(slot), source);
    assert_eq!(slot_state(&mut on_source, &keys), before);
    let deadline = Instant::now() + SETTLE_DEADLINE;
    while count_keys_in_slot(&mut on_target, slot) != 0 && Instant::now() < deadline {
        sleep(Duration::from_millis(20));
    }
    assert_eq!(
        count_keys_in_slot(&mut on_target, slot),
        0,
        "the target kept imported keys"
    );
    assert_eq!(keys_held(&mut on_target), 0, "the target holds keys");
    assert_logged(&cluster, source, "rl: atomic slot migration export aborted");
    assert_logged(&cluster, target, "rl: atomic slot migration import aborted");

    // Clients go on from the same state, and a migration after the cancelled one moves it
    // exactly.
    let small: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg(SMALL)
        .arg(RATE)
        .arg(SMALL_CAPACITY)
        .arg(0)
        .query(&mut on_source)
        .expect("RL.ACQUIRE");
    assert_eq!(small[1], SMALL_CAPACITY - 1 - counts[SMALL]);
    ok(&mut on_source, &migrate);
    let deadline = Instant::now() + SETTLE_DEADLINE;
    while cluster.topology_from(source).owner(slot) != target && Instant::now() < deadline {
        sleep(Duration::from_millis(20));
    }
    assert_eq!(cluster.wait_settled().owner(slot), target);
    assert_eq!(slot_state(&mut on_target, &keys), before);
}
