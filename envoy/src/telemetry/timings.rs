//! The response times kept for the statsd sinks' timers: the service records each call's,
//! the next flush takes them. A leaf: imports nothing of the crate.

use std::sync::{Arc, Mutex};

/// How many response times wait for a flush at most; past that they are dropped (a sink
/// that is down must not grow the process).
const MAX_PENDING_TIMINGS: usize = 100_000;

/// The response times that wait for the next flush, as statsd timers (`ratelimit_server.
/// <method>.response_time`). Off (nothing kept) unless a sink is on.
#[derive(Clone, Default)]
pub struct Timings {
    pending: Arc<Mutex<Option<Vec<Timing>>>>,
}

/// One call's method and time in ms.
type Timing = (&'static str, f64);

impl Timings {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<Timing>>> {
        match self.pending.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Starts keeping the times.
    pub fn enable(&self) {
        let mut pending = self.lock();
        if pending.is_none() {
            *pending = Some(Vec::new());
        }
    }

    /// Keeps one call's time, if a sink is on and fewer than [`MAX_PENDING_TIMINGS`] wait.
    /// The methods are the two the service has, so nothing is allocated per call.
    pub fn record(&self, method: &str, seconds: f64) {
        let method = match method {
            "ShouldRateLimit" => "ShouldRateLimit",
            "json" => "json",
            _ => "other",
        };
        if let Some(pending) = self.lock().as_mut() {
            if pending.len() < MAX_PENDING_TIMINGS {
                pending.push((method, seconds * 1000.0));
            }
        }
    }

    pub(crate) fn take(&self) -> Vec<Timing> {
        self.lock().as_mut().map(std::mem::take).unwrap_or_default()
    }
}
