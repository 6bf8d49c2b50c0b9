//! Redis: the store behind the decision. The setups (TLS, auth, Sentinel, cluster, start-up
//! retries) in `setup` and the multiplexed connections in `pool`. Reads the configuration only.

pub mod pool;
pub mod setup;
