//! From the Lua fallback to the module without a gap: a bucket the shipped script
//! (`clients/lua/rl.lua`, or the Functions library made from it) wrote as its string (`rl`
//! and three packed doubles), or as the hash `{a, b, d}` that earlier versions wrote, is taken over by every
//! per-key command with the same tokens and the same expiry; a write replaces the value with
//! the module's type and propagates `DEL` and `RL.SETSTATE` (replica and AOF replay
//! identical); a peek or a denial leaves the value as it was; any other hash or string stays
//! `WRONGTYPE` and untouched; the script itself answers `WRONGTYPE` on a module key.
//!
//! Each comparison runs the module's command on a key and the script on a twin key (a `COPY`
//! of the same value) at the same instant. The module's instant is read in the same
//! `MULTI` as its command: on servers with `RedisModule_CachedMicroseconds` (Redis 7.2+,
//! Valkey) `TIME` inside the `MULTI` is that instant; on Redis 7.0 the module reads
//! whole milliseconds, so the instant is known when the `TIME`s around the command fall in
//! the same millisecond (otherwise the attempt is repeated on fresh copies). The twin then
//! runs the shipped script with its one `TIME` call replaced by that instant, so both answer
//! for the same microsecond and every field must be equal.
//!
//! Time: the buckets are written several seconds into debt (3/s, 7/s, 3 per 10 s), so none
//! is full again, or expires, during a comparison. Nothing asserts a duration.

#![cfg(test)]

mod common;

use std::thread;

use common::aof::PLAIN_AOF_ALWAYS;
use common::fallback::{pinned_script, Rate, RATES, SCRIPT};
use common::info::{calls, info, info_field};
use common::texts::WRONGTYPE;
use common::{all_keys, dump, error_text, exists, pexpiretime, wait_for_replica, Server};
use redis::{Connection, Value};

/// The Functions library made from the fallback script.
const FUNCTIONS: &str = include_str!("../clients/lua/rl_functions.lua");

/// `EVAL` of the shipped script: `mode` on `keys`, one `(rate, cost)` per key.
fn script_cmd(script: &str, mode: &str, keys: &[&str], groups: &[(Rate, u128)]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len()).arg(keys).arg(mode);
    for &(rate, cost) in groups {
        cmd.arg(rate.numbers(cost));
    }
    cmd
}

fn run_script(con: &mut Connection, mode: &str, keys: &[&str], groups: &[(Rate, u128)]) -> Value {
    script_cmd(SCRIPT, mode, keys, groups)
        .query(con)
        .expect("the script")
}

/// Whether the module reads whole milliseconds (Redis 7.0), so its instant can differ from
/// `TIME`'s inside one `MULTI`.
fn ms_clock(con: &mut Connection) -> bool {
    info_field(&info(con, "rl"), "rl_clock") == Some("RedisModule_Milliseconds")
}

fn time_us(value: &Value) -> i64 {
    let (s, us): (i64, i64) = redis::from_redis_value(value.clone()).expect("TIME");
    s * 1_000_000 + us
}

/// What `key` holds, for comparing before and after: a hash's sorted fields, or a string as
/// one pair ("", value).
fn stored(con: &mut Connection, key: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    if key_type(con, key) == "string" {
        let value: Vec<u8> = redis::cmd("GET").arg(key).query(con).expect("GET");
        return vec![(Vec::new(), value)];
    }
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> =
        redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL");
    fields.sort();
    fields
}

/// The two forms the fallback's buckets take: the string it writes, and the hash of earlier
/// versions, which it still reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    String,
    Hash,
}

impl Form {
    fn key_type(self) -> &'static str {
        match self {
            Form::String => "string",
            Form::Hash => "hash",
        }
    }
}

/// The fallback's string for (q, r, D): `rl` and three little-endian doubles.
fn packed(q: f64, r: f64, d: f64) -> Vec<u8> {
    let mut value = b"rl".to_vec();
    for n in [q, r, d] {
        value.extend_from_slice(&n.to_le_bytes());
    }
    value
}

/// The three numbers (q, r, D) of the fallback's bucket at `key` as texts, in either form.
fn fallback_fields(con: &mut Connection, key: &str) -> (String, String, String) {
    if key_type(con, key) == "string" {
        let value: Vec<u8> = redis::cmd("GET").arg(key).query(con).expect("GET");
        assert_eq!(value.len(), 26, "{key} holds {value:?}");
        assert_eq!(&value[..2], b"rl", "{key} holds {value:?}");
        let n = |i: usize| {
            let bytes: [u8; 8] = value[2 + 8 * i..10 + 8 * i].try_into().expect("8 bytes");
            let n = f64::from_le_bytes(bytes);
            assert!(n >= 0.0 && n.fract() == 0.0, "{key} holds {value:?}");
            format!("{n:.0}")
        };
        return (n(0), n(1), n(2));
    }
    redis::cmd("HMGET")
        .arg(key)
        .arg(&["a", "b", "d"])
        .query(con)
        .expect("HMGET a b d")
}

/// Rewrites the string bucket at `key` as the hash an earlier version of the script wrote,
/// with the same fields and expiry.
fn to_old_hash(con: &mut Connection, key: &str) {
    let (a, b, d) = fallback_fields(con, key);
    let expire_at = pexpiretime(con, key.as_bytes());
    let _: i64 = redis::cmd("DEL").arg(key).query(con).expect("DEL");
    let _: i64 = redis::cmd("HSET")
        .arg(key)
        .arg(&["a", &a, "b", &b, "d", &d])
        .query(con)
        .expect("HSET");
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg(key)
        .arg(expire_at)
        .query(con)
        .expect("PEXPIREAT");
}

fn key_type(con: &mut Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query(con).expect("TYPE")
}

fn copy(con: &mut Connection, from: &str, to: &str) {
    let copied: i64 = redis::cmd("COPY")
        .arg(from)
        .arg(to)
        .arg("REPLACE")
        .query(con)
        .expect("COPY");
    assert_eq!(copied, 1, "COPY {from} {to}");
}

/// The module state (`RL.SETSTATE` arguments) of the fallback's bucket at `key`: the instant
/// `q + r/D` µs as whole ns and the rest in units of 2^-63 ns rounded up, worked out here
/// in integers from the bucket's own fields.
fn state_of(con: &mut Connection, key: &str) -> (u128, u128) {
    let (a, b, d) = fallback_fields(con, key);
    let number = |text: &str| -> u128 { text.parse().expect("an integer") };
    let (a, b, d) = (number(&a), number(&b), number(&d));
    let ns = a * 1000 + b * 1000 / d;
    let frac = ((b * 1000 % d) << 63).div_ceil(d);
    (ns, frac)
}

/// Asserts what `key` holds after the module's call against what `twin` holds after the
/// script's: both missing; both the untouched hash `before` (a peek, a denial); or the
/// module's type holding exactly the twin's instant, with the same expiry.
fn assert_same_bucket(
    con: &mut Connection,
    key: &str,
    twin: &str,
    before: &[(Vec<u8>, Vec<u8>)],
    at: &str,
) {
    let twin_type = key_type(con, twin);
    match twin_type.as_str() {
        "none" => assert!(
            !exists(con, key.as_bytes()),
            "{at}: the script deleted {twin}, the module kept {key}"
        ),
        "hash" | "string" if stored(con, twin) == before => {
            assert_eq!(
                key_type(con, key),
                twin_type,
                "{at}: the script wrote nothing, the module converted {key}"
            );
            assert_eq!(stored(con, key), before, "{at}: {key} changed");
            assert_eq!(
                pexpiretime(con, key.as_bytes()),
                pexpiretime(con, twin.as_bytes()),
                "{at}: expiry of {key}"
            );
        }
        "string" | "hash" => {
            assert_eq!(
                key_type(con, key),
                "rl-bucket",
                "{at}: the script wrote, the module did not convert {key}"
            );
            let (ns, frac) = state_of(con, twin);
            let _: () = redis::cmd("RL.SETSTATE")
                .arg("expected")
                .arg(ns.to_string())
                .arg(frac.to_string())
                .query(con)
                .expect("RL.SETSTATE");
            assert_eq!(
                dump(con, key.as_bytes()),
                dump(con, b"expected"),
                "{at}: state of {key} vs {twin}'s instant"
            );
            assert_eq!(
                pexpiretime(con, key.as_bytes()),
                pexpiretime(con, twin.as_bytes()),
                "{at}: expiry of {key}"
            );
            let _: i64 = redis::cmd("DEL").arg("expected").query(con).expect("DEL");
        }
        other => panic!("{at}: the script left {twin} as {other}"),
    }
}

/// Runs `module` inside a `MULTI` between two `TIME`s: its reply and the instant (µs) it
/// decided at, or `None` when that is not known (`ms`: the module reads Redis 7.0's
/// millisecond clock, which ticked in between).
fn at_known_instant(
    con: &mut Connection,
    module: &redis::Cmd,
    ms: bool,
    at: &str,
) -> Option<(Value, i64)> {
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("TIME")
        .add_command(module.clone())
        .cmd("TIME")
        .query(con)
        .expect("MULTI");
    let (first, last) = (time_us(&replies[0]), time_us(&replies[2]));
    let now_us = if ms {
        if first / 1000 != last / 1000 {
            return None;
        }
        first / 1000 * 1000
    } else {
        assert_eq!(
            first, last,
            "{at}: TIME moved inside MULTI on a cached clock"
        );
        first
    };
    Some((replies[1].clone(), now_us))
}

/// The pinned script's `mode` on `keys` at `now_us`.
fn script_at(
    con: &mut Connection,
    mode: &str,
    keys: &[&str],
    groups: &[(Rate, u128)],
    now_us: i64,
) -> Value {
    let mut cmd = script_cmd(&pinned_script(), mode, keys, groups);
    cmd.arg(now_us / 1_000_000).arg(now_us % 1_000_000);
    cmd.query(con).expect("the pinned script")
}

/// One comparison: `module` (on the keys `k0`, `k1`, …) and the script's `mode` (on the
/// twins `t0`, `t1`, …) at the same instant, each pair first copied from `pristine{i}`.
/// Returns the module's reply after asserting the script's is the same, and that every key
/// holds what its twin does.
fn compare(
    con: &mut Connection,
    n_keys: usize,
    module: &redis::Cmd,
    mode: &str,
    groups: &[(Rate, u128)],
    at: &str,
) -> Value {
    let ms = ms_clock(con);
    let keys: Vec<String> = (0..n_keys).map(|i| format!("k{i}")).collect();
    let twins: Vec<String> = (0..n_keys).map(|i| format!("t{i}")).collect();
    let twin_refs: Vec<&str> = twins.iter().map(String::as_str).collect();
    for _attempt in 0..50 {
        let mut before = Vec::new();
        for i in 0..n_keys {
            copy(con, &format!("pristine{i}"), &keys[i]);
            copy(con, &format!("pristine{i}"), &twins[i]);
            before.push(stored(con, &keys[i]));
        }
        let Some((reply, now_us)) = at_known_instant(con, module, ms, at) else {
            continue; // the module's millisecond is not known: try again
        };
        let twin_reply = script_at(con, mode, &twin_refs, groups, now_us);
        assert_eq!(
            reply, twin_reply,
            "{at}: the module's reply vs the script's at {now_us} µs"
        );
        for i in 0..n_keys {
            assert_same_bucket(con, &keys[i], &twins[i], &before[i], at);
        }
        return reply;
    }
    panic!("{at}: every attempt straddled a millisecond");
}

fn cmd(name: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd
}

/// Writes `pristine{i}` anew with the shipped script at the server's clock, through mixed
/// takes and a charge that leave a few tokens and the bucket seconds from full.
fn write_pristine(con: &mut Connection, i: usize, rate: Rate, form: Form) {
    let key = format!("pristine{i}");
    let _: i64 = redis::cmd("DEL").arg(&key).query(con).expect("DEL");
    let c = rate.capacity;
    for (mode, cost) in [
        ("acquire", c / 2),
        ("acquire", 1),
        ("acquire", c / 3),
        ("charge", 1),
    ] {
        let _: Value = run_script(con, mode, &[&key], &[(rate, cost)]);
    }
    assert_eq!(key_type(con, &key), "string");
    if form == Form::Hash {
        to_old_hash(con, &key);
    }
}

/// One call of the comparison table: the module's command, its arguments after the key, the
/// script's mode, the cost, and the reply's first element where it says allowed or denied.
type Row<'a> = (&'a str, Vec<&'a str>, &'a str, u128, Option<i64>);

#[test]
fn every_command_takes_over_a_script_bucket_as_the_script_would_answer() {
    let server = Server::start();
    let mut con = server.conn();
    for (rate, form) in RATES
        .into_iter()
        .flat_map(|rate| [(rate, Form::String), (rate, Form::Hash)])
    {
        write_pristine(&mut con, 0, rate, form);
        write_pristine(&mut con, 1, rate, form);
        let (r, cap) = (rate.text, rate.cap());
        let remaining = |con: &mut Connection| -> u128 {
            let reply: Vec<i64> =
                redis::from_redis_value(run_script(con, "peek", &["pristine0"], &[(rate, 0)]))
                    .expect("peek");
            u128::try_from(reply[1]).expect("tokens left")
        };
        let left = remaining(&mut con);
        assert!(left >= 1 && left < rate.capacity, "rate {r}: {left} left");
        // `left` fits whenever the bucket is compared (refill only adds); the whole capacity is
        // denied until the bucket is full, seconds after every comparison.
        let fits = left.to_string();
        // (module command, its arguments after the key, the script's mode, cost, the reply's
        // first element where it says allowed or denied): every command, allowed and
        // denied, writing and not.
        let rows: [Row; 8] = [
            ("RL.PEEK", vec![r, &cap, "1"], "peek", 1, Some(1)),
            (
                "RL.PEEK",
                vec![r, &cap, &cap],
                "peek",
                rate.capacity,
                Some(0),
            ),
            ("RL.ACQUIRE", vec![r, &cap, "1"], "acquire", 1, Some(1)),
            ("RL.ACQUIRE", vec![r, &cap, &fits], "acquire", left, Some(1)),
            (
                "RL.ACQUIRE",
                vec![r, &cap, &cap],
                "acquire",
                rate.capacity,
                Some(0),
            ),
            ("RL.REFUND", vec![r, &cap, "2"], "refund", 2, None),
            (
                "RL.REFUND",
                vec![r, &cap, &cap],
                "refund",
                rate.capacity,
                None,
            ),
            (
                "RL.CHARGE",
                vec![r, &cap, &cap],
                "charge",
                rate.capacity,
                Some(1),
            ),
        ];
        for (name, args, mode, cost, allowed) in rows {
            let at = format!("{name} k0 {}", args.join(" "));
            let mut module = redis::cmd(name);
            module.arg("k0").arg(&args);
            let reply = compare(&mut con, 1, &module, mode, &[(rate, cost)], &at);
            let reply: Vec<i64> = redis::from_redis_value(reply).expect("integers");
            if let Some(allowed) = allowed {
                assert_eq!(reply[0], allowed, "{at}: {reply:?}");
            }
        }
        // RL.ACQUIRE.MULTI over two taken-over buckets: allowed (both convert) and refused
        // by the second (neither changes).
        for second in [1, rate.capacity] {
            let second_text = second.to_string();
            let mut module = redis::cmd("RL.ACQUIRE.MULTI");
            module.arg(&["k0", r, &cap, "1", "k1", r, &cap, &second_text]);
            let at = format!("RL.ACQUIRE.MULTI at {r}, second cost {second}");
            let reply = compare(
                &mut con,
                2,
                &module,
                "multi",
                &[(rate, 1), (rate, second)],
                &at,
            );
            let Value::Array(head) = reply else {
                panic!("{at}: {reply:?}")
            };
            assert_eq!(head[0], Value::Int(i64::from(second == 1)), "{at}");
        }
    }
}

#[test]
fn a_bucket_the_functions_library_wrote_is_taken_over_too() {
    let server = Server::start();
    let mut con = server.conn();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(FUNCTIONS)
        .query(&mut con)
        .expect("FUNCTION LOAD");
    let rate = RATES[1];
    for _ in 0..3 {
        let _: Value = redis::cmd("FCALL")
            .arg("rl_acquire")
            .arg(1)
            .arg("pristine0")
            .arg(rate.numbers(20))
            .query(&mut con)
            .expect("FCALL rl_acquire");
    }
    assert_eq!(key_type(&mut con, "pristine0"), "string");
    let cap = rate.cap();
    for (name, mode) in [
        ("RL.PEEK", "peek"),
        ("RL.ACQUIRE", "acquire"),
        ("RL.CHARGE", "charge"),
    ] {
        let module = cmd(name, &["k0", rate.text, &cap, "3"]);
        compare(
            &mut con,
            1,
            &module,
            mode,
            &[(rate, 3)],
            &format!("{name} after FCALL"),
        );
    }
}

/// The form of the buckets `take_over_a_mix` writes at `RATES[i]`: both forms, by turns.
fn mix_form(i: usize) -> Form {
    if i % 2 == 0 {
        Form::String
    } else {
        Form::Hash
    }
}

/// Fills a master with script-written buckets (strings, and hashes of the earlier form) and
/// takes them over: converted by a take, a charge and a multi, deleted by a refund to full,
/// left alone by a peek and a denial.
fn take_over_a_mix(con: &mut Connection) {
    for (i, rate) in RATES.into_iter().enumerate() {
        for name in ["take", "charge", "multi", "refund", "peek", "deny"] {
            write_pristine(con, 0, rate, mix_form(i));
            copy(con, "pristine0", &format!("{name}{i}"));
        }
        let _: i64 = redis::cmd("DEL").arg("pristine0").query(con).expect("DEL");
        let (r, cap) = (rate.text, rate.cap());
        let key = |name: &str| format!("{name}{i}");
        let reply: Vec<i64> = cmd("RL.ACQUIRE", &[&key("take"), r, &cap, "1"])
            .query(con)
            .expect("take");
        assert_eq!(reply[0], 1);
        let _: Vec<i64> = cmd("RL.CHARGE", &[&key("charge"), r, &cap, "2"])
            .query(con)
            .expect("charge");
        let _: Value = cmd("RL.ACQUIRE.MULTI", &[&key("multi"), r, &cap, "1"])
            .query(con)
            .expect("multi");
        let _: Vec<i64> = cmd("RL.REFUND", &[&key("refund"), r, &cap, &cap])
            .query(con)
            .expect("refund");
        let _: Vec<i64> = cmd("RL.PEEK", &[&key("peek"), r, &cap, "1"])
            .query(con)
            .expect("peek");
        let reply: Vec<i64> = cmd("RL.ACQUIRE", &[&key("deny"), r, &cap, &cap])
            .query(con)
            .expect("deny");
        assert_eq!(reply[0], 0, "a whole capacity is denied in debt");
        for (name, want) in [
            ("take", "rl-bucket"),
            ("charge", "rl-bucket"),
            ("multi", "rl-bucket"),
            ("refund", "none"),
            ("peek", mix_form(i).key_type()),
            ("deny", mix_form(i).key_type()),
        ] {
            assert_eq!(key_type(con, &key(name)), want, "{}", key(name));
        }
    }
}

/// Every key of `a` is in `b` with the same `DUMP` and `PEXPIRETIME`, and no other.
fn assert_same_keys(a: &mut Connection, b: &mut Connection, what: &str) {
    let keys = all_keys(a);
    assert_eq!(all_keys(b), keys, "{what}: other keys");
    for key in &keys {
        let name = String::from_utf8_lossy(key);
        assert_eq!(dump(b, key), dump(a, key), "{what}: DUMP of {name}");
        let expire_at = pexpiretime(a, key);
        assert!(expire_at > 0, "{what}: {name} has no expiry");
        assert_eq!(
            pexpiretime(b, key),
            expire_at,
            "{what}: PEXPIRETIME of {name}"
        );
    }
}

#[test]
fn a_takeover_replicates_and_replays_to_identical_keys() {
    let mut server = Server::start_with(&PLAIN_AOF_ALWAYS);
    let replica_server = server.start_replica();
    let mut master = server.conn();
    let mut replica = replica_server.conn();
    take_over_a_mix(&mut master);
    wait_for_replica(&mut master);
    assert_same_keys(&mut master, &mut replica, "replica");
    // A peek on the replica reads the values it still holds, as the script would there.
    let replica_ms = ms_clock(&mut replica);
    for (i, rate) in RATES.into_iter().enumerate() {
        let key = format!("peek{i}");
        let module = cmd("RL.PEEK", &[&key, rate.text, &rate.cap(), "1"]);
        let (reply, now_us) = (0..50)
            .find_map(|_| at_known_instant(&mut replica, &module, replica_ms, &key))
            .expect("an attempt within one millisecond");
        let script = script_at(&mut replica, "peek", &[&key], &[(rate, 1)], now_us);
        assert_eq!(reply, script, "RL.PEEK {key} on the replica");
        assert_eq!(key_type(&mut replica, &key), mix_form(i).key_type());
    }
    assert_same_keys(&mut master, &mut replica, "replica after peeks");
    // The replica received the effects, never the clock-dependent commands.
    for name in ["rl.acquire", "rl.charge", "rl.refund", "rl.acquire.multi"] {
        assert_eq!(
            calls(&mut replica, name),
            None,
            "{name} reached the replica"
        );
    }
    // Each conversion ships DEL before RL.SETSTATE.
    let files = common::aof::parse_aof(&aof_increment(&server));
    let names: Vec<String> = files
        .iter()
        .map(|c| String::from_utf8_lossy(&c[0]).to_ascii_uppercase())
        .collect();
    for (i, command) in files.iter().enumerate() {
        if names[i] == "RL.SETSTATE" && command[1].starts_with(b"take") {
            assert_eq!(names[i - 1], "DEL", "{names:?}");
            assert_eq!(files[i - 1][1], command[1]);
        }
    }
    // Replaying the AOF gives the same keys again.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica)
        .expect("REPLICAOF NO ONE");
    server.restart_with(&PLAIN_AOF_ALWAYS);
    let mut replayed = server.conn();
    assert_same_keys(&mut replica, &mut replayed, "AOF replay");
}

/// The AOF's last increment file.
fn aof_increment(server: &Server) -> Vec<u8> {
    let dir = server.dir.path().join("appendonlydir");
    let manifest = std::fs::read_to_string(dir.join("appendonly.aof.manifest")).expect("manifest");
    let name = manifest
        .lines()
        .rfind(|l| l.contains("type i"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("an increment in the manifest");
    std::fs::read(dir.join(name)).expect("the increment")
}

#[test]
fn other_hashes_stay_wrongtype_and_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let future_s = (common::server_time_us(&mut con) / 1_000_000 + 60).to_string();
    let q = format!("{future_s}000000");
    // Hashes the fallback never writes: other fields, extra fields, missing ones, and values
    // that are not its integers or out of its range.
    let hashes: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "extra field",
            vec![("a", &q), ("b", "0"), ("d", "1"), ("e", "1")],
        ),
        // A bucket holding a reservation record: the module keeps its records elsewhere, so
        // it leaves this hash to the fallback until it expires (docs/migrating.md).
        (
            "reservation record",
            vec![
                ("a", &q),
                ("b", "0"),
                ("d", "1"),
                ("r:export-7", "100000 0 1 100000 0 9007199254740000"),
            ],
        ),
        ("missing d", vec![("a", &q), ("b", "0")]),
        ("other names", vec![("A", &q), ("B", "0"), ("D", "1")]),
        (
            "a user's hash",
            vec![("name", "ada"), ("role", "admin"), ("x", "1")],
        ),
        ("leading zero", vec![("a", &q), ("b", "01"), ("d", "3")]),
        ("sign", vec![("a", &q), ("b", "+1"), ("d", "3")]),
        ("space", vec![("a", &q), ("b", "1"), ("d", " 3")]),
        ("decimal point", vec![("a", &q), ("b", "1.0"), ("d", "3")]),
        ("exponent", vec![("a", "1.7e15"), ("b", "0"), ("d", "1")]),
        ("hex", vec![("a", &q), ("b", "0x1"), ("d", "3")]),
        ("b equal to d", vec![("a", &q), ("b", "3"), ("d", "3")]),
        ("d zero", vec![("a", &q), ("b", "0"), ("d", "0")]),
        (
            "d at 2^31",
            vec![("a", &q), ("b", "0"), ("d", "2147483648")],
        ),
        (
            "a at 2^53",
            vec![("a", "9007199254740992"), ("b", "0"), ("d", "1")],
        ),
        ("negative", vec![("a", "-1"), ("b", "0"), ("d", "1")]),
        ("binary", vec![("a", &q), ("b", "1\0"), ("d", "3")]),
    ];
    let rate = RATES[0];
    let cap = rate.cap();
    for (what, fields) in &hashes {
        let _: i64 = redis::cmd("DEL").arg("h").query(&mut con).expect("DEL");
        let mut hset = redis::cmd("HSET");
        hset.arg("h");
        for (f, v) in fields {
            hset.arg(*f).arg(*v);
        }
        let _: i64 = hset.query(&mut con).expect("HSET");
        let _: i64 = redis::cmd("PEXPIREAT")
            .arg("h")
            .arg(format!("{future_s}000"))
            .query(&mut con)
            .expect("PEXPIREAT");
        let before = (dump(&mut con, b"h"), pexpiretime(&mut con, b"h"));
        for module in [
            cmd("RL.ACQUIRE", &["h", rate.text, &cap, "1"]),
            cmd("RL.PEEK", &["h", rate.text, &cap]),
            cmd("RL.REFUND", &["h", rate.text, &cap, "1"]),
            cmd("RL.CHARGE", &["h", rate.text, &cap, "1"]),
            cmd("RL.ACQUIRE.MULTI", &["h", rate.text, &cap, "1"]),
            cmd("RL.THROTTLE", &["h", "5", "3", "1"]),
            cmd("RL.SETSTATE", &["h", "1"]),
        ] {
            assert_eq!(
                error_text(&mut con, &module),
                WRONGTYPE,
                "{what}: {module:?}"
            );
            assert_eq!(
                (dump(&mut con, b"h"), pexpiretime(&mut con, b"h")),
                before,
                "{what}: changed by {module:?}"
            );
        }
    }
    server.assert_alive();
}

#[test]
fn other_strings_stay_wrongtype_and_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let future_s = (common::server_time_us(&mut con) / 1_000_000 + 60).to_string();
    let q_text = format!("{future_s}000000");
    let q: f64 = q_text.parse().expect("q");
    let good = packed(q, 1.0, 3.0);
    // Strings the fallback never writes: a user's value, its numbers without the prefix or
    // with another, one byte short or over, the text form of earlier builds, doubles that are
    // no whole number, out of range.
    let strings: Vec<Vec<u8>> = vec![
        b"5".to_vec(),
        b"hello".to_vec(),
        good[2..].to_vec(),
        [b"RL".as_slice(), &good[2..]].concat(),
        good[..25].to_vec(),
        [good.as_slice(), b"\0"].concat(),
        format!("rl:{q_text}:1:3").into_bytes(),
        packed(q + 0.5, 1.0, 3.0),
        packed(-q, 1.0, 3.0),
        packed(f64::NAN, 1.0, 3.0),
        packed(q, f64::INFINITY, 3.0),
        packed(q, 3.0, 3.0),
        packed(q, 0.0, 0.0),
        packed(q, 0.0, 2_147_483_648.0),
        packed(9_007_199_254_740_992.0, 0.0, 1.0),
    ];
    let rate = RATES[0];
    let cap = rate.cap();
    for value in &strings {
        let _: () = redis::cmd("SET")
            .arg("s")
            .arg(value)
            .arg("PXAT")
            .arg(format!("{future_s}000"))
            .query(&mut con)
            .expect("SET");
        let before = (dump(&mut con, b"s"), pexpiretime(&mut con, b"s"));
        // The script reads none of them as its bucket either, and writes nothing over it.
        for mode in ["acquire", "peek"] {
            let script = script_cmd(SCRIPT, mode, &["s"], &[(rate, 1)]);
            let err = error_text(&mut con, &script);
            assert!(
                err.starts_with("WRONGTYPE"),
                "{value:?}: the script's {mode}: {err}"
            );
            assert_eq!(
                (dump(&mut con, b"s"), pexpiretime(&mut con, b"s")),
                before,
                "{value:?}: changed by the script's {mode}"
            );
        }
        for module in [
            cmd("RL.ACQUIRE", &["s", rate.text, &cap, "1"]),
            cmd("RL.PEEK", &["s", rate.text, &cap]),
            cmd("RL.REFUND", &["s", rate.text, &cap, "1"]),
            cmd("RL.CHARGE", &["s", rate.text, &cap, "1"]),
            cmd("RL.ACQUIRE.MULTI", &["s", rate.text, &cap, "1"]),
            cmd("RL.THROTTLE", &["s", "5", "3", "1"]),
            cmd("RL.SETSTATE", &["s", "1"]),
        ] {
            assert_eq!(
                error_text(&mut con, &module),
                WRONGTYPE,
                "{value:?}: {module:?}"
            );
            assert_eq!(
                (dump(&mut con, b"s"), pexpiretime(&mut con, b"s")),
                before,
                "{value:?}: changed by {module:?}"
            );
        }
    }
    server.assert_alive();
}

#[test]
fn the_script_answers_wrongtype_on_a_module_key_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let rate = RATES[0];
    let _: Vec<i64> = cmd("RL.ACQUIRE", &["native", rate.text, &rate.cap(), "5"])
        .query(&mut con)
        .expect("RL.ACQUIRE");
    let before = (dump(&mut con, b"native"), pexpiretime(&mut con, b"native"));
    for mode in ["acquire", "peek", "refund", "charge", "multi"] {
        let err = script_cmd(SCRIPT, mode, &["native"], &[(rate, 1)])
            .query::<Value>(&mut con)
            .expect_err("the script on a module key");
        let text = common::error_reply_text(&err);
        assert!(text.starts_with(WRONGTYPE), "{mode}: {text}");
        assert_eq!(
            (dump(&mut con, b"native"), pexpiretime(&mut con, b"native")),
            before,
            "{mode}"
        );
    }
    server.assert_alive();
}

#[test]
fn a_takeover_waits_for_client_pause_write_like_any_write() {
    let server = Server::start();
    let replica_server = server.start_replica();
    let mut con = server.conn();
    let rate = RATES[1];
    let cap = rate.cap();
    write_pristine(&mut con, 0, rate, Form::String);
    copy(&mut con, "pristine0", "k");
    let before = stored(&mut con, "k");
    let expire_at = pexpiretime(&mut con, b"k");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query(&mut con)
        .expect("CLIENT PAUSE");
    // A write on the fallback's bucket and one on a module key: both wait for the pause.
    let waiting: Vec<_> = ["k", "native"]
        .into_iter()
        .map(|key| {
            let mut writer = server.conn();
            let cap = cap.clone();
            thread::spawn(move || -> Vec<i64> {
                cmd("RL.ACQUIRE", &[key, rate.text, &cap, "1"])
                    .query(&mut writer)
                    .expect("RL.ACQUIRE")
            })
        })
        .collect();
    // Both have reached the server and wait: the paused-clients gauge shows them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let blocked: i64 = info_field(&info(&mut con, "clients"), "blocked_clients")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let paused: i64 = info_field(&info(&mut con, "clients"), "paused_clients")
            .and_then(|v| v.parse().ok())
            .unwrap_or(blocked);
        if paused >= 2 || blocked >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the writes never reached the server"
        );
        thread::sleep(std::time::Duration::from_millis(10));
    }
    // Reads go on: the bucket is as it was, a peek answers from it, and nothing else exists.
    assert_eq!(stored(&mut con, "k"), before);
    assert_eq!(pexpiretime(&mut con, b"k"), expire_at);
    let peeked: Vec<i64> = cmd("RL.PEEK", &["k", rate.text, &cap])
        .query(&mut con)
        .expect("RL.PEEK");
    assert_eq!(peeked[0], 1);
    assert_eq!(key_type(&mut con, "k"), "string");
    assert!(!exists(&mut con, b"native"));
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut con)
        .expect("CLIENT UNPAUSE");
    for writer in waiting {
        assert_eq!(writer.join().expect("writer")[0], 1);
    }
    assert_eq!(key_type(&mut con, "k"), "rl-bucket");
    wait_for_replica(&mut con);
    let mut replica = replica_server.conn();
    for key in [&b"k"[..], b"native"] {
        assert_eq!(dump(&mut replica, key), dump(&mut con, key));
        assert_eq!(pexpiretime(&mut replica, key), pexpiretime(&mut con, key));
    }
}
