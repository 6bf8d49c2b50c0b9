//! Faults around the limiter: a server out of memory under `maxmemory` with `noeviction`, and
//! a master killed with SIGKILL mid-load and replaced by its replica.
//!
//! Time: every rate is 0.000001 token/s, so no bucket gains a token (and no key expires)
//! during a test. Nothing here asserts a duration; the only deadline guards against a hang.

#![cfg(test)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Barrier};
use std::time::Duration;

use common::info::info_number;
use common::{acquire, acquire_cmd, dump, error_text, exists, Server};
use redis::Connection;

/// Too slow to refill a token during a test.
const RATE: &str = "0.000001";

/// Redis's reply to a `deny-oom` command while used memory is above `maxmemory`.
const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

/// How far past `maxmemory` the fill goes.
const OVER_LIMIT: u64 = 512 * 1024;

/// Fills memory to `OVER_LIMIT` bytes past `maxmemory`, then checks that a `SET` is refused
/// with OOM. Returns the key of the filler string.
///
/// Why not write 64 KiB strings until a `SET` fails: the server checks memory before a
/// command runs, with the command's own arguments already in memory. The refused `SET` is
/// often refused because of its own 64 KiB value, and once that is freed the server is back
/// under the limit, so the next small command runs. Near the limit, the server's cron also
/// shrinks client buffers by kilobytes at times of its choosing. So the filler is one string
/// made by `SETRANGE`, a short command (it passes the check well under the limit), sized
/// from `INFO memory` to end half a megabyte past the limit: every later check is over.
fn fill_past_maxmemory(con: &mut Connection) -> String {
    let limit: u64 = info_number(con, "memory", "maxmemory");
    let used: u64 = info_number(con, "memory", "used_memory");
    assert!(
        used + 1024 * 1024 < limit,
        "the server starts too close to maxmemory: {used} of {limit} bytes"
    );
    let size = limit - used + OVER_LIMIT;
    let key = "filler".to_string();
    let len: u64 = redis::cmd("SETRANGE")
        .arg(&key)
        .arg(size - 1)
        .arg("x")
        .query(con)
        .expect("SETRANGE below the limit");
    assert_eq!(len, size);
    let used: u64 = info_number(con, "memory", "used_memory");
    assert!(used > limit, "{used} bytes used, limit {limit}");
    let refused = redis::cmd("SET").arg("fill:1").arg("x").query::<()>(con);
    match refused {
        Err(e) if e.code() == Some("OOM") => key,
        other => panic!("SET past maxmemory: {other:?}"),
    }
}

#[test]
fn out_of_memory_refuses_rl_commands_and_recovers() {
    let server = Server::start_with(&[
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "noeviction",
        // Free deleted values at once (Valkey 8+ defaults to lazy freeing), so that memory is
        // below the limit as soon as DEL returns.
        "--lazyfree-lazy-user-del",
        "no",
    ]);
    let mut con = server.conn();
    // A bucket made before memory ran out: 10 tokens, 9 left.
    assert_eq!(acquire(&mut con, b"rl:old", RATE, "10", None)[..2], [1, 9]);
    let old_state = dump(&mut con, b"rl:old");

    let filler = fill_past_maxmemory(&mut con);
    assert!(!exists(&mut con, b"fill:1"));

    // A new bucket: refused with the server's standard OOM error, and no key created.
    assert_eq!(
        error_text(&mut con, &acquire_cmd(b"rl:new", RATE, "10", None)),
        OOM
    );
    assert!(
        !exists(&mut con, b"rl:new"),
        "an OOM-refused call created a key"
    );

    // An existing bucket, whatever the call would have done: a take, a denial (cost above
    // capacity), a cost-0 read. `deny-oom` is checked by the server from the command's flags
    // before the module runs, so it cannot know that a denial or a cost-0 call would write
    // nothing; every RL.ACQUIRE is refused, and the caller's fail-open or fail-closed policy
    // decides (docs/clients.md, "The failure policy: open, closed or local").
    for cost in [None, Some("11"), Some("0")] {
        assert_eq!(
            error_text(&mut con, &acquire_cmd(b"rl:old", RATE, "10", cost)),
            OOM,
            "RL.ACQUIRE rl:old cost {cost:?}"
        );
    }
    let mut set_state = redis::cmd("RL.SETSTATE");
    set_state.arg("rl:old").arg(1);
    assert_eq!(error_text(&mut con, &set_state), OOM, "RL.SETSTATE");
    assert_eq!(
        dump(&mut con, b"rl:old"),
        old_state,
        "an OOM-refused call changed the bucket"
    );

    // The server stays healthy: it answers, and commands without deny-oom still run.
    server.assert_alive();
    let pong: String = redis::cmd("PING").query(&mut con).expect("PING");
    assert_eq!(pong, "PONG");

    // Freeing memory (DEL is not deny-oom) makes RL.ACQUIRE work again, on the old bucket as
    // it was and on a new one.
    let deleted: usize = redis::cmd("DEL").arg(&filler).query(&mut con).expect("DEL");
    assert_eq!(deleted, 1);
    assert_eq!(acquire(&mut con, b"rl:old", RATE, "10", None)[..2], [1, 8]);
    assert_eq!(acquire(&mut con, b"rl:new", RATE, "10", None)[..2], [1, 9]);
    assert!(exists(&mut con, b"rl:new"));
}

/// Buckets in the failover test.
const BUCKETS: usize = 8;
/// Tokens in each bucket.
const CAPACITY: i64 = 100;
/// Client threads, each with its own connection to the master.
const CLIENTS: usize = 4;
/// The master is killed once this many takes are acknowledged: under half of the
/// `BUCKETS × CAPACITY` tokens, so the clients are mid-run.
const KILL_AFTER_ACKED: u64 = 300;

/// What one client saw of one bucket.
#[derive(Default, Clone, Copy, Debug)]
struct Seen {
    /// Calls answered "allowed".
    allowed: i64,
    /// Of those, calls whose `WAIT 1` then counted the replica: the replica applied them.
    acked: i64,
    /// Calls with no reply (the master died under them): applied or not, nobody knows.
    unknown: i64,
}

/// What the failover test's clients share.
struct Run {
    /// The buckets' keys.
    keys: Vec<String>,
    /// Releases the clients together.
    barrier: Barrier,
    /// Acknowledged takes so far, over all clients.
    acked_total: AtomicU64,
    /// Set just before the master is killed: from then on any failed call is the kill's.
    killing: AtomicBool,
    /// Tells the clients to give up (only when the test is failing anyway).
    stop: AtomicBool,
}

impl Run {
    /// Whether a failed call is the expected effect of the kill rather than a bug.
    fn killed_by(&self, e: &redis::RedisError) -> bool {
        e.is_io_error() || e.is_connection_dropped() || self.killing.load(Ordering::SeqCst)
    }

    /// Stops every client and panics with `message`.
    fn fail(&self, message: String) -> ! {
        self.stop.store(true, Ordering::SeqCst);
        panic!("{message}");
    }
}

/// One client: acquires round-robin on the buckets, `WAIT`s for the replica after each
/// allowed call, and stops at the first call the kill breaks. Tells `kill_now` when the
/// clients together have `KILL_AFTER_ACKED` acknowledged takes.
fn client(t: usize, mut con: Connection, run: &Run, kill_now: mpsc::Sender<()>) -> Vec<Seen> {
    let mut seen = vec![Seen::default(); BUCKETS];
    let capacity = CAPACITY.to_string();
    run.barrier.wait();
    for i in t.. {
        if run.stop.load(Ordering::SeqCst) {
            break;
        }
        let k = i % BUCKETS;
        let key = &run.keys[k];
        let reply: Vec<i64> =
            match acquire_cmd(key.as_bytes(), RATE, &capacity, None).query(&mut con) {
                Ok(reply) => reply,
                Err(e) if run.killed_by(&e) => {
                    seen[k].unknown += 1;
                    break;
                }
                Err(e) => run.fail(format!("RL.ACQUIRE {key}: {e}")),
            };
        if reply.first() != Some(&1) {
            continue;
        }
        seen[k].allowed += 1;
        match redis::cmd("WAIT").arg(1).arg(1000).query::<i64>(&mut con) {
            Ok(n) if n >= 1 => {
                seen[k].acked += 1;
                if run.acked_total.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AFTER_ACKED {
                    let _ = kill_now.send(());
                }
            }
            // The replica did not confirm in time: allowed, not acknowledged.
            Ok(_) => {}
            Err(e) if run.killed_by(&e) => break,
            Err(e) => run.fail(format!("WAIT: {e}")),
        }
    }
    seen
}

/// Redis replication is asynchronous: the master answers "allowed" as soon as it has taken
/// the tokens, and sends the `RL.SETSTATE` to the replica afterwards. A take that was allowed
/// but not yet acknowledged by the replica when the master dies may be lost with it, and the
/// promoted replica then lets at most that many extra requests through on that bucket. A take
/// that `WAIT` saw acknowledged is on the replica and must still count after the failover.
///
/// Per bucket, with `taken` = capacity - remaining on the promoted replica:
///   remaining <= capacity - acked         (no acknowledged take is lost)
///   taken <= allowed + unknown            (the replica holds no take the master did not make)
/// so the extra requests the failover lets through, allowed - taken, are at most
/// allowed - acked, the takes that were allowed but unacknowledged.
#[test]
fn acknowledged_takes_survive_master_sigkill_and_failover() {
    let mut master = Server::start();
    let replica = master.start_replica();
    let run = Run {
        keys: (0..BUCKETS).map(|k| format!("bucket:{k}")).collect(),
        barrier: Barrier::new(CLIENTS),
        acked_total: AtomicU64::new(0),
        killing: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    };
    let connections: Vec<Connection> = (0..CLIENTS).map(|_| master.conn()).collect();
    let (kill_tx, kill_rx) = mpsc::channel();

    let per_client: Vec<Vec<Seen>> = std::thread::scope(|scope| {
        let threads: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(t, con)| {
                let (run, kill_tx) = (&run, kill_tx.clone());
                scope.spawn(move || client(t, con, run, kill_tx))
            })
            .collect();
        // Only the clients hold senders now: if they all stop, the wait below ends at once.
        drop(kill_tx);
        // A hang guard, not a timing assertion: the clients reach the mark in well under a
        // second unless something is broken.
        if kill_rx.recv_timeout(Duration::from_secs(120)).is_ok() {
            // SIGKILL while the clients are still acquiring and waiting.
            run.killing.store(true, Ordering::SeqCst);
            master.kill();
        } else {
            run.stop.store(true, Ordering::SeqCst);
        }
        threads
            .into_iter()
            .map(|t| t.join().expect("client thread"))
            .collect()
    });
    assert!(
        run.killing.load(Ordering::SeqCst),
        "the clients never reached {KILL_AFTER_ACKED} acknowledged takes"
    );

    let mut con = replica.conn();
    let promoted: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut con)
        .expect("REPLICAOF NO ONE");
    assert_eq!(promoted, "OK");

    let capacity = CAPACITY.to_string();
    let mut report = BTreeMap::new();
    for (k, key) in run.keys.iter().enumerate() {
        let total = per_client.iter().fold(Seen::default(), |sum, seen| Seen {
            allowed: sum.allowed + seen[k].allowed,
            acked: sum.acked + seen[k].acked,
            unknown: sum.unknown + seen[k].unknown,
        });
        // Cost 0 reads the bucket without writing; the rate cannot have added a token.
        let reply = acquire(&mut con, key.as_bytes(), RATE, &capacity, Some("0"));
        assert_eq!(reply[0], 1, "cost 0 on {key}: {reply:?}");
        let remaining = reply[1];
        let taken = CAPACITY - remaining;
        assert!(
            remaining <= CAPACITY - total.acked,
            "{key}: {} acknowledged takes, but the promoted replica has {remaining} of \
             {CAPACITY} tokens left ({total:?})",
            total.acked
        );
        assert!(
            taken <= total.allowed + total.unknown,
            "{key}: the promoted replica holds {taken} takes, more than the master made ({total:?})"
        );
        report.insert(key.clone(), (total, taken));
    }
    let acked: i64 = report.values().map(|(t, _)| t.acked).sum();
    assert!(acked >= KILL_AFTER_ACKED as i64);
    for (key, (seen, taken)) in &report {
        eprintln!(
            "{key}: allowed {}, acknowledged {}, no reply {}; taken on the promoted replica {taken}",
            seen.allowed, seen.acked, seen.unknown
        );
    }

    // The promoted replica is a writable master now.
    let after = acquire(&mut con, run.keys[0].as_bytes(), RATE, &capacity, None);
    assert_eq!(
        after[0],
        i64::from(report[&run.keys[0]].1 < CAPACITY),
        "{after:?}"
    );
    replica.assert_alive();
}
