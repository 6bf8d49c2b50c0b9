//! The end-of-run checks: every key's `DUMP` and `PEXPIRETIME` compared between servers, the
//! fresh buckets emptied so none expires while they are compared, and the exact model's
//! bounds on what the master allowed and what its buckets' expiries must cover.

use std::collections::BTreeMap;

use redis::Connection;

use crate::common;
use crate::common::pexpiretime;
use crate::load::{Run, Tally};

/// Every key with its `DUMP` payload and `PEXPIRETIME`.
pub(crate) type Snapshot = BTreeMap<Vec<u8>, (Option<Vec<u8>>, i64)>;

pub(crate) fn snapshot(con: &mut Connection) -> Snapshot {
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
pub(crate) fn assert_same(con: &mut Connection, want: &Snapshot, who: &str) -> usize {
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

/// Empties every fresh bucket after the load: `RL.PEEK` for its whole tokens, then one
/// `RL.ACQUIRE` of that cost, which must be allowed. Each is then at least `capacity - 1`
/// tokens short of full, about 200 s away, so none expires while the servers are compared, on
/// a machine however slow. Returns the tokens taken per bucket.
pub(crate) fn drain_fresh(con: &mut Connection, run: &Run) -> Vec<u64> {
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
pub(crate) fn check_model(
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
