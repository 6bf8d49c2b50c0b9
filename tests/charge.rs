//! RL.CHARGE and RL.HCHARGE against a real server: post-paid charges that always apply and
//! may take a bucket into debt; while in debt every take is denied (cost 0 included) and
//! RL.PEEK shows the negative balance; the bound on the debt and every bad argument get their
//! exact error and write nothing; other types get WRONGTYPE; redis-cell's and GCRA's replies
//! keep their shape on a bucket in debt; DEBUG RELOAD and an RDB restart keep the debt; the
//! Lua fallback script's `charge` mode replies as the module does on the same server.
//!
//! Time: a first charge on a missing key is exact whatever the clock says (the bucket starts
//! full at `now`), so those replies are compared exactly at 3/s, 7/s and 3 per 10,000 s.
//! Later calls use 0.001 token/s (1,000 s a token), so the ms a test takes move a wait by a
//! few ms at most: they are compared within a second, or as exact relations between expiries.
//! Nothing asserts a duration.

#![cfg(test)]

mod common;

use common::rl::{acquire, charge, gcra, hacquire, hcharge, hpeek, multi, peek, throttle};
use common::tables::BAD_LIMITS;
use common::texts::{DEBT, WRONGTYPE};
use common::{
    arity, assert_rejected_on_empty_server, dbsize, error_text, exists, pexpiretime, snapshot,
    Server,
};
use redis::Connection;

/// `RL.CHARGE` or `RL.HCHARGE` with `args` after the name, for its error reply.
fn command(name: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd
}

/// Asserts `got` is `want` but for waits (elements 2 and 3) up to 1 s shorter: the ms a
/// test takes at 0.001 token/s.
fn assert_near(got: &[i64], want: [i64; 4], what: &str) {
    assert_eq!(got.len(), 4, "{what}: {got:?}");
    assert_eq!(got[..2], want[..2], "{what}: {got:?}");
    for i in 2..4 {
        assert!(
            got[i] <= want[i] && got[i] > want[i] - 1000,
            "{what}: element {i} of {got:?}, want about {want:?}"
        );
    }
}

#[test]
fn a_first_charge_replies_exactly_per_key_and_per_field() {
    let server = Server::start();
    let mut con = server.conn();
    // (rate, capacity, cost, reply): 1, the balance (negative in debt), ms until the debt is
    // repaid, ms until full, each rounded up.
    let rows: &[(&str, &str, &str, [i64; 4])] = &[
        // 5 at 3/s from 3: two in debt for 666.67 ms, full in 1,666.67 ms.
        ("3", "3", "5", [1, -2, 667, 1667]),
        // 10 at 7/s from 7: three in debt for 428.57 ms, full in 1,428.57 ms.
        ("7", "7", "10", [1, -3, 429, 1429]),
        // 5 at 3 per 10,000 s from 3: 3,333.33 s a token.
        ("3/10000", "3", "5", [1, -2, 6_666_667, 16_666_667]),
        // 150 at 100 a minute from 100: 0.6 s a token, fifty in debt.
        ("100/60", "100", "150", [1, -50, 30_000, 90_000]),
        // Within the capacity a charge is a take.
        ("3", "3", "1", [1, 2, 0, 334]),
        // Half a token in debt rounds toward −∞.
        ("3", "3", "3.5", [1, -1, 167, 1167]),
        // 100 years' refill exactly: the most a charge may owe.
        (
            "1",
            "1",
            "3153600000",
            [1, -3_153_599_999, 3_153_599_999_000, 3_153_600_000_000],
        ),
    ];
    for (i, &(rate, capacity, cost, want)) in rows.iter().enumerate() {
        let key = format!("k{i}");
        assert_eq!(
            charge(&mut con, &[&key, rate, capacity, cost]),
            want,
            "RL.CHARGE {rate} {capacity} {cost}"
        );
        assert!(pexpiretime(&mut con, key.as_bytes()) > 0, "{key} expires");
        assert_eq!(
            hcharge(&mut con, &["t", &key, rate, capacity, cost]),
            want,
            "RL.HCHARGE {rate} {capacity} {cost}"
        );
    }
    // Cost 0 on a missing key or field: a full bucket, and nothing created.
    assert_eq!(charge(&mut con, &["z", "3", "3", "0"]), [1, 3, 0, 0]);
    assert_eq!(hcharge(&mut con, &["z", "f", "3", "3", "0"]), [1, 3, 0, 0]);
    assert!(!exists(&mut con, b"z"));
    assert_eq!(dbsize(&mut con), rows.len() as i64 + 1);
}

#[test]
fn in_debt_every_take_is_denied_and_peek_shows_the_balance() {
    let server = Server::start();
    let mut con = server.conn();
    // 8 at 0.001/s from 5: three in debt for 3,000 s, full in 8,000 s.
    assert_eq!(
        charge(&mut con, &["k", "0.001", "5", "8"]),
        [1, -3, 3_000_000, 8_000_000]
    );
    assert_eq!(
        hcharge(&mut con, &["t", "f", "0.001", "5", "8"]),
        [1, -3, 3_000_000, 8_000_000]
    );
    let before = snapshot(&mut con);
    // A take of any cost, 0 included, waits for the debt and then the cost; remaining 0.
    for (cost, retry_ms) in [("0", 3_000_000), ("1", 4_000_000), ("5", 8_000_000)] {
        let want = [0, 0, retry_ms, 8_000_000];
        assert_near(
            &acquire(&mut con, &["k", "0.001", "5", cost]),
            want,
            &format!("RL.ACQUIRE cost {cost}"),
        );
        assert_near(
            &hacquire(&mut con, &["t", "f", "0.001", "5", cost]),
            want,
            &format!("RL.HACQUIRE cost {cost}"),
        );
        // RL.PEEK answers the same, with the signed balance.
        let want = [0, -3, retry_ms, 8_000_000];
        assert_near(
            &peek(&mut con, &["k", "0.001", "5", cost]),
            want,
            &format!("RL.PEEK cost {cost}"),
        );
        assert_near(
            &hpeek(&mut con, &["t", "f", "0.001", "5", cost]),
            want,
            &format!("RL.HPEEK cost {cost}"),
        );
    }
    let reply = multi(&mut con, &["k", "0.001", "5", "0", "other", "1", "1", "1"]);
    assert_eq!((reply.allowed, reply.refused_index), (0, 0), "{reply:?}");
    assert_eq!(reply.buckets[0][..2], [0, 0], "{reply:?}");
    // Denials and peeks wrote nothing: not the bucket, not the other key of the MULTI.
    assert_eq!(snapshot(&mut con), before);
}

#[test]
fn charges_add_up_from_the_stored_instant() {
    let server = Server::start();
    let mut con = server.conn();
    charge(&mut con, &["k", "0.001", "5", "8"]);
    hcharge(&mut con, &["t", "f", "0.001", "5", "8"]);
    let (key_at, table_at) = (pexpiretime(&mut con, b"k"), pexpiretime(&mut con, b"t"));
    // In debt, a charge starts from when the bucket would be full: exactly 2,000 s later.
    assert_near(
        &charge(&mut con, &["k", "0.001", "5", "2"]),
        [1, -5, 5_000_000, 10_000_000],
        "a second charge",
    );
    assert_near(
        &hcharge(&mut con, &["t", "f", "0.001", "5", "2"]),
        [1, -5, 5_000_000, 10_000_000],
        "a second table charge",
    );
    assert_eq!(pexpiretime(&mut con, b"k"), key_at + 2_000_000);
    // A table has no expiry (the sweep reclaims it).
    assert_eq!((table_at, pexpiretime(&mut con, b"t")), (-1, -1));
    // Cost 0 reports and changes nothing.
    let before = snapshot(&mut con);
    assert_near(
        &charge(&mut con, &["k", "0.001", "5", "0"]),
        [1, -5, 5_000_000, 10_000_000],
        "cost 0",
    );
    assert_near(
        &hcharge(&mut con, &["t", "f", "0.001", "5", "0"]),
        [1, -5, 5_000_000, 10_000_000],
        "table cost 0",
    );
    assert_eq!(snapshot(&mut con), before);
    // A refund gives back at most the capacity, even in debt.
    let reply: Vec<i64> = common::ints(&mut con, "RL.REFUND", &["k", "0.001", "5", "100"]);
    assert_eq!(reply[0], 0, "{reply:?}");
    assert_eq!(pexpiretime(&mut con, b"k"), key_at + 2_000_000 - 5_000_000);
}

#[test]
fn a_charge_past_the_bound_is_refused_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    // One token more than 100 years' refill, on a missing key and field: nothing created.
    for (name, args) in [
        ("RL.CHARGE", &["k", "1", "1", "3153600001"][..]),
        ("RL.HCHARGE", &["t", "f", "1", "1", "3153600001"][..]),
        // Far past: a cost whose refill does not fit in the tick arithmetic.
        ("RL.CHARGE", &["k", "1", "1", "1e30"][..]),
    ] {
        assert_eq!(error_text(&mut con, &command(name, args)), DEBT, "{args:?}");
    }
    assert_eq!(dbsize(&mut con), 0);
    // At the bound, then anything more: refused, and the bucket is unchanged.
    charge(&mut con, &["k", "1", "1", "3153600000"]);
    hcharge(&mut con, &["t", "f", "1", "1", "3153600000"]);
    hcharge(&mut con, &["t", "g", "1", "1", "1"]);
    let before = snapshot(&mut con);
    for (name, args) in [
        ("RL.CHARGE", &["k", "1", "1", "2"][..]),
        ("RL.HCHARGE", &["t", "f", "1", "1", "2"][..]),
        ("RL.HCHARGE", &["t", "new", "1", "1", "3153600001"][..]),
    ] {
        assert_eq!(error_text(&mut con, &command(name, args)), DEBT, "{args:?}");
    }
    assert_eq!(snapshot(&mut con), before);
    server.assert_alive();
}

/// Bad `RL.CHARGE` arguments: the arity (the cost is required), then every bad limit of the
/// other commands with a cost, and the bound.
fn charge_rows() -> Vec<(Vec<&'static [u8]>, String)> {
    let arity_rows: &[&[&[u8]]] = &[
        &[],                              // nothing after the name
        &[b"k"],                          // key only
        &[b"k", b"1", b"10"],             // no cost: a charge must say what it charges
        &[b"k", b"1", b"10", b"1", b"1"], // one argument too many
    ];
    let mut rows: Vec<(Vec<&[u8]>, String)> = arity_rows
        .iter()
        .map(|args| (args.to_vec(), arity("RL.CHARGE")))
        .collect();
    for (args, want) in BAD_LIMITS {
        let mut args = args.to_vec();
        if args.len() == 3 {
            args.push(b"1");
        }
        rows.push((args, want.to_string()));
    }
    rows.push((vec![b"k", b"1", b"1", b"3153600001"], DEBT.to_string()));
    rows
}

#[test]
fn charge_rejects_each_bad_argument_with_its_exact_error() {
    assert_rejected_on_empty_server("RL.CHARGE", &charge_rows());
}

#[test]
fn hcharge_rejects_each_bad_argument_with_its_exact_error() {
    // The same rows with a field after the key.
    let rows: Vec<(Vec<&[u8]>, String)> = charge_rows()
        .into_iter()
        .map(|(mut args, want)| {
            if !args.is_empty() {
                args.insert(1, b"f");
            }
            let want = want.replace("'RL.CHARGE'", "'RL.HCHARGE'");
            (args, want)
        })
        .collect();
    assert_rejected_on_empty_server("RL.HCHARGE", &rows);
}

#[test]
fn other_types_get_wrongtype_both_ways() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("hello")
        .query(&mut con)
        .unwrap();
    charge(&mut con, &["b", "1", "5", "1"]);
    hcharge(&mut con, &["t", "f", "1", "5", "1"]);
    for (name, args) in [
        ("RL.CHARGE", &["s", "1", "5", "1"][..]),
        ("RL.CHARGE", &["t", "1", "5", "1"][..]),
        ("RL.HCHARGE", &["s", "f", "1", "5", "1"][..]),
        ("RL.HCHARGE", &["b", "f", "1", "5", "1"][..]),
    ] {
        assert_eq!(
            error_text(&mut con, &command(name, args)),
            WRONGTYPE,
            "{name} {args:?}"
        );
    }
    let s: String = redis::cmd("GET").arg("s").query(&mut con).unwrap();
    assert_eq!(s, "hello", "the foreign value was touched");
    server.assert_alive();
}

#[test]
fn redis_cell_and_gcra_replies_keep_their_shape_in_debt() {
    let server = Server::start();
    let mut con = server.conn();
    // RL.THROTTLE k 4 1 1000 is a bucket of 5 refilling one token per 1,000 s: the same as
    // rate 1/1000, capacity 5. Charged 8, it is three in debt for 3,000 s.
    charge(&mut con, &["k", "1/1000", "5", "8"]);
    let before = snapshot(&mut con);
    // redis-cell's five integers: limited, limit, remaining 0 (never negative), the wait
    // for one token in whole seconds (4,000 s, rounded up), and until full (8,000 s).
    let reply = throttle(&mut con, &["k", "4", "1", "1000"]);
    assert_eq!(reply, [1, 5, 0, 4000, 8000]);
    let reply = gcra(&mut con, &["k", "4", "1", "1000"]);
    assert_eq!(reply, [1, 5, 0, 4000, 8000]);
    // Quantity 0 is denied too while in debt, with the wait until the debt is repaid.
    let reply = throttle(&mut con, &["k", "4", "1", "1000", "0"]);
    assert_eq!(reply, [1, 5, 0, 3000, 8000]);
    let reply = gcra(&mut con, &["k", "4", "1", "1000", "TOKENS", "0"]);
    assert_eq!(reply, [1, 5, 0, 3000, 8000]);
    assert_eq!(snapshot(&mut con), before, "a denial wrote");
}

/// Charges into debt on a key and a table field, and a bucket not in debt beside them.
fn charged_buckets(con: &mut Connection) {
    charge(con, &["k", "0.001", "5", "8"]);
    charge(con, &["third", "3/10000", "3", "7"]); // a fraction of a ns
    hcharge(con, &["t", "f", "0.001", "5", "12"]);
    hcharge(con, &["t", "g", "0.001", "5", "1"]);
}

#[test]
fn debt_survives_debug_reload_and_an_rdb_restart() {
    let mut server = Server::start();
    let mut con = server.conn();
    charged_buckets(&mut con);
    let before = snapshot(&mut con);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(snapshot(&mut con), before, "after DEBUG RELOAD");
    let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
    server.restart();
    let mut con = server.conn();
    assert_eq!(snapshot(&mut con), before, "after an RDB restart");
    assert_eq!(peek(&mut con, &["k", "0.001", "5", "0"])[1], -3);
    assert_eq!(hpeek(&mut con, &["t", "f", "0.001", "5", "0"])[1], -7);
}

/// The Lua fallback script (clients/lua/rl.lua), as every library ships it.
const SCRIPT: &str = include_str!("../clients/lua/rl.lua");

/// `EVAL` of the script in `mode` on `key` with its 10 numbers, or the error text.
fn script(
    con: &mut Connection,
    mode: &str,
    key: &str,
    numbers: [i64; 10],
) -> Result<Vec<i64>, String> {
    redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg(key)
        .arg(mode)
        .arg(&numbers[..])
        .query(con)
        .map_err(|e| common::error_reply_text(&e))
}

#[test]
fn the_lua_script_charges_as_the_module_does() {
    let server = Server::start();
    let mut con = server.conn();
    // The script's numbers, worked out by hand (clients/lua/rl.lua's header): D, T, the
    // capacity's refill, the slack (-1: a cost above capacity), cost × T rounded up, and
    // floor(capacity); all in µs over D. At 3/s T = 333,333 + 1/3 µs.
    let three = |cost_q: i64, cost_r: i64| [3, 333_333, 1, 1_000_000, 0, -1, 0, cost_q, cost_r, 3];
    // 5 at 3/s from 3 (1,666,666 + 2/3 µs), 10 at 1/s from 1 (nine in debt), and 0.
    let rows: &[(&str, [&str; 3], [i64; 10])] = &[
        ("k3", ["3", "3", "5"], three(1_666_666, 2)),
        (
            "k1",
            ["1", "1", "10"],
            [1, 1_000_000, 0, 1_000_000, 0, -1, 0, 10_000_000, 0, 1],
        ),
        ("kz", ["3", "3", "0"], three(0, 0)),
    ];
    for (key, [rate, capacity, cost], numbers) in rows {
        let module = charge(&mut con, &[&format!("m{key}"), rate, capacity, cost]);
        let lua = script(&mut con, "charge", &format!("l{key}"), *numbers).expect("EVAL");
        assert_eq!(lua, module, "charge {cost} at {rate}, capacity {capacity}");
    }
    // Past the bound: the same error, and nothing written.
    let past = [
        1,
        1_000_000,
        0,
        1_000_000,
        0,
        -1,
        0,
        3_153_600_001_000_000,
        0,
        1,
    ];
    let module = error_text(
        &mut con,
        &command("RL.CHARGE", &["m", "1", "1", "3153600001"]),
    );
    assert_eq!(script(&mut con, "charge", "l", past), Err(module));
    assert!(!exists(&mut con, b"m") && !exists(&mut con, b"l"));
    // In debt, a peek of cost 0 shows the same negative balance as RL.PEEK (3/s: 2 in debt
    // for 666.67 ms; the waits move by the ms between the calls).
    // Cost 0: the slack is the whole capacity's refill, 1,000,000 µs.
    let peek_zero = [3, 333_333, 1, 1_000_000, 0, 1_000_000, 0, 0, 0, 3];
    let lua = script(&mut con, "peek", "lk3", peek_zero).expect("EVAL");
    let module = peek(&mut con, &["mk3", "3", "3", "0"]);
    assert_eq!((lua[0], module[0]), (0, 0), "{lua:?} {module:?}");
    assert!(lua[1] < 0 && module[1] < 0, "{lua:?} {module:?}");
}
