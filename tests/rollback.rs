//! Rolling back to the previous release (0.2.0), as docs/operations.md tells it: the files
//! this release writes load there once its tables are gone, and not before.
//!
//! Needs the previous release's module: `RL_PREVIOUS_MODULE=/path/to/libredis_rl.so`
//! (`make test-rollback` builds it from the release's commit and runs this). Without it the
//! test says so and passes without checking anything.
//!
//! - Per-key buckets: 0.3.0 writes them as 0.2.0 does (RDB encoding version 2, `RL.SETSTATE`
//!   in the AOF), so an RDB, an AOF with or without its preamble, and its `DUMP`s load there
//!   as the same buckets, `DUMP`- and `PEXPIRETIME`-identical.
//! - Tables (`rl-htable`, new in 0.3.0): 0.2.0 has no such type and no `RL.HSETSTATE`, so a
//!   file that holds a table (or an AOF that holds its commands) does not load: the server
//!   refuses to start. `UNLINK` every table, then `SAVE` (or `BGREWRITEAOF`), and the files
//!   load.

#![cfg(test)]

mod common;

use common::{snapshot, Server};
use redis::Connection;

/// Per-key buckets of every kind 0.3.0 writes: whole-ns and fractional states, a debt. Slow
/// rates, so none fills during the test.
fn per_key_buckets(con: &mut Connection) {
    for (key, rate, capacity, cost) in [
        ("whole", "0.001", "5", "2"),
        // Token intervals that are not whole ns (1e9 / 0.003, 1e9 / 0.0007): a fraction.
        ("frac", "0.003", "10", "4"),
        ("decimal", "0.0007", "2", "1"),
    ] {
        let _: Vec<i64> = redis::cmd("RL.ACQUIRE")
            .arg(key)
            .arg(rate)
            .arg(capacity)
            .arg(cost)
            .query(con)
            .unwrap();
    }
    let _: Vec<i64> = redis::cmd("RL.CHARGE")
        .arg("debt")
        .arg("0.001")
        .arg("5")
        .arg("8")
        .query(con)
        .unwrap();
}

/// A table of three buckets.
fn a_table(con: &mut Connection) {
    for field in ["a", "b", "c"] {
        let _: Vec<i64> = redis::cmd("RL.HACQUIRE")
            .arg("table")
            .arg(field)
            .arg("0.001")
            .arg("5")
            .query(con)
            .unwrap();
    }
}

/// Every `rl-htable` key, found with `SCAN … TYPE rl-htable`, unlinked: the documented step.
fn unlink_tables(con: &mut Connection) {
    let tables: Vec<String> = redis::cmd("SCAN")
        .arg(0)
        .arg("COUNT")
        .arg(1000)
        .arg("TYPE")
        .arg("rl-htable")
        .query::<(String, Vec<String>)>(con)
        .unwrap()
        .1;
    assert_eq!(tables, ["table"], "SCAN TYPE rl-htable finds the table");
    let _: i64 = redis::cmd("UNLINK").arg(&tables).query(con).unwrap();
}

/// Starts the server again on its files with `module` (set as `RL_MODULE` for the spawn).
fn restart_with_module(server: &mut Server, module: &str, config: &[&str]) -> Result<(), String> {
    server.kill();
    std::env::set_var("RL_MODULE", module);
    // `restart_with` retries a start that fails, then panics with the log.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        server.restart_with(config);
    }))
    .map_err(|_| server.log());
    std::env::remove_var("RL_MODULE");
    result
}

#[test]
fn this_releases_files_load_in_the_previous_release_once_tables_are_gone() {
    let Ok(previous) = std::env::var("RL_PREVIOUS_MODULE") else {
        println!(
            "SKIPPED: set RL_PREVIOUS_MODULE to the previous release's libredis_rl.so \
             (make test-rollback builds it) to check that this release's files load there"
        );
        return;
    };
    let current = common::module_path().display().to_string();
    for preamble in ["yes", "no"] {
        let config = [
            "--appendonly",
            "yes",
            "--aof-use-rdb-preamble",
            preamble,
            "--appendfsync",
            "always",
        ];
        let mut server = Server::start_with(&config);
        let mut con = server.conn();
        per_key_buckets(&mut con);
        a_table(&mut con);
        let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
        drop(con);

        // With a table in its files, the previous release does not start.
        let refused = restart_with_module(&mut server, &previous, &config);
        let log = refused.expect_err("0.2.0 loaded files holding a table");
        let log = log.to_ascii_lowercase();
        assert!(
            log.contains("rl-htable") || log.contains("rl.hsetstate"),
            "the refusal names the table type or its command:\n{log}"
        );

        // The documented steps: back on this release, unlink the tables, rewrite, save.
        restart_with_module(&mut server, &current, &config).expect("back on this release");
        let mut con = server.conn();
        unlink_tables(&mut con);
        let _: String = redis::cmd("BGREWRITEAOF").query(&mut con).unwrap();
        while common::info::info(&mut con, "persistence").contains("aof_rewrite_in_progress:1") {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
        let want = snapshot(&mut con);
        assert_eq!(want.len(), 4, "the per-key buckets are left");
        drop(con);

        // The AOF, then the RDB alone, in the previous release.
        for (what, files) in [("AOF", &config[..]), ("RDB", &["--appendonly", "no"][..])] {
            restart_with_module(&mut server, &previous, files).unwrap_or_else(|log| {
                panic!("0.2.0 refused the {what} (preamble {preamble}):\n{log}")
            });
            let mut con = server.conn();
            assert_eq!(
                snapshot(&mut con),
                want,
                "the {what} (preamble {preamble}) in 0.2.0"
            );
            // The buckets work there: the one with a token left still has it.
            let reply: Vec<i64> = redis::cmd("RL.ACQUIRE")
                .arg("whole")
                .arg("0.001")
                .arg("5")
                .query(&mut con)
                .unwrap();
            assert_eq!(reply[..2], [1, 2], "{what}: {reply:?}");
            drop(con);
            restart_with_module(&mut server, &current, files).expect("back on this release");
            let mut con = server.conn();
            // Undo the take, exactly: the next round compares with `want` again.
            for (key, payload, expire_at) in &want {
                let _: () = redis::cmd("RESTORE")
                    .arg(key)
                    .arg((*expire_at).max(0))
                    .arg(payload.as_deref().unwrap())
                    .arg("ABSTTL")
                    .arg("REPLACE")
                    .query(&mut con)
                    .unwrap();
            }
            let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
        }
    }
}
