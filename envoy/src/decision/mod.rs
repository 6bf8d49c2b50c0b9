//! The decision: one `ShouldRateLimit` call from descriptors to an answer. `call` its entry,
//! `service` the plain decision on redis-rl-client's async limiter, `quota` the token-quota
//! verdicts, `inflight` the leases and reservations (on the service), `unknown_domains` the
//! warnings for domains no rule names. Knows no transport.

pub mod call;
pub mod inflight;
pub mod quota;
pub mod service;
pub mod unknown_domains;
