//! The module's integration tests share this: the real-server harness, which lives in the
//! dev-only crate `rl-testkit` (crates/rl-testkit) and is re-exported here whole, so a test
//! file says `mod common;` and uses `common::Server`, `common::info`, `common::cluster` and
//! the table runners; and beside it what only the module's tests need: [`rl`] (each command
//! as a function), [`texts`] (the module's error replies), [`tables`] (shared tables of bad
//! arguments), the `INFO rl` counters, [`fresh`] (the reply to a first call), [`lua`] (the
//! classic Lua token bucket), [`fallback`] (the shipped Lua fallback, pinned to an
//! instant), [`aof`] (AOF files as commands, and a rewrite), [`rdb`]
//! (`DUMP` payloads), a command sent by many callers at once ([`race`]) and the restarts a
//! value must survive ([`assert_restarts_keep`]).
//! Each test binary uses a subset of all this, hence `allow(dead_code)`.

#![allow(dead_code)]

pub mod aof;
pub mod fallback;
pub mod fresh;
pub mod lua;
pub mod rdb;
pub mod rl;
pub mod tables;
pub mod texts;

pub use rl_testkit::*;

use std::sync::{Arc, Barrier};

use redis::Connection;

/// `name args…` as a command, each argument as text.
pub fn text_command(name: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd
}

/// Sends `cmd` on `callers` connections of `server` at once (each thread waits at one
/// barrier, then sends) and returns their replies.
pub fn race(
    server: &Server,
    callers: usize,
    cmd: &redis::Cmd,
) -> Vec<redis::RedisResult<redis::Value>> {
    let barrier = Arc::new(Barrier::new(callers));
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let mut con = server.conn();
            let barrier = Arc::clone(&barrier);
            let cmd = cmd.clone();
            std::thread::spawn(move || {
                barrier.wait();
                cmd.query::<redis::Value>(&mut con)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a caller thread"))
        .collect()
}

/// Restarts `server` (started with [`aof::PLAIN_AOF_ALWAYS`]) three ways and checks each
/// time that every key is `want`: replaying the AOF as written, replaying it rewritten, and
/// loading an RDB saved then, without the AOF. Returns a connection to the last.
pub fn assert_restarts_keep(server: &mut Server, want: &Snapshot) -> Connection {
    server.restart();
    let mut con = server.conn();
    assert_eq!(&snapshot(&mut con), want, "AOF replay");
    aof::rewrite_aof(&mut con);
    server.restart();
    let mut con = server.conn();
    assert_eq!(&snapshot(&mut con), want, "rewritten AOF replay");
    let _: String = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    server.restart_with(&[]);
    let mut con = server.conn();
    assert_eq!(&snapshot(&mut con), want, "RDB restart");
    con
}

/// `RL.ACQUIRE key rate capacity [cost]` as a command: for error replies, or for a connection
/// other than a single node's.
pub fn acquire_cmd(key: &[u8], rate: &str, capacity: &str, cost: Option<&str>) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.ACQUIRE");
    cmd.arg(key).arg(rate).arg(capacity);
    if let Some(cost) = cost {
        cmd.arg(cost);
    }
    cmd
}

/// `RL.ACQUIRE key rate capacity [cost]` as the four integers of its reply.
pub fn acquire(
    con: &mut Connection,
    key: &[u8],
    rate: &str,
    capacity: &str,
    cost: Option<&str>,
) -> [i64; 4] {
    let reply: Vec<i64> = acquire_cmd(key, rate, capacity, cost)
        .query(con)
        .expect("RL.ACQUIRE reply");
    reply
        .try_into()
        .expect("RL.ACQUIRE replies with 4 integers")
}

/// `[rl_calls, rl_allowed, rl_denied, rl_errors]` from `INFO rl`.
pub fn rl_counters(con: &mut Connection) -> [u64; 4] {
    let text = info::info(con, "rl");
    ["rl_calls", "rl_allowed", "rl_denied", "rl_errors"].map(|name| {
        info::info_field(&text, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    })
}

/// One step of an `INFO rl` check: a call (its reply ignored), and how
/// `[calls, allowed, denied, errors]` must move.
pub type CounterStep = (&'static str, &'static [&'static [u8]], [u64; 4]);

/// Runs each step in order and checks that the counters moved by exactly its amounts.
pub fn assert_counter_steps(con: &mut Connection, steps: &[CounterStep]) {
    let mut want = rl_counters(con);
    for (name, args, delta) in steps {
        let _ = command(name, args).query::<redis::Value>(con);
        for (w, d) in want.iter_mut().zip(delta) {
            *w += d;
        }
        assert_eq!(
            rl_counters(con),
            want,
            "after {name} {} ([calls, allowed, denied, errors])",
            show(args)
        );
    }
}

/// Checks an alias load argument (`cl-throttle-alias`, `gcra-alias`): absent or `no`, the
/// alias `command` is unknown and `INFO rl` shows `field:no`; then returns a server started
/// with `argument yes`, where `INFO rl` shows `field:yes`.
pub fn alias_server(argument: &str, field: &str, command_line: &[&[u8]]) -> Server {
    let (name, args) = command_line.split_first().expect("a command name");
    let name = std::str::from_utf8(name).expect("an ASCII name");
    for module_args in [&[][..], &[argument, "no"]] {
        let server = Server::start_with_module_args(&[], module_args);
        let mut con = server.conn();
        let err = error_text(&mut con, &command(name, args));
        assert!(
            err.starts_with("ERR unknown command"),
            "{module_args:?}: {err}"
        );
        assert_eq!(
            info::info_field(&info::info(&mut con, "rl"), field),
            Some("no")
        );
    }
    let server = Server::start_with_module_args(&[], &[argument, "yes"]);
    assert_eq!(
        info::info_field(&info::info(&mut server.conn(), "rl"), field),
        Some("yes")
    );
    server
}
