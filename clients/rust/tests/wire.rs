//! What reaches the server, read back with MONITOR: for each case of
//! `clients/vectors/wire.json`, the exact `rate capacity cost` texts after the key (RL.ACQUIRE,
//! RL.ACQUIRE.MULTI) or the field (RL.HACQUIRE), and on a server without the module the Lua
//! script's fixed-point numbers for those same exact values (packed in one argument of ten
//! doubles), through EVALSHA and through the Functions library's FCALL (no mode argument
//! there).
//!
//! This library takes numbers, not text: a case's JSON strings are parsed here into the `f64`
//! or `u64` a caller would write (`"5"` per `"60"` is `Limit::per(5, 60 s)`), which these cases
//! allow without rounding.

#![cfg(test)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use num_bigint::BigInt;
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::Zero;
use serde_json::Value as Json;

use common::Server;
use redis_rl_client::{Limit, Limiter, OnError, Options};

const WIRE: &str = include_str!("../../vectors/wire.json");

struct Case {
    name: String,
    limit: Limit,
    cost: f64,
    /// `rate capacity cost` as the module must receive them.
    args: Vec<String>,
}

fn cases() -> Vec<Case> {
    let doc: Json = serde_json::from_str(WIRE).unwrap();
    assert_eq!(doc["format"], 1);
    let cases = doc["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    // A `python_only` case is built from Python types (a timedelta, a rate as "N/S" text).
    cases
        .iter()
        .filter(|c| c["python_only"] != true)
        .map(case)
        .collect()
}

/// A JSON string as the number it writes, or a JSON number as it is.
fn f64_of(v: &Json) -> f64 {
    match v {
        Json::String(text) => text.parse().unwrap(),
        other => other.as_f64().unwrap(),
    }
}

fn u64_of(v: &Json) -> u64 {
    match v {
        Json::String(text) => text.parse().unwrap(),
        other => other.as_u64().unwrap(),
    }
}

/// The case's limit as a caller builds it: `Limit::per` when a window is given (capacity
/// defaulting to the count), else `Limit::new`.
fn case(c: &Json) -> Case {
    let name = c["name"].as_str().unwrap().to_string();
    let limit = if c["per"].is_null() {
        Limit::new(f64_of(&c["rate"]), f64_of(&c["capacity"])).unwrap()
    } else {
        let period = Duration::from_secs_f64(f64_of(&c["per"]));
        let limit = Limit::per(u64_of(&c["rate"]), period).unwrap();
        if c["capacity"].is_null() {
            limit
        } else {
            limit.with_capacity(f64_of(&c["capacity"])).unwrap()
        }
    };
    let args = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    Case {
        name,
        limit,
        cost: f64_of(&c["cost"]),
        args,
    }
}

/// A MONITOR connection: each command the server runs, as its arguments.
struct Monitor(BufReader<TcpStream>);

impl Monitor {
    fn new(server: &Server) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK");
        Monitor(reader)
    }

    /// The arguments of the next command named `name` the server ran (skipping others).
    fn next(&mut self, name: &str) -> Vec<String> {
        loop {
            let mut line = String::new();
            assert!(self.0.read_line(&mut line).unwrap() > 0, "MONITOR closed");
            let words = quoted(&line);
            if words.first().is_some_and(|w| w.eq_ignore_ascii_case(name)) {
                return words.into_iter().skip(1).collect();
            }
        }
    }
}

/// The quoted words of a MONITOR line (`+<time> [db addr] "CMD" "arg" …`), unescaped.
fn quoted(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => word.extend(chars.next()),
                c => word.push(c),
            }
        }
        words.push(word);
    }
    words
}

fn limiter(server: &Server) -> Limiter {
    Limiter::new(
        server.client(),
        Options::new(OnError::Closed).timeout(Duration::from_secs(2)),
    )
}

#[test]
fn the_module_gets_the_exact_texts_of_each_limit() {
    let server = Server::start();
    let limiter = limiter(&server);
    let table = limiter.table("wire", 4).unwrap();
    let mut monitor = Monitor::new(&server);
    for (i, c) in cases().iter().enumerate() {
        let key = format!("wire:{i}");
        let first = limiter.acquire(&key, &c.limit, c.cost).unwrap();
        // From full, the bucket is full again `cost / rate` later, to the ms: 12000 for one of
        // 5 a minute (the double 0.0833… made it 12001).
        assert_eq!(
            BigInt::from(first.reset_after_ms),
            refill_ms(&c.args),
            "{}: reset",
            c.name
        );
        let mut want = vec![key.clone()];
        want.extend(c.args.iter().cloned());
        assert_eq!(monitor.next("RL.ACQUIRE"), want, "{}: RL.ACQUIRE", c.name);

        let field = format!("f{i}");
        table.acquire(&field, &c.limit, c.cost).unwrap();
        let shard = redis_rl_client::shard_of(&field, 4);
        let mut want = vec![table.key(shard), field];
        want.extend(c.args.iter().cloned());
        assert_eq!(monitor.next("RL.HACQUIRE"), want, "{}: RL.HACQUIRE", c.name);
    }
    // All of them in one RL.ACQUIRE.MULTI, each item's texts after its key.
    let cases = cases();
    let keys: Vec<String> = (0..cases.len()).map(|i| format!("{{m}}:{i}")).collect();
    let items: Vec<(&str, Limit, f64)> = keys
        .iter()
        .zip(&cases)
        .map(|(k, c)| (k.as_str(), c.limit, c.cost))
        .collect();
    limiter.acquire_all(&items).unwrap();
    let want: Vec<String> = keys
        .iter()
        .zip(&cases)
        .flat_map(|(k, c)| std::iter::once(k.clone()).chain(c.args.iter().cloned()))
        .collect();
    assert_eq!(monitor.next("RL.ACQUIRE.MULTI"), want);
}

/// An exact decimal ("0.1", "60") or `N/S`, as the module reads it.
fn exact(text: &str) -> BigRational {
    let decimal = |part: &str| {
        let (whole, fraction) = part.split_once('.').unwrap_or((part, ""));
        let digits: BigInt = format!("{whole}{fraction}").parse().unwrap();
        BigRational::new(digits, BigInt::from(10).pow(fraction.len() as u32))
    };
    match text.split_once('/') {
        Some((n, s)) => decimal(n) / decimal(s),
        None => decimal(text),
    }
}

/// `cost / rate` in ms, rounded up, from the exact texts.
fn refill_ms(args: &[String]) -> BigInt {
    (exact(&args[2]) * BigRational::from_integer(BigInt::from(1000)) / exact(&args[0]))
        .ceil()
        .to_integer()
}

/// The script's 10 numbers (clients/lua/rl.lua: D, T, C, S, K as pairs q + r/D µs, and
/// floor(C)) for an acquire with the exact `rate capacity cost` texts, when `1e6 / rate` µs
/// has a denominator below 2^31 (every case here: the module's own exact values).
fn script_args(args: &[String]) -> Vec<String> {
    let (rate, cap, cost) = (exact(&args[0]), exact(&args[1]), exact(&args[2]));
    let t_us = BigRational::from_integer(BigInt::from(1_000_000)) / rate;
    let d = t_us.denom().clone();
    assert!(
        d < BigInt::from(1u64 << 31),
        "{args:?}: not exact in the script"
    );
    let units = |x: BigRational| (x * &d).floor().to_integer().div_rem(&d);
    let ceil_units = |x: BigRational| (x * &d).ceil().to_integer().div_rem(&d);
    let (tq, tr) = units(t_us.clone());
    let (cq, cr) = units(&cap * &t_us);
    let (sq, sr) = units((&cap - &cost) * &t_us);
    let (kq, kr) = ceil_units(&cost * &t_us);
    assert!(cost <= cap && !t_us.is_zero());
    [
        d.clone(),
        tq,
        tr,
        cq,
        cr,
        sq,
        sr,
        kq,
        kr,
        cap.floor().to_integer(),
    ]
    .iter()
    .map(BigInt::to_string)
    .collect()
}

/// `script_args` as the one argument the library sends (ten little-endian doubles), as
/// `Monitor::next` gives it: MONITOR writes a byte as Redis's sdscatrepr does (printable ASCII
/// as itself, a quote and a backslash escaped, `\\n \\r \\t \\a \\b`, anything else `\\xNN`),
/// and `quoted` keeps the character after each backslash.
fn packed_shown(numbers: &[String]) -> Vec<String> {
    let mut out = String::new();
    for n in numbers {
        for b in n.parse::<f64>().unwrap().to_le_bytes() {
            match b {
                b'\n' => out.push('n'),
                b'\r' => out.push('r'),
                b'\t' => out.push('t'),
                7 => out.push('a'),
                8 => out.push('b'),
                32..=126 => out.push(char::from(b)),
                _ => out.push_str(&format!("x{b:02x}")),
            }
        }
    }
    vec![out]
}

#[test]
fn the_lua_script_gets_the_exact_values_of_each_limit() {
    let server = Server::plain();
    let limiter = limiter(&server);
    let mut monitor = Monitor::new(&server);
    for (i, c) in cases().iter().enumerate() {
        let key = format!("wire:{i}");
        limiter.acquire(&key, &c.limit, c.cost).unwrap();
        let got = monitor.next("EVALSHA");
        // sha, 1 key, the key, then the packed numbers: the script's short form, no mode.
        assert_eq!(got[1..3], ["1", key.as_str()], "{}", c.name);
        assert_eq!(got[3..], packed_shown(&script_args(&c.args)), "{}", c.name);
    }
}

/// `words` then the packed numbers `numbers`, as MONITOR shows a script call.
fn then(words: &[&str], numbers: &[String]) -> Vec<String> {
    words
        .iter()
        .map(|w| w.to_string())
        .chain(numbers.iter().cloned())
        .collect()
}

#[test]
fn only_a_one_key_acquire_leaves_out_the_script_mode() {
    let server = Server::plain();
    let limiter = limiter(&server);
    let mut monitor = Monitor::new(&server);
    let c = &cases()[0];
    let want = packed_shown(&script_args(&c.args));
    assert!(limiter.acquire("short", &c.limit, c.cost).unwrap().allowed);
    assert_eq!(monitor.next("EVALSHA")[1..], then(&["1", "short"], &want));
    limiter.peek("short", &c.limit, c.cost).unwrap();
    assert_eq!(
        monitor.next("EVALSHA")[1..],
        then(&["1", "short", "peek"], &want)
    );
    limiter.acquire_all(&[("short", c.limit, c.cost)]).unwrap();
    assert_eq!(
        monitor.next("EVALSHA")[1..],
        then(&["1", "short", "multi"], &want)
    );
    limiter.refund("short", &c.limit, c.cost).unwrap();
    assert_eq!(monitor.next("EVALSHA")[1..4], ["1", "short", "refund"]);
}

#[test]
fn the_functions_library_gets_the_exact_values_of_each_limit() {
    let server = Server::plain();
    redis_rl_client::load_functions(&mut server.conn()).unwrap();
    let limiter = limiter(&server);
    let mut monitor = Monitor::new(&server);
    for (i, c) in cases().iter().enumerate() {
        let key = format!("wire:{i}");
        let d = limiter.acquire(&key, &c.limit, c.cost).unwrap();
        assert_eq!(d.source, redis_rl_client::Source::Functions, "{}", c.name);
        assert_eq!(
            BigInt::from(d.reset_after_ms),
            refill_ms(&c.args),
            "{}: reset",
            c.name
        );
        let got = monitor.next("FCALL");
        // The function (a one-key acquire's, answered packed), 1 key, the key, then the numbers.
        assert_eq!(
            got[..3],
            ["rl_acquire_packed", "1", key.as_str()],
            "{}",
            c.name
        );
        assert_eq!(got[3..], packed_shown(&script_args(&c.args)), "{}", c.name);
    }
}
