//! Chaos under load (`make chaos`): a master kept busy by pipelining clients while it is
//! reconfigured in every way that changes who listens to its writes (AOF on and off, rewrites,
//! snapshots, replicas attaching by disk-based and diskless sync, links killed, migration
//! tools attached as replicas, a chained replica), then checked against the exact model; and a
//! failover variant that SIGKILLs the master mid-load and promotes its replica.
//!
//! The master starts with no AOF and no save points, so the module's propagation cache
//! (src/propagation.rs) starts in "skip" mode: writes build no replication command. Every
//! transition must switch propagation back on before a write is lost, and a lost write shows
//! up at the end as a replica, or the master replayed from its AOF, holding a different bucket.
//!
//! Both tests are `#[ignore]`d (they run for `CHAOS_S` seconds, default 45); `make chaos`
//! runs them. All servers listen on 127.0.0.1 only.
//!
//! Time: the load is real time, so nothing here asserts a duration. Bounds use the server's
//! `TIME` read before the first and after the last call, floored to the millisecond (Redis
//! 7.0's module clock is milliseconds, truncated). Every bucket class takes 200 s or more to
//! refill, and the load ends by emptying each bucket, so no key expires during the end-of-run
//! comparisons; witness keys refill in 11 days. The deadlines below only guard against a hang.
//!
//! Tables take part: every pipeline starts with an `RL.HACQUIRE`, `RL.HREFUND` or `RL.HDEL`
//! on one of four tables, and the DUMP comparisons below cover them like any key.
//!
//! Checks, besides no error reply: every replica (the chained one too) and the master replayed
//! from its AOF hold every key `DUMP`- and `PEXPIRETIME`-identical to the master; no bucket
//! gave out more than `capacity + floor(rate × elapsed)` tokens; each bucket's expiry covers
//! the tokens taken from it (exactly, for the seeded buckets); every witness key created is
//! there. Failover: every admission and witness key acknowledged by `WAIT 1` is on the
//! promoted replica, and its seeded buckets hold no take the master did not make.

#![cfg(test)]

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::info::{info, info_field};
use common::{config_set, pexpiretime, Server};
use redis::{Connection, Value};

/// Client threads, one connection each.
const CLIENTS: usize = 8;
/// Commands per pipeline.
const PIPELINE: usize = 64;
/// Buckets per class.
const KEYS_PER_CLASS: usize = 60;
/// How far ahead of the run's start seeded buckets are full: 1,500 s of refill owed, so with
/// a capacity of 2,000,000 at 1000/s they hold 500,000 tokens and never fill up in a run.
const SEED_AHEAD_MS: i64 = 1_500_000;
/// Hang guard for any one wait on a server (sync, rewrite, reconnect).
const HANG_GUARD: Duration = Duration::from_secs(180);
/// Witness keys: each is written once, when created, by `RL.ACQUIRE w:… 0.000001 1`, and never
/// again. A bucket that is written all the time would hide a lost write, since the next
/// `RL.SETSTATE` carries its whole state; a witness whose one write was lost stays missing.
const WITNESS_RATE: &str = "0.000001";
/// Tables in the load: each pipeline starts with one call on one field of one of `TABLES`
/// tables (a take, a tenth of the time a refund, a tenth a reset with `RL.HDEL`), so tables
/// grow through several migrations under the load and join every DUMP comparison. A token
/// takes 1000 s to come back, so no table bucket fills up (nothing is swept) during a run.
const TABLES: usize = 4;
const TABLE_FIELDS: usize = 3000;
const TABLE_RATE: &str = "0.001";
const TABLE_CAPACITY: &str = "5";
/// Replication backlog: large enough that a killed link resyncs partially at this write rate.
const BACKLOG: &str = "64mb";

/// A family of buckets sharing one limit.
struct Class {
    /// `rate` as sent.
    rate: &'static str,
    /// `rate` as the exact fraction `rate_num / rate_den` tokens per second.
    rate_num: u128,
    rate_den: u128,
    capacity: i64,
    /// Seeded with `RL.SETSTATE` before the run (else the bucket starts missing, i.e. full).
    seeded: bool,
}

impl Class {
    /// Nanoseconds per token, times `rate_num` (kept integral: `1e9 * rate_den`).
    fn ns_per_token_scaled(&self) -> u128 {
        1_000_000_000 * self.rate_den
    }
}

/// Rates whose nanoseconds per token are not whole (3/s, 7/s, 0.3/s) and two that are (8/s,
/// 1000/s). Each fresh class takes 200 s to refill from empty; the seeded one 2,000 s.
const CLASSES: &[Class] = &[
    Class {
        rate: "3",
        rate_num: 3,
        rate_den: 1,
        capacity: 600,
        seeded: false,
    },
    Class {
        rate: "7",
        rate_num: 7,
        rate_den: 1,
        capacity: 1400,
        seeded: false,
    },
    Class {
        rate: "0.3",
        rate_num: 3,
        rate_den: 10,
        capacity: 60,
        seeded: false,
    },
    Class {
        rate: "8",
        rate_num: 8,
        rate_den: 1,
        capacity: 1600,
        seeded: false,
    },
    // Never runs dry, so every call writes: the bulk of the write traffic. At 1 ms per token
    // its PEXPIRETIME counts its takes exactly.
    Class {
        rate: "1000",
        rate_num: 1000,
        rate_den: 1,
        capacity: 2_000_000,
        seeded: true,
    },
];

/// One bucket of the run.
struct Bucket {
    key: String,
    class: &'static Class,
    capacity: String,
}

fn buckets() -> Vec<Bucket> {
    CLASSES
        .iter()
        .enumerate()
        .flat_map(|(c, class)| {
            (0..KEYS_PER_CLASS).map(move |i| Bucket {
                key: format!("chaos:{c}:{i}"),
                class,
                capacity: class.capacity.to_string(),
            })
        })
        .collect()
}

/// `CHAOS_S`: how long the load runs, at least.
fn chaos_seconds() -> u64 {
    std::env::var("CHAOS_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45)
}

/// The client the migration tools' replica mode is exercised with.
fn cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// xorshift64*: a reproducible key mix per client without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// What the clients saw of one bucket.
#[derive(Default, Clone, Copy, Debug)]
struct Seen {
    calls: u64,
    allowed: u64,
    /// Refused by this bucket itself (not a MULTI that another bucket refused).
    denied: u64,
    /// Allowed, and a later `WAIT 1` on the same connection counted the replica (failover).
    acked: u64,
    /// Allowed, not yet covered by a `WAIT` (failover).
    pending: u64,
    /// Sent in a pipeline that got no reply: applied or not, nobody knows (failover).
    unknown: u64,
}

/// What one client saw.
#[derive(Default)]
struct Tally {
    per_key: Vec<Seen>,
    acquire_calls: u64,
    multi_calls: u64,
    multi_allowed: u64,
    waits: u64,
    /// Per client: (client, witness keys created, of those covered by a `WAIT` that counted
    /// the replica).
    witnesses: Vec<(usize, u64, u64)>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        if self.per_key.is_empty() {
            self.per_key = vec![Seen::default(); other.per_key.len()];
        }
        for (sum, seen) in self.per_key.iter_mut().zip(&other.per_key) {
            sum.calls += seen.calls;
            sum.allowed += seen.allowed;
            sum.denied += seen.denied;
            sum.acked += seen.acked;
            sum.pending += seen.pending;
            sum.unknown += seen.unknown;
        }
        self.acquire_calls += other.acquire_calls;
        self.multi_calls += other.multi_calls;
        self.multi_allowed += other.multi_allowed;
        self.waits += other.waits;
        self.witnesses.extend(&other.witnesses);
    }

    /// Every witness key created, or only those a `WAIT` acknowledged.
    fn witness_keys(&self, acked_only: bool) -> Vec<Vec<u8>> {
        self.witnesses
            .iter()
            .flat_map(|&(t, created, acked)| {
                (0..if acked_only { acked } else { created }).map(move |i| witness_key(t, i))
            })
            .collect()
    }

    fn calls(&self) -> u64 {
        self.acquire_calls + self.multi_calls
    }
}

/// What the clients and the conductor share.
struct Run {
    buckets: Vec<Bucket>,
    /// Ends the load (the conductor sets it; each client also stops at `hard_stop`).
    stop: AtomicBool,
    /// A bound on the load however the conductor fares.
    hard_stop: Instant,
    /// Calls answered so far, over all clients.
    calls: AtomicU64,
    /// Failover: clients follow each pipeline with `WAIT 1` once this is set.
    wait_for_replica: AtomicBool,
    /// Failover: `WAIT`s that counted the replica, over all clients.
    acked_waits: AtomicU64,
    /// Failover: set just before the SIGKILL; from then on a broken connection is expected.
    killing: AtomicBool,
    /// Unexpected replies and failures, with the first few texts.
    errors: AtomicU64,
    error_texts: Mutex<Vec<String>>,
}

impl Run {
    fn new(hard_stop: Instant) -> Run {
        Run {
            buckets: buckets(),
            stop: AtomicBool::new(false),
            hard_stop,
            calls: AtomicU64::new(0),
            wait_for_replica: AtomicBool::new(false),
            acked_waits: AtomicU64::new(0),
            killing: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            error_texts: Mutex::new(Vec::new()),
        }
    }

    fn error(&self, text: String) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        let mut texts = self.error_texts.lock().unwrap_or_else(|e| e.into_inner());
        if texts.len() < 10 {
            texts.push(text);
        }
    }

    fn running(&self) -> bool {
        !self.stop.load(Ordering::SeqCst) && Instant::now() < self.hard_stop
    }

    fn assert_no_errors(&self) {
        let n = self.errors.load(Ordering::SeqCst);
        let texts = self.error_texts.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(
            n, 0,
            "{n} unexpected replies or failures, first: {texts:#?}"
        );
    }
}

/// Stops the clients when the conductor returns or panics, so a failing step cannot leave
/// them running until `hard_stop`.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The first integer of an array reply (the `allowed` flag of both commands).
fn allowed_flag(reply: &Value) -> Option<i64> {
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

/// The `allowed` flag of bucket `i`'s own answer in an `RL.ACQUIRE.MULTI` reply.
fn own_answer(reply: &Value, i: usize) -> Option<i64> {
    match reply {
        Value::Array(items) => match items.get(3) {
            Some(Value::Array(per_bucket)) => allowed_flag(per_bucket.get(i)?),
            _ => None,
        },
        _ => None,
    }
}

/// Client `t`'s `i`-th witness key.
fn witness_key(t: usize, i: u64) -> Vec<u8> {
    format!("w:{t}:{i}").into_bytes()
}

/// One client: pipelines of `PIPELINE` calls, a quarter of them `RL.ACQUIRE.MULTI` over two
/// or three distinct buckets, the rest `RL.ACQUIRE`, all cost 1, on random buckets, until the
/// run stops; each pipeline ends with the creation of one or two witness keys. Counts each
/// bucket's allowed and denied calls. In the failover test, once told to, it follows each
/// pipeline with `WAIT 1 1000`, and stops at the first broken call.
fn client(t: usize, mut con: Connection, run: &Run) -> Tally {
    let n = run.buckets.len();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1).wrapping_mul(0x1000_0000_01b3));
    let mut tally = Tally {
        per_key: vec![Seen::default(); n],
        ..Tally::default()
    };
    // The buckets of each queued call, in order; none for a witness call.
    let mut sent: Vec<Vec<usize>> = Vec::with_capacity(PIPELINE + 1);
    let (mut witnesses, mut witnesses_acked) = (0u64, 0u64);
    // A bound on the loop besides the clock: far more pipelines than any run reaches.
    for _ in 0..100_000_000u64 {
        if !run.running() {
            break;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        sent.clear();
        let table = format!("chaos:table:{}", rng.below(TABLES));
        let field = format!("field:{}", rng.below(TABLE_FIELDS));
        match rng.below(10) {
            0 => pipe.cmd("RL.HDEL").arg(&table).arg(&field),
            1 => pipe
                .cmd("RL.HREFUND")
                .arg(&table)
                .arg(&field)
                .arg(TABLE_RATE)
                .arg(TABLE_CAPACITY)
                .arg(1),
            _ => pipe
                .cmd("RL.HACQUIRE")
                .arg(&table)
                .arg(&field)
                .arg(TABLE_RATE)
                .arg(TABLE_CAPACITY),
        };
        for _ in 0..PIPELINE {
            if rng.below(4) == 0 {
                let width = 2 + rng.below(2);
                let mut keys: Vec<usize> = Vec::with_capacity(width);
                while keys.len() < width {
                    let k = rng.below(n);
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                let cmd = pipe.cmd("RL.ACQUIRE.MULTI");
                for &k in &keys {
                    let b = &run.buckets[k];
                    cmd.arg(&b.key).arg(b.class.rate).arg(&b.capacity).arg(1);
                }
                sent.push(keys);
            } else {
                let k = rng.below(n);
                let b = &run.buckets[k];
                pipe.cmd("RL.ACQUIRE")
                    .arg(&b.key)
                    .arg(b.class.rate)
                    .arg(&b.capacity);
                sent.push(vec![k]);
            }
        }
        // A witness: one new key, or two through RL.ACQUIRE.MULTI (a quarter of the time).
        let width = if rng.below(4) == 0 { 2 } else { 1 };
        let cmd = pipe.cmd(if width == 2 {
            "RL.ACQUIRE.MULTI"
        } else {
            "RL.ACQUIRE"
        });
        for i in 0..width {
            cmd.arg(witness_key(t, witnesses + i))
                .arg(WITNESS_RATE)
                .arg(1);
            if width == 2 {
                cmd.arg(1);
            }
        }
        sent.push(Vec::new());
        let replies: Vec<Value> = match pipe.query(&mut con) {
            Ok(replies) => replies,
            Err(e) => {
                if run.killing.load(Ordering::SeqCst) {
                    for keys in &sent {
                        for &k in keys {
                            tally.per_key[k].unknown += 1;
                        }
                    }
                } else {
                    run.error(format!("client {t}: pipeline failed: {e}"));
                }
                break;
            }
        };
        let Some((table_reply, replies)) = replies.split_first() else {
            run.error(format!("client {t}: no replies"));
            break;
        };
        if !matches!(table_reply, Value::Array(_) | Value::Int(_)) {
            run.error(format!("client {t}: {table} {field}: {table_reply:?}"));
        }
        if replies.len() != sent.len() {
            run.error(format!(
                "client {t}: {} replies to {} calls",
                replies.len(),
                sent.len()
            ));
            break;
        }
        for (keys, reply) in sent.iter().zip(replies) {
            if keys.is_empty() {
                if allowed_flag(reply) != Some(1) {
                    run.error(format!("client {t}: a new witness key replied {reply:?}"));
                }
                witnesses += width;
                continue;
            }
            if keys.len() == 1 {
                tally.acquire_calls += 1;
            } else {
                tally.multi_calls += 1;
            }
            let allowed = match allowed_flag(reply) {
                Some(1) => true,
                Some(0) => false,
                _ => {
                    let names: Vec<&str> =
                        keys.iter().map(|&k| run.buckets[k].key.as_str()).collect();
                    run.error(format!("client {t}: {names:?} replied {reply:?}"));
                    continue;
                }
            };
            if allowed && keys.len() > 1 {
                tally.multi_allowed += 1;
            }
            for (i, &k) in keys.iter().enumerate() {
                let seen = &mut tally.per_key[k];
                seen.calls += 1;
                if allowed {
                    seen.allowed += 1;
                    seen.pending += 1;
                } else if keys.len() == 1 || own_answer(reply, i) == Some(0) {
                    // A MULTI refused by another of its buckets is no denial of this one.
                    seen.denied += 1;
                }
            }
        }
        run.calls
            .fetch_add(sent.len() as u64 + 1, Ordering::Relaxed);
        if run.wait_for_replica.load(Ordering::SeqCst) {
            // WAIT covers everything this connection wrote before it, including takes made
            // before the replica attached (the full sync carried those).
            tally.waits += 1;
            match redis::cmd("WAIT").arg(1).arg(1000).query::<i64>(&mut con) {
                Ok(replicas) if replicas >= 1 => {
                    run.acked_waits.fetch_add(1, Ordering::SeqCst);
                    witnesses_acked = witnesses;
                    for seen in &mut tally.per_key {
                        seen.acked += seen.pending;
                        seen.pending = 0;
                    }
                }
                Ok(_) => {}
                Err(_) if run.killing.load(Ordering::SeqCst) => break,
                Err(e) => {
                    run.error(format!("client {t}: WAIT: {e}"));
                    break;
                }
            }
        }
    }
    tally.witnesses.push((t, witnesses, witnesses_acked));
    tally
}

/// Polls `check` until it holds; panics with `what` after `HANG_GUARD`.
fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// One field of `INFO <section>`, or "" if it is missing.
fn field(con: &mut Connection, section: &str, name: &str) -> String {
    info_field(&info(con, section), name)
        .unwrap_or_default()
        .to_string()
}

fn number(con: &mut Connection, section: &str, name: &str) -> u64 {
    let text = info(con, section);
    info_field(&text, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO {section}:\n{text}"))
}

fn propagation(con: &mut Connection) -> String {
    field(con, "rl", "rl_propagation")
}

/// Waits until the module reports `mode` (the clients' next write probes an unknown state).
fn wait_for_propagation(con: &mut Connection, mode: &str) {
    wait_until(&format!("rl_propagation:{mode}"), || {
        propagation(con) == mode
    });
}

/// Whether a replica's link is up and it is not syncing.
fn synced(server: &Server) -> bool {
    let mut con = server.conn();
    let text = info(&mut con, "replication");
    text.contains("master_link_status:up") && text.contains("master_sync_in_progress:0")
}

/// Starts a replica of the server on `master_port` and waits for its first sync.
fn attach_replica(master_port: u16) -> Server {
    let port = master_port.to_string();
    let replica = Server::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &port,
        "--repl-backlog-size",
        BACKLOG,
    ]);
    wait_until(&format!("replica of {master_port} to sync"), || {
        synced(&replica)
    });
    replica
}

/// Waits until AOF is on, no rewrite is running or scheduled, and `aof_rewrites` passed
/// `before`.
fn wait_for_aof_rewrite(con: &mut Connection, before: u64) {
    wait_until("the AOF rewrite", || {
        let text = info(con, "persistence");
        let rewrites: u64 = info_field(&text, "aof_rewrites")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        text.contains("aof_enabled:1")
            && text.contains("aof_rewrite_in_progress:0")
            && text.contains("aof_rewrite_scheduled:0")
            && rewrites > before
    });
    assert_eq!(field(con, "persistence", "aof_last_bgrewrite_status"), "ok");
}

fn aof_on(con: &mut Connection) {
    let before = number(con, "persistence", "aof_rewrites");
    config_set(con, "appendonly", "yes");
    wait_for_aof_rewrite(con, before);
    wait_for_propagation(con, "replicate");
}

fn bgrewriteaof(con: &mut Connection) {
    let before = number(con, "persistence", "aof_rewrites");
    let _: String = redis::cmd("BGREWRITEAOF").query(con).expect("BGREWRITEAOF");
    wait_for_aof_rewrite(con, before);
}

fn bgsave(con: &mut Connection) {
    let before = number(con, "persistence", "rdb_saves");
    let _: String = redis::cmd("BGSAVE")
        .arg("SCHEDULE")
        .query(con)
        .expect("BGSAVE SCHEDULE");
    wait_until("BGSAVE", || {
        let text = info(con, "persistence");
        let saves: u64 = info_field(&text, "rdb_saves")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        text.contains("rdb_bgsave_in_progress:0") && saves > before
    });
    assert_eq!(field(con, "persistence", "rdb_last_bgsave_status"), "ok");
}

/// `CLIENT KILL TYPE <kind>` on `con`, then waits until `master` counted `replicas` more
/// partial resyncs and no full one, and every server in `linked` is synced again.
fn kill_links(
    con: &mut Connection,
    kind: &str,
    master: &mut Connection,
    replicas: u64,
    linked: &[&Server],
) {
    let partial = number(master, "stats", "sync_partial_ok");
    let full = number(master, "stats", "sync_full");
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg(kind)
        .query(con)
        .expect("CLIENT KILL TYPE");
    // At least: a migration tool's connection that just closed may still be listed.
    assert!(
        killed >= replicas,
        "CLIENT KILL TYPE {kind} killed {killed}"
    );
    wait_until("the partial resyncs", || {
        number(master, "stats", "sync_partial_ok") >= partial + replicas
            && linked.iter().all(|s| synced(s))
    });
    assert_eq!(
        number(master, "stats", "sync_full"),
        full,
        "a killed link resynced in full, not partially"
    );
}

/// Waits for a child process; kills it after `HANG_GUARD`.
fn wait_child(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + HANG_GUARD;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} did not finish");
}

/// `redis-cli --rdb <file>`: the master forks and streams a snapshot to a replication client,
/// as RedisShake and RIOT do to start a migration. Returns the file's size.
fn cli_rdb(port: u16, file: &Path) -> u64 {
    let mut child = Command::new(cli())
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--rdb"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redis-cli --rdb");
    let status = wait_child(&mut child, "redis-cli --rdb");
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    assert!(status.success(), "redis-cli --rdb: {status}: {stderr}");
    let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    assert!(size > 0, "redis-cli --rdb wrote nothing: {stderr}");
    size
}

/// `redis-cli --replica` for at least `seconds`, until it has logged `RL.SETSTATE` from the
/// stream: a replica that only reads the command stream, as a migration tool's sync phase
/// does. The stream must carry effects, never `RL.ACQUIRE`. Returns the commands seen.
fn cli_replica(port: u16, out: &Path, seconds: u64) -> usize {
    let file = std::fs::File::create(out).expect("create --replica output");
    let mut child = Command::new(cli())
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--replica"])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-cli --replica");
    let started = Instant::now();
    let deadline = started + HANG_GUARD;
    let mut text = String::new();
    while Instant::now() < deadline {
        text = std::fs::read_to_string(out).unwrap_or_default();
        if started.elapsed() >= Duration::from_secs(seconds) && text.contains("RL.SETSTATE") {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("redis-cli --replica exited: {status}; output:\n{text}");
        }
        sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let upper = text.to_ascii_uppercase();
    assert!(
        upper.contains("RL.SETSTATE"),
        "redis-cli --replica logged no RL.SETSTATE in {:?}; output:\n{}",
        started.elapsed(),
        &text[..text.len().min(2000)]
    );
    assert!(
        !upper.contains("RL.ACQUIRE"),
        "the replication stream carries RL.ACQUIRE verbatim"
    );
    upper.matches("RL.SETSTATE").count()
}

/// Every key with its `DUMP` payload and `PEXPIRETIME`.
type Snapshot = BTreeMap<Vec<u8>, (Option<Vec<u8>>, i64)>;

fn snapshot(con: &mut Connection) -> Snapshot {
    let keys = common::all_keys(con);
    let mut snap = Snapshot::new();
    // Pipelined: the witness keys run into the hundreds of thousands in long runs.
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("DUMP").arg(key).cmd("PEXPIRETIME").arg(key);
        }
        let replies: Vec<(Option<Vec<u8>>, i64)> = pipe.query(con).expect("DUMP, PEXPIRETIME");
        snap.extend(chunk.iter().cloned().zip(replies));
    }
    snap
}

/// Asserts that `con` holds exactly `want`; returns the number of keys compared.
fn assert_same(con: &mut Connection, want: &Snapshot, who: &str) -> usize {
    let got = snapshot(con);
    let got_keys: Vec<_> = got.keys().collect();
    let want_keys: Vec<_> = want.keys().collect();
    assert_eq!(got_keys.len(), want_keys.len(), "{who}: number of keys");
    assert_eq!(got_keys, want_keys, "{who}: other keys than the master");
    let differing: Vec<String> = want
        .iter()
        .filter(|(key, state)| got.get(*key) != Some(*state))
        .map(|(key, state)| {
            format!(
                "{}: master {:?}, {who} {:?}",
                String::from_utf8_lossy(key),
                state.1,
                got.get(key).map(|s| s.1)
            )
        })
        .collect();
    assert!(
        differing.is_empty(),
        "{who}: {} of {} buckets differ (DUMP or PEXPIRETIME), first: {:#?}",
        differing.len(),
        want.len(),
        &differing[..differing.len().min(10)]
    );
    want.len()
}

/// The server binary's file name, for the report.
fn server_name() -> String {
    let binary = common::server_binary();
    Path::new(&binary)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or(binary)
}

/// `valkey_version`, else `redis_version` (Valkey reports 7.2.4 there).
fn version(con: &mut Connection) -> String {
    let text = info(con, "server");
    info_field(&text, "valkey_version")
        .or_else(|| info_field(&text, "redis_version"))
        .unwrap_or_default()
        .to_string()
}

/// The server's `TIME` in microseconds.
fn server_time_us(con: &mut Connection) -> i128 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    i128::from(secs) * 1_000_000 + i128::from(micros)
}

/// Seeds each seeded bucket `SEED_AHEAD_MS` before full; returns the seeded `full_at` in ms.
fn seed(con: &mut Connection, run: &Run, start_us: i128) -> i64 {
    let full_at_ms = (start_us / 1000) as i64 + SEED_AHEAD_MS;
    for b in run.buckets.iter().filter(|b| b.class.seeded) {
        let _: String = redis::cmd("RL.SETSTATE")
            .arg(&b.key)
            .arg(full_at_ms * 1_000_000)
            .query(con)
            .expect("RL.SETSTATE");
    }
    full_at_ms
}

/// `CLIENTS` connections to `master`, each with a read timeout as a hang guard.
fn connections(master: &Server) -> Vec<Connection> {
    (0..CLIENTS)
        .map(|_| {
            let con = master.conn();
            con.set_read_timeout(Some(HANG_GUARD))
                .expect("set read timeout");
            con
        })
        .collect()
}

/// Runs a client on each connection while `conduct` runs on this thread; returns their
/// combined tally once `conduct` has returned and every client has stopped.
fn under_load(connections: Vec<Connection>, run: &Run, conduct: impl FnOnce()) -> Tally {
    std::thread::scope(|scope| {
        let threads: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(t, con)| scope.spawn(move || client(t, con, run)))
            .collect();
        {
            let _stop = StopOnDrop(&run.stop);
            conduct();
        }
        let mut total = Tally::default();
        for thread in threads {
            total.add(&thread.join().expect("client thread"));
        }
        total
    })
}

/// The transitions so far, with the run's clock, for the report.
struct Log {
    started: Instant,
    steps: Vec<String>,
}

impl Log {
    /// A transition done.
    fn step(&mut self, what: impl Into<String>) {
        let what = what.into();
        self.note(&what);
        self.steps.push(what);
    }

    /// A line of progress that is no transition.
    fn note(&self, what: &str) {
        eprintln!(
            "chaos: {:7.1} s  {what}",
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Waits until the clients have made `n` more calls.
fn wait_for_calls(run: &Run, n: u64) {
    let target = run.calls.load(Ordering::SeqCst) + n;
    wait_until("the clients' calls", || {
        run.calls.load(Ordering::SeqCst) >= target
    });
}

/// Empties every fresh bucket after the load: `RL.PEEK` for its whole tokens, then one
/// `RL.ACQUIRE` of that cost, which must be allowed. Each is then at least `capacity - 1`
/// tokens short of full, about 200 s away, so none expires while the servers are compared, on
/// a machine however slow. Returns the tokens taken per bucket.
fn drain_fresh(con: &mut Connection, run: &Run) -> Vec<u64> {
    let mut peek = redis::pipe();
    for b in &run.buckets {
        peek.cmd("RL.PEEK")
            .arg(&b.key)
            .arg(b.class.rate)
            .arg(&b.capacity);
    }
    let peeked: Vec<Vec<i64>> = peek.query(con).expect("RL.PEEK");
    run.buckets
        .iter()
        .zip(peeked)
        .map(|(b, reply)| {
            let tokens = reply.get(1).copied().unwrap_or(0);
            if b.class.seeded || tokens <= 0 {
                return 0;
            }
            let taken: Vec<i64> = redis::cmd("RL.ACQUIRE")
                .arg(&b.key)
                .arg(b.class.rate)
                .arg(&b.capacity)
                .arg(tokens)
                .query(con)
                .expect("RL.ACQUIRE");
            assert_eq!(
                taken.first(),
                Some(&1),
                "{}: RL.PEEK said {tokens} tokens, RL.ACQUIRE of them replied {taken:?}",
                b.key
            );
            tokens as u64
        })
        .collect()
}

/// The exact model's checks on the master at the end of the main test; returns a line of
/// figures for the report. `drained` holds the tokens `drain_fresh` took per bucket.
fn check_model(
    con: &mut Connection,
    run: &Run,
    total: &Tally,
    drained: &[u64],
    (first_us, last_us): (i128, i128),
    seeded_full_at_ms: i64,
) -> String {
    // The module's clock at the first call is at least `TIME` before it, floored to the ms.
    let first_ns = (first_us / 1000 * 1_000_000) as u128;
    let elapsed_us = (last_us - first_us / 1000 * 1000) as u128;
    let mut over = Vec::new();
    let mut lost = Vec::new();
    let (mut ran_dry, mut slack_tokens_max, mut lag_ms_max) = (0u64, 0u128, 0u128);
    for ((b, seen), &drain) in run.buckets.iter().zip(&total.per_key).zip(drained) {
        let class = b.class;
        let expire_ms = pexpiretime(con, b.key.as_bytes());
        assert!(expire_ms > 0, "{}: PEXPIRETIME {expire_ms}", b.key);
        let expire_ns = expire_ms as u128 * 1_000_000;
        if class.seeded {
            // 1 ms per token and never full: the expiry moved by exactly one ms per take.
            let takes = expire_ms - seeded_full_at_ms;
            assert_eq!(
                takes, seen.allowed as i64,
                "{}: the state holds {takes} takes, the clients were allowed {}",
                b.key, seen.allowed
            );
            assert_eq!(seen.denied, 0, "{}: denied with tokens to spare", b.key);
            continue;
        }
        // Allowed cost-1 calls, plus the drain's tokens: at most the capacity plus the refill
        // over the run (r × Δt, floored).
        let taken = u128::from(seen.allowed + drain);
        let refill = class.rate_num * elapsed_us / (class.rate_den * 1_000_000);
        let bound = class.capacity as u128 + refill;
        if taken > bound {
            over.push(format!(
                "{}: {} allowed calls and {drain} drained tokens > {bound}",
                b.key, seen.allowed
            ));
        }
        slack_tokens_max = slack_tokens_max.max(bound.saturating_sub(taken));
        if seen.denied > 0 {
            ran_dry += 1;
        }
        // Each token taken pushes `full_at` on by at least 1/r from no earlier than the first
        // call, so full_at >= first + taken / r: a take lost from the state would break it.
        let lhs = expire_ns * class.rate_num;
        let rhs = first_ns * class.rate_num + taken * class.ns_per_token_scaled();
        if lhs < rhs {
            lost.push(format!(
                "{}: expiry {expire_ms} ms is before the {taken} tokens taken end",
                b.key
            ));
        } else {
            lag_ms_max = lag_ms_max.max((lhs - rhs) / class.rate_num / 1_000_000);
        }
    }
    assert!(over.is_empty(), "more allowed than the model: {over:#?}");
    assert!(lost.is_empty(), "takes missing from the state: {lost:#?}");
    format!(
        "{ran_dry} of {} fresh buckets ran dry under load; model bound minus tokens taken at \
         most {slack_tokens_max}; expiry past first call + taken/r at most {lag_ms_max} ms",
        run.buckets.iter().filter(|b| !b.class.seeded).count()
    )
}

#[test]
#[ignore = "runs for CHAOS_S seconds (default 45): make chaos"]
fn state_survives_reconfiguration_under_full_load() {
    let seconds = chaos_seconds();
    let mut master = Server::start_with(&["--repl-backlog-size", BACKLOG]);
    let mut con = master.conn();
    // The load stops when the conductor is done; this bound holds even if it hangs.
    let run = Run::new(Instant::now() + Duration::from_secs(seconds + 1800));
    let start_us = server_time_us(&mut con);
    let seeded_full_at_ms = seed(&mut con, &run, start_us);
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut log = Log {
        started: Instant::now(),
        steps: Vec::new(),
    };
    let mut replicas: Vec<Server> = Vec::new();
    let mut rdb_check: Option<Snapshot> = None;
    let mut stream_commands = 0usize;
    let first_us = server_time_us(&mut con);

    let total = under_load(connections(&master), &run, || {
        let deadline = log.started + Duration::from_secs(seconds);
        wait_for_calls(&run, 10_000);
        let mode = propagation(&mut con);
        assert_eq!(mode, "skip", "no AOF, no save points, no replica: skip");
        log.note("under load, rl_propagation:skip");

        aof_on(&mut con);
        log.step("CONFIG SET appendonly yes (rl_propagation:replicate)");
        bgrewriteaof(&mut con);
        log.step("BGREWRITEAOF");
        bgsave(&mut con);
        log.step("BGSAVE");
        config_set(&mut con, "appendonly", "no");
        wait_for_propagation(&mut con, "skip");
        log.step("CONFIG SET appendonly no (rl_propagation:skip again)");

        // From skip mode, a diskless sync that waits before forking: writes made during the
        // delay must reach the replica through the snapshot or the stream.
        config_set(&mut con, "repl-diskless-sync", "yes");
        config_set(&mut con, "repl-diskless-sync-delay", "2");
        replicas.push(attach_replica(master.port));
        wait_for_propagation(&mut con, "replicate");
        log.step("replica 1 attached by diskless sync, delay 2 s");

        aof_on(&mut con);
        log.step("CONFIG SET appendonly yes again");

        config_set(&mut con, "repl-diskless-sync", "no");
        replicas.push(attach_replica(master.port));
        log.step("replica 2 attached by disk-based sync");

        let mut r1 = replicas[0].conn();
        kill_links(
            &mut master.conn(),
            "replica",
            &mut con,
            2,
            &[&replicas[0], &replicas[1]],
        );
        log.step("CLIENT KILL TYPE replica on the master: both partially resynced");
        kill_links(&mut r1, "master", &mut con, 1, &[&replicas[0]]);
        log.step("CLIENT KILL TYPE master on replica 1: partially resynced");

        config_set(&mut con, "repl-diskless-sync", "yes");
        config_set(&mut con, "repl-diskless-sync-delay", "1");
        let rdb = scratch.path().join("cli.rdb");
        let size = cli_rdb(master.port, &rdb);
        // What the snapshot holds, read back by a server of its own.
        let mut loaded = Server::start();
        loaded.shutdown("NOSAVE");
        std::fs::copy(&rdb, loaded.dir.path().join("dump.rdb")).expect("copy the RDB");
        loaded.restart_with(&[]);
        let mut lcon = loaded.conn();
        let snap = snapshot(&mut lcon);
        let types: Vec<String> = snap
            .keys()
            .map(|k| redis::cmd("TYPE").arg(k).query(&mut lcon).expect("TYPE"))
            .collect();
        let foreign: Vec<&String> = types
            .iter()
            .filter(|t| *t != "rl-bucket" && *t != "rl-htable")
            .collect();
        assert!(
            foreign.is_empty(),
            "the RDB holds keys other than buckets and tables: {foreign:?}"
        );
        // A bucket that filled up between calls (a slow machine) has expired, so count only.
        let in_rdb = snap.keys().filter(|k| k.starts_with(b"chaos:")).count();
        assert!(
            snap.keys()
                .all(|k| k.starts_with(b"chaos:") || k.starts_with(b"w:")),
            "the RDB holds keys the run never wrote"
        );
        let witnesses_in_rdb = snap.len() - in_rdb;
        rdb_check = Some(snap);
        drop(lcon);
        drop(loaded);
        log.step(format!(
            "redis-cli --rdb: {size} bytes, {in_rdb} buckets and {witnesses_in_rdb} witness keys \
             loaded back"
        ));

        stream_commands += cli_replica(master.port, &scratch.path().join("replica.out"), 2);
        log.step("redis-cli --replica: the stream carries RL.SETSTATE, never RL.ACQUIRE");

        replicas.push(attach_replica(replicas[0].port));
        log.step("replica 3 attached to replica 1 (chained)");

        // Then the repeatable transitions in turn until the time is up.
        let mut round = 0u64;
        while Instant::now() < deadline {
            round += 1;
            match round % 7 {
                1 => {
                    bgrewriteaof(&mut con);
                    log.step("BGREWRITEAOF");
                }
                2 => {
                    bgsave(&mut con);
                    log.step("BGSAVE");
                }
                3 => {
                    config_set(&mut con, "appendonly", "no");
                    aof_on(&mut con);
                    log.step("CONFIG SET appendonly no, then yes");
                }
                4 => {
                    kill_links(
                        &mut master.conn(),
                        "replica",
                        &mut con,
                        2,
                        &[&replicas[0], &replicas[1]],
                    );
                    log.step("CLIENT KILL TYPE replica on the master");
                }
                5 => {
                    let mut r3 = replicas[2].conn();
                    let mut r1 = replicas[0].conn();
                    kill_links(&mut r3, "master", &mut r1, 1, &[&replicas[2]]);
                    log.step("CLIENT KILL TYPE master on replica 3 (chained)");
                }
                6 => {
                    let size = cli_rdb(master.port, &scratch.path().join("again.rdb"));
                    log.step(format!("redis-cli --rdb: {size} bytes"));
                }
                _ => {
                    stream_commands +=
                        cli_replica(master.port, &scratch.path().join("again.out"), 1);
                    log.step("redis-cli --replica");
                }
            }
        }
        log.note("quiesce");
    });
    let drained = drain_fresh(&mut con, &run);
    let last_us = server_time_us(&mut con);
    let load_s = log.started.elapsed().as_secs_f64();
    run.assert_no_errors();
    master.assert_alive();

    // Quiesced: every replica, the chained one too, reaches the master's offset.
    let offset = number(&mut con, "replication", "master_repl_offset");
    for (i, replica) in replicas.iter().enumerate() {
        let mut rcon = replica.conn();
        wait_until(
            &format!("replica {} to reach offset {offset}", i + 1),
            || synced(replica) && number(&mut rcon, "replication", "master_repl_offset") >= offset,
        );
    }
    let want = snapshot(&mut con);
    let witnesses = total.witness_keys(false);
    let mut sorted: Vec<Vec<u8>> = run
        .buckets
        .iter()
        .map(|b| b.key.clone().into_bytes())
        .collect();
    sorted.extend(witnesses.iter().cloned());
    sorted.sort();
    // Tables are checked by the DUMP comparisons; this count is of buckets and witnesses.
    let held: Vec<Vec<u8>> = want
        .keys()
        .filter(|k| !k.starts_with(b"chaos:table:"))
        .cloned()
        .collect();
    assert_eq!(
        held.len(),
        sorted.len(),
        "keys on the master: the run's buckets and {} witness keys",
        witnesses.len()
    );
    assert!(
        held == sorted,
        "the master holds exactly the run's buckets and witness keys"
    );
    let mut compared = 0;
    for (i, replica) in replicas.iter().enumerate() {
        compared += assert_same(&mut replica.conn(), &want, &format!("replica {}", i + 1));
    }
    let figures = check_model(
        &mut con,
        &run,
        &total,
        &drained,
        (first_us, last_us),
        seeded_full_at_ms,
    );
    let rdb_snap = rdb_check.expect("the --rdb step ran");
    for (key, (_, expire_ms)) in &rdb_snap {
        let now = want.get(key).map(|s| s.1).unwrap_or(-2);
        assert!(
            *expire_ms <= now,
            "{}: the mid-run RDB is full later ({expire_ms}) than the final state ({now})",
            String::from_utf8_lossy(key)
        );
    }

    // The AOF: every write since it was last switched on, replayed by a restarted master.
    config_set(&mut con, "appendfsync", "always");
    let _: () = redis::cmd("SET")
        .arg("fsync-marker")
        .arg(1)
        .query(&mut con)
        .expect("SET");
    let _: i64 = redis::cmd("DEL")
        .arg("fsync-marker")
        .query(&mut con)
        .expect("DEL");
    drop(con);
    master.restart_with(&["--appendonly", "yes"]);
    compared += assert_same(
        &mut master.conn(),
        &want,
        "the master restarted from its AOF",
    );

    let allowed: u64 = total.per_key.iter().map(|s| s.allowed).sum();
    eprintln!(
        "chaos: {} on {}: load {load_s:.0} s, {} calls ({} RL.ACQUIRE, {} RL.ACQUIRE.MULTI of \
         which {} allowed), {allowed} bucket takes allowed, {} buckets; {} transitions; {compared} \
         bucket states compared (3 replicas and the AOF replay, DUMP and PEXPIRETIME), {} of them witness keys; \
         {stream_commands} RL.SETSTATE seen by redis-cli --replica; {figures}",
        server_name(),
        version(&mut master.conn()),
        total.calls(),
        total.acquire_calls,
        total.multi_calls,
        total.multi_allowed,
        run.buckets.len(),
        log.steps.len(),
        witnesses.len() * 4,
    );
}

#[test]
#[ignore = "runs for about CHAOS_S / 3 seconds (default 45): make chaos"]
fn acknowledged_admissions_survive_sigkill_failover_under_load() {
    let seconds = (chaos_seconds() / 3).clamp(10, 200);
    let mut master = Server::start();
    let mut con = master.conn();
    let run = Run::new(Instant::now() + Duration::from_secs(seconds + 900));
    let start_us = server_time_us(&mut con);
    let seeded_full_at_ms = seed(&mut con, &run, start_us);
    let first_us = server_time_us(&mut con);
    let mut replica: Option<Server> = None;
    let started = Instant::now();

    let total = under_load(connections(&master), &run, || {
        wait_for_calls(&run, 10_000);
        assert_eq!(propagation(&mut con), "skip");
        // From skip mode, a disk-based full sync under load; takes made before it count as
        // acknowledged by the first WAIT that sees the replica, so the snapshot must hold them.
        config_set(&mut con, "repl-diskless-sync", "no");
        replica = Some(attach_replica(master.port));
        run.wait_for_replica.store(true, Ordering::SeqCst);
        // Kill once the time is up and enough pipelines were acknowledged to prove something.
        let kill_at = started + Duration::from_secs(seconds);
        while Instant::now() < kill_at {
            sleep(Duration::from_millis(100));
        }
        wait_until("acknowledged pipelines", || {
            run.acked_waits.load(Ordering::SeqCst) >= 100
        });
        // Mid-pipeline: the clients are sending and waiting all the time.
        run.killing.store(true, Ordering::SeqCst);
        master.kill();
    });
    run.assert_no_errors();
    let replica = replica.expect("the replica attached");
    let mut rcon = replica.conn();
    let promoted: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut rcon)
        .expect("REPLICAOF NO ONE");
    assert_eq!(promoted, "OK");

    let first_ns = (first_us / 1000 * 1_000_000) as u128;
    let (mut acked_total, mut lost_window) = (0u64, 0u64);
    for (b, seen) in run.buckets.iter().zip(&total.per_key) {
        let class = b.class;
        // RL.PEEK reads the promoted bucket without writing; the expiry says when it is full.
        let peek: Vec<i64> = redis::cmd("RL.PEEK")
            .arg(&b.key)
            .arg(class.rate)
            .arg(&b.capacity)
            .query(&mut rcon)
            .expect("RL.PEEK");
        assert_eq!(peek.len(), 4, "RL.PEEK {}: {peek:?}", b.key);
        let expire_ms = pexpiretime(&mut rcon, b.key.as_bytes());
        acked_total += seen.acked;
        if class.seeded {
            assert!(
                expire_ms >= seeded_full_at_ms,
                "{}: the promoted replica lost the seeded state (PEXPIRETIME {expire_ms})",
                b.key
            );
            let takes = (expire_ms - seeded_full_at_ms) as u64;
            assert!(
                takes >= seen.acked,
                "{}: {} admissions acknowledged by WAIT, the promoted replica holds {takes}",
                b.key,
                seen.acked
            );
            assert!(
                takes <= seen.allowed + seen.unknown,
                "{}: the promoted replica holds {takes} takes, more than the master made ({seen:?})",
                b.key
            );
            lost_window += seen.allowed + seen.unknown - takes;
            continue;
        }
        if seen.acked == 0 {
            continue;
        }
        // As in the main test: full_at >= first call + acked / r if every acked take is there.
        // A missing key is a bucket that filled up, so its full_at is at most now.
        let full_at_ms = if expire_ms > 0 {
            expire_ms
        } else {
            (server_time_us(&mut rcon) / 1000) as i64
        };
        let lhs = full_at_ms as u128 * 1_000_000 * class.rate_num;
        let rhs = first_ns * class.rate_num + u128::from(seen.acked) * class.ns_per_token_scaled();
        assert!(
            lhs >= rhs,
            "{}: {} acknowledged takes, but the promoted replica is full at {expire_ms} ms \
             ({seen:?}, RL.PEEK {peek:?})",
            b.key,
            seen.acked
        );
    }
    assert!(
        acked_total > 0,
        "no admission was acknowledged by WAIT: the test proved nothing"
    );
    // Each witness key was written once: an acknowledged one must be on the promoted replica.
    let acked_witnesses = total.witness_keys(true);
    let mut missing = Vec::new();
    for chunk in acked_witnesses.chunks(1000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("EXISTS").arg(key);
        }
        let found: Vec<i64> = pipe.query(&mut rcon).expect("EXISTS");
        missing.extend(
            chunk
                .iter()
                .zip(found)
                .filter(|(_, n)| *n != 1)
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned()),
        );
    }
    assert!(
        missing.is_empty(),
        "{} of {} witness keys acknowledged by WAIT are missing on the promoted replica: {:?}",
        missing.len(),
        acked_witnesses.len(),
        &missing[..missing.len().min(10)]
    );
    // The promoted replica takes writes.
    let b = &run.buckets[0];
    let after: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg(&b.key)
        .arg(b.class.rate)
        .arg(&b.capacity)
        .query(&mut rcon)
        .expect("RL.ACQUIRE on the promoted replica");
    assert_eq!(after.len(), 4);
    replica.assert_alive();
    let allowed: u64 = total.per_key.iter().map(|s| s.allowed).sum();
    eprintln!(
        "failover: {}: {} calls, {} WAITs, {allowed} takes allowed, {acked_total} acknowledged \
         by WAIT 1 and all on the promoted replica, as are the {} acknowledged witness keys; \
         {lost_window} unacknowledged or unanswered takes of the seeded buckets not on it (the \
         asynchronous window)",
        server_name(),
        total.calls(),
        total.waits,
        acked_witnesses.len(),
    );
}
