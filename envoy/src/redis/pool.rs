//! The connection the single-server limiter sends on: up to `REDIS_POOL_SIZE` multiplexed
//! `ConnectionManager`s (each pipelines every call in flight and reconnects by itself),
//! filled one at a time. Generic over the connection, so it knows nothing of the setups.
//!
//! Why fill rather than take turns: a multiplexed connection writes every command queued
//! since its last write in one syscall, and Redis answers all it read in one. Spreading 16
//! calls in flight over 10 connections in turn sent each on its own, so every call paid its
//! own write, read and wake-up on both sides (a smoke run of `make bench-envoy` at 16
//! streams: 8,361 decisions/s on 10 connections in turn, 16,349 on one). The next
//! connection takes calls only while the earlier ones each have `SPILL_AT` in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Calls in flight on one connection before the next connection takes new calls. One
/// RL.ACQUIRE.MULTI is about 100 bytes, so this many still fit in one of Redis's 16 KiB reads.
pub const SPILL_AT: usize = 64;

struct Slot<C> {
    connection: C,
    in_flight: AtomicUsize,
}

/// A handle on a set of multiplexed connections. The limiter clones its connection once per
/// call; each clone sends on the first connection with fewer than [`SPILL_AT`] calls in
/// flight, or else on the least busy one.
pub struct Pool<C> {
    index: usize,
    connection: C,
    slots: Arc<Vec<Slot<C>>>,
}

impl<C: Clone> Pool<C> {
    /// A pool of `connections` (at least one).
    pub fn new(connections: Vec<C>) -> Option<Pool<C>> {
        let connection = connections.first()?.clone();
        let slots = connections
            .into_iter()
            .map(|connection| Slot {
                connection,
                in_flight: AtomicUsize::new(0),
            })
            .collect();
        Some(Pool {
            index: 0,
            connection,
            slots: Arc::new(slots),
        })
    }
}

/// The connection a new call goes to, given each connection's calls in flight: the first
/// below [`SPILL_AT`], or else the least busy.
fn pick<I: Iterator<Item = usize> + Clone>(loads: I) -> usize {
    loads
        .clone()
        .position(|n| n < SPILL_AT)
        .or_else(|| loads.enumerate().min_by_key(|&(_, n)| n).map(|(i, _)| i))
        .unwrap_or(0)
}

impl<C: Clone> Clone for Pool<C> {
    fn clone(&self) -> Self {
        let index = pick(
            self.slots
                .iter()
                .map(|s| s.in_flight.load(Ordering::Relaxed)),
        );
        let connection = self
            .slots
            .get(index)
            .map_or_else(|| self.connection.clone(), |s| s.connection.clone());
        Pool {
            index,
            connection,
            slots: self.slots.clone(),
        }
    }
}

/// Counts a call in flight on a connection until it is answered or dropped (a timeout drops
/// the call's future, and the count must still come down).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Pool<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let counter = self.slots.get(self.index).map(|s| &s.in_flight);
        let connection = &mut self.connection;
        Box::pin(async move {
            let _busy = counter.map(InFlight::enter);
            connection.req_packed_command(cmd).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let counter = self.slots.get(self.index).map(|s| &s.in_flight);
        let connection = &mut self.connection;
        Box::pin(async move {
            let _busy = counter.map(InFlight::enter);
            connection
                .req_packed_commands(pipeline, offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.connection.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::{pick, SPILL_AT};

    #[test]
    fn calls_fill_one_connection_before_the_next() {
        // Idle: everything goes to the first, so concurrent calls share its writes.
        assert_eq!(pick([0, 0, 0].into_iter()), 0);
        assert_eq!(pick([SPILL_AT - 1, 0].into_iter()), 0);
        // The first is full: the next one takes calls.
        assert_eq!(pick([SPILL_AT, 0, 0].into_iter()), 1);
        assert_eq!(pick([SPILL_AT, SPILL_AT + 3, 5].into_iter()), 2);
        // All full: the least busy.
        assert_eq!(
            pick([SPILL_AT + 9, SPILL_AT + 2, SPILL_AT + 4].into_iter()),
            1
        );
    }
}
