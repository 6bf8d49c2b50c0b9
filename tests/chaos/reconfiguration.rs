//! The main chaos test: the master under full load is reconfigured in every way that changes
//! who listens to its writes, then its replicas (the chained one too) and its AOF replay must
//! hold exactly its keys, and its buckets must agree with the exact model.

use std::time::{Duration, Instant};

use crate::check::{assert_same, check_model, drain_fresh, snapshot, Snapshot};
use crate::common::{config_set, Server};
use crate::load::{chaos_seconds, connections, seed, under_load, wait_for_calls, Run};
use crate::servers::{
    aof_on, attach_replica, bgrewriteaof, bgsave, cli_rdb, cli_replica, kill_links, number,
    propagation, server_name, server_time_us, synced, version, wait_for_propagation, wait_until,
    BACKLOG,
};

/// The transitions so far, with the run's clock, for the report.
struct Log {
    started: Instant,
    steps: Vec<String>,
}

impl Log {
    /// A transition done.
    fn step(&mut self, what: impl Into<String>) {
        let what = what.into();
        self.note(&what);
        self.steps.push(what);
    }

    /// A line of progress that is no transition.
    fn note(&self, what: &str) {
        eprintln!(
            "chaos: {:7.1} s  {what}",
            self.started.elapsed().as_secs_f64()
        );
    }
}

#[test]
#[ignore = "runs for CHAOS_S seconds (default 45): make chaos"]
fn state_survives_reconfiguration_under_full_load() {
    let seconds = chaos_seconds();
    let mut master = Server::start_with(&["--repl-backlog-size", BACKLOG]);
    let mut con = master.conn();
    // The load stops when the conductor is done; this bound holds even if it hangs.
    let run = Run::new(Instant::now() + Duration::from_secs(seconds + 1800));
    let start_us = server_time_us(&mut con);
    let seeded_full_at_ms = seed(&mut con, &run, start_us);
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut log = Log {
        started: Instant::now(),
        steps: Vec::new(),
    };
    let mut replicas: Vec<Server> = Vec::new();
    let mut rdb_check: Option<Snapshot> = None;
    let mut stream_commands = 0usize;
    let first_us = server_time_us(&mut con);

    let total = under_load(connections(&master), &run, || {
        let deadline = log.started + Duration::from_secs(seconds);
        wait_for_calls(&run, 10_000);
        let mode = propagation(&mut con);
        assert_eq!(mode, "skip", "no AOF, no save points, no replica: skip");
        log.note("under load, rl_propagation:skip");

        aof_on(&mut con);
        log.step("CONFIG SET appendonly yes (rl_propagation:replicate)");
        bgrewriteaof(&mut con);
        log.step("BGREWRITEAOF");
        bgsave(&mut con);
        log.step("BGSAVE");
        config_set(&mut con, "appendonly", "no");
        wait_for_propagation(&mut con, "skip");
        log.step("CONFIG SET appendonly no (rl_propagation:skip again)");

        // From skip mode, a diskless sync that waits before forking: writes made during the
        // delay must reach the replica through the snapshot or the stream.
        config_set(&mut con, "repl-diskless-sync", "yes");
        config_set(&mut con, "repl-diskless-sync-delay", "2");
        replicas.push(attach_replica(master.port));
        wait_for_propagation(&mut con, "replicate");
        log.step("replica 1 attached by diskless sync, delay 2 s");

        aof_on(&mut con);
        log.step("CONFIG SET appendonly yes again");

        config_set(&mut con, "repl-diskless-sync", "no");
        replicas.push(attach_replica(master.port));
        log.step("replica 2 attached by disk-based sync");

        let mut r1 = replicas[0].conn();
        kill_links(
            &mut master.conn(),
            "replica",
            &mut con,
            2,
            &[&replicas[0], &replicas[1]],
        );
        log.step("CLIENT KILL TYPE replica on the master: both partially resynced");
        kill_links(&mut r1, "master", &mut con, 1, &[&replicas[0]]);
        log.step("CLIENT KILL TYPE master on replica 1: partially resynced");

        config_set(&mut con, "repl-diskless-sync", "yes");
        config_set(&mut con, "repl-diskless-sync-delay", "1");
        let rdb = scratch.path().join("cli.rdb");
        let size = cli_rdb(master.port, &rdb);
        // What the snapshot holds, read back by a server of its own.
        let mut loaded = Server::start();
        loaded.shutdown("NOSAVE");
        std::fs::copy(&rdb, loaded.dir.path().join("dump.rdb")).expect("copy the RDB");
        loaded.restart_with(&[]);
        let mut lcon = loaded.conn();
        let snap = snapshot(&mut lcon);
        let types: Vec<String> = snap
            .keys()
            .map(|k| redis::cmd("TYPE").arg(k).query(&mut lcon).expect("TYPE"))
            .collect();
        let foreign: Vec<&String> = types
            .iter()
            .filter(|t| *t != "rl-bucket" && *t != "rl-htable")
            .collect();
        assert!(
            foreign.is_empty(),
            "the RDB holds keys other than buckets and tables: {foreign:?}"
        );
        // A bucket that filled up between calls (a slow machine) has expired, so count only.
        let in_rdb = snap.keys().filter(|k| k.starts_with(b"chaos:")).count();
        assert!(
            snap.keys()
                .all(|k| k.starts_with(b"chaos:") || k.starts_with(b"w:")),
            "the RDB holds keys the run never wrote"
        );
        let witnesses_in_rdb = snap.len() - in_rdb;
        rdb_check = Some(snap);
        drop(lcon);
        drop(loaded);
        log.step(format!(
            "redis-cli --rdb: {size} bytes, {in_rdb} buckets and {witnesses_in_rdb} witness keys \
             loaded back"
        ));

        stream_commands += cli_replica(master.port, &scratch.path().join("replica.out"), 2);
        log.step("redis-cli --replica: the stream carries RL.SETSTATE, never RL.ACQUIRE");

        replicas.push(attach_replica(replicas[0].port));
        log.step("replica 3 attached to replica 1 (chained)");

        // Then the repeatable transitions in turn until the time is up.
        let mut round = 0u64;
        while Instant::now() < deadline {
            round += 1;
            match round % 7 {
                1 => {
                    bgrewriteaof(&mut con);
                    log.step("BGREWRITEAOF");
                }
                2 => {
                    bgsave(&mut con);
                    log.step("BGSAVE");
                }
                3 => {
                    config_set(&mut con, "appendonly", "no");
                    aof_on(&mut con);
                    log.step("CONFIG SET appendonly no, then yes");
                }
                4 => {
                    kill_links(
                        &mut master.conn(),
                        "replica",
                        &mut con,
                        2,
                        &[&replicas[0], &replicas[1]],
                    );
                    log.step("CLIENT KILL TYPE replica on the master");
                }
                5 => {
                    let mut r3 = replicas[2].conn();
                    let mut r1 = replicas[0].conn();
                    kill_links(&mut r3, "master", &mut r1, 1, &[&replicas[2]]);
                    log.step("CLIENT KILL TYPE master on replica 3 (chained)");
                }
                6 => {
                    let size = cli_rdb(master.port, &scratch.path().join("again.rdb"));
                    log.step(format!("redis-cli --rdb: {size} bytes"));
                }
                _ => {
                    stream_commands +=
                        cli_replica(master.port, &scratch.path().join("again.out"), 1);
                    log.step("redis-cli --replica");
                }
            }
        }
        log.note("quiesce");
    });
    let drained = drain_fresh(&mut con, &run);
    let last_us = server_time_us(&mut con);
    let load_s = log.started.elapsed().as_secs_f64();
    run.assert_no_errors();
    master.assert_alive();

    // Quiesced: every replica, the chained one too, reaches the master's offset.
    let offset = number(&mut con, "replication", "master_repl_offset");
    for (i, replica) in replicas.iter().enumerate() {
        let mut rcon = replica.conn();
        wait_until(
            &format!("replica {} to reach offset {offset}", i + 1),
            || synced(replica) && number(&mut rcon, "replication", "master_repl_offset") >= offset,
        );
    }
    let want = snapshot(&mut con);
    let witnesses = total.witness_keys(false);
    let mut sorted: Vec<Vec<u8>> = run
        .buckets
        .iter()
        .map(|b| b.key.clone().into_bytes())
        .collect();
    sorted.extend(witnesses.iter().cloned());
    sorted.sort();
    // Tables are checked by the DUMP comparisons; this count is of buckets and witnesses.
    let held: Vec<Vec<u8>> = want
        .keys()
        .filter(|k| !k.starts_with(b"chaos:table:"))
        .cloned()
        .collect();
    assert_eq!(
        held.len(),
        sorted.len(),
        "keys on the master: the run's buckets and {} witness keys",
        witnesses.len()
    );
    assert!(
        held == sorted,
        "the master holds exactly the run's buckets and witness keys"
    );
    let mut compared = 0;
    for (i, replica) in replicas.iter().enumerate() {
        compared += assert_same(&mut replica.conn(), &want, &format!("replica {}", i + 1));
    }
    let figures = check_model(
        &mut con,
        &run,
        &total,
        &drained,
        (first_us, last_us),
        seeded_full_at_ms,
    );
    let rdb_snap = rdb_check.expect("the --rdb step ran");
    for (key, (_, expire_ms)) in &rdb_snap {
        let now = want.get(key).map(|s| s.1).unwrap_or(-2);
        assert!(
            *expire_ms <= now,
            "{}: the mid-run RDB is full later ({expire_ms}) than the final state ({now})",
            String::from_utf8_lossy(key)
        );
    }

    // The AOF: every write since it was last switched on, replayed by a restarted master.
    config_set(&mut con, "appendfsync", "always");
    let _: () = redis::cmd("SET")
        .arg("fsync-marker")
        .arg(1)
        .query(&mut con)
        .expect("SET");
    let _: i64 = redis::cmd("DEL")
        .arg("fsync-marker")
        .query(&mut con)
        .expect("DEL");
    drop(con);
    master.restart_with(&["--appendonly", "yes"]);
    compared += assert_same(
        &mut master.conn(),
        &want,
        "the master restarted from its AOF",
    );

    let allowed: u64 = total.per_key.iter().map(|s| s.allowed).sum();
    eprintln!(
        "chaos: {} on {}: load {load_s:.0} s, {} calls ({} RL.ACQUIRE, {} RL.ACQUIRE.MULTI of \
         which {} allowed), {allowed} bucket takes allowed, {} buckets; {} transitions; {compared} \
         bucket states compared (3 replicas and the AOF replay, DUMP and PEXPIRETIME), {} of them witness keys; \
         {stream_commands} RL.SETSTATE seen by redis-cli --replica; {figures}",
        server_name(),
        version(&mut master.conn()),
        total.calls(),
        total.acquire_calls,
        total.multi_calls,
        total.multi_allowed,
        run.buckets.len(),
        log.steps.len(),
        witnesses.len() * 4,
    );
}
