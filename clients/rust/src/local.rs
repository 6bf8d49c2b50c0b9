//! In-process state with a size bound: the `Local` policy's buckets ([`LocalBuckets`], the
//! module's own pure bucket from `rl_bucket`) and the deny cache ([`DenyCache`]).
//!
//! Both sit on [`Bounded`], a map that forgets its oldest entry once it holds `max` of them.
//! Nothing here reads a clock or does I/O; the caller passes the time in and holds the lock.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use rl_bucket::{Change, Cost, State};

use crate::types::{number, Decision, Limit, CLOSED_RETRY_AFTER_MS};

/// A cost as the module reads the text sent for it: the exact decimal, not the double.
fn cost_of(cost: f64) -> Option<Cost> {
    Cost::parse(number(cost).as_bytes())
}

/// A map of at most `max` entries: inserting a new key past the bound drops the oldest
/// inserted one. O(1) amortised per operation.
#[derive(Debug)]
pub(crate) struct Bounded<V> {
    max: usize,
    /// Each value carries the generation it was inserted under, so a key deleted and inserted
    /// again is not dropped for its older place in `order`.
    map: HashMap<String, (V, u64)>,
    order: VecDeque<(String, u64)>,
    next_generation: u64,
}

impl<V> Bounded<V> {
    pub(crate) fn new(max: usize) -> Self {
        Bounded {
            max,
            map: HashMap::new(),
            order: VecDeque::new(),
            next_generation: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        self.map.get(key).map(|(v, _)| v)
    }

    pub(crate) fn remove(&mut self, key: &str) {
        self.map.remove(key);
        self.compact();
    }

    pub(crate) fn insert(&mut self, key: &str, value: V) {
        if let Some(slot) = self.map.get_mut(key) {
            slot.0 = value;
            return;
        }
        if self.max == 0 {
            return;
        }
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        self.map.insert(key.to_owned(), (value, generation));
        self.order.push_back((key.to_owned(), generation));
        while self.map.len() > self.max {
            let Some((old, old_generation)) = self.order.pop_front() else {
                break;
            };
            if self
                .map
                .get(&old)
                .is_some_and(|(_, g)| *g == old_generation)
            {
                self.map.remove(&old);
            }
        }
        self.compact();
    }

    /// Deleted keys leave stale places in `order`; drop them before they outnumber the live.
    fn compact(&mut self) {
        if self.order.len() > self.map.len().saturating_mul(2).max(64) {
            let map = &self.map;
            self.order
                .retain(|(key, g)| map.get(key).is_some_and(|(_, live)| live == g));
        }
    }
}

/// One reply of the module's shape: RL.ACQUIRE's four integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) retry_after_ms: i64,
    pub(crate) reset_after_ms: i64,
}

impl From<rl_bucket::Decision> for Reply {
    fn from(d: rl_bucket::Decision) -> Self {
        Reply {
            allowed: d.allowed(),
            remaining: d.remaining,
            retry_after_ms: d.retry_after_ms(),
            reset_after_ms: d.reset_after_ms(),
        }
    }
}

/// A share that the module's ranges do not allow (a rate below 1e-6 once divided): decided as
/// `Closed` would, since no exact bucket exists for it.
const NO_SHARE: Reply = Reply {
    allowed: false,
    remaining: 0,
    retry_after_ms: CLOSED_RETRY_AFTER_MS,
    reset_after_ms: 0,
};

/// Buckets of `rate / instances` and `capacity / instances` per key, decided by `rl_bucket`,
/// the module's own code. At most `max_keys` are kept; forgetting one makes it full again, so
/// the bound trades strictness for memory only once more keys than that are limited within
/// one refill time.
#[derive(Debug)]
pub(crate) struct LocalBuckets {
    instances: u32,
    states: Bounded<State>,
}

impl LocalBuckets {
    pub(crate) fn new(instances: u32, max_keys: usize) -> Self {
        LocalBuckets {
            instances: instances.max(1),
            states: Bounded::new(max_keys.max(1)),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.states.len()
    }

    /// This instance's share of `limit`. With one instance it is the limit itself, exactly;
    /// with more, the rate is shared exactly and the capacity within half an ulp
    /// ([`Limit::share`]).
    fn share(&self, limit: &Limit) -> Option<rl_bucket::Limit> {
        if self.instances == 1 {
            return Some(*limit.bucket());
        }
        limit.share(self.instances)
    }

    /// Drops the bucket of `key`: it is full again.
    pub(crate) fn forget(&mut self, key: &str) {
        self.states.remove(key);
    }

    pub(crate) fn acquire(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: f64,
        now_us: u64,
        take: bool,
    ) -> Reply {
        let (Some(share), Some(cost)) = (self.share(limit), cost_of(cost)) else {
            return NO_SHARE;
        };
        let state = self.states.get(key).copied();
        if !take {
            return rl_bucket::peek(&share, state, now_us, cost).into();
        }
        let (decision, new_state) = rl_bucket::acquire(&share, state, now_us, cost);
        if let Some(new_state) = new_state {
            self.states.insert(key, new_state);
        }
        decision.into()
    }

    /// All or nothing over `(key, limit, cost)`: RL.ACQUIRE.MULTI's reply (allowed, first
    /// refusing index, longest wait or -1, per-item replies). A key named twice sees its own
    /// earlier take, as in the module.
    pub(crate) fn acquire_all(
        &mut self,
        items: &[(&str, Limit, f64)],
        now_us: u64,
    ) -> (bool, Option<usize>, i64, Vec<Reply>) {
        let mut pending: Vec<(&str, Option<State>)> = Vec::with_capacity(items.len());
        let mut replies = Vec::with_capacity(items.len());
        for (key, limit, cost) in items {
            let (Some(share), Some(cost)) = (self.share(limit), cost_of(*cost)) else {
                replies.push(NO_SHARE);
                continue;
            };
            let index = match pending.iter().position(|(k, _)| k == key) {
                Some(index) => index,
                None => {
                    pending.push((key, self.states.get(key).copied()));
                    pending.len() - 1
                }
            };
            let Some(slot) = pending.get_mut(index) else {
                continue;
            };
            let (decision, new_state) = rl_bucket::acquire(&share, slot.1, now_us, cost);
            if new_state.is_some() {
                slot.1 = new_state;
            }
            replies.push(decision.into());
        }
        let refused: Vec<usize> = (0..replies.len())
            .filter(|&i| replies.get(i).is_some_and(|r| !r.allowed))
            .collect();
        if let Some(&first) = refused.first() {
            let waits = refused
                .iter()
                .filter_map(|&i| replies.get(i).map(|r| r.retry_after_ms));
            let mut retry = 0;
            for wait in waits {
                if wait < 0 || retry < 0 {
                    retry = -1;
                } else {
                    retry = retry.max(wait);
                }
            }
            return (false, Some(first), retry, replies);
        }
        for (key, state) in pending {
            if let Some(state) = state {
                self.states.insert(key, state);
            }
        }
        (true, None, 0, replies)
    }

    /// Charges `cost` tokens whatever the bucket holds (`rl_bucket::charge`); returns
    /// `(balance, retry_after_ms, reset_after_ms)`, or `None` past the module's bound
    /// (nothing written). A share the module's ranges do not allow charges nothing.
    pub(crate) fn charge(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: f64,
        now_us: u64,
    ) -> Option<(i64, i64, i64)> {
        let (Some(share), Some(cost)) = (self.share(limit), cost_of(cost)) else {
            return Some((0, 0, 0));
        };
        let state = self.states.get(key).copied();
        let (charged, new_state) = rl_bucket::charge(&share, state, now_us, cost).ok()?;
        if let Some(new_state) = new_state {
            self.states.insert(key, new_state);
        }
        Some((
            charged.balance,
            charged.retry_after_ms(),
            charged.reset_after_ms(),
        ))
    }

    /// Gives `cost` tokens back; returns `(remaining, reset_after_ms)`.
    pub(crate) fn refund(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: f64,
        now_us: u64,
    ) -> (u64, i64) {
        let (Some(share), Some(cost)) = (self.share(limit), cost_of(cost)) else {
            return (0, 0);
        };
        let state = self.states.get(key).copied();
        let (decision, change) = rl_bucket::refund(&share, state, now_us, cost);
        match change {
            Change::Keep => {}
            Change::Set(state) => self.states.insert(key, state),
            Change::Delete => self.states.remove(key),
        }
        (decision.remaining, decision.reset_after_ms())
    }
}

/// One remembered denial.
#[derive(Clone, Copy, Debug)]
struct Denial {
    limit: Limit,
    cost: f64,
    until: Instant,
    remaining: u64,
    reset_until: Instant,
}

/// The hot-key shield: after Redis denies `(key, cost)` with `retry_after_ms = R`, `key` is
/// denied here until R has passed, for any cost at least as large and the same limit.
/// Nothing extra gets through, since tokens only reappear by refill (R already counts it) or
/// by a refund (which clears the entry).
#[derive(Debug)]
pub(crate) struct DenyCache {
    entries: Bounded<Denial>,
}

/// A denial from the cache: `(remaining, retry_after_ms, reset_after_ms)`.
pub(crate) type CachedDenial = (u64, i64, i64);

impl DenyCache {
    pub(crate) fn new(max_entries: usize) -> Self {
        DenyCache {
            entries: Bounded::new(max_entries),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.entries.max > 0
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn lookup(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: f64,
        now: Instant,
    ) -> Option<CachedDenial> {
        let entry = *self.entries.get(key)?;
        if now >= entry.until {
            self.entries.remove(key);
            return None;
        }
        if entry.limit != *limit || cost < entry.cost {
            return None;
        }
        let retry = ceil_ms(entry.until - now);
        let reset = ceil_ms(entry.reset_until.saturating_duration_since(now));
        Some((entry.remaining, retry, reset))
    }

    /// Remembers a denial Redis answered to a request sent at `sent_at`: the server decided
    /// after that, so counting R from `sent_at` ends the entry no later than the real wait.
    pub(crate) fn remember(&mut self, key: &str, cost: f64, denied: &Decision, sent_at: Instant) {
        let (retry_after_ms, reset_after_ms) = (denied.retry_after_ms, denied.reset_after_ms);
        if denied.allowed || retry_after_ms <= 0 {
            return; // allowed, or impossible (-1): nothing a wait would change
        }
        let after = |ms: i64| sent_at + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        self.entries.insert(
            key,
            Denial {
                limit: denied.limit,
                cost,
                until: after(retry_after_ms),
                remaining: denied.remaining,
                reset_until: after(reset_after_ms),
            },
        );
    }

    pub(crate) fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }
}

fn ceil_ms(d: Duration) -> i64 {
    let us = d.as_micros();
    i64::try_from(us.div_ceil(1000)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_drops_the_oldest_and_survives_reinsertion() {
        let mut b = Bounded::new(2);
        b.insert("a", 1);
        b.insert("b", 2);
        b.remove("a");
        b.insert("a", 3); // newer than b now
        b.insert("c", 4);
        assert_eq!(b.len(), 2);
        assert_eq!(b.get("b"), None);
        assert_eq!(b.get("a"), Some(&3));
        assert_eq!(b.get("c"), Some(&4));
        for i in 0..10_000 {
            b.insert(&format!("k{i}"), i);
            b.remove(&format!("k{i}"));
        }
        assert!(b.order.len() <= 64 + 2, "stale places are compacted");
    }

    #[test]
    fn local_buckets_are_bounded_and_share_the_limit() {
        let limit = Limit::new(0.001, 4.0).unwrap();
        let mut local = LocalBuckets::new(2, 3);
        let now_us = 1_000_000;
        // Two instances: a share of 2 tokens each.
        assert!(local.acquire("k", &limit, 1.0, now_us, true).allowed);
        assert!(local.acquire("k", &limit, 1.0, now_us, true).allowed);
        let denied = local.acquire("k", &limit, 1.0, now_us, true);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 2_000_000); // one token at 0.0005/s
        for i in 0..10 {
            local.acquire(&format!("other{i}"), &limit, 1.0, now_us, true);
        }
        assert_eq!(local.len(), 3);
    }

    /// 7/s and 21 over 3 instances: a share of 7 tokens per 3 s (T = 3e9/7 ns, built with
    /// `per_period`, so not 7/3 rounded to a double) and a burst of 7.
    #[test]
    fn an_integer_rate_is_shared_exactly() {
        let limit = Limit::new(7.0, 21.0).unwrap();
        let mut local = LocalBuckets::new(3, 10);
        let now_us = 1_000_000;
        for _ in 0..7 {
            assert!(local.acquire("k", &limit, 1.0, now_us, true).allowed);
        }
        assert!(!local.acquire("k", &limit, 1.0, now_us, true).allowed);
        // After 3 s, 7 tokens are back, and one more takes 3/7 s.
        let later = now_us + 3_000_000;
        assert_eq!(local.acquire("k", &limit, 7.0, later, false).remaining, 7);
        assert!(local.acquire("k", &limit, 7.0, later, true).allowed);
        let denied = local.acquire("k", &limit, 1.0, later, true);
        assert_eq!((denied.allowed, denied.retry_after_ms), (false, 429));
    }

    #[test]
    fn deny_cache_answers_larger_costs_until_the_wait_passed() {
        let limit = Limit::new(1.0, 1.0).unwrap();
        let mut cache = DenyCache::new(1);
        let t0 = Instant::now();
        let denied = |limit: Limit| Decision {
            allowed: false,
            remaining: 0,
            retry_after_ms: 500,
            reset_after_ms: 900,
            limit,
            source: crate::Source::Redis,
        };
        cache.remember("k", 2.0, &denied(limit), t0);
        assert_eq!(
            cache.lookup("k", &limit, 1.0, t0),
            None,
            "smaller cost asks Redis"
        );
        assert_eq!(cache.lookup("k", &limit, 3.0, t0), Some((0, 500, 900)));
        let other = Limit::new(2.0, 1.0).unwrap();
        assert_eq!(
            cache.lookup("k", &other, 3.0, t0),
            None,
            "another limit asks Redis"
        );
        assert_eq!(
            cache.lookup("k", &limit, 2.0, t0 + Duration::from_millis(500)),
            None
        );
        assert_eq!(cache.len(), 0, "an expired entry is dropped");
        cache.remember("a", 1.0, &denied(limit), t0);
        cache.remember("b", 1.0, &denied(limit), t0);
        assert_eq!(cache.len(), 1, "size bound");
        cache.forget("b");
        assert_eq!(cache.lookup("b", &limit, 1.0, t0), None);
    }

    /// The `Local` policy's buckets (one instance: the limit itself) reproduce every step of
    /// the shared vectors, clients/vectors/bucket.json, as the Python and Node libraries do:
    /// the state they keep and delete between calls is the module's.
    #[test]
    fn local_buckets_agree_with_the_shared_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/bucket.json");
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let number = |v: &serde_json::Value| v.as_str().unwrap().parse::<f64>().unwrap();
        let mut steps = 0;
        for case in doc["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let capacity = number(&case["capacity"]);
            // As a caller writes it: a decimal rate, or N/S with Limit::per.
            let limit = match case["rate"].as_str().unwrap().split_once('/') {
                Some((tokens, seconds)) => {
                    let tokens: f64 = tokens.parse().unwrap();
                    let seconds: f64 = seconds.parse().unwrap();
                    if tokens.fract() == 0.0 {
                        Limit::per(tokens as u64, Duration::from_secs_f64(seconds))
                            .and_then(|l| l.with_capacity(capacity))
                    } else {
                        // Limit::per counts whole tokens: 2.5/0.5 is the decimal 5 per second.
                        Limit::new(tokens / seconds, capacity)
                    }
                }
                None => Limit::new(number(&case["rate"]), capacity),
            }
            .unwrap();
            let mut local = LocalBuckets::new(1, 10);
            for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
                let now_us = step["now_us"].as_u64().unwrap();
                let cost = number(&step["cost"]);
                let mut expect: Vec<i64> = step["expect"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect();
                if step["op"] == "peek" {
                    // RL.PEEK reports the signed balance (negative in debt, as after a clock
                    // stepped back); this library's reply keeps `remaining` unsigned, so 0.
                    if let Some(balance) = expect.get_mut(1) {
                        *balance = (*balance).max(0);
                    }
                }
                let got = match step["op"].as_str().unwrap() {
                    // A refused charge is an empty reply in the vectors.
                    "charge" => match local.charge("k", &limit, cost, now_us) {
                        Some((balance, retry, reset)) => vec![1, balance, retry, reset],
                        None => Vec::new(),
                    },
                    "refund" => {
                        let (remaining, reset) = local.refund("k", &limit, cost, now_us);
                        vec![remaining as i64, reset]
                    }
                    op => {
                        let r = local.acquire("k", &limit, cost, now_us, op == "acquire");
                        vec![
                            i64::from(r.allowed),
                            r.remaining as i64,
                            r.retry_after_ms,
                            r.reset_after_ms,
                        ]
                    }
                };
                assert_eq!(got, expect, "{name}, step {i}");
                steps += 1;
            }
        }
        assert!(steps >= 100, "only {steps} steps");
    }
}
