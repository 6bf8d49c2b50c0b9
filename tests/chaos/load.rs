//! The load: `CLIENTS` threads pipelining `RL.ACQUIRE`, `RL.ACQUIRE.MULTI` and table calls on
//! the run's buckets, each ending its pipeline with new witness keys, and what each client saw
//! of every bucket. Knows nothing of the conductor's steps: the tests drive it through `Run`
//! and `under_load`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use redis::{Connection, Value};

use crate::common::Server;
use crate::servers::{wait_until, HANG_GUARD};

/// Client threads, one connection each.
pub(crate) const CLIENTS: usize = 8;
/// Commands per pipeline.
pub(crate) const PIPELINE: usize = 64;
/// Buckets per class.
pub(crate) const KEYS_PER_CLASS: usize = 60;
/// How far ahead of the run's start seeded buckets are full: 1,500 s of refill owed, so with
/// a capacity of 2,000,000 at 1000/s they hold 500,000 tokens and never fill up in a run.
pub(crate) const SEED_AHEAD_MS: i64 = 1_500_000;
/// Witness keys: each is written once, when created, by `RL.ACQUIRE w:… 0.000001 1`, and never
/// again. A bucket that is written all the time would hide a lost write, since the next
/// `RL.SETSTATE` carries its whole state; a witness whose one write was lost stays missing.
pub(crate) const WITNESS_RATE: &str = "0.000001";

/// Tables in the load: each pipeline starts with one call on one field of one of `TABLES`
/// tables (a take, a tenth of the time a refund, a tenth a reset with `RL.HDEL`), so tables
/// grow through several migrations under the load and join every DUMP comparison. A token
/// takes 1000 s to come back, so no table bucket fills up (nothing is swept) during a run.
pub(crate) const TABLES: usize = 4;
pub(crate) const TABLE_FIELDS: usize = 3000;
pub(crate) const TABLE_RATE: &str = "0.001";
pub(crate) const TABLE_CAPACITY: &str = "5";

/// A family of buckets sharing one limit.
pub(crate) struct Class {
    /// `rate` as sent.
    pub(crate) rate: &'static str,
    /// `rate` as the exact fraction `rate_num / rate_den` tokens per second.
    pub(crate) rate_num: u128,
    pub(crate) rate_den: u128,
    pub(crate) capacity: i64,
    /// Seeded with `RL.SETSTATE` before the run (else the bucket starts missing, i.e. full).
    pub(crate) seeded: bool,
}

impl Class {
    /// Nanoseconds per token, times `rate_num` (kept integral: `1e9 * rate_den`).
    pub(crate) fn ns_per_token_scaled(&self) -> u128 {
        1_000_000_000 * self.rate_den
    }
}

/// Rates whose nanoseconds per token are not whole (3/s, 7/s, 0.3/s) and two that are (8/s,
/// 1000/s). Each fresh class takes 200 s to refill from empty; the seeded one 2,000 s.
pub(crate) const CLASSES: &[Class] = &[
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
pub(crate) struct Bucket {
    pub(crate) key: String,
    pub(crate) class: &'static Class,
    pub(crate) capacity: String,
}

pub(crate) fn buckets() -> Vec<Bucket> {
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
pub(crate) fn chaos_seconds() -> u64 {
    std::env::var("CHAOS_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45)
}

/// xorshift64*: a reproducible key mix per client without a dependency.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// What the clients saw of one bucket.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct Seen {
    pub(crate) calls: u64,
    pub(crate) allowed: u64,
    /// Refused by this bucket itself (not a MULTI that another bucket refused).
    pub(crate) denied: u64,
    /// Allowed, and a later `WAIT 1` on the same connection counted the replica (failover).
    pub(crate) acked: u64,
    /// Allowed, not yet covered by a `WAIT` (failover).
    pub(crate) pending: u64,
    /// Sent in a pipeline that got no reply: applied or not, nobody knows (failover).
    pub(crate) unknown: u64,
}

/// What one client saw.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) per_key: Vec<Seen>,
    pub(crate) acquire_calls: u64,
    pub(crate) multi_calls: u64,
    pub(crate) multi_allowed: u64,
    pub(crate) waits: u64,
    /// Per client: (client, witness keys created, of those covered by a `WAIT` that counted
    /// the replica).
    pub(crate) witnesses: Vec<(usize, u64, u64)>,
}

impl Tally {
    pub(crate) fn add(&mut self, other: &Tally) {
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
    pub(crate) fn witness_keys(&self, acked_only: bool) -> Vec<Vec<u8>> {
        self.witnesses
            .iter()
            .flat_map(|&(t, created, acked)| {
                (0..if acked_only { acked } else { created }).map(move |i| witness_key(t, i))
            })
            .collect()
    }

    pub(crate) fn calls(&self) -> u64 {
        self.acquire_calls + self.multi_calls
    }
}

/// What the clients and the conductor share.
pub(crate) struct Run {
    pub(crate) buckets: Vec<Bucket>,
    /// Ends the load (the conductor sets it; each client also stops at `hard_stop`).
    pub(crate) stop: AtomicBool,
    /// A bound on the load however the conductor fares.
    pub(crate) hard_stop: Instant,
    /// Calls answered so far, over all clients.
    pub(crate) calls: AtomicU64,
    /// Failover: clients follow each pipeline with `WAIT 1` once this is set.
    pub(crate) wait_for_replica: AtomicBool,
    /// Failover: `WAIT`s that counted the replica, over all clients.
    pub(crate) acked_waits: AtomicU64,
    /// Failover: set just before the SIGKILL; from then on a broken connection is expected.
    pub(crate) killing: AtomicBool,
    /// Unexpected replies and failures, with the first few texts.
    pub(crate) errors: AtomicU64,
    pub(crate) error_texts: Mutex<Vec<String>>,
}

impl Run {
    pub(crate) fn new(hard_stop: Instant) -> Run {
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

    pub(crate) fn error(&self, text: String) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        let mut texts = self.error_texts.lock().unwrap_or_else(|e| e.into_inner());
        if texts.len() < 10 {
            texts.push(text);
        }
    }

    pub(crate) fn running(&self) -> bool {
        !self.stop.load(Ordering::SeqCst) && Instant::now() < self.hard_stop
    }

    pub(crate) fn assert_no_errors(&self) {
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
pub(crate) struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The first integer of an array reply (the `allowed` flag of both commands).
pub(crate) fn allowed_flag(reply: &Value) -> Option<i64> {
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

/// The `allowed` flag of bucket `i`'s own answer in an `RL.ACQUIRE.MULTI` reply.
pub(crate) fn own_answer(reply: &Value, i: usize) -> Option<i64> {
    match reply {
        Value::Array(items) => match items.get(3) {
            Some(Value::Array(per_bucket)) => allowed_flag(per_bucket.get(i)?),
            _ => None,
        },
        _ => None,
    }
}

/// Client `t`'s `i`-th witness key.
pub(crate) fn witness_key(t: usize, i: u64) -> Vec<u8> {
    format!("w:{t}:{i}").into_bytes()
}

/// One client: pipelines of `PIPELINE` calls, a quarter of them `RL.ACQUIRE.MULTI` over two
/// or three distinct buckets, the rest `RL.ACQUIRE`, all cost 1, on random buckets, until the
/// run stops; each pipeline ends with the creation of one or two witness keys. Counts each
/// bucket's allowed and denied calls. In the failover test, once told to, it follows each
/// pipeline with `WAIT 1 1000`, and stops at the first broken call.
pub(crate) fn client(t: usize, mut con: Connection, run: &Run) -> Tally {
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

/// Seeds each seeded bucket `SEED_AHEAD_MS` before full; returns the seeded `full_at` in ms.
pub(crate) fn seed(con: &mut Connection, run: &Run, start_us: i128) -> i64 {
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
pub(crate) fn connections(master: &Server) -> Vec<Connection> {
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
pub(crate) fn under_load(connections: Vec<Connection>, run: &Run, conduct: impl FnOnce()) -> Tally {
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

/// Waits until the clients have made `n` more calls.
pub(crate) fn wait_for_calls(run: &Run, n: u64) {
    let target = run.calls.load(Ordering::SeqCst) + n;
    wait_until("the clients' calls", || {
        run.calls.load(Ordering::SeqCst) >= target
    });
}
