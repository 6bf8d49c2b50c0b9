//! The tables' background sweep while the server holds writes back: `CLIENT PAUSE … WRITE`
//! and `… ALL`, `FAILOVER`, a `SHUTDOWN` waiting for a lagging replica, and `CLUSTER
//! FAILOVER`. While writes are paused the server must propagate nothing (Redis asserts it
//! and aborts), so the sweep must not remove a bucket then: the server lives, the tables read
//! the same before and after (readers are not paused by `WRITE`), and once writes flow again
//! the full buckets are reclaimed with no client write, on the replicas too.
//!
//! Each test runs on whatever `REDIS_SERVER` names, so the compatibility matrix runs them
//! all.
//!
//! Time: each table holds one long-lived bucket (1 token per 1000 s, capacity 5, 1 taken), so
//! it never expires during a test, beside short-lived ones (capacity 1 at 4/s: full again
//! 250 ms after their call). Writes are held back within those 250 ms (the tables are read
//! once they are, and must still hold short buckets), and for several sweep passes (a pass
//! starts at most every 100 ms) after the short buckets are full, so a sweep that ignores
//! the pause has buckets to remove while it lasts. Every wait polls against a deadline
//! (generous, for a debug build on a loaded machine); nothing asserts how long anything took.
//!
//! The `FAILOVER` and `SHUTDOWN` tests hold the replica back with SIGSTOP, and the `CLUSTER
//! FAILOVER` test holds back the votes with `DEBUG SLEEP`: otherwise the window with writes
//! paused lasts a few ms, and a sweep that ignored it would pass only now and then.

#![cfg(test)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, SETTLE_DEADLINE};
use common::info::{info, info_number};
use common::{dump, snapshot, wait_for_replica_after_others, Server};
use redis::{Connection, ConnectionLike};

/// The long-lived bucket: 1 token per 1000 s, capacity 5, 1 taken.
const LONG: [&str; 3] = ["0.001", "5", "1"];
/// A short-lived bucket: capacity 1 at 4/s, the 1 token taken, full again after 250 ms.
const SHORT: [&str; 3] = ["4", "1", "1"];
/// Short-lived fields per table.
const SHORT_FIELDS: usize = 100;
/// How long a paused window is watched: the short buckets are full at most 250 ms into it,
/// and the sweep starts a pass at least every 100 ms, so several passes fall in the rest.
const PAUSED_FOR: Duration = Duration::from_millis(1000);
/// How long reclaim, a sync or a failover may take once writes flow again (a deadline).
const DEADLINE: Duration = Duration::from_secs(20);

/// `CLIENT PAUSE 30000 WRITE` from `pauser`: long enough for any test, which unpauses.
fn pause_writes(pauser: &mut Connection) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query(pauser)
        .expect("CLIENT PAUSE WRITE");
}

fn hacquire(key: &str, field: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.HACQUIRE");
    cmd.arg(key).arg(field).arg(args);
    cmd
}

fn hlen(con: &mut impl ConnectionLike, key: &str) -> i64 {
    redis::cmd("RL.HLEN").arg(key).query(con).expect("RL.HLEN")
}

/// Table `key`: the long-lived bucket and `SHORT_FIELDS` short-lived ones named `prefix<i>`.
fn fill(con: &mut impl ConnectionLike, key: &str, prefix: &str) {
    let mut pipe = redis::pipe();
    pipe.add_command(hacquire(key, "long", &LONG)).ignore();
    for i in 0..SHORT_FIELDS {
        pipe.add_command(hacquire(key, &format!("{prefix}{i}"), &SHORT))
            .ignore();
    }
    let _: () = pipe.query(con).expect("fill a table");
}

/// Each table's `RL.HLEN` and `DUMP`: what must not move while writes are paused.
fn tables_state(con: &mut Connection, keys: &[&str]) -> Vec<(i64, Option<Vec<u8>>)> {
    keys.iter()
        .map(|key| (hlen(con, key), dump(con, key.as_bytes())))
        .collect()
}

/// [`tables_state`] once writes are held back, checking that each table still holds short
/// buckets, which come full while writes stay held back.
fn paused_state(con: &mut Connection, keys: &[&str]) -> Vec<(i64, Option<Vec<u8>>)> {
    let state = tables_state(con, keys);
    assert!(
        state.iter().all(|(len, _)| *len > 1),
        "the short buckets were gone before writes were held back (a stalled machine?): {:?}",
        state.iter().map(|(len, _)| len).collect::<Vec<_>>()
    );
    state
}

/// `rl_swept` of `INFO rl`: buckets the background sweep removed.
fn swept(con: &mut Connection) -> u64 {
    info_number(con, "rl", "rl_swept")
}

/// Asserts that the server's process still runs and it answers PING; the message carries how
/// it ended and its log.
fn assert_lives(server: &mut Server, what: &str) {
    if server.is_alive() {
        return;
    }
    // A server that stopped answering may be writing its crash report still: give it time
    // to end, so the message says how.
    let status = server.wait_exit(Duration::from_secs(10));
    panic!(
        "{what}: the server stopped answering PING (exit status: {}); log:\n{}",
        status.map_or_else(|| "still running".to_string(), |s| s.to_string()),
        server.log()
    );
}

/// Polls until every table in `keys` holds only its long-lived bucket.
fn wait_only_long_left(con: &mut impl ConnectionLike, keys: &[&str], what: &str) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let lens: Vec<i64> = keys.iter().map(|key| hlen(con, key)).collect();
        if lens.iter().all(|&n| n == 1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the full buckets were not reclaimed within {DEADLINE:?}: RL.HLEN {lens:?}"
        );
        sleep(Duration::from_millis(20));
    }
}

/// `CLIENT PAUSE … WRITE` on an AOF server with the sweep's work waiting, then
/// `CLIENT UNPAUSE`.
#[test]
fn a_write_pause_with_aof_on_holds_the_sweep_back_until_it_ends() {
    let mut server = Server::start_with(&common::aof::PLAIN_AOF_ALWAYS);
    let mut con = server.conn();
    let mut pauser = server.conn();
    fill(&mut con, "t", "s");
    pause_writes(&mut pauser);
    let before = paused_state(&mut con, &["t"]);
    let swept_before = swept(&mut con);
    sleep(PAUSED_FOR);
    assert_lives(&mut server, "during CLIENT PAUSE WRITE");
    // Reads are not paused: the table is as it was, and the sweep counted nothing.
    assert_eq!(tables_state(&mut con, &["t"]), before, "while paused");
    assert_eq!(swept(&mut con), swept_before, "swept while paused");

    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut pauser)
        .expect("CLIENT UNPAUSE");
    wait_only_long_left(&mut con, &["t"], "after the pause");
    assert!(swept(&mut con) >= swept_before + SHORT_FIELDS as u64);
    assert_lives(&mut server, "after the pause");

    // The AOF holds the removals: it replays to the same table.
    let after = snapshot(&mut con);
    server.restart_with(&common::aof::PLAIN_AOF_ALWAYS);
    assert_eq!(snapshot(&mut server.conn()), after, "after the AOF");
}

/// `CLIENT PAUSE … ALL` pauses readers too, so the checks come after it ends on its own.
#[test]
fn a_pause_of_all_clients_with_aof_on_leaves_the_server_running() {
    let mut server = Server::start_with(&["--appendonly", "yes"]);
    let mut con = server.conn();
    fill(&mut con, "t", "s");
    let pause_ms = PAUSED_FOR.as_millis().to_string();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(&pause_ms)
        .arg("ALL")
        .query(&mut con)
        .expect("CLIENT PAUSE ALL");
    sleep(PAUSED_FOR + Duration::from_millis(100));
    // PING waits out the rest of the pause, if any.
    assert_lives(&mut server, "after CLIENT PAUSE ALL");
    wait_only_long_left(&mut con, &["t"], "after the pause");
}

/// `CLIENT PAUSE … WRITE` on a master with a replica: neither moves while paused, and the
/// replica follows the master's removals once it ends.
#[test]
fn a_write_pause_on_a_master_with_a_replica_holds_the_sweep_back_on_both() {
    let mut master = Server::start();
    let replica = master.start_replica();
    let mut m = master.conn();
    let mut r = replica.conn();
    let mut pauser = master.conn();
    fill(&mut m, "t", "s");
    pause_writes(&mut pauser);
    let before = paused_state(&mut m, &["t"]);
    sleep(PAUSED_FOR);
    assert_lives(&mut master, "during CLIENT PAUSE WRITE");
    assert_eq!(
        tables_state(&mut m, &["t"]),
        before,
        "the master while paused"
    );
    assert_eq!(
        tables_state(&mut r, &["t"]),
        before,
        "the replica while paused"
    );

    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut pauser)
        .expect("CLIENT UNPAUSE");
    wait_only_long_left(&mut m, &["t"], "the master after the pause");
    // The removals are the timer's writes, not this connection's (see the helper).
    wait_for_replica_after_others(&mut m, "marker");
    assert_eq!(
        snapshot(&mut r),
        snapshot(&mut m),
        "the replica after the pause"
    );
    assert_eq!(hlen(&mut r, "t"), 1);
    assert_lives(&mut master, "after the pause");
}

/// Writers that fill `tables` with short-lived buckets on `server` until stopped, ignoring
/// refusals (paused calls wait, then a demoted master answers `READONLY`).
struct Writers {
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Writers {
    fn start(server: &Server, tables: &[&str]) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let threads = tables
            .iter()
            .enumerate()
            .map(|(n, table)| {
                let (stop, calls) = (Arc::clone(&stop), Arc::clone(&calls));
                let table = table.to_string();
                let mut con = server.conn();
                con.set_read_timeout(Some(DEADLINE))
                    .expect("set a read timeout");
                thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let field = format!("w{n}-{i}");
                        if hacquire(&table, &field, &SHORT)
                            .query::<Vec<i64>>(&mut con)
                            .is_ok()
                        {
                            calls.fetch_add(1, Ordering::Relaxed);
                        }
                        i += 1;
                        sleep(Duration::from_millis(2));
                    }
                })
            })
            .collect();
        Writers {
            stop,
            calls,
            threads,
        }
    }

    /// Stops the writers and returns how many calls succeeded.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("a writer panicked");
        }
        self.calls.load(Ordering::Relaxed)
    }
}

fn role(con: &mut Connection) -> String {
    let text = info(con, "replication");
    common::info::info_field(&text, "role")
        .unwrap_or_default()
        .to_string()
}

/// `FAILOVER` on a master whose replica is held back (stopped with SIGSTOP), so the master
/// sits with writes paused while its tables fill and their buckets come full; then the
/// replica runs again, catches up and takes over.
#[test]
fn failover_while_tables_fill_leaves_the_old_master_running_as_a_replica() {
    const TABLES: [&str; 3] = ["t0", "t1", "t2"];
    let mut master = Server::start();
    let replica = master.start_replica();
    let mut m = master.conn();
    for (n, table) in TABLES.iter().enumerate() {
        fill(&mut m, table, &format!("s{n}-"));
    }
    let writers = Writers::start(&master, &TABLES);
    sleep(Duration::from_millis(300));

    replica.suspend();
    let _: () = redis::cmd("FAILOVER")
        .query(&mut m)
        .expect("FAILOVER (the replica is still connected)");
    // The master now waits for the replica with writes paused.
    let state = info(&mut m, "replication");
    assert!(
        state.contains("master_failover_state:waiting-for-sync"),
        "{state}"
    );
    let before = paused_state(&mut m, &TABLES);
    sleep(PAUSED_FOR);
    assert_lives(&mut master, "during FAILOVER's wait");
    assert_eq!(
        tables_state(&mut m, &TABLES),
        before,
        "while FAILOVER waits"
    );
    replica.resume();

    let deadline = Instant::now() + DEADLINE;
    let mut r = replica.conn();
    while role(&mut r) != "master" || role(&mut m) != "slave" {
        assert_lives(&mut master, "during FAILOVER");
        assert!(
            Instant::now() < deadline,
            "the failover did not complete:\n{}\n{}\nold master's log:\n{}",
            info(&mut m, "replication"),
            info(&mut r, "replication"),
            master.log()
        );
        sleep(Duration::from_millis(50));
    }
    let written = writers.stop();
    assert!(written > 0, "no writer got through before the failover");
    assert_lives(&mut master, "after FAILOVER");

    // The new master serves, and reclaims the full buckets with no client write.
    let reply: Vec<i64> = hacquire("t0", "new", &LONG)
        .query(&mut r)
        .expect("on the new master");
    assert_eq!(reply[0], 1, "{reply:?}");
    wait_only_long_left(&mut r, &["t1", "t2"], "the new master");
    // The old master follows the new one.
    let deadline = Instant::now() + DEADLINE;
    while !info(&mut m, "replication").contains("master_link_status:up") {
        assert!(
            Instant::now() < deadline,
            "the old master never linked to the new one"
        );
        sleep(Duration::from_millis(50));
    }
    wait_for_replica_after_others(&mut r, "marker");
    assert_eq!(
        snapshot(&mut m),
        snapshot(&mut r),
        "the old master, now a replica"
    );
}

/// `SHUTDOWN` waits up to `shutdown-timeout` for a lagging replica, with writes paused, while
/// the buckets come full; then it saves and exits cleanly, and the saved tables load.
#[test]
fn shutdown_waiting_for_a_lagging_replica_exits_cleanly() {
    let args = ["--dbfilename", "dump.rdb", "--shutdown-timeout", "2"];
    let mut master = Server::start_with(&args);
    let replica = master.start_replica();
    let mut m = master.conn();

    // The replica (synced) stops acknowledging; the master's writes after that leave it behind.
    replica.suspend();
    fill(&mut m, "t", "s");
    let shutdown = {
        let mut con = master.conn();
        con.set_read_timeout(Some(DEADLINE)).unwrap();
        // No reply once the server exits; an error reply if it refuses.
        thread::spawn(move || redis::cmd("SHUTDOWN").arg("SAVE").query::<String>(&mut con))
    };
    // Writes are held back once SHUTDOWN runs; a read after it is answered meanwhile.
    sleep(Duration::from_millis(50));
    let before = paused_state(&mut m, &["t"]);
    sleep(PAUSED_FOR);
    assert_lives(&mut master, "while SHUTDOWN waits for the replica");
    assert_eq!(tables_state(&mut m, &["t"]), before, "while SHUTDOWN waits");

    let status = master.wait_exit(DEADLINE);
    let reply = shutdown.join().expect("the SHUTDOWN thread");
    let log = master.log();
    let status = status.unwrap_or_else(|| panic!("still running after SHUTDOWN; log:\n{log}"));
    assert!(
        status.success(),
        "SHUTDOWN ended with {status} (reply {reply:?}); log:\n{log}"
    );
    assert!(!log.contains("ASSERTION FAILED"), "{log}");
    // The case under test: the shutdown did wait for the replica, with writes held back.
    assert!(
        log.contains("Waiting for replicas before shutting down"),
        "SHUTDOWN did not wait for the replica; log:\n{log}"
    );
    assert!(
        master.dir.path().join("dump.rdb").exists(),
        "no RDB saved; log:\n{log}"
    );
    replica.resume();

    // The saved table loads (its full buckets are reclaimed at once, so only its long-lived
    // bucket is compared), and the sweep goes on.
    master.restart();
    let mut m = master.conn();
    wait_only_long_left(&mut m, &["t"], "after the restart");
    let long: Vec<i64> = redis::cmd("RL.HPEEK")
        .arg("t")
        .arg("long")
        .arg(&LONG[..2])
        .query(&mut m)
        .unwrap();
    assert_eq!(
        long[..2],
        [1, 4],
        "the long-lived bucket after the RDB: {long:?}"
    );
}

/// The cluster's node on `port`, to ask whether its process still runs.
fn node_mut(cluster: &mut Cluster, port: u16) -> &mut Server {
    cluster
        .nodes
        .iter_mut()
        .find(|n| n.port == port)
        .expect("a node of the cluster")
}

/// `CLUSTER FAILOVER` on a replica: its master pauses writes until the replica has caught up
/// and won the election. The other two masters, whose votes the replica needs (its own
/// master's is one of the three, the majority two), sleep through the first second of it
/// (`DEBUG SLEEP`), so the pause lasts over many sweep passes while the table's buckets come
/// full one after another.
#[test]
fn cluster_failover_while_buckets_come_full_leaves_the_old_master_running() {
    let mut cluster = Cluster::start();
    let topology = cluster.topology();
    let key = "{rl:pause}:t";
    let master = topology.owner(cluster.keyslot(key.as_bytes()));
    let replica = topology.replica_of(master);
    let mut m = cluster.conn(master);
    // Full again 10 ms apart, over 3 s from now: some come full in any window of it.
    let mut pipe = redis::pipe();
    pipe.add_command(hacquire(key, "long", &LONG)).ignore();
    for i in 1..=300 {
        let rate = format!("100/{i}");
        pipe.add_command(hacquire(key, &format!("s{i}"), &[&rate, "1", "1"]))
            .ignore();
    }
    let _: () = pipe.query(&mut m).expect("fill the table");

    let sleepers: Vec<_> = topology
        .masters()
        .iter()
        .filter(|node| node.port != master)
        .map(|node| {
            let mut con = cluster.conn(node.port);
            con.set_read_timeout(Some(DEADLINE)).unwrap();
            thread::spawn(move || {
                let _: redis::RedisResult<()> =
                    redis::cmd("DEBUG").arg("SLEEP").arg(1).query(&mut con);
            })
        })
        .collect();
    // Let both DEBUG SLEEPs begin before the failover is asked for.
    sleep(Duration::from_millis(100));
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut asked_at: Option<Instant> = None;
    while !info(&mut cluster.conn(replica), "replication").contains("role:master") {
        assert_lives(node_mut(&mut cluster, master), "during CLUSTER FAILOVER");
        assert!(
            Instant::now() < deadline,
            "the replica never became master:\n{}",
            cluster.logs()
        );
        // The server aborts a manual failover after 5 s; asking again is safe.
        if asked_at.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
            let reply: redis::RedisResult<String> = redis::cmd("CLUSTER")
                .arg("FAILOVER")
                .query(&mut cluster.conn(replica));
            if let Err(e) = reply {
                let promoted =
                    info(&mut cluster.conn(replica), "replication").contains("role:master");
                assert!(promoted, "CLUSTER FAILOVER: {e}");
            }
            asked_at = Some(Instant::now());
        }
        sleep(Duration::from_millis(20));
    }
    for sleeper in sleepers {
        sleeper.join().expect("a sleeping master's thread");
    }
    assert_lives(node_mut(&mut cluster, master), "after CLUSTER FAILOVER");
    let after = cluster.wait_settled();
    assert_eq!(after.replica_of(replica), master, "the old master follows");

    // The new master serves the slot and reclaims the rest of the full buckets on its own.
    let mut client = cluster.client();
    let reply: Vec<i64> = hacquire(key, "new", &LONG).query(&mut client).unwrap();
    assert_eq!(reply[0], 1, "{reply:?}");
    let mut promoted = cluster.conn(replica);
    let deadline = Instant::now() + DEADLINE;
    while hlen(&mut promoted, key) != 2 {
        assert!(
            Instant::now() < deadline,
            "{} buckets left on the new master",
            hlen(&mut promoted, key)
        );
        sleep(Duration::from_millis(20));
    }
    wait_for_replica_after_others(&mut promoted, "{rl:pause}:marker");
    let mut demoted = cluster.conn(master);
    let _: () = redis::cmd("READONLY").query(&mut demoted).unwrap();
    assert_eq!(
        dump(&mut demoted, key.as_bytes()),
        dump(&mut promoted, key.as_bytes())
    );
}
