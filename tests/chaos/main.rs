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
//!
//! # Layout
//!
//! - `load.rs`: the load: the bucket classes, the clients and their pipelines, what they saw.
//! - `servers.rs`: what the conductor does to the servers (AOF, snapshots, replicas, killed
//!   links, `redis-cli --rdb` and `--replica`) and the waits that follow each step.
//! - `check.rs`: the end-of-run checks: `DUMP`/`PEXPIRETIME` snapshots compared across
//!   servers, and the exact model's bounds on what the master allowed.
//! - `reconfiguration.rs`: the main test, every reconfiguration in turn under full load.
//! - `failover.rs`: the failover test, a SIGKILLed master and its promoted replica.

#![cfg(test)]

mod check;
#[path = "../common/mod.rs"]
mod common;
mod failover;
mod load;
mod reconfiguration;
mod servers;
