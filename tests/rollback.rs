//! Rolling back to the previous release (0.2.0), as docs/operations.md tells it: the files
//! this release writes load there once its new kinds of value are gone, and not before.
//!
//! Needs the previous release's module: `RL_PREVIOUS_MODULE=/path/to/libredis_rl.so`
//! (`make test-rollback` builds it from the release's commit and runs this). Without it the
//! test says so and passes without checking anything.
//!
//! - Per-key buckets: 0.3.0 writes them as 0.2.0 does (RDB encoding version 2, `RL.SETSTATE`
//!   in the AOF), so an RDB, an AOF with or without its preamble, and its `DUMP`s load there
//!   as the same buckets, `DUMP`- and `PEXPIRETIME`-identical.
//! - Tables (`rl-htable`), leases (`rl-leases`) and buckets holding open reservations
//!   (`rl-bkresv`), new in 0.3.0: 0.2.0 has none of these types nor their internal commands
//!   (`RL.HSETSTATE`, `RL.LEASESETSTATE`, `RL.RESVSTATE`), so a file that holds any one of
//!   them (or an AOF that holds its commands) does not load: the server refuses to start.
//!   `UNLINK` every key of those types, then `BGREWRITEAOF` and `SAVE`, and the files load.

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

/// What 0.3.0 writes that 0.2.0 cannot read: a name, the key written, its type, and the
/// internal command its writes travel as in the AOF.
const NEW_KINDS: [(&str, &str, &str, &str); 3] = [
    ("a table", "table", "rl-htable", "rl.hsetstate"),
    ("leases", "leases", "rl-leases", "rl.leasesetstate"),
    (
        "a bucket with an open reservation",
        "reserved",
        "rl-bkresv",
        "rl.resvstate",
    ),
];

/// Writes the key of `NEW_KINDS[kind]`: a table of three buckets, two leases, a reservation.
fn write_new_kind(con: &mut Connection, kind: usize) {
    let calls: Vec<Vec<&str>> = match kind {
        0 => ["a", "b", "c"]
            .iter()
            .map(|f| vec!["RL.HACQUIRE", "table", f, "0.001", "5"])
            .collect(),
        1 => vec![
            vec!["RL.LEASE", "leases", "5", "3600000", "ID", "w1"],
            vec!["RL.LEASE", "leases", "5", "3600000"],
        ],
        _ => vec![vec![
            "RL.RESERVE",
            "reserved",
            "0.001",
            "5",
            "2",
            "3600000",
            "ID",
            "r1",
        ]],
    };
    for call in calls {
        let _: redis::Value = redis::cmd(call[0]).arg(&call[1..]).query(con).unwrap();
    }
}

/// Every key of `type_name`, found with `SCAN … TYPE`, unlinked: the documented step.
fn unlink_type(con: &mut Connection, type_name: &str, want: &str) {
    let keys: Vec<String> = redis::cmd("SCAN")
        .arg(0)
        .arg("COUNT")
        .arg(1000)
        .arg("TYPE")
        .arg(type_name)
        .query::<(String, Vec<String>)>(con)
        .unwrap()
        .1;
    assert_eq!(keys, [want], "SCAN TYPE {type_name} finds the key");
    let _: i64 = redis::cmd("UNLINK").arg(&keys).query(con).unwrap();
}

/// `BGREWRITEAOF`, waited for, then `SAVE`: files without what was unlinked.
fn rewrite_and_save(con: &mut Connection) {
    let _: String = redis::cmd("BGREWRITEAOF").query(con).unwrap();
    loop {
        let persistence = common::info::info(con, "persistence");
        if persistence.contains("aof_rewrite_in_progress:0")
            && persistence.contains("aof_rewrite_scheduled:0")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _: () = redis::cmd("SAVE").query(con).unwrap();
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
fn this_releases_files_load_in_the_previous_release_once_tables_leases_and_reservations_are_gone() {
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
        let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
        let want = snapshot(&mut con);
        assert_eq!(want.len(), 4, "the per-key buckets");
        drop(con);

        // Each new kind alone in the files keeps the previous release from starting; the
        // documented steps (back on this release: unlink, rewrite, save) undo it.
        for (kind, (what, key, type_name, command)) in NEW_KINDS.iter().enumerate() {
            let mut con = server.conn();
            write_new_kind(&mut con, kind);
            let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
            drop(con);
            let refused = restart_with_module(&mut server, &previous, &config);
            let log = refused.expect_err(&format!(
                "0.2.0 loaded files holding {what} (preamble {preamble})"
            ));
            let log = log.to_ascii_lowercase();
            assert!(
                log.contains(type_name) || log.contains(command),
                "the refusal names {type_name} or {command} (preamble {preamble}):\n{log}"
            );
            restart_with_module(&mut server, &current, &config).expect("back on this release");
            let mut con = server.conn();
            unlink_type(&mut con, type_name, key);
            rewrite_and_save(&mut con);
            assert_eq!(
                snapshot(&mut con),
                want,
                "only the per-key buckets are left"
            );
        }

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
