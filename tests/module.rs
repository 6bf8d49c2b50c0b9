//! The module as a whole, across its commands, against a real server: the load arguments
//! (and a bad one failing the load with its name), a command name the server already has
//! (skipped with a warning, the rest loaded), the `INFO rl` section and its counters,
//! the keys and flags each command declares, the complexity each states, and `WATCH`, which
//! only a write may break.
//!
//! Time: rates are 0.001 token/s or slower, so refill cannot change a reply during a test.

#![cfg(test)]

mod common;

use common::info::{info, info_field};
use common::rl::acquire;
use common::{assert_counter_steps, ints, keys_and_flags, rl_counters, CounterStep, Server};
use redis::{Connection, Value};

#[test]
fn bad_module_arguments_fail_the_load_and_name_the_argument() {
    let rows: &[(&[&str], &str)] = &[
        (
            &["colour", "blue"],
            "rl: unknown module argument 'colour' (known: cl-throttle-alias yes|no, gcra-alias yes|no)",
        ),
        (
            &["cl-throttle-alias"],
            "rl: module argument 'cl-throttle-alias' needs a value",
        ),
        (
            &["cl-throttle-alias", "maybe"],
            "rl: module argument 'cl-throttle-alias' must be yes or no, not 'maybe'",
        ),
        // A name without a value after a good pair.
        (&["cl-throttle-alias", "yes", "extra"], "'extra'"),
    ];
    for (module_args, want) in rows {
        match Server::try_start_with_module_args(module_args) {
            Ok(server) => panic!(
                "the server started with module arguments {module_args:?}; log:\n{}",
                server.log()
            ),
            Err(log) => assert!(
                log.contains("rl: ") && log.contains(want),
                "{module_args:?}: the log does not say {want:?}:\n{log}"
            ),
        }
    }
    // Names and values are case-insensitive.
    let server = Server::try_start_with_module_args(&["CL-THROTTLE-ALIAS", "Yes"])
        .unwrap_or_else(|log| panic!("did not start: {log}"));
    let mut con = server.conn();
    assert_eq!(
        ints(&mut con, "CL.THROTTLE", &["u", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
}

/// The warning lines of a server log (`#` is the warning level) that mention `name`.
fn warnings_naming(log: &str, name: &str) -> Vec<String> {
    log.lines()
        .filter(|line| line.contains(" # ") && line.contains(name))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_command_name_the_server_already_has_is_skipped_with_a_warning() {
    // A server with an RL.THROTTLE of its own (valkey-io/valkey#4081 proposes a built-in):
    // rename a built-in to that name. The rename applies before modules load.
    let taken = ["--rename-command", "ECHO", "RL.THROTTLE"];
    let server = Server::try_start(&taken, &[])
        .unwrap_or_else(|log| panic!("the module did not load beside RL.THROTTLE: {log}"));
    let mut con = server.conn();
    // The module loaded: its other commands work.
    assert_eq!(
        acquire(&mut con, &["k", "0.001", "3"]),
        [1, 2, 0, 1_000_000]
    );
    // RL.THROTTLE is the server's command (ECHO's reply), not ours.
    let echoed: String = redis::cmd("RL.THROTTLE")
        .arg("hello")
        .query(&mut con)
        .expect("the server's RL.THROTTLE");
    assert_eq!(echoed, "hello");
    let text = info(&mut con, "rl");
    assert_eq!(
        info_field(&text, "rl_skipped_commands"),
        Some("rl.throttle"),
        "{text}"
    );
    // A warning names it and how to reach ours.
    let warned = warnings_naming(&server.log(), "RL.THROTTLE");
    assert!(
        warned
            .iter()
            .any(|line| line.contains("skipped RL.THROTTLE")
                && line.contains("cl-throttle-alias yes")),
        "no warning naming RL.THROTTLE and the way to ours:\n{}",
        server.log()
    );

    // With cl-throttle-alias yes, CL.THROTTLE is ours, and RL.THROTTLE still the server's.
    let server = Server::try_start(&taken, &["cl-throttle-alias", "yes"])
        .unwrap_or_else(|log| panic!("{log}"));
    let mut con = server.conn();
    assert_eq!(
        ints(&mut con, "CL.THROTTLE", &["u", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    let echoed: String = redis::cmd("RL.THROTTLE")
        .arg("hello")
        .query(&mut con)
        .expect("the server's RL.THROTTLE");
    assert_eq!(echoed, "hello");
    assert_eq!(
        info_field(&info(&mut con, "rl"), "rl_skipped_commands"),
        Some("rl.throttle")
    );

    // The alias itself taken (another module, redis-cell, owns CL.THROTTLE): skipped the same
    // way, and RL.THROTTLE is ours.
    let taken = ["--rename-command", "ECHO", "CL.THROTTLE"];
    let server = Server::try_start(&taken, &["cl-throttle-alias", "yes"])
        .unwrap_or_else(|log| panic!("the module did not load beside CL.THROTTLE: {log}"));
    let mut con = server.conn();
    assert_eq!(
        ints(&mut con, "RL.THROTTLE", &["u", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    let echoed: String = redis::cmd("CL.THROTTLE")
        .arg("hello")
        .query(&mut con)
        .expect("the server's CL.THROTTLE");
    assert_eq!(echoed, "hello");
    assert_eq!(
        info_field(&info(&mut con, "rl"), "rl_skipped_commands"),
        Some("cl.throttle")
    );
    assert!(
        !warnings_naming(&server.log(), "skipped CL.THROTTLE").is_empty(),
        "no warning naming CL.THROTTLE:\n{}",
        server.log()
    );
}

#[test]
fn info_counts_calls_decisions_and_errors() {
    let server = Server::start();
    let mut con = server.conn();
    let text = info(&mut con, "rl");
    assert_eq!(
        info_field(&text, "rl_version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let clock = info_field(&text, "rl_clock").unwrap_or_default();
    assert!(
        ["RedisModule_CachedMicroseconds", "RedisModule_Milliseconds"].contains(&clock),
        "{text}"
    );
    assert!(info_field(&text, "rl_propagation").is_some(), "{text}");
    assert_eq!(info_field(&text, "rl_cl_throttle_alias"), Some("no"));
    assert_eq!(info_field(&text, "rl_skipped_commands"), Some(""));

    assert_eq!(rl_counters(&mut con), [0, 0, 0, 0]);
    // Each step: the call, and how [calls, allowed, denied, errors] must move.
    let steps: &[CounterStep] = &[
        ("SET", &[b"str", b"x"], [0, 0, 0, 0]), // a foreign key, for WRONGTYPE below
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1"], [1, 1, 0, 0]),
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1"], [1, 0, 1, 0]),
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1", b"2"], [1, 0, 1, 0]), // impossible: a denial
        ("RL.ACQUIRE", &[b"a", b"0.001", b"1", b"0"], [1, 1, 0, 0]), // cost 0: allowed
        (
            "RL.ACQUIRE.MULTI",
            &[b"m", b"0.001", b"1", b"1", b"n", b"0.001", b"1", b"1"],
            [1, 1, 0, 0],
        ),
        (
            "RL.ACQUIRE.MULTI",
            &[b"m", b"0.001", b"1", b"1", b"o", b"0.001", b"1", b"1"],
            [1, 0, 1, 0],
        ),
        ("RL.THROTTLE", &[b"t", b"0", b"1", b"3600"], [1, 1, 0, 0]),
        ("RL.THROTTLE", &[b"t", b"0", b"1", b"3600"], [1, 0, 1, 0]),
        ("RL.PEEK", &[b"a", b"0.001", b"1"], [1, 0, 0, 0]), // decides nothing
        ("RL.PEEK", &[b"fresh", b"0.001", b"1"], [1, 0, 0, 0]),
        ("RL.REFUND", &[b"a", b"0.001", b"1"], [1, 0, 0, 0]),
        ("RL.CHARGE", &[b"c", b"0.001", b"1", b"5"], [1, 0, 0, 0]), // applies: decides nothing
        ("RL.CHARGE", &[b"c", b"1", b"1", b"1e30"], [1, 0, 0, 1]),  // past the bound
        ("RL.SETSTATE", &[b"s", b"1"], [0, 0, 0, 0]),               // internal: not counted
        // Error replies from the module count as calls and errors.
        ("RL.ACQUIRE", &[b"a", b"x", b"1"], [1, 0, 0, 1]),
        ("RL.PEEK", &[b"str", b"0.001", b"1"], [1, 0, 0, 1]), // WRONGTYPE
        ("RL.THROTTLE", &[b"t", b"-1", b"1", b"1"], [1, 0, 0, 1]),
        ("RL.REFUND", &[b"a", b"1", b"1", b"-1"], [1, 0, 0, 1]),
        // A wrong argument count that only the module sees (the server checks the minimum).
        (
            "RL.ACQUIRE.MULTI",
            &[b"m", b"1", b"1", b"1", b"n"],
            [1, 0, 0, 1],
        ),
        // The server refuses too few arguments before the module runs: nothing is counted.
        ("RL.PEEK", &[b"a"], [0, 0, 0, 0]),
        ("RL.SETSTATE", &[b"s", b"0"], [0, 0, 0, 0]),
    ];
    assert_counter_steps(&mut con, steps);
}

#[test]
fn declared_keys_and_flags() {
    let server = Server::start();
    let mut con = server.conn();
    let rw = || vec!["RW".to_string(), "access".into(), "update".into()];
    assert_eq!(
        keys_and_flags(&mut con, &["RL.PEEK", "p", "1", "2"]),
        [("p".to_string(), vec!["RO".to_string(), "access".into()])]
    );
    assert_eq!(
        keys_and_flags(
            &mut con,
            &[
                "RL.ACQUIRE.MULTI",
                "a",
                "1",
                "2",
                "1",
                "b",
                "1",
                "2",
                "1",
                "c",
                "1",
                "2",
                "1"
            ]
        ),
        [
            ("a".to_string(), rw()),
            ("b".into(), rw()),
            ("c".into(), rw())
        ]
    );
    assert_eq!(
        keys_and_flags(&mut con, &["RL.THROTTLE", "t", "15", "30", "60", "1"]),
        [("t".to_string(), rw())]
    );
    assert_eq!(
        keys_and_flags(&mut con, &["RL.REFUND", "r", "1", "2"]),
        [("r".to_string(), rw())]
    );
    assert_eq!(
        keys_and_flags(&mut con, &["RL.CHARGE", "c", "1", "2", "3"]),
        [("c".to_string(), rw())]
    );

    // Command flags: RL.PEEK is a fast read, the others writes.
    let flags = |con: &mut Connection, name: &str| -> Vec<String> {
        let info: redis::Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(con)
            .expect("COMMAND INFO");
        // [[name, arity, [flags...], ...]]
        let redis::Value::Array(entries) = info else {
            panic!("COMMAND INFO {name}: {info:?}")
        };
        let Some(redis::Value::Array(entry)) = entries.first() else {
            panic!("COMMAND INFO {name}: {entries:?}")
        };
        redis::from_redis_value(entry[2].clone()).expect("flags")
    };
    let peek_flags = flags(&mut con, "RL.PEEK");
    assert!(
        peek_flags.contains(&"readonly".to_string()),
        "{peek_flags:?}"
    );
    assert!(peek_flags.contains(&"fast".to_string()), "{peek_flags:?}");
    assert!(!peek_flags.contains(&"write".to_string()), "{peek_flags:?}");
    for name in ["RL.ACQUIRE.MULTI", "RL.THROTTLE", "RL.REFUND", "RL.CHARGE"] {
        let got = flags(&mut con, name);
        assert!(got.contains(&"write".to_string()), "{name}: {got:?}");
        assert!(got.contains(&"denyoom".to_string()), "{name}: {got:?}");
    }
}

#[test]
fn watch_is_broken_by_writes_only() {
    // The module signals a modified key itself, only when it writes: a WATCH on a bucket
    // aborts the transaction after a take or a refund, never after a read or a denial.
    let server = Server::start();
    let mut con = server.conn();
    let mut other = server.conn();
    let cases: &[(&str, &str, &[&str], bool)] = &[
        // (what, command, arguments, whether EXEC must abort)
        ("peek", "RL.PEEK", &["k", "0.001", "5", "2"], false),
        (
            "refused multi",
            "RL.ACQUIRE.MULTI",
            &["k", "0.001", "5", "9"],
            false,
        ),
        (
            "allowed multi",
            "RL.ACQUIRE.MULTI",
            &["k", "0.001", "5", "1"],
            true,
        ),
        (
            "impossible throttle",
            "RL.THROTTLE",
            &["k", "4", "1", "1000", "6"],
            false,
        ),
        (
            "throttle of 0",
            "RL.THROTTLE",
            &["k", "4", "1", "1000", "0"],
            false,
        ),
        (
            "allowed throttle",
            "RL.THROTTLE",
            &["k", "4", "1", "1000"],
            true,
        ),
        ("refund of 0", "RL.REFUND", &["k", "0.001", "5", "0"], false),
        (
            "partial refund",
            "RL.REFUND",
            &["k", "0.001", "5", "1"],
            true,
        ),
        (
            "refund to full",
            "RL.REFUND",
            &["k", "0.001", "5", "100"],
            true,
        ),
        (
            "refund of a missing key",
            "RL.REFUND",
            &["k", "0.001", "5", "1"],
            false,
        ),
        ("charge of 0", "RL.CHARGE", &["k", "0.001", "5", "0"], false),
        (
            "charge into debt",
            "RL.CHARGE",
            &["k", "0.001", "5", "9"],
            true,
        ),
        (
            "charge of 0 in debt",
            "RL.CHARGE",
            &["k", "0.001", "5", "0"],
            false,
        ),
        (
            "denial in debt",
            "RL.ACQUIRE",
            &["k", "0.001", "5", "0"],
            false,
        ),
    ];
    acquire(&mut con, &["k", "0.001", "5", "2"]);
    for (what, name, args, aborts) in cases {
        let _: () = redis::cmd("WATCH").arg("k").query(&mut con).expect("WATCH");
        let _: redis::Value = redis::cmd(name)
            .arg(*args)
            .query(&mut other)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let _: () = redis::cmd("MULTI").query(&mut con).expect("MULTI");
        let _: redis::Value = redis::cmd("PING").query(&mut con).expect("PING");
        let exec: redis::Value = redis::cmd("EXEC").query(&mut con).expect("EXEC");
        assert_eq!(
            exec == redis::Value::Nil,
            *aborts,
            "{what}: EXEC replied {exec:?}"
        );
    }
}

/// Every string in a reply, in order (COMMAND DOCS is nested arrays or maps of strings).
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            strings(k, out);
            strings(v, out);
        }),
        _ => {}
    }
}

#[test]
fn every_command_states_its_complexity_and_version() {
    let server = Server::start();
    let mut con = server.conn();
    // The one command whose work grows with its arguments says how; the others are O(1).
    // `since` is the release that added the command: RL.GCRA came in 0.2.0, the tables in 0.3.0.
    let want = [
        ("RL.ACQUIRE", "O(1)", "0.1.0"),
        ("RL.PEEK", "O(1)", "0.1.0"),
        ("RL.THROTTLE", "O(1)", "0.1.0"),
        ("RL.GCRA", "O(1)", "0.2.0"),
        ("RL.REFUND", "O(1)", "0.1.0"),
        ("RL.CHARGE", "O(1)", "0.3.0"),
        ("RL.SETSTATE", "O(1)", "0.1.0"),
        ("RL.ACQUIRE.MULTI", "O(N log N) ", "0.1.0"),
        ("RL.HACQUIRE", "O(1) amortized", "0.3.0"),
        ("RL.HACQUIRE.MULTI", "O(N log N) ", "0.3.0"),
        ("RL.HPEEK", "O(1)", "0.3.0"),
        ("RL.HREFUND", "O(1) amortized", "0.3.0"),
        ("RL.HCHARGE", "O(1) amortized", "0.3.0"),
        ("RL.HDEL", "O(N) ", "0.3.0"),
        ("RL.HLEN", "O(1)", "0.3.0"),
        ("RL.HSETSTATE", "O(N) ", "0.3.0"),
        ("RL.LEASE", "O(log N) amortized ", "0.3.0"),
        ("RL.RELEASE", "O(log N) amortized ", "0.3.0"),
        ("RL.RENEW", "O(log N) amortized ", "0.3.0"),
        ("RL.LEASES", "O(log N) ", "0.3.0"),
        ("RL.LEASESETSTATE", "O(M log N) ", "0.3.0"),
    ];
    for (name, prefix, since) in want {
        let docs: Value = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg(name)
            .query(&mut con)
            .expect("COMMAND DOCS");
        let mut words = Vec::new();
        strings(&docs, &mut words);
        let field = |field: &str| {
            words
                .iter()
                .position(|w| w == field)
                .and_then(|i| words.get(i + 1))
                .unwrap_or_else(|| panic!("COMMAND DOCS {name} has no {field}: {words:?}"))
        };
        let complexity = field("complexity");
        assert!(complexity.starts_with(prefix), "{name}: {complexity}");
        assert_eq!(field("since"), since, "{name}: {words:?}");
    }
}
