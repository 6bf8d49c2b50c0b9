//! Counters for `INFO rl`: calls, allowed, denied and errors, since the module loaded.
//!
//! Commands run on the server's main thread only, so a relaxed load and store is an exact
//! increment and costs no locked instruction on the hot path.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter.
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }

    /// Adds one.
    pub fn bump(&self) {
        self.add(1);
    }

    /// Raises the counter to `value` if higher (a high-water mark).
    pub fn raise(&self, value: u64) {
        if value > self.get() {
            self.0.store(value, Ordering::Relaxed);
        }
    }

    /// Adds `n`. Only the main thread writes, so load-then-store cannot lose an update.
    pub fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Rate-limit calls answered (RL.ACQUIRE, RL.ACQUIRE.MULTI, RL.THROTTLE, RL.PEEK, RL.REFUND).
pub static CALLS: Counter = Counter::new();
/// Calls that took their tokens.
pub static ALLOWED: Counter = Counter::new();
/// Calls that were refused (including those that can never succeed).
pub static DENIED: Counter = Counter::new();
/// Calls answered with an error.
pub static ERRORS: Counter = Counter::new();
/// Background sweep ticks that held back because the server refused writes (a replica,
/// loading, paused writes, `min-replicas-to-write` not met).
pub static SWEEP_HELD: Counter = Counter::new();
/// Background sweep passes ended: each visited every registered table whole.
pub static SWEEP_PASSES: Counter = Counter::new();
/// Background sweep ticks that did work (on a master).
pub static SWEEP_TICKS: Counter = Counter::new();
/// Table buckets the background sweep removed.
pub static SWEPT: Counter = Counter::new();
/// The longest background sweep tick, in µs of server time (the lesser of the main
/// thread's CPU time and the monotonic clock over the tick).
pub static SWEEP_TICK_MAX_US: Counter = Counter::new();
/// The most main-thread CPU time one background sweep tick took, in µs (on a virtual
/// machine this includes steal time the hypervisor charges late).
pub static SWEEP_TICK_MAX_CPU_US: Counter = Counter::new();
/// The most monotonic-clock time one background sweep tick took, in µs (includes any time
/// the main thread lost the CPU).
pub static SWEEP_TICK_MAX_WALL_US: Counter = Counter::new();
/// The most slot reads one background sweep tick made (bounded by the sweeper's
/// `TICK_SLOTS` plus the rest of one cluster).
pub static SWEEP_TICK_MAX_SLOTS: Counter = Counter::new();
