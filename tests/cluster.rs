//! Redis Cluster: each test starts its own six-node cluster (three masters, one replica each)
//! with the module loaded, and drives it through the `redis` crate's cluster client and through
//! plain connections to single nodes.
//!
//! - Routing: a bucket lives on the master serving its key's slot, and nowhere else; nodes find
//!   the key through the module's key specs (`COMMAND GETKEYS`, `MOVED` from the others).
//! - Manual failover: the promoted replica holds the same bucket (`DUMP`, `PEXPIRETIME`) and
//!   goes on from the same state, so a failover resets no limit.
//! - Resharding: moving a bucket's slot (`MIGRATE`, i.e. the type's `rdb_save`/`rdb_load`)
//!   keeps its exact state.
//! - Multi-key operations: keys in different slots are refused (`CROSSSLOT`); keys sharing a
//!   hash tag share a slot and work together.
//!
//! Time: every rate is slow enough that no bucket refills a token during a test. Nothing here
//! asserts a duration; waits poll the cluster's state up to a deadline.

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, SETTLE_DEADLINE};
use common::info::info;
use common::{
    acquire_cmd, dbsize, dump, pexpiretime, server_time_ms, wait_for_replica_after_others,
};
use redis::{Connection, ConnectionLike, RedisError, Value};

/// How long a refused call (MOVED, TRYAGAIN, CLUSTERDOWN, ...) is retried.
const RETRY_DEADLINE: Duration = Duration::from_secs(20);
/// How long a `CLUSTER FAILOVER` is given before it is asked for again (the server aborts a
/// manual failover after 5 s).
const MANUAL_FAILOVER_RETRY: Duration = Duration::from_secs(10);

/// The error's code (`MOVED`, `CROSSSLOT`, ...), or its text if it has none.
fn code(e: &RedisError) -> String {
    e.code().map_or_else(|| e.to_string(), str::to_string)
}

/// Refusals after which the command certainly did not run, so sending it again cannot take
/// tokens twice: redirections and the cluster's "not now" answers.
fn is_refusal(e: &RedisError) -> bool {
    matches!(
        code(e).as_str(),
        "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY" | "LOADING"
    )
}

/// `RL.ACQUIRE key rate capacity [cost]` on any connection (a node, or the cluster client),
/// retried while the cluster refuses it (the cluster client retries too; this is a backstop
/// for a cluster still settling).
fn acquire(
    con: &mut impl ConnectionLike,
    key: &str,
    rate: &str,
    capacity: &str,
    cost: Option<&str>,
) -> [i64; 4] {
    let cmd = acquire_cmd(key.as_bytes(), rate, capacity, cost);
    let deadline = Instant::now() + RETRY_DEADLINE;
    loop {
        match cmd.query::<Vec<i64>>(con) {
            Ok(reply) => {
                return reply
                    .try_into()
                    .expect("RL.ACQUIRE replies with 4 integers")
            }
            Err(e) if is_refusal(&e) && Instant::now() < deadline => {
                sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("RL.ACQUIRE {key:?}: {e}"),
        }
    }
}

/// A connection to a replica that serves reads of its master's slots (`READONLY`).
fn replica_conn(cluster: &Cluster, port: u16) -> Connection {
    let mut con = cluster.conn(port);
    let _: () = redis::cmd("READONLY").query(&mut con).expect("READONLY");
    con
}

/// A bucket's exact state as a node holds it: the `DUMP` payload and `PEXPIRETIME`.
fn state(con: &mut Connection, key: &str) -> (Vec<u8>, i64) {
    let payload = dump(con, key.as_bytes()).unwrap_or_else(|| panic!("{key:?} is missing"));
    let expire_at = pexpiretime(con, key.as_bytes());
    assert!(expire_at > 0, "{key:?} has no expiry ({expire_at})");
    (payload, expire_at)
}

/// Asserts that `cmd`, sent to a node that does not serve `key`'s slot, is redirected to the
/// master on `owner` for that slot.
fn assert_moved(con: &mut Connection, cmd: &redis::Cmd, slot: u16, owner: u16) {
    match cmd.query::<Value>(con) {
        Ok(v) => panic!("expected MOVED to {owner}, got {v:?}"),
        Err(e) => {
            assert_eq!(code(&e), "MOVED", "{e}");
            let (address, moved_slot) = e.redirect_node().expect("MOVED names a node");
            assert_eq!(moved_slot, slot, "{e}");
            assert!(
                address.ends_with(&format!(":{owner}")),
                "MOVED to {address}, expected port {owner}"
            );
        }
    }
}

#[test]
fn each_bucket_lives_on_the_master_serving_its_slot() {
    let cluster = Cluster::start();
    let topology = cluster.topology();
    let masters: Vec<u16> = topology.masters().iter().map(|m| m.port).collect();
    assert_eq!(masters.len(), 3);
    let mut client = cluster.client();

    // Two keys per shard, found with CLUSTER KEYSLOT against the served slot ranges.
    let mut keys: Vec<(String, u16, u16)> = Vec::new(); // key, slot, owner
    for &master in &masters {
        for prefix in ["rl:route:a:", "rl:route:b:"] {
            let key = cluster.key_served_by(&topology, master, prefix);
            let slot = cluster.keyslot(key.as_bytes());
            keys.push((key, slot, master));
        }
    }

    // Through the cluster client: each call reaches the bucket the previous one changed.
    for (key, _, _) in &keys {
        assert_eq!(
            acquire(&mut client, key, "0.001", "10", Some("3"))[..2],
            [1, 7]
        );
        assert_eq!(
            acquire(&mut client, key, "0.001", "10", Some("3"))[..2],
            [1, 4]
        );
    }

    for (key, slot, owner) in &keys {
        let mut on_owner = cluster.conn(*owner);
        assert!(
            dump(&mut on_owner, key.as_bytes()).is_some(),
            "{key:?} is not on its master {owner}"
        );
        // Every other master redirects to the owner, for a read and for our commands: the
        // node finds the key of RL.ACQUIRE and RL.SETSTATE through the module's key specs.
        for &other in masters.iter().filter(|&&m| m != *owner) {
            let mut con = cluster.conn(other);
            let mut read = redis::cmd("DUMP");
            read.arg(key);
            assert_moved(&mut con, &read, *slot, *owner);
            let mut take = redis::cmd("RL.ACQUIRE");
            take.arg(key).arg("0.001").arg("10");
            assert_moved(&mut con, &take, *slot, *owner);
            let mut set = redis::cmd("RL.SETSTATE");
            set.arg(key).arg(1);
            assert_moved(&mut con, &set, *slot, *owner);
        }
    }
    // Each master holds exactly its own two buckets: nothing was written where it was refused.
    for &master in &masters {
        assert_eq!(dbsize(&mut cluster.conn(master)), 2, "master {master}");
    }

    // What a node (and a key-spec-aware client or proxy) learns about the key positions.
    let mut con = cluster.conn(masters[0]);
    let keys_of = |con: &mut Connection, args: &[&str]| -> Vec<String> {
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(args)
            .query(con)
            .expect("COMMAND GETKEYS")
    };
    assert_eq!(keys_of(&mut con, &["RL.ACQUIRE", "k1", "1", "2"]), ["k1"]);
    assert_eq!(
        keys_of(&mut con, &["RL.ACQUIRE", "k1", "1", "2", "3"]),
        ["k1"]
    );
    assert_eq!(keys_of(&mut con, &["RL.SETSTATE", "k2", "5"]), ["k2"]);
    let keys_and_flags = |con: &mut Connection, args: &[&str]| -> Vec<(String, Vec<String>)> {
        redis::cmd("COMMAND")
            .arg("GETKEYSANDFLAGS")
            .arg(args)
            .query(con)
            .expect("COMMAND GETKEYSANDFLAGS")
    };
    assert_eq!(
        keys_and_flags(&mut con, &["RL.ACQUIRE", "k1", "1", "2"]),
        [(
            "k1".to_string(),
            vec!["RW".into(), "access".into(), "update".into()]
        )]
    );
    assert_eq!(
        keys_and_flags(&mut con, &["RL.SETSTATE", "k2", "5"]),
        [("k2".to_string(), vec!["OW".into(), "update".into()])]
    );
}

#[test]
fn manual_failover_keeps_every_bucket() {
    let cluster = Cluster::start();
    let topology = cluster.topology();
    let mut client = cluster.client();

    // Two buckets in one slot: one emptied, one with tokens left.
    let empty = "{rl:failover}:empty";
    let partial = "{rl:failover}:partial";
    let slot = cluster.keyslot(empty.as_bytes());
    let master = topology.owner(slot);
    let replica = topology.replica_of(master);

    // Capacity 5 at one token per 1000 s: taking 5 empties it for the whole test.
    assert_eq!(
        acquire(&mut client, empty, "0.001", "5", Some("5"))[..2],
        [1, 0]
    );
    assert_eq!(acquire(&mut client, empty, "0.001", "5", None)[0], 0);
    assert_eq!(
        acquire(&mut client, partial, "0.001", "5", Some("2"))[..2],
        [1, 3]
    );

    let mut on_master = cluster.conn(master);
    // The takes went through the cluster client's connection, not this one.
    wait_for_replica_after_others(&mut on_master, "{rl:failover}:wait");
    // A master with a replica must have replicated the takes, not skipped them. "unknown" is
    // fine: an event after the takes (the replica's sync forking, say) cleared the cached
    // answer, which the next write recomputes; the replica's state below is the real check.
    let rl = info(&mut on_master, "rl");
    assert!(
        !rl.contains("rl_propagation:skip"),
        "{rl}\n{}",
        info(&mut on_master, "replication")
    );
    let before_empty = state(&mut on_master, empty);
    let before_partial = state(&mut on_master, partial);
    let mut on_replica = replica_conn(&cluster, replica);
    assert_eq!(state(&mut on_replica, empty), before_empty);
    assert_eq!(state(&mut on_replica, partial), before_partial);

    // A coordinated manual failover: the master stops writes, the replica catches up and
    // takes over. The server gives a manual failover 5 s before it aborts it, which a loaded
    // machine can miss; asking again is safe (nothing is written meanwhile), so the request
    // is repeated until the replica is master or the deadline passes.
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut asked_at: Option<Instant> = None;
    let is_master = || info(&mut cluster.conn(replica), "replication").contains("role:master");
    while !is_master() {
        assert!(
            Instant::now() < deadline,
            "the replica never became master:\n{}\n{}",
            info(&mut cluster.conn(replica), "replication"),
            cluster.logs()
        );
        if asked_at.is_none_or(|at| at.elapsed() > MANUAL_FAILOVER_RETRY) {
            let reply: redis::RedisResult<String> = redis::cmd("CLUSTER")
                .arg("FAILOVER")
                .query(&mut cluster.conn(replica));
            match reply {
                Ok(ok) => assert_eq!(ok, "OK"),
                // Refused only because the earlier request completed meanwhile.
                Err(e) => assert!(is_master(), "CLUSTER FAILOVER: {e}"),
            }
            asked_at = Some(Instant::now());
        }
        sleep(Duration::from_millis(50));
    }
    let after = cluster.wait_settled();
    assert_eq!(
        after.owner(slot),
        replica,
        "the promoted replica serves the slot"
    );
    assert_eq!(
        after.replica_of(replica),
        master,
        "the old master follows it"
    );

    // The promoted master holds the very same buckets.
    let mut promoted = cluster.conn(replica);
    assert_eq!(state(&mut promoted, empty), before_empty);
    assert_eq!(state(&mut promoted, partial), before_partial);

    // And the cluster client (whose slot map still names the old master) continues from
    // that state: the empty bucket stays empty, the other one goes on counting down.
    let denied = acquire(&mut client, empty, "0.001", "5", None);
    assert_eq!(
        denied[..2],
        [0, 0],
        "the failover refilled the bucket: {denied:?}"
    );
    assert!(denied[2] > 0, "{denied:?}");
    // Still about 5000 s from full, not reset (only seconds of the test have passed).
    assert!(denied[3] > 4_000_000, "{denied:?}");
    assert_eq!(
        acquire(&mut client, partial, "0.001", "5", None)[..2],
        [1, 2]
    );

    // The new master replicates to the old one.
    wait_for_replica_after_others(&mut promoted, "{rl:failover}:wait");
    let mut demoted = replica_conn(&cluster, master);
    assert_eq!(state(&mut demoted, partial), state(&mut promoted, partial));
    assert_eq!(state(&mut demoted, empty), before_empty);
}

#[test]
fn resharding_a_slot_moves_the_exact_bucket() {
    let cluster = Cluster::start();
    let topology = cluster.topology();
    let mut client = cluster.client();

    let empty = "{rl:reshard}:empty";
    let partial = "{rl:reshard}:partial";
    let slot = cluster.keyslot(empty.as_bytes());
    let source = topology.owner(slot);
    let masters: Vec<u16> = topology.masters().iter().map(|m| m.port).collect();
    let target = *masters
        .iter()
        .find(|&&m| m != source)
        .expect("another master");

    assert_eq!(
        acquire(&mut client, empty, "0.001", "3", Some("3"))[..2],
        [1, 0]
    );
    assert_eq!(
        acquire(&mut client, partial, "0.001", "5", Some("2"))[..2],
        [1, 3]
    );
    let mut on_source = cluster.conn(source);
    let before_empty = state(&mut on_source, empty);
    let before_partial = state(&mut on_source, partial);

    // The standard slot move (what `redis-cli --cluster reshard` does).
    let source_id = cluster.node_id(source);
    let target_id = cluster.node_id(target);
    let mut on_target = cluster.conn(target);
    let setslot = |con: &mut Connection, args: &[&str]| {
        let reply: String = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query(con)
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {args:?}: {e}"));
        assert_eq!(reply, "OK");
    };
    setslot(&mut on_target, &["IMPORTING", &source_id]);
    setslot(&mut on_source, &["MIGRATING", &target_id]);
    let started_ms = server_time_ms(&mut on_source);
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut on_source)
            .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            break;
        }
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(target)
            .arg("")
            .arg(0)
            // An I/O timeout, not a wait: generous for a loaded machine.
            .arg(30_000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut on_source)
            .expect("MIGRATE");
        assert_eq!(reply, "OK");
    }
    let finished_ms = server_time_ms(&mut on_target);
    // Target first, so the slot is never left without an owner that knows it.
    setslot(&mut on_target, &["NODE", &target_id]);
    setslot(&mut on_source, &["NODE", &target_id]);
    for &other in masters.iter().filter(|&&m| m != source && m != target) {
        setslot(&mut cluster.conn(other), &["NODE", &target_id]);
    }
    let after = cluster.wait_settled();
    assert_eq!(after.owner(slot), target);

    // The target holds the exact state. MIGRATE sends the TTL relative to the source's clock
    // and the target adds its own, so the expiry may move later by the time the move took
    // (measured on the servers' clocks), never earlier.
    for (key, (payload, expire_at)) in [(empty, &before_empty), (partial, &before_partial)] {
        let (moved_payload, moved_expire_at) = state(&mut on_target, key);
        assert_eq!(
            &moved_payload, payload,
            "DUMP of {key:?} changed in the move"
        );
        assert!(
            (*expire_at..=expire_at + (finished_ms - started_ms)).contains(&moved_expire_at),
            "PEXPIRETIME of {key:?} was {expire_at}, is {moved_expire_at} after a move of \
             {} ms",
            finished_ms - started_ms
        );
    }
    let count: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut on_source)
        .expect("CLUSTER COUNTKEYSINSLOT");
    assert_eq!(count, 0, "the source still holds keys of the slot");

    // The cluster client follows the move and continues from the same state.
    let denied = acquire(&mut client, empty, "0.001", "3", None);
    assert_eq!(
        denied[..2],
        [0, 0],
        "the move refilled the bucket: {denied:?}"
    );
    assert_eq!(
        acquire(&mut client, partial, "0.001", "5", None)[..2],
        [1, 2]
    );

    // The target's replica got the buckets too, identical.
    wait_for_replica_after_others(&mut on_target, "{rl:reshard}:wait");
    let mut target_replica = replica_conn(&cluster, after.replica_of(target));
    for key in [empty, partial] {
        assert_eq!(state(&mut target_replica, key), state(&mut on_target, key));
    }
}

/// What a multi-key operation came to: each key's `RL.ACQUIRE`-style reply, or the codes of
/// the errors the node answered, in order.
type Outcome = Result<Vec<[i64; 4]>, Vec<String>>;

/// One way to take a token from several buckets (rate 0.001/s, capacity 5) at once, all or
/// nothing, on a single node over a plain connection.
type MultiKeyAcquire = fn(&mut Connection, &[&str]) -> Outcome;

/// Every multi-key form the module offers, each run through the same CROSSSLOT and hash-tag
/// tests: a transaction of single-key calls, and the atomic `RL.ACQUIRE.MULTI`.
const MULTI_KEY_FORMS: &[(&str, MultiKeyAcquire)] = &[
    ("MULTI/EXEC", acquire_in_transaction),
    ("RL.ACQUIRE.MULTI", acquire_multi),
];

/// `RL.ACQUIRE.MULTI key 0.001 5 1 ...`: its per-bucket replies, or its error's code.
fn acquire_multi(con: &mut Connection, keys: &[&str]) -> Outcome {
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for key in keys {
        cmd.arg(*key).arg("0.001").arg("5").arg("1");
    }
    let (head, buckets): ((i64, i64, i64), Vec<Vec<i64>>) = match cmd.query::<Value>(con) {
        Ok(value) => redis::from_redis_value_ref::<(i64, i64, i64, Vec<Vec<i64>>)>(&value)
            .map(|(a, b, c, d)| ((a, b, c), d))
            .expect("RL.ACQUIRE.MULTI reply"),
        Err(e) => return Err(vec![code(&e)]),
    };
    assert_eq!(head.0, 1, "the buckets here are never empty");
    Ok(buckets
        .into_iter()
        .map(|b| b.try_into().expect("4 integers"))
        .collect())
}

/// One reply of a step: its value, or the error's code.
type Step = Result<Value, String>;

/// `MULTI`, one `RL.ACQUIRE key 0.001 5` per key, `EXEC`: every reply, in order.
fn transaction_steps(con: &mut Connection, keys: &[&str]) -> Vec<Step> {
    let mut commands = vec![redis::cmd("MULTI")];
    for key in keys {
        let mut take = redis::cmd("RL.ACQUIRE");
        take.arg(*key).arg("0.001").arg("5");
        commands.push(take);
    }
    commands.push(redis::cmd("EXEC"));
    commands
        .iter()
        .map(|cmd| cmd.query::<Value>(con).map_err(|e| code(&e)))
        .collect()
}

/// The multi-key operation as a transaction of single-key calls.
fn acquire_in_transaction(con: &mut Connection, keys: &[&str]) -> Outcome {
    let steps = transaction_steps(con, keys);
    let errors: Vec<String> = steps.iter().filter_map(|s| s.clone().err()).collect();
    match steps.last() {
        Some(Ok(Value::Array(replies))) if errors.is_empty() => Ok(replies
            .iter()
            .map(|reply| {
                let ints: Vec<i64> = redis::from_redis_value_ref(reply).expect("4 integers");
                ints.try_into().expect("4 integers")
            })
            .collect()),
        _ => Err(errors),
    }
}

/// Hash tags `{<prefix><n>}` whose slots the master on `port` serves, each in a slot of its own.
fn tags_served_by(cluster: &Cluster, port: u16, prefix: &str, count: usize) -> Vec<String> {
    let topology = cluster.topology();
    let mut tags: Vec<(String, u16)> = Vec::new();
    for n in 0.. {
        if tags.len() == count {
            break;
        }
        let tag = format!("{{{prefix}{n}}}");
        let slot = cluster.keyslot(tag.as_bytes());
        if topology.owner(slot) == port && tags.iter().all(|(_, s)| *s != slot) {
            tags.push((tag, slot));
        }
    }
    tags.into_iter().map(|(tag, _)| tag).collect()
}

#[test]
fn multi_key_operations_across_slots_are_refused_with_crossslot() {
    let cluster = Cluster::start();
    let topology = cluster.topology();
    let masters: Vec<u16> = topology.masters().iter().map(|m| m.port).collect();
    let node = masters[0];

    // Two slots on this node, and one on another node.
    let local = tags_served_by(&cluster, node, "t", 2);
    let remote = tags_served_by(&cluster, masters[1], "t", 1);
    let here_a = format!("{}x", local[0]);
    let here_b = format!("{}y", local[1]);
    let elsewhere = format!("{}z", remote[0]);

    let mut con = cluster.conn(node);
    for &(name, form) in MULTI_KEY_FORMS {
        // Different slots, all served here: refused as a whole with CROSSSLOT.
        let outcome = form(&mut con, &[&here_a, &here_b]);
        assert_eq!(
            outcome,
            Err(vec!["CROSSSLOT".to_string()]),
            "{name} on two slots of one node"
        );
        // One key served by another node: refused too (a transaction's commands are each
        // redirected as they are queued, and EXEC aborts).
        let outcome = form(&mut con, &[&here_a, &elsewhere]);
        let codes = outcome.expect_err("keys on two nodes are refused");
        assert!(
            codes.iter().any(|c| c == "CROSSSLOT" || c == "MOVED"),
            "{name} on two nodes: {codes:?}"
        );
    }

    // What exactly Redis answers for the transaction: each call is queued (each alone is
    // fine), and EXEC finds the slots differ, refuses with CROSSSLOT and discards it all.
    let steps = transaction_steps(&mut con, &[&here_a, &here_b]);
    let queued = Ok(Value::SimpleString("QUEUED".into()));
    assert_eq!(
        steps,
        [
            Ok(Value::Okay),
            queued.clone(),
            queued.clone(),
            Err("CROSSSLOT".to_string())
        ]
    );
    // With a key of another node, that call is redirected while queuing, and EXEC aborts.
    let steps = transaction_steps(&mut con, &[&here_a, &elsewhere]);
    assert_eq!(
        steps,
        [
            Ok(Value::Okay),
            queued,
            Err("MOVED".to_string()),
            Err("EXECABORT".to_string())
        ]
    );
    // The connection is usable afterwards (no transaction left open).
    let pong: String = redis::cmd("PING").query(&mut con).expect("PING");
    assert_eq!(pong, "PONG");

    // Nothing was written anywhere.
    for &master in &masters {
        assert_eq!(dbsize(&mut cluster.conn(master)), 0, "master {master}");
    }
}

#[test]
fn keys_sharing_a_hash_tag_share_a_slot_and_work_together() {
    let cluster = Cluster::start();
    let topology = cluster.topology();
    let per_second = "{user:42}:second";
    let per_hour = "{user:42}:hour";
    let slot = cluster.keyslot(per_second.as_bytes());
    assert_eq!(cluster.keyslot(per_hour.as_bytes()), slot);
    assert_eq!(cluster.keyslot(b"user:42"), slot, "only the tag is hashed");
    let owner = topology.owner(slot);

    let mut con = cluster.conn(owner);
    let mut expected_remaining = 5;
    for &(name, form) in MULTI_KEY_FORMS {
        expected_remaining -= 1;
        let replies = form(&mut con, &[per_second, per_hour])
            .unwrap_or_else(|codes| panic!("{name} on one hash tag: {codes:?}"));
        assert_eq!(replies.len(), 2, "{name}");
        for reply in &replies {
            assert_eq!(
                reply[..3],
                [1, expected_remaining, 0],
                "{name}: {replies:?}"
            );
        }
    }
    assert_eq!(dbsize(&mut con), 2, "both buckets on the tag's master");

    // The cluster client routes both to that master, which goes on from the same state.
    let mut client = cluster.client();
    expected_remaining -= 1;
    for key in [per_second, per_hour] {
        assert_eq!(
            acquire(&mut client, key, "0.001", "5", None)[..2],
            [1, expected_remaining]
        );
    }
    assert_eq!(dbsize(&mut con), 2);
}
