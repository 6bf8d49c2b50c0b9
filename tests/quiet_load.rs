//! A normal load says nothing at warning level: an operator who reads the log's `#` lines
//! sees only what needs a decision. `make test-servers` runs this on every server of the
//! matrix (`REDIS_SERVER` picks one). That includes the module API crate's (redismodule-rs)
//! "Skip register defrag callbacks …", which it logs from its load macro on servers without
//! `RedisModule_RegisterDefragCallbacks` unless the module binds a stand-in first (src/lib.rs).

#![cfg(test)]

mod common;

use common::Server;

/// Warning-level lines of the server's log that the module or its load caused: the module's
/// own (`<rl>`), and the server's about the module's commands and categories.
fn module_warnings(log: &str) -> Vec<String> {
    log.lines()
        // The server's levels: `.` debug, `-` verbose, `*` notice, `#` warning.
        .filter(|line| line.contains(" # "))
        .filter(|line| {
            line.contains("<rl>")
                || line.contains("module")
                || line.contains("categor")
                || line.contains("rate_limit")
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_normal_load_logs_nothing_at_warning_level() {
    let server = Server::start();
    let mut con = server.conn();
    // Something done, so the sweep's timer has ticked and read the server's config.
    let _: Vec<i64> = redis::cmd("RL.HACQUIRE")
        .arg("t")
        .arg("f")
        .arg("1")
        .arg("1")
        .query(&mut con)
        .unwrap();
    // Read while it runs: Valkey logs at shutdown that a module with types cannot unload.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let log = server.log();
    assert_eq!(module_warnings(&log), Vec::<String>::new(), "log:\n{log}");
}
