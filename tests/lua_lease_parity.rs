//! The Lua fallback's leases and reservations (`clients/lua/rl.lua`, whose core the Functions
//! library is made of word for word) against the module's commands on one real server, at
//! the same instants: a seeded random sequence of takes, releases, renewals, counts, reserves,
//! settles (of open, settled, lapsed and unknown ids), acquires and charges, with the clock
//! moving between steps so short leases and reservations expire, must get the same replies,
//! element for element, and leave the module's key and the script's twin alike (both there
//! or both gone, with the same `PEXPIRETIME`).
//!
//! The instant: each module command runs inside a `MULTI` between two `TIME`s, which tells
//! the instant it decided at (on Redis 7.0 the module reads whole milliseconds, so the step
//! is undone with `RESTORE` and repeated when the two `TIME`s straddle a millisecond); the
//! script then runs with its one `TIME` call replaced by that instant, on the twin key. The
//! twin lives on that pinned clock: its expiry is recorded and the key persisted, and it is
//! deleted when a pinned instant passes the expiry, so the server's own clock, a little
//! ahead, never expires it early.

#![cfg(test)]

mod common;

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use common::fallback::{pinned_script, RATES};
use common::info::{info, info_field};
use common::{dump, pexpiretime, Server};
use redis::{Connection, Value};

/// A small deterministic generator (xorshift64*), so a failure names a reproducible step.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

fn time_us(value: &Value) -> i64 {
    let (s, us): (i64, i64) = redis::from_redis_value(value.clone()).expect("TIME");
    s * 1_000_000 + us
}

/// Puts `key` back as `dump` held it (with its absolute expiry), or deletes it.
fn restore(con: &mut Connection, key: &str, saved: &Option<(Vec<u8>, i64)>) {
    let _: i64 = redis::cmd("DEL").arg(key).query(con).expect("DEL");
    if let Some((payload, at_ms)) = saved {
        let ttl = if *at_ms > 0 { *at_ms } else { 0 };
        let mut cmd = redis::cmd("RESTORE");
        cmd.arg(key).arg(ttl).arg(payload.as_slice()).arg("REPLACE");
        if ttl > 0 {
            cmd.arg("ABSTTL");
        }
        let _: () = cmd.query(con).expect("RESTORE");
    }
}

/// The module's command on `key` and the instant (µs) it decided at.
fn module_at(con: &mut Connection, key: &str, module: &redis::Cmd, ms: bool) -> (Value, i64) {
    let saved = dump(con, key.as_bytes()).map(|d| (d, pexpiretime(con, key.as_bytes())));
    for _ in 0..100 {
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("TIME")
            .add_command(module.clone())
            .ignore_errors()
            .cmd("TIME")
            .query(con)
            .expect("MULTI");
        let (first, last) = (time_us(&replies[0]), time_us(&replies[2]));
        if !ms {
            assert_eq!(first, last, "TIME moved inside MULTI on a cached clock");
            return (replies[1].clone(), first);
        }
        if first / 1000 == last / 1000 {
            return (replies[1].clone(), first / 1000 * 1000);
        }
        restore(con, key, &saved); // the millisecond is not known: undo, try again
    }
    panic!("every attempt straddled a millisecond");
}

/// The pinned script on the twin `key` at `now_us`. The twin lives on the pinned clock, not
/// the server's: its expiry is kept in `twin_at` (and the key persisted), and it is deleted
/// here when the pinned instant passes it, as the server would delete it at that instant.
fn script_at(
    con: &mut Connection,
    script: &str,
    key: &str,
    args: &[String],
    now_us: i64,
    twin_at: &mut HashMap<String, i64>,
) -> Value {
    if twin_at.get(key).is_some_and(|&at| now_us / 1000 > at) {
        let _: i64 = redis::cmd("DEL").arg(key).query(con).expect("DEL");
        twin_at.remove(key);
    }
    let mut eval = redis::cmd("EVAL");
    eval.arg(script)
        .arg(1)
        .arg(key)
        .arg(args)
        .arg(now_us / 1_000_000)
        .arg(now_us % 1_000_000);
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .add_command(eval)
        .cmd("PEXPIRETIME")
        .arg(key)
        .cmd("PERSIST")
        .arg(key)
        .ignore_errors()
        .query(con)
        .expect("EVAL");
    match replies[1] {
        Value::Int(-2) => {
            twin_at.remove(key);
        }
        Value::Int(at) if at >= 0 => {
            twin_at.insert(key.to_string(), at);
        }
        _ => {} // unchanged (persisted since its last write)
    }
    replies[0].clone()
}

/// An error reply's text, or the reply itself: the module's and the script's errors arrive
/// through different paths (a `MULTI` reply, an `EVAL`), so they are compared as text.
fn shown(value: &Value) -> String {
    match value {
        Value::ServerError(e) => format!("error {} {}", e.code(), e.details().unwrap_or("")),
        other => format!("{other:?}"),
    }
}

#[test]
fn leases_and_reservations_answer_as_the_module_does_at_the_same_instants() {
    let server = Server::start();
    let mut con = server.conn();
    let ms = info_field(&info(&mut con, "rl"), "rl_clock") == Some("RedisModule_Milliseconds");
    let script = pinned_script();
    let mut rng = Rng(0x5eed_0030);
    let ids = ["a", "b", "c", "worker-7", "0123456789abcdef"];
    let (mut taken, mut settled, mut lapsed) = (0, 0, 0);
    let mut last_reserved: Option<(usize, String)> = None;
    let mut twin_at: HashMap<String, i64> = HashMap::new();
    for step in 0..600 {
        // The clock moves: mostly not at all, sometimes past a short lease's or record's end.
        // Short TTLs are 30 ms, far above the few ms between a module call and its twin's.
        match rng.below(20) {
            0 => thread::sleep(Duration::from_millis(10)),
            1 | 2 => thread::sleep(Duration::from_millis(35)),
            _ => {}
        }
        let id = rng.pick(&ids).to_string();
        let ttl = rng.pick(&[30u64, 30, 60_000]).to_string();
        let op = *rng.pick(&[
            "lease", "lease", "lease", "release", "renew", "leases", "reserve", "reserve",
            "reserve", "settle", "settle", "settle", "acquire", "charge",
        ]);
        let (key, module, args): (String, Vec<String>, Vec<String>) = match op {
            "lease" | "release" | "renew" | "leases" => {
                let key = format!("L{}", rng.below(2));
                let limit = (1 + rng.below(3)).to_string();
                match op {
                    "lease" => (
                        key,
                        vec![limit.clone(), ttl.clone(), "ID".into(), id.clone()],
                        vec![limit, ttl, id],
                    ),
                    "release" => (key, vec![id.clone()], vec![id]),
                    "renew" => (key, vec![id.clone(), ttl.clone()], vec![id, ttl]),
                    _ => (key, vec![limit.clone()], vec![limit]),
                }
            }
            _ => {
                let mut n = rng.below(RATES.len() as u64) as usize;
                // Few reservation ids; most settles name the last reservation made.
                let mut id = rng.pick(&["a", "b"]).to_string();
                if op == "settle" && rng.below(4) != 0 {
                    if let Some((last_n, last_id)) = last_reserved.take() {
                        (n, id) = (last_n, last_id);
                    }
                }
                let rate = RATES[n];
                let amount = u128::from(*rng.pick(&[1u64, 1, 2, 3, 6, 10]));
                // Reservations mostly outlive the test, some lapse within it.
                let ttl = rng.pick(&[30u64, 60_000, 60_000]).to_string();
                let (r, cap) = (rate.text.to_string(), rate.capacity.to_string());
                if op == "reserve" {
                    last_reserved = Some((n, id.clone()));
                }
                let key = format!("B{n}");
                match op {
                    "reserve" => {
                        let mut args = rate.numbers(amount);
                        args.extend([ttl.clone(), id.clone()]);
                        let module = vec![r, cap, amount.to_string(), ttl, "ID".into(), id];
                        (key, module, args)
                    }
                    "settle" => {
                        let mut args = rate.numbers(amount);
                        args.push(id.clone());
                        (key, vec![r, cap, id, amount.to_string()], args)
                    }
                    _ => (key, vec![r, cap, amount.to_string()], rate.numbers(amount)),
                }
            }
        };
        let name = format!("RL.{}", op.to_uppercase());
        let mut cmd = redis::cmd(&name);
        cmd.arg(format!("m:{key}")).arg(&module);
        let (reply, now_us) = module_at(&mut con, &format!("m:{key}"), &cmd, ms);
        let mut script_args = vec![op.to_string()];
        script_args.extend(args);
        let twin = script_at(
            &mut con,
            &script,
            &format!("s:{key}"),
            &script_args,
            now_us,
            &mut twin_at,
        );
        let at = format!("step {step}: {name} m:{key} {module:?} at {now_us} µs");
        assert_eq!(shown(&reply), shown(&twin), "{at}");
        // The module's key holds the expiry the script gave its twin, or both are gone; or
        // the module's key has expired on the server's clock since (the twin keeps the
        // pinned clock).
        let expected = twin_at.get(&format!("s:{key}")).copied().unwrap_or(-2);
        let (time, m_at): (Value, i64) = redis::pipe()
            .atomic()
            .cmd("TIME")
            .cmd("PEXPIRETIME")
            .arg(format!("m:{key}"))
            .query(&mut con)
            .expect("PEXPIRETIME");
        if m_at != expected {
            let now_ms = time_us(&time) / 1000;
            assert!(
                m_at == -2 && expected >= 0 && expected < now_ms,
                "{at}: m:{key} expires at {m_at}, its twin at {expected} (now {now_ms} ms)"
            );
        }
        match (op, &reply) {
            ("lease" | "reserve", Value::Array(r)) if r.first() == Some(&Value::Int(1)) => {
                taken += 1
            }
            ("settle", Value::Array(_)) => settled += 1,
            ("settle", Value::ServerError(_)) => lapsed += 1,
            _ => {}
        }
    }
    // The sequence reached every branch it is about, not only denials.
    assert!(
        taken > 50 && settled > 10 && lapsed > 20,
        "taken {taken}, settled {settled}, not open {lapsed}"
    );
}
