//! RL.HACQUIRE.MULTI against a real server: the same decisions as RL.ACQUIRE.MULTI on keys of
//! their own (3/s and 3 per 10 s, compared call by call within one millisecond), all buckets
//! or none across several tables, a field named twice seeing its own take, every bad argument
//! with RL.ACQUIRE.MULTI's text, the cap, WRONGTYPE with nothing written, and a replica that
//! holds the master's tables exactly from `RL.HSETSTATE` effects, never the command.

#![cfg(test)]

mod common;

use common::{all_keys, error_text, snapshot, wait_for_replica, Server};
use redis::{Connection, Value};

type MultiReply = (i64, i64, i64, Vec<[i64; 4]>);

/// `RL.HACQUIRE.MULTI` over `(key, field, rate, capacity, cost)` groups.
fn hmulti(groups: &[(&str, &str, &str, &str, &str)]) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.HACQUIRE.MULTI");
    for (key, field, rate, capacity, cost) in groups {
        cmd.arg(*key)
            .arg(*field)
            .arg(*rate)
            .arg(*capacity)
            .arg(*cost);
    }
    cmd
}

/// The same groups as `RL.ACQUIRE.MULTI`, each bucket a key of its own (`key:field`).
fn keyed_multi(groups: &[(&str, &str, &str, &str, &str)]) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for (key, field, rate, capacity, cost) in groups {
        cmd.arg(format!("{key}:{field}"))
            .arg(*rate)
            .arg(*capacity)
            .arg(*cost);
    }
    cmd
}

fn reply(con: &mut Connection, cmd: &redis::Cmd) -> MultiReply {
    cmd.query(con)
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_packed_command()))
}

fn time_us(value: &Value) -> i64 {
    let Value::Array(parts) = value else {
        panic!("TIME: {value:?}")
    };
    let num = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).parse::<i64>().unwrap(),
        other => panic!("{other:?}"),
    };
    num(&parts[0]) * 1_000_000 + num(&parts[1])
}

#[test]
fn tables_decide_exactly_as_keys_at_3_per_second_and_3_per_10_seconds() {
    let server = Server::start();
    let mut con = server.conn();
    let costs = ["1", "2", "0.5", "1", "3", "0", "1", "1.5"];
    let mut compared = 0;
    let mut refused = 0;
    for round in 0..200 {
        let cost = costs[round % costs.len()];
        let groups = [
            ("{u}:s", "alice", "3", "5", cost),
            ("{u}:t", "alice", "0.3", "3", "1"),
            ("{u}:s", "bob", "3", "2", cost),
        ];
        // Both in one MULTI, so both see the same clock unless a millisecond (the module
        // clock's unit on 7.0) ticks between them: such a pair is not compared.
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("TIME")
            .add_command(keyed_multi(&groups))
            .add_command(hmulti(&groups))
            .cmd("TIME");
        let (t0, keyed, table, t1): (Value, MultiReply, MultiReply, Value) =
            pipe.query(&mut con).expect("MULTI");
        if time_us(&t0) / 1000 != time_us(&t1) / 1000 {
            let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
            continue;
        }
        assert_eq!(table, keyed, "round {round}");
        compared += 1;
        if table.0 == 0 {
            refused += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(7));
    }
    assert!(compared > 150, "only {compared} rounds compared");
    // Both outcomes were exercised: refill at 3/s over 7 ms steps cannot keep up.
    assert!(
        refused > 10 && refused < compared,
        "{refused} of {compared}"
    );
}

#[test]
fn all_buckets_or_none_and_a_field_named_twice_sees_its_take() {
    let server = Server::start();
    let mut con = server.conn();
    let slow = "0.001";
    // Fills alice's hour bucket to 1 token left, and creates the tenant table.
    let r = reply(
        &mut con,
        &hmulti(&[
            ("{t}:h", "alice", slow, "3", "2"),
            ("{t}:tenant", "acme", slow, "100", "1"),
        ]),
    );
    assert_eq!((r.0, r.1, r.2), (1, -1, 0));
    let before = snapshot(&mut con);
    // Second group refuses (needs 2, holds 1): nothing is taken from the first or third.
    let r = reply(
        &mut con,
        &hmulti(&[
            ("{t}:tenant", "acme", slow, "100", "1"),
            ("{t}:h", "alice", slow, "3", "2"),
            ("{t}:new", "bob", slow, "3", "1"),
        ]),
    );
    assert_eq!((r.0, r.1), (0, 1));
    assert!(r.2 > 0, "a refusal waits: {r:?}");
    assert_eq!(r.3[0][0], 1, "the first group alone would be allowed");
    assert_eq!(r.3[1][0], 0);
    assert_eq!(snapshot(&mut con), before, "a refused call wrote");
    // A field named twice: the second group sees the first's take, and refuses.
    let r = reply(
        &mut con,
        &hmulti(&[
            ("{t}:h", "carol", slow, "3", "2"),
            ("{t}:h", "carol", slow, "3", "2"),
        ]),
    );
    assert_eq!((r.0, r.1), (0, 1));
    assert_eq!(r.3[0][1], 1, "first group leaves 1");
    assert_eq!(snapshot(&mut con), before, "a refused call wrote");
    // Allowed twice over: both takes land.
    let r = reply(
        &mut con,
        &hmulti(&[
            ("{t}:h", "carol", slow, "3", "1"),
            ("{t}:h", "carol", slow, "3", "1"),
            ("{t}:h", "dave", slow, "3", "1"),
        ]),
    );
    assert_eq!((r.0, r.1, r.2), (1, -1, 0));
    assert_eq!(r.3[1][1], 1, "the second take saw the first");
    let peek: Vec<i64> = redis::cmd("RL.HPEEK")
        .arg("{t}:h")
        .arg("carol")
        .arg(slow)
        .arg("3")
        .arg("0")
        .query(&mut con)
        .unwrap();
    assert_eq!(peek[1], 1, "carol holds 1 after two takes of 1");
}

#[test]
fn errors_are_the_keyed_texts_and_write_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let bad: &[(&str, &str, &str)] = &[
        ("0", "5", "1"),
        ("abc", "5", "1"),
        ("1e10", "5", "1"),
        ("10", "0", "1"),
        ("10", "nan", "1"),
        ("0.000001", "1e15", "1"),
        ("10", "5", "-1"),
        ("10", "5", "x"),
    ];
    for &(rate, capacity, cost) in bad {
        // The bad group second, after a good one: nothing of the first is written either.
        let groups = [("t", "f", "10", "5", "1"), ("t", "g", rate, capacity, cost)];
        let want = error_text(&mut con, &keyed_multi(&groups));
        assert!(want.starts_with("ERR "), "{want}");
        assert_eq!(error_text(&mut con, &hmulti(&groups)), want, "{groups:?}");
    }
    for args in [
        &[][..],
        &["t"][..],
        &["t", "f", "10", "5"][..],
        &["t", "f", "10", "5", "1", "u"][..],
    ] {
        let mut cmd = redis::cmd("RL.HACQUIRE.MULTI");
        cmd.arg(args);
        let got = error_text(&mut con, &cmd);
        assert_eq!(
            got, "ERR wrong number of arguments for 'RL.HACQUIRE.MULTI' command",
            "{args:?}"
        );
    }
    // The cap: 1,000 groups allowed, 1,001 refused with a text that names it.
    let fields: Vec<String> = (0..1001).map(|i| format!("f{i}")).collect();
    let groups: Vec<_> = fields
        .iter()
        .map(|f| ("cap", f.as_str(), "10", "5", "1"))
        .collect();
    assert_eq!(
        error_text(&mut con, &hmulti(&groups)),
        "ERR RL.HACQUIRE.MULTI takes at most 1000 buckets (key field rate capacity cost groups) per call"
    );
    assert_eq!(
        all_keys(&mut con),
        Vec::<Vec<u8>>::new(),
        "a refused call wrote"
    );
    let r = reply(&mut con, &hmulti(&groups[..1000]));
    assert_eq!((r.0, r.3.len()), (1, 1000));
    let len: i64 = redis::cmd("RL.HLEN").arg("cap").query(&mut con).unwrap();
    assert_eq!(len, 1000);
    server.assert_alive();
}

#[test]
fn another_type_is_wrongtype_and_nothing_is_written() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET").arg("s").arg("x").query(&mut con).unwrap();
    let _: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg("b")
        .arg("1")
        .arg("5")
        .query(&mut con)
        .unwrap();
    let before = snapshot(&mut con);
    for other in ["s", "b"] {
        let cmd = hmulti(&[("t", "f", "1", "5", "1"), (other, "f", "1", "5", "1")]);
        assert_eq!(
            error_text(&mut con, &cmd),
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        );
        assert_eq!(snapshot(&mut con), before, "{other}: a failed call wrote");
    }
    // And the other way: a table under a per-key command.
    let _: MultiReply = reply(&mut con, &hmulti(&[("t", "f", "1", "5", "1")]));
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    cmd.arg("t").arg("1").arg("5").arg("1");
    assert!(error_text(&mut con, &cmd).starts_with("WRONGTYPE"));
}

#[test]
fn a_replica_holds_the_masters_tables_from_effects() {
    let master = Server::start();
    let mut m = master.conn();
    let replica = master.start_replica();
    let mut r = replica.conn();
    for i in 0..300 {
        let user = format!("u{}", i % 40);
        let cost = ["1", "0.5", "2"][i % 3];
        let _: MultiReply = reply(
            &mut m,
            &hmulti(&[
                ("{g}:s", &user, "3", "5", cost),
                ("{g}:t", &user, "0.3", "3", "1"),
                ("{g}:tenant", "acme", "7", "50", "1"),
            ]),
        );
    }
    wait_for_replica(&mut m);
    let want = snapshot(&mut m);
    assert_eq!(want.len(), 3, "three tables on the master");
    assert_eq!(snapshot(&mut r), want);
    let calls = |con: &mut Connection, name: &str| common::info::calls(con, name).unwrap_or(0);
    assert_eq!(calls(&mut r, "rl.hacquire.multi"), 0, "replicated verbatim");
    assert!(calls(&mut r, "rl.hsetstate") > 0);
}
