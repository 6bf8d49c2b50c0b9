//! `RL.GCRA`, the interface of the `GCRA` command of the Redis 8.8 milestones
//! (compiled out before 8.8 GA), against a real server: its
//! documented reply, a transcript at a rate whose token interval is no whole number of
//! nanoseconds, every bad argument with its exact error, `WRONGTYPE`, replication by effect,
//! the declared keys, flags and ACL category, and the `gcra-alias yes` load argument, with the
//! refusal to load where the server already has a `GCRA` command.
//!
//! Time: rates are one token per minute or slower, so refill cannot change a reply during a
//! test; each wait is rounded up to a whole second, which holds while the calls take under a
//! second. The transcript at 3 tokens per 299.99 s (one token every 99.99666… s) reports
//! waits of a whole number of seconds plus 0.9966… s, which round up to the same value while
//! the calls take under 0.99 s in all. Nothing asserts a wall-clock duration.

#![cfg(test)]

mod common;

use common::info::calls;
use common::rl::gcra;
use common::texts::{
    GCRA_OPTION, GCRA_PERIOD, GCRA_RATE, GCRA_REFILL, MAX_BURST, TOKENS, TOKENS_MISSING,
    TOKENS_PER_PERIOD, WRONGTYPE,
};
use common::{
    alias_server, assert_counter_steps, assert_rejected_on_empty_server, assert_table, command,
    error_text, exists, ints, keys_and_flags, show, snapshot, wait_for_replica, CounterStep,
    Server, Want,
};

#[test]
fn gcra_gives_the_documented_reply() {
    let server = Server::start();
    let mut con = server.conn();
    // Redis's documentation example shape: a burst of 16, 30 per minute, on a fresh key:
    // allowed, 16 in all, 15 left, no retry, full again in one token's 2 s.
    assert_eq!(
        gcra(&mut con, &["user123", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    // The same bucket as RL.THROTTLE's with the same numbers, and as RL.PEEK's at 0.5/s.
    assert_eq!(
        ints(&mut con, "RL.THROTTLE", &["user123", "15", "30", "60"])[..3],
        [0, 16, 14]
    );
    assert_eq!(
        ints(&mut con, "RL.PEEK", &["user123", "0.5", "16"])[..2],
        [1, 14]
    );
}

#[test]
fn gcra_counts_down_then_limits() {
    let server = Server::start();
    let mut con = server.conn();
    // max_burst 2 (3 tokens), one token every 64 s (a period written as a decimal). Each wait
    // rounds up to a whole second, so calls taking under a second cannot change these replies.
    let args = ["k", "2", "1", "6.4e1"];
    assert_eq!(gcra(&mut con, &args), [0, 3, 2, -1, 64]);
    assert_eq!(gcra(&mut con, &args), [0, 3, 1, -1, 128]);
    assert_eq!(gcra(&mut con, &args), [0, 3, 0, -1, 192]);
    let before = snapshot(&mut con);
    // Limited: one token's wait; nothing written.
    assert_eq!(gcra(&mut con, &args), [1, 3, 0, 64, 192]);
    // TOKENS 0 checks without taking: the drained bucket owes nothing beyond its capacity.
    assert_eq!(
        gcra(&mut con, &["k", "2", "1", "64", "TOKENS", "0"]),
        [0, 3, 0, -1, 192]
    );
    // More than the bucket can ever hold: limited, and no wait helps.
    assert_eq!(
        gcra(&mut con, &["k", "2", "1", "64", "tokens", "4"]),
        [1, 3, 0, -1, 192]
    );
    assert_eq!(snapshot(&mut con), before, "a call that took nothing wrote");

    // TOKENS takes several at once; the option name is case-insensitive.
    let rows: &[(&[&str], Want)] = &[
        (
            &["w", "2", "1", "64", "Tokens", "2"],
            Want::Ints(&[0, 3, 1, -1, 128]),
        ),
        (
            &["w", "2", "1", "64", "TOKENS", "2"],
            Want::Ints(&[1, 3, 1, 64, 128]),
        ),
    ];
    assert_table(&mut con, "RL.GCRA", rows);
    // Neither a check nor an impossible request creates a key.
    gcra(&mut con, &["fresh", "2", "1", "64", "TOKENS", "0"]);
    gcra(&mut con, &["fresh", "2", "1", "64", "TOKENS", "9"]);
    assert!(!exists(&mut con, b"fresh"));

    // The key expires the moment the bucket is full: 3 tokens (192 s) after the first call.
    // The expiry is that instant rounded up to a whole ms (never before full) and PTTL
    // subtracts the server's ms clock, rounded down, so within the first call's ms it reads
    // one over 192,000 (seen on Redis 8.0.2 in CI).
    let ttl_ms: i64 = redis::cmd("PTTL").arg("k").query(&mut con).expect("PTTL");
    assert!((182_000..=192_001).contains(&ttl_ms), "{ttl_ms}");
}

/// The same transcript at 3 tokens per 299.99 s: one token every 99.99666… s, no whole number
/// of nanoseconds. Exact replies here need the exact bucket (a sub-nanosecond
/// remainder): the bucket this branch has rounds each take up to a whole nanosecond, which
/// shows as one token fewer remaining.
#[test]
fn gcra_transcript_at_a_rate_with_no_whole_nanosecond_interval() {
    let server = Server::start();
    let mut con = server.conn();
    // Every wait is a whole number of seconds plus 0.9966… s, so it rounds up to the same
    // value while the calls take under 0.99 s in all.
    let args = ["k", "2", "3", "299.99"];
    assert_eq!(gcra(&mut con, &args), [0, 3, 2, -1, 100]);
    assert_eq!(gcra(&mut con, &args), [0, 3, 1, -1, 200]);
    assert_eq!(gcra(&mut con, &args), [0, 3, 0, -1, 300]);
    let before = snapshot(&mut con);
    assert_eq!(gcra(&mut con, &args), [1, 3, 0, 100, 300]);
    assert_eq!(
        gcra(&mut con, &["k", "2", "3", "299.99", "TOKENS", "0"]),
        [0, 3, 0, -1, 300]
    );
    assert_eq!(
        gcra(&mut con, &["k", "2", "3", "299.99", "TOKENS", "4"]),
        [1, 3, 0, -1, 300]
    );
    assert_eq!(snapshot(&mut con), before, "a call that took nothing wrote");
    let rows: &[(&[&str], Want)] = &[
        (
            &["w", "2", "3", "299.99", "TOKENS", "2"],
            Want::Ints(&[0, 3, 1, -1, 200]),
        ),
        (
            &["w", "2", "3", "299.99", "TOKENS", "1"],
            Want::Ints(&[0, 3, 0, -1, 300]),
        ),
        (
            &["w", "2", "3", "299.99", "TOKENS", "1"],
            Want::Ints(&[1, 3, 0, 100, 300]),
        ),
    ];
    assert_table(&mut con, "RL.GCRA", rows);
    // Three takes of 99.99666… s: the bucket is full 299.99 s after the first (one ms over
    // within the first call's ms, as above).
    let ttl_ms: i64 = redis::cmd("PTTL").arg("k").query(&mut con).expect("PTTL");
    assert!((289_990..=299_991).contains(&ttl_ms), "{ttl_ms}");
}

/// The zero-cost rule: `TOKENS 0` is allowed iff the bucket holds at least zero
/// tokens. A bucket drained under a larger limit owes more than a smaller limit's capacity,
/// so a check under the smaller limit is limited, with the wait until it is not.
#[test]
fn gcra_check_is_limited_while_the_bucket_owes_more_than_its_capacity() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens taken at one per 64 s: full again in 640 s.
    assert_eq!(
        gcra(&mut con, &["k", "9", "1", "64", "TOKENS", "10"]),
        [0, 10, 0, -1, 640]
    );
    // Under a burst of 2 the bucket owes 640 s against a capacity of 128 s: limited until
    // 512 s have passed, and nothing written.
    let before = snapshot(&mut con);
    assert_eq!(
        gcra(&mut con, &["k", "1", "1", "64", "TOKENS", "0"]),
        [1, 2, 0, 512, 640]
    );
    assert_eq!(snapshot(&mut con), before);
}

#[test]
fn gcra_accepts_the_edges_of_each_range() {
    let server = Server::start();
    let mut con = server.conn();
    let good: &[&[&str]] = &[
        &["a", "0", "1", "1"],                                   // smallest burst
        &["b", "999999999999999", "1000000000", "1"],            // largest burst, fastest rate
        &["c", "0", "1", "1000000"],                             // slowest rate: 1e-6 per second
        &["d", "0", "1000000000000000", "1000000"],              // most tokens per period: 1e9/s
        &["e", "0", "1", "0.000001"],                            // a period of a microsecond
        &["f", "0", "3", "2.5e2"],                               // an exponent
        &["g", "5", "1", "1", "TOKENS", "0"],                    // a check
        &["h", "5", "1", "1", "TOKENS", "99999999999999999999"], // never possible
    ];
    for args in good {
        let reply = gcra(&mut con, args);
        assert_eq!(reply.len(), 5, "RL.GCRA {args:?}: {reply:?}");
    }
    assert_eq!(
        gcra(&mut con, &["h", "5", "1", "1", "TOKENS", "7"])[..4],
        [1, 6, 6, -1]
    );
}

#[test]
fn gcra_rejects_each_bad_argument_with_its_exact_error() {
    let a = "ERR wrong number of arguments for 'RL.GCRA' command";
    let rows: &[(&[&[u8]], &str)] = &[
        // --- arity: key max_burst tokens_per_period period [TOKENS count]
        (&[], a),                                                 // nothing after the name
        (&[b"k"], a),                                             // key only
        (&[b"k", b"15", b"30"], a),                               // no period
        (&[b"k", b"15", b"30", b"60", b"TOKENS", b"1", b"x"], a), // one argument too many
        // --- max_burst
        (&[b"k", b"-1", b"30", b"60"], MAX_BURST), // negative
        (&[b"k", b"1.5", b"30", b"60"], MAX_BURST), // not an integer
        (&[b"k", b"x", b"30", b"60"], MAX_BURST),  // junk
        (&[b"k", b"", b"30", b"60"], MAX_BURST),   // empty
        (&[b"k", b"1000000000000000", b"1", b"1"], MAX_BURST), // 1e15 + 1 tokens
        (&[b"k", b"\xff", b"30", b"60"], MAX_BURST), // not UTF-8
        // --- tokens_per_period
        (&[b"k", b"15", b"0", b"60"], TOKENS_PER_PERIOD), // no refill
        (&[b"k", b"15", b"-1", b"60"], TOKENS_PER_PERIOD), // negative
        (&[b"k", b"15", b"1.5", b"60"], TOKENS_PER_PERIOD), // not an integer
        (&[b"k", b"15", b"x", b"60"], TOKENS_PER_PERIOD), // junk
        (
            &[b"k", b"15", b"1000000000000001", b"60"],
            TOKENS_PER_PERIOD,
        ), // above 1e15
        // --- period
        (&[b"k", b"15", b"30", b"0"], GCRA_PERIOD), // zero
        (&[b"k", b"15", b"30", b"-60"], GCRA_PERIOD), // negative
        (&[b"k", b"15", b"30", b"-0.5"], GCRA_PERIOD), // negative fraction
        (&[b"k", b"15", b"30", b"x"], GCRA_PERIOD), // junk
        (&[b"k", b"15", b"30", b""], GCRA_PERIOD),  // empty
        (&[b"k", b"15", b"30", b"inf"], GCRA_PERIOD), // infinite
        (&[b"k", b"15", b"30", b"nan"], GCRA_PERIOD), // not a number
        (&[b"k", b"15", b"30", b"1e999"], GCRA_RATE), // exact, far too long for any rate
        (&[b"k", b"15", b"30", b" 60"], GCRA_PERIOD), // leading space
        // --- the option
        (&[b"k", b"15", b"30", b"60", b"COUNT", b"1"], GCRA_OPTION), // another name
        (
            &[b"k", b"15", b"30", b"60", b"NUM_REQUESTS", b"1"],
            GCRA_OPTION,
        ), // the pre-8.8 name
        (&[b"k", b"15", b"30", b"60", b"1"], GCRA_OPTION),           // RL.THROTTLE's bare quantity
        (&[b"k", b"15", b"30", b"60", b"TOKENS"], TOKENS_MISSING),   // no count
        (&[b"k", b"15", b"30", b"60", b"tokens"], TOKENS_MISSING),   // in any case
        (&[b"k", b"15", b"30", b"60", b"TOKENS", b"-1"], TOKENS),    // negative
        (&[b"k", b"15", b"30", b"60", b"TOKENS", b"1.5"], TOKENS),   // not an integer
        (&[b"k", b"15", b"30", b"60", b"TOKENS", b""], TOKENS),      // empty
        // --- the rate and the refill they make together
        (&[b"k", b"15", b"1", b"1000001"], GCRA_RATE), // just under 1e-6 per second
        (&[b"k", b"0", b"1000000000000000", b"1"], GCRA_RATE), // 1e15 per second
        (&[b"k", b"0", b"1", b"0.0000000001"], GCRA_RATE), // 1e10 per second
        (&[b"k", b"3153600000", b"1", b"1"], GCRA_REFILL), // a century and more to refill
        // --- several bad: the first one, in argument order, is named
        (&[b"k", b"-1", b"0", b"0", b"X"], MAX_BURST),
        (&[b"k", b"1", b"0", b"0", b"X"], TOKENS_PER_PERIOD),
        (&[b"k", b"1", b"1", b"0", b"X"], GCRA_PERIOD),
        (&[b"k", b"1", b"1", b"1", b"X", b"-1"], GCRA_OPTION),
        (&[b"k", b"15", b"1", b"1000001", b"TOKENS", b"-1"], TOKENS),
    ];
    assert_rejected_on_empty_server("RL.GCRA", rows);
}

#[test]
fn gcra_on_a_foreign_key_is_wrongtype_and_leaves_it_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET")
        .arg("w")
        .arg("hello")
        .query(&mut con)
        .expect("SET");
    let _: i64 = redis::cmd("RPUSH")
        .arg("l")
        .arg("a")
        .query(&mut con)
        .expect("RPUSH");
    let before = snapshot(&mut con);
    for key in [&b"w"[..], b"l"] {
        for args in [
            &[key, b"15", b"30", b"60"][..],
            &[key, b"15", b"30", b"60", b"TOKENS", b"0"],
            &[key, b"15", b"30", b"60", b"TOKENS", b"99"],
        ] {
            let got = error_text(&mut con, &command("RL.GCRA", args));
            assert_eq!(got, WRONGTYPE, "RL.GCRA {}", show(args));
            assert_eq!(snapshot(&mut con), before, "RL.GCRA {} wrote", show(args));
        }
    }
    server.assert_alive();
}

#[test]
fn gcra_replicates_its_effect_never_itself() {
    let master_server = Server::start();
    let mut master = master_server.conn();
    let replica_server = master_server.start_replica();
    let mut replica = replica_server.conn();

    let args = ["k", "2", "1", "64"];
    for _ in 0..3 {
        assert_eq!(gcra(&mut master, &args)[0], 0);
    }
    // A limited call, a check and an impossible request: nothing to ship.
    assert_eq!(gcra(&mut master, &args)[0], 1);
    gcra(&mut master, &["k", "2", "1", "64", "TOKENS", "0"]);
    gcra(&mut master, &["k", "2", "1", "64", "TOKENS", "4"]);
    assert_eq!(
        gcra(&mut master, &["w", "0", "7", "1e3", "TOKENS", "1"])[0],
        0
    );

    wait_for_replica(&mut master);
    let on_master = snapshot(&mut master);
    assert_eq!(on_master.len(), 2, "{on_master:?}");
    assert_eq!(
        snapshot(&mut replica),
        on_master,
        "the replica differs (DUMP/PEXPIRETIME)"
    );
    // Exactly one RL.SETSTATE per allowed call, and never the clock-dependent command.
    assert_eq!(calls(&mut replica, "rl.setstate"), Some(4));
    assert_eq!(
        calls(&mut replica, "rl.gcra"),
        None,
        "RL.GCRA reached the replica"
    );
}

#[test]
fn gcra_declares_its_key_flags_and_category() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        keys_and_flags(&mut con, &["RL.GCRA", "g", "15", "30", "60", "TOKENS", "2"]),
        [(
            "g".to_string(),
            vec!["RW".to_string(), "access".into(), "update".into()]
        )]
    );
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.GCRA")
        .query(&mut con)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    for flag in ["write", "denyoom", "fast"] {
        assert!(text.contains(flag), "no {flag} in {text}");
    }
    // The ratelimit category where the server has module categories (Redis 7.4+, Valkey 9).
    let categories: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .query(&mut con)
        .expect("ACL CAT");
    if categories.iter().any(|c| c == "ratelimit") {
        let members: Vec<String> = redis::cmd("ACL")
            .arg("CAT")
            .arg("ratelimit")
            .query(&mut con)
            .expect("ACL CAT ratelimit");
        // Redis 7.4 and Valkey 8.0 leave module commands out of this list (a server bug fixed
        // in Redis 8.0 and Valkey 8.1): where RL.ACQUIRE is listed, RL.GCRA must be too.
        let listed = |name: &str| members.iter().any(|m| m.eq_ignore_ascii_case(name));
        if listed("rl.acquire") {
            assert!(listed("rl.gcra"), "{members:?}");
        } else {
            println!("ACL CAT ratelimit lists no module command here: membership not checked");
        }
        assert!(text.contains("ratelimit"), "no @ratelimit in {text}");
    } else {
        println!("this server has no module ACL categories: ratelimit not checked");
    }
}

#[test]
fn gcra_alias_is_registered_only_when_asked() {
    let server = alias_server(
        "gcra-alias",
        "rl_gcra_alias",
        &[b"GCRA", b"k", b"15", b"30", b"60"],
    );
    let mut con = server.conn();
    // What a client of the 8.8 milestones sends, as it sends it.
    assert_eq!(
        ints(&mut con, "GCRA", &["u", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    assert_eq!(
        ints(&mut con, "GCRA", &["u", "15", "30", "60", "TOKENS", "3"]),
        [0, 16, 12, -1, 8]
    );
    // The same bucket as RL.GCRA's, the same errors, and the same declared key.
    assert_eq!(gcra(&mut con, &["u", "15", "30", "60"])[..3], [0, 16, 11]);
    assert_eq!(
        error_text(
            &mut con,
            &command("GCRA", &[b"u", b"15", b"30", b"60", b"TOKENS"])
        ),
        TOKENS_MISSING
    );
    let keys = keys_and_flags(&mut con, &["GCRA", "u", "15", "30", "60"]);
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].0, "u");
    assert!(keys[0].1.contains(&"RW".to_string()), "{keys:?}");
    // Both aliases at once.
    let server =
        Server::start_with_module_args(&[], &["cl-throttle-alias", "yes", "gcra-alias", "yes"]);
    let mut con = server.conn();
    assert_eq!(
        ints(&mut con, "GCRA", &["v", "0", "1", "60"]),
        [0, 1, 0, -1, 60]
    );
    assert_eq!(
        ints(&mut con, "CL.THROTTLE", &["v", "0", "1", "60"])[..2],
        [1, 1]
    );
}

#[test]
fn gcra_alias_refuses_to_load_where_the_server_has_a_gcra_command() {
    // A server with a command named GCRA of its own: rename a built-in to that name (as a
    // Redis built with its GCRA would have one). The rename applies before modules load.
    let taken = ["--rename-command", "ECHO", "GCRA"];
    match Server::try_start(&taken, &["gcra-alias", "yes"]) {
        Ok(server) => panic!(
            "the module loaded beside the server's GCRA; log:\n{}",
            server.log()
        ),
        Err(log) => assert!(
            log.contains(
                "rl: cannot register GCRA (gcra-alias yes): this server already has a GCRA command"
            ),
            "the log does not say why:\n{log}"
        ),
    }
    // Without the alias the module loads, and the server's GCRA stays what it was.
    let server = Server::try_start(&taken, &[]).unwrap_or_else(|log| panic!("{log}"));
    let mut con = server.conn();
    let echoed: String = redis::cmd("GCRA")
        .arg("hello")
        .query(&mut con)
        .expect("GCRA");
    assert_eq!(echoed, "hello");
    assert_eq!(gcra(&mut con, &["k", "0", "1", "60"]), [0, 1, 0, -1, 60]);
}

#[test]
fn info_counts_gcra_calls_decisions_and_errors() {
    let server = Server::start_with_module_args(&[], &["gcra-alias", "yes"]);
    let mut con = server.conn();
    // Each step: the call, and how [calls, allowed, denied, errors] must move.
    let steps: &[CounterStep] = &[
        ("SET", &[b"str", b"x"], [0, 0, 0, 0]), // a foreign key, for WRONGTYPE below
        ("RL.GCRA", &[b"g", b"0", b"1", b"60"], [1, 1, 0, 0]),
        ("RL.GCRA", &[b"g", b"0", b"1", b"60"], [1, 0, 1, 0]),
        (
            "GCRA",
            &[b"g", b"0", b"1", b"60", b"TOKENS", b"2"],
            [1, 0, 1, 0],
        ), // impossible
        (
            "GCRA",
            &[b"g", b"0", b"1", b"60", b"TOKENS", b"0"],
            [1, 1, 0, 0],
        ), // a check
        (
            "RL.GCRA",
            &[b"g", b"0", b"1", b"60", b"TOKENS"],
            [1, 0, 0, 1],
        ),
        ("RL.GCRA", &[b"str", b"0", b"1", b"60"], [1, 0, 0, 1]), // WRONGTYPE
        // Too few arguments: the server refuses before the module runs.
        ("RL.GCRA", &[b"g", b"0", b"1"], [0, 0, 0, 0]),
    ];
    assert_counter_steps(&mut con, steps);
}
